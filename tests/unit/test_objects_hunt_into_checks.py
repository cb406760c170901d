"""load(into=) refusals checked before anything is written: quantized and nested tensors (a
StructureMismatchError suggesting FRESH, not a segfault or a raw RuntimeError), and leaves that
must stay as they are (a NaN in a tuple matches the same NaN)."""
import enum
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


class _PlainSlotsAndDict:
    """State in a slot and in __dict__, pickled by object's own reduce."""
    __slots__ = ("slot", "__dict__")

    def __init__(self, slot, attr):
        self.slot, self.attr = slot, attr


def test_an_object_with_slots_besides_its_dict_is_refused_not_half_loaded(store):
    """Regression (a helper's report): load(into=) wrote the __dict__ of such an object and
    never its slots, which kept their old values, no error. One with a __reduce__ of its own
    is not written in place at all: it is set in its container as loaded (a later helper's
    report: objects pickle rebuilds otherwise than from their __dict__ kept stale state)."""
    from snapstore.errors import StructureMismatchError
    from snapstore.objects import FRESH
    info = store.save({"o": _PlainSlotsAndDict(1, 2)}, "s")
    target = {"o": _PlainSlotsAndDict(10, 20)}
    with pytest.raises(StructureMismatchError, match="__slots__"):
        store.load(info.id, into=target)
    assert (target["o"].slot, target["o"].attr) == (10, 20)      # nothing written
    loaded = store.load(info.id, into={"o": FRESH})
    assert (loaded["o"].slot, loaded["o"].attr) == (1, 2)
    info = store.save({"o": _SlotsAndDict(1, 2)}, "s")
    target = {"o": _SlotsAndDict(10, 20)}
    old = target["o"]
    assert store.load(info.id, into=target) is target
    assert (target["o"].slot, target["o"].attr) == (1, 2) and target["o"] is not old


# ---- a later helper's review: objects pickle rebuilds otherwise than from their __dict__ -------
class _Color(enum.Enum):
    RED = 1
    BLUE = 2


class _MyInt(int):
    pass


class _MyError(Exception):
    pass


class _SparseRow:
    """State derived from the data by __setstate__ (the plan's skeleton has zeros there)."""

    def __init__(self, w):
        self.w = w
        self.nonzero = [int(i) for i in np.flatnonzero(w)]

    def __getstate__(self):
        return {"w": self.w}

    def __setstate__(self, state):
        self.__init__(state["w"])


class _Distribution:
    """A reduce function that refuses the skeleton's zeros."""

    def __init__(self, p):
        if not np.isclose(p.sum(), 1.0):
            raise ValueError("probabilities must sum to 1")
        self.p = p

    def __reduce__(self):
        return _Distribution, (self.p,)


def test_objects_pickle_rebuilds_otherwise_are_set_as_loaded_never_written_in_place(store):
    """Regression: load(into=) wrote the checkpoint's Enum member's _value_ and _name_ into
    the target's member (the Enum class changed for the whole process); left old values in
    subclasses of built-in types, exceptions, functools.partial and a defaultdict's factory;
    planned objects whose __setstate__ derives state from the data on zeros (stale derived
    state); raised a reduce function's error on the zeros. Such objects are set in their
    container as loaded now (an error at the root or inside a tuple), and a plan that the
    zeros break is made on the data."""
    import collections
    import functools
    from snapstore.errors import StructureMismatchError
    w = np.zeros(10000)
    w[[3, 77, 9000]] = 1.5
    saved = {"c": _Color.RED, "i": _MyInt(5), "e": _MyError("saved"),
             "p": functools.partial(max, 1), "row": _SparseRow(w), "a": np.arange(10000.)}
    info = store.save(saved, "s")
    keep = np.zeros(10000)
    target = {"c": _Color.BLUE, "i": _MyInt(7), "e": _MyError("old"),
              "p": functools.partial(max, 100), "row": _SparseRow(np.zeros(10000)), "a": keep}
    store.load(info.id, into=target)
    assert target["c"] is _Color.RED
    assert (_Color.BLUE.value, _Color.BLUE.name, _Color(2)) == (2, "BLUE", _Color.BLUE)
    assert target["i"] == 5 and type(target["i"]) is _MyInt
    assert target["e"].args == ("saved",) and target["p"](0) == 1
    assert target["row"].nonzero == [3, 77, 9000]
    assert target["a"] is keep and np.array_equal(keep, np.arange(10000.))   # in place
    dist = store.save({"d": _Distribution(np.full(1000, 1 / 1000)), "a": np.arange(5.)}, "d")
    target = {"d": _Distribution(np.full(1000, 1 / 1000)), "a": np.zeros(5)}
    store.load(dist.id, into=target)
    assert np.array_equal(target["a"], np.arange(5.)) and target["d"].p[0] == 1 / 1000
    for root, other in ((_Color.RED, _Color.BLUE), (_MyError("x"), _MyError("x"))):
        info = store.save(root, "root")
        with pytest.raises(StructureMismatchError, match="cannot be loaded in place"):
            store.load(info.id, into=other)
    assert store.load(store.save(_Color.RED, "root").id, into=_Color.RED) is _Color.RED
    info = store.save({"d": collections.defaultdict(list, a=[1])}, "dd")
    with pytest.raises(StructureMismatchError, match="default_factory"):
        store.load(info.id, into={"d": collections.defaultdict(int, a=[2])})


def test_equal_values_spelt_otherwise_are_not_kept_for_the_checkpoints(store):
    """Regression: inside a tuple or at the root (where nothing can be set), a target value
    equal to the checkpoint's but not the same (0.0 and -0.0, Decimal("1.0") and
    Decimal("1.000"), one instant in two time zones) was kept, silently differing from what
    was saved. It is a StructureMismatchError now; the same value still passes."""
    import datetime
    import decimal
    from snapstore.errors import StructureMismatchError
    utc = datetime.timezone.utc
    plus5 = datetime.timezone(datetime.timedelta(hours=5))
    pairs = [(0.0, -0.0), (decimal.Decimal("1.0"), decimal.Decimal("1.000")),
             (datetime.datetime(2024, 1, 1, 0, tzinfo=utc),
              datetime.datetime(2024, 1, 1, 5, tzinfo=plus5))]
    for saved, other in pairs:
        info = store.save((saved, np.arange(10.)), "t")
        with pytest.raises(StructureMismatchError, match="cannot be changed in place"):
            store.load(info.id, into=(other, np.zeros(10)))
        target = (saved, np.zeros(10))
        assert store.load(info.id, into=target) is target
        assert np.array_equal(target[1], np.arange(10.))
    info = store.save((float("nan"), np.arange(3.)), "nan")
    store.load(info.id, into=(float("nan"), np.zeros(3)))      # the same bits: kept


def test_save_async_with_its_arguments_swapped_is_a_clear_error(store):
    """Regression: snapstore.objects.save_async(obj, store) raised a raw TypeError (weak
    reference to a dict) before checking that the store comes first."""
    from snapstore import objects
    from snapstore.errors import InvalidArgumentTypeError
    for obj in ({"step": 1}, [1], "s"):
        with pytest.raises(InvalidArgumentTypeError, match="Store"):
            objects.save_async(obj, store)
