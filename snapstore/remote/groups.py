"""Group commits of an S3 store: one checkpoint from many participants, on any machines that
reach the bucket (docs/design.md, "S3 stores" and "Group commits"). The same operations as
engine/groups.py, over objects under groups/<gid>/ instead of index entries:

    open_group      pulls the stream's ref (head H, etag E, seq) and creates the group's
                    header {"stream", "parent": H, "etag": E, "seq", "participants",
                    "deadline"} with If-None-Match: *
    stage           on any machine or process: reads the header, pulls H into the local
                    cache, plans against H (page diffs against H's fingerprints when this
                    cache has them), appends the chunks to this writer's own log, seals it
                    and awaits the uploads, then PUTs the part (parts.py); staging again
                    replaces it. The page fingerprints it computed wait in the cache index
                    until H's successor turns out to be this group's checkpoint holding
                    exactly this part's buffers (promote), so the participant's next part is
                    a page diff too, whichever machine it runs on
    commit_group    polls the parts (GET each missing one, backing off 0.05 -> 0.5 s) until
                    all are staged, or the deadline: then the group is aborted and
                    GroupTimeout names the missing participants; builds ONE Commit from the
                    parts (engine/groups.py's combine_parts, whole_if_mostly_changed,
                    group_meta); passes gc's guard (the parts' segments, uploaded before
                    the commit's ticket, must be unmarked and still in the bucket, else
                    CommitConflict); creates the outcome "commit" recording each part's etag
                    (If-None-Match: *: it excludes an abort); HEADs the parts again: one
                    staged again since it was collected aborts the group (the outcome is
                    replaced by "aborted", GroupError); creates the checkpoint object and
                    writes the ref with If-Match: the commit point
                    (RemoteCommitter.publish); applies it to the cache; deletes the header
                    and the parts (best effort: leftovers are garbage for gc)
    abort_group     creates the outcome "aborted" (If-None-Match: *), so late stagers and the
                    coordinator see it (GroupError), and deletes the header and the parts

The outcome object is the group's one decision: whichever of commit and abort creates it
first wins, so an abort that returned True never sees its group become visible. A stager
reads it after its PUT: "aborted", or a "commit" recording another etag for its part (the
part was overtaken), is GroupError. A stage whose PUT landed before the outcome was created
reads no outcome and succeeds; the commit then sees that part's new etag when it HEADs the
parts after creating the outcome, and aborts instead of publishing the part it collected.
So a stage that returned success is never silently replaced by an older part. The outcome
stays until gc (older than twice its grace) as the group's tombstone.

The ref write is the only commit point: a coordinator killed before it leaves nothing
visible (the group's objects and the uploaded segments are garbage), killed after it the
checkpoint is visible to every pull. The group follows H: a checkpoint committed on the
stream meanwhile (seq moved) or a delete of H makes the commit fail with CommitConflict (the
group is aborted); a tag or a delete of an older checkpoint commutes with it (the ref is
re-read and written again).
"""
from __future__ import annotations

import contextlib
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.engine.commit import ANY_HEAD, count_bytes_new, io_errors, reused_chunks
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.groups import (check_distinct, combine_parts, group_meta, timed_out,
                                     whole_if_mostly_changed)
from snapstore.engine.index import IndexWriter
from snapstore.engine.reader import buffer_layers
from snapstore.engine.records import BufferEntry, Commit
from snapstore.errors import CommitConflict, CorruptionError, GroupError, SnapstoreError
from snapstore.remote import gcguard, layout, parts, refs, sync
from snapstore.remote.committer import RemoteCommitter
from snapstore.remote.s3client import NotFound, PreconditionFailed

# make_part_plans(view, stream, head id or None, head Commit or None) -> [BufferPlan]
PartPlanMaker = Callable[[Any, str, "int | None", "Commit | None"], list]

POLL_FIRST = 0.05           # the coordinator's polling of the parts: seconds, doubling ...
POLL_MAX = 0.5              # ... up to this
REF_CHECK_SECONDS = 1.0     # while it waits, it looks whether the stream moved this often

# Page fingerprints of parts this cache's writers staged, waiting for their group's
# checkpoint (cache index, groups table): PENDING + group + NUL + participant + NUL.
PENDING = b"\0s3-staged\0"


