"""Reads in pieces (SegmentReader.read_pieces): the block cache hands a restore's decoder views
of the blocks it holds in memory instead of copying them into a run buffer, and the decoder
(reader.decode_whole_chunks) reads each record in place, copying only a record that spans
two pieces (a block boundary). The bytes must be exactly those of the one-copy path, and
damage must still stop the read."""
from __future__ import annotations

import contextlib
import os
from collections import namedtuple

import blake3
import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from snapstore.engine import format as fmt
from snapstore.engine import reader, wal
from snapstore.engine.backends.base import SegmentReader
from snapstore.engine.writer import WriteOptions, encode_chunk
from snapstore.errors import CorruptionError
from snapstore.remote import cache as cache_mod
from snapstore.remote import layout
from snapstore.remote.cache import BlockCache

B = layout.CACHE_BLOCK
Entry = namedtuple("Entry", "segment offset stored_len raw_len base", defaults=(None,))


def record(data: bytes, compression: str, itemsize: int) -> tuple:
    """(record bytes, chunk id) of a chunk, encoded as the writer encodes it."""
    cid = blake3.blake3(data).digest()
    codec, parts = encode_chunk(cid, data, WriteOptions(compression=compression), itemsize)
    return wal.encode_record_header(fmt.REC_CHUNK, codec, parts) + \
        b"".join(bytes(p) for p in parts), cid


def chunks_back_to_back(datas) -> tuple:
    """(segment bytes, extents, entries) of chunks laid back to back in segment 1 (from
    offset 7), each restored once at the next place of the destination."""
    seg, extents, entries, dst = bytearray(7), [], {}, 0
    for data, comp, k in datas:
        rec, cid = record(data, comp, k)
        entries[cid] = Entry(1, len(seg), len(rec) - fmt.RECORD_HEADER.size, len(data))
        extents.append((dst, 0, len(data), cid))
        seg += rec
        dst += len(data)
    return bytes(seg), extents, entries, dst


def floats(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).standard_normal(n, dtype=np.float32).tobytes()


DATAS = [(floats(4096, 1), "zstd", 4), (b"", "none", 1), (b"\x07", "none", 1),
         (os.urandom(3000), "zstd", 1), (b"abc" * 999, "zstd", 1), (floats(1000, 2), "zstd", 4)]


class PiecesReader(SegmentReader):
    """Segment bytes in memory, given in pieces cut at `cuts` (segment offsets): views of
    the segment, as the block cache gives the blocks it holds."""

    def __init__(self, data: bytes, cuts) -> None:
        self.data, self.cuts, self.calls = data, sorted(set(cuts)), 0

    def read(self, number, offset, length):
        return self.data[offset:offset + length]

    @contextlib.contextmanager
    def read_pieces(self, number, offset, buf):
        self.calls += 1
        end = min(offset + len(buf), len(self.data))
        bounds = [offset] + [c for c in self.cuts if offset < c < end] + [end]
        whole = memoryview(self.data)
        yield [(a, whole[a:b]) for a, b in zip(bounds, bounds[1:])]

    def close(self):
        pass


@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(0, 40000), max_size=6))
@example(cuts=[])                                   # one piece: the run buffer's way
@example(cuts=[7 + fmt.RECORD_HEADER.size])         # inside the first record's payload
def test_records_are_decoded_in_place_and_across_piece_boundaries(cuts):
    seg, extents, entries, size = chunks_back_to_back(DATAS)
    out = bytearray(b"\xee" * (size + 5))
    segments = PiecesReader(seg, cuts)
    reader.decode_whole_chunks(segments, extents, entries, memoryview(out), 0)
    assert bytes(out) == b"".join(d for d, _, _ in DATAS) + b"\xee" * 5
    assert segments.calls == 1                      # one run of back-to-back records


def test_a_chunk_used_twice_is_read_from_the_piece_that_holds_it():
    seg, extents, entries, size = chunks_back_to_back(DATAS[:4])
    again = (size, 0, extents[0][2], extents[0][3])     # the first chunk again, at the end
    out = bytearray(size + extents[0][2])
    cut = entries[extents[2][3]].offset                  # the first chunk in the first piece
    reader.decode_whole_chunks(PiecesReader(seg, [cut]), extents + [again], entries,
                               memoryview(out), 0)
    assert bytes(out) == b"".join(d for d, _, _ in DATAS[:4]) + DATAS[0][0]


