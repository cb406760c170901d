"""Unit and property tests of snapstore.extents: manifests as extent lists.

The model: an extent (off, coff, length, cid) says "buffer bytes [off, off + length) are bytes
[coff, coff + length) of chunk cid". Applying a manifest to a byte-array model writes, for every
covered buffer byte, the pair (cid, offset inside the chunk). overlay(base, patch) must equal
applying base then patch; clip(m, a, b) must equal m restricted to [a, b).
"""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapstore.engine import extents as ext
from snapstore.engine import format as fmt


def cid(n: int) -> bytes:
    return bytes([n]) * 32


A, B, C, D = cid(1), cid(2), cid(3), cid(4)


def apply(model: dict, extents) -> dict:
    """Writes extents onto a sparse byte map {buffer offset: (chunk id, chunk offset)}."""
    for off, coff, length, c in extents:
        for i in range(length):
            model[off + i] = (c, coff + i)
    return model


def as_map(extents) -> dict:
    return apply({}, extents)


def assert_well_formed(extents):
    """Sorted by offset, no overlaps, no empty extents."""
    prev_end = -1
    for off, coff, length, c in extents:
        assert length > 0, extents
        assert off >= prev_end, extents
        assert coff >= 0
        assert len(c) == 32
        prev_end = off + length


# ---- pack / unpack / count / covered_bytes ----------------------------------------------
def test_pack_unpack_roundtrip():
    extents = [(0, 0, 10, A), (10, 5, 7, B), ((1 << 40), (1 << 32) - 1, (1 << 32) - 1, C)]
    blob = ext.pack(extents)
    assert len(blob) == 3 * fmt.EXTENT.size
    assert ext.unpack(blob) == extents
    assert ext.count(blob) == 3
    assert ext.covered_bytes(extents) == 17 + (1 << 32) - 1


def test_pack_empty():
    assert ext.pack([]) == b""
    assert ext.unpack(b"") == []
    assert ext.count(b"") == 0
    assert ext.covered_bytes([]) == 0


# ---- overlay -----------------------------------------------------------------------------
def test_overlay_empty_patch_keeps_base():
    base = [(0, 0, 10, A), (10, 0, 10, B)]
    assert ext.overlay(base, []) == base


def test_overlay_empty_base_is_patch():
    patch = [(4, 0, 4, C)]
    assert ext.overlay([], patch) == patch


def test_overlay_patch_in_middle_splits_base():
    out = ext.overlay([(0, 0, 100, A)], [(40, 0, 10, B)])
    assert out == [(0, 0, 40, A), (40, 0, 10, B), (50, 50, 50, A)]


def test_overlay_patch_covering_whole_extent_removes_it():
    out = ext.overlay([(0, 0, 10, A), (10, 0, 10, B), (20, 0, 10, C)], [(10, 3, 10, D)])
    assert out == [(0, 0, 10, A), (10, 3, 10, D), (20, 0, 10, C)]


def test_overlay_patch_spanning_two_extents():
    out = ext.overlay([(0, 0, 10, A), (10, 100, 10, B)], [(5, 0, 10, C)])
    assert out == [(0, 0, 5, A), (5, 0, 10, C), (15, 105, 5, B)]


def test_overlay_patch_at_start_and_end():
    out = ext.overlay([(0, 7, 10, A)], [(0, 0, 2, B), (8, 0, 2, C)])
    assert out == [(0, 0, 2, B), (2, 9, 6, A), (8, 0, 2, C)]


def test_overlay_several_patches_in_one_extent_keep_chunk_offsets():
    base = [(100, 1000, 50, A)]
    patch = [(105, 0, 5, B), (120, 5, 5, B), (140, 10, 10, B)]
    out = ext.overlay(base, patch)
    assert out == [(100, 1000, 5, A), (105, 0, 5, B), (110, 1010, 10, A), (120, 5, 5, B),
                   (125, 1025, 15, A), (140, 10, 10, B)]
    assert_well_formed(out)


def test_overlay_patch_outside_base_is_kept():
    out = ext.overlay([(0, 0, 10, A)], [(20, 0, 5, B)])
    assert out == [(0, 0, 10, A), (20, 0, 5, B)]


def test_overlay_adjacent_patch_does_not_cut_base():
    out = ext.overlay([(10, 0, 10, A)], [(0, 0, 10, B), (20, 0, 10, C)])
    assert out == [(0, 0, 10, B), (10, 0, 10, A), (20, 0, 10, C)]


def test_overlay_patch_covering_everything():
    base = [(0, 0, 3, A), (3, 0, 3, B), (6, 0, 3, C)]
    assert ext.overlay(base, [(0, 0, 9, D)]) == [(0, 0, 9, D)]


def test_overlay_is_associative_on_a_chain():
    full = [(0, 0, 64, A)]
    d1 = [(8, 0, 8, B), (40, 8, 8, B)]
    d2 = [(12, 0, 32, C)]
    left = ext.overlay(ext.overlay(full, d1), d2)
    right = ext.overlay(full, ext.overlay(d1, d2))
    assert as_map(left) == as_map(right) == apply(apply(as_map(full), d1), d2)


# ---- clip --------------------------------------------------------------------------------
def test_clip_inside_one_extent_adjusts_chunk_offset():
    assert ext.clip([(100, 7, 50, A)], 110, 120) == [(110, 17, 10, A)]


