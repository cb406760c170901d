"""The Store: snapstore's public API. Argument checks and delegation: writes go through the
engine's one commit path (snapstore.engine.commit.Committer: directory lock, index, log,
recovery, the commit protocol and its locking contract), asynchronous checkpoints and trackers
through the persister (snapstore.capture.persister), reads through read-only index views.
"""
from __future__ import annotations

import contextlib
import inspect
import math
import os
import struct
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from snapstore import _native as native
from snapstore.capture.persister import Persister
from snapstore.capture.staging import DEFAULT_STAGING_BYTES, max_staging_bytes
from snapstore.capture.tracker import Tracker
from snapstore.engine import compact as compaction
from snapstore.engine import groups as local_groups
from snapstore.engine import format as fmt
from snapstore.engine.garbage import collectable
from snapstore.engine import names as checkpoint_names
from snapstore.engine import records
from snapstore.engine import retention
from snapstore.engine import writer as wr
from snapstore.engine.commit import ANY_HEAD, Committer, io_errors
from snapstore.engine.index import IndexView, lmdb_errors
from snapstore.engine.memory import OutputBytes
from snapstore.engine.meta import reserved_meta, user_meta
from snapstore.engine.extents import check_manifest
from snapstore.engine.reader import (ChunkReader, buffer_manifest, chunk_entries, find_buffer,
                                     restore_range, restore_ranges, retry_moved)
from snapstore.engine.repair import repair as rebuild_index
from snapstore.engine.records import Commit
from snapstore.engine.backends import SegmentBackend, segment_number
from snapstore.engine.validation import (MAX_CREATED, buffer_view, check_choice, check_disjoint,
                                         is_created_time, validate_buffers,
                                         validate_compression_level, validate_flag,
                                         validate_int, validate_meta, validate_name,
                                         validate_part_meta, validate_path, validate_timeout)
from snapstore.engine.verify import verify as verify_store
from snapstore.interrupts import deferred_interrupts
from snapstore.errors import (CheckpointNotFound, CommitConflict, CorruptionError,
                              InvalidArgumentError, InvalidArgumentTypeError, SnapstoreError,
                              StoreIOError)
from snapstore.remote import gc as remote_gc
from snapstore.remote import groups as remote_groups
from snapstore.remote import layout as remote_layout
from snapstore.remote.committer import RemoteCommitter, rebuild_cache


def default_durability(path: Any) -> str:
    """The durability open() gives a store at path when none is asked for: "remote" for an
    S3 store (s3://...), "fsync" for a local one."""
    return "remote" if remote_layout.is_remote(os.fsdecode(path) if isinstance(path, bytes)
                                                else str(path)) else "fsync"


def _lmdb_errors_of(chunks: Iterator) -> Iterator:
    """The items of a generator reading an index snapshot, its LMDB errors raised as the
    snapstore errors they mean (the snapshot's own with block is not around it)."""
    with lmdb_errors("read"):
        yield from chunks


def _prune_failed(exc: SnapstoreError, stream: str, deleted: list) -> SnapstoreError:
    """exc (the prune's failure, its class kept) telling that retain's deletes happened:
    its message says so first, and `deleted` lists them."""
    message = (f"retain deleted {len(deleted)} checkpoint(s) of stream {stream!r} "
               f"({', '.join(map(str, deleted[:10]))}{', ...' if len(deleted) > 10 else ''}); "
               f"the prune that returns their space failed (the next compact() does it): {exc}")
    exc.args = (message,)
    if isinstance(exc, StoreIOError):         # whose str() is its strerror
        exc.strerror = message
    exc.deleted = list(deleted)
    return exc


class RetainResult(list):
    """What Store.retain() did: the list of deleted checkpoint ids (oldest first; a plain
    list of ints, so code that used retain()'s old list keeps working), plus
    deleted: the same ids; kept: {id: [rules that keep it]} ("last", "every", "within",
    "hourly", "daily", "weekly", "monthly", "yearly", "tagged", and "newest" for the
    stream's head when no rule kept it); dry_run: nothing was
    deleted, the ids are what a real run would delete; bytes_before / bytes_after: the
    store's bytes (segments + index, as stats() counts them) before the deletes and after
    the prune (bytes_after None on a dry run); bytes_freed: their difference (None on a
    dry run; negative when the store grew: without a prune the delete records are all that
    changed); compaction: compact()'s report when the prune ran, else None (prune=False,
    dry run, or nothing deleted)."""

    def __init__(self, deleted, *, kept: dict, dry_run: bool, bytes_before: int,
                 bytes_after: int | None, compaction: dict | None) -> None:
        super().__init__(deleted)
        self.kept, self.dry_run, self.compaction = kept, dry_run, compaction
        self.bytes_before, self.bytes_after = bytes_before, bytes_after

    @property
    def deleted(self) -> list[int]:
        return list(self)

    @property
    def bytes_freed(self) -> int | None:
        return None if self.bytes_after is None else self.bytes_before - self.bytes_after

    def report(self) -> dict:
        """A JSON-ready dict of all of it (kept ids as strings, JSON's keys)."""
        return {"deleted": self.deleted, "kept": {str(k): v for k, v in self.kept.items()},
                "dry_run": self.dry_run, "bytes_before": self.bytes_before,
                "bytes_after": self.bytes_after, "bytes_freed": self.bytes_freed,
                "compaction": self.compaction}


@dataclass(frozen=True)
class CheckpointInfo:
    """What the store knows of one checkpoint.

    Attributes:
        id: the checkpoint's id (unique in the store, never reused).
        stream: the stream it belongs to.
        kind: "full" when every buffer is stored whole (restorable without any other
            checkpoint's manifest; chain_length 0), "incremental" when at least one buffer is a
            delta over its parent (chain_length >= 1). A checkpoint of a stream is stored full
            when it is the stream's first, when more than full_threshold of all its bytes
            changed (the whole checkpoint is then stored whole: snapstore.open's
            full_threshold), or when a delta chain reaches max_chain; every write path (store.
            checkpoint, store.save, snapstore.torch.save, DCP's SnapstoreWriter, save_arrays)
            labels the same change the same way. "Full" is about manifests: its chunks may be
            shared with other checkpoints (deduplication).
        parent: the stream's previous checkpoint when it was taken (None for the first).
        created: seconds since the epoch.
        meta: the user's meta, as passed to checkpoint()/save()/save_arrays()/torch.save:
            snapstore's reserved keys ("snapstore.*") are not in it.
        sizes: {buffer name: bytes}.
        bytes_new: bytes this checkpoint added to the log.
        chain_length: deltas to apply above the nearest full manifest (0: full).
        tags: its tags.
        seq: position in its stream when taken: 1, 2, 3... (never reused while the stream
            has a checkpoint; on a local store a stream whose every checkpoint was deleted
            is gone, and the next checkpoint of that name starts again at 1).
        reserved_meta: snapstore's own part of the meta, {"snapstore.<layer>": ...}: how the
            object layer, save_arrays, DCP and workflows describe the checkpoint ({} for a
            plain checkpoint).
    """
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
    seq: int = 0              # position in its stream when taken: 1, 2, 3... (see above)
    reserved_meta: dict = field(default_factory=dict)

    @classmethod
    def from_commit(cls, c: Commit) -> "CheckpointInfo":
        user, reserved = split_meta(c.meta)
        return cls(c.id, c.stream, c.kind, c.parent, c.created, user,
                   {b.name: b.size for b in c.buffers}, c.bytes_new, c.chain_length,
                   tuple(c.tags), c.seq, reserved)


def split_meta(meta: Any) -> tuple[Any, dict]:
    """(the user's meta, snapstore's reserved part) of a checkpoint's stored meta. A layer
    that was given a meta other than a dict keeps it as the "user" entry of its reserved
    part (snapstore.objectlayer.wrap_meta; a workflow's run meta likewise): that value is the
    user's meta then."""
    reserved = reserved_meta(meta)
    user = user_meta(meta)
    if reserved and user == {}:
        for entry in reserved.values():
            if isinstance(entry, dict) and "user" in entry:
                return entry["user"], reserved
    return user, reserved


@dataclass(frozen=True)
class BufferManifest:
    """One buffer of a checkpoint as a full manifest: what Store.manifests() gives and
    Store.import_checkpoint() takes.

    Attributes:
        name: the buffer's name.
        size: its bytes.
        extents: ((offset, length, chunk_id, chunk_offset), ...) as Store.layout() gives
            them: sorted by offset, back to back, covering the buffer; chunk ids are BLAKE3
            content addresses, the same in every store.
        layout: "pages" or "cdc" (how the buffer was cut; kept for its next checkpoint).
        page_size: the page size it was stored with.
    """
    name: str
    size: int
    extents: tuple
    layout: str = "pages"
    page_size: int = fmt.DEFAULT_PAGE_SIZE


@dataclass(frozen=True)
class CheckpointManifests:
    """A checkpoint as full manifests (Store.manifests()): restorable from these alone, in any
    store holding the chunks they name.

    Attributes:
        info: its CheckpointInfo.
        meta: its meta as stored: the user's meta with snapstore's reserved keys (what
            Store.import_checkpoint() takes to make the same kind of checkpoint).
        buffers: a BufferManifest per buffer, in the checkpoint's order.
    """
    info: CheckpointInfo
    meta: Any
    buffers: tuple

    def chunk_ids(self) -> list[bytes]:
        """The distinct chunk ids its extents name, in order of first use."""
        return list(dict.fromkeys(e[2] for b in self.buffers for e in b.extents))


def _manifest_entries(buffers: Any) -> list[records.BufferEntry]:
    """Store.import_checkpoint()'s buffers, checked, as full BufferEntries (packed extents).
    InvalidArgumentError / InvalidArgumentTypeError for anything that is not a list of valid
    BufferManifests with distinct names, each covering its buffer."""
    if isinstance(buffers, (str, bytes)) or not hasattr(buffers, "__iter__"):
        raise InvalidArgumentTypeError(f"buffers must be a list of BufferManifest, got "
                                       f"{type(buffers).__name__}")
    entries, names = [], set()
    for b in buffers:
        if not isinstance(b, BufferManifest):
            raise InvalidArgumentTypeError(f"buffers must hold BufferManifest, got "
                                           f"{type(b).__name__}")
        validate_name(b.name, "buffer name")
        if b.name in names:
            raise InvalidArgumentError(f"buffer {b.name!r} is given twice")
        names.add(b.name)
        validate_int(b.size, f"buffer {b.name!r}'s size", 0)
        check_choice(b.layout, fmt.CHUNKING_MODES, f"buffer {b.name!r}'s layout")
        validate_int(b.page_size, f"buffer {b.name!r}'s page_size", native.PAGE_MIN,
                     native.PAGE_MAX)
        try:
            packed = b"".join(fmt.EXTENT.pack(off, coff, length, cid)
                              for off, length, cid, coff in b.extents)
            extents = [(off, coff, length, cid) for off, length, cid, coff in b.extents]
            if any(not isinstance(cid, bytes) or len(cid) != fmt.CHUNK_ID_BYTES
                   for _, _, _, cid in extents):
                raise ValueError(f"a chunk id is not {fmt.CHUNK_ID_BYTES} bytes")
            check_manifest(extents, b.size, True, f"buffer {b.name!r}")
        except (TypeError, ValueError, struct.error, CorruptionError) as exc:
            raise InvalidArgumentError(f"buffer {b.name!r}: extents must be (offset, length, "
                                       f"chunk id, chunk offset) covering its {b.size} bytes: "
                                       f"{exc}") from None
        entries.append(records.BufferEntry(b.name, b.size, "full", 0, b.layout, b.page_size,
                                           packed))
    return entries


