"""Checkpoint-store figures of issue 3, as ratios measured in one run.

Workload: a buffer of random bytes (default 1 GiB) checkpointed full, then 1% of its 4 KiB
pages overwritten at random places and checkpointed again (durability "fsync"); then a chain of
16 incremental checkpoints; restores from a warm page cache. Peak memory is the process's
VmHWM growth beyond the caller's buffers.

    python3 benchmarks/bench_store.py [--size-mib 1024] [--dir /path/on/real/disk]
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import snapstore  # noqa: E402

PAGE = 4096


def vm_hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def reset_hwm() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def mutate(arr: np.ndarray, fraction: float, rng: np.random.Generator) -> int:
    pages = arr.size // PAGE
    chosen = rng.choice(pages, size=max(1, int(pages * fraction)), replace=False)
    for p in chosen:
        arr[p * PAGE:(p + 1) * PAGE] = rng.integers(0, 256, PAGE, dtype=np.uint8)
    return len(chosen) * PAGE


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--dir", default=None, help="where to put the store (default: a temp dir)")
    ap.add_argument("--chain", type=int, default=16)
    args = ap.parse_args()
    size = args.size_mib << 20
    root = tempfile.mkdtemp(dir=args.dir, prefix="snapbench-")
    rng = np.random.default_rng(1)
    state = rng.integers(0, 256, size, dtype=np.uint8)
    rows = []
    try:
        # Baseline: write + fsync the same bytes to a plain file.
        raw_path = os.path.join(root, "raw.bin")

        def raw_write():
            with open(raw_path, "wb") as f:
                f.write(memoryview(state))
                f.flush()
                os.fsync(f.fileno())
        t_raw, _ = timed(raw_write)
        os.unlink(raw_path)
        t_memcpy, _ = timed(lambda: state.copy())

        store = snapstore.open(os.path.join(root, "store"), durability="fsync",
                               max_chain=args.chain + 2)
        reset_hwm()
        hwm0 = vm_hwm()
        t_full, full = timed(lambda: store.checkpoint({"state": state}, stream="s"))
        hwm_ckpt = vm_hwm() - hwm0
        rows.append(("first full checkpoint", t_full, f"{t_full / t_raw:.2f}x raw write+fsync "
                     f"({t_raw:.2f} s)", "<= 1.5x"))
        dirty = mutate(state, 0.01, rng)
        t_inc, inc = timed(lambda: store.checkpoint({"state": state}, stream="s"))
        rows.append(("incremental, 1% pages", t_inc, f"kind={inc.kind}, +{inc.bytes_new / size:.2%}"
                     f" of buffer ({inc.bytes_new / 1e6:.1f} MB for {dirty / 1e6:.1f} MB dirty)",
                     "<= 0.25 s, <= 1.5%"))
        out = np.empty_like(state)
        store.restore_into(full.id, {"state": out})       # warm the page cache
        t_rf, _ = timed(lambda: store.restore_into(full.id, {"state": out}))
        rows.append(("restore_into full", t_rf, f"{size / t_rf / 1e9:.2f} GB/s "
                     f"(memcpy {size / t_memcpy / 1e9:.1f} GB/s)", ">= 1.5 GB/s"))
        reset_hwm()
        hwm0 = vm_hwm()
        t_r, restored = timed(lambda: store.restore(full.id))
        hwm_restore = vm_hwm() - hwm0 - size
        del restored
        rows.append(("restore() -> bytes", t_r, f"{size / t_r / 1e9:.2f} GB/s", ""))
        last = inc
        for _ in range(args.chain - 1):
            mutate(state, 0.01, rng)
            last = store.checkpoint({"state": state}, stream="s")
        store.restore_into(last.id, {"state": out})
        t_rc, _ = timed(lambda: store.restore_into(last.id, {"state": out}))
        assert np.array_equal(out, state), "restore of the chain differs"
        rows.append((f"restore_into, chain {last.chain_length}", t_rc,
                     f"{t_rc / t_rf:.2f}x full restore", "<= 1.5x"))
        reset_hwm()
        hwm0 = vm_hwm()
        mutate(state, 0.01, rng)
        store.checkpoint({"state": state}, stream="s")
        hwm_inc = vm_hwm() - hwm0
        rows.append(("peak memory, full ckpt", 0, f"{hwm_ckpt / 2**20:.0f} MiB", "< 256 MiB"))
        rows.append(("peak memory, incr ckpt", 0, f"{hwm_inc / 2**20:.0f} MiB", "< 256 MiB"))
        rows.append(("peak memory, restore()", 0, f"{max(0, hwm_restore) / 2**20:.0f} MiB beyond "
                     "the returned bytes", "< 256 MiB"))
        stats = store.stats()
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"snapstore {snapstore.__version__}: {size / 2**20:.0f} MiB random buffer, "
          f"durability=fsync")
    print(f"{'measure':28} {'seconds':>8}  {'figure':52} target")
    for name, secs, fig, target in rows:
        print(f"{name:28} {secs:8.3f}  {fig:52} {target}")
    print(f"store: {stats['segment_bytes'] / 2**20:.0f} MiB in segments, "
          f"{stats['checkpoints']} checkpoints, dedup ratio {stats['dedup_ratio']:.1f}")


if __name__ == "__main__":
    main()
