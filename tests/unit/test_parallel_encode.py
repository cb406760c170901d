"""Chunks of a batch are compressed by two threads (writer.encode_chunks, ChunkSink.put_batch):
the records, their order and what restores must be exactly those of one thread."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine import planes, writer
from snapstore.engine.wal import encode_record_header
from snapstore.engine.zstdframe import decompress_exact

OPTS = writer.WriteOptions()


def payload_and_header(made: writer.Encoded) -> tuple[int, bytes, bytes]:
    """(codec, payload, header) of a record encode_chunks made, whichever way it made it."""
    if made.record is not None:
        record = b"".join(bytes(p) for p in made.record)
        return made.codec, record[fmt.RECORD_HEADER.size:], record[:fmt.RECORD_HEADER.size]
    payload = b"".join(bytes(p) for p in made.parts)
    return made.codec, payload, encode_record_header(fmt.REC_CHUNK, made.codec, [payload])


def encoded_both_ways(items: list, itemsize: int) -> tuple[list, list]:
    """(encode_chunk of each item as (codec, payload, header), encode_chunks of them all on
    two threads)."""
    one = []
    for cid, data in items:
        codec, parts = writer.encode_chunk(cid, data, OPTS, itemsize)
        payload = b"".join(bytes(p) for p in parts)
        one.append((codec, payload, encode_record_header(fmt.REC_CHUNK, codec, [payload])))
    saved = writer.PARALLEL_ENCODE_BYTES
    writer.PARALLEL_ENCODE_BYTES = 0
    try:
        two = [payload_and_header(m) for m in writer.encode_chunks(items, OPTS, itemsize)]
    finally:
        writer.PARALLEL_ENCODE_BYTES = saved
    return one, two


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300),                     # incompressible-ish
                          st.integers(0, 5000).map(lambda n: b"ab" * n)),  # compressible
                min_size=0, max_size=12))
def test_encode_chunks_in_two_threads_equals_one(datas):
    items = [(bytes([i]) * 32, memoryview(d)) for i, d in enumerate(datas)]
    saved = writer.PROBE_CHUNKS
    writer.PROBE_CHUNKS = 1 << 30          # no probe: the probe's choices are tested below
    try:
        one, two = encoded_both_ways(items, 1)
    finally:
        writer.PROBE_CHUNKS = saved
    assert two == one


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 5000),
                          st.integers(0, 2**32 - 1)), min_size=0, max_size=10),
       st.sampled_from([2, 4, 8]))
def test_float_chunks_made_whole_by_the_c_core_equal_one_at_a_time(specs, itemsize):
    """Chunks of floats (whole records from snap_write_chunks, small ones by encode_chunk,
    then all of them probed) hold the same payload and header as encode_chunk's, one chunk at
    a time (whose CODEC_PLANES coding is the same C core's): weights, zeros, noise, odd sizes
    and chunks below planes.MIN_CHUNK_BYTES."""
    items = []
    for i, (kind, n, seed) in enumerate(specs):
        rng = np.random.default_rng(seed)
        if kind == 0:
            data = (rng.standard_normal(n // 4 + 1) * 0.02).astype(np.float32).tobytes()[:n]
        elif kind == 1:
            data = bytes(n)
        else:
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        items.append((bytes([i]) * 32, memoryview(data)))
    one, two = encoded_both_ways(items, itemsize)
    probed = len(items) > writer.PROBE_CHUNKS      # then planes may be skipped: same bytes back
    for (codec, payload, header), (cid, data) in zip(two, items):
        assert fmt.RECORD_HEADER.unpack(header)[4] == len(payload)
        assert payload[:fmt.CHUNK_PREFIX.size] == fmt.CHUNK_PREFIX.pack(cid, len(data))
        stored = payload[fmt.CHUNK_PREFIX.size:]
        got = (stored if codec == fmt.CODEC_RAW else
               bytes(planes.decode(stored, len(data))) if codec == fmt.CODEC_PLANES else
               bytes(decompress_exact(stored, len(data))))
        assert got == bytes(data)
    if not probed:
        assert two == one


@pytest.mark.parametrize("threshold", [0, 1 << 60])
def test_checkpoints_with_parallel_encoding_restore_exactly(tmp_path, monkeypatch, threshold):
    """Nothing changed, everything changed, one byte, duplicate chunks inside one batch,
    compressible and random data: the same stored bytes whichever way they were encoded."""
    monkeypatch.setattr(writer, "PARALLEL_ENCODE_BYTES", threshold)
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, 3 << 20, dtype=np.uint8)
    a[1 << 20:2 << 20] = np.tile(a[:64 << 10], 16)           # chunks repeated in a batch
    z = np.zeros(1 << 20, dtype=np.uint8)                     # compressible
    with snapstore.open(tmp_path / "s") as s:
        ids = [s.checkpoint({"a": a, "z": z}).id]
        ids.append(s.checkpoint({"a": a, "z": z}).id)         # nothing changed
        a ^= 0x5A
        ids.append(s.checkpoint({"a": a, "z": z}).id)         # everything changed
        a[12345] ^= 1
        ids.append(s.checkpoint({"a": a, "z": z}).id)         # one byte
        got = s.restore(ids[-1])
        assert got["a"] == a.tobytes() and got["z"] == z.tobytes()
        assert s.verify(deep=True)["ok"]
    with snapstore.open(tmp_path / "s", readonly=True) as s:
        assert s.restore(ids[-1])["a"] == a.tobytes()


class CountingCompressor:
    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def compress(self, data):
        self.calls += 1
        return self.inner.compress(data)


@pytest.fixture
def counted(monkeypatch):
    """The zstd compressor encode_chunk and the probe use, counting its calls."""
    box = {}
    real = writer._compressor

    def compressor(level):
        if "c" not in box:
            box["c"] = CountingCompressor(real(level))
        return box["c"]
    monkeypatch.setattr(writer, "_compressor", compressor)
    monkeypatch.setattr(writer, "PARALLEL_ENCODE_BYTES", 1 << 60)   # one thread: one counter
    return box


def test_an_incompressible_batch_is_stored_raw_without_trying(counted):
    rng = np.random.default_rng(5)
    items = [(bytes([i]) * 32, memoryview(rng.integers(0, 256, 65536, np.uint8).tobytes()))
             for i in range(16)]
    made = writer.encode_chunks(items, OPTS)
    assert [m.codec for m in made] == [fmt.CODEC_RAW] * 16
    assert counted["c"].calls == writer.PROBE_CHUNKS               # the samples only
    for (cid, data), m in zip(items, made):
        codec, payload, header = payload_and_header(m)
        assert payload == fmt.CHUNK_PREFIX.pack(cid, len(data)) + bytes(data)
        assert header == encode_record_header(fmt.REC_CHUNK, fmt.CODEC_RAW, [payload])
        assert m.record[-1] is data          # the bytes themselves: written, never copied


@pytest.mark.parametrize("data", [b"", b"\x07", bytes(65536)], ids=["empty", "one byte", "zeros"])
def test_compression_none_makes_raw_records_of_any_bytes(data):
    items = [(bytes([i]) * 32, memoryview(data)) for i in range(3)]
    made = writer.encode_chunks(items, writer.WriteOptions(compression="none"))
    assert [payload_and_header(m) for m in made] == [
        (fmt.CODEC_RAW, fmt.CHUNK_PREFIX.pack(cid, len(data)) + data,
         encode_record_header(fmt.REC_CHUNK, fmt.CODEC_RAW,
                              [fmt.CHUNK_PREFIX.pack(cid, len(data)) + data]))
        for cid, _ in items]


def test_a_batch_whose_samples_compress_is_compressed_chunk_by_chunk(counted):
    """One compressible sample is enough: every chunk is tried, and each keeps its own
    verdict (the random ones stay raw)."""
    rng = np.random.default_rng(6)
    datas = [bytes(65536) if i == 0 else rng.integers(0, 256, 65536, np.uint8).tobytes()
             for i in range(16)]
    made = writer.encode_chunks([(bytes([i]) * 32, memoryview(d))
                                 for i, d in enumerate(datas)], OPTS)
    assert [m.codec for m in made] == [fmt.CODEC_ZSTD] + [fmt.CODEC_RAW] * 15
    assert counted["c"].calls == 1 + 16          # the probe stops at its first saving sample


def test_samples_too_small_to_try_say_nothing(counted):
    items = [(bytes([i]) * 32, memoryview(b"" if i % 2 == 0 else b"ab" * 100))
             for i in range(8)]
    assert [m.codec for m in writer.encode_chunks(items, OPTS)[1::2]] == [fmt.CODEC_ZSTD] * 4


def test_a_few_chunks_are_tried_without_a_probe(counted):
    items = [(bytes([i]) * 32, memoryview(bytes(1000))) for i in range(writer.PROBE_CHUNKS)]
    assert [m.codec for m in writer.encode_chunks(items, OPTS)] == \
        [fmt.CODEC_ZSTD] * writer.PROBE_CHUNKS
    assert counted["c"].calls == writer.PROBE_CHUNKS


def test_float_chunks_are_tried_when_no_sample_could_be_probed():
    """Samples too small for planes (below planes.MIN_CHUNK_BYTES) say nothing: every plane of
    the large chunks is tried rather than none."""
    big = (np.random.default_rng(8).standard_normal(16384) * 0.02).astype(np.float32).tobytes()
    items = [(bytes([i]) * 32, memoryview(bytes(500) if i % 2 == 0 else big)) for i in range(8)]
    assert len(items) // writer.PROBE_CHUNKS == 2            # the samples: chunks 0, 2, 4, 6
    made = writer.encode_chunks(items, OPTS, itemsize=4)
    assert [m.codec for m in made[1::2]] == [fmt.CODEC_PLANES] * 4
