"""The write-ahead log: append-only, checksummed records in numbered segments.

Protocol (docs/design.md, "Commit and recovery"): a writer appends chunk records, then one
commit record, then makes them durable (fsync) before it applies them to the index. A record
is valid iff its header magic, type and length are sane and its XXH3-64 checksum matches
(`read_record`, the one validator: scan, recovery, the chunk reader and verify all use it).
Recovery scans past the index's applied position and truncates the log at the first invalid
record of the last segment (a torn tail); an invalid record anywhere else is corruption. The
rebuild (repair.py), which knows no applied position, takes a damaged stretch of a log's last
segment for the torn tail when nothing valid follows it or when it is a writeback hole
(writeback_hole: zeros where the writer's bytes must be); other damage is reported.

This module owns the bytes inside a segment (segment header, record framing); where segments
live is a SegmentBackend's job (snapstore.engine.backends), used only through its contract.
"""
from __future__ import annotations

import contextlib
import errno
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import xxhash

from snapstore.engine import format as fmt
from snapstore.halves import Started, start
from snapstore.engine.backends.base import SegmentBackend, SegmentFile, SegmentReader, segment_name
from snapstore.errors import CorruptionError, DamagedRecord, FormatError, StoreIOError


# ---- logs: each writer appends to a log of its own (format 3) --------------------------------

def log_of(number: int) -> int:
    """The log a segment number belongs to (fmt.LOG_SEGMENTS numbers per log)."""
    return number // fmt.LOG_SEGMENTS


def first_segment(log: int) -> int:
    """The number of log `log`'s first segment (log 0 starts at 1, as format <= 2 did)."""
    return log * fmt.LOG_SEGMENTS + 1


def segments_of(numbers, log: int) -> list[int]:
    """The numbers of log `log`'s segments among `numbers`, ascending."""
    return sorted(n for n in numbers if log_of(n) == log)


def logs_of(numbers) -> dict[int, list[int]]:
    """{log: its segment numbers ascending} of the segment numbers given."""
    out: dict[int, list[int]] = {}
    for n in sorted(numbers):
        out.setdefault(log_of(n), []).append(n)
    return out


# ---- segment header ------------------------------------------------------------------------

def encode_segment_header(number: int, version: int = fmt.SEGMENT_VERSION) -> bytes:
    head = fmt.SEGMENT_HEADER.pack(fmt.SEGMENT_MAGIC, version, 0, number, 0)[:24]
    return head + fmt.U64.pack(xxhash.xxh3_64_intdigest(head))


class MisplacedSegment(CorruptionError):
    """A valid segment header that names another segment: the file is not this segment (a
    copy, a symlink to another store's segment). None of its records belong here."""


def check_segment_header(data: bytes, number: int) -> int:
    """The header version of segment `number` whose header is `data`. Raises CorruptionError
    unless data is a valid header of that segment, FormatError when the segment has a newer
    version than this library reads (fmt.SEGMENT_RECORD_TYPES)."""
    name = segment_name(number)
    if len(data) < fmt.SEGMENT_HEADER.size:
        raise CorruptionError("segment header is truncated", segment=name, offset=0)
    magic, version, _, got_number, checksum = fmt.SEGMENT_HEADER.unpack_from(data)
    if magic != fmt.SEGMENT_MAGIC or xxhash.xxh3_64_intdigest(data[:24]) != checksum:
        raise CorruptionError("segment header is damaged", segment=name, offset=0)
    if version > fmt.SEGMENT_VERSION:
        raise FormatError(f"segment {name} has format version {version}; this snapstore "
                          f"reads up to {fmt.SEGMENT_VERSION}: upgrade snapstore")
    if version not in fmt.SEGMENT_RECORD_TYPES:
        raise CorruptionError(f"segment header names unknown version {version}", segment=name,
                              offset=0)
    if got_number != number:
        raise MisplacedSegment(f"segment header names segment {got_number}", segment=name,
                               offset=0)
    return version


