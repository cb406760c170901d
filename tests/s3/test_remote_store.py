"""S3 stores against a real server (SeaweedFS): the Store API over a bucket.

The boring cases first (nothing changed, everything changed, empty, one byte, the same call
twice, after close(), after fork()), then what only an S3 store has: a new machine (an empty
cache) opens the store from the bucket alone, one winner per race on a stream, damaged
objects in the bucket, and a cache that belongs to another store of the same URL.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import snapstore
from snapstore.errors import (CheckpointNotFound, CommitConflict, CorruptionError,
                              FormatError, InvalidArgumentError, ReadOnlyError,
                              StoreClosedError, ForkedStoreError)
from snapstore.remote import layout

MiB = 1 << 20


@pytest.fixture
def url(s3):
    return f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"


def open_store(url, cache, **kw):
    return snapstore.open(url, cache_dir=str(cache), **kw)


def state(n=4 * MiB, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def test_round_trip_and_a_new_machine_restores_from_the_bucket_alone(url, tmp_path):
    a = state()
    with open_store(url, tmp_path / "c1") as s:
        first = s.checkpoint({"a": a, "one": b"x", "empty": b""}, stream="s", meta={"step": 1})
        a[::65536] ^= 0xFF
        second = s.checkpoint({"a": a, "one": b"y", "empty": b""}, stream="s")
        assert (first.kind, second.kind) == ("full", "incremental")
        assert second.parent == first.id and second.seq == 2
        assert s.restore(second.id)["a"] == a.tobytes()
    with open_store(url, tmp_path / "empty") as s:       # another machine: nothing cached
        assert [c.id for c in s.checkpoints("s")] == [first.id, second.id]
        out = s.restore(second.id)
        assert out == {"a": a.tobytes(), "one": b"y", "empty": b""}
        assert s.restore(first.id)["one"] == b"x"
        assert s.get(first.id).meta == {"step": 1}
        assert s.read(second.id, "a", 100, 10) == a.tobytes()[100:110]


def test_nothing_changed_everything_changed_empty_and_one_byte(url, tmp_path):
    with open_store(url, tmp_path / "c") as s:
        a = state(1 * MiB)
        s.checkpoint({"a": a}, stream="s")
        same = s.checkpoint({"a": a}, stream="s")          # nothing changed
        assert same.bytes_new < 4096
        changed = s.checkpoint({"a": state(1 * MiB, seed=9)}, stream="s")
        assert changed.kind == "full" and changed.bytes_new > MiB
        empty = s.checkpoint({}, stream="empty")
        assert s.restore(empty.id) == {}
        one = s.checkpoint({"b": b"\x01"}, stream="one")
        assert s.restore(one.id) == {"b": b"\x01"}
        assert s.restore(same.id)["a"] == a.tobytes()


def test_the_same_call_twice_and_ids_grow(url, tmp_path):
    with open_store(url, tmp_path / "c") as s:
        i1 = s.checkpoint({"a": b"abc"}, stream="s")
        i2 = s.checkpoint({"a": b"abc"}, stream="s")
        assert i2.id > i1.id and i2.seq == i1.seq + 1
        s.delete(i1.id)
        with pytest.raises(CheckpointNotFound):
            s.delete(i1.id)
        s.tag(i2.id, "t")
        s.tag(i2.id, "t")
        assert s.get("t").id == i2.id


def test_one_winner_per_race_on_a_stream_and_other_streams_pass(url, tmp_path):
    with open_store(url, tmp_path / "c1") as a, open_store(url, tmp_path / "c2") as b:
        base = a.checkpoint({"x": b"0"}, stream="s")
        a.checkpoint({"x": b"a"}, stream="s", expect_head=base.id)
        with pytest.raises(CommitConflict) as e:
            b.checkpoint({"x": b"b"}, stream="s", expect_head=base.id)
        assert e.value.stream == "s" and e.value.expected == base.id
        b.checkpoint({"x": b"other"}, stream="t")
        b.refresh()
        assert b.restore(b.latest("s").id) == {"x": b"a"}


def test_a_commit_planned_on_a_head_that_moves_conflicts(url, tmp_path, monkeypatch):
    """b plans on head H; a commits onto H before b's ref write: b's conditional write of
    the ref must lose (never a lost update), and nothing of b's is visible."""
    from snapstore.remote import refs
    with open_store(url, tmp_path / "c1") as a, open_store(url, tmp_path / "c2") as b:
        a.checkpoint({"x": b"0"}, stream="s")
        real_write = refs.write
        raced = []

        def write_after_a(client, old, new):
            if new.writer == b._committer.writer_id and not raced:
                raced.append(a.checkpoint({"x": b"a"}, stream="s"))
            return real_write(client, old, new)
        monkeypatch.setattr(refs, "write", write_after_a)
        with pytest.raises(CommitConflict) as e:
            b.checkpoint({"x": b"b"}, stream="s")
        assert e.value.found == raced[0].id
        b.refresh()
        assert [c.id for c in b.checkpoints("s")][-1] == raced[0].id
        assert b.restore("s") == {"x": b"a"}


