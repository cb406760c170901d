"""Workflow: steps in order, resume after the last completed step, history/load/reset, failed
steps and failed checkpoints, checkpoint=False steps, tracing, bad input."""
import sys

import numpy as np
import pytest

import snapstore
from snapstore.errors import (CheckpointNotFound, InvalidArgumentError, InvalidArgumentTypeError,
                              ObjectSaveError, StoreClosedError, StoreIOError)
from snapstore.workflow import (CheckpointSaveError, StepError, Workflow, WorkflowFinishedError,
                                WorkflowInputMismatchError)

CODECS = ["objects", "pickle"]


class Counting:
    """A workflow of steps that append their name to the state and count their runs."""

    def __init__(self, store, workflow_id="wf", codec="objects", unchecked=(), fail_at=None,
                 n=5, **kw):
        self.runs = {}
        self.fail_at = fail_at
        self.wf = Workflow(store, workflow_id, codec=codec, **kw)
        for i in range(n):
            name = f"s{i}"
            self.wf.add_step(name, self._make(name), checkpoint=name not in unchecked)

    def _make(self, name):
        def fn(state):
            self.runs[name] = self.runs.get(name, 0) + 1
            if name == self.fail_at:
                raise RuntimeError(f"{name} broke")
            return state + [name]
        return fn


@pytest.mark.parametrize("codec", CODECS)
def test_run_history_load(store, codec):
    c = Counting(store, codec=codec)
    assert c.wf.run([]) == ["s0", "s1", "s2", "s3", "s4"]
    h = c.wf.history()
    assert [r.step for r in h] == ["s0", "s1", "s2", "s3", "s4"]
    assert [r.index for r in h] == [0, 1, 2, 3, 4]
    assert h[2].completed == ("s0", "s1", "s2")
    assert [r.done for r in h] == [False] * 4 + [True]
    assert all(r.sizes and r.bytes_new > 0 for r in h)
    assert [r.created for r in h] == sorted(r.created for r in h)
    assert c.wf.load("s1") == ["s0", "s1"]
    assert c.wf.load() == ["s0", "s1", "s2", "s3", "s4"]
    assert c.wf.completed == ("s0", "s1", "s2", "s3", "s4")
    # a completed workflow runs nothing and returns its final state, for the same input or
    # none; another input is an error now (it used to be silently ignored: issue 15)
    assert c.wf.run([]) == ["s0", "s1", "s2", "s3", "s4"]
    assert c.wf.run() == ["s0", "s1", "s2", "s3", "s4"]
    with pytest.raises(WorkflowFinishedError, match="rerun"):
        c.wf.run(["ignored"])
    assert set(c.runs.values()) == {1}


@pytest.mark.parametrize("codec", CODECS)
def test_failing_step_then_resume_after_last_completed(store, codec):
    c = Counting(store, codec=codec, fail_at="s3")
    with pytest.raises(StepError) as err:
        c.wf.run([])
    assert err.value.step == "s3" and err.value.workflow_id == "wf"
    assert "s3" in str(err.value) and isinstance(err.value.__cause__, RuntimeError)
    assert [r.step for r in c.wf.history()] == ["s0", "s1", "s2"]    # s3 left nothing
    assert c.wf.load() == ["s0", "s1", "s2"]
    c.fail_at = None
    with pytest.raises(WorkflowInputMismatchError, match="rerun"):   # not silently ignored
        c.wf.run(["another input"])
    assert c.runs["s3"] == 1                                          # nothing ran
    assert c.wf.run([]) == ["s0", "s1", "s2", "s3", "s4"]             # same input: resumes
    assert c.runs == {"s0": 1, "s1": 1, "s2": 1, "s3": 2, "s4": 1}
    # a second Workflow object (as after a process restart) sees the same
    again = Counting(store, codec=codec)
    assert again.wf.run([]) == ["s0", "s1", "s2", "s3", "s4"] and again.runs == {}


