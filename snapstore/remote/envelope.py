"""The framing every checked object of an S3 store shares (checkpoint objects, group parts):

    OBJECT_HEADER (magic 8 bytes, version u32, reserved u32, the length of the part that
                   follows it and the header describes, u64)
    the body
    OBJECT_TRAILER: XXH3-64 of every byte before it

seal() makes one, unseal() checks one: size, checksum, magic, version, in that order, so a
damaged object never gets as far as its body's decoder.
"""
from __future__ import annotations

from typing import Sequence

import xxhash

from snapstore.errors import CorruptionError, FormatError
from snapstore.remote import layout


def seal(magic: bytes, version: int, length: int, parts: Sequence) -> bytes:
    """The object of body `parts`; length: what the header says (the first part's length)."""
    body = b"".join([layout.OBJECT_HEADER.pack(magic, version, 0, length), *parts])
    return body + layout.OBJECT_TRAILER.pack(xxhash.xxh3_64_intdigest(body))


def damaged(what: str, key: str, why: str) -> CorruptionError:
    return CorruptionError(f"{what} {key!r} is damaged: {why}")


def unseal(data: bytes, key: str, what: str, kind: str, magic: bytes,
           version: int) -> tuple[int, int, int]:
    """Checks an object named `what` (in messages) at `key`; kind: what its magic names.
    Returns (where the body begins, the length the header names, where the trailer
    begins). Raises CorruptionError (too short, checksum, magic), FormatError (a newer
    version)."""
    head, tail = layout.OBJECT_HEADER.size, layout.OBJECT_TRAILER.size
    if len(data) < head + tail:
        raise damaged(what, key, f"{len(data)} bytes is too short")
    end = len(data) - tail
    (checksum,) = layout.OBJECT_TRAILER.unpack_from(data, end)
    if xxhash.xxh3_64_intdigest(memoryview(data)[:end]) != checksum:
        raise damaged(what, key, "checksum mismatch")
    found, found_version, _, length = layout.OBJECT_HEADER.unpack_from(data)
    if found != magic:
        raise damaged(what, key, f"not {kind} (wrong magic)")
    if found_version > version:
        raise FormatError(f"{what} {key!r} is of version {found_version}; this snapstore "
                          f"reads up to {version}: upgrade snapstore")
    return head, length, end
