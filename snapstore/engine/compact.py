"""Compaction: fold long incremental chains, drop unreferenced chunks, rewrite sparse segments.

Order and invariants (docs/design.md, "Compaction"):
  1. fold: a buffer whose chain is longer than max_chain gets one full manifest resolved from
     its layers. Only manifests change (no bytes are copied); what it restores to is unchanged.
  2. choose (plan_rewrite): the segments whose still-needed bytes (the part of each chunk
     some manifest uses; the newest state section) are below `threshold` of them; then more,
     emptiest first, until the garbage the others hold is at most `max_garbage` times the
     live bytes (default 0.1: the segments end up at most 1.1x the live data). The open
     segment is sealed first when it is chosen, so a store smaller than one segment gets
     space back too.
  3. trim: a chunk of a chosen segment of which manifests reference less than `threshold` of
     its bytes (the rest was overwritten in every checkpoint that still uses it) is replaced
     by a chunk holding only the referenced bytes; extents are remapped. (Only there: in a
     segment that stays, the copy would only add bytes.) The new records are synced (with the
     segments directory) before the index transaction that switches to them.
  4. gc: chunk entries with reference count 0 leave the index.
  5. state: if anything is to be removed, a state section of the index (logstate.py) is
     appended and synced, after every index change above and before any removal; so every
     commit, delete and tag record of a removed segment is covered by a durable section, and
     the log alone still describes every checkpoint (repair.py).
  6. rewrite: every chosen segment has its live chunk records copied to the log's tail; the
     log is synced, the index is pointed at the copies and the applied position moved to the
     tail in one transaction, LMDB is flushed to disk, and only then is the old segment
     removed. So the index never points into a removed segment, even after a crash or power
     cut at any moment; running compact() again after a crash finishes the job (left-over
     copies are unreferenced records, reclaimed next time).
  7. shrink the index: LMDB reuses the pages transactions free but never gives them back, so
     when at least half of the data file is free pages, a compacting copy of the index (its
     pages in use only) is written to STORE/.index.new, synced, and swapped in by
     indexswap.swap_in, the mechanism repair uses (crash points compact_before_index_swap,
     index_swap_exchanged, index_swap_renamed_old, compact_after_index_swap). Old and new
     index hold the same values, so a crash anywhere leaves a complete index either way.
     Every Index (readers in other processes too) moves to the new one at its next
     transaction (index.py).
Steps 1-4 are index transactions that leave checkpoint contents unchanged and remove nothing
from the log, so they need no log record: losing one to a crash only loses the work, never
data, and the records still in the log restore the same bytes.

While other writers write (format 3, docs/design.md "Many writers"): compaction runs under
the store's maintenance lock (one at a time) and this process's writer lock, never under a
lock other writers need but the index's write lock of single transactions. What keeps their
operations in progress safe:
  * segments: only a log's segments wholly before its watermark are rewritten or removed. A
    log's watermark is its applied position, or the start of a group part it staged that is
    not committed yet, whichever is earlier; every chunk of a commit in progress lies after
    its writer's applied position (a writer's log is sequential), so no such chunk is ever in
    a segment compaction touches. This writer's own log has nothing in progress (its writer
    lock is held): all of it may be rewritten, up to its own staged parts.
  * chunk entries: garbage collection keeps the entries that claims and staged parts pin
    (the chunks they reuse), and bumps the GC generation, so a commit planned before it
    re-checks its reused chunks when it claims (claims.py).
  * manifests: every change is one index transaction on what the index holds then (a trim
    remaps only the extents that still lie in the chunk's kept bytes).
  * the index shrink copies under the old index's write lock, syncs the copy without it,
    and swaps under it again only if no transaction committed since the copy (else copies
    again, or gives up); a writer that then gets that lock sees the data file was replaced
    and begins again in the new index (Index.write), so no write lands in a replaced index.
"""
from __future__ import annotations

import os
import time
from collections import defaultdict
from fractions import Fraction

from snapstore.engine import chunks
from snapstore.engine import claims as claim_rules
from snapstore.engine import indexswap
from snapstore.engine import storedir
from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.engine import garbage
from snapstore.engine import writer as wr
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.fsutil import fsync_directory
from snapstore.errors import CorruptionError
from snapstore.engine.index import ChunkEntry, Index, reserve_lock_table
from snapstore.engine.logstate import append_state_section
from snapstore.engine.backends.base import SegmentBackend
from snapstore.engine.reader import buffer_layers
from snapstore.engine.wal import SegmentLog, log_of


