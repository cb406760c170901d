"""The checkpoint write path: decide full or delta per buffer, cut it into chunks, store the
chunks the store does not have yet, and describe the result as a Commit.

Bytes are first gathered (C gather) from the caller's buffer into a bounded staging area and
everything else (BLAKE3 ids, page fingerprints, compression, log append) works on that copy,
so what is stored, what is hashed and what the fingerprints describe are always the same bytes
even if the caller mutates its buffer meanwhile. Memory used: the staging area plus the
fingerprints of the buffer being written (16 bytes per page).
"""
from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, NamedTuple

import blake3
import zstandard

from snapstore import _native as native
from snapstore.halves import both, split_point
from snapstore.engine import extents as ext
from snapstore.engine import format as fmt
from snapstore.engine import planes
from snapstore.engine.index import IndexView
from snapstore.engine.keyframes import DEFAULT_MAX_BYTES as DEFAULT_KEYFRAME_CACHE_BYTES, \
    KeyframeCache
from snapstore.engine.reader import buffer_layers
from snapstore.engine.records import BufferEntry, Commit
from snapstore.engine.wal import SegmentLog
from snapstore.errors import CorruptionError, InvalidArgumentError, InvalidArgumentTypeError

STAGING_AREA_BYTES = fmt.MAX_CHUNK_BYTES   # gather this much at a time (bounds memory,
                                           # amortises calls): the largest chunk fits whole
STAGING_BYTES = 2 * STAGING_AREA_BYTES     # two areas, gathered into in turn (write-behind)


@dataclass
class WriteOptions:
    page_size: int = fmt.DEFAULT_PAGE_SIZE
    chunk_size: int = fmt.DEFAULT_CHUNK_SIZE
    chunking: str = "pages"
    cdc_sizes: tuple = fmt.DEFAULT_CDC_SIZES
    max_chain: int = fmt.DEFAULT_MAX_CHAIN
    full_threshold: float = fmt.DEFAULT_FULL_THRESHOLD
    compression: str = "zstd"
    compression_level: int = fmt.DEFAULT_COMPRESSION_LEVEL
    delta_chunks: bool = False   # code changed float chunks against the parent's (choose_bases)
    # the memory that keeps delta_chunks' bases between checkpoints (engine/keyframes.py)
    keyframe_cache_bytes: int = DEFAULT_KEYFRAME_CACHE_BYTES


@dataclass
class BufferPlan:
    """What to store of one buffer: byte ranges (each one chunk) and how they relate to the
    parent checkpoint."""
    name: str
    view: memoryview
    base: str                  # "full" | "delta"
    depth: int
    layout: str
    page_size: int
    chunks: list               # per chunk: its pieces [(offset, length), ...], ascending
    fingerprints: bytearray | None   # updated from the staged bytes as they are stored
    reason: str                # why full, for diagnostics
    staged: memoryview | None = None  # the chunks' bytes, already copied back to back (async)
    itemsize: int = 1          # the buffer's float item size (validation.float_item_size)
    bases: list | None = None  # per chunk: (id, stored length) of the chunk to code it
                               # against (choose_bases), or None
    renews: list | None = None  # per chunk: the keyframe it is to replace, stored on its
                                # own (choose_bases: KEYFRAME_FRACTION), or None

    @property
    def nbytes(self) -> int:
        return sum(n for pieces in self.chunks for _, n in pieces)

    def ranges(self) -> list:
        return [r for pieces in self.chunks for r in pieces]


def split_ranges(ranges, piece: int) -> list:
    """Splits (offset, length) ranges into pieces of at most `piece` bytes."""
    out = []
    for off, length in ranges:
        end = off + length
        while off < end:
            n = min(piece, end - off)
            out.append((off, n))
            off += n
    return out


def pack_ranges(ranges, chunk_size: int) -> list:
    """Groups ascending ranges into chunks of at most chunk_size bytes, in order.

    Scattered dirty pages of a delta become a few packed chunks instead of one tiny chunk per
    run: fewer records, index entries and reads (an extent addresses its bytes by offset inside
    the chunk)."""
    chunks, current, filled = [], [], 0
    if any(length > chunk_size for _, length in ranges):
        ranges = split_ranges(ranges, chunk_size)
    for off, length in ranges:
        if current and filled + length > chunk_size:
            chunks.append(current)
            current, filled = [], 0
        current.append((off, length))
        filled += length
    if current:
        chunks.append(current)
    return chunks


