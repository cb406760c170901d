"""Issue 14, defect 12: after tracker.close(), or once checkpoint_async()'s job landed
(flush()), the store holds no export of the caller's buffers: a bytearray can be resized and an
mmap closed. store.close() (and tracker.close()) inside a future's done-callback, which runs on
the persister's thread, neither raises nor deadlocks."""
from __future__ import annotations

import mmap
import threading

import numpy as np
import pytest

import snapstore
from snapstore.engine.commit import Committer
from snapstore.errors import StoreClosedError

pytest.importorskip("snapstore.capture.dirty")

MODES = ["uffd", "hash", "shadow", "full", "auto"]
SIZE = 1 << 18


@pytest.fixture
def store(tmp_path):
    with snapstore.open(tmp_path / "s", durability="none") as s:
        yield s


def private_mmap(n: int) -> mmap.mmap:
    return mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


def tracker(store, buffers, stream, mode):
    if mode == "uffd" and not snapstore.capture.dirty.uffd_available()[0]:
        pytest.skip("userfaultfd tracking unavailable here")
    return store.track(buffers, stream, mode=mode)


@pytest.mark.parametrize("mode", MODES)
def test_defect12_tracker_close_frees_the_buffers(store, mode):
    b = bytearray(SIZE)
    m = private_mmap(SIZE)
    t = tracker(store, {"b": b, "m": m}, "t", mode)
    t.checkpoint()
    b[0] = m[0] = 1
    f = t.checkpoint_async()
    b[1] = 2                                   # pending job: the buffers stay usable
    t.close()
    info = f.result()
    b.extend(b"more")                          # BufferError before the fix
    m.close()                                  # BufferError before the fix
    got = store.restore(info.id)
    assert got["b"][:2] == b"\1\0" and got["m"][:1] == b"\1" and len(got["b"]) == SIZE


@pytest.mark.parametrize("kind", ["bytearray", "mmap", "numpy"])
def test_defect12_checkpoint_async_frees_the_buffers_once_flushed(store, kind):
    if kind == "bytearray":
        buf = bytearray(np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8))
    elif kind == "mmap":
        buf = private_mmap(SIZE)
        buf.write(np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8).tobytes())
    else:
        buf = np.random.default_rng(1).integers(0, 256, SIZE, dtype=np.uint8)
    expected = {}
    for step in range(4):
        buf[step * 4096] = step + 1
        f = store.checkpoint_async({"x": buf}, "s")
        buf[step * 4096 + 1] = 0xEE           # after the capture: not in this checkpoint
        expected[f] = None
        store.flush()
        info = f.result()
        data = bytearray(memoryview(buf).cast("B"))
        data[step * 4096 + 1] = store.restore(info.id)["x"][step * 4096 + 1]
        assert store.restore(info.id)["x"] == bytes(data)
        if step:                               # still incremental across detach/attach
            assert info.kind == "incremental" and info.bytes_new < 3 * 4096
    if kind == "bytearray":
        buf.extend(b"x")
        buf.clear()
    elif kind == "mmap":
        buf.close()


def test_defect12_resized_buffer_checkpoints_again(store):
    b = bytearray(b"a" * 10000)
    store.checkpoint_async({"b": b}, "s").result()
    b.extend(b"b" * 5000)                      # new memory, new size
    info = store.checkpoint_async({"b": b}, "s").result()
    assert store.restore(info.id)["b"] == bytes(b)
    del b[:]
    info = store.checkpoint_async({"b": b}, "s").result()
    assert store.restore(info.id)["b"] == b""


def test_defect12_a_failed_async_checkpoint_frees_the_buffers(store, monkeypatch):
    b = bytearray(SIZE)
    store.checkpoint_async({"b": b}, "s").result()

    def broken(self, *args, **kwargs):
        raise OSError(5, "injected")
    monkeypatch.setattr(Committer, "commit", broken)
    b[0] = 1
    f = store.checkpoint_async({"b": b}, "s")
    store.flush()
    assert f.exception() is not None            # the future (and its traceback) still lives
    b.extend(b"x")


def test_defect12_store_close_in_a_done_callback(tmp_path):
    s = snapstore.open(tmp_path / "s", durability="none")
    bufs = {"a": bytearray(b"1" * SIZE)}
    errors, closed_in = [], []
    gate = threading.Event()

    def close_store(fut):
        try:
            gate.wait(10)                        # let more jobs queue behind this one
            s.close()
            closed_in.append(threading.current_thread().name)
        except BaseException as exc:           # noqa: BLE001
            errors.append(exc)

    first = s.checkpoint_async(bufs, "s")
    first.add_done_callback(close_store)
    later = []
    for i in range(3):
        bufs["a"][i] = 0x30 + i
        try:
            later.append(s.checkpoint_async(bufs, "s"))
        except StoreClosedError:
            break
    gate.set()
    info = first.result(timeout=30)
    for f in later:                             # each either committed or StoreClosedError
        assert f.exception(timeout=30) is None or isinstance(f.exception(), StoreClosedError)
    assert errors == [] and closed_in == ["snapstore-persist"]
    assert s.closed
    s.close()                                   # idempotent from the owner's thread too
    bufs["a"].extend(b"x")                      # nothing holds the buffer
    with snapstore.open(tmp_path / "s", readonly=True) as r:
        assert r.restore(info.id)["a"] == b"1" * SIZE
        assert r.verify()["ok"]
    with pytest.raises(StoreClosedError):
        s.checkpoint_async(bufs, "s")


@pytest.mark.parametrize("mode", ["hash", "auto"])
def test_defect12_tracker_close_in_a_done_callback(store, mode):
    b = bytearray(SIZE)
    t = tracker(store, {"b": b}, "t", mode)
    errors = []

    def close_tracker(fut):
        try:
            t.close()
        except BaseException as exc:           # noqa: BLE001
            errors.append(exc)

    f = t.checkpoint_async()
    f.add_done_callback(close_tracker)
    info = f.result(timeout=30)
    store.flush()
    assert errors == []
    with pytest.raises(StoreClosedError):
        t.checkpoint()
    b.extend(b"x")
    assert store.restore(info.id)["b"] == bytes(SIZE)
