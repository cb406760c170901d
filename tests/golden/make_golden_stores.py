"""Makes the golden stores of one on-disk format version: tests/golden/stores/v<N>/<name>/.

    RUN ONLY WITH THE VERSION THAT DEFINES A FORMAT. NEVER REGENERATE TO MAKE A TEST PASS.

The golden stores are what a released format looks like on disk. The tests in this directory
open them with today's code; when one fails, today's code no longer reads a store that a user
may have on disk. The fix is in the code (or a new format version with an upgrade path, whose
stores go under stores/v<N+1>/, made by that version), never a fresh set of v1 stores: those
would only prove that today's code reads today's files.

How the v1 stores were made (commit 3331490, the last commit before the package was split
into subpackages):

    git -C /work/main worktree add /tmp/snap-v1 3331490
    (cd /tmp/snap-v1 && python3 setup.py -q build_ext --inplace)
    PYTHONPATH=/tmp/snap-v1 python3 tests/golden/make_golden_stores.py
    git -C /work/main worktree remove --force /tmp/snap-v1

The v2 and v3 stores were made the same way by the commits that README.md names (the format
final, the generator able to make it), in a clean checkout. Each format makes the stores of
every earlier format (same recipes, same seeds: their files show what changed) plus its own
(RECIPES): format 2 adds "compacted", "upgraded" (from stores/v1/basic) and "interrupted"
(compaction's crash states); format 3 adds "writers" (three writers at once, one of them in
another process) and "group" (group commits), and its "interrupted" holds format 3's crash
states (writer processes killed with a claim, a group, an unnoted state section and a torn
batch left behind) instead of format 2's; format 4 adds "floats" (byte planes); format 5
adds "deltas" (delta chunks), and stores/v5 holds only that one (--only deltas: README.md,
"Format 5"); format 6 adds "rotated" (byte planes rotated by 3 bits), and stores/v6 holds
only that one (--only rotated).

It refuses to write into an existing stores/v<N>/ (pass --out to make a scratch copy
elsewhere, e.g. to see what a version would write). Content is deterministic (seeded NumPy and
torch generators); "created" timestamps and zstd's output bytes are data of the run, recorded
in each store's expected.json:

    {"format_version", "made_by", "options",
     "checkpoints": [{"id", "stream", "seq", "parent", "kind", "chain_length", "tags", "meta",
                      "created", "bytes_new", "buffers": [{"name", "size", "sha256"}],
                      "load": null | {"api": "objects"|"arrays"|"torch"|"dcp", ...,
                                      "value": describe(loaded value)}}],
     "readonly_ids": ids a reader sees before a writer's recovery ran,
     "streams": {stream: {"head", "next_seq"}}, "next_id", "deleted": [ids],
     "segments": [segment numbers], "covers": [what the store exercises]}

Only the store directory's FORMAT, index/data.mdb and segments/*.seg are kept (never
index/lock.mdb nor the lock files `lock`, `maintenance` and writers/<L>, whose contents are no
part of the format): tests copy a store to a temporary directory before opening it, since
opening may write.

Stores of format 3 are written by several writers at once: Stores of this process and
Stores in child processes (Worker: this snapstore, driven over a pipe), which is also how
writers are killed at a crash point while others stay open (the next writer's open would
recover a dead writer's log).
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import platform
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

import snapstore
from snapstore.store import split_meta

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden_values import describe, sha256  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEGMENT = 65536          # small segments: several per store
VERSION = 0              # the format this code writes (main() finds it out)


# ---- deterministic content -------------------------------------------------------------------
def rand_bytes(rng, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def text_bytes(rng, n: int) -> bytes:
    """Compressible but not trivially repetitive: words drawn from a small vocabulary."""
    words = [b"snapshot", b"segment", b"chunk", b"extent", b"manifest", b"delta", b"stream",
             b"commit", b"record", b"index", b"page", b"golden"]
    out = bytearray()
    while len(out) < n:
        out += words[int(rng.integers(len(words)))] + b" "
    return bytes(out[:n])


# ---- recording what was written -----------------------------------------------------------------
class Recorder:
    """Tracks a store being made: the buffers given to each checkpoint and what loads give."""

    def __init__(self, path: str, options: dict, covers: list) -> None:
        self.path, self.options, self.covers = path, options, covers
        self.inputs: dict[int, dict[str, str]] = {}       # id -> {buffer: sha256 of input}
        self.loads: dict[int, dict] = {}
        self.deleted: list[int] = []
        self.taken: dict[str, int] = {}                   # stream -> checkpoints ever taken
        self.max_id = 0

    def open(self, **extra):
        return snapstore.open(self.path, **self.options, **extra)

    def took(self, info, buffers: dict | None = None) -> None:
        assert info.id > self.max_id, (info.id, self.max_id)
        self.max_id = info.id
        self.taken[info.stream] = self.taken.get(info.stream, 0) + 1
        assert info.seq == self.taken[info.stream], (info.stream, info.seq)
        if buffers is not None:
            assert list(info.sizes) == list(buffers), (info.sizes, list(buffers))
            self.inputs[info.id] = {k: sha256(bytes(memoryview(v).cast("B")))
                                    for k, v in buffers.items()}

    def checkpoint(self, store, buffers: dict, stream: str, meta=None, **kw):
        info = store.checkpoint(buffers, stream=stream, meta=meta, **kw)
        self.took(info, buffers)
        return info

    def delete(self, store, cid: int) -> None:
        store.delete(cid)
        self.deleted.append(cid)

    def delete_many(self, store, ids: list) -> None:
        store.delete_many(ids)
        self.deleted.extend(ids)

    def remote(self, worker: "Worker", seen_by, buffers: dict, stream: str, meta=None):
        """A checkpoint taken by a writer in another process (its info as the Store
        `seen_by` of this process reads it once published)."""
        cid = worker("checkpoint", buffers=hexed(buffers), stream=stream, meta=meta)["id"]
        info = seen_by.get(cid)
        self.took(info, buffers)
        return info

    def group_commit(self, group, parts: dict, meta=None):
        """group.commit(meta) of a group whose participants staged `parts` ({participant:
        (buffers, meta)}): its checkpoint holds every part's buffers and metas."""
        info = group.commit(meta)
        self.took_group(info, parts)
        return info

    def took_group(self, info, parts: dict) -> None:
        from snapstore.store import group_parts      # format 3 on
        buffers = {k: v for bufs, _ in parts.values() for k, v in bufs.items()}
        assert sorted(info.sizes) == sorted(buffers), (info.sizes, list(buffers))
        assert group_parts(info) == {n: m for n, (_, m) in parts.items()}, info
        self.took(info, {k: buffers[k] for k in info.sizes})

    def finish(self, *, readonly_ids: list | None = None) -> dict:
        """Writes expected.json from what this version reads back (checked against the
        inputs)."""
        with snapstore.open(self.path, readonly=True) as store:
            infos = store.checkpoints()
            visible = [c.id for c in infos]
        with tempfile.TemporaryDirectory() as tmp:
            # a writer (recovery) on a copy: the final state every test expects
            work = os.path.join(tmp, "s")
            shutil.copytree(self.path, work)
            with snapstore.open(work, durability="none") as store:
                report = store.verify(deep=True)
                assert report["ok"], report
                infos = store.checkpoints()
                checkpoints = []
                for c in infos:
                    data = store.restore(c.id)
                    bufs = [{"name": k, "size": len(v), "sha256": sha256(v)}
                            for k, v in data.items()]
                    assert [b["name"] for b in bufs] == list(c.sizes)
                    if c.id in self.inputs:
                        assert {b["name"]: b["sha256"] for b in bufs} == self.inputs[c.id], c.id
                    # the meta as stored, reserved "snapstore.*" keys included (what the v1
                    # stores recorded; today's CheckpointInfo.meta is only the user's part)
                    with store._committer.read() as r:
                        meta = r.checkpoint(c.id).meta
                    assert split_meta(meta) == (c.meta, c.reserved_meta), c.id
                    checkpoints.append({
                        "id": c.id, "stream": c.stream, "seq": c.seq, "parent": c.parent,
                        "kind": c.kind, "chain_length": c.chain_length,
                        "tags": sorted(c.tags), "meta": meta, "created": c.created,
                        "bytes_new": c.bytes_new, "buffers": bufs,
                        "load": self.loads.get(c.id)})
                streams = {s: {"head": store.latest(s).id, "next_seq": self.taken[s] + 1}
                           for s in store.streams()}
                segments = sorted(int(n[:-4]) for n in os.listdir(os.path.join(work, "segments")))
        assert not set(self.deleted) & {c["id"] for c in checkpoints}
        with open(os.path.join(self.path, "FORMAT")) as f:
            version = json.load(f)["version"]
        expected = {
            "format_version": version,
            "made_by": made_by(),
            "options": self.options,
            "covers": self.covers,
            "checkpoints": checkpoints,
            "readonly_ids": visible if readonly_ids is None else readonly_ids,
            "streams": streams,
            "next_id": self.max_id + 1,
            "deleted": sorted(self.deleted),
            "segments": segments,
        }
        if readonly_ids is None:
            assert visible == [c["id"] for c in checkpoints]
        else:
            assert visible == readonly_ids, (visible, readonly_ids)
        strip(self.path)
        with open(os.path.join(self.path, "expected.json"), "w") as f:
            json.dump(expected, f, indent=1, sort_keys=False)
            f.write("\n")
        return expected