def fold_chains(index: Index, max_chain: int) -> int:
    """Rebases buffers whose restore would read more than max_chain manifests. Returns how many
    buffers were folded."""
    folded = 0
    with index.write() as w:
        depths: dict[int, dict[str, int]] = {}
        for cid in w.checkpoint_ids():            # ascending ids: parents before children
            commit = w.checkpoint(cid)
            parent_depths = depths.get(commit.parent, {})
            changed = False
            for i, b in enumerate(commit.buffers):
                depth = 0 if b.base == "full" else parent_depths.get(b.name, b.depth - 1) + 1
                if depth >= max_chain:
                    merged = ext.flatten(buffer_layers(w, commit, b.name))
                    w.put_manifest(cid, i, ext.pack(merged))
                    b.base, depth = "full", 0
                    folded += 1
                if depth != b.depth:
                    b.depth, changed = depth, True
            if changed:
                w.put_checkpoint_info(commit)
            depths[cid] = {b.name: b.depth for b in commit.buffers}
    return folded


def _merge(ranges: list) -> list:
    """Sorted, merged (start, end) intervals of (offset, length) ranges."""
    out: list = []
    for off, length in sorted(ranges):
        if out and off <= out[-1][1]:
            out[-1][1] = max(out[-1][1], off + length)
        else:
            out.append([off, off + length])
    return out


class ChunkUses:
    """Which bytes of which chunks the manifests use (read after folding): uses[chunk] the
    (chunk offset, length) ranges, where[chunk] the (checkpoint, buffer index) pairs, entries
    every chunk entry of the index."""

    def __init__(self, index: Index) -> None:
        self.uses: dict[bytes, list] = defaultdict(list)
        self.where: dict[bytes, set] = defaultdict(set)
        with index.read() as r:
            for cid in r.checkpoint_ids():
                commit = r.checkpoint(cid)
                for bi in range(len(commit.buffers)):
                    for _, coff, length, chunk in fmt.EXTENT.iter_unpack(r.manifest(cid, bi)):
                        self.uses[chunk].append((coff, length))
                        self.where[chunk].add((cid, bi))
            self.entries: dict[bytes, ChunkEntry] = dict(r.chunks())
            self.state = r.log_state()          # the newest state section: live too
            self.pinned = claim_rules.pinned_chunks(r) if r.version >= 3 else set()
        self._bases: set | None = None
        for chunk in self.uses:
            if chunk not in self.entries:
                raise CorruptionError(f"a manifest references missing chunk {chunk.hex()[:16]}…")

    def trim_plan(self, chunk: bytes, threshold: float) -> list | None:
        """The merged intervals of a chunk worth trimming (less than threshold of it used)."""
        intervals = _merge(self.uses[chunk])
        live = sum(b - a for a, b in intervals)
        return intervals if live < threshold * self.entries[chunk].raw_len else None

    def state_bytes(self, backend: SegmentBackend) -> dict[int, int]:
        """{segment: bytes of it} the newest state section occupies."""
        return section_bytes(backend, *self.state) if self.state is not None else {}

    def segment_bytes(self, threshold: float) -> tuple[dict[int, float], dict[int, float]]:
        """({segment: chunk record bytes it holds that are still needed},
        {segment: chunk record bytes a rewrite of it keeps}).

        Needed: each chunk's record in the proportion of its bytes some manifest uses (none
        for a chunk no manifest uses); the whole record of a used delta chunk and of a base
        of a delta chunk (untrimmable). Kept: the record whole, or only that proportion for a
        chunk a rewrite trims (used less than threshold). A rewrite keeps at least the needed
        bytes, and at least `threshold` of every chunk it keeps (it trims the others), so a
        rewritten segment does not qualify again."""
        needed: dict[int, float] = defaultdict(float)
        kept: dict[int, float] = defaultdict(float)
        for chunk, e in self.entries.items():
            ranges = self.uses.get(chunk)
            record = fmt.RECORD_HEADER.size + e.stored_len
            if (ranges or chunk in self.base_ids()) and self.untrimmable(chunk):
                # a base (a delta chunk decodes over all of it) or a used delta chunk (it
                # decodes only whole): needed and kept whole
                needed[e.segment] += record
                kept[e.segment] += record
            elif ranges:
                fraction = min(1.0, sum(b - a for a, b in _merge(ranges)) / max(1, e.raw_len))
                needed[e.segment] += record * fraction
                kept[e.segment] += record * fraction if fraction < threshold else record
        return needed, kept

    def base_ids(self) -> set[bytes]:
        """The chunks a delta chunk that garbage collection keeps names as its base."""
        if self._bases is None:
            dead = garbage.collectable(self.entries, self.pinned)
            self._bases = {e.base for cid, e in self.entries.items()
                           if e.base is not None and cid not in dead}
        return self._bases

    def untrimmable(self, chunk: bytes) -> bool:
        """Whether trimming must leave the chunk whole: a delta chunk (it decodes only
        whole) or the base of one (its whole record stays for the delta chunks anyway)."""
        return self.entries[chunk].base is not None or chunk in self.base_ids()


