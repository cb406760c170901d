"""Captures: Tracker (store.track) and the implicit capturer of store.checkpoint_async. The
caller is blocked only while the changed bytes are found and copied; hashing, compression, log
append, fsync and the index commit run on the persister's thread (capture/persister.py).

A capture (caller's time): ask each buffer's detector (capture/dirty.py) which byte ranges may
have changed since the previous capture — or, when it cannot vouch (first capture, after a
fork, after a failure), diff the whole buffer against the stream head's fingerprints — and
plan the chunks; the persister then gathers the planned bytes into its staging arena and tells
the detectors what was stored, from the staged copy (note_stored_many), so a page written
again meanwhile is reported next time. A delta is relative to the previous capture
(Capturer.last_id), which the persister checks is the head when it commits.

Capture reaches the engine only through the committer's public interface (read views,
options, the open check) and engine/writer.py's planning functions.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Mapping

from snapstore import _native as native
from snapstore.engine import writer as wr
from snapstore.engine.validation import validate_buffers, validate_meta
from snapstore.errors import SnapstoreError, StoreClosedError
from snapstore.halves import both, split_point

PARALLEL_DIRTY_BYTES = 8 << 20      # captures of this many bytes are diffed by two threads


def release_views(views) -> None:
    """Releases memoryviews of a caller's buffers (one still in use by a slice of it goes
    with the slice)."""
    for view in views:
        try:
            view.release()
        except BufferError:
            pass


class Capturer:
    """A stream's capture state, owned by the persister's ownership table: the detectors, the
    base of the next delta, and the failure state the persister maintains.

    persister: the store's Persister (submit, wait_idle, capturing, committer)."""

    # True when each capture's buffer views are its own (made per call), so the persister
    # releases them once the capture's job landed; a Tracker's views serve every capture.
    per_capture_views = False

    def __init__(self, persister, stream: str) -> None:
        self.persister = persister
        self.stream = stream
        self.detectors: dict = {}
        self.epoch = 0             # bumped by a failure: jobs of older epochs fail with it
        self.failure: BaseException | None = None
        # The checkpoint the next delta is relative to: the head a full diff was computed
        # against, then each committed capture (set by the persister). A job whose stream
        # head is anything else (e.g. the head was deleted) fails instead of committing a
        # delta onto the wrong base.
        self.last_id: int | None = None
        self.based = False         # whether last_id was ever read from the stream's head
        self.itemsizes: dict = {}        # buffer name -> float item size (chunk codec hint)
        # one capture at a time (detectors are not re-entrant), and close() waits for the one
        # in progress; re-entrant: a capture's done-callback may close the store
        self._lock = threading.RLock()

    def stored_fingerprints(self) -> dict:
        """{buffer name: (checkpoint id, page size, page fingerprints)} of the stream's last
        capture, from detectors that can vouch for every page (Detector.stored_fingerprints),
        once its jobs landed (the persister's wait_idle) and none failed; else {}. The id is
        the checkpoint they describe: a plan uses them only while it is the stream's head."""
        with self._lock:
            # (a plain checkpoint in a done-callback runs on the worker, where nothing keeps a
            # capture of the stream in another thread apart from it: the tables may hold that
            # capture's copy, whose job is queued now, under the old last_id)
            if self.failure is not None or not self.based or self.last_id is None or \
                    self.persister.pending(self):
                return {}
            page_size = self.persister.committer.options.page_size
            known = {}
            for name, det in self.detectors.items():
                digests = det.stored_fingerprints()
                if digests is not None and det.page_size == page_size:
                    known[name] = (self.last_id, page_size, digests)
            return known

    def after_fork_in_child(self) -> None:
        """Run in a fork()ed child (by the persister's): a fresh capture lock, since a thread
        of the parent may have held it mid-capture at the fork (close() in the child would
        wait for it for ever)."""
        self._lock = threading.RLock()

    def failed(self, exc: BaseException) -> None:
        """A job of this stream failed: its later jobs fail with it; the next capture diffs
        in full."""
        self.epoch += 1
        self.failure = exc

    def close(self) -> None:
        """Closes the detectors (removes write protection, releases the buffers), once a
        capture in progress is done with them."""
        with self._lock:
            for d in self.detectors.values():
                d.close()

    def _capture(self, views: Mapping[str, memoryview], meta: Any) -> Future:
        self.persister.committer.check_open(write=True)   # before touching the detectors
        with self._lock:
            try:
                return self._capture_locked(views, meta)
            except BaseException as exc:
                # The detectors moved on (dirty() was called) but nothing was queued: the next
                # capture must diff in full. Jobs queued earlier stay valid (same epoch).
                self.failure = exc
                raise

    def _capture_locked(self, views: Mapping[str, memoryview], meta: Any) -> Future:
        persister = self.persister
        committer = persister.committer
        opts = committer.options
        full_diff = {}
        plans = []
        with persister.capturing():
            dirt = self._dirty(views)                # first: arms or re-protects tracking
            for name, view in views.items():
                ranges = dirt[name]
                if ranges is None or self.failure is not None:
                    full_diff[name] = view
                else:
                    plans.append(wr.plan_delta(name, view, ranges, 0, opts,
                                               self.itemsizes.get(name, 1)))
        if plans and not full_diff and self.based and self.failure is None \
                and not persister.pending(self):
            # The deltas are relative to this stream's last capture, which has landed: when
            # another writer (or a delete) moved the head since, this capture builds on the
            # head it finds, as checkpoint() does, by diffing every buffer against it. (A
            # head that moves while a capture's job waits is its CommitConflict.)
            with committer.read_cached() as r:
                if r.stream_head(self.stream) != self.last_id:
                    full_diff, plans = dict(views), []
        # A capture of no buffers has nothing to diff in full, but it too must learn the head
        # its (empty) delta goes onto: on its first capture and after a failure.
        if full_diff or not self.based or self.failure is not None:
            # The head must be this stream's newest capture: let pending jobs land first.
            persister.wait_idle(self, what="a checkpoint that diffs against the stream's head "
                                           "(the first, or the next after a failure)",
                                landed_only=True)
            if self.failure is not None and plans:
                # a job failed while we waited: the deltas dirty() gave are relative to its
                # copy, which the store never got; every buffer is diffed against the head
                full_diff, plans = dict(views), []
            self.failure = None
            committer.check_open(write=True)
            # the cache as it is (an S3 store's): the caller never waits for the network; a
            # head that moved meanwhile is the commit's CommitConflict, on the future
            with committer.read_cached() as r:
                head = r.stream_head(self.stream)
                if plans and self.based and head != self.last_id:
                    # another writer (or a delete) moved the head since this stream's last
                    # capture, which the deltas dirty() gave are relative to: laid onto the
                    # new head they would mix its pages in (no error). As after a failure,
                    # every buffer is diffed against the head instead
                    full_diff, plans = dict(views), []
                self.last_id, self.based = head, True
                parent = r.checkpoint(head) if head is not None else None
                diffed = wr.plan_buffers(r, self.stream, head, parent, full_diff, opts,
                                         "pages", self.itemsizes)
            for plan in diffed:
                # the detector's baseline is the buffer at dirty(); what the store holds of
                # the pages this delta leaves out is the buffer as the diff read it
                if plan.base == "delta" and plan.name in self.detectors:
                    self.detectors[plan.name].note_store_holds(bytes(plan.fingerprints))
            plans += diffed
        return persister.submit(self, plans, meta,
                                narrowable=frozenset(views) - frozenset(full_diff))


    def _dirty(self, views: Mapping[str, memoryview]) -> dict:
        """{name: detector.dirty()} of every buffer. Hash detectors (a C fingerprint diff
        without the GIL, each detector its own) run on both cores when there is enough to
        diff: the buffers split where half of the bytes are."""
        names = list(views)
        total = sum(len(views[n]) for n in names)
        # A hash detector may skip its pass after a dense interval and report the whole
        # buffer, if the capture can stage it (the copy then tells what changed: submit()).
        skip = total <= self.persister.arena.capacity
        if total < PARALLEL_DIRTY_BYTES or len(names) < 2 or \
                any(self.detectors[n].mode != "hash" for n in names):
            return {n: self.detectors[n].dirty(skip) for n in names}
        at = split_point([len(views[n]) for n in names])
        first, second = both(lambda: {n: self.detectors[n].dirty(skip) for n in names[:at]},
                             lambda: {n: self.detectors[n].dirty(skip) for n in names[at:]})
        return {**first, **second}


