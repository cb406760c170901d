"""The block cache of an S3 store's segment bytes (remote/cache.py), against a reference: the
segment bytes themselves. Its fetch is a plain function over in-memory segments that streams
a range the way S3Client.get_into does (consume(readinto), retried from the start after a
failure); the real server is exercised by tests/s3."""
from __future__ import annotations

import os
import threading

import pytest
from hypothesis import example, given, settings, strategies as st

from snapstore.remote import cache as cache_mod
from snapstore.remote import layout
from snapstore.errors import InvalidArgumentError
from snapstore.remote.cache import BlockCache, fill

B = layout.CACHE_BLOCK


class Bucket:
    """Segments in memory; fetch() streams a range in pieces of `piece` bytes. `fail`: a
    list of exceptions, one raised by each of the next attempts after `fail_after` bytes."""

    def __init__(self, segments: dict, piece: int = 100_003) -> None:
        self.segments = segments
        self.piece = piece
        self.calls = []
        self.fail: list = []
        self.fail_after = 0
        self.lock = threading.Lock()

    def fetch(self, number, offset, length, consume):
        while True:
            with self.lock:
                self.calls.append((number, offset, length))
                error = self.fail.pop(0) if self.fail else None
            data = memoryview(self.segments[number])[offset:offset + max(length, 0)]
            pos = 0

            def readinto(buf):
                nonlocal pos
                if error is not None and pos >= self.fail_after:
                    raise error
                n = min(len(buf), len(data) - pos, self.piece)
                buf[:n] = data[pos:pos + n]
                pos += n
                return n
            try:
                return consume(readinto)
            except OSError:
                if error is None:
                    raise
                # retried from the start, as S3Client._call does


def segs(*sizes, seed=0):
    rnd = __import__("random").Random(seed)
    return {n + 1: rnd.randbytes(size) for n, size in enumerate(sizes)}


def all_held_written(cache: BlockCache) -> bool:
    return all(v.written for v in cache._held.values())


@settings(max_examples=40, deadline=None)
@given(reads=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 3 * B),
                                st.integers(0, 2 * B)), min_size=1, max_size=6),
       prefetch=st.booleans())
@example(reads=[(1, 2 * B + 12346, 1)], prefetch=True)     # past the end of a held block
def test_reads_return_exactly_the_segment_bytes(tmp_path_factory, reads, prefetch):
    """read_into (first, on a cold cache) fills exactly what read returns, and nothing past
    it; read returns the same again, from the cache."""
    bucket = Bucket(segs(2 * B + 12345, B))          # a partial last block, a whole one
    cache = BlockCache(str(tmp_path_factory.mktemp("c")), bucket.fetch)
    try:
        if prefetch:
            cache.prefetch(reads)
        for number, offset, length in reads:
            want = bucket.segments[number][offset:offset + length]
            buf = bytearray(b"\xee" * (length + 3))
            n = cache.read_into(number, offset, memoryview(buf)[:length])
            assert n == len(want) and bytes(buf[:n]) == want
            assert buf[n:] == b"\xee" * (length + 3 - n)          # nothing past what it read
            assert cache.read(number, offset, length) == want
            assert cache.read(number, offset, length) == want        # now from the cache
    finally:
        cache.close()


def test_a_prefetch_fetches_each_block_once_and_readers_never_refetch(tmp_path):
    bucket = Bucket(segs(10 * B + 7))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    try:
        cache.prefetch([(1, 0, 10 * B + 7)])
        data = b"".join(cache.read(1, off, B) for off in range(0, 11 * B, B))
        assert data == bucket.segments[1]
        ranges = sorted(bucket.calls)
        covered = sum(length for _, _, length in ranges)
        assert covered == 11 * B                      # runs of RUN_BLOCKS blocks, no repeats
        assert len(ranges) == -(-11 // cache_mod.RUN_BLOCKS)
    finally:
        cache.close()
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 11 and not any(f.endswith(".part") for f in files)
    sizes = {f: os.path.getsize(tmp_path / f) for f in files}
    assert sorted(sizes.values()) == [7] + [B] * 10      # the last block cut to its bytes


def test_held_blocks_stay_within_their_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "HELD_BYTES", 2 * B)
    bucket = Bucket(segs(12 * B))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    try:
        cache.prefetch([(1, 0, 12 * B)])
        for off in range(0, 12 * B, B):
            assert cache.read(1, off, 100) == bucket.segments[1][off:off + 100]
        cache.close()                                # waits for the fetch threads
        assert cache._held_bytes == 0 and not cache._held
    finally:
        cache.close()                                # twice: a no-op


