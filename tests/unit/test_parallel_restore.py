"""Large layers are decoded by several threads (reader.copy_extents_parallel): the bytes,
the progress reports and the errors must be exactly those of the one-chunk-at-a-time path."""
from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine import reader
from snapstore.engine.backends.base import SegmentReader
from snapstore.errors import CorruptionError


@pytest.fixture
def small_threshold(monkeypatch):
    monkeypatch.setattr(reader, "PARALLEL_MIN_BYTES", 1 << 16)
    monkeypatch.setattr(reader, "PARALLEL_BATCH_BYTES", 1 << 16)


def test_parallel_restore_is_byte_exact_with_deltas(tmp_path, small_threshold):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, 4 << 20, dtype=np.uint8)
    with snapstore.open(tmp_path / "s") as s:
        ids = [s.checkpoint({"a": a, "b": b"x"}).id]
        for i in range(3):
            a[rng.integers(0, a.size, 50)] ^= 0x5A
            ids.append(s.checkpoint({"a": a, "b": b"x"}).id)
        assert s.restore(ids[-1])["a"] == a.tobytes()
        out = bytearray(a.nbytes)
        s.restore_into(ids[-1], {"a": out, "b": bytearray(1)})
        assert bytes(out) == a.tobytes()
        assert s.read(ids[-1], "a", 12345, 1 << 20) == a.tobytes()[12345:12345 + (1 << 20)]


def test_parallel_restore_without_threshold_override_is_used_for_big_buffers(tmp_path):
    a = np.random.default_rng(2).integers(0, 256, 40 << 20, dtype=np.uint8)
    with snapstore.open(tmp_path / "s") as s:
        info = s.checkpoint({"a": a})
        assert s.restore(info.id)["a"] == a.tobytes()


def test_progress_counts_every_byte_once_also_after_a_fallback(tmp_path, small_threshold,
                                                               monkeypatch):
    a = np.random.default_rng(3).integers(0, 256, 2 << 20, dtype=np.uint8)
    with snapstore.open(tmp_path / "s") as s:
        info = s.checkpoint({"a": a})
        with s._committer.read() as view:
            commit = view.checkpoint(info.id)
            for fail in (False, True):
                if fail:       # the threads fail part-way: the sequential path redoes it
                    real = reader.chunks.read_chunk
                    calls = []

                    def flaky(*args, **kw):
                        calls.append(1)
                        if len(calls) == 5:
                            raise CorruptionError("injected")
                        return real(*args, **kw)
                    monkeypatch.setattr(reader.chunks, "read_chunk", flaky)
                total = []
                out = bytearray(a.nbytes)
                reader.restore_range(view, s.backend, commit, "a", memoryview(out), 0,
                                     total.append)
                assert bytes(out) == a.tobytes()
                assert sum(total) == a.nbytes


@pytest.mark.parametrize("fail_at", [1, 3])
def test_a_run_the_c_reader_refuses_is_redone_by_the_sequential_path(tmp_path, small_threshold,
                                                                     monkeypatch, fail_at):
    """The C reader refuses a record the Python path reads (as a stricter check would): the
    layer is redone one chunk at a time, the bytes are exact, progress counts each byte once."""
    a = np.random.default_rng(5).standard_normal(1 << 19).astype(np.float32)
    real = reader.native.read_chunks
    calls = []

    def refusing(src, out, reads, scratch=None):
        calls.append(len(reads))
        if len(calls) == fail_at:
            return 0, next(iter(reader.native.READ_REASONS))
        return real(src, out, reads, scratch)
    with snapstore.open(tmp_path / "s") as s:
        info = s.checkpoint({"a": a})
        monkeypatch.setattr(reader.native, "read_chunks", refusing)
        total = []
        with s._committer.read() as view:
            out = bytearray(a.nbytes)
            reader.restore_range(view, s.backend, view.checkpoint(info.id), "a",
                                 memoryview(out), 0, total.append)
        assert bytes(out) == a.tobytes() and sum(total) == a.nbytes
        assert len(calls) >= fail_at


