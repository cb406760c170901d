"""Format 5 delta chunks (CODEC_DELTA_PLANES), end to end through the public API.

A chunk of a float buffer that holds one run of the buffer's bytes (a full plan, or a tracker's
delta of every page) is coded against the parent checkpoint's chunk at the same place
(writer.choose_bases: star topology, every delta one level deep), and the index keeps each
base alive by an edge (ChunkEntry.base; refs = extents + edges). What holds here:

  * every read path gives back exactly the bytes checkpointed, checked against the arrays the
    test wrote (restore, restore_into, read, read_ranges, read_chunks, diff, copy to another
    store, savepoint export/import, checkpoint_async), for float16/32/64, odd sizes, NaN /
    inf / -0.0 / denormals, relabelled bytes, size changes, empty buffers; layers of at least
    1 MiB (reader.copy_extents_parallel) and smaller ones (ChunkReader, one chunk at a time);
  * the index invariant after every step: a chunk's count is the extents naming it plus the
    delta chunks naming it as their base; a base exists, is plain and is as long (edges());
  * deletes, retain and compaction keep bases while a delta needs them and free everything
    once nothing does (the index empty of chunks, the segments back to their headers);
  * a writer SIGKILLed inside a delta checkpoint (crash points and random moments) or inside
    a compaction leaves the last checkpoint wholly there or absent, restoring exact;
  * a flipped bit in a delta chunk's record or in its base's raises CorruptionError on every
    read path, never wrong bytes; a damaged base never stops the next checkpoint;
  * compaction reaches a fixed point (bases and used delta chunks count as needed whole).
"""
from __future__ import annotations

import errno
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import blake3
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapstore
from snapstore import diff as sdiff
from snapstore.engine import format as fmt
from snapstore.engine.backends import segment_name
from snapstore.errors import CorruptionError

from faulty_backend import FaultyBackend

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOLDEN_FLOATS = os.path.join(ROOT, "tests", "golden", "stores", "v4", "floats")
N = 256 * 1024          # float32 items: 1 MiB, 16 chunks of 64 KiB (a parallel restore layer)


# ---- helpers -----------------------------------------------------------------------------

def open_store(path, **options):
    options.setdefault("durability", "none")
    return snapstore.open(path, **{"delta_chunks": True, **options})


def without_deltas(store):
    """The same store's writes with delta chunks off (WriteOptions.delta_chunks)."""
    store.options.delta_chunks = False
    return store


def drift(a, rng, rel=0.01):
    """Every value changed by a relative ~rel: an optimizer step (what delta chunks are for)."""
    with np.errstate(all="ignore"):
        return (a * (1 + rng.normal(0, rel, a.shape))).astype(a.dtype)


def weights(rng, n=N, dtype=np.float32):
    return rng.normal(0, 0.02, n).astype(dtype)


def chunk_table(store) -> dict:
    with store._committer.read() as r:
        return dict(r.chunks())


def delta_entries(store) -> dict:
    return {c: e for c, e in chunk_table(store).items() if e.codec == fmt.CODEC_DELTA_PLANES}


def test_delta_chunks_are_off_by_default_and_on_by_option(tmp_path):
    """open()'s default codes every chunk on its own (a checkpoint about twice as fast); the
    option turns delta chunks on and off per Store, over the same store."""
    rng = np.random.default_rng(40)
    w = weights(rng)
    path = tmp_path / "s"
    with snapstore.open(path, durability="none") as s:
        assert s.options.delta_chunks is False
        s.checkpoint({"w": w}, stream="w")
        w = drift(w, rng)
        plain = s.checkpoint({"w": w}, stream="w")
        assert delta_entries(s) == {}
    with snapstore.open(path, durability="none", delta_chunks=True) as s:
        w = drift(w, rng)
        delta = s.checkpoint({"w": w}, stream="w")
        assert len(delta_entries(s)) == N * 4 // 65536
        assert delta.bytes_new < 0.8 * plain.bytes_new
        assert_reads(s, delta.id, {"w": w.tobytes()})


def edges(store) -> dict:
    """Checks the index's edge invariant and returns the chunk table: every chunk's count is
    the extents of the stored manifests naming it plus the delta chunks naming it as their
    base; a delta chunk (and only one) names a base, which exists, is plain (depth 1: star
    topology) and is as long; no manifest names a chunk the index lacks."""
    want: Counter = Counter()
    with store._committer.read() as r:
        table = dict(r.chunks())
        for ck in r.checkpoint_ids():
            commit = r.checkpoint(ck)
            for bi in range(len(commit.buffers)):
                for _, _, _, cid in fmt.EXTENT.iter_unpack(r.manifest(ck, bi)):
                    want[cid] += 1
    for cid, e in table.items():
        assert (e.base is not None) == (e.codec == fmt.CODEC_DELTA_PLANES)
        if e.base is not None:
            want[e.base] += 1
            base = table.get(e.base)
            assert base is not None, f"delta chunk {cid.hex()[:12]} lost its base"
            assert base.base is None, "a base is itself a delta chunk (depth > 1)"
            assert base.raw_len == e.raw_len
    assert not [c for c in want if c not in table], "a manifest names a chunk the index lacks"
    bad = {c.hex()[:12]: (e.refs, want[c]) for c, e in table.items() if e.refs != want[c]}
    assert not bad, f"reference counts (index, expected): {bad}"
    return table


