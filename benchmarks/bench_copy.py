"""Copying checkpoints between stores and savepoint files (snapstore.copy_checkpoints,
export_savepoint, import_savepoint), against the naive copy measured in the same run.

Usage:  python3 benchmarks/bench_copy.py [--size-mib N] [--checkpoints K] [--dirty F]

A stream of K checkpoints of one N MiB buffer of random bytes, F of its 4 KiB pages changed
between checkpoints (durability "fsync" everywhere). Measured:
  copy all       copy_checkpoints into an empty store: time, MB/s of checkpoint bytes,
                 chunks and bytes sent, the destination's size against the source's
  copy again     the same copy once more: every checkpoint skipped, nothing written
  copy 1 more    one more checkpoint in the source, then the copy: only its new chunks
  naive          what a copy without chunk ids costs: restore each checkpoint from the source
                 and checkpoint() it into an empty store (page diffs against the previous)
  export/import  the newest checkpoint as a .snap file, imported into an empty store and
                 into the copy (which holds every chunk)
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import snapstore  # noqa: E402
from snapstore.formatting import human_bytes  # noqa: E402


def store_bytes(store) -> int:
    return sum(store.backend.size(n) for n in store.backend.list())


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--checkpoints", type=int, default=10)
    ap.add_argument("--dirty", type=float, default=0.01)
    args = ap.parse_args()
    size = args.size_mib << 20
    rng = np.random.default_rng(0)
    pages = size // 4096
    with tempfile.TemporaryDirectory(prefix="bench-copy-", dir=os.environ.get("TMPDIR")) as d:
        src = snapstore.open(os.path.join(d, "src"))
        buf = np.frombuffer(bytearray(rng.bytes(size)), np.uint8)
        for _ in range(args.checkpoints):
            src.checkpoint({"state": buf}, "train")
            for p in rng.choice(pages, max(1, int(pages * args.dirty)), replace=False):
                buf[p * 4096:p * 4096 + 8] = np.frombuffer(rng.bytes(8), np.uint8)
        logical = size * args.checkpoints
        src_bytes = store_bytes(src)
        rows = []

        dst = snapstore.open(os.path.join(d, "dst"))
        r, t = timed(lambda: snapstore.copy_checkpoints(src, dst))
        rows.append(("copy all", t, logical, r.chunks_sent, r.bytes_sent, store_bytes(dst)))
        r, t = timed(lambda: snapstore.copy_checkpoints(src, dst))
        assert not r.copied
        rows.append(("copy again", t, logical, r.chunks_sent, r.bytes_sent, 0))
        src.checkpoint({"state": buf}, "train")
        before = store_bytes(dst)
        r, t = timed(lambda: snapstore.copy_checkpoints(src, dst))
        assert len(r.copied) == 1
        rows.append(("copy 1 more", t, size, r.chunks_sent, r.bytes_sent,
                     store_bytes(dst) - before))

        naive = snapstore.open(os.path.join(d, "naive"))

        def restore_and_checkpoint():
            out = np.empty(size, np.uint8)
            for c in src.checkpoints("train"):
                src.restore_into(c.id, {"state": out})
                naive.checkpoint({"state": out}, "train")
        _, t = timed(restore_and_checkpoint)
        rows.append(("naive", t, logical + size, None, logical + size, store_bytes(naive)))

        snap = os.path.join(d, "latest.snap")
        res, t = timed(lambda: snapstore.export_savepoint(src, "latest:train", snap))
        rows.append(("export .snap", t, size, res.chunks, res.chunk_bytes, res.bytes))
        empty = snapstore.open(os.path.join(d, "empty"))
        info, t = timed(lambda: snapstore.import_savepoint(empty, snap))
        rows.append(("import, empty", t, size, None, None, info.bytes_new))
        info, t = timed(lambda: snapstore.import_savepoint(dst, snap))
        rows.append(("import, has all", t, size, None, None, info.bytes_new))
        for s in (src, dst, naive, empty):
            s.close()

    print(f"{args.checkpoints} checkpoints of {args.size_mib} MiB (+1 for 'copy 1 more'), "
          f"{args.dirty:.1%} of pages changed between them, durability fsync; source store "
          f"{human_bytes(src_bytes)}")
    print(f"{'step':<16}{'seconds':>9}{'MB/s':>9}{'chunks sent':>13}{'bytes sent':>13}"
          f"{'written':>13}")
    for name, t, nbytes, chunks, sent, written in rows:
        print(f"{name:<16}{t:>9.3f}{nbytes / t / 1e6:>9.0f}"
              f"{'-' if chunks is None else chunks:>13}"
              f"{'-' if sent is None else human_bytes(sent):>13}{human_bytes(written):>13}")


if __name__ == "__main__":
    main()
