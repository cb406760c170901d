"""The v3 on-disk layouts, byte by byte, from a store written by today's code (docs/design.md).

Format 3 is not final yet, so there are no golden v3 stores: the store is made here, by the
public API, and decoded with nothing from snapstore.format -- every layout below is written out
by hand, as in test_format_layout.py (v1) and test_format_layout_v2.py (v2), whose hand-written
parsers of the layouts format 3 keeps are used. When format 3 is final its golden stores go to
stores/v3/ and get a file of their own (README.md); these checks are what it will pin.

The store: two writers (two Stores of this process: logs 0 and 1), a group commit of two
participants (one in each log), a delete_many of two checkpoints (one batch), tags, a
compaction that removed a segment after writing a state section, records after the section,
and a third writer process killed after its commit record reached its log (log 2), which the
next writer's recovery publishes.

What format 3 adds, pinned here:
  segment files:   log L's n-th segment is number L * 10^9 + n, file name 16 decimal digits;
                   header <8sIIQQ version 3; record types 1-7.
  commit (2):      the v1 payload; its JSON header adds "order", the store-wide order its
                   claim allocated (unique, increasing in claim order). A group commit's record
                   lists every part's buffers and new chunks; those chunk records lie in the
                   participants' logs.
  delete (3):      <QQI: checkpoint id, order, how many records carry that order (a
                   delete_many is one batch: one order, records = its size).
  tag (4):         JSON {"id", "tag", "add", "order", "records"}.
  state BEGIN (5): JSON {"next_id", "checkpoints", "streams", "order", "next_order", "logs":
                   {"L": [segment, offset]}}: log L's records before that position are covered,
                   later ones and logs it does not name are not. CHECKPOINT (6) and END (7) as
                   in v2 (a CHECKPOINT's JSON has no "order").
  the log alone:   the newest complete section (the highest order), then every index record it
                   does not cover, of all logs, by order (one order's records only all together),
                   gives every checkpoint byte-exact (rebuilt by hand below).
  LMDB index:      every value sealed as in v2 (payload + XXH3-64 of db, NUL, u32 key length,
                   key, payload); meta "applied" gone, "next_order" <Q, "gc_generation" <Q;
                   logs: >I log -> <QQ applied position; claims: >Q order -> <I JSON length,
                   JSON, 32-byte chunk ids it pins; groups: group id + NUL + participant ("" for
                   the group) -> <I JSON length, JSON, blob. Claims and groups are empty once
                   every writer closed.
  unfinished batch: a delete_many whose second record is cut is applied neither by recovery
                   (which cuts the log at its first record, also across a segment rollover) nor
                   by repair (which leaves the log applied up to its first record, so the next
                   writer's recovery cuts it).
"""
from __future__ import annotations

import glob
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys

import lmdb
import pytest
import xxhash

import snapstore

from test_format_layout import (CHUNK, COMMIT, COMMIT_KEYS, BUFFER_KEYS, CHUNK_ENTRY, DELETE,
                                EXTENT, INDEX_DBS, NEW_CHUNK, REC_HEADER, SEG_HEADER, TAG,
                                Record, check_extents, index_checksum, own_restore,
                                page_fingerprints, parse_chunk, parse_commit, record)
from test_format_layout_v2 import restore_by_hand

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---- the v3 layouts, by hand ---------------------------------------------------------------
LOG_SEGMENTS = 10 ** 9                    # log L: segments L * 10^9 + 1, + 2, ...
STATE_BEGIN, STATE_CHECKPOINT, STATE_END = 5, 6, 7
RECORD_TYPES = (CHUNK, COMMIT, DELETE, TAG, STATE_BEGIN, STATE_CHECKPOINT, STATE_END)
DELETE_ORDERED = struct.Struct("<QQI")    # checkpoint id, order, records carrying that order
STATE_END_PAYLOAD = struct.Struct("<QQ")
LOG_POSITION = struct.Struct("<QQ")
STATE_MARK = struct.Struct("<QQQQ")
LOG_KEY = struct.Struct(">I")
CLAIM_KEY = struct.Struct(">Q")
BLOB_HEADER = struct.Struct("<I")
U64 = struct.Struct("<Q")
assert (DELETE_ORDERED.size, LOG_KEY.size, CLAIM_KEY.size, BLOB_HEADER.size) == (20, 4, 8, 4)
V3_DBS = INDEX_DBS | {b"logs", b"claims", b"groups"}
TAG_KEYS = {"id", "tag", "add", "order", "records"}
BEGIN_KEYS = {"next_id", "checkpoints", "streams", "order", "next_order", "logs"}
CLAIM_KEYS = {"kind", "log", "pid", "host", "since"}       # and those of its kind:
CLAIM_KIND_KEYS = {"group": {"stream", "group", "deadline"}, "commit": {"stream", "id", "seq"}}
GROUP_KEYS = {"stream", "parent", "participants", "deadline", "claim"}
PART_KEYS = {"log", "start", "end", "meta", "buffers", "new_chunks", "fps", "pins", "bytes_new"}


