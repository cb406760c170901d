"""The asynchronous persister: commits captured checkpoints on one background thread, and
knows which capturer owns each stream.

A capture (snapstore.capture.tracker) plans a checkpoint in the caller's time and hands it to
submit(): the planned bytes are gathered into the staging arena (C gather) and the job is
queued. One worker thread commits the jobs in the order they were submitted, each through the
committer's one commit path (Committer.commit), so a stream's checkpoints commit in order; the
job's future resolves with the checkpoint's description once it is durable, or with its error.
A delta is relative to the owner's previous capture (owner.last_id), which the worker checks is
the stream's head when it commits. If a job fails, the owner's later jobs that build on it fail
too (owner.epoch), and its next capture diffs in full (owner.failure). A capture larger than
the whole arena is committed from the live buffers in the caller's thread instead.

Ownership: a stream is owned by at most one capturer — a Tracker (exclusively: plain
checkpoint() and deleting the head are refused while it lives) or the ImplicitCapturer of
store.checkpoint_async (dropped, once its jobs landed, when the stream is checkpointed or its
head deleted some other way).

Threads: the worker commits through the committer's writer lock; nothing here holds that lock
while waiting for the worker (see the committer's locking contract). Captures have priority:
while one runs, the worker pauses between chunks (capturing(), yield_to_captures()).

Interrupts: a KeyboardInterrupt (Ctrl-C) may land between any two bytecodes of the caller's
thread. So the state a capture changes is changed by single operations that are undone by
identity (the queue holds the jobs, the sets hold live captures and captures in progress: what
is pending is counted from them, never kept in a counter that an interrupt could leave off by
one), locks are plain Locks entered with `with` (whose C-level __enter__ cannot be cut in
half), waits happen outside them (snapstore.wakeups; Condition.wait is not interrupt-safe),
and a capture interrupted after it took a staging region frees it (_abandon) unless its
job was queued, which then commits as usual.
"""
from __future__ import annotations

import collections
import contextlib
import threading
from concurrent.futures import Future
from typing import Any, Callable

from snapstore.capture.staging import StagingArena
from snapstore.halves import both, split_point
from snapstore.capture.tracker import Capturer, ImplicitCapturer, Tracker, release_views
from snapstore.engine import writer as wr
from snapstore.engine.commit import Committer
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.records import Commit
from snapstore.errors import (CommitConflict, ForkedStoreError, InvalidArgumentError,
                              SnapstoreError, StoreClosedError)
from snapstore.interrupts import deferred_interrupts, start_thread
from snapstore.wakeups import WakeUps


PARALLEL_STAGE_BYTES = 8 << 20      # captures of this many bytes are staged by two threads


class _Job:
    __slots__ = ("owner", "epoch", "plans", "meta", "region", "future", "landed")

    def __init__(self, owner, epoch, plans, meta, region) -> None:
        self.owner, self.epoch, self.plans, self.meta, self.region = owner, epoch, plans, meta, region
        self.future: Future = Future()
        # running from the start: cancel() cannot take a queued job out of its stream's
        # order (a later job is a delta on it), and the worker can always resolve it
        self.future.set_running_or_notify_cancel()
        # committed (or failed) and its staging freed; its future's callbacks may still run
        self.landed = False


