"""Bit flips in segment files against verify() and restore() (issue 4, "Verification").

One store with a bit of everything (incremental chains of two buffers, zstd and raw chunks,
CDC checkpoints, garbage chunks the index still lists, garbage records it no longer lists,
commit, delete and tag records, several segments). Each trial flips one byte at a random place
of a chosen kind, then:
  * verify(deep=True) is not ok and one of its problems names the flipped record (segment and
    offset of the record, or offset 0 for the segment header);
  * every live checkpoint either restores byte-exact or raises CorruptionError (never wrong
    bytes), and the checkpoints that raise are exactly the ones the report lists;
  * flips in records no checkpoint reads (segment headers, commit/delete/tag records, garbage
    chunks) break no restore and the report lists no checkpoint;
  * verify(deep=False) catches every flip in a live chunk record, listing the same checkpoints;
and the byte is put back (verify ok again).

SNAPSTORE_FLIP_SEED fixes the seed (printed, and in every failure message);
SNAPSTORE_FLIP_TRIALS sets the number of trials (default 160).
"""
from __future__ import annotations

import os
import random

import pytest

import snapstore
from snapstore.engine import format as fmt
from snapstore.errors import CorruptionError
from snapstore.engine.backends import segment_name
from snapstore.engine.wal import scan

TRIALS = int(os.environ.get("SNAPSTORE_FLIP_TRIALS", "160"))
PAGE = 4096
HDR = fmt.RECORD_HEADER.size
LENGTH_FIELD = (8, 12)          # bytes of the record header holding the payload length
KINDS = ("live_payload", "live_header", "segment_header", "index_record", "garbage_known",
         "garbage_unknown")


