"""Maintenance figures of issue 4: compaction and deep verification, measured in one run.

Workload: a buffer of random bytes (default 256 MiB) checkpointed 40 times, 10% of its 4 KiB
pages overwritten at random places between checkpoints (durability "fsync", the store's default
max_chain, so fulls recur); then 30 of the 40 deleted (default: the 30 oldest, i.e.
retain(keep_last=10); --delete spread keeps every 4th instead); then compact() and
verify(deep=True).

Garbage is computed honestly from the file system: the segment files' bytes before compact()
minus the bytes of the chunk records live checkpoints still reference (header + payload), i.e.
everything compaction could give back. "Returned" is the drop of the segment files' total size
(and, separately, of the file system's used blocks). Copy speed is live bytes copied by
compact() per second of its run; verify speed is bytes of stored data per second.

Also shown, for context: bytes inside live chunks that no live checkpoint reads (chunk-granular
GC cannot free them), and a cold-cache run (--cold: fadvise DONTNEED on every segment first).

    python3 benchmarks/bench_maintenance.py [--size-mib 256] [--checkpoints 40] [--delete-count 30]
        [--dirty 0.10] [--segment-mib 256] [--dir /path/on/real/disk] [--delete oldest|spread]
        [--threshold 0.5] [--cold] [--profile] [--keep]
"""
from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import os
import pstats
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import snapstore  # noqa: E402
from snapstore.engine import extents as ext  # noqa: E402
from snapstore.engine import format as fmt  # noqa: E402

PAGE = 4096


def mutate(arr: np.ndarray, fraction: float, rng: np.random.Generator) -> int:
    pages = arr.reshape(-1, PAGE)
    chosen = rng.choice(len(pages), size=max(1, int(len(pages) * fraction)), replace=False)
    pages[chosen] = rng.integers(0, 256, (len(chosen), PAGE), dtype=np.uint8)
    return len(chosen) * PAGE


def segment_files(store_dir: str) -> list:
    d = os.path.join(store_dir, fmt.SEGMENTS_DIR)
    return [os.path.join(d, n) for n in os.listdir(d) if n.endswith(fmt.SEGMENT_SUFFIX)]


def segment_bytes(store_dir: str) -> int:
    return sum(os.path.getsize(p) for p in segment_files(store_dir))


def allocated_bytes(store_dir: str) -> int:
    return sum(os.stat(p).st_blocks * 512 for p in segment_files(store_dir))


def drop_cache(store_dir: str) -> None:
    for p in segment_files(store_dir):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def live_and_dead_in_live_chunks(store) -> tuple[int, int]:
    """(record bytes of referenced chunks, raw bytes inside them that no live manifest reads)."""
    with store._index.read() as r:
        used: dict = {}
        for cid in r.checkpoint_ids():
            c = r.checkpoint(cid)
            for bi in range(len(c.buffers)):
                for _, coff, length, chunk in ext.unpack(r.manifest(cid, bi)):
                    used.setdefault(chunk, []).append((coff, coff + length))
        live = dead = 0
        for chunk, e in r.chunks():
            if not e.refs:
                continue
            live += fmt.RECORD_HEADER.size + e.stored_len
            covered, end = 0, 0
            for a, b in sorted(used.get(chunk, [])):
                if b > end:
                    covered += b - max(a, end)
                    end = b
            dead += e.raw_len - covered
    return live, dead


def plain_copy(store_dir: str, root: str) -> float:
    """Seconds to read every segment file and write it to one new file, fdatasync'd."""
    dst = os.path.join(root, "plain-copy.bin")
    t0 = time.perf_counter()
    with open(dst, "wb", buffering=0) as out:
        for p in sorted(segment_files(store_dir)):
            with open(p, "rb", buffering=0) as f:
                while True:
                    block = f.read(8 << 20)
                    if not block:
                        break
                    out.write(block)
        os.fdatasync(out.fileno())
    secs = time.perf_counter() - t0
    os.unlink(dst)
    return secs


def segment_live_fractions(store) -> list:
    """Per segment: the fraction of its record bytes that referenced chunk records take."""
    live: dict = {}
    with store._index.read() as r:
        for _, e in r.chunks():
            if e.refs:
                live[e.segment] = live.get(e.segment, 0) + fmt.RECORD_HEADER.size + e.stored_len
    return [live.get(n, 0) / max(1, store.backend.size(n) - fmt.SEGMENT_HEADER.size)
            for n in store.backend.list()]


