"""Codecs for dense float state: how much each saves and how fast it runs, on the same bytes,
in one run, one table (docs/floatcodec.md holds a measured table and the recommendation).

Usage:  python3 benchmarks/bench_floatcodec.py [--mib 64] [--dtypes float32,bfloat16,float16]
                                               [--repeat 1] [--dir DIR] [--quick]
Needs:  numpy, torch (bfloat16), zstandard; the peers zipnn and blosc2 if installed (pip
        install zipnn blosc2: bench only, not project dependencies; rows say when missing).

Data: weights N(0, 0.02) drawn in float32 ("version 0"); the next versions multiply every
element by (1 + r N(0, 1)), r = 0.1% and 1% (Adam-like: every element changes a little);
bfloat16 and float16 are casts of those float32 master weights. "random" is uniform random
bytes (incompressible) to check the probe's skip. Each codec encodes the new version (against
the previous one when it is a delta codec; the peers have no delta and compress the new version
alone) and decodes it; every round trip is checked byte-exact.

Codecs (zstd from python-zstandard; level "1f" is zstd level 1 tuned for float planes, see
PROFILES below):
  zstd-L              the buffer as one zstd frame at level L (x2t: zstd's 2 worker threads)
  [rot+]planes+zstd-L snap_split_planes (rot+: with rotate=True, SNAP_PLANES_ROTATE: the sign
                      bit moved to bit 0), then one frame
  xor|sub+planes+zstd-L   snap_delta_split_planes (DELTA_XOR or DELTA_SUB) against the previous
                      version, then one frame
  [sub+|rot+]auto-L   the probe first (below); each plane that the probe finds compressible is
                      one zstd frame, the others are stored raw; nothing compressible: the
                      buffer is stored raw, untransformed. x2t: planes (and blocks) coded on 2
                      threads, both ways. @B: the buffer cut into blocks of B bytes, each coded
                      alone (the planes decision made once per buffer). <=1.2x: the planes
                      chosen by a cost model (within_budget) so that the estimated checkpoint
                      time stays within 1.2x a raw write+fsync at the measured disk speed,
                      saving the most bytes
  blosc2 ...          blosc2.compress2 with typesize = item size (shuffle/bitshuffle filter,
                      zstd or lz4 codec, clevel c), nthreads 1 unless x2t
  zipnn               zipnn.ZipNN(input_format="torch"); given a private copy each call
                      (zipnn 0.5.4 rewrites its input buffer in place); threads 1 unless x2t
Probe: 16 pieces of 4 KiB spread over the buffer (64 KiB; the same offsets of the previous
version for a delta), transformed like the codec, each plane compressed at the codec's level
(twice, timed: the speed estimate of the <=1.2x rows): "probe %" is the saving it predicts for
the whole buffer.

Columns: saved % = 1 - stored / raw bytes; comp and dec GB/s = raw bytes / wall time (the
transform, probe, entropy coder; decode: entropy decoder and inverse transform); ckpt/raw =
(compress time + stored bytes / disk) / (raw bytes / disk), with disk the measured write+fsync
bandwidth of --dir: the checkpoint time against a raw write+fsync, compression and writing one
after the other. Timing is wall clock, best of --repeat, on a shared machine: compare rows of
one run, not runs.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zstandard

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from snapstore import _native as nat  # noqa: E402
from snapstore.formatting import text_table  # noqa: E402

MiB = 1 << 20
SKIP_BELOW = 1 / 32          # a part saving less than this is stored raw (the engine's rule)
PROBE_PIECES, PROBE_PIECE = 16, 4096
_POOL = ThreadPoolExecutor(2)
_LOCAL = threading.local()    # python-zstandard's (de)compressors are not thread safe: one per thread
# zstd settings by name. "1f": level 1 with a 64-entry hash table (hash_log 6), one probe per
# position (search_log 1) and matches of 7+ bytes only: on noise-like planes (exponent and
# high mantissa bytes) zstd's match finder costs most of the time and its short matches save
# less than Huffman-coded literals would; this keeps long matches and runs (zero planes) and
# codes the rest as literals: 2-3x faster both ways and 1-3 points smaller than level 1 there.
# The frames are ordinary zstd frames.
PROFILES = {
    "1": zstandard.ZstdCompressionParameters.from_level(1),
    "3": zstandard.ZstdCompressionParameters.from_level(3),
    "1f": zstandard.ZstdCompressionParameters.from_level(1, min_match=7, hash_log=6,
                                                         search_log=1, target_length=0),
}


def zc(profile: str, threads: int = 0) -> zstandard.ZstdCompressor:
    """This thread's compressor of a profile (zstd worker threads: threads)."""
    cache = _LOCAL.__dict__.setdefault("zc", {})
    key = (profile, threads)
    if key not in cache:
        if threads:
            p = PROFILES[profile]
            params = zstandard.ZstdCompressionParameters(
                window_log=p.window_log, chain_log=p.chain_log, hash_log=p.hash_log,
                search_log=p.search_log, min_match=p.min_match, target_length=p.target_length,
                strategy=p.strategy, threads=threads)
        else:
            params = PROFILES[profile]
        cache[key] = zstandard.ZstdCompressor(compression_params=params)
    return cache[key]