class Tracker(Capturer):
    """Takes a stream's checkpoints of a fixed set of buffers, finding changed pages with a
    dirty-page detector (store.track(...) makes one). Owns its stream until closed."""

    def __init__(self, persister, buffers: Mapping[str, Any], stream: str, mode: str) -> None:
        from snapstore.capture import dirty    # on first use: it installs a fork handler
        super().__init__(persister, stream)
        self.views = validate_buffers(buffers, stream, self.itemsizes)
        self._closed = False
        persister.claim(self)
        try:
            page_size = persister.committer.options.page_size
            for name, view in self.views.items():
                self.detectors[name] = dirty.make_detector(view, mode, page_size)
        except BaseException:
            Capturer.close(self)
            persister.release(self)
            raise

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
        """Takes a checkpoint and waits until it is durable; returns its CheckpointInfo. Not
        from a checkpoint's done-callback (SnapstoreError): it runs on the thread that
        commits checkpoints, which would wait for itself; use checkpoint_async() there."""
        if self.persister.on_worker():
            raise SnapstoreError("tracker.checkpoint() waits for the checkpoint to be committed, "
                                 "and a done-callback runs on the thread that commits them: "
                                 "use checkpoint_async() in a callback")
        return self.checkpoint_async(meta).result()

    def close(self) -> None:
        """Waits for this tracker's pending checkpoints to be committed (not for their
        done-callbacks: one may close the store, which needs the lock this holds), removes
        protection, frees the stream. Idempotent; closing the store closes its trackers."""
        if self._closed:
            return
        self._closed = True
        with self._lock:                # a capture in progress finishes (or fails) first
            # committed, not their callbacks: one may close the store, which needs this lock
            self.persister.wait_idle(self, landed_only=True)
            super().close()
        self.persister.release(self)
        # The caller's buffers are free again (resize, free, mmap.close) once no job needs
        # them: at once, or when the last pending job drops them (close() in a callback).
        views, self.views = self.views, {}
        if not self.persister.pending(self):
            release_views(views.values())

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<snapstore.Tracker stream={self.stream!r} mode={self.mode}>"


