"""Black-box tests of the public Store API: snapstore.open, Store.checkpoint / checkpoints /
latest / get / restore / restore_into / read / delete / stats / streams / close, CheckpointInfo
and the snapstore.errors hierarchy.

Only the public API and the store directory (to corrupt or inspect files) are used.
"""
import array
import gc
import hashlib
import json
import mmap
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import snapstore
from snapstore import errors
from snapstore.errors import (CheckpointNotFound, CorruptionError, FormatError, ReadOnlyError,
                              SnapstoreError, StoreClosedError, StoreLocked)

KiB = 1 << 10
MiB = 1 << 20
PAGE = 4096
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def rand_bytes(n: int, seed: int = 0) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def mutate_pages(data, pages, seed=1, page=PAGE) -> bytes:
    """A copy of data with one byte flipped in each of the given pages."""
    rng = np.random.default_rng(seed)
    out = bytearray(data)
    for p in pages:
        i = p * page + int(rng.integers(0, min(page, len(out) - p * page)))
        out[i] ^= 0xFF
    return bytes(out)


def snapshot(store) -> tuple:
    """Everything a failed call must leave unchanged: the visible state and the log bytes."""
    seg_dir = os.path.join(store.path, "segments")
    digest = hashlib.sha256()
    for name in sorted(os.listdir(seg_dir)):
        digest.update(name.encode())
        with open(os.path.join(seg_dir, name), "rb") as f:
            digest.update(f.read())
    stats = store.stats()
    stats.pop("index_bytes")
    return store.checkpoints(), store.streams(), stats, digest.hexdigest()


def open_store(path, **kw):
    kw.setdefault("durability", "none")
    return snapstore.open(path, **kw)


# =========================================================================================
# errors
# =========================================================================================
def test_error_hierarchy():
    for cls in (CheckpointNotFound, CorruptionError, StoreLocked, FormatError, StoreClosedError,
                ReadOnlyError):
        assert issubclass(cls, SnapstoreError)
    assert issubclass(CheckpointNotFound, KeyError)
    assert snapstore.CheckpointNotFound is CheckpointNotFound
    assert snapstore.SnapstoreError is errors.SnapstoreError
    assert str(CheckpointNotFound("no checkpoint 7")) == "no checkpoint 7"


# =========================================================================================
# open / close / formats / locking
# =========================================================================================
def test_open_creates_a_store_and_context_manager_closes(store_path):
    with snapstore.open(store_path, durability="fsync", create=True) as s:
        assert isinstance(s, snapstore.Store)
        assert s.checkpoints() == [] and s.streams() == []
        assert s.latest("train") is None
        info = s.checkpoint({"a": b"abc"}, stream="train")
    with pytest.raises(StoreClosedError):
        s.checkpoints()
    with snapstore.open(store_path, create=False) as s2:       # fsync default, reopen
        assert s2.restore(info.id) == {"a": b"abc"}
        assert s2.get(info.id) == info


def test_close_is_idempotent_and_releases_the_lock(store_path):
    s = open_store(store_path)
    s.close()
    s.close()
    with open_store(store_path) as s2:
        assert s2.checkpoints() == []


CLOSED_CALLS = {
    "checkpoint": lambda s, i: s.checkpoint({"a": b"x"}),
    "checkpoints": lambda s, i: s.checkpoints(),
    "checkpoints_stream": lambda s, i: s.checkpoints("default"),
    "latest": lambda s, i: s.latest(),
    "get": lambda s, i: s.get(i),
    "restore": lambda s, i: s.restore(i),
    "restore_into": lambda s, i: s.restore_into(i, {"a": bytearray(3)}),
    "read": lambda s, i: s.read(i, "a", 0, 1),
    "delete": lambda s, i: s.delete(i),
    "stats": lambda s, i: s.stats(),
    "streams": lambda s, i: s.streams(),
}


@pytest.mark.parametrize("call", sorted(CLOSED_CALLS))
def test_closed_store_raises_store_closed_error(store_path, call):
    s = open_store(store_path)
    info = s.checkpoint({"a": b"abc"})
    s.close()
    with pytest.raises(StoreClosedError):
        CLOSED_CALLS[call](s, info.id)


def test_open_missing_path_without_create_is_format_error(tmp_path):
    with pytest.raises(FormatError):
        snapstore.open(str(tmp_path / "nope"), create=False)
    assert not (tmp_path / "nope").exists()


def test_open_missing_path_readonly_is_format_error(tmp_path):
    with pytest.raises(FormatError):
        snapstore.open(str(tmp_path / "nope"), readonly=True)
    assert not (tmp_path / "nope").exists()


def test_open_non_store_directory_is_format_error(tmp_path):
    (tmp_path / "data.txt").write_text("not a store")
    with pytest.raises(FormatError):
        snapstore.open(str(tmp_path))
    with pytest.raises(FormatError):
        snapstore.open(str(tmp_path), readonly=True)
    assert (tmp_path / "data.txt").read_text() == "not a store"


def test_open_empty_existing_directory_creates_a_store(tmp_path):
    with open_store(str(tmp_path)) as s:
        s.checkpoint({"a": b"1"})
    with open_store(str(tmp_path), create=False) as s:
        assert len(s.checkpoints()) == 1


def test_existing_empty_directory_without_create_is_format_error(tmp_path):
    with pytest.raises(FormatError):
        snapstore.open(str(tmp_path), create=False)


@pytest.mark.parametrize("body", [
    {"format": "snapstore", "version": 999},
    {"format": "something-else", "version": 1},
    "garbage",
])
def test_newer_or_foreign_format_is_format_error(store_path, body):
    with open_store(store_path) as s:
        s.checkpoint({"a": b"abc"})
    fmt_file = os.path.join(store_path, "FORMAT")
    with open(fmt_file, "w") as f:
        f.write(body if isinstance(body, str) else json.dumps(body))
    with pytest.raises(FormatError):
        open_store(store_path)
    with pytest.raises(FormatError):
        open_store(store_path, readonly=True)


@pytest.mark.parametrize("opts", [
    {"durability": "sometimes"}, {"page_size": 1000}, {"page_size": 256}, {"page_size": "4096"},
    {"max_chain": 0}, {"max_chain": 1.5}, {"full_threshold": 1.5}, {"full_threshold": -0.1},
    {"chunking": "rabin"}, {"compression": "lz4"}, {"chunk_size": 1000},
])
def test_bad_open_options_are_rejected(store_path, opts):
    with pytest.raises((ValueError, TypeError)):
        snapstore.open(store_path, **opts)
    # the rejection released everything: a normal open works
    with open_store(store_path) as s:
        assert s.checkpoints() == []


def test_second_writer_in_process_writes_its_own_log(store_path):
    """Two writer Stores of one process (issue 16): both write, each to a log of its own;
    neither waits for the other, and each sees the other's commits."""
    with open_store(store_path) as s, open_store(store_path) as s2:
        a = s.checkpoint({"a": b"abc"}, stream="one")
        b = s2.checkpoint({"a": b"xyz"}, stream="two")
        assert s._committer.log_number != s2._committer.log_number
        assert {i.id for i in s.checkpoints()} == {i.id for i in s2.checkpoints()} == {a.id, b.id}
        assert s2.restore(a.id) == {"a": b"abc"} and s.restore(b.id) == {"a": b"xyz"}
        c = s.checkpoint({"a": b"abd"}, stream="two")          # s builds on s2's head
        assert c.parent == b.id and c.seq == 2


def test_open_with_timeout_waits_for_an_exclusive_holder(store_path):
    """Writers share the store lock; an exclusive holder (repair, an upgrade, a writer of an
    older version) makes them wait, up to timeout."""
    from snapstore.engine.storedir import take_lock
    with open_store(store_path) as s:
        s.checkpoint({"a": b"abc"})
    fd = take_lock(store_path, time.monotonic())
    timer = threading.Timer(0.3, os.close, (fd,))
    timer.start()
    try:
        with pytest.raises(StoreLocked):
            open_store(store_path)
        t0 = time.monotonic()
        with open_store(store_path, timeout=10) as s2:
            waited = time.monotonic() - t0
            assert 0.1 <= waited < 5
            assert s2.restore(s2.latest().id) == {"a": b"abc"}
    finally:
        timer.cancel()


_HOLDER = r"""
import sys
import snapstore
s = snapstore.open(sys.argv[1], durability="fsync")
info = s.checkpoint({"a": b"from another process"}, stream="p", meta={"pid": 1})
print(info.id, flush=True)
sys.stdin.readline()
s.checkpoint({"a": b"second write"}, stream="p")
print("done", flush=True)
sys.stdin.readline()
s.close()
"""


class Holder:
    """A writer in another process: checkpoints once, waits, checkpoints again, waits, exits."""

    def __init__(self, path):
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-c", _HOLDER, path], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.first = int(self.proc.stdout.readline())

    def step(self) -> str:
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def finish(self) -> int:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("\n\n")
                self.proc.stdin.flush()
            except BrokenPipeError:
                pass
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def test_writer_in_another_process_writes_alongside(store_path):
    """A writer in another process does not lock this one out (issue 16): both commit, to
    their own streams and to one stream in turn, and see each other's checkpoints."""
    holder = Holder(store_path)
    try:
        with open_store(store_path) as s:
            mine = s.checkpoint({"a": b"mine"}, stream="q")
            assert holder.step() == "done"
            infos = s.checkpoints("p")
            assert [i.id for i in infos][0] == holder.first and len(infos) == 2
            assert s.restore(infos[1].id) == {"a": b"second write"}
            assert s.restore(mine.id) == {"a": b"mine"}
            follow = s.checkpoint({"a": b"third"}, stream="p")
            assert follow.parent == infos[1].id and follow.seq == 3
    finally:
        assert holder.finish() == 0
    with open_store(store_path) as s:
        assert s.verify(deep=True)["ok"]


