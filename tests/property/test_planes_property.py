"""Property tests: the byte-plane kernels (csrc/planes.c, through snapstore._native) against the
pure-Python reference in tests/reference.py, which follows the layout written in snapstore.h.

Inputs: float16, bfloat16, float32 and float64 values as raw bytes (hypothesis floats plus NaNs
with payloads, infinities, denormals, -0.0, extreme finite values), arbitrary non-float bytes,
odd lengths (tails of 1..itemsize-1 bytes), empty and 1-byte buffers, every item size 1..8 also
against float data of another width, views at odd alignments, and pairs of versions: small
relative changes (Adam-like), sign flips, some items unchanged, unrelated bytes. Every kernel is
checked byte-exact against the reference and round-tripped (the split also with rotation), the
delta join also in place.
SNAPSTORE_HYPOTHESIS_PROFILE=slow runs 10x more.
"""
import struct

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from snapstore import _native as nat


def examples(n: int) -> int:
    """n scaled by the loaded profile (dev: 100 -> n, slow: 1000 -> 10 n)."""
    return max(1, n * settings.default.max_examples // 100)


def unaligned(raw: bytes, offset: int) -> memoryview:
    """A writable view of raw starting offset bytes into a bytearray (odd alignment)."""
    ba = bytearray(offset) + bytearray(raw) + bytearray(3)
    return memoryview(ba)[offset:offset + len(raw)]


# kind -> (itemsize, struct format of hypothesis' floats of that width, width, special patterns)
def _specials(bits: int, exp_bits: int) -> list:
    """Bit patterns of the IEEE specials of a binary format: +-0, +-inf, quiet and signalling NaNs
    with payloads and either sign, smallest and largest denormals, smallest normal, max finite."""
    man = bits - 1 - exp_bits
    sign, exp_all = 1 << (bits - 1), ((1 << exp_bits) - 1) << man
    pats = [0, sign, exp_all, sign | exp_all,
            exp_all | (1 << (man - 1)), sign | exp_all | (1 << (man - 1)) | 1,
            exp_all | 1, exp_all | ((1 << man) - 1),
            1, sign | 1, (1 << man) - 1, 1 << man, exp_all - 1, sign | (exp_all - 1)]
    return [p.to_bytes(bits // 8, "little") for p in pats]


FORMATS = {
    "float16": (2, "<e", 16, _specials(16, 5)),
    "bfloat16": (2, None, 32, _specials(16, 8)),
    "float32": (4, "<f", 32, _specials(32, 8)),
    "float64": (8, "<d", 64, _specials(64, 11)),
}
NP_DTYPES = {"float16": np.float16, "float32": np.float32, "float64": np.float64}


def _pack(kind: str, value: float) -> bytes:
    k, fmt, _, _ = FORMATS[kind]
    if kind == "bfloat16":             # the high half of the float32 (truncation)
        return struct.pack("<f", value)[2:]
    return struct.pack(fmt, value)


@st.composite
def float_bytes(draw, max_items: int = 48):
    """(kind, itemsize, raw bytes): items of one float format, sometimes with a tail."""
    kind = draw(st.sampled_from(sorted(FORMATS)))
    k, _, width, specials = FORMATS[kind]
    item = st.one_of(st.floats(width=width).map(lambda v: _pack(kind, v)),
                     st.sampled_from(specials),
                     st.binary(min_size=k, max_size=k))
    raw = b"".join(draw(st.lists(item, max_size=max_items)))
    raw += draw(st.one_of(st.just(b""), st.binary(min_size=1, max_size=k - 1)))
    return kind, k, raw


def _perturb(kind: str, body: bytes, rel: float, seed: int, unchanged: float) -> bytes:
    """body's floats times (1 + rel * N(0, 1)), a fraction `unchanged` of them left as they were
    (bfloat16 through float32, rounded toward zero: its high half)."""
    rng = np.random.default_rng(seed)
    if kind == "bfloat16":
        vals = (np.frombuffer(body, np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        vals = np.frombuffer(body, NP_DTYPES[kind])
    with np.errstate(all="ignore"):
        new = (vals * (1 + rel * rng.standard_normal(vals.size))).astype(vals.dtype)
    keep = rng.random(vals.size) < unchanged
    new[keep] = vals[keep]
    if kind == "bfloat16":
        return (new.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    return new.tobytes()


@st.composite
def versions(draw):
    """(itemsize, cur, ref): two versions of one buffer of floats (or of bytes)."""
    kind, k, old = draw(float_bytes())
    body = len(old) // k * k
    how = draw(st.sampled_from(["perturb", "perturb", "random", "same", "flip"]))
    if how == "perturb":
        rel = draw(st.sampled_from([1e-4, 1e-3, 1e-2, 0.3, 3.0]))
        new = _perturb(kind, old[:body], rel, draw(st.integers(0, 2**32)),
                       draw(st.sampled_from([0.0, 0.5, 0.9])))
        new += draw(st.binary(min_size=len(old) - body, max_size=len(old) - body))
    elif how == "random":
        new = draw(st.binary(min_size=len(old), max_size=len(old)))
    elif how == "flip":                   # sign bits flipped: huge integer differences
        new = bytearray(old)
        for i in range(k - 1, body, k):
            new[i] ^= 0x80
        new = bytes(new)
    else:
        new = old
    itemsize = draw(st.one_of(st.just(k), st.integers(1, nat.ITEMSIZE_MAX)))
    return itemsize, new, old


MODES_FOR = {k: ([nat.DELTA_XOR, nat.DELTA_SUB] if k in (1, 2, 4, 8) else [nat.DELTA_XOR])
             for k in range(1, nat.ITEMSIZE_MAX + 1)}


def _check_split(raw: bytes, k: int, off_in: int, off_out: int) -> None:
    for rotate in ([False, True, *range(2, nat.PLANES_ROTATION_MAX + 1)] if k in (1, 2, 4, 8)
                   else [False]):
        expect = ref.split_planes(raw, k, rotate)
        out = unaligned(bytes(len(raw)), off_out)
        got = nat.split_planes(unaligned(raw, off_in), k, out=out, rotate=rotate)
        assert bytes(got) == expect and bytes(out) == expect
        assert bytes(nat.split_planes(raw, k, rotate=rotate)) == expect   # fresh output
        assert ref.join_planes(expect, k, rotate) == raw                  # the reference inverts
        back = nat.join_planes(unaligned(expect, off_out), k, rotate=rotate)
        assert bytes(back) == raw


@settings(max_examples=examples(200))
@given(float_bytes(), st.integers(0, 15), st.integers(0, 15))
def test_split_and_join_floats_match_reference(fb, off_in, off_out):
    _, k, raw = fb
    _check_split(raw, k, off_in, off_out)


@settings(max_examples=examples(150))
@given(st.binary(max_size=300), st.integers(1, 8), st.integers(0, 15), st.integers(0, 15))
def test_split_and_join_any_bytes_any_itemsize(raw, k, off_in, off_out):
    _check_split(raw, k, off_in, off_out)


@settings(max_examples=examples(100))
@given(float_bytes(), st.integers(1, 8))
def test_float_data_split_at_another_width(fb, k):
    _, _, raw = fb
    _check_split(raw, k, 0, 0)


def _check_delta(cur: bytes, old: bytes, k: int, mode: int, offs) -> None:
    expect = ref.delta_split_planes(cur, old, k, mode)
    out = unaligned(bytes(len(cur)), offs[2])
    got = nat.delta_split_planes(unaligned(cur, offs[0]), unaligned(old, offs[1]), k, mode,
                                 out=out)
    assert bytes(got) == expect
    assert ref.delta_join_planes(expect, old, k, mode) == cur        # the reference inverts
    back = nat.delta_join_planes(unaligned(expect, offs[2]), unaligned(old, offs[1]), k, mode)
    assert bytes(back) == cur
    inplace = unaligned(old, offs[0])                                 # rebuilt over ref
    res = nat.delta_join_planes(expect, inplace, k, mode, out=inplace)
    assert bytes(inplace) == cur and bytes(res) == cur


@settings(max_examples=examples(250))
@given(versions(), st.data(), st.tuples(*[st.integers(0, 15)] * 3))
def test_delta_split_and_join_match_reference(v, data, offs):
    k, cur, old = v
    mode = data.draw(st.sampled_from(MODES_FOR[k]))
    _check_delta(cur, old, k, mode, offs)


@settings(max_examples=examples(100))
@given(st.integers(0, 300), st.integers(1, 8), st.integers(0, 2**32), st.data())
def test_delta_any_bytes_any_itemsize(n, k, seed, data):
    rng = np.random.default_rng(seed)
    old = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    cur = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
    mode = data.draw(st.sampled_from(MODES_FOR[k]))
    _check_delta(cur, old, k, mode, (1, 2, 3))


@settings(max_examples=examples(60))
@given(float_bytes(), st.data())
def test_unchanged_items_give_zero_planes(fb, data):
    _, k, raw = fb
    mode = data.draw(st.sampled_from(MODES_FOR[k]))
    assert bytes(nat.delta_split_planes(raw, raw, k, mode)) == bytes(len(raw))
    copy = bytearray(raw)
    assert bytes(nat.delta_join_planes(bytes(len(raw)), copy, k, mode, out=copy)) == raw


@settings(max_examples=examples(25))
@given(st.integers(1, 8), st.integers(0, 2**32), st.data())
def test_large_buffers_across_in_place_tiles(k, seed, data):
    """Lengths past the in-place join's stack tile (2048 items), at odd item counts."""
    n = data.draw(st.integers(2048 * k - 3, 3 * 2048 * k + 2 * k + 1))
    rng = np.random.default_rng(seed)
    old = rng.normal(0, 0.02, n // 4 + 1).astype(np.float32).tobytes()[:n]
    cur = bytearray(old)
    idx = rng.integers(0, max(n, 1), n // 3)
    for i in idx:
        cur[i] ^= int(rng.integers(1, 256))
    cur = bytes(cur)
    mode = data.draw(st.sampled_from(MODES_FOR[k]))
    assert bytes(nat.split_planes(cur, k)) == ref.split_planes(cur, k)
    if k in (1, 2, 4, 8):
        assert bytes(nat.split_planes(cur, k, rotate=True)) == ref.split_planes(cur, k, True)
    _check_delta(cur, old, k, mode, (0, 5, 3))
