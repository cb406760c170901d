"""What waits for asynchronous checkpoints (flush, close, a capture that diffs against the head,
a plain checkpoint, deleting a head, track) in the places where it cannot simply wait: in a
done-callback (which runs on the thread that commits the queued checkpoints), while other
threads keep queueing, and when Ctrl-C interrupts the wait."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import snapstore
from snapstore.engine.commit import Committer
from snapstore.errors import SnapstoreError, StoreClosedError

pytest.importorskip("snapstore.capture.dirty")

N = 1 << 16


def _callback_behind_a_queued_checkpoint(s, monkeypatch, action):
    """Runs action() in the done-callback of checkpoint 1 of stream "t" while checkpoint 2 of
    the stream is queued behind it; returns (what action returned or raised, future 2, the
    bytes checkpoint 2 holds)."""
    real, gate = Committer.commit, threading.Event()

    def gated(self, *args, **kwargs):
        gate.wait(30)                   # the worker holds checkpoint 1 until 2 is queued
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Committer, "commit", gated)
    a = np.zeros(N, np.uint8)
    out = {}

    def in_callback(_):
        try:
            out["result"] = action()
        except Exception as exc:        # noqa: BLE001 - asserted by the caller
            out["error"] = exc
    first = s.checkpoint_async({"a": a}, stream="t")
    first.add_done_callback(in_callback)
    a[5000] = 9
    second = s.checkpoint_async({"a": a}, stream="t")
    gate.set()
    s.flush()
    return out, second, a.tobytes()


def test_a_full_diff_in_a_done_callback_behind_a_queued_checkpoint_is_refused(tmp_path,
                                                                              monkeypatch):
    """Regression: a capture that must diff against the head (here: new buffer memory) ran in
    checkpoint 1's callback without waiting for checkpoint 2, so it diffed against 1 and was
    committed as a delta on top of 2: restoring it gave wrong bytes."""
    with snapstore.open(tmp_path / "s", durability="none") as s:
        other = np.full(N, 7, np.uint8)
        out, second, second_bytes = _callback_behind_a_queued_checkpoint(
            s, monkeypatch, lambda: s.checkpoint_async({"a": other}, stream="t"))
        assert "result" not in out
        assert isinstance(out["error"], SnapstoreError)
        assert "outside the callback" in str(out["error"])
        assert s.checkpoint_ids(stream="t")[-1] == second.result().id
        assert s.restore(second.result().id)["a"] == second_bytes
        third = s.checkpoint_async({"a": other}, stream="t").result(timeout=30)  # outside: fine
        assert s.restore(third.id)["a"] == other.tobytes()
        assert s.verify()["ok"]


@pytest.mark.parametrize("operation", ["flush", "checkpoint", "delete the head", "track"])
def test_waiting_in_a_done_callback_for_queued_checkpoints_is_refused(tmp_path, monkeypatch,
                                                                      operation):
    """Each of these needs the queued checkpoints landed first, which a callback cannot wait
    for: a clear SnapstoreError, not a flush that did not flush or a checkpoint on a stale
    head."""
    with snapstore.open(tmp_path / "s", durability="none") as s:
        b = np.ones(N, np.uint8)
        actions = {
            "flush": s.flush,
            "checkpoint": lambda: s.checkpoint({"a": b}, stream="t"),
            "delete the head": lambda: s.delete(s.checkpoint_ids(stream="t")[-1]),
            "track": lambda: s.track({"a": b}, stream="t"),
        }
        out, second, second_bytes = _callback_behind_a_queued_checkpoint(
            s, monkeypatch, actions[operation])
        assert "result" not in out
        assert isinstance(out["error"], SnapstoreError)
        assert "outside the callback" in str(out["error"])
        assert len(s.checkpoint_ids(stream="t")) == 2
        assert s.restore(second.result().id)["a"] == second_bytes


def test_flush_in_a_done_callback_with_nothing_queued_returns(tmp_path):
    with snapstore.open(tmp_path / "s", durability="none") as s:
        out = []
        s.checkpoint_async({"a": b"x"}, stream="t").add_done_callback(
            lambda f: out.append((s.flush(), f.result().id)))
        s.flush()
        assert out and out[0][0] is None


def test_close_returns_while_another_thread_keeps_checkpointing(tmp_path):
    """Regression: close() waited for the queue to drain while another thread kept filling it,
    and never returned. Now checkpoints begun after close() started fail with
    StoreClosedError, and every future returned before resolves."""
    s = snapstore.open(tmp_path / "s", durability="none")
    a = np.zeros(N, np.uint8)
    futures, stopped, started = [], [], threading.Event()

    def keep_checkpointing():
        i = 0
        while True:
            a[i % N] ^= 1
            i += 1
            try:
                futures.append(s.checkpoint_async({"a": a}, stream="t"))
            except StoreClosedError as exc:
                stopped.append(exc)
                return
            started.set()
    t = threading.Thread(target=keep_checkpointing, daemon=True)
    t.start()
    assert started.wait(30)
    closer = threading.Thread(target=s.close, daemon=True)
    closer.start()
    closer.join(60)
    assert not closer.is_alive(), "close() did not return"
    t.join(30)
    assert not t.is_alive() and len(stopped) == 1
    assert futures and all(f.result(timeout=30).id for f in futures)
    with snapstore.open(tmp_path / "s") as again:
        assert len(again.checkpoint_ids(stream="t")) == len(futures)
        assert again.verify()["ok"]


_SIGINT_AT_EVERY_RETURN = r"""
import os, sys, tempfile, threading
import numpy as np
import snapstore
from snapstore.engine.commit import Committer
from sigint_injection import interrupted_at_return

