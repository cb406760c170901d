"""Issue 14, defect 6: a zstd frame in a chunk record must not be able to blow up memory.

python-zstandard allocates what a frame header declares. The one chunk decoder
(engine/chunks.py) must check the declared content size against the chunk's raw length (itself
at most fmt.MAX_CHUNK_BYTES) before anything is allocated, and report a mismatch as a
CorruptionError naming segment and offset.

The damaged stores are written by the real write path with a compressor that returns a bomb
frame, so every record checksum and index entry is valid around the bomb. The entry points run
in subprocesses that report their peak RSS growth.
"""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import numpy as np
import pytest
import zstandard

from cli_runner import console_script
import snapstore
from snapstore.engine import chunks, format as fmt
from snapstore.engine import writer as wr
from snapstore.engine.wal import Record
from snapstore.errors import CorruptionError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20
CHUNK = 64 << 10


def bomb_frame(declared: int | None, content: int, window_log: int = 20) -> bytes:
    """A valid zstd frame of `content` zero bytes made of RLE blocks (4 bytes per 128 KiB),
    whose header declares `declared` bytes (None: no content size field)."""
    fcs = b"" if declared is None else struct.pack("<Q", declared)
    fhd = (3 << 6) if declared is not None else 0        # 8-byte FCS, or none; not single segment
    out = [struct.pack("<I", 0xFD2FB528), bytes([fhd, (window_log - 10) << 3]), fcs]
    left = content
    while True:
        n = min(left, 128 << 10)
        left -= n
        last = 1 if left == 0 else 0
        out.append(struct.pack("<I", last | (1 << 1) | (n << 3))[:3] + b"\0")   # RLE block
        if last:
            return b"".join(out)


BOMBS = {
    "declares_200MiB": lambda: bomb_frame(200 * MiB, 200 * MiB),     # ~6 KB, really 200 MiB
    "declares_1TiB": lambda: bomb_frame(1 << 40, 128 << 10),         # ~20 bytes
    "no_content_size": lambda: bomb_frame(None, 200 * MiB),
    "declares_twice_raw": lambda: bomb_frame(2 * CHUNK, 2 * CHUNK),
}


def test_bomb_frames_are_what_they_claim():
    """The helper builds real frames: zstd reads the declared sizes and decodes them."""
    assert zstandard.frame_content_size(BOMBS["declares_1TiB"]()) == 1 << 40
    assert zstandard.frame_content_size(BOMBS["no_content_size"]()) == -1
    f = bomb_frame(3 * MiB, 3 * MiB)
    assert len(f) < 200
    assert zstandard.ZstdDecompressor().decompress(f) == bytes(3 * MiB)


class _BombCompressor:
    def __init__(self, frame: bytes) -> None:
        self.frame = frame

    def compress(self, data) -> bytes:
        return self.frame


def make_bombed_store(path: str, frame: bytes, monkeypatch) -> bytes:
    """A store whose checkpoint 1 holds buffer "a" (one 64 KiB chunk) stored as `frame`;
    returns the buffer's real bytes."""
    data = np.random.default_rng(6).integers(0, 256, CHUNK, dtype=np.uint8).tobytes()
    with monkeypatch.context() as m:
        m.setattr(wr, "_compressor", lambda level: _BombCompressor(frame))
        with snapstore.open(path, durability="none") as s:
            info = s.checkpoint({"a": data}, "t")
    assert info.id == 1
    return data


PROBE = r"""
import json, resource, sys
import snapstore
from snapstore.errors import CorruptionError

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

path, op = sys.argv[1], sys.argv[2]
s = snapstore.open(path, readonly=True)
before = peak()
outcome = "ok"
try:
    if op == "restore":
        s.restore(1)
    elif op == "read":
        s.read(1, "a", 100, 1000)
    else:
        report = s.verify(deep=True)
        outcome = "reported" if not report["ok"] else "ok"
except CorruptionError as exc:
    outcome = "CorruptionError: " + str(exc)
except BaseException as exc:
    outcome = "RAW " + type(exc).__name__ + ": " + str(exc)
print(json.dumps({"outcome": outcome, "growth": peak() - before}))
"""


