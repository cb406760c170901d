"""Group commits: one checkpoint from many participants (docs/design.md, "Group commits").

A coordinator opens a group on a stream, naming its participants (DCP ranks, the operators of
a stream processor...). Each participant, in any thread, process or machine sharing the store,
stages its part: its buffers (diffed against the stream's head when the group opened) and its
meta (e.g. source offsets), made durable in its own log and registered in the index. The
coordinator then commits every part as ONE checkpoint of the stream: visible all at once or
not at all.

    open_group      one index transaction: claims the stream (claims.py: kind "group"; the
                    stream's head H is fixed, other commits of the stream conflict) and
                    records the group's header: STREAM, H, participants, deadline
    stage           chunks appended to the participant's own log (crash point
                    after_data_append, as for a checkpoint) and synced (in parallel with
                    every other participant), then one transaction registers the part (its
                    manifests, new-chunk table, page fingerprints, meta, the chunks it reuses)
                    and moves the participant's applied position past it (the part's start is
                    its log's compaction watermark until the group ends: compact.py).
                    Refused (GroupError) once a commit of the group is claimed: the parts
                    are fixed from then on
    commit_group    waits until every participant staged (or the deadline: GroupTimeout naming
                    the missing ones, the group aborted), then the commit protocol of
                    commit.py: a commit claim replacing the group's claim (re-checking the
                    parts, and the chunks the full rule's rebase reused when a GC ran), ONE
                    self-describing commit record (every part's buffers and new-chunk tables)
                    in the coordinator's log, synced, then one transaction publishes it and
                    drops the group. A failure before the publish gives the group a group
                    claim again where the commit claim is dropped: still open
    abort_group     drops the group and its claim: the staged parts are garbage (refused
                    while a commit of the group is claimed)

A group holds exactly one claim at any time (its group claim, or the commit claim that replaced
it); a group no claim holds, or past its deadline, can never commit and is dropped by a
writer's open and by compaction (claims.drop_abandoned_groups).

Crash safety follows from the commit protocol: a commit record that reached the coordinator's
log was claimed, so recovery of that log publishes it (and drops the group); a coordinator
that died before drops its group claim with the rest of its log's claims when its log is
recovered (the parts become garbage); a participant that died before registering left only
garbage, and the coordinator times out naming it. A group whose deadline passed can no longer
commit and anyone who meets it may drop it.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from snapstore.engine import claims as claim_rules
from snapstore.engine import format as fmt
from snapstore.engine import writer as wr
from snapstore.engine.commit import ANY_HEAD, Committer, count_bytes_new, io_errors, \
    reused_chunks
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.index import IndexView, IndexWriter, damaged
from snapstore.engine.records import BufferEntry, Commit
from snapstore.errors import ConcurrentCompactionError, GroupError, GroupTimeout, \
    SnapstoreError

# make_part_plans(view, stream, head id or None, head Commit or None) -> [BufferPlan]
PartPlanMaker = Callable[[IndexView, str, "int | None", "Commit | None"], list]


_key = claim_rules.group_key


# plans made again when garbage collection raced a stage or a group commit
_ATTEMPTS = 5

# The most participants a group may name (its header holds them all, in one index value).
MAX_PARTICIPANTS = 1 << 20


@dataclass
class GroupHeader:
    """A group as its header entry records it."""
    id: str
    stream: str
    parent: int | None
    participants: list
    deadline: float
    claim: int                  # the order of the group's claim

    @classmethod
    def read(cls, view: IndexView, group: str) -> "GroupHeader | None":
        for key, d, _ in view.group_entries(_key(group)):
            if key == _key(group):
                return cls(group, d["stream"], d["parent"], list(d["participants"]),
                           float(d["deadline"]), int(d["claim"]))
        return None

    def to_json(self) -> dict:
        return {"stream": self.stream, "parent": self.parent,
                "participants": self.participants, "deadline": self.deadline,
                "claim": self.claim}


@dataclass
class Part:
    """One participant's staged part."""
    participant: str
    meta: Any
    entries: list               # [BufferEntry] with extents
    new_chunks: bytes
    fingerprints: list          # [(buffer name, page size, digests)]
    pins: bytes
    bytes_new: int

    def encode(self, log: int, start: tuple, end: tuple) -> tuple[dict, bytes]:
        blob = bytearray(self.new_chunks)
        for e in self.entries:
            blob += e.extents
        fps = []
        for name, page_size, digests in self.fingerprints:
            fps.append([name, page_size, len(digests)])
            blob += digests
        pins_at = len(blob)
        blob += self.pins
        d = {"log": log, "start": list(start), "end": list(end), "meta": self.meta,
             "buffers": [e.to_json() for e in self.entries],
             "new_chunks": len(self.new_chunks) // fmt.NEW_CHUNK.size, "fps": fps,
             "pins": [pins_at, len(self.pins)], "bytes_new": self.bytes_new}
        return d, bytes(blob)

    @classmethod
    def decode(cls, participant: str, d: dict, blob: bytes) -> "Part":
        pos = d["new_chunks"] * fmt.NEW_CHUNK.size
        new_chunks = blob[:pos]
        entries = []
        for bj in d["buffers"]:
            n = bj["extents"] * fmt.EXTENT.size
            entries.append(BufferEntry.from_json(bj, blob[pos:pos + n]))
            pos += n
        fingerprints = []
        for name, page_size, n in d["fps"]:
            fingerprints.append((name, page_size, blob[pos:pos + n]))
            pos += n
        start, length = d["pins"]
        return cls(participant, d["meta"], entries, new_chunks, fingerprints,
                   blob[start:start + length], d.get("bytes_new", 0))