def trim_chunks(index: Index, log: SegmentLog, backend: SegmentBackend,
                opts: "wr.WriteOptions", threshold: float, found: ChunkUses,
                segments: set) -> tuple[int, int, int, int]:
    """Replaces chunks of the given segments (those about to be rewritten: elsewhere the
    original would stay and the copy only add) that their manifests use less than threshold
    of with chunks of only the used bytes. Returns (chunks trimmed, raw bytes no longer
    kept, record bytes read, record bytes written)."""
    entries, where = found.entries, found.where
    plans = {}
    for chunk in found.uses:
        if entries[chunk].segment in segments and not found.untrimmable(chunk):
            intervals = found.trim_plan(chunk, threshold)
            if intervals is not None:
                plans[chunk] = intervals
    if not plans:
        return 0, 0, 0, 0
    saved = read_bytes = 0
    remap: dict[bytes, tuple] = {}                     # old chunk -> (new chunk, intervals)
    # durable whatever the store's durability: the new records (and the segments they
    # created, with their directory entries) are on disk before the index switches
    with log.durable_append():
        with index.read() as r, backend.open_reader() as segments:
            sink = wr.ChunkSink(log, r, opts)
            for chunk, intervals in plans.items():
                e = entries[chunk]
                data = chunks.read_chunk(segments, e.segment, e.offset, e.stored_len,
                                         chunk, e.raw_len)
                kept = b"".join(data[a:b] for a, b in intervals)
                remap[chunk] = (sink.put(memoryview(kept)), intervals)
                saved += e.raw_len - len(kept)
                read_bytes += fmt.RECORD_HEADER.size + e.stored_len
            new_chunks = dict(sink.new)
    crashpoint("compact_after_trim_copy")
    with index.write() as w:
        for cid, (seg, off, stored, raw, codec) in new_chunks.items():
            if not w.has_chunk(cid):
                w.put_chunk(cid, ChunkEntry(seg, off, stored, raw, 0, codec))
        todo: dict[tuple, None] = {}
        for chunk in remap:
            for key in where[chunk]:
                todo[key] = None
        for ckpt, bi in todo:
            if w.checkpoint(ckpt) is None:
                continue    # another writer deleted it since the plan: nothing to remap
            out = []
            for off, coff, length, chunk in fmt.EXTENT.iter_unpack(w.manifest(ckpt, bi)):
                hit = remap.get(chunk)
                if hit is not None:
                    new_id, intervals = hit
                    base = 0
                    for a, b in intervals:
                        if a <= coff < b:
                            coff, chunk = base + (coff - a), new_id
                            break
                        base += b - a
                    # else: a manifest changed since the plan (another writer's delete made
                    # a child absorb it) and uses bytes of the chunk outside what the trim
                    # kept: it keeps the old chunk, which stays referenced, so stays
                out.append((off, coff, length, chunk))
            w.put_manifest(ckpt, bi, ext.pack(out))
        w.set_applied(log.position)
    return len(remap), saved, read_bytes, sink.bytes_new


