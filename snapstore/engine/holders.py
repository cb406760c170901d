"""The record of who holds a lock file: written by the holder right after it takes the flock,
read by those who wait, only to say who holds it (docs/design.md, "The lock files").

The flock is the truth; the record is information only. Written in one write of a fixed size
(RECORD_BYTES, JSON padded with spaces) over the previous one, never read to decide anything:
a stale record (a holder that died: its flock went with it) is overwritten by the next holder,
and a torn, foreign or garbage one reads as "holder unknown". Used for STORE/lock (its
exclusive holders, who clear it when they share the lock or let go: a shared lock names
nobody), STORE/writers/<L> (each log's writer) and STORE/maintenance (a compaction, which
clears it when done; verify shares that lock and writes nothing).
"""
from __future__ import annotations

import json
import os
import time

RECORD_BYTES = 256
_HOLDER_KEYS = ("pid", "host", "since")


def write_holder(fd: int) -> None:
    """Records this process as the holder of the flock on fd (best effort: a failure to
    write it changes nothing but the messages others get)."""
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    body = json.dumps({"pid": os.getpid(), "host": os.uname().nodename[:128], "since": since})
    try:
        os.pwrite(fd, body.encode().ljust(RECORD_BYTES), 0)
        os.ftruncate(fd, RECORD_BYTES)
    except OSError:
        pass


def clear_holder(fd: int) -> None:
    """Empties the record of the flock on fd, which its holder is about to let go of (or to
    share: only exclusive holders are named). Best effort, as write_holder."""
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass


def read_holder(fd: int) -> dict:
    """{"pid", "host", "since"} as the lock file records them (each None when unknown: no
    record, a torn or foreign one, or one naming a process of this host that is gone)."""
    holder = dict.fromkeys(_HOLDER_KEYS)
    try:
        data = json.loads(os.pread(fd, RECORD_BYTES, 0))
    except (OSError, ValueError):
        return holder
    if not isinstance(data, dict):
        return holder
    pid, host, since = (data.get(k) for k in _HOLDER_KEYS)
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return holder
    if not all(isinstance(t, str) and t.isprintable() and len(t) <= 128 for t in (host, since)):
        return holder
    if host == os.uname().nodename and not _alive(pid):
        return holder            # stale: its holder died (the flock is someone else's)
    return {"pid": pid, "host": host, "since": since}


def _alive(pid: int) -> bool:
    """True if a process with this pid exists on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True
    return True
