"""Store.manifests / read_chunks / import_checkpoint (Committer.commit_manifests): a checkpoint
made elsewhere, as full manifests naming chunks by BLAKE3 id, committed through the one commit
path: only the chunks the store lacks are asked for, each is checked, and any failure leaves
nothing visible and nothing in the log."""
from __future__ import annotations

import os

import pytest

import snapstore
from snapstore.errors import (CommitConflict, CorruptionError, InvalidArgumentError,
                              InvalidArgumentTypeError, ReadOnlyError, StoreClosedError)
from snapstore.store import BufferManifest


def _segment_bytes(store) -> int:
    return sum(store.backend.size(n) for n in store.backend.list())


@pytest.fixture
def two(tmp_path):
    src = snapstore.open(str(tmp_path / "src"), durability="none")
    dst = snapstore.open(str(tmp_path / "dst"), durability="none")
    try:
        yield src, dst
    finally:
        src.close()
        dst.close()


def _chain(src):
    """A stream of three: full, delta, delta (a 300 KB buffer, an empty one, a 1-byte one)."""
    x = bytearray(os.urandom(300_000))
    infos = [src.checkpoint({"x": x, "empty": b"", "one": b"!"}, "s", meta={"step": 0})]
    for step in (1, 2):
        x[step * 70_000:step * 70_000 + 9] = b"changed!!"
        infos.append(src.checkpoint({"x": x, "empty": b"", "one": b"!"}, "s",
                                    meta={"step": step}))
    return infos


def test_manifests_are_full_and_restore_the_checkpoint(two):
    src, _ = two
    infos = _chain(src)
    assert infos[-1].kind == "incremental"
    m = src.manifests(infos[-1].id)
    assert m.info == infos[-1] and m.meta == {"step": 2}
    assert [b.name for b in m.buffers] == ["x", "empty", "one"]
    assert m.buffers[1].extents == () and len(m.buffers[2].extents) == 1
    assert list(m.buffers[0].extents) == src.layout(infos[-1].id, "x")
    chunks = dict(src.read_chunks(m.chunk_ids()))
    for b in m.buffers:
        out = bytearray(b.size)
        for off, length, cid, coff in b.extents:
            out[off:off + length] = chunks[cid][coff:coff + length]
        assert bytes(out) == src.restore(infos[-1].id)[b.name]


def test_import_asks_only_for_missing_chunks(two):
    src, dst = two
    infos = _chain(src)
    asked = []

    def read(ids):
        asked.append(list(ids))
        return src.read_chunks(ids)
    m = src.manifests(infos[-1].id)
    got = dst.import_checkpoint("s", m.buffers, read, m.meta, created=m.info.created,
                                tags=["a", "b"])
    assert got.kind == "full" and got.parent is None and got.seq == 1
    assert got.created == m.info.created and got.meta == {"step": 2}
    assert got.tags == ("a", "b")
    assert sorted(asked[0]) == sorted(m.chunk_ids())
    assert dst.restore(got.id) == src.restore(infos[-1].id)
    # the first checkpoint's chunks: all but the deltas' are there already
    m0 = src.manifests(infos[0].id)
    before = _segment_bytes(dst)
    again = dst.import_checkpoint("s", m0.buffers, read, m0.meta)
    assert again.parent == got.id and again.seq == 2
    assert len(asked) == 1                 # nothing missing: read_chunks not called at all
    assert dst.restore(again.id) == src.restore(infos[0].id)
    assert _segment_bytes(dst) - before < 4096     # a commit record only
    assert dst.verify(deep=True)["ok"]


