"""How the harness measures: wall time, write-syscall bytes and peak memory of a block (Timed,
PeakMemory), statistics of samples (percentile, summary), disk usage, dropping the page cache,
settling write-back, and a description of the machine."""
from __future__ import annotations

import gc
import math
import os
import platform
import time
from typing import Optional

from snapstore.version import __version__

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
    """median, p95 (nearest rank), min, max, mean and the samples themselves."""
    v = list(values)
    s = sorted(v)
    mid = len(s) // 2
    median = s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
    return {"median": median, "p95": percentile(v, 95), "min": min(v), "max": max(v),
            "mean": sum(v) / len(v), "samples": v}


def summary_if_measured(values) -> dict:
    """summary(values); when a value was not measured (None), the same keys with every figure
    None (the samples kept), so it shows as n/a, never as 0."""
    v = list(values)
    if None not in v:
        return summary(v)
    return {"median": None, "p95": None, "min": None, "max": None, "mean": None, "samples": v}


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


def free_space(path: str) -> Optional[int]:
    """Bytes free for this user on the file system of path (None when it cannot be told)."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


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


def settle() -> None:
    """Flushes dirty pages system-wide so one method's write-back (or the deletion of its
    files) does not slow the next method's fsyncs."""
    if hasattr(os, "sync"):
        os.sync()


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


def loadavg() -> Optional[list]:
    """The 1, 5 and 15 minute load averages (None where unknown)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):
        return None


def physical_memory() -> Optional[int]:
    """Bytes of physical memory (None when the system does not tell)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def machine_info(workdir: str) -> dict:
    """What the figures depend on: versions, CPU, memory, the file system of workdir, load."""
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = physical_memory()
    info = {"snapstore": __version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "memory_bytes": mem, "bench_dir": workdir, "bench_fs": fs_type(workdir),
            "loadavg_before": loadavg()}
    try:
        import numpy
        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    return info
