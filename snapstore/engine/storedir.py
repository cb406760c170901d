"""The store directory: its FORMAT file, refusing foreign directories, creating a store
atomically, the store lock, and the permissions of what a store creates.

    STORE/FORMAT     JSON {"format": "snapstore", "version": N, "created": t}, published by temp
                     file + fsync + rename + directory fsync, LAST when a store is created: a
                     directory with FORMAT is a complete store (index initialised)
    STORE/lock       flock()ed SHARED by every writer for as long as it has the store open, and
                     EXCLUSIVELY by what needs the store to itself: creating it, upgrading its
                     format, repair (and writers of format <= 2, which took it exclusively);
                     an exclusive holder writes into it who it is: JSON {"pid", "host",
                     "since"} padded to 256 bytes (holders.py; information for StoreLocked
                     messages only; the flock decides)
    STORE/writers/   one lock file per log (logowners.py)
    STORE/maintenance  flock()ed exclusively by compaction, shared by verify
    STORE/index.gate   flock()ed by every index write transaction, waiting included (writegate.py)
    STORE/unsynced/  marks of writers whose index runs without syncs (unsynced.py)
    STORE/index/     LMDB        STORE/segments/   the logs
    STORE/.index.new, STORE/.index.old   only while the index is being replaced (indexswap.py):
                     a writer's open finishes or cleans up a swap a crash interrupted

Creation. The creator holds the lock while it creates index/ and segments/, initialises the
index (the Committer) and finally publishes FORMAT (publish_new_store: the new directories'
entries synced first, the store's entry in its parent after). Other openers meanwhile
see a directory holding only those names (and .FORMAT.*.part temp files): "being created", not
foreign. A writer waits for the lock (timeout), then finds FORMAT; a reader waits up to its
timeout for the directory and its FORMAT to appear.

Permissions. A new store is private: the directory it creates is 0700, index/ and segments/
are 0700, every file (FORMAT, lock, LMDB files, segments) 0600, as restic does: checkpoints
hold process state and secrets. New files of an existing store get the permission bits of
its FORMAT file (owner read/write always), new directories the same plus search where read is
allowed: `chmod -R g+rX STORE` (FORMAT included) shares a store with its group from then on,
subject to the umask.

Errors. Not a store (no FORMAT, an unreadable or foreign FORMAT, a non-empty foreign
directory) or a newer format: FormatError. A store whose own files are damaged (segments/ or
index/ missing or not a directory, the lock file not a regular file): CorruptionError naming
the file. A lock held past the timeout: StoreLocked (a writer waits for an exclusive holder,
an exclusive opener for every writer). Other OS errors: StoreIOError. Store
files are never opened through a symlink, and never in a way that blocks on a FIFO.
"""
from __future__ import annotations

import fcntl
import json
import os
import stat
import time
from typing import Callable, NamedTuple

from snapstore.engine import format as fmt
from snapstore.engine import indexswap
from snapstore.engine import logowners
from snapstore.engine.holders import clear_holder, read_holder, write_holder
from snapstore.engine.fsutil import (DEFAULT_FILE_MODE, FLOCK_STOPPED, FLOCK_TIMED_OUT,
                                     NotRegularFile, file_kind, flock_until,
                                     fsync_directory, open_regular, replace_file)
from snapstore.errors import (CorruptionError, DamagedFormatFileError, FormatError, StoreIOError,
                             StoreLocked)

_FORMAT_MAX_BYTES = 1 << 16
_POLL_SECONDS = 0.05


class Opened(NamedTuple):
    """What open_directory found: the store lock's descriptor (None for a reader; held shared
    by a writer, exclusively when `exclusive`), the permission bits for new files, whether
    this opener is creating the store (then it must call publish_new_store once the index is
    initialised, then share_lock), and the version FORMAT names (None while creating)."""
    lock_fd: int | None
    file_mode: int
    creating: bool
    exclusive: bool = False
    version: int | None = None


def dir_mode(file_mode: int) -> int:
    """The mode of a new directory for files of file_mode: search allowed where read is."""
    return file_mode | ((file_mode & 0o444) >> 2)


def _no_format_file(path: str) -> FormatError:
    return FormatError(f"{path} is not a snapstore store (no {fmt.FORMAT_FILE} file)")


