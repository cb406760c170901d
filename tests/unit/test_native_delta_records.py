"""Delta-plane chunk records (CODEC_DELTA_PLANES, format 5) in the C core: what
snap_write_chunks codes given a base, what snap_read_chunks accepts, the boring cases (no
change, everything changed, empty, one byte, the same call twice), bad arguments and damaged
records; the engine's Python decoder of one record (chunks.decode_delta) and its refusal of a
delta record read without its base. The comparison against the reference on generated
versions is tests/property/test_delta_records_property.py; the engine's use of the codec,
tests/unit/test_delta_chunks.py."""
import blake3
import numpy as np
import pytest

from snapstore import _native as nat
from snapstore import errors
from snapstore.engine import format as fmt
from snapstore.engine import wal

from chunkrecords import python_read

FULL = {2: 0b11, 4: 0b1111, 8: 0xFF}


def weights(n, seed=0, rel=0.01, dtype=np.float32):
    """(new, old) versions of n float weights: every value changed by a relative ~rel."""
    rng = np.random.default_rng(seed)
    old = rng.standard_normal(n) * 0.02
    new = old * (1 + rel * rng.standard_normal(n))
    return new.astype(dtype).tobytes(), old.astype(dtype).tobytes()


def bid(data):
    return blake3.blake3(data).digest()


def write_delta(cur, base, k=4, depth=1, try_planes=None, try_delta=None):
    """(records, [base result, delta result]) of base (plain) then cur against it."""
    full = FULL[k]
    return nat.write_chunks([(base, bid(base)), (cur, bid(cur), base, bid(base), depth)], k,
                            full if try_planes is None else try_planes,
                            try_delta=full if try_delta is None else try_delta)


def read_back(records, results, cur, base, base_named=True):
    """(reads done, reason, bytes) of reading base then cur over it into one place."""
    (b_off, b_len, _, _), (off, stored_len, _, _) = results
    reads = [(b_off, 0, b_len, len(base), bid(base)),
             (off, 0, stored_len, len(cur), bid(cur)) + ((bid(base),) if base_named else ())]
    out = bytearray(len(cur))
    done, reason = nat.read_chunks(records, out, reads)
    return done, reason, bytes(out)


@pytest.mark.parametrize("dtype,k", [(np.float16, 2), (np.float32, 4), (np.float64, 8)])
def test_dense_small_changes_code_as_deltas_smaller_than_planes(dtype, k):
    cur, base = weights(16384, dtype=dtype)
    records, results = write_delta(cur, base, k)
    _, plain = nat.write_chunks([(cur, bid(cur))], k, FULL[k])
    assert results[1][2] == fmt.CODEC_DELTA_PLANES
    assert results[1][1] < plain[0][1] * 0.95          # a delta is the smaller coding
    assert read_back(records, results, cur, base) == (2, 0, cur)


def test_nothing_changed_codes_a_tiny_delta():
    cur, _ = weights(16384)
    records, results = write_delta(cur, cur)
    assert results[1][2] == fmt.CODEC_DELTA_PLANES
    assert results[1][1] < 400                         # 64 KiB of zero deltas
    assert read_back(records, results, cur, cur) == (2, 0, cur)


def test_unrelated_bytes_fall_back_to_the_plain_coding():
    rng = np.random.default_rng(3)
    cur, base = (rng.integers(0, 256, 65536, np.uint8).tobytes() for _ in range(2))
    records, results = write_delta(cur, base)
    assert results[1][2] == fmt.CODEC_RAW
    assert read_back(records, results, cur, base) == (2, 0, cur)
    floats_now, _ = weights(16384, seed=5)             # a new version unlike its base
    records, results = write_delta(floats_now, base)
    assert results[1][2] == fmt.CODEC_PLANES
    assert read_back(records, results, floats_now, base) == (2, 0, floats_now)


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5, 7])
def test_empty_one_byte_and_tails_are_coded_plainly(size):
    cur, base = bytes(range(1, size + 1)), bytes(size)
    records, results = write_delta(cur, base)
    assert results[1][2] == fmt.CODEC_RAW              # never shorter as a delta
    assert read_back(records, results, cur, base) == (2, 0, cur)


