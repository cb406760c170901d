"""Which bytes of which buffers, and which elements of which tensors, differ between two
checkpoints (``snapstore diff``).

    from snapstore import diff
    a, b = store.get(3), store.get(7)
    report = diff.diff_checkpoints(store, a, b)
    for buf in report["buffers"]:
        print(buf["name"], buf["status"], buf["ranges"])      # [[offset, length], ...]

How it is fast (docs/design.md, "diff"):
  1. Content first: ``Store.layout`` maps each byte range of a buffer to the chunk bytes that
     hold it. Ranges both checkpoints map to the same chunk bytes are equal without a read;
     only the rest is read (a checkpoint that changed 1% of its pages reads about 1%).
  2. Those ranges are restored with ``Store.read_ranges`` into two reused windows (one read
     session per window, no per-call allocation) and compared by the C kernel
     (``_native.diff_bytes``: differing runs and the exact count, at memory speed).
  3. Tensors (``tensors=`` catalogues, see diff_checkpoints) are compared element-wise from the
     same windows: no second read.

The byte-level pieces (``diff_bytes``, ``diff_buffer``, ``coalesce``, ``element_diff``) take
plain bytes or ``read(offset, length)`` callables and need no store.
"""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Optional

from snapstore import _native as native
from snapstore import errors
from snapstore.engine.reader import retry_moved

WINDOW = 8 << 20          # bytes of each side read and compared at a time
GAP = 16                  # differing runs fewer bytes apart than this are reported as one
ALIGN = 16                # compared ranges start and split at multiples of this: an element
#                           boundary of every naturally aligned tensor (itemsize 1..16)


def coalesce(ranges: Iterable[tuple], gap: int) -> list:
    """Merges sorted (start, end) ranges whose distance is below `gap` (touching ones always)."""
    out: list = []
    for s, e in ranges:
        if out and s - out[-1][1] < max(gap, 1):
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _append_runs(ranges: list, runs: list, gap: int) -> None:
    """Appends sorted runs that start after every range in `ranges`, coalescing in place
    (only the seam and the new runs are looked at: linear in the number of runs)."""
    if not runs:
        return
    merged = coalesce(runs, gap)
    if ranges and merged[0][0] - ranges[-1][1] < max(gap, 1):
        ranges[-1] = (ranges[-1][0], max(ranges[-1][1], merged[0][1]))
        merged = merged[1:]
    ranges.extend(merged)


def diff_bytes(a, b, base: int = 0, gap: int = 0):
    """(runs, changed): the (start, end) runs where equal-length a and b differ (offsets
    shifted by base; runs fewer than `gap` bytes apart merged, 0: exact) and the exact number
    of differing bytes. The C kernel snap_diff_bytes does the work."""
    if len(a) != len(b):
        raise errors.InvalidArgumentError("diff_bytes needs equal lengths")
    runs, changed = native.diff_bytes(a, b, min(gap, 1 << 62))   # any gap >= len merges all
    return [(base + off, base + off + length) for off, length in runs], changed


# ---- element-wise tensor comparison ----------------------------------------------------------

# dtype name -> (how values are compared, numpy dtype name). "float": |a - b| in float64,
# "int": exact Python int, "complex": |a - b| in complex128, "bf16": bfloat16 bits widened to
# float32. Other dtypes (float8 variants, ...) get changed elements only.
_KINDS = {"bool": ("int", "uint8"), "bfloat16": ("bf16", "uint16"),
          "float16": ("float", "float16"), "half": ("float", "float16"),
          "float32": ("float", "float32"), "float": ("float", "float32"),
          "float64": ("float", "float64"), "double": ("float", "float64"),
          "complex64": ("complex", "complex64"), "complex128": ("complex", "complex128"),
          "cfloat": ("complex", "complex64"), "cdouble": ("complex", "complex128")}
