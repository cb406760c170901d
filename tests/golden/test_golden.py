"""Pinned known answers of the on-disk-relevant kernels: page fingerprints and FastCDC cut points.

These values are part of the storage format (fingerprints are compared across versions, cut
points decide deduplication). If one of these tests fails, the format drifted: do not just
update the numbers, bump the format version and explain why.
"""
import hashlib

import pytest

import reference as ref
from snapstore import _native as nat

# Deterministic pseudo-random 4 MiB input (SHAKE-128 of a fixed label).
GOLDEN = hashlib.shake_128(b"snapstore golden input v1").digest(4 << 20)

# XXH3-128 (seed 0) of single pages, in snapstore's layout: low64 LE then high64 LE.
PAGE_FPS = [
    (bytes(4096), 4096, "ba89c648e16fd79395e47e9e4fdce83e"),
    (bytes(range(256)) * 16, 4096, "51918707377c4beb667a9f9678659103"),
    (b"\xff" * 512, 512, "7ad3a771269a67de8d83bd3036ee5e6a"),
    (b"\x00", 4096, "dbec4e07f4df4bc46a0f0092935ecda6"),
    ((bytes(range(256)) * 4)[:1000], 4096, "500ef6460bd83dd32a0d12b7027e6f07"),
    (GOLDEN[:4096], 4096, "e115a974b9af97e9dbbe84459b8a94d8"),
]

# sha256 of the fingerprints of the whole golden input.
FPS_SHA256 = {
    4096: "d728f494e946dc50bafbac748405509552f9b9f7e25b4ceadc0ddec9669acfa0",
    65536: "8a9e8ea47f598fbaf4876c81b4afb5eb717b81890934aaf69b9f6a80b39e46fc",
}

# FastCDC cut points of GOLDEN with the default sizes 16 KiB / 64 KiB / 256 KiB.
CUTS_DEFAULT = [
    65956, 137504, 187132, 264497, 330856, 424175, 499395, 569249, 673469, 771015, 836985,
    930847, 1002056, 1035428, 1109438, 1182374, 1252659, 1333383, 1470548, 1546794, 1639905,
    1710674, 1776558, 1844515, 1957366, 2009332, 2088954, 2160604, 2197432, 2274181, 2366100,
    2437015, 2505295, 2618149, 2688297, 2758642, 2825858, 2901820, 2988100, 3056685, 3104247,
    3138488, 3207633, 3248304, 3315575, 3393777, 3467897, 3518572, 3636293, 3711109, 3779751,
    3854413, 3954948, 4025598, 4127260, 4194304,
]

# Cut points with small sizes 256 / 1024 / 4096: count, first few, sha256 of "c1,c2,...".
CUTS_SMALL = (3602, [506, 1638, 2726, 3948, 5001, 6202, 7578, 8747],
              "d02252267877bd451f23b5bfb7a412df748fa49186e2753c37c82577cabf5466")

# The gear table (splitmix64 of seed "SNAPSTOR"): first, last, sha256 of its LE bytes.
GEAR = (0x834624EB92EF2A13, 0xAFB2FEE5CC24204B,
        "9746128bf0ad5285128d2dd3b2e04da9f3693e4bcc185bcb77f3954eec2f0d05")


@pytest.mark.parametrize("page,ps,hexfp", PAGE_FPS)
def test_page_fingerprints_pinned(page, ps, hexfp):
    assert bytes(nat.page_fingerprints(page, ps)).hex() == hexfp
    assert ref.fingerprint(page).hex() == hexfp


@pytest.mark.parametrize("ps", sorted(FPS_SHA256))
def test_fingerprints_of_golden_input_pinned(ps):
    assert hashlib.sha256(nat.page_fingerprints(GOLDEN, ps)).hexdigest() == FPS_SHA256[ps]


def test_gear_table_pinned():
    first, last, digest = GEAR
    assert ref.GEAR[0] == first and ref.GEAR[255] == last
    assert hashlib.sha256(b"".join(g.to_bytes(8, "little") for g in ref.GEAR)).hexdigest() == digest


def test_cdc_default_cut_points_pinned():
    assert nat.chunk_boundaries(GOLDEN) == CUTS_DEFAULT


def test_cdc_default_cut_points_pinned_streaming():
    c = nat.Chunker()
    got = []
    for i in range(0, len(GOLDEN), 100_003):
        got += c.feed(GOLDEN[i:i + 100_003])
    assert got + c.finish() == CUTS_DEFAULT


def test_cdc_reference_agrees_with_pinned_cut_points():
    assert ref.chunk_boundaries(GOLDEN) == CUTS_DEFAULT


def test_cdc_small_cut_points_pinned():
    count, head, digest = CUTS_SMALL
    cuts = nat.chunk_boundaries(GOLDEN, 256, 1024, 4096)
    assert len(cuts) == count and cuts[:len(head)] == head
    assert hashlib.sha256(",".join(map(str, cuts)).encode()).hexdigest() == digest
