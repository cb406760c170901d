"""snapstore.copy_checkpoints: checkpoints copied between stores, byte-exact, sending only the
chunks the destination lacks; full manifests; stream, meta, tags and created kept; ids mapped;
idempotent; failures leave what was copied before."""
from __future__ import annotations

import os

import numpy as np
import pytest

import snapstore
from snapstore import copying
from snapstore.engine.backends import segment_name
from snapstore.errors import (CheckpointNotFound, CommitConflict, CorruptionError,
                              InvalidArgumentTypeError, ReadOnlyError, StoreClosedError)

ORIGIN = "snapstore.copied_from"


def _open(path, **kw):
    return snapstore.open(str(path), durability="none", **kw)


def _segment_bytes(store) -> int:
    return sum(store.backend.size(n) for n in store.backend.list())


@pytest.fixture
def src(tmp_path):
    s = _open(tmp_path / "src")
    yield s
    s.close()


@pytest.fixture
def dst(tmp_path):
    s = _open(tmp_path / "dst")
    yield s
    s.close()


def _fill(src, steps=4, size=400_000, seed=0):
    """Stream "train": a full checkpoint and `steps` - 1 deltas (a few pages changed each),
    with an empty and a 1-byte buffer; stream "other": one checkpoint, tagged."""
    rng = np.random.default_rng(seed)
    x = bytearray(rng.bytes(size))
    infos = []
    for step in range(steps):
        if step:
            for at in rng.integers(0, size - 8, 3):
                x[at:at + 8] = rng.bytes(8)
        infos.append(src.checkpoint({"x": x, "empty": b"", "one": bytes([step])}, "train",
                                    meta={"step": step, "cfg": {"lr": 0.1}}))
    other = src.checkpoint({"y": rng.bytes(50_000)}, "other", meta=[1, "two"])
    src.tag(other.id, "best")
    if len(infos) > 1:
        src.tag(infos[1].id, "second")
    return infos, src.get(other.id)


def _same_content(src, dst, mapping):
    for s_id, d_id in mapping.items():
        a, b = src.get(s_id), dst.get(d_id)
        assert dst.restore(d_id) == src.restore(s_id)
        assert (b.stream, b.created, b.meta, b.tags, b.sizes) == \
            (a.stream, a.created, a.meta, a.tags, a.sizes)
        assert b.kind == "full" and b.chain_length == 0
        assert b.reserved_meta[ORIGIN]["id"] == s_id
        assert b.reserved_meta[ORIGIN]["store"] == os.path.abspath(src.path)


def test_copy_everything_into_a_new_store(src, dst):
    infos, other = _fill(src)
    assert infos[-1].kind == "incremental"
    result = snapstore.copy_checkpoints(src, dst)
    ids = [c.id for c in src.checkpoints()]
    assert list(result.copied) == ids and result.skipped == {}
    assert list(result.copied.values()) == [c.id for c in dst.checkpoints()]
    _same_content(src, dst, result.copied)
    train = dst.checkpoints("train")
    assert [c.seq for c in train] == [1, 2, 3, 4]
    assert [c.parent for c in train] == [None] + [c.id for c in train[:-1]]
    assert dst.resolve("best").id == result.copied[other.id]
    assert dst.get(result.copied[other.id]).meta == [1, "two"]      # not a dict: kept whole
    assert dst.verify(deep=True)["ok"]
    # chunks: each sent once, the source's live chunks exactly
    assert result.chunks_sent == dst.stats()["chunks"] == src.stats()["chunks"]
    assert result.bytes_written == sum(c.bytes_new for c in dst.checkpoints())


def test_copy_some_by_name(src, dst):
    infos, other = _fill(src)
    result = snapstore.copy_checkpoints(src, dst, ["train@3", "second", "other", infos[0].id,
                                                   f"latest:train", "train@3"])
    assert list(result.copied) == [infos[0].id, infos[1].id, infos[2].id, infos[3].id,
                                   other.id]
    _same_content(src, dst, result.copied)
    with pytest.raises(CheckpointNotFound):
        snapstore.copy_checkpoints(src, dst, ["nope"])
    with pytest.raises(InvalidArgumentTypeError):
        snapstore.copy_checkpoints(src, dst, "train")


