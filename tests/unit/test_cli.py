"""The `snapstore` command line, run as a real program in a subprocess (the installed console
script, as users run it; `python -m snapstore` once), plus its pure helpers in-process."""
from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import time

import pytest

import snapstore
from cli_runner import cli_env, console_script
from snapstore import errors
from snapstore.cli import app as cli
from snapstore.cli import args as cli_args
from snapstore.cli import common, inspect_cmds, output
from snapstore.cli.progress import Progress
from snapstore.engine import storedir
from snapstore.formatting import human_bytes, human_seconds, parse_size

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ("init", "ls", "show", "diff", "restore", "rm", "tag", "retain", "compact", "gc",
            "verify", "stats", "bench")


def run(*args, env=None, stdin=None, binary=False, cmd=None, **kw):
    """Runs the installed console script (what users run); cmd= another entry point."""
    argv = (cmd or [console_script()]) + [str(a) for a in args]
    return subprocess.run(argv, env=cli_env(env), cwd=ROOT, capture_output=True,
                          text=not binary, timeout=120, stdin=stdin, **kw)


def ok(*args, **kw):
    p = run(*args, **kw)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p


def ok_json(*args, **kw):
    return json.loads(ok(*args, "--json", **kw).stdout)


def assert_one_line_error(p, code, *needles):
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("snapstore: error: "), p.stderr
    assert "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])


def needs(method):
    if not hasattr(snapstore.Store, method):
        pytest.skip(f"Store.{method} is not implemented yet")


# ---- a small store with known content ------------------------------------------------------
A0 = bytes(random.Random(1).randbytes(40000))
B0 = bytes(range(256)) * 20


@pytest.fixture
def cli_store(tmp_path):
    """Checkpoints: 1 (default: weights, odd/name), 2 (default: weights changed at 5000:10 and
    30000:1 and 30003:1, odd/name dropped, new added), 3 (stream other: weights)."""
    path = str(tmp_path / "store")
    a = bytearray(A0)
    with snapstore.open(path, durability="none") as s:
        s.checkpoint({"weights": a, "odd/name": B0}, meta={"step": 1})
        a[5000:5010] = bytes(x ^ 0xFF for x in a[5000:5010])
        a[30000] ^= 1
        a[30003] ^= 1
        s.checkpoint({"weights": a, "new": b"abc"}, meta={"step": 2})
        s.checkpoint({"weights": a}, stream="other")
    return path


# ---- help, version, entry points ---------------------------------------------------------
def test_help_lists_every_command_and_documents_exit_codes(capsys):
    p = ok("--help")
    for c in COMMANDS:
        assert f"    {c} " in p.stdout, c
    assert "exit status" in p.stdout and "usage error" in p.stdout
    for c in COMMANDS:                         # in-process: 12 more interpreters are slow
        with pytest.raises(SystemExit) as exc:
            cli.main([c, "--help"])
        assert exc.value.code == 0
        assert capsys.readouterr().out.startswith("usage: snapstore " + c)


def test_version():
    assert ok("--version").stdout.strip() == f"snapstore {snapstore.__version__}"
    for argv in (["--version", "--json"], ["--json", "--version"]):
        assert json.loads(ok(*argv).stdout) == {"version": snapstore.__version__,
                                                "format_version": 6}
    # what follows --version is not looked at (argparse's own version action did the same)
    assert ok("--version", "ls").stdout.strip() == f"snapstore {snapstore.__version__}"


@pytest.mark.parametrize("stdout", ["closed", "/dev/full"])
def test_version_into_a_stdout_that_cannot_take_it_is_one_line_not_a_traceback(stdout):
    """--version printed outside the handlers every command's output has: a closed stdout or
    a full disk gave a chained traceback."""
    args = [sys.executable, "-m", "snapstore", "--version"]
    if stdout == "closed":
        p = subprocess.run(["sh", "-c", '"$@" >&-', "sh", *args], capture_output=False,
                           stderr=subprocess.PIPE, text=True)
    else:
        with open(stdout, "w") as out:
            p = subprocess.run(args, stdout=out, stderr=subprocess.PIPE, text=True)
    assert p.returncode == 1
    assert "Traceback" not in p.stderr and p.stderr.startswith("snapstore: error:")
    assert len(p.stderr.strip().splitlines()) == 1


