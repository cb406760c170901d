"""The segment-backend contract (snapstore.engine.backends.base): one conformance suite run
against every backend implementation, and checks that the abstract classes are complete.

Each test exercises one documented semantic; a new backend (an object store, per-writer logs)
joins by adding a factory to BACKENDS.
"""
from __future__ import annotations

import os
from abc import ABC

import pytest

from snapstore.engine import format as fmt
from snapstore.engine.backends import (LocalSegments, SegmentBackend, SegmentFile, SegmentReader,
                                       segment_name)
from snapstore.errors import CorruptionError

from faulty_backend import FaultyBackend, FaultyFile, FaultyReader


def _local(directory: str, durable: bool) -> SegmentBackend:
    return LocalSegments(directory, durable=durable)


def _faulty_pass_through(directory: str, durable: bool) -> SegmentBackend:
    return FaultyBackend(directory, durable=durable)     # nothing armed: every call passes


BACKENDS = {"local": _local, "faulty-pass-through": _faulty_pass_through}


@pytest.fixture(params=sorted(BACKENDS))
def make(request, tmp_path):
    """make(durable=True) -> a backend over an empty directory (closed after the test)."""
    made = []

    def factory(durable: bool = True) -> SegmentBackend:
        directory = tmp_path / f"segments{len(made)}"
        directory.mkdir()
        made.append(BACKENDS[request.param](str(directory), durable))
        return made[-1]
    yield factory
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make):
    return make()


def _read_all(backend: SegmentBackend, number: int) -> bytes:
    with backend.open_reader() as r:
        return r.read(number, 0, backend.size(number))


# ---- the abstract classes --------------------------------------------------------------------

CONTRACT = {
    SegmentBackend: {"durable", "list", "size", "open_reader", "create", "open_append", "remove",
                     "sync_directory", "close"},
    SegmentFile: {"number", "size", "append", "sync", "truncate", "close"},
    SegmentReader: {"read", "close"},
}


@pytest.mark.parametrize("abc", list(CONTRACT), ids=lambda c: c.__name__)
def test_the_contract_is_what_the_abstract_class_declares(abc):
    assert issubclass(abc, ABC)
    assert set(abc.__abstractmethods__) == CONTRACT[abc]
    for name in CONTRACT[abc]:
        assert getattr(abc, name).__doc__, f"{abc.__name__}.{name} documents no semantics"


@pytest.mark.parametrize("abc", list(CONTRACT), ids=lambda c: c.__name__)
def test_a_subclass_missing_any_method_cannot_be_instantiated(abc):
    def stub(self, *args, **kwargs):
        return None
    for missing in sorted(CONTRACT[abc]):
        members = {name: (property(stub) if isinstance(getattr(abc, name), property) else stub)
                   for name in CONTRACT[abc] - {missing}}
        partial = type(f"Without_{missing}", (abc,), members)
        with pytest.raises(TypeError, match=missing):
            partial()
    complete = type("Complete", (abc,), {name: stub for name in CONTRACT[abc]})
    assert isinstance(complete(), abc)


def _public(cls) -> set:
    return {n for n in dir(cls) if not n.startswith("_")}


def test_implementations_offer_exactly_the_contract(tmp_path):
    """No public extras that callers could come to depend on (test-only fault controls
    aside)."""
    backend = LocalSegments(str(tmp_path))
    with backend.create(1) as f, backend.open_reader() as r:
        assert _public(type(backend)) == _public(SegmentBackend)
        assert _public(type(f)) == _public(SegmentFile)
        assert _public(type(r)) == _public(SegmentReader)
    faults = {"fail", "clear", "hit", "raise_if"}
    assert _public(FaultyBackend) - faults == _public(SegmentBackend)
    assert _public(FaultyFile) == _public(SegmentFile)
    assert _public(FaultyReader) == _public(SegmentReader)


# ---- the catalog -----------------------------------------------------------------------------

def test_durable_is_the_setting_given(make):
    assert make(durable=True).durable is True
    assert make(durable=False).durable is False


def test_list_is_ascending_whatever_the_creation_order(backend):
    assert backend.list() == []
    for n in (3, 1, 12, 2):
        backend.create(n).close()
    assert backend.list() == [1, 2, 3, 12]


