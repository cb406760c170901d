"""Unit tests of the byte-plane kernels (csrc/planes.c): known answers, the C functions' return
codes called directly through cffi (bad arguments never crash, outputs are untouched on error),
and the _native wrappers' argument checks (clean snapstore.errors exceptions)."""
import mmap
import struct

import numpy as np
import pytest

import reference as ref
from snapstore import _native as nat
from snapstore import errors
from snapstore._ffi import ffi, lib

NULL = ffi.NULL
XOR, SUB = nat.DELTA_XOR, nat.DELTA_SUB
SPLITS = [lambda s, n, k, o, c, f=0: lib.snap_split_planes(s, n, k, f, o, c),
          lambda s, n, k, o, c, f=0: lib.snap_join_planes(s, n, k, f, o, c)]


def u8(buf):
    return ffi.from_buffer("uint8_t[]", buf)


def delta_c(split, a, b, n, k, mode, o, c):
    fn = lib.snap_delta_split_planes if split else lib.snap_delta_join_planes
    return fn(a, b, n, k, mode, o, c)


# ---- known answers ------------------------------------------------------------------------
def test_constants_come_from_the_library():
    assert (nat.ITEMSIZE_MAX, nat.DELTA_XOR, nat.DELTA_SUB, nat.PLANES_ROTATE) == (8, 1, 2, 1)


def test_split_layout_known_answer():
    src = bytes(range(11))                      # 2 items of 4 bytes, then a 3-byte tail
    assert bytes(nat.split_planes(src, 4)) == bytes([0, 4, 1, 5, 2, 6, 3, 7, 8, 9, 10])
    assert bytes(nat.split_planes(src, 1)) == src
    assert bytes(nat.split_planes(src, 8)) == src    # one item of 8: planes of 1 byte each
    assert bytes(nat.join_planes(bytes([0, 4, 1, 5, 2, 6, 3, 7, 8, 9, 10]), 4)) == src


def test_float32_planes_group_sign_and_exponent_bytes():
    vals = [1.0, -2.0, 0.5]
    planes = bytes(nat.split_planes(struct.pack("<3f", *vals), 4))
    assert planes[9:] == bytes([0x3F, 0xC0, 0x3F])   # the high (sign/exponent) bytes


def test_rotate_puts_the_float_exponent_in_the_top_plane():
    vals = [1.0, -2.0, 0.5, -0.0]
    raw = struct.pack("<4f", *vals)
    planes = bytes(nat.split_planes(raw, 4, rotate=True))
    assert planes[12:] == bytes([127, 128, 126, 0])       # the biased exponents
    assert planes[:4] == bytes([0, 1, 0, 1])              # the signs, in bit 0
    assert bytes(nat.join_planes(planes, 4, rotate=True)) == raw
    bf16 = struct.pack("<f", -3.0)[2:] + b"\x01"           # a bfloat16 and a 1-byte tail
    assert bytes(nat.split_planes(bf16, 2, rotate=True)) == bytes([0x81, 0x80, 0x01])


def test_sub_is_zigzag_of_the_little_endian_difference():
    cur = struct.pack("<4I", 5, 3, 0, 0xFFFFFFFF)
    old = struct.pack("<4I", 3, 5, 0xFFFFFFFF, 0)
    items = struct.pack("<4I", 4, 3, 2, 1)          # d = 2, -2, 1, -1 -> 4, 3, 2, 1
    assert bytes(nat.delta_split_planes(cur, old, 4, SUB)) == ref.split_planes(items, 4)
    assert bytes(nat.delta_split_planes(cur, old, 4, XOR)) == ref.split_planes(
        bytes(a ^ b for a, b in zip(cur, old)), 4)


def test_small_float_changes_leave_the_high_plane_zero():
    rng = np.random.default_rng(1)
    old = rng.normal(0, 0.02, 4096).astype(np.float32)
    cur = (old * (1 + 1e-3 * rng.standard_normal(old.size))).astype(np.float32)
    planes = bytes(nat.delta_split_planes(cur, old, 4))       # DELTA_SUB by default
    assert planes[3 * 4096:] == bytes(4096)                    # |d| < 2**23 ulps everywhere
    assert bytes(nat.delta_join_planes(planes, old, 4)) == cur.tobytes()