def test_dedup_across_writers(url, tmp_path, s3):
    a_state = state(8 * MiB, seed=1)
    with open_store(url, tmp_path / "c1") as a:
        a.checkpoint({"w": a_state}, stream="one")
    with open_store(url, tmp_path / "c2") as b:
        b.checkpoint({"w": a_state}, stream="two")
    client = s3.client()
    total = sum(o["Size"] for o in client.list_objects_v2(
        Bucket=s3.bucket, Prefix=s3.prefix + layout.SEGMENTS_DIR).get("Contents", []))
    assert total < 1.1 * a_state.nbytes


def test_after_close_every_call_raises(url, tmp_path):
    s = open_store(url, tmp_path / "c")
    info = s.checkpoint({"a": b"1"}, stream="s")
    s.close()
    s.close()
    for call in (lambda: s.checkpoint({"a": b"1"}), lambda: s.restore(info.id),
                 lambda: s.checkpoints(), lambda: s.delete(info.id), s.refresh):
        with pytest.raises(StoreClosedError):
            call()


def test_a_forked_child_must_open_its_own(url, tmp_path):
    s = open_store(url, tmp_path / "c")
    s.checkpoint({"a": b"1"}, stream="s")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            s.checkpoint({"a": b"2"}, stream="s")
            code = 1
        except ForkedStoreError:
            code = 0
        os.write(w, bytes([code]))
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 1) == b"\x00"
    assert s.checkpoint({"a": b"3"}, stream="s").seq == 2
    s.close()


def test_readonly_and_not_a_store(url, tmp_path):
    with pytest.raises(FormatError):
        open_store(url, tmp_path / "c", create=False)
    with open_store(url, tmp_path / "c") as s:
        s.checkpoint({"a": b"1"}, stream="s")
    with open_store(url, tmp_path / "r", readonly=True) as r:
        assert r.restore("s") == {"a": b"1"}
        with pytest.raises(ReadOnlyError):
            r.checkpoint({"a": b"2"}, stream="s")


@pytest.mark.parametrize("bad", ["s3://", "s3://ab/x", "s3://Upper/x", "s3://b_b_b/x",
                                 "s3://bucket/a//b", "s3://bucket/../x"])
def test_bad_urls_are_refused(bad, tmp_path):
    with pytest.raises(InvalidArgumentError):
        snapstore.open(bad, cache_dir=str(tmp_path))


def test_options_that_do_not_apply(url, tmp_path):
    with pytest.raises(InvalidArgumentError):
        snapstore.open(str(tmp_path / "local"), cache_dir=str(tmp_path))
    with pytest.raises(InvalidArgumentError):
        snapstore.open(url, cache_dir=str(tmp_path), durability="fsync")
    with pytest.raises(InvalidArgumentError):
        snapstore.open(url, cache_dir=str(tmp_path), remote_timeout=0)


def test_a_damaged_checkpoint_object_is_corruption_never_wrong_bytes(url, tmp_path, s3):
    with open_store(url, tmp_path / "c") as s:
        info = s.checkpoint({"a": state(MiB)}, stream="s")
    client = s3.client()
    key = s3.prefix + layout.checkpoint_key(info.id)
    data = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
    data[len(data) // 2] ^= 1
    client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(data))
    with pytest.raises(CorruptionError, match="checkpoint object"):
        open_store(url, tmp_path / "fresh")


