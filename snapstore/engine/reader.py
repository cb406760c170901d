"""The restore path: resolve a buffer's chain of manifests and copy checked chunk bytes out.

A buffer of checkpoint C is its nearest full manifest up the parent chain with every later
delta written over it, oldest first. Every chunk read is checked against its record checksum
(and the chunk id in the record) before its bytes are used; a mismatch raises CorruptionError
naming the segment and offset, so wrong bytes are never returned.
"""
from __future__ import annotations

import bisect
import collections
import os
import threading
from typing import Callable, TypeVar

from snapstore import _native as native
from snapstore import halves
from snapstore.engine import chunks
from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.errors import (CheckpointNotFound, ConcurrentCompactionError, CorruptionError,
                              InvalidArgumentTypeError)
from snapstore.engine.backends.base import SegmentBackend, SegmentReader
from snapstore.engine.index import IndexView
from snapstore.engine.memory import uninit_bytearray
from snapstore.engine.records import BufferEntry, Commit
from snapstore.engine.wal import damaged_record, segment_version

T = TypeVar("T")

# Times a composite read (export, copy, diff) is made again, each on a new index snapshot,
# when a compaction moved the chunks it was reading (ConcurrentCompactionError)
READ_ATTEMPTS = 5


def retry_moved(read: Callable[[], T], what: str, attempts: int = READ_ATTEMPTS) -> T:
    """read(), made again when it raised ConcurrentCompactionError (a compaction removed a
    segment it was reading: the index, read afresh, places those chunks elsewhere), up to
    `attempts` times in all; then ConcurrentCompactionError naming `what`. For reads that
    leave nothing behind when they fail and that take a new index snapshot each time (a
    checkpoint deleted meanwhile is then CheckpointNotFound)."""
    for _ in range(attempts - 1):
        try:
            return read()
        except ConcurrentCompactionError:
            continue
    try:
        return read()
    except ConcurrentCompactionError as exc:
        raise ConcurrentCompactionError(f"{what}: compactions moved its chunks while it was "
                                        f"read, {attempts} times in a row; retry "
                                        f"({exc})") from None


def buffer_layers(view: IndexView, commit: Commit, name: str) -> list[list]:
    """Extent lists of buffer `name` from its nearest full manifest to `commit`, oldest first."""
    layers = []
    size = _buffer(view, commit, name).size
    current = commit
    while True:
        idx = view.buffer_position(current, name)
        if idx is None or current.buffers[idx].size != size:
            raise CorruptionError(f"checkpoint {current.id} lacks buffer {name!r} of {size} bytes "
                                  f"that checkpoint {commit.id} builds on")
        layers.append(view.extents(current, idx))      # checked: sorted, inside, covering
        if current.buffers[idx].base == "full":
            break
        if current.parent is None or current.parent >= current.id:   # parents are older
            raise CorruptionError(f"checkpoint {current.id} is a delta without a valid parent")
        current = view.chain_checkpoint(current.parent, f"checkpoint {current.id} (its parent)")
    layers.reverse()
    return layers


def _buffer(view: IndexView, commit: Commit, name: str) -> BufferEntry:
    """find_buffer, through the view's positions (a lookup, not a scan, per call)."""
    at = view.buffer_position(commit, name) if isinstance(name, str) else None
    return commit.buffers[at] if at is not None else find_buffer(commit, name)


def find_buffer(commit: Commit, name: str) -> BufferEntry:
    if not isinstance(name, str):
        raise InvalidArgumentTypeError(f"a buffer name must be a str, got "
                                       f"{type(name).__name__}")
    for b in commit.buffers:
        if b.name == name:
            return b
    raise CheckpointNotFound(f"checkpoint {commit.id} has no buffer {name!r} "
                             f"(it has {sorted(b.name for b in commit.buffers)})")