def open_directory(path: str, *, create: bool, readonly: bool, timeout: float,
                   repairing: bool = False) -> Opened:
    """Checks (or starts creating) the store directory; for a writer takes the store lock,
    shared, or exclusively when creating the store or repairing (closed again if anything
    after it fails). repairing=True (`snapstore repair`, which rebuilds the index) accepts a
    missing or damaged index/. Raises FormatError, CorruptionError, StoreLocked,
    StoreIOError (see the module docstring)."""
    deadline = time.monotonic() + max(0.0, float(timeout))
    try:
        if readonly:
            return Opened(None, _wait_for_store(path, deadline), False)
        if os.path.exists(path) and not os.path.isdir(path):
            raise FormatError(f"{path} is not a directory, so not a snapstore store")
        if not os.path.isdir(path):
            if not create:
                raise FormatError(f"no snapstore store at {path}")
            os.makedirs(path, mode=dir_mode(DEFAULT_FILE_MODE), exist_ok=True)
        refuse_foreign_directory(path)          # before the lock file: leave nothing in one
        format_file = os.path.join(path, fmt.FORMAT_FILE)
        if not create and not os.path.lexists(format_file) \
                and not os.path.lexists(os.path.join(path, fmt.LOCK_FILE)):
            # no store, and none being created (a creator makes the lock file first): say
            # so without leaving a lock file in a directory that is not a store
            raise _no_format_file(path)
        exclusive = repairing or not os.path.lexists(format_file)
        lock_fd = open_lock_file(path)
        try:
            # a creator waiting for another creator: once FORMAT is there, it is a writer
            exclusive = lock_lock(lock_fd, path, deadline, shared=not exclusive,
                                  unless=None if repairing
                                  else lambda: os.path.lexists(format_file)) and exclusive
        except BaseException:
            os.close(lock_fd)
            raise
    except OSError as exc:
        if isinstance(exc, (StoreIOError, StoreLocked)):
            raise
        raise StoreIOError(f"cannot open store {path}: {exc.strerror or exc}", exc.errno) from exc
    try:
        if not os.path.lexists(os.path.join(path, fmt.FORMAT_FILE)):
            # not exclusive: FORMAT vanished since we looked, not a store any more
            if not exclusive or not create:
                raise _no_format_file(path)
            refuse_foreign_directory(path)      # again under the lock: another creator finished
            if not os.path.lexists(os.path.join(path, fmt.FORMAT_FILE)):
                mode = dir_mode(DEFAULT_FILE_MODE)
                for name in (fmt.SEGMENTS_DIR, fmt.INDEX_DIR, fmt.WRITERS_DIR):
                    os.makedirs(os.path.join(path, name), mode=mode, exist_ok=True)
                _check_layout(path)
                return Opened(lock_fd, DEFAULT_FILE_MODE, True, True, None)
            # another creator finished while we waited for the lock: a writer like others
            share_lock(lock_fd, path)
            exclusive = False
        if exclusive:
            indexswap.recover_swap(path)        # a swap of the index a crash interrupted
        elif _swap_interrupted(path):
            # a fallback swap (two renames) cut between them: by a crash (finish it alone,
            # holding the store), or we looked between a live compaction's two renames (its
            # writer stays open, so waiting for the store would only time out: stop waiting
            # once its second rename is done)
            if lock_lock(lock_fd, path, deadline, shared=False,
                         unless=lambda: not _swap_interrupted(path)):
                indexswap.recover_swap(path)
                share_lock(lock_fd, path)
        found = read_format_file(path)
        _check_layout(path, check_index=not repairing)
        os.makedirs(logowners.writers_dir(path), mode=dir_mode(found["file_mode"]),
                    exist_ok=True)
        return Opened(lock_fd, found["file_mode"], False, exclusive, found["version"])
    except BaseException as exc:
        os.close(lock_fd)
        if isinstance(exc, OSError) and not isinstance(exc, (StoreIOError, StoreLocked)):
            raise StoreIOError(f"cannot open store {path}: {exc.strerror or exc}",
                               exc.errno) from exc
        raise


def _swap_interrupted(path: str) -> bool:
    """Whether index/ is missing while .index.old is there: the first rename of a fallback
    index swap happened, the second not (indexswap.recover_swap finishes it)."""
    return (not os.path.lexists(os.path.join(path, fmt.INDEX_DIR))
            and os.path.lexists(os.path.join(path, fmt.INDEX_OLD_DIR)))


def _wait_for_store(path: str, deadline: float) -> int:
    """A reader's open: the store's file mode once FORMAT exists, waiting until the deadline
    while there is no directory yet or it is a store being created."""
    while True:
        if os.path.exists(path) and not os.path.isdir(path):
            raise FormatError(f"{path} is not a directory, so not a snapstore store")
        if os.path.isdir(path):
            refuse_foreign_directory(path)
            if os.path.lexists(os.path.join(path, fmt.FORMAT_FILE)):
                return _read_store(path)
        if time.monotonic() >= deadline:
            raise (FormatError(f"no snapstore store at {path}") if not os.path.isdir(path)
                   else _no_format_file(path))
        time.sleep(_POLL_SECONDS)


def _read_store(path: str, check_index: bool = True) -> int:
    """Checks FORMAT and the layout of an existing store; returns its file mode."""
    mode = read_format_file(path)["file_mode"]
    _check_layout(path, check_index)
    return mode


