"""A Store shared by threads, fork()ed or closed while others use it (regressions of an
adversarial pass):

- a fork()ed child that exits normally must not end the parent's open index snapshot (LMDB's
  abort marks the reader slot free: the parent's writer then recycled pages the parent still
  read, and the parent was told its index was damaged);
- fork() while another thread holds the maintenance lock (a compaction, a verify) must not
  leave it held for the child's life;
- verify(), stats() and reads racing close() raise StoreClosedError, never AttributeError or
  an "index closed" StoreIOError.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

import snapstore
from snapstore.errors import StoreClosedError


SNAPSHOT_CHILD = r"""
import os, sys
import snapstore
s = snapstore.open(sys.argv[1], durability="none", chunk_size=4096, compression="none")
data = os.urandom(2 << 20)
cid = s.checkpoint({"x": data}).id
extents = s.manifests(cid).buffers[0].extents
it = s.read_chunks([e[2] for e in extents])        # one snapshot until exhausted
next(it)
pid = os.fork()
if pid == 0:
    sys.exit(0)          # interpreter finalization closes the inherited generator
assert os.waitpid(pid, 0)[1] == 0
prev = None
for _ in range(40):                                # the parent's writer recycles pages
    info = s.checkpoint({"y": os.urandom(1 << 20)}, stream="churn")
    if prev is not None:
        s.delete(prev)
    prev = info.id
for (off, length, chunk, at), (got, raw) in zip(extents[1:], it):
    assert got == chunk and raw[at:at + length] == data[off:off + length]
s.close()
print("exact")
"""


def test_a_child_exiting_normally_keeps_the_parents_snapshot(tmp_path):
    done = subprocess.run([sys.executable, "-c", SNAPSHOT_CHILD, str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "exact", done.stderr[-2000:]


def test_fork_while_another_thread_holds_the_maintenance_lock(tmp_path):
    path = str(tmp_path / "s")
    s = snapstore.open(path, durability="none")
    s.checkpoint({"x": os.urandom(1 << 20)})
    held, go = threading.Event(), threading.Event()

    def compaction_in_progress():
        with s._committer.maintenance(exclusive=True):   # as compact() holds it
            held.set()
            go.wait(30)
    t = threading.Thread(target=compaction_in_progress)
    t.start()
    assert held.wait(30)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                        # (the fork handlers ran before fork() returned here)
        os.close(r)
        os.write(w, b"s")
        time.sleep(1.5)                 # outlive the parent's compaction
        os.write(w, b"x")
        os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"s"
    go.set()
    t.join(30)
    assert s.verify()["ok"]             # the child's copy of the lock is closed: not held
    assert os.read(r, 1) == b"x"
    os.waitpid(pid, 0)
    os.close(r)
    s.close()


@pytest.mark.parametrize("call", ["verify", "stats", "latest", "restore"])
def test_calls_racing_close_raise_store_closed(tmp_path, call):
    path = str(tmp_path / "s")
    for round_ in range(6):
        s = snapstore.open(path, durability="none")
        if not s.streams():
            s.checkpoint({"x": os.urandom(1 << 18)})
        errors, stop = [], threading.Event()

        def hammer():
            while not stop.is_set():
                try:
                    {"verify": lambda: s.verify(), "stats": lambda: s.stats(),
                     "latest": lambda: s.latest(),
                     "restore": lambda: s.restore("latest")}[call]()
                except StoreClosedError:
                    return
                except Exception as exc:    # noqa: BLE001 - asserted below
                    errors.append(exc)
                    return
        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.01 * round_)
        s.close()
        stop.set()
        for t in threads:
            t.join(30)
        assert not errors, [repr(e) for e in errors]


def _child_status(held_lock, child) -> int:
    """Forks while a thread of this process holds held_lock (as a capture or a put in
    progress does), runs child() in the child under a 10 s alarm, and returns the child's
    exit status: 0 if child() returned, 3 if it raised, killed by SIGALRM if it hung."""
    held, go = threading.Event(), threading.Event()

    def holder():
        with held_lock:
            held.set()
            go.wait(30)
    t = threading.Thread(target=holder)
    t.start()
    assert held.wait(30)
    pid = os.fork()
    if pid == 0:
        import signal
        signal.alarm(10)
        try:
            child()
        except BaseException:          # noqa: BLE001 (reported through the exit status)
            os._exit(3)
        os._exit(0)
    go.set()
    t.join(30)
    _, status = os.waitpid(pid, 0)
    return status


def test_a_child_closes_a_tracker_whose_capture_the_parent_had_in_progress(tmp_path):
    """Closing (e.g. leaving a `with store.track(...)` block) in a fork()ed child waited for
    ever for the capture lock a parent thread held at the fork."""
    import numpy as np
    with snapstore.open(str(tmp_path / "s"), durability="none") as s:
        buf = np.zeros(1 << 16, np.uint8)
        tracker = s.track({"w": buf}, stream="t", mode="hash")
        tracker.checkpoint()
        status = _child_status(tracker._lock, tracker.close)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        buf[:10] = 1
        assert s.restore(tracker.checkpoint().id)["w"] == buf.tobytes()
        tracker.close()


def test_a_child_using_an_inherited_saver_mid_put_gets_forked_store_error(tmp_path):
    """A LangGraph put in flight on a parent thread held the savers' shared lock at the
    fork: the child's first call waited for ever instead of raising ForkedStoreError."""
    pytest.importorskip("langgraph")
    from snapstore.langgraph import SnapstoreSaver
    with snapstore.open(str(tmp_path / "s"), durability="none") as s:
        saver = SnapstoreSaver(s)
        cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

        def child():
            try:
                list(saver.list(cfg))
            except snapstore.ForkedStoreError:
                return
            raise AssertionError("no ForkedStoreError")
        status = _child_status(saver._shared.lock, child)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert list(saver.list(cfg)) == []      # the parent's saver goes on


def test_a_childs_first_save_async_is_forked_store_error(tmp_path):
    """The parent's save_async pending at the fork is failed in the child with
    ForkedStoreError; that used to be recorded as the stream's unreported failure, so the
    child's first save_async raised AsyncSaveError ("the next call saves again": false)."""
    import numpy as np
    from snapstore import objects
    with snapstore.open(str(tmp_path / "s"), durability="none") as s:
        state = {"w": np.random.default_rng(0).random(1 << 20)}
        future = objects.save_async(s, state, stream="m")
        pid = os.fork()
        if pid == 0:
            import signal
            signal.alarm(10)
            codes = []
            for _ in range(2):
                try:
                    objects.save_async(s, state, stream="m")
                    codes.append("saved")
                except snapstore.ForkedStoreError:
                    codes.append("forked")
                except BaseException:      # noqa: BLE001
                    codes.append("other")
            os._exit(0 if codes == ["forked", "forked"] else 3)
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert s.load(future.result().id)["w"].tobytes() == state["w"].tobytes()
