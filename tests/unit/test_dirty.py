"""Dirty-page detectors (snapstore/dirty.py) and the kernel wrappers under them (csrc/uffd.c,
csrc/fprefine.c): every changed byte is reported, in every mode, for every way of writing.

The "uffd" tests need Linux >= 6.7 with userfaultfd async write-protect (probed once; they are
skipped with the probe's reason elsewhere). Also run under ASan by `make asan`.
"""
from __future__ import annotations

import ctypes
import gc
import mmap
import os
import threading

import numpy as np
import pytest

from snapstore import _native as nat
from snapstore.capture import dirty
from snapstore._ffi import ffi, lib
from snapstore.errors import (InvalidArgumentError, NativeArgumentError, NativeSpaceError,
                              NativeSystemError, TrackingUnavailableError)

P = dirty.SYS_PAGE
UFFD_OK, UFFD_WHY = dirty.uffd_available()
needs_uffd = pytest.mark.skipif(not UFFD_OK, reason=f"uffd tracking unavailable: {UFFD_WHY}")
MODES = ["uffd", "hash", "shadow", "full"]


def mode_param(modes=MODES):
    return [pytest.param(m, marks=needs_uffd) if m == "uffd" else m for m in modes]


# ---- helpers ---------------------------------------------------------------------------------
def u8(a) -> np.ndarray:
    return np.frombuffer(memoryview(a).cast("B"), np.uint8) if not isinstance(a, np.ndarray) \
        else a.reshape(-1).view(np.uint8)


def check_ranges(ranges, n, ps):
    """Ascending, non-overlapping, on the ps grid, inside [0, n)."""
    prev_end = -1
    for off, length in ranges:
        assert length > 0 and off > prev_end and off % ps == 0
        assert off + length <= n and ((off + length) % ps == 0 or off + length == n)
        prev_end = off + length


def assert_covers(ranges, before: bytes, after: bytes, ps=4096):
    """Every byte that differs between before and after lies in one of the ranges."""
    assert ranges is not None
    check_ranges(ranges, len(after), ps)
    mask = np.zeros(len(after), bool)
    for off, length in ranges:
        mask[off:off + length] = True
    diff = np.frombuffer(before, np.uint8) != np.frombuffer(after, np.uint8)
    missed = np.flatnonzero(diff & ~mask)
    assert missed.size == 0, f"changed bytes not reported, first at {missed[:5]}"


class Replica:
    """What a caller following the protocol holds: dirty(), copy the ranges, note_stored()."""

    def __init__(self, det, buf):
        self.det, self.buf = det, u8(buf)
        assert det.dirty() is None
        self.image = bytearray(self.buf.tobytes())          # the caller's full diff
        self.last = bytes(self.image)

    def step(self, ps=4096):
        ranges = self.det.dirty()
        now = self.buf.tobytes()
        if ranges is None:
            self.image[:] = now
        else:
            assert_covers(ranges, self.last, now, ps)
            for off, length in ranges:
                self.image[off:off + length] = now[off:off + length]
                self.det.note_stored(off, memoryview(now)[off:off + length])
        self.last = now
        return ranges

    def exact(self):
        assert bytes(self.image) == self.buf.tobytes()


def private_mmap(n: int) -> mmap.mmap:
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def vmflags(addr: int) -> str:
    """VmFlags of the mapping holding addr (/proc/self/smaps)."""
    found = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 1)[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                found = lo <= addr < hi
            elif found and line.startswith("VmFlags:"):
                return line.split(":", 1)[1]
    raise AssertionError("address not mapped")


def addr_of(buf) -> int:
    with ffi.from_buffer(buf) as p:
        return int(ffi.cast("uintptr_t", p))


@pytest.fixture
def detectors():
    made = []

    def make(*args, **kw):
        d = dirty.make_detector(*args, **kw)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


# ---- availability and mode selection ----------------------------------------------------
def test_uffd_available_reports_a_reason():
    ok, why = dirty.uffd_available()
    assert isinstance(ok, bool) and why
    assert dirty.uffd_available() == (ok, why)          # probed once


@needs_uffd
def test_auto_picks_uffd_for_numpy_arrays(detectors):
    a = np.zeros(1 << 20, np.uint8)
    d = detectors(a)
    assert d.mode == "uffd" and d.reason.startswith("uffd:")
    assert "write-protected" in d.reason


@needs_uffd
def test_auto_picks_uffd_for_private_anonymous_mmap_exact_grid(detectors):
    m = private_mmap(16 * P)
    d = detectors(m)
    assert d.mode == "uffd" and "not aligned" not in d.reason
    assert d._impl.refine is False


@pytest.mark.parametrize("mode", ["hash", "shadow", "full"])
def test_explicit_modes(detectors, mode):
    d = detectors(np.zeros(3 * 4096 + 5, np.uint8), mode)
    assert d.mode == mode and d.reason.startswith(mode)


def test_bad_mode_and_page_size(detectors):
    with pytest.raises(InvalidArgumentError):
        detectors(bytearray(10), "fast")
    with pytest.raises(InvalidArgumentError):
        detectors(bytearray(10), "hash", page_size=1000)
    with pytest.raises(TypeError):
        detectors(12345)


def test_read_only_bytes_fall_back_to_hash(detectors):
    d = detectors(b"x" * 50000)
    assert d.mode == "hash" and "read-only" in d.reason
    with pytest.raises(TrackingUnavailableError) as ei:
        detectors(b"x" * 50000, "uffd")
    assert "read-only" in ei.value.reason


@needs_uffd
def test_read_only_numpy_view_falls_back(detectors):
    a = np.zeros(1 << 16, np.uint8)
    a.flags.writeable = False
    d = detectors(a)
    assert d.mode == "hash" and "read-only" in d.reason


def test_file_backed_mmap_falls_back_to_hash(detectors, tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(16 * P))
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 16 * P)
    d = detectors(m)
    assert d.mode == "hash"
    if UFFD_OK:
        assert "file-backed" in d.reason and "f.bin" in d.reason
        with pytest.raises(TrackingUnavailableError, match="file-backed"):
            detectors(m, "uffd")
    r = Replica(d, m)
    m[5 * P + 1:5 * P + 3] = b"ab"
    with open(path, "r+b") as f:              # written behind the mapping's back
        f.seek(9 * P)
        f.write(b"zz")
        f.flush()
    assert r.step() == [(5 * P, P), (9 * P, P)]
    r.exact()
    d.close()
    del r
    m.close()


