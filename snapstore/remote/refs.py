"""Stream refs: the one mutable object per stream of an S3 store, and the commit point.

A ref is JSON {"stream", "head", "seq", "live", "tags", "writer", "serial"}; it is created
with If-None-Match: * and advanced with If-Match: <etag> (docs/design.md, "S3 stores")."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from snapstore.errors import CorruptionError
from snapstore.remote import layout
from snapstore.remote.s3client import NotFound, PreconditionFailed, S3Client


@dataclass
class Ref:
    stream: str
    head: int | None = None
    seq: int = 0
    live: list = field(default_factory=list)          # ids, ascending
    tags: dict = field(default_factory=dict)          # id -> [tags]
    writer: str = ""
    serial: int = 0
    etag: str | None = None                           # None: not in the bucket yet

    def encode(self) -> bytes:
        return json.dumps({"stream": self.stream, "head": self.head, "seq": self.seq,
                           "live": self.live,
                           "tags": {str(k): v for k, v in sorted(self.tags.items()) if v},
                           "writer": self.writer, "serial": self.serial},
                          separators=(",", ":")).encode()

    def advanced(self, writer: str, serial: int, **changes) -> "Ref":
        """A copy with `changes`, written by (writer, serial), not yet in the bucket."""
        return replace(self, writer=writer, serial=serial, etag=None, **changes)


class RefMoved(Exception):
    """A conditional write of a ref lost: `current` is the ref as it is now."""

    def __init__(self, current: Ref) -> None:
        super().__init__(current.stream)
        self.current = current


def decode(data: bytes, etag: str, key: str) -> Ref:
    try:
        d = json.loads(data)
        live = [int(i) for i in d["live"]]
        head = d["head"]
        ref = Ref(str(d["stream"]), None if head is None else int(head), int(d["seq"]),
                  sorted(live), {int(k): [str(t) for t in v] for k, v in d["tags"].items()},
                  str(d.get("writer", "")), int(d.get("serial", 0)), etag)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptionError(f"stream ref {key!r} is damaged: {exc}") from None
    if (ref.head is None) != (not ref.live) or (ref.head is not None and ref.head != live[-1]):
        raise CorruptionError(f"stream ref {key!r} is damaged: its head is not its newest "
                              "live checkpoint")
    return ref


def read(client: S3Client, stream: str) -> Ref:
    """The stream's ref as the bucket holds it (an empty Ref without etag if none)."""
    key = layout.ref_key(stream)
    try:
        data, etag = client.get(key)
    except NotFound:
        return Ref(stream)
    ref = decode(data, etag, key)
    if ref.stream != stream:
        raise CorruptionError(f"stream ref {key!r} is damaged: it names stream {ref.stream!r}")
    return ref


def write(client: S3Client, old: Ref, new: Ref) -> Ref:
    """Replaces `old` (as read, with its etag) by `new`, conditionally; returns `new` with its
    etag. Raises RefMoved(current) when another writer changed the ref since `old` was read
    (a retry of this very write that had landed counts as success)."""
    key = layout.ref_key(new.stream)
    try:
        if old.etag is None:
            etag = client.put(key, new.encode(), if_none_match=True)
        else:
            etag = client.put(key, new.encode(), if_match=old.etag)
        return replace(new, etag=etag)
    except (PreconditionFailed, NotFound):
        current = read(client, new.stream)
        if current.writer == new.writer and current.serial == new.serial and new.writer:
            return current          # our write landed; the 412 answered a retry of it
        raise RefMoved(current) from None


class NotOnParent(Exception):
    """advance() found the stream's head is not the parent the checkpoint was made on."""

    def __init__(self, current: Ref) -> None:
        super().__init__(current.stream)
        self.current = current


def advance(client: S3Client, stream: str, checkpoint_id: int, parent: int | None, seq: int,
            writer: str, serial: int) -> Ref:
    """Commits checkpoint `checkpoint_id` (its object exists) as the stream's new head, only
    if the head is still `parent`: reads the ref, writes it If-Match. Already committed (the
    ref lists it: a replay after the write landed) -> the ref as it is. Raises NotOnParent
    (the head moved, or it moved while writing: RefMoved's current)."""
    ref = read(client, stream)
    if checkpoint_id in ref.live:
        return ref
    if ref.head != parent:
        raise NotOnParent(ref)
    new = ref.advanced(writer, serial, head=checkpoint_id, seq=max(seq, ref.seq + 1),
                       live=ref.live + [checkpoint_id])
    try:
        return write(client, ref, new)
    except RefMoved as moved:
        raise NotOnParent(moved.current) from None