class Persister:
    """A store's background persister: one worker thread, one staging arena, the owners of
    the streams. describe(Commit) is what the futures resolve to (the store's
    CheckpointInfo)."""

    def __init__(self, committer: Committer, staging_bytes: int,
                 describe: Callable[[Commit], Any]) -> None:
        self.committer = committer
        self.arena = StagingArena(staging_bytes)
        self._describe = describe
        self._lock = threading.Lock()
        self._changed = WakeUps()      # waiters for the queue, _live, _worker (under _lock)
        self._queue: collections.deque = collections.deque()   # jobs, the running one first
        self._live: dict = {}          # token -> owner of a capture committed from the live
        #                                buffers right now
        self._worker: threading.Thread | None = None   # the thread that runs the queue
        self._closed = False
        self._closing = False          # close() began: other threads queue nothing more
        self._owners: dict[str, Capturer] = {}    # stream -> tracker or implicit capturer
        # stream -> [the lock a plain checkpoint() of the stream holds from its wait for the
        # stream's async jobs to its commit, and a checkpoint_async() capture of it takes;
        # the threads holding or waiting for it]: only streams in a turn have an entry
        self._stream_turns: dict[str, list] = {}
        self._captures: set = set()    # tokens of the captures in progress
        self._capture_lock = threading.Lock()
        self._capture_cv = threading.Condition(self._capture_lock)
        self._submit_lock = threading.Lock()      # a region is taken, filled, queued: submit()

    # -- who owns a stream
    def staging_stats(self) -> dict:
        """The staging arena's bound, the bytes it holds now and the most it ever held."""
        arena = self.arena
        return {"staging_bytes": arena.capacity, "staging_in_use_bytes": arena.in_use,
                "staging_peak_bytes": arena.peak}

    def implicit_capturer(self, stream: str) -> ImplicitCapturer:
        """store.checkpoint_async's capturer of the stream, made on first use.
        InvalidArgumentError if a Tracker owns the stream."""
        with self._lock:        # threads checkpointing a new stream at once share one
            owner = self._owners.get(stream)
            if owner is None:
                owner = self._owners[stream] = ImplicitCapturer(self, stream)
        if isinstance(owner, Tracker):
            raise InvalidArgumentError(f"stream {stream!r} is tracked by a Tracker; use "
                                       "tracker.checkpoint_async()")
        return owner

    def claim(self, tracker: Tracker) -> None:
        """Gives tracker.stream to a new tracker: InvalidArgumentError if a tracker owns it
        already; an implicit capturer's jobs land first and it is dropped."""
        owner = self._owners.get(tracker.stream)
        if isinstance(owner, Tracker):
            raise InvalidArgumentError(f"stream {tracker.stream!r} already has a tracker")
        if owner is not None:
            self.wait_idle(owner, what="store.track() of a stream with checkpoint_async() "
                                       "checkpoints")
        self._owners[tracker.stream] = tracker

    def release(self, owner: Capturer) -> None:
        """Frees owner's stream (if owner still owns it)."""
        if self._owners.get(owner.stream) is owner:
            del self._owners[owner.stream]

    @contextlib.contextmanager
    def stream_turn(self, stream: str):
        """Runs the block (a plain checkpoint() of the stream from its preparation to its
        commit, or a checkpoint_async() capture of it) while no other such block of the
        stream runs in another thread: a capture made while a plain checkpoint was between
        its planning and its commit was based on the head before it, and its commit then
        failed with CommitConflict, though this Store is the stream's only writer. Not on
        the worker (a done-callback): a thread in its turn may be waiting for the worker."""
        if self.on_worker():
            yield
            return
        with self._lock:
            turn = self._stream_turns.setdefault(stream, [threading.Lock(), 0])
            turn[1] += 1
        try:
            with turn[0]:
                yield
        finally:
            with self._lock:        # (a store sees many streams: keep only those in use)
                turn[1] -= 1
                if not turn[1]:
                    del self._stream_turns[stream]

    def prepare_sync_checkpoint(self, stream: str) -> dict:
        """A plain checkpoint() of a stream (in its stream_turn): refuse if a tracker owns
        it; otherwise let the stream's async checkpoints land and forget their capture
        state. Returns what that state knew of the stream's last async checkpoint, {buffer
        name: (checkpoint id, page size, page fingerprints)} (Capturer.stored_fingerprints),
        for the plain checkpoint to diff against ({} if none)."""
        owner = self._owners.get(stream)
        if owner is None:
            return {}
        if isinstance(owner, Tracker):
            raise InvalidArgumentError(f"stream {stream!r} is tracked by a Tracker; use "
                                       "tracker.checkpoint() (or close the tracker)")
        self.wait_idle(owner, what="a plain checkpoint() of a stream with checkpoint_async() "
                                   "checkpoints")
        known = owner.stored_fingerprints()
        self.release(owner)
        return known

    def prepare_delete(self, stream: str, is_head: bool) -> None:
        """Deleting a stream's head would pull the base from under its captures: refuse for a
        tracker; for checkpoint_async state, let its jobs land and forget it."""
        owner = self._owners.get(stream)
        if owner is None or not is_head:
            return
        if isinstance(owner, Tracker):
            raise InvalidArgumentError(f"that checkpoint is the head of stream {stream!r}, "
                                       "which a tracker owns; close the tracker first")
        self.wait_idle(owner, what="deleting the head of a stream")
        self.release(owner)

    # -- captures have priority: the caller is blocked during them, the worker is not
    @contextlib.contextmanager
    def capturing(self):
        """Marks a capture in progress: the worker pauses between chunks meanwhile, so the
        caller's thread does not wait for the GIL behind background work."""
        token = object()
        try:
            with self._capture_lock:
                self._captures.add(token)
            yield
        finally:
            with self._capture_lock:
                self._captures.discard(token)
                if not self._captures:
                    self._capture_cv.notify_all()

    def yield_to_captures(self) -> None:
        """Called by the worker between chunks: waits while a capture runs (bounded, so a
        stuck caller never stalls persisting for long)."""
        if self._captures:
            with self._capture_lock:
                self._capture_cv.wait_for(lambda: not self._captures, timeout=0.05)

    # -- submitting
    def submit(self, owner: Capturer, plans: list, meta: Any,
               narrowable: frozenset = frozenset()) -> Future:
        """Stages the plans' bytes and queues the job; returns its future. A job larger than
        the arena is committed now, from the live buffers (the caller waits).

        narrowable: names of the plans made from their detector's dirty() report (relative to
        the detector's baseline, which is then the last capture's copy). Only these may be
        narrowed to what the copy changed when the detector skipped its pass: a plan diffed
        against the stream's head is relative to something else."""
        total = sum(p.nbytes for p in plans)
        if total > self.arena.capacity:
            self.wait_idle(owner, what="a checkpoint larger than the staging arena (committed "
                                       "at once, from the buffers)", landed_only=True)
            token = object()
            result = error = None
            try:
                with self._lock:
                    self._check_accepting()
                    # pending: close() and wait_idle() wait for it (it reads the caller's
                    # live buffers, which closing releases)
                    self._live[token] = owner
                result = self._commit(owner, plans, meta, live=True)
            except StoreClosedError as exc:
                if token not in self._live:
                    raise               # closed before it began: nothing was tried
                error = exc
                owner.failed(exc)
            except BaseException as exc:
                error = exc
                owner.failed(exc)
            finally:
                with self._lock:
                    self._live.pop(token, None)
                    self._changed.notify_all()
            future: Future = Future()
            if error is None:               # resolved last: a callback may close the store
                future.set_result(result)
            else:
                future.set_exception(error)
            return future
        # Regions are freed in the order they were taken, jobs are committed in the order
        # they were queued: the two orders must be one, also when several threads submit
        # (captures of different streams), so a region is taken, filled and queued under one
        # lock. (Without it a job queued first could free a region taken after one still
        # being filled, and that one's bytes be overwritten.)
        # A thread waiting for room waits without the lock (arena.wait_for_room): a callback
        # that checkpoints or closes the store meanwhile runs on the worker, which frees the
        # room, and must not wait for that thread (a deadlock).
        job = _Job(owner, owner.epoch, plans, meta, None)
        while True:
            with self._submit_lock:
                try:
                    memory = None
                    if total:
                        taken = self.arena.alloc(total, wait=False, owner=job)
                        if taken is None and self.on_worker():
                            # (the worker frees regions: in its callback, room never comes)
                            raise SnapstoreError(
                                f"a checkpoint of stream {owner.stream!r} taken in a "
                                f"checkpoint's done-callback needs {total} bytes of staging, and "
                                "the staging arena is full of checkpoints that are committed on "
                                "the thread the callback runs on, after it returns: take it "
                                "outside the callback, or open the store with a larger "
                                "staging_bytes")
                        if taken is not None:
                            job.region, memory = taken
                    if not total or job.region is not None:
                        crashpoint("after_staging_alloc")
                        with self.capturing():
                            self._stage_all(owner, plans, memory, narrowable)
                        self._enqueue(job)
                        return job.future
                except BaseException:
                    self._abandon(job)
                    raise
            if not self.arena.wait_for_room(total, give_up=lambda: self._closed):
                raise StoreClosedError("the store was closed while this checkpoint waited "
                                       "for staging memory")

    @staticmethod
    def _stage_all(owner: Capturer, plans: list, memory, narrowable: frozenset) -> None:
        # Nothing changed (or only empty buffers): no region; stage into empty writable
        # memory, so such a checkpoint commits as a delta adding 0 chunk bytes (defect 1).
        memory = memory if memory is not None else memoryview(bytearray())
        places, pos = [], 0
        for i, p in enumerate(plans):
            places.append((i, p, memory[pos:pos + p.nbytes]))
            pos += p.nbytes
        opts = owner.persister.committer.options

        def stage(part: list) -> None:
            for i, p, out in part:
                # a hash detector takes the fingerprints of the copy: computed as it is made
                det = owner.detectors[p.name]
                wr.stage(p, out, det.note_stored_many,
                         det.page_size if det.wants_fingerprints else None)
                # a detector that skipped its pass (dense) now knows what the copy changed
                changed = det.noted_changes() if p.name in narrowable else None
                if changed is not None and sum(n for _, n in changed) < p.nbytes:
                    plans[i] = wr.narrow_staged(p, changed, opts)
        if pos < PARALLEL_STAGE_BYTES or len(places) < 2:
            stage(places)
            return
        # the copy and the fingerprints of the copy (C, without the GIL) on both cores: the
        # plans split where half of the bytes are; each plan's detector is its own
        at = split_point([p.nbytes for _, p, _ in places])
        both(lambda: stage(places[:at]), lambda: stage(places[at:]))

    def _check_accepting(self) -> None:
        # (lock held) Once close() began, only a done-callback (on the worker, which close()
        # waits for) may queue more: other threads could keep close() waiting for ever.
        if self._closed:
            raise StoreClosedError("the store was closed while this checkpoint was being "
                                   "captured")
        if self._closing and not self.on_worker():
            raise StoreClosedError("the store is being closed: no more checkpoints are "
                                   "accepted")

    def _enqueue(self, job: _Job) -> None:
        with self._lock:
            self._check_accepting()
            self._queue.append(job)         # one operation: queued, and pending, or not
            crashpoint("after_job_queued")
            self._start_worker()
            self._changed.notify_all()

    def _abandon(self, job: _Job) -> None:
        """A capture failed or was interrupted before it returned: unless its job is queued
        (it then commits as usual), frees the staging region it took, if any (the arena
        reuses it once the older regions, of queued jobs, are freed too)."""
        with self._lock:
            if any(queued is job for queued in self._queue):
                # (the interrupt may have come before the worker was started or woken)
                self._start_worker()
                self._changed.notify_all()
                return
        self.arena.free_taken_by(job)

    def _start_worker(self) -> None:
        """(lock held) Starts a thread to run the queue unless one runs it. An interrupt can
        cut Thread.start() short after the thread began, and then nothing tells whether it
        did; so a thread is started whenever no thread has taken the queue, and the first to
        take it (_run) is the worker: any other returns at once."""
        if self._worker is None:
            start_thread(threading.Thread(target=self._run, name="snapstore-persist",
                                          daemon=True))

    # -- the worker
    def _commit(self, owner: Capturer, plans: list, meta: Any, live: bool = False):
        callbacks = {p.name: owner.detectors[p.name].note_stored for p in plans} if live else None

        def relative_to_last_capture(view, head, parent) -> list:
            if head != owner.last_id:
                # another writer (or a delete) moved the head: a conflict, as for a plain
                # commit whose head moved; retrying (the next capture) diffs in full
                raise CommitConflict(f"stream {owner.stream!r} head is checkpoint {head}, but "
                                     f"this capture is relative to {owner.last_id}; the next "
                                     "capture will diff in full", stream=owner.stream,
                                     expected=owner.last_id, found=head)
            return plans

        commit = self.committer.commit(owner.stream, relative_to_last_capture, meta,
                                       on_stored=callbacks,
                                       pause=None if live else self.yield_to_captures)
        owner.last_id = commit.id
        return self._describe(commit)

    def _run(self) -> None:
        me = threading.current_thread()
        with self._lock:
            if self._worker is not None:
                return                  # another thread runs the queue
            self._worker = me
        try:
            while True:
                with self._lock:
                    if not self._queue:
                        if self._closed:
                            self.arena.close()      # (close() from a callback left it to us)
                            return
                        waiter, job = self._changed.register(), None
                    else:
                        waiter, job = None, self._queue[0]
                if waiter is not None:
                    self._changed.wait(waiter, self._lock)
                    continue
                self._process(job)
                # No reference to the job may outlive it in this frame (its plans hold views
                # of the caller's buffers, which must be free once the job landed).
                job = None
        finally:
            with self._lock:
                if self._worker is me:
                    self._worker = None
                    self._changed.notify_all()       # close() waits for it

    def on_worker(self) -> bool:
        """Whether the calling thread is the worker (a done-callback runs there)."""
        return self._worker is threading.current_thread()

    def _process(self, job: _Job) -> None:
        """Commits one job, frees its staging region and drops its views, then resolves its
        future (so a done-callback may stage a checkpoint into the freed region), then
        advances the queue."""
        result = error = None
        try:
            if self._closed and job.owner is not None:
                raise StoreClosedError("the store was closed (from a checkpoint's callback) "
                                       "before this checkpoint was committed")
            if job.owner is not None:
                if job.epoch != job.owner.epoch:
                    raise SnapstoreError("an earlier checkpoint of stream "
                                         f"{job.owner.stream!r} failed, and this one builds "
                                         f"on it: {job.owner.failure}")
                result = self._commit(job.owner, job.plans, job.meta)
        except BaseException as exc:        # noqa: BLE001 - handed to the caller's future
            error = exc
            if job.owner is not None and job.epoch == job.owner.epoch:
                job.owner.failed(exc)
        try:
            try:
                if job.region is not None:
                    self.arena.free(job.region, job)
            except AssertionError as exc:   # (a bug: on the future, not killing the worker)
                error = error or exc
            if job.owner is not None and job.owner.per_capture_views:
                release_views(p.view for p in job.plans)   # even if a traceback holds them
            job.plans = []
            with self._lock:
                job.landed = True       # a capture holding its stream's lock goes on now
                self._changed.notify_all()
            if job.owner is not None:
                if error is None:
                    job.future.set_result(result)
                else:
                    job.future.set_exception(error)
        finally:
            with self._lock:
                self._queue.popleft()
                self._changed.notify_all()

    # -- a fork()ed child
    def after_fork_in_child(self) -> None:
        """Run in a fork()ed child (by the Store's fork handler): the worker thread did not
        survive the fork, so the queued jobs fail with ForkedStoreError (their futures would
        never resolve), and the persister is closed; its conditions, and its capturers' locks,
        are new (a thread of the parent may have held them)."""
        self._lock = threading.Lock()
        self._changed = WakeUps()
        self._capture_lock = threading.Lock()
        self._capture_cv = threading.Condition(self._capture_lock)
        self._submit_lock = threading.Lock()
        for owner in self._owners.values():
            owner.after_fork_in_child()
        self._captures = set()
        self._closed = True
        self._worker = None
        jobs, self._queue = list(self._queue), collections.deque()
        self._live = {}
        for job in jobs:
            if job.future is not None and not job.future.done():
                try:
                    job.future.set_exception(ForkedStoreError(
                        "this checkpoint was pending in the parent process when it fork()ed; "
                        "the parent commits it, not this child"))
                except Exception:       # (a parent thread resolved it at the fork instant)
                    pass

    # -- waiting and closing
    def pending(self, owner: Capturer) -> int:
        """How many of owner's jobs are queued or running."""
        with self._lock:
            return self._pending(owner)

    def _pending(self, owner: Capturer, landed_only: bool = False) -> int:
        # (lock held) counted from the queue and the live captures, kept by single operations
        return (sum(1 for job in self._queue
                    if job.owner is owner and not (landed_only and job.landed))
                + sum(1 for o in self._live.values() if o is owner))

    def wait_idle(self, owner: Capturer | None = None, *, what: str | None = None,
                  landed_only: bool = False) -> None:
        """Waits until no job (of owner, or at all) is queued or running: committed, and its
        future's done-callbacks returned. Never call it while holding the committer's writer
        lock: the worker needs that lock.

        landed_only=True (owner's jobs): waits only until they are committed, not for their
        callbacks. What a caller holding owner's capture lock must use: a callback may need
        that lock (close(), a checkpoint of the stream), and the two would wait for each other
        for ever.

        On the worker (in a done-callback) the running job has landed, and the jobs queued
        after it commit only once the callback returns, so nothing can be waited for: with
        such jobs pending, SnapstoreError says that `what` (the caller's operation) needs
        them to land first; what=None: return without waiting (the caller does not need
        them landed)."""
        if self.committer.forked:
            return
        if self.on_worker():
            with self._lock:
                behind = [job for job in list(self._queue)[1:]
                          if owner is None or job.owner is owner]
            if behind and what is not None:
                of = f" of stream {owner.stream!r}" if owner is not None else ""
                raise SnapstoreError(
                    f"{what} needs the {len(behind)} checkpoint(s){of} queued before it to "
                    "be committed first, and they are committed on the thread this "
                    "done-callback runs on, after it returns: do this outside the callback")
            return
        self._changed.wait_until(self._lock, lambda: not (
            self._pending(owner, landed_only) if owner is not None
            else (self._queue or self._live)))

    def close(self) -> None:
        """Flushes, stops the worker, closes every capturer (trackers included).

        Called on the worker thread itself (store.close() in a future's done-callback, which
        runs there) it cannot wait for the queue: the worker would wait for itself. Then it
        closes at once: the job whose callback runs is committed, every job queued after it
        fails with StoreClosedError, and the worker exits after them (freeing the arena)."""
        on_worker = self.on_worker()
        with self._lock:
            self._closing = True        # other threads queue nothing more: the wait ends
        if not on_worker:
            self.wait_idle()            # (Ctrl-C may stop this wait; close() again resumes)
        with self._lock:
            self._closed = True
            self._changed.notify_all()
        # a live capture that began before _closed was set (none after) ends first; the
        # worker exits once the queue is empty
        self._changed.wait_until(self._lock,
                                 lambda: not self._live and (on_worker or self._worker is None))
        with deferred_interrupts():     # write protection off, buffers released: all or none
            for owner in list(self._owners.values()):
                owner.close()
            self._owners.clear()
            if not on_worker:
                self.arena.close()