def segment_version(reader: SegmentReader, number: int) -> int:
    """Reads and checks the header of segment `number` (check_segment_header): its version."""
    return check_segment_header(reader.read(number, 0, fmt.SEGMENT_HEADER.size), number)


# ---- records: encoding ---------------------------------------------------------------------

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


# ---- records: reading and validating -------------------------------------------------------

def parse_record_header(data) -> tuple[int, int, int, int] | None:
    """(type, codec, payload length, checksum) of the header at the start of data, or None
    when those bytes are not a record header (too short, wrong magic, unknown type or codec,
    non-zero flags or reserved field). (A plain tuple: this is on every chunk read's path.)"""
    if len(data) < fmt.RECORD_HEADER.size:
        return None
    magic, rtype, codec, flags, length, reserved, checksum = fmt.RECORD_HEADER.unpack_from(data)
    if (magic != fmt.RECORD_MAGIC or rtype not in fmt.RECORD_TYPES or codec not in fmt.CODECS
            or flags or reserved):
        return None
    return rtype, codec, length, checksum


def damaged_record(reason: str, number: int, offset: int,
                   end: int | None = None) -> DamagedRecord:
    """errors.DamagedRecord naming segment `number`."""
    return DamagedRecord(reason, segment=segment_name(number), offset=offset, end=end)


@dataclass(slots=True)
class Record:
    """One valid record (treat as immutable; not frozen only because a frozen dataclass costs
    microseconds to build, and this is on every chunk read's path)."""
    segment: int
    offset: int        # of the record header
    rtype: int
    codec: int
    length: int        # of the payload in the segment (payload may hold only its prefix)
    payload: bytes | memoryview

    @property
    def end(self) -> int:
        return self.offset + fmt.RECORD_HEADER.size + self.length


def read_record(reader: SegmentReader, number: int, offset: int, *, size: int | None = None,
                length: int | None = None) -> Record:
    """Reads the record at (number, offset) and validates it: header fields, length bounds,
    checksum. `size`: the segment's size, past which no record may run. `length`: the payload
    length the caller expects (the index knows it): header and payload are then read with one
    read, and a header that says otherwise is invalid.

    Raises DamagedRecord (a CorruptionError naming segment and offset) for an invalid or
    incomplete record; the reader's own errors (OSError, missing segment) pass through."""
    hsize = fmt.RECORD_HEADER.size
    if length is None:
        head = reader.read(number, offset, hsize)
        header = parse_record_header(head)
        if header is None:
            raise damaged_record("record header is damaged", number, offset)
        rtype, codec, got_length, checksum = header
        end = offset + hsize + got_length
        if size is not None and end > size:
            raise damaged_record("record runs past the end of the segment", number, offset, end)
        payload = reader.read(number, offset + hsize, got_length)
    else:
        data = reader.read(number, offset, hsize + length)
        head = data[:hsize]
        header = parse_record_header(head)
        if header is None:
            raise damaged_record("record header is damaged", number, offset)
        rtype, codec, got_length, checksum = header
        end = offset + hsize + got_length
        if got_length != length:
            raise damaged_record(f"record holds {got_length} payload bytes, not the {length} "
                                "expected", number, offset, end)
        payload = memoryview(data)[hsize:]
    if len(payload) != got_length:
        raise damaged_record("record is truncated", number, offset, end)
    if record_checksum(head[:fmt.RECORD_CHECKSUMMED_PREFIX], [payload]) != checksum:
        raise damaged_record("record checksum mismatch", number, offset, end)
    return Record(number, offset, rtype, codec, got_length, payload)


RESYNC_WINDOW = 1 << 20
WRITEBACK_BYTES = 1 << 20     # a durable log's flushes of this many bytes start their writeback
# append() writes (behind) once this many bytes are queued: over a staging area (the largest
# chunk), so a checkpoint writes each batch in one write started when the batch is done
# (writer.store_buffer), not half of it while the main thread then waits for that half
PENDING_BYTES = 2 * fmt.MAX_CHUNK_BYTES


