"""RemoteCommitter: the engine side of an S3 store, with the interface the Store uses of a
Committer (commit, apply_ops, read, check_open, exclusive, maintenance, close).

Opening: the bucket's snapstore.json (created if absent and allowed), the local cache (its
LMDB index; wiped when it belongs to another store of the same URL), a log number of its own
(logs/<L>, created If-None-Match: *; a writer), and a pull of every stream.

Commit (docs/design.md, "S3 stores"): pull the stream (its ref and etag), plan and store
the chunks into this writer's log (local segments, each uploaded when sealed), seal and
await the uploads, create the checkpoint object (If-None-Match: * allocates the id), write
the ref If-Match (the commit point), apply locally. A lost ref race is CommitConflict.

Locking: one RLock per committer serialises its operations (as the Committer's writer lock);
between writers, processes and machines nothing is held: the ref's conditional write
decides.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from snapstore.engine import format as fmt
from snapstore.engine import records
from snapstore.engine import writer as wr
from snapstore.engine.commit import ANY_HEAD, PlanMaker, count_bytes_new, io_errors, \
    reused_chunks, store_plans
from snapstore.engine.index import Index, IndexView
from snapstore.engine.records import Commit
from snapstore.engine.wal import SegmentLog
from snapstore.errors import (CheckpointNotFound, CommitConflict, CorruptionError,
                              ForkedStoreError, FormatError, InvalidArgumentError,
                              ReadOnlyError, SnapstoreError, StoreClosedError)
from snapstore.remote import checkpoints as ckpt_objects
from snapstore.remote import gcguard, layout, refs, sync
from snapstore.remote.s3client import NotFound, PreconditionFailed, S3Client
from snapstore.remote.segments import RemoteSegments

DURABILITY_MODES = layout.DURABILITY_MODES
_ID_PROBES = 64             # ids tried one after another before listing for the newest
_IDENTITY_FILE = "store.json"


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
        self.log: SegmentLog | None = None
        self.log_number: int | None = None
        self.writer_id = uuid.uuid4().hex
        self._serial = 0
        self._lock = threading.RLock()
        self._staging: bytearray | None = None
        self._closed = False
        self._pid = os.getpid()
        self._pulled_at = -float("inf")
        try:
            self.client = S3Client(self.url, timeout=remote_timeout)
            self.gc_guard = gcguard.Guard(self.client)
            identity = self._open_bucket(create and not readonly)
            root = cache_dir if cache_dir is not None else layout.default_cache_root()
            self.cache_path = layout.cache_dir_for(os.path.abspath(os.fspath(root)),
                                                   self.client.endpoint, self.url)
            self._open_cache(identity)
            self.index = Index(os.path.join(self.cache_path, fmt.INDEX_DIR), readonly=False,
                               durable=False)
            self.backend = RemoteSegments(self.client, os.path.join(self.cache_path, "spool"),
                                          os.path.join(self.cache_path, "ranges"),
                                          durable=durability == "local")
            if not readonly:
                self.log_number = self._take_log()
                self.log = SegmentLog(self.backend, segment_size, self.log_number)
                self.log.open_tail()
            with io_errors(f"cannot read {url}"):
                self._pull_all()
        except BaseException:
            self._release()
            raise

    # ---- opening ----------------------------------------------------------------------------
    def _open_bucket(self, create: bool) -> dict:
        """The bucket's snapstore.json (created when absent and allowed); returns it."""
        key = layout.FORMAT_KEY
        for _ in range(3):
            try:
                data, _ = self.client.get(key)
            except NotFound:
                if not create:
                    raise FormatError(f"{self.path} is not a snapstore store (no {key}); "
                                      "open it with create=True to make one") from None
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
            for entry in ("index", "ranges", "spool"):
                shutil.rmtree(os.path.join(self.cache_path, entry), ignore_errors=True)
            tmp = f"{name}.{os.getpid()}.part"
            with open(tmp, "w") as f:
                json.dump({"url": str(self.url), "uuid": identity.get("uuid")}, f)
            os.replace(tmp, name)
        os.makedirs(os.path.join(self.cache_path, fmt.INDEX_DIR), mode=0o700, exist_ok=True)

    def _take_log(self) -> int:
        """A log number of this writer's own: logs/<L> created If-None-Match: *."""
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
                return number
            except PreconditionFailed:
                number += 1

    # ---- state ----------------------------------------------------------------------------
    def _release(self) -> None:
        if self.log is not None:
            self.log.close()
            self.log = None
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        if self.index is not None:
            self.index.close()
            self.index = None

    def close(self) -> None:
        """Waits for the operation in progress and for uploads, then closes. Idempotent."""
        if self.forked:
            self._closed = True
            return
        with self._lock:
            if not self._closed:
                self._closed = True
                try:
                    if self.backend is not None and self.log is not None:
                        with contextlib.suppress(SnapstoreError):
                            self.backend.wait_uploaded()
                finally:
                    self._release()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def forked(self) -> bool:
        return self._pid != os.getpid()

    def after_fork_in_child(self) -> None:
        self._lock = threading.RLock()

    def check_open(self, write: bool = False) -> None:
        if self.forked and not self._closed:
            raise ForkedStoreError(
                f"store {self.path} was opened by process {self._pid}; this process "
                f"({os.getpid()}) is a fork()ed child of it and must not use that Store: open "
                "the store again in the child (snapstore.open(url))")
        if self._closed or self.index is None:
            raise StoreClosedError(f"store {self.path} is closed")
        if write and self.readonly:
            raise ReadOnlyError(f"store {self.path} was opened read-only")

    def _pull_all(self) -> None:
        sync.pull_all(self.client, self.index)
        self.gc_guard.follow(self.index)        # the cache follows gc's mark
        self._pulled_at = time.monotonic()

    def refresh(self) -> None:
        """Pulls every stream of the bucket into the cache now."""
        self.check_open()
        with io_errors(f"cannot read {self.path}"):
            self._pull_all()

    def read(self) -> "contextlib.AbstractContextManager[IndexView]":
        """A snapshot of the cache index, pulled from the bucket first when the last pull is
        more than `refresh` seconds old."""
        self.check_open()
        if time.monotonic() - self._pulled_at > self.refresh_seconds:
            with io_errors(f"cannot read {self.path}"):
                self._pull_all()
        return self.index.read()

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
    def _next_serial(self) -> int:
        self._serial += 1
        return self._serial

    def _create_checkpoint_object(self, commit: Commit, reused: bytes, floor: int) -> None:
        """Creates checkpoints/<id> If-None-Match: *, for the first free id >= floor; sets
        commit.id."""
        candidate = floor
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

    def _reused_table(self, view: IndexView, pins: bytes) -> bytes:
        out = []
        for i in range(0, len(pins), fmt.CHUNK_ID_BYTES):
            cid = pins[i:i + fmt.CHUNK_ID_BYTES]
            entry = view.chunk(cid)
            if entry is None:
                raise CorruptionError(f"{self.path}: chunk {cid.hex()} vanished from the "
                                      "cache index")
            out.append(fmt.NEW_CHUNK.pack(cid, entry.segment, entry.offset, entry.stored_len,
                                          entry.raw_len, entry.codec))
        return b"".join(out)

    def commit(self, stream: str, make_plans: PlanMaker, meta: Any, *,
               expect_head: Any = ANY_HEAD, on_stored: dict | None = None,
               pause: Callable[[], None] | None = None) -> Commit:
        """Stores planned buffers as the stream's next checkpoint and commits it in the
        bucket (see the module docstring); returns the Commit. Raises CommitConflict when
        the stream's head moved (or is not expect_head), RemoteError, StoreIOError."""
        with self._lock, io_errors("checkpoint failed"):
            self.check_open(write=True)
            self.log.check_writable()
            if self._staging is None:
                self._staging = bytearray(wr.STAGING_BYTES)
            ticket = self.gc_guard.begin(self.index)
            for _ in range(layout.GC_COMMIT_ATTEMPTS):
                try:
                    return self._commit_once(stream, make_plans, meta, expect_head,
                                             on_stored, pause, ticket)
                except gcguard.Replan:
                    continue        # gc marked chunks it reused: planned again without them
            raise CommitConflict(f"stream {stream!r}: garbage collection kept marking chunks "
                                 "this checkpoint reused; nothing was committed; try again",
                                 stream=stream)

    def _commit_once(self, stream: str, make_plans: PlanMaker, meta: Any, expect_head: Any,
                     on_stored: dict | None, pause: Callable[[], None] | None,
                     ticket: gcguard.CommitTicket) -> Commit:
        """One plan and commit of commit(); raises gcguard.Replan to be planned again."""
        ref = sync.pull_stream(self.client, self.index, stream)
        head = ref.head
        if expect_head is not ANY_HEAD and head != expect_head:
            raise CommitConflict(f"stream {stream!r}: its head is {head}, not the expected "
                                 f"{expect_head}", stream=stream, expected=expect_head,
                                 found=head)
        mark = self.log.position
        try:
            with self.index.read() as r:
                sink = wr.ChunkSink(self.log, r, self.options, pause)
                entries, fingerprints = store_plans(r, stream, head, make_plans, sink,
                                                    self._staging, on_stored)
                new_chunks = sink.new_chunk_table()
                reused = self._reused_table(r, reused_chunks(entries, new_chunks))
                next_id = r.next_id()
            self.log.seal()
        except BaseException:
            self.log.rollback(mark)
            raise
        self.backend.wait_uploaded()
        self.gc_guard.check(self.index, self.log, self.backend, ticket, new_chunks,
                            reused)                 # gc's mark: W1-W3, Replan
        commit = Commit(0, stream, head, time.time(), meta, entries, new_chunks,
                        seq=ref.seq + 1)
        count_bytes_new(commit, sink.bytes_new)
        self._create_checkpoint_object(commit, reused,
                                       max(next_id, (head or 0) + 1, ticket.next_id))
        new_ref = ref.advanced(self.writer_id, self._next_serial(), head=commit.id,
                               seq=commit.seq, live=ref.live + [commit.id])
        self.gc_guard.check_deadline(ticket)
        try:
            new_ref = refs.write(self.client, ref, new_ref)
        except refs.RefMoved as moved:
            raise CommitConflict(
                f"stream {stream!r} moved while this checkpoint was made (head "
                f"{moved.current.head}, not {head}): nothing was committed; read the "
                "new head and retry", stream=stream, expected=head,
                found=moved.current.head) from None
        with self.index.write() as w:
            sync.apply_ref(w, new_ref, {commit.id: (commit, reused)})
            for name, fps in fingerprints:
                w.put_fingerprints(stream, name, commit.id, self.options.page_size, fps)
        return commit

    def apply_ops(self, make_ops: Callable[[IndexView], list]) -> None:
        """Deletes and tags: make_ops(view) returns [(record type, checkpoint id,
        encode(order) -> payload parts)] (as for Committer.apply_ops). Each stream's ref is
        rewritten conditionally, re-read and re-applied when another writer changed it
        meanwhile (deletes and tags commute with other writers' commits); atomic per
        stream."""
        with self._lock, io_errors("cannot update the store"):
            self.check_open(write=True)
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
                self._update_ref(stream, ops)

    def _update_ref(self, stream: str, ops: list) -> None:
        for _ in range(100):
            ref = refs.read(self.client, stream)
            live = list(ref.live)
            tags = {k: list(v) for k, v in ref.tags.items()}
            for kind, cid, tag, add in ops:
                if kind == "delete":
                    if cid in live:
                        live.remove(cid)
                        tags.pop(cid, None)
                elif cid in live:
                    have = set(tags.get(cid, []))
                    have.add(tag) if add else have.discard(tag)
                    tags[cid] = sorted(have)
            new = ref.advanced(self.writer_id, self._next_serial(),
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
