"""File-system helpers shared by the local segment backend, the store directory, the index and
the bench harness.

Store files are opened without following symbolic links and without blocking, and must be
regular files: a directory, FIFO, device, socket or symlink where a store file belongs is
damage (a FIFO would block a reader forever; a symlink could make the store read or write
another file), reported by callers as a snapstore error naming the file.
"""
from __future__ import annotations

import errno
import fcntl
import os
import stat
import tempfile
import time
from typing import IO, Callable

from snapstore.errors import InvalidArgumentError, SnapstoreError, StoreIOError

DEFAULT_FILE_MODE = 0o600       # new store files: only the owner may read them (restic's choice)


class NotRegularFile(OSError):
    """A store path is something else than a regular file; `kind` says what ("a directory",
    "a FIFO", "a symbolic link", ...). Callers turn it into a snapstore error naming the file."""

    def __init__(self, path: str, kind: str) -> None:
        super().__init__(errno.EINVAL, f"{path} is {kind}, not a regular file", path)
        self.kind = kind


def file_kind(mode: int) -> str:
    """What an st_mode is, for messages: "a regular file", "a directory", "a FIFO"..."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular(path: str) -> bool:
    """True when path is a regular file (not followed if a symlink), False when it does not
    exist. Raises NotRegularFile for anything else, OSError when it cannot be looked at."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, file_kind(mode))
    return True


