"""The local cache of remote segment bytes (cache_dir/ranges): whole segments this machine
uploaded, and blocks (layout.CACHE_BLOCK bytes, aligned) of others it has read.

Files are written to a temporary name and renamed, so a reader sees a whole block or none.
Segments are immutable, so a cached block never goes stale; a damaged one is found by the
record checksums above it and dropped (drop()) so the next read fetches it again.
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from snapstore.engine.backends.base import segment_name
from snapstore.remote import layout

FETCH_THREADS = 8


class BlockCache:
    """fetch(number, offset, length) -> bytes reads the bucket (fewer bytes at the end)."""

    def __init__(self, directory: str, fetch: Callable[[int, int, int], bytes],
                 file_mode: int = 0o600) -> None:
        self.dir = directory
        self.fetch = fetch
        self.file_mode = file_mode
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def whole_path(self, number: int) -> str:
        return os.path.join(self.dir, segment_name(number))

    def _block_path(self, number: int, block: int) -> str:
        return os.path.join(self.dir, f"{segment_name(number)}.{block}")

    def _write(self, path: str, data: bytes) -> None:
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.part"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)

    def adopt(self, number: int, path: str) -> None:
        """Takes a complete local copy of segment `number` (just uploaded) into the cache."""
        os.replace(path, self.whole_path(number))

    def _block(self, number: int, block: int) -> bytes:
        path = self._block_path(number, block)
        try:
            with open(path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            pass
        data = self.fetch(number, block * layout.CACHE_BLOCK, layout.CACHE_BLOCK)
        try:
            self._write(path, data)
        except OSError:
            pass                # a cache that cannot be written is only slower
        return data

    def read(self, number: int, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of remote segment `number` (fewer at its end)."""
        try:
            with open(self.whole_path(number), "rb") as f:
                return os.pread(f.fileno(), length, offset)
        except FileNotFoundError:
            pass
        if length <= 0:
            return b""
        B = layout.CACHE_BLOCK
        first, last = offset // B, (offset + length - 1) // B
        parts = []
        for block in range(first, last + 1):
            data = self._block(number, block)
            lo = offset - block * B if block == first else 0
            hi = min(len(data), offset + length - block * B)
            parts.append(data[lo:hi])
            if len(data) < B:
                break               # the segment ends in this block
        return b"".join(parts)

    def prefetch(self, ranges: Iterable[tuple[int, int, int]]) -> None:
        """Fetches the blocks of (segment, offset, length) ranges not cached yet, in parallel."""
        B = layout.CACHE_BLOCK
        wanted = set()
        for number, offset, length in ranges:
            if length <= 0 or os.path.exists(self.whole_path(number)):
                continue
            for block in range(offset // B, (offset + length - 1) // B + 1):
                wanted.add((number, block))
        todo = [w for w in sorted(wanted) if not os.path.exists(self._block_path(*w))]
        if len(todo) <= 1:
            return
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(FETCH_THREADS, "snapstore-fetch")
            pool = self._pool
        for f in [pool.submit(self._block, n, b) for n, b in todo]:
            f.result()

    def drop(self, number: int) -> None:
        """Forgets every cached byte of segment `number` (found damaged)."""
        prefix = segment_name(number)
        for name in os.listdir(self.dir):
            if name == prefix or name.startswith(prefix + "."):
                try:
                    os.unlink(os.path.join(self.dir, name))
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