def test_the_tip_of_a_chain_alone_is_full_and_restores(src, dst):
    infos, _ = _fill(src, steps=6)
    assert src.get(infos[-1].id).chain_length == 5
    result = snapstore.copy_checkpoints(src, dst, [infos[-1].id])
    (new,) = result.copied.values()
    assert dst.restore(new) == src.restore(infos[-1].id)
    assert dst.get(new).kind == "full"
    src.delete(infos[-1].id)                 # the copy depends on nothing in src
    assert dst.verify(deep=True)["ok"]


def test_only_missing_chunks_are_sent(src, dst):
    infos, _ = _fill(src, steps=5, size=2_000_000)
    first = snapstore.copy_checkpoints(src, dst, [infos[0].id])
    chunks, written = dst.stats()["chunks"], _segment_bytes(dst)
    assert first.bytes_sent >= 2_000_000
    rest = snapstore.copy_checkpoints(src, dst, [i.id for i in infos[1:]])
    # 4 checkpoints of 3 scattered 8-byte changes each: at most 12 new chunks, a few KiB
    # of delta chunks, whatever the 2 MB of buffer
    assert 0 < rest.chunks_sent <= 12
    assert rest.bytes_sent <= 12 * 65536
    assert dst.stats()["chunks"] - chunks == rest.chunks_sent
    assert _segment_bytes(dst) - written < 12 * 65536 + 4 * 4096
    _same_content(src, dst, {**first.copied, **rest.copied})


def test_copying_twice_skips_and_copies_of_copies_count(tmp_path, src, dst):
    _fill(src)
    first = snapstore.copy_checkpoints(src, dst)
    size = _segment_bytes(dst)
    again = snapstore.copy_checkpoints(src, dst)
    assert again.copied == {} and again.skipped == first.copied
    assert again.chunks_sent == 0 and _segment_bytes(dst) == size
    with _open(tmp_path / "third") as third:
        via = snapstore.copy_checkpoints(dst, third)            # a copy of the copies
        assert len(via.copied) == len(first.copied)
        direct = snapstore.copy_checkpoints(src, third)         # the originals: the same
        assert direct.copied == {} and list(direct.skipped) == list(first.copied)
        back = snapstore.copy_checkpoints(third, src)           # back to where they came from
        assert back.copied == {} and len(back.skipped) == len(first.copied)
        # the copy's own provenance names its immediate source
        c = third.get(via.copied[first.copied[1]])
        assert c.reserved_meta[ORIGIN] == {"store": os.path.abspath(dst.path),
                                           "id": first.copied[1]}
    assert snapstore.copy_checkpoints(src, src).copied == {}     # into itself: nothing


def test_copy_onto_a_stream_with_history_and_nothing_to_copy(tmp_path, src, dst):
    own = dst.checkpoint({"x": b"mine"}, "train")
    assert snapstore.copy_checkpoints(src, dst).copied == {}     # an empty source
    _fill(src, steps=2)
    result = snapstore.copy_checkpoints(src, dst, ["train"])
    (new,) = result.copied.values()
    info = dst.get(new)
    assert info.parent == own.id and info.seq == 2 and dst.latest("train").id == new
    # the copied checkpoint has no page fingerprints: the next one is stored full, correctly
    x = bytearray(src.restore("train")["x"])
    nxt = dst.checkpoint({"x": x, "empty": b"", "one": b"\1"}, "train")
    assert nxt.kind == "full" and dst.restore(nxt.id)["x"] == bytes(x)


def test_objects_arrays_groups_and_other_write_options(tmp_path, src):
    params = {"w": np.arange(30_000, dtype=np.float32), "b": np.zeros(10)}
    saved = src.save({"model": params, "step": 3}, "objects", meta={"run": "r"})
    arrays = snapstore.save_arrays(src, {"a": np.ones((50, 40))}, "arrays")
    g = src.group("g", ["p0", "p1"])
    src.stage(g.id, "p0", {"b0": b"zero" * 1000}, meta={"offset": 7})
    src.stage(g.id, "p1", {"b1": b"one" * 1000}, meta={"offset": 9})
    grouped = g.commit(meta={"epoch": 1})
    cdc = src.checkpoint({"c": os.urandom(300_000)}, "cdc", chunking="cdc")
    with _open(tmp_path / "raw", compression="none", page_size=8192,
               chunk_size=1 << 20) as dst:
        result = snapstore.copy_checkpoints(src, dst)
        loaded = dst.load(result.copied[saved.id])
        assert loaded["step"] == 3 and np.array_equal(loaded["model"]["w"], params["w"])
        assert dst.get(result.copied[saved.id]).meta == {"run": "r"}
        got = snapstore.load_arrays(dst, result.copied[arrays.id])
        assert np.array_equal(got["a"], np.ones((50, 40)))
        assert snapstore.group_parts(dst.get(result.copied[grouped.id])) == \
            {"p0": {"offset": 7}, "p1": {"offset": 9}}
        assert dst.restore(result.copied[cdc.id]) == src.restore(cdc.id)
        assert dst.manifests(result.copied[cdc.id]).buffers[0].layout == "cdc"
        _same_content(src, dst, result.copied)
        assert dst.verify(deep=True)["ok"]


