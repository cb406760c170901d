"""Replacing a store's index directory by a new one, crash-safely: the one mechanism repair
(an index rebuilt from the log) and compaction (a compacting copy of the index) share.

    STORE/index        the index (LMDB: data.mdb, lock.mdb)
    STORE/.index.new   format.INDEX_REBUILD_DIR: where the new index is built, complete and
                       synced before swap_in; after an exchange, the old index until removed
    STORE/.index.old   format.INDEX_OLD_DIR: the old index between the two renames of the
                       fallback, until removed

swap_in exchanges the new directory with index/ in one atomic renameat2(RENAME_EXCHANGE), each
step made durable by a directory fsync, then removes the old one: a crash at any moment leaves
the old or the new index in index/, plus a left-over directory. Where the exchange is
unsupported, two renames (index/ -> .index.old, .index.new -> index/): a crash between them
leaves no index/ but .index.old and a complete .index.new, which recover_swap() (run by the
store's open and by repair, holding the store lock exclusively) renames into place. Only the
holder of the store lock exclusively, or of the maintenance lock exclusively (compaction;
leftovers beside a complete index/), swaps, builds in .index.new or runs recover_swap, so
none of them races another.

Processes (and Index objects) that have the old index open keep a consistent snapshot of it
and notice the replacement at their next transaction (index.py: the data file's identity).

Crash points: index_swap_exchanged (the exchange is durable, the old index not yet removed),
index_swap_renamed_old (fallback: index/ renamed away, the new one not yet in place).
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import stat
import time

from snapstore.engine import format as fmt
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.fsutil import fsync_directory

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def staging_dir(path: str) -> str:
    """Where a new index of the store at `path` is built before swap_in."""
    return os.path.join(path, fmt.INDEX_REBUILD_DIR)


def exchange(a: str, b: str) -> bool:
    """Atomically exchanges the directory entries a and b (renameat2 RENAME_EXCHANGE). False
    when the system or file system does not support it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                          ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), a)


def swap_in(path: str, new_dir: str) -> None:
    """Makes new_dir (complete and synced) the store's index: exchanged with the old one
    atomically where possible, each step made durable by a directory fsync; then the old one
    is removed. Raises OSError."""
    index_dir = os.path.join(path, fmt.INDEX_DIR)
    old_dir = os.path.join(path, fmt.INDEX_OLD_DIR)
    if os.path.lexists(index_dir):
        if exchange(new_dir, index_dir):
            fsync_directory(path)
            crashpoint("index_swap_exchanged")
            remove_entry(new_dir)           # the old index, now under the new one's name
            return
        os.rename(index_dir, old_dir)
        fsync_directory(path)
        crashpoint("index_swap_renamed_old")
    os.rename(new_dir, index_dir)
    fsync_directory(path)
    remove_entry(old_dir)


def recover_swap(path: str) -> bool:
    """Finishes or cleans up after a swap a crash interrupted; the caller keeps every other
    swapper out (the store lock exclusively, or the maintenance lock exclusively when index/
    is in place). No index/ but a .index.old: the fallback's first rename happened, which it does
    only once .index.new is complete, so the second rename is done now (or, without a
    .index.new, the old index is put back). Then, with an index/ in place, what is left in
    .index.new (an unfinished build, or the old index after an exchange) and .index.old is
    removed. Without index/ and .index.old nothing is touched: index/ was missing before,
    and a .index.new may be an unfinished rebuild (run repair). Returns whether index/ was
    put back in place. Raises OSError."""
    index_dir = os.path.join(path, fmt.INDEX_DIR)
    new_dir = staging_dir(path)
    old_dir = os.path.join(path, fmt.INDEX_OLD_DIR)
    restored = False
    if not os.path.lexists(index_dir):
        if not _is_dir(old_dir):
            return False
        os.rename(new_dir if _is_dir(new_dir) else old_dir, index_dir)
        fsync_directory(path)
        restored = True
    remove_entry(new_dir)
    remove_entry(old_dir)
    return restored


def index_to_read(index_dir: str) -> str:
    """Where a reader opens the index whose place is index_dir (STORE/index): index_dir, or,
    while the fallback's second rename is pending (no index/, a .index.old and a .index.new
    beside it: a swap under way, or one a crash cut between its renames, which only a writer's
    open or repair finishes), the complete new index in .index.new. Its data file is the one
    the second rename puts in index/, so a reader of it moves on from it only when index/
    holds another one (index.py compares the data file's identity)."""
    if os.path.lexists(index_dir):
        return index_dir
    store = os.path.dirname(index_dir)
    new_dir = staging_dir(store)
    if _is_dir(os.path.join(store, fmt.INDEX_OLD_DIR)) and _is_dir(new_dir):
        return new_dir
    return index_dir


SWAP_LOOKS = 10              # how many times an opener looks for an index a swap may be moving
_LOOK_PAUSE_SECONDS = 0.001


def looks_across_a_swap():
    """For an opener that finds no index where it looks: yields SWAP_LOOKS times (True the
    last time), pausing a moment between. A fallback swap's two renames in another process
    may come between any two of the opener's looks, so a missing index is only reported once
    every look missed it."""
    for look in range(SWAP_LOOKS):
        if look:
            time.sleep(_LOOK_PAUSE_SECONDS)
        yield look == SWAP_LOOKS - 1


def leftovers(path: str) -> bool:
    """Whether .index.new or .index.old is there (a swap under way or interrupted)."""
    return any(os.path.lexists(os.path.join(path, name))
               for name in (fmt.INDEX_REBUILD_DIR, fmt.INDEX_OLD_DIR))


def _is_dir(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


def remove_entry(path: str) -> None:
    """Removes whatever is at path (a directory tree, a file, a FIFO, a symlink: never what a
    symlink points at)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
