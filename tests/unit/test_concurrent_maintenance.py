"""Maintenance while other writers write (docs/design.md, "Compaction", "While other writers
write"; "Verification"): deterministic interleavings of one compaction and another Store's
operations, made by running the other Store's operation at one of compaction's crash points
(the points are between its transactions, so the other writer can take the index's write lock
there); verify() next to a log whose writer is creating its next segment.
"""
from __future__ import annotations

import os
import random
import time

import pytest

import snapstore
from snapstore.engine import compact as compaction
from snapstore.engine import format as fmt
from snapstore.engine.backends import LocalSegments, segment_name
from snapstore.engine.wal import encode_segment_header


@pytest.fixture
def at_point(monkeypatch):
    """at_point(name, action): runs action() when compaction reaches crash point `name`."""
    actions: dict = {}
    real = compaction.crashpoint

    def hook(name: str) -> None:
        if name in actions:
            actions.pop(name)()
        real(name)
    monkeypatch.setattr(compaction, "crashpoint", hook)

    def add(name: str, action) -> None:
        actions[name] = action
    return add


def _trimmable(store, rng) -> tuple:
    """Two checkpoints of one 64 KiB buffer, the second a delta rewriting 6 of its 16 pages;
    the first deleted, so the second uses 10/16 of the first's chunk: a chunk compact()
    trims with threshold 0.9."""
    state = bytearray(rng.randbytes(64 << 10))
    original = bytes(state)
    first = store.checkpoint({"x": state}, stream="s")
    for page in range(6):
        state[page * 4096:(page + 1) * 4096] = rng.randbytes(4096)
    second = store.checkpoint({"x": state}, stream="s")
    assert second.kind == "incremental"
    store.delete(first.id)
    return second, original, bytes(state)


def test_trim_survives_a_delete_by_another_writer(store_path, at_point):
    # Regression (found by tests/crash/test_many_writers_kill.py): a checkpoint whose chunk
    # compaction planned to trim, deleted by another writer between the plan and the trim's
    # transaction, made compact() raise CorruptionError('index lacks manifest 0 of
    # checkpoint N') -- on a healthy store -- whenever writers delete while it runs.
    rng = random.Random(7)
    with snapstore.open(store_path) as a, snapstore.open(store_path) as b:
        second, _, _ = _trimmable(a, rng)
        kept = rng.randbytes(100_000)
        keep = a.checkpoint({"y": kept}, stream="other")
        at_point("compact_after_trim_copy", lambda: b.delete(second.id))
        report = a.compact(threshold=0.9)
        assert report["segments_removed"] >= 1
        assert [c.id for c in a.checkpoints()] == [keep.id]
        assert a.verify(deep=True)["ok"]
        a.compact(threshold=0.9)      # the trimmed copy nobody uses is garbage: collected
        assert a.stats()["garbage_chunk_bytes"] == 0
        assert a.restore(keep.id)["y"] == kept
        assert a.verify(deep=True)["ok"]


def test_trim_keeps_a_checkpoint_another_writer_commits_meanwhile(store_path, at_point):
    """A commit between the trim's plan and its transaction that reuses the trimmed chunk
    (the same bytes again) keeps the whole chunk, which stays referenced and restorable."""
    rng = random.Random(8)
    with snapstore.open(store_path) as a, snapstore.open(store_path) as b:
        second, original, state = _trimmable(a, rng)
        made = []
        # a full checkpoint of another stream holding the first checkpoint's bytes: it
        # reuses (and pins) the very chunk the trim replaces
        at_point("compact_after_trim_copy",
                 lambda: made.append(b.checkpoint({"x": original}, stream="t")))
        report = a.compact(threshold=0.9)
        assert report["chunks_trimmed"] == 1 and made
        assert made[0].bytes_new < 4096          # deduplicated: only its commit record
        assert a.restore(second.id)["x"] == state
        assert b.restore(made[0].id)["x"] == original
        assert a.verify(deep=True)["ok"]
        a.compact(threshold=0.9)
        assert a.restore(second.id)["x"] == state
        assert b.restore(made[0].id)["x"] == original
        assert a.verify(deep=True)["ok"]


