"""snap_read_chunks (csrc/chunkread.c through snapstore._native.read_chunks): the C core's copy
of the record layout agrees with snapstore/engine/format.py, and every check it makes is the
one the Python read path makes (the reasons it reports, nothing written for a failed record).
The comparison against the Python decoder on generated records is in
tests/property/test_read_chunks_property.py."""
import os

import numpy as np
import pytest

from snapstore import _native as nat
from snapstore import errors
from snapstore._ffi import ffi, lib
from snapstore.engine import format as fmt
from snapstore.engine import planes, wal
from snapstore.engine.writer import WriteOptions, encode_chunk

import blake3

import reference as ref


def test_mirrored_layout_matches_format_py():
    assert lib.SNAP_REC_HEADER == fmt.RECORD_HEADER.size
    assert lib.SNAP_REC_CHECKSUMMED == fmt.RECORD_CHECKSUMMED_PREFIX
    assert lib.SNAP_REC_CHUNK == fmt.REC_CHUNK
    assert lib.SNAP_REC_CHUNK_ID == fmt.CHUNK_ID_BYTES
    assert lib.SNAP_REC_CHUNK_PREFIX == fmt.CHUNK_PREFIX.size
    assert (lib.SNAP_REC_CODEC_RAW, lib.SNAP_REC_CODEC_ZSTD, lib.SNAP_REC_CODEC_PLANES,
            lib.SNAP_REC_CODEC_DELTA_PLANES) == \
        (fmt.CODEC_RAW, fmt.CODEC_ZSTD, fmt.CODEC_PLANES, fmt.CODEC_DELTA_PLANES) == fmt.CODECS
    assert lib.SNAP_REC_PLANES_HEADER == fmt.PLANES_HEADER.size
    assert lib.SNAP_REC_PLANE_ENTRY == fmt.PLANE_ENTRY.size
    assert lib.SNAP_REC_PLANES_ROTATE == fmt.PLANES_ROTATE
    assert lib.SNAP_REC_PLANES_ROTATION == lib.SNAP_PLANES_ROTATION == nat.PLANES_ROTATION_MAX
    assert (lib.SNAP_REC_PLANE_RAW, lib.SNAP_REC_PLANE_ZSTD) == (fmt.PLANE_RAW, fmt.PLANE_ZSTD)
    assert [v for v, c in fmt.SEGMENT_CODECS.items() if fmt.CODEC_DELTA_PLANES in c] == [5, 6]
    assert lib.SNAP_REC_PLANES_ROTATION == fmt.PLANES_ROTATION
    # rotations other than 0 and 1 only from segment version 6 (format 6) on
    assert {v: max(r) for v, r in fmt.SEGMENT_PLANE_ROTATIONS.items()} == {4: 1, 5: 1, 6: 7}
    assert all(set(fmt.WRITTEN_PLANE_ROTATIONS[v]) <= set(fmt.SEGMENT_PLANE_ROTATIONS[v])
               for v in fmt.WRITTEN_PLANE_ROTATIONS)
    assert lib.SNAP_REC_DELTA_HEADER == fmt.DELTA_HEADER.size
    assert lib.SNAP_DELTA_SUB == nat.DELTA_SUB
    assert ffi.sizeof("snap_chunk_read") == nat._CHUNK_READ.size
    for field in ("src_off", "dst_off", "stored_len", "raw_len", "chunk_id", "base_id",
                  "status"):
        assert ffi.offsetof("snap_chunk_read", field) == \
            {"src_off": 0, "dst_off": 8, "stored_len": 16, "raw_len": 20, "chunk_id": 24,
             "base_id": 56, "status": 88}[field]


def test_a_record_the_writer_made_is_accepted():
    # (SNAP_REC_MAGIC, a string, is not visible to cffi: this is its check)
    data = b"x" * 100
    rec, read = record(data, "none")
    out = bytearray(100)
    assert nat.read_chunks(rec, out, [read]) == (1, 0) and out == data


def record(data, compression="zstd", itemsize=1, src_off=0, dst_off=0):
    """(record bytes, read tuple) of a chunk of data, encoded as the writer encodes it."""
    cid = blake3.blake3(data).digest()
    codec, parts = encode_chunk(cid, data, WriteOptions(compression=compression), itemsize)
    head = wal.encode_record_header(fmt.REC_CHUNK, codec, parts)
    payload = b"".join(bytes(p) for p in parts)
    return head + payload, (src_off, dst_off, len(payload), len(data), cid)


def floats(n, seed=0):
    return (np.random.default_rng(seed).standard_normal(n, dtype=np.float32) * 0.02).tobytes()


CASES = {
    "raw": (os.urandom(4096), "zstd", 1),
    "zstd": (b"abc" * 3000, "zstd", 1),
    "planes": (floats(16384), "zstd", 4),
    "planes-tail": (floats(1000) + b"\x01\x02\x03", "zstd", 4),
    "empty": (b"", "none", 1),
    "one byte": (b"\x07", "none", 1),
}


