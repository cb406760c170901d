"""Issue 14, defect 10: every bad argument to snapstore.open and to the Store's methods gets a
clear snapstore.errors exception (InvalidArgumentError / InvalidArgumentTypeError, or
CheckpointNotFound, ReadOnlyError... all SnapstoreErrors), raised before any side effect:
open() creates nothing on disk, a method changes nothing in the store."""
from __future__ import annotations

import collections.abc
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapstore
from snapstore.errors import SnapstoreError


def examples(n: int) -> int:
    return max(1, n * settings.default.max_examples // 100)


class Opaque:
    """An object of no type snapstore knows."""


JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
    st.sampled_from([0, 1, -1, 511, 512, 4096, 1 << 16, 1 << 20, 1 << 64, 2 ** 64 - 1, 2 ** 64]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6), st.binary(max_size=6),
    st.lists(st.integers(-5, 1 << 20), max_size=4), st.tuples(st.integers(), st.integers()),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.builds(Opaque), st.builds(bytearray, st.integers(0, 64)),
)

OPEN_OPTIONS = ("durability", "create", "readonly", "timeout", "page_size", "chunk_size",
                "chunking", "cdc_sizes", "max_chain", "full_threshold", "compression",
                "compression_level", "segment_size", "staging_bytes", "backend")


@settings(max_examples=examples(300))
@given(option=st.sampled_from(OPEN_OPTIONS + ("path",)), value=JUNK)
def test_defect10_open_rejects_bad_arguments_before_touching_the_disk(tmp_path_factory, option,
                                                                      value):
    root = tmp_path_factory.mktemp("open")
    path = os.path.join(str(root), "store")
    if option == "path":
        if isinstance(value, (str, bytes)):     # a real (relative) path: not junk
            return
        kwargs, target = {}, value
    else:
        kwargs, target = {option: value}, path
    try:
        s = snapstore.open(target, durability="none", **kwargs) if option != "durability" \
            else snapstore.open(target, **kwargs)
    except SnapstoreError:
        assert os.listdir(root) == [], f"{option}={value!r} created files before failing"
        return
    except BaseException as exc:            # the defect: anything that is not a SnapstoreError
        pytest.fail(f"{option}={value!r} raised {type(exc).__name__}: {exc}")
    s.close()                                # an accidentally valid value: fine


class _State:
    def __init__(self, store) -> None:
        self.store = store

    def snapshot(self):
        s = self.store
        return ([(c.id, c.tags, c.stream) for c in s.checkpoints()],
                s.stats()["segment_bytes"])


def _calls(store, x):
    """(name, mutating, thunk) for every public Store method with x in one argument."""
    ba = bytearray(8192)
    return [
        ("get", False, lambda: store.get(x)),
        ("restore", False, lambda: store.restore(x)),
        ("read id", False, lambda: store.read(x, "a")),
        ("read name", False, lambda: store.read(1, x)),
        ("read offset", False, lambda: store.read(1, "a", x)),
        ("read length", False, lambda: store.read(1, "a", 0, x)),
        ("restore_into id", False, lambda: store.restore_into(x, {"a": ba})),
        ("restore_into buffers", False, lambda: store.restore_into(1, x)),
        ("restore_into buffer", False, lambda: store.restore_into(1, {"a": x})),
        ("checkpoints", False, lambda: store.checkpoints(x)),
        ("latest", False, lambda: store.latest(x)),
        ("verify", False, lambda: store.verify(x)),
        ("checkpoint buffers", True, lambda: store.checkpoint(x, "junk")),
        ("checkpoint buffer", True, lambda: store.checkpoint({"b": x}, "junk")),
        ("checkpoint name", True, lambda: store.checkpoint({x: b"x"}, "junk")),
        ("checkpoint stream", True, lambda: store.checkpoint({"b": b"x"}, x)),
        ("checkpoint meta", True, lambda: store.checkpoint({"b": b"x"}, "junk", x)),
        ("checkpoint chunking", True,
         lambda: store.checkpoint({"b": b"x"}, "junk", chunking=x)),
        ("checkpoint_async buffers", True, lambda: store.checkpoint_async(x, "junk2").result()),
        ("checkpoint_async stream", True,
         lambda: store.checkpoint_async({"b": bytearray(10)}, x).result()),
        ("track buffers", True, lambda: store.track(x, "junk3").close()),
        ("track mode", True, lambda: store.track({"b": bytearray(10)}, "junk3", x).close()),
        ("delete", True, lambda: store.delete(x)),
        ("delete_many", True, lambda: store.delete_many(x)),
        ("tag id", True, lambda: store.tag(x, "t")),
        ("tag tag", True, lambda: store.tag(1, x)),
        ("untag", True, lambda: store.untag(x, "t")),
        ("retain stream", True, lambda: store.retain(x, keep_last=1)),
        ("retain keep_last", True, lambda: store.retain("none", keep_last=x)),
        ("retain keep_every", True, lambda: store.retain("none", keep_every=x)),
        ("retain keep_tagged", True, lambda: store.retain("none", 1, None, x)),
        ("compact threshold", True, lambda: store.compact(x)),
        ("compact max_chain", True, lambda: store.compact(0.5, x)),
    ]


@pytest.fixture(scope="module")
def method_store(tmp_path_factory):
    s = snapstore.open(tmp_path_factory.mktemp("methods") / "s", durability="none")
    s.checkpoint({"a": bytes(range(256)) * 32}, "main")       # id 1, 8 KiB
    s.checkpoint({"a": bytes(8192)}, "main")                   # id 2
    yield s
    s.close()


@settings(max_examples=examples(400))
@given(which=st.integers(0, 32), value=JUNK)
def test_defect10_store_methods_raise_only_snapstore_errors(method_store, which, value):
    name, mutating, call = _calls(method_store, value)[which]
    if name == "checkpoint name" and not isinstance(value, collections.abc.Hashable):
        return                                   # no such dict to pass
    if mutating and name.startswith(("delete", "tag id", "untag")) and value in (1, 2):
        return                                   # a valid id of the fixture: not junk
    state = _State(method_store)
    before = state.snapshot()
    try:
        call()
    except SnapstoreError:
        assert state.snapshot() == before, f"{name}({value!r}) failed after changing the store"
    except BaseException as exc:
        pytest.fail(f"{name}({value!r}) raised {type(exc).__name__}: {exc}")
    assert method_store.restore(1)["a"] == bytes(range(256)) * 32
