"""Garbage collection of S3 stores against a real server (SeaweedFS): Store.gc, the writer
guard, and gc running while writers write (docs/design.md, "Garbage collection").

Grace is GRACE (1 s), the smallest allowed. Writers assume layout.DEFAULT_GC_GRACE_SECONDS
until a gc mark tells them otherwise, and a store's first mark is due only after it (the
safety rule test_the_first_mark_waits_for_the_grace_writers_assume pins); the `small_default`
fixture lowers that default to GRACE for the writers and collectors of these tests (threads
of this process), so a first mark is due after GRACE too. An object is old enough to be
marked GRACE + 1 s after it was written (LastModified has 1 s resolution): OLD.
"""
from __future__ import annotations

import random
import threading
import time

import numpy as np
import pytest

import snapstore
from cli_runner import cli_error, cli_json, cli_ok
from snapstore.errors import (CheckpointNotFound, CommitConflict, CorruptionError,
                              InvalidArgumentError, ReadOnlyError, StoreClosedError)
from snapstore.remote import checkpoints as ckpt_objects
from snapstore.remote import layout, reach

KiB, MiB = 1 << 10, 1 << 20
GRACE = 1.0
OLD = GRACE + layout.MODIFIED_RESOLUTION + 0.05


@pytest.fixture(autouse=True)
def small_default(monkeypatch):
    monkeypatch.setattr(layout, "DEFAULT_GC_GRACE_SECONDS", GRACE)


@pytest.fixture
def url(s3):
    return f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"


def open_store(url, cache, **kw):
    return snapstore.open(url, cache_dir=str(cache), **kw)


