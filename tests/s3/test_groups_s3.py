"""Group commits on S3 stores against a real server (SeaweedFS): Store.group / stage /
Group.commit / abort / status over a bucket, with participants in separate processes (each a
machine of its own: its own cache directory), crashes as real SIGKILLs, and races against
commits on the stream.

The boring cases first (empty and one-byte parts, the same participant twice, abort,
timeout), then what only the bucket has: parallel stagers in other processes, killed
participants and coordinators before and after the commit point, conflicts with the stream,
damaged parts, and page diffs that follow a participant from machine to machine.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

import snapstore
from snapstore.errors import CommitConflict, CorruptionError, GroupError, GroupTimeout
from snapstore.remote import layout

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CHILD = os.path.join(HERE, "group_child.py")


def rbytes(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture
def url(s3):
    return f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"


@pytest.fixture
def caches(tmp_path):
    """caches(name) -> a cache directory of its own (a machine)."""
    return lambda name: str(tmp_path / f"cache-{name}")


def open_store(url, cache, **kw):
    return snapstore.open(url, cache_dir=str(cache), **kw)


def spawn(*args, crash_at: str | None = None, kill_after_stage: bool = False):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SNAPSTORE_CRASH_AT", None)
    if crash_at:
        env["SNAPSTORE_CRASH_AT"] = crash_at
    if kill_after_stage:
        env["KILL_AFTER_STAGE"] = "1"
    return subprocess.Popen([sys.executable, CHILD, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def group_objects(s3) -> list:
    client = s3.client()
    listed = client.list_objects_v2(Bucket=s3.bucket, Prefix=s3.prefix + layout.GROUPS_DIR)
    return sorted(o["Key"][len(s3.prefix):] for o in listed.get("Contents", []))


# ---- the boring cases --------------------------------------------------------------------------
def test_parts_become_one_checkpoint_visible_only_at_commit(url, caches, s3):
    with open_store(url, caches("coord")) as coord, open_store(url, caches("other")) as other, \
            open_store(url, caches("reader"), readonly=True, refresh=0) as reader:
        g = coord.group("ops", ["a", "b", "empty", "one"], timeout=60)
        assert g.status()["missing"] == ["a", "b", "empty", "one"] and g.parent is None
        coord.stage(g.id, "a", {"a/state": rbytes(300_000, 1)}, meta={"offset": 10})
        other.stage(g.id, "b", {"b/state": rbytes(200_000, 2), "b/empty": b""},
                    meta={"offset": 20})
        other.stage(g.id, "empty", {})
        coord.stage(g.id, "one", {"one": b"\x01"})
        assert g.status()["staged"] == ["a", "b", "empty", "one"]
        assert g.status()["missing"] == []
        assert reader.checkpoints() == [] and reader.streams() == []    # nothing visible yet
        info = g.commit(meta={"epoch": 1})
        assert (info.stream, info.kind, info.seq, info.meta) == ("ops", "full", 1, {"epoch": 1})
        assert snapstore.group_parts(info) == {"a": {"offset": 10}, "b": {"offset": 20},
                                               "empty": None, "one": None}
        assert info.sizes == {"a/state": 300_000, "b/state": 200_000, "b/empty": 0, "one": 1}
        assert [c.id for c in reader.checkpoints()] == [info.id]
        assert reader.restore(info.id) == {"a/state": rbytes(300_000, 1),
                                           "b/state": rbytes(200_000, 2), "b/empty": b"",
                                           "one": b"\x01"}
        with pytest.raises(GroupError):
            g.status()                        # a committed group is gone
        with pytest.raises(GroupError):
            other.stage(g.id, "a", {"a/state": b"late"})
        assert g.abort() is False             # ... and stays committed
    # only the outcome (the group's tombstone, for gc) is left of the group
    assert group_objects(s3) == [layout.group_outcome_key(g.id)]


def test_non_dict_meta_and_only_empty_parts(url, caches):
    with open_store(url, caches("c")) as s:
        g = s.group("ops", 2)
        s.stage(g.id, "0", {})
        s.stage(g.id, "1", {})
        info = g.commit(meta=["not", "a", "dict"])
        assert info.meta == ["not", "a", "dict"] and info.sizes == {}
        assert snapstore.group_parts(info) == {"0": None, "1": None}
        assert s.restore(info.id) == {}


def test_the_same_participant_staged_twice_replaces_its_part(url, caches):
    base = rbytes(200_000, 1)
    first = bytearray(base)
    first[40960:40970] = b"first part"          # page 10 differs from what commits
    with open_store(url, caches("m1")) as m1, open_store(url, caches("m2")) as m2:
        g = m1.group("ops", ["a"])
        m1.stage(g.id, "a", {"a": first}, meta={"offset": 1})
        m2.stage(g.id, "a", {"a": base}, meta={"offset": 2})     # elsewhere, replacing it
        info = g.commit()
        assert m1.restore(info.id) == {"a": base}
        assert snapstore.group_parts(info) == {"a": {"offset": 2}}
        # m1's page fingerprints describe the part it staged, not the one committed: its
        # next part must not diff against them (page 10 would be taken as unchanged)
        changed = bytearray(first)
        changed[5000:5010] = b"0123456789"
        g = m1.group("ops", ["a"])
        m1.stage(g.id, "a", {"a": changed})
        second = g.commit()
        with open_store(url, caches("fresh")) as fresh:
            assert fresh.restore(second.id) == {"a": bytes(changed)}


def test_the_next_part_is_a_page_diff_on_each_machine(url, caches):
    state = {p: bytearray(rbytes(1 << 20, i)) for i, p in enumerate("ab")}
    with open_store(url, caches("m1")) as m1, open_store(url, caches("m2")) as m2:
        machines = {"a": m1, "b": m2}
        infos = []
        for epoch in range(3):
            for p in "ab":
                state[p][epoch * 8192 + 100] ^= 0xFF     # one page of each changes
            g = m1.group("ops", ["a", "b"])
            for p in "ab":
                machines[p].stage(g.id, p, {p: state[p]})
            infos.append(g.commit())
        assert infos[0].kind == "full" and infos[0].bytes_new > 2 << 20
        for info in infos[1:]:
            assert info.kind == "incremental" and info.bytes_new < 64 << 10, info
    with open_store(url, caches("fresh")) as fresh:
        assert fresh.restore(infos[-1].id) == {p: bytes(state[p]) for p in "ab"}


def test_abort_status_and_a_part_staged_after_abort(url, caches, s3):
    with open_store(url, caches("c")) as s, open_store(url, caches("o")) as o:
        g = s.group("ops", ["a", "b"])
        with pytest.raises(GroupError, match="not a participant"):
            s.stage(g.id, "z", {"z": b"x"})
        s.stage(g.id, "a", {"a": b"1"})
        assert g.abort() is True and g.abort() is False
        for call in (g.status, g.commit, lambda: o.stage(g.id, "b", {"b": b"late"})):
            with pytest.raises(GroupError):
                call()
        for bad in ("no-such-group", "0" * 32, "../x"):
            with pytest.raises(GroupError):
                s.stage(bad, "a", {"a": b"x"})
        assert s.checkpoints() == []
        assert group_objects(s3) == [layout.group_outcome_key(g.id)]


def test_a_part_whose_upload_races_the_abort_is_refused(url, caches, s3, monkeypatch):
    from snapstore.remote import parts
    with open_store(url, caches("c")) as s, open_store(url, caches("o")) as o:
        g = s.group("ops", ["a"])
        encode = parts.encode

        def abort_first(part):
            assert g.abort() is True          # the coordinator aborts while the part uploads
            return encode(part)
        monkeypatch.setattr(parts, "encode", abort_first)
        with pytest.raises(GroupError, match="aborted"):
            o.stage(g.id, "a", {"a": b"too late"})
        assert group_objects(s3) == [layout.group_outcome_key(g.id)]    # the part went too


def test_a_part_staged_again_after_the_commit_collected_the_parts_fails_it(url, caches, s3,
                                                                          monkeypatch):
    """The stage lands while the coordinator is between reading the parts and creating the
    outcome: it finds no outcome and succeeds, so the commit (which read the old part) must
    not publish: it re-reads the parts' etags after creating its outcome."""
    from snapstore.remote import groups
    with open_store(url, caches("c")) as s, open_store(url, caches("a")) as a:
        g = s.group("ops", ["a", "b"])
        a.stage(g.id, "a", {"a": b"OLD" * 1000}, meta={"offset": 1})
        s.stage(g.id, "b", {"b": b"other"})
        combine, staged = groups.combine_parts, []

        def stage_again_first(*args, **kw):
            if not staged:          # the coordinator holds both parts, decided nothing yet
                a.stage(g.id, "a", {"a": b"NEW" * 1000}, meta={"offset": 2})
                staged.append(True)
            return combine(*args, **kw)
        monkeypatch.setattr(groups, "combine_parts", stage_again_first)
        with pytest.raises(GroupError, match="'a' staged again"):
            g.commit()
        assert staged
        assert s.checkpoints() == [] and a.checkpoints() == []
        s.refresh()
        assert s.streams() == []
        for call in (g.status, g.commit, lambda: a.stage(g.id, "a", {"a": b"later"})):
            with pytest.raises(GroupError, match="aborted"):
                call()
        assert group_objects(s3) == [layout.group_outcome_key(g.id)]