def test_tail_bytes_are_xored_in_both_modes():
    cur, old = b"\x01\x02\x03\x04\x05", b"\x00\x00\x00\x00\x0f"
    for mode in (XOR, SUB):
        assert bytes(nat.delta_split_planes(cur, old, 4, mode))[4:] == b"\x0a"


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5, 6, 7, 8])
def test_empty_and_one_byte(k):
    assert bytes(nat.split_planes(b"", k)) == b"" == bytes(nat.join_planes(b"", k))
    assert bytes(nat.split_planes(b"\x7f", k)) == b"\x7f" == bytes(nat.join_planes(b"\x7f", k))
    for mode in ([XOR, SUB] if k in (1, 2, 4, 8) else [XOR]):
        assert bytes(nat.delta_split_planes(b"", b"", k, mode)) == b""
        assert bytes(nat.delta_join_planes(b"", b"", k, mode)) == b""
        one = nat.delta_split_planes(b"\x7f", b"\x80", k, mode)
        expect = ref.delta_split_planes(b"\x7f", b"\x80", k, mode)
        assert bytes(one) == expect
        assert bytes(nat.delta_join_planes(one, b"\x80", k, mode)) == b"\x7f"


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "bfloat16"])
def test_float_arrays_are_read_in_place(dtype):
    rng = np.random.default_rng(2)
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        arr = torch.randn(33, 7, dtype=torch.bfloat16)
        raw, k = arr.view(torch.uint8).numpy().tobytes(), 2
        old = arr.view(torch.uint8).numpy()
        cur = (arr * 1.01).view(torch.uint8).numpy()
    else:
        arr = rng.normal(0, 0.02, (33, 7)).astype(dtype)
        raw, k, old, cur = arr.tobytes(), arr.itemsize, arr, (arr * 1.01).astype(dtype)
    assert bytes(nat.split_planes(old, k)) == ref.split_planes(raw, k)
    planes = nat.delta_split_planes(cur, old, k)
    back = np.empty_like(cur)
    nat.delta_join_planes(planes, old, k, out=back)
    assert back.tobytes() == cur.tobytes()


def test_out_is_filled_and_its_prefix_returned():
    src = bytes(range(10))
    out = bytearray(16)
    view = nat.split_planes(src, 2, out=out)
    assert len(view) == 10 and bytes(out[:10]) == bytes(view) == ref.split_planes(src, 2)
    assert out[10:] == bytearray(6)
    assert nat.buffer_address(view) == nat.buffer_address(out)
    fresh = nat.split_planes(src, 2)
    assert not fresh.readonly and len(fresh) == 10


def test_in_place_join_over_the_reference():
    rng = np.random.default_rng(3)
    old = rng.normal(0, 0.02, 10_000).astype(np.float64)
    cur = old * (1 + 1e-3 * rng.standard_normal(old.size))
    for mode in (XOR, SUB):
        planes = bytes(nat.delta_split_planes(cur, old, 8, mode))
        target = old.copy()
        nat.delta_join_planes(planes, target, 8, mode, out=target)
        assert target.tobytes() == cur.tobytes()
        target = bytearray(old.tobytes())                 # same memory through another view
        nat.delta_join_planes(planes, target, 8, mode, out=memoryview(target))
        assert bytes(target) == cur.tobytes()


# ---- the C functions' return codes -------------------------------------------------------------
@pytest.mark.parametrize("k", [0, 9, 64, 2**63])
def test_c_rejects_item_sizes(k):
    a, o = bytearray(16), bytearray(16)
    for fn in SPLITS:
        assert fn(u8(a), 16, k, u8(o), 16) == lib.SNAP_EINVAL
    for split in (True, False):
        for mode in (XOR, SUB):
            assert delta_c(split, u8(a), u8(bytes(16)), 16, k, mode, u8(o), 16) == lib.SNAP_EINVAL
    assert o == bytearray(16)


@pytest.mark.parametrize("mode", [0, 3, -1, 2**31 - 1])
def test_c_rejects_modes(mode):
    a, b, o = bytes(8), bytes(8), bytearray(b"\xaa" * 8)
    for split in (True, False):
        assert delta_c(split, u8(a), u8(b), 8, 4, mode, u8(o), 8) == lib.SNAP_EINVAL
    assert o == bytearray(b"\xaa" * 8)