def open_regular(path: str, flags: int, mode: int = DEFAULT_FILE_MODE) -> int:
    """os.open(path, flags, mode) of a regular file only: never follows a symlink in the last
    component, never blocks on a FIFO (O_NOFOLLOW | O_NONBLOCK), closed on exec. Raises
    NotRegularFile for anything but a regular file (checked on the open descriptor: no race),
    FileNotFoundError / FileExistsError / OSError as os.open does."""
    if not flags & os.O_CREAT:
        check_regular(path)         # before opening: opening a device may have side effects
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(path, "a symbolic link") from None
        if exc.errno == errno.EISDIR:
            raise NotRegularFile(path, "a directory") from None
        raise
    try:
        st_mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(st_mode):
            raise NotRegularFile(path, file_kind(st_mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def pread_into(fd: int, buf, offset: int) -> int:
    """Reads the file's bytes from offset into buf until it is full or the file ends; how
    many were read."""
    view, got = memoryview(buf).cast("B"), 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if not n:
            break
        got += n
    return got


def write_all(f, data, what: str) -> None:
    """Writes all of data to the file object f. A raw (unbuffered) file's write() may write
    less than asked without raising (a full disk, a file size limit, Linux's cap of about
    2 GiB per call): the rest is written again, and a write that takes nothing is ENOSPC
    (what: the file, for the message). A buffered file writes it all (or raises) at once."""
    view = memoryview(data).cast("B")
    while view:
        n = f.write(view)
        if n is None:                   # a buffered writer: all of it
            return
        if n <= 0:
            raise OSError(errno.ENOSPC, f"{what}: a write took no bytes (no space left on "
                                        "device?)")
        view = view[n:]


def try_flock(fd: int, operation: int) -> bool:
    """flock(fd, operation) without waiting (operation: fcntl.LOCK_SH or LOCK_EX): True when
    taken, False when another open file description holds it. Raises other OSErrors."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
        return True
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise


FLOCK_TAKEN, FLOCK_TIMED_OUT, FLOCK_STOPPED = "taken", "timed out", "stopped"


def flock_until(fd: int, operation: int, deadline: float, *, poll: float = 0.02,
                stop: Callable[[], bool] | None = None) -> str:
    """Takes flock(fd, operation), polling (flock has no timeout of its own) until deadline
    (a time.monotonic() value; inf: for ever). Returns FLOCK_TAKEN, FLOCK_TIMED_OUT, or
    FLOCK_STOPPED once stop() (asked between attempts) is true. Raises other OSErrors. The
    callers turn a timeout into StoreLocked naming the lock and its holder."""
    while True:
        if try_flock(fd, operation):
            return FLOCK_TAKEN
        if stop is not None and stop():
            return FLOCK_STOPPED
        if time.monotonic() >= deadline:
            return FLOCK_TIMED_OUT
        time.sleep(poll)


def fsync_directory(path: str) -> None:
    """Makes a directory's entries (files created, renamed or removed in it) durable.
    Idempotent. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}


def _publish_new(tmp: str, path: str, refuse_existing: Callable[[str], Exception]) -> None:
    """Gives the finished temporary file the name path unless path exists (then raises
    refuse_existing(path); the caller removes tmp)."""
    try:
        os.link(tmp, path)          # atomic, and fails if anything (even a symlink) is there
    except FileExistsError:
        raise refuse_existing(path) from None
    except OSError as exc:
        if exc.errno not in _NO_HARD_LINKS:
            raise
        if os.path.lexists(path):
            raise refuse_existing(path) from None
        os.rename(tmp, path)
        return
    os.unlink(tmp)


_TEMP_SUFFIX = ".part"
_TEMP_RANDOM_CHARS = 8          # tempfile's random part
_NAME_MAX = 255                 # bytes of one name: Linux file systems, and most others


def _temp_prefix(name: str) -> str:
    """".NAME." for the temporary file of NAME, shortened (whole characters from the end) so
    that the temporary name stays within _NAME_MAX bytes: a name near the limit is valid, and
    its temporary file must be too."""
    room = _NAME_MAX - len(_TEMP_SUFFIX) - _TEMP_RANDOM_CHARS - 2
    while len(os.fsencode(name)) > room:
        name = name[:-1]
    return f".{name}."


def replace_file(path: str, fill: Callable[[IO[bytes]], None], *,
                 mode: int = DEFAULT_FILE_MODE, sync: bool = False,
                 refuse_existing: Callable[[str], Exception] | None = None) -> None:
    """Writes a whole file atomically: fill(binary file object) writes the bytes into a new
    temporary file next to path (tempfile.mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW under an
    unpredictable name, so no planted symlink is followed), given permission bits mode,
    fsynced if sync, which then replaces path by rename (a symlink at path is replaced
    itself, never followed). On any failure the temporary file is removed.

    refuse_existing: never replace what is at path: raise refuse_existing(path) if anything
    is there, before the writing or when the file is published (a file created at path while
    fill() ran is kept: the new file is published by a hard link, which fails if the name
    exists, rather than by rename; a file system without hard links gets a check and a rename,
    the best it offers).

    Raises InvalidArgumentError when path is a directory, a device, a FIFO or a socket (a
    rename would replace the node itself: `-o /dev/null --force` must not turn /dev/null into
    a file), StoreIOError naming path (not the temporary file) for an I/O error; what fill
    raises otherwise passes through."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise StoreIOError(f"cannot write {path}: {exc.strerror or exc}", exc.errno) from None
    if st is not None and refuse_existing is not None:
        raise refuse_existing(path)
    if st is not None and not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        what = ("a directory" if stat.S_ISDIR(st.st_mode)
                else "not a regular file (a device, FIFO or socket)")
        raise InvalidArgumentError(f"{path} is {what}: snapstore writes a new file and renames "
                                   "it into place, which would replace it; name a file")
    directory, name = os.path.split(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=directory or ".", prefix=_temp_prefix(name),
                                   suffix=_TEMP_SUFFIX)
    except OSError as exc:
        where = f"directory {directory!r}" if directory else "the current directory"
        raise StoreIOError(f"cannot write {path} in {where}: {exc.strerror or exc}",
                           exc.errno) from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            fill(f)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        if refuse_existing is None:
            os.replace(tmp, path)
        else:
            _publish_new(tmp, path, refuse_existing)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, SnapstoreError):
            raise StoreIOError(f"cannot write {path}: {exc.strerror or exc}",
                               exc.errno) from exc
        raise