def _probe(path: str, op: str) -> dict:
    p = subprocess.run([sys.executable, "-c", PROBE, path, op], cwd=ROOT, capture_output=True,
                       text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": ROOT})
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.mark.parametrize("bomb", sorted(BOMBS))
def test_defect6_zstd_bomb_is_corruption_with_bounded_memory(tmp_path, monkeypatch, bomb):
    path = str(tmp_path / "s")
    make_bombed_store(path, BOMBS[bomb](), monkeypatch)
    for op in ("restore", "read", "verify"):
        got = _probe(path, op)
        if op == "verify":
            assert got["outcome"] == "reported", (op, got)
        else:
            assert got["outcome"].startswith("CorruptionError"), (op, got)
            assert ".seg, offset " in got["outcome"], got       # names segment and offset
        assert got["growth"] < 50 * MiB, (op, got)


def test_defect6_zstd_bomb_in_the_cli_is_reported_as_corruption(tmp_path, monkeypatch):
    path = str(tmp_path / "s")
    make_bombed_store(path, BOMBS["declares_1TiB"](), monkeypatch)
    env = {**os.environ, "PYTHONPATH": ROOT}
    for argv in (["restore", "1", "--out", str(tmp_path / "out")], ["verify", "--deep"]):
        p = subprocess.run([console_script(), "-s", path] + argv, cwd=ROOT,
                           capture_output=True, text=True, timeout=120, env=env)
        assert p.returncode == 1, (argv, p.stdout, p.stderr)
        assert "internal error" not in p.stderr, (argv, p.stderr)


def _chunk(frame: bytes, raw_len: int, codec: int = fmt.CODEC_ZSTD) -> chunks.StoredChunk:
    payload = fmt.CHUNK_PREFIX.pack(b"\1" * 32, raw_len) + frame
    record = Record(3, 4096, fmt.REC_CHUNK, codec, len(payload), payload)
    return chunks.stored_chunk(record)


def test_defect6_decoder_checks_the_declared_size_before_decompressing():
    real = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(CHUNK))
    assert bytes(chunks.decode_chunk(_chunk(real, CHUNK))) == bytes(CHUNK)
    for frame, raw_len in ((bomb_frame(1 << 40, 1 << 17), CHUNK),
                           (bomb_frame(None, CHUNK), CHUNK),
                           (bomb_frame(CHUNK + 1, CHUNK + 1), CHUNK),
                           # raw length and frame agree, but beyond any chunk a store writes
                           (bomb_frame(fmt.MAX_CHUNK_BYTES + 4096, fmt.MAX_CHUNK_BYTES + 4096),
                            fmt.MAX_CHUNK_BYTES + 4096),
                           (b"not a zstd frame at all", CHUNK)):
        with pytest.raises(CorruptionError) as info:
            chunks.decode_chunk(_chunk(frame, raw_len))
        assert info.value.segment == "0000000000000003.seg" and info.value.offset == 4096


def test_defect6_max_chunk_bounds_every_chunk_the_store_writes(tmp_path):
    """The decoder's bound is the writer's: options cannot make a larger chunk."""
    assert wr.STAGING_BYTES // 2 >= fmt.MAX_CHUNK_BYTES     # each staging area holds one
    from snapstore.errors import InvalidArgumentError
    with pytest.raises(InvalidArgumentError):
        snapstore.open(tmp_path / "a", chunk_size=2 * fmt.MAX_CHUNK_BYTES)
    with pytest.raises(InvalidArgumentError):
        snapstore.open(tmp_path / "b", chunking="cdc",
                       cdc_sizes=(1 << 20, 4 << 20, 2 * fmt.MAX_CHUNK_BYTES))
    # The largest chunk allowed round-trips through the decoder (compressed: zeros).
    with snapstore.open(tmp_path / "c", chunk_size=fmt.MAX_CHUNK_BYTES,
                        durability="none") as s:
        data = bytes(fmt.MAX_CHUNK_BYTES)
        info = s.checkpoint({"a": data})
        assert s.restore(info.id)["a"] == data
        assert s.verify(deep=True)["ok"]


# ---- the one frame check both decoders use (engine/zstdframe.py) ----------------------------
def test_decompress_exact_gives_the_size_or_says_what_is_wrong():
    from snapstore.engine.zstdframe import decompress_exact
    data = b"snapstore " * 1000
    frame = zstandard.ZstdCompressor().compress(data)
    assert decompress_exact(frame, len(data)) == data
    assert decompress_exact(zstandard.ZstdCompressor().compress(b""), 0) == b""
    cases = [(b"not a zstd frame at all", len(data), "is not a zstd frame"),
             (frame, len(data) - 1, f"declares {len(data)} bytes, not {len(data) - 1}"),
             (zstandard.ZstdCompressor(write_content_size=False).compress(data), len(data),
              "declares no content size"),
             (frame[:len(frame) // 2], len(data), "does not decompress"),
             (BOMBS["declares_1TiB"](), CHUNK, "declares 1099511627776 bytes")]
    for bad, size, says in cases:
        with pytest.raises(ValueError, match=says):
            decompress_exact(bad, size)