def test_clip_across_extents():
    extents = [(0, 0, 10, A), (10, 0, 10, B), (20, 5, 10, C)]
    assert ext.clip(extents, 5, 25) == [(5, 5, 5, A), (10, 0, 10, B), (20, 5, 5, C)]


def test_clip_boundaries_are_half_open():
    extents = [(0, 0, 10, A), (10, 0, 10, B)]
    assert ext.clip(extents, 10, 20) == [(10, 0, 10, B)]
    assert ext.clip(extents, 0, 10) == [(0, 0, 10, A)]
    assert ext.clip(extents, 9, 11) == [(9, 9, 1, A), (10, 0, 1, B)]


def test_clip_empty_and_outside_ranges():
    extents = [(10, 0, 10, A)]
    assert ext.clip(extents, 0, 10) == []
    assert ext.clip(extents, 20, 30) == []
    assert ext.clip(extents, 10, 10) == []
    assert ext.clip(extents, 20, 20) == []
    assert ext.clip([], 0, 100) == []


def test_clip_empty_range_inside_an_extent_is_empty():
    # was a bug: a zero-length extent came back, and read(length=0) read a chunk for it
    assert ext.clip([(10, 0, 10, A)], 15, 15) == []
    assert ext.clip([(10, 0, 10, A)], 10, 10) == []


def test_clip_reversed_range_is_empty():
    assert ext.clip([(10, 0, 10, A)], 18, 12) == []
    assert ext.clip([(0, 0, 100, A), (100, 0, 5, B)], 101, 3) == []


def test_clip_whole_range_is_identity():
    extents = [(0, 3, 10, A), (12, 0, 4, B)]
    assert ext.clip(extents, 0, 16) == extents
    assert ext.clip(extents, 0, 1 << 50) == extents


def test_clip_accepts_an_iterator():
    assert ext.clip(iter([(0, 0, 10, A)]), 2, 4) == [(2, 2, 2, A)]


# ---- properties against the byte-array model --------------------------------------------
SPAN = 200


@st.composite
def manifests(draw, span=SPAN):
    """Sorted, non-overlapping extents with random gaps inside [0, span)."""
    cuts = sorted(draw(st.sets(st.integers(0, span), max_size=12)))
    extents = []
    for lo, hi in zip(cuts, cuts[1:]):
        if hi > lo and draw(st.booleans()):
            c = cid(draw(st.integers(0, 5)))
            coff = draw(st.integers(0, 1000))
            extents.append((lo, coff, hi - lo, c))
    return extents


@settings(max_examples=300, deadline=None)
@given(manifests(), manifests())
def test_overlay_matches_model(base, patch):
    out = ext.overlay(base, patch)
    assert_well_formed(out)
    assert as_map(out) == apply(as_map(base), patch)
    assert ext.covered_bytes(out) == len(as_map(out))
    assert ext.unpack(ext.pack(out)) == out


@settings(max_examples=200, deadline=None)
@given(st.lists(manifests(), min_size=1, max_size=5))
def test_overlay_chain_matches_model(layers):
    """A chain full -> d1 -> d2 ... folded left equals applying the layers in order, and
    folding the deltas together first (what delete does) gives the same bytes."""
    folded = layers[0]
    model = as_map(layers[0])
    for layer in layers[1:]:
        folded = ext.overlay(folded, layer)
        apply(model, layer)
        assert_well_formed(folded)
    assert as_map(folded) == model
    if len(layers) >= 3:
        merged = ext.overlay(layers[1], layers[2])       # delete of the middle layer
        rest = ext.overlay(ext.overlay(layers[0], merged), [])
        for layer in layers[3:]:
            rest = ext.overlay(rest, layer)
        assert as_map(rest) == model


@settings(max_examples=200, deadline=None)
@given(st.lists(manifests(), min_size=1, max_size=5))
def test_flatten_matches_model(layers):
    model = {}
    for layer in layers:
        apply(model, layer)
    out = ext.flatten(layers)
    assert_well_formed(out)
    assert as_map(out) == model


def test_flatten_single_layer_is_itself():
    assert ext.flatten([[(0, 0, 4, A)]]) == [(0, 0, 4, A)]
    assert ext.flatten([[]]) == []


@settings(max_examples=300, deadline=None)
@given(manifests(), st.integers(0, SPAN + 10), st.integers(0, SPAN + 10))
def test_clip_matches_model(extents, a, n):
    start, end = a, a + n           # empty ranges too
    out = ext.clip(extents, start, end)
    assert_well_formed(out)
    assert all(start <= off and off + n <= end for off, _, n, _ in out)
    expected = {k: v for k, v in as_map(extents).items() if start <= k < end}
    assert as_map(out) == expected


@settings(max_examples=200, deadline=None)
@given(manifests(), manifests(), st.integers(0, SPAN), st.integers(0, SPAN))
def test_clip_commutes_with_overlay(base, patch, a, n):
    start, end = a, a + n
    whole = ext.clip(ext.overlay(base, patch), start, end)
    parts = ext.overlay(ext.clip(base, start, end), ext.clip(patch, start, end))
    assert as_map(whole) == as_map(parts)


@pytest.mark.parametrize("extents", [[], [(0, 0, 1, A)], [(5, 2, 3, B), (8, 0, 100, C)]])
def test_overlay_with_itself_is_itself(extents):
    assert as_map(ext.overlay(extents, extents)) == as_map(extents)
