"""RemoteCommitter: the engine side of an S3 store, with the interface the Store uses of a
Committer (commit, apply_ops, read, check_open, exclusive, maintenance, close).

Opening: the bucket's snapstore.json (created if absent and allowed), the local cache (its
LMDB index; wiped when it belongs to another store of the same URL); a writer then settles
the writer sessions of the cache directory that are gone (remote/spool.py), takes a log
number of its own (logs/<L>, created If-None-Match: *) and its session lock in the cache
directory; last, a pull of every stream.

Commit (docs/design.md, "S3 stores"): pull the stream (its ref and etag), plan and store
the chunks into this writer's log (local segments, each uploaded when sealed), seal and
await the uploads, create the checkpoint object (If-None-Match: * allocates the id), write
the ref If-Match (the commit point), apply locally. A lost ref race is CommitConflict.
Crash points (engine/crashpoints.py) mark the steps: remote_after_data, remote_after_upload,
remote_after_outcome (remote/intents.py), remote_after_checkpoint_object,
remote_after_ref_write, remote_after_apply.

Locking: one RLock per committer serialises its operations (as the Committer's writer lock);
between writers, processes and machines nothing is held: the ref's conditional write
decides.
"""
from __future__ import annotations

import contextlib
import fcntl
import itertools
import json
import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from snapstore.engine import format as fmt
from snapstore.engine import records
from snapstore.engine import writer as wr
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.commit import (ANY_HEAD, ChunkSource, PlanMaker, check_usable,
                                     count_bytes_new, io_errors, reused_chunks, store_plans,
                                     tagged_meanwhile)
from snapstore.engine.fsutil import FLOCK_TAKEN, flock_until, open_regular
from snapstore.engine.index import Index, IndexView
from snapstore.engine.keyframes import no_cache_stats
from snapstore.engine.records import Commit
from snapstore.engine.wal import SegmentLog
from snapstore.errors import (CheckpointNotFound, CommitConflict, CorruptionError,
                              FormatError, SnapstoreError, StoreIOError, StoreLocked)
from snapstore.remote import checkpoints as ckpt_objects
from snapstore.remote import gcguard, intents, layout, refs, spool, sync
from snapstore.remote.s3client import NotFound, PreconditionFailed, S3Client
from snapstore.remote.segments import RemoteSegments
from snapstore.wakeups import WakeUps

_ID_PROBES = 64             # ids tried one after another before listing for the newest
_IDENTITY_FILE = "store.json"


@dataclass
class StoredChunks:
    """What RemoteCommitter.store_chunks stored: buffer entries, [(buffer, page
    fingerprints)], the new-chunk table, the reused-chunk table (NEW_CHUNK entries locating
    the other chunks the entries name), the chunk bytes written and the segments they lie
    in."""
    entries: list
    fingerprints: list
    new_chunks: bytes
    reused: bytes
    bytes_new: int
    segments: list


