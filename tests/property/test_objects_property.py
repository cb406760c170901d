"""Property tests of object checkpoints against plain pickle: for random nested objects with
NumPy arrays (random dtypes, shapes incl. 0-d and empty, C/Fortran order, strided views),
store.load(store.save(obj)) equals pickle.loads(pickle.dumps(obj)), whatever inband_limit, and
load(into=) of a scrambled copy restores it. SNAPSTORE_HYPOTHESIS_PROFILE=slow runs 10x more.
"""
import itertools
import pickle
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import snapstore
from snapstore import objects

DTYPES = [np.dtype(d) for d in ("?", "u1", "i2", "<u4", ">i4", "i8", "f2", "f4", ">f8", "c8",
                                "c16", "S3", "U2", "M8[s]", "m8[us]", "V5")] + \
    [np.dtype([("a", "<i2"), ("b", "f8")])]


def examples(n: int) -> int:
    return max(1, n * settings.default.max_examples // 100)


@st.composite
def arrays(draw):
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=12))
    n = int(np.prod(shape)) * dtype.itemsize
    data = draw(st.binary(min_size=n, max_size=n)) if n <= 2048 else \
        np.random.default_rng(draw(st.integers(0, 1 << 30))).bytes(n)
    a = np.frombuffer(bytearray(data), dtype=np.uint8)
    a = a.view(dtype).reshape(shape) if n else np.zeros(shape, dtype)
    if dtype.kind == "b":
        a = a.view(np.uint8).__and__(1).view(dtype)
    layout = draw(st.sampled_from(["C", "F", "T", "strided"]))
    if layout == "F":
        a = np.asfortranarray(a)
    elif layout == "T":
        a = a.T
    elif layout == "strided" and a.ndim and dtype.isnative:
        a = a[::2]
    if draw(st.booleans()) and a.size < 200:
        a = np.tile(a, (50,) + (1,) * max(a.ndim - 1, 0)) if a.ndim else a   # big: out of band
    return a


leaves = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                   st.text(max_size=8), st.binary(max_size=16), arrays())
objs = st.recursive(leaves, lambda kids: st.one_of(
    st.lists(kids, max_size=4), st.tuples(kids, kids),
    st.dictionaries(st.text(max_size=4), kids, max_size=4)), max_leaves=12)


def equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return (isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
                and a.tobytes(order="A") == b.tobytes(order="A")
                and a.flags.f_contiguous == b.flags.f_contiguous
                and a.flags.c_contiguous == b.flags.c_contiguous)
    if isinstance(a, dict):
        return type(b) is dict and list(a) == list(b) and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(equal, a, b))
    return type(a) is type(b) and a == b


@pytest.fixture(scope="module")
def store():
    with tempfile.TemporaryDirectory() as d:
        with snapstore.open(d + "/s", durability="none") as s:
            yield s


_streams = itertools.count()


@settings(max_examples=examples(60))
@given(obj=objs, limit=st.sampled_from([0, 64, objects.DEFAULT_INBAND_LIMIT, 1 << 30]))
def test_round_trip_equals_plain_pickle(store, obj, limit):
    stream = f"p{next(_streams)}"
    info = objects.save(store, obj, stream=stream, inband_limit=limit)
    expected = pickle.loads(pickle.dumps(obj, protocol=5))
    assert equal(store.load(info.id), expected)
    assert equal(store.load(stream), expected)


def scramble(x):
    """A copy with every array's bytes overwritten (same dtype, shape and memory order)."""
    if isinstance(x, np.ndarray):
        y = x.copy(order="K")
        if y.nbytes and not y.dtype.hasobject:
            raw = pickle.PickleBuffer(y.view(np.int64) if y.dtype.kind in "mM" else y).raw()
            raw[:] = b"\x5a" * len(raw)
        return y
    if isinstance(x, dict):
        return {k: scramble(v) for k, v in x.items()}
    if isinstance(x, list):
        return [scramble(v) for v in x]
    if isinstance(x, tuple):
        return tuple(scramble(v) for v in x)
    return x


@settings(max_examples=examples(40))
@given(obj=st.dictionaries(st.text(max_size=4), objs, max_size=4))
def test_load_into_a_copy_restores_it(store, obj):
    info = store.save(obj, stream=f"i{next(_streams)}")
    expected = pickle.loads(pickle.dumps(obj, protocol=5))
    target = scramble(expected)
    assert store.load(info.id, into=target) is target
    assert equal(target, expected)
