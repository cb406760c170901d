"""The write-ahead log: append-only, checksummed records in numbered segment files.

Protocol (docs/design.md, "Commit and recovery"): a writer appends chunk records, then one
commit record, then makes them durable (fsync) before it applies them to the index. A record
is valid iff its header magic, type and length are sane and its XXH3-64 checksum matches.
Recovery scans past the index's applied position and truncates the log at the first invalid
record of the last segment (a torn tail); an invalid record anywhere else is corruption.

All segment I/O goes through SegmentBackend, so a second backend (an object store holding
sealed segments) is an addition, not a rewrite. LocalSegments is the file-system backend.
"""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import xxhash

from snapstore.engine import format as fmt
from snapstore.errors import CorruptionError, StoreIOError

Buffer = "bytes | bytearray | memoryview"


def fsync_directory(path: str) -> None:
    """Makes a directory's entries (files created, renamed or removed in it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def segment_name(number: int) -> str:
    return f"{number:016d}{fmt.SEGMENT_SUFFIX}"


def record_checksum(header16: bytes, parts: Sequence) -> int:
    """XXH3-64 over the checksummed header prefix and the payload parts, in order."""
    h = xxhash.xxh3_64(header16)
    for p in parts:
        h.update(p)
    return h.intdigest()


def encode_record_header(rtype: int, codec: int, parts: Sequence) -> bytes:
    length = sum(len(p) for p in parts)
    if length > fmt.MAX_RECORD_PAYLOAD:
        raise ValueError(f"record payload of {length} bytes exceeds the format's limit")
    prefix = fmt.RECORD_HEADER.pack(fmt.RECORD_MAGIC, rtype, codec, 0, length, 0, 0)
    prefix = prefix[:fmt.RECORD_CHECKSUMMED_PREFIX]
    checksum = record_checksum(prefix, parts)
    return fmt.RECORD_HEADER.pack(fmt.RECORD_MAGIC, rtype, codec, 0, length, 0, checksum)


def encode_segment_header(number: int) -> bytes:
    head = fmt.SEGMENT_HEADER.pack(fmt.SEGMENT_MAGIC, fmt.FORMAT_VERSION, 0, number, 0)[:24]
    return head + fmt.U64.pack(xxhash.xxh3_64_intdigest(head))


def check_segment_header(data: bytes, number: int, name: str) -> None:
    """Raises CorruptionError unless data is a valid header of segment `number`."""
    if len(data) < fmt.SEGMENT_HEADER.size:
        raise CorruptionError("segment header is truncated", segment=name, offset=0)
    magic, version, _, got_number, checksum = fmt.SEGMENT_HEADER.unpack_from(data)
    if magic != fmt.SEGMENT_MAGIC or xxhash.xxh3_64_intdigest(data[:24]) != checksum:
        raise CorruptionError("segment header is damaged", segment=name, offset=0)
    if version > fmt.FORMAT_VERSION:
        from snapstore.errors import FormatError
        raise FormatError(f"segment {name} has format version {version}; this snapstore "
                          f"reads up to {fmt.FORMAT_VERSION}")
    if got_number != number:
        raise CorruptionError(f"segment header names segment {got_number}", segment=name, offset=0)


# ---- backend interface ---------------------------------------------------------------------

class SegmentFile(Protocol):
    """An open segment being appended to."""
    number: int
    size: int

    def append(self, parts: Sequence) -> None: ...
    def sync(self) -> None: ...
    def truncate(self, size: int) -> None: ...
    def close(self) -> None: ...


class SegmentReader(Protocol):
    """A read session: may keep segments open until closed (one restore, scan or verify)."""

    def read(self, number: int, offset: int, length: int) -> bytes: ...
    def close(self) -> None: ...


class SegmentBackend(Protocol):
    """Where segment bytes live. Offsets are byte offsets inside one segment."""

    def list(self) -> list[int]: ...
    def size(self, number: int) -> int: ...
    def read(self, number: int, offset: int, length: int) -> bytes: ...
    def open_reader(self) -> SegmentReader: ...
    def create(self, number: int) -> SegmentFile: ...
    def sync_directory(self) -> None: ...
    def open_append(self, number: int) -> SegmentFile: ...
    def remove(self, number: int) -> None: ...
    def close(self) -> None: ...


def _io_error(what: str, exc: OSError) -> StoreIOError:
    reason = "disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else (exc.strerror or str(exc))
    return StoreIOError(f"{what}: {reason}", exc.errno)


class _LocalSegmentFile:
    def __init__(self, path: str, number: int, fd: int, durable: bool) -> None:
        self.path, self.number, self._fd, self._durable = path, number, fd, durable
        self.size = os.fstat(fd).st_size
        os.lseek(fd, self.size, os.SEEK_SET)

    def append(self, parts: Sequence) -> None:
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        try:
            while views:
                n = os.writev(self._fd, views[:1024])        # IOV_MAX
                self.size += n          # counted as it lands: a later failure leaves it right
                while views and n >= len(views[0]):
                    n -= len(views[0])
                    views.pop(0)
                if views and n:
                    views[0] = views[0][n:]
        finally:
            self.size = os.lseek(self._fd, 0, os.SEEK_CUR)

    def sync(self, force: bool = False) -> None:
        if self._durable or force:
            os.fdatasync(self._fd)

    def truncate(self, size: int) -> None:
        os.ftruncate(self._fd, size)
        os.lseek(self._fd, size, os.SEEK_SET)
        self.size = size

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _LocalSegmentReader:
    """Descriptors opened on first use and closed with the session, so a removed segment's
    space returns to the file system as soon as the sessions reading it end."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._fds: dict[int, int] = {}

    def _fd(self, number: int) -> int:
        fd = self._fds.get(number)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.directory, segment_name(number)),
                             os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise CorruptionError("segment file is missing",
                                      segment=segment_name(number)) from None
            self._fds[number] = fd
        return fd

    def read(self, number: int, offset: int, length: int) -> bytes:
        return os.pread(self._fd(number), length, offset)

    def close(self) -> None:
        fds, self._fds = list(self._fds.values()), {}
        for fd in fds:
            os.close(fd)

    def __enter__(self) -> "_LocalSegmentReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class LocalSegments:
    """Segments as files in one directory."""

    def __init__(self, directory: str, durable: bool = True) -> None:
        self.directory = directory
        self.durable = durable

    def path(self, number: int) -> str:
        return os.path.join(self.directory, segment_name(number))

    def list(self) -> list[int]:
        numbers = []
        for name in os.listdir(self.directory):
            stem, dot, ext = name.partition(".")
            if "." + ext == fmt.SEGMENT_SUFFIX and stem.isdigit():
                numbers.append(int(stem))
        return sorted(numbers)

    def size(self, number: int) -> int:
        return os.stat(self.path(number)).st_size

    def open_reader(self) -> _LocalSegmentReader:
        return _LocalSegmentReader(self.directory)

    def read(self, number: int, offset: int, length: int) -> bytes:
        with self.open_reader() as reader:
            return reader.read(number, offset, length)

    def _sync_dir(self) -> None:
        if self.durable:
            self.sync_directory()

    def sync_directory(self) -> None:
        """Makes the directory entries (created and removed segments) durable, whatever the
        durability setting."""
        fsync_directory(self.directory)

    def create(self, number: int) -> _LocalSegmentFile:
        path = self.path(number)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        f = _LocalSegmentFile(path, number, fd, self.durable)
        try:
            f.append([encode_segment_header(number)])
            f.sync()
            self._sync_dir()
        except BaseException:
            f.close()
            os.unlink(path)
            raise
        return f

    def open_append(self, number: int) -> _LocalSegmentFile:
        path = self.path(number)
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        return _LocalSegmentFile(path, number, fd, self.durable)

    def remove(self, number: int) -> None:
        os.unlink(self.path(number))
        self._sync_dir()

    def close(self) -> None:
        pass