def test_no_delta_mask_or_planes_mask_means_no_delta():
    cur, base = weights(4096)
    _, results = write_delta(cur, base, try_delta=0)
    assert results[1][2] == fmt.CODEC_PLANES
    _, results = write_delta(cur, base, try_planes=0, try_delta=0)
    assert results[1][2] == fmt.CODEC_RAW
    _, results = write_delta(cur, base, try_planes=0)  # a delta alone may still be coded
    assert results[1][2] == fmt.CODEC_DELTA_PLANES


def test_the_same_call_twice_gives_the_same_records():
    cur, base = weights(8192, seed=9)
    first, _ = write_delta(cur, base, depth=7)
    second, _ = write_delta(cur, base, depth=7)
    assert bytes(first) == bytes(second)


def test_the_record_names_its_base_and_depth():
    cur, base = weights(4096)
    records, results = write_delta(cur, base, depth=200)
    off = results[1][0]
    stored = bytes(records)[off + fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size:]
    assert fmt.DELTA_HEADER.unpack_from(stored) == (bid(base), 200)


def test_a_delta_is_refused_without_its_base_and_leaves_the_destination_alone():
    cur, base = weights(4096)
    records, results = write_delta(cur, base)
    off, stored_len, _, _ = results[1]
    for named in (None, bytes(32), bid(cur), b"\x01" * 32):
        read = (off, 0, stored_len, len(cur), bid(cur)) + ((named,) if named else ())
        out = bytearray(base)
        assert nat.read_chunks(records, out, [read]) == (0, nat.lib.SNAP_READ_BASE)
        assert out == base
    assert nat.READ_REASONS[nat.lib.SNAP_READ_BASE].startswith("a delta record")


def test_the_engines_python_reader_needs_the_base():
    """chunks.read_chunk (no base) calls a delta record damaged instead of decoding it
    without its base; chunks.decode_delta given the base gives the chunk, and given other
    bytes as the base refuses them or (a base of the right id is the caller's promise)
    never writes past the chunk."""
    from snapstore.engine import chunks
    cur, base = weights(4096)
    records, results = write_delta(cur, base)
    off, stored_len, codec, _ = results[1]
    assert codec == fmt.CODEC_DELTA_PLANES
    record = bytes(records)[off:off + fmt.RECORD_HEADER.size + stored_len]
    assert python_read(record, stored_len, len(cur), bid(cur)) is None
    assert wal.parse_record_header(record)[1] == fmt.CODEC_DELTA_PLANES
    stored = chunks.stored_chunk(wal.read_record(_OneRecord(record), 1, 0,
                                                 length=stored_len))
    assert chunks.delta_base(stored) == (bid(base), 1)
    assert bytes(chunks.decode_delta(stored, base)) == cur
    out = bytearray(base)
    assert chunks.decode_delta(stored, out, out) is out and bytes(out) == cur
    with pytest.raises(errors.CorruptionError):
        chunks.decode_delta(stored, base[:-4])


