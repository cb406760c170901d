"""Dirty-page detection cost: uffd (kernel write tracking) vs hash (fingerprint diff) for big
buffers with the same number of dirty pages.

Usage:  python3 benchmarks/bench_dirty.py [SIZE ...]   (default: 1GiB 8GiB)
Env:    SNAPSTORE_BENCH_DIRTY_PAGES  pages written between checks (default 2621: 1% of 1 GiB)
        SNAPSTORE_BENCH_ROUNDS       checks per mode (median reported; default 7)
        SNAPSTORE_BENCH_MODES        comma list (default uffd,hash; shadow needs 2 x SIZE)

For every size: one anonymous numpy buffer (populated), then per mode a detector; between
rounds one byte of each of DIRTY_PAGES random pages is changed. Columns:
  arm        first dirty() (returns None: sets the baseline; hash/shadow read everything)
  dirty()    median time of dirty() (what a checkpoint is blocked for to find the pages), wall
             clock and, in brackets, this process's CPU time (robust on a busy shared machine)
  +copy      median of dirty() + gathering the reported bytes + note_stored_many (the
             blocked part of a Tracker checkpoint, without the store's planning)
  note/range the same note as one note_stored() call per range instead (what the Tracker's
             writer.stage does today): the Python cost of thousands of calls
  reported   bytes reported per round (the changed 4 KiB pages; exact in both modes)
Every round checks that each written byte lies in a reported range. Memory: SIZE (+SIZE for
shadow); freed between sizes.
"""
from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import numpy as np

from snapstore import _native as nat
from snapstore.capture import dirty
from snapstore.formatting import human_bytes, parse_size

PAGE = 4096


def bench_mode(a: np.ndarray, mode: str, n_dirty: int, rounds: int, rng) -> dict:
    t = time.perf_counter()
    det = dirty.make_detector(a, mode)
    t_make = time.perf_counter() - t
    if det.mode != mode:
        det.close()
        return {"mode": mode, "skipped": det.reason}
    staging = np.empty(n_dirty * 2 * PAGE + PAGE, np.uint8)
    t = time.perf_counter()
    assert det.dirty() is None
    t_arm = time.perf_counter() - t
    pages = a.size // PAGE
    t_dirty, t_blocked, t_note1, c_dirty, reported = [], [], [], [], []
    for _ in range(rounds):
        idx = rng.choice(pages, n_dirty, replace=False) * PAGE + rng.integers(0, PAGE, n_dirty)
        a[idx] += 1
        c0, t0 = time.process_time(), time.perf_counter()
        ranges = det.dirty()
        t1, c1 = time.perf_counter(), time.process_time()
        c_dirty.append(c1 - c0)
        filled = nat.gather(a, ranges, staging)
        det.note_stored_many(ranges, filled)
        t2 = time.perf_counter()
        pieces, pos = [], 0
        for off, length in ranges:
            pieces.append((off, filled[pos:pos + length]))
            pos += length
        t3 = time.perf_counter()
        for off, piece in pieces:
            det.note_stored(off, piece)
        t_note1.append(time.perf_counter() - t3)
        t_dirty.append(t1 - t0)
        t_blocked.append(t2 - t0)
        reported.append(sum(n for _, n in ranges))
        starts = np.array([o for o, _ in ranges], np.int64)
        ends = starts + np.array([n for _, n in ranges], np.int64)
        k = np.searchsorted(starts, idx, side="right") - 1
        assert (k >= 0).all() and (idx < ends[k]).all(), "a written byte was not reported"
    det.close()
    return {"mode": mode, "make": t_make, "arm": t_arm, "dirty": statistics.median(t_dirty),
            "cdirty": statistics.median(c_dirty),
            "blocked": statistics.median(t_blocked), "note1": statistics.median(t_note1),
            "reported": statistics.median(reported),
            "reason": det.reason}


def main() -> None:
    sizes = [parse_size(s) for s in (sys.argv[1:] or ["1GiB", "8GiB"])]
    n_dirty = int(os.environ.get("SNAPSTORE_BENCH_DIRTY_PAGES", "2621"))
    rounds = int(os.environ.get("SNAPSTORE_BENCH_ROUNDS", "7"))
    modes = os.environ.get("SNAPSTORE_BENCH_MODES", "uffd,hash").split(",")
    ok, why = dirty.uffd_available()
    print(f"# {os.uname().release}; uffd: {why}")
    print(f"# {n_dirty} random 4 KiB pages changed per round, median of {rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| buffer | mode | make_detector | arm (1st dirty) | dirty() | dirty+copy+note_many "
          "| note_stored per range | reported |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(1)
    for size in sizes:
        size -= size % PAGE
        a = np.empty(size, np.uint8)
        a.fill(1)                                  # populate every page
        for mode in modes:
            r = bench_mode(a, mode, n_dirty, rounds, rng)
            if "skipped" in r:
                print(f"| {human_bytes(size)} | {mode} | skipped: {r['skipped']} ||||||")
                continue
            print(f"| {human_bytes(size)} | {mode} | {r['make'] * 1e3:.1f} ms | {r['arm'] * 1e3:.0f} ms "
                  f"| {r['dirty'] * 1e3:.1f} ms ({r['cdirty'] * 1e3:.1f}) "
                  f"| {r['blocked'] * 1e3:.1f} ms "
                  f"| {r['note1'] * 1e3:.1f} ms | {human_bytes(r['reported'])} |", flush=True)
        del a
        gc.collect()


if __name__ == "__main__":
    main()
