"""The Store: opens a store (storedir: lock and format; recovery: log replay) and offers
checkpoint, restore, read, delete, maintenance and stats. Commit protocol (docs/design.md):

  1. append the checkpoint's new chunk records, then its commit record, to the log;
  2. make them durable (fdatasync; skipped with durability="none");
  3. apply the commit to the index in one LMDB write transaction, which also advances the
     applied log position.

A checkpoint is visible iff step 3 happened; it is durable iff step 2 did, and a durable
commit that step 3 missed (crash) is applied by recovery when a writer next opens the store.
A failure before step 2 completes truncates the log back, leaving no trace.
"""
from __future__ import annotations

import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from snapstore import _native as native
from snapstore.engine import compact as compaction
from snapstore.engine import format as fmt
from snapstore.engine import records
from snapstore.engine import storedir
from snapstore.engine import writer as wr
from snapstore.engine.memory import OutputBytes
from snapstore.engine.crashpoints import crashpoint
from snapstore.errors import (CheckpointNotFound, InvalidArgumentError, ReadOnlyError, SnapstoreError,
                     StoreClosedError, StoreIOError)
from snapstore.engine.index import Index, IndexView
from snapstore.engine.reader import find_buffer, restore_range
from snapstore.engine.records import Commit
from snapstore.engine.recovery import recover
from snapstore.engine.segments import LocalSegments, SegmentBackend, SegmentLog
from snapstore.engine.upgrade import upgrade as upgrade_store
from snapstore.capture.tracker import DEFAULT_STAGING_BYTES, AsyncCheckpointer, ImplicitCapturer, Tracker
from snapstore.engine.validation import check_choice, validate_meta, validate_name
from snapstore.engine.verify import verify as verify_store


@dataclass(frozen=True)
class CheckpointInfo:
    """What the store knows of one checkpoint."""
    id: int
    stream: str
    kind: str                 # "full" | "incremental"
    parent: int | None
    created: float            # seconds since the epoch
    meta: Any
    sizes: dict               # {buffer name: bytes}
    bytes_new: int            # bytes this checkpoint added to the log
    chain_length: int         # deltas to apply above the nearest full manifest (0: full)
    tags: tuple = field(default=())
    seq: int = 0              # position in its stream when taken: 1, 2, 3... (never reused)

    @classmethod
    def from_commit(cls, c: Commit) -> "CheckpointInfo":
        return cls(c.id, c.stream, c.kind, c.parent, c.created, c.meta,
                   {b.name: b.size for b in c.buffers}, c.bytes_new, c.chain_length,
                   tuple(c.tags), c.seq)


