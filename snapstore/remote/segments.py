"""RemoteSegments: the segment backend of an S3 store (the contract of
snapstore.engine.backends.base).

This writer's own log lives in local files (cache_dir/spool) while it is written; once the
log creates segment n + 1, segment n is sealed (the contract's rule) and uploaded in the
background as segments/<name> — the object is exactly the file's bytes. wait_uploaded()
waits for every upload begun so far and raises the first failure; once one upload has failed
for good, the uploads queued before that failure fail at once with the same error (the
commit they belong to fails anyway) instead of each retrying for remote_timeout. Uploads
queued after it try again: a commit could fail before it waited for its uploads (and so
before their failure was reported), and when the failure stayed until then, every later
upload failed without trying, with the server back, and checkpoints acknowledged at
durability "local" were lost. Every segment not uploaded is remembered, so wait_uploaded(segments), which a
checkpoint committed in the background (durability "local") asks for the segments its chunks
lie in, raises if any of those is not in the bucket, whoever else's failure was reported
first. After its upload a
segment moves into the block cache as a whole segment. Every other segment (other writers',
earlier sessions') is read by range from the bucket through the block cache
(cache.BlockCache).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

from snapstore.engine.backends.base import (SegmentBackend, SegmentFile, SegmentReader,
                                            missing_segment, segment_name)
from snapstore.engine.backends.local import LocalSegments
from snapstore.remote import layout
from snapstore.remote.cache import BlockCache
from snapstore.errors import RemoteError
from snapstore.remote.s3client import NotFound, S3Client

UPLOAD_THREADS = 2


class _Reader(SegmentReader):
    def __init__(self, backend: "RemoteSegments") -> None:
        self._backend = backend
        self._local = backend.spool.open_reader()
        self._closed = False

    def read(self, number: int, offset: int, length: int) -> bytes:
        return self._from(number, lambda source: source.read(number, offset, length))

    def read_into(self, number: int, offset: int, buf) -> int:
        return self._from(number, lambda source: source.read_into(number, offset, buf))

    def read_pieces(self, number: int, offset: int, buf):
        """Views of the block cache's memory where it holds the bytes (BlockCache.read_pieces);
        a segment of this writer's spool is read into buf (the contract's default)."""
        if self._closed:
            raise ValueError("read session is closed")
        if number in self._backend.spooled():
            return super().read_pieces(number, offset, buf)
        return self._backend.cache.read_pieces(number, offset, buf)

    def _from(self, number: int, read):
        """read(source): from the spool while segment `number` is this writer's own and not
        uploaded yet (an upload that ends meanwhile moves it: then from the cache), else
        from the block cache."""
        if self._closed:
            raise ValueError("read session is closed")
        b = self._backend
        if number in b.spooled():
            try:
                return read(self._local)
            except Exception:
                if number in b.spooled():
                    raise
        return read(b.cache)

    def prefetch(self, ranges) -> None:
        """Fetches the cache blocks of (segment, offset, length) ranges in parallel."""
        spooled = self._backend.spooled()
        self._backend.cache.prefetch(r for r in ranges if r[0] not in spooled)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._local.close()


class RemoteSegments(SegmentBackend):
    """Segments of an S3 store: the own log spooled locally and uploaded when sealed; all
    segments readable by range."""

    def __init__(self, client: S3Client, spool_dir: str, cache_dir: str, *, durable: bool,
                 file_mode: int = 0o600) -> None:
        self.client = client
        self.spool_dir = spool_dir
        os.makedirs(spool_dir, mode=0o700, exist_ok=True)
        self.spool = LocalSegments(spool_dir, durable=durable, file_mode=file_mode)
        self.cache = BlockCache(cache_dir, self._fetch, file_mode)
        self._lock = threading.Lock()
        self._spooled: set[int] = set()      # own segments still in the spool
        self._uploads: dict[int, Future] = {}
        self._failure: BaseException | None = None    # of the uploads begun so far
        self._queued = 0                    # uploads queued so far (each one's number)
        self._failed_before = 0             # uploads queued up to this one fail with _failure
        self._not_uploaded: dict[int, BaseException] = {}     # segment -> why (for good)
        self._pool: ThreadPoolExecutor | None = None
        self.uploaded_bytes = 0
        self.failed_uploads = 0                        # uploads that failed for good

    def _fetch(self, number: int, offset: int, length: int, consume):
        try:
            return self.client.get_into(layout.segment_key(number), offset, length, consume)
        except NotFound:
            raise missing_segment(number) from None

    def spooled(self) -> set[int]:
        with self._lock:
            return set(self._spooled)

    def never_uploaded(self) -> frozenset:
        """This Store's segments whose upload failed for good: a checkpoint must not reuse
        their chunks (it could never commit: its chunks would be in no bucket object)."""
        with self._lock:
            return frozenset(self._not_uploaded)

    # ---- the contract -------------------------------------------------------------------
    @property
    def durable(self) -> bool:
        return self.spool.durable

    def list(self) -> list[int]:
        """The segments in the bucket and in this writer's spool (a LIST of the bucket: for
        stats, verify and the log's own tail; reads find segments through the index)."""
        numbers = set(self.spooled())
        for obj in self.client.list(layout.SEGMENTS_DIR):
            number = layout.segment_of(obj.key)
            if number is not None:
                numbers.add(number)
        return sorted(numbers)

    def size(self, number: int) -> int:
        if number in self.spooled():
            return self.spool.size(number)
        info = self.client.head(layout.segment_key(number))
        if info is None:
            raise FileNotFoundError(f"segment {segment_name(number)} is not in the bucket")
        return info.size

    def open_reader(self) -> _Reader:
        return _Reader(self)

    def create(self, number: int) -> SegmentFile:
        f = self.spool.create(number)
        with self._lock:
            self._spooled.add(number)
            sealed = number - 1 in self._spooled and number - 1 not in self._uploads
        if sealed:
            self._upload(number - 1)
        return f

    def open_append(self, number: int) -> SegmentFile:
        f = self.spool.open_append(number)
        with self._lock:
            self._spooled.add(number)
        return f

    def remove(self, number: int) -> None:
        with self._lock:
            future = self._uploads.pop(number, None)
            self._spooled.discard(number)
        if future is not None:
            future.cancel()
        self.spool.remove(number)

    def forget_cached(self, number: int) -> bool:
        """A segment read from the block cache whose records failed their checksums: its
        cached blocks are dropped, so the next read fetches them from the bucket again (a
        spooled segment, this writer's own not yet uploaded, has no other copy: False)."""
        if number in self.spooled():
            return False
        self.cache.drop(number)
        return True

    def sync_directory(self) -> None:
        self.spool.sync_directory()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.cache.close()
        self.spool.close()

    # ---- uploads ------------------------------------------------------------------------
    def _upload(self, number: int) -> None:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(UPLOAD_THREADS, "snapstore-upload")
            self._queued += 1
            self._uploads[number] = self._pool.submit(self._upload_one, number, self._queued)

    def _upload_one(self, number: int, queued: int) -> None:
        with self._lock:
            failure = self._failure if queued <= self._failed_before else None
            if failure is not None:
                self._not_uploaded[number] = failure
        if failure is not None:
            raise failure
        path = os.path.join(self.spool_dir, segment_name(number))
        try:
            self.client.upload_file(layout.segment_key(number), path)
        except BaseException as exc:
            with self._lock:
                self._failure = self._failure or exc
                self._failed_before = self._queued      # the backlog fails at once
                self._not_uploaded[number] = exc
                self.failed_uploads += 1
            raise
        size = os.path.getsize(path)
        with self._lock:
            self.uploaded_bytes += size
            if number not in self._spooled:
                return          # removed meanwhile: the object is garbage for gc
            self._spooled.discard(number)
        self.cache.adopt(number, path)

    def wait_uploaded(self, segments=None) -> None:
        """Waits for every upload begun so far; raises the first that failed (RemoteError),
        forgetting it (the segment stays in the spool, never referenced; the next open of
        the cache directory removes it: remote/spool.py).

        segments: only these matter (the segments a checkpoint's chunks lie in): raises the
        reason one of them is not in the bucket (then forgetting the first failure, as
        above), else nothing, even if other uploads failed."""
        with self._lock:
            pending = list(self._uploads.items())
        for number, future in pending:
            try:
                future.result()
            except Exception:                 # noqa: BLE001 - reported below (Ctrl-C: raised)
                pass
            with self._lock:
                if self._uploads.get(number) is future:
                    del self._uploads[number]
        with self._lock:
            if segments is not None:
                # an upload that succeeded took its segment out of the spool
                missing = [self._not_uploaded.get(n) or RemoteError(
                    f"segment {segment_name(n)} was never uploaded", operation="upload",
                    key=layout.segment_key(n)) for n in segments
                    if n in self._not_uploaded or n in self._spooled]
                if not missing:
                    return
                self._failure = None
                error = missing[0]
            else:
                error, self._failure = self._failure, None
        if error is not None:
            raise error

    def upload_now(self, number: int) -> None:
        """Starts the upload of sealed segment `number` unless it has begun."""
        with self._lock:
            begun = number in self._uploads or number not in self._spooled
        if not begun:
            self._upload(number)
