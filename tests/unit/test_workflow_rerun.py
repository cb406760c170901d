"""Workflow inputs (issue 15): run() with another input than the stored run's raises instead
of silently returning the old result; the same input or none resumes / returns it; rerun()
starts a new run keeping history; a step appended to a finished workflow runs from the stored
final state."""
import json
import pickle

import pytest

from snapstore import workflow as wfmod
from snapstore.errors import (InvalidArgumentError, StepError, WorkflowFinishedError,
                              WorkflowInputMismatchError)
from snapstore.workflow import Workflow


class Adder:
    """Steps that add their number to the state and count their runs."""

    def __init__(self, store, n=3, wid="w", fail_at=None):
        self.runs = []
        self.fail_at = fail_at
        self.wf = Workflow(store, wid)
        for i in range(n):
            self.add(i)

    def add(self, i):
        def fn(state, i=i):
            self.runs.append(i)
            if i == self.fail_at:
                raise RuntimeError("broke")
            return state + 10 ** i
        self.wf.add_step(f"s{i}", fn)


def test_finished_same_or_no_input_returns_the_stored_result(store):
    a = Adder(store)
    assert a.wf.run(1000) == 1111
    assert a.wf.run(1000) == 1111 and a.wf.run() == 1111 and a.wf.run(None) == 1111
    assert Adder(store).wf.run(1000) == 1111           # another Workflow object too
    assert a.runs == [0, 1, 2]


def test_finished_other_input_raises_and_runs_nothing(store):
    a = Adder(store)
    a.wf.run(1000)
    with pytest.raises(WorkflowFinishedError) as exc:
        a.wf.run(2000)
    err = exc.value
    assert isinstance(err, WorkflowInputMismatchError) and isinstance(err, InvalidArgumentError)
    assert "rerun" in str(err) and "reset" in str(err) and err.workflow_id == "w"
    assert a.runs == [0, 1, 2] and len(a.wf.history()) == 3
    assert a.wf.load() == 1111
    # "same" means: pickles to the same bytes (1000 and 1000.0 differ)
    with pytest.raises(WorkflowFinishedError):
        a.wf.run(1000.0)


def test_rerun_starts_a_new_run_and_keeps_history(store):
    a = Adder(store)
    a.wf.run(1000)
    assert a.wf.rerun(2000, meta={"why": "new day"}) == 2111
    h = a.wf.history()
    assert [(r.run, r.step) for r in h] == [(0, "s0"), (0, "s1"), (0, "s2"),
                                            (1, "s0"), (1, "s1"), (1, "s2")]
    assert [r.meta for r in h[3:]] == [{"why": "new day"}] * 3
    assert a.wf.load() == 2111 and a.wf.load("s0") == 2001
    assert a.wf.completed == ("s0", "s1", "s2")
    assert a.wf.run(2000) == 2111 and a.wf.run() == 2111
    with pytest.raises(WorkflowFinishedError):
        a.wf.run(1000)                                  # the old input is not the run's now
    assert a.runs == [0, 1, 2, 0, 1, 2]
    assert a.wf.rerun(1000) == 1111 and {r.run for r in a.wf.history()} == {0, 1, 2}
    assert a.wf.reset() == 9 and a.wf.history() == []
    assert a.wf.run(5) == 116 and [r.run for r in a.wf.history()] == [0, 0, 0]


def test_rerun_interrupted_resumes_with_its_input(store):
    a = Adder(store)
    a.wf.run(1000)
    a.fail_at = 1
    with pytest.raises(StepError):
        a.wf.rerun(2000)
    assert [r.run for r in a.wf.history()] == [0, 0, 0, 1]
    a.fail_at = None
    with pytest.raises(WorkflowInputMismatchError) as exc:      # unfinished run, other input
        a.wf.run(1000)
    assert not isinstance(exc.value, WorkflowFinishedError)
    assert a.wf.run(2000) == 2111
    assert a.runs == [0, 1, 2, 0, 1, 1, 2]                      # s0 of run 1 did not rerun


def test_unfinished_run_resumes_with_no_input(store):
    a = Adder(store, fail_at=2)
    with pytest.raises(StepError):
        a.wf.run(1000)
    a.fail_at = None
    assert a.wf.run() == 1111 and a.runs == [0, 1, 2, 2]


def test_a_step_added_to_a_finished_workflow_runs_from_the_final_state(store):
    a = Adder(store)
    a.wf.run(1000)
    b = Adder(store, n=4)                   # the same workflow, one step appended
    with pytest.raises(WorkflowInputMismatchError):
        b.wf.run(2000)                      # not finished for b: its run had another input
    assert b.runs == []
    assert b.wf.run(1000) == 2111 and b.runs == [3]    # only the new step, from 1111
    h = b.wf.history()
    assert [r.step for r in h] == ["s0", "s1", "s2", "s3"] and h[-1].done and h[2].done
    assert b.wf.run() == 2111 and b.runs == [3]
    with pytest.raises(WorkflowFinishedError):
        b.wf.run(2000)


def test_inputs_that_cannot_be_judged_resume_as_before(store, monkeypatch):
    # an unpicklable input is not judged
    wf = Workflow(store, "fn-input")
    wf.add_step("call", lambda f: f())
    assert wf.run(lambda: 5) == 5
    assert wf.run(lambda: 6) == 5
    # checkpoints written before inputs were recorded (no "input" in their meta)
    a = Adder(store, wid="old")
    monkeypatch.setattr(wfmod, "_input_digest", lambda state: None)
    a.wf.run(1000)
    monkeypatch.undo()
    assert store.latest(a.wf.stream).reserved_meta["snapstore.workflow"]["input"] is None
    assert a.wf.run(2000) == 1111 and a.runs == [0, 1, 2]