# ---- a parser of the v3 log ----------------------------------------------------------------
def parse_segment(path: str) -> list:
    """The records of a version 3 segment, every header and checksum checked, walked to the
    exact end of the file."""
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    assert len(name) == 20 and name.endswith(".seg") and name[:16].isdigit(), name
    magic, version, reserved, number, checksum = SEG_HEADER.unpack_from(data, 0)
    assert magic == b"SNAPSEG\x00" and reserved == 0 and number == int(name[:16])
    assert version == 3, (name, version)
    assert checksum == xxhash.xxh3_64_intdigest(data[:24], seed=0)
    assert 1 <= number % LOG_SEGMENTS
    records, pos = [], 32
    while pos < len(data):
        magic, rtype, codec, flags, length, reserved, checksum = REC_HEADER.unpack_from(data, pos)
        assert magic == b"SREC", (name, pos)
        assert rtype in RECORD_TYPES, (name, pos, rtype)
        assert codec in ((0, 1) if rtype == CHUNK else (0,)), (name, pos, codec)
        assert flags == 0 and reserved == 0, (name, pos)
        payload = data[pos + 24:pos + 24 + length]
        assert len(payload) == length, (name, pos, "record runs past the end")
        assert checksum == xxhash.xxh3_64_intdigest(data[pos:pos + 16] + payload, seed=0)
        records.append(Record(number, pos, rtype, codec, payload))
        pos += 24 + length
    assert pos == len(data), (name, pos)
    return records


