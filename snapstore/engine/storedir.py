"""The store directory: its FORMAT file, refusing foreign directories, and the writer's lock.

    STORE/FORMAT     JSON {"format": "snapstore", "version": N, "created": t}, published by temp
                     file + fsync + rename + directory fsync
    STORE/lock       flock()ed exclusively by the one writer
    STORE/index/     LMDB        STORE/segments/   the log
"""
from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import tempfile
import time

from snapstore.engine import format as fmt
from snapstore.errors import FormatError, StoreLocked
from snapstore.engine.fsutil import fsync_directory


def open_directory(path: str, *, create: bool, readonly: bool, timeout: float) -> int | None:
    """Checks (or creates) the store directory; for a writer takes the lock and returns its
    descriptor (closed again if anything after it fails). Raises FormatError, StoreLocked."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise FormatError(f"{path} is not a directory, so not a snapstore store")
    if not os.path.isdir(path):
        if readonly or not create:
            raise FormatError(f"no snapstore store at {path}")
        os.makedirs(path, exist_ok=True)
    refuse_foreign_directory(path)          # before the lock file: leave nothing in one
    lock_fd = None if readonly else take_lock(path, timeout)
    try:
        if not os.path.exists(os.path.join(path, fmt.FORMAT_FILE)):
            if readonly or not create:
                raise FormatError(f"{path} is not a snapstore store (no {fmt.FORMAT_FILE} file)")
            refuse_foreign_directory(path)  # again under the lock: creation races
            os.makedirs(os.path.join(path, fmt.SEGMENTS_DIR), exist_ok=True)
            os.makedirs(os.path.join(path, fmt.INDEX_DIR), exist_ok=True)
            write_format_file(path)
        read_format_file(path)
    except BaseException:
        if lock_fd is not None:
            os.close(lock_fd)
        raise
    return lock_fd


def refuse_foreign_directory(path: str) -> None:
    """A directory without FORMAT may only hold what a store being created holds."""
    if os.path.exists(os.path.join(path, fmt.FORMAT_FILE)):
        return
    ours = {fmt.LOCK_FILE, fmt.INDEX_DIR, fmt.SEGMENTS_DIR}
    if any(n not in ours and not n.startswith(".FORMAT.") for n in os.listdir(path)):
        raise FormatError(f"{path} is a non-empty directory that is not a snapstore store")


def take_lock(path: str, timeout: float) -> int:
    """The writer's exclusive flock on STORE/lock, waiting up to timeout seconds."""
    fd = os.open(os.path.join(path, fmt.LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                 0o644)
    deadline = time.monotonic() + max(0.0, float(timeout))
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(fd)
                raise
        if time.monotonic() >= deadline:
            os.close(fd)
            raise StoreLocked(f"{path} is locked: another process or store object has it open "
                              f"for writing (waited {timeout}s); open it with readonly=True to "
                              "read meanwhile, or pass timeout=")
        time.sleep(0.05)


def write_format_file(path: str, created: float | None = None) -> None:
    """Publishes the FORMAT file atomically: temp file, fsync, rename, directory fsync."""
    body = json.dumps({"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION,
                       "created": time.time() if created is None else created}).encode()
    fd, tmp = tempfile.mkstemp(dir=path, prefix=".FORMAT.")
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(path, fmt.FORMAT_FILE))
    fsync_directory(path)


def read_format_file(path: str) -> dict:
    """The FORMAT file's contents, checked: FormatError unless a snapstore store of a version
    this library reads."""
    try:
        with io.open(os.path.join(path, fmt.FORMAT_FILE), "rb") as f:
            data = json.loads(f.read())
    except FileNotFoundError:
        raise FormatError(f"{path} is not a snapstore store (no {fmt.FORMAT_FILE} file)") from None
    except (ValueError, OSError) as exc:
        raise FormatError(f"{path}: unreadable {fmt.FORMAT_FILE} file: {exc}") from exc
    if not isinstance(data, dict) or data.get("format") != fmt.FORMAT_NAME:
        raise FormatError(f"{path} is not a snapstore store")
    version = data.get("version")
    if not isinstance(version, int) or version > fmt.FORMAT_VERSION:
        raise FormatError(f"{path} has store format version {version}; this snapstore reads "
                          f"versions up to {fmt.FORMAT_VERSION}: upgrade snapstore")
    if version < fmt.MIN_FORMAT_VERSION:
        raise FormatError(f"{path} has an invalid store format version {version}")
    return data