def test_unchecked_steps_rerun_and_are_recorded(store):
    c = Counting(store, unchecked=("s1", "s2"), fail_at="s3")
    with pytest.raises(StepError):
        c.wf.run([])
    assert [r.step for r in c.wf.history()] == ["s0"]
    c.fail_at = None
    assert c.wf.run([]) == ["s0", "s1", "s2", "s3", "s4"]
    assert c.runs == {"s0": 1, "s1": 2, "s2": 2, "s3": 2, "s4": 1}
    h = c.wf.history()
    assert [r.step for r in h] == ["s0", "s3", "s4"]
    assert h[1].completed == ("s0", "s1", "s2", "s3")
    with pytest.raises(CheckpointNotFound, match="checkpoint=False"):
        c.wf.load("s1")


def test_last_step_unchecked_still_records_completion(store):
    c = Counting(store, unchecked=("s4",))
    c.wf.run([])
    assert c.wf.history()[-1].step == "s4" and c.wf.history()[-1].done
    assert c.wf.run([]) == ["s0", "s1", "s2", "s3", "s4"] and c.runs["s4"] == 1


def test_decorator_forms(store):
    wf = Workflow(store, "deco")

    @wf.step
    def first(s):
        return s + 1

    @wf.step(checkpoint=False)
    def second(s):
        return s * 10

    @wf.step(name="third-step")
    def third(s):
        return s - 3
    assert [(s.name, s.checkpoint) for s in wf.steps] == [
        ("first", True), ("second", False), ("third-step", True)]
    assert first(1) == 2                         # the decorator returns the function
    assert wf.run(1) == 17
    assert [r.step for r in wf.history()] == ["first", "third-step"]


@pytest.mark.parametrize("codec", CODECS)
def test_reset_starts_over(store, codec):
    c = Counting(store, codec=codec)
    c.wf.run([])
    assert c.wf.reset() == 5
    assert c.wf.history() == [] and c.wf.completed == ()
    with pytest.raises(CheckpointNotFound):
        c.wf.load()
    assert c.wf.run(["new"]) == ["new", "s0", "s1", "s2", "s3", "s4"]
    assert c.wf.reset() == 5 and c.wf.reset() == 0
    assert store.checkpoints(c.wf.stream) == []


def test_reset_interrupted_halfway_still_starts_over(store, monkeypatch):
    c = Counting(store)
    c.wf.run([])
    real = store.delete
    calls = []

    def failing_delete(cid):
        calls.append(cid)
        if len(calls) == 3:
            raise StoreIOError("simulated crash during reset")
        real(cid)
    monkeypatch.setattr(store, "delete", failing_delete)
    with pytest.raises(StoreIOError):
        c.wf.reset()
    monkeypatch.setattr(store, "delete", real)
    assert c.wf.history() == [] and c.wf.completed == ()
    assert c.wf.run(["fresh"]) == ["fresh", "s0", "s1", "s2", "s3", "s4"]
    assert [r.step for r in c.wf.history()] == ["s0", "s1", "s2", "s3", "s4"]
    c.wf.reset()
    assert store.checkpoints(c.wf.stream) == []


@pytest.mark.parametrize("codec", CODECS)
def test_failed_checkpoint_stops_the_workflow(store, monkeypatch, codec):
    c = Counting(store, codec=codec)
    real = {"objects": store.save, "pickle": store.checkpoint}[codec]
    saved = []

    def flaky(*a, **k):
        if len(saved) == 2:
            raise StoreIOError("No space left on device", 28)
        saved.append(1)
        return real(*a, **k)
    monkeypatch.setattr(store, "save" if codec == "objects" else "checkpoint", flaky)
    with pytest.raises(CheckpointSaveError) as err:
        c.wf.run([])
    assert err.value.step == "s2" and isinstance(err.value.__cause__, StoreIOError)
    assert "s3" not in c.runs                              # stopped: the next step never ran
    monkeypatch.undo()
    assert c.wf.completed == ("s0", "s1")
    assert c.wf.run([]) == ["s0", "s1", "s2", "s3", "s4"]
    assert c.runs["s2"] == 2 and c.runs["s0"] == 1