class _OneRecord:
    """A SegmentReader over one record's bytes (segment 1, offset 0)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, number: int, offset: int, length: int) -> bytes:
        return self.data[offset:offset + length]


def test_flipped_bits_anywhere_fail_the_read_and_write_nothing():
    cur, base = weights(2048, seed=2)
    records, results = write_delta(cur, base)
    off, stored_len, _, _ = results[1]
    record = bytearray(bytes(records)[off:off + fmt.RECORD_HEADER.size + stored_len])
    read = (0, 0, stored_len, len(cur), bid(cur), bid(base))
    rng = np.random.default_rng(0)
    for at in sorted(set(rng.integers(0, len(record), 200).tolist()) | {0, 5, 30, 60, 80}):
        damaged = bytearray(record)
        damaged[at] ^= 1 << int(rng.integers(0, 8))
        out = bytearray(base)
        done, reason = nat.read_chunks(bytes(damaged), out, [read])
        assert (done, out) == (0, base) and reason in nat.READ_REASONS


def resealed(record: bytes, at: int, value: int) -> bytes:
    """record with byte `at` of its stored bytes set to value, its checksum made again: damage
    a checksum cannot see."""
    head = fmt.RECORD_HEADER.size
    rec = bytearray(record)
    rec[head + fmt.CHUNK_PREFIX.size + at] = value
    parts = [bytes(rec[head:])]
    return wal.encode_record_header(fmt.REC_CHUNK, rec[5], parts) + parts[0]


@pytest.mark.parametrize("at,value,reason", [
    (32, 0, "SNAP_READ_PLANES"),                        # depth 0
    (33, 3, "SNAP_READ_PLANES"),                        # item size 3
    (34, fmt.PLANES_ROTATE, "SNAP_READ_PLANES"),        # flags other than 0
    (35, 7, "SNAP_READ_PLANES"),                        # a plane stored some unknown way
    (0, 0xEE, "SNAP_READ_BASE"),                        # another base id
])
def test_damage_behind_a_valid_checksum_is_refused(at, value, reason):
    cur, base = weights(2048, seed=4)
    records, results = write_delta(cur, base)
    off, stored_len, _, _ = results[1]
    record = resealed(bytes(records)[off:off + fmt.RECORD_HEADER.size + stored_len], at, value)
    out = bytearray(base)
    done, why = nat.read_chunks(record, out, [(0, 0, stored_len, len(cur), bid(cur), bid(base))])
    assert (done, why, out) == (0, getattr(nat.lib, reason), base)


def test_truncated_delta_sections_are_refused():
    cur, base = weights(2048, seed=6)
    records, results = write_delta(cur, base)
    off, stored_len, _, _ = results[1]
    record = bytes(records)[off:off + fmt.RECORD_HEADER.size + stored_len]
    head = fmt.RECORD_HEADER.size
    for keep in (0, 10, 32, 33, 35, 60):            # stored bytes cut short, resealed
        payload = record[head:head + fmt.CHUNK_PREFIX.size + keep]
        rec = wal.encode_record_header(fmt.REC_CHUNK, fmt.CODEC_DELTA_PLANES, [payload]) + payload
        out = bytearray(base)
        done, why = nat.read_chunks(rec, out, [(0, 0, len(payload), len(cur), bid(cur),
                                                bid(base))])
        assert (done, out) == (0, base) and why in (nat.lib.SNAP_READ_PLANES,
                                                    nat.lib.SNAP_READ_BASE)


def test_bad_arguments_are_clear_errors():
    cur, base = weights(1024)
    good = (cur, bid(cur), base, bid(base), 1)
    bad = [
        ((cur, bid(cur), base[:-4], bid(base), 1), errors.InvalidArgumentError, "as long as"),
        ((cur, bid(cur), base, b"short", 1), errors.InvalidArgumentError, "base id"),
        ((cur, bid(cur), base, bid(base), 0), errors.InvalidArgumentError, "depth"),
        ((cur, bid(cur), base, bid(base), 256), errors.InvalidArgumentError, "depth"),
        ((cur, bid(cur), base, bid(base), "1"), errors.InvalidArgumentTypeError, "depth"),
        ((cur, bid(cur), 12, bid(base), 1), errors.InvalidArgumentTypeError, "base"),
        ((cur, bid(cur), base), errors.InvalidArgumentTypeError, r"chunks\[0\]: expected a"),
    ]
    for chunk, exc, words in bad:
        with pytest.raises(exc, match=words):
            nat.write_chunks([chunk], 4, 0b1111, try_delta=0b1111)
    with pytest.raises(errors.InvalidArgumentError):
        nat.write_chunks([good], 4, 0b1111, try_delta=0b10000)     # bits past the item size
    with pytest.raises(errors.InvalidArgumentTypeError):
        nat.raw_record_heads([good])                    # raw heads take no base
    with pytest.raises(errors.InvalidArgumentError, match="base id"):
        nat.read_chunks(b"", bytearray(1), [(0, 0, 0, 0, bid(cur), b"x")])


def test_a_base_inside_the_output_is_refused():
    cur, _ = weights(1024)
    out = bytearray(len(cur) * 3 + 4 * nat.RECORD_WRITE_SLACK)
    base = memoryview(out)[-len(cur):]
    with pytest.raises(errors.InvalidArgumentError):
        nat.write_chunks([(cur, bid(cur), base, bytes(32), 1)], 4, 0b1111, out=out,
                         try_delta=0b1111)
