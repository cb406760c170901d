"""Claims (issue 16, engine/claims.py): what makes many writers safe. CommitConflict on a
moved head and on operations in progress, pins that keep garbage collection off the chunks a
commit in progress reuses, and the GC generation that makes a commit planned before a
collection check its reused chunks again (white-box where a race must be made to happen)."""
from __future__ import annotations

import threading

import pytest

import snapstore
from snapstore.engine import claims as claim_rules
from snapstore.engine import writer as wr
from snapstore.errors import CommitConflict, InvalidArgumentError, InvalidArgumentTypeError


def rbytes(n: int, seed: int) -> bytes:
    import random
    return random.Random(seed).randbytes(n)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "store")


def test_expect_head_is_a_compare_and_swap(path):
    with snapstore.open(path) as s:
        with pytest.raises(CommitConflict):
            s.checkpoint({"x": b"1"}, stream="a", expect_head=5)
        first = s.checkpoint({"x": b"1"}, stream="a", expect_head=None)
        with pytest.raises(CommitConflict) as exc:
            s.checkpoint({"x": b"2"}, stream="a", expect_head=None)
        e = exc.value
        assert (e.stream, e.expected, e.found) == ("a", None, first.id)
        second = s.checkpoint({"x": b"2"}, stream="a", expect_head=first)    # a CheckpointInfo
        with pytest.raises(CommitConflict) as exc:
            s.checkpoint({"x": b"3"}, stream="a", expect_head=first.id)
        assert (exc.value.expected, exc.value.found) == (first.id, second.id)
        assert [c.id for c in s.checkpoints("a")] == [first.id, second.id]   # nothing left over
        assert s.verify(deep=True)["ok"]


def test_an_expected_head_that_is_no_checkpoint_of_the_stream_says_so(path):
    """An expect_head naming no checkpoint, or one of another stream, was reported as
    "another writer committed (or deleted) meanwhile ... retry", with no other writer."""
    with snapstore.open(path) as s:
        a = s.checkpoint({"x": b"1"}, stream="a")
        b = s.checkpoint({"x": b"1"}, stream="b")
        with pytest.raises(CommitConflict, match="no checkpoint of this store") as exc:
            s.checkpoint({"x": b"2"}, stream="a", expect_head=99999)
        assert "meanwhile" not in str(exc.value)
        assert (exc.value.expected, exc.value.found) == (99999, a.id)
        with pytest.raises(CommitConflict, match="a checkpoint of stream 'b'"):
            s.checkpoint({"x": b"2"}, stream="a", expect_head=b.id)
        with pytest.raises(CommitConflict, match="a checkpoint of stream 'b'"):
            s.checkpoint({"x": b"2"}, stream="new", expect_head=b)       # empty stream
        s.delete(a.id)
        with pytest.raises(CommitConflict, match="never made, or deleted"):
            s.checkpoint({"x": b"3"}, stream="a", expect_head=a.id)
        assert [c.id for c in s.checkpoints()] == [b.id]


@pytest.mark.parametrize("bad, error", [(0, InvalidArgumentError), (-1, InvalidArgumentError),
                                        ("1", InvalidArgumentTypeError),
                                        (True, InvalidArgumentTypeError),
                                        (1.0, InvalidArgumentTypeError)])
def test_bad_expect_head(path, bad, error):
    with snapstore.open(path) as s:
        with pytest.raises(error):
            s.checkpoint({"x": b"1"}, stream="a", expect_head=bad)
        assert s.checkpoints() == []


def test_a_conflicting_commit_leaves_nothing_and_its_chunks_are_garbage(path):
    data = rbytes(300_000, 1)
    with snapstore.open(path) as s, snapstore.open(path) as t:
        base = s.checkpoint({"x": b"0"}, stream="a")
        s.checkpoint({"x": b"1"}, stream="a")
        before = t.stats()
        with pytest.raises(CommitConflict):
            t.checkpoint({"x": data}, stream="a", expect_head=base.id)
        after = t.stats()
        assert after["checkpoints"] == before["checkpoints"]
        assert t.verify(deep=True)["ok"]


def test_commits_of_one_writer_race_a_delete_of_their_parent(path):
    with snapstore.open(path) as s, snapstore.open(path) as t:
        base = s.checkpoint({"x": rbytes(50_000, 2)}, stream="a")
        t.delete(base.id)
        with pytest.raises(CommitConflict):        # the head it built on is gone
            s.checkpoint({"x": rbytes(50_000, 3)}, stream="a", expect_head=base.id)
        s.checkpoint({"x": rbytes(50_000, 3)}, stream="a", expect_head=None)


