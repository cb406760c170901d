"""Waiting for a state change that a KeyboardInterrupt cannot leave half done.

threading.Condition.wait() releases its lock, then enters the try block that takes it back. A
signal handler that raises between the two (Ctrl-C's KeyboardInterrupt, in the main thread)
leaves the lock released, and the `with` around the wait then fails with RuntimeError
("release unlocked lock"), which hides the interrupt and skips the caller's clean-up.

Here a waiter never holds the state lock while it waits. Under the state lock it checks the
state and, if it must wait, registers a one-shot lock (register()); it leaves its `with`, then
blocks on that lock alone (one C call, which returns or raises and changes nothing else).
Whoever changes the state calls notify_all() under the same state lock, which releases every
registered waiter. So no wake-up is lost, and an interrupt anywhere leaves the state lock as a
`with` leaves it:

    while True:
        with state_lock:
            if ready():
                ...                       # act on the state, still under the lock
                break
            waiter = wakeups.register()
        wakeups.wait(waiter, state_lock)  # returns on a notify_all() (or a timeout): look again

wait_until(state_lock, done) is that loop for a waiter that only needs done() to hold.
"""
from __future__ import annotations

import threading


BACKSTOP_SECONDS = 0.25


class WakeUps:
    """The waiters on one state lock's state changes (see the module's docstring)."""

    def __init__(self) -> None:
        self._waiters: list = []

    def register(self) -> threading.Lock:
        """(state lock held) A one-shot lock that the next notify_all() releases."""
        waiter = threading.Lock()
        waiter.acquire()
        self._waiters.append(waiter)
        return waiter

    def notify_all(self) -> None:
        """(state lock held) Wakes every registered waiter. The list is emptied only after
        every waiter was released: an interrupt half-way leaves the rest registered, and the
        next notify_all() wakes them (releasing one woken already is skipped, and one its
        thread took back already is released harmlessly: nothing waits on it again)."""
        for waiter in self._waiters:
            try:
                waiter.release()
            except RuntimeError:        # released by a notify_all() an interrupt cut short
                pass
        self._waiters = []

    def wait_until(self, state_lock: threading.Lock, done, poll: float | None = None):
        """(state lock NOT held) Returns done()'s value once it is true; done() is called
        under state_lock, at every notify_all() and at least every `poll` seconds."""
        while True:
            with state_lock:
                result = done()
                if result:
                    return result
                waiter = self.register()
            self.wait(waiter, state_lock, poll)

    def wait(self, waiter: threading.Lock, state_lock: threading.Lock,
             timeout: float | None = None) -> bool:
        """(state lock NOT held) Blocks until waiter is woken (True) or timeout seconds pass
        (False: it is then unregistered, so waiting with timeouts leaks nothing). Never longer
        than BACKSTOP_SECONDS: a notify_all() on the main thread that Ctrl-C cut short may
        have missed this waiter, and the caller, who looks at the state again after every
        wait, then sees the change anyway."""
        timeout = BACKSTOP_SECONDS if timeout is None else min(timeout, BACKSTOP_SECONDS)
        if waiter.acquire(timeout=timeout):
            return True
        with state_lock:
            if waiter in self._waiters:
                self._waiters.remove(waiter)
                return False
        return True                     # woken just as the wait timed out
