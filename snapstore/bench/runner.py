"""Running workloads: every method on the same state, interleaved step by step
(run_workload), several workloads with a description of the machine (run), the ratios to
snapstore (add_ratios), which methods can run here (available_methods) and what a run will do
and roughly how long it takes, before it starts (plan)."""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Callable, Optional

from snapstore.bench.errors import BenchError
from snapstore.bench.measuring import (Timed, disk_usage, drop_cache, loadavg, machine_info,
                                       physical_memory, settle, summary,
                                       summary_if_measured)
from snapstore.bench.methods import (Method, NumpyMethod, PickleMethod, RawMethod,
                                     SnapstoreMethod)
from snapstore.bench.peers import BorgMethod, ResticMethod
from snapstore.bench.workloads import Workload, digest, make_state, mutate, state_size

# The methods by name, snapstore first, in the order they are listed and reported.
METHOD_CLASSES = {c.name: c for c in (SnapstoreMethod, RawMethod, PickleMethod, NumpyMethod,
                                      ResticMethod, BorgMethod)}
METHODS = tuple(METHOD_CLASSES)
# Peers: backup tools run as child processes (restic, borg). Each of their checkpoints and
# restores passes the whole state through the tool, which made the default run take 74 s
# when both were installed; so they run only when asked for (--peers, or named in --methods).
PEERS = tuple(n for n, c in METHOD_CLASSES.items() if c.external)
# What a run measures when no methods are named: snapstore and the in-process baselines.
DEFAULT_METHODS = tuple(n for n in METHODS if n not in PEERS)

# Keys of every method's result dict (None where not measured); "vs_snapstore" maps the
# ratio keys below to baseline / snapstore.
METRIC_KEYS = (
    "method", "available", "skipped", "first_checkpoint_seconds", "checkpoint_seconds",
    "bytes_written_per_checkpoint", "store_bytes", "growth_per_checkpoint_bytes",
    "restore_latest_seconds", "restore_oldest_seconds", "restore_samples", "peak_memory_bytes",
    "restore_peak_memory_bytes", "verified", "notes",
)
RATIO_KEYS = {
    "checkpoint_median": lambda r: r["checkpoint_seconds"]["median"],
    "checkpoint_p95": lambda r: r["checkpoint_seconds"]["p95"],
    "bytes_written": lambda r: r["bytes_written_per_checkpoint"]["median"],
    "growth": lambda r: r["growth_per_checkpoint_bytes"],
    "restore_latest": lambda r: r["restore_latest_seconds"],
    "restore_oldest": lambda r: r["restore_oldest_seconds"],
    "peak_memory": lambda r: r["peak_memory_bytes"],
}


def method_names(requested=None) -> list:
    """The methods a run measures, in order: `requested` (default DEFAULT_METHODS) with
    "snapstore" first, added when missing (every figure is relative to it)."""
    names = list(DEFAULT_METHODS if requested is None else requested)
    return ["snapstore"] + [n for n in dict.fromkeys(names) if n != "snapstore"]   # each once


def available_methods(requested=None) -> dict:
    """{method: None if it can run here, else the reason it cannot}, for `requested`
    (default: DEFAULT_METHODS)."""
    names = list(DEFAULT_METHODS) if requested is None else list(requested)
    out = {}
    for n in names:
        if n not in METHOD_CLASSES:
            raise BenchError(f"unknown method {n!r}; choose from {', '.join(METHODS)}")
        out[n] = METHOD_CLASSES[n].unavailable()
    return out


def _skipped(name: str, reason: str) -> dict:
    res = {k: None for k in METRIC_KEYS}
    res.update(method=name, available=False, skipped=reason, notes="")
    return res


