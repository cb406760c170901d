"""Runs the real `snapstore` console script (the one pip installed next to this Python) in a
subprocess, so CLI tests exercise exactly what users run. Tests import it as
`from cli_runner import snapstore_cli, cli_ok, cli_json, cli_error` (tests/ is on sys.path)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def console_script() -> str:
    """The installed console script; fails loudly (never skips) when it is missing."""
    here = os.path.join(os.path.dirname(sys.executable), "snapstore")
    path = here if os.path.exists(here) else shutil.which("snapstore")
    assert path, "the snapstore console script is not installed (pip install -e .)"
    return path


def cli_env(extra: dict | None = None) -> dict:
    """The environment a CLI test runs the program in: this one without the variables that
    change what it prints ($COLUMNS too: pytest-xdist workers set it), plus `extra`."""
    env = dict(os.environ)
    for name in ("SNAPSTORE_STORE", "SNAPSTORE_DEBUG", "SNAPSTORE_PROGRESS", "COLUMNS"):
        env.pop(name, None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra or {})
    return env


def snapstore_cli(*args, env: dict | None = None, stdin=None, binary: bool = False,
                  timeout: float = 120, cwd: str | None = None) -> subprocess.CompletedProcess:
    """Runs `snapstore ARGS...`; returns the CompletedProcess (text unless binary)."""
    return subprocess.run([console_script()] + [str(a) for a in args], env=cli_env(env),
                          cwd=cwd or ROOT, capture_output=True, text=not binary,
                          timeout=timeout, stdin=stdin)


def cli_ok(*args, **kw) -> subprocess.CompletedProcess:
    """Runs the command and asserts exit status 0."""
    p = snapstore_cli(*args, **kw)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p


def cli_json(*args, **kw):
    """Runs the command with --json, asserts exit 0, returns the parsed document."""
    return json.loads(cli_ok(*args, "--json", **kw).stdout)


def cli_error(code: int, *args, needles=(), **kw) -> str:
    """Runs the command, asserts exit status `code` and a one-line `snapstore: error:` message
    holding every needle; returns that line."""
    p = snapstore_cli(*args, **kw)
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("snapstore: error: "), p.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
