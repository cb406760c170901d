"""SnapstoreSaver through its sync methods, with real LangGraph graphs, and its storage
properties: unchanged channels cost no bytes, raw NumPy/bytes buffers, shared stores, bad input.
"""
import asyncio
import operator
import os
import threading
import time
import uuid
from typing import Annotated, TypedDict

import numpy as np
import pytest

pytest.importorskip("langgraph.checkpoint.base", reason="langgraph-checkpoint is not installed")

from langgraph.checkpoint.base import CheckpointTuple  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT  # noqa: E402

import snapstore  # noqa: E402
from snapstore.errors import (CommitConflict, InvalidArgumentError,  # noqa: E402
                              InvalidArgumentTypeError, ObjectSaveError, ReadOnlyError,
                              StoreClosedError, StoreLocked)
from snapstore.langgraph import SnapstoreSaver  # noqa: E402


@pytest.fixture
def saver(store):
    return SnapstoreSaver(store)


def cfg(thread="t", ns="", checkpoint_id=None):
    c = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
    if checkpoint_id is not None:
        c["configurable"]["checkpoint_id"] = checkpoint_id
    return c


class Thread:
    """Drives a saver the way LangGraph's loop does: versions from get_next_version, every
    channel value in channel_values, new_versions for the changed ones, parent links."""

    def __init__(self, saver, thread="t", ns=""):
        self.saver, self.config = saver, cfg(thread, ns)
        self.versions = {}
        self.step = 0

    def put(self, values, changed=None, **metadata):
        changed = list(values) if changed is None else changed
        new = {ch: self.saver.get_next_version(self.versions.get(ch), None) for ch in changed}
        self.versions.update(new)
        cp = {"v": 4, "id": str(uuid.uuid7()) if hasattr(uuid, "uuid7") else _uuid6(),
              "ts": "2024-01-01T00:00:00+00:00", "channel_values": dict(values),
              "channel_versions": dict(self.versions), "versions_seen": {"n": dict(self.versions)},
              "updated_channels": sorted(new)}
        md = {"source": "loop", "step": self.step, "parents": {}, **metadata}
        self.step += 1
        self.config = self.saver.put(self.config, cp, md, new)
        return self.config


def _uuid6():
    from langgraph.checkpoint.base.id import uuid6
    return str(uuid6())


def stream_bytes(store):
    return store.stats()["segment_bytes"]


# ---- the conformance suite's behaviour, through the sync methods --------------------------
class SyncDriven:
    """Presents the saver's SYNC methods under the async names the conformance specs call."""

    def __init__(self, saver):
        self.s = saver

    async def aput(self, *a):
        return self.s.put(*a)

    async def aput_writes(self, *a, **k):
        return self.s.put_writes(*a, **k)

    async def aget_tuple(self, c):
        return self.s.get_tuple(c)

    async def alist(self, c, **k):
        for item in self.s.list(c, **k):
            yield item

    async def adelete_thread(self, t):
        return self.s.delete_thread(t)

    async def adelete_for_runs(self, r):
        return self.s.delete_for_runs(r)

    async def acopy_thread(self, a, b):
        return self.s.copy_thread(a, b)

    async def aprune(self, t, **k):
        return self.s.prune(t, **k)


def test_conformance_specs_through_sync_methods(saver):
    import importlib
    v = importlib.import_module("langgraph.checkpoint.conformance.validate")
    runners = [getattr(v, n) for n in dir(v) if n.startswith("run_") and n.endswith("_tests")]
    assert len(runners) == 8
    total = 0
    for runner in runners:
        passed, failed, failures = asyncio.run(runner(SyncDriven(saver)))
        assert failed == 0, failures
        total += passed
    assert total == 81


# ---- sync API, explicitly -------------------------------------------------------------------
def test_put_get_list_and_parents(saver):
    th = Thread(saver)
    c1 = th.put({"a": "x", "b": [1, 2]})
    c2 = th.put({"a": "y", "b": [1, 2]}, changed=["a"], custom=7)
    latest = saver.get_tuple(cfg())
    assert isinstance(latest, CheckpointTuple)
    assert latest.config == c2
    assert latest.checkpoint["channel_values"] == {"a": "y", "b": [1, 2]}
    assert latest.parent_config["configurable"]["checkpoint_id"] == \
        c1["configurable"]["checkpoint_id"]
    assert latest.metadata["custom"] == 7
    first = saver.get_tuple(c1)
    assert first.checkpoint["channel_values"] == {"a": "x", "b": [1, 2]}
    assert first.parent_config is None
    ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg())]
    assert ids == [c2["configurable"]["checkpoint_id"], c1["configurable"]["checkpoint_id"]]
    assert [t.metadata["step"] for t in saver.list(cfg(), filter={"custom": 7})] == [1]
    assert len(list(saver.list(cfg(), before=c2))) == 1
    # LangGraph's subgraph replay passes a `before` holding only the checkpoint id
    only_id = {"configurable": {"checkpoint_id": c2["configurable"]["checkpoint_id"]}}
    assert [t.config for t in saver.list(cfg(), before=only_id)] == [c1]
    with pytest.raises(InvalidArgumentTypeError):
        list(saver.list(cfg(), before={"configurable": {"checkpoint_id": 5}}))
    assert len(list(saver.list(cfg(), limit=1))) == 1
    assert len(list(saver.list(None))) == 2
    assert saver.get_tuple(cfg(checkpoint_id="nope")) is None
    assert saver.get_tuple(cfg("other")) is None


def test_pending_writes_order_idempotence_and_special_channels(saver):
    c = Thread(saver).put({"a": 1})
    saver.put_writes(c, [("x", 1), ("y", "big" * 100)], "task-b", "p1")
    saver.put_writes(c, [("x", 99)], "task-b", "p1")          # (task-b, 0) again: ignored
    saver.put_writes(c, [("z", 3)], "task-a", "p0")
    saver.put_writes(c, [(ERROR, "boom")], "task-a", "p0")
    saver.put_writes(c, [(ERROR, "boom again")], "task-a", "p0")  # special: latest wins
    saver.put_writes(c, [(INTERRUPT, {"q": 1})], "task-c", "p0")
    writes = saver.get_tuple(c).pending_writes
    # writes_sort_key order: (task_path, task_id, idx)
    assert writes == [("task-a", ERROR, "boom again"), ("task-a", "z", 3),
                      ("task-c", INTERRUPT, {"q": 1}), ("task-b", "x", 1),
                      ("task-b", "y", "big" * 100)]
    before = len(saver.store.checkpoints())
    saver.put_writes(c, [("x", 5)], "task-b")                 # fully duplicate: nothing stored
    assert len(saver.store.checkpoints()) == before


