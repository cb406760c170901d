"""The storage-backend contract: where the segments of the write-ahead log live.

Three roles, kept apart so that one backend may serve them from different places:

  SegmentBackend  the catalog of segments (list, size, remove, sync_directory) and the factory
                  of the other two;
  SegmentFile     one segment open for appending (append, sync, truncate, close);
  SegmentReader   a read session: ranged reads of any segment (read, close), a context manager.

A segment is a numbered byte string (numbers are positive ints; `segment_name` is how messages
and files name them). A backend knows nothing of what is inside: the log (snapstore.engine.wal)
writes the segment header and the records, and validates everything it reads back.

Sealed segments. Only the newest segment is ever written. Once the log has created segment n+1,
segments up to n are sealed: the log never appends to them again, so the bytes of their records
never change until the segment is removed. (One exception, invisible to readers: the log's
rollback of records nobody has committed removes the segments it created and cuts the previous
one back to where the records began; that one is then the newest again.) Readers may therefore
cache what they read, and a backend may move a sealed segment elsewhere whole (an object store:
upload it once a newer one exists, then serve ranged reads of it).

Durability. No method syncs implicitly. `SegmentFile.sync()` always makes that segment's bytes
durable and `sync_directory()` always makes earlier creates and removes durable; *whether* to
call them is the log's policy, which follows `durable` (the store's durability setting: the
Store configures the backend, and the log reads it from there).

Errors. Backends raise OSError as the OS (or the remote service, mapped to OSError) reports it
(FileExistsError, FileNotFoundError, ENOSPC, EIO...) and never StoreIOError: the writing side
of the log (wal.SegmentLog) turns OSError into StoreIOError, the Store does so for what
recovery and compaction let through, and the chunk reader (snapstore.engine.chunks) turns a
failed read of a chunk record into CorruptionError naming segment and offset. The errors a
backend raises itself: a read session asked for a segment that does not exist raises
`missing_segment(number)`, a CorruptionError naming it (readers only read segments the index
or a listing named, so a missing one is damage or a concurrent compaction's removal); and a
segment that exists but is not a segment at all (locally: a directory, FIFO, device or
symlink named like one) raises `not_a_segment(number, kind)`, a CorruptionError naming it,
from every method that meets it (list, size, read, open_append, create).
Caller errors (truncating past the end, using a closed file or session) raise ValueError.

Concurrency. A backend is shared by the threads of one process (readers, its writers, the
asynchronous checkpoint worker): its methods must be thread-safe. A SegmentFile or a
SegmentReader is used by one thread at a time. Other processes read the same segments and
append to segments of their own (each writer's log is a number range of its own: format 3,
docs/design.md "Many writers"); `create` of an existing segment fails, which is what keeps two
writers from sharing one. A segment removed by compaction stays readable through a session
that already read it (local files: the open descriptor keeps it alive).

Extending. An object-store backend implements the same three classes (sealed segments whole
objects read by range; the open segment a local file uploaded when sealed).
"""
from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from typing import Iterator, Sequence

from snapstore.engine import format as fmt
from snapstore.errors import CorruptionError


def segment_name(number: int) -> str:
    """The name of segment `number` in messages and errors (and the local backend's file name)."""
    return f"{number:016d}{fmt.SEGMENT_SUFFIX}"


def missing_segment(number: int) -> CorruptionError:
    """The error a read session raises for a segment that does not exist."""
    return CorruptionError("segment file is missing", segment=segment_name(number))


def not_a_segment(number: int, kind: str) -> CorruptionError:
    """The error for an entry named like segment `number` that is not one (kind: what it is,
    e.g. "a directory", "a FIFO", "a symbolic link")."""
    return CorruptionError(f"segment file is {kind}, not a regular file",
                           segment=segment_name(number))


