"""Thin zero-copy Python wrappers over snapstore's C core (snapstore._ffi, csrc/*.c).

Every function accepts any C-contiguous buffer-protocol object (bytes, bytearray, memoryview,
mmap, numpy arrays of any dtype and shape) without copying it. The C calls release the GIL
(cffi API mode). C return codes become exceptions in one place, check().
"""
from __future__ import annotations

import array
import itertools
import operator
import os
import struct
import threading
from typing import Iterable, List, Sequence, Tuple

from snapstore import errors
from snapstore.halves import both
from snapstore._ffi import ffi, lib

FP_BYTES: int = int(lib.SNAP_FP_BYTES)
PAGE_MIN: int = int(lib.SNAP_PAGE_MIN)
PAGE_MAX: int = int(lib.SNAP_PAGE_MAX)
CDC_MIN_LIMIT: int = int(lib.SNAP_CDC_MIN_LIMIT)
CDC_MAX_LIMIT: int = int(lib.SNAP_CDC_MAX_LIMIT)

__all__ = [
    "FP_BYTES", "PAGE_MIN", "PAGE_MAX", "CDC_MIN_LIMIT", "CDC_MAX_LIMIT",
    "as_bytes_view", "byte_view", "check", "page_size_arg", "page_count", "page_fingerprints",
    "fingerprint_diff", "fingerprint_diff_runs", "PageFingerprints", "shadow_diff",
    "runs_to_ranges", "gather", "gather_fingerprints", "diff_bytes", "Chunker",
    "chunk_boundaries", "buffer_address",
    "SCAN_HUGE", "uffd_open", "uffd_register", "uffd_unregister", "pagemap_scan",
    "ITEMSIZE_MAX", "DELTA_XOR", "DELTA_SUB", "PLANES_ROTATE", "split_planes", "join_planes",
    "delta_split_planes", "delta_join_planes", "read_chunks", "READ_REASONS", "write_chunks",
    "RECORD_WRITE_SLACK", "raw_record_heads", "RAW_RECORD_HEAD",
]

# C code -> exception class, built from the library's own constants and errors.NATIVE_ERRORS.
_CODE_TO_CLASS = {int(getattr(lib, name)): cls for name, cls in errors.NATIVE_ERRORS.items()}

# Scratch arrays the C core fills completely before they are read: no need to zero them.
_new_uninit = ffi.new_allocator(should_clear_after_alloc=False)


def check(rc: int, function: str) -> None:
    """Raise the errors.NATIVE_ERRORS exception for a nonzero C return code (text: snap_strerror)."""
    if rc == 0:
        return
    cls = _CODE_TO_CLASS.get(rc, errors.NativeError)
    text = ffi.string(lib.snap_strerror(rc)).decode("ascii", "replace")
    raise cls(f"{function}: {text} (code {rc})", function=function, code=rc)


def as_bytes_view(obj, writable: bool = False, name: str = "buffer") -> memoryview:
    """Validate a buffer-protocol object and return a flat unsigned-byte memoryview of it (no copy).

    Raises InvalidArgumentTypeError (a TypeError) for objects without the buffer protocol and
    for read-only buffers when writable is true, InvalidArgumentError (a ValueError) for
    non-C-contiguous buffers.
    """
    try:
        mv = memoryview(obj)
    except TypeError:
        raise errors.InvalidArgumentTypeError(
            f"{name}: expected a bytes-like object, got {type(obj).__name__}") from None
    except (ValueError, BufferError) as e:  # e.g. numpy datetime arrays, a closed mmap
        raise errors.InvalidArgumentTypeError(
            f"{name}: expected a bytes-like object, got a {type(obj).__name__} "
            f"that cannot export its buffer ({e})") from None
    if not mv.c_contiguous:
        raise errors.InvalidArgumentError(
            f"{name}: expected a C-contiguous buffer, got a non-contiguous "
            f"{type(obj).__name__} (shape {mv.shape}, strides {mv.strides})")
    if writable and mv.readonly:
        raise errors.InvalidArgumentTypeError(
            f"{name}: expected a writable buffer, got a read-only {type(obj).__name__}")
    if "O" in mv.format:   # e.g. numpy dtype=object: the bytes are PyObject pointers
        raise errors.InvalidArgumentTypeError(
            f"{name}: a buffer of Python object pointers (format {mv.format!r}) holds "
            "no data of its own; save such objects with store.save() instead")
    if mv.ndim == 1 and mv.format == "B":
        return mv
    if mv.nbytes == 0:  # memoryview.cast refuses shapes containing 0
        return memoryview(bytearray() if writable else b"")
    return mv.cast("B")


def byte_view(obj, name: str = "buffer") -> memoryview:
    """obj itself when it is a flat C-contiguous byte memoryview already (the cheap check of
    hot paths), else as_bytes_view(obj, name=name)."""
    if type(obj) is memoryview and obj.format == "B" and obj.ndim == 1 and obj.c_contiguous:
        return obj
    return as_bytes_view(obj, name=name)


