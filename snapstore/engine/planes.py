"""The byte-plane chunk codec (CODEC_PLANES, format 4): chunks of fixed-size items (float
weights above all) stored as byte planes, each plane zstd-compressed or raw, whichever is
smaller (docs/floatcodec.md measured why: the planes of float32 weights save 17% where one
zstd frame saves 7%, at 2-5x its decode speed).

Stored bytes of a CODEC_PLANES chunk record (after CHUNK_PREFIX; fmt.PLANES_*):

    PLANES_HEADER   item size (2, 4 or 8), flags (PLANES_ROTATE: each item rotated left one
                    bit first, so a float's sign leaves the exponent's plane)
    PLANE_ENTRY     per plane, item size of them: how it is stored (PLANE_RAW / PLANE_ZSTD)
                    and its stored length
    the planes' stored bytes, back to back, then the raw_len % item size tail bytes as they
    are

Plane j holds byte j of every item (the C core's split_planes); a zstd plane is one standard
frame that declares its content size (raw_len // item size). The chunk id stays the BLAKE3 of
the chunk's raw bytes, so the codec changes nothing about deduplication or manifests, and a
chunk decodes alone.

encode() is the writer's side, decode() the one reader's (engine/chunks.py turns its
ValueError into DamagedRecord); neither knows anything but bytes.
"""
from __future__ import annotations

import threading

import zstandard

from snapstore import _native as native
from snapstore.engine import format as fmt
from snapstore.engine.memory import uninit_bytearray
from snapstore.engine.zstdframe import decompress_exact

# zstd level 1 with a 64-entry hash table, one probe and 7-byte minimum matches: on byte planes
# (noise-like literals with a few long runs) it keeps the runs and Huffman-codes the rest, 2-5x
# faster than plain level 1 and smaller (docs/floatcodec.md, profile "1f")
_PLANE_PARAMS = zstandard.ZstdCompressionParameters.from_level(
    1, min_match=7, hash_log=6, search_log=1, target_length=0, write_content_size=True)
MIN_CHUNK_BYTES = 1024          # smaller chunks are not worth the table: zstd or raw

_local = threading.local()


def _compressor() -> zstandard.ZstdCompressor:
    c = getattr(_local, "c", None)
    if c is None:
        c = _local.c = zstandard.ZstdCompressor(compression_params=_PLANE_PARAMS)
    return c


def usable(itemsize: int, nbytes: int) -> bool:
    """Whether a chunk of nbytes of items of itemsize is coded as planes at all."""
    return itemsize in fmt.PLANES_ITEMSIZES and nbytes >= MIN_CHUNK_BYTES


def probe(samples: list, itemsize: int) -> tuple[bool, ...]:
    """Which planes are worth compressing, judged on `samples` (chunks of the same buffer):
    a plane whose samples' zstd frames save at least 1/32 of them. zstd spends most of its
    time on planes of noise (a float's low mantissa bytes) and saves nothing there, so encode
    skips them (docs/floatcodec.md: the probe predicted the saving within 0.5 points)."""
    raw = [0] * itemsize
    packed = [0] * itemsize
    c = _compressor()
    for data in samples:
        n = len(data) // itemsize
        planes = native.split_planes(data, itemsize, rotate=True)
        for j in range(itemsize):
            raw[j] += n
            packed[j] += len(c.compress(planes[j * n:(j + 1) * n]))
    return tuple(p < r - r // 32 for p, r in zip(packed, raw))


def encode(data, itemsize: int, worth: tuple[bool, ...] | None = None) -> list | None:
    """The stored parts of data (a chunk of itemsize-byte items) as CODEC_PLANES, or None when
    no plane saves at least 1/32 of itself (then nothing is gained over the raw bytes: the
    caller stores them raw, untransformed). worth (probe()): the planes to try to compress,
    the others are stored raw at once (default: all)."""
    n = len(data) // itemsize
    if worth is not None and not any(worth):
        return None
    planes = native.split_planes(data, itemsize, rotate=True)
    entries, stored, any_packed = [], [], False
    c = _compressor()
    for j in range(itemsize):
        plane = planes[j * n:(j + 1) * n]
        packed = c.compress(plane) if worth is None or worth[j] else plane
        if len(packed) < n - n // 32:
            entries.append(fmt.PLANE_ENTRY.pack(fmt.PLANE_ZSTD, len(packed)))
            stored.append(packed)
            any_packed = True
        else:
            entries.append(fmt.PLANE_ENTRY.pack(fmt.PLANE_RAW, n))
            stored.append(plane)
    if not any_packed:
        return None
    return [fmt.PLANES_HEADER.pack(itemsize, fmt.PLANES_ROTATE), *entries, *stored,
            planes[itemsize * n:]]


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
    if flags & ~fmt.PLANES_ROTATE:
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
    return native.join_planes(planes, itemsize, out=out,
                              rotate=bool(flags & fmt.PLANES_ROTATE))
