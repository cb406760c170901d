"""The keyframe cache (engine/keyframes.py, open(keyframe_cache_bytes=)): delta_chunks' bases
kept in memory between checkpoints.

What holds:
  * the cache against a plain dict model (hypothesis): every read gives the chunk's true
    bytes or its read-back, never other bytes; it never holds more than its bound; entries
    used in this checkpoint or the one before are never evicted for new ones;
  * through the store: a dense checkpoint after the first codes against cached bases with no
    read of a base from disk, and stores exactly the records a store without the cache
    stores; every checkpoint restores exact; a state larger than the cache, renewed
    keyframes, the caller's array mutated after the call, a base on a disk that fails reads,
    bad option values, readonly and closed stores.
"""
from __future__ import annotations

import errno
import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine import reader as engine_reader
from snapstore.engine import keyframes
from snapstore.engine.keyframes import DEFAULT_MAX_BYTES, KeyframeCache
from snapstore.errors import InvalidArgumentError, InvalidArgumentTypeError

from faulty_backend import FaultyBackend

N = 256 * 1024          # float32 items: 1 MiB, 16 chunks of 64 KiB


def drift(a, rng, rel=0.01):
    return (a * (1 + rng.normal(0, rel, a.shape))).astype(a.dtype)


def weights(rng, n=N, dtype=np.float32):
    return rng.normal(0, 0.02, n).astype(dtype)


def open_store(path, **options):
    options.setdefault("durability", "none")
    return snapstore.open(path, **{"delta_chunks": True, **options})


def chunk_records(store) -> set:
    """(chunk id, codec, stored length, base) of every chunk: what the records hold."""
    with store._committer.read() as r:
        return {(cid, e.codec, e.stored_len, e.base) for cid, e in r.chunks()}


@pytest.fixture
def base_reads(monkeypatch):
    """The chunk ids the writers read back from disk as bases (ChunkReader.read_many)."""
    seen: list = []
    real = engine_reader.ChunkReader.read_many

    def counting(self, chunk_ids):
        seen.extend(chunk_ids)
        return real(self, chunk_ids)
    monkeypatch.setattr(engine_reader.ChunkReader, "read_many", counting)
    return seen


# ---- the cache alone -------------------------------------------------------------------------

def _reader(truth: dict, asked: list):
    def read_back(ids):
        asked.append(list(ids))
        return [truth.get(i) for i in ids]
    return read_back


def test_reads_hit_what_is_held_and_read_back_only_the_rest():
    truth = {bytes([i]) * 32: bytes([i]) * 100 for i in range(4)}
    cache = KeyframeCache(1000)
    asked: list = []
    ids = list(truth)
    assert cache.read(ids[:2], _reader(truth, asked)) == [truth[i] for i in ids[:2]]
    assert asked == [ids[:2]]
    assert cache.read(ids, _reader(truth, asked)) == [truth[i] for i in ids]
    assert asked[1] == ids[2:]                     # the two held were not asked for again
    assert cache.stats()["keyframe_cache_hits"] == 2
    assert cache.stats()["keyframe_cache_misses"] == 4
    assert cache.nbytes == 400


def test_a_chunk_that_cannot_be_read_is_none_and_not_kept():
    cache = KeyframeCache(1000)
    assert cache.read([b"x" * 32], lambda ids: [None]) == [None]
    assert len(cache) == 0 and cache.nbytes == 0
    assert cache.read([], lambda ids: pytest.fail("nothing to read")) == []


def test_offer_keeps_a_copy_not_the_callers_memory():
    cache = KeyframeCache(1000)
    data = bytearray(b"a" * 64)
    cache.offer(b"k" * 32, memoryview(data))
    data[:] = b"b" * 64
    assert cache.read([b"k" * 32], lambda ids: pytest.fail("held")) == [b"a" * 64]