def test_create_makes_an_empty_segment_open_for_appending(backend):
    with backend.create(7) as f:
        assert f.number == 7 and f.size == 0
        assert backend.list() == [7] and backend.size(7) == 0


def test_create_of_an_existing_segment_fails_and_leaves_it_alone(backend):
    with backend.create(1) as f:
        f.append([b"keep me"])
    with pytest.raises(FileExistsError):
        backend.create(1)
    assert _read_all(backend, 1) == b"keep me"


def test_size_counts_every_append_that_returned(backend):
    with backend.create(1) as f:
        f.append([b"abc"])
        assert backend.size(1) == 3
        f.append([b"defg"])
        assert backend.size(1) == 7


def test_size_of_a_missing_segment_is_file_not_found(backend):
    with pytest.raises(FileNotFoundError):
        backend.size(5)


def test_remove_unlists_and_is_idempotent(backend):
    for n in (1, 2):
        backend.create(n).close()
    backend.remove(1)
    assert backend.list() == [2]
    backend.remove(1)                       # a missing segment: nothing happens
    backend.remove(99)
    assert backend.list() == [2]
    with backend.open_reader() as r, pytest.raises(CorruptionError):
        r.read(1, 0, 1)


def test_sync_directory_is_idempotent(backend):
    backend.sync_directory()                # nothing changed
    backend.create(1).close()
    backend.sync_directory()
    backend.sync_directory()
    backend.remove(1)
    backend.sync_directory()
    assert backend.list() == []


def test_close_is_idempotent(make):
    b = make()
    b.close()
    b.close()


# ---- the appendable segment ------------------------------------------------------------------

def test_append_writes_parts_in_order_at_the_end(backend):
    parts = [b"head", bytearray(b"-ba"), memoryview(b"xxmid-yy")[2:-2], b"", b"tail"]
    with backend.create(1) as f:
        f.append(parts)
        assert f.size == len(b"head-bamid-tail")
        f.append([b"!"])
        assert f.size == 16
    assert _read_all(backend, 1) == b"head-bamid-tail!"


def test_open_append_continues_at_the_end(backend):
    with backend.create(1) as f:
        f.append([b"12345"])
    with backend.open_append(1) as f:
        assert f.number == 1 and f.size == 5
        f.append([b"678"])
        assert f.size == 8
    assert _read_all(backend, 1) == b"12345678"


def test_open_append_of_a_missing_segment_is_file_not_found(backend):
    with pytest.raises(FileNotFoundError):
        backend.open_append(4)


def test_sync_keeps_what_was_appended(backend):
    with backend.create(1) as f:
        f.sync()                            # nothing appended yet
        f.append([b"durable"])
        f.sync()
        f.sync()
        assert f.size == 7
    assert _read_all(backend, 1) == b"durable"


def test_start_writeback_is_a_hint_that_changes_nothing(backend):
    f = backend.create(1)
    f.append([b"a" * 5000])
    f.start_writeback(0, 5000)
    f.start_writeback(4000, 10 ** 9)          # past the end: still only a hint
    f.start_writeback(0, 0)
    f.append([b"b"])
    f.sync()
    assert f.size == 5001 and _read_all(backend, 1) == b"a" * 5000 + b"b"
    f.close()


def test_local_writeback_failure_is_ignored(tmp_path, monkeypatch):
    from snapstore import _native

    def failing(*args):
        raise OSError(5, "injected")
    monkeypatch.setattr(_native, "start_writeback", failing)
    backend = LocalSegments(str(tmp_path))
    with backend.create(1) as f:
        f.append([b"x" * 100])
        f.start_writeback(0, 100)            # no error: sync() is what reports failures
        f.sync()
        assert f.size == 100
    backend.close()


def test_truncate_cuts_back_and_the_next_append_lands_there(backend):
    with backend.create(1) as f:
        f.append([b"0123456789"])
        f.truncate(4)
        assert f.size == 4 and backend.size(1) == 4
        f.append([b"ab"])
        assert f.size == 6
        f.truncate(6)                       # to the current size: nothing changes
        f.sync()
    assert _read_all(backend, 1) == b"0123ab"