def _int_arg(value, name: str, limit: int, what: str) -> int:
    """An int in [0, limit), limit a power of two (InvalidArgumentTypeError if not an int,
    InvalidArgumentError if out of range)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise errors.InvalidArgumentTypeError(
            f"{name}: expected {what}, got {type(value).__name__}") from None
    if not 0 <= v < limit:
        raise errors.InvalidArgumentError(
            f"{name} must be {what} in [0, 2**{limit.bit_length() - 1}), got {v}")
    return v


def _size_arg(value, name: str) -> int:
    """A size argument: an int in [0, 2**64)."""
    return _int_arg(value, name, 1 << 64, "an int")


def page_size_arg(page_size) -> int:
    """A page size argument, checked: a power of two in [PAGE_MIN, PAGE_MAX] (TypeError if not
    an int, InvalidArgumentError otherwise)."""
    ps = _size_arg(page_size, "page_size")
    if not (PAGE_MIN <= ps <= PAGE_MAX) or ps & (ps - 1):
        raise errors.InvalidArgumentError(
            f"page_size must be a power of two in [{PAGE_MIN}, {PAGE_MAX}], got {ps}")
    return ps


def _ptr(mv: memoryview, writable: bool = False):
    """uint8_t* cdata over a validated byte view (ffi.from_buffer, no copy)."""
    return ffi.from_buffer("uint8_t[]", mv, require_writable=writable)


def _runs_list(runs, n: int) -> List[Tuple[int, int]]:
    """C run pairs (first_page, n_pages) -> list of tuples."""
    flat = ffi.unpack(runs, 2 * n) if n else []
    it = iter(flat)
    return list(zip(it, it))


def page_count(nbytes: int, page_size: int) -> int:
    """Number of pages covering nbytes bytes (snap_page_count)."""
    return int(lib.snap_page_count(_size_arg(nbytes, "nbytes"), page_size_arg(page_size)))


def _fp_pages(src: memoryview, ps: int, out, out_len: int) -> None:
    """snap_fp_pages: the digests of src's pages into out (a uint8_t* of out_len bytes).
    (Runs once per stored range in dirty-page tracking: written for speed.)"""
    rc = lib.snap_fp_pages(ffi.from_buffer("uint8_t[]", src), len(src), ps, out, out_len)
    if rc:
        check(rc, "snap_fp_pages")


def page_fingerprints(buf, page_size: int = 4096) -> bytearray:
    """XXH3-128 digest of every page, FP_BYTES each, low64 then high64 LE (snap_fp_pages)."""
    ps = page_size_arg(page_size)
    src = as_bytes_view(buf, name="buf")
    out = bytearray(FP_BYTES * int(lib.snap_page_count(len(src), ps)))
    _fp_pages(src, ps, _ptr(out, True), len(out))
    return out


def _fp_diff_args(buf, fingerprints, page_size):
    """(page size, buf view, writable fingerprints view, pages) checked for the diff calls."""
    ps = page_size_arg(page_size)
    src = as_bytes_view(buf, name="buf")
    fps = as_bytes_view(fingerprints, writable=True, name="fingerprints")
    pages = int(lib.snap_page_count(len(src), ps))
    if len(fps) != FP_BYTES * pages:
        raise errors.InvalidArgumentError(
            f"fingerprints holds {len(fps)} bytes; {pages} pages of {ps} bytes need "
            f"{FP_BYTES * pages}")
    if _overlap(src, fps):          # the C loop writes digests while it hashes the pages
        raise errors.InvalidArgumentError("fingerprints and buf must not overlap")
    return ps, src, fps, pages


PARALLEL_DIFF_BYTES = 64 << 20     # fingerprint_diff of a buffer this large uses 2 threads


def fingerprint_diff(buf, fingerprints, page_size: int = 4096) -> List[Tuple[int, int]]:
    """Changed-page runs (first_page, n_pages) of buf vs fingerprints, updated in place (snap_fp_diff).

    A buffer of PARALLEL_DIFF_BYTES or more is diffed in two halves at once, the second on a
    thread of its own (the C call lets go of the GIL): pages are independent, so the result
    is the same; a run that crosses the halves' border is joined again."""
    ps, src, fps, pages = _fp_diff_args(buf, fingerprints, page_size)
    if len(src) < PARALLEL_DIFF_BYTES or pages < 2:
        return _fp_diff_span(src, ps, fps, pages, 0)
    half = pages // 2
    cut = half * ps
    first, rest = both(
        lambda: _fp_diff_span(src[:cut], ps, fps[:FP_BYTES * half], half, 0),
        lambda: _fp_diff_span(src[cut:], ps, fps[FP_BYTES * half:], pages - half, half))
    if first and rest and first[-1][0] + first[-1][1] == rest[0][0]:
        first[-1] = (first[-1][0], first[-1][1] + rest[0][1])
        rest = rest[1:]
    return first + rest


def _fp_diff_span(src: memoryview, ps: int, fps: memoryview, pages: int,
                  base: int) -> List[Tuple[int, int]]:
    """snap_fp_diff over src (pages pages, fps their digests), runs numbered from page base."""
    max_runs = (pages + 1) // 2
    runs = _new_uninit("uint64_t[]", 2 * max_runs or 1)
    n = ffi.new("size_t *")
    check(lib.snap_fp_diff(_ptr(src), len(src), ps,
                           _ptr(fps, True), len(fps),
                           runs, max_runs, n),
          "snap_fp_diff")
    found = _runs_list(runs, n[0])
    return [(first + base, count) for first, count in found] if base else found


def shadow_diff(buf, shadow, page_size: int = 4096) -> List[Tuple[int, int]]:
    """Changed-page runs of buf vs shadow; changed pages are copied into shadow (snap_shadow_diff)."""
    ps = page_size_arg(page_size)
    src = as_bytes_view(buf, name="buf")
    sh = as_bytes_view(shadow, writable=True, name="shadow")
    if len(sh) != len(src):
        raise errors.InvalidArgumentError(
            f"shadow holds {len(sh)} bytes, buf {len(src)}: they must be the same size")
    pages = int(lib.snap_page_count(len(src), ps))
    max_runs = (pages + 1) // 2
    runs = _new_uninit("uint64_t[]", 2 * max_runs or 1)
    n = ffi.new("size_t *")
    check(lib.snap_shadow_diff(_ptr(src), _ptr(sh, True),
                               len(src), ps, runs, max_runs, n),
          "snap_shadow_diff")
    return _runs_list(runs, n[0])


def runs_to_ranges(runs: Iterable[Sequence[int]], nbytes: int,
                   page_size: int) -> List[Tuple[int, int]]:
    """Page runs (first_page, n_pages) -> byte ranges (offset, length), last page clipped (pure Python)."""
    ps = page_size_arg(page_size)
    nbytes = _size_arg(nbytes, "nbytes")
    out = []
    for item in _sequence(runs, "runs", "(first_page, n_pages) pairs"):
        first, count = _run_pair(item)
        off = first * ps
        if first < 0 or count <= 0 or off >= nbytes:
            raise errors.InvalidArgumentError(
                f"run ({first}, {count}) is empty or outside {nbytes} bytes of {ps}-byte pages")
        out.append((off, min((first + count) * ps, nbytes) - off))
    return out


def _sequence(value, name: str, shape: str) -> Sequence:
    """value as a sequence (a list or tuple as it is, another iterable listed once);
    InvalidArgumentTypeError naming the expected shape for anything else."""
    if isinstance(value, (list, tuple)):
        return value
    if isinstance(value, (str, bytes, bytearray, memoryview)) or value is None:
        raise errors.InvalidArgumentTypeError(f"{name}: expected a sequence of {shape}, got "
                                              f"{type(value).__name__}")
    try:
        return list(value)
    except TypeError:
        raise errors.InvalidArgumentTypeError(f"{name}: expected a sequence of {shape}, got "
                                              f"{type(value).__name__}") from None


def _pairs(items: list) -> bool:
    """Whether every item has exactly 2 elements (a total of 2n alone would let (a, b, c),
    (d,) pass as (a, b), (c, d))."""
    try:
        return all(map((2).__eq__, map(len, items)))       # at C speed
    except TypeError:
        return False


def _ranges_array(ranges, nbytes: int) -> Tuple[object, int, int]:
    """(uint64_t[2n] cdata, n, total length) of gather's (offset, length) pairs, checked against nbytes."""
    if isinstance(ranges, list):
        try:        # fast path (C speed); anything odd falls through to the checked loop
            flat_q = array.array("Q", itertools.chain.from_iterable(ranges))
        except (TypeError, ValueError, OverflowError):
            flat_q = None
        if flat_q is not None and len(flat_q) == 2 * len(ranges) and _pairs(ranges):
            offs, lens = flat_q[0::2], flat_q[1::2]
            if all(o + n <= nbytes for o, n in zip(offs, lens)):
                if not flat_q:
                    return ffi.NULL, 0, 0
                return ffi.from_buffer("uint64_t[]", flat_q), len(ranges), sum(lens)
    flat: List[int] = []
    total = 0
    for item in _sequence(ranges, "ranges", "(offset, length) pairs"):
        off, length = _int_pair(item, "ranges", "(offset, length)")
        if off < 0 or length < 0 or off + length > nbytes:
            raise errors.InvalidArgumentError(
                f"ranges: ({off}, {length}) is not inside the buffer of {nbytes} bytes")
        flat.append(off)
        flat.append(length)
        total += length
    return (ffi.new("uint64_t[]", flat) if flat else ffi.NULL), len(flat) // 2, total


