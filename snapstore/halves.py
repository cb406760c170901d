"""Two calls at once: the second on a thread of its own, the first on the caller's. For work
that lets go of the GIL (the C core's loops, zstd, writes), split in two halves on a 2-core
machine (both()), or begun now and waited for later (start(): the log's write-behind).
A leaf: of snapstore it imports only the interrupts leaf (start_thread)."""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

from snapstore.interrupts import start_thread

A = TypeVar("A")
B = TypeVar("B")


def split_point(sizes: list) -> int:
    """Where to cut a list of items of these sizes in two for both(): the index (1 to
    len - 1, for two items or more) after which the first part holds at most half of the
    total, each part keeping at least one item."""
    total, half, at = sum(sizes), 0, 0
    while at < len(sizes) - 1 and half + sizes[at] <= total // 2:
        half += sizes[at]
        at += 1
    return max(at, 1)


class Started:
    """A call running on a thread of its own (start()); wait() joins it and returns its
    result or raises its exception, in the waiting thread, every time it is asked."""

    def __init__(self, call: Callable[[], A]) -> None:
        self._outcome: tuple = (False, RuntimeError("the call never ended (its thread is gone: "
                                                    "a fork()ed child?)"))

        def run() -> None:
            try:
                self._outcome = (True, call())
            except BaseException as exc:        # raised in the waiting thread by wait()
                self._outcome = (False, exc)
        self._thread = threading.Thread(target=run, name="snapstore-half", daemon=True)
        start_thread(self._thread)

    def finish(self) -> None:
        """Waits for the call to end, whatever its outcome."""
        self._thread.join()

    def wait(self):
        self.finish()
        ok, value = self._outcome
        if not ok:
            raise value
        return value


def start(call: Callable[[], A]) -> Started:
    """call() begun on a new thread; its Started handle waits for it."""
    return Started(call)


def both(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """(first(), second()), second() run on a new thread meanwhile; the exception of either
    is raised here (first's when both fail), after both have ended."""
    worker = start(second)
    try:
        a = first()
    except BaseException:
        worker.finish()
        raise
    return a, worker.wait()
