"""The byte-plane chunk codec (CODEC_PLANES, format 4): chunks of fixed-size items (float
weights above all) stored as byte planes, each plane zstd-compressed or raw, whichever is
smaller (docs/floatcodec.md measured why: the planes of float32 weights save 17% where one
zstd frame saves 7%, at 2-5x its decode speed).

Stored bytes of a CODEC_PLANES chunk record (after CHUNK_PREFIX; fmt.PLANES_*):

    PLANES_HEADER   item size (2, 4 or 8), flags: the rotation, each item rotated left that
                    many bits first (0..7; formats 4 and 5 write 1, PLANES_ROTATE, so a float's
                    sign leaves the exponent's plane; format 6 writers at compression_level 3
                    or more write 3 where their samples code smaller: float32, bfloat16 and
                    float64 weights, docs/floatcodec.md "Built (stop 47)")
    PLANE_ENTRY     per plane, item size of them: how it is stored (PLANE_RAW / PLANE_ZSTD)
                    and its stored length
    the planes' stored bytes, back to back, then the raw_len % item size tail bytes as they
    are

Plane j holds byte j of every item (the C core's split_planes); a zstd plane is one standard
frame that declares its content size (raw_len // item size). The chunk id stays the BLAKE3 of
the chunk's raw bytes, so the codec changes nothing about deduplication or manifests, and a
chunk decodes alone.

encode() and probe() are the writer's side (the C core's snap_write_chunks codes the planes:
csrc/chunkwrite.c), decode() the one reader's (engine/chunks.py turns its ValueError into
DamagedRecord); none knows anything but bytes.
"""
from __future__ import annotations

from typing import NamedTuple

from snapstore import _native as native
from snapstore.engine import format as fmt
from snapstore.engine.memory import uninit_bytearray
from snapstore.engine.zstdframe import decompress_exact

MIN_CHUNK_BYTES = 1024          # smaller chunks are not worth the table: zstd or raw
_NO_ID = bytes(32)              # the chunk id of records made only for their stored bytes


def usable(itemsize: int, nbytes: int) -> bool:
    """Whether a chunk of nbytes of items of itemsize is coded as planes at all."""
    return itemsize in fmt.PLANES_ITEMSIZES and nbytes >= MIN_CHUNK_BYTES


def rotation_of(stored) -> int:
    """The rotation (PLANES_HEADER flags) of a CODEC_PLANES record's stored bytes (verify
    checks it against the segment's version: fmt.SEGMENT_PLANE_ROTATIONS); ValueError when
    they are too short for the header."""
    if len(stored) < fmt.PLANES_HEADER.size:
        raise ValueError("byte-plane chunk too short for its header")
    return fmt.PLANES_HEADER.unpack_from(stored)[1]


def plane_mask(itemsize: int, worth: tuple[bool, ...] | None) -> int:
    """The C core's try_planes mask of worth (probe(): the planes to try to compress; None:
    all of them)."""
    if worth is None:
        return (1 << itemsize) - 1
    return sum(1 << j for j, w in enumerate(worth) if w)


class Probe(NamedTuple):
    rotation: int                   # the PLANES_HEADER flags to write: the items' rotation
    worth: tuple[bool, ...] | None  # per plane: whether to try to compress it (None: all)


def probe(samples: list, itemsize: int,
          rotations: tuple[int, ...] = (fmt.PLANES_ROTATE,)) -> Probe:
    """How to code the planes of a buffer's chunks, judged on `samples` (chunks of it): the
    rotation of `rotations` (writer.plane_rotations: the writer's level and the segment's
    version) whose samples coded smallest (the first of equals), and which planes are worth
    compressing at
    it: a plane that packed in any sample. zstd spends most of its time on planes of noise (a
    float's low mantissa bytes) and saves nothing there, so the encoder skips them
    (docs/floatcodec.md: the probe predicted the saving within 0.5 points). The rotation
    matters by type: 3 bits save 0.2-0.4 points more than 1 on float32 weights and 0.45 on
    bfloat16, and 5 points less on float16, whose item size is bfloat16's."""
    if not rotations:
        raise ValueError("probe: no rotation to choose from")
    best: tuple | None = None
    for rotation in rotations:
        packed = size = 0
        if samples:
            records, results = native.write_chunks([(data, _NO_ID) for data in samples],
                                                   itemsize, plane_mask(itemsize, None),
                                                   rotate=rotation)
            size = len(records)
            for _, _, _, planes_packed in results:
                packed |= planes_packed
        if best is None or size < best[0]:
            best = (size, rotation, packed)
    _, rotation, packed = best
    return Probe(rotation, tuple(bool(packed >> j & 1) for j in range(itemsize)))