def collect_garbage(index: Index) -> tuple[int, int]:
    """Removes index entries of unreferenced chunks, except those an operation in progress
    reuses (claims.pinned_chunks), in one transaction that bumps the GC generation. Returns
    (chunks, record bytes) freed."""
    chunks = nbytes = 0
    with index.write() as w:
        pinned = claim_rules.pinned_chunks(w) if w.version >= 3 else set()
        entries = dict(w.chunks())
        dead = garbage.collectable(entries, pinned)
        edges: dict[bytes, int] = {}
        for cid in dead:
            e = entries[cid]
            w.delete_chunk(cid)
            chunks += 1
            nbytes += fmt.RECORD_HEADER.size + e.stored_len
            if e.base is not None and e.base not in dead and e.base in entries:
                edges[e.base] = edges.get(e.base, 0) - 1     # (a missing base: verify's)
        w.add_ref_counts(edges)     # a delta chunk gone takes its edge off its base
        if dead and w.version >= 3:
            w.bump_gc_generation()
    return chunks, nbytes


def movable_segments(index: Index, backend: SegmentBackend, own_log: int) -> set[int]:
    """The segments compaction may rewrite and remove while other writers write: a log's
    segments wholly before its watermark (its applied position, or the start of the earliest
    group part staged in it and not yet committed), and, of this writer's own log, every
    segment before its earliest staged part (nothing else of it is in progress)."""
    with index.read() as r:
        applied = r.logs()
        parts: dict[int, tuple] = {}
        if r.version >= 3:
            for _, d, _ in r.group_entries():
                start = d.get("start")
                if start is not None:
                    log = log_of(start[0])
                    parts[log] = min(parts.get(log, tuple(start)), tuple(start))
    out = set()
    for n in backend.list():
        log = log_of(n)
        if log == own_log:
            mark = parts.get(log)
        else:
            marks = [m for m in (applied.get(log), parts.get(log)) if m is not None]
            mark = min(marks) if marks else (0, 0)
        if mark is None or n < mark[0]:
            out.add(n)
    return out


def _live_by_segment(index: Index) -> dict[int, list]:
    out: dict[int, list] = {}
    with index.read() as r:
        for cid, e in r.chunks():
            out.setdefault(e.segment, []).append((cid, e))
    return out


def plan_rewrite(payload: dict[int, int], needed: dict[int, float], kept: dict[int, float],
                 state: dict[int, int], threshold: float,
                 max_garbage: float | None) -> list[int]:
    """Which segments to rewrite (pure: the policy of choose_segments). payload: {segment:
    its bytes past the header}; needed/kept: ChunkUses.segment_bytes; state: {segment: bytes
    of the newest state section in it}. Two rules:

    - threshold: a segment of which the still needed bytes (chunks, and the state section)
      are less than threshold;
    - max_garbage (None: off): then, emptiest first (lowest kept fraction), more segments
      until the garbage the others hold (their bytes minus what a rewrite would keep of them)
      is at most max_garbage times the live bytes (`kept` of every segment): so afterwards
      the segments hold at most (1 + max_garbage) times their live chunk bytes, plus headers
      and the state section, and no more is copied than that takes.

    When anything is chosen the rewrite writes a new state section, so the one there is is
    needed no more: the choice is made again without it (so compaction reaches a fixed point:
    run again, it finds nothing to do)."""
    def choose(with_state: bool) -> list[int]:
        st = state if with_state else {}
        live = {n: kept.get(n, 0) + st.get(n, 0) for n in payload}
        chosen = {n for n in payload
                  if needed.get(n, 0) + st.get(n, 0) < threshold * max(1, payload[n])}
        if max_garbage is not None:
            # exact sums (Fraction of each float): a running float total drifts from the sum
            # of what is left by a rounding, which can stop a segment early or late
            garbage = {n: Fraction(max(0.0, payload[n] - live[n]))
                       for n in payload if n not in chosen}
            allowed = Fraction(max_garbage) * sum(Fraction(kept.get(n, 0)) for n in payload)
            left = sum(garbage.values(), Fraction(0))
            for n in sorted(garbage, key=lambda n: (live[n] / max(1, payload[n]), n)):
                if left <= allowed:
                    break
                if garbage[n] > 0:
                    chosen.add(n)
                    left -= garbage[n]
        return sorted(chosen)

    chosen = choose(True)
    return choose(False) if chosen else chosen