def test_delete_copy_prune_sync(saver):
    run = str(uuid.uuid4())
    a = Thread(saver, "src")
    a.put({"v": 1}, run_id="r1")
    c2 = a.put({"v": 2}, run_id=run)
    Thread(saver, "src", "child:1").put({"w": 1}, run_id=run)
    saver.put_writes(c2, [("ch", "val")], "task")
    saver.copy_thread("src", "dst")
    assert [t.checkpoint["channel_values"] for t in saver.list(cfg("dst", None))] == \
        [t.checkpoint["channel_values"] for t in saver.list(cfg("src", None))]
    assert saver.get_tuple(cfg("dst")).pending_writes == [("task", "ch", "val")]
    Thread(saver, "dst", "child:2").put({"u": 1})
    saver.delete_for_runs([run])                  # in every thread: the copies carry run_id
    for thread in ("src", "dst"):
        assert [t.metadata["run_id"] for t in saver.list(cfg(thread, None))
                if "run_id" in t.metadata] == ["r1"]
        assert saver.get_tuple(cfg(thread, "child:1")) is None
    assert saver.get_tuple(c2) is None
    Thread(saver, "dst").put({"v": 3})
    saver.prune(["dst"])
    kept = list(saver.list(cfg("dst", None)))
    assert len(kept) == 2                         # latest of "" and of "child:2"
    assert saver.get_tuple(cfg("dst")).checkpoint["channel_values"] == {"v": 3}
    saver.delete_thread("dst")
    assert list(saver.list(cfg("dst", None))) == []
    saver.prune(["src"], strategy="delete")
    assert list(saver.list(None)) == []
    assert saver.store.verify()["ok"]


def test_returned_metadata_is_the_callers_own(saver):
    """Regression: get_tuple and list handed out the saver's cached metadata object, so a
    caller changing what it got (LangGraph's loop edits checkpoint metadata in place) changed
    what every later read returned, and what list's filter matched."""
    t = Thread(saver)
    first = t.put({"a": 1}, info={"tag": "x"})
    got = saver.get_tuple(first)
    got.metadata["step"] = 12345
    got.metadata["info"]["tag"] = "changed"
    listed = next(iter(saver.list(cfg())))
    listed.metadata["source"] = "tampered"
    again = saver.get_tuple(first)
    assert again.metadata["step"] == 0 and again.metadata["source"] == "loop"
    assert again.metadata["info"] == {"tag": "x"}
    assert [c.metadata["step"] for c in saver.list(cfg(), filter={"step": 0})] == [0]
    assert list(saver.list(cfg(), filter={"step": 12345})) == []
    assert saver.get_tuple(first).metadata is not again.metadata


def test_reput_same_checkpoint_id_replaces(saver):
    th = Thread(saver)
    c = th.put({"a": 1})
    tup = saver.get_tuple(c)
    cp = dict(tup.checkpoint, channel_values={"a": 2})
    saver.put(cfg(), cp, {"step": 9}, {"a": tup.checkpoint["channel_versions"]["a"]})
    assert [t.checkpoint["channel_values"] for t in saver.list(cfg())] == [{"a": 2}]
    assert saver.get_tuple(c).metadata["step"] == 9


def test_get_next_version_increases_and_differs():
    s = SnapstoreSaver.__new__(SnapstoreSaver)
    v1 = s.get_next_version(None, None)
    v2 = s.get_next_version(v1, None)
    assert v1 < v2 and v2.startswith("0" * 31 + "2.")
    assert len({s.get_next_version(v1, None) for _ in range(100)}) == 100   # fork-safe
    assert s.get_next_version(5, None).startswith("0" * 31 + "6.")


# ---- storage: deduplication, raw buffers ------------------------------------------------------
def test_unchanged_channels_are_not_stored_again(saver):
    store = saver.store
    big = [os.urandom(256).hex() for i in range(2000)]          # ~1 MiB serialized
    th = Thread(saver)
    th.put({"history": big, "counter": 0})
    after_first = stream_bytes(store)
    for i in range(1, 11):
        th.put({"history": big, "counter": i}, changed=["counter"])
    per_step = (stream_bytes(store) - after_first) / 10
    assert after_first > 100_000
    assert per_step < 3_000, per_step                           # meta + manifests, no value
    # and the unchanged value still reads back from every checkpoint
    for t in saver.list(cfg()):
        assert t.checkpoint["channel_values"]["history"] == big


def test_numpy_change_stores_only_changed_pages(saver):
    store = saver.store
    arr = np.random.default_rng(1).random(1 << 17)              # 1 MiB
    th = Thread(saver)
    th.put({"arr": arr})
    first = stream_bytes(store)
    arr[1000:1100] = 0.5                                        # 800 bytes, 1-2 pages
    th.put({"arr": arr})
    assert stream_bytes(store) - first < 16 << 10
    got = saver.get_tuple(cfg()).checkpoint["channel_values"]["arr"]
    assert np.array_equal(got, arr) and got.flags.writeable and got.flags.owndata is not None
    arr[0] = -1
    assert got[0] != -1                                         # stored a copy, not a view


def test_growing_list_stores_about_the_appended_part(saver):
    store = saver.store
    msgs = []
    th = Thread(saver)
    growth = []
    for i in range(30):
        msgs = msgs + [{"role": "user", "content": os.urandom(1024).hex()}]   # 2 KiB each
        before = stream_bytes(store)
        th.put({"messages": msgs})
        growth.append(stream_bytes(store) - before)
    assert max(growth[20:]) < 12 << 10, growth                  # not the whole 40-60 KiB list