# ---- reading records -----------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    segment: int
    offset: int        # of the record header
    rtype: int
    codec: int
    payload: bytes

    @property
    def end(self) -> int:
        return self.offset + fmt.RECORD_HEADER.size + len(self.payload)


def parse_header(data: bytes, name: str, offset: int):
    """Returns (rtype, codec, length, checksum) or None when the bytes are not a record header."""
    if len(data) < fmt.RECORD_HEADER.size:
        return None
    magic, rtype, codec, flags, length, reserved, checksum = fmt.RECORD_HEADER.unpack_from(data)
    if (magic != fmt.RECORD_MAGIC or rtype not in fmt.RECORD_TYPES or codec not in fmt.CODECS
            or flags or reserved):
        return None
    return rtype, codec, length, checksum


def scan(backend: SegmentBackend, number: int, start: int,
         chunk_payloads: bool = True) -> Iterator[Record | tuple[str, int]]:
    """Yields the valid records of one segment from `start`, then ("end", offset) or
    ("torn", offset) where the first invalid or incomplete record begins.

    With chunk_payloads=False, chunk record payloads are still read and checked but not kept.
    """
    name = segment_name(number)
    size = backend.size(number)
    with backend.open_reader() as reader:
        yield from _scan(reader, number, name, size, start, chunk_payloads)


