"""The v3 on-disk layouts, byte by byte (docs/design.md): from the golden stores of format 3
(stores/v3, made by the version that made format 3 final: README.md; every file pinned by
SHA-256, at the end of this file) and from a store written here by today's code. Nothing
comes from snapstore.format: every layout below is written out by hand, as in
test_format_layout.py (v1) and test_format_layout_v2.py (v2), whose hand-written parsers of the
layouts format 3 keeps are used.

The golden stores: the v1/v2 recipes as format 3 writes them (basic, raw_cdc, objects, torch,
unapplied, compacted, upgraded: format 1 segments, then the upgrade's state section without
order), "writers" (three writers, one a process; a compaction by it removing segments of
the others' logs), "group" (group commits) and "interrupted" (writers killed: a claimed
commit record past applied, an unnoted section, a dead coordinator's group, a torn batch).
Each is decoded whole: segments to their end, orders, sections, the logs alone rebuilt to
every checkpoint, every index value, the claims and groups the killed writers left.

The store made here (it also shows what no golden store holds: a group in progress whose
coordinator lives, read while it is open): two writers (two Stores of this process: logs 0
and 1), a group commit of two participants (one in each log), a delete_many of two
checkpoints (one batch), tags, a compaction that removed a segment after writing a state
section, records after the section, and a third writer process killed after its commit
record reached its log (log 2), which the next writer's recovery publishes.

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
import hashlib
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

from golden_values import files_sha256

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
# Today's code writes format 6, which keeps every layout of format 3 and only adds chunk codecs
# for buffers of floats (2, byte planes, in segments of header version 4 on:
# test_format_layout_v4.py; 3, delta planes against a base chunk, in segments of version 5 on,
# with the commit's DELTA_BASE table and their 65-byte index entries: test_format_layout_v5.py;
# byte planes of items rotated by more than one bit, in segments of version 6 on:
# test_format_layout_v6.py); the stores this file makes with today's code hold no float
# buffers and are read with the v3 layouts below.
TODAY = 6
CHUNK_CODECS = {3: (0, 1), 4: (0, 1, 2), 5: (0, 1, 2, 3), 6: (0, 1, 2, 3)}   # version -> codecs


def parse_segment(path: str, version: int = TODAY) -> list:
    """The records of a segment of header `version` (3, or 4 that keeps its layouts), every
    header and checksum checked, walked to the exact end of the file."""
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    assert len(name) == 20 and name.endswith(".seg") and name[:16].isdigit(), name
    magic, found, reserved, number, checksum = SEG_HEADER.unpack_from(data, 0)
    assert magic == b"SNAPSEG\x00" and reserved == 0 and number == int(name[:16])
    assert found == version, (name, found)
    assert checksum == xxhash.xxh3_64_intdigest(data[:24], seed=0)
    assert 1 <= number % LOG_SEGMENTS
    records, pos = [], 32
    while pos < len(data):
        magic, rtype, codec, flags, length, reserved, checksum = REC_HEADER.unpack_from(data, pos)
        assert magic == b"SREC", (name, pos)
        assert rtype in RECORD_TYPES, (name, pos, rtype)
        assert codec in (CHUNK_CODECS[version] if rtype == CHUNK else (0,)), (name, pos, codec)
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
    # one lock file per log, and the lock openers choose their logs under (not a log)
    assert sorted(os.listdir(os.path.join(made.path, "writers"))) == \
        [".choosing", "0", "1", "2"]


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
    assert u64(meta[b"format"]) == TODAY
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


def segment_header(number: int, version: int = TODAY) -> bytes:
    head = struct.pack("<8sIIQ", b"SNAPSEG\x00", version, 0, number)
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


# ==== the golden stores of format 3 (stores/v3) ===================================================
# Made by the version that made format 3 final (README.md) and never rewritten: every file is
# pinned by SHA-256, and decoded here with the same hand-written parsers.
HERE = os.path.dirname(os.path.abspath(__file__))
V1 = os.path.join(HERE, "stores", "v1")
V3 = os.path.join(HERE, "stores", "v3")
GOLDEN = sorted(os.path.basename(os.path.dirname(p))
                for p in glob.glob(os.path.join(V3, "*", "FORMAT")))

# The golden files, as the version that made format 3 final wrote them (never regenerate).
GOLDEN_SHA256 = {
    "basic/FORMAT": "d91e51e6b05c789c05ffeecada5e25869d84312fb3132db07f3da20edd64d650",
    "basic/expected.json": "2ab27faa8a74ce9f09b4fe9c07c90804a25e7073739c487eb9c941281ae665a6",
    "basic/index/data.mdb": "fac5e4872b03e1686e192d7b6217bb0c18f7aa9aa69f7b71c3979f756b183a6c",
    "basic/segments/0000000000000001.seg":
        "6cda0314d01930c115350a3573eb3aee30fce6245fea5388f5222a758950ef7a",
    "basic/segments/0000000000000002.seg":
        "9a031c8a9e9f0d9ff7b3a29b0f12b5f0de6874dbbc1a6ab96bc77ebb7db72b38",
    "basic/segments/0000000000000004.seg":
        "8de8713eb90857e03c15208a4669b902d1ec656e77cbea923eebeff1e8e35090",
    "compacted/FORMAT": "69194ba06f03ccda362608d31bb95240ecc6bf19c2c956567ba7585deee249ba",
    "compacted/expected.json": "26337228574c76811e7bc3fe42aeb2410dfdfe58004d0a05feda112b12351172",
    "compacted/index/data.mdb": "7c8e4a2cb1a6564969ac91fb5c49ab775832637754e31bff84525f9e0756c1bb",
    "compacted/segments/0000000000000003.seg":
        "3bb244387548ecc8277afc5e16c7b54160b3a62f43e531be1dff299c9331e202",
    "compacted/segments/0000000000000005.seg":
        "fd4a52d42e51bf8e595a5605b13da6d4fbdb320b34ae9a99c6166052af7c74d8",
    "compacted/segments/0000000000000006.seg":
        "fd3e0f09b8fd739cb2ff3846757cda0e71973411c22875ca6f0eaa4867b1ba99",
    "group/FORMAT": "30d0641a53aff58d1fe093f280b86783ee3256c65ad19ec890959bc38aef8760",
    "group/expected.json": "08eabad9d93f6679e0bfd2e62b3e8883670587f4d4f97b5575e03aa773c12f88",
    "group/index/data.mdb": "4f8e3a6a74a8034d2f3e18d67599b743f4f2d176f7e37e3bfad7d0c052338507",
    "group/segments/0000000000000001.seg":
        "428cb2dd2867ac188ce12eab3be3b0323ce7d5aa51fa6a3ad4200fd1937bf1a5",
    "group/segments/0000001000000001.seg":
        "5364640b2bad8d66f0a5fc7adc4508144a287455dfce52e14ae4cb032d892530",
    "group/segments/0000002000000001.seg":
        "1e0c97a84ca1720cb141f33c465c5190d1fb3197819c1a1adb7e0e6684f7ac8d",
    "interrupted/FORMAT": "b7bda9d0df7efcb6c66e2bd637dbe126a72523dc7274eac9af3b3c5d5466db0c",
    "interrupted/expected.json": "320657fc18f2b583ca63dae195e850ddaefe1b5bcd97589608b59f671225b6ad",
    "interrupted/index/data.mdb":
        "a034b5a20809735b1f9ee14e7744b9d150bbe3fea579f94cf375cb7fa680cf3b",
    "interrupted/segments/0000000000000001.seg":
        "9f56cbd7f6ddb4c1494aba853d269756929e0df7b524415247fbf6d3060aa771",
    "interrupted/segments/0000000000000002.seg":
        "ecd0372de2be5d97fe154b146d132e4dac7794fb55a77d7d45b281cb4a19c7a6",
    "interrupted/segments/0000001000000001.seg":
        "dde1351f486a92a1e4142cb9e3e61c15b996b995130729ca6d889daf36d442f7",
    "interrupted/segments/0000002000000001.seg":
        "d8389012db96a19b7250982049d7855cb2f9cf263602626b8af225b9d31c850e",
    "interrupted/segments/0000003000000001.seg":
        "8e7d80dc45801a757b30666f690b81fc84b771ab334bd5d43a72161c005b034c",
    "objects/FORMAT": "3d800929eb7e7cec15072c01542c564c3d7af7ee05d803a849dc57dc9ede40d4",
    "objects/expected.json": "c0c4c759f05af840971bfc78133acfbc2aee877928cf754845b144fb1825084e",
    "objects/index/data.mdb": "a31edcd59a7d3c897951d108dee3cf5e89af105093d4ed2b8c60cd5c86d05f1e",
    "objects/segments/0000000000000001.seg":
        "bc0f53a8307e952a886956df246d78c890d2aecc093be2f0d7c7f2af4c401649",
    "objects/segments/0000000000000002.seg":
        "8537407d007a7ae3d3c2781f88c89cf77bbee780e8eddb4bf4e94cb71d8aa286",
    "raw_cdc/FORMAT": "bf6e7ce3dfa633459810ae62ac28628dabd637337b8f4f377004f5802caff39b",
    "raw_cdc/expected.json": "0a5009c0744a3fc2270c00038ea9817fe9ea652cb369bcf4358dd5f130cabb4f",
    "raw_cdc/index/data.mdb": "fe06197256128cc87ba93c5b2f11af585ea09dfd6bf4cd7c8ee66f821619b087",
    "raw_cdc/segments/0000000000000001.seg":
        "759c87de4de358f91f5b2d1a896bb45063eccea9a89445650331feb1b924bea1",
    "raw_cdc/segments/0000000000000002.seg":
        "b0798f212d465b63b6727472e02e1ae0a864884d61d0b875b6864e03652f2e79",
    "raw_cdc/segments/0000000000000003.seg":
        "ed8ea4addf6adf8a58f0b5d5b5c1c49792a73db69204c8aeeb6cef768ab3b6d6",
    "torch/FORMAT": "9a462391cdfb69a2826edc9971c7187bc5b80017476bfad01a1bd0e712b6719d",
    "torch/expected.json": "035f3f1b932b62229159223c65f1ddcaf71483b06441dd208d40eba2808634dd",
    "torch/index/data.mdb": "02941703f7aa47dd1ce10a017206386016a8179f587f71a8f047e437f2c38c41",
    "torch/segments/0000000000000001.seg":
        "3b68815f20fba90b10c638e390de64a2c4153c0f33a08818bccb04c115d65058",
    "unapplied/FORMAT": "2d740f1056cc6defbe59d53c4b94610084228fe32fd012387d5ff099d4c7f736",
    "unapplied/expected.json": "f6a5c4d8f3c9e8ed15e661ff8e4f7d88f1aee9337dd1aed9f989698c0f7b8102",
    "unapplied/index/data.mdb": "ae287602154f5f6c6e31fe42041b81cc64a33249fa94be9289ab8e1af45953a9",
    "unapplied/segments/0000000000000001.seg":
        "2f4e545805a64280990ae5ff4762838471ce640d442638b75baba6092a80a69d",
    "upgraded/FORMAT": "fc4a3fd75b41f51313e2884596f99603437bda120ca96fe01f890d777907f973",
    "upgraded/expected.json": "5079d8288c235706e32e9e93a8b510bd376e0fc5501a6bb3bcd7a59f722187e4",
    "upgraded/index/data.mdb": "bf8a8b876b48ad6b2ed7ffee415aaaacef38938ebad3df16417efbf7e01bea41",
    "upgraded/segments/0000000000000001.seg":
        "a04261507af6199367830adfc4616895a2d20653bf902a0e6a015cf02b5174d7",
    "upgraded/segments/0000000000000002.seg":
        "cc94ec1764111987a2b4e5abfda164419ca1491ea59605cdd5450fccd37e954f",
    "upgraded/segments/0000000000000004.seg":
        "67caebc1f01827858049a951a61d793a591843f8115df3113b60d5e0d6d42f43",
    "upgraded/segments/0000000000000005.seg":
        "ad8368f7176cf616f9ce05d0b2a76e1914b5f5596b3a8727fe3c40931d4323d6",
    "writers/FORMAT": "535784b1a5741c2c8fd59a8e4e846aa009ba9ab3e8736402637c8d49cc3d19a7",
    "writers/expected.json": "8d5cd7b4deff915cbe2487db850d591596ecfe5f692d683047bd4fbfebf1df99",
    "writers/index/data.mdb": "763440b0e87ca4f56147dcc17cb432382fcdb492ec78a3080c3fdc493cfc2f99",
    "writers/segments/0000000000000001.seg":
        "a60d6e3354eda9f50751f9fe8038c0b25a94fef517cdfb4a20aa490e78d7967a",
    "writers/segments/0000000000000003.seg":
        "9231f19fc0acd76916a5147e730bc4a838993099d5dfa0114f3d209d868f3024",
    "writers/segments/0000001000000001.seg":
        "e36942c2158f8aacfb381591d0dd855742d3325630ece66f54de94ab6909283c",
    "writers/segments/0000001000000003.seg":
        "7d28e5826bad621f3a973707a66c54942bac0469926061deb2468edc80fa43f5",
    "writers/segments/0000002000000001.seg":
        "865e2963b91e8883eafb86799a21e7edfa2389d59a16f895ae80ab0c89c1acb0",
    "writers/segments/0000002000000002.seg":
        "99282415810303c282097b15badc5c4a1107c97b0c28b43c435eff2afea6199f",
}

# Segment header versions: 3, but for the segments "upgraded" had as a format 1 store (format
# 1 records: no order, a delete is <Q, a tag {"id", "tag", "add"}).
GOLDEN_SEGMENT_VERSIONS = {"upgraded": {1: 1, 2: 1, 4: 1}}
V1_RECORD_TYPES = (CHUNK, COMMIT, DELETE, TAG)
# What the generator left at the end of a log's last segment ({store: {log: ...}}): in
# "unapplied" a torn chunk record written by hand (a header promising 1000 payload bytes,
# followed by only 6); in "interrupted" log 1's delete_many, its writer killed once both
# records were in the log, then the second record cut 5 bytes short.
GOLDEN_TORN = {"unapplied": {0: b"SREC\x01\x00\x00\x00" + (1000).to_bytes(4, "little")
                             + bytes(12) + b"torn!!"}}
GOLDEN_CUT = {"interrupted": {1: 5}}
# The complete state sections: (log, first segment, last segment, order or None for the
# upgrade's section of a format 1 log), in log order; which one the index notes
# (META_LOG_STATE: its position in this list, or None).
GOLDEN_SECTIONS = {
    "basic": [(0, 4, 4, 24)], "raw_cdc": [], "objects": [], "torch": [], "unapplied": [],
    "compacted": [(0, 3, 3, 11), (0, 5, 6, 21)], "upgraded": [(0, 5, 5, None)],
    "interrupted": [(2, 2 * LOG_SEGMENTS + 1, 2 * LOG_SEGMENTS + 1, 8)],
    "writers": [(2, 2 * LOG_SEGMENTS + 1, 2 * LOG_SEGMENTS + 1, 21)], "group": []}
GOLDEN_NOTED = {"basic": 0, "compacted": 1, "upgraded": 0, "writers": 0}
# meta "gc_generation": how many transactions deleted chunk entries (absent: none yet)
GOLDEN_GC = {"basic": 1, "compacted": 2, "interrupted": 1, "writers": 1}
# The logs of each store (all of them log 0 but for format 3's own stores).
GOLDEN_LOGS = {"interrupted": [0, 1, 2, 3], "writers": [0, 1, 2], "group": [0, 1, 2]}


def golden_expected(store: str) -> dict:
    with open(os.path.join(V3, store, "expected.json")) as f:
        return json.load(f)


def parse_golden_segment(path: str, version: int, torn: bytes = b"",
                         cut: int = 0) -> tuple[list, "tuple | None"]:
    """(records, the cut record or None) of a golden segment whose header must name `version`
    (1: record types 1-4; 3: 1-7), every header and checksum checked; the walk ends exactly
    at the end of the file, or at `torn` (all that is left), or at a record whose payload
    lacks its last `cut` bytes: (type, payload length, the bytes there are) of that one."""
    with open(path, "rb") as f:
        data = f.read()
    name = os.path.basename(path)
    assert len(name) == 20 and name.endswith(".seg") and name[:16].isdigit(), name
    magic, seg_version, reserved, number, checksum = SEG_HEADER.unpack_from(data, 0)
    assert magic == b"SNAPSEG\x00" and reserved == 0 and number == int(name[:16])
    assert seg_version == version, (name, seg_version)
    assert checksum == xxhash.xxh3_64_intdigest(data[:24], seed=0)
    assert 1 <= number % LOG_SEGMENTS
    types = V1_RECORD_TYPES if version == 1 else RECORD_TYPES
    end = len(data) - len(torn)
    if torn:
        assert data[end:] == torn
    records, pos, partial = [], 32, None
    while pos < end:
        magic, rtype, codec, flags, length, reserved, checksum = REC_HEADER.unpack_from(data, pos)
        assert magic == b"SREC", (name, pos)
        assert rtype in types, (name, pos, rtype, version)
        assert codec in ((0, 1) if rtype == CHUNK else (0,)), (name, pos, codec)
        assert flags == 0 and reserved == 0, (name, pos)
        payload = data[pos + 24:pos + 24 + length]
        if cut and pos + 24 + length == end + cut:
            assert len(payload) == length - cut, (name, pos)
            partial = (rtype, length, payload)
            pos = end
            break
        assert len(payload) == length, (name, pos, "record runs past the end")
        assert checksum == xxhash.xxh3_64_intdigest(data[pos:pos + 16] + payload, seed=0)
        records.append(Record(number, pos, rtype, codec, payload))
        pos += 24 + length
    assert pos == end, (name, pos, end)
    assert not cut or partial is not None, name
    return records, partial


def load_golden(store: str) -> tuple[dict, dict, dict]:
    """({segment: header version}, {log: records in log order}, {log: its cut record})."""
    versions, logs, partial = {}, {}, {}
    paths = sorted(glob.glob(os.path.join(V3, store, "segments", "*.seg")))
    numbers = [int(os.path.basename(p)[:16]) for p in paths]
    for p, number in zip(paths, numbers):
        log = number // LOG_SEGMENTS
        last = number == max(n for n in numbers if n // LOG_SEGMENTS == log)
        version = GOLDEN_SEGMENT_VERSIONS.get(store, {}).get(number, 3)
        records, cut = parse_golden_segment(
            p, version, GOLDEN_TORN.get(store, {}).get(log, b"") if last else b"",
            GOLDEN_CUT.get(store, {}).get(log, 0) if last else 0)
        versions[number] = version
        logs.setdefault(log, []).extend(records)
        if cut is not None:
            partial[log] = cut
    return versions, logs, partial


def is_legacy(versions: dict, r: Record) -> bool:
    """A record of a format 1 segment: the v1 layouts, no order."""
    return versions[r.segment] < 3


def golden_op(versions: dict, r: Record) -> tuple:
    """(kind, order or None, records of that order, what it names) of a commit, delete or tag
    record: ("commit", ..., (header, extents)), ("delete", ..., id), ("tag", ..., JSON)."""
    legacy = is_legacy(versions, r)
    if r.rtype == COMMIT:
        head, _, extents = parse_commit(r.payload, () if legacy else {"order"})
        return "commit", head.get("order"), 1, (head, extents)
    if r.rtype == DELETE:
        if legacy:
            assert len(r.payload) == 8
            return "delete", None, 1, struct.unpack("<Q", r.payload)[0]
        victim, order, count = DELETE_ORDERED.unpack(r.payload)
        return "delete", order, count, victim
    d = json.loads(r.payload)
    assert set(d) == ({"id", "tag", "add"} if legacy else TAG_KEYS), d
    return "tag", d.get("order"), d.get("records", 1), d


def newest_section(logs: dict):
    """The newest complete section of all logs: format 3 sections (their BEGIN names an
    order) by order, after older ones (no order; log 0 only), which go by position."""
    sections = [(log, s) for log, records in logs.items() for s in find_sections(records)]
    if not sections:
        return None, None
    return max(sections, key=lambda ls: (1, ls[1].head["order"], 0) if "order" in ls[1].head
               else (0, ls[1].first.segment, ls[1].first.offset))


def section_covers(section: Section, log: int, r: Record) -> bool:
    if "logs" in section.head:
        return section.covers(log, r)
    return log == 0 and (r.segment, r.offset) < (section.last.segment, section.last.end)


def rebuild_golden(versions: dict, logs: dict) -> tuple[dict, dict, int, dict, list]:
    """rebuild() with format 1 records and sections too: the newest section, then the records
    it does not cover -- format 1 ones (log 0) in log order, then format 3 ones by order, an
    order's records only when all are there. Returns what rebuild() does."""
    _, newest = newest_section(logs)
    live, streams, recorded, next_id = {}, {}, {}, 1
    if newest is not None:
        next_id = newest.head["next_id"]
        streams = {n: [v["head"], v["seq"]] for n, v in newest.head["streams"].items()}
        for head, extents in newest.checkpoints:
            live[head["id"]] = dict(head)
            recorded[head["id"]] = (head, extents)
    legacy, batches = [], {}
    for log, records in sorted(logs.items()):
        for r in records:
            if r.rtype in (COMMIT, DELETE, TAG) and not (newest and
                                                         section_covers(newest, log, r)):
                op = golden_op(versions, r)
                if op[1] is None:
                    assert log == 0
                    legacy.append(op)
                else:
                    batches.setdefault(op[1], []).append(op)
    applied, ops = [], list(legacy)
    for order in sorted(batches):
        if len(batches[order]) == batches[order][0][2]:
            applied.append(order)
            ops.extend(batches[order])
    for kind, _, _, what in ops:
        if kind == "commit":
            head, extents = what
            live[head["id"]] = dict(head)
            recorded[head["id"]] = (head, extents)
            streams[head["stream"]] = [head["id"], head["seq"]]
            next_id = max(next_id, head["id"] + 1)
        elif kind == "delete":
            gone = live.pop(what)
            for c in live.values():
                if c["parent"] == what:
                    c["parent"] = gone["parent"]
            left = [i for i, c in live.items() if c["stream"] == gone["stream"]]
            if left:
                streams[gone["stream"]][0] = max(left)
            else:
                del streams[gone["stream"]]
        elif what["id"] in live:
            tags = set(live[what["id"]]["tags"])
            tags.add(what["tag"]) if what["add"] else tags.discard(what["tag"])
            live[what["id"]]["tags"] = sorted(tags)
    return live, streams, next_id, recorded, applied