def _gather_args(buf, ranges, out) -> tuple:
    """(buf view, its pointer, ranges cdata, their count, their total, out view, its pointer),
    checked for gather and gather_fingerprints (out None: a new buffer of the total)."""
    src = as_bytes_view(buf, name="buf")
    arr, n, total = _ranges_array(ranges, len(src))
    if out is None:
        dst = memoryview(bytearray(total))
    else:
        dst = as_bytes_view(out, writable=True, name="out")
        if total > len(dst):
            raise errors.InvalidArgumentError(f"out holds {len(dst)} bytes; the ranges need {total}")
    src_p, dst_p = _ptr(src), _ptr(dst, True)
    s0, d0 = int(ffi.cast("uintptr_t", src_p)), int(ffi.cast("uintptr_t", dst_p))
    if len(src) and len(dst) and s0 < d0 + len(dst) and d0 < s0 + len(src):
        raise errors.InvalidArgumentError("out must not overlap buf")
    return src, src_p, arr, n, total, dst, dst_p


def gather(buf, ranges: Iterable[Sequence[int]], out=None) -> memoryview:
    """Copy byte ranges (offset, length) of buf back to back into out; view of the filled prefix (snap_gather)."""
    src, src_p, arr, n, _, dst, dst_p = _gather_args(buf, ranges, out)
    n_out = ffi.new("size_t *")
    check(lib.snap_gather(src_p, len(src), arr, n, dst_p, len(dst), n_out), "snap_gather")
    return dst[:n_out[0]]


def gather_fingerprints(buf, ranges: Iterable[Sequence[int]], out=None,
                        page_size: int = 4096) -> Tuple[memoryview, bytearray]:
    """gather(buf, ranges, out) and page_fingerprints() of the bytes it copied, in one pass
    (snap_gather_fp: each piece is fingerprinted while it is still in the cache): (view of
    the filled prefix of out, its digests). The C call lets go of the GIL."""
    ps = page_size_arg(page_size)
    src, src_p, arr, n, total, dst, dst_p = _gather_args(buf, ranges, out)
    fps = bytearray(FP_BYTES * int(lib.snap_page_count(total, ps)))
    n_out = ffi.new("size_t *")
    check(lib.snap_gather_fp(src_p, len(src), arr, n, dst_p, len(dst), n_out, ps,
                             _ptr(fps, True), len(fps)), "snap_gather_fp")
    return dst[:n_out[0]], fps


# diff_bytes calls the C kernel on slices of at most this many bytes, so its scratch run array
# stays bounded (16 bytes per possible run) whatever the input size; seams are merged here.
DIFF_SLICE = 1 << 20


def diff_bytes(a, b, gap: int = 0) -> Tuple[List[Tuple[int, int]], int]:
    """(runs, changed) of two equal-length buffers (snap_diff_bytes): runs are (offset, length)
    pairs, ascending, where a and b differ, runs fewer than max(gap, 1) bytes apart merged
    (gap 0: exact runs); changed is the exact number of differing bytes."""
    x, y = as_bytes_view(a, name="a"), as_bytes_view(b, name="b")
    if len(x) != len(y):
        raise errors.InvalidArgumentError(f"a holds {len(x)} bytes and b {len(y)}: "
                                          "diff_bytes needs equal lengths")
    g = _size_arg(gap, "gap")
    cap = min(len(x), DIFF_SLICE) // (max(g, 1) + 1) + 1
    runs = _new_uninit("uint64_t[]", 2 * cap)
    n_runs, n_changed = ffi.new("size_t *"), ffi.new("uint64_t *")
    px, py = _ptr(x), _ptr(y)
    out: List[Tuple[int, int]] = []
    changed = 0
    for base in range(0, len(x), DIFF_SLICE):
        n = min(DIFF_SLICE, len(x) - base)
        check(lib.snap_diff_bytes(px + base, py + base, n, g, runs, cap, n_runs, n_changed),
              "snap_diff_bytes")
        changed += int(n_changed[0])
        flat = ffi.unpack(runs, 2 * n_runs[0]) if n_runs[0] else []
        for i in range(0, len(flat), 2):
            off, length = base + flat[i], flat[i + 1]
            if out and off - (out[-1][0] + out[-1][1]) < max(g, 1):   # merge across the seam
                out[-1] = (out[-1][0], off + length - out[-1][0])
            else:
                out.append((off, length))
    return out, changed


