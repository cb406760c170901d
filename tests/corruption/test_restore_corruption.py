"""Damaged stores: the store must never return wrong bytes.

Every chunk read is checked against its record checksum and chunk id; a mismatch raises
CorruptionError naming the segment file and the record offset, while checkpoints that do not
use the damaged bytes still restore byte-exact. Also: truncated and deleted segments, a
damaged commit record past the applied position (recovery must not apply it), garbage at the
tail (recovery cuts it), newer format versions and foreign directories (FormatError).

Random damage uses SNAPSTORE_CORRUPTION_SEED (default: random, printed; shown on failure).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys

import lmdb
import pytest

import snapstore
from snapstore.engine import format as fmt
from snapstore.errors import CheckpointNotFound, CorruptionError, FormatError
from snapstore.engine.index import Index, seal
from snapstore.engine.reader import buffer_layers
from snapstore.engine.backends import LocalSegments, segment_name
from snapstore.engine.wal import encode_record_header, scan

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def seed():
    s = int(os.environ.get("SNAPSTORE_CORRUPTION_SEED", random.randrange(1 << 31)))
    print(f"corruption seed {s} (rerun with SNAPSTORE_CORRUPTION_SEED={s})")
    return s


# ---- a store with known content and a map of where every chunk lives ----------------------

def _content(r: random.Random, size: int) -> bytearray:
    data = bytearray(r.randbytes(size))
    for p in range(0, size, 4096):
        if r.random() < 0.3:           # compressible pages: zstd-coded chunks
            data[p:p + 4096] = bytes([r.randrange(256)]) * len(data[p:p + 4096])
    return data


def build_store(path: str, seed: int, segment_size: int = 128 << 10) -> dict:
    """Checkpoints of two page streams (full + deltas), a CDC stream (dedup across
    checkpoints) and one checkpoint made only of chunks another already stored.
    Returns {checkpoint id: {buffer: bytes}}."""
    r = random.Random(seed)
    want = {}
    s = snapstore.open(path, segment_size=segment_size)
    try:
        w = _content(r, 400_003)
        small = bytes(_content(r, 3000))
        for i in range(4):
            if i:
                for _ in range(3):
                    at, n = r.randrange(len(w) - 5000), r.randint(1, 5000)
                    w[at:at + n] = r.randbytes(n)
            bufs = {"w": bytes(w), "s": small if i < 2 else bytes(_content(r, 3001))}
            want[s.checkpoint(bufs, stream="pages", meta=i).id] = bufs
        doc = bytes(_content(r, 250_000))
        for i in range(3):
            at = r.randrange(len(doc))
            doc = doc[:at] + r.randbytes(r.randint(1, 2000)) + doc[at:]
            bufs = {"doc": doc}
            want[s.checkpoint(bufs, stream="cdc", chunking="cdc", meta=i).id] = bufs
        other = {"x": bytes(_content(r, 200_000)), "y": b"tiny", "e": b""}
        want[s.checkpoint(other, stream="other").id] = other
        first = want[min(want)]
        want[s.checkpoint(dict(first), stream="dup").id] = dict(first)   # all deduplicated
    finally:
        s.close()
    return want


class ChunkMap:
    """From the index: where each chunk's record is, which checkpoint buffers use it."""

    def __init__(self, path: str) -> None:
        idx = Index(os.path.join(path, fmt.INDEX_DIR), readonly=True, durable=False)
        try:
            with idx.read() as r:
                self.entries = dict(r.chunks())
                self.applied = r.applied()
                # (checkpoint id, buffer name) -> list of (buf offset, length, chunk id) over
                # every layer the restore reads
                self.uses: dict[tuple, list] = {}
                for cid in r.checkpoint_ids():
                    commit = r.checkpoint(cid)
                    for b in commit.buffers:
                        layers = buffer_layers(r, commit, b.name)
                        self.uses[(cid, b.name)] = [(off, length, chunk)
                                                    for layer in layers
                                                    for off, _, length, chunk in layer]
        finally:
            idx.close()

    def record(self, chunk: bytes) -> tuple[int, int, int]:
        e = self.entries[chunk]
        return e.segment, e.offset, fmt.RECORD_HEADER.size + e.stored_len

    def checkpoints_using(self, pred) -> set:
        """Checkpoints that read a chunk for which pred(segment, offset, length) holds."""
        out = set()
        for (cid, _), uses in self.uses.items():
            if any(pred(*self.record(ch)) for _, _, ch in uses):
                out.add(cid)
        return out

    def used_chunks(self) -> list:
        return sorted({ch for uses in self.uses.values() for _, _, ch in uses},
                      key=lambda c: self.record(c))


