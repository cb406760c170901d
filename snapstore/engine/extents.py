"""Manifests as extent lists: which chunk bytes make up which byte ranges of a buffer.

An extent is (buffer offset, offset inside the chunk, length, chunk id). A manifest is a list
of extents sorted by buffer offset that do not overlap; a full manifest covers the buffer, a
delta manifest covers only what changed since the parent checkpoint.
"""
from __future__ import annotations

from typing import Iterable, List, Tuple

from snapstore.engine import format as fmt

Extent = Tuple[int, int, int, bytes]


def pack(extents: Iterable[Extent]) -> bytes:
    p = fmt.EXTENT.pack
    return b"".join(p(*e) for e in extents)


def unpack(blob: bytes) -> List[Extent]:
    return list(fmt.EXTENT.iter_unpack(blob))


def count(blob: bytes) -> int:
    return len(blob) // fmt.EXTENT.size


def overlay(base: List[Extent], patch: List[Extent]) -> List[Extent]:
    """The manifest that results from writing `patch` over `base` (newer bytes win)."""
    out: List[Extent] = []
    j = 0
    n = len(patch)
    for off, coff, length, cid in base:
        end = off + length
        while j < n and patch[j][0] + patch[j][2] <= off:
            j += 1
        cur = off
        k = j
        while cur < end and k < n and patch[k][0] < end:
            p_off, p_end = patch[k][0], patch[k][0] + patch[k][2]
            if p_off > cur:
                out.append((cur, coff + (cur - off), p_off - cur, cid))
            cur = max(cur, p_end)
            k += 1
        if cur < end:
            out.append((cur, coff + (cur - off), end - cur, cid))
    out.extend(patch)
    out.sort(key=lambda e: e[0])
    return out


def flatten(layers: List[List[Extent]]) -> List[Extent]:
    """One manifest equal to writing the layers over each other, oldest first."""
    merged = layers[0]
    for layer in layers[1:]:
        merged = overlay(merged, layer)
    return merged


def clip(extents: Iterable[Extent], start: int, end: int) -> List[Extent]:
    """The parts of extents that fall inside [start, end)."""
    out = []
    if end <= start:
        return out
    for off, coff, length, cid in extents:
        e_end = off + length
        if e_end <= start or off >= end:
            continue
        lo, hi = max(off, start), min(e_end, end)
        out.append((lo, coff + (lo - off), hi - lo, cid))
    return out


def covered_bytes(extents: Iterable[Extent]) -> int:
    return sum(e[2] for e in extents)
