"""Space of the README's training loop (issue 15): does retain() give space back?

Workload: the README's loop with NumPy instead of torch: `store.save({"w": w, "step": i},
"train")` of a dense float32 array (default 32 MiB, every value changed before each save),
then `store.retain("train", keep_last=3)` after each save; never an explicit compact().
Reported: the store's bytes on disk at the end (allocated blocks of every file under the store
directory, segments + index, what `du` shows), the same as a multiple of the state's size, and
the largest such multiple after any retain() of the loop, and the seconds each save() and
each retain() (with its prune) took (median, mean and max).

`--no-prune` runs retain(prune=False) (the behaviour before issue 15: delete only). On a
snapstore whose retain() has no `prune` argument (main before issue 15) the script just calls
retain(), so the "before" figure comes from the same script.

    python3 benchmarks/bench_retention.py [--size-mib 32] [--saves 15] [--keep-last 3]
        [--no-prune] [--segment-mib N] [--dir /path/on/real/disk] [--json]
"""
from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import snapstore  # noqa: E402
from snapstore.bench.measuring import disk_usage  # noqa: E402  (st_blocks: what du counts)


def run(size_mib: int, saves: int, keep_last: int, prune: bool, base: str | None,
        segment_mib: int | None = None) -> dict:
    """Runs the loop in a fresh store; returns the figures."""
    work = tempfile.mkdtemp(prefix="bench-retention-", dir=base)
    path = os.path.join(work, "store")
    has_prune = "prune" in inspect.signature(snapstore.Store.retain).parameters
    kwargs = {"prune": prune} if has_prune else {}
    rng = np.random.default_rng(0)
    w = rng.standard_normal(size_mib * (1 << 20) // 4, dtype=np.float32)
    save_s, retain_s, freed, peaks = [], [], [], []
    try:
        opts = {"segment_size": segment_mib << 20} if segment_mib else {}
        with snapstore.open(path, **opts) as store:
            for step in range(saves):
                w += np.float32(1.0)                     # every value changes
                t0 = time.perf_counter()
                store.save({"w": w, "step": step}, "train")
                t1 = time.perf_counter()
                result = store.retain("train", keep_last=keep_last, **kwargs)
                t2 = time.perf_counter()
                save_s.append(t1 - t0)
                retain_s.append(t2 - t1)
                freed.append(getattr(result, "bytes_freed", None) or 0)
                peaks.append(disk_usage(path))
            stats = store.stats()
        on_disk = disk_usage(path)
        state = w.nbytes
        return {"snapstore": os.path.dirname(snapstore.__file__), "retain_has_prune": has_prune,
                "prune": prune and has_prune, "state_bytes": state, "saves": saves,
                "keep_last": keep_last, "store_bytes_on_disk": on_disk,
                "store_over_state": on_disk / state,
                "segment_bytes": stats["segment_bytes"], "index_bytes": stats["index_bytes"],
                "save_seconds_median": statistics.median(save_s),
                "retain_seconds_median": statistics.median(retain_s),
                "retain_seconds_mean": statistics.mean(retain_s),
                "retain_seconds_max": max(retain_s), "segment_mib": segment_mib,
                "max_store_over_state": max(peaks) / state,
                "bytes_freed_total": sum(freed)}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=32)
    ap.add_argument("--saves", type=int, default=15)
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--no-prune", dest="prune", action="store_false", default=True)
    ap.add_argument("--segment-mib", type=int, default=None,
                    help="the store's segment_size (default: the store's default)")
    ap.add_argument("--dir", default=None, help="where the temporary store goes")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = run(a.size_mib, a.saves, a.keep_last, a.prune, a.dir, a.segment_mib)
    if a.json:
        print(json.dumps(r, indent=2))
        return
    mib = 1 << 20
    print(f"snapstore at {r['snapstore']} (retain has prune: {r['retain_has_prune']}, "
          f"prune={r['prune']})")
    print(f"{r['saves']} dense saves of {r['state_bytes'] / mib:.0f} MiB, "
          f"retain(keep_last={r['keep_last']}) after each")
    print(f"store on disk at the end: {r['store_bytes_on_disk'] / mib:.1f} MiB "
          f"({r['store_over_state']:.2f}x the state; segments "
          f"{r['segment_bytes'] / mib:.1f} MiB, index {r['index_bytes'] / mib:.2f} MiB); "
          f"largest after any retain: {r['max_store_over_state']:.2f}x")
    print(f"per save: save() {r['save_seconds_median'] * 1000:.0f} ms median, retain() "
          f"{r['retain_seconds_median'] * 1000:.0f} ms median / "
          f"{r['retain_seconds_mean'] * 1000:.0f} ms mean / "
          f"{r['retain_seconds_max'] * 1000:.0f} ms max; freed by retain in total "
          f"{r['bytes_freed_total'] / mib:.1f} MiB")


if __name__ == "__main__":
    main()