_KINDS.update({f"{p}int{n}": ("int", f"{p}int{n}") for p in ("", "u") for n in (8, 16, 32, 64)})
_KINDS.update({"long": ("int", "int64"), "int": ("int", "int32"), "short": ("int", "int16")})


def dtype_kind(dtype) -> Optional[tuple]:
    """(kind, numpy dtype name) for a dtype given as a numpy or torch name ("float32",
    "torch.bfloat16", numpy/torch dtype objects), or None for one compared bitwise only."""
    name = dtype.__name__ if isinstance(dtype, type) else \
        dtype if isinstance(dtype, str) else getattr(dtype, "name", None) or str(dtype)
    name = name[len("torch."):] if name.startswith("torch.") else name
    return _KINDS.get(name)


def _bits_view(np, data, itemsize: int):
    """The elements of `data` as unsigned ints of `itemsize` bytes (rows of two uint64 for
    16-byte elements, of bytes for odd sizes): equal rows <=> equal element bits."""
    if itemsize in (1, 2, 4, 8):
        return np.frombuffer(data, dtype=f"uint{8 * itemsize}")
    unit = "uint64" if itemsize % 8 == 0 else "uint8"
    per = itemsize // 8 if unit == "uint64" else itemsize
    return np.frombuffer(data, dtype=unit).reshape(-1, per)


def element_diff(a, b, dtype, itemsize: Optional[int] = None) -> tuple:
    """(changed elements, max abs difference) of two equal-length byte strings of elements.

    An element is changed when its bytes differ (so NaN vs the same NaN is unchanged; +0.0 vs
    -0.0 is changed, by 0.0). The max abs difference over changed elements is exact for
    integer and bool dtypes (a Python int), computed in float64 for float dtypes (bfloat16
    via its float32 widening; a Python float) and NaN when a changed element is NaN on
    either side; None for dtypes without arithmetic here (float8...). 0 / 0.0 when nothing
    changed. `itemsize` is needed only for dtypes this module does not know.
    """
    import numpy as np
    kind = dtype_kind(dtype)
    size = np.dtype(kind[1]).itemsize if kind else itemsize
    if not isinstance(size, int) or size < 1:
        raise errors.InvalidArgumentError(f"element_diff needs the itemsize of dtype {dtype!r}")
    if len(a) != len(b) or len(a) % size:
        raise errors.InvalidArgumentError(f"element_diff needs equal lengths that are a "
                                          f"multiple of {size}, got {len(a)} and {len(b)}")
    x, y = _bits_view(np, a, size), _bits_view(np, b, size)
    neq = x != y
    if neq.ndim == 2:
        neq = neq.any(axis=1)
    changed = int(np.count_nonzero(neq))
    zero = 0 if kind and kind[0] == "int" else 0.0
    if kind is None:
        return changed, None
    if not changed:
        return 0, zero
    va, vb = np.frombuffer(a, dtype=kind[1]), np.frombuffer(b, dtype=kind[1])
    if changed < len(neq):
        va, vb = va[neq], vb[neq]
    if kind[0] == "int":
        wide = "uint64" if kind[1].startswith("u") or kind[1] == "uint8" else "int64"
        va, vb = va.astype(wide), vb.astype(wide)
        # |a - b| < 2**64 always: max - min taken modulo 2**64 is exact
        d = np.maximum(va, vb).astype(np.uint64) - np.minimum(va, vb).astype(np.uint64)
        return changed, int(d.max())
    if kind[0] == "bf16":
        va = (va.astype(np.uint32) << 16).view(np.float32)
        vb = (vb.astype(np.uint32) << 16).view(np.float32)
    if kind[0] == "complex":
        d = np.abs(va.astype(np.complex128) - vb.astype(np.complex128))
    else:
        with np.errstate(invalid="ignore", over="ignore"):
            d = va.astype(np.float64)
            np.subtract(d, vb, out=d)           # vb widened on the fly: no second copy
            np.abs(d, out=d)
    return changed, float(d.max())


