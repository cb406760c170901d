"""S3 client choice by measurement: boto3 and obstore against one real SeaweedFS server.

Both clients talk to the same `weed mini` (tests/s3server.py: free ports, a temp dir), in one
run, configured only through the standard AWS_* variables the helper exports. Rounds
alternate the clients' order so neither always runs on a warmer server.

Clients: boto3 (botocore defaults: a CRC32 checksum of every body), boto3-nocrc (the same,
with request_checksum_calculation="when_required"), obstore.

Measured, per client:
  put MB/s      multipart PUT of SIZE random bytes from memory (client defaults, then both at
                16 MiB parts x 8 in flight)
  get MB/s      GET of the whole object, one stream
  pget MB/s     GET by 8 MiB ranges, 8 threads (what a restore of a big segment would do)
  rng64K ms     GET of a random 64 KiB range (median of 100): a chunk read
  rng4M MB/s    GETs of random 4 MiB ranges, one after the other
  create ms     PUT of 1 KiB with If-None-Match: * (median / p90 of 100)
  ifmatch ms    PUT of 1 KiB with If-Match: <etag of the previous> (a ref advancing)
  412 ms        a create that loses (the key exists)
  race          16 threads create one key, 5 rounds: winners per round (must be all 1)
  fork          the parent used the client, then fork()s: does a new client in the child
                work? (obstore's tokio runtime does not survive fork: the child hangs)
  give up       seconds until a PUT to a port nothing listens on raises, default retries
  cpu s/GiB     the client process's CPU (all threads) per GiB moved, PUT / GET
  import s      a fresh `python -c "import X; make a client"`
  install MB    the installed files of the distribution and its dependencies

    python3 benchmarks/bench_s3_client.py [--size-mib 256] [--big] [--rounds 3]

--big adds a 1 GiB PUT/GET per client (client defaults). Takes ~2 min at the defaults.
obstore is in no extra of snapstore (it lost: docs/s3-client.md): `pip install obstore==0.12.1`
to compare, or `--clients boto3,boto3-nocrc` without it.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.metadata as md
import io
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from s3server import WeedServer  # noqa: E402

MiB = 1 << 20


class Conflict(Exception):
    """A conditional write lost: 412 Precondition Failed (or the client's own name for it)."""


# ---- the clients, behind one small interface --------------------------------------------------
class Boto3:
    name = "boto3"

    checksums = None        # botocore's default: a CRC32 of every request body

    def __init__(self, bucket: str, part: int | None = None, conc: int | None = None):
        import boto3
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config
        from botocore.exceptions import ClientError
        self.ClientError = ClientError
        self.bucket = bucket
        cfg = Config(request_checksum_calculation=self.checksums) if self.checksums else None
        self.c = boto3.client("s3", config=cfg)        # endpoint, keys, region: AWS_* env
        kw = {}
        if part:
            kw.update(multipart_chunksize=part, multipart_threshold=part)
        if conc:
            kw.update(max_concurrency=conc)
        self.tc = TransferConfig(**kw)

    def put_big(self, key, data):
        self.c.upload_fileobj(io.BytesIO(data), self.bucket, key, Config=self.tc)

    def get(self, key):
        return len(self.c.get_object(Bucket=self.bucket, Key=key)["Body"].read())

    def get_range(self, key, start, n):
        r = self.c.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + n - 1}")
        return len(r["Body"].read())

    def _cond(self, **kw):
        try:
            return self.c.put_object(Bucket=self.bucket, **kw)["ETag"]
        except self.ClientError as e:
            if e.response["ResponseMetadata"]["HTTPStatusCode"] == 412:
                raise Conflict(e.response["Error"]["Code"]) from None
            raise

    def create(self, key, data):
        return self._cond(Key=key, Body=data, IfNoneMatch="*")

    def update(self, key, data, etag):
        return self._cond(Key=key, Body=data, IfMatch=etag)

    def delete(self, key):
        self.c.delete_object(Bucket=self.bucket, Key=key)


class Boto3NoCrc(Boto3):
    """boto3 with request_checksum_calculation="when_required" (also settable as
    AWS_REQUEST_CHECKSUM_CALCULATION): no CRC32 of bodies the API does not demand one for."""
    name = "boto3-nocrc"
    checksums = "when_required"


