"""Upgrading format 1, 2, 3, 4 and 5 stores to today's format 6 (snapstore/engine/upgrade.py),
on copies of the golden v1-v5 stores (the stores themselves are never written: README.md), and
format 6 stores (stores/v6) staying as they are.

- a readonly open changes nothing and reads format 1 values (no checksums) and format 2
  indexes (one applied position) as they are, also after a writer upgraded them under it;
- a writer open upgrades a v1 store 1 -> 2 -> 3: every index value is the old payload sealed
  with its checksum (1 -> 2), the log gains a state section in a new segment (1 -> 2), then
  META_APPLIED moves to the logs database as log 0's position, the order count starts at 1
  and META_FORMAT is 3, in one transaction (2 -> 3); FORMAT says 3 (its "created" kept);
  verify(deep=True) is clean and every checkpoint restores byte-exact, also for readers;
- a writer open upgrades a v2 store 2 -> 3: its index is the v2 index but for what the 2 -> 3
  step changes, its segments stay as they were (recovery only cuts torn tails), and log 0
  goes on in a new segment of version 3;
- a v3 store is upgraded 3 -> 4 -> 5 -> 6, a v4 store 4 -> 5 -> 6 and a v5 store 5 -> 6: each
  of these steps only sets META_FORMAT (formats 4, 5 and 6 add chunk codecs or codings, in new
  segments only), no segment changes, FORMAT says 6; a writer's open only recovers what its
  dead writers left and goes on in a new, empty segment of version 6, and opening again
  changes nothing; a v4 store's float buffers, all changed, are then stored as delta chunks
  (format 5) against its byte-plane chunks in its version 4 segments, and a v5 store's new
  float32 chunks rotate by 3 bits (format 6) beside its rotated-by-1 ones;
- upgrading again changes nothing (idempotent), v1-v5 stores alike; a v6 store is upgraded by
  nothing (no step finds work: index, segments and FORMAT byte for byte);
- a writer SIGKILLed at each upgrade crash point (upgrade_v3_before_index_commit,
  upgrade_v5_before_index_commit and upgrade_v6_before_index_commit included) leaves a store that readers read byte-exact and
  the next writer open upgrades; FORMAT never names a version its index has not reached.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys

import lmdb
import pytest
import xxhash

from cli_runner import cli_env, console_script
import snapstore
from snapstore.engine import format as fmt
from snapstore.engine import upgrade
from snapstore.engine.backends import LocalSegments
from snapstore.engine.index import Index, seal, unseal

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = os.path.join(HERE, "stores", "v1")
V2 = os.path.join(HERE, "stores", "v2")
V3 = os.path.join(HERE, "stores", "v3")
V4 = os.path.join(HERE, "stores", "v4")
V5 = os.path.join(HERE, "stores", "v5")
V6 = os.path.join(HERE, "stores", "v6")
STORES = sorted(os.path.basename(os.path.dirname(p))
                for p in glob.glob(os.path.join(V1, "*", "FORMAT")))
V2_STORES = sorted(os.path.basename(os.path.dirname(p))
                   for p in glob.glob(os.path.join(V2, "*", "FORMAT")))
V3_STORES = sorted(os.path.basename(os.path.dirname(p))
                   for p in glob.glob(os.path.join(V3, "*", "FORMAT")))
V4_STORES = sorted(os.path.basename(os.path.dirname(p))
                   for p in glob.glob(os.path.join(V4, "*", "FORMAT")))
V5_STORES = sorted(os.path.basename(os.path.dirname(p))
                   for p in glob.glob(os.path.join(V5, "*", "FORMAT")))
V6_STORES = sorted(os.path.basename(os.path.dirname(p))
                   for p in glob.glob(os.path.join(V6, "*", "FORMAT")))
PKG_ROOT = os.path.dirname(os.path.dirname(HERE))

# The format a writer's open leaves a format 1, 2, 3, 4 or 5 store at. The next format changes
# this and adds what its own upgrade step changes (the checks of the earlier steps below stay).
UPGRADED_TO = 6
TODAYS_SEGMENT_VERSION = 6      # the header version of the segments today's writer creates
# The databases format 3 added (a writer's open creates them, empty, before it upgrades).
V3_DBS = {fmt.DB_LOGS, fmt.DB_CLAIMS, fmt.DB_GROUPS}
# The torn record a writer's recovery cuts from the last segment: a 24-byte header and 6 of
# the 1000 payload bytes it promises (v1/unapplied; v2/unapplied and v2/interrupted).
TORN_TAIL = {"unapplied": 30, "interrupted": 30}


def sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def golden_dir(version: int) -> str:
    return {1: V1, 2: V2, 3: V3, 4: V4, 5: V5, 6: V6}[version]


def expected_of(store: str, version: int = 1) -> dict:
    with open(os.path.join(golden_dir(version), store, "expected.json")) as f:
        return json.load(f)


def copy(store: str, tmp_path, version: int = 1) -> str:
    dst = os.path.join(str(tmp_path), store)
    shutil.copytree(os.path.join(golden_dir(version), store), dst,
                    ignore=shutil.ignore_patterns("expected.json"))
    return dst


def format_file(path: str) -> dict:
    with open(os.path.join(path, fmt.FORMAT_FILE)) as f:
        return json.load(f)


def raw_format(path: str) -> bytes:
    with open(os.path.join(path, fmt.FORMAT_FILE), "rb") as f:
        return f.read()


def raw_index(path: str, opened: "Opened | None" = None) -> dict:
    """{database: {key: value}} exactly as stored (the databases the index has); through the
    environment of `opened` while that holds the index (LMDB: one per process)."""
    env = opened.index.env if opened is not None else \
        lmdb.open(os.path.join(path, fmt.INDEX_DIR), readonly=True, lock=False,
                  max_dbs=fmt.INDEX_MAX_DBS)
    try:
        with env.begin() as txn:
            present = {key for key, _ in txn.cursor()}     # the named databases it has
            return {name: dict(txn.cursor(db=env.open_db(name, txn=txn, create=False)))
                    for name in fmt.INDEX_DBS if name in present}
    finally:
        if opened is None:
            env.close()


def raw_segments(path: str) -> dict:
    out = {}
    for p in sorted(glob.glob(os.path.join(path, fmt.SEGMENTS_DIR, "*.seg"))):
        with open(p, "rb") as f:
            out[os.path.basename(p)] = f.read()
    return out


def index_version(path: str) -> int:
    value = raw_index(path)[fmt.DB_META][fmt.META_FORMAT]
    if len(value) == 8:
        return fmt.U64.unpack(value)[0]
    return fmt.U64.unpack(unseal(fmt.DB_META, fmt.META_FORMAT, value, fmt.FORMAT_VERSION))[0]


def segment_version(data: bytes) -> int:
    """The header version of a segment (by hand: <8sIIQQ, checked)."""
    magic, version, reserved, number, checksum = struct.unpack_from("<8sIIQQ", data)
    assert magic == b"SNAPSEG\x00" and reserved == 0
    assert checksum == xxhash.xxh3_64_intdigest(data[:24], seed=0)
    return version


def new_segment(number: int) -> bytes:
    """A segment holding no record yet, as today's writer creates it (header version 6)."""
    head = struct.pack("<8sIIQ", b"SNAPSEG\x00", TODAYS_SEGMENT_VERSION, 0, number)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head, seed=0))


