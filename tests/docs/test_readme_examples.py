"""Every code example of README.md runs, so the README cannot drift from the code.

The README is a tour: its fenced blocks run in order, in one fresh working directory (a store
that one block creates, the next one may use), each ```python block as its own program in a
fresh interpreter and each ```sh block with `bash -euo pipefail`, the `snapstore` console
script on PATH. Blocks without a language (sample output, the layout) are text.

An HTML comment on the line right before a fence changes that:
  <!-- readme-test: continue -->        run with the previous python block, as one program
  <!-- readme-test: skip: REASON -->     not run (only set-up and benchmark commands that take
                                         minutes; each one says why)
  <!-- readme-test: check=NAME -->       after the block, run the check NAME (CHECKS below)
  <!-- readme-test: s3 -->               run against a real S3 server (SeaweedFS, started
                                         once for the module), with its AWS_* variables and
                                         its bucket named as the example names it
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"^<!--\s*readme-test:\s*(.*?)\s*-->\s*$")
SKIPPABLE = 4          # set-up, install and the long benchmark commands; anything more is drift


def _blocks(text: str) -> list[dict]:
    """The fenced blocks: {lang, code, line, markers} in README order."""
    lines = text.splitlines()
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        assert j < len(lines), f"README.md:{start + 1}: unterminated code block"
        markers = []
        k = start - 1
        while k >= 0 and MARKER.match(lines[k]):
            markers.insert(0, MARKER.match(lines[k]).group(1))
            k -= 1
        out.append({"lang": lang, "code": "\n".join(lines[start + 1:j]) + "\n",
                    "line": start + 1, "markers": markers})
        i = j + 1
    return out


def _programs(blocks: list[dict]) -> list[dict]:
    """Runnable programs: python blocks joined with their `continue` successors, sh blocks."""
    programs: list[dict] = []
    for b in blocks:
        if b["lang"] not in ("python", "sh"):
            continue
        skip = next((m for m in b["markers"] if m.startswith("skip")), None)
        checks = [m.split("=", 1)[1] for m in b["markers"] if m.startswith("check=")]
        if "continue" in b["markers"]:
            prev = programs[-1] if programs else None
            assert prev is not None and prev["lang"] == "python" and b["lang"] == "python", \
                f"README.md:{b['line']}: 'continue' must follow a python block"
            prev["code"] += "\n" + b["code"]
            prev["checks"] += checks
            continue
        programs.append({"lang": b["lang"], "code": b["code"], "line": b["line"],
                         "skip": skip, "checks": checks, "s3": "s3" in b["markers"]})
    return programs


PROGRAMS = _programs(_blocks(open(README, encoding="utf-8").read()))


def _dir_bytes(path: str) -> int:
    total = 0
    for base, _, files in os.walk(path):
        for f in files:
            total += os.lstat(os.path.join(base, f)).st_blocks * 512
    return total


def _training_loop_frees_space(workdir: str) -> None:
    """The training loop keeps 3 checkpoints: the store stays near 3 states, not 15."""
    import snapstore
    path = os.path.join(workdir, "train-ckpts")
    with snapstore.open(path, readonly=True) as s:
        ckpts = s.checkpoints("train")
        assert 1 <= len(ckpts) <= 3, [c.id for c in ckpts]
        live = s.stats()["live_chunk_bytes"]
    on_disk = _dir_bytes(path)
    assert on_disk <= 1.5 * live + (4 << 20), (on_disk, live)


CHECKS = {"training_loop_frees_space": _training_loop_frees_space}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("readme"))


@pytest.fixture(scope="module")
def s3_env(tmp_path_factory):
    """Starts a real S3 server on first use (for blocks marked s3); returns its variables."""
    servers, buckets = [], set()

    def env(code: str) -> dict:
        if not servers:
            sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
            from s3server import WeedServer
            servers.append(WeedServer(root=str(tmp_path_factory.mktemp("weed"))))
        server = servers[0]
        for bucket in set(re.findall(r"s3://([a-z0-9.-]+)/", code)):
            if bucket not in buckets and bucket != server.bucket:
                server.create_bucket(bucket)
                buckets.add(bucket)
        return server.env()
    yield env
    for server in servers:
        server.kill()


def test_readme_has_examples_and_few_skips():
    assert sum(p["lang"] == "python" for p in PROGRAMS) >= 4
    skipped = [p for p in PROGRAMS if p["skip"]]
    assert len(skipped) <= SKIPPABLE, [(p["line"], p["skip"]) for p in skipped]
    for p in skipped:
        assert p["skip"].startswith("skip:") and len(p["skip"]) > 10, \
            f"README.md:{p['line']}: a skipped block must say why"
    for p in PROGRAMS:
        for name in p["checks"]:
            assert name in CHECKS, f"README.md:{p['line']}: unknown check {name!r}"


@pytest.mark.parametrize("program", PROGRAMS,
                         ids=[f"README.md:{p['line']}-{p['lang']}" for p in PROGRAMS])
def test_readme_example_runs(program, workdir, s3_env):
    if program["skip"]:
        pytest.skip(program["skip"])
    env = dict(os.environ)
    if program.get("s3"):
        env.update(s3_env(program["code"]))
    env.pop("SNAPSTORE_STORE", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env["SNAPSTORE_PROGRESS"] = "0"
    if program["lang"] == "python":
        argv = [sys.executable, "-c", program["code"]]
    else:
        argv = ["bash", "-euo", "pipefail", "-c", program["code"]]
    p = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, (f"README.md:{program['line']} failed\n--- code\n"
                               f"{program['code']}--- stdout\n{p.stdout[-3000:]}"
                               f"--- stderr\n{p.stderr[-3000:]}")
    for name in program["checks"]:
        CHECKS[name](workdir)