def made_by() -> dict:
    """The versions that made a store: snapstore's commit and, when the engine's files differ
    from it ("modified": the paths under snapstore/ and csrc/ that git reports changed; absent
    when none are), which ones."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(snapstore.__file__)))
    modified = None
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        status = subprocess.run(["git", "--no-optional-locks", "-C", root, "status",
                                 "--porcelain", "--", "snapstore", "csrc"],
                                capture_output=True, text=True, check=True).stdout
        modified = sorted(line[3:] for line in status.splitlines() if line.strip())
    except (OSError, subprocess.CalledProcessError):
        commit = None
    out = {"snapstore": snapstore.__version__, "commit": commit,
           "python": platform.python_version(), "numpy": np.__version__}
    if modified:
        out["modified"] = modified
    if "torch" in sys.modules:
        out["torch"] = sys.modules["torch"].__version__
    return out


def package_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(snapstore.__file__)))


def child_env(**extra) -> dict:
    """The environment of a child process: this snapstore first on its path."""
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root(), env.get("PYTHONPATH"))
                                        if p)
    return env


def hexed(buffers: dict) -> dict:
    return {k: bytes(memoryview(v).cast("B")).hex() for k, v in buffers.items()}


# A writer in another process (format 3 on: many writers), driven line by line over its
# stdin with JSON commands; it answers each with one JSON line. "crash_at" arms a crash point
# for its next operations (SNAPSTORE_CRASH_AT is read at each point); "die" SIGKILLs it.
_WORKER = r"""
import json, os, signal, sys
import snapstore
path, options = sys.argv[1], json.loads(sys.argv[2])
store = snapstore.open(path, **options)
groups = {}
def buffers(d):
    return {k: bytes.fromhex(v) for k, v in d.items()}
print(json.dumps({"log": store._committer.log_number, "pid": os.getpid()}), flush=True)
for line in sys.stdin:
    cmd = json.loads(line)
    op, out = cmd.pop("op"), {}
    try:
        if op == "crash_at":
            os.environ["SNAPSTORE_CRASH_AT"] = cmd["point"]
        elif op == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        elif op == "checkpoint":
            out["id"] = store.checkpoint(buffers(cmd["buffers"]), cmd["stream"],
                                         cmd.get("meta")).id
        elif op == "group":
            g = store.group(cmd["stream"], cmd["participants"], timeout=cmd["timeout"])
            groups[g.id] = g
            out["group"] = g.id
        elif op == "stage":
            store.stage(cmd["group"], cmd["participant"], buffers(cmd["buffers"]),
                        cmd.get("meta"))
        elif op == "commit":
            out["id"] = groups.pop(cmd["group"]).commit(cmd.get("meta")).id
        elif op == "tag":
            store.tag(cmd["id"], cmd["tag"])
        elif op == "untag":
            store.untag(cmd["id"], cmd["tag"])
        elif op == "delete_many":
            store.delete_many(cmd["ids"])
        elif op == "compact":
            out["report"] = store.compact(**cmd)
        elif op == "close":
            store.close()
        else:
            raise ValueError(op)
    except Exception as exc:
        out = {"error": repr(exc)}
    print(json.dumps(out, default=str), flush=True)
    if op == "close":
        break