def cut(store: str, segments: dict) -> dict:
    """`segments` with the torn tail recovery cuts taken off the last one."""
    last, n = max(segments), TORN_TAIL.get(store, 0)
    return {k: (v[:len(v) - n] if k == last else v) for k, v in segments.items()}


def assert_sealed(before: dict, after: dict) -> None:
    """`after` holds the payloads of `before` (a format 1 index), each sealed with its
    checksum, and META_FORMAT 2; the databases format 3 added exist and are empty."""
    assert set(after) == set(before) | V3_DBS and not set(before) & V3_DBS
    for name in before:
        assert set(after[name]) == set(before[name]), name
        for key, value in after[name].items():
            payload = unseal(name, key, value, fmt.FORMAT_VERSION)
            if (name, key) == (fmt.DB_META, fmt.META_FORMAT):
                assert payload == fmt.U64.pack(2) and before[name][key] == fmt.U64.pack(1)
            else:
                assert payload == before[name][key], (name, key)
    assert not any(after[name] for name in V3_DBS)


def v3_of(v2: dict) -> dict:
    """The index the 2 -> 3 step makes of the format 2 index `v2` (raw values), when recovery
    had nothing to apply: META_APPLIED becomes log 0's entry in the logs database, the order
    count starts at 1, META_FORMAT is 3; claims and groups are empty; nothing else changes."""
    out = {name: dict(v2.get(name, {})) for name in fmt.INDEX_DBS}
    meta = out[fmt.DB_META]
    applied = unseal(fmt.DB_META, fmt.META_APPLIED, meta.pop(fmt.META_APPLIED), 2)
    assert len(applied) == 16                     # (segment, offset) <QQ
    key = struct.pack(">I", 0)
    out[fmt.DB_LOGS] = {key: seal(fmt.DB_LOGS, key, applied)}
    meta[fmt.META_NEXT_ORDER] = seal(fmt.DB_META, fmt.META_NEXT_ORDER, struct.pack("<Q", 1))
    meta[fmt.META_FORMAT] = seal(fmt.DB_META, fmt.META_FORMAT, struct.pack("<Q", 3))
    assert not out[fmt.DB_CLAIMS] and not out[fmt.DB_GROUPS]
    return out


def v4_of(v3: dict) -> dict:
    """The index the 3 -> 4 step makes of the format 3 index `v3` (raw values): META_FORMAT is
    4; nothing else changes (format 4 only adds a chunk codec, in new segments)."""
    out = {name: dict(v3.get(name, {})) for name in fmt.INDEX_DBS}
    out[fmt.DB_META][fmt.META_FORMAT] = seal(fmt.DB_META, fmt.META_FORMAT, struct.pack("<Q", 4))
    return out


def v5_of(v4: dict) -> dict:
    """The index the 4 -> 5 step makes of the format 4 index `v4` (raw values): META_FORMAT is
    5; nothing else changes (format 5 only adds a chunk codec, delta chunks, in new segments:
    a format 4 index has no delta chunk, so every chunk entry and count stays)."""
    out = {name: dict(v4.get(name, {})) for name in fmt.INDEX_DBS}
    out[fmt.DB_META][fmt.META_FORMAT] = seal(fmt.DB_META, fmt.META_FORMAT, struct.pack("<Q", 5))
    return out


