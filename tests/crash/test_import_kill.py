"""Copy and savepoint import SIGKILLed at every crash point of the commit path: they commit
through Committer.commit_manifests, which shares the claim, record, sync and publish steps
with checkpoint(), so the same rule holds. Killed before the commit record is in the log,
nothing of the checkpoint is visible after recovery; from then on, recovery publishes it and
it restores byte-exact. Either way the store verifies, and running the copy or import again
completes it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

import snapstore

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POINTS = ("after_data_append", "after_commit_append", "after_fsync", "before_index_commit",
          "after_index_commit")
CHILD = """
import sys, snapstore
how, src, dst, snap = sys.argv[1:]
with snapstore.open(dst) as d:
    if how == "copy":
        with snapstore.open(src, readonly=True) as s:
            snapstore.copy_checkpoints(s, d)
    else:
        snapstore.import_savepoint(d, snap)
print("not killed")
"""


@pytest.mark.parametrize("how", ["copy", "import"])
def test_killed_at_every_point(tmp_path, how, kill_log):
    src = str(tmp_path / "src")
    with snapstore.open(src) as s:
        x = bytearray(os.urandom(500_000))
        first = s.checkpoint({"x": x, "e": b""}, "t", meta={"n": 1})
        first_state = s.restore(first.id)
        x[1000:1100] = os.urandom(100)
        tip = s.checkpoint({"x": x, "e": b""}, "t", meta={"n": 2})
        want = s.restore(tip.id)
        snap = str(tmp_path / "tip.snap")
        snapstore.export_savepoint(s, tip.id, snap)
    for i, point in enumerate(POINTS):
        dst = str(tmp_path / f"dst{i}")
        snapstore.open(dst).close()
        env = dict(os.environ, SNAPSTORE_CRASH_AT=point,
                   PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, "-c", CHILD, how, src, dst, snap], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == -signal.SIGKILL, (point, p.stdout, p.stderr)
        kill_log()
        with snapstore.open(dst) as d:                   # recovery of the dead writer's log
            got = d.checkpoints()
            if point == "after_data_append":
                assert got == [], point
            else:
                assert len(got) == 1, point
                # the first checkpoint it commits: the tip (import), the source's first (copy)
                assert d.restore(got[0].id) == (want if how == "import" else first_state)
            assert d.verify(deep=True)["ok"], point
            # finishing: a rerun completes it (copy skips what is there)
            if how == "copy":
                with snapstore.open(src, readonly=True) as s:
                    snapstore.copy_checkpoints(s, d)
                    assert [d.restore(c.id) for c in d.checkpoints()] == \
                        [s.restore(c.id) for c in s.checkpoints()]
            else:
                if not got:
                    snapstore.import_savepoint(d, snap)
                assert d.restore(d.latest("t").id) == want
            assert d.verify(deep=True)["ok"], point
