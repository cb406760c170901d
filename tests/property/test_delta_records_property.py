"""Property tests: delta-plane chunk records (CODEC_DELTA_PLANES, format 5, planned) as the C core
writes them (snap_write_chunks given a base) and reads them (snap_read_chunks over the base's
bytes), against the pure-Python reference of the layout (tests/reference.py,
delta_planes_chunk) on generated versions: float weights of 2, 4 and 8 bytes changed by a
small relative amount (some items unchanged, NaN/inf/denormal/-0.0 items), noise against
noise, a version equal to its base, odd lengths, the empty and one-byte chunk, any masks of
planes to try.

For every chunk given a base: a delta record is chosen only when it saves 1/32 of the chunk,
holds the base's id and the depth given, and its planes are the reference's zigzag deltas,
each raw and equal or one zstd frame that decodes to them; otherwise the record is the
chunk's plain coding (planes or raw) exactly as without a base. Read back over its base (a
plain record read first into the same place), the C reader gives the version's bytes, as the
reference decoder does; read without its base it fails and writes nothing.
SNAPSTORE_HYPOTHESIS_PROFILE=slow runs 10x more.
"""
import blake3
import numpy as np
import xxhash
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from snapstore import _native as nat
from snapstore.engine import format as fmt

import reference as ref
from chunkrecords import SPECIALS


