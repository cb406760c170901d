"""Property tests of the dirty-page detectors (snapstore/dirty.py): whatever is written, however
and wherever, the ranges dirty() reports contain every byte that differs from the buffer as it
was at the previous call, and a caller following the protocol (copy the ranges, note_stored)
holds an exact image of the buffer whenever nothing was written during its copy.

"The buffer as it was at the previous call" is, precisely, what the caller holds: the same
thing unless a write raced with the previous copy, in which case the caller holds (and told
note_stored) the bytes it copied.

Buffers are slices of one numpy array at random offsets and lengths (0 bytes, 1 byte, not page
multiples, not page aligned), several tracked at once in different modes, written through
numpy, memoryview slices, ctypes.memmove and a second thread, including writes that straddle
buffer edges and writes racing with the copy (then reverted: the revert race).
SNAPSTORE_HYPOTHESIS_PROFILE=slow runs 10x more.
"""
from __future__ import annotations

import ctypes
import threading

import numpy as np
from hypothesis import event, given, settings
from hypothesis import strategies as st

from snapstore import _native as nat
from snapstore.capture import dirty

UFFD_OK, _ = dirty.uffd_available()
MODES = ["auto", "hash", "shadow", "full"] + (["uffd"] if UFFD_OK else [])
PAGE_SIZES = st.sampled_from([512, 4096, 16384])
TOTAL = 24 * 4096