class Group:
    """A group commit opened by Store.group(): `id` (give it to the participants), `stream`,
    `participants`, `parent` (the head its checkpoint follows)."""

    def __init__(self, store: "Store", group_id: str, stream: str, participants: tuple,
                 parent: int | None) -> None:
        self.store, self.id, self.stream = store, group_id, stream
        self.participants, self.parent = participants, parent

    def commit(self, meta: Any = None, *, timeout: float | None = None) -> CheckpointInfo:
        """Waits until every participant staged its part (at most `timeout` seconds, and
        never past the group's deadline), then commits all parts as one checkpoint of the
        stream and returns it. Each participant's meta is in the checkpoint's
        reserved_meta["snapstore.group"]["parts"] (group_parts() reads it).
        Raises: GroupTimeout (naming the participants that never staged; the group is
        aborted, nothing is visible), GroupError (the group is gone or being committed, or a
        part was staged again meanwhile: commit again), StoreIOError. On a failure after
        waiting (GroupError, StoreIOError, KeyboardInterrupt...) nothing is visible and the
        group stays open (unless past its deadline): commit again or abort it."""
        meta = validate_meta(meta)
        if timeout is not None:
            timeout = validate_timeout(timeout)
        self.store._committer.check_open(write=True)
        commit = self.store._groups.commit_group(self.store._committer, self.id, meta,
                                                 timeout)
        return CheckpointInfo.from_commit(commit)

    def abort(self) -> bool:
        """Drops the group: nothing of it becomes visible, its staged parts are garbage for
        compact() (an S3 store's for its gc). False when it was gone already (committed,
        aborted, timed out). A local store raises GroupError while a commit of the group is
        in progress (its parts must stay until that commit publishes or fails)."""
        self.store._committer.check_open(write=True)
        return self.store._groups.abort_group(self.store._committer, self.id)

    def status(self) -> dict:
        """{"id", "stream", "parent", "participants", "staged", "missing", "deadline"}.
        Raises GroupError when the group is gone."""
        return self.store._groups.status(self.store._committer, self.id)

    def __repr__(self) -> str:
        return f"<snapstore.Group {self.id} of stream {self.stream!r}>"


def group_parts(info: CheckpointInfo) -> dict:
    """{participant: the meta it staged} of a group commit's checkpoint ({} for another, and
    for one whose reserved meta does not have that shape: a checkpoint()'s meta may carry the
    reserved key too)."""
    if not isinstance(info, CheckpointInfo):
        raise InvalidArgumentTypeError(f"group_parts takes a CheckpointInfo (store.get(id)), "
                                       f"got {type(info).__name__}")
    entry = info.reserved_meta.get(fmt.GROUP_META_KEY)
    parts = entry.get("parts") if isinstance(entry, dict) else None
    return dict(parts) if isinstance(parts, dict) else {}


def _participants(participants: Any) -> list[str]:
    """Store.group()'s participants, checked: distinct valid names (an int N: "0".."N-1")."""
    limit = local_groups.MAX_PARTICIPANTS
    if isinstance(participants, int) and not isinstance(participants, bool):
        if not 1 <= participants <= limit:
            raise InvalidArgumentError(f"a group has 1 to {limit} participants, got "
                                       f"{participants}")
        return [str(i) for i in range(participants)]
    if isinstance(participants, (str, bytes)) or not hasattr(participants, "__iter__"):
        raise InvalidArgumentTypeError(f"participants must be a list of names or a count, got "
                                       f"{type(participants).__name__}")
    names = []
    for p in participants:
        if len(names) == limit:
            raise InvalidArgumentError(f"a group has at most {limit} participants")
        names.append(validate_name(p, "participant"))
    if not names:
        raise InvalidArgumentError("a group needs at least one participant")
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"participants must be distinct, got {names!r}")
    return names


def describes(info: CheckpointInfo, commit: Commit) -> bool:
    """Whether info is of checkpoint commit: its id, stream, seq and creation time. Ids are
    unique within one store only, so an info from another store (or from before the store
    was replaced) may carry the id of another checkpoint here."""
    return (info.id, info.stream, info.seq, info.created) == (
        commit.id, commit.stream, commit.seq, commit.created)


def not_described(info: CheckpointInfo, commit: Commit) -> str:
    """Why info does not name commit, the checkpoint of its id in this store."""
    return (f"the CheckpointInfo of checkpoint {info.id} (stream {info.stream!r}, seq "
            f"{info.seq}, created at {info.created!r}) is not of this store: its checkpoint "
            f"{commit.id} is seq {commit.seq} of stream {commit.stream!r}, created at "
            f"{commit.created!r}")


def _checked_head(expect_head: Any) -> Any:
    """checkpoint()'s expect_head, checked: ANY_HEAD, None, a checkpoint id (an int >= 1) or a
    CheckpointInfo (kept whole: Store._expected_head checks it against the store)."""
    if expect_head is ANY_HEAD or expect_head is None:
        return expect_head
    if isinstance(expect_head, CheckpointInfo):
        _checked_head(expect_head.id)
        return expect_head
    if isinstance(expect_head, bool) or not isinstance(expect_head, int):
        raise InvalidArgumentTypeError(f"expect_head must be a checkpoint id, a CheckpointInfo "
                                       f"or None, got {type(expect_head).__name__}")
    if expect_head < 1:
        raise InvalidArgumentError(f"expect_head must be a checkpoint id >= 1, got "
                                   f"{expect_head!r}")
    return expect_head


