"""Dirty-page trackers and asynchronous checkpoints: the caller is blocked only while the
changed bytes are found and copied; hashing, compression, log append, fsync and the index
commit run on a background thread.

A capture (caller's time): ask each buffer's detector (snapstore.dirty) which byte ranges may
have changed since the previous capture — or, when it cannot vouch (first capture, after a
fork, after a failure), diff the whole buffer against the stream head's fingerprints — plan
the chunks, and gather the planned bytes into the staging arena (C gather). Detectors are then
told what was stored, from the staged copy (note_stored), so a page written again meanwhile is
reported next time. The job goes to one worker thread that persists jobs in the order they were
taken (Store._persist), so a stream's checkpoints commit in order; a delta is relative to the
previous capture, which is the head when it commits. If a job fails, the later jobs of the same
stream that build on it fail too, and the next capture diffs in full.

The staging arena is a ring of `staging_bytes` (default 1 GiB, huge-page backed) freed in
FIFO order; a capture that does not fit waits (back-pressure), and one larger than the whole
arena is persisted synchronously from the live buffers instead.
"""
from __future__ import annotations

import collections
import contextlib
import mmap
import threading
from concurrent.futures import Future
from typing import Any, Mapping

from snapstore.engine import writer as wr
from snapstore.engine.validation import validate_meta
from snapstore.errors import InvalidArgumentError, SnapstoreError, StoreClosedError

DEFAULT_STAGING_BYTES = 1 << 30