def seg_path(path: str, number: int) -> str:
    return os.path.join(path, fmt.SEGMENTS_DIR, segment_name(number))


def flip(path: str, number: int, pos: int, mask: int) -> None:
    with open(seg_path(path, number), "r+b") as f:
        f.seek(pos)
        b = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([b ^ mask]))


def assert_exact(store, cid: int, bufs: dict, ctx: str = "") -> None:
    got = store.restore(cid)
    assert got.keys() == bufs.keys(), ctx
    for name in bufs:
        assert got[name] == bufs[name], f"{ctx} checkpoint {cid} buffer {name!r} differs"


def assert_names(exc: CorruptionError, number: int, offset: int | None, ctx: str = "") -> None:
    name = segment_name(number)
    assert exc.segment == name, f"{ctx} {exc!r} names segment {exc.segment}, not {name}"
    assert name in str(exc), f"{ctx} message lacks the segment: {exc}"
    if offset is not None:
        assert exc.offset == offset, f"{ctx} {exc!r} names offset {exc.offset}, not {offset}"
        assert str(offset) in str(exc), f"{ctx} message lacks the offset: {exc}"


def check_store(store, want: dict, bad: dict, ctx: str) -> None:
    """bad: {checkpoint id: (segment, offset or None)} must raise naming that place; every
    other checkpoint restores byte-exact."""
    for cid, bufs in want.items():
        if cid in bad:
            with pytest.raises(CorruptionError) as ei:
                store.restore(cid)
            assert_names(ei.value, *bad[cid], ctx=f"{ctx} restore({cid})")
            targets = {n: bytearray(len(v)) for n, v in bufs.items()}
            with pytest.raises(CorruptionError):
                store.restore_into(cid, targets)
        else:
            assert_exact(store, cid, bufs, ctx)


# ---- flipped bytes inside chunk records ------------------------------------------------------

def test_flipped_bytes_in_chunk_records(tmp_path, seed):
    path = str(tmp_path / "s")
    want = build_store(path, seed)
    cmap = ChunkMap(path)
    r = random.Random(seed)
    chunks = cmap.used_chunks()
    assert len({cmap.record(c)[0] for c in chunks}) >= 3, "want chunks in several segments"
    trials = 30
    for t in range(trials):
        chunk = r.choice(chunks)
        number, offset, length = cmap.record(chunk)
        where = r.choice(["header", "payload", "payload", "any"])
        lo, hi = {"header": (0, fmt.RECORD_HEADER.size),
                  "payload": (fmt.RECORD_HEADER.size, length)}.get(where, (0, length))
        pos = offset + r.randrange(lo, hi)
        mask = r.randrange(1, 256)
        ctx = f"[seed {seed} trial {t}: segment {number} byte {pos} ^= {mask:#x}]"
        flip(path, number, pos, mask)
        try:
            bad = {cid: (number, offset) for (cid, _), uses in cmap.uses.items()
                   if any(ch == chunk for _, _, ch in uses)}
            assert bad, ctx
            store = snapstore.open(path, readonly=bool(t % 2))
            try:
                check_store(store, want, bad, ctx)
                # read(): a range that needs the chunk fails, one that does not is exact
                users = [(key, [(o, n) for o, n, ch in uses if ch == chunk and n])
                         for key, uses in sorted(cmap.uses.items())]
                (cid, name), hits = next((u for u in users if u[1]), (None, None))
                if cid is not None:
                    o, n = r.choice(hits)
                    a = o + r.randrange(n)
                    with pytest.raises(CorruptionError) as ei:
                        store.read(cid, name, a, min(100, o + n - a))
                    assert_names(ei.value, number, offset, ctx)
                    size = len(want[cid][name])
                    for start in range(0, size, 4096):
                        end = min(size, start + 4096)
                        if all(ch != chunk or o + n <= start or o >= end
                               for o, n, ch in cmap.uses[(cid, name)]):
                            assert store.read(cid, name, start, end - start) == \
                                want[cid][name][start:end], ctx
                            break
            finally:
                store.close()
        finally:
            flip(path, number, pos, mask)
    store = snapstore.open(path)
    try:
        check_store(store, want, {}, f"[seed {seed} undamaged]")
    finally:
        store.close()


