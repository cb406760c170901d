"""The subprocess program of the crash tests, and the deterministic content both sides share.

    python writer_child.py write STORE JOURNAL SEED START_STEP MAX_STEPS SEGMENT_SIZE
        Opens STORE (durability="fsync") and runs steps START_STEP.. : each step may delete an
        older checkpoint, then takes one checkpoint whose content is expected(SEED, step).
        Journal (one os.write per line on an O_APPEND descriptor, so a kill never tears a line):
            "ready"            the store is open (recovery done)
            "try <step>"       checkpoint of <step> is about to start
            "ok <id> <step>"   checkpoint() returned <id> (fsynced before going on)
            "try-del <id>"     delete(<id>) is about to start
            "del <id>"         delete(<id>) returned (fsynced before going on)
            "done"             all MAX_STEPS steps done, store closed
        SNAPSTORE_CRASH_AT=name[:N] in the environment makes the store SIGKILL this process at
        an injected point (see snapstore/_testing.py).

    python writer_child.py die-in-create STORE JOURNAL SEED HEADER_BYTES
        Like write from step 0, 1 MiB segments, but SIGKILLs itself inside the first segment
        rollover, after creating the new segment file and writing HEADER_BYTES of its header.

    python writer_child.py read STORE OUT SEED SECONDS
        Opens STORE read-only and for SECONDS keeps listing checkpoints and restoring them,
        checking each byte-exact against expected(SEED, meta["step"]). Writes the ids it
        verified to OUT, one per line; exits 1 on the first mismatch (message on stderr).

    python writer_child.py hold STORE OUT
        Opens STORE for writing, writes "ready" to OUT, waits for a line on stdin, closes.

    python writer_child.py open STORE OUT TIMEOUT
        Tries to open STORE for writing with timeout=TIMEOUT; writes "ok <seconds>" or
        "<ExceptionName> <seconds>" to OUT.
"""
from __future__ import annotations

import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PAGE = 4096
# Sizes of the main stream's big buffer: mostly not multiples of 4096, all <= 1 MiB.
WEIGHT_SIZES = (196_608, 300_001, 65_536 + 17, 524_287, 1_000_003 - 7, 4097)
MAX_LIVE = 8            # above this many live checkpoints a step always deletes one
DELETE_RATE = 0.2       # otherwise a step deletes one with this probability (if >= 3 live)

_base_cache: dict = {}