class _Track:
    """What run_workload records for one method while it runs."""

    def __init__(self, method: Method) -> None:
        self.method = method
        self.external = method.external
        self.first = 0.0
        self.times: list = []
        self.written: list = []
        self.peaks: list = []
        self.restore: dict = {"latest": [], "oldest": []}
        self.restore_peaks: list = []
        self.verified = True
        self.size_before = 0
        self.after_first = 0
        self.final = 0
        self.error: Optional[str] = None

    def result(self, w: Workload) -> dict:
        m = self.method
        restore = {k: summary(v) for k, v in self.restore.items()}
        peak = (m.max_rss if self.external else
                (max(self.peaks) if self.peaks and None not in self.peaks else None))
        res = {
            "method": m.name, "available": True, "skipped": None,
            "first_checkpoint_seconds": self.first,
            "checkpoint_seconds": summary(self.times),
            # None where /proc/self/io is missing (not measured: never shown as 0 B)
            "bytes_written_per_checkpoint": summary_if_measured(self.written),
            "store_bytes": self.final - self.size_before,
            "growth_per_checkpoint_bytes": (self.final - self.after_first) / w.checkpoints,
            "restore_latest_seconds": restore["latest"]["median"],
            "restore_oldest_seconds": restore["oldest"]["median"],
            "restore_samples": {k: v["samples"] for k, v in restore.items()},
            "peak_memory_bytes": peak,
            "restore_peak_memory_bytes": (None if self.external or None in self.restore_peaks
                                          else max(self.restore_peaks)),
            "verified": self.verified,
            "notes": m.notes,
        }
        if isinstance(m, SnapstoreMethod):
            res["snapstore"] = {
                "kinds": [i.kind for i in m.infos],
                "bytes_new": [i.bytes_new for i in m.infos],
                "chain_length_latest": m.infos[-1].chain_length,
                "stats": m.store.stats(),
            }
        return res


def _rotate(items: list, k: int) -> list:
    """The methods take turns being first, so none always runs right after a big writer."""
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def add_ratios(results: dict) -> None:
    """Adds "vs_snapstore" (baseline figure / snapstore figure) to every baseline's dict."""
    ref = results.get("snapstore")
    if not ref or not ref.get("available"):
        return
    for name, res in results.items():
        if name == "snapstore" or not res.get("available"):
            continue
        ratios = {}
        for key, get in RATIO_KEYS.items():
            try:
                a, b = get(res), get(ref)
            except (KeyError, TypeError):
                a = b = None
            ratios[key] = (a / b) if a is not None and b else None
        res["vs_snapstore"] = ratios


