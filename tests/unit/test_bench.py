"""The benchmark harness (snapstore.bench) in-process on tiny states, and `snapstore bench` as
a real program producing the documented JSON."""
from __future__ import annotations

import json
import re
import math
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from cli_runner import console_script
from snapstore import bench
from snapstore.bench import measuring, peers, runner, workloads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
LOCAL = ["snapstore", "raw", "pickle"]


def tiny(**kw):
    opts = dict(size=MiB, buffers=2, dirty=0.02, checkpoints=2, durability="none",
                restore_repeats=1)
    opts.update(kw)
    return bench.Workload(**opts)


# ---- state and mutations ------------------------------------------------------------------
def test_make_state_is_deterministic_and_page_aligned():
    w = tiny(size=3 * MiB + 100, buffers=3)
    s1, s2 = workloads.make_state(w), workloads.make_state(w)
    assert s1 == s2 and list(s1) == ["buf000", "buf001", "buf002"]
    assert sum(map(len, s1.values())) == w.size
    assert all(len(b) % workloads.PAGE == 0 for b in list(s1.values())[:-1])
    assert workloads.make_state(tiny(seed=1)) != workloads.make_state(tiny())
    c = workloads.make_state(tiny(content="compressible"))["buf000"]
    assert max(c) < 16


def _changed_pages(a: bytes, b: bytes) -> int:
    return sum(1 for i in range(0, len(a), workloads.PAGE)
               if a[i:i + workloads.PAGE] != b[i:i + workloads.PAGE])


@pytest.mark.parametrize("dirty", [0.05, 0.5, 1.0])
@pytest.mark.parametrize("pattern", ["scattered", "clustered"])
def test_page_patterns_dirty_the_requested_fraction(pattern, dirty):
    # regression: clustered runs could overlap, so --dirty 0.5 changed 42% of the pages and
    # 1.0 changed 64%, while the table said 0.5 and 1
    w = tiny(size=4 * MiB, dirty=dirty, pattern=pattern)
    state = workloads.make_state(w)
    before = {n: bytes(b) for n, b in state.items()}
    written = workloads.mutate(state, w, 1)
    pages = sum(_changed_pages(before[n], state[n]) for n in state)
    expect = round(dirty * 4 * MiB / workloads.PAGE)
    assert pages == expect and written == expect * workloads.DIRTY_WRITE
    assert {n: len(b) for n, b in state.items()} == {n: len(b) for n, b in before.items()}
    again = {n: bytearray(b) for n, b in before.items()}
    workloads.mutate(again, w, 1)
    assert again == state                          # deterministic per (seed, step)


def test_clustered_pages_are_runs():
    w = tiny(size=4 * MiB, dirty=0.05, pattern="clustered", buffers=1)
    state = workloads.make_state(w)
    before = bytes(state["buf000"])
    workloads.mutate(state, w, 1)
    dirty = [i // workloads.PAGE for i in range(0, len(before), workloads.PAGE)
             if before[i:i + workloads.PAGE] != state["buf000"][i:i + workloads.PAGE]]
    breaks = sum(1 for a, b in zip(dirty, dirty[1:]) if b != a + 1)
    assert breaks <= math.ceil(len(dirty) / workloads.CLUSTER_PAGES)


def test_shifted_and_appended():
    w = tiny(size=2 * MiB, dirty=0.01, pattern="shifted", buffers=1)
    state = workloads.make_state(w)
    before = bytes(state["buf000"])
    assert workloads.mutate(state, w, 1) == round(0.01 * 2 * MiB)
    assert len(state["buf000"]) == len(before) and state["buf000"] != before
    w = tiny(size=2 * MiB, dirty=0.01, pattern="appended", buffers=2)
    state = workloads.make_state(w)
    sizes = [len(b) for b in state.values()]
    workloads.mutate(state, w, 1)
    assert [len(b) for b in state.values()] == [s + round(0.01 * 2 * MiB / 2) for s in sizes]


def test_zero_dirty_changes_nothing():
    w = tiny(dirty=0.0)
    state = workloads.make_state(w)
    before = {n: bytes(b) for n, b in state.items()}
    assert workloads.mutate(state, w, 1) == 0 and state == before


