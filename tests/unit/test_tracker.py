"""Trackers and asynchronous checkpoints (snapstore/capture/: tracker, persister, staging)
through the public API."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import snapstore
from snapstore.engine.commit import Committer
from snapstore.errors import InvalidArgumentError, SnapstoreError, StoreClosedError


def head_moves_while_the_next_job_waits(monkeypatch, other, stream, buffers):
    """Makes the persister's next commit of `stream` find its head moved meanwhile: `other`
    (another writer) checkpoints `buffers` there just before it, so that job fails with
    CommitConflict (a capture that finds the head moved before it is taken builds on it)."""
    real = Committer.commit
    armed = [True]

    def commit(self, name, *args, **kwargs):
        if armed[0] and name == stream and threading.current_thread().name == "snapstore-persist":
            armed[0] = False
            other.checkpoint(buffers, stream=stream)
        return real(self, name, *args, **kwargs)
    monkeypatch.setattr(Committer, "commit", commit)

pytest.importorskip("snapstore.capture.dirty")

PAGE = 4096
MODES = ["auto", "hash", "shadow", "full"]


def touch(a: np.ndarray, rng, pages: int) -> None:
    flat = a.reshape(-1).view(np.uint8)
    n = flat.size // PAGE
    for p in rng.choice(n, size=min(pages, n), replace=False):
        flat[p * PAGE:(p + 1) * PAGE] = rng.integers(0, 256, PAGE, dtype=np.uint8)


@pytest.fixture
def store(tmp_path):
    with snapstore.open(tmp_path / "s", durability="none", max_chain=4) as s:
        yield s


@pytest.mark.parametrize("mode", MODES)
def test_tracker_checkpoints_restore_exactly(store, mode):
    rng = np.random.default_rng(1)
    a = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    b = np.zeros(5000, np.uint8)            # not a multiple of the page size
    expected = {}
    with store.track({"a": a, "b": b}, stream="t", mode=mode) as tr:
        assert tr.mode in ("uffd", "hash", "shadow", "full")
        assert tr.reason
        for step in range(10):
            touch(a, rng, 5)
            b[step * 7] = step + 1
            info = tr.checkpoint(meta={"step": step})
            expected[info.id] = (a.tobytes(), b.tobytes())
            assert info.chain_length < 4
    for cid, (ea, eb) in expected.items():
        got = store.restore(cid)
        assert got["a"] == ea and got["b"] == eb
    assert store.verify()["ok"]


@pytest.mark.parametrize("mode", ["auto", "hash", "shadow"])
def test_incremental_checkpoints_store_about_what_changed(store, mode):
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, 4 << 20, dtype=np.uint8)
    with store.track({"a": a}, stream="t", mode=mode) as tr:
        tr.checkpoint()
        touch(a, rng, 10)
        info = tr.checkpoint()
    assert info.kind == "incremental"
    assert info.bytes_new < 20 * PAGE


@pytest.mark.parametrize("use_async", [False, True])
def test_hash_tracker_through_dense_and_sparse_intervals(store, use_async):
    """A "hash" tracker skips its pass after a dense interval (capture/dirty.py): every
    checkpoint still restores exactly, an unchanged one and a sparse one after dense ones add
    only what changed (the whole buffer is copied once, its unchanged chunks deduplicated),
    and a sparse one after that is found by the pass again."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal(1 << 20).astype(np.float32)      # 4 MiB, past DENSE_MIN_BYTES
    expected = {}
    with store.track({"a": a}, stream="t", mode="hash") as tr:
        def take(**kw):
            if use_async:
                return tr.checkpoint_async(**kw).result()
            return tr.checkpoint(**kw)
        take()
        steps = ["dense", "dense", "none", "sparse", "sparse", "dense", "one", "dense",
                 "sparse", "dense", "dense"]
        for step in steps:
            if step == "dense":                     # every element (touch() left NaNs)
                a.view(np.uint32)[:] += 1
            elif step == "sparse":
                touch(a, rng, 3)
            elif step == "one":
                a.view(np.uint8)[12345] ^= 1
            info = take(meta={"step": step})
            expected[info.id] = a.tobytes()
            if step in ("none", "sparse", "one"):
                assert info.bytes_new < 8 * PAGE + 4096, (step, info.bytes_new)
    for cid, want in expected.items():
        assert store.restore(cid)["a"] == want
    assert store.verify()["ok"]


