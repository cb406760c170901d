"""Upload intents of S3 stores (remote/intents.py), what needs no server: the objects' codec
(round trips, damage), keys, the fingerprints of a plan against a reference, and the rule
that gives each chunk to the earliest intent holding it (hypothesis, against a reference)."""
from __future__ import annotations

import struct

import pytest
import xxhash
from hypothesis import given, strategies as st

from snapstore.engine import format as fmt
from snapstore.engine.writer import BufferPlan
from snapstore.errors import CorruptionError, FormatError
from snapstore.remote import intents, layout


def test_an_intent_round_trips_empty_one_and_many():
    for fps in ([], [0], [1, 2 ** 64 - 1, 12345]):
        data = intents.encode_intent(7 << 20, fps)
        assert intents.decode_intent(data, "k") == (7 << 20, frozenset(fps))


def test_an_outcome_round_trips_empty_and_full():
    assert intents.decode_outcome(intents.encode_outcome(b""), "k") == b""
    table = fmt.NEW_CHUNK.pack(b"\1" * 32, 5, 64, 100, 200, 1) * 3
    assert intents.decode_outcome(intents.encode_outcome(table), "k") == table


@pytest.mark.parametrize("encode,decode", [
    (lambda: intents.encode_intent(1, [5, 6]), intents.decode_intent),
    (lambda: intents.encode_outcome(fmt.NEW_CHUNK.pack(b"\2" * 32, 1, 2, 3, 4, 0)),
     intents.decode_outcome)])
def test_damage_is_a_corruption_error_naming_the_key(encode, decode):
    data = encode()
    for at in range(0, len(data), 7):           # every flipped bit the checksum covers
        bad = bytearray(data)
        bad[at] ^= 0x10
        with pytest.raises(CorruptionError, match="intents/x"):
            decode(bytes(bad), "intents/x")
    for cut in (0, 1, len(data) - 1):
        with pytest.raises(CorruptionError, match="intents/x"):
            decode(data[:cut], "intents/x")
    with pytest.raises(CorruptionError):
        decode(b"", "intents/x")


def test_a_body_its_header_does_not_describe_is_damage():
    from snapstore.remote import envelope
    body = layout.INTENT_HEADER.pack(1, 3) + struct.pack("<2Q", 1, 2)     # says 3, holds 2
    data = envelope.seal(layout.INTENT_MAGIC, layout.INTENT_VERSION, len(body), [body])
    with pytest.raises(CorruptionError, match="fingerprints"):
        intents.decode_intent(data, "k")
    odd = envelope.seal(layout.INTENT_OUTCOME_MAGIC, layout.INTENT_VERSION, 5, [b"12345"])
    with pytest.raises(CorruptionError, match="table"):
        intents.decode_outcome(odd, "k")
    wrong = intents.encode_outcome(b"")         # an outcome is not an intent
    with pytest.raises(CorruptionError, match="magic"):
        intents.decode_intent(wrong, "k")


def test_a_newer_version_is_a_format_error():
    from snapstore.remote import envelope
    body = layout.INTENT_HEADER.pack(1, 0)
    data = envelope.seal(layout.INTENT_MAGIC, layout.INTENT_VERSION + 1, len(body), [body])
    with pytest.raises(FormatError, match="upgrade"):
        intents.decode_intent(data, "k")


def test_keys_order_by_time_and_name_their_writer():
    a = layout.intent_key(1_700_000_000_000, "ab" * 16, 1)
    b = layout.intent_key(1_700_000_000_001, "00" * 16, 1)
    assert a < b and layout.intent_millis(a) == 1_700_000_000_000
    assert intents.writer_of(a) == "ab" * 16
    assert layout.intent_millis(a + layout.INTENT_OUTCOME_SUFFIX) == 1_700_000_000_000
    for other in ("intents/", "intents/12-x-1", "segments/0000000000000001.seg",
                  "intents/" + "9" * 15 + "x"):
        assert layout.intent_millis(other) is None
    assert intents.writer_of("intents/" + "1" * 15 + "-nodash") == ""


def _plan(data: bytes, chunks: list, staged: bool) -> BufferPlan:
    view = memoryview(data)
    staged_bytes = None
    if staged:
        staged_bytes = memoryview(b"".join(data[o:o + n] for ps in chunks for o, n in ps))
    return BufferPlan("b", view, "full", 0, "pages", 4096, chunks, None, "", staged_bytes)


@given(st.binary(min_size=0, max_size=3000), st.data(), st.booleans())
def test_plan_fingerprints_are_the_xxh3_of_each_chunks_bytes(data, draw, staged):
    cuts = sorted(set(draw.draw(st.lists(st.integers(0, len(data)), max_size=8))))
    bounds = [0] + cuts + [len(data)]
    ranges = [(a, b - a) for a, b in zip(bounds, bounds[1:]) if b > a]
    chunks, i = [], 0
    while i < len(ranges):              # one or two ranges a chunk
        k = draw.draw(st.integers(1, 2))
        chunks.append(ranges[i:i + k])
        i += k
    got = intents.plan_fingerprints(_plan(data, chunks, staged))
    want = [xxhash.xxh3_64_intdigest(b"".join(data[o:o + n] for o, n in ps)) for ps in chunks]
    assert got == want


def _reference_holders(mine, earlier):
    owner = {}
    for fp in mine:
        for key, (_, fps) in earlier:
            if fp in fps:
                owner[fp] = key
                break
    counts = {}
    for key in owner.values():
        counts[key] = counts.get(key, 0) + 1
    return [(key, theirs, counts[key]) for key, theirs in earlier if key in counts]


@given(st.sets(st.integers(0, 40)),
       st.lists(st.tuples(st.integers(0, 10 ** 9), st.sets(st.integers(0, 40))), max_size=6))
def test_each_chunk_goes_to_the_earliest_intent_holding_it(mine, others):
    earlier = [(f"intents/{i:03d}", (n, frozenset(fps))) for i, (n, fps) in enumerate(others)]
    got = intents.earliest_holders(mine, earlier)
    assert got == _reference_holders(mine, earlier)
    assert sum(n for _, _, n in got) == len(set(mine) & set().union(*[f for _, (_, f) in
                                                                        earlier]))


def test_the_wait_is_the_base_plus_their_upload_but_not_for_a_small_share(monkeypatch):
    monkeypatch.setattr(layout, "INTENT_WAIT_SECONDS", 15.0)
    monkeypatch.setattr(layout, "INTENT_WAIT_RATE", 8 << 20)
    gib = 1 << 30
    assert intents.wait_seconds(256 << 20, 230 << 20) == 15 + 32      # most shared: all of it
    assert intents.wait_seconds(10 * gib, 100 << 20) == 15 + 50      # 1% of 10 GiB: 4x the share
    assert intents.wait_seconds(0, 0) == 15