def test_store_closed_mid_run_is_a_checkpoint_error(store_path):
    store = snapstore.open(store_path, durability="none")
    wf = Workflow(store, "closing")
    wf.add_step("a", lambda s: s + 1)
    wf.add_step("close", lambda s: (store.close(), s + 1)[1])
    wf.add_step("never", lambda s: pytest.fail("ran after a failed checkpoint"))
    with pytest.raises(CheckpointSaveError) as err:
        wf.run(0)
    assert isinstance(err.value.__cause__, StoreClosedError)


@pytest.mark.parametrize("codec", CODECS)
def test_unpicklable_state_is_a_type_error_nothing_written(store, codec):
    wf = Workflow(store, "bad-state", codec=codec)
    wf.add_step("ok", lambda s: s + [1])
    wf.add_step("lambda", lambda s: s + [lambda: 0])
    wf.add_step("never", lambda s: pytest.fail("ran after an unpicklable state"))
    with pytest.raises(TypeError, match="lambda") as raised:
        wf.run([])
    # a snapstore error (ObjectSaveError, a TypeError too), as every error of the API
    assert isinstance(raised.value, ObjectSaveError), type(raised.value)
    assert [r.step for r in wf.history()] == ["ok"]
    assert len(store.checkpoints()) == 1


def test_numpy_state_is_incremental_with_objects(store):
    wf = Workflow(store, "arrays", codec="objects")
    wf.add_step("init", lambda s: {"w": np.zeros(1 << 18), "step": 0})   # 2 MiB

    def touch(s):
        s["w"][:100] += 1
        return {"w": s["w"], "step": s["step"] + 1}
    wf.add_step("touch", touch)
    final = wf.run()
    h = wf.history()
    assert h[1].bytes_new < 64 << 10 < (2 << 20)
    assert np.array_equal(wf.load("init")["w"], np.zeros(1 << 18))
    assert final["step"] == 1 and wf.load()["w"][0] == 1


def test_run_meta_and_definition_changes(store):
    c = Counting(store, n=3)
    c.wf.run([], meta={"host": "a", "attempt": 1})
    assert [r.meta for r in c.wf.history()] == [{"host": "a", "attempt": 1}] * 3
    other = Workflow(store, "wf")
    other.add_step("s0", lambda s: s)
    other.add_step("renamed", lambda s: s)
    with pytest.raises(InvalidArgumentError, match="reset"):
        other.run([])
    longer = Counting(store, n=4)            # a step appended later runs after the others
    assert longer.wf.run([]) == ["s0", "s1", "s2", "s3"] and longer.runs == {"s3": 1}


def test_workflow_ids_are_isolated_and_any_string(store):
    ids = ["a", "a/b", "x" * 500, "with\0nul", "üñí", "\ud800"]
    for i, wid in enumerate(ids):
        wf = Workflow(store, wid)
        wf.add_step("only", lambda s, i=i: s + i)
        assert wf.run(100) == 100 + i
    for i, wid in enumerate(ids):
        assert Workflow(store, wid).load() == 100 + i
    assert all(len(s.encode("utf-8", "surrogatepass")) <= 255 for s in store.streams())


def test_read_only_store_reads_history(store_path):
    with snapstore.open(store_path, durability="none") as s:
        Counting(s, n=2).wf.run([])
    with snapstore.open(store_path, readonly=True) as ro:
        wf = Workflow(ro, "wf")
        assert [r.step for r in wf.history()] == ["s0", "s1"] and wf.load() == ["s0", "s1"]