def test_nothing_to_decode_reads_nothing():
    segments = PiecesReader(b"", [])
    reader.decode_whole_chunks(segments, [], {}, memoryview(bytearray()), 0)
    assert segments.calls == 0


@pytest.mark.parametrize("spanning", [False, True])
def test_a_damaged_record_in_a_piece_stops_the_read(spanning):
    seg, extents, entries, size = chunks_back_to_back(DATAS)
    victim = entries[extents[3][3]]
    damaged = bytearray(seg)
    damaged[victim.offset + fmt.RECORD_HEADER.size + 100] ^= 1
    middle = victim.offset + fmt.RECORD_HEADER.size + 50
    cuts = [middle] if spanning else [victim.offset]
    with pytest.raises(CorruptionError, match="checksum"):
        reader.decode_whole_chunks(PiecesReader(bytes(damaged), cuts), extents, entries,
                                   memoryview(bytearray(size)), 0)


def test_records_cut_short_are_damage():
    seg, extents, entries, size = chunks_back_to_back(DATAS)
    with pytest.raises(CorruptionError, match="truncated"):
        reader.decode_whole_chunks(PiecesReader(seg[:-10], [len(seg) // 2]), extents, entries,
                                   memoryview(bytearray(size)), 0)


def test_the_default_read_pieces_reads_into_the_buffer():
    class Plain(SegmentReader):
        def read(self, number, offset, length):
            return bytes(range(256))[offset:offset + length]

        def close(self):
            pass
    buf = bytearray(10)
    with Plain().read_pieces(1, 250, buf) as pieces:
        assert [(at, bytes(v)) for at, v in pieces] == [(250, bytes(range(250, 256)))]
    assert bytes(buf[:6]) == bytes(range(250, 256))


# ---- BlockCache.read_pieces ---------------------------------------------------------------
def fetcher(segment: bytes):
    def fetch(number, offset, length, consume):
        data = memoryview(segment)[offset:offset + max(length, 0)]
        pos = 0

        def readinto(buf):
            nonlocal pos
            n = min(len(buf), len(data) - pos)
            buf[:n] = data[pos:pos + n]
            pos += n
            return n
        return consume(readinto)
    return fetch


@settings(max_examples=30, deadline=None)
@given(offset=st.integers(0, 3 * B), length=st.integers(0, 2 * B + 3),
       prefetch=st.booleans())
@example(offset=B - 5, length=10, prefetch=True)         # across a block boundary
@example(offset=2 * B + 12340, length=B, prefetch=True)   # past the segment's end
@example(offset=0, length=1, prefetch=False)              # one byte, fetched by the read
def test_block_cache_pieces_are_exactly_the_segment_bytes(tmp_path_factory, offset, length,
                                                          prefetch):
    segment = os.urandom(2 * B + 12345)
    cache = BlockCache(str(tmp_path_factory.mktemp("c")), fetcher(segment))
    try:
        if prefetch:
            cache.prefetch([(1, 0, len(segment))])
        buf = bytearray(length)
        with cache.read_pieces(1, offset, buf) as pieces:
            at = offset
            for start, view in pieces:
                assert start == at
                at += len(view)
            assert b"".join(bytes(v) for _, v in pieces) == segment[offset:offset + length]
            if prefetch and length and offset < len(segment):
                # held blocks are handed over in place, pinned while the block runs
                assert any(held.pins for held in cache._held.values())
        assert not any(held.pins for held in cache._held.values())
        if prefetch and length and offset < len(segment):
            with pytest.raises(ValueError):
                bytes(pieces[0][1])                      # not to be used after the block
    finally:
        cache.close()


def test_a_held_block_dropped_while_pinned_is_reused_only_after_the_pieces(tmp_path,
                                                                            monkeypatch):
    monkeypatch.setattr(cache_mod, "HELD_BYTES", B)
    segment = os.urandom(4 * B)
    cache = BlockCache(str(tmp_path), fetcher(segment))
    try:
        cache.prefetch([(1, 0, B)])
        with cache.read_pieces(1, 0, bytearray(B)) as pieces:
            held = cache._held[(1, 0)]
            with cache._lock:
                cache._forget((1, 0))                     # dropped while a reader uses it
            assert held.buf not in cache._spare
            assert bytes(pieces[0][1]) == segment[:B]
        assert held.pins == 0
    finally:
        cache.close()
