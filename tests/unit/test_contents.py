"""What is inside a checkpoint: snapstore.tensors' catalogue (names, dtypes, shapes and the exact
bytes of every tensor of torch, object, array and DCP checkpoints, without running code from
the store) and the contents section of `snapstore show`."""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

import snapstore
from snapstore import tensors
from snapstore.errors import CorruptionError
from cli_runner import cli_json, cli_ok

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def entry_bytes(store, info, e) -> bytes:
    """The C-order bytes of one catalogue entry, computed here from its buffer range."""
    cid = info.id if e.checkpoint is None else e.checkpoint
    raw = store.read(cid, e.buffer, e.offset, e.nbytes) if e.nbytes else b""
    if e.strides is None:
        return bytes(raw)
    item = e.itemsize
    view = np.frombuffer(raw, dtype=f"V{item}")
    arr = np.lib.stride_tricks.as_strided(view, e.shape, [s * item for s in e.strides])
    return np.ascontiguousarray(arr).tobytes()


def torch_bytes(t) -> bytes:
    import torch
    t = t.detach().contiguous()
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


@pytest.fixture
def store(tmp_path):
    s = snapstore.open(str(tmp_path / "s"))
    yield s
    s.close()


def test_module_imports_without_torch_or_langgraph():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['langgraph'] = None; "
            "import snapstore.tensors, snapstore.exporter; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_plain_checkpoint_has_no_tensors(store):
    info = store.checkpoint({"a": b"x" * 100}, stream="p")
    assert tensors.tensor_catalogue(store, info) == []
    assert tensors.checkpoint_kind(info) == "other"


def test_object_checkpoint_arrays_names_and_bytes(store):
    obj = {"big": np.arange(10000, dtype=np.float32).reshape(100, 100),
           "fortran": np.asfortranarray(np.arange(6000, dtype=np.int16).reshape(60, 100)),
           "small": np.arange(5, dtype=np.uint8),
           "dt": np.arange(1000).astype("M8[ns]"),
           "nested": [{"w": np.ones((0, 3))}, 7], "s": "hi", "scalar": np.float16(1.5)}
    info = store.save(obj, "o")
    cat = tensors.catalogue(store, info)
    by = {e.name: e for e in cat.tensors}
    assert list(by) == ["big", "fortran", "small", "dt", "nested.0.w", "scalar"]
    assert by["scalar"].shape == () and by["scalar"].dtype == "float16"
    assert by["big"].dtype == "float32" and by["big"].shape == (100, 100)
    assert by["big"].buffer.startswith("oob/") and by["big"].strides is None
    assert by["fortran"].strides == (1, 60)
    assert by["small"].buffer == "pickle" and by["small"].nbytes == 5
    assert by["dt"].dtype == "datetime64[ns]"
    assert by["nested.0.w"].nbytes == 0
    for name, e in by.items():
        want = obj["nested"][0]["w"] if name == "nested.0.w" else obj[name]
        assert entry_bytes(store, info, e) == np.ascontiguousarray(want).tobytes(), name
    assert cat.values == {"nested.1": 7, "s": "hi"}


def test_arrays_checkpoint(store):
    arrays = {"u": np.asfortranarray(np.random.rand(7, 5)), "v": np.zeros(3, ">f4"),
              "b": np.array([True, False]), "z": np.array(3.5)}
    info = snapstore.save_arrays(store, arrays, "a")
    cat = tensors.catalogue(store, info)
    assert cat.kind == "arrays"
    by = {e.name: e for e in cat.tensors}
    assert by["u"].buffer == "array/u" and by["v"].dtype == ">f4" and by["b"].dtype == "bool"
    assert by["z"].shape == ()
    for name, a in arrays.items():
        assert entry_bytes(store, info, by[name]) == np.ascontiguousarray(a).tobytes()


class Evil:
    def __reduce__(self):
        return (os.system, ("touch /tmp/snapstore-pwned-contents",))


def test_catalogue_never_runs_code_from_the_store(store):
    if os.path.exists("/tmp/snapstore-pwned-contents"):
        os.unlink("/tmp/snapstore-pwned-contents")
    info = store.save({"x": Evil(), "w": np.ones(2000)}, "evil")
    cat = tensors.catalogue(store, info)
    assert not os.path.exists("/tmp/snapstore-pwned-contents")
    assert [e.name for e in cat.tensors] == ["w"]
    assert "os.system" in cat.skipped["x"] or "posix.system" in cat.skipped["x"]


