"""Savepoint files (snapstore.export_savepoint / import_savepoint, engine/savefile.py): one
checkpoint in one portable file, round trips byte-exact into any store writing only missing
chunks; damaged files (truncated anywhere, any bit flipped, wrong magic, a newer version, a
chunk whose BLAKE3 does not match) are refused naming the file and offset, importing
nothing."""
from __future__ import annotations

import json
import os
import struct

import blake3
import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine.wal import encode_record_header
from snapstore.errors import (CheckpointNotFound, CorruptionError, ExportError, FormatError,
                              InvalidArgumentError, ReadOnlyError, StoreClosedError)

ORIGIN = "snapstore.copied_from"


def _open(path, **kw):
    return snapstore.open(str(path), durability="none", **kw)


def _segment_bytes(store) -> int:
    return sum(store.backend.size(n) for n in store.backend.list())


def _chain(store, steps=3, size=300_000, seed=1):
    rng = np.random.default_rng(seed)
    x = bytearray(rng.bytes(size // 2) + bytes(size - size // 2))
    infos = []
    for step in range(steps):
        if step:
            x[step * 9000:step * 9000 + 16] = rng.bytes(16)
        infos.append(store.checkpoint({"x": x, "empty": b"", "one": b"\x07"}, "train",
                                      meta={"step": step}))
    store.tag(infos[-1].id, "best")
    return infos


@pytest.fixture
def src(tmp_path):
    s = _open(tmp_path / "src")
    yield s
    s.close()


def test_round_trip_into_another_store_and_the_same(tmp_path, src):
    infos = _chain(src)
    tip = src.get(infos[-1].id)
    assert tip.kind == "incremental"
    path = str(tmp_path / "best.snap")
    result = snapstore.export_savepoint(src, "best", path)
    assert result.checkpoint == tip.id and result.bytes == os.path.getsize(path)
    assert result.chunks == len(src.manifests(tip.id).chunk_ids())
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".part")]
    with _open(tmp_path / "dst") as dst:
        info = snapstore.import_savepoint(dst, path)
        assert dst.restore(info.id) == src.restore(tip.id)
        assert (info.stream, info.created, info.meta, info.tags, info.sizes, info.kind) == \
            (tip.stream, tip.created, tip.meta, tip.tags, tip.sizes, "full")
        assert info.reserved_meta[ORIGIN] == {"store": os.path.abspath(src.path),
                                              "id": tip.id, "file": path}
        size = _segment_bytes(dst)
        again = snapstore.import_savepoint(dst, path, stream="restored")   # twice: two
        assert again.stream == "restored" and again.seq == 1 and again.id != info.id
        assert _segment_bytes(dst) - size < 4096       # every chunk was there already
        assert dst.restore(again.id) == src.restore(tip.id)
        assert dst.verify(deep=True)["ok"]
    back = snapstore.import_savepoint(src, path)       # into the store it came from
    assert back.parent == tip.id and src.restore(back.id) == src.restore(tip.id)


def test_meta_of_any_kind_and_objects(tmp_path, src):
    plain = src.checkpoint({"a": b"abc"}, "p", meta=None)
    listed = src.checkpoint({"a": b"abc"}, "p", meta=[1, {"x": 2}])
    saved = src.save({"w": np.arange(5000.0), "step": 4}, "objects", meta={"run": 1})
    with _open(tmp_path / "dst") as dst:
        for info in (plain, listed, saved):
            path = str(tmp_path / f"{info.id}.snap")
            snapstore.export(src, info.id, path)            # by suffix: a savepoint
            got = snapstore.import_savepoint(dst, path)
            assert got.meta == info.meta
        loaded = dst.load("objects")
        assert loaded["step"] == 4 and np.array_equal(loaded["w"], np.arange(5000.0))
    # a copy's provenance is not carried into the file: the file names its own source
    with _open(tmp_path / "third") as third:
        snapstore.copy_checkpoints(src, third, [plain.id])
        path = str(tmp_path / "copy.snap")
        snapstore.export_savepoint(third, "p", path)
        got = snapstore.import_savepoint(src, path)
        assert got.reserved_meta[ORIGIN]["store"] == os.path.abspath(third.path)
        assert got.meta is None