def unzstd(frame) -> bytes:
    """frame decompressed by this thread's decompressor."""
    d = _LOCAL.__dict__.get("dec")
    if d is None:
        d = _LOCAL.dec = zstandard.ZstdDecompressor()
    return d.decompress(frame)


# ---- data -----------------------------------------------------------------------------------
def versions(dtype: str, nbytes: int, rel: float, seed: int = 1):
    """(old, new) raw bytes of weights N(0, 0.02) in dtype and the same after an update of
    relative size rel (new is None for rel 0)."""
    import torch
    k = {"float32": 4, "bfloat16": 2, "float16": 2}[dtype]
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(nbytes // k, dtype=np.float32) * np.float32(0.02)
    cast = (lambda a: torch.from_numpy(a).to(getattr(torch, dtype)).view(torch.uint8).numpy().tobytes())
    old = cast(w)
    if not rel:
        return old, None
    w2 = w * (1 + np.float32(rel) * np.random.default_rng(seed + 1).standard_normal(w.size, dtype=np.float32))
    return old, cast(w2)


# ---- the probe ------------------------------------------------------------------------------
def sample(buf, k: int) -> bytes:
    """PROBE_PIECES pieces of PROBE_PIECE bytes spread evenly over buf, item aligned."""
    n = len(buf)
    if n <= PROBE_PIECES * PROBE_PIECE:
        return bytes(buf[:n // k * k])
    step = (n - PROBE_PIECE) // (PROBE_PIECES - 1)
    mv = memoryview(buf)
    return b"".join(mv[(i * step) // k * k:(i * step) // k * k + PROBE_PIECE]
                    for i in range(PROBE_PIECES))


def probe(cur, ref, k: int, mode, profile: str, rotate: bool = False):
    """(compress this plane? per plane, predicted stored bytes of the buffer, [(ratio, seconds
    per byte) per plane]) from a sample: each sample plane compressed twice, the faster timed
    (a single timing of some 20 us was often 3x off: a cold compressor, a preemption)."""
    s = sample(cur, k)
    planes = (nat.delta_split_planes(s, sample(ref, k), k, mode) if mode
              else nat.split_planes(s, k, rotate=rotate))
    m = len(s) // k
    n = len(cur) // k
    c = zc(profile)
    decide, predicted, info = [], len(cur) - n * k, []
    for j in range(k):
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            size = len(c.compress(planes[j * m:(j + 1) * m]))
            best = min(best, time.perf_counter() - t)
        ratio = size / max(m, 1)
        info.append((ratio, best / max(m, 1)))
        ok = ratio < 1 - SKIP_BELOW
        decide.append(ok)
        predicted += int(n * ratio) if ok else n
    return decide, predicted, info


TRANSFORM_BPS = 4e9     # the split kernels' speed, low end (bytes/s, one thread)


def within_budget(info, n: int, total: int, disk: float, threads: int, budget: float):
    """The planes to compress so that the estimated checkpoint time (transform and compress on
    `threads` threads, then write+fsync at `disk` bytes/s) stays within budget x the raw
    write+fsync time, saving the most bytes: planes whose compression pays for itself (the
    write time saved exceeds the compress time) first, then the others by net cost while the
    budget allows. Returns (compress per plane, predicted stored bytes)."""
    raw_t = total / disk
    net = {j: n * spb / threads - n * (1 - ratio) / disk            # seconds added by plane j
           for j, (ratio, spb) in enumerate(info) if ratio < 1 - SKIP_BELOW}
    chosen, t = [False] * len(info), raw_t + total / TRANSFORM_BPS / threads
    for j in sorted(net, key=net.get):
        if net[j] <= 0 or t + net[j] <= budget * raw_t:
            chosen[j], t = True, t + net[j]
    if t > budget * raw_t:                      # the transform alone does not fit: store raw
        chosen = [False] * len(info)
    stored = total - n * len(info) + sum(int(n * r) if c else n for c, (r, _) in zip(chosen, info))
    return chosen, stored


def probe_plain(cur, k: int, profile: str) -> int:
    s = sample(cur, k)
    return int(len(cur) * len(zc(profile).compress(s)) / max(len(s), 1))


# ---- codecs: encode(cur, ref) -> (blob, stored bytes, predicted or None); decode(blob, ref) ---
PRE = {None: "", nat.DELTA_XOR: "xor+", nat.DELTA_SUB: "sub+", "rot": "rot+"}


class Plain:
    """The buffer as one zstd frame."""

    def __init__(self, profile, threads=0):
        self.profile, self.threads = profile, threads
        self.name = f"zstd-{profile}" + (" x2t" if threads else "")

    def encode(self, cur, ref, k):
        f = zc(self.profile, self.threads).compress(cur)
        return f, len(f), probe_plain(cur, k, self.profile)

    def decode(self, blob, ref, k):
        return unzstd(blob)


class Planes:
    """One frame over the (delta-)planes, no probe."""

    def __init__(self, profile, mode=None, rotate=False):
        self.profile, self.mode, self.rotate = profile, mode, rotate
        self.name = f"{PRE['rot' if rotate else mode]}planes+zstd-{profile}"

    def encode(self, cur, ref, k):
        p = (nat.delta_split_planes(cur, ref, k, self.mode) if self.mode
             else nat.split_planes(cur, k, rotate=self.rotate))
        f = zc(self.profile).compress(p)
        return f, len(f), None

    def decode(self, blob, ref, k):
        p = unzstd(blob)
        if self.mode:
            return nat.delta_join_planes(p, ref, k, self.mode)
        return nat.join_planes(p, k, rotate=self.rotate)


class Auto:
    """Probe, then per plane (per block) a zstd frame or raw; all raw -> the buffer as is.
    threads 2: blocks (or, unblocked, planes) on two threads, both ways."""
    HEADER = 8        # per part: a length and a flag, as an engine would store them

    def __init__(self, profile, mode=None, block=0, threads=1, rotate=False, budget=None,
                 disk=None):
        self.profile, self.mode, self.block, self.threads = profile, mode, block, threads
        self.rotate, self.budget, self.disk = rotate, budget, disk
        self.name = (f"{PRE['rot' if rotate else mode]}auto-{profile}"
                     + (f" <={budget}x" if budget else "")
                     + (f" @{_size(block)}" if block else "")
                     + (" x2t" if threads > 1 else ""))

    def _map(self, fn, items, level):
        """fn over items, on the pool at the level that runs in parallel (blocks if blocked,
        else planes); a lazy iterator in order."""
        if self.threads > 1 and level == ("blocks" if self.block else "planes"):
            return _POOL.map(fn, items)
        return map(fn, items)

    def encode_iter(self, cur, ref, k):
        """(decisions, predicted, iterator of (off, end, parts)) or (None, predicted, None)
        when the buffer is stored raw."""
        decide, predicted, info = probe(cur, ref if self.mode else None, k, self.mode,
                                        self.profile, self.rotate)
        if self.budget:
            decide, predicted = within_budget(info, len(cur) // k, len(cur), self.disk,
                                              self.threads, self.budget)
        if not any(decide):
            return None, predicted, None
        total = len(cur)
        B = max((self.block or total) // k * k, k)
        cv, rv = memoryview(cur), (memoryview(ref) if self.mode else None)
        def block(off):
            end = min(off + B, total)
            if self.mode:
                p = nat.delta_split_planes(cv[off:end], rv[off:end], k, self.mode)
            else:
                p = nat.split_planes(cv[off:end], k, rotate=self.rotate)
            n = (end - off) // k

            def part(j):
                piece = p[j * n:(j + 1) * n]
                return zc(self.profile).compress(piece) if decide[j] else piece
            return off, end, list(self._map(part, range(k), "planes")) + [p[k * n:]]

        return decide, predicted, self._map(block, range(0, total, B), "blocks")

    def encode(self, cur, ref, k):
        decide, predicted, blocks = self.encode_iter(cur, ref, k)
        if decide is None:
            return ("raw", cur), len(cur), predicted
        blocks = list(blocks)
        stored = sum(len(x) + self.HEADER for _, _, parts in blocks for x in parts)
        return ("planes", decide, blocks), stored, predicted

    def decode(self, blob, ref, k):
        if blob[0] == "raw":
            return blob[1]
        _, decide, blocks = blob
        out = bytearray(blocks[-1][1])
        ov, rv = memoryview(out), (memoryview(ref) if self.mode else None)

        def block(item):
            off, end, parts = item
            n = (end - off) // k
            p = bytearray(end - off)
            pv = memoryview(p)

            def part(j):
                pv[j * n:(j + 1) * n] = unzstd(parts[j]) if decide[j] else parts[j]
            list(self._map(part, range(k), "planes"))
            p[k * n:] = parts[k]
            if self.mode:
                nat.delta_join_planes(p, rv[off:end], k, self.mode, out=ov[off:end])
            else:
                nat.join_planes(p, k, out=ov[off:end], rotate=self.rotate)

        list(self._map(block, blocks, "blocks"))
        return out


class Blosc2:
    def __init__(self, filt, codec, clevel, threads=1):
        self.filt, self.codec, self.clevel, self.threads = filt, codec, clevel, threads
        self.name = f"blosc2 {filt}+{codec} c{clevel}" + (" x2t" if threads > 1 else "")

    def encode(self, cur, ref, k):
        import blosc2
        f = blosc2.compress2(cur, typesize=k, clevel=self.clevel, nthreads=self.threads,
                             codec=getattr(blosc2.Codec, self.codec.upper()),
                             filters=[getattr(blosc2.Filter, self.filt.upper())])
        return f, len(f), None

    def decode(self, blob, ref, k):
        import blosc2
        return blosc2.decompress2(blob, nthreads=self.threads)


class ZipNN:
    def __init__(self, dtype, threads=1):
        self.dtype, self.threads = dtype, threads
        self.name = "zipnn" + (" x2t" if threads > 1 else "")

    def prepare(self, cur):
        import torch          # zipnn rewrites its input in place: a private copy per call
        return torch.frombuffer(bytearray(cur), dtype=getattr(torch, self.dtype))

    def encode(self, tensor, ref, k):
        import zipnn
        f = zipnn.ZipNN(input_format="torch", threads=self.threads).compress(tensor)
        return f, len(f), None

    def decode(self, blob, ref, k):
        import torch
        import zipnn
        t = zipnn.ZipNN(input_format="torch", threads=self.threads).decompress(blob)
        return t.view(torch.uint8).numpy()


def _size(n: int) -> str:
    return f"{n >> 20}M" if n >= MiB else f"{n >> 10}K"


# ---- measuring ---------------------------------------------------------------------------------
def write_file(directory: str, chunks) -> float:
    """Seconds to write the chunks (an iterable of buffers, produced as they are written) into
    a new file in directory and fsync it."""
    fd, path = tempfile.mkstemp(dir=directory, prefix="bench_floatcodec.")
    try:
        t = time.perf_counter()
        with os.fdopen(fd, "wb", buffering=0) as f:
            for c in chunks:
                f.write(c)
            os.fsync(f.fileno())
        return time.perf_counter() - t
    finally:
        os.unlink(path)


def disk_bandwidth(directory: str, data: bytes, reps: int = 3) -> float:
    """Median bytes/s of write + fsync of data into a new file in directory."""
    times = sorted(write_file(directory, [data]) for _ in range(reps))
    return len(data) / times[len(times) // 2]


def written(codec: "Auto", cur, ref, k, directory: str, repeat: int):
    """(stored, compress+write+fsync s, raw write+fsync s) of an Auto codec whose blocks are
    written to a file as they come out of the pool (compression and I/O overlapped), against a
    raw write+fsync of the same bytes measured right before."""
    t_raw = t_codec = float("inf")
    for _ in range(repeat):
        t_raw = min(t_raw, write_file(directory, [cur]))
        stored = [0]

        def chunks():
            decide, _, blocks = codec.encode_iter(cur, ref, k)
            if decide is None:
                stored[0] = len(cur)
                yield cur
                return
            for _, _, parts in blocks:
                for x in parts:
                    stored[0] += len(x) + codec.HEADER
                    yield x
        t_codec = min(t_codec, write_file(directory, chunks()))
    return stored[0], t_codec, t_raw


def measure(codec, cur, ref, k, repeat):
    """(stored, predicted, comp s, dec s, ok) of one codec on one buffer."""
    tc = td = float("inf")
    for _ in range(repeat):
        arg = codec.prepare(cur) if hasattr(codec, "prepare") else cur
        t = time.perf_counter()
        blob, stored, predicted = codec.encode(arg, ref, k)
        tc = min(tc, time.perf_counter() - t)
        t = time.perf_counter()
        back = codec.decode(blob, ref, k)
        td = min(td, time.perf_counter() - t)
    ok = memoryview(back).cast("B") == memoryview(cur).cast("B")
    return stored, predicted, tc, td, ok


def kernel_speeds(nbytes: int) -> str:
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, nbytes, dtype=np.uint8)
    b = rng.integers(0, 256, nbytes, dtype=np.uint8)
    out = np.empty_like(a)
    back = np.empty_like(a)

    def best(fn):
        t = float("inf")
        for _ in range(3):
            s = time.perf_counter()
            fn()
            t = min(t, time.perf_counter() - s)
        return nbytes / t / 1e9

    parts = [f"memcpy {best(lambda: np.copyto(out, a)):.1f}"]
    for k in (2, 4, 8):
        parts.append(f"k={k}: split {best(lambda: nat.split_planes(a, k, out=out)):.1f}"
                     f" join {best(lambda: nat.join_planes(out, k, out=back)):.1f}"
                     f" sub-split {best(lambda: nat.delta_split_planes(a, b, k, out=out)):.1f}"
                     f" sub-join {best(lambda: nat.delta_join_planes(out, b, k, out=back)):.1f}"
                     f" xor-split {best(lambda: nat.delta_split_planes(a, b, k, nat.DELTA_XOR, out=out)):.1f}")
    return "kernels, GB/s of the buffer (" + _size(nbytes) + "): " + "; ".join(parts)


def have(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


BLOCKS = (64 << 10, 256 << 10, 1 << 20, 8 << 20)
PIPED_BLOCK = 1 << 20


def codecs_for(dtype: str, scenario: str, quick: bool, disk: float):
    """(codecs measured in memory, codecs also written to disk) for one case."""
    X, S = nat.DELTA_XOR, nat.DELTA_SUB
    peers = []
    if have("blosc2"):
        peers.append(Blosc2("shuffle", "zstd", 1))
        if scenario == "full" and not quick:
            peers += [Blosc2("shuffle", "zstd", 5), Blosc2("bitshuffle", "zstd", 1),
                      Blosc2("shuffle", "lz4", 5), Blosc2("shuffle", "zstd", 1, threads=2)]
    if have("zipnn") and dtype != "random":
        peers.append(ZipNN(dtype))
        if scenario == "full" and not quick:
            peers.append(ZipNN(dtype, threads=2))
    if scenario == "full":
        ours = [Plain("1"), Plain("3"), Plain("1", threads=2), Planes("1"), Planes("3"),
                Planes("1", rotate=True), Auto("1"), Auto("1f"), Auto("1f", rotate=True),
                Auto("1f", rotate=True, threads=2)]
        blocks = [Auto("1f", block=b, rotate=True) for b in BLOCKS]
        budget = [Auto("1f", block=PIPED_BLOCK, threads=2, rotate=True, budget=1.2, disk=disk)]
        files = [Auto("1f", block=PIPED_BLOCK, threads=2, rotate=True)] + budget
    else:
        ours = [Plain("1"), Planes("1"), Planes("1", X), Planes("1", S), Planes("3", S),
                Auto("1f", X), Auto("1", S), Auto("1f", S), Auto("1f", S, threads=2)]
        blocks = [Auto("1f", S, block=b) for b in BLOCKS] if scenario == "1%" else []
        budget = [Auto("1f", S, block=PIPED_BLOCK, threads=2, budget=1.2, disk=disk)]
        files = [Auto("1f", S, block=PIPED_BLOCK, threads=2)] + budget
    if quick:
        ours, blocks = [c for c in ours if isinstance(c, Auto) or c.name == "zstd-1"], []
    if dtype == "random":
        blocks = []
    return ours + blocks + budget + peers, files


def _gbps(nbytes: int, seconds: float) -> str:
    v = nbytes / seconds / 1e9
    return f"{v:.2f}" if v < 100 else ">100"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="buffer size in MiB (default 64)")
    ap.add_argument("--dtypes", default="float32,bfloat16,float16")
    ap.add_argument("--repeat", type=int, default=1, help="best of N timings (default 1)")
    ap.add_argument("--dir", default=tempfile.gettempdir(),
                    help="where to measure write+fsync (default: the temp dir)")
    ap.add_argument("--quick", action="store_true", help="fewer codecs, no block sweep")
    args = ap.parse_args()
    nbytes = args.mib * MiB

    print(kernel_speeds(nbytes))
    disk = disk_bandwidth(args.dir, os.urandom(nbytes))
    print(f"raw write+fsync of {args.mib} MiB in {args.dir}: {disk / 1e9:.2f} GB/s; "
          f"zstandard {zstandard.__version__}"
          + "".join(f", {m} {__import__(m).__version__}" for m in ("blosc2", "zipnn", "torch")
                    if have(m) and hasattr(__import__(m), "__version__")))

    header = ["dtype", "version", "codec", "saved %", "probe %", "comp GB/s", "dec GB/s",
              "ckpt/raw"]
    rows, errors = [], []
    cases = [(d, s) for d in args.dtypes.split(",") for s in ("full", "0.1%", "1%")]
    cases.append(("random", "full"))
    for dtype, scenario in cases:
        if dtype == "random":
            k, cur, ref = 4, np.random.default_rng(5).bytes(nbytes), None
        else:
            rel = {"full": 0, "0.1%": 1e-3, "1%": 1e-2}[scenario]
            old, new = versions(dtype, nbytes, rel)
            k = 4 if dtype == "float32" else 2
            cur, ref = (old, None) if new is None else (new, old)
        version = "v0" if scenario == "full" else f"v1 ({scenario})"
        in_memory, on_disk = codecs_for(dtype, scenario, args.quick, disk)
        for codec in in_memory:
            stored, predicted, tc, td, ok = measure(codec, cur, ref, k, args.repeat)
            saved = 100 * (1 - stored / len(cur))
            ptxt = "-" if predicted is None else f"{100 * (1 - predicted / len(cur)):.1f}"
            if predicted is not None:
                errors.append(abs(100 * (predicted - stored) / len(cur)))
            ckpt = (tc + stored / disk) / (len(cur) / disk)
            rows.append([dtype, version, codec.name + ("" if ok else "  MISMATCH"),
                         f"{saved:.1f}", ptxt, _gbps(len(cur), tc), _gbps(len(cur), td),
                         f"{ckpt:.2f}"])
            print("  " + "  ".join(rows[-1]), file=sys.stderr, flush=True)
        for codec in on_disk:
            stored, t_codec, t_raw = written(codec, cur, ref, k, args.dir, args.repeat)
            rows.append([dtype, version, codec.name + " -> file",
                         f"{100 * (1 - stored / len(cur)):.1f}", "", _gbps(len(cur), t_codec),
                         "", f"{t_codec / t_raw:.2f}*"])
            print("  " + "  ".join(rows[-1]), file=sys.stderr, flush=True)
    print(text_table(header, rows, right=range(3, 8)))
    print("ckpt/raw: (compress s + stored bytes / disk) / (raw bytes / disk), one after the "
          "other;\n  * measured: blocks compressed on 2 threads while the main thread writes "
          "them, then fsync, against a raw write+fsync of the same bytes just before")
    if errors:
        print(f"probe ({PROBE_PIECES} x {PROBE_PIECE // 1024} KiB sample): predicted minus "
              f"measured saving over {len(errors)} rows: mean |error| {np.mean(errors):.2f} "
              f"points, max {max(errors):.2f}")


if __name__ == "__main__":
    main()