def test_readonly_sees_the_commits_of_a_writer_in_another_process(store_path):
    holder = Holder(store_path)
    try:
        with snapstore.open(store_path, readonly=True) as r:
            assert [c.id for c in r.checkpoints()] == [holder.first]
            assert r.restore(holder.first) == {"a": b"from another process"}
            assert r.get(holder.first).meta == {"pid": 1}
            assert holder.step() == "done"
            latest = r.latest("p")                 # a commit made after the reader opened
            assert latest.parent == holder.first
            assert r.restore(latest.id) == {"a": b"second write"}
            with pytest.raises(ReadOnlyError):
                r.checkpoint({"a": b"x"}, stream="p")
    finally:
        holder.finish()


# =========================================================================================
# read-only stores
# =========================================================================================
def test_readonly_sees_commits_and_refuses_writes(store_path):
    w = open_store(store_path)
    a = w.checkpoint({"x": rand_bytes(10000)}, stream="s", meta={"n": 1})
    with snapstore.open(store_path, readonly=True) as r:
        assert r.checkpoints() == [a]
        assert r.latest("s") == a
        assert r.restore(a.id) == w.restore(a.id)
        assert r.read(a.id, "x", 10, 20) == rand_bytes(10000)[10:30]
        b = w.checkpoint({"x": rand_bytes(10000, 1)}, stream="s")   # after the reader opened
        assert r.checkpoints() == [a, b]
        assert r.restore(b.id) == {"x": rand_bytes(10000, 1)}
        assert r.stats()["checkpoints"] == 2
        before = snapshot(r)
        with pytest.raises(ReadOnlyError):
            r.checkpoint({"x": b"y"}, stream="s")
        with pytest.raises(ReadOnlyError):
            r.delete(a.id)
        assert snapshot(r) == before
    w.close()


def test_readonly_open_without_any_writer(store_path):
    with open_store(store_path) as w:
        a = w.checkpoint({"x": rand_bytes(10000)}, stream="s", meta={"n": 1})
    with snapstore.open(store_path, readonly=True) as r:
        assert r.checkpoints() == [a]
        assert r.latest("s") == a
        assert r.restore(a.id) == {"x": rand_bytes(10000)}
        with pytest.raises(ReadOnlyError):
            r.checkpoint({"x": b"y"}, stream="s")


def test_writer_can_open_while_a_reader_is_open_in_process(store_path):
    with open_store(store_path) as w:
        w.checkpoint({"a": b"abc"})
    with snapstore.open(store_path, readonly=True) as r:
        with open_store(store_path) as w:
            info = w.checkpoint({"a": b"abd"})
        assert r.restore(info.id) == {"a": b"abd"}


# =========================================================================================
# checkpoint basics and CheckpointInfo
# =========================================================================================
def test_checkpoint_info_fields(store):
    t0 = time.time()
    w = rand_bytes(100 * KiB)
    o = rand_bytes(3 * KiB, 1)
    info = store.checkpoint({"weights": w, "opt": o}, stream="train", meta={"step": 10})
    t1 = time.time()
    assert isinstance(info, snapstore.CheckpointInfo)
    assert isinstance(info.id, int)
    assert info.stream == "train"
    assert info.kind == "full"
    assert info.parent is None
    assert t0 - 1 <= info.created <= t1 + 1
    assert info.meta == {"step": 10}
    assert info.sizes == {"weights": 100 * KiB, "opt": 3 * KiB}
    assert 103 * KiB <= info.bytes_new < 110 * KiB     # random data: stored about raw
    assert info.chain_length == 0
    assert store.get(info.id) == info
    assert store.latest("train") == info
    assert store.checkpoints() == [info]
    assert store.checkpoints("train") == [info]
    assert store.checkpoints("other") == []
    assert store.latest("other") is None
    assert store.streams() == ["train"]
    assert store.restore(info.id) == {"weights": w, "opt": o}


def test_ids_increase_and_parents_follow_each_stream(store):
    a1 = store.checkpoint({"x": b"1"}, stream="a")
    b1 = store.checkpoint({"x": b"1"}, stream="b")
    a2 = store.checkpoint({"x": b"2"}, stream="a")
    b2 = store.checkpoint({"x": b"2"}, stream="b")
    assert a1.id < b1.id < a2.id < b2.id
    assert (a1.parent, b1.parent, a2.parent, b2.parent) == (None, None, a1.id, b1.id)
    assert store.checkpoints() == [a1, b1, a2, b2]
    assert store.checkpoints("a") == [a1, a2]
    assert store.checkpoints("b") == [b1, b2]
    assert store.latest("a") == a2 and store.latest("b") == b2
    assert store.streams() == ["a", "b"]


def test_default_stream(store):
    info = store.checkpoint({"x": b"1"})
    assert store.latest() == info
    assert store.latest(info.stream) == info


def test_get_accepts_checkpoint_info_and_rejects_bad_ids(store):
    info = store.checkpoint({"x": b"1"})
    assert store.get(info) == info
    assert store.restore(info) == {"x": b"1"}
    with pytest.raises(CheckpointNotFound):
        store.get(info.id + 100)
    with pytest.raises(KeyError):
        store.get(info.id + 100)
    for bad in (1.0, None, True, b"1"):
        with pytest.raises(TypeError):
            store.get(bad)
    # A str is a checkpoint name (issue 15), not an id: "1" names no tag or stream here.
    with pytest.raises(CheckpointNotFound, match="an id is an int"):
        store.get(str(info.id))


@pytest.mark.parametrize("meta", [None, 0, -5, 3.25, "text ü", [1, "two", None],
                                  {"step": 10, "nested": {"lr": 0.001, "tags": ["a", "b"]}},
                                  True, {}])
def test_meta_roundtrips(store_path, meta):
    with open_store(store_path) as s:
        info = s.checkpoint({"x": b"1"}, meta=meta)
        assert info.meta == meta
        assert s.get(info.id).meta == meta
    with open_store(store_path) as s:
        assert s.get(info.id).meta == meta
        assert s.get(info.id) == info


@pytest.mark.parametrize("meta", [object(), {1, 2}, b"bytes", {"f": lambda: 0}, {(1, 2): 3},
                                  float("nan"), {"x": float("inf")}])
def test_non_json_meta_is_rejected_before_anything_is_written(store, meta):
    store.checkpoint({"x": b"1"})
    before = snapshot(store)
    with pytest.raises((TypeError, ValueError)):
        store.checkpoint({"x": rand_bytes(10000)}, meta=meta)
    assert snapshot(store) == before


def test_circular_meta_is_rejected(store):
    meta = {}
    meta["self"] = meta
    before = snapshot(store)
    with pytest.raises((TypeError, ValueError)):
        store.checkpoint({"x": b"1"}, meta=meta)
    assert snapshot(store) == before


def test_returned_info_equals_stored_info_for_any_accepted_meta(store):
    info = store.checkpoint({"x": b"1"}, meta={"shape": (3, 4), 7: "seven"})
    assert store.get(info.id) == info


# =========================================================================================
# buffer types
# =========================================================================================
def _buffers():
    r = rand_bytes(20000, 5)
    mm = mmap.mmap(-1, 10000)
    mm.write(rand_bytes(10000, 6))
    return {
        "bytes": r,
        "bytearray": bytearray(r[:9999]),
        "memoryview": memoryview(r),
        "memoryview_slice": memoryview(r)[100:5000],
        "memoryview_cast": memoryview(bytearray(r[:4000])).cast("i"),
        "mmap": mm,
        "array_d": array.array("d", range(1000)),
        "empty_bytes": b"",
        "empty_bytearray": bytearray(),
        "one_byte": b"\x7f",
        "page_minus_1": rand_bytes(PAGE - 1, 7),
        "page_plus_1": rand_bytes(PAGE + 1, 8),
        "odd_size": rand_bytes(3 * PAGE + 123, 9),
        "exact_pages": rand_bytes(4 * PAGE, 10),
    }


NUMPY_CASES = [
    ("uint8", (1000,)), ("int16", (7, 13)), ("int32", (3, 5, 7)), ("int64", (100,)),
    ("float16", (33,)), ("float32", (64, 64)), ("float64", (10, 10, 10)),
    ("complex64", (17,)), ("complex128", (4, 4)), ("bool", (999,)), (">i4", (50,)),
    ("S5", (20,)), ("U3", (11,)), ([("a", "<i4"), ("b", "<f8")], (25,)),
    ("float32", (0,)), ("float64", (0, 5)), ("int64", ()), ("uint8", (1,)),
]


def _numpy_array(dtype, shape, seed):
    raw = rand_bytes(int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize, seed)
    arr = np.frombuffer(raw, dtype=np.uint8).view(dtype).reshape(shape).copy()
    return arr


def test_every_buffer_type_restores_byte_exact(store):
    bufs = _buffers()
    for i, (dtype, shape) in enumerate(NUMPY_CASES):
        bufs[f"np{i}"] = _numpy_array(dtype, shape, 100 + i)
    expected = {k: memoryview(v).tobytes() for k, v in bufs.items()}
    info = store.checkpoint(bufs, stream="types")
    assert info.sizes == {k: len(v) for k, v in expected.items()}
    restored = store.restore(info.id)
    assert restored == expected
    assert all(type(v) is bytes for v in restored.values())
    for k, v in expected.items():
        assert store.read(info.id, k) == v
    # a second checkpoint of the same objects is incremental and still exact
    info2 = store.checkpoint(bufs, stream="types")
    assert info2.kind == "incremental"
    assert store.restore(info2.id) == expected
    bufs["mmap"].close()      # checkpoint kept no export of the caller's buffers