def _scan(reader: SegmentReader, number: int, name: str, size: int, start: int,
          chunk_payloads: bool):
    if start == 0:
        try:
            check_segment_header(reader.read(number, 0, fmt.SEGMENT_HEADER.size), number, name)
        except CorruptionError:
            if size <= fmt.SEGMENT_HEADER.size:     # killed while creating the segment
                yield ("torn", 0)
                return
            raise
        start = fmt.SEGMENT_HEADER.size
    pos = start
    while pos < size:
        head = reader.read(number, pos, fmt.RECORD_HEADER.size)
        parsed = parse_header(head, name, pos)
        if parsed is None:
            yield ("torn", pos)
            return
        rtype, codec, length, checksum = parsed
        end = pos + fmt.RECORD_HEADER.size + length
        if end > size:
            yield ("torn", pos)
            return
        payload = reader.read(number, pos + fmt.RECORD_HEADER.size, length)
        if len(payload) != length or \
                record_checksum(head[:fmt.RECORD_CHECKSUMMED_PREFIX], [payload]) != checksum:
            yield ("torn", pos)
            return
        if rtype == fmt.REC_CHUNK and not chunk_payloads:
            payload = payload[:fmt.CHUNK_PREFIX.size]
        yield Record(number, pos, rtype, codec, payload)
        pos = end
    yield ("end", pos)


def read_chunk_record(reader: SegmentReader, number: int, offset: int, stored_len: int,
                      chunk_id: bytes) -> tuple[int, int, bytes]:
    """Reads and checks the chunk record at (number, offset). Returns (codec, raw length,
    stored data). Raises CorruptionError naming the segment and offset on any mismatch."""
    total = fmt.RECORD_HEADER.size + stored_len

    def damaged(what: str) -> CorruptionError:
        return CorruptionError(what, segment=segment_name(number), offset=offset)

    try:
        data = reader.read(number, offset, total)
    except OSError as exc:
        raise damaged(f"cannot read chunk record: {exc.strerror or exc}") from exc
    parsed = parse_header(data, "", offset)
    if parsed is None or len(data) != total:
        raise damaged("chunk record header is damaged or truncated")
    rtype, codec, length, checksum = parsed
    payload = memoryview(data)[fmt.RECORD_HEADER.size:]
    if rtype != fmt.REC_CHUNK or length != stored_len:
        raise damaged("index points at a record that is not this chunk")
    if record_checksum(data[:fmt.RECORD_CHECKSUMMED_PREFIX], [payload]) != checksum:
        raise damaged("chunk record checksum mismatch")
    got_id, raw_len = fmt.CHUNK_PREFIX.unpack_from(payload)
    if got_id != chunk_id:
        raise damaged("chunk record holds a different chunk id")
    return codec, raw_len, payload[fmt.CHUNK_PREFIX.size:]


