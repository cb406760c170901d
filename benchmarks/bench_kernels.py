"""Throughput of snapstore's C kernels against memcpy and a plain read of the same buffer.

Usage:  python3 benchmarks/bench_kernels.py [SIZE]      (SIZE like 1GiB, 256MiB, 64M; default 1GiB)
Env:    SNAPSTORE_BENCH_SIZE (same as SIZE), SNAPSTORE_BENCH_REPS (best of N, default 3).

Every kernel releases the GIL (cffi API mode), so the "2 threads" row splits the buffer in
two halves hashed concurrently. Needs about 3.1 x SIZE of memory (buffer, shadow, memcpy target).
"""
from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np
import xxhash

from snapstore import _native as nat
from snapstore._ffi import ffi, lib
from snapstore.formatting import parse_size

PAGE = 4096
DIRTY_FRACTION = 0.01


def best_of(reps: int, fn, setup=None) -> float:
    """Best wall time of reps calls of fn (setup runs untimed before each)."""
    best = float("inf")
    for r in range(reps):
        if setup is not None:
            setup(r)
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def random_buffer(n: int, seed: int = 1) -> np.ndarray:
    buf = np.empty(n, np.uint8)
    rng = np.random.default_rng(seed)
    step = 64 << 20
    for i in range(0, n, step):
        k = min(step, n - i)
        buf[i:i + k] = np.frombuffer(rng.bytes(k), np.uint8)
    return buf


def main() -> None:
    size = parse_size(sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SNAPSTORE_BENCH_SIZE", "1GiB"))
    size -= size % PAGE
    reps = int(os.environ.get("SNAPSTORE_BENCH_REPS", "3"))
    pages = size // PAGE
    print(f"snapstore kernels: buffer {size / 2**30:.3f} GiB, page {PAGE} B, best of {reps}; "
          f"the GIL is released in every kernel")

    buf = random_buffer(size)
    shadow = buf.copy()
    dst = np.empty_like(buf)
    rng = np.random.default_rng(7)
    n_dirty = max(1, int(pages * DIRTY_FRACTION))
    dirty = np.sort(rng.choice(pages, n_dirty, replace=False))
    dirty_offsets = dirty * PAGE

    def dirty_pages(r: int) -> None:  # a different byte value every rep: always really dirty
        buf[dirty_offsets + 17] ^= np.uint8(1 + r % 255)

    rows = []

    def row(name: str, nbytes: int, secs: float, note: str = "") -> None:
        rows.append((name, nbytes, secs, note))

    # ---- baselines, same buffer, same run ------------------------------------------------
    t_memcpy = best_of(reps, lambda: np.copyto(dst, buf))
    row("memcpy (numpy copyto)", size, t_memcpy, "baseline")
    words = buf.view(np.uint64)
    t_read = best_of(reps, lambda: np.bitwise_xor.reduce(words))
    row("plain read (numpy xor-reduce u64)", size, t_read, "baseline")
    row("xxh3_64 whole buffer (xxhash pkg)", size, best_of(reps, lambda: xxhash.xxh3_64_intdigest(buf)),
        "reference hash speed")

    # ---- kernels ---------------------------------------------------------------------------
    row("fingerprint (snap_fp_pages)", size, best_of(reps, lambda: nat.page_fingerprints(buf, PAGE)))

    fps = nat.page_fingerprints(buf, PAGE)
    found = []
    t = best_of(reps, lambda: found.append(nat.fingerprint_diff(buf, fps, PAGE)), dirty_pages)
    assert sum(n for _, n in found[-1]) == n_dirty, "fp diff missed pages"
    row("fp-diff, 1% dirty (snap_fp_diff)", size, t, f"{len(found[-1])} runs")

    half = (pages // 2) * PAGE
    fps_a = nat.page_fingerprints(buf[:half], PAGE)
    fps_b = nat.page_fingerprints(buf[half:], PAGE)

    def two_threads() -> None:
        ts = [threading.Thread(target=nat.fingerprint_diff, args=(buf[:half], fps_a, PAGE)),
              threading.Thread(target=nat.fingerprint_diff, args=(buf[half:], fps_b, PAGE))]
        for th in ts:
            th.start()
        for th in ts:
            th.join()
    row("fp-diff, 1% dirty, 2 threads", size, best_of(reps, two_threads, dirty_pages),
        "GIL released")

    np.copyto(shadow, buf)
    found.clear()
    t = best_of(reps, lambda: found.append(nat.shadow_diff(buf, shadow, PAGE)), dirty_pages)
    assert sum(n for _, n in found[-1]) == n_dirty, "shadow diff missed pages"
    row("shadow diff, 1% dirty (snap_shadow_diff)", size, t, "reads 2x bytes")

    row("FastCDC 16K/64K/256K (snap_cdc_feed)", size,
        best_of(reps, lambda: nat.chunk_boundaries(buf)))

    # gather: 1% scattered pages. The kernel alone (ranges prebuilt) against memcpy of the same
    # number of contiguous bytes, both warm (best of many: the bytes sit in cache) and cold
    # (128 MiB of other memory read before each call); then the wrapper, which also builds
    # the ranges array from a Python list.
    ranges = [(int(o), PAGE) for o in dirty_offsets]
    flat = ffi.new("uint64_t[]", [v for r in ranges for v in r])
    nbytes = n_dirty * PAGE
    out = np.empty(nbytes, np.uint8)
    src_p = ffi.from_buffer("uint8_t[]", buf)
    out_p = ffi.from_buffer("uint8_t[]", out, require_writable=True)
    n_out = ffi.new("size_t *")
    contiguous = buf[size // 3:size // 3 + nbytes]
    evict_words = shadow.view(np.uint64)[:min(size, 128 << 20) // 8]

    def evict(_r: int) -> None:
        np.bitwise_xor.reduce(evict_words)

    def kernel() -> None:
        lib.snap_gather(src_p, size, flat, n_dirty, out_p, nbytes, n_out)

    def plain() -> None:
        np.copyto(out, contiguous)

    for label, setup, n in (("warm", None, reps * 5), ("cold", evict, reps * 2)):
        t_g = best_of(n, kernel, setup)
        t_m = best_of(n, plain, setup)
        assert n_out[0] == nbytes
        row(f"gather 1% pages, kernel, {label}", nbytes, t_g, f"{t_g / t_m:.2f}x the memcpy below")
        row(f"memcpy of the same bytes, contiguous, {label}", nbytes, t_m, "gather baseline")
    row("gather 1% pages, wrapper (list ranges)", nbytes,
        best_of(reps * 5, lambda: nat.gather(buf, ranges, out)), "warm")

    gbps_memcpy = size / t_memcpy / 1e9
    gbps_read = size / t_read / 1e9
    print()
    print(f"{'kernel':44} {'MiB':>8} {'ms':>9} {'GB/s':>7} {'/memcpy':>8} {'/read':>6}  note")
    print("-" * 100)
    for name, nbytes, secs, note in rows:
        gbps = nbytes / secs / 1e9
        print(f"{name:44} {nbytes / 2**20:8.1f} {secs * 1e3:9.2f} {gbps:7.2f} "
              f"{gbps / gbps_memcpy:8.2f} {gbps / gbps_read:6.2f}  {note}")
    print()
    print("GB/s = bytes of the buffer (or of the gathered pages) / best wall time; memcpy counts "
          "the bytes copied once.")


if __name__ == "__main__":
    main()
