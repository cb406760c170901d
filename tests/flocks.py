"""Whether another open file holds a file's flock, for tests that check a lock was taken or
let go (the probe's own flock is let go as its file closes)."""
from __future__ import annotations

import fcntl
import os


def flocked(path: str) -> bool:
    """True when some other open file description holds an exclusive or shared flock of
    path that keeps an exclusive one out."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
