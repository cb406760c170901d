"""PyTorch figures of issue 8, side by side in one run.

Workload: a model of N MiB of float32 parameters (default 256: four 4096x4096 Linear layers)
with Adam state after one step (model + optimizer = 3x N). Saved once, then 1% of the rows of
every weight matrix and the matching rows of its Adam moments (exp_avg, exp_avg_sq) and bias
entries change, and it is saved again. The second save is measured for:

  snapstore.torch.save     object checkpoint: each tensor storage a page-diffed buffer
  dcp + SnapstoreWriter    torch.distributed.checkpoint into a snapstore store
  torch.save + fsync       the same state dict to one file
  dcp + FileSystemWriter   DCP's own writer (writes everything again)

and the restore of the second checkpoint into the live model/optimizer (warm page cache).
Durability "fsync" everywhere (files are fsynced, as the store does).

    python3 benchmarks/bench_torch.py [--size-mib 256] [--rows-pct 1] [--dir /path] [--repeat 2]
                                      [--compression zstd|none]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

import snapstore  # noqa: E402
import snapstore.torch as st  # noqa: E402

MiB = 1 << 20


def build(size_mib: int, width: int = 4096, seed: int = 0):
    torch.manual_seed(seed)
    layers = max(1, round(size_mib * MiB / (width * width * 4)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-2
    opt.step()
    opt.zero_grad(set_to_none=True)
    return model, opt


def change_rows(model, opt, pct: float, seed: int = 1) -> int:
    """Changes pct% of the rows of each weight, the matching bias entries and Adam rows."""
    g = torch.Generator().manual_seed(seed)
    changed = 0
    with torch.no_grad():
        for layer in model:
            rows = layer.weight.shape[0]
            idx = torch.randperm(rows, generator=g)[:max(1, int(rows * pct / 100))]
            for p in (layer.weight, layer.bias):
                state = opt.state[p]
                for t in (p, state["exp_avg"], state["exp_avg_sq"]):
                    t[idx] += 1e-3
                    changed += t[idx].numel() * t.element_size()
    return changed


def state_bytes(model, opt) -> int:
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    for s in opt.state.values():
        total += sum(t.numel() * t.element_size() for t in s.values()
                     if isinstance(t, torch.Tensor))
    return total


def dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def fsync_tree(path: str) -> None:
    for d, _, files in os.walk(path):
        for f in files:
            fd = os.open(os.path.join(d, f), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        fd = os.open(d, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def torch_save(state, path: str) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=256, help="float32 parameters (MiB)")
    ap.add_argument("--rows-pct", type=float, default=1.0)
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=2, help="change+save rounds (median shown)")
    ap.add_argument("--compression", choices=("zstd", "none"), default="zstd",
                    help="the stores' compression (default: zstd, the store default)")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-torch-", dir=args.dir)
    try:
        run(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(args, root: str) -> None:
    model, opt = build(args.size_mib)
    total = state_bytes(model, opt)
    params = sum(p.numel() * 4 for p in model.parameters())
    print(f"model {params / MiB:.0f} MiB of float32 parameters ({len(model)} x Linear"
          f"{tuple(model[0].weight.shape)}), model + Adam {total / MiB:.0f} MiB; "
          f"{args.rows_pct}% of rows change per round; store compression "
          f"{args.compression}; torch {torch.__version__}")
    store_path, dcp_store = os.path.join(root, "store"), os.path.join(root, "dcp-store")
    store = snapstore.open(store_path, compression=args.compression)
    writer = st.SnapstoreWriter(dcp_store, compression=args.compression)
    live = {"model": model, "optim": opt}

    def sd():
        return {"model": model.state_dict(), "optim": opt.state_dict()}

    first = {}
    first["snap"] = timed(lambda: st.save(live, store, "train"))
    first["torch"] = timed(lambda: torch_save(sd(), os.path.join(root, "t0.pt")))
    first["dcp_snap"] = timed(lambda: dcp.save(sd(), checkpoint_id="r0", storage_writer=writer))
    fs0 = os.path.join(root, "fs0")
    first["dcp_fs"] = timed(lambda: (dcp.save(sd(), storage_writer=dcp.FileSystemWriter(fs0)),
                                     fsync_tree(fs0)))
    os.remove(os.path.join(root, "t0.pt"))
    shutil.rmtree(fs0)

    rounds = {k: [] for k in ("snap", "torch", "dcp_snap", "dcp_fs")}
    sizes = {}
    changed = 0
    for r in range(1, args.repeat + 1):
        changed = change_rows(model, opt, args.rows_pct, seed=r)
        order = ["snap", "torch", "dcp_snap", "dcp_fs"]
        order = order[r % 4:] + order[:r % 4]            # rotate: same conditions for all
        for name in order:
            if name == "snap":
                t, info = timed(lambda: st.save(live, store, "train"))
                sizes[name] = info.bytes_new
            elif name == "torch":
                path = os.path.join(root, f"t{r}.pt")
                t, _ = timed(lambda: torch_save(sd(), path))
                sizes[name] = dir_bytes(path)
                os.remove(path)
            elif name == "dcp_snap":
                t, _ = timed(lambda: dcp.save(sd(), checkpoint_id=f"r{r}", storage_writer=writer))
                sizes[name] = writer.last_info.bytes_new
            else:
                path = os.path.join(root, f"fs{r}")
                t, _ = timed(lambda: (dcp.save(sd(), storage_writer=dcp.FileSystemWriter(path)),
                                      fsync_tree(path)))
                sizes[name] = dir_bytes(path)
                keep_fs = path
            rounds[name].append(t)
        if r < args.repeat:
            shutil.rmtree(keep_fs)

    # restores of the last round into the live objects (warm page cache)
    restore = {}
    restore["snap"] = timed(lambda: st.load(store, "train", into=live))[0]
    torch_save(sd(), os.path.join(root, "last.pt"))
    def torch_restore():
        loaded = torch.load(os.path.join(root, "last.pt"))
        model.load_state_dict(loaded["model"])
        opt.load_state_dict(loaded["optim"])
    restore["torch"] = timed(torch_restore)[0]
    restore["dcp_snap"] = timed(lambda: dcp.load(
        sd(), checkpoint_id=f"r{args.repeat}", storage_reader=st.SnapstoreReader(dcp_store)))[0]
    restore["dcp_fs"] = timed(lambda: dcp.load(
        sd(), storage_reader=dcp.FileSystemReader(keep_fs)))[0]
    store.close()

    labels = {"snap": "snapstore.torch.save", "dcp_snap": "dcp.save + SnapstoreWriter",
              "torch": "torch.save + fsync", "dcp_fs": "dcp.save + FileSystemWriter"}
    base = statistics.median(rounds["torch"])
    print(f"\nbytes that changed per round: {changed / MiB:.1f} MiB "
          f"({100 * changed / total:.2f}% of model + optimizer)\n")
    print("| method | first save (s) | second save (s) | vs torch.save | bytes added by the "
          "second save | % of model+optim | restore (s) |")
    print("|---|---|---|---|---|---|---|")
    for name in ("snap", "dcp_snap", "torch", "dcp_fs"):
        t2 = statistics.median(rounds[name])
        print(f"| {labels[name]} | {first[name][0]:.2f} | {t2:.3f} | {t2 / base:.2f}x | "
              f"{sizes[name] / MiB:.1f} MiB | {100 * sizes[name] / total:.2f}% | "
              f"{restore[name]:.2f} |")
    ok_bytes = sizes["snap"] <= 0.03 * total and sizes["dcp_snap"] <= 0.03 * total
    ok_time = statistics.median(rounds["snap"]) < base
    print(f"\nsecond save adds <= 3% of model+optim: {'yes' if ok_bytes else 'NO'}; "
          f"faster than torch.save + fsync: {'yes' if ok_time else 'NO'}")
    print("(restore of the last checkpoint into the live model and optimizer, warm page cache: "
          "snapstore in place; torch.load + load_state_dict; dcp.load into the state dict)")


if __name__ == "__main__":
    main()