def refuse_foreign_directory(path: str) -> None:
    """A directory without FORMAT may only hold what a store being created holds. One
    listing: FORMAT published between two looks must not make the store look foreign."""
    names = os.listdir(path)
    if fmt.FORMAT_FILE in names:
        return
    ours = {fmt.LOCK_FILE, fmt.INDEX_DIR, fmt.SEGMENTS_DIR, fmt.WRITERS_DIR,
            fmt.MAINTENANCE_LOCK_FILE, fmt.INDEX_GATE_FILE, fmt.UNSYNCED_DIR}
    if any(n not in ours and not n.startswith(f".{fmt.FORMAT_FILE}.") for n in names):
        raise FormatError(f"{path} is a non-empty directory that is not a snapstore store")


def _check_layout(path: str, check_index: bool = True) -> None:
    """segments/ and (unless check_index is False) index/ must be directories (not
    symlinks): CorruptionError otherwise."""
    layout = [(fmt.SEGMENTS_DIR, "the log, which holds every checkpoint")]
    if check_index:
        layout.append((fmt.INDEX_DIR, "the index (rebuild it with `snapstore repair`)"))
    for name, what in layout:
        where = os.path.join(path, name)
        # index/, or the new index a swap is putting in its place, looked at again: a swap's
        # renames in another process may come between the looks
        places = ((p for _ in indexswap.looks_across_a_swap()
                   for p in (indexswap.index_to_read(where), where))
                  if name == fmt.INDEX_DIR else [where])
        for full in places:
            try:
                st_mode = os.lstat(full).st_mode
                break
            except FileNotFoundError:
                pass
        else:
            raise CorruptionError(f"store {path} has no {name}/ directory: {what} is "
                                  "missing")
        if not stat.S_ISDIR(st_mode):
            raise CorruptionError(f"{full} is {file_kind(st_mode)}, not a directory: the store "
                                  f"is damaged ({what})")


def take_lock(path: str, deadline: float, *, shared: bool = False,
              unless: Callable[[], bool] | None = None) -> int:
    """The flock on STORE/lock, shared (a writer) or exclusive (creating, upgrading, repair),
    waiting until the deadline; an exclusive holder then writes its record (pid, host, since)
    into the file for StoreLocked messages. unless: see lock_lock."""
    fd = open_lock_file(path)
    try:
        lock_lock(fd, path, deadline, shared=shared, unless=unless)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_lock_file(path: str) -> int:
    """A descriptor of STORE/lock (created if missing; CorruptionError if not a file)."""
    lock_path = os.path.join(path, fmt.LOCK_FILE)
    try:
        return open_regular(lock_path, os.O_RDWR | os.O_CREAT, store_file_mode(path))
    except NotRegularFile as exc:
        raise CorruptionError(f"{lock_path} is {exc.kind}, not a regular file: the store is "
                              "damaged (the lock file holds no data; remove it)") from None


def lock_lock(fd: int, path: str, deadline: float, *, shared: bool,
              unless: Callable[[], bool] | None = None) -> bool:
    """Takes (or converts to) the shared or exclusive flock of the store lock open as fd,
    waiting until the deadline (StoreLocked then, naming who holds it). Returns True.

    Waiting for the exclusive lock, it first lets go of a shared one it holds: several
    writers that open a store of an older format at once all want to upgrade it, and each
    holding its shared lock while waiting for the exclusive one would wait for the others for
    ever. `unless()` is asked while it waits: once true (another opener created or upgraded
    the store meanwhile), it takes the shared lock instead and returns False."""
    started = time.monotonic()
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    if not shared:
        fcntl.flock(fd, fcntl.LOCK_UN)
    outcome = flock_until(fd, mode, deadline, poll=_POLL_SECONDS, stop=unless)
    if outcome == FLOCK_STOPPED:
        lock_lock(fd, path, deadline, shared=True)
        return False
    if outcome == FLOCK_TIMED_OUT:
        raise _locked(path, time.monotonic() - started, read_holder(fd), shared)
    if not shared:
        write_holder(fd)
    return True


def share_lock(fd: int, path: str) -> None:
    """Converts an exclusive store lock (creation, upgrade done) to the shared one a writer
    keeps, and clears the exclusive holder's record: the record names an exclusive holder
    only while it holds the lock, so a holder that writes none (an older version) is never
    reported as the one who let go. flock converts without letting go only when nobody
    waits; one who took it meanwhile only delays us (no deadline: a shared lock is never
    refused for long)."""
    lock_lock(fd, path, float("inf"), shared=True)
    clear_holder(fd)


def release_exclusive(fd: int) -> None:
    """Lets go of an exclusive store lock (repair done): clears the record, closes fd."""
    try:
        clear_holder(fd)
    finally:
        os.close(fd)


