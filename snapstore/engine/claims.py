"""Operations in progress (format 3, many writers): what a writer claims in the index before it
makes an index record durable in its own log (docs/design.md, "Many writers").

Every commit, delete and tag is three steps: claim (one short index transaction), make the
record durable in the writer's own log (no lock: writers fsync in parallel), publish (one
short index transaction applies the record and drops the claim). The claim is what makes the
protocol safe:

  * It is the conflict check. A commit claims its stream: it fails with CommitConflict unless
    the stream's head is still the one the commit was made against and no other commit of the
    stream is claimed. A delete or tag claims its checkpoints: it fails unless they exist, no
    other delete or tag of them is claimed and no claimed commit builds on them. So a record
    that reaches the log has already won, and recovery applies it without a decision.
  * It allocates the record's order (and a commit's id and seq), a store-wide number: records
    of all logs applied in order give the index state the live path reached, because claims
    that are in progress at the same time never touch the same stream or checkpoint (they
    commute).
  * It pins the chunks the operation reuses (chunks already in the index that its extents
    name): garbage collection keeps pinned chunk entries (compact.py). A commit planned on a
    snapshot taken before a collection that removed a chunk it reused learns so from the GC
    generation and re-checks its chunks (ChunksVanished: the commit is planned again).
  * It names its holder: the log of the claiming writer (whose lock file the writer holds
    while alive: logowners.py), pid and host. A claim whose log's lock is free belongs to a
    dead writer: whoever meets it recovers that log (recovery.recover_log), which publishes
    the claimed records that reached the log and drops the other claims.

Functions here run inside the caller's index transaction; they never wait.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Callable

from snapstore.engine import format as fmt
from snapstore.engine.index import IndexView, IndexWriter, damaged
from snapstore.errors import CommitConflict

KINDS = ("commit", "delete", "tag", "group")


@dataclass
class Claim:
    """One operation in progress."""
    order: int
    kind: str                     # KINDS
    log: int                      # the claiming writer's log
    stream: str | None = None     # commit, group: the stream it extends
    parent: int | None = None     # commit, group: the head it builds on
    id: int | None = None         # commit: the id it will have
    seq: int | None = None        # commit: its seq
    ids: list = field(default_factory=list)    # delete, tag: the checkpoints it changes
    group: str | None = None      # commit, group: the group it commits
    records: int = 1              # how many log records carry its order (a delete_many: one
                                  # per checkpoint; recovery applies them only all together)
    deadline: float | None = None  # group: after it the group can no longer commit
    pid: int | None = None
    host: str | None = None
    since: float | None = None
    pins: bytes = b""             # packed chunk ids it reuses

    def to_json(self) -> dict:
        d = {"kind": self.kind, "log": self.log, "pid": self.pid, "host": self.host,
             "since": self.since}
        for key in ("stream", "parent", "id", "seq", "group", "deadline"):
            value = getattr(self, key)
            if value is not None:
                d[key] = value
        if self.ids:
            d["ids"] = list(self.ids)
        if self.records != 1:
            d["records"] = self.records
        return d

    @classmethod
    def from_json(cls, order: int, d: dict, pins: bytes) -> "Claim":
        kind = d["kind"]
        if kind not in KINDS or not isinstance(d["log"], int):
            raise ValueError(f"not a claim: {d!r}")
        records = d.get("records", 1)
        if not isinstance(records, int) or records < 1:
            raise ValueError(f"not a claim: {d!r}")
        return cls(order, kind, d["log"], d.get("stream"), d.get("parent"), d.get("id"),
                   d.get("seq"), list(d.get("ids", [])), d.get("group"), records,
                   d.get("deadline"), d.get("pid"), d.get("host"), d.get("since"), pins)

    @property
    def holder(self) -> str:
        """Who holds it, in words."""
        here = not self.host or self.host == os.uname().nodename
        if here and self.pid == os.getpid():
            # another thread of this process: an earlier save not yet finished (a
            # dcp.async_save whose future is still pending), not another writer
            return f"this process (pid {self.pid}, log {self.log}: another of its threads)"
        where = "" if here else f" on host {self.host}"
        return f"pid {self.pid}{where} (log {self.log})"

    def describe(self) -> str:
        if self.kind == "commit":
            return f"a commit of stream {self.stream!r} by {self.holder}"
        if self.kind == "group":
            return f"group {self.group} of stream {self.stream!r} by {self.holder}"
        return f"a {self.kind} of checkpoint(s) {self.ids} by {self.holder}"


class DeadHolder(Exception):
    """A conflicting claim belongs to a writer that died (its log's lock is free): recover
    that log (recovery.recover_log), then try again. Internal: never reaches the user."""

    def __init__(self, log: int) -> None:
        super().__init__(f"log {log} belongs to a dead writer")
        self.log = log


class ChunksVanished(Exception):
    """Garbage collection removed a chunk the operation reused after it was planned: plan it
    again (the chunk is then stored anew). Internal: never reaches the user."""


def claims(view: IndexView) -> list[Claim]:
    """Every operation in progress."""
    out = []
    for order, d, pins in view.claims():
        try:
            out.append(Claim.from_json(order, d, pins))
        except (KeyError, TypeError, ValueError) as exc:
            raise damaged(f"claim {order} does not decode: {exc!r}") from exc
    return out


def pinned_chunks(view: IndexView) -> set[bytes]:
    """The chunk ids every operation in progress (claims, staged group parts) reuses: garbage
    collection must keep their entries."""
    out: set[bytes] = set()
    for c in claims(view):
        out.update(unpack_ids(c.pins))
    for _, d, blob in view.group_entries():
        pins = d.get("pins")
        if pins:
            start, length = pins
            out.update(unpack_ids(blob[start:start + length]))
    return out


def pack_ids(ids) -> bytes:
    return b"".join(ids)


def unpack_ids(blob: bytes) -> list[bytes]:
    n = fmt.CHUNK_ID_BYTES
    return [blob[i:i + n] for i in range(0, len(blob) - len(blob) % n, n)]


def group_key(group: str, participant: str = "") -> bytes:
    """A group's key in DB_GROUPS: its header (participant "") and its parts."""
    return group.encode() + b"\0" + participant.encode()


def drop(w: IndexWriter, c: Claim) -> None:
    """Drops a claim, and the group it opens or commits."""
    release(w, c.order)
    if c.group is not None:
        w.delete_group_entries(group_key(c.group))


def of_group(view: IndexView, group: str) -> list[Claim]:
    """The claims of `group`: its group claim while it is open, or the commit claim that
    replaced it while it is being committed (never both: groups.commit_group swaps them in
    one transaction, and back again when the commit fails)."""
    return [c for c in claims(view) if c.group == group]


def drop_abandoned_groups(w: IndexWriter) -> int:
    """Drops the groups that can never commit (a writer's open and compaction do this: the
    parts of a group keep compaction off their segments until the group is dropped): those
    whose group claim's deadline passed (as the claim checks drop the ones they meet), and
    the entries of groups no claim holds (neither a group claim nor a commit of the group:
    left by an older version, whose failed group commit released the group's claim but kept
    its entries). Returns how many groups were dropped."""
    found = claims(w)
    live = _without_expired(w, found)
    dropped = len(found) - len(live)
    held = {c.group.encode() for c in live if c.group is not None}
    orphans = {key.partition(b"\0")[0] for key, _, _ in w.group_entries()} - held
    for group in orphans:
        w.delete_group_entries(group + b"\0")
    return dropped + len(orphans)


def _without_expired(view: IndexView, found: list[Claim]) -> list[Claim]:
    """found without the claims of groups whose deadline passed (they can no longer commit);
    in a write transaction those are dropped, with their groups."""
    now = time.time()
    out = []
    for c in found:
        if c.kind == "group" and c.deadline is not None and now > c.deadline:
            if isinstance(view, IndexWriter):
                drop(view, c)
            continue
        out.append(c)
    return out


def _check_alive(found: list[Claim], alive: Callable[[int], bool]) -> None:
    for c in found:
        if not alive(c.log):
            raise DeadHolder(c.log)


def _holder_fields() -> dict:
    return {"pid": os.getpid(), "host": os.uname().nodename[:128], "since": time.time()}


def check_stream(view: IndexView, stream: str, expected: int | None,
                 alive: Callable[[int], bool], *, group: str | None = None) -> None:
    """Raises CommitConflict unless `stream`'s head is `expected` (None: the stream has no
    checkpoint) and no other operation is claimed on it (a claim of `group` itself is not
    another's). Raises DeadHolder for a conflicting claim of a dead writer."""
    found = _without_expired(view, claims(view))
    busy = [c for c in found if c.kind in ("commit", "group") and c.stream == stream
            and not (group is not None and c.group == group)]
    _check_alive(busy, alive)
    if busy:
        c = busy[0]
        raise CommitConflict(f"stream {stream!r} has {c.describe()} in progress: this commit "
                             "did not happen (the stream's other writer wins; read its new "
                             "head and retry)", stream=stream, expected=expected,
                             found=view.stream_head(stream), holder=c.holder)
    head = view.stream_head(stream)
    if head != expected:
        what = "has no checkpoint" if head is None else f"has head {head}"
        made = "an empty stream" if expected is None else f"head {expected}"
        named = None if expected is None else view.checkpoint(expected)
        if expected is not None and (named is None or named.stream != stream):
            # an expected head that is no checkpoint of the stream: no other writer needed
            why = ("which is no checkpoint of this store (never made, or deleted)"
                   if named is None else f"which is a checkpoint of stream {named.stream!r}")
            raise CommitConflict(f"stream {stream!r} {what}, but this commit was made against "
                                 f"head {expected}, {why}: this commit did not happen",
                                 stream=stream, expected=expected, found=head)
        raise CommitConflict(f"stream {stream!r} {what}, but this commit was made against "
                             f"{made}: another writer committed (or deleted) meanwhile, so "
                             "this commit did not happen (read the new head and retry)",
                             stream=stream, expected=expected, found=head)
    if expected is not None:
        deleting = [c for c in found if c.kind == "delete" and expected in c.ids]
        _check_alive(deleting, alive)
        if deleting:
            raise CommitConflict(f"stream {stream!r}'s head {expected} is being deleted "
                                 f"({deleting[0].describe()}): this commit did not happen",
                                 stream=stream, expected=expected, found=head,
                                 holder=deleting[0].holder)


def check_checkpoints(view: IndexView, ids, what: str, alive: Callable[[int], bool]) -> None:
    """Raises CommitConflict when another delete or tag of one of `ids` is claimed, or a
    claimed commit or group builds on one of them. DeadHolder for a dead writer's claim."""
    wanted = set(ids)
    busy = [c for c in _without_expired(view, claims(view))
            if (c.kind in ("delete", "tag") and wanted & set(c.ids))
            or (c.kind in ("commit", "group") and c.parent in wanted)]
    _check_alive(busy, alive)
    if busy:
        c = busy[0]
        raise CommitConflict(f"cannot {what} checkpoint(s) {sorted(wanted)} now: "
                             f"{c.describe()} is in progress (retry once it is done)",
                             holder=c.holder)


def check_pins(view: IndexView, pins, planned_generation: int) -> None:
    """Raises ChunksVanished when garbage collection ran since the operation was planned
    (another GC generation) and removed one of the chunks it reuses."""
    if view.gc_generation() == planned_generation:
        return                      # no chunk entry was deleted since: all still there
    for cid in pins:
        if not view.has_chunk(cid):
            raise ChunksVanished()


def claim(w: IndexWriter, kind: str, log: int, **fields) -> Claim:
    """Records a claim (the caller checked for conflicts in the same transaction) and
    allocates its order; for a commit also its id and seq (pass stream). Returns it."""
    pins = fields.pop("pins", b"")
    c = Claim(w.take_order(), kind, log, pins=pins, **fields, **_holder_fields())
    if kind == "commit":
        c.id = w.next_id()
        w.set_next_id(c.id + 1)
        c.seq = w.stream_seq(c.stream) + 1
    w.put_claim(c.order, c.to_json(), pins)
    return c


def release(w: IndexWriter, order: int) -> None:
    """Drops a claim (published or abandoned)."""
    w.delete_claim(order)


def claims_of_log(view: IndexView, log: int) -> list[Claim]:
    return [c for c in claims(view) if c.log == log]