def parts(view: IndexView, group: str) -> dict[str, Part]:
    """{participant: Part} of the parts staged in a group so far."""
    out = {}
    for key, d, blob in view.group_entries(_key(group)):
        participant = key[len(_key(group)):].decode()
        if participant:
            try:
                out[participant] = Part.decode(participant, d, blob)
            except (KeyError, TypeError, ValueError, IndexError) as exc:
                raise damaged(f"group {group} part {participant!r} does not decode: "
                              f"{exc!r}") from exc
    return out


def _drop(w: IndexWriter, header: GroupHeader) -> None:
    w.delete_group_entries(_key(header.id))
    claim_rules.release(w, header.claim)


def _unknown(group: str, stream: str | None = None) -> GroupError:
    return GroupError(f"group {group} does not exist (any more): it was never opened, or was "
                      "committed, aborted or timed out, or its coordinator died", group=group)


_NOT_STAGED = "this part was not staged (a group's parts are fixed once its commit is claimed)"


def _being_committed(group: str, committing: claim_rules.Claim,
                     alive: Callable[[int], bool], what: str = _NOT_STAGED) -> GroupError:
    """The GroupError of a stage (or an abort, a second commit) that meets the commit claim
    of its group: the commit combines the parts staged before it claimed, so a part staged
    now would be acknowledged and never committed (the commit record, once durable, is
    published by the recovery of a coordinator that died). S3 stores refuse a late stage
    the same way."""
    if alive(committing.log):
        how = f"is being committed by {committing.holder}"
    else:
        how = (f"was being committed by {committing.holder}, which died: the recovery of its "
               "log commits the parts staged before, or drops the group")
    return GroupError(f"group {group} {how}: {what}", group=group)


def _committing(view: IndexView, group: str) -> claim_rules.Claim | None:
    """The commit claim of `group`, if it is being committed."""
    for c in claim_rules.of_group(view, group):
        if c.kind == "commit":
            return c
    return None


def _live_header(view: IndexView, group: str) -> GroupHeader:
    header = GroupHeader.read(view, group)
    if header is None:
        raise _unknown(group)
    if time.time() > header.deadline:
        raise GroupError(f"group {group} of stream {header.stream!r} timed out (its deadline "
                         f"passed {time.time() - header.deadline:.3g}s ago)", group=group)
    return header


