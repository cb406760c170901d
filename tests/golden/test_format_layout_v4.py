"""The v4 on-disk layout (docs/design.md, "Segment files"), byte by byte, from the golden
stores of format 4 (stores/v4, made by the version that made format 4 final: README.md; every
file pinned by SHA-256 at the end of this file) and from a store written here by today's code.
Nothing comes from snapstore.format: the layout is written out by hand.

Format 4 keeps every layout of format 3 (test_format_layout_v3.py) and adds one chunk codec:

  segment header:  <8sIIQQ version 4; a segment of version 4 may hold chunk records of codec
                   0 (raw), 1 (one zstd frame) or 2 (byte planes); segments of versions 1-3
                   only 0 and 1.
  codec 2 (byte planes), the stored bytes after the chunk prefix (<32sI chunk id, raw length):
                   <BB item size k (2, 4 or 8), flags (bit 0: every item, a little-endian word
                   of k bytes, rotated left one bit first: a float's sign leaves the
                   exponent's bytes); then k times <BI how plane j is stored (0 raw, 1 one zstd
                   frame declaring its content size), its stored length; then the k planes'
                   stored bytes back to back, then the raw length % k tail bytes as they are.
                   Plane j (raw length // k bytes) holds byte j of every item, in item order.
                   The chunk id is the BLAKE3-256 of the raw bytes, as for every codec.
  upgrade 3 -> 4:  META_FORMAT 4 in the index, FORMAT 4; the log goes on in a new segment of
                   version 4; nothing else changes.

The writer codes a chunk as planes only when its buffer is typed as floats of 2, 4 or 8 bytes
(NumPy float16/32/64 arrays, torch floating tensors through the object layer) and the planes
save at least 1/32; the golden store "floats" holds planes of all three sizes, incompressible
floats stored raw, small float buffers as one zstd frame, and torch bfloat16 tensors.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
import struct

import blake3
import numpy as np
import pytest
import xxhash
import zstandard

from golden_values import files_sha256

import snapstore

HERE = os.path.dirname(os.path.abspath(__file__))
V4 = os.path.join(HERE, "stores", "v4")
GOLDEN = sorted(os.path.basename(os.path.dirname(p))
                for p in glob.glob(os.path.join(V4, "*", "FORMAT")))
SEG_HEADER = struct.Struct("<8sIIQQ")
REC_HEADER = struct.Struct("<4sBBHIIQ")
CHUNK = 1
LOG_SEGMENTS = 10 ** 9
CODECS = {1: (0, 1), 2: (0, 1), 3: (0, 1), 4: (0, 1, 2),      # segment version -> chunk codecs
          5: (0, 1, 2, 3), 6: (0, 1, 2, 3)}
# Today's code writes format 6, which keeps every layout of format 4 and adds a chunk codec (3,
# delta planes against a base chunk: test_format_layout_v5.py) for a float buffer whose parent
# holds its chunks, and lets codec 2's flags rotate items by up to 7 bits
# (test_format_layout_v6.py); a store's first checkpoint has no parent, so it is all codec 2.
TODAY = 6
ROTATIONS = {4: (0, 1), 5: (0, 1), 6: tuple(range(8))}     # segment version -> codec 2's flags


def records(path: str):
    """(segment version, record type, codec, payload) of every record of a segment file."""
    with open(path, "rb") as f:
        data = f.read()
    magic, version, reserved, number, checksum = SEG_HEADER.unpack_from(data)
    assert magic == b"SNAPSEG\x00" and reserved == 0
    assert checksum == xxhash.xxh3_64_intdigest(data[:24], seed=0)
    pos, out = 32, []
    while pos + 24 <= len(data):
        magic, rtype, codec, flags, length, reserved, checksum = REC_HEADER.unpack_from(data, pos)
        payload = data[pos + 24:pos + 24 + length]
        if magic != b"SREC" or len(payload) != length or checksum != \
                xxhash.xxh3_64_intdigest(data[pos:pos + 16] + payload, seed=0):
            break                                   # a torn tail (the "unapplied" recipes)
        out.append((version, rtype, codec, payload))
        pos += 24 + length
    return out


def unrotate(items: bytes, k: int, r: int = 1) -> bytes:
    bits, mask = 8 * k, (1 << 8 * k) - 1
    out = bytearray()
    for i in range(0, len(items) - len(items) % k, k):
        w = int.from_bytes(items[i:i + k], "little")
        out += (((w >> r) | (w << (bits - r))) & mask).to_bytes(k, "little")
    return bytes(out)


def decode_planes(stored: bytes, raw_len: int, version: int = 4) -> bytes:
    """Codec 2's stored bytes in a segment of header `version` -> the raw bytes, by the layout
    above (format 6: flags the items' rotation, 0..7 bits)."""
    k, flags = struct.unpack_from("<BB", stored)
    assert k in (2, 4, 8) and flags in ROTATIONS[version]
    n, tail = divmod(raw_len, k)
    table = [struct.unpack_from("<BI", stored, 2 + 5 * j) for j in range(k)]
    pos, planes = 2 + 5 * k, []
    for how, length in table:
        piece = stored[pos:pos + length]
        pos += length
        if how == 0:
            assert length == n
            planes.append(piece)
        else:
            assert how == 1 and piece[:4] == b"\x28\xb5\x2f\xfd"
            assert zstandard.frame_content_size(piece) == n
            planes.append(zstandard.ZstdDecompressor().decompress(piece))
            assert len(piece) < n                    # kept only because it is smaller
    assert len(stored) - pos == tail
    items = bytearray(n * k)
    for j, plane in enumerate(planes):
        items[j::k] = plane
    items = unrotate(bytes(items), k, flags) if flags else bytes(items)
    return items + stored[pos:]


def chunks_of(store: str):
    """(segment version, codec, chunk id, raw bytes) of every chunk record of a golden store."""
    out = []
    for p in sorted(glob.glob(os.path.join(V4, store, "segments", "*.seg"))):
        for version, rtype, codec, payload in records(p):
            if rtype != CHUNK:
                continue
            assert codec in CODECS[version], (p, version, codec)
            cid, raw_len = struct.unpack_from("<32sI", payload)
            stored = payload[36:]
            if codec == 2:
                raw = decode_planes(stored, raw_len)
            elif codec == 1:
                raw = zstandard.ZstdDecompressor().decompress(stored, max_output_size=raw_len)
            else:
                raw = stored
            assert len(raw) == raw_len and blake3.blake3(raw).digest() == cid, (p, codec)
            out.append((version, codec, cid, raw))
    return out


# ---- the golden stores ------------------------------------------------------------------------
def test_golden_files_are_the_originals():
    assert files_sha256(V4) == GOLDEN_SHA256


def test_golden_stores_of_format_4():
    assert GOLDEN == sorted(["basic", "raw_cdc", "objects", "torch", "unapplied", "compacted",
                             "upgraded", "interrupted", "writers", "group", "floats"])
    for store in GOLDEN:
        with open(os.path.join(V4, store, "FORMAT")) as f:
            assert json.load(f)["version"] == 4


@pytest.mark.parametrize("store", GOLDEN)
def test_every_chunk_decodes_by_hand_to_its_id(store):
    found = chunks_of(store)
    assert found
    versions = {v for v, *_ in found}
    assert versions <= {1, 4} if store == "upgraded" else versions == {4}


def test_the_floats_store_holds_every_kind_of_plane_chunk():
    found = chunks_of("floats")
    planes = []
    for p in sorted(glob.glob(os.path.join(V4, "floats", "segments", "*.seg"))):
        for version, rtype, codec, payload in records(p):
            if rtype == CHUNK and codec == 2:
                planes.append(struct.unpack_from("<BB", payload, 36))
    assert {k for k, _ in planes} == {2, 4, 8} and {f for _, f in planes} == {1}
    codecs = {codec for _, codec, _, _ in found}
    assert codecs == {0, 1, 2}                  # noise raw, small floats one zstd frame


def test_golden_floats_restore_exactly_from_a_copy(tmp_path):
    """Every weights checkpoint restores to the hashes expected.json recorded of its inputs
    (on a copy: a golden store is never opened in place)."""
    import shutil
    path = str(tmp_path / "floats")
    shutil.copytree(os.path.join(V4, "floats"), path)
    with open(os.path.join(V4, "floats", "expected.json")) as f:
        exp = {c["id"]: c for c in json.load(f)["checkpoints"]}
    with snapstore.open(path, readonly=True) as s:
        infos = s.checkpoints()
        assert [i.stream for i in infos].count("weights") == 3
        for info in infos:
            if info.stream == "weights":
                got = s.restore(info.id)
                want = {b["name"]: b["sha256"] for b in exp[info.id]["buffers"]}
                assert {k: hashlib.sha256(v).hexdigest() for k, v in got.items()} == want
        assert s.verify(deep=True)["ok"]


# ---- a store written here ------------------------------------------------------------------
def test_todays_code_writes_planes_of_float_buffers(tmp_path):
    path = str(tmp_path / "s")
    w = (np.random.default_rng(4).standard_normal(30_001) * 0.02).astype(np.float32)
    with snapstore.open(path, durability="none") as s:
        info = s.checkpoint({"w": w, "b": bytes(range(256)) * 64})
        assert s.restore(info.id)["w"] == w.tobytes()
    with open(os.path.join(path, "FORMAT")) as f:
        assert json.load(f)["version"] == TODAY
    got = {}
    for p in sorted(glob.glob(os.path.join(path, "segments", "*.seg"))):
        for version, rtype, codec, payload in records(p):
            assert version == TODAY
            if rtype == CHUNK:
                cid, raw_len = struct.unpack_from("<32sI", payload)
                raw = decode_planes(payload[36:], raw_len, version) if codec == 2 else (
                    zstandard.ZstdDecompressor().decompress(payload[36:]) if codec == 1
                    else payload[36:])
                got.setdefault(codec, []).append(raw)
    assert b"".join(got[2]) == w.tobytes()          # the float buffer: planes, in order
    assert b"".join(got[1]) == bytes(range(256)) * 64     # the bytes: one zstd frame


GOLDEN_SHA256 = {
    "basic/FORMAT": "9d534e3447c52f98d0764af770a46666496c9dc6b2e0b52437132c7c8d3eb337",
    "basic/expected.json": "bf5e75fd37e157fd1851a9a611060bd3582a1ba2c699ba499855d99412d56aaf",
    "basic/index/data.mdb": "1c242f042a1041a471949736f369c4d9eb6f5921304f71f6b7abab6d4263b1af",
    "basic/segments/0000000000000001.seg": "d9b0523e73b8a238b169d1cfd1c90278cdf790ad50c15396785f7dc899f35489",
    "basic/segments/0000000000000002.seg": "429d6e38af8bfa7063d94c740c27a43d39bfb399c86de06ebfe426122ae6a928",
    "basic/segments/0000000000000004.seg": "bcd678df3fc74b9086da52c940e6bf8d8c93c068602e941d33cd5c54fc4bb526",
    "compacted/FORMAT": "6e6637e171774aefeeac91661b6fcbec2e0a4c5c87de9ddd8e8e92761c2a61af",
    "compacted/expected.json": "ff9f796b6ed051fee87ff769c7adbba98db9920087c157b02450d2a1ed5b05bc",
    "compacted/index/data.mdb": "f3dd30f0d03d180e988064378bc960bb97cbf8f6b4f7fe61455568c30f66135e",
    "compacted/segments/0000000000000003.seg": "76d421da86355edbacba144c38d13e870bd5223e706f4be0729fb3d1b52351de",
    "compacted/segments/0000000000000005.seg": "260601c48e2b5f5ea9667f435d0fb2ad198e64c60d84fbad53f30c2376234d0b",
    "compacted/segments/0000000000000006.seg": "c6812c58b136a546b992b802659ad10d8f3f030658dabf750409bfcf17d38153",
    "floats/FORMAT": "66162da888099ccbcc18265ab5b0df58cc2b6ae076c390cc02f739d0b3a79ef2",
    "floats/expected.json": "b9ee9cf65388fd8e332fa7b8e5e80182438cd53e5ed439b119cc60e03f863fe4",
    "floats/index/data.mdb": "6d94f3c90dc4ef389cbf774e15219c023e2af244dc9952153e013368919a79ca",
    "floats/segments/0000000000000001.seg": "b1543a60a887de0205c10fe432b9b542264ae9f9858554c452b9840cb4f2f3ec",
    "floats/segments/0000000000000002.seg": "021fff13e2e94656a538757a566db59a84b7fa69e051b31a2d225b46764738be",
    "floats/segments/0000000000000003.seg": "bdf02072c475d76491a3aea99ad676715ab4c8d67c049b26a37c2b64321591f4",
    "floats/segments/0000000000000004.seg": "eec714e745bed3f5c8031256c1a8b0a11be3c672f597c8a3395ce7ec1975e0d8",
    "floats/segments/0000000000000005.seg": "b67b9a878cc1960577e25e2a9122ce783516130068a1ff4ae31abeb27453199d",
    "floats/segments/0000000000000006.seg": "89d3e0160c60160ab093a6b12e0fb72f299c9b3be3960b41ae85c16ec4288437",
    "group/FORMAT": "74ff465f3b66871f17fd21691ad3e1523460812dbb2b8d9586182846535000b7",
    "group/expected.json": "63f35fae96ca7b44d51f47962f0dd041d7d28812a7e6d9343bcf67d3f35f2dae",
    "group/index/data.mdb": "f3af9d451a121eafc06aa6b69e8f49acdb81f85cff342146f28d6338ae23e4cb",
    "group/segments/0000000000000001.seg": "9d51a7e107a3f29d7eea4f853e8ecab09289dc173dd7e251174060c72e8dacb5",
    "group/segments/0000001000000001.seg": "17066ac9bd9ac45cd7bd9ced9b01eb9e1a2cf6936928d8046e9123b7c75f86b1",
    "group/segments/0000002000000001.seg": "64dec65d9dd78523eed288a689060410e440b40083c6feca01651463cc5b86d6",
    "interrupted/FORMAT": "1e7b77e114c958a267ed019cc8f83033c9460cc488fa07bab9600b281c3e5e99",
    "interrupted/expected.json": "e662755cc83572eaffde30ea4c14b99eae4da4bf80d8ed2c6afc30a6f6c3ede9",
    "interrupted/index/data.mdb": "5accefc725fba5f9552402bcd1d1f65119184aeeb2e44425bb1c4f0fccc1de3f",
    "interrupted/segments/0000000000000001.seg": "81c4a80829640a9a3d902d3dd5840df87ba0f17483460de3cff66228ef8ac214",
    "interrupted/segments/0000000000000002.seg": "c3778a04ed0b75ff2ab6991f09c470cc4446e3a6d22e730de5a522cdf203ecdb",
    "interrupted/segments/0000001000000001.seg": "23d9fcb8b6f9d92f5860d69fbf80c582fac1ea4c435a3489b5b4a545bbde4939",
    "interrupted/segments/0000002000000001.seg": "0b85c04621e27716921b1271ed9dae97d8d2442c8e2054a350cf0bdcbbb6bcd4",
    "interrupted/segments/0000003000000001.seg": "67f5c5cb423f9497b5fba13ce3ba9d7cf2e1e9333b5f0e9d859cdb12e3c09987",
    "objects/FORMAT": "f2745a59eb27a43390c202482aa45a2f920e651fbabb0eb5f63ec4ae463ebd22",
    "objects/expected.json": "d1830b8fd26851b404cdf79fe71bf0abbea71fad66c7811856a9ba95361eba4b",
    "objects/index/data.mdb": "759b57e4c00bdb9058631d089c04529ccb2763dafd54711002967c20437a09af",
    "objects/segments/0000000000000001.seg": "6dece854326a4a0505056fa26cd71619f7996a6969640290196560177854ecbd",
    "objects/segments/0000000000000002.seg": "92273c0ce486f18edddda1c2bc793fd3b775c7cb2ef92a78f88ec826e19134fe",
    "raw_cdc/FORMAT": "50007e2349ce7f536646baf456824e9578da93a089d807e7bdbae52f30a0f061",
    "raw_cdc/expected.json": "9c63738d6bc6b4fef1d035f51e6cabe710802230d42c88c2970088443ddecd64",
    "raw_cdc/index/data.mdb": "22b5a329048e6d410268843f8700945c8ae59c1ec4d22cb7aa389451f3635e65",
    "raw_cdc/segments/0000000000000001.seg": "6f5bdba078523e473dc8555ef95c4b0e57162a6a7bec6771e91821b6db80a736",
    "raw_cdc/segments/0000000000000002.seg": "7bd8755a7ac171c4fe57e3e55fb1ee9276fe9a8b1be399c17a840eae69efe87e",
    "raw_cdc/segments/0000000000000003.seg": "fcb70d92e36ffe38e292e661494cb64d3bbfb92b5e63c375865a833f5d3d1c05",
    "torch/FORMAT": "7aa90627d90ea4fb0f8584f64a0476a3e0b39a6e2696921702c32b779a9e07be",
    "torch/expected.json": "204457f71c763206a526979f980dc562e76860d42cd25a926b463031e981486f",
    "torch/index/data.mdb": "543ecd9fb907fd4f6682d0ad1661fedd832db0fe3dc77417e08a0cc110407070",
    "torch/segments/0000000000000001.seg": "93d4951bd5729d96582f4c7de5f0b6a036342660ef14b516ef459f9278961512",
    "unapplied/FORMAT": "8ee7361308bbd3ceeff27f616e39dc397445ed100a3f2d00823401783867a3cc",
    "unapplied/expected.json": "b34e238e70071065c39e71e13f6078988aa9fac90816e2ba90fa5c8c3d8027c1",
    "unapplied/index/data.mdb": "cce506be6e17921f2b86eb27cad25d4da73d63379bcf025c4bc58aa00556284b",
    "unapplied/segments/0000000000000001.seg": "255697d499fbae17db34571000751f73742893f054f712ec1a46e202d3c9b93b",
    "upgraded/FORMAT": "73b1510451bad9c26d042d9bf160f4cd13a955c00c749dbc63459a8bb39af2f1",
    "upgraded/expected.json": "c3116d6a0a326cebabafc6303b2a10915a695afd7367f63f15a19684f2547823",
    "upgraded/index/data.mdb": "a70e214701931bfbeef05f8f2e125af0563d3dbcf09d3a609b7a34a393950da6",
    "upgraded/segments/0000000000000001.seg": "a04261507af6199367830adfc4616895a2d20653bf902a0e6a015cf02b5174d7",
    "upgraded/segments/0000000000000002.seg": "cc94ec1764111987a2b4e5abfda164419ca1491ea59605cdd5450fccd37e954f",
    "upgraded/segments/0000000000000004.seg": "67caebc1f01827858049a951a61d793a591843f8115df3113b60d5e0d6d42f43",
    "upgraded/segments/0000000000000005.seg": "ed6a274b37ff42531dc7c3c2b9453a4f4a59cc588d130fac483165f53bef577b",
    "writers/FORMAT": "ea3651292c0fefdeec23ba57ce58591a7cccc4627768221f9509b1d75b0bfdef",
    "writers/expected.json": "70e3c07ef49c403d8f2eb4244a472756e80bd033f36663be3b70270ea2dbd7e7",
    "writers/index/data.mdb": "1a66618f360c99641e30eb6f429332dbcfb5e62567bbd1a74526bc8e461ce27c",
    "writers/segments/0000000000000001.seg": "d1400bda9db9f37ef0cd8ead25e8f06a5540c50c68e3c096809f7a77dce3f882",
    "writers/segments/0000000000000003.seg": "d724f5fab196f13fa4efc471c1e06af5acb29958edefddfa40912a3bc61983c3",
    "writers/segments/0000001000000001.seg": "d1e07b477827208ca7949c03a492f5936c56774cecfd4049182f0eb02459258c",
    "writers/segments/0000001000000003.seg": "0a7dbaa5c79c142f5dd3f3df8467f9dd8ed6de250ef92bed935449b9667e8369",
    "writers/segments/0000002000000001.seg": "886e58ad50eb0bbe87405bd598cad7bb7f7e5d42042e2f7c9386e6331e51b1ef",
    "writers/segments/0000002000000002.seg": "f44beb014b8cb24de1065110bfa303497ddd62a194a17401d87ef46461e7a1e7",
}
