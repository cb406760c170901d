"""The synthetic state a benchmark checkpoints and how it changes between checkpoints: the
Workload (what to measure), make_state (build it), mutate (change it, deterministically per
seed and step) and digest (check a restore byte for byte)."""
from __future__ import annotations

import bisect
import math
import numbers
import operator
import random
from dataclasses import dataclass

import blake3

from snapstore.bench.errors import BenchError
from snapstore.formatting import human_bytes

PAGE = 4096
DIRTY_WRITE = 64                  # bytes overwritten in each dirty page
CLUSTER_PAGES = 64                # pages per run of the "clustered" pattern (256 KiB)
PATTERNS = ("scattered", "clustered", "shifted", "appended")
CONTENTS = ("random", "compressible")
CACHE_MODES = ("cold", "warm")
DURABILITIES = ("fsync", "none")
CHUNKINGS = ("pages", "cdc")
COMPRESSIONS = ("zstd", "none")
DEFAULT_SIZE = 256 << 20


@dataclass
class Workload:
    """One benchmark configuration: the state, how it changes and how it is stored."""
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
        """self, or BenchError naming the first field of a wrong type or out of range. The
        integer fields take any integral number (a numpy integer too: operator.index) and
        the dirty fraction any real one; they are stored back as int and float."""
        self.size = _integer(self.size, "state size")
        if self.size < PAGE:
            raise BenchError(f"state size must be at least {PAGE} bytes, got {self.size}")
        self.buffers = _integer(self.buffers, "buffers")
        if self.buffers < 1:
            raise BenchError(f"buffers must be at least 1, got {self.buffers}")
        if self.buffers > self.size // PAGE:
            raise BenchError(f"{self.buffers} buffers need a state of at least "
                             f"{self.buffers * PAGE} bytes (a page of {PAGE} bytes each), got "
                             f"{self.size}: give a larger size or fewer buffers")
        if isinstance(self.dirty, bool) or not isinstance(self.dirty, numbers.Real):
            raise BenchError(f"dirty fraction must be a number, got {_typed(self.dirty)}")
        self.dirty = float(self.dirty)
        if not 0 <= self.dirty <= 1:
            raise BenchError(f"dirty fraction must be from 0 to 1, got {self.dirty!r}")
        self.seed = _integer(self.seed, "seed")
        self.restore_repeats = _integer(self.restore_repeats, "restore_repeats")
        if self.restore_repeats < 1:
            raise BenchError(f"restore_repeats must be at least 1, got {self.restore_repeats}")
        self.checkpoints = _integer(self.checkpoints, "checkpoints")
        if self.checkpoints < 1:
            raise BenchError(f"checkpoints must be at least 1, got {self.checkpoints}")
        for value, choices, what in ((self.pattern, PATTERNS, "pattern"),
                                     (self.content, CONTENTS, "content"),
                                     (self.cache, CACHE_MODES, "cache"),
                                     (self.durability, DURABILITIES, "durability"),
                                     (self.chunking, CHUNKINGS, "chunking"),
                                     (self.compression, COMPRESSIONS, "compression")):
            if value not in choices:
                raise BenchError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
        return self

    def changed_fraction(self) -> float:
        """The fraction of the state a checkpoint step changes in fact: the dirty fraction
        rounded to whole pages (scattered, clustered) or bytes (shifted, appended)."""
        pages = self.size // PAGE
        if self.pattern in ("scattered", "clustered"):
            return min(pages, round(self.dirty * pages)) / pages
        if self.pattern == "appended":
            return appended_per_buffer(self) * self.buffers / self.size
        return sum(min(n, round(self.dirty * n)) for n in _buffer_sizes(self)) / self.size

    def describe(self) -> str:
        """One line for people (the table's "workload:" line)."""
        what = {"scattered": "scattered pages", "clustered": f"{CLUSTER_PAGES}-page runs",
                "shifted": "bytes inserted (content shifted)",
                "appended": "bytes appended"}[self.pattern]
        # the fraction changed in fact (whole pages or bytes) where it is not the one asked:
        # a run of 0.001 of 256 pages changes none, and must not say it measured 0.001
        changed = self.changed_fraction()
        dirty = f"{self.dirty:.4g}" if math.isclose(changed, self.dirty, rel_tol=1e-3) else \
            f"{self.dirty:.4g} (in fact {changed:.4g}, in whole pages or bytes)"
        return (f"{human_bytes(self.size)} in {self.buffers} buffer(s), {dirty} of "
                f"state dirty per checkpoint as {what}, 1 full + {self.checkpoints} "
                f"checkpoints, durability={self.durability}, chunking={self.chunking}, "
                f"compression={self.compression}, {self.content} content, "
                f"{self.cache} cache restores")