def test_a_damaged_segment_is_corruption_never_wrong_bytes(url, tmp_path, s3):
    a = state(MiB)
    with open_store(url, tmp_path / "c") as s:
        info = s.checkpoint({"a": a}, stream="s", )
    client = s3.client()
    seg_keys = [o["Key"] for o in client.list_objects_v2(
        Bucket=s3.bucket, Prefix=s3.prefix + layout.SEGMENTS_DIR)["Contents"]]
    for key in seg_keys:
        data = bytearray(client.get_object(Bucket=s3.bucket, Key=key)["Body"].read())
        data[-100] ^= 1
        client.put_object(Bucket=s3.bucket, Key=key, Body=bytes(data))
    with open_store(url, tmp_path / "fresh") as s:
        with pytest.raises(CorruptionError):
            s.restore(info.id)


def test_a_cache_of_another_store_at_the_same_url_is_dropped(url, tmp_path, s3):
    with open_store(url, tmp_path / "c") as s:
        s.checkpoint({"a": b"old"}, stream="s")
    client = s3.client()
    for o in client.list_objects_v2(Bucket=s3.bucket, Prefix=s3.prefix)["Contents"]:
        client.delete_object(Bucket=s3.bucket, Key=o["Key"])
    with open_store(url, tmp_path / "c") as s:
        assert s.checkpoints() == []
        s.checkpoint({"a": b"new"}, stream="s")
        assert s.restore("s") == {"a": b"new"}


def test_seq_is_never_reused_after_every_checkpoint_is_deleted(url, tmp_path):
    with open_store(url, tmp_path / "c") as s:
        i1 = s.checkpoint({"a": b"1"}, stream="s")
        s.delete(i1.id)
        assert s.latest("s") is None
        i2 = s.checkpoint({"a": b"2"}, stream="s")
        assert i2.seq == 2 and i2.id > i1.id


def test_processes_race_one_winner(url, tmp_path):
    with open_store(url, tmp_path / "c") as s:
        base = s.checkpoint({"x": b"0"}, stream="s")
    code = f"""
import sys, snapstore
s = snapstore.open({url!r}, cache_dir=sys.argv[1])
try:
    s.checkpoint({{"x": sys.argv[1].encode()}}, stream="s", expect_head={base.id})
    print("won")
except snapstore.CommitConflict:
    print("lost")
s.close()
"""
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / f"p{i}")],
                              stdout=subprocess.PIPE, text=True, env=os.environ.copy())
             for i in range(4)]
    outs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert sorted(outs) == ["lost", "lost", "lost", "won"], outs


def test_the_block_cache_keeps_to_its_limit(url, tmp_path, monkeypatch):
    monkeypatch.setenv("SNAPSTORE_CACHE_BYTES", str(3 * MiB))
    a = state(8 * MiB, seed=5)
    with open_store(url, tmp_path / "w") as s:
        info = s.checkpoint({"a": a}, stream="s", )
    with open_store(url, tmp_path / "r") as s:
        assert s.restore(info.id)["a"] == a.tobytes()
        assert s.restore(info.id)["a"] == a.tobytes()      # evicted blocks fetched again
    ranges = [p for p in tmp_path.rglob("ranges/*") if p.is_file()]
    assert sum(p.stat().st_size for p in ranges if "/r/" in str(p)) <= 3 * MiB + MiB
    monkeypatch.setenv("SNAPSTORE_CACHE_BYTES", "lots")
    with pytest.raises(InvalidArgumentError, match="SNAPSTORE_CACHE_BYTES"):
        open_store(url, tmp_path / "x")