class ChunkReader:
    """Reads checked, decoded chunks, keeping the most recent ones (up to CACHE_BYTES): the
    extents of a packed delta chunk, or of a rebased manifest, often revisit a chunk.
    entries: chunk_entries() already looked up for this read, if any."""

    CACHE_BYTES = 8 << 20

    def __init__(self, backend: SegmentBackend, segments: SegmentReader, view: IndexView,
                 entries: dict | None = None) -> None:
        self.backend, self.segments, self.view = backend, segments, view
        self.entries = entries if entries is not None else {}
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._cached = 0
        self._versions_checked: set[int] = set()
        self._buffers = threading.local()   # read_many's decode buffers, per thread
        self._lock = threading.Lock()       # read_many's use of the index and the session

    def read(self, chunk_id: bytes) -> bytes | memoryview:
        hit = self._cache.get(chunk_id)
        if hit is not None:
            self._cache.move_to_end(chunk_id)
            return hit
        data = self._read(chunk_id)
        self._cache[chunk_id] = data
        self._cached += len(data)
        while self._cached > self.CACHE_BYTES and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached -= len(old)
        return data

    def read_many(self, chunk_ids: list) -> list:
        """The raw bytes of each chunk, read afresh (not kept: a writer reads each base it
        codes new chunks against once), or None for one that cannot be read (damaged,
        missing, moved). Plain chunks are decoded together by the C core into one buffer
        (decode_whole_chunks, through a read session of its own: threads may call this at
        once); the others, and all of them after a failure there, one at a time."""
        with self._lock:
            entries = {cid: self._entry(cid) for cid in chunk_ids}
        if all(e is not None and e.base is None for e in entries.values()):
            extents, pos = [], 0
            for cid in chunk_ids:
                extents.append((pos, 0, entries[cid].raw_len, cid))
                pos += entries[cid].raw_len
            out = memoryview(uninit_bytearray(pos))
            if not hasattr(self._buffers, "own"):
                self._buffers.own = {}
            try:
                with self.backend.open_reader() as own:
                    for number in {e.segment for e in entries.values()}:
                        segment_version(own, number)
                    decode_whole_chunks(own, extents, entries, out, 0, self._buffers.own)
                return [out[at:at + n] for at, _, n, _ in extents]
            except (CorruptionError, OSError):
                pass        # which chunk, and why: the one-at-a-time reads below
        with self._lock:
            return [self._read_or_none(cid) for cid in chunk_ids]

    def _read_or_none(self, chunk_id: bytes):
        try:
            return self._read(chunk_id)
        except (CorruptionError, OSError):      # damaged or unreadable (EIO): not moved,
            return None                         # not newer (those are raised)

    def read_into(self, chunk_id: bytes, out: memoryview) -> bool:
        """Decodes the chunk straight into out when out is exactly as long as the chunk (a
        whole-chunk extent: most of a full manifest) and the chunk is not cached; returns
        whether it did (else the caller copies from read()). Skips the cache: a whole chunk
        is rarely wanted again by the same restore, and it costs no copy."""
        if chunk_id in self._cache:
            return False
        entry = self._entry(chunk_id)
        if entry is None or entry.raw_len != len(out):
            return False
        self._read(chunk_id, entry, out)
        return True

    def hold(self) -> None:
        """Opens the segments of `entries` now, reading each one's header (its version is
        checked), so that a compaction that removes one while this session reads keeps it
        readable to the session (a removed file lives while it is open): only a segment
        removed before this call makes a read of its chunks ConcurrentCompactionError. For
        a long read of many chunks in this one session (with_manifests' read_chunks)."""
        for number in sorted({e.segment for e in self.entries.values() if e is not None}):
            if number not in self._versions_checked:
                self._check_version(number)

    def _entry(self, chunk_id: bytes):
        entry = self.entries.get(chunk_id)
        return entry if entry is not None else self.view.chunk(chunk_id)

    def _read(self, chunk_id: bytes, entry=None, out=None, depth: int | None = None
              ) -> bytes | memoryview:
        """The chunk's raw bytes (in out, when given). depth: what the delta chunk that names
        this chunk as its base says it must be (0: a plain chunk), checked."""
        if entry is None:
            entry = self._entry(chunk_id)
        if entry is None:
            raise CorruptionError(f"the store has no chunk {chunk_id.hex()[:16]}… (when a "
                                  "checkpoint's manifest names it, the index is damaged: "
                                  "`snapstore repair` rebuilds it from the log; when repair "
                                  "already reported this checkpoint, its bytes are lost)")
        if entry.segment not in self._versions_checked:
            self._check_version(entry.segment)
        try:
            if entry.codec == fmt.CODEC_DELTA_PLANES or depth:
                return self._read_delta(chunk_id, entry, out, depth)
            return chunks.read_chunk(self.segments, entry.segment, entry.offset,
                                     entry.stored_len, chunk_id, entry.raw_len, out)
        except CorruptionError:
            if self._moved(chunk_id, entry):
                raise ConcurrentCompactionError(
                    f"chunk {chunk_id.hex()[:16]}… was moved by a compaction while this read "
                    "ran; retry the read") from None
            raise

    def _read_delta(self, chunk_id: bytes, entry, out, depth: int | None
                    ) -> bytes | memoryview:
        """A delta chunk's raw bytes: its base's (read first, into out when given), with the
        delta applied. Each base must be one level less deep than the chunk naming it, down
        to a plain chunk, so a chain ends (at most fmt.MAX_DELTA_DEPTH reads) whatever the
        records say."""
        chunk = chunks.read_stored_chunk(self.segments, entry.segment, entry.offset,
                                         entry.stored_len, chunk_id)
        record = chunk.record
        if chunk.raw_len != entry.raw_len:
            raise damaged_record("chunk has the wrong length", record.segment, record.offset,
                                 record.end)
        if record.codec != fmt.CODEC_DELTA_PLANES:
            raise damaged_record(f"the base of a delta chunk at depth {depth + 1} is a plain "
                                 "chunk, not a delta chunk", record.segment, record.offset,
                                 record.end)
        base_id, own = chunks.delta_base(chunk)
        if depth is not None and own != depth:
            raise damaged_record(f"the base of a delta chunk at depth {depth + 1} is at "
                                 f"depth {own}", record.segment, record.offset, record.end)
        base_entry = self._entry(base_id)
        if base_entry is None:
            raise CorruptionError(f"the store has no chunk {base_id.hex()[:16]}…, the base "
                                  f"of delta chunk {chunk_id.hex()[:16]}… (`snapstore "
                                  "repair`; when repair already reported this checkpoint, its "
                                  "bytes are lost)")
        if base_entry.raw_len != chunk.raw_len:
            raise damaged_record(f"delta chunk of {chunk.raw_len} bytes names a base of "
                                 f"{base_entry.raw_len}", record.segment, record.offset,
                                 record.end)
        if out is not None and len(out) == chunk.raw_len:
            self._read(base_id, base_entry, out, own - 1)
            return chunks.decode_delta(chunk, out, out)
        return chunks.decode_delta(chunk, self._read(base_id, base_entry, None, own - 1))

    def _check_version(self, number: int) -> None:
        """FormatError for a segment of a newer version than this library reads (checked once
        per segment and read session). A damaged header is left to the records, each of which
        is checked on its own."""
        try:
            segment_version(self.segments, number)
        except CorruptionError:
            pass
        self._versions_checked.add(number)

    def _moved(self, chunk_id: bytes, entry) -> bool:
        """True when the index, read afresh, no longer places the chunk where this read's
        snapshot did (a compaction ran in between) and the old segment is gone."""
        if entry.segment in self.backend.list():
            return False
        self.view.index.refresh()       # afresh: the index itself may have been replaced
        with self.view.index.read() as fresh:
            now = fresh.chunk(chunk_id)
        return now is None or (now.segment, now.offset) != (entry.segment, entry.offset)