def _typed(value) -> str:
    """A value with its type, for a message that blames the type: "float 1048576.0"."""
    return f"{type(value).__name__} {value!r}"


def _integer(value, what: str) -> int:
    """value as an int: an int or an integral number type (numpy's: operator.index), never a
    bool (True is not a count) or a float (1e6 would pass silently rounded); else a
    BenchError that names the type."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise BenchError(f"{what} must be an int, got {_typed(value)}")


_COMPRESSIBLE = bytes(i & 0x0F for i in range(256))   # 4 bits of entropy per byte


def _bytes(seed: bytes, n: int, content: str) -> bytes:
    data = blake3.blake3(seed).digest(length=n) if n else b""
    return data.translate(_COMPRESSIBLE) if content == "compressible" else data


def _buffer_sizes(w: Workload) -> list:
    """The bytes of each of the state's buffers: `w.size` split page-aligned."""
    pages = w.size // PAGE
    sizes = []
    for i in range(w.buffers):
        n = (pages // w.buffers + (1 if i < pages % w.buffers else 0)) * PAGE
        if i == w.buffers - 1:
            n += w.size - pages * PAGE      # the remainder that is not a whole page
        sizes.append(n)
    return sizes


def make_state(w: Workload) -> dict:
    """{name: bytearray}: `w.size` bytes split page-aligned over `w.buffers` buffers."""
    return {f"buf{i:03d}": bytearray(_bytes(b"snapstore-bench/%d/%d" % (w.seed, i), n,
                                            w.content))
            for i, n in enumerate(_buffer_sizes(w))}


def appended_per_buffer(w: Workload) -> int:
    """Bytes the "appended" pattern adds to each buffer before each checkpoint."""
    return round(w.dirty * w.size / w.buffers)


def state_size(w: Workload, step: int) -> int:
    """Bytes of state at checkpoint `step` (0: the first, full one): w.size, but for the
    "appended" pattern, which grows the state at every checkpoint."""
    if w.pattern == "appended":
        return w.size + step * appended_per_buffer(w) * w.buffers
    return w.size


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
            # distinct aligned runs (overlapping ones changed fewer pages than asked), the
            # last one cut to make exactly k; one run more than needed in case one drawn is
            # the short run at the end
            slots = math.ceil(total / CLUSTER_PAGES)
            want = min(slots, math.ceil(k / CLUSTER_PAGES) + 1) if k else 0
            chosen = []
            for slot in rng.sample(range(slots), want):
                chosen.extend(range(slot * CLUSTER_PAGES,
                                    min(total, (slot + 1) * CLUSTER_PAGES)))
                if len(chosen) >= k:
                    break
            chosen = sorted(chosen[:k])
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
        per = appended_per_buffer(w)
        for n in names:
            if per:
                state[n] += scribble(per)
                dirty_bytes += per
    return dirty_bytes


def digest(state: dict) -> dict:
    """{name: BLAKE3 hex digest} of a state (any buffer-protocol values)."""
    return {n: blake3.blake3(memoryview(v).cast("B"), max_threads=blake3.blake3.AUTO).hexdigest()
            for n, v in state.items()}
