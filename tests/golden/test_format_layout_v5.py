"""The v5 on-disk layout (docs/design.md, "Segment files"; docs/floatcodec.md, "Decided (stop
37)"), byte by byte, from the golden store of format 5 (stores/v5/deltas, made by the version
that made format 5: README.md; every file pinned by SHA-256 at the end of this file) and from
stores written here by today's code. Nothing comes from snapstore.format: the layouts are
written out by hand (the v1, v2 and v3 parsers of the layouts format 5 keeps are used).

Format 5 keeps every layout of format 4 (test_format_layout_v4.py) and adds delta chunks:

  segment header:  <8sIIQQ version 5; a segment of version 5 may hold chunk records of codec
                   0 (raw), 1 (one zstd frame), 2 (byte planes) or 3 (delta planes); segments
                   of versions 1-3 only 0 and 1, of version 4 only 0-2.
  codec 3 (delta planes), the stored bytes after the chunk prefix (<32sI chunk id, raw length):
                   <32sB the base chunk's id, the chunk's depth (1 when the base is stored
                   whole, else 1 + the base's); then a plane section laid out as codec 2's with
                   flags 0 (<BB item size k (2, 4 or 8), 0; k times <BI how plane j is stored
                   (0 raw, 1 one zstd frame declaring its content size), its stored length; the
                   k planes back to back; the raw length % k tail bytes). Item i of the planes,
                   a little-endian word z of k bytes, is zigzag(item - base item) mod 2^(8k):
                   item = base item + ((z >> 1) ^ -(z & 1)); each tail byte is the raw tail
                   byte XOR the base's. The base is as long as the chunk; the chunk id is the
                   BLAKE3-256 of the decoded bytes, as for every codec.
  commit (2):      after the new-chunk table, when the JSON header says "delta_bases": n (the
                   key is absent when there are none), n entries <32s32s (a delta chunk of the
                   new-chunk table, its base chunk id): one per new chunk of codec 3, naming the
                   base its record names; then the extents as before. A state section's
                   CHECKPOINT record (a commit payload without new chunks) has no such table.
  LMDB chunks:     a delta chunk's entry (before its 8-byte seal) is <QQIIQB (segment, record
                   offset, stored length, raw length, count, codec 3) followed by its base's 32-
                   byte id: 65 bytes; every other entry stays 33 bytes. A chunk's count is the
                   extents of all manifests that name it plus the delta chunks whose entries
                   name it as their base (edges): a base outlives every chunk coded against it,
                   also when no checkpoint uses it any more.
  upgrade 4 -> 5:  META_FORMAT 5 in the index, FORMAT 5; the log goes on in a new segment of
                   version 5; nothing else changes (test_upgrade.py).

The writer codes a chunk as a delta only for a buffer of floats stored whole whose parent
holds the chunk at the same place whole (against that chunk, or the base that chunk names:
every delta one level deep), and only where the delta saves 1/32; the golden store "deltas"
holds deltas of all three item sizes, a short chunk's, a chunk stored whole again when its
delta stopped paying, delta chunks reused by another stream, the keyframe checkpoint deleted
(its chunks held by edges alone) and a compaction that collected a deleted checkpoint's delta
chunks (and the bases only they named) and moved bases.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import struct

import blake3
import numpy as np
import pytest
import zstandard

from golden_values import files_sha256

import snapstore

from test_format_layout import (CHUNK, COMMIT, COMMIT_KEYS, BUFFER_KEYS, CHUNK_ENTRY, DELETE,
                                EXTENT, NEW_CHUNK, TAG, Record, check_extents, own_restore,
                                record)
from test_format_layout_v2 import restore_by_hand
from test_format_layout_v3 import (DELETE_ORDERED, LOG_KEY, LOG_POSITION, LOG_SEGMENTS,
                                   STATE_MARK, TAG_KEYS, find_sections, index_payloads,
                                   parse_segment, segment_header)

HERE = os.path.dirname(os.path.abspath(__file__))
V5 = os.path.join(HERE, "stores", "v5")
GOLDEN = sorted(os.path.basename(os.path.dirname(p))
                for p in glob.glob(os.path.join(V5, "*", "FORMAT")))

# ---- the v5 layouts, by hand ---------------------------------------------------------------
CODEC_RAW, CODEC_ZSTD, CODEC_PLANES, CODEC_DELTA = 0, 1, 2, 3
DELTA_HEADER = struct.Struct("<32sB")          # base chunk id, depth
DELTA_BASE = struct.Struct("<32s32s")          # delta chunk id, base chunk id
PLANE_ENTRY = struct.Struct("<BI")
assert (DELTA_HEADER.size, DELTA_BASE.size, CHUNK_ENTRY.size) == (33, 64, 33)
DELTA_ENTRY_SIZE = 33 + 32
WORD = {2: "<u2", 4: "<u4", 8: "<u8"}


def plane_section(section: bytes, raw_len: int) -> tuple[int, int, bytes, bytes]:
    """(item size k, flags, the items' bytes in item order, the tail bytes) of a plane
    section (codec 2's stored bytes, or codec 3's after the delta header), checked: every
    zstd plane one frame that declares its content size and is shorter than the plane."""
    k, flags = struct.unpack_from("<BB", section)
    assert k in (2, 4, 8), k
    n, tail = divmod(raw_len, k)
    table = [PLANE_ENTRY.unpack_from(section, 2 + 5 * j) for j in range(k)]
    pos, planes = 2 + 5 * k, []
    for how, length in table:
        piece = section[pos:pos + length]
        assert len(piece) == length
        pos += length
        if how == 0:
            assert length == n
            planes.append(piece)
        else:
            assert how == 1 and piece[:4] == b"\x28\xb5\x2f\xfd"
            assert zstandard.frame_content_size(piece) == n
            assert length < n                       # kept only because it is smaller
            planes.append(zstandard.ZstdDecompressor().decompress(piece))
    assert len(section) - pos == tail, (len(section), pos, tail)
    items = bytearray(n * k)
    for j, plane in enumerate(planes):
        items[j::k] = plane
    return k, flags, bytes(items), bytes(section[pos:])


def unrotate(items: bytes, k: int, r: int = 1) -> bytes:
    """Codec 2's flags r (1; format 6: 1..7): each item, a little-endian word, rotated right r
    bits."""
    w = np.frombuffer(items, WORD[k])
    bits = np.array(8 * k - r, dtype=w.dtype)
    return ((w >> np.array(r, dtype=w.dtype)) | (w << bits)).astype(w.dtype).tobytes()


def undelta(items: bytes, k: int, base: bytes) -> bytes:
    """Codec 3: base item + unzigzag(z), mod 2^(8k), item by item."""
    z = np.frombuffer(items, WORD[k])
    one = np.array(1, dtype=z.dtype)
    d = (z >> one) ^ (np.zeros_like(z) - (z & one))           # 0 - x wraps: unsigned
    return (np.frombuffer(base[:len(items)], WORD[k]) + d).astype(z.dtype).tobytes()


def delta_header(payload: bytes) -> tuple[bytes, int]:
    """(base chunk id, depth) a codec 3 chunk record's payload names."""
    return DELTA_HEADER.unpack_from(payload, 36)


def decode_chunk(rec: Record, base_raw: bytes | None = None,
                 rotations=(0, 1)) -> tuple[bytes, bytes]:
    """(chunk id, raw bytes) of a chunk record of any codec (a delta chunk given its base's
    raw bytes), checked against the id; rotations: the flags codec 2 may have (format 5's 0
    and 1; range(8) in a store today's code wrote, format 6)."""
    cid, raw_len = struct.unpack_from("<32sI", rec.payload)
    stored = rec.payload[36:]
    if rec.codec == CODEC_RAW:
        raw = stored
    elif rec.codec == CODEC_ZSTD:
        assert stored[:4] == b"\x28\xb5\x2f\xfd"
        raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_len)
    elif rec.codec == CODEC_PLANES:
        k, flags, items, tail = plane_section(stored, raw_len)
        assert flags in rotations
        raw = (unrotate(items, k, flags) if flags else items) + tail
    else:
        assert rec.codec == CODEC_DELTA, rec.codec
        base_id, depth = DELTA_HEADER.unpack_from(stored)
        assert depth >= 1 and base_id != cid
        assert base_raw is not None and len(base_raw) == raw_len
        k, flags, items, tail = plane_section(stored[DELTA_HEADER.size:], raw_len)
        assert flags == 0                           # delta planes are never rotated
        raw = undelta(items, k, base_raw) + bytes(
            a ^ b for a, b in zip(tail, base_raw[len(items):]))
        assert len(stored) - DELTA_HEADER.size <= raw_len - raw_len // 32   # saves 1/32
    assert len(raw) == raw_len
    assert blake3.blake3(raw).digest() == cid, (rec.segment, rec.offset, rec.codec)
    return cid, bytes(raw)