@pytest.fixture(scope="module")
def golden_index(tmp_path_factory):
    """{store: {database: {key: payload}}} of every golden index, checksums checked."""
    root = str(tmp_path_factory.mktemp("v3-golden"))
    return {store: index_payloads(os.path.join(V3, store, "index"), os.path.join(root, store))
            for store in GOLDEN}


# ---- the files themselves ------------------------------------------------------------------------
def test_golden_files_are_the_originals():
    assert files_sha256(V3) == GOLDEN_SHA256


def test_golden_stores_of_format_3():
    assert GOLDEN == sorted(["basic", "raw_cdc", "objects", "torch", "unapplied", "compacted",
                             "upgraded", "interrupted", "writers", "group"])


@pytest.mark.parametrize("store", GOLDEN)
def test_golden_format_file(store):
    with open(os.path.join(V3, store, "FORMAT"), "rb") as f:
        d = json.loads(f.read())
    assert set(d) == {"format", "version", "created"}
    assert d["format"] == "snapstore" and d["version"] == 3
    assert isinstance(d["created"], float)
    assert golden_expected(store)["format_version"] == 3
    if store == "upgraded":             # the upgrade kept the v1 store's creation time
        with open(os.path.join(V1, "basic", "FORMAT")) as f:
            assert d["created"] == json.load(f)["created"]