@pytest.mark.parametrize("bad", [dict(size=10), dict(buffers=0), dict(dirty=1.5),
                                 dict(checkpoints=0), dict(pattern="zigzag"),
                                 dict(restore_repeats=0),
                                 dict(durability="maybe"), dict(chunking="x")])
def test_workload_validation(bad):
    with pytest.raises(bench.BenchError):
        tiny(**bad).validate()


# ---- statistics and helpers ---------------------------------------------------------------
def test_percentile_and_summary():
    assert measuring.percentile([5, 1, 4, 2, 3], 95) == 5
    assert measuring.percentile(list(range(1, 101)), 95) == 95
    assert measuring.percentile([7], 50) == 7
    s = measuring.summary([4, 1, 3, 2])
    assert s["median"] == 2.5 and s["min"] == 1 and s["max"] == 4 and s["p95"] == 4
    assert s["samples"] == [4, 1, 3, 2]


def test_peak_memory_sees_c_allocations():
    if not measuring.PeakMemory.supported():
        pytest.skip("no /proc/self/clear_refs")
    import mmap
    with measuring.PeakMemory() as m:
        # A fresh private mapping: malloc could hand back memory that earlier tests freed and
        # that is still resident, which would not raise the peak.
        buf = mmap.mmap(-1, 64 * MiB, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        view = memoryview(buf)
        view[::4096] = b"x" * len(view[::4096])
        view.release()
        buf.close()
    assert m.extra is not None and m.extra >= 48 * MiB


def test_to_json_replaces_non_finite():
    assert json.loads(bench.to_json({"a": math.inf, "b": [math.nan, 1.0]})) == \
        {"a": None, "b": [None, 1.0]}


# ---- running workloads --------------------------------------------------------------------
def _check_method(res, checkpoints):
    for key in runner.METRIC_KEYS:
        assert key in res, key
    assert res["available"] is True and res["skipped"] is None and res["verified"] is True
    assert len(res["checkpoint_seconds"]["samples"]) == checkpoints
    assert res["checkpoint_seconds"]["p95"] >= res["checkpoint_seconds"]["median"] > 0
    assert res["bytes_written_per_checkpoint"]["median"] > 0
    assert res["restore_latest_seconds"] > 0 and res["restore_oldest_seconds"] > 0
    assert res["store_bytes"] > 0


def test_run_workload_measures_snapstore_and_baselines(tmp_path, monkeypatch):
    monkeypatch.setattr(peers.shutil, "which", lambda name: None)
    methods = ["snapstore", "raw", "pickle", "numpy", "restic", "borg"]
    out = bench.run_workload(tiny(cache="cold", durability="fsync"), methods=methods,
                             workdir=str(tmp_path))
    res = out["results"]
    assert out["workload"]["size"] == MiB and "scattered" in out["description"]
    _check_method(res["snapstore"], 2)
    assert res["snapstore"]["snapstore"]["kinds"] == ["full", "incremental", "incremental"]
    for name in ("raw", "pickle") + (("numpy",) if res["numpy"]["available"] else ()):
        _check_method(res[name], 2)
        assert set(res[name]["vs_snapstore"]) == set(runner.RATIO_KEYS)
        # a whole-state baseline writes the whole state every time; snapstore ~2% of it
        assert res[name]["bytes_written_per_checkpoint"]["median"] >= MiB
        assert res[name]["vs_snapstore"]["bytes_written"] > 5
    assert res["snapstore"]["bytes_written_per_checkpoint"]["median"] < MiB / 4
    for name in ("restic", "borg"):
        assert res[name]["available"] is False and "not found" in res[name]["skipped"]
    assert os.listdir(tmp_path) == []            # every method cleaned up after itself
    table = bench.format_table({"workloads": [out]})
    # the ratios moved from "(Nx)" inside each cell to a "vs snapstore" row under each baseline
    assert "snapstore" in table and "raw" in table
    assert re.search(r"^  vs snapstore +\d+\.\dx", table, re.M), table
    assert "skipped: restic (restic not found on PATH)" in table


@pytest.mark.parametrize("pattern,chunking", [("shifted", "cdc"), ("appended", "pages"),
                                              ("clustered", "pages")])
def test_run_other_patterns_restore_exactly(tmp_path, pattern, chunking):
    out = bench.run_workload(tiny(pattern=pattern, chunking=chunking, cache="warm",
                                  content="compressible"),
                             methods=["snapstore", "raw"], workdir=str(tmp_path))
    for res in out["results"].values():
        assert res["verified"] is True


def test_unknown_method():
    with pytest.raises(bench.BenchError):
        bench.available_methods(["snapstore", "tar"])


FAKE_RESTIC = """\
import json, os, shutil, sys
args = sys.argv[1:]
repo = os.environ["RESTIC_REPOSITORY"]
assert os.environ["RESTIC_PASSWORD"]
if args[0] == "init":
    os.makedirs(os.path.join(repo, "snaps"))
elif args[0] == "backup":
    n = str(len(os.listdir(os.path.join(repo, "snaps"))))
    shutil.copy(args[-1], os.path.join(repo, "snaps", n))
    print(json.dumps({"message_type": "status", "percent_done": 1}))
    print(json.dumps({"message_type": "summary", "snapshot_id": n}))
elif args[0] == "restore":
    snap, target = args[2], args[args.index("--target") + 1]
    shutil.copy(os.path.join(repo, "snaps", snap), os.path.join(target, "state.bin"))
else:
    sys.exit(3)
"""

FAKE_BORG = """\
import os, shutil, sys
args = sys.argv[1:]
if args[0] == "init":
    os.makedirs(args[-1])
elif args[0] == "create":
    repo, name = args[1].split("::")
    shutil.copy(args[2], os.path.join(repo, name))
elif args[0] == "extract":
    repo, name = args[1].split("::")
    shutil.copy(os.path.join(repo, name), "state.bin")
else:
    sys.exit(3)
"""


def test_external_tools_protocol_with_fakes(tmp_path, monkeypatch):
    """restic and borg are driven through their command lines; fakes check the protocol."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, body in (("restic", FAKE_RESTIC), ("borg", FAKE_BORG)):
        path = bindir / name
        path.write_text(f"#!{sys.executable}\n" + body)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    work = tmp_path / "work"
    work.mkdir()
    out = bench.run_workload(tiny(cache="warm"), methods=["snapstore", "restic", "borg"],
                             workdir=str(work))
    for name in ("restic", "borg"):
        res = out["results"][name]
        assert res["available"] is True and res["verified"] is True, res
        assert res["bytes_written_per_checkpoint"]["median"] >= MiB
        assert "vs_snapstore" in res
        assert res["peak_memory_bytes"] > 1 << 20          # the fake's own RSS, via wait4


def test_plot_without_matplotlib_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(bench.BenchError, match="matplotlib"):
        bench.plot({"workloads": []}, "x.png")


# ---- `snapstore bench` as a program -----------------------------------------------------------
def _bench(*args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SNAPSTORE_PROGRESS", None)
    return subprocess.run([console_script(), "bench", *map(str, args)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_cli_bench_json_has_the_documented_keys(tmp_path):
    p = _bench("--size", "2MiB", "--buffers", "2", "--checkpoints", "2", "--dirty", "1%,0.05",
               "--restore-repeats", "2",
               "--methods", "snapstore,raw,pickle,restic", "--dir", tmp_path, "--json")
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""                        # no progress bar: stderr is not a terminal
    data = json.loads(p.stdout)
    assert {"machine", "command", "methods", "workloads", "seconds"} <= set(data)
    assert data["command"][:2] == ["snapstore", "bench"]
    assert data["machine"]["bench_fs"] and data["machine"]["cpus"]
    assert len(data["machine"]["loadavg_before"]) == 3
    assert [w["workload"]["dirty"] for w in data["workloads"]] == [0.01, 0.05]
    for wl in data["workloads"]:
        assert wl["workload"]["size"] == 2 * MiB and wl["workload"]["checkpoints"] == 2
        assert list(wl["results"]) == ["snapstore", "raw", "pickle", "restic"]
        for name in ("snapstore", "raw", "pickle"):
            _check_method(wl["results"][name], 2)
            assert [len(v) for v in wl["results"][name]["restore_samples"].values()] == [2, 2]
        assert set(wl["results"]["raw"]["vs_snapstore"]) == set(runner.RATIO_KEYS)
        if wl["results"]["restic"]["available"] is False:
            assert wl["results"]["restic"]["skipped"]
    assert os.listdir(tmp_path) == []


def test_cli_bench_table(tmp_path):
    p = _bench("--size", "1MiB", "--checkpoints", "1", "--no-baselines", "--durability", "none",
               "--save", tmp_path / "r.json")
    assert p.returncode == 0, p.stderr
    saved = json.loads((tmp_path / "r.json").read_text())
    assert list(saved["workloads"][0]["results"]) == ["snapstore"]
    assert p.stdout.rstrip().endswith(bench.format_table(saved).splitlines()[-1])
    lines = p.stdout.splitlines()
    assert lines[0].startswith("workload: 1.0 MiB in 4 buffer(s)")
    # the workload line wraps at 100 columns; the header follows it (was "ckpt median")
    header = next(i for i, line in enumerate(lines) if line.startswith("method "))
    assert lines[header].split()[:3] == ["method", "ckpt", "med"]
    assert lines[header + 1].startswith("snapstore ")
    assert "'vs snapstore' rows: the baseline's figure divided by snapstore's" in \
        " ".join(line.strip() for line in lines)


@pytest.mark.parametrize("args,needle", [(["--dirty", "2"], "between 0 and 1"),
                                         (["--pattern", "zigzag"], "invalid choice"),
                                         (["--methods", "tar"], "invalid choice"),
                                         (["--size", "10"], "at least"),
                                         (["--dir", "/nonexistent/x"], "not a directory")])
def test_cli_bench_usage_errors(args, needle):
    p = _bench(*args)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.splitlines()) == 1 and needle in p.stderr


def test_cli_bench_plot(tmp_path):
    png = tmp_path / "o.png"
    p = _bench("--size", "1MiB", "--checkpoints", "1", "--no-baselines", "--plot", png)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert p.returncode == 1 and "matplotlib" in p.stderr
        assert len(p.stderr.splitlines()) == 1 and not png.exists()
        return
    assert p.returncode == 0, p.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_library_usage_in_docstring_runs(tmp_path):
    code = textwrap.dedent(f"""
        from snapstore import bench
        result = bench.run([bench.Workload(size=1 << 20, checkpoints=1, durability="none")],
                           methods=["snapstore", "raw"], workdir={str(tmp_path)!r})
        lines = bench.format_table(result).splitlines()
        print(lines[[l.split()[:1] for l in lines].index(["method"]) + 1].split()[0])
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "snapstore", p.stderr


def test_a_failing_baseline_is_reported_not_fatal(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "borg"
    tool.write_text(f"#!{sys.executable}\nimport sys\nprint('repo exploded', file=sys.stderr)\n"
                    "sys.exit(2)\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    work = tmp_path / "work"
    work.mkdir()
    out = bench.run_workload(tiny(checkpoints=1), methods=["snapstore", "borg"],
                             workdir=str(work))
    assert out["results"]["snapstore"]["verified"] is True
    borg = out["results"]["borg"]
    assert borg["available"] is False and "repo exploded" in borg["skipped"]
    assert os.listdir(work) == []



def test_raw_files_are_written_and_read_whole(tmp_path, monkeypatch):
    # regression: one raw write() may write less than asked (a full disk; Linux caps a call
    # at about 2 GiB) and the baseline kept the truncated file as a checkpoint
    from snapstore.bench import methods
    real_open = open

    class Dribble:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            return self.f.write(memoryview(data)[:1000])

        def readinto(self, view):
            return self.f.readinto(memoryview(view)[:1000])

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(methods, "open", lambda *a, **k: Dribble(real_open(*a, **k)),
                        raising=False)
    state = {"a": os.urandom(10_000), "b": bytearray(os.urandom(5_000))}
    path = str(tmp_path / "f")
    methods.write_buffers(path, state)
    assert os.path.getsize(path) == 15_000
    assert methods.read_buffers(path, {"a": 10_000, "b": 5_000}) == \
        {"a": state["a"], "b": bytes(state["b"])}
    with pytest.raises(OSError, match="ends 1 bytes early"):
        methods.read_buffers(path, {"a": 10_000, "b": 5_001})


def test_plan_measures_each_method_once_and_refuses_a_state_beyond_memory():
    plan = runner.plan([tiny()], ["raw", "raw", "snapstore"])
    assert plan.methods == ("snapstore", "raw")
    with pytest.raises(bench.BenchError, match="memory"):
        runner.plan([tiny(size=1 << 60)], ["raw"])


@pytest.mark.parametrize("bad", [dict(dirty="0.1"), dict(dirty=None), dict(seed="x"),
                                 dict(size=True)])
def test_workload_field_types_are_bench_errors(bad):
    with pytest.raises(bench.BenchError):
        tiny(**bad).validate()


def test_few_buffers_error_names_the_size_they_need():
    with pytest.raises(bench.BenchError, match="4 buffers need a state of at least 16384"):
        tiny(size=8192, buffers=4).validate()


def test_a_peer_is_measured_by_its_repository_and_its_backups(tmp_path, monkeypatch):
    # regressions: the growing scratch file the peer backs up counted as written, and the
    # peak memory of its restores (and of this process, inherited through fork) counted as
    # its checkpoints'
    bindir = tmp_path / "bin"
    bindir.mkdir()
    body = FAKE_RESTIC.replace(
        'elif args[0] == "restore":',
        'elif args[0] == "restore":\n    hog = bytearray(96 << 20)')
    path = bindir / "restic"
    path.write_text(f"#!{sys.executable}\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    work = tmp_path / "work"
    work.mkdir()
    w = tiny(pattern="appended", dirty=0.25, checkpoints=3, buffers=1)
    out = bench.run_workload(w, methods=["snapstore", "restic"], workdir=str(work))
    res = out["results"]["restic"]
    assert res["verified"] is True, res
    # the fake stores each step's whole state: 1.25, 1.5, 1.75 MiB (median 1.5 MiB)
    assert res["bytes_written_per_checkpoint"]["median"] == pytest.approx(1.5 * MiB, rel=0.02)
    if peers._gnu_time() is not None:
        assert res["peak_memory_bytes"] < 64 << 20     # not the restore's 96 MiB


# ---- a store that cannot be opened ------------------------------------------------------------
def _store_cannot_open(monkeypatch):
    from snapstore.bench import methods
    from snapstore.errors import StoreIOError

    def refuse(*args, **kwargs):
        raise StoreIOError("cannot create the store: disk full", 28)
    monkeypatch.setattr(methods, "open_store", refuse)


def test_a_store_that_cannot_be_opened_is_the_error_raised(tmp_path, monkeypatch):
    # regression: SnapstoreMethod.close() on a method whose setup() failed raised
    # AttributeError ('store') in run_workload's cleanup, which replaced the StoreIOError
    from snapstore.errors import StoreIOError
    _store_cannot_open(monkeypatch)
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(StoreIOError, match="disk full"):
        bench.run_workload(tiny(checkpoints=1), methods=["snapstore", "raw"],
                           workdir=str(work))
    assert os.listdir(work) == []                    # the baseline's files are removed too


def test_close_is_safe_before_and_after_setup(tmp_path):
    from snapstore.bench import methods
    m = methods.SnapstoreMethod(tiny(), str(tmp_path / "m"))
    m.close()                                        # setup() never ran (or failed)
    m.setup()
    m.close()
    m.close()                                        # twice: nothing left to close


def test_a_close_error_does_not_hide_the_error_that_stopped_the_run(tmp_path, monkeypatch):
    from snapstore.bench import methods

    def broken_checkpoint(self, state, step):
        raise bench.BenchError("the checkpoint failed")

    real_close = methods.SnapstoreMethod.close

    def broken_close(self):
        real_close(self)            # (closed for real: no open store leaks into later tests)
        raise RuntimeError("close failed too")
    monkeypatch.setattr(methods.SnapstoreMethod, "checkpoint", broken_checkpoint)
    monkeypatch.setattr(methods.SnapstoreMethod, "close", broken_close)
    with pytest.raises(bench.BenchError, match="the checkpoint failed"):
        bench.run_workload(tiny(checkpoints=1), methods=["snapstore"], workdir=str(tmp_path))
    assert os.listdir(tmp_path) == []


def test_a_failing_peer_is_named_with_its_status_and_stderr_tail(tmp_path, monkeypatch):
    # regression: with GNU time wrapped around the backup, the error named "/usr/bin/time -f"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool = bindir / "restic"
    tool.write_text("#!/bin/sh\n"
                    'case "$1" in init) mkdir -p "$RESTIC_REPOSITORY"; exit 0;; esac\n'
                    "i=0; while [ $i -lt 50 ]; do echo noise line $i >&2; i=$((i+1)); done\n"
                    "echo 'Fatal: repository is already locked' >&2\nexit 3\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    work = tmp_path / "work"
    work.mkdir()
    out = bench.run_workload(tiny(checkpoints=1), methods=["snapstore", "restic"],
                             workdir=str(work))
    why = out["results"]["restic"]["skipped"]
    assert why.startswith("failed: restic backup failed (exit status 3): ..."), why
    assert why.endswith("Fatal: repository is already locked"), why
    assert "time" not in why and "noise line 0 " not in why     # the tail only
    assert len(why) < 400


@pytest.mark.parametrize("field", ["size", "buffers", "checkpoints", "restore_repeats", "seed"])
def test_integer_fields_take_numpy_ints_and_blame_the_type_of_others(field):
    # regression: size=np.int64(1 << 20) was refused as "must be at least 4096 bytes, got
    # np.int64(1048576)", and size=1048576.0 likewise: the message blamed the value
    np = pytest.importorskip("numpy")
    good = {"size": MiB, "buffers": 2, "checkpoints": 2, "restore_repeats": 1, "seed": 7}
    w = tiny(**{field: np.int64(good[field])}).validate()
    value = getattr(w, field)
    assert type(value) is int and value == good[field]      # stored back as an int
    json.dumps(w.__dict__)                                   # so the result stays JSON
    for bad, type_name in ((float(good[field]), "float"), (True, "bool"),
                           (np.bool_(True), "bool"), (str(good[field]), "str")):
        with pytest.raises(bench.BenchError, match=f"must be an int, got {type_name} "):
            tiny(**{field: bad}).validate()


def test_dirty_takes_any_real_number_and_blames_the_type_of_others():
    np = pytest.importorskip("numpy")
    w = tiny(dirty=np.float32(0.5)).validate()
    assert type(w.dirty) is float and w.dirty == 0.5
    for bad, type_name in ((True, "bool"), ("0.1", "str"), (None, "NoneType")):
        with pytest.raises(bench.BenchError, match=f"must be a number, got {type_name} "):
            tiny(dirty=bad).validate()
    with pytest.raises(bench.BenchError, match="from 0 to 1, got 1.5"):
        tiny(dirty=1.5).validate()
    with pytest.raises(bench.BenchError, match="at least 4096 bytes, got 100$"):
        tiny(size=100).validate()


# ---- plan(): a state that grows -----------------------------------------------------------
def test_state_size_is_what_mutate_makes():
    for w in (tiny(pattern="appended", dirty=0.3, checkpoints=3, buffers=3),
              tiny(pattern="scattered", checkpoints=2)):
        state = workloads.make_state(w)
        assert workloads.state_size(w, 0) == w.size == sum(map(len, state.values()))
        for step in range(1, w.checkpoints + 1):
            workloads.mutate(state, w, step)
            assert workloads.state_size(w, step) == sum(map(len, state.values()))


def test_plan_checks_the_final_size_of_a_growing_state_against_memory(monkeypatch):
    # regression: only the initial size was checked, so a 1 GiB 'appended' workload growing
    # to 31 GiB was planned on a 23.5 GiB machine
    monkeypatch.setattr(runner, "physical_memory", lambda: 3 * MiB)
    grows = dict(size=MiB, dirty=0.5, checkpoints=5)            # 1 MiB -> 3.5 MiB
    runner.plan([tiny(pattern="scattered", **grows)], ["raw"])   # the same size throughout
    with pytest.raises(bench.BenchError, match=r"grows from 1048576 to 3670016 bytes .*"
                                               r"--dirty or --checkpoints"):
        runner.plan([tiny(pattern="appended", **grows)], ["raw"])


def test_plan_estimates_time_and_disk_from_every_checkpoints_size():
    kw = dict(size=MiB, dirty=0.5, checkpoints=4)
    flat = runner.plan([tiny(pattern="scattered", **kw)], ["raw"])
    grown = runner.plan([tiny(pattern="appended", **kw)], ["raw"])
    # raw keeps every checkpoint whole: 1 + 1.5 + 2 + 2.5 + 3 MiB appended, 5 x 1 MiB not;
    # snapstore the first state and the dirty part of each: 1 + 4 x 0.5 MiB
    assert flat.disk_bytes == 5 * MiB + 3 * MiB
    assert grown.disk_bytes == 10 * MiB + 3 * MiB
    assert grown.seconds > flat.seconds
    # workloads run one after the other, their files removed in between: the largest counts
    both = runner.plan([tiny(pattern="scattered", **kw), tiny(pattern="appended", **kw)],
                       ["raw"])
    assert both.disk_bytes == grown.disk_bytes


# ---- figures a reviewer found wrong -----------------------------------------------------------
def test_a_fraction_that_rounds_to_whole_pages_is_reported_as_changed():
    """--size 1MiB --dirty 0.001 changed 0 of 256 pages while the table and JSON said 0.001."""
    w = workloads.Workload(size=1 << 20, dirty=0.001, checkpoints=1).validate()
    assert w.changed_fraction() == 0
    assert "0.001 (in fact 0," in w.describe()
    w = workloads.Workload(size=1 << 20, dirty=0.013, checkpoints=1).validate()
    assert w.changed_fraction() == 3 / 256 and "(in fact 0.01172," in w.describe()
    state = workloads.make_state(w)
    before = {n: bytes(b) for n, b in state.items()}
    workloads.mutate(state, w, 1)
    changed = sum(before[n][i:i + 4096] != state[n][i:i + 4096]
                  for n in state for i in range(0, len(state[n]), 4096))
    assert changed == 3                                     # what changed_fraction says
    exact = workloads.Workload(size=1 << 20, dirty=0.25, checkpoints=1).validate()
    assert exact.changed_fraction() == 0.25 and "in fact" not in exact.describe()
    for pattern in ("shifted", "appended"):
        w = workloads.Workload(size=1 << 20, dirty=0.01, pattern=pattern).validate()
        assert math.isclose(w.changed_fraction(), 0.01, rel_tol=1e-3)


def test_bytes_written_that_were_not_measured_are_none_not_zero():
    """Without /proc/self/io the table said 'written 0 B' and the JSON median 0."""
    track = runner._Track(runner.METHOD_CLASSES["raw"](workloads.Workload(), "/nonexistent"))
    track.times, track.written = [0.1, 0.2], [None, None]
    track.restore = {"latest": [0.1], "oldest": [0.1]}
    track.peaks, track.restore_peaks = [1, 2], [1]
    res = track.result(workloads.Workload(checkpoints=2))
    assert res["bytes_written_per_checkpoint"]["median"] is None
    assert res["bytes_written_per_checkpoint"]["samples"] == [None, None]
    track.written = [10, 20]
    assert track.result(workloads.Workload(checkpoints=2))[
        "bytes_written_per_checkpoint"]["median"] == 15


def test_the_raw_baseline_restores_without_a_second_copy(tmp_path):
    """read_buffers returned bytes(bytearray): one more full copy, which made the raw, restic
    and borg restores look 65% slower than they are."""
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"a" * 5000 + b"b" * 3)
    out = bench.methods.read_buffers(path, {"x": 5000, "y": 3})
    assert out == {"x": b"a" * 5000, "y": b"bbb"}
    assert all(type(v) is bytearray for v in out.values())


def test_run_refuses_a_state_larger_than_memory_as_plan_does(tmp_path):
    """run() skipped plan()'s memory check (only the CLI called it): a state of 2**70 bytes
    reached blake3 and raised a raw OverflowError."""
    with pytest.raises(bench.BenchError, match="memory"):
        bench.run([workloads.Workload(size=1 << 70)], workdir=str(tmp_path))
    assert os.listdir(tmp_path) == []
