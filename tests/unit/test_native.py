"""Unit tests of the C core (called directly through cffi) and of its wrappers, snapstore._native."""
import array
import errno
import mmap
import os

import numpy as np
import pytest

import reference as ref
from snapstore import _native as nat
from snapstore import errors
from snapstore._ffi import ffi, lib

PS = 4096
NULL = ffi.NULL


def data(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def u8(buf):
    return ffi.from_buffer("uint8_t[]", buf)


# ---- constants, error codes, check() ---------------------------------------------------
def test_constants_come_from_the_library():
    assert (nat.FP_BYTES, nat.PAGE_MIN, nat.PAGE_MAX) == (16, 512, 1 << 20)
    assert (nat.CDC_MIN_LIMIT, nat.CDC_MAX_LIMIT) == (64, 64 << 20)


@pytest.mark.parametrize("code", [lib.SNAP_OK, lib.SNAP_EINVAL, lib.SNAP_ESPACE, lib.SNAP_ESTATE,
                                  -99, 7])
def test_strerror_is_never_null(code):
    assert ffi.string(lib.snap_strerror(code))


@pytest.mark.parametrize("name", sorted(errors.NATIVE_ERRORS))
def test_check_maps_every_code(name):
    code = getattr(lib, name)
    with pytest.raises(errors.NATIVE_ERRORS[name]) as ei:
        nat.check(code, "snap_something")
    e = ei.value
    assert e.function == "snap_something" and e.code == code
    assert ffi.string(lib.snap_strerror(code)).decode() in str(e)
    assert "snap_something" in str(e)


def test_check_ok_and_unknown_codes():
    nat.check(0, "f")
    with pytest.raises(errors.NativeError) as ei:
        nat.check(-42, "f")
    assert ei.value.code == -42


def test_einval_is_an_invalid_argument_error():
    assert issubclass(errors.NATIVE_ERRORS["SNAP_EINVAL"], errors.InvalidArgumentError)


# ---- C core: argument validation -------------------------------------------------------
BAD_PAGE_SIZES = [0, 1, 3, 256, 511, 513, 4095, 4097, 3 << 10, 2 << 20, 1 << 40]


def test_page_count_c():
    assert lib.snap_page_count(0, 4096) == 0
    assert lib.snap_page_count(1, 4096) == 1
    assert lib.snap_page_count(4096, 4096) == 1
    assert lib.snap_page_count(4097, 4096) == 2
    assert lib.snap_page_count(100, 0) == 0
    assert lib.snap_page_count(2**64 - 1, 512) == 2**64 // 512


@pytest.mark.parametrize("ps", BAD_PAGE_SIZES)
def test_c_rejects_bad_page_sizes(ps):
    buf = bytes(8192)
    fps = bytearray(1024)
    runs = ffi.new("uint64_t[]", 64)
    n = ffi.new("size_t *")
    shadow = bytearray(8192)
    assert lib.snap_fp_pages(buf, len(buf), ps, u8(fps), len(fps)) == lib.SNAP_EINVAL
    assert lib.snap_fp_diff(buf, len(buf), ps, u8(fps), len(fps), runs, 32, n) == lib.SNAP_EINVAL
    assert lib.snap_shadow_diff(buf, u8(shadow), len(buf), ps, runs, 32, n) == lib.SNAP_EINVAL


def test_c_null_pointers_with_nonzero_lengths():
    fps = bytearray(64)
    runs = ffi.new("uint64_t[]", 8)
    n = ffi.new("size_t *")
    buf = bytes(4096)
    E = lib.SNAP_EINVAL
    assert lib.snap_fp_pages(NULL, 1, PS, u8(fps), 64) == E
    assert lib.snap_fp_pages(buf, 4096, PS, NULL, 64) == E
    assert lib.snap_fp_diff(NULL, 1, PS, u8(fps), 64, runs, 4, n) == E
    assert lib.snap_fp_diff(buf, 4096, PS, NULL, 16, runs, 4, n) == E
    assert lib.snap_fp_diff(buf, 4096, PS, u8(fps), 64, NULL, 4, n) == E
    assert lib.snap_fp_diff(buf, 4096, PS, u8(fps), 64, runs, 4, NULL) == E
    assert lib.snap_shadow_diff(NULL, u8(fps), 64, 512, runs, 4, n) == E
    assert lib.snap_shadow_diff(buf, NULL, 64, 512, runs, 4, n) == E
    assert lib.snap_shadow_diff(buf, u8(fps), 64, 512, NULL, 4, n) == E
    assert lib.snap_shadow_diff(buf, u8(fps), 64, 512, runs, 4, NULL) == E
    out = bytearray(8)
    r = ffi.new("uint64_t[]", [0, 1])
    assert lib.snap_gather(NULL, 1, r, 1, u8(out), 8, n) == E
    assert lib.snap_gather(buf, 10, NULL, 1, u8(out), 8, n) == E
    assert lib.snap_gather(buf, 10, r, 1, NULL, 8, n) == E
    assert lib.snap_gather(buf, 10, r, 1, u8(out), 8, NULL) == E


def test_c_empty_inputs_accept_null():
    n = ffi.new("size_t *", 7)
    assert lib.snap_fp_pages(NULL, 0, PS, NULL, 0) == 0
    assert lib.snap_fp_diff(NULL, 0, PS, NULL, 0, NULL, 0, n) == 0 and n[0] == 0
    assert lib.snap_shadow_diff(NULL, NULL, 0, PS, NULL, 0, n) == 0 and n[0] == 0
    assert lib.snap_gather(NULL, 0, NULL, 0, NULL, 0, n) == 0 and n[0] == 0


def test_c_fp_capacity():
    buf = data(3 * PS + 1)
    fps = bytearray(4 * 16)
    assert lib.snap_fp_pages(buf, len(buf), PS, u8(fps), 4 * 16 - 1) == lib.SNAP_ESPACE
    assert lib.snap_fp_pages(buf, len(buf), PS, u8(fps), 4 * 16) == 0
    assert bytes(fps) == ref.page_fingerprints(buf, PS)
    runs = ffi.new("uint64_t[]", 8)
    n = ffi.new("size_t *")
    assert lib.snap_fp_diff(buf, len(buf), PS, u8(fps), 63, runs, 4, n) == lib.SNAP_ESPACE


def test_c_fp_diff_too_many_runs():
    buf = bytearray(data(8 * PS))
    fps = bytearray(nat.page_fingerprints(buf, PS))
    for p in (0, 2, 4, 6):  # 4 separate runs
        buf[p * PS] ^= 0xFF
    runs = ffi.new("uint64_t[]", 8)
    n = ffi.new("size_t *")
    assert lib.snap_fp_diff(bytes(buf), len(buf), PS, u8(fps), len(fps), runs, 3, n) == lib.SNAP_ESPACE
    assert n[0] == 0
    # fps is now partly updated (documented): start again from the old digests.
    fps[:] = ref.page_fingerprints(bytes(data(8 * PS)), PS)
    # (page_count + 1) / 2 always suffices: the worst case, every other page dirty.
    assert lib.snap_fp_diff(bytes(buf), len(buf), PS, u8(fps), len(fps), runs, 4, n) == 0
    assert n[0] == 4
    assert [tuple(ffi.unpack(runs, 8)[i:i + 2]) for i in range(0, 8, 2)] == \
        [(0, 1), (2, 1), (4, 1), (6, 1)]
    assert bytes(fps) == ref.page_fingerprints(bytes(buf), PS)


def test_c_shadow_diff_too_many_runs():
    buf = bytearray(data(5 * 512))
    shadow = bytearray(buf)
    for p in (0, 2, 4):
        buf[p * 512 + 7] ^= 1
    runs = ffi.new("uint64_t[]", 6)
    n = ffi.new("size_t *")
    assert lib.snap_shadow_diff(bytes(buf), u8(shadow), len(buf), 512, runs, 2, n) == lib.SNAP_ESPACE
    assert lib.snap_shadow_diff(bytes(buf), u8(shadow), len(buf), 512, runs, 3, n) == 0
    assert n[0] == 0  # the previous call already copied pages 0 and 2; page 4 is left


def test_c_gather_ranges_outside_buffer():
    buf = bytes(range(100))
    out = bytearray(200)
    n = ffi.new("size_t *")
    for rng in ([100, 1], [101, 0], [0, 101], [50, 51], [2**64 - 1, 2], [1, 2**64 - 1]):
        r = ffi.new("uint64_t[]", [0, 10] + rng)
        assert lib.snap_gather(buf, 100, r, 2, u8(out), 200, n) == lib.SNAP_EINVAL
        assert out == bytearray(200)
    r = ffi.new("uint64_t[]", [100, 0, 0, 100])
    assert lib.snap_gather(buf, 100, r, 2, u8(out), 200, n) == 0 and n[0] == 100


def test_c_gather_capacity_copies_nothing():
    buf = bytes(range(100))
    out = bytearray(10)
    n = ffi.new("size_t *")
    r = ffi.new("uint64_t[]", [0, 6, 50, 5])
    assert lib.snap_gather(buf, 100, r, 2, u8(out), 10, n) == lib.SNAP_ESPACE
    assert out == bytearray(10) and n[0] == 0
    # total overflowing 64 bits is a capacity error, not a wrap-around
    big = bytes(16)
    r = ffi.new("uint64_t[]", [0, 16] * 4)
    assert lib.snap_gather(big, 16, r, 4, u8(out), 10, n) == lib.SNAP_ESPACE


# ---- C core: FastCDC -------------------------------------------------------------------
@pytest.mark.parametrize("sizes", [
    (63, 64, 128), (64, 100, 128), (128, 64, 256), (64, 256, 128), (64, 128, (64 << 20) + 1),
    (0, 0, 0), (1 << 20, 1 << 20, 1 << 19),
])
def test_cdc_init_rejects(sizes):
    c = ffi.new("snap_cdc *")
    assert lib.snap_cdc_init(c, *sizes) == lib.SNAP_EINVAL
    cuts = ffi.new("uint64_t[]", 4)
    n, used = ffi.new("size_t *"), ffi.new("size_t *")
    assert lib.snap_cdc_feed(c, b"x", 1, cuts, 4, n, used) == lib.SNAP_ESTATE


def test_cdc_init_limits_accepted():
    c = ffi.new("snap_cdc *")
    assert lib.snap_cdc_init(c, 64, 64, 64) == 0
    assert lib.snap_cdc_init(c, 64, 1 << 25, 64 << 20) == 0
    assert lib.snap_cdc_init(NULL, 64, 64, 64) == lib.SNAP_EINVAL


def test_cdc_state_and_argument_errors():
    c = ffi.new("snap_cdc *")  # zeroed: bad magic
    cuts = ffi.new("uint64_t[]", 4)
    n, used = ffi.new("size_t *"), ffi.new("size_t *")
    cut = ffi.new("uint64_t *")
    assert lib.snap_cdc_feed(c, b"abc", 3, cuts, 4, n, used) == lib.SNAP_ESTATE
    assert lib.snap_cdc_finish(c, cut, n) == lib.SNAP_ESTATE
    assert lib.snap_cdc_init(c, 64, 128, 256) == 0
    assert lib.snap_cdc_feed(NULL, b"abc", 3, cuts, 4, n, used) == lib.SNAP_EINVAL
    assert lib.snap_cdc_feed(c, NULL, 3, cuts, 4, n, used) == lib.SNAP_EINVAL
    assert lib.snap_cdc_feed(c, b"abc", 3, NULL, 4, n, used) == lib.SNAP_EINVAL
    assert lib.snap_cdc_feed(c, b"abc", 3, cuts, 4, NULL, used) == lib.SNAP_EINVAL
    assert lib.snap_cdc_feed(c, b"abc", 3, cuts, 4, n, NULL) == lib.SNAP_EINVAL
    assert lib.snap_cdc_feed(c, b"abc", 3, NULL, 0, n, used) == lib.SNAP_ESPACE
    assert lib.snap_cdc_feed(c, NULL, 0, NULL, 0, n, used) == 0
    assert lib.snap_cdc_finish(c, NULL, n) == lib.SNAP_EINVAL
    assert lib.snap_cdc_finish(c, cut, NULL) == lib.SNAP_EINVAL
    assert lib.snap_cdc_finish(NULL, cut, n) == lib.SNAP_EINVAL
    assert lib.snap_cdc_finish(c, cut, n) == 0 and n[0] == 0


def test_cdc_feed_stops_when_cuts_are_full():
    buf = data(20000, seed=3)
    expect = ref.chunk_boundaries(buf, 64, 128, 256)
    c = ffi.new("snap_cdc *")
    assert lib.snap_cdc_init(c, 64, 128, 256) == 0
    cuts = ffi.new("uint64_t[]", 1)
    n, used = ffi.new("size_t *"), ffi.new("size_t *")
    got, pos = [], 0
    while pos < len(buf):
        chunk = buf[pos:]
        assert lib.snap_cdc_feed(c, chunk, len(chunk), cuts, 1, n, used) == 0
        assert used[0] > 0 and n[0] <= 1
        got += ffi.unpack(cuts, n[0])
        pos += used[0]
    cut = ffi.new("uint64_t *")
    assert lib.snap_cdc_finish(c, cut, n) == 0
    got += [cut[0]] if n[0] else []
    assert got == expect


def test_cdc_min_equals_max_gives_fixed_chunks():
    assert nat.chunk_boundaries(bytes(1000), 100, 128, 128)[:3] == [128, 256, 384]
    assert nat.chunk_boundaries(bytes(1000), 128, 128, 128) == list(range(128, 1000, 128)) + [1000]


def test_cdc_zero_input_uses_forced_cuts():
    # The gear hash of a run of zero bytes never has its high bits all zero here (pinned by
    # the reference): chunks are max_size long.
    assert nat.chunk_boundaries(bytes(1 << 20)) == ref.chunk_boundaries(bytes(1 << 20))


# ---- wrappers: buffers -----------------------------------------------------------------
def buffer_kinds(raw):
    """Every buffer type the wrappers must accept, all holding the bytes raw (len % 8 == 0)."""
    mm = mmap.mmap(-1, len(raw))
    mm[:] = raw
    return {
        "bytes": raw,
        "bytearray": bytearray(raw),
        "memoryview": memoryview(raw),
        "memoryview-slice": memoryview(b"xx" + raw)[2:],
        "mmap": mm,
        "array": array.array("B", raw),
        "np-uint8": np.frombuffer(raw, np.uint8).copy(),
        "np-uint64-2d": np.frombuffer(raw, np.uint64).reshape(-1, 2).copy(),
        "np-float64": np.frombuffer(raw, np.float64).copy(),
        "np-readonly": np.frombuffer(raw, np.uint8),
        "np-3d-int16": np.frombuffer(raw, np.int16).reshape(2, -1, 4).copy(),
    }


RAW = data(3 * PS + 16, seed=7)


@pytest.mark.parametrize("kind", sorted(buffer_kinds(RAW)))
def test_every_buffer_type_reads(kind):
    buf = buffer_kinds(RAW)[kind]
    assert bytes(nat.page_fingerprints(buf, PS)) == ref.page_fingerprints(RAW, PS)
    fps = bytearray(ref.page_fingerprints(bytes(len(RAW)), PS))
    assert nat.fingerprint_diff(buf, fps, PS) == [(0, 4)]
    assert bytes(fps) == ref.page_fingerprints(RAW, PS)
    assert bytes(nat.gather(buf, [(1, 5), (PS, 3)])) == RAW[1:6] + RAW[PS:PS + 3]
    assert nat.chunk_boundaries(buf, 64, 256, 1024) == ref.chunk_boundaries(RAW, 64, 256, 1024)
    assert bytes(nat.as_bytes_view(buf)) == RAW


@pytest.mark.parametrize("kind", sorted(k for k in buffer_kinds(RAW)
                                        if k not in ("bytes", "memoryview", "memoryview-slice",
                                                     "np-readonly")))
def test_every_writable_buffer_type_is_written(kind):
    shadow = buffer_kinds(bytes(len(RAW)))[kind]
    assert nat.shadow_diff(RAW, shadow, 512) == [(0, len(RAW) // 512 + 1)]
    assert bytes(nat.as_bytes_view(shadow)) == RAW
    fps = buffer_kinds(ref.page_fingerprints(bytes(len(RAW)), PS))[kind]
    assert nat.fingerprint_diff(RAW, fps, PS) == [(0, 4)]
    assert bytes(nat.as_bytes_view(fps)) == ref.page_fingerprints(RAW, PS)
    out = buffer_kinds(bytes(64))[kind]
    mv = nat.gather(RAW, [(3, 10), (100, 6)], out=out)
    assert bytes(mv) == RAW[3:13] + RAW[100:106]
    assert bytes(nat.as_bytes_view(out))[:16] == RAW[3:13] + RAW[100:106]


@pytest.mark.parametrize("bad", [3, 1.5, None, "text", [1, 2], object()])
def test_wrong_types(bad):
    with pytest.raises(TypeError, match="expected a bytes-like object"):
        nat.page_fingerprints(bad)
    with pytest.raises(TypeError, match="expected a bytes-like object"):
        nat.fingerprint_diff(bad, bytearray())
    with pytest.raises(TypeError, match="expected a bytes-like object"):
        nat.shadow_diff(b"", bad)
    with pytest.raises(TypeError, match="expected a bytes-like object"):
        nat.gather(bad, [])
    with pytest.raises(TypeError, match="expected a bytes-like object"):
        nat.chunk_boundaries(bad)
    with pytest.raises(TypeError, match="expected a bytes-like object"):
        nat.Chunker().feed(bad)


def test_buffer_export_failures_are_type_errors():
    with pytest.raises(TypeError, match="cannot export"):
        nat.page_fingerprints(np.zeros(4, "M8[s]"))
    mm = mmap.mmap(-1, 4096)
    mm.close()
    with pytest.raises(TypeError, match="cannot export"):
        nat.page_fingerprints(mm)


def test_more_dtypes_zero_copy():
    for arr in (np.array(3.5), np.zeros(3, dtype=[("a", "<i4"), ("b", "f8")]), np.ones(5, bool),
                np.ones(3, complex), np.ones((2, 3), ">i4")):
        assert bytes(nat.page_fingerprints(arr, 512)) == ref.page_fingerprints(arr.tobytes(), 512)
        view = nat.as_bytes_view(arr, writable=True)
        view[0] ^= 1
        assert arr.tobytes()[0] == view[0]  # a view, not a copy


def test_wrong_type_message_names_the_type():
    with pytest.raises(TypeError, match="got int"):
        nat.as_bytes_view(3)


@pytest.mark.parametrize("make", [
    lambda: np.zeros(2 * PS, np.uint8)[::2],
    lambda: np.zeros((64, 64), np.uint8)[:, :32],
    lambda: np.zeros((64, 64), np.uint32).T,
    lambda: memoryview(bytes(100))[::3],
])
def test_non_contiguous_rejected(make):
    buf = make()
    with pytest.raises(ValueError, match="expected a C-contiguous buffer"):
        nat.page_fingerprints(buf)
    with pytest.raises(ValueError, match="C-contiguous"):
        nat.chunk_boundaries(buf)
    with pytest.raises(ValueError, match="C-contiguous"):
        nat.gather(buf, [])
    with pytest.raises(errors.InvalidArgumentError):
        nat.as_bytes_view(buf)


@pytest.mark.parametrize("ro", [bytes(PS), memoryview(bytearray(PS)).toreadonly(),
                                np.frombuffer(bytes(PS), np.uint8)])
def test_read_only_where_writable_needed(ro):
    buf = data(PS)
    with pytest.raises(TypeError, match="writable"):
        nat.shadow_diff(buf, ro, 512)
    fps = ro[:16] if not isinstance(ro, bytes) else bytes(16)
    with pytest.raises(TypeError, match="writable"):
        nat.fingerprint_diff(buf, fps, PS)
    with pytest.raises(TypeError, match="writable"):
        nat.gather(buf, [(0, 4)], out=ro)


def test_size_mismatches():
    buf = data(2 * PS + 1)
    with pytest.raises(errors.InvalidArgumentError, match="fingerprints"):
        nat.fingerprint_diff(buf, bytearray(32), PS)
    with pytest.raises(errors.InvalidArgumentError, match="fingerprints"):
        nat.fingerprint_diff(buf, bytearray(64), PS)
    with pytest.raises(errors.InvalidArgumentError, match="shadow"):
        nat.shadow_diff(buf, bytearray(len(buf) - 1), PS)
    with pytest.raises(errors.InvalidArgumentError, match="shadow"):
        nat.shadow_diff(buf, bytearray(len(buf) + 1), PS)


@pytest.mark.parametrize("ps", [0, 3, 256, 2 << 20, 4095, -4096])
def test_wrappers_reject_bad_page_sizes(ps):
    buf = data(PS)
    for call in (lambda: nat.page_count(100, ps),
                 lambda: nat.page_fingerprints(buf, ps),
                 lambda: nat.fingerprint_diff(buf, bytearray(16), ps),
                 lambda: nat.shadow_diff(buf, bytearray(PS), ps),
                 lambda: nat.runs_to_ranges([(0, 1)], PS, ps)):
        with pytest.raises(errors.InvalidArgumentError, match="page_size"):
            call()


def test_page_size_must_be_an_int():
    with pytest.raises(TypeError):
        nat.page_fingerprints(b"", 4096.0)


@pytest.mark.parametrize("ps", [512, 1024, 4096, 65536, 1 << 20])
def test_page_count(ps):
    assert nat.page_count(0, ps) == 0
    assert nat.page_count(1, ps) == 1
    assert nat.page_count(ps, ps) == 1
    assert nat.page_count(ps + 1, ps) == 2
    with pytest.raises(errors.InvalidArgumentError):
        nat.page_count(-1, ps)


def test_empty_buffers():
    assert nat.page_fingerprints(b"") == bytearray()
    assert nat.fingerprint_diff(b"", bytearray()) == []
    assert nat.shadow_diff(b"", bytearray()) == []
    assert bytes(nat.gather(b"", [])) == b""
    assert bytes(nat.gather(b"", [(0, 0)])) == b""
    assert nat.chunk_boundaries(b"") == []
    assert nat.chunk_boundaries(np.zeros((0, 4), np.float32)) == []
    assert nat.shadow_diff(np.zeros((0, 3)), np.zeros((3, 0))) == []


def test_one_byte():
    fps = nat.page_fingerprints(b"\x01")
    assert bytes(fps) == ref.fingerprint(b"\x01")
    assert nat.fingerprint_diff(b"\x02", fps) == [(0, 1)]
    assert nat.fingerprint_diff(b"\x02", fps) == []
    sh = bytearray(1)
    assert nat.shadow_diff(b"\x02", sh) == [(0, 1)] and sh == b"\x02"
    assert nat.chunk_boundaries(b"\x02") == [1]


def test_fingerprint_layout_is_low_then_high_little_endian():
    page = bytes(range(256)) * 16
    d = __import__("xxhash").xxh3_128_intdigest(page)
    fp = bytes(nat.page_fingerprints(page))
    assert int.from_bytes(fp[:8], "little") == d & (2**64 - 1)
    assert int.from_bytes(fp[8:], "little") == d >> 64


def test_diffs_coalesce_and_update_in_place():
    old = data(10 * PS, seed=1)
    new = bytearray(old)
    for p in (1, 2, 3, 5, 9):
        new[p * PS + 100] ^= 0x55
    fps = nat.page_fingerprints(old)
    assert nat.fingerprint_diff(new, fps) == [(1, 3), (5, 1), (9, 1)]
    assert fps == nat.page_fingerprints(new)
    assert nat.fingerprint_diff(new, fps) == []
    shadow = bytearray(old)
    assert nat.shadow_diff(new, shadow) == [(1, 3), (5, 1), (9, 1)]
    assert shadow == new
    assert nat.shadow_diff(new, shadow) == []


def test_shadow_diff_same_buffer_is_clean():
    b = bytearray(data(3 * PS))
    assert nat.shadow_diff(b, b) == []


def test_runs_to_ranges():
    assert nat.runs_to_ranges([], 0, PS) == []
    assert nat.runs_to_ranges([(0, 1), (2, 2)], 3 * PS + 10, PS) == \
        [(0, PS), (2 * PS, PS + 10)]
    for bad in ([(0, 0)], [(-1, 1)], [(3, 1)], [(4, 1)]):
        with pytest.raises(errors.InvalidArgumentError):
            nat.runs_to_ranges(bad, 3 * PS, PS)


def test_gather_wrapper():
    buf = data(1000)
    mv = nat.gather(buf, [(10, 5), (0, 0), (995, 5)])
    assert isinstance(mv, memoryview) and bytes(mv) == buf[10:15] + buf[995:]
    out = bytearray(100)
    mv = nat.gather(buf, iter([(1, 2), (3, 4)]), out=out)
    assert len(mv) == 6 and out[:6] == buf[1:3] + buf[3:7] and out[6:] == bytes(94)
    with pytest.raises(errors.InvalidArgumentError, match="out holds"):
        nat.gather(buf, [(0, 10)], out=bytearray(9))
    for bad in ([(0, 1001)], [(1000, 1)], [(-1, 1)], [(1, -1)], [(2**64, 0)]):
        with pytest.raises(errors.InvalidArgumentError):
            nat.gather(buf, bad)
    shared = bytearray(buf)
    with pytest.raises(errors.InvalidArgumentError, match="overlap"):
        nat.gather(shared, [(0, 10)], out=memoryview(shared)[500:])
    assert bytes(nat.gather(memoryview(shared)[:500], [(0, 10)], out=memoryview(shared)[500:])) == buf[:10]
    for bad in ([(1, 2, 3)], [1], [("a", 1)], [(1.0, 2)]):
        with pytest.raises(TypeError):
            nat.gather(buf, bad)


def test_gather_fingerprints_wrapper_and_bad_input_writes_nothing():
    buf = data(300_000)
    mv, fps = nat.gather_fingerprints(buf, [(10, 5000), (0, 0), (299_000, 1000)], page_size=4096)
    assert bytes(mv) == buf[10:5010] + buf[299_000:]
    assert bytes(fps) == bytes(nat.page_fingerprints(mv, 4096)) and len(fps) == 2 * nat.FP_BYTES
    mv, fps = nat.gather_fingerprints(buf, [])                  # nothing: no bytes, no digests
    assert len(mv) == 0 and len(fps) == 0
    out = bytearray(b"\xaa" * 100)
    for bad, kwargs in (([(0, 300_001)], {}), ([(-1, 1)], {}), ([(0, 101)], {}),
                        ([(0, 10)], {"page_size": 1000}), ([(0, 10)], {"page_size": 0})):
        with pytest.raises(errors.InvalidArgumentError):
            nat.gather_fingerprints(buf, bad, out=out, **kwargs)
        assert out == bytearray(b"\xaa" * 100)
    shared = bytearray(buf)
    with pytest.raises(errors.InvalidArgumentError, match="overlap"):
        nat.gather_fingerprints(shared, [(0, 10)], out=memoryview(shared)[500:])


def test_c_gather_fp_checks_before_writing():
    buf = bytes(range(256)) * 40
    out = bytearray(len(buf))
    fps = bytearray(nat.FP_BYTES * 3)
    n = ffi.new("size_t *")
    r = ffi.new("uint64_t[]", [0, 4096, 100, 5000])           # 9096 bytes: 3 pages of 4096
    assert lib.snap_gather_fp(buf, len(buf), r, 2, u8(out), len(out), n, 4096, u8(fps),
                              len(fps) - 1) == lib.SNAP_ESPACE
    assert lib.snap_gather_fp(buf, len(buf), r, 2, u8(out), 9095, n, 4096, u8(fps),
                              len(fps)) == lib.SNAP_ESPACE
    assert lib.snap_gather_fp(buf, len(buf), r, 2, u8(out), len(out), n, 3000, u8(fps),
                              len(fps)) == lib.SNAP_EINVAL
    bad = ffi.new("uint64_t[]", [0, 10, len(buf), 1])
    assert lib.snap_gather_fp(buf, len(buf), bad, 2, u8(out), len(out), n, 4096, u8(fps),
                              len(fps)) == lib.SNAP_EINVAL
    # as snap_gather: a range outside buf is EINVAL even after ranges that overflow out
    bad = ffi.new("uint64_t[]", [0, len(buf), 0, len(buf), len(buf), 1])
    for fn in (lambda: lib.snap_gather(buf, len(buf), bad, 3, u8(out), len(out), n),
               lambda: lib.snap_gather_fp(buf, len(buf), bad, 3, u8(out), len(out), n, 4096,
                                          u8(fps), len(fps))):
        assert fn() == lib.SNAP_EINVAL
    assert lib.snap_gather_fp(buf, len(buf), r, 2, u8(out), len(out), ffi.NULL, 4096,
                              u8(fps), len(fps)) == lib.SNAP_EINVAL
    assert out == bytearray(len(buf)) and fps == bytearray(len(fps)) and n[0] == 0
    assert lib.snap_gather_fp(buf, len(buf), r, 2, u8(out), len(out), n, 4096, u8(fps),
                              len(fps)) == lib.SNAP_OK and n[0] == 9096
    assert bytes(fps) == bytes(nat.page_fingerprints(out[:9096], 4096))


def test_gather_page_runs_and_odd_sizes():
    buf = data(1 << 20, seed=4)
    for lengths in ([4096] * 9, [256, 257, 4095, 4097, 300, 65535, 65536, 70000, 1, 0, 128, 129],
                    [1000, 2000, 3000, 4000, 5000], [255] * 5, [65536] * 4):
        ranges = [((i * 99_991) % (len(buf) - k), k) for i, k in enumerate(lengths)]
        assert bytes(nat.gather(buf, ranges)) == ref.gather(buf, ranges)


# ---- wrappers: Chunker -----------------------------------------------------------------
@pytest.mark.parametrize("sizes", [(63, 64, 128), (128, 64, 256), (64, 100, 128),
                                   (64, 128, 64 << 21), (64, 128, 2**70)])
def test_chunker_rejects_sizes(sizes):
    with pytest.raises(errors.InvalidArgumentError):
        nat.Chunker(*sizes)


def test_chunker_negative_and_wrong_type_sizes():
    with pytest.raises(errors.InvalidArgumentError):
        nat.Chunker(-1)
    with pytest.raises(TypeError):
        nat.Chunker("16384")


def test_chunker_streams_and_resets():
    buf = data(300_000, seed=11)
    expect = nat.chunk_boundaries(buf, 1024, 4096, 16384)
    assert expect == ref.chunk_boundaries(buf, 1024, 4096, 16384)
    c = nat.Chunker(1024, 4096, 16384)
    for _ in range(2):  # reusable after finish()
        got = []
        for i in range(0, len(buf), 7777):
            got += c.feed(buf[i:i + 7777])
        got += c.feed(b"")
        got += c.finish()
        assert got == expect
    assert c.finish() == []


def test_chunk_sizes_respect_min_and_max():
    buf = data(1 << 20, seed=5)
    cuts = nat.chunk_boundaries(buf, 1024, 4096, 8192)
    sizes = np.diff([0] + cuts)
    assert cuts[-1] == len(buf)
    assert sizes[:-1].min() > 1024 and sizes.max() <= 8192


def test_chunker_tiny_min_large_feed_uses_bounded_scratch():
    buf = data(200_000, seed=9)
    assert nat.chunk_boundaries(buf, 64, 64, 64) == list(range(64, len(buf), 64)) + [len(buf)]


# ---- snap_diff_bytes (csrc/bytediff.c) --------------------------------------------------------

def _c_diff(a, b, gap, max_runs):
    runs = ffi.new("uint64_t[]", 2 * max(max_runs, 1))
    n, changed = ffi.new("size_t *", 9), ffi.new("uint64_t *", 9)
    rc = lib.snap_diff_bytes(a, b, len(a), gap, runs, max_runs, n, changed)
    pairs = ffi.unpack(runs, 2 * n[0]) if n[0] else []
    return rc, [tuple(pairs[i:i + 2]) for i in range(0, len(pairs), 2)], int(changed[0])


def test_c_diff_bytes_argument_errors():
    runs = ffi.new("uint64_t[]", 8)
    n, changed = ffi.new("size_t *", 5), ffi.new("uint64_t *", 5)
    buf = bytes(64)
    E = lib.SNAP_EINVAL
    assert lib.snap_diff_bytes(NULL, buf, 1, 0, runs, 4, n, changed) == E
    assert n[0] == 0 and changed[0] == 0
    assert lib.snap_diff_bytes(buf, NULL, 1, 0, runs, 4, n, changed) == E
    assert lib.snap_diff_bytes(buf, buf, 64, 0, NULL, 4, n, changed) == E
    assert lib.snap_diff_bytes(buf, buf, 64, 0, runs, 4, NULL, changed) == E
    assert lib.snap_diff_bytes(buf, buf, 64, 0, runs, 4, n, NULL) == E
    assert lib.snap_diff_bytes(NULL, NULL, 0, 0, NULL, 0, n, changed) == 0
    assert n[0] == 0 and changed[0] == 0


def test_c_diff_bytes_capacity():
    a = bytes(1000)
    b = bytearray(a)
    for i in range(0, 1000, 2):          # every other byte differs: the most exact runs
        b[i] = 1
    bound = 1000 // 2 + 1                # len / (max(gap, 1) + 1) + 1 (documented)
    rc, runs, changed = _c_diff(a, bytes(b), 0, 499)
    assert rc == lib.SNAP_ESPACE and runs == [] and changed == 0
    rc, runs, changed = _c_diff(a, bytes(b), 0, bound)
    assert rc == 0 and changed == 500 and runs == [(i, 1) for i in range(0, 1000, 2)]
    rc, runs, changed = _c_diff(a, bytes(b), 2, 1)       # gap 2 bridges the 1-byte holes
    assert rc == 0 and runs == [(0, 999)] and changed == 500


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 255, 256, 257, 1000, 4096 + 3])
def test_diff_bytes_every_position_and_tail(n):
    a = data(n)
    for i in {0, n // 2, n - 1} if n else set():
        b = bytearray(a)
        b[i] ^= 0x40
        assert nat.diff_bytes(a, bytes(b)) == ([(i, 1)], 1)
        assert nat.diff_bytes(a, bytes(b), 1 << 40) == ([(i, 1)], 1)
    assert nat.diff_bytes(a, a) == ([], 0)
    assert nat.diff_bytes(a, bytes(x ^ 0xFF for x in a), 16) == (([(0, n)], n) if n else ([], 0))


def test_diff_bytes_merges_across_its_slices():
    n = 2 * nat.DIFF_SLICE + 10
    a = bytes(n)
    b = bytearray(a)
    b[nat.DIFF_SLICE - 2:nat.DIFF_SLICE + 2] = b"xxxx"             # a run across the seam
    b[2 * nat.DIFF_SLICE - 1] = 1
    b[2 * nat.DIFF_SLICE + 3] = 1                                   # 3 bytes apart: gap 4
    assert nat.diff_bytes(a, bytes(b)) == (
        [(nat.DIFF_SLICE - 2, 4), (2 * nat.DIFF_SLICE - 1, 1), (2 * nat.DIFF_SLICE + 3, 1)], 6)
    assert nat.diff_bytes(a, bytes(b), 4)[0] == [(nat.DIFF_SLICE - 2, 4),
                                                 (2 * nat.DIFF_SLICE - 1, 5)]


def test_diff_bytes_arguments():
    with pytest.raises(errors.InvalidArgumentError, match="equal lengths"):
        nat.diff_bytes(b"ab", b"abc")
    with pytest.raises(TypeError):
        nat.diff_bytes("ab", b"ab")
    with pytest.raises(TypeError):
        nat.diff_bytes(b"ab", b"ab", 1.5)
    with pytest.raises(errors.InvalidArgumentError):
        nat.diff_bytes(b"ab", b"ab", -1)
    arr = np.arange(10, dtype=np.float64)
    other = arr.copy()
    other[3] = 99
    assert nat.diff_bytes(arr, other, 0)[1] == sum(
        x != y for x, y in zip(arr.tobytes(), other.tobytes()))


def test_fingerprint_diff_of_a_large_buffer_in_two_halves_joins_the_border_run(monkeypatch):
    """A buffer of PARALLEL_DIFF_BYTES or more is diffed by two threads: every page changed is
    still one run, nothing changed none, one changed page on each side of the border one
    run, and the digests match a one-thread diff."""
    monkeypatch.setattr(nat, "PARALLEL_DIFF_BYTES", 8 * 4096)
    buf = bytearray(np.random.default_rng(3).integers(0, 256, 10 * 4096 + 7, dtype=np.uint8))
    fps = nat.page_fingerprints(buf)
    assert nat.fingerprint_diff(buf, fps) == []
    for i in range(0, len(buf), 4096):
        buf[i] ^= 1
    assert nat.fingerprint_diff(buf, fps) == [(0, 11)]
    buf[4 * 4096] ^= 1
    buf[5 * 4096] ^= 1                       # pages 4 and 5: the halves are 0-4 and 5-10
    assert nat.fingerprint_diff(buf, fps) == [(4, 2)]
    assert bytes(fps) == bytes(nat.page_fingerprints(buf))


# ---- early writeback (snap_start_writeback) ---------------------------------------------------
def test_start_writeback_of_a_file_range(tmp_path):
    path = tmp_path / "f"
    with open(path, "wb", buffering=0) as f:
        f.write(b"w" * 20000)
        nat.start_writeback(f.fileno(), 0, 20000)
        nat.start_writeback(f.fileno(), 0, 0)            # nothing: still fine
        nat.start_writeback(f.fileno(), 10 ** 12, 4096)  # past the end: nothing to write
    assert path.read_bytes() == b"w" * 20000                # a hint changes no byte


def test_start_writeback_errors(tmp_path):
    r, w = os.pipe()
    try:
        with pytest.raises(errors.NativeSystemError) as ei:        # not a file: ESPIPE
            nat.start_writeback(w, 0, 10)
        assert ei.value.errno == errno.ESPIPE
    finally:
        os.close(r)
        os.close(w)
    with open(tmp_path / "g", "wb") as f:
        fd = os.dup(f.fileno())
    os.close(fd)
    with pytest.raises(errors.NativeSystemError) as ei:            # a closed descriptor: EBADF
        nat.start_writeback(fd, 0, 10)
    assert ei.value.errno == errno.EBADF
    for bad in (-1, 1 << 31):
        with pytest.raises(errors.InvalidArgumentError):
            nat.start_writeback(bad, 0, 10)
    for bad in ("3", 2.0, None):
        with pytest.raises(TypeError):
            nat.start_writeback(bad, 0, 10)
    with pytest.raises(errors.InvalidArgumentError):
        nat.start_writeback(0, -1, 10)
    with pytest.raises(errors.InvalidArgumentError):               # beyond what a file offset holds
        nat.start_writeback(0, 1 << 63, 1)


# ---- prefaulting a destination (snap_prefault_write) ----------------------------------------
def _resident_pages(m: mmap.mmap) -> int:
    """How many pages of m are mapped in (from /proc/self/smaps' Rss of its mapping)."""
    addr = nat.buffer_address(m)
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024 // mmap.PAGESIZE
    raise AssertionError("mapping not found")


def test_prefault_maps_fresh_memory_in_and_keeps_its_bytes():
    n = 256 * mmap.PAGESIZE
    m = mmap.mmap(-1, n)
    m[:5] = b"first"                                   # one page touched, the rest fresh
    assert _resident_pages(m) <= 2
    assert nat.prefault_write(m) is True
    assert _resident_pages(m) >= 256
    assert m[:5] == b"first" and m[5:] == bytes(n - 5)  # no byte changed
    assert nat.prefault_write(m) is False              # resident now: nothing to do
    assert nat.prefault_write(memoryview(m)[1:-1]) is False
    m.close()


def test_prefault_of_nothing_a_sub_page_range_and_resident_memory():
    assert nat.prefault_write(bytearray()) is False
    assert nat.prefault_write(bytearray(100)) is False  # no whole page inside
    data = bytearray(os.urandom(3 * mmap.PAGESIZE + 7))
    before = bytes(data)
    assert nat.prefault_write(data) is False           # written just now: resident
    assert data == before
    m = mmap.mmap(-1, 4 * mmap.PAGESIZE)
    assert nat.prefault_write(memoryview(m)[:mmap.PAGESIZE - 1]) is False
    assert nat.prefault_write(memoryview(m)[1:mmap.PAGESIZE + 1]) is False   # no whole page
    m.close()


def test_prefault_of_a_shared_file_mapping_keeps_the_file(tmp_path):
    path = tmp_path / "f"
    content = os.urandom(64 * mmap.PAGESIZE)
    path.write_bytes(content)
    with open(path, "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        nat.prefault_write(m)
        assert m[:] == content
        m.close()
    assert path.read_bytes() == content


def test_prefault_errors():
    for bad in (b"read-only", memoryview(b"x" * 9000), "text", 3, None):
        with pytest.raises(errors.InvalidArgumentTypeError):
            nat.prefault_write(bad)
    m = mmap.mmap(-1, 8 * mmap.PAGESIZE)
    view = memoryview(m)
    assert nat.prefault_write(view) is True
    gone = nat.buffer_address(view)
    view.release()
    m.close()                                          # unmapped now
    populated, err = ffi.new("int *"), ffi.new("int *")
    rc = lib.snap_prefault_write(gone, 4 * mmap.PAGESIZE, populated, err)
    assert rc == lib.SNAP_ESYS and err[0] == errno.ENOMEM and populated[0] == 0
    assert lib.snap_prefault_write((1 << 64) - 10, 100, populated, err) == lib.SNAP_EINVAL
    assert lib.snap_prefault_write(0, 100, ffi.NULL, err) == lib.SNAP_EINVAL


def test_prefault_in_a_forked_child():
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            m = mmap.mmap(-1, 32 * mmap.PAGESIZE)
            code = 0 if nat.prefault_write(m) and m[:] == bytes(len(m)) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


# ---- argument checks found missing by a fuzzing pass (each was a crash, a wrong result or a
# raw Python exception) ---------------------------------------------------------------------
def test_page_fingerprints_digests_cannot_be_replaced_and_updates_are_whole_pages():
    p = nat.PageFingerprints(bytearray(2 * 4096 + 100), 4096)
    with pytest.raises(AttributeError):
        p.digests = bytearray(16 * 100000)   # the C calls write through the pinned array:
    p.update(2, bytes(100))                  # a segfault when a bigger one was put in place
    with pytest.raises(errors.InvalidArgumentError, match="whole"):
        p.update(0, bytes(100))              # a short page that is not the buffer's last
    p.update(0, bytes(2 * 4096 + 100))
    assert p.diff(bytearray(2 * 4096 + 100)) == []


def test_malformed_ranges_and_runs_are_refused_never_re_paired():
    data = bytes(range(100))
    for bad in ([(10, 1, 20), (3,)], [(1,), (2, 3, 4)]):
        with pytest.raises(errors.InvalidArgumentTypeError):
            nat.gather(data, bad)            # returned b'\n\x14\x15\x16' (re-paired)
    with pytest.raises(errors.InvalidArgumentTypeError):
        nat.gather(data, None)
    assert bytes(nat.gather(data, [(10, 2), (0, 1)])) == data[10:12] + data[:1]
    assert bytes(nat.gather(data, [[10, 2]])) == data[10:12]          # lists are pairs too
    buf = bytearray(4 * 4096)
    fps = nat.page_fingerprints(buf)
    for runs, error in (([(-1, 1)], errors.InvalidArgumentError),
                        ([(1 << 64, 1)], errors.InvalidArgumentError),
                        ([(0, 1, 2)], errors.InvalidArgumentTypeError),
                        ([(0,)], errors.InvalidArgumentTypeError),
                        ([(0.0, 1)], errors.InvalidArgumentTypeError),
                        (None, errors.InvalidArgumentTypeError),
                        (5, errors.InvalidArgumentTypeError)):
        with pytest.raises(error):
            nat.fingerprint_diff_runs(buf, fps, runs, 4096)
        with pytest.raises(error):
            nat.runs_to_ranges(runs, len(buf), 4096)
    assert nat.fingerprint_diff_runs(buf, fps, [(0, 4)], 4096) == []


def test_fingerprints_overlapping_the_buffer_are_refused():
    b = bytearray(os.urandom(16384))
    mv = memoryview(b)
    with pytest.raises(errors.InvalidArgumentError, match="overlap"):
        nat.fingerprint_diff(mv, mv[16384 - 64:], 4096)
    with pytest.raises(errors.InvalidArgumentError, match="overlap"):
        nat.fingerprint_diff_runs(mv, mv[16384 - 64:], [(0, 1)], 4096)


def test_read_chunks_refuses_malformed_reads():
    out = bytearray(100)
    cid = bytes(32)
    for reads, error in (([(0, 0, 36, 0, cid + b"WRONGID!")], errors.InvalidArgumentError),
                         ([(0, 0, 36, 0, cid[:5])], errors.InvalidArgumentError),
                         ([(0, 0, 36, 0, "x" * 32)], errors.InvalidArgumentError),
                         ([(-1, 0, 36, 0, cid)], errors.InvalidArgumentTypeError),
                         ([(0, 0, 36, 1 << 32, cid)], errors.InvalidArgumentTypeError),
                         ([(0, 0)], errors.InvalidArgumentTypeError),
                         (None, errors.InvalidArgumentTypeError)):
        with pytest.raises(error):
            nat.read_chunks(bytes(200), out, reads)
    for chunks in ([(b"x" * 10,)], None, [b"x" * 10]):
        with pytest.raises(errors.InvalidArgumentTypeError):
            nat.write_chunks(chunks, 4, 0)
        with pytest.raises(errors.InvalidArgumentTypeError):
            nat.raw_record_heads(chunks)


def test_oversized_pagemap_scan_batches_and_non_buffers_are_snapstore_errors():
    with pytest.raises(errors.InvalidArgumentError, match="max_ranges"):
        nat.pagemap_scan(-1, 0, 4096, max_ranges=1 << 40)      # checked before the fd
    for call in (lambda: nat.page_count(None, 4096), lambda: nat.gather(None, []),
                 lambda: nat.diff_bytes(None, b""), lambda: nat.page_fingerprints("text"),
                 lambda: nat.fingerprint_diff(b"x" * 4096, bytes(16), 4096)):   # read-only
        with pytest.raises(errors.InvalidArgumentTypeError):
            call()