def test_wrong_missing_or_extra_chunks_leave_nothing(two):
    src, dst = two
    infos = _chain(src)
    m = src.manifests(infos[-1].id)
    ids = m.chunk_ids()
    dst.checkpoint({"other": b"x" * 10_000}, "o")
    before = _segment_bytes(dst)

    def wrong(asked):
        for cid, data in src.read_chunks(asked):
            yield cid, data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(CorruptionError, match="hash to"):
        dst.import_checkpoint("s", m.buffers, wrong, m.meta)

    def short(asked):
        return list(src.read_chunks(asked))[1:]
    with pytest.raises(CorruptionError, match="not given"):
        dst.import_checkpoint("s", m.buffers, short, m.meta)

    def extra(asked):
        return list(src.read_chunks(asked)) + [(b"\1" * 32, b"x")]
    with pytest.raises(CorruptionError, match="not asked for"):
        dst.import_checkpoint("s", m.buffers, extra, m.meta)

    def twice(asked):
        return list(src.read_chunks(asked)) + list(src.read_chunks(asked[:1]))
    with pytest.raises(CorruptionError, match="twice"):
        dst.import_checkpoint("s", m.buffers, twice, m.meta)
    assert dst.streams() == ["o"] and _segment_bytes(dst) == before
    assert len(ids) > 1


def test_a_read_chunks_that_gives_the_wrong_kind_of_thing_leaves_nothing(two):
    """The callback's results are the caller's input: anything but (chunk id, bytes) pairs
    is an InvalidArgumentTypeError (it was a raw TypeError), and nothing is written."""
    src, dst = two
    infos = _chain(src)
    m = src.manifests(infos[-1].id)
    before = _segment_bytes(dst)
    bad = [lambda asked: None, lambda asked: 5, lambda asked: iter([5]),
           lambda asked: ((c, "text") for c in asked), lambda asked: ((c,) for c in asked),
           lambda asked: ((c.hex(), d) for c, d in src.read_chunks(asked)),
           lambda asked: ((c, d, 1) for c, d in src.read_chunks(asked))]
    for read_chunks in bad:
        with pytest.raises(InvalidArgumentTypeError, match="read_chunks"):
            dst.import_checkpoint("s", m.buffers, read_chunks, m.meta)
    assert dst.streams() == [] and _segment_bytes(dst) == before
    # any buffer of the bytes will do: a bytearray, a memoryview, a NumPy array of floats
    import numpy as np

    def as_floats(asked):
        for cid, data in src.read_chunks(asked):
            yield cid, np.frombuffer(data, np.uint8).view(np.float32) if len(data) % 4 == 0 \
                else bytearray(data)
    info = dst.import_checkpoint("s", m.buffers, as_floats, m.meta)
    assert dst.restore(info.id) == src.restore(infos[-1].id)
    for bad_ids in (None, 5, [None], [b"short"]):
        with pytest.raises(InvalidArgumentTypeError):
            src.read_chunks(bad_ids)


def test_extent_past_its_chunk_is_refused(two):
    src, dst = two
    info = src.checkpoint({"x": b"abc" * 1000}, "s")
    (off, length, cid, coff), = src.layout(info.id, "x")
    bad = BufferManifest("x", 3001, ((0, 3001, cid, 0),))
    with pytest.raises(CorruptionError, match="reaches byte 3001"):
        dst.import_checkpoint("s", [bad], src.read_chunks)
    assert dst.streams() == []


def test_a_head_that_moves_meanwhile_is_a_conflict(two, tmp_path):
    src, dst = two
    infos = _chain(src)
    m = src.manifests(infos[0].id)
    other = snapstore.open(dst.path, durability="none")     # a second writer of dst
    try:
        def racing(asked):
            other.checkpoint({"y": b"y"}, "s")           # commits while the import reads
            return src.read_chunks(asked)
        mark = dst._log.position
        with pytest.raises(CommitConflict):
            dst.import_checkpoint("s", m.buffers, racing, m.meta)
        assert [c.sizes for c in dst.checkpoints("s")] == [{"y": 1}]
        assert dst.verify()["ok"]
        assert dst._log.position == mark       # its chunk records were rolled back
        got = dst.import_checkpoint("s", m.buffers, src.read_chunks, m.meta)
        assert got.parent == dst.checkpoints("s")[0].id
    finally:
        other.close()