# Every Store of this process, so that a fork()ed child can disown them (_after_fork_in_child).
_STORES: "weakref.WeakSet[Store]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_STORES):
        store._committer.after_fork_in_child()
        store._persister.after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Store:
    """An open store. Use snapstore.open(); safe to share between threads of one process,
    usable only in the process that opened it: in a fork()ed child every call raises
    ForkedStoreError (open the store again there)."""

    def __init__(self, path: str, **options: Any) -> None:
        """Store(path, **options) is snapstore.open(path, **options): open() documents the
        options and holds their defaults (one list). Unknown options raise
        InvalidArgumentTypeError (a TypeError)."""
        try:
            bound = _OPEN_SIGNATURE.bind(path, **options)
        except TypeError as exc:
            raise InvalidArgumentTypeError(f"snapstore.open(): {exc}") from None
        bound.apply_defaults()
        self._open(**bound.arguments)

    def _open(self, path, *, durability, create, readonly, timeout, page_size, chunk_size,
              chunking, cdc_sizes, max_chain, full_threshold, compression, compression_level,
              delta_chunks, keyframe_cache_bytes, segment_size, staging_bytes, backend,
              cache_dir, refresh,
              remote_timeout, sync_index) -> None:
        # Every argument is checked before anything touches the file system.
        self.path = validate_path(path)
        remote = remote_layout.is_remote(self.path)
        if durability is None:
            durability = default_durability(self.path)
        self.durability = check_choice(
            durability, remote_layout.DURABILITY_MODES if remote else fmt.DURABILITY_MODES,
            "durability")
        self.readonly = validate_flag(readonly, "readonly")
        create = validate_flag(create, "create")
        sync_index = validate_flag(sync_index, "sync_index")
        timeout = validate_timeout(timeout)
        self.options = self._validate_options(page_size, chunk_size, chunking, cdc_sizes,
                                              max_chain, full_threshold, compression,
                                              compression_level, delta_chunks,
                                              keyframe_cache_bytes)
        validate_int(segment_size, "segment_size", 1 << 16)
        validate_int(staging_bytes, "staging_bytes", 1 << 20, max_staging_bytes())
        if backend is not None and not isinstance(backend, SegmentBackend):
            raise InvalidArgumentTypeError(f"backend must be a SegmentBackend, got "
                                           f"{type(backend).__name__}")
        # checked for local stores too (where they do nothing): a bad value is a mistake
        refresh = validate_timeout(refresh, "refresh")
        remote_timeout = validate_timeout(remote_timeout, "remote_timeout")
        if not 0 < remote_timeout < math.inf:
            raise InvalidArgumentError(f"remote_timeout must be a finite number of "
                                       f"seconds > 0, got {remote_timeout!r}")
        if remote:
            if backend is not None:
                raise InvalidArgumentError("backend= is for local stores; an S3 store's "
                                           "segments live in its bucket")
            if not sync_index:
                raise InvalidArgumentError("sync_index=False is for local stores; an S3 "
                                           "store commits in its bucket")
            if cache_dir is not None:
                cache_dir = validate_path(cache_dir)
            self._committer = RemoteCommitter(
                self.path, self.options, durability=self.durability, readonly=self.readonly,
                create=create, cache_dir=cache_dir,
                segment_size=(remote_layout.DEFAULT_REMOTE_SEGMENT_SIZE
                              if segment_size == fmt.DEFAULT_SEGMENT_SIZE else segment_size),
                refresh=refresh, remote_timeout=remote_timeout)
        else:
            if cache_dir is not None:
                raise InvalidArgumentError("cache_dir= is for S3 stores (s3://...); a local "
                                           "store needs no cache")
            self._committer = Committer(self.path, self.options, durability=self.durability,
                                        readonly=self.readonly, create=create,
                                        timeout=timeout, segment_size=segment_size,
                                        backend=backend, sync_index=sync_index)
        # group commits: engine/groups.py over the index, remote/groups.py over the bucket
        # (the same operations, taking this Store's committer)
        self._groups = remote_groups if remote else local_groups
        self._remote = remote
        self.backend = self._committer.backend
        self._persister = Persister(self._committer, staging_bytes, CheckpointInfo.from_commit)
        _STORES.add(self)

    # ---- opening and closing ------------------------------------------------------------
    @staticmethod
    def _validate_options(page_size, chunk_size, chunking, cdc_sizes, max_chain,
                          full_threshold, compression, compression_level,
                          delta_chunks=False,
                          keyframe_cache_bytes=wr.DEFAULT_KEYFRAME_CACHE_BYTES
                          ) -> wr.WriteOptions:
        validate_int(page_size, "page_size", native.PAGE_MIN, native.PAGE_MAX)
        if page_size & (page_size - 1):
            raise InvalidArgumentError(f"page_size must be a power of two from {native.PAGE_MIN} "
                                       f"to {native.PAGE_MAX}, got {page_size!r}")
        if chunk_size is None:
            chunk_size = max(fmt.DEFAULT_CHUNK_SIZE, page_size)
        if (isinstance(chunk_size, int) and not isinstance(chunk_size, bool)
                and page_size > chunk_size):
            raise InvalidArgumentError(f"chunk_size ({chunk_size}) must be at least page_size "
                                       f"({page_size}), a multiple of it")
        validate_int(chunk_size, "chunk_size", page_size, fmt.MAX_CHUNK_BYTES)
        if chunk_size % page_size:
            raise InvalidArgumentError("chunk_size must be a multiple of page_size and at most "
                                       f"{fmt.MAX_CHUNK_BYTES} bytes, got {chunk_size!r}")
        check_choice(chunking, fmt.CHUNKING_MODES, "chunking")
        check_choice(compression, fmt.COMPRESSION_MODES, "compression")
        rule = (f"three ints, {native.CDC_MIN_LIMIT} <= min <= avg <= max <= "
                f"{fmt.MAX_CHUNK_BYTES}, avg a power of two")
        try:
            sizes = tuple(cdc_sizes)
        except TypeError:
            sizes = ()
        if (len(sizes) != 3 or not all(isinstance(n, int) and not isinstance(n, bool)
                                       for n in sizes)
                or not native.CDC_MIN_LIMIT <= sizes[0] <= sizes[1] <= sizes[2]
                <= fmt.MAX_CHUNK_BYTES or sizes[1] & (sizes[1] - 1)):
            raise InvalidArgumentError(f"cdc_sizes must be {rule}; got {cdc_sizes!r}")
        native.Chunker(*sizes)      # the C core's own check of the same rule
        validate_int(max_chain, "max_chain", 1)
        if isinstance(full_threshold, bool) or not isinstance(full_threshold, (int, float)) \
                or not 0 <= full_threshold <= 1:
            raise InvalidArgumentError(f"full_threshold must be a number from 0 to 1, got "
                                       f"{full_threshold!r}")
        validate_compression_level(compression_level)
        return wr.WriteOptions(page_size, chunk_size, chunking, sizes, max_chain,
                               float(full_threshold), compression, compression_level,
                               validate_flag(delta_chunks, "delta_chunks"),
                               validate_int(keyframe_cache_bytes, "keyframe_cache_bytes", 0))

    def close(self) -> None:
        """Waits for pending asynchronous checkpoints, closes trackers, closes the store.
        Idempotent. Checkpoints returned earlier stay committed.

        In a done-callback of a checkpoint_async()/tracker future (callbacks run on the
        store's background thread, which cannot wait for itself) it closes at once instead:
        the checkpoint whose callback runs is committed, checkpoints queued after it fail
        with StoreClosedError, and the background thread exits after them. In a fork()ed
        child of the opening process it only marks this Store closed (what it holds is the
        parent's). Once close() began, checkpoint_async() from other threads raises
        StoreClosedError (so they cannot keep it waiting). Ctrl-C stops the wait for pending
        checkpoints (call close() again to finish); the teardown after it is never cut half
        way (a SIGINT then is raised once it is done)."""
        if not self._committer.closed and not self.readonly and not self._committer.forked:
            self._persister.close()      # first: its worker commits through the committer
        with deferred_interrupts():      # Ctrl-C cannot leave the store's locks half released
            self._committer.close()

    def refresh(self) -> None:
        """An S3 store: pulls every stream's state from the bucket now, so reads see other
        machines' commits (they do anyway at most `refresh` seconds late). A local store is
        always current: nothing to do. Raises StoreClosedError, RemoteError."""
        self._committer.refresh()

    @property
    def closed(self) -> bool:
        """True once close() was called."""
        return self._committer.closed

    def holds_path(self, path) -> bool:
        """Whether path lies in the directory this Store keeps its files in (a local store's
        directory, an S3 store's cache directory), after symlinks and '..': writing a file
        there could overwrite or add to the store's own files. Exports refuse such paths."""
        own = getattr(self._committer, "cache_path", None) or self.path
        try:
            own, where = os.path.realpath(os.fsdecode(own)), os.path.realpath(os.fsdecode(path))
            if os.path.commonpath([own, where]) == own:
                return True
            # the same directory under another name (a bind mount, a case-insensitive file
            # system): compared by identity, each existing directory up from path
            st = os.stat(own)
            ident = (st.st_dev, st.st_ino)
            while True:
                try:
                    st = os.stat(where)
                    if (st.st_dev, st.st_ino) == ident:
                        return True
                except OSError:
                    pass
                parent = os.path.dirname(where)
                if parent == where:
                    return False
                where = parent
        except (TypeError, ValueError, OSError):    # not a path, a NUL in it, no store dir
            return False

    # White-box tests and benchmarks inspect these engine parts (the committer owns them).
    @property
    def _index(self):
        return self._committer.index

    @property
    def _log(self):
        return self._committer.log

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "closed" if self.closed else ("read-only" if self.readonly else "writer")
        return f"<snapstore.Store {self.path!r} {mode}>"

    # ---- writing ------------------------------------------------------------------------------
    def checkpoint(self, buffers: Mapping[str, Any], stream: str = "default", meta: Any = None,
                   *, chunking: str | None = None, expect_head: Any = ANY_HEAD) -> CheckpointInfo:
        """Takes a checkpoint of named buffers and makes it durable.

        Args:
            buffers: {name: C-contiguous bytes-like object} (bytes, bytearray, memoryview,
                mmap, numpy arrays...). Each buffer is diffed page-wise against the stream's
                previous checkpoint and stored incrementally when that pays.
            stream: the stream (sequence of checkpoints) this one extends.
            meta: JSON-serialisable user metadata (nested at most 100 levels: MAX_META_DEPTH).
            chunking: "pages" (default of the store) or "cdc" for content that shifts.
            expect_head: commit only if the stream's head is this checkpoint (an id or a
                CheckpointInfo; None: only if the stream has no checkpoint yet): a
                compare-and-swap for read-modify-write cycles. By default the checkpoint
                builds on the head it finds, and still fails with CommitConflict if another
                writer commits to the stream between its planning and its commit.
        Returns: CheckpointInfo.
        Raises: TypeError / InvalidArgumentError for bad input (before anything is written),
            CommitConflict (the stream's head moved, or another writer's commit of it is in
            progress: nothing of this checkpoint is visible; read the new head and retry),
            StoreIOError (disk full, I/O error: nothing of the checkpoint is visible).
        """
        itemsizes: dict = {}
        views = validate_buffers(buffers, stream, itemsizes)
        layout = check_choice(self.options.chunking if chunking is None else chunking,
                              fmt.CHUNKING_MODES, "chunking")
        meta = validate_meta(meta)
        self._committer.check_open(write=True)
        expect_head = self._expected_head(stream, _checked_head(expect_head))
        opts = self.options

        known: dict = {}      # what the stream's async checkpoints knew of its head

        def plans(view: IndexView, head: int | None, parent: Commit | None) -> list:
            return wr.plan_buffers(view, stream, head, parent, views, opts, layout, itemsizes,
                                   known)
        with self._persister.stream_turn(stream):
            known.update(self._persister.prepare_sync_checkpoint(stream))
            return CheckpointInfo.from_commit(self._committer.commit(stream, plans, meta,
                                                                     expect_head=expect_head))

    def import_checkpoint(self, stream: str, buffers, read_chunks: Callable, meta: Any = None,
                          *, created: float | None = None, tags=(),
                          expect_head: Any = ANY_HEAD) -> CheckpointInfo:
        """Commits a checkpoint made elsewhere, given as full manifests, as the stream's next
        checkpoint (what snapstore.copy_checkpoints and snapstore.import_savepoint use).

        Args:
            stream: the stream it extends; its parent is the stream's head.
            buffers: [BufferManifest], each covering its buffer (Store.manifests() of
                another store gives them).
            read_chunks: read_chunks(chunk ids) -> iterable of (chunk id, raw bytes). Called
                once, with only the chunks this store lacks (not at all when it has every
                one), in the calling thread; it must yield each of them once, in any order
                (another store's Store.read_chunks fits). Every chunk is checked to hash to
                its id and stored compressed per this store's options.
            meta: the meta as stored (Store.manifests().meta: reserved keys included).
            created: its creation time, seconds since the epoch (default: now).
            tags: its tags.
            expect_head: as for checkpoint(): commit only if the stream's head is this
                checkpoint (None: only into an empty stream).
        Returns: CheckpointInfo (kind "full").
        Raises: InvalidArgumentError / InvalidArgumentTypeError (bad input, nothing written),
            CorruptionError (a chunk's bytes are not that chunk, a chunk not given, an extent
            past its chunk's end: nothing is visible), CommitConflict (the stream's head
            moved meanwhile, or is not expect_head), StoreIOError, ReadOnlyError,
            StoreClosedError."""
        validate_name(stream, "stream")
        entries = _manifest_entries(buffers)
        if not callable(read_chunks):
            raise InvalidArgumentTypeError(f"read_chunks must be callable, got "
                                           f"{type(read_chunks).__name__}")
        meta = validate_meta(meta)
        if created is not None and not is_created_time(created):
            raise InvalidArgumentError(f"created must be seconds since the epoch (a number "
                                       f"from 0 to {MAX_CREATED}, the end of the year 9999) "
                                       f"or None, got {created!r}")
        if tags is None:
            tags = ()
        if isinstance(tags, (str, bytes)) or not hasattr(tags, "__iter__"):
            raise InvalidArgumentTypeError(f"tags must be a list of names, got the "
                                           f"{type(tags).__name__} {tags!r}")
        tags = tuple(sorted({validate_name(t, "tag") for t in tags}))   # as the index keeps them
        self._committer.check_open(write=True)
        expect_head = self._expected_head(stream, _checked_head(expect_head))
        self._persister.prepare_sync_checkpoint(stream)
        commit = self._committer.commit_manifests(
            stream, entries, read_chunks, meta,
            created=None if created is None else float(created), tags=tags,
            expect_head=expect_head)
        return CheckpointInfo.from_commit(commit)

    # ---- group commits -------------------------------------------------------------------------
    def group(self, stream: str, participants, *, timeout: float = 600.0,
              expect_head: Any = ANY_HEAD) -> "Group":
        """Opens a group commit on `stream`: one checkpoint made of the parts of several
        participants (threads, processes, DCP ranks, the operators of a stream processor),
        each staged independently and in parallel with store.stage(group.id, participant,
        buffers, meta), then committed all at once by group.commit(): visible all together or
        not at all, also if any participant or this coordinator is killed at any moment.

        Args:
            stream: the stream the checkpoint extends. It is reserved for the group until it
                commits or aborts: other commits of it fail with CommitConflict meanwhile.
                An S3 store reserves nothing: a checkpoint committed on the stream meanwhile
                makes the group's commit fail with CommitConflict instead.
            participants: their names (distinct non-empty strings), or an int N for
                "0" ... "N-1". The checkpoint needs a part from each.
            timeout: seconds from now within which the group must commit (GroupTimeout, and
                the group is aborted, naming the participants that never staged).
            expect_head: as for checkpoint(): the head the group must follow.
        Returns: a Group (group.id is what participants need).
        Raises: CommitConflict (another commit or group of the stream in progress, or the
            head is not expect_head), InvalidArgumentError."""
        validate_name(stream, "stream")
        names = _participants(participants)
        timeout = validate_timeout(timeout)
        if not 0 < timeout < math.inf:
            raise InvalidArgumentError(f"timeout must be a finite number of seconds > 0, got "
                                       f"{timeout!r}")
        self._committer.check_open(write=True)
        expect_head = self._expected_head(stream, _checked_head(expect_head))
        self._persister.prepare_sync_checkpoint(stream)
        header = self._groups.open_group(self._committer, stream, names, timeout,
                                          expect_head)
        return Group(self, header.id, stream, tuple(names), header.parent)

    def stage(self, group_id: str, participant: str, buffers: Mapping[str, Any],
              meta: Any = None) -> None:
        """Stages one participant's part of a group commit (see group()): its buffers
        (diffed page-wise against the group stream's head, so parts are incremental like
        checkpoints) and its meta (e.g. source offsets), durable in this Store's own log
        when this returns. Buffer names must be distinct across the group's parts. Staging
        the same participant again replaces its part, until the group's commit has begun
        (then GroupError: the commit takes the parts staged before it). Any Store of the
        store may stage, in any process; a process stages in parallel with others (each
        Store writes its own log). On an S3 store, any machine that reaches the bucket:
        the part's chunks are uploaded and the part is an object of the bucket when this
        returns (distinct buffer names are checked by the commit there; CommitConflict
        when the stream moved since the group opened).
        Raises: GroupError (unknown, committed, aborted or timed-out group, or one being
        committed; not one of its participants; a buffer name another part staged),
        InvalidArgumentError."""
        if not isinstance(group_id, str) or not group_id:
            raise InvalidArgumentTypeError(f"group_id must be a group's id (a str), got "
                                           f"{type(group_id).__name__}")
        try:
            group_id.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"group_id must be valid Unicode text (no lone "
                                       f"surrogates), got {group_id!r}") from None
        validate_name(participant, "participant")
        itemsizes: dict = {}
        views = validate_buffers(buffers, "group part", itemsizes)
        meta = validate_part_meta(meta)
        self._committer.check_open(write=True)
        opts = self.options

        def plans(view: IndexView, stream: str, head: int | None,
                  parent: Commit | None) -> list:
            return wr.plan_buffers(view, stream, head, parent, views, opts, opts.chunking,
                                   itemsizes)
        self._groups.stage(self._committer, group_id, participant, plans, meta)

    def track(self, buffers: Mapping[str, Any], stream: str = "default",
              mode: str = "auto") -> Tracker:
        """A Tracker of these buffers for the stream: tracker.checkpoint() /
        checkpoint_async() find changed pages with the kernel's write tracking ("uffd"), the
        C fingerprint diff ("hash"), an exact shadow copy ("shadow") or not at all ("full");
        "auto" picks uffd where the kernel supports it for that memory, else hash
        (tracker.mode, tracker.reason say which and why). The tracker owns the stream until
        tracker.close(); the buffers must stay the same objects."""
        check_choice(mode, ("auto", "uffd", "hash", "shadow", "full"), "mode")
        self._committer.check_open(write=True)
        return Tracker(self._persister, buffers, stream, mode)

    def checkpoint_async(self, buffers: Mapping[str, Any], stream: str = "default",
                         meta: Any = None):
        """Like checkpoint(), but returns a concurrent.futures.Future of the CheckpointInfo as
        soon as the changed pages are copied to staging memory; the rest happens in the
        background. Checkpoints of a stream commit in the order they were taken. The future
        resolves once the checkpoint is durable, or raises its error. Like checkpoint(), it
        builds on the head it finds (another writer's checkpoint too); CommitConflict on the
        future when the head moves while its job waits behind the stream's earlier ones."""
        itemsizes: dict = {}
        views = validate_buffers(buffers, stream, itemsizes)
        meta = validate_meta(meta)
        self._committer.check_open(write=True)
        with self._persister.stream_turn(stream):       # not inside a plain checkpoint()'s
            return self._persister.implicit_capturer(stream).capture(views, meta, itemsizes)

    def flush(self) -> None:
        """Waits until every pending asynchronous checkpoint is durable (or failed); on an S3
        store with durability "local", until every checkpoint is committed in the bucket,
        raising the first upload or commit that failed (RemoteError, CommitConflict). In a
        done-callback it cannot wait for the checkpoints queued after the callback's own
        (they commit on the callback's thread, after it returns): SnapstoreError if any are.
        Ctrl-C stops the wait (KeyboardInterrupt); the checkpoints still commit."""
        if self._committer.forked:
            self._committer.check_open()
        if not self.readonly:
            self._persister.wait_idle(what="store.flush()")
            self._committer.flush()

    def save(self, obj: Any, stream: str = "default", meta: Any = None,
             **options) -> CheckpointInfo:
        """Checkpoints a picklable object graph; large buffers (NumPy arrays, tensors,
        PickleBuffers) go out of band, each diffed page-wise against the same buffer of the
        stream's previous save. Options (allow_device_copy, inband_limit, expect_head) and
        details: snapstore.objects.save."""
        from snapstore import objects
        return objects.save(self, obj, stream=stream, meta=meta, **options)

    def save_async(self, obj: Any, stream: str = "default", meta: Any = None, **options):
        """save() through checkpoint_async(): a Future of the CheckpointInfo, returned once
        the object's changed pages are copied to staging memory; the checkpoint holds the
        values as of the call. Options (allow_device_copy, inband_limit) and details:
        snapstore.objects.save_async."""
        from snapstore import objects
        return objects.save_async(self, obj, stream=stream, meta=meta, **options)

    def load(self, id_or_stream: Any, into: Any = None) -> Any:
        """The object of a save() checkpoint, named as for resolve() (an id, a tag, "latest",
        "STREAM@SEQ", a stream name for its newest...); with into=, restores in place into an
        existing object graph of the same structure. See snapstore.objects."""
        from snapstore import objects
        return objects.load(self, id_or_stream, into=into)

    def delete(self, name: Any) -> None:
        """Deletes a checkpoint (named as for resolve()). Later checkpoints built on it stay
        restorable (they absorb its manifests). Its chunks become garbage once unreferenced
        (reclaimed by compact())."""
        self.delete_many([name])

    def delete_many(self, names) -> None:
        """Deletes several checkpoints at once (an iterable of names as for resolve(), resolved
        on one snapshot): one log append, one sync, one index transaction (all or none). A name
        that names nothing (CheckpointNotFound) or several (AmbiguousCheckpointName) raises
        before anything is deleted."""
        self._delete_many(names)

    def _delete_many(self, names, unless_tagged: frozenset = frozenset(),
                     missing_ok: bool = False) -> None:
        """delete_many; unless_tagged: ids chosen for having no tag (retain), whose delete is
        a CommitConflict (nothing deleted) if another writer tagged one meanwhile. missing_ok
        (retain: ids it chose): one another writer deleted meanwhile is passed over (it raised
        CheckpointNotFound naming an id the caller never gave)."""
        if isinstance(names, (str, bytes)):
            raise InvalidArgumentTypeError(f"names must be an iterable of checkpoint names, "
                                           f"got the {type(names).__name__} {names!r} (for one "
                                           "checkpoint use delete(name))")
        try:
            wanted = [self._checked_name(n) for n in names]
        except TypeError as exc:
            if isinstance(exc, InvalidArgumentTypeError):
                raise
            raise InvalidArgumentTypeError(f"names must be an iterable of checkpoint names, "
                                           f"got {type(names).__name__}") from None
        self._committer.check_open(write=True)

        def present(view: IndexView, found: list) -> list:
            if not missing_ok:
                return [self._get_commit(view, n) for n in found]
            out = []
            for n in found:
                with contextlib.suppress(CheckpointNotFound):
                    out.append(self._get_commit(view, n))
            return out
        with self._committer.read() as r:
            victims = present(r, wanted)
            heads = {c.stream: r.stream_head(c.stream) for c in victims}
        for c in victims:
            self._persister.prepare_delete(c.stream, heads[c.stream] == c.id)
        if not victims:
            return

        def delete_records(view: IndexView) -> list:
            # still there: all or none (retain: those still there)
            unique = list(dict.fromkeys(c.id for c in present(view, [c.id for c in victims])))
            return [(fmt.REC_DELETE, i,
                     lambda order, i=i: records.encode_delete(i, order, len(unique)))
                    for i in unique]
        self._committer.apply_ops(delete_records, unless_tagged)

    def tag(self, name: Any, tag: str) -> None:
        """Adds a tag to a checkpoint (named as for resolve()). Tagged checkpoints survive
        retain() (keep_tagged), and the tag names the checkpoint from then on (resolve(tag))
        while no other checkpoint has it too."""
        self._set_tag(name, tag, True)

    def untag(self, name: Any, tag: str) -> None:
        """Removes a tag from a checkpoint (named as for resolve(); no error if it did not
        have the tag)."""
        self._set_tag(name, tag, False)

    def _set_tag(self, name: Any, tag: str, add: bool) -> None:
        validate_name(tag, "tag")
        name = self._checked_name(name)

        def tag_record(view: IndexView) -> list:
            commit = self._get_commit(view, name)
            return [(fmt.REC_TAG, commit.id,
                     lambda order: records.encode_tag(commit.id, tag, add, order))]
        self._committer.apply_ops(tag_record)

    def retain(self, stream: str, keep_last: int | None = None, keep_every: int | None = None,
               keep_tagged: bool = True, *, keep_within: float | str | None = None,
               keep_hourly: int | None = None, keep_daily: int | None = None,
               keep_weekly: int | None = None, keep_monthly: int | None = None,
               keep_yearly: int | None = None, tz: Any = None, dry_run: bool = False,
               prune: bool = True) -> "RetainResult":
        """Deletes the checkpoints of a stream that no rule keeps, then prunes (compact()) so
        their space returns to the file system, as `restic forget --prune` does. Returns a
        RetainResult: the list of deleted ids (oldest first), with what was kept and why and
        the space freed.

        Rules (a checkpoint is kept if any applies; snapstore.engine.retention):
        keep_last=N the N newest; keep_every=K those whose seq is a multiple of K (stable:
        running retain again deletes nothing more); keep_within=D those created at most D
        before the stream's newest checkpoint (seconds, a timedelta, or "90m", "36h", "7d",
        "2w", "1y", "1d12h"); keep_hourly/keep_daily/keep_weekly/keep_monthly/keep_yearly=N
        the newest checkpoint of each of the last N hours/days/ISO weeks/months/years that
        have checkpoints, in time zone tz (a datetime.tzinfo; None: local time, as restic);
        keep_tagged keeps tagged ones. At least one rule other than keep_tagged is required,
        so a typo cannot wipe a stream (InvalidArgumentError), and the stream's newest
        checkpoint (its head, highest seq) always stays, as "newest" when no rule kept it
        (keep_every=K alone on a stream of fewer than K checkpoints deleted them all).

        dry_run=True deletes nothing and reports what a real run would delete (works on a
        read-only store). prune=False only deletes (space comes back at the next compact()).
        The prune runs only when something was deleted; on an S3 store never (its space
        comes back through gc(), which deletes only after a grace period). The doomed set is
        decided on a snapshot and deleted in one transaction; one that another writer
        deleted meanwhile is passed over (it raised CheckpointNotFound, and two retains of a
        stream racing each other failed for a name their callers never gave); one that
        another writer tagged meanwhile stops it (CommitConflict, nothing deleted, with
        keep_tagged). Should the prune fail after the
        deletes (a full disk: StoreIOError), its error says the deletes happened, and its
        `deleted` attribute lists them."""
        validate_name(stream, "stream")
        policy = retention.Policy.of(keep_last=keep_last, keep_every=keep_every,
                                     keep_within=keep_within, keep_hourly=keep_hourly,
                                     keep_daily=keep_daily, keep_weekly=keep_weekly,
                                     keep_monthly=keep_monthly, keep_yearly=keep_yearly,
                                     keep_tagged=keep_tagged, tz=tz)
        dry_run = validate_flag(dry_run, "dry_run")
        prune = validate_flag(prune, "prune")
        self._committer.check_open(write=not dry_run)
        before = self._bytes_on_disk()      # first: the plan and the deletes stay close
        if self._remote:
            self.refresh()                  # plan on the bucket's state, not a cache's
        ckpts = self.checkpoints(stream)
        kept = retention.plan((retention.Candidate(c.id, c.seq, c.created, bool(c.tags))
                               for c in ckpts), policy)
        doomed = [c.id for c in ckpts if c.id not in kept]
        compaction_report = None
        if not dry_run:
            # Not under the writer lock: deleting a head first lets the stream's pending
            # asynchronous checkpoints land, and they commit through that lock. Under the
            # maintenance lock when pruning, taken first: a running compaction makes retain
            # wait (up to the store's timeout) or fail before it deletes anything, never
            # between its deletes and its prune.
            prune = prune and not self._remote
            with (self._committer.maintenance(exclusive=True) if prune and doomed
                  else contextlib.nullcontext()):
                # newest first: merges stay small; a checkpoint kept for no rule but a
                # tag another writer added since the plan must not go
                self._delete_many(reversed(doomed), unless_tagged=frozenset(
                    doomed if policy.keep_tagged else ()), missing_ok=True)
                if prune and doomed:
                    try:
                        compaction_report = self.compact()
                    except SnapstoreError as exc:
                        raise _prune_failed(exc, stream, doomed)
        after = None if dry_run else self._bytes_on_disk()
        return RetainResult(doomed, kept=kept, dry_run=dry_run, bytes_before=before,
                            bytes_after=after, compaction=compaction_report)

    def _bytes_on_disk(self) -> int:
        """Bytes of the segments plus the index (as stats() counts them)."""
        c = self._committer
        with c.exclusive(write=False), io_errors("cannot measure the store"):
            return sum(c.backend.sizes().values()) + c.index.disk_bytes()

    def compact(self, threshold: float = fmt.DEFAULT_COMPACT_THRESHOLD,
                max_chain: int | None = None, *,
                max_garbage: float | None = fmt.DEFAULT_COMPACT_MAX_GARBAGE,
                shrink_index: bool | None = None) -> dict:
        """Returns the space of deleted checkpoints to the file system and folds long chains.

        Folds chains longer than max_chain (default: the store's), drops unreferenced chunks,
        and rewrites segments (copying their live chunks to the log's tail, then removing
        them): every segment whose live fraction is below `threshold`, then more, emptiest
        first, until the garbage the remaining segments hold is at most `max_garbage` times
        the live chunk bytes. So by default the segments end up at most 1.1x the live data
        (plus segment headers and one state section); max_garbage=None rewrites only by
        threshold. Then the LMDB index, whose free pages LMDB never gives back, is replaced
        by a compacting copy when at least half of it is free (shrink_index=None), always
        (True) or never (False); readers in other processes move to the new index at their
        next read.

        Returns a report: bytes_before/bytes_after (segments), index_bytes_before/
        index_bytes_after, store_bytes_before/store_bytes_after (segments + index: what the
        store occupies), index_shrunk, chunks freed, segments rewritten and removed, live
        bytes copied, chains folded, chunks trimmed, seconds. Safe to interrupt at any
        moment, a crash included. An S3 store has gc() instead (InvalidArgumentError)."""
        if self._remote:
            raise InvalidArgumentError(f"{self.path} is an S3 store: its space comes back "
                                       "through gc() (`snapstore gc`), not compact()")
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) \
                or not 0 <= threshold <= 1:
            raise InvalidArgumentError(f"threshold must be a number from 0 to 1, got "
                                       f"{threshold!r}")
        if max_chain is not None and (isinstance(max_chain, bool) or
                                      not isinstance(max_chain, int) or max_chain < 1):
            raise InvalidArgumentError(f"max_chain must be an int >= 1, got {max_chain!r}")
        if max_garbage is not None and (isinstance(max_garbage, bool) or
                                        not isinstance(max_garbage, (int, float)) or
                                        not 0 <= max_garbage < math.inf):
            raise InvalidArgumentError(f"max_garbage must be None or a number >= 0, got "
                                       f"{max_garbage!r}")
        if shrink_index is not None:
            shrink_index = validate_flag(shrink_index, "shrink_index")
        c = self._committer
        c.check_open()
        # the maintenance lock first, then the writer lock, as retain() takes them (which
        # holds the maintenance lock across its deletes): the other order deadlocked a
        # compact() and a retain() in two threads of one Store, each holding the lock the
        # other waited for
        with c.maintenance(exclusive=True), c.exclusive(), io_errors("compaction failed"):
            c.recover_orphans()         # dead writers' logs: their tails are settled first
            c.drop_abandoned_groups()   # expired groups' parts are garbage from now on
            return compaction.compact(c.index, c.log, c.backend, threshold=float(threshold),
                                      max_chain=max_chain or self.options.max_chain,
                                      opts=self.options,
                                      max_garbage=None if max_garbage is None
                                      else float(max_garbage),
                                      shrink=shrink_index)

    def gc(self, grace: float = remote_layout.DEFAULT_GC_GRACE_SECONDS, dry_run: bool = False,
           wait: bool = False) -> dict:
        """An S3 store: deletes the objects of deleted checkpoints (garbage collection
        without a lock; docs/design.md, "Garbage collection"). A run marks what no ref
        reaches and is older than `grace` seconds (segments, checkpoint objects; abandoned
        group commits after 2 * grace) in gc/pending.json; a later run, once that mark is
        due (`grace` after it, or the larger grace writers used before it: the first mark
        of a store waits DEFAULT_GC_GRACE_SECONDS, an hour), deletes what is still
        unreachable. Writers go on meanwhile: a commit that took longer than grace / 2
        fails with CommitConflict, one that reused chunks gc marked writes them anew.

        grace: seconds (>= 1; default 3600); dry_run: mark, write and delete nothing, report
        what a run would do (works on a read-only store); wait: when the run leaves a mark
        naming objects, sleep until it is due and run again (what this call marked is
        deleted before it returns).

        Returns {"checkpoints_live", "checkpoints_reachable", "segments_reachable",
        "marked": {"segments": [...], "checkpoints": [...], "groups": [...], "bytes"},
        "deleted": (the same), "bytes_deleted", "aborted_uploads", "intents_deleted",
        "mark_written", "mark_at", "due_at", "raced", "runs", "dry_run", "seconds"}. A local
        store raises InvalidArgumentError (its space comes back through compact()); a closed one
        StoreClosedError; RemoteError, CorruptionError (a ref or a needed checkpoint
        object is damaged or missing: then nothing is deleted)."""
        if isinstance(grace, bool) or not isinstance(grace, (int, float)) or \
                not remote_layout.MIN_GC_GRACE_SECONDS <= grace < math.inf:
            raise InvalidArgumentError(f"grace must be a number of seconds from "
                                       f"{remote_layout.MIN_GC_GRACE_SECONDS:g}, got {grace!r}")
        dry_run = validate_flag(dry_run, "dry_run")
        wait = validate_flag(wait, "wait")
        if not self._remote:
            raise InvalidArgumentError(f"gc() is for S3 stores; {self.path} is a local store: "
                                       "its space comes back through compact() "
                                       "(`snapstore compact`)")
        c = self._committer
        c.check_open(write=not dry_run)
        with io_errors("garbage collection failed"):
            return remote_gc.collect(c.client, grace=float(grace), dry_run=dry_run, wait=wait)

    def verify(self, deep: bool = False) -> dict:
        """Checks the store; returns a report {"ok", "problems": [...], ...}. Each problem has
        kind, message, affected checkpoint ids, segment and offset. deep=True also re-reads and
        re-hashes every chunk and every log record (an S3 store's: in the bucket, and its
        refs and live checkpoint objects too)."""
        deep = validate_flag(deep, "deep")
        c = self._committer
        c.check_open()
        with c.maintenance(exclusive=False):
            c.check_open()                  # closed by another thread while this waited
            try:
                report = verify_store(c.index, c.backend, deep=deep)
                # damage found in locally cached copies (an S3 store's blocks) is dropped and
                # checked again from the bucket: only the bucket's own damage is reported
                damaged = {n for n in (segment_number(p.get("segment"))
                                       for p in report["problems"]) if n is not None}
                dropped = [c.backend.forget_cached(n) for n in sorted(damaged)]
                if any(dropped):
                    report = verify_store(c.index, c.backend, deep=deep)
                if deep:
                    for kind, message, ids in c.bucket_problems():
                        report["problems"].append({"kind": kind, "message": message,
                                                   "checkpoints": sorted(ids),
                                                   "segment": None, "offset": None})
                    report["ok"] = not report["problems"]
            except (StoreIOError, AttributeError):
                c.check_open()              # closed by another thread meanwhile
                raise
            return report

    # ---- reading ------------------------------------------------------------------------------
    def _refetching(self, read: Callable, *args) -> Any:
        """read(*args), once more when it failed a checksum in a segment the backend serves
        from a local copy (an S3 store's block cache: a damaged cached block is dropped and
        fetched from the bucket again, so only damage in the bucket itself is an error)."""
        try:
            return read(*args)
        except CorruptionError as exc:
            number = segment_number(getattr(exc, "segment", None))
            if number is None or not self.backend.forget_cached(number):
                raise
        return read(*args)

    def _expected_head(self, stream: str, expect_head: Any) -> Any:
        """A checked expect_head as the commit takes it: a CheckpointInfo as its id, once it
        is known to describe this store's checkpoint of that id (CommitConflict if that is
        another checkpoint: the head cannot be the one the info describes). An id that is
        not here (deleted meanwhile) is the commit's own conflict."""
        if not isinstance(expect_head, CheckpointInfo):
            return expect_head
        with self._committer.read() as r:
            commit = r.checkpoint(expect_head.id)
        if commit is not None and not describes(expect_head, commit):
            raise CommitConflict(f"stream {stream!r}: expect_head names no checkpoint of this "
                                 f"store: {not_described(expect_head, commit)}",
                                 stream=stream, expected=expect_head.id)
        return expect_head.id

    @staticmethod
    def _checked_name(name: Any) -> Any:
        """name, checked to be a well-formed checkpoint name (a CheckpointInfo is kept whole:
        _get_commit checks that it describes this store's checkpoint of its id)."""
        checkpoint_names.parse(name.id if isinstance(name, CheckpointInfo) else name)
        return name

    @classmethod
    def _get_commit(cls, r: IndexView, name: Any) -> Commit:
        """The checkpoint a name names in the snapshot r (engine/names.py). A CheckpointInfo
        names the checkpoint of its id only when it describes it: one from another store
        names nothing here (CheckpointNotFound), not this store's checkpoint of the same id."""
        name = cls._checked_name(name)
        if not isinstance(name, CheckpointInfo):
            return checkpoint_names.resolve(r, name)
        commit = checkpoint_names.resolve(r, name.id)
        if not describes(name, commit):
            raise CheckpointNotFound(not_described(name, commit))
        return commit

    def resolve(self, name: Any) -> CheckpointInfo:
        """The checkpoint a name names. Every method that takes a checkpoint (get, restore,
        restore_into, read, load, delete, delete_many, tag, untag; the object layers' load and
        the CLI) accepts the same names, in this order of precedence:

            an int (or a CheckpointInfo)   that checkpoint id (a CheckpointInfo of another
                                           store names nothing: CheckpointNotFound)
            "latest"                       the newest checkpoint of the store
            "latest:STREAM"                the newest checkpoint of that stream (verbatim)
            "tag:TAG", "dcp:ID"            the checkpoint with that tag / DCP checkpoint_id
            "STREAM@SEQ"                   seq SEQ (CheckpointInfo.seq) of that stream; split
                                           at the last "@", SEQ digits
            any other str                  a tag, a stream name (its newest checkpoint) and a
                                           DCP checkpoint_id at once

        A name must name exactly one checkpoint: several (a tag on two checkpoints, a stream
        named like another's tag...) raise AmbiguousCheckpointName listing them (an
        InvalidArgumentError, not a CheckpointNotFound); a DCP checkpoint_id saved twice in a
        stream names the newest (as dcp.load reads it). Nothing: CheckpointNotFound. Ids,
        "latest" and stream names are index lookups; tags and DCP ids scan every checkpoint's
        record (no secondary index). Details: snapstore.engine.names."""
        with self._committer.read() as r:
            return CheckpointInfo.from_commit(self._get_commit(r, name))

    def get(self, name: Any) -> CheckpointInfo:
        """The CheckpointInfo of one checkpoint (named as for resolve(): usually an id);
        CheckpointNotFound if there is none."""
        return self.resolve(name)

    def checkpoints(self, stream: str | None = None) -> list[CheckpointInfo]:
        """All checkpoints (of one stream), oldest first."""
        if stream is not None:
            validate_name(stream, "stream")
        with self._committer.read() as r:
            return [CheckpointInfo.from_commit(r.named_checkpoint(i, "the stream's list"))
                    for i in r.checkpoint_ids(stream)]

    def checkpoint_ids(self, stream: str) -> list[int]:
        """The ids of a stream's checkpoints, oldest first, read from one index snapshot
        without decoding any checkpoint (cheap: a key scan). The last one is the stream's
        head. With many writers, (last id, count) changes whenever the stream does (a commit
        adds a new greatest id, a delete lowers the count, ids are never reused), so it tells
        a cache of the stream whether it is still current."""
        validate_name(stream, "stream")
        with self._committer.read() as r:
            return r.checkpoint_ids(stream)

    def stream_version(self, stream: str) -> tuple[int, int, int] | None:
        """(head id, the stream's seq, number of checkpoints) of a stream, None when it has
        none, from one index snapshot and without listing it. The seq is the newest the stream
        ever gave out: its head's, or that of a newer checkpoint since deleted (seqs are never
        given out again). Whoever commits to the stream raises the seq, whoever deletes one of
        its checkpoints lowers the count (a commit raises it), so an equal version means an
        unchanged stream. For a cache of the stream (the LangGraph
        saver's) that must see other writers' commits and deletes at every call."""
        validate_name(stream, "stream")
        with self._committer.read() as r:
            return r.stream_version(stream)

    def latest(self, stream: str = "default") -> CheckpointInfo | None:
        """The newest checkpoint of a stream, or None."""
        validate_name(stream, "stream")
        with self._committer.read() as r:
            head = r.stream_head(stream)
            if head is None:
                return None
            return CheckpointInfo.from_commit(r.named_checkpoint(head, f"stream {stream!r}'s head"))

    def streams(self) -> list[str]:
        """The names of the streams that have at least one checkpoint, sorted. A stream
        exists while it has checkpoints: deleting its last one removes it."""
        with self._committer.read() as r:
            return sorted(r.streams())

    def restore(self, name: Any) -> dict[str, bytes]:
        """All buffers of a checkpoint (named as for resolve()), byte-exact, as
        {buffer name: bytes}."""
        def read(r: IndexView, commit: Commit) -> dict[str, bytes]:
            out = {}
            for b in commit.buffers:
                target = OutputBytes(b.size)
                self._refetching(restore_range, r, self.backend, commit, b.name, target.view)
                out[b.name] = target.finish()
            return out
        return self._read_checkpoint(name, read)

    def restore_into(self, name: Any, buffers: Mapping[str, Any]) -> None:
        """Restores named buffers of a checkpoint (named as for resolve()) in place into
        writable buffers of the same sizes (a subset of the checkpoint's buffers is fine).
        Sizes, names and that no two targets share memory are checked before anything is
        written; on CorruptionError the targets' contents are undefined."""
        if not isinstance(buffers, Mapping):
            raise InvalidArgumentTypeError("buffers must be a mapping of name to writable buffer")

        def read(r: IndexView, commit: Commit) -> None:
            targets = {}
            for name, obj in buffers.items():
                entry = find_buffer(commit, name)
                view = buffer_view(obj, f"buffer {name!r}", writable=True)
                if len(view) != entry.size:
                    raise InvalidArgumentError(f"buffer {name!r} has {len(view)} bytes; "
                                               f"checkpoint {commit.id} holds {entry.size}")
                targets[name] = view
            check_disjoint(targets)
            for name, view in targets.items():
                self._refetching(restore_range, r, self.backend, commit, name, view)
        self._read_checkpoint(name, read)

    def read(self, checkpoint: Any, name: str, offset: int = 0,
             length: int | None = None) -> bytes:
        """Bytes [offset, offset + length) of buffer `name` of a checkpoint (named as for
        resolve()); reads only the chunks it needs."""
        def read(r: IndexView, commit: Commit) -> bytes:
            entry = find_buffer(commit, name)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
                raise InvalidArgumentError(f"offset must be an int >= 0, got {offset!r}")
            size = max(0, entry.size - offset) if length is None else length
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidArgumentError(f"length must be an int >= 0, got {length!r}")
            if offset + size > entry.size:
                raise InvalidArgumentError(f"range {offset}:{offset + size} exceeds buffer "
                                           f"{name!r} of {entry.size} bytes")
            out = OutputBytes(size)
            self._refetching(restore_range, r, self.backend, commit, name, out.view, offset)
            return out.finish()
        return self._read_checkpoint(checkpoint, read)

    def _read_checkpoint(self, name: Any, read: Callable[[IndexView, Commit], Any]) -> Any:
        """read(snapshot, the checkpoint `name` names in it), made again on a new snapshot
        when a compaction moved the chunks it was reading (ConcurrentCompactionError), up
        to reader.READ_ATTEMPTS times in all (reader.retry_moved). A retry reads the
        checkpoint the first attempt resolved, by its id: CheckpointNotFound if another
        writer deleted it meanwhile. For reads that a retry may simply redo (a restore into
        the caller's buffers writes them again)."""
        found: list = []

        def attempt() -> Any:
            with self._committer.read() as r:
                return read(r, self._checkpoint_once_named(r, name, found))
        return retry_moved(attempt, f"reading checkpoint {name!r}")

    def _checkpoint_once_named(self, r: IndexView, name: Any, found: list) -> Commit:
        """The checkpoint `name` names in snapshot r on the first call (its id then kept in
        found), the one of that id on later calls: a name like "latest" must not switch to
        another checkpoint between the attempts of one read."""
        if not found:
            commit = self._get_commit(r, name)
            found.append(commit.id)
            return commit
        commit = r.checkpoint(found[0])
        if commit is None:
            raise CheckpointNotFound(f"checkpoint {found[0]} was deleted by another writer "
                                     "while it was being read")
        return commit

    def layout(self, checkpoint_id: int, name: str) -> list[tuple[int, int, bytes, int]]:
        """Where one buffer's bytes are stored: [(offset, length, chunk_id, chunk_offset), ...],
        sorted by offset, covering the buffer. Two byte ranges (of any checkpoints of this
        store) that map to the same chunk id at the same chunk offset hold the same bytes:
        snapstore.diff skips them without reading. (Different chunks may still hold equal
        bytes.) Reads only the index."""
        with self._committer.read() as r:
            commit = self._get_commit(r, checkpoint_id)
            find_buffer(commit, name)
            return [(off, length, cid, coff)
                    for off, coff, length, cid in buffer_manifest(r, commit, name)]

    def read_ranges(self, checkpoint_id: int, name: str, ranges, out=None):
        """Byte ranges [(offset, length), ...] of one buffer, back to back: into `out` (a
        writable buffer of exactly their total size; returned) or as new bytes. One read
        session however many ranges; only the chunks they touch are read."""
        try:
            ranges = list(ranges)
        except TypeError:
            raise InvalidArgumentTypeError(f"ranges must be an iterable of (offset, "
                                           f"length), got {type(ranges).__name__}") from None

        def read(r: IndexView, commit: Commit):
            size = find_buffer(commit, name).size
            checked = []
            for item in ranges:
                try:
                    offset, length = item
                except (TypeError, ValueError):
                    raise InvalidArgumentTypeError(f"a range must be (offset, length), got "
                                                   f"{item!r}") from None
                for v in (offset, length):
                    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                        raise InvalidArgumentError(f"range offsets and lengths must be ints "
                                                   f">= 0, got {item!r}")
                if offset + length > size:
                    raise InvalidArgumentError(f"range {offset}:{offset + length} exceeds "
                                               f"buffer {name!r} of {size} bytes")
                checked.append((offset, length))
            total = sum(length for _, length in checked)
            if out is None:
                result = OutputBytes(total)
                self._refetching(restore_ranges, r, self.backend, commit, name, checked,
                                 result.view)
                return result.finish()
            view = buffer_view(out, "out", writable=True)
            if len(view) != total:
                raise InvalidArgumentError(f"out has {len(view)} bytes; the ranges hold {total}")
            self._refetching(restore_ranges, r, self.backend, commit, name, checked, view)
            return out
        return self._read_checkpoint(checkpoint_id, read)

    def manifests(self, name: Any) -> CheckpointManifests:
        """A checkpoint (named as for resolve()) as full manifests, from one index snapshot:
        its info, its meta as stored (reserved keys included) and, per buffer, the one
        manifest covering it (a delta chain's layers written over each other, as layout()
        gives it). With the chunks they name (read_chunks()) they make the same checkpoint in
        any store (import_checkpoint()). Reads only the index."""
        with self._committer.read() as r:
            return self._manifests_of(r, self._get_commit(r, name))

    @staticmethod
    def _manifests_of(r: IndexView, commit: Commit) -> CheckpointManifests:
        buffers = tuple(
            BufferManifest(b.name, b.size,
                           tuple((off, length, cid, coff) for off, coff, length, cid
                                 in buffer_manifest(r, commit, b.name)),
                           b.layout, b.page_size)
            for b in commit.buffers)
        return CheckpointManifests(CheckpointInfo.from_commit(commit), commit.meta, buffers)

    def with_manifests(self, name: Any,
                       use: Callable[[CheckpointManifests, Callable], Any]) -> Any:
        """use(manifests, read_chunks) on one index snapshot, and what it returns: manifests
        is the checkpoint (named as for resolve()) as manifests() gives it, and
        read_chunks(chunk ids) yields (chunk id, raw bytes) as read_chunks() does, from that
        same snapshot, so every chunk the manifests name is there (a chunk it lacks, or fails
        its checks, is damage: CorruptionError). What export_savepoint and
        copy_checkpoints read a checkpoint with: manifests() and a later read_chunks() are
        two snapshots, and a compaction between them may have trimmed the chunks (a live
        checkpoint's manifest then names others) or collected them (the checkpoint was
        deleted).

        read_chunks opens the segments the chunks lie in before it reads any, so a
        compaction that removes them later does not disturb it. When one was removed
        between the snapshot and that, read_chunks raises ConcurrentCompactionError, and
        use is called again from the start on a new snapshot, the checkpoint resolved again
        by its id (CheckpointNotFound when it was deleted meanwhile), up to
        reader.READ_ATTEMPTS times in all; then ConcurrentCompactionError (retryable). So
        use must leave nothing behind when it raises (a savepoint's temporary file is
        removed, an import's log rolled back) and must not keep read_chunks past its return. use's own exceptions pass unchanged (an OSError
        writing an output file stays an OSError). Use it in one thread. The snapshot is
        held while use runs: meanwhile the index keeps the pages it would otherwise reuse."""
        if not callable(use):
            raise InvalidArgumentTypeError(f"use must be callable, got {type(use).__name__}")
        found: list = []        # its id, once resolved: a retry reads the same checkpoint

        def attempt() -> Any:
            return self._refetching(self._with_manifests_once, name, found, use)
        return retry_moved(attempt, f"reading checkpoint {name!r}")

    def _with_manifests_once(self, name: Any, found: list, use: Callable) -> Any:
        # the snapshot is left without use's exception: use's errors are its own (the
        # snapshot's io_errors would call an OSError writing an output file a store read error)
        snapshot = self._committer.read()
        r = snapshot.__enter__()
        ended = []
        try:
            with lmdb_errors("read"):
                manifests = self._manifests_of(r, self._checkpoint_once_named(r, name, found))

            def read_chunks(chunk_ids) -> Iterator[tuple[bytes, bytes]]:
                if ended:
                    raise InvalidArgumentError("read_chunks was called after the use() "
                                               "with_manifests gave it to returned: its index "
                                               "snapshot is gone; call it inside use()")
                return _lmdb_errors_of(self._chunks_in(r, self._checked_chunk_ids(chunk_ids),
                                                       hold=True))
            return use(manifests, read_chunks)
        finally:
            ended.append(True)
            snapshot.__exit__(None, None, None)

    def read_chunks(self, chunk_ids) -> Iterator[tuple[bytes, bytes]]:
        """Yields (chunk id, raw bytes) for each of chunk_ids (32-byte BLAKE3 ids, as
        layout() and manifests() name them), in order, each read, checked and decoded by the
        one chunk decoder (CorruptionError naming segment and offset on damage, or when the
        store has no such chunk). One index snapshot and one read session for all of them,
        held until the iterator is exhausted or closed: use it in one thread. The snapshot is
        the index when it is called: a compaction since an earlier manifests() may have
        trimmed or collected chunks those name (with_manifests() reads both from one
        snapshot); ConcurrentCompactionError when a compaction removes a segment it reads
        meanwhile."""
        ids = self._checked_chunk_ids(chunk_ids)
        self._committer.check_open()
        return self._read_chunks(ids)

    @staticmethod
    def _checked_chunk_ids(chunk_ids) -> list:
        try:
            ids = list(chunk_ids) if not isinstance(chunk_ids, (str, bytes)) else None
        except TypeError:           # not iterable
            ids = None
        if ids is None or any(not isinstance(c, bytes) or len(c) != fmt.CHUNK_ID_BYTES
                              for c in ids):
            raise InvalidArgumentTypeError(f"chunk_ids must be an iterable of "
                                           f"{fmt.CHUNK_ID_BYTES}-byte chunk ids")
        return ids

    def _read_chunks(self, ids: list) -> Iterator[tuple[bytes, bytes]]:
        with self._committer.read() as r:
            for cid in ids:     # ids from another snapshot: a missing one need not be damage
                if r.chunk(cid) is None:
                    raise CorruptionError(
                        f"the store has no chunk {cid.hex()[:16]}…: a compaction since the "
                        "manifests naming it were read trimmed or collected it "
                        "(Store.with_manifests reads both from one index snapshot), or the "
                        "index is damaged")
            yield from self._chunks_in(r, ids)

    def _chunks_in(self, r: IndexView, ids: list, hold: bool = False
                   ) -> Iterator[tuple[bytes, bytes]]:
        """The chunks `ids` as the snapshot r places them, in one read session. hold: their
        segments (and their bases', for delta chunks) are opened first (ChunkReader.hold), so
        a compaction that removes them while the chunks are read does not cut the read
        short."""
        with io_errors("cannot read the store"), self.backend.open_reader() as segments:
            reader = ChunkReader(self.backend, segments, r,
                                 chunk_entries(r, ((0, 0, 0, cid) for cid in ids))
                                 if hold else None)
            if hold:
                reader.hold()
            for cid in ids:
                yield cid, bytes(reader.read(cid))

    def stats(self) -> dict:
        """Sizes, counts, deduplication ratio and chain lengths of the store, and the staging
        memory of asynchronous checkpoints: staging_bytes (its bound), staging_in_use_bytes
        (held by checkpoints not yet durable), staging_peak_bytes (the most ever held); and
        delta_chunks' keyframe cache: keyframe_cache_bytes (its bound: open()'s option in a
        writer with delta_chunks, else 0: none), keyframe_cache_in_use_bytes (held),
        keyframe_cache_hits and keyframe_cache_misses (bases asked for and found there,
        the probe's samples included; and read back); index_synced_at_commit (whether each
        commit of this writer syncs the index: False with sync_index=False or durability
        "none"; None for a reader or an S3 store) and index_rebuilt_seconds (what this open
        spent rebuilding an index written without syncs when the machine went down; None:
        nothing to rebuild)."""
        with self._committer.read() as r:
            logical = 0
            chains = []
            ids = r.checkpoint_ids()
            for i in ids:
                c = r.named_checkpoint(i, "the checkpoint table")
                logical += sum(b.size for b in c.buffers)
                chains.append(c.chain_length)
            unique_raw = live = garbage = 0
            entries = dict(r.chunks())
            n_chunks = len(entries)
            dead = collectable(entries)
            for cid, e in entries.items():
                if cid not in dead:
                    unique_raw += e.raw_len
                    live += fmt.RECORD_HEADER.size + e.stored_len
                else:
                    garbage += fmt.RECORD_HEADER.size + e.stored_len
            streams = r.streams()
            # in the read block: a close() by another thread meanwhile is StoreClosedError
            index = self._committer.index
            if index is None:
                self._committer.check_open()
            index_bytes = index.disk_bytes()
            segments = self.backend.sizes()
        seg_bytes = sum(segments.values())
        return {
            "checkpoints": len(ids), "streams": len(streams), "chunks": n_chunks,
            "segments": len(segments), "segment_bytes": seg_bytes,
            "index_bytes": index_bytes,
            "logical_bytes": logical, "unique_chunk_bytes": unique_raw,
            "live_chunk_bytes": live, "garbage_chunk_bytes": garbage,
            "dedup_ratio": (logical / live) if live else (math.inf if logical else 1.0),
            "max_chain_length": max(chains, default=0),
            "mean_chain_length": (sum(chains) / len(chains)) if chains else 0.0,
            **self._persister.staging_stats(),
            **self._committer.keyframe_stats(),
            **self._committer.index_stats(),
        }


