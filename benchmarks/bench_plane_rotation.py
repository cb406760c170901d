"""How far to rotate a float's bits before splitting it into byte planes (docs/floatcodec.md,
"The rotation"): the saving of each rotation on the same weights, in one run.

Usage:  python3 benchmarks/bench_plane_rotation.py [--mib 16] [--rotations 0,1,2,3] [--limits]
Needs:  numpy, zstandard.

Weights N(0, 0.02) drawn in float32; bfloat16 is their top half, float16 their cast. Each item,
a little-endian word, is rotated left by r bits (r = 1 is format 4's CODEC_PLANES: the sign to
bit 0, so the top plane of a float32 or bfloat16 is its 8-bit exponent), split into byte
planes, and each plane cut into the planes of 64 KiB chunks, as the engine stores them; each
is one zstd frame with the engine's "1f" profile, or raw when that is not smaller. Printed per
dtype and rotation: each plane's order-0 entropy (bits per byte) and the saving of the planes'
stored bytes (record headers and the commit record not counted: they are the same for every
rotation).

--limits also prints, for the 16-bit dtypes, what no byte-plane coder can beat and what a
Huffman coder (zstd's literals, zipnn's) can reach: the saving at the order-0 entropy of the
whole 16-bit items (the weights are independent draws: no context helps), and at the Huffman
code lengths of each plane (integer lengths: the planes' entropy plus the code's redundancy),
at rotation 1 (docs/floatcodec.md, "float16: at the coder's limit").
"""
from __future__ import annotations

import argparse
import heapq

import numpy as np
import zstandard

CHUNK = 64 << 10


def entropy(plane: np.ndarray) -> float:
    p = np.bincount(plane, minlength=256) / len(plane)
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def stored_bits(plane: np.ndarray, per_chunk: int, cctx) -> float:
    """Bits per item of the plane coded per chunk: a zstd frame, or raw if not smaller."""
    total = 0
    for at in range(0, len(plane), per_chunk):
        piece = plane[at:at + per_chunk].tobytes()
        total += min(len(piece), len(cctx.compress(piece)))
    return total * 8 / len(plane)


def huffman_bits(plane: np.ndarray) -> float:
    """Bits per byte of the plane under its own Huffman code (one code for the whole plane)."""
    counts = np.bincount(plane, minlength=256)
    heap = [(int(c), i, [i]) for i, c in enumerate(counts) if c]
    if len(heap) == 1:
        return 1.0
    lengths = np.zeros(256)
    heapq.heapify(heap)
    tie = 256
    while len(heap) > 1:
        a, b = heapq.heappop(heap), heapq.heappop(heap)
        for symbol in a[2] + b[2]:
            lengths[symbol] += 1
        heapq.heappush(heap, (a[0] + b[0], tie, a[2] + b[2]))
        tie += 1
    return float((lengths * counts).sum() / counts.sum())


def limits(words: dict, rotation: int = 1) -> None:
    print(f"\nlimits, rotation {rotation} (saving of the 16-bit dtypes' bytes):")
    for dtype, (u, bits) in words.items():
        if bits != 16:
            continue
        z = ((u << rotation) | (u >> (bits - rotation))) & 0xFFFF
        p = np.bincount(z.astype(np.int64), minlength=1 << 16) / len(z)
        p = p[p > 0]
        joint = float(-(p * np.log2(p)).sum())
        planes = [((z >> (8 * j)) & 0xFF).astype(np.uint8) for j in range(2)]
        huff = sum(min(8.0, huffman_bits(q)) for q in planes)
        print(f"  {dtype:9} entropy of the items {1 - joint / 16:6.2%}   "
              f"Huffman per plane {1 - huff / 16:6.2%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--rotations", default="0,1,2,3")
    ap.add_argument("--limits", action="store_true")
    args = ap.parse_args()
    rotations = [int(r) for r in args.rotations.split(",")]
    cctx = zstandard.ZstdCompressor(compression_params=zstandard.ZstdCompressionParameters(
        compression_level=1, hash_log=6, search_log=1, min_match=7, target_length=0))
    w = np.random.default_rng(0).standard_normal((args.mib << 20) // 4, dtype=np.float32) * 0.02
    words = {"float32": (w.view(np.uint32).astype(np.uint64), 32),
             "bfloat16": ((w.view(np.uint32) >> 16).astype(np.uint64), 16),
             "float16": (w.astype(np.float16).view(np.uint16).astype(np.uint64), 16)}
    print(f"{'dtype':9} {'rotation':>8}  {'plane entropies (bits/byte, low plane first)':46} saved")
    for dtype, (u, bits) in words.items():
        mask, nbytes = (1 << bits) - 1, bits // 8
        for r in rotations:
            z = ((u << r) | (u >> (bits - r))) & mask if r else u
            planes = [((z >> (8 * j)) & 0xFF).astype(np.uint8) for j in range(nbytes)]
            coded = sum(stored_bits(p, CHUNK // nbytes, cctx) for p in planes)
            ents = " ".join(f"{entropy(p):5.3f}" for p in planes)
            print(f"{dtype:9} {r:8}  {ents:46} {1 - coded / bits:6.2%}")
    if args.limits:
        limits(words)


if __name__ == "__main__":
    main()