@dataclass
class GroupHeader:
    """A group as its header object records it."""
    id: str
    stream: str
    parent: int | None          # the head H the group's checkpoint follows
    etag: str | None            # the ref's etag when the group opened (None: no ref yet)
    seq: int                    # the stream's seq then
    participants: list
    deadline: float

    def encode(self) -> bytes:
        return json.dumps({"stream": self.stream, "parent": self.parent, "etag": self.etag,
                           "seq": self.seq, "participants": self.participants,
                           "deadline": self.deadline}).encode()

    @classmethod
    def decode(cls, group: str, data: bytes, key: str) -> "GroupHeader":
        try:
            d = json.loads(data)
            parent = d["parent"]
            return cls(group, str(d["stream"]), None if parent is None else int(parent),
                       d["etag"], int(d["seq"]), [str(p) for p in d["participants"]],
                       float(d["deadline"]))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CorruptionError(f"group header {key!r} is damaged: {exc!r}") from None


def _unknown(group: str) -> GroupError:
    return GroupError(f"group {group} does not exist (any more): it was never opened, or was "
                      "committed, aborted or timed out", group=group)


def _ended(group: str, outcome: dict) -> GroupError:
    what = outcome.get("outcome")
    if what == "commit":
        return GroupError(f"group {group} was committed (or is being committed) already",
                          group=group)
    why = outcome.get("reason") or "aborted"
    return GroupError(f"group {group} was aborted ({why}): nothing of it becomes visible",
                      group=group)


def read_header(c: RemoteCommitter, group: str) -> GroupHeader:
    """The group's header; GroupError when there is none."""
    if not layout.is_group_id(group):
        raise _unknown(group)
    key = layout.group_header_key(group)
    try:
        data, _ = c.client.get(key)
    except NotFound:
        raise _unknown(group) from None
    return GroupHeader.decode(group, data, c.client.url.key(key))


def read_outcome(c: RemoteCommitter, group: str) -> dict | None:
    """The group's outcome ({"outcome": "commit" | "aborted", ...}), None while it has none."""
    key = layout.group_outcome_key(group)
    try:
        data, _ = c.client.get(key)
    except NotFound:
        return None
    try:
        doc = json.loads(data)
        if doc.get("outcome") not in ("commit", "aborted"):
            raise ValueError(doc.get("outcome"))
        return doc
    except (ValueError, TypeError, AttributeError) as exc:
        raise CorruptionError(f"group outcome {c.client.url.key(key)!r} is damaged: "
                              f"{exc!r}") from None


def _decide(c: RemoteCommitter, group: str, outcome: dict) -> dict | None:
    """Creates the group's outcome object (If-None-Match: *). None when this call decided;
    else the outcome another call decided first."""
    doc = dict(outcome, by=c.writer_id, nonce=uuid.uuid4().hex, at=time.time())
    try:
        c.client.put(layout.group_outcome_key(group), json.dumps(doc).encode(),
                     if_none_match=True)
        return None
    except PreconditionFailed:
        found = read_outcome(c, group)
        if found is not None and found.get("nonce") == doc["nonce"]:
            return None         # a retry of this very write, which had landed
        return found if found is not None else {"outcome": "aborted",
                                                "reason": "its outcome vanished"}


def _restaged(c: RemoteCommitter, header: GroupHeader,
              found: dict[str, tuple[parts.Part, str]]) -> list[str]:
    """The participants whose part object is no longer the one the commit collected (its
    etag changed): read after the outcome "commit" was created, so a stage that read no
    outcome after its PUT (and so returned success) is seen here. A part that is gone
    changed nothing (only a cleanup or gc deletes one)."""
    out = []
    for p in header.participants:
        info = c.client.head(layout.group_part_key(header.id, p))
        if info is not None and info.etag != found[p][1]:
            out.append(p)
    return out


def _retract(c: RemoteCommitter, group: str, reason: str) -> None:
    """Replaces the outcome "commit" this coordinator created, before its ref write, by
    "aborted" (If-Match: only that outcome; best effort: a group whose outcome stays
    "commit" without a ref can never commit either)."""
    with contextlib.suppress(SnapstoreError, NotFound, PreconditionFailed, ValueError,
                             AttributeError):
        data, etag = c.client.get(layout.group_outcome_key(group))
        if json.loads(data).get("outcome") == "commit":
            doc = {"outcome": "aborted", "reason": reason, "by": c.writer_id,
                   "nonce": uuid.uuid4().hex, "at": time.time()}
            c.client.put(layout.group_outcome_key(group), json.dumps(doc).encode(),
                         if_match=etag)