@pytest.mark.parametrize("k", [3, 5, 6, 7])
def test_c_sub_needs_a_word_size(k):
    a, o = bytes(14), bytearray(14)
    for split in (True, False):
        assert delta_c(split, u8(a), u8(a), 14, k, SUB, u8(o), 14) == lib.SNAP_EINVAL
        assert delta_c(split, u8(a), u8(a), 14, k, XOR, u8(o), 14) == lib.SNAP_OK


@pytest.mark.parametrize("k,flags", [(3, 1), (5, 1), (6, 3), (7, 7), (4, 8), (4, 9), (2, 16),
                                     (2, 0x80000000), (1, 1 << 31)])
def test_c_rejects_flags(k, flags):
    """A rotation (flags 1..7) needs a word size; bits above the rotation's are refused."""
    a, o = bytes(40), bytearray(b"\xaa" * 40)
    for fn in SPLITS:
        assert fn(u8(a), 40, k, u8(o), 40, flags) == lib.SNAP_EINVAL
    assert o == bytearray(b"\xaa" * 40)
    for k_ok in (1, 2, 4, 8):
        for rotation in range(8):
            assert SPLITS[0](u8(a), 40, k_ok, u8(o), 40, rotation) == lib.SNAP_OK


def test_c_null_pointers_with_nonzero_lengths():
    a, o = bytes(8), bytearray(8)
    for fn in SPLITS:
        assert fn(NULL, 8, 4, u8(o), 8) == lib.SNAP_EINVAL
        assert fn(u8(a), 8, 4, NULL, 8) == lib.SNAP_EINVAL
        assert fn(u8(a), 0, 4, NULL, 8) == lib.SNAP_EINVAL      # a capacity without a buffer
        assert fn(NULL, 0, 4, NULL, 0) == lib.SNAP_OK            # empty: NULL is fine
    for split in (True, False):
        assert delta_c(split, NULL, u8(a), 8, 4, SUB, u8(o), 8) == lib.SNAP_EINVAL
        assert delta_c(split, u8(a), NULL, 8, 4, SUB, u8(o), 8) == lib.SNAP_EINVAL
        assert delta_c(split, u8(a), u8(a), 8, 4, SUB, NULL, 8) == lib.SNAP_EINVAL
        assert delta_c(split, NULL, NULL, 0, 4, SUB, NULL, 0) == lib.SNAP_OK


def test_c_capacity_too_small_writes_nothing():
    a, o = bytes(range(16)), bytearray(b"\xaa" * 15)
    for fn in SPLITS:
        assert fn(u8(a), 16, 4, u8(o), 15) == lib.SNAP_ESPACE
    for split in (True, False):
        assert delta_c(split, u8(a), u8(a), 16, 4, SUB, u8(o), 15) == lib.SNAP_ESPACE
    assert o == bytearray(b"\xaa" * 15)
    big = bytearray(32)                  # a larger capacity is fine: only len bytes are written
    assert lib.snap_split_planes(u8(a), 16, 4, 0, u8(big), 32) == lib.SNAP_OK
    assert big[16:] == bytearray(16)


def test_c_rejects_overlapping_buffers():
    buf = bytearray(range(64))
    p = u8(buf)
    for fn in SPLITS:
        assert fn(p, 32, 4, p + 16, 32) == lib.SNAP_EINVAL
        assert fn(p + 16, 32, 4, p, 32) == lib.SNAP_EINVAL
        assert fn(p, 32, 4, p, 32) == lib.SNAP_EINVAL
        assert fn(p, 32, 4, p + 32, 32) == lib.SNAP_OK          # adjacent is fine
    other = u8(bytes(32))
    assert lib.snap_delta_split_planes(p, other, 32, 4, SUB, p + 8, 32) == lib.SNAP_EINVAL
    assert lib.snap_delta_split_planes(other, p, 32, 4, SUB, p + 8, 32) == lib.SNAP_EINVAL
    assert lib.snap_delta_split_planes(p, p, 32, 4, SUB, p + 32, 32) == lib.SNAP_OK   # cur == ref
    assert lib.snap_delta_join_planes(p, other, 32, 4, SUB, p + 8, 32) == lib.SNAP_EINVAL
    assert lib.snap_delta_join_planes(other, p, 32, 4, SUB, p + 8, 32) == lib.SNAP_EINVAL
    assert lib.snap_delta_join_planes(other, p, 32, 4, SUB, p, 32) == lib.SNAP_OK     # in place