def test_copy_between_local_and_s3_sends_only_missing_chunks(url, tmp_path, s3):
    """snapstore copy SRC DST works between any two stores: local -> S3 -> S3 -> local."""
    from snapstore.copying import copy_checkpoints
    a = state(4 * MiB, seed=11)
    with snapstore.open(tmp_path / "local") as local:
        first = local.checkpoint({"a": a}, stream="s", meta={"m": 1})
        local.tag(first.id, "v1")
        a[::100_000] ^= 1
        second = local.checkpoint({"a": a}, stream="s")
        with open_store(url, tmp_path / "c") as remote:
            copy_checkpoints(local, remote)
            ids = [c.id for c in remote.checkpoints("s")]
            assert len(ids) == 2 and remote.get("v1").meta == {"m": 1}
            assert remote.restore(ids[-1])["a"] == a.tobytes()
            client = s3.client()

            def bucket_bytes():
                return sum(o["Size"] for o in client.list_objects_v2(
                    Bucket=s3.bucket, Prefix=s3.prefix).get("Contents", []))
            before = bucket_bytes()
            copy_checkpoints(local, remote)                      # again: nothing to send
            assert [c.id for c in remote.checkpoints("s")] == ids
            assert bucket_bytes() - before < 64 << 10
            other_url = url + "-copy"
            with open_store(other_url, tmp_path / "c2") as other:
                copy_checkpoints(remote, other)                  # S3 -> S3
                assert other.restore(other.latest("s").id)["a"] == a.tobytes()
        with snapstore.open(tmp_path / "back") as back:
            with open_store(url, tmp_path / "c3") as remote:
                copy_checkpoints(remote, back)                   # S3 -> local
            assert back.restore(back.latest("s").id)["a"] == a.tobytes()
    assert second.id



def test_copy_of_a_rolled_back_stream_into_s3_and_back(url, tmp_path):
    """A stream rolled back by importing a savepoint of its first checkpoint (the newest is
    then the same checkpoint as the first): each source checkpoint gets its own copy in the
    bucket and back, latest names the same bytes everywhere, and reruns copy nothing."""
    from snapstore.copying import copy_checkpoints
    with snapstore.open(tmp_path / "local") as local:
        first = local.checkpoint({"w": b"\1" * 300_000}, stream="s", meta={"step": 1})
        snapstore.export_savepoint(local, first.id, str(tmp_path / "one.snap"))
        local.checkpoint({"w": b"\2" * 300_000}, stream="s", meta={"step": 2})
        rollback = snapstore.import_savepoint(local, str(tmp_path / "one.snap"))
        local.tag(rollback.id, "release")
        with open_store(url, tmp_path / "c") as remote:
            result = copy_checkpoints(local, remote)
            assert len(result.copied) == 3 and result.skipped == {}
            assert remote.latest("s").id == result.copied[rollback.id]
            assert remote.resolve("release").id == result.copied[rollback.id]
            assert remote.restore("latest:s") == local.restore("latest:s")
            again = copy_checkpoints(local, remote)
            assert again.copied == {} and again.skipped == result.copied
        with snapstore.open(tmp_path / "back") as back:
            with open_store(url, tmp_path / "c2") as remote:
                assert len(copy_checkpoints(remote, back).copied) == 3
                assert copy_checkpoints(remote, back).copied == {}
                assert copy_checkpoints(local, remote).copied == {}
            assert back.restore("latest:s") == local.restore("latest:s")

def test_a_cache_dir_that_is_a_file_is_a_store_io_error(url, tmp_path):
    """A raw NotADirectoryError came out of the open before."""
    from snapstore.errors import StoreIOError
    afile = tmp_path / "afile"
    afile.write_text("x")
    for cache_dir in (afile, afile / "sub"):
        with pytest.raises(StoreIOError, match="cache directory"):
            snapstore.open(url, cache_dir=str(cache_dir))
    with snapstore.open(url, cache_dir=str(tmp_path / "fine")) as s:     # nothing held
        assert s.checkpoint({"a": b"x"}).id