class Chunker:
    """Streaming FastCDC chunker (snap_cdc_init / snap_cdc_feed / snap_cdc_finish).

    feed() returns the absolute end offsets of the chunks completed so far; finish() ends the
    stream (returning its length if a chunk is open) and resets the chunker for reuse. One
    chunker serves one stream at a time; calls are serialised by a lock.
    """

    def __init__(self, min_size: int = 16384, avg_size: int = 65536,
                 max_size: int = 262144) -> None:
        """Set up the chunk sizes (snap_cdc_init); InvalidArgumentError if they are out of range."""
        self.min_size = _size_arg(min_size, "min_size")
        self.avg_size = _size_arg(avg_size, "avg_size")
        self.max_size = _size_arg(max_size, "max_size")
        self._state = ffi.new("snap_cdc *")
        self._lock = threading.Lock()
        check(lib.snap_cdc_init(self._state, self.min_size, self.avg_size, self.max_size),
              "snap_cdc_init")

    def feed(self, data) -> List[int]:
        """Feed the next piece of the stream; ends of chunks completed so far (snap_cdc_feed)."""
        src = as_bytes_view(data, name="data")
        total = len(src)
        if total == 0:
            return []
        result: List[int] = []
        n_cuts = ffi.new("size_t *")
        consumed = ffi.new("size_t *")
        with self._lock:
            ptr = _ptr(src)
            # total // min_size + 1 always suffices (chunks are > min_size bytes); cap the
            # scratch array for tiny min sizes: the C core stops when it is full.
            max_cuts = min(total // self.min_size + 1, 1 << 16)
            cuts = _new_uninit("uint64_t[]", max_cuts)
            done = 0
            while done < total:
                check(lib.snap_cdc_feed(self._state, ptr + done, total - done, cuts, max_cuts,
                                        n_cuts, consumed),
                      "snap_cdc_feed")
                if n_cuts[0]:
                    result.extend(ffi.unpack(cuts, n_cuts[0]))
                done += consumed[0]
        return result

    def finish(self) -> List[int]:
        """End the stream: [] or [stream length]; the chunker resets to offset 0 (snap_cdc_finish)."""
        cut = ffi.new("uint64_t *")
        n = ffi.new("size_t *")
        with self._lock:
            check(lib.snap_cdc_finish(self._state, cut, n), "snap_cdc_finish")
        return [int(cut[0])] if n[0] else []


def chunk_boundaries(buf, min_size: int = 16384, avg_size: int = 65536,
                     max_size: int = 262144) -> List[int]:
    """One-shot FastCDC: ascending chunk end offsets, the last == len(buf) (Chunker / snap_cdc_*)."""
    chunker = Chunker(min_size, avg_size, max_size)
    cuts = chunker.feed(buf)
    cuts.extend(chunker.finish())
    return cuts


def buffer_address(buf) -> int:
    """The address of a buffer's first byte (identity of the memory behind a view)."""
    view = as_bytes_view(buf)
    return int(ffi.cast("uintptr_t", ffi.from_buffer(view))) if len(view) else 0


def fingerprint_diff_runs(buf, fingerprints, runs: Sequence[Sequence[int]],
                          page_size: int = 4096) -> List[Tuple[int, int]]:
    """fingerprint_diff over only the pages of runs (first_page, n_pages) (snap_fp_diff_runs).

    runs: ascending, non-overlapping, non-empty, inside the buffer. Changed pages among them
    come back as runs; their digests are updated in place; other digests are untouched.
    """
    ps, src, fps, pages = _fp_diff_args(buf, fingerprints, page_size)
    return _fp_diff_runs(src, ps, _ptr(fps, True), len(fps), pages, runs)


def _runs_flat(runs) -> "array.array":
    """Run pairs (first_page, n_pages) -> a flat uint64 array, at C speed for pairs of ints
    (InvalidArgumentTypeError for anything but pairs of ints, InvalidArgumentError for a
    number outside [0, 2**64))."""
    runs = _sequence(runs, "runs", "(first_page, n_pages) pairs")
    try:
        if _pairs(runs):
            return array.array("Q", itertools.chain.from_iterable(runs))
    except (TypeError, OverflowError):
        pass                                # named below
    flat = array.array("Q")
    for item in runs:
        first, count = _run_pair(item)
        flat.append(first)
        flat.append(count)
    return flat


def _int_pair(item, name: str, shape: str) -> tuple[int, int]:
    """item as a pair of ints; InvalidArgumentTypeError naming `name` and the pair's `shape`
    for anything else."""
    try:
        a, b = item
        return operator.index(a), operator.index(b)
    except (TypeError, ValueError):
        raise errors.InvalidArgumentTypeError(
            f"{name}: expected {shape} pairs of ints, got {item!r:.60}") from None


def _run_pair(item) -> tuple[int, int]:
    """A run (first_page, n_pages) checked: two ints in [0, 2**64)."""
    first, count = _int_pair(item, "runs", "(first_page, n_pages)")
    if not (0 <= first < 1 << 64 and 0 <= count < 1 << 64):
        raise errors.InvalidArgumentError(f"run ({first}, {count}) is outside [0, 2**64)")
    return first, count


def _fp_diff_runs(src: memoryview, ps: int, fps, fps_len: int, pages: int,
                  runs) -> List[Tuple[int, int]]:
    """snap_fp_diff_runs over a checked byte view and digests (a uint8_t* of fps_len bytes)."""
    flat = _runs_flat(runs)
    if not flat:
        return []
    # changed pages are among the listed ones, and there are at most `pages` of them (the C
    # core refuses runs outside the buffer)
    listed = min(sum(flat[1::2]), pages) or 1
    out = _new_uninit("uint64_t[]", 2 * listed)
    n = ffi.new("size_t *")
    check(lib.snap_fp_diff_runs(_ptr(src), len(src), ps, fps, fps_len,
                                ffi.from_buffer("uint64_t[]", flat), len(flat) // 2,
                                out, listed, n),
          "snap_fp_diff_runs")
    return _runs_list(out, n[0])


class PageFingerprints:
    """The page digests of one buffer (page_fingerprints' layout), kept for repeated
    comparisons: the baseline a "hash" dirty-page detector diffs against.

    ``digests`` is the bytearray; it stays pinned for the C calls (it cannot be resized while
    this object lives; assigning slices of it is fine). Every method is one C call over it.
    """

    __slots__ = ("page_size", "nbytes", "_digests", "_pin")

    def __init__(self, buf, page_size: int = 4096) -> None:
        """Digests of buf's pages now (snap_fp_pages)."""
        self.page_size = page_size_arg(page_size)
        self.nbytes = len(as_bytes_view(buf, name="buf"))
        self._digests = page_fingerprints(buf, self.page_size)
        self._pin = _ptr(self._digests, True)

    @property
    def digests(self) -> bytearray:
        """The digests (read-only attribute: the C calls write through the pinned array, so
        another array in its place would be bounds-checked and never written)."""
        return self._digests

    def diff(self, buf) -> List[Tuple[int, int]]:
        """Changed-page runs of buf (same size) since the digests; digests updated (snap_fp_diff)."""
        return fingerprint_diff(buf, self._digests, self.page_size)

    def diff_runs(self, buf, runs: Sequence[Sequence[int]]) -> List[Tuple[int, int]]:
        """diff() over only the pages of runs (see fingerprint_diff_runs; snap_fp_diff_runs)."""
        src = as_bytes_view(buf, name="buf")
        if len(src) != self.nbytes:
            raise errors.InvalidArgumentError(
                f"buf holds {len(src)} bytes; the fingerprints are of {self.nbytes}")
        return _fp_diff_runs(src, self.page_size, self._pin, len(self._digests),
                             len(self._digests) // FP_BYTES, runs)

    def update(self, first_page: int, data) -> None:
        """Sets the digests of pages first_page, first_page + 1, ... to those of data's pages
        (snap_fp_pages): data holds whole pages of the buffer from first_page on; only the
        buffer's last page may be short. Runs once per stored range: kept lean."""
        data = byte_view(data, name="data")
        at, size = operator.index(first_page) * FP_BYTES, len(self._digests)
        if not 0 <= at <= size:
            raise errors.InvalidArgumentError(
                f"first_page {first_page} is outside the buffer's {size // FP_BYTES} pages")
        if len(data) % self.page_size and \
                operator.index(first_page) * self.page_size + len(data) != self.nbytes:
            raise errors.InvalidArgumentError(
                f"data of {len(data)} bytes is not whole {self.page_size}-byte pages and does "
                f"not end the {self.nbytes}-byte buffer")
        _fp_pages(data, self.page_size, self._pin + at, size - at)


# ---- byte planes of fixed-size items (csrc/planes.c; docs/floatcodec.md) ------------------
ITEMSIZE_MAX: int = int(lib.SNAP_ITEMSIZE_MAX)
DELTA_XOR: int = int(lib.SNAP_DELTA_XOR)
DELTA_SUB: int = int(lib.SNAP_DELTA_SUB)
PLANES_ROTATE: int = int(lib.SNAP_PLANES_ROTATE)
PLANES_ROTATION_MAX: int = int(lib.SNAP_PLANES_ROTATION)     # rotations are 0..this
_DELTA_NAMES = {DELTA_XOR: "DELTA_XOR", DELTA_SUB: "DELTA_SUB"}


def _typed_view(obj, name: str, writable: bool = False) -> memoryview:
    """as_bytes_view, with its TypeErrors (no buffer protocol, read-only where writable is
    needed) raised as errors.InvalidArgumentTypeError (still a TypeError)."""
    try:
        return as_bytes_view(obj, writable=writable, name=name)
    except errors.InvalidArgumentError:
        raise
    except TypeError as exc:
        raise errors.InvalidArgumentTypeError(str(exc)) from None


def _itemsize_arg(itemsize) -> int:
    """An item size: an int in [1, ITEMSIZE_MAX]."""
    try:
        k = operator.index(itemsize)
    except TypeError:
        raise errors.InvalidArgumentTypeError(
            f"itemsize: expected an int, got {type(itemsize).__name__}") from None
    if not 1 <= k <= ITEMSIZE_MAX:
        raise errors.InvalidArgumentError(f"itemsize must be in [1, {ITEMSIZE_MAX}], got {k}")
    return k


def _delta_arg(mode, itemsize: int) -> int:
    """A delta mode: DELTA_XOR (any item size) or DELTA_SUB (item size 1, 2, 4 or 8)."""
    try:
        m = operator.index(mode)
    except TypeError:
        raise errors.InvalidArgumentTypeError(
            f"mode: expected DELTA_XOR or DELTA_SUB, got {type(mode).__name__}") from None
    if m not in _DELTA_NAMES:
        raise errors.InvalidArgumentError(
            f"mode must be DELTA_XOR ({DELTA_XOR}) or DELTA_SUB ({DELTA_SUB}), got {m}")
    if m == DELTA_SUB and itemsize not in (1, 2, 4, 8):
        raise errors.InvalidArgumentError(
            f"DELTA_SUB works on 1-, 2-, 4- or 8-byte items, not {itemsize}: use DELTA_XOR")
    return m


def _overlap(a: memoryview, b: memoryview) -> bool:
    """Do two non-empty byte views share memory?"""
    if not len(a) or not len(b):
        return False
    pa, pb = buffer_address(a), buffer_address(b)
    return pa < pb + len(b) and pb < pa + len(a)


def _given_or_new(buf, nbytes: int, name: str) -> memoryview:
    """A writable view of buf, or (buf None) of a new uninitialised buffer of nbytes (at
    least 1 byte allocated, so its address is never NULL)."""
    if buf is None:
        return memoryview(ffi.buffer(_new_uninit("uint8_t[]", nbytes or 1)))[:nbytes]
    return _typed_view(buf, name, writable=True)


def _planes_out(out, nbytes: int, inputs, name: str = "out", allow=None) -> memoryview:
    """The output view: a new uninitialised buffer of nbytes (out None), else out checked:
    writable, at least nbytes, sharing no memory with the inputs (except `allow` exactly)."""
    if out is None:
        return _given_or_new(None, nbytes, name)
    dst = _typed_view(out, name, writable=True)
    if len(dst) < nbytes:
        raise errors.InvalidArgumentError(f"{name} holds {len(dst)} bytes; {nbytes} are needed")
    dst = dst[:nbytes]
    for what, view in inputs:
        if view is allow and buffer_address(view) == buffer_address(dst):
            continue
        if _overlap(dst, view):
            raise errors.InvalidArgumentError(f"{name} must not overlap {what}")
    return dst


def _rotation_arg(rotate) -> int:
    """The rotation rotate names: a bool (True: PLANES_ROTATE, one bit) or an int of bits,
    0..PLANES_ROTATION_MAX."""
    if not isinstance(rotate, (bool, int)):
        raise errors.InvalidArgumentTypeError(
            f"rotate: expected a bool or an int of bits, got {type(rotate).__name__}")
    if isinstance(rotate, bool):
        return PLANES_ROTATE if rotate else 0
    if not 0 <= rotate <= PLANES_ROTATION_MAX:
        raise errors.InvalidArgumentError(
            f"rotate: a rotation of 0..{PLANES_ROTATION_MAX} bits, not {rotate}")
    return rotate


def _rotate_arg(rotate, itemsize: int) -> int:
    """The split flags for rotate (_rotation_arg): a rotation needs an item size of 1, 2, 4 or
    8."""
    rotation = _rotation_arg(rotate)
    if rotation and itemsize not in (1, 2, 4, 8):
        raise errors.InvalidArgumentError(
            f"rotate works on 1-, 2-, 4- or 8-byte items, not {itemsize}")
    return rotation


def split_planes(buf, itemsize: int, out=None, rotate: bool | int = False) -> memoryview:
    """The byte planes of buf's items (snap_split_planes): byte 0 of every item, then byte 1,
    ..., then the len(buf) % itemsize tail bytes as they are. Any bytes (floats as raw bytes
    or not) and any length are accepted.

    Args:
        buf: the items, a C-contiguous buffer (len(buf) bytes).
        itemsize: bytes per item, 1..ITEMSIZE_MAX (2 for float16/bfloat16, 4 for float32...).
        out: optional writable buffer of at least len(buf) bytes, not overlapping buf.
        rotate: rotate each item (a little-endian word of 1, 2, 4 or 8 bytes) left first, by
            one bit for True (SNAP_PLANES_ROTATE: a float's sign bit goes to bit 0, so the top
            plane of float32 or bfloat16 holds exactly the exponents), or by an int of bits,
            0..PLANES_ROTATION_MAX.
    Returns:
        A writable memoryview of len(buf) bytes: out's prefix, or a new buffer.
    Raises:
        InvalidArgumentError (bad itemsize, a rotation out of range or with another item
        size, out too small or overlapping), InvalidArgumentTypeError (not a buffer, out
        read-only).
    """
    k = _itemsize_arg(itemsize)
    flags = _rotate_arg(rotate, k)
    src = _typed_view(buf, "buf")
    dst = _planes_out(out, len(src), [("buf", src)])
    check(lib.snap_split_planes(_ptr(src), len(src), k, flags, _ptr(dst, True), len(dst)),
          "snap_split_planes")
    return dst


def join_planes(planes, itemsize: int, out=None, rotate: bool | int = False) -> memoryview:
    """The items back from their byte planes (snap_join_planes): the exact inverse of
    split_planes with the same itemsize and rotate.

    Args:
        planes: split_planes' output (len(planes) bytes).
        itemsize, rotate: as given to split_planes.
        out: optional writable buffer of at least len(planes) bytes, not overlapping planes.
    Returns:
        A writable memoryview of len(planes) bytes: out's prefix, or a new buffer.
    Raises:
        InvalidArgumentError, InvalidArgumentTypeError (as split_planes).
    """
    k = _itemsize_arg(itemsize)
    flags = _rotate_arg(rotate, k)
    src = _typed_view(planes, "planes")
    dst = _planes_out(out, len(src), [("planes", src)])
    check(lib.snap_join_planes(_ptr(src), len(src), k, flags, _ptr(dst, True), len(dst)),
          "snap_join_planes")
    return dst


def delta_split_planes(cur, ref, itemsize: int, mode: int = DELTA_SUB, out=None) -> memoryview:
    """The byte planes of cur coded against ref, its previous version (snap_delta_split_planes).

    Item i becomes delta(cur item i, ref item i), then the items are split as by split_planes;
    the tail bytes are cur's XOR ref's. DELTA_SUB (the default): zigzag of the little-endian
    integer difference (items of 1, 2, 4 or 8 bytes; for floats of the same sign, the distance
    in ulps); DELTA_XOR: byte-wise XOR (any item size). Unchanged items give zero bytes.

    Args:
        cur, ref: buffers of equal length (they may be the same object).
        itemsize: bytes per item, 1..ITEMSIZE_MAX.
        mode: DELTA_SUB or DELTA_XOR.
        out: optional writable buffer of at least len(cur) bytes, overlapping neither input.
    Returns:
        A writable memoryview of len(cur) bytes: out's prefix, or a new buffer.
    Raises:
        InvalidArgumentError (lengths differ, bad itemsize or mode, out too small or
        overlapping), InvalidArgumentTypeError (not a buffer, out read-only).
    """
    k = _itemsize_arg(itemsize)
    m = _delta_arg(mode, k)
    c, r = _typed_view(cur, "cur"), _typed_view(ref, "ref")
    if len(c) != len(r):
        raise errors.InvalidArgumentError(
            f"cur holds {len(c)} bytes and ref {len(r)}: they must be the same size")
    dst = _planes_out(out, len(c), [("cur", c), ("ref", r)])
    check(lib.snap_delta_split_planes(_ptr(c), _ptr(r), len(c), k, m, _ptr(dst, True), len(dst)),
          "snap_delta_split_planes")
    return dst


def delta_join_planes(planes, ref, itemsize: int, mode: int = DELTA_SUB,
                      out=None) -> memoryview:
    """cur rebuilt from delta_split_planes' planes and ref (snap_delta_join_planes): the exact
    inverse with the same itemsize and mode.

    Args:
        planes: delta_split_planes' output; ref: the same reference (equal lengths).
        itemsize, mode: as given to delta_split_planes.
        out: optional writable buffer of at least len(planes) bytes, not overlapping planes;
            it may be ref itself (same start: rebuilt in place), but not overlap it otherwise.
    Returns:
        A writable memoryview of len(planes) bytes: out's prefix, or a new buffer.
    Raises:
        InvalidArgumentError, InvalidArgumentTypeError (as delta_split_planes).
    """
    k = _itemsize_arg(itemsize)
    m = _delta_arg(mode, k)
    p, r = _typed_view(planes, "planes"), _typed_view(ref, "ref")
    if len(p) != len(r):
        raise errors.InvalidArgumentError(
            f"planes holds {len(p)} bytes and ref {len(r)}: they must be the same size")
    dst = _planes_out(out, len(p), [("planes", p), ("ref", r)], allow=r)
    check(lib.snap_delta_join_planes(_ptr(p), _ptr(r), len(p), k, m, _ptr(dst, True), len(dst)),
          "snap_delta_join_planes")
    return dst


# ---- kernel dirty-page tracking (csrc/uffd.c): system-call wrappers over plain integers ----
SCAN_HUGE: int = int(lib.SNAP_SCAN_HUGE)
_SCAN_BATCH = 4096   # ranges per pagemap_scan call (96 KiB scratch)


def _check_sys(rc: int, err, function: str) -> None:
    """check() for the system-call wrappers: SNAP_ESYS becomes NativeSystemError with errno."""
    if rc == lib.SNAP_ESYS:
        e = int(err[0])
        raise errors.NativeSystemError(f"{function}: {os.strerror(e)} (errno {e})",
                                       function=function, code=rc, errno_=e)
    check(rc, function)


def _fd_arg(value, name: str) -> int:
    """A file descriptor argument: an int in [0, 2**31)."""
    return _int_arg(value, name, 1 << 31, "an int file descriptor")


def uffd_open() -> Tuple[int, int, bool]:
    """(fd, kernel features, user_mode_only) of a new userfaultfd set up for async write-protect
    (snap_uffd_open). NativeSystemError (an OSError) if the kernel refuses it."""
    fd, feats, umo, err = (ffi.new("int *"), ffi.new("uint64_t *"), ffi.new("int *"),
                           ffi.new("int *"))
    _check_sys(lib.snap_uffd_open(fd, feats, umo, err), err, "snap_uffd_open")
    return int(fd[0]), int(feats[0]), bool(umo[0])


def uffd_register(uffd: int, start: int, length: int) -> None:
    """Register and write-protect [start, start+length) (page aligned) with uffd (snap_uffd_register)."""
    err = ffi.new("int *")
    _check_sys(lib.snap_uffd_register(_fd_arg(uffd, "uffd"), _size_arg(start, "start"),
                                      _size_arg(length, "length"), err),
               err, "snap_uffd_register")


def uffd_unregister(uffd: int, start: int, length: int) -> None:
    """Remove protection from, then unregister, [start, start+length) (snap_uffd_unregister)."""
    err = ffi.new("int *")
    _check_sys(lib.snap_uffd_unregister(_fd_arg(uffd, "uffd"), _size_arg(start, "start"),
                                        _size_arg(length, "length"), err),
               err, "snap_uffd_unregister")


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Starts writing [offset, offset+length) of the file to the device, without waiting
    (snap_start_writeback: sync_file_range SYNC_FILE_RANGE_WRITE). A hint, no durability.
    NativeSystemError (an OSError) when the kernel refuses it (ENOSYS where it lacks it)."""
    err = ffi.new("int *")
    _check_sys(lib.snap_start_writeback(_fd_arg(fd, "fd"), _size_arg(offset, "offset"),
                                        _size_arg(length, "length"), err),
               err, "snap_start_writeback")


def prefault_write(buf) -> bool:
    """Maps in the pages of a writable buffer about to be overwritten whole, with one system
    call, unless a sample of them is resident already (snap_prefault_write: madvise
    MADV_POPULATE_WRITE). Leaves its bytes as they are. True when it mapped pages in.
    NativeSystemError (an OSError) when the kernel refuses (EINVAL where it lacks
    MADV_POPULATE_WRITE); InvalidArgumentTypeError for a read-only or non-buffer object."""
    view = _typed_view(buf, "buf", writable=True)
    if not len(view):
        return False
    populated, err = ffi.new("int *"), ffi.new("int *")
    _check_sys(lib.snap_prefault_write(buffer_address(view), len(view), populated, err),
               err, "snap_prefault_write")
    return bool(populated[0])


_SCAN_MAX_RANGES = 1 << 24     # max_ranges below this (a 384 MiB result array at most)


def pagemap_scan(pagemap_fd: int, start: int, end: int,
                 max_ranges: int = _SCAN_BATCH) -> Tuple[List[Tuple[int, int, int]], int]:
    """Written ranges (start, end, flags) of [start, end), re-protected; and the walk end (snap_pagemap_scan).

    The walk end is `end` unless max_ranges filled up: then scan again from it. flags: SCAN_HUGE.
    """
    max_ranges = _int_arg(max_ranges, "max_ranges", _SCAN_MAX_RANGES, "an int")
    arr = _new_uninit("uint64_t[]", 3 * max_ranges or 1)
    n, walk_end, err = ffi.new("size_t *"), ffi.new("uint64_t *"), ffi.new("int *")
    _check_sys(lib.snap_pagemap_scan(_fd_arg(pagemap_fd, "pagemap_fd"), _size_arg(start, "start"),
                                     _size_arg(end, "end"), arr, max_ranges, n, walk_end, err),
               err, "snap_pagemap_scan")
    flat = ffi.unpack(arr, 3 * n[0]) if n[0] else []
    it = iter(flat)
    return list(zip(it, it, it)), int(walk_end[0])


# Why snap_read_chunks stopped at a record (its SNAP_READ_* status), for messages and tests.
READ_REASONS = {
    int(lib.SNAP_READ_HEADER): "damaged record header",
    int(lib.SNAP_READ_LENGTH): "unexpected payload or raw length",
    int(lib.SNAP_READ_CHECKSUM): "record checksum mismatch",
    int(lib.SNAP_READ_PREFIX): "another chunk id or raw length in the chunk prefix",
    int(lib.SNAP_READ_FRAME): "not one zstd frame of the expected size",
    int(lib.SNAP_READ_PLANES): "damaged byte-plane table",
    int(lib.SNAP_READ_SCRATCH): "scratch smaller than the chunk",
    int(lib.SNAP_READ_NOMEM): "zstd could not allocate its context",
    int(lib.SNAP_READ_BASE): "a delta record whose base is not the one in place",
}
# snap_chunk_read as laid out by the C compiler (tests/unit/test_native_records.py checks it)
_CHUNK_READ = struct.Struct("=QQII32s32si4x")
_NO_BASE = bytes(32)


def read_chunks(src, out, reads: Sequence[Tuple[int, int, int, int, bytes]],
                scratch=None) -> Tuple[int, int]:
    """Checks and decodes chunk records into out (snap_read_chunks), without the GIL.

    Args:
        src: the records' bytes (a segment's span).
        out: the writable destination.
        reads: (src_off, dst_off, stored_len, raw_len, chunk_id) per record: the record's
            header at src[src_off:], its payload of stored_len bytes (as the index records),
            its chunk of raw_len bytes into out[dst_off:dst_off + raw_len]; or the same with
            a sixth item, base_id: for a delta record (format 5, planned), the id of its base
            chunk, whose raw bytes are at out[dst_off:dst_off + raw_len] already (a read
            before it in the same call may put them there); it is rebuilt in place over them.
            A delta record read without its base_id fails (reason SNAP_READ_BASE).
        scratch: writable work space of at least the largest raw_len (default: allocated);
            one per thread that calls this at the same time.
    Returns:
        (len(reads), 0) when every record decoded; else (i, reason): the reads before i are
        done, read i failed for READ_REASONS[reason] (its destination is untouched), the
        ones after it were not tried.
    Raises:
        InvalidArgumentError for a record or destination outside src or out, or buffers that
        overlap (nothing is done); InvalidArgumentTypeError for a read-only out.
    """
    src_v = _typed_view(src, "src")
    dst = _typed_view(out, "out", writable=True)
    shape = "(src_off, dst_off, stored_len, raw_len, 32-byte chunk id[, 32-byte base id]) tuples"
    reads = _sequence(reads, "reads", shape)
    n = len(reads)
    packed = bytearray(_CHUNK_READ.size * n)
    pack = _CHUNK_READ.pack_into
    size = _CHUNK_READ.size
    try:
        for i, read in enumerate(reads):
            if len(read) == 5:
                src_off, dst_off, stored_len, raw_len, chunk_id = read
                base_id = _NO_BASE
            else:
                src_off, dst_off, stored_len, raw_len, chunk_id, base_id = read
            if type(chunk_id) is not bytes or len(chunk_id) != 32:
                raise errors.InvalidArgumentError(f"reads[{i}]: a chunk id is 32 bytes")
            if type(base_id) is not bytes or len(base_id) != 32:
                raise errors.InvalidArgumentError(f"reads[{i}]: a base id is 32 bytes")
            pack(packed, i * size, src_off, dst_off, stored_len, raw_len, chunk_id, base_id,
                 0)
    except errors.InvalidArgumentError:
        raise
    except (struct.error, TypeError, ValueError) as exc:
        raise errors.InvalidArgumentTypeError(f"reads: expected {shape} of ints in range: "
                                              f"{exc}") from None
    work = _given_or_new(scratch, max((r[3] for r in reads), default=0), "scratch")
    done = ffi.new("size_t *")
    rc = lib.snap_read_chunks(_ptr(src_v), len(src_v), _ptr(dst, True), len(dst),
                              ffi.from_buffer("snap_chunk_read[]", packed,
                                              require_writable=True),
                              n, _ptr(work, True), len(work), done)
    if rc == lib.SNAP_EDATA:
        i = int(done[0])
        return i, _CHUNK_READ.unpack_from(packed, i * size)[6]
    check(rc, "snap_read_chunks")
    return n, 0


# Room a chunk record may take in write_chunks' output beyond the chunk's raw length.
RECORD_WRITE_SLACK = int(lib.SNAP_REC_WRITE_SLACK)
RAW_RECORD_HEAD = int(lib.SNAP_REC_RAW_HEAD)     # a raw chunk record's header and prefix
# snap_chunk_write as laid out by the C compiler (tests/unit/test_native_records.py checks it)
_CHUNK_WRITE = struct.Struct("=QQQII32s32sBBB5x")


def write_chunks(chunks: Sequence[tuple], itemsize: int, try_planes: int,
                 out=None, scratch=None, try_delta: int = 0, rotate: int = PLANES_ROTATE
                 ) -> Tuple[memoryview, List[Tuple[int, int, int, int]]]:
    """Encodes chunks of items as complete chunk records, back to back (snap_write_chunks),
    without the GIL: for a chunk given a base, delta planes (the planes of bits try_delta
    tried as zstd frames) where they pay; else byte planes (the planes of bits try_planes
    tried) where they pay; else the raw bytes.

    Args:
        chunks: (data, chunk_id) per chunk: its raw bytes (a C-contiguous buffer) and its
            32-byte id (the BLAKE3 of those bytes; written, not checked); or (data, chunk_id,
            base, base_id, depth): base the raw bytes of the chunk's previous version (as many
            as data), base_id its 32-byte id, depth 1..255 the chunk's (1 + the base's):
            CODEC_DELTA_PLANES (format 5, planned: no segment holds it yet).
        itemsize: bytes per item, 2, 4 or 8.
        try_planes: a bit mask of the planes to try to compress (0: every chunk raw unless
            its delta pays).
        try_delta: a bit mask of the delta planes to try to compress (0: no delta).
        rotate: the rotation of the byte-plane records' items, in bits, 0..PLANES_ROTATION_MAX
            (their plane header's flags; default PLANES_ROTATE, the only one segments of
            version 4 and 5 hold).
        out: writable buffer for the records, at least the sum of RECORD_WRITE_SLACK +
            len(data) over the chunks (default: allocated).
        scratch: writable work space of at least the largest chunk (default: allocated); one
            per thread that calls this at the same time.
    Returns:
        (records, results): records the prefix of out (or a new buffer) holding the records;
        per chunk (offset of its record in records, its payload length, its codec, the bit
        mask of its zstd planes).
    Raises:
        InvalidArgumentError (a chunk id not of 32 bytes, a chunk of 4 GiB or more, a bad item
        size, plane mask or rotation, overlapping buffers), InvalidArgumentTypeError (not a
        buffer), NativeMemoryError (zstd could not allocate its context).
    """
    k = _itemsize_arg(itemsize)
    rotation = _rotation_arg(rotate)
    mask = _int_arg(try_planes, "try_planes", 1 << 32, "an int")
    delta_mask = _int_arg(try_delta, "try_delta", 1 << 32, "an int")
    packed, pointers, sizes = _chunk_writes(chunks, bases=True)
    n = len(sizes)
    work = _given_or_new(scratch, max(sizes, default=0), "scratch")
    dst = _given_or_new(out, sum(sizes) + n * RECORD_WRITE_SLACK, "out")
    used = ffi.new("size_t *")
    check(lib.snap_write_chunks(ffi.from_buffer("snap_chunk_write[]", packed,
                                                require_writable=True),
                                n, k, mask, rotation, delta_mask, _ptr(dst, True), len(dst),
                                _ptr(work, True), len(work), used), "snap_write_chunks")
    del pointers
    return dst[:used[0]], _chunk_write_results(packed)


def raw_record_heads(chunks: Sequence[Tuple[object, bytes]], out=None
                     ) -> Tuple[memoryview, List[Tuple[int, int, int, int]]]:
    """The heads of raw chunk records (snap_raw_record_heads), without the GIL: per chunk
    RAW_RECORD_HEAD bytes, the record header (checksum over the chunk's bytes included) and
    the chunk prefix; the whole record is its head followed by the chunk's bytes, which are
    read but not copied (incompressible bytes: checksummed here, copied only by the write).

    Args:
        chunks: (data, chunk_id) per chunk, as for write_chunks.
        out: writable buffer of at least RAW_RECORD_HEAD * len(chunks) bytes (default:
            allocated).
    Returns:
        (heads, results): heads the prefix of out (or a new buffer), the heads back to back;
        per chunk (offset of its head, its payload length, CODEC_RAW, 0), as write_chunks.
    Raises:
        InvalidArgumentError (a chunk id not of 32 bytes, a chunk of 4 GiB or more, a chunk
        overlapping out), InvalidArgumentTypeError (not a buffer), NativeSpaceError (out too
        small); nothing is written then.
    """
    packed, pointers, sizes = _chunk_writes(chunks)
    n = len(sizes)
    dst = _given_or_new(out, n * RAW_RECORD_HEAD, "out")
    check(lib.snap_raw_record_heads(ffi.from_buffer("snap_chunk_write[]", packed,
                                                    require_writable=True),
                                    n, _ptr(dst, True), len(dst)), "snap_raw_record_heads")
    del pointers
    return dst[:n * RAW_RECORD_HEAD], _chunk_write_results(packed)


def _chunk_writes(chunks: Sequence[tuple], bases: bool = False
                  ) -> Tuple[bytearray, list, list]:
    """(the snap_chunk_write array of chunks, packed; the buffers it points into, to keep
    alive until the call returns; the chunks' sizes). With bases, a chunk may also be a
    (data, chunk id, base, base id, depth) tuple. Raises as write_chunks."""
    size = _CHUNK_WRITE.size
    one = ("a (data, 32-byte chunk id) pair or a (data, chunk id, base, base id, depth) tuple"
           if bases else "a (data, 32-byte chunk id) pair")
    chunks = _sequence(chunks, "chunks", "(data, 32-byte chunk id) pairs" +
                       (" or (data, chunk id, base, base id, depth) tuples" if bases else ""))
    packed = bytearray(size * len(chunks))
    pointers, sizes = [], []
    for i, item in enumerate(chunks):
        if not isinstance(item, (tuple, list)) or len(item) not in ((2, 5) if bases else (2,)):
            raise errors.InvalidArgumentTypeError(
                f"chunks[{i}]: expected {one}, got {item!r:.60}")
        data, chunk_id = item[0], item[1]
        view = _typed_view(data, f"chunks[{i}]")
        if not isinstance(chunk_id, bytes) or len(chunk_id) != 32:
            raise errors.InvalidArgumentError(f"chunks[{i}]: a chunk id is 32 bytes")
        if len(view) >= 1 << 32:
            raise errors.InvalidArgumentError(f"chunks[{i}]: a chunk is under 4 GiB")
        ptr = _ptr(view)
        pointers.append(ptr)
        sizes.append(len(view))
        base_addr, base_id, depth = 0, _NO_BASE, 0
        if len(item) == 5:
            base, base_id, depth = item[2], item[3], item[4]
            base_view = _typed_view(base, f"chunks[{i}] base")
            if len(base_view) != len(view):
                raise errors.InvalidArgumentError(
                    f"chunks[{i}]: a base is as long as its chunk ({len(view)} bytes), got "
                    f"{len(base_view)}")
            if not isinstance(base_id, bytes) or len(base_id) != 32:
                raise errors.InvalidArgumentError(f"chunks[{i}]: a base id is 32 bytes")
            depth = _int_arg(depth, f"chunks[{i}] depth", 256, "an int")
            if depth < 1:
                raise errors.InvalidArgumentError(
                    f"chunks[{i}]: a delta's depth is 1..255, got {depth}")
            base_ptr = _ptr(base_view)
            pointers.append(base_ptr)
            base_addr = int(ffi.cast("uintptr_t", base_ptr))
        _CHUNK_WRITE.pack_into(packed, i * size, int(ffi.cast("uintptr_t", ptr)), base_addr,
                               0, len(view), 0, chunk_id, base_id, 0, 0, depth)
    return packed, pointers, sizes


def _chunk_write_results(packed: bytearray) -> List[Tuple[int, int, int, int]]:
    """Per chunk of a snap_chunk_write array after the call: (out_off, stored_len, codec,
    packed planes)."""
    return [(off, stored_len, codec, planes)
            for _, _, off, _, stored_len, _, _, codec, planes, _ in
            _CHUNK_WRITE.iter_unpack(packed)]
