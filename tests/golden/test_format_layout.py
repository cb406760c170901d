"""The v1 on-disk layouts, byte by byte, from the golden stores (docs/design.md).

Every offset, size and struct layout here is written out by hand: nothing comes from
snapstore.format, so a change there (or anywhere else in the code) cannot silently move this
test along with it. The golden files themselves are pinned by SHA-256: they were made by the
version that defined format 1 and are never rewritten (README.md).

What is pinned:
  segment file:  32-byte header  <8sIIQQ  magic b"SNAPSEG\\0", version 1, reserved 0,
                 segment number (= the file name), XXH3-64 (seed 0) of bytes 0..23;
                 then records back to back up to exactly the end of the file.
  record:        24-byte header <4sBBHIIQ  b"SREC", type 1..4, codec, flags 0, payload
                 length, reserved 0, XXH3-64 of header bytes 0..15 followed by the payload.
  chunk (1):     32-byte BLAKE3-256 of the uncompressed bytes, u32 raw length, then a zstd
                 frame (codec 1) or the raw bytes (codec 0).
  commit (2):    u32 JSON length, JSON header, new-chunk table (57 bytes each, <32sQQIIB),
                 extents (48 bytes each, <QII32s) buffer by buffer.
  delete (3):    u64 checkpoint id.          tag (4): JSON {"id", "tag", "add"}.
  LMDB index:    see test_lmdb_* below.
Today's format 6 (test_todays_code_writes_format_6): FORMAT and segment headers say 6,
records keep these layouts but for the order format 3 adds to commit, delete and tag records
(and the chunk codecs formats 4 and 5 add for float buffers, and format 6's rotations of
their byte planes), and every LMDB value is its payload followed by index_checksum(). The
format 2 golden stores (state sections and all) are pinned in test_format_layout_v2.py, which
uses the parsers below; format 3 in test_format_layout_v3.py, format 4 in
test_format_layout_v4.py, format 5 in test_format_layout_v5.py, format 6 in
test_format_layout_v6.py.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import struct

import blake3
import lmdb
import pytest
import xxhash
import zstandard

from golden_values import files_sha256

import snapstore
import snapstore.errors

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = os.path.join(HERE, "stores", "v1")
STORES = sorted(os.path.basename(os.path.dirname(p))
                for p in glob.glob(os.path.join(V1, "*", "FORMAT")))

# ---- the v1 layouts, by hand -------------------------------------------------------------------
SEG_HEADER = struct.Struct("<8sIIQQ")
REC_HEADER = struct.Struct("<4sBBHIIQ")
CHUNK_PREFIX = struct.Struct("<32sI")
NEW_CHUNK = struct.Struct("<32sQQIIB")
EXTENT = struct.Struct("<QII32s")
CHUNK_ENTRY = struct.Struct("<QQIIQB")
FP_HEADER = struct.Struct("<QII")
assert (SEG_HEADER.size, REC_HEADER.size, CHUNK_PREFIX.size, NEW_CHUNK.size, EXTENT.size,
        CHUNK_ENTRY.size, FP_HEADER.size) == (32, 24, 36, 57, 48, 33, 16)

CHUNK, COMMIT, DELETE, TAG = 1, 2, 3, 4
COMMIT_KEYS = {"id", "stream", "parent", "created", "meta", "bytes_new", "tags", "seq",
               "buffers", "new_chunks"}
BUFFER_KEYS = {"name", "size", "base", "depth", "layout", "page_size", "extents"}
INDEX_DBS = {b"meta", b"chunks", b"checkpoints", b"manifests", b"streams", b"stream_ckpts",
             b"children", b"fingerprints"}

# A torn record the generator appended to the "unapplied" store: a chunk record header that
# promises 1000 payload bytes, followed by only 6.
TORN = {"unapplied": b"SREC\x01\x00\x00\x00" + (1000).to_bytes(4, "little") + bytes(12)
        + b"torn!!"}

# The golden files, as the format-defining version wrote them (never regenerate: README.md).
GOLDEN_SHA256 = {
    "basic/FORMAT": "d1db41d243dde3079239f583da1248888298337b9f85c6a77799083826732c0f",
    "basic/expected.json": "f64862dc128a627470271bdefdf41cc5dfe369903358c78794288f76ea276560",
    "basic/index/data.mdb": "d3ae61ed9a9c71d30f88c7e2d0c68017ce2880617869802596666f750a3feb1e",
    "basic/segments/0000000000000001.seg":
        "a04261507af6199367830adfc4616895a2d20653bf902a0e6a015cf02b5174d7",
    "basic/segments/0000000000000002.seg":
        "cc94ec1764111987a2b4e5abfda164419ca1491ea59605cdd5450fccd37e954f",
    "basic/segments/0000000000000004.seg":
        "67caebc1f01827858049a951a61d793a591843f8115df3113b60d5e0d6d42f43",
    "objects/FORMAT": "551b54992e72d3ee135bc7052f26836d406860e043c901f415f985b88b148ba5",
    "objects/expected.json": "0288c3b7a7f10d37494b69f388a64318b2ad56ed8a48b4ca1d887e7cb0d8fc55",
    "objects/index/data.mdb": "7c0815767be818ab22463b917ef3961acc7d81e21596517930784a2b1082e2e2",
    "objects/segments/0000000000000001.seg":
        "6e1da77f30050150137798089865e56da641c036eecb389acc2c61de9bba0934",
    "objects/segments/0000000000000002.seg":
        "06bd9d2bef3d05d7cc20b267388721980b060ccf0d1b53c9ae0c52687f92f074",
    "raw_cdc/FORMAT": "79845b7a9eb736bdba917a26a85aedbeb9219f551ee2c7b12f09fd09142e8198",
    "raw_cdc/expected.json": "5ae61775b79c1312a08848696e66b66c642ea2aa0f1264de9fccacb67855e325",
    "raw_cdc/index/data.mdb": "b381becb608e86ddbb62f615ce663973d582ce2b6180593c43282f75d5917b5e",
    "raw_cdc/segments/0000000000000001.seg":
        "1b8d3add9514dcc24fa61863c9f0c01ad8dc2f13a4fc64067c83970839265d9d",
    "raw_cdc/segments/0000000000000002.seg":
        "2d0ca64415abe2f31f607cb4472052d521dbd07d1a326a66748a43db754e7cc5",
    "raw_cdc/segments/0000000000000003.seg":
        "ab3339235c8912df9ad745d872479fd67b5402b414eb7d86f02da52f3b448ba3",
    "torch/FORMAT": "08e3f84f473bc3a2c0a5cce255f37fe62262207807fbf758ae862116e15108a4",
    "torch/expected.json": "895262fe3c44677c303c75c85a29b2368719a3eae07f60bb690047db6957fbe7",
    "torch/index/data.mdb": "232d5ff23e899ef3513a5db0366a2add46fd68c36799defb944533747ca9060c",
    "torch/segments/0000000000000001.seg":
        "bcdd1dc9fe905cfc595626330a77b88d5da297664dbe0d04da890c1b4ac7a589",
    "unapplied/FORMAT": "e52629338a8e8e8813d81fa2d556bb922a51d14d555a2e92d17263361ccb7df3",
    "unapplied/expected.json":
        "53b600d96b647d19d6c6b50df814f31780b19c1cbf274fc56d74dfe7be868d2b",
    "unapplied/index/data.mdb":
        "90413f8e809d817a19bf60fbe58741f3a6c1b7b2d6415602b45f55cd712dc308",
    "unapplied/segments/0000000000000001.seg":
        "ef3f59b7c2b62e4e65f671997cb1949d8618d5e28ce8125f9069723b8182d906",
}

# The first 80 bytes of basic/segments/0000000000000001.seg: the segment header (number 1)
# and the header of the first record (a zstd chunk of 16 KiB), then the start of its payload.
BASIC_SEG1_HEAD = bytes.fromhex(
    "534e415053454700" "01000000" "00000000" "0100000000000000" "8e522b07c7e26ed8"   # segment
    "53524543" "01" "01" "0000" "b50b0000" "00000000" "90b10746a02c9426"              # record
    "8666d85f66e18274828cb4e133a403cf2d69a69aded9a75f312df774b16024fa" "00400000"     # id, raw
    "28b52ffd")                                                                       # zstd


# ---- a parser of the v1 log ----------------------------------------------------------------------
class Record:
    def __init__(self, segment, offset, rtype, codec, payload):
        self.segment, self.offset, self.rtype, self.codec = segment, offset, rtype, codec
        self.payload = payload
        self.end = offset + REC_HEADER.size + len(payload)


def parse_segment(path: str, torn: bytes = b"", version: int = 1) -> tuple[int, list]:
    """(segment number, records), checking every header and checksum; the walk must end
    exactly at the end of the file, or exactly at `torn` which must be all that is left.
    `version` is the format the segment header must name (its records have the v1 layouts)."""
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    assert len(name) == 20 and name.endswith(".seg") and name[:16].isdigit(), name
    magic, seg_version, reserved, number, checksum = SEG_HEADER.unpack_from(data, 0)
    assert magic == b"SNAPSEG\x00"
    assert seg_version == version
    assert reserved == 0
    assert number == int(name[:16])
    assert checksum == xxhash.xxh3_64_intdigest(data[:24], seed=0)
    records, pos = [], 32
    end = len(data) - len(torn)
    if torn:
        assert data[end:] == torn
    while pos < end:
        magic, rtype, codec, flags, length, reserved, checksum = REC_HEADER.unpack_from(data, pos)
        assert magic == b"SREC", (name, pos)
        assert rtype in (CHUNK, COMMIT, DELETE, TAG), (name, pos, rtype)
        assert codec in ((0, 1) if rtype == CHUNK else (0,)), (name, pos, codec)
        assert flags == 0 and reserved == 0, (name, pos)
        payload = data[pos + 24:pos + 24 + length]
        assert len(payload) == length, (name, pos, "record runs past the end")
        assert checksum == xxhash.xxh3_64_intdigest(data[pos:pos + 16] + payload, seed=0)
        records.append(Record(number, pos, rtype, codec, payload))
        pos += 24 + length
    assert pos == end, (name, pos, end)
    return number, records


def parse_chunk(rec: Record) -> tuple[bytes, bytes]:
    """(chunk id, uncompressed bytes), checked."""
    cid, raw_len = CHUNK_PREFIX.unpack_from(rec.payload, 0)
    stored = rec.payload[36:]
    if rec.codec == 1:
        assert stored[:4] == b"\x28\xb5\x2f\xfd"                  # a zstd frame
        raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_len)
        assert len(stored) <= raw_len - raw_len // 32, "compressed although it saves < 1/32"
    else:
        raw = stored
    assert len(raw) == raw_len
    assert blake3.blake3(raw).digest() == cid
    return cid, raw


def parse_commit(payload: bytes, extra_keys=()) -> tuple[dict, list, list]:
    """(JSON header, new-chunk entries, [extents of each buffer]); the JSON header holds
    exactly COMMIT_KEYS and `extra_keys` (format 3 records add "order")."""
    (n,) = struct.unpack_from("<I", payload, 0)
    head = json.loads(payload[4:4 + n].decode("utf-8"))
    assert set(head) == COMMIT_KEYS | set(extra_keys), sorted(head)
    pos = 4 + n
    new_chunks = [NEW_CHUNK.unpack_from(payload, pos + i * 57) for i in range(head["new_chunks"])]
    pos += 57 * head["new_chunks"]
    extents = []
    for b in head["buffers"]:
        assert set(b) == BUFFER_KEYS, sorted(b)
        extents.append([EXTENT.unpack_from(payload, pos + i * 48) for i in range(b["extents"])])
        pos += 48 * b["extents"]
    assert pos == len(payload), "commit payload longer than its header says"
    return head, new_chunks, extents


def check_extents(extents: list, size: int, full: bool, chunk_len) -> None:
    """Sorted, non-overlapping, inside the buffer and the chunk; full ones cover the buffer."""
    at = 0
    for boff, coff, length, cid in extents:
        assert boff >= at and length > 0, (boff, at, length)
        assert boff + length <= size
        if chunk_len(cid) is not None:
            assert coff + length <= chunk_len(cid)
        if full:
            assert boff == at, "a full manifest has a hole"
        at = boff + length
    if full:
        assert at == size, "a full manifest does not reach the end of its buffer"


def load_log(store: str) -> tuple[dict, list]:
    """{segment: records} of a golden store, and all records in log order."""
    segs = {}
    torn = TORN.get(store, b"")
    paths = sorted(glob.glob(os.path.join(V1, store, "segments", "*.seg")))
    for i, p in enumerate(paths):
        number, recs = parse_segment(p, torn if i == len(paths) - 1 else b"")
        segs[number] = recs
    return segs, [r for n in sorted(segs) for r in segs[n]]


def expected_of(store: str) -> dict:
    with open(os.path.join(V1, store, "expected.json")) as f:
        return json.load(f)


# ---- the files themselves ----------------------------------------------------------------------
def test_golden_files_are_the_originals():
    assert files_sha256(V1) == GOLDEN_SHA256


def test_first_bytes_of_a_segment_pinned():
    with open(os.path.join(V1, "basic", "segments", "0000000000000001.seg"), "rb") as f:
        head = f.read(len(BASIC_SEG1_HEAD))
    assert head == BASIC_SEG1_HEAD
    assert xxhash.xxh3_64_intdigest(head[:24], seed=0).to_bytes(8, "little") == head[24:32]


@pytest.mark.parametrize("store", STORES)
def test_format_file(store):
    with open(os.path.join(V1, store, "FORMAT"), "rb") as f:
        raw = f.read()
    d = json.loads(raw)
    assert set(d) == {"format", "version", "created"}
    assert d["format"] == "snapstore" and d["version"] == 1
    assert isinstance(d["created"], float)


# ---- the log -------------------------------------------------------------------------------------
@pytest.mark.parametrize("store", STORES)
def test_segments_walk_to_the_end(store):
    exp = expected_of(store)
    segs, records = load_log(store)
    assert sorted(segs) == exp["segments"]
    assert records, store
    chunks = {}
    codecs = set()
    for r in records:
        if r.rtype == CHUNK:
            cid, raw = parse_chunk(r)
            chunks.setdefault(cid, raw)
            codecs.add(r.codec)
    if exp["options"].get("compression") == "none":
        assert codecs == {0}
    if store == "basic":
        assert codecs == {0, 1}            # random bytes raw, compressible ones zstd
    if store == "unapplied":
        # the killed writer's chunks, its commit and the torn tail are in the log
        assert sum(r.rtype == COMMIT for r in records) == 2


@pytest.mark.parametrize("store", STORES)
def test_commit_records(store):
    exp = expected_of(store)
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    segs, records = load_log(store)
    chunk_at = {}
    raw_of = {}
    for r in records:
        if r.rtype == CHUNK:
            cid, raw = parse_chunk(r)
            chunk_at[(r.segment, r.offset)] = (cid, r)
            raw_of.setdefault(cid, raw)
    commits = 0
    for r in records:
        if r.rtype != COMMIT:
            continue
        head, new_chunks, extents = parse_commit(r.payload)
        commits += 1
        assert isinstance(head["id"], int) and isinstance(head["seq"], int)
        assert head["parent"] is None or head["parent"] < head["id"]
        for cid, seg, off, stored, raw_len, codec in new_chunks:
            # the chunk records a commit introduces come before it in the log
            assert (seg, off) < (r.segment, r.offset)
            if seg in segs:                    # (compaction may have removed the segment)
                got, crec = chunk_at[(seg, off)]
                assert got == cid and stored == len(crec.payload)
                assert raw_len == len(raw_of[cid]) and codec == crec.codec
        for b, ext in zip(head["buffers"], extents):
            assert b["base"] in ("full", "delta") and b["layout"] in ("pages", "cdc")
            assert (b["base"] == "full") == (b["depth"] == 0)
            check_extents(ext, b["size"], b["base"] == "full",
                          lambda cid: len(raw_of[cid]) if cid in raw_of else None)
        c = by_id.get(head["id"])
        if c is not None:                       # a live checkpoint: the log agrees with it
            assert (head["stream"], head["seq"], head["created"], head["meta"],
                    head["bytes_new"]) == (c["stream"], c["seq"], c["created"], c["meta"],
                                           c["bytes_new"])
            assert [(b["name"], b["size"]) for b in head["buffers"]] == \
                [(b["name"], b["size"]) for b in c["buffers"]]
    assert commits >= 1


@pytest.mark.parametrize("store", STORES)
def test_delete_and_tag_records(store):
    exp = expected_of(store)
    _, records = load_log(store)
    for r in records:
        if r.rtype == DELETE:
            assert len(r.payload) == 8
            assert struct.unpack("<Q", r.payload)[0] in exp["deleted"]
        elif r.rtype == TAG:
            d = json.loads(r.payload)
            assert set(d) == {"id", "tag", "add"}
            assert isinstance(d["id"], int) and isinstance(d["tag"], str) \
                and isinstance(d["add"], bool)
    if store == "raw_cdc":
        tags = [json.loads(r.payload) for r in records if r.rtype == TAG]
        assert tags == [{"id": 1, "tag": "first", "add": True}]


def replay(records) -> dict:
    """Checkpoint state from the log alone (commit/delete/tag records in order)."""
    ckpts = {}
    for r in records:
        if r.rtype == COMMIT:
            head, _, _ = parse_commit(r.payload)
            ckpts[head["id"]] = head
        elif r.rtype == DELETE:
            (victim,) = struct.unpack("<Q", r.payload)
            gone = ckpts.pop(victim)
            for c in ckpts.values():
                if c["parent"] == victim:
                    c["parent"] = gone["parent"]
        elif r.rtype == TAG:
            d = json.loads(r.payload)
            if d["id"] in ckpts:
                tags = set(ckpts[d["id"]]["tags"])
                tags.add(d["tag"]) if d["add"] else tags.discard(d["tag"])
                ckpts[d["id"]]["tags"] = sorted(tags)
    return ckpts


COMPLETE_LOGS = [s for s in STORES if s != "basic"]


@pytest.mark.parametrize("store", COMPLETE_LOGS)
def test_log_replays_to_the_expected_checkpoints(store):
    exp = expected_of(store)
    segs, records = load_log(store)
    assert sorted(segs) == list(range(1, len(segs) + 1))
    ckpts = replay(records)
    assert sorted(ckpts) == [c["id"] for c in exp["checkpoints"]]
    for c in exp["checkpoints"]:
        head = ckpts[c["id"]]
        assert (head["stream"], head["seq"], head["parent"], head["tags"], head["meta"],
                head["created"]) == (c["stream"], c["seq"], c["parent"], c["tags"], c["meta"],
                                     c["created"])


def test_compacted_log_keeps_index_records_only_in_the_index():
    """v1 compaction copies live chunk records only: the commit, tag and delete records of a
    rewritten segment survive only as their effect in the index (data.mdb is not a cache that
    the log could rebuild). In "basic", segment 3 held the commits of checkpoints 10-13, the
    tags and the deletes of 2 and 9."""
    exp = expected_of("basic")
    segs, records = load_log("basic")
    assert sorted(segs) == [1, 2, 4]
    in_log = {parse_commit(r.payload)[0]["id"] for r in records if r.rtype == COMMIT}
    live = {c["id"] for c in exp["checkpoints"]}
    assert in_log == {1, 2, 3, 4, 5, 6, 7, 8, 9, 14, 15}
    assert live - in_log == {10, 11, 12}
    assert not any(r.rtype in (TAG, DELETE) for r in records)


# ---- the LMDB index ------------------------------------------------------------------------------
@pytest.fixture
def index(request, tmp_path):
    store = request.param
    d = os.path.join(str(tmp_path), "index")
    os.makedirs(d)
    shutil.copy(os.path.join(V1, store, "index", "data.mdb"), d)
    env = lmdb.open(d, readonly=True, lock=False, max_dbs=16, subdir=True)
    try:
        with env.begin() as txn:
            names = {k for k, _ in txn.cursor()}
            dbs = {n: env.open_db(n, txn=txn, create=False) for n in names}
            yield store, {n: dict(txn.cursor(db=dbs[n])) for n in names}
    finally:
        env.close()


def own_restore(dbs: dict, chunks: dict, cid: int) -> dict:
    """Buffers of a checkpoint from the index and the raw chunk bytes, with no snapstore code:
    the nearest full manifest up the parent chain, then each later delta over it."""
    info = json.loads(dbs[b"checkpoints"][struct.pack(">Q", cid)])
    out = {}
    for b in info["buffers"]:
        layers, c = [], info
        while True:
            i = [x["name"] for x in c["buffers"]].index(b["name"])
            entry = c["buffers"][i]
            blob = dbs[b"manifests"][struct.pack(">QI", c["id"], i)]
            layers.append([EXTENT.unpack_from(blob, k) for k in range(0, len(blob), 48)])
            if entry["base"] == "full":
                break
            c = json.loads(dbs[b"checkpoints"][struct.pack(">Q", c["parent"])])
        buf = bytearray(b["size"])
        for layer in reversed(layers):
            for boff, coff, length, chunk in layer:
                buf[boff:boff + length] = chunks[chunk][coff:coff + length]
        out[b["name"]] = bytes(buf)
    return out


def page_fingerprints(data: bytes, page_size: int) -> bytes:
    """XXH3-128 (seed 0) per page (the last one may be short): low64 LE, then high64 LE."""
    return b"".join(xxhash.xxh3_128_intdigest(data[i:i + page_size], seed=0).to_bytes(16, "little")
                    for i in range(0, len(data), page_size))


@pytest.mark.parametrize("index", STORES, indirect=True)
def test_lmdb_databases_and_meta(index):
    store, dbs = index
    exp = expected_of(store)
    assert set(dbs) == INDEX_DBS
    meta = dbs[b"meta"]
    assert set(meta) == {b"applied", b"next_id", b"format"}
    assert len(meta[b"format"]) == 8 and struct.unpack("<Q", meta[b"format"])[0] == 1
    assert len(meta[b"next_id"]) == 8
    assert len(meta[b"applied"]) == 16
    seg, off = struct.unpack("<QQ", meta[b"applied"])
    last = max(exp["segments"])
    size = os.path.getsize(os.path.join(V1, store, "segments", f"{last:016d}.seg"))
    next_id = struct.unpack("<Q", meta[b"next_id"])[0]
    if exp["readonly_ids"] == [c["id"] for c in exp["checkpoints"]]:
        assert (seg, off) == (last, size)                # a clean close: all of it applied
        assert next_id == exp["next_id"]
    else:                                                # "unapplied": the log runs ahead
        assert seg == last and off < size
        assert next_id == max(exp["readonly_ids"]) + 1
        _, records = load_log(store)
        assert any(r.offset == off for r in records)     # applied ends on a record boundary


@pytest.mark.parametrize("index", STORES, indirect=True)
def test_lmdb_checkpoints_manifests_chunks(index):
    store, dbs = index
    exp = expected_of(store)
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    segs, records = load_log(store)
    chunk_at = {(r.segment, r.offset): r for r in records if r.rtype == CHUNK}
    chunks = {}
    for key, value in dbs[b"chunks"].items():
        assert len(key) == 32 and len(value) == 33
        seg, off, stored, raw_len, refs, codec = CHUNK_ENTRY.unpack(value)
        rec = chunk_at[(seg, off)]                        # a chunk record in an existing segment
        cid, raw = parse_chunk(rec)
        assert cid == key and stored == len(rec.payload) and raw_len == len(raw)
        assert codec == rec.codec
        chunks[key] = (raw, refs)
    ids = []
    stale = 0
    refs = {k: 0 for k in chunks}
    for key, value in dbs[b"checkpoints"].items():
        assert len(key) == 8
        (cid,) = struct.unpack(">Q", key)
        ids.append(cid)
        info = json.loads(value)
        assert set(info) == COMMIT_KEYS - {"new_chunks"}
        assert info["id"] == cid
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
            # v1 quirk: "extents" is the count at commit time, but any later rewrite of the
            # info (a tag, a parent's delete, a fold) stores 0. The manifest is authoritative.
            assert b["extents"] in (len(blob) // 48, 0)
            stale += b["extents"] != len(blob) // 48
            ext = [EXTENT.unpack_from(blob, k) for k in range(0, len(blob), 48)]
            check_extents(ext, b["size"], b["base"] == "full", lambda k: len(chunks[k][0]))
            for e in ext:
                refs[e[3]] += 1
    assert ids == exp["readonly_ids"]                     # keys sort numerically (big-endian)
    if store in ("basic", "raw_cdc"):
        assert stale                                      # tagged checkpoints show the quirk
    manifest_keys = {struct.unpack(">QI", k) for k in dbs[b"manifests"]}
    assert all(len(k) == 12 for k in dbs[b"manifests"])
    assert manifest_keys == {(cid, i) for cid in ids
                             for i in range(len(by_id[cid]["buffers"]))}
    assert {k: r for k, (_, r) in chunks.items()} == refs  # reference counts are exact
    for cid in ids:                                        # restoring by hand gives the bytes
        data = own_restore(dbs, {k: raw for k, (raw, _) in chunks.items()}, cid)
        assert {k: hashlib.sha256(v).hexdigest() for k, v in data.items()} == \
            {b["name"]: b["sha256"] for b in by_id[cid]["buffers"]}


@pytest.mark.parametrize("index", STORES, indirect=True)
def test_lmdb_streams_and_links(index):
    store, dbs = index
    exp = expected_of(store)
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    visible = [by_id[i] for i in exp["readonly_ids"]]
    streams = {}
    for key, value in dbs[b"streams"].items():
        d = json.loads(value)
        assert set(d) == {"head", "seq"}
        streams[key.decode()] = d
    assert set(streams) == {c["stream"] for c in visible}
    for name, d in streams.items():
        mine = [c for c in visible if c["stream"] == name]
        assert d["head"] == mine[-1]["id"]
        if visible == exp["checkpoints"]:
            assert d["seq"] == exp["streams"][name]["next_seq"] - 1
    assert all(v == b"" for v in dbs[b"stream_ckpts"].values())
    pairs = set()
    for key in dbs[b"stream_ckpts"]:
        name, _, tail = key.partition(b"\0")
        assert len(tail) == 8
        pairs.add((name.decode(), struct.unpack(">Q", tail)[0]))
    assert pairs == {(c["stream"], c["id"]) for c in visible}
    assert all(v == b"" for v in dbs[b"children"].values())
    links = {struct.unpack(">QQ", k) for k in dbs[b"children"]}
    assert all(len(k) == 16 for k in dbs[b"children"])
    assert links == {(c["parent"], c["id"]) for c in visible if c["parent"] is not None}


@pytest.mark.parametrize("index", STORES, indirect=True)
def test_lmdb_fingerprints(index):
    store, dbs = index
    exp = expected_of(store)
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    chunks = {}
    _, records = load_log(store)
    for r in records:
        if r.rtype == CHUNK:
            cid, raw = parse_chunk(r)
            chunks.setdefault(cid, raw)
    checked = 0
    for key, value in dbs[b"fingerprints"].items():
        stream, _, buffer = key.partition(b"\0")
        cid, page_size, reserved = FP_HEADER.unpack_from(value, 0)
        assert reserved == 0 and page_size == 4096
        digests = value[16:]
        assert len(digests) % 16 == 0
        if cid in exp["readonly_ids"]:
            c = by_id[cid]
            assert c["stream"] == stream.decode()
            data = own_restore(dbs, chunks, cid)[buffer.decode()]
            assert digests == page_fingerprints(data, page_size)
            checked += 1
        else:    # fingerprints of a deleted stream head stay (unused: it is not the head)
            assert cid in exp["deleted"], (store, cid)
    assert checked or store in ("raw_cdc",) or not dbs[b"fingerprints"]


# ---- today's code against the hard-coded layout --------------------------------------------------
def record(rtype: int, payload: bytes, codec: int = 0) -> bytes:
    head16 = b"SREC" + bytes([rtype, codec]) + b"\0\0" + struct.pack("<I", len(payload)) + bytes(4)
    return head16 + struct.pack("<Q", xxhash.xxh3_64_intdigest(head16 + payload, seed=0)) + payload


def test_hand_built_records_are_recovered_by_todays_code(tmp_path):
    """Records written with the layouts above, appended to a golden store's log, are applied
    by today's recovery exactly like the records the store's own version wrote."""
    exp = expected_of("raw_cdc")
    path = os.path.join(str(tmp_path), "raw_cdc")
    shutil.copytree(os.path.join(V1, "raw_cdc"), path,
                    ignore=shutil.ignore_patterns("expected.json"))
    last = max(exp["segments"])
    seg_path = os.path.join(path, "segments", f"{last:016d}.seg")
    _, records = parse_segment(seg_path)
    old_id, old_raw = next(parse_chunk(r) for r in records if r.rtype == CHUNK)
    new_id = exp["next_id"]

    data = b"hand-built record " * 300
    chunk_id = blake3.blake3(data).digest()
    chunk_payload = chunk_id + struct.pack("<I", len(data)) + data
    offset = os.path.getsize(seg_path)
    head = {"id": new_id, "stream": "hand", "parent": None, "created": 1234.5,
            "meta": {"hand": True}, "bytes_new": 0, "tags": [], "seq": 1,
            "buffers": [{"name": "h", "size": len(data) + 100, "base": "full", "depth": 0,
                         "layout": "pages", "page_size": 4096, "extents": 2}],
            "new_chunks": 1}
    js = json.dumps(head).encode()
    commit = (struct.pack("<I", len(js)) + js
              + NEW_CHUNK.pack(chunk_id, last, offset, len(chunk_payload), len(data), 0)
              + EXTENT.pack(0, 0, len(data), chunk_id)
              + EXTENT.pack(len(data), 0, 100, old_id))
    victim = 3                                           # "pages" seq 1; 4 builds on it
    log = (record(CHUNK, chunk_payload) + record(COMMIT, commit)
           + record(TAG, json.dumps({"id": new_id, "tag": "hand", "add": True}).encode())
           + record(TAG, json.dumps({"id": 1, "tag": "first", "add": False}).encode())
           + record(DELETE, struct.pack("<Q", victim)))
    with open(seg_path, "ab") as f:
        f.write(log)

    with snapstore.open(path, readonly=True) as store:   # a reader does not replay
        assert [c.id for c in store.checkpoints()] == [1, 2, 3, 4]
    with snapstore.open(path, durability="none") as store:
        info = store.get(new_id)
        assert (info.stream, info.seq, info.parent, info.created, info.meta, info.tags) == \
            ("hand", 1, None, 1234.5, {"hand": True}, ("hand",))
        assert store.restore(new_id) == {"h": data + old_raw[:100]}
        assert store.get(1).tags == ()
        with pytest.raises(snapstore.errors.CheckpointNotFound):
            store.get(victim)
        by_id = {c["id"]: c for c in exp["checkpoints"]}
        assert store.get(4).parent is None and store.get(4).kind == "full"
        assert hashlib.sha256(store.restore(4)["blob"]).hexdigest() == \
            by_id[4]["buffers"][0]["sha256"]
        report = store.verify(deep=True)
        assert report["ok"], report["problems"][:5]
        nxt = store.checkpoint({"h": b"after"}, stream="hand")
        assert nxt.id == new_id + 1 and nxt.seq == 2 and nxt.parent == new_id
    parse_segment(seg_path)                              # still a clean v1 log to its end


def index_checksum(db: bytes, key: bytes, payload: bytes) -> bytes:
    """Format 2: every LMDB value is its payload followed by this: XXH3-64 (seed 0, u64 LE) of
    the database name, a NUL, the key's length (u32 LE), the key and the payload."""
    return struct.pack("<Q", xxhash.xxh3_64_intdigest(
        db + b"\0" + struct.pack("<I", len(key)) + key + payload, seed=0))


