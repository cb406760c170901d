"""Crash tests of object saves, DCP saves and async torch saves: a writer SIGKILLed inside
store.save, dcp.save or snapstore.torch.save_async's background commit (at every crash point of the commit protocol, and at random moments) leaves the previous
checkpoint as the latest when the commit record was not yet in the log, and never anything
that does not load byte-exact. The trials run in object_child.py (one runner per test,
forking a writer per kill). SNAPSTORE_CRASH_SEED fixes the seed (printed on failure).
"""
import json
import os
import random
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHILD = os.path.join(HERE, "object_child.py")

pytestmark = pytest.mark.slow


def run(tmp_path, mode: str, per_point: int, n_random: int, request) -> list:
    seed = int(os.environ.get("SNAPSTORE_CRASH_SEED", random.randrange(1 << 30)))
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1")
    env.pop("SNAPSTORE_CRASH_AT", None)
    proc = subprocess.run([sys.executable, CHILD, mode, str(tmp_path / "store"), str(seed),
                           str(per_point), str(n_random)],
                          env=env, capture_output=True, text=True, timeout=300)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    kills = [x for x in lines if "kill" in x]
    try:
        request.getfixturevalue("kill_log")(len(kills))
    except pytest.FixtureLookupError:
        pass
    assert proc.returncode == 0 and lines and lines[-1].get("done") == mode, (
        f"seed {seed} (rerun with SNAPSTORE_CRASH_SEED={seed}):\n"
        + "\n".join(map(str, lines[-5:])) + "\n" + proc.stderr[-4000:])
    return kills


def test_kill_during_object_save(tmp_path, request):
    kills = run(tmp_path, "objects", per_point=4, n_random=10, request=request)
    assert len(kills) == 30
    assert {k["trial"] for k in kills} == {"after_data_append", "after_commit_append",
                                          "after_fsync", "before_index_commit",
                                          "after_index_commit", "random"}


def test_kill_during_dcp_save(tmp_path, request):
    pytest.importorskip("torch")
    kills = run(tmp_path, "dcp", per_point=1, n_random=2, request=request)
    assert len(kills) == 7


def test_kill_during_async_torch_save(tmp_path, request):
    """snapstore.torch.save_async, the tensors overwritten as soon as it returns, the process
    killed while the save is written in the background: what survives restores the values as
    of the call, never the overwritten ones."""
    pytest.importorskip("torch")
    kills = run(tmp_path, "async", per_point=2, n_random=6, request=request)
    assert len(kills) == 16
    assert {k["trial"] for k in kills} == {"after_data_append", "after_commit_append",
                                          "after_fsync", "before_index_commit",
                                          "after_index_commit", "random"}
