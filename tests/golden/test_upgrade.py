"""Upgrading format 1 stores to format 2 (snapstore/engine/upgrade.py), on copies of the golden
v1 stores (the stores themselves are never written: README.md).

- a readonly open changes nothing and reads format 1 values (no checksums) as they are;
- a writer open upgrades: every index value is the old payload sealed with its checksum,
  META_FORMAT is 2, FORMAT says 2 (its "created" kept); verify(deep=True) is clean and every
  checkpoint restores byte-exact, also for readers afterwards;
- upgrading again changes nothing (idempotent);
- a writer SIGKILLed at each upgrade crash point leaves a store that readers read byte-exact
  and the next writer open upgrades;
- a reader that opened the store before a writer upgraded it keeps reading it correctly;
- copies of the v2 stores stay format 2 under today's writer: the upgrade is a no-op for them
  (index, segments and FORMAT byte for byte the same; recovery only cuts torn tails and applies
  what the log holds ahead of the index). A format bump changes V2_AFTER_WRITER_OPEN.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import lmdb
import pytest

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine import upgrade
from snapstore.engine.backends import LocalSegments
from snapstore.engine.index import Index, unseal

HERE = os.path.dirname(os.path.abspath(__file__))
V1 = os.path.join(HERE, "stores", "v1")
STORES = sorted(os.path.basename(os.path.dirname(p))
                for p in glob.glob(os.path.join(V1, "*", "FORMAT")))
PKG_ROOT = os.path.dirname(os.path.dirname(HERE))


def sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_of(store: str) -> dict:
    with open(os.path.join(V1, store, "expected.json")) as f:
        return json.load(f)


def copy(store: str, tmp_path) -> str:
    dst = os.path.join(str(tmp_path), store)
    shutil.copytree(os.path.join(V1, store), dst, ignore=shutil.ignore_patterns("expected.json"))
    return dst


def format_file(path: str) -> dict:
    with open(os.path.join(path, fmt.FORMAT_FILE)) as f:
        return json.load(f)


def raw_index(path: str) -> dict:
    """{database: {key: value}} exactly as stored."""
    env = lmdb.open(os.path.join(path, fmt.INDEX_DIR), readonly=True, lock=False,
                    max_dbs=fmt.INDEX_MAX_DBS)
    try:
        with env.begin() as txn:
            present = {key for key, _ in txn.cursor()}     # the named databases it has
            return {name: dict(txn.cursor(db=env.open_db(name, txn=txn, create=False)))
                    for name in fmt.INDEX_DBS if name in present}
    finally:
        env.close()


def index_version(path: str) -> int:
    value = raw_index(path)[fmt.DB_META][fmt.META_FORMAT]
    if len(value) == 8:
        return fmt.U64.unpack(value)[0]
    return fmt.U64.unpack(unseal(fmt.DB_META, fmt.META_FORMAT, value, fmt.FORMAT_VERSION))[0]


def assert_sealed(before: dict, after: dict) -> None:
    """`after` holds the payloads of `before` (a format 1 index), each sealed with its
    checksum, and META_FORMAT 2."""
    for name in fmt.INDEX_DBS:
        assert set(after[name]) == set(before[name]), name
        for key, value in after[name].items():
            payload = unseal(name, key, value, fmt.FORMAT_VERSION)
            if (name, key) == (fmt.DB_META, fmt.META_FORMAT):
                assert payload == fmt.U64.pack(2) and before[name][key] == fmt.U64.pack(1)
            else:
                assert payload == before[name][key], (name, key)


def check_exact(store, exp: dict, ids, listed: bool = True) -> None:
    """The checkpoints `ids` restore byte-exact (and, if listed, are all the store lists)."""
    by_id = {c["id"]: c for c in exp["checkpoints"]}
    if listed:
        assert [c.id for c in store.checkpoints()] == list(ids)
    for cid in ids:
        assert {k: sha(v) for k, v in store.restore(cid).items()} == \
            {b["name"]: b["sha256"] for b in by_id[cid]["buffers"]}


@pytest.mark.parametrize("store", STORES)
def test_readonly_open_reads_v1_and_changes_nothing(store, tmp_path):
    path = copy(store, tmp_path)
    exp = expected_of(store)
    before = raw_index(path)
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, exp["readonly_ids"])
        assert s.verify()["ok"]
    assert raw_index(path) == before
    assert format_file(path)["version"] == 1


@pytest.mark.parametrize("store", STORES)
def test_writer_open_upgrades_each_v1_store(store, tmp_path):
    path = copy(store, tmp_path)
    exp = expected_of(store)
    created = format_file(path)["created"]
    before = raw_index(path)
    # the index step alone (no recovery yet): exactly the old payloads, sealed
    lock = os.open(os.path.join(path, fmt.LOCK_FILE), os.O_RDWR | os.O_CREAT)
    index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=False, durable=True)
    backend = LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR))
    try:
        assert index.version == 1
        assert upgrade.STEPS[0].run(path, index, backend)
        assert index.version == 2
    finally:
        index.close()
    assert_sealed(before, raw_index(path))
    # then the whole upgrade: the log step notes the state section it wrote
    index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=False, durable=True)
    try:
        assert upgrade.upgrade(path, index, backend) == 1
        with index.read() as r:
            assert r.log_state() is not None
    finally:
        index.close()
        os.close(lock)
    assert format_file(path) == {"format": "snapstore", "version": 2, "created": created}
    # and through the public API: recovery, verify, restores, readers
    ids = [c["id"] for c in exp["checkpoints"]]
    with snapstore.open(path, durability="none") as s:
        check_exact(s, exp, ids)
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, ids)
    assert index_version(path) == 2 and format_file(path)["version"] == 2


def test_upgrade_is_idempotent(tmp_path):
    path = copy("basic", tmp_path)
    exp = expected_of("basic")
    snapstore.open(path, durability="none").close()
    after_first = raw_index(path)
    fmt_first = format_file(path)
    index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=False, durable=True)
    try:
        assert not index.add_value_checksums()               # nothing left to do
        backend = LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR))
        assert not any(step.run(path, index, backend) for step in upgrade.STEPS)
        assert upgrade.upgrade(path, index, backend) == 2
    finally:
        index.close()
    snapstore.open(path, durability="none").close()
    assert raw_index(path) == after_first
    assert format_file(path) == fmt_first
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, [c["id"] for c in exp["checkpoints"]])


def test_format_file_older_than_its_index_is_finished(tmp_path):
    """FORMAT still 1 over a format 2 index (a crash between the two): a reader reads it, the
    next writer publishes FORMAT 2 and leaves the index as it is (but for the note of the log
    step, which had not run)."""
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
    assert format_file(path)["version"] == 2
    after = raw_index(path)
    # the one change: the log step (a state section for the format 1 log) noted in the index
    assert after[fmt.DB_META].pop(fmt.META_LOG_STATE) is not None
    assert after == sealed


CHILD = r"""
import sys
import snapstore
with snapstore.open(sys.argv[1]) as s:
    s.checkpoints()