def test_index_pointing_at_another_chunk_record_is_caught(tmp_path, seed):
    """The record checksum is fine, but it is not the chunk the index means: the chunk-id
    check (and the length check) must catch it. The forged entry is sealed with a valid
    index checksum (an index that lies consistently), so the reader's own checks are what
    is tested."""
    path = str(tmp_path / "s")
    want = build_store(path, seed)
    cmap = ChunkMap(path)
    r = random.Random(seed)
    chunks = cmap.used_chunks()
    # same raw length: only the chunk-id check can tell them apart
    by_len: dict = {}
    for c in chunks:
        by_len.setdefault(cmap.entries[c].raw_len, []).append(c)
    a, b = r.sample(max(by_len.values(), key=len), 2)
    ea, eb = cmap.entries[a], cmap.entries[b]
    env = lmdb.open(os.path.join(path, fmt.INDEX_DIR), max_dbs=fmt.INDEX_MAX_DBS)
    try:
        db = env.open_db(fmt.DB_CHUNKS)
        with env.begin(write=True) as txn:
            txn.put(a, seal(fmt.DB_CHUNKS, a, fmt.CHUNK_ENTRY.pack(
                eb.segment, eb.offset, eb.stored_len, ea.raw_len, ea.refs, ea.codec)), db=db)
    finally:
        env.close()
    bad = {cid: (eb.segment, eb.offset) for (cid, _), uses in cmap.uses.items()
           if any(ch == a for _, _, ch in uses)}
    store = snapstore.open(path, readonly=True)
    try:
        check_store(store, want, bad, f"[seed {seed}]")
    finally:
        store.close()


# ---- truncated and deleted segments ----------------------------------------------------------

def test_truncated_sealed_segment(tmp_path, seed):
    path = str(tmp_path / "s")
    want = build_store(path, seed)
    cmap = ChunkMap(path)
    r = random.Random(seed)
    numbers = sorted({cmap.record(c)[0] for c in cmap.used_chunks()})
    number = r.choice(numbers[:-1])                 # sealed: not the last segment
    size = os.path.getsize(seg_path(path, number))
    cut = r.randrange(fmt.SEGMENT_HEADER.size + 1, size)
    os.truncate(seg_path(path, number), cut)
    cut_chunks = [c for c in cmap.used_chunks()
                  if cmap.record(c)[0] == number and sum(cmap.record(c)[1:]) > cut]
    bad = {}
    for (cid, _), uses in sorted(cmap.uses.items()):
        for _, _, ch in uses:
            if ch in cut_chunks:
                bad.setdefault(cid, (number, None))
    ctx = f"[seed {seed}: {segment_name(number)} cut {size} -> {cut}]"
    for readonly in (True, False):
        store = snapstore.open(path, readonly=readonly)
        try:
            check_store(store, want, bad, ctx)
            for cid in bad:
                with pytest.raises(CorruptionError) as ei:
                    store.restore(cid)
                assert ei.value.offset in {cmap.record(c)[1] for c in cut_chunks}, ctx
        finally:
            store.close()