def test_golden_upgrade_left_the_format_1_segments_as_they_were():
    for n in (1, 2, 4):
        name = f"{n:016d}.seg"
        with open(os.path.join(V1, "basic", "segments", name), "rb") as a, \
                open(os.path.join(V3, "upgraded", "segments", name), "rb") as b:
            assert a.read() == b.read(), name


# ---- the logs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("store", GOLDEN)
def test_golden_segments_walk_to_the_end(store):
    """Every segment, named L * 10^9 + n by its log, walked record by record to its end (or
    to the torn tail the generator left); commit, delete and tag records in the layouts of
    their segment's version; a commit's new-chunk table names chunk records (in any log: a
    group commit's lie in its participants' logs) or a segment compaction removed since."""
    exp = golden_expected(store)
    versions, logs, partial = load_golden(store)
    assert sorted(versions) == exp["segments"]
    assert sorted(logs) == GOLDEN_LOGS.get(store, [0])
    chunks = chunk_records(logs)
    codecs = {r.codec for records in logs.values() for r in records if r.rtype == CHUNK}
    if exp["options"].get("compression") == "none":
        assert codecs == {0}
    if store in ("basic", "compacted", "writers"):
        assert codecs == {0, 1}
    for log, records in logs.items():
        for r in records:
            if r.rtype == COMMIT:
                head, new_chunks, extents = parse_commit(
                    r.payload, () if is_legacy(versions, r) else {"order"})
                for cid, seg, off, stored, raw_len, codec in new_chunks:
                    if seg in versions:
                        got, raw, crec = chunks[(seg, off)]
                        assert got == cid and stored == len(crec.payload)
                        assert raw_len == len(raw) and codec == crec.codec
                    else:
                        assert seg // LOG_SEGMENTS in logs, seg
                for b, ext in zip(head["buffers"], extents):
                    check_extents(ext, b["size"], b["base"] == "full", lambda c: None)
            elif r.rtype in (DELETE, TAG):
                golden_op(versions, r)
    if store == "interrupted":          # log 1's delete_many: its second record cut short
        rtype, length, rest = partial[1]
        first = [r for r in logs[1] if r.rtype == DELETE][-1]
        victim, order, count = DELETE_ORDERED.unpack(first.payload)
        assert (rtype, length, count) == (DELETE, DELETE_ORDERED.size, 2)
        assert len(rest) == 15 and struct.unpack_from("<Q", rest)[0] != victim
        assert rest[8:15] == struct.pack("<Q", order)[:7]
    else:
        assert partial == {}