class Store:
    """An open store. Use snapstore.open(); safe to share between threads of one process."""

    def __init__(self, path: str, *, durability: str = "fsync", create: bool = True,
                 readonly: bool = False, timeout: float = 0.0,
                 page_size: int = fmt.DEFAULT_PAGE_SIZE,
                 chunk_size: int = fmt.DEFAULT_CHUNK_SIZE, chunking: str = "pages",
                 cdc_sizes: tuple = fmt.DEFAULT_CDC_SIZES, max_chain: int = fmt.DEFAULT_MAX_CHAIN,
                 full_threshold: float = fmt.DEFAULT_FULL_THRESHOLD, compression: str = "zstd",
                 compression_level: int = fmt.DEFAULT_COMPRESSION_LEVEL,
                 segment_size: int = fmt.DEFAULT_SEGMENT_SIZE,
                 staging_bytes: int = DEFAULT_STAGING_BYTES,
                 backend: SegmentBackend | None = None) -> None:
        self.path = os.fspath(path)
        self.durability = check_choice(durability, fmt.DURABILITY_MODES, "durability")
        self.readonly = bool(readonly)
        self.options = self._validate_options(page_size, chunk_size, chunking, cdc_sizes,
                                              max_chain, full_threshold, compression,
                                              compression_level)
        if not isinstance(segment_size, int) or segment_size < (1 << 16):
            raise InvalidArgumentError("segment_size must be an int of at least 64 KiB")
        if not isinstance(staging_bytes, int) or staging_bytes < (1 << 20):
            raise InvalidArgumentError("staging_bytes must be an int of at least 1 MiB")
        self._async = AsyncCheckpointer(self, staging_bytes)
        self._lock = threading.RLock()
        self._lock_fd: int | None = None
        self._index: Index | None = None
        self._log: SegmentLog | None = None
        self._staging: bytearray | None = None
        self._closed = False
        durable = self.durability == "fsync"
        try:
            self._lock_fd = storedir.open_directory(self.path, create=create,
                                                    readonly=self.readonly, timeout=timeout)
            self._index = Index(os.path.join(self.path, fmt.INDEX_DIR), readonly=self.readonly,
                                durable=durable)
            self.backend = backend or LocalSegments(os.path.join(self.path, fmt.SEGMENTS_DIR),
                                                    durable=durable)
            if not self.readonly:
                upgrade_store(self.path, self._index)   # before anything writes to the index
                try:
                    recover(self._index, self.backend, durable)
                except OSError as exc:
                    if isinstance(exc, SnapstoreError):
                        raise
                    raise StoreIOError(f"cannot recover the log: {exc.strerror or exc}",
                                       exc.errno) from exc
                self._log = SegmentLog(self.backend, segment_size)
                self._log.open_tail()
        except BaseException:
            self._release()
            raise

    # ---- opening and closing ------------------------------------------------------------
    @staticmethod
    def _validate_options(page_size, chunk_size, chunking, cdc_sizes, max_chain,
                          full_threshold, compression, compression_level) -> wr.WriteOptions:
        if (not isinstance(page_size, int) or page_size < native.PAGE_MIN
                or page_size > native.PAGE_MAX or page_size & (page_size - 1)):
            raise InvalidArgumentError(f"page_size must be a power of two from {native.PAGE_MIN} "
                                       f"to {native.PAGE_MAX}, got {page_size!r}")
        if (not isinstance(chunk_size, int) or chunk_size < page_size or chunk_size % page_size
                or chunk_size > wr.STAGING_BYTES):
            raise InvalidArgumentError("chunk_size must be a multiple of page_size and at most "
                                       f"{wr.STAGING_BYTES} bytes, got {chunk_size!r}")
        check_choice(chunking, fmt.CHUNKING_MODES, "chunking")
        check_choice(compression, fmt.COMPRESSION_MODES, "compression")
        try:
            native.Chunker(*cdc_sizes)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(f"cdc_sizes {cdc_sizes!r} are invalid: {exc}") from exc
        if cdc_sizes[2] > wr.STAGING_BYTES:
            raise InvalidArgumentError(f"cdc max size must be at most {wr.STAGING_BYTES} bytes")
        if not isinstance(max_chain, int) or max_chain < 1:
            raise InvalidArgumentError("max_chain must be an int >= 1")
        if not isinstance(full_threshold, (int, float)) or not 0 <= full_threshold <= 1:
            raise InvalidArgumentError("full_threshold must be a number from 0 to 1")
        return wr.WriteOptions(page_size, chunk_size, chunking, tuple(cdc_sizes), max_chain,
                               float(full_threshold), compression, compression_level)

    def _release(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._index is not None:
            self._index.close()
            self._index = None
        if getattr(self, "backend", None) is not None:
            self.backend.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def close(self) -> None:
        """Waits for pending asynchronous checkpoints, closes trackers, closes the store.
        Idempotent. Checkpoints returned earlier stay committed."""
        if not self._closed and not self.readonly:
            self._async.close()          # before the lock: the worker needs it
        with self._lock:
            if not self._closed:
                self._closed = True
                self._release()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._closed

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "closed" if self._closed else ("read-only" if self.readonly else "writer")
        return f"<snapstore.Store {self.path!r} {mode}>"

    def _check_open(self, write: bool = False) -> Index:
        if self._closed or self._index is None:
            raise StoreClosedError(f"store {self.path} is closed")
        if write and self.readonly:
            raise ReadOnlyError(f"store {self.path} was opened read-only")
        return self._index

    # ---- writing ------------------------------------------------------------------------------
    def _append_index_record(self, rtype: int, parts: list, apply_extra=None) -> tuple[int, int]:
        """Appends one index record, makes the log durable and applies the record to the index.
        On any failure before the index commit the log is rolled back to where it was.
        Returns the log position just past the record."""
        return self._append_index_records([(rtype, parts)], apply_extra)

    def _append_index_records(self, batch: list, apply_extra=None) -> tuple[int, int]:
        """The same for several records: one sync, one index transaction (all or nothing)."""
        log = self._log
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
            with self._index.write() as w:
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

    def checkpoint(self, buffers: Mapping[str, Any], stream: str = "default", meta: Any = None,
                   *, chunking: str | None = None) -> CheckpointInfo:
        """Takes a checkpoint of named buffers and makes it durable.

        Args:
            buffers: {name: C-contiguous bytes-like object} (bytes, bytearray, memoryview,
                mmap, numpy arrays...). Each buffer is diffed page-wise against the stream's
                previous checkpoint and stored incrementally when that pays.
            stream: the stream (sequence of checkpoints) this one extends.
            meta: JSON-serialisable user metadata.
            chunking: "pages" (default of the store) or "cdc" for content that shifts.
        Returns: CheckpointInfo.
        Raises: TypeError / InvalidArgumentError for bad input (before anything is written),
            StoreIOError (disk full, I/O error: nothing of the checkpoint is visible).
        """
        views = self._validate_buffers(buffers, stream)
        layout = check_choice(chunking or self.options.chunking, fmt.CHUNKING_MODES, "chunking")
        meta = validate_meta(meta)
        self._check_open(write=True)
        self._async.prepare_sync_checkpoint(stream)
        with self._lock:
            index = self._check_open(write=True)

            def plans(r: IndexView, head: int | None, parent: Commit | None) -> list:
                parents = {b.name: b for b in parent.buffers} if parent else {}
                out = []
                for name, view in views.items():
                    prev = r.fingerprints(stream, name)
                    prev_fps = prev[2] if prev and prev[0] == head and \
                        prev[1] == self.options.page_size else None
                    out.append(wr.plan_buffer(name, view, parents.get(name), prev_fps,
                                              self.options, layout))
                return out
            return self._persist(index, stream, plans, meta)

    @staticmethod
    def _validate_buffers(buffers: Mapping[str, Any], stream: str, writable: bool = False) -> dict:
        validate_name(stream, "stream")
        if not isinstance(buffers, Mapping):
            raise TypeError(f"buffers must be a mapping of name to buffer, got "
                            f"{type(buffers).__name__}")
        views = {}
        for name, obj in buffers.items():
            validate_name(name, "buffer name")
            views[name] = native.as_bytes_view(obj, writable=writable)
        return views

    def _persist(self, index: Index, stream: str, make_plans, meta: Any,
                 on_stored: dict | None = None, pause=None) -> CheckpointInfo:
        """Stores planned buffers as the stream's next checkpoint and commits it (lock held).

        make_plans(view, head id, head commit) returns the BufferPlans; a delta plan is
        relative to the head. A delta that reaches max_chain is rebased into a full manifest
        (manifest work only). on_stored: {buffer name: callback(offset, stored bytes)}."""
        opts = self.options
        log = self._log
        if self._staging is None:
            self._staging = bytearray(wr.STAGING_BYTES)
        mark = log.position
        fingerprints = []
        try:
            with index.read() as r:
                head = r.stream_head(stream)
                parent = r.checkpoint(head) if head is not None else None
                parents = {b.name: b for b in parent.buffers} if parent else {}
                sink = wr.ChunkSink(log, r, opts, pause)
                entries = []
                for plan in make_plans(r, head, parent):
                    if plan.base == "delta":
                        pb = parents.get(plan.name)
                        if pb is None or pb.size != len(plan.view) or pb.layout != "pages" \
                                or pb.page_size != plan.page_size:
                            raise SnapstoreError(
                                f"buffer {plan.name!r} of stream {stream!r} changed under its "
                                "tracker (another writer checkpointed the stream)")
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
            # bytes_new counts the commit record too, whose size depends on bytes_new's digits.
            while True:
                total = sink.bytes_new + fmt.RECORD_HEADER.size + \
                    sum(len(p) for p in commit.encode())
                if total == commit.bytes_new:
                    break
                commit.bytes_new = total

            def put_fingerprints(w) -> None:
                for name, fps in fingerprints:
                    w.put_fingerprints(stream, name, new_id, opts.page_size, fps)

            self._append_index_record(fmt.REC_COMMIT, commit.encode(), put_fingerprints)
        except OSError as exc:
            log.rollback(mark)
            if isinstance(exc, SnapstoreError):
                raise
            raise StoreIOError(f"checkpoint failed: {exc.strerror or exc}", exc.errno) from exc
        except BaseException:
            log.rollback(mark)
            raise
        return CheckpointInfo.from_commit(commit)

    def track(self, buffers: Mapping[str, Any], stream: str = "default",
              mode: str = "auto") -> Tracker:
        """A Tracker of these buffers for the stream: tracker.checkpoint() /
        checkpoint_async() find changed pages with the kernel's write tracking ("uffd"), the
        C fingerprint diff ("hash"), an exact shadow copy ("shadow") or not at all ("full");
        "auto" picks uffd where the kernel supports it for that memory, else hash
        (tracker.mode, tracker.reason say which and why). The tracker owns the stream until
        tracker.close(); the buffers must stay the same objects."""
        if mode not in ("auto", "uffd", "hash", "shadow", "full"):
            raise InvalidArgumentError(f"mode must be auto, uffd, hash, shadow or full; got "
                                       f"{mode!r}")
        self._check_open(write=True)
        return Tracker(self, buffers, stream, mode)

    def checkpoint_async(self, buffers: Mapping[str, Any], stream: str = "default",
                         meta: Any = None):
        """Like checkpoint(), but returns a concurrent.futures.Future of the CheckpointInfo as
        soon as the changed pages are copied to staging memory; the rest happens in the
        background. Checkpoints of a stream commit in the order they were taken. The future
        resolves once the checkpoint is durable, or raises its error."""
        views = self._validate_buffers(buffers, stream)
        meta = validate_meta(meta)
        self._check_open(write=True)
        engine = self._async
        owner = engine.owners.get(stream)
        if isinstance(owner, Tracker):
            raise InvalidArgumentError(f"stream {stream!r} is tracked by a Tracker; use "
                                       "tracker.checkpoint_async()")
        if owner is None:
            owner = engine.owners[stream] = ImplicitCapturer(self, stream)
        return owner.capture(views, meta)

    def flush(self) -> None:
        """Waits until every pending asynchronous checkpoint is durable (or failed)."""
        if not self.readonly:
            self._async.wait_idle()

    def save(self, obj: Any, stream: str = "default", meta: Any = None,
             **options) -> CheckpointInfo:
        """Checkpoints a picklable object graph; large buffers (NumPy arrays, tensors,
        PickleBuffers) go out of band, each diffed page-wise against the same buffer of the
        stream's previous save. Options (allow_device_copy, inband_limit) and details:
        snapstore.objects.save."""
        from snapstore import objects
        return objects.save(self, obj, stream=stream, meta=meta, **options)

    def load(self, id_or_stream: Any, into: Any = None) -> Any:
        """The object of a save() checkpoint (an id, a CheckpointInfo, or a stream name for
        its latest); with into=, restores in place into an existing object graph of the same
        structure. See snapstore.objects."""
        from snapstore import objects
        return objects.load(self, id_or_stream, into=into)

    def delete(self, checkpoint_id: int) -> None:
        """Deletes a checkpoint. Later checkpoints built on it stay restorable (they absorb its
        manifests). Its chunks become garbage once unreferenced (reclaimed by compact())."""
        self.delete_many([checkpoint_id])

    def delete_many(self, checkpoint_ids) -> None:
        """Deletes several checkpoints at once: one log append, one sync, one index transaction
        (all or none). Unknown ids raise CheckpointNotFound before anything is deleted."""
        index = self._check_open(write=True)
        ids = list(checkpoint_ids)
        with index.read() as r:
            victims = [self._get_commit(r, i) for i in ids]
            heads = {c.stream: r.stream_head(c.stream) for c in victims}
        for c in victims:
            self._async.prepare_delete(c.stream, heads[c.stream] == c.id)
        if not victims:
            return
        with self._lock:
            index = self._check_open(write=True)
            with index.read() as r:
                for c in victims:
                    self._get_commit(r, c.id)
            unique = list(dict.fromkeys(c.id for c in victims))
            self._append_index_records([(fmt.REC_DELETE, records.encode_delete(i))
                                        for i in unique])

    def tag(self, checkpoint_id: int, tag: str) -> None:
        """Adds a tag to a checkpoint. Tagged checkpoints survive retain() (keep_tagged)."""
        self._set_tag(checkpoint_id, tag, True)

    def untag(self, checkpoint_id: int, tag: str) -> None:
        """Removes a tag from a checkpoint (no error if it did not have it)."""
        self._set_tag(checkpoint_id, tag, False)

    def _set_tag(self, checkpoint_id: int, tag: str, add: bool) -> None:
        validate_name(tag, "tag")
        with self._lock:
            index = self._check_open(write=True)
            with index.read() as r:
                commit = self._get_commit(r, checkpoint_id)
            self._append_index_record(fmt.REC_TAG, records.encode_tag(commit.id, tag, add))

    def retain(self, stream: str, keep_last: int | None = None, keep_every: int | None = None,
               keep_tagged: bool = True) -> list[int]:
        """Deletes the checkpoints of a stream that no rule keeps; returns their ids.

        Rules (a checkpoint is kept if any applies): keep_last=N keeps the N newest;
        keep_every=K keeps those whose seq is a multiple of K (stable: running retain again
        deletes nothing more); keep_tagged keeps tagged ones. At least one of keep_last and
        keep_every is required, so a typo cannot wipe a stream."""
        validate_name(stream, "stream")
        for value, what in ((keep_last, "keep_last"), (keep_every, "keep_every")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < (0 if what == "keep_last" else 1)):
                raise InvalidArgumentError(f"{what} must be an int >= "
                                           f"{0 if what == 'keep_last' else 1}, got {value!r}")
        if keep_last is None and keep_every is None:
            raise InvalidArgumentError("retain needs keep_last and/or keep_every")
        with self._lock:
            ckpts = self.checkpoints(stream)
            keep = set()
            if keep_last:
                keep.update(c.id for c in ckpts[-keep_last:])
            if keep_every:
                keep.update(c.id for c in ckpts if c.seq % keep_every == 0)
            if keep_tagged:
                keep.update(c.id for c in ckpts if c.tags)
            doomed = [c.id for c in ckpts if c.id not in keep]
            self.delete_many(reversed(doomed))     # newest first: merges stay small
            return doomed

    def compact(self, threshold: float = fmt.DEFAULT_COMPACT_THRESHOLD,
                max_chain: int | None = None) -> dict:
        """Folds chains longer than max_chain (default: the store's), drops unreferenced
        chunks, and rewrites sealed segments whose live fraction is below threshold so space
        returns to the file system. Returns a report (bytes before/after, chunks freed,
        segments rewritten, chains folded, seconds). Safe to interrupt at any moment."""
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
                or not 0 <= threshold <= 1:
            raise InvalidArgumentError(f"threshold must be a number from 0 to 1, got "
                                       f"{threshold!r}")
        if max_chain is not None and (isinstance(max_chain, bool) or
                                      not isinstance(max_chain, int) or max_chain < 1):
            raise InvalidArgumentError(f"max_chain must be an int >= 1, got {max_chain!r}")
        with self._lock:
            index = self._check_open(write=True)
            try:
                return compaction.compact(index, self._log, self.backend,
                                          threshold=float(threshold),
                                          max_chain=max_chain or self.options.max_chain,
                                          opts=self.options)
            except OSError as exc:
                if isinstance(exc, SnapstoreError):
                    raise
                raise StoreIOError(f"compaction failed: {exc.strerror or exc}", exc.errno) from exc

    def verify(self, deep: bool = False) -> dict:
        """Checks the store; returns a report {"ok", "problems": [...], ...}. Each problem has
        kind, message, affected checkpoint ids, segment and offset. deep=True also re-reads and
        re-hashes every chunk and every log record."""
        index = self._check_open()
        with self._lock:
            return verify_store(index, self.backend, deep=deep)

    # ---- reading ------------------------------------------------------------------------------
    @staticmethod
    def _get_commit(r: IndexView, checkpoint_id: Any) -> Commit:
        if isinstance(checkpoint_id, CheckpointInfo):
            checkpoint_id = checkpoint_id.id
        if isinstance(checkpoint_id, bool) or not isinstance(checkpoint_id, int):
            raise TypeError(f"checkpoint id must be an int, got {type(checkpoint_id).__name__}")
        commit = r.checkpoint(checkpoint_id)
        if commit is None:
            raise CheckpointNotFound(f"no checkpoint {checkpoint_id}")
        return commit

    def get(self, checkpoint_id: int) -> CheckpointInfo:
        """The CheckpointInfo of one checkpoint; CheckpointNotFound if there is none."""
        with self._check_open().read() as r:
            return CheckpointInfo.from_commit(self._get_commit(r, checkpoint_id))

    def checkpoints(self, stream: str | None = None) -> list[CheckpointInfo]:
        """All checkpoints (of one stream), oldest first."""
        if stream is not None:
            validate_name(stream, "stream")
        with self._check_open().read() as r:
            return [CheckpointInfo.from_commit(r.checkpoint(i)) for i in r.checkpoint_ids(stream)]

    def latest(self, stream: str = "default") -> CheckpointInfo | None:
        """The newest checkpoint of a stream, or None."""
        validate_name(stream, "stream")
        with self._check_open().read() as r:
            head = r.stream_head(stream)
            return CheckpointInfo.from_commit(r.checkpoint(head)) if head is not None else None

    def streams(self) -> list[str]:
        with self._check_open().read() as r:
            return sorted(r.streams())

    def restore(self, checkpoint_id: int) -> dict[str, bytes]:
        """All buffers of a checkpoint, byte-exact, as {name: bytes}."""
        with self._check_open().read() as r:
            commit = self._get_commit(r, checkpoint_id)
            out = {}
            for b in commit.buffers:
                target = OutputBytes(b.size)
                restore_range(r, self.backend, commit, b.name, target.view)
                out[b.name] = target.finish()
            return out

    def restore_into(self, checkpoint_id: int, buffers: Mapping[str, Any]) -> None:
        """Restores named buffers of a checkpoint in place into writable buffers of the same
        sizes (a subset of the checkpoint's buffers is fine). Sizes and names are checked
        before anything is written; on CorruptionError the targets' contents are undefined."""
        if not isinstance(buffers, Mapping):
            raise TypeError("buffers must be a mapping of name to writable buffer")
        with self._check_open().read() as r:
            commit = self._get_commit(r, checkpoint_id)
            targets = {}
            for name, obj in buffers.items():
                entry = find_buffer(commit, name)
                view = native.as_bytes_view(obj, writable=True)
                if len(view) != entry.size:
                    raise InvalidArgumentError(f"buffer {name!r} has {len(view)} bytes; "
                                               f"checkpoint {commit.id} holds {entry.size}")
                targets[name] = view
            for name, view in targets.items():
                restore_range(r, self.backend, commit, name, view)

    def read(self, checkpoint_id: int, name: str, offset: int = 0,
             length: int | None = None) -> bytes:
        """Bytes [offset, offset + length) of one buffer; reads only the chunks it needs."""
        with self._check_open().read() as r:
            commit = self._get_commit(r, checkpoint_id)
            entry = find_buffer(commit, name)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidArgumentError(f"offset must be an int >= 0, got {offset!r}")
            if length is None:
                length = max(0, entry.size - offset)
            if isinstance(length, bool) or not isinstance(length, int) or length < 0:
                raise InvalidArgumentError(f"length must be an int >= 0, got {length!r}")
            if offset + length > entry.size:
                raise InvalidArgumentError(f"range {offset}:{offset + length} exceeds buffer "
                                           f"{name!r} of {entry.size} bytes")
            out = OutputBytes(length)
            restore_range(r, self.backend, commit, name, out.view, offset)
            return out.finish()

    def stats(self) -> dict:
        """Sizes, counts, deduplication ratio and chain lengths of the store."""
        with self._check_open().read() as r:
            logical = 0
            chains = []
            ids = r.checkpoint_ids()
            for i in ids:
                c = r.checkpoint(i)
                logical += sum(b.size for b in c.buffers)
                chains.append(c.chain_length)
            unique_raw = live = garbage = 0
            n_chunks = 0
            for _, e in r.chunks():
                n_chunks += 1
                if e.refs:
                    unique_raw += e.raw_len
                    live += fmt.RECORD_HEADER.size + e.stored_len
                else:
                    garbage += fmt.RECORD_HEADER.size + e.stored_len
            streams = r.streams()
        segments = self.backend.list()
        seg_bytes = sum(self.backend.size(n) for n in segments)
        return {
            "checkpoints": len(ids), "streams": len(streams), "chunks": n_chunks,
            "segments": len(segments), "segment_bytes": seg_bytes,
            "index_bytes": self._index.disk_bytes(),
            "logical_bytes": logical, "unique_chunk_bytes": unique_raw,
            "live_chunk_bytes": live, "garbage_chunk_bytes": garbage,
            "dedup_ratio": (logical / live) if live else (math.inf if logical else 1.0),
            "max_chain_length": max(chains, default=0),
            "mean_chain_length": (sum(chains) / len(chains)) if chains else 0.0,
        }


def open(path, *, durability: str = "fsync", create: bool = True, readonly: bool = False,
         timeout: float = 0.0, **options) -> Store:
    """Opens (and by default creates) a store. See Store for the options."""
    return Store(path, durability=durability, create=create, readonly=readonly, timeout=timeout,
                 **options)
