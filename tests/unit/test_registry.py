"""snapstore.engine.registry.SharedByPath: one object per real path, reference-counted, opened
on first use and closed at the last release, safely across threads (the LMDB environments of
engine/index.py and the Stores LangGraph savers open by path)."""
import os
import threading
import time

import pytest

from snapstore.engine.registry import SharedByPath


class Thing:
    def __init__(self, path):
        self.path, self.closed = path, False


class Log:
    """open/close callbacks that record what happened."""

    def __init__(self):
        self.opened, self.closed = [], []

    def open(self, real_path):
        thing = Thing(real_path)
        self.opened.append(thing)
        return thing

    def close(self, thing):
        assert not thing.closed
        thing.closed = True
        self.closed.append(thing)


def test_shared_by_real_path_and_closed_at_the_last_release(tmp_path):
    log = Log()
    reg = SharedByPath(log.close)
    d = tmp_path / "store"
    d.mkdir()
    os.symlink(d, tmp_path / "link")
    a = reg.acquire(d, log.open)
    b = reg.acquire(tmp_path / "link", log.open)                   # a symlink: the same one
    c = reg.acquire(os.path.relpath(d), log.open)                  # a relative spelling too
    assert a is b is c and log.opened == [a] and a.path == os.path.realpath(d)
    assert reg.users(d) == 3
    reg.release(a)
    reg.release(a)
    assert not a.closed and reg.users(d) == 1
    reg.release(a)
    assert a.closed and log.closed == [a] and reg.users(d) == 0
    reg.release(a)                                                  # not held: ignored
    assert log.closed == [a]
    again = reg.acquire(d, log.open)                               # reopened after the last
    assert again is not a and len(log.opened) == 2
    other = reg.acquire(tmp_path, log.open)                        # another path: its own
    assert other is not again and reg.users(tmp_path) == 1


def test_failed_open_holds_nothing_and_admit_can_refuse(tmp_path):
    log = Log()
    reg = SharedByPath(log.close)

    def failing(real_path):
        raise OSError("cannot open")

    with pytest.raises(OSError):
        reg.acquire(tmp_path, failing)
    assert reg.users(tmp_path) == 0
    first = reg.acquire(tmp_path, log.open, settings={"mode": "a"})
    seen = []

    def refuse(settings):
        seen.append(settings)
        raise ValueError("incompatible")

    with pytest.raises(ValueError):
        reg.acquire(tmp_path, log.open, settings={"mode": "b"}, admit=refuse)
    assert seen == [{"mode": "a"}] and reg.users(tmp_path) == 1     # nothing changed
    assert reg.acquire(tmp_path, log.open, admit=seen.append) is first and reg.users(tmp_path) == 2


def test_dead_object_is_replaced(tmp_path):
    log = Log()
    reg = SharedByPath(log.close, is_alive=lambda thing: not thing.closed)
    first = reg.acquire(tmp_path, log.open)
    first.closed = True                                            # closed behind its back
    second = reg.acquire(tmp_path, log.open)
    assert second is not first and reg.users(tmp_path) == 1
    reg.release(first)                                             # the dead one: ignored
    assert reg.users(tmp_path) == 1 and not second.closed
    reg.release(second)
    assert second.closed and log.closed == [second]


def test_threads_never_hold_two_objects_of_one_path(tmp_path):
    open_now, most, lock = [0], [0], threading.Lock()

    def slow_open(real_path):
        with lock:
            open_now[0] += 1
            most[0] = max(most[0], open_now[0])
        time.sleep(0.001)                                          # widen any race
        return Thing(real_path)

    def close(thing):
        time.sleep(0.001)
        with lock:
            open_now[0] -= 1

    reg = SharedByPath(close)
    errors = []

    def worker():
        try:
            for _ in range(50):
                thing = reg.acquire(tmp_path, slow_open)
                assert not thing.closed
                reg.release(thing)
        except BaseException as exc:                               # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and most[0] == 1 and open_now[0] == 0 and reg.users(tmp_path) == 0
