"""Property tests: the C chunk-record writer (snap_write_chunks, through _native.write_chunks)
against a pure-Python reference of the record layout and the byte-plane coding rules, on
generated chunks: float weights of 2, 4 and 8 bytes with NaN/inf/denormal/-0.0 items, repeats,
noise labelled as floats, odd lengths, the empty and one-byte chunk, any mask of planes to try.

For every record: the header is the one the reference makes (magic, chunk type, codec, zero
flags and reserved field, payload length, XXH3-64 over the first 16 header bytes and the
payload); the prefix holds the chunk id and raw length; a raw record holds the bytes; a planes
record holds the reference's rotated planes, each raw and equal or one zstd frame (a plane
tried, shorter than n - n/32) that decodes to it, then the tail, and saves at least 1/32 of
the chunk; the C and Python readers give the bytes back. SNAPSTORE_HYPOTHESIS_PROFILE=slow
runs 10x more.
"""
import blake3
import xxhash
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from snapstore import _native as nat
from snapstore.engine import format as fmt

import reference as ref
from chunkrecords import chunk_data, python_read


def examples(n: int) -> int:
    return max(1, n * settings.default.max_examples // 100)


def check_record(record: bytes, data: bytes, cid: bytes, k: int, mask: int,
                 result: tuple) -> None:
    _, stored_len, codec, packed = result
    head, payload = record[:fmt.RECORD_HEADER.size], record[fmt.RECORD_HEADER.size:]
    assert len(payload) == stored_len
    prefix16 = fmt.RECORD_HEADER.pack(fmt.RECORD_MAGIC, fmt.REC_CHUNK, codec, 0, stored_len, 0,
                                      0)[:fmt.RECORD_CHECKSUMMED_PREFIX]
    assert head == fmt.RECORD_HEADER.pack(fmt.RECORD_MAGIC, fmt.REC_CHUNK, codec, 0, stored_len,
                                          0, xxhash.xxh3_64_intdigest(prefix16 + payload))
    assert payload[:fmt.CHUNK_PREFIX.size] == fmt.CHUNK_PREFIX.pack(cid, len(data))
    stored = payload[fmt.CHUNK_PREFIX.size:]
    if codec == fmt.CODEC_RAW:
        assert stored == data and packed == 0
        return
    assert codec == fmt.CODEC_PLANES and packed and packed & ~mask == 0
    assert len(stored) < len(data) - len(data) // 32
    assert fmt.PLANES_HEADER.unpack_from(stored) == (k, fmt.PLANES_ROTATE)
    n = len(data) // k
    laid_out = ref.split_planes(data, k, rotate=True)
    planes, tail = [laid_out[j * n:(j + 1) * n] for j in range(k)], laid_out[k * n:]
    at = fmt.PLANES_HEADER.size + k * fmt.PLANE_ENTRY.size
    for j in range(k):
        how, length = fmt.PLANE_ENTRY.unpack_from(stored, fmt.PLANES_HEADER.size
                                                  + j * fmt.PLANE_ENTRY.size)
        piece = stored[at:at + length]
        at += length
        if how == fmt.PLANE_RAW:
            assert not packed >> j & 1 and piece == planes[j]
        else:
            assert how == fmt.PLANE_ZSTD and packed >> j & 1 and length < n - n // 32
            assert zstandard.get_frame_parameters(piece).content_size == n
            assert zstandard.ZstdDecompressor().decompress(piece) == planes[j]
    assert stored[at:] == tail


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(chunk_data(), min_size=1, max_size=5), st.sampled_from([2, 4, 8]),
       st.integers(0, 255))
def test_records_match_the_reference_and_read_back(specs, k, mask_bits):
    mask = mask_bits & ((1 << k) - 1)
    datas = [data for data, _, _ in specs]
    chunks = [(data, blake3.blake3(data).digest()) for data in datas]
    records, results = nat.write_chunks(chunks, k, mask)
    records = bytes(records)
    at = 0
    for (data, cid), result in zip(chunks, results):
        assert result[0] == at
        end = at + fmt.RECORD_HEADER.size + result[1]
        check_record(records[at:end], data, cid, k, mask, result)
        assert python_read(records[at:end], result[1], len(data), cid) == data
        out = bytearray(len(data))
        assert nat.read_chunks(records[at:end], out, [(0, 0, result[1], len(data), cid)]) == \
            (1, 0) and out == data
        at = end
    assert at == len(records)


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(chunk_data(), max_size=5))
def test_raw_record_heads_then_the_bytes_are_the_reference_raw_records(specs):
    """snap_raw_record_heads: each head followed by its chunk's bytes is the raw record the
    reference lays out, and both read paths give the bytes back."""
    chunks = [(data, blake3.blake3(data).digest()) for data, _, _ in specs]
    heads, results = nat.raw_record_heads(chunks)
    assert len(heads) == nat.RAW_RECORD_HEAD * len(chunks)
    for (data, cid), result in zip(chunks, results):
        off, stored_len = result[0], result[1]
        record = bytes(heads[off:off + nat.RAW_RECORD_HEAD]) + data
        assert result[2:] == (fmt.CODEC_RAW, 0)
        check_record(record, data, cid, 1, 0, result)
        assert python_read(record, stored_len, len(data), cid) == data
        out = bytearray(len(data))
        assert nat.read_chunks(record, out, [(0, 0, stored_len, len(data), cid)]) == (1, 0)
        assert out == data
