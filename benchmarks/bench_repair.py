"""Repair speed (issue 14): rebuilding the index from the segments alone, in MB/s of segments
scanned.

Workload: a buffer of random bytes (default 256 MiB) checkpointed --checkpoints times with
--dirty of its 4 KiB pages overwritten between checkpoints (about 1 GiB of segments with the
defaults), the older half of the checkpoints deleted, the store compacted (so the log holds a
state section) and two more checkpoints taken (records after it), then the index directory deleted and `snapstore.repair` timed
(--repeat runs; each starts from a deleted index). Afterwards every checkpoint's listing is
compared with the one before and the newest checkpoint is restored and hashed.

    python3 benchmarks/bench_repair.py [--size-mib 256] [--checkpoints 16] [--dirty 0.25]
        [--dir /path/on/real/disk] [--repeat 3] [--cold] [--keep]
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import snapstore  # noqa: E402
from snapstore.engine import format as fmt  # noqa: E402

PAGE = 4096


def segment_bytes(store_dir: str) -> int:
    seg = os.path.join(store_dir, fmt.SEGMENTS_DIR)
    return sum(os.path.getsize(os.path.join(seg, n)) for n in os.listdir(seg))


def drop_cache(store_dir: str) -> None:
    seg = os.path.join(store_dir, fmt.SEGMENTS_DIR)
    for n in os.listdir(seg):
        fd = os.open(os.path.join(seg, n), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def listing(path: str) -> dict:
    with snapstore.open(path, readonly=True) as s:
        return {c.id: (c.stream, c.seq, tuple(c.tags), c.created, dict(c.sizes))
                for c in s.checkpoints()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--checkpoints", type=int, default=16)
    ap.add_argument("--dirty", type=float, default=0.25)
    ap.add_argument("--dir", default=None, help="where to put the store (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="drop the segments' page cache first")
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()

    root = tempfile.mkdtemp(prefix="snapstore-bench-repair-", dir=args.dir)
    path = os.path.join(root, "store")
    try:
        rng = np.random.default_rng(14)
        n = args.size_mib << 20
        arr = rng.integers(0, 256, n, dtype=np.uint8)
        pages = n // PAGE
        t0 = time.perf_counter()
        with snapstore.open(path, durability="none") as s:
            ids = []
            for k in range(args.checkpoints):
                if k:
                    for p in rng.choice(pages, int(pages * args.dirty), replace=False):
                        arr[p * PAGE:(p + 1) * PAGE] = rng.integers(0, 256, PAGE, dtype=np.uint8)
                ids.append(s.checkpoint({"a": arr}, stream="train", meta={"k": k}).id)
            for cid in ids[: len(ids) // 2]:
                s.delete(cid)
            report = s.compact()
            for k in range(args.checkpoints, args.checkpoints + 2):    # records after it
                for p in rng.choice(pages, int(pages * args.dirty), replace=False):
                    arr[p * PAGE:(p + 1) * PAGE] = rng.integers(0, 256, PAGE, dtype=np.uint8)
                ids.append(s.checkpoint({"a": arr}, stream="train", meta={"k": k}).id)
            newest = hashlib.sha256(s.restore(ids[-1])["a"]).hexdigest()
        built = time.perf_counter() - t0
        size = segment_bytes(path)
        before = listing(path)
        print(f"store: {size / 1e6:.0f} MB of segments, {len(before)} checkpoints, built in "
              f"{built:.1f}s (compaction removed {report['segments_removed']} segment(s), "
              f"state section {report['state_section_bytes']} bytes)")
        speeds = []
        for run in range(args.repeat):
            shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
            if args.cold:
                drop_cache(path)
            t = time.perf_counter()
            rep = snapstore.repair(path)
            seconds = time.perf_counter() - t
            assert rep["ok"], rep["problems"]
            speeds.append(rep["bytes_scanned"] / 1e6 / seconds)
            print(f"  repair {run + 1}: {seconds:.2f}s, {speeds[-1]:.0f} MB/s of segments "
                  f"scanned ({rep['records']} records, {rep['state_checkpoints']} checkpoints "
                  f"from the state section, {rep['records_replayed']} records replayed)")
        assert listing(path) == before, "repair changed the checkpoints"
        with snapstore.open(path, readonly=True) as s:
            assert hashlib.sha256(s.restore(ids[-1])["a"]).hexdigest() == newest
        print(f"repair: best {max(speeds):.0f} MB/s, median {statistics.median(speeds):.0f} "
              f"MB/s ({'cold' if args.cold else 'warm'} page cache); checkpoints and bytes "
              "unchanged")
    finally:
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