def choose_segments(log: SegmentLog, backend: SegmentBackend, needed: dict[int, float],
                    kept: dict[int, float], state: dict[int, int], threshold: float,
                    max_garbage: float | None, movable: set[int]) -> list[int]:
    """The segments to rewrite (plan_rewrite) among the movable ones (movable_segments). The
    open segment of this writer's log is sealed first when it is chosen, so a store smaller
    than a segment gets space back too (issue 14, defect 9); an empty open segment is never
    chosen."""
    payload = {n: max(0, size - fmt.SEGMENT_HEADER.size)
               for n, size in backend.sizes().items() if n in movable}
    chosen = plan_rewrite(payload, needed, kept, state, threshold, max_garbage)
    tail = log.position
    if tail[0] in chosen:
        if tail[1] > fmt.SEGMENT_HEADER.size:
            log.seal()      # the open segment is sparse too: seal it so it can be rewritten
        else:
            chosen.remove(tail[0])
    return [n for n in chosen if log_of(n) != log.log or n < log.position[0]]


def write_state_section(index: Index, log: SegmentLog) -> int:
    """Appends a state section of the index (logstate.py) and makes it durable, whatever the
    store's durability, then notes it in the index. Compaction calls it before it removes any
    segment, so every record of a removed segment is covered by a durable section. Returns
    its size in bytes."""
    order = None
    if index.version >= 3:
        with index.write() as w:
            order = w.take_order()      # before the snapshot: records after it are not in it
            # this writer's own log has nothing in progress (its writer lock is held): it is
            # applied up to its tail, so the section covers all of it up to there
            w.set_applied(log.position)
    with log.durable_append():
        with index.read() as r:
            begin, end = append_state_section(log, r, order)
    crashpoint("compact_after_state")
    with index.write() as w:
        w.set_log_state(begin, end)
        w.set_applied(log.position)
    return sum(section_bytes(log.backend, begin, end).values())


def section_bytes(backend: SegmentBackend, begin: tuple, end: tuple) -> dict[int, int]:
    """{segment: bytes of it} the state section between begin and end occupies."""
    out = {}
    for n in range(begin[0], end[0] + 1):
        start = begin[1] if n == begin[0] else fmt.SEGMENT_HEADER.size
        try:
            stop = end[1] if n == end[0] else backend.size(n)
        except FileNotFoundError:
            continue
        out[n] = max(0, stop - start)
    return out


def rewrite_segments(index: Index, log: SegmentLog, backend: SegmentBackend,
                     targets: list[int]) -> tuple[int, int, int, int]:
    """Copies the live chunks of the target segments (sealed) forward and removes those
    segments, after a durable state section. Returns (segments rewritten, segments removed,
    live bytes copied, state section bytes written)."""
    if not targets:
        return 0, 0, 0, 0
    state_bytes = write_state_section(index, log)
    live = _live_by_segment(index)
    rewritten = removed = copied = 0
    # durable whatever the store's durability: the copies (and the segments they created,
    # with their directory entries) are on disk before the segment they came from goes
    with log.forced_durable():
        for n in targets:
            mark = log.position
            moves = []
            try:
                with backend.open_reader() as segments:
                    for cid, e in sorted(live.get(n, []), key=lambda item: item[1].offset):
                        chunk = chunks.read_stored_chunk(segments, n, e.offset, e.stored_len,
                                                         cid)
                        seg, off = log.append(fmt.REC_CHUNK, chunk.record.codec,
                                              [fmt.CHUNK_PREFIX.pack(cid, chunk.raw_len),
                                               chunk.stored])
                        moves.append((cid, seg, off))
                        copied += fmt.RECORD_HEADER.size + e.stored_len
                log.sync()
            except BaseException:
                log.rollback(mark)   # the index never saw these copies
                raise
            crashpoint("compact_after_copy")
            with index.write() as w:
                for cid, seg, off in moves:
                    e = w.chunk(cid)
                    if e is not None and e.segment == n:
                        w.put_chunk(cid, e._replace(segment=seg, offset=off))
                w.set_applied(log.position)
            index.sync()        # the index no longer points into n, durably, before n goes
            crashpoint("compact_before_remove")
            log.remove(n)
            crashpoint("compact_after_remove")
            rewritten += 1 if moves else 0
            removed += 1
    return rewritten, removed, copied, state_bytes