def test_a_part_staged_again_after_the_commit_decided_is_refused(url, caches, monkeypatch):
    """The stage passes its checks, then the whole commit runs (it collects the old part),
    then the stage's PUT lands: the outcome lists another etag for its part, so the stager
    hears GroupError and the checkpoint holds the part staged before."""
    from snapstore.remote import parts
    with open_store(url, caches("c")) as s, open_store(url, caches("a")) as a:
        g = s.group("ops", ["a"])
        a.stage(g.id, "a", {"a": b"OLD" * 1000}, meta={"offset": 1})
        encode, infos = parts.encode, []

        def commit_first(part):
            if not infos:
                infos.append(g.commit())
            return encode(part)
        monkeypatch.setattr(parts, "encode", commit_first)
        with pytest.raises(GroupError, match="overtaken"):
            a.stage(g.id, "a", {"a": b"NEW" * 1000}, meta={"offset": 2})
        assert snapstore.group_parts(infos[0]) == {"a": {"offset": 1}}
        with open_store(url, caches("fresh")) as fresh:
            assert fresh.restore("ops") == {"a": b"OLD" * 1000}


def test_a_part_landing_between_the_decision_and_the_commit_point_fails_both(url, caches, s3,
                                                                             monkeypatch):
    """The stage's PUT lands after the coordinator created the outcome "commit" (with the old
    part's etag), before the coordinator re-read the parts: the coordinator sees the new
    etag and aborts, and the stager (reading the outcome after its PUT) hears GroupError."""
    from snapstore.remote import groups, parts
    with open_store(url, caches("c")) as s, open_store(url, caches("a")) as a:
        g = s.group("ops", ["a"])
        a.stage(g.id, "a", {"a": b"OLD" * 1000})
        checked, decided = threading.Event(), threading.Event()
        put, released = threading.Event(), threading.Event()
        decide, read_outcome, encode = groups._decide, groups.read_outcome, parts.encode
        stager = {}

        def decide_then_wait(c, group, outcome):
            found = decide(c, group, outcome)
            if outcome["outcome"] == "commit":
                decided.set()
                assert put.wait(60)             # the stager's PUT has landed
            return found

        def encode_after_decision(part):
            checked.set()                       # the stager read the header and no outcome
            assert decided.wait(60)
            return encode(part)

        def read_after_put(c, group):
            if threading.current_thread() is stager.get("thread") and decided.is_set():
                put.set()
                assert released.wait(60)        # until the coordinator is done
            return read_outcome(c, group)

        def stage_again():
            try:
                a.stage(g.id, "a", {"a": b"NEW" * 1000})
            except BaseException as exc:        # noqa: BLE001 - the test reads it
                stager["error"] = exc
                checked.set()

        monkeypatch.setattr(groups, "_decide", decide_then_wait)
        monkeypatch.setattr(parts, "encode", encode_after_decision)
        monkeypatch.setattr(groups, "read_outcome", read_after_put)
        stager["thread"] = threading.Thread(target=stage_again)
        stager["thread"].start()
        try:
            assert checked.wait(60)
            with pytest.raises(GroupError, match="'a' staged again"):
                g.commit()
        finally:
            checked.set(), decided.set(), put.set(), released.set()
            stager["thread"].join(60)
        assert isinstance(stager.get("error"), GroupError), stager
        assert "aborted" in str(stager["error"])
        s.refresh()
        assert s.checkpoints() == [] and s.streams() == []
        assert group_objects(s3) == [layout.group_outcome_key(g.id)]