def run_workload(w: Workload, *, methods=None, workdir: Optional[str] = None,
                 tick: Callable[[str], None] = lambda _: None) -> dict:
    """Measures every method on one workload. Returns {"workload": ..., "results": ...}.

    The methods run interleaved on one state: each checkpoint step mutates the state once,
    then every method checkpoints it in turn (rotating who goes first); restores likewise.
    So every method sees the same bytes and the same machine conditions (a VM disk's burst
    budget, other load), and no method is measured right after its own big writes only.
    A baseline that fails (a tool's error, disk full...) is reported as failed, not fatal.
    """
    w.validate()
    names = method_names(methods)
    reasons = available_methods(names)     # validates names
    own = workdir is None
    workdir = tempfile.mkdtemp(prefix="snapstore-bench-") if own else workdir
    results: dict = {n: _skipped(n, reasons[n]) for n in names if reasons[n]}
    tracks: dict = {}

    def fail(name: str, exc: BaseException) -> None:
        if name == "snapstore" or not isinstance(exc, (BenchError, OSError)):
            raise exc
        t = tracks.pop(name)
        results[name] = _skipped(name, f"failed: {exc}")
        _close(t.method)

    def each(order: list, fn) -> None:
        for name in order:
            if name in tracks:
                try:
                    fn(name, tracks[name])
                except Exception as exc:     # noqa: BLE001 - fail() re-raises what is fatal
                    fail(name, exc)

    failed = True
    try:
        for name in names:
            if reasons[name]:
                continue
            directory = tempfile.mkdtemp(dir=workdir, prefix=f"{name}-")
            method = METHOD_CLASSES[name](w, directory)
            tracks[name] = _Track(method)
            try:
                method.setup()
            except Exception as exc:   # noqa: BLE001
                fail(name, exc)
        state = make_state(w)
        expected = {0: digest(state)}
        settle()

        def first(name, t):
            t.size_before = disk_usage(t.method.stored_dir)
            with Timed() as tm:
                t.method.checkpoint(state, 0)
            t.first = tm.seconds
            t.after_first = disk_usage(t.method.stored_dir)
            tick(f"{name}: checkpoint 0")
        each(list(tracks), first)

        for step in range(1, w.checkpoints + 1):
            mutate(state, w, step)

            def checkpoint(name, t, step=step):
                before = disk_usage(t.method.stored_dir) if t.external else 0
                with Timed() as tm:
                    t.method.checkpoint(state, step)
                t.times.append(tm.seconds)
                t.written.append(disk_usage(t.method.stored_dir) - before if t.external
                                 else tm.written)
                t.peaks.append(tm.peak)
                tick(f"{name}: checkpoint {step}")
            each(_rotate(list(tracks), step), checkpoint)

        last = w.checkpoints
        expected[last] = digest(state)
        del state
        for t in tracks.values():
            t.final = disk_usage(t.method.stored_dir)
        settle()

        for rep in range(w.restore_repeats):
            for label, step in (("latest", last), ("oldest", 0)):
                def restore(name, t, label=label, step=step, rep=rep):
                    if w.cache == "cold":
                        drop_cache(t.method.dir)
                    with Timed() as tm:
                        got = t.method.restore(step)
                    t.restore[label].append(tm.seconds)
                    t.restore_peaks.append(tm.peak)
                    if rep == 0:
                        t.verified = t.verified and digest(got) == expected[step]
                    del got
                    tick(f"{name}: restore {label}")
                each(_rotate(list(tracks), rep), restore)

        for name, t in tracks.items():
            results[name] = t.result(w)
        add_ratios(results)
        out = {"workload": {**asdict(w), "dirty_changed": w.changed_fraction()},
               "description": w.describe(),
               "results": {n: results[n] for n in names}}
        failed = False
        return out
    finally:
        # every method is closed and its files removed even if one close fails; a close
        # error never replaces the error that stopped the run (that one is what went wrong)
        close_error = None
        for t in tracks.values():
            try:
                _close(t.method)
            except Exception as exc:     # noqa: BLE001 - raised below unless the run failed
                close_error = close_error or exc
        settle()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
        if close_error is not None and not failed:
            raise close_error


def _close(method: Method) -> None:
    try:
        method.close()
    finally:
        shutil.rmtree(method.dir, ignore_errors=True)


# Rates of the rough duration estimate (plan().seconds), from runs on a 2-cpu cloud VM with an
# ext4 disk (the default run: ~40 s; with restic and borg: 74 s): fsync'd full-state writes,
# cold-cache full-state reads, a peer tool's pass over the state (restic / borg: chunk, hash,
# compress; or restore) and building the random state.
WRITE_RATE = 200 << 20
READ_RATE = 400 << 20
PEER_RATE = 300 << 20
BUILD_RATE = 300 << 20


@dataclass(frozen=True)
class Plan:
    """What run() will do, known before it starts: the methods that run (snapstore first),
    those skipped {name: why}, the number of progress steps (tick() calls), a rough
    duration estimate in seconds (the WRITE/READ/PEER/BUILD_RATE model: a loaded machine or
    a slow disk takes longer) and a rough estimate of the disk space the run needs at once
    (the largest workload: each workload's files are removed before the next starts)."""
    methods: tuple
    skipped: dict
    steps: int
    seconds: float
    disk_bytes: int = 0


def _sizes(w: Workload) -> list:
    """Bytes of state at each checkpoint (the "appended" pattern grows it)."""
    return [state_size(w, step) for step in range(w.checkpoints + 1)]


