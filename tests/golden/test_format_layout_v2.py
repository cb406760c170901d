"""The v2 on-disk layouts, byte by byte, from the golden stores of format 2 (docs/design.md).

As in test_format_layout.py, every layout is written out by hand and nothing comes from
snapstore.format. Format 2 keeps the v1 layouts of records 1-4 and of every index payload, so
the hand-written v1 parsers of test_format_layout.py are used for those (they are pinned
there; changing them changes both tests). The golden files are pinned by SHA-256: they were
made by the version that made format 2 final (README.md) and are never rewritten.

What format 2 adds, pinned here:
  segment header:  version 2 (the segments a format 1 store had before its upgrade keep
                   version 1 and only record types 1-4); a v2 segment holds types 1-7.
  state section:   back to back in log order, nothing between, possibly across consecutive
                   segments:
                   BEGIN (5)       UTF-8 JSON {"next_id", "checkpoints": count,
                                   "streams": {name: {"head", "seq"}}}
                   CHECKPOINT (6)  a commit payload (v1 layout) with "new_chunks": 0, no
                                   new-chunk table, ascending ids: one per live checkpoint
                   END (7)         <QQ: the number of CHECKPOINT records, XXH3-64 (seed 0) of
                                   the BEGIN payload followed by every CHECKPOINT payload
  the log is complete: the newest complete section, then the commit, delete and tag records
                   after it, give every checkpoint, stream and byte (replayed by hand below).
  LMDB index:      every value is its v1 payload followed by index_checksum(db, key, payload);
                   meta "format" is 2; meta "log_state" (<QQQQ: the log positions of the
                   newest noted section's first record and just past its last) exists once a
                   section was written.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import struct

import lmdb
import pytest
import xxhash

from golden_values import files_sha256

import snapstore

from test_format_layout import (CHUNK, COMMIT, COMMIT_KEYS, BUFFER_KEYS, CHUNK_ENTRY, DELETE,
                                EXTENT, FP_HEADER, INDEX_DBS, REC_HEADER, SEG_HEADER, TAG,
                                Record, check_extents, index_checksum, own_restore,
                                page_fingerprints, parse_chunk, parse_commit, record)

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = os.path.join(HERE, "stores", "v1")
V2 = os.path.join(HERE, "stores", "v2")
STORES = sorted(os.path.basename(os.path.dirname(p))
                for p in glob.glob(os.path.join(V2, "*", "FORMAT")))

STATE_BEGIN, STATE_CHECKPOINT, STATE_END = 5, 6, 7
RECORD_TYPES = {1: (CHUNK, COMMIT, DELETE, TAG),
                2: (CHUNK, COMMIT, DELETE, TAG, STATE_BEGIN, STATE_CHECKPOINT, STATE_END)}
STATE_END_PAYLOAD = struct.Struct("<QQ")
STATE_MARK = struct.Struct("<QQQQ")
LOG_POSITION = struct.Struct("<QQ")
BEGIN_KEYS = {"next_id", "checkpoints", "streams"}

# Torn records the generator appended at the tail: a header promising 1000 payload bytes,
# followed by only 6 (in "interrupted" a state section's BEGIN).
TORN = {"unapplied": b"SREC\x01\x00\x00\x00" + (1000).to_bytes(4, "little") + bytes(12)
        + b"torn!!",
        "interrupted": b"SREC\x05\x00\x00\x00" + (1000).to_bytes(4, "little") + bytes(12)
        + b"torn!!"}

# Segment header versions: all 2, but for the segments "upgraded" had as a format 1 store.
SEGMENT_VERSIONS = {"upgraded": {1: 1, 2: 1, 4: 1, 5: 2}}

# The complete state sections of each store's log, (first segment, last segment) in log
# order; which of them the index notes (META_LOG_STATE: its position in this list, or None).
SECTIONS = {"basic": [(4, 4)], "raw_cdc": [], "objects": [], "torch": [], "unapplied": [],
            "compacted": [(3, 3), (5, 6)], "upgraded": [(5, 5)],
            "interrupted": [(3, 3), (3, 3)]}
NOTED = {"basic": 0, "compacted": 1, "upgraded": 0,
         "interrupted": 0}    # its second section: compaction killed before noting it

# The golden files, as the version that made format 2 final wrote them (never regenerate).
GOLDEN_SHA256 = {
    "basic/FORMAT": "d5853fea21b457f72dc4bdba1c8ec79b1779644a7c1068a2f1fb6b31f93ab53e",
    "basic/expected.json": "ee8035f2ac7b2d11f702fcd9fab5e6eb5a479e0cd389e7e773540ecb00f087b6",
    "basic/index/data.mdb": "fe290ac8bd4d94195196ad60f7cbed7a5310ad016a8f1564accb5e6ca8a266ff",
    "basic/segments/0000000000000001.seg":
        "f587d53d46cbfbd679de6ea2a3b688bcf3501432cc95f60e28921082c8c4227b",
    "basic/segments/0000000000000002.seg":
        "a835319439359de01e89e9b569bf0a3beda64d533b263b16d4d76d021eae16e6",
    "basic/segments/0000000000000004.seg":
        "99c722d23dd1802ef252dfa01f62d23e0400f917d7224b5b00388fa915000f15",
    "compacted/FORMAT": "bb4ba3ac5fb1d5556a49a4f0d81987c8ae6af17b22ec6e771e7d4cf9f87b24b9",
    "compacted/expected.json": "1696c10c28b0bcd90aada9e797d34fe9b00033b0485ab53ae468ef733fa53095",
    "compacted/index/data.mdb": "90cd11f446911ebf3367a1cb2f4ac88670d300fa7daa534093a5351acc15f692",
    "compacted/segments/0000000000000003.seg":
        "2c011ab2bfab8b912667ed05b71c7a23f2792666c6c21fb3fad3c86027f187b5",
    "compacted/segments/0000000000000005.seg":
        "ec2cd6022faeea338d83ad39b4a22817f624568b4bef8cf568c9f9aab5b23ee2",
    "compacted/segments/0000000000000006.seg":
        "cc0d9fd99712d5b1a97927cabdde86171d63c16108377dc07027a4cba83ffd54",
    "interrupted/FORMAT": "4cd5b13a81ed63d9c128c60fc06e5a32ee6c15d8bf11df8bca11a82fdd1325a1",
    "interrupted/expected.json":
        "4b82bbd0c0a7b2fcb60606d9df95853982bbbbe76b0c7734f90ddbeb9ed58149",
    "interrupted/index/data.mdb":
        "e4584b6e8f405440adb268a8bb46bd666a3e6b62617689da5e85a5b325c50f24",
    "interrupted/segments/0000000000000001.seg":
        "310d7fa45acb56cfd5388d6d3a78a290dc32c21869799101436e7c10803abd91",
    "interrupted/segments/0000000000000002.seg":
        "13d38a6edf4527756a073af92fc12405eb2c53045b2cc8392cacd8eb7ee899bb",
    "interrupted/segments/0000000000000003.seg":
        "a41213e37bd72ac2a664c9512416b7dac79082fca1657fa3d9a8ceb0fe8d6706",
    "objects/FORMAT": "049ab30ac8bff7fd201d3462d3666d7147e23a8147831fed8e51bdb1997041bb",
    "objects/expected.json": "d069f17340f7fd5d17558edc39f0f20e1aff6541a7dd50890b865dbfc0b423a0",
    "objects/index/data.mdb": "a4497c5c1fc9550255cbbeb35fe7c7c38c6968804812dcf1bc4bb9e5800dd61e",
    "objects/segments/0000000000000001.seg":
        "ec6754fab00572cb5ad629d78394fbe9d4e41e0640cfedd42272736b916c3de4",
    "objects/segments/0000000000000002.seg":
        "aa614f093420c395a18ca4ad4f8a0600ad4b1c8a061c5ff91814b4b03042556b",
    "raw_cdc/FORMAT": "57e29d9f919ba21514fbeaf8a125284af0b5b566c963916b8f3fcfafe3c0b922",
    "raw_cdc/expected.json": "6fea579809d5dbc74acd1db23be90456bbc781a9ab37d3796d0609ea75ac0e8d",
    "raw_cdc/index/data.mdb": "63398aa501216e85ca7f5825d139d92e3bf9d0c24b968a4d5bd21c127697f717",
    "raw_cdc/segments/0000000000000001.seg":
        "470961527d7e70cdcc62c209eb1e9f549e4fa2f5d85f02ad05a7351594241650",
    "raw_cdc/segments/0000000000000002.seg":
        "1f4972010c88709b9fdbb678378a2abe791c6cda02cdb1f08e8d3466ad43c8c7",
    "raw_cdc/segments/0000000000000003.seg":
        "b984a76bc3da8358cab81ea59f4f7759ccf787736c874d2ebe2c40d208fa30c0",
    "torch/FORMAT": "57ef4d3cf1beaf07cc65e6bb331355e94abba0dd21af7105e94563d815080f5f",
    "torch/expected.json": "6f51969784e70cf5adeb67ec612ae07fc3975e3bc0afdcf8d4773a4dbed72e79",
    "torch/index/data.mdb": "e0d82f8ed8b9e8803ea22856df781fe0aee377dbabb3e7ca34511dd434929abf",
    "torch/segments/0000000000000001.seg":
        "faa125bd3a4b903192e6e0899aa36757b6210352382ba8110eeed4c458bf4dbe",
    "unapplied/FORMAT": "bb49033eb21b50594bddc556707486bdf51da44cc76c627d23c342da3d246edc",
    "unapplied/expected.json": "143d89b9cd009342c4d82c752ee4211d7408628d1ccc16266424c15a7b5482d6",
    "unapplied/index/data.mdb": "6e6c8bfa66dd05b0105d063c298079352748889ad98f8e84da5dbf714fc264ef",
    "unapplied/segments/0000000000000001.seg":
        "4ee13c71434585afa5a72af8612df8626b46703ab6d5d31e4844cba933c52af6",
    "upgraded/FORMAT": "3257b0f24d5cfafd765f6fe858b9861436bc76081818ce6d3d23fdf1fc6f38fe",
    "upgraded/expected.json": "34b0f977ca28e1f230e8f38e00601f24147da2bf74ce8c3b7005008cbac9eec9",
    "upgraded/index/data.mdb": "a4a9f0b2970c37607aa393d4eef82dc91f2d8c1ac745014db71cb447aa27b7bc",
    "upgraded/segments/0000000000000001.seg":
        "a04261507af6199367830adfc4616895a2d20653bf902a0e6a015cf02b5174d7",
    "upgraded/segments/0000000000000002.seg":
        "cc94ec1764111987a2b4e5abfda164419ca1491ea59605cdd5450fccd37e954f",
    "upgraded/segments/0000000000000004.seg":
        "67caebc1f01827858049a951a61d793a591843f8115df3113b60d5e0d6d42f43",
    "upgraded/segments/0000000000000005.seg":
        "965c7f64bf9231f23ef2ed1231004908b3da15ea2cbfa2785d30c0283156cb50",
}


# ---- a parser of the v2 log ----------------------------------------------------------------------
def parse_segment(path: str, torn: bytes = b"") -> tuple[int, int, list]:
    """(segment number, header version, records), checking every header and checksum and that
    each record's type is one its segment's version holds; the walk must end exactly at the
    end of the file, or exactly at `torn`, which must be all that is left."""
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    assert len(name) == 20 and name.endswith(".seg") and name[:16].isdigit(), name
    magic, version, reserved, number, checksum = SEG_HEADER.unpack_from(data, 0)
    assert magic == b"SNAPSEG\x00" and reserved == 0 and number == int(name[:16])
    assert version in RECORD_TYPES, (name, version)
    assert checksum == xxhash.xxh3_64_intdigest(data[:24], seed=0)
    records, pos = [], 32
    end = len(data) - len(torn)
    if torn:
        assert data[end:] == torn
    while pos < end:
        magic, rtype, codec, flags, length, reserved, checksum = REC_HEADER.unpack_from(data, pos)
        assert magic == b"SREC", (name, pos)
        assert rtype in RECORD_TYPES[version], (name, pos, rtype, version)
        assert codec in ((0, 1) if rtype == CHUNK else (0,)), (name, pos, codec)
        assert flags == 0 and reserved == 0, (name, pos)
        payload = data[pos + 24:pos + 24 + length]
        assert len(payload) == length, (name, pos, "record runs past the end")
        assert checksum == xxhash.xxh3_64_intdigest(data[pos:pos + 16] + payload, seed=0)
        records.append(Record(number, pos, rtype, codec, payload))
        pos += 24 + length
    assert pos == end, (name, pos, end)
    return number, version, records


def load_log(store: str) -> tuple[dict, dict, list]:
    """({segment: header version}, {segment: records}, all records in log order)."""
    versions, segs = {}, {}
    paths = sorted(glob.glob(os.path.join(V2, store, "segments", "*.seg")))
    for i, p in enumerate(paths):
        torn = TORN.get(store, b"") if i == len(paths) - 1 else b""
        number, version, recs = parse_segment(p, torn)
        versions[number], segs[number] = version, recs
    return versions, segs, [r for n in sorted(segs) for r in segs[n]]


class Section:
    """A complete state section: where it lies and what it says."""

    def __init__(self, begin: Record) -> None:
        self.first = begin
        self.last = begin
        self.head = json.loads(begin.payload.decode("utf-8"))
        self.checkpoints: list = []          # (JSON header, [extents of each buffer])
        self.digest = xxhash.xxh3_64(begin.payload, seed=0)

    @property
    def segments(self) -> tuple[int, int]:
        return self.first.segment, self.last.segment


def find_sections(records: list) -> tuple[list, int]:
    """(complete sections in log order, sections begun but never completed). A section is
    BEGIN, CHECKPOINT..., END with no other record between them and no gap in the segment
    numbers; its END must count its CHECKPOINT records and match their checksum."""
    done, broken, open_ = [], 0, None
    prev = None
    for r in records:
        if open_ is not None and r.segment not in (prev.segment, prev.segment + 1):
            broken, open_ = broken + 1, None
        if r.rtype == STATE_BEGIN:
            broken += open_ is not None
            open_ = Section(r)
        elif open_ is None:
            pass
        elif r.rtype == STATE_CHECKPOINT:
            head, new_chunks, extents = parse_commit(r.payload)
            assert head["new_chunks"] == 0 and new_chunks == [], "a section names no locations"
            open_.checkpoints.append((head, extents))
            open_.digest.update(r.payload)
            open_.last = r
        elif r.rtype == STATE_END:
            count, checksum = STATE_END_PAYLOAD.unpack(r.payload)
            open_.last = r
            if count == len(open_.checkpoints) and checksum == open_.digest.intdigest():
                done.append(open_)
            else:
                broken += 1
            open_ = None
        else:
            broken, open_ = broken + 1, None
        prev = r
    return done, broken + (open_ is not None)


def expected_of(store: str) -> dict:
    with open(os.path.join(V2, store, "expected.json")) as f:
        return json.load(f)


def all_chunks(records: list) -> dict:
    """{chunk id: raw bytes} of every chunk record (copies of one id hold the same bytes)."""
    out = {}
    for r in records:
        if r.rtype == CHUNK:
            cid, raw = parse_chunk(r)
            assert out.setdefault(cid, raw) == raw
    return out


# ---- the files themselves ----------------------------------------------------------------------
def test_golden_files_are_the_originals():
    assert files_sha256(V2) == GOLDEN_SHA256


@pytest.mark.parametrize("store", STORES)
def test_format_file(store):
    with open(os.path.join(V2, store, "FORMAT"), "rb") as f:
        d = json.loads(f.read())
    assert set(d) == {"format", "version", "created"}
    assert d["format"] == "snapstore" and d["version"] == 2
    assert isinstance(d["created"], float)
    assert expected_of(store)["format_version"] == 2
    if store == "upgraded":             # the upgrade kept the v1 store's creation time
        with open(os.path.join(V1, "basic", "FORMAT")) as f:
            assert d["created"] == json.load(f)["created"]


def test_upgrade_left_the_format_1_segments_as_they_were():
    for n in (1, 2, 4):
        name = f"{n:016d}.seg"
        with open(os.path.join(V1, "basic", "segments", name), "rb") as a, \
                open(os.path.join(V2, "upgraded", "segments", name), "rb") as b:
            assert a.read() == b.read(), name


# ---- the log -------------------------------------------------------------------------------------
@pytest.mark.parametrize("store", STORES)
def test_segments_walk_to_the_end(store):
    exp = expected_of(store)
    versions, segs, records = load_log(store)
    assert sorted(segs) == exp["segments"]
    want = SEGMENT_VERSIONS.get(store, {})
    assert versions == {n: want.get(n, 2) for n in segs}
    codecs = set()
    for r in records:
        if r.rtype == CHUNK:
            parse_chunk(r)
            codecs.add(r.codec)
    if exp["options"].get("compression") == "none":
        assert codecs == {0}
    if store in ("basic", "compacted"):
        assert codecs == {0, 1}
    for r in records:
        if r.rtype == COMMIT:
            head, new_chunks, _ = parse_commit(r.payload)
            for cid, seg, off, stored, raw_len, codec in new_chunks:
                assert (seg, off) < (r.segment, r.offset)    # chunks before their commit
        elif r.rtype == DELETE:
            assert len(r.payload) == 8
            assert struct.unpack("<Q", r.payload)[0] in exp["deleted"]
        elif r.rtype == TAG:
            d = json.loads(r.payload)
            assert set(d) == {"id", "tag", "add"} and isinstance(d["add"], bool)


@pytest.mark.parametrize("store", STORES)
def test_state_sections(store):
    exp = expected_of(store)
    _, segs, records = load_log(store)
    chunks = all_chunks(records)
    sections, broken = find_sections(records)
    assert broken == 0                        # ("interrupted"'s torn BEGIN is no record)
    assert [s.segments for s in sections] == SECTIONS[store]
    for s in sections:
        assert set(s.head) == BEGIN_KEYS
        assert isinstance(s.head["next_id"], int) and s.head["checkpoints"] == len(s.checkpoints)
        ids = [h["id"] for h, _ in s.checkpoints]
        assert ids == sorted(set(ids)) and all(i < s.head["next_id"] for i in ids)
        by_id = {h["id"]: h for h, _ in s.checkpoints}
        for name, st in s.head["streams"].items():
            assert set(st) == {"head", "seq"}
            mine = [h for h in by_id.values() if h["stream"] == name]
            assert st["head"] == max(h["id"] for h in mine)        # the newest one left
            assert st["seq"] >= max(h["seq"] for h in mine)
        assert {h["stream"] for h in by_id.values()} == set(s.head["streams"])
        for head, extents in s.checkpoints:
            assert set(head) == COMMIT_KEYS
            for b, ext in zip(head["buffers"], extents):
                assert set(b) == BUFFER_KEYS and b["extents"] == len(ext)
                assert (b["base"] == "full") == (b["depth"] == 0)
                if b["base"] == "delta":
                    assert head["parent"] in by_id       # a chain never leaves the section
                check_extents(ext, b["size"], b["base"] == "full",
                              lambda cid: len(chunks[cid]))   # every chunk is in the log
        # the END record: count and checksum written out once more
        count, checksum = STATE_END_PAYLOAD.unpack(s.last.payload)
        assert s.last.rtype == STATE_END and count == len(s.checkpoints)
        assert checksum == xxhash.xxh3_64_intdigest(
            s.first.payload + b"".join(r.payload for r in records
                                       if r.rtype == STATE_CHECKPOINT
                                       and (s.first.segment, s.first.offset)
                                       < (r.segment, r.offset)
                                       < (s.last.segment, s.last.offset)), seed=0)
    if store == "compacted":
        first, second = sections
        assert second.first.segment + 1 == second.last.segment == 6      # spans 5 -> 6
        assert segs[6][0].rtype == STATE_CHECKPOINT and segs[6][0].offset == 32
        # 4 deleted, 8 9 10 11 committed and 10 deleted between them; 12 after the second
        assert [h["id"] for h, _ in first.checkpoints] == [2, 4, 5, 6, 7]
        assert [h["id"] for h, _ in second.checkpoints] == [2, 5, 6, 7, 8, 9, 11]
        # the fold (7 was depth 5: full now) and the trim are in the sections' manifests
        depth = {h["id"]: max(b["depth"] for b in h["buffers"]) for h, _ in first.checkpoints}
        assert max(depth.values()) < 3, depth
        # trimmed: the last page of w's first 16 KiB chunk (checkpoint 2's delta rewrote
        # the other 3, and 1, their full base, was deleted) is a chunk of its own now,
        # written just before the first section
        head, extents = first.checkpoints[0]
        w = [b["name"] for b in head["buffers"]].index("w")
        (coff, length, chunk), = [(e[1], e[2], e[3]) for e in extents[w] if e[0] == 12288]
        assert (coff, length, len(chunks[chunk])) == (0, 4096, 4096)
        assert [parse_chunk(r)[0] for r in segs[3] if r.rtype == CHUNK][0] == chunk
        assert segs[3][1] is first.first
    if store == "interrupted":                 # the killed compactions wrote the same state
        a, b = sections
        assert a.head == b.head
        assert [r.payload for r in records if r.rtype == STATE_CHECKPOINT][:3] == \
            [r.payload for r in records if r.rtype == STATE_CHECKPOINT][3:]
        # chunk records twice in the log: copied forward, the old segment never removed
        copies = [parse_chunk(r)[0] for r in segs[3] if r.rtype == CHUNK][1:]
        assert copies and set(copies) <= {parse_chunk(r)[0] for r in segs[2]
                                          if r.rtype == CHUNK}
    if store in ("basic", "upgraded"):         # checkpoints 10-12 exist in the log only here
        (s,) = sections
        in_commits = {parse_commit(r.payload)[0]["id"] for r in records if r.rtype == COMMIT}
        assert {10, 11, 12} <= {h["id"] for h, _ in s.checkpoints}
        assert not {10, 11, 12} & in_commits


def replay(records: list) -> tuple[dict, dict, int, dict]:
    """The checkpoint state from the log alone, by the rule of format 2: the newest complete
    state section, then the commit, delete and tag records after it, in log order. Returns
    ({id: JSON header as now}, {stream: [head, seq]}, next id, {id: (header as recorded,
    extents)} of every checkpoint seen, deleted ones too: what restoring by hand needs, as a
    delete's child here keeps its recorded manifests and old parent, where the engine
    merges the parent's into it)."""
    sections, _ = find_sections(records)
    live, streams, recorded, next_id, start = {}, {}, {}, 1, 0
    if sections:
        s = sections[-1]
        next_id = s.head["next_id"]
        streams = {n: [v["head"], v["seq"]] for n, v in s.head["streams"].items()}
        for head, extents in s.checkpoints:
            live[head["id"]] = dict(head)
            recorded[head["id"]] = (head, extents)
        start = records.index(s.last) + 1
    for r in records[start:]:
        if r.rtype == COMMIT:
            head, _, extents = parse_commit(r.payload)
            live[head["id"]] = dict(head)
            recorded[head["id"]] = (head, extents)
            streams[head["stream"]] = [head["id"], head["seq"]]
            next_id = max(next_id, head["id"] + 1)
        elif r.rtype == DELETE:
            (victim,) = struct.unpack("<Q", r.payload)
            gone = live.pop(victim)
            for c in live.values():
                if c["parent"] == victim:
                    c["parent"] = gone["parent"]
            left = [i for i, c in live.items() if c["stream"] == gone["stream"]]
            if left:
                streams[gone["stream"]][0] = max(left)
            else:
                del streams[gone["stream"]]
        elif r.rtype == TAG:
            d = json.loads(r.payload)
            if d["id"] in live:
                tags = set(live[d["id"]]["tags"])
                tags.add(d["tag"]) if d["add"] else tags.discard(d["tag"])
                live[d["id"]]["tags"] = sorted(tags)
    return live, streams, next_id, recorded


def restore_by_hand(recorded: dict, chunks: dict, cid: int) -> dict:
    """Buffers of a checkpoint from the replayed log: its manifest, and up the recorded parent
    chain to the nearest full one, every layer applied oldest first."""
    head, extents = recorded[cid]
    out = {}
    for i, b in enumerate(head["buffers"]):
        layers, h, e, k = [], head, extents, i
        while True:
            layers.append(e[k])
            if h["buffers"][k]["base"] == "full":
                break
            h, e = recorded[h["parent"]]
            k = [x["name"] for x in h["buffers"]].index(b["name"])
            assert h["buffers"][k]["size"] == b["size"]
        buf = bytearray(b["size"])
        for layer in reversed(layers):
            for boff, coff, length, chunk in layer:
                buf[boff:boff + length] = chunks[chunk][coff:coff + length]
        out[b["name"]] = bytes(buf)
    return out


@pytest.mark.parametrize("store", STORES)
def test_log_alone_gives_every_checkpoint(store):
    """Format 2's promise, by hand: whatever compaction removed, the segments describe every
    checkpoint (ids, streams, seqs, parents, tags, meta, creation, buffers and their bytes),
    every stream head and the next id."""
    exp = expected_of(store)
    _, _, records = load_log(store)
    live, streams, next_id, recorded = replay(records)
    chunks = all_chunks(records)
    assert sorted(live) == [c["id"] for c in exp["checkpoints"]]
    for c in exp["checkpoints"]:
        h = live[c["id"]]
        assert (h["stream"], h["seq"], h["parent"], sorted(h["tags"]), h["meta"], h["created"],
                h["bytes_new"]) == (c["stream"], c["seq"], c["parent"], c["tags"], c["meta"],
                                    c["created"], c["bytes_new"])
        assert [(b["name"], b["size"]) for b in h["buffers"]] == \
            [(b["name"], b["size"]) for b in c["buffers"]]
        data = restore_by_hand(recorded, chunks, c["id"])
        assert {k: hashlib.sha256(v).hexdigest() for k, v in data.items()} == \
            {b["name"]: b["sha256"] for b in c["buffers"]}
    assert streams == {s: [v["head"], v["next_seq"] - 1] for s, v in exp["streams"].items()}
    assert next_id == exp["next_id"]


# ---- the LMDB index ------------------------------------------------------------------------------
@pytest.fixture
def index(request, tmp_path):
    """(store, {database: {key: payload}}), every value's checksum checked and stripped."""
    store = request.param
    d = os.path.join(str(tmp_path), "index")
    os.makedirs(d)
    shutil.copy(os.path.join(V2, store, "index", "data.mdb"), d)
    env = lmdb.open(d, readonly=True, lock=False, max_dbs=16, subdir=True)
    try:
        with env.begin() as txn:
            names = {k for k, _ in txn.cursor()}
            assert names == INDEX_DBS
            payloads = {}
            for name in names:
                db = env.open_db(name, txn=txn, create=False)
                payloads[name] = {}
                for key, value in txn.cursor(db=db):
                    assert len(value) >= 8, (name, key)
                    assert value[-8:] == index_checksum(name, key, value[:-8]), (name, key)
                    payloads[name][key] = value[:-8]
    finally:
        env.close()
    yield store, payloads


@pytest.mark.parametrize("index", STORES, indirect=True)
def test_lmdb_meta(index):
    store, dbs = index
    exp = expected_of(store)
    _, segs, records = load_log(store)
    sections, _ = find_sections(records)
    meta = dbs[b"meta"]
    noted = NOTED.get(store)
    assert set(meta) == {b"applied", b"next_id", b"format"} | \
        ({b"log_state"} if noted is not None else set())
    assert meta[b"format"] == struct.pack("<Q", 2)
    if noted is not None:
        s = sections[noted]
        assert STATE_MARK.unpack(meta[b"log_state"]) == \
            (s.first.segment, s.first.offset, s.last.segment, s.last.end)
    seg, off = LOG_POSITION.unpack(meta[b"applied"])
    (next_id,) = struct.unpack("<Q", meta[b"next_id"])
    last = max(segs)
    size = os.path.getsize(os.path.join(V2, store, "segments", f"{last:016d}.seg"))
    if store == "unapplied":            # applied up to checkpoint 1's commit, not 2's
        first, second = [r for r in records if r.rtype == COMMIT]
        assert (seg, off) == (first.segment, first.end) and off < second.offset
        assert next_id == 2
    elif store == "interrupted":        # the second section lies past `applied`
        assert (seg, off) == (sections[1].first.segment, sections[1].first.offset)
        assert next_id == exp["next_id"]
    else:                               # a clean close: all of the log applied
        assert (seg, off) == (last, size)
        assert next_id == exp["next_id"]


@pytest.mark.parametrize("index", STORES, indirect=True)
def test_lmdb_payloads(index):
    """The payloads under the checksums are the v1 layouts (test_format_layout.py), and
    describe what expected.json says: chunk entries point at their records, reference counts
    are exact, restoring by hand from index and log gives the bytes."""
    store, dbs = index
    exp = expected_of(store)
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    visible = exp["readonly_ids"]
    _, _, records = load_log(store)
    chunk_at = {(r.segment, r.offset): r for r in records if r.rtype == CHUNK}
    chunks, refs = {}, {}
    for key, value in dbs[b"chunks"].items():
        assert len(key) == 32 and len(value) == 33
        seg, off, stored, raw_len, count, codec = CHUNK_ENTRY.unpack(value)
        rec = chunk_at[(seg, off)]
        cid, raw = parse_chunk(rec)
        assert cid == key and stored == len(rec.payload) and raw_len == len(raw)
        assert codec == rec.codec
        chunks[key], refs[key] = raw, 0
        if store == "interrupted":   # at the copies, never into the segment left behind
            assert seg != 2
    ids = []
    for key, value in dbs[b"checkpoints"].items():
        (cid,) = struct.unpack(">Q", key)
        ids.append(cid)
        info = json.loads(value)
        assert set(info) == COMMIT_KEYS - {"new_chunks"} and info["id"] == cid
        c = by_id[cid]
        assert (info["stream"], info["seq"], info["parent"], sorted(info["tags"]), info["meta"],
                info["created"], info["bytes_new"]) == \
            (c["stream"], c["seq"], c["parent"], c["tags"], c["meta"], c["created"],
             c["bytes_new"])
        assert max((b["depth"] for b in info["buffers"]), default=0) == c["chain_length"]
        for i, b in enumerate(info["buffers"]):
            assert set(b) == BUFFER_KEYS
            blob = dbs[b"manifests"][struct.pack(">QI", cid, i)]
            assert len(blob) % 48 == 0
            assert b["extents"] in (len(blob) // 48, 0)     # the v1 quirk is still there
            ext = [EXTENT.unpack_from(blob, k) for k in range(0, len(blob), 48)]
            check_extents(ext, b["size"], b["base"] == "full", lambda k: len(chunks[k]))
            for e in ext:
                refs[e[3]] += 1
    assert ids == visible
    assert {struct.unpack(">QI", k) for k in dbs[b"manifests"]} == \
        {(cid, i) for cid in ids for i in range(len(by_id[cid]["buffers"]))}
    assert {k: CHUNK_ENTRY.unpack(v)[4] for k, v in dbs[b"chunks"].items()} == refs
    for cid in ids:
        data = own_restore(dbs, chunks, cid)
        assert {k: hashlib.sha256(v).hexdigest() for k, v in data.items()} == \
            {b["name"]: b["sha256"] for b in by_id[cid]["buffers"]}
    # streams, stream_ckpts, children: v1 payloads (the last two empty: only the checksum)
    streams = {k.decode(): json.loads(v) for k, v in dbs[b"streams"].items()}
    assert set(streams) == {by_id[i]["stream"] for i in visible}
    for name, d in streams.items():
        assert set(d) == {"head", "seq"}
        assert d["head"] == max(i for i in visible if by_id[i]["stream"] == name)
    assert all(v == b"" for v in dbs[b"stream_ckpts"].values())
    assert {(k.partition(b"\0")[0].decode(), struct.unpack(">Q", k.partition(b"\0")[2])[0])
            for k in dbs[b"stream_ckpts"]} == {(by_id[i]["stream"], i) for i in visible}
    assert all(v == b"" for v in dbs[b"children"].values())
    assert {struct.unpack(">QQ", k) for k in dbs[b"children"]} == \
        {(by_id[i]["parent"], i) for i in visible if by_id[i]["parent"] is not None}
    # fingerprints: of the checkpoint they name, while it lives
    checked = 0
    for key, value in dbs[b"fingerprints"].items():
        stream, _, buffer = key.partition(b"\0")
        cid, page_size, reserved = FP_HEADER.unpack_from(value, 0)
        assert reserved == 0 and page_size == 4096 and (len(value) - 16) % 16 == 0
        if cid in visible:
            assert by_id[cid]["stream"] == stream.decode()
            data = own_restore(dbs, chunks, cid)[buffer.decode()]
            assert value[16:] == page_fingerprints(data, page_size)
            checked += 1
        else:
            assert cid in exp["deleted"], (store, cid)
    assert checked or store == "raw_cdc"


# ---- a state section written by hand -----------------------------------------------------------
def _hand_section(checksum_delta: int = 0) -> bytes:
    """A state section, by the layout above, saying that only checkpoints 1 and 2 of v2/raw_cdc
    exist (3 and 4 are left out), checkpoint 1 tagged "hand" too, the next id 10; then a tag
    record after it."""
    _, _, records = load_log("raw_cdc")
    commits = {}
    for r in records:
        if r.rtype == COMMIT:
            head, _, extents = parse_commit(r.payload)
            commits[head["id"]] = (head, extents)
    begin = json.dumps({"next_id": 10, "checkpoints": 2,
                        "streams": {"docs": {"head": 2, "seq": 2}}}).encode()
    payloads = []
    for cid in (1, 2):
        head, extents = commits[cid]
        head = dict(head, new_chunks=0, tags=["first", "hand"] if cid == 1 else [])
        js = json.dumps(head).encode()
        payloads.append(struct.pack("<I", len(js)) + js
                        + b"".join(EXTENT.pack(*e) for ext in extents for e in ext))
    checksum = xxhash.xxh3_64_intdigest(begin + b"".join(payloads), seed=0)
    end = STATE_END_PAYLOAD.pack(2, (checksum + checksum_delta) % (1 << 64))
    return (record(STATE_BEGIN, begin) + b"".join(record(STATE_CHECKPOINT, p) for p in payloads)
            + record(STATE_END, end)
            + record(TAG, json.dumps({"id": 2, "tag": "after", "add": True}).encode()))


def _view(path: str) -> dict:
    with snapstore.open(path, readonly=True) as s:
        return {c.id: (c.stream, sorted(c.tags), {k: hashlib.sha256(v).hexdigest()
                                                  for k, v in s.restore(c.id).items()})
                for c in s.checkpoints()}


def test_hand_built_state_section_is_read_by_todays_code(tmp_path):
    """A section written with the layout above, appended to a copy of v2/raw_cdc: recovery
    passes over it (the index is the state: it only applies the tag after it) and verify
    finds the records valid; repair, with the index gone, takes the state from it; with its
    END checksum off by one it is no section, and repair replays the whole log instead."""
    exp = expected_of("raw_cdc")
    sha = {c["id"]: {b["name"]: b["sha256"] for b in c["buffers"]} for c in exp["checkpoints"]}
    last = os.path.join("segments", f"{max(exp['segments']):016d}.seg")
    paths = {}
    for variant, delta in (("good", 0), ("bad", 1)):
        path = paths[variant] = os.path.join(str(tmp_path), variant)
        shutil.copytree(os.path.join(V2, "raw_cdc"), path,
                        ignore=shutil.ignore_patterns("expected.json"))
        with open(os.path.join(path, last), "ab") as f:
            f.write(_hand_section(delta))
        number, version, records = parse_segment(os.path.join(path, last))
        assert version == 2 and [r.rtype for r in records][-5:] == [5, 6, 6, 7, 4]
        assert len(find_sections(records)[0]) == (delta == 0)

    path = paths["good"]
    work = path + "-recovered"
    shutil.copytree(path, work)
    with snapstore.open(work, durability="none") as s:
        assert [c.id for c in s.checkpoints()] == [1, 2, 3, 4]
        assert s.get(2).tags == ("after",) and s.get(1).tags == ("first",)
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]

    shutil.rmtree(os.path.join(path, "index"))
    report = snapstore.repair(path)
    assert report["ok"], report["problems"][:5]
    assert _view(path) == {1: ("docs", ["first", "hand"], sha[1]),
                           2: ("docs", ["after"], sha[2])}
    with snapstore.open(path, durability="none") as s:
        assert s.streams() == ["docs"]
        info = s.checkpoint({"n": b"next"}, stream="docs")
        assert (info.id, info.seq, info.parent) == (10, 3, 2)

    path = paths["bad"]
    shutil.rmtree(os.path.join(path, "index"))
    report = snapstore.repair(path)
    assert report["ok"], report["problems"][:5]
    assert _view(path) == {1: ("docs", ["first"], sha[1]), 2: ("docs", ["after"], sha[2]),
                           3: ("pages", [], sha[3]), 4: ("pages", [], sha[4])}