def assert_reads(store, checkpoint_id, ref: dict) -> None:
    """Every read path of the checkpoint gives exactly the reference bytes {name: bytes}."""
    got = store.restore(checkpoint_id)
    assert set(got) == set(ref)
    for name, data in ref.items():
        data = bytes(data)
        n = len(data)
        assert got[name] == data, f"restore of {name!r}"
        target = bytearray(n)
        store.restore_into(checkpoint_id, {name: target})
        assert target == data, f"restore_into of {name!r}"
        assert store.read(checkpoint_id, name) == data
        ranges = [(0, 0), (0, min(n, 1)), (n // 2, min(1, n - n // 2)), (max(0, n - 1), min(n, 1)),
                  (min(n, 3), max(0, n - 6)),                        # nearly all of it
                  (min(n, 65536 - 5), min(max(0, n - 65531), 10)),   # across a chunk boundary
                  (min(n, 70000), min(max(0, n - 70000), 4000)),     # inside one chunk
                  (n, 0)]
        for off, length in ranges:
            assert store.read(checkpoint_id, name, off, length) == data[off:off + length], \
                f"read({name!r}, {off}, {length})"
        assert store.read_ranges(checkpoint_id, name, ranges) == \
            b"".join(data[o:o + k] for o, k in ranges), f"read_ranges of {name!r}"
        out = bytearray(sum(k for _, k in ranges))
        assert store.read_ranges(checkpoint_id, name, ranges, out) is out
        assert out == b"".join(data[o:o + k] for o, k in ranges)


def assert_chunks_read(store, ids) -> None:
    """read_chunks decodes delta chunks and bases to the bytes their ids hash from."""
    for cid, data in store.read_chunks(list(ids)):
        assert blake3.blake3(bytes(data)).digest() == cid


def flip_bit(path: str, entry, at: int) -> None:
    """Flips one bit of the record of a chunk entry, `at` bytes from the record's start."""
    name = os.path.join(path, "segments", segment_name(entry.segment))
    with open(name, "r+b") as f:
        f.seek(entry.offset + at)
        byte = f.read(1)[0]
        f.seek(entry.offset + at)
        f.write(bytes([byte ^ 0x10]))


def segments_bytes(path: str) -> int:
    seg = os.path.join(path, "segments")
    return sum(os.path.getsize(os.path.join(seg, f)) for f in os.listdir(seg))


def versions(seed: int, count: int, n: int = N, rel: float = 0.01) -> list:
    rng = np.random.default_rng(seed)
    out = [weights(rng, n)]
    for _ in range(count - 1):
        out.append(drift(out[-1], rng, rel))
    return out


# ---- delta chunks are made, and pay ---------------------------------------------------------

def test_a_drifted_float_buffer_is_stored_as_delta_chunks_smaller(tmp_path):
    rng = np.random.default_rng(0)
    w = weights(rng)
    w2 = drift(w, rng)
    sizes = {}
    for deltas in (True, False):
        s = open_store(tmp_path / str(deltas))
        if not deltas:
            without_deltas(s)
        a = s.checkpoint({"w": w}, stream="w")
        b = s.checkpoint({"w": w2}, stream="w")
        assert (a.kind, b.kind) == ("full", "full")
        sizes[deltas] = b.bytes_new
        table = edges(s)
        made = [e for e in table.values() if e.base is not None]
        assert len(made) == (16 if deltas else 0)
        assert_reads(s, a.id, {"w": w.tobytes()})
        assert_reads(s, b.id, {"w": w2.tobytes()})
        s.close()
    assert sizes[True] < 0.7 * w.nbytes < 0.8 * w.nbytes < sizes[False]


@pytest.mark.parametrize("dtype,n", [
    (np.float32, N),              # 1 MiB layers: restored by the parallel decoder
    (np.float32, 200_003),        # under 1 MiB: read chunk by chunk; a 13,932-byte tail
    (np.float16, 2 * N + 7),      # odd item count, > 1 MiB
    (np.float16, 40_001),
    (np.float64, N // 2 + 3),
    (np.float64, 9_999),          # smaller than one chunk
])
def test_every_read_path_is_exact_per_dtype_and_size(tmp_path, dtype, n):
    rng = np.random.default_rng(1)
    s = open_store(tmp_path / "s")
    vs = [weights(rng, n, dtype)]
    for _ in range(3):
        vs.append(drift(vs[-1], rng))
    infos = [s.checkpoint({"w": v, "small": v[:100]}, stream="w") for v in vs]
    table = edges(s)
    if n * np.dtype(dtype).itemsize >= 2 * fmt.DEFAULT_CHUNK_SIZE:
        assert any(e.base is not None for e in table.values())
    for info, v in zip(infos, vs):
        assert_reads(s, info.id, {"w": v.tobytes(), "small": v[:100].tobytes()})
    assert_chunks_read(s, table)
    s.close()


def test_nan_inf_signed_zero_and_denormals_are_bit_exact(tmp_path):
    s = open_store(tmp_path / "s")
    specials = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0, 1e-45, -1e-45, 1.17e-38,
                         3.4e38, -3.4e38], np.float32)
    a = np.resize(specials, N).copy()
    bits = a.view(np.uint32)
    bits[::7] = 0x7FC00001 + np.arange(bits[::7].size, dtype=np.uint32) % 4099   # NaN payloads
    bits[::11] = 0xFF800001                                                    # signalling NaN
    b = a.copy()
    b.view(np.uint32)[::3] ^= 1                       # every third value's last bit
    c = a.copy()
    c.view(np.uint32)[::2] ^= 0x80000000              # every other sign: -0.0 <-> 0.0 too
    infos = [s.checkpoint({"w": x}, stream="x") for x in (a, b, c)]
    assert any(e.base is not None for e in edges(s).values())
    for info, x in zip(infos, (a, b, c)):
        assert_reads(s, info.id, {"w": x.tobytes()})
    s.close()
    for d in (np.float16, np.float64):      # the same bits under the other float labels
        s = open_store(tmp_path / np.dtype(d).name)
        infos = [s.checkpoint({"w": x.view(d)}, stream="x") for x in (a, b, c)]
        for info, x in zip(infos, (a, b, c)):
            assert_reads(s, info.id, {"w": x.tobytes()})
        edges(s)
        s.close()


def test_random_bytes_labelled_float_are_stored_as_without_deltas(tmp_path):
    sizes = {}
    for deltas in (True, False):
        rng = np.random.default_rng(2)
        s = open_store(tmp_path / str(deltas))
        if not deltas:
            without_deltas(s)
        x = rng.integers(0, 1 << 32, N, dtype=np.uint32).view(np.float32)
        y = rng.integers(0, 1 << 32, N, dtype=np.uint32).view(np.float32)
        s.checkpoint({"w": x}, stream="r")
        info = s.checkpoint({"w": y}, stream="r")
        assert not [e for e in edges(s).values() if e.base is not None]   # none paid
        sizes[deltas] = info.bytes_new
        assert_reads(s, info.id, {"w": y.tobytes()})
        s.close()
    assert abs(sizes[True] - sizes[False]) < 64


def test_weights_pruned_since_the_keyframe_are_stored_plain(tmp_path):
    """Two thirds of the weights set to zero: the chunk codes far better on its own than its
    base did, so a delta (which only had to beat what the base takes) would be larger than
    plain planes and hold the keyframe besides: the probe compares with the plain coding."""
    rng = np.random.default_rng(5)
    w = weights(rng)
    pruned = w.copy()
    pruned[np.abs(pruned) < 0.02] = 0
    sizes = {}
    for on in (True, False):
        with open_store(tmp_path / str(on), delta_chunks=on) as s:
            s.checkpoint({"w": w}, stream="w")
            info = s.checkpoint({"w": pruned}, stream="w")
            sizes[on] = info.bytes_new
            assert delta_entries(s) == {}
            assert_reads(s, info.id, {"w": pruned.tobytes()})
    assert sizes[True] <= sizes[False] + 64


@pytest.mark.parametrize("fresh", ["normal", "uniform"])
def test_unrelated_floats_are_stored_plain_and_hold_no_keyframe(tmp_path, fresh):
    """Regression: new floats unrelated to the parent's (not a drift) were stored as delta
    chunks, their delta planes saving 1/32 of the raw length yet a little larger than plain
    planes, and held their bases besides: a retain kept two checkpoints' chunks. A delta must
    save 1/32 of what its base takes (writer._delta_limit)."""
    sizes = {}
    for deltas in (True, False):
        rng = np.random.default_rng(41)
        s = open_store(tmp_path / str(deltas))
        if not deltas:
            without_deltas(s)
        made = [rng.normal(0, 1, N).astype(np.float32) if fresh == "normal"
                else rng.random(N, dtype=np.float32) for _ in range(3)]
        infos = [s.checkpoint({"w": x}, stream="u") for x in made]
        assert delta_entries(s) == {}
        sizes[deltas] = [i.bytes_new for i in infos]
        s.retain("u", keep_last=1)
        s.compact()
        assert len(edges(s)) == 16          # the last checkpoint's chunks, no keyframe
        assert_reads(s, infos[-1].id, {"w": made[-1].tobytes()})
        s.close()
    assert all(abs(a - b) < 64 for a, b in zip(sizes[True], sizes[False])), sizes


def test_nothing_changed_stores_no_chunk_and_one_changed_byte_one_plain_page(tmp_path):
    rng = np.random.default_rng(3)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    s.checkpoint({"w": w}, stream="u")
    w2 = drift(w, rng)
    b = s.checkpoint({"w": w2}, stream="u")
    before = edges(s)
    same = s.checkpoint({"w": w2.copy()}, stream="u")
    assert same.kind == "incremental" and same.bytes_new < 1024
    assert edges(s).keys() == before.keys()
    w3 = w2.copy()
    w3.view(np.uint8)[12345] ^= 0x10
    one = s.checkpoint({"w": w3}, stream="u")
    after = edges(s)
    new = set(after) - set(before)
    assert one.kind == "incremental" and len(new) == 1
    assert after[new.pop()].base is None          # a page of a delta checkpoint: plain
    for info, x in ((b, w2), (same, w2), (one, w3)):
        assert_reads(s, info.id, {"w": x.tobytes()})
    s.close()


