"""Multi-rank torch.distributed.checkpoint saves through SnapstoreWriter: the writer of this
checkout (format 3: every rank stages its shard at once, the coordinator's finish is one
group commit) against an older checkout's (format 2: the ranks take turns for the store's
writer lock, each committing its part checkpoint, the coordinator's items last), measured in
the same run.

    python3 benchmarks/bench_dcp_ranks.py --baseline /tmp/dcp-base
    (the baseline: git -C REPO worktree add /tmp/dcp-base 7df0084 &&
     cd /tmp/dcp-base && python3 setup.py -q build_ext --inplace)

The model: N float32 weight matrices (default 6 of 2048 x 2048: 96 MiB) as DTensors sharded
by rows over the ranks, plus replicated biases; each rank writes its shard. For each world
size and each checkout, one process imports torch once and forks the ranks (gloo, FileStore
on loopback), with PYTHONPATH pointing at that checkout. A round: a fresh store, the first
save, then --saves incremental saves, each after 1% of every shard's rows changed. Times are
dcp.save's wall time on rank 0 from a barrier until it returns (DCP's last step is a
broadcast: every rank is done); durability "fsync" (default store options, zstd). Reported:
medians over --rounds rounds, and the store's growth on disk per save.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


# ---- one rank ----------------------------------------------------------------------------------
def store_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            total += os.path.getsize(os.path.join(root, f))
    return total


def rank_state(torch, mesh, rank: int, world: int, matrices: int, size: int) -> dict:
    """This rank's share of the model: its rows of each weight (a DTensor), and the biases."""
    from torch.distributed.tensor import DTensor, Shard
    rows = size // world
    state = {}
    for i in range(matrices):
        g = torch.Generator().manual_seed(1000 * i + rank)
        local = torch.randn(rows, size, generator=g)
        state[f"layer{i}.weight"] = DTensor.from_local(local, mesh, [Shard(0)], run_check=False,
                                                       shape=(size, size), stride=(size, 1))
        state[f"layer{i}.bias"] = torch.full((size,), float(i))
    return state


def change_one_percent(torch, state: dict, step: int) -> None:
    """1% of the rows of every local shard (each row 2 pages at size 2048), different rows
    each step."""
    with torch.no_grad():
        for name, t in state.items():
            if name.endswith(".weight"):
                local = t.to_local()
                local[step % 100::100] += 1.0


def run_rank(args, rank: int, init: str, store: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    import snapstore.torch as st
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (args.world,))
    state = rank_state(torch, mesh, rank, args.world, args.matrices, args.size)
    times, growth = [], []
    for step in range(1 + args.saves):
        if step:
            change_one_percent(torch, state, step)
        before = store_bytes(store) if rank == 0 and os.path.exists(store) else 0
        dist.barrier()
        started = time.perf_counter()
        dcp.save(state, checkpoint_id=f"step-{step}",
                 storage_writer=st.SnapstoreWriter(store, timeout=600))
        times.append(time.perf_counter() - started)
        if rank == 0:
            growth.append(store_bytes(store) - before)
    dist.barrier()
    if rank == 0:
        import snapstore
        print(json.dumps({"times": times, "growth": growth,
                          "snapstore": os.path.dirname(snapstore.__file__)}), flush=True)
    dist.destroy_process_group()


def worker(args) -> int:
    """Forks the ranks of one round (torch imported once, here)."""
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.tensor  # noqa: F401
    import importlib
    importlib.import_module("torch._dynamo")    # DTensor imports it on first use (2 s)
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="bench-dcp-", dir=args.dir)
    store = os.path.join(work, "store")
    try:
        pids = []
        for rank in range(args.world):
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    run_rank(args, rank, f"file://{work}/pg", store)
                except BaseException:
                    import traceback
                    traceback.print_exc()
                    code = 1
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            pids.append(pid)
        failed = False
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            failed |= status != 0
        if failed:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        return 1 if failed else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- the orchestrator ---------------------------------------------------------------------------
def measure(checkout: str, world: int, args) -> dict:
    env = dict(os.environ, PYTHONPATH=checkout, OMP_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--world", str(world),
           "--matrices", str(args.matrices), "--size", str(args.size),
           "--saves", str(args.saves), "--dir", args.dir]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{checkout}, {world} ranks failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["snapstore"] == os.path.join(checkout, "snapstore"), (result, checkout)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", default="/tmp/dcp-base",
                   help="checkout of the turn-taking writer (built in place)")
    p.add_argument("--worlds", type=int, nargs="+", default=[2, 4])
    p.add_argument("--matrices", type=int, default=6)
    p.add_argument("--size", type=int, default=2048, help="rows = columns of each matrix")
    p.add_argument("--saves", type=int, default=3, help="incremental saves per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--world", type=int, default=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    args.dir = args.dir or tempfile.gettempdir()
    if not os.path.exists(os.path.join(args.baseline, "snapstore", "torch.py")):
        raise SystemExit(f"no baseline checkout at {args.baseline} (see --help)")
    model = args.matrices * args.size * args.size * 4
    print(f"model: {args.matrices} x {args.size}x{args.size} float32 = {model / 2**20:.0f} MiB "
          f"(+ biases), sharded by rows; fsync on; {args.rounds} rounds, medians; "
          f"{os.cpu_count()} cores")
    checkouts = {"new": REPO, "old": os.path.abspath(args.baseline)}
    results: dict = {}
    for rnd in range(args.rounds):
        for world in args.worlds:
            order = ["new", "old"] if rnd % 2 == 0 else ["old", "new"]
            for name in order:
                r = measure(checkouts[name], world, args)
                results.setdefault((name, world), []).append(r)
                print(f"  round {rnd + 1}: {world} ranks, {name}: first {r['times'][0]:.3f} s, "
                      f"next {', '.join(f'{t:.3f}' for t in r['times'][1:])} s", flush=True)

    def med(name, world, what):
        rs = results[(name, world)]
        if what == "first":
            return statistics.median(r["times"][0] for r in rs)
        if what == "next":
            return statistics.median(t for r in rs for t in r["times"][1:])
        if what == "grow1":
            return statistics.median(r["growth"][0] for r in rs)
        return statistics.median(g for r in rs for g in r["growth"][1:])

    print()
    print("| ranks | writer | first save (s) | incremental save (s) | store growth: first / "
          "incremental (MiB) |")
    print("|---|---|---|---|---|")
    for world in args.worlds:
        for name, label in (("old", f"turn-taking ({os.path.basename(checkouts['old'])})"),
                            ("new", "group commit (this checkout)")):
            print(f"| {world} | {label} | {med(name, world, 'first'):.3f} | "
                  f"{med(name, world, 'next'):.3f} | {med(name, world, 'grow1') / 2**20:.1f} / "
                  f"{med(name, world, 'grown') / 2**20:.2f} |")
    print()
    print("| ranks | first save new/old | incremental save new/old |")
    print("|---|---|---|")
    for world in args.worlds:
        print(f"| {world} | {med('new', world, 'first') / med('old', world, 'first'):.2f}x | "
              f"{med('new', world, 'next') / med('old', world, 'next'):.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