def test_a_failure_keeps_what_was_copied_and_a_rerun_finishes(src, dst, monkeypatch):
    infos, _ = _fill(src)
    real, calls = src.with_manifests, [0]

    def failing_source(name, use):      # the source's chunks fail the second time
        def use_failing(m, read_chunks):
            def failing(ids):
                calls[0] += 1
                if calls[0] == 2:
                    raise CorruptionError("simulated damage in the source")
                return read_chunks(ids)
            return use(m, failing)
        return real(name, use_failing)
    monkeypatch.setattr(src, "with_manifests", failing_source)
    with pytest.raises(CorruptionError, match="simulated"):
        snapstore.copy_checkpoints(src, dst)
    assert len(dst.checkpoints()) == 1 and dst.verify()["ok"]
    result = snapstore.copy_checkpoints(src, dst)
    assert list(result.skipped) == [infos[0].id]
    assert len(result.copied) == len(src.checkpoints()) - 1
    _same_content(src, dst, {**result.skipped, **result.copied})


def test_read_only_closed_and_bad_arguments(tmp_path, src, dst):
    _fill(src, steps=1)
    seen = []
    snapstore.copy_checkpoints(src, dst, progress=lambda s, d: seen.append((s, d)))
    snapstore.copy_checkpoints(src, dst, progress=lambda s, d: seen.append((s, d)))
    assert [d is None for _, d in seen] == [False, False, True, True]
    assert [s for s, _ in seen] == [1, 2, 1, 2]
    reader = snapstore.open(dst.path, readonly=True)
    try:
        with pytest.raises(ReadOnlyError):
            snapstore.copy_checkpoints(src, reader)
        snapstore.copy_checkpoints(reader, dst)        # a read-only source is fine
    finally:
        reader.close()
    with pytest.raises(InvalidArgumentTypeError):
        snapstore.copy_checkpoints(src, str(dst.path))
    with pytest.raises(InvalidArgumentTypeError):
        snapstore.copy_checkpoints(src, dst, progress="x")
    src.close()
    with pytest.raises(StoreClosedError):
        snapstore.copy_checkpoints(src, dst)
    dst.close()
    with _open(tmp_path / "src") as again, pytest.raises(StoreClosedError):
        snapstore.copy_checkpoints(again, dst)


def test_copying_everything_skips_what_another_writer_deletes_meanwhile(tmp_path):
    """Regressions: a checkpoint deleted (retain) after the listing made the copy of every
    checkpoint stop half-way with CheckpointNotFound; one deleted and compacted while its
    chunks were being read failed with a CorruptionError advising repair on a healthy store."""
    src = snapstore.open(str(tmp_path / "src"))
    other = snapstore.open(str(tmp_path / "src"))
    data = {}
    for _ in range(3):
        buf = os.urandom(1000)
        data[src.checkpoint({"w": buf}, "train").id] = buf
    dst = snapstore.open(str(tmp_path / "dst"))

    def progress(source_id, new_id):
        if source_id == 1:
            other.retain("train", keep_last=1)             # 2 goes, before its turn
    result = snapstore.copy_checkpoints(src, dst, progress=progress)
    assert sorted(result.copied) == [1, 3]
    assert [dst.restore(i)["w"] for i in sorted(result.copied.values())] == [data[1], data[3]]
    # deleted and compacted (its segments removed) after the copy read its manifests, before
    # its chunks: the read is made again, and finds it deleted
    # (written by the compacting writer: its own open segment is sealed and rewritten too)
    more = {other.checkpoint({"w": os.urandom(5000)}, "train").id for _ in range(2)}
    real, fired = src.with_manifests, []

    def gone_meanwhile(name, use):
        def use_after_compaction(m, read_chunks):
            if m.info.id == max(more) and not fired:
                other.delete(m.info.id)
                fired.append(other.compact(threshold=1.0))
            return use(m, read_chunks)
        return real(name, use_after_compaction)
    src.with_manifests = gone_meanwhile
    with pytest.raises(snapstore.errors.CheckpointNotFound, match="deleted by another writer"):
        snapstore.copy_checkpoints(src, dst, [max(more)])
    assert fired and fired[0]["segments_removed"] > 0
    del src.with_manifests
    result = snapstore.copy_checkpoints(src, dst)             # every checkpoint: skipped
    assert max(more) not in result.copied and max(more) not in result.skipped
    for s in (src, other, dst):
        s.close()