@pytest.mark.parametrize("case", range(len(NUMPY_CASES)))
def test_numpy_restore_into_same_dtype(store, case):
    dtype, shape = NUMPY_CASES[case]
    arr = _numpy_array(dtype, shape, case)
    info = store.checkpoint({"a": arr})
    target = np.zeros_like(arr)
    store.restore_into(info.id, {"a": target})
    assert target.tobytes() == arr.tobytes()
    assert store.restore(info.id)["a"] == arr.tobytes()


def test_checkpoint_keeps_no_reference_to_caller_buffers(store):
    ba = bytearray(rand_bytes(50000))
    mm = mmap.mmap(-1, 8192)
    store.checkpoint({"ba": ba, "mm": mm})
    ba.extend(b"more")            # BufferError if a memoryview export leaked
    store.restore_into(store.latest().id, {"mm": mm})
    mm.close()


def test_buffer_mutated_after_checkpoint_does_not_change_it(store):
    buf = bytearray(rand_bytes(64 * KiB))
    original = bytes(buf)
    info = store.checkpoint({"b": buf})
    buf[:] = b"\0" * len(buf)
    assert store.restore(info.id) == {"b": original}


def test_many_buffers_in_one_checkpoint(store):
    bufs = {f"buf/{i:04d}": rand_bytes(i * 37 % 5000, i) for i in range(300)}
    info = store.checkpoint(bufs, stream="many")
    assert len(info.sizes) == 300
    assert store.restore(info.id) == bufs
    bufs2 = dict(bufs)
    bufs2["buf/0150"] = rand_bytes(len(bufs["buf/0150"]), 9999)
    info2 = store.checkpoint(bufs2, stream="many")
    assert info2.kind == "incremental"
    assert info2.bytes_new < 60 * KiB
    assert store.restore(info2.id) == bufs2
    assert store.restore(info.id) == bufs


def test_checkpoint_with_zero_buffers(store_path):
    with open_store(store_path) as s:
        info = s.checkpoint({}, stream="empty", meta={"note": "nothing"})
        assert info.sizes == {}
        assert info.kind == "full"
        assert s.restore(info.id) == {}
        assert s.latest("empty") == info
        s.restore_into(info.id, {})
        nxt = s.checkpoint({"a": b"now something"}, stream="empty")
        assert nxt.parent == info.id and nxt.kind == "full"
        assert s.restore(nxt.id) == {"a": b"now something"}
    with open_store(store_path) as s:
        assert s.restore(info.id) == {}


def test_buffers_can_come_and_go_between_checkpoints(store):
    a, b = rand_bytes(20000, 1), rand_bytes(30000, 2)
    i1 = store.checkpoint({"a": a, "b": b})
    i2 = store.checkpoint({"a": a})
    i3 = store.checkpoint({"a": a, "b": b, "c": b"new"})
    assert store.restore(i1.id) == {"a": a, "b": b}
    assert store.restore(i2.id) == {"a": a}
    assert store.restore(i3.id) == {"a": a, "b": b, "c": b"new"}
    with pytest.raises(CheckpointNotFound):
        store.read(i2.id, "b")


# =========================================================================================
# invalid input: clear exceptions, nothing written
# =========================================================================================
BAD_BUFFERS = {
    "str": ("text", TypeError),
    "int": (12, TypeError),
    "none": (None, TypeError),
    "list": ([1, 2, 3], TypeError),
    "np_strided": (np.arange(100, dtype=np.int32)[::2], ValueError),
    "np_fortran": (np.asfortranarray(np.arange(100, dtype=np.int32).reshape(10, 10)), ValueError),
    "np_column": (np.arange(100, dtype=np.int32).reshape(10, 10)[:, 3], ValueError),
    "mv_step": (memoryview(b"abcdefgh")[::2], ValueError),
}


@pytest.mark.parametrize("case", sorted(BAD_BUFFERS))
def test_bad_buffers_are_rejected_before_anything_is_written(store, case):
    obj, exc = BAD_BUFFERS[case]
    store.checkpoint({"good": rand_bytes(5000)}, stream="s")
    before = snapshot(store)
    with pytest.raises(exc):
        # a large valid buffer first: nothing of it may reach the log
        store.checkpoint({"big": rand_bytes(MiB, 3), "bad": obj}, stream="s")
    with pytest.raises(exc):
        store.checkpoint({"bad": obj}, stream="fresh")
    assert snapshot(store) == before
    info = store.checkpoint({"good": rand_bytes(5000)}, stream="s")    # still usable
    assert info.parent == before[0][-1].id


def test_buffers_must_be_a_mapping(store):
    before = snapshot(store)
    for bad in ([("a", b"x")], b"abc", None, 3):
        with pytest.raises(TypeError):
            store.checkpoint(bad)
    assert snapshot(store) == before


BAD_NAMES = [
    ("", ValueError), ("a\0b", ValueError), ("\0", ValueError), ("x" * 256, ValueError),
    ("é" * 128, ValueError), (1, TypeError), (b"bytes", TypeError), (None, TypeError),
    (("t",), TypeError),
]


@pytest.mark.parametrize("name,exc", BAD_NAMES, ids=[repr(n)[:20] for n, _ in BAD_NAMES])
def test_bad_stream_and_buffer_names_are_rejected(store, name, exc):
    store.checkpoint({"a": b"1"}, stream="s")
    before = snapshot(store)
    with pytest.raises(exc):
        store.checkpoint({"a": rand_bytes(10000)}, stream=name)
    with pytest.raises(exc):
        store.checkpoint({"ok": rand_bytes(10000), name: b"x"}, stream="s")
    if name is not None:      # None means "every stream" for checkpoints()
        with pytest.raises(exc):
            store.checkpoints(name)
    with pytest.raises(exc):
        store.latest(name)
    assert snapshot(store) == before


@pytest.mark.parametrize("name", ["x" * 255, "é" * 127 + "a", "ü", "a b/c:d", "流/🚀", "\t"])
def test_names_up_to_255_utf8_bytes_work(store_path, name):
    with open_store(store_path) as s:
        info = s.checkpoint({name: b"payload"}, stream=name)
        assert s.streams() == [name]
        assert s.latest(name) == info
        assert s.checkpoints(name) == [info]
        assert s.read(info.id, name) == b"payload"
    with open_store(store_path) as s:
        assert s.restore(info.id) == {name: b"payload"}
        assert s.streams() == [name]


def test_streams_whose_names_are_prefixes_stay_apart(store):
    a = store.checkpoint({"x": b"1"}, stream="a")
    ab = store.checkpoint({"x": b"2"}, stream="ab")
    a_b = store.checkpoint({"x": b"3"}, stream="a b")
    assert store.checkpoints("a") == [a]
    assert store.checkpoints("ab") == [ab]
    assert store.checkpoints("a b") == [a_b]
    assert store.streams() == ["a", "a b", "ab"]
    store.delete(a.id)
    assert store.streams() == ["a b", "ab"]
    assert store.checkpoints("ab") == [ab]


def test_lone_surrogate_name_is_an_invalid_argument(store):
    with pytest.raises(errors.InvalidArgumentError):
        store.checkpoint({"a": b"1"}, stream="\ud800")


def test_lone_surrogate_name_writes_nothing(store):
    store.checkpoint({"a": b"1"}, stream="s")
    before = snapshot(store)
    with pytest.raises(ValueError):
        store.checkpoint({"a": b"1"}, stream="\ud800")
    with pytest.raises(ValueError):
        store.checkpoint({"\udfff": b"1"}, stream="s")
    assert snapshot(store) == before


def test_bad_per_call_chunking_is_rejected(store):
    before = snapshot(store)
    with pytest.raises(ValueError):
        store.checkpoint({"a": b"1"}, chunking="fixed")
    assert snapshot(store) == before


# =========================================================================================
# restore / restore_into / read
# =========================================================================================
def test_restore_unknown_id(store):
    with pytest.raises(CheckpointNotFound):
        store.restore(12345)
    info = store.checkpoint({"a": b"1"})
    with pytest.raises(CheckpointNotFound):
        store.restore(info.id + 1)
    # A str is a checkpoint name since issue 15 (store.restore("stream") raised TypeError while
    # store.load("stream") worked): "1" names nothing here, the stream names its newest.
    with pytest.raises(CheckpointNotFound):
        store.restore(str(info.id))
    assert store.restore("default") == {"a": b"1"}
    with pytest.raises(TypeError):
        store.restore(float(info.id))


def test_restore_into_in_place(store):
    w = rand_bytes(300 * KiB + 17, 1)
    o = np.frombuffer(rand_bytes(8 * 1000, 2), dtype=np.float64).reshape(10, 100).copy()
    info = store.checkpoint({"w": w, "o": o})
    tw = bytearray(len(w))
    to = np.empty_like(o)
    store.restore_into(info.id, {"w": tw, "o": to})
    assert tw == w
    assert to.tobytes() == o.tobytes()
    # a subset, into memoryview and mmap targets
    mv_target = bytearray(len(w))
    store.restore_into(info.id, {"w": memoryview(mv_target)})
    assert mv_target == w
    mm = mmap.mmap(-1, len(w))
    store.restore_into(info.id, {"w": mm})
    assert mm[:] == w
    mm.close()