def test_damaged_pickle_stream_is_corruption(store):
    info = store.checkpoint({"pickle": b"\x80\x05garbage", "oob/0": b""}, stream="x",
                            meta={"snapstore.objects": {"version": 1, "buffers": 1}})
    with pytest.raises(CorruptionError):
        tensors.tensor_catalogue(store, info)


def test_forged_tensor_out_of_its_buffer_is_corruption(store):
    info = store.save({"w": np.ones(1000)}, "f")
    data = store.read(info.id, "pickle")
    bad = store.checkpoint({"pickle": data, "oob/0": b"\0" * 16}, stream="f2",
                           meta={"snapstore.objects": {"version": 1, "buffers": 1}})
    with pytest.raises(CorruptionError, match="does not fit"):
        tensors.tensor_catalogue(store, bad)


dtypes = st.sampled_from(["float32", "float64", "int8", "uint16", "int64", "bool",
                          "complex64", "float16"])


@given(st.lists(st.tuples(dtypes, st.lists(st.integers(0, 5), max_size=3),
                          st.booleans()), max_size=6))
def test_catalogue_matches_a_reference_on_random_states(tmp_path_factory, specs):
    """Reference: the saved dict itself; every array is listed with its bytes."""
    s = snapstore.open(str(tmp_path_factory.mktemp("h") / "s"))
    try:
        rng = np.random.default_rng(0)
        state = {}
        for i, (dtype, shape, fortran) in enumerate(specs):
            a = np.asarray((rng.random(shape) * 100).astype(dtype))
            state[f"k{i}"] = np.asfortranarray(a) if fortran else a
        info = s.save({"state": state}, "h")
        by = {e.name: e for e in tensors.tensor_catalogue(s, info)}
        assert set(by) == {f"state.{k}" for k in state}
        for k, a in state.items():
            e = by[f"state.{k}"]
            assert e.dtype == str(a.dtype) and e.shape == a.shape
            assert entry_bytes(s, info, e) == np.ascontiguousarray(a).tobytes()
    finally:
        s.close()


# ---- torch ----------------------------------------------------------------------------------
def _model_state():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(m.parameters())
    m(torch.randn(3, 64)).sum().backward()
    opt.step()
    return m, opt


def test_torch_save_names_like_dcp(store):
    torch = pytest.importorskip("torch")
    import snapstore.torch as sst
    m, opt = _model_state()
    shared = torch.arange(24, dtype=torch.bfloat16).reshape(4, 6)
    state = {"model": m, "optim": opt, "step": 9,
             "extra": {"t": shared.t(), "full": shared, "f8": torch.ones(3000).to(
                 torch.float8_e4m3fn)}}
    info = sst.save(store, state, "train") if _store_first(sst) else sst.save(state, store, "train")
    cat = tensors.catalogue(store, info)
    by = {e.name: e for e in cat.tensors}
    for k, v in m.state_dict().items():
        assert by[f"model.{k}"].dtype == "float32"
        assert by[f"model.{k}"].shape == tuple(v.shape)
        assert entry_bytes(store, info, by[f"model.{k}"]) == torch_bytes(v)
    osd = opt.state_dict()
    assert entry_bytes(store, info, by["optim.state.0.exp_avg"]) == \
        torch_bytes(osd["state"][0]["exp_avg"])
    assert by["extra.t"].strides == (1, 6) and by["extra.t"].dtype == "bfloat16"
    assert entry_bytes(store, info, by["extra.t"]) == torch_bytes(shared.t())
    assert entry_bytes(store, info, by["extra.full"]) == torch_bytes(shared)
    assert by["extra.f8"].dtype == "float8_e4m3fn"
    assert cat.values["step"] == 9 and cat.values["optim.param_groups.0.lr"] == 0.001


def _store_first(sst) -> bool:
    """snapstore.torch.save's argument order (store first once the API engineer lands it)."""
    import inspect
    return next(iter(inspect.signature(sst.save).parameters)) == "store"


def test_dcp_checkpoint(store):
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import snapstore.torch as sst
    m, _ = _model_state()
    sd = {"model": m.state_dict(), "blob": {"a": 1}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, checkpoint_id="step-1", storage_writer=sst.SnapstoreWriter(store))
    info = store.latest("dcp")
    cat = tensors.catalogue(store, info)
    assert cat.kind == "dcp"
    by = {e.name: e for e in cat.tensors}
    assert set(by) == {f"model.{k}" for k in m.state_dict()}
    for k, v in m.state_dict().items():
        e = by[f"model.{k}"]
        assert e.buffer == f"item/model.{k}" and e.shape == tuple(v.shape)
        assert entry_bytes(store, info, e) == torch_bytes(v)
    assert sst.DCP_META_KEY == tensors.DCP_META_KEY
    assert sst.METADATA_BUFFER == tensors.DCP_METADATA_BUFFER
    assert sst.DCP_PART_KEY == tensors.DCP_PART_KEY


