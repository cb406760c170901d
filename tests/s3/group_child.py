"""A process of the S3 group-commit tests (test_groups_s3.py): a participant that stages its
part, or a coordinator that opens, stages and commits a whole group.

    python group_child.py stage URL CACHE GROUP PARTICIPANT SEED SIZE [META_JSON]
    python group_child.py coordinate URL CACHE STREAM SEED SIZE

Each opens the store with its own cache directory (a machine of its own). `stage` stages
{"<participant>/state": rbytes(SIZE, SEED)} and prints "staged"; with SNAPSTORE_CRASH_AT set
it dies at that crash point instead. `coordinate` opens a group of participants "a" and "b"
on STREAM, prints its id, stages both parts and commits, printing "committed <id>" (or dies
at SNAPSTORE_CRASH_AT, e.g. before_group_ref / after_group_ref). With KILL_AFTER_STAGE=1 a
stager SIGKILLs itself right after staging (its Store never closed).
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys

import snapstore


def rbytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def main(argv: list) -> int:
    mode, url, cache = argv[0], argv[1], argv[2]
    store = snapstore.open(url, cache_dir=cache)
    if mode == "stage":
        group, participant, seed, size = argv[3], argv[4], int(argv[5]), int(argv[6])
        meta = json.loads(argv[7]) if len(argv) > 7 else None
        store.stage(group, participant, {f"{participant}/state": rbytes(size, seed)}, meta)
        print("staged", flush=True)
        if os.environ.get("KILL_AFTER_STAGE"):
            os.kill(os.getpid(), signal.SIGKILL)
    else:
        stream, seed, size = argv[3], int(argv[4]), int(argv[5])
        g = store.group(stream, ["a", "b"], timeout=60)
        print(g.id, flush=True)
        store.stage(g.id, "a", {"a/state": rbytes(size, seed)}, meta={"offset": seed})
        store.stage(g.id, "b", {"b/state": rbytes(size, seed + 1)}, meta={"offset": seed + 1})
        info = g.commit()
        print("committed", info.id, flush=True)
    store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