# ---- the coordinator ---------------------------------------------------------------------------

def open_group(c: Committer, stream: str, participants: list, timeout: float,
               expect_head: Any = ANY_HEAD) -> GroupHeader:
    """Opens a group of `participants` (distinct names) on `stream`, which must not have
    another commit or group in progress (CommitConflict); the group's checkpoint will follow
    the stream's head now (or expect_head, checked). It must be committed within `timeout`
    seconds."""
    group = uuid.uuid4().hex
    with c.exclusive(), io_errors("cannot open a group"):
        with c.read() as r:
            head = r.stream_head(stream)
        if expect_head is not ANY_HEAD:
            head = expect_head
        made: list = []

        def prepare(w: IndexWriter) -> tuple:
            claim_rules.check_stream(w, stream, head, c.alive)
            return "group", {"stream": stream, "parent": head, "group": group,
                             "deadline": time.time() + timeout}

        def record(w: IndexWriter, claimed: claim_rules.Claim) -> None:
            header = GroupHeader(group, stream, head, list(participants),
                                 time.time() + timeout, claimed.order)
            w.put_group_entry(_key(group), header.to_json())
            made.append(header)
        c.claim(prepare, record)
        return made[0]


def abort_group(c: Committer, group: str) -> bool:
    """Drops the group (its parts become garbage). False if it was gone already."""
    with c.exclusive(), io_errors("cannot abort a group"):
        with c.index.write() as w:
            header = GroupHeader.read(w, group)
            if header is None:
                return False
            committing = _committing(w, group)
            if committing is not None:
                # its parts must stay until the commit ends: dropping them would let
                # compaction take the segments of a commit record that may be durable
                raise _being_committed(group, committing, c.alive, "it cannot be aborted now")
            _drop(w, header)
            return True


def wait_for_parts(c: Committer, group: str, timeout: float | None) -> dict[str, Part]:
    """The parts of every participant once all staged; waits until `timeout` seconds (None:
    the group's deadline). Raises GroupTimeout naming the missing participants (the group is
    aborted), GroupError for a group that is gone."""
    started = time.monotonic()
    pause = 0.002
    while True:
        with c.read() as r:
            header = GroupHeader.read(r, group)
            if header is None:
                raise _unknown(group)
            found = parts(r, group)
        missing = [p for p in header.participants if p not in found]
        if not missing:
            return found
        left = header.deadline - time.time()
        if timeout is not None:
            left = min(left, timeout - (time.monotonic() - started))
        if left <= 0:
            abort_group(c, group)
            raise timed_out(group, header.stream, header.participants, missing)
        time.sleep(min(pause, left))
        pause = min(pause * 2, 0.05)


# ---- what every group commit shares (this module's and remote/groups.py's) ------------------

def timed_out(group: str, stream: str, participants: list, missing: list) -> GroupTimeout:
    """The GroupTimeout of a group whose `missing` participants never staged (the caller has
    aborted it)."""
    return GroupTimeout(f"group {group} of stream {stream!r}: {len(missing)} of "
                        f"{len(participants)} participant(s) never staged their part: "
                        f"{', '.join(map(repr, missing))}; the group is aborted (nothing of "
                        "it is visible)", group=group, missing=missing)


def check_distinct(group: str, participant: str, entries: list, others: dict) -> None:
    """Raises GroupError when a buffer of `participant`'s part (its entries) has the name of
    a buffer another participant staged; others: {participant: its entries}."""
    mine = {e.name for e in entries}
    for other, theirs in others.items():
        clash = mine & {e.name for e in theirs}
        if other != participant and clash:
            raise GroupError(f"participant {participant!r} stages buffer(s) {sorted(clash)} "
                             f"which participant {other!r} staged already: buffer names must "
                             "be distinct across a group's parts", group=group)


