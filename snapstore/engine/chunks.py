"""Chunk records: read one, check it, decode it to the chunk's bytes. The one chunk decoder,
used by the read path, compaction and verify, with one error policy: every failure (a record
that cannot be read, is damaged, is not the chunk asked for, claims more than MAX_CHUNK_BYTES,
holds a zstd frame whose declared content size is missing or not its raw length, does not
decompress, or decodes to the wrong length) raises DamagedRecord, a CorruptionError naming
segment and offset. No caller ever gets wrong bytes, nor a zstandard, memory or OS error; the
declared size is checked before anything is allocated, so a decompression bomb costs nothing.

Chunk record payload (docs/design.md): CHUNK_PREFIX (chunk id, raw length), then the stored
bytes per the record's codec: a zstd frame, byte planes (engine/planes.py), the raw bytes, or
(format 5) delta planes against a base chunk the record names (delta_base): such a chunk
decodes only given its base's raw bytes (decode_delta); ChunkReader (engine/reader.py) and
the other readers of a store fetch the base first.
"""
from __future__ import annotations

from typing import NamedTuple

from snapstore import _native as native
from snapstore.engine import format as fmt
from snapstore.engine import planes
from snapstore.engine.backends.base import SegmentReader
from snapstore.engine.wal import Record, damaged_record, encode_record_header, read_record
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
    if record.codec == fmt.CODEC_DELTA_PLANES:
        raise damaged_record("a delta chunk read without its base (a delta chunk has no "
                             "place here)", record.segment, record.offset, record.end)
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


def delta_base(chunk: StoredChunk) -> tuple[bytes, int]:
    """(base chunk id, depth) that a CODEC_DELTA_PLANES chunk's stored bytes name. Raises
    DamagedRecord when they are too short for the delta header or name depth 0, or when the
    chunk is not a delta chunk."""
    record = chunk.record
    if record.codec != fmt.CODEC_DELTA_PLANES:
        raise damaged_record("not a delta chunk", record.segment, record.offset, record.end)
    if len(chunk.stored) < fmt.DELTA_HEADER.size:
        raise damaged_record("delta chunk too short for its header", record.segment,
                             record.offset, record.end)
    base_id, depth = fmt.DELTA_HEADER.unpack_from(chunk.stored)
    if depth == 0:
        raise damaged_record("delta chunk names depth 0", record.segment, record.offset,
                             record.end)
    return bytes(base_id), depth


def decode_delta(chunk: StoredChunk, base, out=None) -> bytes | memoryview:
    """The raw bytes of a CODEC_DELTA_PLANES chunk, given its base's raw bytes (as long as the
    chunk; base may be out itself, which then holds the base already): in out (a writable
    buffer of exactly raw_len bytes) or a new buffer. The C core's decoder (the one restores
    use), over the record rebuilt from its checked payload. Raises DamagedRecord."""
    record = chunk.record
    _check_claimed_length(chunk)
    base_id, _ = delta_base(chunk)
    if len(base) != chunk.raw_len:
        raise damaged_record(f"delta chunk of {chunk.raw_len} bytes names a base of "
                             f"{len(base)}", record.segment, record.offset, record.end)
    payload = memoryview(record.payload)
    src = bytearray(encode_record_header(fmt.REC_CHUNK, record.codec, [payload]))
    src += payload
    dst = out if out is not None else bytearray(chunk.raw_len)
    if len(dst) != chunk.raw_len:
        raise damaged_record("chunk has the wrong length", record.segment, record.offset,
                             record.end)
    if base is not dst:
        memoryview(dst)[:] = base
    done, reason = native.read_chunks(src, dst, [(0, 0, len(payload), chunk.raw_len,
                                                  chunk.chunk_id, base_id)])
    if done != 1:
        raise damaged_record(f"delta chunk does not decode: {native.READ_REASONS[reason]}",
                             record.segment, record.offset, record.end)
    return dst


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