class StagingArena:
    """A ring buffer of staging memory; regions are freed in the order they were taken."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._cv = threading.Condition()
        self._regions: collections.deque = collections.deque()   # (start, end), oldest first
        self._head = 0

    def _memory(self) -> memoryview:
        if self._view is None:
            self._mm = mmap.mmap(-1, self.capacity)
            if hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    self._mm.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass
            self._view = memoryview(self._mm)
        return self._view

    def _place(self, n: int) -> int | None:
        if not self._regions:
            return 0
        tail = self._regions[0][0]          # the oldest region still in use
        if self._head > tail:               # free: [head, capacity) and [0, tail)
            if self.capacity - self._head >= n:
                return self._head
            return 0 if n <= tail else None
        return self._head if self._head + n <= tail else None   # free: [head, tail)

    def alloc(self, n: int) -> tuple[int, memoryview]:
        """Blocks until n contiguous bytes are free; returns (region id, memory)."""
        if n > self.capacity:
            raise ValueError("larger than the arena")
        with self._cv:
            while (start := self._place(n)) is None:
                self._cv.wait()
            self._regions.append((start, start + n))
            self._head = start + n
            return start, self._memory()[start:start + n]

    def free(self, start: int) -> None:
        with self._cv:
            first = self._regions.popleft()
            assert first[0] == start, "staging regions must be freed in order"
            if not self._regions:
                self._head = 0
            self._cv.notify_all()

    def close(self) -> None:
        if self._view is not None:
            view, mm, self._view, self._mm = self._view, self._mm, None, None
            try:
                view.release()
                mm.close()
            except BufferError:     # a view of it still lives: the mapping goes with it
                pass


class _Job:
    __slots__ = ("owner", "epoch", "plans", "meta", "region", "future")

    def __init__(self, owner, epoch, plans, meta, region) -> None:
        self.owner, self.epoch, self.plans, self.meta, self.region = owner, epoch, plans, meta, region
        self.future: Future = Future()


class _Capturer:
    """What a tracker and store.checkpoint_async share: detectors, capture, failure handling."""

    def __init__(self, store, stream: str) -> None:
        self.store = store
        self.stream = stream
        self.detectors: dict = {}
        self.epoch = 0             # bumped by a failure: jobs of older epochs fail with it
        self.failure: BaseException | None = None
        self.pending = 0
        self.lock = threading.Lock()    # one capture at a time: detectors are not re-entrant
        # The checkpoint the next delta is relative to: the head a full diff was computed
        # against, then each committed capture. A job whose stream head is anything else
        # (e.g. the head was deleted) fails instead of committing a delta onto the wrong base.
        self.last_id: int | None = None

    def _capture(self, views: Mapping[str, memoryview], meta: Any) -> Future:
        with self.lock:
            return self._capture_locked(views, meta)

    def _capture_locked(self, views: Mapping[str, memoryview], meta: Any) -> Future:
        store = self.store
        engine = store._async
        full_diff = []
        plans = []
        opts = store.options
        with engine.capturing():
            for name, view in views.items():
                det = self.detectors[name]
                ranges = det.dirty()                 # first: arms or re-protects the tracking
                if ranges is None or self.failure is not None:
                    full_diff.append(name)
                else:
                    plans.append(wr.plan_delta(name, view, ranges, 0, opts))
        if full_diff:
            # The head must be this stream's newest capture: let pending jobs land first.
            engine.wait_idle(self)
            self.failure = None
            with store._check_open(write=True).read() as r:
                head = r.stream_head(self.stream)
                self.last_id = head
                parent = r.checkpoint(head) if head is not None else None
                parents = {b.name: b for b in parent.buffers} if parent else {}
                for name in full_diff:
                    prev = r.fingerprints(self.stream, name)
                    prev_fps = prev[2] if prev and prev[0] == head and \
                        prev[1] == opts.page_size else None
                    plans.append(wr.plan_buffer(name, views[name], parents.get(name), prev_fps,
                                                opts, "pages"))
        return engine.submit(self, plans, meta)

    def _failed(self, exc: BaseException) -> None:
        self.epoch += 1
        self.failure = exc


class AsyncCheckpointer:
    """The store's background persister: one worker thread, one staging arena."""

    def __init__(self, store, staging_bytes: int) -> None:
        self.store = store
        self.arena = StagingArena(staging_bytes)
        self._cv = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.owners: dict[str, _Capturer] = {}      # stream -> tracker or implicit capturer
        self._captures = 0
        self._capture_cv = threading.Condition()

    # -- captures have priority: the caller is blocked during them, the worker is not
    @contextlib.contextmanager
    def capturing(self):
        """Marks a capture in progress: the worker pauses between chunks meanwhile, so the
        caller's thread does not wait for the GIL behind background work."""
        with self._capture_cv:
            self._captures += 1
        try:
            yield
        finally:
            with self._capture_cv:
                self._captures -= 1
                if not self._captures:
                    self._capture_cv.notify_all()

    def yield_to_captures(self) -> None:
        """Called by the worker between chunks: waits while a capture runs (bounded, so a
        stuck caller never stalls persisting for long)."""
        if self._captures:
            with self._capture_cv:
                self._capture_cv.wait_for(lambda: not self._captures, timeout=0.05)

    # -- submitting
    def submit(self, owner: _Capturer, plans: list, meta: Any) -> Future:
        total = sum(p.nbytes for p in plans)
        if total > self.arena.capacity:
            # Too big to stage: persist from the live buffers now (the caller waits).
            self.wait_idle(owner)
            future: Future = Future()
            try:
                future.set_result(self._persist(owner, plans, meta, live=True))
            except BaseException as exc:
                owner._failed(exc)
                future.set_exception(exc)
            return future
        region, memory = self.arena.alloc(total) if total else (None, None)
        try:
            with self.capturing():
                self._stage_all(owner, plans, memory)
        except BaseException:
            if region is not None:
                self._free_tail(region)
            raise
        return self._enqueue(owner, plans, meta, region)

    @staticmethod
    def _stage_all(owner: _Capturer, plans: list, memory) -> None:
        pos = 0
        for p in plans:
            det = owner.detectors[p.name]
            wr.stage(p, memory[pos:pos + p.nbytes] if memory is not None else memoryview(b""),
                     det.note_stored_many)
            pos += p.nbytes

    def _enqueue(self, owner: _Capturer, plans: list, meta: Any, region) -> Future:
        job = _Job(owner, owner.epoch, plans, meta, region)
        with self._cv:
            if self._closed:
                raise StoreClosedError("store is closed")
            self._queue.append(job)
            owner.pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="snapstore-persist",
                                                daemon=True)
                self._thread.start()
            self._cv.notify_all()
        return job.future

    def _free_tail(self, region: int) -> None:
        # A region taken by a capture that failed before queueing: it is the newest, and
        # every older one is queued; free it after them by queueing an empty job.
        job = _Job(None, 0, [], None, region)
        with self._cv:
            self._queue.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="snapstore-persist",
                                                daemon=True)
                self._thread.start()
            self._cv.notify_all()

    # -- the worker
    def _persist(self, owner: _Capturer, plans: list, meta: Any, live: bool = False):
        store = self.store
        callbacks = {p.name: owner.detectors[p.name].note_stored for p in plans} if live else None

        def checked_plans(r, head, parent):
            if head != owner.last_id:
                raise SnapstoreError(f"stream {owner.stream!r} head is checkpoint {head}, but "
                                     f"this capture is relative to {owner.last_id}; the next "
                                     "capture will diff in full")
            return plans

        with store._lock:
            index = store._check_open(write=True)
            info = store._persist(index, owner.stream, checked_plans, meta, callbacks,
                                  pause=None if live else self.yield_to_captures)
        owner.last_id = info.id
        return info

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue:
                    if self._closed:
                        return
                    self._cv.wait()
                job = self._queue[0]
            try:
                if job.owner is not None:
                    if job.epoch != job.owner.epoch:
                        raise SnapstoreError("an earlier checkpoint of stream "
                                             f"{job.owner.stream!r} failed, and this one builds "
                                             f"on it: {job.owner.failure}")
                    job.future.set_result(self._persist(job.owner, job.plans, job.meta))
            except BaseException as exc:        # noqa: BLE001 - handed to the caller's future
                if job.owner is not None:
                    if job.epoch == job.owner.epoch:
                        job.owner._failed(exc)
                    job.future.set_exception(exc)
            finally:
                if job.region is not None:
                    self.arena.free(job.region)
                for p in job.plans:
                    p.staged = None
                with self._cv:
                    self._queue.popleft()
                    if job.owner is not None:
                        job.owner.pending -= 1
                    self._cv.notify_all()

    # -- waiting
    def wait_idle(self, owner: _Capturer | None = None) -> None:
        """Waits until no job (of owner, or at all) is queued or running."""
        if self._thread is threading.current_thread():
            return
        with self._cv:
            while (owner.pending if owner is not None else self._queue):
                self._cv.wait()

    def prepare_sync_checkpoint(self, stream: str) -> None:
        """A plain checkpoint() of a stream: refuse if a tracker owns it; otherwise let the
        stream's async checkpoints land and forget their capture state."""
        owner = self.owners.get(stream)
        if owner is None:
            return
        if isinstance(owner, Tracker):
            raise InvalidArgumentError(f"stream {stream!r} is tracked by a Tracker; use "
                                       "tracker.checkpoint() (or close the tracker)")
        self.wait_idle(owner)
        del self.owners[stream]

    def prepare_delete(self, stream: str, is_head: bool) -> None:
        """Deleting a stream's head would pull the base from under its captures: refuse for a
        tracker; for checkpoint_async state, let its jobs land and forget it."""
        owner = self.owners.get(stream)
        if owner is None or not is_head:
            return
        if isinstance(owner, Tracker):
            raise InvalidArgumentError(f"that checkpoint is the head of stream {stream!r}, "
                                       "which a tracker owns; close the tracker first")
        self.wait_idle(owner)
        self.owners.pop(stream, None)

    def close(self) -> None:
        """Flushes, stops the worker, closes trackers."""
        self.wait_idle()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        for owner in list(self.owners.values()):
            if isinstance(owner, Tracker):
                owner._close_detectors()
        self.owners.clear()
        self.arena.close()


