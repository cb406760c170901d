"""Chunk records: read one, check it, decode it to the chunk's bytes. The one chunk decoder,
used by the read path, compaction and verify, with one error policy: every failure (a record
that cannot be read, is damaged, is not the chunk asked for, claims more than MAX_CHUNK_BYTES,
holds a zstd frame whose declared content size is missing or not its raw length, does not
decompress, or decodes to the wrong length) raises DamagedRecord, a CorruptionError naming
segment and offset. No caller ever gets wrong bytes, nor a zstandard, memory or OS error; the
declared size is checked before anything is allocated, so a decompression bomb costs nothing.

Chunk record payload (docs/design.md): CHUNK_PREFIX (chunk id, raw length), then the stored
bytes per the record's codec: a zstd frame, byte planes (engine/planes.py), or the raw bytes.
"""
from __future__ import annotations

from typing import NamedTuple

from snapstore.engine import format as fmt
from snapstore.engine import planes
from snapstore.engine.backends.base import SegmentReader
from snapstore.engine.wal import Record, damaged_record, read_record
from snapstore.errors import DamagedRecord
from snapstore.engine.zstdframe import decompress_exact


class StoredChunk(NamedTuple):
    """A chunk as its record stores it (checked, not decoded)."""
    record: Record                  # where it lies, its codec
    chunk_id: bytes
    raw_len: int                    # the length of the decoded chunk
    stored: bytes | memoryview      # the bytes after the prefix, as stored (no copy)


def stored_chunk(record: Record) -> StoredChunk:
    """The chunk in a valid chunk record (see wal.read_record). Raises DamagedRecord when the
    payload is too short to hold the chunk prefix."""
    if len(record.payload) < fmt.CHUNK_PREFIX.size:
        raise damaged_record("chunk record too short", record.segment, record.offset, record.end)
    chunk_id, raw_len = fmt.CHUNK_PREFIX.unpack_from(record.payload)
    return StoredChunk(record, chunk_id, raw_len,
                       memoryview(record.payload)[fmt.CHUNK_PREFIX.size:])


def read_stored_chunk(reader: SegmentReader, number: int, offset: int, stored_len: int,
                      chunk_id: bytes) -> StoredChunk:
    """Reads the chunk record the index places at (number, offset), with stored_len payload
    bytes, in one read and checks it: a valid record (wal.read_record), a chunk record, of
    chunk `chunk_id`. Raises DamagedRecord on any failure, a read error included; a missing
    segment raises the read session's CorruptionError."""
    try:
        record = read_record(reader, number, offset, length=stored_len)
    except OSError as exc:
        raise damaged_record(f"cannot read chunk record: {exc.strerror or exc}",
                            number, offset) from exc
    if record.rtype != fmt.REC_CHUNK:
        raise damaged_record("index points at a record that is not this chunk", number, offset,
                            record.end)
    chunk = stored_chunk(record)
    if chunk.chunk_id != chunk_id:
        raise damaged_record("chunk record holds a different chunk id", number, offset,
                            record.end)
    return chunk


def decode_chunk(chunk: StoredChunk, out=None) -> bytes | memoryview:
    """The chunk's raw bytes: decompressed, or the stored bytes themselves (a view, no copy)
    for a raw chunk; checked to be raw_len long. Raises DamagedRecord. With out (a writable
    buffer of exactly raw_len bytes): written there instead, and out is returned; a byte-plane
    chunk is decoded straight into it (no intermediate copy). out is written only once the
    chunk has decoded without error."""
    if out is not None:
        if chunk.record.codec == fmt.CODEC_PLANES and chunk.raw_len == len(out):
            _check_claimed_length(chunk)
            try:
                return planes.decode(chunk.stored, chunk.raw_len, out)
            except ValueError as exc:
                raise _undecodable(chunk, exc) from None
        data = decode_chunk(chunk)
        if len(data) != len(out):
            raise damaged_record("chunk has the wrong length", chunk.record.segment,
                                chunk.record.offset, chunk.record.end)
        out[:] = data
        return out
    record = chunk.record
    _check_claimed_length(chunk)
    if record.codec == fmt.CODEC_ZSTD:
        try:
            data = decompress_exact(chunk.stored, chunk.raw_len)
        except ValueError as exc:
            raise damaged_record(f"chunk {exc}", record.segment, record.offset,
                                record.end) from None
    elif record.codec == fmt.CODEC_PLANES:
        try:
            data = planes.decode(chunk.stored, chunk.raw_len)
        except ValueError as exc:
            raise _undecodable(chunk, exc) from None
    else:
        data = chunk.stored
    if len(data) != chunk.raw_len:
        raise damaged_record("chunk has the wrong length", record.segment, record.offset,
                            record.end)
    return data


def _check_claimed_length(chunk: StoredChunk) -> None:
    if chunk.raw_len > fmt.MAX_CHUNK_BYTES:
        record = chunk.record
        raise damaged_record(f"chunk claims {chunk.raw_len} bytes, more than the largest chunk "
                            f"a store writes ({fmt.MAX_CHUNK_BYTES})", record.segment,
                            record.offset, record.end)


def _undecodable(chunk: StoredChunk, exc: ValueError) -> DamagedRecord:
    record = chunk.record
    return damaged_record(f"chunk does not decode: {exc}", record.segment, record.offset,
                         record.end)


def read_chunk(reader: SegmentReader, number: int, offset: int, stored_len: int,
               chunk_id: bytes, raw_len: int, out=None) -> bytes | memoryview:
    """Reads, checks and decodes the chunk the index describes (segment, offset, stored and
    raw length): its raw bytes (in out, when given: see decode_chunk). Raises CorruptionError
    (DamagedRecord) naming segment and offset on any failure."""
    chunk = read_stored_chunk(reader, number, offset, stored_len, chunk_id)
    if chunk.raw_len != raw_len:
        raise damaged_record("chunk has the wrong length", number, offset, chunk.record.end)
    return decode_chunk(chunk, out)
