"""Speed of `snapstore diff` (snapstore.diff.diff_checkpoints) on two checkpoints of a float32
buffer, against baselines measured in the same run.

Usage:  python3 benchmarks/bench_diff.py [SIZE] [--before PATH]
        SIZE like 144MiB (default, the size in issue 15); --before PATH also times the diff of
        the snapstore package found at PATH (e.g. a checkout of main) on the same stores.
Env:    SNAPSTORE_BENCH_REPS (best of N, default 3).

Cases: "1% pages" (1% of the 4 KiB pages changed: an incremental checkpoint) and "100%"
(every element += 1e-3: a full one, as after a training step). Baselines: "restore both"
(Store.restore of the two checkpoints: what any diff that reads everything costs) and
"compare" (numpy compare of the two restored byte strings, in memory). MB/s counts the bytes
of the larger checkpoint, warm cache.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import snapstore  # noqa: E402
from snapstore import diff  # noqa: E402
from snapstore.formatting import parse_size, text_table  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def best_of(reps: int, fn) -> float:
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def make_store(path: str, size: int, case: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(size // 4, dtype=np.float32)
    b = a.copy()
    if case == "1% pages":
        per = 1024                                       # float32 elements per 4 KiB page
        pages = rng.choice(len(b) // per, max(1, len(b) // per // 100), replace=False)
        for p in pages:
            b[p * per:(p + 1) * per] += 1.0
    else:
        b += np.float32(1e-3)
    with snapstore.open(path, durability="none") as s:
        s.checkpoint({"w": a})
        s.checkpoint({"w": b})


BEFORE_SNIPPET = """
import sys, time
sys.path.insert(0, sys.argv[1])
import snapstore
from snapstore import diff
s = snapstore.open(sys.argv[2], readonly=True)
a, b = s.get(1), s.get(2)
best = float("inf")
for _ in range(int(sys.argv[3])):
    t = time.perf_counter(); diff.diff_checkpoints(s, a, b); best = min(best, time.perf_counter() - t)
assert snapstore.__file__.startswith(sys.argv[1]), snapstore.__file__
print(best)
"""


def time_before(package_root: str, store: str, reps: int) -> float:
    out = subprocess.run([sys.executable, "-c", BEFORE_SNIPPET, package_root, store, str(reps)],
                         capture_output=True, text=True, check=True, cwd=package_root,
                         env={**os.environ, "PYTHONPATH": package_root})
    return float(out.stdout.split()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("size", nargs="?", default="144MiB")
    p.add_argument("--before", metavar="PATH", help="a snapstore checkout to time as 'before'")
    args = p.parse_args()
    size = parse_size(args.size)
    size -= size % 4096
    reps = int(os.environ.get("SNAPSTORE_BENCH_REPS", "3"))
    mb = size / 1e6
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_diff_") as tmp:
        for case in ("1% pages", "100%"):
            path = os.path.join(tmp, case.replace("%", "pct").replace(" ", "_"))
            make_store(path, size, case)
            with snapstore.open(path, readonly=True) as s:
                a, b = s.get(1), s.get(2)
                report = diff.diff_checkpoints(s, a, b)
                t_diff = best_of(reps, lambda: diff.diff_checkpoints(s, a, b))
                t_restore = best_of(reps, lambda: (s.restore(1), s.restore(2)))
                x = np.frombuffer(s.restore(1)["w"], np.uint8)
                y = np.frombuffer(s.restore(2)["w"], np.uint8)
                t_cmp = best_of(reps, lambda: np.array_equal(x, y))
            row = [case, f"{report['changed_bytes'] / size:.1%}", f"{t_diff:.3f}",
                   f"{mb / t_diff:,.0f}", f"{t_restore:.3f}", f"{t_cmp:.3f}",
                   f"{t_diff / t_restore:.2f}"]
            if args.before:
                t_before = time_before(os.path.abspath(args.before), path, 1)
                row += [f"{t_before:.2f}", f"{mb / t_before:,.1f}", f"{t_before / t_diff:,.0f}x"]
            rows.append(row)
    header = ["case", "bytes differ", "diff s", "MB/s", "restore both s", "compare s",
              "diff/restore"]
    if args.before:
        header += ["before s", "before MB/s", "speedup"]
    print(f"snapstore diff of two {size / 2**20:.0f} MiB checkpoints (float32), best of {reps}, "
          f"warm cache; MB/s of one checkpoint")
    print(text_table(header, rows, right=range(1, len(header))))


if __name__ == "__main__":
    main()
