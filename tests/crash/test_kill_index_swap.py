"""Crash safety of compaction's index shrink (issue 15): a compacting copy of the LMDB index is
swapped in with indexswap.swap_in. A child process compacts with shrink_index=True and is
SIGKILLed at each named point before, during and after the swap (the exchange and, forced,
the fallback's two renames), or at a random moment; a reader process with the index open
runs across it. After every kill the store reopens (the writer's open finishes or cleans up
the swap), every acknowledged checkpoint restores byte-exact, verify(deep=True) is ok, no
staging directory is left, and the reader never read wrong bytes.

Kills: len(POINTS) * SNAPSTORE_SWAP_KILL_ROUNDS (default 2) + the random ones.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from test_compact_kill import _child_env as _env  # the crash children's environment

import snapstore
from snapstore.engine import format as fmt

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("SNAPSTORE_SWAP_KILL_ROUNDS", "2"))
POINTS = ("compact_before_index_swap", "index_swap_exchanged", "compact_after_index_swap",
          "index_swap_renamed_old")

CHILD = r"""
import json, sys
import snapstore
from snapstore.engine import indexswap
path, fallback = sys.argv[1], sys.argv[2] == "1"
if fallback:
    indexswap.exchange = lambda a, b: False
store = snapstore.open(path, durability="fsync")
print("start", flush=True)
rep = store.compact(shrink_index=True)
store.close()
print("done " + json.dumps(rep), flush=True)
"""

READER = r"""
import sys, time
import snapstore
from snapstore.errors import ConcurrentCompactionError, SnapstoreError
path, seconds = sys.argv[1], float(sys.argv[2])
import hashlib
store = snapstore.open(path, readonly=True)
deadline = time.monotonic() + seconds
reads = 0
while time.monotonic() < deadline:
    try:
        for c in store.checkpoints():
            got = store.restore(c.id)["b"]
            if hashlib.sha256(got).hexdigest() != c.meta["sha"]:
                print("WRONG", c.id, flush=True)
                sys.exit(1)
            reads += 1
    except ConcurrentCompactionError:
        continue
print("reads", reads, flush=True)
"""


class Store:
    def __init__(self, path: str, seed: int) -> None:
        self.path, self.rng = path, random.Random(seed)
        self.want: dict[int, bytes] = {}
        self.k = 0

    def churn(self) -> None:
        """Many small checkpoints, most then deleted: the index has many free pages."""
        import hashlib
        with snapstore.open(self.path, durability="none") as s:
            for _ in range(60):
                self.k += 1
                data = self.rng.randbytes(self.rng.randint(1, 24) << 10)
                info = s.checkpoint({"b": data}, stream=f"s{self.k % 3}",
                                    meta={"sha": hashlib.sha256(data).hexdigest()})
                self.want[info.id] = data
            for stream in ("s0", "s1", "s2"):
                for cid in s.retain(stream, keep_last=3):
                    del self.want[cid]

    def check(self, where: str) -> None:
        with snapstore.open(self.path, durability="none") as s:
            assert sorted(c.id for c in s.checkpoints()) == sorted(self.want), where
            for cid, data in self.want.items():
                assert s.restore(cid) == {"b": data}, f"{where}: checkpoint {cid}"
            rep = s.verify(deep=True)
            assert rep["ok"], f"{where}: {rep['problems'][:3]}"
        left = [n for n in os.listdir(self.path)
                if n in (fmt.INDEX_REBUILD_DIR, fmt.INDEX_OLD_DIR)]
        assert not left, f"{where}: left over {left}"


def _compact_child(path: str, crash_at: str | None, fallback: bool, kill_after=None):
    proc = subprocess.Popen([sys.executable, "-c", CHILD, path, "1" if fallback else "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_env(crash_at))
    try:
        line = proc.stdout.readline()
        if kill_after is not None and line.startswith("start"):
            time.sleep(kill_after)
            proc.send_signal(signal.SIGKILL)
        out, err = proc.communicate(timeout=120)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc.returncode, line + out, err


def test_index_swap_survives_sigkill(tmp_path, kill_log):
    seed = int(os.environ.get("SNAPSTORE_CRASH_SEED", random.randrange(1 << 31)))
    print(f"\nSNAPSTORE_CRASH_SEED={seed}")
    rng = random.Random(seed)
    h = Store(str(tmp_path / "store"), seed)
    plan = [p for p in POINTS for _ in range(ROUNDS)] + ["random"] * (2 * ROUNDS)
    rng.shuffle(plan)
    kills = 0
    for i, how in enumerate(plan):
        h.churn()
        where = f"run {i} ({how}, seed {seed})"
        reader = subprocess.Popen([sys.executable, "-c", READER, h.path, "1.5"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=_env())
        try:
            time.sleep(0.2)
            if how == "random":
                rc, out, err = _compact_child(h.path, None, rng.random() < 0.3,
                                              kill_after=rng.uniform(0, 0.15))
            else:
                rc, out, err = _compact_child(h.path, how, how == "index_swap_renamed_old")
                assert rc == -signal.SIGKILL, f"{where}: not killed at {how}: {out} {err}"
            rout, rerr = reader.communicate(timeout=120)
        finally:
            if reader.poll() is None:
                reader.kill()
                reader.wait()
        assert reader.returncode == 0 and rout.startswith("reads"), (where, rout, rerr)
        if rc == -signal.SIGKILL:
            kills += 1
            kill_log(1)
        else:
            assert rc == 0, f"{where}: compaction child failed: {err}"
        h.check(where)
    assert kills >= len(POINTS) * ROUNDS
    # finally the shrink runs to its end on the recovered store
    rc, out, err = _compact_child(h.path, None, False)
    assert rc == 0, err
    assert json.loads(out.split("done ", 1)[1])["index_shrunk"] is True
    h.check("final")
