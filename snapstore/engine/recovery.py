"""Recovery of logs whose writers are gone (docs/design.md, "Commit and recovery protocol",
"Many writers"): apply the durable records they hold past their applied positions, cut their
torn tails, drop their claims.

Each writer appends to a log of its own (logowners.py) and claims every index record in the
index before the record reaches its log (claims.py), so every durable index record won when it
was written. When writers die, any writer that takes their logs' free locks recovers those
logs, together, holding the locks:

  * scan each log from its applied position; the first invalid or incomplete record ends the
    scan: in the log's last segment it is a torn tail and the segment is truncated there (a
    segment killed while being created is removed, and so is one whose header reads as zeros:
    no sync of it ever completed); in an earlier segment it is corruption (CorruptionError,
    nothing is cut). Only what lies past the applied position is judged, so a writeback hole
    there (zeros a power cut left in an unsynced tail, valid records after it) is cut with
    what follows it, as the rebuild judges it (repair.py, wal.writeback_hole);
  * a batch of records sharing one order (a delete_many) that is not all there never
    completed: the log is cut at its first record (a writer appends a batch whole, then
    syncs); a batch may span a segment rollover, and then the log's segments after the one
    holding its first record are removed (a torn rest of the batch is all they hold), as
    the writer's own rollback would;
  * the valid commit, delete and tag records found are applied in their order across all the
    logs (format <= 2 records of log 0 first, in log order), one order per transaction, which
    also drops the order's claim and moves the log's applied position. The index may lack
    their claims: after a power loss LMDB may have undone its last transactions (it runs
    without metasync), claims included, while the records they admitted are durable. They
    won when they were written, so they are applied, and next_order/next_id move past them;
  * with durability "fsync" the segments holding those records are synced first (their
    writer may have died before its sync: the page cache held them);
  * chunk records are left: the chunks of an applied record are indexed by it, others are
    garbage for compaction; state sections are passed over (the index holds what they say);
  * finally every claim these logs still hold (operations that never reached their log) is
    dropped, with the groups it opened (their staged parts become garbage).

Only the given logs are touched: a crashed writer's torn tail is cut in its own log.
Recovered checkpoints have no page fingerprints: their stream's next checkpoint is full
(deduplicated against it).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from snapstore.engine import claims as claim_rules
from snapstore.engine import format as fmt
from snapstore.engine import records
from snapstore.engine.backends.base import SegmentBackend, segment_name
from snapstore.engine.index import Index
from snapstore.engine.wal import scan, segments_of
from snapstore.errors import CorruptionError


@dataclass
class Recovered:
    """What recover_logs did."""
    logs: list
    applied: int = 0            # operations (orders) applied, format <= 2 records included
    dropped_claims: int = 0     # claims that never reached their log
    cut_at: dict = field(default_factory=dict)   # {log: where it was truncated}


@dataclass
class _Item:
    segment: int
    offset: int
    end: int
    rtype: int
    payload: bytes
    order: int | None
    count: int


def recover(index: Index, backend: SegmentBackend, durable: bool) -> None:
    """Recovers log 0 (the one log of a format <= 2 store: the upgrade runs it before the
    index has per-log positions)."""
    recover_logs(index, backend, [0], durable)


def recover_log(index: Index, backend: SegmentBackend, log: int, durable: bool) -> Recovered:
    """recover_logs of one log."""
    return recover_logs(index, backend, [log], durable)


def recover_logs(index: Index, backend: SegmentBackend, logs, durable: bool) -> Recovered:
    """Recovers the given logs (their locks held by the caller: their writers are gone); see
    the module docstring. Raises CorruptionError, FormatError; OSError from the backend
    passes through (the Store reports it as StoreIOError)."""
    logs = sorted(set(logs))
    done = Recovered(logs)
    with index.read() as r:
        applied = {log: r.log_applied(log) for log in logs}
        theirs = [c for c in claim_rules.claims(r) if c.log in logs] if r.version >= 3 else []
    numbers = backend.list()
    found: list[_Item] = []
    for log in logs:
        mine = segments_of(numbers, log)
        if mine:
            found.extend(_scan_log(backend, log, mine, applied[log], durable, done))
    if durable:
        # Their writers may have died between appending and syncing them (crash point
        # after_commit_append): what recovery publishes must be durable before the index
        # (synced) names it, or a power cut leaves an index past the log's end.
        for number in sorted({i.segment for i in found}):
            backend.sync_segment(number)
    legacy = [i for i in found if i.order is None]
    ordered: dict[int, list[_Item]] = {}
    for i in found:
        if i.order is not None:
            ordered.setdefault(i.order, []).append(i)
    claims_by_order = {c.order: c for c in theirs}
    for item in legacy:
        _apply(index, [item], None)
        done.applied += 1
    for order in sorted(ordered):
        _apply(index, ordered[order], claims_by_order.pop(order, None))
        done.applied += 1
    if claims_by_order:
        with index.write() as w:
            for c in claims_by_order.values():
                claim_rules.drop(w, c)
                done.dropped_claims += 1
    return done


def _scan_log(backend: SegmentBackend, log: int, numbers: list, applied, durable: bool,
              done: Recovered) -> list[_Item]:
    """The complete index records of one log past its applied position (its torn tail, or an
    incomplete batch and what follows, cut off)."""
    seg, off = applied if applied is not None else (numbers[0], 0)
    if seg not in numbers:
        raise CorruptionError(f"index has applied log {log} up to segment {seg}, which is "
                              "missing", segment=segment_name(seg))
    if backend.size(seg) < off:
        # The index saw records the log no longer holds (with durability "none" a power cut
        # may do this). Whatever this writer's durability, it must not go on: it would
        # append where the index still places lost chunks, and a new checkpoint
        # deduplicated against one of them would name another record (unrestorable).
        raise CorruptionError(f"log {log} ends before the position the index has applied "
                              f"({off}): checkpoints were lost (a power cut took what a "
                              "writer with durability \"none\" had not synced, or the disk "
                              "lost synced writes); `snapstore repair` rebuilds the index "
                              "from the log and reports them",
                              segment=segment_name(seg), offset=backend.size(seg))
    out: list[_Item] = []
    batch: list[_Item] = []     # the records of the order being read, until all are there
    for number in [n for n in numbers if n >= seg]:
        start = off if number == seg else 0
        for item in scan(backend, number, start, chunk_payloads=False):
            if isinstance(item, tuple):
                state, pos = item
                if state == "torn":
                    if number != numbers[-1]:
                        raise CorruptionError("invalid record in a sealed segment",
                                              segment=segment_name(number), offset=pos)
                    at = (batch[0].segment, batch[0].offset) if batch else (number, pos)
                    _cut(backend, log, numbers, at, durable, done)
                    return out
                break
            if item.rtype not in fmt.INDEX_RECORD_TYPES:
                continue        # chunks wait for their commit; a state section is the index
            try:
                order, count = records.record_order(item.rtype, item.payload)
            except CorruptionError as exc:
                raise CorruptionError(f"cannot decode a log record: {exc}",
                                      segment=segment_name(number), offset=item.offset) from exc
            if batch and order != batch[0].order:
                # the previous batch ended before all its records were written: it never
                # completed; cut it off, with what follows it
                _cut(backend, log, numbers, (batch[0].segment, batch[0].offset), durable, done)
                return out
            batch.append(_Item(number, item.offset, item.end, item.rtype, bytes(item.payload),
                               order, count))
            if order is not None and len(batch) < count:
                continue
            out.extend(batch)
            batch = []
    if batch:
        _cut(backend, log, numbers, (batch[0].segment, batch[0].offset), durable, done)
    return out


def _apply(index: Index, batch: list[_Item], claim) -> None:
    """Applies the records of one order (or one format <= 2 record) in one transaction that
    drops the order's claim and keeps next_order past it."""
    first = batch[0]
    try:
        with index.write() as w:
            for item in batch:
                w.apply_record(item.rtype, item.payload, (item.segment, item.end))
            if first.order is not None:
                if claim is not None:
                    claim_rules.drop(w, claim)
                if w.next_order() <= first.order:
                    w.set_next_order(first.order + 1)
    except CorruptionError as exc:
        if exc.segment is not None:
            raise
        raise CorruptionError(f"cannot apply a log record: {exc}",
                              segment=segment_name(first.segment),
                              offset=first.offset) from exc


def _cut(backend: SegmentBackend, log: int, numbers: list, at: tuple, durable: bool,
         done: Recovered) -> None:
    """Truncates the log at `at`: what lies from there on is past the log's applied position,
    so nobody published it. A batch may span a segment rollover (the writer appends its
    records one after the other), so an unfinished one may begin in an earlier segment than
    its torn rest: then the log's later segments are removed, newest first, as the writer's
    own rollback would have done."""
    number, pos = at
    later = [n for n in numbers if n > number]
    for n in reversed(later):
        backend.remove(n)
    if later and durable:
        backend.sync_directory()
    truncate_tail(backend, number, pos, durable)
    done.cut_at[log] = (number, pos)


def truncate_tail(backend: SegmentBackend, number: int, pos: int, durable: bool) -> None:
    """Cuts segment `number` (the last of its log) at pos; a torn segment header removes the
    segment. Synced when durable."""
    if pos < fmt.SEGMENT_HEADER.size:
        backend.remove(number)
        if durable:
            backend.sync_directory()
        return
    with backend.open_append(number) as f:
        f.truncate(pos)
        if durable:
            f.sync()
