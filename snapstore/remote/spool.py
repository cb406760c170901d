"""Writer sessions of a cache directory, and what becomes of a session's spool once the
session is gone (docs/design.md, "S3 stores": "A writer killed mid-commit").

    cache/<store>/writers/<L>   the lock file of the writer session of log L: flock()ed
                                exclusively while the session is open; it holds the session's
                                record (JSON: the store's uuid, the durability, the writer id,
                                the pid), read only by whoever settles the session
    cache/<store>/spool/        the sessions' own segments until uploaded (a segment's number
                                names its log: wal.log_of)

The flock is the whole truth: a lock that can be taken belongs to a session that is gone
(closed, or killed). Log numbers are never reused (logs/<L> in the bucket is created
If-None-Match: *), so a gone session's lock file and spool files serve nobody once settled,
and are removed. A writer's open settles every gone session of its cache directory
(settle_sessions), holding the session's lock while it does: two openers never settle the
same session at once, and a live session is never touched. settle() is the one place that
decides what becomes of a gone session's spool.

A lock file may be removed by a settler between a new session's open() and its flock(): the
new session then holds a lock on a file no longer in the directory, so Session.take checks
that the path still names the file it locked, and tries again when it does not.
"""
from __future__ import annotations

import fcntl
import json
import os
import warnings

from snapstore.engine import format as fmt
from snapstore.engine.backends.base import segment_name, segment_number
from snapstore.engine.fsutil import DEFAULT_FILE_MODE, fsync_directory, open_regular, try_flock
from snapstore.engine.logowners import log_number
from snapstore.engine.wal import log_of
from snapstore.errors import RemoteError
from snapstore.remote import gcmark, layout, refs
from snapstore.remote.s3client import S3Client

WRITERS_DIR = "writers"
SPOOL_DIR = "spool"
_RECORD_BYTES = 512


def spool_dir(cache_path: str) -> str:
    return os.path.join(cache_path, SPOOL_DIR)


def _lock_path(cache_path: str, log: int) -> str:
    return os.path.join(cache_path, WRITERS_DIR, str(log))


def _try_lock(path: str) -> int | None:
    """A descriptor of `path` (created if missing) locked exclusively, or None when another
    session holds it or the file was replaced meanwhile."""
    fd = open_regular(path, os.O_RDWR | os.O_CREAT, DEFAULT_FILE_MODE)
    try:
        if not try_flock(fd, fcntl.LOCK_EX):
            os.close(fd)
            return None
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:            # removed by a settler after our open(): not the lock
            os.close(fd)
            return None
        return fd
    except BaseException:
        os.close(fd)
        raise


def _read_record(fd: int) -> dict:
    try:
        record = json.loads(os.pread(fd, _RECORD_BYTES, 0))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def spooled_segments(cache_path: str, log: int) -> list[int]:
    """The numbers of log `log`'s segments in the spool, ascending."""
    out = []
    try:
        with os.scandir(spool_dir(cache_path)) as entries:
            for entry in entries:
                number = segment_number(entry.name)
                if number is not None and log_of(number) == log:
                    out.append(number)
    except FileNotFoundError:
        pass
    return sorted(out)


def _remove_spooled(cache_path: str, log: int) -> None:
    for number in spooled_segments(cache_path, log):
        try:
            os.unlink(os.path.join(spool_dir(cache_path), segment_name(number)))
        except FileNotFoundError:
            pass
    for entry in pending(cache_path, log):
        forget_pending(cache_path, log, entry["id"])