def plan_delta(name: str, view: memoryview, ranges: list, depth: int,
               opts: WriteOptions, itemsize: int = 1) -> BufferPlan:
    """A delta of the byte ranges a dirty-page tracker reported (relative to the previous
    checkpoint it captured)."""
    page = opts.page_size
    size = len(view)
    if all(off % page == 0 and (length % page == 0 or off + length == size)
           for off, length in ranges):      # detectors report whole pages already
        return BufferPlan(name, view, "delta", depth, "pages", page,
                          pack_ranges(ranges, opts.chunk_size), None, "", itemsize=itemsize)
    aligned = []                       # widen to whole pages: deltas are page runs
    for off, length in ranges:
        lo = off // page * page
        hi = min(len(view), -(-(off + length) // page) * page)
        if aligned and lo <= aligned[-1][0] + aligned[-1][1]:
            prev_off, prev_len = aligned[-1]
            aligned[-1] = (prev_off, max(prev_off + prev_len, hi) - prev_off)
        elif hi > lo:
            aligned.append((lo, hi - lo))
    return BufferPlan(name, view, "delta", depth, "pages", page,
                      pack_ranges(aligned, opts.chunk_size), None, "", itemsize=itemsize)


def plan_buffer(name: str, view: memoryview, parent: BufferEntry | None,
                prev_fingerprints: bytes | None, opts: WriteOptions, layout: str,
                itemsize: int = 1) -> BufferPlan:
    """Chooses full or delta for one buffer and the byte ranges to store."""
    size = len(view)
    if layout == "cdc":
        cuts = native.chunk_boundaries(view, *opts.cdc_sizes)
        chunks = [[(a, b - a)] for a, b in zip([0] + cuts[:-1], cuts)]
        return BufferPlan(name, view, "full", 0, "cdc", opts.page_size, chunks, None,
                          "content-defined chunking stores every checkpoint full (deduplicated)")
    reason = ""
    if parent is None:
        reason = "no earlier checkpoint of this buffer in the stream"
    elif parent.layout != "pages" or parent.page_size != opts.page_size:
        reason = "the earlier checkpoint used another layout or page size"
    elif parent.size != size:
        reason = f"size changed from {parent.size} to {size} bytes"
    elif prev_fingerprints is None:
        reason = ("no page fingerprints of the stream's head (it was taken by a tracker, "
                  "by checkpoint_async in another Store or after a failed one, whose "
                  "fingerprints stay in memory, or recovered from the log): stored full, "
                  "deduplicated")
    if not reason:
        fps = bytearray(prev_fingerprints)
        runs = native.fingerprint_diff(view, fps, opts.page_size)
        dirty = native.runs_to_ranges(runs, size, opts.page_size)
        dirty_bytes = sum(n for _, n in dirty)
        if size and dirty_bytes > opts.full_threshold * size:
            reason = f"{dirty_bytes / size:.0%} of the bytes changed"
        else:
            return BufferPlan(name, view, "delta", parent.depth + 1, "pages", opts.page_size,
                              pack_ranges(dirty, opts.chunk_size), fps, "", itemsize=itemsize)
    return plan_full(name, view, opts, reason, itemsize)


def plan_full(name: str, view: memoryview, opts: WriteOptions, reason: str,
              itemsize: int = 1) -> BufferPlan:
    """The buffer stored whole in the pages layout (chunk_size pieces, deduplicated)."""
    size = len(view)
    fps = bytearray(native.page_count(size, opts.page_size) * native.FP_BYTES)
    chunks = [[r] for r in split_ranges([(0, size)] if size else [], opts.chunk_size)]
    return BufferPlan(name, view, "full", 0, "pages", opts.page_size, chunks, fps, reason,
                      itemsize=itemsize)


def whole_if_mostly_changed(plans: list, opts: WriteOptions) -> list:
    """The checkpoint-level full_threshold: when more than full_threshold of the checkpoint's
    bytes are stored anyway (full buffers plus the dirty bytes of deltas), or it holds no
    bytes, its delta buffers are stored whole too, so the checkpoint is "full" (restorable
    from its own manifests, chain_length 0) and no chain grows under it. Without this, one
    small unchanged buffer (DCP's metadata, a pickle stream) kept a fully changed state
    "incremental" and built a chain to max_chain. Unchanged buffers cost no new bytes when
    stored whole over a whole parent (their chunks deduplicate)."""
    deltas = [p for p in plans if p.base == "delta"]
    if not deltas:
        return plans
    total = sum(len(p.view) for p in plans)
    stored = sum(len(p.view) if p.base == "full" else p.nbytes for p in plans)
    if total and stored <= opts.full_threshold * total:
        return plans
    reason = (f"{stored / total:.0%} of the checkpoint's bytes changed" if total
              else "the checkpoint holds no bytes")
    return [plan_full(p.name, p.view, opts, reason, p.itemsize) if p.base == "delta" else p
            for p in plans]


KEYFRAME_FRACTION = 0.8   # a delta chunk stored in more than this much of what its base (or,
                          # if less, its raw bytes) takes: the next version is stored whole


def choose_bases(view: IndexView, parent: Commit | None, plan: BufferPlan,
                 opts: WriteOptions) -> None:
    """Sets plan.bases: for each chunk of one run of bytes of a buffer of floats, a chunk of
    the same length to code it against, as (its id, its stored length), where the parent
    checkpoint's buffer has one at the same place (docs/floatcodec.md): the chunk at that
    offset in the full manifest the parent's buffer builds on (its first layer: what a later
    delta changed there is a few pages, so that chunk still codes the new bytes well). That is the chunk itself when it is
    stored whole (a keyframe), else the keyframe it was coded against, so every delta chunk
    is one level deep: a restore decodes two records, a writer reads one back. A position
    whose last delta stopped paying (KEYFRAME_FRACTION) gets a new keyframe: plan.renews
    names the keyframe it replaces. Nothing to do without delta_chunks or compression, for
    another layout or for chunks not of floats."""
    if not (opts.delta_chunks and opts.compression == "zstd" and parent is not None
            and plan.layout == "pages" and chunk_item_size(plan) in fmt.PLANES_ITEMSIZES):
        return
    before = next((b for b in parent.buffers if b.name == plan.name), None)
    if before is None or before.size != len(plan.view) or before.layout != "pages":
        return
    first = buffer_layers(view, parent, plan.name)[0]
    at = {off: (cid, n) for off, coff, n, cid in first if coff == 0}
    bases: list = []
    renews: list = []
    found: dict = {}
    for pieces in plan.chunks:
        base = renewed = None
        if len(pieces) == 1:
            off, length = pieces[0]
            cid, n = at.get(off, (None, 0))
            entry = view.chunk(cid) if n == length else None
            if entry is not None and entry.raw_len == length:
                if entry.base is None:
                    base = (cid, entry.stored_len)
                else:
                    keyframe = found.get(entry.base) or view.chunk(entry.base)
                    found[entry.base] = keyframe
                    if keyframe is not None and keyframe.base is None and \
                            keyframe.raw_len == length and \
                            entry.stored_len <= KEYFRAME_FRACTION * min(
                                length, keyframe.stored_len):
                        base = (entry.base, keyframe.stored_len)
                    else:
                        renewed = entry.base
        bases.append(base)
        renews.append(renewed)
    if any(b is not None for b in bases):
        plan.bases = bases
    if any(r is not None for r in renews):
        plan.renews = renews


def usable_fingerprints(view: IndexView, stream: str, buffer: str, head: int | None,
                        page_size: int, known: tuple | None = None,
                        size: int | None = None) -> bytes | None:
    """The page fingerprints recorded for (stream, buffer) if they may be diffed against: only
    when they describe the stream's head and were taken with this page size (invariant 6 of
    docs/design.md). Else `known`, fingerprints of the same buffer from memory (checkpoint
    id, page size, digests), under the same rules, when they are one per page of the head's
    buffer of `size` bytes. None otherwise: the buffer is then stored full."""
    def of_head(prev: tuple | None) -> bool:
        return prev is not None and prev[0] == head and prev[1] == page_size
    prev = view.fingerprints(stream, buffer)
    if of_head(prev):
        return prev[2]
    if of_head(known) and size is not None and \
            len(known[2]) == native.page_count(size, page_size) * native.FP_BYTES:
        return known[2]
    return None


def plan_buffers(view: IndexView, stream: str, head: int | None, parent: Commit | None,
                 buffers, opts: WriteOptions, layout: str,
                 itemsizes: dict | None = None, known: dict | None = None) -> list:
    """plan_buffer for each {name: memoryview} of buffers as the stream's next checkpoint:
    `parent` is the head's Commit (None for a new stream); a delta is the fingerprint diff
    against the head's usable_fingerprints (known: {name: (checkpoint id, page size,
    digests)} from memory, for buffers the index has none of: what checkpoint_async kept);
    itemsizes: {name: float item size} (default 1). Then whole_if_mostly_changed."""
    parents = {b.name: b for b in parent.buffers} if parent else {}
    itemsizes = itemsizes or {}
    known = known or {}
    plans = []
    for name, buf in buffers.items():
        before = parents.get(name)
        fps = usable_fingerprints(view, stream, name, head, opts.page_size, known.get(name),
                                  before.size if before is not None else None)
        plans.append(plan_buffer(name, buf, before, fps, opts, layout, itemsizes.get(name, 1)))
    return whole_if_mostly_changed(plans, opts)


_local = threading.local()
MIN_ZSTD_BYTES = 64                # smaller chunks are stored raw, never tried with zstd


def _saves(stored_len: int, raw_len: int) -> bool:
    """Whether a coding of raw_len bytes into stored_len pays: it saves at least 1/32."""
    return stored_len < raw_len - raw_len // 32


def _compressor(level: int):
    c = getattr(_local, "zstd", None)
    if c is None or _local.level != level:
        c = zstandard.ZstdCompressor(level=level, write_content_size=True)
        _local.zstd, _local.level = c, level
    return c


def encode_chunk(cid: bytes, data, opts: WriteOptions, itemsize: int = 1,
                 worth: tuple | None = None, rotation: int = fmt.PLANES_ROTATE
                 ) -> tuple[int, list]:
    """(codec, payload parts) of the chunk record of chunk `cid` holding `data` (its raw
    bytes). With compression "zstd": a chunk of items of 2, 4 or 8 bytes (itemsize: a hint
    from the buffer's type, its items aligned to the chunk's start) as byte planes, each plane
    zstd-compressed where that saves at least 1/32 of it (engine/planes.py); other chunks one
    zstd frame when that saves at least 1/32; else the raw bytes. The one rule for every
    chunk record a writer makes (ChunkSink, savepoint files). worth, rotation:
    planes.probe() of the chunk's buffer (which planes to compress, default: try all; the
    items' rotation, default fmt.PLANES_ROTATE: the only one a segment of version 4 or 5, or
    a savepoint file, holds)."""
    prefix = fmt.CHUNK_PREFIX.pack(cid, len(data))
    if opts.compression == "zstd" and planes.usable(itemsize, len(data)):
        parts = planes.encode(data, itemsize, worth, rotation)  # None unless it saves 1/32
        if parts is not None:
            return fmt.CODEC_PLANES, [prefix, *parts]
        return fmt.CODEC_RAW, [prefix, data]
    codec, stored = fmt.CODEC_RAW, data
    if opts.compression == "zstd" and len(data) >= MIN_ZSTD_BYTES:
        packed = _compressor(opts.compression_level).compress(data)
        if _saves(len(packed), len(data)):              # keep only a real saving
            codec, stored = fmt.CODEC_ZSTD, packed
    return codec, [prefix, stored]


# From this compression_level on, the byte planes of float chunks also try rotations above
# one bit (planes.probe; format 6): 3 saves 0.2-0.45 points more on float32 and bfloat16
# weights but makes the low plane worth compressing too, which cost a dense float32
# checkpoint 25-60% more time here (docs/floatcodec.md, "Built (stop 47)").
ROTATIONS_FROM_LEVEL = 3


def plane_rotations(opts: WriteOptions, segment_version: int) -> tuple[int, ...]:
    """The rotations a writer's probe chooses among for float chunks in segments of
    `segment_version` (fmt.WRITTEN_PLANE_ROTATIONS) at opts.compression_level: rotation 1
    alone below ROTATIONS_FROM_LEVEL."""
    allowed = fmt.WRITTEN_PLANE_ROTATIONS.get(segment_version, (fmt.PLANES_ROTATE,))
    if opts.compression_level < ROTATIONS_FROM_LEVEL:
        return allowed[:1]
    return allowed


PARALLEL_ENCODE_BYTES = 1 << 20    # hashing and encoding use two threads from this many bytes
PROBE_CHUNKS = 4                   # a batch of more chunks is probed on this many


class Encoded(NamedTuple):
    """A chunk's record as encode_chunks made it: either the payload parts (chunk prefix,
    stored bytes) for SegmentLog.append, or the pieces of the whole record (header and
    checksum included, made by the C core; header first) for SegmentLog.append_records."""
    codec: int
    stored_len: int                 # the record's payload length
    parts: list | None = None
    record: list | None = None


def encode_chunks(items: list, opts: WriteOptions, itemsize: int = 1,
                  rotations: tuple[int, ...] = (fmt.PLANES_ROTATE,)) -> list[Encoded]:
    """The records of encode_chunk(cid, data, opts, itemsize) for cid, data in items, the
    second half on a thread of its own when the items hold PARALLEL_ENCODE_BYTES or more and
    are compressed. A probe of a few chunks spread over a batch of more than PROBE_CHUNKS says
    what compresses at all: for other bytes whether to try zstd on the batch, for chunks of
    floats (itemsize 2, 4 or 8) which planes to try, and which of `rotations`
    (plane_rotations of the writer and the segment written) to rotate their items by (a
    smaller batch of floats, when there is a choice, is coded at each and the smaller kept).
    Those are made whole records by one call into the C core per half (no GIL; the same
    coding as encode_chunk's)."""
    sizes = [len(data) for _, data in items]
    if opts.compression != "zstd":
        return _in_halves(_raw_records, items, sizes)
    samples = _probe_samples(items)
    if itemsize in fmt.PLANES_ITEMSIZES and not samples and len(rotations) > 1:
        # a batch of PROBE_CHUNKS or fewer: coded at each rotation, the smaller kept (a probe
        # of its chunks, then their coding, would code them once more)
        return min((_plane_records(items, opts, itemsize, None, rotation)
                    for rotation in rotations), key=_stored_bytes)
    if itemsize in fmt.PLANES_ITEMSIZES:
        usable = [data for data in samples if planes.usable(itemsize, len(data))]
        chosen = planes.probe(usable, itemsize, rotations) if usable else \
            planes.Probe(rotations[0], None)

        def encode(part: list) -> list:
            return _plane_records(part, opts, itemsize, chosen.worth, chosen.rotation)
    elif samples and not _worth_compressing(samples, opts):
        encode = _raw_records
    else:
        def encode(part: list) -> list:
            return _python_records(part, opts, itemsize, None)
    return _in_halves(encode, items, sizes)


def _stored_bytes(records: list) -> int:
    """The payload bytes of Encoded records (what the smaller of two codings is judged by)."""
    return sum(r.stored_len for r in records)


def _probe_samples(items: list) -> list:
    """PROBE_CHUNKS chunks spread over a batch of more (none for a smaller batch: all of it is
    tried)."""
    if len(items) <= PROBE_CHUNKS:
        return []
    return [data for _, data in items[::len(items) // PROBE_CHUNKS][:PROBE_CHUNKS]]


def _worth_compressing(samples: list, opts: WriteOptions) -> bool:
    """Whether zstd saves at least 1/32 of any of samples (chunks spread over a batch) it
    would be tried on, or none would: when it saves nothing there (random or encrypted bytes,
    compressed media), the batch is stored raw without trying, so incompressible data costs
    little more than writing it."""
    tried = [data for data in samples if len(data) >= MIN_ZSTD_BYTES]
    c = _compressor(opts.compression_level)
    return not tried or any(_saves(len(c.compress(data)), len(data)) for data in tried)


def _python_records(items: list, opts: WriteOptions, itemsize: int, worth,
                    rotation: int = fmt.PLANES_ROTATE) -> list:
    out = []
    for cid, data in items:
        codec, parts = encode_chunk(cid, data, opts, itemsize, worth, rotation)
        out.append(Encoded(codec, sum(len(p) for p in parts), parts=parts))
    return out


def _raw_records(items: list) -> list:
    """Raw records of items: their heads (header, checksum, chunk prefix) from one call into
    the C core, each followed by the chunk's bytes where they lie (no copy): what incompressible
    bytes cost beyond their write."""
    heads, results = native.raw_record_heads([(data, cid) for cid, data in items])
    head = native.RAW_RECORD_HEAD
    return [Encoded(codec, stored_len, record=[heads[off:off + head], data])
            for (off, stored_len, codec, _), (_, data) in zip(results, items)]


def _plane_records(items: list, opts: WriteOptions, itemsize: int, worth,
                   rotation: int) -> list:
    """Records of items (chunks of itemsize-byte floats, rotated by `rotation` bits): those
    planes.usable() as whole records from one native.write_chunks call, the few others (small
    tails) by encode_chunk."""
    usable = [(data, cid) for cid, data in items if planes.usable(itemsize, len(data))]
    if not usable:
        return _python_records(items, opts, itemsize, worth, rotation)
    records, results = native.write_chunks(usable, itemsize, planes.plane_mask(itemsize, worth),
                                           rotate=rotation)
    made = iter(results)
    out = []
    for cid, data in items:
        if planes.usable(itemsize, len(data)):
            off, stored_len, codec, _ = next(made)
            out.append(Encoded(codec, stored_len, record=[records[
                off:off + fmt.RECORD_HEADER.size + stored_len]]))
        else:
            out.extend(_python_records([(cid, data)], opts, itemsize, worth, rotation))
    return out


def _delta_limit(base_id: bytes, base_stored: int, size: int) -> tuple:
    """(base_id, what a chunk of `size` bytes coded against it must save 1/32 of): a delta
    chunk keeps its base alive, so it must save 1/32 of what the base takes (about what this
    chunk would take coded on its own), not merely of its raw length (the C core's rule):
    unrelated floats would otherwise be stored as deltas a little larger than plain planes,
    and hold their bases besides."""
    return base_id, min(size, base_stored)


def _coded_against(items: list, bases: list) -> list:
    """native.write_chunks' (data, chunk id, base, base id, depth 1) of each delta item (chunk
    id, data, base id, limit) whose base was read (read_bases gave bytes as long as its data);
    the others are left out."""
    return [(data, cid, base, base_id, 1)
            for (cid, data, base_id, _), base in zip(items, bases)
            if base is not None and len(base) == len(data)]


def delta_records(items: list, itemsize: int, read_bases: Callable[[list], list]
                  ) -> list[Encoded | None]:
    """Records of items (chunk id, data, base id, limit; itemsize 2, 4 or 8), each coded as
    delta planes against its base where that saves 1/32 of `limit` bytes (_delta_limit; and
    of its raw length: the C core's rule); None for an item whose delta does not (its caller codes it on its own),
    or whose base read_bases could not give (or gave at another length). A probe of a few
    items spread over a batch of more than PROBE_CHUNKS says which delta planes to try to
    compress (those that packed in a sample: a delta's low bytes are noise, and zstd spends
    most of its time there for nothing), or that deltas do not pay at all (then no base is
    read). Each half of the items has its bases read and is coded on a thread of its own
    from PARALLEL_ENCODE_BYTES on (encode_chunks' split)."""
    every = planes.plane_mask(itemsize, None)
    worth = _delta_probe(items, itemsize, read_bases)
    if not worth:
        return [None] * len(items)

    def encode(part: list) -> list:
        bases = read_bases([base_id for _, _, base_id, _ in part])
        usable = _coded_against(part, bases)
        if not usable:
            return [None] * len(part)
        records, results = native.write_chunks(usable, itemsize, every, try_delta=worth)
        made = iter(results)
        out: list = []
        for (_, data, _, limit), base in zip(part, bases):
            if base is None or len(base) != len(data):
                out.append(None)
                continue
            off, stored_len, codec, _ = next(made)
            out.append(Encoded(codec, stored_len, record=[
                records[off:off + fmt.RECORD_HEADER.size + stored_len]])
                if codec == fmt.CODEC_DELTA_PLANES and _saves(stored_len, limit) else None)
        return out
    return _in_halves(encode, items, [len(item[1]) for item in items])


def _delta_probe(items: list, itemsize: int, read_bases: Callable[[list], list]) -> int:
    """The try_delta plane mask for a batch of delta items: every plane for a batch of at
    most PROBE_CHUNKS; else the planes that packed in the samples whose delta paid: within
    its limit, and saving 1/32 of what the sample takes coded on its own (a chunk can code
    far better than its base did: weights pruned to zeros since); 0 (no delta) when none
    did. Samples whose base cannot be read say nothing."""
    every = planes.plane_mask(itemsize, None)
    if len(items) <= PROBE_CHUNKS:
        return every
    samples = items[::len(items) // PROBE_CHUNKS][:PROBE_CHUNKS]
    bases = read_bases([base_id for _, _, base_id, _ in samples])
    usable = _coded_against(samples, bases)
    if not usable:
        return every
    limits = {cid: limit for cid, _, _, limit in samples}
    _, deltas = native.write_chunks(usable, itemsize, 0, try_delta=every)
    _, alone = native.write_chunks([u[:2] for u in usable], itemsize, every)
    mask = 0
    for u, (_, stored_len, codec, packed), (_, own_len, _, _) in zip(usable, deltas, alone):
        if codec == fmt.CODEC_DELTA_PLANES and _saves(stored_len, limits[u[1]]) and \
                _saves(stored_len, own_len):
            mask |= packed or every
    return mask


def content_ids(datas: list) -> list[bytes]:
    """The BLAKE3 chunk id of each of datas (BLAKE3 lets go of the GIL: see _in_halves)."""
    return _in_halves(lambda part: [blake3.blake3(data).digest() for data in part], datas,
                      [len(data) for data in datas])


def _in_halves(work: Callable[[list], list], items: list, sizes: list) -> list:
    """work(items), as work(first half) + work(second half) with the second half on a thread
    of its own when the items (of these sizes) hold PARALLEL_ENCODE_BYTES or more."""
    if len(items) < 2 or sum(sizes) < PARALLEL_ENCODE_BYTES:
        return work(items)
    at = split_point(sizes)
    first, second = both(lambda: work(items[:at]), lambda: work(items[at:]))
    return first + second


class ChunkSink:
    """Stores chunks for one checkpoint: dedups against the index and this checkpoint's own new
    chunks, compresses, appends chunk records. Collects the NEW_CHUNK table."""

    def __init__(self, log: SegmentLog, view: IndexView, opts: WriteOptions,
                 pause: Callable[[], None] | None = None,
                 unreusable: frozenset = frozenset(),
                 read_bases: Callable[[list], list] | None = None,
                 keyframes: KeyframeCache | None = None) -> None:
        self.log, self.view, self.opts, self.pause = log, view, opts, pause
        self.new: dict[bytes, tuple] = {}
        # read_bases([chunk id, ...]): the raw bytes of each (None for one that cannot be
        # read: that chunk is then coded on its own, so a damaged old checkpoint never stops
        # new ones), chunks of the view to code new chunks against (put_batch's bases);
        # None: no chunk is delta-coded
        self.read_bases = read_bases
        # where the new keyframes of put_batch(keyframes=...) are kept (read_bases reads
        # through it), or None
        self.keyframes = keyframes
        self.bases: dict[bytes, bytes] = {}       # new delta chunk id -> its base's id
        # chunks stored elsewhere that the view lacks, which may be reused: {id: (segment,
        # offset, stored length, raw length, codec)} (S3 stores: other writers' uploads)
        self.known: dict[bytes, tuple] = {}
        # segments whose chunks the view lists but this checkpoint must not reuse (S3 stores:
        # another session's, not in the bucket): such chunks are stored anew
        self.unreusable = unreusable
        self.bytes_new = 0
        self.rotations = plane_rotations(opts, log.version)

    def _have(self, cid: bytes) -> bool:
        if cid in self.new or cid in self.known:
            return True
        if not self.unreusable:
            return self.view.has_chunk(cid)
        entry = self.view.chunk(cid)
        return entry is not None and entry.segment not in self.unreusable

    def put(self, data: memoryview, expected: bytes | None = None) -> bytes:
        """Ensures the chunk is stored; returns its id. With `expected` (a chunk handed in by
        id: copy, import), CorruptionError unless data's BLAKE3 is that id, before anything
        is appended."""
        if self.pause is not None:
            self.pause()
        cid = blake3.blake3(data).digest()
        if expected is not None and cid != expected:
            raise CorruptionError(f"the bytes given for chunk {expected.hex()[:16]}… "
                                  f"({len(data)} bytes) hash to {cid.hex()[:16]}…: not that "
                                  "chunk")
        if self._have(cid):
            return cid
        codec, parts = encode_chunk(cid, data, self.opts)
        seg, off = self.log.append(fmt.REC_CHUNK, codec, parts)
        stored_len = sum(len(p) for p in parts)
        self._note(cid, seg, off, stored_len, len(data), codec)
        return cid

    def put_batch(self, datas: list, itemsize: int = 1, bases: list | None = None,
                  keyframes: list | None = None) -> list[bytes]:
        """put() of each chunk in `datas` (views), in order; returns their ids. The new ones
        are compressed by two threads at once when they hold PARALLEL_ENCODE_BYTES or more
        (zstd lets go of the GIL); appending stays in order, in this thread. itemsize: the
        chunks hold items of that many bytes from their first byte on (encode_chunk). pause()
        is called once first, even when nothing is new, and before each staging area's
        appends. bases: per chunk, (id, stored length) of a chunk of the view (as long) to code
        it against where that pays (CODEC_DELTA_PLANES: _delta_limit), or None; used only with
        read_bases and itemsize 2, 4 or 8. keyframes (the chunks are a full float buffer's):
        per chunk, the keyframe it renews (plan.renews) or None; each new one stored on its
        own is the next checkpoint's base at its place, kept in self.keyframes (if any) in
        place of the base it was offered or the keyframe it renews."""
        if self.pause is not None:
            self.pause()
        cids = content_ids(datas)
        if bases is None or self.read_bases is None or itemsize not in fmt.PLANES_ITEMSIZES:
            bases = [None] * len(datas)
        keep = self.keyframes if keyframes is not None and \
            itemsize in fmt.PLANES_ITEMSIZES else None
        renews = keyframes if keep is not None else [None] * len(datas)
        todo: dict[bytes, tuple] = {}
        for cid, data, base, renewed in zip(cids, datas, bases, renews):
            if cid not in todo and not self._have(cid):
                todo[cid] = (data, None if base is None or base[0] == cid
                             else _delta_limit(*base, len(data)),
                             renewed if base is None else base[0])
        group: list = []
        size = 0
        for cid, item in todo.items():       # encoded a staging area at a time: bounded
            group.append((cid, *item))        # memory
            size += len(item[0])
            if size >= STAGING_AREA_BYTES:
                self._append_group(group, itemsize, keep)
                group, size = [], 0
        self._append_group(group, itemsize, keep)
        return cids

    def _append_group(self, group: list, itemsize: int,
                      keep: KeyframeCache | None = None) -> None:
        """_append of (chunk id, data, base or None, keyframe it replaces or None) items:
        those with a base coded against it (read back through read_bases, by delta_records'
        threads), the others, and those whose base could not be read, as always; those stored
        on their own are offered to `keep` (new keyframes, in place of the ones they
        replace), from the bytes their records were coded from."""
        if not any(base is not None for _, _, base, _ in group):
            self._append([(cid, data) for cid, data, _, _ in group], itemsize)
            if keep is not None:
                keep.offer_many([(cid, data, old) for cid, data, _, old in group])
            return
        deltas = [(cid, data, *base) for cid, data, base, _ in group if base is not None]
        by_id = dict(zip((cid for cid, *_ in deltas),
                         delta_records(deltas, itemsize, self.read_bases)))
        plain = [(cid, data) for cid, data, base, _ in group
                 if base is None or by_id[cid] is None]
        made_plain = iter(encode_chunks(plain, self.opts, itemsize, self.rotations))
        made = [by_id.get(cid) or next(made_plain) for cid, _, _, _ in group]
        self._append_made([(cid, data) for cid, data, _, _ in group], made,
                          [None if base is None else base[0] for _, _, base, _ in group])
        if keep is not None:
            keep.offer_many([(cid, data, old) for (cid, data, _, old), m in zip(group, made)
                             if m.codec != fmt.CODEC_DELTA_PLANES])

    def _append(self, items: list, itemsize: int = 1) -> None:
        self._append_made(items, encode_chunks(items, self.opts, itemsize, self.rotations))

    def _append_made(self, items: list, made: list, bases: list | None = None) -> None:
        """Appends the records `made` (Encoded) of items (chunk id, data), in order; bases:
        per item the base it was offered (None: none), noted for delta chunks."""
        if self.pause is not None:
            self.pause()
        where: list = []
        run: list = []          # whole records not yet queued: queued a run at a time, in order
        for m in made:
            if m.record is not None:
                run.append((m.record, fmt.RECORD_HEADER.size + m.stored_len))
                continue
            where += self.log.append_records(run)
            run = []
            where.append(self.log.append(fmt.REC_CHUNK, m.codec, m.parts))
        where += self.log.append_records(run)
        for i, ((cid, data), m, (seg, off)) in enumerate(zip(items, made, where)):
            base = bases[i] if bases is not None and m.codec == fmt.CODEC_DELTA_PLANES else None
            self._note(cid, seg, off, m.stored_len, len(data), m.codec, base)

    def _note(self, cid: bytes, seg: int, off: int, stored_len: int, raw_len: int,
              codec: int, base: bytes | None = None) -> None:
        """Records a chunk appended at (seg, off) for the NEW_CHUNK table and bytes_new (and
        a delta chunk's base for the DELTA_BASE table)."""
        self.new[cid] = (seg, off, stored_len, raw_len, codec)
        if base is not None:
            self.bases[cid] = base
        self.bytes_new += fmt.RECORD_HEADER.size + stored_len

    def new_chunk_table(self) -> bytes:
        return b"".join(fmt.NEW_CHUNK.pack(cid, *loc) for cid, loc in self.new.items())

    def delta_base_table(self) -> bytes:
        """The DELTA_BASE table of the new delta chunks (the commit record's)."""
        return b"".join(fmt.DELTA_BASE.pack(cid, base) for cid, base in self.bases.items())


def chunk_ids(entries) -> list[bytes]:
    """The distinct chunk ids the extents of `entries` name, in order of first use."""
    seen: dict[bytes, None] = {}
    for entry in entries:
        for _, _, _, cid in fmt.EXTENT.iter_unpack(entry.extents):
            seen[cid] = None
    return list(seen)


def put_chunks(sink: ChunkSink, wanted: list, read_chunks: Callable[[list], Iterable]
               ) -> dict[bytes, int]:
    """Stores the chunks `wanted` (ids) from read_chunks(wanted), an iterable of (chunk id,
    raw bytes) yielding each of them once, in any order: each is checked to hash to its id
    and stored through the sink (ChunkSink.put). Returns {chunk id: raw length}. Raises
    CorruptionError for bytes that are not their chunk, a chunk not asked for or given
    twice, or one never given."""
    todo = dict.fromkeys(wanted)
    got: dict[bytes, int] = {}
    source = read_chunks(list(wanted))
    shape = "read_chunks must return an iterable of (chunk id, bytes) pairs"
    try:
        items = iter(source)
    except TypeError:
        raise InvalidArgumentTypeError(f"{shape}, got {type(source).__name__}") from None
    try:
        for item in items:
            try:
                cid, data = item
                data = memoryview(data).cast("B")     # the bytes of any buffer
            except (TypeError, ValueError):
                raise InvalidArgumentTypeError(f"{shape}; it gave {type(item).__name__} "
                                               f"{_brief(item)}") from None
            if not isinstance(cid, bytes):
                raise InvalidArgumentTypeError(f"{shape}; it gave a chunk id of type "
                                               f"{type(cid).__name__}")
            if cid not in todo:
                raise CorruptionError(f"chunk {bytes(cid).hex()[:16]}… was given " +
                                      ("twice" if cid in got else "but not asked for"))
            del todo[cid]
            sink.put(data, expected=cid)
            got[cid] = data.nbytes
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()         # a generator's read session ends here, not at garbage collection
    if todo:
        first = next(iter(todo))
        raise CorruptionError(f"{len(todo)} chunk(s) asked for were not given (the first: "
                              f"{first.hex()[:16]}…)")
    return got


def _brief(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def store_missing_chunks(sink: ChunkSink, view: IndexView, entries,
                         read_chunks: Callable[[list], Iterable]) -> None:
    """For pre-made manifests (copy, import): stores through the sink the chunks their
    extents name that the index lacks (read_chunks(those ids) yields them: put_chunks), then
    checks every extent lies inside its chunk. Raises CorruptionError."""
    raw_lengths: dict[bytes, int] = {}
    missing = []
    for cid in chunk_ids(entries):
        entry = view.chunk(cid)
        if entry is None:
            missing.append(cid)
        else:
            raw_lengths[cid] = entry.raw_len
    if missing:
        raw_lengths.update(put_chunks(sink, missing, read_chunks))
    check_extents_in_chunks(entries, raw_lengths)


def check_extents_in_chunks(entries, raw_lengths: dict) -> None:
    """Raises CorruptionError unless every extent of `entries` lies inside its chunk, whose
    raw length raw_lengths gives ({chunk id: length})."""
    for entry in entries:
        for off, coff, length, cid in fmt.EXTENT.iter_unpack(entry.extents):
            if coff + length > raw_lengths[cid]:
                raise CorruptionError(f"buffer {entry.name!r}: the extent at byte {off} reaches "
                                      f"byte {coff + length} of chunk {cid.hex()[:16]}…, which "
                                      f"holds {raw_lengths[cid]}")


def _batches(chunks: list, limit: int) -> Iterator[list]:
    """Groups chunks so that each group's bytes fit the staging area."""
    batch, total = [], 0
    for pieces in chunks:
        size = sum(n for _, n in pieces)
        if batch and total + size > limit:
            yield batch
            batch, total = [], 0
        batch.append(pieces)
        total += size
    if batch:
        yield batch


def rebase(view: IndexView, parent: Commit, entry: BufferEntry) -> BufferEntry:
    """The full equivalent of a delta entry whose parent is `parent`: the parent's layers with
    the delta written over them. Costs manifest work only; no byte is read or written."""
    layers = buffer_layers(view, parent, entry.name) + [ext.unpack(entry.extents)]
    return BufferEntry(entry.name, entry.size, "full", 0, entry.layout, entry.page_size,
                       ext.pack(ext.flatten(layers)))


def stage(plan: BufferPlan, out: memoryview,
          on_stored_many: Callable[..., None] | None = None,
          fingerprint_page: int | None = None) -> None:
    """Copies the plan's ranges back to back into out (C gather) and sets plan.staged;
    on_stored_many(ranges, copied bytes) is told what will be stored, in one call. With
    fingerprint_page, on_stored_many(ranges, copied bytes, their page fingerprints at that
    page size), computed in the same pass as the copy (native.gather_fingerprints)."""
    ranges = plan.ranges()
    if fingerprint_page is None:
        filled, more = native.gather(plan.view, ranges, out), ()
    else:
        filled, digests = native.gather_fingerprints(plan.view, ranges, out, fingerprint_page)
        more = (digests,)
    plan.staged = filled
    if on_stored_many is not None:
        on_stored_many(ranges, filled, *more)


def narrow_staged(plan: BufferPlan, ranges: list, opts: WriteOptions) -> BufferPlan:
    """A staged plan of a whole buffer narrowed to `ranges` (ascending, on the page grid):
    the pages whose copy turned out to have changed. A dirty-page detector that skipped its
    pass reports the whole buffer; once the copy is hashed, what changed is known, and
    storing only that keeps the chunks a diffed capture would have made (a whole-buffer plan
    cuts 64 KiB chunks: one changed page would store its whole chunk). The pages' bytes move
    to the front of the same staging memory, ascending, so a move never overtakes a read."""
    spans = plan.ranges()
    if [0] + [o + n for o, n in spans] != [o for o, _ in spans] + [len(plan.view)] or \
            plan.staged is None or len(plan.staged) != len(plan.view):
        raise InvalidArgumentError("narrow_staged: the plan must be the whole buffer, staged")
    narrowed = plan_delta(plan.name, plan.view, ranges, plan.depth, opts, plan.itemsize)
    staged, pos = plan.staged, 0
    for off, length in narrowed.ranges():
        if pos != off:
            staged[pos:pos + length] = staged[off:off + length]
        pos += length
    narrowed.staged = staged[:pos]
    return narrowed


def chunk_item_size(plan: BufferPlan) -> int:
    """plan.itemsize when every chunk of the plan holds whole items from its first byte on,
    else 1. In the pages layout every piece starts on a page and holds whole pages (but a
    piece ending the buffer), and chunk_size is a multiple of the page: so a page size that
    is a multiple of the item size is enough. CDC cuts anywhere."""
    k = plan.itemsize
    return k if plan.layout == "pages" and plan.page_size % k == 0 else 1


def staging_areas(staging: bytearray) -> list:
    """The staging area's two halves, used in turn: a batch is gathered into one while the
    records of the batch before it, in the other, are written behind."""
    half = len(staging) // 2
    area = memoryview(staging)
    return [area[:half], area[half:2 * half]]


def store_buffer(plan: BufferPlan, sink: ChunkSink, staging: bytearray,
                 on_stored: Callable[[int, memoryview], None] | None = None) -> BufferEntry:
    """Stores the planned chunks (gathered batch by batch through staging, or from
    plan.staged); returns the buffer's manifest entry. on_stored(offset, bytes) is told what
    was stored for every range, from the copy that was stored."""
    extents = []
    page = plan.page_size
    fps = plan.fingerprints
    itemsize = chunk_item_size(plan)
    # a full float buffer's chunks stored on their own are the next checkpoint's bases
    keyframes = plan.base == "full" and plan.layout == "pages" and sink.keyframes is not None
    areas = staging_areas(staging)
    batches = [plan.chunks] if plan.staged is not None else \
        list(_batches(plan.chunks, len(areas[0])))
    first_chunk = 0
    for number, batch in enumerate(batches):
        if plan.staged is not None:
            filled = plan.staged
        else:
            filled = native.gather(plan.view, [r for pieces in batch for r in pieces],
                                   areas[number % len(areas)])
        # the digests of the staged pages in one call: the pieces of the pages layout start on
        # page boundaries and (all but a buffer's tail) hold whole pages, back to back
        whole = fps is not None and all(n % page == 0 for ps in batch for _, n in ps)
        staged_digests = native.page_fingerprints(filled, page) if whole else None
        sizes = [sum(n for _, n in pieces) for pieces in batch]
        starts = itertools.accumulate(sizes, initial=0)
        bases = renews = None
        if plan.bases is not None:
            bases = plan.bases[first_chunk:first_chunk + len(batch)]
        if keyframes:
            renews = (plan.renews[first_chunk:first_chunk + len(batch)]
                      if plan.renews is not None else [None] * len(batch))
        first_chunk += len(batch)
        cids = sink.put_batch([filled[at:at + size] for at, size in zip(starts, sizes)],
                              itemsize, bases, renews)
        pos = 0
        for pieces, size, cid in zip(batch, sizes, cids):
            coff = 0
            for off, length in pieces:
                extents.append((off, coff, length, cid))
                stored = filled[pos + coff:pos + coff + length]
                if fps is not None:
                    first = off // page * native.FP_BYTES
                    if staged_digests is not None:
                        at = (pos + coff) // page * native.FP_BYTES
                        digests = staged_digests[at:at + length // page * native.FP_BYTES]
                    else:
                        digests = native.page_fingerprints(stored, page)
                    fps[first:first + len(digests)] = digests
                if on_stored is not None and plan.staged is None:
                    on_stored(off, stored)
                coff += length
            pos += size
        if number + 1 < len(batches):
            # the records of this batch are written behind while the next is gathered into
            # the other area; the flush of that one waits for this write (one at a time)
            sink.log.flush(wait=False)
    sink.log.flush()                # staged bytes are referenced by queued records until now
    return BufferEntry(plan.name, len(plan.view), plan.base, plan.depth, plan.layout,
                       plan.page_size, ext.pack(extents))
