"""Many writers on one store (issue 16), as ratios measured in one run.

Writer scaling: N writer processes (1, 2, 4), each with its own state of --size-mib MiB of
random bytes on its own stream, checkpointed full once (not timed), then --rounds times: 1% of
its 4 KiB pages overwritten at scattered places and `store.checkpoint()` with durability
"fsync". Timed twice on fresh stores: all N writers at once (a barrier starts their rounds
together) and the same N writers one after another. Reported: the aggregate checkpoints per
second of both, and parallel wall time / sequential wall time (issue 16's target: <= 0.6 at 4
writers on 2 cores; the fsyncs must overlap).

Commit latency: one writer, the same workload, median checkpoint time with this checkout and
with another one given as --baseline (a checkout of an older snapstore, built in place, e.g.
the last commit before issue 16), in the same run on the same machine: issue 16 allows at most
5% more.

    python3 benchmarks/bench_writers.py [--size-mib 256] [--rounds 10] [--writers 1,2,4]
        [--baseline /tmp/snap-base] [--latency-rounds 30] [--dir DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PAGE = 4096

# One writer, as a program: it runs under whichever snapstore its PYTHONPATH names (this
# checkout or the baseline), so both are measured by the same code.
WRITER = r"""
import json, os, sys, time
import numpy as np
import snapstore
path, stream, size, rounds, seed, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
fraction = float(sys.argv[7])
rng = np.random.default_rng(seed)
state = rng.integers(0, 256, size, dtype=np.uint8)
pages = size // 4096
store = snapstore.open(path, durability="fsync", timeout=600)
store.checkpoint({"state": state}, stream=stream)          # the full one: not timed
changes = []
for _ in range(rounds):                                     # what each round will write
    chosen = rng.choice(pages, size=max(1, int(pages * fraction)), replace=False)
    changes.append((chosen, rng.integers(0, 256, (len(chosen), 4096), dtype=np.uint8)))
print("ready", flush=True)
while not os.path.exists(go):                               # the barrier
    time.sleep(0.001)
times = []
started = time.perf_counter()
for chosen, data in changes:
    for p, d in zip(chosen, data):
        state[p * 4096:(p + 1) * 4096] = d
    t = time.perf_counter()
    store.checkpoint({"state": state}, stream=stream)
    times.append(time.perf_counter() - t)
wall = time.perf_counter() - started
store.close()
print(json.dumps({"times": times, "wall": wall}), flush=True)
"""


def run_writers(package: str, path: str, n: int, size: int, rounds: int,
                parallel: bool, fraction: float = 0.01) -> dict:
    """n writer processes on one store (each its own stream and state); parallel: their
    rounds start together, else one writer after another. Returns the wall time of the timed
    rounds and every checkpoint's time."""
    env = dict(os.environ, PYTHONPATH=package)
    go = os.path.join(path + ".go")
    if os.path.exists(go):
        os.remove(go)
    if parallel:
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, path, f"w{i}", str(size),
                                   str(rounds), str(i), go, str(fraction)],
                                  stdout=subprocess.PIPE, text=True, env=env)
                 for i in range(n)]
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        t = time.perf_counter()
        open(go, "w").close()
        outs = [json.loads(p.stdout.readline()) for p in procs]
        wall = time.perf_counter() - t
        for p in procs:
            assert p.wait() == 0
    else:
        open(go, "w").close()
        outs, wall = [], 0.0
        for i in range(n):
            p = subprocess.Popen([sys.executable, "-c", WRITER, path, f"w{i}", str(size),
                                  str(rounds), str(i), go, str(fraction)],
                                 stdout=subprocess.PIPE, text=True, env=env)
            assert p.stdout.readline().strip() == "ready"
            out = json.loads(p.stdout.readline())
            assert p.wait() == 0
            outs.append(out)
            wall += out["wall"]
    return {"wall": wall, "times": [t for o in outs for t in o["times"]]}


def fresh(base: str, name: str) -> str:
    path = os.path.join(base, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--changed", type=float, default=0.01,
                    help="fraction of pages changed per checkpoint (default 0.01)")
    ap.add_argument("--writers", default="1,2,4")
    ap.add_argument("--baseline", default=None,
                    help="an older snapstore checkout (built in place) for the latency ratio")
    ap.add_argument("--latency-rounds", type=int, default=30)
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temp dir)")
    args = ap.parse_args()
    size = args.size_mib << 20
    base = tempfile.mkdtemp(prefix="bench-writers-", dir=args.dir)
    try:
        print(f"writer scaling: {args.size_mib} MiB state per writer, {args.changed:.0%} of "
              f"pages changed per "
              f"checkpoint, {args.rounds} checkpoints per writer, durability fsync, "
              f"{os.cpu_count()} cores")
        print(f"{'writers':>7} {'parallel s':>10} {'sequential s':>12} {'ratio':>6} "
              f"{'ckpt/s par':>10} {'ckpt/s seq':>10} {'median ms par':>13}")
        for n in [int(x) for x in args.writers.split(",")]:
            par = run_writers(ROOT, fresh(base, f"p{n}"), n, size, args.rounds, True,
                              args.changed)
            seq = run_writers(ROOT, fresh(base, f"s{n}"), n, size, args.rounds, False,
                              args.changed)
            total = n * args.rounds
            print(f"{n:>7} {par['wall']:>10.2f} {seq['wall']:>12.2f} "
                  f"{par['wall'] / seq['wall']:>6.2f} {total / par['wall']:>10.1f} "
                  f"{total / seq['wall']:>10.1f} {statistics.median(par['times']) * 1e3:>13.1f}")
            shutil.rmtree(os.path.join(base, f"p{n}"), ignore_errors=True)
            shutil.rmtree(os.path.join(base, f"s{n}"), ignore_errors=True)
        if args.baseline:
            print(f"\ncommit latency: one writer, {args.latency_rounds} checkpoints, median "
                  "(this checkout vs --baseline, alternating runs)")
            mine, theirs = [], []
            for k in range(3):
                for label, pkg, out in (("this", ROOT, mine), ("baseline", args.baseline,
                                                                theirs)):
                    r = run_writers(pkg, fresh(base, f"l{label}{k}"), 1, size,
                                    args.latency_rounds, True)
                    out.extend(r["times"])
                    shutil.rmtree(os.path.join(base, f"l{label}{k}"), ignore_errors=True)
            m, t = statistics.median(mine), statistics.median(theirs)
            print(f"  this checkout {m * 1e3:.1f} ms, baseline {t * 1e3:.1f} ms: "
                  f"ratio {m / t:.3f}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
