"""Sections that Ctrl-C must not cut in half.

A KeyboardInterrupt is raised in the main thread between any two bytecodes. Closing a store
releases locks, file descriptors and the index in several steps; an interrupt between two of
them leaves the process holding a lock that nothing will release (a later open() of the same
store in this process then waits for ever). deferred_interrupts() makes such a short section
whole: a SIGINT that arrives inside it is handled, by the handler that was installed, as the
section ends. Long waits are never put inside one: Ctrl-C must still stop them.
"""
from __future__ import annotations

import contextlib
import signal
import threading


@contextlib.contextmanager
def deferred_interrupts():
    """Runs the block with SIGINT's Python handler deferred to its end (main thread only:
    signals are handled there; elsewhere, or when SIGINT is ignored or not handled by Python,
    a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):          # SIG_IGN, SIG_DFL, or a handler set outside Python
        yield
        return
    received: list = []
    # From here a SIGINT only records itself (one arriving before this line is handled as
    # usual, before the section began). Not its frame: that would keep the interrupted
    # function's locals alive (a memoryview of a mapping made mmap.close() fail); the
    # handler gets frame None, which signal handlers must accept.
    signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received:
            previous(signal.SIGINT, None)


def start_thread(thread: threading.Thread) -> None:
    """thread.start(). It waits for the thread to begin on a Condition, and Ctrl-C landing in
    that wait surfaces as RuntimeError("release unlocked lock") with the KeyboardInterrupt as
    its context: the KeyboardInterrupt is raised instead (whether the thread began is
    unknown then, as after any interrupt of start())."""
    try:
        thread.start()
    except RuntimeError as exc:
        if isinstance(exc.__context__, KeyboardInterrupt):
            raise exc.__context__ from None
        raise
