"""Compaction: fold long incremental chains, drop unreferenced chunks, rewrite sparse segments.

Order and invariants (docs/design.md, "Compaction"):
  1. fold: a buffer whose chain is longer than max_chain gets one full manifest resolved from
     its layers. Only manifests change (no bytes are copied); what it restores to is unchanged.
  2. trim: a chunk of which manifests reference less than `threshold` of its bytes (the rest
     was overwritten in every checkpoint that still uses it) is replaced by a chunk holding
     only the referenced bytes; extents are remapped. The new records are synced (with the
     segments directory) before the index transaction that switches to them.
  3. gc: chunk entries with reference count 0 leave the index.
  4. rewrite: every sealed segment whose live fraction is below the threshold has its live
     chunk records copied to the log's tail; the log is synced, the index is pointed at the
     copies and the applied position moved to the tail in one transaction, LMDB is flushed to
     disk, and only then is the old segment removed. So the index never points into a removed
     segment, even after a crash or power cut at any moment; running compact() again after a
     crash finishes the job (left-over copies are unreferenced records, reclaimed next time).
All steps are index transactions that leave checkpoint contents unchanged, so they need no log
record: losing one to a crash only loses the work, never data.
"""
from __future__ import annotations

import time
from collections import defaultdict

from snapstore.engine import chunks
from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.engine import writer as wr
from snapstore.engine.crashpoints import crashpoint
from snapstore.errors import CorruptionError
from snapstore.engine.index import ChunkEntry, Index
from snapstore.engine.backends.base import SegmentBackend
from snapstore.engine.reader import buffer_layers
from snapstore.engine.wal import SegmentLog


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


def trim_chunks(index: Index, log: SegmentLog, backend: SegmentBackend,
                opts: "wr.WriteOptions", threshold: float) -> tuple[int, int, int, int]:
    """Replaces chunks mostly unreferenced by their manifests with chunks of only the
    referenced bytes. Returns (chunks trimmed, raw bytes no longer kept, record bytes read,
    record bytes written)."""
    uses: dict[bytes, list] = defaultdict(list)        # chunk -> [(chunk offset, length)]
    where: dict[bytes, set] = defaultdict(set)         # chunk -> {(checkpoint, buffer index)}
    with index.read() as r:
        for cid in r.checkpoint_ids():
            commit = r.checkpoint(cid)
            for bi in range(len(commit.buffers)):
                for _, coff, length, chunk in fmt.EXTENT.iter_unpack(r.manifest(cid, bi)):
                    uses[chunk].append((coff, length))
                    where[chunk].add((cid, bi))
        entries = {c: r.chunk(c) for c in uses}
    plans = {}
    for chunk, ranges in uses.items():
        entry = entries[chunk]
        if entry is None:
            raise CorruptionError(f"a manifest references missing chunk {chunk.hex()[:16]}…")
        intervals = _merge(ranges)
        live = sum(b - a for a, b in intervals)
        if live < threshold * entry.raw_len:
            plans[chunk] = intervals
    if not plans:
        return 0, 0, 0, 0
    mark = log.position
    saved = read_bytes = 0
    remap: dict[bytes, tuple] = {}                     # old chunk -> (new chunk, intervals)
    try:
        # durable whatever the store's durability: the new records (and the segments they
        # created, with their directory entries) are on disk before the index switches
        with log.forced_durable():
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
            log.sync()
    except BaseException:
        log.rollback(mark)
        raise
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
                    else:
                        raise CorruptionError("an extent lies outside its chunk's live bytes")
                out.append((off, coff, length, chunk))
            w.put_manifest(ckpt, bi, ext.pack(out))
        w.set_applied(log.position)
    return len(remap), saved, read_bytes, sink.bytes_new


def collect_garbage(index: Index) -> tuple[int, int]:
    """Removes index entries of unreferenced chunks. Returns (chunks, record bytes) freed."""
    chunks = nbytes = 0
    with index.write() as w:
        dead = [(cid, e) for cid, e in w.chunks() if e.refs == 0]
        for cid, e in dead:
            w.delete_chunk(cid)
            chunks += 1
            nbytes += fmt.RECORD_HEADER.size + e.stored_len
    return chunks, nbytes


def _live_by_segment(index: Index) -> dict[int, list]:
    out: dict[int, list] = {}
    with index.read() as r:
        for cid, e in r.chunks():
            out.setdefault(e.segment, []).append((cid, e))
    return out


def rewrite_segments(index: Index, log: SegmentLog, backend: SegmentBackend,
                     threshold: float) -> tuple[int, int, int]:
    """Copies the live chunks of sparse sealed segments forward and removes those segments.
    Returns (segments rewritten, segments removed, live bytes copied)."""
    live = _live_by_segment(index)

    def live_fraction(n: int) -> float:
        size = backend.size(n)
        used = sum(fmt.RECORD_HEADER.size + e.stored_len for _, e in live.get(n, []))
        return used / max(1, size - fmt.SEGMENT_HEADER.size)

    if log.position[1] > fmt.SEGMENT_HEADER.size and \
            live_fraction(log.position[0]) < threshold:
        log.seal()      # the open segment is sparse too: seal it so it can be rewritten
    current = log.position[0]
    rewritten = removed = copied = 0
    # durable whatever the store's durability: the copies (and the segments they created,
    # with their directory entries) are on disk before the segment they came from goes
    with log.forced_durable():
        for n in backend.list():    # listed once: segments the copies create are not revisited
            if n >= current or live_fraction(n) >= threshold:
                continue
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
                        w.put_chunk(cid, ChunkEntry(seg, off, e.stored_len, e.raw_len, e.refs,
                                                    e.codec))
                w.set_applied(log.position)
            index.sync()        # the index no longer points into n, durably, before n goes
            crashpoint("compact_before_remove")
            log.remove(n)
            crashpoint("compact_after_remove")
            rewritten += 1 if moves else 0
            removed += 1
    return rewritten, removed, copied


def compact(index: Index, log: SegmentLog, backend: SegmentBackend, *, threshold: float,
            max_chain: int, opts: "wr.WriteOptions") -> dict:
    """Runs fold, trim, gc and rewrite; returns the report."""
    started = time.perf_counter()
    before = sum(backend.size(n) for n in backend.list())
    folded = fold_chains(index, max_chain)
    trimmed, trimmed_bytes, trim_read, trim_written = trim_chunks(index, log, backend, opts,
                                                                  threshold)
    freed, freed_bytes = collect_garbage(index)
    index.sync()
    rewritten, removed, copied = rewrite_segments(index, log, backend, threshold)
    after = sum(backend.size(n) for n in backend.list())
    return {"bytes_before": before, "bytes_after": after, "bytes_returned": before - after,
            "chunks_freed": freed, "garbage_bytes_freed": freed_bytes,
            "segments_rewritten": rewritten, "segments_removed": removed,
            "live_bytes_copied": copied, "chains_folded": folded,
            "chunks_trimmed": trimmed, "trimmed_bytes": trimmed_bytes,
            "trim_bytes_read": trim_read, "trim_bytes_written": trim_written,
            "seconds": time.perf_counter() - started}