class Obstore:
    name = "obstore"

    def __init__(self, bucket: str, part: int | None = None, conc: int | None = None):
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError
        from obstore.store import S3Store
        self.obs = obstore
        self.conflicts = (AlreadyExistsError, PreconditionError)
        self.s = S3Store(bucket)                       # endpoint, keys, region: AWS_* env
        self.kw = {}
        if part:
            self.kw["chunk_size"] = part
        if conc:
            self.kw["max_concurrency"] = conc

    def put_big(self, key, data):
        self.obs.put(self.s, key, memoryview(data), **self.kw)

    def get(self, key):
        return len(self.obs.get(self.s, key).bytes())

    def get_range(self, key, start, n):
        return len(self.obs.get_range(self.s, key, start=start, length=n))

    def _cond(self, key, data, mode):
        try:
            return self.obs.put(self.s, key, data, mode=mode)["e_tag"]
        except self.conflicts as e:
            raise Conflict(type(e).__name__) from None

    def create(self, key, data):
        return self._cond(key, data, "create")

    def update(self, key, data, etag):
        return self._cond(key, data, {"e_tag": etag})

    def delete(self, key):
        self.obs.delete(self.s, key)


CLIENTS = {"boto3": (Boto3, "boto3", "import boto3; boto3.client('s3')"),
           "boto3-nocrc": (Boto3NoCrc, "boto3", "import boto3; boto3.client('s3')"),
           "obstore": (Obstore, "obstore",
                       "import obstore; from obstore.store import S3Store; S3Store('b')")}


# ---- measures ---------------------------------------------------------------------------------
def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def timed(fn, *a):
    c0, t0 = cpu(), time.perf_counter()
    fn(*a)
    return time.perf_counter() - t0, cpu() - c0


def pget(client, key, size, part=8 * MiB, threads=8):
    with cf.ThreadPoolExecutor(threads) as ex:
        got = sum(ex.map(lambda off: client.get_range(key, off, min(part, size - off)),
                         range(0, size, part)))
    assert got == size, (got, size)


def lat(fn, n):
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def race(client_cls, bucket, rounds=5, threads=16):
    """threads clients (one each: boto3 clients are not shared across threads here, as an
    engine's writers on several machines would not share one) race to create one key."""
    clients = [client_cls(bucket) for _ in range(threads)]
    winners = []
    for r in range(rounds):
        key = f"race/{uuid.uuid4().hex}"
        barrier = threading.Barrier(threads)

        def go(i):
            barrier.wait()
            try:
                clients[i].create(key, f"writer {i}".encode())
                return 1
            except Conflict:
                return 0
        with cf.ThreadPoolExecutor(threads) as ex:
            winners.append(sum(ex.map(go, range(threads))))
    return winners


