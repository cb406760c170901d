"""The subprocess program of the S3 crash tests (test_remote_kill.py), and the deterministic
content both sides share.

    python remote_child.py write URL CACHE JOURNAL SEED START_STEP STEPS SEGMENT_SIZE
        Opens the S3 store URL (durability "remote", cache_dir=CACHE) and takes checkpoints of
        steps START_STEP .. START_STEP + STEPS - 1 on stream "s", each of
        content(SEED, step) with meta {"step": step}. Journal (one os.write per line on an
        O_APPEND descriptor, so a kill never tears a line):
            "ready <log>"     the store is open; <log>: this writer session's log number
            "try <step>"      checkpoint() of <step> is about to be called
            "ok <id> <step>"  checkpoint() returned <id> (acknowledged)
            "done"            every step taken, the store closed
        SNAPSTORE_CRASH_AT=name[:N] makes the store SIGKILL this process at a crash point.

    python remote_child.py big URL CACHE JOURNAL MIB PART_MIB
        Like write, one checkpoint of MIB MiB of random bytes in one segment, uploaded in
        parts of PART_MIB MiB (s3client.PART_SIZE: multipart), for tests that kill a writer
        in the middle of a multipart upload.

The AWS_* variables of the environment name the server; PYTHONPATH names the snapstore to
test.
"""
from __future__ import annotations

import os
import random
import sys

PAGE = 4096
BIG = 3 * (1 << 19) + 5          # 1.5 MiB + 5: spans segments of 1 MiB, not whole pages
CHANGED_PAGES = 24              # a step's own pages; every third step 256 (1 MiB)


def _base(seed: int) -> bytes:
    return random.Random(f"base:{seed}").randbytes(BIG)


_bases: dict = {}


def content(seed: int, step: int) -> dict:
    """The buffers of checkpoint `step`: the base with pages of its own (a delta of the
    previous step's: CHANGED_PAGES, or 1 MiB every third step: several segments to upload),
    and a small buffer naming the step."""
    base = _bases.get(seed)
    if base is None:
        base = _bases[seed] = _base(seed)
    r = random.Random(f"step:{seed}:{step}")
    buf = bytearray(base)
    for page in r.sample(range(BIG // PAGE), 256 if step % 3 == 2 else CHANGED_PAGES):
        buf[page * PAGE:(page + 1) * PAGE] = r.randbytes(PAGE)
    return {"w": bytes(buf), "step": f"step {step}".encode()}


def _journal(path: str):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def write(line: str) -> None:
        os.write(fd, (line + "\n").encode())
    return write


def write(url, cache, journal, seed, start, steps, segment_size) -> None:
    import snapstore
    out = _journal(journal)
    s = snapstore.open(url, cache_dir=cache, segment_size=int(segment_size))
    out(f"ready {s._committer.log_number}")
    for step in range(int(start), int(start) + int(steps)):
        out(f"try {step}")
        info = s.checkpoint(content(int(seed), step), stream="s", meta={"step": step})
        out(f"ok {info.id} {step}")
    s.close()
    out("done")


def big(url, cache, journal, mib, part_mib) -> None:
    import snapstore
    from snapstore.remote import s3client
    s3client.PART_SIZE = int(part_mib) << 20
    out = _journal(journal)
    size = int(mib) << 20
    s = snapstore.open(url, cache_dir=cache, segment_size=size + (1 << 20))
    out(f"ready {s._committer.log_number}")
    out("try 0")
    info = s.checkpoint({"big": random.Random("big").randbytes(size)}, stream="big")
    out(f"ok {info.id} 0")
    s.close()
    out("done")


if __name__ == "__main__":
    {"write": write, "big": big}[sys.argv[1]](*sys.argv[2:])
