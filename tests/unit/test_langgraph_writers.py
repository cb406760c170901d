"""SnapstoreSaver with many writers on one store (format 3): processes that each open the store
for writing, as LangGraph workers on several machines' worth of processes would.

- LangGraph's conformance suite passes in two processes at once on one store (other thread
  ids), every capability in both;
- two processes racing puts built on the same parent on ONE thread, round after round: exactly
  one wins each round, the other gets CommitConflict naming the thread, and the stored thread
  is one chain whose every checkpoint holds exactly its writer's values;
- put_writes from two processes on one checkpoint: every write lands, each (task, idx) once;
- what a saver caches of a stream (index, values) never outlives another writer's change.

Workers are spawned (multiprocessing "spawn": a fresh interpreter opens its own Store) and
meet at barriers, so the races are real and every round is one.
"""
import asyncio
import multiprocessing
import os
import random
import time
import traceback
import uuid

import numpy as np
import pytest

pytest.importorskip("langgraph.checkpoint.conformance",
                    reason="langgraph-checkpoint-conformance is not installed")

from langgraph.checkpoint.base.id import uuid6  # noqa: E402

import snapstore  # noqa: E402
from snapstore.errors import CommitConflict  # noqa: E402
from snapstore.langgraph import SnapstoreSaver  # noqa: E402

TIMEOUT = 120                # seconds any worker may take; a hung race fails instead


def cfg(thread, ns="", checkpoint_id=None):
    c = {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}
    if checkpoint_id is not None:
        c["configurable"]["checkpoint_id"] = checkpoint_id
    return c