def codec_of(rec):
    return rec[5]


@pytest.mark.parametrize("case", sorted(CASES))
def test_decodes_each_codec(case):
    data, comp, k = CASES[case]
    rec, read = record(data, comp, k)
    if case in ("raw", "zstd", "planes"):
        assert codec_of(rec) == {"raw": 0, "zstd": 1, "planes": 2}[case]
    out = bytearray(len(data) + 8)
    assert nat.read_chunks(rec, out, [read]) == (1, 0)
    assert out[:len(data)] == data and out[len(data):] == bytes(8)


def test_many_records_back_to_back_in_any_order():
    datas = [CASES[c][0] for c in sorted(CASES)]
    recs = [record(d, CASES[c][1], CASES[c][2]) for c, d in zip(sorted(CASES), datas)]
    src, reads, at, dst_at = b"", [], 0, 0
    for rec, (_, _, stored, raw, cid) in recs:
        reads.append((at, dst_at, stored, raw, cid))
        src += rec
        at += len(rec)
        dst_at += raw
    out = bytearray(dst_at)
    assert nat.read_chunks(src, out, reads[::-1]) == (len(reads), 0)
    assert bytes(out) == b"".join(datas)


def test_nothing_to_read():
    assert nat.read_chunks(b"", bytearray(), []) == (0, 0)


def test_the_same_record_twice_into_two_places():
    data = floats(4096)
    rec, (_, _, stored, raw, cid) = record(data, "zstd", 4)
    out = bytearray(2 * raw)
    assert nat.read_chunks(rec, out, [(0, 0, stored, raw, cid), (0, raw, stored, raw, cid)]) \
        == (2, 0)
    assert bytes(out) == data * 2


def damaged(rec, at, value=None):
    b = bytearray(rec)
    b[at] = (b[at] ^ 0x10) if value is None else value
    return bytes(b)


def rechecksummed(rec):
    """rec with its checksum made right again (damage the checksum cannot see)."""
    h = fmt.RECORD_HEADER.unpack_from(rec)
    payload = rec[fmt.RECORD_HEADER.size:]
    head16 = rec[:fmt.RECORD_CHECKSUMMED_PREFIX]
    return (fmt.RECORD_HEADER.pack(*h[:-1], wal.record_checksum(head16, [payload])) + payload)


@pytest.mark.parametrize("where,reason", [
    (0, lib.SNAP_READ_HEADER),              # magic
    (4, lib.SNAP_READ_HEADER),              # record type
    (6, lib.SNAP_READ_HEADER),              # flags
    (12, lib.SNAP_READ_HEADER),             # reserved
    (8, lib.SNAP_READ_LENGTH),              # payload length
    (17, lib.SNAP_READ_CHECKSUM),           # the checksum itself
    (24, lib.SNAP_READ_CHECKSUM),           # the chunk id: caught by the checksum first
    (-1, lib.SNAP_READ_CHECKSUM),           # the last stored byte
])
def test_damage_stops_the_read_before_its_bytes_are_written(where, reason):
    good, read_good = record(floats(2048, 1), "zstd", 4)
    rec, read = record(floats(2048, 2), "zstd", 4, src_off=len(good), dst_off=8192)
    src = good + damaged(rec, where if where >= 0 else len(rec) + where)
    out = bytearray(b"\xee" * 16384)
    done, why = nat.read_chunks(src, out, [read_good, read])
    assert (done, why) == (1, reason)
    assert out[:8192] == floats(2048, 1) and out[8192:] == b"\xee" * 8192


def test_damage_behind_a_right_checksum():
    data = floats(4096, 3)
    rec, read = record(data, "zstd", 4)
    h = fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size
    cases = {
        "item size": (damaged(rec, h, 3), lib.SNAP_READ_PLANES),
        "flags": (damaged(rec, h + 1, 8), lib.SNAP_READ_PLANES),       # above the rotation
        "plane kind": (damaged(rec, h + 2, 7), lib.SNAP_READ_PLANES),
        "plane length": (damaged(rec, h + 3), lib.SNAP_READ_PLANES),
        "chunk id": (damaged(rec, fmt.RECORD_HEADER.size), lib.SNAP_READ_PREFIX),
        "raw length": (damaged(rec, fmt.RECORD_HEADER.size + 32), lib.SNAP_READ_PREFIX),
    }
    for name, (bad, reason) in cases.items():
        out = bytearray(b"\xee" * len(data))
        assert nat.read_chunks(rechecksummed(bad), out, [read]) == (0, reason), name
        assert out == b"\xee" * len(data), name