def _text(tag: str, n: int) -> bytes:
    return (f"<{tag}>" * (n // (len(tag) + 2) + 1)).encode()[:n]


def build_store(path: str) -> dict:
    """Returns {checkpoint id: {buffer: bytes}} of the live checkpoints."""
    rng = random.Random(7)
    want: dict = {}
    with snapstore.open(path, durability="none", segment_size=1 << 16, chunk_size=16 << 10,
                        max_chain=8) as s:
        w = bytearray(rng.randbytes(96 << 10))          # raw chunks
        z = bytearray(_text("z", 64 << 10))               # zstd chunks
        for step in range(6):
            if step:
                for _ in range(3):
                    p = rng.randrange(len(w) // PAGE)
                    w[p * PAGE:(p + 1) * PAGE] = rng.randbytes(PAGE)
                p = rng.randrange(len(z) // PAGE)
                z[p * PAGE:(p + 1) * PAGE] = _text(f"z{step}", PAGE)
            bufs = {"w": bytes(w), "z": bytes(z)}
            want[s.checkpoint(bufs, stream="main", meta=step).id] = bufs
        doc = _text("doc", 40 << 10) + rng.randbytes(30 << 10)
        for step in range(2):
            doc = doc[:1000 * step] + rng.randbytes(500) + doc[1000 * step:]
            want[s.checkpoint({"doc": doc}, stream="cdc", chunking="cdc").id] = {"doc": doc}
        # garbage that compaction drops from the index but leaves in a half-live segment
        gone = s.checkpoint({"g": rng.randbytes(20 << 10)}, stream="gone").id
        s.delete(gone)
        s.compact(threshold=0.0, max_garbage=None)   # rewrite nothing
        # garbage the index still lists (reference count 0)
        for k in range(3):
            info = s.checkpoint({"junk": rng.randbytes(24 << 10)}, stream="junk")
            s.delete(info.id)
        s.tag(next(iter(want)), "first")
        # a delete in the middle of the main chain
        main = [c.id for c in s.checkpoints("main")]
        s.delete(main[2])
        del want[main[2]]
        bufs = {"w": bytes(w), "z": _text("tail", 64 << 10)}
        want[s.checkpoint(bufs, stream="main").id] = bufs
        assert s.verify(deep=True)["ok"]
    return want


def layout(s) -> list:
    """Every region of every segment: (segment, start, end, kind, record start, record end)."""
    with s._index.read() as r:
        known = {(e.segment, e.offset): e.refs for _, e in r.chunks()}
    regions = []
    for n in s.backend.list():
        regions.append((n, 0, fmt.SEGMENT_HEADER.size, "segment_header", 0,
                        fmt.SEGMENT_HEADER.size))
        for item in scan(s.backend, n, 0):
            if isinstance(item, tuple):
                assert item[0] == "end", item
                break
            start, end = item.offset, item.end
            if item.rtype == fmt.REC_CHUNK:
                refs = known.get((n, start))
                kind = "garbage_unknown" if refs is None else \
                    ("garbage_known" if refs == 0 else "live")
            else:
                kind = "index_record"
            if kind == "live":
                regions.append((n, start, start + HDR, "live_header", start, end))
                regions.append((n, start + HDR, end, "live_payload", start, end))
            else:
                regions.append((n, start, end, kind, start, end))
    return regions


def flip(s, seg: int, pos: int, mask: int) -> None:
    fd = os.open(os.path.join(s.path, fmt.SEGMENTS_DIR, segment_name(seg)), os.O_RDWR)
    try:
        old = os.pread(fd, 1, pos)
        os.pwrite(fd, bytes([old[0] ^ mask]), pos)
    finally:
        os.close(fd)


def broken_checkpoints(s, want: dict, where: str) -> set:
    broken = set()
    for cid, bufs in want.items():
        try:
            got = s.restore(cid)
        except CorruptionError:
            broken.add(cid)
            continue
        assert got == bufs, f"{where}: checkpoint {cid} restored WRONG bytes"
    return broken


def covering(problems: list, seg: int, rstart: int, rend: int, pos: int) -> list:
    name = segment_name(seg)
    return [p for p in problems if p["segment"] == name and p["offset"] is not None
            and (p["offset"] == rstart or rstart <= p["offset"] <= pos < rend)]


@pytest.fixture(scope="module")
def flip_store(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("flips") / "store")
    want = build_store(path)
    return path, want


def test_random_flips_are_found_and_listed_exactly(flip_store):
    path, want = flip_store
    seed = int(os.environ.get("SNAPSTORE_FLIP_SEED", random.randrange(1 << 31)))
    print(f"\nSNAPSTORE_FLIP_SEED={seed}")
    rng = random.Random(seed)
    seen_kinds: dict = {}
    with snapstore.open(path, durability="none") as s:
        regions = layout(s)
        by_kind = {k: [r for r in regions if r[3] == k] for k in KINDS}
        for k in KINDS:
            assert by_kind[k], f"the store has no region of kind {k}"
        for trial in range(TRIALS):
            kind = KINDS[trial % len(KINDS)]
            seg, a, b, _, rstart, rend = rng.choice(by_kind[kind])
            pos = rng.randrange(a, b)
            mask = 1 << rng.randrange(8) if rng.random() < 0.7 else rng.randrange(1, 256)
            where = (f"seed {seed} trial {trial}: {kind} flip ^{mask:#04x} at "
                     f"{segment_name(seg)}+{pos} (record {rstart}..{rend})")
            flip(s, seg, pos, mask)
            try:
                deep = s.verify(deep=True)
                assert not deep["ok"], f"{where}: verify(deep=True) found nothing"
                cover = covering(deep["problems"], seg, rstart, rend, pos)
                assert cover, f"{where}: no problem names the record: {deep['problems']}"
                broken = broken_checkpoints(s, want, where)
                listed = set().union(*(p["checkpoints"] for p in deep["problems"]))
                if kind.startswith("live"):
                    assert broken, f"{where}: a live chunk flip broke no restore"
                else:
                    assert not broken, f"{where}: a flip in an unread record broke {broken}"
                # exact, flips in length fields included (the scan must not trust them)
                assert listed == broken, \
                    f"{where}: report lists {sorted(listed)}, restore fails for " \
                    f"{sorted(broken)}: {deep['problems']}"
                assert set(cover[0]["checkpoints"]) == broken, f"{where}: {cover}"
                if kind.startswith("live"):
                    shallow = s.verify(deep=False)
                    assert not shallow["ok"], f"{where}: verify(deep=False) found nothing"
                    cover = covering(shallow["problems"], seg, rstart, rend, pos)
                    assert cover and set(cover[0]["checkpoints"]) == broken, \
                        f"{where}: shallow report {shallow['problems']}"
            finally:
                flip(s, seg, pos, mask)
            seen_kinds[kind] = seen_kinds.get(kind, 0) + 1
            if trial % 20 == 19:
                assert s.verify(deep=True)["ok"], f"seed {seed}: byte not put back"
        assert s.verify(deep=True)["ok"]
        assert broken_checkpoints(s, want, "after all trials") == set()
    print(f"flips per kind: {seen_kinds}")


def test_every_byte_of_one_live_chunk_record(flip_store):
    """Exhaustive over one small live chunk record: every byte flipped is detected, deep and
    shallow, and breaks exactly the listed checkpoints."""
    path, want = flip_store
    with snapstore.open(path, durability="none") as s:
        regions = layout(s)
        heads = [r for r in regions if r[3] == "live_header"]
        seg, _, _, _, rstart, rend = min(heads, key=lambda r: r[5] - r[4])
        assert rend - rstart < 8192
        first_broken = None
        for pos in range(rstart, rend):
            flip(s, seg, pos, 0x10)
            try:
                where = f"byte {pos - rstart} of record {segment_name(seg)}+{rstart}"
                deep = s.verify(deep=True)
                assert covering(deep["problems"], seg, rstart, rend, pos), where
                shallow = s.verify(deep=False)
                cover = covering(shallow["problems"], seg, rstart, rend, pos)
                assert cover, where
                broken = broken_checkpoints(s, want, where)
                assert broken and set(cover[0]["checkpoints"]) == broken, where
                if first_broken is None:
                    first_broken = broken
                assert broken == first_broken, where
                listed = set().union(*(p["checkpoints"] for p in deep["problems"]))
                assert listed == broken, where
            finally:
                flip(s, seg, pos, 0x10)
        assert s.verify(deep=True)["ok"]


def test_flip_in_a_length_field_lists_only_broken_checkpoints(tmp_path):
    path = str(tmp_path / "store")
    rng = random.Random(3)
    want = {}
    with snapstore.open(path, durability="none", segment_size=1 << 16) as s:
        for k in range(6):        # two streams' chunks interleaved in the same segment
            for stream in ("a", "b"):
                bufs = {"x": rng.randbytes(3000)}
                want[s.checkpoint(bufs, stream=f"{stream}{k}").id] = bufs
        regions = layout(s)
        live = [r for r in regions if r[3] == "live_header"]
        seg, _, _, _, rstart, rend = live[0]
        nxt = [r for r in live if r[0] == seg and r[4] > rend]
        size = s.backend.size(seg)
        length = rend - rstart - HDR
        bit = next(k for k in range(32) if not length >> k & 1
                   and rend + (1 << k) > nxt[0][4] and rstart + HDR + (length | 1 << k) <= size)
        pos = rstart + LENGTH_FIELD[0] + bit // 8
        flip(s, seg, pos, 1 << bit % 8)
        deep = s.verify(deep=True)
        broken = broken_checkpoints(s, want, "length flip")
        assert len(broken) == 1 and covering(deep["problems"], seg, rstart, rend, pos)
        listed = set().union(*(p["checkpoints"] for p in deep["problems"]))
        assert listed == broken, (sorted(listed), sorted(broken), deep["problems"])


def test_a_chunk_shared_by_two_buffers_lists_every_dependent(tmp_path):
    """x and y of checkpoint A share a chunk P. B changes both a little (deltas); C changes all
    of y (full) and a page of x (delta); D changes a page of each. A flip in P breaks A, B, C and
    D (C and D read A's x through their x chains). 16 streams with different buffer names, so
    whatever order the set of (checkpoint, buffer) pairs iterates in, some stream shows it."""
    path = str(tmp_path / "store")
    chunk = 16 << 10
    expected_broken: dict = {}
    want = {}
    with snapstore.open(path, durability="none", segment_size=1 << 20, chunk_size=chunk,
                        max_chain=8, full_threshold=0.9) as s:   # C stays a delta
        shared = []
        for k in range(16):
            r = random.Random(k)
            x_name, y_name = f"x{k}", f"y{k}"
            p = r.randbytes(chunk)
            x = bytearray(p + r.randbytes(chunk))
            y = bytearray(p + r.randbytes(chunk))
            ids = []
            for step in range(4):
                if step in (1, 3):
                    x[chunk + 100:chunk + 200] = r.randbytes(100)
                    y[chunk + 100:chunk + 200] = r.randbytes(100)
                if step == 2:
                    x[chunk + 300:chunk + 400] = r.randbytes(100)
                    y[:] = r.randbytes(len(y))
                bufs = {x_name: bytes(x), y_name: bytes(y)}
                info = s.checkpoint(bufs, stream=f"s{k}")
                want[info.id] = bufs
                ids.append(info)
            assert [c.chain_length for c in ids] == [0, 1, 2, 3], ids
            expected_broken[k] = {c.id for c in ids}
            shared.append(p)
        import blake3
        with s._index.read() as r:
            entries = [r.chunk(blake3.blake3(p).digest()) for p in shared]
        assert all(e is not None and e.refs == 2 for e in entries)
        for e in entries:        # damage every shared chunk's payload
            flip(s, e.segment, e.offset + HDR + 100, 0x01)
        deep = s.verify(deep=True)
        broken = broken_checkpoints(s, want, "shared chunk")
        assert broken == set().union(*expected_broken.values())
        misses = {}
        for k, e in enumerate(entries):
            [p] = [p for p in deep["problems"] if p["segment"] == segment_name(e.segment)
                   and p["offset"] == e.offset]
            if set(p["checkpoints"]) != expected_broken[k]:
                misses[k] = sorted(expected_broken[k] - set(p["checkpoints"]))
        assert not misses, f"checkpoints missing from the problems of streams: {misses}"
