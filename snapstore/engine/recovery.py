"""Recovery of a log whose writer is gone (docs/design.md, "Commit and recovery protocol",
"Many writers"): apply the durable records it claimed, cut its torn tail, drop its claims.

Each writer appends to a log of its own (logowners.py) and claims every index record in the
index before the record reaches its log (claims.py). When a writer dies, any writer that
takes its log's free lock recovers the log, holding that lock:

  * scan the log from its applied position; the first invalid or incomplete record ends the
    scan: in the log's last segment it is a torn tail and the segment is truncated there (a
    segment killed while being created is removed); in an earlier segment it is corruption
    (CorruptionError, nothing is cut);
  * a valid commit, delete or tag record that the log claimed is applied (published: the
    claim already decided it wins) in one transaction that drops the claim; records of
    segment version 1 and 2 (format <= 2: one writer, no claims) are applied as they come;
  * a valid index record nobody claimed (possible only after a power loss with durability
    "none") did not win: the log is cut there, so that no rebuild ever applies it;
  * chunk records are left: the chunks of a published record are indexed by it, others are
    garbage for compaction; state sections are passed over (the index holds what they say);
  * finally every claim the log still holds (operations that never reached the log) is
    dropped, with the groups it coordinated (their staged parts become garbage).

Only other writers' logs are ever touched: a crashed writer's torn tail is cut in its own
log. Recovered checkpoints have no page fingerprints: their stream's next checkpoint is full
(deduplicated against it).
"""
from __future__ import annotations

from dataclasses import dataclass

from snapstore.engine import claims as claim_rules
from snapstore.engine import format as fmt
from snapstore.engine import records
from snapstore.engine.backends.base import SegmentBackend, segment_name
from snapstore.engine.index import Index
from snapstore.engine.wal import scan, segments_of
from snapstore.errors import CorruptionError


@dataclass
class Recovered:
    """What recover_log did to one log."""
    log: int
    published: int = 0          # claimed records applied
    legacy: int = 0             # format <= 2 records applied
    dropped_claims: int = 0     # claims that never reached the log
    cut_at: tuple[int, int] | None = None   # where the log was truncated


def recover(index: Index, backend: SegmentBackend, durable: bool) -> None:
    """Recovers log 0 (the one log of a format <= 2 store: the upgrade runs it before the
    index has per-log positions)."""
    recover_log(index, backend, 0, durable)


def recover_log(index: Index, backend: SegmentBackend, log: int, durable: bool) -> Recovered:
    """Recovers log `log` (its lock held by the caller: its writer is gone); see the module
    docstring. Raises CorruptionError, FormatError; OSError from the backend passes through
    (the Store reports it as StoreIOError)."""
    done = Recovered(log)
    with index.read() as r:
        applied = r.log_applied(log)
        mine = {c.order: c for c in claim_rules.claims_of_log(r, log)} \
            if r.version >= 3 else {}
    numbers = segments_of(backend.list(), log)
    if numbers:
        _replay(index, backend, log, numbers, applied, mine, durable, done)
    if mine:
        with index.write() as w:
            for c in mine.values():
                claim_rules.drop(w, c)
                done.dropped_claims += 1
    return done


def _replay(index: Index, backend: SegmentBackend, log: int, numbers: list, applied,
            mine: dict, durable: bool, done: Recovered) -> None:
    seg, off = applied if applied is not None else (numbers[0], 0)
    if seg not in numbers:
        raise CorruptionError(f"index has applied log {log} up to segment {seg}, which is "
                              "missing", segment=segment_name(seg))
    if durable and backend.size(seg) < off:
        # The index saw records the log no longer holds: acknowledged data was lost
        # (with durability "none" a power cut may do this; reads of it then fail cleanly).
        raise CorruptionError(f"the log ends before the position the index has applied "
                              f"({off}); acknowledged checkpoints were lost",
                              segment=segment_name(seg), offset=backend.size(seg))
    batch: list = []        # the records of one claimed order seen so far (complete: applied)
    for number in [n for n in numbers if n >= seg]:
        start = off if number == seg else 0
        for item in scan(backend, number, start, chunk_payloads=False):
            if isinstance(item, tuple):
                state, pos = item
                if state == "torn":
                    if number != numbers[-1]:
                        raise CorruptionError("invalid record in a sealed segment",
                                              segment=segment_name(number), offset=pos)
                    _cut(backend, numbers, batch[0][:2] if batch else (number, pos), durable,
                         done)
                    return
                break
            if item.rtype not in fmt.INDEX_RECORD_TYPES:
                continue        # chunks wait for their commit; a state section is the index
            try:
                order, count = records.record_order(item.rtype, item.payload)
            except CorruptionError as exc:
                raise CorruptionError(f"cannot decode a log record: {exc}",
                                      segment=segment_name(number), offset=item.offset) from exc
            if batch and order != batch[0][2]:
                # the previous claimed batch ended before all its records: it never
                # completed (a writer appends a batch whole, then syncs): cut it off
                _cut(backend, numbers, batch[0][:2], durable, done)
                return
            if order is not None and order not in mine:
                # durable but never claimed: it did not win (power loss with durability
                # "none"): cut it off, with everything after it, so no rebuild applies it
                _cut(backend, numbers, (number, item.offset), durable, done)
                return
            batch.append((number, item.offset, order, item.rtype, item.payload, item.end))
            if order is not None and len(batch) < count:
                continue
            _apply(index, batch, mine)
            if order is None:
                done.legacy += 1
            else:
                done.published += 1
            batch = []
    if batch:
        _cut(backend, numbers, batch[0][:2], durable, done)


def _apply(index: Index, batch: list, mine: dict) -> None:
    """Applies the records of one claimed order (or one record of format <= 2) in one
    transaction that drops the claim."""
    number, offset, order = batch[0][:3]
    try:
        with index.write() as w:
            for segment, _, _, rtype, payload, end in batch:
                w.apply_record(rtype, payload, (segment, end))
            if order is not None:
                claim_rules.drop(w, mine.pop(order))
    except CorruptionError as exc:
        if exc.segment is not None:
            raise
        raise CorruptionError(f"cannot apply a log record: {exc}",
                              segment=segment_name(number), offset=offset) from exc


def _cut(backend: SegmentBackend, numbers: list, at: tuple, durable: bool,
         done: Recovered) -> None:
    """Truncates the log at `at`, which must lie in its last segment."""
    number, pos = at
    if number != numbers[-1]:
        raise CorruptionError("a sealed segment holds index records that never completed or "
                              "were never claimed", segment=segment_name(number), offset=pos)
    truncate_tail(backend, number, pos, durable)
    done.cut_at = (number, pos)


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