def v6_of(v5: dict) -> dict:
    """The index the 5 -> 6 step makes of the format 5 index `v5` (raw values): META_FORMAT is
    6; nothing else changes (format 6 only lets byte-plane records rotate their items by more
    than one bit, in new segments)."""
    out = {name: dict(v5.get(name, {})) for name in fmt.INDEX_DBS}
    out[fmt.DB_META][fmt.META_FORMAT] = seal(fmt.DB_META, fmt.META_FORMAT, struct.pack("<Q", 6))
    return out


def log0_applied(index: dict) -> tuple[int, int]:
    """Log 0's applied position in a format 3 index (raw values)."""
    assert fmt.META_APPLIED not in index[fmt.DB_META]     # moved to the logs database
    key = struct.pack(">I", 0)
    return struct.unpack("<QQ", unseal(fmt.DB_LOGS, key, index[fmt.DB_LOGS][key], 3))


def check_exact(store, exp: dict, ids, listed: bool = True) -> None:
    """The checkpoints `ids` restore byte-exact (and, if listed, are all the store lists)."""
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    if listed:
        assert [c.id for c in store.checkpoints()] == list(ids)
    for cid in ids:
        assert {k: sha(v) for k, v in store.restore(cid).items()} == \
            {b["name"]: b["sha256"] for b in by_id[cid]["buffers"]}


class Opened:
    """What a writer's open holds while it upgrades: the store lock, the index, the backend."""

    def __init__(self, path: str) -> None:
        self.lock = os.open(os.path.join(path, fmt.LOCK_FILE), os.O_RDWR | os.O_CREAT)
        self.index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=False, durable=True)
        self.backend = LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR))

    def close(self) -> None:
        self.index.close()
        os.close(self.lock)


# ---- format 1 stores --------------------------------------------------------------------------
@pytest.mark.parametrize("store", STORES)
def test_readonly_open_reads_v1_and_changes_nothing(store, tmp_path):
    path = copy(store, tmp_path)
    exp = expected_of(store)
    before, segments = raw_index(path), raw_segments(path)
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, exp["readonly_ids"])
        assert s.verify()["ok"]
    assert raw_index(path) == before and raw_segments(path) == segments
    assert format_file(path)["version"] == 1


@pytest.mark.parametrize("store", STORES)
def test_writer_open_upgrades_each_v1_store(store, tmp_path):
    path = copy(store, tmp_path)
    exp = expected_of(store)
    created = format_file(path)["created"]
    before, segments0 = raw_index(path), raw_segments(path)
    o = Opened(path)
    try:
        assert o.index.version == 1
        # 1 -> 2, the index step alone (no recovery yet): exactly the old payloads, sealed
        assert upgrade.STEPS[0].run(path, o.index, o.backend)
        assert o.index.version == 2
        assert_sealed(before, raw_index(path, o))
        # 1 -> 2, the log step: recovery, then a state section in a new segment, noted
        assert upgrade.STEPS[1].run(path, o.index, o.backend)
        with o.index.read() as r:
            assert r.log_state() is not None
        v2 = raw_index(path, o)
        segments = raw_segments(path)
        added = sorted(set(segments) - set(segments0))
        assert len(added) == 1 and added[0] == f"{int(max(segments0)[:16]) + 1:016d}.seg"
        # (a segment of today's version: the section BEGINs without an order, written before
        # the index counts orders, and covers log 0 up to itself)
        assert segment_version(segments[added[0]]) == TODAYS_SEGMENT_VERSION
        assert {k: segments[k] for k in segments0} == cut(store, segments0)
        # 2 -> 3: log 0's applied position, the order count, META_FORMAT 3, all at once
        assert upgrade.STEPS[2].run(path, o.index, o.backend)
        assert o.index.version == 3
        assert raw_index(path, o) == v3_of(v2)
        # 3 -> 4: META_FORMAT 4, nothing else
        assert upgrade.STEPS[3].run(path, o.index, o.backend)
        assert o.index.version == 4
        assert raw_index(path, o) == v4_of(v3_of(v2))
        # 4 -> 5: META_FORMAT 5, nothing else
        assert upgrade.STEPS[4].run(path, o.index, o.backend)
        assert o.index.version == 5
        assert raw_index(path, o) == v5_of(v4_of(v3_of(v2)))
        # 5 -> 6: META_FORMAT 6, nothing else
        assert upgrade.STEPS[5].run(path, o.index, o.backend)
        assert o.index.version == 6
        assert raw_index(path, o) == v6_of(v5_of(v4_of(v3_of(v2))))
        assert format_file(path)["version"] == 1      # FORMAT last
        assert upgrade.upgrade(path, o.index, o.backend) == 1
    finally:
        o.close()
    assert format_file(path) == {"format": "snapstore", "version": 6, "created": created}
    upgraded = raw_segments(path)
    assert upgraded == segments
    # and through the public API: recovery, verify, restores, readers; log 0 goes on in the
    # upgrade's segment (of today's version: no other is added)
    ids = [c["id"] for c in exp["checkpoints"]]
    with snapstore.open(path, durability="none") as s:
        check_exact(s, exp, ids)
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
        assert raw_segments(path) == upgraded
        info = s.checkpoint({"n": b"after the upgrade"}, stream="new")
    assert sorted(os.listdir(os.path.join(path, "writers"))) == [fmt.LOG_CHOICE_LOCK_FILE, "0"]
    grown = raw_segments(path)
    assert set(grown) == set(upgraded) and len(grown[added[0]]) > len(upgraded[added[0]])
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, ids, listed=False)
        assert [c.id for c in s.checkpoints()] == ids + [info.id]
    assert index_version(path) == 6 and format_file(path)["version"] == 6