def test_restore_into_overwrites_every_byte(store):
    data = rand_bytes(40000, 3)
    info = store.checkpoint({"a": data})
    for fill in (0x00, 0xFF):
        target = bytearray([fill]) * len(data)
        store.restore_into(info.id, {"a": target})
        assert target == data


def test_restore_into_targets_that_share_memory_are_refused(store):
    """Two targets over the same memory: the second overwrote what the first received, and
    the caller got wrong bytes without a word (found by the boring-case sweep)."""
    info = store.checkpoint({"p": b"1" * 100, "q": b"2" * 100, "e": b"", "w": b"3" * 300})
    buf = bytearray(300)
    for targets in ({"w": buf, "p": memoryview(buf)[:100]},
                    {"p": memoryview(buf)[:100], "q": memoryview(buf)[:100]},
                    {"p": memoryview(buf)[:100], "q": memoryview(buf)[99:199]}):
        with pytest.raises(snapstore.errors.InvalidArgumentError, match="share memory"):
            store.restore_into(info.id, targets)
    assert buf == bytearray(300)                # nothing written
    store.restore_into(info.id, {"p": memoryview(buf)[:100], "q": memoryview(buf)[100:200],
                                 "e": memoryview(buf)[50:50]})   # adjacent, empty: fine
    assert bytes(buf[:200]) == b"1" * 100 + b"2" * 100