@pytest.mark.parametrize("store", GOLDEN)
def test_golden_orders(store, golden_index):
    """Format 3 records carry the order their operation claimed: one operation's records (a
    batch) all in one log and all saying how many they are; each log's in increasing order;
    the index's next order past every order the logs name (sections' included)."""
    versions, logs, _ = load_golden(store)
    seen: dict = {}
    for log, records in logs.items():
        mine = []
        for r in records:
            if r.rtype in (COMMIT, DELETE, TAG):
                _, order, count, _ = golden_op(versions, r)
                if order is None:
                    assert store == "upgraded" and is_legacy(versions, r)
                    continue
                mine.append(order)
                seen.setdefault(order, []).append((log, count))
        assert mine == sorted(mine), (store, log)
    for order, found in seen.items():
        assert len({log for log, _ in found}) == 1, (store, order)
        count = found[0][1]
        assert all(c == count for _, c in found)
        if (store, order) != ("interrupted", 10):         # the torn batch: 1 of its 2
            assert len(found) == count, (store, order)
    orders = set(seen) | {s.head["order"] for records in logs.values()
                          for s in find_sections(records) if "order" in s.head}
    next_order = u64(golden_index[store][b"meta"][b"next_order"])
    assert next_order == max(orders) + 1, (store, sorted(orders), next_order)


