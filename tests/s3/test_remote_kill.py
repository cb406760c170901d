"""A writer of an S3 store SIGKILLed mid-commit (remote_child.py, against the real server).

The crash points of RemoteCommitter.commit (remote_after_data: chunks appended, uploads in
flight; remote_after_upload; remote_after_checkpoint_object; remote_after_ref_write: committed
in the bucket, not yet in the local cache; remote_after_apply) and random moments, in a loop
of checkpoints on ONE store and ONE cache directory. After every kill, from an EMPTY cache:
  * every checkpoint whose checkpoint() returned restores byte-exact;
  * nothing of a checkpoint that never reached its ref write is visible (the points before
    it: none; after it: the one in flight is, byte-exact);
  * the stream's head is its newest checkpoint and seqs run 1..n without a gap;
and killed after the ref write, the next open of the *same* cache directory shows the
checkpoint its cache did not have (the pull does it).
The next writer's open of the cache directory settles the dead session: its lock file
(writers/<L>) and spool files are gone once that open returns.

Then a writer killed in the middle of a multipart upload: the next writer open of its cache
directory aborts the dead log's incomplete upload and removes its spool, and touches neither
a live session sharing the directory nor anything from a read-only open.
"""
from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import remote_child  # noqa: E402

import snapstore  # noqa: E402
from snapstore.engine import format as fmt  # noqa: E402
from snapstore.engine.index import Index  # noqa: E402
from snapstore.engine.wal import log_of  # noqa: E402
from snapstore.remote import layout  # noqa: E402

pytestmark = pytest.mark.slow

CHILD = os.path.join(HERE, "remote_child.py")
MiB = 1 << 20
BEFORE_REF = ("remote_after_data", "remote_after_upload", "remote_after_checkpoint_object")
AFTER_REF = ("remote_after_ref_write", "remote_after_apply")
RANDOM_KILLS = int(os.environ.get("SNAPSTORE_S3_RANDOM_KILLS", "6"))


def _seed() -> int:
    return int(os.environ.get("SNAPSTORE_CRASH_SEED", random.randrange(1 << 31)))


def child_env(crash_at: str | None = None) -> dict:
    env = os.environ.copy()         # the AWS_* of the s3 fixture
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [p for p in
                                                  env.get("PYTHONPATH", "").split(os.pathsep)
                                                  if p])
    env.pop("SNAPSTORE_CRASH_AT", None)
    if crash_at:
        env["SNAPSTORE_CRASH_AT"] = crash_at
    return env


def read_journal(path) -> list[list[str]]:
    try:
        with open(path) as f:
            return [line.split() for line in f.read().splitlines()]
    except FileNotFoundError:
        return []


