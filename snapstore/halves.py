"""Two calls at once: the second on a thread of its own, the first on the caller's. For work
that lets go of the GIL (the C core's loops, zstd), split in two halves on a 2-core machine.
A leaf: imports nothing of snapstore."""
from __future__ import annotations

import threading
from typing import Callable, TypeVar

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


def both(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """(first(), second()), second() run on a new thread meanwhile; the exception of either
    is raised here (first's when both fail), after both have ended."""
    result: list = []

    def run_second() -> None:
        try:
            result.append((True, second()))
        except BaseException as exc:            # raised in the calling thread below
            result.append((False, exc))
    worker = threading.Thread(target=run_second, name="snapstore-half", daemon=True)
    worker.start()
    try:
        a = first()
    finally:
        worker.join()
    ok, b = result[0]
    if not ok:
        raise b
    return a, b