def test_two_copies_racing_into_one_store_copy_each_checkpoint_once(tmp_path, src, dst,
                                                                    monkeypatch):
    """Regression: each copy checked the destination, then imported; a second copy that
    committed the same checkpoint in between went unseen, and the destination held it twice.
    Here the second copy runs (to completion, through another writer of dst) right after the
    first one's check of each checkpoint."""
    infos, other = _fill(src, steps=3)
    racer = _open(tmp_path / "dst")
    real, raced = dst.import_checkpoint, []

    def import_after_a_racing_copy(stream, *args, **kw):
        if not raced:
            raced.append(snapstore.copy_checkpoints(src, racer))
        return real(stream, *args, **kw)
    monkeypatch.setattr(dst, "import_checkpoint", import_after_a_racing_copy)
    result = snapstore.copy_checkpoints(src, dst)
    everything = [c.id for c in src.checkpoints()]
    assert sorted(raced[0].copied) == everything
    assert result.copied == {} and sorted(result.skipped) == everything
    assert result.skipped == raced[0].copied
    assert len(dst.checkpoints()) == len(everything)           # each once
    _same_content(src, dst, result.skipped)
    racer.close()


def test_a_copy_onto_a_stream_another_writer_moves_is_checked_again(tmp_path, src, dst,
                                                                   monkeypatch):
    """A plain commit to the destination's stream between the check and the commit is a
    conflict for the copy's commit, which is checked and made again onto the new head; a
    writer that never stops moving it makes the copy a CommitConflict after COPY_ATTEMPTS."""
    infos, _ = _fill(src, steps=1)
    writer = _open(tmp_path / "dst")
    real, moves = dst.import_checkpoint, []

    def import_after_a_commit(stream, *args, **kw):
        if len(moves) < limit[0]:
            moves.append(writer.checkpoint({"z": os.urandom(10)}, stream).id)
        return real(stream, *args, **kw)
    monkeypatch.setattr(dst, "import_checkpoint", import_after_a_commit)
    limit = [1]
    result = snapstore.copy_checkpoints(src, dst, [infos[0].id])
    assert dst.checkpoint_ids("train") == [moves[0], result.copied[infos[0].id]]
    assert dst.get(result.copied[infos[0].id]).parent == moves[0]
    limit[0] = 1 + copying.COPY_ATTEMPTS
    with pytest.raises(CommitConflict):
        snapstore.copy_checkpoints(src, dst, ["best"])
    assert len(moves) == 1 + copying.COPY_ATTEMPTS
    assert dst.checkpoint_ids("other") == moves[1:]             # no copy committed
    writer.close()


def test_import_checkpoint_honours_expect_head(src, dst):
    infos, _ = _fill(src, steps=1)
    m = src.manifests(infos[0].id)

    def chunks(ids):
        return src.read_chunks(ids)
    with pytest.raises(CommitConflict, match="made against head 7"):
        dst.import_checkpoint("train", m.buffers, chunks, m.meta, expect_head=7)
    assert dst.checkpoints() == []
    first = dst.import_checkpoint("train", m.buffers, chunks, m.meta, expect_head=None)
    with pytest.raises(CommitConflict):
        dst.import_checkpoint("train", m.buffers, chunks, m.meta, expect_head=None)
    second = dst.import_checkpoint("train", m.buffers, chunks, m.meta, expect_head=first)
    assert dst.checkpoint_ids("train") == [first.id, second.id]


