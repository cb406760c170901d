"""FaultyBackend: the segment backend contract (snapstore.engine.backends.base) implemented
around LocalSegments, with faults that can be armed per operation. Unarmed it passes every call
through unchanged (the backend conformance suite runs it that way); armed, the nth call of an
operation raises OSError(err) -- or, for a write, lands a prefix and then raises, as a disk
that fills up mid-write does.

Used by tests/unit/test_store_faults.py and tests/unit/test_backend_contract.py.
"""
from __future__ import annotations

import errno
import os
import threading

from snapstore.engine.backends import LocalSegments, SegmentBackend, SegmentFile, SegmentReader


class FaultyFile(SegmentFile):
    """A segment file of FaultyBackend: faults before delegating to the real file."""

    def __init__(self, inner: SegmentFile, backend: "FaultyBackend") -> None:
        self.inner, self.backend = inner, backend

    @property
    def number(self) -> int:
        return self.inner.number

    @property
    def size(self) -> int:
        return self.inner.size

    def append(self, parts) -> None:
        fault = self.backend.hit("write")
        if fault is None:
            return self.inner.append(parts)
        err, partial = fault
        if not partial:
            raise OSError(err, os.strerror(err))
        # What the kernel does on a disk that fills up mid-write: the first writev() writes a
        # prefix and returns a short count, the retry fails with the error. (The wrapped
        # LocalSegments writes with os.writev: this exercises its handling of short writes.)
        real, calls = os.writev, []

        def short_writev(fd, bufs):
            calls.append(fd)
            if len(calls) == 1:
                flat = b"".join(bytes(b) for b in bufs)
                return real(fd, [flat[:max(1, int(len(flat) * partial))]])
            raise OSError(err, os.strerror(err))
        os.writev = short_writev
        try:
            self.inner.append(parts)
        finally:
            os.writev = real

    def sync(self) -> None:
        self.backend.raise_if("sync")
        self.inner.sync()

    def start_writeback(self, offset: int, length: int) -> None:
        self.inner.start_writeback(offset, length)

    def truncate(self, size: int) -> None:
        self.backend.raise_if("truncate")
        self.inner.truncate(size)

    def close(self) -> None:
        self.inner.close()


class FaultyReader(SegmentReader):
    """A read session of FaultyBackend."""

    def __init__(self, inner: SegmentReader, backend: "FaultyBackend") -> None:
        self.inner, self.backend = inner, backend

    def read(self, number, offset, length):
        self.backend.raise_if("read")
        return self.inner.read(number, offset, length)

    def close(self) -> None:
        self.inner.close()


class FaultyBackend(SegmentBackend):
    """LocalSegments with armed faults: fail(op, nth) makes the nth next call of op raise
    OSError(err). ops: write, sync, truncate (segment files), create, open_append, remove,
    read (read sessions), sync_directory. Unarmed, every call passes through unchanged."""

    def __init__(self, directory: str, durable: bool = True) -> None:
        self.inner = LocalSegments(directory, durable=durable)
        self.armed: dict[str, list] = {}
        self.fired: list[str] = []
        self.fired_in: list[str] = []       # the name of the thread each fault fired in

    def fail(self, op: str, nth: int = 1, err: int = errno.ENOSPC, partial: float = 0.0,
             repeat: bool = False) -> None:
        self.armed[op] = [nth, err, partial, repeat]

    def clear(self) -> None:
        self.armed.clear()

    def hit(self, op: str):
        a = self.armed.get(op)
        if a is None:
            return None
        a[0] -= 1
        if a[0] > 0:
            return None
        if not a[3]:
            del self.armed[op]
        self.fired.append(op)
        self.fired_in.append(threading.current_thread().name)
        return a[1], a[2]

    def raise_if(self, op: str) -> None:
        fault = self.hit(op)
        if fault is not None:
            raise OSError(fault[0], os.strerror(fault[0]))

    @property
    def durable(self) -> bool:
        return self.inner.durable

    def list(self):
        return self.inner.list()

    def size(self, number):
        return self.inner.size(number)

    def open_reader(self):
        return FaultyReader(self.inner.open_reader(), self)

    def create(self, number):
        self.raise_if("create")
        return FaultyFile(self.inner.create(number), self)

    def open_append(self, number):
        self.raise_if("open_append")
        return FaultyFile(self.inner.open_append(number), self)

    def remove(self, number):
        self.raise_if("remove")
        self.inner.remove(number)

    def sync_directory(self):
        self.raise_if("sync_directory")
        self.inner.sync_directory()

    def close(self):
        self.inner.close()