def load_logs(path: str) -> dict:
    """{log: its records in log order}."""
    logs: dict = {}
    for p in sorted(glob.glob(os.path.join(path, "segments", "*.seg"))):
        number = int(os.path.basename(p)[:16])
        logs.setdefault(number // LOG_SEGMENTS, []).extend(parse_segment(p))
    return logs


def order_of(r: Record) -> tuple[int, int]:
    """(order, records carrying it) of a commit, delete or tag record."""
    if r.rtype == COMMIT:
        return parse_commit(r.payload, {"order"})[0]["order"], 1
    if r.rtype == DELETE:
        assert len(r.payload) == DELETE_ORDERED.size
        return DELETE_ORDERED.unpack(r.payload)[1:]
    d = json.loads(r.payload)
    assert set(d) == TAG_KEYS
    return d["order"], d["records"]


class Section:
    """A complete state section: where it lies and what it says."""

    def __init__(self, begin: Record) -> None:
        self.first = self.last = begin
        self.head = json.loads(begin.payload.decode("utf-8"))
        self.checkpoints: list = []          # (JSON header, [extents of each buffer])
        self.digest = xxhash.xxh3_64(begin.payload, seed=0)

    def covers(self, log: int, r: Record) -> bool:
        at = self.head["logs"].get(str(log))
        return at is not None and (r.segment, r.offset) < tuple(at)


def find_sections(records: list) -> list:
    """The complete sections of one log: BEGIN, CHECKPOINT..., END back to back (consecutive
    segments), END counting the CHECKPOINTs and matching their XXH3-64."""
    done, open_, prev = [], None, None
    for r in records:
        if open_ is not None and r.segment not in (prev.segment, prev.segment + 1):
            open_ = None
        if r.rtype == STATE_BEGIN:
            open_ = Section(r)
        elif open_ is None:
            pass
        elif r.rtype == STATE_CHECKPOINT:
            head, new_chunks, extents = parse_commit(r.payload)     # no "order" here
            assert head["new_chunks"] == 0 and new_chunks == []
            open_.checkpoints.append((head, extents))
            open_.digest.update(r.payload)
            open_.last = r
        elif r.rtype == STATE_END:
            count, checksum = STATE_END_PAYLOAD.unpack(r.payload)
            open_.last = r
            if count == len(open_.checkpoints) and checksum == open_.digest.intdigest():
                done.append(open_)
            open_ = None
        else:
            open_ = None
        prev = r
    return done


def all_chunks(logs: dict) -> dict:
    out = {}
    for records in logs.values():
        for r in records:
            if r.rtype == CHUNK:
                cid, raw = parse_chunk(r)
                assert out.setdefault(cid, raw) == raw
    return out


def rebuild(logs: dict) -> tuple[dict, dict, int, dict, list]:
    """The checkpoint state from the logs alone, by the rule of format 3: the newest complete
    section (the highest order), then every commit, delete and tag record it does not cover,
    of all logs, by order, an order's records only when all of them are there. Returns
    ({id: JSON header as now}, {stream: [head, seq]}, next id, {id: (header as recorded,
    extents)} of every checkpoint seen, [orders applied])."""
    sections = [s for records in logs.values() for s in find_sections(records)]
    live, streams, recorded, next_id = {}, {}, {}, 1
    newest = max(sections, key=lambda s: s.head["order"]) if sections else None
    if newest is not None:
        next_id = newest.head["next_id"]
        streams = {n: [v["head"], v["seq"]] for n, v in newest.head["streams"].items()}
        for head, extents in newest.checkpoints:
            live[head["id"]] = dict(head)
            recorded[head["id"]] = (head, extents)
    batches: dict = {}
    for log, records in logs.items():
        for r in records:
            if r.rtype in (COMMIT, DELETE, TAG) and not (newest and newest.covers(log, r)):
                order, count = order_of(r)
                batches.setdefault(order, []).append((count, r))
    applied = []
    for order in sorted(batches):
        batch = batches[order]
        if len(batch) != batch[0][0]:
            continue                         # never completed: none of it
        applied.append(order)
        for _, r in batch:
            if r.rtype == COMMIT:
                head, _, extents = parse_commit(r.payload, {"order"})
                live[head["id"]] = dict(head)
                recorded[head["id"]] = (head, extents)
                streams[head["stream"]] = [head["id"], head["seq"]]
                next_id = max(next_id, head["id"] + 1)
            elif r.rtype == DELETE:
                victim = DELETE_ORDERED.unpack(r.payload)[0]
                gone = live.pop(victim)
                for c in live.values():
                    if c["parent"] == victim:
                        c["parent"] = gone["parent"]
                left = [i for i, c in live.items() if c["stream"] == gone["stream"]]
                if left:
                    streams[gone["stream"]][0] = max(left)
                else:
                    del streams[gone["stream"]]
            else:
                d = json.loads(r.payload)
                tags = set(live[d["id"]]["tags"])
                tags.add(d["tag"]) if d["add"] else tags.discard(d["tag"])
                live[d["id"]]["tags"] = sorted(tags)
    return live, streams, next_id, recorded, applied


def index_payloads(index_dir: str, scratch: str) -> dict:
    """{database: {key: payload}} of an index (a copy of its data file, so an index a Store of
    this process has open can be read too), every value's checksum checked and stripped."""
    os.makedirs(scratch)
    shutil.copy(os.path.join(index_dir, "data.mdb"), scratch)
    env = lmdb.open(scratch, readonly=True, lock=False, max_dbs=16, subdir=True)
    try:
        with env.begin() as txn:
            names = {k for k, _ in txn.cursor()}
            assert names == V3_DBS
            out = {}
            for name in names:
                out[name] = {}
                for key, value in txn.cursor(db=env.open_db(name, txn=txn, create=False)):
                    assert len(value) >= 8, (name, key)
                    assert value[-8:] == index_checksum(name, key, value[:-8]), (name, key)
                    out[name][key] = value[:-8]
    finally:
        env.close()
    shutil.rmtree(scratch)
    return out


def blob(payload: bytes) -> tuple[dict, bytes]:
    """(JSON, the bytes after it) of a claims or groups payload: <I length, JSON, blob."""
    (n,) = BLOB_HEADER.unpack_from(payload)
    return json.loads(payload[4:4 + n]), payload[4 + n:]


# ---- the store ------------------------------------------------------------------------------
def data(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


# Made by a third writer process (log 2): a checkpoint of stream "k" whose only chunk is a2's
# (so its claim pins that chunk), killed once its commit record is in its log.
KILLED_COMMIT = r"""
import sys
import snapstore
with snapstore.open(sys.argv[1], durability="none", segment_size=65536) as s:
    s.checkpoint({"x": bytes.fromhex(sys.argv[2])}, "k")
"""

# The operations and the orders their claims took, in claim order (the group's own claim,
# 5, and the state section's, 9, have no index record).
ORDERS = {"a0": 1, "a1": 2, "b1": 3, "a2": 4, "group": 5, "g": 6, "delete_many": 7, "tag": 8,
          "section": 9, "b3": 10, "tag after": 11, "k": 12}
IDS = {"a0": 1, "a1": 2, "b1": 3, "a2": 4, "g": 5, "b3": 6, "k": 7}


class Made:
    """The store and what was seen while it was made."""


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("v3"))
    path = os.path.join(root, "store")
    m = Made()
    m.path = path
    m.data = {"a0": data(1, 700), "a1": data(2, 40000), "b1": data(3, 30000),
              "a2": data(4, 40000), "w0": data(5, 9000), "w1": data(6, 9000),
              "b3": data(7, 3000)}
    opts = dict(durability="none", segment_size=65536)
    a = snapstore.open(path, **opts)
    b = snapstore.open(path, **opts)
    try:
        a.checkpoint({"s": m.data["a0"]}, "keep")
        a.checkpoint({"x": m.data["a1"]}, "a")
        b.checkpoint({"y": m.data["b1"]}, "b", {"by": "B"})
        a.checkpoint({"x": m.data["a2"]}, "a")
        g = a.group("g", ["p0", "p1"])
        a.stage(g.id, "p0", {"w0": m.data["w0"]}, {"p": 0})
        b.stage(g.id, "p1", {"w1": m.data["w1"]}, {"p": 1})
        m.group_id = g.id
        m.during_group = index_payloads(os.path.join(path, "index"),
                                        os.path.join(root, "during-group"))
        g.commit({"c": 1})
        b.delete_many([IDS["a1"], IDS["b1"]])
        a.tag(IDS["a2"], "t")
        m.compaction = a.compact()
        b.checkpoint({"y": m.data["b3"]}, "b")
        a.tag(IDS["g"], "after")
        env = dict(os.environ, SNAPSTORE_CRASH_AT="after_commit_append",
                   PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, "-c", KILLED_COMMIT, path, m.data["a2"].hex()],
                           env=env, capture_output=True, text=True, timeout=120)
        assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)
        m.with_claim = index_payloads(os.path.join(path, "index"),
                                      os.path.join(root, "with-claim"))
    finally:
        a.close()
        b.close()
    snapstore.open(path, **opts).close()          # recovers log 2 (its writer is gone)
    m.index = index_payloads(os.path.join(path, "index"), os.path.join(root, "closed"))
    m.logs = load_logs(path)
    with snapstore.open(path, readonly=True) as s:
        m.infos = {c.id: c for c in s.checkpoints()}
        m.restored = {c: s.restore(c) for c in m.infos}
        m.streams = {name: s.latest(name).id for name in s.streams()}
    return m


