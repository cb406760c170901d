"""Readers of whole checkpoints (savepoint export, copy, tensor export, diff) racing a
compaction that trims, collects or moves the chunks they read.

Regression: export_savepoint and copy_checkpoints read a checkpoint's manifests in one index
snapshot and its chunks in a later one; a compaction in between that trimmed the chunks of a
live checkpoint, or collected those of a deleted one, failed the export with a
CorruptionError advising repair on a healthy store. They now read both from one snapshot
(Store.with_manifests) and read again on a new one when a compaction removes a segment under
them: exact bytes, or CheckpointNotFound when the checkpoint itself was deleted; damage is
still CorruptionError.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import random
import subprocess
import sys
import time

import pytest

import snapstore
from snapstore import diff
from snapstore.engine import format as fmt
from snapstore.engine.index import Index
from snapstore.errors import CheckpointNotFound, ConcurrentCompactionError, CorruptionError

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(snapstore.__file__)))
SIZE = 256 << 10
CHUNK = 16384


def _trimmable(path: str):
    """A writer store with checkpoint a (full) and b (a delta over a changing the second page
    of each chunk): once a is deleted, a compaction with max_chain=1 folds b and trims a's
    chunks (b uses 3/4 of each), moving them to new segments. Returns (store, a, b, b's
    bytes)."""
    s = snapstore.open(path, durability="none", segment_size=1 << 16, chunk_size=CHUNK)
    rng = random.Random(3)
    w = bytearray(rng.randbytes(SIZE))
    a = s.checkpoint({"w": w}, stream="d")
    for p in range(4096, SIZE, CHUNK):
        w[p:p + 4096] = rng.randbytes(4096)
    b = s.checkpoint({"w": w}, stream="d")
    assert b.kind == "incremental"
    return s, a, b, bytes(w)


@contextlib.contextmanager
def compaction_at_first_read(store, compact, headers: bool = True):
    """Runs compact() (once) when a read session of store's backend first reads (headers
    False: first reads past a segment's header, i.e. a chunk): after the reader took its
    index snapshot, before it read a chunk. Yields the list compact()'s result goes into,
    and a list counting the read sessions opened."""
    backend = store.backend
    real_open_reader = backend.open_reader
    fired: list = []
    started: list = []
    sessions = [0]

    def open_reader():
        sessions[0] += 1
        session = real_open_reader()
        real_read, real_read_into = session.read, session.read_into

        def fire(offset):
            if not started and (headers or offset >= fmt.SEGMENT_HEADER.size):         # once (compact() itself may read through this backend)
                started.append(True)
                fired.append(compact())

        def read(number, offset, length):
            fire(offset)
            return real_read(number, offset, length)

        def read_into(number, offset, buf):
            fire(offset)
            return real_read_into(number, offset, buf)
        session.read, session.read_into = read, read_into
        return session
    backend.open_reader = open_reader
    try:
        yield fired, sessions
    finally:
        del backend.open_reader


def _trim(writer, a):
    def compact():
        writer.delete(a.id)
        return writer.compact(threshold=0.9, max_chain=1)
    return compact


def _moved_chunks(report: dict) -> None:
    """The compaction trimmed chunks and removed the segments they were in."""
    assert report["chunks_trimmed"] > 0 and report["segments_removed"] > 0, report


def test_savepoint_of_a_live_checkpoint_whose_chunks_a_compaction_trims(tmp_path):
    writer, a, b, want = _trimmable(str(tmp_path / "s"))
    before = writer.manifests(b.id)
    reader = snapstore.open(str(tmp_path / "s"), readonly=True)
    out = str(tmp_path / "b.snap")
    try:
        with compaction_at_first_read(reader, _trim(writer, a)) as (fired, sessions):
            result = snapstore.export_savepoint(reader, b.id, out)
        _moved_chunks(fired[0])
        assert sessions[0] >= 2             # read again on a new snapshot
        assert result.checkpoint == b.id
        after = writer.manifests(b.id)
        assert after.chunk_ids() != before.chunk_ids()      # b names the trimmed chunks now
        with snapstore.open(str(tmp_path / "t"), durability="none") as target:
            info = snapstore.import_savepoint(target, out)
            assert target.restore(info.id)["w"] == want
        assert writer.restore(b.id)["w"] == want and writer.verify(deep=True)["ok"]
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("kind", ["savepoint", "copy"])
def test_segments_removed_after_the_reader_opened_them_are_read_without_retry(tmp_path,
                                                                             kind):
    """read_chunks opens its snapshot's segments before reading a chunk: a compaction that
    removes them after that leaves the read whole, in its one session (no read again)."""
    writer, a, b, want = _trimmable(str(tmp_path / "s"))
    reader = snapstore.open(str(tmp_path / "s"), readonly=True)
    try:
        with snapstore.open(str(tmp_path / "t"), durability="none") as target:
            with compaction_at_first_read(reader, _trim(writer, a), headers=False) as (
                    fired, sessions):
                if kind == "savepoint":
                    snapstore.export_savepoint(reader, b.id, str(tmp_path / "b.snap"))
                else:
                    copied = snapstore.copy_checkpoints(reader, target, [b.id]).copied[b.id]
            _moved_chunks(fired[0])
            assert sessions[0] == 1
            if kind == "savepoint":
                copied = snapstore.import_savepoint(target, str(tmp_path / "b.snap")).id
            assert target.restore(copied)["w"] == want
    finally:
        reader.close()
        writer.close()


def test_savepoint_with_a_compaction_right_after_its_first_index_snapshot(tmp_path,
                                                                          monkeypatch):
    """The reported failure: a compaction that trims the checkpoint's chunks as soon as the
    export's first index snapshot ends (it had read the manifests there, and read the chunks
    from a second snapshot: "the store has no chunk ...: `snapstore repair`"). The export
    is exact, from its one snapshot."""
    writer, a, b, want = _trimmable(str(tmp_path / "s"))
    reader = snapstore.open(str(tmp_path / "s"), readonly=True)
    out = str(tmp_path / "b.snap")
    real_read = Index.read
    fired: list = []

    @contextlib.contextmanager
    def read_then_compact(self):
        with real_read(self) as view:
            yield view
        if not fired:
            fired.append(None)      # once: compact() reads the index too
            fired[0] = _trim(writer, a)()
    try:
        monkeypatch.setattr(Index, "read", read_then_compact)
        snapstore.export_savepoint(reader, b.id, out)
        monkeypatch.undo()
        _moved_chunks(fired[0])
        with snapstore.open(str(tmp_path / "t"), durability="none") as target:
            assert target.restore(snapstore.import_savepoint(target, out).id)["w"] == want
    finally:
        monkeypatch.undo()
        reader.close()
        writer.close()


def test_copy_of_a_live_checkpoint_whose_chunks_a_compaction_trims(tmp_path):
    writer, a, b, want = _trimmable(str(tmp_path / "s"))
    reader = snapstore.open(str(tmp_path / "s"), readonly=True)
    try:
        with snapstore.open(str(tmp_path / "dst"), durability="none") as dst:
            with compaction_at_first_read(reader, _trim(writer, a)) as (fired, sessions):
                result = snapstore.copy_checkpoints(reader, dst, [b.id])
            _moved_chunks(fired[0])
            assert sessions[0] >= 2
            assert dst.restore(result.copied[b.id])["w"] == want
            # the chunks of the attempt the compaction cut short are not counted
            assert result.chunks_sent == len(writer.manifests(b.id).chunk_ids())
            assert dst.verify(deep=True)["ok"]
    finally:
        reader.close()
        writer.close()


def test_a_checkpoint_deleted_and_compacted_while_it_is_exported_is_not_found(tmp_path):
    """Not a CorruptionError, and no file (nor a temporary one) is left."""
    writer, a, b, _ = _trimmable(str(tmp_path / "s"))
    out = tmp_path / "out"
    out.mkdir()

    def delete_all():
        writer.delete_many([a.id, b.id])
        return writer.compact(threshold=1.0)
    try:
        with compaction_at_first_read(writer, delete_all) as (fired, _):
            with pytest.raises(CheckpointNotFound, match="deleted by another writer"):
                snapstore.export_savepoint(writer, b.id, str(out / "b.snap"))
        assert fired[0]["segments_removed"] > 0
        assert os.listdir(out) == []
    finally:
        writer.close()


def test_copying_everything_skips_a_checkpoint_deleted_while_it_is_copied(tmp_path):
    writer, a, b, _ = _trimmable(str(tmp_path / "s"))

    def delete_b():
        writer.delete(b.id)
        return writer.compact(threshold=1.0)
    try:
        with snapstore.open(str(tmp_path / "dst"), durability="none") as dst:
            with compaction_at_first_read(writer, delete_b) as (fired, _):
                result = snapstore.copy_checkpoints(writer, dst)
            assert fired[0]["segments_removed"] > 0
            # a was copied (before or after the compaction: its bytes either way); b is gone
            assert list(result.copied) == [a.id] and not result.skipped
            assert dst.restore(result.copied[a.id]) == writer.restore(a.id)
    finally:
        writer.close()


def _flip_in_chunk(store, chunk_id: bytes) -> None:
    """Flips a byte of the stored bytes of the chunk's record (found by its id, which the
    record holds), in its segment file."""
    seg_dir = os.path.join(store.path, fmt.SEGMENTS_DIR)
    for name in sorted(os.listdir(seg_dir)):
        path = os.path.join(seg_dir, name)
        with open(path, "r+b") as f:
            data = f.read()
            at = data.find(chunk_id)
            if at >= 0:
                f.seek(at + 200)
                f.write(bytes([data[at + 200] ^ 0x40]))
                return
    raise AssertionError("no record of the chunk")


def test_damage_is_still_a_corruption_error_not_a_retry(tmp_path):
    """A chunk record failing its checks in a segment that is still there is damage: export
    and copy raise CorruptionError (not CheckpointNotFound, not ConcurrentCompactionError
    after READ_ATTEMPTS reads), and no file is left."""
    writer, a, b, _ = _trimmable(str(tmp_path / "s"))
    out = str(tmp_path / "b.snap")
    try:
        _flip_in_chunk(writer, writer.layout(b.id, "w")[0][2])
        with pytest.raises(CorruptionError):
            snapstore.export_savepoint(writer, b.id, out)
        assert not os.path.exists(out)
        with snapstore.open(str(tmp_path / "dst"), durability="none") as dst:
            with pytest.raises(CorruptionError):
                snapstore.copy_checkpoints(writer, dst, [b.id])
            assert dst.checkpoints() == []
    finally:
        writer.close()


def _arrays_store(path: str):
    """A writer store with two array checkpoints of stream "arr" (the second a delta) and
    a junk checkpoint after each, sharing segments with them. Returns (store, first, second,
    second's array, junk ids)."""
    np = pytest.importorskip("numpy")
    s = snapstore.open(path, durability="none", segment_size=1 << 16, chunk_size=CHUNK)
    rng = random.Random(7)
    x = np.random.default_rng(5).standard_normal(SIZE // 4).astype(np.float32)
    first = snapstore.save_arrays(s, {"x": x}, stream="arr")
    junk = [s.checkpoint({"j": rng.randbytes(100 << 10)}, stream="junk").id]
    x = x.copy()
    x[::4096] += 1
    second = snapstore.save_arrays(s, {"x": x}, stream="arr")
    junk.append(s.checkpoint({"j": rng.randbytes(100 << 10)}, stream="junk").id)
    junk.append(s.checkpoint({"j": rng.randbytes(100 << 10)}, stream="junk").id)
    return s, first, second, x, junk


def _drop(writer, checkpoint_id: int):
    """Deletes a checkpoint and compacts every segment holding garbage."""
    def compact():
        writer.delete(checkpoint_id)
        return writer.compact(threshold=1.0)
    return compact


def test_tensor_export_and_diff_read_again_when_a_compaction_moves_their_chunks(tmp_path):
    np = pytest.importorskip("numpy")
    writer, first, second, x, junk = _arrays_store(str(tmp_path / "s"))
    want_diff = diff.diff_checkpoints(writer, first.id, second.id)
    assert want_diff["changed_bytes"] > 0
    reader = snapstore.open(str(tmp_path / "s"), readonly=True)
    out = str(tmp_path / "x.npz")
    try:
        # the race is real: a restore under it reads again (it raised the retryable error)
        with compaction_at_first_read(reader, _drop(writer, junk[0])) as (fired, sessions):
            got = reader.restore(second.id)
        assert fired[0]["segments_removed"] > 0 and sessions[0] >= 2
        assert got == writer.restore(second.id)
        with compaction_at_first_read(reader, _drop(writer, junk[1])) as (fired, _):
            result = snapstore.export(reader, second.id, out)
        assert fired[0]["segments_removed"] > 0 and result.tensors == 1
        with np.load(out) as f:
            assert f["x"].tobytes() == x.tobytes()
        with compaction_at_first_read(reader, _drop(writer, junk[2])) as (fired, _):
            got = diff.diff_checkpoints(reader, first.id, second.id)
        assert fired[0]["segments_removed"] > 0
        assert got == want_diff
    finally:
        reader.close()
        writer.close()


@pytest.mark.parametrize("how", ["restore", "restore_into", "read", "read_ranges"])
def test_primitive_reads_read_again_when_a_compaction_moves_their_chunks(tmp_path, how):
    """Regression: restore, restore_into, read and read_ranges raised ConcurrentCompactionError
    to their callers, so every layer above them (LangGraph's get_tuple and list, workflows,
    object loads) failed at random while `retain` + `compact` ran in another process. Now
    they read again on a new snapshot, as export and copy do."""
    writer, a, b, want = _trimmable(str(tmp_path / "s"))
    reader = snapstore.open(str(tmp_path / "s"), readonly=True)
    calls = {
        "restore": lambda: reader.restore(b.id)["w"],
        "restore_into": lambda: (lambda t: (reader.restore_into(b.id, {"w": t}), bytes(t))[1])(
            bytearray(SIZE)),
        "read": lambda: reader.read(b.id, "w"),
        "read_ranges": lambda: reader.read_ranges(b.id, "w", [(0, SIZE)]),
    }
    try:
        with compaction_at_first_read(reader, _trim(writer, a), headers=False) as (fired, n):
            got = calls[how]()
        _moved_chunks(fired[0])
        assert n[0] >= 2 and got == want
    finally:
        reader.close()
        writer.close()


def test_a_read_that_compactions_keep_moving_gives_up_after_read_attempts(tmp_path,
                                                                         monkeypatch):
    from snapstore import store as store_module
    from snapstore.engine import reader as engine_reader
    writer, a, b, want = _trimmable(str(tmp_path / "s"))
    real, attempts = store_module.restore_range, []

    def always_moved(*args, **kwargs):
        attempts.append(args[2].id)          # (view, backend, commit, ...)
        raise ConcurrentCompactionError("chunk … was moved by a compaction")
    monkeypatch.setattr(store_module, "restore_range", always_moved)
    try:
        with pytest.raises(ConcurrentCompactionError, match="times in a row"):
            writer.restore(b.id)
        assert attempts == [b.id] * engine_reader.READ_ATTEMPTS
        monkeypatch.setattr(store_module, "restore_range", real)
        assert writer.restore(b.id)["w"] == want
    finally:
        writer.close()


def test_a_retried_read_keeps_the_checkpoint_it_first_resolved(tmp_path):
    """"latest" resolved by the first attempt stays that checkpoint in the retry, though a
    newer one was committed meanwhile; a checkpoint deleted meanwhile is CheckpointNotFound."""
    writer, a, b, want = _trimmable(str(tmp_path / "s"))
    reader = snapstore.open(str(tmp_path / "s"), readonly=True)

    def newer_then_compact():
        writer.checkpoint({"w": b"newer"}, stream="d")
        return _trim(writer, a)()
    try:
        with compaction_at_first_read(reader, newer_then_compact, headers=False) as (fired, n):
            got = reader.restore("latest")
        _moved_chunks(fired[0])
        assert n[0] >= 2 and got == {"w": want}

        def delete_then_compact():
            writer.delete(b.id)
            return writer.compact(threshold=0.0)
        with compaction_at_first_read(reader, delete_then_compact, headers=False) as (fired, _):
            with pytest.raises(CheckpointNotFound, match="deleted by another writer"):
                reader.read(b.id, "w")
    finally:
        reader.close()
        writer.close()


# ---- two processes -------------------------------------------------------------------------

WRITER = r"""
import hashlib, random, sys, time
import snapstore
path, seconds = sys.argv[1], float(sys.argv[2])
rng = random.Random(11)
size = 512 << 10
w = bytearray(rng.randbytes(size))
with snapstore.open(path, durability="none", segment_size=1 << 17, chunk_size=16384,
                    max_chain=4) as s:
    s.checkpoint({"w": w}, stream="data", meta={"sha": hashlib.sha256(w).hexdigest()})
    print("ready", flush=True)
    rounds = removed = trimmed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rounds += 1
        for _ in range(6):
            p = rng.randrange(0, size - 4096) & ~4095
            w[p:p + 4096] = rng.randbytes(4096)
        s.checkpoint({"w": w}, stream="data", meta={"sha": hashlib.sha256(w).hexdigest()})
        s.delete(s.checkpoint({"j": rng.randbytes(64 << 10)}, stream="junk").id)
        s.delete_many(s.checkpoint_ids("data")[:-2])
        report = s.compact(threshold=0.9, max_chain=1 + rounds % 3)
        removed += report["segments_removed"]
        trimmed += report["chunks_trimmed"]
    print("done", rounds, removed, trimmed, flush=True)
"""


def test_exports_and_copies_while_another_process_deletes_and_compacts(tmp_path):
    """A writer process checkpoints, deletes all but its last two checkpoints and compacts
    (trimming, collecting and moving chunks) for a few seconds, while this process exports
    savepoints of, and copies, its oldest and newest checkpoints. Every export and copy is
    exact (checked against the sha256 the writer put in the meta) or CheckpointNotFound (the
    checkpoint was deleted); nothing else."""
    path = str(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", WRITER, path, "4"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    outcomes = {"exported": 0, "copied": 0, "gone": 0}
    errors: list = []
    try:
        assert proc.stdout.readline().strip() == "ready"
        store = snapstore.open(path, readonly=True)
        target = snapstore.open(str(tmp_path / "t"), durability="none")
        out = str(tmp_path / "x.snap")
        i = 0
        while proc.poll() is None and not errors:
            i += 1
            ids = store.checkpoint_ids("data")
            cid = ids[0] if i % 3 else ids[-1]      # mostly the one about to be deleted
            try:
                if i % 2:
                    snapstore.export_savepoint(store, cid, out, force=True)
                    made = snapstore.import_savepoint(target, out)
                    outcomes["exported"] += 1
                else:
                    made = target.get(snapstore.copy_checkpoints(store, target,
                                                                 [cid]).copied[cid])
                    outcomes["copied"] += 1
            except CheckpointNotFound:
                outcomes["gone"] += 1
                continue
            except Exception as exc:     # noqa: BLE001 - reported below
                errors.append(f"checkpoint {cid}: {exc!r}")
                break
            got = hashlib.sha256(target.restore(made.id)["w"]).hexdigest()
            if got != made.meta["sha"]:
                errors.append(f"wrong bytes from checkpoint {cid}")
            target.delete(made.id)
        target.close()
        store.close()
    finally:
        if errors:
            proc.kill()
        out_text, err_text = proc.communicate(timeout=60)
    assert not errors, errors
    assert proc.returncode == 0, err_text[-2000:]
    _, rounds, removed, trimmed = out_text.split()[-4:]
    print(f"\n{outcomes}; writer: {rounds} rounds, {removed} segments removed, "
          f"{trimmed} chunks trimmed")
    assert int(rounds) >= 5 and int(removed) > 0 and int(trimmed) > 0
    assert outcomes["exported"] >= 5 and outcomes["copied"] >= 5, outcomes
