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

Mapping (docs/integrations.md): a workflow is the stream ``wf/<workflow id>``; every
checkpointed step adds one snapstore checkpoint holding the state after that step, saved with
store.save() (pickle protocol 5, large buffers out of band as page-diffed buffers) or, when the
object layer is absent, as one pickled buffer ``"state"``. Its meta records the workflow id,
the step's name and index, every step completed so far (checkpointed or not), whether the
workflow is done, and the caller's run meta.

Guarantees: a step whose checkpoint committed never runs again (run() starts after the last
completed step); a step that raises leaves the last checkpoint as it was and comes out as
StepError naming the step; a checkpoint that cannot be saved stops the workflow with
CheckpointSaveError (or TypeError for a state that cannot be pickled), the next step does not
run. Steps run after the last checkpoint, or declared checkpoint=False, run again after a crash,
so steps should be idempotent (a crash between a step's side effects and its checkpoint
repeats them). One process runs a workflow at a time (a store has one writer).

Tracing: with ``opentelemetry-api`` installed, run() is a span "snapstore.workflow.run" and each
step a child span "snapstore.workflow.step", with the workflow id, step name and index, the
checkpoint id and whether the run resumed. Without it nothing is traced.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import pickle
from dataclasses import dataclass
from typing import Any, Callable

from snapstore.errors import CheckpointNotFound, InvalidArgumentError, SnapstoreError
from snapstore.engine.validation import validate_meta
from snapstore.store import CheckpointInfo, Store

__all__ = ["Workflow", "Step", "StepRecord", "StepError", "CheckpointSaveError", "META_KEY"]

META_KEY = "snapstore.workflow"       # our part of each checkpoint's meta
STATE_BUFFER = "state"                # the pickled state (codec "pickle")
CODECS = ("auto", "objects", "pickle")
_MAX_PLAIN_ID = 200                   # longer ids (or ids with NUL) use a hashed stream name


class StepError(SnapstoreError):
    """A step raised. ``step`` and ``workflow_id`` name it; the step's exception is the
    ``__cause__``. The workflow's last checkpoint is unchanged; run() again retries the step."""

    def __init__(self, message: str, *, workflow_id: str, step: str) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.step = step