def test_truncated_last_segment_then_writing_on(tmp_path, seed):
    """The last segment loses its end (below the applied position). Readers: checkpoints
    using the lost records raise CorruptionError, the others restore. Writers, whatever their
    durability, are refused until `snapstore repair` (going on would append where the index
    still places the lost chunks, and a checkpoint deduplicated against one would name
    another record); after it, writing on (the lost bytes again too) never makes any
    checkpoint return wrong bytes."""
    path = str(tmp_path / "s")
    want = build_store(path, seed)
    cmap = ChunkMap(path)
    r = random.Random(seed)
    last = cmap.applied[0]
    size = os.path.getsize(seg_path(path, last))
    cut = r.randrange(fmt.SEGMENT_HEADER.size + 1, size)
    os.truncate(seg_path(path, last), cut)
    cut_chunks = {c for c in cmap.used_chunks()
                  if cmap.record(c)[0] == last and sum(cmap.record(c)[1:]) > cut}
    bad = {cid: (last, None) for (cid, _), uses in cmap.uses.items()
           if any(ch in cut_chunks for _, _, ch in uses)}
    ctx = f"[seed {seed}: last segment {segment_name(last)} cut {size} -> {cut}]"
    for durability in ("fsync", "none"):
        with pytest.raises(CorruptionError, match="snapstore repair"):
            snapstore.open(path, durability=durability)
    with snapstore.open(path, readonly=True) as reader:
        check_store(reader, want, bad, ctx)
    snapstore.repair(path)
    store = snapstore.open(path, durability="none")
    try:
        for cid, bufs in sorted(want.items()):
            try:
                assert_exact(store, cid, bufs, ctx)
            except (CorruptionError, CheckpointNotFound) as exc:
                assert cid in bad or cid >= min(bad, default=cid), f"{ctx} {cid}: {exc}"
        fresh = {"n": bytes(_content(r, 150_000))}
        again = {name: bytes(data) for name, data in want[max(want)].items()}
        for stream, bufs in (("fresh", fresh), ("again", again)):
            info = store.checkpoint(bufs, stream=stream)
            assert_exact(store, info.id, bufs, ctx)
            want[info.id] = bufs
            bad.pop(info.id, None)
    finally:
        store.close()
    store = snapstore.open(path)
    try:
        for cid, bufs in want.items():
            try:
                assert_exact(store, cid, bufs, ctx)
            except (CorruptionError, CheckpointNotFound):
                assert cid in bad or cid >= min(bad, default=cid), ctx
    finally:
        store.close()


def test_deleted_sealed_segment(tmp_path, seed):
    path = str(tmp_path / "s")
    want = build_store(path, seed)
    cmap = ChunkMap(path)
    r = random.Random(seed)
    numbers = sorted({cmap.record(c)[0] for c in cmap.used_chunks()})
    number = r.choice(numbers[:-1])
    os.unlink(seg_path(path, number))
    bad = {cid: (number, None) for (cid, _), uses in cmap.uses.items()
           if any(cmap.record(ch)[0] == number for _, _, ch in uses)}
    assert bad and len(bad) < len(want)
    for readonly in (True, False):
        store = snapstore.open(path, readonly=readonly)
        try:
            check_store(store, want, bad, f"[seed {seed}: {segment_name(number)} deleted]")
        finally:
            store.close()


def test_deleted_last_segment_fails_open(tmp_path, seed):
    path = str(tmp_path / "s")
    build_store(path, seed)
    last = ChunkMap(path).applied[0]
    os.unlink(seg_path(path, last))
    with pytest.raises(CorruptionError) as ei:
        snapstore.open(path)
    assert ei.value.segment == segment_name(last) and segment_name(last) in str(ei.value)


# ---- the tail of the log: recovery ---------------------------------------------------------

CRASH_SCRIPT = r"""
import json, sys
sys.path.insert(0, {root!r})
import snapstore
bufs = {{k: open(v, "rb").read() for k, v in json.load(open({spec!r})).items()}}
s = snapstore.open({path!r}, segment_size={segsize})
s.checkpoint(bufs, stream="pages", meta="in flight")
raise SystemExit("the crash point was not reached")
"""


