"""What a small durable commit costs, and how much of it is syncs (docs/commit-syncs.md).

Usage:  python3 benchmarks/bench_commit_syncs.py [--count 200] [--bytes 2048] [--dir DIR]

In one run, on the same disk (DIR, default a temp dir beside this checkout), medians of --count
commits of --bytes new random bytes each:
  snapstore fsync   store.checkpoint() with durability "fsync" (a claim and a publish
                    transaction of the LMDB index, each syncing data.mdb, and the log's
                    fdatasync)
  snapstore fsync, sync_index=False
                    the same with the index's transactions unsynced: one sync per commit,
                    the log's (docs/design.md, "An index written without syncs")
  snapstore none    the same with durability "none": everything but the syncs
  raw fdatasync     an append of the same bytes to a file and fdatasync: the log's sync
  lmdb commit       one put of 64 bytes in an LMDB environment opened as the index is
                    (sync on, metasync off) and its commit: one index transaction's sync
  sqlite WAL        an INSERT of the same bytes and COMMIT in SQLite, WAL journal, synchronous
                    FULL (what SqliteSaver runs on: one fsync of the WAL per commit)
and the decomposition: fsync - none against raw fdatasync + 2 x lmdb commit.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time

import lmdb

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import snapstore  # noqa: E402


def timed(fn, count: int) -> float:
    """Median milliseconds of count calls of fn(k)."""
    times = []
    for k in range(count):
        t = time.perf_counter()
        fn(k)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def store_commit(root: str, durability: str, count: int, nbytes: int,
                 sync_index: bool = True) -> float:
    with snapstore.open(os.path.join(root, f"store-{durability}-{sync_index}"),
                        durability=durability, sync_index=sync_index) as s:
        s.checkpoint({"a": os.urandom(nbytes)}, stream="s")       # creates the stream
        return timed(lambda k: s.checkpoint({"a": os.urandom(nbytes)}, stream="s"), count)


def raw_fdatasync(root: str, count: int, nbytes: int) -> float:
    fd = os.open(os.path.join(root, "raw"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        def one(k):
            os.write(fd, os.urandom(nbytes))
            os.fdatasync(fd)
        return timed(one, count)
    finally:
        os.close(fd)


def lmdb_commit(root: str, count: int) -> float:
    env = lmdb.open(os.path.join(root, "lmdb"), map_size=1 << 30, sync=True, metasync=False)
    try:
        def one(k):
            with env.begin(write=True) as txn:
                txn.put(k.to_bytes(8, "big"), os.urandom(64))
        return timed(one, count)
    finally:
        env.close()


def sqlite_commit(root: str, count: int, nbytes: int) -> float:
    db = sqlite3.connect(os.path.join(root, "sqlite.db"), isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)")

        def one(k):
            db.execute("BEGIN")
            db.execute("INSERT INTO t VALUES (?, ?)", (k, os.urandom(nbytes)))
            db.execute("COMMIT")
        return timed(one, count)
    finally:
        db.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--bytes", type=int, default=2048)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = tempfile.mkdtemp(prefix="snapstore-syncs-",
                            dir=args.dir or os.path.dirname(here))
    try:
        fsync = store_commit(root, "fsync", args.count, args.bytes)
        one_sync = store_commit(root, "fsync", args.count, args.bytes, sync_index=False)
        none = store_commit(root, "none", args.count, args.bytes)
        raw = raw_fdatasync(root, args.count, args.bytes)
        txn = lmdb_commit(root, args.count)
        lite = sqlite_commit(root, args.count, args.bytes)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"medians of {args.count} commits of {args.bytes} bytes, in {os.path.dirname(root)}")
    for name, ms in (("snapstore fsync", fsync), ("snapstore fsync, sync_index=False", one_sync),
                     ("snapstore none", none),
                     ("raw fdatasync", raw), ("lmdb commit (sync)", txn),
                     ("sqlite WAL commit", lite)):
        print(f"  {name:34} {ms:6.2f} ms")
    print(f"  syncs in a snapstore commit: {fsync - none:.2f} ms measured; raw fdatasync + "
          f"2 lmdb commits = {raw + 2 * txn:.2f} ms")


if __name__ == "__main__":
    main()
