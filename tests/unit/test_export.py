"""snapstore.export: torch, object, array and DCP checkpoints out as safetensors / pt / npz files
that safetensors, torch.load(weights_only=True) and numpy.load read back byte-exact; refusals
(bfloat16 in npz, no tensors, existing file, symlink) write nothing."""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

import snapstore
from snapstore.errors import CheckpointNotFound, ExportError

safetensors_numpy = pytest.importorskip("safetensors.numpy")


@pytest.fixture
def store(tmp_path):
    s = snapstore.open(str(tmp_path / "s"))
    yield s
    s.close()


def arrays_state():
    rng = np.random.default_rng(1)
    return {"w": rng.random((33, 7)).astype(np.float32),
            "f": np.asfortranarray(rng.integers(-9, 9, (5, 6)).astype(np.int64)),
            "small": np.arange(4, dtype=np.uint16), "empty": np.zeros((0, 2)),
            "scalar": np.array(2.5), "flag": np.array([True, False, True])}


def assert_same(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    for k, a in want.items():
        g = np.asarray(got[k])
        assert g.dtype == a.dtype and g.shape == a.shape, k
        assert g.tobytes() == np.ascontiguousarray(a).tobytes(), k


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_arrays_checkpoint_round_trip(store, tmp_path, fmt):
    state = arrays_state()
    info = snapstore.save_arrays(store, state, "a", meta={"step": 3})
    out = str(tmp_path / f"x.{fmt}")
    r = snapstore.export(store, info.id, out)
    assert r.format == fmt and r.tensors == len(state) and r.checkpoint == info.id
    got = safetensors_numpy.load_file(out) if fmt == "safetensors" else dict(np.load(out))
    assert_same(got, state)
    assert oct(os.stat(out).st_mode & 0o777) == "0o600"


@pytest.mark.parametrize("fmt", ["safetensors", "npz"])
def test_a_file_name_at_the_limit_is_exported(store, tmp_path, fmt):
    """255 bytes is a valid name: its temporary file must be one too."""
    state = arrays_state()
    info = snapstore.save_arrays(store, state, "a")
    out = tmp_path / ("n" * (254 - len(fmt)) + "." + fmt)
    snapstore.export(store, info.id, str(out))
    got = safetensors_numpy.load_file(out) if fmt == "safetensors" else dict(np.load(out))
    assert_same(got, state)


def test_object_checkpoint_nested_names_and_values(store, tmp_path):
    state = {"model": {"layer": {"w": np.ones((100, 10), np.float32)}},
             "opt": [{"m": np.full(3, 7, np.int32)}], "step": 12, "name": "run",
             "fn": len}
    info = store.save(state, "o", meta={"user": 1})
    out = str(tmp_path / "o.safetensors")
    r = snapstore.export(store, "o", out)
    got = safetensors_numpy.load_file(out)
    assert_same(got, {"model.layer.w": state["model"]["layer"]["w"],
                      "opt.0.m": state["opt"][0]["m"]})
    from safetensors import safe_open
    with safe_open(out, "np") as f:
        meta = f.metadata()
    assert json.loads(meta["snapstore.values"]) == {"step": 12, "name": "run"}
    assert meta["snapstore.checkpoint"] == str(info.id)
    assert json.loads(meta["snapstore.meta"]) == {"user": 1}
    assert "fn" in r.skipped and r.values == {"step": 12, "name": "run"}
    r2 = snapstore.export(store, "o", str(tmp_path / "o.npz"))
    assert "step" in r2.skipped and r2.values == {}


def test_big_endian_arrays(store, tmp_path):
    state = {"be": np.arange(6, dtype=">f4").reshape(2, 3)}
    info = snapstore.save_arrays(store, state, "be")
    snapstore.export(store, info.id, str(tmp_path / "b.npz"))
    got = np.load(str(tmp_path / "b.npz"))["be"]
    assert got.dtype == np.dtype(">f4") and got.tobytes() == state["be"].tobytes()
    snapstore.export(store, info.id, str(tmp_path / "b.safetensors"))
    got = safetensors_numpy.load_file(str(tmp_path / "b.safetensors"))["be"]
    assert np.array_equal(got, state["be"]) and got.dtype == np.float32


def test_refusals_write_nothing(store, tmp_path):
    plain = store.checkpoint({"a": b"123"}, stream="p")
    out = str(tmp_path / "x.safetensors")
    with pytest.raises(ExportError, match="holds no tensors"):
        snapstore.export(store, plain.id, out)
    for state in ({"step": 3, "lr": 0.1}, {}):     # objects, but not one tensor or array
        values = store.save(state, stream="v")
        for path in (out, str(tmp_path / "x.pt"), str(tmp_path / "x.npz")):
            with pytest.raises(ExportError, match="holds no tensors"):
                snapstore.export(store, values.id, path)
    info = snapstore.save_arrays(store, {"a": np.ones(3)}, "a")
    with pytest.raises(ExportError, match="no export format given.*x.bin"):
        snapstore.export(store, info.id, str(tmp_path / "x.bin"))
    with pytest.raises(ExportError, match="unknown export format"):
        snapstore.export(store, info.id, out, format="hdf5")
    with pytest.raises(CheckpointNotFound):
        snapstore.export(store, 999, out)
    assert os.listdir(tmp_path) == ["s"]
    # an existing file is kept unless force; with force it is replaced atomically
    with open(out, "wb") as f:
        f.write(b"keep")
    with pytest.raises(ExportError, match="exists"):
        snapstore.export(store, info.id, out)
    assert open(out, "rb").read() == b"keep"
    snapstore.export(store, info.id, out, force=True)
    assert np.array_equal(safetensors_numpy.load_file(out)["a"], np.ones(3))
    assert sorted(os.listdir(tmp_path)) == ["s", "x.safetensors"]


@pytest.mark.parametrize("fmt", ["safetensors", "npz", "snap"])
@pytest.mark.parametrize("force", [False, True])
def test_a_file_created_at_the_path_during_the_export(store, tmp_path, monkeypatch, fmt, force):
    """Regression: without force the check that the path is free came before the (long)
    export, and the rename at its end replaced a file created there meanwhile: lost data.
    Now that file is kept and ExportError says so; with force it is replaced."""
    info = snapstore.save_arrays(store, {"a": np.ones(3)}, "a")
    out = tmp_path / f"x.{fmt}"
    # the export reads the checkpoint after its check of the path: the file appears then
    reads = ("with_manifests" if fmt == "snap" else "restore_into")
    real = getattr(store, reads)

    def appearing(*args, **kwargs):
        if not out.exists():
            out.write_bytes(b"someone else's")
        return real(*args, **kwargs)
    monkeypatch.setattr(store, reads, appearing)
    if force:
        snapstore.export(store, info.id, str(out), force=True)
        assert out.read_bytes() != b"someone else's"
    else:
        with pytest.raises(ExportError, match="exists"):
            snapstore.export(store, info.id, str(out))
        assert out.read_bytes() == b"someone else's"
    assert sorted(os.listdir(tmp_path)) == ["s", out.name]      # no temporary file left


def test_bad_paths_and_arguments_are_clear_errors(store, tmp_path):
    """Regression: a NUL in the path was a raw ValueError, a non-path a raw TypeError, a bytes
    path a misleading 'no suffix' message; a file inside the store's directory was written
    (with force: over the store's own files)."""
    from snapstore.errors import InvalidArgumentError, InvalidArgumentTypeError
    info = snapstore.save_arrays(store, {"a": np.ones(3)}, "a")
    for bad in (str(tmp_path / "x\0.npz"), "", str(tmp_path / "\ud800.npz")):
        with pytest.raises(InvalidArgumentError, match="NUL|non-empty|encoding"):
            snapstore.export(store, info.id, bad)
    for bad in (None, 3, ["x.npz"]):
        with pytest.raises(InvalidArgumentTypeError, match="path must be"):
            snapstore.export(store, info.id, bad)
    with pytest.raises(InvalidArgumentTypeError, match="force"):
        snapstore.export(store, info.id, str(tmp_path / "y.npz"), force="yes")
    with pytest.raises(InvalidArgumentTypeError, match="store must be an open Store"):
        snapstore.export("not a store", info.id, str(tmp_path / "y.npz"))
    r = snapstore.export(store, info.id, os.fsencode(tmp_path / "b.npz"))     # bytes: fine
    assert r.path == str(tmp_path / "b.npz") and np.load(r.path)["a"].tolist() == [1, 1, 1]
    for fmt in ("npz", "snap"):
        with pytest.raises(ExportError, match="inside the store's own directory"):
            snapstore.export(store, info.id, os.path.join(store.path, "FORMAT"), format=fmt,
                             force=True)
    assert store.verify()["ok"]
    assert sorted(os.listdir(tmp_path)) == ["b.npz", "s"]


def test_the_store_under_a_bind_mount_is_still_the_store(store, tmp_path):
    """Regression: with the store's directory bind-mounted elsewhere, exporting to
    MOUNT/FORMAT with force replaced the store's FORMAT (paths differ; the directory is the
    same): compared by directory identity now."""
    import subprocess
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root (CI runs as root)")
    info = snapstore.save_arrays(store, {"a": np.ones(3)}, "a")
    mount = tmp_path / "bm"
    mount.mkdir()
    subprocess.run(["mount", "--bind", store.path, str(mount)], check=True)
    try:
        with pytest.raises(ExportError, match="inside the store's own directory"):
            snapstore.export(store, info.id, str(mount / "FORMAT"), format="npz", force=True)
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert store.verify()["ok"]


def test_symlink_is_replaced_never_followed(store, tmp_path):
    info = snapstore.save_arrays(store, {"a": np.ones(3)}, "a")
    target = tmp_path / "victim"
    target.write_bytes(b"precious")
    link = tmp_path / "out.npz"
    link.symlink_to(target)
    with pytest.raises(ExportError, match="exists"):
        snapstore.export(store, info.id, str(link))
    snapstore.export(store, info.id, str(link), force=True)
    assert target.read_bytes() == b"precious" and not link.is_symlink()
    assert np.array_equal(np.load(str(link))["a"], np.ones(3))


def test_after_close_is_an_error(tmp_path):
    s = snapstore.open(str(tmp_path / "s"))
    info = snapstore.save_arrays(s, {"a": np.ones(3)}, "a")
    s.close()
    with pytest.raises(snapstore.SnapstoreError):
        snapstore.export(s, info.id, str(tmp_path / "a.npz"))
    assert not os.path.exists(tmp_path / "a.npz")


@given(st.lists(st.tuples(st.sampled_from(["float32", "int8", "uint64", "float16", "bool",
                                           "complex64"]),
                          st.lists(st.integers(0, 4), max_size=3), st.booleans()),
                min_size=1, max_size=5),
       st.sampled_from(["safetensors", "npz"]))
def test_random_arrays_round_trip(tmp_path_factory, specs, fmt):
    d = tmp_path_factory.mktemp("h")
    s = snapstore.open(str(d / "s"))
    try:
        rng = np.random.default_rng(0)
        state = {}
        for i, (dtype, shape, fortran) in enumerate(specs):
            a = np.asarray((rng.random(shape) * 50).astype(dtype))
            state[f"t{i}"] = np.asfortranarray(a) if fortran else a
        info = s.save({"s": state}, "h")
        out = str(d / f"o.{fmt}")
        snapstore.export(s, info.id, out)
        got = safetensors_numpy.load_file(out) if fmt == "safetensors" else dict(np.load(out))
        assert_same(got, {f"s.{k}": v for k, v in state.items()})
    finally:
        s.close()


# ---- torch ----------------------------------------------------------------------------------
def torch_state():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(40, 20), torch.nn.Linear(20, 3)).to(torch.bfloat16)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m(torch.randn(2, 40, dtype=torch.bfloat16)).sum().backward()
    opt.step()
    base = torch.arange(30, dtype=torch.float32).reshape(5, 6)
    return m, opt, {"t": base.t(), "base": base, "f8": torch.ones(2000).to(torch.float8_e5m2)}