@pytest.mark.parametrize("value", [
    np.arange(24, dtype=np.int16).reshape(2, 3, 4),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    np.array(3.5),
    np.zeros((0, 3)),
    np.array([True, False]),
    np.array([1 + 2j]),
    np.array(["2024-01-01", "2025-06-30"], dtype="datetime64[D]"),
    np.array(["ab", "cde"]),
    np.arange(10)[::2],
    b"x" * 5000, bytearray(b"y" * 5000), b"", b"tiny",
    {"nested": [1, 2, {"k": np.arange(3)}]},
    None, "", 0,
], ids=lambda v: type(v).__name__ + str(getattr(v, "dtype", "")))
def test_values_round_trip(saver, value):
    c = Thread(saver).put({"v": value})
    got = saver.get_tuple(c).checkpoint["channel_values"]["v"]
    assert type(got) is type(value)
    if isinstance(value, np.ndarray):
        assert got.dtype == value.dtype and got.shape == value.shape
        assert np.array_equal(got, value)
        assert got.flags.f_contiguous == value.flags.f_contiguous or not value.flags.f_contiguous
    elif isinstance(value, dict):
        assert np.array_equal(got["nested"][2]["k"], value["nested"][2]["k"])
    else:
        assert got == value


def test_numpy_goes_raw_into_a_buffer(saver):
    arr = np.arange(1 << 16, dtype=np.float64)
    c = Thread(saver).put({"arr": arr})
    info = saver.store.latest(saver.store.streams()[0])
    entry = info.meta["ch"]["arr"]
    assert entry["k"] == "n" and info.sizes[entry["b"]] == arr.nbytes
    assert saver.get_tuple(c) is not None


def test_encrypting_serde_sees_every_value(store):
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    class Xor:
        def encrypt(self, plaintext):
            return "xor", bytes(b ^ 0x5A for b in plaintext)

        def decrypt(self, ciphername, ciphertext):
            assert ciphername == "xor"
            return bytes(b ^ 0x5A for b in ciphertext)

    saver = SnapstoreSaver(store, serde=EncryptedSerializer(Xor()))
    secret = b"secret-bytes-" * 1000
    c = Thread(saver).put({"b": secret, "arr": np.arange(5000)})
    values = saver.get_tuple(c).checkpoint["channel_values"]
    assert values["b"] == secret and np.array_equal(values["arr"], np.arange(5000))
    info = store.latest(store.streams()[0])
    assert {e["k"] for e in info.meta["ch"].values()} == {"s"}   # through the serde
    raw = b"".join(store.restore(info.id).values())
    assert b"secret-bytes-" not in raw