# ---- appending records ---------------------------------------------------------------------

class SegmentLog:
    """The writer's side of the log: batched appends, rollover, sync, rollback to a mark.

    After any I/O failure that rollback cannot repair the log is broken and refuses further
    writes (reopen the store; recovery repairs the tail).
    """

    def __init__(self, backend: SegmentBackend, segment_size: int) -> None:
        self.backend = backend
        self.segment_size = segment_size
        self._current: SegmentFile | None = None
        self._pending: list = []
        self._pending_bytes = 0
        self.broken: str | None = None
        self.force_sync = False      # compaction: sync even with durability "none"

    # -- positions
    def open_tail(self) -> None:
        """Continue the last segment, or start segment 1 in an empty log."""
        numbers = self.backend.list()
        try:
            self._current = (self.backend.open_append(numbers[-1]) if numbers
                             else self.backend.create(1))
        except OSError as exc:
            raise _io_error("cannot open the log for appending", exc)

    @property
    def position(self) -> tuple[int, int]:
        """Where the next record will start (after pending bytes are flushed)."""
        assert self._current is not None
        return self._current.number, self._current.size + self._pending_bytes

    # -- writing
    def _check(self) -> None:
        if self.broken:
            raise StoreIOError(f"the log refuses writes after an earlier failure ({self.broken}); "
                               "reopen the store")

    def append(self, rtype: int, codec: int, parts: Sequence) -> tuple[int, int]:
        """Queues one record; returns (segment, offset) where it will start."""
        self._check()
        assert self._current is not None
        length = sum(len(p) for p in parts)
        seg, off = self.position
        if off > fmt.SEGMENT_HEADER.size and off + length > self.segment_size:
            self._roll()
            seg, off = self.position
        header = encode_record_header(rtype, codec, parts)
        self._pending.append(header)
        self._pending.extend(parts)
        self._pending_bytes += fmt.RECORD_HEADER.size + length
        if self._pending_bytes >= (4 << 20) or len(self._pending) >= 1000:
            self.flush()
        return seg, off

    def flush(self) -> None:
        if not self._pending:
            return
        self._check()
        parts, self._pending, self._pending_bytes = self._pending, [], 0
        try:
            self._current.append(parts)
        except OSError as exc:
            raise _io_error(f"cannot write segment {segment_name(self._current.number)}", exc)

    def _roll(self) -> None:
        """Seals the current segment (flush + fsync) and starts the next one."""
        self.flush()
        try:
            self._current.sync(self.force_sync)
            nxt = self.backend.create(self._current.number + 1)
        except OSError as exc:
            raise _io_error("cannot start a new segment", exc)
        self._current.close()
        self._current = nxt

    def seal(self) -> None:
        """Seals the open segment (if it holds records) and starts a new one."""
        self._check()
        if self.position[1] > fmt.SEGMENT_HEADER.size:
            self._roll()

    def sync(self) -> None:
        """Flushes and makes everything appended so far durable."""
        self.flush()
        try:
            self._current.sync(self.force_sync)
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the dirty pages: nothing
            # written since the last good sync can be trusted. Refuse further writes.
            self.broken = f"fsync failed: {exc.strerror or exc}"
            raise _io_error("cannot make the log durable", exc)

    def rollback(self, mark: tuple[int, int]) -> None:
        """Drops everything appended after mark (a former .position). Marks the log broken
        when that fails."""
        self._pending, self._pending_bytes = [], 0
        seg, off = mark
        try:
            while self._current.number > seg:
                number = self._current.number
                self._current.close()
                self.backend.remove(number)
                self._current = self.backend.open_append(number - 1)
            if off > self._current.size:
                # The mark counted bytes that never reached the file: truncating would
                # extend it with zeros. A caller bug; refuse to write on.
                self.broken = f"rollback mark {off} lies past the end of the segment"
                return
            # Always: after a short write the file may hold bytes past the mark.
            self._current.truncate(off)
            self._current.sync()
        except OSError as exc:
            self.broken = f"rollback failed: {exc.strerror or exc}"

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