def test_format_file_older_than_its_index_is_finished(tmp_path):
    """FORMAT still 1 over a format 2 index (a crash between the two): a reader reads it, the
    next writer runs the steps still to do (the log step's section, 2 -> 3, 3 -> 4, 4 -> 5,
    5 -> 6) and publishes FORMAT 6; the sealed values stay as they were."""
    path = copy("raw_cdc", tmp_path)
    exp = expected_of("raw_cdc")
    index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=False, durable=True)
    try:
        assert index.add_value_checksums()
    finally:
        index.close()
    sealed = raw_index(path)
    assert format_file(path)["version"] == 1
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, exp["readonly_ids"])
    snapstore.open(path, durability="none").close()
    assert format_file(path)["version"] == 6
    after = raw_index(path)
    # the log step's note (a state section for the format 1 log), then 2 -> 3 ... 5 -> 6
    assert after[fmt.DB_META].pop(fmt.META_LOG_STATE) is not None
    assert after == v6_of(v5_of(v4_of(v3_of(sealed))))


# ---- format 2 stores --------------------------------------------------------------------------
@pytest.mark.parametrize("store", V2_STORES)
def test_v2_store_under_todays_writer(store, tmp_path):
    path = copy(store, tmp_path, 2)
    exp = expected_of(store, 2)
    ids = [c["id"] for c in exp["checkpoints"]]
    index0, segments0, format0 = raw_index(path), raw_segments(path), raw_format(path)
    assert index_version(path) == 2 and format_file(path)["version"] == 2
    assert not set(index0) & V3_DBS and fmt.META_APPLIED in index0[fmt.DB_META]
    with snapstore.open(path, readonly=True) as s:          # readers change nothing
        check_exact(s, exp, exp["readonly_ids"])
    assert (raw_index(path), raw_segments(path), raw_format(path)) == \
        (index0, segments0, format0)

    # the upgrade alone, as a writer's open runs it before recovery
    o = Opened(path)
    try:
        assert o.index.version == 2
        assert not any(step.run(path, o.index, o.backend) for step in upgrade.STEPS[:2])
        assert raw_index(path, o) == {**index0, **{name: {} for name in V3_DBS}}
        assert upgrade.upgrade(path, o.index, o.backend) == 2    # the version FORMAT named
        assert o.index.version == UPGRADED_TO
    finally:
        o.close()
    upgraded = raw_index(path)
    # log 0's segments as they were: the 2 -> 3 step's recovery only cut the torn tail
    assert raw_segments(path) == cut(store, segments0)
    last = max(segments0)
    if exp["readonly_ids"] == ids:     # nothing for recovery to apply: 2 -> 3 ... 5 -> 6 alone
        assert upgraded == v6_of(v5_of(v4_of(v3_of(index0))))
    else:                              # "unapplied": its second commit, applied up to its end
        assert log0_applied(upgraded) == (int(last[:16]), len(cut(store, segments0)[last]))
        assert unseal(fmt.DB_META, fmt.META_NEXT_ORDER,
                      upgraded[fmt.DB_META][fmt.META_NEXT_ORDER], 3) == struct.pack("<Q", 1)
        assert not upgraded[fmt.DB_CLAIMS] and not upgraded[fmt.DB_GROUPS]
        assert unseal(fmt.DB_META, fmt.META_FORMAT, upgraded[fmt.DB_META][fmt.META_FORMAT],
                      6) == struct.pack("<Q", 6)
    created = json.loads(format0)["created"]
    assert format_file(path) == {"format": "snapstore", "version": 6, "created": created}

    # through the public API: log 0 goes on in a new segment of version 6; recovery, verify,
    # restores, readers afterwards
    with snapstore.open(path, durability="none") as s:
        check_exact(s, exp, ids)
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    assert sorted(os.listdir(os.path.join(path, "writers"))) == [fmt.LOG_CHOICE_LOCK_FILE, "0"]
    nxt = f"{int(last[:16]) + 1:016d}.seg"
    assert raw_segments(path) == dict(cut(store, segments0), **{nxt: new_segment(int(nxt[:16]))})
    assert raw_index(path) == upgraded          # nothing left to recover or to upgrade
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, ids)
    assert index_version(path) == format_file(path)["version"] == UPGRADED_TO


# ---- format 3, 4 and 5 stores -------------------------------------------------------------------
# The index a format 3, 4 or 5 store's upgrade makes of its index (raw values): only
# META_FORMAT changes, to 6 (formats 4, 5 and 6 only add chunk codecs or codings, in new
# segments).
UPGRADE_OF = {3: lambda index: v6_of(v5_of(v4_of(index))),
              4: lambda index: v6_of(v5_of(index)), 5: v6_of}


