"""torch.distributed.checkpoint with real gloo process groups of 1, 2 and 4 ranks
(SnapstoreWriter's group commits): every rank stages its shard at once and the coordinator's
finish commits ONE checkpoint; the second save is incremental per item; loads with 1, 2 and
4 ranks reshard byte-exact; a rank that raises, a rank SIGKILLed mid-save and a coordinator
SIGKILLed before (or after) its commit record leave nothing half visible, and the previous
save still loads.

The ranks run in dcp_rank.py (one launcher per fixture, which forks the ranks of each step),
rank 0 reports facts as JSON lines; the checks that need the ranks gone run here.
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import snapstore  # noqa: E402
import snapstore.torch as st  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import dcp_rank  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")]


launch = dcp_rank.launch


def fact(step: dict, what: str) -> dict:
    found = [f for f in step["facts"] if f["what"] == what]
    assert len(found) == 1, (what, step)
    return found[0]


def single_process_load(path, saved_world: int, version) -> dict:
    """dcp.load in this process, without a process group, into plain tensors (every stored
    shard is read into the whole tensor); returns the loaded state, checked byte-exact."""
    target = dcp_rank.load_target(saved_world)
    dcp.load(target, checkpoint_id=f"v{version}", storage_reader=st.SnapstoreReader(path))
    dcp_rank.check_loaded(target, version, saved_world)
    return target


def checkpoint_ids(path) -> list:
    with snapstore.open(path, readonly=True) as s:
        return [c.reserved_meta["snapstore.dcp"]["checkpoint_id"] for c in s.checkpoints()]


# ---- saves and loads at 1, 2 and 4 ranks ------------------------------------------------------
WORLDS = (1, 2, 4)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every step of this module in one launcher (torch starts once): the saves at 1, 2 and 4
    ranks (each world loads its own save and every save made before it; then 2 ranks load
    the 4-rank save), and the runs, each in a store of its own."""
    work = tmp_path_factory.mktemp("dcp-ranks")
    steps = []
    for w in WORLDS:
        steps.append({"name": f"save{w}", "scenario": "save", "world": w,
                      "store": str(work / f"saved-by-{w}"),
                      "loads": [[str(work / f"saved-by-{v}"), v] for v in WORLDS if v < w]})
    steps.append({"name": "load2", "scenario": "load", "world": 2, "store": "",
                  "loads": [[str(work / "saved-by-4"), 4]]})
    steps += [{"name": "raise", "scenario": "raise", "world": 2},
              {"name": "raise-async", "scenario": "raise-async", "world": 2},
              {"name": "kill-rank", "scenario": "kill-rank", "world": 2},
              {"name": "kill-coordinator", "scenario": "kill-coordinator", "world": 2},
              {"name": "kill-after-record", "scenario": "kill-coordinator", "world": 2,
               "crash_at": "after_commit_append"}]
    for step in steps[len(WORLDS) + 1:]:
        step["store"] = str(work / step["name"])
    out = launch(work, steps)
    out["stores"] = {s["name"]: s["store"] for s in steps}
    out["stores"].update({w: str(work / f"saved-by-{w}") for w in WORLDS})
    return out


@pytest.mark.parametrize("world", WORLDS)
def test_one_save_is_one_checkpoint_of_every_ranks_items(runs, world):
    step = runs[f"save{world}"]
    assert step["exits"] == [0] * world, runs["stderr"][-4000:]
    saved = fact(step, "saved")
    first, second = saved["first"], saved["second"]
    # one checkpoint per save, no part streams: every rank's items are in it
    assert saved["visible"] == {"checkpoints": [[1, "v1"], [2, "v2"]], "streams": ["dcp"]}
    ranks = {f"rank{r}" for r in range(world)}
    for info in (first, second):
        assert set(info["parts"]) == ranks | {"metadata"}
        assert info["parts"]["metadata"] is None
        assert all(info["parts"][f"rank{r}"]["rank"] == r for r in range(world))
        assert info["dcp"]["ranks"] == world and info["dcp"]["parts"] == []
        rows = dcp_rank.ROWS // world               # each rank's shard of model.w1
        shards = {"item/model.w1" + (f"@{r * rows},0" if r else "") for r in range(world)}
        owns = {f"item/own.rank{r}" for r in range(world)}
        assert shards | owns | {"dcp/metadata", "item/step"} <= set(info["buffers"])
    assert (first["kind"], first["parent"]) == ("full", None)
    assert (second["kind"], second["parent"], second["chain"]) == ("incremental", 1, 1)


@pytest.mark.parametrize("world", WORLDS)
def test_second_save_stores_about_the_changed_rows_only(runs, world):
    saved = fact(runs[f"save{world}"], "saved")
    first, second = saved["first"], saved["second"]
    changed = len(dcp_rank.CHANGED_ROWS) * 4096          # 1% of model.w1's rows, a page each
    # random float32 weights: as byte planes only their exponents compress (format 4: 17%)
    assert 0.7 * first["total"] < first["bytes_new"] < 0.9 * first["total"], first
    assert changed // 2 < second["bytes_new"] < 0.03 * second["total"], second
    with snapstore.open(runs["stores"][world], readonly=True) as s:
        assert s.verify(deep=True)["ok"]