def combine_parts(parts: list) -> tuple[list, bytes, int]:
    """The buffers of a group's checkpoint from its parts, given in participant order as
    (buffer entries, new-chunk table, chunk bytes stored): (entries, new-chunk table,
    chunk bytes). A chunk two parts both stored (the same bytes, written by two
    participants at once) is listed once, where the first part stored it; the other copy is
    garbage."""
    entries, new_chunks, seen, bytes_new = [], bytearray(), set(), 0
    for part_entries, part_new, part_bytes in parts:
        entries.extend(part_entries)
        for i in range(0, len(part_new), fmt.NEW_CHUNK.size):
            item = part_new[i:i + fmt.NEW_CHUNK.size]
            if item[:fmt.CHUNK_ID_BYTES] not in seen:
                seen.add(item[:fmt.CHUNK_ID_BYTES])
                new_chunks += item
        bytes_new += part_bytes
    return entries, bytes(new_chunks), bytes_new


def whole_if_mostly_changed(view: IndexView, parent: int | None, group: str, entries: list,
                            full_threshold: float) -> list:
    """writer.whole_if_mostly_changed for the group's checkpoint as a whole. Each part applied
    it to its own buffers when it staged; a part alone cannot see that the others changed
    nearly everything (DCP's metadata, unchanged, would keep a fully changed save
    "incremental" and grow a chain to max_chain). When more than full_threshold of the
    checkpoint's bytes are stored anyway (full buffers plus the deltas' dirty bytes), or it
    holds no bytes, the remaining deltas are rebased into full manifests: manifest work only,
    over the parent's chunks and the part's (`parent`: the checkpoint the group follows).
    Returns `entries` itself when nothing changes."""
    if parent is None or not any(e.base == "delta" for e in entries):
        return entries
    total = sum(e.size for e in entries)
    stored = sum(e.size if e.base == "full" else
                 sum(n for _, _, n, _ in fmt.EXTENT.iter_unpack(e.extents)) for e in entries)
    if total and stored <= full_threshold * total:
        return entries
    head = view.named_checkpoint(parent, f"group {group}'s parent")
    return [wr.rebase(view, head, e) if e.base == "delta" else e for e in entries]


def group_meta(group: str, parts_meta: dict, meta: Any) -> Any:
    """The meta of a group's checkpoint: the coordinator's `meta` with the reserved key
    format.GROUP_META_KEY = {"id", "parts": {participant: its meta}} (a meta that is not a
    dict, None too, goes under the reserved entry's "user", so CheckpointInfo.meta is the
    meta given, as a plain checkpoint's)."""
    reserved = {"id": group, "parts": parts_meta}
    if isinstance(meta, dict):
        return dict(meta, **{fmt.GROUP_META_KEY: reserved})
    return {fmt.GROUP_META_KEY: dict(reserved, user=meta)}


def commit_group(c: Committer, group: str, meta: Any, timeout: float | None) -> Commit:
    """Commits the group's parts as one checkpoint of its stream (see the module docstring).
    meta: the coordinator's meta; each participant's meta is kept under the reserved key
    format.GROUP_META_KEY, {"id", "parts": {participant: its meta}}.

    The commit claim replaces the group's claim in one transaction, and a failure before the
    publish puts a group claim back in the transaction that drops the commit claim
    (_reopen): the group stays open, its stream reserved, committable again or abortable
    (dropped instead if its deadline passed meanwhile). Only when even that transaction
    fails, or the log cannot be rolled back, is the commit claim left: the recovery of this
    log then publishes the record or drops the claim with the group."""
    found = wait_for_parts(c, group, timeout)
    with c.exclusive(), io_errors("group commit failed"):
        c.check_open(write=True)
        c.log.check_writable()
        for _ in range(_ATTEMPTS):
            try:
                return _commit_once(c, group, found, meta)
            except claim_rules.ChunksVanished:
                continue        # a compaction took a chunk the rebase reused: plan again
    raise ConcurrentCompactionError(f"group {group}: compaction removed chunks its commit "
                                    f"reused {_ATTEMPTS} times in a row; commit it again")


