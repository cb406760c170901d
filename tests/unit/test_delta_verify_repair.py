"""verify() and repair() on stores with format 5 delta chunks (CODEC_DELTA_PLANES).

A delta chunk decodes only over its base (a keyframe, named in its record and in its index
entry); the base's reference count counts the delta chunks coded against it (edges). verify
counts those edges, checks that every base has an entry, at the right depth, named alike by
entry and record, and (deep) decodes each delta chunk over its base before re-hashing it;
damage to a base names the checkpoints of its delta chunks too. repair rebuilds the entries'
bases from the records' delta headers and the edges in the counts; a delta chunk whose base
is lost is handled like a missing chunk (reported with its checkpoints, which fail cleanly).
"""
from __future__ import annotations

import os
import shutil
from collections import Counter

import numpy as np
import pytest

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine.backends.base import segment_name
from snapstore.engine.index import Index
from snapstore.engine.wal import encode_record_header
from snapstore.errors import CorruptionError

OPTS = dict(durability="none")
FLOATS = (2 << 20) // 4             # 2 MiB of float32: 32 chunks of 64 KiB per checkpoint
HDR = fmt.RECORD_HEADER.size


def build(path: str) -> dict:
    """Stream "train": a keyframe checkpoint and two more whose float chunks change a little
    everywhere (stored as delta chunks against the keyframe's); stream "other": one
    checkpoint sharing nothing with them. Returns {checkpoint id: {buffer: bytes}}."""
    rng = np.random.default_rng(5)
    w = rng.normal(0, 0.02, FLOATS).astype(np.float32)
    want = {}
    with snapstore.open(path, **{"delta_chunks": True, **OPTS}) as s:
        for step in range(3):
            bufs = {"w": w.tobytes(), "meta": b"step %d " % step * 100}
            want[s.checkpoint({"w": w, "meta": bufs["meta"]}, stream="train").id] = bufs
            w = (w * (1 + rng.normal(0, 0.01, FLOATS))).astype(np.float32)
        other = {"o": bytes(rng.integers(0, 256, 50_000, dtype=np.uint8))}
        want[s.checkpoint(other, stream="other").id] = other
    return want


def entries(path: str) -> dict:
    """{chunk id: ChunkEntry} of the store's index (the store closed)."""
    index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=True, durable=False)
    try:
        with index.read() as r:
            return dict(r.chunks())
    finally:
        index.close()


def edit_index(path: str, change) -> None:
    """change(writer) in one write transaction of the store's index (the store closed)."""
    index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=False, durable=True)
    try:
        with index.write() as w:
            change(w)
    finally:
        index.close()


def delta_and_base(path: str) -> tuple:
    """((id, entry) of a delta chunk, (id, entry) of its base)."""
    found = entries(path)
    cid, e = next((c, e) for c, e in sorted(found.items())
                  if e.codec == fmt.CODEC_DELTA_PLANES)
    return (cid, e), (e.base, found[e.base])


def users(path: str, chunk: bytes) -> set:
    """The checkpoints whose manifests name chunk."""
    index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=True, durable=False)
    try:
        with index.read() as r:
            return {i for i in r.checkpoint_ids() for bi in range(len(r.checkpoint(i).buffers))
                    if any(c == chunk for *_, c in fmt.EXTENT.iter_unpack(r.manifest(i, bi)))}
    finally:
        index.close()


def segment_file(path: str, segment: int) -> str:
    return os.path.join(path, fmt.SEGMENTS_DIR, segment_name(segment))


def flip(path: str, e, at: int) -> None:
    """Flips a bit of byte `at` of the payload of the record of entry e (its checksum fails)."""
    with open(segment_file(path, e.segment), "r+b") as f:
        f.seek(e.offset + HDR + at)
        byte = f.read(1)[0]
        f.seek(e.offset + HDR + at)
        f.write(bytes([byte ^ 0x10]))