class _TensorStats:
    """Running changed-element count and max abs difference of one tensor."""

    def __init__(self, entry, kind) -> None:
        self.entry, self.kind = entry, kind
        self.itemsize = _itemsize(entry)
        self.changed = 0
        self.max: object = (0 if kind and kind[0] == "int" else 0.0) if kind else None

    def add(self, a, b) -> None:
        changed, m = element_diff(a, b, self.entry.dtype, self.itemsize)
        self.changed += changed
        if changed and m is not None and self.max is not None:
            if isinstance(m, float) and math.isnan(m) or \
                    isinstance(self.max, float) and math.isnan(self.max):
                self.max = math.nan
            else:
                self.max = max(self.max, m)


# ---- comparing ranges of two buffers --------------------------------------------------------

def _pieces(ranges: list, step: int):
    """Windows of (offset, length) pieces: `ranges` ((start, end), sorted) cut into pieces of
    at most `step` bytes, grouped so a window holds at most `step` bytes."""
    window, held = [], 0
    for s, e in ranges:
        while s < e:
            n = min(e - s, step - held)
            window.append((s, n))
            held += n
            s += n
            if held == step:
                yield window
                window, held = [], 0
    if window:
        yield window


def _compare(ranges: list, read_pair: Callable, *, gap: int, window: int,
             tensors: list, on_progress: Callable[[int], None]) -> tuple:
    """Compares the (start, end) `ranges` of two buffers a window at a time. read_pair(pieces,
    out_a, out_b) fills both with the pieces' bytes back to back. Returns (ranges, changed)
    and adds each tensor's elements in them to its _TensorStats (tensors: [(start, end,
    stats)], element boundaries at multiples of ALIGN)."""
    step = window if not tensors else max(ALIGN, window - window % ALIGN)
    out_a, out_b = bytearray(min(step, sum(e - s for s, e in ranges))), None
    out_b = bytearray(len(out_a))
    va, vb = memoryview(out_a), memoryview(out_b)
    found: list = []
    changed = 0
    for pieces in _pieces(ranges, step):
        total = sum(n for _, n in pieces)
        read_pair(pieces, va[:total], vb[:total])
        pos = 0
        for off, n in pieces:
            pa, pb = va[pos:pos + n], vb[pos:pos + n]
            runs, c = diff_bytes(pa, pb, off, gap)
            changed += c
            _append_runs(found, runs, gap)
            if c:
                for t0, t1, stats in tensors:
                    lo, hi = max(off, t0), min(off + n, t1)
                    if lo < hi:
                        stats.add(pa[lo - off:hi - off], pb[lo - off:hi - off])
            pos += n
        on_progress(total)
    return found, changed


def diff_buffer(read_a: Callable, read_b: Callable, size_a: int, size_b: int, *,
                gap: int = GAP, window: int = WINDOW,
                on_progress: Callable[[int], None] = lambda n: None) -> dict:
    """Compares two buffers through read(offset, length) callables, `window` bytes at a time.

    Returns {"status": "unchanged" | "changed" | "resized", "changed_bytes": exact count of
    differing bytes (bytes past the shorter side count as differing), "ranges": [[offset,
    length], ...] sorted, differing runs fewer than `gap` bytes apart merged}. The ranges do
    not depend on `window`. on_progress(n) is called after each n bytes compared.
    """
    _check_window(window)
    _check_gap(gap)

    def read_pair(pieces, out_a, out_b):
        pos = 0
        for off, n in pieces:
            out_a[pos:pos + n] = read_a(off, n)
            out_b[pos:pos + n] = read_b(off, n)
            pos += n

    common = min(size_a, size_b)
    ranges, changed = _compare([(0, common)] if common else [], read_pair, gap=gap,
                               window=window, tensors=[], on_progress=on_progress)
    return _buffer_result(ranges, changed, size_a, size_b, gap)


def _check_window(window) -> None:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise errors.InvalidArgumentError(f"window must be an int >= 1, got {window!r}")