def chunk_records(logs: dict) -> dict:
    """{(segment, offset): (chunk id, raw bytes, record)} of every chunk record."""
    return {(r.segment, r.offset): parse_chunk(r) + (r,)
            for records in logs.values() for r in records if r.rtype == CHUNK}


def u64(payload: bytes) -> int:
    assert len(payload) == 8
    return U64.unpack(payload)[0]


def seg_size(path: str, number: int) -> int:
    return os.path.getsize(os.path.join(path, "segments", f"{number:016d}.seg"))


# ---- the log ----------------------------------------------------------------------------------
def test_segment_files_per_log(made):
    """Log L's segments are L * 10^9 + 1, 2, ...: log 0 (the first writer) lost its first
    segment to compaction, log 1 (the second) and log 2 (the killed process) have one each."""
    assert sorted(os.listdir(os.path.join(made.path, "segments"))) == \
        ["0000000000000002.seg", "0000001000000001.seg", "0000002000000001.seg"]
    assert sorted(made.logs) == [0, 1, 2]
    for log, records in made.logs.items():
        assert {r.segment // LOG_SEGMENTS for r in records} == {log}
    assert made.compaction["segments_removed"] == 1
    assert sorted(os.listdir(os.path.join(made.path, "writers"))) == ["0", "1", "2"]


def test_index_records_carry_their_order(made):
    """Every commit, delete and tag record names the order its claim took: unique per
    operation, increasing in the order the operations claimed; ids and seqs as claimed."""
    found = {}
    for log, records in made.logs.items():
        orders = [order_of(r)[0] for r in records if r.rtype in (COMMIT, DELETE, TAG)]
        assert orders == sorted(orders), log       # one writer's operations, in its log
        for r in records:
            if r.rtype == COMMIT:
                head, _, _ = parse_commit(r.payload, {"order"})
                assert isinstance(head["order"], int)
                found[head["order"]] = (log, "commit", head["id"], head["stream"], head["seq"])
            elif r.rtype == DELETE:
                found.setdefault(order_of(r)[0], (log, "delete"))
            elif r.rtype == TAG:
                found[order_of(r)[0]] = (log, "tag", json.loads(r.payload)["id"])
    # the records of orders 1 and 2 (a0, a1) were in the segment compaction removed; 5 (the
    # group's claim) and 9 (the state section's) have no index record
    assert found == {
        ORDERS["b1"]: (1, "commit", IDS["b1"], "b", 1),
        ORDERS["a2"]: (0, "commit", IDS["a2"], "a", 2),
        ORDERS["g"]: (0, "commit", IDS["g"], "g", 1),
        ORDERS["delete_many"]: (1, "delete"),
        ORDERS["tag"]: (0, "tag", IDS["a2"]),
        ORDERS["b3"]: (1, "commit", IDS["b3"], "b", 1),    # stream b was empty: seq 1 again
        ORDERS["tag after"]: (0, "tag", IDS["g"]),
        ORDERS["k"]: (2, "commit", IDS["k"], "k", 1),
    }
    assert list(ORDERS.values()) == list(range(1, len(ORDERS) + 1))


def test_commit_records_and_their_chunks(made):
    """A commit's new-chunk table names chunk records in any log (a group commit's, those of
    its participants' logs); a commit that reuses chunks names none."""
    chunks = chunk_records(made.logs)
    heads = {}
    for records in made.logs.values():
        for r in records:
            if r.rtype != COMMIT:
                continue
            head, new_chunks, extents = parse_commit(r.payload, {"order"})
            heads[head["id"]] = (head, new_chunks, extents, r)
            for b in head["buffers"]:
                assert set(b) == BUFFER_KEYS
            for cid, seg, off, stored, raw_len, codec in new_chunks:
                got, raw, crec = chunks[(seg, off)]
                assert got == cid and stored == len(crec.payload) and raw_len == len(raw)
                assert codec == crec.codec
            for b, ext in zip(head["buffers"], extents):
                check_extents(ext, b["size"], b["base"] == "full", lambda c: None)
    head, new_chunks, extents, r = heads[IDS["g"]]
    assert r.segment // LOG_SEGMENTS == 0                       # the coordinator's log
    assert [b["name"] for b in head["buffers"]] == ["w0", "w1"]
    assert head["meta"] == {"c": 1, "snapstore.group": {
        "id": made.group_id, "parts": {"p0": {"p": 0}, "p1": {"p": 1}}}}
    assert [seg // LOG_SEGMENTS for _, seg, *_ in new_chunks] == [0, 1]     # p0's, p1's log
    for (cid, seg, off, *_), ext, name in zip(new_chunks, extents, ("w0", "w1")):
        assert chunks[(seg, off)][1] == made.data[name] and [e[3] for e in ext] == [cid]
    head, new_chunks, extents, r = heads[IDS["k"]]             # all of it a2's chunk
    assert new_chunks == [] and [e[3] for e in extents[0]] == \
        [chunks[(2, 32)][0]] and chunks[(2, 32)][1] == made.data["a2"]


def test_delete_batch_layout(made):
    """delete_many([a1, b1]): two delete records back to back in its writer's log, one order,
    each saying the batch has 2 records."""
    deletes = [r for r in made.logs[1] if r.rtype == DELETE]
    assert len(deletes) == 2 and deletes[1].offset == deletes[0].end
    order = ORDERS["delete_many"]
    assert [r.payload for r in deletes] == [struct.pack("<QQI", IDS["a1"], order, 2),
                                            struct.pack("<QQI", IDS["b1"], order, 2)]
    assert not any(r.rtype == DELETE for log in (0, 2) for r in made.logs[log])


def test_tag_records(made):
    assert [json.loads(r.payload) for r in made.logs[0] if r.rtype == TAG] == [
        {"id": IDS["a2"], "tag": "t", "add": True, "order": ORDERS["tag"], "records": 1},
        {"id": IDS["g"], "tag": "after", "add": True, "order": ORDERS["tag after"],
         "records": 1}]


def test_state_section(made):
    """Compaction's section: its order (allocated before its snapshot), the next order, and
    how far it covers each log: log 0 up to itself, log 1 up to the end of the delete batch;
    checkpoint a0 survives in it alone (its commit record was in the removed segment)."""
    assert not find_sections(made.logs[1]) and not find_sections(made.logs[2])
    (s,) = find_sections(made.logs[0])
    deletes = [r for r in made.logs[1] if r.rtype == DELETE]
    assert set(s.head) == BEGIN_KEYS
    assert s.head == {
        "next_id": IDS["b3"], "checkpoints": 3,
        "streams": {"a": {"head": IDS["a2"], "seq": 2}, "g": {"head": IDS["g"], "seq": 1},
                    "keep": {"head": IDS["a0"], "seq": 1}},
        "order": ORDERS["section"], "next_order": ORDERS["section"] + 1,
        "logs": {"0": [s.first.segment, s.first.offset], "1": [deletes[1].segment,
                                                               deletes[1].end]}}
    assert [h["id"] for h, _ in s.checkpoints] == [IDS["a0"], IDS["a2"], IDS["g"]]
    for head, extents in s.checkpoints:
        assert set(head) == COMMIT_KEYS                 # no "order": the section has one
    assert (s.first.segment, s.last.segment) == (2, 2)
    count, checksum = STATE_END_PAYLOAD.unpack(s.last.payload)
    assert count == 3 and checksum == xxhash.xxh3_64_intdigest(
        s.first.payload + b"".join(r.payload for r in made.logs[0]
                                   if r.rtype == STATE_CHECKPOINT), seed=0)
    in_commits = {parse_commit(r.payload, {"order"})[0]["id"]
                  for records in made.logs.values() for r in records if r.rtype == COMMIT}
    assert IDS["a0"] not in in_commits
    assert STATE_MARK.unpack(made.index[b"meta"][b"log_state"]) == \
        (s.first.segment, s.first.offset, s.last.segment, s.last.end)


def test_log_alone_gives_every_checkpoint(made):
    """By hand: the newest section, then the records of all logs it does not cover, by order,
    give every checkpoint as the store holds it (ids, streams, seqs, parents, tags, meta,
    creation, buffers and their bytes), every stream head and the next id."""
    live, streams, next_id, recorded, applied = rebuild(made.logs)
    assert applied == [ORDERS["b3"], ORDERS["tag after"], ORDERS["k"]]
    assert sorted(live) == sorted(made.infos) == sorted(IDS[k] for k in ("a0", "a2", "g", "b3",
                                                                          "k"))
    chunks = all_chunks(made.logs)
    for cid, info in made.infos.items():
        h = live[cid]
        stored = json.loads(made.index[b"checkpoints"][struct.pack(">Q", cid)])
        assert (h["stream"], h["seq"], h["parent"], h["meta"], h["created"], h["bytes_new"]) \
            == (stored["stream"], stored["seq"], stored["parent"], stored["meta"],
                stored["created"], stored["bytes_new"]) \
            == (info.stream, info.seq, info.parent, stored["meta"], info.created,
                info.bytes_new)
        assert sorted(h["tags"]) == sorted(info.tags)
        assert [(b["name"], b["size"]) for b in h["buffers"]] == list(info.sizes.items())
        assert restore_by_hand(recorded, chunks, cid) == made.restored[cid]
    assert {n: v[0] for n, v in streams.items()} == made.streams
    assert streams["b"][1] == 1 and streams["a"][1] == 2
    assert next_id == u64(made.index[b"meta"][b"next_id"]) == IDS["k"] + 1


# ---- the LMDB index ----------------------------------------------------------------------------
def test_lmdb_after_every_writer_closed(made):
    """Every value sealed (index_payloads checks them); meta: no "applied", the next order and
    the GC generation; logs: where each log is applied (its end: all of it published);
    claims and groups empty; the rest as in v2, restorable by hand from index and log."""
    dbs = made.index
    meta = dbs[b"meta"]
    assert set(meta) == {b"format", b"next_id", b"next_order", b"gc_generation", b"log_state"}
    assert u64(meta[b"format"]) == 3
    assert u64(meta[b"next_order"]) == ORDERS["k"] + 1
    assert u64(meta[b"gc_generation"]) == 1               # the one compaction's collection
    assert {LOG_KEY.unpack(k)[0]: LOG_POSITION.unpack(v) for k, v in dbs[b"logs"].items()} \
        == {log: (records[-1].segment, records[-1].end) for log, records in made.logs.items()}
    for log, records in made.logs.items():
        assert records[-1].end == seg_size(made.path, records[-1].segment)
    assert dbs[b"claims"] == {} and dbs[b"groups"] == {}
    chunk_at = chunk_records(made.logs)
    chunks, refs = {}, {}
    for key, value in dbs[b"chunks"].items():
        seg, off, stored, raw_len, count, codec = CHUNK_ENTRY.unpack(value)
        cid, raw, rec = chunk_at[(seg, off)]
        assert cid == key and stored == len(rec.payload) and raw_len == len(raw)
        chunks[key], refs[key] = raw, count
    counted = dict.fromkeys(chunks, 0)
    for packed in dbs[b"manifests"].values():
        for k in range(0, len(packed), 48):
            counted[EXTENT.unpack_from(packed, k)[3]] += 1
    assert counted == refs
    assert sorted(struct.unpack(">Q", k)[0] for k in dbs[b"checkpoints"]) == sorted(made.infos)
    for cid in made.infos:
        assert own_restore(dbs, chunks, cid) == made.restored[cid]


def test_lmdb_group_in_progress(made):
    """While the group was open, both parts staged: the group's claim (order 5, kind group),
    its header and each participant's part in the groups database, and the participants'
    logs applied past their parts."""
    dbs = made.during_group
    gid = made.group_id.encode()
    ((key, value),) = dbs[b"claims"].items()
    claim, pins = blob(value)
    assert CLAIM_KEY.unpack(key) == (ORDERS["group"],) and pins == b""
    assert set(claim) == CLAIM_KEYS | CLAIM_KIND_KEYS["group"]
    assert (claim["kind"], claim["log"], claim["pid"], claim["host"], claim["stream"],
            claim["group"]) == ("group", 0, os.getpid(), os.uname().nodename, "g",
                                made.group_id)
    assert set(dbs[b"groups"]) == {gid + b"\0", gid + b"\0p0", gid + b"\0p1"}
    header, rest = blob(dbs[b"groups"][gid + b"\0"])
    assert rest == b"" and set(header) == GROUP_KEYS
    assert (header["stream"], header["parent"], header["participants"], header["claim"]) == \
        ("g", None, ["p0", "p1"], ORDERS["group"])
    assert header["deadline"] > claim["since"]
    chunks = chunk_records(made.logs)
    ends = {}
    for participant, log, name in (("p0", 0, "w0"), ("p1", 1, "w1")):
        part, rest = blob(dbs[b"groups"][gid + b"\0" + participant.encode()])
        assert set(part) == PART_KEYS
        assert (part["log"], part["meta"], part["new_chunks"]) == (log, {"p": int(name[1])}, 1)
        start, end = tuple(part["start"]), tuple(part["end"])
        assert start[0] // LOG_SEGMENTS == log and start < end
        ends[log] = end
        # the blob: new-chunk table, the buffers' extents, the page fingerprints, the pins
        cid, seg, off, stored, raw_len, codec = NEW_CHUNK.unpack_from(rest, 0)
        assert start <= (seg, off) < end and chunks[(seg, off)][:2] == (cid, made.data[name])
        (b,) = part["buffers"]
        assert (b["name"], b["size"], b["base"], b["depth"], b["extents"]) == \
            (name, 9000, "full", 0, 1)
        assert EXTENT.unpack_from(rest, 57) == (0, 0, 9000, cid)
        assert part["fps"] == [[name, 4096, 48]]
        assert rest[57 + 48:57 + 48 + 48] == page_fingerprints(made.data[name], 4096)
        assert part["pins"] == [57 + 48 + 48, 0] and len(rest) == 57 + 48 + 48
    assert {LOG_KEY.unpack(k)[0]: LOG_POSITION.unpack(v) for k, v in dbs[b"logs"].items()} \
        == ends
    assert u64(dbs[b"meta"][b"next_order"]) == ORDERS["group"] + 1
    assert u64(dbs[b"meta"][b"next_id"]) == IDS["g"]      # a group takes its id when it commits


def test_lmdb_claim_of_a_killed_writer(made):
    """The third writer died after its commit record reached its log (log 2): its claim (order
    12, the id and seq it took, the chunk it reuses pinned) stayed in the index, its log had
    no applied position yet; the next writer's recovery published the record and dropped the
    claim (test_lmdb_after_every_writer_closed)."""
    dbs = made.with_claim
    ((key, value),) = dbs[b"claims"].items()
    claim, pins = blob(value)
    assert CLAIM_KEY.unpack(key) == (ORDERS["k"],)
    assert set(claim) == CLAIM_KEYS | CLAIM_KIND_KEYS["commit"]
    assert (claim["kind"], claim["log"], claim["stream"], claim["id"], claim["seq"]) == \
        ("commit", 2, "k", IDS["k"], 1)
    assert claim["pid"] != os.getpid() and claim["host"] == os.uname().nodename
    a2_chunk = chunk_records(made.logs)[(2, 32)][0]
    assert pins == a2_chunk
    assert sorted(LOG_KEY.unpack(k)[0] for k in dbs[b"logs"]) == [0, 1]
    assert struct.pack(">Q", IDS["k"]) not in dbs[b"checkpoints"]
    assert u64(dbs[b"meta"][b"next_id"]) == IDS["k"] + 1
    assert u64(dbs[b"meta"][b"next_order"]) == ORDERS["k"] + 1
    (r,) = made.logs[2]
    assert (r.segment, r.offset, r.rtype) == (2 * LOG_SEGMENTS + 1, 32, COMMIT)


# ---- an unfinished batch ------------------------------------------------------------------------
KILLED_DELETE = r"""
import sys
import snapstore
with snapstore.open(sys.argv[1], durability="none", segment_size=65536) as s:
    s.delete_many([1, 2])
"""


def segment_header(number: int) -> bytes:
    head = struct.pack("<8sIIQ", b"SNAPSEG\x00", 3, 0, number)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head, seed=0))


