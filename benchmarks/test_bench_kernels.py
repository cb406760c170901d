"""pytest-benchmark versions of bench_kernels.py on 32 MiB buffers (not in the default test run).

Run:  python3 -m pytest benchmarks/test_bench_kernels.py --benchmark-only
"""
import numpy as np
import pytest

from snapstore import _native as nat
from snapstore._ffi import ffi, lib

SIZE = 32 << 20
PAGE = 4096
PAGES = SIZE // PAGE


@pytest.fixture(scope="module")
def buf():
    return np.frombuffer(np.random.default_rng(1).bytes(SIZE), np.uint8).copy()


@pytest.fixture(scope="module")
def dirty():
    return np.sort(np.random.default_rng(7).choice(PAGES, PAGES // 100, replace=False))


def test_memcpy_baseline(benchmark, buf):
    dst = np.empty_like(buf)
    benchmark(np.copyto, dst, buf)


def test_read_baseline(benchmark, buf):
    benchmark(np.bitwise_xor.reduce, buf.view(np.uint64))


def test_fingerprint(benchmark, buf):
    fps = benchmark(nat.page_fingerprints, buf, PAGE)
    assert len(fps) == PAGES * nat.FP_BYTES


def test_fingerprint_diff_1pct(benchmark, buf, dirty):
    work = buf.copy()
    fps = nat.page_fingerprints(work, PAGE)
    rounds = iter(range(1, 1 << 30))

    def setup():
        work[dirty * PAGE] ^= np.uint8(1 + next(rounds) % 255)
        return (work, fps, PAGE), {}
    runs = benchmark.pedantic(nat.fingerprint_diff, setup=setup, rounds=20)
    assert sum(n for _, n in runs) == len(dirty)


def test_shadow_diff_1pct(benchmark, buf, dirty):
    work = buf.copy()
    shadow = buf.copy()
    rounds = iter(range(1, 1 << 30))

    def setup():
        work[dirty * PAGE + 5] ^= np.uint8(1 + next(rounds) % 255)
        return (work, shadow, PAGE), {}
    runs = benchmark.pedantic(nat.shadow_diff, setup=setup, rounds=20)
    assert sum(n for _, n in runs) == len(dirty)


def test_fastcdc(benchmark, buf):
    cuts = benchmark(nat.chunk_boundaries, buf)
    assert cuts[-1] == SIZE


def test_gather_kernel_1pct(benchmark, buf, dirty):
    n = len(dirty)
    flat = ffi.new("uint64_t[]", [v for p in dirty for v in (int(p) * PAGE, PAGE)])
    out = np.empty(n * PAGE, np.uint8)
    n_out = ffi.new("size_t *")
    src = ffi.from_buffer("uint8_t[]", buf)
    dst = ffi.from_buffer("uint8_t[]", out, require_writable=True)
    rc = benchmark(lib.snap_gather, src, SIZE, flat, n, dst, len(out), n_out)
    assert rc == 0 and n_out[0] == len(out)


def test_gather_memcpy_baseline_1pct(benchmark, buf, dirty):
    out = np.empty(len(dirty) * PAGE, np.uint8)
    benchmark(np.copyto, out, buf[SIZE // 3:SIZE // 3 + len(out)])


def test_gather_wrapper_1pct(benchmark, buf, dirty):
    ranges = [(int(p) * PAGE, PAGE) for p in dirty]
    out = bytearray(len(dirty) * PAGE)
    mv = benchmark(nat.gather, buf, ranges, out)
    assert len(mv) == len(out)