def test_todays_code_writes_format_6(tmp_path):
    """A store made by today's code (one writer: log 0): FORMAT and the segment headers say
    version 6 (format 4 only adds a chunk codec, byte planes, for float buffers, format 5
    delta chunks of float buffers with their DELTA_BASE table and 65-byte index entries, and
    format 6 byte planes of items rotated by up to 7 bits: none here; test_format_layout_v4.py,
    test_format_layout_v5.py and test_format_layout_v6.py decode them); records keep the
    v1 layouts but for their order (format 3: commit JSON "order",
    delete <QQI id + order + records in its batch, tag JSON "order" and "records"), 1, 2, 3...
    in the order the operations claimed it; every LMDB value is its payload followed by its
    checksum (index_checksum): the v1 payloads, META_APPLIED replaced by log 0's entry in the
    logs database, META_NEXT_ORDER; claims and groups empty once the writer closed.
    (test_format_layout_v3.py decodes a store of several writers, groups and compaction.)"""
    path = os.path.join(str(tmp_path), "fresh")
    with snapstore.open(path, durability="none", segment_size=65536) as store:
        a = store.checkpoint({"x": bytes(range(256)) * 64, "y": os.urandom(5000)}, "s", {"m": 1})
        b = store.checkpoint({"x": bytes(range(256)) * 63 + bytes(256), "y": b"z" * 5000}, "s")
        store.tag(a.id, "t")
        store.delete(a.id)
    with open(os.path.join(path, "FORMAT")) as f:
        d = json.load(f)
    assert set(d) == {"format", "version", "created"}
    assert (d["format"], d["version"]) == ("snapstore", 6)
    records = []
    paths = sorted(glob.glob(os.path.join(path, "segments", "*.seg")))
    assert [os.path.basename(p) for p in paths] == \
        [f"{n:016d}.seg" for n in range(1, len(paths) + 1)]          # log 0: 1, 2, 3...
    for p in paths:
        records += parse_segment(p, version=6)[1]
    kinds = [r.rtype for r in records]
    assert kinds.count(COMMIT) == 2 and kinds.count(TAG) == 1 and kinds.count(DELETE) == 1
    assert kinds[-2:] == [TAG, DELETE]
    heads = [parse_commit(r.payload, {"order"})[0] for r in records if r.rtype == COMMIT]
    assert [(h["id"], h["seq"], h["order"]) for h in heads] == [(a.id, 1, 1), (b.id, 2, 2)]
    assert json.loads(records[-2].payload) == \
        {"id": a.id, "tag": "t", "add": True, "order": 3, "records": 1}
    assert len(records[-1].payload) == 20
    assert struct.unpack("<QQI", records[-1].payload) == (a.id, 4, 1)
    for r in records:
        if r.rtype == CHUNK:
            parse_chunk(r)
    env = lmdb.open(os.path.join(path, "index"), readonly=True, lock=False, max_dbs=16)
    try:
        with env.begin() as txn:
            assert {k for k, _ in txn.cursor()} == INDEX_DBS | {b"logs", b"claims", b"groups"}
            payloads = {}
            for name in INDEX_DBS | {b"logs", b"claims", b"groups"}:
                db = env.open_db(name, txn=txn, create=False)
                payloads[name] = {}
                for key, value in txn.cursor(db=db):
                    assert len(value) >= 8, (name, key)
                    assert value[-8:] == index_checksum(name, key, value[:-8]), (name, key)
                    payloads[name][key] = value[:-8]
    finally:
        env.close()
    # the payloads are the v1 values, but for where the log is applied up to
    meta = payloads[b"meta"]
    assert set(meta) == {b"format", b"next_id", b"next_order"}
    assert meta[b"format"] == struct.pack("<Q", 6)
    assert meta[b"next_id"] == struct.pack("<Q", b.id + 1)
    assert meta[b"next_order"] == struct.pack("<Q", 5)
    assert payloads[b"logs"] == {struct.pack(">I", 0): struct.pack(
        "<QQ", len(paths), os.path.getsize(paths[-1]))}
    assert payloads[b"claims"] == {} and payloads[b"groups"] == {}
    assert [struct.unpack(">Q", k)[0] for k in payloads[b"checkpoints"]] == [b.id]
    info = json.loads(payloads[b"checkpoints"][struct.pack(">Q", b.id)])
    assert set(info) == COMMIT_KEYS - {"new_chunks"} and info["parent"] is None
    for i, buf in enumerate(info["buffers"]):
        blob = payloads[b"manifests"][struct.pack(">QI", b.id, i)]
        check_extents([EXTENT.unpack_from(blob, k) for k in range(0, len(blob), 48)],
                      buf["size"], buf["base"] == "full", lambda cid: None)
    assert all(len(v) == 33 for v in payloads[b"chunks"].values())
    # "n": the stream's checkpoints (a deleted, b left); records of earlier builds lack it
    assert json.loads(payloads[b"streams"][b"s"]) == {"head": b.id, "seq": 2, "n": 1}
    assert payloads[b"stream_ckpts"] == {b"s\0" + struct.pack(">Q", b.id): b""}
    assert payloads[b"children"] == {}
    assert {FP_HEADER.unpack_from(v)[0] for v in payloads[b"fingerprints"].values()} == {b.id}