class ImplicitCapturer(Capturer):
    """store.checkpoint_async's per-stream state: a hash detector per buffer, rebuilt when the
    caller hands in different memory."""

    per_capture_views = True

    def __init__(self, persister, stream: str) -> None:
        super().__init__(persister, stream)
        self._memory: dict[str, tuple[int, int]] = {}   # buffer name -> (address, length)

    def capture(self, views: Mapping[str, memoryview], meta: Any,
                itemsizes: dict | None = None) -> Future:
        """Captures the buffers. Between captures the detectors hold only fingerprints, no
        export of the caller's buffers (detach()), so once the capture's job has landed
        (store.flush()) the caller may resize, free or close them."""
        # One capture of the stream at a time, from attach() to detach(): two threads
        # capturing the stream at once swapped each other's detectors (wrong bytes).
        with self._lock:
            return self._capture_attached(views, meta, itemsizes)

    def _capture_attached(self, views: Mapping[str, memoryview], meta: Any,
                          itemsizes: dict | None) -> Future:
        from snapstore.capture import dirty    # on first use: it installs a fork handler
        page_size = self.persister.committer.options.page_size
        try:
            for name, view in views.items():
                key = (native.buffer_address(view) if len(view) else 0, len(view))
                det = self.detectors.get(name)
                if det is not None and self._memory.get(name) == key:
                    det.attach(view)
                else:
                    if det is not None:
                        det.close()
                    self.detectors[name] = dirty.make_detector(view, "hash", page_size)
                    self._memory[name] = key
            for name in set(self.detectors) - set(views):
                self.detectors.pop(name).close()
                self._memory.pop(name, None)
            self.itemsizes = dict(itemsizes or {})
            return self._capture(views, meta)
        finally:
            for det in self.detectors.values():
                det.detach()