def rewrite(path: str, e, change) -> None:
    """Rewrites the payload of the record of entry e as change(bytearray of it) leaves it,
    with a matching checksum: damage only decoding or hashing can find."""
    with open(segment_file(path, e.segment), "r+b") as f:
        f.seek(e.offset)
        header = f.read(HDR)
        payload = bytearray(f.read(e.stored_len))
        change(payload)
        f.seek(e.offset)
        f.write(encode_record_header(fmt.REC_CHUNK, header[5], [payload]) + payload)


def problems(report: dict, kind: str | None = None) -> list:
    return [p for p in report["problems"] if kind is None or p["kind"] == kind]


def at(report: dict, e) -> list:
    """The problems a report places at the record of entry e."""
    return [p for p in report["problems"]
            if p["segment"] == segment_name(e.segment) and p["offset"] == e.offset]


def restores(path: str, want: dict) -> dict:
    """{checkpoint id: True when it restores byte-exact, False when it fails cleanly};
    never wrong bytes."""
    out = {}
    with snapstore.open(path, readonly=True) as s:
        for cid, bufs in want.items():
            try:
                got = s.restore(cid)
            except CorruptionError:
                out[cid] = False
                continue
            assert {k: bytes(v) for k, v in got.items()} == bufs, cid
            out[cid] = True
    return out


def verify(path: str, deep: bool) -> dict:
    with snapstore.open(path, readonly=True) as s:
        return s.verify(deep=deep)


@pytest.fixture
def built(store_path):
    return store_path, build(store_path)


def test_the_store_holds_delta_chunks_whose_bases_count_their_edges(built):
    path, want = built
    found = entries(path)
    deltas = [e for e in found.values() if e.codec == fmt.CODEC_DELTA_PLANES]
    assert len(deltas) >= 32, Counter(e.codec for e in found.values())
    edges = Counter(e.base for e in deltas)
    for base, n in edges.items():
        assert found[base].base is None                 # keyframes are plain chunks
        assert found[base].refs == len(users(path, base)) + n


@pytest.mark.parametrize("deep", [False, True])
def test_verify_is_clean_on_a_store_with_delta_chunks(built, deep):
    path, want = built
    report = verify(path, deep)
    assert report["ok"], report["problems"][:3]
    assert all(restores(path, want).values())


@pytest.mark.parametrize("deep", [False, True])
def test_verify_still_finds_a_wrong_count_of_a_base(built, deep):
    """Counting edges must not hide a count that is off by one."""
    path, _ = built
    _, (base, be) = delta_and_base(path)
    edit_index(path, lambda w: w.put_chunk(base, be._replace(refs=be.refs - 1)))
    report = verify(path, deep)
    assert [p["offset"] for p in problems(report, "refcount")] == [be.offset]
    assert "repair" in report["hint"]


def test_verify_after_deleting_the_keyframe_checkpoint_and_compacting(built):
    path, want = built
    first = min(i for i in want if "w" in want[i])
    (_, _), (base, _) = delta_and_base(path)
    assert first in users(path, base)
    with snapstore.open(path, **{"delta_chunks": True, **OPTS}) as s:
        s.delete(first)
        s.compact(threshold=0.0)
    del want[first]
    found = entries(path)
    assert base in found and not users(path, base)      # kept alive by its edges alone
    for deep in (False, True):
        report = verify(path, deep)
        assert report["ok"], (deep, report["problems"][:3])
    assert all(restores(path, want).values())
    # and once nothing is coded against them any more, the keyframes go too
    with snapstore.open(path, **{"delta_chunks": True, **OPTS}) as s:
        for i in [i for i in want if "w" in want[i]]:
            s.delete(i)
        s.compact(threshold=0.0)
    assert base not in entries(path)
    assert verify(path, True)["ok"]


