"""Repair: rebuild the index from the segments alone (docs/design.md, "Repair").

The log is the whole truth; the index is a cache of it. repair() rebuilds that cache whatever
state the old index is in (missing, truncated, damaged, intact):
  1. scan every log's segments in order, validating every record (wal.read_record); a damaged
     record is reported and skipped (the scan resynchronises at the next valid record), never
     trusted. Every valid chunk record's location goes into a new index (the newest copy of a
     chunk wins; any valid copy holds the same bytes); commit, delete and tag records are
     remembered by position and order; state sections are checked as they pass
     (logstate.SectionFinder);
  2. load the newest complete state section (its checkpoints through IndexWriter.apply_commit,
     then its streams' heads and seqs and its next id);
  3. replay the commit, delete and tag records it does not cover (format 3: each log's
     records from the position the section names for it; older sections: log 0's records
     after it), through the one apply function the live path uses
     (IndexWriter.apply_record): format <= 2 records in log order first, then format 3
     records in their order (claims.py: the order the live path applied them in, as far as
     it matters); a batch (one order, several records) only when all of it is there;
  4. recount every chunk's references from the manifests and (format 5) the delta chunks
     coded against it; drop unreferenced chunk entries; report referenced chunks no valid
     record holds, and drop (and report the same way) delta chunks whose base no valid
     record holds or whose chain is broken: they can never decode;
  5. set each log's applied position to the end of its valid records (a torn tail is left to
     the next writer's recovery, which cuts it; so is a batch whose records end the log but
     are not all there: the log is applied up to its first record), sync the new index, and
     swap it in -- unless
     the log is damaged and the old index is sound (it opens, every value passes its checksum,
     verify finds nothing wrong inside it) and every writer could open the store with it (it
     applied no log past its end, and no damage lies past where it applied a log): it knows
     more than the damaged log, so it stays; and unless the old index and the rebuilt one
     describe some checkpoints they share alike and others not (_foreign_segments: segments
     of another store took the place of some of this store's; the rebuilt index would
     restore their bytes as this store's checkpoints): then it stays too (log_disagrees).
The new index is built in STORE/.index.new and swapped in by indexswap.swap_in (the mechanism
compaction's index shrink shares): one atomic renameat2(RENAME_EXCHANGE), then the old one is
removed, so a crash at any moment leaves the old or the new index; where the exchange is
unsupported, two renames, and a crash between them is finished by indexswap.recover_swap when
the store's directory is next opened by a writer or by repair (storedir.open_directory). Page fingerprints are not in the log: after a repair the
next checkpoint of each buffer compares pages without them.

repair() takes the store lock exclusively itself (it waits for every writer to close: no
writer appends while the log is scanned), so it works when the store cannot open at all. A
format 1 store is upgraded first when its index still opens (so the log describes what
compaction removed from it); otherwise the rebuild says what it could not know.

Crash points: repair_before_swap, repair_after_swap.
"""
from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from snapstore.engine import format as fmt
from snapstore.engine import storedir
from snapstore.engine import unsynced
from snapstore.engine.backends.base import SegmentBackend, SegmentReader, segment_name
from snapstore.engine.backends.local import LocalSegments
from snapstore.engine.chunks import delta_base, stored_chunk
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.fsutil import fsync_directory
from snapstore.engine.index import ChunkEntry, Index, open_in_process
from snapstore.engine.indexswap import remove_entry, staging_dir, swap_in
from snapstore.engine.logstate import SectionFinder, StateSection
from snapstore.engine.records import Commit, decode_delete, record_order
from snapstore.engine.upgrade import upgrade
from snapstore.engine.verify import ProblemReport, children_of, dependents, verify
from snapstore.engine.wal import (DamagedRecord, MisplacedSegment, Record, first_segment,
                                  log_of, logs_of, next_valid_record, read_record,
                                  segment_version, writeback_hole, zeroed_segment_header)
from snapstore.errors import CorruptionError, FormatError, SnapstoreError, StoreIOError

Progress = Callable[[int, int], None]     # (segment bytes scanned, total segment bytes)

_PROGRESS_STEP = 4 << 20
_REPLAY_BATCH = 256


@dataclass
class _Scan:
    """What the scan of the log found besides the chunks it indexed."""
    finder: SectionFinder = field(default_factory=SectionFinder)
    # [(segment, offset, length, type, order or None, records of its order)]
    index_records: list = field(default_factory=list)
    ends: dict = field(default_factory=dict)   # {log: just past its last valid record}
    last_record: dict = field(default_factory=dict)   # {log: (segment, end) of that record}
    end: tuple[int, int] | None = None      # the segment being scanned: its valid end
    segments: int = 0
    bytes: int = 0
    records: int = 0
    chunks: int = 0
    torn_tail: tuple[int, int] | None = None
    # {log: position} the old index (when trusted) has applied: a writeback hole before it
    # lies in acknowledged records, so it is damage there, never a torn tail
    applied: dict = field(default_factory=dict)
    # (segment, offset) of every damaged record or segment header reported (not the torn
    # tail): a writer's recovery refuses to scan past one of them
    damage: list = field(default_factory=list)
    # format 5: the depth each delta chunk's indexed record names, where it is not 1 (the
    # depth writers write): what the recount checks chains against
    depths: dict = field(default_factory=dict)
    # format 5: chunk id -> [(entry, depth)] of the other delta copies of a chunk indexed as
    # a delta copy (the recount falls back on one whose chain decodes)
    other_copies: dict = field(default_factory=dict)