def test_bad_input_writes_nothing(store):
    with pytest.raises(InvalidArgumentTypeError):
        Workflow("store", "x")
    with pytest.raises(InvalidArgumentTypeError):
        Workflow(store, 42)
    with pytest.raises(InvalidArgumentError):
        Workflow(store, "")
    with pytest.raises(InvalidArgumentError):
        Workflow(store, "x", codec="json")
    wf = Workflow(store, "x")
    wf.add_step("a", lambda s: s)
    with pytest.raises(ValueError, match="already used"):
        wf.add_step("a", lambda s: s)
    with pytest.raises(ValueError, match="already used"):
        @wf.step
        def a(s):
            return s
    with pytest.raises(InvalidArgumentTypeError):
        wf.add_step(3, lambda s: s)
    with pytest.raises(InvalidArgumentError):
        wf.add_step("", lambda s: s)
    with pytest.raises(InvalidArgumentTypeError):
        wf.add_step("b", "not callable")
    with pytest.raises(InvalidArgumentTypeError):
        wf.add_step("b", lambda s: s, checkpoint="yes")
    with pytest.raises(InvalidArgumentTypeError):
        wf.step("b")
    with pytest.raises(InvalidArgumentTypeError, match="takes a function, got int"):
        wf.step(5)                  # (said "step name must not be empty")
    with pytest.raises(InvalidArgumentTypeError):
        wf.run(0, meta={"x": object()})
    with pytest.raises(InvalidArgumentError):
        Workflow(store, "empty").run()
    with pytest.raises(InvalidArgumentTypeError):
        wf.load(3)
    assert len(wf.steps) == 1 and store.checkpoints() == []
    store.close()
    with pytest.raises(StoreClosedError):
        Workflow(store, "y")


# ---- tracing ---------------------------------------------------------------------------------
class FakeSpan:
    def __init__(self, name, attributes):
        self.name, self.attributes = name, dict(attributes)

    def set_attribute(self, key, value):
        self.attributes[key] = value


class FakeTracer:
    def __init__(self):
        self.spans = []

    def start_as_current_span(self, name, attributes=None):
        import contextlib
        span = FakeSpan(name, attributes or {})
        self.spans.append(span)
        return contextlib.nullcontext(span)


def test_spans_name_workflow_step_checkpoint_and_resume(store):
    tracer = FakeTracer()
    c = Counting(store, unchecked=("s1",), fail_at="s2", n=3, tracer=tracer)
    with pytest.raises(StepError):
        c.wf.run([])
    run, s0, s1, s2 = tracer.spans
    assert run.name == "snapstore.workflow.run"
    assert run.attributes["snapstore.workflow.id"] == "wf"
    assert run.attributes["snapstore.workflow.resumed"] is False
    assert [s.attributes["snapstore.workflow.step"] for s in (s0, s1, s2)] == ["s0", "s1", "s2"]
    assert s0.attributes["snapstore.checkpoint.id"] == c.wf.history()[0].checkpoint_id
    assert "snapstore.checkpoint.id" not in s1.attributes           # not checkpointed
    tracer.spans.clear()
    c.fail_at = None
    c.wf.run([])
    run, s1, s2 = tracer.spans                                       # s0 is not run again
    assert run.attributes["snapstore.workflow.resumed"] is True
    assert run.attributes["snapstore.workflow.resumed_after"] == "s0"
    assert s1.attributes["snapstore.workflow.resumed"] is True
    assert run.attributes["snapstore.checkpoint.id"] == c.wf.history()[-1].checkpoint_id


def test_real_opentelemetry_api_and_its_absence(store, monkeypatch):
    pytest.importorskip("opentelemetry.trace")
    wf = Workflow(store, "otel")                 # the API's default (no-op) tracer
    assert wf._tracer is not None
    wf.add_step("a", lambda s: s + 1)
    assert wf.run(1) == 2
    monkeypatch.setitem(sys.modules, "opentelemetry", None)   # as if not installed
    wf2 = Workflow(store, "no-otel")
    assert wf2._tracer is None
    wf2.add_step("a", lambda s: s + 1)
    assert wf2.run(1) == 2
    wf3 = Workflow(store, "off", tracer=False)
    assert wf3._tracer is None
