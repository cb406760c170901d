"""Kill torture of many writers (issue 16): on ONE store, round after round, 4 writer processes
(each on a stream of its own: checkpoints, some with expect_head, deletes, delete_many, tags),
a group commit of 3 participant processes and a coordinator process, a compactor process
looping compact() (sometimes forcing the index shrink) and 2 reader processes (restoring,
reading ranges and checking every byte against the SHA-256 in the checkpoint's meta; one also
runs verify() while the others write) run together (many_writers_child.py). Each round ends in
SIGKILLs: of all of them, or of a random part (the rest are asked to stop and must close
cleanly), at random moments -- during open and recovery too -- and some processes run into a
crash point of the commit, group commit and compaction paths (SNAPSTORE_CRASH_AT=point:N).

After every round, with every process gone, the parent checks (Torture.check):
  * a read-only open (no recovery) already shows every acknowledged checkpoint;
  * a writer open succeeds (it recovers every dead writer's log);
  * per stream, the visible checkpoints are exactly the acknowledged ones (journaled after
    the call returned), plus at most the one operation in flight when its process died: an
    in-flight checkpoint is visible with its own content or not at all; an in-flight
    delete_many deleted all of its checkpoints or none; an in-flight tag is there or not; a
    group that timed out is not visible. Nothing else is visible;
  * every visible checkpoint restores byte-exact (SHA-256s journaled and in its meta); a
    group checkpoint holds all three parts, each exactly the participant's content at the
    offset its part names, offsets moving forward from the group's parent;
  * tags, heads, parents and seqs are what the model says; new ids are above every id seen
    before the round; no claim or group is left in the index;
  * verify(deep=True) is ok;
  * readers exited cleanly or by SIGKILL, and every checkpoint they checked is one the
    parent knows, with the same content key.
At the end the index is deleted and repair() must rebuild exactly the same checkpoints.

SNAPSTORE_MW_KILLS (default 300) is how many SIGKILLs the test performs at least (a round
kills 7-11 processes); SNAPSTORE_CRASH_SEED fixes the seed (printed, and in every message).
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import random
from dataclasses import dataclass, field

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import many_writers_child as mw  # noqa: E402

import snapstore  # noqa: E402
from snapstore.engine import claims as claim_rules  # noqa: E402
from snapstore.engine import format as fmt  # noqa: E402

pytestmark = pytest.mark.slow

CHILD = os.path.join(HERE, "many_writers_child.py")
PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(snapstore.__file__)))
KILLS = int(os.environ.get("SNAPSTORE_MW_KILLS", "300"))
WRITERS = 4
READERS = 2
COMMIT_POINTS = ("after_data_append", "after_commit_append", "after_fsync",
                 "before_index_commit", "after_index_commit")
GROUP_POINTS = COMMIT_POINTS[1:]            # group.commit() claims and publishes
COMPACT_POINTS = ("compact_after_trim_copy", "compact_after_state", "compact_after_copy",
                  "compact_before_remove", "compact_after_remove", "compact_before_index_swap",
                  "index_swap_exchanged", "compact_after_index_swap")


def _seed() -> int:
    return int(os.environ.get("SNAPSTORE_CRASH_SEED", random.randrange(1 << 31)))


class Zygote:
    """The process factory (many_writers_child.py zygote): forks role processes on request,
    SIGKILLs them on request (only while it has not reaped them, so never another process
    that reused the pid) and reports their exit codes."""

    def __init__(self, log: str) -> None:
        env = dict(os.environ)
        env.pop("SNAPSTORE_CRASH_AT", None)
        env["PYTHONPATH"] = PKG_ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self.err = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, CHILD, "zygote"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err)
        self.pids: "queue.Queue[int]" = queue.Queue()
        self.exits: dict[int, int] = {}
        self.cond = threading.Condition()
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        if not self.ready.wait(60):
            raise AssertionError("the zygote did not start")

    def _read(self) -> None:
        for raw in self.proc.stdout:
            word, *rest = raw.decode().split()
            if word == "ready":
                self.ready.set()
            elif word == "pid":
                with self.cond:     # an exit recorded under this pid was an earlier child's
                    self.exits.pop(int(rest[0]), None)
                self.pids.put(int(rest[0]))
            elif word == "exit":
                with self.cond:
                    self.exits[int(rest[0])] = int(rest[1])
                    self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def _send(self, line: str) -> None:
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def spawn(self, role: str, args: dict, log: str, env: dict | None = None) -> int:
        self._send("spawn " + json.dumps({"role": role, "args": args, "log": log,
                                          "env": env or {}}))
        return self.pids.get(timeout=60)

    def kill(self, pid: int) -> None:
        self._send(f"kill {pid}")

    def dump(self, pid: int) -> None:
        """The child writes its threads' stacks to its log."""
        self._send(f"dump {pid}")

    def wait(self, pids, timeout: float) -> dict[int, int | None]:
        """{pid: exit code} once all have ended (None for those still running at timeout)."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while not all(p in self.exits for p in pids):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    break
                self.cond.wait(min(left, 0.5))
            return {p: self.exits.get(p) for p in pids}

    def close(self) -> None:
        try:
            self.proc.stdin.close()         # EOF: it SIGKILLs what is left and exits
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.err.close()


@dataclass
class Ckpt:
    stream: str
    key: str
    tags: set = field(default_factory=set)


@dataclass
class Proc:
    name: str
    role: str
    args: dict
    log: str
    crash_at: str | None = None
    pid: int = 0
    code: int | None = None
    died_at: str | None = None      # the crash point it died at (never SIGKILLed by the test)


def _lines(path: str) -> list[list[str]]:
    """The complete lines of a journal, split into words (none if it was never created)."""
    try:
        with open(path, "rb") as f:
            data = f.read().decode()
    except FileNotFoundError:
        return []
    return [ln.split() for ln in data.split("\n")[:-1] if ln]


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")[-n:]
    except FileNotFoundError:
        return "(no log)"


class Torture:
    def __init__(self, tmp, seed: int) -> None:
        self.tmp = tmp
        self.path = str(tmp / "store")
        self.seed = seed
        self.rng = random.Random(seed)
        self.live: dict[int, Ckpt] = {}        # acknowledged (or recovered), not deleted
        self.ever: dict[int, str] = {}          # id -> key of every checkpoint ever visible
        self.tried: set[str] = set()            # every key a writer or the coordinator tried
        self.max_id = 0
        self.round = 0
        self.kills = 0
        self.stats: dict[str, int] = {}
        self.zygote = Zygote(str(tmp / "zygote.err"))
        print(f"many-writers torture seed {seed} (rerun with SNAPSTORE_CRASH_SEED={seed})")
        snapstore.open(self.path).close()

    def ctx(self) -> str:
        return f"[seed {self.seed}, round {self.round}]"

    def count(self, what: str, n: int = 1) -> None:
        self.stats[what] = self.stats.get(what, 0) + n

    # ---- one round --------------------------------------------------------------------------
    def plan(self) -> list[Proc]:
        rdir = self.tmp / f"r{self.round}"
        rdir.mkdir()
        rng = self.rng
        common = {"path": self.path, "seed": self.seed, "round": self.round,
                  "stop_file": str(rdir / "stop"), "group_file": str(self.tmp / "group")}

        def proc(name: str, role: str, points=(), p: float = 0.0, most: int = 1, **args):
            crash = None
            if points and rng.random() < p:
                crash = f"{rng.choice(points)}:{rng.randint(1, most)}"
            return Proc(name, role, dict(common, journal=str(rdir / f"{name}.journal"), **args),
                        str(rdir / f"{name}.log"), crash)
        procs = [proc(f"w{i}", "writer", COMMIT_POINTS, 0.4, 4, index=i)
                 for i in range(WRITERS)]
        procs.append(proc("coord", "coordinator", GROUP_POINTS, 0.4, 2))
        procs += [proc(p, "participant", participant=p) for p in mw.PARTICIPANTS]
        procs.append(proc("compactor", "compactor", COMPACT_POINTS, 0.5, 2))
        procs += [proc(f"r{i}", "reader", index=i, verify=(i == 0)) for i in range(READERS)]
        return procs

    def run_round(self) -> None:
        self.round += 1
        rng = self.rng
        try:
            os.unlink(self.tmp / "group")
        except FileNotFoundError:
            pass
        procs = self.plan()
        mode = rng.choice(("all", "all", "some", "some", "early"))
        roll = rng.random()
        if mode == "some" and 0.35 <= roll < 0.75:
            next(p for p in procs if p.role == "coordinator").crash_at = None   # it times out
        for p in rng.sample(procs, len(procs)):
            env = {"SNAPSTORE_CRASH_AT": p.crash_at} if p.crash_at else None
            p.pid = self.zygote.spawn(p.role, p.args, p.log, env)
        started = time.monotonic()
        self.started_at = time.time()
        lone = None
        duration = rng.uniform(0.0, 0.12) if mode == "early" else rng.uniform(0.2, 0.9)
        # A process with a crash point is left to run into it (else it is stopped at the
        # end), so its death tells where it died; the others die at random moments.
        if mode == "early":
            victims = list(procs)
        elif mode == "all":
            victims = [p for p in procs if not p.crash_at]
        else:       # some: each writer, reader and the compactor by chance; the group's
                    # processes all, none, or one participant (its group then times out)
            group = [p for p in procs if p.role in ("coordinator", "participant")]
            victims = [p for p in procs if p not in group and rng.random() < 0.6]
            if roll < 0.35:
                victims += group
            elif roll < 0.75:       # one participant, early, and a round long enough for
                lone = rng.choice(group[1:])    # the coordinator to time out
                victims.append(lone)
                duration = max(duration, 0.3 + 2 * mw.GROUP_TIMEOUT)
            victims = [p for p in victims if not p.crash_at]
        # the first kills come once the processes are under way (but in "early" rounds,
        # which kill them while they open the store and recover the dead writers' logs)
        first = 0.0 if mode == "early" else duration / 4
        schedule = sorted((rng.uniform(first, duration) if p is not lone else first, i)
                          for i, p in enumerate(procs) if p in victims)
        for at, i in schedule:
            time.sleep(max(0.0, started + at - time.monotonic()))
            self.zygote.kill(procs[i].pid)
        time.sleep(max(0.0, started + duration - time.monotonic()))
        with open(procs[0].args["stop_file"], "w"):
            pass
        # (generous: a compaction's index copy holds the index's write lock, and with it
        # every writer, for as long as the disk takes: seconds on a busy machine)
        codes = self.zygote.wait([p.pid for p in procs], 120)
        hung = [p for p in procs if codes[p.pid] is None]
        for p in hung:
            self.zygote.dump(p.pid)
        if hung:
            time.sleep(1)
        self.count(f"mode {mode}")
        if hung:        # every hung process's stacks: a wait cycle shows in more than one
            pytest.fail(f"{self.ctx()} did not stop: " + "\n\n".join(
                f"{p.name} ({p.role}, crash at {p.crash_at}; journal "
                f"{_lines(p.args['journal'])[-3:]}):\n{_tail(p.log)}" for p in hung))
        for p in procs:
            p.code = codes[p.pid]
            if p.code not in (0, -signal.SIGKILL):
                pytest.fail(f"{self.ctx()} {p.name} ({p.role}, crash at {p.crash_at}) exited "
                            f"{p.code}:\n{_tail(p.log)}")
            if p.code == 0:
                assert _lines(p.args["journal"])[-1] == ["stop"], (
                    f"{self.ctx()} {p.name} exited 0 without stopping")
            else:
                self.kills += 1
                if p not in victims:
                    p.died_at = p.crash_at.split(":")[0]
                    self.count(f"{p.role} died at {p.died_at}")
        self.check(procs)

    # ---- the checks -------------------------------------------------------------------------
    def read_journals(self, procs: list[Proc]) -> dict:
        """Feeds the writers' and the coordinator's journals into the model; returns
        {stream: the operation in flight when its process died, or None} (and notes in
        self.died_at the crash point its process died at)."""
        inflight: dict = {}
        self.died_at = {}
        for p in procs:
            if p.role not in ("writer", "coordinator"):
                continue
            stream = mw.GROUP_STREAM if p.role == "coordinator" else p.name
            cur = None
            for words in _lines(p.args["journal"]):
                word, args = words[0], words[1:]
                if word == "try":
                    cur = ("ckpt", args[0])
                    self.tried.add(args[0])
                elif word == "gtry":
                    cur = ("ckpt", "g:" + args[0])
                    self.tried.add("g:" + args[0])
                elif word in ("ok", "gok"):
                    cid, key = int(args[0]), args[1] if word == "ok" else "g:" + args[1]
                    assert cur == ("ckpt", key), f"{self.ctx()} {p.name} journal: {words}"
                    assert cid not in self.ever, f"{self.ctx()} id {cid} acknowledged twice"
                    assert cid > self.max_id, (f"{self.ctx()} {p.name} got id {cid}, not above "
                                               f"the ids of earlier rounds ({self.max_id})")
                    self.live[cid] = Ckpt(stream, key)
                    self.ever[cid] = key
                    cur = None
                elif word == "gtimeout":
                    assert cur == ("ckpt", "g:" + args[0]), f"{self.ctx()} {p.name}: {words}"
                    cur = ("timeout", "g:" + args[0])
                elif word == "try-del":
                    ids = [int(i) for i in args[0].split(",")]
                    unknown = [i for i in ids if self.live.get(i, Ckpt("", "")).stream != stream]
                    assert not unknown, (f"{self.ctx()} {p.name} deletes {unknown}, which it "
                                         "saw but the parent never learnt of")
                    cur = ("del", ids)
                elif word == "del":
                    assert cur == ("del", [int(i) for i in args[0].split(",")]), self.ctx()
                    for i in cur[1]:
                        del self.live[i]
                    cur = None
                elif word == "try-tag":
                    cid = int(args[0])
                    assert cid in self.live, f"{self.ctx()} {p.name} tags unknown {cid}"
                    cur = ("tag", cid, args[1], args[2] == "1")
                elif word == "tag":
                    assert cur == ("tag", int(args[0]), args[1], args[2] == "1"), self.ctx()
                    tags = self.live[cur[1]].tags
                    tags.add(cur[2]) if cur[3] else tags.discard(cur[2])
                    cur = None
            if cur is not None and cur[0] == "timeout":
                cur = None
            if cur is not None:
                assert p.code == -signal.SIGKILL, f"{self.ctx()} {p.name} left {cur} in flight"
            if p.died_at is not None:
                assert cur is not None, f"{self.ctx()} {p.name} died at {p.died_at} idle"
                assert p.died_at != "after_data_append" or cur[0] == "ckpt", self.ctx()
            inflight[stream] = cur
            self.died_at[stream] = p.died_at
        return inflight

    def check(self, procs: list[Proc]) -> None:
        inflight = self.read_journals(procs)
        streams = [f"w{i}" for i in range(WRITERS)] + [mw.GROUP_STREAM]

        # Before any recovery, a reader already sees every acknowledged checkpoint.
        with snapstore.open(self.path, readonly=True) as ro:
            seen = {c.id for c in ro.checkpoints()}
        maybe_gone = {i for cur in inflight.values() if cur and cur[0] == "del" for i in cur[1]}
        lost = set(self.live) - seen - maybe_gone
        assert not lost, f"{self.ctx()} read-only open lacks acknowledged checkpoints {lost}"

        try:
            store = snapstore.open(self.path)
        except Exception as exc:
            raise AssertionError(f"{self.ctx()} a writer open after the kills failed: "
                                 f"{exc!r}") from exc
        try:
            self.check_open_store(store, streams, inflight)
        finally:
            store.close()
        self.max_id = max([self.max_id] + list(self.ever))

        for p in procs:
            if p.role != "reader":
                continue
            for words in _lines(p.args["journal"]):
                if words[0] == "seen":
                    cid, key = int(words[1]), words[2]
                    assert key in self.tried, (f"{self.ctx()} {p.name} saw checkpoint {cid} "
                                               f"({key}) that nobody ever tried to commit")
                    assert self.ever.get(cid) == key, (
                        f"{self.ctx()} {p.name} saw checkpoint {cid} as {key}; the parent "
                        f"knows it as {self.ever.get(cid)}")
                    self.count("reader checks")
                elif words[0] == "retries":
                    self.count("reader retries", int(words[1]))
                elif words[0] == "verified":
                    self.count("verify while writing")
                elif words[0] == "verify-locked":
                    self.count("verify waited out")
        for p in procs:
            if p.role == "compactor":
                for words in _lines(p.args["journal"]):
                    if words[0] == "compact":
                        rep = json.loads(" ".join(words[1:]))
                        self.count("compactions")
                        self.count("segments removed", rep["segments_removed"])
                        self.count("chunks trimmed", rep["chunks_trimmed"])
                        self.count("index shrinks", int(rep["index_shrunk"]))
            elif p.role == "participant":
                for words in _lines(p.args["journal"]):
                    # the group's header names its parent, published before the header
                    # was: a view that shows the header shows the parent
                    assert words[0] != "parent-late", f"a participant saw a group's " \
                        f"parent late: {words}"
            elif p.role == "coordinator":
                for words in _lines(p.args["journal"]):
                    if words[0] in ("gok", "gtimeout"):
                        self.count({"gok": "group commits", "gtimeout": "group timeouts"}[
                            words[0]])

    def check_open_store(self, store, streams: list[str], inflight: dict) -> None:
        infos = {c.id: c for c in store.checkpoints()}
        for cid, info in infos.items():
            assert info.stream in streams, f"{self.ctx()} unexpected stream {info.stream!r}"
        for stream in streams:
            cur = inflight.get(stream)
            visible = {i for i, c in infos.items() if c.stream == stream}
            model = {i for i, c in self.live.items() if c.stream == stream}
            missing, extra = model - visible, visible - model
            kind = cur[0] if cur else None
            # died at a crash point: before the commit record nothing of it may be visible;
            # from its append on (a SIGKILL keeps the page cache) recovery publishes it
            point = self.died_at.get(stream)
            must = None if point is None else point != "after_data_append"
            if must is not None:
                applied = {"ckpt": bool(extra), "del": bool(missing)}.get(kind)
                if kind == "tag" and cur[1] in infos:
                    _, cid, tag, add = cur
                    applied = (tag in infos[cid].tags) == add
                assert applied == must, (f"{self.ctx()} {stream}: died at {point} with {cur} "
                                         f"in flight: recovery must "
                                         f"{'publish' if must else 'drop'} it")
                self.count(f"in-flight at {point} checked")
            if kind == "ckpt":
                assert len(extra) <= 1, f"{self.ctx()} {stream}: unexpected {sorted(extra)}"
                for cid in extra:
                    key = mw.key_of(infos[cid])
                    assert key == cur[1], (
                        f"{self.ctx()} {stream}: checkpoint {cid} ({key}) is visible but was "
                        f"never acknowledged nor in flight (in flight: {cur[1]})")
                    assert cid > self.max_id, f"{self.ctx()} in-flight {cid} reuses an id"
                    self.live[cid] = Ckpt(stream, key)
                    self.ever[cid] = key
                self.count("in-flight checkpoint " + ("visible" if extra else "gone"))
            else:
                assert not extra, (f"{self.ctx()} {stream}: checkpoints nobody acknowledged "
                                   f"are visible: {sorted(extra)} (in flight: {cur})")
            if kind == "del":
                assert missing in (set(), set(cur[1])), (
                    f"{self.ctx()} {stream}: an interrupted delete of {cur[1]} deleted "
                    f"{sorted(missing)}: not all or nothing")
                for cid in missing:
                    del self.live[cid]
                self.count("in-flight delete " + ("applied" if missing else "gone"))
            else:
                assert not missing, (f"{self.ctx()} {stream}: acknowledged checkpoints lost: "
                                     f"{sorted(missing)} (in flight: {cur})")
            if kind == "tag":
                _, cid, tag, add = cur
                if cid in self.live:
                    before = set(self.live[cid].tags)
                    after = before | {tag} if add else before - {tag}
                    now = set(infos[cid].tags)
                    assert now in (before, after), (f"{self.ctx()} checkpoint {cid}: tags {now}"
                                                    f", expected {before} or {after}")
                    self.live[cid].tags = now
                    self.count("in-flight tag " + ("applied" if now == after else "gone"))
            self.check_stream(store, stream, [infos[i] for i in sorted(visible)
                                              if i in self.live])
        claims = groups = None
        with store._index.read() as r:
            claims = claim_rules.claims(r)
            groups = r.group_entries()
        assert not claims, f"{self.ctx()} claims left after recovery: {claims}"
        assert not groups, f"{self.ctx()} group entries left after recovery: {groups}"
        rep = store.verify(deep=True)
        assert rep["ok"], f"{self.ctx()} verify(deep=True): {rep['problems'][:5]}"

    def check_stream(self, store, stream: str, chain: list) -> None:
        latest = store.latest(stream)
        assert (latest.id if latest else None) == (chain[-1].id if chain else None), (
            f"{self.ctx()} {stream}: head {latest and latest.id}, expected "
            f"{chain[-1].id if chain else None}")
        prev = None
        for info in chain:
            model = self.live[info.id]
            assert mw.key_of(info) == model.key, f"{self.ctx()} checkpoint {info.id}: key"
            assert set(info.tags) == model.tags, (f"{self.ctx()} checkpoint {info.id}: tags "
                                                  f"{info.tags}, expected {model.tags}")
            assert info.parent == (prev.id if prev else None), (
                f"{self.ctx()} {stream}: checkpoint {info.id}'s parent is {info.parent}, "
                f"expected {prev and prev.id}")
            assert prev is None or info.seq > prev.seq, f"{self.ctx()} {stream}: seqs"
            got = store.restore(info.id)
            problem = mw.check_restored(self.seed, info, got, full=True)
            assert problem is None, f"{self.ctx()} {problem}"
            if stream == mw.GROUP_STREAM and prev is not None:
                parts, before = snapstore.group_parts(info), snapstore.group_parts(prev)
                for p in mw.PARTICIPANTS:
                    base, last = parts[p]["base"], before[p]["offset"]
                    if info.meta.get("parent") == prev.id:     # built on prev itself
                        assert base == last, (f"{self.ctx()} group checkpoint {info.id}: part "
                                              f"{p} starts at {base}, its parent ended at "
                                              f"{last}")
                    else:                                   # its parent was deleted
                        assert base > last, f"{self.ctx()} group {info.id}: offsets go back"
            prev = info

    # ---- the end ----------------------------------------------------------------------------
    def check_repair(self) -> None:
        """The index deleted, repair() rebuilds the same checkpoints from the logs alone."""
        def snapshot(store):
            return [(c.id, c.stream, c.seq, c.parent, sorted(c.tags), mw.key_of(c),
                     c.sizes) for c in store.checkpoints()]
        with snapstore.open(self.path) as store:
            before = snapshot(store)
            contents = {c[0]: store.restore(c[0]) for c in before}
        shutil.rmtree(os.path.join(self.path, fmt.INDEX_DIR))
        rep = snapstore.repair(self.path)
        assert rep["ok"], f"{self.ctx()} repair: {rep['problems'][:5]}"
        with snapstore.open(self.path) as store:
            assert snapshot(store) == before, f"{self.ctx()} repair rebuilt other checkpoints"
            for cid, want in contents.items():
                assert store.restore(cid) == want, f"{self.ctx()} repair: {cid} restores wrong"
            assert store.verify(deep=True)["ok"]

    def close(self) -> None:
        self.zygote.close()


def test_many_writers_survive_sigkills(tmp_path, kill_log):
    t = Torture(tmp_path, _seed())
    started = time.monotonic()

    def enough() -> bool:
        # the kills asked for; in a full run also the group commits and timeouts asserted
        # below, which a loaded machine makes rarer per round: more rounds then
        if t.kills < KILLS:
            return False
        return KILLS < 100 or (t.stats.get("group commits", 0) >= 10
                               and t.stats.get("group timeouts", 0) > 0)
    try:
        while not enough():
            assert t.round < KILLS, f"{t.ctx()} {t.kills} kills in {t.round} rounds"
            t.run_round()
        t.check_repair()
    finally:
        t.close()
    kill_log(t.kills)
    # how many logs the store has after so many writers (each round opens 9 at once)
    t.stats["logs at the end"] = len(os.listdir(os.path.join(t.path, fmt.WRITERS_DIR)))
    t.stats["segments at the end"] = len(os.listdir(os.path.join(t.path, fmt.SEGMENTS_DIR)))
    print(f"seed {t.seed}: {t.kills} kills in {t.round} rounds, {time.monotonic() - started:.1f}s"
          f"; {len(t.ever)} checkpoints committed, {len(t.live)} live at the end; "
          f"{json.dumps(t.stats, sort_keys=True)}")
    # The rounds did what they are for: concurrent work that was interrupted.
    if KILLS < 100:
        return
    assert t.stats.get("compactions", 0) > 0 and t.stats.get("segments removed", 0) > 0
    assert t.stats.get("reader checks", 0) > 0
    assert t.stats.get("group commits", 0) >= 10 and t.stats.get("group timeouts", 0) > 0