def batch_store(root: str, how: str) -> tuple[str, tuple[int, int], int]:
    """A store of checkpoints 1, 2, 3 (stream "s") whose log ends in delete_many([1, 2]) not
    yet applied. how: "cut" (its writer killed after appending the batch, then the second
    record cut short: the batch never completed), "cut across a rollover" (written by hand:
    the first record ends segment 1, the rest of the second is cut off at the start of
    segment 2, a segment of its own), "whole across a rollover" (the same, both records
    complete: the batch did complete). Returns (path, log position of the batch's first
    record, the segments the log had before the batch)."""
    path = os.path.join(root, how.replace(" ", "-"))
    with snapstore.open(path, durability="none", segment_size=65536) as s:
        for i in range(3):
            s.checkpoint({"x": data(10 + i, 5000)}, "s")
    seg1 = os.path.join(path, "segments", "0000000000000001.seg")
    size = os.path.getsize(seg1)
    if how == "cut":
        env = dict(os.environ, SNAPSTORE_CRASH_AT="after_commit_append",
                   PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        p = subprocess.run([sys.executable, "-c", KILLED_DELETE, path], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)
        first, second = parse_segment(seg1)[-2:]
        assert (first.offset, second.offset) == (size, first.end)
        (order, _), (order2, count) = order_of(first), order_of(second)
        assert order == order2 == 4 and count == 2        # after the three commits' orders
        os.truncate(seg1, second.end - 5)
        return path, (1, size), 1
    order = 4
    first = record(DELETE, DELETE_ORDERED.pack(1, order, 2))
    second = record(DELETE, DELETE_ORDERED.pack(2, order, 2))
    with open(seg1, "ab") as f:
        f.write(first)
    with open(os.path.join(path, "segments", "0000000000000002.seg"), "wb") as f:
        f.write(segment_header(2) + (second if how.startswith("whole") else second[:30]))
    return path, (1, size), 1


def log_tail(path: str, at: tuple[int, int]) -> list:
    """(type, payload) of the records log 0 holds from `at` on."""
    return [(r.rtype, r.payload) for r in load_logs(path)[0] if (r.segment, r.offset) >= at]


def ids(path: str) -> list:
    with snapstore.open(path, readonly=True) as s:
        return [c.id for c in s.checkpoints()]


@pytest.mark.parametrize("how", ["cut", "cut across a rollover", "whole across a rollover"])
def test_unfinished_batch_is_never_applied(tmp_path, how):
    """Recovery applies a batch only whole: an unfinished one is cut off at its first record
    (also when it began in an earlier segment: the later one goes); repair applies none of
    it and leaves its log applied up to its first record, so the next writer's recovery cuts
    it off and a second repair finds a clean log. A complete batch across a rollover is
    applied by both."""
    path, at, segments = batch_store(str(tmp_path), how)
    whole = how.startswith("whole")
    want = [3] if whole else [1, 2, 3]
    assert ids(path) == [1, 2, 3]                      # readers never recover
    repaired = path + "-repaired"
    shutil.copytree(path, repaired)
    # recovery, by the next writer
    with snapstore.open(path, durability="none") as s:
        assert [c.id for c in s.checkpoints()] == want
        assert s.verify(deep=True)["ok"]
    if whole:
        assert [t for t, _ in log_tail(path, at)] == [DELETE, DELETE]
    else:
        assert log_tail(path, at) == []
        assert len(glob.glob(os.path.join(path, "segments", "*.seg"))) == segments
        assert seg_size(path, at[0]) == at[1]          # cut exactly at its first record
    index = index_payloads(os.path.join(path, "index"), os.path.join(str(tmp_path), "i1"))
    assert index[b"claims"] == {}
    # repair, with the index gone
    shutil.rmtree(os.path.join(repaired, "index"))
    report = snapstore.repair(repaired)
    assert {p["kind"] for p in report["problems"]} <= (set() if whole else {"incomplete_batch"})
    assert ids(repaired) == want
    index = index_payloads(os.path.join(repaired, "index"), os.path.join(str(tmp_path), "i2"))
    applied = LOG_POSITION.unpack(index[b"logs"][LOG_KEY.pack(0)])
    if not whole:
        assert applied == at                            # not past the unfinished batch
    with snapstore.open(repaired, durability="none") as s:
        info = s.checkpoint({"x": b"after"}, "s")
    if not whole:                                       # the batch is gone from the log
        assert [t for t, _ in log_tail(repaired, at)] == [CHUNK, COMMIT]
    report = snapstore.repair(repaired)
    assert report["ok"] and report["problems"] == []
    assert ids(repaired) == want + [info.id]
