"""The byte-plane chunk codec (snapstore/engine/planes.py, CODEC_PLANES of format 4) and where
the write path uses it: round trips against the hand-written reference decoder in
tests/reference.py (hypothesis), damaged stored bytes (a clear error or the right length,
never another exception), the choice encode_chunk makes (planes, one zstd frame, raw), the
float item size hint (NumPy dtypes, memoryviews, torch storages), and stores of float buffers:
full, delta, nothing changed, everything changed, one byte, empty, odd tails, misaligned
chunk sizes, CDC, deep verify and a damaged plane table through the read path."""
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
import snapstore
from snapstore.engine import chunks as chunk_codec
from snapstore.engine import format as fmt
from snapstore.engine import planes
from snapstore.engine import writer as wr
from snapstore.engine.validation import float_item_size
from snapstore.engine.wal import Record, scan
from snapstore.errors import DamagedRecord
from snapstore.errors import CorruptionError


def floats(n: int, dtype=np.float32, seed: int = 0) -> bytes:
    return (np.random.default_rng(seed).standard_normal(n) * 0.02).astype(dtype).tobytes()


def stored_of(parts: list) -> bytes:
    return b"".join(bytes(p) for p in parts)


# ---- the codec against the reference ------------------------------------------------------
@settings(max_examples=150, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.integers(0, 3000), st.integers(0, 7),
       st.sampled_from(["floats", "random", "zeros", "mixed"]), st.integers(0, 1 << 30))
