"""The local cache of remote segment bytes (cache_dir/ranges): whole segments this machine
uploaded, and blocks (layout.CACHE_BLOCK bytes, aligned; files named SEGMENT+OFFSET) of
others it has read.

Files are written to a temporary name and renamed, so a reader sees a whole block or none.
Segments are immutable, so a cached block never goes stale; a damaged one is found by the
record checksums above it and dropped (drop()) so the next read fetches it again.

A prefetch (the read path's hint) streams runs of RUN_BLOCKS blocks with one ranged GET each
(layout.fetch_threads() at a time) into reused, page-aligned block buffers. A block is handed
to its readers from memory as soon as it has arrived; its file is written after that by one
writer thread (the fetch thread goes on to its next GET; an O_DIRECT write waits for the
disk), with O_DIRECT where the file system allows (no copy into the page cache, which cost
more CPU than the download itself here), and the buffer is kept while HELD_BYTES allow, then
reused. The fetches wait while HELD_BYTES of blocks are not written yet.

The prefetch never runs more than HELD_BYTES of unread blocks ahead of the readers: a fetch
thread waits before its next GET until readers have read that far (a block is read once its
hinted bytes have been), so that a block is not dropped from memory before its reader comes
for it (it then had to be read back from its file, or fetched again). Readers that stop
coming (STALL_SECONDS without a read) end the wait, and the oldest blocks go as before.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import mmap
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

from snapstore import _native as native
from snapstore.engine.backends.base import segment_name
from snapstore.engine.fsutil import pread_into
from snapstore.engine.memory import uninit_bytearray
from snapstore.remote import layout

RUN_BLOCKS = 4          # a prefetch reads up to this many neighbouring blocks in one GET
HELD_BYTES = 64 << 20   # fetched blocks kept in memory after their files are written
STALL_SECONDS = 2.0     # readers that read nothing for this long have stopped: fetch on
DIRECT_ALIGN = 4096     # O_DIRECT writes: buffer, offset and length in multiples of this
GIL_FREE_COPY = 64 << 10    # a copy out of a held block this large runs without the GIL


def _part_name(path: str) -> str:
    """The temporary name a cache file is written under before its rename (skipped by
    _scan: it ends in .part), one per process and thread."""
    return f"{path}.{os.getpid()}.{threading.get_ident()}.part"


def fill(readinto: Callable, buf) -> int:
    """Reads into buf until it is full or the stream ends; the bytes read."""
    view, got = memoryview(buf), 0
    while got < len(view):
        n = readinto(view[got:])
        if not n:
            break
        got += n
    return got


def _count_block_bytes(blocks: dict, number: int, offset: int, length: int) -> None:
    """Adds the bytes of range [offset, offset + length) of segment `number` to the count of
    each CACHE_BLOCK block it covers: blocks[(number, block)]."""
    B = layout.CACHE_BLOCK
    end = offset + length
    first = offset // B
    if first == (end - 1) // B:             # most ranges (chunk records) lie in one block
        blocks[(number, first)] = blocks.get((number, first), 0) + length
        return
    for block in range(first, (end - 1) // B + 1):
        n = min(end, (block + 1) * B) - max(offset, block * B)
        blocks[(number, block)] = blocks.get((number, block), 0) + n


class _Held:
    """A fetched block kept in memory: its bytes (view, of buffer buf), whether its file is
    written, how many of its hinted bytes are unread, how many readers copy from it now
    (pins), and whether it was dropped (gone: recycled when the last of them is done)."""
    __slots__ = ("view", "buf", "written", "unread", "pins", "gone")

    def __init__(self, buf: mmap.mmap, n: int, unread: int) -> None:
        self.view, self.buf = memoryview(buf)[:n], buf
        self.written, self.unread, self.pins, self.gone = False, unread, 0, False


class BlockCache:
    """fetch(number, offset, length, consume) reads bytes [offset, offset + length) of a
    segment from the bucket (fewer at its end) by calling consume(readinto) once per attempt
    (readinto(buffer) -> bytes read, 0 at the end, as io.RawIOBase's) and returns what
    consume returns; an attempt that fails is retried from the start."""

    def __init__(self, directory: str, fetch: Callable, file_mode: int = 0o600,
                 limit: int | None = None) -> None:
        self.dir = directory
        self.fetch = fetch
        self._direct = hasattr(os, "O_DIRECT")   # False once the file system refused it
        self.file_mode = file_mode
        self.limit = layout.cache_limit() if limit is None else limit
        self.threads = layout.fetch_threads()
        self._spares_kept = HELD_BYTES // layout.CACHE_BLOCK + self.threads * RUN_BLOCKS
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self._pool: ThreadPoolExecutor | None = None          # the fetch threads
        self._writer: ThreadPoolExecutor | None = None        # writes fetched blocks' files
        self._inflight: dict = {}            # (segment, block) -> Future of its prefetch
        # (segment, block) -> _Held: fetched blocks served from memory, so that readers
        # never wait for (nor read back) the cache's files; see _hold
        self._held: collections.OrderedDict = collections.OrderedDict()
        self._held_bytes = 0
        self._unread_bytes = 0               # hinted bytes of held blocks not read yet
        self._unwritten_bytes = 0            # held blocks whose files are not written yet
        self._hinted: dict = {}              # (segment, block) -> hinted bytes, until held
        self._last_read = 0.0                # time.monotonic() of the last read from memory
        self._closing = False
        self._spare: list = []               # block buffers no longer held, for reuse
        self._lock = threading.Lock()
        self._consumed = threading.Condition(self._lock)    # held blocks were read, written
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
        return os.path.join(self.dir, f"{segment_name(number)}+{block * layout.CACHE_BLOCK}")

    def _write(self, path: str, data) -> None:
        tmp = _part_name(path)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, self.file_mode)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, path)
        self._grew(len(data))

    def _write_block(self, path: str, buf: mmap.mmap, n: int) -> None:
        """Writes the first n bytes of a block buffer (page-aligned, CACHE_BLOCK long) as the
        file `path`, with O_DIRECT where the file system allows it: the bytes go to the disk
        without being copied into the page cache, which costs several times the CPU of the
        download here (readers get them from memory, _hold). The length is padded to
        DIRECT_ALIGN and the file cut back to n."""
        if not self._direct:
            return self._write(path, memoryview(buf)[:n])
        tmp = _part_name(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT,
                         self.file_mode)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct = False            # e.g. tmpfs
            return self._write(path, memoryview(buf)[:n])
        try:
            view = memoryview(buf)[:-(-n // DIRECT_ALIGN) * DIRECT_ALIGN]
            done = 0
            while done < len(view):
                done += os.write(fd, view[done:])
            if done != n:
                os.ftruncate(fd, n)
        except OSError as exc:
            os.close(fd)
            os.unlink(tmp)
            if exc.errno != errno.EINVAL:
                raise
            self._direct = False
            return self._write(path, memoryview(buf)[:n])
        os.close(fd)
        os.replace(tmp, path)
        self._grew(n)

    def adopt(self, number: int, path: str) -> None:
        """Takes a complete local copy of segment `number` (just uploaded) into the cache."""
        size = os.path.getsize(path)
        os.replace(path, self.whole_path(number))
        self._grew(size)

    def _pin(self, number: int, block: int) -> "_Held | None":
        """The block held in memory, pinned (its buffer is not reused until _unpin), after
        waiting for a prefetch that is fetching it; None when it is not held."""
        with self._lock:
            pending = self._inflight.get((number, block))
        if pending is not None:
            try:
                pending.result()        # a prefetch is fetching it: wait for that one
            except Exception:
                pass                    # fetched again by the caller; its error is reported there
        with self._lock:
            held = self._held.get((number, block))
            if held is not None:
                held.pins += 1
        return held

    def _unpin(self, held: "_Held", n: int) -> None:
        """Ends a pin of _pin, counting n of the block's bytes as read."""
        with self._lock:
            held.pins -= 1
            if held.gone:
                self._recycle(held)
            else:
                self._was_read(held, n)

    def _copy_block(self, number: int, block: int, lo: int, dest: memoryview) -> tuple:
        """Copies bytes [lo, lo + len(dest)) of the block into dest: (how many, fewer at the
        segment's end; whether the block is the segment's last)."""
        held = self._pin(number, block)
        if held is not None:
            n = max(0, min(len(dest), len(held.view) - lo))     # none past the end
            try:
                if n >= GIL_FREE_COPY:
                    native.gather(held.view, [(lo, n)], dest)   # the fetch threads go on
                else:
                    dest[:n] = held.view[lo:lo + n]
                return n, len(held.view) < layout.CACHE_BLOCK
            finally:
                self._unpin(held, n)
        return self._copy_unheld(number, block, lo, dest)

    def _copy_unheld(self, number: int, block: int, lo: int, dest: memoryview) -> tuple:
        """_copy_block for a block not held in memory: from its file, else fetched now."""
        try:
            fd = os.open(self._block_path(number, block), os.O_RDONLY)
        except FileNotFoundError:
            return self._fetch_block(number, block, lo, dest)
        try:
            return pread_into(fd, dest, lo), os.fstat(fd).st_size < layout.CACHE_BLOCK
        finally:
            os.close(fd)

    def _new_buffer(self) -> mmap.mmap:
        """A page-aligned block buffer: a spare one, else new anonymous memory (fresh pages
        cost a page fault each, several microseconds in a VM: hence the reuse)."""
        with self._lock:
            if self._spare:
                return self._spare.pop()
        # private: a forked child's copy is its own (the default, MAP_SHARED, is not)
        buf = mmap.mmap(-1, layout.CACHE_BLOCK, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            pass
        return buf

    def _fetch_block(self, number: int, block: int, lo: int, dest: memoryview) -> tuple:
        """Fetches the block now, writes its file, and copies bytes [lo, lo + len(dest)) of
        it into dest straight from the block buffer: _copy_block's answer."""
        B = layout.CACHE_BLOCK

        def consume(readinto) -> tuple:
            buf = self._new_buffer()
            return buf, fill(readinto, buf)
        buf, n = self.fetch(number, block * B, B, consume)
        try:
            if n:
                self._write_block(self._block_path(number, block), buf, n)
        except OSError:
            pass                    # a cache that cannot be written is only slower
        try:
            src = memoryview(buf)[lo:min(n, lo + len(dest))]
            got = len(src)
            dest[:got] = src
            src.release()                   # before the buffer goes back to the spares
            return got, n < B
        finally:
            self._release(buf)

    def _release(self, buf: mmap.mmap) -> None:
        with self._lock:
            if len(self._spare) < self._spares_kept:
                self._spare.append(buf)

    def _prefetched(self, number: int, first: int, ready: list) -> None:
        """Fetches blocks first .. first + len(ready) - 1 of a segment with one ranged GET,
        streamed block by block into block buffers. Each block is held in memory (_hold) and
        its future in `ready` resolved as soon as it has arrived, so readers wait only for
        their own blocks, never for the disk; then the blocks' files are written. On failure
        the unresolved futures get the error (their readers then fetch themselves). The
        blocks' files are written by the writer thread (_write_run) meanwhile: a fetch thread
        goes on to its next GET instead of waiting for the disk."""
        B = layout.CACHE_BLOCK
        left = dict(enumerate(ready))           # the futures not resolved yet
        got: dict = {}                          # block -> (buffer, length): held, to write
        scratch: list = []                      # a retry re-reads blocks it has: into this

        if not self._may_fetch():
            for i in list(left):                # closing: the readers fetch for themselves
                self._resolve(number, first + i, left.pop(i), RuntimeError("cache closed"))
            return

        def consume(readinto) -> None:
            for i in range(len(ready)):
                if i in left:
                    buf = self._new_buffer()
                else:
                    if not scratch:
                        scratch.append(self._new_buffer())
                    buf = scratch[0]
                n = fill(readinto, buf)
                if i in left:
                    if n:
                        self._hold((number, first + i), buf, n)
                        got[first + i] = (buf, n)
                    self._resolve(number, first + i, left.pop(i))
                if n < B:
                    break                       # the segment ended
            for i in list(left):                # past the segment's end
                self._resolve(number, first + i, left.pop(i))
        try:
            self.fetch(number, first * B, len(ready) * B, consume)
        except BaseException as exc:
            for i in list(left):
                self._resolve(number, first + i, left.pop(i), exc)
        finally:
            for buf in scratch:
                self._release(buf)
            if got:
                with self._lock:
                    if self._writer is None:
                        self._writer = ThreadPoolExecutor(1, "snapstore-cache-write")
                    self._writer.submit(self._write_run, number, got)

    def _write_run(self, number: int, got: dict) -> None:
        """Writes the files of fetched blocks {block: (buffer, length)} (held until then)."""
        for block, (buf, n) in got.items():
            path = self._block_path(number, block)
            try:
                if not os.path.exists(path):
                    self._write_block(path, buf, n)
            except OSError:
                pass                            # only slower: read again from the bucket
            finally:
                self._written((number, block))

    def _may_fetch(self) -> bool:
        """Waits until the writer thread has written all but HELD_BYTES of the held blocks,
        and the readers have read all but HELD_BYTES of their hinted bytes or read nothing
        for STALL_SECONDS (they stopped: the wait would never end); False when the cache is
        closing."""
        with self._lock:
            while not self._closing:
                if self._unwritten_bytes >= HELD_BYTES:
                    self._consumed.wait(STALL_SECONDS)      # the writer always goes on
                    continue
                idle = time.monotonic() - self._last_read
                if self._unread_bytes < HELD_BYTES or idle >= STALL_SECONDS:
                    break
                self._consumed.wait(STALL_SECONDS - idle)
            return not self._closing

    def _hold(self, key: tuple, buf: mmap.mmap, n: int) -> None:
        """Keeps a fetched block in memory until its file is written and its hinted bytes
        were read, and after that while HELD_BYTES allow (oldest out first): see _trim.
        Unwritten blocks are bounded by _may_fetch."""
        with self._lock:
            if key in self._held:
                self._forget(key)
            unread = min(self._hinted.pop(key, 0), n)
            self._held[key] = _Held(buf, n, unread)
            self._held_bytes += n
            self._unread_bytes += unread
            self._unwritten_bytes += n

    def _was_read(self, held: "_Held", n: int) -> None:
        """Counts n bytes of a held block as read (the lock held)."""
        self._last_read = time.monotonic()
        if held.unread:
            n = min(n, held.unread)
            held.unread -= n
            self._unread_bytes -= n
            self._consumed.notify_all()
            if not held.unread:
                self._trim()

    def _written(self, key: tuple) -> None:
        with self._lock:
            held = self._held.get(key)
            if held is not None and not held.written:
                held.written = True
                self._unwritten_bytes -= len(held.view)
                self._consumed.notify_all()
            self._trim()

    def _trim(self) -> None:
        """Drops held blocks (the lock held), oldest first, while they exceed HELD_BYTES:
        those written and read; once the readers stalled (STALL_SECONDS), any written."""
        while self._held_bytes > HELD_BYTES:
            oldest = next((k for k, v in self._held.items() if v.written and not v.unread),
                          None)
            if oldest is None and (self._closing or
                                   time.monotonic() - self._last_read >= STALL_SECONDS):
                oldest = next((k for k, v in self._held.items() if v.written), None)
            if oldest is None:
                break
            self._forget(oldest)

    def _forget(self, key: tuple) -> None:
        """Drops a held block (the lock held); its buffer is recycled once no reader copies
        from it."""
        held = self._held.pop(key)
        self._held_bytes -= len(held.view)
        self._unread_bytes -= held.unread
        if not held.written:
            self._unwritten_bytes -= len(held.view)
        held.gone = True
        if not held.pins:
            self._recycle(held)

    def _recycle(self, held: "_Held") -> None:
        """A dropped block's buffer becomes a spare (the lock held), if its file was written:
        before that its writer still reads it."""
        held.view.release()
        if held.written and len(self._spare) < self._spares_kept:
            self._spare.append(held.buf)

    def _resolve(self, number: int, block: int, ready: Future, error=None) -> None:
        with self._lock:
            self._inflight.pop((number, block), None)
        if error is None:
            ready.set_result(None)
        else:
            ready.set_exception(error)

    def read(self, number: int, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of remote segment `number` (fewer at its end)."""
        if length <= 0:
            return b""
        buf = uninit_bytearray(length)
        del buf[self.read_into(number, offset, buf):]
        return bytes(buf)

    def read_into(self, number: int, offset: int, buf) -> int:
        """Reads bytes [offset, offset + len(buf)) of remote segment `number` into buf (each
        byte copied once, from a held block or a cached file); how many (fewer at its end)."""
        dest = memoryview(buf).cast("B")
        if not len(dest):
            return 0
        try:
            fd = os.open(self.whole_path(number), os.O_RDONLY)
        except FileNotFoundError:
            pass
        else:
            try:
                return pread_into(fd, dest, offset)
            finally:
                os.close(fd)
        B = layout.CACHE_BLOCK
        got = 0
        for block in range(offset // B, (offset + len(dest) - 1) // B + 1):
            lo = offset + got - block * B
            want = min(B - lo, len(dest) - got)
            n, at_end = self._copy_block(number, block, lo, dest[got:got + want])
            got += n
            if at_end or n < want:
                break               # the segment ends in this block
        return got

    @contextlib.contextmanager
    def read_pieces(self, number: int, offset: int, buf) -> Iterator[list]:
        """Bytes [offset, offset + len(buf)) of remote segment `number` (fewer at its end) as
        [(segment offset, view), ...], back to back (the contract's SegmentReader.read_pieces):
        a block held in memory gives a view of its buffer, pinned until the with block ends
        (no copy; its bytes count as read then); any other part is read into the same place
        of buf (read_into's way)."""
        dest = memoryview(buf).cast("B")
        if not len(dest) or os.path.exists(self.whole_path(number)):
            yield [(offset, dest[:self.read_into(number, offset, dest)])]
            return
        B = layout.CACHE_BLOCK
        pieces: list = []
        pinned: list = []           # (held, bytes of it used)
        try:
            got = 0
            for block in range(offset // B, (offset + len(dest) - 1) // B + 1):
                lo = offset + got - block * B
                want = min(B - lo, len(dest) - got)
                held = self._pin(number, block)
                if held is not None:
                    n = max(0, min(want, len(held.view) - lo))
                    pinned.append([held, n])
                    pieces.append((offset + got, held.view[lo:lo + n]))
                    at_end = len(held.view) < B
                else:
                    n, at_end = self._copy_unheld(number, block, lo, dest[got:got + want])
                    pieces.append((offset + got, dest[got:got + n]))
                got += n
                if at_end or n < want:
                    break           # the segment ends in this block
            yield pieces
        finally:
            for _, view in pieces:
                try:
                    view.release()  # before the pins end: a buffer reused is not seen
                except BufferError:
                    pass            # still exported by a caller that kept it
            for held, n in pinned:
                self._unpin(held, n)

    def prefetch(self, ranges: Iterable[tuple[int, int, int]]) -> None:
        """Starts fetching, in parallel and in order, the blocks of (segment, offset, length)
        ranges not cached yet; returns at once. A read of a block being fetched waits for
        it (and fetches it itself if that failed)."""
        wanted: dict = {}       # (segment, block) -> bytes hinted, in the order of the hint
        whole: dict = {}
        for number, offset, length in ranges:
            if length <= 0:
                continue
            if number not in whole:
                whole[number] = os.path.exists(self.whole_path(number))
            if not whole[number]:
                _count_block_bytes(wanted, number, offset, length)
        with self._lock:
            self._last_read = time.monotonic()      # the readers are coming
            for w in wanted:
                if w in self._inflight:
                    self._hinted[w] = self._hinted.get(w, 0) + wanted[w]
            todo = [w for w in wanted if w not in self._inflight and w not in self._held]
            todo = [w for w in todo if not os.path.exists(self._block_path(*w))]
            if not todo:
                return
            for w in todo:
                self._hinted[w] = wanted[w]
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, "snapstore-fetch")
            runs: list = []         # neighbouring blocks: one GET of up to RUN_BLOCKS
            for number, block in todo:
                if runs and runs[-1][0] == number and runs[-1][1] + runs[-1][2] == block \
                        and runs[-1][2] < RUN_BLOCKS:
                    runs[-1][2] += 1
                else:
                    runs.append([number, block, 1])
            for number, first, count in runs:
                ready = [Future() for _ in range(count)]
                for i in range(count):
                    self._inflight[(number, first + i)] = ready[i]
                self._pool.submit(self._prefetched, number, first, ready)

    def drop(self, number: int) -> None:
        """Forgets every cached byte of segment `number` (found damaged)."""
        prefix = segment_name(number)
        with self._lock:
            for key in [k for k in self._held if k[0] == number]:
                self._forget(key)
        for name in os.listdir(self.dir):
            if name == prefix or name.startswith((prefix + "+", prefix + ".")):
                try:
                    os.unlink(os.path.join(self.dir, name))
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            self._closing = True                    # fetch threads waiting for readers end
            self._consumed.notify_all()
        if pool is not None:
            pool.shutdown(wait=True)
        with self._lock:
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.shutdown(wait=True)
        with self._lock:
            for key in list(self._held):
                self._forget(key)
            self._spare.clear()
            self._hinted.clear()
            self._closing = False
