"""The checkpoint-overhead benchmark behind ``snapstore bench``, usable as a library.

    from snapstore import bench
    result = bench.run([bench.Workload(size=64 << 20, dirty=0.01)])
    print(bench.format_table(result))

What one workload does (every method - snapstore and each baseline - in this process, on the
same bytes, interleaved step by step so all see the same machine conditions):

1. build the state: ``buffers`` bytearrays totalling ``size`` bytes (random, or compressible);
2. every method checkpoints it once (the first, full checkpoint: reported separately);
3. ``checkpoints`` times: mutate ``dirty`` of the state with ``pattern`` (untimed), then every
   method checkpoints it in turn, who goes first rotating (timed: the wall time the caller is
   blocked);
4. every method restores the latest and the oldest checkpoint into fresh memory,
   ``restore_repeats`` times (timed; with ``cache="cold"`` the method's files are first synced
   and dropped from the page cache with posix_fadvise(DONTNEED), so restores read the disk),
   and the first restore of each is checked byte for byte.

Methods: "snapstore" (the store; ``durability``, ``chunking``, ``compression`` apply);
"raw" (every buffer written to one new file per checkpoint, + fsync of file and directory when
durability is "fsync"); "pickle" (pickle.dump of the whole {name: bytearray} state, protocol 5,
to one file per checkpoint, + fsync); "numpy" (numpy.save of every buffer into one file per
checkpoint, + fsync; when numpy is importable); "restic" / "borg" (the state written to a file,
then ``restic backup`` / ``borg create`` of it; when the tool is on PATH and asked for: the
default methods, ``runner.DEFAULT_METHODS``, leave these peers out). Baselines keep every
checkpoint (one file each), as a snapshot store must to restore old states.

Figures per method (keys of the result dicts, see ``runner.METRIC_KEYS``): caller-blocked
seconds per checkpoint (median, p95 by nearest rank: with fewer than 20 checkpoints p95 is the
maximum), bytes written per checkpoint (write-syscall bytes of this process from /proc/self/io,
which includes the index; file growth for external tools), disk growth per checkpoint
(allocated blocks), restore seconds (latest, oldest; median of ``restore_repeats`` timings),
and peak memory: growth of the process's peak RSS (VmHWM, reset through /proc/self/clear_refs)
over its RSS before the call - C allocations included, unlike tracemalloc (for restic / borg:
the tool process's own peak RSS, from wait4). Baseline dicts carry ``vs_snapstore``: their
figure divided by snapstore's (so 30.0 means the baseline costs 30x what snapstore does).

``runner.plan(workloads, methods)`` says before a run which methods run, how many progress
steps it makes, roughly how long it takes and how much disk it needs, and refuses a state that
would outgrow memory (by its size at the last checkpoint: an "appended" state grows).

Modules: workloads (the state and its changes), measuring (timers, memory, disk, machine),
methods (snapstore and the in-process baselines), peers (restic, borg), runner (running
workloads, plans), report (table, plot, JSON), errors (BenchError).
"""
from snapstore.bench.errors import BenchError
from snapstore.bench.report import format_table, plot, to_json
from snapstore.bench.runner import available_methods, run, run_workload
from snapstore.bench.workloads import Workload

__all__ = ["BenchError", "Workload", "available_methods", "format_table", "plot", "run",
           "run_workload", "to_json"]