def decode_all(records: list, rotations=(0, 1)) -> tuple[dict, dict]:
    """({chunk id: raw bytes}, {chunk id: depth}) of every chunk record of `records`, each
    delta chunk decoded over its base (found among the records, decoded first: a chain ends
    at a chunk stored whole, each level one less deep)."""
    recs = {}
    for r in records:
        if r.rtype == CHUNK:
            recs.setdefault(struct.unpack_from("<32s", r.payload)[0], r)
    raw, depth = {}, {}

    def get(cid: bytes) -> bytes:
        if cid not in raw:
            r = recs[cid]
            if r.codec == CODEC_DELTA:
                base_id, d = delta_header(r.payload)
                base = get(base_id)
                assert depth[base_id] == d - 1, "a delta chunk's depth is its base's + 1"
                raw[cid] = decode_chunk(r, base)[1]
                depth[cid] = d
            else:
                raw[cid] = decode_chunk(r, rotations=rotations)[1]
                depth[cid] = 0
        return raw[cid]
    for cid in recs:
        get(cid)
    return raw, depth


def parse_commit5(payload: bytes, extra_keys=("order",)) -> tuple[dict, list, list, list]:
    """(JSON header, new-chunk entries, DELTA_BASE entries, [extents of each buffer]) of a
    format 5 commit payload, walked to its exact end; the header holds COMMIT_KEYS, "order"
    and "delta_bases" exactly when it has any."""
    (n,) = struct.unpack_from("<I", payload, 0)
    head = json.loads(payload[4:4 + n].decode("utf-8"))
    keys = COMMIT_KEYS | set(extra_keys)
    assert set(head) in (keys, keys | {"delta_bases"}), sorted(head)
    assert head.get("delta_bases", 1) >= 1          # absent, never 0
    pos = 4 + n
    new_chunks = [NEW_CHUNK.unpack_from(payload, pos + i * 57) for i in range(head["new_chunks"])]
    pos += 57 * head["new_chunks"]
    bases = [DELTA_BASE.unpack_from(payload, pos + i * 64)
             for i in range(head.get("delta_bases", 0))]
    pos += 64 * len(bases)
    extents = []
    for b in head["buffers"]:
        assert set(b) == BUFFER_KEYS, sorted(b)
        extents.append([EXTENT.unpack_from(payload, pos + i * 48) for i in range(b["extents"])])
        pos += 48 * b["extents"]
    assert pos == len(payload), "commit payload longer than its header says"
    return head, new_chunks, bases, extents


