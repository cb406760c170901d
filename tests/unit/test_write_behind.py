"""The log's write-behind (SegmentLog.flush(wait=False), and append()'s own flushes): records
are written on a thread of their own while the caller prepares the next ones. What must hold:
every record lands exactly where append() said it would, across segment rollovers; nothing is
lost by close(); a failed write raises StoreIOError from the next call that waits for it, the
log then refuses writes until a rollback cuts it back, and after the rollback it works again."""
from __future__ import annotations

import errno
import os
import random

import pytest

from snapstore.engine import format as fmt
from snapstore.engine import wal
from snapstore.errors import StoreIOError

from faulty_backend import FaultyBackend


def open_log(tmp_path, segment_size=1 << 20):
    os.mkdir(os.path.join(str(tmp_path), "segs"))
    backend = FaultyBackend(os.path.join(str(tmp_path), "segs"), durable=True)
    log = wal.SegmentLog(backend, segment_size=segment_size)
    log.open_tail()
    return backend, log


def records_in(backend) -> list:
    """(segment, offset, payload) of every record, in log order; asserts each segment scans
    as whole valid records to its end."""
    out = []
    for n in backend.list():
        last = None
        for last in wal.scan(backend, n, 0, chunk_payloads=True):
            if not isinstance(last, tuple):
                out.append((last.segment, last.offset, bytes(last.payload)))
        assert last == ("end", backend.size(n)), (n, last)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_records_land_where_append_said_across_rollovers(tmp_path, seed):
    rng = random.Random(seed)
    backend, log = open_log(tmp_path, segment_size=3 << 20)
    promised = []
    for i in range(120):
        payload = rng.randbytes(rng.choice([0, 1, 100, 70_000, 900_000]))
        promised.append((*log.append(fmt.REC_CHUNK, 0, [b"", payload]), payload))
        if rng.random() < 0.2:
            log.flush(wait=rng.random() < 0.5)
        assert log.position[1] <= 3 << 20 or promised[-1][1] == fmt.SEGMENT_HEADER.size
    log.sync()
    log.close()
    assert records_in(backend) == promised
    assert len(backend.list()) > 5      # it rolled over, with writes behind


def test_close_waits_for_the_write_behind(tmp_path):
    backend, log = open_log(tmp_path, segment_size=64 << 20)
    payload = os.urandom(wal.PENDING_BYTES + 1)     # append() writes it behind at once
    where = log.append(fmt.REC_CHUNK, 0, [payload])
    log.close()
    assert records_in(backend) == [(*where, payload)]


def test_nothing_pending_flush_is_a_no_op_twice(tmp_path):
    backend, log = open_log(tmp_path)
    log.flush(wait=False)
    log.flush()
    assert log.position == (backend.list()[0], fmt.SEGMENT_HEADER.size)
    log.close()
    log.close()
    assert records_in(backend) == []


@pytest.mark.parametrize("partial", [0.0, 0.5])
def test_a_failed_write_behind_refuses_writes_until_rolled_back(tmp_path, partial):
    backend, log = open_log(tmp_path, segment_size=64 << 20)
    kept = log.append(fmt.REC_CHUNK, 0, [b"kept"])
    log.sync()
    mark = log.position
    backend.fail("write", 1, errno.ENOSPC, partial=partial)
    log.append(fmt.REC_CHUNK, 0, [os.urandom(wal.PENDING_BYTES)])   # written behind: fails
    assert backend.fired_in and backend.fired_in[0] != "MainThread"
    log.append(fmt.REC_CHUNK, 0, [b"queued after it"])
    with pytest.raises(StoreIOError, match="disk full") as ei:
        log.flush()
    assert ei.value.errno == errno.ENOSPC
    for call in (lambda: log.append(fmt.REC_CHUNK, 0, [b"x"]), log.flush, log.sync):
        with pytest.raises(StoreIOError, match="rolled back"):
            call()
    assert log.rollback(mark)
    again = log.append(fmt.REC_CHUNK, 0, [b"after the rollback"])
    assert again == mark
    log.sync()
    log.close()
    assert records_in(backend) == [(*kept, b"kept"), (*mark, b"after the rollback")]


@pytest.mark.parametrize("behind", [False, True])
def test_mark_writes_what_is_queued_first(tmp_path, behind):
    """SegmentLog.mark(): a rollback mark taken after records were appended is an end the
    segment file reaches. The records queued (and the write behind) are written first, and
    their failure raises there; a mark at `position` counted them, and the rollback to it
    after their write failed found it past the segment's end and broke the log (a copy's or
    an import's commit on a full disk: tests/unit/test_store_faults.py)."""
    backend, log = open_log(tmp_path, segment_size=64 << 20)
    start = log.position
    size = wal.PENDING_BYTES if behind else 1000     # written behind, or only queued
    log.append(fmt.REC_CHUNK, 0, [os.urandom(size)])
    counted = log.position
    assert log.mark() == counted == (counted[0], backend.size(counted[0]))
    log.append(fmt.REC_CHUNK, 0, [b"y" * 10])
    backend.fail("write", 1, errno.ENOSPC, partial=0.5)
    log.append(fmt.REC_CHUNK, 0, [os.urandom(size)])
    with pytest.raises(StoreIOError, match="disk full"):
        log.mark()
    assert backend.fired_in[0] != "MainThread" if behind else backend.fired == ["write"]
    assert log.rollback(start)
    assert log.broken is None and log.position == start
    where = log.append(fmt.REC_CHUNK, 0, [b"after"])
    assert log.mark() == (where[0], where[1] + fmt.RECORD_HEADER.size + 5)
    log.close()
    assert records_in(backend) == [(*start, b"after")]


def test_rollback_while_a_write_is_behind_cuts_it_off(tmp_path):
    backend, log = open_log(tmp_path, segment_size=64 << 20)
    mark = log.position
    log.append(fmt.REC_CHUNK, 0, [os.urandom(wal.PENDING_BYTES)])   # written behind
    assert log.rollback(mark)
    assert log.position == mark
    log.close()
    assert records_in(backend) == []


def test_a_forked_child_closing_the_log_neither_hangs_nor_harms_the_parents_write(tmp_path):
    backend, log = open_log(tmp_path, segment_size=64 << 20)
    payload = os.urandom(wal.PENDING_BYTES + 1)
    where = log.append(fmt.REC_CHUNK, 0, [payload])         # written behind, maybe still
    pid = os.fork()
    if pid == 0:                                            # the child: its copy of the log
        try:
            log.close()                                     # has no thread behind it
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    log.sync()
    log.close()
    assert records_in(backend) == [(*where, payload)]