def _stored_bytes(w: Workload, name: str) -> float:
    """Rough bytes one method writes (and keeps) over workload w: the in-process baselines a
    full copy of every checkpoint; snapstore the first state, then about the dirty part of
    each; a peer, like snapstore (its repository deduplicates) plus the state file it backs
    up, rewritten whole for every checkpoint."""
    sizes = _sizes(w)
    if name == "snapstore" or name in PEERS:
        return sizes[0] + w.size * w.dirty * w.checkpoints
    return sum(sizes)


def _method_seconds(w: Workload, name: str) -> float:
    """Estimated seconds one method spends on workload w: its checkpoints and restores."""
    sizes = _sizes(w)
    restored = w.restore_repeats * (sizes[-1] + sizes[0])     # the latest and the oldest
    if name == "snapstore":      # one full checkpoint, then only the dirty part
        return _stored_bytes(w, name) / WRITE_RATE + restored / READ_RATE
    passes = sum(sizes)
    if name in PEERS:            # the state file is written, then the tool passes over it
        return passes / WRITE_RATE + (passes + restored) / PEER_RATE
    return passes / WRITE_RATE + restored / READ_RATE   # in-process baselines: full copies


def _method_disk(w: Workload, name: str) -> float:
    """Rough bytes on disk one method holds at the end of workload w."""
    scratch = state_size(w, w.checkpoints) if name in PEERS else 0   # a peer's state file
    return _stored_bytes(w, name) + scratch


def plan(workloads, methods=None) -> Plan:
    """The Plan of run(workloads, methods=methods): which methods run, how many progress
    steps, about how long it takes and how much disk it needs. Validates the workloads and
    method names, and refuses a state that outgrows this machine's memory by its last
    checkpoint (the harness holds it in memory)."""
    workloads = [w.validate() for w in workloads]
    memory = physical_memory()
    for w in workloads:
        final = state_size(w, w.checkpoints)
        if memory and final > memory:
            if final == w.size:
                what, fix = f"a state of {final} bytes", "--size"
            else:
                what = (f"an appended state grows from {w.size} to {final} bytes by its last "
                        "checkpoint, which")
                fix = "--size, --dirty or --checkpoints"
            raise BenchError(f"{what} does not fit in this machine's {memory} bytes of memory "
                             f"(the harness holds the state in memory): give a smaller {fix}")
    names = method_names(methods)
    reasons = available_methods(names)
    runnable = tuple(n for n in names if reasons[n] is None or n == "snapstore")
    steps = sum(len(runnable) * (w.checkpoints + 1 + 2 * w.restore_repeats) for w in workloads)
    seconds = sum(w.size / BUILD_RATE + sum(_method_seconds(w, n) for n in runnable)
                  for w in workloads)
    disk = max((sum(_method_disk(w, n) for n in runnable) for w in workloads), default=0)
    return Plan(methods=runnable, skipped={n: r for n, r in reasons.items() if r},
                steps=steps, seconds=seconds, disk_bytes=round(disk))


def run(workloads, *, methods=None, workdir: Optional[str] = None,
        tick: Callable[[str], None] = lambda _: None, argv=None) -> dict:
    """Runs every workload; the JSON-ready result of ``snapstore bench --json``."""
    workloads = [w.validate() for w in workloads]
    if not workloads:
        raise BenchError("no workload to run")
    plan(workloads, methods)        # refuses a state this machine cannot hold (as the CLI)
    base = tempfile.mkdtemp(prefix="snapstore-bench-", dir=workdir)
    try:
        started = time.time()
        out = {
            "machine": machine_info(base),
            "command": list(sys.argv if argv is None else argv),
            "started": started,
            "methods": {m: (why or "ok") for m, why in available_methods(
                method_names(methods)).items()},
            "workloads": [run_workload(w, methods=methods, workdir=base, tick=tick)
                          for w in workloads],
        }
        out["seconds"] = time.time() - started
        out["machine"]["loadavg_after"] = loadavg()
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)