def test_dcp_metadata_is_read_without_unpickling_torch_objects(store, monkeypatch):
    """The restricted unpickler never imports: pickle.loads is not called."""
    pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import snapstore.torch as sst
    m, _ = _model_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": m.state_dict()}, storage_writer=sst.SnapstoreWriter(store))
    info = store.latest("dcp")

    def boom(*a, **k):
        raise AssertionError("pickle.loads called")
    monkeypatch.setattr(pickle, "loads", boom)
    assert len(tensors.tensor_catalogue(store, info)) == len(m.state_dict())


# ---- snapstore show (the real console script) ------------------------------------------------
def test_show_lists_tensors_truncated_and_json_full(tmp_path):
    path = str(tmp_path / "s")
    state = {f"layer{i}": {"w": np.full((4, 3), i, np.float32)} for i in range(100)}
    with snapstore.open(path) as s:
        s.save({"model": state, "step": 42}, "train")
        s.checkpoint({"raw": b"x"}, stream="plain")
    out = cli_ok("-s", path, "show", "1").stdout
    assert "contents (objects): 100 tensor(s)" in out
    assert "model.layer0.w" in out and "float32" in out and "(4, 3)" in out
    assert "model.layer99.w" not in out and "70 more tensors (--json lists all)" in out
    assert "step=42" in out
    doc = cli_json("-s", path, "show", "1")
    names = [t["name"] for t in doc["contents"]["tensors"]]
    assert names == [f"model.layer{i}.w" for i in range(100)]
    assert doc["contents"]["values"] == {"step": 42}
    plain = cli_ok("-s", path, "show", "2").stdout
    assert "contents" not in plain
    assert cli_json("-s", path, "show", "2")["contents"] is None


def test_show_torch_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    path = str(tmp_path / "s")
    m = torch.nn.Linear(300, 20).to(torch.bfloat16)
    with snapstore.open(path) as s:
        s.save({"model": m.state_dict()}, "t")
    out = cli_ok("-s", path, "show", "latest").stdout
    assert "model.weight" in out and "bfloat16" in out and "(20, 300)" in out
    assert "oob/0" in out


def _lg_store(path):
    pytest.importorskip("langgraph.graph")
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph
    from snapstore.langgraph import SnapstoreSaver

    def bot(state):
        return {"messages": [AIMessage(content="echo " + state["messages"][-1].content)]}
    b = StateGraph(MessagesState)
    b.add_node("bot", bot)
    b.add_edge(START, "bot")
    with SnapstoreSaver.from_path(path) as saver:
        g = b.compile(checkpointer=saver)
        for i in range(3):
            g.invoke({"messages": [("user", f"question {i}")]},
                     {"configurable": {"thread_id": "t1"}})
    with snapstore.open(path, readonly=True) as s:     # the newest checkpoint (not a write)
        return str(max(c.id for c in s.checkpoints() if c.stream.startswith("lg/")))


def test_show_langgraph_decodes_channels_and_messages(tmp_path):
    path = str(tmp_path / "lg")
    newest = _lg_store(path)
    out = cli_ok("-s", path, "show", newest).stdout
    assert "contents (LangGraph): thread 't1'" in out
    assert "human: question 2" in out and "ai: echo question 2" in out
    assert "messages" in out and "6 message(s)" in out
    doc = cli_json("-s", path, "show", newest)["contents"]
    assert doc["decoded"] and doc["thread_id"] == "t1"
    assert [m["role"] for m in doc["messages"]] == ["human", "ai"] * 3
    assert any(c["name"] == "messages" for c in doc["channels"])


def test_show_langgraph_without_langgraph_installed(tmp_path):
    path = str(tmp_path / "lg")
    newest = _lg_store(path)
    shadow = tmp_path / "shadow" / "langgraph"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no langgraph here')\n")
    env = {"PYTHONPATH": str(tmp_path / "shadow") + os.pathsep + ROOT}
    out = cli_ok("-s", path, "show", newest, env=env).stdout
    assert "not decoded: install snapstore[langgraph]" in out
    doc = cli_json("-s", path, "show", newest, env=env)["contents"]
    assert doc == {"kind": "langgraph", "decoded": False,
                   "note": "install snapstore[langgraph] to decode channels and messages"}
