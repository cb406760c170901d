"""Issue 18's targets, side by side in one run: dense state, async torch saves, the sparse hot
path. Every figure is a ratio against a baseline measured in the same run on the same bytes.

  dense       float32 weights N(0, 0.02), every value then changed by a relative r N(0, 1)
              (Adam-like: r = 1%): store.checkpoint() of the new version, default options,
              against a raw write+fsync of the same bytes made in the same round (right
              before or after it); and the bytes the store grew by (medians of --rounds,
              each in a fresh store; the ratio is the median of the rounds' ratios); the
              same with delta_chunks=True (each chunk coded against the previous version's),
              with its keyframe cache (the default) and without (keyframe_cache_bytes=0:
              every base read back from disk), and the first checkpoint of each (the one
              that stores the keyframes, and fills the cache) against the default's
  random      the same for incompressible bytes (what a probe must keep near 1.0x)
  ratio       the saving of a full checkpoint of fp32/bf16/fp16 weights (the segment bytes
              it adds: its chunk records and commit record), at the default
              compression_level and at 3 (byte planes may rotate by 3 bits), beside zipnn's
              and blosc2's (shuffle+zstd, clevel 1) on the same bytes (if installed)
  mlp         a 4-layer MLP + Adam, trained, saved every --every steps: snapstore.torch.save
              against torch.save + fsync (time, bytes on disk), and the warm restore of the
              last save against torch.load (9 pairs, each made back to back, who goes first
              alternating; medians, the ratio the median of the pairs' ratios)
  async       snapstore.torch.save_async right after a training step: the time the caller is
              blocked against a memcpy (torch clone) of the same state; beside it
              dcp.async_save (FileSystemWriter, DCP's default stager): blocked time, growth
              of the peak RSS; and whether each checkpoint holds the values as of the call
  sparse      store.checkpoint() of --sparse-mib MiB with 1% of the pages changed at random
              (durability fsync): time, and store growth over the changed bytes (index
              included), median of --rounds after two warm-up rounds

    python3 benchmarks/bench_dense.py [--dense-mib 256] [--mlp-mib 144] [--sparse-mib 1024]
                                      [--every 10] [--rounds 5] [--dir DIR] [--only NAME,...]
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import NamedTuple

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
import snapstore  # noqa: E402
from snapstore.formatting import text_table  # noqa: E402
from bench_floatcodec import write_file, versions  # noqa: E402
from bench_store import mutate, reset_hwm, vm_hwm  # noqa: E402

MiB = 1 << 20
LOAD_PAIRS = 9      # warm loads, each paired with a torch.load: the median of their ratios
warnings.filterwarnings("ignore", message="torch.distributed is disabled")


def store_bytes(store) -> int:
    """Segments plus index, as stats() counts them."""
    stats = store.stats()
    return stats["segment_bytes"] + stats["index_bytes"]


class Report:
    def __init__(self) -> None:
        self.rows: list = []

    def add(self, measure: str, snapstore_fig: str, baseline: str, ratio: str, target: str,
            met) -> None:
        verdict = "-" if met is None else ("met" if met else "MISSED")
        self.rows.append([measure, snapstore_fig, baseline, ratio, target, verdict])
        print(f"  {measure}: {snapstore_fig} vs {baseline} = {ratio} ({target}: {verdict})",
              flush=True)

    def print(self) -> None:
        print()
        print(text_table(["measure", "snapstore", "baseline", "ratio", "target", ""],
                         self.rows, right=(1, 2, 3)))


DENSE_VARIANTS = (("default options", {}),
                  ("delta_chunks=True", {"delta_chunks": True}),
                  ("delta_chunks=True, keyframe_cache_bytes=0",
                   {"delta_chunks": True, "keyframe_cache_bytes": 0}))


def dense(args, root: str, rep: Report) -> None:
    n = args.dense_mib * MiB
    old, new = versions("float32", n, 0.01)
    old, new = np.frombuffer(old, np.float32), np.frombuffer(new, np.float32)
    later = (new * (1 + np.float32(0.01) * np.random.default_rng(7).standard_normal(
        new.size, dtype=np.float32))).astype(np.float32)
    got = _paired_checkpoints(root, "dense", [old, new, later], args.rounds,
                              [options for _, options in DENSE_VARIANTS])
    base = got[0]
    for (label, _), m in zip(DENSE_VARIANTS, got):
        head = (f"dense fp32 {args.dense_mib} MiB, all changed: checkpoint" if m is base
                else f"  same, {label}: checkpoint")
        rep.add(head, f"{m.took:.3f} s", f"{m.raw:.3f} s raw write+fsync", f"{m.ratio:.2f}x",
                "<= 1.2x", m.ratio <= 1.2)
        rep.add("  same: bytes added" if m is base else f"  same, {label}: bytes added",
                f"{m.added / MiB:.1f} MiB", f"{n / MiB:.0f} MiB raw", f"{m.added / n:.0%}",
                "<= 70%", m.added / n <= 0.70)
        if m is not base:
            rep.add(f"  same, {label}: checkpoint vs the default's", f"{m.took:.3f} s",
                    f"{base.took:.3f} s default options", f"{m.took_ratio:.2f}x", "reported",
                    None)
            rep.add(f"  same, {label}: the first checkpoint (keyframes)", f"{m.first:.3f} s",
                    f"{base.first:.3f} s default options", f"{m.first_ratio:.2f}x",
                    "reported", None)
            rep.add(f"  same, {label}: the next checkpoint (steady state)",
                    f"{m.later:.3f} s", f"{base.later:.3f} s default options",
                    f"{m.later_ratio:.2f}x", "reported", None)
    rnd = np.random.default_rng(3)
    a = rnd.integers(0, 256, n, dtype=np.uint8)
    b = rnd.integers(0, 256, n, dtype=np.uint8)
    m, = _paired_checkpoints(root, "random", [a, b], args.rounds, [{}])
    rep.add(f"random {args.dense_mib} MiB (incompressible): checkpoint", f"{m.took:.3f} s",
            f"{m.raw:.3f} s raw write+fsync", f"{m.ratio:.2f}x", "<= 1.1x", m.ratio <= 1.1)


class Paired(NamedTuple):
    took: float          # the second checkpoint's seconds (median)
    raw: float           # the raw write+fsync of its bytes paired with it (median)
    ratio: float         # the median of the rounds' took / raw
    took_ratio: float    # the median of the rounds' took / the first variant's took
    added: int           # the bytes the store grew by with it (median)
    first: float         # the first checkpoint's seconds (median)
    first_ratio: float   # the median of the rounds' first / the first variant's first
    later: float         # the third checkpoint's seconds (median; nan without a third)
    later_ratio: float   # the median of the rounds' later / the first variant's later


def _paired_checkpoints(root: str, name: str, states: list, rounds: int, variants: list
                        ) -> list[Paired]:
    """Per variant (open() options), checkpoints of states[0], states[1] (measured against
    a raw write+fsync of its bytes) and states[2] if given, into a fresh store each round.
    The variants take turns within a round (who goes first rotating), so all meet the same
    state of this VM's disk (it swings by 2x within a minute), and each second checkpoint's
    raw write is made right before or right after it (alternating). Ratios are medians of
    the rounds' ratios."""
    rows: list = [[] for _ in variants]
    for k in range(rounds):
        # who goes first rotates: the writeback one store's checkpoints leave behind slows
        # the next one's
        for v in [(k + i) % len(variants) for i in range(len(variants))]:
            options = variants[v]
            path = os.path.join(root, f"{name}-{k}-{v}")
            with snapstore.open(path, **options) as s:
                t = time.perf_counter()
                s.checkpoint({"w": states[0]}, stream="w")
                first = time.perf_counter() - t
                before = store_bytes(s)
                raw = write_file(root, [states[1]]) if (k + v) % 2 == 0 else None
                t = time.perf_counter()
                s.checkpoint({"w": states[1]}, stream="w")
                took = time.perf_counter() - t
                if raw is None:
                    raw = write_file(root, [states[1]])
                added = store_bytes(s) - before
                later = math.nan
                if len(states) > 2:
                    t = time.perf_counter()
                    s.checkpoint({"w": states[2]}, stream="w")
                    later = time.perf_counter() - t
            shutil.rmtree(path, ignore_errors=True)
            rows[v].append((took, raw, took / raw, added, first, later))
    med = statistics.median
    out = []
    for v, rs in enumerate(rows):
        out.append(Paired(med(r[0] for r in rs), med(r[1] for r in rs), med(r[2] for r in rs),
                          med(r[0] / b[0] for r, b in zip(rs, rows[0])),
                          int(med(r[3] for r in rs)), med(r[4] for r in rs),
                          med(r[4] / b[4] for r, b in zip(rs, rows[0])),
                          med(r[5] for r in rs), med(r[5] / b[5] for r, b in zip(rs, rows[0]))))
    return out


