"""Writers that start together store what they share once (remote/intents.py), against the
real server: the measure of the issue in small, and what can go wrong around it: an intent
whose outcome never comes, an outcome naming a segment that is not there, a damaged intent,
its writer killed after the outcome (others then hold chunks only its segments have), small
plans (no intents) and gc deleting old intents."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time

import blake3
import numpy as np
import pytest
import xxhash

import snapstore
from snapstore.engine import format as fmt
from snapstore.remote import intents, layout

MiB = 1 << 20
CHUNK = fmt.DEFAULT_CHUNK_SIZE


@pytest.fixture
def url(s3):
    return f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"


@pytest.fixture
def small_plans(monkeypatch):
    """Plans of 1 MiB or more make intents (the tests' states are a few MiB)."""
    monkeypatch.setattr(layout, "INTENT_MIN_BYTES", 1 * MiB)


def objects(s3, under: str) -> dict:
    c = s3.client()
    out = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=s3.bucket,
                                                           Prefix=s3.prefix + under):
        for o in page.get("Contents", []):
            out[o["Key"][len(s3.prefix):]] = o["Size"]
    return out


def segment_bytes(s3) -> int:
    return sum(objects(s3, layout.SEGMENTS_DIR).values())


def random_state(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def writer_state(base: bytes, w: int) -> bytes:
    """base with 1 MiB of the writer's own bytes at a place of its own."""
    out = bytearray(base)
    at = (1 + 2 * w) * MiB
    out[at:at + MiB] = random_state(MiB, 100 + w)
    return bytes(out)


def put_fake_intent(s3, url, data: bytes, *, ago: float = 1.0, damage: bool = False) -> str:
    """An intent of another writer, made `ago` seconds ago, holding data's chunks (a full
    checkpoint's: the fixed grid of CHUNK). That writer made the store first (a prefix with
    objects but no store is not made one)."""
    snapstore.open(url, cache_dir=tempfile.mkdtemp()).close()
    fps = [xxhash.xxh3_64_intdigest(data[i:i + CHUNK]) for i in range(0, len(data), CHUNK)]
    key = layout.intent_key(int((time.time() - ago) * 1000), "f" * 32, 1)
    body = bytearray(intents.encode_intent(len(data), fps))
    if damage:
        body[len(body) // 2] ^= 1
    s3.client().put_object(Bucket=s3.bucket, Key=s3.prefix + key, Body=bytes(body))
    return key


def test_writers_that_start_together_store_what_they_share_once(url, s3, tmp_path,
                                                                small_plans):
    base = random_state(8 * MiB, 1)
    states = [writer_state(base, w) for w in range(3)]
    barrier = threading.Barrier(3)
    made, errors = {}, []

    def write(w: int) -> None:
        try:
            with snapstore.open(url, cache_dir=str(tmp_path / f"c{w}")) as s:
                barrier.wait(30)
                made[w] = s.checkpoint({"state": states[w]}, stream=f"w{w}")
        except BaseException as exc:      # noqa: BLE001 - reported below
            errors.append(exc)
            barrier.abort()
    threads = [threading.Thread(target=write, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    # one state (8 MiB of random bytes: stored raw) plus each writer's own 1 MiB, about
    stored = segment_bytes(s3)
    assert stored <= 1.5 * len(base), f"{stored / len(base):.2f}x one state"
    keys = objects(s3, layout.INTENTS_DIR)
    assert len(keys) == 6 and sum(k.endswith(".done") for k in keys) == 3
    with snapstore.open(url, cache_dir=str(tmp_path / "fresh")) as s:     # a new machine
        for w in range(3):
            assert s.restore(made[w].id)["state"] == states[w]
        assert s.verify(deep=True)["ok"]


def test_the_same_state_again_and_one_byte_changed_store_nothing_twice(url, s3, tmp_path,
                                                                      small_plans):
    data = random_state(3 * MiB, 2)
    with snapstore.open(url, cache_dir=str(tmp_path / "a")) as a:
        a.checkpoint({"x": data}, stream="a")
    before = segment_bytes(s3)
    with snapstore.open(url, cache_dir=str(tmp_path / "b")) as b:  # another stream, cold cache
        b.refresh()
        one = bytearray(data)
        one[5] ^= 1
        info = b.checkpoint({"x": bytes(one)}, stream="b")
        assert b.restore(info.id)["x"] == bytes(one)
    assert segment_bytes(s3) - before < 2 * CHUNK      # the one chunk that changed


def test_small_plans_make_no_intents(url, s3, tmp_path):
    with snapstore.open(url, cache_dir=str(tmp_path / "c")) as s:
        s.checkpoint({"a": b"", "b": b"x"}, stream="s")
        s.checkpoint({"a": b"", "b": b"x"}, stream="s")        # nothing changed
        s.checkpoint({"a": random_state(MiB, 3)}, stream="s")
    assert objects(s3, layout.INTENTS_DIR) == {}


def test_durability_local_makes_no_intents(url, s3, tmp_path, small_plans):
    with snapstore.open(url, cache_dir=str(tmp_path / "c"), durability="local") as s:
        info = s.checkpoint({"a": random_state(2 * MiB, 4)}, stream="s")
        s.flush()
        assert s.restore(info.id)["a"] == random_state(2 * MiB, 4)
    assert objects(s3, layout.INTENTS_DIR) == {}


def test_an_intent_whose_outcome_never_comes_is_waited_for_until_its_deadline(
        url, s3, tmp_path, small_plans, monkeypatch):
    monkeypatch.setattr(layout, "INTENT_WAIT_SECONDS", 0.6)
    monkeypatch.setattr(layout, "INTENT_WAIT_RATE", 1 << 40)
    data = random_state(2 * MiB, 5)
    put_fake_intent(s3, url, data)              # its writer died before uploading
    with snapstore.open(url, cache_dir=str(tmp_path / "c")) as s:
        t = time.monotonic()
        info = s.checkpoint({"x": data}, stream="s")
        assert time.monotonic() - t >= 0.6
    assert segment_bytes(s3) >= len(data)       # it stored everything itself
    with snapstore.open(url, cache_dir=str(tmp_path / "fresh")) as s:
        assert s.restore(info.id)["x"] == data
    assert sum(k.endswith(".done") for k in objects(s3, layout.INTENTS_DIR)) == 1


def test_a_damaged_intent_is_passed_over_without_waiting(url, s3, tmp_path, small_plans,
                                                         monkeypatch):
    monkeypatch.setattr(layout, "INTENT_WAIT_SECONDS", 30.0)
    data = random_state(2 * MiB, 6)
    put_fake_intent(s3, url, data, damage=True)
    with snapstore.open(url, cache_dir=str(tmp_path / "c")) as s:
        t = time.monotonic()
        info = s.checkpoint({"x": data}, stream="s")
        assert time.monotonic() - t < 20
        assert s.restore(info.id)["x"] == data


def test_an_outcome_locating_chunks_in_a_missing_segment_is_not_used(url, s3, tmp_path,
                                                                     small_plans):
    data = random_state(2 * MiB, 7)
    key = put_fake_intent(s3, url, data)
    table = b"".join(fmt.NEW_CHUNK.pack(blake3.blake3(data[i:i + CHUNK]).digest(),
                                        99 * fmt.LOG_SEGMENTS + 1, 64, CHUNK, CHUNK, 0)
                     for i in range(0, len(data), CHUNK))
    s3.client().put_object(Bucket=s3.bucket, Key=s3.prefix + key + ".done",
                           Body=intents.encode_outcome(table))
    with snapstore.open(url, cache_dir=str(tmp_path / "c")) as s:
        info = s.checkpoint({"x": data}, stream="s")
    with snapstore.open(url, cache_dir=str(tmp_path / "fresh")) as s:
        assert s.restore(info.id)["x"] == data
        assert s.verify(deep=True)["ok"]


_KILLED_WRITER = """
import sys, numpy as np, snapstore
from snapstore.remote import layout
layout.INTENT_MIN_BYTES = 1 << 20
data = np.random.default_rng(8).integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
with snapstore.open(sys.argv[1], cache_dir=sys.argv[2]) as s:
    s.checkpoint({"x": data}, stream="dead")
"""


def test_a_writer_killed_after_its_outcome_leaves_segments_others_may_keep(url, s3, tmp_path,
                                                                           small_plans):
    data = random_state(3 * MiB, 8)
    env = dict(os.environ, SNAPSTORE_CRASH_AT="remote_after_outcome")
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, url, str(tmp_path / "dead")],
                          env=env, capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    uploaded = segment_bytes(s3)
    assert uploaded >= len(data)
    with snapstore.open(url, cache_dir=str(tmp_path / "b")) as s:
        info = s.checkpoint({"x": data}, stream="alive")
        assert [c.id for c in s.checkpoints("dead")] == []      # nothing of it is visible
    assert segment_bytes(s3) - uploaded < CHUNK     # it reused the dead writer's upload
    # the dead writer's session is settled by the next open of its cache: nothing deleted
    with snapstore.open(url, cache_dir=str(tmp_path / "dead")) as s:
        assert s.restore(info.id)["x"] == data
        report = s.gc(grace=1.0, wait=True)
        assert report["deleted"]["segments"] == []      # reachable through "alive"
    with snapstore.open(url, cache_dir=str(tmp_path / "fresh")) as s:
        assert s.restore(info.id)["x"] == data
        assert s.verify(deep=True)["ok"]


def test_gc_deletes_old_intents_and_their_outcomes(url, s3, tmp_path, small_plans,
                                                   monkeypatch):
    monkeypatch.setattr(layout, "GC_INTENT_SECONDS", 0.0)
    with snapstore.open(url, cache_dir=str(tmp_path / "c")) as s:
        s.checkpoint({"x": random_state(2 * MiB, 9)}, stream="s")
        assert len(objects(s3, layout.INTENTS_DIR)) == 2
        assert s.gc(grace=1.0, dry_run=True)["intents_deleted"] == 0    # not old yet
        time.sleep(2 * 1.0 + layout.MODIFIED_RESOLUTION + 0.2)
        dry = s.gc(grace=1.0, dry_run=True)
        assert dry["intents_deleted"] == 2 and len(objects(s3, layout.INTENTS_DIR)) == 2
        assert s.gc(grace=1.0)["intents_deleted"] == 2
        assert objects(s3, layout.INTENTS_DIR) == {}
        assert s.restore(s.latest("s").id)["x"] == random_state(2 * MiB, 9)


@pytest.mark.parametrize("failure", ["disk", "bucket"])
def test_a_commit_that_fails_after_its_intent_leaves_an_empty_outcome_unless_the_bucket_failed(
        url, s3, tmp_path, small_plans, monkeypatch, failure):
    """So that nobody waits for it until the deadline; when the bucket is what failed, the
    outcome's PUT would only add its retries to the failure, so none is tried."""
    from snapstore.engine import writer
    from snapstore.errors import RemoteError, StoreIOError
    error = StoreIOError("the disk failed") if failure == "disk" else \
        RemoteError("the bucket failed")

    def broken(*args, **kwargs):
        raise error
    data = random_state(2 * MiB, 10)
    with snapstore.open(url, cache_dir=str(tmp_path / "c")) as s:
        with monkeypatch.context() as m:
            m.setattr(writer, "store_buffer", broken)
            with pytest.raises(type(error)):
                s.checkpoint({"x": data}, stream="s")
        keys = objects(s3, layout.INTENTS_DIR)
        outcomes = [k for k in keys if k.endswith(".done")]
        assert len(keys) - len(outcomes) == 1
        if failure == "disk":
            assert len(outcomes) == 1
            body = s3.client().get_object(Bucket=s3.bucket,
                                          Key=s3.prefix + outcomes[0])["Body"].read()
            assert intents.decode_outcome(body, outcomes[0]) == b""
        else:
            assert outcomes == []
        assert s.latest("s") is None
        info = s.checkpoint({"x": data}, stream="s")       # the same call again works
        assert s.restore(info.id)["x"] == data