def _reopen(c: Committer, group: str) -> Callable[[IndexWriter], None]:
    """What the transaction dropping a failed group commit's claim adds: a group claim of
    this writer's log for the group again (its header naming it), so the group stays open
    and its stream reserved; a group whose deadline passed is dropped instead."""
    def reopen(w: IndexWriter) -> None:
        header = GroupHeader.read(w, group)
        if header is None or claim_rules.of_group(w, group):
            return                      # published or dropped; or (never) claimed already
        if time.time() > header.deadline:
            w.delete_group_entries(_key(group))
            return
        again = claim_rules.claim(w, "group", c.log_number, stream=header.stream,
                                  parent=header.parent, group=group,
                                  deadline=header.deadline)
        header.claim = again.order
        w.put_group_entry(_key(group), header.to_json())
    return reopen


def _commit_once(c: Committer, group: str, found: dict, meta: Any) -> Commit:
    with c.read() as r:
        header = _live_header(r, group)
        order = [found[p] for p in header.participants]
        entries, new_chunks, bytes_new = combine_parts(
            [(p.entries, p.new_chunks, p.bytes_new) for p in order])
        pins = b"".join(p.pins for p in order)
        fingerprints = [fp for p in order for fp in p.fingerprints]
        whole = whole_if_mostly_changed(r, header.parent, group, entries,
                                        c.options.full_threshold)
        # the rebase names chunks of the parent's manifests, which no part pins: the claim
        # re-checks them when a garbage collection ran since this snapshot
        generation = r.gc_generation()
    if whole is not entries:
        entries = whole
        pins = reused_chunks(entries, new_chunks)
    full_meta = group_meta(group, {p.participant: p.meta for p in order}, meta)
    log = c.log
    mark = log.position
    retired: list = []

    def prepare(w: IndexWriter) -> tuple:
        now = _live_header(w, group)
        held = claim_rules.of_group(w, group)
        committing = [h for h in held if h.kind == "commit"]
        if committing:
            raise _being_committed(group, committing[0], c.alive,
                                   "it cannot be committed twice")
        if not any(h.kind == "group" and h.order == now.claim for h in held):
            raise GroupError(f"group {group} of stream {now.stream!r} holds no claim any "
                             "more (a failed commit of an older version released it): it "
                             "cannot commit; the next compaction or open drops it",
                             group=group)
        if parts(w, group) != found:
            # staged again since they were collected: commit the parts there are now
            raise GroupError(f"group {group}: a participant staged its part again while "
                             "the group was being committed: nothing was committed; "
                             "commit the group again", group=group)
        claim_rules.check_stream(w, now.stream, now.parent, c.alive, group=group)
        claim_rules.check_pins(w, claim_rules.unpack_ids(pins), generation)
        retired[:] = [now.claim]
        return "commit", {"stream": now.stream, "parent": now.parent, "group": group,
                          "pins": bytes(pins)}

    def retire_group_claim(w: IndexWriter, claimed: claim_rules.Claim) -> None:
        claim_rules.release(w, retired[0])
    claimed = c.claim(prepare, retire_group_claim)
    reopen = _reopen(c, group)
    try:
        commit = Commit(claimed.id, header.stream, header.parent, time.time(), full_meta,
                        entries, new_chunks, seq=claimed.seq, order=claimed.order)
        count_bytes_new(commit, bytes_new)
        payload = commit.encode()
    except BaseException:
        c.release(claimed, reopen)
        raise

    def publish_extra(w: IndexWriter) -> None:
        # in the publishing transaction: the parts must still be the ones combined. A stage
        # of this group is refused while its commit is claimed (stage's register), so they
        # are; checked still, as publishing another part would commit what it replaced, or
        # chunks in removed segments
        if parts(w, group) != found:
            raise GroupError(f"group {group}: a participant staged its part again while "
                             "the group was being committed: nothing was committed; "
                             "commit the group again", group=group)
        for name, page_size, digests in fingerprints:
            w.put_fingerprints(header.stream, name, commit.id, page_size, digests)
        w.delete_group_entries(_key(group))
    try:
        c.publish([(fmt.REC_COMMIT, payload)], claimed, publish_extra, reopen)
    except BaseException:
        log.rollback(mark)
        raise
    return commit


