"""The checkpoint-overhead benchmark behind ``snapstore bench``, usable as a library.

    from snapstore import bench
    result = bench.run([bench.Workload(size=64 << 20, dirty=0.01)])
    print(bench.format_table(result))

What one workload does (every method - snapstore and each baseline - in this process, on the
same bytes, interleaved step by step so all see the same machine conditions):

1. build the state: ``buffers`` bytearrays totalling ``size`` bytes (random, or compressible);
2. every method checkpoints it once (the first, full checkpoint: reported separately);
3. ``checkpoints`` times: mutate ``dirty`` of the state with ``pattern`` (untimed), then every
   method checkpoints it in turn, who goes first rotating (timed: the wall time the caller is
   blocked);
4. every method restores the latest and the oldest checkpoint into fresh memory,
   ``restore_repeats`` times (timed; with ``cache="cold"`` the method's files are first synced
   and dropped from the page cache with posix_fadvise(DONTNEED), so restores read the disk),
   and the first restore of each is checked byte for byte.

Methods: "snapstore" (the store; ``durability``, ``chunking``, ``compression`` apply);
"raw" (every buffer written to one new file per checkpoint, + fsync of file and directory when
durability is "fsync"); "pickle" (pickle.dump of the whole {name: bytearray} state, protocol 5,
to one file per checkpoint, + fsync); "numpy" (numpy.save of every buffer into one file per
checkpoint, + fsync; when numpy is importable); "restic" / "borg" (the state written to a file,
then ``restic backup`` / ``borg create`` of it; when the tool is on PATH). Baselines keep every
checkpoint (one file each), as a snapshot store must to restore old states.

Figures per method (keys of the result dicts, see ``METRIC_KEYS``): caller-blocked seconds per
checkpoint (median, p95 by nearest rank: with fewer than 20 checkpoints p95 is the maximum),
bytes written per checkpoint (write-syscall bytes of this process from /proc/self/io, which
includes the index; file growth for external tools), disk growth per checkpoint (allocated
blocks), restore seconds (latest, oldest; median of ``restore_repeats`` timings), and peak
memory: growth of the process's peak RSS (VmHWM, reset through /proc/self/clear_refs) over its
RSS before the call - C allocations included, unlike tracemalloc (for restic / borg: the tool
process's own peak RSS, from wait4). Baseline dicts carry ``vs_snapstore``: their figure
divided by snapstore's (so 30.0 means the baseline costs 30x what snapstore does).
"""
from __future__ import annotations

import bisect
import gc
import json
import math
import os
import pickle
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

import blake3

from snapstore.formatting import human_bytes, human_seconds
from snapstore.engine.segments import fsync_directory

PAGE = 4096
DIRTY_WRITE = 64                  # bytes overwritten in each dirty page
CLUSTER_PAGES = 64                # pages per run of the "clustered" pattern (256 KiB)
PATTERNS = ("scattered", "clustered", "shifted", "appended")
CONTENTS = ("random", "compressible")
CACHE_MODES = ("cold", "warm")
BASELINES = ("raw", "pickle", "numpy", "restic", "borg")
METHODS = ("snapstore",) + BASELINES
DEFAULT_SIZE = 256 << 20

# Keys of every method's result dict (None where not measured); "vs_snapstore" maps the
# ratio keys below to baseline / snapstore.
METRIC_KEYS = (
    "method", "available", "skipped", "first_checkpoint_seconds", "checkpoint_seconds",
    "bytes_written_per_checkpoint", "store_bytes", "growth_per_checkpoint_bytes",
    "restore_latest_seconds", "restore_oldest_seconds", "restore_samples", "peak_memory_bytes",
    "restore_peak_memory_bytes", "verified", "notes",
)
RATIO_KEYS = {
    "checkpoint_median": lambda r: r["checkpoint_seconds"]["median"],
    "checkpoint_p95": lambda r: r["checkpoint_seconds"]["p95"],
    "bytes_written": lambda r: r["bytes_written_per_checkpoint"]["median"],
    "growth": lambda r: r["growth_per_checkpoint_bytes"],
    "restore_latest": lambda r: r["restore_latest_seconds"],
    "restore_oldest": lambda r: r["restore_oldest_seconds"],
    "peak_memory": lambda r: r["peak_memory_bytes"],
}


class BenchError(Exception):
    """A benchmark cannot run as asked (bad workload, missing plotting library...)."""


