"""The index's writer gate (engine/writegate.py): every write transaction of every process
holds a flock of STORE/index.gate from before it waits for LMDB's write lock until it ended,
so that a waiter SIGKILLed just after LMDB's unlock woke it cannot leave the other waiters
asleep, and a holder that is stopped is seen by the waiters."""
from __future__ import annotations

import fcntl
import math
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import snapstore
from flocks import flocked
from snapstore.engine import format as fmt
from snapstore.engine import writegate
from snapstore.errors import StoreLocked


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
            while not flocked(os.path.join(path, fmt.INDEX_GATE_FILE)):  # the child holds it
                assert time.monotonic() < deadline, "the child never took the gate"
                time.sleep(0.01)
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


_STOP_INSIDE_THE_INDEX_WRITE = r"""
import os, signal, sys
import snapstore
from snapstore.engine import commit
real = commit.crashpoint
def stop_there(name):
    if name == "before_index_commit":
        os.write(1, b"stopping\n")
        os.kill(os.getpid(), signal.SIGSTOP)
    real(name)
commit.crashpoint = stop_there
with snapstore.open(sys.argv[1]) as store:
    store.checkpoint({"b": b"from the stopped writer"}, stream="stopped")
os.write(1, b"committed\n")
"""


def _writer_stopped_in_its_index_write(path: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _STOP_INSIDE_THE_INDEX_WRITE, path],
                             stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"stopping\n"
    deadline = time.monotonic() + 10
    while not writegate._stopped(child.pid):
        assert time.monotonic() < deadline, "the child never stopped"
        time.sleep(0.01)
    return child


def test_a_writer_stopped_inside_its_write_transaction_is_named_not_waited_for(tmp_path,
                                                                              monkeypatch):
    """A writer SIGSTOPped inside its index write transaction holds the index's write lock:
    the others give up with StoreLocked(lock="index") naming it once they have seen it
    stopped for max(timeout, STOPPED_GRACE), instead of hanging behind it; once it goes on,
    everything commits (its checkpoint included) and nothing was lost."""
    monkeypatch.setattr(writegate, "STOPPED_GRACE", 0.6)
    monkeypatch.setattr(writegate, "WATCH_SECONDS", 0.1)
    path = str(tmp_path / "s")
    store = snapstore.open(path)                    # timeout 0: gives up at the grace
    patient = snapstore.open(path, timeout=math.inf)
    child = _writer_stopped_in_its_index_write(path)
    try:
        with store:
            started = time.monotonic()
            with pytest.raises(StoreLocked) as info:
                store.checkpoint({"b": b"waits"})
            waited = time.monotonic() - started
            assert 0.6 <= waited < 0.6 + 5
            exc = info.value
            assert exc.lock == "index" and exc.pid == child.pid
            assert "stopped" in str(exc) and f"kill -CONT {child.pid}" in str(exc)
            # the same call twice: the same error; an open (which writes the index) too
            with pytest.raises(StoreLocked):
                store.checkpoint({"b": b"waits"})
            with pytest.raises(StoreLocked, match="stopped"):
                snapstore.open(path)
        # timeout=inf waits for it: let it go on while a writer waits
        with patient as store:
            done: list = []
            t = threading.Thread(target=lambda: done.append(
                store.checkpoint({"b": b"waited"})))
            t.start()
            t.join(writegate.STOPPED_GRACE + 1)
            assert not done and t.is_alive()
            os.kill(child.pid, signal.SIGCONT)
            t.join(30)
            assert done
            assert store.restore(done[0].id)["b"] == b"waited"
    finally:
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    assert child.returncode == 0 and out == b"committed\n"
    with snapstore.open(path) as store:
        assert store.restore(store.latest("stopped").id)["b"] == b"from the stopped writer"
        assert store.verify(deep=True)["ok"]