def test_a_serializer_subclass_sees_every_value(store):
    """Regression (a helper's review): the raw path for bytes and arrays was taken for any
    JsonPlusSerializer subclass, whose dumps_typed (an encrypting or compressing one) then
    never saw them: the plaintext went to disk. Only LangGraph's own class is bypassed now."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    class XorSerde(JsonPlusSerializer):
        def dumps_typed(self, obj):
            typ, data = super().dumps_typed(obj)
            return "xor+" + typ, bytes(b ^ 0x5A for b in data)

        def loads_typed(self, data):
            typ, raw = data
            assert typ.startswith("xor+"), typ
            return super().loads_typed((typ[4:], bytes(b ^ 0x5A for b in raw)))
    saver = SnapstoreSaver(store, serde=XorSerde())
    secret = b"TOP-SECRET-" * 200
    c = Thread(saver).put({"b": secret, "arr": np.arange(5000)})
    values = saver.get_tuple(c).checkpoint["channel_values"]
    assert values["b"] == secret and np.array_equal(values["arr"], np.arange(5000))
    info = store.latest(store.streams()[0])
    assert {e["k"] for e in info.meta["ch"].values()} == {"s"}   # through the serde
    assert b"TOP-SECRET-" not in b"".join(store.restore(info.id).values())


def test_versions_and_run_ids_that_would_match_or_break_everything_are_refused(store, saver):
    """Regressions (a helper's review): a put with a list as a channel version was stored,
    and then every read of its thread (and list(None), prune, delete_for_runs) raised a raw
    TypeError, also after a reopen; delete_for_runs([None]) deleted every checkpoint stored
    without a run_id, in every thread; a checkpoint_ns of 0 gave list() a raw AttributeError;
    bad arguments of delete_for_runs, prune and get_next_version raw TypeError/ValueError."""
    good = Thread(saver).put({"a": 1})
    other = Thread(saver, "u").put({"a": 2})
    n = len(store.checkpoints())
    cp = saver.get_tuple(good).checkpoint
    for bad in ([1], {"x": 1}, None, True, b"2"):
        with pytest.raises(InvalidArgumentTypeError, match="version of channel 'a'"):
            saver.put(good, dict(cp, id=_uuid6(), channel_versions={"a": bad}), {}, {"a": "2"})
        with pytest.raises(InvalidArgumentTypeError, match="version of channel 'a'"):
            saver.put(good, dict(cp, id=_uuid6()), {}, {"a": bad})
    assert len(store.checkpoints()) == n
    for bad in ([None], [["r"]], [1.5], [b"r"], [True]):
        with pytest.raises(InvalidArgumentTypeError, match="run ids"):
            saver.delete_for_runs(bad)
    for bad in (None, 5, {"r": 1}):
        with pytest.raises(InvalidArgumentTypeError, match="run_ids must be a sequence"):
            saver.delete_for_runs(bad)
        with pytest.raises(InvalidArgumentTypeError, match="thread_ids must be a sequence"):
            saver.prune(bad)
    saver.delete_for_runs([])
    saver.delete_for_runs(["no-such-run", uuid.uuid4()])
    assert len(store.checkpoints()) == n
    assert saver.get_tuple(good) is not None and saver.get_tuple(other) is not None
    for ns in (0, False, 1):
        with pytest.raises(InvalidArgumentTypeError, match="checkpoint_ns must be a str"):
            list(saver.list(cfg(ns=ns)))
        with pytest.raises(InvalidArgumentTypeError, match="checkpoint_ns must be a str"):
            saver.get_tuple(cfg(ns=ns))
    with pytest.raises(InvalidArgumentTypeError, match="checkpoint_id must be a str"):
        saver.get_tuple(cfg(checkpoint_id=0))
    assert saver.get_tuple(cfg(ns=None)) == saver.get_tuple(cfg())
    for bad in ("abc", "x.1", [1]):
        with pytest.raises(InvalidArgumentError, match="not a version"):
            saver.get_next_version(bad, None)
    assert saver.get_next_version(None, None).startswith("0" * 31 + "1.")
    assert saver.get_next_version(saver.get_next_version(3, None), None).startswith(
        "0" * 31 + "5.")


def test_delete_for_runs_takes_a_uuid_run_id(store, saver):
    """LangGraph configs hold run ids as UUIDs: put stores one as its str, and
    delete_for_runs finds it by either."""
    run = uuid.uuid4()
    doomed = Thread(saver, "a").put({"a": 1}, run_id=run)
    also = Thread(saver, "c").put({"a": 3}, run_id=str(run))
    kept = Thread(saver, "b").put({"a": 2})
    saver.delete_for_runs([run])
    assert saver.get_tuple(doomed) is None and saver.get_tuple(also) is None
    assert saver.get_tuple(kept) is not None


def test_small_cache_reads_unchanged_values_back(store):
    saver = SnapstoreSaver(store, cache_bytes=0)
    big = "z" * 100_000
    th = Thread(saver)
    th.put({"big": big, "n": 0})
    before = stream_bytes(store)
    th.put({"big": big, "n": 1}, changed=["n"])
    assert stream_bytes(store) - before < 3_000
    assert saver.get_tuple(cfg()).checkpoint["channel_values"] == {"big": big, "n": 1}


def test_odd_thread_namespace_and_channel_names(saver):
    names = ["x" * 1000, "a/b/c", "üñí©ødé", "", "with\0nul", "\ud800lone"]
    for i, name in enumerate(names):
        channel = name.replace("\ud800", "") or "e"     # LangGraph's serde refuses surrogates
        c = Thread(saver, thread=name, ns=name).put({channel: i, "c" * 300: "long"})
        tup = saver.get_tuple(c)
        assert tup.config["configurable"]["thread_id"] == name
        assert tup.checkpoint["channel_values"] == {channel: i, "c" * 300: "long"}
    for name in names:
        assert len(list(saver.list(cfg(name, None)))) == 1
    assert all(len(s.encode()) <= 255 for s in saver.store.streams())


# ---- stores shared by path, read-only stores ---------------------------------------------------
def test_second_saver_on_the_same_path_sees_everything(tmp_path):
    path = str(tmp_path / "s")
    with SnapstoreSaver.from_path(path, durability="none") as one:
        c = Thread(one, "t1").put({"a": 1})
        with SnapstoreSaver.from_path(path, durability="none") as two:
            assert two.store is one.store
            assert two.get_tuple(c).checkpoint["channel_values"] == {"a": 1}
            c2 = Thread(two, "t2").put({"b": 2})
            two.put_writes(c, [("w", "v")], "task")
        assert one.get_tuple(c2).checkpoint["channel_values"] == {"b": 2}
        assert one.get_tuple(c).pending_writes == [("task", "w", "v")]
        Thread(one, "t3").put({"c": 3})           # the store is still open for `one`
        # Another Store on the path is a second writer (format 3), not StoreLocked: its
        # saver and `one` see each other's writes, also on a stream both have cached.
        with snapstore.open(path, durability="none") as other:
            foreign = SnapstoreSaver(other)
            assert foreign.get_tuple(c).pending_writes == [("task", "w", "v")]
            th = Thread(foreign, "t1")
            th.config, th.versions = c, dict(foreign.get_tuple(c).checkpoint["channel_versions"])
            c1b = th.put({"a": 2})                # builds on c, the newest: stored
            assert one.get_tuple(cfg("t1")).checkpoint["channel_values"] == {"a": 2}
            late = Thread(one, "t1")
            late.config = c                       # `one` still builds on c: refused
            with pytest.raises(CommitConflict) as exc:
                late.put({"a": 3})
            assert (exc.value.parent_id, exc.value.latest_id) == \
                (c["configurable"]["checkpoint_id"], c1b["configurable"]["checkpoint_id"])
            one.put_writes(c1b, [("w", 1)], "t")
            foreign.put_writes(c1b, [("w", 2)], "t")      # (t, 0) stored by `one`: ignored
            assert foreign.get_tuple(c1b).pending_writes == [("t", "w", 1)]
    with SnapstoreSaver.from_path(path) as again:     # reopened later: all of it is there
        assert {t.config["configurable"]["thread_id"] for t in again.list(None)} == \
            {"t1", "t2", "t3"}
        assert again.get_tuple(cfg("t1")).checkpoint["channel_values"] == {"a": 2}
    with snapstore.open(path, readonly=True) as ro:
        reader = SnapstoreSaver(ro)
        assert reader.get_tuple(c).pending_writes == [("task", "w", "v")]
        with pytest.raises(ReadOnlyError):
            Thread(reader, "t4").put({"d": 4})


def test_from_path_threads_and_async_context(tmp_path):
    path = str(tmp_path / "s")

    def worker(i):
        with SnapstoreSaver.from_path(path, durability="none") as s:
            th = Thread(s, f"thread-{i}")
            for j in range(5):
                th.put({"j": j})

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def read():
        async with SnapstoreSaver.from_path(path, durability="none") as s:
            return [t async for t in s.alist(None)]
    assert len(asyncio.run(read())) == 20


def test_from_path_option_mismatch_and_foreign_lock(tmp_path):
    from snapstore.engine.storedir import take_lock
    path = str(tmp_path / "s")
    with SnapstoreSaver.from_path(path, durability="none") as s:
        with pytest.raises(InvalidArgumentError):
            with SnapstoreSaver.from_path(path, durability="fsync"):
                pass
        # a default left out is that default (fsync), not "whatever is open" (regression:
        # silently got durability "none")
        with pytest.raises(InvalidArgumentError, match="durability"):
            with SnapstoreSaver.from_path(path):
                pass
    with SnapstoreSaver.from_path(path) as s:
        with SnapstoreSaver.from_path(path, durability="fsync") as same:
            assert same.store is s.store                 # the default spelled out: shared
        with SnapstoreSaver.from_path(path, readonly=True) as reader:
            assert reader.store is s.store               # a writer serves a reader
    with SnapstoreSaver.from_path(path, readonly=True):
        with pytest.raises(InvalidArgumentError, match="readonly"):
            with SnapstoreSaver.from_path(path):         # a reader cannot serve a writer
                pass
    with SnapstoreSaver.from_path(path, durability="none") as s:
        with pytest.raises(InvalidArgumentError, match="forks"):
            SnapstoreSaver(s.store, forks="sometimes")
    with snapstore.open(path) as other:           # another writer: from_path opens its own
        with SnapstoreSaver.from_path(path) as s:
            assert s.store is not other
            Thread(s, "t").put({"v": 1})
        assert SnapstoreSaver(other).get_tuple(cfg("t")).checkpoint["channel_values"] == \
            {"v": 1}
    fd = take_lock(path, time.monotonic())        # an exclusive holder (repair, upgrade)
    try:
        with pytest.raises(StoreLocked):
            with SnapstoreSaver.from_path(path, timeout=0.1):
                pass
    finally:
        os.close(fd)


# ---- bad input: clear errors, nothing written ----------------------------------------------------
def test_bad_input(store, saver):
    with pytest.raises(InvalidArgumentTypeError):
        SnapstoreSaver("not a store")
    good = Thread(saver).put({"a": 1})
    n = len(store.checkpoints())
    cp = saver.get_tuple(good).checkpoint
    for bad in (1, None, b"t", uuid.uuid4()):
        with pytest.raises(InvalidArgumentTypeError, match="thread_id"):
            saver.put(cfg(bad), cp, {}, {})
        with pytest.raises(InvalidArgumentTypeError, match="thread_id"):
            saver.get_tuple(cfg(bad))
        with pytest.raises(InvalidArgumentTypeError, match="thread_id"):
            list(saver.list(cfg(bad)))
        with pytest.raises(InvalidArgumentTypeError, match="thread_id"):
            saver.put_writes(cfg(bad, checkpoint_id="x"), [("a", 1)], "task")
        with pytest.raises(InvalidArgumentTypeError):
            saver.delete_thread(bad)
        with pytest.raises(InvalidArgumentTypeError):
            saver.copy_thread("t", bad)
        with pytest.raises(InvalidArgumentTypeError):
            saver.prune([bad])
    with pytest.raises(InvalidArgumentError):
        saver.put({"configurable": {}}, cp, {}, {})
    with pytest.raises(InvalidArgumentError, match="checkpoint_id"):
        saver.put_writes(cfg(), [("a", 1)], "task")
    with pytest.raises(InvalidArgumentTypeError):
        saver.put_writes(good, [("a", 1)], 42)
    with pytest.raises(InvalidArgumentError):
        saver.prune(["t"], strategy="most")
    with pytest.raises(InvalidArgumentTypeError):
        saver.delete_for_runs("run-1")
    with pytest.raises(InvalidArgumentTypeError):
        saver.put(cfg(), dict(cp, id=None), {}, {})
    with pytest.raises(ObjectSaveError, match="channel 'a'.*object"):  # the serde cannot
        saver.put(cfg(), dict(cp, channel_values={"a": object()}), {}, {"a": "2"})
    with pytest.raises(ObjectSaveError, match="write 0 to channel 'a'"):
        saver.put_writes(good, [("a", object())], "task")
    with pytest.raises(ObjectSaveError, match="metadata"):
        saver.put(cfg(), cp, {"x": object()}, {})
    # regressions: raw AttributeError / TypeError / ValueError before
    big = b"x" * 1000                           # over INLINE_MAX: stored in a buffer
    with pytest.raises(InvalidArgumentTypeError, match="channel names must be str"):
        saver.put(cfg(), dict(cp, channel_values={1: big}, channel_versions={1: "2"}), {},
                  {1: "2"})
    with pytest.raises(InvalidArgumentTypeError, match="new_versions: channel names"):
        saver.put(cfg(), cp, {}, {("a",): "2"})
    with pytest.raises(InvalidArgumentTypeError, match="channel_values must be a dict"):
        saver.put(cfg(), dict(cp, channel_values=[("a", 1)]), {}, {})
    with pytest.raises(InvalidArgumentTypeError, match="metadata must be"):
        saver.put(cfg(), cp, None, {})
    for writes in (None, 5, "ab", {"a": 1}):
        with pytest.raises(InvalidArgumentTypeError, match="writes must be a sequence"):
            saver.put_writes(good, writes, "task")
    for write in (("a",), ("a", 1, 2), "ab", None):
        with pytest.raises(InvalidArgumentTypeError, match="write 1 must be a .channel"):
            saver.put_writes(good, [("ok", 1), write], "task")
    assert len(store.checkpoints()) == n
    store.close()
    with pytest.raises(StoreClosedError):
        SnapstoreSaver(store)
    with pytest.raises(StoreClosedError):
        saver.get_tuple(good)


# ---- async: the event loop keeps running during disk I/O ------------------------------------------
def test_async_methods_do_not_block_the_event_loop(store):
    saver = SnapstoreSaver(store)
    real = store.checkpoint

    def slow_checkpoint(*a, **k):
        time.sleep(0.3)
        return real(*a, **k)
    store.checkpoint = slow_checkpoint
    th = Thread(saver)
    cp_config = cfg()

    async def main():
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1
        task = asyncio.ensure_future(ticker())
        cp = {"v": 4, "id": _uuid6(), "ts": "", "channel_values": {"a": 1},
              "channel_versions": {"a": "1"}, "versions_seen": {}, "updated_channels": ["a"]}
        stored = await saver.aput(cp_config, cp, {"step": 0}, {"a": "1"})
        await saver.aput_writes(stored, [("x", 1)], "task")
        tup = await saver.aget_tuple(stored)
        task.cancel()
        return ticks, tup
    try:
        ticks, tup = asyncio.run(main())
    finally:
        store.checkpoint = real
    assert ticks >= 20, ticks                    # ~0.6 s of sleeps in worker threads
    assert tup.pending_writes == [("task", "x", 1)]
    del th


# ---- real graphs ---------------------------------------------------------------------------------
def _graph():
    pytest.importorskip("langgraph.graph", reason="langgraph is not installed")
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    class State(TypedDict, total=False):
        log: Annotated[list, operator.add]
        arr: np.ndarray
        answer: str

    def grow(state):
        arr = state["arr"].copy()
        arr[: len(state["log"])] += 1
        return {"log": ["grow"], "arr": arr}

    def ask(state):
        answer = interrupt({"question": "go on?"})
        return {"log": [f"ask:{answer}"], "answer": answer}

    def finish(state):
        return {"log": ["finish"]}

    g = StateGraph(State)
    g.add_node("grow", grow)
    g.add_node("ask", ask)
    g.add_node("finish", finish)
    g.add_edge(START, "grow")
    g.add_edge("grow", "ask")
    g.add_edge("ask", "finish")
    g.add_edge("finish", END)
    return g


def _normalize(x):
    if isinstance(x, np.ndarray):
        return ("ndarray", x.dtype.str, x.shape, x.tobytes())
    if isinstance(x, dict):
        return {k: _normalize(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_normalize(v) for v in x)
    return x


def _scenario_sync(checkpointer):
    from langgraph.types import Command
    app = _graph().compile(checkpointer=checkpointer)
    out = []
    config = cfg("conversation")
    for turn in range(2):                                   # state accumulates over turns
        r = app.invoke({"log": [f"start{turn}"], "arr": np.zeros(2048)}, config)
        out.append(("interrupted", _normalize({k: v for k, v in r.items() if k != "__interrupt__"}),
                    [i.value for i in r["__interrupt__"]]))
        r = app.invoke(Command(resume=f"yes{turn}"), config)
        out.append(("resumed", _normalize(r)))
    history = list(app.get_state_history(config))
    before_ask = [h for h in history if h.next == ("ask",)][-1]   # the first turn's
    fork = app.update_state(before_ask.config, {"log": ["edited"]})
    r = app.invoke(Command(resume="forked"), fork)
    out.append(("fork", _normalize(r)))
    out.append(("state", _normalize(app.get_state(config).values)))
    out.append(("history", [(_normalize(h.values), h.next, h.metadata["step"],
                             h.metadata["source"]) for h in app.get_state_history(config)]))
    return out


async def _scenario_async(checkpointer):
    from langgraph.types import Command
    app = _graph().compile(checkpointer=checkpointer)
    config = cfg("async-conversation")
    out = []
    r = await app.ainvoke({"log": ["a-start"], "arr": np.ones(16)}, config)
    out.append(_normalize({k: v for k, v in r.items() if k != "__interrupt__"}))
    r = await app.ainvoke(Command(resume="a-yes"), config)
    out.append(_normalize(r))
    history = [h async for h in app.aget_state_history(config)]
    fork = await app.aupdate_state([h for h in history if h.next == ("ask",)][0].config,
                                   {"log": ["a-edited"]})
    out.append(_normalize(await app.ainvoke(Command(resume="a-fork"), fork)))
    out.append([(_normalize(h.values), h.next, h.metadata["step"])
                async for h in app.aget_state_history(config)])
    return out


def test_state_graph_invoke_matches_in_memory_saver(saver):
    expected = _scenario_sync(InMemorySaver())
    got = _scenario_sync(saver)
    assert got == expected
    final = [x for x in got if x[0] == "state"][0][1]
    assert final["log"] == ["start0", "grow", "edited", "ask:forked", "finish"]   # the fork
    resumed = [x for x in got if x[0] == "resumed"][-1][1]
    assert resumed["log"] == ["start0", "grow", "ask:yes0", "finish", "start1", "grow",
                              "ask:yes1", "finish"]
    assert saver.store.verify()["ok"]


def test_state_graph_ainvoke_matches_in_memory_saver(saver):
    expected = asyncio.run(_scenario_async(InMemorySaver()))
    got = asyncio.run(_scenario_async(saver))
    assert got == expected
    assert got[1]["log"] == ["a-start", "grow", "ask:a-yes", "finish"]


def _subgraph_app(checkpointer):
    pytest.importorskip("langgraph.graph", reason="langgraph is not installed")
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt

    class State(TypedDict, total=False):
        log: Annotated[list, operator.add]

    def inner_ask(state):
        return {"log": [f"ask:{interrupt('q?')}"]}
    sub = StateGraph(State)
    sub.add_node("inner", lambda s: {"log": ["inner"]})
    sub.add_node("ask", inner_ask)
    sub.add_edge(START, "inner")
    sub.add_edge("inner", "ask")
    sub.add_edge("ask", END)
    g = StateGraph(State)
    g.add_node("first", lambda s: {"log": ["first"]})
    g.add_node("sub", sub.compile())
    g.add_node("last", lambda s: {"log": ["last"]})
    g.add_edge(START, "first")
    g.add_edge("first", "sub")
    g.add_edge("sub", "last")
    g.add_edge("last", END)
    return g.compile(checkpointer=checkpointer)


def _time_travel(checkpointer):
    """Replay from an older checkpoint, update_state on an older one, a copy (as_node
    "__copy__"), each continued through a subgraph that interrupts."""
    from langgraph.types import Command
    app = _subgraph_app(checkpointer)
    c = cfg("travel")
    out = []

    def run(*args):
        r = app.invoke(*args)
        out.append({k: [i.value for i in v] if k == "__interrupt__" else v
                    for k, v in r.items()})
    run({"log": ["in"]}, c)
    run(Command(resume="r1"), c)
    run(None, [h for h in app.get_state_history(c) if h.next == ("sub",)][0].config)
    run(Command(resume="r2"), c)
    old = [h for h in app.get_state_history(c) if h.next == ("sub",)][-1]
    run(None, app.update_state(old.config, {"log": ["edited"]}))
    run(Command(resume="r3"), c)
    app.update_state(c, None, as_node="__copy__")
    run({"log": ["again"]}, c)
    run(Command(resume="r4"), c)
    out.append([(h.values, h.next, h.metadata["source"]) for h in app.get_state_history(c)])
    return out


def test_time_travel_forks_are_allowed_by_default(saver, tmp_path):
    """LangGraph marks the puts that branch off an older checkpoint (source "fork" or
    "update"): the default forks="marked" stores them, so time travel (also through a
    subgraph) gives what InMemorySaver gives; forks="never" refuses the first branch."""
    assert saver.forks == "marked"
    expected = _time_travel(InMemorySaver())
    assert _time_travel(saver) == expected
    assert {s for *_, s in expected[-1]} >= {"fork", "update"}    # it did branch
    with snapstore.open(str(tmp_path / "never"), durability="none") as other:
        with pytest.raises(CommitConflict, match="thread 'travel'") as exc:
            _time_travel(SnapstoreSaver(other, forks="never"))
        assert exc.value.thread_id == "travel" and exc.value.latest_id != exc.value.parent_id


@pytest.mark.parametrize("durability", ["exit", "sync", "async"])
def test_two_workers_on_one_thread_get_a_conflict_not_interleaved_state(tmp_path, durability):
    """Two workers (two writer Stores on one path, as two processes would be) invoke one graph
    on one thread, each from the same newest checkpoint (every put waits until both loaded
    it): one finishes, the other gets CommitConflict naming the thread, and the thread's
    stored history is one linear chain of the winner's states."""
    pytest.importorskip("langgraph.graph", reason="langgraph is not installed")
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict, total=False):
        log: Annotated[list, operator.add]

    class Gate(SnapstoreSaver):
        """Holds its worker's first put until both workers have loaded the checkpoint."""
        loaded = threading.Barrier(2)

        def put(self, *a, **k):
            if not getattr(self, "_passed", False):
                self._passed = True
                Gate.loaded.wait(10)
            return super().put(*a, **k)

    g = StateGraph(State)
    g.add_node("work", lambda s: {"log": [threading.current_thread().name]})
    g.add_edge(START, "work")
    g.add_edge("work", END)
    path = str(tmp_path / "s")
    with SnapstoreSaver.from_path(path, durability="none") as s:
        g.compile(checkpointer=s).invoke({"log": ["start"]}, cfg("T"))
    results = {}

    def worker():
        name = threading.current_thread().name
        with snapstore.open(path, durability="none") as store:
            app = g.compile(checkpointer=Gate(store))
            try:
                results[name] = app.invoke({"log": [name + "-in"]}, cfg("T"),
                                           durability=durability)["log"]
            except CommitConflict as exc:
                results[name] = exc
    workers = [threading.Thread(target=worker, name=n) for n in ("A", "B")]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    conflicts = [r for r in results.values() if isinstance(r, CommitConflict)]
    wins = [r for r in results.values() if isinstance(r, list)]
    assert len(conflicts) == 1 and len(wins) == 1, results
    winner = wins[0][-1]
    assert wins[0] == ["start", "MainThread", winner + "-in", winner]
    assert conflicts[0].thread_id == "T" and "thread 'T'" in str(conflicts[0])
    with SnapstoreSaver.from_path(path, readonly=True) as s:
        history = list(s.list(cfg("T")))
        for newer, older in zip(history, history[1:]):         # one chain, newest first
            assert newer.parent_config["configurable"]["checkpoint_id"] == \
                older.config["configurable"]["checkpoint_id"]
            assert older.checkpoint["channel_values"].get("log", []) == \
                newer.checkpoint["channel_values"]["log"][:len(
                    older.checkpoint["channel_values"].get("log", []))]
        assert history[0].checkpoint["channel_values"]["log"] == wins[0]


