"""The subprocess program of the compaction crash tests, and the content both sides share.

    python compact_child.py compact STORE THRESHOLD DURABILITY
        Opens STORE for writing, prints "start" (flushed) just before compact(), then runs
        compact(threshold=THRESHOLD) and prints "done <JSON report>". The parent SIGKILLs it at
        a random moment after "start", or SNAPSTORE_CRASH_AT=name[:N] in the environment makes
        the store kill it at an injected point (snapstore/_testing.py).

    python compact_child.py churn STORE SEED SECONDS
        The writer of the reader test: for SECONDS keeps taking checkpoints of a "data" stream
        (content(SEED, "data", k, DATA_SIZE), meta {"seed", "k", "size"}), deletes those older
        than KEEP_SECONDS and junk checkpoints, and compacts after every step. Prints
        "done <rounds>".

    python compact_child.py read STORE SECONDS OPS_PER_OPEN
        A reader (readonly=True, reopened after every OPS_PER_OPEN reads: 1 means it never has
        a segment open from an earlier read) that for SECONDS restores (and reads ranges of)
        "data" checkpoints younger than FRESH_SECONDS (the writer cannot have deleted them
        meanwhile), each checked byte-exact against content(meta["seed"], "data", meta["k"],
        meta["size"]). Prints one JSON line of counts {"exact", "retry", "opens"}; exits 1
        (message on stderr) on wrong bytes or any exception other than
        ConcurrentCompactionError.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time

PAGE = 4096


def content(seed: int, stream: str, k: int, size: int = 512 << 10) -> dict:
    """Checkpoint k of a stream: a random buffer in which a few pages change from k-1 to k (so
    consecutive checkpoints share most chunks and chain as deltas), plus a small compressible
    buffer that differs every time."""
    r = random.Random(f"{seed}:{stream}:base")
    buf = bytearray(r.randbytes(size))
    for step in range(1, k + 1):
        rs = random.Random(f"{seed}:{stream}:{step}")
        for _ in range(rs.randint(1, 12) * max(1, size >> 20)):
            p = rs.randrange(size // PAGE)
            buf[p * PAGE:(p + 1) * PAGE] = rs.randbytes(PAGE)
    r = random.Random(f"{seed}:{stream}:{k}:meta")
    note = (b"%s step %d " % (stream.encode(), k)) * r.randint(100, 3000)
    return {"state": bytes(buf), "note": note}


def run_compact(path: str, threshold: float, durability: str) -> int:
    import snapstore
    store = snapstore.open(path, durability=durability)
    sys.stdout.write("start\n")
    sys.stdout.flush()
    report = store.compact(threshold=threshold)
    store.close()
    sys.stdout.write("done " + json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0


KEEP_SECONDS = 4.0     # the churn writer deletes "data" checkpoints older than this
FRESH_SECONDS = 1.5    # readers only restore "data" checkpoints younger than this
DATA_SIZE = 4 << 20


def run_churn(path: str, seed: int, seconds: float) -> int:
    """Keeps a window of recent "data" checkpoints (a 1 MiB buffer changing by a few pages per
    step, so they chain as deltas, with a full one every few steps), deletes those older than
    KEEP_SECONDS plus every "junk" checkpoint, and compacts after every step (threshold 0.9:
    the live chunks of the window share segments with garbage, so they move again and again)."""
    import snapstore
    store = snapstore.open(path, durability="none", segment_size=1 << 18, max_chain=4)
    deadline = time.monotonic() + seconds
    rounds = k = 0
    while time.monotonic() < deadline:
        rounds += 1
        k += 1
        store.checkpoint(content(seed, "data", k, DATA_SIZE), stream="data",
                         meta={"seed": seed, "k": k, "size": DATA_SIZE})
        junk = store.checkpoint({"junk": random.Random(k).randbytes(200 << 10)}, stream="junk")
        store.delete(junk.id)
        now = time.time()
        for info in store.checkpoints("data")[:-1]:
            if now - info.created > KEEP_SECONDS:
                store.delete(info.id)
        store.compact(threshold=0.9)
    store.close()
    print(f"done {rounds}", flush=True)
    return 0


def run_read(path: str, seconds: float, ops_per_open: int) -> int:
    import snapstore
    from snapstore.errors import ConcurrentCompactionError
    deadline = time.monotonic() + seconds
    counts = {"exact": 0, "retry": 0, "opens": 0}
    expected: dict = {}
    r = random.Random(os.getpid())
    while time.monotonic() < deadline:
        counts["opens"] += 1
        store = snapstore.open(path, readonly=True)
        try:
            for _ in range(ops_per_open):
                if time.monotonic() >= deadline:
                    break
                now = time.time()
                infos = [c for c in store.checkpoints("data") if now - c.created < FRESH_SECONDS]
                if not infos:
                    time.sleep(0.01)
                    continue
                info = r.choice(infos)
                if info.id not in expected:
                    expected[info.id] = content(info.meta["seed"], "data", info.meta["k"],
                                                info.meta["size"])
                want = expected[info.id]
                try:
                    if r.random() < 0.6:
                        got = store.restore(info.id)
                    else:
                        name = r.choice(sorted(want))
                        off = r.randrange(len(want[name]))
                        n = r.randrange(len(want[name]) - off + 1)
                        got = {name: store.read(info.id, name, off, n)}
                        want = {name: want[name][off:off + n]}
                except ConcurrentCompactionError:
                    counts["retry"] += 1
                    continue
                if got != want:
                    sys.stderr.write(f"WRONG BYTES from checkpoint {info.id}\n")
                    return 1
                counts["exact"] += 1
        except Exception as exc:  # anything but the retryable error is a failure
            sys.stderr.write(f"reader got {type(exc).__name__}: {exc}\n")
            return 1
        finally:
            store.close()
    print(json.dumps(counts), flush=True)
    return 0


def main(argv: list) -> int:
    mode = argv[1]
    if mode == "compact":
        return run_compact(argv[2], float(argv[3]), argv[4])
    if mode == "churn":
        return run_churn(argv[2], int(argv[3]), float(argv[4]))
    if mode == "read":
        return run_read(argv[2], float(argv[3]), int(argv[4]))
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