what = sys.argv[1]
real, gate = Committer.commit, threading.Event()


def gated(self, *args, **kwargs):       # the worker holds the first checkpoint a moment,
    gate.wait(30)                       # so the call under test has to wait for it
    return real(self, *args, **kwargs)


Committer.commit = gated


root = tempfile.mkdtemp()
n, interrupted = 0, 0
while True:
    n += 1
    path = os.path.join(root, str(n))
    gate.clear()
    s = snapstore.open(path, durability="none", staging_bytes=1 << 20)
    a = np.zeros(1 << 19, np.uint8)
    s.checkpoint_async({"a": a}, stream="t")
    a[0] = 1
    threading.Timer(0.5, gate.set).start()     # (in case the call never waits)
    calls = {"flush": s.flush, "close": s.close,      # or a capture waiting for staging room
             "staging room": lambda: s.checkpoint_async({"b": np.ones(1 << 20, np.uint8)},
                                                        stream="u")}
    # it waits now: let the worker go
    stopped, inject = interrupted_at_return(n, calls[what], on_wait=gate.set)
    outcome = "KeyboardInterrupt" if stopped else "returned"
    interrupted += stopped
    gate.set()
    s.close()                           # after an interrupt, closing again finishes the job
    with snapstore.open(path) as again:     # (it would wait for ever for a leaked lock)
        assert again.restore(again.checkpoint_ids(stream="t")[-1])["a"][0] == 0
        assert again.verify()["ok"]
    if outcome == "returned" and inject.where is not None:
        print("not interrupted:", n, inject.where)
    if inject.where is None:            # the call made fewer than n returns: all were tried
        break
