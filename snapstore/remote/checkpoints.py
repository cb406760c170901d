"""Checkpoint objects: one immutable object per checkpoint of an S3 store.

    the framing of remote/envelope.py (magic SNAPCKPT; the header's length is the commit
    payload's) around:
    the commit payload, exactly as a commit record holds it (records.Commit.encode)
    the reused-chunk table: format.NEW_CHUNK entries locating every chunk the extents name
        that is not in the commit's own new-chunk table

With both tables a machine that never saw the checkpoints the chunks came from can apply
the checkpoint to its index and read it.
"""
from __future__ import annotations

from snapstore.engine import format as fmt
from snapstore.engine.records import Commit
from snapstore.errors import CorruptionError
from snapstore.remote import envelope, layout


def encode(commit: Commit, reused: bytes) -> bytes:
    """The object of `commit`; reused: packed NEW_CHUNK entries of its other chunks."""
    payload = b"".join(bytes(p) for p in commit.encode())
    return envelope.seal(layout.CKPT_MAGIC, layout.CKPT_VERSION, len(payload),
                         [payload, reused])


def decode(data: bytes, key: str) -> tuple[Commit, bytes]:
    """(Commit, reused-chunk table) of a checkpoint object; raises CorruptionError naming the
    key when it is damaged, FormatError when it is of a newer version."""
    what = "checkpoint object"
    head, length, tail = envelope.unseal(data, key, what, "a checkpoint object",
                                         layout.CKPT_MAGIC, layout.CKPT_VERSION)
    end = head + length
    reused = bytes(data[end:tail])
    if end > tail or len(reused) % fmt.NEW_CHUNK.size:
        raise envelope.damaged(what, key, "lengths do not match")
    try:
        commit = Commit.decode(bytes(data[head:end]))
    except CorruptionError as exc:
        raise envelope.damaged(what, key, str(exc)) from None
    expected = layout.checkpoint_id_of(key[key.find(layout.CHECKPOINTS_DIR):])
    if expected is not None and commit.id != expected:
        raise envelope.damaged(what, key, f"it holds checkpoint {commit.id}")
    return commit, reused
