"""pytest-benchmark suite of the checkpoint store: checkpoint (full, incremental, CDC),
restore, windowed reads, compaction and verification, with a raw write+fsync baseline on the
same state. Not part of the default test run (pyproject testpaths = tests).

Run:  python3 -m pytest benchmarks/test_bench_store.py --benchmark-only
Env:  SNAPSTORE_BENCH_SIZE (state size, default 64MiB; e.g. 1GiB), SNAPSTORE_BENCH_DIR (where
      stores are written; default pytest's tmp dir - use a real disk, not tmpfs).

The state and its changes come from snapstore.bench.workloads (as in `snapstore bench`), so
the figures are comparable with that command's table.
"""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile

import pytest

import snapstore
from snapstore.bench import workloads
from snapstore.formatting import parse_size

SIZE = parse_size(os.environ.get("SNAPSTORE_BENCH_SIZE", "64MiB"))
CHAIN = 8


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    base = os.environ.get("SNAPSTORE_BENCH_DIR")
    path = tempfile.mkdtemp(prefix="snapbench-", dir=base) if base else \
        str(tmp_path_factory.mktemp("store-bench"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _workload(**kw):
    opts = dict(size=SIZE, buffers=4, dirty=0.01, pattern="scattered", checkpoints=CHAIN)
    opts.update(kw)
    return workloads.Workload(**opts).validate()


def _fresh(workdir, name):
    path = os.path.join(workdir, name)
    shutil.rmtree(path, ignore_errors=True)
    return path


_steps = itertools.count(1)


# ---- checkpoint ------------------------------------------------------------------------------
def test_raw_write_fsync_baseline(benchmark, workdir):
    state = workloads.make_state(_workload())
    path = os.path.join(workdir, "raw.bin")

    def write():
        with open(path, "wb", buffering=0) as f:
            for buf in state.values():
                f.write(buf)
            os.fsync(f.fileno())
    benchmark.pedantic(write, rounds=3, warmup_rounds=1)
    os.unlink(path)


def test_checkpoint_full(benchmark, workdir):
    w = _workload()
    state = workloads.make_state(w)
    holder = {}

    def setup():
        if "s" in holder:
            holder["s"].close()
        holder["s"] = snapstore.open(_fresh(workdir, "full"), durability="fsync")
        return (state,), {}
    info = benchmark.pedantic(lambda st: holder["s"].checkpoint(st), setup=setup, rounds=3)
    holder["s"].close()
    assert info.kind == "full"


@pytest.mark.parametrize("durability", ["fsync", "none"])
@pytest.mark.parametrize("pattern", ["scattered", "clustered"])
def test_checkpoint_incremental_1pct(benchmark, workdir, durability, pattern):
    w = _workload(durability=durability, pattern=pattern)
    state = workloads.make_state(w)
    with snapstore.open(_fresh(workdir, f"inc-{durability}-{pattern}"),
                        durability=durability) as s:
        s.checkpoint(state)

        def setup():
            workloads.mutate(state, w, next(_steps))
            return (state,), {}
        info = benchmark.pedantic(s.checkpoint, setup=setup, rounds=CHAIN)
        assert info.kind == "incremental"
        benchmark.extra_info["bytes_new"] = info.bytes_new


def test_checkpoint_cdc_shifted(benchmark, workdir):
    w = _workload(pattern="shifted", chunking="cdc", dirty=0.001)
    state = workloads.make_state(w)
    with snapstore.open(_fresh(workdir, "cdc"), chunking="cdc") as s:
        s.checkpoint(state)

        def setup():
            workloads.mutate(state, w, next(_steps))
            return (state,), {}
        info = benchmark.pedantic(s.checkpoint, setup=setup, rounds=4)
        benchmark.extra_info["bytes_new"] = info.bytes_new
        assert info.bytes_new < SIZE / 4       # shifted content is mostly deduplicated


# ---- restore and read ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def chained(workdir):
    """A store with one full checkpoint and CHAIN incremental ones (1% scattered each)."""
    w = _workload()
    state = workloads.make_state(w)
    path = _fresh(workdir, "chained")
    with snapstore.open(path, durability="none", max_chain=CHAIN + 1) as s:
        first = s.checkpoint(state)
        for step in range(1, CHAIN + 1):
            workloads.mutate(state, w, step)
            last = s.checkpoint(state)
    return path, first.id, last.id, workloads.digest(state)


def test_restore_oldest_full(benchmark, chained):
    path, first, _, _ = chained
    with snapstore.open(path) as s:
        out = benchmark.pedantic(s.restore, args=(first,), rounds=3)
    assert sum(map(len, out.values())) == SIZE


def test_restore_latest_chain(benchmark, chained):
    path, _, last, expected = chained
    with snapstore.open(path) as s:
        assert s.get(last).chain_length == CHAIN
        out = benchmark.pedantic(s.restore, args=(last,), rounds=3)
    assert workloads.digest(out) == expected


def test_restore_into_preallocated(benchmark, chained):
    path, _, last, expected = chained
    with snapstore.open(path) as s:
        targets = {n: bytearray(size) for n, size in s.get(last).sizes.items()}
        benchmark.pedantic(s.restore_into, args=(last, targets), rounds=3)
    assert workloads.digest(targets) == expected


def test_read_8mib_window(benchmark, chained):
    path, _, last, _ = chained
    with snapstore.open(path) as s:
        name = next(iter(s.get(last).sizes))
        data = benchmark(s.read, last, name, 0, min(8 << 20, s.get(last).sizes[name]))
    assert data


# ---- maintenance ---------------------------------------------------------------------------
def test_compact_after_deleting_half(benchmark, workdir):
    w = _workload(size=min(SIZE, 32 << 20))
    path = os.path.join(workdir, "compact")

    def setup():
        shutil.rmtree(path, ignore_errors=True)
        state = workloads.make_state(w)
        with snapstore.open(path, durability="none") as s:
            ids = [s.checkpoint(state).id]
            for step in range(1, CHAIN + 1):
                workloads.mutate(state, w, step)
                ids.append(s.checkpoint(state).id)
            for cid in ids[:-1:2]:
                s.delete(cid)
        return (), {}

    def compact():
        with snapstore.open(path, durability="none") as s:
            return s.compact(threshold=1.0)
    report = benchmark.pedantic(compact, setup=setup, rounds=3)
    benchmark.extra_info.update({k: v for k, v in report.items()
                                 if isinstance(v, (int, float))})


def test_verify_deep(benchmark, chained):
    path = chained[0]
    with snapstore.open(path) as s:
        report = benchmark.pedantic(s.verify, kwargs={"deep": True}, rounds=2)
    assert report["ok"] is True
