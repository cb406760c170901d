"""Upgrading a store written by an older format, when a writer opens it (docs/design.md,
"Store directory").

STEPS is an ordered list. Each step converts one part of the store to the format that
introduced it, and each is
  * idempotent: it finds out from the store itself whether its work is done (never from the
    FORMAT file) and then does nothing, so every writer open can run every step;
  * crash-safe: it commits atomically (one LMDB transaction, a rename), or its partial work is
    harmless and redone by the next run;
  * readable half-way: after it, readers of the old and the new library version still read
    the store (a reader copes with a store whose FORMAT file is older than its parts).
After the last step the index is forced to disk and only then the FORMAT file is published
with this library's version (temp file, fsync, rename, directory fsync). So a crash at any
point leaves a store whose FORMAT still names the old version, which opens, and whose next
writer open runs the steps again. A new format version appends its step(s) to STEPS.

Crash points (crashpoints.py): upgrade_before_index_commit (inside the index step's
transaction), upgrade_v3_before_index_commit (inside format 3's),
upgrade_v5_before_index_commit (inside format 5's), upgrade_v6_before_index_commit (inside
format 6's), upgrade_before_state_mark (the log step's
state section durable, the index not yet told), upgrade_before_format (everything converted
and synced, FORMAT not yet published), upgrade_after_format.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from snapstore.engine import format as fmt
from snapstore.engine import storedir
from snapstore.engine.backends.base import SegmentBackend
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.index import Index
from snapstore.engine.logstate import append_state_section
from snapstore.engine.recovery import recover
from snapstore.engine.wal import SegmentLog, segment_version
from snapstore.errors import CorruptionError


@dataclass(frozen=True)
class Step:
    version: int                           # the format version that introduced the change
    what: str
    # (store path, open index, segment backend) -> did it change anything
    run: Callable[[str, Index, SegmentBackend], bool]


def _index_value_checksums(path: str, index: Index, backend: SegmentBackend) -> bool:
    return index.add_value_checksums()


def _log_state_section(path: str, index: Index, backend: SegmentBackend) -> bool:
    """Format 2's log is complete: a format 1 store's compactions removed segments together
    with the commit, delete and tag records in them, so its log alone may not describe its
    checkpoints (repair could not rebuild them). This step appends a state section
    (logstate.py) written from the trusted format 1 index, after recovery applied every
    durable record to it, in a new segment (of today's version, fmt.SEGMENT_VERSION: its BEGIN
    names no order, the index counts none yet); synced, then noted in the index
    (META_LOG_STATE). Done when the index notes a state section, is of format 3 or later, or
    when the first segment is of version 2 (a store created by format 2 has a complete log).
    A crash before the note only writes another section next time."""
    with index.read() as r:
        # a format 3 or later index came after this step (steps run in order), or from a
        # store made with a complete log; only a format 1 or 2 index needs the segment's
        # word (a damaged first segment header then means "cannot tell": a section). Asked
        # of a later store with that header damaged, a section of format 2's kind (no
        # orders, log 0 only) was appended, and a later repair replayed the other logs'
        # records over it: deleted checkpoints and removed tags came back
        if r.log_state() is not None or r.version >= 3:
            return False
    numbers = backend.list()
    if not numbers:
        return False
    try:
        with backend.open_reader() as reader:
            if segment_version(reader, numbers[0]) >= 2:
                return False
    except CorruptionError:
        pass                        # cannot tell: a section does no harm
    recover(index, backend, backend.durable)
    log = SegmentLog(backend, fmt.DEFAULT_SEGMENT_SIZE)
    try:
        log.open_tail()             # the last segment is of version 1: starts a new one
        mark = log.position
        try:
            with log.forced_durable(), index.read() as r:
                where = append_state_section(log, r)
                log.sync()
        except BaseException:
            log.rollback(mark)
            raise
    finally:
        log.close()
    crashpoint("upgrade_before_state_mark")
    with index.write() as w:
        w.set_log_state(*where)
    return True


def _per_log_positions(path: str, index: Index, backend: SegmentBackend) -> bool:
    """Format 3 (many writers): the index keeps an applied position per log (DB_LOGS) instead
    of one (META_APPLIED), and counts record orders (META_NEXT_ORDER). The store's segments so
    far are log 0's. Recovery applies log 0's durable records first, so the position moved
    is the end of every record; then one transaction moves it, starts the order count and
    sets META_FORMAT to 3: all or nothing (crash point upgrade_v3_before_index_commit).
    Done when the index is format 3."""
    with index.read() as r:
        if r.version >= 3:
            return False
    recover(index, backend, backend.durable)
    with index.write() as w:
        applied = w.applied()
        if applied is not None:
            w.set_log_applied(0, applied)
        w.drop_legacy_applied()
        w.set_next_order(1)
        w.set_format(3)
        crashpoint("upgrade_v3_before_index_commit")
    index.version = 3
    return True


def _codec_planes(path: str, index: Index, backend: SegmentBackend) -> bool:
    """Format 4 (CODEC_PLANES chunk records, only in segments of header version 4): no record
    and no index value changes. The log goes on in a new segment of version 4 (the writer's
    SegmentLog.open_tail: a segment only holds records of its header's version); the index
    only says format 4 (one transaction). Done when the index is format 4."""
    return _only_the_version(index, 4)


def _only_the_version(index: Index, version: int, point: str | None = None) -> bool:
    """The step of a format that changes no record and no index value: the index says
    `version` (one transaction, crash point `point` inside it, after which nothing is
    committed). Done (False) when the index is of `version` or later."""
    with index.read() as r:
        if r.version >= version:
            return False
    with index.write() as w:
        w.set_format(version)
        if point is not None:
            crashpoint(point)
    index.version = version
    return True


def _delta_chunks(path: str, index: Index, backend: SegmentBackend) -> bool:
    """Format 5 (CODEC_DELTA_PLANES chunk records, only in segments of header version 5; a
    commit record's DELTA_BASE table; a delta chunk's index entry names its base, whose
    reference count counts that edge): a format 4 store has no delta chunk, so no record and
    no index value changes (every chunk entry keeps its CHUNK_ENTRY layout, every count only
    extents). The log goes on in a new segment of version 5 (the writer's
    SegmentLog.open_tail); the index only says format 5 (one transaction: crash point
    upgrade_v5_before_index_commit, after which nothing is committed). Done when the index is
    format 5."""
    return _only_the_version(index, 5, "upgrade_v5_before_index_commit")


def _plane_rotations(path: str, index: Index, backend: SegmentBackend) -> bool:
    """Format 6 (a CODEC_PLANES record's flags are a rotation of 0..7 bits, written as 3 for
    float32 and bfloat16 weights from compression_level 3, only in segments of header version
    6): a format 5 store's
    records all rotate by 0 or 1 bit, which format 6 reads as before, so no record and no
    index value changes. The log goes on in a new segment of version 6 (the writer's
    SegmentLog.open_tail); the index only says format 6 (one transaction: crash point
    upgrade_v6_before_index_commit, after which nothing is committed). Done when the index is
    format 6."""
    return _only_the_version(index, 6, "upgrade_v6_before_index_commit")


STEPS: tuple[Step, ...] = (
    Step(2, "every index value carries a checksum", _index_value_checksums),
    Step(2, "the log describes every checkpoint (a state section)", _log_state_section),
    Step(3, "an applied position per log; record orders", _per_log_positions),
    Step(4, "chunk records may be byte planes (new segments only)", _codec_planes),
    Step(5, "chunk records may be deltas against a base chunk (new segments only)",
         _delta_chunks),
    Step(6, "byte-plane chunk records may rotate their items by 3 bits (new segments only)",
         _plane_rotations),
)


def upgrade(path: str, index: Index, backend: SegmentBackend) -> int:
    """Brings the store at `path` (the store lock held exclusively, `index` open for writing, its
    segments in `backend`) to fmt.FORMAT_VERSION. Returns the version the FORMAT file named
    before."""
    found = storedir.read_format_file(path)
    changed = False
    for step in STEPS:
        changed |= step.run(path, index, backend)
    if changed:
        index.sync()                        # the converted index is durable before FORMAT says so
    if found["version"] >= fmt.FORMAT_VERSION:
        return found["version"]
    crashpoint("upgrade_before_format")
    created = found.get("created")
    storedir.publish_format(path, found["file_mode"],
                            created if isinstance(created, (int, float)) else None)
    crashpoint("upgrade_after_format")
    return found["version"]