def test_a_new_keyframe_takes_the_place_and_memory_of_the_one_it_replaces():
    cache = KeyframeCache(1000)
    cache.offer(b"o" * 32, b"o" * 64)
    held = cache.read([b"o" * 32], lambda ids: pytest.fail("held"))[0]
    cache.offer(b"n" * 32, b"n" * 64, replaces=b"o" * 32)
    assert b"o" * 32 not in cache and cache.nbytes == 64
    got = cache.read([b"n" * 32], lambda ids: pytest.fail("held"))[0]
    assert got == b"n" * 64 and got is held          # the same memory, no new pages
    cache.offer(b"m" * 32, b"m" * 32, replaces=b"n" * 32)     # another length: new memory
    assert cache.nbytes == 32 and b"n" * 32 not in cache
    cache.offer(b"m" * 32, b"m" * 32, replaces=b"m" * 32)     # itself: nothing changes
    assert cache.nbytes == 32 and b"m" * 32 in cache


def test_nothing_larger_than_the_bound_and_a_zero_bound_keeps_nothing():
    cache = KeyframeCache(100)
    cache.offer(b"a" * 32, b"a" * 101)
    assert len(cache) == 0
    zero = KeyframeCache(0)
    zero.offer(b"a" * 32, b"a")
    assert zero.read([b"a" * 32], lambda ids: [b"a"]) == [b"a"]
    assert len(zero) == 0 and zero.nbytes == 0


def test_entries_used_in_this_or_the_last_checkpoint_stay_older_ones_go_first():
    cache = KeyframeCache(300)
    ids = [bytes([i]) * 32 for i in range(5)]
    for i in ids[:3]:
        cache.offer(i, i[:1] * 100)
    cache.offer(ids[3], b"x" * 100)                 # full: all three are of this checkpoint
    assert ids[3] not in cache
    cache.begin_checkpoint()
    cache.read([ids[0]], lambda _: pytest.fail("held"))
    cache.offer(ids[3], b"x" * 100)                 # the others were used one checkpoint ago
    assert ids[3] not in cache
    cache.begin_checkpoint()                        # now ids 1, 2 are two checkpoints old
    cache.offer(ids[3], b"x" * 100)
    assert ids[3] in cache and ids[1] not in cache and ids[2] in cache   # LRU first
    cache.offer(ids[4], b"y" * 100)
    assert ids[4] in cache and ids[2] not in cache and ids[0] in cache
    assert cache.nbytes == 300
    cache.clear()
    assert cache.nbytes == 0 and len(cache) == 0


def test_two_threads_reading_at_once_get_the_true_bytes():
    truth = {i.to_bytes(32, "little"): os.urandom(256) for i in range(200)}
    ids = list(truth)
    cache = KeyframeCache(256 * 120)
    errors: list = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(200):
            pick = [ids[int(k)] for k in rng.integers(0, len(ids), 8)]
            got = cache.read(pick, lambda want: [truth[i] for i in want])
            if got != [truth[i] for i in pick]:
                errors.append(pick)
            if rng.random() < 0.1:
                cache.begin_checkpoint()
    threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert cache.nbytes <= cache.max_bytes


OPS = st.lists(st.one_of(
    st.tuples(st.just("read"), st.lists(st.integers(0, 7), max_size=4)),
    st.tuples(st.just("offer"), st.integers(0, 7), st.one_of(st.none(), st.integers(0, 7))),
    st.tuples(st.just("begin")),
    st.tuples(st.just("unreadable"), st.integers(0, 7))), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=OPS, bound=st.integers(0, 6))
def test_the_cache_against_a_dict_model(ops, bound):
    """Chunk k's bytes are k's (its length varies with k); each op against a model of the
    truth: reads give the true bytes (None where unreadable), the bound holds, and what was
    used this checkpoint or the last is not evicted by a later insert."""
    def content(k):
        return bytes([k]) * (16 + 8 * (k % 3))
    cid = [k.to_bytes(32, "little") for k in range(8)]
    unreadable: set = set()
    cache = KeyframeCache(bound * 24)
    used_at: dict = {}
    round_ = 0
    for op in ops:
        if op[0] == "read":
            ks = op[1]
            before = {k for k in ks if cid[k] in cache}
            got = cache.read([cid[k] for k in ks],
                             lambda ids: [None if int.from_bytes(i, "little") in unreadable
                                          else content(int.from_bytes(i, "little"))
                                          for i in ids])
            for k, g in zip(ks, got):
                if k in before or k not in unreadable:
                    assert g == content(k)
                else:
                    assert g is None
                if g is not None and cid[k] in cache:
                    used_at[k] = round_
        elif op[0] == "offer":
            k, old = op[1], op[2]
            held = {j for j in range(8) if cid[j] in cache}
            cache.offer(cid[k], content(k), None if old is None else cid[old])
            if cid[k] in cache:
                used_at[k] = round_
            for j in held - {k, old}:
                if used_at.get(j, -9) >= round_ - 1:
                    assert cid[j] in cache, "a recently used entry was evicted"
        elif op[0] == "begin":
            cache.begin_checkpoint()
            round_ += 1
        else:
            unreadable.add(op[1])
        assert cache.nbytes <= cache.max_bytes
        assert cache.nbytes == sum(len(content(j)) for j in range(8) if cid[j] in cache)
        for j in range(8):
            if cid[j] in cache:
                assert cache.read([cid[j]], lambda ids: pytest.fail("held")) == [content(j)]
                used_at[j] = round_