@pytest.mark.parametrize("store", GOLDEN)
def test_golden_state_sections(store, golden_index):
    """Where each complete section lies and what its BEGIN says (format 3: its order, the
    next order and how far it covers each log; the upgrade's section of a format 1 log: none
    of these); a section holds one CHECKPOINT per live checkpoint, ascending; every segment
    missing from a log's numbering (compaction removed it) lies wholly before the position
    the newest section covers of that log, so the logs alone still describe every
    checkpoint; which section the index notes."""
    _, logs, _ = load_golden(store)
    found = [(log, s) for log, records in sorted(logs.items()) for s in find_sections(records)]
    assert [(log, s.first.segment, s.last.segment, s.head.get("order")) for log, s in found] \
        == GOLDEN_SECTIONS[store]
    for log, s in found:
        if "order" in s.head:
            assert set(s.head) == BEGIN_KEYS
            assert s.head["next_order"] > s.head["order"]
            assert tuple(s.head["logs"][str(log)]) == (s.first.segment, s.first.offset)
        else:
            assert set(s.head) == {"next_id", "checkpoints", "streams"}
        assert s.head["checkpoints"] == len(s.checkpoints)
        ids = [h["id"] for h, _ in s.checkpoints]
        assert ids == sorted(ids) and all(i < s.head["next_id"] for i in ids)
        for name, v in s.head["streams"].items():
            assert v["head"] in ids and set(v) == {"head", "seq"}
        for head, _ in s.checkpoints:
            assert set(head) == COMMIT_KEYS
    _, newest = newest_section(logs)
    for log, records in logs.items():
        numbers = sorted({r.segment for r in records} | {
            int(os.path.basename(p)[:16]) for p in glob.glob(os.path.join(V3, store,
                                                                           "segments", "*.seg"))
            if int(os.path.basename(p)[:16]) // LOG_SEGMENTS == log})
        missing = sorted(set(range(log * LOG_SEGMENTS + 1, numbers[-1])) - set(numbers))
        for n in missing:
            assert newest is not None, (store, n)
            if "logs" in newest.head:
                assert n < newest.head["logs"][str(log)][0], (store, n)
            else:
                assert log == 0 and n < newest.first.segment, (store, n)
    meta = golden_index[store][b"meta"]
    noted = GOLDEN_NOTED.get(store)
    if noted is None:
        assert b"log_state" not in meta
    else:
        s = found[noted][1]
        assert STATE_MARK.unpack(meta[b"log_state"]) == \
            (s.first.segment, s.first.offset, s.last.segment, s.last.end)


@pytest.mark.parametrize("store", GOLDEN)
def test_golden_log_alone_gives_every_checkpoint(store):
    """Format 3's promise, by hand: the newest section, then the records of every log it does
    not cover, by order, give every checkpoint as a writer's open leaves the store (ids,
    streams, seqs, parents, tags, meta, creation, bytes_new, buffers and their bytes),
    every stream head and the next id -- also of the stores whose logs run ahead of their
    index (the log wins: a claimed record is published) or end in a torn batch (none of it)."""
    exp = golden_expected(store)
    versions, logs, _ = load_golden(store)
    live, streams, next_id, recorded, _ = rebuild_golden(versions, logs)
    chunks = all_chunks(logs)
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
@pytest.mark.parametrize("store", GOLDEN)
def test_golden_lmdb(store, golden_index):
    """Every value sealed (golden_index checks them), the databases of format 3; meta: format
    3, the next id, no "applied"; logs: where each log is applied (a log whose writer closed:
    its end); claims and groups empty once every writer closed; chunk entries match their
    records, exact reference counts; every checkpoint a reader sees restores by hand from
    index and log."""
    exp = golden_expected(store)
    dbs = golden_index[store]
    _, logs, _ = load_golden(store)
    meta = dbs[b"meta"]
    assert set(meta) == {b"format", b"next_id", b"next_order"} | \
        ({b"log_state"} if store in GOLDEN_NOTED else set()) | \
        ({b"gc_generation"} if store in GOLDEN_GC else set())
    assert u64(meta[b"format"]) == 3
    assert u64(meta[b"next_id"]) == exp["next_id"]       # ids are taken when claimed
    if store in GOLDEN_GC:
        assert u64(meta[b"gc_generation"]) == GOLDEN_GC[store]
    applied = {LOG_KEY.unpack(k)[0]: LOG_POSITION.unpack(v) for k, v in dbs[b"logs"].items()}
    ends = {log: (records[-1].segment, seg_size(os.path.join(V3, store), records[-1].segment))
            for log, records in logs.items()}
    if store not in ("unapplied", "interrupted"):        # every writer closed
        assert applied == ends
        assert dbs[b"claims"] == {} and dbs[b"groups"] == {}
    chunk_at = chunk_records(logs)
    chunks, refs = {}, {}
    for key, value in dbs[b"chunks"].items():
        seg, off, stored, raw_len, count, codec = CHUNK_ENTRY.unpack(value)
        cid, raw, rec = chunk_at[(seg, off)]
        assert cid == key and stored == len(rec.payload) and raw_len == len(raw)
        assert codec == rec.codec
        chunks[key], refs[key] = raw, count
    counted = dict.fromkeys(chunks, 0)
    for packed in dbs[b"manifests"].values():
        for k in range(0, len(packed), 48):
            counted[EXTENT.unpack_from(packed, k)[3]] += 1
    assert counted == refs
    ids = sorted(struct.unpack(">Q", k)[0] for k in dbs[b"checkpoints"])
    assert ids == exp["readonly_ids"]
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    for cid in ids:
        data = own_restore(dbs, chunks, cid)
        assert {k: hashlib.sha256(v).hexdigest() for k, v in data.items()} == \
            {b["name"]: b["sha256"] for b in by_id[cid]["buffers"]}


def test_golden_unapplied_claim(golden_index):
    """The checkpoint killed before its index commit: its claim (order 2: id 2, seq 2 of
    stream "s" on checkpoint 1) in the index, log 0 applied up to the end of checkpoint 1's
    commit record; after it the killed writer's chunks and commit record, then the torn
    record."""
    dbs = golden_index["unapplied"]
    versions, logs, _ = load_golden("unapplied")
    ((key, value),) = dbs[b"claims"].items()
    claim, pins = blob(value)
    assert CLAIM_KEY.unpack(key) == (2,) and pins == b""
    assert set(claim) == CLAIM_KEYS | CLAIM_KIND_KEYS["commit"] | {"parent"}
    assert (claim["kind"], claim["log"], claim["stream"], claim["parent"], claim["id"],
            claim["seq"]) == ("commit", 0, "s", 1, 2, 2)
    commits = [r for r in logs[0] if r.rtype == COMMIT]
    assert [golden_op(versions, r)[3][0]["id"] for r in commits] == [1, 2]
    applied = LOG_POSITION.unpack(dbs[b"logs"][LOG_KEY.pack(0)])
    assert applied == (commits[0].segment, commits[0].end)
    assert dbs[b"groups"] == {}


def test_golden_interrupted(golden_index):
    """Format 3's crash states, as the killed writers left them in the index and the logs:
    - log 2 (a compaction killed at compact_after_state): a complete state section, order 8,
      covering logs 0 and 1 up to where they were applied and log 2 up to itself, lying past
      log 2's applied position; the index never noted it (no META_LOG_STATE); log 0's first
      segment, which it chose, is still there, its chunk entries gone (gc_generation 1);
    - log 3 (a checkpoint killed at after_commit_append): no applied position; its claim
      (order 9, stream k, id 5, seq 1) pins the chunk of checkpoint 2 it reuses; its record,
      the only one of log 3 but for its new chunk, is not in the index;
    - log 1 (a group coordinator, then killed inside a delete_many): the group's claim (order
      7) and header (stream g, no parent, participants c and a) and both staged parts (c in
      log 1, a in log 0, each with its new chunk, page fingerprints and meta); the delete's
      claim (order 10, ids 2 and 4, 2 records), log 1 applied up to the batch's first
      record."""
    dbs = golden_index["interrupted"]
    versions, logs, _ = load_golden("interrupted")
    chunks = chunk_records(logs)
    applied = {LOG_KEY.unpack(k)[0]: LOG_POSITION.unpack(v) for k, v in dbs[b"logs"].items()}
    assert sorted(applied) == [0, 1, 2]
    # log 2: the section
    (s,) = find_sections(logs[2])
    assert s.first.offset == 32 and applied[2] == (2 * LOG_SEGMENTS + 1, 32)
    assert s.head["order"] == 8 and s.head["next_order"] == 9
    assert {int(k): tuple(v) for k, v in s.head["logs"].items()} == applied
    assert [h["id"] for h, _ in s.checkpoints] == [2, 3, 4]
    assert b"log_state" not in dbs[b"meta"]
    tmp = [r for r in logs[0] if r.rtype == COMMIT and r.segment == 1]
    assert [golden_op(versions, r)[3][0]["stream"] for r in tmp] == ["tmp"]
    assert not any(CHUNK_ENTRY.unpack(v)[0] == 1 for v in dbs[b"chunks"].values())
    # log 3: the claimed commit
    assert [r.rtype for r in logs[3]] == [CHUNK, COMMIT]
    head, new_chunks, extents = parse_commit(logs[3][1].payload, {"order"})
    assert (head["order"], head["id"], head["stream"], head["seq"], head["parent"]) == \
        (9, 5, "k", 1, None)
    claims = {CLAIM_KEY.unpack(k)[0]: blob(v) for k, v in dbs[b"claims"].items()}
    assert sorted(claims) == [7, 9, 10]
    claim, pins = claims[9]
    assert set(claim) == CLAIM_KEYS | CLAIM_KIND_KEYS["commit"]
    assert (claim["kind"], claim["log"], claim["stream"], claim["id"], claim["seq"]) == \
        ("commit", 3, "k", 5, 1)
    x = [e[3] for e in extents[[b["name"] for b in head["buffers"]].index("x")]]
    reused = {EXTENT.unpack_from(dbs[b"manifests"][struct.pack(">QI", 2, 0)], k)[3]
              for k in range(0, len(dbs[b"manifests"][struct.pack(">QI", 2, 0)]), 48)}
    assert set(x) == reused and pins == b"".join(sorted(reused))
    assert [nc[0] for nc in new_chunks] == [parse_chunk(logs[3][0])[0]]
    assert struct.pack(">Q", 5) not in dbs[b"checkpoints"]
    # log 1: the dead coordinator's group and its torn delete_many
    claim, pins = claims[7]
    assert set(claim) == CLAIM_KEYS | CLAIM_KIND_KEYS["group"] and pins == b""
    assert (claim["kind"], claim["log"], claim["stream"]) == ("group", 1, "g")
    gid = claim["group"].encode()
    assert set(dbs[b"groups"]) == {gid + b"\0", gid + b"\0a", gid + b"\0c"}
    header, rest = blob(dbs[b"groups"][gid + b"\0"])
    assert rest == b"" and set(header) == GROUP_KEYS
    assert (header["stream"], header["parent"], header["participants"], header["claim"]) == \
        ("g", None, ["c", "a"], 7)
    for participant, log, name, offset in (("c", 1, "gc", 7), ("a", 0, "ga", 8)):
        part, rest = blob(dbs[b"groups"][gid + b"\0" + participant.encode()])
        assert set(part) == PART_KEYS
        assert (part["log"], part["meta"], part["new_chunks"]) == (log, {"offset": offset}, 1)
        start, end = tuple(part["start"]), tuple(part["end"])
        assert start[0] // LOG_SEGMENTS == log and start < end <= applied[log]
        cid, seg, off, stored, raw_len, codec = NEW_CHUNK.unpack_from(rest, 0)
        assert start <= (seg, off) < end and chunks[(seg, off)][0] == cid
        (b,) = part["buffers"]
        assert (b["name"], b["base"], b["depth"], b["extents"]) == (name, "full", 0, 1)
        assert b["size"] == raw_len and EXTENT.unpack_from(rest, 57) == (0, 0, raw_len, cid)
        assert part["fps"] == [[name, 4096, 16 * -(-raw_len // 4096)]]
        assert rest[57 + 48:57 + 48 + part["fps"][0][2]] == \
            page_fingerprints(chunks[(seg, off)][1], 4096)
        assert cid not in dbs[b"chunks"]          # a staged part's chunks: not indexed
    claim, pins = claims[10]
    assert set(claim) == CLAIM_KEYS | {"ids", "records"} and pins == b""
    assert (claim["kind"], claim["log"], claim["ids"], claim["records"]) == \
        ("delete", 1, [2, 4], 2)
    delete = logs[1][-1]
    assert delete.rtype == DELETE and DELETE_ORDERED.unpack(delete.payload) == (2, 10, 2)
    assert applied[1] == (delete.segment, delete.offset)
    assert u64(dbs[b"meta"][b"next_order"]) == 11


def test_golden_writers(golden_index):
    """Three writers' logs: segments 0 and 1 * 10^9 + 2 removed by the compaction of the third
    writer (log 2), whose state section (order 21) covers every log; the chunks of the
    removed segments copied to log 2 after the section (the index points at the copies); the
    delete_many of log 1 went with its segment (the section describes its result), the one
    after the section is two DELETE_ORDERED records of one order in log 2; commits to the
    shared stream from all three logs, each a delta naming chunks of other logs."""
    versions, logs, _ = load_golden("writers")
    assert sorted(versions) == [1, 3, LOG_SEGMENTS + 1, LOG_SEGMENTS + 3,
                                2 * LOG_SEGMENTS + 1, 2 * LOG_SEGMENTS + 2]
    (s,) = find_sections(logs[2])
    covered = {int(k): tuple(v) for k, v in s.head["logs"].items()}
    assert sorted(covered) == [0, 1, 2]
    assert covered[0][0] == 3 and covered[1][0] == LOG_SEGMENTS + 3
    dbs = golden_index["writers"]
    copies = [r for r in logs[2] if r.rtype == CHUNK and (r.segment, r.offset) > (s.last.segment,
                                                                                 s.last.offset)]
    at = {(CHUNK_ENTRY.unpack(v)[0], CHUNK_ENTRY.unpack(v)[1]) for v in dbs[b"chunks"].values()}
    assert copies and all((r.segment, r.offset) in at for r in copies[:5])
    deletes = [r for records in logs.values() for r in records if r.rtype == DELETE]
    assert [(r.segment // LOG_SEGMENTS, DELETE_ORDERED.unpack(r.payload)) for r in deletes] == \
        [(2, (1, 26, 2)), (2, (3, 26, 2))]
    assert deletes[1].offset == deletes[0].end
    exp = golden_expected("writers")
    assert sorted(exp["deleted"]) == [1, 3, 5, 12, 13]
    shared = {}
    for log, records in logs.items():
        for r in records:
            if r.rtype == COMMIT:
                head, _, _ = parse_commit(r.payload, {"order"})
                if head["stream"] == "shared":
                    shared[head["id"]] = (log, head["parent"],
                                          [(b["base"], b["depth"]) for b in head["buffers"]])
    # 4 (log 0) and 7 (log 0) only in the section; each delta on a head another log wrote
    # ("cfg", the second buffer, changed wholly in 6: a full manifest there)
    assert shared == {5: (1, 4, [("delta", 1), ("delta", 1)]),
                      6: (2, 5, [("delta", 2), ("full", 0)]),
                      15: (1, 7, [("delta", 3), ("delta", 2)])}
    (s4,) = [h for h, _ in s.checkpoints if h["id"] == 7]
    assert [(b["base"], b["depth"]) for b in s4["buffers"]] == [("delta", 2), ("delta", 1)]


def test_golden_group(golden_index):
    """Group commits: each one record in its coordinator's log (log 0 for the first two, log 2
    for "ingest") listing every part's buffers and new chunks, those chunk records in the
    participants' logs; each part's meta in the reserved "snapstore.group"; the chunks of the
    aborted group and of the part staged again in the logs but not in the index; no record
    of the aborted group."""
    versions, logs, _ = load_golden("group")
    dbs = golden_index["group"]
    commits = {}
    for log, records in logs.items():
        for r in records:
            if r.rtype == COMMIT:
                head, new_chunks, _ = parse_commit(r.payload, {"order"})
                commits[head["id"]] = (log, head, new_chunks)
    assert {i: (v[0], v[1]["stream"]) for i, v in commits.items()} == \
        {1: (0, "train"), 2: (0, "train"), 3: (2, "ingest"), 4: (1, "train")}
    log, head, new_chunks = commits[1]
    assert [b["name"] for b in head["buffers"]] == ["r0", "r1", "r1.opt", "r2"]
    assert head["meta"]["snapstore.group"]["parts"] == {
        "rank0": {"offset": 1000}, "rank1": {"offset": 1001, "note": "two buffers"},
        "rank2": {"offset": 1002, "pid": "other process"}}
    assert {seg // LOG_SEGMENTS for _, seg, *_ in new_chunks} == {0, 1, 2}
    log, head, new_chunks = commits[3]
    assert head["meta"]["snapstore.group"]["parts"] == {"0": {"rows": 60}, "1": {"rows": 70}}
    assert {seg // LOG_SEGMENTS for _, seg, *_ in new_chunks} == {0, 1}
    assert [(b["name"], b["base"]) for b in commits[2][1]["buffers"]] == \
        [("r0", "delta"), ("r1", "delta"), ("r1.opt", "delta"), ("r2", "delta")]
    named = {nc[1:3] for _, _, ncs in commits.values() for nc in ncs}
    garbage = [(r.segment, r.offset) for records in logs.values() for r in records
               if r.rtype == CHUNK and (r.segment, r.offset) not in named]
    indexed = {CHUNK_ENTRY.unpack(v)[:2] for v in dbs[b"chunks"].values()}
    assert garbage and not set(garbage) & indexed
    # the aborted group's two parts (logs 0 and 2) and rank1's first part (log 1)
    assert {seg // LOG_SEGMENTS for seg, _ in garbage} == {0, 1, 2}