def repair(path: str, *, progress: Progress | None = None, timeout: float = 0.0) -> dict:
    """Rebuilds the index of the store at `path` from its segments (see the module
    docstring). Takes the store lock exclusively (waiting up to `timeout` seconds for every
    writer to close). Returns a report:
    {"ok", "problems": [{kind, message, checkpoints, segment, offset}], "index_replaced",
    "checkpoints", "streams", "chunks", "segments", "bytes_scanned", "records",
    "records_replayed", "state_section", "seconds", "mb_per_s"} (checkpoints, streams,
    chunks: what the index in place afterwards holds); "ok" is False when the log itself is
    damaged: then the rebuilt index replaces the old one only if the old one is unsound,
    names records past the log's end or lies before damage in the log (else it knows more: it
    is kept, "index_replaced" False, problem "index_kept"). Raises FormatError (not a store,
    a newer format), StoreLocked, StoreIOError, and SnapstoreError when this process has the
    store open."""
    started = time.perf_counter()
    path = os.fspath(path)
    lock_fd = storedir.open_directory(path, create=False, readonly=False, timeout=timeout,
                                      repairing=True).lock_fd
    try:
        index_path = os.path.join(path, fmt.INDEX_DIR)
        segments_dir = _rebuildable(path)
        # marks of an earlier boot: the old index may be damaged; never open it
        try:
            stale = unsynced.untrusted(path)
        except OSError as exc:
            raise StoreIOError(f"cannot read the marks of {path}: {exc.strerror or exc}",
                               exc.errno) from exc
        if not stale:
            _refuse_newer_index(index_path)
        backend = LocalSegments(segments_dir, durable=True)
        report = ProblemReport()
        try:
            if stale and storedir.read_format_file(path)["version"] < 2:
                unopened = "its index is untrusted (written without syncs before a reboot)"
            else:
                unopened = None if stale else _upgrade_first(path, backend, report)
            result = _rebuild(path, backend, progress, report, trust_old=not stale)
            if stale:
                unsynced.remove_untrusted(path, stale)
            if unopened is not None and result.get("state_section") is None:
                # no state section in the log (an interrupted upgrade may have written one:
                # the log is complete then), so what old compactions removed is lost
                report.add("old_format", f"the store has an older format and {unopened}: "
                           "checkpoints whose records an old compaction removed from the log "
                           "cannot be rebuilt")
        except OSError as exc:
            if isinstance(exc, SnapstoreError):
                raise
            raise StoreIOError(f"repair failed: {exc.strerror or exc}", exc.errno) from exc
        finally:
            backend.close()
    finally:
        storedir.release_exclusive(lock_fd)
    seconds = time.perf_counter() - started
    result.update({"ok": not report.problems, "problems": report.problems,
                   "seconds": seconds,
                   "mb_per_s": result["bytes_scanned"] / 1e6 / seconds if seconds else 0.0})
    return result


def _rebuildable(path: str) -> str:
    """The segments directory of the store at path, whose index is about to be rebuilt:
    SnapstoreError when this process has the store open (LMDB allows one environment per
    store per process), CorruptionError when the log is gone."""
    if open_in_process(os.path.join(path, fmt.INDEX_DIR)):
        raise SnapstoreError(f"this process has the store {path} open: close it before its "
                             "index is rebuilt")
    segments_dir = os.path.join(path, fmt.SEGMENTS_DIR)
    if not os.path.isdir(segments_dir) or os.path.islink(segments_dir):
        raise CorruptionError(f"the store {path} has no segments directory: the log is lost "
                              "and there is nothing to rebuild the index from")
    return segments_dir


def _refuse_newer_index(index_path: str) -> None:
    """FormatError, nothing changed, when the index is of a newer format than this library's
    (its version value passing the checksum: not damage): a newer snapstore's upgrade
    converts the index before it writes FORMAT, so a newer index under an older FORMAT is
    an upgrade a newer library was interrupted in, which only that library can finish or
    rebuild. An index that does not open for any other reason is for the rebuild to
    replace."""
    try:
        index = Index(index_path, readonly=True, durable=False)
    except FormatError as exc:
        if getattr(exc, "verified_newer", False):
            raise FormatError(f"{exc}; repair refuses to replace an index a newer snapstore "
                              "wrote (an interrupted upgrade): run that snapstore's repair. "
                              "Nothing was changed") from None
        return
    except (SnapstoreError, OSError):
        return
    index.close()


def _upgrade_first(path: str, backend: SegmentBackend, report: ProblemReport) -> str | None:
    """A format 1 store whose index still opens is upgraded first (upgrade.py), so its log
    gains the state section that describes what compaction removed. (From format 2 on the
    log is complete: the rebuilt index is of today's format, and so is FORMAT afterwards.)
    Returns why a format 1 store's index could not be upgraded because it does not open
    (None otherwise): a problem unless the log holds a state section (the caller's scan
    tells: an upgrade interrupted after writing it leaves FORMAT at 1)."""
    if storedir.read_format_file(path)["version"] >= 2:
        return None
    index_dir = os.path.join(path, fmt.INDEX_DIR)
    if not os.path.lexists(index_dir):
        return "no index"
    try:
        index = Index(index_dir, readonly=False, durable=True)
    except SnapstoreError as exc:
        return f"its index does not open ({exc})"
    try:
        upgrade(path, index, backend)
    except SnapstoreError as exc:
        report.add("old_format", f"the store has an older format and its index could not be "
                   f"upgraded ({exc}): checkpoints whose records an old compaction removed "
                   "from the log cannot be rebuilt")
    finally:
        index.close()


