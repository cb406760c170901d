"""A writeback hole in the unsynced tail of a log's last segment (docs/design.md, "Repair",
the torn tail; wal.writeback_hole): a power cut before the log's fdatasync may persist a later
page of a commit (its commit record) but not an earlier one (its chunk records), which then
reads as zeros with valid records after it. Those records were written after the hole, so no
sync completed after them either: the hole and what follows are the torn tail -- cut, the
checkpoint never visible -- whereas media damage in the same place (a flipped bit) stays
damage, reported, with the valid records after it salvaged.

The reboot is modelled as in tests/crash/test_unsynced_index.py: a writer with
sync_index=False closes, then a mark of an earlier boot makes the next opener rebuild the
index from the log."""
from __future__ import annotations

import os
import random

import pytest

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine.backends.local import LocalSegments
from snapstore.engine.wal import read_record
from snapstore.errors import CorruptionError

A = random.Random(1).randbytes(100000)
B = random.Random(2).randbytes(150000)          # incompressible: raw chunk records
C = random.Random(3).randbytes(90000)
# compressible to about half: zstd chunk records whose payloads span whole pages
HALF = bytes(b & 0x0F for b in random.Random(4).randbytes(150000))


def _stale_mark(store: str) -> None:
    """A mark of an earlier boot (its writer gone): the next opener rebuilds the index."""
    os.makedirs(os.path.join(store, "unsynced"), exist_ok=True)
    open(os.path.join(store, "unsynced",
                      "00000000-0000-0000-0000-000000000000.0123456789abcdef"), "w").close()


def _records(store: str, number: int) -> list:
    """The valid records of a segment, in order: [(offset, end, type, codec)]."""
    segments = os.path.join(store, "segments")
    backend = LocalSegments(segments, durable=False)
    out = []
    try:
        size = backend.size(number)
        with backend.open_reader() as reader:
            pos = fmt.SEGMENT_HEADER.size
            while pos < size:
                r = read_record(reader, number, pos, size=size)
                out.append((r.offset, r.end, r.rtype, r.codec))
                pos = r.end
    finally:
        backend.close()
    return out


def _segments(store: str) -> list[int]:
    return sorted(int(n.split(".")[0]) for n in os.listdir(os.path.join(store, "segments")))


def _segment_path(store: str, number: int) -> str:
    from snapstore.engine.backends.base import segment_name
    return os.path.join(store, "segments", segment_name(number))


def _write(store: str, number: int, at: int, data: bytes) -> None:
    with open(_segment_path(store, number), "r+b") as f:
        f.seek(at)
        f.write(data)


def _last_commit_chunks(store: str, number: int) -> tuple[list, tuple]:
    """The chunk records of the last checkpoint in segment `number` (those after the
    previous commit record) and its commit record."""
    recs = _records(store, number)
    assert recs[-1][2] == fmt.REC_COMMIT
    chunks = []
    for r in reversed(recs[:-1]):
        if r[2] != fmt.REC_CHUNK:
            break
        chunks.insert(0, r)
    assert chunks
    return chunks, recs[-1]


def _build(store: str, second: bytes, **opts) -> None:
    with snapstore.open(store, sync_index=False, **opts) as s:
        assert s.checkpoint({"x": A}, stream="s").id == 1
        assert s.checkpoint({"x": second}, stream="s").id == 2


def _check_cut(store: str) -> None:
    """The store opens without repair, only checkpoint 1 is there, it restores, deep
    verify is clean, and writing goes on."""
    with snapstore.open(store, readonly=True) as r:
        assert [c.id for c in r.checkpoints()] == [1]
        assert r.latest("s").id == 1
        assert bytes(r.restore(1)["x"]) == A
        assert r.verify(deep=True)["ok"]            # the uncut hole is a torn tail here too
    assert os.listdir(os.path.join(store, "unsynced")) == []
    with snapstore.open(store) as w:
        assert [c.id for c in w.checkpoints()] == [1]
        assert bytes(w.restore(1)["x"]) == A
        v = w.verify(deep=True)
        assert v["ok"], v["problems"]
        c = w.checkpoint({"x": C}, stream="s")
        assert bytes(w.restore(c.id)["x"]) == C
        assert w.verify(deep=True)["ok"]
    report = snapstore.repair(store)
    assert report["ok"], report["problems"]