class SegmentReader(ABC):
    """A read session: ranged reads of any segment, for one operation (a restore, a read, a
    scan, a verify). It may keep the segments it has read open until closed, so use it as a
    context manager: such a segment keeps serving the session even if removed meanwhile, and
    its space is freed when the session ends."""

    @abstractmethod
    def read(self, number: int, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of segment `number`: exactly `length` of them, or
        fewer when the segment ends first (none at or past its end). Sees every append that
        returned. Read-only: never changes a
        segment. Raises missing_segment(number) (CorruptionError) when the segment does not
        exist, OSError when reading fails, ValueError after close()."""

    def read_into(self, number: int, offset: int, buf) -> int:
        """Reads bytes [offset, offset + len(buf)) of segment `number` into the writable
        buffer buf, as read() would return them, and returns how many (fewer when the segment
        ends first). The same errors as read(). The default copies what read() returns; a
        backend that can read into place overrides it (one copy less on a restore's path)."""
        data = self.read(number, offset, len(buf))
        memoryview(buf)[:len(data)] = data
        return len(data)

    @contextlib.contextmanager
    def read_pieces(self, number: int, offset: int, buf) -> Iterator[list]:
        """Bytes [offset, offset + len(buf)) of segment `number` (fewer when the segment ends
        first), for use inside the with block only: [(segment offset, read-only-use view),
        ...], back to back from `offset`. The default reads them into buf (read_into): one
        piece. A backend that holds the bytes in memory already (an object store's block
        cache) may yield views of that memory instead, with no copy, valid until the block
        ends (they must not be used after it); buf then holds only what it had to read. The
        same errors as read()."""
        view = memoryview(buf).cast("B")
        n = self.read_into(number, offset, view)
        yield [(offset, view[:n])]

    def prefetch(self, ranges) -> None:
        """A hint: the session will read these (segment, offset, length) ranges soon, in
        about this order (an iterable, maybe lazy: iterated at most once, during the call).
        A backend whose reads are slow one at a time (an object store) starts fetching them
        in parallel; reads then wait only for what they need. Never raises: a failed fetch
        is retried, or reported, by the read that needs it. The default does nothing (local
        files, which then never iterate the ranges)."""

    @abstractmethod
    def close(self) -> None:
        """Ends the session and releases what it holds. Idempotent."""

    def __enter__(self) -> "SegmentReader":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class SegmentFile(ABC):
    """A segment open for appending: the newest segment, owned by the log's one writer."""

    @property
    @abstractmethod
    def number(self) -> int:
        """The segment's number."""

    @property
    @abstractmethod
    def size(self) -> int:
        """The segment's size in bytes: where the next append lands. Exact after a failed
        append too (it counts the bytes that did land), so truncate(earlier size) repairs."""

    @abstractmethod
    def append(self, parts: Sequence) -> None:
        """Writes the bytes-like `parts`, in order, at the end of the segment (not yet
        durable: see sync). On OSError a prefix of the bytes may have landed; `size` says
        how much. Raises ValueError after close()."""

    @abstractmethod
    def sync(self) -> None:
        """Makes every byte appended so far, and the size after a truncate, durable: when it
        returns, a power cut loses none of them. Always syncs (the log decides when to call
        it). Raises OSError (after a failed sync nothing since the last good one can be
        trusted), ValueError after close()."""

    def start_writeback(self, offset: int, length: int) -> None:
        """A hint: start writing bytes [offset, offset + length) to the device now, without
        waiting, so a later sync() has less left to wait for. Durability still comes only
        from sync(). Default: nothing."""

    @abstractmethod
    def truncate(self, size: int) -> None:
        """Cuts the segment to `size` bytes (at most the current size: it never grows); the
        next append lands there. Not durable until sync(). Raises ValueError for a size past
        the end or after close(), OSError when the cut fails."""

    @abstractmethod
    def close(self) -> None:
        """Closes the file without syncing it. Idempotent."""

    def __enter__(self) -> "SegmentFile":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


class SegmentBackend(ABC):
    """Where the segments of one log live. Offsets are byte offsets inside one segment."""

    @property
    @abstractmethod
    def durable(self) -> bool:
        """The store's durability setting ("fsync": True), which the log follows when it
        decides to sync. The backend itself never syncs unless asked."""

    @abstractmethod
    def list(self) -> list[int]:
        """The numbers of the existing segments, ascending. Raises not_a_segment() for an
        entry named like a segment that is not one, OSError."""

    @abstractmethod
    def size(self, number: int) -> int:
        """The size in bytes of segment `number`, counting every append that returned (also
        while the segment is open). Raises FileNotFoundError (an OSError) when it does not
        exist, not_a_segment() when it is not a segment, OSError when asking fails."""

    def sizes(self) -> dict[int, int]:
        """{number: size} of the existing segments. One listed that is gone when its size is
        asked is left out: with many writers a segment may vanish at any moment (a writer
        rolling back the segments of a commit that lost its race, a recovery removing a torn
        one), which is no error for a total or a listing."""
        out = {}
        for number in self.list():
            try:
                out[number] = self.size(number)
            except FileNotFoundError:
                continue
        return out

    @abstractmethod
    def open_reader(self) -> SegmentReader:
        """A new read session (see SegmentReader). Opening it does no I/O."""

    @abstractmethod
    def create(self, number: int) -> SegmentFile:
        """Creates segment `number`, empty (size 0), and opens it for appending. It is listed
        from now on, durably so after sync_directory(). Raises FileExistsError when the
        segment exists (never touching it), OSError when creating fails."""

    @abstractmethod
    def open_append(self, number: int) -> SegmentFile:
        """Opens the existing segment `number` (the newest: see the module docstring) for
        appending at its end. Raises FileNotFoundError when it does not exist, OSError."""

    def sync_segment(self, number: int) -> bool:
        """Makes the bytes segment `number` holds durable (one another writer appended to:
        see Committer.sync_other_logs); False when it does not exist (removed meanwhile).
        Raises OSError."""
        try:
            f = self.open_append(number)
        except FileNotFoundError:
            return False
        with f:
            f.sync()
        return True

    @abstractmethod
    def remove(self, number: int) -> None:
        """Removes segment `number`: it is no longer listed, and its space is freed once the
        read sessions that have it open end. Durable after sync_directory(). Idempotent:
        removing a segment that does not exist does nothing. Raises OSError when removing
        fails."""

    @abstractmethod
    def sync_directory(self) -> None:
        """Makes every create() and remove() that returned before it durable (a power cut
        does not bring back a removed segment nor lose a created one). Idempotent; always
        syncs. Raises OSError."""

    @abstractmethod
    def close(self) -> None:
        """Releases the backend's own resources (files and sessions opened from it are closed
        by their owners). Idempotent."""

    def forget_cached(self, number: int) -> bool:
        """Drops what the backend keeps of segment `number` besides the segment itself (a
        copy of the bytes in a local cache), after a read of it failed its checksums: True
        when it did, so reading again fetches the bytes anew; False when the bytes read are
        the segment's own (a local file: nothing to fetch again). Idempotent."""
        return False


def segment_number(name: str | None) -> int | None:
    """segment_name's inverse (None for anything else: "7.seg", "².seg" and other names that
    are not exactly a segment's are no segment): the segment a file or a CorruptionError's
    `segment` names."""
    if not isinstance(name, str) or not name.endswith(fmt.SEGMENT_SUFFIX):
        return None
    stem = name[:-len(fmt.SEGMENT_SUFFIX)]
    if not (stem.isascii() and stem.isdigit()):
        return None
    number = int(stem)
    return number if segment_name(number) == name else None