def check_delta_bases(head: dict, new_chunks: list, bases: list, chunk_at: dict) -> None:
    """The DELTA_BASE table names each new chunk of codec 3 once, with the base its record
    names (chunk_at: {(segment, offset): record})."""
    deltas = {cid for cid, seg, off, stored, raw_len, codec in new_chunks if codec == 3}
    assert [c for c, _ in bases] == [c for c in dict.fromkeys(c for c, _ in bases)]  # once
    assert {c for c, _ in bases} == deltas
    for cid, seg, off, stored, raw_len, codec in new_chunks:
        rec = chunk_at[(seg, off)]
        assert rec.rtype == CHUNK and rec.codec == codec and len(rec.payload) == stored
        assert struct.unpack_from("<32sI", rec.payload) == (cid, raw_len)
    for cid, base in bases:
        (_, seg, off, *_), = [e for e in new_chunks if e[0] == cid]
        assert delta_header(chunk_at[(seg, off)].payload)[0] == base
    assert ("delta_bases" in head) == bool(deltas)


# Today's code writes format 6, which keeps every layout of format 5 and lets byte-plane
# records (codec 2) rotate their items by up to 7 bits (test_format_layout_v6.py), in segments
# of version 6.
TODAY = 6


def load_store(path: str) -> dict:
    """{log: records in log order} of a store of format 5 (every segment of version 5), or of
    a format 5 store today's writer went on in (its new segments of version 6)."""
    logs: dict = {}
    for p in sorted(glob.glob(os.path.join(path, "segments", "*.seg"))):
        number = int(os.path.basename(p)[:16])
        with open(p, "rb") as f:
            version = struct.unpack_from("<8sI", f.read(12))[1]
        assert version in (5, TODAY), (p, version)
        logs.setdefault(number // LOG_SEGMENTS, []).extend(parse_segment(p, version))
    return logs


def check_chunk_entries(dbs: dict, logs: dict, rotations=(0, 1)) -> tuple[dict, dict]:
    """Every chunk entry against its record: 33 bytes, or 65 for a delta chunk, whose last 32
    are the base its record names; exact counts (extents + edges). Returns ({chunk id: raw
    bytes} of the entries, {chunk id: (extents naming it, edges)})."""
    records = [r for rs in logs.values() for r in rs]
    chunk_at = {(r.segment, r.offset): r for r in records if r.rtype == CHUNK}
    raw, _ = decode_all(records, rotations)
    entries, chunks = {}, {}
    for key, value in dbs[b"chunks"].items():
        assert len(key) == 32 and len(value) in (33, DELTA_ENTRY_SIZE), len(value)
        seg, off, stored, raw_len, count, codec = CHUNK_ENTRY.unpack_from(value)
        rec = chunk_at[(seg, off)]
        assert struct.unpack_from("<32sI", rec.payload) == (key, raw_len)
        assert stored == len(rec.payload) and codec == rec.codec
        base = value[33:] or None
        assert (codec == CODEC_DELTA) == (base is not None)
        if base is not None:
            assert base == delta_header(rec.payload)[0]
        entries[key] = (count, base)
        chunks[key] = raw[key]
    uses = {k: [0, 0] for k in entries}
    for packed in dbs[b"manifests"].values():
        for k in range(0, len(packed), 48):
            uses[EXTENT.unpack_from(packed, k)[3]][0] += 1
    for count, base in entries.values():
        if base is not None:
            uses[base][1] += 1                      # the edge: its base must have an entry
    assert {k: count for k, (count, _) in entries.items()} == \
        {k: a + b for k, (a, b) in uses.items()}
    assert all(a + b > 0 for a, b in uses.values())  # nothing unused is left
    return chunks, {k: tuple(v) for k, v in uses.items()}


# ---- the golden store ------------------------------------------------------------------------
def golden_expected(store: str) -> dict:
    with open(os.path.join(V5, store, "expected.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def golden_index(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("v5-golden"))
    return {store: index_payloads(os.path.join(V5, store, "index"), os.path.join(root, store))
            for store in GOLDEN}


def test_golden_files_are_the_originals():
    assert files_sha256(V5) == GOLDEN_SHA256


def test_golden_stores_of_format_5():
    assert GOLDEN == ["deltas"]
    for store in GOLDEN:
        with open(os.path.join(V5, store, "FORMAT"), "rb") as f:
            d = json.loads(f.read())
        assert set(d) == {"format", "version", "created"} and isinstance(d["created"], float)
        assert (d["format"], d["version"]) == ("snapstore", 5)
        assert golden_expected(store)["format_version"] == 5


def test_golden_deltas_log():
    """Every segment of version 5, walked to its end; every chunk decodes by hand to its id,
    each delta chunk over its base (a plain chunk: depth 1), with deltas of all three item
    sizes and of a short chunk; the commit records the compaction left name their delta
    chunks' bases in their DELTA_BASE tables; the state section's CHECKPOINT records have
    none."""
    logs = load_store(os.path.join(V5, "deltas"))
    assert list(logs) == [0]
    records = logs[0]
    assert sorted({r.segment for r in records}) == golden_expected("deltas")["segments"] \
        == [4, 6, 7, 8, 9]
    chunk_at = {(r.segment, r.offset): r for r in records if r.rtype == CHUNK}
    raw, depth = decode_all(records)
    deltas = [r for r in chunk_at.values() if r.codec == CODEC_DELTA]
    assert {r.codec for r in chunk_at.values()} == {CODEC_RAW, CODEC_PLANES, CODEC_DELTA}
    assert {struct.unpack_from("<B", r.payload, 36 + 33)[0] for r in deltas} == {2, 4, 8}
    assert {depth[struct.unpack_from("<32s", r.payload)[0]] for r in deltas} == {1}
    assert min(len(raw[struct.unpack_from("<32s", r.payload)[0]]) for r in deltas) == 400
    commits = [r for r in records if r.rtype == COMMIT]
    assert len(commits) == 3                        # ids 3, 4 (segment 4) and 6 (after)
    tables = []
    for r in commits:
        head, new_chunks, bases, extents = parse_commit5(r.payload)
        check_delta_bases(head, new_chunks, bases, chunk_at)
        for b, ext in zip(head["buffers"], extents):
            check_extents(ext, b["size"], b["base"] == "full", lambda c: len(raw[c]))
        tables.append((head["id"], head.get("delta_bases", 0)))
    assert tables == [(3, 2), (4, 0), (6, 3)]
    sections = find_sections(records)               # v1 commit layout: no delta_bases
    assert [(s.first.segment, s.head["order"]) for s in sections] == [(6, 8)]
    assert [h["id"] for h, _ in sections[0].checkpoints] == [3, 4, 5]


def test_golden_deltas_index(golden_index):
    """The index: format 5; every chunk entry against its record (65 bytes with the base for
    a delta chunk); counts exact, extents plus edges; the keyframes of the deleted first
    checkpoint held by edges alone; every checkpoint restores by hand from index and log."""
    exp = golden_expected("deltas")
    dbs = golden_index["deltas"]
    meta = dbs[b"meta"]
    assert set(meta) == {b"format", b"next_id", b"next_order", b"gc_generation", b"log_state"}
    assert struct.unpack("<Q", meta[b"format"])[0] == 5
    assert struct.unpack("<Q", meta[b"next_id"])[0] == exp["next_id"] == 7
    logs = load_store(os.path.join(V5, "deltas"))
    section, = find_sections(logs[0])
    assert STATE_MARK.unpack(meta[b"log_state"]) == \
        (section.first.segment, section.first.offset, section.last.segment, section.last.end)
    assert {LOG_KEY.unpack(k)[0]: LOG_POSITION.unpack(v) for k, v in dbs[b"logs"].items()} == \
        {0: (9, os.path.getsize(os.path.join(V5, "deltas", "segments",
                                             "0000000000000009.seg")))}
    assert dbs[b"claims"] == {} and dbs[b"groups"] == {}
    chunks, uses = check_chunk_entries(dbs, logs)
    by_len = {}
    for value in dbs[b"chunks"].values():
        by_len[len(value)] = by_len.get(len(value), 0) + 1
    assert by_len == {33: 6, DELTA_ENTRY_SIZE: 5}
    assert sorted(uses.values()).count((0, 1)) == 1 and (0, 2) in uses.values()  # bases only
    ids = sorted(struct.unpack(">Q", k)[0] for k in dbs[b"checkpoints"])
    assert ids == [c["id"] for c in exp["checkpoints"]] == [3, 4, 5, 6]
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    for cid in ids:
        info = json.loads(dbs[b"checkpoints"][struct.pack(">Q", cid)])
        assert set(info) == COMMIT_KEYS - {"new_chunks"}       # no delta_bases in the index
        data = own_restore(dbs, chunks, cid)
        assert {k: hashlib.sha256(v).hexdigest() for k, v in data.items()} == \
            {b["name"]: b["sha256"] for b in by_id[cid]["buffers"]}


def test_golden_deltas_log_alone_gives_every_checkpoint():
    """The newest section, then the records after it (a tag, a commit with delta chunks), by
    order, give every checkpoint byte-exact, delta chunks decoded over their bases."""
    exp = golden_expected("deltas")
    records = load_store(os.path.join(V5, "deltas"))[0]
    section, = find_sections(records)
    live = {h["id"]: dict(h) for h, _ in section.checkpoints}
    recorded = {h["id"]: (h, e) for h, e in section.checkpoints}
    after = [r for r in records if r.rtype in (COMMIT, DELETE, TAG)
             and (r.segment, r.offset) >= tuple(section.head["logs"]["0"])]
    orders = []
    for r in after:
        if r.rtype == COMMIT:
            head, _, _, extents = parse_commit5(r.payload)
            live[head["id"]] = dict(head)
            recorded[head["id"]] = (head, extents)
            orders.append(head["order"])
        elif r.rtype == TAG:
            d = json.loads(r.payload)
            assert set(d) == TAG_KEYS and d["add"]
            live[d["id"]]["tags"] = sorted(set(live[d["id"]]["tags"]) | {d["tag"]})
            orders.append(d["order"])
        else:
            orders.append(DELETE_ORDERED.unpack(r.payload)[1])
    assert orders == sorted(orders) and orders[0] > section.head["order"]
    raw, _ = decode_all(records)
    assert sorted(live) == [c["id"] for c in exp["checkpoints"]]
    for c in exp["checkpoints"]:
        h = live[c["id"]]
        assert (h["stream"], h["seq"], h["parent"], sorted(h["tags"]), h["meta"],
                h["created"], h["bytes_new"]) == (c["stream"], c["seq"], c["parent"],
                                                  c["tags"], c["meta"], c["created"],
                                                  c["bytes_new"])
        data = restore_by_hand(recorded, raw, c["id"])
        assert {k: hashlib.sha256(v).hexdigest() for k, v in data.items()} == \
            {b["name"]: b["sha256"] for b in c["buffers"]}


def test_todays_code_codes_onto_the_golden_keyframes(tmp_path):
    """Today's writer on a copy of the golden store: the weights, all changed a little, are
    coded against the golden keyframes (the bases the head's delta chunks name, or the
    head's own plain chunks), in a new record after the golden log; everything verifies and
    restores."""
    path = str(tmp_path / "deltas")
    shutil.copytree(os.path.join(V5, "deltas"), path,
                    ignore=shutil.ignore_patterns("expected.json"))
    exp = golden_expected("deltas")
    head = exp["streams"]["weights"]["head"]
    golden_chunks = {struct.unpack_from("<32s", r.payload)[0]
                     for r in load_store(path)[0] if r.rtype == CHUNK}
    rng = np.random.default_rng(55)
    with snapstore.open(path, durability="none", delta_chunks=True) as s:
        old = s.restore(head)
        new = {}
        for name, dtype in (("w32", np.float32), ("w16", np.float16), ("w64", np.float64)):
            a = np.frombuffer(old[name], dtype)
            new[name] = (a * (1 + rng.normal(0, 0.01, a.size))).astype(dtype)
        info = s.checkpoint(new, stream="weights")
        assert s.restore(info.id) == {k: v.tobytes() for k, v in new.items()}
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    logs = load_store(path)
    last = [r for r in logs[0] if r.rtype == COMMIT][-1]
    head_json, new_chunks, bases, _ = parse_commit5(last.payload)
    assert head_json["id"] == info.id and bases
    assert {b for _, b in bases} <= golden_chunks
    chunk_at = {(r.segment, r.offset): r for r in logs[0] if r.rtype == CHUNK}
    check_delta_bases(head_json, new_chunks, bases, chunk_at)


# ---- stores written here ---------------------------------------------------------------------
def weights(rng):
    """float32 of two chunks (64 KiB, 53 KiB), float16 of one."""
    return {"w32": (rng.standard_normal(30_000) * 0.02).astype(np.float32),
            "w16": (rng.standard_normal(8_192) * 0.02).astype(np.float16)}


def changed(rng, buffers: dict) -> dict:
    return {k: (v * (1 + rng.normal(0, 0.01, v.size))).astype(v.dtype) for k, v in
            buffers.items()}


def test_todays_code_writes_delta_chunks(tmp_path):
    """A keyframe checkpoint, two checkpoints of every item changed, the keyframe deleted:
    FORMAT and every segment header say 6; the first commit has no "delta_bases", the others
    name each delta chunk's base, the keyframe's chunk at the same place (both deltas of a
    place against the same keyframe: depth 1); delta chunks decode by hand; the index holds
    65-byte entries for them, the keyframes' counts are their edges alone; restores by hand
    from index and log are byte-exact."""
    path = str(tmp_path / "s")
    rng = np.random.default_rng(5)
    k = weights(rng)
    d1 = changed(rng, k)
    d2 = changed(rng, d1)
    with snapstore.open(path, durability="none", segment_size=65536, delta_chunks=True) as s:
        ik = s.checkpoint(k, "w")
        i1 = s.checkpoint(d1, "w")
        i2 = s.checkpoint(d2, "w")
        s.delete(ik.id)
    with open(os.path.join(path, "FORMAT")) as f:
        assert json.load(f)["version"] == TODAY
    logs = load_store(path)
    records = logs[0]
    chunk_at = {(r.segment, r.offset): r for r in records if r.rtype == CHUNK}
    commits = [parse_commit5(r.payload) for r in records if r.rtype == COMMIT]
    assert [h["id"] for h, *_ in commits] == [ik.id, i1.id, i2.id]
    assert "delta_bases" not in commits[0][0]
    key_at = {}                                     # (buffer, offset) -> keyframe chunk
    for b, ext in zip(commits[0][0]["buffers"], commits[0][3]):
        for boff, coff, length, cid in ext:
            assert coff == 0
            key_at[(b["name"], boff)] = cid
    for head, new_chunks, bases, extents in commits[1:]:
        check_delta_bases(head, new_chunks, bases, chunk_at)
        base_of = dict(bases)
        assert len(base_of) == len(new_chunks) == 3        # every chunk a delta
        for b, ext in zip(head["buffers"], extents):
            for boff, coff, length, cid in ext:
                assert base_of[cid] == key_at[(b["name"], boff)]
                rec = [r for r in chunk_at.values()
                       if struct.unpack_from("<32s", r.payload)[0] == cid][0]
                assert delta_header(rec.payload)[1] == 1
    raw, depth = decode_all(records, rotations=range(8))
    assert sorted(depth.values()) == [0] * 3 + [1] * 6
    dbs = index_payloads(os.path.join(path, "index"), str(tmp_path / "scratch"))
    assert struct.unpack("<Q", dbs[b"meta"][b"format"])[0] == TODAY
    chunks, uses = check_chunk_entries(dbs, logs, range(8))
    assert {uses[c] for c in key_at.values()} == {(0, 2)}     # edges alone: i1's and i2's
    assert sorted(len(v) for v in dbs[b"chunks"].values()) == [33] * 3 + [DELTA_ENTRY_SIZE] * 6
    for cid, want in ((i1.id, d1), (i2.id, d2)):
        assert own_restore(dbs, chunks, cid) == {n: v.tobytes() for n, v in want.items()}


def hand_built(rng) -> tuple[bytes, bytes, bytes]:
    """(base, chunk, codec 3 record payload of chunk against base), by hand: 4002 bytes of
    float32 items changed a little and a 2-byte tail; zigzag(item - base item) over
    little-endian u32 words split into 4 planes, two stored raw, two as zstd frames; the tail
    XOR the base's."""
    base = (rng.standard_normal(1_000) * 0.02).astype(np.float32).tobytes() + b"\x01\x02"
    cur = (np.frombuffer(base[:4000], np.float32) *
           (1 + rng.normal(0, 0.01, 1_000))).astype(np.float32).tobytes() + b"\x07\x02"
    d = (np.frombuffer(cur[:4000], "<u4") - np.frombuffer(base[:4000], "<u4")).astype("<u4")
    z = ((d << np.uint32(1)) ^ (np.zeros_like(d) - (d >> np.uint32(31)))).astype("<u4")
    planes = [z.tobytes()[j::4] for j in range(4)]
    packed = [planes[0], planes[1],
              zstandard.ZstdCompressor(write_content_size=True).compress(planes[2]),
              zstandard.ZstdCompressor(write_content_size=True).compress(planes[3])]
    assert len(packed[2]) < 1000 and len(packed[3]) < 1000
    section = struct.pack("<BB", 4, 0) + b"".join(
        PLANE_ENTRY.pack(0 if j < 2 else 1, len(p)) for j, p in enumerate(packed)) + \
        b"".join(packed) + bytes(a ^ b for a, b in zip(cur[4000:], base[4000:]))
    payload = struct.pack("<32sI", blake3.blake3(cur).digest(), len(cur)) + \
        DELTA_HEADER.pack(blake3.blake3(base).digest(), 1) + section
    assert decode_chunk(Record(0, 0, CHUNK, CODEC_DELTA, payload), base)[1] == cur
    return base, cur, payload


def hand_built_store(path: str, rng, segment_version: int = TODAY) -> tuple:
    """A store of today's code holding the base (stored raw) in checkpoint 1, then, appended
    by hand -- to its last segment, or to a new segment of header `segment_version` -- the
    delta chunk record and a commit of stream "hand" naming it (its DELTA_BASE table and one
    extent). Returns (base, chunk, payload, the commit's id, base id, chunk id, (segment,
    offset) of the chunk record)."""
    base, cur, payload = hand_built(rng)
    with snapstore.open(path, durability="none", compression="none", delta_chunks=True) as s:
        assert s.checkpoint({"b": base}, "base").id == 1
    base_id, cid = blake3.blake3(base).digest(), blake3.blake3(cur).digest()
    dbs = index_payloads(os.path.join(path, "index"), path + ".scratch")
    next_id = struct.unpack("<Q", dbs[b"meta"][b"next_id"])[0]
    next_order = struct.unpack("<Q", dbs[b"meta"][b"next_order"])[0]
    seg_path = sorted(glob.glob(os.path.join(path, "segments", "*.seg")))[-1]
    segment = int(os.path.basename(seg_path)[:16])
    if segment_version != TODAY:
        segment += 1
        seg_path = os.path.join(path, "segments", f"{segment:016d}.seg")
        with open(seg_path, "wb") as f:
            f.write(segment_header(segment, segment_version))
    offset = os.path.getsize(seg_path)
    head = {"id": next_id, "stream": "hand", "parent": None, "created": 1234.5,
            "meta": {"hand": True}, "bytes_new": 0, "tags": [], "seq": 1,
            "buffers": [{"name": "h", "size": len(cur), "base": "full", "depth": 0,
                         "layout": "pages", "page_size": 4096, "extents": 1}],
            "order": next_order, "new_chunks": 1, "delta_bases": 1}
    js = json.dumps(head).encode()
    commit = (struct.pack("<I", len(js)) + js
              + NEW_CHUNK.pack(cid, segment, offset, len(payload), len(cur), CODEC_DELTA)
              + DELTA_BASE.pack(cid, base_id)
              + EXTENT.pack(0, 0, len(cur), cid))
    assert parse_commit5(commit)[2] == [(cid, base_id)]
    with open(seg_path, "ab") as f:
        f.write(record(CHUNK, payload, CODEC_DELTA) + record(COMMIT, commit))
    return base, cur, payload, next_id, base_id, cid, (segment, offset)


def test_hand_built_delta_chunk_is_applied_by_todays_recovery(tmp_path):
    """Records written with the layouts above, appended to a log by hand (hand_built_store):
    today's recovery applies the commit; the chunk's entry is 65 bytes and names the base,
    whose count gains the edge; restores and reads give the bytes (the tail too); verify is
    clean."""
    path = str(tmp_path / "s")
    base, cur, payload, cid_new, base_id, cid, (segment, offset) = \
        hand_built_store(path, np.random.default_rng(9))
    parse_segment(os.path.join(path, "segments", f"{segment:016d}.seg"), TODAY)   # to its end
    with snapstore.open(path, durability="none", delta_chunks=True) as s:       # recovery applies it
        assert s.restore(cid_new) == {"h": cur}
        assert s.read(cid_new, "h", 3990, 12) == cur[3990:]
        assert s.restore(1) == {"b": base}
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    dbs = index_payloads(os.path.join(path, "index"), str(tmp_path / "after"))
    entry = dbs[b"chunks"][cid]
    assert len(entry) == DELTA_ENTRY_SIZE and entry[33:] == base_id
    assert CHUNK_ENTRY.unpack_from(entry) == (segment, offset, len(payload), len(cur), 1, 3)
    assert CHUNK_ENTRY.unpack(dbs[b"chunks"][base_id])[4] == 2     # an extent and the edge
    chunks, _ = check_chunk_entries(dbs, load_store(path), range(8))
    assert own_restore(dbs, chunks, cid_new) == {"h": cur}


def test_a_segment_of_version_4_holds_no_delta_chunk(tmp_path):
    """Codec 3 only in segments of header version 5: the same records behind a segment header
    of version 4 are damage to verify (a chunk record of a codec segments of that version do
    not hold)."""
    path = str(tmp_path / "s")
    *_, (segment, offset) = hand_built_store(path, np.random.default_rng(9), 4)
    with snapstore.open(path, durability="none", delta_chunks=True) as s:
        report = s.verify(deep=True)
    assert not report["ok"]
    assert any(p["kind"] == "damaged_record" and p["segment"] == f"{segment:016d}.seg"
               and p["offset"] == offset and "codec" in p["message"]
               for p in report["problems"]), report["problems"]


GOLDEN_SHA256 = {
    "deltas/FORMAT": "a482f42078746dff6a48a31c1747d2a9c6f25a3b3d5b78fd0f54308b45b683b4",
    "deltas/expected.json": "918f24e8bcacd160f70c3addba9cc1f5403627f23d94d142e83f12c3119aedd5",
    "deltas/index/data.mdb": "daff28a4fd9dc8655aaaf9a84b07dcca43b4a92b79dc1a8b4baced5a44333da7",
    "deltas/segments/0000000000000004.seg": "9d649f3140bc2fb485f523d79925d028798550884f4af0c59b578ae36a4c1821",
    "deltas/segments/0000000000000006.seg": "970ddf70156d1ec0792c75857360ef4b258d76d1c2007e74aa2b2fe41d8e7f59",
    "deltas/segments/0000000000000007.seg": "f1ee44d982659e1e50f71d6dc860c67e449c56beb3cd6853f05b332e9bcf9ba0",
    "deltas/segments/0000000000000008.seg": "6594fb719264b97542de58862b7d4668dc4421a4d26271feb73882124e78042f",
    "deltas/segments/0000000000000009.seg": "3b70d196b7d20f547a88668e326f9e8d6f38a0f29616383f3a496771355c30e1",
}