def test_truncate_never_grows_a_segment(backend):
    with backend.create(1) as f:
        f.append([b"abc"])
        for bad in (4, -1):
            with pytest.raises(ValueError):
                f.truncate(bad)
        assert f.size == 3
    assert _read_all(backend, 1) == b"abc"


def test_a_failed_append_leaves_size_counting_the_bytes_that_landed(backend, monkeypatch):
    """A disk filling up mid-write: a short write, then ENOSPC. size is exact, so truncating
    back to the size before the append repairs the segment."""
    import errno
    real, calls = os.writev, []

    def short_then_full(fd, bufs):
        calls.append(fd)
        if len(calls) == 1:
            return real(fd, [bytes(bufs[0])[:3]])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    with backend.create(1) as f:
        f.append([b"ok"])
        monkeypatch.setattr(os, "writev", short_then_full)
        with pytest.raises(OSError):
            f.append([b"abcdef", b"ghi"])
        monkeypatch.setattr(os, "writev", real)
        assert f.size == 5 == backend.size(1)
        f.truncate(2)
        f.append([b"!"])
    assert _read_all(backend, 1) == b"ok!"


def test_a_closed_file_refuses_use_and_closes_idempotently(backend):
    f = backend.create(1)
    f.append([b"x"])
    f.close()
    f.close()
    for use in (lambda: f.append([b"y"]), f.sync, lambda: f.truncate(0)):
        with pytest.raises(ValueError):
            use()
    assert _read_all(backend, 1) == b"x"


def test_the_file_is_a_context_manager_that_closes(backend):
    with backend.create(1) as f:
        assert isinstance(f, SegmentFile)
    with pytest.raises(ValueError):
        f.append([b"late"])


# ---- read sessions ---------------------------------------------------------------------------

def test_read_returns_the_range_or_less_at_the_end(backend):
    with backend.create(1) as f:
        f.append([b"0123456789"])
    with backend.open_reader() as r:
        assert r.read(1, 0, 10) == b"0123456789"
        assert r.read(1, 3, 4) == b"3456"
        assert r.read(1, 8, 5) == b"89"             # the segment ends first
        assert r.read(1, 10, 5) == b""              # at the end
        assert r.read(1, 50, 5) == b""              # past it


@pytest.mark.parametrize("offset,length", [(0, 10), (3, 4), (8, 5), (10, 5), (50, 5),
                                           (0, 0), (9, 1)])
def test_read_into_fills_what_read_returns(backend, offset, length):
    with backend.create(1) as f:
        f.append([b"0123456789"])
    with backend.open_reader() as r:
        want = r.read(1, offset, length)
        buf = bytearray(b"#" * (length + 2))
        assert r.read_into(1, offset, memoryview(buf)[:length]) == len(want)
        assert buf == want + b"#" * (length + 2 - len(want))   # nothing written past it


def test_read_into_of_a_missing_segment_or_a_closed_session_fails_as_read_does(backend):
    backend.create(1).close()
    r = backend.open_reader()
    with pytest.raises(CorruptionError):
        r.read_into(42, 0, bytearray(4))
    r.close()
    with pytest.raises(ValueError):
        r.read_into(1, 0, bytearray(1))


def test_read_sees_appends_of_the_open_segment(backend):
    with backend.create(1) as f, backend.open_reader() as r:
        f.append([b"abc"])
        assert r.read(1, 0, 3) == b"abc"
        f.append([b"def"])
        assert r.read(1, 0, 6) == b"abcdef"


def test_read_of_a_missing_segment_is_corruption_naming_it(backend):
    with backend.open_reader() as r:
        with pytest.raises(CorruptionError) as ei:
            r.read(42, 0, fmt.SEGMENT_HEADER.size)
    assert ei.value.segment == segment_name(42)
    assert segment_name(42) in str(ei.value)


def test_the_session_is_a_context_manager_that_closes(backend):
    backend.create(1).close()
    with backend.open_reader() as r:
        assert isinstance(r, SegmentReader)
        assert r.read(1, 0, 1) == b""
    with pytest.raises(ValueError):
        r.read(1, 0, 1)
    r.close()                               # idempotent
    r.close()