def rebuild_untrusted(path: str) -> dict:
    """Rebuilds the index of the store at `path` from its segments without ever opening the
    old one, which may be damaged: a writer whose index ran without syncs had the store open
    when the machine went down (unsynced.py). The caller holds the store lock exclusively.
    The rebuilt index always replaces the old one. Returns repair()'s report (its "problems"
    say what the log itself lost). Raises CorruptionError (no segments directory),
    StoreIOError, SnapstoreError (this process has the store open)."""
    started = time.perf_counter()
    segments_dir = _rebuildable(path)
    if storedir.read_format_file(path)["version"] < 2:
        # its log may lack what old compactions removed (writers mark only stores of
        # today's format: this one was never theirs)
        raise CorruptionError(f"the index of {path} must be rebuilt, and the store has format "
                              "1, whose log alone may not describe every checkpoint: run "
                              "`snapstore repair`, which reports what cannot be rebuilt")
    backend = LocalSegments(segments_dir, durable=True)
    report = ProblemReport()
    try:
        result = _rebuild(path, backend, None, report, trust_old=False)
    except OSError as exc:
        if isinstance(exc, SnapstoreError):
            raise
        raise StoreIOError(f"rebuilding the index failed: {exc.strerror or exc}",
                           exc.errno) from exc
    finally:
        backend.close()
    result.update({"ok": not report.problems, "problems": report.problems,
                   "seconds": time.perf_counter() - started})
    return result


def _rebuild(path: str, backend: SegmentBackend, progress: Progress | None,
             report: ProblemReport, trust_old: bool = True) -> dict:
    """trust_old=False: the old index is never opened (it may be damaged so that mapping it
    crashes): nothing is compared with it, and the rebuilt index replaces it."""
    previous = _old_index(path) if trust_old else _OldIndex()
    old_logs = previous.logs
    # what the rebuilt index lacks (as opposed to damage in the log): reported only if it
    # replaces the old index; a kept index reports what it lacks itself (verify)
    rebuilt_report = ProblemReport()
    new_dir = staging_dir(path)
    remove_entry(new_dir)                   # what an interrupted repair left
    # the store's modes, as compaction's shrink makes its copy: a store shared with a group
    # stays shared (the rebuilt index was 0700 / 0600, and its group could read nothing)
    file_mode = storedir.store_file_mode(path)
    os.mkdir(new_dir, storedir.dir_mode(file_mode))
    index = Index(new_dir, readonly=False, durable=False, rebuilding=True, file_mode=file_mode)
    try:
        with backend.open_reader() as reader:
            scan = _scan_log(index, backend, reader, progress, report, old_logs)
            for log, old in sorted(old_logs.items()):
                end = scan.ends.get(log)
                if end is None or old > end:
                    end = end or (0, 0)
                    report.add("lost_tail", f"the old index had applied log {log} up to "
                               f"{segment_name(old[0])}:{old[1]}, but its valid records end "
                               f"at {segment_name(end[0])}:{end[1]}: acknowledged records "
                               "were lost", segment=end[0] or None, offset=end[1])
            section = scan.finder.newest
            _check_segment_gaps(backend, section, rebuilt_report)
            loaded = _load_section(index, reader, section, report) if section else 0
            todo = [r for r in scan.index_records if not _covered(section, r[0], r[1])]
            deleted: set = set()
            replayed = _replay(index, reader, _in_order(todo, report), report, deleted)
        _recount(index, rebuilt_report, scan.depths, scan.other_copies)
        with index.write(rebuilding=True) as w:
            for log, end in scan.ends.items():
                w.set_applied(_unfinished_tail(scan, log) or end)
            orders = [r[4] for r in scan.index_records if r[4] is not None]
            next_order = max([max(orders) + 1] if orders else [1])
            if section is not None and section.next_order is not None:
                next_order = max(next_order, section.next_order, section.order + 1)
            w.set_next_order(next_order)
            if section is not None:
                w.set_log_state(section.begin, section.end)
            with_streams = len(w.streams())
            rebuilt_ids = set(w.checkpoint_ids())
            checkpoints = len(rebuilt_ids)
            # ids and seqs handed out before stay used, also those of checkpoints the log
            # lost (a name an application was given never comes to mean other bytes)
            w.set_next_id(max(w.next_id(), previous.next_id))
            for name, head in w.streams().items():
                if previous.seqs.get(name, 0) > w.stream_seq(name):
                    w.put_stream(name, head, previous.seqs[name])
            try:
                differ = _foreign_segments(previous.identities, w, rebuilt_ids)
            except (SnapstoreError, OSError):
                differ = []     # the rebuild's own damage is reported where it was found
            if differ:
                report.add("log_disagrees", f"{len(differ)} checkpoint(s) are described "
                           "differently by the log than by the index, which agree on the "
                           "others: the log's records of them are not the ones the index "
                           "applied (segments of another store in place of this store's?)",
                           differ)
            damaged = bool(report.problems or rebuilt_report.problems)
            if damaged:
                _report_lost_parents(w, rebuilt_ids, rebuilt_report)
            chunks = sum(1 for _ in w.chunks())
        index.sync()
    finally:
        index.close()
    fsync_directory(new_dir)
    # the old index is kept only if it is sound and every writer could still open the
    # store with it (its logs neither end before what it applied nor hold damage past it)
    kept_problems = None
    if trust_old and damaged and not _past_the_log(old_logs, backend) \
            and not _behind_the_damage(old_logs, scan.damage):
        kept_problems = _problems_of_sound_index(path, backend)
    if differ and kept_problems is None:
        # an index rebuilt from that log would restore the other bytes as these checkpoints,
        # with no error; the old one refuses them (their chunk records hold other chunks).
        # Nothing is replaced: the user decides (put the right segments back, or remove
        # STORE/index to accept the log as it is)
        kept_problems = []
    replaced = kept_problems is None
    if replaced:
        report.problems.extend(rebuilt_report.problems)
        lost = sorted((previous.checkpoints or set()) - rebuilt_ids - deleted)
        if lost:
            report.add("lost_checkpoints", f"{len(lost)} checkpoint(s) the old index listed "
                       "are in no valid record of the log: the rebuilt index does not have "
                       "them", lost)
        crashpoint("repair_before_swap")
        swap_in(path, new_dir)
        crashpoint("repair_after_swap")
        found = storedir.read_format_file(path)
        if found["version"] < fmt.FORMAT_VERSION:
            # the rebuilt index is of today's format (the log of format 2 is complete)
            created = found.get("created")
            storedir.publish_format(path, found["file_mode"],
                                    created if isinstance(created, (int, float)) else None)
    elif differ:
        remove_entry(new_dir)
        report.problems.extend(kept_problems)
        report.add("index_kept", "the existing index was kept, because the log describes "
                   "some of its checkpoints differently (log_disagrees): an index rebuilt from "
                   "it would restore other bytes as them, without an error. Put the store's "
                   f"own segments back and repair again, or remove {fmt.INDEX_DIR}/ and repair "
                   "again to accept the log as it is")
        checkpoints, with_streams, chunks = _counts(os.path.join(path, fmt.INDEX_DIR))
    else:
        remove_entry(new_dir)
        report.problems.extend(kept_problems)
        report.add("index_kept", "the log is damaged and the existing index is sound, so it "
                   "was kept (it describes what the damaged records held; restoring what "
                   "needs them fails cleanly); the index rebuilt from the log was discarded")
        checkpoints, with_streams, chunks = _counts(os.path.join(path, fmt.INDEX_DIR))
    return {"index_replaced": replaced, "checkpoints": checkpoints, "streams": with_streams, "chunks": chunks,
            "segments": scan.segments, "bytes_scanned": scan.bytes, "records": scan.records,
            "state_section": (f"{segment_name(section.end[0])}:{section.end[1]}"
                              if section else None),
            "state_checkpoints": loaded, "records_replayed": replayed,
            "torn_tail": (f"{segment_name(scan.torn_tail[0])}:{scan.torn_tail[1]}"
                          if scan.torn_tail else None)}


