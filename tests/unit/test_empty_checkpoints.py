"""Issue 14, defect 1: a checkpoint with no changed bytes crashed asynchronous and tracked
checkpoints (TypeError: out: expected a writable buffer) -- the README's own training loop
whenever a step changes nothing. It must commit an incremental checkpoint adding 0 chunk bytes.

Every capture mode (each tracker mode, and store.checkpoint_async) x {nothing changed,
everything changed, empty buffer, one byte, the same call twice, after close(), after fork()}.
"""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

import snapstore
from snapstore.errors import SnapstoreError, StoreClosedError

pytest.importorskip("snapstore.capture.dirty")

CAPTURES = ["uffd", "hash", "shadow", "full", "auto", "async"]


@pytest.fixture
def store(tmp_path):
    with snapstore.open(tmp_path / "s", durability="none") as s:
        yield s


class Taker:
    """Takes asynchronous checkpoints of fixed buffers: through a tracker of a mode, or
    through store.checkpoint_async ("async")."""

    def __init__(self, store, buffers: dict, capture: str, stream: str = "t") -> None:
        self.store, self.buffers, self.stream = store, buffers, stream
        self.tracker = None
        if capture != "async":
            if capture == "uffd" and not snapstore.capture.dirty.uffd_available()[0]:
                pytest.skip("userfaultfd tracking unavailable here")
            self.tracker = store.track(buffers, stream, mode=capture)

    def take_async(self, meta=None):
        if self.tracker is not None:
            return self.tracker.checkpoint_async(meta)
        return self.store.checkpoint_async(self.buffers, self.stream, meta)

    def take(self, meta=None):
        return self.take_async(meta).result(timeout=60)

    def close(self) -> None:
        if self.tracker is not None:
            self.tracker.close()


def chunk_bytes(store) -> tuple:
    st = store.stats()
    return st["chunks"], st["live_chunk_bytes"] + st["garbage_chunk_bytes"]


def contents(buffers: dict) -> dict:
    return {k: bytes(memoryview(v).cast("B")) for k, v in buffers.items()}


@pytest.mark.parametrize("capture", CAPTURES)
def test_defect1_nothing_changed_commits_an_incremental_adding_no_chunk_bytes(store, capture):
    a = np.random.default_rng(1).integers(0, 256, 1 << 20, dtype=np.uint8)
    z = np.zeros(1 << 20, np.uint8)
    bufs = {"a": a, "z": z}
    t = Taker(store, bufs, capture)
    first = t.take()
    before = chunk_bytes(store)
    for _ in range(3):
        info = t.take()
        # mode "full" tracks nothing: every capture covers every byte, so the checkpoint-level
        # full_threshold makes it full (by manifest: still no byte written)
        assert info.kind == ("full" if capture == "full" else "incremental")
        assert info.parent == first.id + _
        assert chunk_bytes(store) == before           # 0 chunk bytes added
        assert store.restore(info.id) == contents(bufs)
    t.close()
    assert store.verify()["ok"]


@pytest.mark.parametrize("capture", CAPTURES)
def test_defect1_everything_changed(store, capture):
    rng = np.random.default_rng(2)
    a = rng.integers(0, 256, 300_000, dtype=np.uint8)      # not a multiple of the page size
    t = Taker(store, {"a": a}, capture)
    t.take()
    expected = {}
    for step in range(3):
        a[:] = rng.integers(0, 256, a.size, dtype=np.uint8)
        before = chunk_bytes(store)
        info = t.take()
        expected[info.id] = a.tobytes()
        assert chunk_bytes(store)[1] - before[1] >= a.size // 2   # (compressed) new bytes
    t.close()
    for cid, data in expected.items():
        assert store.restore(cid)["a"] == data


@pytest.mark.parametrize("empty", ["bytearray", "numpy"])
@pytest.mark.parametrize("capture", CAPTURES)
def test_defect1_empty_buffer(store, capture, empty):
    e = bytearray() if empty == "bytearray" else np.zeros(0, np.uint8)
    other = bytearray(b"x" * 5000)
    for bufs, stream in (({"e": e}, "alone"), ({"e": e, "o": other}, "with_other")):
        t = Taker(store, bufs, capture, stream)
        infos = [t.take() for _ in range(3)]       # the first one crashed on an empty buffer
        t.close()
        assert [i.seq for i in infos] == [1, 2, 3]
        for i in infos:
            assert store.restore(i.id) == contents(bufs)
            assert store.get(i.id).sizes["e"] == 0