def ratios(args, root: str, rep: Report) -> None:
    """The saving of a full checkpoint of weights beside the peers', and the speeds: ours a
    checkpoint (durability "none": hashing, coding, the log's writes into the page cache,
    the index) and a restore into a preallocated buffer, theirs compress and decompress in
    memory (best of 3 each). Ours at the default compression_level (1) and at 3, from which
    the planes of float chunks may rotate their items by 3 bits (format 6: 0.2-0.45 points
    more on float32 and bfloat16 weights, for more CPU)."""
    n = min(args.dense_mib, 64) * MiB
    for dtype in ("float32", "bfloat16", "float16"):
        data, _ = versions(dtype, n, 0)
        # typed as floats of the same width (NumPy has no bfloat16: float16 labels it)
        typed = np.frombuffer(data, np.float32 if dtype == "float32" else np.float16)
        ours = {}
        for level in (1, 3):
            saves, loads = [], []
            for k in range(3):
                where = os.path.join(root, f"ratio-{dtype}-{level}-{k}")
                with snapstore.open(where, durability="none", compression_level=level) as s:
                    before = s.stats()["segment_bytes"]    # the stored chunks, as the peers'
                    t = time.perf_counter()
                    info = s.checkpoint({"w": typed})
                    saves.append(time.perf_counter() - t)
                    saved = 1 - (s.stats()["segment_bytes"] - before) / n
                    out = bytearray(n)
                    t = time.perf_counter()
                    s.restore_into(info.id, {"w": out})
                    loads.append(time.perf_counter() - t)
                    assert out == data
                shutil.rmtree(where, ignore_errors=True)
            ours[level] = (saved, min(saves), min(loads))
        peers, theirs, speeds = [], [], []
        for name, fn in (("zipnn", _zipnn), ("blosc2", _blosc2)):
            try:
                size, enc, dec = fn(data, dtype)
            except ImportError:
                peers.append(f"{name} not installed")
                continue
            theirs.append(1 - size / n)
            peers.append(f"{name} {theirs[-1]:.2%}")
            speeds.append(f"{name} {n / enc / 1e9:.2f} / {n / dec / 1e9:.2f}")
        for level, label in ((1, "default options"), (3, "compression_level=3")):
            saved, save, load = ours[level]
            rep.add(f"{dtype} weights {n >> 20} MiB, full, {label}: saved", f"{saved:.2%}",
                    ", ".join(peers), "-", "beat both",
                    saved > max(theirs) if len(theirs) == 2 else None)
            rep.add("  same: GB/s coded / decoded", f"{n / save / 1e9:.2f} / "
                    f"{n / load / 1e9:.2f}", ", ".join(speeds) or "-", "-", "reported", None)