def _valid_at(reader: SegmentReader, n: int, pos: int, size: int, types) -> bool:
    try:
        return read_record(reader, n, pos, size=size).rtype in types
    except DamagedRecord:
        return False


def next_valid_record(reader: SegmentReader, n: int, hint: int | None, start: int, size: int,
                types) -> int | None:
    """Where the next valid record after a damaged one starts: where the damaged record's
    header says it ends if a valid record is there, else the first offset from `start` at
    which one is (found by its magic), else None."""
    if hint is not None and start <= hint < size and _valid_at(reader, n, hint, size, types):
        return hint
    pos = start
    magic = fmt.RECORD_MAGIC
    while pos < size:
        window = reader.read(n, pos, RESYNC_WINDOW + len(magic) - 1)
        if not window:
            return None
        at = window.find(magic)
        while at != -1:
            if _valid_at(reader, n, pos + at, size, types):
                return pos + at
            at = window.find(magic, at + 1)
        pos += RESYNC_WINDOW
    return None


# ---- writeback holes: zeros where the writer's bytes must be (docs/design.md, "Repair") ---

SECTOR = 512            # the smallest unit a disk writes: a torn page write loses whole ones
HOLE_PAGE = 4096        # a page of the page cache: writeback writes whole ones, in any order


def _zero(data) -> bool:
    return not any(data)