def crash_during_checkpoint(tmp_path, path: str, bufs: dict, point: str,
                            segsize: int = 128 << 10) -> None:
    """A child takes one more checkpoint and dies at `point` (SIGKILL)."""
    spec = {}
    for name, data in bufs.items():
        p = tmp_path / f"buf-{name}"
        p.write_bytes(data)
        spec[name] = str(p)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = dict(os.environ, SNAPSTORE_CRASH_AT=point)
    script = CRASH_SCRIPT.format(root=ROOT, spec=str(tmp_path / "spec.json"), path=path,
                                 segsize=segsize)
    proc = subprocess.run([sys.executable, "-c", script], env=env, timeout=120,
                          capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


def unapplied_records(path: str) -> list:
    """Records past the index's applied position (fresh: nothing else open)."""
    applied = ChunkMap(path).applied
    backend = LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR), durable=False)
    try:
        out = []
        for n in [x for x in backend.list() if x >= applied[0]]:
            for item in scan(backend, n, applied[1] if n == applied[0] else 0,
                             chunk_payloads=False):
                out.append(item)
        return out
    finally:
        backend.close()


@pytest.mark.parametrize("point", ["after_fsync", "before_index_commit"])
def test_damaged_commit_record_past_applied_is_not_applied(tmp_path, seed, point):
    base = str(tmp_path / "base")
    want = build_store(base, seed, segment_size=1 << 20)
    r = random.Random(seed)
    extra = {"w": bytes(_content(r, 300_001)), "s": b"in flight"}
    crash_during_checkpoint(tmp_path, base, extra, point, segsize=1 << 20)
    recs = unapplied_records(base)
    commits = [x for x in recs if not isinstance(x, tuple) and x.rtype == fmt.REC_COMMIT]
    assert len(commits) == 1 and recs[-1][0] == "end", recs
    commit = commits[0]

    # Undamaged, recovery replays the durable commit record: the checkpoint appears.
    control = str(tmp_path / "control")
    shutil.copytree(base, control)
    store = snapstore.open(control)
    try:
        [info] = [c for c in store.checkpoints() if c.meta == "in flight"]
        assert_exact(store, info.id, extra)
    finally:
        store.close()

    spots = {"magic": 0, "type": 4, "length": 8, "checksum": 20,
             "payload": fmt.RECORD_HEADER.size + r.randrange(len(commit.payload)),
             "last byte": commit.end - commit.offset - 1}
    for what, rel in spots.items():
        damaged = str(tmp_path / f"damaged-{what.replace(' ', '-')}")
        shutil.copytree(base, damaged)
        mask = r.randrange(1, 256)
        flip(damaged, commit.segment, commit.offset + rel, mask)
        ctx = f"[seed {seed}: commit record byte {rel} ({what}) ^= {mask:#x}]"
        store = snapstore.open(damaged)
        try:
            assert all(c.meta != "in flight" for c in store.checkpoints()), ctx
            assert sorted(c.id for c in store.checkpoints()) == sorted(want), ctx
            check_store(store, want, {}, ctx)
            # recovery cut the log at the damaged record
            assert os.path.getsize(seg_path(damaged, commit.segment)) == commit.offset, ctx
            info = store.checkpoint(extra, stream="pages", meta="again")
            assert_exact(store, info.id, extra, ctx)
        finally:
            store.close()
        store = snapstore.open(damaged)
        try:
            assert [c.meta for c in store.checkpoints()].count("again") == 1, ctx
            assert all(c.meta != "in flight" for c in store.checkpoints()), ctx
            check_store(store, want, {}, ctx)
        finally:
            store.close()


def test_damaged_chunk_record_before_unapplied_commit(tmp_path, seed):
    """One fsync per checkpoint is enough because recovery validates every record before a
    commit record: a chunk of the in-flight checkpoint that did not reach the disk intact
    ends the scan there, and the commit after it is never applied."""
    path = str(tmp_path / "s")
    want = build_store(path, seed, segment_size=1 << 20)
    r = random.Random(seed)
    extra = {"w": bytes(_content(r, 300_001))}
    # big segments for the child: no rollover, the victim is in the last segment (a torn tail)
    crash_during_checkpoint(tmp_path, path, extra, "before_index_commit", segsize=64 << 20)
    recs = [x for x in unapplied_records(path) if not isinstance(x, tuple)]
    chunks = [x for x in recs if x.rtype == fmt.REC_CHUNK]
    assert {x.segment for x in recs} == {recs[-1].segment}
    assert chunks and recs[-1].rtype == fmt.REC_COMMIT
    victim = r.choice(chunks)
    pos = victim.offset + r.randrange(victim.end - victim.offset)
    mask = r.randrange(1, 256)
    flip(path, victim.segment, pos, mask)
    ctx = f"[seed {seed}: chunk record at {victim.offset}, byte {pos} ^= {mask:#x}]"
    store = snapstore.open(path)
    try:
        assert sorted(c.id for c in store.checkpoints()) == sorted(want), ctx
        check_store(store, want, {}, ctx)
        assert os.path.getsize(seg_path(path, victim.segment)) == victim.offset, ctx
        info = store.checkpoint(extra, stream="pages")
        assert_exact(store, info.id, extra, ctx)
    finally:
        store.close()