def _clean_up(c: RemoteCommitter, header: GroupHeader) -> None:
    """Deletes the group's header and parts (best effort: gc collects what is left)."""
    keys = [layout.group_header_key(header.id)] + \
        [layout.group_part_key(header.id, p) for p in header.participants]
    with contextlib.suppress(SnapstoreError):
        c.client.delete(keys)


def _live_header(c: RemoteCommitter, group: str) -> GroupHeader:
    """The header of a group that may still commit: GroupError when it is unknown, past its
    deadline, committed or aborted."""
    header = read_header(c, group)
    if time.time() > header.deadline:
        raise GroupError(f"group {group} of stream {header.stream!r} timed out (its deadline "
                         f"passed {time.time() - header.deadline:.3g}s ago)", group=group)
    outcome = read_outcome(c, group)
    if outcome is not None:
        raise _ended(group, outcome)
    return header


def _follows(header: GroupHeader, ref: refs.Ref) -> bool:
    """Whether the group's checkpoint may still follow the stream as the ref has it: the head
    is H and no checkpoint was committed since (tags and deletes of older checkpoints
    commute with the group)."""
    return ref.head == header.parent and ref.seq == header.seq


def _moved(header: GroupHeader, ref: refs.Ref) -> CommitConflict:
    return CommitConflict(f"stream {header.stream!r} moved since group {header.id} opened "
                          f"(head {ref.head}, seq {ref.seq}; the group follows head "
                          f"{header.parent}, seq {header.seq}): the group can never commit "
                          "and is aborted; nothing of it is visible", stream=header.stream,
                          expected=header.parent, found=ref.head)


def _conflict(c: RemoteCommitter, header: GroupHeader, ref: refs.Ref) -> CommitConflict:
    """Aborts a group whose stream moved (best effort) and returns its CommitConflict."""
    with contextlib.suppress(SnapstoreError):
        if _decide(c, header.id, {"outcome": "aborted", "reason": "its stream moved"}) is None:
            _clean_up(c, header)
    return _moved(header, ref)


# ---- the coordinator ---------------------------------------------------------------------------

def open_group(c: RemoteCommitter, stream: str, participants: list, timeout: float,
               expect_head: Any = ANY_HEAD) -> GroupHeader:
    """Opens a group of `participants` (distinct names) on `stream`, following the stream's
    head now (or expect_head, checked: CommitConflict). It must be committed within `timeout`
    seconds. Groups of one stream may be open at once: the first to commit wins, the others
    fail with CommitConflict."""
    layout.check_key_name(stream, "stream")
    for participant in participants:
        layout.check_key_name(participant, "group participant")
    with c.exclusive(), io_errors("cannot open a group"):
        ref = sync.pull_stream(c.client, c.index, stream)
        if expect_head is not ANY_HEAD and ref.head != expect_head:
            raise CommitConflict(f"stream {stream!r}: its head is {ref.head}, not the expected "
                                 f"{expect_head}", stream=stream, expected=expect_head,
                                 found=ref.head)
        header = GroupHeader(uuid.uuid4().hex, stream, ref.head, ref.etag, ref.seq,
                             list(participants), time.time() + timeout)
        try:
            c.client.put(layout.group_header_key(header.id), header.encode(),
                         if_none_match=True)
        except PreconditionFailed:
            pass        # a random id: a retry of this very write, which had landed
        return header


def abort_group(c: RemoteCommitter, group: str) -> bool:
    """Aborts the group (its parts become garbage). False if it was gone already (never
    opened, committed, aborted)."""
    with c.exclusive(), io_errors("cannot abort a group"):
        try:
            header = read_header(c, group)
        except GroupError:
            return False
        if _decide(c, group, {"outcome": "aborted", "reason": "aborted"}) is not None:
            return False
        _clean_up(c, header)
        return True


