"""Object checkpoints (snapstore.objects through Store.save / Store.load): round trips of nested
objects with arrays of every NumPy dtype, meta, incremental saves, load(into=) in place, and bad
input (nothing written, target unchanged)."""
import copy
import io
import pickle

import numpy as np
import pytest

import snapstore
from snapstore import objects
from snapstore.errors import (CheckpointNotFound, InvalidArgumentError, InvalidArgumentTypeError,
                              SnapstoreError)
from snapstore.objects import (FRESH, NotAnObjectCheckpointError, ObjectSaveError,
                               StructureMismatchError)

PAGE = 4096


def all_dtypes():
    """One array per NumPy scalar type (and a few composite dtypes)."""
    out = []
    for t in sorted(set(np.sctypeDict.values()), key=lambda t: t.__name__):
        if t is np.void:
            continue
        dt = np.dtype(t)
        if dt.kind in "mM":
            dt = np.dtype(f"{t.__name__}[ms]")
        elif dt.kind == "S":
            dt = np.dtype("S7")
        elif dt.kind == "U":
            dt = np.dtype("U5")
        out.append(dt)
    out += [np.dtype(">i4"), np.dtype("<f8"), np.dtype("V12"), np.dtype(("f4", (2, 3))),
            np.dtype([("a", "<i4"), ("b", ">f8", (2,)), ("c", "S3")])]
    return out


def make_array(dt, shape, rng, order="C"):
    """Random bytes in an array of that dtype (any bit pattern: NaN payloads, odd code points)."""
    a = np.empty(shape, dtype=dt)
    if dt.hasobject:
        flat = a.reshape(-1)
        for i in range(flat.size):
            flat[i] = {"i": i, "s": str(i)}
    elif a.nbytes:
        raw = rng.integers(0, 256, a.nbytes, dtype=np.uint8)
        if dt.kind == "b":
            raw &= 1
        a.reshape(-1).view(np.uint8)[:] = raw
    return np.asfortranarray(a) if order == "F" else a


def same_array(a, b) -> bool:
    if not (type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape):
        return False
    if a.dtype.hasobject:
        return a.tolist() == b.tolist()
    return a.tobytes(order="A") == b.tobytes(order="A")