@needs_uffd
def test_shared_anonymous_mmap_falls_back_to_hash(detectors):
    m = mmap.mmap(-1, 8 * P)                  # Python's default: MAP_SHARED
    d = detectors(m)
    assert d.mode == "hash" and "shared mapping" in d.reason
    d.close()
    m.close()


@needs_uffd
def test_overlapping_views_fall_back_and_do_not_steal(detectors):
    a = np.zeros(64 * P, np.uint8)
    d1 = detectors(a[: 40 * P])
    d2 = detectors(a[20 * P:])
    assert d1.mode == "uffd"
    assert d2.mode == "hash" and "overlap" in d2.reason
    r1, r2 = Replica(d1, a[: 40 * P]), Replica(d2, a[20 * P:])
    a[30 * P + 3] = 1
    r2.step()
    r1.step()
    r1.exact()
    r2.exact()
    d1.close()
    d3 = detectors(a[20 * P:])                # freed pages can be tracked again
    assert d3.mode == "uffd"


def test_empty_and_one_byte_buffers(detectors):
    for mode in ["auto", "hash", "shadow", "full"] + (["uffd"] if UFFD_OK else []):
        e = detectors(bytearray(), mode)
        assert e.dirty() is None and e.dirty() == []
        one = bytearray(b"a")
        d = detectors(one, mode)
        assert d.dirty() is None
        assert d.dirty() == ([(0, 1)] if mode == "full" else [])
        one[0] = 98
        assert d.dirty() == [(0, 1)]
        d.note_stored(0, b"b")
        assert d.dirty() == ([(0, 1)] if mode == "full" else [])
    if UFFD_OK:
        assert detectors(bytearray()).reason.startswith("hash")   # auto: empty -> hash


@needs_uffd
def test_an_empty_array_is_tracked_by_uffd_as_an_empty_bytearray_is(detectors):
    """Regression (a helper's review): mode "uffd" refused an empty writable NumPy array as a
    "read-only buffer" (every empty non-byte buffer is viewed as b""), where bytearray() is
    taken."""
    for empty in (np.zeros(0, np.float32), np.zeros((3, 0)), np.zeros(10)[5:5], b""):
        d = detectors(empty, "uffd")
        assert d.mode == "uffd"
        assert d.dirty() is None and d.dirty() == []


# ---- the basic protocol, every mode ----------------------------------------------------------
@pytest.mark.parametrize("mode", mode_param())
def test_first_call_none_then_exact_changes(detectors, mode):
    a = np.zeros(64 * P + 123, np.uint8)
    d = detectors(a, mode)
    assert d.mode == mode
    assert d.dirty() is None
    assert d.dirty() == ([(0, a.size)] if mode == "full" else [])
    a[5 * 4096 + 7] = 1
    a[6 * 4096] = 1
    a[-1] = 9
    got = d.dirty()
    if mode == "full":
        assert got == [(0, a.size)]
    else:
        assert got == [(5 * 4096, 2 * 4096), (64 * 4096, a.size - 64 * 4096)]
        assert d.dirty() == []


@pytest.mark.parametrize("mode", mode_param())
@pytest.mark.parametrize("how", ["numpy", "memoryview", "memmove", "thread", "readinto"])
def test_every_write_path_is_seen(detectors, mode, how, tmp_path):
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, 200 * 1024 + 77, dtype=np.uint8)
    d = detectors(a, mode)
    r = Replica(d, a)
    src = tmp_path / "src.bin"
    for step in range(4):
        offs = rng.integers(0, a.size - 300, 6)
        data = [rng.integers(0, 256, int(rng.integers(1, 300)), dtype=np.uint8).tobytes()
                for _ in offs]
        if how == "numpy":
            for o, b in zip(offs, data):
                a[o:o + len(b)] = np.frombuffer(b, np.uint8)
        elif how == "memoryview":
            mv = memoryview(a)
            for o, b in zip(offs, data):
                mv[o:o + len(b)] = b
            mv.release()
        elif how == "memmove":
            for o, b in zip(offs, data):
                ctypes.memmove(a.ctypes.data + int(o), b, len(b))
        elif how == "thread":
            def write():
                for o, b in zip(offs, data):
                    a[o:o + len(b)] = np.frombuffer(b, np.uint8)
            t = threading.Thread(target=write)
            t.start()
            t.join()
        else:                                  # the kernel writes (read(2) into the buffer)
            src.write_bytes(b"".join(data))
            with open(src, "rb", buffering=0) as f:
                mv = memoryview(a)
                for o, b in zip(offs, data):
                    assert f.readinto(mv[o:o + len(b)]) == len(b)
                mv.release()
        r.step()
        r.exact()


@pytest.mark.parametrize("mode", mode_param())
@pytest.mark.parametrize("start,length", [(0, 1), (1, 4095), (17, 3 * 4096), (4095, 4097),
                                          (100, 10 * 4096 + 1), (4096, 8192), (3, 2 * 4096 - 6)])