def test_gc_keeps_what_a_commit_in_progress_reuses(path):
    """A commit reuses chunks of a deleted checkpoint (unreferenced, not collected yet); a
    compaction runs between its planning and its claim (made to happen in its pause
    callback): the commit notices from the GC generation, plans again, and its checkpoint
    restores exactly."""
    data = rbytes(400_000, 4)
    with snapstore.open(path) as s, snapstore.open(path) as other:
        dead = s.checkpoint({"x": data}, stream="junk")
        s.delete(dead.id)                           # its chunks: refs 0, still indexed
        ran = []

        def compact_meanwhile() -> None:
            if not ran:
                ran.append(True)
                t = threading.Thread(target=lambda: ran.append(other.compact(
                    threshold=1.0, max_garbage=0)))
                t.start()
                t.join()

        calls = []
        views = {"x": memoryview(data)}

        def plans(view, head, parent):
            calls.append(view.gc_generation())
            return wr.plan_buffers(view, "b", head, parent, views, s.options, "pages")
        commit = s._committer.commit("b", plans, None, pause=compact_meanwhile)
        assert ran[1]["chunks_freed"] > 0           # the collection did free them
        assert len(calls) == 2 and calls[1] > calls[0]   # planned again after it
        assert s.restore(commit.id) == {"x": data}
        assert s.verify(deep=True)["ok"]


def test_pins_of_a_claim_are_kept_by_gc(path):
    data = rbytes(200_000, 5)
    with snapstore.open(path) as s, snapstore.open(path) as other:
        dead = s.checkpoint({"x": data}, stream="junk")
        s.delete(dead.id)
        g = s.group("g", ["p"])
        other.stage(g.id, "p", {"x": data})          # reuses and pins the unreferenced chunks
        with s._committer.read() as r:
            pinned = claim_rules.pinned_chunks(r)
            unreferenced = {cid for cid, e in r.chunks() if e.refs == 0}
        assert unreferenced and unreferenced <= pinned
        rep = other.compact(threshold=1.0, max_garbage=0)
        assert rep["chunks_freed"] == 0
        info = g.commit()
        assert s.restore(info.id) == {"x": data}
        assert s.verify(deep=True)["ok"]


def test_check_pins_only_looks_when_the_generation_moved(path):
    with snapstore.open(path) as s:
        s.checkpoint({"x": rbytes(100_000, 6)}, stream="a")
        with s._index.write() as w:
            generation = w.gc_generation()
            cid = next(iter(dict(w.chunks())))
            claim_rules.check_pins(w, [b"\0" * 32], generation)     # same generation: trusts
            claim_rules.check_pins(w, [cid], generation - 1)         # there: fine
            with pytest.raises(claim_rules.ChunksVanished):
                claim_rules.check_pins(w, [b"\0" * 32], generation - 1)


def test_claims_are_empty_at_rest_and_name_their_holder(path):
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"1"}, stream="a")
        with s._committer.read() as r:
            assert claim_rules.claims(r) == []
        g = s.group("a", ["p"])
        with s._committer.read() as r:
            (c,) = claim_rules.claims(r)
        assert c.kind == "group" and c.stream == "a" and c.group == g.id
        assert c.log == s._committer.log_number and f"pid {c.pid}" in c.holder
        g.abort()
        with s._committer.read() as r:
            assert claim_rules.claims(r) == []


def test_a_claim_its_release_could_not_drop_is_dropped_by_the_next_claim(path, monkeypatch):
    """A publish that failed for want of the index's write lock (held by a stopped writer:
    StoreLocked) rolled back, and its release, needing the same lock, failed too and was
    swallowed: the stream stayed claimed by this live writer until its Store closed, and its
    own retries, and every other writer's, got CommitConflict (a reviewer's find)."""
    from snapstore.engine.index import Index
    from snapstore.errors import StoreLocked
    with snapstore.open(path) as s, snapstore.open(path) as other:
        first = s.checkpoint({"x": b"1"}, stream="a")
        real_write = Index.write
        failing = {"left": 0, "writes": 0}

        def write(self, *args, **kwargs):
            failing["writes"] += 1
            if failing["writes"] > 1 and failing["left"]:     # the claim's own write passes
                failing["left"] -= 1
                raise StoreLocked("the index's write lock is held by a stopped writer",
                                  lock="index")
            return real_write(self, *args, **kwargs)

        monkeypatch.setattr(Index, "write", write)
        failing["left"] = 2                 # the publish's transaction, then the release's
        with pytest.raises(StoreLocked):
            s.checkpoint({"x": b"2"}, stream="a")
        monkeypatch.setattr(Index, "write", real_write)
        second = s.checkpoint({"x": b"3"}, stream="a")       # was CommitConflict
        assert second.parent == first.id
        third = other.checkpoint({"x": b"4"}, stream="a")    # and for another writer
        assert [c.id for c in s.checkpoints("a")] == [first.id, second.id, third.id]
        assert s.restore(second.id)["x"] == b"3" and s.verify(deep=True)["ok"]