# ---- through the store -----------------------------------------------------------------------

def test_a_dense_checkpoint_reads_no_base_back_and_stores_what_reading_back_stores(
        tmp_path, base_reads):
    rng = np.random.default_rng(1)
    versions = [weights(rng)]
    for _ in range(3):
        versions.append(drift(versions[-1], rng))
    cached = open_store(tmp_path / "cached")
    plain = open_store(tmp_path / "read-back", keyframe_cache_bytes=0)
    try:
        ids = []
        for v in versions:
            ids.append(cached.checkpoint({"w": v}).id)
        assert base_reads == []                     # every base came from memory
        stats = cached.stats()
        assert stats["keyframe_cache_hits"] > 0 and stats["keyframe_cache_misses"] == 0
        assert stats["keyframe_cache_in_use_bytes"] == versions[0].nbytes
        assert stats["keyframe_cache_bytes"] == DEFAULT_MAX_BYTES
        for v in versions:
            plain.checkpoint({"w": v})
        assert base_reads                           # this one reads its bases back
        assert plain.stats()["keyframe_cache_in_use_bytes"] == 0
        assert chunk_records(cached) == chunk_records(plain)
        assert any(base is not None for _, _, _, base in chunk_records(cached))
        for i, v in zip(ids, versions):
            assert cached.restore(i)["w"] == v.tobytes()
    finally:
        cached.close()
        plain.close()


def test_nothing_changed_and_one_byte_changed(tmp_path, base_reads):
    rng = np.random.default_rng(2)
    w = weights(rng)
    with open_store(tmp_path / "s") as s:
        a = s.checkpoint({"w": w})
        b = s.checkpoint({"w": w})                  # nothing changed: no chunk, no base
        assert b.bytes_new < 4096
        w2 = w.copy()
        w2.view(np.uint8)[12345] ^= 1
        c = s.checkpoint({"w": w2})
        assert base_reads == []
        assert s.restore(a.id)["w"] == w.tobytes()
        assert s.restore(b.id)["w"] == w.tobytes()
        assert s.restore(c.id)["w"] == w2.tobytes()


def test_a_state_larger_than_the_cache_keeps_part_of_it_and_stays_exact(tmp_path, base_reads):
    rng = np.random.default_rng(3)
    versions = [weights(rng)]
    for _ in range(3):
        versions.append(drift(versions[-1], rng))
    with open_store(tmp_path / "s", keyframe_cache_bytes=4 * 65536) as s:
        ids = [s.checkpoint({"w": v}).id for v in versions]
        stats = s.stats()
        assert stats["keyframe_cache_in_use_bytes"] == 4 * 65536       # a quarter of the state
        assert stats["keyframe_cache_hits"] >= 3 * 4             # the same four every time
        assert stats["keyframe_cache_misses"] > 0 and base_reads
        for i, v in zip(ids, versions):
            assert s.restore(i)["w"] == v.tobytes()


def test_renewed_keyframes_replace_the_cached_ones(tmp_path, base_reads):
    """Values far from the keyframe make new keyframes (KEYFRAME_FRACTION): the cache then
    holds those, and the next delta is coded against them."""
    rng = np.random.default_rng(4)
    w = weights(rng)
    with open_store(tmp_path / "s") as s:
        a = s.checkpoint({"w": w})
        w2 = weights(rng)                           # unrelated values: stored plain
        b = s.checkpoint({"w": w2})
        w3 = drift(w2, rng)
        c = s.checkpoint({"w": w3})
        with s._committer.read() as r:
            bases = {e.base for _, e in r.chunks() if e.base is not None}
        layout_b = {cid for _, _, cid, _ in s.layout(b.id, "w")}
        assert bases and bases <= layout_b          # coded against b's keyframes
        assert s.stats()["keyframe_cache_in_use_bytes"] == w.nbytes      # a's were dropped
        assert base_reads == []
        for i, v in ((a.id, w), (b.id, w2), (c.id, w3)):
            assert s.restore(i)["w"] == v.tobytes()