def test_timeout_names_the_missing_participants_and_nothing_is_visible(url, caches):
    with open_store(url, caches("c")) as s:
        g = s.group("ops", ["a", "b", "c"], timeout=60)
        s.stage(g.id, "b", {"b": b"bytes"})
        t0 = time.monotonic()
        with pytest.raises(GroupTimeout) as exc:
            g.commit(timeout=0.3)
        assert 0.25 <= time.monotonic() - t0 < 10
        assert exc.value.missing == ("a", "c") and exc.value.group == g.id
        assert "'a', 'c'" in str(exc.value)
        assert s.checkpoints() == []
        with pytest.raises(GroupError):            # aborted
            s.stage(g.id, "a", {"a": b"late"})
        s.checkpoint({"x": b"free again"}, stream="ops")


def test_the_deadline_refuses_stages_and_commits_after_it(url, caches):
    with open_store(url, caches("c")) as s:
        g = s.group("ops", ["a"], timeout=0.2)
        time.sleep(0.3)
        with pytest.raises(GroupError, match="timed out"):
            s.stage(g.id, "a", {"a": b"x"})
        with pytest.raises(GroupTimeout) as exc:
            g.commit()
        assert exc.value.missing == ("a",)
        s.checkpoint({"x": b"y"}, stream="ops")