class CheckpointSaveError(SnapstoreError):
    """The state after a step could not be checkpointed (disk full, I/O error, closed store,
    ...). The workflow stopped; the error that caused it is the ``__cause__``."""

    def __init__(self, message: str, *, workflow_id: str, step: str) -> None:
        super().__init__(message)
        self.workflow_id = workflow_id
        self.step = step


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
    """Our bookkeeping in a checkpoint's meta (None for anything else in the stream)."""
    meta = info.meta
    if isinstance(meta, dict) and isinstance(meta.get(META_KEY), dict):
        return meta[META_KEY]
    return None


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
    Raises: TypeError (store, workflow_id), InvalidArgumentError (empty id, codec),
        StoreClosedError.
    """

    def __init__(self, store: Store, workflow_id: str, *, codec: str = "auto",
                 tracer: Any = None) -> None:
        if not isinstance(store, Store):
            raise TypeError(f"store must be a snapstore Store, got {type(store).__name__}")
        if not isinstance(workflow_id, str):
            raise TypeError(f"workflow_id must be a str, got {type(workflow_id).__name__}")
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
        Raises: TypeError (name not a str, fn not callable, checkpoint not a bool),
        InvalidArgumentError (empty or repeated name)."""
        if not isinstance(name, str):
            raise TypeError(f"step name must be a str, got {type(name).__name__}")
        if not name:
            raise InvalidArgumentError("step name must not be empty")
        if not callable(fn):
            raise TypeError(f"step {name!r}: fn must be callable, got {type(fn).__name__}")
        if not isinstance(checkpoint, bool):
            raise TypeError(f"step {name!r}: checkpoint must be a bool")
        if any(s.name == name for s in self._steps):
            raise InvalidArgumentError(f"step name {name!r} is already used in workflow "
                                       f"{self.workflow_id!r}")
        self._steps.append(Step(name, fn, checkpoint))
        return fn

    def step(self, fn: Any = None, *, name: str | None = None, checkpoint: bool = True) -> Any:
        """Decorator registering a step: ``@wf.step``, ``@wf.step(checkpoint=False)``,
        ``@wf.step(name="load")``; the step's name defaults to the function's name."""
        if isinstance(fn, str):
            raise TypeError("use @wf.step(name=...) to name a step")

        def register(f: Callable[[Any], Any]) -> Callable[[Any], Any]:
            return self.add_step(name if name is not None else getattr(f, "__name__", ""),
                                 f, checkpoint)
        return register(fn) if fn is not None else register

    # ---- reading ----------------------------------------------------------------------------
    def _current(self) -> list[tuple[CheckpointInfo, dict]]:
        """This workflow's checkpoints since the last reset, oldest first."""
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

    def _latest(self) -> tuple[CheckpointInfo, dict] | None:
        info = self.store.latest(self.stream)
        if info is None:
            return None
        ours = _ours(info)
        if ours is not None and ours.get("workflow") == self.workflow_id:
            return None if ours.get("kind") == "reset" else (info, ours)
        current = self._current()          # something else is the head: look further back
        return current[-1] if current else None

    def history(self) -> list[StepRecord]:
        """The workflow's checkpoints since it started (or was reset), oldest first."""
        return [StepRecord(o["step"], o["index"], info.id, info.created, dict(info.sizes),
                           info.bytes_new, tuple(o["completed"]), bool(o["done"]), o.get("user"))
                for info, o in self._current()]

    @property
    def completed(self) -> tuple[str, ...]:
        """Names of the steps completed as of the latest checkpoint (empty if none)."""
        latest = self._latest()
        return tuple(latest[1]["completed"]) if latest else ()

    def load(self, step: str | None = None) -> Any:
        """The state after the given step (default: after the latest checkpointed step).
        Raises: CheckpointNotFound (no checkpoint, or that step has none: it has not run yet
        or is a checkpoint=False step), TypeError (step not a str)."""
        if step is None:
            latest = self._latest()
            if latest is None:
                raise CheckpointNotFound(f"workflow {self.workflow_id!r} has no checkpoint")
            return self._read(*latest)
        if not isinstance(step, str):
            raise TypeError(f"step must be a str or None, got {type(step).__name__}")
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
    def _save(self, state: Any, ours: dict) -> CheckpointInfo:
        meta = {META_KEY: ours}
        if self.codec == "pickle":
            try:
                data = pickle.dumps(state, protocol=5)
            except Exception as exc:
                raise TypeError(f"the state after step {ours['step']!r} of workflow "
                                f"{self.workflow_id!r} cannot be pickled: {exc}") from exc
            return self.store.checkpoint({STATE_BUFFER: data}, stream=self.stream, meta=meta)
        try:
            return self.store.save(state, stream=self.stream, meta=meta)
        except TypeError as exc:          # ObjectSaveError: unpicklable, nothing written
            raise TypeError(f"the state after step {ours['step']!r} of workflow "
                            f"{self.workflow_id!r} cannot be pickled: {exc}") from exc

    def _checkpoint(self, state: Any, ours: dict) -> CheckpointInfo:
        try:
            return self._save(state, ours)
        except TypeError:
            raise                          # unpicklable state (nothing was written)
        except Exception as exc:
            raise CheckpointSaveError(
                f"workflow {self.workflow_id!r} stopped: the checkpoint after step "
                f"{ours['step']!r} could not be saved: {exc}",
                workflow_id=self.workflow_id, step=ours["step"]) from exc

    def _span(self, name: str, attributes: dict):
        if self._tracer is None:
            return contextlib.nullcontext(None)
        return self._tracer.start_as_current_span(name, attributes=attributes)

    def run(self, state: Any = None, *, meta: Any = None) -> Any:
        """Runs the steps after the last completed one and returns the final state.

        A workflow without checkpoints starts from ``state``; otherwise ``state`` is ignored
        and the state of the latest checkpoint is the input of the next step. A completed
        workflow returns its final state and runs nothing. ``meta`` (JSON) is stored with
        every checkpoint this run saves (history() shows it).
        Raises: StepError (a step raised), CheckpointSaveError (a checkpoint failed), TypeError
        (unpicklable state; meta not JSON), InvalidArgumentError (no steps, or the checkpoints
        record steps that do not match the registered ones: reset() to start over).
        """
        steps = list(self._steps)
        if not steps:
            raise InvalidArgumentError(f"workflow {self.workflow_id!r} has no steps")
        names = [s.name for s in steps]
        meta = validate_meta(meta)
        latest = self._latest()
        completed: list[str] = []
        if latest is not None:
            completed = list(latest[1]["completed"])
            if completed != names[:len(completed)]:
                raise InvalidArgumentError(
                    f"workflow {self.workflow_id!r} was checkpointed after steps {completed}, "
                    f"which are not the first steps of {names}; reset() to start over")
        resumed = latest is not None
        attrs = {"snapstore.workflow.id": self.workflow_id, "snapstore.workflow.resumed": resumed,
                 "snapstore.workflow.resumed_after": completed[-1] if completed else "",
                 "snapstore.workflow.steps": len(steps)}
        with self._span("snapstore.workflow.run", attrs) as run_span:
            if latest is not None:
                state = self._read(*latest)
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
                            "codec": self.codec, "user": meta})
                        last_saved = info.id
                        if span is not None:
                            span.set_attribute("snapstore.checkpoint.id", info.id)
            if run_span is not None and last_saved is not None:
                run_span.set_attribute("snapstore.checkpoint.id", last_saved)
        return state

    def reset(self) -> int:
        """Forgets the workflow's checkpoints so the next run() starts over; returns how many
        were deleted. Crash-safe: a reset marker is committed first, so a reset interrupted
        halfway still starts over."""
        infos = [i for i in self.store.checkpoints(self.stream)
                 if (_ours(i) or {}).get("workflow") == self.workflow_id]
        if not infos:
            return 0
        marker = self.store.checkpoint({}, stream=self.stream, meta={META_KEY: {
            "workflow": self.workflow_id, "kind": "reset"}})
        for info in reversed(infos):
            self.store.delete(info.id)
        self.store.delete(marker.id)
        return sum(1 for i in infos if (_ours(i) or {}).get("kind") != "reset")
