"""Typed payloads of the log's index records (commit, delete, tag) and of its state sections
(begin, checkpoint, end): encoding and decoding.

From segment version 3 on (many writers) every index record carries its order, a store-wide
number allocated when the operation was claimed (commit JSON "order", delete DELETE_ORDERED,
tag JSON "order"): rebuilding the index applies the records of all logs in that order
(record_order). A commit record is self-describing: replaying it onto the index needs nothing else from the
log (the chunk records it introduces are listed with their positions, and, format 5, the base
of each delta chunk among them). A state section's
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
    seq: int = 0               # 1, 2, 3... within the stream, in commit order (design.md)
    order: int | None = None   # the record's order (format 3 records; not in the index's JSON)
    delta_bases: bytes = b""   # packed DELTA_BASEs: the base of each new delta chunk (format 5)

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

    def identity(self) -> tuple:
        """What the checkpoint is, as nothing that happens to a store later changes it (a
        delete of its parent rebases its manifests, a compaction moves its chunks, tags come
        and go): its stream, its creation time and its buffers' names and sizes. Two records
        of one id whose identities differ are not of the same checkpoint (repair: a segment of
        another store; an S3 store's deep verify: a bucket object and the cache)."""
        return self.stream, self.created, tuple((b.name, b.size) for b in self.buffers)

    def delta_base_ids(self) -> dict[bytes, bytes]:
        """{delta chunk id: its base chunk id} of the new delta chunks."""
        return dict(fmt.DELTA_BASE.iter_unpack(self.delta_bases))

    def encode(self) -> List[bytes]:
        head = self.info_json()
        if self.order is not None:
            head["order"] = self.order
        head["new_chunks"] = len(self.new_chunks) // fmt.NEW_CHUNK.size
        if self.delta_bases:
            head["delta_bases"] = len(self.delta_bases) // fmt.DELTA_BASE.size
        js = json.dumps(head, separators=(",", ":")).encode()
        return [fmt.COMMIT_JSON_LEN.pack(len(js)), js, self.new_chunks, self.delta_bases] + \
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
            order = head.get("order")
            if order is not None:
                commit.order = non_negative_int(order)
            commit.new_chunks = bytes(payload[pos:pos + nc])
            pos += nc
            nb = non_negative_int(head.get("delta_bases", 0)) * fmt.DELTA_BASE.size
            commit.delta_bases = bytes(payload[pos:pos + nb])
            pos += nb
            for b, bj in zip(commit.buffers, head["buffers"]):
                size = bj["extents"] * fmt.EXTENT.size
                b.extents = bytes(payload[pos:pos + size])
                pos += size
            if pos != len(payload) or len(commit.new_chunks) != nc or \
                    len(commit.delta_bases) != nb:
                raise ValueError("payload length does not match its header")
            return commit
        except (ValueError, KeyError, TypeError, IndexError, struct.error) as exc:
            raise CorruptionError(f"undecodable commit record: {exc}") from exc


def encode_tag(checkpoint_id: int, tag: str, add: bool, order: int | None = None,
               batch: int = 1) -> List[bytes]:
    d = {"id": checkpoint_id, "tag": tag, "add": add}
    if order is not None:
        d["order"], d["records"] = order, batch
    return [json.dumps(d).encode()]


def decode_tag(payload: bytes) -> tuple:
    """(checkpoint id, tag, add, order or None, records in its batch) of a tag record."""
    try:
        d = json.loads(bytes(payload))
        order = d.get("order")
        return (int(d["id"]), str(d["tag"]), bool(d["add"]),
                None if order is None else non_negative_int(order),
                non_negative_int(d.get("records", 1)))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptionError(f"undecodable tag record: {exc}") from exc


def encode_delete(checkpoint_id: int, order: int | None = None, batch: int = 1) -> List[bytes]:
    if order is None:
        return [fmt.DELETE_PAYLOAD.pack(checkpoint_id)]
    return [fmt.DELETE_ORDERED.pack(checkpoint_id, order, batch)]


def decode_delete(payload: bytes) -> tuple[int, int | None, int]:
    """(checkpoint id, order or None, records in its batch) of a delete record (format <= 2:
    the id alone)."""
    try:
        if len(payload) == fmt.DELETE_ORDERED.size:
            return fmt.DELETE_ORDERED.unpack(payload)
        return fmt.DELETE_PAYLOAD.unpack(payload)[0], None, 1
    except struct.error as exc:
        raise CorruptionError(f"undecodable delete record: {exc}") from exc


def record_order(rtype: int, payload) -> tuple[int | None, int]:
    """(order, how many records carry it) of an index record (commit, delete, tag); order is
    None for a record of segment version 1 or 2. A batch (delete_many, one claim) is applied
    only whole. Raises CorruptionError when the payload does not decode."""
    if rtype == fmt.REC_COMMIT:
        return Commit.decode(bytes(payload)).order, 1
    if rtype == fmt.REC_DELETE:
        return decode_delete(payload)[1:]
    if rtype == fmt.REC_TAG:
        return decode_tag(payload)[3:]
    raise CorruptionError(f"record type {rtype} is not an index record")


@dataclass
class StateBegin:
    """What a STATE_BEGIN record says. order, next_order and logs are None in sections of
    segment versions before 3 (one log: the section covers every record before it)."""
    next_id: int
    streams: dict                     # {name: (head id, last seq)}
    checkpoints: int
    order: int | None = None          # the section's order
    next_order: int | None = None
    logs: dict | None = None          # {log: (segment, offset)}: records before it are covered


def encode_state_begin(begin: StateBegin) -> List[bytes]:
    d = {"next_id": begin.next_id, "checkpoints": begin.checkpoints,
         "streams": {name: {"head": head, "seq": seq}
                     for name, (head, seq) in begin.streams.items()}}
    if begin.order is not None:
        d["order"], d["next_order"] = begin.order, begin.next_order
        d["logs"] = {str(log): list(pos) for log, pos in sorted(begin.logs.items())}
    return [json.dumps(d, separators=(",", ":")).encode()]


def decode_state_begin(payload: bytes) -> StateBegin:
    try:
        d = json.loads(bytes(payload))
        streams = {str(name): (non_negative_int(s["head"]), non_negative_int(s["seq"]))
                   for name, s in d["streams"].items()}
        begin = StateBegin(non_negative_int(d["next_id"]), streams,
                           non_negative_int(d["checkpoints"]))
        if "order" in d:
            begin.order = non_negative_int(d["order"])
            begin.next_order = non_negative_int(d["next_order"])
            begin.logs = {}
            for log, pos in d["logs"].items():
                seg, off = pos
                begin.logs[non_negative_int(int(log))] = (non_negative_int(seg),
                                                          non_negative_int(off))
        return begin
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptionError(f"undecodable state section record: {exc}") from exc


def non_negative_int(v) -> int:
    """v if it is an int >= 0 (not a bool), else ValueError: a count or position decoded
    from JSON that a writer wrote."""
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
