"""Marks of an index written without syncs (docs/design.md, "An index written without
syncs").

A writer whose index transactions are not synced (`sync_index=False`, or durability "none")
makes one sync per commit instead of three, but after a power cut or an OS crash its index
file may hold pages LMDB's meta page names but the disk never got: such an index must not even
be mapped. So before its first unsynced write the writer makes a mark durable:

    STORE/unsynced/<boot id>.<token>   an empty file, flock()ed exclusively by its writer for
                                       as long as it has the store open

and removes it at close, after syncing the index. The boot id (/proc/sys/kernel/random/boot_id)
changes at every boot, so a mark tells whether the writes it covers may have been lost:

- a mark of an earlier boot: the machine went down with an unsynced writer open. The index is
  untrusted; the next opener rebuilds it from the log (repair.rebuild_untrusted) before LMDB
  maps it, and only then removes the marks;
- a mark of this boot whose flock is free: its writer died (kill -9). Its writes are in the
  page cache, which survived it: the next writer syncs the index and removes the mark.

A mark appears whole and already locked: it is created and locked under a temporary name
(starting with "."), synced, and renamed into place, so nobody ever sees the mark of a live
writer unlocked. A fork()ed child closes its copy of the descriptor (the parent's stays).
"""
from __future__ import annotations

import errno
import fcntl
import os
import secrets

from snapstore.engine import format as fmt
from snapstore.engine.fsutil import fsync_directory, try_flock

BOOT_ID_FILE = "/proc/sys/kernel/random/boot_id"


def boot_id() -> str | None:
    """This boot's id (a UUID), or None where the kernel offers none (then no mark can tell a
    reboot, and every index is synced)."""
    try:
        with open(BOOT_ID_FILE, "rb") as f:
            value = f.read(64).strip().decode("ascii", "replace")
    except OSError:
        return None
    return value if value and "." not in value and "/" not in value else None


def marks_dir(store: str) -> str:
    return os.path.join(store, fmt.UNSYNCED_DIR)


def _marks(store: str) -> list[str]:
    """The names of the marks in STORE/unsynced: its regular files (temporary names, and
    anything else someone put there, left out)."""
    try:
        with os.scandir(marks_dir(store)) as entries:
            return sorted(e.name for e in entries
                          if not e.name.startswith(".") and e.is_file(follow_symlinks=False))
    except FileNotFoundError:
        return []


def _boot_of(name: str) -> str:
    return name.rsplit(".", 1)[0]


def untrusted(store: str) -> list[str]:
    """The marks of an earlier boot: when any is there, the index may be damaged and must be
    rebuilt from the log before it is opened. A mark whose lock is held is a live writer's
    whatever its boot id says (a sandbox with a boot id of its own), never stale. OSError
    when the directory cannot be read."""
    boot = boot_id()
    return [n for n in _marks(store)
            if (boot is None or _boot_of(n) != boot) and not _held(store, n)]


def _held(store: str, name: str) -> bool:
    """Whether a live writer holds the mark's lock (exclusively, from before the mark
    appeared). Looked at with a shared lock: two openers looking at once must not take each
    other's look for a live writer (an exclusive look did, and one of them then mapped the
    untrusted index)."""
    try:
        fd = os.open(os.path.join(marks_dir(store), name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True             # gone meanwhile: not a mark to act on
    try:
        return not try_flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)            # (closing lets go of the lock taken to look)


class Mark:
    """This writer's mark, held (flocked) until remove()."""

    def __init__(self, store: str, file_mode: int, dir_mode: int) -> None:
        boot = boot_id()
        if boot is None:
            raise OSError(errno.ENOTSUP, "the kernel gives no boot id")
        where = marks_dir(store)
        try:
            os.mkdir(where, dir_mode)
            fsync_directory(store)          # the directory's entry too, before any mark
        except FileExistsError:
            pass
        self.name = f"{boot}.{secrets.token_hex(8)}"
        self.path = os.path.join(where, self.name)
        temp = os.path.join(where, f".{self.name}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, file_mode)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.fsync(fd)
            os.rename(temp, self.path)
            fsync_directory(where)
        except BaseException:
            os.close(fd)
            for p in (temp, self.path):
                try:
                    os.unlink(p)
                except OSError:
                    pass
            raise
        self.fd: int | None = fd

    def remove(self) -> None:
        """Removes the mark (the caller synced the index first). Idempotent."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)
            fsync_directory(os.path.dirname(self.path))
        finally:
            os.close(fd)

    def let_go(self) -> None:
        """Closes this process's descriptor and leaves the mark: in a fork()ed child (the
        parent keeps the mark and its lock), and after remove() or a failed close (the mark
        is then orphaned: the next writer syncs and removes it). Idempotent."""
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def orphaned(store: str) -> list[tuple[str, int]]:
    """The marks of this boot whose writer is gone (their flock was free), each with a
    descriptor that now holds its lock: [(name, fd)]. The caller syncs the index, then
    remove_orphaned()."""
    boot = boot_id()
    if boot is None:
        return []
    out = []
    for name in _marks(store):
        if _boot_of(name) != boot:
            continue
        try:
            fd = os.open(os.path.join(marks_dir(store), name), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue                # removed meanwhile
        try:
            if try_flock(fd, fcntl.LOCK_EX):
                out.append((name, fd))
                continue
        except OSError:
            pass
        os.close(fd)
    return out


def remove_orphaned(store: str, found: list[tuple[str, int]]) -> None:
    """Removes the marks orphaned() found (the index was synced since), closing their
    descriptors."""
    try:
        for name, _ in found:
            try:
                os.unlink(os.path.join(marks_dir(store), name))
            except FileNotFoundError:
                pass
        if found:
            fsync_directory(marks_dir(store))
    finally:
        for _, fd in found:
            os.close(fd)


def remove_untrusted(store: str, names: list[str]) -> None:
    """Removes marks of earlier boots (the index was rebuilt and is durable), and what
    interrupted creations left."""
    where = marks_dir(store)
    try:
        leftovers = [n for n in os.listdir(where) if n.startswith(".")]
    except FileNotFoundError:
        return
    boot = boot_id()
    for name in [*names, *leftovers]:
        if name.startswith(".") and _boot_of(name[1:]) == boot:
            continue            # a creation under way in this boot
        try:
            os.unlink(os.path.join(where, name))
        except (FileNotFoundError, IsADirectoryError):
            pass                # gone, or not a mark (someone's directory)
    fsync_directory(where)