def test_a_stream_broken_mid_block_is_fetched_again_from_the_start(tmp_path):
    bucket = Bucket(segs(4 * B + 5))
    bucket.fail = [ConnectionResetError("reset by peer")]
    bucket.fail_after = B + 1000                     # inside the second block
    cache = BlockCache(str(tmp_path), bucket.fetch)
    try:
        cache.prefetch([(1, 0, 4 * B + 5)])
        assert cache.read(1, 0, 4 * B + 5) == bucket.segments[1]
        cache.close()
        assert not cache._held
        for f in os.listdir(tmp_path):
            off = int(f.split("+")[1])
            assert (tmp_path / f).read_bytes() == bucket.segments[1][off:off + B]
    finally:
        cache.close()


def test_a_fetch_that_fails_for_good_reaches_the_reader(tmp_path):
    bucket = Bucket(segs(2 * B))

    def broken(number, offset, length, consume):
        bucket.calls.append(offset)
        raise RuntimeError("bucket unreachable")
    cache = BlockCache(str(tmp_path), broken)
    try:
        cache.prefetch([(1, 0, 2 * B)])
        with pytest.raises(RuntimeError, match="unreachable"):
            cache.read(1, 0, 10)
        cache.close()
        assert not cache._inflight and not cache._held
    finally:
        cache.close()


@pytest.mark.parametrize("refused_at", ["open", "write"])
def test_a_file_system_that_refuses_o_direct_gets_plain_writes(tmp_path, monkeypatch,
                                                                 refused_at):
    import errno
    real_open, real_write = os.open, os.write

    def no_direct_open(path, flags, *a):
        if refused_at == "open" and flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *a)

    def no_direct_write(fd, data):
        if refused_at == "write" and os.get_blocking(fd) and \
                __import__("fcntl").fcntl(fd, __import__("fcntl").F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)
    monkeypatch.setattr(cache_mod.os, "open", no_direct_open)
    monkeypatch.setattr(cache_mod.os, "write", no_direct_write)
    bucket = Bucket(segs(B + 3))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    try:
        assert cache.read(1, 0, B + 3) == bucket.segments[1]
        assert cache._direct is False
        files = os.listdir(tmp_path)
        assert sorted(os.path.getsize(tmp_path / f) for f in files) == [3, B]
        assert not any(f.endswith(".part") for f in files)
        assert cache.read(1, B, 3) == bucket.segments[1][B:]
    finally:
        cache.close()


def test_drop_forgets_held_and_cached_blocks(tmp_path):
    bucket = Bucket(segs(2 * B))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    try:
        cache.prefetch([(1, 0, 2 * B)])
        assert cache.read(1, 0, 5) == bucket.segments[1][:5]
        for f in list(cache._inflight.values()):   # a snapshot: fetches end meanwhile
            f.result()
        cache.drop(1)
        assert not any(k[0] == 1 for k in cache._held)
        bucket.segments[1] = bytes(2 * B)            # what the bucket says now
        calls = len(bucket.calls)
        cache._pool.shutdown(wait=True)              # let the writes of the first run end
        cache._pool = None
        cache._writer.shutdown(wait=True)
        cache._writer = None
        cache.drop(1)
        assert cache.read(1, 0, 5) == bytes(5)       # fetched again
        assert len(bucket.calls) > calls
    finally:
        cache.close()