def test_damaged_record_past_applied_in_sealed_segment_is_corruption(tmp_path, seed):
    """The in-flight checkpoint spans segments; a record of it in a segment that was sealed
    (fsynced at rollover) is damaged: that is corruption, not a torn tail. Opening raises
    CorruptionError naming the segment and offset and truncates nothing."""
    path = str(tmp_path / "s")
    build_store(path, seed, segment_size=128 << 10)
    r = random.Random(seed)
    extra = {"w": r.randbytes(400_000)}             # incompressible: several segments
    crash_during_checkpoint(tmp_path, path, extra, "before_index_commit", segsize=128 << 10)
    recs = [x for x in unapplied_records(path) if not isinstance(x, tuple)]
    last = max(x.segment for x in recs)
    sealed = [x for x in recs if x.segment < last]
    assert sealed, "the in-flight checkpoint did not span segments"
    victim = r.choice(sealed)
    flip(path, victim.segment, victim.offset + r.randrange(victim.end - victim.offset),
         r.randrange(1, 256))
    segdir = os.path.join(path, fmt.SEGMENTS_DIR)
    sizes = {n: os.path.getsize(os.path.join(segdir, n)) for n in os.listdir(segdir)}
    with pytest.raises(CorruptionError) as ei:
        snapstore.open(path)
    assert_names(ei.value, victim.segment, victim.offset, f"[seed {seed}]")
    assert {n: os.path.getsize(os.path.join(segdir, n)) for n in os.listdir(segdir)} == sizes


def test_index_that_lost_its_last_transactions_is_replayed_from_the_log(tmp_path, seed):
    """LMDB runs with metasync off: a power cut may undo its last transactions, though the
    log records they applied are durable. Emulated by putting back a copy of the index taken
    earlier: recovery must replay the later commits and deletes (across segment rollovers),
    so every acknowledged checkpoint is back, byte-exact, and deleted ones stay deleted."""
    path = str(tmp_path / "s")
    want = build_store(path, seed, segment_size=128 << 10)
    saved = str(tmp_path / "index-copy")
    shutil.copytree(os.path.join(path, fmt.INDEX_DIR), saved)
    r = random.Random(seed)
    store = snapstore.open(path, segment_size=128 << 10)
    try:
        base = want[max(c for c, b in want.items() if "w" in b)]
        for i in range(4):
            w = bytearray(base["w"])
            at = r.randrange(len(w) - 100)
            w[at:at + 100] = r.randbytes(100)
            bufs = {"w": bytes(w), "s": base["s"]}
            want[store.checkpoint(bufs, stream="pages", meta=f"late {i}").id] = bufs
        victims = r.sample(sorted(want), 2)
        for v in victims:
            store.delete(v)
            del want[v]
        fresh = {"n": r.randbytes(200_000)}
        want[store.checkpoint(fresh, stream="new").id] = fresh
    finally:
        store.close()
    shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
    shutil.copytree(saved, os.path.join(path, fmt.INDEX_DIR))
    ctx = f"[seed {seed}: index rolled back, deleted {victims}]"
    store = snapstore.open(path, segment_size=128 << 10)
    try:
        assert sorted(c.id for c in store.checkpoints()) == sorted(want), ctx
        check_store(store, want, {}, ctx)
        assert sorted(store.streams()) == sorted({c.stream for c in store.checkpoints()}), ctx
        w = bytearray(base["w"])
        w[:10] = b"0123456789"
        bufs = {"w": bytes(w), "s": base["s"]}
        want[store.checkpoint(bufs, stream="pages").id] = bufs
        check_store(store, want, {}, ctx)
    finally:
        store.close()
    store = snapstore.open(path, readonly=True)
    try:
        check_store(store, want, {}, ctx)
    finally:
        store.close()