def test_strerror_mentions_item_sizes():
    assert b"item size" in ffi.string(lib.snap_strerror(lib.SNAP_EINVAL))


# ---- the wrappers' argument checks --------------------------------------------------------------
CALLS = {
    "split": lambda a, b, k, m, out=None: nat.split_planes(a, k, out=out),
    "join": lambda a, b, k, m, out=None: nat.join_planes(a, k, out=out),
    "delta_split": lambda a, b, k, m, out=None: nat.delta_split_planes(a, b, k, m, out=out),
    "delta_join": lambda a, b, k, m, out=None: nat.delta_join_planes(a, b, k, m, out=out),
}


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("k", [0, 9, -1, 2**64])
def test_wrappers_reject_item_sizes(call, k):
    with pytest.raises(errors.InvalidArgumentError, match="itemsize"):
        CALLS[call](bytes(8), bytes(8), k, SUB)


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("k", [4.0, "4", None])
def test_wrappers_item_size_must_be_an_int(call, k):
    with pytest.raises(errors.InvalidArgumentTypeError, match="itemsize"):
        CALLS[call](bytes(8), bytes(8), k, SUB)


@pytest.mark.parametrize("call", ["delta_split", "delta_join"])
def test_wrappers_reject_modes(call):
    for mode in (0, 3, -2):
        with pytest.raises(errors.InvalidArgumentError, match="DELTA_XOR"):
            CALLS[call](bytes(8), bytes(8), 4, mode)
    with pytest.raises(errors.InvalidArgumentTypeError, match="mode"):
        CALLS[call](bytes(8), bytes(8), 4, "sub")
    with pytest.raises(errors.InvalidArgumentError, match="DELTA_SUB"):
        CALLS[call](bytes(9), bytes(9), 3, SUB)
    assert len(CALLS[call](bytes(9), bytes(9), 3, XOR)) == 9


@pytest.mark.parametrize("fn", [nat.split_planes, nat.join_planes])
def test_wrappers_rotate_argument(fn):
    with pytest.raises(errors.InvalidArgumentError, match="rotate works on"):
        fn(bytes(9), 3, rotate=True)
    with pytest.raises(errors.InvalidArgumentTypeError, match="rotate"):
        fn(bytes(8), 4, rotate="yes")
    assert len(fn(bytes(9), 3, rotate=False)) == 9


@pytest.mark.parametrize("call", ["delta_split", "delta_join"])
def test_wrappers_reject_unequal_lengths(call):
    for a, b in ((bytes(8), bytes(9)), (bytes(9), bytes(8)), (b"", b"x")):
        with pytest.raises(errors.InvalidArgumentError, match="same size"):
            CALLS[call](a, b, 4, SUB)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_wrappers_out_too_small(call):
    with pytest.raises(errors.InvalidArgumentError, match="out holds 7 bytes; 8"):
        CALLS[call](bytes(8), bytes(8), 4, SUB, out=bytearray(7))


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("ro", [lambda: bytes(8), lambda: memoryview(bytearray(8)).toreadonly(),
                                lambda: np.frombuffer(bytes(8), np.uint8),
                                lambda: mmap.mmap(-1, 8, prot=mmap.PROT_READ)])
def test_wrappers_read_only_out(call, ro):
    out = ro()
    with pytest.raises(errors.InvalidArgumentTypeError, match="writable") as exc:
        CALLS[call](bytes(8), bytes(8), 4, SUB, out=out)
    assert isinstance(exc.value, TypeError) and isinstance(exc.value, errors.SnapstoreError)


@pytest.mark.parametrize("call", sorted(CALLS))
@pytest.mark.parametrize("bad", [None, 8, "abcdefgh", [1, 2, 3, 4]])
def test_wrappers_reject_non_buffers(call, bad):
    with pytest.raises(errors.InvalidArgumentTypeError, match="bytes-like"):
        CALLS[call](bad, bytes(8), 4, SUB)
    if call.startswith("delta"):
        with pytest.raises(errors.InvalidArgumentTypeError, match="bytes-like"):
            CALLS[call](bytes(8), bad, 4, SUB)