def test_empty_buffers_and_size_changes(tmp_path):
    rng = np.random.default_rng(4)
    s = open_store(tmp_path / "s")
    empty = np.zeros(0, np.float32)
    w = weights(rng, 70_001)
    steps = [w, drift(w, rng)]
    grown = drift(np.concatenate([steps[-1], steps[-1][:20_000]]), rng)   # larger
    steps += [grown, drift(grown, rng)]
    shrunk = drift(steps[-1][:50_000], rng)                                # smaller
    steps += [shrunk, drift(shrunk, rng), np.zeros(0, np.float32)]
    infos = [s.checkpoint({"e": empty, "w": x}, stream="e") for x in steps]
    edges(s)
    for info, x in zip(infos, steps):
        assert_reads(s, info.id, {"e": b"", "w": x.tobytes()})
    s.close()


def test_the_same_bytes_under_other_labels(tmp_path):
    """Bytes first stored as bytes (itemsize 1), then as float32, float16 and float64: a
    delta chunk's coding does not depend on how its base was coded."""
    rng = np.random.default_rng(5)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    steps = [w.view(np.uint8), drift(w, rng)]
    steps.append(drift(steps[-1], rng).view(np.float16))
    steps.append(steps[-1].view(np.float64))
    steps.append(drift(steps[-1].view(np.float32), rng).view(np.float64))
    steps.append(drift(steps[-1].view(np.float32), rng).view(np.uint8))
    infos = [s.checkpoint({"w": x}, stream="l") for x in steps]
    assert any(e.base is not None for e in edges(s).values())
    for info, x in zip(infos, steps):
        assert_reads(s, info.id, {"w": x.tobytes()})
    s.close()


# ---- keyframes: star topology, renewal ------------------------------------------------------

def test_many_checkpoints_code_against_one_keyframe_each(tmp_path):
    vs = versions(6, 12)
    s = open_store(tmp_path / "s")
    infos = []
    for v in vs:
        infos.append(s.checkpoint({"w": v}, stream="w"))
        edges(s)
    layouts = [{off: cid for off, _, cid, _ in s.layout(i.id, "w")} for i in infos]
    table = chunk_table(s)
    keyframes = set(layouts[0].values())
    for layout in layouts[1:]:
        for off, cid in layout.items():
            e = table[cid]
            if e.raw_len == fmt.DEFAULT_CHUNK_SIZE:
                # 1% drift never stops paying within 12 steps: always the first keyframe
                assert e.base == layouts[0][off] and e.base in keyframes
    for info, v in zip(infos, vs):
        assert_reads(s, info.id, {"w": v.tobytes()})
    s.close()


def test_a_delta_that_stopped_paying_makes_a_new_keyframe(tmp_path):
    vs = versions(7, 10, rel=0.03)      # larger steps: deltas grow past KEYFRAME_FRACTION
    s = open_store(tmp_path / "s")
    infos, renewed = [], []
    for v in vs:
        before = chunk_table(s)
        infos.append(s.checkpoint({"w": v}, stream="w"))
        table = edges(s)
        new = [table[c] for c in set(table) - set(before)]
        renewed.append(len(infos) > 1 and len(new) >= 16 and
                       all(e.base is None for e in new))
    assert any(renewed), "no keyframe was renewed"
    first = renewed.index(True)
    assert first + 1 < len(vs)
    # the checkpoint after a renewal codes against the new keyframes
    table = chunk_table(s)
    renewed_ids = {cid for _, _, cid, _ in s.layout(infos[first].id, "w")}
    after = [table[cid] for _, _, cid, _ in s.layout(infos[first + 1].id, "w")]
    assert any(e.base in renewed_ids for e in after if e.base is not None)
    for info, v in zip(infos, vs):
        assert_reads(s, info.id, {"w": v.tobytes()})
    s.close()


# ---- deletes, retain, compaction --------------------------------------------------------------

def test_deleting_the_keyframes_checkpoint_then_compacting_keeps_the_later_ones(tmp_path):
    vs = versions(8, 5, n=N + 3)
    s = open_store(tmp_path / "s")
    infos = [s.checkpoint({"w": v}, stream="w") for v in vs]
    keyframes = {cid for _, _, cid, _ in s.layout(infos[0].id, "w")}
    s.delete(infos[0].id)
    s.compact()
    table = edges(s)
    kept = keyframes & set(table)
    assert len(kept) >= 16                  # bases stay, with no extent naming them
    assert all(table[c].refs >= 1 for c in kept)
    for info, v in zip(infos[1:], vs[1:]):
        assert_reads(s, info.id, {"w": v.tobytes()})
    s.close()
    s = open_store(tmp_path / "s")          # and after a reopen
    for info, v in zip(infos[1:], vs[1:]):
        assert_reads(s, info.id, {"w": v.tobytes()})
    edges(s)
    s.close()


def test_retain_keep_last_one_then_compact(tmp_path):
    vs = versions(9, 6)
    s = open_store(tmp_path / "s")
    infos = [s.checkpoint({"w": v}, stream="w") for v in vs]
    result = s.retain("w", keep_last=1)
    assert sorted(result) == [i.id for i in infos[:-1]]
    s.compact()
    table = edges(s)
    assert len(table) == 2 * 16             # the last one's 16 deltas and their 16 keyframes
    assert_reads(s, infos[-1].id, {"w": vs[-1].tobytes()})
    assert_chunks_read(s, table)
    s.close()


def test_deleting_everything_then_compacting_leaves_no_chunk(tmp_path):
    vs = versions(10, 8, n=N + 5)
    path = tmp_path / "s"
    s = open_store(path)
    infos = [s.checkpoint({"w": v, "h": v.astype(np.float16)}, stream="w") for v in vs]
    full = segments_bytes(path)
    s.delete(infos[0].id)               # the keyframes' checkpoint first: edges keep them
    s.compact()
    assert edges(s)
    s.delete_many([i.id for i in infos[1:]])
    report = s.compact()
    assert chunk_table(s) == {}
    assert report["bytes_after"] < full // 100
    assert segments_bytes(path) < full // 100
    assert s.stats()["chunks"] == 0
    s.close()


def test_compaction_frees_dead_delta_chunks_whose_base_entry_is_missing(tmp_path):
    """A damaged index lost a base's entry; the delta chunks naming it are dead: GC removes
    them and everything else unused instead of failing on the missing base."""
    rng = np.random.default_rng(1)
    w = weights(rng)
    with open_store(tmp_path / "s") as s:
        a = s.checkpoint({"w": w}, stream="w")
        b = s.checkpoint({"w": drift(w, rng)}, stream="w")
        some_base = next(iter(delta_entries(s).values())).base
        s.delete_many([a.id, b.id])
        with s._committer.index.write() as w_:
            w_.delete_chunk(some_base)
        s.compact()
        assert chunk_table(s) == {}


