"""Stores whose byte planes rotate by 3 bits (format 6, compression_level 3) through the
maintenance paths: a compaction copies their records as they are, a repair rebuilds their
index from the log, verify finds nothing, readers of another level read them, a level-1 writer
goes on in the same store, and the boring cases (one item, an odd tail, all zeros, NaN and
infinities, the same checkpoint twice) restore byte-exact."""
from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine.backends import LocalSegments
from snapstore.engine.chunks import stored_chunk
from snapstore.engine.wal import Record, scan


def rotations_in(path: str) -> dict:
    """{(item size, rotation): records} of the byte-plane chunk records of a store's log."""
    backend = LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR))
    out: dict = {}
    for number in backend.list():
        for r in scan(backend, number, 0):
            if isinstance(r, Record) and r.rtype == fmt.REC_CHUNK and \
                    r.codec == fmt.CODEC_PLANES:
                key = fmt.PLANES_HEADER.unpack_from(stored_chunk(r).stored)
                out[key] = out.get(key, 0) + 1
    return out


def weights(seed: int, n: int = 3 * 16384 + 5) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.02).astype(np.float32)


def test_compaction_and_repair_keep_rotated_records(tmp_path):
    path = str(tmp_path / "s")
    with snapstore.open(path, durability="none", compression_level=3,
                        segment_size=1 << 16) as s:
        ids = [s.checkpoint({"w": weights(i)}, "w").id for i in range(4)]
        assert {r for _, r in rotations_in(path)} == {3}
        s.delete(ids[0])
        s.delete(ids[2])
        s.compact(threshold=0.01)
        assert {r for _, r in rotations_in(path)} == {3}       # copied as they were
        for i in (1, 3):
            assert s.restore(ids[i]) == {"w": weights(i).tobytes()}
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
    report = snapstore.repair(path)
    assert report["ok"], report["problems"][:5]
    with snapstore.open(path, readonly=True) as s:
        assert [c.id for c in s.checkpoints()] == [ids[1], ids[3]]
        for i in (1, 3):
            assert s.restore(ids[i]) == {"w": weights(i).tobytes()}
        assert s.verify(deep=True)["ok"]


def test_a_level_1_writer_goes_on_in_a_rotated_store(tmp_path):
    """Rotation is each record's own: a writer at the default level writes rotation 1 into
    the same store and log; both kinds restore, also in one checkpoint's chain."""
    path = str(tmp_path / "s")
    w = weights(1)
    with snapstore.open(path, durability="none", compression_level=3) as s:
        first = s.checkpoint({"w": w}, "w")
    w2 = weights(2)
    with snapstore.open(path, durability="none") as s:
        second = s.checkpoint({"w": w2}, "w")
        w3 = w2.copy()
        w3[:100] = 0
        third = s.checkpoint({"w": w3}, "w")                  # a delta over the second
        assert third.kind == "incremental"
        assert s.restore(first.id) == {"w": w.tobytes()}
        assert s.restore(second.id) == {"w": w2.tobytes()}
        assert s.restore(third.id) == {"w": w3.tobytes()}
        assert s.verify(deep=True)["ok"]
    assert {r for _, r in rotations_in(path)} == {1, 3}


@pytest.mark.parametrize("values", [
    np.zeros(0, np.float32), np.ones(1, np.float32), np.zeros(40_000, np.float32),
    np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, -1e-45, 3.4e38] * 5000, np.float32),
    np.arange(40_003, dtype=np.float32),
    (np.random.default_rng(3).integers(0, 2**32, 40_000, dtype=np.uint64)
     .astype(np.uint32).view(np.float32)),                     # random bits labelled floats
])
def test_boring_and_odd_floats_round_trip_at_level_3(tmp_path, values):
    with snapstore.open(str(tmp_path / "s"), durability="none", compression_level=3) as s:
        a = s.checkpoint({"w": values}, "w")
        b = s.checkpoint({"w": values}, "w")                   # the same twice: nothing new
        assert b.bytes_new < 4096
        for info in (a, b):
            assert s.restore(info.id) == {"w": values.tobytes()}
        assert s.verify(deep=True)["ok"]


def test_a_rotated_store_copies_to_one_of_level_1(tmp_path):
    """copy_checkpoints moves decoded chunks: the destination codes them by its own options
    and log (here rotation 1), and everything restores the same."""
    from snapstore.copying import copy_checkpoints
    src_path, dst_path = str(tmp_path / "src"), str(tmp_path / "dst")
    w = weights(5)
    with snapstore.open(src_path, durability="none", compression_level=3) as src, \
            snapstore.open(dst_path, durability="none") as dst:
        info = src.checkpoint({"w": w}, "w")
        copy_checkpoints(src, dst, [info.id])
        [copied] = dst.checkpoints()
        assert dst.restore(copied.id) == {"w": w.tobytes()}
    assert {r for _, r in rotations_in(src_path)} == {3}
    # the destination has no item size for copied chunks: planes or not, never rotation 3
    assert 3 not in {r for _, r in rotations_in(dst_path)}
