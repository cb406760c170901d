"""Ctrl-C at a chosen moment, for tests that run in a child process (the signals stay out of
pytest): SigintAtReturn(n) as a sys.settrace() function sends SIGINT to the process as the
n-th Python function called on the traced thread returns; Python's handler then raises
KeyboardInterrupt at the next bytecode, as a real Ctrl-C landing there would. Trying every n
in turn puts an interrupt at every point of a call."""
from __future__ import annotations

import inspect
import signal
import sys


class SigintAtReturn:
    """on_wait: called when a function named `wait` is entered (a test releases whatever
    the call under test waits for then)."""

    def __init__(self, n: int, on_wait=None) -> None:
        self.n, self.on_wait, self.returns, self.where = n, on_wait, 0, None

    def __call__(self, frame, event, arg):
        if event == "call" and frame.f_code.co_name == "wait" and self.on_wait is not None:
            self.on_wait()
        # (not in a weak reference's callback, which the garbage collector runs anywhere and
        # where Python ignores exceptions: the interrupt would be lost, by Python)
        if event == "return" and not frame.f_code.co_filename.endswith("_weakrefset.py"):
            self.returns += 1
            if self.returns == self.n:
                if frame.f_code.co_flags & inspect.CO_GENERATOR:
                    # (a generator's yield or close: when the garbage collector closes it,
                    # Python ignores exceptions, so the interrupt would be lost, by Python):
                    # the next return instead
                    self.n += 1
                    return self
                self.where = f"{frame.f_code.co_filename}:{frame.f_code.co_name}"
                signal.raise_signal(signal.SIGINT)
        return self


def interrupted_at_return(n: int, call, on_wait=None) -> tuple[bool, SigintAtReturn]:
    """Runs call() with a SIGINT sent as the n-th function it calls returns: (whether it
    raised KeyboardInterrupt, the injector: its `where` is None when call() made fewer than n
    returns, so every point was tried). Any other exception ends the process, naming where
    the SIGINT landed."""
    inject = SigintAtReturn(n, on_wait)
    sys.settrace(inject)
    try:
        try:
            call()
        finally:
            sys.settrace(None)
    except KeyboardInterrupt:
        return True, inject
    except BaseException as exc:        # noqa: BLE001 - the failure this helper reports
        sys.exit(f"SIGINT at the return of {inject.where}: {exc!r} instead of "
                 "KeyboardInterrupt")
    return False, inject