def test_graph_resumes_from_a_reopened_store(tmp_path):
    from langgraph.types import Command
    path = str(tmp_path / "s")
    with SnapstoreSaver.from_path(path) as s:
        r = _graph().compile(checkpointer=s).invoke({"log": ["x"], "arr": np.zeros(8)}, cfg("r"))
        assert "__interrupt__" in r
    with SnapstoreSaver.from_path(path) as s:      # a new process would do the same
        r = _graph().compile(checkpointer=s).invoke(Command(resume="later"), cfg("r"))
    assert r["log"] == ["x", "grow", "ask:later", "finish"]


def test_index_eviction_keeps_answers_right(saver, monkeypatch):
    import snapstore.langgraph as lg
    monkeypatch.setattr(lg, "_MAX_INDEXES", 2)
    threads = [Thread(saver, f"t{i}") for i in range(5)]
    for i, th in enumerate(threads):
        th.put({"v": "x" * 100 + str(i)})
    saver._shared.values.clear()                 # unchanged values must come from the store
    for th in threads:
        th.put({}, changed=[])                   # indexes evicted meanwhile: rebuilt
    assert len(saver._shared.indexes) <= 2
    for i in range(5):
        assert [t.checkpoint["channel_values"] for t in saver.list(cfg(f"t{i}"))] == \
            [{"v": "x" * 100 + str(i)}] * 2