# Problems verify finds inside the index itself (not in the log it points at).
_INDEX_ONLY = frozenset({"missing_manifest", "missing_parent", "bad_extent", "missing_chunk",
                         "incomplete_manifest", "broken_chain", "stream", "refcount",
                         "index_mismatch", "unreadable_index"})


@dataclass
class _OldIndex:
    """What the store's existing index holds, where it opens and passes its checksums."""
    logs: dict = field(default_factory=dict)    # {log: applied position}
    checkpoints: set | None = None              # ids; None when not readable
    next_id: int = 1
    seqs: dict = field(default_factory=dict)    # {stream: its newest seq ever committed}
    # {id: _identity()} of its checkpoints; None when not readable
    identities: dict | None = None


def _old_index(path: str) -> _OldIndex:
    """What the store's existing index holds, as far as it opens and its values pass their
    checksums: a torn tail never reaches back before its applied positions, so a log whose
    valid records end earlier lost acknowledged records; ids and seqs it handed out are never
    handed out again."""
    old = _OldIndex()
    try:
        index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=True, durable=False)
    except (SnapstoreError, OSError):
        return old
    try:
        with index.read() as r:
            old.logs = r.logs()
            try:
                old.next_id = r.next_id()
                old.seqs = {name: r.stream_seq(name) for name in r.streams()}
                old.checkpoints = set(r.checkpoint_ids())
            except (SnapstoreError, OSError):
                pass
            try:
                old.identities = _identities(r, old.checkpoints or ())
            except (SnapstoreError, OSError):
                pass
    except (SnapstoreError, OSError):
        pass
    finally:
        index.close()
    return old


def _identity(view, checkpoint_id: int) -> tuple:
    """Commit.identity() of a checkpoint of the index `view` (() when it holds none)."""
    commit = view.checkpoint(checkpoint_id)
    return () if commit is None else commit.identity()


def _identities(view, ids) -> dict:
    return {i: _identity(view, i) for i in ids}


def _foreign_segments(old: dict | None, view, ids: set) -> list[int]:
    """The checkpoints the old index and the rebuilt one (view) both hold but describe
    differently, when they describe others the same: then the log's records of those are not
    the ones the index applied, while its others are (segments of another store took the
    place of some of this store's: segment headers name no store). [] when they describe
    every checkpoint alike (a stale index: the log only went on), or none alike: then the
    old index is not this store's (a foreign index, index-confined damage that the rebuilt
    one undoes; a store whose every segment was replaced looks the same and is not told
    apart)."""
    if not old:
        return []
    shared = [i for i in sorted(ids & old.keys()) if old[i]]
    differ = [i for i in shared if _identity(view, i) != old[i]]
    return differ if len(differ) < len(shared) else []


def _covered(section: StateSection | None, segment: int, offset: int) -> bool:
    """Whether the record at (segment, offset) is described by the state section: format 3
    sections cover each log's records before the position they name for it; older ones
    (log 0 only) the records before them."""
    if section is None:
        return False
    if section.logs is None:
        return log_of(segment) == 0 and (segment, offset) < section.end
    covered = section.logs.get(log_of(segment))
    return covered is not None and (segment, offset) < covered