def encode(data, itemsize: int, worth: tuple[bool, ...] | None = None,
           rotation: int = fmt.PLANES_ROTATE) -> list | None:
    """The stored parts of data (a chunk of itemsize-byte items) as CODEC_PLANES, or None when
    that does not save at least 1/32 of the chunk (no plane packed, or the table ate the
    saving: then the caller stores the raw bytes, untransformed). worth (probe()): the planes
    to try to compress, the others are stored raw at once (default: all); rotation (probe()):
    the items' rotation, the plane header's flags. The coding is the C core's
    (snap_write_chunks: the zstd profile of docs/floatcodec.md, the 1/32 rules), the same a
    batch of chunks gets from writer.encode_chunks."""
    records, [(off, stored_len, codec, _)] = native.write_chunks(
        [(data, _NO_ID)], itemsize, plane_mask(itemsize, worth), rotate=rotation)
    if codec != fmt.CODEC_PLANES:
        return None
    start = off + fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size
    return [records[start:off + fmt.RECORD_HEADER.size + stored_len]]


def decode(stored, raw_len: int, out=None) -> memoryview:
    """The raw_len bytes a CODEC_PLANES record's stored bytes hold: in out (a writable
    buffer of raw_len bytes; a restore's destination) or a new buffer. Raises ValueError
    naming what is wrong (an unknown item size or flag, lengths that do not add up, a plane
    that is not a zstd frame of exactly its length), before out is written to; nothing larger
    than raw_len is ever allocated."""
    stored = memoryview(stored)
    if len(stored) < fmt.PLANES_HEADER.size:
        raise ValueError("byte-plane chunk too short for its header")
    itemsize, flags = fmt.PLANES_HEADER.unpack_from(stored)
    if itemsize not in fmt.PLANES_ITEMSIZES:
        raise ValueError(f"byte-plane chunk names item size {itemsize}")
    if flags & ~fmt.PLANES_ROTATION:
        raise ValueError(f"byte-plane chunk has unknown flags {flags:#x}")
    n, tail = divmod(raw_len, itemsize)
    at = fmt.PLANES_HEADER.size
    table_end = at + itemsize * fmt.PLANE_ENTRY.size
    if len(stored) < table_end:
        raise ValueError("byte-plane chunk too short for its plane table")
    entries = [fmt.PLANE_ENTRY.unpack_from(stored, at + j * fmt.PLANE_ENTRY.size)
               for j in range(itemsize)]
    if table_end + sum(length for _, length in entries) + tail != len(stored):
        raise ValueError("byte-plane chunk's plane lengths do not add up to its size")
    planes = uninit_bytearray(raw_len)     # every byte is written below (lengths checked)
    laid_out = memoryview(planes)
    pos = table_end
    for j, (how, length) in enumerate(entries):
        piece = stored[pos:pos + length]
        pos += length
        if how == fmt.PLANE_RAW:
            if length != n:
                raise ValueError(f"raw plane {j} holds {length} bytes, not {n}")
            laid_out[j * n:(j + 1) * n] = piece
        elif how == fmt.PLANE_ZSTD:
            try:
                laid_out[j * n:(j + 1) * n] = decompress_exact(piece, n)
            except ValueError as exc:
                raise ValueError(f"plane {j} {exc}") from None
        else:
            raise ValueError(f"plane {j} is stored in an unknown way ({how})")
    laid_out[itemsize * n:] = stored[pos:]
    # into out, or a new buffer of the C core's: no overlap to rule out (a chunk read's hot
    # path)
    return native.join_planes(planes, itemsize, out=out, rotate=flags)