def examples(n: int) -> int:
    return max(1, n * settings.default.max_examples // 100)


@st.composite
def versions(draw):
    """(cur, base, itemsize): a chunk and the previous version of its bytes."""
    k = draw(st.sampled_from([2, 4, 8]))
    kind = draw(st.sampled_from(["adam", "adam", "equal", "noise", "tiny"]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if kind == "tiny":
        n = draw(st.integers(0, 3))
        return draw(st.binary(min_size=n, max_size=n)), draw(
            st.binary(min_size=n, max_size=n)), k
    if kind == "noise":
        n = draw(st.integers(0, 12000))
        return (rng.integers(0, 256, n, dtype=np.uint8).tobytes(),
                rng.integers(0, 256, n, dtype=np.uint8).tobytes(), k)
    dtype = {2: np.float16, 4: np.float32, 8: np.float64}[k]
    n = draw(st.integers(256, 4000))
    master = rng.standard_normal(n) * draw(st.sampled_from([0.02, 1.0]))
    base = bytearray(master.astype(dtype).tobytes())
    rel = draw(st.sampled_from([1e-4, 1e-3, 1e-2]))
    moved = master * (1 + rel * rng.standard_normal(n))
    keep = rng.random(n) < draw(st.sampled_from([0.0, 0.3]))
    cur = bytearray(np.where(keep, master, moved).astype(dtype).tobytes())
    for _ in range(draw(st.integers(0, 6))):            # specials in either version
        at = int(rng.integers(0, n)) * k
        which = draw(st.sampled_from([base, cur]))
        which[at:at + k] = draw(st.sampled_from(SPECIALS[k]))
    tail = draw(st.binary(max_size=k - 1))
    base, cur = bytes(base) + tail, bytes(cur) + draw(
        st.binary(min_size=len(tail), max_size=len(tail)))
    return (bytes(base) if kind == "equal" else cur), base, k


def unpack(record: bytes) -> tuple:
    """(codec, stored bytes) of a record, its header and prefix checked."""
    head, payload = record[:fmt.RECORD_HEADER.size], record[fmt.RECORD_HEADER.size:]
    magic, rtype, codec, flags, length, reserved, checksum = fmt.RECORD_HEADER.unpack(head)
    assert (magic, rtype, flags, length, reserved) == (fmt.RECORD_MAGIC, fmt.REC_CHUNK, 0,
                                                       len(payload), 0)
    assert checksum == xxhash.xxh3_64_intdigest(head[:fmt.RECORD_CHECKSUMMED_PREFIX] + payload)
    return codec, payload[fmt.CHUNK_PREFIX.size:]


def check_delta_stored(stored: bytes, cur: bytes, base: bytes, base_id: bytes, depth: int,
                       k: int, mask: int, packed: int) -> None:
    assert len(stored) < len(cur) - len(cur) // 32
    assert fmt.DELTA_HEADER.unpack_from(stored) == (base_id, depth)
    section = stored[fmt.DELTA_HEADER.size:]
    assert fmt.PLANES_HEADER.unpack_from(section) == (k, 0)
    n = len(cur) // k
    laid = ref.delta_split_planes(cur, base, k, ref.DELTA_SUB)
    at = fmt.PLANES_HEADER.size + k * fmt.PLANE_ENTRY.size
    for j in range(k):
        how, length = fmt.PLANE_ENTRY.unpack_from(section, fmt.PLANES_HEADER.size
                                                  + j * fmt.PLANE_ENTRY.size)
        piece = section[at:at + length]
        at += length
        if how == fmt.PLANE_RAW:
            assert not packed >> j & 1 and piece == laid[j * n:(j + 1) * n]
        else:
            assert how == fmt.PLANE_ZSTD and packed >> j & 1 and mask >> j & 1
            assert length < n - n // 32
            assert zstandard.ZstdDecompressor().decompress(piece) == laid[j * n:(j + 1) * n]
    assert section[at:] == laid[k * n:]
    assert ref.delta_planes_chunk(stored, len(cur), base) == (cur, base_id, depth)


@settings(max_examples=examples(120), deadline=None)
@given(versions(), st.integers(0, 255), st.integers(0, 255), st.integers(1, 255))
def test_delta_records_match_the_reference_and_read_back(version, plane_bits, delta_bits,
                                                         depth):
    cur, base, k = version
    mask, delta_mask = plane_bits & ((1 << k) - 1), delta_bits & ((1 << k) - 1)
    cid, base_id = blake3.blake3(cur).digest(), blake3.blake3(base).digest()
    records, results = nat.write_chunks([(base, base_id), (cur, cid, base, base_id, depth)], k,
                                        mask, try_delta=delta_mask)
    records = bytes(records)
    (_, base_len, _, _), (off, stored_len, codec, packed) = results
    base_record = records[:off]
    record = records[off:off + fmt.RECORD_HEADER.size + stored_len]
    assert off == fmt.RECORD_HEADER.size + base_len
    got_codec, stored = unpack(record)
    assert got_codec == codec
    plain, [plain_result] = nat.write_chunks([(cur, cid)], k, mask)
    if codec == fmt.CODEC_DELTA_PLANES:
        check_delta_stored(stored, cur, base, base_id, depth, k, delta_mask, packed)
    else:           # no delta paid: exactly the coding without a base
        assert (codec, bytes(record)) == (plain_result[2], bytes(plain))
    out = bytearray(len(cur))
    reads = [(0, 0, base_len, len(base), base_id),
             (off, 0, stored_len, len(cur), cid, base_id)]
    assert nat.read_chunks(records, out, reads) == (2, 0)
    assert out == cur
    if codec == fmt.CODEC_DELTA_PLANES:       # without its base named: refused, untouched
        out = bytearray(b"\x5a" * len(cur))
        assert nat.read_chunks(records, out, [reads[1][:5]]) == (0, nat.lib.SNAP_READ_BASE)
        assert out == b"\x5a" * len(cur)
    assert base_record            # (the base's own record decoded above, as the plain one)


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(versions(), min_size=1, max_size=4), st.integers(0, 255))
def test_chains_rebuild_every_version_in_one_read(chain_versions, bits):
    """A chain v0 <- v1 <- ... (each coded against the one before, depths 1, 2, ...) read in
    one call, every record over the same place, gives the last version; each prefix of the
    chain gives its own last version."""
    k = chain_versions[0][2]
    size = len(chain_versions[0][1])
    rng = np.random.default_rng(size)
    chain = [chain_versions[0][1]]
    for cur, _, _ in chain_versions:        # same length as v0: re-drawn where it differs
        chain.append(cur if len(cur) == size else rng.integers(0, 256, size, np.uint8).tobytes())
    ids = [blake3.blake3(v).digest() for v in chain]
    chunks = [(chain[0], ids[0])] + [(chain[i], ids[i], chain[i - 1], ids[i - 1], i)
                                     for i in range(1, len(chain))]
    mask = bits & ((1 << k) - 1)
    records, results = nat.write_chunks(chunks, k, mask, try_delta=(1 << k) - 1)
    for last in range(len(chain)):
        reads = []
        for i in range(last + 1):
            off, stored_len, codec, _ = results[i]
            read = (off, 0, stored_len, size, ids[i])
            reads.append(read + (ids[i - 1],) if i else read)
        out = bytearray(size)
        assert nat.read_chunks(records, out, reads) == (last + 1, 0)
        assert out == chain[last]
