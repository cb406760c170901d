"""The commit path: the one way anything is written into a store.

A Committer opens a store — the directory, its FORMAT file and the store lock (storedir: held
shared by every writer), the LMDB index, the segment backend, upgrade, the log it appends to
(logowners: a log of its own, an orphaned one it recovered, or a new one) — and owns all of it
until close(), with the staging buffer and the durability setting. Every writer goes through
its operations: store.checkpoint, the asynchronous persister (trackers and checkpoint_async),
object saves and the integrations (through store.checkpoint), delete, tag, retain, group
commits (groups.py), compaction.

    commit(stream, make_plans, meta)  stores planned buffers as the stream's next checkpoint
    commit_manifests(stream, entries, read_chunks, meta, created=, tags=)
                                      ... pre-made full manifests, asking read_chunks only for
                                      the chunks the store lacks (copy, savepoint import)
    apply_ops(make_ops)               claims, appends and applies delete and tag records
    exclusive(write)                  runs a block under the process's writer lock
    maintenance(exclusive)            ... and the store's maintenance lock (compact, verify)
    read()                            an index snapshot to plan against or read from

Many writers (format 3; docs/design.md, "Many writers"): any number of processes open a store
for writing at once, each appending to a log of its own. A commit:
  1. plans against an index snapshot: the stream's head H it builds on, the page diff against
     H's fingerprints (make_plans), then appends the new chunk records to its own log, deduped
     against the snapshot's chunks, and writes them to the segment file (after_data_append):
     a disk full fails here, before the claim. No lock but this process's.
  2. claims (one short index transaction, claims.py): fails with CommitConflict unless the
     stream's head is still H (or `expect_head`) and no other commit of the stream is in
     progress; re-checks the chunks it reused if garbage collection ran since it planned;
     allocates the record's order, the checkpoint id and seq; pins the reused chunks.
  3. appends the commit record and fdatasyncs its log, with the chunks: one sync, in parallel
     with every other writer's (after_commit_append, after_fsync; skipped with durability
     "none").
  4. publishes (one short index transaction): applies the record, stores the new page
     fingerprints, drops the claim, advances its log's applied position (before_index_commit,
     after_index_commit).
A checkpoint is visible iff step 4 happened; it is durable iff step 3 did. A writer killed
after step 3 leaves a claimed record: whoever next takes its log's lock publishes it
(recovery.py); killed before, its claim is dropped and its chunks are garbage. A failure
before step 4 completes truncates its log back to where the operation began and drops the
claim, leaving no trace; an OSError is raised as StoreIOError. Deletes and tags take steps 2
to 4 the same way (apply_ops).

LOCKING CONTRACT
  * Within a process: one lock, the writer lock, a threading.RLock owned by the Committer.
    commit(), apply_ops(), exclusive() and close() hold it for their whole run, so the
    operations of one Committer (its log) are serialised; two Stores of one process are two
    writers with two logs. Between writers (processes or Stores) nothing is held but the
    index's write lock during the short claim and publish transactions: a writer never waits
    for another's data I/O or fsync.
  * It is re-entrant: its holder (in an exclusive() block, or in a callback) may call
    commit(), apply_ops() and exclusive() again.
  * Whoever holds it must not wait for another thread that needs it. In particular callbacks
    (make_plans, make_ops, on_stored, pause) and exclusive() blocks must not wait for the
    asynchronous persister (flush, Tracker.close, a future's result...): its worker thread
    commits through this lock. `pause` may wait, but only for a bounded time.
  * The open and read-only checks run under the lock: an operation either runs on an open
    writer or raises StoreClosedError / ReadOnlyError before touching anything. close() waits
    for the operation in progress; afterwards every operation, read() included, raises
    StoreClosedError; close() again does nothing.
  * read() takes no lock: an LMDB read transaction is a consistent snapshot while writes go
    on (MVCC). Use the view only inside its with block, in the thread that opened it; it is
    not protected against close(), so close a store only once its readers are done.
  * Any thread may call any operation; the callbacks run in the calling thread.
  * Only the opening process: in a fork()ed child every operation raises ForkedStoreError
    (the locks, the LMDB environment and the descriptors are the parent's), and close() only
    marks the committer closed (after_fork_in_child, run by the Store's fork handler, gave up
    the child's copies of the lock descriptors and the writer lock a parent thread may hold).
"""
from __future__ import annotations

import contextlib
import errno
import functools
import fcntl
import os
import threading
import time
from typing import Any, Callable, Iterable, Iterator

from snapstore.engine import claims as claim_rules
from snapstore.engine import format as fmt
from snapstore.engine import indexswap
from snapstore.engine import logowners
from snapstore.engine import storedir
from snapstore.engine import unsynced
from snapstore.engine import writer as wr
from snapstore.engine.reader import ChunkReader
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.fsutil import FLOCK_TAKEN, NotRegularFile, flock_until, open_regular
from snapstore.engine.holders import clear_holder, read_holder, write_holder
from snapstore.engine.index import Index, IndexView, IndexWriter
from snapstore.engine.keyframes import KeyframeCache, no_cache_stats
from snapstore.engine.records import Commit
from snapstore.engine.recovery import recover_logs
from snapstore.engine.repair import rebuild_untrusted
from snapstore.engine.upgrade import upgrade as upgrade_store
from snapstore.engine.backends import LocalSegments, SegmentBackend
from snapstore.engine.wal import SegmentLog, logs_of
from snapstore.errors import (CommitConflict, ConcurrentCompactionError, CorruptionError,
                              ForkedStoreError, ReadOnlyError, SnapstoreError,
                              StoreClosedError, StoreIOError, StoreLocked)

# make_plans(view, head id or None, head Commit or None) -> [BufferPlan]
PlanMaker = Callable[[IndexView, "int | None", "Commit | None"], list]
# read_chunks(chunk ids) -> iterable of (chunk id, raw bytes): commit_manifests' chunk source
ChunkSource = Callable[[list], Iterable]

ANY_HEAD = object()        # commit(expect_head=ANY_HEAD): whatever head the commit is planned on
_ATTEMPTS = 5              # plans made again when garbage collection raced a commit
_DEAD_RETRIES = 20         # dead writers' logs recovered while claiming, at most