def _garbage(kind: str, r: random.Random) -> bytes:
    if kind == "random":
        return r.randbytes(r.randint(1, 5000))
    if kind == "zeros":
        return bytes(r.randint(1, 100))
    payload = r.randbytes(r.randint(10, 500))
    head = bytearray(encode_record_header(fmt.REC_COMMIT, 0, [payload]))
    if kind == "bad checksum":
        head[-3] ^= 0x10
        return bytes(head) + payload
    if kind == "short record":
        return bytes(head) + payload[:-1]
    if kind == "half header":
        return bytes(head[:r.randint(1, len(head) - 1)])
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["random", "zeros", "bad checksum", "short record",
                                  "half header"])
def test_garbage_at_the_tail_is_cut_by_recovery(tmp_path, seed, kind):
    path = str(tmp_path / "s")
    want = build_store(path, seed)
    last = ChunkMap(path).applied[0]
    p = seg_path(path, last)
    size = os.path.getsize(p)
    r = random.Random(seed)
    junk = _garbage(kind, r)
    with open(p, "ab") as f:
        f.write(junk)
    ctx = f"[seed {seed}: {len(junk)} bytes of {kind} garbage]"
    store = snapstore.open(path, readonly=True)       # read-only: no recovery, still fine
    try:
        check_store(store, want, {}, ctx)
    finally:
        store.close()
    store = snapstore.open(path)
    try:
        assert os.path.getsize(p) == size, f"{ctx} recovery did not cut the tail"
        check_store(store, want, {}, ctx)
        fresh = {"f": bytes(_content(r, 70_000))}
        want[store.checkpoint(fresh, stream="fresh").id] = fresh
    finally:
        store.close()
    store = snapstore.open(path)
    try:
        check_store(store, want, {}, ctx)
    finally:
        store.close()


@pytest.mark.parametrize("rtype,payload", [(fmt.REC_COMMIT, b""), (fmt.REC_COMMIT, b"\x01\x00"),
                                           (fmt.REC_DELETE, b"\x07" * 3)],
                         ids=["empty-commit", "short-commit", "short-delete"])
def test_undecodable_record_with_valid_checksum_is_corruption(tmp_path, seed, rtype, payload):
    """Regression (fixed in 5e4a126): such a record escaped recovery as a bare struct.error."""
    path = str(tmp_path / "s")
    build_store(path, seed)
    last = ChunkMap(path).applied[0]
    at = os.path.getsize(seg_path(path, last))
    with open(seg_path(path, last), "ab") as f:
        f.write(encode_record_header(rtype, 0, [payload]) + payload)
    with pytest.raises(CorruptionError) as ei:
        snapstore.open(path)
    assert_names(ei.value, last, at)


# Regression (found by these tests, fixed in 5e4a126): a last segment shorter than its 32-byte
# header (writer killed or power cut inside segment rollover: file created, header not yet
# written/durable) makes the store unopenable: Store._recover -> scan() -> check_segment_header
# raises CorruptionError 'segment header is truncated' instead of treating it as a torn tail
# (_truncate_tail's pos < SEGMENT_HEADER.size branch is unreachable; docs/design.md promises 'a
# torn segment header removes the segment'). Fix: treat a short or invalid header of the last
# segment past the applied one as torn and remove that segment.


@pytest.mark.parametrize("header_bytes", [0, 1, 31])
def test_headerless_new_last_segment_is_a_torn_tail(tmp_path, seed, header_bytes):
    from snapstore.engine.wal import encode_segment_header
    path = str(tmp_path / "s")
    want = build_store(path, seed)
    last = LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR)).list()[-1]
    with open(seg_path(path, last + 1), "wb") as f:
        f.write(encode_segment_header(last + 1)[:header_bytes])
    store = snapstore.open(path)
    try:
        check_store(store, want, {}, f"[seed {seed}]")
        fresh = {"f": b"after"}
        want[store.checkpoint(fresh).id] = fresh
    finally:
        store.close()
    store = snapstore.open(path)
    try:
        check_store(store, want, {}, f"[seed {seed}]")
    finally:
        store.close()