def test_close_without_with_ends_the_session(backend):
    backend.create(1).close()
    r = backend.open_reader()
    r.read(1, 0, 1)
    r.close()
    with pytest.raises(ValueError):
        r.read(1, 0, 1)


def test_a_session_keeps_reading_a_segment_removed_after_it_read_it(backend):
    """The documented lifetime: removal frees a segment once the sessions reading it end."""
    with backend.create(1) as f:
        f.append([b"still here"])
    with backend.open_reader() as r:
        assert r.read(1, 0, 5) == b"still"
        backend.remove(1)
        assert backend.list() == []
        assert r.read(1, 6, 4) == b"here"
    with backend.open_reader() as r, pytest.raises(CorruptionError):
        r.read(1, 0, 1)


# ---- the local backend's own promise ---------------------------------------------------------

def test_local_lists_only_segment_files(tmp_path):
    for name in ("notes.txt", "12.seg.tmp", "abc.seg", ".0000000000000003.seg"):
        (tmp_path / name).write_bytes(b"")
    backend = LocalSegments(str(tmp_path))
    backend.create(2).close()
    assert backend.list() == [2]
    assert segment_name(2) in os.listdir(tmp_path)          # the file name the log documents


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink", "dangling_symlink"])
def test_defect8_local_refuses_a_segment_that_is_not_a_regular_file(tmp_path, kind):
    """Issue 14 (8b, 10): never a hang on a FIFO, never a read through a symlink, never a raw
    IsADirectoryError: every method meeting the entry raises CorruptionError naming it."""
    backend = LocalSegments(str(tmp_path))
    with backend.create(1) as f:
        f.append([b"real"])
    path = tmp_path / segment_name(2)
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "symlink":
        path.symlink_to(tmp_path / segment_name(1))
    else:
        path.symlink_to(tmp_path / "gone")
    name = segment_name(2)
    for call in (backend.list, lambda: backend.size(2), lambda: backend.open_append(2)):
        with pytest.raises(CorruptionError, match=name):
            call()
    with backend.open_reader() as r, pytest.raises(CorruptionError, match=name):
        r.read(2, 0, 4)
    with pytest.raises((FileExistsError, CorruptionError)):
        backend.create(2)
    with backend.open_reader() as r:
        assert r.read(1, 0, 4) == b"real"


def test_defect11_local_creates_segments_with_the_file_mode(tmp_path):
    old = os.umask(0)
    try:
        LocalSegments(str(tmp_path)).create(1).close()
        LocalSegments(str(tmp_path), file_mode=0o640).create(2).close()
    finally:
        os.umask(old)
    assert oct(os.stat(tmp_path / segment_name(1)).st_mode & 0o777) == oct(0o600)
    assert oct(os.stat(tmp_path / segment_name(2)).st_mode & 0o777) == oct(0o640)


@pytest.mark.parametrize("durable", [True, False])
def test_the_log_starts_writeback_of_large_flushes_only_when_durable(tmp_path, monkeypatch,
                                                                      durable):
    """A durable log hints the device to start on every flush of WRITEBACK_BYTES or more (so
    the final sync waits less); a log that does not sync never does (the OS decides)."""
    from snapstore import _native
    from snapstore.engine import wal
    calls = []
    real = _native.start_writeback

    def recording(fd, offset, length):
        calls.append((offset, length))
        real(fd, offset, length)
    monkeypatch.setattr(_native, "start_writeback", recording)
    backend = LocalSegments(str(tmp_path), durable=durable)
    log = wal.SegmentLog(backend, segment_size=64 << 20)
    log.open_tail()
    log.append(fmt.REC_CHUNK, fmt.CODEC_RAW, [b"s" * 100])
    log.flush()                                           # small: no hint
    log.append(fmt.REC_CHUNK, fmt.CODEC_RAW, [b"x" * wal.WRITEBACK_BYTES])
    log.flush()
    log.sync()
    log.close()
    backend.close()
    if durable:
        assert len(calls) == 1 and calls[0][1] >= wal.WRITEBACK_BYTES
    else:
        assert calls == []