def test_loads_with_1_2_and_4_ranks_reshard_byte_exact(runs):
    # a rank raises on any byte that differs, so a load reported by a step that exited 0 was
    # byte-exact on every rank (DTensors: each local shard)
    loaded = set()
    for name in ("save1", "save2", "save4", "load2"):
        step = runs[name]
        assert step["exits"] == [0] * len(step["exits"]), runs["stderr"][-4000:]
        loaded |= {(f["saved_world"], len(step["exits"])) for f in step["facts"]
                   if f["what"] == "loaded"}
    assert loaded == {(1, 1), (1, 2), (2, 2), (1, 4), (2, 4), (4, 4), (4, 2)}
    for w in WORLDS:                       # and in one process with no process group at all
        for version in (1, 2):
            single_process_load(runs["stores"][w], w, version)


# ---- failures: nothing half visible, the previous save still loads -----------------------------
def test_a_rank_that_fails_before_staging_fails_the_save_cleanly(runs):
    step = runs["raise"]
    assert step["exits"] == [0, 0], runs["stderr"][-4000:]
    raised, silent = fact(step, "raise"), fact(step, "no-stage")
    # rank 1 raised in write_data: DCP reports it and never calls finish
    assert "rank 1 failed before staging" in raised["error"]
    # rank 1 returned without staging: the coordinator's finish names it at once (no wait)
    assert "GroupTimeout" in silent["error"] and "'rank1'" in silent["error"]
    assert silent["seconds"] < 10
    for failed in (raised, silent):
        assert failed["visible"] == {"checkpoints": [[1, "v1"]], "streams": ["dcp"]}
    # a retry with a new writer is not blocked by the failed saves' groups, and diffs against v1
    retry = fact(step, "retry")
    assert retry["visible"]["checkpoints"] == [[1, "v1"], [2, "v2"]]
    assert (retry["info"]["kind"], retry["info"]["parent"]) == ("incremental", 1)
    path = runs["stores"]["raise"]
    with snapstore.open(path) as s:
        assert s.streams() == ["dcp"] and s.verify(deep=True)["ok"]
    single_process_load(path, 2, 1)
    single_process_load(path, 2, 2)


def test_a_failed_async_save_leaves_nothing_in_the_next_saves_way(runs):
    step = runs["raise-async"]
    assert step["exits"] == [0, 0], runs["stderr"][-4000:]
    done = fact(step, "async")
    assert "rank 1 failed before staging" in done["error"]
    assert done["seconds"] < 30                  # not the abandoned group's deadline (600 s)
    assert done["visible"]["checkpoints"] == [[1, "v1"], [2, "v2"]]
    assert (done["info"]["kind"], done["info"]["parent"]) == ("incremental", 1)


def test_a_rank_killed_while_staging_leaves_the_previous_save(runs):
    step = runs["kill-rank"]
    assert step["exits"] == [0, -9], runs["stderr"][-4000:]
    failed = fact(step, "failed")
    assert failed["error"] and failed["visible"]["checkpoints"] == [[1, "v1"]]
    # the coordinator, alone afterwards, saves at once: its failed save's group is dropped
    alone = fact(step, "alone")
    assert alone["visible"]["checkpoints"] == [[1, "v1"], [2, "v3"]]
    path = runs["stores"]["kill-rank"]
    with snapstore.open(path) as s:             # recovers the killed rank's log
        assert s.verify(deep=True)["ok"]
    single_process_load(path, 2, 1)
    target = {k: (torch.zeros_like(v) if isinstance(v, torch.Tensor) else 0)
              for k, v in dcp_rank.full_state(3, 1).items()}
    dcp.load(target, checkpoint_id="v3", storage_reader=st.SnapstoreReader(path))
    dcp_rank.check_loaded(target, 3, 1)


def test_a_coordinator_killed_before_its_commit_leaves_the_previous_save(runs):
    step = runs["kill-coordinator"]
    assert step["exits"][0] == -9 and step["exits"][1] != 0, runs["stderr"][-4000:]
    path = runs["stores"]["kill-coordinator"]
    assert checkpoint_ids(path) == ["v1"]      # every rank staged; nothing is visible
    with snapstore.open(path) as s:             # recovery drops the dead coordinator's group
        assert s.verify(deep=True)["ok"] and s.streams() == ["dcp"]
    assert checkpoint_ids(path) == ["v1"]
    single_process_load(path, 2, 1)
    # the stream is free: a new save goes through
    dcp.save(dcp_rank.full_state(3, 1), checkpoint_id="v3",
             storage_writer=st.SnapstoreWriter(path, timeout=30))
    assert checkpoint_ids(path) == ["v1", "v3"]


def test_a_coordinator_killed_after_its_commit_record_commits_the_whole_save(runs):
    step = runs["kill-after-record"]
    assert step["exits"][0] == -9 and step["exits"][1] != 0, runs["stderr"][-4000:]
    path = runs["stores"]["kill-after-record"]
    assert checkpoint_ids(path) == ["v1"]      # a reader: the record is not published yet
    with snapstore.open(path) as s:             # recovery publishes the complete record
        info = s.latest("dcp")
        assert snapstore.group_parts(info).keys() == {"rank0", "rank1", "metadata"}
        assert s.verify(deep=True)["ok"]
    assert checkpoint_ids(path) == ["v1", "v2"]
    single_process_load(path, 2, 1)
    single_process_load(path, 2, 2)