class RemoteCommitter:
    """An open S3 store's engine side (see the module docstring)."""

    def __init__(self, url: str, options: wr.WriteOptions, *, durability: str,
                 readonly: bool, create: bool, cache_dir: str | None, segment_size: int,
                 refresh: float, remote_timeout: float) -> None:
        self.path = url
        self.url = layout.parse_url(url)
        self.options = options
        self.durability = durability
        self.readonly = readonly
        self.refresh_seconds = refresh
        self.index: Index | None = None
        self.backend: RemoteSegments | None = None
        self._cache_lock: int | None = None      # the cache lock, held shared while open
        self.log: SegmentLog | None = None
        self.log_number: int | None = None
        self.session: spool.Session | None = None
        self.client: S3Client | None = None
        self.writer_id = uuid.uuid4().hex
        self._serials = itertools.count(1)
        self._lock = threading.RLock()
        self._staging: bytearray | None = None
        self._closed = False
        self._pid = os.getpid()
        self._pulled_at = -float("inf")
        # durability "local": checkpoints committed locally whose ref write is still to come
        self._uploader = None
        try:
            self.client = S3Client(self.url, timeout=remote_timeout)
            self.gc_guard = gcguard.Guard(self.client)
            self.intents = intents.IntentBoard(self.client, self.writer_id, self.next_serial)
            identity = self._open_bucket(create and not readonly)
            self._uuid = identity.get("uuid")
            root = cache_dir if cache_dir is not None else layout.default_cache_root()
            self.cache_path = layout.cache_dir_for(os.path.abspath(os.fspath(root)),
                                                   self.client.endpoint, self.url)
            with io_errors(f"{self.path}: cannot use the cache directory {self.cache_path}"):
                self._open_cache(identity)
                self._cache_lock = _lock_cache(self.cache_path, exclusive=False,
                                               timeout=remote_timeout, url=self.path)
            self.index = Index(os.path.join(self.cache_path, fmt.INDEX_DIR), readonly=False,
                               durable=False, new_version=layout.CACHE_INDEX_VERSION,
                               timeout=remote_timeout)
            with io_errors(f"{self.path}: cannot use the cache directory {self.cache_path}"):
                self.backend = RemoteSegments(
                    self.client, spool.spool_dir(self.cache_path),
                    os.path.join(self.cache_path, layout.CACHE_RANGES_DIR),
                    durable=durability == "local")
            if not readonly:
                with io_errors(f"cannot open the cache of {url}"):
                    spool.settle_sessions(self.client, self.cache_path, identity.get("uuid"))
                    self.log_number, self.session = self._take_log(identity.get("uuid"))
                self.log = SegmentLog(self.backend, segment_size, self.log_number,
                                      version=layout.SEGMENT_VERSION)
                self.log.open_tail()
                if durability == "local":
                    self._uploader = BackgroundUploads(self)
            with io_errors(f"cannot read {url}"):
                self._pull_all()
        except BaseException:
            self._release()
            raise

    # ---- opening ----------------------------------------------------------------------------
    def _open_bucket(self, create: bool) -> dict:
        """The bucket's snapstore.json (created when absent and allowed); returns it."""
        key = layout.FORMAT_KEY
        for attempt in range(3):
            try:
                data, _ = self.client.get(key)
            except NotFound:
                if not create:
                    raise FormatError(f"{self.path} is not a snapstore store (no {key}); "
                                      "open it with create=True (`snapstore init "
                                      f"{self.path}` on the command line) to make one") \
                        from None
                foreign = self._first_object()
                if foreign is not None:
                    if foreign == key or attempt < 2:
                        continue    # another writer creating the store meanwhile: read again
                    raise FormatError(f"{self.path} holds objects ({foreign!r}, ...) but no "
                                      f"{key}: not a snapstore S3 store (a local store's "
                                      "files copied there are not one either: use `snapstore "
                                      "copy`); give an empty prefix to make a store") from None
                doc = {"format": layout.REMOTE_FORMAT, "version": layout.REMOTE_FORMAT_VERSION,
                       "created": time.time(), "uuid": uuid.uuid4().hex}
                try:
                    self.client.put(key, json.dumps(doc).encode(), if_none_match=True)
                    return doc
                except PreconditionFailed:
                    continue        # created by another writer meanwhile: read it
            try:
                doc = json.loads(data)
                ok = doc.get("format") == layout.REMOTE_FORMAT
                version = int(doc["version"])
            except (ValueError, KeyError, TypeError, AttributeError):
                ok, version = False, 0
            if not ok:
                raise FormatError(f"{self.path}: {key} is not snapstore's")
            if version > layout.REMOTE_FORMAT_VERSION:
                raise FormatError(f"{self.path} is an S3 store of format {version}; this "
                                  f"snapstore reads up to {layout.REMOTE_FORMAT_VERSION}: "
                                  "upgrade snapstore")
            return doc
        raise FormatError(f"{self.path}: cannot read {key}")

    def _check_same_store(self) -> None:
        """StoreIOError when the bucket's store is no longer the one this Store opened (its
        prefix deleted and a new store made there): this cache's checkpoints, ids and log
        numbers are another store's, and reading or writing on would return its bytes under
        the new store's names, or overwrite the new store's segments."""
        try:
            data, _ = self.client.get(layout.FORMAT_KEY)
            now = json.loads(data).get("uuid")
        except NotFound:
            now = None
        except (ValueError, AttributeError):
            now = "damaged"
        if now != self._uuid:
            raise StoreIOError(f"{self.path}: the store this Store opened is gone from the "
                               "bucket (its prefix was deleted" + (", and a new store made "
                                                                   "there" if now else "")
                               + "): close it, and open the store again")

    def _first_object(self) -> str | None:
        """The key of an object under the prefix, if any ("folder" markers, empty keys
        ending in "/", are not objects)."""
        for info in self.client.list(""):
            if info.key and not (info.key.endswith("/") and info.size == 0):
                return info.key
        return None

    def _open_cache(self, identity: dict) -> None:
        """Makes the cache directory; one that cached another store of this URL (the prefix
        was deleted and made again) is emptied first."""
        os.makedirs(self.cache_path, mode=0o700, exist_ok=True)
        name = os.path.join(self.cache_path, _IDENTITY_FILE)
        try:
            with open(name) as f:
                cached = json.load(f).get("uuid")
        except (OSError, ValueError, AttributeError):
            cached = None
        if cached != identity.get("uuid"):
            for entry in (fmt.INDEX_DIR, layout.CACHE_RANGES_DIR, spool.SPOOL_DIR):
                shutil.rmtree(os.path.join(self.cache_path, entry), ignore_errors=True)
            tmp = f"{name}.{os.getpid()}.part"
            with open(tmp, "w") as f:
                json.dump({"url": str(self.url), "uuid": identity.get("uuid")}, f)
            os.replace(tmp, name)
        os.makedirs(os.path.join(self.cache_path, fmt.INDEX_DIR), mode=0o700, exist_ok=True)

    def _take_log(self, store_uuid: str | None) -> tuple[int, spool.Session]:
        """A log number of this writer's own (logs/<L> created If-None-Match: *) and its
        session lock in the cache directory."""
        last = None
        for obj in self.client.list(layout.LOGS_DIR):
            name = obj.key[len(layout.LOGS_DIR):]
            if name.isdigit():
                last = int(name)
        number = 0 if last is None else last + 1
        doc = json.dumps({"writer": self.writer_id, "host": socket.gethostname(),
                          "pid": os.getpid(), "since": time.time()}).encode()
        while True:
            if number >= fmt.LOG_SEGMENTS // 10:
                raise FormatError(f"{self.path}: no log numbers left")
            try:
                self.client.put(layout.log_key(number), doc, if_none_match=True)
            except PreconditionFailed:
                number += 1
                continue
            session = spool.Session.take(self.cache_path, number, {
                "store": store_uuid, "durability": self.durability, "writer": self.writer_id,
                "pid": os.getpid()})
            if session is not None:
                return number, session
            number += 1     # held here: a settler at work, or a session of an older store

    # ---- state ----------------------------------------------------------------------------
    def _release(self, clean: bool = False) -> None:
        """Closes everything; clean: every upload of this session landed (its spool and
        session lock file can go; otherwise the next writer's open settles them)."""
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.backend is not None:
            clean = clean and not self.backend.failed_uploads
            self.backend.close()
            self.backend = None
        if self.session is not None:
            with contextlib.suppress(OSError):
                self.session.close(clean=clean)
            self.session = None
        if self.client is not None:
            self.client.close()
        if self.index is not None:
            self.index.close()
            self.index = None
        lock, self._cache_lock = self._cache_lock, None
        if lock is not None:
            os.close(lock)

    def close(self) -> None:
        """Waits for the operation in progress and for uploads, then closes. Idempotent."""
        if self.forked:
            self._closed = True
            return
        with self._lock:
            if not self._closed:
                self._closed = True
                clean = False
                try:
                    if self._uploader is not None:
                        self._uploader.stop()
                    if self.backend is not None and self.log is not None:
                        with contextlib.suppress(SnapstoreError):
                            self.backend.wait_uploaded()
                            clean = True
                finally:
                    self._release(clean)
                if self._uploader is not None:
                    self._uploader.raise_failure()

    @property
    def closed(self) -> bool:
        return self._closed

    def index_stats(self) -> dict:
        """An S3 store commits in its bucket; its local index is a cache of it."""
        return {"index_synced_at_commit": None, "index_rebuilt_seconds": None}

    def keyframe_stats(self) -> dict:
        """Zeros: an S3 store writes no delta chunks, so it keeps no keyframes."""
        return no_cache_stats()

    @property
    def forked(self) -> bool:
        return self._pid != os.getpid()

    def after_fork_in_child(self) -> None:
        self._lock = threading.RLock()
        self._cache_lock = None         # the parent's (a flock belongs to both: never closed)
        if self.session is not None:
            self.session.forget()       # the parent's session; the parent's lock

    def check_open(self, write: bool = False) -> None:
        """As Committer.check_open: ForkedStoreError, StoreClosedError, ReadOnlyError."""
        check_usable(self.path, self._pid, self._closed or self.index is None,
                     write and self.readonly)

    def _pull_all(self) -> None:
        self._check_same_store()
        skip = self._uploader.streams() if self._uploader is not None else set()
        sync.pull_all(self.client, self.index, skip=skip)
        self.gc_guard.follow(self.index)        # the cache follows gc's mark
        self._pulled_at = time.monotonic()

    def flush(self) -> None:
        """Durability "local": waits until every checkpoint committed locally is committed
        in the bucket; raises the first failure (RemoteError, CommitConflict) since the last
        report. Durability "remote": nothing is in flight."""
        self.check_open()
        if self._uploader is not None:
            self._uploader.wait_idle()
            self._uploader.raise_failure()

    def refresh(self) -> None:
        """Pulls every stream of the bucket into the cache now."""
        self.check_open()
        with io_errors(f"cannot read {self.path}"):
            self._pull_all()

    def bucket_problems(self) -> list:
        """A deep verify's look at the bucket itself, not the cache's copies: every stream's
        ref and every live checkpoint object is read and decoded (sync.check_objects), so a
        damaged or deleted one is found on a machine whose cache still holds it (a new
        machine could not open the store). [(kind, message, checkpoint ids)]."""
        self.check_open()
        with io_errors(f"cannot read {self.path}"):
            return sync.check_objects(self.client, self.index)

    @contextlib.contextmanager
    def read(self) -> Iterator[IndexView]:
        """A snapshot of the cache index, pulled from the bucket first when the last pull is
        more than `refresh` seconds old. An OSError of the with block is raised as
        StoreIOError (as the local committer's)."""
        self.check_open()
        if time.monotonic() - self._pulled_at > self.refresh_seconds:
            with io_errors(f"cannot read {self.path}"):
                self._pull_all()
        with io_errors(f"cannot read {self.path}"), self.index.read() as view:
            yield view

    @contextlib.contextmanager
    def read_cached(self) -> Iterator[IndexView]:
        """A snapshot of the cache index as it is, never pulled first: what an asynchronous
        capture plans with in its caller's time, which must not wait for the network (its
        commit, on the persister's thread, reads the stream's ref and conflicts if the
        cache was behind)."""
        self.check_open()
        with io_errors(f"cannot read {self.path}"), self.index.read() as view:
            yield view

    @contextlib.contextmanager
    def exclusive(self, write: bool = True) -> Iterator[None]:
        with self._lock:
            self.check_open(write)
            yield

    @contextlib.contextmanager
    def maintenance(self, exclusive: bool, timeout: float | None = None) -> Iterator[None]:
        """S3 stores take no maintenance lock (gc needs none)."""
        yield

    # ---- committing ---------------------------------------------------------------------------
    def next_serial(self) -> int:
        """A number unique to this writer's ref writes (thread-safe)."""
        return next(self._serials)

    def create_checkpoint_object(self, commit: Commit, reused: bytes, floor: int = 0) -> None:
        """Creates checkpoints/<id> If-None-Match: *, for the first free id past the cache's
        newest, the commit's parent and `floor` (gc's mark names the next id it ever
        allocated: ids of deleted objects are never taken again); sets commit.id."""
        with self.index.read() as r:
            next_id = r.next_id()
        candidate = max(next_id, (commit.parent or 0) + 1, floor)
        for attempt in range(10_000):
            commit.id = candidate
            try:
                self.client.put(layout.checkpoint_key(candidate),
                                ckpt_objects.encode(commit, reused), if_none_match=True)
                return
            except PreconditionFailed:
                candidate += 1
                if attempt % _ID_PROBES == _ID_PROBES - 1:      # far behind: jump ahead
                    newest = [layout.checkpoint_id_of(o.key) for o in self.client.list(
                        layout.CHECKPOINTS_DIR, start_after=layout.checkpoint_key(candidate))]
                    candidate = max([candidate] + [i + 1 for i in newest if i is not None])
        raise CommitConflict(f"{self.path}: could not allocate a checkpoint id")

    def _unreusable(self) -> frozenset:
        """Segments whose chunks a commit stores anew instead of reusing: another session's
        not in the bucket (gcguard, W0), and this Store's own whose upload failed for good
        (a durability "local" checkpoint whose upload failed left its chunks in the cache:
        every later checkpoint reusing them failed too, with the server back)."""
        own = self.backend.never_uploaded() if self.backend is not None else frozenset()
        return self.gc_guard.unreusable() | own

    def reused_table(self, view: IndexView, pins: bytes, known: dict | None = None) -> bytes:
        """NEW_CHUNK entries locating the chunks `pins` (packed ids) names, from the cache
        index, else from `known` (ChunkSink.known): what a checkpoint object (or a group's
        part) lists of the chunks it reuses."""
        out = []
        for i in range(0, len(pins), fmt.CHUNK_ID_BYTES):
            cid = pins[i:i + fmt.CHUNK_ID_BYTES]
            entry = view.chunk(cid)
            if entry is not None:
                out.append(fmt.NEW_CHUNK.pack(cid, entry.segment, entry.offset,
                                              entry.stored_len, entry.raw_len, entry.codec))
            elif known and cid in known:
                out.append(fmt.NEW_CHUNK.pack(cid, *known[cid]))
            else:
                raise CorruptionError(f"{self.path}: chunk {cid.hex()} vanished from the "
                                      "cache index")
        return b"".join(out)

    def store_chunks(self, stream: str, head: int | None, make_plans: PlanMaker,
                     on_stored: dict | None = None,
                     pause: Callable[[], None] | None = None, *,
                     wait: bool = True, until: float | None = None) -> StoredChunks:
        """Steps 1 and 2 of a commit (the writer lock held, the cache pulled up to `head`):
        plans against the cache's `head` of the stream, appends the new chunk records to this
        writer's log, seals it and (wait) waits until every segment is uploaded. On a
        failure before the seal the log is rolled back; segments uploaded are never
        referenced. With `until` (time.monotonic(); wait only) large plans are announced
        first (remote/intents.py), waiting at most until then for other writers uploading
        the same chunks."""
        if self._staging is None:
            self._staging = bytearray(wr.STAGING_BYTES)
        board = self.intents if wait and until is not None else None
        mark = self.log.position
        try:
            if board is not None:
                board.begin()
            with self.index.read() as r:
                sink = wr.ChunkSink(self.log, r, self.options, pause, self._unreusable())
                announce = None if board is None else \
                    (lambda plan: sink.known.update(board.announce(plan, until)))
                entries, fingerprints = store_plans(r, stream, head, make_plans, sink,
                                                    self._staging, on_stored, announce)
                new_chunks = sink.new_chunk_table()
                reused = self.reused_table(r, reused_chunks(entries, new_chunks), sink.known)
            self.log.seal()
        except BaseException as exc:
            self.log.rollback(mark)
            if board is not None:
                board.abandon(exc)
            raise
        crashpoint("remote_after_data")         # uploads in flight
        if wait:
            try:
                self.backend.wait_uploaded()
            except BaseException as exc:
                if board is not None:
                    board.abandon(exc)
                raise
            crashpoint("remote_after_upload")
            if board is not None:
                board.finish(new_chunks + reused)
                crashpoint("remote_after_outcome")  # others may reuse what it uploaded
        segments = list(range(mark[0], self.log.position[0]))
        return StoredChunks(entries, fingerprints, new_chunks, reused, sink.bytes_new,
                            segments)

    def intent_deadline(self, ticket: gcguard.CommitTicket) -> float | None:
        """How long (time.monotonic()) a commit may wait for other writers' uploads of its
        chunks (remote/intents.py): a quarter of gc's grace from its start, so that it
        still commits within half of it (W3); None (no intents) when the commit was
        planned again for gc (an intent's chunks may be what gc marked)."""
        if ticket.replanned:
            return None
        return ticket.started + ticket.grace / 4

    def publish(self, ref: refs.Ref, commit: Commit, reused: bytes, fingerprints: list, *,
                still_follows: Callable[[refs.Ref], bool] | None = None,
                ticket: "gcguard.CommitTicket | None" = None) -> refs.Ref:
        """Steps 3 to 5 of a commit: creates the checkpoint object (allocating commit.id),
        writes the stream's ref (read as `ref`) advanced by it with If-Match (the commit
        point), applies it to the cache with its page fingerprints [(buffer, digests)];
        returns the new ref. A lost ref race raises CommitConflict, unless
        still_follows(the ref now) says the commit still follows it (the ref changed in a
        way that commutes with it: a tag, a delete of an older checkpoint), when the write
        is tried again against the new ref."""
        stream, head = commit.stream, commit.parent
        self.create_checkpoint_object(commit, reused, ticket.next_id if ticket else 0)
        crashpoint("remote_after_checkpoint_object")
        if ticket is not None:
            self.gc_guard.check_deadline(ticket)
        for _ in range(100):
            tags = dict(ref.tags)
            if commit.tags:             # an S3 store keeps tags in the ref
                tags[commit.id] = sorted(commit.tags)
            new_ref = ref.advanced(self.writer_id, self.next_serial(), head=commit.id,
                                   seq=commit.seq, live=ref.live + [commit.id], tags=tags)
            try:
                new_ref = refs.write(self.client, ref, new_ref)
                break
            except refs.RefMoved as moved:
                if still_follows is None or not still_follows(moved.current):
                    raise CommitConflict(
                        f"stream {stream!r} moved while this checkpoint was made (head "
                        f"{moved.current.head}, not {head}): nothing was committed; read the "
                        "new head and retry", stream=stream, expected=head,
                        found=moved.current.head) from None
                ref = moved.current
        else:
            raise CommitConflict(f"stream {stream!r} kept changing; try again", stream=stream)
        crashpoint("remote_after_ref_write")    # committed; the cache does not know yet
        with self.index.write() as w:
            sync.apply_ref(w, new_ref, {commit.id: (commit, reused)})
            for name, fps in fingerprints:
                w.put_fingerprints(stream, name, commit.id, self.options.page_size, fps)
        crashpoint("remote_after_apply")
        return new_ref

    def _in_flight_gone(self, item: "_InFlight") -> bool:
        """Whether an in-flight checkpoint of this process failed and left the cache index
        (BackgroundUploads takes a failed one out, pulling its stream as the bucket has it)."""
        with self.index.read() as r:
            return r.checkpoint(item.id) is None

    def commit(self, stream: str, make_plans: PlanMaker, meta: Any, *,
               expect_head: Any = ANY_HEAD, on_stored: dict | None = None,
               pause: Callable[[], None] | None = None) -> Commit:
        """Stores planned buffers as the stream's next checkpoint and commits it in the
        bucket (see the module docstring); returns the Commit. Raises CommitConflict when
        the stream's head moved (or is not expect_head), RemoteError, StoreIOError."""
        layout.check_key_name(stream, "stream")
        with self._lock, io_errors("checkpoint failed"):
            self.check_open(write=True)
            self.log.check_writable()
            if self._uploader is not None:
                self._uploader.raise_failure()
            return self._replanning(stream, "checkpoint", lambda ticket: self._commit_once(
                stream, make_plans, meta, expect_head, on_stored, pause, ticket))

    def _replanning(self, stream: str, what: str,
                    attempt: Callable[[gcguard.CommitTicket], Commit]) -> Commit:
        """Runs attempt(ticket) until it does not raise gcguard.Replan (gc marked chunks it
        reused: it is planned again without them), at most layout.GC_COMMIT_ATTEMPTS times;
        then CommitConflict."""
        ticket = self.gc_guard.begin(self.index)
        for _ in range(layout.GC_COMMIT_ATTEMPTS):
            try:
                return attempt(ticket)
            except gcguard.Replan:
                ticket.replanned = True
                continue
        raise CommitConflict(f"stream {stream!r}: garbage collection kept marking chunks "
                             f"this {what} reused; nothing was committed; try again",
                             stream=stream)

    def _commit_once(self, stream: str, make_plans: PlanMaker, meta: Any, expect_head: Any,
                     on_stored: dict | None, pause: Callable[[], None] | None,
                     ticket: gcguard.CommitTicket) -> Commit:
        """One plan and commit of commit(); raises gcguard.Replan to be planned again."""
        in_flight = self._uploader.last_of(stream) if self._uploader else None
        if in_flight is None:
            ref = sync.pull_stream(self.client, self.index, stream)
        else:       # builds on a local commit whose ref write is still to come
            ref = refs.Ref(stream, in_flight.id, in_flight.seq)
        head = ref.head
        _check_expected_head(stream, head, expect_head)
        local = self._uploader is not None
        try:
            stored = self.store_chunks(stream, head, make_plans, on_stored, pause,
                                       wait=not local, until=self.intent_deadline(ticket))
        except CorruptionError:
            if in_flight is not None and self._in_flight_gone(in_flight):
                # the in-flight checkpoint this one builds on failed meanwhile, and the
                # background took it out of the cache (a pull of the stream): the head
                # moved under the plan, which is a conflict, not index damage
                raise CommitConflict(
                    f"stream {stream!r}: checkpoint {in_flight.id}, which this one was to "
                    "build on, failed to commit meanwhile; nothing was committed; try "
                    "again", stream=stream, expected=in_flight.id) from None
            raise
        self.gc_guard.check(self.index, self.log, self.backend, ticket, stored.new_chunks,
                            stored.reused)      # gc's mark: W1-W3, Replan
        commit = Commit(0, stream, head, time.time(), meta, stored.entries,
                        stored.new_chunks, seq=ref.seq + 1)
        count_bytes_new(commit, stored.bytes_new)
        if local:
            # durable in the local log (sealed and synced); the ref is written in the
            # background once the segments are uploaded
            self.create_checkpoint_object(commit, stored.reused, ticket.next_id)
            self._uploader.add(commit, stored.reused, head, stored.segments,
                               stored.fingerprints, ticket)
            return commit
        self.publish(ref, commit, stored.reused, stored.fingerprints, ticket=ticket)
        return commit

    def commit_manifests(self, stream: str, entries: list, read_chunks: ChunkSource,
                         meta: Any, *, created: float | None = None, tags: tuple = (),
                         expect_head: Any = ANY_HEAD) -> Commit:
        """Commits pre-made full manifests as the stream's next checkpoint (copy, savepoint
        import), as Committer.commit_manifests does: read_chunks(ids) is asked only for the
        chunks the bucket (as the cache knows it) lacks; they are checked against their ids,
        appended to this writer's log and uploaded; then the checkpoint is published like a
        commit() (its parent the stream's head; CommitConflict when that moved). Raises
        CorruptionError for a chunk that does not hash to its id or an extent past its
        chunk, before anything is committed."""
        layout.check_key_name(stream, "stream")
        with self._lock, io_errors("checkpoint import failed"):
            self.check_open(write=True)
            self.log.check_writable()
            if self._uploader is not None:
                self._uploader.wait_idle()
                self._uploader.raise_failure()
            return self._replanning(stream, "import", lambda ticket: self._commit_manifests_once(
                stream, entries, read_chunks, meta, created, tags, expect_head, ticket))

    def _commit_manifests_once(self, stream: str, entries: list, read_chunks: ChunkSource,
                               meta: Any, created: float | None, tags: tuple,
                               expect_head: Any, ticket: gcguard.CommitTicket) -> Commit:
        ref = sync.pull_stream(self.client, self.index, stream)
        _check_expected_head(stream, ref.head, expect_head)
        mark = self.log.position
        try:
            with self.index.read() as r:
                sink = wr.ChunkSink(self.log, r, self.options, unreusable=self._unreusable())
                wr.store_missing_chunks(sink, r, entries, read_chunks)
                new_chunks = sink.new_chunk_table()
                reused = self.reused_table(r, reused_chunks(entries, new_chunks))
            self.log.seal()
        except BaseException:
            self.log.rollback(mark)
            raise
        self.backend.wait_uploaded()
        self.gc_guard.check(self.index, self.log, self.backend, ticket, new_chunks, reused)
        commit = Commit(0, stream, ref.head, time.time() if created is None else created,
                        meta, entries, new_chunks, tags=sorted(tags), seq=ref.seq + 1)
        count_bytes_new(commit, sink.bytes_new)
        self.publish(ref, commit, reused, [], ticket=ticket)
        return commit

    def apply_ops(self, make_ops: Callable[[IndexView], list],
                  unless_tagged: frozenset = frozenset()) -> None:
        """Deletes and tags: make_ops(view) returns [(record type, checkpoint id,
        encode(order) -> payload parts)] (as for Committer.apply_ops). Each stream's ref is
        rewritten conditionally, re-read and re-applied when another writer changed it
        meanwhile (deletes and tags commute with other writers' commits, but for the deletes
        of unless_tagged, which a tag added meanwhile turns into a CommitConflict); atomic
        per stream. A tag of a checkpoint another writer deleted meanwhile is
        CheckpointNotFound."""
        with self._lock, io_errors("cannot update the store"):
            self.check_open(write=True)
            if self._uploader is not None:      # deletes and tags apply to the bucket's refs
                self._uploader.wait_idle()
                self._uploader.raise_failure()
            with self.index.read() as r:
                made = make_ops(r)
                by_stream: dict[str, list] = {}
                for rtype, cid, encode in made:
                    commit = r.checkpoint(cid)
                    if commit is None:
                        raise CheckpointNotFound(f"checkpoint {cid} not found")
                    payload = b"".join(bytes(p) for p in encode(0))
                    if rtype == fmt.REC_DELETE:
                        by_stream.setdefault(commit.stream, []).append(("delete", cid, None,
                                                                        None))
                    else:
                        _, tag, add, _, _ = records.decode_tag(payload)
                        by_stream.setdefault(commit.stream, []).append(("tag", cid, tag, add))
            for stream, ops in by_stream.items():
                self._update_ref(stream, ops, unless_tagged)

    def _update_ref(self, stream: str, ops: list, unless_tagged: frozenset = frozenset()) -> None:
        for _ in range(100):
            ref = refs.read(self.client, stream)
            live = list(ref.live)
            tags = {k: list(v) for k, v in ref.tags.items()}
            for kind, cid, tag, add in ops:
                if kind == "delete":
                    if cid in live:
                        if cid in unless_tagged:
                            tagged_meanwhile(cid, tags.get(cid))
                        live.remove(cid)
                        tags.pop(cid, None)
                elif cid in live:
                    have = set(tags.get(cid, []))
                    have.add(tag) if add else have.discard(tag)
                    tags[cid] = sorted(have)
                else:
                    raise CheckpointNotFound(f"checkpoint {cid} was deleted by another writer "
                                             f"before its tag {tag!r} could be "
                                             f"{'added' if add else 'removed'}")
            new = ref.advanced(self.writer_id, self.next_serial(),
                               head=live[-1] if live else None, live=live, tags=tags)
            try:
                new = refs.write(self.client, ref, new)
            except refs.RefMoved:
                continue
            fetched = sync.missing_checkpoints(self.client, self.index, new)
            with self.index.write() as w:
                sync.apply_ref(w, new, fetched)
            return
        raise CommitConflict(f"stream {stream!r} kept changing; try again", stream=stream)


