"""One API style (issue 15): module-level functions take the store first (the old
snapstore.torch.save(state, store) order still works, with a DeprecationWarning, and ambiguous
calls are refused), loaders name the call that reads a checkpoint of another kind, and the kind
labels mean one thing on every write path: "full" = restorable from its own manifests
(chain_length 0), "incremental" = depends on a parent."""
import inspect
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

import snapstore
from snapstore import arrays, objects
from snapstore.errors import InvalidArgumentTypeError, NotAnObjectCheckpointError

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
import snapstore.torch as st  # noqa: E402


def state(seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(n, n, generator=g), "b": torch.randn(n, generator=g), "step": seed}


def same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert torch.equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k


# ---- argument order ------------------------------------------------------------------------------
def test_every_module_level_function_takes_the_store_first():
    for fn in (objects.save, objects.load, arrays.save_arrays, arrays.load_arrays, st.save,
               st.load, snapstore.save_arrays, snapstore.load_arrays):
        params = list(inspect.signature(fn).parameters)
        assert params[0] == "store", (fn.__qualname__, params)
        assert "store" in (fn.__doc__ or ""), fn.__qualname__
    # stream and meta by keyword everywhere
    for fn in (objects.save, arrays.save_arrays, st.save):
        params = inspect.signature(fn).parameters
        assert params["stream"].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert params["meta"].default is None