def test_hash_capture_after_a_failed_capture_in_a_dense_interval(tmp_path, monkeypatch):
    """A capture that fails after its copy was noted leaves the detector's baseline at bytes
    no checkpoint holds; the next capture diffs against the stream's head in full, and the
    detector's notion of what changed (relative to the failed copy) must not narrow it."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal(1 << 20).astype(np.float32)
    with snapstore.open(tmp_path / "s", durability="none") as s, \
            snapstore.open(tmp_path / "s", durability="none") as other:
        s.checkpoint_async({"a": a}, stream="t").result()
        a *= np.float32(1.001)
        s.checkpoint_async({"a": a}, stream="t").result()     # dense: next pass skipped
        head_moves_while_the_next_job_waits(monkeypatch, other, "t", {"a": np.zeros_like(a)})
        a *= np.float32(1.001)
        with pytest.raises(SnapstoreError, match="head"):
            s.checkpoint_async({"a": a}, stream="t").result()  # copied, noted, then refused
        a.view(np.uint8)[777] ^= 1                    # one page against the failed copy
        info = s.checkpoint_async({"a": a}, stream="t").result()
        assert s.restore(info.id)["a"] == a.tobytes()


def test_async_snapshot_is_taken_when_the_call_returns(store):
    """Writes after checkpoint_async returns must not leak into that checkpoint."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, 2 << 20, dtype=np.uint8)
    futures = []
    with store.track({"a": a}, stream="t") as tr:
        for step in range(12):
            touch(a, rng, 8)
            futures.append((tr.checkpoint_async(meta={"step": step}), a.tobytes()))
            a[:PAGE] = 0xEE               # mutate at once, before the future resolves
    ids = [f.result().id for f, _ in futures]
    assert ids == sorted(ids)            # committed in the order taken
    for f, expected in futures:
        assert store.restore(f.result().id)["a"] == expected
    parents = [store.get(i).parent for i in ids[1:]]
    assert parents == ids[:-1]


def test_back_pressure_and_oversized_capture(tmp_path):
    """A 1 MiB staging arena: a 4 MiB first capture goes synchronous, later ones wait."""
    rng = np.random.default_rng(4)
    a = rng.integers(0, 256, 4 << 20, dtype=np.uint8)
    with snapstore.open(tmp_path / "s", durability="none", staging_bytes=1 << 20) as s:
        with s.track({"a": a}, stream="t", mode="hash") as tr:
            first = tr.checkpoint_async()
            assert first.done()              # larger than the arena: persisted in the call
            futures = []
            for _ in range(20):
                touch(a, rng, 60)            # 240 KiB per capture: a few fit at once
                futures.append((tr.checkpoint_async(), a.tobytes()))
            for f, expected in futures:
                assert s.restore(f.result().id)["a"] == expected


def test_a_failed_async_checkpoint_fails_the_ones_built_on_it(store, monkeypatch):
    rng = np.random.default_rng(5)
    a = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    real = Committer.commit
    calls = {"n": 0}
    gate = threading.Event()

    def flaky(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            gate.wait(5)
            raise SnapstoreError("injected failure")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Committer, "commit", flaky)
    with store.track({"a": a}, stream="t", mode="hash") as tr:
        ok = tr.checkpoint()
        touch(a, rng, 3)
        bad = tr.checkpoint_async()
        touch(a, rng, 3)
        dependent = tr.checkpoint_async()
        gate.set()
        with pytest.raises(SnapstoreError, match="injected"):
            bad.result()
        with pytest.raises(SnapstoreError, match="earlier checkpoint"):
            dependent.result()
        assert [c.id for c in store.checkpoints("t")] == [ok.id]
        touch(a, rng, 3)
        again = tr.checkpoint()             # recovers with a full diff against the head
        assert store.restore(again.id)["a"] == a.tobytes()
        assert again.parent == ok.id