def test_input_is_recorded_in_reserved_meta_not_user_meta(store):
    a = Adder(store)
    a.wf.run(1000, meta={"host": "h"})
    info = store.latest(a.wf.stream)
    ours = info.reserved_meta["snapstore.workflow"]
    assert ours["run"] == 0 and isinstance(ours["input"], str) and len(ours["input"]) == 32
    assert info.meta == {"host": "h"}


def test_workflow_errors_pickle(store):
    a = Adder(store)
    a.wf.run(1)
    with pytest.raises(WorkflowFinishedError) as exc:
        a.wf.run(2)
    back = pickle.loads(pickle.dumps(exc.value))
    assert type(back) is WorkflowFinishedError and str(back) == str(exc.value)


_RESUME_WITH_A_SET = r"""
import os, sys
import snapstore
from snapstore.workflow import Workflow

INPUT = {"tags": {"alpha", "beta", "gamma", "delta", "epsilon", "zeta"},
         "nested": frozenset({frozenset({"x", "y"}), frozenset({"z"})}),
         "by_key": {k: len(k) for k in {"p", "qq", "rrr", "ssss"}}}
with snapstore.open(sys.argv[1]) as store:
    wf = Workflow(store, "job")
    wf.add_step("first", lambda s: {**s, "n": 1})

    def second(s):
        if sys.argv[2] == "crash":
            os._exit(9)                 # killed before the second step's checkpoint
        return {**s, "n": 2}
    wf.add_step("second", second)
    if sys.argv[2] == "other":
        INPUT["tags"] = INPUT["tags"] | {"eta"}
    print(wf.run(INPUT)["n"])
"""


def test_a_set_in_the_input_resumes_in_a_process_with_another_hash_seed(tmp_path):
    """Regression: the input's digest was of its plain pickle, and a set of str (or a dict
    built from one) pickles in its iteration order, which PYTHONHASHSEED changes: the process
    resuming a crashed run took the same input for another one (WorkflowInputMismatchError).
    Equal sets and dicts now digest alike; another input is still refused."""
    import os
    import subprocess
    import sys

    def run(how, seed):
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        return subprocess.run([sys.executable, "-c", _RESUME_WITH_A_SET, str(tmp_path / "s"),
                               how], capture_output=True, text=True, env=env, timeout=120)
    assert run("crash", 1).returncode == 9
    other = run("other", 2)
    assert other.returncode == 1 and "WorkflowInputMismatchError" in other.stderr
    for seed in (2, 3):                 # resumed, then the finished run's result
        done = run("resume", seed)
        assert done.returncode == 0 and done.stdout.split() == ["2"], done.stderr


@pytest.mark.parametrize("pickler", [pickle.Pickler, wfmod._SharingCanonicalPickler])
def test_a_run_recorded_with_an_earlier_versions_digest_still_resumes(store, monkeypatch,
                                                                      pickler):
    """Runs started before the canonical digest recorded the digest of the plain pickle; runs
    of stop 41 the canonical pickle's with the memo."""
    a = Adder(store, fail_at=1)
    monkeypatch.setattr(wfmod, "_input_digest", lambda state: wfmod._digest(state, pickler))
    with pytest.raises(StepError):
        a.wf.run(1000)
    monkeypatch.undo()
    a.fail_at = None
    assert a.wf.run(1000) == 1111 and a.runs == [0, 1, 1, 2]
    with pytest.raises(WorkflowInputMismatchError):
        Adder(store, fail_at=None).wf.run(2000)


def test_an_equal_input_whose_objects_are_shared_otherwise_resumes_the_run():
    """Regression: the digest pickled with the memo, so {"start": day, "end": day} (one
    string twice) and the same dict read back from JSON (two equal strings) had different
    digests, and the process resuming a crashed run with its input rebuilt from a file got
    WorkflowInputMismatchError."""
    day = "2026-11-" + "23"
    shared = {"start": day, "end": day, "days": [[day]] * 2}
    rebuilt = json.loads(json.dumps(shared))
    assert shared == rebuilt and shared["start"] is shared["end"]
    assert rebuilt["start"] is not rebuilt["end"]
    assert wfmod._input_digest(shared) == wfmod._input_digest(rebuilt)
    assert not wfmod._other_input(rebuilt, wfmod._input_digest(shared))
    assert wfmod._other_input({**rebuilt, "end": "x"}, wfmod._input_digest(shared))


def test_an_input_that_refers_to_itself_is_still_judged():
    loop: list = [1, {2, 3}]
    loop.append(loop)
    digest = wfmod._input_digest(loop)
    assert digest is not None                          # by the pickler with the memo
    again: list = [1, {3, 2}]
    again.append(again)
    assert not wfmod._other_input(again, digest)
    other: list = [2, {2, 3}]
    other.append(other)
    assert wfmod._other_input(other, digest)


def test_a_rerun_interrupted_before_its_first_checkpoint_leaves_nothing(store):
    """As rerun()'s docstring says: nothing of it was recorded, so run() follows the earlier
    run and rerun() starts it again."""
    a = Adder(store, fail_at=None)
    assert a.wf.run(1000) == 1111
    a.fail_at = 0
    with pytest.raises(StepError):
        a.wf.rerun(2000)
    with pytest.raises(WorkflowFinishedError):
        a.wf.run(2000)
    assert a.wf.run() == 1111
    a.fail_at = None
    assert a.wf.rerun(2000) == 2111
