"""The staging arena of asynchronous checkpoints: a ring of memory that captures copy the
changed bytes into, so the caller's buffers are free again as soon as the capture returns.

Regions are taken in capture order and freed in the same order once their job is persisted
(FIFO; one freed early is reused only after the older ones); a capture that does not fit waits for older jobs to land (back-pressure). The memory is
mapped on first use, huge-page backed where the kernel allows.

A region is recorded with its taker (alloc's `owner`) as it is taken, so a capture interrupted
anywhere after alloc (a KeyboardInterrupt from Ctrl-C lands between any two bytecodes) can find
and free what it took (free_taken_by). The lock is a plain threading.Lock entered with `with`
(a C-level __enter__, which no signal handler can interrupt half-way), and a capture waiting
for room waits outside it (snapstore.wakeups: Condition.wait is not interrupt-safe).
"""
from __future__ import annotations

import collections
import mmap
import os
import threading

from snapstore.errors import StoreIOError
from snapstore.wakeups import WakeUps

DEFAULT_STAGING_BYTES = 1 << 30
_FREED = object()       # the owner of a region freed before an older one


def max_staging_bytes() -> int:
    """The largest staging arena a store accepts: the machine's physical memory (staging
    memory is touched as captures fill it, so more could never be used), or the default."""
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        physical = 0
    return max(physical, DEFAULT_STAGING_BYTES)


class StagingArena:
    """A ring buffer of staging memory; regions are freed in the order they were taken."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._lock = threading.Lock()
        self._freed = WakeUps()         # waiters for room
        self._regions: collections.deque = collections.deque()   # (start, end, owner), oldest first
        self._head = 0
        self.in_use = 0             # bytes of the regions taken and not yet freed
        self.peak = 0               # the most in_use ever was

    def _memory(self) -> memoryview:
        if self._view is None:
            try:
                self._mm = mmap.mmap(-1, self.capacity)
            except OSError as exc:      # e.g. ENOMEM: the address space or overcommit limit
                raise StoreIOError(f"cannot map {self.capacity} bytes of staging memory "
                                   f"(staging_bytes): {exc.strerror or exc}", exc.errno) from None
            if hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
                try:
                    self._mm.madvise(mmap.MADV_HUGEPAGE)
                except OSError:
                    pass
            self._view = memoryview(self._mm)
        return self._view

    def _place(self, n: int) -> int | None:
        if not self._regions:
            return 0
        tail = self._regions[0][0]          # the oldest region still in use
        if self._head > tail:               # free: [head, capacity) and [0, tail)
            if self.capacity - self._head >= n:
                return self._head
            return 0 if n <= tail else None
        return self._head if self._head + n <= tail else None   # free: [head, tail)

    def alloc(self, n: int, wait: bool = True,
              owner: object = None) -> tuple[int, memoryview] | None:
        """Blocks until n contiguous bytes are free; returns (region id, memory). wait=False:
        None instead of blocking. owner: recorded with the region (free, free_taken_by). Raises
        StoreIOError (taking nothing) when the arena's memory cannot be mapped."""
        if n > self.capacity:
            raise ValueError("larger than the arena")
        while True:
            with self._lock:
                memory = self._memory()     # first: a mapping failure must leak no region
                start = self._place(n)
                if start is not None:
                    self._regions.append((start, start + n, owner))
                    self._head = start + n
                    self.in_use += n
                    self.peak = max(self.peak, self.in_use)
                    return start, memory[start:start + n]
            if not wait:
                return None
            self.wait_for_room(n, give_up=lambda: False)

    def wait_for_room(self, n: int, give_up) -> bool:
        """Waits until n contiguous bytes are free (True: alloc(n, wait=False) may still lose
        them to another thread) or give_up() is true (False; looked at every 50 ms)."""
        outcome = self._freed.wait_until(
            self._lock, lambda: "room" if self._place(n) is not None else give_up() and "gave up",
            poll=0.05)
        return outcome == "room"

    def free_taken_by(self, owner: object) -> bool:
        """Frees the region owner took, if it holds one (whether it did)."""
        with self._lock:
            for start, _, taker in self._regions:
                if taker is owner:
                    self._free(start, owner)
                    return True
            return False

    def free(self, start: int, owner: object = None) -> None:
        """Frees the region at start that owner took. Regions are meant to be freed in the
        order they were taken; one freed early (its taker was interrupted) is marked, and its
        memory is reused once every older region is freed too, so the ring never hands out
        memory a capture may still be filling. Freeing a region not taken raises
        AssertionError (checked under python -O too)."""
        with self._lock:
            self._free(start, owner)

    def _free(self, start: int, owner: object) -> None:
        # (lock held)
        for i, (begin, end, taker) in enumerate(self._regions):
            if begin == start and taker is owner:
                break
        else:
            raise AssertionError(f"staging region {start} of {owner!r} is not taken")
        self._regions[i] = (begin, end, _FREED)
        self.in_use -= end - begin
        while self._regions and self._regions[0][2] is _FREED:
            self._regions.popleft()
        if not self._regions:
            self._head = 0
        self._freed.notify_all()

    def close(self) -> None:
        with self._lock:            # (the worker and close() may both close it)
            view, mm, self._view, self._mm = self._view, self._mm, None, None
        if view is not None:
            try:
                view.release()
                mm.close()
            except BufferError:     # a view of it still lives: the mapping goes with it
                pass