class Tracker(_Capturer):
    """Takes a stream's checkpoints of a fixed set of buffers, finding changed pages with a
    dirty-page detector (store.track(...) makes one). Owns its stream until closed."""

    def __init__(self, store, buffers: Mapping[str, Any], stream: str, mode: str) -> None:
        from snapstore.capture import dirty
        super().__init__(store, stream)
        self.views = store._validate_buffers(buffers, stream)
        engine = store._async
        if stream in engine.owners:
            owner = engine.owners[stream]
            if isinstance(owner, Tracker):
                raise InvalidArgumentError(f"stream {stream!r} already has a tracker")
            engine.wait_idle(owner)
        try:
            for name, view in self.views.items():
                self.detectors[name] = dirty.make_detector(view, mode, store.options.page_size)
        except BaseException:
            self._close_detectors()
            raise
        engine.owners[stream] = self
        self._closed = False

    @property
    def mode(self) -> str:
        """The tracking mode in use ("uffd", "hash", "shadow", "full"; "mixed" if buffers
        differ)."""
        modes = {d.mode for d in self.detectors.values()}
        return modes.pop() if len(modes) == 1 else ("mixed" if modes else "full")

    @property
    def reason(self) -> str:
        """Why that mode: per buffer, what the detector chose and why."""
        return "; ".join(f"{name}: {d.reason}" for name, d in self.detectors.items())

    def checkpoint_async(self, meta: Any = None) -> Future:
        """Captures the changed pages and returns a future of the CheckpointInfo, resolved once
        the checkpoint is durable. The buffers may be modified as soon as this returns."""
        meta = validate_meta(meta)
        if self._closed:
            raise StoreClosedError("tracker is closed")
        return self._capture(self.views, meta)

    def checkpoint(self, meta: Any = None):
        """Takes a checkpoint and waits until it is durable; returns its CheckpointInfo."""
        return self.checkpoint_async(meta).result()

    def _close_detectors(self) -> None:
        for d in self.detectors.values():
            d.close()

    def close(self) -> None:
        """Waits for this tracker's pending checkpoints, removes protection, frees the stream."""
        if self._closed:
            return
        self._closed = True
        engine = self.store._async
        engine.wait_idle(self)
        self._close_detectors()
        if engine.owners.get(self.stream) is self:
            del engine.owners[self.stream]

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<snapstore.Tracker stream={self.stream!r} mode={self.mode}>"


class ImplicitCapturer(_Capturer):
    """store.checkpoint_async's per-stream state: a hash detector per buffer, rebuilt when the
    caller hands in different memory."""

    def capture(self, views: Mapping[str, memoryview], meta: Any) -> Future:
        from snapstore.capture import dirty
        from snapstore._native import buffer_address
        for name, view in views.items():
            key = (buffer_address(view), len(view))
            det = self.detectors.get(name)
            if det is None or getattr(det, "_snap_key", None) != key:
                if det is not None:
                    det.close()
                det = dirty.make_detector(view, "hash", self.store.options.page_size)
                det._snap_key = key
                self.detectors[name] = det
        for name in set(self.detectors) - set(views):
            self.detectors.pop(name).close()
        return self._capture(views, meta)
