"""load(into=) refusals checked before anything is written: quantized and nested tensors (a
StructureMismatchError suggesting FRESH, not a segfault or a raw RuntimeError), and leaves that
must stay as they are (a NaN in a tuple matches the same NaN)."""
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

from snapstore.objects import FRESH, StructureMismatchError

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _quantized(values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(values, 0.1, 10, torch.quint8)


def _nested(*lengths):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nested.nested_tensor([torch.arange(float(n)) for n in lengths])


def test_a_quantized_target_is_refused_not_a_segfault(store_path):
    """Regression: copy_tensor wrote into the quantized target through view(uint8) and killed
    the process (run in a child process: the failure is a crash)."""
    code = textwrap.dedent(f"""
        import warnings; warnings.simplefilter("ignore")
        import torch, snapstore
        from snapstore.objects import StructureMismatchError
        store = snapstore.open({store_path!r})
        q = torch.quantize_per_tensor(torch.randn(2000), 0.1, 10, torch.quint8)
        info = store.save({{"q": q, "w": torch.arange(2000.0)}}, "s")
        target = torch.quantize_per_tensor(torch.zeros(2000), 0.5, 0, torch.quint8)
        w = torch.zeros(2000)
        try:
            store.load(info.id, into={{"q": target, "w": w}})
        except StructureMismatchError as e:
            print("refused:", e)
        print("unchanged:", bool((target.int_repr() == 0).all()) and not w.any())
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "refused: load(into=...): obj['q']: a quantized tensor" in out.stdout
    assert "FRESH" in out.stdout and "unchanged: True" in out.stdout


@pytest.mark.parametrize("saved,target,match", [
    (lambda: _nested(3000, 5), lambda: _nested(3000, 5), "a nested tensor in the checkpoint, "
                                                         "nested in the target"),
    (lambda: _nested(3000, 5), lambda: torch.zeros(3), "a nested tensor in the checkpoint, "
                                                       "dense in the target"),
    (lambda: torch.zeros(3000), lambda: _nested(3000), "a dense tensor in the checkpoint, "
                                                       "nested in the target"),
    (lambda: _quantized(torch.randn(2000)), lambda: torch.zeros(2000), "a quantized tensor"),
    (lambda: torch.zeros(2000), lambda: _quantized(torch.zeros(2000)), "quantized in the target"),
], ids=["nested into nested", "nested into dense", "dense into nested", "quantized into dense",
        "dense into quantized"])
def test_nested_and_quantized_tensors_are_a_mismatch_suggesting_fresh(store, saved, target,
                                                                       match):
    """Regression: a nested tensor made the planner read .shape, a raw RuntimeError."""
    info = store.save({"n": saved(), "w": torch.arange(5000.0)}, stream="n")
    w = torch.zeros(5000)
    with pytest.raises(StructureMismatchError, match=match) as exc:
        store.load(info.id, into={"n": target(), "w": w})
    assert "FRESH" in str(exc.value) and exc.value.path == "obj['n']"
    assert not w.any()                                         # nothing was written
    into = {"n": FRESH, "w": w}
    store.load(info.id, into=into)
    assert torch.equal(w, torch.arange(5000.0))


def test_a_nested_tensor_loads_with_fresh(store):
    nt = _nested(3000, 5)
    info = store.save({"n": nt}, stream="f")
    into = {"n": FRESH}
    store.load(info.id, into=into)
    assert all(torch.equal(a, b) for a, b in zip(into["n"].unbind(), nt.unbind()))


@pytest.mark.parametrize("nan", [float("nan"), np.float32("nan"), np.float64("nan"),
                                 complex(float("nan"), 1.0)], ids=repr)
def test_the_saved_object_itself_loads_into_itself_with_a_nan_in_a_tuple(store, nan):
    """Regression: a NaN inside a tuple (a leaf that must stay as it is) never equalled
    itself, so load(into=obj) refused the very object that was saved."""
    state = {"w": np.arange(5000.0), "bounds": (nan, 1.0)}
    info = store.save(state, stream="nan")
    state["w"][:] = 0
    assert store.load(info.id, into=state) is state
    assert np.array_equal(state["w"], np.arange(5000.0))


def test_a_different_value_in_a_tuple_is_still_refused(store):
    quiet, other = float("nan"), np.frombuffer(bytes.fromhex("010000000000f87f"), "<f8")[0]
    info = store.save({"bounds": (quiet, 1.0), "w": np.arange(5000.0)}, stream="nan2")
    for bounds in ((float(other), 1.0), (0.0, 1.0)):         # another NaN payload, a number
        target = {"bounds": bounds, "w": np.zeros(5000)}
        with pytest.raises(StructureMismatchError, match="cannot be changed in place"):
            store.load(info.id, into=target)
        assert not target["w"].any()


class _SlotsAndDict:
    """State in a slot and in __dict__."""
    __slots__ = ("slot", "__dict__")

    def __init__(self, slot, attr):
        self.slot, self.attr = slot, attr

    def __reduce__(self):
        return _SlotsAndDict, (self.slot, self.attr)


def test_an_object_with_slots_besides_its_dict_is_refused_not_half_loaded(store):
    """Regression (a helper's report): load(into=) wrote the __dict__ of such an object and
    never its slots, which kept their old values, no error."""
    from snapstore.errors import StructureMismatchError
    from snapstore.objects import FRESH
    info = store.save({"o": _SlotsAndDict(1, 2)}, "s")
    target = {"o": _SlotsAndDict(10, 20)}
    with pytest.raises(StructureMismatchError, match="__slots__"):
        store.load(info.id, into=target)
    assert (target["o"].slot, target["o"].attr) == (10, 20)      # nothing written
    loaded = store.load(info.id, into={"o": FRESH})
    assert (loaded["o"].slot, loaded["o"].attr) == (1, 2)
