"""The v6 on-disk layout (docs/design.md, "Segment files"; docs/floatcodec.md, "The rotation"),
byte by byte, from the golden store of format 6 (stores/v6/rotated, made by the version that
made format 6: README.md; every file pinned by SHA-256 at the end of this file), from stores
written here by today's code and from copies of the golden stores of format 5. Nothing comes
from snapstore.format: the layouts are written out by hand (the v3 and v5 parsers of the
layouts format 6 keeps are used).

Format 6 keeps every layout of format 5 (test_format_layout_v5.py) and widens one field:

  segment header:  <8sIIQQ version 6; a segment of version 6 may hold the chunk codecs of
                   version 5 (0 raw, 1 one zstd frame, 2 byte planes, 3 delta planes).
  codec 2 (byte planes), the plane section's <BB item size k, flags: the flags are a
                   rotation r of 0..7 bits (versions 4 and 5: 0 or 1): before the split each
                   item, a little-endian word of k bytes, was rotated left by r bits,
                   (w << r) | (w >> (8k - r)); a reader rotates each joined item right by r.
                   The tail bytes are not rotated. Any other flag bit is damage. Codec 3's
                   plane section keeps flags 0.
  upgrade 5 -> 6:  META_FORMAT 6 in the index, FORMAT 6; the log goes on in a new segment of
                   version 6; nothing else changes (test_upgrade.py).

A writer at compression_level 3 or more rotates the chunks of one buffer's batch by the
rotation, of 1 and 3, whose probe samples code smaller: 3 for float32 and bfloat16 weights
(the top plane becomes the exponent's 6 low bits and the mantissa's 2 top bits, which Huffman
codes closer to their entropy), 1 for float16 (whose 5-bit exponent would lose its plane);
below level 3 (the default is 1) it rotates by 1 as formats 4 and 5 did, because rotation 3
makes the low plane worth compressing too (25-60% more time for a dense checkpoint). S3
stores (segments of version 4) and savepoint files keep rotation 1: older snapstores read
them.
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import struct

import numpy as np
import pytest

import snapstore
from snapstore import savepoints

from golden_values import files_sha256
from test_format_layout import CHUNK, COMMIT, record
from test_format_layout_v3 import index_payloads, parse_segment, segment_header
from test_format_layout_v5 import (check_chunk_entries, decode_all, load_store, plane_section,
                                   unrotate)

HERE = os.path.dirname(os.path.abspath(__file__))
V5 = os.path.join(HERE, "stores", "v5")
V6 = os.path.join(HERE, "stores", "v6")
TODAY = 6


# ---- the golden store ---------------------------------------------------------------------
def golden_expected(store: str = "rotated") -> dict:
    with open(os.path.join(V6, store, "expected.json")) as f:
        return json.load(f)


def test_golden_files_are_the_originals():
    assert files_sha256(V6) == GOLDEN_SHA256


def test_golden_store_of_format_6():
    assert sorted(os.listdir(V6)) == ["rotated"]
    with open(os.path.join(V6, "rotated", "FORMAT")) as f:
        d = json.load(f)
    assert set(d) == {"format", "version", "created"} and isinstance(d["created"], float)
    assert (d["format"], d["version"]) == ("snapstore", 6)
    assert golden_expected()["format_version"] == 6


def test_golden_rotated_log(tmp_path):
    """Every segment of version 6, walked to its end; every chunk decodes by hand (codec 2
    items rotated right by their flags, delta chunks over their rotated keyframes) to the
    bytes its id hashes; float32, bfloat16 and float64 chunks carry flags 3, float16's 1;
    every chunk entry of the index names its record, with exact counts; the index says
    format 6."""
    path = os.path.join(V6, "rotated")
    logs = load_store(path)
    assert set(logs) == {0}
    raw, depth = decode_all(logs[0], rotations=range(8))
    flags = chunk_flags(path)
    assert {v for v, _, _ in flags.values()} == {TODAY}
    assert {(k, f) for _, k, f in flags.values()} >= {(4, 3), (2, 3), (2, 1), (8, 3)}
    assert any(d == 1 for d in depth.values())                  # delta chunks (codec 3)
    dbs = index_payloads(os.path.join(path, "index"), str(tmp_path / "scratch"))
    assert struct.unpack("<Q", dbs[b"meta"][b"format"])[0] == TODAY
    check_chunk_entries(dbs, logs, range(8))
    commits = [r for r in logs[0] if r.rtype == COMMIT]
    assert len(commits) == len(golden_expected()["checkpoints"])


def test_golden_rotated_restores_and_upgrades_by_nothing(tmp_path):
    """A copy: a reader restores every checkpoint to the hashes expected.json recorded; a
    writer's open changes no byte of it and verifies clean; a new float32 checkpoint goes on
    in its last segment (rotated by 3 at compression_level 3)."""
    import hashlib
    path = str(tmp_path / "rotated")
    shutil.copytree(os.path.join(V6, "rotated"), path,
                    ignore=shutil.ignore_patterns("expected.json"))
    exp = golden_expected()
    with snapstore.open(path, readonly=True) as s:
        for c in exp["checkpoints"]:
            got = s.restore(c["id"])
            assert {k: hashlib.sha256(v).hexdigest() for k, v in got.items()} == \
                {b["name"]: b["sha256"] for b in c["buffers"]}
    segments = sorted(os.listdir(os.path.join(path, "segments")))
    w = (np.random.default_rng(65).standard_normal(20_000) * 0.02).astype(np.float32)
    before = chunk_flags(path)
    with snapstore.open(path, durability="none", compression_level=3) as s:
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
        info = s.checkpoint({"w": w}, "after")
        assert s.restore(info.id) == {"w": w.tobytes()}
    assert sorted(os.listdir(os.path.join(path, "segments"))) == segments
    after = chunk_flags(path)
    assert {after[c] for c in set(after) - set(before)} == {(TODAY, 4, 3)}
    with open(os.path.join(path, "FORMAT")) as f:
        assert json.load(f)["version"] == TODAY


# ---- stores written here ------------------------------------------------------------------


def weights(rng) -> dict:
    """float32 (three 64 KiB chunks and a tail of 3 items), bfloat16 (NumPy has none: its bits
    typed float16), float16 and float64 weights N(0, 0.02)."""
    w32 = (rng.standard_normal(3 * 16384 + 3) * 0.02).astype(np.float32)
    bf16 = (w32.view(np.uint32) >> 16).astype(np.uint16).view(np.float16)
    return {"w32": w32, "bf16": bf16,
            "w16": (rng.standard_normal(40_000) * 0.02).astype(np.float16),
            "w64": rng.standard_normal(20_000) * 0.02}


def chunk_flags(path: str) -> dict:
    """{chunk id: (segment version, item size, flags)} of every codec 2 record of a store."""
    out = {}
    for p in sorted(glob.glob(os.path.join(path, "segments", "*.seg"))):
        with open(p, "rb") as f:
            version = struct.unpack_from("<8sI", f.read(12))[1]
        for r in parse_segment(p, version):
            if r.rtype == CHUNK and r.codec == 2:
                cid, _ = struct.unpack_from("<32sI", r.payload)
                k, flags = struct.unpack_from("<BB", r.payload, 36)
                out[cid] = (version, k, flags)
    return out


def test_todays_code_at_level_1_rotates_by_1(tmp_path):
    """The default compression_level (1): FORMAT and every segment header say 6, and every
    byte-plane chunk rotates its items by 1, as formats 4 and 5 did."""
    path = str(tmp_path / "s")
    w = weights(np.random.default_rng(60))
    with snapstore.open(path, durability="none") as s:
        info = s.checkpoint(w, "w")
        assert s.restore(info.id) == {k: v.tobytes() for k, v in w.items()}
    with open(os.path.join(path, "FORMAT")) as f:
        assert json.load(f)["version"] == TODAY
    decode_all(load_store(path)[0], rotations=range(8))
    flags = chunk_flags(path)
    assert {k for _, k, _ in flags.values()} == {2, 4, 8}
    assert {(v, f) for v, _, f in flags.values()} == {(TODAY, 1)}


def test_todays_code_at_level_3_rotates_float32_and_bfloat16_by_3_and_float16_by_1(tmp_path):
    """compression_level 3: FORMAT and every segment header say 6; each buffer's byte-plane
    chunks carry the rotation its probe chose: 3 for float32 and bfloat16 weights, 1 for
    float16; every chunk decodes by hand (the planes joined, each item rotated right by its
    flags) to the bytes its id hashes; the whole buffer restores byte-exact."""
    path = str(tmp_path / "s")
    w = weights(np.random.default_rng(61))
    with snapstore.open(path, durability="none", compression_level=3) as s:
        info = s.checkpoint(w, "w")
        assert s.restore(info.id) == {k: v.tobytes() for k, v in w.items()}
    with open(os.path.join(path, "FORMAT")) as f:
        assert json.load(f)["version"] == TODAY
    logs = load_store(path)
    raw, _ = decode_all(logs[0], rotations=range(8))      # every chunk against its id
    flags = chunk_flags(path)
    assert {v for v, _, _ in flags.values()} == {TODAY}
    by_size = {}
    for _, k, f in flags.values():
        by_size.setdefault(k, set()).add(f)
    assert by_size[4] == {3}                                # float32
    assert by_size[8] <= {1, 3}                             # float64: the probe's choice
    # bfloat16 and float16 share item size 2: each buffer's chunks one rotation, its own
    w16 = w["w16"].tobytes()
    for cid, (_, k, f) in flags.items():
        if k == 2:
            assert f == (1 if raw[cid] in w16 else 3), f
    assert by_size[2] == {1, 3}


@pytest.mark.parametrize("r", range(8))
def test_a_hand_rotated_chunk_decodes_by_hand(r):
    """The layout above, applied by hand to float32 items rotated by every r: the planes of
    the rotated items, joined and rotated back, give the items."""
    items = (np.random.default_rng(r).standard_normal(1000) * 0.02).astype(np.float32)
    w = items.view(np.uint32).astype(np.uint64)
    rotated = ((((w << r) | (w >> (32 - r))) & 0xFFFFFFFF).astype(np.uint32)
               if r else items.view(np.uint32))
    planes = [rotated.view(np.uint8)[j::4].tobytes() for j in range(4)]
    section = struct.pack("<BB", 4, r) + b"".join(struct.pack("<BI", 0, 1000) for _ in range(4)) \
        + b"".join(planes)
    k, flags, joined, tail = plane_section(section, 4000)
    assert (k, flags, tail) == (4, r, b"")
    assert (unrotate(joined, 4, r) if r else joined) == items.tobytes()


def rotated_store(path: str) -> tuple[int, int, bytes]:
    """A store of one float32 checkpoint (its chunks rotated by 3); returns the segment and
    offset of its first codec 2 record and the weights."""
    w = (np.random.default_rng(62).standard_normal(16384) * 0.02).astype(np.float32)
    with snapstore.open(path, durability="none", compression_level=3) as s:
        s.checkpoint({"w": w}, "w")
    for p in sorted(glob.glob(os.path.join(path, "segments", "*.seg"))):
        for r in parse_segment(p, TODAY):
            if r.rtype == CHUNK and r.codec == 2:
                assert struct.unpack_from("<BB", r.payload, 36) == (4, 3)
                return r.segment, r.offset, w.tobytes()
    raise AssertionError("no byte-plane record")


def test_a_segment_of_version_5_holds_no_rotation_by_3(tmp_path):
    """Rotations above 1 only in segments of header version 6: the same records behind a
    segment header of version 5 are damage to verify (a byte-plane record of a rotation
    segments of that version do not hold); readers of the bytes still decode them."""
    path = str(tmp_path / "s")
    segment, offset, w = rotated_store(path)
    seg_path = os.path.join(path, "segments", f"{segment:016d}.seg")
    with open(seg_path, "r+b") as f:
        f.write(segment_header(segment, 5))
    with snapstore.open(path, readonly=True) as s:
        report = s.verify(deep=True)
        assert s.restore(1) == {"w": w}
    assert not report["ok"]
    assert any(p["kind"] == "damaged_record" and p["segment"] == f"{segment:016d}.seg"
               and p["offset"] == offset and "rotation" in p["message"]
               for p in report["problems"]), report["problems"]


@pytest.mark.parametrize("flags", [8, 0x10, 0x80, 0xFF])
def test_flags_above_the_rotation_are_damage(tmp_path, flags):
    """A codec 2 record whose flags hold a bit above the rotation's 3 (its checksum made
    right, as a writer bug would): restore refuses it (CorruptionError naming the record),
    verify reports it; nothing is decoded wrongly."""
    path = str(tmp_path / "s")
    segment, offset, _ = rotated_store(path)
    seg_path = os.path.join(path, "segments", f"{segment:016d}.seg")
    with open(seg_path, "rb") as f:
        data = bytearray(f.read())
    rtype, codec, length = data[offset + 4], data[offset + 5], \
        struct.unpack_from("<I", data, offset + 8)[0]
    payload = bytearray(data[offset + 24:offset + 24 + length])
    payload[37] = flags
    data[offset:offset + 24 + length] = record(rtype, bytes(payload), codec)
    with open(seg_path, "wb") as f:
        f.write(data)
    with snapstore.open(path, readonly=True) as s:
        with pytest.raises(snapstore.errors.CorruptionError):
            s.restore(1)
        report = s.verify(deep=True)
    assert not report["ok"]
    assert any(p["segment"] == f"{segment:016d}.seg" and p["offset"] == offset
               for p in report["problems"]), report["problems"]


def test_upgraded_v5_store_rotates_its_new_chunks_by_3(tmp_path):
    """v5/deltas after today's writer (compression_level 3) upgraded it: new float32 weights (a
    new stream, so no delta) go into log 0's new segment of version 6 rotated by 3, beside the
    store's format 5
    records, which keep flags 0 or 1 in their version 5 segments; everything restores and
    verifies, also for a reader."""
    path = str(tmp_path / "deltas")
    shutil.copytree(os.path.join(V5, "deltas"), path,
                    ignore=shutil.ignore_patterns("expected.json"))
    before = chunk_flags(path)
    assert {(v, f) for v, _, f in before.values()} <= {(5, 0), (5, 1)}
    w = (np.random.default_rng(63).standard_normal(40_000) * 0.02).astype(np.float32)
    with snapstore.open(path, durability="none", compression_level=3) as s:
        info = s.checkpoint({"w": w}, "fresh")
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
    after = chunk_flags(path)
    assert {c: after[c] for c in before} == before
    new = {after[c] for c in set(after) - set(before)}
    assert new and {(v, k, f) for v, k, f in new} == {(TODAY, 4, 3)}
    with snapstore.open(path, readonly=True) as s:
        assert s.restore(info.id) == {"w": w.tobytes()}
        assert s.verify(deep=True)["ok"]


def test_a_savepoint_holds_no_rotation_above_1(tmp_path):
    """A savepoint file is read by older snapstores too: none of its chunk records rotates
    items by more than 1 bit (today it codes chunks untyped: one zstd frame each), whatever
    the store's own records do; it imports back byte-exact."""
    path = str(tmp_path / "s")
    w = (np.random.default_rng(64).standard_normal(40_000) * 0.02).astype(np.float32)
    with snapstore.open(path, durability="none", compression_level=3) as s:
        info = s.checkpoint({"w": w}, "w")
        assert {f for _, _, f in chunk_flags(path).values()} == {3}
        out = str(tmp_path / "w.snap")
        savepoints.export_savepoint(s, info.id, out)
    data = open(out, "rb").read()
    # every chunk record in the file; a codec 2 one's plane section's flags byte is 0 or 1
    codecs = []
    pos = data.find(b"SREC")
    while pos >= 0:
        codec, length = data[pos + 5], struct.unpack_from("<I", data, pos + 8)[0]
        if data[pos + 4] == CHUNK:
            codecs.append(codec)
            if codec == 2:
                assert struct.unpack_from("<BB", data, pos + 24 + 36)[1] in (0, 1)
        pos = data.find(b"SREC", pos + 24 + length)
    assert len(codecs) == 3
    with snapstore.open(str(tmp_path / "t"), durability="none") as t:
        got = savepoints.import_savepoint(t, out)
        assert t.restore(got.id) == {"w": w.tobytes()}


