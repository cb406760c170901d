"""Ranks of the multi-rank DCP tests (test_dcp_ranks.py): gloo process groups on loopback, a
small sharded-ish state, and scenarios of saves, loads and failures.

    python dcp_rank.py WORKDIR STEPS_JSON

STEPS_JSON is a list of steps {"name", "scenario", "world", "store", ...}, run in order (a
store may be an S3 URL: then the step's "cache_root" holds each rank's cache directories, a
rank's own for its saves and an empty one for each load and look). For
each step this launcher forks `world` ranks (torch is imported once, here: a rank costs no
interpreter or torch start-up), which join a gloo group (FileStore in WORKDIR) and run the
scenario. Rank 0 prints JSON lines {"step": name, ...facts}; the launcher prints
{"step": name, "exits": [per rank: exit code, or -signal]} once all ranks ended (a rank
still running after STEP_TIMEOUT seconds is killed). A failed check in a rank raises: it
exits 1 with its traceback on stderr.

The state is the same global state at every world size: DTensors sharded over the ranks
(rows of model.w1, columns of model.w2), replicated tensors (DCP writes them once), a bytes
item, and each rank's own tensor "own.rank<R>". Version 2 changes 1% of model.w1's rows (one
4 KiB page each) and a few values elsewhere.
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import signal
import sys
import time
import traceback
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402

import snapstore  # noqa: E402
import snapstore.torch as st  # noqa: E402

ROWS, COLS = 512, 1024                 # model.w1: 2 MiB of float32, one 4 KiB page per row
CHANGED_ROWS = list(range(0, ROWS, 100))    # version 2 changes 1% of them
SHARDED = {"model.w1": 0, "model.w2": 1}    # name -> the dim its DTensor is sharded on
STEP_TIMEOUT = 90.0
FAILED = (Exception, CheckpointException)     # CheckpointException is a BaseException

RANK = WORLD = 0
MESH = None


def launch(workdir, steps: list) -> dict:
    """Runs the steps in one launcher process of this script (the tests' side); {step name:
    {"facts": [rank 0's facts], "exits": [per rank]}}, "stderr": the ranks' tracebacks}."""
    import subprocess
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    env.pop("SNAPSTORE_CRASH_AT", None)
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), str(workdir),
                           json.dumps(steps)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: dict = {s["name"]: {"facts": [], "exits": None} for s in steps}
    for line in proc.stdout.splitlines():
        d = json.loads(line)
        if "exits" in d:
            out[d["step"]]["exits"] = d["exits"]
        else:
            out[d["step"]]["facts"].append(d)
    out["stderr"] = proc.stderr
    return out


def full_state(version: int, world: int) -> dict:
    """The global state of a save by `world` ranks, as plain tensors."""
    g = torch.Generator().manual_seed(1234)
    s = {"model.w1": torch.randn(ROWS, COLS, generator=g),
         "model.w2": torch.randn(64, 256, generator=g),
         "model.bias": torch.randn(COLS, generator=g),
         "model.emb": torch.randn(64, 64, generator=g).to(torch.bfloat16),
         "step": version}
    for r in range(world):
        s[f"own.rank{r}"] = torch.arange(4 * COLS, dtype=torch.float32).reshape(4, COLS) + r
    if version >= 2:
        s["model.w1"][CHANGED_ROWS] += 1.0
        s["model.bias"][7] += 1.0
        for r in range(world):
            s[f"own.rank{r}"][0, 0] = -1.0 - version
    return s


def shard(value: torch.Tensor, dim: int) -> DTensor:
    """This rank's shard of a tensor every rank holds whole, as a DTensor sharded on dim (no
    collective: every rank computes the whole tensor)."""
    local = value.tensor_split(WORLD, dim)[RANK].clone()
    return DTensor.from_local(local, MESH, [Shard(dim)], run_check=False,
                              shape=value.shape, stride=value.stride())


def rank_state(version: int) -> dict:
    """This rank's state dict for dcp.save: its shards of the sharded tensors, the replicated
    ones, and only its own tensor."""
    out = {}
    for name, value in full_state(version, WORLD).items():
        if name.startswith("own.") and name != f"own.rank{RANK}":
            continue
        if name in SHARDED and MESH is not None:
            value = shard(value, SHARDED[name])
        out[name] = value
    return out


def load_target(saved_world: int) -> dict:
    """Zeroed targets laid out for this world (DTensors sharded over it; plain tensors without
    a process group) for every tensor of a save by saved_world ranks."""
    out = {}
    for name, value in full_state(1, saved_world).items():
        if isinstance(value, int):
            out[name] = 0
            continue
        zero = torch.zeros_like(value)
        if name in SHARDED and MESH is not None:
            zero = shard(zero, SHARDED[name])
        out[name] = zero
    return out


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    return bytes(t.view(torch.uint8).reshape(-1).numpy()) if t.numel() else b""


def check_loaded(target: dict, version: int, saved_world: int) -> None:
    """Every tensor (each local shard of a DTensor) byte-exact against the global state."""
    want = full_state(version, saved_world)
    assert set(target) == set(want), (sorted(target), sorted(want))
    for name, got in target.items():
        expected = want[name]
        if isinstance(got, DTensor):
            from torch.distributed.tensor._utils import \
                compute_local_shape_and_global_offset
            local = got.to_local()
            dim = SHARDED[name]
            _, offset = compute_local_shape_and_global_offset(got.shape, got.device_mesh,
                                                              got.placements)
            expected = expected.narrow(dim, offset[dim], local.shape[dim])
            got = local
        if isinstance(expected, torch.Tensor):
            assert got.dtype == expected.dtype and got.shape == expected.shape, name
            assert raw(got) == raw(expected), f"{name}: bytes differ from version {version}"
        else:
            assert got == expected, (name, got, expected)


CACHE_ROOT = None                      # the step's "cache_root" (S3 stores), or None
_fresh = iter(range(1 << 30))


def options(purpose: str) -> dict:
    """snapstore.open options for this rank: for an S3 store its cache directory, the rank's
    own for "save", an empty one for anything else (a machine that never saw the store)."""
    if CACHE_ROOT is None:
        return {}
    name = f"save-rank{RANK}" if purpose == "save" else f"{purpose}-rank{RANK}-{next(_fresh)}"
    return {"cache_dir": os.path.join(CACHE_ROOT, name)}


def load_check(path: str, saved_world: int, version: int) -> None:
    target = load_target(saved_world)
    dcp.load(target, checkpoint_id=f"v{version}",
             storage_reader=st.SnapstoreReader(path, **options("load")))
    check_loaded(target, version, saved_world)


def describe(info) -> dict:
    return {"id": info.id, "kind": info.kind, "bytes_new": info.bytes_new,
            "total": sum(info.sizes.values()), "parent": info.parent,
            "chain": info.chain_length, "parts": snapstore.group_parts(info),
            "buffers": sorted(info.sizes),
            "dcp": info.reserved_meta.get("snapstore.dcp")}


def visible(path: str) -> dict:
    """What a reader sees: (id, DCP checkpoint_id) of every checkpoint, and the streams."""
    with snapstore.open(path, readonly=True, **options("look")) as s:
        return {"checkpoints": [[c.id, (c.reserved_meta.get("snapstore.dcp") or {})
                                 .get("checkpoint_id")] for c in s.checkpoints()],
                "streams": s.streams()}


def save(path: str, version: int, writer=None):
    writer = writer or st.SnapstoreWriter(path, timeout=60, **options("save"))
    dcp.save(rank_state(version), checkpoint_id=f"v{version}", storage_writer=writer)
    return writer


STEP = ""


def facts(**kw) -> None:
    if RANK == 0:
        print(json.dumps(dict(step=STEP, **kw)), flush=True)


# ---- scenarios (run by every rank) -----------------------------------------------------------
def scenario_save(step: dict) -> None:
    """Saves v1 and v2, then loads v1 and v2 of this save and v2 of every store in
    step["loads"] ([path, saved world]) with this world."""
    first = save(step["store"], 1).last_info      # None but on the coordinator
    second = save(step["store"], 2).last_info
    if RANK == 0:
        facts(what="saved", first=describe(first), second=describe(second),
              visible=visible(step["store"]))
    scenario_load(step, own=True)


def scenario_load(step: dict, own: bool = False) -> None:
    loads = ([[step["store"], WORLD]] if own else []) + step.get("loads", [])
    for path, saved_world in loads:
        for version in (1, 2):
            load_check(path, saved_world, version)
        facts(what="loaded", store=path, saved_world=saved_world)


class RaisingWriter(st.SnapstoreWriter):
    """Rank 1 raises in write_data before it stages anything."""

    def write_data(self, plan, planner):
        if RANK == 1:
            raise RuntimeError("rank 1 failed before staging")
        return super().write_data(plan, planner)


class SilentWriter(st.SnapstoreWriter):
    """Rank 1's write_data returns its results without staging its part."""

    def write_data(self, plan, planner):
        if RANK != 1:
            return super().write_data(plan, planner)
        real = snapstore.Store.stage
        snapstore.Store.stage = lambda *a, **k: None
        try:
            return super().write_data(plan, planner)
        finally:
            snapstore.Store.stage = real


def scenario_raise(step: dict) -> None:
    """v1; then v2 failing twice (rank 1 raises / does not stage); then v2 retried with a new
    writer, which commits at once (the failed saves left nothing in its way)."""
    path = step["store"]
    save(path, 1)
    for how, cls in (("raise", RaisingWriter), ("no-stage", SilentWriter)):
        error = None
        started = time.monotonic()
        try:
            save(path, 2, cls(path, timeout=60))
        except FAILED as exc:             # DCP's CheckpointException, on every rank
            error = f"{type(exc).__name__}: {exc}"
        facts(what=how, error=error, seconds=time.monotonic() - started,
              visible=visible(path))
        load_check(path, WORLD, 1)        # the previous save still loads
        dist.barrier()
    info = save(path, 2).last_info
    load_check(path, WORLD, 2)
    if RANK == 0:
        facts(what="retry", info=describe(info), visible=visible(path))


def scenario_kill_rank(step: dict) -> None:
    """v1; then v2 with rank 1 SIGKILLed after the third chunk of its part reached its log;
    then the coordinator, alone (no process group), saves v3 at once."""
    path = step["store"]
    save(path, 1)
    if RANK == 1:
        from snapstore.engine import writer as wr
        append, count = wr.ChunkSink._append, [0]

        def dying_append(self, items, *rest):   # the records of new chunks, one at a time
            for item in items:
                count[0] += 1
                if count[0] > 3:
                    os.kill(os.getpid(), signal.SIGKILL)
                append(self, [item], *rest)
        wr.ChunkSink._append = dying_append
    error = None
    try:
        save(path, 2)
    except FAILED as exc:
        error = type(exc).__name__
    facts(what="failed", error=error, visible=visible(path))
    dist.destroy_process_group()
    writer = st.SnapstoreWriter(path, timeout=60)
    dcp.save(full_state(3, 1), checkpoint_id="v3", storage_writer=writer)
    facts(what="alone", info=describe(writer.last_info), visible=visible(path))


def scenario_kill_coordinator(step: dict) -> None:
    """v1; then v2 with rank 0 SIGKILLed in finish(): before the group's commit, or at
    step["crash_at"] (a crash point of the commit)."""
    path = step["store"]
    save(path, 1)
    if RANK == 0:
        if step.get("crash_at"):
            os.environ["SNAPSTORE_CRASH_AT"] = step["crash_at"]
        else:                             # every rank staged; nothing committed
            snapstore.Group.commit = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    save(path, 2)
    raise AssertionError("this save should not have returned")


def scenario_raise_async(step: dict) -> None:
    """v1; then v2 through dcp.async_save with rank 1 raising (DCP never calls finish, and
    the coordinator's save is abandoned on DCP's executor thread, which ends); then v2 again
    through async_save with a new writer, which commits at once (regression: the abandoned
    group kept the stream from every save until its deadline), and the failed writer's
    close() in the caller's thread (it raised AttributeError)."""
    path = step["store"]
    save(path, 1)
    failed = RaisingWriter(path, timeout=600)
    error = None
    try:
        future = dcp.async_save(rank_state(2), checkpoint_id="v2", storage_writer=failed)
        (future.result() if hasattr(future, "result") else future.upload_completion.result())
    except FAILED as exc:
        error = f"{type(exc).__name__}: {exc}"
    dist.barrier()
    started = time.monotonic()
    writer = st.SnapstoreWriter(path, timeout=600, **options("save"))
    future = dcp.async_save(rank_state(2), checkpoint_id="v2", storage_writer=writer)
    (future.result() if hasattr(future, "result") else future.upload_completion.result())
    failed.close()
    load_check(path, WORLD, 2)
    if RANK == 0:
        facts(what="async", error=error, seconds=time.monotonic() - started,
              info=describe(writer.last_info), visible=visible(path))


SCENARIOS = {"save": scenario_save, "load": scenario_load, "raise": scenario_raise,
             "raise-async": scenario_raise_async,
             "kill-rank": scenario_kill_rank, "kill-coordinator": scenario_kill_coordinator}


# ---- the launcher --------------------------------------------------------------------------------
def rank_main(step: dict, rank: int, init: str) -> None:
    global RANK, WORLD, MESH, STEP, CACHE_ROOT
    RANK, WORLD, STEP = rank, step["world"], step["name"]
    CACHE_ROOT = step.get("cache_root")
    code = 0
    try:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=30))
        MESH = init_device_mesh("cpu", (WORLD,))
        SCENARIOS[step["scenario"]](step)
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_step(workdir: str, index: int, step: dict) -> None:
    init = f"file://{os.path.join(workdir, f'pg-{index}')}"
    pids = []
    for rank in range(step["world"]):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            rank_main(step, rank, init)
        pids.append(pid)
    exits: dict[int, int] = {}
    deadline = time.monotonic() + STEP_TIMEOUT
    while len(exits) < len(pids):
        for pid in pids:
            if pid in exits:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                exits[pid] = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                              else os.WEXITSTATUS(status))
        if time.monotonic() > deadline:
            for pid in pids:
                if pid not in exits:
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)
    print(json.dumps({"step": step["name"], "exits": [exits[p] for p in pids]}), flush=True)


def main() -> int:
    workdir, steps = sys.argv[1], json.loads(sys.argv[2])
    torch.set_num_threads(1)              # no OpenMP pool before fork()
    importlib.import_module("torch._dynamo")   # DTensor imports it on first use: 2 s, once
    for index, step in enumerate(steps):
        run_step(workdir, index, step)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)                        # no interpreter teardown of torch (a second or more)