def test_arguments_are_checked_before_anything(two):
    src, dst = two
    info = src.checkpoint({"x": b"abc" * 1000}, "s")
    m = src.manifests(info.id)
    good = m.buffers[0]
    (off, length, cid, coff), = good.extents
    bad_args = [
        ((["not a manifest"], src.read_chunks), InvalidArgumentTypeError),
        (([good, good], src.read_chunks), InvalidArgumentError),
        (([BufferManifest("x", 3000, ((0, 2000, cid, 0),))], src.read_chunks),
         InvalidArgumentError),                                         # does not cover
        (([BufferManifest("x", 3000, ((0, 3000, b"short", 0),))], src.read_chunks),
         InvalidArgumentError),
        (([BufferManifest("x", 3000, ((0, 3000, cid, 0),), layout="odd")], src.read_chunks),
         InvalidArgumentError),
        (([BufferManifest("x", 3000, ((0, 3000, cid, 0),), page_size=3)], src.read_chunks),
         InvalidArgumentError),
        (([BufferManifest("", 3000, ((0, 3000, cid, 0),))], src.read_chunks),
         InvalidArgumentError),
        ((m.buffers, "not callable"), InvalidArgumentTypeError),
        (("x", src.read_chunks), InvalidArgumentTypeError),
    ]
    for args, error in bad_args:
        with pytest.raises(error):
            dst.import_checkpoint("s", *args)
    for created in (float("nan"), float("inf"), -1, 10 ** 400, 1e300, 253402300800, True):
        with pytest.raises(InvalidArgumentError, match="created"):
            dst.import_checkpoint("s", m.buffers, src.read_chunks, created=created)
    for tags in ("t", b"t", 5):
        with pytest.raises(InvalidArgumentTypeError):
            dst.import_checkpoint("s", m.buffers, src.read_chunks, tags=tags)
    with pytest.raises(InvalidArgumentTypeError):
        dst.import_checkpoint("s", m.buffers, src.read_chunks, meta=object())
    with pytest.raises(InvalidArgumentTypeError):
        src.read_chunks([b"short"])
    assert dst.streams() == []


def test_read_only_and_closed(two, tmp_path):
    src, dst = two
    info = src.checkpoint({"x": b"abc"}, "s")
    m = src.manifests(info.id)
    reader = snapstore.open(dst.path, readonly=True)
    try:
        with pytest.raises(ReadOnlyError):
            reader.import_checkpoint("s", m.buffers, src.read_chunks, m.meta)
    finally:
        reader.close()
    dst.close()
    with pytest.raises(StoreClosedError):
        dst.import_checkpoint("s", m.buffers, src.read_chunks, m.meta)
    src.close()
    with pytest.raises(StoreClosedError):
        src.manifests(info.id)
    with pytest.raises(StoreClosedError):
        src.read_chunks([])


def test_tags_none_is_no_tags(two):
    """Regression: tags=None raised a raw TypeError from iterating it."""
    src, dst = two
    info = src.checkpoint({"x": b"abc" * 1000}, "s")
    m = src.manifests(info.id)
    assert dst.import_checkpoint("s", m.buffers, src.read_chunks, tags=None).tags == ()


def test_read_chunks_kept_past_with_manifests_is_a_clear_error(two):
    """Regression: it raised lmdb's raw 'closed/deleted/dropped object' error."""
    src, _ = two
    info = src.checkpoint({"x": b"abc" * 1000}, "s")
    kept = []
    src.with_manifests(info.id, lambda m, read_chunks: kept.append((m, read_chunks)))
    m, read_chunks = kept[0]
    cid = m.buffers[0].extents[0][2]
    with pytest.raises(InvalidArgumentError, match="inside use"):
        list(read_chunks([cid]))
