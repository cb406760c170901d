"""snap_write_chunks (csrc/chunkwrite.c through snapstore._native.write_chunks): whole chunk
records of float chunks, made in one call. Every record is one the read paths accept (C and
Python), holds the header the log would have made, and codes its chunk by the rules of
engine/planes.py; bad arguments are clear exceptions with nothing written. The comparison
against a pure-Python reference on generated chunks is in
tests/property/test_write_chunks_property.py."""
import os

import numpy as np
import pytest

from snapstore import _native as nat
from snapstore import errors
from snapstore._ffi import ffi
from snapstore.engine import format as fmt
from snapstore.engine import planes, wal

import blake3

ALL = 0xFF


def weights(n, seed=0, dtype=np.float32):
    return (np.random.default_rng(seed).standard_normal(n) * 0.02).astype(dtype).tobytes()


def chunks_of(*datas):
    return [(d, blake3.blake3(d).digest()) for d in datas]


def read_back(records, results, chunks):
    """The chunks' bytes as snap_read_chunks decodes the records, and as the Python path does."""
    total = sum(len(d) for d, _ in chunks)
    out = bytearray(total)
    reads, at = [], 0
    for (off, stored_len, _, _), (data, cid) in zip(results, chunks):
        reads.append((off, at, stored_len, len(data), cid))
        at += len(data)
    assert nat.read_chunks(records, out, reads) == (len(chunks), 0)
    python = []
    for (off, stored_len, codec, _), (data, cid) in zip(results, chunks):
        rtype, rcodec, length, checksum = wal.parse_record_header(records[off:])
        assert (rtype, rcodec, length) == (fmt.REC_CHUNK, codec, stored_len)
        payload = bytes(records[off + fmt.RECORD_HEADER.size:
                                off + fmt.RECORD_HEADER.size + stored_len])
        assert bytes(records[off:off + fmt.RECORD_HEADER.size]) == \
            wal.encode_record_header(fmt.REC_CHUNK, codec, [payload])
        assert fmt.CHUNK_PREFIX.unpack_from(payload) == (cid, len(data))
        stored = payload[fmt.CHUNK_PREFIX.size:]
        python.append(stored if codec == fmt.CODEC_RAW else bytes(planes.decode(stored,
                                                                                 len(data))))
    assert b"".join(python) == out
    return bytes(out)


def test_layout_matches_the_wrapper():
    assert ffi.sizeof("snap_chunk_write") == nat._CHUNK_WRITE.size == 104
    for field, at in (("src", 0), ("base", 8), ("out_off", 16), ("raw_len", 24),
                      ("stored_len", 28), ("chunk_id", 32), ("base_id", 64), ("codec", 96),
                      ("packed", 97), ("depth", 98)):
        assert ffi.offsetof("snap_chunk_write", field) == at
    assert nat.RECORD_WRITE_SLACK == (fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size
                                      + fmt.DELTA_HEADER.size + fmt.PLANES_HEADER.size
                                      + 8 * fmt.PLANE_ENTRY.size)


@pytest.mark.parametrize("itemsize, dtype", [(2, np.float16), (4, np.float32), (8, np.float64)])
def test_weights_are_planes_and_read_back(itemsize, dtype):
    chunks = chunks_of(weights(8192, 1, dtype), weights(8192, 2, dtype))
    records, results = nat.write_chunks(chunks, itemsize, ALL >> (8 - itemsize))
    assert [codec for _, _, codec, _ in results] == [fmt.CODEC_PLANES] * 2
    assert all(packed for *_, packed in results)
    assert len(records) < sum(len(d) for d, _ in chunks)
    assert read_back(records, results, chunks) == b"".join(d for d, _ in chunks)


def test_records_lie_back_to_back_in_order():
    chunks = chunks_of(weights(4096, 1), bytes(5000), os.urandom(3000), weights(300, 2))
    records, results = nat.write_chunks(chunks, 4, 0xF)
    at = 0
    for off, stored_len, _, _ in results:
        assert off == at
        at += fmt.RECORD_HEADER.size + stored_len
    assert at == len(records)
    read_back(records, results, chunks)