def examples(n: int) -> int:
    """n scaled by the loaded profile (dev: 100 -> n, slow: 1000 -> 10 n)."""
    return max(1, n * settings.default.max_examples // 100)


@st.composite
def layouts(draw):
    """Up to 3 non-overlapping (start, end) slices of the TOTAL-byte array, in random order."""
    cuts = sorted(draw(st.lists(st.integers(0, TOTAL), min_size=2, max_size=6)))
    pairs = list(zip(cuts[::2], cuts[1::2]))
    if draw(st.booleans()):
        pairs.append((s := draw(st.integers(0, TOTAL - 1)), s + 1))       # a 1-byte buffer
        pairs = [pairs[-1]] + [p for p in pairs[:-1] if p[1] <= s or p[0] > s]
    return pairs[:3]


WRITE = st.tuples(st.sampled_from(["numpy", "memoryview", "memmove", "thread"]),
                  st.integers(0, TOTAL - 1), st.integers(1, 5000), st.integers(0, 2**32 - 1))
ROUND = st.tuples(st.lists(WRITE, max_size=6),           # writes before dirty()
                  st.one_of(st.none(), WRITE),           # a write racing with the copy
                  st.booleans())                         # revert it at the start of next round


def do_write(big: np.ndarray, how: str, off: int, n: int, seed: int) -> None:
    n = min(n, big.size - off)
    data = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    if how == "numpy":
        big[off:off + n] = data
    elif how == "memoryview":
        mv = memoryview(big)
        mv[off:off + n] = data.tobytes()
        mv.release()
    elif how == "memmove":
        ctypes.memmove(big.ctypes.data + off, data.tobytes(), n)
    else:
        t = threading.Thread(target=big.__setitem__, args=(slice(off, off + n), data))
        t.start()
        t.join()


def check_ranges(ranges, n, ps):
    prev_end = -1
    for off, length in ranges:
        assert length > 0 and off > prev_end and off % ps == 0
        assert off + length <= n and ((off + length) % ps == 0 or off + length == n)
        prev_end = off + length


@settings(max_examples=examples(60))
@given(layout=layouts(), modes=st.lists(st.sampled_from(MODES), min_size=3, max_size=3),
       ps=PAGE_SIZES, rounds=st.lists(ROUND, min_size=1, max_size=5), shift=st.integers(0, 64))
def test_reported_ranges_cover_every_change(layout, modes, ps, rounds, shift):
    store = np.random.default_rng(shift).integers(0, 256, TOTAL + 64, dtype=np.uint8)
    big = store[shift:shift + TOTAL]                       # not page aligned in general
    dets, views, images, last = [], [], [], []
    try:
        for (a, b), mode in zip(layout, modes):
            if mode == "uffd" and b > a:
                mode = "auto"                              # may overlap a tracked page: no raise
            d = dirty.make_detector(big[a:b], mode, ps)
            dets.append(d)
            views.append(big[a:b])
            assert d.dirty() is None
            images.append(bytearray(big[a:b].tobytes()))   # the caller's full diff
            last.append(big[a:b].tobytes())
        undo = None
        for writes, race, revert in rounds:
            if undo is not None and revert:
                big[undo[0]:undo[0] + len(undo[1])] = np.frombuffer(undo[1], np.uint8)
            undo = None
            for w in writes:
                do_write(big, *w)
            results = [d.dirty() for d in dets]
            snaps = [v.tobytes() for v in views]
            if race is not None:                           # written between dirty() and copy
                off, n = race[1], min(race[2], TOTAL - race[1])
                undo = (off, big[off:off + n].tobytes())
                do_write(big, *race)
            for i, (d, v, ranges) in enumerate(zip(dets, views, results)):
                assert ranges is not None
                check_ranges(ranges, len(v), ps)
                mask = np.zeros(len(v), bool)
                for off, length in ranges:
                    mask[off:off + length] = True
                # Every byte that differs from what the caller holds must be reported. Without
                # a race that image is the snapshot at the previous call; a page written during
                # the previous copy is held as copied (note_stored told the detector so).
                changed = np.frombuffer(snaps[i], np.uint8) != np.frombuffer(images[i], np.uint8)
                assert not (changed & ~mask).any(), (d.mode, np.flatnonzero(changed & ~mask)[:5])
                if last[i] == bytes(images[i]):
                    assert not ((np.frombuffer(snaps[i], np.uint8) !=
                                 np.frombuffer(last[i], np.uint8)) & ~mask).any()
                for off, length in ranges:
                    copy = v[off:off + length].tobytes()
                    images[i][off:off + length] = copy
                    d.note_stored(off, memoryview(copy))
                if race is None:
                    assert bytes(images[i]) == v.tobytes(), d.mode
                last[i] = snaps[i]
        # quiescent: one more round makes every image exact
        for d, v, img in zip(dets, views, images):
            for off, length in d.dirty():
                img[off:off + length] = v[off:off + length].tobytes()
            assert bytes(img) == v.tobytes(), d.mode
    finally:
        for d in dets:
            d.close()


@settings(max_examples=examples(40))
@given(start=st.integers(0, 3 * 4096), length=st.integers(0, 12 * 4096),
       pages=st.lists(st.tuples(st.integers(0, 20 * 4096), st.integers(1, 9000)), max_size=8),
       mode=st.sampled_from(MODES))
def test_writes_outside_the_buffer_never_break_it(start, length, pages, mode):
    """Writes all around (and across) a buffer's edges: its report covers exactly what changed
    inside it; bytes outside never appear (ranges stay inside the buffer)."""
    big = np.zeros(24 * 4096, np.uint8)
    view = big[start:start + length]
    d = dirty.make_detector(view, "auto" if mode == "uffd" else mode)
    try:
        assert d.dirty() is None
        before = view.tobytes()
        for off, n in pages:
            big[off:off + n] += 1
        ranges = d.dirty()
        check_ranges(ranges, length, 4096)
        mask = np.zeros(length, bool)
        for off, n in ranges:
            mask[off:off + n] = True
        changed = np.frombuffer(before, np.uint8) != view
        assert not (changed & ~mask).any()
        if d.mode != "full":
            # exact on the 4 KiB grid: a reported page really changed
            for off, n in ranges:
                for page in range(off, off + n, 4096):
                    assert changed[page:page + 4096].any(), (d.mode, page)
    finally:
        d.close()


NOTES = st.sampled_from(["many", "many-nofp", "single", "none"])


def page_runs(pages, n, ps):
    """Sorted page numbers -> merged byte ranges on the ps grid, the last clipped to n."""
    out = []
    for p in pages:
        if out and out[-1][0] + out[-1][1] == p * ps:
            out[-1] = (out[-1][0], min(n, (p + 1) * ps) - out[-1][0])
        else:
            out.append((p * ps, min(n, (p + 1) * ps) - p * ps))
    return out


@settings(max_examples=examples(80), deadline=None)
@given(n=st.integers(1, 24 * 512), ps=st.sampled_from([512, 1024]),
       rounds=st.lists(st.tuples(st.lists(st.integers(0, 2**31), max_size=30), NOTES),
                       min_size=1, max_size=12))
def test_hash_detector_matches_a_reference_model(n, ps, rounds):
    """A "hash" detector against a model of it: after an interval that changed at least
    DENSE_FRACTION of the pages it reports the whole buffer (no pass); otherwise exactly the
    pages that differ from its baseline. The baseline is the live content at a hashing
    dirty(), then the copies noted; evidence for "still dense" comes only from copies noted
    with note_stored_many. The threshold's size floor is lowered to 0 so small buffers show it."""
    floor = dirty.DENSE_MIN_BYTES
    dirty.DENSE_MIN_BYTES = 0
    buf = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    d = dirty.make_detector(buf, "hash", ps)
    try:
        pages = -(-n // ps)
        assert d.dirty() is None
        base = buf.tobytes()                       # the detector's baseline, modelled
        dense = False
        for writes, note in rounds:
            for w in writes:
                buf[w % n] ^= 1 + w % 255          # always a change of that byte
            live = buf.tobytes()
            differ = [p for p in range(pages) if live[p * ps:(p + 1) * ps] !=
                      base[p * ps:(p + 1) * ps]]
            got = d.dirty()
            event("skipped pass" if dense else "hashed")
            if dense:
                assert got == [(0, n)]
            else:
                assert got == page_runs(differ, n, ps)
                base = live
            counted = None
            if note in ("many", "many-nofp"):
                staged, fps = nat.gather_fingerprints(buf, got, page_size=ps)
                d.note_stored_many(got, staged, fps if note == "many" else None)
                counted = sum(live[o:o + k] != base[o:o + k]
                              for o, k in ((p * ps, ps) for p in range(pages))
                              if any(a <= o < a + b for a, b in got))
            elif note == "single":
                for off, length in got:
                    d.note_stored(off, buf[off:off + length].tobytes())
            if note != "none":
                for off, length in got:
                    base = base[:off] + live[off:off + length] + base[off + length:]
            if dense:
                dense = counted is not None and counted >= dirty.DENSE_FRACTION * pages
            else:
                dense = len(differ) >= dirty.DENSE_FRACTION * pages
    finally:
        dirty.DENSE_MIN_BYTES = floor
        d.close()