def test_a_writer_killed_in_the_5_to_6_step_leaves_a_store_readers_read(tmp_path):
    """SIGKILLed at upgrade_v6_before_index_commit: index and FORMAT still say 5; readers read
    every checkpoint; the next writer finishes the upgrade (6) and verifies clean."""
    import subprocess
    import sys
    path = str(tmp_path / "deltas")
    shutil.copytree(os.path.join(V5, "deltas"), path,
                    ignore=shutil.ignore_patterns("expected.json"))
    with open(os.path.join(V5, "deltas", "expected.json")) as f:
        exp = json.load(f)
    ids = [c["id"] for c in exp["checkpoints"]]
    root = os.path.dirname(os.path.dirname(HERE))
    env = dict(os.environ, SNAPSTORE_CRASH_AT="upgrade_v6_before_index_commit",
               PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", "import sys, snapstore; "
                        "snapstore.open(sys.argv[1]).close()", path], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)
    with open(os.path.join(path, "FORMAT")) as f:
        assert json.load(f)["version"] == 5
    with snapstore.open(path, readonly=True) as s:
        assert [c.id for c in s.checkpoints()] == ids
    with snapstore.open(path, durability="none") as s:
        report = s.verify(deep=True)
        assert report["ok"], report["problems"][:5]
        assert [c.id for c in s.checkpoints()] == ids
    with open(os.path.join(path, "FORMAT")) as f:
        assert json.load(f)["version"] == TODAY


