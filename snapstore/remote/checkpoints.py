"""Checkpoint objects: one immutable object per checkpoint of an S3 store.

    CKPT_HEADER (magic, version, reserved, commit payload length)
    the commit payload, exactly as a commit record holds it (records.Commit.encode)
    the reused-chunk table: format.NEW_CHUNK entries locating every chunk the extents name
        that is not in the commit's own new-chunk table
    CKPT_TRAILER: XXH3-64 of every byte before it

With both tables a machine that never saw the checkpoints the chunks came from can apply
the checkpoint to its index and read it.
"""
from __future__ import annotations

import xxhash

from snapstore.engine import format as fmt
from snapstore.engine.records import Commit
from snapstore.errors import CorruptionError, FormatError
from snapstore.remote import layout


def encode(commit: Commit, reused: bytes) -> bytes:
    """The object of `commit`; reused: packed NEW_CHUNK entries of its other chunks."""
    payload = b"".join(bytes(p) for p in commit.encode())
    body = layout.CKPT_HEADER.pack(layout.CKPT_MAGIC, layout.CKPT_VERSION, 0,
                                   len(payload)) + payload + reused
    return body + layout.CKPT_TRAILER.pack(xxhash.xxh3_64_intdigest(body))


def decode(data: bytes, key: str) -> tuple[Commit, bytes]:
    """(Commit, reused-chunk table) of a checkpoint object; raises CorruptionError naming the
    key when it is damaged, FormatError when it is of a newer version."""
    def damaged(why: str) -> CorruptionError:
        return CorruptionError(f"checkpoint object {key!r} is damaged: {why}")
    head, tail = layout.CKPT_HEADER.size, layout.CKPT_TRAILER.size
    if len(data) < head + tail:
        raise damaged(f"{len(data)} bytes is too short")
    (checksum,) = layout.CKPT_TRAILER.unpack_from(data, len(data) - tail)
    if xxhash.xxh3_64_intdigest(memoryview(data)[:len(data) - tail]) != checksum:
        raise damaged("checksum mismatch")
    magic, version, _, length = layout.CKPT_HEADER.unpack_from(data)
    if magic != layout.CKPT_MAGIC:
        raise damaged("not a checkpoint object (wrong magic)")
    if version > layout.CKPT_VERSION:
        raise FormatError(f"checkpoint object {key!r} is of version {version}; this "
                          f"snapstore reads up to {layout.CKPT_VERSION}: upgrade snapstore")
    end = head + length
    reused = bytes(data[end:len(data) - tail])
    if end > len(data) - tail or len(reused) % fmt.NEW_CHUNK.size:
        raise damaged("lengths do not match")
    try:
        commit = Commit.decode(bytes(data[head:end]))
    except CorruptionError as exc:
        raise damaged(str(exc)) from None
    expected = layout.checkpoint_id_of(key[key.find(layout.CHECKPOINTS_DIR):])
    if expected is not None and commit.id != expected:
        raise damaged(f"it holds checkpoint {commit.id}")
    return commit, reused