def test_repair_rebuilds_bases_and_counts_and_restores_byte_exact(built):
    path, want = built
    before = {cid: (e.codec, e.base, e.refs, e.raw_len) for cid, e in entries(path).items()}
    shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
    report = snapstore.repair(path)
    assert report["ok"] and report["index_replaced"], report["problems"]
    after = {cid: (e.codec, e.base, e.refs, e.raw_len) for cid, e in entries(path).items()}
    assert after == before
    for deep in (False, True):
        assert verify(path, deep)["ok"], deep
    assert all(restores(path, want).values())
    # with the intact index in place, a repair keeps everything as it was too
    assert snapstore.repair(path)["ok"]
    assert {cid: (e.codec, e.base, e.refs, e.raw_len)
            for cid, e in entries(path).items()} == before


def test_a_flipped_bit_in_a_delta_record_is_reported(built):
    path, want = built
    (cid, e), _ = delta_and_base(path)
    flip(path, e, e.stored_len - 1)
    for deep in (False, True):
        report = verify(path, deep)
        found = at(report, e)
        assert found and users(path, cid) <= set(found[0]["checkpoints"]), (deep, found)
    assert set(restores(path, want).values()) == {True, False}


def test_deep_verify_decodes_a_delta_chunk_over_its_base(built):
    """A changed delta plane under a valid record checksum: only decoding the delta chunk
    over its base and re-hashing it finds it."""
    path, want = built
    (cid, e), _ = delta_and_base(path)
    rewrite(path, e, lambda p: p.__setitem__(len(p) - 1, p[-1] ^ 0x10))
    assert verify(path, False)["ok"]            # the record itself is valid
    report = verify(path, True)
    found = at(report, e)
    assert [p["kind"] for p in found] == ["damaged_record"], found
    assert users(path, cid) <= set(found[0]["checkpoints"])


def test_damage_to_a_base_names_the_checkpoints_of_its_delta_chunks(built):
    path, want = built
    (cid, e), (base, be) = delta_and_base(path)
    dependents = users(path, cid)
    assert dependents and not dependents & users(path, base)
    # undetectable but by decoding: deep verify blames the base, and says the delta chunk
    # cannot decode, never that the delta chunk's own record is damaged
    rewrite(path, be, lambda p: p.__setitem__(len(p) - 1, p[-1] ^ 0x10))
    report = verify(path, True)
    on_base = at(report, be)
    assert [p["kind"] for p in on_base] == ["damaged_record"]
    assert dependents <= set(on_base[0]["checkpoints"])
    on_delta = at(report, e)
    assert [p["kind"] for p in on_delta] == ["damaged_chunk"], on_delta
    assert "base" in on_delta[0]["message"]
    assert dependents <= set(on_delta[0]["checkpoints"])
    # a flip the record checksum sees: shallow verify names the dependents as well
    flip(path, be, be.stored_len - 2)
    report = verify(path, False)
    assert dependents <= set(at(report, be)[0]["checkpoints"])


@pytest.mark.parametrize("deep", [False, True])
def test_verify_reports_a_delta_chunk_whose_base_the_index_lacks(built, deep):
    path, want = built
    (cid, e), (base, be) = delta_and_base(path)
    edit_index(path, lambda w: w.delete_chunk(base))
    report = verify(path, deep)
    missing = [p for p in problems(report, "missing_chunk") if cid.hex()[:16] in p["message"]]
    assert missing and users(path, cid) <= set(missing[0]["checkpoints"])
    assert not problems(report, "refcount")
    assert "repair" in report["hint"]


@pytest.mark.parametrize("deep", [False, True])
def test_verify_reports_an_entry_naming_another_base_than_its_record(built, deep):
    path, _ = built
    (cid, e), (base, _) = delta_and_base(path)
    other = next(c for c, x in entries(path).items()
                 if x.base is None and c != base and x.raw_len == e.raw_len)
    edit_index(path, lambda w: w.put_chunk(cid, e._replace(base=other)))
    report = verify(path, deep)
    found = [p for p in at(report, e) if p["kind"] == "index_mismatch"]
    assert found and "base" in found[0]["message"], report["problems"][:3]