@pytest.mark.parametrize("version, store", [(3, s) for s in V3_STORES] +
                         [(4, s) for s in V4_STORES] + [(5, s) for s in V5_STORES])
def test_v3_v4_and_v5_stores_under_todays_writer(version, store, tmp_path):
    """A format 3 store becomes format 6 by the 3 -> 4, 4 -> 5 and 5 -> 6 steps alone, a format
    4 store by the last two, a format 5 store by the last: readers change nothing; the
    upgrade changes META_FORMAT (6) and nothing else of the index, no segment, and publishes
    FORMAT 6 (its "created" kept); a writer's open recovers what its dead writers left
    (unapplied, interrupted) and goes on in a new, empty segment of version 6 (a segment only
    holds records of its header's version); opening it again changes nothing at all."""
    path = copy(store, tmp_path, version)
    exp = expected_of(store, version)
    ids = [c["id"] for c in exp["checkpoints"]]
    index0, segments0, format0 = raw_index(path), raw_segments(path), raw_format(path)
    assert index_version(path) == version and format_file(path)["version"] == version
    assert set(index0) == set(fmt.INDEX_DBS) and fmt.META_APPLIED not in index0[fmt.DB_META]
    with snapstore.open(path, readonly=True) as s:          # readers change nothing
        check_exact(s, exp, exp["readonly_ids"])
    assert (raw_index(path), raw_segments(path), raw_format(path)) == \
        (index0, segments0, format0)

    o = Opened(path)                    # the upgrade alone, as a writer's open runs it
    try:
        assert o.index.version == version
        assert not o.index.add_value_checksums()
        assert not any(step.run(path, o.index, o.backend) for step in upgrade.STEPS
                       if step.version <= version)
        for step in [st for st in upgrade.STEPS if st.version > version]:  # ... 5 -> 6
            assert step.run(path, o.index, o.backend)
            assert o.index.version == step.version
        assert o.index.version == 6
        assert upgrade.upgrade(path, o.index, o.backend) == version  # what FORMAT named
    finally:
        o.close()
    assert raw_index(path) == UPGRADE_OF[version](index0)
    assert raw_segments(path) == segments0
    created = json.loads(format0)["created"]
    assert format_file(path) == {"format": "snapstore", "version": 6, "created": created}
    upgraded_format = raw_format(path)

    with snapstore.open(path, durability="none") as s:      # recovery, verify, restores
        check_exact(s, exp, ids)
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    recovered, segments = raw_index(path), raw_segments(path)
    log0 = [n for n in exp["segments"] if n < fmt.LOG_SEGMENTS]
    nxt = f"{max(log0) + 1:016d}.seg"
    assert sorted(segments) == sorted([f"{n:016d}.seg" for n in exp["segments"]] + [nxt])
    assert segments[nxt] == new_segment(int(nxt[:16]))
    if exp["readonly_ids"] == ids:      # nothing to recover: nothing else changed
        assert recovered == UPGRADE_OF[version](index0)
        assert {k: v for k, v in segments.items() if k != nxt} == segments0
    else:                               # claims and groups of dead writers gone
        assert not recovered[fmt.DB_CLAIMS] and not recovered[fmt.DB_GROUPS]
    assert raw_format(path) == upgraded_format
    snapstore.open(path, durability="none").close()
    assert (raw_index(path), raw_segments(path), raw_format(path)) == \
        (recovered, segments, upgraded_format)
    assert index_version(path) == format_file(path)["version"] == UPGRADED_TO == 6


