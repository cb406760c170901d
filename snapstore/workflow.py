"""Step workflows that resume after a crash: a list of steps, the state checkpointed after
each, and run() continuing after the last completed step.

    wf = Workflow(store, "ingest-2024-06-01")

    @wf.step
    def fetch(state):
        return {**state, "rows": download()}

    @wf.step(checkpoint=False)          # cheap and idempotent: re-run after a crash instead
    def clean(state):
        return {**state, "rows": [r for r in state["rows"] if r]}

    final = wf.run({"day": "2024-06-01"})   # after a crash, the same call resumes
    wf.run({"day": "2024-06-01"})           # finished: returns the stored result, runs nothing
    wf.rerun({"day": "2024-06-02"})         # a new run of the same workflow (history kept)

Mapping (docs/integrations.md): a workflow is the stream ``wf/<workflow id>``; every
checkpointed step adds one snapstore checkpoint holding the state after that step, saved with
store.save() (pickle protocol 5, large buffers out of band as page-diffed buffers) or, when the
object layer is absent, as one pickled buffer ``"state"``. Its meta records the workflow id,
the step's name and index, every step completed so far (checkpointed or not), whether the
workflow is done, and the caller's run meta.

Runs and inputs: a run is started with an input (run(state) on a workflow without
checkpoints, or rerun(state)); every checkpoint of the run records a digest of that input
(BLAKE2b of its pickle) and the run's number. run(state) then resumes that run, or returns its
stored result once it finished, only for the same input or for none (state=None): a different
input raises WorkflowFinishedError (finished) or WorkflowInputMismatchError (unfinished) instead
of being ignored. "Same" means it pickles to the same bytes, with sets, frozensets and dicts
pickled in a canonical order (equal ones alike in any process, whatever its PYTHONHASHSEED; a
run recorded by an older version with the plain pickle's digest is matched by that too); an
input that cannot be pickled, and checkpoints written before inputs were recorded, are not
judged (resumed as before).
rerun(state) starts a new run from the first step; history() keeps the earlier runs
(StepRecord.run), load() and completed describe the latest run; reset() forgets all runs.

Changing the steps: a step appended to a finished workflow runs on the next run() (same input
or none), from the stored final state; the steps already completed do not run again. Steps
renamed, removed or reordered before the last completed one make run() raise
InvalidArgumentError (reset() or rerun() to start over).

Guarantees: a step whose checkpoint committed never runs again (run() starts after the last
completed step); a step that raises leaves the last checkpoint as it was and comes out as
StepError naming the step; a checkpoint that cannot be saved stops the workflow with
CheckpointSaveError (or ObjectSaveError, a TypeError, for a state that cannot be pickled),
the next step does not run. Steps run after the last checkpoint, or declared checkpoint=False, run again after a crash,
so steps should be idempotent (a crash between a step's side effects and its checkpoint
repeats them).

Many workers: any number of processes may run workflows in one store; two runs of the same
workflow id never interleave their steps. Each checkpoint a run saves is a compare-and-swap on
the workflow's stream (expect_head: the checkpoint the run resumed from, then the one it last
wrote), and before each step the run checks that nobody else checkpointed the workflow since:
a run that another run overtook stops with WorkflowConflictError (a CommitConflict naming the
workflow and the step), saving nothing. The step it was running may have run in both (as after
a crash: steps should be idempotent); run() again resumes from the newest checkpoint.

Tracing: with ``opentelemetry-api`` installed, run() is a span "snapstore.workflow.run" and each
step a child span "snapstore.workflow.step", with the workflow id, step name and index, the
checkpoint id and whether the run resumed. Without it nothing is traced.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import pickle
from dataclasses import dataclass
from typing import Any, Callable

from snapstore.errors import (CheckpointNotFound, CheckpointSaveError, CommitConflict,
                              InvalidArgumentError, InvalidArgumentTypeError,
                              ObjectSaveError, StepError,
                              WorkflowConflictError, WorkflowFinishedError,
                              WorkflowInputMismatchError)
from snapstore.engine.validation import validate_meta
from snapstore.objectlayer import WORKFLOW_META_KEY as META_KEY
from snapstore.objectlayer import layer_meta
from snapstore.store import CheckpointInfo, Store

__all__ = ["Workflow", "Step", "StepRecord", "StepError", "CheckpointSaveError",
           "WorkflowConflictError", "WorkflowFinishedError", "WorkflowInputMismatchError",
           "META_KEY"]

STATE_BUFFER = "state"                # the pickled state (codec "pickle")
CODECS = ("auto", "objects", "pickle")
_MAX_PLAIN_ID = 200                   # longer ids (or ids with NUL) use a hashed stream name


# StepError, CheckpointSaveError, WorkflowConflictError, WorkflowFinishedError,
# WorkflowInputMismatchError: defined in snapstore.errors (importable from here too).


@dataclass(frozen=True)
class Step:
    """A registered step: fn(state) -> new state; checkpoint=False skips its checkpoint."""
    name: str
    fn: Callable[[Any], Any]
    checkpoint: bool = True


@dataclass(frozen=True)
class StepRecord:
    """One checkpoint of a workflow, as history() lists them."""
    step: str                 # the step after which the state was saved
    index: int                # its position in the workflow (0-based)
    checkpoint_id: int
    created: float            # seconds since the epoch
    sizes: dict               # {buffer name: bytes} of the checkpoint
    bytes_new: int            # bytes this checkpoint added to the store
    completed: tuple          # names of all steps completed at that point
    done: bool                # every step of the workflow had completed
    meta: Any                 # the run(meta=...) of the run that saved it
    run: int = 0              # the run it belongs to: 0, then one more per rerun()


def _stream_name(workflow_id: str) -> str:
    raw = workflow_id.encode("utf-8", "surrogatepass")
    try:
        workflow_id.encode("utf-8")
        plain = len(raw) <= _MAX_PLAIN_ID and b"\0" not in raw
    except UnicodeEncodeError:
        plain = False
    if plain:
        return "wf/" + workflow_id
    return "wf#" + hashlib.blake2b(raw, digest_size=16).hexdigest()


def _ours(info: CheckpointInfo) -> dict | None:
    """Our bookkeeping in a checkpoint's reserved meta (None for anything else in the
    stream)."""
    ours = layer_meta(info, META_KEY)
    return ours if isinstance(ours, dict) else None


class _DigestWriter:
    def __init__(self) -> None:
        self.hash = hashlib.blake2b(digest_size=16)

    def write(self, data) -> int:
        self.hash.update(data)
        return len(memoryview(data))


class _CanonicalPickler(pickle.Pickler):
    """Pickles equal inputs alike. Sets and dicts whatever their iteration order: a set of
    str iterates in another order in a process with another PYTHONHASHSEED, so the same input
    looked like another one to the process that resumed a run after a crash. Only the exact
    types (an OrderedDict's order is part of its equality; subclasses may keep more). Through
    persistent_id, the one hook the pickler asks about every object (reducer_override is not
    asked about dicts and sets). And without the memo (`fast`): with it, an object met twice
    is pickled once and then referred to, so an input that holds one string twice and an equal
    one read back from JSON (two strings) pickled differently. The output is only ever
    hashed, never unpickled."""
    shared = False          # the memo is off

    def __init__(self, file, protocol: int) -> None:
        super().__init__(file, protocol=protocol)
        self.fast = not self.shared

    def persistent_id(self, obj):
        kind = type(obj)
        if kind is set or kind is frozenset:
            return kind.__name__, sorted(_canonical_pickle(x, type(self)) for x in obj)
        if kind is dict:
            return "dict", sorted(((_canonical_pickle(k, type(self)), v)
                                   for k, v in obj.items()), key=lambda kv: kv[0])
        return None


class _SharingCanonicalPickler(_CanonicalPickler):
    """_CanonicalPickler with the memo: the digest runs recorded in stop 41, and the one of
    inputs that refer to themselves (which cannot be pickled without it)."""
    shared = True


def _canonical_pickle(obj: Any, pickler: type) -> bytes:
    return _pickled(obj, pickler, io.BytesIO()).getvalue()


def _pickled(obj: Any, pickler: type, out):
    pickler(out, protocol=5).dump(obj)
    return out


def _digest(state: Any, pickler: type) -> str | None:
    """BLAKE2b of state's pickle by pickler, streamed (no copy of the whole pickle); None
    when it cannot be pickled so."""
    try:
        return _pickled(state, pickler, _DigestWriter()).hash.hexdigest()
    except Exception:
        return None


# The digests a run may have recorded of its input, newest first: this version's, then
# earlier versions' (stop 41: canonical with the memo; before it: the plain pickle's).
_DIGEST_PICKLERS = (_CanonicalPickler, _SharingCanonicalPickler, pickle.Pickler)


def _input_digest(state: Any) -> str | None:
    """The digest a run records of its input: canonical (equal inputs pickle alike), with the
    memo only for an input that refers to itself; None when it cannot be pickled (such
    inputs are not judged)."""
    return _digest(state, _CanonicalPickler) or _digest(state, _SharingCanonicalPickler)


def _other_input(state: Any, recorded: str) -> bool:
    """Whether state is known not to be the input whose digest a run recorded (False when
    it cannot be told): none of the digests this or an earlier version would have recorded
    of it is the recorded one."""
    digests = [_digest(state, pickler) for pickler in _DIGEST_PICKLERS]
    return any(d is not None for d in digests) and recorded not in digests


def _default_tracer() -> Any:
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    return trace.get_tracer("snapstore.workflow")


class Workflow:
    """Steps run in order over a state, checkpointed into a store after each step.

    Args:
        store: an open snapstore Store (writable to run, reset; read-only is enough for
            history and load).
        workflow_id: the workflow's name in the store (any non-empty str).
        codec: "auto" (store.save when snapstore.objects exists, else "pickle"), "objects" or
            "pickle" (the state pickled into one buffer). Checkpoints record their codec, so
            load() reads either.
        tracer: an OpenTelemetry Tracer (default: opentelemetry's global one when
            opentelemetry-api is installed, else no tracing); False disables tracing.
    Raises: InvalidArgumentTypeError (store, workflow_id), InvalidArgumentError (empty id, codec),
        StoreClosedError.
    """

    def __init__(self, store: Store, workflow_id: str, *, codec: str = "auto",
                 tracer: Any = None) -> None:
        if not isinstance(store, Store):
            raise InvalidArgumentTypeError(f"store must be a snapstore Store, got "
                                           f"{type(store).__name__}")
        if not isinstance(workflow_id, str):
            raise InvalidArgumentTypeError(f"workflow_id must be a str, got "
                                           f"{type(workflow_id).__name__}")
        if not workflow_id:
            raise InvalidArgumentError("workflow_id must not be empty")
        if codec not in CODECS:
            raise InvalidArgumentError(f"codec must be one of {', '.join(CODECS)}; got {codec!r}")
        if codec == "auto":
            codec = "objects" if importlib.util.find_spec("snapstore.objects") else "pickle"
        self.store = store
        self.workflow_id = workflow_id
        self.stream = _stream_name(workflow_id)
        self.codec = codec
        self._tracer = _default_tracer() if tracer is None else (tracer or None)
        self._steps: list[Step] = []
        store.latest(self.stream)             # StoreClosedError now rather than mid-run

    def __repr__(self) -> str:
        return f"<Workflow {self.workflow_id!r}: {len(self._steps)} steps>"

    # ---- definition -------------------------------------------------------------------------
    @property
    def steps(self) -> tuple[Step, ...]:
        return tuple(self._steps)

    def add_step(self, name: str, fn: Callable[[Any], Any], checkpoint: bool = True
                 ) -> Callable[[Any], Any]:
        """Appends a step: fn(state) returns the new state. Returns fn.
        Raises: InvalidArgumentTypeError (name not a str, fn not callable, checkpoint not a
        bool),
        InvalidArgumentError (empty or repeated name)."""
        if not isinstance(name, str):
            raise InvalidArgumentTypeError(f"step name must be a str, got "
                                           f"{type(name).__name__}")
        if not name:
            raise InvalidArgumentError("step name must not be empty")
        if not callable(fn):
            raise InvalidArgumentTypeError(f"step {name!r}: fn must be callable, got "
                                           f"{type(fn).__name__}")
        if not isinstance(checkpoint, bool):
            raise InvalidArgumentTypeError(f"step {name!r}: checkpoint must be a bool")
        if any(s.name == name for s in self._steps):
            raise InvalidArgumentError(f"step name {name!r} is already used in workflow "
                                       f"{self.workflow_id!r}")
        self._steps.append(Step(name, fn, checkpoint))
        return fn

    def step(self, fn: Any = None, *, name: str | None = None, checkpoint: bool = True) -> Any:
        """Decorator registering a step: ``@wf.step``, ``@wf.step(checkpoint=False)``,
        ``@wf.step(name="load")``; the step's name defaults to the function's name."""
        if isinstance(fn, str):
            raise InvalidArgumentTypeError("use @wf.step(name=...) to name a step")
        if fn is not None and not callable(fn):
            raise InvalidArgumentTypeError(f"@wf.step takes a function, got "
                                           f"{type(fn).__name__}")

        def register(f: Callable[[Any], Any]) -> Callable[[Any], Any]:
            return self.add_step(name if name is not None else getattr(f, "__name__", ""),
                                 f, checkpoint)
        return register(fn) if fn is not None else register

    # ---- reading ----------------------------------------------------------------------------
    def _current(self) -> list[tuple[CheckpointInfo, dict]]:
        """The checkpoints of this workflow's latest run, oldest first."""
        records = self._records()
        if not records:
            return []
        run = records[-1][1].get("run", 0)
        return [(info, o) for info, o in records if o.get("run", 0) == run]

    def _records(self) -> list[tuple[CheckpointInfo, dict]]:
        """This workflow's checkpoints since the last reset (every run), oldest first."""
        out: list = []
        for info in self.store.checkpoints(self.stream):
            ours = _ours(info)
            if ours is None or ours.get("workflow") != self.workflow_id:
                continue
            if ours.get("kind") == "reset":
                out = []
            else:
                out.append((info, ours))
        return out

    def _latest(self, head: Any = False) -> tuple[CheckpointInfo, dict] | None:
        """The latest run's latest checkpoint and our meta of it, given the stream's head
        (read now if not given)."""
        info = self.store.latest(self.stream) if head is False else head
        if info is None:
            return None
        ours = _ours(info)
        if ours is not None and ours.get("workflow") == self.workflow_id:
            return None if ours.get("kind") == "reset" else (info, ours)
        records = self._records()          # something else is the head: look further back
        return records[-1] if records else None

    def history(self) -> list[StepRecord]:
        """The workflow's checkpoints since it started (or was reset), oldest first: every
        run's (StepRecord.run tells them apart; rerun() keeps the earlier runs)."""
        return [StepRecord(o["step"], o["index"], info.id, info.created, dict(info.sizes),
                           info.bytes_new, tuple(o["completed"]), bool(o["done"]), o.get("user"),
                           o.get("run", 0))
                for info, o in self._records()]

    @property
    def completed(self) -> tuple[str, ...]:
        """Names of the steps the latest run completed as of its latest checkpoint (empty if
        none)."""
        latest = self._latest()
        return tuple(latest[1]["completed"]) if latest else ()

    def load(self, step: str | None = None) -> Any:
        """The state after the given step of the latest run (default: after the latest
        checkpointed step).
        Raises: CheckpointNotFound (no checkpoint, or that step has none: it has not run yet
        or is a checkpoint=False step), InvalidArgumentTypeError (step not a str)."""
        if step is None:
            latest = self._latest()
            if latest is None:
                raise CheckpointNotFound(f"workflow {self.workflow_id!r} has no checkpoint")
            return self._read(*latest)
        if not isinstance(step, str):
            raise InvalidArgumentTypeError(f"step must be a str or None, got "
                                           f"{type(step).__name__}")
        for info, ours in reversed(self._current()):
            if ours["step"] == step:
                return self._read(info, ours)
        unchecked = any(s.name == step and not s.checkpoint for s in self._steps)
        raise CheckpointNotFound(f"workflow {self.workflow_id!r} has no checkpoint after step "
                                 f"{step!r}" + (" (a checkpoint=False step)" if unchecked else ""))

    def _read(self, info: CheckpointInfo, ours: dict) -> Any:
        if ours.get("codec") == "pickle":
            return pickle.loads(self.store.read(info.id, STATE_BUFFER))
        return self.store.load(info.id)

    # ---- writing ----------------------------------------------------------------------------
    def _save(self, state: Any, ours: dict, expect: int | None) -> CheckpointInfo:
        meta = {META_KEY: ours}
        if self.codec == "pickle":
            try:
                data = pickle.dumps(state, protocol=5)
            except Exception as exc:
                raise ObjectSaveError(f"the state after step {ours['step']!r} of workflow "
                                      f"{self.workflow_id!r} cannot be pickled: {exc}",
                                      "state") from exc
            return self.store.checkpoint({STATE_BUFFER: data}, stream=self.stream, meta=meta,
                                         expect_head=expect)
        try:
            return self.store.save(state, stream=self.stream, meta=meta, expect_head=expect)
        except ObjectSaveError as exc:    # unpicklable, nothing written
            raise ObjectSaveError(f"the state after step {ours['step']!r} of workflow "
                                  f"{self.workflow_id!r} cannot be pickled: {exc}",
                                  exc.path) from exc

    def _checkpoint(self, state: Any, ours: dict, expect: int | None) -> CheckpointInfo:
        """Saves the state after a step, only on top of checkpoint `expect` (None: on an
        empty stream)."""
        try:
            return self._save(state, ours, expect)
        except TypeError:
            raise                          # unpicklable state (ObjectSaveError: nothing written)
        except CommitConflict as exc:
            raise self._conflict(ours["step"], expect, exc.found, exc) from exc
        except Exception as exc:
            raise CheckpointSaveError(
                f"workflow {self.workflow_id!r} stopped: the checkpoint after step "
                f"{ours['step']!r} could not be saved: {exc}",
                workflow_id=self.workflow_id, step=ours["step"]) from exc

    def _conflict(self, step: str, expect: int | None, found: int | None,
                  cause: CommitConflict | None = None) -> WorkflowConflictError:
        """The error of a run that another run of the workflow overtook."""
        built = (f"checkpoint {expect}" if expect is not None else "no checkpoint (a fresh "
                 "start)")
        holder = cause.holder if cause is not None else None
        if found == expect and holder:
            other = f"another run of this workflow is checkpointing it right now ({holder})"
        else:
            other = (f"another run of this workflow checkpointed it meanwhile (this run built "
                     f"on {built}, the workflow's newest is "
                     + (f"checkpoint {found})" if found is not None else "none)"))
        what = (f"the state after step {step!r} was not saved and" if step else
                "nothing was reset, and")
        return WorkflowConflictError(
            f"workflow {self.workflow_id!r}: {other}: {what} this run stopped, so the two "
            "runs' steps never interleave. run() again resumes from the newest checkpoint",
            workflow_id=self.workflow_id, step=step, stream=self.stream, expected=expect,
            found=found, holder=holder)

    def _check_not_overtaken(self, step: str, expect: int | None) -> None:
        """Before running a step: stop if another run checkpointed the workflow since this
        run's last checkpoint (it would redo the step for nothing: its checkpoint would be
        refused). The compare-and-swap at the checkpoint is what guarantees it."""
        head = self.store.latest(self.stream)
        found = head.id if head is not None else None
        if found != expect:
            raise self._conflict(step, expect, found)

    def _span(self, name: str, attributes: dict):
        if self._tracer is None:
            return contextlib.nullcontext(None)
        return self._tracer.start_as_current_span(name, attributes=attributes)

    def run(self, state: Any = None, *, meta: Any = None) -> Any:
        """Runs the steps after the last completed one and returns the final state.

        A workflow without checkpoints starts a run from ``state``. Otherwise run() resumes
        the latest run from its latest checkpoint (``state`` is not used: the stored state is
        the input of the next step), or, when that run has finished, returns its stored final
        state and runs nothing (idempotent). It does so only for the run's own input or for
        none (state=None): another input raises WorkflowFinishedError (finished run) or
        WorkflowInputMismatchError (unfinished run), see the module doc; rerun(state) starts
        a new run with it. Steps appended since the run finished run now, from its final
        state. ``meta`` (JSON) is stored with every checkpoint this call saves (history()
        shows it).
        Raises: StepError (a step raised), CheckpointSaveError (a checkpoint failed), TypeError
        (unpicklable state; meta not JSON), WorkflowFinishedError, WorkflowInputMismatchError,
        InvalidArgumentError (no steps, or the checkpoints record steps that do not match the
        registered ones: reset() or rerun() to start over), WorkflowConflictError (another
        run of the workflow checkpointed it meanwhile: this run stopped, nothing of its
        current step saved; run() again resumes from the newest checkpoint).
        """
        steps, meta = self._check_steps(), validate_meta(meta)
        names = [s.name for s in steps]
        head = self.store.latest(self.stream)         # what every checkpoint of this run
        expect = head.id if head is not None else None  # builds on, first this
        latest = self._latest(head)
        if latest is None:
            return self._execute(steps, state, None, 0, _input_digest(state), meta, expect)
        info, ours = latest
        completed = list(ours["completed"])
        if completed != names[:len(completed)]:
            raise InvalidArgumentError(
                f"workflow {self.workflow_id!r} was checkpointed after steps {completed}, "
                f"which are not the first steps of {names}; reset() or rerun() to start over")
        recorded = ours.get("input")
        if state is not None and recorded is not None:
            if _other_input(state, recorded):
                self._refuse_input(completed == names)
        return self._execute(steps, None, latest, ours.get("run", 0), recorded, meta, expect)

    def rerun(self, state: Any = None, *, meta: Any = None) -> Any:
        """Starts a new run of the workflow from its first step with ``state`` as input and
        returns its final state. The earlier runs' checkpoints stay (history() lists them,
        StepRecord.run numbers the runs); load(), completed and later run() calls follow the
        new run. If it is interrupted after its first step's checkpoint, run(state) with the
        same input resumes it (rerun() again would start yet another run). One interrupted
        before that left nothing of itself in the store: run() still follows the earlier run
        then (WorkflowFinishedError for this input), so start it again with rerun(state).
        Raises: as run()."""
        steps, meta = self._check_steps(), validate_meta(meta)
        head = self.store.latest(self.stream)
        records = self._records()
        number = records[-1][1].get("run", 0) + 1 if records else 0
        return self._execute(steps, state, None, number, _input_digest(state), meta,
                             head.id if head is not None else None)

    def _check_steps(self) -> list[Step]:
        steps = list(self._steps)
        if not steps:
            raise InvalidArgumentError(f"workflow {self.workflow_id!r} has no steps")
        return steps

    def _refuse_input(self, finished: bool) -> None:
        wid = self.workflow_id
        if finished:
            raise WorkflowFinishedError(
                f"workflow {wid!r} has finished a run started with another input: run() "
                "returns that run's result only for the same input (or none); use "
                "wf.rerun(state) for a new run with this input (history is kept), or "
                "wf.reset() then wf.run(state)", workflow_id=wid)
        raise WorkflowInputMismatchError(
            f"workflow {wid!r} has an unfinished run started with another input: run() "
            "resumes it only with the same input (or none); use wf.rerun(state) to start a new "
            "run with this input (history is kept), or wf.reset() then wf.run(state)",
            workflow_id=wid)

    def _execute(self, steps: list[Step], state: Any, latest: tuple | None, run: int,
                 digest: str | None, meta: Any, expect: int | None) -> Any:
        """Runs steps after those `latest` (the run's latest checkpoint; None: a new run
        from `state`) completed, saving checkpoints of run number `run`, the first on top of
        the stream's head `expect` (read before anything else), each next on the last."""
        completed: list[str] = list(latest[1]["completed"]) if latest is not None else []
        resumed = latest is not None
        attrs = {"snapstore.workflow.id": self.workflow_id, "snapstore.workflow.resumed": resumed,
                 "snapstore.workflow.resumed_after": completed[-1] if completed else "",
                 "snapstore.workflow.steps": len(steps)}
        with self._span("snapstore.workflow.run", attrs) as run_span:
            if latest is not None:
                try:
                    state = self._read(*latest)
                except CheckpointNotFound:
                    # deleted since run() read it: the workflow was reset meanwhile
                    head = self.store.latest(self.stream)
                    raise WorkflowConflictError(
                        f"workflow {self.workflow_id!r}: checkpoint {latest[0].id}, which "
                        "this run was resuming from, was deleted meanwhile (another run reset "
                        "the workflow): this run stopped before running any step. run() "
                        "again starts from the workflow's newest state",
                        workflow_id=self.workflow_id, step="", stream=self.stream,
                        expected=latest[0].id,
                        found=head.id if head is not None else None) from None
                if run_span is not None:
                    run_span.set_attribute("snapstore.checkpoint.id", latest[0].id)
            last_saved = latest[0].id if latest is not None else None
            for index in range(len(completed), len(steps)):
                step = steps[index]
                with self._span("snapstore.workflow.step", {
                        "snapstore.workflow.id": self.workflow_id,
                        "snapstore.workflow.step": step.name,
                        "snapstore.workflow.step.index": index,
                        "snapstore.workflow.resumed": resumed}) as span:
                    self._check_not_overtaken(step.name, expect)
                    try:
                        state = step.fn(state)
                    except Exception as exc:
                        raise StepError(f"step {step.name!r} of workflow {self.workflow_id!r} "
                                        f"failed: {type(exc).__name__}: {exc}",
                                        workflow_id=self.workflow_id, step=step.name) from exc
                    completed.append(step.name)
                    done = index == len(steps) - 1
                    if step.checkpoint or done:
                        info = self._checkpoint(state, {
                            "workflow": self.workflow_id, "kind": "step", "step": step.name,
                            "index": index, "completed": list(completed), "done": done,
                            "codec": self.codec, "user": meta, "run": run, "input": digest},
                            expect)
                        last_saved = expect = info.id
                        if span is not None:
                            span.set_attribute("snapstore.checkpoint.id", info.id)
            if run_span is not None and last_saved is not None:
                run_span.set_attribute("snapstore.checkpoint.id", last_saved)
        return state

    def reset(self) -> int:
        """Forgets the workflow's checkpoints so the next run() starts over; returns how many
        were deleted. Crash-safe: a reset marker is committed first, so a reset interrupted
        halfway still starts over. Raises WorkflowConflictError (nothing reset) when a run
        of the workflow checkpointed it meanwhile: that run's next checkpoint is refused once
        the marker is in."""
        head = self.store.latest(self.stream)
        infos = [i for i in self.store.checkpoints(self.stream)
                 if (_ours(i) or {}).get("workflow") == self.workflow_id]
        if not infos:
            return 0
        expect = head.id if head is not None else None
        try:
            marker = self.store.checkpoint({}, stream=self.stream, expect_head=expect,
                                           meta={META_KEY: {"workflow": self.workflow_id,
                                                            "kind": "reset"}})
        except CommitConflict as exc:
            raise self._conflict("", expect, exc.found, exc) from exc
        for info in [*reversed(infos), marker]:
            try:
                self.store.delete(info.id)
            except CheckpointNotFound:
                pass                       # deleted by another reset meanwhile
        return sum(1 for i in infos if (_ours(i) or {}).get("kind") != "reset")