def test_a_commit_in_progress_on_the_stream_is_waited_for_not_counted(src, dst, monkeypatch):
    """Regression (a helper's race of four copying processes): every CommitConflict took one
    of the COPY_ATTEMPTS, and one for a commit still in progress (the head unchanged: often
    another copy of the same checkpoint) was retried at once, so a copy gave up after 8
    instant retries though nothing had been committed. Such a conflict is now waited for
    (bounded by CLAIM_WAIT_SECONDS) and costs no attempt."""
    infos, _ = _fill(src, steps=1)
    real, calls = dst.import_checkpoint, []

    def busy_then_free(stream, *args, expect_head=None, **kwargs):
        calls.append(expect_head)
        if len(calls) <= copying.COPY_ATTEMPTS + 4:
            raise CommitConflict("a commit of the stream is in progress", stream=stream,
                                 expected=expect_head, found=expect_head,
                                 holder="writer 9 (pid 1)")
        return real(stream, *args, expect_head=expect_head, **kwargs)
    monkeypatch.setattr(dst, "import_checkpoint", busy_then_free)
    monkeypatch.setattr(copying, "CLAIM_POLL_SECONDS", 0.001)
    result = snapstore.copy_checkpoints(src, dst, [infos[0].id])
    assert list(result.copied) == [infos[0].id]
    assert len(calls) == copying.COPY_ATTEMPTS + 5
    calls.clear()

    def never_free(stream, *args, expect_head=None, **kwargs):
        calls.append(expect_head)
        raise CommitConflict("a commit of the stream is in progress", stream=stream,
                             expected=expect_head, found=expect_head, holder="writer 9 (pid 1)")
    monkeypatch.setattr(dst, "import_checkpoint", never_free)
    monkeypatch.setattr(copying, "CLAIM_WAIT_SECONDS", 0.05)     # a commit that never ends
    with pytest.raises(CommitConflict, match="in progress"):
        snapstore.copy_checkpoints(src, dst, ["best"])
    assert len(calls) > 1


# ---- one destination checkpoint stands for one source checkpoint ---------------------------

def _rolled_back(store, tmp_path):
    """train@1 (step 100), train@2 (step 200), then train rolled back to step 100 by importing
    a savepoint of train@1: train@3 is the same checkpoint as train@1 (stream, created, meta,
    manifests), and the newest. Returns the three ids."""
    a = store.checkpoint({"w": b"\1" * 100_000}, "train", meta={"step": 100})
    snap = str(tmp_path / "step100.snap")
    snapstore.export_savepoint(store, a.id, snap, force=True)
    b = store.checkpoint({"w": b"\2" * 100_000}, "train", meta={"step": 200})
    c = snapstore.import_savepoint(store, snap)
    assert c.stream == "train" and store.latest("train").id == c.id
    assert copying.same_checkpoint(store.manifests(a.id), store.manifests(c.id))
    return a.id, b.id, c.id


def _latest_same(src, dst):
    for stream in {c.stream for c in src.checkpoints()}:
        assert dst.restore(f"latest:{stream}") == src.restore(f"latest:{stream}"), stream


def test_a_stream_rolled_back_by_a_savepoint_import_is_copied_whole(tmp_path, src, dst):
    """Regression: the rollback checkpoint (train@3, the same checkpoint as train@1) was
    skipped as "already there" (mapped onto train@1's copy): the backup had 2 checkpoints and
    its latest:train was step 200, the source's step 100."""
    ids = _rolled_back(src, tmp_path)
    result = snapstore.copy_checkpoints(src, dst)
    assert sorted(result.copied) == list(ids) and result.skipped == {}
    assert len(set(result.copied.values())) == 3 == len(dst.checkpoints())
    _same_content(src, dst, result.copied)
    assert dst.latest("train").id == result.copied[ids[2]]
    assert dst.get("latest:train").meta == {"step": 100}
    _latest_same(src, dst)
    again = snapstore.copy_checkpoints(src, dst)             # a rerun copies nothing
    assert again.copied == {} and again.skipped == result.copied
    assert len(dst.checkpoints()) == 3
    with _open(tmp_path / "third") as third:                 # a copy of the copy: the same
        via = snapstore.copy_checkpoints(dst, third)
        assert len(via.copied) == 3
        _latest_same(src, third)
        direct = snapstore.copy_checkpoints(src, third)      # the originals: each matched once
        assert direct.copied == {} and sorted(direct.skipped) == list(ids)
        assert len(set(direct.skipped.values())) == 3
        back = snapstore.copy_checkpoints(third, src)        # back to where they came from
        assert back.copied == {} and len(set(back.skipped.values())) == 3
    assert snapstore.copy_checkpoints(src, src).copied == {}     # into itself: nothing
    assert snapstore.copy_checkpoints(src, src).skipped == {i: i for i in ids}
    assert len(src.checkpoints()) == 3