def index_pays_to_shrink(size: int, used: int) -> bool:
    """Whether a compacting copy of an index of `size` bytes with `used` bytes of pages in
    use is worth making: its free pages are at least half of it and at least
    INDEX_SHRINK_MIN_FREE bytes (a copy costs a few fsyncs, and every reader reopens)."""
    free = size - used
    return free >= INDEX_SHRINK_MIN_FREE and free * 2 >= size


INDEX_SHRINK_MIN_FREE = 64 << 10


def shrink_index(index: Index, store_path: str, *, force: bool = False) -> bool:
    """Step 7: replaces the index by a compacting copy (only its pages in use) when that pays
    (or force): LMDB reuses the pages transactions freed but never gives them back to the
    file system. The copy is written to the staging directory, made durable, and swapped in
    by indexswap.swap_in, the mechanism repair uses (crash-safe at any moment: the old or the
    new index, identical in content); this Index, and every Index of any process, moves to it
    at its next transaction. Writers are kept out by the caller (the writer lock). Returns
    whether the index was replaced. A copy LMDB refuses (it does for a page leak) leaves the
    index as it is (StoreIOError)."""
    size, used = index.space()
    if not force and not index_pays_to_shrink(size, used):
        return False
    staging = indexswap.staging_dir(store_path)
    indexswap.remove_entry(staging)         # what an interrupted swap left
    os.mkdir(staging, storedir.dir_mode(index.file_mode))

    def swap() -> None:
        # a full disk fails here, before the swap, not in the reopen after it
        reserve_lock_table(staging, index.file_mode)
        fsync_directory(staging)
        fsync_directory(store_path)
        crashpoint("compact_before_index_swap")
        indexswap.swap_in(store_path, staging)
    try:
        # other writers' transactions wait for the old index's write lock during the copy and
        # the swap (not the copy's sync), then see it was replaced and begin again in the
        # new one (Index.write); if they kept committing, the shrink is left for later
        swapped = index.copy_compacted(staging, then=swap)
    except BaseException:
        if os.path.lexists(os.path.join(store_path, fmt.INDEX_DIR)):
            indexswap.remove_entry(staging)
        raise
    if not swapped:
        indexswap.remove_entry(staging)
        return False
    crashpoint("compact_after_index_swap")
    index.refresh()                         # moves this Index to the new one now
    return True


def compact(index: Index, log: SegmentLog, backend: SegmentBackend, *, threshold: float,
            max_chain: int, opts: "wr.WriteOptions",
            max_garbage: float | None = fmt.DEFAULT_COMPACT_MAX_GARBAGE,
            shrink: bool | None = None) -> dict:
    """Runs fold, trim, gc, rewrite and the index shrink; returns the report. shrink: True
    always copies the index compacted, False never, None when it pays."""
    started = time.perf_counter()
    index_before = index.disk_bytes()
    before = sum(backend.sizes().values())
    folded = fold_chains(index, max_chain)
    found = ChunkUses(index)
    needed, kept = found.segment_bytes(threshold)
    targets = choose_segments(log, backend, needed, kept, found.state_bytes(backend),
                              threshold, max_garbage,
                              movable_segments(index, backend, log.log))
    trimmed, trimmed_bytes, trim_read, trim_written = trim_chunks(index, log, backend, opts,
                                                                  threshold, found, set(targets))
    del found
    freed, freed_bytes = collect_garbage(index)
    index.sync()
    rewritten, removed, copied, state_bytes = rewrite_segments(index, log, backend, targets)
    after = sum(backend.sizes().values())
    shrunk = False
    if shrink is not False:
        shrunk = shrink_index(index, os.path.dirname(os.path.abspath(index.path)),
                              force=bool(shrink))
    index_after = index.disk_bytes()
    return {"bytes_before": before, "bytes_after": after, "bytes_returned": before - after,
            "index_bytes_before": index_before, "index_bytes_after": index_after,
            "index_shrunk": shrunk,
            "store_bytes_before": before + index_before,
            "store_bytes_after": after + index_after,
            "chunks_freed": freed, "garbage_bytes_freed": freed_bytes,
            "segments_rewritten": rewritten, "segments_removed": removed,
            "live_bytes_copied": copied, "chains_folded": folded,
            "chunks_trimmed": trimmed, "trimmed_bytes": trimmed_bytes,
            "trim_bytes_read": trim_read, "trim_bytes_written": trim_written,
            "state_section_bytes": state_bytes,
            "seconds": time.perf_counter() - started}