def count_reads(store, monkeypatch, reads: list) -> None:
    """Every read of the store's read sessions from now on appends its length to reads."""
    real = store.backend.open_reader

    def counting():
        session = real()
        inner, inner_into = session.read, session.read_into

        def read(number, offset, length):
            reads.append(length)
            return inner(number, offset, length)

        def read_into(number, offset, buf):
            reads.append(len(buf))
            return inner_into(number, offset, buf)
        session.read, session.read_into = read, read_into
        return session
    monkeypatch.setattr(store.backend, "open_reader", counting)


def test_a_large_layer_is_read_one_run_of_records_at_a_time(tmp_path, monkeypatch):
    """A full 8 MiB layer of 128 chunks laid back to back: a handful of reads, not one per
    chunk (each read is a system call, or a trip through an object store's cache)."""
    a = np.random.default_rng(6).integers(0, 256, 8 << 20, dtype=np.uint8)
    reads = []
    with snapstore.open(tmp_path / "s") as s:
        info = s.checkpoint({"a": a})
        count_reads(s, monkeypatch, reads)
        assert s.restore(info.id)["a"] == a.tobytes()
    big = [n for n in reads if n > fmt.RECORD_HEADER.size + (64 << 10)]
    assert sum(big) >= a.nbytes and len(big) <= 4


def test_damage_is_reported_as_by_the_sequential_path(tmp_path, small_threshold):
    a = np.random.default_rng(4).integers(0, 256, 2 << 20, dtype=np.uint8)
    path = tmp_path / "s"
    with snapstore.open(path) as s:
        info = s.checkpoint({"a": a})
    seg = sorted((path / "segments").iterdir())[0]
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 1
    seg.write_bytes(bytes(data))
    with snapstore.open(path) as s:
        with pytest.raises(CorruptionError, match="segment"):
            s.restore(info.id)


# ---- SpanReader: one read per run of back-to-back records ---------------------------------
Entry = namedtuple("Entry", "segment offset stored_len")


class BytesReader(SegmentReader):
    def __init__(self, segments):
        self.segments, self.reads = segments, []

    def read(self, number, offset, length):
        self.reads.append((number, offset, length))
        return self.segments[number][offset:offset + length]

    def close(self):
        pass


@settings(max_examples=150, deadline=None)
@given(layout=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 40), st.integers(0, 300)),
                       min_size=1, max_size=12),
       extra=st.lists(st.tuples(st.integers(1, 2), st.integers(0, 2000), st.integers(0, 400)),
                      max_size=5),
       cut=st.integers(0, 3000))
def test_span_reader_reads_what_its_inner_reader_reads(layout, extra, cut):
    """Records laid out back to back (gap 0) or apart, in one or two segments, a segment cut
    short (a damaged store): every read answers exactly what the inner reader answers."""
    H = fmt.RECORD_HEADER.size
    pos, entries = {1: 0, 2: 0}, []
    for seg, gap, stored in layout:
        pos[seg] += gap if gap > 20 else 0
        entries.append(Entry(seg, pos[seg], stored))
        pos[seg] += H + stored
    data = {n: bytes((i * 7 + n) % 251 for i in range(3000)) for n in (1, 2)}
    data[1] = data[1][:cut]
    inner = BytesReader(data)
    spans = reader.SpanReader(inner, entries)
    for e in entries + [Entry(s, o, ln) for s, o, ln in extra]:
        want = data[e.segment][e.offset:e.offset + H + e.stored_len]
        assert bytes(spans.read(e.segment, e.offset, H + e.stored_len)) == want
    spans.close()