@pytest.mark.parametrize("capture", CAPTURES)
@pytest.mark.parametrize("existing", [False, True])
def test_no_buffers_at_all_on_a_new_or_an_existing_stream(store, capture, existing):
    """A capture of no buffers has nothing to diff, but its commit still goes onto the
    stream's head: on a stream that had a checkpoint already, every such capture failed
    ("relative to None")."""
    before = store.checkpoint({"x": b"1"}, stream="t") if existing else None
    t = Taker(store, {}, capture)
    infos = [t.take() for _ in range(3)]
    t.close()
    first_seq = 2 if existing else 1
    assert [i.seq for i in infos] == list(range(first_seq, first_seq + 3))
    assert infos[0].parent == (before.id if existing else None)
    assert [i.parent for i in infos[1:]] == [i.id for i in infos[:-1]]
    for i in infos:
        assert store.restore(i.id) == {}


@pytest.mark.parametrize("capture", CAPTURES)
def test_defect1_one_byte_buffer(store, capture):
    b = bytearray(b"\x07")
    t = Taker(store, {"b": b}, capture)
    ids = {}
    for value in (7, 7, 8, 8, 0):
        b[0] = value
        ids[t.take().id] = bytes([value])
    t.close()
    for cid, data in ids.items():
        assert store.restore(cid)["b"] == data


@pytest.mark.parametrize("capture", CAPTURES)
def test_defect1_the_same_call_twice_without_waiting(store, capture):
    a = np.random.default_rng(3).integers(0, 256, 1 << 18, dtype=np.uint8)
    t = Taker(store, {"a": a}, capture)
    f1, f2 = t.take_async({"n": 1}), t.take_async({"n": 2})     # nothing changed between
    f3, f4 = t.take_async({"n": 3}), t.take_async({"n": 4})
    infos = [f.result(timeout=60) for f in (f1, f2, f3, f4)]
    t.close()
    assert [i.meta["n"] for i in infos] == [1, 2, 3, 4]
    assert [i.parent for i in infos[1:]] == [i.id for i in infos[:-1]]
    # mode "full" covers every byte in each capture: full by the checkpoint-level rule
    assert all(i.kind == ("full" if capture == "full" else "incremental") for i in infos[1:])
    for i in infos:
        assert store.restore(i.id)["a"] == a.tobytes()


@pytest.mark.parametrize("capture", CAPTURES)
def test_defect1_after_close(tmp_path, capture):
    s = snapstore.open(tmp_path / "s", durability="none")
    a = bytearray(8192)
    t = Taker(s, {"a": a}, capture)
    t.take()
    t.take()
    if t.tracker is not None:
        t.tracker.close()
        with pytest.raises(StoreClosedError):
            t.tracker.checkpoint()
        t.tracker.close()                          # idempotent
        t.tracker = s.track({"a": a}, "t", mode=capture)   # the stream is free again
        a[0] = 1
        assert s.restore(t.take().id)["a"] == a
    s.close()
    with pytest.raises(StoreClosedError):
        t.take()
    with pytest.raises(StoreClosedError):
        s.checkpoint_async({"a": a}, "t")
    with snapstore.open(tmp_path / "s", readonly=True) as r:
        assert [c.seq for c in r.checkpoints("t")] == [1, 2, 3][:3 if t.tracker else 2]


def _in_child(fn, timeout: float = 30.0) -> int:
    """Runs fn() in a forked child; returns its exit status (0: fn raised SnapstoreError,
    1: fn returned, 2: another exception, 3: killed after the timeout)."""
    pid = os.fork()
    if pid == 0:                                   # the child: never returns to pytest
        code = 2
        try:
            fn()
            code = 1
        except SnapstoreError:
            code = 0
        except BaseException as exc:
            os.write(2, f"child: {type(exc).__name__}: {exc}\n".encode())
            code = 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return 3
        time.sleep(0.02)


@pytest.mark.parametrize("capture", CAPTURES)
def test_defect1_after_fork_the_child_gets_a_snapstore_error(store, capture):
    """A checkpoint taken in a forked child must raise a SnapstoreError (issue 14 defect 2:
    the fork guard of branch h-safety); the parent goes on unharmed."""
    a = np.random.default_rng(4).integers(0, 256, 1 << 18, dtype=np.uint8)
    t = Taker(store, {"a": a}, capture)
    t.take()
    status = _in_child(lambda: t.take_async().result(timeout=5))
    assert status == 0, f"child exit status {status} (0 = SnapstoreError expected)"
    a[:4096] = 1
    info = t.take()
    t.close()
    assert store.restore(info.id)["a"] == a.tobytes()
    assert store.verify()["ok"]
