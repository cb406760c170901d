"""remote/spool.py without a server: which writer sessions of a cache directory are gone
(their flock is free), that settling removes exactly their lock files and spool files, and
that a live session (another open file description, as another process has) is never
touched. Sessions of another store (record without this store's uuid) need no S3 request, so
no client is given here: a request would fail the test."""
from __future__ import annotations

import json
import os

from snapstore.engine import format as fmt
from snapstore.engine.backends.base import segment_name
from snapstore.remote import spool


def spool_file(cache, number: int) -> str:
    os.makedirs(spool.spool_dir(cache), exist_ok=True)
    path = os.path.join(spool.spool_dir(cache), segment_name(number))
    with open(path, "wb") as f:
        f.write(b"x")
    return path


def test_a_live_session_is_kept_and_gone_ones_are_settled(tmp_path):
    cache = str(tmp_path)
    live = spool.Session.take(cache, 3, {"store": "other", "durability": "remote"})
    assert live is not None
    live_file = spool_file(cache, 3 * fmt.LOG_SEGMENTS + 1)
    closed = spool.Session.take(cache, 4, {"store": "other"})
    closed_file = spool_file(cache, 4 * fmt.LOG_SEGMENTS + 2)
    closed.close(clean=False)                      # as after a failed upload
    orphan_file = spool_file(cache, 7 * fmt.LOG_SEGMENTS + 1)    # no lock file at all
    os.makedirs(os.path.join(cache, spool.WRITERS_DIR), exist_ok=True)
    with open(os.path.join(cache, spool.WRITERS_DIR, "9"), "w"):
        pass                                       # died before its first segment

    assert spool.settle_sessions(None, cache, "this-store") == [4, 7, 9]
    assert os.path.exists(live_file)
    assert sorted(os.listdir(os.path.join(cache, spool.WRITERS_DIR))) == ["3"]
    assert not os.path.exists(closed_file) and not os.path.exists(orphan_file)
    # the live session's record is intact and its lock still held
    with open(os.path.join(cache, spool.WRITERS_DIR, "3")) as f:
        assert json.loads(f.read())["durability"] == "remote"
    assert spool.Session.take(cache, 3, {}) is None
    live.close(clean=True)
    assert os.listdir(os.path.join(cache, spool.WRITERS_DIR)) == []
    assert not os.path.exists(live_file)
    assert spool.settle_sessions(None, cache, "this-store") == []


def test_a_fork_child_does_not_keep_the_parents_session_alive(tmp_path):
    """A flock belongs to the open file description the child shares: unless the child
    forgets its copy (RemoteCommitter.after_fork_in_child), the parent's session would stay
    held after the parent closed it, for as long as the child lives."""
    cache = str(tmp_path)
    s = spool.Session.take(cache, 1, {})
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        s.forget()
        os.write(ready_w, b"1")
        os.read(go_r, 1)                # alive until the parent has looked
        os._exit(0)
    try:
        os.read(ready_r, 1)
        s.close(clean=False)            # the parent's session is gone, the child lives
        assert spool.settle_sessions(None, cache, None) == [1]
        assert os.listdir(os.path.join(cache, spool.WRITERS_DIR)) == []
    finally:
        os.write(go_w, b"1")
        os.waitpid(pid, 0)