class Session:
    """The lock of an open writer session (log `log`) in a cache directory."""

    def __init__(self, cache_path: str, log: int, fd: int) -> None:
        self.cache_path = cache_path
        self.log = log
        self._fd: int | None = fd

    @classmethod
    def take(cls, cache_path: str, log: int, record: dict) -> "Session | None":
        """The session of log `log` (a log new in the bucket), its record written; None when
        the lock is held (a live session of this cache directory uses the same number: a
        store of this URL deleted and made again while it ran; take another log). Raises
        OSError."""
        os.makedirs(os.path.join(cache_path, WRITERS_DIR), mode=0o700, exist_ok=True)
        for _ in range(3):
            fd = _try_lock(_lock_path(cache_path, log))
            if fd is not None:
                try:
                    body = json.dumps(record).encode()
                    os.pwrite(fd, body.ljust(max(len(body), _RECORD_BYTES)), 0)
                    os.ftruncate(fd, max(len(body), _RECORD_BYTES))
                except BaseException:
                    os.close(fd)
                    raise
                return cls(cache_path, log, fd)
            if not os.path.exists(_lock_path(cache_path, log)):
                continue            # removed by a settler between our open and flock
            return None
        return None

    def close(self, *, clean: bool) -> None:
        """Ends the session. clean (every upload of the session landed, none is left): its
        spool files and lock file are removed now; otherwise they stay for the next open of
        the cache directory to settle (settle_sessions). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if clean:
                _remove_spooled(self.cache_path, self.log)
                try:
                    os.unlink(_lock_path(self.cache_path, self.log))
                except FileNotFoundError:
                    pass
        finally:
            os.close(fd)

    def forget(self) -> None:
        """In a fork()ed child: closes the child's copy of the lock without letting go of the
        parent's (a flock belongs to the open file description both share)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _sessions(cache_path: str) -> list[int]:
    """The logs that have a lock file or spool files in the cache directory."""
    logs = set()
    try:
        names = os.listdir(os.path.join(cache_path, WRITERS_DIR))
        logs.update(log for log in map(log_number, names) if log is not None)
    except FileNotFoundError:
        pass
    try:
        for name in os.listdir(spool_dir(cache_path)):
            number = segment_number(name)
            if number is not None:
                logs.add(log_of(number))
            elif name.endswith(PENDING_SUFFIX):         # _pending_path: LOG.ID.pending
                log = log_number(name.partition(".")[0])
                if log is not None:
                    logs.add(log)
    except FileNotFoundError:
        pass
    return sorted(logs)


def settle_sessions(client: S3Client, cache_path: str, store_uuid: str | None) -> list[int]:
    """Settles every gone writer session of the cache directory (settle()), each under its
    lock, then removes its lock file. A session whose settling fails on S3 (RemoteError)
    stays as it is for the next open to try again. Returns the logs settled."""
    settled = []
    for log in _sessions(cache_path):
        path = _lock_path(cache_path, log)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = _try_lock(path)
        if fd is None:
            continue                    # a live session
        try:
            try:
                settle(client, cache_path, log, _read_record(fd), store_uuid)
            except RemoteError:
                continue
            os.unlink(path)
            settled.append(log)
        finally:
            os.close(fd)
    return settled


PENDING_SUFFIX = ".pending"


def _pending_path(cache_path: str, log: int, checkpoint_id: int) -> str:
    return os.path.join(spool_dir(cache_path), f"{log}.{checkpoint_id:020d}{PENDING_SUFFIX}")