def _in_order(todo: list, report: ProblemReport) -> list:
    """The records to replay in the order the live path applied them: format <= 2 records
    (log 0, no order) in log order, then format 3 records by order (one order's records, a
    batch, in log order), leaving out batches not all of whose records are there."""
    legacy = sorted(r for r in todo if r[4] is None)
    ordered: dict[int, list] = {}
    for r in todo:
        if r[4] is not None:
            ordered.setdefault(r[4], []).append(r)
    out = list(legacy)
    for order in sorted(ordered):
        batch = sorted(ordered[order])
        if len(batch) != batch[0][5] or len({log_of(r[0]) for r in batch}) != 1:
            report.add("incomplete_batch", f"{len(batch)} of the {batch[0][5]} records of "
                       f"operation {order} are in the log: it never completed, so none of "
                       "them was applied", segment=batch[0][0], offset=batch[0][1])
            continue
        out.extend(batch)
    return out


def _unfinished_tail(scan: _Scan, log: int) -> tuple[int, int] | None:
    """Where a batch begins whose records end log `log` but are not all there (a writer killed
    while it appended a delete_many): nothing of it was applied, so the log is applied up to
    its first record only, and the next writer's recovery cuts it off there like a torn tail
    (past it, it would stay in the log for good, an incomplete batch every later repair
    reports). None when the log ends otherwise."""
    mine = [r for r in scan.index_records if log_of(r[0]) == log]
    if not mine or mine[-1][4] is None:
        return None
    order, count = mine[-1][4], mine[-1][5]
    batch = []
    for r in reversed(mine):
        if r[4] != order:
            break
        batch.append(r)
    last = mine[-1]
    if len(batch) >= count or \
            (last[0], last[1] + fmt.RECORD_HEADER.size + last[2]) != scan.last_record.get(log):
        return None             # complete, or valid records follow it: not a crash's tail
    return batch[-1][0], batch[-1][1]


def _counts(index_path: str) -> tuple[int, int, int]:
    """(checkpoints, streams, chunks) the index at index_path holds."""
    index = Index(index_path, readonly=True, durable=False)
    try:
        with index.read() as r:
            return len(r.checkpoint_ids()), len(r.streams()), sum(1 for _ in r.chunks())
    finally:
        index.close()


def _past_the_log(old_logs: dict[int, tuple[int, int]], backend: SegmentBackend) -> bool:
    """Whether the old index has applied a log past the end of its files (a power cut took
    the unsynced tail of a durability "none" writer's log while the index reached the disk):
    every writer open refuses such an index, so keeping it would leave a store nobody can
    write; the index rebuilt from the log (the truth) replaces it, and the checkpoints only
    the lost tail held are reported lost."""
    sizes = backend.sizes()
    return any(sizes.get(segment, -1) < offset for segment, offset in old_logs.values())


def _report_lost_parents(w, ids: set, report: ProblemReport) -> None:
    """Reports the rebuilt checkpoints whose parent the damaged log lost (its commit record).
    A parent a replayed delete removed counts too: that delete re-parents the children when
    it finds the parent, so a child still naming it means the parent's record was lost and
    the child's delta manifests were never merged. One whose manifests are all full restores
    (verify names its missing parent until it is deleted); a delta manifest over the lost
    parent cannot restore, nor can the later checkpoints whose manifests of that buffer
    build on it."""
    commits = {i: w.checkpoint(i) for i in ids}
    children = children_of(commits)
    for i in sorted(commits):
        parent = commits[i].parent
        if parent is None or parent in commits:
            continue
        deltas = [b.name for b in commits[i].buffers if b.base == "delta"]
        if not deltas:
            report.add("missing_parent", f"checkpoint {i} names parent {parent}, which is in "
                       "no valid record of the log: it restores (its manifests are whole), "
                       "but its parent is lost", [i])
            continue
        report.add("missing_parent", f"checkpoint {i} names parent {parent}, which is in no "
                   f"valid record of the log: its buffers {deltas} are stored as changes to "
                   "the parent's, so restoring it, and the checkpoints building on them, fails",
                   dependents(commits, children, {(i, name) for name in deltas}))


def _behind_the_damage(old_logs: dict[int, tuple[int, int]], damage: list) -> bool:
    """Whether a damaged record or segment header lies at or past where the old index has
    applied its log (or in a log it has applied nothing of): a writer's recovery replays a
    log from its applied position and refuses damage in a sealed segment, so keeping that
    index would leave a store nobody can write (and hide the valid records after it)."""
    for segment, offset in damage:
        applied = old_logs.get(log_of(segment))
        if applied is None or (segment, offset) >= applied:
            return True
    return False


def _problems_of_sound_index(path: str, backend: SegmentBackend) -> list | None:
    """The problems (shallow) verify finds in the log the store's existing index points at
    (damaged chunk records, with the checkpoints they break), if that index is sound: it
    opens, every value it holds passes its checksum and verify finds nothing wrong inside it.
    Then, when the log is damaged, it knows more than a rebuild from that log, and repair
    keeps it. None when it is not sound."""
    try:
        index = Index(os.path.join(path, fmt.INDEX_DIR), readonly=True, durable=False)
    except (SnapstoreError, OSError):
        return None
    try:
        found = verify(index, backend, deep=False)
    except (SnapstoreError, OSError):
        return None
    finally:
        index.close()
    if any(p["kind"] in _INDEX_ONLY for p in found["problems"]):
        return None
    return found["problems"]