def test_unaligned_slices(detectors, mode, start, length):
    big = np.zeros(16 * 4096, np.uint8)
    view = big[start:start + length]
    d = detectors(view, mode)
    r = Replica(d, view)
    rng = np.random.default_rng(start + length)
    for _ in range(3):
        for i in rng.integers(0, length, 5):
            view[i] += 1
        big[:start] += 1                     # outside the slice: never reported
        big[start + length:] += 1
        r.step()
    view[0] += 1
    view[-1] += 1
    r.step()
    r.exact()


@needs_uffd
def test_unaligned_numpy_array_reports_only_changed_grid_pages(detectors):
    base = np.zeros((1 << 20) + P, np.uint8)  # made 16 bytes into a page (malloc usually
    a = base[(16 - base.ctypes.data) % P:][:1 << 20]   # does that, but not always)
    assert a.ctypes.data % P == 16
    d = detectors(a)
    assert d._impl.refine and "narrowed" in d.reason
    d.dirty()
    pages = [3, 17, 100, 255]
    for p in pages:
        a[p * 4096 + 4095] = 1               # straddles two system pages' worth of grid
    assert d.dirty() == [(p * 4096, 4096) for p in pages]


@pytest.mark.parametrize("ps", [512, 4096, 65536])
@pytest.mark.parametrize("mode", mode_param())
def test_page_sizes_grid(detectors, mode, ps):
    a = np.zeros(300_000, np.uint8)
    d = detectors(a, mode, page_size=ps)
    r = Replica(d, a)
    a[[0, 1000, 70_000, 299_999]] = 5
    got = r.step(ps)
    r.exact()
    if mode != "full":
        assert sum(n for _, n in got) <= 4 * ps


# ---- note_stored: the revert race ---------------------------------------------------------
@pytest.mark.parametrize("mode", mode_param(["hash", "shadow", "uffd"]))
@pytest.mark.parametrize("aligned", [True, False])
def test_note_stored_defeats_the_revert_race(detectors, mode, aligned):
    m = private_mmap(32 * P)
    buf = np.frombuffer(m, np.uint8)[(0 if aligned else 16):]
    d = detectors(buf, mode)
    assert d.dirty() is None
    p = 5 * 4096
    buf[p] = 1                               # X
    ranges = d.dirty()
    assert (p, 4096) in ranges
    buf[p] = 2                               # written between dirty() and the copy ...
    stored = buf[p:p + 4096].tobytes()       # ... so the copy holds Y
    d.note_stored(p, stored)
    buf[p] = 1                               # reverted to what dirty() saw
    assert (p, 4096) in d.dirty()            # stored Y != live X: must be reported
    d.close()
    del buf
    m.close()


def test_note_stored_partial_pages_are_reported_again(detectors):
    a = np.zeros(10 * 4096, np.uint8)
    d = detectors(a, "hash")
    d.dirty()
    a[4096 + 10] = 1
    assert d.dirty() == [(4096, 4096)]
    d.note_stored(4096 + 5, memoryview(a)[4096 + 5:4096 + 100])     # part of a page only
    assert d.dirty() == [(4096, 4096)]       # baseline unknown: reported once more
    assert d.dirty() == []


def test_note_stored_checks_its_range(detectors):
    d = detectors(bytearray(100), "hash")
    d.dirty()
    with pytest.raises(InvalidArgumentError):
        d.note_stored(90, b"x" * 20)
    with pytest.raises(InvalidArgumentError):
        d.note_stored(-1, b"x")


def test_note_stored_before_first_dirty_is_ignored(detectors):
    a = bytearray(8192)
    d = detectors(a, "hash")
    d.note_stored(0, b"\1" * 4096)            # no baseline yet: nothing to correct
    assert d.dirty() is None and d.dirty() == []


# ---- many detectors ----------------------------------------------------------------------
@pytest.mark.parametrize("mode", mode_param(["auto", "uffd", "hash"]))
def test_many_detectors_do_not_interfere(detectors, mode):
    rng = np.random.default_rng(3)
    arrays = [np.zeros(int(rng.integers(1, 40_000)), np.uint8) for _ in range(40)]
    reps = [Replica(detectors(a, mode), a) for a in arrays]
    for _ in range(3):
        for a in rng.choice(len(arrays), 15, replace=False):
            arr = arrays[a]
            arr[rng.integers(0, arr.size, 3)] += 1
        for r in reps:
            r.step()
            r.exact()


# ---- buffers freed or resized while tracked ------------------------------------------------
@pytest.mark.parametrize("mode", mode_param())
def test_resize_or_free_while_tracked_is_a_clear_error(detectors, mode):
    ba = bytearray(5 * P)
    m = private_mmap(4 * P)
    a = np.zeros(10 * P, np.uint8)
    dets = [detectors(ba, mode), detectors(m, mode), detectors(a, mode)]
    with pytest.raises(BufferError):
        ba.extend(b"more")
    with pytest.raises(BufferError):
        del ba[:10]
    with pytest.raises(BufferError):
        m.close()
    with pytest.raises(BufferError):
        m.resize(8 * P)
    with pytest.raises(ValueError):
        a.resize(20 * P)                     # numpy: the detector holds a reference
    for d in dets:
        assert d.dirty() is None and d.dirty() is not None
        d.close()
    ba.extend(b"more")                       # released by close()
    m.close()
    a.resize(20 * P, refcheck=False)


# ---- close -----------------------------------------------------------------------------------
@needs_uffd
def test_close_removes_protection(detectors):
    m = private_mmap(64 * P)
    addr = addr_of(m)
    assert " uw" not in vmflags(addr)
    d = detectors(m)
    assert " uw" in vmflags(addr)            # VM_UFFD_WP
    d.dirty()
    m[5 * P] = 1
    d.close()
    d.close()                                # idempotent
    assert " uw" not in vmflags(addr)
    for i in range(64):                      # writes after close: plain memory
        m[i * P] = 7
    assert m[63 * P] == 7
    with pytest.raises(InvalidArgumentError, match="closed"):
        d.dirty()
    d.note_stored(0, b"x")                   # no-op after close
    m.close()


