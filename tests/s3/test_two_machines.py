"""Two "machines" (Stores with caches of their own) on one S3 store, and the odd things a bucket
and a cache directory hold, against the real server (regressions of an adversarial pass):

- retain() on one machine never deletes a checkpoint the other just tagged;
- a tag of a checkpoint the other machine deleted is CheckpointNotFound, not a silent no-op;
- a damaged block in the local cache is dropped and fetched again (reads and verify);
- a Store whose prefix was deleted and made again refuses to go on (it would return the old
  store's bytes under the new one's names and overwrite its segments);
- a "folder" marker object refs/ is not a stream; a prefix holding other objects is not made a
  store; a cache subdirectory that is a file is StoreIOError;
- repair of a cache that Stores have open waits for them (StoreLocked), as a local repair does.
"""
from __future__ import annotations

import glob
import os

import pytest

import snapstore
from snapstore.errors import (CheckpointNotFound, FormatError, StoreIOError, StoreLocked)


def _url(s3) -> str:
    return f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"


def test_retain_keeps_a_checkpoint_the_other_machine_just_tagged(s3, tmp_path):
    url = _url(s3)
    with snapstore.open(url, cache_dir=str(tmp_path / "a")) as a:
        for i in range(3):
            a.checkpoint({"x": bytes([i]) * 100}, stream="m")
        with snapstore.open(url, cache_dir=str(tmp_path / "b"), refresh=3600) as b:  # no tag
            a.tag(1, "release")
            result = b.retain("m", keep_last=1)
            assert 1 not in result
        with snapstore.open(url, cache_dir=str(tmp_path / "c")) as fresh:
            kept = {c.id: c.tags for c in fresh.checkpoints("m")}
        assert kept == {1: ("release",), 3: ()}


def test_tag_of_a_checkpoint_the_other_machine_deleted(s3, tmp_path):
    url = _url(s3)
    with snapstore.open(url, cache_dir=str(tmp_path / "a")) as a:
        a.checkpoint({"x": b"1"}, stream="m")
        a.checkpoint({"x": b"2"}, stream="m")
        with snapstore.open(url, cache_dir=str(tmp_path / "b"), refresh=3600) as b:
            a.delete(1)
            with pytest.raises(CheckpointNotFound, match="deleted by another writer"):
                b.tag(1, "important")


def test_a_damaged_cached_block_is_fetched_again(s3, tmp_path):
    url = _url(s3)
    data = os.urandom(3 << 20)
    with snapstore.open(url, cache_dir=str(tmp_path / "w")) as w:
        cid = w.checkpoint({"x": data}, stream="m").id
    cache = str(tmp_path / "r")
    with snapstore.open(url, cache_dir=cache) as r:
        assert r.restore(cid)["x"] == data                   # cached now
    blocks = [p for p in glob.glob(os.path.join(cache, "*", "ranges", "*"))
              if os.path.getsize(p) > 4096]
    assert blocks
    for path in blocks:
        with open(path, "r+b") as f:
            f.seek(2000)
            byte = f.read(1)
            f.seek(2000)
            f.write(bytes([byte[0] ^ 0x10]))
    with snapstore.open(url, cache_dir=cache) as r:
        assert r.verify()["ok"]                              # the bucket is fine
        assert r.restore(cid)["x"] == data
        assert r.read(cid, "x", 1000, 5000) == data[1000:6000]


def test_a_store_whose_prefix_was_made_again_refuses_to_go_on(s3, tmp_path):
    url = _url(s3)
    client = s3.client()
    with snapstore.open(url, cache_dir=str(tmp_path / "c"), refresh=3600) as old:
        old.checkpoint({"x": b"old store"}, stream="m")
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=s3.bucket,
                                                         Prefix=s3.prefix)["Contents"]]
        for key in keys:
            client.delete_object(Bucket=s3.bucket, Key=key)
        with snapstore.open(url, cache_dir=str(tmp_path / "new")) as new:
            new.checkpoint({"x": b"new store"}, stream="m")
        with pytest.raises(StoreIOError, match="made there"):
            old.refresh()
    with snapstore.open(url, cache_dir=str(tmp_path / "c")) as again:   # reopened: the new
        assert again.restore("latest:m") == {"x": b"new store"}


def test_a_prefix_holding_other_objects_is_not_made_a_store(s3, tmp_path):
    client = s3.client()
    client.put_object(Bucket=s3.bucket, Key=s3.key("foreign/segments/1.seg"), Body=b"x" * 10)
    with pytest.raises(FormatError, match="not a snapstore S3 store"):
        snapstore.open(f"s3://{s3.bucket}/{s3.prefix}foreign", cache_dir=str(tmp_path / "f"))
    assert "Contents" not in client.list_objects_v2(
        Bucket=s3.bucket, Prefix=s3.key("foreign/snapstore.json"))        # nothing written