def state(n=MiB, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def keys(s3, directory):
    """The keys (relative to the store's prefix) of the objects under directory."""
    client = s3.client()
    out, token = set(), None
    while True:
        kw = {"Bucket": s3.bucket, "Prefix": s3.prefix + directory}
        if token:
            kw["ContinuationToken"] = token
        page = client.list_objects_v2(**kw)
        out.update(o["Key"][len(s3.prefix):] for o in page.get("Contents", []))
        if not page.get("IsTruncated"):
            return out
        token = page["NextContinuationToken"]


def segments_in_bucket(s3):
    return {layout.segment_of(k) for k in keys(s3, layout.SEGMENTS_DIR)}


def checkpoint_objects_in_bucket(s3):
    return {layout.checkpoint_id_of(k) for k in keys(s3, layout.CHECKPOINTS_DIR)}


def checkpoint_object(s3, checkpoint_id):
    """(Commit, reused table) of a checkpoint object, read with plain boto3."""
    key = layout.checkpoint_key(checkpoint_id)
    data = s3.client().get_object(Bucket=s3.bucket, Key=s3.prefix + key)["Body"].read()
    return ckpt_objects.decode(data, key)


def segments_of(s3, checkpoint_id):
    return reach.segments([checkpoint_object(s3, checkpoint_id)])


def wait_until_due(report):
    time.sleep(max(0.0, report["due_at"] - time.time()) + 0.05)


def assert_restores(url, cache, expected):
    """Every live checkpoint of the store restores to expected[id] (name -> bytes); returns
    the live ids."""
    with open_store(url, cache) as s:
        live = [c.id for c in s.checkpoints()]
        for cid in live:
            assert s.restore(cid) == expected[cid], cid
    return live


def assert_nothing_live_is_missing(s3, store):
    """No live checkpoint of the bucket names a deleted object: every object of its delta
    chain exists, and every segment their chunk tables name."""
    from snapstore.remote import refs, sync
    client = store._committer.client
    live = set()
    for stream in sync.list_streams(client):
        live.update(refs.read(client, stream).live)
    objects = reach.chains(client, live)        # raises CorruptionError for a missing one
    assert set(objects) <= checkpoint_objects_in_bucket(s3)
    missing = reach.segments(objects.values()) - segments_in_bucket(s3)
    assert not missing, f"live checkpoints name deleted segments {sorted(missing)}"
    return live


# ---- the boring cases -----------------------------------------------------------------------
def test_nothing_to_collect_in_an_empty_store_nor_when_everything_is_live(url, tmp_path, s3):
    with open_store(url, tmp_path / "c") as s:
        first = s.gc(grace=GRACE)
        assert first["checkpoints_live"] == first["segments_reachable"] == 0
        assert first["mark_written"] and first["deleted"]["segments"] == []
        a = state()
        one = s.checkpoint({"a": a}, stream="s")
        a[:100] = 7
        two = s.checkpoint({"a": a}, stream="s")
        three = s.checkpoint({"b": b"x"}, stream="t")
        before = keys(s3, "")
        time.sleep(OLD)
        for _ in range(2):
            report = s.gc(grace=GRACE, wait=True)
            assert report["checkpoints_live"] == 3
            assert report["checkpoints_reachable"] == 3
            assert report["marked"]["segments"] == report["marked"]["checkpoints"] == []
            assert report["deleted"]["segments"] == report["deleted"]["checkpoints"] == []
            assert report["bytes_deleted"] == 0 and report["runs"] == 1
        assert keys(s3, "") == before        # the mark was rewritten in place
        expected = {one.id: {"a": state().tobytes()}, two.id: {"a": a.tobytes()},
                    three.id: {"b": b"x"}}
        assert s.restore(one.id) == expected[one.id]
    assert_restores(url, tmp_path / "empty", expected)


def test_garbage_is_collected_at_the_second_run_not_the_first(url, tmp_path, s3):
    """Deleted checkpoints' objects and segments; an abandoned group commit's objects (after
    2 * grace); a multipart upload begun more than grace ago (aborted at once). A dry run
    reports what the real one does and changes nothing; the deleted content committed
    again is stored anew (the cache forgot the deleted chunks)."""
    a, b = state(seed=1), state(seed=2)
    client = s3.client()
    with open_store(url, tmp_path / "c") as s:
        s.gc(grace=GRACE)                   # the store's first mark: due after GRACE
        gone = s.checkpoint({"a": a}, stream="s")
        kept = s.checkpoint({"a": b}, stream="s")       # all changed: full, own segment
        assert kept.kind == "full"
        gone_segments, kept_segments = segments_of(s3, gone.id), segments_of(s3, kept.id)
        assert gone_segments and not gone_segments & kept_segments
        s.delete(gone.id)
        young = s.gc(grace=GRACE)               # due, but nothing is old enough yet
        assert young["marked"]["segments"] == [] and young["deleted"]["segments"] == []
        time.sleep(1.01 - time.time() % 1)      # at a whole second: LastModified is exact
        client.put_object(Bucket=s3.bucket, Key=s3.prefix + "groups/g1/header", Body=b"{}")
        client.create_multipart_upload(Bucket=s3.bucket,
                                       Key=s3.prefix + "segments/9999999999999999.seg")
        time.sleep(OLD)
        dry = s.gc(grace=GRACE, dry_run=True, wait=True)
        assert dry["dry_run"] and not dry["mark_written"] and dry["runs"] == 1
        assert dry["marked"]["checkpoints"] == [gone.id] and dry["aborted_uploads"] == 0
        assert client.list_multipart_uploads(Bucket=s3.bucket,
                                             Prefix=s3.prefix).get("Uploads")
        first = s.gc(grace=GRACE)
        assert set(first["marked"]["segments"]) == gone_segments
        assert first["marked"]["checkpoints"] == [gone.id]
        assert first["marked"]["groups"] == []          # groups/: garbage after 2 graces
        assert first["aborted_uploads"] == 1
        assert not client.list_multipart_uploads(Bucket=s3.bucket,
                                                 Prefix=s3.prefix).get("Uploads")
        assert first["marked"]["bytes"] > MiB and first["deleted"]["segments"] == []
        assert gone_segments <= segments_in_bucket(s3)          # marked, not deleted
        assert gone.id in checkpoint_objects_in_bucket(s3)
        again = s.gc(grace=GRACE)                 # the same gc again: the mark is not due
        assert not again["mark_written"] and again["deleted"]["checkpoints"] == []
        assert again["marked"]["checkpoints"] == [gone.id]
        assert gone_segments <= segments_in_bucket(s3)
        wait_until_due(first)
        client.put_object(Bucket=s3.bucket, Key=s3.prefix + "groups/g2/header", Body=b"{}")
        before = keys(s3, "")
        with open_store(url, tmp_path / "r", readonly=True) as r:
            with pytest.raises(ReadOnlyError):
                r.gc(grace=GRACE)
            would = r.gc(grace=GRACE, dry_run=True)
        assert would["deleted"]["checkpoints"] == [gone.id] and would["bytes_deleted"] > MiB
        assert keys(s3, "") == before
        second = s.gc(grace=GRACE)
        assert set(second["deleted"]["segments"]) == gone_segments
        assert second["deleted"]["checkpoints"] == [gone.id]
        assert second["bytes_deleted"] == first["marked"]["bytes"]
        assert second["marked"]["segments"] == second["marked"]["checkpoints"] == []
        assert second["marked"]["groups"] == ["groups/g1/header"]   # g2 is young
        assert not gone_segments & segments_in_bucket(s3)
        assert gone.id not in checkpoint_objects_in_bucket(s3)
        assert kept_segments <= segments_in_bucket(s3)
        assert s.restore(kept.id)["a"] == b.tobytes()             # the warm cache
        wait_until_due(second)
        third = s.gc(grace=GRACE)
        assert third["deleted"]["segments"] == third["deleted"]["checkpoints"] == []
        assert third["deleted"]["groups"] == ["groups/g1/header"]
        assert keys(s3, "groups/") == {"groups/g2/header"}
        # the deleted checkpoint's content again: its chunks must be written anew
        back = s.checkpoint({"a": a}, stream="s")
        stats = s._committer.gc_guard.stats
        assert stats["dropped"] > 0 and stats["replans"] == 0
        assert back.bytes_new > MiB
        assert not segments_of(s3, back.id) & gone_segments
        assert back.id > gone.id
    assert_restores(url, tmp_path / "empty", {kept.id: {"a": b.tobytes()},
                                              back.id: {"a": a.tobytes()}})


def test_a_delta_chain_whose_middle_is_deleted_keeps_the_ancestors_it_needs(url, tmp_path, s3):
    a = state(seed=3)
    expected, chain = {}, []
    with open_store(url, tmp_path / "c") as s:
        s.gc(grace=GRACE)
        for step in range(4):
            a[step * 8 * KiB] ^= 0xFF
            info = s.checkpoint({"a": a}, stream="s")
            chain.append(info.id)
            expected[info.id] = {"a": a.tobytes()}
        assert [s.get(i).kind for i in chain] == ["full"] + ["incremental"] * 3
        other = s.checkpoint({"x": state(seed=4)}, stream="other")
        s.delete_many([chain[1], chain[2], other.id])       # the middle, and a full one
        for cid in (chain[1], chain[2]):
            del expected[cid]
        needed = set().union(*(segments_of(s3, i) for i in chain))
        other_segments = segments_of(s3, other.id)
        time.sleep(OLD)
        report = s.gc(grace=GRACE, wait=True)
        assert report["runs"] == 2
        assert report["checkpoints_live"] == 2 and report["checkpoints_reachable"] == 4
        assert report["deleted"]["checkpoints"] == [other.id]
        assert set(report["deleted"]["segments"]) == other_segments
        assert set(chain) <= checkpoint_objects_in_bucket(s3)
        assert needed <= segments_in_bucket(s3)
        assert s.restore(chain[3]) == expected[chain[3]]
        assert_nothing_live_is_missing(s3, s)
    with open_store(url, tmp_path / "fresh") as s:     # knows no id above chain[3]
        assert other.id == chain[3] + 1
        new = s.checkpoint({"n": b"new"}, stream="new")
        assert new.id > other.id            # a collected checkpoint's id is never taken again
        expected[new.id] = {"n": b"new"}
    assert_restores(url, tmp_path / "empty", expected)


def test_the_first_mark_waits_for_the_grace_writers_assume(url, tmp_path, monkeypatch):
    """Writers assume the default grace until a mark tells them otherwise, so a store's
    first mark (and a mark after a smaller grace) is due after the larger grace."""
    monkeypatch.setattr(layout, "DEFAULT_GC_GRACE_SECONDS", 3600.0)
    with open_store(url, tmp_path / "c") as s:
        first = s.gc(grace=GRACE)
        assert first["mark_written"]
        assert first["due_at"] - first["mark_at"] == pytest.approx(3600.0)
        assert not s.gc(grace=GRACE)["mark_written"]          # not due: left alone
        assert s.gc(grace=7200.0, dry_run=True)["due_at"] == first["due_at"]


def test_wrong_use(url, tmp_path):
    with snapstore.open(str(tmp_path / "local")) as local:
        with pytest.raises(InvalidArgumentError, match="compact"):
            local.gc()
    s = open_store(url, tmp_path / "c")
    s.checkpoint({"a": b"1"}, stream="s")
    s.checkpoint({"a": b"2"}, stream="s")
    with pytest.raises(InvalidArgumentError, match=r"gc\(\)"):
        s.compact()
    for bad in (0, 0.5, -1, float("inf"), float("nan"), "1", True):
        with pytest.raises(InvalidArgumentError):
            s.gc(grace=bad)
    with pytest.raises(InvalidArgumentError):
        s.gc(grace=GRACE, dry_run="yes")
    retained = s.retain("s", keep_last=1)          # deletes; no prune on an S3 store
    assert len(retained) == 1 and retained.compaction is None
    s.close()
    with pytest.raises(StoreClosedError):
        s.gc(grace=GRACE)
    with pytest.raises(StoreClosedError):
        s.gc(grace=GRACE, dry_run=True)


def test_a_damaged_mark_stops_commits_and_gc(url, tmp_path, s3):
    with open_store(url, tmp_path / "c") as s:
        s.checkpoint({"a": b"1"}, stream="s")
        s3.client().put_object(Bucket=s3.bucket, Key=s3.prefix + layout.GC_PENDING_KEY,
                               Body=b'{"at": 1')
        with pytest.raises(CorruptionError, match="gc/pending.json"):
            s.checkpoint({"a": b"2"}, stream="s")
        with pytest.raises(CorruptionError, match="gc/pending.json"):
            s.gc(grace=GRACE)
        s.refresh()                                         # reads go on
        assert [c.seq for c in s.checkpoints("s")] == [1]
        assert s.restore("s") == {"a": b"1"}


# ---- the writer guard -----------------------------------------------------------------------
def test_a_mark_made_during_a_commit_makes_it_write_the_reused_chunks_anew(url, tmp_path, s3):
    """The dangerous case: a commit deduplicates against chunks of a deleted checkpoint
    (still in its cache) whose segment gc marks while the commit uploads. Its guard sees the
    mark before the commit point and plans again: the chunks go into its own log."""
    a = state(seed=6)
    with open_store(url, tmp_path / "c") as s, open_store(url, tmp_path / "g") as g:
        g.gc(grace=GRACE)
        gone = s.checkpoint({"a": a}, stream="s")
        other = s.checkpoint({"a": b"other"}, stream="s")
        s.delete(gone.id)
        gone_segments = segments_of(s3, gone.id)
        time.sleep(OLD)
        backend = s._committer.backend
        real_wait = backend.wait_uploaded
        marks = []

        def mark_then_wait(*segments):
            if not marks:
                marks.append(g.gc(grace=GRACE))
            real_wait(*segments)
        backend.wait_uploaded = mark_then_wait
        back = s.checkpoint({"a": a}, stream="t")       # dedups against `gone`'s chunks
        backend.wait_uploaded = real_wait
        assert set(marks[0]["marked"]["segments"]) == gone_segments
        stats = s._committer.gc_guard.stats
        assert stats["replans"] == 1 and stats["dropped"] > 0
        assert back.bytes_new > MiB
        assert not segments_of(s3, back.id) & gone_segments     # nothing in a marked one
        wait_until_due(marks[0])
        assert set(g.gc(grace=GRACE)["deleted"]["segments"]) == gone_segments
        assert s.restore(back.id) == {"a": a.tobytes()}
    assert_restores(url, tmp_path / "empty", {back.id: {"a": a.tobytes()},
                                              other.id: {"a": b"other"}})


def test_a_chunk_written_by_two_writers_is_read_from_the_copy_gc_keeps(url, tmp_path, s3):
    """Two writers that never saw each other's chunks both store the same content; a cache
    that learnt the first copy must read the second once the first's segment is collected
    (the cache follows gc's mark: the entry moves to where the live checkpoint's object
    locates it)."""
    data = state(seed=8)
    with open_store(url, tmp_path / "a") as a, open_store(url, tmp_path / "b") as b:
        a.gc(grace=GRACE)
        first = a.checkpoint({"x": data}, stream="a")
        second = b.checkpoint({"x": data}, stream="b")    # b's cache lacks a's chunks
        assert second.bytes_new > MiB
        assert not segments_of(s3, first.id) & segments_of(s3, second.id)
        a.refresh()                                        # a's cache: the first copy
        first_segments = segments_of(s3, first.id)
        a.delete(first.id)
        time.sleep(OLD)
        report = b.gc(grace=GRACE, wait=True)
        assert set(report["deleted"]["segments"]) == first_segments
        assert not first_segments & segments_in_bucket(s3)
        assert segments_of(s3, second.id) <= segments_in_bucket(s3)
        a.refresh()
        assert a._committer.gc_guard.stats["relocated"] > 0
        assert a.restore(second.id) == {"x": data.tobytes()}


def test_a_marked_segment_a_later_commit_reaches_is_kept_and_not_counted_on(url, tmp_path,
                                                                          s3):
    """A commit whose writer read the mark before gc marked a segment it reuses may land
    after the mark (it is quick enough): gc then finds the segment reachable and keeps it.
    A later commit reusing those chunks must not count on that (the segment is still
    marked): its guard copies them into its own log."""
    data = state(seed=9)
    with open_store(url, tmp_path / "c") as s, open_store(url, tmp_path / "g") as g:
        g.gc(grace=GRACE)
        gone = s.checkpoint({"a": data}, stream="s")
        s.delete(gone.id)
        marked = segments_of(s3, gone.id)
        time.sleep(OLD)
        guard = s._committer.gc_guard
        real_deadline = guard.check_deadline
        marks = []

        def mark_then_deadline(ticket):
            if not marks:
                marks.append(g.gc(grace=GRACE))        # after the check, before the ref
            real_deadline(ticket)
        guard.check_deadline = mark_then_deadline
        late = s.checkpoint({"a": data}, stream="late")
        guard.check_deadline = real_deadline
        assert set(marks[0]["marked"]["segments"]) == marked
        assert segments_of(s3, late.id) == marked          # it reused the marked segment
        again = s.checkpoint({"a": data}, stream="again")
        assert guard.stats["copied"] > 0 and guard.stats["replans"] == 1
        assert not segments_of(s3, again.id) & marked
        assert again.bytes_new < 64 * KiB                   # copied, not stored again
        wait_until_due(marks[0])
        report = g.gc(grace=GRACE)
        assert report["deleted"]["segments"] == []          # `late` reaches it again
        assert marked <= segments_in_bucket(s3)
        assert_nothing_live_is_missing(s3, g)
    assert_restores(url, tmp_path / "empty", {late.id: {"a": data.tobytes()},
                                              again.id: {"a": data.tobytes()}})


def test_a_group_part_whose_segment_gc_deleted_and_forgot_does_not_commit(url, tmp_path, s3):
    """A group's parts are uploaded before its commit starts, so the commit's gc ticket does
    not cover them: a run with a small grace marks a part's segment, a run with a larger one
    deletes it (the group's objects, younger than twice that grace, stay), and the next
    mark no longer names it. The commit must find the segment gone (CommitConflict, nothing
    visible) instead of publishing a checkpoint that cannot be restored."""
    data = state(300 * KiB, seed=11)
    late = 7.0          # the group's objects stay younger than 2 x late throughout
    client = s3.client()

    def modified(key):
        return client.head_object(Bucket=s3.bucket, Key=s3.prefix + key)[
            "LastModified"].timestamp()
    with open_store(url, tmp_path / "c") as coord, open_store(url, tmp_path / "p") as part, \
            open_store(url, tmp_path / "g") as g:
        wait_until_due(g.gc(grace=GRACE))           # the store's first mark
        before = segments_in_bucket(s3)
        grp = coord.group("s", ["p"], timeout=600)
        part.stage(grp.id, "p", {"x": data})
        staged = segments_in_bucket(s3) - before
        assert staged
        newest = max(modified(layout.segment_key(n)) for n in staged)
        time.sleep(max(0.0, newest + 2 + layout.MODIFIED_RESOLUTION + 0.05 - time.time()))
        marking = g.gc(grace=2)
        assert staged <= set(marking["marked"]["segments"])
        assert marking["marked"]["groups"] == []
        wait_until_due(marking)
        deleting = g.gc(grace=late)
        assert staged <= set(deleting["deleted"]["segments"])
        assert deleting["deleted"]["groups"] == []
        wait_until_due(deleting)
        forgetting = g.gc(grace=late)
        assert not staged & set(forgetting["marked"]["segments"])
        assert forgetting["marked"]["groups"] == forgetting["deleted"]["groups"] == []
        assert not staged & segments_in_bucket(s3)
        with pytest.raises(CommitConflict, match="staged too long ago"):
            grp.commit()
        assert coord.checkpoints() == [] and g.checkpoints() == []
        part.stage(grp.id, "p", {"x": data})        # staged again, it commits
        info = grp.commit()
        assert_nothing_live_is_missing(s3, g)
    assert_restores(url, tmp_path / "fresh", {info.id: {"x": data.tobytes()}})


# ---- gc while writers write ------------------------------------------------------------------
def test_gc_runs_while_writers_commit_delete_and_recommit_old_content(url, tmp_path, s3):
    """Writers (threads, each its own cache) keep committing one of a few contents, so new
    checkpoints deduplicate against chunks of checkpoints they deleted, which gc marks and
    deletes meanwhile; they read other writers' streams too. gc runs over and over. After:
    no error, gc deleted something, writers had to avoid marked chunks, no live checkpoint
    names a deleted object, and every live one restores byte-exact from an empty cache."""
    contents = [state(256 * KiB, seed=10 + k) for k in range(3)]
    expected: dict = {}
    errors: list = []
    stop = threading.Event()
    guards = []
    totals = {"segments": 0, "checkpoints": 0, "runs": 0}

    def writer(w: int) -> None:
        rng = random.Random(w)
        try:
            with open_store(url, tmp_path / f"w{w}", refresh=0.1) as s:
                guards.append(s._committer.gc_guard)
                n = 0
                while not stop.is_set():
                    data = contents[rng.randrange(len(contents))].copy()
                    data[:8] = np.frombuffer(n.to_bytes(8, "little"), dtype=np.uint8)
                    n += 1
                    try:
                        info = s.checkpoint({"a": data}, stream=f"w{w}")
                    except CommitConflict:
                        continue        # took longer than grace / 2: allowed, retried
                    expected[info.id] = {"a": data.tobytes()}
                    assert s.restore(info.id) == expected[info.id]
                    live = [c.id for c in s.checkpoints(f"w{w}")]
                    if len(live) > 1:
                        s.delete_many(live[:-1])
                    others = [c.id for c in s.checkpoints() if c.id in expected]
                    if others:
                        pick = rng.choice(others)
                        try:
                            assert s.restore(pick) == expected[pick]
                        except CheckpointNotFound:
                            pass        # deleted by its writer meanwhile
        except BaseException as exc:        # noqa: BLE001 - reported by the test
            errors.append(f"writer {w}: {type(exc).__name__}: {exc}")

    def collector() -> None:
        try:
            with open_store(url, tmp_path / "gc") as g:
                while not stop.is_set():
                    report = g.gc(grace=GRACE)
                    totals["segments"] += len(report["deleted"]["segments"])
                    totals["checkpoints"] += len(report["deleted"]["checkpoints"])
                    totals["runs"] += 1
                    time.sleep(0.2)
        except BaseException as exc:        # noqa: BLE001
            errors.append(f"gc: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    threads.append(threading.Thread(target=collector))
    for t in threads:
        t.start()
    # 7 s, and on a loaded machine (where commits over grace / 2 are refused) until the
    # writers made the checkpoints asserted below, within 60 s
    started = time.monotonic()
    while time.monotonic() - started < 7 or (len(expected) <= 20
                                             and time.monotonic() - started < 60):
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert totals["segments"] > 0 and totals["checkpoints"] > 0, totals
    assert len(expected) > 20
    with open_store(url, tmp_path / "check") as s:
        live = assert_nothing_live_is_missing(s3, s)
        assert len(live) >= 3
    assert sorted(assert_restores(url, tmp_path / "empty", expected)) == sorted(live)
    # the dangerous case happened: writers had to avoid chunks gc marked or deleted
    avoided = sum(g.stats["dropped"] + g.stats["relocated"] + g.stats["replans"]
                  for g in guards)
    assert avoided > 0, [g.stats for g in guards]


# ---- the command line ------------------------------------------------------------------------
def test_cli_gc(url, tmp_path, s3):
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg")}
    with open_store(url, tmp_path / "c") as s:
        gone = s.checkpoint({"a": b"gone"}, stream="s")
        s.checkpoint({"a": b"kept"}, stream="s")
        s.delete(gone.id)
    old_at = time.time() + OLD
    local = tmp_path / "local"
    snapstore.open(str(local)).close()
    cli_error(2, "gc", str(local), needles=("compact",))
    time.sleep(max(0.0, old_at - time.time()))
    text = cli_ok("gc", url, "--grace", "1", "--dry-run", env=env).stdout
    assert text.startswith("gc: would delete 0 segments, 0 checkpoint objects (0 B); would "
                           "leave marked 1 segment, 1 checkpoint object"), text
    assert "next deletion" in text
    report = cli_json("gc", url, "--grace", "1", env=env)
    assert report["mark_written"] and report["marked"]["checkpoints"] == [gone.id]
    # the command's process assumed the real default before this first mark: an hour
    assert report["due_at"] - report["mark_at"] == pytest.approx(3600.0)