def _lock_cache(path: str, *, exclusive: bool, timeout: float, url: str) -> int:
    """A descriptor of the cache directory's lock file, flock()ed shared (an open Store) or
    exclusively (a rebuild), waiting up to timeout seconds; StoreLocked after that."""
    fd = open_regular(os.path.join(path, layout.CACHE_LOCK_FILE), os.O_RDWR | os.O_CREAT,
                      0o600)
    started = time.monotonic()
    try:
        if flock_until(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH,
                       started + timeout) == FLOCK_TAKEN:
            return fd
        waited = time.monotonic() - started
        what = ("Stores of this machine have the cache open (close them)" if exclusive
                else "a repair of the cache is running")
        raise StoreLocked(f"{url}: {what}: the cache {path} is locked", path=url,
                          lock="writers" if exclusive else "store", waited=waited,
                          reason=f"{what}; waited {waited:.1f} s")
    except BaseException:
        os.close(fd)
        raise


def rebuild_cache(url: str, *, cache_dir: str | None = None,
                  remote_timeout: float = layout.DEFAULT_REMOTE_TIMEOUT,
                  progress: Callable[[int, int], None] | None = None,
                  timeout: float = 0.0) -> dict:
    """`snapstore repair` of an S3 store: the bucket is the truth and the local cache index
    only a cache of it, so its index is deleted and pulled again from the bucket (and the
    cached blocks dropped: a damaged one is never read again). Returns a report like a local
    repair's. Waits up to `timeout` seconds for the Stores that have this cache open (in any
    process of the machine) to close: StoreLocked after that."""
    started = time.monotonic()
    probe = RemoteCommitter(url, wr.WriteOptions(), durability="remote", readonly=True,
                            create=False, cache_dir=cache_dir, segment_size=1 << 20,
                            refresh=float("inf"), remote_timeout=remote_timeout)
    path = probe.cache_path
    probe.close()
    # every Store of this cache holds its lock shared: rebuilding the index under one would
    # hide its own commits from it (a local repair waits for every writer to close too)
    lock = _lock_cache(path, exclusive=True, timeout=timeout, url=url)
    try:
        for entry in (fmt.INDEX_DIR, layout.CACHE_RANGES_DIR):
            shutil.rmtree(os.path.join(path, entry), ignore_errors=True)
    finally:
        os.close(lock)
    store = RemoteCommitter(url, wr.WriteOptions(), durability="remote", readonly=True,
                            create=False, cache_dir=cache_dir, segment_size=1 << 20,
                            refresh=float("inf"), remote_timeout=remote_timeout)
    try:
        with store.index.read() as r:
            streams = r.streams()
            checkpoints = len(r.checkpoint_ids())
            chunks = sum(1 for _ in r.chunks())
    finally:
        store.close()
    if progress is not None:
        progress(1, 1)
    seconds = time.monotonic() - started
    return {"ok": True, "problems": [], "index_replaced": True,
            "checkpoints": checkpoints, "streams": len(streams),
            "chunks": chunks, "segments": 0, "bytes_scanned": 0, "records_replayed": 0,
            "state_section": None, "mb_per_s": 0.0, "cache": path,
            "seconds": round(seconds, 3),
            "rebuilt": "the local cache of an S3 store, pulled again from its bucket"}