def _base(seed: int, name: str, size: int) -> bytes:
    """Per (seed, name, size) base content: random pages mixed with compressible ones."""
    key = (seed, name, size)
    data = _base_cache.get(key)
    if data is None:
        r = random.Random(f"base:{seed}:{name}:{size}")
        buf = bytearray(r.randbytes(size))
        for p in range(0, size, PAGE):
            roll = r.random()
            n = min(PAGE, size - p)
            if roll < 0.25:         # compressible page (zstd codec)
                buf[p:p + n] = bytes([r.randrange(256)]) * n
            elif roll < 0.35:       # text-like page
                buf[p:p + n] = (b"snapstore %d " % p * (n // 10 + 1))[:n]
        data = _base_cache[key] = bytes(buf)
        if len(_base_cache) > 32:
            _base_cache.pop(next(iter(_base_cache)))
    return data


def plan(seed: int, step: int) -> dict:
    """What step `step` does, independent of what happened before it."""
    r = random.Random(f"plan:{seed}:{step}")
    aux = r.random() < 0.25
    return {"stream": "aux" if aux else "main", "chunking": "cdc" if aux else "pages",
            "delete_roll": r.random(), "delete_pick": r.randrange(1 << 30)}


def expected(seed: int, step: int) -> tuple[str, str, dict]:
    """(stream, chunking, {buffer name: bytes}) of the checkpoint of `step`."""
    p = plan(seed, step)
    r = random.Random(f"content:{seed}:{step}")
    if p["stream"] == "aux":
        base = _base(seed, "aux", 300_000)
        cut = r.randrange(len(base))
        ins = r.randbytes(r.randint(1, 5000))
        drop = r.randrange(len(base))
        data = base[:cut] + ins + base[cut:]
        data = data[:drop] + data[drop + r.randint(0, 3000):]
        return "aux", "cdc", {"doc": data, "hdr": r.randbytes(r.randint(0, 300))}
    size = WEIGHT_SIZES[(step // 6) % len(WEIGHT_SIZES)]
    w = bytearray(_base(seed, "weights", size))
    if r.random() < 0.1:                    # big change: forces a full checkpoint
        start = r.randrange(size)
        w[start:] = r.randbytes(size - start)
        w[:start // 2] = r.randbytes(start // 2)
    else:                                   # a few dirty pages, some only partly
        for _ in range(r.randint(0, 6)):
            page = r.randrange(0, max(1, size // PAGE + 1))
            off = page * PAGE + (r.randrange(PAGE) if r.random() < 0.5 else 0)
            n = min(r.randint(1, PAGE), max(0, size - off))
            w[off:off + n] = r.randbytes(n)
    bufs = {"weights": bytes(w), "opt": r.randbytes(5000 + step % 3)}
    if step % 4 == 0:
        bufs["tiny"] = bytes([step & 0xFF])
    if step % 5 == 0:
        bufs["empty"] = b""
    return "main", "pages", bufs


class Journal:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def note(self, line: str, sync: bool = False) -> None:
        os.write(self.fd, (line + "\n").encode())
        if sync:
            os.fsync(self.fd)


def run_writer(store_path: str, journal: str, seed: int, start: int, max_steps: int,
               segment_size: int) -> None:
    import snapstore
    j = Journal(journal)
    store = snapstore.open(store_path, durability="fsync", segment_size=segment_size)
    j.note("ready")
    for step in range(start, start + max_steps):
        p = plan(seed, step)
        live = [c.id for c in store.checkpoints()]
        if len(live) > MAX_LIVE or (len(live) >= 3 and p["delete_roll"] < DELETE_RATE):
            victim = live[p["delete_pick"] % len(live)]
            j.note(f"try-del {victim}")
            store.delete(victim)
            j.note(f"del {victim}", sync=True)
        stream, chunking, bufs = expected(seed, step)
        j.note(f"try {step}")
        info = store.checkpoint(bufs, stream=stream, meta={"step": step}, chunking=chunking)
        j.note(f"ok {info.id} {step}", sync=True)
    store.close()
    j.note("done", sync=True)


def run_die_in_create(store_path: str, journal: str, seed: int, header_bytes: int) -> None:
    """Writes checkpoints with 1 MiB segments through a backend whose create() makes the new
    segment file, writes `header_bytes` of its header and SIGKILLs the process: a kill (or
    power cut) inside segment rollover."""
    import signal

    import snapstore
    from snapstore.engine import format as fmt
    from snapstore.engine.backends import LocalSegments
    from snapstore.engine.wal import encode_segment_header

    class DieInCreate(LocalSegments):
        """The log creates a segment, then appends its header: die in between."""

        def create(self, number):
            f = super().create(number)
            if number > 1:
                f.append([encode_segment_header(number)[:header_bytes]])
                os.kill(os.getpid(), signal.SIGKILL)
            return f

    j = Journal(journal)
    backend = DieInCreate(os.path.join(store_path, fmt.SEGMENTS_DIR))
    store = snapstore.open(store_path, segment_size=1 << 20, backend=backend)
    j.note("ready")
    for step in range(1000):
        stream, chunking, bufs = expected(seed, step)
        j.note(f"try {step}")
        info = store.checkpoint(bufs, stream=stream, meta={"step": step}, chunking=chunking)
        j.note(f"ok {info.id} {step}", sync=True)


def run_reader(store_path: str, out: str, seed: int, seconds: float) -> int:
    import snapstore
    from snapstore.errors import CheckpointNotFound
    deadline = time.monotonic() + seconds
    verified: set = set()
    outfd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    rounds = 0
    while time.monotonic() < deadline:
        rounds += 1
        store = snapstore.open(store_path, readonly=True)
        try:
            for _ in range(20):
                if time.monotonic() >= deadline:
                    break
                infos = store.checkpoints()
                todo = [c for c in infos if c.id not in verified] or infos[-2:]
                for info in todo:
                    try:
                        got = store.restore(info.id)
                    except CheckpointNotFound:
                        continue            # deleted by the writer since the listing
                    step = info.meta["step"]
                    stream, _, want = expected(seed, step)
                    if info.stream != stream or got != want:
                        sys.stderr.write(f"checkpoint {info.id} (step {step}) restored wrong "
                                         f"bytes: {sorted(got)} vs {sorted(want)}\n")
                        return 1
                    if info.id not in verified:
                        verified.add(info.id)
                        os.write(outfd, f"{info.id} {step}\n".encode())
                time.sleep(0.005)
        finally:
            store.close()
    os.write(outfd, f"rounds {rounds}\n".encode())
    return 0


def main(argv: list) -> int:
    mode = argv[1]
    if mode == "write":
        store, journal, seed, start, steps, segsize = argv[2:8]
        run_writer(store, journal, int(seed), int(start), int(steps), int(segsize))
        return 0
    if mode == "die-in-create":
        store, journal, seed, header_bytes = argv[2:6]
        run_die_in_create(store, journal, int(seed), int(header_bytes))
        return 0
    if mode == "read":
        store, out, seed, seconds = argv[2:6]
        return run_reader(store, out, int(seed), float(seconds))
    import snapstore
    if mode == "hold":
        store, out = argv[2:4]
        s = snapstore.open(store)
        with open(out, "w") as f:
            f.write("ready\n")
        sys.stdin.readline()
        s.close()
        return 0
    if mode == "open":
        store, out, timeout = argv[2:5]
        t = time.monotonic()
        try:
            s = snapstore.open(store, timeout=float(timeout))
        except Exception as exc:  # reported to the parent
            result = type(exc).__name__
        else:
            result = "ok"
            s.close()
        with open(out, "w") as f:
            f.write(f"{result} {time.monotonic() - t:.3f}\n")
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv))
