"""snapstore.tensors' catalogue and snapstore.export: datetime units with a multiplier, the
checkpoint given by any name (not only a CheckpointInfo), torch's sub-byte integers, and the
message of an export that has nothing it can write."""
import warnings

import numpy as np
import pytest

import snapstore
from snapstore.errors import CheckpointNotFound, ExportError, InvalidArgumentTypeError
from snapstore.tensors import catalogue, dtype_itemsize, tensor_catalogue


@pytest.fixture
def store(tmp_path):
    s = snapstore.open(str(tmp_path / "s"))
    yield s
    s.close()


def test_a_datetime_unit_keeps_its_multiplier_in_the_catalogue_and_the_export(store, tmp_path):
    """Regression: M8[5s] was listed (and exported) as M8[s], its values off by 5x."""
    a = np.array(["2020-01-01T00:00:00", "2020-01-01T00:01:00"], dtype="M8[5s]")
    td = np.arange(5000).astype("m8[2ms]")                # out of band; the others in band
    plain = np.array([1, 2, 3], dtype="M8[ns]")
    info = store.save({"a": a, "td": td, "plain": plain}, "s")
    dtypes = {e.name: e.dtype for e in tensor_catalogue(store, info)}
    assert dtypes == {"a": "datetime64[5s]", "td": "timedelta64[2ms]",
                      "plain": "datetime64[ns]"}
    out = str(tmp_path / "dt.npz")
    snapstore.export(store, info.id, out)
    got = np.load(out)
    for name, want in (("a", a), ("td", td), ("plain", plain)):
        assert got[name].dtype == want.dtype and np.array_equal(got[name], want), name


def test_the_catalogue_takes_any_checkpoint_name(store):
    """Regression: anything but a CheckpointInfo raised AttributeError."""
    info = store.save({"w": np.zeros(5000)}, "s")
    for name in (info, info.id, "s", "latest", "s@1"):
        assert [e.name for e in tensor_catalogue(store, name)] == ["w"], name
        assert catalogue(store, name).kind == "objects"
    with pytest.raises(CheckpointNotFound):
        tensor_catalogue(store, "no-such-stream")


@pytest.mark.parametrize("name,match", [
    (None, "no checkpoint given .*store.latest"), (1.5, "got float"), (b"s", "got bytes")])
def test_the_catalogue_refuses_what_names_no_checkpoint(store, name, match):
    store.save({"w": np.zeros(5000)}, "s")
    for function in (tensor_catalogue, catalogue):
        with pytest.raises(InvalidArgumentTypeError, match=match):
            function(store, name)
    with pytest.raises(InvalidArgumentTypeError, match="must be an open snapstore.Store"):
        tensor_catalogue("s", 1)


SUB_BYTE = [f"{sign}int{bits}" for sign in ("u", "") for bits in range(1, 8)]


@pytest.mark.parametrize("fmt", ["safetensors", "pt", "npz"])
def test_sub_byte_integers_are_listed_but_no_format_exports_them(store, tmp_path, fmt):
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {name: torch.zeros(4000, dtype=torch.uint8).view(getattr(torch, name))
                 for name in SUB_BYTE}
    info = store.save({**state, "w": torch.ones(3000)}, "q")
    entries = {e.name: e for e in tensor_catalogue(store, info)}
    assert {n: (e.dtype, e.shape, e.nbytes) for n, e in entries.items() if n != "w"} == \
        {n: (n, (4000,), 4000) for n in SUB_BYTE}
    assert all(dtype_itemsize(n) == 1 for n in SUB_BYTE)
    out = tmp_path / f"q.{fmt}"
    with pytest.raises(ExportError, match="uint1, which no export format holds"):
        snapstore.export(store, info.id, str(out))
    assert not out.exists()


def test_an_export_with_only_skipped_arrays_names_them_and_why(store, tmp_path):
    """Regression: it said the checkpoint "holds no tensors or arrays" (0 plain values)."""
    info = store.save({"s": np.zeros(3000, [("a", "i4"), ("b", "f8")]), "step": 3}, "x")
    out = tmp_path / "r.npz"
    with pytest.raises(ExportError, match=r"skipped: s \(structured tensor \(3000,\): a dtype "
                                          "the catalogue does not know\\)") as exc:
        snapstore.export(store, info.id, str(out))
    assert "holds no tensors or arrays to export" in str(exc.value) and not out.exists()
