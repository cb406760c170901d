"""State sections of the log: the whole checkpoint state at one moment, written into the log so
that the records before it are no longer needed to rebuild the index (docs/design.md, "Segment
files" and "Repair").

A section is, back to back in log order with no other record between them (it is written
under the writer lock):
  STATE_BEGIN       next checkpoint id, every stream's head and last seq, number of checkpoints
  STATE_CHECKPOINT  one per live checkpoint, ascending ids: a commit payload without new-chunk
                    table (the checkpoint as the index holds it: current manifests, tags, seq,
                    parent, depths)
  STATE_END         the number of checkpoint records and an XXH3-64 over the BEGIN payload and
                    every CHECKPOINT payload, in order
Only a complete section counts: an END whose count and checksum match what came since its
BEGIN. A section names no chunk locations: those come from the chunk records themselves.

Compaction appends one (synced) before it removes any segment, so every commit, delete and
tag record of a removed segment is covered by a durable section; the upgrade from format 1
appends one from the trusted format 1 index; repair loads the newest complete one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.engine import records
from snapstore.engine.index import IndexView
from snapstore.engine.wal import Record, SegmentLog
from snapstore.errors import CorruptionError


def append_state_section(log: SegmentLog, view: IndexView,
                         order: int | None = None) -> tuple[tuple, tuple]:
    """Appends a section describing the index state `view` holds. Not synced: the caller
    syncs. Every manifest is checked (checksum and shape) before it goes into the log.
    Returns (the log position of its first record, the position just past its last).

    Format 3 (`order` given, allocated before `view` was taken): the section also names its
    order and, for every log, the position up to which that log's records are applied in
    `view`: those records are covered, later ones (and logs it does not name) are not."""
    ids = view.checkpoint_ids()
    streams = {name: (head, view.stream_seq(name)) for name, head in view.streams().items()}
    digest = xxhash.xxh3_64()
    state = records.StateBegin(view.next_id(), streams, len(ids))
    if order is not None:
        state.order, state.next_order, state.logs = order, view.next_order(), view.logs()
    begin = records.encode_state_begin(state)
    for part in begin:
        digest.update(part)
    first = log.append(fmt.REC_STATE_BEGIN, 0, begin)
    for cid in ids:
        commit = view.checkpoint(cid)
        if commit is None:
            raise CorruptionError(f"the index lists checkpoint {cid} but lacks its record")
        for i, b in enumerate(commit.buffers):
            b.extents = ext.pack(view.extents(commit, i))
        commit.new_chunks = b""
        parts = commit.encode()
        for part in parts:
            digest.update(part)
        log.append(fmt.REC_STATE_CHECKPOINT, 0, parts)
    log.append(fmt.REC_STATE_END, 0, records.encode_state_end(len(ids), digest.intdigest()))
    return first, log.position


@dataclass
class StateSection:
    """A complete section found in the log."""
    next_id: int
    streams: dict                       # {name: (head id, last seq)}
    order: int | None = None            # format 3: its order, next order and covered logs
    next_order: int | None = None
    logs: dict | None = None
    checkpoints: list = field(default_factory=list)   # [(segment, offset, payload length)]
    begin: tuple[int, int] = (0, 0)     # the log position of its BEGIN record
    end: tuple[int, int] = (0, 0)       # the log position just past its END record


class SectionFinder:
    """Fed the valid records of one log in log order (feed), and told of every gap (a damaged
    record, a missing segment: interrupt), keeps the newest complete section (newest: the
    highest order, then the latest in the log; format 3 sections are newer than older ones,
    which all lie in log 0). Feed each log in turn, with an interrupt() between logs."""

    def __init__(self) -> None:
        self.newest: StateSection | None = None
        self.incomplete = 0             # sections begun but never completed
        self._open: StateSection | None = None
        self._digest = None
        self._count = 0

    def interrupt(self) -> None:
        if self._open is not None:
            self.incomplete += 1
        self._open = None

    def feed(self, record: Record) -> None:
        rtype = record.rtype
        if rtype == fmt.REC_STATE_BEGIN:
            self.interrupt()
            try:
                b = records.decode_state_begin(record.payload)
            except CorruptionError:
                self.incomplete += 1
                return
            self._open = StateSection(b.next_id, b.streams, b.order, b.next_order, b.logs,
                                      begin=(record.segment, record.offset))
            self._digest = xxhash.xxh3_64(bytes(record.payload))
            self._count = b.checkpoints
        elif self._open is None:
            return
        elif rtype == fmt.REC_STATE_CHECKPOINT:
            self._open.checkpoints.append((record.segment, record.offset, record.length))
            self._digest.update(record.payload)
        elif rtype == fmt.REC_STATE_END:
            try:
                count, checksum = records.decode_state_end(record.payload)
            except CorruptionError:
                self.interrupt()
                return
            section, self._open = self._open, None
            if count == self._count == len(section.checkpoints) and \
                    checksum == self._digest.intdigest():
                section.end = (record.segment, record.end)
                if self.newest is None or _newer(section, self.newest):
                    self.newest = section
            else:
                self.incomplete += 1
        else:
            self.interrupt()            # any other record: not a section written whole


def _newer(a: StateSection, b: StateSection) -> bool:
    """Whether section a was written after section b."""
    if (a.order is None) != (b.order is None):
        return a.order is not None          # format 3 sections follow every older one
    if a.order is not None and a.order != b.order:
        return a.order > b.order
    return a.begin > b.begin                # one log (format <= 2): later in the log
