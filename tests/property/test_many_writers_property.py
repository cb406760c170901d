"""Stateful property test of many writers against a pure-Python model (issue 16).

Several writer handles on one store -- two Stores of this process ("h0", "h1") and a writer in
another process ("r", forked, driven over a pipe) -- interleave operations hypothesis chooses:
checkpoints (building on the head, with expect_head the head, or with a stale expect_head,
which must raise CommitConflict and change nothing), deletes and delete_many, tags and
untags, group commits (open on any handle, stage parts from any handles, commit -- or let a
commit with a part missing time out -- or abort; a part for a finished group is refused),
compactions, reopening a handle, SIGKILLing the other process (between operations -- started
again at once, or only when next used, so that another writer meets its claims -- or at a
crash point of the commit protocol in the middle of a checkpoint, a delete or a tag) and
starting it again. The model is the checkpoints (stream, seq, parent,
contents, meta, tags), the streams (head, last seq) and the groups in progress (stream, parent,
participants, staged parts, the handle that opened it).

After every step every handle's view matches the model: the checkpoints with their streams,
seqs, parents, tags and meta, each stream's head; contents are checked after every write and
all of them through one handle per step. A conflict is expected exactly when the model says
so: another group of the stream in progress, a stale expected head, a delete or tag of a
group's parent. At the end verify(deep=True) is ok, and repair() with the index deleted
rebuilds exactly the model.

20 examples of 40 steps by default (the whole suite stays near 10 minutes on 2 cores: this
test alone took 55-155 s at 35); SNAPSTORE_HYPOTHESIS_PROFILE=slow runs 10x more examples.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import random
import shutil
import signal
import tempfile
import time
import traceback

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import snapstore
from snapstore import errors
from snapstore.engine.index import RECHECK_SECONDS
from snapstore.errors import CommitConflict, GroupError, GroupTimeout

STREAMS = ("s0", "s1", "s2")
HANDLES = ("h0", "h1", "r")
TAGS = ("t0", "t1")
PARTICIPANTS = ("pa", "pb", "pc")
OPTS = dict(durability="none", segment_size=1 << 16, max_chain=3, chunk_size=8192)
COMMIT_POINTS = ("after_data_append", "after_commit_append", "after_fsync",
                 "before_index_commit", "after_index_commit")
ANY = "any"          # expect_head not given


def examples(n: int) -> int:
    """n scaled by the loaded profile (dev: 100 -> n, slow: 1000 -> 10 n)."""
    return max(1, n * settings.default.max_examples // 100)


def guarded(method):
    """Marks the machine failed while the method runs, so teardown skips its own checks."""
    @functools.wraps(method)
    def run(self, **kwargs):
        self.failed = True
        method(self, **kwargs)
        self.failed = False
    return run


# ---- a handle: the same operations on a Store here or in another process --------------------
def _info(c) -> dict:
    return {"id": c.id, "stream": c.stream, "seq": c.seq, "parent": c.parent,
            "tags": sorted(c.tags), "meta": c.meta, "sizes": c.sizes,
            "parts": snapstore.group_parts(c)}


class Ops:
    """What a handle does, on a Store (in this process, or in the remote one)."""

    def __init__(self, store) -> None:
        self.store = store
        self.groups: dict = {}

    def checkpoint(self, stream, bufs, meta, expect):
        kw = {} if expect == ANY else {"expect_head": expect}
        return _info(self.store.checkpoint(bufs, stream, meta, **kw))

    def delete(self, cid):
        self.store.delete(cid)

    def delete_many(self, ids):
        self.store.delete_many(ids)

    def tag(self, cid, tag, add):
        (self.store.tag if add else self.store.untag)(cid, tag)

    def group(self, stream, participants, expect):
        kw = {} if expect == ANY else {"expect_head": expect}
        g = self.store.group(stream, participants, timeout=600, **kw)
        self.groups[g.id] = g
        return g.id, g.parent

    def stage(self, gid, participant, bufs, meta):
        self.store.stage(gid, participant, bufs, meta)

    def commit(self, gid, meta, timeout):
        return _info(self.groups.pop(gid).commit(meta, timeout=timeout))

    def abort(self, gid):
        return self.groups.pop(gid).abort()

    def compact(self, threshold, shrink):
        return self.store.compact(threshold=threshold, shrink_index=shrink)["index_shrunk"]

    def view(self):
        s = self.store
        return {"checkpoints": [_info(c) for c in s.checkpoints()], "streams": s.streams(),
                "heads": {st_: (s.latest(st_).id if s.latest(st_) else None) for st_ in STREAMS},
                "versions": {st_: s.stream_version(st_) for st_ in STREAMS}}

    def restore(self, cid):
        return self.store.restore(cid)


def _remote(conn, path: str, crash_at: str | None) -> None:
    """The other process: opens the store as a writer, then runs the commands it receives,
    answering ("ok", result) or ("err", exception class name, its attributes)."""
    os.environ.pop("SNAPSTORE_CRASH_AT", None)
    if crash_at:
        os.environ["SNAPSTORE_CRASH_AT"] = crash_at
    try:
        ops = Ops(snapstore.open(path, **OPTS))
        conn.send(("ok", None))
        while True:
            cmd, args = conn.recv()
            if cmd == "quit":
                ops.store.close()
                conn.send(("ok", None))
                return
            try:
                conn.send(("ok", getattr(ops, cmd)(*args)))
            except errors.SnapstoreError as exc:
                conn.send(("err", type(exc).__name__, str(exc),
                           {k: getattr(exc, k) for k in ("expected", "found", "missing")
                            if hasattr(exc, k)}))
    except BaseException:  # noqa: BLE001 -- reported to the test
        try:
            conn.send(("crash", traceback.format_exc()))
        except OSError:
            pass


class Died(Exception):
    """The remote process died during the command."""


class Remote:
    """The writer handle in another process (forked)."""

    def __init__(self, path: str, crash_at: str | None = None) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_remote, args=(child, path, crash_at), daemon=True)
        self.proc.start()
        child.close()
        self._answer()

    def _answer(self):
        try:
            if not self.conn.poll(60):
                raise AssertionError("the remote writer does not answer")
            reply = self.conn.recv()
        except (EOFError, OSError):
            self.proc.join(30)
            raise Died(self.proc.exitcode) from None
        if reply[0] == "ok":
            return reply[1]
        if reply[0] == "crash":
            raise AssertionError(f"the remote writer failed:\n{reply[1]}")
        _, name, message, attrs = reply
        exc = getattr(errors, name)(message)
        for k, v in attrs.items():
            setattr(exc, k, v)
        raise exc

    def call(self, cmd: str, *args):
        self.conn.send((cmd, args))
        return self._answer()

    def __getattr__(self, cmd: str):
        return functools.partial(self.call, cmd)

    def kill(self) -> None:
        if self.proc.is_alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(30)
        self.conn.close()

    def close(self) -> None:
        try:
            self.call("quit")
        except Died:
            pass
        self.proc.join(30)
        self.conn.close()


# ---- content ---------------------------------------------------------------------------------
def make_content(base: dict | None, seed: int, how: str, prefix: str = "") -> dict:
    """New buffers: a few changed pages of `base` (its buffers of this prefix), or fresh."""
    rng = random.Random(seed)
    names = (f"{prefix}a", f"{prefix}b")
    old = {n: (base or {}).get(n) for n in names}
    out = {}
    for n in names:
        data = old[n]
        if data is None or how == "fresh" or (how == "resize" and n.endswith("a")):
            out[n] = rng.randbytes(rng.choice((0, 100, 5000, 20_000, 33_333)))
            continue
        data = bytearray(data)
        for _ in range(rng.randint(0, 3)):
            if data:
                off = rng.randrange(len(data))
                size = min(len(data) - off, rng.randint(1, 3000))
                data[off:off + size] = rng.randbytes(size)
        out[n] = bytes(data)
    return out


class Model:
    def __init__(self) -> None:
        self.ckpts: dict[int, dict] = {}      # id -> {stream, seq, parent, contents, meta,
        #                                               tags, parts}
        self.seq: dict[str, int] = {}         # stream -> last seq (while it has checkpoints)
        self.groups: dict[str, dict] = {}     # gid -> {stream, parent, participants, staged
        #                                               {participant: (bufs, meta)}, owner}
        self.finished: list[str] = []       # gids committed, aborted or timed out
        self.max_id = 0

    def ids(self, stream=None) -> list[int]:
        return sorted(i for i, c in self.ckpts.items() if stream is None or c["stream"] == stream)

    def head(self, stream):
        ids = self.ids(stream)
        return ids[-1] if ids else None

    def busy(self, stream) -> bool:
        return any(g["stream"] == stream for g in self.groups.values())

    def group_parents(self) -> set:
        return {g["parent"] for g in self.groups.values()}

    def add(self, info: dict, contents: dict, stream: str, parent, meta, parts=None) -> None:
        assert info["id"] > self.max_id, f"id {info['id']} not above {self.max_id}"
        assert info["stream"] == stream and info["parent"] == parent, info
        assert info["seq"] == self.seq.get(stream, 0) + 1, (info, self.seq.get(stream))
        assert info["meta"] == meta and info["tags"] == [], info
        assert info["sizes"] == {n: len(v) for n, v in contents.items()}, info
        assert info["parts"] == (parts or {}), info
        self.max_id = info["id"]
        self.seq[stream] = info["seq"]
        self.ckpts[info["id"]] = {"stream": stream, "seq": info["seq"], "parent": parent,
                                  "contents": contents, "meta": meta, "tags": set(),
                                  "parts": parts or {}}

    def delete(self, cid: int) -> None:
        victim = self.ckpts.pop(cid)
        for c in self.ckpts.values():
            if c["parent"] == cid:
                c["parent"] = victim["parent"]
        if not self.ids(victim["stream"]):
            del self.seq[victim["stream"]]      # the stream is gone; a new one starts at 1

    def drop_groups_of(self, handle: str) -> None:
        for gid in [g for g, d in self.groups.items() if d["owner"] == handle]:
            del self.groups[gid]


# ---- the machine -------------------------------------------------------------------------------
class ManyWritersMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="snapstore-mw-")
        self.path = os.path.join(self.dir, "store")
        self.model = Model()
        self.handles: dict = {}
        self.failed = False
        self.step = 0
        self.versions: dict = {}      # (stream, stream_version) -> the ids it named

    @initialize()
    @guarded
    def setup(self):
        self.handles = {"h0": Ops(snapstore.open(self.path, **OPTS)),
                        "h1": Ops(snapstore.open(self.path, **OPTS)),
                        "r": Remote(self.path)}

    def teardown(self):
        try:
            if self.handles and not self.failed:
                rep = self.handles["h0"].store.verify(deep=True)
                assert rep["ok"], rep["problems"][:5]
                self.close_all()
                self.check_repair()
        finally:
            self.close_all()
            shutil.rmtree(self.dir, ignore_errors=True)

    def close_all(self) -> None:
        for name, h in list(self.handles.items()):
            if h is None:
                pass
            elif isinstance(h, Remote):
                h.kill() if self.failed else h.close()
            else:
                h.store.close()
            del self.handles[name]

    def check_repair(self) -> None:
        shutil.rmtree(os.path.join(self.path, "index"))
        rep = snapstore.repair(self.path)
        assert rep["ok"], rep["problems"][:5]
        with snapstore.open(self.path, **OPTS) as s:
            ops = Ops(s)
            self.compare(ops.view(), "repaired")
            for cid, c in self.model.ckpts.items():
                assert s.restore(cid) == c["contents"], f"repaired: {cid} restores wrong"
            assert s.verify(deep=True)["ok"]

    # ---- helpers ------------------------------------------------------------------------------
    def handle(self, h: str):
        """A handle; the other process is started again if it was killed and left dead (its
        open recovers what the dead one left)."""
        if self.handles[h] is None:
            self.handles[h] = Remote(self.path)
        return self.handles[h]

    def expect_choice(self, stream: str, kind: str, pick: int):
        """(expect argument, whether it is stale)."""
        head = self.model.head(stream)
        if kind == "any":
            return ANY, False
        if kind == "head":
            return head, False
        stale = [None] + [i for i in range(1, self.model.max_id + 2) if i != head]
        value = stale[pick % len(stale)]
        return value, value != head

    def parent_contents(self, stream: str) -> dict | None:
        head = self.model.head(stream)
        return self.model.ckpts[head]["contents"] if head else None

    def compare(self, view: dict, who: str) -> None:
        m = self.model
        got = {c["id"]: c for c in view["checkpoints"]}
        assert sorted(got) == m.ids(), f"{who}: checkpoints {sorted(got)} vs model {m.ids()}"
        for cid, c in m.ckpts.items():
            g = got[cid]
            want = (c["stream"], c["seq"], c["parent"], sorted(c["tags"]), c["meta"],
                    c["parts"])
            have = (g["stream"], g["seq"], g["parent"], g["tags"], g["meta"], g["parts"])
            assert have == want, f"{who}: checkpoint {cid} is {have}, model {want}"
        assert view["streams"] == sorted({c["stream"] for c in m.ckpts.values()}), who
        for stream in STREAMS:
            assert view["heads"][stream] == m.head(stream), f"{who}: head of {stream}"
            # stream_version: (head, seq, count), and one version is only ever one state
            ids = frozenset(cid for cid, c in m.ckpts.items() if c["stream"] == stream)
            version = view["versions"][stream]
            if not ids:
                assert version is None, f"{who}: version of empty {stream}: {version}"
                continue
            head = m.head(stream)
            assert (version[0], version[2]) == (head, len(ids)), f"{who}: {stream} {version}"
            assert version[1] >= m.ckpts[head]["seq"], f"{who}: {stream} seq {version}"
            known = self.versions.setdefault((stream, tuple(version)), ids)
            assert known == ids, f"{who}: version {version} of {stream} named {sorted(known)}, " \
                                 f"now {sorted(ids)}"

    # ---- rules ------------------------------------------------------------------------------
    @rule(h=st.sampled_from(HANDLES), stream=st.sampled_from(STREAMS),
          expect=st.sampled_from(["any", "any", "head", "stale"]), pick=st.integers(0, 50),
          seed=st.integers(0, 2 ** 32 - 1), how=st.sampled_from(["pages", "pages", "fresh",
                                                                  "resize"]))
    @guarded
    def checkpoint(self, h, stream, expect, pick, seed, how):
        m = self.model
        value, stale = self.expect_choice(stream, expect, pick)
        bufs = make_content(self.parent_contents(stream), seed, how)
        meta = {"seed": seed}
        if stale or m.busy(stream):
            with pytest.raises(CommitConflict) as exc:
                self.handle(h).checkpoint(stream, bufs, meta, value)
            if stale and not m.busy(stream):
                assert exc.value.expected == value and exc.value.found == m.head(stream)
            return
        info = self.handle(h).checkpoint(stream, bufs, meta, value)
        m.add(info, bufs, stream, m.head(stream), meta)
        assert self.handle(h).restore(info["id"]) == bufs

    @precondition(lambda self: self.model.ckpts)
    @rule(h=st.sampled_from(HANDLES), data=st.data())
    @guarded
    def delete(self, h, data):
        m = self.model
        cid = data.draw(st.sampled_from(m.ids()), label="delete")
        if cid in m.group_parents():
            with pytest.raises(CommitConflict):
                self.handle(h).delete(cid)
            return
        self.handle(h).delete(cid)
        m.delete(cid)

    @precondition(lambda self: self.model.ckpts)
    @rule(h=st.sampled_from(HANDLES), data=st.data(), tag=st.sampled_from(TAGS),
          add=st.booleans())
    @guarded
    def tag(self, h, data, tag, add):
        m = self.model
        cid = data.draw(st.sampled_from(m.ids()), label="tag")
        if cid in m.group_parents():
            with pytest.raises(CommitConflict):
                self.handle(h).tag(cid, tag, add)
            return
        self.handle(h).tag(cid, tag, add)
        tags = m.ckpts[cid]["tags"]
        tags.add(tag) if add else tags.discard(tag)

    @precondition(lambda self: len(self.model.groups) < 3)
    @rule(h=st.sampled_from(HANDLES), stream=st.sampled_from(STREAMS),
          n=st.integers(1, 3), expect=st.sampled_from(["any", "any", "head", "stale"]),
          pick=st.integers(0, 50))
    @guarded
    def open_group(self, h, stream, n, expect, pick):
        m = self.model
        value, stale = self.expect_choice(stream, expect, pick)
        participants = list(PARTICIPANTS[:n])
        if stale or m.busy(stream):
            with pytest.raises(CommitConflict):
                self.handle(h).group(stream, participants, value)
            return
        gid, parent = self.handle(h).group(stream, participants, value)
        assert parent == m.head(stream)
        m.groups[gid] = {"stream": stream, "parent": parent, "participants": participants,
                         "staged": {}, "owner": h}

    @precondition(lambda self: self.model.groups)
    @rule(h=st.sampled_from(HANDLES), data=st.data(), seed=st.integers(0, 2 ** 32 - 1),
          clash=st.integers(0, 9))
    @guarded
    def stage(self, h, data, seed, clash):
        m = self.model
        gid = data.draw(st.sampled_from(list(m.groups)), label="group")
        g = m.groups[gid]
        p = data.draw(st.sampled_from(g["participants"]), label="participant")
        base = self.parent_contents(g["stream"])
        bufs = make_content(base, seed, "pages", prefix=f"{p}/")
        others = [q for q in g["staged"] if q != p]
        if clash == 0 and others:       # a buffer name another participant staged
            bufs[f"{others[0]}/a"] = b"clash"
            with pytest.raises(GroupError):
                self.handle(h).stage(gid, p, bufs, {"p": p, "seed": seed})
            return
        self.handle(h).stage(gid, p, bufs, {"p": p, "seed": seed})
        g["staged"][p] = (bufs, {"p": p, "seed": seed})

    @precondition(lambda self: self.model.finished)
    @rule(h=st.sampled_from(HANDLES), data=st.data())
    @guarded
    def stage_into_finished_group(self, h, data):
        gid = data.draw(st.sampled_from(self.model.finished), label="finished group")
        with pytest.raises(GroupError):
            self.handle(h).stage(gid, PARTICIPANTS[0], {f"{PARTICIPANTS[0]}/a": b"late"}, None)

    @precondition(lambda self: len(self.model.ckpts) >= 2)
    @rule(h=st.sampled_from(HANDLES), data=st.data())
    @guarded
    def delete_many(self, h, data):
        """Two checkpoints in one call: all or none (none when one is a group's parent)."""
        m = self.model
        ids = data.draw(st.lists(st.sampled_from(m.ids()), min_size=2, max_size=2,
                                 unique=True), label="delete_many")
        if set(ids) & m.group_parents():
            with pytest.raises(CommitConflict):
                self.handle(h).delete_many(ids)
            return
        self.handle(h).delete_many(ids)
        for cid in ids:
            m.delete(cid)

    @precondition(lambda self: self.model.groups)
    @rule(data=st.data(), seed=st.integers(0, 1000))
    @guarded
    def commit_group(self, data, seed):
        self.commit(data.draw(st.sampled_from(list(self.model.groups)), label="group"), seed)

    def commit(self, gid: str, seed: int) -> None:
        m = self.model
        g = m.groups.pop(gid)
        m.finished.append(gid)
        owner = self.handle(g["owner"])
        missing = [p for p in g["participants"] if p not in g["staged"]]
        if missing:
            with pytest.raises(GroupTimeout) as exc:
                owner.commit(gid, {"c": seed}, 0.02)
            assert sorted(exc.value.missing) == sorted(missing)
            return
        info = owner.commit(gid, {"c": seed}, None)
        contents = {}
        for p in g["participants"]:
            contents.update(g["staged"][p][0])
        m.add(info, contents, g["stream"], g["parent"], {"c": seed},
              {p: g["staged"][p][1] for p in g["participants"]})
        assert owner.restore(info["id"]) == contents

    @precondition(lambda self: self.model.groups)
    @rule(data=st.data(), seed=st.integers(0, 2 ** 32 - 1))
    @guarded
    def complete_group(self, data, seed):
        """Every missing part staged, each from a handle of hypothesis' choice, then the
        group committed by its owner."""
        m = self.model
        gid = data.draw(st.sampled_from(list(m.groups)), label="group")
        g = m.groups[gid]
        base = self.parent_contents(g["stream"])
        for k, p in enumerate(g["participants"]):
            if p not in g["staged"]:
                h = data.draw(st.sampled_from(HANDLES), label=f"stager of {p}")
                bufs = make_content(base, seed + k, "pages", prefix=f"{p}/")
                self.handle(h).stage(gid, p, bufs, {"p": p, "seed": seed + k})
                g["staged"][p] = (bufs, {"p": p, "seed": seed + k})
        self.commit(gid, seed % 1000)

    @precondition(lambda self: self.model.groups)
    @rule(data=st.data())
    @guarded
    def abort_group(self, data):
        m = self.model
        gid = data.draw(st.sampled_from(list(m.groups)), label="group")
        g = m.groups.pop(gid)
        assert self.handle(g["owner"]).abort(gid) is True
        m.finished.append(gid)

    @rule(h=st.sampled_from(HANDLES), threshold=st.sampled_from([0.5, 0.9, 1.0]),
          shrink=st.sampled_from([None, None, None, True]))
    @guarded
    def compact(self, h, threshold, shrink):
        if self.handle(h).compact(threshold, shrink):
            # The index was replaced by a compacted copy: every Store, of any process, moves to
            # it at its next transaction (docs/design.md, "Noticing a replaced index";
            # RECHECK_SECONDS is 0 unless a test raises it).
            time.sleep(RECHECK_SECONDS * 1.5)

    @rule(h=st.sampled_from(("h0", "h1")))
    @guarded
    def reopen(self, h):
        self.handle(h).store.close()
        self.model.drop_groups_of(h)
        self.handles[h] = Ops(snapstore.open(self.path, **OPTS))

    @rule(respawn=st.booleans())
    @guarded
    def kill_remote(self, respawn):
        """SIGKILL the other process between operations. Its groups are gone: a writer that
        meets one of their claims recovers its log (or the next open does). Started again
        now, or when it is next used."""
        if self.handles["r"] is not None:
            self.handles["r"].kill()
        self.model.drop_groups_of("r")
        self.handles["r"] = Remote(self.path) if respawn else None

    @rule(point=st.sampled_from(COMMIT_POINTS), stream=st.sampled_from(STREAMS),
          seed=st.integers(0, 2 ** 32 - 1))
    @guarded
    def crash_remote(self, point, stream, seed):
        """The other process dies at a crash point inside a checkpoint; a new one recovers
        its log: the checkpoint is visible iff the process died past its commit record."""
        m = self.model
        if self.handles["r"] is not None:
            self.handles["r"].kill()
        m.drop_groups_of("r")
        if m.busy(stream):
            self.handles["r"] = Remote(self.path)
            return
        crashing = Remote(self.path, crash_at=f"{point}:1")
        bufs = make_content(self.parent_contents(stream), seed, "pages")
        meta = {"seed": seed, "crash": point}
        with pytest.raises(Died):
            crashing.checkpoint(stream, bufs, meta, ANY)
        crashing.kill()
        self.handles["r"] = Remote(self.path)
        view = self.handles["r"].view()
        new = [c for c in view["checkpoints"] if c["id"] not in m.ckpts]
        if point == "after_data_append":
            assert new == [], f"died at {point}, yet visible: {new}"
            return
        assert len(new) == 1, f"died at {point}: recovery published {new}"
        m.add(new[0], bufs, stream, m.head(stream), meta)
        assert self.handles["r"].restore(new[0]["id"]) == bufs

    @precondition(lambda self: set(self.model.ckpts) - self.model.group_parents())
    @rule(point=st.sampled_from(COMMIT_POINTS[1:]), data=st.data(), tag=st.booleans())
    @guarded
    def crash_remote_in_delete_or_tag(self, point, data, tag):
        """The other process dies at a crash point inside a delete (or a tag): past the
        record's append (there is no data to append first), so recovery applies it."""
        m = self.model
        if self.handles["r"] is not None:
            self.handles["r"].kill()
        m.drop_groups_of("r")
        cid = data.draw(st.sampled_from(sorted(set(m.ckpts) - m.group_parents())),
                        label="checkpoint")
        crashing = Remote(self.path, crash_at=f"{point}:1")
        with pytest.raises(Died):
            if tag:
                crashing.tag(cid, TAGS[0], TAGS[0] not in m.ckpts[cid]["tags"])
            else:
                crashing.delete(cid)
        crashing.kill()
        self.handles["r"] = Remote(self.path)
        if tag:
            m.ckpts[cid]["tags"] ^= {TAGS[0]}
        else:
            m.delete(cid)

    @rule(h=st.sampled_from(HANDLES), offset=st.integers(1, 5))
    @guarded
    def delete_unknown(self, h, offset):
        with pytest.raises(errors.CheckpointNotFound):
            self.handle(h).delete(self.model.max_id + offset)

    # ---- invariants ---------------------------------------------------------------------------
    @invariant()
    @guarded
    def views_match_model(self):
        if not self.handles:
            return
        for name, h in self.handles.items():
            if h is not None:
                self.compare(h.view(), name)
        self.step += 1
        h = self.handles[HANDLES[self.step % len(HANDLES)]] or self.handles["h0"]
        for cid, c in self.model.ckpts.items():
            assert h.restore(cid) == c["contents"], f"checkpoint {cid} restores wrong"


ManyWritersMachine.TestCase.settings = settings(
    max_examples=examples(20), stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
test_many_writers_against_model = ManyWritersMachine.TestCase
