"""The command line when its standard streams cannot take what it writes: a pipe whose
reader is gone, a full disk, a stream the process was started without (`>&-`, `2>&-`). The
promise holds: one line on stderr (when there is one), no traceback, the documented exit
status (0 ok, 1 problem, 2 usage), and never success for output that was lost."""
from __future__ import annotations

import os
import subprocess

import pytest

from cli_runner import cli_env, console_script
import snapstore


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"a": b"x" * 5000}, stream="train")
    return path


def run(args, **streams) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *args], env=cli_env(), timeout=120, **streams)


def stderr_lines(proc) -> list[str]:
    return proc.stderr.decode().splitlines()


@pytest.mark.parametrize("args, status", [
    (["show", "{store}", "nope", "--json"], 2),
    (["ls", "{store}/missing", "--json"], 2),
])
def test_a_json_error_into_a_pipe_whose_reader_is_gone(store, args, status):
    """The error's JSON document could not be written: it used to raise BrokenPipeError inside
    the error handler (a traceback, exit 1)."""
    args = [a.format(store=store) for a in args]
    proc = subprocess.Popen([console_script(), *args], env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()                 # the reader is gone before anything is written
    _, err = proc.communicate(timeout=120)
    lines = err.decode().splitlines()
    assert proc.returncode == status
    assert len(lines) == 1 and lines[0].startswith("snapstore: error:"), lines


def test_output_to_a_full_disk_is_a_problem_in_one_line(store):
    with open("/dev/full", "w") as full:
        proc = run(["ls", store, "--json"], stdout=full, stderr=subprocess.PIPE)
    assert proc.returncode == 1
    assert stderr_lines(proc) == ["snapstore: error: [Errno 28] No space left on device"]


@pytest.mark.parametrize("json", [[], ["--json"]])
def test_a_closed_stdout_is_a_problem_not_success(store, json):
    """`snapstore ls STORE >&-` said `internal error: AttributeError` (Python gives no stdout
    object then); output that cannot be written must not report success."""
    proc = subprocess.run(f'exec "{console_script()}" ls "{store}" {" ".join(json)} >&-',
                          shell=True, env=cli_env(), stderr=subprocess.PIPE, timeout=120)
    assert proc.returncode == 1
    assert stderr_lines(proc) == ["snapstore: error: [Errno 9] standard output is closed"]


def test_a_closed_stderr_keeps_the_exit_status(store):
    proc = subprocess.run(f'exec "{console_script()}" ls "{store}/missing" 2>&-', shell=True,
                          env=cli_env(), stdout=subprocess.PIPE, timeout=120)
    assert proc.returncode == 2 and proc.stdout == b""
    proc = subprocess.run(f'exec "{console_script()}" ls "{store}" 2>&-', shell=True,
                          env=cli_env(), stdout=subprocess.PIPE, timeout=120)
    assert proc.returncode == 0 and b"train" in proc.stdout