def test_delta_chunks_onto_an_upgraded_v4_store(tmp_path):
    """v4/floats after today's writer upgraded it: its weights, all changed a little, are stored
    as delta chunks (codec 3, format 5) in log 0's new segment of version 6, against the byte-
    plane chunks of its last weights checkpoint in its version 4 segments (a chunk entry of 33
    bytes until then); each delta chunk's entry names its base, whose count gains the edge.
    Everything restores byte-exact and verifies, also after a delete of the old checkpoints and
    a compaction, and for a reader."""
    import numpy as np
    path = copy("floats", tmp_path, 4)
    exp = expected_of("floats", 4)
    ids = [c["id"] for c in exp["checkpoints"]]
    head = exp["streams"]["weights"]["head"]
    rng = np.random.default_rng(5)
    with snapstore.open(path, durability="none", delta_chunks=True) as s:
        old = s.restore(head)
        dtypes = {"w32": np.float32, "w16": np.float16, "w64": np.float64}
        new = {k: (np.frombuffer(old[k], dtypes[k]) *
                   (1 + rng.normal(0, 0.01, len(old[k]) // np.dtype(dtypes[k]).itemsize))
                   ).astype(dtypes[k]) for k in old}
        info = s.checkpoint(new, stream="weights", meta={"step": 3})
        assert info.parent == head
        with s._committer.read() as r:
            entries = dict(r.chunks())
            old_chunks = {e[3] for i in range(len(r.checkpoint(head).buffers))
                          for e in fmt.EXTENT.iter_unpack(r.manifest(head, i))}
            mine = {e[3] for i in range(len(r.checkpoint(info.id).buffers))
                    for e in fmt.EXTENT.iter_unpack(r.manifest(info.id, i))}
        deltas = {c: entries[c] for c in mine if entries[c].codec == fmt.CODEC_DELTA_PLANES}
        assert deltas, "no delta chunk"
        last = max(n for n in s._committer.backend.list() if n < fmt.LOG_SEGMENTS)
        for c, e in deltas.items():
            assert e.base in old_chunks and entries[e.base].base is None
            assert entries[e.base].segment < last and e.segment == last
        with open(os.path.join(path, fmt.SEGMENTS_DIR, f"{last:016d}.seg"), "rb") as f:
            assert segment_version(f.read(32)) == TODAYS_SEGMENT_VERSION
        written = {k: sha(v.tobytes()) for k, v in new.items()}
        assert {k: sha(v) for k, v in s.restore(info.id).items()} == written
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
        for c in ids:
            if c != head:
                s.delete(c)
        s.delete(head)               # its chunks live on as the bases of the delta chunks
        s.compact(threshold=0.99)
        assert {k: sha(v) for k, v in s.restore(info.id).items()} == written
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    with snapstore.open(path, readonly=True) as s:
        assert [c.id for c in s.checkpoints()] == [info.id]
        assert {k: sha(v) for k, v in s.restore(info.id).items()} == written


# ---- both ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [1, 2, 3, 4, 5])
def test_upgrade_is_idempotent(tmp_path, version):
    store = "basic" if version < 5 else V5_STORES[0]
    path = copy(store, tmp_path, version)
    exp = expected_of(store, version)
    snapstore.open(path, durability="none").close()
    after_first, segments_first = raw_index(path), raw_segments(path)
    fmt_first = raw_format(path)
    o = Opened(path)
    try:
        assert o.index.version == 6
        assert not o.index.add_value_checksums()               # nothing left to do
        assert not any(step.run(path, o.index, o.backend) for step in upgrade.STEPS)
        assert upgrade.upgrade(path, o.index, o.backend) == 6
    finally:
        o.close()
    snapstore.open(path, durability="none").close()
    assert raw_index(path) == after_first
    assert raw_segments(path) == segments_first
    assert raw_format(path) == fmt_first
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, [c["id"] for c in exp["checkpoints"]])


@pytest.mark.parametrize("store", V6_STORES)
def test_v6_store_is_upgraded_by_nothing(store, tmp_path):
    """A store of today's format: no step finds work; index, segments and FORMAT stay byte for
    byte, and a writer's open adds no segment (log 0 goes on in its last one)."""
    path = copy(store, tmp_path, 6)
    exp = expected_of(store, 6)
    index0, segments0, format0 = raw_index(path), raw_segments(path), raw_format(path)
    assert index_version(path) == format_file(path)["version"] == 6
    o = Opened(path)
    try:
        assert o.index.version == 6
        assert not o.index.add_value_checksums()
        assert not any(step.run(path, o.index, o.backend) for step in upgrade.STEPS)
        assert upgrade.upgrade(path, o.index, o.backend) == 6
    finally:
        o.close()
    assert (raw_index(path), raw_segments(path), raw_format(path)) == \
        (index0, segments0, format0)
    with snapstore.open(path, durability="none") as s:
        check_exact(s, exp, [c["id"] for c in exp["checkpoints"]])
    assert sorted(raw_segments(path)) == sorted(segments0)
    assert raw_format(path) == format0


CHILD = r"""
import sys
import snapstore
with snapstore.open(sys.argv[1]) as s:
    s.checkpoints()
print("finished")
"""


def run_child(path: str, point: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SNAPSTORE_CRASH_AT=point,
               PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True,
                          text=True, timeout=120)


# (version, crash point, index format after the crash, FORMAT version after the crash)
CRASHES = [
    (1, "upgrade_before_index_commit", 1, 1),
    (1, "upgrade_before_state_mark", 2, 1),
    (1, "upgrade_v3_before_index_commit", 2, 1),
    (1, "upgrade_v5_before_index_commit", 4, 1),
    (1, "upgrade_v6_before_index_commit", 5, 1),
    (1, "upgrade_before_format", 6, 1),
    (1, "upgrade_after_format", 6, 6),
    (2, "upgrade_v3_before_index_commit", 2, 2),
    (2, "upgrade_v5_before_index_commit", 4, 2),
    (2, "upgrade_v6_before_index_commit", 5, 2),
    (2, "upgrade_before_format", 6, 2),
    (2, "upgrade_after_format", 6, 6),
    (3, "upgrade_v5_before_index_commit", 4, 3),
    (3, "upgrade_before_format", 6, 3),
    (3, "upgrade_after_format", 6, 6),
    (4, "upgrade_v5_before_index_commit", 4, 4),
    (4, "upgrade_v6_before_index_commit", 5, 4),
    (4, "upgrade_before_format", 6, 4),
    (4, "upgrade_after_format", 6, 6),
]


@pytest.mark.parametrize("version, point, index_after, format_after", CRASHES)
@pytest.mark.parametrize("store", ["basic", "unapplied"])
def test_crash_during_upgrade(tmp_path, store, version, point, index_after, format_after):
    path = copy(store, tmp_path, version)
    exp = expected_of(store, version)
    p = run_child(path, point)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr)
    assert index_version(path) == index_after
    assert format_file(path)["version"] == format_after
    assert format_after <= index_after          # FORMAT never runs ahead of the index
    if index_after < 3:                         # the 2 -> 3 transaction is all or nothing
        assert fmt.META_APPLIED in raw_index(path)[fmt.DB_META]
        assert not raw_index(path).get(fmt.DB_LOGS)
    # readers read it as it is: the first step that recovers the log (the log step of a v1
    # store, the 2 -> 3 step of a v2 store) ran before its crash point, so from there on they
    # see the recovered checkpoints; no step recovers a v3 store's logs (the writer's open
    # does, after the upgrade)
    recovered = point != "upgrade_before_index_commit" and version < 3
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, [c["id"] for c in exp["checkpoints"]] if recovered
                    else exp["readonly_ids"])
    with snapstore.open(path, durability="none") as s:      # the next writer finishes the job
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
        check_exact(s, exp, [c["id"] for c in exp["checkpoints"]])
    assert index_version(path) == 6 and format_file(path)["version"] == 6
    index = raw_index(path)
    assert log0_applied(index)[0] < fmt.LOG_SEGMENTS
    assert not index[fmt.DB_CLAIMS] and not index[fmt.DB_GROUPS]


