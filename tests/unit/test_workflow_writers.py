"""Workflows with many writers on one store (format 3): two runs of one workflow id, in two
processes or two Stores, never interleave their steps; the one overtaken stops with
WorkflowConflictError (a CommitConflict naming the workflow and the step), saving nothing."""
import multiprocessing
import os
import time
import traceback

import pytest

import snapstore
from snapstore.errors import CommitConflict, WorkflowConflictError
from snapstore.workflow import Workflow

STEPS = ("a", "b", "c", "d", "e")
TIMEOUT = 120


def _workflow(store, who, journal, barrier=None, codec="objects", delay=0.0):
    """Steps append (who, step) to the state and to a shared journal file; step "a" waits at
    the barrier, so both workers have read the (empty) workflow and run "a" before either
    checkpoints it, then sleeps `delay`."""
    wf = Workflow(store, "nightly", codec=codec)

    def make(name):
        def fn(state):
            if name == "a" and barrier is not None:
                barrier.wait(TIMEOUT)
                time.sleep(delay)
            with open(journal, "a") as f:
                f.write(f"{who} {name}\n")
            return state + [(who, name)]
        return fn
    for name in STEPS:
        wf.add_step(name, make(name))
    return wf


def _worker(who, path, journal, barrier, codec, delay, results):
    try:
        with snapstore.open(path, durability="none") as store:
            final = _workflow(store, who, journal, barrier, codec, delay).run([])
        results.put((who, "done", final))
    except WorkflowConflictError as exc:
        results.put((who, "conflict", (exc.workflow_id, exc.step, exc.expected, exc.found,
                                       exc.holder, str(exc), isinstance(exc, CommitConflict))))
    except BaseException:
        results.put((who, "error", traceback.format_exc()))


@pytest.mark.parametrize("codec, late", [("objects", None), ("pickle", None), ("objects", 1)])
def test_two_processes_running_one_workflow_id_never_interleave(tmp_path, codec, late):
    """Both run "a" from the empty workflow (a barrier in "a"); one checkpoints first and
    finishes, the other's checkpoint of "a" is refused. Racing freely (late=None) the refusal
    may meet the winner's commit in progress or done; with worker `late` sleeping in "a" the
    winner has finished meanwhile, so a commit that merely built on the head it found would
    have stored the loser's "a" on top of the winner's "e"."""
    path, journal = str(tmp_path / "s"), str(tmp_path / "journal")
    snapstore.open(path).close()
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(who, path, journal, barrier, codec,
                                               0.3 if who == late else 0.0, results))
             for who in (0, 1)]
    for p in procs:
        p.start()
    got = {}
    try:
        for _ in procs:
            who, kind, value = results.get(timeout=TIMEOUT)
            got[who] = (kind, value)
    finally:
        for p in procs:
            p.join(10)
    assert sorted(kind for kind, _ in got.values()) == ["conflict", "done"], got
    winner = next(who for who, (kind, _) in got.items() if kind == "done")
    loser = 1 - winner
    assert late is None or loser == late
    assert got[winner][1] == [(winner, s) for s in STEPS]
    workflow_id, step, expected, found, holder, message, is_conflict = got[loser][1]
    assert (workflow_id, step, expected) == ("nightly", "a", None) and is_conflict
    assert "workflow 'nightly'" in message and "step 'a'" in message
    if found is None:                 # met the winner's checkpoint of "a" in progress
        assert holder and "right now" in message and holder in message
    else:                             # or after it: the winner's checkpoint of "a"
        assert f"newest is checkpoint {found}" in message
    # the loser ran "a" (both passed the barrier) and nothing after it
    with open(journal) as f:
        ran = [tuple(line.split()) for line in f]
    assert sorted(r for r in ran if r[0] == str(loser)) == [(str(loser), "a")]
    assert [r[1] for r in ran if r[0] == str(winner)] == list(STEPS)
    with snapstore.open(path, readonly=True) as store:
        wf = _workflow(store, 9, journal)
        history = wf.history()
        assert [r.step for r in history] == list(STEPS)
        for r in history:                     # every checkpoint is the winner's state only
            assert wf.load(r.step) == [(winner, s) for s in STEPS[:r.index + 1]]