def open(path, *, durability: str | None = None, sync_index: bool = True, create: bool = True,
         readonly: bool = False,
         timeout: float = 0.0, page_size: int = fmt.DEFAULT_PAGE_SIZE,
         chunk_size: int | None = None, chunking: str = "pages",
         cdc_sizes: tuple = fmt.DEFAULT_CDC_SIZES, max_chain: int = fmt.DEFAULT_MAX_CHAIN,
         full_threshold: float = fmt.DEFAULT_FULL_THRESHOLD, compression: str = "zstd",
         compression_level: int = fmt.DEFAULT_COMPRESSION_LEVEL,
         delta_chunks: bool = False,
         keyframe_cache_bytes: int = wr.DEFAULT_KEYFRAME_CACHE_BYTES,
         segment_size: int = fmt.DEFAULT_SEGMENT_SIZE,
         staging_bytes: int = DEFAULT_STAGING_BYTES,
         backend: SegmentBackend | None = None, cache_dir=None,
         refresh: float = remote_layout.DEFAULT_REFRESH_SECONDS,
         remote_timeout: float = remote_layout.DEFAULT_REMOTE_TIMEOUT) -> Store:
    """Opens (and by default creates) the store in directory ``path``, or the S3 store at
    ``path`` = "s3://BUCKET/PREFIX" (docs/design.md, "S3 stores"); returns a Store.

    Every option is keyword-only and checked before anything touches the file system.
    The write options (page_size ... compression_level) apply to what this Store writes;
    checkpoints already stored keep theirs, and every reader reads every layout.

    Args:
        path: the store directory (str, bytes or os.PathLike).
        durability: "fsync" (a local store's default): a checkpoint is on disk when the
            call returns (data and index are synced); "none": no sync, faster, but a power
            loss (not a process crash) may lose the latest checkpoints (never older ones, nor
            what a "fsync" writer acknowledged; the next open rebuilds the index from the log
            first, as with sync_index=False). An S3 store's: "remote" (its default): a
            checkpoint is committed in the bucket when the call returns.
        sync_index: a local writer's (default True). False: a durable commit makes one sync
            (the log's) instead of three, for stores of many small commits (a 2 KiB commit
            took 0.8 instead of 1.4 ms here): the log stays the truth and every acknowledged
            checkpoint stays durable; the index is synced when the Store closes. The price:
            after a power cut or an OS crash while such a writer had the store open, the next
            open rebuilds the index from the log before anything else, which reads every
            segment, as `snapstore repair` does (docs/design.md, "An index written without
            syncs"). SnapstoreSaver.from_path opens its store so.
        create: create the store if ``path`` is not one yet (default True); False raises
            FormatError for a directory that is not a store.
        readonly: open as a reader: no lock is taken, any number of readers run next to
            any number of writers; every write raises ReadOnlyError.
        timeout: seconds to wait for a lock (0: fail at once with StoreLocked;
            float("inf"): wait for ever). Writers never wait for each other's writes (each
            appends to a log of its own), only for the index transaction of one: that of a
            process stopped inside it (SIGSTOP, Ctrl-Z, a debugger) is waited for while it
            stays stopped up to max(timeout, 2 s), then StoreLocked (lock "index"). A
            writer's open waits for what holds the store to itself (its creation, a format
            upgrade, a repair, a writer of an older snapstore), and compact() and verify()
            wait for a running compaction. For a reader: also how long to wait for a store
            being created to appear.
        page_size: the unit of incremental saves, a power of two from 512 to 1 MiB (default
            4096): a buffer's delta is the pages whose fingerprints changed.
        chunk_size: the largest chunk a full buffer is cut into, a multiple of page_size, at
            most 8 MiB (default None: 64 KiB, or page_size when that is larger): the unit of
            deduplication and of partial reads.
        chunking: "pages" (default: page deltas) or "cdc" (content-defined chunks, FastCDC:
            every checkpoint stored whole, deduplicated; for content that shifts).
        cdc_sizes: (min, avg, max) chunk sizes of "cdc" chunking (default 16, 64, 256 KiB).
        max_chain: the longest delta chain (default 16): the delta that would reach it is
            rebased into a full manifest, so a restore reads at most this many manifests.
        full_threshold: from 0 to 1 (default 0.5): a buffer with more than this fraction of
            its bytes changed is stored whole, and so is a whole checkpoint with more than this
            fraction of all its bytes changed (CheckpointInfo.kind "full").
        compression: "zstd" (default) or "none"; chunks that do not shrink are stored raw.
        compression_level: the zstd level (default 1; higher: smaller, slower). From 3 on,
            the byte planes of float buffers may also rotate their items by 3 bits where a
            probe finds that codes smaller (format 6; float32 and bfloat16 weights: 0.2-0.45
            points more saved, for 25-60% more coding time of a dense checkpoint).
        delta_chunks: with compression "zstd" (default False): when most of a buffer of
            floats (a NumPy or torch float dtype) changed, each of its chunks is coded as the
            difference from the parent checkpoint's chunk at the same place, where that is
            smaller: Adam-like updates of float32 add about 60% of their bytes instead of
            84%; a checkpoint takes 1.2-1.4x as long (the first one 1.4-1.6x: see
            keyframe_cache_bytes) and a restore about 1.5x (it decodes both). A local
            store's checkpoints; S3 stores never write delta chunks, and with compression
            "none" it does nothing (every chunk is stored raw).
        keyframe_cache_bytes: with delta_chunks, the memory of this Store (default 1 GiB;
            0: none; freed by close(); read-only and S3 stores keep none) that keeps the
            chunks new chunks are coded against from one checkpoint to the next,
            so a checkpoint does not read them back from disk: as large as the float state,
            it takes a sixth to a quarter off a delta checkpoint, and the first checkpoint
            pays for filling it (docs/floatcodec.md); smaller, it keeps that share of them.
        segment_size: bytes after which a log segment is sealed and a new one begun (at least
            64 KiB; default 256 MiB, 64 MiB for an S3 store): the unit compaction rewrites,
            and an S3 store's unit of upload.
        staging_bytes: the staging memory of asynchronous checkpoints and trackers (at least
            1 MiB, at most the machine's memory; default 1 GiB; touched only as used).
        backend: a snapstore.engine.backends.SegmentBackend holding the segments (default:
            files under ``path``).
        cache_dir: an S3 store's local cache root (default $SNAPSTORE_CACHE_DIR, else
            $XDG_CACHE_HOME/snapstore, else ~/.cache/snapstore): one directory per store under it holds the cache index,
            the blocks of segments read, and this writer's segments until uploaded. An
            empty one is fine: everything is in the bucket.
        refresh: an S3 store's reads see other machines' commits at most this many seconds
            late (default 1; 0: every read pulls; Store.refresh() pulls now). Commits always
            check the bucket.
        remote_timeout: seconds an S3 request is retried (connection errors, timeouts,
            429, 5xx; bounded exponential backoff) before RemoteError (default 120). One
            attempt waits at most remote_timeout / 4 (5 s at most) to connect and
            remote_timeout / 2 (60 s at most) for a server that does not answer.
    Returns: Store (a context manager: ``with snapstore.open(p) as store:``).
    Raises: InvalidArgumentError / InvalidArgumentTypeError (bad option), FormatError (not a
        store, or written by a newer snapstore), StoreLocked (an operation that needs the
        store to itself holds it: it names the holder), StoreIOError, CorruptionError (a
        damaged index: see snapstore.repair).
    """
    return Store(path, durability=durability, create=create, readonly=readonly, timeout=timeout,
                 page_size=page_size, chunk_size=chunk_size, chunking=chunking,
                 cdc_sizes=cdc_sizes, max_chain=max_chain, full_threshold=full_threshold,
                 compression=compression, compression_level=compression_level,
                 delta_chunks=delta_chunks, keyframe_cache_bytes=keyframe_cache_bytes,
                 segment_size=segment_size,
                 staging_bytes=staging_bytes, backend=backend, cache_dir=cache_dir,
                 refresh=refresh, remote_timeout=remote_timeout, sync_index=sync_index)