def test_restore_into_checks_everything_before_writing(store):
    a, b = rand_bytes(10000, 1), rand_bytes(20000, 2)
    info = store.checkpoint({"a": a, "b": b})
    ta = bytearray(len(a))

    def untouched():
        return ta == bytearray(len(a))

    with pytest.raises(ValueError):                          # wrong size
        store.restore_into(info.id, {"a": ta, "b": bytearray(len(b) - 1)})
    assert untouched()
    with pytest.raises(ValueError):
        store.restore_into(info.id, {"a": ta, "b": bytearray(len(b) + 1)})
    assert untouched()
    with pytest.raises(CheckpointNotFound):                  # unknown buffer name
        store.restore_into(info.id, {"a": ta, "zzz": bytearray(10)})
    assert untouched()
    with pytest.raises(KeyError):
        store.restore_into(info.id, {"a": ta, "zzz": bytearray(10)})
    assert untouched()
    for readonly in (bytes(len(b)), memoryview(bytearray(len(b))).toreadonly()):
        with pytest.raises(TypeError):                       # read-only target
            store.restore_into(info.id, {"a": ta, "b": readonly})
        assert untouched()
    frozen = np.zeros(len(b), dtype=np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(TypeError):
        store.restore_into(info.id, {"a": ta, "b": frozen})
    assert untouched() and not frozen.any()
    strided = np.zeros(2 * len(b), dtype=np.uint8)[::2]
    with pytest.raises(ValueError):                          # non-contiguous target
        store.restore_into(info.id, {"a": ta, "b": strided})
    assert untouched()
    with pytest.raises(TypeError):                           # not a buffer at all
        store.restore_into(info.id, {"a": ta, "b": "text"})
    assert untouched()
    with pytest.raises(TypeError):
        store.restore_into(info.id, [("a", ta)])
    assert untouched()
    with pytest.raises(CheckpointNotFound):
        store.restore_into(info.id + 99, {"a": ta})
    assert untouched()


READ_CASES = [(0, None), (0, 0), (0, 1), (4095, 2), (4096, 4096), (1, 99999), (12345, 54321),
              (99999, 1), (100000, 0), (100000, None), (50000, None), (0, 100000)]


@pytest.mark.parametrize("offset,length", READ_CASES)
def test_read_ranges(store, offset, length):
    data = rand_bytes(100000, 4)
    info = store.checkpoint({"a": data})
    changed = mutate_pages(data, [0, 3, 12, 24])
    info2 = store.checkpoint({"a": changed})
    assert info2.kind == "incremental"
    end = None if length is None else offset + length
    if length is None:
        assert store.read(info.id, "a", offset) == data[offset:]
        assert store.read(info2.id, "a", offset) == changed[offset:]
    else:
        assert store.read(info.id, "a", offset, length) == data[offset:end]
        assert store.read(info2.id, "a", offset, length) == changed[offset:end]


def test_read_whole_buffer_default_args(store):
    data = rand_bytes(3 * MiB // 2, 5)      # large enough for any "big result" path
    info = store.checkpoint({"a": data, "e": b""})
    out = store.read(info.id, "a")
    assert type(out) is bytes and out == data
    assert store.read(info.id, "e") == b""
    assert store.read(info.id, "a", 1, MiB + 7) == data[1:MiB + 8]
    assert store.restore(info.id)["a"] == data


@pytest.mark.parametrize("offset,length,exc", [
    (100001, None, ValueError), (100001, 0, ValueError), (0, 100001, ValueError),
    (99999, 2, ValueError), (-1, 1, ValueError), (0, -1, ValueError), (1.0, 1, (TypeError, ValueError)),
    (0, "1", (TypeError, ValueError)), (True, 1, (TypeError, ValueError)),
])
def test_read_out_of_bounds_is_rejected(store, offset, length, exc):
    info = store.checkpoint({"a": rand_bytes(100000)})
    with pytest.raises(exc):
        store.read(info.id, "a", offset, length)


def test_read_unknown_buffer_or_checkpoint(store):
    info = store.checkpoint({"a": b"abc"})
    with pytest.raises(CheckpointNotFound):
        store.read(info.id, "b", 0, 1)
    with pytest.raises(KeyError):
        store.read(info.id, "b")
    with pytest.raises(CheckpointNotFound):
        store.read(info.id + 1, "a", 0, 1)


# ---- reads touch only the chunks they need ---------------------------------------------
def _corrupt_stored_copy_of(store_path, needle: bytes) -> None:
    """Flips a byte of the one stored copy of `needle` in the segment files."""
    seg_dir = os.path.join(store_path, "segments")
    hits = []
    for name in sorted(os.listdir(seg_dir)):
        path = os.path.join(seg_dir, name)
        with open(path, "rb") as f:
            data = f.read()
        pos = data.find(needle)
        while pos >= 0:
            hits.append((path, pos))
            pos = data.find(needle, pos + 1)
    assert len(hits) == 1, hits
    path, pos = hits[0]
    with open(path, "r+b") as f:
        f.seek(pos + len(needle) // 2)
        byte = f.read(1)
        f.seek(pos + len(needle) // 2)
        f.write(bytes([byte[0] ^ 0x55]))


def test_read_touches_only_the_chunks_it_needs(store_path):
    chunk = 64 * KiB
    data = rand_bytes(16 * chunk, 11)
    with open_store(store_path, compression="none", chunk_size=chunk) as s:
        full = s.checkpoint({"w": data, "other": rand_bytes(5000, 12)})
        changed = mutate_pages(data, [0, 1])
        inc = s.checkpoint({"w": changed, "other": rand_bytes(5000, 12)})
        assert inc.kind == "incremental"
    bad = 10 * chunk + 1000
    _corrupt_stored_copy_of(store_path, data[bad:bad + 64])
    with open_store(store_path, compression="none", chunk_size=chunk) as s:
        for cid, src in ((full.id, data), (inc.id, changed)):
            assert s.read(cid, "w", 0, chunk) == src[:chunk]
            assert s.read(cid, "w", 11 * chunk, 5 * chunk) == src[11 * chunk:]
            assert s.read(cid, "w", 9 * chunk, chunk) == src[9 * chunk:10 * chunk]
            assert s.read(cid, "other") == rand_bytes(5000, 12)
            with pytest.raises(CorruptionError):
                s.read(cid, "w", bad, 1)
            with pytest.raises(CorruptionError):
                s.read(cid, "w", 9 * chunk, chunk + 1)
            with pytest.raises(CorruptionError):
                s.restore(cid)
            target = bytearray(len(data))
            with pytest.raises(CorruptionError):
                s.restore_into(cid, {"w": target})
            other = bytearray(5000)                 # a buffer not using the bad chunk
            s.restore_into(cid, {"other": other})
            assert other == rand_bytes(5000, 12)


def test_zero_length_read_touches_no_chunk(store_path):
    chunk = 64 * KiB
    data = rand_bytes(4 * chunk, 13)
    with open_store(store_path, compression="none", chunk_size=chunk) as s:
        info = s.checkpoint({"w": data})
    _corrupt_stored_copy_of(store_path, data[2 * chunk + 100:2 * chunk + 164])
    with open_store(store_path, compression="none", chunk_size=chunk) as s:
        assert s.read(info.id, "w", 2 * chunk + 50, 0) == b""


# =========================================================================================
# full vs incremental
# =========================================================================================
def test_one_percent_pages_changed_is_incremental_and_small(store):
    size = 4 * MiB
    pages = size // PAGE
    data = rand_bytes(size, 21)
    first = store.checkpoint({"w": data}, stream="train")
    assert first.kind == "full" and first.chain_length == 0
    assert first.bytes_new >= size
    rng = np.random.default_rng(22)
    dirty = rng.choice(pages, pages // 100, replace=False)
    changed = mutate_pages(data, dirty)
    second = store.checkpoint({"w": changed}, stream="train")
    assert second.kind == "incremental"
    assert second.parent == first.id
    assert second.chain_length == 1
    assert len(dirty) * PAGE <= second.bytes_new < 0.03 * size
    assert store.restore(second.id) == {"w": changed}
    assert store.restore(first.id) == {"w": data}


def test_unchanged_buffer_costs_almost_nothing(store):
    data = rand_bytes(2 * MiB, 23)
    store.checkpoint({"w": data})
    info = store.checkpoint({"w": data})
    assert info.kind == "incremental"
    assert info.bytes_new < 4 * KiB
    assert store.restore(info.id) == {"w": data}


def test_bytes_new_is_about_the_changed_bytes_for_contiguous_changes(store):
    data = bytearray(rand_bytes(MiB, 24))
    store.checkpoint({"w": data})
    data[100 * KiB:228 * KiB] = rand_bytes(128 * KiB, 25)
    info = store.checkpoint({"w": data})
    assert info.kind == "incremental"
    assert 128 * KiB <= info.bytes_new < 128 * KiB + 2 * PAGE + 4 * KiB
    assert store.restore(info.id) == {"w": bytes(data)}


def test_size_change_is_full(store):
    data = rand_bytes(200 * KiB, 26)
    store.checkpoint({"w": data})
    for new in (data + b"x", data[:-1], data[:PAGE * 10], b""):
        info = store.checkpoint({"w": new})
        assert info.kind == "full", len(new)
        assert info.chain_length == 0
        assert store.restore(info.id) == {"w": new}


def test_most_pages_changed_is_full(store):
    data = rand_bytes(MiB, 27)
    store.checkpoint({"w": data})
    changed = mutate_pages(data, range(0, 256, 4))           # 25%: incremental
    inc = store.checkpoint({"w": changed})
    assert inc.kind == "incremental"
    changed2 = mutate_pages(changed, range(0, 200))          # 78%: full
    full = store.checkpoint({"w": changed2})
    assert full.kind == "full" and full.chain_length == 0
    assert store.restore(inc.id) == {"w": changed}
    assert store.restore(full.id) == {"w": changed2}


@pytest.mark.parametrize("threshold,fraction,kind", [
    (0.1, 0.05, "incremental"), (0.1, 0.2, "full"), (0.0, 0.01, "full"), (0.0, 0.0, "incremental"),
    (1.0, 1.0, "incremental"), (0.9, 0.8, "incremental"),
])
def test_full_threshold_option(store_path, threshold, fraction, kind):
    data = rand_bytes(100 * PAGE, 28)
    with open_store(store_path, full_threshold=threshold) as s:
        s.checkpoint({"w": data})
        changed = mutate_pages(data, range(int(round(fraction * 100))))
        info = s.checkpoint({"w": changed})
        assert info.kind == kind
        assert s.restore(info.id) == {"w": changed}


@pytest.mark.parametrize("max_chain", [1, 2, 4, None])
def test_max_chain_forces_full_checkpoints(store_path, max_chain):
    opts = {} if max_chain is None else {"max_chain": max_chain}
    limit = 16 if max_chain is None else max_chain
    data = rand_bytes(64 * KiB, 29)
    versions, infos = [], []
    with open_store(store_path, **opts) as s:
        for i in range(2 * limit + 3):
            data = mutate_pages(data, [i % 16], seed=i)
            infos.append(s.checkpoint({"w": data}, stream="c"))
            versions.append(data)
        chains = [info.chain_length for info in infos]
        kinds = [info.kind for info in infos]
        assert max(chains) <= limit
        assert chains[0] == 0
        fulls = [i for i, k in enumerate(kinds) if k == "full"]
        assert len(fulls) >= 2                                # the chain was reset
        for i in range(1, len(infos)):                        # chains grow by one or reset
            assert chains[i] in (0, chains[i - 1] + 1)
            assert (chains[i] == 0) == (kinds[i] == "full")
        if limit > 1:
            assert max(chains) >= limit - 1                   # deltas were actually used
        assert s.stats()["max_chain_length"] == max(chains)
        for info, v in zip(infos, versions):
            assert s.restore(info.id) == {"w": v}


def test_reopened_store_keeps_taking_incremental_checkpoints(store_path):
    data = rand_bytes(MiB, 30)
    with snapstore.open(store_path, durability="fsync") as s:
        first = s.checkpoint({"w": data}, stream="t")
    changed = mutate_pages(data, [3, 100, 200])
    with snapstore.open(store_path, durability="fsync") as s:
        second = s.checkpoint({"w": changed}, stream="t")
        assert second.kind == "incremental"
        assert second.parent == first.id
        assert second.bytes_new < 5 * PAGE + 4 * KiB
    changed2 = mutate_pages(changed, [7])
    with snapstore.open(store_path) as s:
        third = s.checkpoint({"w": changed2}, stream="t")
        assert third.kind == "incremental" and third.chain_length == 2
        assert s.restore(first.id) == {"w": data}
        assert s.restore(second.id) == {"w": changed}
        assert s.restore(third.id) == {"w": changed2}


def test_reopen_with_another_page_size_stays_exact(store_path):
    data = rand_bytes(256 * KiB, 31)
    with open_store(store_path, page_size=4096) as s:
        a = s.checkpoint({"w": data})
    changed = mutate_pages(data, [1], page=512)
    with open_store(store_path, page_size=512) as s:
        b = s.checkpoint({"w": changed})
        changed2 = mutate_pages(changed, [9], page=512)
        c = s.checkpoint({"w": changed2})
        assert c.kind == "incremental"
        assert c.bytes_new < 4 * KiB
        assert s.restore(a.id) == {"w": data}
        assert s.restore(b.id) == {"w": changed}
        assert s.restore(c.id) == {"w": changed2}


def test_small_page_size_deltas(store_path):
    data = rand_bytes(100 * 512 + 77, 32)
    with open_store(store_path, page_size=512, max_chain=3) as s:
        infos, versions = [], []
        for i in range(8):
            data = mutate_pages(data, [i, 100], seed=i, page=512)   # 100: the partial last page
            infos.append(s.checkpoint({"w": data}))
            versions.append(data)
        assert [i.kind for i in infos].count("incremental") >= 4
        for info, v in zip(infos, versions):
            assert s.restore(info.id) == {"w": v}
            assert s.read(info.id, "w", len(v) - 100) == v[-100:]


# =========================================================================================
# dedup and content-defined chunking
# =========================================================================================
def test_same_content_in_a_second_stream_is_stored_once(store):
    data = rand_bytes(2 * MiB, 33)
    a = store.checkpoint({"w": data}, stream="a")
    b = store.checkpoint({"w": data}, stream="b")
    assert b.kind == "full"
    assert b.bytes_new < 0.01 * len(data)
    stats = store.stats()
    assert stats["dedup_ratio"] > 1.8
    assert stats["logical_bytes"] == 2 * len(data)
    assert store.restore(a.id) == store.restore(b.id) == {"w": data}


def test_identical_buffers_in_one_checkpoint_are_stored_once(store):
    data = rand_bytes(MiB, 34)
    info = store.checkpoint({"x": data, "y": data, "z": bytearray(data)})
    assert info.bytes_new < 1.05 * len(data)
    assert store.stats()["dedup_ratio"] > 2.5
    assert store.restore(info.id) == {"x": data, "y": data, "z": data}


def test_reverting_to_an_earlier_state_stores_nothing_new(store):
    data = rand_bytes(MiB, 35)
    other = rand_bytes(MiB, 36)
    store.checkpoint({"w": data}, stream="s")
    store.checkpoint({"w": other}, stream="s")     # most pages changed -> full
    back = store.checkpoint({"w": data}, stream="s")
    assert back.bytes_new < 0.01 * len(data)
    assert store.restore(back.id) == {"w": data}


def test_cdc_insertion_costs_a_few_chunks(store_path):
    sizes = (4 * KiB, 16 * KiB, 64 * KiB)
    data = rand_bytes(2 * MiB, 37)
    shifted = data[:MiB] + rand_bytes(100, 38) + data[MiB:]
    with open_store(store_path, chunking="cdc", cdc_sizes=sizes) as s:
        a = s.checkpoint({"w": data})
        b = s.checkpoint({"w": shifted})
        assert b.bytes_new < 4 * sizes[2] + 16 * KiB
        assert s.restore(a.id) == {"w": data}
        assert s.restore(b.id) == {"w": shifted}
        assert s.read(b.id, "w", MiB - 10, 120) == shifted[MiB - 10:MiB + 110]
        deleted = data[:500 * KiB] + data[500 * KiB + 3:]
        c = s.checkpoint({"w": deleted})
        assert c.bytes_new < 4 * sizes[2] + 16 * KiB
        assert s.restore(c.id) == {"w": deleted}


def test_pages_chunking_pays_for_an_insertion_and_per_call_cdc_does_not(store_path):
    sizes = (4 * KiB, 16 * KiB, 64 * KiB)
    data = rand_bytes(2 * MiB, 39)
    shifted = data[:MiB] + rand_bytes(100, 40) + data[MiB:]
    with open_store(store_path, cdc_sizes=sizes) as s:
        s.checkpoint({"w": data}, stream="pages")
        p = s.checkpoint({"w": shifted}, stream="pages")
        assert p.bytes_new > 0.4 * len(data)                  # everything after the insertion
        s.checkpoint({"w": data}, stream="cdc", chunking="cdc")
        c = s.checkpoint({"w": shifted}, stream="cdc", chunking="cdc")
        assert c.bytes_new < 4 * sizes[2] + 16 * KiB
        assert s.restore(c.id) == {"w": shifted}
        # back to pages in the cdc stream: still exact
        d = s.checkpoint({"w": shifted}, stream="cdc")
        assert s.restore(d.id) == {"w": shifted}


# =========================================================================================
# delete
# =========================================================================================
def _build_chain(s, n=7, stream="s", seed=50):
    """n checkpoints of two buffers: w changes a few pages each time (full every 3 with
    max_chain=3); g grows at 1 (stored full inside an incremental checkpoint) and at 3 (with
    w's reset, so checkpoints 0, 3 and 6 are full, the others incremental)."""
    w = rand_bytes(48 * PAGE + 5, seed)
    g = rand_bytes(3 * PAGE, seed + 1)
    infos, versions = [], []
    for i in range(n):
        w = mutate_pages(w, [i, 10 + 3 * i, 47], seed=seed + i)
        if i in (1, 3):
            g = g + rand_bytes(PAGE // 2, seed + 100 + i)
        else:
            g = mutate_pages(g, [0], seed=seed + 200 + i)
        infos.append(s.checkpoint({"w": w, "g": g}, stream=stream, meta={"i": i}))
        versions.append({"w": w, "g": g})
    return infos, versions


def _check_live(s, live: dict):
    """live: {id: buffers}; every one restores byte-exact, nothing else is listed."""
    assert [c.id for c in s.checkpoints()] == sorted(live)
    for cid, bufs in live.items():
        assert s.restore(cid) == bufs
        for name, data in bufs.items():
            assert s.read(cid, name, len(data) // 3, len(data) // 3) == \
                data[len(data) // 3:2 * (len(data) // 3)]


@pytest.mark.parametrize("order", [[0], [1], [3], [5], [6], [2, 1, 0], [0, 1, 2, 3, 4, 5],
                                   [6, 5, 4], [1, 4], [3, 0, 5, 1], [4, 2, 6, 0]])
def test_delete_keeps_all_others_byte_exact(store_path, order):
    with open_store(store_path, max_chain=3) as s:
        infos, versions = _build_chain(s)
        kinds = [i.kind for i in infos]
        assert kinds == ["full", "incremental", "incremental", "full", "incremental",
                         "incremental", "full"]
        live = {i.id: v for i, v in zip(infos, versions)}
        for k in order:
            s.delete(infos[k].id)
            del live[infos[k].id]
            _check_live(s, live)
            with pytest.raises(CheckpointNotFound):
                s.get(infos[k].id)
            with pytest.raises(CheckpointNotFound):
                s.restore(infos[k].id)
        ids = sorted(live)
        for c in s.checkpoints():                 # parents point at live checkpoints only
            pos = ids.index(c.id)
            assert c.parent == (ids[pos - 1] if pos else None)
    with open_store(store_path, max_chain=3) as s:
        _check_live(s, live)
        if live:
            w = mutate_pages(live[max(live)]["w"], [5])
            nxt = s.checkpoint({"w": w, "g": live[max(live)]["g"]}, stream="s")
            assert nxt.parent == max(live)
            live[nxt.id] = {"w": w, "g": live[max(live)]["g"]}
            _check_live(s, live)


def test_delete_head_makes_previous_latest_and_next_checkpoint_restores(store_path):
    with open_store(store_path, max_chain=8) as s:
        infos, versions = _build_chain(s, n=4)
        s.delete(infos[-1].id)
        assert s.latest("s") == s.get(infos[-2].id)
        w = mutate_pages(versions[-2]["w"], [20, 21])
        nxt = s.checkpoint({"w": w, "g": versions[-2]["g"]}, stream="s")
        assert nxt.parent == infos[-2].id
        assert s.restore(nxt.id) == {"w": w, "g": versions[-2]["g"]}
        s.delete(nxt.id)
        s.delete(infos[-2].id)
        assert s.latest("s").id == infos[-3].id
        w2 = mutate_pages(versions[-3]["w"], [30])
        nxt2 = s.checkpoint({"w": w2, "g": versions[-3]["g"]}, stream="s")
        assert nxt2.parent == infos[-3].id
        assert s.restore(nxt2.id) == {"w": w2, "g": versions[-3]["g"]}
        for info, v in zip(infos[:-2], versions[:-2]):
            assert s.restore(info.id) == v
    with open_store(store_path) as s:
        assert s.latest("s").id == nxt2.id
        assert s.restore(nxt2.id) == {"w": w2, "g": versions[-3]["g"]}


def test_delete_head_then_reopen_then_checkpoint(store_path):
    data = rand_bytes(64 * PAGE, 60)
    with open_store(store_path) as s:
        a = s.checkpoint({"w": data})
        b = s.checkpoint({"w": mutate_pages(data, [1])})
        s.delete(b.id)
    with open_store(store_path) as s:
        assert s.latest().id == a.id
        changed = mutate_pages(data, [2])
        c = s.checkpoint({"w": changed})
        assert c.parent == a.id
        assert s.restore(c.id) == {"w": changed}
        assert s.restore(a.id) == {"w": data}


def test_deleting_every_checkpoint_of_a_stream_removes_it(store_path):
    with open_store(store_path) as s:
        keep = s.checkpoint({"k": b"keep me"}, stream="other")
        infos, _ = _build_chain(s, n=4, stream="gone")
        assert s.streams() == ["gone", "other"]
        for info in infos:
            s.delete(info.id)
        assert s.streams() == ["other"]
        assert s.latest("gone") is None
        assert s.checkpoints("gone") == []
        assert s.checkpoints() == [keep]
        assert s.stats()["checkpoints"] == 1 and s.stats()["streams"] == 1
        again = s.checkpoint({"w": b"fresh start"}, stream="gone")
        assert again.kind == "full" and again.parent is None
        assert again.id > infos[-1].id                        # ids are never reused
    with open_store(store_path) as s:
        assert s.streams() == ["gone", "other"]
        assert s.restore(again.id) == {"w": b"fresh start"}
        assert s.restore(keep.id) == {"k": b"keep me"}


def test_delete_unknown_or_bad_id(store):
    info = store.checkpoint({"a": b"1"})
    before = snapshot(store)
    with pytest.raises(CheckpointNotFound):
        store.delete(info.id + 1)
    with pytest.raises(CheckpointNotFound):
        store.delete(0)
    for bad in (None, 1.0, b"1"):
        with pytest.raises(TypeError):
            store.delete(bad)
    with pytest.raises(CheckpointNotFound):     # a str is a name since issue 15: none here
        store.delete(str(info.id))
    assert snapshot(store) == before
    store.delete(info.id)
    with pytest.raises(CheckpointNotFound):
        store.delete(info.id)
    with pytest.raises(KeyError):
        store.delete(info.id)


def test_delete_leaves_other_streams_alone(store):
    a_infos, a_versions = _build_chain(store, n=3, stream="a", seed=70)
    b_infos, b_versions = _build_chain(store, n=3, stream="b", seed=70)   # same data
    for info in a_infos:
        store.delete(info.id)
    for info, v in zip(b_infos, b_versions):
        assert store.restore(info.id) == v
    assert store.latest("b") == store.get(b_infos[-1].id)


def test_delete_updates_stats(store):
    full = store.checkpoint({"w": rand_bytes(MiB, 80)}, stream="s")
    other = store.checkpoint({"w": rand_bytes(MiB, 81)}, stream="s")
    stats = store.stats()
    assert stats["checkpoints"] == 2 and stats["logical_bytes"] == 2 * MiB
    store.delete(full.id)
    stats = store.stats()
    assert stats["checkpoints"] == 1 and stats["logical_bytes"] == MiB
    assert stats["garbage_chunk_bytes"] >= MiB
    assert store.restore(other.id) == {"w": rand_bytes(MiB, 81)}


def test_chain_length_after_delete_counts_the_remaining_deltas(store_path):
    data = bytearray(rand_bytes(10 * PAGE, 61))
    versions, ids = [], []
    with open_store(store_path, max_chain=8) as s:
        for i in range(5):
            data[i * PAGE] ^= 0xFF
            ids.append(s.checkpoint({"w": data}).id)
            versions.append(bytes(data))
        assert [s.get(i).chain_length for i in ids] == [0, 1, 2, 3, 4]
        s.delete(ids[0])                                    # the full base
        assert [s.get(i).chain_length for i in ids[1:]] == [0, 1, 2, 3]
        assert s.get(ids[1]).kind == "full"
        s.delete(ids[2])                                    # a middle delta
        assert [s.get(i).chain_length for i in (ids[1], ids[3], ids[4])] == [0, 1, 2]
        assert s.stats()["max_chain_length"] == 2
        for i in (1, 3, 4):
            assert s.restore(ids[i]) == {"w": versions[i]}
        data[7 * PAGE] ^= 0xFF                              # the chain goes on from there
        nxt = s.checkpoint({"w": data})
        assert nxt.kind == "incremental" and nxt.chain_length == 3
    with open_store(store_path, max_chain=8) as s:
        assert s.restore(nxt.id) == {"w": bytes(data)}
        for i in (1, 3, 4):
            assert s.restore(ids[i]) == {"w": versions[i]}


def test_scattered_delta_then_delete_its_parent(store):
    """A delta of many scattered pages (several packed chunks) absorbed by delete."""
    size = 4 * MiB
    data = rand_bytes(size, 62)
    rng = np.random.default_rng(63)
    a = store.checkpoint({"w": data})
    v1 = mutate_pages(data, sorted(rng.choice(size // PAGE, 200, replace=False)))
    b = store.checkpoint({"w": v1})
    v2 = mutate_pages(v1, sorted(rng.choice(size // PAGE, 150, replace=False)), seed=2)
    c = store.checkpoint({"w": v2})
    assert b.kind == c.kind == "incremental"
    assert b.bytes_new < 200 * PAGE + 32 * KiB
    store.delete(b.id)
    assert store.restore(c.id) == {"w": v2}
    store.delete(a.id)
    assert store.restore(c.id) == {"w": v2}
    for off in (0, 8191, size // 2 - 3, size - 5000):
        assert store.read(c.id, "w", off, 5000) == v2[off:off + 5000]


# =========================================================================================
# stats
# =========================================================================================
def test_stats_of_an_empty_store(store):
    stats = store.stats()
    for key in ("checkpoints", "streams", "chunks", "logical_bytes", "dedup_ratio",
                "max_chain_length", "mean_chain_length", "segment_bytes"):
        assert key in stats
    assert stats["checkpoints"] == 0 and stats["streams"] == 0
    assert stats["logical_bytes"] == 0
    assert stats["max_chain_length"] == 0 and stats["mean_chain_length"] == 0
    assert stats["dedup_ratio"] >= 1.0
    json.dumps({k: v for k, v in stats.items() if k != "dedup_ratio"})


def test_stats_counts_and_chains(store_path):
    with open_store(store_path, max_chain=4) as s:
        data = rand_bytes(32 * PAGE, 90)
        chains = []
        for i in range(6):
            data = mutate_pages(data, [i])
            chains.append(s.checkpoint({"w": data}, stream="a").chain_length)
        s.checkpoint({"w": b"x" * 10, "v": b""}, stream="b")
        stats = s.stats()
        assert stats["checkpoints"] == 7
        assert stats["streams"] == 2
        assert stats["logical_bytes"] == 6 * len(data) + 10
        assert stats["max_chain_length"] == max(chains)
        assert stats["mean_chain_length"] == pytest.approx(sum(chains) / 7)
        assert stats["chunks"] >= 1
        assert stats["segment_bytes"] >= len(data)


def test_bytes_new_is_exactly_the_log_growth(store):
    """bytes_new is what the checkpoint added to the log: full, incremental, unchanged,
    deduplicated, content-defined, empty."""
    data = rand_bytes(MiB, 92)
    cases = [({"w": data}, "s", None), ({"w": mutate_pages(data, [5])}, "s", None),
             ({"w": mutate_pages(data, [5])}, "s", None), ({"w": data}, "other", None),
             ({"w": data, "v": b"x" * 1000}, "cdc", "cdc"), ({}, "s", None),
             ({"e": b""}, "s", None)]
    for bufs, stream, chunking in cases:
        before = store.stats()["segment_bytes"]
        kw = {"chunking": chunking} if chunking else {}
        info = store.checkpoint(bufs, stream=stream, meta={"n": len(bufs)}, **kw)
        assert store.stats()["segment_bytes"] - before == info.bytes_new


# =========================================================================================
# sizes: segment rollover, buffers larger than the staging area, many stores
# =========================================================================================
def test_segment_rollover(store_path):
    opts = dict(segment_size=1 << 16, max_chain=3)
    versions = {}
    with open_store(store_path, **opts) as s:
        data = rand_bytes(300 * KiB, 64)
        for i in range(8):
            data = mutate_pages(data, [i, 40 + i], seed=i) if i % 4 else rand_bytes(300 * KiB, i)
            small = rand_bytes(i * 1000, 100 + i)
            info = s.checkpoint({"w": data, "small": small}, stream=f"s{i % 2}")
            versions[info.id] = {"w": data, "small": small}
        assert s.stats()["segments"] > 4
        for cid, v in versions.items():
            assert s.restore(cid) == v
        first = min(versions)
        s.delete(first)
        del versions[first]
    with open_store(store_path, **opts) as s:
        for cid, v in versions.items():
            assert s.restore(cid) == v
            assert s.read(cid, "w", 70000, 70000) == v["w"][70000:140000]
        info = s.checkpoint({"w": b"after reopen"}, stream="s0")
        assert s.restore(info.id) == {"w": b"after reopen"}


def test_buffer_larger_than_the_staging_area(store):
    size = 20 * MiB + 123
    arr = np.frombuffer(rand_bytes(size, 65), dtype=np.uint8).copy()
    a = store.checkpoint({"big": arr})
    for p in (0, 2047, 2048, 2049, 4096, size // PAGE):      # around 8 MiB boundaries
        arr[min(p * PAGE, size - 1)] ^= 0xFF
    b = store.checkpoint({"big": arr})
    assert b.kind == "incremental" and b.bytes_new < 64 * KiB
    assert store.read(b.id, "big", 8 * MiB - 100, 200) == arr[8 * MiB - 100:8 * MiB + 100].tobytes()
    target = np.empty_like(arr)
    store.restore_into(b.id, {"big": target})
    assert np.array_equal(target, arr)
    assert store.restore(a.id)["big"] == rand_bytes(size, 65)


def test_many_stores_open_at_once(tmp_path):
    stores = []
    try:
        for i in range(160):
            stores.append(open_store(str(tmp_path / f"s{i}")))
        for i, s in enumerate(stores):
            s.checkpoint({"i": str(i).encode()})
    finally:
        for s in stores:
            s.close()


# =========================================================================================
# thread safety
# =========================================================================================
def test_concurrent_checkpoints_and_restores(store_path):
    n_writers, n_ckpts = 4, 6
    committed = {}                 # id -> buffers (dict updates are atomic under the GIL)
    failures = []
    done = threading.Event()

    with open_store(store_path, max_chain=3) as s:
        def writer(k):
            try:
                rng = np.random.default_rng(1000 + k)
                w = bytearray(rand_bytes(200 * KiB + k * 999, 1000 + k))
                o = np.frombuffer(rand_bytes(8 * 5000, 2000 + k), dtype=np.float64).copy()
                for i in range(n_ckpts):
                    for p in rng.choice(len(w) // PAGE, 3, replace=False):
                        w[p * PAGE] ^= 0xFF
                    o[rng.integers(0, len(o))] += 1.0
                    info = s.checkpoint({"w": w, "o": o}, stream=f"t{k}", meta={"i": i})
                    expected = {"w": bytes(w), "o": o.tobytes()}
                    committed[info.id] = expected
                    got = s.restore(info.id)
                    if got != expected:
                        failures.append(("restore", k, info.id))
                    if s.latest(f"t{k}").id != info.id:
                        failures.append(("latest", k, info.id))
                    if i == 2:                                  # delete in the middle
                        victim = s.checkpoints(f"t{k}")[1].id
                        s.delete(victim)
                        committed.pop(victim)
            except Exception as exc:                            # pragma: no cover
                failures.append(("writer", k, repr(exc)))

        def reader(k):
            rng = np.random.default_rng(3000 + k)
            try:
                while not done.is_set():
                    ids = list(committed)
                    if not ids:
                        time.sleep(0.001)
                        continue
                    cid = ids[int(rng.integers(0, len(ids)))]
                    expected = committed.get(cid)
                    try:
                        got = s.read(cid, "w", 1000, 5000)
                        if expected is not None and got != expected["w"][1000:6000]:
                            failures.append(("read", cid))
                        target = bytearray(len(expected["o"])) if expected else None
                        if target is not None:
                            s.restore_into(cid, {"o": target})
                            if target != expected["o"]:
                                failures.append(("restore_into", cid))
                    except CheckpointNotFound:
                        pass                                    # deleted meanwhile
            except Exception as exc:                            # pragma: no cover
                failures.append(("reader", k, repr(exc)))

        writers = [threading.Thread(target=writer, args=(k,)) for k in range(n_writers)]
        readers = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
        for t in writers + readers:
            t.start()
        for t in writers:
            t.join(60)
        done.set()
        for t in readers:
            t.join(60)
        assert not failures, failures[:5]
        assert sorted(committed) == [c.id for c in s.checkpoints()]
        assert len(committed) == n_writers * (n_ckpts - 1)
        for cid, expected in committed.items():
            assert s.restore(cid) == expected
        assert s.streams() == [f"t{k}" for k in range(n_writers)]
    with open_store(store_path) as s:
        for cid, expected in committed.items():
            assert s.restore(cid) == expected


def test_object_arrays_are_refused_before_anything_is_written(store):
    """dtype=object buffers hold PyObject pointers: storing or restoring them as bytes would
    be meaningless (and restoring into one could crash the process)."""
    before = store.checkpoints()
    with pytest.raises(TypeError, match="object pointers"):
        store.checkpoint({"o": np.array([object(), object()])})
    assert store.checkpoints() == before
    info = store.checkpoint({"a": bytes(16)})
    with pytest.raises(TypeError, match="object pointers"):
        store.restore_into(info.id, {"a": np.empty(2, dtype=object)})


def test_delete_many_is_all_or_nothing(store):
    data = bytearray(np.random.default_rng(5).integers(0, 256, 64 << 10, dtype=np.uint8))
    ids, expected = [], {}
    for step in range(6):
        data[step * 4096] ^= 0xFF
        info = store.checkpoint({"a": data}, stream="s")
        ids.append(info.id)
        expected[info.id] = bytes(data)
    with pytest.raises(CheckpointNotFound):
        store.delete_many([ids[1], 999_999])
    assert [c.id for c in store.checkpoints("s")] == ids        # nothing was deleted
    store.delete_many([ids[1], ids[3], ids[3]])
    assert [c.id for c in store.checkpoints("s")] == [ids[0], ids[2], ids[4], ids[5]]
    for cid in (ids[0], ids[2], ids[4], ids[5]):
        assert store.restore(cid)["a"] == expected[cid]
    store.delete_many([])
    assert store.verify()["ok"]


def test_closed_property(tmp_path):
    s = snapstore.open(tmp_path / "s")
    assert not s.closed
    s.close()
    assert s.closed


def test_group_commit_applies_the_full_rule_across_its_parts(store):
    """The checkpoint-level full_threshold counts every part of a group: a part whose buffer
    did not change (a DCP save's metadata) does not keep a checkpoint whose other parts
    changed completely "incremental", and grows no chain; a small change stays a delta."""
    big, small = bytearray(rand_bytes(256 << 10, 1)), rand_bytes(6000, 2)
    infos = []
    for seed in range(3):
        big[:] = rand_bytes(len(big), 10 + seed)            # every byte changes
        g = store.group("g", ["big", "small"], timeout=30)
        store.stage(g.id, "big", {"big": big})
        store.stage(g.id, "small", {"small": small})          # unchanged: a delta on its own
        infos.append(g.commit())
    assert [(i.kind, i.chain_length) for i in infos] == [("full", 0)] * 3
    big[8192:8200] = b"changed!"
    g = store.group("g", ["big", "small"], timeout=30)
    store.stage(g.id, "big", {"big": big})
    store.stage(g.id, "small", {"small": small})
    last = g.commit()
    assert (last.kind, last.chain_length) == ("incremental", 1) and last.bytes_new < 16 << 10
    for info, want in ((infos[-1], None), (last, bytes(big))):
        got = store.restore(info.id)
        assert got["small"] == small and (want is None or got["big"] == want)
    assert store.verify(deep=True)["ok"]


def test_checkpoint_ids_change_whenever_another_writer_changes_the_stream(store_path):
    """checkpoint_ids(stream): ids oldest first, the last the head; (last, count) differs after
    any commit or delete of the stream, also one another writer (Store) made, also a delete of
    a checkpoint other than the head (what the LangGraph saver's stream caches rely on)."""
    with open_store(store_path, durability="none") as a, \
            open_store(store_path, durability="none") as b:
        assert a.checkpoint_ids("s") == []
        ids = [a.checkpoint({"x": bytes([i]) * 100}, stream="s").id for i in range(3)]
        b.checkpoint({"x": b"other"}, stream="t")
        assert b.checkpoint_ids("s") == ids and b.latest("s").id == ids[-1]
        seen = {(ids[-1], 3)}
        b.delete(ids[1])                                   # not the head
        assert a.checkpoint_ids("s") == [ids[0], ids[2]]
        new = b.checkpoint({"x": b"y" * 100}, stream="s").id
        assert a.checkpoint_ids("s") == [ids[0], ids[2], new]
        b.delete(new)                                      # the head
        now = a.checkpoint_ids("s")
        assert now == [ids[0], ids[2]] and (now[-1], len(now)) not in seen
        with pytest.raises(errors.InvalidArgumentError):
            a.checkpoint_ids("")


def test_stream_version_changes_whenever_any_writer_changes_the_stream(store_path):
    """stream_version(stream) = (head, seq, count), read without listing the stream: it never
    repeats across commits and deletes of the stream, by this or another writer, and always
    agrees with the listing (checkpoint_ids) and the stream's seq."""
    def check(s, stream="s"):
        got = s.stream_version(stream)
        ids = s.checkpoint_ids(stream)
        if not ids:
            assert got is None
        else:
            assert got[0] == ids[-1] and got[2] == len(ids)
            assert got[1] >= s.get(ids[-1]).seq
        return got

    with open_store(store_path, durability="none") as a, \
            open_store(store_path, durability="none") as b:
        assert check(a) is None
        seen = []
        ids = [a.checkpoint({"x": bytes([i]) * 100}, stream="s").id for i in range(3)]
        seen.append(check(b))
        b.checkpoint({"x": b"other"}, stream="t")             # another stream: unchanged
        assert check(a) == seen[-1]
        b.checkpoint({"x": bytes([2]) * 100}, stream="s")      # nothing changed: still new
        seen.append(check(a))
        b.delete(ids[1])                                       # not the head
        seen.append(check(a))
        head = a.latest("s").id
        a.delete(head)                                         # the head
        seen.append(check(b))
        b.delete_many([c.id for c in b.checkpoints("s")])      # all of them
        assert check(a) is None
        a.checkpoint({"x": b"again"}, stream="s")              # the stream anew
        seen.append(check(b))
        assert len(set(seen)) == len(seen), seen
        a.checkpoint({"x": b"again"}, stream="s")              # the same call twice
        seen.append(check(b))
        assert len(set(seen)) == len(seen), seen
        with pytest.raises(errors.InvalidArgumentError):
            a.stream_version("")
        assert a.stream_version("never") is None
    with open_store(store_path, readonly=True) as r:           # reopened: the same
        assert check(r) == seen[-1]
    a.close()
    with pytest.raises(errors.StoreClosedError):
        a.stream_version("s")


def test_save_expect_head_is_a_compare_and_swap(store):
    from snapstore.errors import CommitConflict
    first = store.save({"n": 1}, stream="o", expect_head=None)
    with pytest.raises(CommitConflict):
        store.save({"n": 2}, stream="o", expect_head=None)
    second = store.save({"n": 2}, stream="o", expect_head=first.id)
    with pytest.raises(CommitConflict) as exc:
        store.save({"n": 3}, stream="o", expect_head=first)
    assert (exc.value.expected, exc.value.found) == (first.id, second.id)
    assert store.load("o") == {"n": 2} and len(store.checkpoints("o")) == 2


def test_expect_head_against_a_dead_writers_claim_is_a_commit_conflict(store_path):
    """A commit whose expect_head is not the head fails early, from a read snapshot; a claim
    in that snapshot may belong to a writer that has died (or has published and exited since
    the snapshot): the snapshot cannot tell, and it is a CommitConflict either way (the head
    is not the expected one), never the engine's internal DeadHolder. Found by two LangGraph
    workers: one wrote a thread's pending writes while the other had just closed its Store."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open_store(store_path, durability="none") as s:
        base = s.checkpoint({"x": b"0" * 5000}, stream="a")
        child = ("import sys; sys.path.insert(0, sys.argv[1]); import snapstore\n"
                 "s = snapstore.open(sys.argv[2], durability='none')\n"
                 "s.checkpoint({'x': b'1' * 5000}, stream='a')\n")
        proc = subprocess.run([sys.executable, "-c", child, root, store_path], timeout=60,
                              env=dict(os.environ, SNAPSTORE_CRASH_AT="after_commit_append"),
                              capture_output=True)
        assert proc.returncode == -9, proc.stderr.decode()     # killed holding its claim
        with pytest.raises(errors.CommitConflict):
            s.checkpoint({"x": b"2" * 5000}, stream="a", expect_head=base.id + 100)
        with pytest.raises(errors.CommitConflict):   # its claim recovers the dead log, whose
            s.checkpoint({"x": b"3" * 5000}, stream="a")   # durable commit takes the head
        head = s.latest("a")
        assert head.id != base.id and s.restore(head.id) == {"x": b"1" * 5000}
        after = s.checkpoint({"x": b"3" * 5000}, stream="a", expect_head=head.id)
        assert after.parent == head.id and s.verify()["ok"]


@pytest.mark.parametrize("name", [b"st\xff\xfe", "caf\u00e9".encode(), b"a b"])
def test_a_store_under_any_file_name_the_file_system_takes(tmp_path, name):
    """A directory name that is not UTF-8 (os.fsdecode gives it as surrogates): open, write,
    compact (its index copy), repair (its index rebuild) and the CLI all work there, as
    under any other name; LMDB is handed the file system's bytes."""
    path = os.path.join(os.fsdecode(tmp_path), os.fsdecode(name), "s")
    data = np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8)
    with snapstore.open(path) as s:
        first = s.checkpoint({"a": data}).id
        data[::4096] += 1
        second = s.checkpoint({"a": data}).id
        s.delete(first)
        s.compact(threshold=1.0)
        assert s.restore(second)["a"] == data.tobytes()
    assert snapstore.repair(path)["ok"]
    with snapstore.open(path, readonly=True) as s:
        assert s.restore(second)["a"] == data.tobytes()
    r = subprocess.run([sys.executable, "-m", "snapstore", "ls", path], capture_output=True)
    assert r.returncode == 0 and b"traceback" not in r.stderr.lower()


def test_restoring_many_buffers_decodes_each_checkpoint_of_the_chain_once(tmp_path,
                                                                         monkeypatch):
    """A restore of N buffers used to decode the whole parent record (all N entries) once
    per buffer and chain level, and to scan for each buffer's entry: quadratic (5,000 small
    buffers at chain length 2 took two minutes). Counted, not timed: each checkpoint of the
    chain is decoded once per read snapshot."""
    from snapstore.engine import records
    n = 300
    state = {f"b{i}": bytes([i % 251]) * 100 for i in range(n)}
    with snapstore.open(str(tmp_path / "s"), full_threshold=1.0) as s:
        s.checkpoint(state, stream="m")
        for step in range(2):
            state = dict(state, **{f"b{i}": bytes([step]) * 100 for i in range(0, n, 7)})
            info = s.checkpoint(state, stream="m")
        assert info.chain_length == 2
        decodes = []
        real = records.Commit.from_info_json.__func__

        def counting(cls, d):
            decodes.append(d["id"])
            return real(cls, d)
        monkeypatch.setattr(records.Commit, "from_info_json", classmethod(counting))
        assert s.restore(info.id) == state
        assert sorted(decodes) == [1, 2, 3], decodes
        decodes.clear()
        targets = {name: bytearray(len(data)) for name, data in state.items()}
        s.restore_into(info.id, targets)
        assert targets == state and len(decodes) <= 3