def _locked(path: str, waited: float, holder: dict, shared: bool) -> StoreLocked:
    """The StoreLocked of an opener that gave up on STORE/lock. A writer (shared) is kept out
    by an exclusive holder, named by the lock file's record. An exclusive opener is kept out
    by writers (named by their logs' records: the lock file's record is a past exclusive
    holder's then) or, when none is open, by another exclusive holder."""
    writers = [] if shared else [h for _, h in logowners.live_holders(path)]
    if writers:
        exc = StoreLocked("", path=path, waited=waited, lock="writers", writers=len(writers),
                          **writers[0])
        others = f" and {len(writers) - 1} more writer(s)" if len(writers) > 1 else ""
        exc.reason = (f"{path} is open for writing by {exc.holder}{others}, and this needs "
                      f"the store to itself (waited {waited:.1f} s).")
        exc.args = (f"{exc.reason} Close its writers, or pass timeout=SECONDS to wait for "
                    "them.",)
        return exc
    exc = StoreLocked("", path=path, waited=waited, lock="store", **holder)
    exc.reason = (f"{path} is locked by {exc.holder}, which needs the store to itself "
                  "(creating it, upgrading its format, a repair, or a writer of an older "
                  f"snapstore version; waited {waited:.1f} s).")
    exc.args = (f"{exc.reason} Open it with readonly=True to read meanwhile, or pass "
                "timeout=SECONDS to wait for the lock.",)
    return exc


def store_file_mode(path: str) -> int:
    """The file mode of an existing store (its FORMAT's bits), else the private default."""
    try:
        st = os.lstat(os.path.join(path, fmt.FORMAT_FILE))
    except FileNotFoundError:
        return DEFAULT_FILE_MODE
    return file_mode_of(st.st_mode) if stat.S_ISREG(st.st_mode) else DEFAULT_FILE_MODE


def file_mode_of(st_mode: int) -> int:
    """New files' mode from FORMAT's st_mode: its read/write bits, owner read/write always."""
    return (st_mode & 0o666) | 0o600


def publish_format(path: str, file_mode: int = DEFAULT_FILE_MODE,
                   created: float | None = None) -> None:
    """Publishes the FORMAT file of this library's version atomically (temp file, fsync,
    rename, directory fsync): the last step of creating a store, and of upgrading one (which
    keeps its `created` time)."""
    body = json.dumps({"format": fmt.FORMAT_NAME, "version": fmt.FORMAT_VERSION,
                       "created": time.time() if created is None else created}).encode()
    replace_file(os.path.join(path, fmt.FORMAT_FILE), lambda f: f.write(body),
                 mode=file_mode, sync=True)
    fsync_directory(path)


def publish_new_store(path: str, file_mode: int) -> None:
    """The last step of creating a store: its subdirectories' entries (the index's data.mdb
    above all) made durable, then FORMAT published (publish_format), then the store
    directory's own entry in its parent: a power cut after the first acknowledged checkpoint
    must not take the index file or the whole directory with it."""
    for name in (fmt.INDEX_DIR, fmt.SEGMENTS_DIR, fmt.WRITERS_DIR):
        fsync_directory(os.path.join(path, name))
    publish_format(path, file_mode)
    fsync_directory(os.path.dirname(os.path.abspath(path)))


def read_format_file(path: str) -> dict:
    """The FORMAT file's contents, checked (FormatError unless a snapstore store of a version
    this library reads), plus "file_mode": the mode its permission bits give new files."""
    name = os.path.join(path, fmt.FORMAT_FILE)
    try:
        fd = open_regular(name, os.O_RDONLY)
        try:
            st_mode = os.fstat(fd).st_mode
            data = json.loads(os.read(fd, _FORMAT_MAX_BYTES))
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise _no_format_file(path) from None
    except NotRegularFile as exc:
        raise FormatError(f"{path}: {fmt.FORMAT_FILE} is {exc.kind}, not a regular file; not "
                          "a snapstore store, or a damaged one") from None
    except (ValueError, OSError, RecursionError) as exc:
        raise DamagedFormatFileError(f"{path}: unreadable {fmt.FORMAT_FILE} file: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(data, dict) or data.get("format") != fmt.FORMAT_NAME:
        raise FormatError(f"{path} is not a snapstore store")
    version = data.get("version")
    if type(version) is not int or version < fmt.MIN_FORMAT_VERSION:
        raise DamagedFormatFileError(f"{path}: its {fmt.FORMAT_FILE} file holds an invalid "
                                     f"store format version ({version!r:.40}); the file is "
                                     "damaged (a store's format is an integer, 1 or more)")
    if version > fmt.FORMAT_VERSION:
        raise FormatError(f"{path} has store format version {version}; this snapstore reads "
                          f"versions up to {fmt.FORMAT_VERSION}: upgrade snapstore")
    return dict(data, file_mode=file_mode_of(st_mode))