def wait_for_parts(c: RemoteCommitter, header: GroupHeader,
                   timeout: float | None) -> dict[str, tuple[parts.Part, str]]:
    """{participant: (Part, its object's etag)} once every participant staged; waits until
    `timeout` seconds (None: the group's deadline), then aborts the group and raises
    GroupTimeout naming the missing participants. GroupError when the group ended meanwhile,
    CommitConflict (the group aborted) when its stream moved."""
    group = header.id
    started = time.monotonic()
    checked = started
    pause = POLL_FIRST
    found: dict[str, tuple[parts.Part, str]] = {}
    while True:
        for p in header.participants:
            if p in found:
                continue
            key = layout.group_part_key(group, p)
            try:
                data, etag = c.client.get(key)
            except NotFound:
                continue
            part = parts.decode(data, c.client.url.key(key))
            if (part.group, part.participant, part.stream, part.parent) != \
                    (group, p, header.stream, header.parent):
                raise CorruptionError(f"group part object {c.client.url.key(key)!r} is "
                                      f"damaged: it is the part of {part.participant!r} in "
                                      f"group {part.group}, following {part.parent}")
            found[p] = (part, etag)
        missing = [p for p in header.participants if p not in found]
        if not missing:
            return found
        outcome = read_outcome(c, group)
        if outcome is not None:
            raise _ended(group, outcome)
        if time.monotonic() - checked >= REF_CHECK_SECONDS:
            checked = time.monotonic()
            ref = refs.read(c.client, header.stream)
            if not _follows(header, ref):
                raise _conflict(c, header, ref)
        left = header.deadline - time.time()
        if timeout is not None:
            left = min(left, timeout - (time.monotonic() - started))
        if left <= 0:
            outcome = _decide(c, group, {"outcome": "aborted", "reason": "timed out"})
            if outcome is not None:
                raise _ended(group, outcome)
            _clean_up(c, header)
            raise timed_out(group, header.stream, header.participants, missing)
        time.sleep(min(pause, left))
        pause = min(pause * 2, POLL_MAX)


def commit_group(c: RemoteCommitter, group: str, meta: Any, timeout: float | None) -> Commit:
    """Commits the group's parts as one checkpoint of its stream (see the module docstring).
    meta: the coordinator's meta; each participant's meta is kept under the reserved key
    format.GROUP_META_KEY, {"id", "parts": {participant: its meta}}. Raises GroupTimeout,
    GroupError (the group is gone, two parts stage one buffer name, or a part was staged
    again after the parts were collected: the group is aborted), CommitConflict (the stream
    moved since the group opened; or gc marked or deleted a part's segment: the group stays
    open, stage the parts again), RemoteError."""
    with io_errors("group commit failed"):
        c.check_open(write=True)
        header = read_header(c, group)
        outcome = read_outcome(c, group)
        if outcome is not None:
            raise _ended(group, outcome)
        found = wait_for_parts(c, header, timeout)
        if time.time() > header.deadline:
            if _decide(c, group, {"outcome": "aborted", "reason": "timed out"}) is None:
                _clean_up(c, header)
            raise GroupError(f"group {group} of stream {header.stream!r} timed out (its "
                             "deadline passed before it committed); it is aborted",
                             group=group)
    with c.exclusive(), io_errors("group commit failed"):
        order = [found[p][0] for p in header.participants]
        for i, part in enumerate(order):
            check_distinct(group, part.participant, part.entries,
                           {p.participant: p.entries for p in order[:i]})
        ref = sync.pull_stream(c.client, c.index, header.stream)
        if not _follows(header, ref):
            raise _conflict(c, header, ref)
        entries, new_chunks, bytes_new = combine_parts(
            [(p.entries, p.new_chunks, p.bytes_new) for p in order])
        with c.index.read() as r:
            entries = whole_if_mostly_changed(r, header.parent, group, entries,
                                              c.options.full_threshold)
        # gc's mark (as for a checkpoint): parts' segments it marked, or that are gone
        # from the bucket (uploaded before this commit's ticket: a mark since may have
        # forgotten them) -> CommitConflict; reused chunks in marked segments are relocated
        # (or copied) in the cache first
        ticket = c.gc_guard.begin(c.index)
        for _ in range(layout.GC_COMMIT_ATTEMPTS):
            with c.index.read() as r:
                reused = _reused(c, r, entries, new_chunks, order)
            try:
                c.gc_guard.check(c.index, c.log, c.backend, ticket, new_chunks, reused,
                                 staged=True)
                break
            except gcguard.Replan:
                continue
        else:
            raise CommitConflict(f"group {group}: garbage collection kept marking chunks it "
                                 "reused, or a part reused chunks of a segment that is not in "
                                 "the bucket (another session's, not uploaded); nothing was "
                                 "committed; try again", stream=header.stream)
        commit = Commit(0, header.stream, header.parent, time.time(),
                        group_meta(group, {p.participant: p.meta for p in order}, meta),
                        entries, new_chunks, seq=header.seq + 1)
        count_bytes_new(commit, bytes_new)
        outcome = _decide(c, group, {"outcome": "commit",
                                     "parts": {p: found[p][1] for p in header.participants}})
        if outcome is not None:
            raise _ended(group, outcome)
        restaged = _restaged(c, header, found)
        if restaged:
            _retract(c, group, "a part was staged again while it committed")
            _clean_up(c, header)
            raise GroupError(f"group {group}: {', '.join(map(repr, restaged))} staged again "
                             "after the commit collected the parts: the group is aborted "
                             "and nothing of it is visible", group=group)
        crashpoint("before_group_ref")
        try:
            c.publish(ref, commit, reused, [], still_follows=lambda now: _follows(header, now),
                      ticket=ticket)
        except CommitConflict:
            _clean_up(c, header)
            raise
        crashpoint("after_group_ref")
        with c.index.write() as w:
            promote(w, header.stream, commit.id)
        _clean_up(c, header)
        return commit


