"""LocalSegments: the segments of a log as files NNNNNNNNNNNNNNNN.seg in one directory.

Segments are regular files, created with the store's file mode (0600 unless the store is
shared: see snapstore.engine.storedir). Anything else named like a segment (a directory, a
FIFO, a symlink...) is damage: listing, sizing, reading or appending to it raises
not_a_segment() (CorruptionError naming the file); nothing is ever opened through a symlink
or blocks on a FIFO.
"""
from __future__ import annotations

import os
import stat
from typing import Sequence

from snapstore import _native as native
from snapstore.engine import format as fmt
from snapstore.engine.backends.base import (SegmentBackend, SegmentFile, SegmentReader,
                                            missing_segment, not_a_segment, segment_name,
                                            segment_number)
from snapstore.engine.fsutil import (DEFAULT_FILE_MODE, NotRegularFile, file_kind,
                                     fsync_directory, open_regular, pread_into)

_IOV_MAX = 1024

def _path(directory: str, number: int) -> str:
    return os.path.join(directory, segment_name(number))


def _open(directory: str, number: int, flags: int, mode: int = DEFAULT_FILE_MODE) -> int:
    """A descriptor of segment `number`; not_a_segment() if it is not a regular file."""
    try:
        return open_regular(_path(directory, number), flags, mode)
    except NotRegularFile as exc:
        raise not_a_segment(number, exc.kind) from None


class _LocalSegmentFile(SegmentFile):
    def __init__(self, number: int, fd: int) -> None:
        self._number, self._fd = number, fd
        self._size = os.lseek(fd, 0, os.SEEK_END)

    @property
    def number(self) -> int:
        return self._number

    @property
    def size(self) -> int:
        return self._size

    def _open_fd(self) -> int:
        if self._fd < 0:
            raise ValueError(f"segment file {segment_name(self._number)} is closed")
        return self._fd

    def append(self, parts: Sequence) -> None:
        fd = self._open_fd()
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        try:
            while views:
                n = os.writev(fd, views[:_IOV_MAX])
                self._size += n         # counted as it lands: a later failure leaves it right
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if views and n:
                    views[0] = views[0][n:]
        finally:
            self._size = os.lseek(fd, 0, os.SEEK_CUR)

    def sync(self) -> None:
        os.fdatasync(self._open_fd())

    def start_writeback(self, offset: int, length: int) -> None:
        if length <= 0:
            return
        try:
            native.start_writeback(self._open_fd(), offset, length)
        except OSError:
            pass            # only a hint: sync() reports what matters

    def truncate(self, size: int) -> None:
        fd = self._open_fd()
        if not 0 <= size <= self._size:
            raise ValueError(f"cannot truncate segment {segment_name(self._number)} of "
                             f"{self._size} bytes to {size}")
        os.ftruncate(fd, size)
        os.lseek(fd, size, os.SEEK_SET)
        self._size = size

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class _LocalSegmentReader(SegmentReader):
    """Descriptors opened on first use and closed with the session, so a removed segment's
    space returns to the file system as soon as the sessions reading it end."""

    def __init__(self, directory: str) -> None:
        self._directory = directory
        self._fds: dict[int, int] | None = {}

    def _fd(self, number: int) -> int:
        if self._fds is None:
            raise ValueError("read session is closed")
        fd = self._fds.get(number)
        if fd is None:
            try:
                fd = _open(self._directory, number, os.O_RDONLY)
            except FileNotFoundError:
                raise missing_segment(number) from None
            self._fds[number] = fd
        return fd

    def read(self, number: int, offset: int, length: int) -> bytes:
        return os.pread(self._fd(number), length, offset)

    def read_into(self, number: int, offset: int, buf) -> int:
        return pread_into(self._fd(number), buf, offset)

    def close(self) -> None:
        fds, self._fds = self._fds, None
        for fd in (fds or {}).values():
            os.close(fd)


class LocalSegments(SegmentBackend):
    """Segments as files in one directory (which must exist), created with permission bits
    file_mode."""

    def __init__(self, directory: str, durable: bool = True,
                 file_mode: int = DEFAULT_FILE_MODE) -> None:
        self._directory = directory
        self._durable = bool(durable)
        self._file_mode = file_mode

    @property
    def durable(self) -> bool:
        return self._durable

    def list(self) -> list[int]:
        numbers = []
        with os.scandir(self._directory) as entries:
            for entry in entries:
                number = segment_number(entry.name)     # other files are not the store's
                if number is not None:
                    if not entry.is_file(follow_symlinks=False):
                        raise not_a_segment(number, file_kind(
                            entry.stat(follow_symlinks=False).st_mode))
                    numbers.append(number)
        return sorted(numbers)

    def size(self, number: int) -> int:
        st = os.lstat(_path(self._directory, number))
        if not stat.S_ISREG(st.st_mode):
            raise not_a_segment(number, file_kind(st.st_mode))
        return st.st_size

    def open_reader(self) -> _LocalSegmentReader:
        return _LocalSegmentReader(self._directory)

    def create(self, number: int) -> _LocalSegmentFile:
        fd = _open(self._directory, number, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                   self._file_mode)
        return _LocalSegmentFile(number, fd)

    def open_append(self, number: int) -> _LocalSegmentFile:
        return _LocalSegmentFile(number, _open(self._directory, number, os.O_WRONLY))

    def remove(self, number: int) -> None:
        try:
            os.unlink(_path(self._directory, number))
        except FileNotFoundError:
            pass

    def sync_directory(self) -> None:
        fsync_directory(self._directory)

    def close(self) -> None:
        pass