def test_buffer_names_must_be_distinct_across_parts(url, caches):
    with open_store(url, caches("c")) as s:
        g = s.group("ops", ["a", "b"])
        s.stage(g.id, "a", {"same": b"1"})
        s.stage(g.id, "b", {"same": b"2"})
        with pytest.raises(GroupError, match="distinct"):
            g.commit()
        s.stage(g.id, "b", {"other": b"2"})         # the group is still open: fix and commit
        info = g.commit()
        assert s.restore(info.id) == {"same": b"1", "other": b"2"}


def test_a_damaged_part_is_corruption(url, caches, s3):
    with open_store(url, caches("c")) as s:
        g = s.group("ops", ["a"])
        s.stage(g.id, "a", {"a": rbytes(100_000, 3)})
        client = s3.client()
        key = s3.prefix + layout.group_part_key(g.id, "a")
        data = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
        data[len(data) // 2] ^= 1
        client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(data))
        with pytest.raises(CorruptionError, match="group part"):
            g.commit()
        assert s.checkpoints() == []


# ---- conflicts with the stream -------------------------------------------------------------------
def test_a_checkpoint_committed_on_the_stream_meanwhile_conflicts(url, caches):
    with open_store(url, caches("c")) as s, open_store(url, caches("o")) as o:
        base = s.checkpoint({"x": b"0"}, stream="ops")
        g = s.group("ops", ["a"])
        assert g.parent == base.id
        s.stage(g.id, "a", {"a": b"part"})
        moved = o.checkpoint({"x": b"1"}, stream="ops")
        with pytest.raises(CommitConflict) as exc:
            g.commit()
        assert exc.value.stream == "ops" and exc.value.found == moved.id
        with pytest.raises(GroupError):
            g.commit()                         # the conflict aborted it
        s.refresh()
        assert [c.id for c in s.checkpoints("ops")] == [base.id, moved.id]
        # a stager meets the moved stream at once
        g = s.group("ops", ["a"])
        o.checkpoint({"x": b"2"}, stream="ops")
        with pytest.raises(CommitConflict):
            s.stage(g.id, "a", {"a": b"part"})