def test_noise_is_raw_zeros_pack_every_plane():
    chunks = chunks_of(os.urandom(65536), bytes(65536))
    records, results = nat.write_chunks(chunks, 4, 0xF)
    (_, _, c0, p0), (_, _, c1, p1) = results
    assert (c0, p0) == (fmt.CODEC_RAW, 0)
    assert (c1, p1) == (fmt.CODEC_PLANES, 0xF)
    read_back(records, results, chunks)


def test_no_plane_tried_is_raw_and_a_mask_limits_the_tries():
    chunks = chunks_of(weights(16384))
    records, results = nat.write_chunks(chunks, 4, 0)
    assert results[0][2:] == (fmt.CODEC_RAW, 0)
    read_back(records, results, chunks)
    _, results = nat.write_chunks(chunks, 4, 0b1000)        # only the exponents' plane
    assert results[0][2:] == (fmt.CODEC_PLANES, 0b1000)


@pytest.mark.parametrize("data", [b"", b"\x07", b"\x00" * 3, bytes(1027)],
                         ids=["empty", "one byte", "less than an item", "items and a tail"])
def test_boring_sizes(data):
    chunks = chunks_of(data)
    records, results = nat.write_chunks(chunks, 4, 0xF)
    assert read_back(records, results, chunks) == data


def test_nothing_to_write():
    records, results = nat.write_chunks([], 4, 0xF)
    assert (len(records), results) == (0, [])


def test_the_same_call_twice_gives_the_same_bytes_and_a_given_out_is_used():
    chunks = chunks_of(weights(8192), bytes(4096))
    first, results = nat.write_chunks(chunks, 4, 0xF)
    out = bytearray(len(first) + 2 * nat.RECORD_WRITE_SLACK + 8192 * 4 + 4096)
    second, again = nat.write_chunks(chunks, 4, 0xF, out=out, scratch=bytearray(1 << 16))
    assert bytes(first) == bytes(second) and results == again
    assert second.obj is out or bytes(out[:len(second)]) == bytes(second)


def test_after_fork_in_a_child():
    chunks = chunks_of(weights(4096))
    expected = bytes(nat.write_chunks(chunks, 4, 0xF)[0])
    pid = os.fork()
    if pid == 0:
        ok = bytes(nat.write_chunks(chunks, 4, 0xF)[0]) == expected
        os._exit(0 if ok else 1)
    assert os.waitpid(pid, 0)[1] == 0


@pytest.mark.parametrize("itemsize, mask", [(1, 0), (3, 0), (16, 0), (2, 0b100), (4, 0x10)],
                         ids=["itemsize 1", "itemsize 3", "itemsize 16", "plane 2 of 2",
                              "plane 4 of 4"])
def test_bad_item_size_or_mask(itemsize, mask):
    with pytest.raises(errors.InvalidArgumentError):
        nat.write_chunks(chunks_of(b"x" * 64), itemsize, mask)


def test_bad_chunk_ids_and_types():
    with pytest.raises(errors.InvalidArgumentError):
        nat.write_chunks([(b"x" * 64, b"short")], 4, 0xF)
    with pytest.raises(errors.InvalidArgumentError):
        nat.write_chunks([(b"x" * 64, "x" * 32)], 4, 0xF)
    with pytest.raises(errors.InvalidArgumentTypeError):
        nat.write_chunks([(12345, bytes(32))], 4, 0xF)
    with pytest.raises(errors.InvalidArgumentTypeError):
        nat.write_chunks(chunks_of(b"x" * 64), 4, 0xF, out=bytes(1000))


def test_out_or_scratch_too_small_writes_nothing():
    chunks = chunks_of(weights(1024))
    out = bytearray(4096)                       # the chunk is 4096 bytes: no room for slack
    with pytest.raises(errors.NativeSpaceError):
        nat.write_chunks(chunks, 4, 0xF, out=out)
    assert out == bytearray(4096)
    with pytest.raises(errors.InvalidArgumentError):
        nat.write_chunks(chunks, 4, 0xF, scratch=bytearray(100))