# ---- format versions and foreign directories -----------------------------------------------

def test_format_file_with_newer_version(tmp_path, seed):
    path = str(tmp_path / "s")
    build_store(path, seed)
    fpath = os.path.join(path, fmt.FORMAT_FILE)
    data = json.loads(open(fpath).read())
    data["version"] = fmt.FORMAT_VERSION + 1
    with open(fpath, "w") as f:
        json.dump(data, f)
    for kw in ({}, {"readonly": True}, {"create": False}):
        with pytest.raises(FormatError, match=str(fmt.FORMAT_VERSION + 1)):
            snapstore.open(path, **kw)
    # the refusal changed nothing: with the version back, the store opens
    data["version"] = fmt.FORMAT_VERSION
    with open(fpath, "w") as f:
        json.dump(data, f)
    snapstore.open(path).close()


@pytest.mark.parametrize("body", [b"", b"not json", b'{"format": "other", "version": 1}',
                                  b'{"format": "snapstore", "version": "1"}', b"[1, 2]"])
def test_damaged_or_foreign_format_file(tmp_path, body):
    path = str(tmp_path / "s")
    snapstore.open(path).close()
    with open(os.path.join(path, fmt.FORMAT_FILE), "wb") as f:
        f.write(body)
    for kw in ({}, {"readonly": True}):
        with pytest.raises(FormatError):
            snapstore.open(path, **kw)


def test_non_store_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("my files")
    (d / "sub").mkdir()
    for kw in ({}, {"readonly": True}, {"create": False}):
        with pytest.raises(FormatError):
            snapstore.open(str(d), **kw)
    assert (d / "notes.txt").read_text() == "my files"
    assert not (d / fmt.FORMAT_FILE).exists() and not (d / fmt.INDEX_DIR).exists()
    # missing directory: read-only and create=False refuse, and create nothing
    for kw in ({"readonly": True}, {"create": False}):
        with pytest.raises(FormatError):
            snapstore.open(str(tmp_path / "absent"), **kw)
        assert not (tmp_path / "absent").exists()


def test_non_store_directory_is_left_untouched(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("my files")
    with pytest.raises(FormatError):
        snapstore.open(str(d))
    assert sorted(os.listdir(d)) == ["notes.txt"]


def test_regular_file_is_not_a_store(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"data")
    with pytest.raises(FormatError):
        snapstore.open(str(f))


def _set_index_format(path: str, version: int) -> None:
    env = lmdb.open(os.path.join(path, fmt.INDEX_DIR), max_dbs=fmt.INDEX_MAX_DBS)
    try:
        db = env.open_db(fmt.DB_META)
        with env.begin(write=True) as txn:
            txn.put(fmt.META_FORMAT, fmt.U64.pack(version), db=db)
    finally:
        env.close()


def test_index_written_by_newer_format_refuses_writer(tmp_path, seed):
    path = str(tmp_path / "s")
    build_store(path, seed)
    _set_index_format(path, fmt.FORMAT_VERSION + 1)
    with pytest.raises(FormatError):
        snapstore.open(path)


def test_index_written_by_newer_format_refuses_reader(tmp_path, seed):
    path = str(tmp_path / "s")
    build_store(path, seed)
    _set_index_format(path, fmt.FORMAT_VERSION + 1)
    with pytest.raises(FormatError):
        snapstore.open(path, readonly=True)


def test_log_shorter_than_the_applied_position_is_reported(tmp_path):
    """With durability fsync the index never applies what the log does not hold, so a log
    that ends before the applied position lost acknowledged data: say so, do not carry on."""
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"a": os.urandom(100_000)})
    seg = LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR)).list()[-1]
    with open(seg_path(path, seg), "r+b") as f:
        f.truncate(fmt.SEGMENT_HEADER.size + 10)
    with pytest.raises(CorruptionError) as ei:
        snapstore.open(path)
    assert ei.value.segment == segment_name(seg)
    with snapstore.open(path, readonly=True) as r:       # readers still open (and fail cleanly)
        with pytest.raises(CorruptionError):
            r.restore(r.checkpoints()[0].id)
