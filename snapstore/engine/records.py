"""Typed payloads of the log's index records (commit, delete, tag) and of its state sections
(begin, checkpoint, end): encoding and decoding.

A commit record is self-describing: replaying it onto the index needs nothing else from the
log (the chunk records it introduces are listed with their positions). A state section's
checkpoint record is a commit payload without new-chunk table (Commit.encode of the checkpoint
as the index holds it: current manifests, tags, depths, seq, parent).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any, List

from snapstore.engine import format as fmt
from snapstore.errors import CorruptionError


@dataclass
class BufferEntry:
    """One named buffer of a checkpoint."""
    name: str
    size: int
    base: str            # "full": extents cover the buffer; "delta": changes since parent
    depth: int           # deltas between this and the nearest full entry of the buffer
    layout: str          # "pages" or "cdc"
    page_size: int
    extents: bytes = b""  # packed EXTENTs (kept out of the JSON info)

    def to_json(self) -> dict:
        return {"name": self.name, "size": self.size, "base": self.base, "depth": self.depth,
                "layout": self.layout, "page_size": self.page_size,
                "extents": len(self.extents) // fmt.EXTENT.size}

    @classmethod
    def from_json(cls, d: dict, extents: bytes = b"") -> "BufferEntry":
        return cls(d["name"], d["size"], d["base"], d["depth"], d["layout"], d["page_size"],
                   extents)


@dataclass
class Commit:
    """A checkpoint as the log and the index record it."""
    id: int
    stream: str
    parent: int | None
    created: float
    meta: Any
    buffers: List[BufferEntry]
    new_chunks: bytes = b""    # packed NEW_CHUNKs: chunks first written by this checkpoint
    bytes_new: int = 0
    tags: List[str] = field(default_factory=list)
    seq: int = 0               # 1, 2, 3... within the stream, in commit order; never reused

    @property
    def kind(self) -> str:
        return "incremental" if any(b.base == "delta" for b in self.buffers) else "full"

    @property
    def chain_length(self) -> int:
        return max((b.depth for b in self.buffers), default=0)

    def info_json(self) -> dict:
        """The index's JSON record of this checkpoint (everything but the extents)."""
        return {"id": self.id, "stream": self.stream, "parent": self.parent,
                "created": self.created, "meta": self.meta, "bytes_new": self.bytes_new,
                "tags": self.tags, "seq": self.seq,
                "buffers": [b.to_json() for b in self.buffers]}

    @classmethod
    def from_info_json(cls, d: dict) -> "Commit":
        return cls(d["id"], d["stream"], d["parent"], d["created"], d["meta"],
                   [BufferEntry.from_json(b) for b in d["buffers"]],
                   bytes_new=d.get("bytes_new", 0), tags=list(d.get("tags", [])),
                   seq=d.get("seq", 0))

    def encode(self) -> List[bytes]:
        head = self.info_json()
        head["new_chunks"] = len(self.new_chunks) // fmt.NEW_CHUNK.size
        js = json.dumps(head, separators=(",", ":")).encode()
        return [fmt.COMMIT_JSON_LEN.pack(len(js)), js, self.new_chunks] + \
            [b.extents for b in self.buffers]

    @classmethod
    def decode(cls, payload: bytes) -> "Commit":
        try:
            (n,) = fmt.COMMIT_JSON_LEN.unpack_from(payload)
            start = fmt.COMMIT_JSON_LEN.size
            head = json.loads(payload[start:start + n])
            pos = start + n
            nc = head["new_chunks"] * fmt.NEW_CHUNK.size
            commit = cls.from_info_json(head)
            commit.new_chunks = bytes(payload[pos:pos + nc])
            pos += nc
            for b, bj in zip(commit.buffers, head["buffers"]):
                size = bj["extents"] * fmt.EXTENT.size
                b.extents = bytes(payload[pos:pos + size])
                pos += size
            if pos != len(payload) or len(commit.new_chunks) != nc:
                raise ValueError("payload length does not match its header")
            return commit
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            raise CorruptionError(f"undecodable commit record: {exc}") from exc


def encode_tag(checkpoint_id: int, tag: str, add: bool) -> List[bytes]:
    return [json.dumps({"id": checkpoint_id, "tag": tag, "add": add}).encode()]


def decode_tag(payload: bytes) -> tuple:
    try:
        d = json.loads(payload)
        return int(d["id"]), str(d["tag"]), bool(d["add"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptionError(f"undecodable tag record: {exc}") from exc


def encode_delete(checkpoint_id: int) -> List[bytes]:
    return [fmt.DELETE_PAYLOAD.pack(checkpoint_id)]


def decode_delete(payload: bytes) -> int:
    try:
        return fmt.DELETE_PAYLOAD.unpack(payload)[0]
    except struct.error as exc:
        raise CorruptionError(f"undecodable delete record: {exc}") from exc


def encode_state_begin(next_id: int, streams: dict, checkpoints: int) -> List[bytes]:
    """streams: {name: (head id, last seq)}."""
    return [json.dumps({"next_id": next_id, "checkpoints": checkpoints,
                        "streams": {name: {"head": head, "seq": seq}
                                    for name, (head, seq) in streams.items()}},
                       separators=(",", ":")).encode()]


def decode_state_begin(payload: bytes) -> tuple[int, dict, int]:
    """(next id, {stream: (head id, last seq)}, number of checkpoints) of a STATE_BEGIN."""
    try:
        d = json.loads(bytes(payload))
        streams = {str(name): (_uint(s["head"]), _uint(s["seq"]))
                   for name, s in d["streams"].items()}
        return _uint(d["next_id"]), streams, _uint(d["checkpoints"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptionError(f"undecodable state section record: {exc}") from exc


def _uint(v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise ValueError(f"{v!r} is not a non-negative integer")
    return v


def encode_state_end(checkpoints: int, checksum: int) -> List[bytes]:
    return [fmt.STATE_END.pack(checkpoints, checksum)]


def decode_state_end(payload: bytes) -> tuple[int, int]:
    """(number of checkpoint records, checksum) of a STATE_END."""
    try:
        return fmt.STATE_END.unpack(bytes(payload))
    except struct.error as exc:
        raise CorruptionError(f"undecodable state section end: {exc}") from exc