@pytest.mark.parametrize("name", ["latest:train", "release"])
def test_a_rollback_copied_by_name_is_copied_not_taken_for_the_older_copy(tmp_path, src, dst,
                                                                          name):
    """Copying only the new latest (or its tag) after a rollback took train@1's copy for it
    ("3 = 1 already there"): only this run's selection was looked at, so the backup's
    latest:train stayed step 200 and the tag was never copied (a reviewer's find)."""
    first = src.checkpoint({"w": b"\1" * 100_000}, "train", meta={"step": 100})
    snap = str(tmp_path / "step100.snap")
    snapstore.export_savepoint(src, first.id, snap)
    src.checkpoint({"w": b"\2" * 100_000}, "train", meta={"step": 200})
    before = snapstore.copy_checkpoints(src, dst)
    rollback = snapstore.import_savepoint(src, snap)
    src.tag(rollback.id, "release")
    result = snapstore.copy_checkpoints(src, dst, [name])
    assert list(result.copied) == [rollback.id] and result.skipped == {}
    assert dst.get("latest:train").meta == {"step": 100}
    assert dst.resolve("release").id == result.copied[rollback.id]
    _latest_same(src, dst)
    again = snapstore.copy_checkpoints(src, dst, [name])     # the same call twice
    assert again.copied == {} and again.skipped == result.copied
    full = snapstore.copy_checkpoints(src, dst)              # and everything: nothing new
    assert full.copied == {} and len(dst.checkpoints()) == 3
    assert full.skipped == {**before.copied, **result.copied}


def test_a_backup_made_before_the_rollback_gets_the_rollback(tmp_path, src, dst):
    """The backup holds train@1 and train@2; after the rollback in the source the next copy
    copies train@3 (train@1's copy already stands for train@1), and the one after nothing."""
    first = src.checkpoint({"w": b"\1" * 100_000}, "train", meta={"step": 100})
    snap = str(tmp_path / "step100.snap")
    snapstore.export_savepoint(src, first.id, snap)
    src.checkpoint({"w": b"\2" * 100_000}, "train", meta={"step": 200})
    before = snapstore.copy_checkpoints(src, dst)
    assert len(before.copied) == 2
    rollback = snapstore.import_savepoint(src, snap)
    result = snapstore.copy_checkpoints(src, dst)
    assert list(result.copied) == [rollback.id] and result.skipped == before.copied
    assert dst.latest("train").id == result.copied[rollback.id]
    _latest_same(src, dst)
    again = snapstore.copy_checkpoints(src, dst)
    assert again.copied == {} and again.skipped == {**before.copied, **result.copied}


def test_a_savepoint_imported_twice_is_copied_twice_with_its_tags(tmp_path, src, dst):
    """Regression: the second import (tagged "release") was mapped onto the copy of the first:
    the destination had one checkpoint, and resolve("release") raised CheckpointNotFound."""
    with _open(tmp_path / "a") as a:
        a.checkpoint({"w": b"weights" * 1000}, "train", meta={"step": 1})
        snapstore.export_savepoint(a, "latest", str(tmp_path / "s.snap"))
    i1 = snapstore.import_savepoint(src, str(tmp_path / "s.snap"))
    i2 = snapstore.import_savepoint(src, str(tmp_path / "s.snap"))
    src.tag(i2.id, "release")
    result = snapstore.copy_checkpoints(src, dst)
    assert list(result.copied) == [i1.id, i2.id] and result.skipped == {}
    _same_content(src, dst, result.copied)
    assert dst.resolve("release").id == result.copied[i2.id]
    assert dst.resolve("train@2").id == result.copied[i2.id]
    assert dst.get(result.copied[i1.id]).tags == ()
    again = snapstore.copy_checkpoints(src, dst)
    assert again.copied == {} and again.skipped == result.copied
    one = snapstore.copy_checkpoints(src, dst, ["release"])      # named alone: its own copy
    assert one.skipped == {i2.id: result.copied[i2.id]}
    assert len(dst.checkpoints()) == 2


