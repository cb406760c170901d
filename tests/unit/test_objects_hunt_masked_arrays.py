"""save_arrays / load_arrays and masked arrays: refused, as load(into=) refuses them, instead of
dropping the mask on save or writing into a masked target and keeping its stale mask."""
import numpy as np
import pytest

import snapstore
from snapstore.errors import InvalidArgumentTypeError, StructureMismatchError


def test_save_arrays_refuses_a_masked_array_and_writes_nothing(store):
    m = np.ma.array([1.0, 2.0, 3.0], mask=[False, True, False])
    with pytest.raises(InvalidArgumentTypeError, match=r"arrays\['m'\] is a masked array"):
        snapstore.save_arrays(store, {"a": np.ones(3), "m": m}, "arr")
    assert store.latest("arr") is None
    store.save({"m": m}, "obj")                      # store.save keeps the mask
    loaded = store.load("obj")["m"]
    assert list(loaded.mask) == [False, True, False] and loaded.sum() == 4.0


def test_load_arrays_refuses_a_masked_target_and_writes_nothing(store):
    info = snapstore.save_arrays(store, {"a": np.arange(3.0), "m": np.array([1.0, 2.0, 3.0])},
                                 "arr")
    a = np.zeros(3)
    target = np.ma.array([0.0, 0.0, 0.0], mask=[True, False, True])
    with pytest.raises(StructureMismatchError, match="'m' is a masked array") as exc:
        snapstore.load_arrays(store, info.id, into={"a": a, "m": target})
    assert exc.value.path == "m"
    assert not a.any() and not target.data.any()
    assert list(target.mask) == [True, False, True]