# ---- a participant -----------------------------------------------------------------------------

def stage(c: Committer, group: str, participant: str, make_plans: PartPlanMaker,
          meta: Any) -> None:
    """Stages one participant's part (see the module docstring); make_plans(view, stream,
    head, head Commit) plans the part's buffers against the head the group follows. Staging the
    same participant again replaces its part, until the group's commit is claimed. Raises
    GroupError (unknown or timed-out group, not a participant, a buffer name another part has,
    a group being committed), StoreIOError."""
    opts = c.options
    with c.exclusive(), io_errors("staging a group part failed"):
        c.check_open(write=True)
        c.log.check_writable()
        for _ in range(_ATTEMPTS):
            log = c.log
            mark = log.position
            try:
                with c.read() as r:
                    header = _live_header(r, group)
                    committing = _committing(r, group)
                    if committing is not None:
                        raise _being_committed(group, committing, c.alive)
                    if participant not in header.participants:
                        raise GroupError(f"{participant!r} is not a participant of group "
                                         f"{group} (its participants: "
                                         f"{', '.join(map(repr, header.participants))})",
                                         group=group)
                    parent = (r.named_checkpoint(header.parent, f"group {group}'s parent")
                              if header.parent is not None else None)
                    parents = {b.name: b for b in parent.buffers} if parent else {}
                    staging = bytearray(wr.STAGING_BYTES)
                    sink = wr.ChunkSink(log, r, opts)
                    entries, fingerprints = [], []
                    for plan in make_plans(r, header.stream, header.parent, parent):
                        if plan.base == "delta":
                            plan.depth = parents[plan.name].depth + 1
                        entry = wr.store_buffer(plan, sink, staging)
                        if entry.base == "delta" and entry.depth >= opts.max_chain:
                            entry = wr.rebase(r, parent, entry)
                        entries.append(entry)
                        if plan.fingerprints is not None:
                            fingerprints.append((plan.name, opts.page_size,
                                                 bytes(plan.fingerprints)))
                    generation = r.gc_generation()
                    start = (mark[0], mark[1])
                crashpoint("after_data_append")
                new_chunks = sink.new_chunk_table()
                part = Part(participant, meta, entries, new_chunks, fingerprints,
                            reused_chunks(entries, new_chunks), sink.bytes_new)
                log.flush()
                if c.durability == "fsync":
                    log.sync()
                end = log.position

                def register(w: IndexWriter) -> None:
                    _live_header(w, group)
                    committing = _committing(w, group)
                    if committing is not None:
                        # the commit combined the parts there were when it claimed: this
                        # one would be acknowledged and never committed
                        raise _being_committed(group, committing, c.alive)
                    check_distinct(group, participant, part.entries,
                                   {o: p.entries for o, p in parts(w, group).items()})
                    claim_rules.check_pins(w, claim_rules.unpack_ids(part.pins), generation)
                    d, blob = part.encode(c.log_number, start, end)
                    w.put_group_entry(_key(group, participant), d, blob)
                    w.set_applied(end)
                with c.index.write() as w:
                    register(w)
                return
            except claim_rules.ChunksVanished:
                log.rollback(mark)
                continue
            except BaseException:
                log.rollback(mark)
                raise
        raise SnapstoreError(f"group {group}: compaction removed chunks the part reused "
                             f"{_ATTEMPTS} times in a row; retry")


def status(c: Committer, group: str) -> dict:
    """{"stream", "parent", "participants", "staged", "missing", "deadline"} of a group (or
    GroupError when it is gone)."""
    with c.read() as r:
        header = GroupHeader.read(r, group)
        if header is None:
            raise _unknown(group)
        staged = sorted(parts(r, group))
    return {"id": group, "stream": header.stream, "parent": header.parent,
            "participants": header.participants, "staged": staged,
            "missing": [p for p in header.participants if p not in staged],
            "deadline": header.deadline}