print(n, interrupted)
"""


def _child_env() -> dict:
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # sigint_injection
    return {**os.environ, "PYTHONFAULTHANDLER": "1",
            "PYTHONPATH": os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))}


@pytest.mark.parametrize("what", ["flush", "close", "staging room"])
def test_ctrl_c_anywhere_in_flush_close_or_a_wait_for_staging_is_a_clean_interrupt(what):
    """Regressions: Ctrl-C landing inside Condition.wait (flush, close, a capture waiting for
    staging room) left the lock released, and the caller got RuntimeError("release unlocked
    lock") instead of KeyboardInterrupt; and Ctrl-C in close() could leave the store's lock
    held, so reopening the store in the same process waited for ever. A SIGINT is sent at
    each Python function return in turn (a child process: the signals stay out of pytest)."""
    proc = subprocess.run([sys.executable, "-c", _SIGINT_AT_EVERY_RETURN, what],
                          capture_output=True, text=True, timeout=300,
                          env=_child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    tried, interrupted = map(int, proc.stdout.split()[-2:])
    # An interrupt may only go missing where Python itself swallowed it, and said so: in a
    # finalizer the garbage collector ran at that moment ("Exception ignored in: ...").
    missed = proc.stdout.count("not interrupted:")
    assert missed <= proc.stderr.count("Exception ignored in"), (proc.stdout, proc.stderr)
    assert tried > 5 and interrupted == tried - 1 - missed


def test_threads_checkpointing_one_stream_restore_exactly(tmp_path):
    """Regression: two threads' checkpoint_async() of one stream swapped each other's
    detectors (attached outside the capture lock), so checkpoints restored other bytes, and
    two threads' first calls could make two capturers of the stream."""
    with snapstore.open(tmp_path / "s", durability="none", staging_bytes=1 << 20) as s:
        results, errors = [], []

        def worker(seed):
            rng = np.random.default_rng(seed)
            a = np.zeros(N, np.uint8)
            for k in range(25):
                a[rng.integers(N)] = k + 1
                try:
                    results.append((s.checkpoint_async({"a": a}, stream="t"), a.tobytes()))
                except Exception as exc:    # noqa: BLE001 - asserted below
                    errors.append(exc)
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        s.flush()
        assert not errors
        for future, expected in results:
            assert s.restore(future.result().id)["a"] == expected
        assert s.stats()["staging_in_use_bytes"] == 0


@pytest.mark.parametrize("in_callback", ["checkpoint", "close"])
def test_a_callback_never_waits_for_a_thread_waiting_for_staging_room(tmp_path, monkeypatch,
                                                                       in_callback):
    """Regression: a thread waiting for staging room held the lock that queues captures; the
    worker, running a done-callback that checkpointed (or closed the store), waited for it,
    and never freed the room: both hung. Now the wait holds no lock (and gives up with
    StoreClosedError when the store is closed)."""
    real, gate = Committer.commit, threading.Event()

    def gated(self, *args, **kwargs):
        gate.wait(30)
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Committer, "commit", gated)
    s = snapstore.open(tmp_path / "s", durability="none", staging_bytes=1 << 20)
    outcome, called = {}, threading.Event()

    def callback(_):
        try:
            outcome["callback"] = (s.checkpoint_async({"c": np.ones(4096, np.uint8)},
                                                      stream="C")
                                   if in_callback == "checkpoint" else s.close())
        except Exception as exc:            # noqa: BLE001 - asserted below
            outcome["callback"] = exc
        called.set()
    s.checkpoint_async({"a": np.ones(400 << 10, np.uint8)}, stream="A").add_done_callback(
        callback)
    s.checkpoint_async({"b": np.ones(400 << 10, np.uint8)}, stream="B")

    def needs_room():
        try:
            outcome["big"] = s.checkpoint_async({"d": np.ones(900 << 10, np.uint8)},
                                                stream="D").result(timeout=30)
        except Exception as exc:            # noqa: BLE001 - asserted below
            outcome["big"] = exc
    t = threading.Thread(target=needs_room, daemon=True)
    t.start()
    threading.Timer(0.3, gate.set).start()
    t.join(30)
    assert not t.is_alive(), "a checkpoint waiting for staging room hung"
    assert called.wait(30), "the callback hung"
    if in_callback == "checkpoint":
        assert outcome["big"].id and outcome["callback"].result(timeout=30).id
    else:
        assert isinstance(outcome["big"], StoreClosedError) and outcome["callback"] is None
    s.close()


def test_notify_all_cut_short_by_ctrl_c_loses_no_waiter():
    """Regression: notify_all() emptied the waiter list before releasing them; an interrupt
    half-way left the rest asleep for ever. Every later notify_all() (and the waits' bounded
    timeout) wakes them now."""
    from snapstore.wakeups import WakeUps
    lock, wakeups = threading.Lock(), WakeUps()
    with lock:
        waiters = [wakeups.register() for _ in range(3)]
    with lock:
        waiters[0].release()            # as if notify_all() released one, then Ctrl-C
    with lock:
        wakeups.notify_all()            # the next state change: releasing it again is fine
    assert all(w.acquire(timeout=1) for w in waiters)