def test_remote_timeout_bounds_a_command_on_an_unreachable_s3_endpoint():
    """The command line had no --remote-timeout: a command on an S3 store whose endpoint
    refuses connections sat silent for the default 120 s."""
    env = dict(os.environ, AWS_ENDPOINT_URL="http://127.0.0.1:1", AWS_ACCESS_KEY_ID="x",
               AWS_SECRET_ACCESS_KEY="y")
    started = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "snapstore", "ls", "s3://bkt/pfx",
                        "--remote-timeout", "1"], capture_output=True, text=True, env=env,
                       timeout=60)
    assert time.monotonic() - started < 30
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "remote_timeout 1s" in p.stderr and "Could not connect" in p.stderr
    bad = subprocess.run([sys.executable, "-m", "snapstore", "ls", "s3://bkt/pfx",
                          "--remote-timeout", "0"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert bad.returncode == 2 and "remote_timeout must be" in bad.stderr


def test_no_command_prints_usage_and_exits_2():
    p = run()
    assert p.returncode == 2 and "usage:" in p.stderr


def test_python_dash_m_entry_point(cli_store):
    """`python -m snapstore` is the same program as the console script the other tests run."""
    exe = [sys.executable, "-m", "snapstore"]
    p = run("--version", cmd=exe)
    assert p.returncode == 0 and p.stdout.strip() == f"snapstore {snapstore.__version__}"
    p = run("-s", cli_store, "ls", "--json", cmd=exe)
    assert p.returncode == 0, p.stderr
    assert [c["id"] for c in json.loads(p.stdout)["checkpoints"]] == [1, 2, 3]
    assert_one_line_error(run("-s", cli_store, "show", "99", cmd=exe), 2, "99")


# ---- init, ls, show -------------------------------------------------------------------------
def test_init_creates_a_store_and_is_idempotent(tmp_path):
    path = tmp_path / "new"
    assert "created store" in ok("init", path).stdout
    with snapstore.open(str(path), create=False) as s:
        assert s.checkpoints() == []
    assert ok_json("init", path) == {"path": str(path), "created": False}
    assert ok_json("--store", tmp_path / "other", "init")["created"] is True


def test_init_refuses_a_foreign_directory(tmp_path):
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "file.txt").write_text("x")
    assert_one_line_error(run("init", tmp_path / "junk"), 2, "not a snapstore store")


def test_ls(cli_store):
    p = ok("-s", cli_store, "ls")
    lines = p.stdout.splitlines()
    assert lines[0].split()[:4] == ["ID", "STREAM", "KIND", "PARENT"]
    assert [ln.split()[0] for ln in lines[1:]] == ["1", "2", "3"]
    data = ok_json("ls", "--store", cli_store)       # --store after the command works too
    c = data["checkpoints"]
    assert [x["id"] for x in c] == [1, 2, 3]
    assert c[0]["sizes"] == {"weights": len(A0), "odd/name": len(B0)}
    assert c[0]["meta"] == {"step": 1} and c[1]["parent"] == 1 and c[1]["kind"] == "incremental"
    assert c[0]["tags"] == [] and c[0]["created_iso"].endswith("Z")
    assert [x["id"] for x in ok_json("-s", cli_store, "ls", "--stream", "other")
            ["checkpoints"]] == [3]
    assert [x["id"] for x in ok_json("-s", cli_store, "ls", "--last", "2")["checkpoints"]] \
        == [2, 3]


def test_store_from_environment(cli_store):
    assert len(ok_json("ls", env={"SNAPSTORE_STORE": cli_store})["checkpoints"]) == 3


def test_show(cli_store):
    p = ok("-s", cli_store, "show", "2")
    assert "checkpoint 2" in p.stdout and "1 <- 2" in p.stdout and "weights" in p.stdout
    d = ok_json("-s", cli_store, "show", "2")
    assert d["id"] == 2 and d["chain"] == [1, 2] and d["meta"] == {"step": 2}
    assert d["buffers"] == [{"name": "weights", "bytes": len(A0)}, {"name": "new", "bytes": 3}]
    assert d["bytes"] == len(A0) + 3
    assert ok_json("-s", cli_store, "show", "latest")["id"] == 3
    assert ok_json("-s", cli_store, "show", "latest:default")["id"] == 2


# ---- diff -------------------------------------------------------------------------------------
def test_diff_exact_ranges(cli_store):
    d = ok_json("-s", cli_store, "diff", "1", "2", "--gap", "0")
    assert d["from"] == 1 and d["to"] == 2
    by = {b["name"]: b for b in d["buffers"]}
    assert by["weights"]["status"] == "changed"
    assert by["weights"]["ranges"] == [[5000, 10], [30000, 1], [30003, 1]]
    assert by["weights"]["changed_bytes"] == 12
    assert by["odd/name"]["status"] == "removed" and by["odd/name"]["changed_bytes"] == len(B0)
    assert by["new"]["status"] == "added" and by["new"]["size_to"] == 3
    assert d["changed_bytes"] == 12 + len(B0) + 3


def test_diff_coalesces_and_crosses_windows(cli_store):
    # A 4 KiB window puts 5000:10 in the second window; gap 16 merges 30000 and 30003.
    d = ok_json("-s", cli_store, "diff", "1", "2", "--window", "4KiB", "--buffer", "weights")
    assert [b["name"] for b in d["buffers"]] == ["weights"]
    assert d["buffers"][0]["ranges"] == [[5000, 10], [30000, 4]]
    assert d["buffers"][0]["changed_bytes"] == 12
    p = ok("-s", cli_store, "diff", "1", "2")
    assert "5000:10" in p.stdout and "removed" in p.stdout and "added" in p.stdout
    d = ok_json("-s", cli_store, "diff", "2", "3")
    assert d["buffers"][0]["status"] == "unchanged" and d["buffers"][0]["ranges"] == []


def test_diff_unknown_buffer_is_usage_error(cli_store):
    assert_one_line_error(run("-s", cli_store, "diff", "1", "2", "--buffer", "zzz"), 2, "zzz")


# ---- restore -----------------------------------------------------------------------------------
def test_restore_writes_one_file_per_buffer(cli_store, tmp_path):
    out = tmp_path / "out"
    p = ok("-s", cli_store, "restore", "1", "--out", out)
    assert "odd/name -> " in p.stdout and "odd_name" in p.stdout
    assert (out / "weights").read_bytes() == A0
    assert (out / "odd_name").read_bytes() == B0
    assert not [f for f in os.listdir(out) if f.startswith(".")]
    # Existing files are not overwritten without --force (usage error, nothing changed).
    assert_one_line_error(run("-s", cli_store, "restore", "2", "--out", out), 2, "--force")
    assert (out / "weights").read_bytes() == A0
    d = ok_json("-s", cli_store, "restore", "2", "--out", out, "--force", "--buffer", "weights")
    assert d["checkpoint"] == 2 and [f["buffer"] for f in d["files"]] == ["weights"]
    assert (out / "weights").read_bytes() != A0


def test_restore_force_checks_every_file_before_writing_any(cli_store, tmp_path):
    """With --force a buffer whose output path was a directory failed after the buffers
    before it were written; like without --force, it is now refused before anything is."""
    out = tmp_path / "out"
    (out / "odd_name").mkdir(parents=True)
    assert_one_line_error(run("-s", cli_store, "restore", "1", "--out", out, "--force"), 2,
                          "is a directory")
    assert os.listdir(out) == ["odd_name"]          # weights was not written


def test_restore_range_past_the_end_is_named_as_given(cli_store, tmp_path):
    """`--range 65536:` on a smaller buffer said `range 65536:-65036`."""
    assert_one_line_error(run("-s", cli_store, "restore", "1", "--buffer", "weights",
                              "--range", "99999999:", "--out", tmp_path / "o"), 2,
                          "range 99999999: exceeds buffer")


def test_restore_range_and_stdout(cli_store, tmp_path):
    d = ok_json("-s", cli_store, "restore", "1", "--buffer", "odd/name", "--range", "10:5",
                "--out", tmp_path / "r")
    assert d["files"][0]["offset"] == 10 and d["files"][0]["bytes"] == 5
    assert (tmp_path / "r" / "odd_name").read_bytes() == B0[10:15]
    p = run("-s", cli_store, "restore", "1", "--buffer", "weights", "--range", "1K:",
            "--out", "-", binary=True)
    assert p.returncode == 0 and p.stdout == A0[1024:]
    assert_one_line_error(run("-s", cli_store, "restore", "1", "--out", "-"), 2, "exactly one")
    assert_one_line_error(run("-s", cli_store, "restore", "1", "--buffer", "odd/name",
                              "--range", "5120:1", "--out", tmp_path / "x"), 2, "exceeds")
    assert_one_line_error(run("-s", cli_store, "restore", "1", "--range", "abc",
                              "--out", tmp_path / "x"), 2, "range")


# ---- rm, tag, retain, compact, verify, stats -----------------------------------------------
def test_rm(cli_store):
    assert ok_json("-s", cli_store, "rm", "3") == {"deleted": [3]}
    assert [c["id"] for c in ok_json("-s", cli_store, "ls")["checkpoints"]] == [1, 2]
    # One unknown id: nothing is deleted.
    assert_one_line_error(run("-s", cli_store, "rm", "1", "77"), 2, "77")
    assert len(ok_json("-s", cli_store, "ls")["checkpoints"]) == 2
    assert "deleted checkpoint 1" in ok("-s", cli_store, "rm", "1").stdout
    # Its child stays restorable.
    assert ok_json("-s", cli_store, "diff", "2", "2")["changed_bytes"] == 0


def test_tag_and_untag(cli_store):
    needs("tag")
    assert ok_json("-s", cli_store, "tag", "1", "best", "keep")["tags"] == ["best", "keep"]
    assert [c["id"] for c in ok_json("-s", cli_store, "ls", "--tag", "keep")["checkpoints"]] \
        == [1]
    assert ok_json("-s", cli_store, "tag", "--remove", "1", "best")["tags"] == ["keep"]
    assert "keep" in ok("-s", cli_store, "ls").stdout


def test_retain(cli_store):
    needs("retain")
    assert_one_line_error(run("-s", cli_store, "retain"), 2, "--keep-last")
    d = ok_json("-s", cli_store, "retain", "--stream", "default", "--keep-last", "1")
    assert (d["deleted"], d["deleted_count"]) == ({"default": [1]}, 1)   # + kept, space (issue 15)
    assert [c["id"] for c in ok_json("-s", cli_store, "ls")["checkpoints"]] == [2, 3]


def test_compact(cli_store):
    needs("compact")
    ok("-s", cli_store, "rm", "1")
    d = ok_json("-s", cli_store, "compact", "--threshold", "1")
    for key in ("bytes_before", "bytes_after", "chunks_freed", "segments_rewritten",
                "chains_folded", "seconds"):
        assert key in d, key
    assert "freed" in ok("-s", cli_store, "compact").stdout


def test_verify_ok_and_damaged(cli_store):
    needs("verify")
    assert ok_json("-s", cli_store, "verify", "--deep")["ok"] is True
    assert ok("-s", cli_store, "verify").stdout.startswith("verify: OK")
    seg_dir = os.path.join(cli_store, "segments")
    seg = os.path.join(seg_dir, sorted(os.listdir(seg_dir))[0])
    with open(seg, "r+b") as f:          # flip a byte inside the first (40 KB) chunk record
        f.seek(20000)
        b = f.read(1)
        f.seek(20000)
        f.write(bytes([b[0] ^ 0xFF]))
    p = run("-s", cli_store, "verify", "--deep", "--json")
    assert p.returncode == 1, (p.stdout, p.stderr)
    report = json.loads(p.stdout)
    assert report["ok"] is False and report["problems"]
    assert {"kind", "message"} <= set(report["problems"][0])
    p = run("-s", cli_store, "verify", "--deep")
    assert p.returncode == 1 and "problem" in p.stdout


def test_stats(cli_store):
    d = ok_json("-s", cli_store, "stats")
    assert d["checkpoints"] == 3 and d["streams"] == 2 and d["logical_bytes"] > 0
    assert "dedup ratio" in ok("-s", cli_store, "stats").stdout


# ---- errors and exit codes ---------------------------------------------------------------------
def test_usage_errors_are_one_line_exit_2(cli_store, tmp_path):
    assert_one_line_error(run("frobnicate"), 2, "invalid choice")
    assert_one_line_error(run("-s", cli_store, "show"), 2, "required")
    assert_one_line_error(run("-s", cli_store, "show", "abc"), 2, "named 'abc'")  # a name
    assert_one_line_error(run("-s", cli_store, "show", "-1"), 2, "invalid checkpoint")
    assert_one_line_error(run("-s", cli_store, "show", "99"), 2, "no checkpoint 99")
    assert_one_line_error(run("ls"), 2, "no store given")
    assert_one_line_error(run("-s", tmp_path / "nope", "ls"), 2, "no snapstore store")
    (tmp_path / "plain").mkdir()
    assert_one_line_error(run("-s", tmp_path / "plain", "ls"), 2, "not a snapstore store")
    assert_one_line_error(run("-s", cli_store, "show", "latest:nostream"), 2, "nostream")


def test_locked_store_is_exit_1(cli_store):
    """Only what needs the store to itself locks a writing command out: here this process
    holds STORE/lock exclusively, as a repair does (an open writer would not)."""
    fd = storedir.take_lock(cli_store, time.monotonic())
    try:
        assert_one_line_error(run("-s", cli_store, "rm", "3"), 1,
                              f"is locked by another process (pid {os.getpid()} on host ",
                              "which needs the store to itself",
                              "Wait for it with --timeout SECONDS")
    finally:
        storedir.release_exclusive(fd)
    with snapstore.open(cli_store, readonly=True) as s:
        assert [c.id for c in s.checkpoints()] == [1, 2, 3]
    ok("-s", cli_store, "rm", "3")


def test_debug_shows_the_traceback(cli_store):
    p = run("-s", cli_store, "show", "99", "--debug")
    assert p.returncode == 2
    assert "Traceback" in p.stderr and "CheckpointNotFound" in p.stderr
    assert p.stderr.splitlines()[-1] == "snapstore: error: no checkpoint 99"
    p = run("-s", cli_store, "show", "99", env={"SNAPSTORE_DEBUG": "1"})
    assert "Traceback" in p.stderr


def test_exit_code_mapping():
    assert cli.exit_code_for(errors.CheckpointNotFound("x")) == 2
    assert cli.exit_code_for(errors.InvalidArgumentError("x")) == 2
    assert cli.exit_code_for(errors.FormatError("x")) == 2
    assert cli.exit_code_for(common.UsageError("x")) == 2
    assert cli.exit_code_for(errors.CorruptionError("x")) == 1
    assert cli.exit_code_for(errors.StoreLocked("x")) == 1
    assert cli.exit_code_for(errors.StoreIOError("x")) == 1
    assert cli.exit_code_for(common.Problem("x")) == 1


# ---- progress -------------------------------------------------------------------------------
def test_no_progress_output_when_stderr_is_not_a_terminal(cli_store, tmp_path):
    p = ok("-s", cli_store, "restore", "1", "--out", tmp_path / "o")
    assert p.stderr == ""


def test_progress_bar_on_a_terminal(cli_store, tmp_path):
    pty = pytest.importorskip("pty")
    master, slave = pty.openpty()
    try:
        p = subprocess.run([sys.executable, "-m", "snapstore", "-s", cli_store, "restore", "1",
                            "--out", str(tmp_path / "o")], env=cli_env(), cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=slave, timeout=60)
        os.close(slave)
        slave = None
        seen = b""
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0
    assert b"restore [" in seen and b"%" in seen
    assert b"restored checkpoint 1" in p.stdout     # stdout stays clean


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_progress_class():
    quiet = io.StringIO()
    with Progress(100, "x", stream=quiet) as bar:
        bar.update(50)
    assert quiet.getvalue() == ""
    tty = _Tty()
    with Progress(100, "load", unit="B", stream=tty, min_interval=0) as bar:
        bar.update(50)
        assert "load [" in tty.getvalue() and " 50%" in tty.getvalue()
    assert tty.getvalue().endswith("\r")          # the line is erased at the end
    tty = _Tty()
    with Progress(None, "spin", stream=tty, min_interval=0.01):
        import time
        time.sleep(0.05)
    assert "spin" in tty.getvalue()
    assert Progress(10, stream=_Tty(), enabled=False).enabled is False


def test_progress_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("SNAPSTORE_PROGRESS", "0")
    assert Progress(10, stream=_Tty()).enabled is False


def test_human_units():
    assert human_bytes(0) == "0 B" and human_bytes(1023) == "1023 B"
    assert human_bytes(1536) == "1.5 KiB" and human_bytes(256 << 20) == "256.0 MiB"
    assert human_seconds(0.0123) == "12.3 ms" and human_seconds(2.5) == "2.50 s"
    assert human_seconds(75) == "1m15s" and human_seconds(5e-6) == "5 us"


# ---- helpers in-process -------------------------------------------------------------------------
def test_parse_size_and_range():
    assert parse_size("4096") == 4096
    assert parse_size("64K") == parse_size("64KiB") == parse_size("64kb") == 65536
    assert parse_size("1.5MiB") == 1572864 and parse_size("1G") == 1 << 30
    # exact past 2**53 (a float made 9007199254740993 ...992 without a word)
    assert parse_size("9007199254740993") == 2 ** 53 + 1
    assert parse_size("8388609.5K") == 8388609 * 1024 + 512
    assert parse_size(str(1 << 63)) == 1 << 63 and parse_size("9" * 30) == 10 ** 30 - 1
    for bad in ("", "x", "1.3B", "-5", "1Q", "0.1", "9" * 400):
        with pytest.raises(ValueError):
            parse_size(bad)
    assert cli_args.parse_range("10:5") == (10, 5)
    assert cli_args.parse_range("1K:") == (1024, None)
    assert cli_args.parse_range(":8") == (0, 8)
    with pytest.raises(ValueError):
        cli_args.parse_range("10")


def test_safe_filenames():
    m = output.safe_filenames(["w", "a/b", "a_b", "A_B", ".hidden", "..", "x" * 300, "ü"])
    assert m["w"] == "w" and m["a/b"] == "a_b"
    assert len({v.lower() for v in m.values()}) == len(m)
    assert not any(v.startswith(".") for v in m.values())
    assert all(len(v) <= 210 and "/" not in v for v in m.values())


def test_internal_errors_and_interrupts_in_process(monkeypatch, capsys, cli_store):
    def boom(args):
        raise RuntimeError("kaput\nsecond line")
    monkeypatch.setattr(inspect_cmds, "cmd_stats", boom)
    assert cli.main(["-s", cli_store, "stats"]) == 1
    err = capsys.readouterr().err
    assert err == ("snapstore: error: internal error: RuntimeError: kaput second line "
                   "(run with --debug for the traceback)\n")
    assert cli.main(["-s", cli_store, "stats", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(inspect_cmds, "cmd_stats", interrupted)
    assert cli.main(["-s", cli_store, "stats"]) == 130
    assert capsys.readouterr().err == "snapstore: interrupted\n"
    assert cli.main(["-s", cli_store, "stats", "--json"]) == 130    # JSON on stdout too
    assert json.loads(capsys.readouterr().out) == {"error": "interrupted", "exit_status": 130}
    assert cli.main(["--json"]) == 2                                # no command
    assert json.loads(capsys.readouterr().out)["exit_status"] == 2
    assert cli.main(["-s", cli_store, "ls", "--js", "--last", "0"]) == 2   # an abbreviation
    assert json.loads(capsys.readouterr().out)["exit_status"] == 2


def test_commands_work_while_a_writer_has_the_store_open(cli_store):
    """A running writer (here, this process) blocks no command: ls/show/verify read, and
    rm/tag write alongside it (each writer has a log of its own), at once (--timeout 0)."""
    with snapstore.open(cli_store) as writer:
        info = writer.checkpoint({"weights": b"while-open"}, stream="live")
        listed = ok_json("-s", cli_store, "ls")
        assert info.id in [c["id"] for c in (listed["checkpoints"] if isinstance(listed, dict)
                                             else listed)]
        ok("-s", cli_store, "show", info.id)
        ok("-s", cli_store, "verify")
        ok("-s", cli_store, "tag", "1", "first", "--timeout", "0")
        ok("-s", cli_store, "rm", info.id, "--timeout", "0")
        assert writer.get(1).tags == ("first",)          # the open writer sees both
        assert info.id not in [c.id for c in writer.checkpoints()]
        again = writer.checkpoint({"weights": b"after"}, stream="live")
        assert again.id > info.id and writer.restore(again.id) == {"weights": b"after"}


def test_restore_output_is_written_whole_or_is_an_error():
    """Regression: under `python -u` stdout is a raw file whose write() may write less than
    asked (a full disk, a file size limit) without raising: `restore -o -` exited 0 with a
    short output."""
    from snapstore.engine.fsutil import write_all    # what restore's output goes through

    class Raw:
        def __init__(self, room):
            self.got, self.room = bytearray(), room

        def write(self, data):
            n = min(len(data), 1000, self.room - len(self.got))
            self.got += bytes(data[:n])
            return n
    sink = Raw(10 ** 9)
    write_all(sink, b"x" * 25_000, "the output")
    assert bytes(sink.got) == b"x" * 25_000
    with pytest.raises(OSError):
        write_all(Raw(5_000), b"y" * 25_000, "the output")


def test_repair_json_of_a_damaged_log_is_one_json_document(tmp_path):
    """Regression: `repair --json` printed its report, then the error document: two JSON
    documents on stdout, which no JSON reader takes."""
    from cli_runner import snapstore_cli
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"x": os.urandom(200_000)}, stream="a")
        s.checkpoint({"x": os.urandom(200_000)}, stream="a")
    seg = os.path.join(path, "segments", sorted(os.listdir(os.path.join(path, "segments")))[0])
    os.truncate(seg, 150_000)
    done = snapstore_cli("repair", path, "--json")
    assert done.returncode == 1
    report = json.loads(done.stdout)                    # one document
    assert report["ok"] is False and report["problems"]
    assert "repair rebuilt the index" in done.stderr or "the log holds" in done.stderr


def test_restore_out_that_is_a_file_or_empty_is_a_usage_error(tmp_path):
    """Regression: an existing file or an empty --out raised FileExistsError /
    FileNotFoundError text ("[Errno 17] File exists") with exit status 1."""
    from cli_runner import snapstore_cli
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"data"}, stream="a")
    afile = tmp_path / "afile"
    afile.write_bytes(b"keep me")
    for out, why in ((str(afile), "a file"), ("", "empty")):
        done = snapstore_cli("restore", path, "1", "--out", out)
        assert done.returncode == 2, done.stderr
        assert f"must name a directory (it is {why})" in done.stderr
        assert "Errno" not in done.stderr
    assert afile.read_bytes() == b"keep me"


@pytest.mark.parametrize("grace", ["0", "0.5", "inf"])
def test_gc_grace_is_checked_before_the_store_is_opened(grace):
    """`gc s3://... --grace 0` opened the store first (with an unreachable endpoint, a
    minute of retries) before saying the grace was too short."""
    assert_one_line_error(run("gc", "s3://no-such-bucket/x", "--grace", grace,
                              env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}), 2,
                          "argument --grace")


def test_gc_on_a_local_store_points_to_the_command_that_frees_its_space(cli_store):
    """The advice was the Python API's ("through compact()"), not the command to run."""
    assert_one_line_error(run("gc", cli_store), 2, "`snapstore compact`")