def test_existing_file_force_and_arguments(tmp_path, src):
    _chain(src, steps=1)
    path = tmp_path / "x.snap"
    path.write_bytes(b"old")
    with pytest.raises(ExportError, match="exists"):
        snapstore.export_savepoint(src, "train", str(path))
    assert path.read_bytes() == b"old"
    snapstore.export_savepoint(src, "train", path, force=True)
    assert path.read_bytes()[:8] == fmt.SAVEPOINT_MAGIC
    fifo = tmp_path / "f.snap"
    os.mkfifo(fifo)         # said "exists (pass force=True ...)", which force then refused
    with pytest.raises(ExportError, match="is a FIFO: an export writes a regular file"):
        snapstore.export_savepoint(src, "train", str(fifo))
    with pytest.raises(InvalidArgumentError, match="not a regular file"):
        snapstore.export_savepoint(src, "train", str(fifo), force=True)
    with pytest.raises(CheckpointNotFound):
        snapstore.export_savepoint(src, "nope", str(tmp_path / "y.snap"))
    assert not (tmp_path / "y.snap").exists()
    with _open(tmp_path / "dst") as dst:
        with pytest.raises(InvalidArgumentError, match="no savepoint file"):
            snapstore.import_savepoint(dst, str(tmp_path / "missing.snap"))
        with pytest.raises(FormatError, match="not a regular file"):
            snapstore.import_savepoint(dst, str(tmp_path))
        with pytest.raises(InvalidArgumentError):
            snapstore.import_savepoint(dst, str(path), stream="")
    reader = snapstore.open(src.path, readonly=True)
    try:
        snapstore.export_savepoint(reader, "train", str(tmp_path / "r.snap"))  # fine
        with pytest.raises(ReadOnlyError):
            snapstore.import_savepoint(reader, str(path))
    finally:
        reader.close()
    src.close()
    with pytest.raises(StoreClosedError):
        snapstore.export_savepoint(src, "train", str(tmp_path / "z.snap"))
    with pytest.raises(StoreClosedError):
        snapstore.import_savepoint(src, str(path))


# ---- damaged files ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def base(tmp_path_factory) -> tuple[str, bytes]:
    """A savepoint of a 3-checkpoint chain (raw chunks, so a test can edit one), made once:
    (a directory for the damaged copies, its bytes)."""
    d = str(tmp_path_factory.mktemp("savepoints"))
    with _open(os.path.join(d, "src"), compression="none") as s:
        _chain(s, size=200_000)
        path = os.path.join(d, "base.snap")
        snapstore.export_savepoint(s, "best", path)
    with open(path, "rb") as f:
        return d, f.read()


@pytest.fixture(scope="module")
def dst(base):
    s = _open(os.path.join(base[0], "dst"))
    yield s
    s.close()


def _refused(dst, base, data: bytes):
    """Imports data as a file: asserts it is refused with CorruptionError or FormatError naming
    the file, and that nothing was written; returns the error."""
    path = os.path.join(base[0], "damaged.snap")
    with open(path, "wb") as f:
        f.write(data)
    before, ids = _segment_bytes(dst), dst.checkpoints()
    with pytest.raises((CorruptionError, FormatError)) as info:
        snapstore.import_savepoint(dst, path)
    assert path in str(info.value)
    assert dst.checkpoints() == ids and _segment_bytes(dst) == before
    return info.value


def test_the_undamaged_base_imports(base):
    d, data = base
    path = os.path.join(d, "good.snap")
    with open(path, "wb") as f:
        f.write(data)
    with _open(os.path.join(d, "other")) as other:
        info = snapstore.import_savepoint(other, path)
        assert other.restore(info.id)["one"] == b"\x07"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(hs.data())
def test_truncated_anywhere_is_refused(dst, base, data):
    cut = data.draw(hs.integers(0, len(base[1]) - 1))
    err = _refused(dst, base, base[1][:cut])
    assert isinstance(err, FormatError) == (cut == 0)


@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(hs.data())
def test_any_flipped_bit_is_refused_naming_where(dst, base, data):
    at = data.draw(hs.integers(0, len(base[1]) - 1))
    bit = data.draw(hs.integers(0, 7))
    damaged = bytearray(base[1])
    damaged[at] ^= 1 << bit
    err = _refused(dst, base, bytes(damaged))
    if at >= len(fmt.SAVEPOINT_MAGIC):       # in the magic: not a savepoint (FormatError)
        assert isinstance(err, CorruptionError) and err.offset is not None
        assert err.offset <= at


def _records_start(data: bytes) -> int:
    _, _, _, js_len, mf_len, _, _ = fmt.SAVEPOINT_HEADER.unpack_from(data)
    return fmt.SAVEPOINT_HEADER.size + js_len + mf_len


def _with_trailer_checksum(data: bytearray) -> bytes:
    end = len(data) - fmt.SAVEPOINT_TRAILER.size
    data[-8:] = fmt.U64.pack(xxhash.xxh3_64_intdigest(bytes(data[:end + 24])))
    return bytes(data)


def test_wrong_magic_newer_version_and_other_files(dst, base):
    data = base[1]
    err = _refused(dst, base, b"XNAPSAVE" + data[8:])
    assert isinstance(err, FormatError) and "not a snapstore savepoint" in str(err)
    err = _refused(dst, base, json.dumps({"not": "a savepoint"}).encode())
    assert isinstance(err, FormatError)
    head = bytearray(data[:fmt.SAVEPOINT_HEADER.size])
    struct.pack_into("<I", head, 8, fmt.SAVEPOINT_VERSION + 1)
    head[40:48] = fmt.U64.pack(xxhash.xxh3_64_intdigest(bytes(head[:40])))
    err = _refused(dst, base, bytes(head) + data[len(head):])
    assert isinstance(err, FormatError) and "newer" in str(err)
    err = _refused(dst, base, data + b"\0")                  # one byte too many
    assert isinstance(err, CorruptionError) and "trailer" in str(err)


