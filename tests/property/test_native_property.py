"""Property tests: the C core (through snapstore._native) against the pure-Python reference.

Random sizes (0, 1 byte, not multiples of the page size), every page size from 512 B to 64 KiB,
buffers at odd alignments (offsets 1..15 into a bytearray), random dirty patterns, and
streaming FastCDC over random piece boundaries. SNAPSTORE_HYPOTHESIS_PROFILE=slow runs 10x more.
"""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from snapstore import _native as nat


def examples(n: int) -> int:
    """n scaled by the loaded profile (dev: 100 -> n, slow: 1000 -> 10 n)."""
    return max(1, n * settings.default.max_examples // 100)


PAGE_SIZES = st.sampled_from([1 << k for k in range(9, 17)])  # 512 B .. 64 KiB


def random_bytes(seed: int, n: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


def unaligned(raw: bytes, offset: int) -> memoryview:
    """A writable view of raw starting offset bytes into a bytearray (odd alignment)."""
    ba = bytearray(offset) + bytearray(raw) + bytearray(3)
    return memoryview(ba)[offset:offset + len(raw)]


@st.composite
def page_buffers(draw, max_pages=6):
    """(page_size, bytes): sizes from 0 up to max_pages pages, often not page multiples."""
    ps = draw(PAGE_SIZES)
    n = draw(st.one_of(st.integers(0, 2), st.integers(0, ps), st.integers(ps, max_pages * ps),
                       st.integers(1, max_pages).map(lambda k: k * ps),
                       st.tuples(st.integers(1, max_pages), st.integers(-3, 3)).map(
                           lambda t: t[0] * ps + t[1])))
    return ps, random_bytes(draw(st.integers(0, 2**32)), n)


@st.composite
def mutated(draw, max_pages=6):
    """(page_size, old, new, dirty pages): new differs from old exactly on the dirty pages."""
    ps, old = draw(page_buffers(max_pages))
    pages = ref.page_count(len(old), ps)
    dirty = sorted(draw(st.sets(st.integers(0, max(pages - 1, 0)), max_size=pages))) if pages else []
    new = bytearray(old)
    for p in dirty:
        end = min((p + 1) * ps, len(old))
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(p * ps, end - 1))
            new[i] ^= draw(st.integers(1, 255))
    # the XORs of one page could cancel out: recompute the truly dirty pages
    dirty = ref.changed_pages(old, bytes(new), ps)
    return ps, old, bytes(new), dirty


@settings(max_examples=examples(100))
@given(page_buffers(), st.integers(0, 15))
def test_fingerprints_match_reference(pb, offset):
    ps, raw = pb
    got = nat.page_fingerprints(unaligned(raw, offset), ps)
    assert bytes(got) == ref.page_fingerprints(raw, ps)
    assert len(got) == nat.FP_BYTES * nat.page_count(len(raw), ps)


@settings(max_examples=examples(150))
@given(mutated(), st.integers(0, 15), st.integers(0, 15))
def test_fingerprint_diff_matches_reference(m, off_buf, off_fps):
    ps, old, new, dirty = m
    fps = unaligned(ref.page_fingerprints(old, ps), off_fps)
    runs = nat.fingerprint_diff(unaligned(new, off_buf), fps, ps)
    expect_runs, expect_fps = ref.fingerprint_diff(new, ref.page_fingerprints(old, ps), ps)
    assert runs == expect_runs == ref.coalesce(dirty)
    assert bytes(fps) == expect_fps
    assert nat.fingerprint_diff(new, fps, ps) == []


@settings(max_examples=examples(150))
@given(mutated(max_pages=9), st.integers(0, 15), st.integers(0, 15))
def test_fingerprint_diff_in_two_threads_matches_reference(m, off_buf, off_fps):
    """Every buffer of at least two pages is diffed in two halves at once (the threshold
    lowered to 0): the same runs, a run across the border joined, the same digests."""
    ps, old, new, dirty = m
    saved = nat.PARALLEL_DIFF_BYTES
    nat.PARALLEL_DIFF_BYTES = 0
    try:
        fps = unaligned(ref.page_fingerprints(old, ps), off_fps)
        runs = nat.fingerprint_diff(unaligned(new, off_buf), fps, ps)
        assert nat.fingerprint_diff(new, fps, ps) == []
    finally:
        nat.PARALLEL_DIFF_BYTES = saved
    expect_runs, expect_fps = ref.fingerprint_diff(new, ref.page_fingerprints(old, ps), ps)
    assert runs == expect_runs == ref.coalesce(dirty)
    assert bytes(fps) == expect_fps


@settings(max_examples=examples(150))
@given(mutated(), st.integers(0, 15), st.integers(0, 15))
def test_shadow_diff_matches_reference(m, off_buf, off_shadow):
    ps, old, new, dirty = m
    shadow = unaligned(old, off_shadow)
    runs = nat.shadow_diff(unaligned(new, off_buf), shadow, ps)
    assert runs == ref.shadow_diff(new, old, ps)[0] == ref.coalesce(dirty)
    assert bytes(shadow) == new


@settings(max_examples=examples(60))
@given(mutated(), st.integers(0, 15))
def test_runs_to_ranges_gather_rebuilds_new_version(m, offset):
    ps, old, new, dirty = m
    runs = nat.fingerprint_diff(new, nat.page_fingerprints(old, ps), ps)
    ranges = nat.runs_to_ranges(runs, len(new), ps)
    assert ranges == ref.runs_to_ranges(runs, len(new), ps)
    payload = nat.gather(unaligned(new, offset), ranges)
    assert bytes(payload) == ref.gather(new, ranges)
    rebuilt = bytearray(old)
    pos = 0
    for off, n in ranges:
        rebuilt[off:off + n] = payload[pos:pos + n]
        pos += n
    assert bytes(rebuilt) == new and pos == len(payload)


@settings(max_examples=examples(80))
@given(st.integers(0, 2**32), st.integers(0, 5000), st.data())
def test_gather_matches_reference(seed, n, d):
    raw = random_bytes(seed, n)
    ranges = d.draw(st.lists(st.integers(0, n).flatmap(
        lambda o: st.tuples(st.just(o), st.integers(0, n - o))), max_size=20))
    slack = d.draw(st.integers(0, 8))
    out = unaligned(bytes(sum(r[1] for r in ranges) + slack), d.draw(st.integers(0, 15)))
    mv = nat.gather(unaligned(raw, d.draw(st.integers(0, 15))), ranges, out=out)
    assert bytes(mv) == ref.gather(raw, ranges)
    assert bytes(out[len(mv):]) == bytes(slack)


@settings(max_examples=examples(80))
@given(st.integers(0, 2**32), st.data())
def test_gather_many_mixed_ranges(seed, d):
    """Runs of page-like ranges (copied four at a time), mixed with tiny and >= 64 KiB ones."""
    n = 300_000
    raw = random_bytes(seed, n)
    sizes = st.one_of(st.integers(0, 300), st.integers(256, 9000), st.integers(60_000, 70_000))
    lengths = d.draw(st.lists(sizes, max_size=24))
    ranges = [(d.draw(st.integers(0, n - k)), k) for k in lengths]
    assert bytes(nat.gather(raw, ranges)) == ref.gather(raw, ranges)


@settings(max_examples=examples(60))
@given(st.integers(0, 2**32), PAGE_SIZES, st.data())
def test_gather_fingerprints_match_reference(seed, ps, d):
    """The copy and the page digests of what was copied (snap_gather_fp), against the
    reference's gather and page fingerprints: ranges of every size, ranges of 256 KiB and
    more (copied a tile at a time), odd alignments of buf and out, slack after the copy."""
    n = d.draw(st.sampled_from([0, 1, 5000, 700_000]))
    raw = random_bytes(seed, n)
    sizes = st.one_of(st.integers(0, 300), st.integers(256, 9000),
                      st.integers(200_000, 600_000))
    lengths = [k for k in d.draw(st.lists(sizes, max_size=12)) if k <= n]
    ranges = [(d.draw(st.integers(0, n - k)), k) for k in lengths]
    slack = d.draw(st.integers(0, 8))
    out = unaligned(bytes(sum(k for _, k in ranges) + slack), d.draw(st.integers(0, 15)))
    mv, fps = nat.gather_fingerprints(unaligned(raw, d.draw(st.integers(0, 15))), ranges,
                                      out=out, page_size=ps)
    want = ref.gather(raw, ranges)
    assert bytes(mv) == want and bytes(out[len(mv):]) == bytes(slack)
    assert bytes(fps) == ref.page_fingerprints(want, ps)


# ---- FastCDC -----------------------------------------------------------------------------
@st.composite
def cdc_params(draw):
    avg = 1 << draw(st.integers(6, 10))  # 64 .. 1024
    mn = draw(st.integers(64, avg))
    mx = draw(st.integers(avg, 8 * avg))
    return mn, avg, mx


@st.composite
def cdc_inputs(draw):
    """Random, low-entropy (repeating) or constant inputs up to ~24 KiB."""
    size_class = draw(st.sampled_from(["tiny", "small", "large", "large"]))
    n = draw({"tiny": st.integers(0, 3), "small": st.integers(0, 2000),
              "large": st.integers(2000, 24_000)}[size_class])
    kind = draw(st.sampled_from(["random", "repeat", "constant"]))
    seed = draw(st.integers(0, 2**32))
    if kind == "random":
        return random_bytes(seed, n)
    if kind == "constant":
        return bytes([seed & 0xFF]) * n
    unit = random_bytes(seed, draw(st.integers(1, 300)))
    return (unit * (n // len(unit) + 1))[:n]


@settings(max_examples=examples(150))
@given(cdc_params(), cdc_inputs(), st.data())
def test_cdc_streaming_equals_one_shot_equals_reference(params, raw, d):
    one_shot = nat.chunk_boundaries(raw, *params)
    assert one_shot == ref.chunk_boundaries(raw, *params)
    cuts = sorted(d.draw(st.sets(st.integers(0, len(raw)), max_size=12)))
    chunker = nat.Chunker(*params)
    streamed, prev = [], 0
    offset = d.draw(st.integers(0, 15))
    for c in cuts + [len(raw)]:
        streamed += chunker.feed(unaligned(raw[prev:c], offset))
        prev = c
    streamed += chunker.finish()
    assert streamed == one_shot


@settings(max_examples=examples(80))
@given(cdc_params(), cdc_inputs())
def test_cdc_chunk_sizes(params, raw):
    mn, avg, mx = params
    cuts = nat.chunk_boundaries(raw, mn, avg, mx)
    if not raw:
        assert cuts == []
        return
    sizes = np.diff([0] + cuts)
    assert cuts[-1] == len(raw) and (sizes > 0).all() and sizes.max() <= mx
    # every chunk but the last is longer than min_size (or exactly max_size when min == max)
    assert all(s > mn or s == mx for s in sizes[:-1])


@settings(max_examples=examples(30))
@given(cdc_params(), cdc_inputs(), st.integers(1, 2000))
def test_cdc_byte_at_a_time_prefix(params, raw, k):
    """Feeding single bytes (the smallest pieces) gives the one-shot cut points."""
    raw = raw[:k]
    chunker = nat.Chunker(*params)
    got = []
    for i in range(len(raw)):
        got += chunker.feed(raw[i:i + 1])
    got += chunker.finish()
    assert got == nat.chunk_boundaries(raw, *params)


def diff_bytes_reference(a: bytes, b: bytes, gap: int):
    """Differing runs byte by byte, merged when fewer than max(gap, 1) bytes apart."""
    runs: list = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            if runs and i - (runs[-1][0] + runs[-1][1]) < max(gap, 1):
                runs[-1][1] = i + 1 - runs[-1][0]
            else:
                runs.append([i, 1])
    return [tuple(r) for r in runs], sum(x != y for x, y in zip(a, b))


@settings(max_examples=examples(150))
@given(st.integers(0, 2**32), st.integers(0, 3000), st.data())
def test_diff_bytes_matches_reference(seed, n, d):
    a = random_bytes(seed, n)
    b = bytearray(a)
    for _ in range(d.draw(st.integers(0, 12))):
        if n:
            i = d.draw(st.integers(0, n - 1))
            k = d.draw(st.integers(1, 70))
            for j in range(i, min(n, i + k)):
                if d.draw(st.booleans()):
                    b[j] ^= d.draw(st.integers(1, 255))
    gap = d.draw(st.sampled_from([0, 1, 2, 7, 8, 9, 16, 100, 1 << 40]))
    off = d.draw(st.integers(0, 15))
    assert nat.diff_bytes(unaligned(a, off), unaligned(bytes(b), 15 - off), gap) == \
        diff_bytes_reference(a, bytes(b), gap)
