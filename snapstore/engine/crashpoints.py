"""Crash points for the crash tests: named places where a test can make the process die.

Inert unless the environment variable SNAPSTORE_CRASH_AT is set to "name" or "name:N" (die the
N-th time the point is reached, default 1). Dying is SIGKILL: no cleanup, like a power cut for
this process (the page cache survives).
"""
from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def crashpoint(name: str) -> None:
    spec = os.environ.get("SNAPSTORE_CRASH_AT")
    if not spec:
        return
    target, _, count = spec.partition(":")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)