_OPEN_SIGNATURE = inspect.signature(open)


def repair(path, *, progress: Callable[[int, int], None] | None = None,
           timeout: float = 0.0, cache_dir=None) -> dict:
    """Rebuilds the index of the store at `path` from its segments alone (docs/design.md,
    "Repair"): for an index that is missing, truncated or damaged so badly the store cannot
    open, or any time. Afterwards the same checkpoints, streams, seqs and tags exist and
    restore byte-exact (as far as the log is intact). A module-level function, not a Store
    method: it works on a store that cannot open, needs the store to itself (it takes the
    store lock exclusively, waiting up to `timeout` seconds for every writer to close:
    StoreLocked names one) and refuses while this process has the store open.

    progress(bytes scanned, total bytes) is called as the segments are scanned. Returns a
    report {"ok", "problems", "checkpoints", "streams", "chunks", "segments", "bytes_scanned",
    "records_replayed", "state_section", "seconds", "mb_per_s", ...}; "ok" is False when the
    log itself is damaged (each problem names what and where; what it still holds is kept).
    Raises FormatError (not a store, or a newer format), StoreLocked, StoreIOError.

    An S3 store (s3://BUCKET/PREFIX): its bucket is the truth, so repair deletes the local
    cache (under cache_dir, as for open()) and pulls it again from the bucket."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
            not math.isfinite(timeout) or timeout < 0:
        raise InvalidArgumentError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    if progress is not None and not callable(progress):
        raise InvalidArgumentError("progress must be callable or None")
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise InvalidArgumentError(f"path must be a path, got {type(path).__name__}")
    if remote_layout.is_remote(path):
        return rebuild_cache(validate_path(path), cache_dir=cache_dir, progress=progress,
                             timeout=float(timeout))
    if cache_dir is not None:
        raise InvalidArgumentError("cache_dir= is for S3 stores (s3://...)")
    return rebuild_index(os.fsdecode(path), progress=progress, timeout=float(timeout))