def _best_of_3(fn) -> tuple:
    """(fn()'s result, its best time of 3 runs)."""
    best, result = float("inf"), None
    for _ in range(3):
        t = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t)
    return result, best


def _zipnn(data: bytes, dtype: str) -> tuple:
    """(compressed size, compress seconds, decompress seconds), round trip checked."""
    import torch
    import zipnn
    codec = zipnn.ZipNN(input_format="torch")
    # compress() transforms its input in place (seen: a second call on the same tensor
    # differs and does not round-trip), so each run gets a fresh copy, made untimed
    tensors = [torch.frombuffer(bytearray(data), dtype=getattr(torch, dtype)) for _ in range(3)]
    packed, enc = _best_of_3(lambda: codec.compress(tensors.pop()))
    back, dec = _best_of_3(lambda: codec.decompress(packed))
    assert back.view(torch.uint8).numpy().tobytes() == data
    return len(packed), enc, dec


def _blosc2(data: bytes, dtype: str) -> tuple:
    """(compressed size, compress seconds, decompress seconds), round trip checked."""
    import blosc2
    k = 4 if dtype == "float32" else 2
    packed, enc = _best_of_3(lambda: blosc2.compress2(
        data, typesize=k, clevel=1, codec=blosc2.Codec.ZSTD, filters=[blosc2.Filter.SHUFFLE]))
    back, dec = _best_of_3(lambda: blosc2.decompress2(packed))
    assert bytes(back) == data
    return len(packed), enc, dec