def test_reader_sees_another_process_writing(tmp_path):
    import subprocess
    import sys
    path = str(tmp_path / "s")
    with SnapstoreSaver.from_path(path) as s:
        Thread(s, "t").put({"v": 1})
    with snapstore.open(path, readonly=True) as ro:
        reader = SnapstoreSaver(ro)
        assert reader.get_tuple(cfg()).checkpoint["channel_values"] == {"v": 1}
        code = ("import sys; sys.path[:0] = sys.argv[2:]\n"
                "from snapstore.langgraph import SnapstoreSaver\n"
                "import test_langgraph as t\n"
                "with SnapstoreSaver.from_path(sys.argv[1]) as s:\n"
                "    th = t.Thread(s, 't'); th.versions = {'v': s.get_tuple(t.cfg()).checkpoint"
                "['channel_versions']['v']}\n"
                "    th.config = s.get_tuple(t.cfg()).config\n"
                "    th.put({'v': 2})\n")
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        subprocess.run([sys.executable, "-c", code, path, root, os.path.dirname(__file__)],
                       check=True, timeout=60)
        latest = reader.get_tuple(cfg())
        assert latest.checkpoint["channel_values"] == {"v": 2}
        assert latest.parent_config is not None
        assert len(list(reader.list(cfg()))) == 2