GOLDEN_SHA256 = {
    "rotated/FORMAT": "9902b119d012aca7cda80d4971833779c83df00df7ae5e3a5b28fac836b45918",
    "rotated/expected.json": "91a85881fa1c3f50e41bb81b1a3aa0bb6576a1e6229097cb6a8b01c8bc0caaa0",
    "rotated/index/data.mdb": "d072664c8b013276cb30befb2df9e9d56990e277876f0f9feffa772c92c3853d",
    "rotated/segments/0000000000000001.seg": "ded260cc60aabfe7e1c3f67459f20ba8bc844b6110369c3f04ec7919aa975f30",
    "rotated/segments/0000000000000002.seg": "3fa9afa4cd9dcd9007e2f438c7d233239d99beb85bb63248a9fe909e3cb21c8f",
    "rotated/segments/0000000000000003.seg": "ae5ff1e563474cc9de9122c6a52865cd8e49364c5e7d9fe5d6f18e0b4f3f8e45",
    "rotated/segments/0000000000000004.seg": "45110055faf3f4dfe985c50978441c660e4d773bdb4468a3c2c5564bb4c13d62",
    "rotated/segments/0000000000000005.seg": "030d664b14e982045ad5a62d433ab577f4257bcd423d4978962dadba8caede0b",
    "rotated/segments/0000000000000006.seg": "6b897321a87ada9e01fb37af4e23258aff0f619c38401841a4ad9f4d8c83858b",
    "rotated/segments/0000000000000007.seg": "6f475bdb767bcaa9632ba6354e6dc01b3f174ce13696e0865a4f608afe3fb203",
    "rotated/segments/0000000000000008.seg": "b1ea33e68d29b8e784330ff776a0c1fabb85b1dfcc2c281b0b95086b7629b9d3",
    "rotated/segments/0000000000000009.seg": "ed075eb1ce7fbef8baaacd04b09a62445d0cffc47792c1010f7c4c88e5f296e6",
    "rotated/segments/0000000000000010.seg": "699e0aa699ee6a53f09a1132eebb042afbbc4abfaeb307061bc05107ff0ea2af",
    "rotated/segments/0000000000000011.seg": "238047b24034310f526eb9ba6a7fe9732a718c1e803802e03b2fa15f266d13f0",
    "rotated/segments/0000000000000012.seg": "d7fbe9203056c0c51dbd02f313bacd90ada6b382bbe769b832a1ff29d9490ffc",
}