def save_torch(store, state, stream):
    import inspect
    import snapstore.torch as sst
    first = next(iter(inspect.signature(sst.save).parameters))
    return sst.save(store, state, stream) if first == "store" else sst.save(state, store, stream)


def expected_flat(m, opt, extra) -> dict:
    out = {f"model.{k}": v for k, v in m.state_dict().items()}
    for pid, st_ in opt.state_dict()["state"].items():
        for k, v in st_.items():
            if hasattr(v, "dtype"):
                out[f"optim.state.{pid}.{k}"] = v
    out.update({f"extra.{k}": v for k, v in extra.items()})
    return out


def test_torch_checkpoint_round_trip_safetensors_and_pt(store, tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import load_file
    m, opt, extra = torch_state()
    info = save_torch(store, {"model": m, "optim": opt, "extra": extra, "step": 4}, "train")
    want = expected_flat(m, opt, extra)
    for fmt, load in (("safetensors", load_file),
                      ("pt", lambda p: torch.load(p, weights_only=True))):
        out = str(tmp_path / f"m.{fmt}")
        r = snapstore.export(store, "train", out)
        got = load(out)
        assert set(got) == set(want), fmt
        for k, v in want.items():
            assert got[k].dtype == v.dtype and tuple(got[k].shape) == tuple(v.shape), (fmt, k)
            assert got[k].contiguous().view(torch.uint8).numpy().tobytes() == \
                v.contiguous().view(torch.uint8).numpy().tobytes(), (fmt, k)
        assert r.tensors == len(want)
    with pytest.raises(ExportError, match="bfloat16.*NumPy"):
        snapstore.export(store, "train", str(tmp_path / "m.npz"))
    assert not os.path.exists(tmp_path / "m.npz")


_EXPORT_WITH_A_FILE_SIZE_LIMIT = r"""
import resource, signal, sys
import numpy as np
import snapstore
from snapstore.errors import StoreIOError
store_path, out, fmt = sys.argv[1:]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)          # writes past the limit fail: EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
with snapstore.open(store_path, readonly=True) as s:
    try:
        snapstore.export(s, "a", out, format=fmt)
    except StoreIOError as exc:
        print("StoreIOError", exc)
"""


@pytest.mark.parametrize("fmt", ["pt", "safetensors", "npz", "snap"])
def test_a_write_error_is_a_store_io_error_and_leaves_nothing(tmp_path, fmt):
    """Regression: a .pt export onto a full disk raised torch's RuntimeError("enforce fail
    ..."). A real write error (the file size limit: EFBIG from the kernel) is StoreIOError
    naming the path, in every format, and no file is left."""
    if fmt == "pt":
        pytest.importorskip("torch")
    import subprocess
    import sys
    with snapstore.open(str(tmp_path / "s")) as s:
        snapstore.save_arrays(s, {"a": np.arange(1 << 16, dtype=np.float32)}, "a")
    out = tmp_path / "out" / f"x.{fmt}"
    out.parent.mkdir()
    proc = subprocess.run([sys.executable, "-c", _EXPORT_WITH_A_FILE_SIZE_LIMIT,
                           str(tmp_path / "s"), str(out), fmt],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("StoreIOError") and str(out) in proc.stdout, proc.stdout
    assert os.listdir(out.parent) == []


def test_dcp_checkpoint_exports(store, tmp_path):
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import snapstore.torch as sst
    from safetensors.torch import load_file
    m, _, _ = torch_state()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": m.state_dict()}, checkpoint_id="step-5",
                 storage_writer=sst.SnapstoreWriter(store))
    out = str(tmp_path / "d.safetensors")
    snapstore.export(store, store.latest("dcp").id, out)
    got = load_file(out)
    for k, v in m.state_dict().items():
        assert torch.equal(got[f"model.{k}"], v)


@pytest.mark.parametrize("how", ["save", "save_arrays"])
def test_big_endian_datetimes_and_strings_keep_their_byte_order(store, tmp_path, how):
    from snapstore.tensors import tensor_catalogue
    arrays = {"dt": np.arange(3).astype(">M8[s]"), "td": np.arange(2).astype(">m8[ms]"),
              "u": np.array(["ab", "cd"], dtype=">U2")}
    info = store.save(arrays, how) if how == "save" else snapstore.save_arrays(store, arrays, how)
    names = {e.name: e.dtype for e in tensor_catalogue(store, info)}
    assert names == {"dt": ">M8[s]", "td": ">m8[ms]", "u": ">U2"}
    path = tmp_path / f"{how}.npz"
    snapstore.export(store, info.id, str(path))
    with np.load(path) as z:
        for name, a in arrays.items():
            assert z[name].dtype == a.dtype and np.array_equal(z[name], a)