def test_fill_reads_until_full_or_the_end():
    chunks = [b"ab", b"c", b"", b"zz"]

    def readinto(buf):
        c = chunks.pop(0)
        buf[:len(c)] = c
        return len(c)
    buf = bytearray(5)
    assert fill(readinto, buf) == 3 and bytes(buf[:3]) == b"abc"
    assert fill(lambda b: 0, bytearray(4)) == 0


def test_fetch_threads_default_is_two_per_core_within_bounds(monkeypatch):
    monkeypatch.delenv(layout.FETCH_THREADS_ENV, raising=False)
    for cpus, want in [(1, 4), (2, 4), (3, 6), (8, 16), (64, 16)]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert layout.fetch_threads() == want


def test_fetch_threads_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(layout.FETCH_THREADS_ENV, "1")
    assert layout.fetch_threads() == 1
    monkeypatch.setenv(layout.FETCH_THREADS_ENV, "32")
    cache = BlockCache(str(tmp_path), Bucket(segs(5 * B)).fetch)
    try:
        assert cache.threads == 32
        cache.prefetch([(1, 0, 5 * B)])
        assert cache.read(1, 0, 5 * B) == cache.fetch.__self__.segments[1]
    finally:
        cache.close()


@pytest.mark.parametrize("value", ["0", "-3", "four", "2.5"])
def test_a_bad_fetch_threads_setting_is_a_clear_error(monkeypatch, tmp_path, value):
    monkeypatch.setenv(layout.FETCH_THREADS_ENV, value)
    with pytest.raises(InvalidArgumentError, match=layout.FETCH_THREADS_ENV):
        layout.fetch_threads()
    with pytest.raises(InvalidArgumentError):
        BlockCache(str(tmp_path), Bucket(segs(B)).fetch)


def test_a_prefetch_waits_for_its_readers_instead_of_dropping_unread_blocks(tmp_path,
                                                                            monkeypatch):
    """Readers slower than the fetches: the fetch threads wait once HELD_BYTES of blocks are
    unread, so every block reaches its reader from memory (no cache file to fall back on
    here: a dropped block would be fetched again)."""
    monkeypatch.setattr(cache_mod, "HELD_BYTES", 2 * B)
    monkeypatch.setenv(layout.FETCH_THREADS_ENV, "1")
    bucket = Bucket(segs(12 * B))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    monkeypatch.setattr(cache, "_write_block", lambda path, buf, n: None)
    try:
        cache.prefetch([(1, 0, 12 * B)])
        for off in range(0, 12 * B, B):
            __import__("time").sleep(0.02)               # a slow reader
            assert cache.read(1, off, B) == bucket.segments[1][off:off + B]
            assert cache._held_bytes <= 2 * B + cache_mod.RUN_BLOCKS * B
        assert sorted(bucket.calls) == [(1, off, cache_mod.RUN_BLOCKS * B)
                                        for off in range(0, 12 * B, cache_mod.RUN_BLOCKS * B)]
    finally:
        cache.close()


def test_readers_that_stop_coming_do_not_stop_the_prefetch(tmp_path, monkeypatch):
    """Nobody reads what was hinted: after STALL_SECONDS the fetch threads go on, and the
    oldest blocks make room as before."""
    monkeypatch.setattr(cache_mod, "HELD_BYTES", 2 * B)
    monkeypatch.setattr(cache_mod, "STALL_SECONDS", 0.2)
    monkeypatch.setenv(layout.FETCH_THREADS_ENV, "1")
    bucket = Bucket(segs(12 * B))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    try:
        cache.prefetch([(1, 0, 12 * B)])
        futures = list(cache._inflight.values())
        for f in futures:
            f.result(timeout=30)
        assert len(bucket.calls) == 3
        assert cache._held_bytes <= 2 * B + cache_mod.RUN_BLOCKS * B
        assert cache.read(1, 11 * B, 10) == bucket.segments[1][11 * B:11 * B + 10]
    finally:
        cache.close()