def test_a_chunk_that_is_not_its_blake3_is_refused(dst, base):
    data = bytearray(base[1])
    at = _records_start(data)
    rtype, codec, length = struct.unpack_from("<4sBBHI", data, at)[1], data[at + 5], \
        struct.unpack_from("<I", data, at + 8)[0]
    assert rtype == fmt.REC_CHUNK and codec == fmt.CODEC_RAW
    payload = bytearray(data[at + 24:at + 24 + length])
    payload[-1] ^= 0xFF                                      # other bytes, same chunk id
    assert blake3.blake3(payload[36:]).digest() != bytes(payload[:32])
    data[at:at + 24] = encode_record_header(fmt.REC_CHUNK, codec, [bytes(payload)])
    data[at + 24:at + 24 + length] = payload
    err = _refused(dst, base, _with_trailer_checksum(data))    # only BLAKE3 can tell
    assert isinstance(err, CorruptionError) and "BLAKE3" in str(err) and err.offset == at


def _description(data: bytes) -> bytes:
    _, _, _, js_len, _, _, _ = fmt.SAVEPOINT_HEADER.unpack_from(data)
    return data[fmt.SAVEPOINT_HEADER.size:fmt.SAVEPOINT_HEADER.size + js_len]


def _with_description(data: bytes, edit) -> tuple[bytes, int]:
    """data with its description's JSON changed by edit(dict) and every checksum made to
    match (the work of a crafted file, not of damage); and where its manifests begin."""
    desc = json.loads(_description(data))
    edit(desc)
    return _with_json(data, json.dumps(desc, separators=(",", ":")).encode())


def _with_json(data: bytes, js: bytes) -> tuple[bytes, int]:
    """data with js as its description's JSON, every checksum and offset made to match; and
    where its manifests begin."""
    _, _, _, js_len, mf_len, _, _ = fmt.SAVEPOINT_HEADER.unpack_from(data)
    start = fmt.SAVEPOINT_HEADER.size
    manifests = bytes(data[start + js_len:start + js_len + mf_len])
    head = bytearray(fmt.SAVEPOINT_HEADER.pack(
        fmt.SAVEPOINT_MAGIC, fmt.SAVEPOINT_VERSION, 0, len(js), mf_len,
        xxhash.xxh3_64_intdigest(js + manifests), 0))
    head[40:48] = fmt.U64.pack(xxhash.xxh3_64_intdigest(bytes(head[:40])))
    rest = bytes(data[start + js_len + mf_len:])
    new = bytearray(bytes(head) + js + manifests + rest)
    end = len(new) - fmt.SAVEPOINT_TRAILER.size
    struct.pack_into("<Q", new, end + 16, end)
    return _with_trailer_checksum(new), start + len(js)


def test_a_manifest_that_does_not_cover_its_buffer_is_refused(dst, base):
    def grow(desc):
        desc["buffers"][0]["size"] += 1                      # checksummed, but a hole
    data, manifests_at = _with_description(base[1], grow)
    err = _refused(dst, base, data)
    assert isinstance(err, CorruptionError) and "covers only" in str(err)
    assert err.offset == manifests_at


@pytest.mark.parametrize("created", [10 ** 400, 1e300, 253402300800, -1, True, "1", None])
def test_a_creation_time_no_date_can_show_is_refused(dst, base, created):
    """A crafted file's creation time past the year 9999 (or not a number) would make every
    listing of the store fail (`ls` formats it) and retention treat it as the newest."""
    def edit(desc):
        desc["created"] = created
    err = _refused(dst, base, _with_description(base[1], edit)[0])
    assert isinstance(err, CorruptionError) and "created" in str(err)
    assert err.offset == fmt.SAVEPOINT_HEADER.size


def test_the_last_second_of_9999_is_a_creation_time(base, tmp_path):
    def edit(desc):
        desc["created"] = 253402300799
    path = tmp_path / "late.snap"
    path.write_bytes(_with_description(base[1], edit)[0])
    with _open(tmp_path / "s") as s:
        info = snapstore.import_savepoint(s, str(path))
        assert s.get(info.id).created == 253402300799.0


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_the_description_are_refused(dst, base, constant):
    """Python's json reads them, a writer never writes them (allow_nan=False): a file
    holding one is refused as damaged, naming the file, not as a bad meta argument."""
    def edit(desc):
        desc["meta"] = {"x": 1.5}
    marked = _with_description(base[1], edit)[0]
    js = _description(marked).replace(b'{"x":1.5}', b'{"x":' + constant.encode() + b'}')
    assert constant.encode() in js
    err = _refused(dst, base, _with_json(marked, js)[0])
    assert isinstance(err, CorruptionError) and constant in str(err)
    assert err.offset == fmt.SAVEPOINT_HEADER.size