def fork_check(client_cls, bucket, timeout=10) -> str:
    """The parent uses a client, then fork()s (as multiprocessing's default start method,
    a PyTorch DataLoader worker or a prefork server does); the child makes a NEW client
    and reads one object. "ok" or what went wrong."""
    parent = client_cls(bucket)
    parent.create(f"fork/{uuid.uuid4().hex}", b"x")
    key = f"fork/{uuid.uuid4().hex}"
    parent.create(key, b"from parent")
    pid = os.fork()
    if pid == 0:                                       # child
        import signal
        signal.alarm(timeout)
        try:
            c = client_cls(bucket)
            os._exit(0 if c.get(key) == len(b"from parent") else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == 14:
        return f"HANGS (killed after {timeout} s)"
    return "ok" if os.waitstatus_to_exitcode(status) == 0 else f"fails ({status})"


def give_up_seconds(name: str) -> float:
    """A fresh process with the client's default retries and timeouts PUTs (If-None-Match)
    to a port nothing listens on: seconds until it raises."""
    from s3server import free_ports
    env = dict(os.environ, AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_ports(1)[0]}")
    code = (f"import sys, time; sys.path.insert(0, {HERE!r}); import bench_s3_client as b; "
            f"c = b.CLIENTS[{name!r}][0]('bucket'); t = time.perf_counter()\n"
            "try: c.create('k', b'x')\nexcept Exception: print(time.perf_counter() - t)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    return float(out.stdout.strip() or "nan")


def install_mb(dist_name: str) -> tuple:
    """MB of the installed files of a distribution and everything it requires (non-extra)."""
    seen, todo, total = set(), [dist_name], 0
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        seen.add(name)
        try:
            d = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for f in d.files or ():
            try:
                total += os.path.getsize(d.locate_file(f))
            except OSError:
                pass
        for req in d.requires or ():
            if "extra ==" in req:
                continue
            if ";" in req and "python_version" in req:
                marker = req.split(";", 1)[1]
                try:
                    from packaging.markers import Marker
                    if not Marker(marker).evaluate():
                        continue
                except Exception:
                    pass
            todo.append(re.match(r"[A-Za-z0-9._-]+", req).group(0))
    return total / 1e6, sorted(seen)


def import_seconds(stmt: str, env: dict, n=3) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", stmt], check=True, env=env)
        ts.append(time.perf_counter() - t)
    return min(ts)


def med(xs):
    return statistics.median(xs)


def p90(xs):
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def span(xs, fmt="{:.0f}"):
    return f"{fmt.format(med(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="also 1 GiB PUT/GET per client")
    ap.add_argument("--clients", default="boto3,boto3-nocrc,obstore")
    args = ap.parse_args()
    names = args.clients.split(",")
    size = args.size_mib * MiB
    data = os.urandom(size)
    rng = random.Random(7)

    with WeedServer() as srv:
        for k in WeedServer.ENV_UNSET:
            os.environ.pop(k, None)
        os.environ.update(srv.env())
        bucket = srv.bucket
        print(f"weed mini up in {srv.startup_seconds:.2f} s at {srv.endpoint_url}; "
              f"load avg {os.getloadavg()[0]:.2f}; {args.size_mib} MiB x {args.rounds} rounds",
              flush=True)
        r = {n: {k: [] for k in ("put", "put16x8", "get", "pget", "rng4M", "cpu_put",
                                 "cpu_get", "rng64K", "create", "ifmatch", "lose")}
             for n in names}
        # The first writes to a fresh bucket make its volumes (a collection per bucket):
        # not what a client costs, so one PUT per client first.
        for n in names:
            CLIENTS[n][0](bucket).put_big(f"warmup/{n}", data[:64 * MiB])
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for n in order:
                cls = CLIENTS[n][0]
                c, c16 = cls(bucket), cls(bucket, 16 * MiB, 8)
                key = f"big/{n}/{rnd}"
                dt, dc = timed(c.put_big, key, data)
                r[n]["put"].append(size / dt / 1e6)
                r[n]["cpu_put"].append(dc / (size / 2**30))
                dt, _ = timed(c16.put_big, key + "-16x8", data)
                r[n]["put16x8"].append(size / dt / 1e6)
                c.delete(key + "-16x8")
                dt, dc = timed(c.get, key)
                r[n]["get"].append(size / dt / 1e6)
                r[n]["cpu_get"].append(dc / (size / 2**30))
                dt, _ = timed(pget, c, key, size)
                r[n]["pget"].append(size / dt / 1e6)
                offs = [rng.randrange(0, size - 4 * MiB) for _ in range(24)]
                dt, _ = timed(lambda: [c.get_range(key, o, 4 * MiB) for o in offs])
                r[n]["rng4M"].append(24 * 4 * MiB / dt / 1e6)
                offs = [rng.randrange(0, size - 65536) for _ in range(100)]
                r[n]["rng64K"] += lat(lambda i: c.get_range(key, offs[i], 65536), 100)
                small = os.urandom(1024)
                pre = f"cond/{n}/{rnd}/{uuid.uuid4().hex}/"
                r[n]["create"] += lat(lambda i: c.create(f"{pre}{i}", small), 100)

                def lose(i):
                    try:
                        c.create(f"{pre}{i}", small)
                    except Conflict:
                        return
                    raise AssertionError("a second create won")
                r[n]["lose"] += lat(lose, 50)
                etag = [c.create(pre + "ref", small)]

                def adv(i):
                    etag[0] = c.update(pre + "ref", small, etag[0])
                r[n]["ifmatch"] += lat(adv, 100)
                c.delete(key)
                print(f"  round {rnd + 1} {n}: put {r[n]['put'][-1]:.0f} MB/s, "
                      f"get {r[n]['get'][-1]:.0f} MB/s", flush=True)

        big = {}
        if args.big:
            gdata = os.urandom(1 << 30)
            for n in names:
                c = CLIENTS[n][0](bucket)
                dt, _ = timed(c.put_big, f"big1g/{n}", gdata)
                dg, _ = timed(c.get, f"big1g/{n}")
                c.delete(f"big1g/{n}")
                big[n] = ((1 << 30) / dt / 1e6, (1 << 30) / dg / 1e6)
            del gdata

        t = time.perf_counter()
        races = {n: race(CLIENTS[n][0], bucket) for n in names}
        print(f"  races {time.perf_counter() - t:.1f} s", flush=True)
        forks = {n: fork_check(CLIENTS[n][0], bucket) for n in names}
        give_up = {n: give_up_seconds(n) for n in names}
        env = dict(os.environ)
        imports = {n: import_seconds(CLIENTS[n][2], env) for n in names}
        sizes = {n: install_mb(CLIENTS[n][1]) for n in names}
        versions = {n: md.version(CLIENTS[n][1]) for n in names}
        weed_version = subprocess.run([srv._argv()[0], "version"], capture_output=True,
                                      text=True).stdout.strip()

    rows = [
        ("version", lambda n: versions[n]),
        (f"put {args.size_mib} MiB MB/s, defaults", lambda n: span(r[n]["put"])),
        (f"put {args.size_mib} MiB MB/s, 16 MiB x 8", lambda n: span(r[n]["put16x8"])),
        (f"get {args.size_mib} MiB MB/s, 1 stream", lambda n: span(r[n]["get"])),
        (f"get {args.size_mib} MiB MB/s, 8 MiB x 8 thr", lambda n: span(r[n]["pget"])),
        ("ranged get 4 MiB MB/s", lambda n: span(r[n]["rng4M"])),
        ("ranged get 64 KiB ms med/p90",
         lambda n: f"{med(r[n]['rng64K']):.2f} / {p90(r[n]['rng64K']):.2f}"),
        ("PUT If-None-Match:* ms med/p90",
         lambda n: f"{med(r[n]['create']):.2f} / {p90(r[n]['create']):.2f}"),
        ("PUT If-Match ms med/p90",
         lambda n: f"{med(r[n]['ifmatch']):.2f} / {p90(r[n]['ifmatch']):.2f}"),
        ("losing create (412) ms med",
         lambda n: f"{med(r[n]['lose']):.2f}"),
        ("race 16 thr x 5: winners", lambda n: ",".join(map(str, races[n]))),
        ("new client in a fork()ed child", lambda n: forks[n]),
        ("dead endpoint: gives up after, s", lambda n: f"{give_up[n]:.1f}"),
        ("client CPU s/GiB put / get",
         lambda n: f"{med(r[n]['cpu_put']):.2f} / {med(r[n]['cpu_get']):.2f}"),
        ("import + client, s", lambda n: f"{imports[n]:.2f}"),
        ("install MB (with deps)", lambda n: f"{sizes[n][0]:.1f}"),
    ]
    if big:
        rows.insert(3, ("put / get 1 GiB MB/s", lambda n: f"{big[n][0]:.0f} / {big[n][1]:.0f}"))
    w0 = max(len(x[0]) for x in rows)
    print(f"\n{weed_version}; medians (min-max) of {args.rounds} rounds\n")
    print(f"| {'measure':<{w0}} | " + " | ".join(f"{n:<26}" for n in names) + " |")
    print(f"|{'-' * (w0 + 2)}|" + "|".join("-" * 28 for _ in names) + "|")
    for label, f in rows:
        print(f"| {label:<{w0}} | " + " | ".join(f"{f(n):<26}" for n in names) + " |")
    for n in names:
        print(f"{n} installs: {', '.join(sizes[n][1])}")


if __name__ == "__main__":
    main()