"""


class Worker:
    """A writer Store in a child process (opened when this returns: its log is `log`)."""

    def __init__(self, path: str, options: dict) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _WORKER, path, json.dumps(options)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=child_env())
        hello = self._answer()
        self.log, self.pid = hello["log"], hello["pid"]

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker exited ({self.proc.wait()})")
        out = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"the worker failed: {out['error']}")
        return out

    def send(self, op: str, **args) -> None:
        self.proc.stdin.write(json.dumps(dict(args, op=op)) + "\n")
        self.proc.stdin.flush()

    def __call__(self, op: str, **args) -> dict:
        self.send(op, **args)
        return self._answer()

    def killed_by(self, op: str, **args) -> None:
        """Sends `op`, which must kill the worker (an armed crash point, or "die")."""
        self.send(op, **args)
        line = self.proc.stdout.readline()
        assert line == "", (op, line)
        assert self.proc.wait(timeout=120) == -9, (op, self.proc.returncode)

    def close(self) -> None:
        if self.proc.poll() is None:
            self("close")
            assert self.proc.wait(timeout=120) == 0


def log_of_store(store) -> int:
    """The log a writer Store appends to (generator-only peek at the engine)."""
    return store._committer.log_number


def strip(path: str) -> None:
    """Keeps only FORMAT, index/data.mdb and segments/*.seg: the lock files (`lock`, LMDB's
    index/lock.mdb, and from format 3 on `maintenance` and writers/<L>, one per log; later
    builds add writers/.choosing, which openers flock while they choose their logs, and
    index.gate) are no part of the format (their contents name the last holder; a writer's
    open makes the ones it needs, and finds a store's logs from its segments and its
    index); nor is unsynced/, empty once its writers closed."""
    for name in ("lock", "maintenance", "index.gate", os.path.join("index", "lock.mdb")):
        p = os.path.join(path, name)
        if os.path.exists(p):
            os.remove(p)
    writers = os.path.join(path, "writers")
    if os.path.isdir(writers):
        for name in os.listdir(writers):
            # a log's lock file, or the lock openers choose their logs under; nothing else
            assert name.isdigit() or name == ".choosing", name
            os.remove(os.path.join(writers, name))
        os.rmdir(writers)
    unsynced = os.path.join(path, "unsynced")      # marks of writers without index syncs:
    if os.path.isdir(unsynced):                     # every writer closed, so none is left
        assert not os.listdir(unsynced), os.listdir(unsynced)
        os.rmdir(unsynced)
    allowed = {"FORMAT", "expected.json", os.path.join("index", "data.mdb")}
    for dirpath, _, files in os.walk(path):
        for f in files:
            rel = os.path.relpath(os.path.join(dirpath, f), path)
            if rel not in allowed and not (rel.startswith("segments" + os.sep)
                                           and rel.endswith(".seg")):
                raise AssertionError(f"unexpected file in a golden store: {rel}")


# ---- the stores -------------------------------------------------------------------------------
def make_basic(path: str) -> dict:
    """Pages chunking with zstd: full and delta checkpoints, tags, deletes, dedup across
    streams, empty / 1-byte / odd-sized buffers, an empty delta, CDC checkpoints, and a
    compaction that rewrote a segment (so segment numbers have a gap)."""
    rng = np.random.default_rng(1001)
    opts = dict(durability="none", segment_size=SEGMENT, chunk_size=16384,
                cdc_sizes=(1024, 4096, 16384))
    rec = Recorder(path, opts, [
        "full checkpoint (zstd and raw chunks)", "delta checkpoints, chain length 3",
        "deleted middle checkpoint (child absorbed its manifests)",
        "deleted stream head (seq continues)", "tags added and removed",
        "empty, 1-byte and odd-sized buffers", "unchanged buffer: delta with no extents",
        "dedup across streams", "cdc chunking (per checkpoint) with shifted content",
        "compaction: deleted stream, gc, a segment rewritten and removed",
        "checkpoint appended after compaction"])
    with rec.open() as s:
        weights = bytearray(text_bytes(rng, 48 << 10) + rand_bytes(rng, 48 << 10))
        opt = bytearray(rand_bytes(rng, 32 << 10))
        c1 = rec.checkpoint(s, {"weights": weights, "opt": opt}, "train",
                            {"step": 1, "lr": 0.1, "note": "full"})
        assert c1.kind == "full"
        w1 = bytes(weights)
        for page in (13, 20):
            weights[page * 4096:(page + 1) * 4096] = rand_bytes(rng, 4096)
        opt[2 * 4096:3 * 4096] = rand_bytes(rng, 4096)
        c2 = rec.checkpoint(s, {"weights": weights, "opt": opt}, "train", {"step": 2})
        assert c2.kind == "incremental" and c2.chain_length == 1
        weights[3 * 4096:4 * 4096] = text_bytes(rng, 4096)
        c3 = rec.checkpoint(s, {"weights": weights, "opt": opt}, "train", {"step": 3})
        assert c3.chain_length == 2
        weights[5000:5100] = rand_bytes(rng, 100)
        opt[0:4096] = bytes(4096)
        c4 = rec.checkpoint(s, {"weights": weights, "opt": opt}, "train", {"step": 4})
        assert c4.chain_length == 3

        odd = bytearray(rand_bytes(rng, 5000))
        rec.checkpoint(s, {"empty": b"", "one": b"\x07", "odd": bytes(odd)}, "misc", None)
        odd[4500] ^= 0xFF
        rec.checkpoint(s, {"empty": b"", "one": b"\x08", "odd": bytes(odd)}, "misc",
                       ["a", "list", 1])

        e1 = rec.checkpoint(s, {"weights": w1}, "eval", {"source": c1.id})
        assert e1.bytes_new < 1024, e1.bytes_new    # only its commit record: all chunks deduped
        e2 = rec.checkpoint(s, {"weights": w1}, "eval", {"source": c1.id})
        assert e2.kind == "incremental", e2
        e3 = rec.checkpoint(s, {"weights": w1}, "eval", {"source": c1.id})

        doc = text_bytes(rng, 40 << 10)
        rec.checkpoint(s, {"doc": doc}, "text", {"v": 1}, chunking="cdc")
        doc2 = doc[:10000] + rand_bytes(rng, 100) + doc[10000:]
        t2 = rec.checkpoint(s, {"doc": doc2}, "text", {"v": 2}, chunking="cdc")
        assert t2.bytes_new < len(doc2) // 2, t2.bytes_new

        s.tag(c3.id, "best")
        s.tag(c4.id, "latest")
        s.tag(c4.id, "tmp")
        s.untag(c4.id, "tmp")
        s.tag(e1.id, "eval")
        s.tag(e1.id, "golden")
        rec.delete(s, c2.id)                   # middle of a chain: c3 absorbs c2
        rec.delete(s, e3.id)                   # a stream head: head goes back to e2

        # compaction: a kept and a deleted checkpoint share a segment, which is rewritten
        s.compact()                            # start from a clean slate of sealed segments
        rec.checkpoint(s, {"k": rand_bytes(rng, 12 << 10)}, "keep", {"keep": True})
        scratch = rec.checkpoint(s, {"x": rand_bytes(rng, 40 << 10)}, "scratch", None)
        rec.delete(s, scratch.id)              # the stream's only checkpoint: stream gone
        rec.checkpoint(s, {"pad": rand_bytes(rng, 24 << 10)}, "keep", {"keep": False})
        report = s.compact(threshold=0.5)
        assert report["segments_rewritten"] >= 1 and report["chunks_freed"] >= 1, report

        weights[0:64] = b"after compaction".ljust(64, b".")
        c5 = rec.checkpoint(s, {"weights": weights, "opt": opt}, "train", {"step": 5})
        assert c5.kind == "incremental"
    return rec.finish()


def make_raw_cdc(path: str) -> dict:
    """compression="none" (every chunk raw, compressible or not), chunking="cdc" by default
    (a repeated chunk inside one buffer, dedup of shifted content), a pages override."""
    rng = np.random.default_rng(2002)
    opts = dict(durability="none", segment_size=SEGMENT, compression="none", chunking="cdc",
                cdc_sizes=(1024, 4096, 16384))
    rec = Recorder(path, opts, [
        "compression none: compressible chunks stored raw", "cdc chunking as store default",
        "one chunk referenced twice by one manifest (zeros)", "cdc dedup of shifted content",
        "pages chunking override with a delta", "tag"])
    with rec.open() as s:
        doc = text_bytes(rng, 48 << 10)
        c1 = rec.checkpoint(s, {"doc": doc, "zeros": bytes(40000)}, "docs", {"rev": 1})
        doc2 = doc[:5000] + b"INSERTED " * 20 + doc[5000:30000] + doc[31000:]
        c2 = rec.checkpoint(s, {"doc": doc2, "zeros": bytes(40000)}, "docs", {"rev": 2})
        assert c2.kind == "full" and c2.bytes_new < len(doc2) // 2, c2
        blob = bytearray(text_bytes(rng, 32 << 10))
        rec.checkpoint(s, {"blob": blob}, "pages", {"n": 1}, chunking="pages")
        blob[8192:12288] = rand_bytes(rng, 4096)
        c4 = rec.checkpoint(s, {"blob": blob}, "pages", {"n": 2}, chunking="pages")
        assert c4.kind == "incremental"
        s.tag(c1.id, "first")
    return rec.finish()


def make_objects(path: str) -> dict:
    """Object checkpoints (store.save: NumPy arrays in and out of band, C / Fortran /
    datetime arrays, a PickleBuffer, plain Python values; non-dict meta) and save_arrays."""
    rng = np.random.default_rng(3003)
    opts = dict(durability="none", segment_size=SEGMENT)
    rec = Recorder(path, opts, [
        "store.save: float64 array (out of band), Fortran int32 array, datetime64 array, "
        "small in-band array, PickleBuffer, nested Python values",
        "store.save incremental (one row changed)", "store.save with non-dict meta",
        "save_arrays: C, Fortran, structured, 0-d and empty arrays; incremental",
        "plain (non-object) checkpoint"])

    def saved(s, obj, stream, meta):
        info = s.save(obj, stream=stream, meta=meta)
        rec.took(info)
        value = s.load(info.id)
        rec.loads[info.id] = {"api": "objects", "value": describe(value)}
        return info, value

    with rec.open() as s:
        array = rng.standard_normal((64, 64))
        obj = {
            "array": array,
            "counts": np.asfortranarray(np.arange(4096, dtype=np.int32).reshape(64, 64)),
            "when": np.datetime64("2024-01-01T00:00:00", "s") + np.arange(1024) * 3600,
            "small": np.array([1, 2, 3], dtype=np.int16),
            "blob": pickle.PickleBuffer(bytearray(text_bytes(rng, 8192))),
            "config": {"lr": 0.001, "name": "golden", "layers": [64, 64],
                       "flags": (True, False, None), "raw": b"\x00\x01snap", "big": 2 ** 70,
                       "pi": 3.141592653589793},
            "step": 10,
        }
        info, value = saved(s, obj, "obj", {"step": 10})
        assert np.array_equal(value["array"], array) and value["counts"].flags.f_contiguous
        assert set(info.sizes) == {"pickle", "oob/0", "oob/1", "oob/2", "oob/3"}, info.sizes
        array[0, :] = 0.5
        info2, _ = saved(s, obj, "obj", {"step": 20})
        assert info2.kind == "incremental", info2
        saved(s, [1, 2.5, "x", None, np.arange(10)], "obj", 5)

        arrays = {
            "u": rng.standard_normal((64, 64)).astype(np.float32),
            "v": np.array(42, dtype=np.int64),
            "s": np.zeros(256, dtype=[("a", "<i4"), ("b", "<f8")]),
            "f": np.asfortranarray(rng.standard_normal((32, 32))),
            "e": np.zeros((0, 3), dtype=np.float32),
        }
        arrays["s"]["a"] = np.arange(256)
        arrays["s"]["b"] = np.linspace(0, 1, 256)
        for n in (1, 2):
            if n == 2:
                arrays["u"][5, :] = 7.0
            info = snapstore.save_arrays(s, arrays, stream="arrays", meta={"t": 1.5 * n})
            rec.took(info)
            loaded = snapstore.load_arrays(s, info.id)
            for k, a in arrays.items():
                assert loaded[k].dtype == a.dtype and np.array_equal(loaded[k], a), k
            rec.loads[info.id] = {"api": "arrays", "value": describe(loaded)}
        assert info.kind == "incremental", info
        rec.checkpoint(s, {"raw": rand_bytes(rng, 100)}, "plain", {"plain": True})
    return rec.finish()


def make_torch(path: str) -> dict:
    """snapstore.torch.save of a state dict (float32 and bfloat16 tensors out of band, shared
    storage, a partial view, an nn.Parameter, 0-d and in-band tensors, Python values), an
    incremental save, and two torch.distributed.checkpoint saves through SnapstoreWriter."""
    import torch
    import torch.distributed.checkpoint as dcp
    import snapstore.torch as st

    g = torch.Generator().manual_seed(4004)
    opts = dict(durability="none", segment_size=SEGMENT)
    rec = Recorder(path, opts, [
        "snapstore.torch.save: float32 + bfloat16 tensors, tied weights (one storage), "
        "a row slice of a larger storage, nn.Parameter, 0-d int64 tensor, small in-band "
        "tensor, Python values", "incremental torch save",
        "DCP saves (SnapstoreWriter, no process group) with checkpoint ids"])
    with rec.open() as s:
        w = torch.randn(32, 64, generator=g)
        big = torch.randn(128, 64, generator=g)
        sd = {
            "enc.weight": w,
            "dec.weight": w,                                   # tied
            "emb": torch.randn(64, 64, generator=g).to(torch.bfloat16),
            "head": big[:32],                                   # partial view of a storage
            "bias": torch.arange(64, dtype=torch.float32) / 7,  # in band (256 bytes)
            "scale": torch.nn.Parameter(torch.randn(16, 16, generator=g)),
            "steps": torch.tensor(5, dtype=torch.int64),
            "epoch": 1, "name": "golden",
        }
        for epoch in (1, 2):
            if epoch == 2:
                with torch.no_grad():
                    w[0].fill_(0.25)
                sd["epoch"] = 2
            info = st.save(s, sd, "model", meta={"epoch": epoch})
            rec.took(info)
            loaded = st.load(s, info.id)
            assert torch.equal(loaded["enc.weight"], w) and torch.equal(loaded["emb"], sd["emb"])
            assert loaded["enc.weight"].untyped_storage().data_ptr() == \
                loaded["dec.weight"].untyped_storage().data_ptr()
            rec.loads[info.id] = {"api": "torch", "value": describe(loaded),
                                  "shared": [["enc.weight", "dec.weight"]]}
        assert info.kind == "incremental", info

        state = {"w": torch.randn(32, 64, generator=g),
                 "emb": torch.randn(64, 64, generator=g).to(torch.bfloat16),
                 "bias": torch.arange(10, dtype=torch.float32)}
        for n in (1, 2):
            if n == 2:
                state["w"][3].fill_(-1.0)
            writer = st.SnapstoreWriter(s)
            dcp.save(state, checkpoint_id=f"step-{n}", storage_writer=writer)
            info = writer.last_info
            rec.took(info)
            target = {k: torch.zeros_like(v) for k, v in state.items()}
            dcp.load(target, checkpoint_id=f"step-{n}", storage_reader=st.SnapstoreReader(s))
            assert all(torch.equal(target[k], state[k]) for k in state)
            rec.loads[info.id] = {"api": "dcp", "checkpoint_id": f"step-{n}",
                                  "value": describe(target)}
    return rec.finish()


_CRASH_CHILD = r"""
import sys, numpy as np, snapstore
path, seed = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(seed)
a = bytearray(rng.integers(0, 256, 16384, dtype=np.uint8).tobytes())
s = snapstore.open(path, durability="none", segment_size=65536)
s.checkpoint({"a": a}, stream="s", meta={"child": seed})
raise SystemExit("the crash point did not fire")
"""


def make_unapplied(path: str) -> dict:
    """A log the index has not caught up with: unreferenced chunk records (a writer killed
    after appending data), then a commit record the index never applied (killed before the
    index commit), then a torn record. A reader sees one checkpoint; a writer's recovery
    applies the commit and cuts the torn tail."""
    rng = np.random.default_rng(5005)
    opts = dict(durability="none", segment_size=SEGMENT, delta_chunks=True)
    rec = Recorder(path, opts, [
        "recovery: unreferenced chunk records, an unapplied commit record, a torn tail"])
    with rec.open() as s:
        a = bytearray(rand_bytes(rng, 8192) + text_bytes(rng, 8192))
        rec.checkpoint(s, {"a": a}, "s", {"n": 1})
    env = dict(os.environ)
    for point, seed in (("after_data_append", 1), ("before_index_commit", 2)):
        env["SNAPSTORE_CRASH_AT"] = point
        p = subprocess.run([sys.executable, "-c", _CRASH_CHILD, path, str(seed)], env=env)
        assert p.returncode == -9, (point, p.returncode)
    seg_dir = os.path.join(path, "segments")
    last = os.path.join(seg_dir, sorted(os.listdir(seg_dir))[-1])
    with open(last, "ab") as f:      # a torn record: a header promising 1000 bytes, 6 given
        f.write(b"SREC\x01\x00\x00\x00" + (1000).to_bytes(4, "little") + bytes(12) + b"torn!!")
    # what the killed child committed, as the writer's recovery sees it
    rng2 = np.random.default_rng(2)
    child = rng2.integers(0, 256, 16384, dtype=np.uint8).tobytes()
    rec.max_id += 1
    rec.taken["s"] += 1
    rec.inputs[rec.max_id] = {"a": sha256(child)}
    return rec.finish(readonly_ids=[1])


# ---- stores of format 2 on (what format 2 added to the log) ------------------------------------
def _log_position(store) -> tuple:
    """Where the writer's next record will start (generator-only peek at the engine)."""
    return store._committer.log.position


def make_compacted(path: str) -> dict:
    """Format 2's complete log: two compactions that removed segments, each after a state
    section; the second section spans two segments; the first compaction folded a chain and
    trimmed a chunk (its manifests use a quarter of it); commit, tag and delete records follow
    the newest section (the log is the section plus what came after it)."""
    rng = np.random.default_rng(6006)
    opts = dict(durability="none", segment_size=SEGMENT, chunk_size=16384)
    rec = Recorder(path, opts, [
        "compaction 1: a chain folded (max_chain=3), a chunk trimmed to the quarter its "
        "manifests use, segments 1 and 2 removed after state section 1 (segment 3), "
        "the index shrunk (a compacting copy)",
        "between the compactions: commits (zstd and raw chunks), tags, an untag, a delete of "
        "a checkpoint whose commit record compaction 1 removed",
        "compaction 2: segment 4 removed after state section 2, which spans segments 5 and 6; "
        "section 1 stays in the log, superseded",
        "after the newest section: a commit, a tag, a delete of a checkpoint only the "
        "sections describe"])
    with rec.open() as s:
        w = bytearray(rand_bytes(rng, 48 << 10))            # 3 raw chunks of 16 KiB
        c1 = rec.checkpoint(s, {"w": w, "cfg": text_bytes(rng, 3000)}, "model", {"step": 1})
        w[0:3 * 4096] = rand_bytes(rng, 3 * 4096)          # 3 of the first chunk's 4 pages
        c2 = rec.checkpoint(s, {"w": w, "cfg": text_bytes(rng, 3000)}, "model", {"step": 2})
        assert c2.kind == "incremental", c2
        junk = rec.checkpoint(s, {"junk": rand_bytes(rng, 40 << 10)}, "junk", None)
        chain = []
        for step in range(3, 7):
            w[(step * 3 % 12) * 4096 + 17] ^= 0xFF
            chain.append(rec.checkpoint(s, {"w": w, "cfg": text_bytes(rng, 3000)}, "model",
                                        {"step": step}))
        assert chain[-1].chain_length == 5, chain[-1]
        s.tag(chain[1].id, "best")
        rec.delete(s, c1.id)                   # c2 absorbs c1: full, a quarter of chunk 0 used
        rec.delete(s, junk.id)                 # the junk stream is gone
        report = s.compact(max_chain=3)
        assert report["chains_folded"] == 1 and report["chunks_trimmed"] == 1, report
        assert report["segments_removed"] == 2 and report["state_section_bytes"] > 0, report
        assert report["index_shrunk"], report
        with s._committer.index.read() as r:
            section1 = r.log_state()[0][0]     # the segment where section 1 begins

        # between the sections
        w[5 * 4096:6 * 4096] = rand_bytes(rng, 4096)
        c7 = rec.checkpoint(s, {"w": w, "cfg": text_bytes(rng, 3000)}, "model", {"step": 7})
        doc = text_bytes(rng, 20 << 10)
        d1 = rec.checkpoint(s, {"doc": doc}, "docs", {"rev": 1})
        s.tag(c7.id, "new")
        s.untag(chain[1].id, "best")
        s.tag(chain[1].id, "kept")
        rec.delete(s, chain[0].id)             # its commit record went with compaction 1
        junk2 = rec.checkpoint(s, {"junk": rand_bytes(rng, 50 << 10)}, "junk2", None)
        # fill the open segment so that the next state section starts in it and ends in the
        # next one: leave about 1 KiB (the section is several KiB)
        seg, off = _log_position(s)
        free = SEGMENT - off - 1024 - 300          # 300: about the commit record's JSON
        chunks = -(-free // (16384 + 165))         # 165: record, new-chunk and extent entries
        pad = free - 165 * chunks
        assert 0 < pad, (seg, off)
        rec.checkpoint(s, {"pad": rand_bytes(rng, pad)}, "docs", {"rev": 2})
        seg2, off2 = _log_position(s)
        assert seg2 == seg and 600 < SEGMENT - off2 < 1600, (seg, off, seg2, off2)
        rec.delete(s, junk2.id)
        report = s.compact(threshold=0.5, max_garbage=None)
        assert report["segments_removed"] == 1, report
        assert report["state_section_bytes"] > SEGMENT - off2, report
        assert _log_position(s)[0] == seg + 1
        segments = sorted(int(n[:-4]) for n in os.listdir(os.path.join(path, "segments")))
        assert segments == [section1, seg, seg + 1], (segments, section1, seg)

        # after the newest section
        w[7 * 4096:8 * 4096] = rand_bytes(rng, 4096)
        rec.checkpoint(s, {"w": w, "cfg": text_bytes(rng, 3000)}, "model", {"step": 8})
        s.tag(d1.id, "doc")
        rec.delete(s, chain[2].id)
    return rec.finish()


def make_upgraded(path: str) -> dict:
    """stores/v1/basic upgraded by a writer open of this version (format 2 on; it is copied:
    the v1 store is never written), then written to: a store of this format whose log starts
    with segments of header version 1 (format 1 records; a format 1 compaction removed segment
    3 and with it the records of checkpoints 10-12) and continues with segments of this
    version, the first holding the upgrade's state section. (The same steps at every format:
    the new stream keeps its name "v2", the bytes their "format 2".)"""
    src = os.path.join(HERE, "stores", "v1", "basic")
    with open(os.path.join(src, "expected.json")) as f:
        old = json.load(f)
    shutil.copytree(src, path, ignore=shutil.ignore_patterns("expected.json"))
    rec = Recorder(path, old["options"], [
        "stores/v1/basic upgraded by a writer open: segments 1, 2, 4 of version 1, the "
        f"upgrade's state section in segment 5 (version {VERSION}), FORMAT 'created' of the "
        "v1 store",
        "after the upgrade: a delta onto a v1 checkpoint (v1 fingerprints), a new stream, "
        "tags added to and removed from v1 checkpoints, a delete of a v1 checkpoint only the "
        "state section describes in the log"])
    rec.max_id = old["next_id"] - 1
    rec.taken = {s: v["next_seq"] - 1 for s, v in old["streams"].items()}
    rec.deleted = list(old["deleted"])
    rec.inputs = {c["id"]: {b["name"]: b["sha256"] for b in c["buffers"]}
                  for c in old["checkpoints"]}
    by_id = {c["id"]: c for c in old["checkpoints"]}
    with rec.open() as s:
        with open(os.path.join(path, "FORMAT")) as f:
            assert json.load(f)["version"] == VERSION
        head = old["streams"]["train"]["head"]
        data = {k: bytearray(v) for k, v in s.restore(head).items()}
        data["weights"][100:200] = b"format 2".ljust(100, b"!")
        info = rec.checkpoint(s, data, "train", {"step": 6})
        assert info.kind == "incremental" and info.parent == head, info
        rec.checkpoint(s, {"new": text_bytes(np.random.default_rng(7007), 9000)}, "v2", None)
        s.tag(10, "upgraded")
        assert "golden" in by_id[7]["tags"]
        s.untag(7, "golden")
        rec.delete(s, 12)                      # "keep" {"keep": True}: 14 stays its head
    return rec.finish()


_COMPACT_CHILD = r"""
import sys, snapstore
with snapstore.open(sys.argv[1], durability="none", segment_size=65536) as s:
    s.compact()
raise SystemExit("the crash point did not fire")
"""


def make_interrupted_compactions(path: str) -> dict:
    """Format 2 crash states of compaction: a compaction killed before it removed the segment
    it had copied (its state section noted, the live chunks copied, the old segment still
    there: chunk records twice in the log), a second one killed right after its state
    section was durable (a complete section the index never noted, past `applied`), then a
    torn state-section record. Before them a checkpoint killed before its index commit, which
    the first compaction's recovery applied."""
    rng = np.random.default_rng(8008)
    opts = dict(durability="none", segment_size=SEGMENT)
    rec = Recorder(path, opts, [
        "a checkpoint killed before its index commit (applied by the next writer's recovery)",
        "compaction killed at compact_before_remove: section noted, chunks copied, the old "
        "segment left (chunk records in two segments)",
        "compaction killed at compact_after_state: a complete state section the index did "
        "not note", "a torn state-section record at the tail"])
    with rec.open() as s:
        a = bytearray(rand_bytes(rng, 24 << 10) + text_bytes(rng, 8 << 10))
        c1 = rec.checkpoint(s, {"a": a}, "s", {"n": 1})
        rec.checkpoint(s, {"tmp": rand_bytes(rng, 48 << 10)}, "tmp", None)
        a[0:4096] = rand_bytes(rng, 4096)
        rec.checkpoint(s, {"a": a}, "s", {"n": 2})
        s.tag(c1.id, "first")
        rec.delete(s, 2)
    env = dict(os.environ, SNAPSTORE_CRASH_AT="before_index_commit")
    p = subprocess.run([sys.executable, "-c", _CRASH_CHILD, path, "3"], env=env)
    assert p.returncode == -9, p.returncode
    rng3 = np.random.default_rng(3)
    rec.max_id += 1
    rec.taken["s"] += 1
    rec.inputs[rec.max_id] = {"a": sha256(rng3.integers(0, 256, 16384, dtype=np.uint8)
                                          .tobytes())}
    for point in ("compact_before_remove", "compact_after_state"):
        env["SNAPSTORE_CRASH_AT"] = point
        p = subprocess.run([sys.executable, "-c", _COMPACT_CHILD, path], env=env)
        assert p.returncode == -9, (point, p.returncode)
    seg_dir = os.path.join(path, "segments")
    last = os.path.join(seg_dir, sorted(os.listdir(seg_dir))[-1])
    with open(last, "ab") as f:      # a torn STATE_BEGIN: a header promising 1000 bytes, 6 given
        f.write(b"SREC\x05\x00\x00\x00" + (1000).to_bytes(4, "little") + bytes(12) + b"torn!!")
    return rec.finish()


# ---- stores of format 3 on (many writers: a log per writer, claims, group commits) ----------
def make_writers(path: str) -> dict:
    """Three writers at once, each with a log of its own: two Stores of this process (logs 0
    and 1) and a Store in another process (log 2), each committing to a stream of its own and,
    in turns, to one shared stream (deltas over chunks in another writer's log; dedup across
    logs); tags and an untag from every writer; a delete_many batch over three streams; a
    compaction by the other process that removed segments of this process's logs after a
    state section covering every log; records of all three after it."""
    rng = np.random.default_rng(9009)
    opts = dict(durability="none", segment_size=SEGMENT, chunk_size=16384)
    rec = Recorder(path, opts, [
        "three writers at once: two Stores of one process (logs 0 and 1), a Store of another "
        "process (log 2); segments L * 10^9 + n, several per log",
        "commits to each writer's own stream, interleaved",
        "a shared stream written in turns by all three: deltas over chunks in other writers' "
        "logs (chain length 3; 2 once a delete absorbed a middle checkpoint)",
        "dedup across logs (one writer stores bytes another stored: no new chunk)",
        "tags added by all three writers, an untag by another writer than the tagger",
        "a delete_many batch (records of one order) over three streams, by log 1 (its "
        "records went with a segment the compaction removed)",
        "a compaction by the other process: segments of logs 0 and 1 removed after a state "
        "section in log 2 covering logs 0, 1 and 2 (their live chunks copied to log 2; the "
        "section is the only record of the checkpoints committed in them)",
        "after the section, from all three logs: commits, a tag, a delete_many of two by the "
        "other process (log 0's first checkpoint and its own: their children absorb them)"])
    a = rec.open()                      # log 0: the store's first writer
    b = rec.open()                      # log 1: a second writer while the first is open
    p = Worker(path, opts)              # log 2: a writer in another process
    try:
        assert (log_of_store(a), log_of_store(b), p.log) == (0, 1, 2)
        wa = bytearray(text_bytes(rng, 24 << 10) + rand_bytes(rng, 24 << 10))
        a1 = rec.checkpoint(a, {"w": wa}, "a", {"by": "a"})
        vb = bytearray(rand_bytes(rng, 40 << 10))
        rec.checkpoint(b, {"v": vb}, "b", {"by": "b"})
        up = bytearray(rand_bytes(rng, 30 << 10))
        p1 = rec.remote(p, a, {"u": up}, "p", {"by": "p"})

        # the shared stream, in turns: each commit diffs against the head another wrote
        shared = {"s": bytearray(rand_bytes(rng, 64 << 10)),
                  "cfg": bytearray(text_bytes(rng, 3000))}
        s1 = rec.checkpoint(a, shared, "shared", {"turn": 1})
        shared["s"][3 * 4096:4 * 4096] = rand_bytes(rng, 4096)
        s2 = rec.checkpoint(b, shared, "shared", {"turn": 2})
        assert s2.kind == "incremental" and s2.parent == s1.id, s2
        shared["s"][9 * 4096:10 * 4096] = rand_bytes(rng, 4096)
        shared["cfg"][100:120] = b"written by process 2"
        s3 = rec.remote(p, a, shared, "shared", {"turn": 3})
        assert s3.chain_length == 2, s3
        shared["s"][15 * 4096 + 10:15 * 4096 + 20] = b"0123456789"
        s4 = rec.checkpoint(a, shared, "shared", {"turn": 4})
        assert s4.chain_length == 3, s4

        # dedup across logs: log 1 stores what log 0 stored
        b2 = rec.checkpoint(b, {"w": wa}, "b2", None)
        assert b2.bytes_new < 1024, b2

        wa[0:4096] = rand_bytes(rng, 4096)
        rec.checkpoint(a, {"w": wa}, "a", {"by": "a"})
        up[8192:12288] = rand_bytes(rng, 4096)
        rec.remote(p, a, {"u": up}, "p", {"by": "p"})
        vb[0:100] = bytes(100)
        rec.checkpoint(b, {"v": vb}, "b", {"by": "b"})

        # garbage for the compaction: a stream of log 0 and one of log 1, deleted below
        junk_a = rec.checkpoint(a, {"junk": rand_bytes(rng, 40 << 10)}, "junk-a", None)
        junk_b = rec.checkpoint(b, {"junk": rand_bytes(rng, 48 << 10)}, "junk-b", None)

        # tags from every writer; an untag by another writer than the one that tagged
        a.tag(s3.id, "made-by-2")
        p("tag", id=s4.id, tag="made-by-0")
        b.tag(a1.id, "first")
        b.tag(a1.id, "tmp")
        p("untag", id=a1.id, tag="tmp")

        # a batch: a middle checkpoint of the shared stream (s3 absorbs it) and both junk
        # streams (gone), by log 1
        rec.delete_many(b, [s2.id, junk_a.id, junk_b.id])
        # five pages changed: log 1 goes on in a new segment, so the one holding junk-b is
        # sealed, and wholly before log 1's applied position (compaction may remove it)
        for page in (1, 3, 5, 7, 9):
            vb[page * 4096:page * 4096 + 4096] = rand_bytes(rng, 4096)
        rec.checkpoint(b, {"v": vb}, "b", {"by": "b"})

        # a compaction in the other process removes segments of this process's logs
        before = segment_numbers(path)
        report = p("compact")["report"]
        assert report["segments_removed"] >= 2 and report["state_section_bytes"] > 0, report
        removed = sorted(set(before) - set(segment_numbers(path)))
        assert {n // 10 ** 9 for n in removed} == {0, 1}, (before, removed)

        # after the section, from all three logs
        shared["s"][12 * 4096:13 * 4096] = rand_bytes(rng, 4096)
        s5 = rec.checkpoint(b, shared, "shared", {"turn": 5})
        assert s5.parent == s4.id and s5.kind == "incremental", s5
        wa[4096:8192] = rand_bytes(rng, 4096)
        rec.checkpoint(a, {"w": wa}, "a", {"by": "a", "after": "compaction"})
        late = rec.remote(p, a, {"late": text_bytes(rng, 5000)}, "late", None)
        a.tag(late.id, "late")
        p("delete_many", ids=[a1.id, p1.id])
        rec.deleted.extend([a1.id, p1.id])
    finally:
        a.close()
        b.close()
        p.close()
    return rec.finish()


def make_group(path: str) -> dict:
    """Group commits: one checkpoint from the parts of three participants staged by three
    writers (two Stores of this process, logs 0 and 1, and a Store of another process, log
    2), each with its meta (source offsets); an incremental second group in which a
    participant staged twice (the second part replaces the first); an aborted group (its
    staged parts garbage); a group coordinated by the other process on a new stream; a plain
    checkpoint after the groups (a delta on the group's fingerprints)."""
    rng = np.random.default_rng(10010)
    opts = dict(durability="none", segment_size=SEGMENT)
    rec = Recorder(path, opts, [
        "a group commit of 3 participants staged by 3 writers (logs 0, 1 and, in another "
        "process, 2), coordinated by log 0: one commit record in the coordinator's log, its "
        "chunks in the participants' logs; each part's meta (offsets) in the reserved meta "
        "snapstore.group",
        "a second group: incremental parts (page diffs against the group checkpoint's "
        "fingerprints), one participant staged twice (its first part garbage)",
        "an aborted group: two parts staged, then abort (their chunks garbage)",
        "a group coordinated by the other process on a new stream (participants '0', '1' "
        "staged by this process's two writers)",
        "a plain checkpoint of the group stream after the groups: a delta over the parts"])
    a = rec.open()                      # log 0: the coordinator
    b = rec.open()                      # log 1
    p = Worker(path, opts)              # log 2: a participant in another process
    try:
        assert (log_of_store(a), log_of_store(b), p.log) == (0, 1, 2)
        ranks = ["rank0", "rank1", "rank2"]
        state = {"r0": bytearray(rand_bytes(rng, 24 << 10)),
                 "r1": bytearray(text_bytes(rng, 16 << 10) + rand_bytes(rng, 8 << 10)),
                 "r1.opt": bytearray(rand_bytes(rng, 12 << 10)),
                 "r2": bytearray(rand_bytes(rng, 20 << 10))}

        def parts(step: int) -> dict:
            return {"rank0": ({"r0": bytes(state["r0"])}, {"offset": 1000 * step}),
                    "rank1": ({"r1": bytes(state["r1"]), "r1.opt": bytes(state["r1.opt"])},
                              {"offset": 1000 * step + 1, "note": "two buffers"}),
                    "rank2": ({"r2": bytes(state["r2"])}, {"offset": 1000 * step + 2,
                                                           "pid": "other process"})}

        def stage(group_id: str, part: dict, who: dict) -> None:
            for name, (buffers, meta) in part.items():
                if who[name] is p:
                    p("stage", group=group_id, participant=name, buffers=hexed(buffers),
                      meta=meta)
                else:
                    who[name].stage(group_id, name, buffers, meta)

        who = {"rank0": a, "rank1": b, "rank2": p}
        g = a.group("train", ranks, timeout=600)
        step1 = parts(1)
        stage(g.id, step1, who)
        g1 = rec.group_commit(g, step1, {"step": 1})
        assert g1.kind == "full" and g1.seq == 1, g1

        # incremental: a page or two per rank; rank1 stages twice (what it staged first, a
        # different change, is garbage)
        state["r0"][4096:8192] = rand_bytes(rng, 4096)
        state["r2"][0:100] = bytes(100)
        g = a.group("train", ranks, timeout=600)
        step2 = parts(2)
        state["r1"][0:4096] = rand_bytes(rng, 4096)
        stage(g.id, {"rank1": parts(2)["rank1"]}, who)      # replaced below
        state["r1"][0:4096] = step1["rank1"][0]["r1"][0:4096]
        state["r1"][20000:20010] = b"staged 2nd"
        step2["rank1"] = parts(2)["rank1"]
        stage(g.id, step2, who)
        g2 = rec.group_commit(g, step2, {"step": 2})
        assert g2.kind == "incremental" and g2.parent == g1.id, g2

        # aborted: nothing of it is visible, its parts are garbage
        g = a.group("train", ranks, timeout=600)
        stage(g.id, {"rank0": ({"r0": rand_bytes(rng, 24 << 10)}, {"offset": -1}),
                     "rank2": ({"r2": rand_bytes(rng, 20 << 10)}, {"offset": -1})}, who)
        assert g.abort()

        # coordinated by the other process, on a new stream; participants named by a count
        gid = p("group", stream="ingest", participants=2, timeout=600)["group"]
        ingest = {"0": ({"batch/0": text_bytes(rng, 6000)}, {"rows": 60}),
                  "1": ({"batch/1": text_bytes(rng, 7000)}, {"rows": 70})}
        a.stage(gid, "0", *ingest["0"])
        b.stage(gid, "1", *ingest["1"])
        info = a.get(p("commit", group=gid, meta={"batch": 1})["id"])
        rec.took_group(info, ingest)

        # a plain checkpoint of the group stream: every part's buffers, a delta
        state["r2"][8192:8200] = b"plain ck"
        plain = rec.checkpoint(b, {k: bytes(v) for k, v in state.items()}, "train",
                               {"step": 3})
        assert plain.kind == "incremental" and plain.parent == g2.id, plain
    finally:
        a.close()
        b.close()
        p.close()
    return rec.finish()


def make_interrupted_writers(path: str) -> dict:
    """Format 3's crash states, one per writer, all left for the next writer's open: while
    this process's writer (log 0) stays open, three writer processes open (logs 1, 2, 3) and
    are SIGKILLed in turn -- a compaction right after its state section was durable (log 2: a
    complete section past its log's applied position, never noted); a checkpoint once its
    commit record was in its log (log 3: its claim, pinning a chunk of log 0, left in the
    index, the record past applied: readers do not see it, a writer's recovery publishes it);
    the coordinator of a group with two staged parts (log 1: the group's claim, header and
    parts left behind), killed inside a delete_many once both records were in its log, whose
    second record is then cut short (a torn tail: the batch never completed, recovery cuts
    it, none of it is applied)."""
    rng = np.random.default_rng(11011)
    opts = dict(durability="none", segment_size=SEGMENT)
    rec = Recorder(path, opts, [
        "a compaction process killed at compact_after_state (log 2): a complete state section "
        "covering logs 0, 1 and 2, past log 2's applied position, never noted (segment 1 of "
        "log 0, which it chose, stays; the chunk entries it collected are gone)",
        "a checkpoint process killed at after_commit_append (log 3): its commit claim, pinning "
        "a reused chunk of log 0, left in the index, its commit record past applied (log 3 "
        "has none): readers do not see it, the next writer's recovery publishes it",
        "a dead group coordinator (log 1): the group's claim and header and two staged parts "
        "(one in log 1, one in log 0) left in the index; the next writer's recovery drops "
        "them (the parts' chunks are garbage)",
        "a torn tail in log 1: the coordinator was killed inside a delete_many of 2 once both "
        "records were in its log, then the second record was cut short (a torn batch: "
        "applied by nobody, cut by recovery; its claim left in the index)"])
    a = rec.open()                                           # log 0, open throughout
    try:
        tmp = rec.checkpoint(a, {"tmp": rand_bytes(rng, 48 << 10)}, "tmp", None)
        data = bytearray(rand_bytes(rng, 24 << 10) + text_bytes(rng, 8 << 10))
        c1 = rec.checkpoint(a, {"a": data}, "s", {"n": 1})
        first = bytes(data)
        data[0:4096] = rand_bytes(rng, 4096)
        c2 = rec.checkpoint(a, {"a": data}, "s", {"n": 2})
        e1 = rec.checkpoint(a, {"e": text_bytes(rng, 9000)}, "e", {"n": 1})
        a.tag(c1.id, "first")
        rec.delete(a, tmp.id)              # garbage in log 0's first segment, now sealed
        assert segment_numbers(path) == [1, 2], segment_numbers(path)

        coordinator = Worker(path, opts)
        assert (log_of_store(a), coordinator.log) == (0, 1)
        gid = coordinator("group", stream="g", participants=["c", "a"], timeout=600)["group"]
        coordinator("stage", group=gid, participant="c",
                    buffers=hexed({"gc": rand_bytes(rng, 12 << 10)}), meta={"offset": 7})
        a.stage(gid, "a", {"ga": rand_bytes(rng, 10 << 10)}, {"offset": 8})
        compactor = Worker(path, opts)
        committer = Worker(path, opts)
        assert (compactor.log, committer.log) == (2, 3)

        compactor("crash_at", point="compact_after_state")
        compactor.killed_by("compact")
        assert segment_numbers(path) == [1, 2, 10 ** 9 + 1, 2 * 10 ** 9 + 1, 3 * 10 ** 9 + 1], \
            segment_numbers(path)              # log 0's segment 1, chosen, is still there

        # the checkpoint: c1's whole buffer again (its chunk, reused and pinned) and a new one
        k = {"x": first, "y": text_bytes(rng, 3000)}
        committer("crash_at", point="after_commit_append")
        committer.killed_by("checkpoint", buffers=hexed(k), stream="k", meta={"n": "killed"})
        rec.max_id += 1                    # its id, claimed: the recovery publishes it
        rec.taken["k"] = 1
        rec.inputs[rec.max_id] = {n: sha256(v) for n, v in k.items()}

        coordinator("crash_at", point="after_commit_append")
        coordinator.killed_by("delete_many", ids=[c1.id, e1.id])
    finally:
        a.close()
    last = max(n for n in segment_numbers(path) if n // 10 ** 9 == 1)
    last = os.path.join(path, "segments", f"{last:016d}.seg")
    os.truncate(last, os.path.getsize(last) - 5)      # the batch's second record, cut short
    return rec.finish(readonly_ids=[c1.id, c2.id, e1.id])


def make_floats(path: str) -> dict:
    """Format 4: chunks of float buffers as byte planes (CODEC_PLANES): NumPy float16 /
    float32 / float64 weights full, then a delta and an all-changed full; an odd tail of
    items; incompressible "floats" (random bytes typed float32: stored raw); a buffer of
    zeros (planes that all compress); small float buffers (one zstd frame); torch float32,
    float16 and bfloat16 tensors through snapstore.torch.save, and a second save."""
    rng = np.random.default_rng(4004)
    opts = dict(durability="none", segment_size=SEGMENT)
    rec = Recorder(path, opts, [
        "byte-plane chunks (codec 2) of float16/32/64 buffers", "a delta of float pages",
        "an all-changed float buffer stored full", "an odd item tail",
        "incompressible floats stored raw", "zeros as planes", "small floats: one zstd frame",
        "torch float32/float16/bfloat16 through snapstore.torch.save, twice"])
    with rec.open() as s:
        w32 = (rng.standard_normal(20_001) * 0.02).astype(np.float32)
        w16 = (rng.standard_normal(12_000) * 0.02).astype(np.float16)
        w64 = rng.standard_normal(3_000) * 0.02
        rec.checkpoint(s, {"w32": w32, "w16": w16, "w64": w64}, "weights", {"step": 0})
        w32[::8192] *= np.float32(1.01)
        d = rec.checkpoint(s, {"w32": w32, "w16": w16, "w64": w64}, "weights", {"step": 1})
        assert d.kind == "incremental", d
        w32 *= np.float32(1.001)
        w16 *= np.float16(1.01)
        w64 *= 1.001
        f = rec.checkpoint(s, {"w32": w32, "w16": w16, "w64": w64}, "weights", {"step": 2})
        assert f.kind == "full", f
        noise = np.frombuffer(rand_bytes(rng, 16 << 10), np.float32)
        rec.checkpoint(s, {"noise": noise, "zeros": np.zeros(4_000, np.float32),
                           "small": np.ones(100, np.float32)}, "other")
    import torch
    import snapstore.torch as st
    torch.manual_seed(4)
    t = torch.randn(8_000) * 0.02
    state = {"f32": t, "f16": t.half(), "bf16": t.bfloat16()}
    with rec.open() as s:
        for step in range(2):
            info = st.save(s, state, "torch", meta={"step": step})
            rec.took(info)
            loaded = st.load(s, info.id)
            assert all(torch.equal(loaded[k], v) for k, v in state.items())
            rec.loads[info.id] = {"api": "torch", "value": describe(loaded)}
            state = {k: v * 1.01 for k, v in state.items()}
    return rec.finish()


def make_rotated(path: str) -> dict:
    """Format 6: byte-plane chunks whose items are rotated by the bits the writer's probe chose
    (CODEC_PLANES flags): float32, bfloat16 (NumPy has no bfloat16: their bits typed float16)
    and float64 weights rotated by 3, float16 weights by 1, in one full checkpoint; an odd item tail; then a delta of a few pages of each, an all-changed float32
    buffer stored full again (rotated by 3), and, by a delta_chunks writer, every item
    changed a little (delta chunks, flags 0, against the rotated keyframes); torch float32
    and bfloat16 tensors through snapstore.torch.save. compression_level 3: the version that
    made stores/v6 (a9c495e) tried rotation 3 at every level, later ones from level 3 on
    (writer.ROTATIONS_FROM_LEVEL); level 3 also makes the one zstd frame here (the torch
    save's pickle) with zstd level 3."""
    rng = np.random.default_rng(6006)
    opts = dict(durability="none", segment_size=SEGMENT, compression_level=3)
    rec = Recorder(path, opts, [
        "byte-plane chunks of float32, bfloat16 and float64 weights rotated by 3 bits "
        "(flags 3)", "byte-plane chunks of float16 weights rotated by 1 bit (flags 1)",
        "an odd item tail", "a delta of float pages", "an all-changed float32 buffer full",
        "delta chunks (codec 3) against rotated keyframes",
        "torch float32/bfloat16 through snapstore.torch.save"])
    w32 = (rng.standard_normal(40_001) * 0.02).astype(np.float32)
    bf16 = (w32.view(np.uint32)[:30_000] >> 16).astype(np.uint16).view(np.float16)
    w16 = (rng.standard_normal(20_000) * 0.02).astype(np.float16)
    w64 = rng.standard_normal(9_000) * 0.02
    with rec.open() as s:
        rec.checkpoint(s, {"w32": w32, "bf16": bf16, "w16": w16, "w64": w64}, "weights",
                       {"step": 0})
        w32[::8192] *= np.float32(1.01)
        d = rec.checkpoint(s, {"w32": w32, "bf16": bf16, "w16": w16, "w64": w64}, "weights",
                           {"step": 1})
        assert d.kind == "incremental", d
        w32 *= np.float32(1.001)
        f = rec.checkpoint(s, {"w32": w32}, "solo", {"step": 2})
        assert f.kind == "full", f
    with rec.open(delta_chunks=True) as s:
        w32 *= (1 + rng.normal(0, 0.01, w32.size)).astype(np.float32)
        rec.checkpoint(s, {"w32": w32, "bf16": bf16, "w16": w16, "w64": w64}, "weights",
                       {"step": 3})
    import torch
    import snapstore.torch as st
    torch.manual_seed(6)
    t = torch.randn(20_000) * 0.02
    state = {"f32": t, "bf16": t.bfloat16()}
    with rec.open() as s:
        info = st.save(s, state, "torch", meta={"step": 0})
        rec.took(info)
        loaded = st.load(s, info.id)
        assert all(torch.equal(loaded[k], v) for k, v in state.items())
        rec.loads[info.id] = {"api": "torch", "value": describe(loaded)}
    return rec.finish()


def make_deltas(path: str) -> dict:
    """Format 5: delta chunks (CODEC_DELTA_PLANES). A stream of float weights (float32 of a 64
    KiB chunk and a 400-byte one, float16 and float64 of one 16 KiB chunk each) whose every
    item changes a little (1%) from one checkpoint to the next: a keyframe checkpoint (byte
    planes), then checkpoints whose chunks are deltas against the keyframe's chunk at the same
    place (every delta one level deep: the writer codes against the keyframe its parent's
    delta chunk names), a chunk whose delta stopped paying stored whole again (a new keyframe),
    the same bytes in another stream (its extents reuse delta chunks), an incremental
    checkpoint of a few pages between them; the keyframe checkpoint deleted (its
    chunks live on only as the bases of delta chunks: their index counts are edges alone) and
    the first delta checkpoint too (its delta chunks garbage, their edges gone with them), a
    compaction that removed segments and moved bases, a tag, and a checkpoint after the
    compaction coded against the moved keyframes."""
    rng = np.random.default_rng(5005)
    opts = dict(durability="none", segment_size=SEGMENT, delta_chunks=True)
    rec = Recorder(path, opts, [
        "delta chunks (codec 3) of float32, float16 and float64 buffers against the parent's "
        "chunk at the same place (its keyframe), depth 1, a commit's delta_bases table",
        "a short (400-byte) float32 chunk coded as a delta", "a chunk whose delta stopped "
        "paying stored whole again: a new keyframe (KEYFRAME_FRACTION)",
        "a checkpoint of another stream whose extents reuse delta chunks (deduplicated)",
        "an incremental checkpoint (a few changed pages) between delta checkpoints; after it "
        "the chunk it changed pages of, held by its parent only in pieces, is stored whole",
        "the keyframe checkpoint deleted: its chunks only bases (counts = edges)",
        "a delta checkpoint deleted: its delta chunks collected, their edges dropped",
        "a compaction that removed segments and moved base chunks", "a tag",
        "a delta checkpoint after the compaction against the moved keyframes"])
    w32 = (rng.standard_normal(16_384 + 100) * 0.02).astype(np.float32)
    w16 = (rng.standard_normal(8_192) * 0.02).astype(np.float16)
    w64 = rng.standard_normal(2_048) * 0.02

    def step(x):
        return (x * (1 + rng.normal(0, 0.01, x.size))).astype(x.dtype)

    def entries(s) -> dict:                         # generator-only peek at the index
        with s._committer.read() as r:
            return dict(r.chunks())

    def chunks_of(s, cid: int) -> set:
        with s._committer.read() as r:
            return {e[3] for i in range(len(r.checkpoint(cid).buffers))
                    for e in struct.iter_unpack("<QII32s", r.manifest(cid, i))}

    with rec.open() as s:
        k = rec.checkpoint(s, {"w32": w32, "w16": w16, "w64": w64}, "weights", {"step": 0})
        keyframes = chunks_of(s, k.id)
        assert all(entries(s)[c].base is None for c in keyframes)
        w32, w16, w64 = step(w32), step(w16), step(w64)
        d1 = rec.checkpoint(s, {"w32": w32, "w16": w16, "w64": w64}, "weights", {"step": 1})
        assert d1.kind == "full", d1
        e = entries(s)
        assert all(e[c].codec == 3 and e[c].base in keyframes for c in chunks_of(s, d1.id)), \
            "every chunk of the first step is a delta against the keyframe at its place"
        w32, w16, w64 = step(w32), step(w16), step(w64)
        d2 = rec.checkpoint(s, {"w32": w32, "w16": w16, "w64": w64}, "weights", {"step": 2})
        e = entries(s)
        d2_chunks = chunks_of(s, d2.id)
        assert {e[c].base for c in d2_chunks if e[c].base} <= keyframes    # one level deep
        renewed = [c for c in d2_chunks if e[c].base is None]
        assert renewed, "no chunk was stored whole again (a new keyframe)"
        # the same float32 bytes in another stream: its extents reuse d2's delta chunks
        copy = rec.checkpoint(s, {"w32": w32}, "copy", {"of": d2.id})
        assert copy.kind == "full" and copy.bytes_new < 1024, copy
        assert any(e[c].codec == 3 for c in chunks_of(s, copy.id))
        w32[5_000:5_010] *= np.float32(1.5)         # one page: an incremental checkpoint
        i3 = rec.checkpoint(s, {"w32": w32, "w16": w16, "w64": w64}, "weights", {"step": 3})
        assert i3.kind == "incremental" and i3.chain_length == 1, i3
        rec.delete(s, k.id)                         # the keyframes: bases only
        rec.delete(s, d1.id)                        # its delta chunks: garbage
        e = entries(s)
        assert all(e[c].refs == sum(1 for x in e.values() if x.base == c) for c in keyframes), \
            "keyframe counts are not edges alone"
        # the bases of live delta chunks (d2's, i3's) stay; those only d1's deltas named go
        live_bases = {x.base for x in e.values() if x.base is not None and x.refs > 0}
        dead_bases = keyframes - live_bases
        assert live_bases and dead_bases, (live_bases, dead_bases)
        report = s.compact(threshold=0.9)
        assert report["segments_removed"] and report["chunks_freed"], report
        moved = entries(s)
        assert all(x.refs > 0 for x in moved.values())            # the garbage collected
        assert live_bases <= set(moved) and not dead_bases & set(moved)
        assert any(moved[c].segment != e[c].segment for c in live_bases), "no base moved"
        s.tag(d2.id, "kept")
        w32, w16, w64 = step(w32), step(w16), step(w64)
        d4 = rec.checkpoint(s, {"w32": w32, "w16": w16, "w64": w64}, "weights", {"step": 4})
        assert d4.kind == "full" and d4.parent == i3.id, d4
        e = entries(s)
        d4_deltas = [c for c in chunks_of(s, d4.id) if e[c].codec == 3]
        assert d4_deltas and any(e[c].base in keyframes for c in d4_deltas)
        assert all(e[e[c].base].base is None for c in d4_deltas)
        first = [c for c in chunks_of(s, d4.id) if e[c].raw_len == 65_536]
        assert len(first) == 1 and e[first[0]].base is None      # w32's first chunk: whole
    return rec.finish()


def segment_numbers(path: str) -> list[int]:
    return sorted(int(n[:-4]) for n in os.listdir(os.path.join(path, "segments")))


# {store: {the first format it is made for: its recipe}}: each format makes the stores of the
# formats before it with the same recipes (same seeds and steps), plus its own; a store whose
# recipe changed at a format is made by the newest recipe not newer than the format.
RECIPES = {"basic": {1: make_basic}, "raw_cdc": {1: make_raw_cdc}, "objects": {1: make_objects},
           "torch": {1: make_torch}, "unapplied": {1: make_unapplied},
           "compacted": {2: make_compacted}, "upgraded": {2: make_upgraded},
           "interrupted": {2: make_interrupted_compactions, 3: make_interrupted_writers},
           "writers": {3: make_writers}, "group": {3: make_group}, "floats": {4: make_floats},
           "deltas": {5: make_deltas}, "rotated": {6: make_rotated}}


def recipe(name: str, version: int):
    """The recipe of store `name` for format `version` (None: not a store of that format)."""
    made = [v for v in RECIPES[name] if v <= version]
    return RECIPES[name][max(made)] if made else None


def main() -> None:
    global VERSION
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="directory for stores/<version>/ (default: tests/golden); "
                    "must not hold that version already")
    ap.add_argument("--only", nargs="*", choices=sorted(RECIPES))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:         # what version does this code write?
        with snapstore.open(os.path.join(tmp, "probe")):
            pass
        with open(os.path.join(tmp, "probe", "FORMAT")) as f:
            VERSION = json.load(f)["version"]
    root = os.path.join(args.out or HERE, "stores", f"v{VERSION}")
    if os.path.exists(root):
        raise SystemExit(f"{root} exists: golden stores are never regenerated (see the module "
                         "doc); use --out for a scratch copy")
    os.makedirs(root)
    print(f"snapstore {snapstore.__file__}: format version {VERSION} -> {root}")
    for name in args.only or [n for n in RECIPES if recipe(n, VERSION)]:
        make = recipe(name, VERSION)
        if make is None:
            raise SystemExit(f"{name}: a store of format {min(RECIPES[name])} on")
        path = os.path.join(root, name)
        expected = make(path)
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)
        print(f"  {name}: {len(expected['checkpoints'])} checkpoints, segments "
              f"{expected['segments']}, {size} bytes")


if __name__ == "__main__":
    main()
