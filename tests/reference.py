"""Slow, plain pure-Python reference implementations of snapstore's C core, for the tests.

They follow the written spec (csrc/snapstore.h, csrc/fastcdc.c), not the C code: fingerprints
via the xxhash package's xxh3_128, page diffs, gather, and FastCDC byte by byte. The gear table
is generated here the same way as the literal table in csrc/fastcdc.c (splitmix64, same seed).
"""
from __future__ import annotations

import struct
from typing import Iterator, List, Tuple

import xxhash

M64 = (1 << 64) - 1
FP_BYTES = 16
GEAR_SEED = 0x534E415053544F52  # "SNAPSTOR"


def splitmix64(seed: int) -> Iterator[int]:
    """The splitmix64 generator (Steele, Lea, Flood 2014)."""
    s = seed & M64
    while True:
        s = (s + 0x9E3779B97F4A7C15) & M64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        yield z ^ (z >> 31)


def make_gear_table(seed: int = GEAR_SEED) -> List[int]:
    """The 256-entry gear table: the first 256 splitmix64 outputs of seed."""
    g = splitmix64(seed)
    return [next(g) for _ in range(256)]


GEAR = make_gear_table()


# ---- pages and fingerprints ------------------------------------------------------------
def page_count(nbytes: int, page_size: int) -> int:
    return -(-nbytes // page_size)


def fingerprint(page: bytes) -> bytes:
    """XXH3-128 (seed 0) as 16 bytes: low64 then high64, each little-endian."""
    d = xxhash.xxh3_128_intdigest(bytes(page))
    return (d & M64).to_bytes(8, "little") + (d >> 64).to_bytes(8, "little")


def page_fingerprints(buf: bytes, page_size: int) -> bytes:
    buf = bytes(buf)
    return b"".join(fingerprint(buf[i:i + page_size]) for i in range(0, len(buf), page_size))


def coalesce(pages: List[int]) -> List[Tuple[int, int]]:
    """Ascending page numbers -> runs (first_page, n_pages), adjacent pages merged."""
    runs: List[Tuple[int, int]] = []
    for p in pages:
        if runs and runs[-1][0] + runs[-1][1] == p:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((p, 1))
    return runs


def changed_pages(old: bytes, new: bytes, page_size: int) -> List[int]:
    return [p for p in range(page_count(len(new), page_size))
            if old[p * page_size:(p + 1) * page_size] != new[p * page_size:(p + 1) * page_size]]


def fingerprint_diff(buf: bytes, fps: bytes, page_size: int) -> Tuple[List[Tuple[int, int]], bytes]:
    """(runs of pages whose fingerprint differs from fps, the new fingerprints)."""
    new = page_fingerprints(buf, page_size)
    dirty = [p for p in range(len(new) // FP_BYTES)
             if new[p * FP_BYTES:(p + 1) * FP_BYTES] != fps[p * FP_BYTES:(p + 1) * FP_BYTES]]
    return coalesce(dirty), new


def shadow_diff(buf: bytes, shadow: bytes, page_size: int) -> Tuple[List[Tuple[int, int]], bytes]:
    """(runs of pages that differ from shadow, the updated shadow == buf)."""
    return coalesce(changed_pages(bytes(shadow), bytes(buf), page_size)), bytes(buf)


def runs_to_ranges(runs, nbytes: int, page_size: int) -> List[Tuple[int, int]]:
    return [(f * page_size, min((f + n) * page_size, nbytes) - f * page_size) for f, n in runs]


def gather(buf: bytes, ranges) -> bytes:
    buf = bytes(buf)
    return b"".join(buf[o:o + n] for o, n in ranges)


# ---- FastCDC ---------------------------------------------------------------------------
def cdc_masks(avg_size: int) -> Tuple[int, int]:
    """(mask_small, mask_large): bits+2 and bits-2 one-bits at the top of 64, bits = log2(avg)."""
    bits = avg_size.bit_length() - 1
    high = lambda n: (M64 << (64 - n)) & M64  # noqa: E731
    return high(bits + 2), high(bits - 2)


class RefChunker:
    """Byte-at-a-time FastCDC following the rule in csrc/fastcdc.c's header comment."""

    def __init__(self, min_size: int = 16384, avg_size: int = 65536, max_size: int = 262144):
        assert 64 <= min_size <= avg_size <= max_size <= 64 << 20
        assert avg_size & (avg_size - 1) == 0
        self.min_size, self.avg_size, self.max_size = min_size, avg_size, max_size
        self.mask_small, self.mask_large = cdc_masks(avg_size)
        self.h = 0
        self.chunk_len = 0
        self.offset = 0

    def feed(self, data: bytes) -> List[int]:
        cuts = []
        gear, mn, avg, mx = GEAR, self.min_size, self.avg_size, self.max_size
        ms, ml = self.mask_small, self.mask_large
        h, L, off = self.h, self.chunk_len, self.offset
        for b in bytes(data):
            cut = False
            if L >= mn:
                h = ((h << 1) + gear[b]) & M64
                cut = (h & (ms if L < avg else ml)) == 0
            L += 1
            off += 1
            if cut or L == mx:
                cuts.append(off)
                h, L = 0, 0
        self.h, self.chunk_len, self.offset = h, L, off
        return cuts

    def finish(self) -> List[int]:
        out = [self.offset] if self.chunk_len else []
        self.h = self.chunk_len = self.offset = 0
        return out


def chunk_boundaries(buf: bytes, min_size: int = 16384, avg_size: int = 65536,
                     max_size: int = 262144) -> List[int]:
    c = RefChunker(min_size, avg_size, max_size)
    return c.feed(buf) + c.finish()


# ---- byte planes (csrc/planes.c) ----------------------------------------------------------
# From the layout in snapstore.h: planes[j * n + i] = byte j of item i, then the tail bytes.
DELTA_XOR, DELTA_SUB = 1, 2


def rotate_items(buf: bytes, itemsize: int, left: bool = True, by: int = 1) -> bytes:
    """Each whole item, a little-endian word, rotated by `by` bits (left: its top bits to its
    bottom); the tail as it is."""
    buf = bytes(buf)
    bits, mask = 8 * itemsize, (1 << 8 * itemsize) - 1
    r = by if left else bits - by
    out = bytearray()
    for item in _items(buf, itemsize):
        w = int.from_bytes(item, "little")
        w = (w << r) | (w >> (bits - r))
        out += (w & mask).to_bytes(itemsize, "little")
    return bytes(out) + buf[len(buf) // itemsize * itemsize:]


def split_planes(buf: bytes, itemsize: int, rotate: bool | int = False) -> bytes:
    """rotate: True (one bit) or a number of bits."""
    buf = rotate_items(buf, itemsize, by=int(rotate)) if rotate else bytes(buf)
    n = len(buf) // itemsize
    return b"".join(buf[j:n * itemsize:itemsize] for j in range(itemsize)) + buf[n * itemsize:]


def join_planes(planes: bytes, itemsize: int, rotate: bool | int = False) -> bytes:
    planes = bytes(planes)
    n = len(planes) // itemsize
    out = bytearray(len(planes))
    for j in range(itemsize):
        out[j:n * itemsize:itemsize] = planes[j * n:(j + 1) * n]
    out[n * itemsize:] = planes[n * itemsize:]
    return rotate_items(out, itemsize, left=False, by=int(rotate)) if rotate else bytes(out)


def zigzag(d: int, bits: int) -> int:
    """An unsigned difference mod 2**bits read as signed, then 0, -1, 1, -2, ... -> 0, 1, 2, 3, ..."""
    s = d - (1 << bits) if d >> (bits - 1) else d
    return 2 * s if s >= 0 else -2 * s - 1


def unzigzag(z: int, bits: int) -> int:
    """The inverse of zigzag, as an unsigned number mod 2**bits."""
    s = z // 2 if z % 2 == 0 else -(z + 1) // 2
    return s % (1 << bits)


def _items(buf: bytes, itemsize: int) -> List[bytes]:
    return [buf[i:i + itemsize] for i in range(0, len(buf) // itemsize * itemsize, itemsize)]


def delta_items(cur: bytes, ref: bytes, itemsize: int, mode: int) -> bytes:
    """Item-ordered deltas of cur against ref: XOR, or zigzag of the little-endian difference;
    the tail bytes XOR'ed."""
    cur, ref = bytes(cur), bytes(ref)
    bits = 8 * itemsize
    out = bytearray()
    for a, b in zip(_items(cur, itemsize), _items(ref, itemsize)):
        if mode == DELTA_XOR:
            out += bytes(x ^ y for x, y in zip(a, b))
        else:
            d = (int.from_bytes(a, "little") - int.from_bytes(b, "little")) % (1 << bits)
            out += zigzag(d, bits).to_bytes(itemsize, "little")
    body = len(cur) // itemsize * itemsize
    out += bytes(x ^ y for x, y in zip(cur[body:], ref[body:]))
    return bytes(out)


def undelta_items(deltas: bytes, ref: bytes, itemsize: int, mode: int) -> bytes:
    """The inverse of delta_items: cur from its item-ordered deltas and ref."""
    deltas, ref = bytes(deltas), bytes(ref)
    bits = 8 * itemsize
    out = bytearray()
    for z, b in zip(_items(deltas, itemsize), _items(ref, itemsize)):
        if mode == DELTA_XOR:
            out += bytes(x ^ y for x, y in zip(z, b))
        else:
            d = unzigzag(int.from_bytes(z, "little"), bits)
            out += ((int.from_bytes(b, "little") + d) % (1 << bits)).to_bytes(itemsize, "little")
    body = len(deltas) // itemsize * itemsize
    out += bytes(x ^ y for x, y in zip(deltas[body:], ref[body:]))
    return bytes(out)


def delta_split_planes(cur: bytes, ref: bytes, itemsize: int, mode: int) -> bytes:
    return split_planes(delta_items(cur, ref, itemsize, mode), itemsize)


def delta_join_planes(planes: bytes, ref: bytes, itemsize: int, mode: int) -> bytes:
    return undelta_items(join_planes(planes, itemsize), ref, itemsize, mode)


def planes_chunk(stored: bytes, raw_len: int) -> bytes:
    """The raw bytes of a CODEC_PLANES chunk record's stored bytes (format 4, written out by
    hand from docs/design.md): <BB item size, flags (the items' rotation left in bits: 0 or 1
    in format 4 and 5, 0..7 from format 6 on); per
    plane <BI how (0 raw, 1 one zstd frame), stored length; the planes; the tail bytes. Plane j
    is byte j of every (rotated) item."""
    import zstandard
    itemsize, flags = struct.unpack_from("<BB", stored, 0)
    n, tail = divmod(raw_len, itemsize)
    table = [struct.unpack_from("<BI", stored, 2 + 5 * j) for j in range(itemsize)]
    pos = 2 + 5 * itemsize
    planes = b""
    for how, length in table:
        piece = stored[pos:pos + length]
        pos += length
        planes += piece if how == 0 else zstandard.ZstdDecompressor().decompress(piece)
    assert len(planes) == n * itemsize and len(stored) - pos == tail
    assert flags <= 7
    return join_planes(planes + stored[pos:], itemsize, rotate=flags)


def delta_planes_chunk(stored: bytes, raw_len: int, base: bytes) -> Tuple[bytes, bytes, int]:
    """(raw bytes, base id, depth) of a CODEC_DELTA_PLANES chunk record's stored bytes (format
    5, planned; written out by hand from docs/design.md): the base chunk's 32-byte id and a u8
    depth, then a plane section laid out as CODEC_PLANES' with flags 0, whose planes are those
    of zigzag(item - base item) over little-endian words, the tail bytes XOR the base's."""
    import zstandard
    base_id, depth = stored[:32], stored[32]
    section = stored[33:]
    itemsize, flags = struct.unpack_from("<BB", section, 0)
    assert flags == 0
    n, tail = divmod(raw_len, itemsize)
    table = [struct.unpack_from("<BI", section, 2 + 5 * j) for j in range(itemsize)]
    pos = 2 + 5 * itemsize
    planes = b""
    for how, length in table:
        piece = section[pos:pos + length]
        pos += length
        planes += piece if how == 0 else zstandard.ZstdDecompressor().decompress(piece)
    assert len(planes) == n * itemsize and len(section) - pos == tail
    return delta_join_planes(planes + section[pos:], base, itemsize, DELTA_SUB), base_id, depth
