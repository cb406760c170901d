"""snapstore demo: checkpoint real state, mutate it, checkpoint again, lose it, restore it.

Runs on a fresh machine after `make demo` and prints what every step cost next to the cost
of writing the same bytes to a plain file. Options: --size-mib (default 256), --dir.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np

import snapstore

PAGE = 4096


def write_plain(path: str, arrays: dict) -> float:
    t = time.perf_counter()
    with open(path, "wb") as f:
        for a in arrays.values():
            f.write(memoryview(a).cast("B"))
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t


def touch_pages(a: np.ndarray, fraction: float, rng: np.random.Generator) -> int:
    """Overwrites a random `fraction` of a's 4 KiB pages, as a training step or solver would."""
    flat = a.reshape(-1).view(np.uint8)
    pages = flat.size // PAGE
    chosen = rng.choice(pages, size=max(1, int(pages * fraction)), replace=False)
    for p in chosen:
        flat[p * PAGE:(p + 1) * PAGE] = rng.integers(0, 256, PAGE, dtype=np.uint8)
    return len(chosen) * PAGE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mib", type=int, default=256, help="size of the state (MiB)")
    ap.add_argument("--dir", default=None, help="where to create the store (default: temp)")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    n = (args.size_mib << 20) // 4
    state = {
        "grid": rng.standard_normal(n * 3 // 4, dtype=np.float32),      # a simulation grid
        "weights": rng.standard_normal(n // 4, dtype=np.float32),       # model weights
        "step": np.array([0], dtype=np.int64),
    }
    total = sum(a.nbytes for a in state.values())
    root = tempfile.mkdtemp(prefix="snapstore-demo-", dir=args.dir)
    rows = []
    try:
        t_plain = write_plain(os.path.join(root, "plain.bin"), state)
        os.unlink(os.path.join(root, "plain.bin"))
        with snapstore.open(os.path.join(root, "store")) as store:
            t = time.perf_counter()
            first = store.checkpoint(state, stream="sim", meta={"step": 0})
            rows.append(("checkpoint 1 (full)", time.perf_counter() - t, first.bytes_new))
            for step in range(1, 4):
                changed = touch_pages(state["grid"], 0.01, rng) + \
                    touch_pages(state["weights"], 0.01, rng)
                state["step"][0] = step
                t = time.perf_counter()
                info = store.checkpoint(state, stream="sim", meta={"step": step})
                rows.append((f"checkpoint {step + 1} ({info.kind}, {changed / 2**20:.1f} MiB "
                             "changed)", time.perf_counter() - t, info.bytes_new))
            expected = {k: a.copy() for k, a in state.items()}

            # The process "crashes": the state is gone. Get it back from the store.
            for a in state.values():
                a.fill(0)
        with snapstore.open(os.path.join(root, "store")) as store:
            latest = store.latest("sim")
            t = time.perf_counter()
            store.restore_into(latest.id, state)
            t_restore = time.perf_counter() - t
            # Compare bytes, not values: the random pages written above hold NaNs.
            exact = all(np.array_equal(state[k].view(np.uint8), expected[k].view(np.uint8))
                        for k in state)
            rows.append((f"restore_into checkpoint {latest.id} (chain {latest.chain_length})",
                         t_restore, 0))
            t = time.perf_counter()
            old_grid = store.read(first.id, "grid", 0, 16)
            rows.append(("read 16 bytes of checkpoint 1", time.perf_counter() - t, 0))
            store.delete(first.id)
            report = store.compact()
            rows.append(("delete checkpoint 1 + compact", report["seconds"], 0))
            t = time.perf_counter()
            check = store.verify(deep=True)
            rows.append(("verify(deep=True)", time.perf_counter() - t, 0))
            stats = store.stats()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"snapstore {snapstore.__version__} demo: {total / 2**20:.0f} MiB of state in 3 arrays, "
          f"durability=fsync")
    print(f"baseline: writing the same bytes to a plain file + fsync took {t_plain:.3f} s\n")
    print(f"{'step':58} {'seconds':>8} {'vs plain':>9} {'stored':>11}")
    for name, secs, stored in rows:
        print(f"{name:58} {secs:8.3f} {secs / t_plain:8.2f}x "
              f"{(f'{stored / 2**20:.1f} MiB') if stored else '':>11}")
    print(f"\nrestored state byte-exact: {exact}; verify: {'ok' if check['ok'] else check}; "
          f"first 16 bytes of the old grid read back: {old_grid.hex()[:16]}…")
    print(f"store now: {stats['checkpoints']} checkpoints, {stats['segment_bytes'] / 2**20:.0f} "
          f"MiB in segments for {stats['logical_bytes'] / 2**20:.0f} MiB of checkpointed state "
          f"(dedup ratio {stats['dedup_ratio']:.1f}x)")
    if not exact or not check["ok"]:
        raise SystemExit("demo FAILED: restored state differs or verify found problems")


if __name__ == "__main__":
    main()