# ---- 1. the scan ------------------------------------------------------------------------------

def _scan_log(index: Index, backend: SegmentBackend, reader: SegmentReader,
              progress: Progress | None, report: ProblemReport,
              applied: dict | None = None) -> _Scan:
    scan = _Scan(applied=dict(applied or {}))
    numbers = backend.list()
    sizes = {}
    for n in numbers:
        try:
            sizes[n] = backend.size(n)
        except OSError as exc:
            report.add("unreadable_segment", f"cannot read the segment: {exc.strerror or exc}",
                       segment=n)
    total = sum(sizes.values())
    done = reported = 0
    previous = None
    last_of_log = {max(ns) for ns in logs_of(numbers).values()}
    for n in numbers:
        if n not in sizes:
            scan.finder.interrupt()
            continue
        if previous is not None and n != previous + 1:
            scan.finder.interrupt()     # a gap, or the next log
        if previous is None or log_of(previous) != log_of(n):
            scan.end = None
        previous = n
        size, last = sizes[n], n in last_of_log
        try:
            with index.write(rebuilding=True) as w:
                for record in _segment_records(reader, n, size, last, scan, report):
                    scan.records += 1
                    scan.last_record[log_of(n)] = (n, record.end)
                    if record.rtype == fmt.REC_CHUNK:
                        _index_chunk(w, record, report, scan.depths, scan.other_copies)
                        scan.chunks += 1
                    elif record.rtype in fmt.INDEX_RECORD_TYPES:
                        try:
                            order, count = record_order(record.rtype, record.payload)
                        except CorruptionError as exc:
                            report.add("unappliable_record", f"a valid log record does not "
                                       f"decode: {exc}", segment=n, offset=record.offset)
                            continue
                        scan.index_records.append((n, record.offset, record.length,
                                                   record.rtype, order, count))
                    scan.finder.feed(record)
                    if progress is not None and done + record.end - reported >= _PROGRESS_STEP:
                        reported = done + record.end
                        progress(reported, total)
        except OSError as exc:
            if isinstance(exc, SnapstoreError):
                raise
            scan.finder.interrupt()
            report.add("unreadable_segment", f"cannot read the segment: {exc.strerror or exc}",
                       segment=n)
        if scan.end is not None:
            scan.ends[log_of(n)] = scan.end
        scan.segments += 1
        scan.bytes += size
        done += size
    if progress is not None:
        progress(total, total)
    return scan


def _may_be_torn(scan: _Scan, n: int, pos: int) -> bool:
    """Whether (n, pos) of a log's last segment lies where a crash may have torn it: not
    before the position a trusted old index has applied of the log (records before it were
    acknowledged; recovery, too, only judges what lies past it)."""
    applied = scan.applied.get(log_of(n))
    return applied is None or (n, pos) >= tuple(applied)


def _damage(scan: _Scan, report: ProblemReport, kind: str, message: str, segment: int,
            offset: int) -> None:
    """Reports damage in the log and records where it is (scan.damage: what a writer's
    recovery would refuse, so what decides whether an old index may stay)."""
    scan.damage.append((segment, offset))
    report.add(kind, message, segment=segment, offset=offset)


def _segment_records(reader: SegmentReader, n: int, size: int, last: bool, scan: _Scan,
                     report: ProblemReport):
    """The valid records of segment n, in order. Damage is reported (and interrupts any state
    section); the scan resumes at the next valid record. In a log's last segment (past what a
    trusted old index applied of it) a damaged stretch is the torn tail of a crash, not a
    problem, and the scan of the segment ends there (the next writer's recovery cuts it) when
    nothing valid follows it, or when it is a writeback hole (wal.writeback_hole: zeros where
    the writer's bytes must be; the records after it were written after it, so no sync
    completed after them either: none of them was acknowledged); a zeroed segment header
    there makes the whole segment torn (no sync of it ever completed)."""
    if size <= fmt.SEGMENT_HEADER.size:     # never read: a FIFO, or killed while creating it
        if size < fmt.SEGMENT_HEADER.size and not last:
            _damage(scan, report, "damaged_segment_header",
                    "segment is shorter than its header", n, 0)
        elif size == fmt.SEGMENT_HEADER.size:
            try:
                segment_version(reader, n)
                scan.end = (n, size)
            except CorruptionError:
                if not last:
                    _damage(scan, report, "damaged_segment_header",
                            "segment header is damaged", n, 0)
        return
    try:
        types = fmt.SEGMENT_RECORD_TYPES[segment_version(reader, n)]
    except MisplacedSegment as exc:
        scan.finder.interrupt()
        _damage(scan, report, "misplaced_segment", f"{exc}: the file is not this segment; "
                "none of its records were used", n, 0)
        return
    except CorruptionError as exc:
        if last and _may_be_torn(scan, n, 0) and zeroed_segment_header(reader, n):
            scan.torn_tail = (n, 0)
            return
        _damage(scan, report, "damaged_segment_header", str(exc), n, 0)
        types = fmt.RECORD_TYPES
    else:
        scan.end = (n, fmt.SEGMENT_HEADER.size)
    pos = fmt.SEGMENT_HEADER.size
    while pos < size:
        try:
            record = read_record(reader, n, pos, size=size)
            if record.rtype not in types:
                raise DamagedRecord("record type not held by segments of this version", n, pos,
                                    record.end)
        except DamagedRecord as exc:
            scan.finder.interrupt()
            nxt = next_valid_record(reader, n, exc.end, pos + 1, size, types)
            if last and (nxt is None or (_may_be_torn(scan, n, pos) and
                                         writeback_hole(reader, n, pos, nxt, size))):
                scan.torn_tail = (n, pos)
                return
            _damage(scan, report, "damaged_record", f"{exc.reason}; skipped up to "
                    f"offset {size if nxt is None else nxt}", n, pos)
            if nxt is None:
                return
            pos = nxt
            continue
        scan.end = (n, record.end)
        yield record
        pos = record.end