def test_the_ref_moving_just_before_the_commit_point_conflicts(url, caches, monkeypatch):
    from snapstore.remote import refs
    with open_store(url, caches("c")) as s, open_store(url, caches("o")) as o:
        s.checkpoint({"x": b"0"}, stream="ops")
        g = s.group("ops", ["a"])
        s.stage(g.id, "a", {"a": b"part"})
        real_write, raced = refs.write, []

        def write_after_other(client, old, new):
            if new.writer == s._committer.writer_id and not raced:
                raced.append(o.checkpoint({"x": b"other"}, stream="ops"))
            return real_write(client, old, new)
        monkeypatch.setattr(refs, "write", write_after_other)
        with pytest.raises(CommitConflict) as exc:
            g.commit()
        assert exc.value.found == raced[0].id
        s.refresh()
        assert s.restore("ops") == {"x": b"other"}


def test_tags_and_deletes_of_older_checkpoints_commute_with_a_group(url, caches):
    with open_store(url, caches("c")) as s, open_store(url, caches("o")) as o:
        old = s.checkpoint({"x": b"0"}, stream="ops")
        head = s.checkpoint({"x": b"1"}, stream="ops")
        g = s.group("ops", ["a"])
        s.stage(g.id, "a", {"a": b"part"})
        o.refresh()
        o.tag(head.id, "keep")
        o.delete(old.id)
        info = g.commit()
        assert info.parent == head.id and info.seq == 3
        with open_store(url, caches("fresh")) as fresh:
            assert [c.id for c in fresh.checkpoints("ops")] == [head.id, info.id]
            assert fresh.get("keep").id == head.id
            assert fresh.restore(info.id) == {"a": b"part"}


# ---- processes ----------------------------------------------------------------------------------
def test_participants_in_processes_stage_in_parallel(url, caches):
    names = ["p0", "p1", "p2"]
    with open_store(url, caches("coord")) as s:
        g = s.group("ops", names, timeout=120)
        procs = [spawn("stage", url, caches(p), g.id, p, i, 400_000, json.dumps({"offset": i}))
                 for i, p in enumerate(names)]
        info = g.commit(meta={"epoch": 1})        # waits for the parts as they come
        for proc in procs:
            code, out, err = finish(proc)
            assert code == 0 and out.strip() == "staged", err
        assert snapstore.group_parts(info) == {p: {"offset": i} for i, p in enumerate(names)}
    with open_store(url, caches("fresh")) as fresh:
        assert fresh.restore(info.id) == {f"{p}/state": rbytes(400_000, i)
                                          for i, p in enumerate(names)}