@pytest.mark.parametrize("forks", ["any", "marked", "never"])
@pytest.mark.parametrize("seed", range(4))
def test_random_operations_match_in_memory_saver(store, seed, forks):
    """Random puts (partial channel_values, channels in new_versions without a value, new
    versions outside channel_versions, versions never stored, forks, re-puts), writes and
    thread deletions, applied to InMemorySaver and SnapstoreSaver: every read agrees. With
    forks "marked"/"never", exactly the puts the rule refuses raise CommitConflict (and are
    not applied to the reference): those naming a parent other than the newest checkpoint
    (greatest id), unless marked by their source ("marked") or a re-put of the newest on its
    own parent; with "never" also a put without parent into a thread that has one."""
    import random
    from langgraph.checkpoint.base.id import uuid6
    rng = random.Random(seed)
    ours, ref = SnapstoreSaver(store, forks=forks), InMemorySaver()
    parents: dict = {}                       # (thread, ns, checkpoint id) -> parent id
    counter = iter(range(1, 10**6))
    stored: dict = {}                        # (thread, ns, channel) -> [versions stored]
    known: dict = {}                         # (thread, ns) -> [checkpoint ids]

    def value():
        return rng.choice([rng.randrange(100), "s" * rng.randrange(200), os.urandom(100),
                           bytearray(os.urandom(rng.randrange(50, 300))), None,
                           np.arange(rng.randrange(1, 40), dtype=rng.choice(["i4", "f8"])),
                           {"k": [1, "two"]}])

    for _ in range(60):
        thread, ns = rng.choice(["t0", "t1"]), rng.choice(["", "c:1"])
        op = rng.random()
        ids = known.setdefault((thread, ns), [])
        if op < 0.65 or not ids:
            versions, new, values = {}, {}, {}
            for ch in rng.sample("abcd", rng.randrange(0, 5)):
                old = stored.get((thread, ns, ch))
                mode = rng.random()
                if old and mode < 0.4:
                    versions[ch] = rng.choice(old)             # unchanged, stored earlier
                elif mode < 0.5:
                    versions[ch] = -next(counter)              # never stored: absent
                else:
                    versions[ch] = new[ch] = next(counter)
                    if rng.random() < 0.85:
                        values[ch] = value()                   # else: "empty"
                if rng.random() < 0.3:
                    values.setdefault(ch, value())             # ignored if not new
            if rng.random() < 0.15:                            # a version outside versions
                ch = rng.choice("abcd")
                new[ch] = next(counter)
                values[ch] = value()
            for ch, v in new.items():
                stored.setdefault((thread, ns, ch), []).append(v)
            newest = max(ids) if ids else None
            cid = rng.choice(ids) if ids and rng.random() < 0.1 else str(uuid6())
            if ids and rng.random() < 0.5:
                parent = newest
            else:
                parent = rng.choice(ids) if ids and rng.random() < 0.6 else None
            if newest is not None and rng.random() < 0.1:
                cid, parent = newest, parents[(thread, ns, newest)]     # re-put the newest
            cp = {"v": 4, "id": cid, "ts": "2024", "channel_values": values,
                  "channel_versions": versions, "versions_seen": {"n": dict(versions)},
                  "updated_channels": sorted(new)}
            config = cfg(thread, ns, parent)
            source = rng.choice(["loop", "input", "fork", "update"])
            md = {"source": source, "step": rng.randrange(5), "run_id": rng.choice("xy")}
            accepted = (forks == "any" or (forks == "marked" and source in ("fork", "update"))
                        or parent == newest
                        or (parent is None and forks == "marked")
                        or (cid == newest and parent == parents[(thread, ns, newest)]))
            if not accepted:
                with pytest.raises(CommitConflict) as exc:
                    ours.put(config, cp, md, new)
                assert (exc.value.thread_id, exc.value.checkpoint_ns, exc.value.parent_id,
                        exc.value.latest_id) == (thread, ns, parent, newest)
                for ch, v in new.items():
                    stored[(thread, ns, ch)].remove(v)
                continue
            assert ours.put(config, cp, md, new) == ref.put(config, cp, md, new)
            parents[(thread, ns, cid)] = parent
            if cid not in ids:
                ids.append(cid)
        elif op < 0.95:
            config = cfg(thread, ns, rng.choice(ids))
            writes = [(rng.choice(["a", "b", ERROR, INTERRUPT]), value())
                      for _ in range(rng.randrange(1, 4))]
            task, path = rng.choice(["task1", "task2"]), rng.choice(["", "p"])
            ours.put_writes(config, writes, task, path)
            ref.put_writes(config, writes, task, path)
        else:
            ours.delete_thread(thread)
            ref.delete_thread(thread)
            for key in [k for k in known if k[0] == thread]:
                known[key] = []
            for key in [k for k in stored if k[0] == thread]:
                del stored[key]

        def view(tup):
            if tup is None:
                return None
            return (tup.config["configurable"]["checkpoint_id"], _normalize(tup.checkpoint),
                    tup.metadata, tup.parent_config, _normalize(tup.pending_writes))
        for (thread, ns), ids in known.items():
            c = cfg(thread, ns)
            assert view(ours.get_tuple(c)) == view(ref.get_tuple(c))
            assert [view(t) for t in ours.list(c)] == [view(t) for t in ref.list(c)]
            for cid in ids[-3:]:
                c = cfg(thread, ns, cid)
                assert view(ours.get_tuple(c)) == view(ref.get_tuple(c))
    assert store.verify()["ok"]