def test_a_folder_marker_under_refs_is_not_a_stream(s3, tmp_path):
    url = _url(s3)
    with snapstore.open(url, cache_dir=str(tmp_path / "a")) as a:
        a.checkpoint({"x": b"abc"}, stream="m")
    s3.client().put_object(Bucket=s3.bucket, Key=s3.key("refs/"), Body=b"")
    with snapstore.open(url, cache_dir=str(tmp_path / "b")) as b:
        assert b.streams() == ["m"] and b.restore("latest:m") == {"x": b"abc"}


@pytest.mark.parametrize("entry", ["ranges", "spool"])
def test_a_cache_subdirectory_that_is_a_file(s3, tmp_path, entry):
    url = _url(s3)
    cache = str(tmp_path / "c")
    with snapstore.open(url, cache_dir=cache) as s:
        s.checkpoint({"x": b"1"}, stream="m")
    (store_dir,) = glob.glob(os.path.join(cache, "*"))
    target = os.path.join(store_dir, entry)
    if os.path.isdir(target):
        import shutil
        shutil.rmtree(target)
    with open(target, "w") as f:
        f.write("not a directory")
    for readonly in (False, True):
        with pytest.raises(StoreIOError):
            snapstore.open(url, cache_dir=cache, readonly=readonly)


def test_repair_of_a_cache_in_use_waits_for_its_stores(s3, tmp_path):
    url = _url(s3)
    cache = str(tmp_path / "c")
    with snapstore.open(url, cache_dir=cache) as s:
        info = s.checkpoint({"x": b"mine"}, stream="m")
        with pytest.raises(StoreLocked):
            snapstore.repair(url, cache_dir=cache)
        assert s.restore(info.id) == {"x": b"mine"}          # its own commit, still there
    report = snapstore.repair(url, cache_dir=cache)        # closed: the cache is rebuilt
    assert report["ok"] and report["checkpoints"] == 1


def test_two_machines_copying_one_store_into_the_bucket_copy_each_checkpoint_once(s3, tmp_path):
    """Regression: machine b's copy checked its (stale) cache, found nothing, and committed a
    second copy of every checkpoint machine a had just copied. Now its commit is onto the head
    it checked, conflicts, and the check made again finds a's copies."""
    from snapstore.copying import copy_checkpoints
    url = _url(s3)
    with snapstore.open(str(tmp_path / "local")) as local:
        for i in range(3):
            local.checkpoint({"x": os.urandom(5000)}, stream="m", meta={"i": i})
        with snapstore.open(url, cache_dir=str(tmp_path / "a")) as a, \
                snapstore.open(url, cache_dir=str(tmp_path / "b"), refresh=3600) as b:
            b.checkpoints("m")                           # b's cache: pulled now, then stale
            first = copy_checkpoints(local, a)
            second = copy_checkpoints(local, b)
            assert sorted(first.copied) == [1, 2, 3]
            assert second.copied == {} and second.skipped == first.copied
        with snapstore.open(url, cache_dir=str(tmp_path / "c")) as fresh:
            assert [c.meta for c in fresh.checkpoints("m")] == [{"i": 0}, {"i": 1}, {"i": 2}]
            assert fresh.restore(first.copied[3]) == local.restore(3)


def test_langgraph_delete_thread_deletes_what_another_machine_stored_just_before(s3, tmp_path):
    """Regression (a helper's review): SnapstoreSaver.delete_thread on machine B, right after
    machine A's put returned, deleted only what B's cache knew (it follows the bucket up to
    `refresh` seconds late): A's checkpoint survived the delete, in every cache."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "unit"))
    from test_langgraph import Thread, cfg
    from snapstore.langgraph import SnapstoreSaver
    url = f"s3://{s3.bucket}/{s3.prefix}lg"
    with snapstore.open(url, cache_dir=str(tmp_path / "a"), refresh=60) as a, \
            snapstore.open(url, cache_dir=str(tmp_path / "b"), refresh=60) as b:
        on_a, on_b = SnapstoreSaver(a), SnapstoreSaver(b)
        thread = Thread(on_a, "t1")
        thread.put({"v": 1})
        b.refresh()
        assert on_b.get_tuple(cfg("t1")).checkpoint["channel_values"] == {"v": 1}
        thread.put({"v": 2})                # acknowledged by A; B's cache does not know it
        on_b.delete_thread("t1")
        a.refresh()
        assert on_a.get_tuple(cfg("t1")) is None
    with snapstore.open(url, cache_dir=str(tmp_path / "fresh")) as c:
        assert SnapstoreSaver(c).get_tuple(cfg("t1")) is None
