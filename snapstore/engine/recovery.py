"""Recovery: when a writer opens a store, apply the durable log records the index has not
applied yet, and cut a torn tail (docs/design.md, "Commit and recovery protocol").

The first invalid or incomplete record ends the scan: in the last segment it is a torn tail and
the segment is truncated there (a segment killed while being created is removed); anywhere else
it is corruption and nothing is cut. Chunk records without a following commit stay as garbage;
state sections (logstate.py) describe what the index already holds and are passed over.
"""
from __future__ import annotations

from snapstore.engine import format as fmt
from snapstore.errors import CorruptionError
from snapstore.engine.backends.base import SegmentBackend, segment_name
from snapstore.engine.index import Index
from snapstore.engine.wal import scan


def recover(index: Index, backend: SegmentBackend, durable: bool) -> None:
    """Applies durable log records past the index's applied position; cuts a torn tail (and
    syncs the cut when durable). Raises CorruptionError, FormatError; OSError from the backend
    passes through (the Store reports it as StoreIOError)."""
    with index.read() as r:
        applied = r.applied()
    numbers = backend.list()
    if not numbers:
        return
    seg, off = applied if applied is not None else (numbers[0], 0)
    if seg not in numbers:
        raise CorruptionError(f"index has applied the log up to segment {seg}, which is "
                              "missing", segment=segment_name(seg))
    if durable and backend.size(seg) < off:
        # The index saw records the log no longer holds: acknowledged data was lost
        # (with durability "none" a power cut may do this; reads of it then fail cleanly).
        raise CorruptionError(f"the log ends before the position the index has applied "
                              f"({off}); acknowledged checkpoints were lost",
                              segment=segment_name(seg), offset=backend.size(seg))
    for number in [n for n in numbers if n >= seg]:
        start = off if number == seg else 0
        for item in scan(backend, number, start, chunk_payloads=False):
            if isinstance(item, tuple):
                state, pos = item
                if state == "torn":
                    if number != numbers[-1]:
                        raise CorruptionError("invalid record in a sealed segment",
                                              segment=segment_name(number), offset=pos)
                    truncate_tail(backend, number, pos, durable)
                break
            if item.rtype not in fmt.INDEX_RECORD_TYPES:
                continue        # chunks wait for their commit; a state section is the index
            try:
                with index.write() as w:
                    w.apply_record(item.rtype, item.payload, (number, item.end))
            except CorruptionError as exc:
                if exc.segment is not None:
                    raise
                raise CorruptionError(f"cannot apply a log record: {exc}",
                                      segment=segment_name(number),
                                      offset=item.offset) from exc


def truncate_tail(backend: SegmentBackend, number: int, pos: int, durable: bool) -> None:
    """Cuts segment `number` (the last) at pos; a torn segment header removes the segment.
    Synced when durable."""
    if pos < fmt.SEGMENT_HEADER.size:
        backend.remove(number)
        if durable:
            backend.sync_directory()
        return
    with backend.open_append(number) as f:
        f.truncate(pos)
        if durable:
            f.sync()