def test_snapstore_imports_without_langgraph():
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import sys; sys.modules['langgraph'] = None\n"
            "import snapstore, snapstore.workflow\n"
            "try:\n"
            "    import snapstore.langgraph\n"
            "except ImportError as e:\n"
            "    assert 'snapstore[langgraph]' in str(e), e\n"
            "    print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr



def test_prune_keeps_the_writes_of_a_checkpoint_stored_while_it_ran(tmp_path, monkeypatch):
    """Regression: prune read the thread's checkpoints, then its writes; a checkpoint another
    worker stored in between was neither kept nor deleted, but its writes were deleted."""
    path = str(tmp_path / "s")
    with snapstore.open(path) as a_store, snapstore.open(path) as b_store:
        a, b = SnapstoreSaver(a_store), SnapstoreSaver(b_store)
        thread = Thread(b, "T")
        c1 = thread.put({"v": 1})
        c2 = thread.put({"v": 2})
        b.put_writes(c2, [("ch", "old")], "task")
        real = SnapstoreSaver._writes_index
        late = {}

        def writes_index(self, stream):
            if self is a and not late:           # the prune, between its two reads
                late["cfg"] = thread.put({"v": 3})
                b.put_writes(late["cfg"], [("ch", "new")], "task")
            return real(self, stream)
        monkeypatch.setattr(SnapstoreSaver, "_writes_index", writes_index)
        a.prune(["T"])
        monkeypatch.setattr(SnapstoreSaver, "_writes_index", real)
        newest = b.get_tuple(cfg("T"))
        assert newest.checkpoint["channel_values"] == {"v": 3}
        assert newest.pending_writes == [("task", "ch", "new")]
        assert b.get_tuple(c1) is None           # older than what the prune kept: gone
        assert b.get_tuple(c2).pending_writes == [("task", "ch", "old")]   # its keep


def test_copy_thread_skips_a_checkpoint_deleted_while_it_copies(saver, monkeypatch):
    thread = Thread(saver, "src")
    for i in range(3):
        thread.put({"v": i})
    ids = saver.store.checkpoint_ids(next(s for s in saver.store.streams() if "src" in s))
    real = saver.store.restore
    gone = ids[1]

    def restore(name):
        if name == gone:
            raise snapstore.errors.CheckpointNotFound(f"no checkpoint {name}")
        return real(name)
    monkeypatch.setattr(saver.store, "restore", restore)
    saver.copy_thread("src", "dst")
    monkeypatch.undo()
    assert [t.checkpoint["channel_values"] for t in saver.list(cfg("dst"))] == \
        [{"v": 2}, {"v": 0}]