def _check_gap(gap) -> None:
    if isinstance(gap, bool) or not isinstance(gap, int) or gap < 0:
        raise errors.InvalidArgumentError(f"gap must be an int >= 0, got {gap!r}")


def _buffer_result(ranges: list, changed: int, size_a: int, size_b: int, gap: int) -> dict:
    if size_a != size_b:
        lo, hi = min(size_a, size_b), max(size_a, size_b)
        changed += hi - lo
        _append_runs(ranges, [(lo, hi)], gap)
    status = "resized" if size_a != size_b else "changed" if changed else "unchanged"
    return {"status": status, "changed_bytes": changed,
            "ranges": [[s, e - s] for s, e in ranges]}


def unshared_ranges(layout_a: list, layout_b: list, end: int) -> list:
    """The (start, end) ranges of [0, end) where two buffer layouts (Store.layout: sorted
    (offset, length, chunk_id, chunk_offset), covering) do not map to the same chunk bytes:
    the only ranges whose bytes may differ. Sorted, touching ones merged."""
    out: list = []
    i = j = 0
    pos = 0
    while pos < end:
        while i < len(layout_a) and layout_a[i][0] + layout_a[i][1] <= pos:
            i += 1
        while j < len(layout_b) and layout_b[j][0] + layout_b[j][1] <= pos:
            j += 1
        if i == len(layout_a) or j == len(layout_b):     # not covering: compare the rest
            _append_runs(out, [(pos, end)], 0)
            break
        oa, la, ca, xa = layout_a[i]
        ob, lb, cb, xb = layout_b[j]
        stop = min(oa + la, ob + lb, end)
        if ca != cb or xa - oa != xb - ob or oa > pos or ob > pos:
            _append_runs(out, [(pos, stop)], 0)
        pos = stop
    return out