def test_overlapping_buffers_are_invalid_arguments():
    area = bytearray(1 << 20)
    view = memoryview(area)
    chunk = view[:4096]
    with pytest.raises(errors.InvalidArgumentError):           # out over the chunk
        nat.write_chunks([(chunk, bytes(32))], 4, 0xF, out=view[2048:])
    with pytest.raises(errors.InvalidArgumentError):           # scratch over the chunk
        nat.write_chunks([(chunk, bytes(32))], 4, 0xF, scratch=view[:8192])
    with pytest.raises(errors.InvalidArgumentError):           # scratch over out
        nat.write_chunks([(chunk, bytes(32))], 4, 0xF, out=view[8192:], scratch=view[16384:])


# ---- snap_raw_record_heads: the heads of raw records whose bytes are written where they lie

def whole_raw_records(heads, results, chunks) -> bytes:
    """The records as the log writes them: each head, then the chunk's own bytes."""
    return b"".join(bytes(heads[off:off + nat.RAW_RECORD_HEAD]) + bytes(data)
                    for (off, _, _, _), (data, _) in zip(results, chunks))


@pytest.mark.parametrize("datas", [[b""], [b"\x07"], [os.urandom(65536), bytes(65536), b"ab"]],
                         ids=["empty", "one byte", "noise, zeros and a tail"])
def test_raw_heads_make_records_the_readers_accept(datas):
    chunks = chunks_of(*datas)
    heads, results = nat.raw_record_heads(chunks)
    assert nat.RAW_RECORD_HEAD == fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size
    assert len(heads) == nat.RAW_RECORD_HEAD * len(chunks)
    records = whole_raw_records(heads, results, chunks)
    at, laid = 0, []
    for (_, stored_len, codec, packed), (data, _) in zip(results, chunks):
        assert (stored_len, codec, packed) == (fmt.CHUNK_PREFIX.size + len(data),
                                               fmt.CODEC_RAW, 0)
        laid.append((at, stored_len, codec, 0))
        at += fmt.RECORD_HEADER.size + stored_len
    assert read_back(records, laid, chunks) == b"".join(datas)


def test_raw_heads_of_nothing_twice_and_into_a_given_out():
    heads, results = nat.raw_record_heads([])
    assert len(heads) == 0 and results == []
    chunks = chunks_of(os.urandom(5000), b"")
    first, results = nat.raw_record_heads(chunks)
    out = bytearray(2 * nat.RAW_RECORD_HEAD + 10)
    second, again = nat.raw_record_heads(chunks, out=out)
    assert bytes(first) == bytes(second) == bytes(out[:2 * nat.RAW_RECORD_HEAD])
    assert results == again


def test_raw_heads_after_fork_in_a_child():
    chunks = chunks_of(os.urandom(4096))
    expected = bytes(nat.raw_record_heads(chunks)[0])
    pid = os.fork()
    if pid == 0:
        os._exit(0 if bytes(nat.raw_record_heads(chunks)[0]) == expected else 1)
    assert os.waitpid(pid, 0)[1] == 0


def test_raw_heads_bad_arguments_write_nothing():
    chunks = chunks_of(b"x" * 64)
    out = bytearray(nat.RAW_RECORD_HEAD - 1)
    with pytest.raises(errors.NativeSpaceError):
        nat.raw_record_heads(chunks, out=out)
    assert out == bytearray(len(out))
    with pytest.raises(errors.InvalidArgumentError):
        nat.raw_record_heads([(b"x" * 64, b"short")])
    with pytest.raises(errors.InvalidArgumentTypeError):
        nat.raw_record_heads([(12345, bytes(32))])
    with pytest.raises(errors.InvalidArgumentTypeError):
        nat.raw_record_heads(chunks, out=bytes(1000))
    area = memoryview(bytearray(4096))
    with pytest.raises(errors.InvalidArgumentError):           # out over the chunk
        nat.raw_record_heads([(area[:1024], bytes(32))], out=area[512:])
