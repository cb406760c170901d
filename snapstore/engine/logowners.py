"""Who appends to which log (format 3, many writers): one lock file per log.

    STORE/writers/<L>    the lock file of log L (segments L * LOG_SEGMENTS + n): flock()ed
                         exclusively by the one writer appending to log L, for as long as it
                         has the store open; it holds that writer's record (pid, host, since:
                         holders.write_holder), for messages only

The flock is the whole truth: a log whose lock file can be locked belongs to nobody: its
writer died (or closed). Its claims (claims.py) are then stale, and its records past its
applied position are either published claims (recovery publishes them) or garbage; the first
writer that takes the free lock recovers the log (recovery.recover_log) and may adopt it as
its own, so the number of logs stays the number of writers that ever ran at once.

Openers choose one at a time: an opener takes every free log's lock while it recovers them
and only then lets go of all but the one it adopts, so a second opener looking meanwhile found
every log held and made a new one. Two processes opening and closing a store in turns made
97 logs in 400 opens, and every open recovers every free log (an open and close took 5.1 ms
instead of 0.7). STORE/writers/.choosing (choosing_a_log) is held exclusively from the first
look to the adoption, and by a writer recovering a dead writer's logs; an opener that cannot
have it within CHOICE_WAIT_SECONDS chooses without it (at worst a log more, as before). It
adds no deadlock: its holder takes logs' locks without waiting, and nobody waits for it
while holding the index's write lock (the only lock its holder waits for after it).

A flock belongs to the open file description: another Store of this process holding log L
has its own descriptor, so this process cannot take L's lock either (is_alive says True), and
a fork()ed child shares its parent's description (the Committer's fork handler closes the
child's copy). Log 0 is the one log of a format <= 2 store; it has no lock file until a
writer of format 3 first takes it.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time

from snapstore.engine import format as fmt
from snapstore.engine.fsutil import (DEFAULT_FILE_MODE, NotRegularFile, flock_until,
                                     open_regular, try_flock)
from snapstore.engine.holders import read_holder
from snapstore.errors import CorruptionError


def writers_dir(store_path: str) -> str:
    return os.path.join(store_path, fmt.WRITERS_DIR)


def lock_path(store_path: str, log: int) -> str:
    return os.path.join(writers_dir(store_path), str(log))


def _open(path: str, flags: int, mode: int) -> int:
    try:
        return open_regular(path, flags, mode)
    except NotRegularFile as exc:
        raise CorruptionError(f"{path} is {exc.kind}, not a regular file: the store is damaged "
                              "(a writer's lock file holds no data; remove it)") from None


def log_number(name: str) -> int | None:
    """The log a lock file's name (lock_path: the number in decimal) stands for; None for any
    other name ("07", "²", ".choosing")."""
    if not (name.isascii() and name.isdigit()) or str(int(name)) != name:
        return None
    return int(name)


def lock_files(store_path: str) -> list[int]:
    """The logs that have a lock file, ascending."""
    try:
        names = os.listdir(writers_dir(store_path))
    except FileNotFoundError:
        return []
    logs = (log_number(n) for n in names)
    return sorted(n for n in logs if n is not None and n < fmt.MAX_LOGS)


CHOICE_WAIT_SECONDS = 2.0       # the longest wait for another opener's choice; then without
_CHOICE_POLL_SECONDS = 0.002     # another opener's choice takes milliseconds


@contextlib.contextmanager
def choosing_a_log(store_path: str, file_mode: int = DEFAULT_FILE_MODE):
    """Runs the block (an opener's recovery of the free logs and its adoption of one) while
    no other opener runs its own: waits for STORE/writers/.choosing up to
    CHOICE_WAIT_SECONDS, then runs it anyway (whatever the store's timeout: this wait never
    ends in StoreLocked, and a choice that takes longer is a recovery of a crashed writer's
    log, after which a log more does no harm). Without the lock file (writers/ not writable
    for this user, where the logs' lock files are) it runs the block as before there was one.
    Raises CorruptionError (not a regular file)."""
    try:
        fd = _open(os.path.join(writers_dir(store_path), fmt.LOG_CHOICE_LOCK_FILE),
                   os.O_RDWR | os.O_CREAT, file_mode)
    except OSError:
        fd = None
    if fd is None:          # (not in the except clause: the block's errors are not its context)
        yield
        return
    try:
        flock_until(fd, fcntl.LOCK_EX, time.monotonic() + CHOICE_WAIT_SECONDS,
                    poll=_CHOICE_POLL_SECONDS)
        yield
    finally:
        os.close(fd)                # (lets go of the lock, if it was taken)


def try_take(store_path: str, log: int, file_mode: int = DEFAULT_FILE_MODE) -> int | None:
    """The exclusive lock of log `log` (its lock file created if missing), as a descriptor,
    or None when a live writer holds it. Raises OSError, CorruptionError."""
    fd = _open(lock_path(store_path, log), os.O_RDWR | os.O_CREAT, file_mode)
    try:
        if try_flock(fd, fcntl.LOCK_EX):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


def create_new(store_path: str, file_mode: int = DEFAULT_FILE_MODE,
               start: int = 0) -> tuple[int, int]:
    """A new log (the lowest number from `start` on that has no lock file; a store's first
    writer gets log 0) and its exclusive lock: (log, descriptor). Creating the lock file
    exclusively decides between two writers choosing the same number."""
    log = max([start] + [n + 1 for n in lock_files(store_path)])
    while log < fmt.MAX_LOGS:
        try:
            fd = _open(lock_path(store_path, log), os.O_RDWR | os.O_CREAT | os.O_EXCL,
                       file_mode)
        except FileExistsError:
            log += 1
            continue
        try:
            if try_flock(fd, fcntl.LOCK_EX):
                return log, fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)                # taken by a writer that adopted it as an orphan
        log += 1
    raise CorruptionError(f"the store {store_path} has no log numbers left")


def is_alive(store_path: str, log: int) -> bool:
    """Whether a writer (of any process, this one included) holds log `log`'s lock. A log
    without a lock file has no live writer."""
    try:
        fd = _open(lock_path(store_path, log), os.O_RDONLY, DEFAULT_FILE_MODE)
    except FileNotFoundError:
        return False
    try:
        if try_flock(fd, fcntl.LOCK_SH):
            fcntl.flock(fd, fcntl.LOCK_UN)
            return False
        return True
    finally:
        os.close(fd)


def live_holders(store_path: str) -> list[tuple[int, dict]]:
    """[(log, holder record)] of the logs a writer holds now (holders.read_holder's dict)."""
    out = []
    for log in lock_files(store_path):
        try:
            fd = _open(lock_path(store_path, log), os.O_RDONLY, DEFAULT_FILE_MODE)
        except (FileNotFoundError, CorruptionError):
            continue
        try:
            if try_flock(fd, fcntl.LOCK_SH):
                fcntl.flock(fd, fcntl.LOCK_UN)
                continue
            out.append((log, read_holder(fd)))
        finally:
            os.close(fd)
    return out