def test_operator_state_and_source_offsets_resume(url, caches):
    """A stream processor: the source, a window operator and the sink checkpoint their state
    and source offsets as one group per epoch; after a crash of everything, a new machine
    resumes from the last epoch: every operator's state and offsets, consistent."""
    operators = {"source": {"offset": 0}, "window": {"sum": 0}, "sink": {"written": 0}}
    window = bytearray(64 << 10)
    with open_store(url, caches("job")) as s:
        for epoch in range(1, 4):
            operators["source"]["offset"] += 100
            operators["window"]["sum"] += epoch
            operators["sink"]["written"] += 100
            window[epoch * 4096] = epoch
            g = s.group("ops", list(operators))
            s.stage(g.id, "source", {}, meta=dict(operators["source"]))
            s.stage(g.id, "window", {"window/panes": window}, meta=dict(operators["window"]))
            s.stage(g.id, "sink", {}, meta=dict(operators["sink"]))
            g.commit(meta={"epoch": epoch})
        g = s.group("ops", list(operators))           # epoch 4 never commits
        s.stage(g.id, "source", {}, meta={"offset": 999})
    with open_store(url, caches("restart")) as r:
        last = r.latest("ops")
        assert last.meta == {"epoch": 3}
        offsets = snapstore.group_parts(last)
        assert offsets == {"source": {"offset": 300}, "window": {"sum": 6},
                           "sink": {"written": 300}}
        assert r.restore(last.id) == {"window/panes": bytes(window)}


def test_a_participant_killed_before_staging_times_out_naming_it(url, caches):
    with open_store(url, caches("coord")) as s:
        g = s.group("ops", ["a", "b"], timeout=60)
        proc = spawn("stage", url, caches("b"), g.id, "b", 2, 100_000,
                     crash_at="before_group_part")    # uploaded its chunks, never its part
        s.stage(g.id, "a", {"a/state": b"mine"})
        code, _, err = finish(proc)
        assert code == -signal.SIGKILL, err
        with pytest.raises(GroupTimeout) as exc:
            g.commit(timeout=0.5)
        assert exc.value.missing == ("b",)
        assert s.checkpoints() == []


def test_a_participant_killed_after_staging_has_done_its_part(url, caches):
    with open_store(url, caches("coord")) as s:
        g = s.group("ops", ["a", "b"], timeout=60)
        proc = spawn("stage", url, caches("b"), g.id, "b", 2, 100_000, '{"offset": 7}',
                     kill_after_stage=True)
        code, out, err = finish(proc)
        assert code == -signal.SIGKILL and out.strip() == "staged", err
        s.stage(g.id, "a", {"a/state": b"mine"})
        info = g.commit()
        assert snapstore.group_parts(info) == {"a": None, "b": {"offset": 7}}
    with open_store(url, caches("fresh")) as fresh:
        assert fresh.restore(info.id) == {"a/state": b"mine", "b/state": rbytes(100_000, 2)}


def test_a_coordinator_killed_before_the_ref_write_leaves_nothing_visible(url, caches, s3):
    code, out, err = finish(spawn("coordinate", url, caches("coord"), "ops", 5, 50_000,
                                  crash_at="before_group_ref"))
    assert code == -signal.SIGKILL, err
    gid = out.split()[0]
    with open_store(url, caches("fresh")) as s:
        assert s.checkpoints() == [] and s.streams() == []
        # the group is garbage: decided ("commit"), never committed, never to commit
        assert layout.group_header_key(gid) in group_objects(s3)
        with pytest.raises(GroupError):
            s.stage(gid, "a", {"a/state": b"late"})
        info = s.checkpoint({"x": b"the stream is free"}, stream="ops")
        assert info.seq == 1


def test_a_coordinator_killed_after_the_ref_write_is_committed(url, caches):
    with open_store(url, caches("before"), refresh=3600) as early:
        code, out, err = finish(spawn("coordinate", url, caches("coord"), "ops", 5, 50_000,
                                      crash_at="after_group_ref"))
        assert code == -signal.SIGKILL, err
        want = {"a/state": rbytes(50_000, 5), "b/state": rbytes(50_000, 6)}
        assert early.checkpoints() == []            # not pulled yet
        early.refresh()                             # the next pull sees it
        info = early.latest("ops")
        assert early.restore(info.id) == want
    with open_store(url, caches("fresh")) as s:     # and the next open
        info = s.latest("ops")
        assert s.restore(info.id) == want
        assert snapstore.group_parts(info) == {"a": {"offset": 5}, "b": {"offset": 6}}
