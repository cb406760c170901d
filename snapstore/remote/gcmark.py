"""The garbage collector's pending mark, gc/pending.json: what one gc run found unreachable
and old enough, which a later run deletes once the mark is due, if a fresh mark still finds
it unreachable (docs/design.md, "Garbage collection"). gc.py writes it; writers read it
before their commit point (gcguard.py).

    {"at": unix time the mark was made (the marking gc's clock),
     "grace": the run's grace: a writer that read this mark finishes a commit within
              grace / 2 of its start,
     "due": unix time from which its objects may be deleted: at + the larger of its grace
            and the grace writers assumed before it (the replaced mark's, or
            layout.DEFAULT_GC_GRACE_SECONDS when it is the first),
     "next_id": every checkpoint id below it may have been used (writers allocate >= it:
                gc deletes checkpoint objects, and an id must never be taken twice),
     "segments": [segment numbers], "checkpoints": [ids], "groups": [keys under groups/]}

A store has no mark until its first gc run; after that there is always exactly one, replaced
(If-Match) only by the run that deletes its objects. It is part of the store: writers take
"no mark" to mean that gc never ran (nothing was ever deleted), so it must never be deleted
by hand.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

from snapstore.errors import CorruptionError
from snapstore.remote import layout
from snapstore.remote.s3client import NotFound, PreconditionFailed, S3Client


@dataclass(frozen=True)
class Mark:
    at: float
    grace: float
    due: float
    next_id: int = 0
    segments: frozenset = field(default_factory=frozenset)
    checkpoints: frozenset = field(default_factory=frozenset)
    groups: frozenset = field(default_factory=frozenset)
    etag: str | None = None             # None: not in the bucket (yet)

    def encode(self) -> bytes:
        return json.dumps({"at": self.at, "grace": self.grace, "due": self.due,
                           "next_id": self.next_id, "segments": sorted(self.segments),
                           "checkpoints": sorted(self.checkpoints),
                           "groups": sorted(self.groups)}, separators=(",", ":")).encode()

    @property
    def empty(self) -> bool:
        return not (self.segments or self.checkpoints or self.groups)


class MarkRaced(Exception):
    """Another gc run replaced (or created) the mark first."""


def writers_grace(mark: Mark | None) -> float:
    """The grace a writer assumes after reading `mark` (None: no mark in the bucket)."""
    return layout.DEFAULT_GC_GRACE_SECONDS if mark is None else mark.grace


def decode(data: bytes, etag: str | None) -> Mark:
    key = layout.GC_PENDING_KEY
    try:
        d = json.loads(data)
        mark = Mark(float(d["at"]), float(d["grace"]), float(d["due"]), int(d["next_id"]),
                    frozenset(int(n) for n in d["segments"]),
                    frozenset(int(i) for i in d["checkpoints"]),
                    frozenset(str(k) for k in d["groups"]), etag)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CorruptionError(f"the gc mark {key!r} is damaged ({exc}): writers cannot know "
                              "what garbage collection may delete, so nothing commits") \
            from None
    if not mark.grace >= layout.MIN_GC_GRACE_SECONDS or not mark.due >= mark.at + mark.grace:
        raise CorruptionError(f"the gc mark {key!r} is damaged: grace {mark.grace}, at "
                              f"{mark.at}, due {mark.due}")
    return mark


def read(client: S3Client, known: Mark | None = None) -> Mark | None:
    """The mark in the bucket (None: there is none). When it is still `known` (same etag),
    returns `known` itself, fetched with a conditional GET (no body)."""
    try:
        got = client.get_if_changed(layout.GC_PENDING_KEY,
                                    known.etag if known is not None else None)
    except NotFound:
        return None
    if got is None:
        return known
    return decode(*got)


def write(client: S3Client, mark: Mark, replacing: Mark | None) -> Mark:
    """Writes `mark` in place of `replacing` (as read, with its etag; None: there was no
    mark); returns it with its etag. Raises MarkRaced when another run got there first (a
    retried write that had landed, answered 412, is told from a lost race by reading the
    mark back: `at` makes every mark's bytes unique)."""
    data = mark.encode()
    try:
        if replacing is None:
            etag = client.put(layout.GC_PENDING_KEY, data, if_none_match=True)
        else:
            etag = client.put(layout.GC_PENDING_KEY, data, if_match=replacing.etag)
    except (PreconditionFailed, NotFound):
        try:
            current, etag = client.get(layout.GC_PENDING_KEY)
        except NotFound:
            raise MarkRaced() from None
        if current != data:
            raise MarkRaced() from None
    return replace(mark, etag=etag)
