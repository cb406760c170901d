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
RUN_BLOCKS = 16         # a prefetch reads up to this many neighbouring blocks in one GET


class BlockCache:
    """fetch(number, offset, length) -> bytes reads the bucket (fewer bytes at the end)."""

    def __init__(self, directory: str, fetch: Callable[[int, int, int], bytes],
                 file_mode: int = 0o600, limit: int | None = None) -> None:
        self.dir = directory
        self.fetch = fetch
        self.file_mode = file_mode
        self.limit = layout.cache_limit() if limit is None else limit
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: dict = {}            # (segment, block) -> Future of its prefetch
        self._lock = threading.Lock()
        self._bytes = self._scan()[0]

    def _scan(self) -> tuple[int, list]:
        """(total bytes, [(mtime, size, path)]) of the cached files."""
        total, files = 0, []
        try:
            with os.scandir(self.dir) as entries:
                for e in entries:
                    if e.name.endswith(".part"):
                        continue
                    try:
                        st = e.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_size
                    files.append((st.st_mtime, st.st_size, e.path))
        except OSError:
            pass
        return total, files

    def _grew(self, n: int) -> None:
        """Counts n new cached bytes; past the limit, the oldest files go until the cache is
        at 80% of it (another process sharing the cache may have added some: rescanned)."""
        with self._lock:
            self._bytes += n
            if self._bytes <= self.limit:
                return
        total, files = self._scan()
        files.sort()
        for _, size, path in files:
            if total <= self.limit * 0.8:
                break
            try:
                os.unlink(path)
                total -= size
            except OSError:
                pass
        with self._lock:
            self._bytes = total

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
        self._grew(len(data))

    def adopt(self, number: int, path: str) -> None:
        """Takes a complete local copy of segment `number` (just uploaded) into the cache."""
        size = os.path.getsize(path)
        os.replace(path, self.whole_path(number))
        self._grew(size)

    def _block(self, number: int, block: int, lo: int, hi: int) -> tuple[bytes, bool]:
        """Bytes [lo, hi) of the block, and whether the block is the segment's last."""
        path = self._block_path(number, block)
        with self._lock:
            pending = self._inflight.get((number, block))
        if pending is not None:
            try:
                pending.result()        # a prefetch is fetching it: wait for that one
            except Exception:
                pass                    # fetched again below; its error is reported there
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            data = self._fetch_block(number, block)
            return data[lo:hi], len(data) < layout.CACHE_BLOCK
        try:
            last = os.fstat(fd).st_size < layout.CACHE_BLOCK
            return os.pread(fd, hi - lo, lo), last
        finally:
            os.close(fd)

    def _fetch_block(self, number: int, block: int) -> bytes:
        data = self.fetch(number, block * layout.CACHE_BLOCK, layout.CACHE_BLOCK)
        try:
            self._write(self._block_path(number, block), data)
        except OSError:
            pass                # a cache that cannot be written is only slower
        return data

    def _prefetched(self, number: int, first: int, count: int) -> None:
        """Fetches blocks first .. first + count - 1 of a segment with one ranged GET."""
        B = layout.CACHE_BLOCK
        try:
            data = self.fetch(number, first * B, count * B)
            for i in range(count):
                piece = data[i * B:(i + 1) * B]
                if not piece:
                    break               # past the segment's end
                path = self._block_path(number, first + i)
                if not os.path.exists(path):
                    try:
                        self._write(path, piece)
                    except OSError:
                        pass
        finally:
            with self._lock:
                for i in range(count):
                    self._inflight.pop((number, first + i), None)

    def read(self, number: int, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of remote segment `number` (fewer at its end)."""
        if length <= 0:
            return b""
        try:
            fd = os.open(self.whole_path(number), os.O_RDONLY)
        except FileNotFoundError:
            pass
        else:
            try:
                return os.pread(fd, length, offset)
            finally:
                os.close(fd)
        B = layout.CACHE_BLOCK
        first, last = offset // B, (offset + length - 1) // B
        parts = []
        for block in range(first, last + 1):
            lo = offset - block * B if block == first else 0
            hi = min(B, offset + length - block * B)
            data, at_end = self._block(number, block, lo, hi)
            parts.append(data)
            if at_end:
                break               # the segment ends in this block
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def prefetch(self, ranges: Iterable[tuple[int, int, int]]) -> None:
        """Starts fetching, in parallel and in order, the blocks of (segment, offset, length)
        ranges not cached yet; returns at once. A read of a block being fetched waits for
        it (and fetches it itself if that failed)."""
        B = layout.CACHE_BLOCK
        wanted: dict = {}
        whole: dict = {}
        for number, offset, length in ranges:
            if length <= 0:
                continue
            if number not in whole:
                whole[number] = os.path.exists(self.whole_path(number))
            if whole[number]:
                continue
            for block in range(offset // B, (offset + length - 1) // B + 1):
                wanted[(number, block)] = None
        with self._lock:
            todo = [w for w in wanted if w not in self._inflight]
            todo = [w for w in todo if not os.path.exists(self._block_path(*w))]
            if not todo:
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(FETCH_THREADS, "snapstore-fetch")
            runs: list = []         # neighbouring blocks: one GET of up to RUN_BLOCKS
            for number, block in todo:
                if runs and runs[-1][0] == number and runs[-1][1] + runs[-1][2] == block \
                        and runs[-1][2] < RUN_BLOCKS:
                    runs[-1][2] += 1
                else:
                    runs.append([number, block, 1])
            for number, first, count in runs:
                future = self._pool.submit(self._prefetched, number, first, count)
                for i in range(count):
                    self._inflight[(number, first + i)] = future

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