def test_a_run_overtaken_between_steps_stops_before_the_next(store_path, tmp_path):
    """Run 1 (Store one) checkpoints "a"; inside its step "b", run 2 (Store two, another
    writer) resumes from the same checkpoint and finishes. Run 1's checkpoint after "b" is
    refused (built on "a"'s, the newest is run 2's last), and "c" never runs in run 1."""
    journal = str(tmp_path / "journal")
    with snapstore.open(store_path, durability="none") as one, \
            snapstore.open(store_path, durability="none") as two:
        first = Workflow(one, "nightly")
        second = _workflow(two, 2, journal)
        ran = []

        def step(name):
            def fn(state):
                ran.append(name)
                if name == "b":
                    assert second.run() == [(1, "a"), (2, "b"), (2, "c"), (2, "d"), (2, "e")]
                return state + [(1, name)]
            return fn
        for name in STEPS:
            first.add_step(name, step(name))
        with pytest.raises(WorkflowConflictError) as exc:
            first.run([])
        e = exc.value
        history = second.history()
        assert (e.workflow_id, e.step) == ("nightly", "b")
        assert (e.expected, e.found) == (history[0].checkpoint_id, history[-1].checkpoint_id)
        assert ran == ["a", "b"]                                  # not "c"
        assert [r.step for r in history] == list(STEPS)
        assert first.load() == [(1, "a"), (2, "b"), (2, "c"), (2, "d"), (2, "e")]
        assert first.run() == first.load()                        # finished: runs nothing
        assert ran == ["a", "b"]


def test_a_run_overtaken_by_a_checkpoint_false_step_check(store_path, tmp_path):
    """Before every step (checkpointed or not) a run checks that the workflow's head is still
    its own last checkpoint: overtaken, it stops before running the step."""
    journal = str(tmp_path / "journal")
    with snapstore.open(store_path, durability="none") as one, \
            snapstore.open(store_path, durability="none") as two:
        first = Workflow(one, "nightly")
        ran = []
        first.add_step("a", lambda s: ran.append("a") or s + ["a"])
        first.add_step("b", lambda s: (ran.append("b"),
                                       _workflow(two, 2, journal).reset())[0] or s + ["b"],
                       checkpoint=False)
        first.add_step("c", lambda s: ran.append("c") or s + ["c"])
        with pytest.raises(WorkflowConflictError) as exc:
            first.run([])
        assert exc.value.step == "c" and ran == ["a", "b"]
        assert first.history() == []                              # the reset stands


def test_reset_against_a_run_that_checkpointed_meanwhile(store_path):
    """reset() commits its marker on the head it listed: a run that checkpointed since
    makes it raise WorkflowConflictError, nothing reset."""
    with snapstore.open(store_path, durability="none") as one, \
            snapstore.open(store_path, durability="none") as two:
        wf = Workflow(one, "w")
        wf.add_step("a", lambda s: s + 1)
        wf.add_step("b", lambda s: s + 1)
        other = Workflow(two, "w")
        other.add_step("a", lambda s: s + 1)
        other.add_step("b", lambda s: s + 1)
        assert wf.run(0) == 2
        real = one.checkpoints

        def list_then_rerun(*a, **k):          # the run commits between listing and marker
            out = real(*a, **k)
            one.checkpoints = real
            other.rerun(10)
            return out
        one.checkpoints = list_then_rerun
        with pytest.raises(WorkflowConflictError) as exc:
            wf.reset()
        assert exc.value.step == "" and exc.value.workflow_id == "w"
        assert wf.load() == 12 and len(wf.history()) == 4
        assert wf.reset() == 4 and wf.history() == []
        assert os.path.isdir(store_path)


def test_a_run_resuming_from_a_checkpoint_reset_meanwhile_is_a_conflict(store_path, monkeypatch):
    """Regression: run() read the head, another writer's reset() deleted it, and loading it
    raised a bare CheckpointNotFound (not among run()'s documented errors)."""
    with snapstore.open(store_path, durability="none") as one, \
            snapstore.open(store_path, durability="none") as two:
        fail = [True]

        def flaky(s):
            if fail[0]:
                raise ValueError("first run fails after step one")
            return s + ["two"]
        wf = Workflow(one, "w")
        wf.add_step("one", lambda s: s + ["one"])
        wf.add_step("two", flaky)
        with pytest.raises(snapstore.errors.StepError):
            wf.run([])
        fail[0] = False
        other = Workflow(two, "w")
        other.add_step("one", lambda s: s + ["one"])
        other.add_step("two", flaky)
        real = Workflow._read

        def read_after_a_reset(self, *args):
            monkeypatch.setattr(Workflow, "_read", real)
            other.reset()                        # between run()'s head and its load
            return real(self, *args)
        monkeypatch.setattr(Workflow, "_read", read_after_a_reset)
        with pytest.raises(WorkflowConflictError, match="was deleted meanwhile") as exc:
            wf.run([])
        assert exc.value.workflow_id == "w"
        assert wf.run([]) == ["one", "two"]      # run() again starts afresh