def test_the_callers_array_mutated_after_the_call_changes_nothing(tmp_path):
    rng = np.random.default_rng(5)
    w = weights(rng)
    first = w.copy()
    with open_store(tmp_path / "s") as s:
        a = s.checkpoint({"w": w})
        w[:] = drift(w, rng)                        # in place, as an optimizer step does
        second = w.copy()
        b = s.checkpoint({"w": w})
        w[:] = drift(w, rng)
        c = s.checkpoint({"w": w})
        assert s.restore(a.id)["w"] == first.tobytes()
        assert s.restore(b.id)["w"] == second.tobytes()
        assert s.restore(c.id)["w"] == w.tobytes()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_every_float_dtype_and_an_odd_size(tmp_path, dtype):
    rng = np.random.default_rng(6)
    w = weights(rng, N // 2 + 3, dtype)
    versions = [w, drift(w, rng)]
    versions.append(drift(versions[-1], rng))
    with open_store(tmp_path / "s") as s:
        ids = [s.checkpoint({"w": v}).id for v in versions]
        for i, v in zip(ids, versions):
            assert s.restore(i)["w"] == v.tobytes()


def test_a_base_on_a_failing_disk_is_not_read_while_cached(tmp_path):
    """EIO on every segment read: the cached bases need no read, so the checkpoint codes
    deltas as usual (without the cache its chunks would be coded on their own:
    test_delta_chunks); once the disk reads again everything restores exact."""
    rng = np.random.default_rng(7)
    path = str(tmp_path / "s")
    fb = FaultyBackend(os.path.join(path, fmt.SEGMENTS_DIR), durable=False)
    s = open_store(path, backend=fb)
    try:
        w = weights(rng)
        a = s.checkpoint({"w": w})
        w2 = drift(w, rng)
        fb.fail("read", 1, errno.EIO, repeat=True)
        b = s.checkpoint({"w": w2})
        assert not fb.fired
        fb.clear()
        assert b.bytes_new < 0.8 * w2.nbytes        # delta-coded
        assert s.restore(a.id)["w"] == w.tobytes()
        assert s.restore(b.id)["w"] == w2.tobytes()
    finally:
        s.close()


def test_a_reopened_store_starts_empty_and_reads_its_bases_back_once(tmp_path, base_reads):
    rng = np.random.default_rng(8)
    w = weights(rng)
    path = tmp_path / "s"
    with open_store(path) as s:
        s.checkpoint({"w": w})
    w2 = drift(w, rng)
    w3 = drift(w2, rng)
    with open_store(path) as s:
        assert s.stats()["keyframe_cache_in_use_bytes"] == 0
        b = s.checkpoint({"w": w2})
        n = len(base_reads)
        assert n > 0                                # read back, then kept
        c = s.checkpoint({"w": w3})
        assert len(base_reads) == n                 # not again
        assert s.restore(b.id)["w"] == w2.tobytes()
        assert s.restore(c.id)["w"] == w3.tobytes()


def test_without_delta_chunks_and_in_readonly_stores_there_is_no_cache(tmp_path):
    rng = np.random.default_rng(9)
    w = weights(rng)
    with snapstore.open(tmp_path / "s", durability="none") as s:
        s.checkpoint({"w": w})
        s.checkpoint({"w": drift(w, rng)})
        assert s.stats()["keyframe_cache_bytes"] == 0
        assert s.stats()["keyframe_cache_in_use_bytes"] == 0
    with snapstore.open(tmp_path / "s", readonly=True, delta_chunks=True) as r:
        assert r.stats()["keyframe_cache_bytes"] == 0


@pytest.mark.parametrize("value, error", [
    (-1, InvalidArgumentError), (True, InvalidArgumentTypeError),
    ("1G", InvalidArgumentTypeError), (1.5, InvalidArgumentTypeError),
    (None, InvalidArgumentTypeError)])
def test_bad_cache_sizes_are_refused_before_the_store_is_touched(tmp_path, value, error):
    with pytest.raises(error, match="keyframe_cache_bytes"):
        snapstore.open(tmp_path / "s", delta_chunks=True, keyframe_cache_bytes=value)
    assert not (tmp_path / "s").exists()


def test_close_twice_and_a_closed_store(tmp_path):
    rng = np.random.default_rng(10)
    s = open_store(tmp_path / "s")
    s.checkpoint({"w": weights(rng)})
    s.close()
    s.close()
    with pytest.raises(snapstore.errors.StoreClosedError):
        s.stats()


# ---- found in review: accounting under races, allocation failures, streams, fork ----------

def _held(cache) -> int:
    """The bytes the entries hold, counted from the cache's own read of each."""
    return sum(len(cache.read([cid], lambda ids: pytest.fail("held"))[0])
               for cid in list(cache._entries))


def _race_one_id(cache, cid, data, monkeypatch):
    """Two threads miss the same id at once, their copies made at the same moment."""
    both_copying = threading.Barrier(2)
    real = keyframes._copy

    def slow_copy(jobs):
        try:
            both_copying.wait(2)
        except threading.BrokenBarrierError:
            pass
        real(jobs)
    monkeypatch.setattr(keyframes, "_copy", slow_copy)
    threads = [threading.Thread(target=cache.read, args=([cid], lambda ids: [data] * len(ids)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    monkeypatch.setattr(keyframes, "_copy", real)


def test_two_threads_missing_one_id_count_its_bytes_once(monkeypatch):
    """Regression: both counted the chunk and the second insert replaced the first, so the
    cache counted bytes no entry held, which filled its bound for ever."""
    cid, data = b"\x01" * 32, b"z" * 4096
    cache = KeyframeCache(2 * 4096)
    _race_one_id(cache, cid, data, monkeypatch)
    assert len(cache) == 1 and cache.nbytes == _held(cache) == 4096
    for _ in range(3):
        cache.begin_checkpoint()                    # what is held may go now
    cache.offer(b"\x09" * 32, data)
    cache.offer(b"\x0a" * 32, data)
    assert len(cache) == 2 and cache.nbytes == 2 * 4096


@pytest.mark.parametrize("exc", [KeyboardInterrupt, MemoryError])
def test_a_copy_that_fails_gives_its_bytes_back(monkeypatch, exc):
    cache = KeyframeCache(1 << 20)

    def fail(jobs):
        raise exc
    monkeypatch.setattr(keyframes, "_copy", fail)
    with pytest.raises(exc):
        cache.offer(b"\x05" * 32, b"q" * 4096)
    assert len(cache) == 0 and cache.nbytes == 0
    monkeypatch.undo()
    cache.offer(b"\x05" * 32, b"q" * 4096)          # and it can be kept later
    assert cache.nbytes == 4096


def test_memory_the_cache_cannot_get_does_not_fail_a_checkpoint(tmp_path, monkeypatch):
    def no_memory(n):
        raise MemoryError
    monkeypatch.setattr(keyframes, "uninit_bytearray", no_memory)
    rng = np.random.default_rng(11)
    w = weights(rng)
    w2 = drift(w, rng)
    with open_store(tmp_path / "s") as s:
        a = s.checkpoint({"w": w})
        b = s.checkpoint({"w": w2})
        assert s.stats()["keyframe_cache_in_use_bytes"] == 0
        assert b.bytes_new < 0.8 * w2.nbytes         # deltas still, from bases read back
        assert s.restore(a.id)["w"] == w.tobytes()
        assert s.restore(b.id)["w"] == w2.tobytes()


def test_streams_taking_turns_keep_their_share_whatever_commits_between(tmp_path):
    """Regression: entries aged by every checkpoint of the store, so two float streams
    larger than the cache, with a small checkpoint between them, evicted each other's
    keyframes and the cache never hit. Entries age by their own stream's checkpoints."""
    def hits(path, progress: bool) -> int:
        rng = np.random.default_rng(3)
        ws = {k: weights(rng, 8 * 16384) for k in "ab"}       # 512 KiB a stream
        total = 0
        with open_store(path, keyframe_cache_bytes=8 * 65536) as s:   # one stream's worth
            for i in range(5):
                for k in "ab":
                    before = s.stats()["keyframe_cache_hits"]
                    s.checkpoint({"w": ws[k]}, stream=k)
                    if i >= 2:
                        total += s.stats()["keyframe_cache_hits"] - before
                    if progress:
                        s.checkpoint({"step": np.array([i], np.int64)}, stream="progress")
                    ws[k] = drift(ws[k], rng)
        return total
    alone = hits(tmp_path / "a", progress=False)
    mixed = hits(tmp_path / "b", progress=True)
    assert alone >= 3 * 8                           # one stream's keyframes, every round
    assert mixed == alone


def test_a_renewed_keyframe_takes_the_memory_of_the_one_it_renews(tmp_path, base_reads):
    """Values that drifted past KEYFRAME_FRACTION of their keyframe get a new keyframe,
    with no base offered: it replaces the old one in the cache all the same."""
    rng = np.random.default_rng(12)
    w = weights(rng)
    with open_store(tmp_path / "s") as s:
        ids, versions = [], []
        for _ in range(8):                          # a large drift each time: renewals
            ids.append(s.checkpoint({"w": w}).id)
            versions.append(w)
            w = drift(w, rng, rel=0.3)
        with s._committer.read() as r:
            plain = sum(1 for _, e in r.chunks() if e.base is None)
        assert plain > 2 * 16                       # keyframes were renewed
        assert s.stats()["keyframe_cache_in_use_bytes"] == versions[0].nbytes
        assert base_reads == []
        for i, v in zip(ids, versions):
            assert s.restore(i)["w"] == v.tobytes()


def test_zero_chunks_shared_by_many_places(tmp_path):
    """Every chunk of a zero-initialised buffer is one chunk (one id): the base of every
    place at once; some places then renew it, the others still code against it."""
    rng = np.random.default_rng(13)
    w = np.zeros(N, np.float32)
    with open_store(tmp_path / "s") as s:
        ids, versions = [s.checkpoint({"w": w}).id], [w]
        for step in range(4):
            w = w.copy()
            w[: N // 2] += rng.normal(0, 0.02, N // 2).astype(np.float32) * (step + 1)
            ids.append(s.checkpoint({"w": w}).id)
            versions.append(w)
        for i, v in zip(ids, versions):
            assert s.restore(i)["w"] == v.tobytes()


def test_a_checkpoint_that_fails_after_coding_then_a_retry(tmp_path):
    """A commit refused at its claim (CommitConflict: another head expected) after its
    chunks were coded and its keyframes offered: nothing of it is visible, and the next
    checkpoints restore exact."""
    rng = np.random.default_rng(14)
    w = weights(rng)
    with open_store(tmp_path / "s") as s:
        a = s.checkpoint({"w": w})
        w2 = weights(rng)                           # unrelated: new keyframes, offered
        with pytest.raises(snapstore.errors.CommitConflict):
            s.checkpoint({"w": w2}, expect_head=None)
        assert [c.id for c in s.checkpoints()] == [a.id]
        b = s.checkpoint({"w": drift(w, rng)})
        w3 = drift(w2, rng)
        c = s.checkpoint({"w": w2})
        d = s.checkpoint({"w": w3})
        assert s.restore(a.id)["w"] == w.tobytes()
        assert s.restore(c.id)["w"] == w2.tobytes()
        assert s.restore(d.id)["w"] == w3.tobytes()
        assert s.verify(deep=True)["ok"]
        assert b.id in {x.id for x in s.checkpoints()}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_lets_go_of_the_parents_cache(tmp_path):
    rng = np.random.default_rng(15)
    s = open_store(tmp_path / "s")
    try:
        s.checkpoint({"w": weights(rng)})
        assert s.stats()["keyframe_cache_in_use_bytes"] > 0
        pid = os.fork()
        if pid == 0:                                # the child
            code = 1
            try:
                code = 0 if s._committer._keyframes is None else 2
                try:
                    s.stats()
                    code = 3
                except snapstore.errors.ForkedStoreError:
                    pass
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert s.stats()["keyframe_cache_in_use_bytes"] > 0     # the parent's stays
    finally:
        s.close()