def mlp(args, root: str, rep: Report):
    import torch
    import snapstore.torch as st
    torch.manual_seed(0)
    width = int((args.mlp_mib * MiB / 3 / 4 / 4) ** 0.5)   # params + 2 Adam moments = 3x
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(4)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x = torch.randn(64, width)

    def step() -> None:
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    ours, theirs, files = [], [], []
    path = os.path.join(root, "mlp")
    with snapstore.open(path) as s:
        before = store_bytes(s)
        for k in range(args.saves):
            for _ in range(args.every):
                step()
            state = {"model": model, "optim": opt}
            t = time.perf_counter()
            info = st.save(s, state, "train")
            ours.append(time.perf_counter() - t)
            f = os.path.join(root, f"torch-{k}.pt")
            t = time.perf_counter()
            with open(f, "wb") as out:
                torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, out)
                out.flush()
                os.fsync(out.fileno())
            theirs.append(time.perf_counter() - t)
            files.append(os.path.getsize(f))
        grown = store_bytes(s) - before
        loads = []
        for k in range(LOAD_PAIRS):     # each paired with a torch.load, in turns first
            timed = {}
            for who in (("ours", "theirs") if k % 2 else ("theirs", "ours")):
                t = time.perf_counter()
                if who == "ours":
                    st.load(s, info.id)
                else:
                    torch.load(f, weights_only=True)
                timed[who] = time.perf_counter() - t
            loads.append((timed["ours"], timed["theirs"]))
    mine, base = statistics.median(ours[1:]), statistics.median(theirs[1:])
    rep.add(f"MLP+Adam {args.mlp_mib} MiB, save every {args.every} steps: save",
            f"{mine:.3f} s", f"{base:.3f} s torch.save+fsync", f"{mine / base:.2f}x", "< 1x",
            mine < base)
    rep.add(f"  same: bytes of {args.saves} saves", f"{grown / MiB:.1f} MiB",
            f"{sum(files) / MiB:.1f} MiB", f"{grown / sum(files):.2f}x", "< 1x",
            grown < sum(files))
    ol, tl = statistics.median(a for a, _ in loads), statistics.median(b for _, b in loads)
    ratio = statistics.median(a / b for a, b in loads)
    rep.add("  same: warm restore of the last save", f"{ol:.3f} s", f"{tl:.3f} s torch.load",
            f"{ratio:.2f}x", "<= 1.2x", ratio <= 1.2)
    for k in range(args.saves):
        os.unlink(os.path.join(root, f"torch-{k}.pt"))
    return model, opt, step


