"""The writers' and the caches' side of garbage collection (docs/design.md, "Garbage
collection"; gc.py's docstring holds the safety argument rules W1-W3 below are part of).

One Guard per open S3 store:
- refresh(index), at a commit's start (follow(index) at every pull: the same, but a
  damaged mark stops no read): reads gc/pending.json (a conditional GET by etag: no body
  unless it changed). When it changed, the cache follows it: a chunk entry of the cache
  index lying in a segment the mark names, or in one missing from the bucket, is dropped
  when no cached checkpoint uses it, and moved to where the objects of the cached
  checkpoints (and their delta ancestors) locate it otherwise. (A chunk can lie in several
  segments: writers that never saw each other's chunks each wrote it. The cache keeps the
  location it learnt first, which gc may delete while a live checkpoint's objects name
  another.) So a cache neither plans with nor reads from a segment gc may delete, a machine
  back after a long time included;
- begin(index) -> CommitTicket, at a commit's start: refresh, and the start time s;
- check(index, log, backend, ticket, new_chunks, reused), after the commit's uploads and
  before it creates its checkpoint object: reads the mark again. (W0) with no mark, a
  reused chunk in another log's segment missing from the bucket (another session of this
  cache directory, durability "local", has not uploaded it): the segment goes to
  unreusable() and Replan is raised, so the commit stores those chunks anew. (W1) a
  reused chunk in a segment the mark names or that is missing from the bucket: the cache
  follows the mark as above; a chunk a cached checkpoint uses that no object locates elsewhere (a checkpoint
  committed after the mark was made uses the marked segment: legal, gc will find it
  reachable, but this commit must not count on that) has its record copied into this
  writer's log and uploaded, and its entry moved to the copy; the commit's own new chunks
  are kept in the cache index (the next plan reuses them instead of uploading them again);
  and Replan is raised: the commit plans again, so it writes the chunks the cache no
  longer offers anew into its own log. (W2) one of the commit's own new segments is named
  by the mark: CommitConflict (the commit took too long); for a group's commit, whose new
  segments (its parts') were uploaded before its start s, also one missing from the bucket
  (staged=True: a HEAD for each one not seen under the mark; the argument in gc.py needs
  the commit's own segments to come after s, or to be present and unnamed at r). Then W3.
  Sets ticket.next_id, the lowest id the checkpoint may take;
- check_deadline(ticket), just before the ref write: (W3) CommitConflict when more than
  g / 2 passed since s, g the smallest grace of the marks read during the commit (the
  default, layout.DEFAULT_GC_GRACE_SECONDS, when there was none).
Segments seen in the bucket are remembered while the mark stays the same (etag): gc
deletes only what the current mark, or its replacement, names (gc.py), so a segment that
existed under an unchanged mark not naming it exists still.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from snapstore.engine import chunks
from snapstore.engine import format as fmt
from snapstore.engine.backends.base import SegmentBackend
from snapstore.engine.index import ChunkEntry, Index
from snapstore.engine.wal import SegmentLog, log_of
from snapstore.errors import CommitConflict, CorruptionError
from snapstore.remote import gcmark, layout, reach, sync
from snapstore.remote.s3client import S3Client


class Replan(Exception):
    """Internal: the commit reused chunks gc may delete; the cache no longer offers them, so
    the commit must be planned again."""


@dataclass
class CommitTicket:
    started: float          # time.monotonic() at the commit's start
    grace: float            # the smallest grace of the marks read during the commit
    next_id: int = 0        # the largest next_id of those marks
    replanned: bool = False  # Replan was raised: the commit is being planned again

    def note(self, mark: gcmark.Mark | None) -> None:
        self.grace = min(self.grace, gcmark.writers_grace(mark))
        if mark is not None:
            self.next_id = max(self.next_id, mark.next_id)


class Guard:
    """See the module docstring. Thread-safe."""

    def __init__(self, client: S3Client) -> None:
        self.client = client
        self.mark: gcmark.Mark | None = None
        self._read = False
        self._present: set[int] = set()     # segments seen in the bucket under self.mark
        self._unreusable: set[int] = set()  # another session's segments not in the bucket
        self._lock = threading.Lock()
        self.stats = {"marks": 0, "dropped": 0, "relocated": 0, "unresolved": 0,
                      "copied": 0, "replans": 0}

    # ---- following the mark -----------------------------------------------------------------
    def refresh(self, index: Index, *, damaged_ok: bool = False) -> gcmark.Mark | None:
        """The mark in the bucket now; when it changed, the cache follows it first. A
        damaged mark raises CorruptionError, or with damaged_ok leaves all as it was."""
        with self._lock:
            try:
                mark = gcmark.read(self.client, self.mark if self._read else None)
            except CorruptionError:
                if damaged_ok:
                    return self.mark
                raise
            if self._read and mark is self.mark:
                return mark
            self.mark, self._read, self._present = mark, True, set()
            if mark is not None:
                self.stats["marks"] += 1
                self._present = {n for n in (layout.segment_of(o.key) for o in
                                             self.client.list(layout.SEGMENTS_DIR))
                                 if n is not None} - mark.segments
                with index.read() as r:
                    used = {entry.segment for _, entry in r.chunks()}
                self._follow(index, {n for n in used if not self._usable(n)})
            return mark

    def follow(self, index: Index) -> None:
        """refresh() for a pull: a damaged mark does not stop reads (commits and gc report
        it: they cannot go on without knowing what gc may delete)."""
        self.refresh(index, damaged_ok=True)

    def unreusable(self) -> frozenset:
        """Segments a commit must not reuse chunks from (W0 in check): another session's,
        found missing from the bucket while no gc ran. For this Store's lifetime (a session
        that uploads them later only costs a commit here the dedup)."""
        with self._lock:
            return frozenset(self._unreusable)

    def _usable(self, segment: int, own_log: int | None = None) -> bool:
        """Whether the current mark leaves the segment alone and it is in the bucket. With no
        mark (no gc ever ran: nothing was deleted) a segment of own_log, the asking writer's
        log, is taken as uploaded (or queued before its commit's ref write); another log's
        is looked for, as under a mark: another Store on this cache directory with
        durability "local" may not have uploaded it yet, or may have died before it did."""
        if self.mark is not None and segment in self.mark.segments:
            return False
        if segment in self._present:
            return True
        if self.mark is None and (own_log is None or log_of(segment) == own_log):
            return True
        if self.client.head(layout.segment_key(segment)) is None:
            return False
        self._present.add(segment)
        return True

    def _follow(self, index: Index, bad: set[int]) -> set[bytes]:
        """Drops the cache's chunk entries in `bad` segments that no cached checkpoint uses;
        moves the others to where the checkpoint objects locate them in a usable segment.
        Returns the chunk ids left in `bad` segments (used, and located nowhere else)."""
        if not bad:
            return set()

        def scan() -> tuple[set, set]:
            unused, used = set(), set()
            with index.read() as r:
                for cid, entry in r.chunks():
                    if entry.segment in bad:
                        (used if entry.refs else unused).add(cid)
            return unused, used
        unused, used = scan()
        where: dict[bytes, tuple] = {}
        if used:
            sync.pull_all(self.client, index)       # the cached checkpoints as refs say now
            unused, used = scan()
            with index.read() as r:
                ids = r.checkpoint_ids()
            usable: dict[int, bool] = {n: False for n in bad}
            for commit, reused in reach.chains(self.client, ids).values():
                for loc in reach.chunk_locations(commit, reused):
                    if loc[0] in used and loc[0] not in where:
                        if loc[1] not in usable:
                            usable[loc[1]] = self._usable(loc[1])
                        if usable[loc[1]]:
                            where[loc[0]] = loc
        with index.write() as w:
            dropped = relocated = 0
            for cid in unused:
                entry = w.chunk(cid)
                if entry is not None and entry.segment in bad and not entry.refs:
                    w.delete_chunk(cid)
                    dropped += 1
            for cid, (_, seg, off, stored, raw, codec) in where.items():
                entry = w.chunk(cid)
                if entry is not None and entry.segment in bad:
                    w.put_chunk(cid, ChunkEntry(seg, off, stored, raw, entry.refs, codec))
                    relocated += 1
            if dropped:
                w.bump_gc_generation()
        self.stats["dropped"] += dropped
        self.stats["relocated"] += relocated
        self.stats["unresolved"] += len(used) - len(where)
        return used - where.keys()

    def _copy(self, index: Index, log: SegmentLog, backend: SegmentBackend,
              cids: set[bytes], bad: set[int]) -> None:
        """Copies the records of chunks `cids` (cache entries in `bad` segments) into this
        writer's log, uploads them, and moves the entries to the copies (as compaction
        moves chunks). CorruptionError when a record cannot be read (its segment is gone:
        a checkpoint that needs it lost it)."""
        with index.read() as r:
            todo = sorted(((e.segment, e.offset, cid, e.stored_len) for cid in cids
                           if (e := r.chunk(cid)) is not None and e.segment in bad))
        mark = log.position
        moves = []
        try:
            with backend.open_reader() as segments:
                for number, offset, cid, stored_len in todo:
                    chunk = chunks.read_stored_chunk(segments, number, offset, stored_len, cid)
                    seg, off = log.append(fmt.REC_CHUNK, chunk.record.codec,
                                          [fmt.CHUNK_PREFIX.pack(cid, chunk.raw_len),
                                           chunk.stored])
                    moves.append((cid, seg, off))
            log.seal()
        except BaseException:
            log.rollback(mark)
            raise
        backend.wait_uploaded()
        with index.write() as w:
            for cid, seg, off in moves:
                e = w.chunk(cid)
                if e is not None and e.segment in bad:
                    w.put_chunk(cid, e._replace(segment=seg, offset=off))
        self.stats["copied"] += len(moves)

    # ---- commits --------------------------------------------------------------------------
    def begin(self, index: Index) -> CommitTicket:
        """At a commit's start (before it plans): follows the mark; the commit's ticket."""
        started = time.monotonic()
        ticket = CommitTicket(started, layout.DEFAULT_GC_GRACE_SECONDS)
        ticket.note(self.refresh(index))
        return ticket

    def check(self, index: Index, log: SegmentLog, backend: SegmentBackend,
              ticket: CommitTicket, new_chunks: bytes, reused: bytes, *,
              staged: bool = False) -> None:
        """After the commit's uploads, before its checkpoint object: W1, W2, W3 (module
        docstring). staged: the new chunks were uploaded before the commit's start (a
        group's parts), so W2 also refuses a new segment missing from the bucket. Raises
        Replan or CommitConflict; sets ticket.next_id."""
        mark = self.refresh(index)
        ticket.note(mark)
        own = {loc[1] for loc in fmt.NEW_CHUNK.iter_unpack(new_chunks)}
        if mark is not None:
            if staged:
                with self._lock:
                    gone = sorted(n for n in own if not self._usable(n))
                if gone:
                    raise CommitConflict(
                        "garbage collection marked or deleted segments the group's parts "
                        f"uploaded ({', '.join(map(str, gone))}; grace {mark.grace:g} s): "
                        "the parts were staged too long ago; nothing was committed; stage "
                        "them again and commit")
            elif own & mark.segments:
                raise CommitConflict(
                    "the checkpoint took so long that garbage collection marked segments it "
                    f"uploaded (grace {mark.grace:g} s): nothing was committed; try again")
        with self._lock:
            bad = {loc[1] for loc in fmt.NEW_CHUNK.iter_unpack(reused)
                   if not self._usable(loc[1], log.log)}
            if bad and mark is None:
                # (W0) no gc ran, yet a reused segment is not in the bucket: another session
                # of this cache directory (durability "local") has not uploaded it, or died
                # first. The commit must not count on it: planned again, it stores those
                # chunks anew (ChunkSink's unreusable), leaving that session's entries be
                self._unreusable |= bad
                self.stats["replans"] += 1
                raise Replan()
            if bad:
                with index.write() as w:
                    for cid, seg, off, stored, raw, codec in \
                            fmt.NEW_CHUNK.iter_unpack(new_chunks):
                        if not w.has_chunk(cid):
                            w.put_chunk(cid, ChunkEntry(seg, off, stored, raw, 0, codec))
                left = self._follow(index, bad)
                if left:
                    self._copy(index, log, backend, left, bad)
                self.stats["replans"] += 1
                raise Replan()
            if mark is not None and not staged:
                self._present.update(own)       # uploaded after the mark was listed
        self.check_deadline(ticket)

    def check_deadline(self, ticket: CommitTicket) -> None:
        """W3: CommitConflict when the commit is older than half the grace gc gives it."""
        elapsed = time.monotonic() - ticket.started
        if elapsed > ticket.grace / 2:
            raise CommitConflict(
                f"the checkpoint took {elapsed:.1f} s, more than half of garbage collection's "
                f"grace ({ticket.grace:g} s): gc may have deleted what it uploaded, so nothing "
                "was committed; try again (or run gc with a larger grace)")