def _spawn(target, args_of, n=2):
    """Runs target(i, *args_of(i), results) in n spawned processes; returns their results
    (one per process, in order), failing with a worker's traceback if it raised."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_guarded, args=(target, i, args_of(i), results))
             for i in range(n)]
    for p in procs:
        p.start()
    try:
        got = dict(results.get(timeout=TIMEOUT) for _ in procs)
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    for i in range(n):
        status, value = got[i]
        assert status == "ok", f"worker {i} failed:\n{value}"
    return [got[i][1] for i in range(n)]


def _guarded(target, i, args, results):
    try:
        results.put((i, ("ok", target(i, *args))))
    except BaseException:
        results.put((i, ("error", traceback.format_exc())))


# ---- (i) the conformance suite, twice at once -------------------------------------------------
def _conformance_worker(i, path, durability, start, done):
    """Runs the suite on a saver over the shared store until the other worker finished its
    first run, so this worker's first run overlaps the other's whole run. Returns, per run,
    (capability -> (detected, passed, failed)), and the failures."""
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    @checkpointer_test(name=f"worker-{i}")
    async def factory():
        store = snapstore.open(path, durability=durability)   # one writer per capability
        try:
            yield SnapstoreSaver(store)
        finally:
            store.close()

    runs = []
    start.wait(TIMEOUT)
    while True:
        report = asyncio.run(validate(factory))
        runs.append({name: (r.detected, r.tests_passed, r.tests_failed, r.failures)
                     for name, r in report.results.items()})
        if len(runs) == 1:
            done[i].set()
        if done[1 - i].is_set() or len(runs) >= 20:
            return runs


def test_conformance_suite_in_two_processes_on_one_store(tmp_path):
    from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES
    path = str(tmp_path / "shared")
    snapstore.open(path).close()
    ctx = multiprocessing.get_context("spawn")
    start, done = ctx.Barrier(2), [ctx.Event(), ctx.Event()]
    both = _spawn(_conformance_worker,
                  lambda i: (path, ("fsync", "none")[i], start, done))
    expected = {"put": 17, "put_writes": 10, "get_tuple": 10, "list": 16, "delete_thread": 5,
                "delete_for_runs": 7, "copy_thread": 8, "prune": 8}
    assert {c.value for c in ALL_CAPABILITIES} == set(expected)
    for i, runs in enumerate(both):
        for n, run in enumerate(runs):
            for name, (detected, passed, failed, failures) in run.items():
                assert detected, (i, n, name)
                assert (passed, failed) == (expected[name], 0), (i, n, name, failures)
    with snapstore.open(path, readonly=True) as s:
        assert s.verify()["ok"]
        threads = {c.meta["t"] for c in s.checkpoints() if isinstance(c.meta, dict)
                   and "t" in c.meta}
        assert len(threads) > 50                    # what both suites left in the store


# ---- (ii) racing puts on one thread -------------------------------------------------------------
CHANNELS = ("a", "b", "c", "arr")


def _value(who, rnd, channel):
    if channel == "arr":                            # raw NumPy buffer
        return np.full(2048, rnd * 10 + who, dtype=np.int64)
    return {"who": who, "round": rnd, "pad": f"{who}" * (300 + 37 * rnd)}   # serde buffer


def _same(x, y):
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and np.array_equal(x, y)
    return x == y


def _racer(who, path, rounds, barrier):
    """Each round: load the thread's newest checkpoint (both workers load the same one), then
    put a child of it changing a random subset of channels, with the versions LangGraph's
    int-versioned savers would give (parent's + 1: both workers give the same version to
    different values). Returns [(round, loaded id, "won" | conflict facts)]."""
    rng = random.Random(who)
    out = []
    with snapstore.open(path, durability="none") as store:
        saver = SnapstoreSaver(store)
        for rnd in range(1, rounds + 1):
            barrier.wait(TIMEOUT)                   # the previous round's puts are all done
            tup = saver.get_tuple(cfg("race"))
            barrier.wait(TIMEOUT)                   # both loaded: neither has put yet
            parent = tup.checkpoint
            changed = rng.sample(CHANNELS, rng.randrange(1, len(CHANNELS) + 1))
            versions = dict(parent["channel_versions"])
            new = {ch: versions[ch] + 1 for ch in changed}
            versions.update(new)
            values = dict(parent["channel_values"])
            values.update({ch: _value(who, rnd, ch) for ch in changed})
            cp = {"v": 4, "id": str(uuid6(clock_seq=rnd)), "ts": "", "channel_values": values,
                  "channel_versions": versions, "versions_seen": {}, "updated_channels": changed}
            md = {"source": "loop", "step": rnd, "who": who, "changed": changed}
            time.sleep(rng.random() * 0.004)         # so that either may win a round
            try:
                saver.put(tup.config, cp, md, new)
                out.append((rnd, tup.config["configurable"]["checkpoint_id"], "won"))
            except CommitConflict as exc:
                out.append((rnd, tup.config["configurable"]["checkpoint_id"],
                            (exc.thread_id, exc.parent_id, exc.latest_id, str(exc))))
    return out


def test_two_processes_racing_puts_on_one_thread_never_interleave(tmp_path):
    rounds = 30
    path = str(tmp_path / "shared")
    with snapstore.open(path, durability="none") as store:
        root = {"v": 4, "id": str(uuid6(clock_seq=0)), "ts": "",
                "channel_values": {ch: _value(9, 0, ch) for ch in CHANNELS},
                "channel_versions": {ch: 1 for ch in CHANNELS}, "versions_seen": {},
                "updated_channels": list(CHANNELS)}
        SnapstoreSaver(store).put(cfg("race"), root, {"source": "input", "step": 0,
                                                      "who": 9, "changed": list(CHANNELS)},
                                  {ch: 1 for ch in CHANNELS})
    barrier = multiprocessing.get_context("spawn").Barrier(2)
    a, b = _spawn(_racer, lambda i: (path, rounds, barrier))
    winners = {}
    with snapstore.open(path, readonly=True) as store:
        history = list(reversed(list(SnapstoreSaver(store).list(cfg("race")))))
    by_id = {t.config["configurable"]["checkpoint_id"]: t for t in history}
    for rnd in range(1, rounds + 1):
        ra, rb = a[rnd - 1], b[rnd - 1]
        assert ra[0] == rb[0] == rnd and ra[1] == rb[1]          # both built on one parent
        outcomes = [ra[2], rb[2]]
        assert outcomes.count("won") == 1, (rnd, outcomes)      # exactly one winner
        who = outcomes.index("won")
        winners[rnd] = who
        thread_id, parent_id, latest_id, message = outcomes[1 - who]
        assert (thread_id, parent_id) == ("race", ra[1])
        assert by_id[latest_id].metadata["who"] == who           # the winner's checkpoint
        assert "thread 'race'" in message and parent_id in message and latest_id in message
    assert len(set(winners.values())) == 2                      # both won some rounds
    # the stored thread: one chain, root + one checkpoint per round, each the round's winner's
    assert len(history) == rounds + 1
    assert [t.metadata["step"] for t in history] == list(range(rounds + 1))
    for rnd, (parent, child) in enumerate(zip(history, history[1:]), start=1):
        assert child.parent_config["configurable"]["checkpoint_id"] == \
            parent.config["configurable"]["checkpoint_id"]
        who = child.metadata["who"]
        assert who == winners[rnd]
        values = child.checkpoint["channel_values"]
        for ch in CHANNELS:                    # changed: the writer's; else: the parent's
            want = _value(who, rnd, ch) if ch in child.metadata["changed"] \
                else parent.checkpoint["channel_values"][ch]
            assert _same(values[ch], want), (rnd, ch)


# ---- (iii) pending writes from two processes on one checkpoint ---------------------------------
def _writer(who, path, config, n, barrier):
    """n rounds of: a task both workers write at the same moment (same task id and index,
    different values: both read the stored writes before either stores), then a task of its
    own."""
    with snapstore.open(path, durability="none") as store:
        saver = SnapstoreSaver(store)
        for k in range(n):
            barrier.wait(TIMEOUT)
            saver.put_writes(config, [("shared", f"from {who}")], f"shared-{k}")
            saver.put_writes(config, [("own", f"{who}-{k}"), ("x", "y" * 200)], f"w{who}-{k}")
    return n


def test_put_writes_from_two_processes_all_land_once(tmp_path):
    n = 40
    path = str(tmp_path / "shared")
    with snapstore.open(path, durability="none") as store:
        cp = {"v": 4, "id": str(uuid.uuid4()), "ts": "", "channel_values": {},
              "channel_versions": {}, "versions_seen": {}, "updated_channels": []}
        config = SnapstoreSaver(store).put(cfg("w"), cp, {"step": 0}, {})
    barrier = multiprocessing.get_context("spawn").Barrier(2)
    _spawn(_writer, lambda i: (path, config, n, barrier))
    with snapstore.open(path, readonly=True) as store:
        writes = SnapstoreSaver(store).get_tuple(config).pending_writes
        stored = [(c.meta["task"], w[0]) for c in store.checkpoints()
                  if isinstance(c.meta, dict) and "task" in c.meta for w in c.meta["w"]]
    assert len(stored) == len(set(stored)) == 2 * (2 * n) + n   # each (task, idx) once
    own = {(task, value) for task, ch, value in writes if ch == "own"}
    assert own == {(f"w{who}-{k}", f"{who}-{k}") for who in (0, 1) for k in range(n)}
    assert sum(1 for _, ch, v in writes if ch == "x" and v == "y" * 200) == 2 * n
    shared = [(task, value) for task, ch, value in writes if ch == "shared"]
    assert sorted(t for t, _ in shared) == sorted(f"shared-{k}" for k in range(n))
    assert {v for _, v in shared} <= {"from 0", "from 1"}


# ---- what a saver caches never outlives another writer's change (two Stores, one process) ------
def _put(saver, thread, parent_config, values, new, **md):
    cp = {"v": 4, "id": str(uuid6()), "ts": "", "channel_values": values,
          "channel_versions": dict(new), "versions_seen": {}, "updated_channels": list(new)}
    if parent_config is not None:
        cp["channel_versions"] = {**saver.get_tuple(parent_config).checkpoint[
            "channel_versions"], **new}
    config = parent_config or cfg(thread)
    return saver.put(config, cp, {"source": "loop", "step": 0, **md}, new)


def test_cached_index_sees_another_writers_deletes_of_older_checkpoints(store_path):
    with snapstore.open(store_path, durability="none") as s1, \
            snapstore.open(store_path, durability="none") as s2:
        one, two = SnapstoreSaver(s1), SnapstoreSaver(s2)
        c1 = _put(one, "t", None, {"a": "x" * 100}, {"a": 1})
        c2 = _put(one, "t", c1, {"a": "y" * 100}, {"a": 2})
        c3 = _put(one, "t", c2, {"a": "y" * 100}, {})
        assert len(list(one.list(cfg("t")))) == 3          # `one` has the stream indexed
        two.prune(["t"])                                  # the head (c3) stays: only c1, c2 go
        assert [t.config for t in one.list(cfg("t"))] == [c3]
        assert one.get_tuple(c1) is None and one.get_tuple(c2) is None
        assert one.get_tuple(cfg("t")).checkpoint["channel_values"] == {"a": "y" * 100}
        c4 = _put(one, "t", c3, {}, {})                    # the value of a@2: read from c3
        assert one.get_tuple(c4).checkpoint["channel_values"] == {"a": "y" * 100}


def test_value_cache_never_serves_a_version_another_writer_stored_again(store_path):
    """LangGraph versions collide between workers (int-versioned graphs). The value of an
    unchanged channel version is the newest stored under it (as in InMemorySaver); a
    worker's cache of its own older value must not win over another writer's."""
    with snapstore.open(store_path, durability="none") as s1, \
            snapstore.open(store_path, durability="none") as s2:
        one, two = SnapstoreSaver(s1), SnapstoreSaver(s2)
        c1 = _put(one, "t", None, {"a": "mine" * 50}, {"a": 1})      # `one` caches a@1
        c2 = _put(two, "t", c1, {"a": "theirs" * 50}, {"a": 1})      # a@1 again, other value
        c3 = _put(one, "t", c2, {}, {})                              # a@1 unchanged
        assert one.get_tuple(c3).checkpoint["channel_values"] == {"a": "theirs" * 50}
        assert one.get_tuple(c1).checkpoint["channel_values"] == {"a": "mine" * 50}