def _reused(c: RemoteCommitter, view, entries: list, new_chunks: bytes, order: list) -> bytes:
    """The reused-chunk table of the group's checkpoint: where every chunk its extents name
    that no part stored lies, from the parts' own tables (the cache index for the chunks a
    rebase brought in from the parent)."""
    known = {}
    for part in order:
        for i in range(0, len(part.reused), fmt.NEW_CHUNK.size):
            item = part.reused[i:i + fmt.NEW_CHUNK.size]
            known[bytes(item[:fmt.CHUNK_ID_BYTES])] = item
    ids = reused_chunks(entries, new_chunks)
    out, rest = [], []
    for i in range(0, len(ids), fmt.CHUNK_ID_BYTES):
        cid = ids[i:i + fmt.CHUNK_ID_BYTES]
        if cid in known:
            out.append(known[cid])
        else:
            rest.append(cid)
    if rest:
        out.append(c.reused_table(view, b"".join(rest)))
    return b"".join(out)


# ---- a participant -----------------------------------------------------------------------------

def stage(c: RemoteCommitter, group: str, participant: str, make_plans: PartPlanMaker,
          meta: Any) -> None:
    """Stages one participant's part (see the module docstring); make_plans(view, stream,
    head, head Commit) plans the part's buffers against the head the group follows. Staging
    the same participant again replaces its part. Raises GroupError (unknown, timed-out,
    aborted or committed group; not a participant), CommitConflict (the stream moved since
    the group opened: it can never commit), RemoteError, StoreIOError. That buffer names are
    distinct across the parts is checked by the commit (GroupError)."""
    with c.exclusive(), io_errors("staging a group part failed"):
        c.log.check_writable()
        header = _live_header(c, group)
        if participant not in header.participants:
            raise GroupError(f"{participant!r} is not a participant of group {group} (its "
                             f"participants: {', '.join(map(repr, header.participants))})",
                             group=group)
        ref = sync.pull_stream(c.client, c.index, header.stream)
        if not _follows(header, ref):
            raise _conflict(c, header, ref)
        with c.index.write() as w:
            promote(w, header.stream, header.parent)
        stored = c.store_chunks(header.stream, header.parent,
                                lambda view, head, parent: make_plans(view, header.stream,
                                                                      head, parent))
        part = parts.Part(group, participant, header.stream, header.parent, meta,
                          stored.entries, stored.new_chunks, stored.reused, stored.bytes_new)
        key = layout.group_part_key(group, participant)
        crashpoint("before_group_part")
        etag = c.client.put(key, parts.encode(part))
        outcome = read_outcome(c, group)
        if outcome is not None and (outcome["outcome"] != "commit"
                                    or outcome.get("parts", {}).get(participant) != etag):
            if outcome["outcome"] == "aborted":
                with contextlib.suppress(SnapstoreError):
                    c.client.delete([key])
                raise _ended(group, outcome)
            raise GroupError(f"group {group} had decided to commit before this part of "
                             f"{participant!r} was staged: your part was overtaken and is not "
                             "in the group's checkpoint (the group commits the part staged "
                             "before, or fails)", group=group)
        with c.index.write() as w:
            _keep_fingerprints(w, part, stored.fingerprints, c.options.page_size)