def _child_holding_the_gate(path: str, seconds: float) -> int:
    """A child process that holds the gate for `seconds`, then exits; returns once it holds
    it (its pid)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            _hold_gate(path)
            os.write(w, b"1")
            time.sleep(seconds)
        finally:
            os._exit(0)
    os.close(w)
    assert os.read(r, 1) == b"1"
    os.close(r)
    return pid


def test_proc_locks_names_the_holder_of_the_gate(tmp_path):
    path = str(tmp_path / "s")
    snapstore.open(path).close()
    fd = os.open(os.path.join(path, fmt.INDEX_GATE_FILE), os.O_RDWR)
    try:
        assert writegate.flock_holder(fd) is None
        pid = _child_holding_the_gate(path, 60)
        try:
            assert writegate.flock_holder(fd) == pid
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert writegate.flock_holder(fd) is None
    finally:
        os.close(fd)


def test_a_running_holder_is_waited_for_however_long(tmp_path, monkeypatch):
    """Only a stopped holder is given up on: one that runs (here another process holding the
    gate for many looks and graces) is waited for, with timeout 0."""
    monkeypatch.setattr(writegate, "WATCH_SECONDS", 0.05)
    monkeypatch.setattr(writegate, "STOPPED_GRACE", 0.1)
    path = str(tmp_path / "s")
    with snapstore.open(path) as store:
        store.checkpoint({"b": b"x"})
        pid = _child_holding_the_gate(path, 1.0)
        try:
            t, done = _checkpoint_in_thread(store, b"y")
            t.join(0.5)
            assert not done and t.is_alive()
            t.join(30)
        finally:
            os.waitpid(pid, 0)
        assert done and store.restore(done[0].id)["b"] == b"y"



_INTERRUPTED_GATE = r"""
import fcntl, os, sys, threading, time
import snapstore
from snapstore.engine import format as fmt, writegate
from flocks import flocked
from sigint_injection import interrupted_at_return

contended = sys.argv[1] == "contended"
path = sys.argv[2]
snapstore.open(path).close()
gate_file = os.path.join(path, fmt.INDEX_GATE_FILE)
gate = writegate.writer_gate(os.path.join(path, fmt.INDEX_DIR), 0o600)


def hold_briefly(ready):                # another holder: a waiter's thread is needed
    fd = os.open(gate_file, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(0.05)
    os.close(fd)


def free() -> bool:
    return not flocked(gate_file)


def enter():
    with gate.held(0.0):
        pass


n = interrupted = 0
while True:
    n += 1
    if contended:
        ready = threading.Event()
        holder = threading.Thread(target=hold_briefly, args=(ready,))
        holder.start()
        ready.wait()
    stopped, inject = interrupted_at_return(n, enter)
    interrupted += stopped
    if contended:
        holder.join()
    deadline = time.monotonic() + 5         # an abandoned waiter lets go once it gets it
    while not free():
        assert time.monotonic() < deadline, f"the gate stayed held after an interrupt at {n}"
        time.sleep(0.01)
    with gate.held(0.0):                    # and the next write takes it for real
        assert not free(), f"a write after an interrupt at {n} went on without the gate"
    if inject.where is None:
        break
print(n, interrupted)
"""


@pytest.mark.parametrize("mode", ["free", "contended"])
def test_ctrl_c_anywhere_in_taking_the_gate_leaves_nothing_held(tmp_path, mode):
    """A KeyboardInterrupt between taking the thread lock or the flock and recording it left
    it held for good: this process's next write waited for ever, and every other
    process's (a reviewer's find)."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [tests, os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-c", _INTERRUPTED_GATE, mode, str(tmp_path / "s")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    tried, interrupted = map(int, p.stdout.split())
    assert tried > 5 and interrupted > 0


def test_a_fork_while_a_thread_waits_for_the_gate_does_not_keep_it_locked(tmp_path):
    """A waiter's own open file, inherited by a fork()ed child, was let go by closing it
    alone: the gate stayed locked for as long as the child lived, so other processes (and the
    child itself) waited for it (a reviewer's find). It is let go with LOCK_UN now, and a
    child closes its copies."""
    path = str(tmp_path / "s")
    with snapstore.open(path) as store:
        store.checkpoint({"b": b"x"})
        holder = _child_holding_the_gate(path, 1.0)
        t, done = _checkpoint_in_thread(store, b"y")    # waits in a waiter's thread
        time.sleep(0.3)
        child = os.fork()
        if child == 0:
            try:
                time.sleep(8)           # keeps its copies of every descriptor meanwhile
            finally:
                os._exit(0)
        try:
            os.waitpid(holder, 0)
            t.join(30)
            assert done
            started = time.monotonic()
            p = subprocess.run([sys.executable, "-c", "import snapstore, sys\n"
                                "with snapstore.open(sys.argv[1], timeout=1) as s:\n"
                                "    s.checkpoint({'b': b'z'}, stream='other')",
                                path], capture_output=True, text=True, timeout=60)
            assert p.returncode == 0, p.stderr
            assert time.monotonic() - started < 6, "the child's copy kept the gate locked"
        finally:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
        assert store.restore(store.latest("other").id)["b"] == b"z"