def test_close_ends_a_prefetch_waiting_for_readers(tmp_path, monkeypatch):
    monkeypatch.setattr(cache_mod, "HELD_BYTES", B)
    monkeypatch.setattr(cache_mod, "STALL_SECONDS", 60.0)
    monkeypatch.setenv(layout.FETCH_THREADS_ENV, "1")
    bucket = Bucket(segs(12 * B))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    cache.prefetch([(1, 0, 12 * B)])
    cache._inflight[(1, 0)].result(timeout=30)
    t = __import__("time").monotonic()
    cache.close()                                   # the waiting run gives up at once
    assert __import__("time").monotonic() - t < 10
    assert len(bucket.calls) == 1 and not cache._inflight and not cache._held
    assert cache.read(1, 5 * B, 7) == bucket.segments[1][5 * B:5 * B + 7]   # still usable
    cache.close()


def test_the_fetches_go_on_while_the_cache_files_are_written(tmp_path, monkeypatch):
    """Files are written by a writer thread: with the disk stuck, every block of two runs
    still reaches its reader (one fetch thread), and the files appear once the disk moves."""
    monkeypatch.setenv(layout.FETCH_THREADS_ENV, "1")
    disk = threading.Event()
    bucket = Bucket(segs(8 * B))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    real = cache._write_block

    def stuck(path, buf, n):
        disk.wait(30)
        real(path, buf, n)
    monkeypatch.setattr(cache, "_write_block", stuck)
    try:
        cache.prefetch([(1, 0, 8 * B)])
        assert cache.read(1, 0, 8 * B) == bucket.segments[1]
        assert not os.listdir(tmp_path) and len(bucket.calls) == 2
        disk.set()
    finally:
        disk.set()
        cache.close()
    assert len(os.listdir(tmp_path)) == 8


def test_unwritten_blocks_hold_back_the_fetches(tmp_path, monkeypatch):
    """The writer thread behind by HELD_BYTES: no GET begins until it catches up."""
    monkeypatch.setattr(cache_mod, "HELD_BYTES", 2 * B)
    monkeypatch.setenv(layout.FETCH_THREADS_ENV, "1")
    disk = threading.Event()
    bucket = Bucket(segs(12 * B))
    cache = BlockCache(str(tmp_path), bucket.fetch)
    real = cache._write_block
    monkeypatch.setattr(cache, "_write_block",
                        lambda path, buf, n: (disk.wait(30), real(path, buf, n)))
    try:
        cache.prefetch([(1, 0, 12 * B)])
        assert cache.read(1, 0, 4 * B) == bucket.segments[1][:4 * B]    # the first run, read
        __import__("time").sleep(0.3)
        assert len(bucket.calls) == 1                   # the next waits for the disk
        disk.set()
        assert cache.read(1, 4 * B, 8 * B) == bucket.segments[1][4 * B:]
        assert len(bucket.calls) == 3
    finally:
        disk.set()
        cache.close()


def test_concurrent_readers_of_blocks_being_dropped_and_reused_get_exact_bytes(tmp_path,
                                                                              monkeypatch):
    """Room for one block: blocks are dropped and their buffers reused while other threads
    copy out of them (a reader's copy pins its block's buffer)."""
    monkeypatch.setattr(cache_mod, "HELD_BYTES", B)
    monkeypatch.setattr(cache_mod, "STALL_SECONDS", 0.05)
    bucket = Bucket(segs(16 * B + 999), piece=1 << 20)
    cache = BlockCache(str(tmp_path), bucket.fetch)
    rnd = __import__("random").Random(5)
    wrong = []

    def reader(seed):
        r = __import__("random").Random(seed)
        for _ in range(25):
            off = r.randrange(0, 16 * B)
            length = r.choice([1, 4096, B // 3, B, 2 * B + 5])
            buf = bytearray(length)
            n = cache.read_into(1, off, buf)
            if bytes(buf[:n]) != bucket.segments[1][off:off + length]:
                wrong.append((off, length))
    try:
        cache.prefetch([(1, 0, 16 * B + 999)])
        threads = [threading.Thread(target=reader, args=(rnd.random(),)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not wrong
    finally:
        cache.close()