def test_a_delta_record_naming_the_wrong_depth(built):
    """A valid record whose delta header says depth 2 over a plain base can never decode:
    both verifies report it, repair drops it like a missing chunk."""
    path, want = built
    (cid, e), _ = delta_and_base(path)
    rewrite(path, e, lambda p: p.__setitem__(fmt.CHUNK_PREFIX.size + 32, 2))
    for deep in (False, True):
        found = at(verify(path, deep), e)
        assert [p["kind"] for p in found] == ["damaged_chunk"], (deep, found)
    shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
    report = snapstore.repair(path)
    assert cid not in entries(path)
    missing = problems(report, "missing_chunk")
    assert missing and users(path, cid) <= set().union(*(p["checkpoints"] for p in missing))
    assert not problems(verify(path, False), "refcount")


def test_repair_treats_a_damaged_delta_header_as_a_damaged_record(built):
    path, want = built
    (cid, e), _ = delta_and_base(path)
    rewrite(path, e, lambda p: p.__setitem__(fmt.CHUNK_PREFIX.size + 32, 0))   # depth 0
    assert [p["kind"] for p in at(verify(path, True), e)] == ["damaged_record"]
    shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
    report = snapstore.repair(path)
    assert not report["ok"]
    assert [p["kind"] for p in at(report, e)] == ["damaged_record"]
    assert cid not in entries(path)
    assert users(path, cid) <= set().union(*(p["checkpoints"]
                                             for p in problems(report, "missing_chunk")))


def test_repair_after_the_base_is_lost_handles_its_delta_chunks_like_missing_chunks(built):
    path, want = built
    (cid, e), (base, be) = delta_and_base(path)
    coded = [c for c, x in entries(path).items() if x.base == base]
    assert len(coded) == 2                      # one in each later checkpoint of "train"
    lost = users(path, base).union(*(users(path, c) for c in coded))
    flip(path, be, be.stored_len - 1)
    # the old index is sound and knows more than the damaged log: repair keeps it
    report = snapstore.repair(path)
    assert not report["ok"] and not report["index_replaced"]
    shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
    report = snapstore.repair(path)
    assert not report["ok"] and report["index_replaced"]
    assert [p["kind"] for p in at(report, be)] == ["damaged_record"]
    missing = problems(report, "missing_chunk")
    assert lost <= set().union(*(p["checkpoints"] for p in missing))
    after = entries(path)
    assert base not in after and not set(coded) & set(after)   # none that cannot decode
    assert all(x.base is None or x.base in after for x in after.values())
    # the checkpoints stay; those that need the lost chunks fail cleanly, the rest restore
    with snapstore.open(path, readonly=True) as s:
        assert sorted(c.id for c in s.checkpoints()) == sorted(want)
    ok = restores(path, want)
    assert {i for i, good in ok.items() if not good} == lost
    report = verify(path, False)
    assert {p["kind"] for p in report["problems"]} == {"missing_chunk"}
    # the next checkpoint of those bytes stores the lost chunk afresh
    last = max(i for i in want if "w" in want[i])
    with snapstore.open(path, **{"delta_chunks": True, **OPTS}) as s:
        info = s.checkpoint({"w": want[last]["w"], "meta": want[last]["meta"]},
                            stream="train")
        assert bytes(s.restore(info.id)["w"]) == want[last]["w"]