def profile(fn, label: str, lines: int = 14):
    prof = cProfile.Profile()
    t = time.perf_counter()
    out = prof.runcall(fn)
    secs = time.perf_counter() - t
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(lines)
    print(f"\n--- profile of {label} ({secs:.2f} s under the profiler), by own time ---")
    text = s.getvalue().splitlines()
    start = next((i for i, line in enumerate(text) if "ncalls" in line), 0)
    print("\n".join(text[start:start + lines + 1]))
    return out


def rep_threshold(args) -> str:
    return f"{args.threshold if args.threshold is not None else fmt.DEFAULT_COMPACT_THRESHOLD:.0%}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--checkpoints", type=int, default=40)
    ap.add_argument("--delete-count", type=int, default=30)
    ap.add_argument("--delete", choices=("oldest", "spread"), default="oldest")
    ap.add_argument("--dirty", type=float, default=0.10)
    ap.add_argument("--durability", choices=("fsync", "none"), default="fsync")
    ap.add_argument("--segment-mib", type=int, default=fmt.DEFAULT_SEGMENT_SIZE >> 20,
                    help="segment size (default: the store's default); scale it down with "
                    "--size-mib so that the store still spans several segments")
    ap.add_argument("--dir", default=None, help="where to put the store (default: a temp dir)")
    ap.add_argument("--threshold", type=float, default=None,
                    help="compact(threshold=...) (default: compact()'s own default)")
    ap.add_argument("--repeat", type=int, default=3, help="verify runs (best and median)")
    ap.add_argument("--cold", action="store_true",
                    help="drop the segments from the page cache before compact and verify")
    ap.add_argument("--profile", action="store_true",
                    help="also profile compact() and verify(deep=True) on a copy of the store")
    ap.add_argument("--no-check", action="store_true", help="skip the byte-exact restore check")
    ap.add_argument("--keep", action="store_true", help="keep the store directory")
    args = ap.parse_args()
    size = args.size_mib << 20
    root = tempfile.mkdtemp(dir=args.dir, prefix="snapbench-maint-")
    path = os.path.join(root, "store")
    rng = np.random.default_rng(4)
    state = rng.integers(0, 256, size, dtype=np.uint8)
    rows = []
    try:
        store = snapstore.open(path, durability=args.durability,
                               segment_size=args.segment_mib << 20)
        digests = {}
        t0 = time.perf_counter()
        for _ in range(args.checkpoints):
            info = store.checkpoint({"state": state}, stream="run")
            digests[info.id] = hashlib.blake2b(state, digest_size=16).digest()
            mutate(state, args.dirty, rng)
        t_ckpt = time.perf_counter() - t0
        ids = [c.id for c in store.checkpoints("run")]
        kinds = "".join("F" if c.kind == "full" else "." for c in store.checkpoints("run"))
        if args.delete == "oldest":
            doomed = ids[:args.delete_count]
        else:
            keep = set(ids[::max(1, len(ids) // max(1, len(ids) - args.delete_count))])
            doomed = [i for i in ids if i not in keep][:args.delete_count]
        t0 = time.perf_counter()
        for cid in reversed(doomed):
            store.delete(cid)
            del digests[cid]
        t_delete = time.perf_counter() - t0
        st0 = store.stats()
        seg0, alloc0 = segment_bytes(path), allocated_bytes(path)
        live0, dead0 = live_and_dead_in_live_chunks(store)
        garbage = seg0 - live0
        if args.profile:
            shutil.copytree(path, path + ".profile")
        if args.cold:
            drop_cache(path)

        fractions = segment_live_fractions(store)
        t0 = time.perf_counter()
        rep = store.compact() if args.threshold is None else \
            store.compact(threshold=args.threshold)
        t_compact = time.perf_counter() - t0
        os.sync()
        seg1, alloc1 = segment_bytes(path), allocated_bytes(path)
        st1 = store.stats()
        returned = seg0 - seg1
        copied = rep["live_bytes_copied"]
        processed = copied + rep.get("trim_bytes_read", 0)
        rows += [
            ("store before compact()", f"{seg0 / 2**20:,.0f} MiB in {st0['segments']} segments; "
             f"live chunk records {live0 / 2**20:,.0f} MiB", ""),
            ("segments' live fractions", " ".join(f"{f:.0%}" for f in fractions) +
             f" (compact threshold {args.threshold if args.threshold is not None else 'default'}"
             f" = {rep_threshold(args)})", ""),
            ("garbage (segments - live)", f"{garbage / 2**20:,.0f} MiB "
             f"({st0['garbage_chunk_bytes'] / 2**20:,.0f} MiB of it unreferenced chunks)", ""),
            ("compact(): returned to FS", f"{returned / 2**20:,.0f} MiB = "
             f"{returned / garbage:.1%} of the garbage (allocated blocks "
             f"-{(alloc0 - alloc1) / 2**20:,.0f} MiB)",
             ">= 90%", returned >= 0.9 * garbage),
            ("compact(): speed", f"{processed / 2**20:,.0f} MiB of live chunk records read, "
             f"checked and rewritten in {t_compact:.2f} s = {processed / t_compact / 1e6:,.0f} "
             f"MB/s ({copied / 2**20:,.0f} MiB copied from {rep['segments_rewritten']} "
             f"rewritten segments; {rep.get('trim_bytes_read', 0) / 2**20:,.0f} MiB of "
             f"{rep.get('chunks_trimmed', 0)} trimmed chunks -> "
             f"{rep.get('trim_bytes_written', 0) / 2**20:,.0f} MiB)", ">= 300 MB/s",
             processed / t_compact >= 300e6 if processed else None),
            ("store after compact()", f"{seg1 / 2**20:,.0f} MiB in {st1['segments']} segments; "
             f"{(seg1 - st1['live_chunk_bytes']) / 2**20:,.1f} MiB not live chunk records", ""),
            ("dead bytes in live chunks", f"{dead0 / 2**20:,.0f} MiB inside still-referenced "
             "chunks (not reclaimable by chunk GC; not counted as garbage above)", ""),
        ]
        t_copy = plain_copy(path, root)
        rows.append(("plain copy of the same bytes", f"{seg1 / 2**20:,.0f} MiB read + written "
                     f"+ fdatasync'd in {t_copy:.2f} s = {seg1 / t_copy / 1e6:,.0f} MB/s "
                     "(the disk's ceiling for a copy)", ""))
        for deep in (True, False):
            times = []
            for _ in range(args.repeat):
                if args.cold:
                    drop_cache(path)
                t0 = time.perf_counter()
                vrep = store.verify(deep=deep)
                times.append(time.perf_counter() - t0)
                assert vrep["ok"], vrep["problems"][:5]
            best, med = min(times), sorted(times)[len(times) // 2]
            n = vrep["bytes_checked"]
            rows.append((f"verify(deep={deep})", f"{n / 2**20:,.0f} MiB: best {best:.2f} s = "
                         f"{n / best / 1e9:.2f} GB/s, median {med:.2f} s = {n / med / 1e9:.2f} "
                         f"GB/s ({args.repeat} runs)", ">= 1 GB/s" if deep else "",
                         n / best >= 1e9 if deep else None))
        if not args.no_check:
            out = np.empty_like(state)
            t0 = time.perf_counter()
            for cid, digest in digests.items():
                store.restore_into(cid, {"state": out})
                assert hashlib.blake2b(out, digest_size=16).digest() == digest, cid
            rows.append(("restore check", f"{len(digests)} live checkpoints byte-exact after "
                         f"compact ({time.perf_counter() - t0:.1f} s)", ""))
        store.close()
        if args.profile:
            pstore = snapstore.open(path + ".profile", durability=args.durability,
                                    segment_size=args.segment_mib << 20)
            if args.cold:
                drop_cache(path + ".profile")
            profile(lambda: pstore.compact(threshold=args.threshold) if args.threshold
                    is not None else pstore.compact(), "compact()")
            if args.cold:
                drop_cache(path + ".profile")
            profile(lambda: pstore.verify(deep=True), "verify(deep=True)")
            pstore.close()
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"store kept at {root}")
    print(f"snapstore {snapstore.__version__}: {args.checkpoints} checkpoints of a "
          f"{args.size_mib} MiB random buffer, {args.dirty:.0%} of pages changed between "
          f"checkpoints (kinds {kinds}), durability={args.durability}, segments of "
          f"{args.segment_mib} MiB, "
          f"{'cold' if args.cold else 'warm'} page cache; load average at the end "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"checkpoints took {t_ckpt:.1f} s; deleted {len(doomed)} ({args.delete}) in "
          f"{t_delete:.2f} s; compact() report: {', '.join(f'{k}={v:.3f}' if isinstance(v, float) else f'{k}={v}' for k, v in rep.items())}")
    print(f"{'measure':28} {'figure':96} {'target':12} ok")
    failed = 0
    for row in rows:
        name, fig, target = row[:3]
        verdict = "" if len(row) < 4 or row[3] is None else ("yes" if row[3] else "NO")
        failed += verdict == "NO"
        print(f"{name:28} {fig:96} {target:12} {verdict}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