def status(c: RemoteCommitter, group: str) -> dict:
    """{"id", "stream", "parent", "participants", "staged", "missing", "deadline"} of a group
    (GroupError when it is gone: unknown, committed or aborted)."""
    with io_errors("cannot read a group"):
        c.check_open()
        header = read_header(c, group)
        outcome = read_outcome(c, group)
        if outcome is not None:
            raise _ended(group, outcome)
        staged = sorted(p for p in header.participants
                        if c.client.head(layout.group_part_key(group, p)) is not None)
    return {"id": group, "stream": header.stream, "parent": header.parent,
            "participants": header.participants, "staged": staged,
            "missing": [p for p in header.participants if p not in staged],
            "deadline": header.deadline}


# ---- page fingerprints of staged parts -----------------------------------------------------------

def _pending_key(group: str, participant: str) -> bytes:
    return PENDING + group.encode() + b"\0" + participant.encode() + b"\0"


def _keep_fingerprints(w: IndexWriter, part: parts.Part, fingerprints: list,
                       page_size: int) -> None:
    """Keeps the page fingerprints [(buffer, digests)] of a part this writer staged in the
    cache index until promote() meets the group's checkpoint (staging again replaces
    them)."""
    by_name = dict(fingerprints)
    buffers, blob = [], bytearray()
    for e in part.entries:
        digests = by_name.get(e.name)
        if digests is None:
            continue
        buffers.append([e.to_json(), page_size, len(digests)])
        blob += e.extents
        blob += digests
    w.delete_group_entries(_pending_key(part.group, part.participant))
    if buffers:
        w.put_group_entry(_pending_key(part.group, part.participant),
                          {"stream": part.stream, "group": part.group,
                           "parent": part.parent, "buffers": buffers}, bytes(blob))


def promote(w: IndexWriter, stream: str, head: int | None) -> None:
    """Turns the kept fingerprints of parts staged in this cache into the fingerprints of
    checkpoint `head` of the stream when it is their group's checkpoint and holds exactly
    the bytes the part staged (the same flattened manifest: a part staged again elsewhere,
    after this one, fails that test and keeps no fingerprints); the stream's other kept
    fingerprints are dropped unless their group may still commit onto `head`."""
    commit = w.checkpoint(head) if head is not None else None
    reserved = commit.meta.get(fmt.GROUP_META_KEY) if commit is not None and \
        isinstance(commit.meta, dict) else None
    made_by = reserved.get("id") if isinstance(reserved, dict) else None
    for key, d, blob in w.group_entries(PENDING):
        if d.get("stream") != stream:
            continue
        if made_by is not None and d.get("group") == made_by:
            _promote_part(w, commit, d, blob)
        elif d.get("parent") == head:
            continue            # a group on the head: it may still commit
        w.delete_group_entries(key)


def _promote_part(w: IndexWriter, commit: Commit, d: dict, blob: bytes) -> None:
    buffers = {b.name: b for b in commit.buffers}
    parent = w.checkpoint(d["parent"]) if d.get("parent") is not None else None
    pos = 0
    for bj, page_size, n in d["buffers"]:
        staged = BufferEntry.from_json(bj)
        size = bj["extents"] * fmt.EXTENT.size
        mine = ext.unpack(blob[pos:pos + size])
        digests = blob[pos + size:pos + size + n]
        pos += size + n
        have = buffers.get(staged.name)
        if have is None or have.size != staged.size or have.page_size != page_size:
            continue
        try:
            if staged.base == "full":
                want = list(mine)
            elif parent is None:
                continue
            else:
                want = list(ext.flatten(buffer_layers(w, parent, staged.name) + [mine]))
            if list(ext.flatten(buffer_layers(w, commit, staged.name))) == want:
                w.put_fingerprints(commit.stream, staged.name, commit.id, page_size, digests)
        except SnapstoreError:
            continue            # not comparable (a parent's manifest is gone): no diff base