def test_one_compaction_returns_the_keyframes_of_the_delta_chunks_it_frees(tmp_path):
    """Regression: with a stream's checkpoints deleted all at once (keyframes and delta chunks
    alike), one compaction's GC freed every chunk, but its choice of segments still counted
    the keyframes as needed (bases of the delta chunks the same GC freed): their segments
    stayed, and only a second compaction returned them (garbage.collectable)."""
    vs = versions(42, 4)
    path = tmp_path / "s"
    s = open_store(path, segment_size=1 << 18)
    infos = [s.checkpoint({"w": v}, stream="w") for v in vs]
    assert len(delta_entries(s)) == 3 * 16
    other = weights(np.random.default_rng(43), N // 4)
    keep = s.checkpoint({"o": other}, stream="o")
    s.delete_many([i.id for i in infos])
    first = s.compact()
    assert first["chunks_freed"] == 4 * 16
    assert set(edges(s)) == {cid for _, _, cid, _ in s.layout(keep.id, "o")}
    again = s.compact()
    assert_reads(s, keep.id, {"o": other.tobytes()})
    s.close()
    assert first["bytes_after"] < 2 * other.nbytes, first
    assert (again["segments_removed"], again["bytes_after"]) == (0, first["bytes_after"])


def test_stats_count_keyframes_held_only_by_deleted_delta_chunks_as_garbage(tmp_path):
    """Regression: stats() counted a keyframe whose only references were the edges of delta
    chunks no checkpoint uses as live; it is what the next compaction frees
    (garbage.collectable). While a live delta chunk needs it, it is live."""
    vs = versions(44, 3)
    s = open_store(tmp_path / "s")
    infos = [s.checkpoint({"w": v}, stream="w") for v in vs]
    everything = s.stats()
    assert everything["garbage_chunk_bytes"] == 0
    s.delete(infos[0].id)               # the keyframes' checkpoint: edges hold them, live
    assert s.stats()["live_chunk_bytes"] == everything["live_chunk_bytes"]
    s.delete_many([i.id for i in infos[1:]])
    st_ = s.stats()
    assert (st_["live_chunk_bytes"], st_["unique_chunk_bytes"]) == (0, 0), st_
    assert st_["garbage_chunk_bytes"] == everything["live_chunk_bytes"]
    report = s.compact()
    assert report["garbage_bytes_freed"] == st_["garbage_chunk_bytes"]
    assert chunk_table(s) == {}
    s.close()


def test_two_streams_sharing_a_base_and_a_trimmed_base(tmp_path):
    """A keyframe deduplicated into another stream, used there partially (which would make
    compaction trim it) while a delta chunk of the other stream still needs it whole: it is
    kept whole and not trimmed (a trimmed copy would only add bytes)."""
    rng = np.random.default_rng(11)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    a1 = s.checkpoint({"w": w}, stream="A")
    b1 = s.checkpoint({"w": w}, stream="B")
    assert b1.bytes_new < 4096              # deduplicated
    wa = w.copy()
    wa[:10 * 1024] *= np.float32(1.5)       # 10 of the 16 pages of chunk 0: an incremental
    a2 = s.checkpoint({"w": wa}, stream="A")
    wb = drift(w, rng)
    b2 = s.checkpoint({"w": wb}, stream="B")
    assert a2.kind == "incremental" and len(delta_entries(s)) == 16
    junk = s.checkpoint({"j": rng.integers(0, 255, 4 << 20, dtype=np.uint8)}, stream="C")
    s.delete_many([a1.id, b1.id, junk.id])
    report = s.compact()
    assert report["chunks_trimmed"] == 0   # chunk 0 is the base of B's first delta chunk
    edges(s)
    assert_reads(s, a2.id, {"w": wa.tobytes()})
    assert_reads(s, b2.id, {"w": wb.tobytes()})
    s.delete(a2.id)
    s.compact()
    assert_reads(s, b2.id, {"w": wb.tobytes()})
    s.delete(b2.id)
    s.compact()
    assert chunk_table(s) == {}
    s.close()


def test_delta_chunks_used_in_part_by_later_incrementals(tmp_path):
    """Incrementals over a checkpoint of delta chunks use those chunks in part; deleting their
    parents makes the children absorb the manifests (extents inside delta chunks), and
    max_chain folds them: the restore path then reads parts of delta chunks."""
    rng = np.random.default_rng(12)
    s = open_store(tmp_path / "s", max_chain=3)
    w = weights(rng, 2 * N + 1)
    steps = [w, drift(w, rng)]
    for _ in range(5):
        x = steps[-1].copy()
        x[rng.integers(0, x.size, 50)] *= np.float32(1.1)
        steps.append(x)
    infos = [s.checkpoint({"w": x}, stream="w") for x in steps]
    assert [i.kind for i in infos[2:]].count("incremental") >= 3
    for info, x in zip(infos, steps):
        assert_reads(s, info.id, {"w": x.tobytes()})
    s.delete_many([infos[0].id, infos[1].id, infos[3].id])
    left = [(i, x) for i, x in zip(infos, steps) if i.id not in
            (infos[0].id, infos[1].id, infos[3].id)]
    for info, x in left:
        assert_reads(s, info.id, {"w": x.tobytes()})
    s.compact()
    edges(s)
    for info, x in left:
        assert_reads(s, info.id, {"w": x.tobytes()})
    last = drift(steps[-1], rng)
    info = s.checkpoint({"w": last}, stream="w")
    assert_reads(s, info.id, {"w": last.tobytes()})
    edges(s)
    s.close()


def test_compaction_reaches_a_fixed_point_with_bases_only_edges_use(tmp_path):
    rng = np.random.default_rng(13)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    a = s.checkpoint({"w": w}, stream="w")
    w2 = drift(w, rng)
    b = s.checkpoint({"w": w2}, stream="w")
    s.delete(a.id)
    s.compact()
    assert s.stats()["garbage_chunk_bytes"] == 0
    again = s.compact()
    assert_reads(s, b.id, {"w": w2.tobytes()})
    s.close()
    assert (again["segments_rewritten"], again["live_bytes_copied"]) == (0, 0)


def test_compaction_reaches_a_fixed_point_with_delta_chunks_used_in_part(tmp_path):
    rng = np.random.default_rng(14)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    a = s.checkpoint({"w": w}, stream="w")
    w2 = drift(w, rng)
    b = s.checkpoint({"w": w2}, stream="w")
    w3 = w2.copy()
    for c in range(8):                  # 11 of the 16 pages of chunks 0-7: 34% of the buffer
        for page in range(11):
            at = c * 16384 + page * 1024
            w3[at:at + 1024] *= np.float32(1.5)
    c3 = s.checkpoint({"w": w3}, stream="w")
    assert c3.kind == "incremental"
    s.delete_many([a.id, b.id])         # c3 absorbs b's manifest: 5/16 of 8 delta chunks
    s.compact()
    again = s.compact()
    assert_reads(s, c3.id, {"w": w3.tobytes()})
    edges(s)
    s.close()
    assert (again["segments_rewritten"], again["live_bytes_copied"]) == (0, 0)


# ---- other read paths ------------------------------------------------------------------------

def test_diff_reports_exactly_the_changed_bytes(tmp_path):
    rng = np.random.default_rng(15)
    s = open_store(tmp_path / "s")
    a = weights(rng, 300_003)
    b = drift(a, rng)
    c = b.copy()
    c[1000:1010] = 0
    c[150_000] = -c[150_000]
    infos = [s.checkpoint({"w": x}, stream="w") for x in (a, b, c)]
    # gap 0 (the exact differing runs) where few bytes changed: 300,000 runs otherwise
    for (i, x), (j, y), gap in (((0, a), (1, b), 16), ((1, b), (2, c), 0),
                                ((0, a), (2, c), 16), ((2, c), (1, b), 0)):
        report = sdiff.diff_checkpoints(s, infos[i].id, infos[j].id, gap=gap)
        (entry,) = report["buffers"]
        xb = np.frombuffer(x.tobytes(), np.uint8)
        yb = np.frombuffer(y.tobytes(), np.uint8)
        changed = xb != yb
        marks = np.zeros(len(xb) + 1, np.int64)
        spans = np.array(entry["ranges"], np.int64).reshape(-1, 2)
        np.add.at(marks, spans[:, 0], 1)
        np.add.at(marks, spans[:, 0] + spans[:, 1], -1)
        covered = np.cumsum(marks)[:-1] > 0
        assert entry["changed_bytes"] == int(changed.sum())
        assert not (changed & ~covered).any()
        if gap == 0:
            assert not (covered & ~changed).any()
    s.close()


def test_copy_and_savepoint_give_the_same_bytes_elsewhere(tmp_path):
    rng = np.random.default_rng(16)
    src = open_store(tmp_path / "src")
    vs = [weights(rng, N + 1)]
    for _ in range(3):
        vs.append(drift(vs[-1], rng))
    hs = [v[:300_001 // 2].astype(np.float16) for v in vs]
    infos = [src.checkpoint({"w": v, "h": h}, stream="w") for v, h in zip(vs, hs)]
    src.delete(infos[0].id)                 # the keyframes' checkpoint: edges only now
    infos = infos[1:]
    refs = [{"w": v.tobytes(), "h": h.tobytes()} for v, h in zip(vs[1:], hs[1:])]
    dst = open_store(tmp_path / "dst")
    result = snapstore.copy_checkpoints(src, dst)
    assert sorted(result.copied) == [i.id for i in infos]
    for info, ref in zip(infos, refs):
        assert_reads(dst, result.copied[info.id], ref)
    edges(dst)
    again = snapstore.copy_checkpoints(src, dst)          # nothing new to send
    assert not again.copied and again.chunks_sent == 0
    path = str(tmp_path / "sp.snapsave")
    snapstore.export_savepoint(src, infos[-1].id, path)
    other = open_store(tmp_path / "other")
    imported = snapstore.import_savepoint(other, path)
    assert_reads(other, imported.id, refs[-1])
    # a checkpoint after the import in that store (its head has no fingerprints: full)
    nxt = drift(vs[-1], rng)
    info = other.checkpoint({"w": nxt, "h": hs[-1]}, stream="w")
    assert_reads(other, info.id, {"w": nxt.tobytes(), "h": hs[-1].tobytes()})
    edges(other)
    for st in (src, dst, other):
        st.close()


def test_with_manifests_holds_the_segments_of_the_bases_too(tmp_path):
    """Regression: with_manifests' read_chunks opened the segments of the chunks asked for
    before reading any, but not those of their bases: a compaction removing a keyframe's
    segment meanwhile (its checkpoint deleted, edges keep it) made the read fail
    (ConcurrentCompactionError inside) and use() run again from the start."""
    rng = np.random.default_rng(45)
    path = str(tmp_path / "s")
    s = open_store(path, segment_size=1 << 18)
    w = weights(rng, N // 4)
    infos = []
    for _ in range(3):
        junk = rng.integers(0, 255, N, dtype=np.uint8)     # garbage beside the keyframes
        infos.append(s.checkpoint({"junk": junk, "w": w}, stream="w"))
        w = drift(w, rng)
    s.delete(infos[0].id)
    table = chunk_table(s)
    deltas = {c for _, _, c, _ in s.layout(infos[2].id, "w") if table[c].base is not None}
    assert len(deltas) == 4
    base_segments = {table[table[c].base].segment for c in deltas}
    reader = snapstore.open(path, readonly=True)
    calls = []

    def use(manifests, read_chunks):
        calls.append(manifests.info.id)
        cids = list(dict.fromkeys(e[2] for b in manifests.buffers for e in b.extents))
        it = read_chunks(cids)
        first = next(it)                # the segments are held from here on
        if len(calls) == 1:
            s.compact(threshold=1.0, max_garbage=None)
            assert not all(os.path.exists(os.path.join(path, fmt.SEGMENTS_DIR,
                                                       segment_name(n)))
                           for n in base_segments), "no keyframe's segment was removed"
        return [first, *it]
    try:
        got = reader.with_manifests(infos[2].id, use)
        assert len(calls) == 1, "use() ran again"
        assert len(got) == 4 + 4 and deltas <= {c for c, _ in got}
        assert all(blake3.blake3(bytes(d)).digest() == c for c, d in got)
    finally:
        reader.close()
        s.close()


def test_checkpoint_async_makes_the_same_delta_chunks(tmp_path):
    rng = np.random.default_rng(17)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    futures = []
    for _ in range(5):
        futures.append((s.checkpoint_async({"w": w, "o": w[:1000]}, stream="a"), w.copy()))
        w = drift(w, rng)
    s.flush()
    infos = [(f.result(), x) for f, x in futures]
    assert all(i.bytes_new < 0.7 * x.nbytes for i, x in infos[1:])
    edges(s)
    for info, x in infos:
        assert_reads(s, info.id, {"w": x.tobytes(), "o": x[:1000].tobytes()})
    s.close()


def test_tracker_checkpoints_restore_exact(tmp_path):
    rng = np.random.default_rng(18)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    tracker = s.track({"w": w}, stream="t", mode="hash")
    out = []
    for step in range(4):
        w[:] = drift(w, rng)
        if step == 2:
            w[5000:5010] = 1.0
        out.append((tracker.checkpoint_async(), w.tobytes()))
    s.flush()
    tracker.close()
    for future, data in out:
        assert_reads(s, future.result().id, {"w": data})
    edges(s)
    s.close()


def test_tracker_checkpoints_of_drifted_floats_get_delta_chunks(tmp_path):
    rng = np.random.default_rng(19)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    tracker = s.track({"w": w}, stream="t", mode="full")
    tracker.checkpoint()
    w[:] = drift(w, rng)
    info = tracker.checkpoint()
    tracker.close()
    assert_reads(s, info.id, {"w": w.tobytes()})
    s.close()
    assert info.bytes_new < 0.7 * w.nbytes


def test_save_arrays_of_drifted_floats_get_delta_chunks(tmp_path):
    rng = np.random.default_rng(20)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    snapstore.save_arrays(s, {"w": w}, "arr")
    w2 = drift(w, rng)
    info = snapstore.save_arrays(s, {"w": w2}, "arr")
    assert np.array_equal(snapstore.load_arrays(s, info.id)["w"], w2)
    s.close()
    assert info.bytes_new < 0.7 * w.nbytes


def test_save_and_load_of_objects_with_float_arrays(tmp_path):
    rng = np.random.default_rng(21)
    s = open_store(tmp_path / "s")
    w, m = weights(rng), rng.normal(0, 1, (300, 257))
    states = [{"w": w, "m": m, "step": 0}]
    for step in range(1, 4):
        states.append({"w": drift(states[-1]["w"], rng), "m": drift(states[-1]["m"], rng),
                       "step": step})
    infos = [s.save(state, "obj") for state in states]
    assert infos[1].bytes_new < 0.75 * (w.nbytes + m.nbytes)
    edges(s)
    for info, state in zip(infos, states):
        got = s.load(info.id)
        assert got["step"] == state["step"]
        for k in ("w", "m"):
            assert got[k].dtype == state[k].dtype
            assert got[k].tobytes() == state[k].tobytes()
    s.close()


def test_two_writers_and_their_compactions_share_bases(tmp_path):
    """Two Stores of one process (two logs) take delta checkpoints of one stream and of
    another, delete and compact at once: bases live in either log."""
    import threading
    path = str(tmp_path / "s")
    stores = [open_store(path, segment_size=1 << 16) for _ in range(2)]
    start = weights(np.random.default_rng(33), 64 * 1024)
    live: dict = {}
    lock = threading.Lock()
    failures: list = []

    def work(store, seed, stream):
        r, pick = np.random.default_rng(seed), random.Random(seed)
        x = start
        for _ in range(12):
            x = drift(x, r)
            try:
                info = store.checkpoint({"w": x}, stream=stream)
                with lock:
                    live[info.id] = x.tobytes()
                with lock:
                    old = sorted(live)[:-3]
                if old and pick.random() < 0.4:
                    victim = pick.choice(old)
                    store.delete(victim)
                    with lock:
                        live.pop(victim, None)
                if pick.random() < 0.2:
                    store.compact()
            except (snapstore.CommitConflict, snapstore.StoreLocked,
                    snapstore.CheckpointNotFound):
                pass            # the other writer's commit, delete or compaction came first
            except BaseException as exc:            # noqa: BLE001 - reported below
                failures.append(exc)
    threads = [threading.Thread(target=work, args=(stores[0], 1, "s")),
               threading.Thread(target=work, args=(stores[1], 2, "s")),
               threading.Thread(target=work, args=(stores[1], 3, "t"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert not failures, failures
        assert delta_entries(stores[0])
        edges(stores[0])
        for cid, data in live.items():
            assert stores[0].restore(cid)["w"] == data
            assert stores[1].read(cid, "w", 1000, 70_000) == data[1000:71_000]
    finally:
        for s in stores:
            s.close()


# ---- stores reopened, forked, upgraded, repaired ---------------------------------------------

def test_reopened_and_readonly_stores_read_and_extend_the_chains(tmp_path):
    vs = versions(22, 6)
    path = tmp_path / "s"
    s = open_store(path)
    infos = [s.checkpoint({"w": v}, stream="w") for v in vs[:3]]
    s.close()
    s = open_store(path)
    infos += [s.checkpoint({"w": v}, stream="w") for v in vs[3:]]
    # after a reopen the next checkpoint still codes against the head's chunks
    assert infos[3].bytes_new < 0.7 * vs[3].nbytes
    s.close()
    r = snapstore.open(path, readonly=True)
    for info, v in zip(infos, vs):
        assert_reads(r, info.id, {"w": v.tobytes()})
    edges(r)
    r.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_checkpoints_deltas_in_a_store_of_its_own(tmp_path):
    rng = np.random.default_rng(23)
    path = str(tmp_path / "s")
    s = open_store(path)
    w = weights(rng)
    a = s.checkpoint({"w": w}, stream="w")
    w2 = drift(w, rng)
    pid = os.fork()
    if pid == 0:                        # the child: never returns into pytest
        code = 1
        try:
            try:
                s.restore(a.id)
                code = 2                # the parent's Store must refuse
            except snapstore.ForkedStoreError:
                child = snapstore.open(path, durability="none", delta_chunks=True)
                info = child.checkpoint({"w": w2}, stream="w")
                ok = child.restore(info.id)["w"] == w2.tobytes() and \
                    len(delta_entries(child)) == 16
                child.close()
                code = 0 if ok else 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    b = s.latest("w")
    assert b.id != a.id
    assert_reads(s, b.id, {"w": w2.tobytes()})
    w3 = drift(w2, rng)
    c = s.checkpoint({"w": w3}, stream="w")
    assert c.bytes_new < 0.7 * w3.nbytes
    assert_reads(s, c.id, {"w": w3.tobytes()})
    edges(s)
    s.close()


def test_a_format_4_store_upgraded_codes_against_its_old_chunks(tmp_path):
    path = tmp_path / "s"
    shutil.copytree(GOLDEN_FLOATS, path)
    s = open_store(path, segment_size=1 << 16)
    head = s.latest("weights")
    old = s.restore(head.id)
    rng = np.random.default_rng(24)
    arrays = {name: drift(np.frombuffer(old[name], dtype), rng)
              for name, dtype in (("w32", np.float32), ("w16", np.float16), ("w64", np.float64))}
    info = s.checkpoint(arrays, stream="weights")
    new = {name: a.tobytes() for name, a in arrays.items()}
    table = edges(s)
    assert any(e.base is not None for e in table.values())
    assert_reads(s, info.id, new)
    assert_reads(s, head.id, old)
    s.delete(head.id)
    s.compact()
    edges(s)
    assert_reads(s, info.id, new)
    s.close()


def test_repair_rebuilds_the_edges(tmp_path):
    vs = versions(25, 4, n=N + 3)
    for compacted in (False, True):
        path = tmp_path / str(compacted)
        s = open_store(path)
        infos = [s.checkpoint({"w": v}, stream="w") for v in vs]
        s.delete(infos[0].id)
        if compacted:               # the log then describes the store by a state section
            s.compact()
        before = {c: (e.refs, e.base) for c, e in edges(s).items() if e.refs}
        s.close()
        snapstore.repair(str(path))
        s = open_store(path)
        after = {c: (e.refs, e.base) for c, e in edges(s).items()}
        assert after == before          # (less chunks of count 0, which a repair drops)
        s.compact()
        for info, v in zip(infos[1:], vs[1:]):
            assert_reads(s, info.id, {"w": v.tobytes()})
        s.close()


def test_verify_deep_accepts_delta_chunks(tmp_path):
    vs = versions(26, 4)
    s = open_store(tmp_path / "s")
    infos = [s.checkpoint({"w": v}, stream="w") for v in vs]
    assert s.verify(deep=True)["ok"]
    s.delete(infos[0].id)
    s.compact()
    assert s.verify(deep=True)["ok"]
    s.close()


# ---- damage ------------------------------------------------------------------------------------

def _all_reads(store, checkpoint_id, data: bytes) -> dict:
    """{read path: "ok" | "wrong" | "corrupt"} for every read path of buffer "w"."""
    n = len(data)
    out = {}
    paths = {
        "restore": lambda: (store.restore(checkpoint_id)["w"], data),
        "read": lambda: (store.read(checkpoint_id, "w", 3 * 65536 - 7, 65536 + 14),
                         data[3 * 65536 - 7:4 * 65536 + 7]),
        "read_ranges": lambda: (store.read_ranges(checkpoint_id, "w", [(3 * 65536 + 5, 1),
                                                                        (0, n)]),
                                data[3 * 65536 + 5:3 * 65536 + 6] + data),
    }

    def into():
        target = bytearray(n)
        store.restore_into(checkpoint_id, {"w": target})
        return bytes(target), data
    paths["restore_into"] = into
    for name, read in paths.items():
        try:
            got, want = read()
            out[name] = "ok" if got == want else "wrong"
        except CorruptionError:
            out[name] = "corrupt"
    return out


@pytest.mark.parametrize("victim", ["delta", "base"])
@pytest.mark.parametrize("where", ["header", "chunk_id", "delta_header", "middle", "last"])
def test_a_flipped_bit_in_a_delta_chunk_or_its_base_raises(tmp_path, victim, where):
    rng = np.random.default_rng(27)
    path = tmp_path / "s"
    s = open_store(path)
    w = weights(rng)
    w2 = drift(w, rng)
    a = s.checkpoint({"w": w}, stream="w")
    b = s.checkpoint({"w": w2}, stream="w")
    at_3 = {off: cid for off, _, cid, _ in s.layout(b.id, "w")}[3 * 65536]
    table = chunk_table(s)
    delta = table[at_3]
    assert delta.base is not None
    entry = delta if victim == "delta" else table[delta.base]
    s.close()
    head, prefix = fmt.RECORD_HEADER.size, fmt.CHUNK_PREFIX.size
    flip_bit(str(path), entry, {"header": 9, "chunk_id": head + 5,
                                "delta_header": head + prefix + 7,
                                "middle": head + entry.stored_len // 2,
                                "last": head + entry.stored_len - 1}[where])
    s = open_store(path)
    got = _all_reads(s, b.id, w2.tobytes())
    assert set(got.values()) == {"corrupt"}, got
    first = _all_reads(s, a.id, w.tobytes())
    # the first checkpoint holds the base, not the delta chunk
    assert set(first.values()) == ({"ok"} if victim == "delta" else {"corrupt"}), first
    with pytest.raises(CorruptionError):
        list(s.read_chunks([at_3]))
    s.close()


def test_a_damaged_base_does_not_stop_the_next_checkpoint(tmp_path):
    rng = np.random.default_rng(32)
    path = tmp_path / "s"
    s = open_store(path)
    w = weights(rng)
    a = s.checkpoint({"w": w}, stream="w")
    at_3 = {off: cid for off, _, cid, _ in s.layout(a.id, "w")}[3 * 65536]
    entry = chunk_table(s)[at_3]
    s.close()
    flip_bit(str(path), entry, fmt.RECORD_HEADER.size + entry.stored_len // 2)
    s = open_store(path)
    w2 = drift(w, rng)
    try:
        info = s.checkpoint({"w": w2}, stream="w")
        assert_reads(s, info.id, {"w": w2.tobytes()})
    finally:
        s.close()


def test_a_base_that_cannot_be_read_does_not_stop_the_next_checkpoint(tmp_path):
    """Regression: an I/O error (EIO: a bad sector) reading an old keyframe made every new
    checkpoint of the stream fail; a base that cannot be read is like a damaged one: its
    chunk is coded on its own (ChunkReader._read_or_none). Without the keyframe cache, which
    would give the bases without a read (test_keyframe_cache.py has that case)."""
    rng = np.random.default_rng(46)
    path = str(tmp_path / "s")
    fb = FaultyBackend(os.path.join(path, fmt.SEGMENTS_DIR), durable=False)
    s = open_store(path, backend=fb, keyframe_cache_bytes=0)
    try:
        w = weights(rng)
        a = s.checkpoint({"w": w}, stream="w")
        w2 = drift(w, rng)
        fb.fail("read", 1, errno.EIO, repeat=True)      # every segment read
        info = s.checkpoint({"w": w2}, stream="w")
        assert fb.fired                                 # it did try to read the keyframes
        fb.clear()
        assert delta_entries(s) == {}                   # coded on their own
        assert_reads(s, info.id, {"w": w2.tobytes()})
        assert_reads(s, a.id, {"w": w.tobytes()})
        w3 = drift(w2, rng)                             # the disk is well again: deltas
        assert s.checkpoint({"w": w3}, stream="w").bytes_new < 0.7 * w3.nbytes
        edges(s)
    finally:
        s.close()


def test_an_index_naming_another_base_never_gives_wrong_bytes(tmp_path):
    """The parallel restore decodes a delta chunk over the base its index entry names; a
    record naming another base (an index out of step with the log) must not be decoded over
    the wrong one."""
    rng = np.random.default_rng(28)
    s = open_store(tmp_path / "s")
    w = weights(rng)
    s.checkpoint({"w": w}, stream="w")
    w2 = drift(w, rng)
    b = s.checkpoint({"w": w2}, stream="w")
    layout = {off: cid for off, _, cid, _ in s.layout(b.id, "w")}
    table = chunk_table(s)
    victim, other = table[layout[3 * 65536]], table[layout[5 * 65536]]
    with s._committer.index.write() as w_:
        w_.put_chunk(layout[3 * 65536], victim._replace(base=other.base))
    got = _all_reads(s, b.id, w2.tobytes())
    assert "wrong" not in got.values(), got
    s.close()


# ---- crashes ----------------------------------------------------------------------------------

WRITER = r"""
import os
import sys
import numpy as np
import snapstore
path, seed, start, count, rel = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), \
    int(sys.argv[4]), float(sys.argv[5])
n = int(sys.argv[6])
rng = np.random.default_rng(seed)
vs = [rng.normal(0, 0.02, n).astype(np.float32)]
for _ in range(start + count):
    vs.append((vs[-1] * (1 + rng.normal(0, rel, n))).astype(np.float32))
s = snapstore.open(path, delta_chunks=True)                        # durability "fsync"
os.write(1, b"ready\n")        # one write per line: a kill never tears an acknowledgement
for i in range(start, start + count):
    info = s.checkpoint({"w": vs[i]}, stream="w", meta={"step": i})
    os.write(1, f"ok {info.id} {i}\n".encode())
s.close()
"""
CRASH_N = 256 * 1024 + 3


def _acknowledged(out: str) -> set:
    """The steps a killed WRITER acknowledged: its complete "ok ID STEP" lines (a line without
    its newline was cut by the kill: not acknowledged)."""
    return {int(line.split()[2]) for line in out.split("\n")[:-1] if line.startswith("ok ")}


def _crash_versions(seed: int, count: int) -> list:
    rng = np.random.default_rng(seed)
    vs = [rng.normal(0, 0.02, CRASH_N).astype(np.float32)]
    for _ in range(count - 1):
        vs.append((vs[-1] * (1 + rng.normal(0, 0.01, CRASH_N))).astype(np.float32))
    return vs


def _child_env(**extra) -> dict:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("SNAPSTORE_CRASH_AT", None)
    env.update(extra)
    return env


def _check_after_crash(path: str, vs: list, acked: set) -> list:
    """Reopens as a writer (recovery): every acknowledged checkpoint is there, at most the one
    in flight besides, each restoring exact; the edges hold. Returns the visible steps."""
    s = snapstore.open(path, delta_chunks=True)
    try:
        infos = s.checkpoints("w")
        steps = [i.meta["step"] for i in infos]
        assert acked <= set(steps)
        assert steps == list(range(len(steps)))          # in order, none missing
        assert len(set(steps) - acked) <= 1
        for info in infos:
            assert_reads(s, info.id, {"w": vs[info.meta["step"]].tobytes()})
        edges(s)
        return steps
    finally:
        s.close()


@pytest.mark.parametrize("point", ["after_data_append", "after_commit_append", "after_fsync",
                                   "before_index_commit", "after_index_commit"])
def test_a_writer_killed_inside_a_delta_checkpoint(tmp_path, point):
    vs = _crash_versions(29, 4)
    path = str(tmp_path / "s")
    # dies the second time: inside the first checkpoint made of delta chunks
    env = _child_env(SNAPSTORE_CRASH_AT=f"{point}:2")
    r = subprocess.run([sys.executable, "-c", WRITER, path, "29", "0", "3", "0.01",
                        str(CRASH_N)], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    acked = _acknowledged(r.stdout)
    assert acked == {0}
    steps = _check_after_crash(path, vs, acked)
    assert steps == ([0] if point == "after_data_append" else [0, 1])
    # the store goes on: the next delta checkpoint, a delete of the keyframes, a compaction
    s = snapstore.open(path, delta_chunks=True)
    info = s.checkpoint({"w": vs[3]}, stream="w", meta={"step": 3})
    assert info.bytes_new < 0.7 * vs[3].nbytes
    s.delete(s.checkpoints("w")[0].id)
    s.compact()
    assert_reads(s, info.id, {"w": vs[3].tobytes()})
    edges(s)
    s.close()


def test_writers_killed_at_random_moments_of_delta_checkpoints(tmp_path):
    rnd = random.Random(30)
    vs = _crash_versions(30, 40)
    path = str(tmp_path / "s")
    start = 0
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, path, "30", str(start), "6",
                                 "0.01", str(CRASH_N)], env=_child_env(),
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(rnd.uniform(0.0, 0.1))
            proc.send_signal(signal.SIGKILL)
            out = proc.communicate(timeout=60)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        acked = _acknowledged(out)
        steps = _check_after_crash(path, vs, acked | set(range(start)))
        start = len(steps)
        if start + 6 >= len(vs):
            break


DYING_SECOND_WRITER = r"""
import sys
import numpy as np
import snapstore
rng = np.random.default_rng(int(sys.argv[2]))
w = rng.normal(0, 0.02, int(sys.argv[3])).astype(np.float32)
w2 = (w * (1 + rng.normal(0, 0.01, w.size))).astype(np.float32)
s = snapstore.open(sys.argv[1], delta_chunks=True)
s.checkpoint({"w": w2}, stream="w", meta={"step": 1})
"""


@pytest.mark.parametrize("point", ["after_data_append", "after_commit_append"])
def test_a_second_writer_dies_in_a_delta_commit_while_the_first_deletes_its_base(tmp_path,
                                                                                   point):
    """Writer 1 (another log) dies inside a delta checkpoint built on writer 0's; writer 0,
    open all along, deletes that parent (the keyframes' checkpoint) and compacts. The dead
    commit's bases must survive while its record may still be applied (its claim pins them),
    and a reopen shows it wholly or not at all."""
    rng = np.random.default_rng(34)
    w = rng.normal(0, 0.02, CRASH_N).astype(np.float32)
    w2 = (w * (1 + rng.normal(0, 0.01, CRASH_N))).astype(np.float32)
    path = str(tmp_path / "s")
    first = snapstore.open(path, delta_chunks=True)
    try:
        a = first.checkpoint({"w": w}, stream="w", meta={"step": 0})
        r = subprocess.run([sys.executable, "-c", DYING_SECOND_WRITER, path, "34",
                            str(CRASH_N)], env=_child_env(SNAPSTORE_CRASH_AT=point),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == -signal.SIGKILL, r.stderr
        first.delete(a.id)
        first.compact()
        edges(first)
    finally:
        first.close()
    s = snapstore.open(path, delta_chunks=True)
    try:
        steps = [i.meta["step"] for i in s.checkpoints("w")]
        assert steps == ([] if point == "after_data_append" else [1])
        for info in s.checkpoints("w"):
            assert_reads(s, info.id, {"w": w2.tobytes()})
        edges(s)
        s.compact()
        assert (chunk_table(s) == {}) == (not steps)
    finally:
        s.close()


COMPACTOR = r"""
import sys
import snapstore
s = snapstore.open(sys.argv[1], delta_chunks=True)
s.delete_many([s.checkpoints("w")[0].id, s.checkpoints("junk")[0].id])
s.compact(shrink_index=True)
s.close()
"""


@pytest.mark.parametrize("point", ["compact_after_copy", "compact_before_remove",
                                   "index_swap_exchanged"])
def test_a_compaction_killed_while_bases_are_edges_only(tmp_path, point):
    vs = _crash_versions(31, 4)
    path = str(tmp_path / "s")
    s = snapstore.open(path, delta_chunks=True)
    for i, v in enumerate(vs):
        s.checkpoint({"w": v}, stream="w", meta={"step": i})
        if i == 0:      # garbage beside the keyframes, so the compaction rewrites their segment
            junk = np.random.default_rng(5).integers(0, 256, 4 * CRASH_N, dtype=np.uint8)
            s.checkpoint({"j": junk}, stream="junk")
    s.close()
    r = subprocess.run([sys.executable, "-c", COMPACTOR, path], capture_output=True, text=True,
                       env=_child_env(SNAPSTORE_CRASH_AT=point), timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    s = snapstore.open(path, delta_chunks=True)
    for _ in range(2):
        assert [i.meta["step"] for i in s.checkpoints("w")] == [1, 2, 3]
        for info in s.checkpoints("w"):
            assert_reads(s, info.id, {"w": vs[info.meta["step"]].tobytes()})
        edges(s)
        s.compact()                     # finishes the job
    s.close()


# ---- random histories ---------------------------------------------------------------------------

DTYPES = (np.float16, np.float32, np.float64)
GEOMETRIES = ({"page_size": 512, "chunk_size": 2048}, {"page_size": 1024, "chunk_size": 4096},
              {"page_size": 512, "chunk_size": 512})
OPS = st.lists(st.tuples(st.sampled_from(["ckpt", "ckpt", "ckpt", "ckpt", "delete", "compact",
                                          "retain", "reopen"]),
                         st.integers(0, 1 << 30)), min_size=4, max_size=24)


@settings(max_examples=max(10, settings.default.max_examples // 8), deadline=None)
@given(geometry=st.sampled_from(GEOMETRIES), max_chain=st.sampled_from([2, 16]), ops=OPS,
       seed=st.integers(0, 1 << 30))
def test_random_histories_keep_every_checkpoint_exact_and_the_edges_right(
        tmp_path_factory, geometry, max_chain, ops, seed):
    """Small chunks, two streams of two buffers, random changes (drift of 0.1-10%, a few
    values, none, random bytes, a new size, a new float label, one bit), deletes, retain,
    compaction, reopening; after each step the edges hold; at the end every live checkpoint
    restores exact, and deleting them all leaves no chunk."""
    path = str(tmp_path_factory.mktemp("h") / "s")
    options = dict(durability="none", max_chain=max_chain, **geometry)
    rng = np.random.default_rng(seed)
    s = snapstore.open(path, **{"delta_chunks": True, **options})
    live: dict = {}
    state: dict = {}
    try:
        for op, pick in ops:
            r = random.Random(pick)
            if op == "ckpt":
                stream = r.choice("AB")
                bufs = state.setdefault(stream, {})
                for name in r.sample(["w", "v"], r.randint(1, 2)):
                    cur = bufs.get(name)
                    how = r.choice(["drift", "drift", "drift", "few", "same", "random", "size",
                                    "label", "bit"])
                    if cur is None or how == "size":
                        cur = rng.normal(0, 0.02, r.choice([0, 1, 3, 255, 1000, 4097, 20_001])
                                         ).astype(r.choice(DTYPES))
                    elif how == "drift":
                        cur = drift(cur, rng, r.choice([0.001, 0.01, 0.1]))
                    elif how == "few" and cur.size:
                        cur = cur.copy()
                        cur[rng.integers(0, cur.size, 5)] = 1.5
                    elif how == "random":
                        cur = rng.integers(0, 256, cur.nbytes, dtype=np.uint8).view(cur.dtype)
                    elif how == "label":
                        fits = [d for d in DTYPES if cur.nbytes % np.dtype(d).itemsize == 0]
                        cur = cur.view(np.uint8).view(r.choice(fits))
                    elif how == "bit" and cur.nbytes:
                        cur = cur.copy()
                        cur.view(np.uint8)[r.randrange(cur.nbytes)] ^= 1 << r.randrange(8)
                    bufs[name] = cur
                info = s.checkpoint(dict(bufs), stream=stream)
                live[info.id] = {k: v.tobytes() for k, v in bufs.items()}
            elif op == "delete" and live:
                victim = r.choice(sorted(live))
                s.delete(victim)
                del live[victim]
            elif op == "compact":
                s.compact(threshold=r.choice([0.5, 0.9]))
            elif op == "retain":
                stream = r.choice("AB")
                if s.latest(stream) is not None:
                    for gone in s.retain(stream, keep_last=1):
                        live.pop(gone, None)
            elif op == "reopen":
                s.close()
                s = snapstore.open(path, **{"delta_chunks": True, **options})
            edges(s)
        for cid, ref in live.items():
            assert s.restore(cid) == ref
            for name, data in ref.items():
                n = len(data)
                assert s.read_ranges(cid, name, [(0, n // 3), (n // 2, n - n // 2)]) == \
                    data[:n // 3] + data[n // 2:]
        if live:
            s.delete_many(sorted(live))
        s.compact()
        assert chunk_table(s) == {}
    finally:
        s.close()