def test_segments_in_the_bucket_are_of_version_4_which_format_4_snapstores_read(
        url, s3, tmp_path, monkeypatch):
    """An S3 store writes no delta chunks and rotates byte planes by 1 bit only, so its
    segments keep header version 4: a snapstore of format 4 (which refuses segment headers
    newer than 4 with FormatError, and plane flags other than 0 and 1) shares the bucket during
    a rolling upgrade. A local store's segments are version 6."""
    from snapstore.engine import format as fmt
    floats = np.random.default_rng(1).normal(0, 0.02, 1 << 18).astype(np.float32)
    a = state(1 * MiB)
    # compression_level 3: a local store would rotate float32 planes by 3 (format 6)
    with open_store(url, tmp_path / "c1", compression_level=3) as s:
        first = s.checkpoint({"a": a, "w": floats}, stream="s")      # planes: codec 2
        s.checkpoint({"a": a, "w": floats * 2}, stream="s")
        s.flush()
    client = s3.client()
    keys = [o["Key"] for o in client.list_objects_v2(
        Bucket=s3.bucket, Prefix=s3.key(layout.SEGMENTS_DIR)).get("Contents", [])]
    assert keys
    planes = 0
    for key in keys:
        head = client.get_object(Bucket=s3.bucket, Key=key, Range="bytes=0-31")["Body"].read()
        assert fmt.SEGMENT_HEADER.unpack(head)[1] == 4, key
        body = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
        pos = fmt.SEGMENT_HEADER.size
        while pos + fmt.RECORD_HEADER.size <= len(body):
            magic, rtype, codec, _, length, _, _ = fmt.RECORD_HEADER.unpack_from(body, pos)
            if magic != fmt.RECORD_MAGIC:
                break                               # a pack's index after its records
            if rtype == fmt.REC_CHUNK and codec == fmt.CODEC_PLANES:
                at = pos + fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size
                assert fmt.PLANES_HEADER.unpack_from(body, at)[1] == fmt.PLANES_ROTATE, key
                planes += 1
            pos += fmt.RECORD_HEADER.size + length
    assert planes                                   # the float buffer's chunks were planes
    # what a format-4 snapstore knows of segments, from an empty cache (another machine)
    with monkeypatch.context() as m:
        m.setattr(fmt, "SEGMENT_VERSION", 4)
        m.setattr(fmt, "SEGMENT_CODECS", {v: c for v, c in fmt.SEGMENT_CODECS.items()
                                          if v <= 4})
        m.setattr(fmt, "SEGMENT_RECORD_TYPES",
                  {v: t for v, t in fmt.SEGMENT_RECORD_TYPES.items() if v <= 4})
        with open_store(url, tmp_path / "old-machine") as s:
            assert s.restore(first.id) == {"a": a.tobytes(), "w": floats.tobytes()}
            assert s.verify(deep=True)["ok"]
    local = tmp_path / "local"
    with snapstore.open(local) as s:
        s.checkpoint({"a": a})
    seg = sorted((local / fmt.SEGMENTS_DIR).iterdir())[0].read_bytes()[:32]
    assert fmt.SEGMENT_HEADER.unpack(seg)[1] == fmt.SEGMENT_VERSION == 6


def test_a_bucket_with_version_5_segments_goes_on_in_version_4(url, s3, tmp_path,
                                                               monkeypatch):
    """The first release of format 5 wrote S3 segments of version 5: they are read as ever,
    and the writer that continues such a log starts a segment of version 4."""
    from snapstore.engine import format as fmt
    a = state(1 * MiB, seed=3)
    with monkeypatch.context() as m:
        m.setattr(layout, "SEGMENT_VERSION", 5)
        with open_store(url, tmp_path / "c") as s:
            first = s.checkpoint({"a": a}, stream="s")
    a2 = a.copy()
    a2[::4096] ^= 1
    with open_store(url, tmp_path / "c") as s:              # the same cache: the same log
        second = s.checkpoint({"a": a2}, stream="s")
        s.flush()
    client = s3.client()
    versions = {}
    for o in client.list_objects_v2(Bucket=s3.bucket,
                                    Prefix=s3.key(layout.SEGMENTS_DIR)).get("Contents", []):
        head = client.get_object(Bucket=s3.bucket, Key=o["Key"],
                                 Range="bytes=0-31")["Body"].read()
        versions[o["Key"]] = fmt.SEGMENT_HEADER.unpack(head)[1]
    assert sorted(versions.values()) == [4, 5], versions
    with open_store(url, tmp_path / "other") as s:
        assert s.restore(first.id)["a"] == a.tobytes()
        assert s.restore(second.id)["a"] == a2.tobytes()