@pytest.mark.parametrize("point", ["upgrade_before_index_commit", "upgrade_before_state_mark"])
def test_v2_store_never_reaches_the_format_1_steps(tmp_path, point):
    """A v2 store's values are sealed and its log is complete: a writer open passes neither of
    the 1 -> 2 steps' crash points and upgrades it to 6."""
    path = copy("basic", tmp_path, 2)
    p = run_child(path, point)
    assert (p.returncode, p.stdout.strip()) == (0, "finished"), p.stderr
    assert index_version(path) == format_file(path)["version"] == 6


@pytest.mark.parametrize("version", [1, 2])
def test_reader_open_across_the_upgrade(tmp_path, version):
    """A reader that opened the store at format 1 or 2 reads correctly after a writer (here in
    the same process, sharing the LMDB environment) upgraded it to 6: each read transaction
    knows the format of its own snapshot."""
    path = copy("basic", tmp_path, version)
    exp = expected_of("basic", version)
    ids = [c["id"] for c in exp["checkpoints"]]
    with snapstore.open(path, readonly=True) as reader:
        check_exact(reader, exp, ids)
        with snapstore.open(path, durability="none") as writer:
            check_exact(writer, exp, ids)
            check_exact(reader, exp, ids)
            info = writer.checkpoint({"n": b"after the upgrade"}, stream="new")
            assert reader.restore(info.id) == {"n": b"after the upgrade"}
        assert [c.id for c in reader.checkpoints()] == ids + [info.id]
        check_exact(reader, exp, ids, listed=False)
    assert index_version(path) == 6


def test_newer_index_or_format_is_refused(tmp_path):
    path = copy("basic", tmp_path)
    snapstore.open(path, durability="none").close()
    data = format_file(path)
    data["version"] = fmt.FORMAT_VERSION + 1
    with open(os.path.join(path, fmt.FORMAT_FILE), "w") as f:
        json.dump(data, f)
    for kw in ({}, {"readonly": True}):
        with pytest.raises(snapstore.errors.FormatError, match=str(fmt.FORMAT_VERSION + 1)):
            snapstore.open(path, **kw)


@pytest.mark.parametrize("point, lost_ok", [("upgrade_before_index_commit", False),
                                            ("upgrade_before_format", True)])
def test_repair_of_a_v1_store_without_its_index_knows_whether_the_log_is_complete(
        tmp_path, point, lost_ok):
    """FORMAT 1 and no index: repair cannot upgrade first. When the interrupted upgrade had
    written its state section the log is complete (every checkpoint rebuilt, ok); without
    it, what old compactions removed is reported lost (old_format). Regression: the state
    section was not looked for, and a complete rebuild reported ok=False."""
    path = copy("basic", tmp_path, 1)
    exp = expected_of("basic", 1)
    assert run_child(path, point).returncode == -signal.SIGKILL
    assert format_file(path)["version"] == 1
    shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
    report = snapstore.repair(path)
    assert report["ok"] == lost_ok
    assert ("old_format" in [p["kind"] for p in report["problems"]]) != lost_ok
    if lost_ok:
        with snapstore.open(path, readonly=True) as s:
            check_exact(s, exp, [c["id"] for c in exp["checkpoints"]])


def test_repair_refuses_an_index_of_a_newer_format(tmp_path):
    """An index a newer snapstore wrote (its version value sealed and valid) under an older
    FORMAT is a newer library's interrupted upgrade: repair raises FormatError and changes
    nothing. Regression: repair replaced it by a rebuild of today's format."""
    path = copy("basic", tmp_path, 4)
    env = lmdb.open(os.path.join(path, fmt.INDEX_DIR), max_dbs=16)
    with env.begin(write=True) as txn:
        db = env.open_db(fmt.DB_META, txn=txn, create=False)
        txn.put(fmt.META_FORMAT, seal(fmt.DB_META, fmt.META_FORMAT,
                                      fmt.U64.pack(fmt.FORMAT_VERSION + 1)), db=db)
    env.close()
    before = (raw_format(path), raw_index(path), raw_segments(path))
    with pytest.raises(snapstore.errors.FormatError, match="newer snapstore"):
        snapstore.repair(path)
    assert (raw_format(path), raw_index(path), raw_segments(path)) == before