def test_a_damaged_zstd_frame():
    data = b"hello world " * 500
    rec, read = record(data, "zstd")
    assert codec_of(rec) == fmt.CODEC_ZSTD
    h = fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size
    out = bytearray(len(data))
    assert nat.read_chunks(rechecksummed(damaged(rec, h)), out, [read]) == \
        (0, lib.SNAP_READ_FRAME)                # not a zstd frame's magic
    trailing = rec[fmt.RECORD_HEADER.size:] + b"\0"     # a byte after the one frame
    bad = fmt.RECORD_HEADER.pack(fmt.RECORD_MAGIC, 1, 1, 0, len(trailing), 0, 0) + trailing
    assert nat.read_chunks(rechecksummed(bad), out, [read[:2] + (len(trailing),) + read[3:]]) \
        == (0, lib.SNAP_READ_FRAME)
    # a frame declaring another size, with a record that says the same raw length
    short, _ = record(data[:-1], "zstd")
    payload = rec[fmt.RECORD_HEADER.size:fmt.RECORD_HEADER.size + 36] + short[h:]
    bad = fmt.RECORD_HEADER.pack(fmt.RECORD_MAGIC, 1, 1, 0, len(payload), 0, 0) + payload
    r = (0, 0, len(payload), len(data), read[4])
    assert nat.read_chunks(rechecksummed(bad), out, [r]) == (0, lib.SNAP_READ_FRAME)
    assert out == bytes(len(data))


def test_scratch_too_small_is_reported_not_overrun():
    data = floats(4096)
    rec, read = record(data, "zstd", 4)
    out = bytearray(len(data))
    assert nat.read_chunks(rec, out, [read], scratch=bytearray(100)) == \
        (0, lib.SNAP_READ_SCRATCH)
    raw, rread = record(os.urandom(500), "none")
    assert nat.read_chunks(raw, bytearray(500), [rread], scratch=bytearray(0)) == (1, 0)


@pytest.mark.parametrize("bad", [
    lambda r, n: (r[0] + 1,) + r[1:],               # the record runs past src
    lambda r, n: (n,) + r[1:],                      # starts at src's end
    lambda r, n: (r[0], 1) + r[2:],                 # the destination runs past out
    lambda r, n: (r[0], 1 << 62) + r[2:],
    lambda r, n: r[:2] + (r[2] + 1,) + r[3:],       # stored length past src
])
def test_places_outside_the_buffers_are_invalid_arguments(bad):
    rec, read = record(floats(256), "zstd", 4)
    out = bytearray(1024)
    with pytest.raises(errors.InvalidArgumentError):
        nat.read_chunks(rec, out, [read, bad(read, len(rec))])
    assert out == bytes(1024)       # nothing done, not even the good read


def test_overlapping_buffers_are_invalid_arguments():
    rec, read = record(b"z" * 256, "none")
    buf = bytearray(rec + bytes(256))
    view = memoryview(buf)
    with pytest.raises(errors.InvalidArgumentError):
        nat.read_chunks(view[:len(rec)], view, [read])
    with pytest.raises(errors.InvalidArgumentError):
        nat.read_chunks(rec, view[:256], [read], scratch=view[100:400])


def test_read_only_out_is_a_type_error():
    rec, read = record(b"z" * 256, "none")
    with pytest.raises(errors.InvalidArgumentTypeError):
        nat.read_chunks(rec, bytes(256), [read])


def test_after_fork_in_a_child():
    rec, read = record(floats(4096), "zstd", 4)
    pid = os.fork()
    if pid == 0:
        out = bytearray(read[3])
        ok = nat.read_chunks(rec, out, [read]) == (1, 0) and bytes(out) == floats(4096)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0


@pytest.mark.parametrize("rotation", range(8))
def test_every_rotation_round_trips_through_both_readers(rotation):
    """A byte-plane record of any rotation (the plane header's flags) decodes to its bytes in
    the C core's reader and in engine/planes.py's, and the reference reads it by hand."""
    data = floats(4096, 7)
    cid = blake3.blake3(data).digest()
    recs, [(off, stored_len, codec, _)] = nat.write_chunks([(data, cid)], 4, 0b1111,
                                                           rotate=rotation)
    assert codec == fmt.CODEC_PLANES
    stored = bytes(recs[off + fmt.RECORD_HEADER.size + fmt.CHUNK_PREFIX.size:
                        off + fmt.RECORD_HEADER.size + stored_len])
    assert fmt.PLANES_HEADER.unpack_from(stored) == (4, rotation)
    assert bytes(planes.decode(stored, len(data))) == data
    assert ref.planes_chunk(stored, len(data)) == data
    out = bytearray(len(data))
    read = (0, 0, stored_len, len(data), cid)
    assert nat.read_chunks(bytes(recs[off:]), out, [read]) == (1, 0)
    assert out == data


@pytest.mark.parametrize("rotate, error", [(8, errors.InvalidArgumentError),
                                           (-1, errors.InvalidArgumentError),
                                           ("3", errors.InvalidArgumentTypeError),
                                           (1.0, errors.InvalidArgumentTypeError)])
def test_write_chunks_refuses_a_bad_rotation(rotate, error):
    data = floats(1024, 1)
    with pytest.raises(error):
        nat.write_chunks([(data, bytes(32))], 4, 0b1111, rotate=rotate)
    with pytest.raises(error):
        nat.split_planes(data, 4, rotate=rotate)
