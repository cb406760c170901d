"""A power-cut model for tests: every fsync/fdatasync a process makes through Python's os
module is journaled (the file, its size at the sync), so a copy of a store can be made as a
power cut could leave it: each segment file cut back to its last synced size (a segment
never synced: to nothing). The LMDB index is copied as it is (with durability "fsync" LMDB
syncs every transaction itself; with "none" the copy is the worst case: an index that
reached the disk while the log did not).

install(journal) in a test process (undo with the returned function) or in a child, before
it opens anything: `import fsync_journal; fsync_journal.install(path)`."""
from __future__ import annotations

import os
import shutil
from typing import Callable


def install(journal: str) -> Callable[[], None]:
    """Journals this process's os.fsync / os.fdatasync into the file `journal`; returns a
    function that removes the journaling again."""
    real = os.fsync, os.fdatasync

    def record(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        with open(journal, "a") as f:
            f.write(f"{path}\t{os.fstat(fd).st_size}\n")

    def fsync(fd):
        real[0](fd)
        record(fd if isinstance(fd, int) else fd.fileno())

    def fdatasync(fd):
        real[1](fd)
        record(fd if isinstance(fd, int) else fd.fileno())

    os.fsync, os.fdatasync = fsync, fdatasync

    def uninstall() -> None:
        os.fsync, os.fdatasync = real
    return uninstall


def synced_sizes(journal: str) -> dict[str, int]:
    """{path: its size at its last sync}."""
    sizes: dict[str, int] = {}
    if os.path.exists(journal):
        with open(journal) as f:
            for line in f:
                path, size = line.rstrip("\n").rsplit("\t", 1)
                sizes[path] = int(size)
    return sizes


def power_cut_copy(store: str, dest: str, journal: str) -> dict[str, tuple[int, int]]:
    """Copies store to dest as a power cut could leave it (see the module docstring);
    returns {segment file name: (its size, the size kept)}."""
    shutil.copytree(store, dest)
    sizes = synced_sizes(journal)
    cut = {}
    segments = os.path.realpath(os.path.join(store, "segments"))
    for name in sorted(os.listdir(segments)):
        now = os.path.getsize(os.path.join(segments, name))
        keep = min(now, sizes.get(os.path.join(segments, name), 0))
        os.truncate(os.path.join(dest, "segments", name), keep)
        cut[name] = (now, keep)
    return cut
