"""File-system helpers shared by the local segment backend, the store directory and the bench
harness."""
from __future__ import annotations

import os


def fsync_directory(path: str) -> None:
    """Makes a directory's entries (files created, renamed or removed in it) durable.
    Idempotent. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