def test_the_cache_index_is_stamped_with_the_oldest_format_that_reads_it(url, tmp_path):
    """A new cache index says layout.CACHE_INDEX_VERSION (5), not this library's format (6):
    format 6 changed nothing an S3 cache holds, and a snapstore of format 5 refuses an index
    stamped 6 with FormatError (a review found a shared cache directory refused so). A cache
    stamped 5 by an older library is used as it is."""
    import lmdb
    from snapstore.engine import format as fmt
    from snapstore.engine.index import unseal
    cache = tmp_path / "c"
    with open_store(url, cache) as s:
        s.checkpoint({"a": b"x" * 5000}, stream="s")
    [data] = list(cache.rglob(fmt.INDEX_DATA_FILE))

    def stamped() -> int:
        env = lmdb.open(str(data.parent), readonly=True, lock=False, max_dbs=16)
        try:
            with env.begin() as txn:
                raw = txn.get(fmt.META_FORMAT, db=env.open_db(fmt.DB_META, txn=txn))
        finally:
            env.close()
        return fmt.U64.unpack(unseal(fmt.DB_META, fmt.META_FORMAT, raw, fmt.FORMAT_VERSION))[0]
    assert stamped() == layout.CACHE_INDEX_VERSION == 5 < fmt.FORMAT_VERSION
    with open_store(url, cache) as s:                       # used again, as it is
        assert s.restore(s.latest("s").id) == {"a": b"x" * 5000}
        s.checkpoint({"a": b"y" * 5000}, stream="s")
    assert stamped() == 5


def test_stream_names_too_long_for_an_object_key_are_refused_before_anything_is_written(
        url, tmp_path):
    """Regression (a helper's review): a stream of 128-255 UTF-8 bytes (valid for a local
    store) was planned and uploaded, and then its ref write failed on SeaweedFS with HTTP 400
    KeyTooLongError, a message not naming the stream (its ref key holds the name's hex, and
    the server takes at most 255 bytes for a key's last part). An S3 store refuses it first."""
    from snapstore.remote.layout import MAX_KEY_NAME_BYTES
    with snapstore.open(url, cache_dir=str(tmp_path / "w")) as s:
        ok = s.checkpoint({"b": b"1"}, stream="x" * MAX_KEY_NAME_BYTES)
        before = s.stats()["segment_bytes"]
        for name in ("x" * (MAX_KEY_NAME_BYTES + 1), "é" * 64, "y" * 255):
            with pytest.raises(snapstore.errors.InvalidArgumentError, match="at most 127"):
                s.checkpoint({"b": b"2"}, stream=name)
        assert s.stats()["segment_bytes"] == before
        assert s.streams() == ["x" * MAX_KEY_NAME_BYTES]
    with snapstore.open(url, cache_dir=str(tmp_path / "fresh")) as r:
        assert r.restore(ok.id) == {"b": b"1"}


def test_a_deep_verify_reads_the_buckets_refs_and_checkpoint_objects(s3, url, tmp_path):
    """Regression (a helper's review): on a machine whose cache held them, a deep verify
    checked the segments in the bucket but not the refs and checkpoint objects, and said ok
    with one object damaged and another deleted, while a new machine could not even open the
    store. Both are reported now, from the bucket; a healthy store stays ok."""
    from snapstore.remote import layout
    client = s3.client()
    with snapstore.open(url, cache_dir=str(tmp_path / "w")) as s:
        s.checkpoint({"b": b"1" * 10000}, stream="good")
        bad = s.checkpoint({"b": b"2" * 10000}, stream="bad")
        gone = s.checkpoint({"b": b"3" * 10000}, stream="gone")
        assert s.verify(deep=True)["ok"]
        assert s.verify()["ok"]
    key = s3.prefix + layout.checkpoint_key(bad.id)
    body = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    client.put_object(Bucket=s3.bucket, Key=key, Body=body[:-1] + bytes([body[-1] ^ 1]))
    client.delete_object(Bucket=s3.bucket, Key=s3.prefix + layout.checkpoint_key(gone.id))
    with snapstore.open(url, cache_dir=str(tmp_path / "w")) as s:
        report = s.verify(deep=True)
        assert not report["ok"]
        found = {tuple(p["checkpoints"]): p["kind"] for p in report["problems"]}
        assert found == {(bad.id,): "damaged_object", (gone.id,): "damaged_object"}
        assert s.verify()["ok"]              # shallow: the cache's own consistency
