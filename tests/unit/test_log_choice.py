"""Writers opening a store at the same moment choose their logs one at a time
(logowners.choosing_a_log): the number of logs stays the number of writers that ran at once.
Regression: an opener that looked while another held every free log to recover it made a new
log; two processes opening and closing in turns made 97 logs in 400 opens, and every open
recovers every free log."""
from __future__ import annotations

import fcntl
import multiprocessing
import os
import time

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine import logowners


def _open_and_close(path: str, rounds: int, stream: str) -> None:
    for i in range(rounds):
        with snapstore.open(path) as s:        # default timeout 0: no waiting for locks
            if i % 3 == 0:
                s.checkpoint({"a": os.urandom(3000)}, stream=stream)


def _compact_until(path: str, stop) -> None:
    while not stop.is_set():
        with snapstore.open(path, timeout=30) as s:
            s.compact(threshold=1.0)


def test_writers_opening_in_turns_share_their_logs(tmp_path):
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"a": b"x" * 1000}, stream="t")
    ctx = multiprocessing.get_context("fork")
    stop = ctx.Event()
    compactor = ctx.Process(target=_compact_until, args=(path, stop))
    openers = [ctx.Process(target=_open_and_close, args=(path, 120, f"w{k}"))
               for k in range(2)]
    compactor.start()
    for p in openers:
        p.start()
    for p in openers:
        p.join(120)
    stop.set()
    compactor.join(120)
    assert [p.exitcode for p in openers + [compactor]] == [0, 0, 0]
    # three writers at most at once: three logs (the old code: dozens)
    assert len(logowners.lock_files(path)) <= 3, os.listdir(os.path.join(path, "writers"))
    with snapstore.open(path) as s:
        assert s.verify()["ok"]
        assert len(s.checkpoint_ids("w0")) == len(s.checkpoint_ids("w1")) == 40


def test_a_choice_held_too_long_is_made_without_it(tmp_path, monkeypatch):
    """An opener never waits long for another's choice, and never fails for it: a holder
    stuck (stopped, say) costs CHOICE_WAIT_SECONDS and at worst a new log."""
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"a": b"x"}, stream="t")
    monkeypatch.setattr(logowners, "CHOICE_WAIT_SECONDS", 0.2)
    fd = os.open(os.path.join(path, fmt.WRITERS_DIR, fmt.LOG_CHOICE_LOCK_FILE), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        began = time.monotonic()
        with snapstore.open(path) as s:
            waited = time.monotonic() - began
            assert s.restore(s.checkpoint_ids("t")[-1])["a"] == b"x"
            s.checkpoint({"a": b"y"}, stream="t")
    finally:
        os.close(fd)
    assert 0.2 <= waited < 5


def test_a_writer_waits_for_another_openers_choice(tmp_path):
    """While another opener chooses (the lock held), an opener waits, then adopts the free
    log instead of making a new one."""
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"a": b"x"}, stream="t")
    assert logowners.lock_files(path) == [0]
    fd = os.open(os.path.join(path, fmt.WRITERS_DIR, fmt.LOG_CHOICE_LOCK_FILE), os.O_RDWR)
    held = logowners.try_take(path, 0)          # as an opener recovering log 0 holds it
    fcntl.flock(fd, fcntl.LOCK_EX)
    import threading

    def finish_choice():
        os.close(held)                          # it adopted another log, or closed
        os.close(fd)
    threading.Timer(0.2, finish_choice).start()
    with snapstore.open(path) as s:
        s.checkpoint({"a": b"y"}, stream="t")
    assert logowners.lock_files(path) == [0]


def test_without_the_lock_file_a_writer_still_opens(tmp_path, monkeypatch):
    """A store whose writers/ this user cannot write to, though the logs' lock files are
    writable, opened before there was a lock file to choose under: it still does."""
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"a": b"x"}, stream="t")
    os.unlink(os.path.join(path, fmt.WRITERS_DIR, fmt.LOG_CHOICE_LOCK_FILE))
    real = logowners._open

    def refused(file_path, flags, mode):
        if file_path.endswith(fmt.LOG_CHOICE_LOCK_FILE):
            raise PermissionError(13, "Permission denied", file_path)
        return real(file_path, flags, mode)
    monkeypatch.setattr(logowners, "_open", refused)
    with snapstore.open(path) as s:
        s.checkpoint({"a": b"y"}, stream="t")
        assert s.restore(s.checkpoint_ids("t")[-1])["a"] == b"y"
    assert logowners.lock_files(path) == [0]
