"""`snapstore copy`, `snapstore export -o FILE.snap` and `snapstore import` through the
installed console script: text and --json output, the id mapping, reruns that copy nothing,
and exit codes (2: usage, no such store, not a savepoint; 1: a damaged savepoint)."""
from __future__ import annotations

import os

import snapstore
from cli_runner import cli_error, cli_json, cli_ok


def _init(path):
    snapstore.open(str(path), durability="none").close()


def _source(path):
    with snapstore.open(str(path), durability="none") as s:
        x = bytearray(os.urandom(200_000))
        for step in range(3):
            x[step * 5000] ^= 1
            s.checkpoint({"x": x}, "train", meta={"step": step})
        s.tag("train@2", "best")
        s.checkpoint({"y": b"y" * 1000}, "other")
        return {i: s.restore(i) for i in s.checkpoint_ids("train") + s.checkpoint_ids("other")}


def test_copy_all_then_some_then_nothing(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    states = _source(src)
    _init(dst)
    p = cli_ok("copy", src, dst)
    assert "copied 4 checkpoint(s)" in p.stdout and "1 -> 1  train" in p.stdout
    doc = cli_json("copy", src, dst)
    assert doc["copied"] == {} and doc["skipped"] == {"1": 1, "2": 2, "3": 3, "4": 4}
    assert doc["chunks_sent"] == 0 and doc["dst"] == str(dst)
    with snapstore.open(str(dst), readonly=True) as d:
        assert {i: d.restore(i) for i in d.checkpoint_ids("train") +
                d.checkpoint_ids("other")} == states
        assert d.resolve("best").id == 2
    other = tmp_path / "other"
    _init(other)
    doc = cli_json("copy", src, other, "best", "other")
    assert doc["copied"] == {"2": 1, "4": 2} and doc["chunks_sent"] > 0
    p = cli_ok("copy", src, other, "train@2")
    assert "copied 0 checkpoint(s)" in p.stdout and "2 = 1  train (already there)" in p.stdout



def test_copy_after_a_rollback_by_import_copies_it_and_latest_matches(tmp_path):
    """Regression: train@3, a rollback to train@1 by importing its savepoint, was reported
    "3 = 1 (already there)", and the backup's latest:train was train@2's bytes."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    states = _source(src)
    cli_ok("export", src, "train@1", "-o", tmp_path / "step0.snap")
    cli_ok("import", tmp_path / "step0.snap", src)           # the newest of train: train@4
    _init(dst)
    p = cli_ok("copy", src, dst)
    assert "copied 5 checkpoint(s)" in p.stdout and "5 -> 5  train" in p.stdout
    doc = cli_json("copy", src, dst)
    assert doc["copied"] == {} and doc["skipped"] == {str(i): i for i in range(1, 6)}
    with snapstore.open(str(dst), readonly=True) as d:
        assert d.latest("train").seq == 4
        assert d.restore("latest:train") == states[1]

def test_copy_usage_errors(tmp_path):
    src = tmp_path / "src"
    _source(src)
    cli_error(2, "copy", src, tmp_path / "missing", needles=["no snapstore store",
                                                             "snapstore init"])
    _init(tmp_path / "dst")
    # a missing source is not one to create: no `snapstore init` advice for it
    line = cli_error(2, "copy", tmp_path / "nosrc", tmp_path / "dst",
                     needles=["no snapstore store", "SRC"])
    assert "snapstore init" not in line
    cli_error(2, "copy", src, tmp_path / "dst", "nope", needles=["nope"])
    cli_error(2, "copy", src, needles=["DST"])
    out = cli_ok("--help").stdout
    assert "copy checkpoints into another store" in out and "savepoint file" in out


def test_copy_takes_no_store_option_before_or_after_the_command(tmp_path):
    """Regression: `snapstore -s OTHER copy SRC DST` copied and ignored -s, where `copy -s`
    was refused and `-s OTHER ls STORE` is a usage error."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _source(src)
    _init(dst)
    cli_error(2, "-s", tmp_path / "elsewhere", "copy", src, dst, needles=["takes no -s"])
    cli_error(2, "--store", dst, "copy", src, dst, needles=["takes no -s"])
    cli_error(2, "copy", "-s", dst, src, dst, needles=["-s"])
    with snapstore.open(str(dst), readonly=True) as d:
        assert d.checkpoints() == []            # nothing copied by the refused commands


def test_copy_waits_for_the_destination_with_timeout_before_or_after_the_command(tmp_path):
    """Regression: the global --timeout, given before `copy`, was reset to 0 by copy's own
    option, so the copy failed at once with StoreLocked while an exclusive holder (a repair,
    an upgrade) held the destination for a moment."""
    import fcntl
    import threading
    from snapstore.engine import format as fmt
    src, dst = tmp_path / "src", tmp_path / "dst"
    _source(src)
    _init(dst)
    for placed_first in (True, False):
        fd = os.open(os.path.join(dst, fmt.LOCK_FILE), os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)              # as a repair holds it
        threading.Timer(1.0, os.close, (fd,)).start()
        args = (("--timeout", "30", "copy", src, dst) if placed_first
                else ("copy", src, dst, "--timeout", "30"))
        p = cli_ok(*args)
        assert "copied 4 checkpoint(s)" in p.stdout or "skipped 4 already there" in p.stdout


def test_export_snap_and_import(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    states = _source(src)
    snap = tmp_path / "best.snap"
    p = cli_ok("export", src, "best", "-o", snap)
    assert "(savepoint)" in p.stdout and snap.exists()
    doc = cli_json("export", src, "latest:train", "-o", tmp_path / "t.bin", "--format", "snap")
    assert doc["format"] == "snap" and doc["checkpoint"] == 3 and doc["chunks"] >= 1
    cli_error(2, "export", src, "best", "-o", snap, needles=["exists", "--force"])
    _init(dst)
    p = cli_ok("import", snap, dst)
    assert "as checkpoint 1 (train@1)" in p.stdout
    doc = cli_json("-s", dst, "import", snap, "--stream", "again")
    assert doc["id"] == 2 and doc["stream"] == "again" and doc["seq"] == 1
    with snapstore.open(str(dst), readonly=True) as d:
        assert d.restore(1) == d.restore(2) == states[2]
        assert d.get(1).tags == ("best",)
    cli_error(2, "import", snap, needles=["no store given"])
    cli_error(2, "import", snap, dst, "extra", needles=["unrecognized arguments: extra"])
    cli_error(2, "import", dst, snap, needles=["the file comes first"])
    # options between FILE and STORE (argparse before 3.12 took STORE for an unknown argument)
    doc = cli_json("import", snap, "--stream", "between", dst)
    assert doc["stream"] == "between" and doc["id"] == 3
    doc = cli_json("import", snap, "-s", dst, dst, "--stream", "same")
    assert doc["stream"] == "same"
    cli_error(2, "import", snap, "-s", dst, src, needles=["two different stores"])


def test_import_refuses_damaged_and_foreign_files(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _source(src)
    snap = tmp_path / "x.snap"
    cli_ok("export", src, "latest:train", "-o", snap)
    _init(dst)
    data = snap.read_bytes()
    bad = tmp_path / "bad.snap"
    flipped = bytearray(data[:len(data) // 2])
    flipped[len(flipped) // 2] ^= 4
    bad.write_bytes(bytes(flipped))
    cli_error(1, "import", bad, dst, needles=[str(bad), "offset"])
    bad.write_bytes(b"hello, not a savepoint")
    cli_error(2, "import", bad, dst, needles=["not a snapstore savepoint"])
    with snapstore.open(str(dst), readonly=True) as d:
        assert d.checkpoints() == []


def test_a_store_the_user_may_not_look_into_is_left_to_the_open(tmp_path, monkeypatch):
    """Regression (a helper's review): copy and import called a store they could not stat
    (no search permission) "no snapstore store here" with exit 2, where every other command
    gives the open's "Permission denied" and exit 1. is_store_dir now leaves it to the open."""
    from snapstore.cli import common
    store = str(tmp_path / "s")
    snapstore.open(store).close()
    assert common.is_store_dir(store)
    assert not common.is_store_dir(str(tmp_path / "none"))
    assert not common.is_store_dir(str(tmp_path))
    assert not common.is_store_dir("")
    real = os.stat

    def denied(path, *a, **k):
        if str(path).startswith(store):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)
    monkeypatch.setattr(common.os, "stat", denied)
    assert common.is_store_dir(store)