def test_tracked_stream_is_owned_by_its_tracker(store):
    a = np.zeros(3 * PAGE, np.uint8)
    tr = store.track({"a": a}, stream="t")
    with pytest.raises(InvalidArgumentError):
        store.checkpoint({"a": a}, stream="t")
    with pytest.raises(InvalidArgumentError):
        store.checkpoint_async({"a": a}, stream="t")
    with pytest.raises(InvalidArgumentError):
        store.track({"a": a}, stream="t")
    tr.checkpoint()
    tr.close()
    tr.close()                              # idempotent
    with pytest.raises(StoreClosedError):
        tr.checkpoint()
    a[0] = 1
    info = store.checkpoint({"a": a}, stream="t")   # the stream is free again
    assert store.restore(info.id)["a"] == a.tobytes()


def test_bad_tracker_arguments(store):
    with pytest.raises(InvalidArgumentError):
        store.track({"a": bytearray(10)}, mode="magic")
    with pytest.raises(TypeError):
        store.track({"a": 12})
    with pytest.raises(TypeError):
        store.track({"a": bytearray(10)}).checkpoint(meta=object())


def test_store_checkpoint_async_without_tracker(store):
    rng = np.random.default_rng(6)
    x = rng.integers(0, 256, 2 << 20, dtype=np.uint8)
    pending = []
    for step in range(6):
        touch(x, rng, 4)
        pending.append((store.checkpoint_async({"x": x}, stream="imp"), x.tobytes()))
    store.flush()
    assert all(f.done() for f, _ in pending)
    infos = [f.result() for f, _ in pending]
    assert all(i.chain_length < 4 for i in infos)      # rebased to full at max_chain
    assert all(i.bytes_new < 10 * PAGE for i in infos[1:])
    for f, expected in pending:
        assert store.restore(f.result().id)["x"] == expected
    touch(x, rng, 4)
    info = store.checkpoint({"x": x}, stream="imp")     # sync after async on one stream
    assert store.restore(info.id)["x"] == x.tobytes()
    new = rng.integers(0, 256, 2 << 20, dtype=np.uint8)  # other memory, same name
    f = store.checkpoint_async({"x": new}, stream="imp")
    assert store.restore(f.result().id)["x"] == new.tobytes()


def test_close_flushes_pending_checkpoints(tmp_path):
    rng = np.random.default_rng(7)
    a = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    s = snapstore.open(tmp_path / "s")
    tr = s.track({"a": a}, stream="t")
    futures = []
    for _ in range(5):
        touch(a, rng, 4)
        futures.append((tr.checkpoint_async(), a.tobytes()))
    s.close()
    assert all(f.done() and f.exception() is None for f, _ in futures)
    with snapstore.open(tmp_path / "s") as s:
        for f, expected in futures:
            assert s.restore(f.result().id)["a"] == expected


def test_readonly_store_cannot_track(tmp_path):
    snapstore.open(tmp_path / "s").close()
    with snapstore.open(tmp_path / "s", readonly=True) as s:
        with pytest.raises(snapstore.errors.ReadOnlyError):
            s.track({"a": bytearray(10)})


def test_deleting_the_head_of_a_tracked_stream_is_refused(store):
    a = np.zeros(4 * PAGE, np.uint8)
    with store.track({"a": a}, stream="t") as tr:
        first = tr.checkpoint()
        a[0] = 1
        head = tr.checkpoint()
        with pytest.raises(InvalidArgumentError):
            store.delete(head.id)
        store.delete(first.id)               # not the head: fine, the chain absorbs it
        a[PAGE] = 2
        nxt = tr.checkpoint()
        assert store.restore(nxt.id)["a"] == a.tobytes()


def test_deleting_the_head_of_an_async_stream_rebases_the_next_capture(store):
    x = np.zeros(8 * PAGE, np.uint8)
    first = store.checkpoint_async({"x": x}, stream="imp").result()
    x[0] = 1
    head = store.checkpoint_async({"x": x}, stream="imp").result()
    store.delete(head.id)
    x[PAGE] = 2
    nxt = store.checkpoint_async({"x": x}, stream="imp").result()
    assert nxt.parent == first.id
    assert store.restore(nxt.id)["x"] == x.tobytes()