def zeroed_header(reader: SegmentReader, n: int, at: int, size: int) -> bool:
    """Whether the record header that belongs at (n, at) reads as zeros: from its start, or
    from a sector boundary inside it, to its end (or the segment's end). A writer never
    writes that (the magic, the checksum); bytes a power cut kept from the disk read so."""
    end = min(at + fmt.RECORD_HEADER.size, size)
    if end <= at:
        return False
    head = reader.read(n, at, end - at)
    if len(head) != end - at:
        return False
    if _zero(head):
        return True
    k = -(-at // SECTOR) * SECTOR           # the first sector boundary at or after `at`
    return at < k < end and _zero(head[k - at:])


def _zeroed_page_in(reader: SegmentReader, n: int, start: int, end: int) -> bool:
    """Whether a whole HOLE_PAGE-aligned page of the file inside [start, end) reads as zeros."""
    page = -(-start // HOLE_PAGE) * HOLE_PAGE
    while page + HOLE_PAGE <= end:
        if _zero(reader.read(n, page, HOLE_PAGE)):
            return True
        page += HOLE_PAGE
    return False


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _coded(reader: SegmentReader, n: int, body: int, codec: int) -> bool:
    """Whether the payload at (n, body) of a chunk record of `codec` begins as that codec's
    stored bytes do (a zstd frame's magic; a plane table's item size; a delta header's depth
    and then its plane table): a flipped codec byte on a raw record is not taken for coded
    bytes, whose zeros would then look like a hole."""
    at = body + fmt.CHUNK_PREFIX.size
    if codec == fmt.CODEC_ZSTD:
        return reader.read(n, at, len(_ZSTD_MAGIC)) == _ZSTD_MAGIC
    if codec == fmt.CODEC_DELTA_PLANES:
        head = reader.read(n, at, fmt.DELTA_HEADER.size)
        if len(head) != fmt.DELTA_HEADER.size or head[-1] == 0:
            return False
        at += fmt.DELTA_HEADER.size
    if codec in (fmt.CODEC_PLANES, fmt.CODEC_DELTA_PLANES):
        head = reader.read(n, at, 1)
        return len(head) == 1 and head[0] in fmt.PLANES_ITEMSIZES
    return False


def writeback_hole(reader: SegmentReader, n: int, pos: int, nxt: int | None,
                   size: int) -> bool:
    """Whether the invalid stretch of segment n from pos (its first invalid record) up to nxt
    (the next valid record; None: the segment's end) shows a writeback hole -- bytes a power
    cut kept from the disk, read as zeros -- rather than media damage (a flipped bit leaves
    the bytes, and so a record's magic and framing, in place). It walks the stretch record by
    record as the headers frame it: a hole when a header reads as zeros (zeroed_header), or
    when a whole aligned page inside the payload of a chunk record not stored raw (and whose
    payload begins as its codec's does: _coded) reads as zeros (zstd leaves no run of zeros
    that long in what it emits -- a block keeps its raw bytes only when coding saves less
    than 1/64 of it, and a 4 KiB run of zeros saves more -- nor do byte planes, each the
    smaller of its zstd frame and its raw bytes; a raw payload may hold zero pages as its
    bytes: a flip in it stays damage). A header that is neither valid framing nor zeros is
    damage. Only a log's last segment can hold a hole (a segment is synced before the log
    moves on), past what was acknowledged: the caller decides where it applies."""
    end = size if nxt is None else min(nxt, size)
    at = pos
    while at < end:
        if zeroed_header(reader, n, at, size):
            return True
        header = parse_record_header(reader.read(n, at, fmt.RECORD_HEADER.size))
        if header is None:
            return False
        _, codec, length, _ = header
        body, stop = at + fmt.RECORD_HEADER.size, at + fmt.RECORD_HEADER.size + length
        if codec != fmt.CODEC_RAW and _coded(reader, n, body, codec) and \
                _zeroed_page_in(reader, n, body, min(stop, end)):
            return True
        at = stop
    return False


def zeroed_segment_header(reader: SegmentReader, n: int) -> bool:
    """Whether segment n's header reads as zeros: the page holding it never reached the disk
    (a segment's header is written when it is created, and synced then only by a durable log),
    so no sync of the segment ever completed and nothing in it was acknowledged."""
    head = reader.read(n, 0, fmt.SEGMENT_HEADER.size)
    return len(head) == fmt.SEGMENT_HEADER.size and _zero(head)


def scan(backend: SegmentBackend, number: int, start: int,
         chunk_payloads: bool = True) -> Iterator[Record | tuple[str, int]]:
    """Yields the valid records of one segment from `start`, then ("end", offset) or
    ("torn", offset) where the first invalid or incomplete record begins. A record of a type
    the segment's header version does not hold is invalid. Raises FormatError for a segment
    of a newer version, CorruptionError for a damaged header (from start 0: unless the
    segment holds no more than a header, which is "torn" at 0).

    With chunk_payloads=False, chunk record payloads are still read and checked but only
    their prefix (chunk id, raw length) is kept.
    """
    size = backend.size(number)
    with backend.open_reader() as reader:
        yield from _scan(reader, number, size, start, chunk_payloads)


def _scan(reader: SegmentReader, number: int, size: int, start: int, chunk_payloads: bool):
    try:
        types = fmt.SEGMENT_RECORD_TYPES[segment_version(reader, number)]
    except CorruptionError:
        if start == 0:
            if size <= fmt.SEGMENT_HEADER.size or zeroed_segment_header(reader, number):
                # killed while creating the segment; or, in a log's last segment (the
                # caller's judgement), a header a power cut kept from the disk: no sync of
                # the segment completed, so none of it was acknowledged
                yield ("torn", 0)
                return
            raise
        types = fmt.RECORD_TYPES        # resuming after the header: it was read before
    pos = max(start, fmt.SEGMENT_HEADER.size)
    while pos < size:
        try:
            record = read_record(reader, number, pos, size=size)
        except DamagedRecord:
            yield ("torn", pos)
            return
        if record.rtype not in types:
            yield ("torn", pos)
            return
        if record.rtype == fmt.REC_CHUNK and not chunk_payloads:
            record = Record(record.segment, record.offset, record.rtype, record.codec,
                            record.length, record.payload[:fmt.CHUNK_PREFIX.size])
        yield record
        pos = record.end
    yield ("end", pos)


def _io_error(what: str, exc: OSError) -> StoreIOError:
    reason = ("disk full" if exc.errno in (errno.ENOSPC, errno.EDQUOT)
              else (exc.strerror or str(exc)))
    return StoreIOError(f"{what}: {reason}", exc.errno)


# ---- appending records ---------------------------------------------------------------------

class SegmentLog:
    """A writer's side of its log (number `log`: segments log * LOG_SEGMENTS + 1, + 2, ...;
    no other writer appends to it): batched appends, rollover, sync, rollback to a mark.

    Durability policy (the backend only syncs when asked): when the log is `durable` a new
    segment's header and directory entry are synced as it is created, a segment is synced
    before the next one starts (sealing it), and a rollback's cut and every removal are
    synced. sync() always syncs: the open segment, and the segments directory too unless
    every create and remove so far was synced (callers ask for it when they need it: the
    Store after a commit with durability "fsync", compaction always).

    Errors: OSError from the backend becomes StoreIOError here. After any I/O failure that
    rollback cannot repair the log is broken and refuses further writes (reopen the store;
    recovery repairs the tail).
    """

    def __init__(self, backend: SegmentBackend, segment_size: int, log: int = 0,
                 version: int = fmt.SEGMENT_VERSION) -> None:
        self.backend = backend
        self.segment_size = segment_size
        self.log = log
        # the header version of the segments it creates (S3 stores: an older one, which the
        # records they write fit, so that older snapstores share their buckets)
        self.version = version
        self._current: SegmentFile | None = None
        self._pending: list = []
        self._pending_bytes = 0
        self._writing: Started | None = None    # the write behind, at most one at a time
        self._written_end = 0                   # where the segment ends once it is done
        self._unwritten: str | None = None      # a write behind failed: roll back first
        self._forced_durable = False
        # whether a create or remove may not be durable yet: unknown for what earlier
        # sessions did, so the first sync() also syncs the directory
        self._directory_unsynced = True
        self.broken: str | None = None
        # () -> the log position the index has applied (None: unknown): a rollback never
        # cuts below it, whatever its caller's mark (set by the committer, see rollback())
        self.published: Callable[[], tuple[int, int] | None] | None = None

    @property
    def durable(self) -> bool:
        """Whether the log syncs as it goes: the store's durability, or forced_durable()."""
        return self.backend.durable or self._forced_durable

    @contextlib.contextmanager
    def forced_durable(self) -> Iterator[None]:
        """Within it the log is durable whatever the store's durability (compaction: copies
        must be on disk before the segment they were copied from is removed)."""
        saved, self._forced_durable = self._forced_durable, True
        try:
            yield
        finally:
            self._forced_durable = saved

    @contextlib.contextmanager
    def durable_append(self) -> Iterator[None]:
        """Appends made within it are durable when it ends, whatever the store's durability
        (forced_durable, then sync); if anything in it fails, they are rolled back out of the
        log and the error propagates. Compaction's new records use it before the index
        switches to them."""
        mark = self.position
        try:
            with self.forced_durable():
                yield
                self.sync()
        except BaseException:
            self.rollback(mark)
            raise

    # -- positions
    def open_tail(self) -> None:
        """Continue the log's last segment, or start its first in an empty log. A segment only
        holds records of its header's version: when the last one has another version (an older
        store's) or a damaged header, the log starts the next segment instead. Raises
        FormatError when the last segment is of a newer version."""
        try:
            numbers = segments_of(self.backend.list(), self.log)
            if not numbers:
                self._current = self._create(first_segment(self.log))
                return
            last = numbers[-1]
            try:
                with self.backend.open_reader() as reader:
                    same = segment_version(reader, last) == self.version
            except CorruptionError:
                same = False
            self._current = (self.backend.open_append(last) if same
                             else self._create(last + 1))
        except OSError as exc:
            raise _io_error("cannot open the log for appending", exc)

    @property
    def position(self) -> tuple[int, int]:
        """Where the next record will start (after pending bytes are flushed). It counts the
        bytes queued and in flight: a rollback mark taken while records are queued may lie
        past what the segment will hold if their write fails (use mark())."""
        if self._current is None:
            self._check()       # a rollback that failed part-way left no open segment
        assert self._current is not None
        return self._current.number, self._end() + self._pending_bytes

    def mark(self) -> tuple[int, int]:
        """A rollback mark for records appended from now on: first writes what is queued and
        waits for the write behind (raising its StoreIOError, as flush() does), so the mark
        is an end the segment file reaches. A mark taken at `position` with records still
        queued lies past the end once their write fails, and rollback() to it cannot repair
        the log (it breaks it): an operation that takes a second mark after appending (the
        commit path's publish) takes it here."""
        self.flush()
        return self.position

    def _end(self) -> int:
        """The open segment's size once the write behind (if any) is done."""
        return self._written_end if self._writing is not None else self._current.size

    # -- segments
    def _create(self, number: int) -> SegmentFile:
        """Creates segment `number` and writes its header (synced with the directory entry
        when durable). On failure nothing of it is left. Raises OSError."""
        f = self.backend.create(number)
        try:
            f.append([encode_segment_header(number, self.version)])
            if self.durable:
                f.sync()
                self.backend.sync_directory()
            else:
                self._directory_unsynced = True
        except BaseException:
            f.close()
            self.backend.remove(number)
            raise
        return f

    def remove(self, number: int) -> None:
        """Removes a segment the log no longer appends to (durably when durable). Raises
        OSError."""
        self.backend.remove(number)
        if self.durable:
            self.backend.sync_directory()
        else:
            self._directory_unsynced = True

    # -- writing
    def check_writable(self) -> None:
        """Raises StoreIOError when the log refuses writes (an earlier failure it could not
        repair; reopen the store)."""
        self._check()

    def _check(self) -> None:
        if self.broken:
            raise StoreIOError(f"the log refuses writes after an earlier failure ({self.broken}); "
                               "reopen the store")
        if self._unwritten:
            raise StoreIOError(f"the log refuses writes until it is rolled back after a failed "
                               f"write ({self._unwritten})")

    def append(self, rtype: int, codec: int, parts: Sequence) -> tuple[int, int]:
        """Queues one record; returns (segment, offset) where it will start."""
        self._check()
        pieces = [encode_record_header(rtype, codec, parts), *parts]
        return self._queue([(pieces, sum(len(p) for p in pieces))])[0]

    def append_records(self, records: Sequence[tuple[list, int]]) -> list[tuple[int, int]]:
        """Queues records made whole elsewhere, their headers and checksums included (the C
        core's snap_write_chunks and snap_raw_record_heads), each given as (its pieces, header
        first; its size in bytes); returns (segment, offset) where each will start. One call
        per batch: the checkpoint's hot path."""
        self._check()
        return self._queue(records)

    def _queue(self, records: Sequence[tuple[list, int]]) -> list[tuple[int, int]]:
        """Queues records (pieces, size), each in a new segment when the current one has
        records and its payload would end beyond segment_size; writes behind every
        PENDING_BYTES (or 1000 pieces) queued."""
        assert self._current is not None
        where = []
        seg, off = self.position
        for pieces, size in records:
            if off > fmt.SEGMENT_HEADER.size and off + size - fmt.RECORD_HEADER.size > \
                    self.segment_size:
                self._roll()
                seg, off = self.position
            where.append((seg, off))
            self._pending.extend(pieces)
            self._pending_bytes += size
            off += size
            if self._pending_bytes >= PENDING_BYTES or len(self._pending) >= 1000:
                self.flush(wait=False)          # the position stays: the bytes are counted
        return where

    def flush(self, wait: bool = True) -> None:
        """Writes the queued records. wait=False: the write goes on behind, on a thread of its
        own, while the caller prepares the next records (a write-behind, at most one at a
        time: this waits for the previous one first); wait=True (what everyone but the hot
        path of appends uses): the records are in the segment file when it returns. Either
        way the parts handed to append() may be reused once the next flush() returns. A
        failed write raises StoreIOError from the flush that waits for it (or any later call
        that does: sync, seal, rollback drops it)."""
        self._check()
        self._wait_written()
        if self._pending:
            parts, self._pending, self._pending_bytes = self._pending, [], 0
            current, start_at = self._current, self._current.size
            if wait:
                self._write(current, parts, start_at)
            else:
                self._written_end = start_at + sum(len(p) for p in parts)
                self._writing = start(lambda: self._write(current, parts, start_at))

    def _wait_written(self) -> None:
        """Waits for the write behind. When it failed, the records queued since are dropped
        (their offsets counted on its bytes) and the log refuses writes until a rollback
        cuts the segment back to a mark; the failure raises here."""
        writing, self._writing = self._writing, None
        if writing is not None:
            try:
                writing.wait()
            except StoreIOError as exc:
                self._pending, self._pending_bytes = [], 0
                self._unwritten = str(exc)
                raise

    def _write(self, current: SegmentFile, parts: list, start_at: int) -> None:
        try:
            current.append(parts)
        except OSError as exc:
            raise _io_error(f"cannot write segment {segment_name(current.number)}", exc)
        if self.durable and current.size - start_at >= WRITEBACK_BYTES:
            # the device starts on these bytes while the caller prepares the next ones: the
            # sync that makes them durable then finds most of them written already
            current.start_writeback(start_at, current.size - start_at)

    def _roll(self) -> None:
        """Seals the current segment (flush and sync, whatever the durability) and starts the
        next. A sealed segment is always whole on disk, so a power cut takes at most the
        tail of a log's last segment (a torn tail), never the end of a sealed one, which
        recovery refuses as damage: one fdatasync per segment, also with durability
        "none"."""
        self.flush()
        if log_of(self._current.number + 1) != self.log:
            raise StoreIOError(f"log {self.log} has no segment numbers left")
        try:
            self._current.sync()
            nxt = self._create(self._current.number + 1)
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
        """Flushes and makes everything appended so far durable (always), with the directory
        entries of the segments holding it."""
        self._check()
        self.flush()
        try:
            self._current.sync()
            if self._directory_unsynced:
                self.backend.sync_directory()
                self._directory_unsynced = False
        except OSError as exc:
            # After a failed fsync the kernel may have dropped the dirty pages: nothing
            # written since the last good sync can be trusted. Refuse further writes.
            self.broken = f"fsync failed: {exc.strerror or exc}"
            raise _io_error("cannot make the log durable", exc)

    def rollback(self, mark: tuple[int, int]) -> bool:
        """Drops everything appended after mark (a former .position), but never what the
        index has published (self.published: a KeyboardInterrupt can land after the index
        transaction committed and before its caller knew, whose handler then rolled back
        records a visible checkpoint needs). Returns whether it did; marks the log broken
        when that fails (then what was appended may still be there)."""
        if self.published is not None:
            try:
                applied = self.published()
            except Exception:           # noqa: BLE001 - unknown: the caller's mark stands
                applied = None
            if applied is not None and tuple(applied) > tuple(mark):
                mark = tuple(applied)
        self._pending, self._pending_bytes = [], 0
        try:
            self._wait_written()
        except StoreIOError:
            pass                # cut off below with the rest
        if self._current is None:
            return False        # an earlier rollback failed part-way: only recovery repairs
        seg, off = mark
        try:
            while self._current.number > seg:
                current, self._current = self._current, None
                current.close()
                self.remove(current.number)
                self._current = self.backend.open_append(current.number - 1)
            if off > self._current.size:
                # The mark counted bytes that never reached the file: truncating would
                # extend it with zeros. A caller bug; refuse to write on.
                self.broken = f"rollback mark {off} lies past the end of the segment"
                return False
            # Always: after a short write the file may hold bytes past the mark.
            self._current.truncate(off)
            if self.durable:
                self._current.sync()
        except OSError as exc:
            self.broken = f"rollback failed: {exc.strerror or exc}"
            return False
        self._unwritten = None
        return True

    def close(self) -> None:
        if self._writing is not None:
            self._writing.finish()
            self._writing = None
        if self._current is not None:
            self._current.close()
            self._current = None