@pytest.mark.parametrize("header_bytes", [0, 13])
def test_verify_passes_over_a_segment_whose_header_is_being_written(store_path, header_bytes):
    # Regression (found by tests/crash/test_many_writers_kill.py, a reader's verify(deep=True)
    # while writers wrote): a writer rolling over creates its next segment, then writes its
    # header; verify(deep=True) listing the segments in between reported
    # damaged_segment_header ('segment header is truncated'). Such a segment, the last of
    # its log and past what the index applied of it, is what verify already passes over
    # for records (one being appended, or a torn tail recovery cuts): the same for a
    # header. A writer killed there leaves the same segment, which its recovery removes.
    with snapstore.open(store_path) as a:
        a.checkpoint({"x": b"a" * 5000}, stream="a")
        with snapstore.open(store_path) as b:
            info = b.checkpoint({"x": b"b" * 5000}, stream="b")
            last = max(n for n in b.backend.list() if n // fmt.LOG_SEGMENTS == b._log.log)
            name = os.path.join(store_path, fmt.SEGMENTS_DIR, segment_name(last + 1))
            with open(name, "wb") as f:                 # created, header not (all) written
                f.write(encode_segment_header(last + 1)[:header_bytes])
            for deep in (False, True):
                rep = a.verify(deep=deep)
                assert rep["ok"], rep["problems"]
            os.unlink(name)             # (b's own next rollover creates it for real)
        with open(name, "wb") as f:     # b is gone: the same segment as a kill leaves it
            f.write(encode_segment_header(last + 1)[:header_bytes])
        with snapstore.open(store_path, readonly=True) as ro:
            rep = ro.verify(deep=True)
            assert rep["ok"], rep["problems"]
    with snapstore.open(store_path) as s:       # recovery removes the torn segment
        assert not os.path.exists(name)
        assert s.restore(info.id) == {"x": b"b" * 5000}
        assert s.verify(deep=True)["ok"]


def test_verify_passes_over_a_torn_segment_removed_while_it_runs(store_path):
    """A writer's open recovering a dead log removes its torn last segment; a verify that
    listed the segment before finds it gone: not a problem (and no FileNotFoundError)."""
    with snapstore.open(store_path) as a:
        a.checkpoint({"x": b"a" * 5000}, stream="a")
        last = a.backend.list()[-1]
    name = os.path.join(store_path, fmt.SEGMENTS_DIR, segment_name(last + 1))
    with open(name, "wb") as f:
        f.write(encode_segment_header(last + 1)[:7])

    class RemovedWhileListed(LocalSegments):
        def size(self, number):
            if number == last + 1 and os.path.exists(name):
                os.unlink(name)         # the recovery of another writer, right now
            return super().size(number)
    backend = RemovedWhileListed(os.path.join(store_path, fmt.SEGMENTS_DIR), durable=False)
    with snapstore.open(store_path, readonly=True, backend=backend) as ro:
        rep = ro.verify(deep=True)
    assert rep["ok"], rep["problems"]


def test_verify_still_reports_a_damaged_header_of_a_segment_with_records(store_path):
    """Only a segment shorter than a header, past its log's applied position and holding
    nothing the index knows, is passed over: a damaged header elsewhere is a problem."""
    with snapstore.open(store_path, segment_size=1 << 16) as s:
        for i in range(6):
            s.checkpoint({"x": random.Random(i).randbytes(40_000)}, stream="a")
        numbers = s.backend.list()
    assert len(numbers) >= 3
    with open(os.path.join(store_path, fmt.SEGMENTS_DIR, segment_name(numbers[0])), "r+b") as f:
        f.write(b"\0" * 4)
    with snapstore.open(store_path, readonly=True) as ro:
        rep = ro.verify(deep=True)
    assert any(p["kind"] == "damaged_segment_header" for p in rep["problems"]), rep


def _compact_elsewhere(path: str, doomed: list, done) -> None:
    """In another process: delete, compact with the index shrink (the index is replaced),
    then delete and compact again (segments the replaced index points into are removed)."""
    try:
        with snapstore.open(path) as s:
            s.delete_many(doomed[:len(doomed) // 2])
            assert s.compact(threshold=1.0, shrink_index=True)["index_shrunk"]
            s.delete_many(doomed[len(doomed) // 2:])
            assert s.compact(threshold=1.0, shrink_index=False)["segments_removed"] > 0
        done.put("ok")
    except BaseException as exc:  # noqa: BLE001 -- reported to the test
        done.put(repr(exc))


def test_verify_reads_the_current_index_not_one_replaced_elsewhere(store_path, monkeypatch):
    # Regression (found by tests/crash/test_many_writers_kill.py, a reader's verify() while
    # a compactor process compacted): a Store notices that another process replaced the
    # index (compaction's shrink) only RECHECK_SECONDS later; a verify in between read the
    # replaced index, whose chunk entries point into segments a later compaction removed,
    # and reported missing_segment problems (with the checkpoints they break) on a healthy
    # store. verify holds the maintenance lock, so no compaction replaces the index while it
    # runs: it first moves to the current one. (The recheck interval is pinned here so the
    # interleaving does not depend on timing.)
    import multiprocessing
    from snapstore.engine import index as index_module
    monkeypatch.setattr(index_module, "RECHECK_SECONDS", 3600.0)
    rng = random.Random(11)
    with snapstore.open(store_path, segment_size=1 << 16) as s:
        doomed = [s.checkpoint({"x": rng.randbytes(50_000)}, stream=f"s{i % 3}").id
                  for i in range(12)]
        keep = {s.checkpoint({"y": rng.randbytes(30_000)}, stream="keep").id: None}
        for cid in keep:
            keep[cid] = s.restore(cid)
        with snapstore.open(store_path, readonly=True) as ro:
            assert ro.verify(deep=False)["ok"]
            ctx = multiprocessing.get_context("fork")
            done = ctx.Queue()
            child = ctx.Process(target=_compact_elsewhere, args=(store_path, doomed, done))
            child.start()
            child.join(60)
            assert done.get(timeout=10) == "ok"
            for store in (ro, s):
                for deep in (False, True):
                    rep = store.verify(deep=deep)
                    assert rep["ok"], rep["problems"][:3]
            assert [c.id for c in ro.checkpoints()] == list(keep)
            for cid, want in keep.items():
                assert ro.restore(cid) == want


def _compact_then_commit(path: str, done) -> None:
    try:
        with snapstore.open(path) as s:
            assert s.compact(shrink_index=True)["index_shrunk"]
            done.put(s.checkpoint({"x": b"committed after the swap"}, stream="late").id)
    except BaseException as exc:  # noqa: BLE001 -- reported to the test
        done.put(repr(exc))


def test_a_checkpoint_another_process_committed_is_visible_after_it_replaced_the_index(
        store_path, monkeypatch):
    """Process B commits (acknowledged) right after its compaction replaced the index; a
    Store of this process whose last read was moments before sees that checkpoint at once.
    Regression: an Index looked for a replaced index only every 50 ms, so get/restore/delete/
    tag raised CheckpointNotFound and latest() was stale meanwhile (the many-writers kill
    torture saw participants miss the group parent their coordinator committed). The clock of
    this process is frozen so that "moments before" does not depend on the machine's speed."""
    import multiprocessing
    from snapstore.engine import index as index_module

    import time

    class Frozen:
        now = 0.0

        @classmethod
        def monotonic(cls):
            return cls.now
    with snapstore.open(store_path) as s:
        for i in range(20):
            s.delete(s.checkpoint({"x": random.Random(i).randbytes(60_000)}).id)
        s.checkpoint({"x": b"kept"}, stream="kept")
        Frozen.now = time.monotonic()       # from now on, no time passes for this process
        monkeypatch.setattr(index_module, "time", Frozen)
        s.checkpoints()                 # a read "moments before"
        ctx = multiprocessing.get_context("fork")
        done = ctx.Queue()
        child = ctx.Process(target=_compact_then_commit, args=(store_path, done))
        child.start()
        child.join(60)
        cid = done.get(timeout=10)
        assert isinstance(cid, int), cid
        assert s.get(cid).stream == "late"          # CheckpointNotFound


def test_a_segment_that_vanishes_after_the_listing_is_no_error(tmp_path, monkeypatch):
    """With many writers, a segment listed a moment ago may be gone (a writer rolled back the
    segments of a commit that lost its race): stats(), retain(), compact() and verify() raised
    FileNotFoundError, StoreIOError, or reported a missing segment and told to run repair.
    Simulated here by a listing that names a segment wholly past the log's applied
    position that is not there."""
    with snapstore.open(tmp_path / "s") as s:
        first = s.checkpoint({"a": bytes(range(256)) * 1200}, stream="x")
        s.checkpoint({"a": b"y" * 5000}, stream="x")
        backend = s._committer.backend
        real = type(backend).list
        ghost = max(real(backend)) + 5          # past everything applied, named by nothing
        monkeypatch.setattr(type(backend), "list", lambda self: real(self) + [ghost])
        stats = s.stats()
        assert stats["segments"] == len(real(backend))
        s.retain("x", keep_last=1)
        s.compact(threshold=1.0)
        report = s.verify(deep=True)
        assert report["ok"], report["problems"]
        assert s.checkpoint_ids("x") != [first.id]


def _fallback_swap_state(store_path: str) -> dict:
    """A store with one checkpoint and a complete copy of its index in .index.new, as a
    compaction's swap has it before its first rename (the copy is taken with no writer open,
    so it is a valid index). Returns the checkpoint's bytes by id."""
    import shutil
    with snapstore.open(store_path) as s:
        info = s.checkpoint({"a": b"abc" * 5000}, stream="t")
    shutil.copytree(os.path.join(store_path, fmt.INDEX_DIR),
                    os.path.join(store_path, fmt.INDEX_REBUILD_DIR))
    return {info.id: b"abc" * 5000}


@pytest.mark.parametrize("moment", ["first rename", "second rename, next copy begun",
                                    "second rename, next copy created empty"])
def test_an_open_racing_a_swap_without_exchange_finds_the_index(tmp_path, monkeypatch, moment):
    """Regressions (file systems without renameat2 RENAME_EXCHANGE swap the index by two
    renames): a Store opened while another process's compaction swapped the index failed
    with StoreIOError ('index open: ...: No such file or directory') or a false
    CorruptionError (no index/ directory, the index 'missing or empty', or 'truncated': a
    reader that located the complete copy in .index.new opened the next compaction's copy
    there, still being written). The swap's step is run right after the opener's k-th look
    for the index, for every k."""
    from snapstore.engine import indexswap
    real = indexswap.index_to_read
    k = 0
    while True:
        k += 1
        store_path = str(tmp_path / str(k))
        want = _fallback_swap_state(store_path)
        index_dir = os.path.join(store_path, fmt.INDEX_DIR)
        new_dir = os.path.join(store_path, fmt.INDEX_REBUILD_DIR)
        old_dir = os.path.join(store_path, fmt.INDEX_OLD_DIR)
        if moment != "first rename":
            os.rename(index_dir, old_dir)           # the window between the two renames
        looks = []

        def located_then_swapped(path):
            location = real(path)
            if path == index_dir:
                looks.append(location)
                if len(looks) == k:
                    if moment == "first rename":
                        os.rename(index_dir, old_dir)
                    else:
                        os.rename(new_dir, index_dir)
                        os.mkdir(new_dir)   # the next compaction's copy, being written
                        with open(os.path.join(index_dir, fmt.INDEX_DATA_FILE), "rb") as f:
                            head = f.read(8192)     # its meta pages first, as LMDB writes
                        if moment.endswith("empty"):
                            head = b""      # (just created: an open must not write into it)
                        with open(os.path.join(new_dir, fmt.INDEX_DATA_FILE), "wb") as f:
                            f.write(head)
            return location
        monkeypatch.setattr(indexswap, "index_to_read", located_then_swapped)
        with snapstore.open(store_path, readonly=True) as s:
            for cid, data in want.items():
                assert s.restore(cid)["a"] == data, k
        monkeypatch.setattr(indexswap, "index_to_read", real)
        if moment.endswith("empty") and len(looks) >= k:
            # Regression: the opener initialised it (LMDB writes meta pages into an empty
            # file it opens writable), and the swap then put an empty index in place
            assert os.path.getsize(os.path.join(new_dir, fmt.INDEX_DATA_FILE)) == 0, k
        if len(looks) < k:                  # every look was tried
            break
        if moment == "first rename":
            os.rename(new_dir, index_dir)
        indexswap.remove_entry(old_dir)
        indexswap.remove_entry(new_dir)
        with snapstore.open(store_path) as s:
            assert s.verify()["ok"], k
    assert k > 2


def test_a_writer_opened_between_a_live_swaps_renames_waits_for_it_not_for_the_store(
        tmp_path):
    """Regression (file systems without RENAME_EXCHANGE): a writer whose open came between
    the two renames of a live compaction's index swap took it for a swap a crash cut short,
    waited for the store to itself to finish it, and raised StoreLocked at its timeout, since
    the compacting writer stays open. It now stops waiting once the swap's owner finishes."""
    import threading
    import shutil
    store_path = str(tmp_path / "s")
    index_dir = os.path.join(store_path, fmt.INDEX_DIR)
    new_dir = os.path.join(store_path, fmt.INDEX_REBUILD_DIR)
    old_dir = os.path.join(store_path, fmt.INDEX_OLD_DIR)
    with snapstore.open(store_path) as compacting:      # the swap's owner, open throughout
        info = compacting.checkpoint({"a": b"abc" * 5000}, stream="t")
        want = {info.id: b"abc" * 5000}
        shutil.copytree(index_dir, new_dir)             # its copy (nothing writes meanwhile)
        os.rename(index_dir, old_dir)                   # its first rename

        def second_rename():
            os.rename(new_dir, index_dir)
            from snapstore.engine import indexswap
            indexswap.remove_entry(old_dir)
        finisher = threading.Timer(0.3, second_rename)
        finisher.start()
        began = time.monotonic()
        try:
            with snapstore.open(store_path, timeout=10) as s:
                waited = time.monotonic() - began
                for cid, data in want.items():
                    assert s.restore(cid)["a"] == data
                s.checkpoint({"a": b"new"}, stream="t")
        finally:
            finisher.join()
        assert waited < 5
        assert compacting.verify()["ok"]