@needs_uffd
def test_garbage_collected_detector_unregisters():
    m = private_mmap(8 * P)
    addr = addr_of(m)
    d = dirty.make_detector(m)
    assert " uw" in vmflags(addr)
    del d
    gc.collect()
    assert " uw" not in vmflags(addr)
    m.close()


# ---- fork ----------------------------------------------------------------------------------
def _in_child(fn):
    """Run fn() in a forked child; return what it printed to the pipe (or raise its failure)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(rfd)
            out = repr(fn()).encode()
            code = 0
        except BaseException as e:  # noqa: BLE001
            out = f"FAIL {type(e).__name__}: {e}".encode()
            code = 1
        os.write(wfd, out)
        os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


@pytest.mark.parametrize("mode", mode_param(["auto", "uffd", "hash", "shadow"]))
def test_fork_child_cannot_vouch_parent_keeps_tracking(detectors, mode):
    a = np.zeros(64 * P, np.uint8)
    b = np.zeros(8 * P + 5, np.uint8)
    da, db = detectors(a, mode), detectors(b, mode)
    ra, rb = Replica(da, a), Replica(db, b)
    a[3 * P] = 1                             # written before fork, not yet scanned
    b[-1] = 1

    def child():
        assert da.dirty() is None and db.dirty() is None      # cannot vouch after fork
        a[10 * P] = 5                        # the child's own writes ...
        a[3 * P + 1] = 5
        got = da.dirty()                     # ... are tracked in the child from then on
        assert got is not None and (10 * 4096, 4096) in got, got
        assert da.mode == mode if mode != "auto" else True
        return da.mode

    child_mode = _in_child(child)
    assert child_mode.strip("'") in ("uffd", "hash", "shadow")
    a[20 * P] = 2                            # parent writes after fork (copy-on-write)
    assert ra.step() is not None             # the child's scans stole nothing
    rb.step()
    ra.exact()
    rb.exact()
    assert a[10 * P] == 0                    # (the child's memory was its own)


@needs_uffd
def test_c_level_fork_without_python_hooks_steals_nothing(detectors):
    """fork() called from C (no os.register_at_fork hooks): the child notices by its pid and
    never touches the inherited descriptors, which still refer to the parent's memory."""
    a = np.zeros(32 * P, np.uint8)
    d = detectors(a, "uffd")
    r = Replica(d, a)
    a[7 * P] = 1                             # not yet scanned when the child starts
    rfd, wfd = os.pipe()
    pid = ctypes.PyDLL(None).fork()          # PyDLL: the GIL stays held across the call
    if pid == 0:
        code = 1
        try:
            ok = d.dirty() is None           # cannot vouch; registers with its own uffd
            a[9 * P] = 1
            ok = ok and (9 * 4096, 4096) in d.dirty()
            code = 0 if ok and d.mode == "uffd" else 1     # re-registered in the child
        finally:
            os._exit(code)
    os.close(rfd)
    os.close(wfd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert (7 * 4096, 4096) in r.step()      # the parent's written bit is still there
    r.exact()


@needs_uffd
def test_fork_child_uffd_registers_again(detectors):
    a = np.zeros(16 * P, np.uint8)
    d = detectors(a, "uffd")
    d.dirty()

    def child():
        assert d.dirty() is None
        a[2 * P] = 1
        return (d.mode, d.dirty(), "again" in d.reason)
    out = _in_child(child)
    assert out == repr(("uffd", [(2 * 4096, 4096)], True))
    a[5 * P] = 1
    assert d.dirty() == [(5 * 4096, 4096)]


# ---- transparent huge pages -------------------------------------------------------------------
@needs_uffd
@pytest.mark.parametrize("populate_first", [True, False])
def test_transparent_huge_pages(detectors, populate_first):
    H = 2 << 20
    m = private_mmap(6 * H)
    addr = addr_of(m)
    off = (-addr) % H
    m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, np.uint8)[off:off + 4 * H]          # 8 MiB, 2 MiB aligned
    if populate_first:
        a[:] = 1                             # huge pages mapped before tracking starts
    d = detectors(a)
    assert d.mode == "uffd" and not d._impl.refine
    r = Replica(d, a)
    rng = np.random.default_rng(5)
    for _ in range(3):
        pages = rng.choice(a.size // 4096, 20, replace=False)
        a[pages * 4096 + rng.integers(0, 4096, 20)] += 3
        got = r.step()
        r.exact()
        assert sum(n for _, n in got) == 20 * 4096   # the kernel splits, tracks 4 KiB pages
    d.close()
    del a, r
    m.close()


@needs_uffd
def test_collapsed_huge_page_is_reported(detectors):
    H = 2 << 20
    m = private_mmap(4 * H)
    off = (-addr_of(m)) % H
    m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, np.uint8)[off:off + 2 * H]
    d = detectors(a)
    r = Replica(d, a)
    a[:H] = 7
    try:
        m.madvise(25, off, H)                # MADV_COLLAPSE (Linux 6.1)
    except OSError:
        pass
    assert r.step() == [(0, H)]
    a[100] = 1
    assert r.step() == [(0, 4096)]
    r.exact()
    d.close()
    del a, r
    m.close()


@needs_uffd
def test_madv_dontneed_of_tracked_page_is_reported(detectors):
    m = private_mmap(8 * P)
    d = detectors(m)
    r = Replica(d, m)
    m[3 * P] = 9
    r.step()
    m.madvise(mmap.MADV_DONTNEED, 3 * P, P)   # the page reads as zeros again
    assert r.step() == [(3 * P, P)]
    r.exact()
    d.close()
    del r
    m.close()