def test_start_thread_raises_the_interrupt_a_broken_start_hid():
    """Thread.start() waits on a Condition: Ctrl-C there came out as RuntimeError("release
    unlocked lock") (seen on a store's first checkpoint_async); start_thread raises the
    KeyboardInterrupt, and passes any other RuntimeError on."""
    from snapstore.interrupts import start_thread

    class CutShort(threading.Thread):
        def start(self):
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt:
                raise RuntimeError("release unlocked lock")

    class Broken(threading.Thread):
        def start(self):
            raise RuntimeError("threads can only be started once")
    with pytest.raises(KeyboardInterrupt):
        start_thread(CutShort())
    with pytest.raises(RuntimeError, match="only be started once"):
        start_thread(Broken())
    ran = threading.Event()
    t = threading.Thread(target=ran.set)
    start_thread(t)
    t.join()
    assert ran.is_set()


def test_a_thread_checkpointing_async_beside_one_checkpointing_plainly_never_conflicts(
        tmp_path):
    """Regression: one Store, one stream, thread A checkpoint_async() and thread B plain
    checkpoint(): a capture made while B's checkpoint was between its planning and its
    commit was based on the head before it, and about two thirds of A's checkpoints failed
    with CommitConflict, though the Store is the stream's only writer. Each now waits for
    the other's turn, and every checkpoint restores the bytes it was given."""
    with snapstore.open(tmp_path / "s", durability="none", staging_bytes=1 << 20) as s:
        made, errors = [], []

        def asynchronous():
            a = np.zeros(N, np.uint8)
            for k in range(30):
                a[k * 97 % N] = k + 1
                try:
                    made.append((s.checkpoint_async({"a": a}, stream="t").result(),
                                 "a", a.tobytes()))
                except Exception as exc:    # noqa: BLE001 - asserted below
                    errors.append(exc)

        def plain():
            b = np.zeros(N, np.uint8)
            for k in range(30):
                b[k * 89 % N] = k + 1
                try:
                    made.append((s.checkpoint({"b": b}, stream="t"), "b", b.tobytes()))
                except Exception as exc:    # noqa: BLE001 - asserted below
                    errors.append(exc)
        threads = [threading.Thread(target=f) for f in (asynchronous, plain)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert len(made) == 60 and len(s.checkpoint_ids(stream="t")) == 60
        for info, name, data in made:
            assert s.restore(info.id)[name] == data
        assert s._persister._stream_turns == {}     # no lock kept for a stream not in use


_CALLBACK_WHILE_A_CAPTURE_WAITS = r"""
import faulthandler, sys, threading
import snapstore
from snapstore.errors import SnapstoreError
faulthandler.dump_traceback_later(60, exit=True)
what, path = sys.argv[1], sys.argv[2]
s = snapstore.open(path, durability="none")
out, returned = [], threading.Event()

def callback(_):
    try:
        if what == "close":
            s.close()
        elif what == "checkpoint":
            s.checkpoint({"a": b"z" * 3000}, "t")
        else:
            s.checkpoint_async({"a": b"w" * 3000}, "t").result(timeout=0)
        out.append("ok")
    except SnapstoreError as exc:
        out.append(type(exc).__name__)
    finally:
        returned.set()

first = s.checkpoint_async({"a": b"x" * 5000}, "t")
first.add_done_callback(callback)
try:                    # new bytes: a full diff, which waits for the first to land
    second = s.checkpoint_async({"a": b"y" * 5000}, "t").result(timeout=30)
    print("second", second.id)
except SnapstoreError as exc:
    print("second", type(exc).__name__)
print("first", first.result(timeout=30).id)
assert returned.wait(30)
print("callback", out)
s.close()
"""


@pytest.mark.parametrize("what", ["close", "checkpoint", "checkpoint_async"])
def test_a_callback_needing_the_stream_while_a_capture_of_it_waits_never_deadlocks(tmp_path,
                                                                                   what):
    """Regression: a capture that diffs in full holds its stream's capture lock while it
    waits for the checkpoint before it to land, and that checkpoint counted as landed only
    after its done-callbacks returned: a callback that needed the lock (close(), a checkpoint
    of the stream) and the capture waited for each other for ever. Now a checkpoint leaves
    the queue before its callbacks run (flush() still waits for them)."""
    proc = subprocess.run([sys.executable, "-c", _CALLBACK_WHILE_A_CAPTURE_WAITS, what,
                           str(tmp_path / "s")], capture_output=True, text=True, timeout=120,
                          env=_child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["first"] == "1"
    # each outcome is a commit or a clear snapstore error, never a hang
    assert lines["callback"] in ("['ok']", "['SnapstoreError']", "['CommitConflict']"), lines
    assert lines["second"] in ("2", "3", "StoreClosedError", "CommitConflict"), lines
    with snapstore.open(tmp_path / "s") as s:
        assert s.verify(deep=True)["ok"]


def test_flush_returns_after_the_done_callbacks_ran(tmp_path):
    """A checkpoint leaves the queue before its callbacks run; flush() still waits for them."""
    import time
    with snapstore.open(tmp_path / "s", durability="none") as s:
        ran = []
        f = s.checkpoint_async({"a": b"x"}, stream="t")
        f.add_done_callback(lambda _: (time.sleep(0.3), ran.append(1)))
        s.flush()
        assert ran == [1]


def test_a_plain_checkpoint_waits_for_what_a_callback_of_the_stream_queues(tmp_path):
    """A plain checkpoint of a stream takes turns with its asynchronous ones, including one
    a done-callback queues: waiting only until a job was committed (not its callbacks) let
    the plain one in first, and the callback's checkpoint failed with CommitConflict though
    this Store was the stream's only writer (review of stop 46's deadlock fix)."""
    import time
    for _ in range(3):
        with snapstore.open(tmp_path / f"s{_}", durability="none") as s:
            buf = np.frombuffer(os.urandom(4 << 20), np.uint8).copy()
            s.checkpoint_async({"a": buf}, "t").result(timeout=30)
            queued = []

            def callback(_f):
                again = buf.copy()
                again[:10] = 7
                queued.append(s.checkpoint_async({"a": again}, "t"))
                time.sleep(0.1)
            buf[:] = np.frombuffer(os.urandom(4 << 20), np.uint8)
            s.checkpoint_async({"a": buf}, "t").add_done_callback(callback)
            s.checkpoint({"a": b"plain" * 100}, "t")
            s.flush()
            assert [f.result(timeout=30).stream for f in queued] == ["t"]
            assert s.verify()["ok"]


def test_futures_of_checkpoints_cannot_be_cancelled(tmp_path):
    """cancel() of a queued checkpoint's future used to succeed; the worker's set_result then
    raised InvalidStateError, the worker died and every later future (and flush()) hung. A
    later checkpoint of the stream is a delta on it, so it cannot be taken out either."""
    with snapstore.open(tmp_path / "s", durability="none") as s:
        first = s.checkpoint_async({"a": os.urandom(8 << 20)}, "t")
        second = s.checkpoint_async({"a": os.urandom(1 << 20)}, "u")
        assert second.cancel() is False
        third = s.checkpoint_async({"a": b"x"}, "v")
        assert [f.result(timeout=30).stream for f in (first, second, third)] == ["t", "u", "v"]


_TRACKER_CLOSE_WITH_A_CALLBACK_CLOSING_THE_STORE = r"""
import faulthandler, sys
import snapstore
faulthandler.dump_traceback_later(60, exit=True)
s = snapstore.open(sys.argv[1], durability="none")
b = bytearray(1 << 20)
t = s.track({"b": b}, "t", mode="hash")
f = t.checkpoint_async()
f.add_done_callback(lambda _: s.close())
t.close()
print("closed", f.result(timeout=30).id)
"""


def test_tracker_close_while_a_callback_closes_the_store(tmp_path):
    """Tracker.close() holds its capture lock while it waits for its checkpoints; waiting for
    their callbacks too, it deadlocked with a callback closing the store (which closes the
    tracker's capturer under that lock). It waits for them to be committed now."""
    proc = subprocess.run([sys.executable, "-c", _TRACKER_CLOSE_WITH_A_CALLBACK_CLOSING_THE_STORE,
                           str(tmp_path / "s")], capture_output=True, text=True, timeout=120,
                          env=_child_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["closed", "1"]