@pytest.mark.parametrize("base", ["stored_again", "collected"])
def test_repair_prefers_a_plain_copy_of_a_chunk_to_a_leftover_delta_copy(store_path, base):
    """Regression: chunk K stored as a delta chunk in writer y's log by a checkpoint deleted
    and collected since, then plain in writer x's log by one that stays: repair took the delta
    copy left in y's segment (the newer log) over the live plain copy. With K's base
    collected too, K was lost ("collected"); with the base there, K was a delta chunk, so the
    live delta chunks coded against K sat at depth 2 and were dropped ("stored_again"). A
    plain copy wins (repair._index_chunk)."""
    rng = np.random.default_rng(47)
    n = (1 << 20) // 4
    v0 = rng.normal(0, 1, n).astype(np.float32)
    v1 = (v0 * (1 + rng.normal(0, 0.01, n))).astype(np.float32)
    v2 = (v1 * (1 + rng.normal(0, 0.01, n))).astype(np.float32)
    opts = {"delta_chunks": True, "segment_size": 1 << 16, **OPTS}
    want = {}
    with snapstore.open(store_path, **opts) as x, snapstore.open(store_path, **opts) as y:
        first = (y if base == "stored_again" else x).checkpoint({"w": v0}, stream="a").id
        gone = y.checkpoint({"w": v1}, stream="a").id           # K = delta(v0), y's log
        assert len([e for e in entries(store_path).values() if e.base is not None]) == 16
        y.delete(gone)
        x.compact(threshold=0.0, max_garbage=None)              # K's entries collected
        want[x.checkpoint({"w": v1}, stream="b").id] = {"w": v1.tobytes()}   # K plain
        if base == "stored_again":
            want[first] = {"w": v0.tobytes()}
            want[x.checkpoint({"w": v2}, stream="b").id] = {"w": v2.tobytes()}  # delta(K)
        else:
            x.delete(first)
            x.compact(threshold=1.0, max_garbage=None)          # v0's chunks collected
    before = {cid: (e.codec, e.base, e.refs) for cid, e in entries(store_path).items()}
    assert verify(store_path, True)["ok"]
    shutil.rmtree(os.path.join(store_path, fmt.INDEX_DIR))      # rebuilt from the log alone
    report = snapstore.repair(store_path)
    assert report["ok"], report["problems"]
    assert {cid: (e.codec, e.base, e.refs) for cid, e in entries(store_path).items()} == before
    assert restores(store_path, want) == {cid: True for cid in want}


def test_repair_falls_back_on_another_delta_copy_whose_base_survives(tmp_path):
    """Chunk K was coded twice as a delta: in log 1 against K0 (that checkpoint deleted and
    collected, K0 collected later), then in log 0 against KB (live). The rebuilt index must
    not keep the log-1 copy, whose base is gone, and lose the checkpoint: repair falls back
    on the copy that decodes."""
    path = str(tmp_path / "s")
    rng = np.random.default_rng(47)
    n = (1 << 20) // 4
    v0 = rng.normal(0, 1, n).astype(np.float32)
    v1 = (v0 * (1 + rng.normal(0, 0.01, n))).astype(np.float32)
    u = (v0 * (1 + rng.normal(0, 0.01, n))).astype(np.float32)
    opts = {"delta_chunks": True, "segment_size": 1 << 16, "durability": "none"}
    with snapstore.open(path, **opts) as x, snapstore.open(path, **opts) as y:
        a0 = x.checkpoint({"w": v0}, stream="a").id
        a1 = y.checkpoint({"w": v1}, stream="a").id         # K = delta(v1 | K0), log 1
        y.delete(a1)
        x.compact(threshold=0.0, max_garbage=None)
        b0 = x.checkpoint({"w": u}, stream="b").id
        b1 = x.checkpoint({"w": v1}, stream="b").id         # K = delta(v1 | KB), log 0
        x.delete(a0)
        x.compact(threshold=1.0, max_garbage=None)          # K0 goes
        assert bytes(x.restore(b1)["w"]) == v1.tobytes()
    shutil.rmtree(os.path.join(path, "index"))
    report = snapstore.repair(path)
    assert report["ok"], report["problems"]
    with snapstore.open(path, **opts) as s:
        assert bytes(s.restore(b0)["w"]) == u.tobytes()
        assert bytes(s.restore(b1)["w"]) == v1.tobytes()
        assert s.verify(deep=True)["ok"]