@dataclass
class Workload:
    size: int = DEFAULT_SIZE          # bytes of state at the first checkpoint
    buffers: int = 4                  # the state is split into this many named buffers
    dirty: float = 0.01               # fraction of the state changed before each checkpoint
    pattern: str = "scattered"        # scattered | clustered | shifted | appended
    checkpoints: int = 5              # incremental checkpoints after the first, full one
    durability: str = "fsync"         # fsync | none (applies to the baselines too)
    chunking: str = "pages"           # snapstore: pages | cdc
    compression: str = "zstd"         # snapstore: zstd | none
    content: str = "random"           # random | compressible (about 2:1 for zstd)
    cache: str = "cold"               # restores from a cold or warm page cache
    seed: int = 0
    restore_repeats: int = 3          # each restore is timed this often; the median is kept

    def validate(self) -> "Workload":
        if not isinstance(self.size, int) or self.size < PAGE:
            raise BenchError(f"state size must be at least {PAGE} bytes, got {self.size!r}")
        if not isinstance(self.buffers, int) or not 1 <= self.buffers <= self.size // PAGE:
            raise BenchError(f"buffers must be from 1 to size/{PAGE}, got {self.buffers!r}")
        if not 0 <= self.dirty <= 1:
            raise BenchError(f"dirty fraction must be from 0 to 1, got {self.dirty!r}")
        if not isinstance(self.restore_repeats, int) or self.restore_repeats < 1:
            raise BenchError(f"restore_repeats must be an int >= 1, got {self.restore_repeats!r}")
        if not isinstance(self.checkpoints, int) or self.checkpoints < 1:
            raise BenchError(f"checkpoints must be an int >= 1, got {self.checkpoints!r}")
        for value, choices, what in ((self.pattern, PATTERNS, "pattern"),
                                     (self.content, CONTENTS, "content"),
                                     (self.cache, CACHE_MODES, "cache"),
                                     (self.durability, ("fsync", "none"), "durability"),
                                     (self.chunking, ("pages", "cdc"), "chunking"),
                                     (self.compression, ("zstd", "none"), "compression")):
            if value not in choices:
                raise BenchError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
        return self

    def describe(self) -> str:
        what = {"scattered": "scattered pages", "clustered": f"{CLUSTER_PAGES}-page runs",
                "shifted": "bytes inserted (content shifted)",
                "appended": "bytes appended"}[self.pattern]
        return (f"{human_bytes(self.size)} in {self.buffers} buffer(s), {self.dirty:.4g} of "
                f"state dirty per checkpoint as {what}, 1 full + {self.checkpoints} "
                f"checkpoints, durability={self.durability}, chunking={self.chunking}, "
                f"compression={self.compression}, {self.content} content, "
                f"{self.cache} cache restores")


# ---- the state and its mutations ---------------------------------------------------------
_COMPRESSIBLE = bytes(i & 0x0F for i in range(256))   # 4 bits of entropy per byte


def _bytes(seed: bytes, n: int, content: str) -> bytes:
    data = blake3.blake3(seed).digest(length=n) if n else b""
    return data.translate(_COMPRESSIBLE) if content == "compressible" else data


