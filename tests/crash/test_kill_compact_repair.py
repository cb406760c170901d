"""Random kills, compaction in between, and `snapstore repair` after them (issue 14: the log is
the whole truth and the index a cache that repair rebuilds from it at any time).

One store, many iterations. Each iteration:
  1. a writer child (writer_child.py write: checkpoints of two streams, deletes) is SIGKILLed
     at a random moment (sometimes during start-up and recovery);
  2. half of the time the parent opens the store as a writer (recovery) and tags or untags a
     random live checkpoint;
  3. most of the time a compaction child (compact_child.py compact) runs, SIGKILLed at a
     random moment after it started half of the time;
  4. a reader's view is recorded (checkpoint ids, streams, seqs, tags, meta, sizes, created,
     stream heads), then `snapstore repair STORE` runs as a real command (python -m snapstore)
     and must exit 0;
  5. after the repair a reader sees the same checkpoints with the same fields and heads (only
     the operation in flight at the kill may still land: a checkpoint whose commit record was
     durable, once; a delete whose record was); a checkpoint keeps its seq, no two share one;
     every acknowledged checkpoint restores byte-exact; verify(deep=True) is clean.
The next writer child carries on with the repaired store (ids are never reused).

Only the public API and the command line touch the store; the writer's journal protocol and
its bookkeeping are test_kill.Harness's (spawn, wait_ready, finish, read_journal,
check_restores: public API only).
SNAPSTORE_REPAIR_KILLS (default 24) sets the number of kills, SNAPSTORE_CRASH_SEED the seed.
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from cli_runner import console_script

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from test_kill import Harness  # noqa: E402

import snapstore  # noqa: E402

pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("SNAPSTORE_REPAIR_KILLS", "24"))
ROOT = os.path.dirname(os.path.dirname(HERE))
COMPACT_CHILD = os.path.join(HERE, "compact_child.py")
SEGMENT_SIZE = 256 << 10
FIELDS = ("stream", "seq", "tags", "meta", "sizes", "created")


def _env() -> dict:
    env = dict(os.environ)
    env.pop("SNAPSTORE_CRASH_AT", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def checkpoint_fields(store) -> dict:
    """{id: {field: value}} of every checkpoint of an open store (FIELDS)."""
    return {i.id: {"stream": i.stream, "seq": i.seq, "tags": sorted(i.tags), "meta": i.meta,
                   "sizes": dict(i.sizes), "created": i.created} for i in store.checkpoints()}


def snapshot(path: str) -> dict:
    """What a reader sees: {"ckpts": checkpoint_fields, "streams": [...], "heads": {}}."""
    with snapstore.open(path, readonly=True) as s:
        streams = sorted(s.streams())
        return {"ckpts": checkpoint_fields(s), "streams": streams,
                "heads": {name: getattr(s.latest(name), "id", None) for name in streams}}


class RepairHarness(Harness):
    """test_kill's writer bookkeeping, plus tags, compaction children and repair."""

    def __init__(self, tmp_path, seed: int) -> None:
        super().__init__(tmp_path, seed, segment_size=SEGMENT_SIZE)
        self.tags: dict[int, set] = {}          # checkpoint id -> tags the parent set
        self.seqs: dict[int, tuple] = {}        # checkpoint id -> (stream, seq) first seen
        self.repairs = 0
        self.compactions = {"killed": 0, "finished": 0}

    # ---- the model ---------------------------------------------------------------------------
    def settle(self, visible: dict, inflight, where: str) -> None:
        """The first view after a recovery or repair decides the operation in flight at the
        kill; the model takes it in. Everything else must be exactly the model."""
        kind, arg = inflight if inflight else (None, None)
        missing = set(self.live) - set(visible)
        extra = set(visible) - set(self.live)
        assert missing <= ({arg} if kind == "del" else set()), (
            f"{self.ctx()} {where}: acknowledged checkpoints lost: {sorted(missing)}")
        if kind == "ckpt":
            assert len(extra) <= 1, f"{self.ctx()} {where}: unexpected checkpoints {extra}"
            for cid in extra:
                assert cid > self.max_id and visible[cid]["meta"] == {"step": arg}, (
                    f"{self.ctx()} {where}: checkpoint {cid} ({visible[cid]['meta']}) was "
                    f"never acknowledged nor in flight (step {arg} was)")
                self.live[cid] = self.ever[cid] = arg
                self.max_id = cid
        else:
            assert not extra, (f"{self.ctx()} {where}: checkpoints nobody acknowledged: "
                               f"{sorted(extra)}")
        for cid in missing:
            del self.live[cid]
            self.tags.pop(cid, None)
        for cid, info in visible.items():
            want = sorted(self.tags.get(cid, ()))
            assert info["tags"] == want, (f"{self.ctx()} {where}: checkpoint {cid} has tags "
                                          f"{info['tags']}, the parent set {want}")

    def check_seqs(self, view: dict, where: str) -> None:
        """A checkpoint keeps its seq for ever, and no two visible checkpoints of a stream
        share one. (Not checked: that a stream whose checkpoints were all deleted goes on
        counting; today it starts again at 1.)"""
        owners: dict = {}
        for cid, info in view["ckpts"].items():
            key = (info["stream"], info["seq"])
            assert self.seqs.setdefault(cid, key) == key, (
                f"{self.ctx()} {where}: checkpoint {cid} is now seq {info['seq']} of "
                f"{info['stream']!r}, it was {self.seqs[cid]}")
            assert owners.setdefault(key, cid) == cid, (
                f"{self.ctx()} {where}: checkpoints {owners[key]} and {cid} are both seq "
                f"{info['seq']} of stream {info['stream']!r}")

    def write_to_end(self, steps: int, where: str) -> None:
        """A writer child that is not killed: every step acknowledged, the view agrees."""
        proc, journal = self.spawn(max_steps=steps)
        assert self.finish(proc, killed=False) == 0
        assert self.read_journal(journal) is None, f"{self.ctx()} {where}: writer did not end"
        view = snapshot(self.path)
        self.settle(view["ckpts"], None, where)
        self.check_seqs(view, where)

    # ---- what happens between writers ----------------------------------------------------------
    def retag(self, inflight) -> None:
        """Opens as a writer (recovery), settles the kill, tags or untags a live checkpoint."""
        with snapstore.open(self.path, segment_size=SEGMENT_SIZE) as s:
            self.settle(checkpoint_fields(s), inflight, "writer open after the kill")
            if self.live:
                cid = self.rng.choice(sorted(self.live))
                tags = self.tags.setdefault(cid, set())
                if tags and self.rng.random() < 0.4:
                    tag = self.rng.choice(sorted(tags))
                    s.untag(cid, tag)
                    tags.discard(tag)
                else:
                    tag = f"t{self.rng.randrange(4)}"
                    s.tag(cid, tag)
                    tags.add(tag)

    def compact(self) -> None:
        """A compaction child, SIGKILLed at a random moment after it started half of the
        time."""
        kill = self.rng.random() < 0.5
        proc = subprocess.Popen([sys.executable, COMPACT_CHILD, "compact", self.path, "0.9",
                                 "none"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=_env(), text=True)
        try:
            line = proc.stdout.readline()
            if kill and line.startswith("start"):
                time.sleep(self.rng.uniform(0, 0.08))
                proc.send_signal(signal.SIGKILL)
            out, err = proc.communicate(timeout=120)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if proc.returncode == -signal.SIGKILL:
            self.kills += 1
            self.compactions["killed"] += 1
        else:
            assert proc.returncode == 0, (f"{self.ctx()} compaction child failed "
                                          f"({proc.returncode}): {err}")
            self.compactions["finished"] += 1

    def repair(self) -> None:
        proc = subprocess.run([console_script(), "--no-progress", "repair",
                               self.path], env=_env(), capture_output=True, text=True,
                              timeout=300)
        self.repairs += 1
        if proc.returncode != 0:
            pytest.fail(f"{self.ctx()} `snapstore repair {self.path}` exit {proc.returncode}:"
                        f"\n{proc.stdout}{proc.stderr}", pytrace=False)

    # ---- the checks after a repair --------------------------------------------------------------
    def compare(self, before: dict, after: dict, inflight) -> None:
        """After the repair: the same checkpoints with the same fields, streams and heads
        as before it, but for the operation in flight if no recovery has decided it yet."""
        kind, arg = inflight if inflight else (None, None)
        b, a = before["ckpts"], after["ckpts"]
        gone, added = set(b) - set(a), set(a) - set(b)
        assert gone <= ({arg} if kind == "del" else set()), (
            f"{self.ctx()} repair lost checkpoints {sorted(gone)}")
        assert not added or (kind == "ckpt" and len(added) == 1), (
            f"{self.ctx()} repair brought checkpoints {sorted(added)} "
            f"({ {i: a[i]['meta'] for i in added} }) back or made them up")
        for cid in sorted(set(a) & set(b)):
            for f in FIELDS:
                assert a[cid][f] == b[cid][f], (f"{self.ctx()} repair changed checkpoint "
                                                f"{cid}'s {f}: {b[cid][f]!r} -> {a[cid][f]!r}")
        if not gone and not added:
            assert after["streams"] == before["streams"], (
                f"{self.ctx()} repair changed the streams: {before['streams']} -> "
                f"{after['streams']}")
            assert after["heads"] == before["heads"], (
                f"{self.ctx()} repair changed the stream heads: {before['heads']} -> "
                f"{after['heads']}")

    def check_content(self) -> None:
        with snapstore.open(self.path, readonly=True) as s:
            for cid, step in sorted(self.live.items()):
                self.check_restores(s, cid, step)
            report = s.verify(deep=True)
            assert report["ok"], (f"{self.ctx()} verify(deep=True): "
                                  f"{report['problems'][:5]}")


def test_repair_after_random_kills_and_compactions(tmp_path, kill_log):
    seed = int(os.environ.get("SNAPSTORE_CRASH_SEED", random.randrange(1 << 31)))
    h = RepairHarness(tmp_path, seed)
    h.write_to_end(4, "the first writer")
    attempts = 0
    while h.kills < KILLS:
        attempts += 1
        assert attempts < 3 * KILLS, f"{h.ctx()} children keep finishing before the kill"
        proc, journal = h.spawn(max_steps=100_000)
        if h.rng.random() < 0.1:            # anywhere, start-up and recovery included
            time.sleep(h.rng.uniform(0.0, 0.3))
        else:
            assert h.wait_ready(proc, journal), f"{h.ctx()} writer child did not start"
            time.sleep(h.rng.uniform(0.0, 0.15))
        h.finish(proc, killed=True)
        inflight = h.read_journal(journal) if os.path.exists(journal) else None
        recovered = False
        if h.rng.random() < 0.5:
            h.retag(inflight)
            inflight, recovered = None, True
        if h.rng.random() < 0.7:
            h.compact()
            recovered = True                # its open recovered the log before "start"
        before = snapshot(h.path)
        if recovered and inflight is not None:
            h.settle(before["ckpts"], inflight, "view after recovery")
            inflight = None
        h.check_seqs(before, "before repair")
        h.repair()
        after = snapshot(h.path)
        h.compare(before, after, inflight)
        h.settle(after["ckpts"], inflight, "view after repair")
        h.check_seqs(after, "after repair")
        h.check_content()
    h.write_to_end(3, "a writer after the last repair")
    h.check_content()
    kill_log(h.kills)
    print(f"seed {seed}: {h.kills} kills ({h.compactions['killed']} of compactions; "
          f"{h.compactions['finished']} compactions finished), {h.repairs} repairs, "
          f"{len(h.ever)} checkpoints committed, {len(h.live)} live at the end")
