"""fsutil's flock helpers, which every lock of the store waits through (the store lock, the
maintenance lock, an S3 cache's lock, the writers' log locks)."""
from __future__ import annotations

import fcntl
import os
import time

import pytest

from snapstore.engine.fsutil import (FLOCK_STOPPED, FLOCK_TAKEN, FLOCK_TIMED_OUT, flock_until,
                                     try_flock)


@pytest.fixture
def two_fds(tmp_path):
    """Two open file descriptions of one file: flock()s on them conflict."""
    path = tmp_path / "lock"
    a = os.open(path, os.O_RDWR | os.O_CREAT)
    b = os.open(path, os.O_RDWR)
    yield a, b
    os.close(a)
    os.close(b)


def test_try_flock_takes_a_free_lock_and_refuses_a_held_one(two_fds):
    a, b = two_fds
    assert try_flock(a, fcntl.LOCK_EX)
    assert not try_flock(b, fcntl.LOCK_EX)
    assert not try_flock(b, fcntl.LOCK_SH)
    fcntl.flock(a, fcntl.LOCK_UN)
    assert try_flock(b, fcntl.LOCK_SH)
    assert try_flock(a, fcntl.LOCK_SH)        # shared with shared


def test_try_flock_raises_other_errors():
    with pytest.raises(OSError):
        try_flock(987654, fcntl.LOCK_EX)      # not an open descriptor: EBADF


def test_flock_until_times_out_at_the_deadline_and_not_before(two_fds):
    a, b = two_fds
    fcntl.flock(a, fcntl.LOCK_EX)
    started = time.monotonic()
    assert flock_until(b, fcntl.LOCK_EX, started + 0.2, poll=0.01) == FLOCK_TIMED_OUT
    assert time.monotonic() - started >= 0.2
    assert flock_until(b, fcntl.LOCK_EX, 0.0) == FLOCK_TIMED_OUT     # past deadline: one try


def test_flock_until_takes_the_lock_once_it_is_let_go(two_fds):
    a, b = two_fds
    fcntl.flock(a, fcntl.LOCK_EX)
    calls = []

    def stop():
        calls.append(1)
        if len(calls) == 3:
            fcntl.flock(a, fcntl.LOCK_UN)     # the holder lets go while we wait
        return False

    assert flock_until(b, fcntl.LOCK_EX, float("inf"), poll=0.001, stop=stop) == FLOCK_TAKEN
    assert len(calls) == 3
    assert not try_flock(a, fcntl.LOCK_SH)    # b holds it now


def test_flock_until_stops_when_asked(two_fds):
    a, b = two_fds
    fcntl.flock(a, fcntl.LOCK_EX)
    assert flock_until(b, fcntl.LOCK_EX, float("inf"), poll=0.001,
                       stop=lambda: True) == FLOCK_STOPPED
    assert try_flock(a, fcntl.LOCK_EX)        # a still holds it (flock converts in place)