def restore_range(view: IndexView, backend: SegmentBackend, commit: Commit, name: str,
                  out: memoryview, start: int = 0,
                  progress: Callable[[int], None] | None = None) -> None:
    """Writes bytes [start, start + len(out)) of buffer `name` of `commit` into out."""
    end = start + len(out)
    whole = start == 0 and end == _buffer(view, commit, name).size
    layers = [layer if whole else ext.clip(layer, start, end)
              for layer in buffer_layers(view, commit, name)]
    with backend.open_reader() as segments:
        entries = chunk_entries(view, [e for layer in layers for e in layer])
        reader = ChunkReader(backend, segments, view, entries)
        segments.prefetch(record_ranges(entries))
        for depth, extents in enumerate(layers):
            if depth == 0:      # the full base writes every byte of out: none is left unfilled
                ext.check_fills(extents, start, end, f"checkpoint {commit.id} buffer {name!r}")
            reported = copy_extents_parallel(entries, backend, segments, extents, out, start,
                                             progress, fresh=depth == 0)
            if depth == 0 and reported is not True:
                prefault(out)
            if reported is not True:
                copy_extents(reader, extents, out, start, _skipping(progress, reported))


PREFAULT_MIN_BYTES = 1 << 20


def prefault(out: memoryview) -> None:
    """Maps in the pages of a large destination in one system call when it is fresh memory
    (a new tensor, array or bytes object), instead of a page fault per 4 KiB as the copy
    reaches them (native.prefault_write: about 3x faster; a warm restore of new tensors spent
    40% of its time in page faults). A hint: a kernel that cannot do it changes nothing."""
    if len(out) >= PREFAULT_MIN_BYTES:
        try:
            native.prefault_write(out)
        except OSError:
            pass