def _aligned(ranges: list, end: int) -> list:
    """ranges widened to multiples of ALIGN (capped at end), merged."""
    return coalesce(((s - s % ALIGN, min(end, -(-e // ALIGN) * ALIGN)) for s, e in ranges), 0)


# ---- checkpoints ----------------------------------------------------------------------------

def select_buffers(a, b, only: Iterable[str] = ()) -> list:
    """The buffer names a diff of checkpoints a and b (CheckpointInfo) covers, in order: a's
    buffers, then b's new ones; only those in `only` when it is not empty.
    CheckpointNotFound when a name in `only` is in neither checkpoint."""
    names = list(dict.fromkeys(list(a.sizes) + list(b.sizes)))
    only = list(only)
    if only:
        missing = [n for n in only if n not in names]
        if missing:
            raise errors.CheckpointNotFound(
                f"no buffer {missing[0]!r} in checkpoint {a.id} or {b.id}")
        names = [n for n in names if n in only]
    return names


def bytes_to_compare(a, b, names: Iterable[str]) -> int:
    """The bytes diff_checkpoints covers (the total of its on_progress): the common part of
    each buffer both checkpoints have, whether compared or proven equal by its chunks."""
    return sum(min(a.sizes[n], b.sizes[n]) for n in names if n in a.sizes and n in b.sizes)


def _tensor_key(t) -> tuple:
    return (str(t.dtype), tuple(t.shape), getattr(t, "strides", None), t.nbytes)


def _itemsize(t) -> int:
    """Bytes per element of catalogue entry t (its own figure, else nbytes / elements)."""
    size = getattr(t, "itemsize", None)
    return size if size else t.nbytes // max(1, math.prod(t.shape)) or 1


def _dense(t) -> bool:
    """True when t's bytes are exactly its elements (no gaps between strided elements)."""
    return t.nbytes == math.prod(t.shape) * _itemsize(t)


def _plan_tensors(cat_a: list, cat_b: list, names: list, a, b) -> tuple:
    """(in_place, apart, entries): in_place {buffer: [(start, end, stats)]} for tensors at the
    same naturally aligned place of the same buffer on both sides (compared from the byte
    windows), apart: [stats] for the rest of the comparable ones (read on their own), and
    the per-tensor report entries in order (a's tensors, then b's new ones)."""
    by_b = {t.name: t for t in cat_b}
    names_a = {t.name for t in cat_a}
    wanted = set(names)
    in_place: dict = {}
    apart: list = []
    entries: list = []
    for t in cat_a:
        u = by_b.get(t.name)
        entry = {"name": t.name, "dtype": str(t.dtype), "shape": list(t.shape),
                 "elements": math.prod(t.shape)}
        entries.append(entry)
        if u is None:
            entry["status"] = "removed"
            continue
        if _tensor_key(t) != _tensor_key(u):
            entry.update(status="retyped", dtype_to=str(u.dtype), shape_to=list(u.shape))
            continue
        elsewhere = getattr(t, "checkpoint", None) is not None or \
            getattr(u, "checkpoint", None) is not None          # DCP: another rank's part
        if not _dense(t) or not elsewhere and (
                t.buffer not in wanted or u.buffer not in wanted or
                t.offset + t.nbytes > a.sizes.get(t.buffer, -1) or
                u.offset + u.nbytes > b.sizes.get(u.buffer, -1)):
            entry["status"] = "skipped"       # buffer not compared, or elements with gaps
            continue
        stats = _TensorStats(t, dtype_kind(t.dtype))
        entry["stats"] = stats
        itemsize = stats.itemsize
        if not elsewhere and (t.buffer, t.offset) == (u.buffer, u.offset) and \
                t.offset % itemsize == 0 and ALIGN % itemsize == 0:
            in_place.setdefault(t.buffer, []).append((t.offset, t.offset + t.nbytes, stats))
        else:
            apart.append((t, u, stats))
    for u in cat_b:
        if u.name not in names_a:
            entries.append({"name": u.name, "dtype": str(u.dtype), "shape": list(u.shape),
                            "elements": math.prod(u.shape), "status": "added"})
    return in_place, apart, entries


def _diff_apart(store, a, b, t, u, stats, window: int) -> None:
    """Compares one tensor that lies at different places on the two sides, in windows."""
    step = max(stats.itemsize, window - window % stats.itemsize)
    id_a = a.id if getattr(t, "checkpoint", None) is None else t.checkpoint
    id_b = b.id if getattr(u, "checkpoint", None) is None else u.checkpoint
    for pos in range(0, t.nbytes, step):
        n = min(step, t.nbytes - pos)
        stats.add(_read_ranges(store, id_a, t.buffer, [(t.offset + pos, n)]),
                  _read_ranges(store, id_b, u.buffer, [(u.offset + pos, n)]))


def _read_ranges(store, checkpoint_id: int, name: str, ranges, out=None):
    """store.read_ranges, made again when a compaction moved the chunks while they were read
    (each time on a new index snapshot: the ranges' bytes never change)."""
    return retry_moved(lambda: store.read_ranges(checkpoint_id, name, ranges, out),
                       f"diff: checkpoint {checkpoint_id} buffer {name!r}")


def _tensor_report(entries: list) -> list:
    out = []
    for e in entries:
        stats = e.pop("stats", None)
        if stats is not None:
            e.update(status="changed" if stats.changed else "unchanged",
                     changed_elements=stats.changed, max_abs_diff=stats.max)
        out.append(e)
    return out


def diff_checkpoints(store, a, b, names: Optional[Iterable[str]] = None, *, gap: int = GAP,
                     window: int = WINDOW,
                     on_progress: Callable[[int], None] = lambda n: None,
                     tensors: Optional[tuple] = None) -> dict:
    """Compares checkpoints a and b of `store` (CheckpointInfo, e.g. from ``store.get``, or
    any name ``store.get`` takes: an id, a tag, latest:STREAM...).

    `names`: the buffers to compare (default: select_buffers(a, b); CheckpointNotFound for a
    name in neither checkpoint). Returns {"from": a.id,
    "to": b.id, "gap": gap, "changed_bytes": total, "buffers": [entry, ...]}, one entry per
    name: {"name", "size_from", "size_to" (None on the side without it), "status",
    "changed_bytes", "ranges"} as diff_buffer returns them, with status "removed" / "added"
    (and no ranges) for a buffer only a / only b has.

    `tensors`: (catalogue of a, catalogue of b), lists of entries with name, dtype, shape,
    buffer, offset, nbytes and optionally strides, checkpoint (a buffer of another
    checkpoint), itemsize: snapstore.tensors.tensor_catalogue. The report then also has
    "tensors": one entry per name {"name", "dtype", "shape", "elements", "status"}: status
    "changed" / "unchanged" with "changed_elements" and "max_abs_diff" (element_diff),
    "added" / "removed", "retyped" (dtype, shape or layout differ: "dtype_to", "shape_to"),
    or "skipped" (its buffer is not compared, or its elements lie apart: a strided view).
    """
    a, b = store.get(a), store.get(b)       # CheckpointInfo, or any name get() takes
    _check_window(window)
    _check_gap(gap)
    if names is None:
        names = select_buffers(a, b)
    else:
        if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
            raise errors.InvalidArgumentTypeError(
                f"names must be a list of buffer names, got {type(names).__name__}")
        names = list(dict.fromkeys(names))
        for name in names:
            if not isinstance(name, str):
                raise errors.InvalidArgumentTypeError(
                    f"a buffer name must be a str, got {type(name).__name__}")
        select_buffers(a, b, names)         # CheckpointNotFound for a name in neither
    in_place, apart, entries = _plan_tensors(*tensors, names, a, b) if tensors else ({}, [], [])
    results = []
    for name in names:
        entry = {"name": name, "size_from": a.sizes.get(name), "size_to": b.sizes.get(name)}
        if name not in b.sizes:
            entry.update(status="removed", changed_bytes=a.sizes[name], ranges=[])
        elif name not in a.sizes:
            entry.update(status="added", changed_bytes=b.sizes[name], ranges=[])
        else:
            entry.update(_diff_stored(store, a, b, name, gap, window, in_place.get(name, []),
                                      on_progress))
        results.append(entry)
    for t, u, stats in apart:
        _diff_apart(store, a, b, t, u, stats, window)
    report = {"from": a.id, "to": b.id, "gap": gap,
              "changed_bytes": sum(r["changed_bytes"] for r in results), "buffers": results}
    if tensors:
        report["tensors"] = _tensor_report(entries)
    return report


def _diff_stored(store, a, b, name: str, gap: int, window: int, tensors: list,
                 on_progress: Callable[[int], None]) -> dict:
    """diff_buffer's result for buffer `name` of checkpoints a and b: reads only the ranges
    whose chunks differ, into reused windows."""
    size_a, size_b = a.sizes[name], b.sizes[name]
    common = min(size_a, size_b)
    ranges = unshared_ranges(store.layout(a.id, name), store.layout(b.id, name), common)
    if tensors:
        ranges = _aligned(ranges, common)
    shared = common - sum(e - s for s, e in ranges)
    for done in range(0, shared, window):           # proven equal: done without a read
        on_progress(min(window, shared - done))

    def read_pair(pieces, out_a, out_b):      # both sides at once: decoding releases the GIL
        other = helper.submit(_read_ranges, store, b.id, name, pieces, out_b)
        try:
            _read_ranges(store, a.id, name, pieces, out_a)
        finally:
            other.result()

    with ThreadPoolExecutor(1, thread_name_prefix="snapstore-diff") as helper:
        found, changed = _compare(ranges, read_pair, gap=gap, window=window, tensors=tensors,
                                  on_progress=on_progress)
    return _buffer_result(found, changed, size_a, size_b, gap)