def async_saves(args, root: str, rep: Report, model, opt, step) -> None:
    import torch
    import torch.distributed.checkpoint as dcp
    import snapstore.torch as st

    def tensors():
        out = [p.data for p in model.parameters()]
        for state in opt.state.values():
            out += [t for t in state.values() if isinstance(t, torch.Tensor) and t.dim()]
        return out
    total = sum(t.numel() * t.element_size() for t in tensors())
    copies = []
    for _ in range(3):
        t = time.perf_counter()
        clones = [t_.clone() for t_ in tensors()]
        copies.append(time.perf_counter() - t)
    del clones
    memcpy = min(copies)
    with snapstore.open(os.path.join(root, "async")) as s:
        st.save(s, {"model": model, "optim": opt}, "a")
        blocked, holds = [], True
        for _ in range(3):
            step()
            want = copy.deepcopy(model.state_dict())
            reset_hwm()
            hwm0 = vm_hwm()
            t = time.perf_counter()
            future = st.save_async(s, {"model": model, "optim": opt}, "a")
            blocked.append(time.perf_counter() - t)
            step()                                    # training goes on at once
            info = future.result()
            ours_rss = vm_hwm() - hwm0
            got = st.load(s, info.id)["model"]
            holds &= all(torch.equal(got[k], v) for k, v in want.items())
        staging_peak = s.stats()["staging_peak_bytes"]
    mine = statistics.median(blocked)
    rep.add(f"save_async blocked time (dense, {total / MiB:.0f} MiB)", f"{mine:.3f} s",
            f"{memcpy:.3f} s memcpy", f"{mine / memcpy:.2f}x", "<= 1.5x", mine / memcpy <= 1.5)
    dblocked, dholds, drss = [], True, 0
    for k in range(3):
        step()
        want = copy.deepcopy(model.state_dict())
        reset_hwm()
        hwm0 = vm_hwm()
        t = time.perf_counter()           # the same state: model and Adam moments
        response = dcp.async_save({"model": model.state_dict(), "optim": opt.state_dict()},
                                  storage_writer=dcp.FileSystemWriter(
                                      os.path.join(root, f"dcp-{k}")))
        dblocked.append(time.perf_counter() - t)
        step()
        (response.result() if hasattr(response, "result")
         else response.upload_completion.result())
        drss = max(drss, vm_hwm() - hwm0)
        target = {"model": {k_: torch.empty_like(v) for k_, v in want.items()}}
        dcp.load(target, checkpoint_id=os.path.join(root, f"dcp-{k}"))
        dholds &= all(torch.equal(target["model"][k_], v) for k_, v in want.items())
    theirs = statistics.median(dblocked)
    rep.add("save_async vs dcp.async_save: blocked", f"{mine:.3f} s", f"{theirs:.3f} s",
            f"{mine / theirs:.2f}x", "reported", None)
    rep.add("  same: peak RSS growth", f"{ours_rss / MiB:.0f} MiB (staging peak "
            f"{staging_peak / MiB:.0f} MiB)", f"{drss / MiB:.0f} MiB", "-", "reported", None)
    rep.add("  same: checkpoint holds the values as of the call", str(holds), str(dholds), "-",
            "True", holds)


def sparse(args, root: str, rep: Report) -> None:
    n = args.sparse_mib * MiB
    rng = np.random.default_rng(7)
    arr = rng.integers(0, 256, n, dtype=np.uint8)
    times, growth = [], []
    with snapstore.open(os.path.join(root, "sparse")) as s:
        s.checkpoint({"a": arr}, stream="s")
        for k in range(args.rounds + 2):
            changed = mutate(arr, 0.01, rng)
            before = store_bytes(s)
            t = time.perf_counter()
            s.checkpoint({"a": arr}, stream="s")
            if k >= 2:
                times.append(time.perf_counter() - t)
                growth.append((store_bytes(s) - before) / changed)
    mine = statistics.median(times)
    rep.add(f"plain checkpoint {args.sparse_mib} MiB, 1% pages scattered, fsync",
            f"{mine * 1e3:.0f} ms", "-", "-", "<= 75 ms", mine <= 0.075)
    rep.add("  same: store growth / changed bytes", f"{statistics.median(growth):.2f}x", "-",
            "-", "<= 1.1x", statistics.median(growth) <= 1.1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dense-mib", type=int, default=256)
    ap.add_argument("--mlp-mib", type=int, default=144)
    ap.add_argument("--sparse-mib", type=int, default=1024)
    ap.add_argument("--every", type=int, default=10, help="training steps between saves")
    ap.add_argument("--saves", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--only", default="dense,ratio,mlp,async,sparse")
    args = ap.parse_args()
    only = set(args.only.split(","))
    root = tempfile.mkdtemp(prefix="bench-dense-", dir=args.dir)
    rep = Report()
    try:
        if "dense" in only:
            dense(args, root, rep)
        if "ratio" in only:
            ratios(args, root, rep)
        if only & {"mlp", "async"}:
            trained = mlp(args, root, rep)
            if "async" in only:
                async_saves(args, root, rep, *trained)
        if "sparse" in only:
            sparse(args, root, rep)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    rep.print()


if __name__ == "__main__":
    main()