@pytest.mark.parametrize("call", sorted(CALLS))
def test_wrappers_reject_non_contiguous(call):
    strided = np.zeros(16, np.uint8)[::2]
    with pytest.raises(errors.InvalidArgumentError, match="C-contiguous"):
        CALLS[call](strided, bytes(8), 4, SUB)
    with pytest.raises(errors.InvalidArgumentError, match="C-contiguous"):
        CALLS[call](bytes(8), bytes(8), 4, SUB, out=np.zeros(16, np.uint8)[::2])


@pytest.mark.parametrize("call", sorted(CALLS))
def test_wrappers_reject_overlapping_out(call):
    buf = bytearray(range(24))
    mv = memoryview(buf)
    with pytest.raises(errors.InvalidArgumentError, match="must not overlap"):
        CALLS[call](mv[:8], bytes(8), 4, SUB, out=mv[4:12])
    with pytest.raises(errors.InvalidArgumentError, match="must not overlap"):
        CALLS[call](mv[:8], bytes(8), 4, SUB, out=mv[:8])
    assert bytes(buf) == bytes(range(24))


def test_delta_wrappers_reference_overlap_rules():
    buf = bytearray(range(32))
    mv = memoryview(buf)
    with pytest.raises(errors.InvalidArgumentError, match="must not overlap ref"):
        nat.delta_split_planes(bytes(8), mv[:8], 4, SUB, out=mv[:8])      # split: never
    with pytest.raises(errors.InvalidArgumentError, match="must not overlap ref"):
        nat.delta_join_planes(bytes(8), mv[:8], 4, SUB, out=mv[4:12])     # join: only exactly
    assert bytes(buf) == bytes(range(32))
    assert bytes(nat.delta_join_planes(bytes(8), mv[:8], 4, SUB, out=mv[:8])) == bytes(range(8))


@pytest.mark.parametrize("offset", range(1, 8))
def test_misaligned_buffers_work(offset):
    rng = np.random.default_rng(offset)
    raw = rng.normal(0, 1, 200).astype(np.float64).tobytes()
    new = (np.frombuffer(raw, np.float64) * 1.001).tobytes()
    store = bytearray(offset + len(raw))
    store[offset:] = raw
    view = memoryview(store)[offset:]
    out = memoryview(bytearray(offset + len(raw)))[offset:]
    assert bytes(nat.split_planes(view, 8, out=out)) == ref.split_planes(raw, 8)
    nat.delta_split_planes(new, view, 8, SUB, out=out)
    nat.delta_join_planes(out, view, 8, SUB, out=view)
    assert bytes(view) == new


@pytest.mark.parametrize("k", range(1, 9))
def test_exact_size_buffers(k):
    """Inputs and outputs allocated at their exact sizes by malloc (numpy arrays of 1 KiB and
    more are), so that under `make asan` a byte read or written past any of them is caught."""
    rng = np.random.default_rng(k)
    for n in (1024, 1024 + k - 1, 1031, 1024 * k + 3):
        cur = rng.integers(0, 256, n, dtype=np.uint8)
        old = rng.integers(0, 256, n, dtype=np.uint8)
        out, back = np.empty(n, np.uint8), np.empty(n, np.uint8)
        for rotate in ([False, True] if k in (1, 2, 4, 8) else [False]):
            nat.split_planes(cur, k, out=out, rotate=rotate)
            nat.join_planes(out, k, out=back, rotate=rotate)
            assert back.tobytes() == cur.tobytes()
        for mode in ([XOR, SUB] if k in (1, 2, 4, 8) else [XOR]):
            nat.delta_split_planes(cur, old, k, mode, out=out)
            nat.delta_join_planes(out, old, k, mode, out=back)
            assert back.tobytes() == cur.tobytes()
            nat.delta_join_planes(out, old, k, mode, out=old)
            assert old.tobytes() == cur.tobytes()
            old = rng.integers(0, 256, n, dtype=np.uint8)