def remember_pending(cache_path: str, log: int, entry: dict) -> None:
    """Durability "local": records, durably (written, fsynced with its directory), a
    checkpoint acknowledged before its ref write: {"stream", "id", "parent", "seq",
    "segments", "writer"}. Its segments are synced in the spool and its checkpoint object
    exists. Raises OSError."""
    path = _pending_path(cache_path, log, entry["id"])
    tmp = path + ".part"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, DEFAULT_FILE_MODE)
    try:
        os.write(fd, json.dumps(entry).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_directory(spool_dir(cache_path))


def forget_pending(cache_path: str, log: int, checkpoint_id: int) -> None:
    """The checkpoint's ref write is done, or its failure was reported to its writer.

    Never raises: it runs on the ref committer's thread, after the outcome is decided. A
    pending file that cannot be removed (EIO, a read-only remount) is reported with a
    RuntimeWarning and left; the next open replays it, which finds a committed checkpoint
    committed already, and commits a reported failure only if its stream's head is still
    its parent."""
    path = _pending_path(cache_path, log, checkpoint_id)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        warnings.warn(f"snapstore: could not remove the spool's record {path!r} of checkpoint "
                      f"{checkpoint_id} ({exc}); the next open of this cache directory "
                      "replays it", RuntimeWarning, stacklevel=2)


def pending(cache_path: str, log: int) -> list[dict]:
    """The checkpoints of log `log` acknowledged locally and not yet committed, by id."""
    out = []
    prefix = f"{log}."
    try:
        names = sorted(n for n in os.listdir(spool_dir(cache_path))
                       if n.startswith(prefix) and n.endswith(PENDING_SUFFIX))
    except FileNotFoundError:
        return []
    for name in names:
        try:
            with open(os.path.join(spool_dir(cache_path), name)) as f:
                out.append(json.load(f))
        except (OSError, ValueError):
            continue            # torn before its rename: never acknowledged
    return out


def replay(client: S3Client, cache_path: str, log: int) -> list[dict]:
    """Finishes what a gone durability "local" session acknowledged: for each pending
    checkpoint, in id order, uploads its segments still in the spool (the same bytes again
    if an upload had landed) and writes its stream's ref if the head is still its parent.
    One whose stream moved meanwhile cannot be committed any more: it is reported (a
    RuntimeWarning naming it) and dropped with the rest of the stream's pending ones.
    Returns those. Raises RemoteError (all stays as it is for the next open)."""
    lost, failed_streams = [], set()
    entries = pending(cache_path, log)
    mark = gcmark.read(client) if entries else None
    marked = mark.segments if mark is not None else frozenset()
    for entry in entries:
        stream = entry["stream"]
        if set(entry.get("segments", [])) & marked:
            # gc marked what it uploaded (the writer died long ago): gc may delete it,
            # so it can never be committed
            failed_streams.add(stream)
            warnings.warn(
                f"snapstore: checkpoint {entry['id']} of stream {stream!r}, acknowledged "
                "with durability='local' by a writer that died before committing it, "
                "cannot be committed: garbage collection marked its segments meanwhile",
                RuntimeWarning, stacklevel=2)
        if stream not in failed_streams:
            for number in entry.get("segments", []):
                path = os.path.join(spool_dir(cache_path), segment_name(number))
                if os.path.exists(path):
                    client.upload_file(layout.segment_key(number), path)
            try:
                refs.advance(client, stream, entry["id"], entry["parent"], entry["seq"],
                             entry.get("writer", ""), 1 << 40 | entry["id"])
                forget_pending(cache_path, log, entry["id"])
                continue
            except refs.NotOnParent as moved:
                failed_streams.add(stream)
                warnings.warn(
                    f"snapstore: checkpoint {entry['id']} of stream {stream!r}, acknowledged "
                    f"with durability='local' by a writer that died before committing it, "
                    f"cannot be committed: the stream's head moved to {moved.current.head} "
                    "meanwhile", RuntimeWarning, stacklevel=2)
        lost.append(entry)
        forget_pending(cache_path, log, entry["id"])
    return lost


def settle(client: S3Client, cache_path: str, log: int, record: dict,
           store_uuid: str | None) -> None:
    """What becomes of the spool of the gone writer session of log `log` (record: what its
    lock file says of it; {} when it died before writing it). The one place that decides.

    Durability "remote": a checkpoint is acknowledged only once its ref write landed, and
    its segments were uploaded before; so nothing in a gone session's spool is needed:
    discard it. Durability "local" acknowledges once the checkpoint is synced in the spool
    (remember_pending): those are replayed first (replay), then the rest is discarded."""
    same_store = record.get("store") == store_uuid and store_uuid is not None
    if same_store:
        replay(client, cache_path, log)
    discard(client, cache_path, log, same_store=same_store)


def discard(client: S3Client, cache_path: str, log: int, *, same_store: bool) -> None:
    """Aborts the incomplete multipart uploads of log `log`'s segment keys (only in the store
    the session wrote to: a store of this URL made again reuses log numbers), then removes
    its spool files. Raises RemoteError (nothing removed then)."""
    if same_store:
        client.abort_uploads(layout.log_segments_prefix(log))
    _remove_spooled(cache_path, log)
