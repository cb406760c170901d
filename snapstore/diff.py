"""Which bytes of which buffers differ between two checkpoints (``snapstore diff``).

    from snapstore import diff
    a, b = store.get(3), store.get(7)
    report = diff.diff_checkpoints(store, a, b)
    for buf in report["buffers"]:
        print(buf["name"], buf["status"], buf["ranges"])      # [[offset, length], ...]

It compares restored contents through the public ``Store.read`` in bounded windows (never a
whole buffer in memory), so it works on any store a reader can open, read-only included, and
knows nothing of chunks, chains or the on-disk format: two checkpoints that store the same
bytes differently compare equal. The byte-level pieces (``diff_bytes``, ``diff_buffer``,
``coalesce``) take plain bytes or ``read(offset, length)`` callables and need no store.
"""
from __future__ import annotations

from typing import Callable, Iterable, Optional

from snapstore import errors

WINDOW = 8 << 20          # bytes of each side read and compared at a time
GAP = 16                  # differing runs fewer bytes apart than this are reported as one


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


def _runs_numpy(a, b, base: int):
    import numpy as np
    x = np.frombuffer(a, dtype=np.uint8)
    y = np.frombuffer(b, dtype=np.uint8)
    neq = x != y
    changed = int(np.count_nonzero(neq))
    if not changed:
        return [], 0
    padded = np.empty(len(neq) + 2, dtype=np.bool_)
    padded[0] = padded[-1] = False
    padded[1:-1] = neq
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    starts, ends = edges[0::2], edges[1::2]
    return [(base + int(s), base + int(e)) for s, e in zip(starts, ends)], changed


def _runs_python(a, b, base: int):
    """Exact differing runs without numpy: equal slices are skipped with one memcmp; unequal
    ones are bisected down to 16 bytes."""
    runs: list = []
    changed = 0

    def walk(lo: int, hi: int) -> None:
        nonlocal changed
        if a[lo:hi] == b[lo:hi]:
            return
        if hi - lo <= 16:
            for i in range(lo, hi):
                if a[i] != b[i]:
                    changed += 1
                    if runs and runs[-1][1] == base + i:
                        runs[-1][1] += 1
                    else:
                        runs.append([base + i, base + i + 1])
            return
        mid = (lo + hi) // 2
        walk(lo, mid)
        walk(mid, hi)

    block = 4096
    for lo in range(0, len(a), block):
        walk(lo, min(len(a), lo + block))
    return [(s, e) for s, e in runs], changed


_HAVE_NUMPY: Optional[bool] = None     # imported on first diff, not when this module loads


def _numpy_available() -> bool:
    global _HAVE_NUMPY
    if _HAVE_NUMPY is None:
        try:
            import numpy  # noqa: F401
            _HAVE_NUMPY = True
        except ImportError:
            _HAVE_NUMPY = False
    return _HAVE_NUMPY


def diff_bytes(a, b, base: int = 0, *, use_numpy: Optional[bool] = None):
    """(runs, changed): exact (start, end) runs where equal-length a and b differ (offsets
    shifted by base) and the number of differing bytes. numpy is used when importable unless
    use_numpy says otherwise; both ways give the same answer."""
    if len(a) != len(b):
        raise ValueError("diff_bytes needs equal lengths")
    if a == b:
        return [], 0
    if use_numpy if use_numpy is not None else _numpy_available():
        return _runs_numpy(a, b, base)
    return _runs_python(memoryview(a), memoryview(b), base)


def diff_buffer(read_a: Callable, read_b: Callable, size_a: int, size_b: int, *,
                gap: int = GAP, window: int = WINDOW,
                on_progress: Callable[[int], None] = lambda n: None) -> dict:
    """Compares two buffers through read(offset, length) callables, `window` bytes at a time.

    Returns {"status": "unchanged" | "changed" | "resized", "changed_bytes": exact count of
    differing bytes (bytes past the shorter side count as differing), "ranges": [[offset,
    length], ...] sorted, differing runs fewer than `gap` bytes apart merged}. The ranges do
    not depend on `window`. on_progress(n) is called after each n bytes compared.
    """
    common = min(size_a, size_b)
    ranges: list = []
    changed = 0
    off = 0
    while off < common:
        n = min(window, common - off)
        runs, c = diff_bytes(read_a(off, n), read_b(off, n), off)
        changed += c
        _append_runs(ranges, runs, gap)
        off += n
        on_progress(n)
    if size_a != size_b:
        lo, hi = common, max(size_a, size_b)
        changed += hi - lo
        _append_runs(ranges, [(lo, hi)], gap)
    status = "changed" if changed else "unchanged"
    if size_a != size_b:
        status = "resized"
    return {"status": status, "changed_bytes": changed,
            "ranges": [[s, e - s] for s, e in ranges]}


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
    """How many bytes diff_checkpoints reads from each side (the total of its on_progress)."""
    return sum(min(a.sizes[n], b.sizes[n]) for n in names if n in a.sizes and n in b.sizes)


def diff_checkpoints(store, a, b, names: Optional[Iterable[str]] = None, *, gap: int = GAP,
                     window: int = WINDOW,
                     on_progress: Callable[[int], None] = lambda n: None) -> dict:
    """Compares checkpoints a and b (CheckpointInfo of `store`, e.g. from ``store.get``).

    `names`: the buffers to compare (default: select_buffers(a, b)). Returns {"from": a.id,
    "to": b.id, "gap": gap, "changed_bytes": total, "buffers": [entry, ...]}, one entry per
    name: {"name", "size_from", "size_to" (None on the side without it), "status",
    "changed_bytes", "ranges"} as diff_buffer returns them, with status "removed" / "added"
    (and no ranges) for a buffer only a / only b has.
    """
    names = select_buffers(a, b) if names is None else list(names)
    results = []
    for name in names:
        entry = {"name": name, "size_from": a.sizes.get(name), "size_to": b.sizes.get(name)}
        if name not in b.sizes:
            entry.update(status="removed", changed_bytes=a.sizes[name], ranges=[])
        elif name not in a.sizes:
            entry.update(status="added", changed_bytes=b.sizes[name], ranges=[])
        else:
            entry.update(diff_buffer(
                lambda o, n, _name=name: store.read(a.id, _name, o, n),
                lambda o, n, _name=name: store.read(b.id, _name, o, n),
                a.sizes[name], b.sizes[name], gap=gap, window=window, on_progress=on_progress))
        results.append(entry)
    return {"from": a.id, "to": b.id, "gap": gap,
            "changed_bytes": sum(r["changed_bytes"] for r in results), "buffers": results}