@pytest.mark.parametrize("body, match", [
    (b"[" * 100000, "unreadable FORMAT"),
    (b'{"format": "snapstore", "version": "1"}', "invalid store format version"),
    (b'{"format": "snapstore", "version": 1.0}', "invalid store format version"),
    (b'{"format": "snapstore", "version": true}', "invalid store format version"),
    (b'{"format": "snapstore"}', "invalid store format version"),
    (b'{"format": "snapstore", "version": 0}', "invalid store format version"),
])
def test_a_damaged_format_file_is_a_format_error_that_says_so(tmp_path, body, match):
    path = copy("basic", tmp_path, 1)
    with open(os.path.join(path, fmt.FORMAT_FILE), "wb") as f:
        f.write(body)
    for call in (lambda: snapstore.open(path, readonly=True), lambda: snapstore.open(path),
                 lambda: snapstore.repair(path)):
        with pytest.raises(snapstore.errors.FormatError, match=match) as caught:
            call()
        assert "upgrade snapstore" not in str(caught.value)
        assert isinstance(caught.value, snapstore.errors.CorruptionError)   # damage
    with open(os.path.join(path, fmt.FORMAT_FILE), "rb") as f:
        assert f.read() == body                 # nothing "upgraded" it
    # the command line: damage (exit 1), not a usage error (2)
    proc = subprocess.run([console_script(), "ls", path], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1, proc.stderr


def _flip_first_segment_header(path: str) -> None:
    first = sorted(raw_segments(path))[0]
    with open(os.path.join(path, fmt.SEGMENTS_DIR, first), "r+b") as f:
        f.seek(fmt.SEGMENT_HEADER.size - 1)      # one bit of the header's checksum
        byte = f.read(1)[0]
        f.seek(fmt.SEGMENT_HEADER.size - 1)
        f.write(bytes([byte ^ 1]))


def _as_format_5(path: str) -> None:
    """Marks a store made today as format 5 (FORMAT and the index's META_FORMAT): what the
    5 -> 6 step changes, so the next writer's open runs the upgrade steps on it."""
    doc = format_file(path)
    doc["version"] = 5
    with open(os.path.join(path, fmt.FORMAT_FILE), "w") as f:
        json.dump(doc, f)
    env = lmdb.open(os.path.join(path, fmt.INDEX_DIR), max_dbs=fmt.INDEX_MAX_DBS)
    try:
        with env.begin(write=True) as txn:
            meta = env.open_db(fmt.DB_META, txn=txn, create=False)
            txn.put(fmt.META_FORMAT, seal(fmt.DB_META, fmt.META_FORMAT, fmt.U64.pack(5)),
                    db=meta)
    finally:
        env.close()


def _opened_adds_no_section(path: str) -> None:
    before, state = raw_segments(path), raw_index(path)[fmt.DB_META].get(fmt.META_LOG_STATE)
    with snapstore.open(path, durability="none"):
        pass                                     # a writer's open: the upgrade steps
    assert index_version(path) == fmt.FORMAT_VERSION
    added = {n: d for n, d in raw_segments(path).items() if n not in before}
    assert all(len(d) == fmt.SEGMENT_HEADER.size for d in added.values()), sorted(added)
    assert raw_index(path)[fmt.DB_META].get(fmt.META_LOG_STATE) == state


@pytest.mark.parametrize("version, store", [(3, "writers"), (4, "writers"), (5, "deltas")])
def test_a_damaged_first_segment_header_adds_no_state_section_to_an_old_store(
        tmp_path, version, store):
    path = copy(store, tmp_path, version)
    _flip_first_segment_header(path)
    _opened_adds_no_section(path)


def test_a_damaged_first_segment_header_never_brings_deleted_checkpoints_back(tmp_path):
    """Regression (a helper's review): the format 2 step asks the first segment's header
    whether the log is complete; with the header damaged ("cannot tell") a writer's open of
    a store of format 3 or later (never compacted: no state section yet) appended a state
    section of format 2's kind (no orders, log 0 only), and a later repair replayed the other
    logs' records over it: a deleted checkpoint and a removed tag came back. A format 3 or
    later index never needs that step."""
    path = str(tmp_path / "s")
    a, b = snapstore.open(path), snapstore.open(path)      # logs 0 and 1
    kept = b.checkpoint({"x": b"keep" * 1000}, stream="s")
    gone = b.checkpoint({"x": b"gone" * 1000}, stream="t")
    b.tag(kept.id, "t")
    a.untag(kept.id, "t")                        # log 0 undoes what log 1 did
    a.delete(gone.id)
    a.close()
    b.close()
    _as_format_5(path)                           # as a format 5 library left it
    _flip_first_segment_header(path)
    _opened_adds_no_section(path)
    shutil.rmtree(os.path.join(path, fmt.INDEX_DIR))
    report = snapstore.repair(path)
    assert [p["kind"] for p in report["problems"]] == ["damaged_segment_header"] or \
        all(p["kind"] != "lost_checkpoints" for p in report["problems"])
    with snapstore.open(path, readonly=True) as s:
        assert [(c.id, c.stream, sorted(c.tags)) for c in s.checkpoints()] == \
            [(kept.id, "s", [])]