def test_torch_save_new_order_and_keywords(store):
    sd = state(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")               # the new order never warns
        a = st.save(store, sd, "train", meta={"step": 1})
        b = st.save(store, sd, stream="train", meta={"step": 2})
        c = st.save(store=store, state=sd, stream="other")
    assert (a.stream, b.stream, c.stream) == ("train", "train", "other")
    assert a.meta == {"step": 1} and b.meta == {"step": 2}
    same(st.load(store, a.id), sd)
    same(st.load(store, "other"), sd)


def test_torch_save_old_order_warns_and_does_the_same(store, store_path):
    sd = state(2)
    with pytest.warns(DeprecationWarning, match=r"save\(store, state"):
        old = st.save(sd, store, "legacy", meta={"m": 1})
    new = st.save(store, sd, "legacy", meta={"m": 1})
    assert old.stream == new.stream == "legacy" and old.meta == new.meta == {"m": 1}
    assert store.restore(old.id) == store.restore(new.id)
    with pytest.warns(DeprecationWarning):
        st.save(sd, store, stream="legacy2")         # stream by keyword, old order
    assert store.latest("legacy2") is not None
    store.close()
    with pytest.warns(DeprecationWarning):           # old order with a store path
        info = st.save(sd, store_path, "by-path")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        info2 = st.save(store_path, sd, "by-path")   # new order with a path: no warning
    assert info2.parent == info.id
    same(st.load(store_path, "by-path"), sd)


def test_torch_save_refuses_to_guess(store, store_path, tmp_path):
    sd = state(3)
    other = snapstore.open(str(tmp_path / "other"), durability="none")
    try:
        cases = [(store, other), (store_path, str(tmp_path / "x")), (sd, sd), (1, sd)]
        for first, second in cases:
            with pytest.raises(InvalidArgumentTypeError, match="cannot tell the store"):
                st.save(first, second, "s")
            assert store.latest("s") is None
    finally:
        other.close()
    with pytest.raises(InvalidArgumentTypeError, match="needs a state"):
        st.save(store)
    with pytest.raises(TypeError):                   # InvalidArgumentTypeError is a TypeError
        st.save(store, store)


@pytest.mark.parametrize("call", [
    lambda s: objects.save({"a": 1}, s),
    lambda s: objects.load("stream", s),
    lambda s: snapstore.save_arrays({"a": np.zeros(3)}, s),
    lambda s: snapstore.load_arrays("stream", s),
    lambda s: st.load("stream", s),
    lambda s: st.load(None, "stream"),
    lambda s: snapstore.save_arrays(None, {"a": np.zeros(3)}),
])
def test_store_in_the_wrong_place_is_a_clear_type_error(store, call):
    with pytest.raises(InvalidArgumentTypeError, match="first argument must be an open "
                                                       "snapstore.Store"):
        call(store)
    assert store.checkpoints() == []


def test_save_arrays_bad_arrays_are_invalid_argument_type_errors(store):
    for bad in ([np.zeros(3)], {1: np.zeros(3)}, {"a": [1, 2]},
                {"o": np.array([object()])}):
        with pytest.raises(InvalidArgumentTypeError):
            snapstore.save_arrays(store, bad)
    assert store.checkpoints() == []


# ---- the hint of a loader given another kind of checkpoint ---------------------------------------
def test_loaders_name_the_call_that_reads_the_checkpoint(store):
    arr = snapstore.save_arrays(store, {"u": np.arange(10)}, stream="arrays")
    obj = store.save({"x": 1}, stream="objects")
    plain = store.checkpoint({"raw": b"abc"}, stream="plain")
    with pytest.raises(NotAnObjectCheckpointError, match=r"load_arrays\(\)") as exc:
        store.load(arr.id)
    assert "restore()" not in str(exc.value)
    with pytest.raises(NotAnObjectCheckpointError, match=r"load_arrays\(\)"):
        st.load(store, arr.id)
    with pytest.raises(NotAnObjectCheckpointError, match=r"store\.load\(\)") as exc:
        snapstore.load_arrays(store, obj.id)
    assert "restore()" not in str(exc.value)
    with pytest.raises(NotAnObjectCheckpointError, match=r"restore\(\)"):
        store.load(plain.id)
    with pytest.raises(NotAnObjectCheckpointError, match=r"restore\(\)"):
        snapstore.load_arrays(store, "plain")
    # and each one reads its own
    assert np.array_equal(snapstore.load_arrays(store, "arrays")["u"], np.arange(10))
    assert store.load("objects") == {"x": 1}


def test_load_of_a_dcp_checkpoint_names_the_dcp_reader(tmp_path):
    path = str(tmp_path / "dcp")
    dcp.save(state(), checkpoint_id="a", storage_writer=st.SnapstoreWriter(path))
    with snapstore.open(path, readonly=True) as s:
        with pytest.raises(NotAnObjectCheckpointError, match="SnapstoreReader"):
            s.load("dcp")
        with pytest.raises(NotAnObjectCheckpointError, match="SnapstoreReader"):
            snapstore.load_arrays(s, "dcp")


# ---- kind labels ---------------------------------------------------------------------------------
def dcp_save(writer, sd, cid):
    dcp.save(sd, checkpoint_id=cid, storage_writer=writer)
    return writer.last_info


def test_fully_changed_dcp_saves_are_full_and_build_no_chain(tmp_path):
    path = str(tmp_path / "dcp")
    writer = st.SnapstoreWriter(path)
    infos = [dcp_save(writer, state(seed, 128), f"step-{seed}") for seed in range(12)]
    assert [(i.kind, i.chain_length) for i in infos] == [("full", 0)] * 12
    # torch.save labels the same states the same way
    with snapstore.open(path, durability="none") as s:
        saved = [st.save(s, state(seed, 128), "torch") for seed in range(4)]
        assert [(i.kind, i.chain_length) for i in saved] == [("full", 0)] * 4
    # a small change is incremental on both paths, and reads back
    sd = state(11, 128)
    sd["w"][0] += 1.0
    small = dcp_save(writer, sd, "small")
    assert small.kind == "incremental" and small.chain_length == 1
    assert small.bytes_new < sum(small.sizes.values()) // 4
    target = state(99, 128)
    dcp.load(target, checkpoint_id="small", storage_reader=st.SnapstoreReader(path))
    same(target, sd)
    with snapstore.open(path, durability="none") as s:
        sd2 = state(3, 128)
        sd2["w"][0] += 1.0
        inc = st.save(s, sd2, "torch")
        assert inc.kind == "incremental" and inc.chain_length == 1
        assert s.verify(deep=True)["ok"]


def test_plain_checkpoint_mostly_changed_is_full_even_with_an_unchanged_buffer(store):
    big = bytearray(64 << 10)
    small = bytearray(b"m" * 700)
    store.checkpoint({"big": big, "small": small}, stream="s")
    big[:] = b"\x01" * len(big)
    info = store.checkpoint({"big": big, "small": small}, stream="s")
    assert (info.kind, info.chain_length) == ("full", 0)
    assert info.bytes_new < len(big) + 4096          # the unchanged buffer deduplicates
    big[:4096] = b"\x02" * 4096
    inc = store.checkpoint({"big": big, "small": small}, stream="s")
    assert (inc.kind, inc.chain_length) == ("incremental", 1)
    assert store.restore(inc.id) == {"big": bytes(big), "small": bytes(small)}
    # nothing changed at all: incremental (it depends on its parent), no new chunk
    again = store.checkpoint({"big": big, "small": small}, stream="s")
    assert (again.kind, again.chain_length) == ("incremental", 2)
    # a checkpoint of empty buffers only stores nothing: full
    store.checkpoint({"e": b""}, stream="empty")
    assert store.checkpoint({"e": b""}, stream="empty").kind == "full"


PAGE = 4096


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(pages=hs.lists(hs.integers(1, 6), min_size=1, max_size=4),
       data=hs.data())
def test_kind_matches_a_reference_of_the_rule(tmp_path_factory, pages, data):
    """Reference: per buffer, more than half its bytes changed -> stored whole (its size),
    else its dirty pages; more than half of the checkpoint's bytes stored -> "full"."""
    path = str(tmp_path_factory.mktemp("kind") / "s")
    bufs = {f"b{i}": bytearray(n * PAGE) for i, n in enumerate(pages)}
    with snapstore.open(path, durability="none") as s:
        s.checkpoint(bufs, stream="k")
        stored = 0
        for name, buf in bufs.items():
            n = len(buf) // PAGE
            dirty = data.draw(hs.sets(hs.integers(0, n - 1)), label=name)
            for p in dirty:
                buf[p * PAGE] = 7
            changed = len(dirty) * PAGE
            stored += len(buf) if changed > 0.5 * len(buf) else changed
        total = sum(len(b) for b in bufs.values())
        info = s.checkpoint(bufs, stream="k")
        expected = "full" if stored > 0.5 * total else "incremental"
        assert info.kind == expected, (stored, total)
        assert (info.chain_length == 0) == (info.kind == "full")
        assert s.restore(info.id) == {k: bytes(v) for k, v in bufs.items()}