def _index_chunk(w, record: Record, report: ProblemReport, depths: dict,
                 other_copies: dict | None = None) -> None:
    """Indexes a valid chunk record (the newest copy of a chunk wins, but a plain copy over
    a delta copy: it decodes alone, where a delta copy left behind by a deleted checkpoint
    may name a base that is gone; a delta copy replaced by another goes into other_copies,
    for the recount to fall back on). A delta chunk's entry names the base its delta header
    names, and its depth goes into depths unless it is 1; a delta header that does not
    parse makes the record damaged (skipped, reported)."""
    if record.length < fmt.CHUNK_PREFIX.size:
        report.add("damaged_record", "chunk record too short", segment=record.segment,
                   offset=record.offset)
        return
    chunk_id, raw_len = fmt.CHUNK_PREFIX.unpack_from(record.payload)
    base, depth = None, 0
    if record.codec == fmt.CODEC_DELTA_PLANES:
        try:
            base, depth = delta_base(stored_chunk(record))
        except DamagedRecord as exc:
            report.add("damaged_record", f"{exc.reason}; skipped", segment=record.segment,
                       offset=record.offset)
            return
    known = w.chunk(chunk_id) if base is not None else None
    if known is not None:
        if known.base is None:
            return
        if other_copies is not None:        # the copy it replaces stays a candidate
            other_copies.setdefault(chunk_id, []).append((known, depths.get(chunk_id, 1)))
    elif base is None and other_copies is not None:
        other_copies.pop(chunk_id, None)    # a plain copy decodes alone
    if depth > 1:
        depths[chunk_id] = depth
    else:
        depths.pop(chunk_id, None)
    w.put_chunk(chunk_id, ChunkEntry(record.segment, record.offset, record.length, raw_len, 0,
                                     record.codec, base))


def _check_segment_gaps(backend: SegmentBackend, section: StateSection | None,
                        report: ProblemReport) -> None:
    """Segments are only ever removed by compaction, before the state section it writes (or
    as the torn newest one of a log): a missing number of a log after where the newest
    section covers it means lost records."""
    for log, numbers in logs_of(backend.list()).items():
        first = first_segment(log)
        if section is not None:
            if section.logs is None:
                if log == 0:
                    first = section.end[0]
            elif log in section.logs:
                first = section.logs[log][0]
        present = set(numbers)
        missing = [n for n in range(first, numbers[-1]) if n not in present]
        if missing:
            report.add("missing_segment", f"{len(missing)} segment(s) of log {log} after its "
                       f"newest state section are missing (first {segment_name(missing[0])}): "
                       "what their records held is lost", segment=missing[0])


# ---- 2. and 3.: the state section, then the records after it ---------------------------------

def _load_section(index: Index, reader: SegmentReader, section: StateSection,
                  report: ProblemReport) -> int:
    loaded = 0
    with index.write(rebuilding=True) as w:
        for seg, off, length in section.checkpoints:
            record = read_record(reader, seg, off, length=length)
            commit = Commit.decode(bytes(record.payload))
            w.apply_commit(commit, (seg, record.end))
            loaded += 1
        ids = set(w.checkpoint_ids())
        for name, (head, seq) in section.streams.items():
            if head not in ids:
                report.add("state_section", f"the state section names head {head} of stream "
                           f"{name!r}, which it does not hold", segment=section.end[0])
                continue
            w.put_stream(name, head, seq)
        w.set_next_id(max(section.next_id, w.next_id()))
    return loaded


# A valid record whose content does not apply (damage the record checksum could not see, a
# record of another store): skipped and reported. I/O errors (StoreIOError) are not this.
_UNAPPLIABLE = (CorruptionError, ValueError, KeyError, TypeError, IndexError)


def _replay(index: Index, reader: SegmentReader, todo: list, report: ProblemReport,
            deleted: set) -> int:
    """Applies the index records at the positions in todo, in order, in batches; a batch that
    fails is redone one record at a time, so only the records that cannot apply are skipped
    (and reported). Adds the ids of the checkpoints deleted to `deleted`."""
    applied = 0
    for i in range(0, len(todo), _REPLAY_BATCH):
        batch = todo[i:i + _REPLAY_BATCH]
        try:
            with index.write(rebuilding=True) as w:
                for item in batch:
                    _apply(w, reader, item, deleted)
            applied += len(batch)
            continue
        except _UNAPPLIABLE:
            pass
        for item in batch:
            try:
                with index.write(rebuilding=True) as w:
                    _apply(w, reader, item, deleted)
                applied += 1
            except _UNAPPLIABLE as exc:
                report.add("unappliable_record", f"a valid log record does not apply: {exc}",
                           segment=item[0], offset=item[1])
    return applied


def _apply(w, reader: SegmentReader, item: tuple, deleted: set) -> None:
    seg, off, length, rtype = item[:4]
    record = read_record(reader, seg, off, length=length)
    payload = bytes(record.payload)
    w.apply_record(rtype, payload, (seg, record.end))
    if rtype == fmt.REC_DELETE:
        deleted.add(decode_delete(payload)[0])