def deep_equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and same_array(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(deep_equal(a[k], b[k])
                                                                   for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(deep_equal(x, y)
                                                              for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class Sim:
    """A user class holding arrays (state in __dict__)."""

    def __init__(self, n):
        self.grid = np.arange(n, dtype=np.float64).reshape(-1, 8)
        self.step = 0
        self.name = "sim"

    def __eq__(self, other):
        return type(other) is Sim and vars(self).keys() == vars(other).keys() and \
            all(deep_equal(vars(self)[k], vars(other)[k]) for k in vars(self))


# ---- round trips --------------------------------------------------------------------------
@pytest.mark.parametrize("dt", all_dtypes(), ids=str)
def test_round_trip_every_dtype(store, dt):
    rng = np.random.default_rng(1)
    obj = {
        "big": make_array(dt, (64, 40), rng),
        "fortran": make_array(dt, (33, 20), rng, order="F"),
        "scalar": make_array(dt, (), rng),
        "empty": make_array(dt, (0, 3), rng),
        "small": make_array(dt, (3,), rng),
        "strided": make_array(dt, (40, 30), rng)[::2, 1::3],
        "nested": [make_array(dt, (2, 2), rng), (make_array(dt, (1000,), rng), "x")],
    }
    info = store.save(obj, stream="d")
    out = store.load(info.id)
    assert deep_equal(out, {k: (np.ascontiguousarray(v) if k == "strided" else v)
                            for k, v in obj.items()})
    assert out["fortran"].flags.f_contiguous and not out["fortran"].flags.c_contiguous
    for a in (out["big"], out["fortran"], out["scalar"], out["nested"][1][0]):
        assert a.flags.writeable
    # same as plain pickle gives (which turns a strided ">i4" array into a native one)
    del obj["strided"], out["strided"]
    assert deep_equal(out, pickle.loads(pickle.dumps(obj, protocol=5)))


def test_round_trip_nested_objects(store):
    rng = np.random.default_rng(2)
    obj = {
        "sim": Sim(4096),
        "list": [1, 2.5, "three", None, True, b"bytes", bytearray(b"ba" * 5000), {4, 5}],
        "tuple": (np.float32(1.5), np.int64(3), complex(1, 2)),
        "arrays": {f"a{i}": rng.standard_normal((128, 64)) for i in range(3)},
        "pb": pickle.PickleBuffer(bytearray(rng.bytes(20000))),
        "memmap_like": rng.integers(0, 9, (300, 300), dtype=np.int16).T,
    }
    out = store.save(obj, stream="n") and store.load("n")
    assert out["sim"] == obj["sim"]
    assert out["list"] == obj["list"] and out["tuple"] == obj["tuple"]
    assert deep_equal(out["arrays"], obj["arrays"])
    assert isinstance(out["pb"], bytearray) and bytes(out["pb"]) == bytes(obj["pb"].raw())
    assert same_array(out["memmap_like"], obj["memmap_like"])
    assert out["memmap_like"].flags.f_contiguous      # a transposed C array is F-contiguous


def test_shared_and_cyclic_objects(store):
    a = np.arange(10000.0)
    obj = {"x": a, "y": a, "l": []}
    obj["l"].append(obj)
    out = store.save(obj, stream="c") and store.load("c")
    assert out["x"] is out["y"] and out["l"][0] is out
    assert store.latest("c").sizes == {"pickle": store.latest("c").sizes["pickle"], "oob/0": 80000}


def test_loaded_arrays_are_owned_by_the_caller(store):
    a = np.arange(100000, dtype=np.int64)
    info = store.save({"a": a}, stream="o")
    x, y = store.load(info.id)["a"], store.load(info.id)["a"]
    x[:] = -1
    assert np.array_equal(y, a) and np.array_equal(store.load(info.id)["a"], a)
    a[:] = 5                                      # the saved array no longer matters either
    assert np.array_equal(store.load(info.id)["a"], np.arange(100000))


def test_memmap_saved_as_contents(store, tmp_path):
    mm = np.memmap(str(tmp_path / "m.bin"), dtype=np.float32, mode="w+", shape=(256, 64))
    mm[:] = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    info = store.save({"m": mm}, stream="m")
    assert info.sizes["oob/0"] == mm.nbytes and info.sizes["pickle"] < 1000
    out = store.load(info.id)["m"]
    assert type(out) is np.ndarray and np.array_equal(out, mm)


def test_inband_limit(store):
    obj = {"small": np.arange(100, dtype=np.uint8), "big": np.arange(5000, dtype=np.uint8)}
    assert set(store.save(obj, stream="a").sizes) == {"pickle", "oob/0"}
    info = objects.save(store, obj, stream="b", inband_limit=0)
    assert set(info.sizes) == {"pickle", "oob/0", "oob/1"}
    info = objects.save(store, obj, stream="c", inband_limit=1 << 20)
    assert set(info.sizes) == {"pickle"}
    for s in "abc":
        assert deep_equal(store.load(s), obj)
    with pytest.raises(InvalidArgumentError):
        objects.save(store, obj, stream="d", inband_limit=-1)


# ---- ids, meta and trust ----------------------------------------------------------------------
def test_ids_streams_and_meta(store):
    i1 = store.save({"v": 1}, stream="m", meta={"step": 1, "tag": "x"})
    i2 = store.save([2], stream="m", meta=[1, 2])
    i3 = store.save(3, stream="m")
    assert i1.meta["step"] == 1 and objects.user_meta(i1) == {"step": 1, "tag": "x"}
    assert objects.user_meta(i2) == [1, 2] and objects.user_meta(store.get(i3.id)) is None
    assert objects.is_object_checkpoint(i1) and objects.is_object_checkpoint(store.latest("m"))
    assert store.load(i1.id) == {"v": 1} and store.load(i1) == {"v": 1}
    assert store.load(i2.id) == [2] and store.load("m") == 3
    assert objects.load(store, "m") == 3
    with pytest.raises(CheckpointNotFound):
        store.load("no-such-stream")
    with pytest.raises(CheckpointNotFound):
        store.load(999)
    with pytest.raises(InvalidArgumentError, match="reserved"):
        store.save(1, stream="m", meta={objects.META_KEY: 1})
    with pytest.raises(TypeError):
        store.save(1, stream="m", meta={"x": object()})
    assert [c.id for c in store.checkpoints("m")] == [i1.id, i2.id, i3.id]


def test_refuses_checkpoints_it_did_not_write(store):
    payload = pickle.dumps({"evil": True})
    info = store.checkpoint({"pickle": payload}, stream="p")
    with pytest.raises(NotAnObjectCheckpointError):
        store.load(info.id)
    info = store.checkpoint({"pickle": payload}, stream="p",
                            meta={objects.META_KEY: {"version": 1, "buffers": 2}})
    with pytest.raises(NotAnObjectCheckpointError, match="do not match"):
        store.load(info.id)


def test_a_huge_buffer_count_in_the_object_meta_is_refused_at_once(store):
    """A meta claiming 10**12 out-of-band buffers made load(), `snapstore show` and export
    build a name per claimed buffer (minutes of CPU, GiBs) before comparing."""
    from snapstore import tensors
    from snapstore.errors import CorruptionError
    info = store.checkpoint({"pickle": pickle.dumps(1)}, stream="p",
                            meta={objects.META_KEY: {"version": 1, "buffers": 10 ** 12}})
    with pytest.raises(NotAnObjectCheckpointError, match="do not match"):
        store.load(info.id)
    with pytest.raises(CorruptionError, match="names 1000000000000 buffers"):
        tensors.catalogue(store, info)


def test_readonly_store_loads(store_path):
    with snapstore.open(store_path, durability="none") as s:
        s.save({"a": np.arange(10000)}, stream="r")
    with snapstore.open(store_path, readonly=True) as r:
        assert np.array_equal(r.load("r")["a"], np.arange(10000))
        assert r.verify()["ok"]


# ---- incremental -----------------------------------------------------------------------------
def test_one_percent_of_pages_changed_stores_about_one_percent(store):
    rng = np.random.default_rng(3)
    state = {f"layer{i}": rng.standard_normal(1 << 18).astype(np.float32) for i in range(4)}
    state["step"] = 0
    total = sum(a.nbytes for a in state.values() if isinstance(a, np.ndarray))   # 4 MiB
    first = store.save(state, stream="inc")
    assert first.kind == "full" and first.bytes_new >= total * 0.8    # zstd takes a little
    pages = total // PAGE
    changed = rng.choice(pages, pages // 100, replace=False)
    for p in changed:
        name, off = f"layer{p // 256}", (p % 256) * (PAGE // 4)
        state[name][off + int(rng.integers(0, PAGE // 4))] += 1.0
    state["step"] = 1
    second = store.save(state, stream="inc")
    assert second.kind == "incremental"
    assert second.bytes_new <= len(changed) * PAGE * 1.1 + 16384, second.bytes_new
    assert deep_equal(store.load(second.id), state)
    assert store.load(first.id)["step"] == 0


def test_reordered_and_resized_buffers_are_deduplicated(store):
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(1 << 17), rng.standard_normal(1 << 17)     # 1 MiB each
    store.save({"a": a, "b": b}, stream="r")
    swapped = store.save({"b": b, "a": a}, stream="r")                     # order changed
    assert swapped.bytes_new < 64 * 1024
    grown = store.save({"b": b, "a": a, "c": np.concatenate([a, a[:512]])}, stream="r")
    assert grown.bytes_new < 200 * 1024                                  # c: a's chunks + a tail
    assert deep_equal(store.load(grown.id)["c"], np.concatenate([a, a[:512]]))


# ---- load(into=) -------------------------------------------------------------------------------
def make_state(seed=5):
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((256, 128)).astype(np.float32),
        "f": np.asfortranarray(rng.standard_normal((64, 96))),
        "layers": [rng.integers(0, 100, 3000), rng.standard_normal(10)],
        "sim": Sim(2048),
        "step": 12,
        "lr": 0.5,
        "buf": bytearray(rng.bytes(6000)),
        "t": (np.zeros(5000), "fixed"),
    }


def test_load_into_writes_in_place(store):
    saved = make_state()
    info = store.save(saved, stream="i")
    target = make_state(seed=9)
    target["t"] = (np.ones(5000), "fixed")
    mem = {k: target[k].ctypes.data for k in ("w", "f")}
    keep = (target["layers"][0], target["sim"].grid, target["buf"], target["t"][0])
    result = store.load(info.id, into=target)
    assert result is target
    assert deep_equal({k: v for k, v in target.items() if k not in ("sim", "buf")},
                      {k: v for k, v in saved.items() if k not in ("sim", "buf")})
    assert target["sim"] == saved["sim"] and target["buf"] == saved["buf"]
    assert all(target[k].ctypes.data == p for k, p in mem.items())
    assert target["layers"][0] is keep[0] and target["sim"].grid is keep[1]
    assert target["buf"] is keep[2] and target["t"][0] is keep[3]
    assert target["f"].flags.f_contiguous


def test_load_into_other_layouts_and_fresh(store):
    saved = make_state()
    info = store.save(saved, stream="i2")
    target = make_state(seed=8)
    target["f"] = np.zeros((64, 96))                             # C-order target for F data
    big = np.zeros((512, 256), np.float32)
    target["w"] = big[::2, ::2]                                  # a non-contiguous view
    target["layers"][1] = np.zeros((10, 1)).T[0]                 # an F/C-ambiguous 1-d view
    store.load(info.id, into=target)
    assert np.array_equal(target["w"], saved["w"]) and np.array_equal(big[::2, ::2], saved["w"])
    assert np.array_equal(target["f"], saved["f"])
    assert deep_equal(target["layers"], saved["layers"])
    target["layers"] = FRESH
    store.load(info.id, into=target)
    assert deep_equal(target["layers"], saved["layers"])
    assert deep_equal(store.load(info.id, into=FRESH), saved)          # FRESH alone: a load
    ftarget = {"w": np.zeros((128, 256), np.float32).T}          # F-order target for C data
    info = store.save({"w": saved["w"]}, stream="i3")
    store.load(info.id, into=ftarget)
    assert np.array_equal(ftarget["w"], saved["w"]) and ftarget["w"].flags.f_contiguous


def test_load_into_array_root_and_shared(store):
    a = np.arange(50000.0)
    info = store.save(a, stream="root")
    target = np.zeros_like(a)
    assert store.load(info.id, into=target) is target and np.array_equal(target, a)
    shared = {"x": a, "y": a}
    info = store.save(shared, stream="sh")
    t = np.zeros_like(a)
    store.load(info.id, into={"x": t, "y": t})
    assert np.array_equal(t, a)


def snapshot_target(t):
    return copy.deepcopy(t)


@pytest.mark.parametrize("damage,match", [
    (lambda t: t.pop("step"), "keys differ"),
    (lambda t: t.__setitem__("extra", 1), "keys differ"),
    (lambda t: t.__setitem__("w", np.zeros((256, 127), np.float32)), "256, 127"),
    (lambda t: t.__setitem__("w", np.zeros((256, 128), np.float64)), "float64"),
    (lambda t: t["layers"].append(1), "list of 2 items"),
    (lambda t: t.__setitem__("layers", tuple(t["layers"])), "tuple"),
    (lambda t: t.__setitem__("buf", bytearray(5)), "6000"),
    (lambda t: setattr(t["sim"], "grid", np.zeros(3)), r"obj\['sim'\].grid"),
    (lambda t: setattr(t["sim"], "other", 1), "attributes differ"),
    (lambda t: t.__setitem__("t", (t["t"][0], "changed")), "cannot be changed in place"),
    (lambda t: t.__setitem__("sim", {"grid": 1}), "Sim"),
])
def test_load_into_mismatch_writes_nothing(store, damage, match):
    saved = make_state()
    info = store.save(saved, stream="mm")
    target = make_state(seed=7)
    damage(target)
    before = snapshot_target(target)
    with pytest.raises(StructureMismatchError, match=match) as exc:
        store.load(info.id, into=target)
    assert isinstance(exc.value, InvalidArgumentError) and isinstance(exc.value, SnapstoreError)
    assert exc.value.path.startswith("obj")
    assert deep_equal(target, before)


def test_load_into_a_masked_array_is_refused_not_unmasked(store):
    """Regression: load(into=) copied a masked array's data into the target and left its
    mask as it was, so the masked values became visible data."""
    saved = np.ma.masked_array([1.0, 2.0, 3.0, 4.0], mask=[True, False, True, False])
    info = store.save({"m": saved, "a": np.ones(3)}, stream="ma")
    target = {"m": np.ma.masked_array(np.zeros(4), mask=False), "a": np.zeros(3)}
    with pytest.raises(StructureMismatchError, match="masked array"):
        store.load(info.id, into=target)
    assert not target["a"].any() and not target["m"].mask.any()    # nothing was written
    target["m"] = FRESH
    store.load(info.id, into=target)
    assert list(target["m"].mask) == [True, False, True, False]
    assert target["m"].compressed().tolist() == [2.0, 4.0] and target["a"].tolist() == [1] * 3


def test_load_into_readonly_target_refused(store):
    info = store.save({"a": np.arange(10000)}, stream="ro")
    target = {"a": np.zeros(10000, dtype=np.int64)}
    target["a"].flags.writeable = False
    with pytest.raises(StructureMismatchError, match="read-only"):
        store.load(info.id, into=target)
    assert not target["a"].any()


# ---- bad input ---------------------------------------------------------------------------------
def test_unpicklable_object_names_the_part_and_writes_nothing(store):
    store.save({"ok": 1}, stream="u")
    before = (store.checkpoints(), store.stats()["segment_bytes"])
    bad = {"a": [1, np.arange(10000), {"f": lambda x: x}], "b": 2}
    with pytest.raises(ObjectSaveError) as exc:
        store.save(bad, stream="u")
    assert exc.value.path == "obj['a'][2]['f']" and "function" in str(exc.value)
    assert isinstance(exc.value, TypeError)
    with pytest.raises(ObjectSaveError, match="obj.lock"):
        s = Sim(8)
        s.lock = __import__("threading").Lock()
        store.save(s, stream="u")
    assert (store.checkpoints(), store.stats()["segment_bytes"]) == before
    assert store.load("u") == {"ok": 1}


def test_bad_arguments(store):
    with pytest.raises(TypeError):
        store.save(1, stream=3)
    with pytest.raises(InvalidArgumentError):
        store.save(1, stream="")
    with pytest.raises(TypeError):
        store.load(1.5)


def test_store_stays_consistent(store):
    for i in range(5):
        store.save({"i": i, "a": np.full(20000, i)}, stream="v")
    assert store.verify(deep=True)["ok"]
    assert [store.load(c.id)["i"] for c in store.checkpoints("v")] == list(range(5))


# ---- save_arrays / load_arrays ------------------------------------------------------------------
@pytest.mark.parametrize("dt", all_dtypes(), ids=str)
def test_arrays_round_trip_every_dtype(store, dt):
    if dt.hasobject:
        with pytest.raises(TypeError, match="store.save"):
            snapstore.save_arrays(store, {"o": np.empty(3, dt)}, stream="x")
        assert store.latest("x") is None
        return
    rng = np.random.default_rng(6)
    arrays = {"big": make_array(dt, (70, 50), rng), "F": make_array(dt, (33, 20), rng, "F"),
              "0d": make_array(dt, (), rng), "empty": make_array(dt, (0, 4), rng),
              "strided": make_array(dt, (20, 20), rng)[::3, ::2], "": make_array(dt, (5,), rng)}
    info = snapstore.save_arrays(store, arrays, stream="arr", meta={"t": 1.5})
    assert objects.user_meta(info) == {"t": 1.5} and info.meta["t"] == 1.5
    assert set(info.sizes) == {"array/" + k for k in arrays}
    out = snapstore.load_arrays(store, "arr")
    arrays["strided"] = np.ascontiguousarray(arrays["strided"])
    assert deep_equal(out, arrays) and out["F"].flags.f_contiguous
    assert all(a.flags.writeable for a in out.values())
    target = {k: np.zeros_like(v) for k, v in arrays.items()}
    target["F"] = np.zeros_like(arrays["F"], order="C")          # C target for F data
    ptr = target["big"].ctypes.data
    assert snapstore.load_arrays(store, info.id, into=target) is target
    assert target["F"].tobytes() == arrays["F"].tobytes()             # same values, C order
    assert deep_equal({k: v for k, v in target.items() if k != "F"},
                      {k: v for k, v in arrays.items() if k != "F"})
    assert target["big"].ctypes.data == ptr


def test_arrays_diff_by_name_and_refuse_mismatches(store):
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(1 << 17), rng.standard_normal(1 << 17)
    snapstore.save_arrays(store, {"a": a, "b": b}, stream="n")
    a[:10] = 0
    info = snapstore.save_arrays(store, {"new": np.arange(10), "a": a}, stream="n")
    assert info.kind == "incremental" and info.bytes_new < 20000     # a: one page; b dropped
    target = {"new": np.zeros(10, np.int64), "a": np.zeros(1 << 17)}
    for bad, match in (({"a": target["a"]}, "names differ"),
                       ({"new": np.zeros(10, np.int32), "a": target["a"]}, "int32"),
                       ({"new": np.zeros(11, np.int64), "a": target["a"]}, r"\(11,\)")):
        with pytest.raises(StructureMismatchError, match=match):
            snapstore.load_arrays(store, "n", into=bad)
        assert not target["a"].any()
    with pytest.raises(NotAnObjectCheckpointError):
        snapstore.load_arrays(store, store.save({"a": a}, stream="o").id)
    with pytest.raises(NotAnObjectCheckpointError):
        store.load(info.id)
    with pytest.raises(TypeError):
        snapstore.save_arrays(store, {"x": [1, 2]}, stream="n")
    # fields out of memory order: NumPy cannot describe it as a buffer (a raw ValueError)
    out_of_order = np.dtype({"names": ["x", "y"], "formats": ["u1", "<i8"],
                             "offsets": [8, 0], "itemsize": 16})
    before = store.checkpoints("n")
    with pytest.raises(InvalidArgumentTypeError, match="store.save"):
        snapstore.save_arrays(store, {"s": np.zeros(10, out_of_order)}, stream="n")
    assert store.checkpoints("n") == before
    saved = np.ones(3, out_of_order)    # (its padding bytes are whatever memory held)
    loaded = store.load(store.save({"s": saved}, stream="o2").id)["s"]
    assert loaded.dtype == out_of_order and loaded.tobytes() == saved.tobytes()
    with pytest.raises(InvalidArgumentError, match="reserved"):
        snapstore.save_arrays(store, {}, stream="n", meta={"snapstore.arrays": 1})


# ---- the names pickle streams use are part of the format -------------------------------------
class _NamesSeen(pickle.Unpickler):
    """Unpickler recording every global a stream names."""

    def __init__(self, data, buffers):
        super().__init__(io.BytesIO(data), buffers=buffers)
        self.names = set()

    def find_class(self, module, name):
        self.names.add((module, name))
        return super().find_class(module, name)


def snapstore_globals(store, info) -> set:
    """The snapstore.* globals the pickle stream of an object checkpoint names (loading it)."""
    names = [f"{objects.OOB_PREFIX}{i}" for i in range(info.reserved_meta[objects.META_KEY]["buffers"])]
    seen = _NamesSeen(store.read(info.id, objects.PICKLE_BUFFER),
                      [bytearray(store.read(info.id, n)) for n in names])
    seen.load()
    return {(m, n) for m, n in seen.names if m.split(".")[0] == "snapstore"}


def test_pickle_streams_name_the_pinned_rebuild_functions(store):
    """Stores written once must load forever: the snapstore names in pickle streams resolve at
    the same module path (objects.py keeps them; never rename or move them)."""
    obj = {"when": np.arange(2000).astype("datetime64[ms]"),
           "delta": np.arange(5).astype("timedelta64[s]"),
           "fresh": FRESH}
    assert snapstore_globals(store, store.save(obj, stream="pin")) == {
        ("snapstore.objects", "_datetime_array"), ("snapstore.objects", "FRESH")}
    assert objects.FRESH is FRESH and callable(objects._datetime_array)


class _AttrDict(dict):
    pass


class _AttrList(list):
    pass


def test_load_into_restores_the_attributes_of_dict_and_list_subclasses(store):
    state = _AttrDict(w=np.arange(1000.0))
    state.version = 2
    hist = _AttrList([1, 2])
    hist.best = 0.5
    store.save({"state": state, "hist": hist}, "attrs")
    target_state = _AttrDict(w=np.zeros(1000))
    target_state.version = 1
    target_hist = _AttrList([0, 0])
    target_hist.best = 9.9
    target = {"state": target_state, "hist": target_hist}
    assert store.load("attrs", into=target) is target
    assert target["state"].version == 2 and target["hist"].best == 0.5
    assert list(target["hist"]) == [1, 2] and np.array_equal(target["state"]["w"],
                                                              np.arange(1000.0))
    # attributes that differ, or a plain dict where the checkpoint holds the subclass: refused
    other = _AttrDict(w=np.zeros(1000))
    other.extra = 1
    with pytest.raises(StructureMismatchError, match="attributes differ"):
        store.load("attrs", into={"state": other, "hist": _AttrList([0, 0])})
    with pytest.raises(StructureMismatchError, match="_AttrDict"):
        store.load("attrs", into={"state": {"w": np.zeros(1000)}, "hist": target_hist})
    # subclasses without attributes on either side match plain containers as before
    store.save({"d": _AttrDict(a=1)}, "plain")
    plain = {"d": {"a": 0}}
    store.load("plain", into=plain)
    assert plain == {"d": {"a": 1}}


@pytest.mark.parametrize("arrays", [
    {"v": {"dtype": "<f8", "shape": [1], "order": "C"}},              # no buffer array/v
    {"u": {"dtype": "<f8", "shape": [100], "order": "C"}},            # buffer too small
    {"u": {"dtype": "nonsense", "shape": [1], "order": "C"}},
    {"u": {"dtype": "<f8", "shape": [1], "order": "X"}},
    {"u": {"dtype": "<f8", "shape": [-1], "order": "C"}},
    {"u": {"dtype": "|O", "shape": [1], "order": "C"}},
    {"u": 5},
])
def test_load_arrays_refuses_a_description_that_does_not_match_the_buffers(store, arrays):
    info = store.checkpoint({"array/u": b"x" * 8}, stream="forged",
                            meta={"snapstore.arrays": {"version": 1, "arrays": arrays}})
    assert info.meta == {} and "snapstore.arrays" in info.reserved_meta
    with pytest.raises(NotAnObjectCheckpointError, match="does not match its buffers"):
        snapstore.load_arrays(store, info.id)


@pytest.mark.parametrize("key, load", [
    ("snapstore.objects", lambda s, i: s.load(i)),
    ("snapstore.arrays", lambda s, i: snapstore.load_arrays(s, i))])
def test_a_layer_format_version_this_snapstore_does_not_read_says_so(tmp_path, key, load):
    """A checkpoint a newer snapstore wrote was 'not written by store.save() ... use
    store.load()': a message that contradicts itself. It is a FormatError naming the version."""
    with snapstore.open(tmp_path / "s") as s:
        info = s.checkpoint({"pickle": b"x"}, "y", meta={key: {"version": 2}})
        with pytest.raises(snapstore.errors.FormatError, match="format version 2.*upgrade"):
            load(s, info.id)


def test_allow_device_copy_and_load_arrays_into_are_checked(tmp_path):
    """allow_device_copy took anything ("no" meant yes); load_arrays(into=5) said the names
    differ."""
    with snapstore.open(tmp_path / "s") as s:
        for bad in ("no", None, 2):
            with pytest.raises(snapstore.errors.InvalidArgumentTypeError, match="allow_device"):
                s.save({"a": 1}, "o", allow_device_copy=bad)
        snapstore.save_arrays(s, {"z": np.zeros(5)}, "g")
        for into in ([1], "abc", 5):
            with pytest.raises(snapstore.errors.InvalidArgumentTypeError, match="mapping"):
                snapstore.load_arrays(s, "g", into=into)
        assert s.checkpoints("o") == []


def test_load_arrays_into_one_array_twice(tmp_path):
    """restore_into refuses targets that share memory; load_arrays restores them one after
    the other: the last one wins, as writing them one by one does."""
    with snapstore.open(tmp_path / "s") as s:
        x = np.arange(1000, dtype=np.float64)
        snapstore.save_arrays(s, {"a": x, "b": x + 1}, stream="t")
        y = np.zeros(1000)
        snapstore.load_arrays(s, "t", into={"a": y, "b": y})
        assert (y == x + 1).all()
