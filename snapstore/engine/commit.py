"""The commit path: the one way anything is written into a store.

A Committer opens a store — the directory, its FORMAT file and, for the writer, the flock
(storedir); the LMDB index; the segment backend; recovery; the tail of the log (SegmentLog) —
and owns all of it until close(), with the staging buffer and the durability setting. Every
writer goes through its operations: store.checkpoint, the asynchronous persister (trackers and
checkpoint_async), object saves and the integrations (through store.checkpoint), delete, tag,
retain, compaction.

    commit(stream, make_plans, meta)  stores planned buffers as the stream's next checkpoint
    append_records(make_records)      appends index records (delete, tag) and applies them
    exclusive(write)                  runs a block under the writer lock (compaction, verify)
    read()                            an index snapshot to plan against or read from

Commit protocol (docs/design.md, "Commit and recovery protocol"; crash point names in
parentheses):
  1. append the checkpoint's new chunk records (after_data_append), then its commit record
     (after_commit_append), to the log;
  2. make them durable: fdatasync, skipped with durability "none" (after_fsync);
  3. apply the record to the index in one LMDB write transaction, which also stores the new
     page fingerprints and advances the applied log position (before_index_commit,
     after_index_commit).
A checkpoint is visible iff step 3 happened; it is durable iff step 2 did, and a durable commit
that step 3 missed (crash) is applied by recovery when a writer next opens the store. A failure
before step 3 completes truncates the log back to where the operation began, leaving no trace;
an OSError is raised as StoreIOError. Delete and tag records follow steps 1 to 3 the same way.

LOCKING CONTRACT
  * One lock, the writer lock: a threading.RLock owned by the Committer. commit(),
    append_records(), exclusive() and close() hold it for their whole run, and nothing else
    writes the log or the index, so the writes of one process are serialised. (Between
    processes the flock on STORE/lock admits one writer; readers take no lock.)
  * Re-entrant: the thread holding it (in an exclusive() block, or in a callback) may call
    commit(), append_records() and exclusive() again.
  * Whoever holds it must not wait for another thread that needs it. In particular callbacks
    (make_plans, make_records, on_stored, pause) and exclusive() blocks must not wait for the
    asynchronous persister (flush, Tracker.close, a future's result...): its worker thread
    commits through this lock. `pause` may wait, but only for a bounded time.
  * The open and read-only checks run under the lock: an operation either runs on an open
    writer or raises StoreClosedError / ReadOnlyError before touching anything. close() waits
    for the operation in progress; afterwards every operation, read() included, raises
    StoreClosedError; close() again does nothing.
  * read() takes no lock: an LMDB read transaction is a consistent snapshot while a write goes
    on (MVCC). Use the view only inside its with block, in the thread that opened it; it is
    not protected against close(), so close a store only once its readers are done.
  * Any thread may call any operation; the callbacks run in the calling thread.
  * Only the opening process: in a fork()ed child every operation raises ForkedStoreError
    (the lock, the LMDB environment and the descriptors are the parent's), and close() only
    marks the committer closed (after_fork_in_child, run by the Store's fork handler, gave up
    the child's copy of the lock descriptor and the writer lock a parent thread may hold).
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any, Callable, Iterator

from snapstore.engine import format as fmt
from snapstore.engine import storedir
from snapstore.engine import writer as wr
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.index import Index, IndexView
from snapstore.engine.records import Commit
from snapstore.engine.recovery import recover
from snapstore.engine.upgrade import upgrade as upgrade_store
from snapstore.engine.backends import LocalSegments, SegmentBackend
from snapstore.engine.wal import SegmentLog
from snapstore.errors import (ForkedStoreError, ReadOnlyError, SnapstoreError, StoreClosedError,
                              StoreIOError)

# make_plans(view, head id or None, head Commit or None) -> [BufferPlan]
PlanMaker = Callable[[IndexView, "int | None", "Commit | None"], list]


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


class Committer:
    """An open store's engine side: directory lock, index, backend, log, staging buffer, and
    the one commit path (see the module docstring for the protocol and the locking contract).

    Raises what opening raises (FormatError, StoreLocked, CorruptionError, StoreIOError);
    on any failure everything opened so far is released again."""

    def __init__(self, path: str, options: wr.WriteOptions, *, durability: str,
                 readonly: bool, create: bool, timeout: float, segment_size: int,
                 backend: SegmentBackend | None = None) -> None:
        self.path = path
        self.options = options
        self.durability = durability
        self.readonly = readonly
        self.index: Index | None = None
        self.backend: SegmentBackend | None = None
        self.log: SegmentLog | None = None       # None for a reader
        self._lock = threading.RLock()           # the writer lock
        self._lock_fd: int | None = None          # the flock of STORE/lock (writer only)
        self._staging: bytearray | None = None
        self._closed = False
        self._pid = os.getpid()
        durable = durability == "fsync"
        try:
            opened = storedir.open_directory(path, create=create, readonly=readonly,
                                             timeout=timeout)
            self._lock_fd = opened.lock_fd
            self.index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=readonly,
                               durable=durable, file_mode=opened.file_mode)
            self.backend = backend or LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR),
                                                    durable=durable,
                                                    file_mode=opened.file_mode)
            if opened.creating:     # the index is initialised: now it is a store
                with io_errors(f"cannot create store {path}"):
                    storedir.publish_format(path, opened.file_mode)
            if not readonly:
                upgrade_store(path, self.index, self.backend)   # before anything else writes
                with io_errors("cannot recover the log"):
                    recover(self.index, self.backend, durable)
                self.log = SegmentLog(self.backend, segment_size)
                self.log.open_tail()
        except BaseException:
            self._release()
            raise

    # ---- opening and closing ------------------------------------------------------------
    def _release(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.index is not None:
            self.index.close()
            self.index = None
        if self.backend is not None:
            self.backend.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def close(self) -> None:
        """Waits for the operation in progress, then closes log, index, backend and lock.
        Idempotent. In a fork()ed child it only marks the committer closed."""
        if self.forked:
            self._closed = True
            return
        with self._lock:
            if not self._closed:
                self._closed = True
                self._release()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def forked(self) -> bool:
        """True in a fork()ed child of the process that opened the store."""
        return self._pid != os.getpid()

    def after_fork_in_child(self) -> None:
        """Run in a fork()ed child (os.register_at_fork): a fresh writer lock (a thread of the
        parent may have held it), and the child's copy of the flock descriptor closed, which
        leaves the parent's lock held (flock belongs to the open file, which the parent keeps
        open) but lets the child, or anyone, take it once the parent closes. Nothing else
        of the parent's is touched."""
        self._lock = threading.RLock()
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def check_open(self, write: bool = False) -> None:
        """Raises StoreClosedError after close(), ForkedStoreError in a fork()ed child,
        ReadOnlyError for a write to a reader."""
        if self.forked and not self._closed:
            raise ForkedStoreError(
                f"store {self.path} was opened by process {self._pid}; this process "
                f"({os.getpid()}) is a fork()ed child of it and must not use that Store: open "
                "the store again in the child (snapstore.open(path))")
        if self._closed or self.index is None:
            raise StoreClosedError(f"store {self.path} is closed")
        if write and self.readonly:
            raise ReadOnlyError(f"store {self.path} was opened read-only")

    def read(self) -> "contextlib.AbstractContextManager[IndexView]":
        """`with committer.read() as view:` a consistent snapshot of the index (no lock)."""
        self.check_open()
        return self.index.read()

    @contextlib.contextmanager
    def exclusive(self, write: bool = True) -> Iterator[None]:
        """Runs the with block under the writer lock, after the open (and, with write, the
        read-only) check: for maintenance that works on index, log and backend itself
        (compaction) and for checks that must see no commit half done (verify)."""
        with self._lock:
            self.check_open(write)
            yield

    # ---- writing ------------------------------------------------------------------------
    def commit(self, stream: str, make_plans: PlanMaker, meta: Any, *,
               on_stored: dict | None = None,
               pause: Callable[[], None] | None = None) -> Commit:
        """Stores planned buffers as the stream's next checkpoint and commits it; returns the
        Commit.

        make_plans(view, head id, head Commit) returns the BufferPlans, planned against that
        view under the writer lock (so the head cannot move meanwhile); a delta plan is
        relative to the head. A delta that reaches max_chain is rebased into a full manifest
        (manifest work only). on_stored: {buffer name: callback(offset, stored bytes)}, told
        what was stored when a plan is stored from the live buffer. pause() is called between
        chunks (the persister yields to captures there)."""
        opts = self.options
        with self._lock, io_errors("checkpoint failed"):
            self.check_open(write=True)
            log = self.log
            if self._staging is None:
                self._staging = bytearray(wr.STAGING_BYTES)
            mark = log.position
            fingerprints = []
            try:
                with self.index.read() as r:
                    head = r.stream_head(stream)
                    parent = (r.named_checkpoint(head, f"stream {stream!r}'s head")
                              if head is not None else None)
                    parents = {b.name: b for b in parent.buffers} if parent else {}
                    sink = wr.ChunkSink(log, r, opts, pause)
                    entries = []
                    for plan in make_plans(r, head, parent):
                        if plan.base == "delta":
                            pb = parents.get(plan.name)
                            if pb is None or pb.size != len(plan.view) or pb.layout != "pages" \
                                    or pb.page_size != plan.page_size:
                                raise SnapstoreError(
                                    f"buffer {plan.name!r} of stream {stream!r} changed under "
                                    "its tracker (another writer checkpointed the stream)")
                            plan.depth = pb.depth + 1
                        entry = wr.store_buffer(plan, sink, self._staging,
                                                (on_stored or {}).get(plan.name))
                        if entry.base == "delta" and entry.depth >= opts.max_chain:
                            entry = wr.rebase(r, parent, entry)
                        entries.append(entry)
                        if plan.fingerprints is not None:
                            fingerprints.append((plan.name, plan.fingerprints))
                    new_id = r.next_id()
                    seq = r.stream_seq(stream) + 1
                crashpoint("after_data_append")
                commit = Commit(new_id, stream, head, time.time(), meta, entries,
                                sink.new_chunk_table(), seq=seq)
                # bytes_new counts the commit record too, whose size depends on bytes_new's
                # digits: iterate to the fixpoint.
                while True:
                    total = sink.bytes_new + fmt.RECORD_HEADER.size + \
                        sum(len(p) for p in commit.encode())
                    if total == commit.bytes_new:
                        break
                    commit.bytes_new = total

                def put_fingerprints(w) -> None:
                    for name, fps in fingerprints:
                        w.put_fingerprints(stream, name, new_id, opts.page_size, fps)

                self._append_and_apply([(fmt.REC_COMMIT, commit.encode())], put_fingerprints)
            except BaseException:
                log.rollback(mark)      # the chunk records too
                raise
        return commit

    def append_records(self, make_records: Callable[[IndexView], list]) -> None:
        """Appends index records and applies them: make_records(view) runs under the writer
        lock against the current index, so it can check what the records refer to (and raise
        before anything is written), and returns [(record type, payload parts)]. The records
        are appended, made durable with one sync and applied in one index transaction: all or
        none. An empty list writes nothing."""
        with self._lock:
            self.check_open(write=True)
            with self.index.read() as r:
                batch = make_records(r)
            if batch:
                self._append_and_apply(batch)

    def _append_and_apply(self, batch: list, apply_extra=None) -> tuple[int, int]:
        """Steps 1 (the records' part) to 3 of the protocol for index records, writer lock
        held; apply_extra(index writer) adds to the same transaction. On any failure before
        the index commit the log is rolled back to where it was. Returns the log position
        just past the records."""
        log = self.log
        mark = log.position
        try:
            for rtype, parts in batch:
                log.append(rtype, 0, parts)
            log.flush()
            crashpoint("after_commit_append")
            if self.durability == "fsync":
                log.sync()
            crashpoint("after_fsync")
            end = log.position
            with self.index.write() as w:
                for rtype, parts in batch:
                    w.apply_record(rtype, b"".join(bytes(p) for p in parts), end)
                if apply_extra is not None:
                    apply_extra(w)
                crashpoint("before_index_commit")
        except BaseException:
            # The index never saw the records: take them back out of the log.
            log.rollback(mark)
            raise
        crashpoint("after_index_commit")
        return end