def test_staging_arena_is_a_fifo_ring():
    from snapstore.capture.staging import StagingArena
    arena = StagingArena(1 << 20)
    a, ma = arena.alloc(600 << 10)
    b, mb = arena.alloc(300 << 10)
    assert (a, b) == (0, 600 << 10)
    ma[:3] = b"abc"
    arena.free(a)
    c, mc = arena.alloc(500 << 10)          # wraps to the front: [0, 500 KiB) is free
    assert c == 0 and len(mc) == 500 << 10
    got = []
    t = threading.Thread(target=lambda: got.append(arena.alloc(400 << 10)[0]))
    t.start()                               # no room until b is freed: back-pressure
    t.join(0.2)
    assert t.is_alive()
    arena.free(b)
    t.join(5)
    assert got == [500 << 10]
    with pytest.raises(ValueError):
        arena.alloc(2 << 20)
    with pytest.raises(AssertionError, match="not taken"):     # also under python -O
        arena.free(b)                       # freed already
    with pytest.raises(AssertionError, match="not taken"):
        arena.free(c, owner="someone else")
    assert arena.in_use == (500 + 400) << 10
    arena.free(c)
    arena.free(got[0])
    assert arena.in_use == 0
    del ma, mb, mc
    arena.close()
    arena.close()                           # idempotent


def test_staging_region_freed_early_is_reused_only_after_the_older_ones():
    """A capture interrupted after it took its region frees it at once, while older regions
    (of queued jobs) are still in use: its memory must not be handed out before theirs is
    freed, or a new capture could be placed over one still being committed."""
    from snapstore.capture.staging import StagingArena
    arena = StagingArena(1 << 20)
    old, older_memory = arena.alloc(400 << 10, owner="queued job")
    new, _ = arena.alloc(400 << 10, owner="interrupted")
    assert arena.free_taken_by("interrupted") is True
    assert arena.free_taken_by("interrupted") is False     # once
    assert arena.in_use == 400 << 10
    assert arena.alloc(400 << 10, wait=False) is None      # [400, 800) KiB is not free yet
    older_memory[:] = b"\x07" * (400 << 10)
    arena.free(old, "queued job")
    assert arena.in_use == 0
    start, _ = arena.alloc(1 << 20, wait=False)             # all of it is free again
    assert start == 0
    arena.close()


@pytest.mark.parametrize("point", ["after_staging_alloc", "after_job_queued"])
@pytest.mark.parametrize("tracked", [True, False])
def test_an_interrupt_in_checkpoint_async_leaks_nothing(tmp_path, monkeypatch, point, tracked):
    """Ctrl-C lands between any two bytecodes of checkpoint_async(): right after the staging
    region was taken (the capture is dropped and its region freed) or right after its job was
    queued, before the worker was started or woken (the job commits as usual). Either way
    later checkpoints resolve, restore exactly, and close() returns (it used to hang: the
    region leaked, or the worker slept beside a queued job)."""
    from snapstore.capture import persister as persister_mod
    real = persister_mod.crashpoint
    armed, hit = [], []

    def interrupted(name: str) -> None:
        real(name)
        if name == point and armed and not hit:
            hit.append(name)
            raise KeyboardInterrupt
    monkeypatch.setattr(persister_mod, "crashpoint", interrupted)
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, 1 << 20, dtype=np.uint8)
    with snapstore.open(tmp_path / "s", durability="none") as s:
        tr = s.track({"a": a}, stream="t") if tracked else None

        def checkpoint_async():
            return tr.checkpoint_async() if tracked else s.checkpoint_async({"a": a}, stream="t")
        first = checkpoint_async().result(timeout=30)
        a[4096] ^= 1
        armed.append(True)
        with pytest.raises(KeyboardInterrupt):
            checkpoint_async()
        assert hit == [point]
        states = []
        for i in range(3):
            a[i * 8192] ^= 0xFF
            states.append((checkpoint_async(), a.tobytes()))
        for future, expected in states:
            info = future.result(timeout=30)
            assert s.restore(info.id)["a"] == expected
        s.flush()
        assert s.stats()["staging_in_use_bytes"] == 0
        history = s.checkpoint_ids(stream="t")
        # the interrupted capture committed iff its job was queued
        assert len(history) == 1 + 3 + (point == "after_job_queued")
        assert first.id in history
        if tr is not None:
            tr.close()