def wait_for(predicate, proc, seconds: float = 60.0) -> bool:
    """Polls until predicate() (True) or the process exits (False, unless it now holds)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return predicate()
        time.sleep(0.01)
    raise AssertionError("the child neither got there nor exited")


def cache_store_dir(cache_root) -> str:
    (path,) = glob.glob(os.path.join(str(cache_root), "*"))
    return path


def leftovers(cache_root, log: int) -> list[str]:
    """The lock file and spool files of writer session `log` left in the cache directory."""
    store = cache_store_dir(cache_root)
    out = [p for p in [os.path.join(store, "writers", str(log))] if os.path.exists(p)]
    for p in glob.glob(os.path.join(store, "spool", "*" + fmt.SEGMENT_SUFFIX)):
        if log_of(int(os.path.basename(p).split(".")[0])) == log:
            out.append(p)
    return out


def cached_ids(cache_root) -> list[int]:
    """The checkpoint ids the cache index holds for stream "s" (no Store opened)."""
    index = Index(os.path.join(cache_store_dir(cache_root), fmt.INDEX_DIR), readonly=True,
                  durable=False)
    try:
        with index.read() as r:
            return r.checkpoint_ids("s")
    finally:
        index.close()


class Harness:
    def __init__(self, url: str, tmp_path, seed: int) -> None:
        self.url, self.tmp, self.seed = url, tmp_path, seed
        self.kills = 0
        self.cache = tmp_path / "cache"
        self.known: dict[int, int] = {}        # id -> step: acknowledged or seen committed
        self.verified: set[int] = set()
        self.next_step = 0
        self.runs = 0
        self.dead_logs: list[int] = []
        self.last_run_seconds = 0.0           # how long the last child ran after "ready"

    def run(self, crash_at: str | None = None, kill_after: float | None = None,
            steps: int = 4) -> dict:
        """One child from the next step on; returns what its journal says."""
        self.runs += 1
        journal = self.tmp / f"journal{self.runs}"
        with open(self.tmp / f"stderr{self.runs}", "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, CHILD, "write", self.url, str(self.cache), str(journal),
                 str(self.seed), str(self.next_step), str(steps), str(MiB)],
                env=child_env(crash_at), stdout=subprocess.DEVNULL, stderr=err)
        try:
            ready = wait_for(lambda: any(w[0] == "ready" for w in read_journal(journal)),
                             proc)
            if ready:
                # the open settled every earlier dead session of the cache directory
                for log in self.dead_logs:
                    assert leftovers(self.cache, log) == [], (log, leftovers(self.cache, log))
                self.dead_logs = []
            started = time.monotonic()
            if kill_after is not None and proc.poll() is None:
                time.sleep(kill_after)
                proc.send_signal(signal.SIGKILL)
            proc.wait(120)
            self.last_run_seconds = time.monotonic() - started
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        lines = read_journal(journal)
        # a kill that came after the child closed the store (journal "done") found nothing
        # left to interrupt: that run counts as a clean one
        killed = proc.returncode == -signal.SIGKILL and lines[-1:] != [["done"]]
        if not killed:
            assert proc.returncode in (0, -signal.SIGKILL) and lines[-1] == ["done"], \
                (proc.returncode, (self.tmp / f"stderr{self.runs}").read_text()[-3000:])
        else:
            self.kills += 1
        log = next(int(w[1]) for w in lines if w[0] == "ready")
        tried = [int(w[1]) for w in lines if w[0] == "try"]
        acked = {int(w[1]): int(w[2]) for w in lines if w[0] == "ok"}
        in_flight = tried[-1] if tried and tried[-1] not in acked.values() else None
        if killed:
            self.dead_logs.append(log)
            assert leftovers(self.cache, log), "a killed session leaves its lock file"
        self.known.update(acked)
        if tried:
            self.next_step = tried[-1] + 1      # a step's content is never taken twice
        return {"killed": killed, "in_flight": in_flight, "acked": acked, "log": log}

    def verify(self, in_flight: int | None, visible_in_flight: bool | None) -> None:
        """From an empty cache (see the module docstring). visible_in_flight: whether the
        checkpoint in flight must (True) or must not (False) be visible; None: either."""
        self.runs += 1
        with snapstore.open(self.url, cache_dir=str(self.tmp / f"fresh{self.runs}"),
                            readonly=True) as r:
            visible = {c.id: c for c in r.checkpoints("s")}
            assert set(self.known) <= set(visible), sorted(set(self.known) - set(visible))
            extra = sorted(set(visible) - set(self.known))
            assert len(extra) <= 1, extra
            for cid in extra:
                assert in_flight is not None and visible[cid].meta == {"step": in_flight}
                self.known[cid] = in_flight
            if visible_in_flight is not None:
                assert bool(extra) == visible_in_flight, (in_flight, extra)
            ids = sorted(visible)
            if ids:
                head = r.latest("s")
                assert head.id == ids[-1] and head.seq == len(ids)
                assert [visible[i].seq for i in ids] == list(range(1, len(ids) + 1))
                assert [visible[i].meta["step"] for i in ids] == sorted(
                    visible[i].meta["step"] for i in ids)
            for cid in ids:
                if cid not in self.verified:
                    want = remote_child.content(self.seed, self.known[cid])
                    assert r.restore(cid) == want, f"checkpoint {cid} restores wrong bytes"
                    self.verified.add(cid)


@pytest.fixture
def url(s3):
    return f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"


def test_killed_at_every_commit_step_and_at_random(url, tmp_path):
    seed = _seed()
    h = Harness(url, tmp_path, seed)
    rng = random.Random(seed)
    try:
        h.run(steps=2)                                  # a history to build on
        h.verify(None, None)
        for point in BEFORE_REF + AFTER_REF:
            out = h.run(crash_at=f"{point}:{rng.randint(1, 2)}")
            assert out["killed"] and out["in_flight"] is not None, (point, out)
            if point == "remote_after_ref_write":
                # committed in the bucket; the dead writer's cache never applied it ...
                assert not set(cached_ids(h.cache)) - set(h.known)
            h.verify(out["in_flight"], point in AFTER_REF)
            if point == "remote_after_ref_write":
                # ... and the next open of the same cache directory shows it (its pull)
                with snapstore.open(url, cache_dir=str(h.cache), readonly=True) as r:
                    newest = r.latest("s")
                    assert newest.meta == {"step": out["in_flight"]}
                    assert r.restore(newest.id) == remote_child.content(seed,
                                                                        out["in_flight"])
                assert newest.id in cached_ids(h.cache)
        # random kills: until at least half of RANDOM_KILLS landed inside a run (a bounded
        # number of tries), each at a moment drawn from the length of the runs that ran to
        # their end (a commit takes 15-60 ms here; the first bound is a guess)
        before, tries, window = h.kills, 0, 0.3
        while tries < RANDOM_KILLS or (h.kills - before < RANDOM_KILLS // 2 and
                                       tries < 4 * RANDOM_KILLS):
            tries += 1
            out = h.run(kill_after=rng.uniform(0.0, window), steps=12)
            if not out["killed"]:
                window = 0.8 * h.last_run_seconds
            h.verify(out["in_flight"], None)
        out = h.run(steps=1)                            # the store goes on
        assert not out["killed"] and len(out["acked"]) == 1
        h.verify(None, False)
        assert leftovers(h.cache, out["log"]) == []     # a clean close leaves nothing
        assert h.kills >= len(BEFORE_REF + AFTER_REF) + RANDOM_KILLS // 2, h.kills
    except AssertionError as exc:
        raise AssertionError(f"{exc} (SNAPSTORE_CRASH_SEED={seed})") from exc


def incomplete_uploads(s3, log: int) -> list[str]:
    answer = s3.client().list_multipart_uploads(
        Bucket=s3.bucket, Prefix=s3.key(layout.log_segments_prefix(log)))
    return [u["Key"] for u in answer.get("Uploads", [])]


def test_killed_mid_multipart_upload_the_next_open_aborts_it(url, s3, tmp_path):
    cache = tmp_path / "cache"
    with snapstore.open(url, cache_dir=str(cache), segment_size=MiB) as s:
        first = s.checkpoint({"a": b"first"}, stream="s")
    journal = tmp_path / "journal"
    with open(tmp_path / "stderr", "wb") as err:
        proc = subprocess.run([sys.executable, CHILD, "big", url, str(cache), str(journal),
                               "12", "5"], env=child_env("remote_after_upload_part:1"),
                              stderr=err, timeout=120)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "stderr").read_text()[-3000:]
    dead = int(read_journal(journal)[0][1])
    assert incomplete_uploads(s3, dead), "the kill left no incomplete multipart upload"
    spooled = leftovers(cache, dead)
    assert any(p.endswith(fmt.SEGMENT_SUFFIX) for p in spooled), spooled

    # a reader of the cache directory settles nothing
    with snapstore.open(url, cache_dir=str(cache), readonly=True) as r:
        assert [c.id for c in r.checkpoints("s")] == [first.id]
        assert r.checkpoints("big") == []
    assert leftovers(cache, dead) == spooled and incomplete_uploads(s3, dead)

    # the next writer's open does
    live = snapstore.open(url, cache_dir=str(cache), segment_size=MiB)
    try:
        assert leftovers(cache, dead) == []
        assert incomplete_uploads(s3, dead) == []
        live_log = live._committer.log_number
        live_files = leftovers(cache, live_log)
        assert live_files                       # its lock file and open segment
        # another writer sharing the cache directory leaves the live session alone
        with snapstore.open(url, cache_dir=str(cache)) as other:
            assert other._committer.log_number not in (dead, live_log)
            other.checkpoint({"a": b"other"}, stream="t")
        assert leftovers(cache, live_log) == live_files
        info = live.checkpoint({"a": b"after"}, stream="s")
    finally:
        live.close()
    assert leftovers(cache, live_log) == []     # a clean close leaves nothing
    with snapstore.open(url, cache_dir=str(tmp_path / "empty"), readonly=True) as r:
        assert [c.id for c in r.checkpoints("s")] == [first.id, info.id]
        assert r.restore(info.id) == {"a": b"after"}
        assert r.checkpoints("big") == []