print("finished")
"""


@pytest.mark.parametrize("point, index_after, format_after", [
    ("upgrade_before_index_commit", 1, 1),
    ("upgrade_before_state_mark", 2, 1),
    ("upgrade_before_format", 2, 1),
    ("upgrade_after_format", 2, 2),
])
@pytest.mark.parametrize("store", ["basic", "unapplied"])
def test_crash_during_upgrade(tmp_path, store, point, index_after, format_after):
    path = copy(store, tmp_path)
    exp = expected_of(store)
    env = dict(os.environ, SNAPSTORE_CRASH_AT=point,
               PYTHONPATH=PKG_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHILD, path], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stdout, p.stderr)
    assert index_version(path) == index_after
    assert format_file(path)["version"] == format_after
    # readers read it as it is: the log step recovered the log before it wrote its state
    # section, so from its crash point on they see the recovered checkpoints
    recovered = point != "upgrade_before_index_commit"
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, [c["id"] for c in exp["checkpoints"]] if recovered
                    else exp["readonly_ids"])
    with snapstore.open(path, durability="none") as s:      # the next writer finishes the job
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
        check_exact(s, exp, [c["id"] for c in exp["checkpoints"]])
    assert index_version(path) == 2 and format_file(path)["version"] == 2


def test_reader_open_across_the_upgrade(tmp_path):
    """A reader that opened the store at format 1 reads correctly after a writer (here in
    the same process, sharing the LMDB environment) upgraded it: each read transaction knows
    the format of its own snapshot."""
    path = copy("basic", tmp_path)
    exp = expected_of("basic")
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
    assert index_version(path) == 2


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


# ---- format 2 stores under today's writer ------------------------------------------------------
V2 = os.path.join(HERE, "stores", "v2")
V2_STORES = sorted(os.path.basename(os.path.dirname(p))
                   for p in glob.glob(os.path.join(V2, "*", "FORMAT")))
# The format version today's writer open leaves a format 2 store at. 2: no upgrade, every step
# finds its work done (values sealed, the log complete), and the store is unchanged but for
# recovery. A format bump sets this to the new version: then the store must still read the
# same; what its upgrade changes is that format's to pin (the "unchanged" checks below apply
# while this is 2).
V2_AFTER_WRITER_OPEN = 3
# The torn record a writer's recovery cuts from the last segment: a 24-byte header and 6 of
# the 1000 payload bytes it promises.
V2_TORN_TAIL = {"unapplied": 30, "interrupted": 30}


def raw_segments(path: str) -> dict:
    out = {}
    for p in sorted(glob.glob(os.path.join(path, fmt.SEGMENTS_DIR, "*.seg"))):
        with open(p, "rb") as f:
            out[os.path.basename(p)] = f.read()
    return out


def raw_format(path: str) -> bytes:
    with open(os.path.join(path, fmt.FORMAT_FILE), "rb") as f:
        return f.read()


@pytest.mark.parametrize("store", V2_STORES)
def test_v2_store_under_todays_writer(store, tmp_path):
    path = os.path.join(str(tmp_path), store)
    shutil.copytree(os.path.join(V2, store), path, ignore=shutil.ignore_patterns("expected.json"))
    with open(os.path.join(V2, store, "expected.json")) as f:
        exp = json.load(f)
    ids = [c["id"] for c in exp["checkpoints"]]
    index0, segments0, format0 = raw_index(path), raw_segments(path), raw_format(path)
    assert index_version(path) == 2 and format_file(path)["version"] == 2
    with snapstore.open(path, readonly=True) as s:          # readers change nothing
        check_exact(s, exp, exp["readonly_ids"])
    assert (raw_index(path), raw_segments(path), raw_format(path)) == \
        (index0, segments0, format0)

    # the upgrade alone, as a writer's open runs it before recovery
    lock = os.open(os.path.join(path, fmt.LOCK_FILE), os.O_RDWR | os.O_CREAT)
    index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=False, durable=True)
    backend = LocalSegments(os.path.join(path, fmt.SEGMENTS_DIR))
    try:
        assert index.version == 2
        assert upgrade.upgrade(path, index, backend) == 2    # the version FORMAT named
        assert index.version == V2_AFTER_WRITER_OPEN
    finally:
        index.close()
        os.close(lock)
    if V2_AFTER_WRITER_OPEN == 2:                            # a no-op for a format 2 store
        assert (raw_index(path), raw_segments(path), raw_format(path)) == \
            (index0, segments0, format0)

    # and through the public API: recovery, verify, restores, readers afterwards
    with snapstore.open(path, durability="none") as s:
        check_exact(s, exp, ids)
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    with snapstore.open(path, readonly=True) as s:
        check_exact(s, exp, ids)
    assert index_version(path) == format_file(path)["version"] == V2_AFTER_WRITER_OPEN
    if V2_AFTER_WRITER_OPEN == 2:
        assert raw_format(path) == format0                   # not even rewritten
        last = max(segments0)
        cut = V2_TORN_TAIL.get(store, 0)
        assert raw_segments(path) == {n: (data[:len(data) - cut] if n == last else data)
                                      for n, data in segments0.items()}
        if exp["readonly_ids"] == ids:      # nothing for recovery to apply: the same values
            assert raw_index(path) == index0