def test_retain_deleting_the_head_of_an_async_stream_with_pending_jobs(store):
    """retain() may delete the head of a stream whose checkpoint_async jobs are still pending:
    it must let them land first, not wait for them while holding the writer lock (which the
    worker needs to commit them)."""
    rng = np.random.default_rng(8)
    x = rng.integers(0, 256, 8 << 20, dtype=np.uint8)
    store.checkpoint_async({"x": x}, stream="imp").result()
    pending = []
    for _ in range(3):
        touch(x, rng, 64)
        pending.append(store.checkpoint_async({"x": x}, stream="imp"))
    result = []
    t = threading.Thread(target=lambda: result.append(
        store.retain("imp", keep_last=0, keep_every=100)), daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "retain() deadlocked with the persister"
    assert all(f.done() for f in pending)
    assert len(result[0]) >= 1
    assert all(c.id not in result[0] for c in store.checkpoints("imp"))


@pytest.mark.timeout(120)      # the failure it guards against was a hang
def test_async_checkpoints_from_many_threads_restore_exactly(tmp_path):
    """Threads sharing a Store, each checkpoint_async-ing a stream of its own, buffers of
    different sizes (so captures finish staging in another order than they began), through an
    arena small enough to wrap around many times: every checkpoint holds its bytes. Regions
    were freed in queue order, not in the order taken: the worker died on an assertion (every
    later future pending forever), or under python -O overwrote staged bytes (wrong
    checkpoints, no error)."""
    sizes = [4 << 20, 4096, 1 << 20, 300_001]
    expected, lock = {}, threading.Lock()
    with snapstore.open(tmp_path / "s", durability="none", staging_bytes=12 << 20) as s:
        start = threading.Barrier(len(sizes))

        def writer(n: int) -> None:
            rng = np.random.default_rng(n)
            buf = rng.integers(0, 256, sizes[n], dtype=np.uint8)
            start.wait()
            for k in range(15):
                buf[rng.integers(0, buf.size, 1 + k * 50)] += 1
                want = buf.tobytes()
                future = s.checkpoint_async({"d": buf}, stream=f"s{n}")
                with lock:
                    expected[future] = want
        threads = [threading.Thread(target=writer, args=(n,)) for n in range(len(sizes))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for future, want in expected.items():
            assert s.restore(future.result(timeout=60).id)["d"] == want


def test_an_async_capture_builds_on_the_head_another_writer_moved_before_it(store):
    """As checkpoint() does: the head another writer (or a delete) moved since the stream's
    last capture is the one a capture builds on, every buffer diffed against it (regression,
    a helper's review: it failed with CommitConflict, and so did the captures queued behind
    it, unless one of its buffers was new)."""
    buf = bytearray(np.random.default_rng(3).integers(0, 256, 20000, dtype=np.uint8))
    store.checkpoint_async({"w": buf}, stream="z").result(timeout=60)
    with snapstore.open(store.path) as other:
        moved = other.checkpoint({"w": b"other"}, stream="z")
    buf[0] ^= 1
    after = store.checkpoint_async({"w": buf}, stream="z").result(timeout=60)
    assert after.parent == moved.id and store.restore(after.id)["w"] == bytes(buf)
    store.delete(after.id)                  # a delete moves it back
    buf[1] ^= 1
    again = store.checkpoint_async({"w": buf}, stream="z").result(timeout=60)
    assert again.parent == moved.id and store.restore(again.id)["w"] == bytes(buf)
    buf[2] ^= 1
    last = store.checkpoint_async({"w": buf}, stream="z").result(timeout=60)
    assert last.parent == again.id and store.restore(last.id)["w"] == bytes(buf)


def test_an_async_capture_whose_head_moves_while_it_waits_is_a_commit_conflict(store,
                                                                                 monkeypatch):
    """As for a plain commit whose head moved meanwhile: CommitConflict, which retry loops
    catch; the next capture diffs in full against the new head and commits."""
    from snapstore.errors import CommitConflict
    buf = bytearray(np.random.default_rng(3).integers(0, 256, 20000, dtype=np.uint8))
    first = store.checkpoint_async({"w": buf}, stream="z").result(timeout=60)
    with snapstore.open(store.path) as other:
        head_moves_while_the_next_job_waits(monkeypatch, other, "z", {"w": b"other"})
        buf[0] ^= 1
        with pytest.raises(CommitConflict) as info:
            store.checkpoint_async({"w": buf}, stream="z").result(timeout=60)
        moved = other.latest("z")
    assert (info.value.stream, info.value.expected, info.value.found) == \
        ("z", first.id, moved.id)
    again = store.checkpoint_async({"w": buf}, stream="z").result(timeout=60)
    assert again.parent == moved.id and store.restore(again.id)["w"] == bytes(buf)


# ---- a capture that diffs against the head must leave the detector's baseline at what the
# store holds (regressions: a page whose bytes went back to those the detector last saw was
# never stored again, and every later checkpoint restored other bytes, no error)
@pytest.mark.parametrize("how", ["implicit", "hash", "shadow", "auto"])
def test_after_a_failed_capture_a_page_back_to_its_failed_bytes_is_stored(tmp_path, how,
                                                                          monkeypatch):
    page = 100
    with snapstore.open(tmp_path / "s", durability="none") as s, \
            snapstore.open(tmp_path / "s", durability="none") as other:
        a = np.random.default_rng(5).standard_normal(1 << 20).astype(np.float32)   # 4 MiB
        tr = None if how == "implicit" else s.track({"a": a}, stream="t", mode=how)

        def take():
            return (tr.checkpoint_async() if tr else s.checkpoint_async({"a": a}, stream="t"))
        take().result()
        a *= np.float32(1.001)
        take().result()                  # dense: a hash detector skips its next pass
        a *= np.float32(1.001)
        lost = a.view(np.uint8)[page * PAGE:(page + 1) * PAGE].copy()
        moved = a.copy()
        moved.view(np.uint8)[page * PAGE:(page + 1) * PAGE] = 0
        head_moves_while_the_next_job_waits(monkeypatch, other, "t", {"a": moved})
        with pytest.raises(snapstore.errors.CommitConflict):
            take().result()
        a.view(np.uint8)[page * PAGE:(page + 1) * PAGE] = 0
        assert s.restore(take().result().id)["a"] == a.tobytes()    # diffed against the head
        a.view(np.uint8)[page * PAGE:(page + 1) * PAGE] = lost      # back to the failed copy's
        assert s.restore(take().result().id)["a"] == a.tobytes()
        a.view(np.uint8)[0] ^= 1
        assert s.restore(take().result().id)["a"] == a.tobytes()
        if tr:
            tr.close()


@pytest.mark.parametrize("mode", ["hash", "shadow", "auto"])
def test_a_write_between_dirty_and_the_head_diff_is_stored_later(tmp_path, mode, monkeypatch):
    # the first capture of a tracker on a stream with a head diffs against the head after
    # dirty() took its baseline; a page that changes in between (to the head's bytes) and
    # back must be stored once it is back
    from snapstore.engine import writer
    with snapstore.open(tmp_path / "s", durability="none") as s:
        a = np.zeros(1 << 20, np.uint8)
        s.checkpoint({"a": a}, stream="t")                      # head: page 30 is zeros
        a[30 * PAGE] = 1                                         # dirty() sees 1
        real = writer.plan_buffers

        def plan_buffers(*args, **kwargs):
            a[30 * PAGE] = 0                                     # the head's byte again
            monkeypatch.setattr(writer, "plan_buffers", real)
            return real(*args, **kwargs)
        monkeypatch.setattr(writer, "plan_buffers", plan_buffers)
        with s.track({"a": a}, stream="t", mode=mode) as tr:
            assert s.restore(tr.checkpoint().id)["a"] == a.tobytes()
            a[30 * PAGE] = 1                                     # what dirty() saw, again
            assert s.restore(tr.checkpoint().id)["a"] == a.tobytes()
            assert s.restore(tr.checkpoint().id)["a"] == a.tobytes()


def test_a_checkpoint_taken_in_a_done_callback_lands(tmp_path):
    # regression: the worker resolved a future before it freed the job's staging region, so
    # a capture in the callback that needed that room waited for the worker: a hang
    with snapstore.open(tmp_path / "s", durability="none", staging_bytes=1 << 20) as s:
        a = np.zeros(600 << 10, np.uint8)
        b = np.ones(600 << 10, np.uint8)
        chained, errors = [], []

        def again(_):
            try:
                chained.append(s.checkpoint_async({"b": b}, stream="other"))
            except Exception as exc:    # noqa: BLE001 - asserted below
                errors.append(exc)
        s.checkpoint_async({"a": a}, stream="t").add_done_callback(again)
        s.flush()
        assert not errors and chained
        assert s.restore(chained[0].result(timeout=60).id)["b"] == b.tobytes()


def test_tracker_checkpoint_in_a_done_callback_is_refused_not_a_hang(tmp_path):
    with snapstore.open(tmp_path / "s", durability="none") as s:
        a = np.zeros(1 << 16, np.uint8)
        with s.track({"a": a}, stream="t") as tr:
            errors = []

            def wait_inside(_):
                try:
                    tr.checkpoint()
                except SnapstoreError as exc:
                    errors.append(exc)
            tr.checkpoint_async().add_done_callback(wait_inside)
            s.flush()
            assert len(errors) == 1 and "checkpoint_async() in a callback" in str(errors[0])


@pytest.mark.parametrize("closing", ["store", "tracker"])
def test_close_during_a_capture_larger_than_staging_never_breaks_it(tmp_path, closing):
    # regression: a capture committed from the live buffers (more than the arena holds) was
    # not counted as pending; close() released the buffers under it: raw ValueError
    outcomes = set()
    for i in range(12):
        s = snapstore.open(tmp_path / f"s{i}", durability="none", staging_bytes=1 << 20)
        a = np.zeros(4 << 20, np.uint8)
        tr = s.track({"a": a}, stream="t", mode="hash")
        tr.checkpoint()
        a[::PAGE] = 1
        out = {}

        def capture():
            try:
                out["info"] = tr.checkpoint_async().result()
            except Exception as exc:    # noqa: BLE001 - asserted below
                out["error"] = exc
        t = threading.Thread(target=capture)
        t.start()
        threading.Event().wait(0.002 * i)
        (s.close if closing == "store" else tr.close)()
        t.join(60)
        assert not t.is_alive()
        error = out.get("error")
        assert error is None or isinstance(error, StoreClosedError), repr(error)
        outcomes.add("ok" if error is None else "closed")
        s.close()
        if error is None:
            with snapstore.open(tmp_path / f"s{i}", readonly=True) as r:
                assert r.restore(out["info"].id)["a"] == a.tobytes()
    assert "ok" in outcomes


@pytest.mark.parametrize("how", ["checkpoint_async", "track"])
def test_a_capture_that_changed_most_bytes_is_a_full_checkpoint(tmp_path, how):
    """The checkpoint-level full_threshold holds on the capture paths too: a state whose
    large buffer changed completely beside an unchanged small one is "full" (chain 0), as
    checkpoint() makes it, and writes no more than the changed bytes (its deltas are rebased
    by manifest); one that changed little stays incremental."""
    rng = np.random.default_rng(5)
    big, small = rng.random(1 << 17), np.zeros(10)           # 1 MiB + 80 bytes
    with snapstore.open(str(tmp_path / "s")) as s:
        if how == "track":
            tracker = s.track({"big": big, "small": small}, stream="m")
            take = tracker.checkpoint
        else:
            def take():
                return s.checkpoint_async({"big": big, "small": small}, stream="m").result()
        take()
        big[:] = rng.random(big.size)
        info = take()
        assert (info.kind, info.chain_length) == ("full", 0)
        assert info.bytes_new < big.nbytes * 1.05
        big[:4096] = 0.5                                     # a few pages
        info2 = take()
        assert (info2.kind, info2.chain_length) == ("incremental", 1)
        assert s.restore(info.id)["big"] != s.restore(info2.id)["big"]
        assert s.restore(info2.id) == {"big": big.tobytes(), "small": small.tobytes()}
        s.delete(info.id)                                    # the full one stands alone
        assert s.restore(info2.id)["big"] == big.tobytes()
        if how == "track":
            tracker.close()
