"""Delta-plane chunk records (format 5, planned) against today's byte planes, in the C core.

Usage:  python3 benchmarks/bench_delta_records.py [--mib 64] [--repeat 3]

For float weights N(0, 0.02) and a next version with every value changed by a relative r N(0,1)
(float32 at r = 1% and 0.1%, float16 at 1%), in 64 KiB chunks: snap_write_chunks coding every
chunk as byte planes (the planes today's probe picks: the exponent plane) and as delta planes
against the previous version (the delta planes that pack: the high ones), then snap_read_chunks
decoding them (for deltas: over a copy of the previous version, the copy timed with it, as a
restore would write the base first). Saved % = 1 - record bytes / raw bytes; GB/s of raw bytes
per CPU second (process time, best of --repeat; one thread, the engine runs two). Every decode
is checked byte-exact.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from snapstore import _native as nat

CHUNK = 64 << 10
CASES = [  # dtype, item size, relative change, plane mask for planes, for deltas
    (np.float32, 4, 0.01, 0b1000, 0b1100),
    (np.float32, 4, 0.001, 0b1000, 0b1100),
    (np.float16, 2, 0.01, 0b10, 0b10),
]


def best_cpu(fn, repeat: int):
    times, result = [], None
    for _ in range(repeat):
        t = time.process_time()
        result = fn()
        times.append(time.process_time() - t)
    return min(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'case':24} {'planes saved':>12} {'code':>6} {'decode':>6}   "
          f"{'delta saved':>11} {'code':>6} {'decode':>6}  (GB/s per CPU s)")
    for dtype, k, rel, plane_mask, delta_mask in CASES:
        n = (args.mib << 20) // k
        master = rng.standard_normal(n) * 0.02
        old = master.astype(dtype).tobytes()
        new = (master * (1 + rel * rng.standard_normal(n))).astype(dtype).tobytes()
        count = len(new) // CHUNK
        cid = b"\x01" * 32                      # ids are written, not checked, by the coder
        cur = [memoryview(new)[i * CHUNK:(i + 1) * CHUNK] for i in range(count)]
        base = [memoryview(old)[i * CHUNK:(i + 1) * CHUNK] for i in range(count)]
        gb = count * CHUNK / 1e9
        row = []
        for delta in (False, True):
            chunks = ([(c, cid, b, cid, 1) for c, b in zip(cur, base)] if delta
                      else [(c, cid) for c in cur])
            t_code, (records, results) = best_cpu(
                lambda: nat.write_chunks(chunks, k, plane_mask,
                                         try_delta=delta_mask if delta else 0), args.repeat)
            records = bytes(records)
            reads = [(off, i * CHUNK, stored, CHUNK, cid) + ((cid,) if delta else ())
                     for i, (off, stored, _, _) in enumerate(results)]
            out = bytearray(count * CHUNK)

            def decode():
                if delta:
                    out[:] = old[:len(out)]     # the base, as a restore puts it first
                return nat.read_chunks(records, out, reads)
            t_decode, (done, _) = best_cpu(decode, args.repeat)
            assert done == count and out == new[:len(out)]
            row.append((1 - len(records) / (count * CHUNK), gb / t_code, gb / t_decode))
        (ps, pc, pd), (ds, dc, dd) = row
        name = f"{np.dtype(dtype).name} r={rel:g}"
        print(f"{name:24} {100 * ps:11.1f}% {pc:6.2f} {pd:6.2f}   {100 * ds:10.1f}% {dc:6.2f} "
              f"{dd:6.2f}")


if __name__ == "__main__":
    main()
