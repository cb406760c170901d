"""The index's writer gate (engine/index.py, _WriterGate): every write transaction of every
process passes a flock of STORE/index.gate before it waits for LMDB's write lock, so that a
waiter SIGKILLed just after LMDB's unlock woke it cannot leave the other waiters asleep."""
from __future__ import annotations

import fcntl
import os
import signal
import threading
import time

import pytest

import snapstore
from snapstore.engine import format as fmt


def _hold_gate(path: str) -> int:
    fd = os.open(os.path.join(path, fmt.INDEX_GATE_FILE), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _checkpoint_in_thread(store, data: bytes) -> tuple[threading.Thread, list]:
    done: list = []
    t = threading.Thread(target=lambda: done.append(store.checkpoint({"b": data})))
    t.start()
    return t, done


def test_a_write_waits_for_the_gate_and_goes_on_once_it_is_let_go(tmp_path):
    path = str(tmp_path / "s")
    with snapstore.open(path) as store:
        store.checkpoint({"b": b"x"})
        assert os.path.isfile(os.path.join(path, fmt.INDEX_GATE_FILE))
        fd = _hold_gate(path)
        try:
            t, done = _checkpoint_in_thread(store, b"y" * 5000)
            t.join(0.5)
            assert not done, "a write transaction began without passing the gate"
        finally:
            os.close(fd)            # lets the flock go
        t.join(30)
        assert done and store.restore(done[0].id)["b"] == b"y" * 5000
        # the same call twice: the gate is let go after each transaction
        store.checkpoint({"b": b"z"})
        assert store.restore(store.latest().id)["b"] == b"z"


def test_a_gate_holder_killed_lets_the_writers_on(tmp_path):
    path = str(tmp_path / "s")
    with snapstore.open(path) as store:
        store.checkpoint({"b": b"x"})
        pid = os.fork()
        if pid == 0:                # holds the gate until killed
            try:
                _hold_gate(path)
                time.sleep(60)
            finally:
                os._exit(0)
        try:
            deadline = time.monotonic() + 10
            probe = os.open(os.path.join(path, fmt.INDEX_GATE_FILE), os.O_RDWR)
            try:            # wait until the child holds it
                while time.monotonic() < deadline:
                    try:
                        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        fcntl.flock(probe, fcntl.LOCK_UN)
                        time.sleep(0.01)
                    except BlockingIOError:
                        break
                else:
                    pytest.fail("the child never took the gate")
            finally:
                os.close(probe)
            t, done = _checkpoint_in_thread(store, b"w")
            t.join(0.3)
            assert not done
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        t.join(30)
        assert done and store.restore(done[0].id)["b"] == b"w"


def test_a_forked_child_passes_a_gate_of_its_own(tmp_path):
    """A child's gate is not the parent's open file (a flock the parent holds would let the
    child through otherwise): the child's write waits while the parent holds the gate."""
    path = str(tmp_path / "s")
    snapstore.open(path).close()
    with snapstore.open(path) as store:
        store.checkpoint({"b": b"parent"})      # the parent's gate file is open
        fd = _hold_gate(path)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.close(r)
                os.close(fd)        # (the parent's flock: it holds it, not this copy)
                with snapstore.open(path) as child:
                    child.checkpoint({"b": b"child"}, stream="c")
                code = 0
            finally:
                os.write(w, b"1")
                os._exit(code)
        os.close(w)
        try:
            import select
            poll = select.poll()        # (select() refuses descriptors >= 1024)
            poll.register(r, select.POLLIN)
            assert not poll.poll(500), "the child's write went past the gate the parent holds"
        finally:
            os.close(fd)
        _, status = os.waitpid(pid, 0)
        os.close(r)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    with snapstore.open(path) as again:
        assert again.restore(again.latest("c").id)["b"] == b"child"
