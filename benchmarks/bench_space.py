"""Space figures of issue 15: what a store occupies after retention plus the DEFAULT compaction,
relative to the data it still holds, and how big the LMDB index is.

Scenarios (each in a fresh store):
  training   the README's training loop: 15 saves of a 32 MiB float32 array that changes
             completely between saves (dense), retain(keep_last=3) after every save
  segments   issue 15's `retain --keep-last 3` at 1/16 of its scale, so that the live data
             spans several sealed segments: 12 dense saves of a 12 MiB array, 16 MiB
             segments, one retain(keep_last=3) at the end
  mixed      two streams saved alternately into 16 MiB segments: "milestones" (6 MiB saves,
             all kept) and "recent" (3 MiB saves, retain(keep_last=3) at the end), so every
             sealed segment is about two thirds live
  small      many small checkpoints: 200 checkpoints of ~20 KiB each in 3 streams, then every
             stream trimmed to its 5 newest

For each: live chunk bytes (the chunk records live checkpoints reference, header included),
segment bytes, index bytes (data.mdb + lock.mdb) and the store's bytes (segments + index,
i.e. `du --apparent-size` of the store's data) after retention, then after `compact()` with no
arguments; the ratio store/live; the index as a fraction of the segment bytes; and compaction's
write amplification: bytes it wrote (live copies + trimmed chunks + state section) per byte of
live data.

    python3 benchmarks/bench_space.py [--scenario training|segments|mixed|small|all] [--dir D]
        [--durability none|fsync] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import snapstore  # noqa: E402
from snapstore.engine import format as fmt  # noqa: E402

MiB = 1 << 20


def dir_bytes(path: str) -> int:
    total = 0
    for name in os.listdir(path):
        full = os.path.join(path, name)
        if os.path.isfile(full) and not os.path.islink(full):
            total += os.path.getsize(full)
    return total


def measure(store, path: str) -> dict:
    s = store.stats()
    seg = dir_bytes(os.path.join(path, fmt.SEGMENTS_DIR))
    idx = dir_bytes(os.path.join(path, fmt.INDEX_DIR))
    live = s["live_chunk_bytes"]
    return {"live_bytes": live, "segment_bytes": seg, "index_bytes": idx,
            "store_bytes": seg + idx, "ratio": (seg + idx) / live if live else None,
            "index_fraction": idx / seg if seg else None, "checkpoints": s["checkpoints"]}


def training(path: str, durability: str, saves: int = 15, mib: int = 32,
             segment_mib: int = 256, retain_each: bool = True):
    rng = np.random.default_rng(0)
    store = snapstore.open(path, durability=durability, segment_size=segment_mib * MiB)
    arr = np.empty(mib * MiB // 4, dtype=np.float32)
    for step in range(saves):
        arr[:] = rng.standard_normal(arr.size, dtype=np.float32)
        store.checkpoint({"w": arr}, stream="train", meta={"step": step})
        if retain_each:
            store.retain("train", keep_last=3)
    store.retain("train", keep_last=3)
    return store


def mixed(path: str, durability: str, rounds: int = 16):
    rng = np.random.default_rng(2)
    store = snapstore.open(path, durability=durability, segment_size=16 * MiB)
    for step in range(rounds):
        for stream, mib in (("milestones", 6), ("recent", 3)):
            arr = rng.standard_normal(mib * MiB // 4, dtype=np.float32)
            store.checkpoint({"w": arr}, stream=stream, meta={"step": step})
    store.retain("recent", keep_last=3)
    return store


def small(path: str, durability: str, count: int = 200, size: int = 20 << 10,
          keep: int = 5):
    rng = np.random.default_rng(1)
    store = snapstore.open(path, durability=durability)
    streams = ["a", "b", "c"]
    for i in range(count):
        data = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        store.checkpoint({"state": data}, stream=streams[i % 3], meta={"turn": i})
    for s in streams:
        store.retain(s, keep_last=keep)
    return store


SCENARIOS = {
    "training": lambda p, d: training(p, d),
    "segments": lambda p, d: training(p, d, saves=12, mib=12, segment_mib=16,
                                      retain_each=False),
    "mixed": mixed,
    "small": small,
}


def run(name: str, base: str, durability: str) -> dict:
    path = os.path.join(base, name)
    shutil.rmtree(path, ignore_errors=True)
    store = SCENARIOS[name](path, durability)
    try:
        before = measure(store, path)
        started = time.perf_counter()
        report = store.compact()
        seconds = time.perf_counter() - started
        after = measure(store, path)
    finally:
        store.close()
    written = sum(report.get(k, 0) for k in ("live_bytes_copied", "trim_bytes_written",
                                              "state_section_bytes"))
    return {"scenario": name, "before": before, "after": after, "seconds": seconds,
            "compaction_bytes_written": written,
            "write_amplification": written / after["live_bytes"] if after["live_bytes"] else 0,
            "report_index_bytes": (report.get("index_bytes_before"),
                                   report.get("index_bytes_after"))}


def show(r: dict) -> None:
    b, a = r["before"], r["after"]

    def line(tag: str, m: dict) -> str:
        ratio = f"{m['ratio']:.3f}x" if m["ratio"] else "-"
        frac = f"{m['index_fraction']:.2%}" if m["index_fraction"] is not None else "-"
        return (f"  {tag:<7} live {m['live_bytes'] / MiB:9.2f} MiB  segments "
                f"{m['segment_bytes'] / MiB:9.2f} MiB  index {m['index_bytes'] / MiB:7.3f} MiB  "
                f"store {m['store_bytes'] / MiB:9.2f} MiB  store/live {ratio}  index/data {frac}")
    print(f"{r['scenario']}: {b['checkpoints']} checkpoints kept")
    print(line("retain", b))
    print(line("compact", a))
    print(f"  compaction wrote {r['compaction_bytes_written'] / MiB:.2f} MiB "
          f"(write amplification {r['write_amplification']:.3f} per live byte) "
          f"in {r['seconds']:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    ap.add_argument("--dir", default=None, help="where to create the stores (default: a temp dir)")
    ap.add_argument("--durability", choices=["none", "fsync"], default="none")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="bench-space-", dir=args.dir)
    try:
        names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
        results = [run(n, base, args.durability) for n in names]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for r in results:
            show(r)


if __name__ == "__main__":
    main()