def test_a_copy_of_the_newest_made_first_keeps_the_order(tmp_path, src, dst):
    """Copied alone first, the newest checkpoint's copy comes before the older ones' copies;
    a copy of every checkpoint then copies it again after them (its copy stands for one source
    checkpoint only, and the order is kept), so latest names the same bytes in both stores. A
    copy of another checkpoint that is the same checkpoint is left to it."""
    ids = _rolled_back(src, tmp_path)
    src.tag(ids[0], "first")
    src.tag(ids[2], "rollback")
    alone = snapstore.copy_checkpoints(src, dst, ["latest:train"])
    assert list(alone.copied) == [ids[2]]
    result = snapstore.copy_checkpoints(src, dst)
    # train@1 is not mapped onto train@3's copy (kept for it), and train@3 comes after train@2
    assert sorted(result.copied) == list(ids) and result.skipped == {}
    assert dst.resolve("first").id == result.copied[ids[0]]
    assert dst.latest("train").id == result.copied[ids[2]]
    _latest_same(src, dst)
    again = snapstore.copy_checkpoints(src, dst)
    assert again.copied == {} and again.skipped == result.copied
    # plain checkpoints, the newest copied first: the same
    with _open(tmp_path / "s2") as s2, _open(tmp_path / "d2") as d2:
        for step in range(3):
            s2.checkpoint({"x": bytes([step]) * 5000}, "train", meta={"step": step})
        snapstore.copy_checkpoints(s2, d2, ["train@3"])
        snapstore.copy_checkpoints(s2, d2)
        _latest_same(s2, d2)
        assert snapstore.copy_checkpoints(s2, d2).copied == {}


def test_a_source_opened_at_another_path_is_matched_in_order(tmp_path, src, dst):
    """Provenance names the source by the path it was opened at; through a symlink nothing
    names it, and equal checkpoints are paired in order: a rerun still copies nothing."""
    ids = _rolled_back(src, tmp_path)
    first = snapstore.copy_checkpoints(src, dst)
    os.symlink(src.path, tmp_path / "link")
    with _open(tmp_path / "link", readonly=True) as link:
        again = snapstore.copy_checkpoints(link, dst)
    assert again.copied == {} and again.skipped == first.copied
    assert sorted(first.copied) == list(ids)


def test_boring_cases_empty_one_and_twice(tmp_path, src, dst):
    assert snapstore.copy_checkpoints(src, dst).copied == {}          # empty into empty
    assert snapstore.copy_checkpoints(src, dst).skipped == {}
    assert dst.checkpoints() == []
    one = src.checkpoint({"w": b"one"}, "train", meta={"step": 1})
    result = snapstore.copy_checkpoints(src, dst)
    assert list(result.copied) == [one.id] and result.skipped == {}
    for _ in range(2):
        again = snapstore.copy_checkpoints(src, dst)
        assert again.copied == {} and again.skipped == result.copied
    assert len(dst.checkpoints()) == 1
    _latest_same(src, dst)
    with _open(tmp_path / "empty") as empty:                          # an empty source
        assert snapstore.copy_checkpoints(empty, dst).copied == {}
    assert len(dst.checkpoints()) == 1


def test_damage_in_the_source_is_named_as_the_source_stores(tmp_path):
    """Both stores have segments of the same names: 'record checksum mismatch (segment
    0000000000000001.seg, ...)' did not say which store to repair."""
    rng = np.random.default_rng(22)
    with _open(tmp_path / "s", compression="none") as s:
        s.checkpoint({"a": rng.bytes(100_000)}, stream="x")
        seg = os.path.join(s.path, "segments", segment_name(s.backend.list()[0]))
    with open(seg, "r+b") as f:
        f.seek(os.path.getsize(seg) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with _open(tmp_path / "s", readonly=True) as s, _open(tmp_path / "d") as d:
        with pytest.raises(CorruptionError) as exc:
            snapstore.copy_checkpoints(s, d)
        assert str(exc.value).startswith(f"the source store {s.path}: ")
        assert exc.value.segment is not None            # attributes kept
        assert d.checkpoints() == [] and d.verify(deep=True)["ok"]
