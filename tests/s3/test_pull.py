"""Pulling an S3 store into a cache (remote/sync.py) against a real server: the refs and
checkpoint objects of many streams are read several at a time, and what a new machine sees
is exactly what the writer committed -- streams, checkpoints, parents, tags, deletes and
contents -- also for a stream whose delta chain reaches below its live checkpoints. A
damaged object is CorruptionError naming it; once it is whole again, the next open works."""
from __future__ import annotations

import threading
import time

import pytest

import snapstore
from snapstore.errors import CorruptionError
from snapstore.remote import layout, s3client, sync


@pytest.fixture
def url(s3):
    return f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"


def _content(stream: int, step: int) -> dict:
    """64 KiB that change in 10 bytes a step (the later checkpoints of a stream are deltas),
    and a small buffer that changes whole."""
    a = bytearray(bytes([stream]) * (64 << 10))
    a[1000 * step:1000 * step + 10] = bytes([step + 1]) * 10
    return {"a": bytes(a), "b": bytes([step]) * (step + 1)}


def _build(url: str, cache, streams: int = 12, steps: int = 3) -> dict:
    """streams x steps checkpoints (deltas on the first), some tagged, the first deleted from
    each odd stream (its delta child absorbs it: a new machine fetches the deleted one's
    object to rebuild the child); returns {stream: [(id, parent, tags, content), ...]} as
    the writer sees it."""
    with snapstore.open(url, cache_dir=str(cache)) as s:
        for i in range(streams):
            for step in range(steps):
                info = s.checkpoint(_content(i, step), stream=f"s{i:02d}", meta={"step": step})
                assert info.kind == ("full" if step == 0 else "incremental")
                if step == 1:
                    s.tag(info.id, f"t{i}")
            if i % 2 and steps > 1:
                first = s.checkpoints(f"s{i:02d}")[0].id
                s.delete(first)
        return _seen(s)


def _seen(s) -> dict:
    return {st: [(c.id, c.parent, sorted(c.tags), s.restore(c.id)) for c in s.checkpoints(st)]
            for st in s.streams()}


def test_a_new_machine_sees_every_stream_as_the_writer_does(url, tmp_path):
    want = _build(url, tmp_path / "writer")
    assert len(want) == 12
    with snapstore.open(url, cache_dir=str(tmp_path / "new"), readonly=True) as s:
        assert _seen(s) == want
        s.refresh()                                     # the same pull again: no change
        assert _seen(s) == want


def test_the_gets_of_a_pull_overlap(url, tmp_path, monkeypatch):
    """With a round trip of 20 ms per request (as to a distant bucket), the GETs of an open
    are in flight together, PULL_THREADS at most."""
    want = _build(url, tmp_path / "writer", streams=10, steps=2)
    real = s3client.S3Client._call
    lock = threading.Lock()
    now, most = [0], [0]

    def slow(self, *args, **kwargs):
        with lock:
            now[0] += 1
            most[0] = max(most[0], now[0])
        try:
            time.sleep(0.02)
            return real(self, *args, **kwargs)
        finally:
            with lock:
                now[0] -= 1
    monkeypatch.setattr(s3client.S3Client, "_call", slow)
    with snapstore.open(url, cache_dir=str(tmp_path / "new"), readonly=True) as s:
        assert _seen(s) == want
    assert 2 <= most[0] <= sync.PULL_THREADS


def test_many_streams_are_pulled_in_batches(url, tmp_path, monkeypatch):
    monkeypatch.setattr(sync, "PULL_BATCH", 3)
    want = _build(url, tmp_path / "writer", streams=7, steps=2)
    with snapstore.open(url, cache_dir=str(tmp_path / "new"), readonly=True) as s:
        assert _seen(s) == want


def test_a_damaged_checkpoint_object_of_one_stream_is_named_and_a_whole_one_heals(
        url, tmp_path, s3):
    want = _build(url, tmp_path / "writer", streams=5, steps=2)
    victim = want["s02"][-1][0]
    client = s3.client()
    key = s3.prefix + layout.checkpoint_key(victim)
    whole = client.get_object(Bucket=s3.bucket, Key=key)["Body"].read()
    client.put_object(Bucket=s3.bucket, Key=key, Body=whole[:-5] + b"XXXXX")
    with pytest.raises(CorruptionError, match=layout.checkpoint_key(victim)):
        snapstore.open(url, cache_dir=str(tmp_path / "new"), readonly=True)
    client.delete_object(Bucket=s3.bucket, Key=key)
    with pytest.raises(CorruptionError, match="is missing"):
        snapstore.open(url, cache_dir=str(tmp_path / "new"), readonly=True)
    client.put_object(Bucket=s3.bucket, Key=key, Body=whole)
    with snapstore.open(url, cache_dir=str(tmp_path / "new"), readonly=True) as s:
        assert _seen(s) == want


def test_no_streams_and_one_stream(url, tmp_path):
    with snapstore.open(url, cache_dir=str(tmp_path / "w")) as s:
        assert s.streams() == []
    with snapstore.open(url, cache_dir=str(tmp_path / "empty"), readonly=True) as s:
        assert s.streams() == [] and s.checkpoints() == []
    want = _build(url, tmp_path / "writer", streams=1, steps=1)
    with snapstore.open(url, cache_dir=str(tmp_path / "new"), readonly=True) as s:
        assert _seen(s) == want


def test_a_deleted_parent_reads_the_same_everywhere(url, tmp_path):
    """A full checkpoint whose parent was deleted before a cache first pulled it gets the
    parent the writer's cache shows: the live checkpoint before it, or none. (A new machine
    kept the deleted parent's id.)"""
    def parents(s) -> dict:
        return {c.id: c.parent for c in s.checkpoints("x")}
    with snapstore.open(url, cache_dir=str(tmp_path / "w")) as s:
        ids = [s.checkpoint({"a": bytes([i]) * 5000}, stream="x").id for i in range(6)]
        s.delete(ids[0])                      # the first: its child has no parent now
        s.delete(ids[2])                      # a middle one: its child gets its parent
        s.delete(ids[5])                      # the head: the one before becomes head
        s.delete(ids[4])
        want = parents(s)
        assert want == {ids[1]: None, ids[3]: ids[1]}
        nxt = s.checkpoint({"a": b"n" * 5000}, stream="x")
        want = parents(s)
        assert want[nxt.id] == ids[3]
        with snapstore.open(url, cache_dir=str(tmp_path / "new"), readonly=True) as other:
            assert parents(other) == want
            s.delete(ids[3])                  # seen by a cache that has the victim
            other.refresh()
            want = parents(s)
            assert want == {ids[1]: None, nxt.id: ids[1]} == parents(other)
    with snapstore.open(url, cache_dir=str(tmp_path / "new2"), readonly=True) as s:
        assert parents(s) == want
        assert s.restore(nxt.id) == {"a": b"n" * 5000}