def test_span_reader_reads_a_run_once():
    H = fmt.RECORD_HEADER.size
    entries = [Entry(1, i * (H + 100), 100) for i in range(50)]
    inner = BytesReader({1: bytes(50 * (H + 100))})
    spans = reader.SpanReader(inner, entries)
    for e in entries:
        assert len(spans.read(1, e.offset, H + 100)) == H + 100
    assert inner.reads == [(1, 0, 50 * (H + 100))]


# ---- the destination's pages mapped in first (reader.prefault) -------------------------------
def test_restores_into_fresh_memory_map_it_in_first_and_are_exact(tmp_path, monkeypatch):
    import mmap
    from snapstore import _native as native
    calls = []
    real = native.prefault_write
    monkeypatch.setattr(native, "prefault_write", lambda buf: calls.append(real(buf)) or
                        calls[-1])
    rng = np.random.default_rng(4)
    a = (rng.standard_normal(1 << 20) * 0.02).astype(np.float32)       # 4 MiB, planes codec
    with snapstore.open(tmp_path / "s", durability="none") as s:
        first, before = s.checkpoint({"a": a, "small": b"y" * 100}), a.tobytes()
        a[::3] *= 1.01
        second = s.checkpoint({"a": a, "small": b"y" * 100})
        for info, want in ((first, before), (second, a.tobytes())):
            out = mmap.mmap(-1, a.nbytes)                               # fresh pages
            calls.clear()
            s.restore_into(info.id, {"a": out, "small": bytearray(100)})
            # the large target, once per batch (each maps in its part); not the 100 bytes
            batches = -(-a.nbytes // reader.batch_bytes(a.nbytes, reader.DECODE_THREADS))
            assert calls == [True] * batches
            assert out[:] == want
            calls.clear()
            s.restore_into(info.id, {"a": out})                        # resident now
            assert calls == [False] * batches
        assert s.restore(second.id)["a"] == a.tobytes()
        assert s.read(second.id, "a", 4096 * 3 + 5, 2 << 20) == \
            a.tobytes()[4096 * 3 + 5:4096 * 3 + 5 + (2 << 20)]


def test_a_kernel_that_cannot_prefault_changes_nothing(tmp_path, monkeypatch):
    from snapstore import _native as native
    from snapstore.errors import NativeSystemError

    def refuse(buf):
        raise NativeSystemError("snap_prefault_write: Invalid argument (errno 22)",
                                function="snap_prefault_write", code=-1, errno_=22)
    monkeypatch.setattr(native, "prefault_write", refuse)
    a = np.random.default_rng(5).integers(0, 256, 3 << 20, dtype=np.uint8)
    with snapstore.open(tmp_path / "s", durability="none") as s:
        info = s.checkpoint({"a": a})
        assert s.restore(info.id)["a"] == a.tobytes()


# ---- share_work: the caller's thread and helpers take batches until none is left -------------
@pytest.mark.parametrize("threads", [1, 2, 4])
@pytest.mark.parametrize("n", [0, 1, 7])
def test_share_work_does_every_batch_once_and_reports_in_the_callers_thread(threads, n):
    import threading
    seen, reports = [], []
    caller = threading.get_ident()

    def work(b):
        seen.append(b)
        return b * 10

    def progress(x):
        reports.append((x, threading.get_ident() == caller))
    assert reader.share_work(list(range(n)), work, threads, progress) == \
        (True, sum(b * 10 for b in range(n)))
    assert sorted(seen) == list(range(n))
    assert sorted(x for x, _ in reports) == [b * 10 for b in range(n)]
    assert all(in_caller for _, in_caller in reports)


@pytest.mark.parametrize("exc, raised", [(CorruptionError("bad"), None),
                                         (OSError(5, "eio"), None),
                                         (KeyError("bug"), KeyError)])
def test_share_work_stops_at_a_failed_batch(exc, raised):
    import threading
    started = []
    lock = threading.Lock()

    def work(b):
        with lock:
            started.append(b)
        if b == 2:
            raise exc
        return 1
    reported = []
    if raised is None:
        assert reader.share_work(list(range(50)), work, 2, reported.append) == \
            (False, sum(reported))
    else:
        with pytest.raises(raised):
            reader.share_work(list(range(50)), work, 2, reported.append)
    assert len(started) < 50                    # no batch begun after the failure was seen


def test_share_work_waits_for_its_helpers_when_progress_raises():
    import time
    running = []

    def work(b):
        running.append(b)
        time.sleep(0.01)
        running.remove(b)
        return 1

    def progress(n):
        raise RuntimeError("the caller's progress bar broke")
    with pytest.raises(RuntimeError):
        reader.share_work(list(range(20)), work, 3, progress)
    assert running == []                        # every helper ended before the raise


def test_a_chunk_used_again_is_read_from_the_run_that_holds_it(tmp_path, monkeypatch):
    """A buffer of one repeated 64 KiB pattern: every extent names the same record, which is
    read once per batch, not once per extent; the bytes are exact."""
    a = np.tile(np.random.default_rng(7).integers(0, 256, 64 << 10, dtype=np.uint8), 64)
    reads = []
    with snapstore.open(tmp_path / "s") as s:
        info = s.checkpoint({"a": a})
        count_reads(s, monkeypatch, reads)
        assert s.restore(info.id)["a"] == a.tobytes()
    chunk_reads = [n for n in reads if n > (64 << 10)]
    assert 1 <= len(chunk_reads) <= 2      # one per 4 MiB batch


def test_a_restore_looks_each_chunk_up_once_before_it_prefetches(tmp_path, small_threshold,
                                                                 monkeypatch):
    """Lookups made while an object store's fetch threads run wait for the GIL each time: a
    restore makes them all first, once per chunk, then hands the read session its ranges."""
    from snapstore.engine.index import IndexView
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, 2 << 20, dtype=np.uint8)
    with snapstore.open(tmp_path / "s", chunk_size=1 << 16) as s:
        s.checkpoint({"a": a})
        a[rng.integers(0, a.size, 20)] ^= 0x33
        info = s.checkpoint({"a": a})
        looked, prefetched_after = [], []
        real_chunk, real_ranges = IndexView.chunk, reader.record_ranges
        monkeypatch.setattr(IndexView, "chunk",
                            lambda self, cid: (looked.append(cid), real_chunk(self, cid))[1])
        monkeypatch.setattr(reader, "record_ranges",
                            lambda entries: (prefetched_after.append(len(looked)),
                                             real_ranges(entries))[1])
        out = bytearray(a.nbytes)
        s.restore_into(info.id, {"a": out})
        assert bytes(out) == a.tobytes()
        assert len(looked) > (2 << 20) // (1 << 16)     # the base's chunks and the delta's
        assert len(looked) == len(set(looked))          # each chunk once
        assert prefetched_after == [len(looked)]        # every lookup before the prefetch


@given(total=st.integers(1, 1 << 34), threads=st.integers(1, 8))
def test_batches_are_bounded_and_share_out_evenly(total, threads):
    """batch_bytes: at most PARALLEL_BATCH_BYTES each, and (cut at that size) a number of
    batches that is a multiple of the threads, so none waits for another's last batch; the
    fewest batches that satisfy both."""
    size = reader.batch_bytes(total, threads)
    count = -(-total // size)
    assert 1 <= size <= reader.PARALLEL_BATCH_BYTES
    fewest = -(-total // reader.PARALLEL_BATCH_BYTES)
    want = -(-fewest // threads) * threads
    assert count <= want                # (fewer only when total is below `want` bytes)
    assert count == want or total < want * size


def test_a_tensor_of_three_full_batches_is_cut_in_four_for_two_threads():
    mib = 1 << 20
    assert reader.batch_bytes(12 * mib, 2) == 3 * mib
    assert reader.batch_bytes(4 * mib, 1) == 4 * mib
    assert reader.batch_bytes(1 << 30, 2) == 4 * mib