# ---- 4. reference counts ---------------------------------------------------------------------

def _recount(index: Index, report: ProblemReport, depths: dict | None = None,
             other_copies: dict | None = None) -> None:
    """Sets every chunk's reference count from the manifests and the delta chunks coded
    against it (edges); removes chunk entries nothing live references; reports chunks
    manifests reference that no valid chunk record holds. A delta chunk that cannot decode
    (its base, or one further down its chain, is in no valid record, or lies at another
    depth than the chunk naming it says) is as lost as a missing chunk: its entry goes (so
    no restore reads wrong bytes and a later checkpoint stores it afresh) and the
    checkpoints using it are reported the same way, unless another delta copy of it
    (other_copies) decodes: that one is indexed instead. depths: delta chunk id -> the depth
    its record names, where not 1."""
    depths = depths or {}
    counts: Counter = Counter()
    with index.write(rebuilding=True) as w:
        for cid in w.checkpoint_ids():
            commit = w.checkpoint(cid)
            for i in range(len(commit.buffers)):
                for _, _, _, chunk in fmt.EXTENT.iter_unpack(w.manifest(cid, i)):
                    counts[chunk] += 1
        entries = dict(w.chunks())
        usable = _usable_chunks(entries, depths)
        for chunk, e in _other_usable_copies(entries, depths, usable, other_copies or {}):
            w.put_chunk(chunk, e)
        live = _live_chunks(entries, usable, counts)
        for chunk in live:
            if entries[chunk].base is not None:
                counts[entries[chunk].base] += 1        # its edge
        for chunk, e in entries.items():
            n = counts.pop(chunk, 0) if chunk in live else 0
            if n == 0:
                w.delete_chunk(chunk)
            elif n != e.refs:
                w.put_chunk(chunk, e._replace(refs=n))
        undecodable = {c for c in counts if c in entries}
        if counts:
            users = _users_of(w, counts)
            lost = users(set(counts) - undecodable)
            if lost:
                report.add("missing_chunk", f"{len(counts) - len(undecodable)} chunk(s) the "
                           "checkpoints reference are in no valid chunk record of the log: "
                           "restoring what uses them fails", lost)
            if undecodable:
                report.add("missing_chunk", f"{len(undecodable)} delta chunk(s) the "
                           "checkpoints reference cannot decode: a chunk of their delta chain "
                           "is in no valid chunk record of the log (or at another depth); "
                           "restoring what uses them fails", users(undecodable))


def _other_usable_copies(entries: dict, depths: dict, usable: set, other_copies: dict):
    """Swaps into entries (and depths, and usable) another copy of each delta chunk that does
    not decode, where one does, until no swap helps (a swapped base can make others usable);
    yields each (chunk id, entry) swapped in, for the index."""
    swapped = True
    while swapped:
        swapped = False
        for chunk, copies in other_copies.items():
            if chunk in usable or chunk not in entries:
                continue
            for i, (entry, depth) in enumerate(copies):
                old = entries[chunk], depths.get(chunk, 1)
                entries[chunk] = entry
                depths[chunk] = depth
                now = _usable_chunks(entries, depths)
                if chunk in now:
                    copies[i] = old
                    usable.clear()
                    usable.update(now)
                    swapped = True
                    yield chunk, entry
                    break
                entries[chunk], depths[chunk] = old


def _usable_chunks(entries: dict, depths: dict) -> set:
    """The chunks of entries that decode: plain ones, and delta chunks whose base has an
    entry, is as long, lies exactly one level less deep (0: a plain chunk; what ChunkReader
    checks) and is usable itself."""
    usable: set = set()
    bad: set = set()
    for cid in entries:
        chain = []
        c = cid
        while c not in usable and c not in bad:
            e = entries.get(c)
            if e is None:
                break
            if e.base is None:
                usable.add(c)
                break
            be = entries.get(e.base)
            depth = depths.get(c, 1)
            base_depth = 0 if be is None or be.base is None else depths.get(e.base, 1)
            if be is None or be.raw_len != e.raw_len or base_depth != depth - 1:
                break
            chain.append(c)
            c = e.base          # depths fall by one a step: every chain ends
        if c in usable:
            usable.update(chain)
        else:
            bad.update(chain)
            bad.add(c)
    return usable


def _live_chunks(entries: dict, usable: set, counts: Counter) -> set:
    """The usable chunks the manifests reference, and the bases of their delta chunks (down
    each chain): the entries a rebuilt index keeps."""
    live: set = set()
    for cid in counts:
        while cid in usable and cid not in live:
            live.add(cid)
            cid = entries[cid].base
            if cid is None:
                break
    return live


def _users_of(w, chunks) -> Callable[[set], set]:
    """users(ids): the checkpoints whose restore reads any of ids (a subset of chunks): those
    whose manifests name one, and the later ones whose delta manifests of that buffer build
    on theirs."""
    commits = {cid: w.checkpoint(cid) for cid in w.checkpoint_ids()}
    children = children_of(commits)
    named: dict[tuple, set] = {}        # (checkpoint, buffer name) -> the chunks it names
    for cid, commit in commits.items():
        for i, b in enumerate(commit.buffers):
            for _, _, _, chunk in fmt.EXTENT.iter_unpack(w.manifest(cid, i)):
                if chunk in chunks:
                    named.setdefault((cid, b.name), set()).add(chunk)
    return lambda ids: dependents(commits, children,
                                  [pair for pair, got in named.items() if got & ids])