@pytest.mark.parametrize("how", ["record", "header_and_page"])
def test_a_zeroed_chunk_record_before_its_commit_record_is_a_torn_tail(tmp_path, how):
    store = str(tmp_path / "s")
    _build(store, B, segment_size=1 << 20)
    last = _segments(store)[-1]
    chunks, commit = _last_commit_chunks(store, last)
    first = chunks[0]
    if how == "record":
        # the write of the first chunk record never reached the disk (a whole write lost)
        _write(store, last, first[0], bytes(first[1] - first[0]))
    else:
        # page-granular writeback: the page holding the next record's header and the one
        # before it were lost, so the first chunk record keeps a valid header (raw payload)
        end = first[1]
        lo = (end // 4096 - 1) * 4096
        assert lo > first[0] + fmt.RECORD_HEADER.size
        hi = (end // 4096 + 1) * 4096
        assert hi < commit[0]
        _write(store, last, lo, bytes(hi - lo))
    _stale_mark(store)
    _check_cut(store)


def test_a_zeroed_page_inside_a_compressed_chunk_is_a_torn_tail(tmp_path):
    store = str(tmp_path / "s")
    _build(store, HALF, segment_size=1 << 20)
    last = _segments(store)[-1]
    chunks, _ = _last_commit_chunks(store, last)
    coded = [r for r in chunks if r[3] == fmt.CODEC_ZSTD and r[1] - r[0] > 3 * 4096]
    assert coded
    rec = coded[0]
    page = (rec[0] // 4096 + 1) * 4096              # a whole page inside its payload
    assert page + 4096 < rec[1]
    _write(store, last, page, bytes(4096))
    _stale_mark(store)
    _check_cut(store)


def test_a_zeroed_header_of_the_last_segment_is_a_torn_tail(tmp_path):
    store = str(tmp_path / "s")
    _build(store, B, segment_size=1 << 17)          # checkpoint 2 starts a new segment
    last = _segments(store)[-1]
    assert _records(store, last)[0][2] == fmt.REC_CHUNK
    _write(store, last, 0, bytes(fmt.SEGMENT_HEADER.size))
    _stale_mark(store)
    _check_cut(store)


def _flip(store: str, number: int, at: int, mask: int = 0x01) -> None:
    with open(_segment_path(store, number), "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ mask]))


@pytest.mark.parametrize("where", ["payload", "header_magic", "raw_zero_payload",
                                   "raw_zero_codec"])
def test_a_flip_in_the_same_place_is_damage_and_later_records_are_salvaged(tmp_path, where):
    store = str(tmp_path / "s")
    zeros = where.startswith("raw_zero")
    second = bytes(3 * 65536) + B[:1000] if zeros else B
    opts = dict(segment_size=1 << 20)
    if zeros:
        opts["compression"] = "none"                # zero pages stored raw: legitimate zeros
    with snapstore.open(store, sync_index=False, **opts) as s:
        s.checkpoint({"x": A}, stream="s")
        s.checkpoint({"x": second}, stream="s")
        c = s.checkpoint({"y": C}, stream="t")
    last = _segments(store)[-1]
    recs = _records(store, last)
    commits = [i for i, r in enumerate(recs) if r[2] == fmt.REC_COMMIT]
    assert len(commits) == 3
    firsts = [r for r in recs[commits[0] + 1:commits[1]] if r[2] == fmt.REC_CHUNK]
    if zeros:
        firsts = [r for r in firsts if r[3] == fmt.CODEC_RAW and r[1] - r[0] > 3 * 4096]
    rec = firsts[0]
    if where == "header_magic":
        _flip(store, last, rec[0])
    elif where == "raw_zero_codec":
        _flip(store, last, rec[0] + 5)              # codec raw -> zstd
    else:
        _flip(store, last, rec[0] + fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size + 5000)
    _stale_mark(store)
    with pytest.raises(CorruptionError, match="holds damage.*snapstore repair"):
        snapstore.open(store, readonly=True)
    with pytest.raises(CorruptionError, match="holds damage.*snapstore repair"):
        snapstore.open(store)
    report = snapstore.repair(store)
    assert not report["ok"]
    kinds = {p["kind"] for p in report["problems"]}
    assert "damaged_record" in kinds
    assert any(p["kind"] == "damaged_record" and p["offset"] == rec[0]
               for p in report["problems"])
    with snapstore.open(store) as s:
        ids = [i.id for i in s.checkpoints()]
        assert 1 in ids and 2 in ids and c.id in ids   # the records after it were salvaged
        assert bytes(s.restore(1)["x"]) == A
        assert bytes(s.restore(c.id)["y"]) == C
        with pytest.raises(CorruptionError):
            s.restore(2)
