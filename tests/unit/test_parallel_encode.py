"""Chunks of a batch are compressed by two threads (writer.encode_chunks, ChunkSink.put_batch):
the records, their order and what restores must be exactly those of one thread."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import snapstore
from snapstore.engine import writer

OPTS = writer.WriteOptions()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=300),                     # incompressible-ish
                          st.integers(0, 5000).map(lambda n: b"ab" * n)),  # compressible
                min_size=0, max_size=12))
def test_encode_chunks_in_two_threads_equals_one(datas):
    items = [(bytes([i]) * 32, memoryview(d)) for i, d in enumerate(datas)]
    one = [writer.encode_chunk(cid, data, OPTS) for cid, data in items]
    saved = writer.PARALLEL_ENCODE_BYTES
    writer.PARALLEL_ENCODE_BYTES = 0
    try:
        two = writer.encode_chunks(items, OPTS)
    finally:
        writer.PARALLEL_ENCODE_BYTES = saved
    assert [(c, [bytes(p) for p in parts]) for c, parts in two] == \
           [(c, [bytes(p) for p in parts]) for c, parts in one]


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