def _segments_of(item: "_InFlight") -> list[int]:
    """The segments the chunks of an in-flight checkpoint lie in: its new chunks' and the
    ones it reuses (from earlier in-flight checkpoints, perhaps), and those it sealed."""
    numbers = set(item.segments)
    for table in (item.commit.new_chunks, item.reused):
        numbers.update(seg for _, seg, _, _, _, _ in fmt.NEW_CHUNK.iter_unpack(table))
    return sorted(numbers)


class _InFlight:
    """A checkpoint committed locally (durability "local") waiting for its ref write."""

    def __init__(self, commit: Commit, reused: bytes, parent: int | None, segments: list,
                 fingerprints: list, ticket) -> None:
        self.commit, self.reused, self.parent, self.ticket = commit, reused, parent, ticket
        self.segments, self.fingerprints = segments, fingerprints
        self.id, self.seq, self.stream = commit.id, commit.seq, commit.stream


class BackgroundUploads:
    """Durability "local": a checkpoint is visible in this process once its chunks are
    synced in the local log (the spool) and its checkpoint object exists; this thread waits
    for its segments' uploads, then writes its stream's ref (If-Match: the ref must still
    name the parent the checkpoint was made on), in commit order. A failure (an upload or a
    request that kept failing, or CommitConflict: another writer advanced the stream
    meanwhile) takes the checkpoint, and the later ones of its stream that build on it, out
    of this process's view, and is raised by the store's next call, flush() or close()."""

    def __init__(self, committer: RemoteCommitter) -> None:
        self.c = committer
        # A plain Lock (whose C-level __enter__ Ctrl-C cannot cut in half, unlike a
        # Condition's) and waits outside it (snapstore.wakeups): flush() and close() wait
        # here on the caller's thread.
        self._lock = threading.Lock()
        self._changed = WakeUps()       # waiters for the queue
        self._queue: list[_InFlight] = []
        self._busy = False
        self._stopping = False
        # (checkpoint id, stream, the failure) of every checkpoint acknowledged and then not
        # committed, not yet reported
        self._failures: list[tuple[int, str, BaseException]] = []
        self._thread = threading.Thread(target=self._run, name="snapstore-refs", daemon=True)
        self._thread.start()

    def add(self, commit: Commit, reused: bytes, parent: int | None, segments: list,
            fingerprints: list, ticket: "gcguard.CommitTicket | None" = None) -> None:
        item = _InFlight(commit, reused, parent, segments, fingerprints, ticket)
        # the promise the acknowledgement rests on: if this process dies, the next writer
        # open of the cache directory uploads the segments and writes the ref (spool.settle)
        spool.remember_pending(self.c.cache_path, self.c.log_number, {
            "stream": commit.stream, "id": commit.id, "parent": parent, "seq": commit.seq,
            "segments": segments, "writer": self.c.writer_id})
        with self.c.index.write() as w:
            sync.apply_checkpoint(w, commit, reused)
            w.put_stream(commit.stream, commit.id, max(commit.seq,
                                                       w.stream_seq(commit.stream)))
            for name, fps in fingerprints:
                w.put_fingerprints(commit.stream, name, commit.id, self.c.options.page_size,
                                   fps)
        with self._lock:
            self._queue.append(item)
            self._changed.notify_all()

    def last_of(self, stream: str) -> _InFlight | None:
        with self._lock:
            for item in reversed(self._queue):
                if item.stream == stream:
                    return item
        return None

    def streams(self) -> set:
        with self._lock:
            return {item.stream for item in self._queue}

    def wait_idle(self) -> None:
        """Waits until every queued checkpoint is committed or failed (Ctrl-C stops it)."""
        self._changed.wait_until(self._lock, lambda: not self._queue)

    def raise_failure(self) -> None:
        """Raises what failed since the last report, once: the first failure's exception (its
        class: RemoteError, CommitConflict...), its message naming every acknowledged
        checkpoint that was not committed, and its `lost` attribute listing them as (stream,
        id) pairs. (Raising only the first failure lost the report of the others.)"""
        with self._lock:
            failures, self._failures = self._failures, []
        if not failures:
            return
        _, _, first = failures[0]
        lines = [f"checkpoint {cid} of stream {stream!r}: {exc}" for cid, stream, exc in failures]
        message = (f"{len(failures)} checkpoint(s) acknowledged at durability 'local' were not "
                   "committed to the bucket, and are gone: " + "; ".join(lines))
        if isinstance(first, SnapstoreError):        # (anything else is a bug: as it is)
            first.args = (message,)
            if isinstance(first, StoreIOError):     # whose str() is its strerror
                first.strerror = message
            first.lost = [(stream, cid) for cid, stream, _ in failures]
        raise first

    def stop(self) -> None:
        self.wait_idle()
        with self._lock:
            self._stopping = True
            self._changed.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._queue and not self._stopping:
                    waiter, item = self._changed.register(), None
                elif not self._queue:
                    return
                else:
                    waiter, item = None, self._queue[0]
            if waiter is not None:
                self._changed.wait(waiter, self._lock)
                continue
            try:
                self._publish(item)
                failed = None
            except BaseException as exc:         # noqa: BLE001 - reported to the caller
                failed = exc
                with self._lock:
                    doomed = [item.id] + [i.id for i in self._queue
                                          if i.stream == item.stream and i is not item]
                self._forget(item.stream, doomed)   # before anyone sees the queue move on
            if failed is not None:      # reported to the caller: no replay after a crash
                spool.forget_pending(self.c.cache_path, self.c.log_number, item.id)
            with self._lock:
                self._queue.pop(0)
                dropped = []
                if failed is not None:
                    self._failures.append((item.id, item.stream, failed))
                    # later checkpoints of the stream build on this one: they fail too
                    dropped = [i for i in self._queue if i.stream == item.stream]
                    self._queue = [i for i in self._queue if i.stream != item.stream]
                    for later in dropped:
                        spool.forget_pending(self.c.cache_path, self.c.log_number, later.id)
                        self._failures.append((later.id, later.stream, CommitConflict(
                            f"it builds on checkpoint {item.id}, which was not committed",
                            stream=later.stream, expected=later.parent)))
                self._changed.notify_all()

    def _publish(self, item: _InFlight) -> None:
        with io_errors(f"checkpoint {item.id} of stream {item.stream!r} failed"):
            # the segments its chunks lie in, new and reused, must all be in the bucket
            # (another checkpoint's failure may have been reported already: asking for the
            # first failure alone let a checkpoint whose segment was never uploaded commit)
            self.c.backend.wait_uploaded(_segments_of(item))
            if item.ticket is not None:     # gc's grace: W3
                self.c.gc_guard.check_deadline(item.ticket)
            try:
                refs.advance(self.c.client, item.stream, item.id, item.parent, item.seq,
                             self.c.writer_id, self.c.next_serial())
            except refs.NotOnParent as moved:
                raise CommitConflict(
                    f"checkpoint {item.id} of stream {item.stream!r} was not committed: the "
                    f"stream's head in the bucket is {moved.current.head}, not {item.parent} "
                    "that it was made on (another writer committed meanwhile)",
                    stream=item.stream, expected=item.parent,
                    found=moved.current.head) from None
        spool.forget_pending(self.c.cache_path, self.c.log_number, item.id)

    def _forget(self, stream: str, failed: list) -> None:
        """After a failure: the stream as the bucket has it (the failed checkpoints go). When
        the bucket cannot be read now (the failure was the server's), the failed checkpoints
        (ids: the one that failed and those queued on it) are taken out of the cache here:
        the pull that would drop them later never comes for a stream that has no ref in the
        bucket (its first checkpoint failed), and this Store, and the next on the cache
        directory, listed and restored it as if it were in the bucket."""
        try:
            sync.pull_stream(self.c.client, self.c.index, stream)
            return
        except BaseException:       # noqa: BLE001 - the failure itself is what is reported
            pass
        with contextlib.suppress(BaseException), self.c.index.write() as w:
            for cid in sorted(failed, reverse=True):
                if w.checkpoint(cid) is not None:
                    w.apply_delete(cid, None)


def _check_expected_head(stream: str, head: int | None, expect_head: Any) -> None:
    """CommitConflict unless the stream's head is expect_head (ANY_HEAD: any)."""
    if expect_head is not ANY_HEAD and head != expect_head:
        raise CommitConflict(f"stream {stream!r}: its head is {head}, not the expected "
                             f"{expect_head}", stream=stream, expected=expect_head, found=head)