def test_round_trip_against_the_reference(itemsize, items, tail, kind, seed):
    rng = np.random.default_rng(seed)
    n = items * itemsize + tail % itemsize
    if kind == "floats":
        data = floats(n // 4 + 1, seed=seed)[:n]
    elif kind == "random":
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    elif kind == "zeros":
        data = bytes(n)
    else:
        data = floats(n // 8 + 1, seed=seed)[:n // 2] + bytes(n - n // 2)
    parts = planes.encode(data, itemsize) if n >= itemsize else None
    if parts is None:
        return                                       # nothing compressed: stored raw instead
    stored = stored_of(parts)
    assert planes.decode(stored, n) == data
    assert ref.planes_chunk(stored, n) == data       # the layout docs/design.md writes out
    k, flags = struct.unpack_from("<BB", stored)
    assert (k, flags) == (itemsize, 1)


def test_encode_keeps_only_planes_that_pay():
    data = floats(16384)                             # float32: exponent planes compress
    parts = planes.encode(data, 4)
    stored = stored_of(parts)
    table = [struct.unpack_from("<BI", stored, 2 + 5 * j) for j in range(4)]
    assert [how for how, _ in table].count(1) >= 1   # some zstd planes
    assert [how for how, _ in table].count(0) >= 1   # the mantissa's noise stays raw
    assert all(length == 16384 for how, length in table if how == 0)
    assert len(stored) < len(data) * 0.9
    assert planes.encode(np.random.default_rng(1).integers(0, 256, 65536, np.uint8).tobytes(),
                         4) is None                  # nothing pays: the caller stores raw


# ---- damaged stored bytes -------------------------------------------------------------------
def _good() -> tuple[bytes, bytes]:
    data = floats(4096)
    return data, stored_of(planes.encode(data, 4))


def test_every_truncation_and_extension_is_refused():
    data, stored = _good()
    for cut in range(len(stored)):
        with pytest.raises(ValueError):
            planes.decode(stored[:cut], len(data))
    with pytest.raises(ValueError):
        planes.decode(stored + b"\0", len(data))


@pytest.mark.parametrize("at, value, match", [
    (0, 3, "item size"), (0, 1, "item size"), (0, 16, "item size"), (1, 8, "flags"),
    (1, 0x80, "flags"),
    (2, 7, "unknown way"), (3, 0xFF, "add up")])
def test_damaged_header_or_table(at, value, match):
    data, stored = _good()
    damaged = bytearray(stored)
    damaged[at] = value
    with pytest.raises(ValueError, match=match):
        planes.decode(bytes(damaged), len(data))


def test_wrong_raw_length_and_frames():
    data, stored = _good()
    for raw_len in (len(data) - 4, len(data) + 4, 0):
        with pytest.raises(ValueError):
            planes.decode(stored, raw_len)
    table = [struct.unpack_from("<BI", stored, 2 + 5 * j) for j in range(4)]
    j = next(j for j, (how, _) in enumerate(table) if how == 1)
    start = 2 + 20 + sum(length for _, length in table[:j])
    damaged = bytearray(stored)
    damaged[start:start + 4] = b"XXXX"               # not a zstd frame any more
    with pytest.raises(ValueError, match=f"plane {j}"):
        planes.decode(bytes(damaged), len(data))


def test_flipped_bits_give_an_error_or_the_right_length():
    """Content flips the codec cannot see (the record checksum and the chunk id do): it must
    still never raise anything but ValueError, nor return another length."""
    data, stored = _good()
    rng = np.random.default_rng(3)
    for _ in range(300):
        damaged = bytearray(stored)
        pos = int(rng.integers(0, len(stored)))
        damaged[pos] ^= 1 << int(rng.integers(0, 8))
        try:
            out = planes.decode(bytes(damaged), len(data))
        except ValueError:
            continue
        assert len(out) == len(data)


def test_the_read_path_reports_a_damaged_plane_chunk_as_damage():
    data, stored = _good()
    damaged = bytearray(stored)
    damaged[0] = 5
    payload = fmt.CHUNK_PREFIX.pack(b"\1" * 32, len(data)) + bytes(damaged)
    record = Record(7, 100, fmt.REC_CHUNK, fmt.CODEC_PLANES, len(payload), payload)
    with pytest.raises(DamagedRecord, match="item size") as raised:
        chunk_codec.decode_chunk(chunk_codec.stored_chunk(record))
    assert isinstance(raised.value, CorruptionError)


def _record(codec: int, stored: bytes, raw_len: int) -> Record:
    payload = fmt.CHUNK_PREFIX.pack(b"\1" * 32, raw_len) + stored
    return Record(7, 100, fmt.REC_CHUNK, codec, len(payload), payload)


@pytest.mark.parametrize("codec", ["planes", "zstd", "raw"])
def test_decode_into_place_writes_exactly_the_chunk(codec):
    """A restore decodes whole chunks straight into the destination (decode_chunk(out=)):
    the same bytes as a decode to a new buffer, for every codec, and out is returned."""
    data, stored = _good()
    if codec == "zstd":
        stored = wr._compressor(3).compress(data)
    elif codec == "raw":
        stored = data
    number = {"planes": fmt.CODEC_PLANES, "zstd": fmt.CODEC_ZSTD, "raw": fmt.CODEC_RAW}[codec]
    chunk = chunk_codec.stored_chunk(_record(number, stored, len(data)))
    out = bytearray(b"\xee" * len(data))
    got = chunk_codec.decode_chunk(chunk, memoryview(out))
    assert bytes(out) == data == bytes(chunk_codec.decode_chunk(chunk))
    assert got.obj is out if isinstance(got, memoryview) else got is out


@pytest.mark.parametrize("damage", ["item size", "plane frame", "length"])
def test_decode_into_place_leaves_out_alone_on_damage(damage):
    data, stored = _good()
    damaged = bytearray(stored)
    raw_len = len(data)
    if damage == "item size":
        damaged[0] = 5
    elif damage == "plane frame":
        table = [struct.unpack_from("<BI", stored, 2 + 5 * j) for j in range(4)]
        j = next(j for j, (how, _) in enumerate(table) if how == 1)
        start = 2 + 20 + sum(length for _, length in table[:j])
        damaged[start:start + 4] = b"XXXX"          # the zstd plane is no frame any more
    else:
        raw_len += 4
    chunk = chunk_codec.stored_chunk(_record(fmt.CODEC_PLANES, bytes(damaged), raw_len))
    out = bytearray(b"\xee" * raw_len)
    with pytest.raises(DamagedRecord):
        chunk_codec.decode_chunk(chunk, memoryview(out))
    assert out == b"\xee" * raw_len


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_restores_into_fresh_and_existing_memory_match(tmp_path, dtype):
    """Whole-chunk extents (decoded into place) and pieces of chunks (copied from the cache)
    in one restore: a full checkpoint, then a delta of scattered pages, restored into new
    memory, into an array holding other values, and as bytes."""
    n = (3 << 20) // np.dtype(dtype).itemsize + 5
    a = (np.random.default_rng(1).standard_normal(n) * 0.02).astype(dtype)
    with snapstore.open(str(tmp_path / "s")) as s:
        first = s.checkpoint({"w": a})
        a[::9000] += 1
        second = s.checkpoint({"w": a})
        assert second.kind == "incremental"
        for info, want in ((second, a.tobytes()), (first, None)):
            got = s.restore(info.id)["w"]
            if want is not None:
                assert got == want
            into = np.full_like(a, 7)
            s.restore_into(info.id, {"w": into})
            assert into.tobytes() == got
# ---- the writer's choice ----------------------------------------------------------------------
def test_encode_chunk_chooses_planes_zstd_or_raw():
    opts = wr.WriteOptions()
    cid = b"\0" * 32
    data = floats(16384)
    codec, parts = wr.encode_chunk(cid, data, opts, itemsize=4)
    assert codec == fmt.CODEC_PLANES and sum(len(p) for p in parts) < len(data)
    assert wr.encode_chunk(cid, data, opts)[0] == fmt.CODEC_ZSTD          # no item size
    noise = np.random.default_rng(2).integers(0, 256, 65536, np.uint8).tobytes()
    assert wr.encode_chunk(cid, noise, opts, itemsize=4)[0] == fmt.CODEC_RAW
    assert wr.encode_chunk(cid, bytes(512), opts, itemsize=4)[0] == fmt.CODEC_ZSTD  # small
    assert wr.encode_chunk(cid, data, wr.WriteOptions(compression="none"),
                           itemsize=4)[0] == fmt.CODEC_RAW


def test_float_item_size():
    assert [float_item_size(np.zeros(4, t)) for t in (np.float16, np.float32, np.float64)] \
        == [2, 4, 8]
    for other in (np.zeros(4, np.int32), np.zeros(4, ">f4"), np.zeros(4, np.complex64),
                  np.zeros(2, [("a", "f4")]), b"abcd", bytearray(8), 3, None,
                  memoryview(b"abcd").cast("I")):
        assert float_item_size(other) == 1, other
    assert float_item_size(memoryview(bytes(8)).cast("d")) == 8


def test_chunk_item_size_needs_items_aligned_to_every_chunk():
    view = memoryview(bytes(10000))
    plan = wr.plan_full("b", view, wr.WriteOptions(chunk_size=4096), "", itemsize=4)
    assert wr.chunk_item_size(plan) == 4
    plan.page_size = 4098                      # pages that do not hold whole items
    assert wr.chunk_item_size(plan) == 1
    plan.page_size, plan.layout = 4096, "cdc"  # CDC cuts anywhere
    assert wr.chunk_item_size(plan) == 1
    plan.layout, plan.itemsize = "pages", 1
    assert wr.chunk_item_size(plan) == 1


# ---- stores of float buffers ------------------------------------------------------------------
def codecs_in(path: str) -> set:
    seen = set()
    store_backend = snapstore.open(path, readonly=True)
    try:
        for n in store_backend.backend.list():
            for r in scan(store_backend.backend, n, 0):
                if isinstance(r, Record) and r.rtype == fmt.REC_CHUNK:
                    seen.add(r.codec)
    finally:
        store_backend.close()
    return seen


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_buffers_round_trip(tmp_path, dtype):
    path = str(tmp_path / "s")
    rng = np.random.default_rng(5)
    w = (rng.standard_normal(100_003) * 0.02).astype(dtype)          # an odd tail of pages
    want = {}
    with snapstore.open(path, durability="none") as s:
        def take(stream="w", **buffers):
            info = s.checkpoint(buffers, stream=stream)
            want[info.id] = {k: bytes(memoryview(v).cast("B")) for k, v in buffers.items()}
        take(w=w)                                                     # full
        take(w=w)                                                     # nothing changed
        w[::997] *= 1.01
        take(w=w)                                                     # a delta
        w[:] *= 1.001
        take(w=w)                                                     # everything changed
        w.view(np.uint8)[17] ^= 1
        take(w=w)                                                     # one byte
        take(stream="e", e=np.zeros(0, dtype), one=np.ones(1, dtype))  # empty, one item
        for cid, exp in want.items():
            assert s.restore(cid) == exp
        assert s.verify(deep=True)["ok"]
    assert fmt.CODEC_PLANES in codecs_in(path)
    with snapstore.open(path, readonly=True) as s:
        for cid, exp in want.items():
            assert s.restore(cid) == exp


def test_cdc_stores_float_buffers_without_planes(tmp_path):
    w = (np.random.default_rng(6).standard_normal(50_000) * 0.02).astype(np.float32)
    path = str(tmp_path / "cdc")
    with snapstore.open(path, durability="none", chunking="cdc") as s:
        info = s.checkpoint({"w": w})
        assert s.restore(info.id)["w"] == w.tobytes()
    assert codecs_in(path) == {fmt.CODEC_ZSTD}


def test_torch_tensors_of_every_float_width_use_planes(tmp_path):
    torch = pytest.importorskip("torch")
    import snapstore.torch as st
    path = str(tmp_path / "t")
    t = torch.randn(50_000) * 0.02
    state = {"f32": t, "f16": t.half(), "bf16": t.bfloat16(), "f64": t.double(),
             "i32": torch.arange(50_000, dtype=torch.int32)}
    with snapstore.open(path, durability="none") as s:
        info = st.save(s, state, "t")
        got = st.load(s, info.id)
        for k, v in state.items():
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        assert s.verify(deep=True)["ok"]
    assert fmt.CODEC_PLANES in codecs_in(path)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([np.float16, np.float32, np.float64]), st.integers(0, 40_000),
       st.lists(st.tuples(st.sampled_from(["none", "few", "all", "byte", "resize"]),
                          st.integers(0, 1 << 20)), min_size=1, max_size=6))
def test_float_checkpoint_sequences_against_a_model(dtype, n, steps):
    """A stream of float buffers changed in random ways; every checkpoint restores to the
    bytes it was given (the model: a dict of copies)."""
    import tempfile
    rng = np.random.default_rng(n)
    w = (rng.standard_normal(n) * 0.02).astype(dtype)
    with tempfile.TemporaryDirectory() as d:
        with snapstore.open(os.path.join(d, "s"), durability="none") as s:
            model = {s.checkpoint({"w": w}).id: w.tobytes()}
            for how, seed in steps:
                r = np.random.default_rng(seed)
                if how == "few" and w.size:
                    w[r.integers(0, w.size, 3)] *= dtype(1.5)
                elif how == "all":
                    w = w * dtype(1.001)
                elif how == "byte" and w.size:
                    w.view(np.uint8)[int(r.integers(0, w.nbytes))] ^= 0x10
                elif how == "resize":
                    w = (r.standard_normal(int(r.integers(0, 20_000))) * 0.02).astype(dtype)
                model[s.checkpoint({"w": w}).id] = w.tobytes()
            for cid, want in model.items():
                assert s.restore(cid)["w"] == want


# ---- special values: NaN payloads, infinities, subnormals, signed zeros ---------------------
# Bit patterns per float format (item size, exponent bits, mantissa bits): every class of
# value an IEEE format has, the NaNs with payloads and both signs (a lossless codec must give
# back the exact bits, not an equal float).
_FORMATS = {"float16": (2, 5, 10), "bfloat16": (2, 8, 7), "float32": (4, 8, 23),
            "float64": (8, 11, 52)}


def _specials(name: str) -> list:
    k, e, m = _FORMATS[name]
    sign, inf = 1 << (8 * k - 1), ((1 << e) - 1) << m
    values = [0, inf, inf | 1, inf | (1 << (m - 1)), inf | ((1 << m) - 1),   # 0, inf, NaNs
              1, (1 << m) - 1, 1 << (m - 1),                                  # subnormals
              1 << m, inf - 1,                                                # min/max normal
              ((1 << (e - 1)) - 1) << m]                                      # 1.0
    return values + [v | sign for v in values]                                # and negated


def _weights_bits(name: str, n: int, seed: int) -> np.ndarray:
    """n weights N(0, 0.02) of the format as unsigned integers of its width (bfloat16: the top
    half of a float32)."""
    w = (np.random.default_rng(seed).standard_normal(n) * 0.02)
    if name == "bfloat16":
        return (w.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return w.astype(name).view(f"u{_FORMATS[name][0]}")


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(sorted(_FORMATS)), st.integers(0, 5000), st.integers(0, 7),
       st.floats(0, 1), st.integers(0, 1 << 30))
def test_special_values_round_trip_bit_exact(name, items, tail, share, seed):
    """Weights with NaNs (payloads and signs kept), infinities, subnormals and signed zeros
    mixed in at any share, odd tails: the codec and the reference give back the exact bits."""
    k = _FORMATS[name][0]
    rng = np.random.default_rng(seed)
    bits = _weights_bits(name, items, seed)
    specials = np.array(_specials(name), dtype=bits.dtype)
    mask = rng.random(items) < share
    bits[mask] = specials[rng.integers(0, len(specials), int(mask.sum()))]
    data = bits.tobytes() + rng.integers(0, 256, tail % k, dtype=np.uint8).tobytes()
    parts = planes.encode(data, k) if len(data) >= k else None
    if parts is None:                                # nothing compressed: stored raw instead
        return
    stored = stored_of(parts)
    assert planes.decode(stored, len(data)) == data
    assert ref.planes_chunk(stored, len(data)) == data


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_stores_keep_special_values_and_non_floats_labelled_as_floats(tmp_path, dtype):
    """Through a store (typed arrays, so the planes codec runs): specials mixed into weights,
    a buffer of specials only, and integers and text viewed as floats, in full and delta
    checkpoints, restore bit-exact."""
    name = np.dtype(dtype).name
    bits = _weights_bits(name, 60_001, 9)
    specials = np.array(_specials(name), dtype=bits.dtype)
    bits[::7] = np.resize(specials, bits[::7].size)
    k = np.dtype(dtype).itemsize
    counting = np.arange(40_000 // k * k, dtype=np.uint8).view(dtype)    # integers as floats
    text = np.frombuffer((b"snapstore " * 6000)[:60_000 // k * k], dtype=dtype)
    only = np.resize(specials, 30_000).view(dtype)
    state = {"mixed": bits.view(dtype), "counting": counting, "text": text.copy(),
             "specials": only}
    path = str(tmp_path / "s")
    with snapstore.open(path, durability="none") as s:
        first, before = s.checkpoint(state), bits.tobytes()
        state["mixed"].view(bits.dtype)[1::5] ^= 1                      # a dense change
        state["specials"] = only[::-1].copy()
        second = s.checkpoint(state)
        assert s.restore(first.id)["mixed"] == before
        got = s.restore(second.id)
        for key, value in state.items():
            assert got[key] == value.tobytes(), key
        assert s.verify(deep=True)["ok"]
    assert fmt.CODEC_PLANES in codecs_in(path)


def test_verify_reports_a_plane_chunk_in_a_segment_of_an_older_version(tmp_path):
    """Codec 2 lives only in segments of version 4 (format.SEGMENT_CODECS): verify reports a
    chunk record of it in a version 3 segment (its checksum made valid) as damage."""
    import xxhash
    path = str(tmp_path / "s")
    w = (np.random.default_rng(8).standard_normal(20_000) * 0.02).astype(np.float32)
    with snapstore.open(path, durability="none") as s:
        s.checkpoint({"w": w})
        seg = s.backend.list()[0]
    name = os.path.join(path, fmt.SEGMENTS_DIR, f"{seg:016d}{fmt.SEGMENT_SUFFIX}")
    with open(name, "r+b") as f:
        head = bytearray(f.read(fmt.SEGMENT_HEADER.size))
        struct.pack_into("<I", head, 8, 3)                           # claim version 3
        struct.pack_into("<Q", head, 24, xxhash.xxh3_64_intdigest(bytes(head[:24])))
        f.seek(0)
        f.write(head)
    with snapstore.open(path, readonly=True) as s:
        report = s.verify(deep=True)
        assert not report["ok"]
        assert any("codec" in str(p) for p in report["problems"]), report["problems"][:3]


def test_dcp_items_of_float_tensors_use_planes(tmp_path):
    torch = pytest.importorskip("torch")
    import warnings
    import torch.distributed.checkpoint as dcp
    import snapstore.torch as st
    path = str(tmp_path / "dcp")
    sd = {"w": torch.randn(256, 256) * 0.02, "h": (torch.randn(64, 64) * 0.02).bfloat16(),
          "n": torch.arange(4096)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)      # no process group: one process
        dcp.save(sd, checkpoint_id="a", storage_writer=st.SnapstoreWriter(path))
        back = {k: torch.zeros_like(v) for k, v in sd.items()}
        dcp.load(back, checkpoint_id="a", storage_reader=st.SnapstoreReader(path))
    assert all(torch.equal(back[k], v) for k, v in sd.items())
    assert fmt.CODEC_PLANES in codecs_in(path)


def test_plane_rotations_by_level_and_segment_version():
    """Rotation 3 is tried only from compression_level 3 and only in segments of version 6
    (format 6): S3 stores (version 4 segments) and the default level keep rotation 1."""
    opts = wr.WriteOptions
    assert wr.plane_rotations(opts(), 6) == (fmt.PLANES_ROTATE,)
    assert wr.plane_rotations(opts(compression_level=wr.ROTATIONS_FROM_LEVEL - 1), 6) == (1,)
    assert wr.plane_rotations(opts(compression_level=wr.ROTATIONS_FROM_LEVEL), 6) == (1, 3)
    assert wr.plane_rotations(opts(compression_level=19), 6) == (1, 3)
    for version in (4, 5):
        assert wr.plane_rotations(opts(compression_level=19), version) == (1,)


@pytest.mark.parametrize("dtype, rotation", [(np.float32, 3), (np.float16, 1)])
def test_the_probe_picks_the_rotation_that_codes_smaller(dtype, rotation):
    """planes.probe codes its samples at each rotation and keeps the smallest: float32
    weights N(0, 0.02) rotate by 3, float16 by 1; with one rotation offered it is that one."""
    data = (np.random.default_rng(7).standard_normal(1 << 16) * 0.02).astype(dtype).tobytes()
    k = np.dtype(dtype).itemsize
    samples = [data[i:i + 65536] for i in range(0, len(data), 65536)][:4]
    assert planes.probe(samples, k, (1, 3)).rotation == rotation
    assert planes.probe(samples, k, (1,)).rotation == 1
    assert planes.probe(samples, k, (3,)).rotation == 3