def make_state(w: Workload) -> dict:
    """{name: bytearray}: `w.size` bytes split page-aligned over `w.buffers` buffers."""
    pages = w.size // PAGE
    state = {}
    for i in range(w.buffers):
        n = (pages // w.buffers + (1 if i < pages % w.buffers else 0)) * PAGE
        if i == w.buffers - 1:
            n += w.size - pages * PAGE      # the remainder that is not a whole page
        state[f"buf{i:03d}"] = bytearray(_bytes(b"snapstore-bench/%d/%d" % (w.seed, i), n,
                                                w.content))
    return state


def mutate(state: dict, w: Workload, step: int) -> int:
    """Changes the state for checkpoint `step` (deterministic per seed and step). Returns the
    number of bytes written into the state."""
    rng = random.Random(f"{w.seed}/{step}")
    names = list(state)
    dirty_bytes = 0

    def scribble(n: int) -> bytes:
        return _bytes(rng.randbytes(16), n, w.content)

    if w.pattern in ("scattered", "clustered"):
        sizes = [len(state[n]) // PAGE for n in names]
        total = sum(sizes)
        k = min(total, round(w.dirty * total))
        if w.pattern == "scattered":
            chosen = rng.sample(range(total), k) if k else []
        else:                                   # runs of CLUSTER_PAGES consecutive pages
            runs = math.ceil(k / CLUSTER_PAGES) if k else 0
            starts = rng.sample(range(max(1, total - CLUSTER_PAGES + 1)), min(runs, total))
            chosen = sorted({p for s in starts for p in range(s, min(total, s + CLUSTER_PAGES))})
            chosen = chosen[:k] if len(chosen) > k else chosen
        bounds, acc = [], 0
        for s in sizes:
            bounds.append(acc)
            acc += s
        for page in chosen:
            b = bisect.bisect_right(bounds, page) - 1
            buf = state[names[b]]
            at = (page - bounds[b]) * PAGE + rng.randrange(PAGE - DIRTY_WRITE + 1)
            buf[at:at + DIRTY_WRITE] = scribble(DIRTY_WRITE)
            dirty_bytes += DIRTY_WRITE
    elif w.pattern == "shifted":               # insert bytes, drop as many at the end
        for n in names:
            buf = state[n]
            m = min(len(buf), round(w.dirty * len(buf)))
            if m:
                at = rng.randrange(len(buf) - m + 1)
                buf[at:at] = scribble(m)
                del buf[-m:]
                dirty_bytes += m
    else:                                       # appended: buffers grow
        per = round(w.dirty * w.size / len(names))
        for n in names:
            if per:
                state[n] += scribble(per)
                dirty_bytes += per
    return dirty_bytes


def digest(state: dict) -> dict:
    """{name: BLAKE3 hex digest} of a state (any buffer-protocol values)."""
    return {n: blake3.blake3(memoryview(v).cast("B"), max_threads=blake3.blake3.AUTO).hexdigest()
            for n, v in state.items()}


# ---- measurement helpers -------------------------------------------------------------------
def _proc_status(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _write_syscall_bytes() -> Optional[int]:
    try:
        with open("/proc/self/io") as f:
            for line in f:
                if line.startswith("wchar:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class PeakMemory:
    """Peak RSS growth of this process during a `with` block, via VmHWM after resetting it
    through /proc/self/clear_refs ("5"). .extra is None where that is unavailable."""

    def __init__(self) -> None:
        self.extra: Optional[int] = None
        self._base: Optional[int] = None

    @staticmethod
    def supported() -> bool:
        return os.path.exists("/proc/self/clear_refs") and _proc_status("VmHWM") is not None

    def __enter__(self) -> "PeakMemory":
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self._base = _proc_status("VmRSS")
        except OSError:
            self._base = None
        return self

    def __exit__(self, *exc) -> None:
        hwm = _proc_status("VmHWM")
        if self._base is not None and hwm is not None:
            self.extra = max(0, hwm - self._base)


class Timed:
    """Wall time, write-syscall bytes and peak memory of a `with` block (GC off inside)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.written: Optional[int] = None
        self.peak: Optional[int] = None

    def __enter__(self) -> "Timed":
        gc.collect()
        self._gc = gc.isenabled()
        gc.disable()
        self._mem = PeakMemory().__enter__()
        self._w0 = _write_syscall_bytes()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.perf_counter() - self._t0
        w1 = _write_syscall_bytes()
        self._mem.__exit__()
        if self._gc:
            gc.enable()
        self.peak = self._mem.extra
        if w1 is not None and self._w0 is not None:
            self.written = w1 - self._w0


def percentile(values, p: float) -> float:
    """Nearest-rank percentile (no interpolation: p95 of 5 samples is the maximum)."""
    v = sorted(values)
    if not v:
        return float("nan")
    return v[max(0, math.ceil(p / 100.0 * len(v)) - 1)]


def summary(values) -> dict:
    v = list(values)
    s = sorted(v)
    mid = len(s) // 2
    median = s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
    return {"median": median, "p95": percentile(v, 95), "min": min(v), "max": max(v),
            "mean": sum(v) / len(v), "samples": v}


def disk_usage(path: str) -> int:
    """Allocated bytes (st_blocks) of every file under path."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total


def drop_cache(path: str) -> None:
    """Syncs every file under path and asks the kernel to drop its cached pages."""
    if not hasattr(os, "posix_fadvise"):
        return
    for root, _, files in os.walk(path):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except OSError:
                continue
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            except OSError:
                pass
            finally:
                os.close(fd)



def fs_type(path: str) -> str:
    """The file system type of the mount holding path ('' when unknown)."""
    best, kind = "", ""
    real = os.path.realpath(path)
    try:
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1].replace("\\040", " ")
                    if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and \
                            len(mnt) >= len(best):
                        best, kind = mnt, parts[2]
    except OSError:
        pass
    return kind


def _loadavg() -> Optional[list]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def machine_info(workdir: str) -> dict:
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    from snapstore import __version__
    info = {"snapstore": __version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "memory_bytes": mem, "bench_dir": workdir, "bench_fs": fs_type(workdir),
            "loadavg_before": _loadavg()}
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    return info


# ---- methods ----------------------------------------------------------------------------------
class Method:
    """One way of checkpointing the state: setup(), checkpoint(state, step) (timed by the
    caller), restore(step) -> {name: bytes-like} (timed), close()."""
    name = ""
    notes = ""

    def __init__(self, w: Workload, directory: str) -> None:
        self.w = w
        self.dir = directory
        self.sizes: list = []        # per step: {name: size}

    @classmethod
    def unavailable(cls) -> Optional[str]:
        """Why this method cannot run here, or None."""
        return None

    def setup(self) -> None:
        os.makedirs(self.dir, exist_ok=True)

    def checkpoint(self, state: dict, step: int) -> None:
        raise NotImplementedError

    def restore(self, step: int) -> dict:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def _sync(self, f) -> None:
        if self.w.durability == "fsync":
            f.flush()
            os.fsync(f.fileno())

    def _path(self, step: int, ext: str) -> str:
        return os.path.join(self.dir, f"ckpt{step:05d}.{ext}")

    def _finish_file(self) -> None:
        if self.w.durability == "fsync":
            fsync_directory(self.dir)


class SnapstoreMethod(Method):
    name = "snapstore"

    def setup(self) -> None:
        from snapstore import open as open_store
        self.store = open_store(os.path.join(self.dir, "store"), durability=self.w.durability,
                                chunking=self.w.chunking, compression=self.w.compression)
        self.ids: list = []
        self.infos: list = []

    def checkpoint(self, state: dict, step: int) -> None:
        info = self.store.checkpoint(state, stream="bench", meta={"step": step})
        self.ids.append(info.id)
        self.infos.append(info)

    def restore(self, step: int) -> dict:
        return self.store.restore(self.ids[step])

    def close(self) -> None:
        self.store.close()


class RawMethod(Method):
    name = "raw"

    def checkpoint(self, state: dict, step: int) -> None:
        with open(self._path(step, "bin"), "wb", buffering=0) as f:
            for buf in state.values():
                f.write(buf)
            self._sync(f)
        self._finish_file()
        self.sizes.append({n: len(b) for n, b in state.items()})

    def restore(self, step: int) -> dict:
        out = {}
        with open(self._path(step, "bin"), "rb", buffering=0) as f:
            for name, size in self.sizes[step].items():
                out[name] = f.read(size)
        return out


class PickleMethod(Method):
    name = "pickle"

    def checkpoint(self, state: dict, step: int) -> None:
        with open(self._path(step, "pkl"), "wb") as f:
            pickle.dump(state, f, protocol=5)
            self._sync(f)
        self._finish_file()

    def restore(self, step: int) -> dict:
        with open(self._path(step, "pkl"), "rb") as f:
            return pickle.load(f)


class NumpyMethod(Method):
    name = "numpy"

    @classmethod
    def unavailable(cls) -> Optional[str]:
        try:
            import numpy  # noqa: F401
        except ImportError:
            return "numpy is not installed"
        return None

    def checkpoint(self, state: dict, step: int) -> None:
        import numpy as np
        with open(self._path(step, "npy"), "wb") as f:
            for buf in state.values():
                np.save(f, np.frombuffer(buf, dtype=np.uint8), allow_pickle=False)
            self._sync(f)
        self._finish_file()
        self.sizes.append(list(state))

    def restore(self, step: int) -> dict:
        import numpy as np
        with open(self._path(step, "npy"), "rb") as f:
            return {name: np.load(f, allow_pickle=False) for name in self.sizes[step]}


class _ExternalTool(Method):
    """A backup tool run as a child process on the state written to one file."""
    tool = ""

    @classmethod
    def unavailable(cls) -> Optional[str]:
        return None if shutil.which(cls.tool) else f"{cls.tool} not found on PATH"

    def setup(self) -> None:
        super().setup()
        self.max_rss = 0
        self.repo = os.path.join(self.dir, "repo")
        self.work = os.path.join(self.dir, "work")
        os.makedirs(self.work)
        self.env = dict(os.environ)
        self._init_repo()

    def _run(self, *argv, cwd=None) -> str:
        """Runs the tool; records its peak RSS (wait4's rusage of exactly this child)."""
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(argv, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=err)
            try:
                _, status, usage = os.wait4(proc.pid, 0)
            except BaseException:
                proc.kill()
                proc.wait()
                raise
            proc.returncode = os.waitstatus_to_exitcode(status)
            self.max_rss = max(self.max_rss, usage.ru_maxrss * 1024)
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode(errors="replace")
            stderr = err.read().decode(errors="replace")
        if proc.returncode != 0:
            raise BenchError(f"{' '.join(argv[:2])} failed ({proc.returncode}): "
                             f"{stderr.strip()[-300:]}")
        return stdout

    def checkpoint(self, state: dict, step: int) -> None:
        path = os.path.join(self.work, "state.bin")
        with open(path, "wb", buffering=0) as f:
            for buf in state.values():
                f.write(buf)
        self._backup(step)
        self.sizes.append({n: len(b) for n, b in state.items()})

    def restore(self, step: int) -> dict:
        target = tempfile.mkdtemp(dir=self.dir, prefix="restore-")
        try:
            path = self._restore_file(step, target)
            out = {}
            with open(path, "rb", buffering=0) as f:
                for name, size in self.sizes[step].items():
                    out[name] = f.read(size)
            return out
        finally:
            shutil.rmtree(target, ignore_errors=True)

    def _init_repo(self) -> None:
        raise NotImplementedError

    def _backup(self, step: int) -> None:
        raise NotImplementedError

    def _restore_file(self, step: int, target: str) -> str:
        raise NotImplementedError


class ResticMethod(_ExternalTool):
    name = tool = "restic"
    notes = "peak memory is restic's own max RSS; bytes written is the repository's growth"

    def _init_repo(self) -> None:
        self.env["RESTIC_PASSWORD"] = "snapstore-bench"
        self.env["RESTIC_REPOSITORY"] = self.repo
        self._run("restic", "init", "--quiet")
        self.snapshots: list = []

    def _backup(self, step: int) -> None:
        out = self._run("restic", "backup", "--json", "--quiet", "state.bin", cwd=self.work)
        snap = None
        for line in out.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("message_type") == "summary":
                snap = msg.get("snapshot_id")
        if snap is None:
            raise BenchError("restic backup printed no snapshot id")
        self.snapshots.append(snap)

    def _restore_file(self, step: int, target: str) -> str:
        self._run("restic", "restore", "--quiet", self.snapshots[step], "--target", target)
        for root, _, files in os.walk(target):
            if "state.bin" in files:
                return os.path.join(root, "state.bin")
        raise BenchError("restic restore produced no state.bin")


class BorgMethod(_ExternalTool):
    name = tool = "borg"
    notes = "peak memory is borg's own max RSS; bytes written is the repository's growth"

    def _init_repo(self) -> None:
        self.env["BORG_PASSPHRASE"] = ""
        self.env["BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK"] = "yes"
        self.env["BORG_RELOCATED_REPO_ACCESS_IS_OK"] = "yes"
        self._run("borg", "init", "--encryption=none", self.repo)

    def _backup(self, step: int) -> None:
        self._run("borg", "create", f"{self.repo}::ckpt{step:05d}", "state.bin", cwd=self.work)

    def _restore_file(self, step: int, target: str) -> str:
        self._run("borg", "extract", f"{self.repo}::ckpt{step:05d}", cwd=target)
        return os.path.join(target, "state.bin")


METHOD_CLASSES = {c.name: c for c in (SnapstoreMethod, RawMethod, PickleMethod, NumpyMethod,
                                      ResticMethod, BorgMethod)}


def available_methods(requested=None) -> dict:
    """{method: None if it can run here, else the reason it cannot}."""
    names = list(METHODS) if requested is None else list(requested)
    out = {}
    for n in names:
        if n not in METHOD_CLASSES:
            raise BenchError(f"unknown method {n!r}; choose from {', '.join(METHODS)}")
        out[n] = METHOD_CLASSES[n].unavailable()
    return out


# ---- running ------------------------------------------------------------------------------
def _skipped(name: str, reason: str) -> dict:
    res = {k: None for k in METRIC_KEYS}
    res.update(method=name, available=False, skipped=reason, notes="")
    return res


def _settle() -> None:
    """Flushes dirty pages system-wide so one method's write-back (or the deletion of its
    files) does not slow the next method's fsyncs."""
    if hasattr(os, "sync"):
        os.sync()


class _Track:
    """What run_workload records for one method while it runs."""

    def __init__(self, method: Method) -> None:
        self.method = method
        self.external = isinstance(method, _ExternalTool)
        self.first = 0.0
        self.times: list = []
        self.written: list = []
        self.peaks: list = []
        self.restore: dict = {"latest": [], "oldest": []}
        self.restore_peaks: list = []
        self.verified = True
        self.size_before = 0
        self.after_first = 0
        self.final = 0
        self.error: Optional[str] = None

    def result(self, w: Workload) -> dict:
        m = self.method
        restore = {k: summary(v) for k, v in self.restore.items()}
        peak = (m.max_rss if self.external else
                (max(self.peaks) if self.peaks and None not in self.peaks else None))
        res = {
            "method": m.name, "available": True, "skipped": None,
            "first_checkpoint_seconds": self.first,
            "checkpoint_seconds": summary(self.times),
            "bytes_written_per_checkpoint": summary(
                [x if x is not None else 0 for x in self.written]),
            "store_bytes": self.final - self.size_before,
            "growth_per_checkpoint_bytes": (self.final - self.after_first) / w.checkpoints,
            "restore_latest_seconds": restore["latest"]["median"],
            "restore_oldest_seconds": restore["oldest"]["median"],
            "restore_samples": {k: v["samples"] for k, v in restore.items()},
            "peak_memory_bytes": peak,
            "restore_peak_memory_bytes": (None if self.external or None in self.restore_peaks
                                          else max(self.restore_peaks)),
            "verified": self.verified,
            "notes": m.notes,
        }
        if isinstance(m, SnapstoreMethod):
            res["snapstore"] = {
                "kinds": [i.kind for i in m.infos],
                "bytes_new": [i.bytes_new for i in m.infos],
                "chain_length_latest": m.infos[-1].chain_length,
                "stats": m.store.stats(),
            }
        return res


def _rotate(items: list, k: int) -> list:
    """The methods take turns being first, so none always runs right after a big writer."""
    if not items:
        return items
    k %= len(items)
    return items[k:] + items[:k]


def add_ratios(results: dict) -> None:
    """Adds "vs_snapstore" (baseline figure / snapstore figure) to every baseline's dict."""
    ref = results.get("snapstore")
    if not ref or not ref.get("available"):
        return
    for name, res in results.items():
        if name == "snapstore" or not res.get("available"):
            continue
        ratios = {}
        for key, get in RATIO_KEYS.items():
            try:
                a, b = get(res), get(ref)
            except (KeyError, TypeError):
                a = b = None
            ratios[key] = (a / b) if a is not None and b else None
        res["vs_snapstore"] = ratios


def run_workload(w: Workload, *, methods=None, workdir: Optional[str] = None,
                 tick: Callable[[str], None] = lambda _: None) -> dict:
    """Measures every method on one workload. Returns {"workload": ..., "results": ...}.

    The methods run interleaved on one state: each checkpoint step mutates the state once,
    then every method checkpoints it in turn (rotating who goes first); restores likewise.
    So every method sees the same bytes and the same machine conditions (a VM disk's burst
    budget, other load), and no method is measured right after its own big writes only.
    A baseline that fails (a tool's error, disk full...) is reported as failed, not fatal.
    """
    w.validate()
    names = list(METHODS) if methods is None else list(methods)
    if "snapstore" not in names:
        names.insert(0, "snapstore")
    reasons = available_methods(names)     # validates names
    own = workdir is None
    workdir = tempfile.mkdtemp(prefix="snapstore-bench-") if own else workdir
    results: dict = {n: _skipped(n, reasons[n]) for n in names if reasons[n]}
    tracks: dict = {}

    def fail(name: str, exc: BaseException) -> None:
        if name == "snapstore" or not isinstance(exc, (BenchError, OSError)):
            raise exc
        t = tracks.pop(name)
        results[name] = _skipped(name, f"failed: {exc}")
        _close(t.method)

    def each(order: list, fn) -> None:
        for name in order:
            if name in tracks:
                try:
                    fn(name, tracks[name])
                except Exception as exc:     # noqa: BLE001 - fail() re-raises what is fatal
                    fail(name, exc)

    try:
        for name in names:
            if reasons[name]:
                continue
            directory = tempfile.mkdtemp(dir=workdir, prefix=f"{name}-")
            method = METHOD_CLASSES[name](w, directory)
            tracks[name] = _Track(method)
            try:
                method.setup()
            except Exception as exc:   # noqa: BLE001
                fail(name, exc)
        state = make_state(w)
        expected = {0: digest(state)}
        _settle()

        def first(name, t):
            t.size_before = disk_usage(t.method.dir)
            with Timed() as tm:
                t.method.checkpoint(state, 0)
            t.first = tm.seconds
            t.after_first = disk_usage(t.method.dir)
            tick(f"{name}: checkpoint 0")
        each(list(tracks), first)

        for step in range(1, w.checkpoints + 1):
            mutate(state, w, step)

            def checkpoint(name, t, step=step):
                before = disk_usage(t.method.dir) if t.external else 0
                with Timed() as tm:
                    t.method.checkpoint(state, step)
                t.times.append(tm.seconds)
                t.written.append(disk_usage(t.method.dir) - before if t.external
                                 else tm.written)
                t.peaks.append(tm.peak)
                tick(f"{name}: checkpoint {step}")
            each(_rotate(list(tracks), step), checkpoint)

        last = w.checkpoints
        expected[last] = digest(state)
        del state
        for t in tracks.values():
            t.final = disk_usage(t.method.dir)
        _settle()

        for rep in range(w.restore_repeats):
            for label, step in (("latest", last), ("oldest", 0)):
                def restore(name, t, label=label, step=step, rep=rep):
                    if w.cache == "cold":
                        drop_cache(t.method.dir)
                    with Timed() as tm:
                        got = t.method.restore(step)
                    t.restore[label].append(tm.seconds)
                    t.restore_peaks.append(tm.peak)
                    if rep == 0:
                        t.verified = t.verified and digest(got) == expected[step]
                    del got
                    tick(f"{name}: restore {label}")
                each(_rotate(list(tracks), rep), restore)

        for name, t in tracks.items():
            results[name] = t.result(w)
        add_ratios(results)
        return {"workload": asdict(w), "description": w.describe(),
                "results": {n: results[n] for n in names}}
    finally:
        for t in tracks.values():
            _close(t.method)
        _settle()
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def _close(method: Method) -> None:
    try:
        method.close()
    finally:
        shutil.rmtree(method.dir, ignore_errors=True)


def steps_per_workload(w: Workload, methods) -> int:
    """How many tick() calls run_workload makes (for a progress bar)."""
    runnable = [m for m, why in available_methods(methods).items() if why is None]
    if "snapstore" not in runnable:
        runnable.append("snapstore")
    return len(runnable) * (w.checkpoints + 1 + 2 * w.restore_repeats)


def run(workloads, *, methods=None, workdir: Optional[str] = None,
        tick: Callable[[str], None] = lambda _: None, argv=None) -> dict:
    """Runs every workload; the JSON-ready result of ``snapstore bench --json``."""
    workloads = [w.validate() for w in workloads]
    if not workloads:
        raise BenchError("no workload to run")
    base = tempfile.mkdtemp(prefix="snapstore-bench-", dir=workdir)
    try:
        started = time.time()
        out = {
            "machine": machine_info(base),
            "command": list(sys.argv if argv is None else argv),
            "started": started,
            "methods": {m: (why or "ok") for m, why in available_methods(
                list(METHODS) if methods is None else methods).items()},
            "workloads": [run_workload(w, methods=methods, workdir=base, tick=tick)
                          for w in workloads],
        }
        out["seconds"] = time.time() - started
        out["machine"]["loadavg_after"] = _loadavg()
        return out
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---- output ---------------------------------------------------------------------------------
COLUMNS = (
    ("ckpt median", lambda r: r["checkpoint_seconds"]["median"], human_seconds, "checkpoint_median"),
    ("ckpt p95", lambda r: r["checkpoint_seconds"]["p95"], human_seconds, "checkpoint_p95"),
    ("written/ckpt", lambda r: r["bytes_written_per_checkpoint"]["median"], human_bytes,
     "bytes_written"),
    ("growth/ckpt", lambda r: r["growth_per_checkpoint_bytes"], human_bytes, "growth"),
    ("restore latest", lambda r: r["restore_latest_seconds"], human_seconds, "restore_latest"),
    ("restore oldest", lambda r: r["restore_oldest_seconds"], human_seconds, "restore_oldest"),
    ("peak mem", lambda r: r["peak_memory_bytes"], human_bytes, "peak_memory"),
)


def _cell(res: dict, get, fmt, ratio_key) -> str:
    try:
        value = get(res)
    except (KeyError, TypeError):
        value = None
    if value is None:
        return "n/a"
    text = fmt(value)
    ratio = (res.get("vs_snapstore") or {}).get(ratio_key)
    if ratio is not None:
        text += f" ({ratio:.1f}x)" if ratio < 100 else f" ({ratio:.0f}x)"
    return text


def format_table(result: dict) -> str:
    """The terminal table of a run() result (every workload)."""
    lines = []
    for wl in result["workloads"]:
        lines.append(f"workload: {wl['description']}")
        header = ["method"] + [c[0] for c in COLUMNS]
        rows = []
        skipped = []
        for name, res in wl["results"].items():
            if not res.get("available"):
                skipped.append(f"{name} ({res.get('skipped')})")
                continue
            row = [name if res.get("verified", True) else name + " (RESTORE MISMATCH)"]
            row += [_cell(res, get, fmt, key) for _, get, fmt, key in COLUMNS]
            rows.append(row)
        widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
        for r in [header] + rows:
            lines.append("  ".join(c.ljust(widths[i]) if i == 0 else c.rjust(widths[i])
                                   for i, c in enumerate(r)).rstrip())
        snap = wl["results"].get("snapstore") or {}
        if snap.get("available"):
            lines.append(f"snapstore first (full) checkpoint: "
                         f"{human_seconds(snap['first_checkpoint_seconds'])}; kinds: "
                         f"{', '.join(snap.get('snapstore', {}).get('kinds', []))}")
        if skipped:
            lines.append("skipped: " + "; ".join(skipped))
        lines.append("")
    lines.append("(Nx) = the baseline's figure divided by snapstore's. ckpt = caller-blocked "
                 "wall time of the incremental checkpoints (p95 by nearest rank); written = "
                 "write() bytes incl. the index; growth = disk blocks; restore = median of "
                 "repeated restores into fresh memory; peak mem = peak RSS growth during a "
                 "checkpoint.")
    m = result.get("machine", {})
    if m:
        lines.append(f"machine: {m.get('cpu', '?')}, {m.get('cpus', '?')} cpus, "
                     f"{human_bytes(m['memory_bytes']) if m.get('memory_bytes') else '?'} RAM, "
                     f"Python {m.get('python')}, bench dir on {m.get('bench_fs') or '?'}"
                     + (f", load average {m['loadavg_before'][0]} before / "
                        f"{m['loadavg_after'][0]} after" if m.get("loadavg_before") and
                        m.get("loadavg_after") else ""))
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Writes a PNG: median caller-blocked checkpoint time vs dirty fraction, one line per
    method (and pattern, when the run had several). Needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError("--plot needs matplotlib, which is not installed "
                         "(pip install matplotlib); the measurements ran and are in the "
                         "table / --json output") from None
    series: dict = {}
    patterns = {wl["workload"]["pattern"] for wl in result["workloads"]}
    for wl in result["workloads"]:
        x = wl["workload"]["dirty"]
        for name, res in wl["results"].items():
            if not res.get("available"):
                continue
            label = name if len(patterns) == 1 else f"{name} ({wl['workload']['pattern']})"
            series.setdefault(label, []).append((x, res["checkpoint_seconds"]["median"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in sorted(series.items(), key=lambda kv: (not kv[0].startswith("snapstore"),
                                                              kv[0])):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], marker="o", label=label,
                linewidth=2.5 if label.startswith("snapstore") else 1.5)
    xs = sorted({wl["workload"]["dirty"] for wl in result["workloads"]})
    if xs and xs[0] > 0 and len(xs) > 1 and xs[-1] / xs[0] >= 10:
        ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("dirty fraction of the state per checkpoint")
    ax.set_ylabel("caller-blocked time per checkpoint (ms, median)")
    first = result["workloads"][0]["workload"]
    ax.set_title(f"checkpoint overhead: {human_bytes(first['size'])} state, "
                 f"durability={first['durability']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def to_json(result: dict) -> str:
    def clean(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o
    return json.dumps(clean(result), indent=2)