@contextlib.contextmanager
def io_errors(what: str) -> Iterator[None]:
    """Raises an OSError of the block as StoreIOError(f"{what}: reason") (snapstore's own
    errors, some of which are OSErrors, pass unchanged)."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, SnapstoreError):
            raise
        raise StoreIOError(f"{what}: {exc.strerror or exc}", exc.errno) from exc


def tagged_meanwhile(checkpoint_id: int, tags) -> None:
    """CommitConflict when a checkpoint a retain() chose to delete for having no tag has one
    now (another writer tagged it since the plan): the deletes are all or none."""
    if tags:
        raise CommitConflict(f"checkpoint {checkpoint_id} was tagged ({', '.join(tags)}) after "
                             "retain() planned to delete it for having no tag: nothing was "
                             "deleted; run retain() again")


def reused_chunks(entries, new_chunks: bytes, delta_bases: bytes = b"") -> bytes:
    """The chunk ids the extents of `entries` name, and the bases of new delta chunks
    (DELTA_BASE table), that are not among the new chunks: what a commit reuses from the
    index (and must pin), packed."""
    new = {bytes(new_chunks[i:i + fmt.CHUNK_ID_BYTES])
           for i in range(0, len(new_chunks), fmt.NEW_CHUNK.size)}
    seen: dict[bytes, None] = {}
    for entry in entries:
        for _, _, _, cid in fmt.EXTENT.iter_unpack(entry.extents):
            if cid not in new:
                seen[cid] = None
    for _, base in fmt.DELTA_BASE.iter_unpack(delta_bases):
        if base not in new:
            seen[base] = None
    return b"".join(seen)


def check_usable(path: str, opened_by: int, closed: bool, read_only_write: bool) -> None:
    """What every committer checks before an operation: ForkedStoreError in a fork()ed child
    of the process `opened_by` (unless closed there), StoreClosedError once closed,
    ReadOnlyError for a write to a reader."""
    if opened_by != os.getpid() and not closed:
        raise ForkedStoreError(
            f"store {path} was opened by process {opened_by}; this process ({os.getpid()}) is "
            "a fork()ed child of it and must not use that Store: open the store again in "
            f"the child (snapstore.open({path!r}))")
    if closed:
        raise StoreClosedError(f"store {path} is closed")
    if read_only_write:
        raise ReadOnlyError(f"store {path} was opened read-only")


def store_plans(view: IndexView, stream: str, head: int | None, make_plans: PlanMaker,
                sink: wr.ChunkSink, staging: bytearray, on_stored: dict | None,
                before_store: Callable[[wr.BufferPlan], None] | None = None
                ) -> tuple[list, list]:
    """Step 1's data part, shared by every committer: makes the plans against the snapshot
    (head: the stream's head in it) and stores them through the sink, calling
    before_store(plan) before each is stored. Returns (buffer entries, [(buffer name, page
    fingerprints)]). A delta that reaches max_chain is rebased into a full manifest, and so
    is every delta of a checkpoint that stored more than full_threshold of its bytes (the
    checkpoint-level rule writer.whole_if_mostly_changed applies when planning, for plans
    made elsewhere: an async capture stages only the changed pages, so its checkpoint is
    made full by manifest, at no byte's cost)."""
    opts = sink.opts
    parent = (view.named_checkpoint(head, f"stream {stream!r}'s head")
              if head is not None else None)
    parents = {b.name: b for b in parent.buffers} if parent else {}
    entries, fingerprints = [], []
    total = stored = 0
    for plan in make_plans(view, head, parent):
        total += len(plan.view)
        stored += len(plan.view) if plan.base == "full" else plan.nbytes
        if plan.base == "delta":
            pb = parents.get(plan.name)
            if pb is None or pb.size != len(plan.view) or pb.layout != "pages" \
                    or pb.page_size != plan.page_size:
                raise SnapstoreError(
                    f"buffer {plan.name!r} of stream {stream!r} changed under "
                    "its tracker (another writer checkpointed the stream)")
            plan.depth = pb.depth + 1
        if before_store is not None:
            before_store(plan)
        if sink.read_bases is not None:
            wr.choose_bases(view, parent, plan, opts)
        entry = wr.store_buffer(plan, sink, staging, (on_stored or {}).get(plan.name))
        if entry.base == "delta" and entry.depth >= opts.max_chain:
            entry = wr.rebase(view, parent, entry)
        entries.append(entry)
        if plan.fingerprints is not None:
            fingerprints.append((plan.name, plan.fingerprints))
    if (any(e.base == "delta" for e in entries)
            and (not total or stored > opts.full_threshold * total)):
        entries = [wr.rebase(view, parent, e) if e.base == "delta" else e for e in entries]
    return entries, fingerprints


def count_bytes_new(commit: Commit, chunk_bytes: int) -> None:
    """Sets commit.bytes_new: the chunk bytes it stored plus its commit record, whose size
    depends on bytes_new's digits (the record is encoded once, with 0; then the digits are
    iterated to the fixpoint, which takes at most three steps for a count >= 0; a negative
    one, which no caller has, would oscillate between digit counts: refused)."""
    if chunk_bytes < 0:
        raise ValueError(f"count_bytes_new: a negative byte count {chunk_bytes}")
    commit.bytes_new = 0
    rest = chunk_bytes + fmt.RECORD_HEADER.size + sum(len(p) for p in commit.encode()) - 1
    total = rest + 1
    while rest + len(str(total)) != total:
        total = rest + len(str(total))
    commit.bytes_new = total


class Committer:
    """An open store's engine side: store lock, index, backend, its own log, staging buffer,
    and the one commit path (see the module docstring for the protocol and the locking
    contract).

    Raises what opening raises (FormatError, StoreLocked, CorruptionError, StoreIOError);
    on any failure everything opened so far is released again."""

    def __init__(self, path: str, options: wr.WriteOptions, *, durability: str,
                 readonly: bool, create: bool, timeout: float, segment_size: int,
                 backend: SegmentBackend | None = None, sync_index: bool = True) -> None:
        self.path = path
        self.options = options
        self.durability = durability
        self.readonly = readonly
        self.timeout = timeout
        self.index: Index | None = None
        self.backend: SegmentBackend | None = None
        self.log: SegmentLog | None = None       # None for a reader
        self.log_number: int | None = None
        self._lock = threading.RLock()           # the writer lock (this process)
        self._maintenance_fds: set = set()       # STORE/maintenance, open while held
        self._lock_fd: int | None = None          # STORE/lock, shared (writer only)
        self._log_fd: int | None = None           # STORE/writers/<log>, exclusive
        self._staging: bytearray | None = None
        # delta_chunks' bases kept between this writer's checkpoints (None: read back)
        self._keyframes = (KeyframeCache(options.keyframe_cache_bytes)
                           if options.delta_chunks and options.keyframe_cache_bytes > 0
                           and not readonly else None)
        self._maintenance_holder: int | None = None   # thread holding it exclusively
        # orders of the claims release() could not drop (the index's write lock held by a
        # stopped writer, an I/O error): dropped by this writer's next claim
        self._unreleased: list[int] = []
        # {log: position}: other logs' records this process made durable (sync_other_logs)
        self._others_synced: dict[int, tuple[int, int]] = {}
        self._closed = False
        self._pid = os.getpid()
        # this writer's mark while its index runs without syncs (unsynced.py)
        self._mark: unsynced.Mark | None = None
        # seconds this open spent rebuilding an untrusted index (None: it found none)
        self._rebuilt_seconds: float | None = None
        durable = durability == "fsync"
        try:
            deadline = time.monotonic() + timeout
            opened = storedir.open_directory(path, create=create, readonly=readonly,
                                             timeout=timeout)
            self._lock_fd = opened.lock_fd
            self.file_mode = opened.file_mode
            if not opened.creating:
                self._rebuild_untrusted_index(deadline)
            else:
                self._discard_an_unfinished_creation(opened.file_mode)
            index_durable = durable and sync_index
            # An older format is upgraded below. Its log may lack what old compactions
            # removed, so a rebuild from it could lose checkpoints: no mark (so no rebuild)
            # until the upgrade is done; this open syncs its index at every commit, whatever
            # its durability (an unsynced index needs a mark), and the next open may mark.
            upgrading = (not readonly and not opened.creating
                         and (opened.version or 0) < fmt.FORMAT_VERSION)
            if upgrading:
                index_durable = True
            if not readonly and not index_durable and not upgrading:
                if unsynced.boot_id() is not None:
                    with io_errors(f"cannot mark the store {path} as written without syncs"):
                        self._mark = unsynced.Mark(path, opened.file_mode,
                                                   storedir.dir_mode(opened.file_mode))
                elif durable:
                    index_durable = True    # nothing could tell a reboot: sync as before
            self.index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=readonly,
                               durable=index_durable, file_mode=opened.file_mode,
                               timeout=timeout)
            self.backend = backend or LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR),
                                                    durable=durable,
                                                    file_mode=opened.file_mode)
            if opened.creating:     # the index is initialised: now it is a store
                with io_errors(f"cannot create store {path}"):
                    storedir.publish_new_store(path, opened.file_mode)
                storedir.share_lock(self._lock_fd, path)
            elif not readonly and (opened.version or 0) < fmt.FORMAT_VERSION:
                # an older format: upgrading needs the store to itself (unless another
                # writer opening at the same time upgraded it meanwhile)
                def upgraded() -> bool:
                    return storedir.read_format_file(path)["version"] >= fmt.FORMAT_VERSION
                if storedir.lock_lock(self._lock_fd, path, deadline, shared=False,
                                      unless=upgraded):
                    upgrade_store(path, self.index, self.backend)
                    storedir.share_lock(self._lock_fd, path)
                with self.index.read() as r:
                    self.index.version = r.version
            if not readonly:
                with io_errors("cannot recover the log"):
                    with logowners.choosing_a_log(path, opened.file_mode):
                        self._take_log(durable)
                    self._remove_swap_leftovers()
                    with contextlib.suppress(SnapstoreError):
                        self.drop_abandoned_groups()    # compaction's does it, or says why
                self.log = SegmentLog(self.backend, segment_size, self.log_number)
                self.log.published = self._published
                self.log.open_tail()
                self._sync_for_dead_writers()
        except BaseException:
            self._release()
            raise

    # ---- an index written without syncs (unsynced.py) -----------------------------------
    def _rebuild_untrusted_index(self, deadline: float) -> None:
        """When a writer's index ran without syncs as the machine went down, the index may
        be damaged: rebuilt from the log, holding the store to itself, before LMDB maps it.
        A reader does it too where it may write the directory (else CorruptionError)."""
        def untrusted() -> list[str]:
            with io_errors(f"cannot read the marks of {self.path}"):
                return unsynced.untrusted(self.path)
        if not untrusted():
            return
        fd = self._lock_fd
        if fd is None:
            try:
                fd = storedir.open_lock_file(self.path)
            except OSError as exc:
                raise CorruptionError(
                    f"the index of {self.path} must be rebuilt from the log (a writer had it "
                    "open without syncing its index when the machine went down), and this "
                    f"reader cannot ({exc.strerror or exc}): open the store as a writer, or "
                    "run `snapstore repair`") from None
        try:
            if storedir.lock_lock(fd, self.path, deadline, shared=False,
                                  unless=lambda: not untrusted()):
                try:
                    stale = untrusted()
                    if stale:
                        report = rebuild_untrusted(self.path)
                        self._rebuilt_seconds = report["seconds"]
                        if report["problems"]:
                            # the marks stay: every open says so until repair reports it all
                            raise CorruptionError(
                                f"the index of {self.path} was rebuilt from the log after an "
                                "unclean restart, and the log holds damage ("
                                + "; ".join(p["message"] for p in report["problems"][:3])
                                + "): run `snapstore repair` to see every problem and "
                                "accept the rebuilt index")
                        with io_errors(f"cannot remove the marks of {self.path}"):
                            unsynced.remove_untrusted(self.path, stale)
                finally:
                    if fd == self._lock_fd:
                        storedir.share_lock(fd, self.path)
        finally:
            if fd != self._lock_fd:
                os.close(fd)

    def _discard_an_unfinished_creation(self, file_mode: int) -> None:
        """A creation (no FORMAT yet) that a power cut interrupted while its creator's index
        ran without syncs left an index/ that may be damaged: nothing in it is a checkpoint
        yet (FORMAT comes last), so it is made anew, and the marks go."""
        with io_errors(f"cannot create store {self.path}"):
            stale = unsynced.untrusted(self.path)
            if stale:
                index_dir = os.path.join(self.path, fmt.INDEX_DIR)
                indexswap.remove_entry(index_dir)
                os.mkdir(index_dir, storedir.dir_mode(file_mode))
                unsynced.remove_untrusted(self.path, stale)

    def _sync_for_dead_writers(self) -> None:
        """The marks of this boot's writers that died (kill -9): what they wrote is in the
        page cache, so a sync of every log up to where the index applied it (a writer with
        durability "none" never synced its own, and this writer may have adopted it) and then
        of the index makes it durable, and their marks can go."""
        with io_errors("cannot sync what dead writers left in the index"):
            found = unsynced.orphaned(self.path)
            if found:
                try:
                    self._sync_logs_to_applied()
                    self.index.sync()
                except BaseException:
                    for _, fd in found:
                        os.close(fd)
                    raise
                unsynced.remove_orphaned(self.path, found)

    def _sync_logs_to_applied(self) -> None:
        """Syncs every log's segments up to the position the index applied of it (and the
        segments directory): before an index written without syncs is synced, so that it
        never reaches the disk ahead of records a writer with durability "none" (this one,
        one it recovered, or a dead one) left unsynced. Raises OSError."""
        with self.index.read() as r:
            applied = r.logs()
        numbers = logs_of(self.backend.list())
        for log, (last, _) in applied.items():
            for number in numbers.get(log, ()):
                if number <= last:
                    self.backend.sync_segment(number)
        self.backend.sync_directory()

    def _remove_mark(self, keep: bool = False) -> None:
        """At close: the index synced, this writer's mark removed. A failure, or keep=True,
        keeps the mark (the next writer syncs and removes it; after a reboot, the index is
        rebuilt)."""
        mark, self._mark = self._mark, None
        if mark is None:
            return
        try:
            if keep:
                return
            if self.index is not None:
                self.index.sync()
            mark.remove()           # (no index: this writer never wrote to it)
        except (SnapstoreError, OSError):
            pass
        finally:
            mark.let_go()

    def _published(self) -> tuple[int, int] | None:
        """This writer's log position the index has applied (SegmentLog.published)."""
        with self.index.read() as r:
            return r.logs().get(self.log_number)

    # ---- the writer's own log -----------------------------------------------------------
    def _take_log(self, durable: bool) -> None:
        """Recovers every log whose writer is gone (its lock free), all together (their
        records applied in their order: recovery.py), and adopts the lowest of them as this
        writer's; without one, starts a new log (a store's first writer: log 0)."""
        known = self._known_logs()
        taken: dict[int, int] = {}
        try:
            for log in sorted(known):
                fd = logowners.try_take(self.path, log, self.file_mode)
                if fd is not None:
                    taken[log] = fd
            if taken:
                recover_logs(self.index, self.backend, list(taken), durable)
        except BaseException:
            for fd in taken.values():
                os.close(fd)
            raise
        if taken:
            self.log_number = min(taken)
            self._log_fd = taken.pop(self.log_number)
            for fd in taken.values():
                os.close(fd)
        else:
            self.log_number, self._log_fd = logowners.create_new(
                self.path, self.file_mode, start=max(known) + 1 if known else 0)
        write_holder(self._log_fd)

    def _remove_swap_leftovers(self) -> None:
        """What a compaction killed while it replaced the index left behind (.index.new,
        .index.old beside a complete index/) is removed, unless a compaction is running
        now (it may be building .index.new): then the next open or compaction does it."""
        if not indexswap.leftovers(self.path):
            return
        try:
            with self.maintenance(exclusive=True, timeout=0):
                indexswap.recover_swap(self.path)
        except StoreLocked:
            pass

    def _known_logs(self) -> set[int]:
        """Every log the store has: lock files, segments, applied positions, claims."""
        known = set(logowners.lock_files(self.path)) | set(logs_of(self.backend.list()))
        with self.index.read() as r:
            known |= set(r.logs())
            if r.version >= 3:
                known |= {c.log for c in claim_rules.claims(r)}
        return known

    def alive(self, log: int) -> bool:
        """Whether a writer holds log `log` (this one's own log always is)."""
        return log == self.log_number or logowners.is_alive(self.path, log)

    def recover_dead(self, log: int) -> bool:
        """Recovers log `log` if its writer is gone (claims.DeadHolder), with every other log
        whose writer is gone (after a power loss their records must be applied together, in
        order); False when a writer holds it (alive again, or being recovered right now).
        As an opener's choice of its log (logowners.choosing_a_log): holding the free logs
        meanwhile would make an opener start a new log."""
        with logowners.choosing_a_log(self.path, self.file_mode):
            fd = logowners.try_take(self.path, log, self.file_mode)
            if fd is None:
                return False
            taken = {log: fd}
            try:
                for other in sorted(self._known_logs() - {log, self.log_number}):
                    other_fd = logowners.try_take(self.path, other, self.file_mode)
                    if other_fd is not None:
                        taken[other] = other_fd
                recover_logs(self.index, self.backend, list(taken),
                             self.durability == "fsync")
            finally:
                for other_fd in taken.values():
                    os.close(other_fd)
            return True

    def drop_abandoned_groups(self) -> int:
        """Drops the groups that can never commit (claims.drop_abandoned_groups): at a
        writer's open and before compaction. One read when there is none."""
        if self.index.version < 3:
            return 0
        with self.index.read() as r:
            if not r.group_entries(b"") and not any(c.kind == "group"
                                                    for c in claim_rules.claims(r)):
                return 0
        with self.index.write() as w:
            return claim_rules.drop_abandoned_groups(w)

    def recover_orphans(self) -> bool:
        """Recovers every log whose writer is gone (compaction does this first). Returns
        whether there was one."""
        for log in sorted(self._known_logs() - {self.log_number}):
            if self.recover_dead(log):
                return True
        return False

    # ---- opening and closing ------------------------------------------------------------
    def _release(self) -> None:
        if self._keyframes is not None:
            self._keyframes.clear()         # its memory goes with the store
        logs_synced = True
        if (self._mark is not None and self.durability != "fsync" and self.index is not None
                and self.backend is not None):
            # the index is synced next: never leave it durable ahead of a log (this writer's,
            # or one it recovered without syncing)
            try:
                if self.log is not None:
                    self.log.sync()
                self._sync_logs_to_applied()
            except (SnapstoreError, OSError):
                logs_synced = False         # the mark stays: rebuilt after a reboot
        if self.log is not None:
            self.log.close()
            self.log = None
        self._remove_mark(keep=not logs_synced)
        if self.index is not None:
            self.index.close()
            self.index = None
        if self.backend is not None:
            self.backend.close()
        for name in ("_log_fd", "_lock_fd"):
            fd = getattr(self, name)
            if fd is not None:
                setattr(self, name, None)
                os.close(fd)

    def close(self) -> None:
        """Waits for the operation in progress, then closes log, index, backend and locks.
        Idempotent. In a fork()ed child it only marks the committer closed."""
        if self.forked:
            self._closed = True
            return
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    self._drop_own_claims()
                finally:
                    self._release()

    def _drop_own_claims(self) -> None:
        """At close: nothing of this writer is in progress but the groups it opened and never
        committed; drop them (they could never commit), so their stream is free at once."""
        if self.log is None or self.index is None or self.log.broken:
            return
        try:
            with self.index.write() as w:
                for c in claim_rules.claims_of_log(w, self.log_number):
                    claim_rules.drop(w, c)
        except SnapstoreError:
            pass                # the next writer to recover this log drops them

    @property
    def closed(self) -> bool:
        return self._closed

    def index_stats(self) -> dict:
        """index_synced_at_commit: whether each commit of this writer syncs the index (None
        for a reader); index_rebuilt_seconds: what this open spent rebuilding an index written
        without syncs when the machine went down (None: it rebuilt nothing)."""
        index = self.index
        if index is None:
            self.check_open()
        return {"index_synced_at_commit": None if self.readonly else index.durable,
                "index_rebuilt_seconds": self._rebuilt_seconds}

    def keyframe_stats(self) -> dict:
        """The keyframe cache's bound, bytes held, hits and misses (zeros without one)."""
        if self._keyframes is None:
            return no_cache_stats()
        return self._keyframes.stats()

    @property
    def forked(self) -> bool:
        """True in a fork()ed child of the process that opened the store."""
        return self._pid != os.getpid()

    def after_fork_in_child(self) -> None:
        """Run in a fork()ed child (os.register_at_fork): a fresh writer lock (a thread of the
        parent may have held it), and the child's copies of the lock descriptors closed, which
        leaves the parent's locks held (flock belongs to the open file, which the parent keeps
        open) but lets the child, or anyone, take them once the parent closes. Nothing else
        of the parent's is touched."""
        self._lock = threading.RLock()
        # the keyframes are the parent's: the child's copy would hold its pages (as the
        # parent overwrites them) for nothing; not cleared, its lock may be held
        self._keyframes = None
        if self._mark is not None:      # the parent's: it removes it
            self._mark.let_go()
            self._mark = None
        # the maintenance locks other threads of the parent held at the fork too: the
        # child's copies would keep a compaction's or a verify's lock held while it lives
        fds = [self._lock_fd, self._log_fd, *self._maintenance_fds]
        self._lock_fd = self._log_fd = None
        self._maintenance_fds = set()
        for fd in fds:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def check_open(self, write: bool = False) -> None:
        """Raises StoreClosedError after close(), ForkedStoreError in a fork()ed child,
        ReadOnlyError for a write to a reader."""
        check_usable(self.path, self._pid, self._closed or self.index is None,
                     write and self.readonly)

    def flush(self) -> None:
        """Nothing is in flight once a local commit returned (an S3 store's may upload in
        the background). Raises StoreClosedError after close()."""
        self.check_open()

    def refresh(self) -> None:
        """Nothing to pull: a local store's index is always current (an S3 store's
        RemoteCommitter pulls the bucket here). Raises StoreClosedError after close()."""
        self.check_open()

    def bucket_problems(self) -> list:
        """What a deep verify finds beyond the index and the segments: nothing here (an S3
        store's RemoteCommitter reads its refs and checkpoint objects in the bucket)."""
        return []

    @contextlib.contextmanager
    def read(self) -> Iterator[IndexView]:
        """`with committer.read() as view:` a consistent snapshot of the index (no lock). An
        OSError of the with block (a segment read failing: a bad sector) is raised as
        StoreIOError."""
        self.check_open()
        index = self.index
        try:
            with io_errors("cannot read the store"), index.read() as view:
                yield view
        except (StoreIOError, AttributeError):
            self.check_open()           # closed by another thread meanwhile: StoreClosedError
            raise

    def read_cached(self) -> "contextlib.AbstractContextManager[IndexView]":
        """As read(), never waiting for the network (an S3 store's committer reads its cache
        as it is): what an asynchronous capture plans with, in its caller's time. Here the
        index is the store's own: the same as read()."""
        return self.read()

    @contextlib.contextmanager
    def exclusive(self, write: bool = True) -> Iterator[None]:
        """Runs the with block under this process's writer lock, after the open (and, with
        write, the read-only) check."""
        with self._lock:
            self.check_open(write)
            yield

    @contextlib.contextmanager
    def maintenance(self, exclusive: bool, timeout: float | None = None) -> Iterator[None]:
        """The store's maintenance lock (STORE/maintenance), for the with block: exclusive for
        compaction (one at a time: it removes segments), shared for verify (which must not see
        segments vanish under it). Waits up to `timeout` (default: the store's) and raises
        StoreLocked (lock "maintenance") naming the compaction that holds it: an exclusive
        holder records itself in the file (holders.py) and clears the record when done.
        Other writers are not kept out. Re-entrant in the thread that holds it exclusively
        (retain holds it across its deletes and its prune, compact() inside it). Taken
        before the writer lock (exclusive()), never while holding it: a thread waiting here
        must not keep this Store's other threads from writing."""
        if self._maintenance_holder == threading.get_ident():
            yield
            return
        timeout = self.timeout if timeout is None else timeout
        name = os.path.join(self.path, fmt.MAINTENANCE_LOCK_FILE)
        fd = None
        for flags in ((os.O_RDWR | os.O_CREAT,) + ((os.O_RDONLY,) if self.readonly else ())):
            try:
                fd = open_regular(name, flags, self.file_mode)
                break
            except NotRegularFile as exc:
                raise CorruptionError(f"{name} is {exc.kind}, not a regular file: the store "
                                      "is damaged (the lock file holds no data; remove it)") \
                    from None
            except OSError as exc:
                # a reader of a store it may not write (or on a read-only file system) locks
                # the file as it is, or not at all when it cannot even open it
                if not self.readonly or exc.errno not in (errno.EACCES, errno.EPERM,
                                                          errno.EROFS, errno.ENOENT):
                    raise
        if fd is None:
            yield
            return
        self._maintenance_fds.add(fd)
        try:
            started = time.monotonic()
            if flock_until(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH,
                           started + timeout) != FLOCK_TAKEN:
                raise self._maintenance_locked(exclusive, time.monotonic() - started,
                                               read_holder(fd))
            if exclusive:
                write_holder(fd)
                self._maintenance_holder = threading.get_ident()
            try:
                yield
            finally:
                if exclusive:
                    self._maintenance_holder = None
                    clear_holder(fd)
        finally:
            self._maintenance_fds.discard(fd)
            os.close(fd)

    def _maintenance_locked(self, exclusive: bool, waited: float, holder: dict) -> StoreLocked:
        """StoreLocked for a compaction (exclusive) or a verify kept out of the maintenance
        lock: by a compaction (its record names it) or, for a compaction, by verifies (which
        write none)."""
        exc = StoreLocked("", path=self.path, waited=waited, lock="maintenance", **holder)
        if holder["pid"] is not None:
            what = f"a compaction by {exc.holder} is running"
        else:
            what = "another compaction or a verify is running" if exclusive else \
                "a compaction is running"
        exc.reason = f"{self.path}: {what} (waited {waited:.1f} s)."
        exc.args = (f"{exc.reason} Open the store with timeout=SECONDS to wait for it.",)
        return exc

    # ---- claiming --------------------------------------------------------------------------
    def claim(self, prepare: Callable[[IndexWriter], tuple],
              extra: Callable[[IndexWriter, claim_rules.Claim], None] | None = None
              ) -> claim_rules.Claim:
        """Claims an operation in one index transaction: prepare(writer) checks for conflicts
        (raising CommitConflict; claims.DeadHolder, which recovers the dead writer's log and
        tries again; or claims.ChunksVanished) and returns (kind, {claim fields}); the claim is
        then recorded (claims.claim), and extra(writer, claim) adds to the same
        transaction."""
        for _ in range(_DEAD_RETRIES):
            try:
                with self.index.write() as w:
                    dropped = self._drop_unreleased(w)
                    kind, fields = prepare(w)
                    c = claim_rules.claim(w, kind, self.log_number, **fields)
                    if extra is not None:
                        extra(w, c)
                del self._unreleased[:dropped]
                return c
            except claim_rules.DeadHolder as dead:
                if not self.recover_dead(dead.log):
                    time.sleep(0.01)        # being recovered by another writer right now
        raise CommitConflict(f"store {self.path}: writers kept dying while this operation "
                             "claimed its place; try again")

    def release(self, c: claim_rules.Claim,
                extra: Callable[[IndexWriter], None] | None = None) -> None:
        """Drops an abandoned claim; extra(index writer) adds to the same transaction (a
        group commit takes its group's claim back there). When that fails (StoreLocked: the
        index's write lock is held by a stopped writer; an I/O error) the claim is dropped by
        this writer's next claim (and, should it never make one, when its log is recovered
        after it is gone): kept until then, it kept the stream from every writer, this one
        included, while the Store stayed open. Its extra is not run then: a group whose
        commit failed so has no claim, and is dropped as abandoned (claims.py)."""
        try:
            with self.index.write() as w:
                dropped = self._drop_unreleased(w)
                claim_rules.release(w, c.order)
                if extra is not None:
                    extra(w)
            del self._unreleased[:dropped]
        except SnapstoreError:
            self._unreleased.append(c.order)

    def _drop_unreleased(self, w: IndexWriter) -> int:
        """Drops, in transaction w, the claims release() could not; returns how many (the
        caller forgets them once w committed)."""
        for order in self._unreleased:
            claim_rules.release(w, order)
        return len(self._unreleased)

    def publish(self, batch: list, c: claim_rules.Claim,
                apply_extra: Callable[[IndexWriter], None] | None = None,
                on_release: Callable[[IndexWriter], None] | None = None) -> tuple[int, int]:
        """Steps 3 and 4 of the protocol for claimed index records (writer lock held):
        appends the records of batch [(record type, payload parts)], syncs the log (with
        durability "fsync"), then applies them, drops the claim and advances the log's
        applied position in one index transaction; apply_extra(index writer) adds to it. On
        any failure before the index commit the log is rolled back to where it was and the
        claim dropped, with on_release(index writer) in that transaction (release()); the
        claim is kept when the rollback failed: the records may be durable, and the
        recovery of this log after this writer is gone publishes them. Records the caller
        appended before (a commit's chunks) are written first, before the mark is taken
        (SegmentLog.mark): when that write fails the claim is dropped (on_release too) and
        the error raised, and the caller's rollback drops those records (a mark counting
        their unwritten bytes would lie past the segment's end: the rollback to it broke the
        log and kept the claim, so the Store refused every write and the stream stayed
        claimed until it was closed). Returns the log position just past the records."""
        log = self.log
        try:
            mark = log.mark()
        except BaseException:
            self.release(c, on_release)
            raise
        try:
            for rtype, parts in batch:
                log.append(rtype, 0, parts)
            log.flush()
            crashpoint("after_commit_append")
            if self.durability == "fsync":
                self.sync_other_logs()
                log.sync()
            crashpoint("after_fsync")
            end = log.position
            with self.index.write() as w:
                for rtype, parts in batch:
                    w.apply_record(rtype, b"".join(bytes(p) for p in parts), end)
                claim_rules.release(w, c.order)
                if apply_extra is not None:
                    apply_extra(w)
                crashpoint("before_index_commit")
        except BaseException:
            # The index never saw the records: take them back out of the log. If that fails
            # they may be durable: the claim stays, and the recovery of this log after this
            # writer is gone publishes what is there.
            if log.rollback(mark):
                self.release(c, on_release)
            raise
        crashpoint("after_index_commit")
        return end

    def sync_other_logs(self) -> None:
        """Makes every record other logs have published durable, before this writer's
        durable commit (which may build on them: its parent, the chunks it deduplicates
        against, a group's parts) is acknowledged. A writer with durability "none" never
        syncs, and the recovery of a dead writer's log publishes what the page cache held:
        without this, a power cut could take the bytes of an acknowledged checkpoint with
        theirs. Each log is synced from where this process last synced it (the first time,
        from its first segment) through the segment of its applied position; nothing is done
        for logs that have not moved, so a lone writer pays one index read. Segments
        compaction removed meanwhile are passed over (their chunks were copied durably)."""
        with self.index.read() as r:
            applied = {log: pos for log, pos in r.logs().items() if log != self.log_number}
        moved = {log: pos for log, pos in applied.items()
                 if self._others_synced.get(log, (0, 0)) < pos}
        if not moved:
            return
        numbers = None
        new_segments = False
        for log, (seg, _) in moved.items():
            done = self._others_synced.get(log)
            if done is None:
                if numbers is None:
                    numbers = logs_of(self.backend.list())
                todo = [n for n in numbers.get(log, ()) if n <= seg]
            else:
                todo = range(done[0], seg + 1)
            for number in todo:
                self.backend.sync_segment(number)
            new_segments = new_segments or done is None or done[0] != seg
        if new_segments:
            self.backend.sync_directory()   # their segments' names too
        self._others_synced.update(moved)

    # ---- writing ------------------------------------------------------------------------
    def commit(self, stream: str, make_plans: PlanMaker, meta: Any, *,
               expect_head: Any = ANY_HEAD, on_stored: dict | None = None,
               pause: Callable[[], None] | None = None) -> Commit:
        """Stores planned buffers as the stream's next checkpoint and commits it; returns the
        Commit.

        make_plans(view, head id, head Commit) returns the BufferPlans, planned against that
        snapshot; a delta plan is relative to the head. The commit happens only if that head
        is still the stream's head when it is claimed (and, with expect_head, if the head is
        expect_head: None for an empty stream): else CommitConflict, and nothing of it is
        visible. A delta that reaches max_chain is rebased into a full manifest (manifest work
        only). on_stored: {buffer name: callback(offset, stored bytes)}, told what was stored
        when a plan is stored from the live buffer. pause() is called between chunks (the
        persister yields to captures there). May call make_plans again (the same snapshot
        rules) when garbage collection removed a chunk it reused meanwhile."""
        with self._lock, io_errors("checkpoint failed"):
            self.check_open(write=True)
            self.log.check_writable()
            if self._keyframes is not None:
                self._keyframes.begin_checkpoint(stream)    # once, whatever the attempts
            for _ in range(_ATTEMPTS):
                try:
                    return self._commit_once(stream, make_plans, meta, expect_head,
                                             on_stored, pause)
                except (claim_rules.ChunksVanished, ConcurrentCompactionError):
                    continue    # a base read back was moved by a compaction: plan again
        raise ConcurrentCompactionError(f"checkpoint of stream {stream!r}: compaction removed "
                                        f"chunks it reused {_ATTEMPTS} times in a row; retry")

    def _commit_once(self, stream: str, make_plans: PlanMaker, meta: Any, expect_head: Any,
                     on_stored: dict | None, pause) -> Commit:
        opts = self.options
        log = self.log
        if self._staging is None:
            self._staging = bytearray(wr.STAGING_BYTES)
        mark = log.position
        try:
            # a read session for the bases delta chunks are coded against, only if any may be
            with self.index.read() as r, (self.backend.open_reader() if opts.delta_chunks
                                          else contextlib.nullcontext()) as segments:
                head = r.stream_head(stream)
                _check_expected_head(r, stream, head, expect_head)
                read_bases = (None if segments is None
                              else ChunkReader(self.backend, segments, r).read_many)
                keyframes = self._keyframes if read_bases is not None else None
                if keyframes is not None:
                    read_bases = functools.partial(keyframes.read, read_back=read_bases)
                sink = wr.ChunkSink(log, r, opts, pause, read_bases=read_bases,
                                    keyframes=keyframes)
                entries, fingerprints = store_plans(r, stream, head, make_plans, sink,
                                                    self._staging, on_stored)
                generation = r.gc_generation()
            crashpoint("after_data_append")
            return self._claim_and_publish(stream, head, entries, sink, generation, meta,
                                           fingerprints)
        except BaseException:
            log.rollback(mark)      # the chunk records too (publish dropped its claim)
            raise

    def _claim_and_publish(self, stream: str, head: int | None, entries: list,
                           sink: wr.ChunkSink, generation: int, meta: Any,
                           fingerprints: list, created: float | None = None,
                           tags: tuple = ()) -> Commit:
        """Steps 2 to 4 of a commit whose chunks `sink` appended (planned on a snapshot
        showing `head` and GC generation `generation`): claims the stream (CommitConflict
        unless head is still its head; claims.ChunksVanished when GC removed a chunk the
        entries reuse), then appends the commit record, syncs and publishes it with the page
        fingerprints [(buffer name, digests)]. The caller rolls its log back on failure.

        The sink's chunk records are written before the claim (step 1 ends with them in the
        segment file): a write that fails (disk full) then claims nothing, and the claim is
        never held across the chunks' I/O. (ChunkSink.put queues records without writing
        them until PENDING_BYTES are queued: a copy's or an import's chunks were written
        only inside publish, under the claim.)"""
        sink.log.flush()
        new_chunks = sink.new_chunk_table()
        delta_bases = sink.delta_base_table()
        pins = reused_chunks(entries, new_chunks, delta_bases)

        def prepare(w: IndexWriter) -> tuple:
            claim_rules.check_stream(w, stream, head, self.alive)
            claim_rules.check_pins(w, claim_rules.unpack_ids(pins), generation)
            return "commit", {"stream": stream, "parent": head, "pins": pins}
        claimed = self.claim(prepare)
        try:
            commit = Commit(claimed.id, stream, head,
                            time.time() if created is None else created, meta, entries,
                            new_chunks, tags=list(tags), seq=claimed.seq, order=claimed.order,
                            delta_bases=delta_bases)
            count_bytes_new(commit, sink.bytes_new)
            payload = commit.encode()
        except BaseException:
            self.release(claimed)       # never left behind: it keeps the stream's writers out
            raise

        def put_fingerprints(w: IndexWriter) -> None:
            for name, fps in fingerprints:
                w.put_fingerprints(stream, name, commit.id, self.options.page_size, fps)

        self.publish([(fmt.REC_COMMIT, payload)], claimed, put_fingerprints)
        return commit

    def commit_manifests(self, stream: str, entries: list, read_chunks: ChunkSource,
                         meta: Any, *, created: float | None = None, tags: tuple = (),
                         expect_head: Any = ANY_HEAD) -> Commit:
        """Commits pre-made manifests as the stream's next checkpoint (checkpoint copy and
        savepoint import); returns the Commit. expect_head as for commit().

        entries: [BufferEntry] with base "full" and depth 0, each a checked full manifest of
        its buffer whose extents name chunks by id (BLAKE3: portable between stores).
        read_chunks(chunk ids) -> iterable of (chunk id, raw bytes): called once, with the
        chunks this store lacks only (not at all when it has them all); it must yield each
        of them (in any order). Each is checked (its BLAKE3 must be its id: else
        CorruptionError) and appended to this writer's log as a chunk record compressed per
        the store's options (ChunkSink). Then the commit is claimed and published exactly as
        commit()'s: its parent is the stream's head in the snapshot it was made on
        (CommitConflict when the head moved or another commit of the stream is in progress);
        created: its creation time (default now); tags: its tags. The checkpoint has no page
        fingerprints, so the stream's next checkpoint() is stored full (deduplicated). On any
        failure nothing is visible and the log is rolled back. An extent reaching past its
        chunk's raw length raises CorruptionError before anything is committed."""
        with self._lock, io_errors("checkpoint import failed"):
            self.check_open(write=True)
            self.log.check_writable()
            for _ in range(_ATTEMPTS):
                try:
                    return self._commit_manifests_once(stream, entries, read_chunks, meta,
                                                       created, tags, expect_head)
                except claim_rules.ChunksVanished:
                    continue
        raise ConcurrentCompactionError(f"import into stream {stream!r}: compaction removed "
                                        f"chunks it reused {_ATTEMPTS} times in a row; retry")

    def _commit_manifests_once(self, stream: str, entries: list, read_chunks: ChunkSource,
                               meta: Any, created: float | None, tags: tuple,
                               expect_head: Any) -> Commit:
        log = self.log
        mark = log.position
        try:
            with self.index.read() as r:
                head = r.stream_head(stream)
                _check_expected_head(r, stream, head, expect_head)
                sink = wr.ChunkSink(log, r, self.options)
                wr.store_missing_chunks(sink, r, entries, read_chunks)
                generation = r.gc_generation()
            crashpoint("after_data_append")
            return self._claim_and_publish(stream, head, entries, sink, generation, meta, [],
                                           created, tags)
        except BaseException:
            log.rollback(mark)
            raise

    def apply_ops(self, make_ops: Callable[[IndexView], list],
                  unless_tagged: frozenset = frozenset()) -> None:
        """Deletes and tags: make_ops(view) runs against the current index (in the claim's
        transaction, so it can check what the records refer to and raise before anything is
        written) and returns [(record type, checkpoint id, encode(order) -> payload parts)],
        all deletes or all tags. They are claimed together (CommitConflict when a commit in
        progress builds on one of their checkpoints, or another delete or tag of one is in
        progress), appended with the claim's order, made durable with one sync and applied in
        one index transaction: all or none. An empty list writes nothing. unless_tagged: ids
        whose delete was decided because they had no tag (retain): CommitConflict, nothing
        written, when one of them has a tag by then."""
        with self._lock, io_errors("cannot update the store"):
            self.check_open(write=True)
            self.log.check_writable()
            made: list = []

            def prepare(w: IndexWriter) -> tuple:
                made[:] = make_ops(w)
                for _, cid, _ in made:
                    if cid in unless_tagged:
                        tagged_meanwhile(cid, w.checkpoint(cid).tags)
                if not made:
                    raise _NothingToDo()
                kind = "delete" if made[0][0] == fmt.REC_DELETE else "tag"
                ids = sorted({m[1] for m in made})
                claim_rules.check_checkpoints(w, ids, kind, self.alive)
                return kind, {"ids": ids, "records": len(made)}
            try:
                claimed = self.claim(prepare)
            except _NothingToDo:
                return
            mark = self.log.position
            try:
                batch = [(rtype, encode(claimed.order)) for rtype, _, encode in made]
            except BaseException:
                self.release(claimed)
                raise
            try:
                self.publish(batch, claimed)
            except BaseException:
                self.log.rollback(mark)
                raise


class _NothingToDo(Exception):
    """apply_ops: make_ops returned no records (nothing is claimed)."""


def _check_expected_head(r: IndexView, stream: str, head: int | None, expect_head: Any) -> None:
    """CommitConflict (claim_rules' words) unless the stream's head in snapshot r is
    expect_head (ANY_HEAD: any). A conflict whatever the claims: a snapshot cannot tell
    whether a claim's holder is alive (it may have published and exited since), so none is
    taken for dead (DeadHolder is for claim(), in a write txn)."""
    if expect_head is not ANY_HEAD and head != expect_head:
        claim_rules.check_stream(r, stream, expect_head, lambda log: True)