# ---- concurrency -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", mode_param(["uffd", "hash", "shadow"]))
def test_concurrent_writer_never_loses_a_write(detectors, mode):
    """A thread keeps writing while the caller takes dirty() + copies: once the writer stops,
    one more round makes the caller's image exact (nothing written meanwhile was lost)."""
    a = np.zeros(128 * 4096 + 11, np.uint8)
    d = detectors(a, mode)
    image = bytearray(a.tobytes())
    assert d.dirty() is None
    stop = threading.Event()

    def writer():
        rng = np.random.default_rng(11)
        k = 0
        while not stop.is_set():
            k += 1
            i = int(rng.integers(0, a.size))
            a[i] = k & 255
            if rng.random() < 0.3:           # sometimes revert right away
                a[i] = 0
    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(60):
            ranges = d.dirty()
            for off, length in ranges:
                copy = a[off:off + length].tobytes()
                image[off:off + length] = copy
                d.note_stored(off, copy)
    finally:
        stop.set()
        t.join()
    for off, length in d.dirty():
        image[off:off + length] = a[off:off + length].tobytes()
    assert bytes(image) == a.tobytes()


# ---- the C wrappers: argument checks and errors --------------------------------------------
@needs_uffd
def test_c_uffd_argument_checks():
    err = ffi.new("int *")
    fd = dirty._KERNEL.uffd
    assert lib.snap_uffd_open(ffi.NULL, ffi.NULL, ffi.NULL, err) == lib.SNAP_EINVAL
    assert lib.snap_uffd_register(fd, P, P, ffi.NULL) == lib.SNAP_EINVAL
    assert lib.snap_uffd_register(-1, P, P, err) == lib.SNAP_EINVAL
    assert lib.snap_uffd_register(fd, P + 1, P, err) == lib.SNAP_EINVAL
    assert lib.snap_uffd_register(fd, P, P - 1, err) == lib.SNAP_EINVAL
    assert lib.snap_uffd_register(fd, P, 0, err) == lib.SNAP_EINVAL
    assert lib.snap_uffd_register(fd, (1 << 64) - P, 2 * P, err) == lib.SNAP_EINVAL
    assert lib.snap_uffd_unregister(fd, 0, P + 3, err) == lib.SNAP_EINVAL
    assert lib.snap_uffd_unregister(-5, 0, P, err) == lib.SNAP_EINVAL
    assert err[0] == 0
    # a range that is not mapped: the kernel says EINVAL (or ENOMEM)
    assert lib.snap_uffd_register(fd, 0, P, err) == lib.SNAP_ESYS and err[0] != 0
    with pytest.raises(NativeSystemError) as ei:
        nat.uffd_register(fd, 0, P)
    assert isinstance(ei.value, OSError) and ei.value.errno
    assert "snap_uffd_register" in str(ei.value)
    with pytest.raises(InvalidArgumentError):
        nat.uffd_register(-1, 0, P)


