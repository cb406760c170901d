"""Group commits (issue 16): one checkpoint from many participants, through the public API
(Store.group, Store.stage, Group.commit / abort / status, snapstore.group_parts). Participants
in other processes are real processes; crashes are real SIGKILLs."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import snapstore
from snapstore.errors import (CommitConflict, ForkedStoreError, GroupError, GroupTimeout,
                              InvalidArgumentError, InvalidArgumentTypeError, StoreClosedError)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rbytes(n: int, seed: int) -> bytes:
    import random
    return random.Random(seed).randbytes(n)


def run_child(code: str, *args: str, crash_at: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SNAPSTORE_CRASH_AT", None)
    if crash_at:
        env["SNAPSTORE_CRASH_AT"] = crash_at
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "store")


def test_parts_become_one_checkpoint_visible_only_at_commit(path):
    with snapstore.open(path) as coord, snapstore.open(path) as other, \
            snapstore.open(path, readonly=True) as reader:
        g = coord.group("ops", ["a", "b"], timeout=30)
        assert g.status()["missing"] == ["a", "b"] and g.parent is None
        coord.stage(g.id, "a", {"a/state": rbytes(70_000, 1)}, meta={"offset": 10})
        other.stage(g.id, "b", {"b/state": rbytes(50_000, 2), "b/empty": b""},
                    meta={"offset": 20})
        assert g.status()["staged"] == ["a", "b"] and g.status()["missing"] == []
        assert reader.checkpoints() == [] and reader.streams() == []    # nothing visible yet
        info = g.commit(meta={"epoch": 1})
        assert info.stream == "ops" and info.kind == "full" and info.seq == 1
        assert info.meta == {"epoch": 1}
        assert snapstore.group_parts(info) == {"a": {"offset": 10}, "b": {"offset": 20}}
        assert info.sizes == {"a/state": 70_000, "b/state": 50_000, "b/empty": 0}
        assert reader.restore(info.id) == {"a/state": rbytes(70_000, 1),
                                           "b/state": rbytes(50_000, 2), "b/empty": b""}
        assert coord.verify(deep=True)["ok"]
        with pytest.raises(GroupError):
            g.status()                        # a committed group is gone
        with pytest.raises(GroupError):
            other.stage(g.id, "a", {"a/state": b"late"})


def test_second_group_is_incremental_against_the_first(path):
    a = bytearray(rbytes(1 << 20, 3))
    with snapstore.open(path) as s:
        g = s.group("ops", ["a"])
        s.stage(g.id, "a", {"a": a})
        first = g.commit()
        a[4096:4096 + 100] = b"x" * 100
        g = s.group("ops", ["a"])
        assert g.parent == first.id
        s.stage(g.id, "a", {"a": a})
        second = g.commit()
        assert second.kind == "incremental" and second.parent == first.id
        assert second.bytes_new < 16 << 10       # one page changed
        assert s.restore(second.id) == {"a": bytes(a)}


def test_non_dict_meta_and_one_byte_part(path):
    with snapstore.open(path) as s:
        g = s.group("ops", 1)
        s.stage(g.id, "0", {"x": b"1"})
        info = g.commit(meta=["not", "a", "dict"])
        assert info.meta == ["not", "a", "dict"]
        assert snapstore.group_parts(info) == {"0": None}
        assert s.restore(info.id) == {"x": b"1"}


def _nested(levels: int):
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_a_part_meta_that_its_commit_would_nest_too_deep_is_refused_at_the_stage(path,
                                                                                 tmp_path):
    """A part's meta whose reserved keys nested 106 levels passed stage() (only the user's
    part was measured), and the group committed; then no copy or import of the checkpoint
    could take its meta (the commit nests each part's meta 3 levels deeper)."""
    with snapstore.open(path) as s:
        g = s.group("ops", ["a"])
        with pytest.raises(InvalidArgumentTypeError, match="nests more than 100"):
            s.stage(g.id, "a", {"x": b"1"}, meta={"snapstore.x": _nested(106)})
        deepest = {"snapstore.x": _nested(99)}          # 100 levels with its dict
        s.stage(g.id, "a", {"x": b"1"}, meta=deepest)
        info = g.commit()
        assert snapstore.group_parts(info) == {"a": deepest}
        with snapstore.open(str(tmp_path / "copy")) as dst:
            snapstore.copy_checkpoints(s, dst)
            assert snapstore.group_parts(dst.latest("ops")) == {"a": deepest}


@pytest.mark.parametrize("meta", [None, {}, {"step": 3}, 0, ""])
def test_a_group_checkpoints_meta_is_the_meta_given(path, meta):
    """Regression: a group committed with no meta had info.meta == {} where a plain
    checkpoint has None, against the README's "info.meta is the meta you passed"."""
    with snapstore.open(path) as s:
        g = s.group("ops", ["a"])
        s.stage(g.id, "a", {"x": b"1"})
        info = g.commit(meta=meta)
        assert info.meta == meta and type(info.meta) is type(meta)
        assert s.get(info.id).meta == meta
        assert snapstore.group_parts(info) == {"a": None}
    with snapstore.open(path) as s:
        assert s.get(info.id).meta == meta


def test_timeout_names_the_missing_participants_and_nothing_is_visible(path):
    with snapstore.open(path) as s:
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
        s.checkpoint({"x": b"free again"}, stream="ops")    # the stream is free


def test_deadline_refuses_stages_and_commits_after_it(path):
    with snapstore.open(path) as s:
        g = s.group("ops", ["a"], timeout=0.2)
        time.sleep(0.3)
        with pytest.raises(GroupError, match="timed out"):
            s.stage(g.id, "a", {"a": b"x"})
        with pytest.raises(GroupTimeout):
            g.commit()
        s.checkpoint({"x": b"y"}, stream="ops")    # an expired group blocks nobody


def test_abort_status_and_stage_errors(path):
    with snapstore.open(path) as s:
        g = s.group("ops", ["a", "b"])
        with pytest.raises(GroupError, match="not a participant"):
            s.stage(g.id, "z", {"z": b"x"})
        s.stage(g.id, "a", {"same": b"1"})
        with pytest.raises(GroupError, match="distinct"):
            s.stage(g.id, "b", {"same": b"2"})
        s.stage(g.id, "a", {"a2": b"replaced"})       # staging again replaces the part
        s.stage(g.id, "b", {"same": b"2"})             # the name is free now
        assert g.abort() is True and g.abort() is False
        with pytest.raises(GroupError):
            g.status()
        with pytest.raises(GroupError):
            g.commit()
        with pytest.raises(GroupError):
            s.stage("no-such-group", "a", {"a": b"x"})
        assert s.checkpoints() == []
        assert s.verify(deep=True)["ok"]


def test_restaged_part_is_what_commits(path):
    with snapstore.open(path) as s:
        g = s.group("ops", ["a"])
        s.stage(g.id, "a", {"a": b"first"}, meta={"offset": 1})
        s.stage(g.id, "a", {"a": b"second"}, meta={"offset": 2})
        info = g.commit()
        assert s.restore(info.id) == {"a": b"second"}
        assert snapstore.group_parts(info) == {"a": {"offset": 2}}


@pytest.mark.parametrize("participants, error", [
    ([], InvalidArgumentError), (0, InvalidArgumentError), (["a", "a"], InvalidArgumentError),
    ("ab", InvalidArgumentTypeError), ([""], InvalidArgumentError), ([1], InvalidArgumentTypeError),
    (None, InvalidArgumentTypeError), (1 << 40, InvalidArgumentError),
    ((str(i) for i in range(1 << 40)), InvalidArgumentError)])
def test_bad_participants(path, participants, error):
    """(A count of 2**40 used to build its list of names: a hang, then memory exhaustion.)"""
    with snapstore.open(path) as s:
        with pytest.raises(error):
            s.group("ops", participants)
        assert s.checkpoints() == []


@pytest.mark.parametrize("timeout", [0, -1, float("inf"), float("nan"), "1", True])
def test_bad_timeouts(path, timeout):
    with snapstore.open(path) as s:
        with pytest.raises(InvalidArgumentError):
            s.group("ops", ["a"], timeout=timeout)


def test_bad_stage_arguments(path):
    with snapstore.open(path) as s:
        g = s.group("ops", ["a"])
        with pytest.raises(InvalidArgumentTypeError):
            s.stage(None, "a", {"a": b"x"})
        with pytest.raises(InvalidArgumentError):
            s.stage(g.id, "", {"a": b"x"})
        with pytest.raises((InvalidArgumentError, TypeError)):
            s.stage(g.id, "a", {"a": object()})
        with pytest.raises(InvalidArgumentError):
            s.stage(g.id, "a", {"a": b"x"}, meta={"x": object()})
        assert g.status()["staged"] == []


def test_group_reserves_its_stream(path):
    with snapstore.open(path) as s, snapstore.open(path) as other:
        base = s.checkpoint({"x": b"0"}, stream="ops")
        g = s.group("ops", ["a"])
        with pytest.raises(CommitConflict) as exc:
            other.checkpoint({"x": b"1"}, stream="ops")
        assert exc.value.stream == "ops" and "group" in str(exc.value)
        with pytest.raises(CommitConflict):
            other.group("ops", ["b"])              # one group per stream at a time
        with pytest.raises(CommitConflict):
            other.delete(base.id)                  # the group builds on it
        other.checkpoint({"x": b"1"}, stream="elsewhere")     # other streams go on
        s.stage(g.id, "a", {"a": b"part"})
        info = g.commit()
        assert info.parent == base.id
        other.checkpoint({"x": b"2"}, stream="ops")           # free again


def test_expect_head_of_a_group(path):
    with snapstore.open(path) as s:
        base = s.checkpoint({"x": b"0"}, stream="ops")
        with pytest.raises(CommitConflict):
            s.group("ops", ["a"], expect_head=None)
        with pytest.raises(CommitConflict):
            s.group("ops", ["a"], expect_head=base.id + 100)
        g = s.group("ops", ["a"], expect_head=base.id)
        g.abort()


def test_closing_the_coordinator_drops_its_group(path):
    with snapstore.open(path) as other:
        s = snapstore.open(path)
        g = s.group("ops", ["a"])
        other.stage(g.id, "a", {"a": b"x"})
        s.close()
        with pytest.raises(GroupError):
            other.stage(g.id, "a", {"a": b"y"})
        other.checkpoint({"x": b"1"}, stream="ops")
        with pytest.raises(StoreClosedError):
            g.commit()


def test_after_close_and_in_a_forked_child(path):
    s = snapstore.open(path)
    g = s.group("ops", ["a"])
    pid = os.fork()
    if pid == 0:                                   # the child: the parent's Store is off limits
        code = 0
        for call in (lambda: s.stage(g.id, "a", {"a": b"x"}), g.commit, g.abort,
                     lambda: s.group("x", ["a"])):
            try:
                call()
                code = 1
            except ForkedStoreError:
                pass
            except BaseException:
                code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    s.stage(g.id, "a", {"a": b"still works"})      # the parent's group is untouched
    assert s.restore(g.commit().id) == {"a": b"still works"}
    s.close()
    with pytest.raises(StoreClosedError):
        s.group("ops", ["a"])
    with pytest.raises(StoreClosedError):
        s.stage("x", "a", {"a": b"x"})


STAGE_AND_DIE = r"""
import os, signal, sys, snapstore
s = snapstore.open(sys.argv[1])
s.stage(sys.argv[2], sys.argv[3], {sys.argv[3]: b"from a process that dies" * 100},
        meta={"offset": 7})
os.kill(os.getpid(), signal.SIGKILL)
"""

OPEN_STAGE_AND_DIE = r"""
import os, signal, sys, snapstore
s = snapstore.open(sys.argv[1])
g = s.group("ops", ["a", "b"])
s.stage(g.id, "a", {"a": b"coordinator part" * 100})
print(g.id, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""

COORDINATE = r"""
import sys, snapstore
s = snapstore.open(sys.argv[1])
g = s.group("ops", ["a"])
s.stage(g.id, "a", {"a": b"all of it" * 1000}, meta={"offset": 99})
g.commit(meta={"epoch": 5})
print("committed", flush=True)
"""


def test_a_participant_killed_after_staging_has_done_its_part(path):
    with snapstore.open(path) as s:
        g = s.group("ops", ["a", "b"])
        p = run_child(STAGE_AND_DIE, path, g.id, "b")
        assert p.returncode == -signal.SIGKILL, p.stderr
        s.stage(g.id, "a", {"a": b"mine"})
        info = g.commit()
        assert s.restore(info.id)["b"] == b"from a process that dies" * 100
        assert snapstore.group_parts(info)["b"] == {"offset": 7}
        assert s.verify(deep=True)["ok"]


def test_a_killed_coordinators_group_is_dropped_by_the_next_writer(path):
    p = run_child(OPEN_STAGE_AND_DIE, path)
    assert p.returncode == -signal.SIGKILL, p.stderr
    group_id = p.stdout.strip()
    with snapstore.open(path) as s:            # recovers the dead coordinator's log
        with pytest.raises(GroupError):
            s.stage(group_id, "b", {"b": b"late"})
        assert s.checkpoints() == []
        s.checkpoint({"x": b"free"}, stream="ops")
        s.compact()
        assert s.verify(deep=True)["ok"]


def test_a_killed_coordinator_blocks_a_live_writer_only_until_it_meets_the_claim(path):
    with snapstore.open(path) as s:            # open BEFORE the coordinator dies
        p = run_child(OPEN_STAGE_AND_DIE, path)
        assert p.returncode == -signal.SIGKILL, p.stderr
        info = s.checkpoint({"x": b"goes through"}, stream="ops")   # recovers the dead log
        assert info.seq == 1


@pytest.mark.parametrize("point", ["after_commit_append", "after_fsync", "before_index_commit",
                                   "after_index_commit"])
def test_a_coordinator_killed_in_its_commit(path, point):
    p = run_child(COORDINATE, path, crash_at=point)
    assert p.returncode == -signal.SIGKILL, p.stderr
    with snapstore.open(path) as s:
        infos = s.checkpoints("ops")
        if point == "after_commit_append":
            # durable only when synced: a process kill keeps the page cache, so it is there
            assert len(infos) in (0, 1)
        else:
            assert len(infos) == 1
        for info in infos:                     # whole or nothing
            assert s.restore(info.id) == {"a": b"all of it" * 1000}
            assert snapstore.group_parts(info) == {"a": {"offset": 99}}
            assert info.meta == {"epoch": 5}
        assert s.verify(deep=True)["ok"]
        s.checkpoint({"x": b"next"}, stream="ops")


def test_compaction_while_a_group_is_staged_keeps_its_parts(path):
    junk = rbytes(300_000, 9)
    with snapstore.open(path, segment_size=1 << 16) as s, \
            snapstore.open(path, segment_size=1 << 16) as other:
        dead = s.checkpoint({"j": junk}, stream="junk")
        g = s.group("ops", ["a", "b"])
        other.stage(g.id, "a", {"a": junk})               # reuses the junk's chunks
        other.stage(g.id, "b", {"b": rbytes(200_000, 10)})
        s.delete(dead.id)                                 # the chunks' only reference goes
        for _ in range(2):
            rep = other.compact(threshold=1.0, max_garbage=0)   # GC + rewrite what it can
        info = g.commit()
        assert s.restore(info.id) == {"a": junk, "b": rbytes(200_000, 10)}
        assert rep["segments_removed"] >= 0
        assert s.verify(deep=True)["ok"]
        s.compact(threshold=1.0, max_garbage=0)
        assert s.restore(info.id) == {"a": junk, "b": rbytes(200_000, 10)}
        assert s.verify(deep=True)["ok"]


def test_aborted_parts_become_garbage_compaction_collects(path):
    with snapstore.open(path, segment_size=1 << 16) as s:
        keep = s.checkpoint({"k": b"keep"}, stream="k")
        g = s.group("ops", ["a"])
        s.stage(g.id, "a", {"a": rbytes(500_000, 11)})
        before = s.stats()["segment_bytes"]
        g.abort()
        rep = s.compact(threshold=1.0, max_garbage=0)
        assert rep["bytes_after"] < before - 400_000, rep
        assert s.restore(keep.id) == {"k": b"keep"}
        assert s.verify(deep=True)["ok"]


def test_repair_rebuilds_group_checkpoints(path):
    with snapstore.open(path) as s, snapstore.open(path) as other:
        g = s.group("ops", ["a", "b"])
        s.stage(g.id, "a", {"a": b"A" * 10_000})
        other.stage(g.id, "b", {"b": b"B" * 10_000}, meta={"offset": 3})
        info = g.commit()
    import shutil
    shutil.rmtree(os.path.join(path, "index"))
    assert snapstore.repair(path)["ok"]
    with snapstore.open(path, readonly=True) as r:
        again = r.get(info.id)
        assert r.restore(info.id) == {"a": b"A" * 10_000, "b": b"B" * 10_000}
        assert snapstore.group_parts(again) == {"a": None, "b": {"offset": 3}}


def test_a_part_staged_again_during_the_commit_is_never_lost(path, monkeypatch):
    """Regression: a participant staging again after the coordinator collected the parts
    replaced the part entry; a compaction then removed the old part's segments and the commit
    published the old part's chunks: an acknowledged checkpoint that could not be restored.
    The commit now checks, in its publishing transaction, that the parts are the ones it
    combined (GroupError, nothing committed); committing again takes the new part."""
    from snapstore.engine import groups
    coordinator = snapstore.open(path, segment_size=1 << 16)
    participant = snapstore.open(path, segment_size=1 << 16)
    compactor = snapstore.open(path, segment_size=1 << 16)
    old, new = rbytes(400_000, 1), rbytes(1000, 2)
    g = coordinator.group("ops", ["a"])
    participant.stage(g.id, "a", {"a": old})
    real = groups.wait_for_parts

    def collected_then_restaged(c, group, timeout):
        found = real(c, group, timeout)
        participant.stage(g.id, "a", {"a": new})
        participant.checkpoint({"f": rbytes(70_000, 3)}, stream="filler")
        compactor.compact(threshold=1.0, max_garbage=0)
        monkeypatch.setattr(groups, "wait_for_parts", real)
        return found
    monkeypatch.setattr(groups, "wait_for_parts", collected_then_restaged)
    with pytest.raises(GroupError, match="staged its part again"):
        g.commit()
    assert coordinator.checkpoints("ops") == []
    info = g.commit()                              # the new part
    assert coordinator.restore(info.id) == {"a": new}
    assert coordinator.verify(deep=True)["ok"]
    for s in (coordinator, participant, compactor):
        s.close()


def test_a_group_id_that_is_not_valid_unicode_is_refused(path):
    with snapstore.open(path) as s:
        with pytest.raises(InvalidArgumentError, match="valid Unicode"):
            s.stage("\udcff", "a", {"x": b"1"})


def test_group_parts_of_anything_else(path):
    """A checkpoint()'s meta may carry the reserved key with any shape; group_parts of a
    non-info is a type error, not an AttributeError."""
    with snapstore.open(path) as s:
        for meta in ({"snapstore.group": {"parts": 5}}, {"snapstore.group": {"parts": [1, 2]}},
                     {"snapstore.group": 7}):
            assert snapstore.group_parts(s.checkpoint({"a": b"x"}, meta=meta)) == {}
    for wrong in (None, 42, {"parts": {}}):
        with pytest.raises(InvalidArgumentTypeError):
            snapstore.group_parts(wrong)


COORDINATE_AND_DIE = r"""
import sys, snapstore
s = snapstore.open(sys.argv[1])
g = s.group("ops", ["a"], timeout=120)
print(g.id, flush=True)
s.stage(g.id, "a", {"a": b"old" * 1000}, meta={"v": 1})
g.commit(meta={"epoch": 1})
print("committed", flush=True)
"""


def test_a_stage_after_the_coordinator_died_committing_is_refused(path):
    """Regression: the coordinator killed with its group's commit record durable left its
    commit claim and the group's entries; a participant's stage then was acknowledged, and
    the recovery of the coordinator's log published the older part. A stage that meets a
    commit claim of its group is refused with GroupError, as on S3 stores."""
    participant = snapstore.open(path)              # open before the coordinator dies
    p = run_child(COORDINATE_AND_DIE, path, crash_at="after_fsync")
    assert p.returncode == -signal.SIGKILL, p.stderr
    gid = p.stdout.split()[0]
    with pytest.raises(GroupError, match="died"):
        participant.stage(gid, "a", {"a": b"new"}, meta={"v": 2})
    participant.close()
    with snapstore.open(path) as s:
        [info] = s.checkpoints("ops")
        assert s.restore(info.id) == {"a": b"old" * 1000}
        assert snapstore.group_parts(info) == {"a": {"v": 1}}
        assert s.verify(deep=True)["ok"]


def test_a_stage_while_the_commit_is_claimed_is_refused(path, monkeypatch):
    """A live coordinator's commit combines the parts there were when it claimed: a stage
    of the group from then on is refused (GroupError), and the commit publishes the part
    that was acknowledged (it used to accept the stage and then fail the commit)."""
    from snapstore.engine import groups
    with snapstore.open(path) as coord, snapstore.open(path) as participant:
        g = coord.group("ops", ["a"])
        participant.stage(g.id, "a", {"a": b"first"})
        real = groups.count_bytes_new
        refused = []

        def stage_during_the_commit(commit, n):
            monkeypatch.setattr(groups, "count_bytes_new", real)
            with pytest.raises(GroupError, match="being committed") as exc:
                participant.stage(g.id, "a", {"a": b"second"})
            refused.append(exc.value)
            return real(commit, n)
        monkeypatch.setattr(groups, "count_bytes_new", stage_during_the_commit)
        info = g.commit()
        assert refused and coord.restore(info.id) == {"a": b"first"}
        with pytest.raises(GroupError):
            participant.stage(g.id, "a", {"a": b"third"})      # committed: gone
        assert coord.verify(deep=True)["ok"]


def _group_entries(s) -> int:
    with s._committer.index.read() as r:
        return len(r.group_entries())


def test_a_restage_race_leaves_the_group_open_with_its_claim(path, monkeypatch):
    """Regression: a commit that failed on the re-stage race had released the group's claim
    and kept its entries: another writer committed on the stream, the group could never
    commit, and its parts stayed (past the deadline, after reopen) pinning the participant's
    log against compaction. The race is now found before the commit claims, and the group
    stays open: the stream reserved, committing again takes the new part."""
    from snapstore.engine import groups
    with snapstore.open(path) as coord, snapstore.open(path) as part, \
            snapstore.open(path) as other:
        g = coord.group("ops", ["a"], timeout=30)
        part.stage(g.id, "a", {"a": rbytes(100_000, 1)})
        real = groups.wait_for_parts

        def collected_then_restaged(c, group, timeout):
            found = real(c, group, timeout)
            part.stage(g.id, "a", {"a": rbytes(100_000, 2)})
            monkeypatch.setattr(groups, "wait_for_parts", real)
            return found
        monkeypatch.setattr(groups, "wait_for_parts", collected_then_restaged)
        with pytest.raises(GroupError, match="staged its part again"):
            g.commit()
        with pytest.raises(CommitConflict):
            other.checkpoint({"x": b"other writer"}, stream="ops")   # still reserved
        info = g.commit()
        assert coord.restore(info.id) == {"a": rbytes(100_000, 2)}
        assert _group_entries(coord) == 0


@pytest.mark.parametrize("failure", ["interrupt", "io"])
def test_a_commit_that_fails_after_claiming_leaves_the_group_open(path, monkeypatch, failure):
    """Regression: any failure after the commit claimed (KeyboardInterrupt, StoreIOError)
    dropped the commit claim only: the group's own claim was gone, so the group was
    orphaned (its stream free, committing again a CommitConflict once another writer
    committed, its entries never dropped). The transaction that drops the commit claim now
    gives the group a claim again: it stays open, committable and abortable."""
    from snapstore.engine import groups
    from snapstore.errors import StoreIOError
    with snapstore.open(path) as coord, snapstore.open(path) as other:
        g = coord.group("ops", ["a", "b"], timeout=30)
        coord.stage(g.id, "a", {"a": rbytes(50_000, 1)}, meta={"o": 1})
        other.stage(g.id, "b", {"b": rbytes(50_000, 2)})
        if failure == "interrupt":
            real = groups.count_bytes_new

            def interrupted(commit, n):
                monkeypatch.setattr(groups, "count_bytes_new", real)
                raise KeyboardInterrupt
            monkeypatch.setattr(groups, "count_bytes_new", interrupted)
            expected = KeyboardInterrupt
        else:
            log = coord._committer.log

            def failing_flush():
                raise OSError(5, "Input/output error")
            monkeypatch.setattr(log, "flush", failing_flush)
            expected = StoreIOError
        with pytest.raises(expected):
            g.commit()
        monkeypatch.undo()
        assert coord.checkpoints("ops") == []
        assert g.status()["missing"] == []
        with pytest.raises(CommitConflict):
            other.checkpoint({"x": b"other writer"}, stream="ops")
        info = g.commit(meta={"epoch": 2})
        assert coord.restore(info.id) == {"a": rbytes(50_000, 1), "b": rbytes(50_000, 2)}
        assert snapstore.group_parts(info) == {"a": {"o": 1}, "b": None}
        assert _group_entries(coord) == 0 and coord.verify(deep=True)["ok"]
        g2 = coord.group("ops", ["a"], timeout=30)        # and a failed one can be aborted
        coord.stage(g2.id, "a", {"a": b"x"})
        monkeypatch.setattr(groups, "count_bytes_new", lambda commit, n: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            g2.commit()
        monkeypatch.undo()
        assert g2.abort() is True
        assert _group_entries(coord) == 0
        other.checkpoint({"x": b"free again"}, stream="ops")


def test_a_commit_failing_past_the_deadline_drops_the_group(path, monkeypatch):
    from snapstore.engine import groups
    with snapstore.open(path) as s:
        g = s.group("ops", ["a"], timeout=30)
        s.stage(g.id, "a", {"a": b"x" * 1000})

        def late(commit, n):
            monkeypatch.setattr(time, "time", lambda: 1e12)   # past the deadline
            raise KeyboardInterrupt
        monkeypatch.setattr(groups, "count_bytes_new", late)
        with pytest.raises(KeyboardInterrupt):
            g.commit()
        monkeypatch.undo()
        assert _group_entries(s) == 0
        with pytest.raises(GroupError):
            g.status()
        s.checkpoint({"x": b"free"}, stream="ops")


def test_groups_no_claim_holds_are_dropped_and_never_commit(path):
    """Regression: a group whose claim an older version's failed commit released was never
    dropped (not past its deadline, not at reopen, not by compaction), pinning its parts'
    segments. It cannot commit (GroupError); compaction and a writer's open drop it, and
    expired groups too."""
    from snapstore.engine import claims as claim_rules
    from snapstore.engine import groups
    with snapstore.open(path, segment_size=1 << 16) as s:
        g = s.group("ops", ["a"], timeout=30)
        s.stage(g.id, "a", {"a": rbytes(300_000, 1)})
        with s._committer.index.write() as w:             # what the old failure left
            claim_rules.release(w, groups.GroupHeader.read(w, g.id).claim)
        with pytest.raises(GroupError, match="no claim"):
            g.commit()
        before = s.stats()["segment_bytes"]
        s.compact(threshold=1.0, max_garbage=0)
        assert _group_entries(s) == 0
        s.compact(threshold=1.0, max_garbage=0)
        assert s.stats()["segment_bytes"] < before - 200_000   # the part's bytes are reclaimed
        g = s.group("ops", ["a"], timeout=30)
        s.stage(g.id, "a", {"a": b"x"})
        with s._committer.index.write() as w:
            claim_rules.release(w, groups.GroupHeader.read(w, g.id).claim)
    with snapstore.open(path) as s:                        # a writer's open drops it too
        assert _group_entries(s) == 0
        expired = s.group("ops", ["a"], timeout=0.2)
        s.stage(expired.id, "a", {"a": b"x"})
        time.sleep(0.3)
        s.compact()                                        # an expired group is dropped
        assert _group_entries(s) == 0
        s.checkpoint({"x": b"free"}, stream="ops")


def test_a_compaction_racing_the_rebase_makes_the_commit_plan_again(path, monkeypatch):
    """Regression: the full rule's rebase reads the parent's manifests; a compaction that
    trimmed one of their chunks before the commit claimed made the commit fail with
    CorruptionError (a manifest naming a chunk the index lacks). The claim now re-checks the
    chunks the rebase reused when garbage collection ran since, and plans again."""
    from snapstore.engine import groups
    with snapstore.open(path, segment_size=1 << 16) as coord, \
            snapstore.open(path, segment_size=1 << 16) as other:
        R = bytearray(rbytes(256 << 10, 1))
        first = coord.checkpoint({"a": bytes(R)}, stream="ops")
        R[0:4096] = rbytes(4096, 2)
        coord.checkpoint({"a": bytes(R)}, stream="ops")
        coord.delete(first.id)      # the head now uses only part of first's chunk: trimmed
        g = coord.group("ops", ["x", "y"], timeout=60)
        A = bytearray(R)
        A[8192:12288] = rbytes(4096, 3)                      # a delta over the head
        coord.stage(g.id, "x", {"a": bytes(A)})
        B = rbytes(1 << 20, 4)                               # all new: mostly changed
        other.stage(g.id, "y", {"b": B})
        real = groups.whole_if_mostly_changed
        trimmed = []

        def compacted_after_the_rebase(*args, **kw):
            out = real(*args, **kw)
            if not trimmed:
                assert out is not args[3]                    # it rebased
                trimmed.append(other.compact(threshold=1.0, max_garbage=0)["chunks_trimmed"])
            return out
        monkeypatch.setattr(groups, "whole_if_mostly_changed", compacted_after_the_rebase)
        info = g.commit()
        assert trimmed == [1] and info.kind == "full"
        assert coord.restore(info.id) == {"a": bytes(A), "b": B}
        assert coord.verify(deep=True)["ok"]