PARALLEL_MIN_BYTES = 1 << 20    # a layer this large is decoded in batches, by C, on threads
PARALLEL_BATCH_BYTES = 4 << 20
DECODE_THREADS = min(4, os.cpu_count() or 1)   # the caller's thread and up to 3 more


def batch_bytes(total: int, threads: int) -> int:
    """The size of a layer's batches: at most PARALLEL_BATCH_BYTES, and as many batches as a
    multiple of the threads, so that no thread decodes a last batch alone while the others
    wait (a 12 MiB tensor in 4 MiB batches kept one of two threads idle for a third of its
    restore: a warm torch load took 12% longer than in 3 MiB batches)."""
    count = -(-total // PARALLEL_BATCH_BYTES)
    count = -(-count // threads) * threads
    return max(1, -(-total // count))


def copy_extents_parallel(entries: dict, backend: SegmentBackend, segments: SegmentReader,
                          extents, out: memoryview, start: int,
                          progress: Callable[[int], None] | None = None,
                          fresh: bool = False) -> "bool | int":
    """copy_extents for a large layer: its extents in batches of PARALLEL_BATCH_BYTES, on up
    to DECODE_THREADS threads when there are several (extents of one layer never overlap, so
    the threads write disjoint bytes). A batch's whole-chunk extents (most of a layer) are
    read one run of back-to-back records at a time and checked and decoded by the C core
    without the GIL (decode_whole_chunks); the rest go through chunks.read_chunk. Returns True
    when done. entries: chunk_entries() of (at least) these extents. A small layer is left to
    the caller (0: nothing done or reported); so is a layer with a chunk the index lacks or a
    delta chunk (its base is read first: ChunkReader), or where anything failed: the caller's
    copy_extents redoes it one chunk at a time, whose errors are the authoritative ones (a
    chunk a compaction moved: ConcurrentCompactionError; damage: CorruptionError), and the int
    returned is how many bytes progress() was already told of. fresh: out may be fresh
    memory; each batch maps its part in first (prefault), so the page faults too are spread
    over the threads."""
    total = sum(e[2] for e in extents)
    if total < PARALLEL_MIN_BYTES:
        return 0
    if not _decodable_here(extents, entries):
        return 0
    checked: set = set()        # segments whose version was checked (by any thread)
    target = batch_bytes(total, DECODE_THREADS)
    batches, batch, size = [], [], 0
    for e in extents:
        batch.append(e)
        size += e[2]
        if size >= target:
            batches.append((batch, size))
            batch, size = [], 0
    if batch:
        batches.append((batch, size))

    buffers = threading.local()     # each thread's decode buffers, reused across its batches

    def copy_batch(work) -> int:
        batch, size = work
        if fresh:
            first, last = batch[0], batch[-1]
            prefault(out[first[0] - start:last[0] + last[2] - start])
        with backend.open_reader() as own:
            # FormatError for a newer segment; checked as the batches reach each segment, so
            # that decoding begins as soon as the first blocks arrive from an object store
            used = [entries[cid] for _, _, _, cid in batch]
            used += [entries[e.base] for e in used if e.base is not None]
            for number in {e.segment for e in used} - checked:
                try:
                    segment_version(own, number)
                except CorruptionError:
                    pass
                checked.add(number)
            whole, part, deltas = [], [], []
            for e in batch:
                if entries[e[3]].base is not None:
                    deltas.append(e)
                    whole.append((e[0], 0, e[2], entries[e[3]].base))   # its base first
                else:
                    (whole if e[1] == 0 and e[2] == entries[e[3]].raw_len else part).append(e)
            if not hasattr(buffers, "own"):
                buffers.own = {}
            decode_whole_chunks(own, whole, entries, out, start, buffers.own)
            decode_whole_chunks(own, deltas, entries, out, start, buffers.own)
            spans = SpanReader(own, [entries[cid] for _, _, _, cid in part])
            decoded: dict = {}
            for off, coff, length, cid in part:
                entry = entries[cid]
                data = decoded.get(cid)
                if data is None:
                    data = chunks.read_chunk(spans, entry.segment, entry.offset,
                                             entry.stored_len, cid, entry.raw_len)
                    decoded = {cid: data}       # packed deltas revisit the last chunk
                if coff + length > len(data):
                    raise CorruptionError(f"manifest extent exceeds chunk {cid.hex()[:16]}…")
                out[off - start:off - start + length] = memoryview(data)[coff:coff + length]
        return size
    finished, reported = share_work(batches, copy_batch, min(DECODE_THREADS, len(batches)),
                                    progress)
    return True if finished else reported


def _decodable_here(extents, entries: dict) -> bool:
    """Whether copy_extents_parallel decodes the extents: every chunk in the index, and each
    delta chunk used whole over a plain base the index has (what writers make: a delta
    chunk's base is then decoded into place first, and the delta applied over it)."""
    for _, coff, length, cid in extents:
        entry = entries.get(cid)
        if entry is None:
            return False
        if entry.base is not None:
            base = entries.get(entry.base)
            if coff or length != entry.raw_len or base is None or base.base is not None:
                return False
    return True


def share_work(batches: list, work: Callable, threads: int,
               progress: Callable[[int], None] | None) -> tuple[bool, int]:
    """work(batch) for every batch, each once, on `threads` threads: the caller's and
    threads - 1 started for it (it works at once instead of waiting for a pool to start), each
    taking the next batch until none is left. progress(n) is told each batch's result, in the
    caller's thread, as the caller finishes each batch of its own and at the end. When a batch
    raises CorruptionError or OSError no batch is begun any more. Returns (True, the sum of
    the results) when every batch is done, else (False, what progress() was told of in sum);
    any other exception is raised as it is."""
    lock = threading.Lock()
    todo = iter(batches)
    done: list = []             # results not yet reported
    failures: list = []
    stopped = [False]
    reported = 0

    def take():
        with lock:
            return None if failures or stopped[0] else next(todo, None)

    def run(report: bool) -> None:
        nonlocal reported
        while (batch := take()) is not None:
            try:
                n = work(batch)
            except BaseException as exc:
                with lock:
                    failures.append(exc)
                return
            with lock:
                done.append(n)
            if report and progress is not None:
                with lock:
                    ready, done[:] = list(done), []
                for n in ready:
                    progress(n)
                    reported += n
    helpers = [halves.start(lambda: run(False)) for _ in range(threads - 1)]
    try:
        run(True)
    finally:            # also when progress() raised: no batch is begun any more
        with lock:
            stopped[0] = True
        for helper in helpers:
            helper.wait()
    if failures:
        first = failures[0]
        if isinstance(first, (CorruptionError, OSError)):
            return False, reported
        raise first
    for n in done:
        if progress is not None:
            progress(n)
        reported += n
    return True, reported


def decode_whole_chunks(segments: SegmentReader, extents, entries: dict, out: memoryview,
                        start: int, buffers: dict | None = None) -> None:
    """Writes each extent's whole chunk (extents (offset, 0, chunk's raw length, chunk id);
    entries: chunk id -> index entry) to out[offset - start:]: the chunk records are read one
    run of back-to-back records at a time (segments.read_pieces: into a run buffer, or views
    of memory the backend holds them in already) and checked and decoded by
    native.read_chunks (the same checks as chunks.read_chunk). buffers: the run and scratch
    buffers of an earlier call on the same thread, reused (fresh memory costs a page fault
    per page). Raises CorruptionError (DamagedRecord) at the first record that fails, naming
    only why: the caller redoes the work on the path whose errors are authoritative."""
    records = [entries[e[3]] for e in extents]
    runs = record_runs(records)
    if not runs:
        return
    buffers = {} if buffers is None else buffers
    scratch = _at_least(buffers, "scratch", max(entry.raw_len for entry in records))
    run_buffer = _at_least(buffers, "run", max(end - first for _, first, end, _ in runs))
    for number, first, end, members in runs:
        with segments.read_pieces(number, first, memoryview(run_buffer)[:end - first]) as pieces:
            if sum(len(view) for _, view in pieces) != end - first:
                raise damaged_record("chunk records are truncated", number, first)
            for at, view, reads in _reads_by_piece(pieces, members, records, extents, start,
                                                  buffers):
                done, reason = native.read_chunks(view, out, reads, scratch)
                if done != len(reads):
                    raise damaged_record("chunk record fails its checks: "
                                         f"{native.READ_REASONS[reason]}", number,
                                         at + reads[done][0])


def _reads_by_piece(pieces: list, members: list, records: list, extents, start: int,
                    buffers: dict):
    """(segment offset of view, view, native.read_chunks reads) for the records of one run
    (positions `members` in records and extents), which read_pieces gave as `pieces`: the
    records inside each piece are read from it in place; one that spans two pieces (a block
    boundary) is first copied whole into buffers["stitch"] (one record at a time)."""
    if len(pieces) == 1:
        at, view = pieces[0]
        yield at, view, [_chunk_read(records[i], records[i].offset - at, extents[i][0] - start,
                                     extents[i][3]) for i in members]
        return
    starts = [p[0] for p in pieces]
    header = fmt.RECORD_HEADER.size
    grouped: list = [[] for _ in pieces]
    spanning = []
    for i in members:
        rec = records[i]
        k = bisect.bisect_right(starts, rec.offset) - 1
        at, view = pieces[k]
        if rec.offset + header + rec.stored_len <= at + len(view):
            grouped[k].append(_chunk_read(rec, rec.offset - at, extents[i][0] - start,
                                          extents[i][3]))
        else:
            spanning.append(i)
    for (at, view), reads in zip(pieces, grouped):
        if reads:
            yield at, view, reads
    for i in spanning:
        rec = records[i]
        size = header + rec.stored_len
        stitch = memoryview(_at_least(buffers, "stitch", size))[:size]
        k = bisect.bisect_right(starts, rec.offset) - 1
        got = 0
        while got < size:
            at, view = pieces[k]
            lo = rec.offset + got - at
            n = min(size - got, len(view) - lo)
            stitch[got:got + n] = view[lo:lo + n]
            got += n
            k += 1
        yield rec.offset, stitch, [_chunk_read(rec, 0, extents[i][0] - start, extents[i][3])]


def _chunk_read(entry, src_off: int, dst_off: int, chunk_id: bytes) -> tuple:
    """The native.read_chunks read of chunk_id's record (its index entry): with its base's
    id for a delta chunk, whose base the destination holds already."""
    if entry.base is None:
        return (src_off, dst_off, entry.stored_len, entry.raw_len, chunk_id)
    return (src_off, dst_off, entry.stored_len, entry.raw_len, chunk_id, entry.base)


def _at_least(buffers: dict, name: str, size: int) -> bytearray:
    """buffers[name], replaced by a larger (uninitialised) one when it is smaller than size."""
    buf = buffers.get(name)
    if buf is None or len(buf) < size:
        buf = buffers[name] = uninit_bytearray(size)
    return buf


def record_runs(entries) -> list:
    """The runs of back-to-back chunk records of `entries` (index entries, in the order they
    will be read), in that order: [segment, first record's offset, end, [positions in
    entries]]. An entry whose record the current run holds already (a chunk used again) joins
    it; one whose record begins where the run ends extends it; any other begins a new run."""
    runs: list = []
    for i, e in enumerate(entries):
        end = e.offset + fmt.RECORD_HEADER.size + e.stored_len
        run = runs[-1] if runs else None
        if run is None or run[0] != e.segment or not (
                e.offset == run[2] or run[1] <= e.offset and end <= run[2]):
            run = [e.segment, e.offset, end, []]
            runs.append(run)
        run[2] = max(run[2], end)
        run[3].append(i)
    return runs


class SpanReader(SegmentReader):
    """A read session over `inner` that reads each run of back-to-back chunk records of
    `entries` (index entries, in the order they will be read) with one read when its first
    record is asked for, and serves the run's records from memory: one read (one system call,
    one trip through an object store's cache) per run instead of one per chunk. Anything
    outside a run, or past the end of a short read, is read from `inner`, whose errors stand.
    Holds one run at a time. Closing it leaves `inner` open."""

    def __init__(self, inner: SegmentReader, entries) -> None:
        self.inner = inner
        self.runs: dict = {}    # (segment, its first record's offset) -> [segment, start, end]
        for segment, start, end, _ in record_runs(entries):
            run = self.runs.setdefault((segment, start), [segment, start, end])
            run[2] = max(run[2], end)
        self._held = (None, 0, b"")     # (segment, offset, bytes) of the run read last

    def read(self, number: int, offset: int, length: int) -> bytes:
        seg, at, data = self._held
        if seg != number or not at <= offset or offset + length > at + len(data):
            run = self.runs.get((number, offset))
            if run is None or offset + length > run[2]:
                return self.inner.read(number, offset, length)
            at, data = offset, self.inner.read(number, offset, run[2] - offset)
            self._held = (number, at, data)
            if offset + length > at + len(data):        # a short read: let inner answer
                return self.inner.read(number, offset, length)
        return memoryview(data)[offset - at:offset - at + length]

    def close(self) -> None:
        self._held = (None, 0, b"")


def _skipping(progress: Callable[[int], None] | None, skip: int):
    """progress, silent for the first `skip` bytes (already reported)."""
    if progress is None or not skip:
        return progress
    left = [skip]

    def report(n: int) -> None:
        quiet = min(n, left[0])
        left[0] -= quiet
        if n > quiet:
            progress(n - quiet)
    return report


def chunk_entries(view: IndexView, extents) -> dict:
    """{chunk id: its index entry, or None when the index lacks it} for the chunks the
    extents name, in order of first use, then the bases of delta chunks among them. Looked
    up together before a read starts its fetch threads: a lookup made while they run waits
    for the GIL each time (python-lmdb releases it), measured at 0.15-0.24 ms per chunk
    against 2 us alone."""
    entries: dict = {}
    for _, _, _, cid in extents:
        if cid not in entries:
            entries[cid] = view.chunk(cid)
    bases = [e.base for e in entries.values() if e is not None and e.base is not None]
    while bases:                # a delta chunk's base is read too (and a base's base)
        more = []
        for cid in bases:
            if cid not in entries:
                entries[cid] = entry = view.chunk(cid)
                if entry is not None and entry.base is not None:
                    more.append(entry.base)
        bases = more
    return entries


def record_ranges(entries: dict):
    """(segment, offset, length) of the chunk records of chunk_entries(), in that order
    (what a read session may prefetch)."""
    return [(e.segment, e.offset, fmt.RECORD_HEADER.size + e.stored_len)
            for e in entries.values() if e is not None]


def copy_extents(reader: ChunkReader, extents, out: memoryview, start: int,
                 progress: Callable[[int], None] | None = None) -> None:
    """Copies each extent's chunk bytes to out[offset - start:], checking it lies inside its
    chunk."""
    for off, coff, length, cid in extents:
        dest = out[off - start:off - start + length]
        if coff or not reader.read_into(cid, dest):
            data = reader.read(cid)
            if coff + length > len(data):
                raise CorruptionError(f"manifest extent exceeds chunk {cid.hex()[:16]}…")
            dest[:] = memoryview(data)[coff:coff + length]
        if progress is not None:
            progress(length)


def buffer_manifest(view: IndexView, commit: Commit, name: str) -> list:
    """The one manifest of buffer `name` of `commit`: its layers written over each other, so
    it covers the buffer (checked)."""
    manifest = ext.flatten(buffer_layers(view, commit, name))
    ext.check_fills(manifest, 0, _buffer(view, commit, name).size,
                    f"checkpoint {commit.id} buffer {name!r}")
    return manifest


def restore_ranges(view: IndexView, backend: SegmentBackend, commit: Commit, name: str,
                   ranges, out: memoryview) -> None:
    """Writes the byte ranges [(offset, length), ...] of buffer `name` of `commit` back to
    back into out (len(out) == their total; each inside the buffer): one manifest lookup and
    one read session for them all, however many and scattered they are."""
    ranges = list(ranges)
    manifest = buffer_manifest(view, commit, name)
    starts = [e[0] for e in manifest]
    pos = 0
    with backend.open_reader() as segments:
        entries = chunk_entries(view, [
            e for start, length in ranges if length > 0
            for e in ext.clip(manifest[max(0, bisect.bisect_right(starts, start) - 1):
                                       bisect.bisect_left(starts, start + length)],
                              start, start + length)]) if len(ranges) > 1 else {}
        reader = ChunkReader(backend, segments, view, entries)
        if entries:
            segments.prefetch(record_ranges(entries))
        for start, length in ranges:
            if length <= 0:
                continue
            first = max(0, bisect.bisect_right(starts, start) - 1)
            last = bisect.bisect_left(starts, start + length, first)
            piece = ext.clip(manifest[first:last], start, start + length)
            copy_extents(reader, piece, out[pos:pos + length], start)
            pos += length
