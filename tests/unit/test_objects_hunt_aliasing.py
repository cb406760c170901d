"""load(into=): a value the target keeps as loaded (FRESH, a leaf set in its container, the
elements of an object array) never shares memory with another target.

Regression: a buffer used by one array/tensor leaf and also by a value the planner did not
walk (inside a deque, a set, a __slots__ object, an object array, a tensor's attribute) was
restored straight into the leaf's target, so that value became a view of the target's memory
without owning it (a use-after-free once the target was freed)."""
import collections
import gc

import numpy as np
import pytest

from snapstore.objects import FRESH

torch = pytest.importorskip("torch")

N = 50_000                     # elements: far above the in-band limit (out-of-band buffers)


class Slots:
    """Holds a value in a slot (no __dict__: a leaf for the planner)."""
    __slots__ = ("value",)

    def __init__(self, value=None):
        self.value = value

    def __reduce__(self):
        return Slots, (self.value,)


class Holder:
    """A hashable holder, so a set can hold an array or tensor."""

    def __init__(self, value=None):
        self.value = value

    def __hash__(self):
        return 1

    def __eq__(self, other):
        return self is other


def _only(values):
    (value,) = values
    return value.value


# (name, wrap(v) -> saved value holding v, the target's value there, get(loaded) -> v)
CARRIERS = [
    ("deque as FRESH", lambda v: collections.deque([v]), lambda: FRESH, lambda d: d[0]),
    ("deque set in place", lambda v: collections.deque([v]), collections.deque,
     lambda d: d[0]),
    ("dict in a deque", lambda v: collections.deque([{"k": [v]}]), lambda: FRESH,
     lambda d: d[0]["k"][0]),
    ("slots object", Slots, Slots, lambda s: s.value),
    ("set", lambda v: {Holder(v)}, set, _only),
    ("frozenset as FRESH", lambda v: frozenset([Holder(v)]), lambda: FRESH, _only),
    ("object array loaded into", lambda v: np.array([v, None], dtype=object),
     lambda: np.empty(2, dtype=object), lambda a: a[0]),
    ("object array as FRESH", lambda v: np.array([v, None], dtype=object), lambda: FRESH,
     lambda a: a[0]),
]

LIBRARIES = {
    "numpy": (lambda: np.arange(N, dtype=np.float64), lambda x: x.ctypes.data,
              lambda x: x.tobytes()),
    "torch": (lambda: torch.arange(N, dtype=torch.float64), lambda x: x.data_ptr(),
              lambda x: x.numpy().tobytes()),
}


def _inside(address: int, target) -> bool:
    """True when address lies in the target's elements."""
    start = target.data_ptr() if isinstance(target, torch.Tensor) else target.ctypes.data
    return start <= address < start + N * target.itemsize


@pytest.mark.parametrize("library", sorted(LIBRARIES))
@pytest.mark.parametrize("name,wrap,target_value,get", CARRIERS, ids=[c[0] for c in CARRIERS])
def test_a_value_kept_as_loaded_owns_its_memory(store, library, name, wrap, target_value,
                                                get):
    make, address, raw = LIBRARIES[library]
    saved = make()
    info = store.save({"w": saved, "d": wrap(saved)}, stream="s")
    target = make() * 0
    into = {"w": target, "d": target_value()}
    store.load(info.id, into=into)
    value = get(into["d"])
    assert raw(target) == raw(saved) and raw(value) == raw(saved)
    assert not _inside(address(value), target), f"{name}: a view of the target's memory"
    target[:] = 7                                  # the target changes: the value does not
    assert raw(value) == raw(saved)


def test_a_tensor_attribute_and_a_view_kept_as_loaded_own_their_memory(store):
    t = torch.arange(N, dtype=torch.float32)
    holder = torch.zeros(3)
    holder.ref = t                                 # an attribute of a tensor
    info = store.save({"w": t, "h": holder, "d": collections.deque([t[10:20]])}, stream="v")
    target = torch.zeros(N)
    into = {"w": target, "h": FRESH, "d": FRESH}
    store.load(info.id, into=into)
    ref, view = into["h"].ref, into["d"][0]
    assert not _inside(ref.data_ptr(), target) and not _inside(view.data_ptr(), target)
    del into["w"], target
    gc.collect()
    junk = [torch.full((N,), 123.0) for _ in range(8)]      # reuse the freed memory
    assert torch.equal(ref, t) and torch.equal(view, t[10:20])
    del junk


def test_buffers_only_their_target_uses_still_go_straight_into_it(store):
    """The check above must not turn off in-place restores: a buffer that nothing kept as
    loaded uses is still restored straight into its target's memory."""
    t, a = torch.arange(N, dtype=torch.float32), np.arange(N, dtype=np.float64)
    info = store.save({"t": t, "a": a, "other": collections.deque([np.ones(N)]), "n": 3},
                      stream="direct")
    tt, ta = torch.zeros(N), np.zeros(N)
    restored_at = []
    restore_into = store.restore_into

    def spy(name, targets):
        for buf in targets.values():
            view = memoryview(buf)
            restored_at.append(np.frombuffer(view, np.uint8).ctypes.data if view.nbytes else 0)
        return restore_into(name, targets)

    store.restore_into = spy
    into = {"t": tt, "a": ta, "other": FRESH, "n": 0}
    store.load(info.id, into=into)
    assert tt.data_ptr() in restored_at and ta.ctypes.data in restored_at
    assert torch.equal(tt, t) and np.array_equal(ta, a)
    assert np.array_equal(into["other"][0], np.ones(N)) and into["n"] == 3


def test_tied_targets_get_the_last_value_never_a_mix(store, monkeypatch):
    """Two target tensors of one storage (tied weights) and two different tensors in the
    checkpoint: no in-place loading can hold both. They are copied in order (the last one
    wins, as load_state_dict does), never restored straight into the shared memory at once,
    where two buffers' chunks could interleave. Tied in the checkpoint too: exact."""
    from snapstore import objects
    a, b = torch.full((N,), 1.0), torch.full((N,), 2.0)
    info = store.save({"a": a, "b": b}, "s")
    shared = torch.zeros(N)
    into = {"a": shared, "b": shared.detach()}
    direct = []
    real = objects._direct_restores
    monkeypatch.setattr(objects, "_direct_restores",
                        lambda plan, sizes: direct.append(real(plan, sizes)) or direct[-1])
    store.load(info.id, into=into)
    assert len(direct[0][0]) == 1                 # one of the two goes straight in
    assert torch.equal(shared, b)
    tied = torch.full((N,), 3.0)
    info = store.save({"a": tied, "b": tied}, "t")
    store.load(info.id, into=into)
    assert torch.equal(shared, tied)