@needs_uffd
def test_c_pagemap_scan_checks_and_continuation():
    pm, fd = dirty._KERNEL.pagemap, dirty._KERNEL.uffd
    n, we, err = ffi.new("size_t *"), ffi.new("uint64_t *"), ffi.new("int *")
    out = ffi.new("uint64_t[]", 30)
    m = private_mmap(64 * P)
    s = addr_of(m)
    assert lib.snap_pagemap_scan(pm, s, s + P, out, 10, n, we, ffi.NULL) == lib.SNAP_EINVAL
    assert lib.snap_pagemap_scan(-1, s, s + P, out, 10, n, we, err) == lib.SNAP_EINVAL
    assert lib.snap_pagemap_scan(pm, s + 1, s + P, out, 10, n, we, err) == lib.SNAP_EINVAL
    assert lib.snap_pagemap_scan(pm, s + P, s, out, 10, n, we, err) == lib.SNAP_EINVAL
    assert lib.snap_pagemap_scan(pm, s, s + P, ffi.NULL, 10, n, we, err) == lib.SNAP_EINVAL
    assert lib.snap_pagemap_scan(pm, s, s + P, out, 0, n, we, err) == lib.SNAP_ESPACE
    assert lib.snap_pagemap_scan(pm, s, s, out, 0, n, we, err) == lib.SNAP_OK and we[0] == s
    # not registered: PM_SCAN_CHECK_WPASYNC refuses
    assert lib.snap_pagemap_scan(pm, s, s + P, out, 10, n, we, err) == lib.SNAP_ESYS
    assert err[0] == 1                                          # EPERM
    nat.uffd_register(fd, s, 64 * P)
    try:
        assert nat.pagemap_scan(pm, s, s + 64 * P) == ([], s + 64 * P)
        for k in range(0, 64, 2):
            m[k * P] = 1
        ranges, walk_end = nat.pagemap_scan(pm, s, s + 64 * P, max_ranges=5)
        assert len(ranges) == 5 and walk_end < s + 64 * P
        more, end = nat.pagemap_scan(pm, walk_end, s + 64 * P, max_ranges=100)
        assert end == s + 64 * P
        assert [(a - s) // P for a, _, _ in ranges + more] == list(range(0, 64, 2))
        assert all(e - a == P and f == 0 for a, e, f in ranges + more)
        assert nat.pagemap_scan(pm, s, s + 64 * P)[0] == []      # re-protected
    finally:
        nat.uffd_unregister(fd, s, 64 * P)
    m.close()


def test_c_fp_diff_runs():
    rng = np.random.default_rng(2)
    b = rng.integers(0, 256, 10 * 4096 + 100, dtype=np.uint8)
    fps = nat.page_fingerprints(b)
    b[[5 * 4096, 9 * 4096 + 7, b.size - 1, 0]] ^= 0xFF
    assert nat.fingerprint_diff_runs(b, fps, [(1, 5), (6, 5)]) == [(5, 1), (9, 2)]
    assert nat.fingerprint_diff_runs(b, fps, [(0, 11)]) == [(0, 1)]   # only page 0 was left
    assert nat.fingerprint_diff(b, fps) == []
    assert nat.fingerprint_diff_runs(b, fps, []) == []
    for bad in ([(3, 0)], [(5, 1), (4, 1)], [(5, 2), (6, 1)], [(11, 1)], [(10, 2)]):
        with pytest.raises(NativeArgumentError):
            nat.fingerprint_diff_runs(b, fps, bad)
    with pytest.raises(InvalidArgumentError):
        nat.fingerprint_diff_runs(b, fps[:-16], [(0, 1)])
    # C directly: small output, NULLs
    n = ffi.new("size_t *")
    inp = ffi.new("uint64_t[]", [0, 11])
    out = ffi.new("uint64_t[]", 2)
    b[[0, 2 * 4096]] ^= 1
    with ffi.from_buffer(b) as bp, ffi.from_buffer(fps) as fp:
        bp8, fp8 = ffi.cast("uint8_t *", bp), ffi.cast("uint8_t *", fp)
        assert lib.snap_fp_diff_runs(bp8, b.size, 4096, fp8, len(fps), inp, 1, out, 1, n) \
            == lib.SNAP_ESPACE and n[0] == 0
        assert lib.snap_fp_diff_runs(bp8, b.size, 4096, fp8, len(fps), inp, 1, out, 1,
                                     ffi.NULL) == lib.SNAP_EINVAL
        assert lib.snap_fp_diff_runs(bp8, b.size, 1000, fp8, len(fps), inp, 1, out, 1, n) \
            == lib.SNAP_EINVAL
        assert lib.snap_fp_diff_runs(bp8, b.size, 4096, fp8, len(fps), ffi.NULL, 1, out, 1, n) \
            == lib.SNAP_EINVAL
        assert lib.snap_fp_diff_runs(bp8, b.size, 4096, fp8, 16, inp, 1, out, 1, n) \
            == lib.SNAP_ESPACE
    with pytest.raises(NativeSpaceError):
        nat.check(lib.SNAP_ESPACE, "x")


def test_page_fingerprints_table():
    """nat.PageFingerprints: the pinned digest table the hash and refined uffd detectors use."""
    rng = np.random.default_rng(3)
    b = rng.integers(0, 256, 10 * 4096 + 100, dtype=np.uint8)
    table = nat.PageFingerprints(b)
    assert bytes(table.digests) == bytes(nat.page_fingerprints(b)) and table.nbytes == b.size
    b[[4096, 7 * 4096 + 3, b.size - 1]] ^= 0xFF
    assert table.diff_runs(b, [(0, 5)]) == [(1, 1)]                  # only listed pages
    assert table.diff(b) == [(7, 1), (10, 1)]
    assert table.diff(b) == []
    # update: digests of data's pages from first_page on (the short last page too)
    b[2 * 4096:4 * 4096] = 7
    table.update(2, memoryview(b)[2 * 4096:4 * 4096])
    b[-50:] = 1
    table.update(10, bytes(b[10 * 4096:]))                           # any bytes-like
    assert table.diff(b) == []
    assert bytes(table.digests) == bytes(nat.page_fingerprints(b))
    table.update(11, b"")                                            # past the end: nothing
    with pytest.raises(InvalidArgumentError):
        table.update(12, b"")
    with pytest.raises(NativeSpaceError):
        table.update(10, bytes(2 * 4096))                            # more pages than are left
    with pytest.raises(InvalidArgumentError):
        table.diff_runs(b[:-1], [(0, 1)])                            # another size
    with pytest.raises(NativeArgumentError):
        table.diff_runs(b, [(11, 1)])
    with pytest.raises(BufferError):
        table.digests.extend(b"x")                                   # pinned: never resized
    assert nat.byte_view(memoryview(b"ab")).obj == b"ab"
    assert nat.byte_view(np.zeros(3, np.float64)).nbytes == 24


def test_esys_maps_to_native_system_error():
    with pytest.raises(NativeSystemError) as ei:
        nat.check(lib.SNAP_ESYS, "snap_f")
    assert ei.value.code == -4 and isinstance(ei.value, OSError)


# ---- note_stored_many -------------------------------------------------------------------------
@pytest.mark.parametrize("mode", mode_param(["hash", "shadow", "uffd", "full"]))
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("with_fingerprints", [False, True])
def test_note_stored_many_defeats_the_revert_race(detectors, mode, aligned, with_fingerprints):
    m = private_mmap(40 * P)
    buf = np.frombuffer(m, np.uint8)[(0 if aligned else 16):(40 * P - 100)]
    d = detectors(buf, mode)
    assert d.dirty() is None
    pages = [0, 5, 6, 9, (buf.size - 1) // 4096]
    for p in pages:
        buf[p * 4096] += 1                    # X
    ranges = d.dirty()
    for p in pages:
        buf[p * 4096] += 1                    # Y: written between dirty() and the copy
    if with_fingerprints:                     # the copy's digests, made as it is copied
        staged, fps = nat.gather_fingerprints(buf, ranges, page_size=d.page_size)
        d.note_stored_many(ranges, staged, fps if d.wants_fingerprints else None)
    else:
        staged = nat.gather(buf, ranges)
        d.note_stored_many(ranges, staged)
    for p in pages:
        buf[p * 4096] -= 1                    # reverted to X
    got = d.dirty()
    for p in pages:
        assert any(o <= p * 4096 < o + n for o, n in got), (p, got)
    d.close()
    del buf
    m.close()


def test_note_stored_many_checks_and_falls_back(detectors):
    a = np.zeros(10 * 4096 + 10, np.uint8)
    d = detectors(a, "hash")
    assert d.wants_fingerprints
    d.dirty()
    with pytest.raises(InvalidArgumentError, match="fingerprints holds"):
        d.note_stored_many([(0, 8192)], b"x" * 8192, bytes(nat.FP_BYTES))
    with pytest.raises(InvalidArgumentError, match="hold"):
        d.note_stored_many([(0, 4096)], b"x" * 10)
    with pytest.raises(InvalidArgumentError, match="outside"):
        d.note_stored_many([(10 * 4096, 4096)], b"x" * 4096)
    a[3 * 4096 + 1] = 1
    a[-1] = 1
    # unaligned pieces: handled one by one (pages covered partly are reported again)
    d.note_stored_many([(3 * 4096, 100), (10 * 4096, 10)],
                       a[3 * 4096:3 * 4096 + 100].tobytes() + a[-10:].tobytes())
    assert d.dirty() == [(3 * 4096, 4096)]
    assert d.dirty() == []
    d.note_stored_many([], b"")
    d.close()
    d.note_stored_many([(0, 1)], b"x")        # closed: ignored


# ---- dense intervals: a "hash" detector skips its pass ---------------------------------------
DENSE_N = dirty.DENSE_MIN_BYTES + 3 * 4096 + 5       # 260 pages of 4 KiB, the last of 5 bytes
DENSE_PAGES = -(-DENSE_N // 4096)


def copy_and_note(d, buf, ranges, fingerprints=True):
    """What the engine's capture does: gather the ranges, hashing the copy as it is made, and
    note the copy with its fingerprints (fingerprints=False: without them)."""
    staged, fps = nat.gather_fingerprints(buf, ranges, page_size=d.page_size)
    d.note_stored_many(ranges, staged, fps if fingerprints else None)


def page_ranges(pages, n=DENSE_N):
    return [(p * 4096, min(4096, n - p * 4096)) for p in pages]


def dense_hash_detector(detectors):
    """A "hash" detector of a DENSE_N-byte buffer whose last interval changed every page
    (noted as the engine notes it): its next dirty() may skip the pass."""
    a = np.zeros(DENSE_N, np.uint8)
    d = detectors(a, "hash")
    d.dirty()
    a += 1
    copy_and_note(d, a, d.dirty())
    return a, d


def test_hash_after_a_dense_interval_reports_all_then_exact_again(detectors):
    a = np.zeros(DENSE_N, np.uint8)
    d = detectors(a, "hash")
    assert d.dirty() is None
    a += 1                                            # every page changed
    assert d.dirty() == [(0, DENSE_N)]
    copy_and_note(d, a, [(0, DENSE_N)])
    a[5 * 4096] += 1                                  # the next interval is sparse ...
    assert d.dirty() == [(0, DENSE_N)]                # ... but reported whole: no pass made
    copy_and_note(d, a, [(0, DENSE_N)])               # the copy shows 1 page changed
    a[7 * 4096] += 1
    a[-1] += 1
    assert d.dirty() == page_ranges([7, DENSE_PAGES - 1])      # hashed again: exact
    copy_and_note(d, a, page_ranges([7, DENSE_PAGES - 1]))
    assert d.dirty() == []
    assert d.dirty() == []                            # the same call twice


@pytest.mark.parametrize("changed, dense", [(DENSE_PAGES // 2, True),
                                            (DENSE_PAGES // 2 - 1, False)])
def test_hash_dense_means_half_the_pages(detectors, changed, dense):
    a = np.zeros(DENSE_N, np.uint8)
    d = detectors(a, "hash")
    assert d.dirty() is None
    a[np.arange(changed) * 4096] = 1
    got = d.dirty()
    assert got == [(0, changed * 4096)]
    copy_and_note(d, a, got)
    assert d.dirty() == ([(0, DENSE_N)] if dense else [])
    if dense:                                         # the skipped pass, noted: nothing changed
        copy_and_note(d, a, [(0, DENSE_N)])
        assert d.dirty() == []


def test_hash_skip_needs_noted_fingerprints_as_evidence(detectors):
    a, d = dense_hash_detector(detectors)
    a[9 * 4096] = 7
    assert d.dirty() == [(0, DENSE_N)]                # skipped; this copy is never noted
    a[11 * 4096] = 7                                  # (a failed capture: the caller diffs)
    assert d.dirty() == page_ranges([9, 11])          # hashed: against the last noted copy
    copy_and_note(d, a, page_ranges([9, 11]))
    a += 1
    copy_and_note(d, a, d.dirty())
    assert d.dirty() == [(0, DENSE_N)]
    copy_and_note(d, a, [(0, DENSE_N)], fingerprints=False)    # noted without fingerprints
    a[3 * 4096] = 9
    assert d.dirty() == page_ranges([3])              # still counted: the detector hashed it
    d.note_stored(3 * 4096, a[3 * 4096:4 * 4096].tobytes())
    a += 1
    copy_and_note(d, a, d.dirty())
    assert d.dirty() == [(0, DENSE_N)]
    d.note_stored(0, a.tobytes())                     # one by one: no evidence counted
    assert d.dirty() == []                            # so the next call hashes


def test_hash_revert_race_during_a_skipped_interval_is_reported(detectors):
    a, d = dense_hash_detector(detectors)
    a += 1                                            # dense again: X
    ranges = d.dirty()
    assert ranges == [(0, DENSE_N)]
    a[4 * 4096] += 1                                  # Y: written between dirty() and the copy
    copy_and_note(d, a, ranges)
    a[4 * 4096] -= 1                                  # reverted to X
    got = d.dirty()
    assert any(o <= 4 * 4096 < o + n for o, n in got), got


def test_hash_small_buffers_are_always_hashed(detectors):
    a = np.zeros(dirty.DENSE_MIN_BYTES - 1, np.uint8)
    d = detectors(a, "hash")
    d.dirty()
    a += 1
    copy_and_note(d, a, d.dirty())
    assert d.dirty() == []


def test_hash_dense_state_is_not_inherited_by_a_forked_child(detectors):
    a, d = dense_hash_detector(detectors)

    def child():
        assert d.dirty() is None                      # cannot vouch after fork: re-armed
        a[2 * 4096] = 5
        return d.dirty()
    assert _in_child(child) == repr(page_ranges([2]))
    assert d.dirty() == [(0, DENSE_N)]                # the parent's state is its own


def test_noted_changes_tells_what_a_skipped_pass_copied(detectors):
    a = np.zeros(DENSE_N, np.uint8)
    d = detectors(a, "hash")
    d.dirty()
    assert d.noted_changes() is None                  # first call: armed, nothing to tell
    a += 1
    got = d.dirty()
    copy_and_note(d, a, got)
    assert d.noted_changes() is None                  # hashed: its report is exact already
    a[[4 * 4096, 5 * 4096, 9 * 4096 + 17]] += 1
    a[-1] += 1
    whole = d.dirty()
    assert whole == [(0, DENSE_N)]
    assert d.noted_changes() is None                  # skipped, not noted yet
    half = (DENSE_N // 2) // 4096 * 4096
    staged, fps = nat.gather_fingerprints(a, [(0, half)], page_size=4096)
    d.note_stored_many([(0, half)], staged, fps)
    assert d.noted_changes() is None                  # only part of the buffer noted
    staged, fps = nat.gather_fingerprints(a, [(half, DENSE_N - half)], page_size=4096)
    d.note_stored_many([(half, DENSE_N - half)], staged, fps)
    assert d.noted_changes() == [(4 * 4096, 2 * 4096), (9 * 4096, 4096),
                                 ((DENSE_PAGES - 1) * 4096, 5)]
    assert d.noted_changes() == d.noted_changes()     # the same call twice
    assert d.dirty() == []                            # 4 pages changed: hashed again
    assert d.noted_changes() is None
    d.close()
    assert d.noted_changes() is None


@pytest.mark.parametrize("mode", mode_param(["uffd", "shadow", "full"]))
def test_noted_changes_is_none_for_other_modes(detectors, mode):
    a = np.zeros(DENSE_N, np.uint8)
    d = detectors(a, mode)
    d.dirty()
    for _ in range(2):
        a += 1
        got = d.dirty()
        copy_and_note(d, a, got)
        assert d.noted_changes() is None


def test_may_skip_false_always_hashes(detectors):
    a, d = dense_hash_detector(detectors)
    a[6 * 4096] = 3
    assert d.dirty(may_skip=False) == [(6 * 4096, 4096)]


def test_noted_changes_keeps_pages_noted_only_partly(detectors):
    a, d = dense_hash_detector(detectors)
    d.note_stored(100, a[100:110].tobytes())          # page 0 noted partly: not vouched for
    a[[0, 8 * 4096]] += 1                             # page 0 changed too
    assert d.dirty() == [(0, DENSE_N)]
    copy_and_note(d, a, [(0, DENSE_N)])
    assert d.noted_changes() == [(0, 4096), (8 * 4096, 4096)]
    a += 1
    copy_and_note(d, a, d.dirty())                    # dense again, then a page noted partly
    d.note_stored(3 * 4096 + 1, a[3 * 4096 + 1:3 * 4096 + 2].tobytes())
    assert d.dirty() == [(0, DENSE_N)]
    copy_and_note(d, a, [(0, DENSE_N)])
    assert d.noted_changes() == [(3 * 4096, 4096)]    # unchanged since, but still reported


def test_noted_changes_from_interleaved_notes(detectors):
    a, d = dense_hash_detector(detectors)
    a[[2 * 4096, 3 * 4096, 10 * 4096]] += 1
    assert d.dirty() == [(0, DENSE_N)]
    even = [(p * 4096, min(4096, DENSE_N - p * 4096)) for p in range(0, DENSE_PAGES, 2)]
    odd = [(p * 4096, min(4096, DENSE_N - p * 4096)) for p in range(1, DENSE_PAGES, 2)]
    for ranges in (odd, even):                        # apart pages, in two calls
        copy_and_note(d, a, ranges)
    assert d.noted_changes() == [(2 * 4096, 2 * 4096), (10 * 4096, 4096)]


_SIGINT_IN_THE_PROBE = r"""
import os
from snapstore.capture import dirty
from sigint_injection import interrupted_at_return

kernel = dirty._KERNEL
fds = len(os.listdir("/proc/self/fd"))
n, interrupted = 0, 0
while True:
    n += 1
    stopped, inject = interrupted_at_return(n, kernel.available)
    interrupted += stopped
    if kernel.status is not None:       # (None: interrupted before the probe began)
        assert kernel.status[0], kernel.status
        os.close(kernel.uffd)           # probe again from scratch next round
        os.close(kernel.pagemap)
        kernel.uffd, kernel.pagemap, kernel.status = -1, -1, None
    assert len(os.listdir("/proc/self/fd")) == fds, "descriptors leaked"
    if inject.where is None:            # fewer than n returns: every point was tried
        break
print(n, interrupted)
"""


@needs_uffd
def test_ctrl_c_anywhere_in_the_first_probe_is_a_clean_interrupt():
    """Regression: Ctrl-C during the uffd self-test (a store's first track()) surfaced as
    BufferError from closing the test's mapping, which the interrupted frame still exported.
    The probe is a few syscalls: the interrupt now lands as it ends, the probe's outcome
    kept and no descriptor leaked. A SIGINT at each function return in turn, in a child."""
    import subprocess
    import sys
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", _SIGINT_IN_THE_PROBE], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tried, interrupted = map(int, proc.stdout.split()[-2:])
    assert tried > 10 and interrupted == tried - 1
