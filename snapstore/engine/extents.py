"""Manifests as extent lists: which chunk bytes make up which byte ranges of a buffer.

An extent is (buffer offset, offset inside the chunk, length, chunk id). A manifest is a list
of extents sorted by buffer offset that do not overlap; a full manifest covers the buffer, a
delta manifest covers only what changed since the parent checkpoint.
"""
from __future__ import annotations

from operator import add, itemgetter
from typing import Iterable, List, Sequence, Tuple

from snapstore.engine import format as fmt
from snapstore.errors import CorruptionError

Extent = Tuple[int, int, int, bytes]


def pack(extents: Iterable[Extent]) -> bytes:
    p = fmt.EXTENT.pack
    return b"".join(p(*e) for e in extents)


def unpack(blob: bytes) -> List[Extent]:
    """The extents of a packed manifest; CorruptionError if it is not a whole number of them."""
    if len(blob) % fmt.EXTENT.size:
        raise CorruptionError(f"a manifest of {len(blob)} bytes is not a whole number of "
                              f"{fmt.EXTENT.size}-byte extents")
    return list(fmt.EXTENT.iter_unpack(blob))


def check_manifest(extents: Sequence[Extent], size: int, full: bool, what: str) -> None:
    """Raises CorruptionError unless `extents` is a valid manifest of a buffer of `size` bytes:
    every length > 0, sorted by buffer offset, non-overlapping, inside the buffer; a full
    manifest covers the buffer exactly (so a restore from it writes every byte). `what` names
    the manifest in the message. (That each extent lies inside its chunk is checked where the
    chunk is read: its raw length is known there.)"""
    at = 0
    for off, _, length, _ in extents:
        if length <= 0 or off < at or (full and off != at):
            problem = ("an empty extent" if length <= 0 else
                       "overlapping or unsorted extents" if off < at else
                       f"a hole at bytes {at}..{off}")
            raise CorruptionError(f"damaged manifest of {what}: {problem}")
        at = off + length
    if at > size:
        raise CorruptionError(f"damaged manifest of {what}: extents reach byte {at} of a "
                              f"{size}-byte buffer")
    if full and at != size:
        raise CorruptionError(f"damaged manifest of {what}: the full manifest covers only "
                              f"{at} of {size} bytes")


def check_fills(extents: Sequence[Extent], start: int, end: int, what: str) -> None:
    """Raises CorruptionError unless `extents` lie back to back from start to end: the proof,
    before any byte is written, that a restore of [start, end) from them leaves no byte of
    the output unwritten (fresh output memory may hold old data)."""
    offsets = list(map(itemgetter(0), extents))
    ends = list(map(add, offsets, map(itemgetter(2), extents)))
    if [start] + ends != offsets + [end]:
        at = next(a for a, o in zip([start] + ends, offsets + [end]) if a != o)
        raise CorruptionError(f"{what}: the base manifest leaves bytes from {at} unwritten "
                              f"in {start}..{end}")


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
