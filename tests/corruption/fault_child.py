"""The fault matrix (issue 14): damage every file of a store in every way, then use the store
through every public entry point, each case in a subprocess so a signal or a hang is caught.

Only the public surface is used: snapstore.open(path, readonly=..), Store methods,
snapstore.errors and the `snapstore` command line (snapstore.cli.main, the function the
console script runs), so the matrix survives any refactoring of the engine.

    python fault_child.py build DIR
        Builds the fixture store DIR/store (several streams, full and incremental checkpoints,
        zstd and raw chunks, tags, a deleted checkpoint, a compaction, several 64 KiB
        segments), a "twin" store DIR/twin of the same shape but other bytes (the source of
        "foreign" files), and DIR/expected.json: every checkpoint's fields, every buffer's
        sha256, read ranges and their sha256, the streams and their heads. The clock is frozen
        while building, so two builds are byte-identical and a case replays exactly.

    python fault_child.py worker DIR WORK SEED
        Runs cases named on stdin (one id a line) against copies of DIR/store made under WORK;
        answers each with one line "V <json verdict>" on stdout. Prints "READY" first.

    python fault_child.py repro CASE [--seed N] [--keep DIR]
        Rebuilds the fixture, runs one case in a fresh worker and prints its verdict; keeps the
        damaged store (printed) for inspection.

    python fault_child.py matrix [--seed N] [--filter TEXT] [--workers 2]
        Runs the whole matrix (or the cases whose id contains TEXT) and prints the failures
        grouped by cause, with a reproduction command for each group.

A case id is "TARGET:DAMAGE:ENTRY", e.g. "index/data.mdb:trunc_half:restore":
  TARGET  FORMAT, lock, index, index/data.mdb, index/lock.mdb, segments, segments/K (the K-th
          segment file in number order), segments/last (the newest, the one a writer appends
          to); "intact:none:ENTRY" are the controls
  DAMAGE  FILE_DAMAGES (files) and DIR_DAMAGES (the two directories)
  ENTRY   ENTRIES
Bit flips take their offsets from SEED (SNAPSTORE_FAULT_SEED), target and damage name.

Verdict: {"case", "failures": [{"cause", "detail"}], "errors": [...], "notes": [...]}. A case
passes iff failures is empty. The rules (Verdict, Context, check_cli_error and the entry_*
functions): every byte returned equals the expected bytes; every exception is a snapstore.errors.SnapstoreError; no acknowledged
checkpoint silently vanishes (listing without it, CheckpointNotFound); the CLI exits 0 with
correct output, or 1/2 with exactly one line "snapstore: error: ..." that is no "internal
error" and no traceback. Stricter where the issue promises more (see `Case.strict_*`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import random
import resource
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PAGE = 4096
SEGMENT_SIZE = 1 << 16
# The options every writer opens the fixture with: small segments (so there are several) and
# chunks, and no fsync (nothing here needs it; it keeps the matrix fast).
STORE_OPTIONS = dict(durability="none", segment_size=SEGMENT_SIZE, chunk_size=16 << 10)
SEGMENT_TARGETS = 6            # the fixture has exactly this many segment files (checked;
                               # 6 since compaction writes a state section: issue 14)

FILE_DAMAGES = ("trunc0", "trunc_half", "trunc_minus1", "flip1", "flip2", "flip3", "delete",
                "zero", "as_dir", "as_fifo", "symlink_dangling", "symlink_other",
                "symlink_foreign")
DIR_DAMAGES = ("delete", "empty", "as_file", "as_fifo", "symlink_dangling", "symlink_other",
               "symlink_foreign")
CONTENT_DAMAGES = ("trunc0", "trunc_half", "trunc_minus1", "flip1", "flip2", "flip3", "zero")

ENTRIES = ("open_writer", "open_readonly", "checkpoints", "restore", "read", "verify",
           "verify_deep", "compact", "checkpoint", "repair", "cli_ls", "cli_show",
           "cli_verify", "cli_verify_deep", "cli_restore")


def targets() -> list:
    return (["FORMAT", "lock", "index", "index/data.mdb", "index/lock.mdb", "segments"] +
            [f"segments/{k}" for k in range(SEGMENT_TARGETS - 1)] + ["segments/last"])


def damages_of(target: str) -> tuple:
    """The damages done to a target: no foreign copy where another store's file would be
    the same bytes, no content damage to the empty lock file (it would change nothing)."""
    if target in ("index", "segments"):
        return DIR_DAMAGES
    if target == "lock":
        return tuple(d for d in FILE_DAMAGES if d not in CONTENT_DAMAGES + ("symlink_foreign",))
    if target in ("FORMAT", "index/lock.mdb"):
        return tuple(d for d in FILE_DAMAGES if d != "symlink_foreign")
    return FILE_DAMAGES


def all_cases() -> list:
    """Every case id, the controls ("intact:none:ENTRY") first."""
    out = [f"intact:none:{e}" for e in ENTRIES]
    for t in targets():
        for d in damages_of(t):
            out += [f"{t}:{d}:{e}" for e in ENTRIES]
    return out


@dataclasses.dataclass(frozen=True)
class Case:
    """One case: a damage done to a target, then an entry point used."""
    id: str
    target: str
    damage: str
    entry: str

    @classmethod
    def parse(cls, case_id: str) -> "Case":
        target, damage, entry = case_id.split(":")
        if entry not in ENTRIES:
            raise ValueError(f"unknown entry point {entry!r} in case {case_id!r}")
        return cls(case_id, target, damage, entry)

    @property
    def in_index(self) -> bool:
        return self.target == "index" or self.target.startswith("index/")

    @property
    def strict_harmless(self) -> bool:
        """Damage nothing reads: every entry point must behave exactly as on the intact store
        (no error at all). The lock files' content is never data: `lock` is only flock()ed and
        LMDB re-initialises index/lock.mdb when the first process opens the environment."""
        if self.damage == "none":
            return True
        return self.target in ("lock", "index/lock.mdb") and \
            self.damage in CONTENT_DAMAGES + ("delete",)

    @property
    def strict_truncated_index(self) -> bool:
        """Issue 14 (3): a truncated index/data.mdb is detected at open and raises
        CorruptionError naming `snapstore repair` (readers, writers, the CLI)."""
        return self.target == "index/data.mdb" and self.damage in ("trunc_half", "trunc_minus1")

    @property
    def cuts_the_log(self) -> bool:
        """Damage that cuts the end off the newest segment, or removes it: the index then
        names records past the log's end, which every writer open refuses, so repair
        replaces it by the index rebuilt from the log (docs/design.md, "Repair"). The store
        then shows an earlier state of its history: a stream's head may be an older
        checkpoint, and a tag whose record was cut is gone."""
        return self.target == "segments/last" and self.damage in (
            "trunc0", "trunc_half", "trunc_minus1", "delete")

    @property
    def strict_repair(self) -> bool:
        """Issue 14: the index is a rebuildable cache, so `snapstore repair` must undo any
        damage confined to index/ and bring back the same checkpoints, streams, seqs and tags,
        byte-exact."""
        return self.in_index or self.strict_harmless


# ---- content ---------------------------------------------------------------------------------

def _text(tag: str, n: int) -> bytes:
    return (f"<{tag}>" * (n // (len(tag) + 2) + 1)).encode()[:n]


def _edit_pages(rng: random.Random, buf: bytearray, pages: int, text: str | None = None) -> None:
    for _ in range(pages):
        p = rng.randrange(len(buf) // PAGE)
        buf[p * PAGE:(p + 1) * PAGE] = _text(text, PAGE) if text else rng.randbytes(PAGE)


def contents(seed: int = 14) -> dict:
    """{key: (stream, chunking, buffers)} of every checkpoint the fixture (seed 14) or its twin
    (another seed) takes, in order. "train*" chain as page deltas; "docs*" are CDC-chunked;
    "junk0" is deleted before the compaction; "train6" is the one the `checkpoint` entry adds."""
    rng = random.Random(seed)
    w = bytearray(rng.randbytes(96 << 10))                 # incompressible: raw chunks
    z = bytearray(_text(f"z{seed}", 48 << 10))              # compressible: zstd chunks
    out = {}
    for step in range(7):
        if step:
            _edit_pages(rng, w, 3)
            _edit_pages(rng, z, 1, f"z{seed}.{step}")
        bufs = {"w": bytes(w), "z": bytes(z), "tiny": bytes([step]), "empty": b""}
        if step % 2:
            bufs["odd"] = rng.randbytes(5000 + step)          # not page aligned
        out[f"train{step}"] = ("train", "pages", bufs)
    doc = bytearray(_text(f"doc{seed}", 30 << 10) + rng.randbytes(30 << 10))
    for k in range(3):
        at = rng.randrange(len(doc))
        doc[at:at] = rng.randbytes(rng.randint(100, 3000))
        out[f"docs{k}"] = ("docs", "cdc", {"doc": bytes(doc)})
    out["junk0"] = ("junk", "pages", {"junk": rng.randbytes(150 << 10)})
    return out


# The order the fixture is written in: (key, action).
SCRIPT = (("train0", "ckpt"), ("docs0", "ckpt"), ("junk0", "ckpt"), ("train1", "ckpt"),
          ("train2", "ckpt"), ("train3", "ckpt"), ("docs1", "ckpt"), ("train4", "ckpt"),
          ("train3", "tag:best"), ("docs0", "tag:first"), ("train2", "delete"),
          ("junk0", "delete"), ("-", "compact"), ("train5", "ckpt"), ("docs2", "ckpt"),
          ("train5", "tag:best"))
NEW_CHECKPOINT_KEY = "train6"


def _info_dict(info) -> dict:
    d = dataclasses.asdict(info)
    d["tags"] = sorted(d["tags"])
    return d


def _sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


def _ranges(bufs: dict) -> list:
    """A few (buffer, offset, length) read ranges: a head, an unaligned middle, the tail."""
    out = []
    for name, data in sorted(bufs.items()):
        n = len(data)
        if not n:
            out.append((name, 0, 0))
            continue
        for off, length in ((0, min(n, 5000)), (n // 3 + 1, min(n - n // 3 - 1, 20011)),
                            (max(0, n - 777), min(n, 777))):
            out.append((name, off, length))
    return out


@contextlib.contextmanager
def frozen_clock(start: float = 1.7e9):
    """time.time() ticks one second per call: stores built under it are byte-identical."""
    real = time.time
    t = [start]

    def fake() -> float:
        t[0] += 1.0
        return t[0]
    time.time = fake
    try:
        yield
    finally:
        time.time = real


def _write_store(path: str, seed: int, clock: float = 1.7e9) -> dict:
    import snapstore
    data = contents(seed)
    ids, deleted = {}, []
    with frozen_clock(clock), snapstore.open(path, **STORE_OPTIONS) as s:
        for key, action in SCRIPT:
            if action == "ckpt":
                stream, chunking, bufs = data[key]
                ids[key] = s.checkpoint(bufs, stream=stream, meta={"key": key},
                                        chunking=chunking).id
            elif action.startswith("tag:"):
                s.tag(ids[key], action[4:])
            elif action == "delete":
                s.delete(ids[key])
                deleted.append(ids.pop(key))
            elif action == "compact":
                report = s.compact(threshold=0.9)
                assert report["segments_removed"] >= 1, report
        infos = [_info_dict(i) for i in s.checkpoints()]
        heads = {name: s.latest(name).id for name in s.streams()}
    key_of = {cid: key for key, cid in ids.items()}
    checkpoints = []
    for d in infos:
        key = key_of[d["id"]]
        bufs = data[key][2]
        d["key"] = key
        d["sha256"] = {n: _sha(b) for n, b in bufs.items()}
        d["ranges"] = [[n, o, ln, _sha(bufs[n][o:o + ln])] for n, o, ln in _ranges(bufs)]
        checkpoints.append(d)
    return {"checkpoints": checkpoints, "deleted": deleted, "streams": heads,
            "max_id": max(max(ids.values()), max(deleted))}


def build(directory: str) -> dict:
    """Builds DIR/store, DIR/twin and DIR/expected.json (see the module docstring)."""
    store, twin = os.path.join(directory, "store"), os.path.join(directory, "twin")
    if os.path.exists(store) or os.path.exists(twin):
        raise FileExistsError(f"{directory} already holds a fixture: build into a new directory")
    expected = _write_store(store, 14)
    # another store's checkpoints were made at other times (repair tells a foreign index from
    # foreign segments by what its checkpoints are, creation times included)
    _write_store(twin, 41, clock=1.8e9)
    segs = sorted(os.listdir(os.path.join(store, "segments")))
    expected["segments"] = segs
    expected["twin_segments"] = sorted(os.listdir(os.path.join(twin, "segments")))
    # the twin lends its segment of each rank to symlink_foreign: it needs ranks 0..K-2 and
    # a last one
    if len(segs) != SEGMENT_TARGETS or len(expected["twin_segments"]) < SEGMENT_TARGETS - 1:
        raise AssertionError(f"the fixture store has segments {segs} and its twin "
                             f"{expected['twin_segments']}; the matrix names {SEGMENT_TARGETS}: "
                             "adjust SEGMENT_TARGETS or the content")
    expected["files"] = sorted(os.path.relpath(os.path.join(dp, f), store)
                               for dp, _, fs in os.walk(store) for f in fs)
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
    return expected


# ---- damage ----------------------------------------------------------------------------------

def resolve_target(store: str, target: str, expected: dict) -> str:
    """The path a target names inside a store copy."""
    if target.startswith("segments/"):
        return os.path.join(store, "segments", expected["segments"][_segment_rank(target)])
    return os.path.join(store, target)


def _segment_rank(target: str) -> int:
    """"segments/K" is the K-th segment file in number order, "segments/last" the newest."""
    rank = target.split("/", 1)[1]
    return -1 if rank == "last" else int(rank)


def _other(store: str, target: str, expected: dict) -> str:
    """The "other file" a symlink_other damage points at: another file of the same kind."""
    if target.startswith("segments/"):
        segs = expected["segments"]
        k = _segment_rank(target) % len(segs)
        return os.path.join(store, "segments", segs[(k + 1) % len(segs)])
    return os.path.join(store, {"FORMAT": "lock", "lock": "FORMAT",
                                "index/data.mdb": "index/lock.mdb",
                                "index/lock.mdb": "index/data.mdb",
                                "index": "segments", "segments": "index"}[target])


def _lmdb_leaf_areas(data: bytes, psize: int = 4096) -> list:
    """[(start, end)] of the bytes that hold keys, values and node headers in the LIVE leaf
    and overflow pages of an LMDB data file (stale copy-on-write pages are left out: a flip
    there changes nothing). Walks LMDB's own documented page layout: meta pages 0 and 1
    (MDB_meta after a 16-byte page header; the newer txnid wins; MAIN_DBI's MDB_db holds the
    root), page header (pgno u64, pad u16, flags u16, lower u16, upper u16; P_BRANCH 1,
    P_LEAF 2), nodes (lo u16, hi u16, flags u16, ksize u16, key, data; F_BIGDATA 1,
    F_SUBDATA 2: the named databases). [] if the file does not parse."""
    if len(data) < 2 * psize:
        return []
    metas = []
    for p in (0, 1):
        base = p * psize + 16
        magic, = struct.unpack_from("<I", data, base)
        if magic == 0xBEEFC0DE:
            dbs = base + 24                                  # magic, version, address, mapsize
            root, = struct.unpack_from("<Q", data, dbs + 48 + 40)
            txnid, = struct.unpack_from("<Q", data, dbs + 96 + 8)
            metas.append((txnid, root))
    if not metas:
        return []
    areas: list = []
    seen: set = set()

    def walk(pgno: int, main: bool) -> None:
        if pgno in seen or not 2 <= pgno < len(data) // psize:
            return
        seen.add(pgno)
        base = pgno * psize
        flags, lower, upper = struct.unpack_from("<HHH", data, base + 10)
        if not 16 <= lower <= upper <= psize:
            return
        ptrs = struct.unpack_from(f"<{(lower - 16) // 2}H", data, base + 16)
        if flags & 0x02:
            areas.append((base + upper, base + psize))
        for ptr in ptrs:
            node = base + ptr
            if node + 8 > base + psize:
                continue
            lo, hi, nflags, ksize = struct.unpack_from("<HHHH", data, node)
            if flags & 0x01:                                  # branch: child page number
                walk(lo | hi << 16 | nflags << 32, main)
            elif flags & 0x02:
                value = node + 8 + ksize
                if nflags & 0x02 and main and value + 48 <= len(data):     # a named database
                    walk(struct.unpack_from("<Q", data, value + 40)[0], False)
                elif nflags & 0x01 and value + 8 <= len(data):             # overflow pages
                    over, = struct.unpack_from("<Q", data, value)
                    size = lo | hi << 16
                    if 2 <= over and (over * psize + 16 + size) <= len(data):
                        areas.append((over * psize + 16, over * psize + 16 + size))
    try:
        walk(max(metas)[1], True)
    except struct.error:
        return []
    return sorted(areas)


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def damage(store: str, twin: str | None, target: str, kind: str, seed: int,
           expected: dict) -> str:
    """Damages one file or directory of the store copy; returns what it did (for reports)."""
    if kind == "none":
        return "no damage"
    path = resolve_target(store, target, expected)
    rel = os.path.relpath(path, store)
    if kind.startswith("trunc"):
        size = os.path.getsize(path)
        new = {"trunc0": 0, "trunc_half": size // 2, "trunc_minus1": max(0, size - 1)}[kind]
        os.truncate(path, new)
        return f"truncated {rel} from {size} to {new} bytes"
    if kind.startswith("flip"):
        with open(path, "rb") as f:
            data = bytearray(f.read())
        if not data:
            return f"{rel} is empty: nothing to flip"
        rng = random.Random(f"{seed}|{target}|{kind}")
        # flip1 anywhere; flip2/flip3 where something is stored: in index/data.mdb inside the
        # keys and values of its live LMDB leaf pages (most of the file is free space or
        # stale pages, where a flip proves little), elsewhere in a non-zero byte
        if kind == "flip1":
            off = rng.randrange(len(data))
        else:
            areas = _lmdb_leaf_areas(data) if target == "index/data.mdb" else []
            if areas:                    # uniform over all their bytes
                at = rng.randrange(sum(hi - lo for lo, hi in areas))
                for lo, hi in areas:
                    if at < hi - lo:
                        off = lo + at
                        break
                    at -= hi - lo
            else:
                nonzero = [i for i, b in enumerate(data) if b]
                off = rng.choice(nonzero) if nonzero else rng.randrange(len(data))
        bit = rng.randrange(8)
        old = data[off]
        data[off] ^= 1 << bit
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(bytes([data[off]]))
        return f"flipped bit {bit} of byte {off} of {rel} (0x{old:02x} -> 0x{data[off]:02x})"
    if kind == "zero":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(bytes(size))
        return f"zero-filled {rel} ({size} bytes)"
    if kind == "delete":
        _remove(path)
        return f"deleted {rel}"
    if kind == "empty":
        shutil.rmtree(path)
        os.mkdir(path)
        return f"emptied the directory {rel}"
    if kind == "as_dir":
        _remove(path)
        os.mkdir(path)
        return f"replaced {rel} by an empty directory"
    if kind == "as_file":
        _remove(path)
        with open(path, "wb") as f:
            f.write(b"not a directory\n")
        return f"replaced the directory {rel} by a 16-byte file"
    if kind == "as_fifo":
        _remove(path)
        os.mkfifo(path)
        return f"replaced {rel} by a FIFO"
    if kind == "symlink_dangling":
        _remove(path)
        os.symlink(os.path.basename(path) + ".missing", path)
        return f"replaced {rel} by a dangling symlink"
    if kind == "symlink_other":
        other = _other(store, target, expected)
        _remove(path)
        os.symlink(os.path.relpath(other, os.path.dirname(path)), path)
        return f"replaced {rel} by a symlink to {os.path.relpath(other, store)}"
    if kind == "symlink_foreign":      # the same file of the twin (its segment of that rank)
        foreign = os.path.join(twin, rel)
        if target.startswith("segments/"):
            foreign = os.path.join(twin, "segments",
                                   expected["twin_segments"][_segment_rank(target)])
        if not os.path.lexists(foreign):
            raise AssertionError(f"the twin store has no {rel}")
        _remove(path)
        os.symlink(foreign, path)
        return f"replaced {rel} by a symlink to the same file of another store"
    raise ValueError(f"unknown damage {kind!r}")


# ---- verdicts --------------------------------------------------------------------------------

def _where(exc: BaseException) -> str:
    """The innermost snapstore frame of an exception (file:line function), for grouping."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.sep + "snapstore" + os.sep in f.filename]
    if not frames:
        return "?"
    f = frames[-1]
    rel = f.filename.split(os.sep + "snapstore" + os.sep, 1)[1]
    return f"snapstore/{rel}:{f.lineno} {f.name}"


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class Verdict:
    def __init__(self, case: Case, damage_done: str) -> None:
        self.case = case
        self.damage_done = damage_done
        self.root = ""                 # the case's directory, written <CASE> in reports
        self.failures: list = []
        self.errors: list = []
        self.notes: list = []

    def fail(self, cause: str, detail: str, key: str = "") -> None:
        """key: what groups this failure with others of the same cause (exception type and
        place, signal, ...); defaults to the damaged target and damage."""
        self.failures.append({"cause": cause, "detail": self.clean(_one_line(detail, 600)),
                              "key": self.clean(key or f"{self.case.target} {self.case.damage}")})

    def clean(self, text: str) -> str:
        return text.replace(self.root, "<CASE>") if self.root else text

    def note(self, text: str) -> None:
        self.notes.append(_one_line(text))

    def error(self, op: str, exc: BaseException) -> None:
        """Records an exception raised by the store; a non-SnapstoreError is a failure, and
        so is any error where the damage is harmless."""
        from snapstore.errors import SnapstoreError
        typ = type(exc)
        entry = {"op": op, "type": typ.__name__, "module": typ.__module__,
                 "snapstore_error": isinstance(exc, SnapstoreError),
                 "message": self.clean(_one_line(str(exc))), "where": _where(exc)}
        self.errors.append(entry)
        if not entry["snapstore_error"]:
            self.fail("raw-exception", f"{op}: {typ.__module__}.{typ.__name__}: "
                      f"{entry['message']} (at {entry['where']})",
                      key=f"{typ.__module__}.{typ.__name__} at {entry['where']}")
        elif self.case.strict_harmless:
            self.fail("spurious-error", f"{op}: {typ.__name__}: {entry['message']} (the damage "
                      f"is to nothing the store reads: {self.damage_done})",
                      key=f"{typ.__name__} at {entry['where']}")

    def as_json(self) -> dict:
        return {"case": self.case.id, "damage_done": self.damage_done,
                "failures": self.failures, "errors": self.errors, "notes": self.notes}


def attempt(v: Verdict, op: str, fn, *args, **kw):
    """(True, result) or (False, exception) after recording the exception."""
    try:
        return True, fn(*args, **kw)
    except Exception as exc:        # noqa: BLE001 - classified by Verdict.error
        v.error(op, exc)
        return False, exc


def _first_difference(got: bytes, want: bytes) -> str:
    n = min(len(got), len(want))
    first = next((i for i in range(n) if got[i] != want[i]), n)
    diff = sum(1 for i in range(n) if got[i] != want[i]) + abs(len(got) - len(want))
    return (f"{len(got)} bytes vs {len(want)} expected, {diff} differ, first at byte {first}"
            + (f" (got 0x{got[first]:02x}, want 0x{want[first]:02x})" if first < n else ""))


# CheckpointInfo fields a listing must reproduce exactly.
FIELDS_ALL = ("id", "stream", "kind", "parent", "created", "meta", "sizes", "bytes_new",
              "chain_length", "tags", "seq")
# What must survive compaction and repair (issue 14: "the same checkpoints, streams, seqs and
# tags exist"): a repair or chain folding may rebase a delta into a full manifest.
FIELDS_LOG = ("id", "stream", "created", "meta", "sizes", "tags", "seq")


class Context:
    """What an entry point needs: the damaged store, the expectations, a place for outputs."""

    def __init__(self, case: Case, store: str, out: str, expected: dict, v: Verdict) -> None:
        self.case, self.store, self.out, self.expected, self.v = case, store, out, expected, v
        self.by_id = {c["id"]: c for c in expected["checkpoints"]}

    # -- comparisons
    def bytes_of(self, cid: int, name: str) -> bytes:
        return contents()[self.by_id[cid]["key"]][2][name]

    def check_buffers(self, op: str, cid: int, got: dict, wanted_sha: dict | None = None,
                      want_bytes: dict | None = None) -> bool:
        """Every buffer of a restored checkpoint equals the expected bytes."""
        want = wanted_sha or self.by_id[cid]["sha256"]
        ok = True
        if sorted(got) != sorted(want):
            self.v.fail("wrong-bytes", f"{op}: checkpoint {cid} restored buffers {sorted(got)}, "
                        f"expected {sorted(want)}")
            ok = False
        for name in sorted(set(got) & set(want)):
            if _sha(got[name]) != want[name]:
                real = want_bytes[name] if want_bytes else self.bytes_of(cid, name)
                self.v.fail("wrong-bytes", f"{op}: checkpoint {cid} buffer {name!r}: "
                            f"{_first_difference(bytes(got[name]), real)}")
                ok = False
        return ok

    def check_listing(self, op: str, infos: list, fields: tuple, allow_missing: bool = False,
                      extra_ok: tuple = (), earlier: bool = False) -> None:
        """A listing (dicts of CheckpointInfo fields) against the expected checkpoints: no
        unknown or resurrected id, the listed fields equal, and nothing missing unless
        allow_missing, oldest first. earlier: an earlier state of the history is right too
        (tags a subset of the expected ones: Case.cuts_the_log)."""
        ids = [d["id"] for d in infos]
        if ids != sorted(ids):
            self.v.fail("wrong-listing", f"{op}: ids not oldest first: {ids}", key="order")
        for d in infos:
            cid = d["id"]
            if cid in extra_ok:
                continue
            if cid in self.expected["deleted"]:
                self.v.fail("resurrected", f"{op}: deleted checkpoint {cid} is listed again",
                            key=f"deleted checkpoint {cid} listed")
                continue
            want = self.by_id.get(cid)
            if want is None:
                self.v.fail("wrong-listing", f"{op}: unknown checkpoint {cid} listed: {d}",
                            key="unknown checkpoint listed")
                continue
            for f in fields:
                g = sorted(d[f]) if f == "tags" else d.get(f)
                if f == "tags" and earlier and set(g) <= set(want[f]):
                    continue
                if g != want[f]:
                    self.v.fail("wrong-listing", f"{op}: checkpoint {cid} {f} is {g!r}, "
                                f"expected {want[f]!r}", key=f"field {f} differs")
        missing = sorted(set(self.by_id) - set(ids))
        if missing and not allow_missing:
            self.v.fail("vanished", f"{op}: acknowledged checkpoints {missing} are not listed "
                        "and no error was raised", key=f"checkpoints {missing} not listed")

    def not_found_is_vanished(self, op: str, exc: BaseException, cid: int) -> None:
        from snapstore.errors import CheckpointNotFound
        if isinstance(exc, CheckpointNotFound):
            self.v.fail("vanished", f"{op}: CheckpointNotFound for acknowledged checkpoint "
                        f"{cid}: {_one_line(str(exc))}", key="CheckpointNotFound")

    # -- opening
    @contextlib.contextmanager
    def open(self, readonly: bool, op: str = "", repaired: bool = False):
        """Yields the open store, or None when open raised (recorded). Applies the
        truncated-index rule (not after a repair, which replaced the truncated index)."""
        import snapstore
        op = op or ("open(readonly=True)" if readonly else "open()")
        ok, store = attempt(self.v, op, snapstore.open, self.store, readonly=readonly,
                            create=False, **({} if readonly else STORE_OPTIONS))
        if self.case.strict_truncated_index and not repaired:
            from snapstore.errors import CorruptionError
            if ok:
                self.v.fail("index-truncation-undetected", f"{op} succeeded on a truncated "
                            f"index/data.mdb ({self.v.damage_done})")
            elif not isinstance(store, CorruptionError) or "repair" not in str(store):
                self.v.fail("index-truncation-undetected", f"{op} raised "
                            f"{type(store).__name__}: {_one_line(str(store))}; expected a "
                            "CorruptionError naming `snapstore repair`",
                            key=type(store).__name__)
        if not ok:
            yield None
            return
        try:
            yield store
        finally:
            attempt(self.v, "close()", store.close)

    # -- reads shared by several entry points
    def listing(self, store, op: str, fields: tuple, allow_missing: bool = False,
                extra_ok: tuple = (), earlier: bool = False) -> None:
        """earlier: an earlier state of the history is right too (check_listing), and a
        stream's head may be an older checkpoint of it."""
        ok, infos = attempt(self.v, f"{op} checkpoints()", store.checkpoints)
        if ok:
            self.check_listing(f"{op} checkpoints()", [_info_dict(i) for i in infos], fields,
                               allow_missing, extra_ok, earlier)
        ok, streams = attempt(self.v, f"{op} streams()", store.streams)
        if ok and sorted(streams) != sorted(self.expected["streams"]) and not (
                allow_missing and set(streams) <= set(self.expected["streams"])):
            self.v.fail("vanished" if set(streams) < set(self.expected["streams"])
                        else "wrong-listing",
                        f"{op} streams() is {sorted(streams)}, expected "
                        f"{sorted(self.expected['streams'])}", key="streams() differs")
        for stream, head in sorted(self.expected["streams"].items()):
            ok, info = attempt(self.v, f"{op} latest({stream!r})", store.latest, stream)
            if ok and (info is None or info.id != head) and not (allow_missing and info is None):
                if earlier and info is not None and info.id < head and \
                        self.by_id.get(info.id, {}).get("stream") == stream:
                    continue
                if info is None or info.id not in extra_ok:
                    self.v.fail("wrong-listing", f"{op} latest({stream!r}) is "
                                f"{info.id if info else None}, expected {head}",
                                key="latest() differs")
        for cid, want in sorted(self.by_id.items()):
            ok, info = attempt(self.v, f"{op} get({cid})", store.get, cid)
            if ok:
                self.check_listing(f"{op} get({cid})", [_info_dict(info)], fields,
                                   allow_missing=True, earlier=earlier)
            elif not allow_missing:
                self.not_found_is_vanished(f"{op} get({cid})", info, cid)

    def restore_all(self, store, op: str, allow_missing: bool = False) -> bool:
        """Restores every acknowledged checkpoint (and the deleted one, which must stay
        gone). True iff all restored byte-exact without an error."""
        from snapstore.errors import CheckpointNotFound
        all_ok = True
        for cid in sorted(self.by_id):
            ok, got = attempt(self.v, f"{op} restore({cid})", store.restore, cid)
            if ok:
                all_ok &= self.check_buffers(f"{op} restore({cid})", cid, got)
            else:
                all_ok = False
                if not allow_missing:
                    self.not_found_is_vanished(f"{op} restore({cid})", got, cid)
        for cid in self.expected["deleted"]:
            try:
                got = store.restore(cid)
            except CheckpointNotFound:
                continue
            except Exception as exc:    # noqa: BLE001
                self.v.error(f"{op} restore(deleted {cid})", exc)
                continue
            self.v.fail("resurrected", f"{op} restore({cid}) of a deleted checkpoint returned "
                        f"buffers {sorted(got)}")
        return all_ok


# ---- entry points ----------------------------------------------------------------------------

def entry_open_writer(c: Context) -> None:
    """A writer's open (it recovers the log) keeps every checkpoint as it was."""
    with c.open(readonly=False) as s:
        if s is not None:
            c.listing(s, "writer", FIELDS_LOG)


def entry_open_readonly(c: Context) -> None:
    with c.open(readonly=True):
        pass


def entry_checkpoints(c: Context) -> None:
    with c.open(readonly=True) as s:
        if s is not None:
            c.listing(s, "ro", FIELDS_ALL)


def entry_restore(c: Context) -> None:
    with c.open(readonly=True) as s:
        if s is not None:
            c.restore_all(s, "ro")


def entry_read(c: Context) -> None:
    with c.open(readonly=True) as s:
        if s is None:
            return
        for cid, want in sorted(c.by_id.items()):
            for name, off, length, sha in want["ranges"]:
                op = f"read({cid}, {name!r}, {off}, {length})"
                ok, got = attempt(c.v, op, s.read, cid, name, off, length)
                if ok and _sha(got) != sha:
                    c.v.fail("wrong-bytes", f"{op}: " + _first_difference(
                        bytes(got), c.bytes_of(cid, name)[off:off + length]))
                elif not ok:
                    c.not_found_is_vanished(op, got, cid)


def _verify(c: Context, s, deep: bool):
    ok, report = attempt(c.v, f"verify(deep={deep})", s.verify, deep=deep)
    if not ok:
        return None
    if not isinstance(report, dict) or not isinstance(report.get("ok"), bool):
        c.v.fail("wrong-report", f"verify(deep={deep}) returned {report!r}")
        return None
    c.v.note(f"verify(deep={deep}) ok={report['ok']} problems="
             f"{[p.get('kind') for p in report.get('problems', [])][:8]}")
    if c.case.strict_harmless and not report["ok"]:
        c.v.fail("spurious-error", f"verify(deep={deep}) found problems in an undamaged "
                 f"store: {report.get('problems', [])[:3]}")
    return report


def entry_verify(c: Context) -> None:
    with c.open(readonly=True) as s:
        if s is not None:
            _verify(c, s, deep=False)


def entry_verify_deep(c: Context) -> None:
    """verify(deep=True) saying OK is a promise: plain verify() agrees (issue 14, 5), every
    checkpoint is listed and restores byte-exact without an error."""
    with c.open(readonly=True) as s:
        if s is None:
            return
        report = _verify(c, s, deep=True)
        if report is None or not report["ok"]:
            return
        shallow = _verify(c, s, deep=False)
        if shallow is not None and not shallow["ok"]:
            c.v.fail("verify-deep-blind", "verify(deep=True) is OK but verify() finds "
                     f"{shallow.get('problems', [])[:3]}")
        before = len(c.v.failures), len(c.v.errors)
        c.listing(s, "after a clean deep verify:", FIELDS_ALL)
        clean = c.restore_all(s, "after a clean deep verify:")
        if not clean or (len(c.v.failures), len(c.v.errors)) != before:
            c.v.fail("verify-deep-blind", "verify(deep=True) is OK but the store does not "
                     "list or restore everything byte-exact (see the other failures/errors)")


def entry_compact(c: Context) -> None:
    """compact() on the damaged store, then everything it kept restores byte-exact."""
    with c.open(readonly=False) as s:
        if s is None:
            return
        ok, report = attempt(c.v, "compact(threshold=0.9)", s.compact, threshold=0.9)
        if ok:
            c.v.note(f"compact: {report}")
        c.listing(s, "after compact():", FIELDS_LOG)
        c.restore_all(s, "after compact():")


def entry_checkpoint(c: Context) -> None:
    """A writer takes a new incremental checkpoint of "train": it must get a new id and seq,
    restore byte-exact, and the old checkpoints too, also after reopening."""
    stream, chunking, bufs = contents()[NEW_CHECKPOINT_KEY]
    want_sha = {n: _sha(b) for n, b in bufs.items()}
    last_train_seq = max(d["seq"] for d in c.expected["checkpoints"] if d["stream"] == stream)
    new_id = None
    with c.open(readonly=False) as s:
        if s is None:
            return
        ok, info = attempt(c.v, "checkpoint()", s.checkpoint, bufs, stream=stream,
                           meta={"key": NEW_CHECKPOINT_KEY}, chunking=chunking)
        if ok:
            new_id = info.id
            if info.id <= c.expected["max_id"]:
                c.v.fail("id-reused", f"the new checkpoint got id {info.id}, an id already "
                         f"used (max id ever {c.expected['max_id']})")
            if info.seq <= last_train_seq:
                c.v.fail("seq-reused", f"the new checkpoint got seq {info.seq} in {stream!r}, "
                         f"whose last seq was {last_train_seq}")
            ok, got = attempt(c.v, f"restore({info.id}) of the new checkpoint", s.restore,
                              info.id)
            if ok:
                c.check_buffers(f"restore({info.id}) of the new checkpoint", info.id, got,
                                want_sha, bufs)
        c.listing(s, "writer after checkpoint():", FIELDS_LOG,
                  extra_ok=(new_id,) if new_id else ())
        c.restore_all(s, "writer after checkpoint():")
    if new_id is None:
        return
    with c.open(readonly=True, op="reopen(readonly=True)") as s:
        if s is None:
            return
        ok, got = attempt(c.v, f"reopened restore({new_id})", s.restore, new_id)
        if ok:
            c.check_buffers(f"reopened restore({new_id})", new_id, got, want_sha, bufs)
        else:
            c.not_found_is_vanished(f"reopened restore({new_id})", got, new_id)


# -- the command line, run in this process through snapstore.cli.main (the console script's
#    function): a child per command would cost 0.3 s of start-up each.
def run_cli(c: Context, argv: list) -> tuple:
    """(exit code, stdout, stderr) of `snapstore ARGV`; an exception escaping main() is a
    failure (the console script would print a traceback), reported as exit code None."""
    from snapstore import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(["--no-progress"] + argv)
        except SystemExit as exc:
            rc = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:     # noqa: BLE001
            rc = None
            escaped = exc
    cmd = "snapstore " + " ".join(argv)
    if rc is None:
        c.v.fail("cli-traceback", f"`{cmd}` let {type(escaped).__name__}: "
                 f"{_one_line(str(escaped))} escape main() (at {_where(escaped)})",
                 key=f"{type(escaped).__name__} at {_where(escaped)}")
        return None, out.getvalue(), err.getvalue()
    return rc, out.getvalue(), err.getvalue()


def check_cli_error(c: Context, argv: list, rc: int | None, out: str, err: str,
                    found_problems: bool = False, expect_error: bool = False) -> bool:
    """The rules for a CLI run: True iff it succeeded (exit 0). Otherwise it must exit 1 or 2
    with one line "snapstore: error: ..." that is no internal error (found_problems: or exit
    1 with nothing on stderr, verify's report of damage on stdout). expect_error: an error is
    the right answer (the stricter rules for harmless damage do not apply)."""
    cmd = "snapstore " + " ".join(argv)
    if rc is None:
        return False
    if "Traceback (most recent call last)" in out + err:
        c.v.fail("cli-traceback", f"`{cmd}` printed a traceback: {_one_line(err[-300:])}")
    if rc == 0:
        if c.case.strict_truncated_index and not expect_error:
            c.v.fail("index-truncation-undetected", f"`{cmd}` exit 0 on a truncated "
                     "index/data.mdb")
        return True
    if rc not in (1, 2):
        c.v.fail("cli-exit-code", f"`{cmd}` exit {rc}: {_one_line(err)}", key=f"exit {rc}")
        return False
    lines = err.splitlines()
    if found_problems and rc == 1 and not err:
        return False                      # verify found damage and listed it on stdout
    if len(lines) != 1 or not lines[0].startswith("snapstore: error: "):
        c.v.fail("cli-not-one-line", f"`{cmd}` exit {rc} with stderr {err[-400:]!r}")
        return False
    if "internal error" in lines[0]:
        exc_type = lines[0].split("internal error: ", 1)[1].split(":", 1)[0]
        c.v.fail("cli-internal-error", f"`{cmd}` exit {rc}: {lines[0]}", key=exc_type)
        return False
    c.v.errors.append({"op": c.v.clean(cmd), "type": f"exit {rc}",
                       "message": c.v.clean(_one_line(lines[0]))})
    if expect_error:
        return False
    if c.case.strict_harmless:
        c.v.fail("spurious-error", f"`{cmd}` exit {rc}: {lines[0]} (the damage is to nothing "
                 f"the store reads: {c.v.damage_done})")
    if c.case.strict_truncated_index and (rc != 1 or "repair" not in lines[0]):
        c.v.fail("index-truncation-undetected", f"`{cmd}` exit {rc}: {lines[0]}; expected "
                 "exit 1 naming `snapstore repair`")
    return False


def entry_cli_ls(c: Context) -> None:
    for argv in (["-s", c.store, "ls"], ["-s", c.store, "ls", "--json"]):
        rc, out, err = run_cli(c, argv)
        if not check_cli_error(c, argv, rc, out, err):
            continue
        if "--json" in argv:
            try:
                listed = json.loads(out)["checkpoints"]
            except (ValueError, KeyError, TypeError) as exc:
                c.v.fail("cli-bad-output", f"`snapstore ls --json` printed no JSON listing: "
                         f"{exc}: {out[:200]!r}")
                continue
            c.check_listing("`snapstore ls --json`", listed, FIELDS_ALL)
        else:
            try:
                ids = [int(ln.split()[0]) for ln in out.splitlines()[1:] if ln.strip()]
            except ValueError:
                c.v.fail("cli-bad-output", f"`snapstore ls` printed {out[:300]!r}")
                continue
            if sorted(ids) != sorted(c.by_id):
                c.v.fail("vanished" if set(ids) < set(c.by_id) else "wrong-listing",
                         f"`snapstore ls` lists ids {ids}, expected {sorted(c.by_id)}",
                         key=f"`snapstore ls` lists {sorted(set(ids) ^ set(c.by_id))} wrongly")


def _cli_ids(c: Context) -> list:
    """The checkpoints the CLI entry points look at (argparse set-up makes each command cost
    ~20 ms): the oldest, and each stream's head (one is the end of the longest delta chain,
    so its restore reads every layer of that stream)."""
    return sorted({min(c.by_id)} | set(c.expected["streams"].values()))


def entry_cli_show(c: Context) -> None:
    for cid in _cli_ids(c) + list(c.expected["deleted"][:1]):
        argv = ["-s", c.store, "show", str(cid), "--json"]
        rc, out, err = run_cli(c, argv)
        if not check_cli_error(c, argv, rc, out, err, expect_error=cid not in c.by_id):
            if rc == 2 and cid in c.by_id and "no checkpoint" in err:
                c.v.fail("vanished", f"`snapstore show {cid}` says {_one_line(err)} for an "
                         "acknowledged checkpoint", key="CheckpointNotFound")
            continue
        if cid not in c.by_id:
            c.v.fail("resurrected", f"`snapstore show {cid}` shows a deleted checkpoint")
            continue
        try:
            shown = json.loads(out)
        except ValueError as exc:
            c.v.fail("cli-bad-output", f"`snapstore show {cid} --json`: {exc}: {out[:200]!r}")
            continue
        c.check_listing(f"`snapstore show {cid} --json`", [shown], FIELDS_ALL,
                        allow_missing=True)


def _cli_verify(c: Context, deep: bool) -> None:
    argv = ["-s", c.store, "verify"] + (["--deep"] if deep else [])
    rc, out, err = run_cli(c, argv)
    if check_cli_error(c, argv, rc, out, err, found_problems=True):
        if not out.startswith(f"verify{' --deep' if deep else ''}: OK"):
            c.v.fail("cli-bad-output", f"`snapstore {' '.join(argv)}` exit 0 without OK: "
                     f"{out[:200]!r}")
    elif rc == 1 and not err:
        c.v.note(f"`snapstore verify` found problems: {_one_line(out[:300])}")
        if c.case.strict_harmless:
            c.v.fail("spurious-error", f"`snapstore {' '.join(argv)}` found problems in an "
                     f"undamaged store: {_one_line(out[:300])}")


def entry_cli_verify(c: Context) -> None:
    _cli_verify(c, deep=False)


def entry_cli_verify_deep(c: Context) -> None:
    _cli_verify(c, deep=True)


def entry_cli_restore(c: Context) -> None:
    for cid in _cli_ids(c):
        out_dir = os.path.join(c.out, f"restore-{cid}")
        argv = ["-s", c.store, "restore", str(cid), "--out", out_dir, "--json"]
        rc, out, err = run_cli(c, argv)
        if not check_cli_error(c, argv, rc, out, err):
            if rc == 2 and "no checkpoint" in err:
                c.v.fail("vanished", f"`snapstore restore {cid}` says {_one_line(err)} for an "
                         "acknowledged checkpoint", key="CheckpointNotFound")
            continue
        try:
            files = json.loads(out)["files"]
            got = {}
            for f in files:
                with open(f["path"], "rb") as fh:
                    got[f["buffer"]] = fh.read()
        except (ValueError, KeyError, TypeError, OSError) as exc:
            c.v.fail("cli-bad-output", f"`snapstore restore {cid} --json`: {exc}: "
                     f"{out[:200]!r}")
            continue
        c.check_buffers(f"`snapstore restore {cid} --out`", cid, got)
        leftovers = [n for n in os.listdir(out_dir) if n.endswith(".part")]
        if leftovers:
            c.v.fail("cli-bad-output", f"`snapstore restore {cid}` left {leftovers}")


def entry_repair(c: Context) -> None:
    """`snapstore repair STORE`, then the store as a reader sees it. Damage confined to the
    index must be undone completely; otherwise what the store still lists must be right."""
    argv = ["repair", c.store]
    rc, out, err = run_cli(c, argv)
    repaired = check_cli_error(c, argv, rc, out, err, expect_error=True)
    if rc is None:
        return
    if rc == 2 and c.case.target != "FORMAT":
        c.v.fail("repair-refused", f"`snapstore repair` exit 2 (usage error): {_one_line(err)}",
                 key=_one_line(err, 80))
        return
    if c.case.strict_repair and not repaired:
        c.v.fail("repair-failed", f"`snapstore repair` did not repair damage confined to "
                 f"the index ({c.v.damage_done}): exit {rc}: {_one_line(err)}")
        return
    strict = c.case.strict_repair
    before = len(c.v.failures)
    with c.open(readonly=True, op="open(readonly=True) after repair", repaired=True) as s:
        if s is None:
            if strict:
                c.v.fail("repair-failed", "the repaired store does not open")
            return
        c.listing(s, "after repair:", FIELDS_LOG, allow_missing=not strict,
                  earlier=c.case.cuts_the_log)
        all_ok = c.restore_all(s, "after repair:", allow_missing=not strict)
        if strict:
            report = _verify(c, s, deep=True)
            if not all_ok or report is None or not report["ok"] or \
                    len(c.v.failures) != before:
                c.v.fail("repair-failed", "after `snapstore repair` of index-only damage the "
                         "store does not hold every checkpoint byte-exact with a clean "
                         "verify(deep=True) (see the other failures)")
    if c.case.cuts_the_log:
        # the point of replacing the index: writers open again and the store goes on
        with c.open(readonly=False, op="writer open after repair", repaired=True) as s:
            if s is None:
                c.v.fail("repair-failed", "a writer cannot open the store after `snapstore "
                         "repair` of a log whose end was cut")
            else:
                attempt(c.v, "checkpoint after repair",
                        lambda: s.checkpoint({"after": b"repair"}, stream="after-repair"))


ENTRY_FUNCTIONS = {name: globals()[f"entry_{name}"] for name in ENTRIES}


# ---- one case, and the worker loop ------------------------------------------------------------

class Pristine:
    """The fixture's files held in memory: writing a copy from memory is several times
    faster than copytree (a case's copy is most of its cost)."""

    def __init__(self, build_dir: str) -> None:
        self.trees = {name: self._load(os.path.join(build_dir, name))
                      for name in ("store", "twin")}

    @staticmethod
    def _load(root: str) -> tuple:
        dirs, files = [], {}
        for dp, dn, fn in os.walk(root):
            dirs += [os.path.relpath(os.path.join(dp, d), root) for d in dn]
            for f in fn:
                with open(os.path.join(dp, f), "rb") as fh:
                    files[os.path.relpath(os.path.join(dp, f), root)] = fh.read()
        return sorted(dirs), files

    def copy(self, name: str, dest: str) -> str:
        dirs, files = self.trees[name]
        os.mkdir(dest)
        for d in dirs:
            os.mkdir(os.path.join(dest, d))
        for rel, data in files.items():
            fd = os.open(os.path.join(dest, rel), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        return dest


def run_case(case_id: str, pristine: Pristine, work: str, seed: int, expected: dict) -> dict:
    case = Case.parse(case_id)
    root = tempfile.mkdtemp(prefix="case-", dir=work)
    try:
        store = pristine.copy("store", os.path.join(root, "store"))
        twin = None
        if case.damage == "symlink_foreign":
            twin = pristine.copy("twin", os.path.join(root, "twin"))
        done = damage(store, twin, case.target, case.damage, seed, expected)
        v = Verdict(case, done)
        v.root = root
        out = os.path.join(root, "out")
        os.mkdir(out)
        ENTRY_FUNCTIONS[case.entry](Context(case, store, out, expected, v))
        return v.as_json()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


def _child_runs_case(case_id: str, pristine: Pristine, work: str, seed: int, expected: dict,
                     out_fd: int) -> None:
    """In the forked child: runs the case, writes the verdict to out_fd, exits at once."""
    code = 1
    try:
        started = time.perf_counter()
        try:
            verdict = run_case(case_id, pristine, work, seed, expected)
        except Exception as exc:       # noqa: BLE001 - the harness itself failed
            verdict = {"case": case_id, "failures": [{
                "cause": "harness-error", "key": type(exc).__name__,
                "detail": "".join(traceback.format_exception(exc))[-1500:]}],
                "errors": [], "notes": []}
        verdict["seconds"] = round(time.perf_counter() - started, 4)
        _write_all(out_fd, json.dumps(verdict).encode())
        code = 0
    finally:
        os._exit(code)


def worker_main(build_dir: str, work: str, seed: int) -> int:
    """A zygote: loads snapstore, the expectations and the fixture's bytes once, then forks one
    child per case (a fork costs milliseconds, a new interpreter half a second), so a signal
    or a hang loses only that case's child and nothing leaks from one case into the next.
    Reads case ids on stdin; writes protocol lines on the original stdout (the store's own
    output goes to stderr):
        READY                  loaded
        P <pid> <case>         the child running the case
        V <json verdict>       the child's verdict, relayed once the child has exited
        X <status> <case>      the child ended without a verdict (negative: the signal)
    """
    import faulthandler
    proto = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    faulthandler.enable(file=sys.stderr, all_threads=True)
    # a decompression bomb must fail with MemoryError here, not take the machine's memory
    resource.setrlimit(resource.RLIMIT_DATA, (4 << 30, 4 << 30))
    with open(os.path.join(build_dir, "expected.json")) as f:
        expected = json.load(f)
    contents()
    pristine = Pristine(build_dir)
    import gc

    import snapstore  # noqa: F401 - imported once here, not in every case
    from snapstore import cli
    with contextlib.redirect_stderr(io.StringIO()):   # the parser's lazy imports, once
        cli.main(["--no-progress", "-s", os.path.join(work, "no-store"), "ls"])
    gc.freeze()                  # fewer copy-on-write faults in the children
    _write_all(proto, b"READY\n")
    for line in sys.stdin:
        case_id = line.strip()
        if not case_id:
            continue
        sys.stderr.write(f"=== case {case_id}\n")
        sys.stderr.flush()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            os.close(proto)
            _child_runs_case(case_id, pristine, work, seed, expected, w)
        os.close(w)
        _write_all(proto, f"P {pid} {case_id}\n".encode())
        chunks = []
        while True:
            chunk = os.read(r, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code == 0 and chunks:
            _write_all(proto, b"V " + b"".join(chunks) + b"\n")
        else:
            _write_all(proto, f"X {code} {case_id}\n".encode())
    return 0


# ---- the pool (parent side) --------------------------------------------------------------------

def _proc_state(pid: int) -> tuple:
    """(state letter, CPU ticks, wchan) of a process, or (None, 0, "") if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        try:
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read().strip()
        except OSError:
            wchan = ""
        return fields[0], int(fields[11]) + int(fields[12]), wchan
    except (OSError, IndexError, ValueError):
        return None, 0, ""


class _Worker:
    """One zygote process (worker_main) and the case it is running."""

    def __init__(self, build_dir: str, work: str, seed: int, n: int) -> None:
        self.log_path = os.path.join(work, f"worker-{n}.log")
        self.log = open(self.log_path, "ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker",
                                      build_dir, work, str(seed)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=env,
                                     start_new_session=True)
        self.buf = b""
        self.ready = False
        self.case: str | None = None
        self.child: int | None = None
        self.started = 0.0
        self.log_offset = 0
        self.cpu = 0
        self.cpu_changed = 0.0

    def send(self, case_id: str) -> None:
        self.case, self.child = case_id, None
        self.started = self.cpu_changed = time.monotonic()
        self.cpu = 0
        self.log.flush()
        self.log_offset = os.path.getsize(self.log_path)
        self.proc.stdin.write(case_id.encode() + b"\n")
        self.proc.stdin.flush()

    def log_tail(self, limit: int = 1500) -> str:
        with open(self.log_path, "rb") as f:
            f.seek(self.log_offset)
            text = f.read().decode(errors="replace")
        return text[-limit:]

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.close()

    def close(self) -> None:
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self.log.close()


def _crash_verdict(case_id: str, cause: str, key: str, detail: str, seconds: float) -> dict:
    return {"case": case_id, "failures": [{"cause": cause, "key": key, "detail": detail}],
            "errors": [], "notes": [], "seconds": round(seconds, 3)}


# Kernel wait channels of a process blocked opening or reading a FIFO nobody writes to.
FIFO_WAITS = ("wait_for_partner", "pipe_read", "pipe_wait", "fifo_open")


def run_matrix(case_ids: list, build_dir: str, work: str, seed: int, *, workers: int = 2,
               timeout: float = 20.0, blocked_after: float = 2.0, fifo_after: float = 0.3,
               progress=None) -> dict:
    """Runs the cases on `workers` zygotes, each taking cases one at a time; returns
    {case id: verdict}. A case whose child dies (signal) gets a "signal" failure; a case is a
    "hang" when it runs past `timeout` seconds, or sooner when its child sleeps (state S)
    without using any CPU for `blocked_after` seconds (`fifo_after` when it waits in a FIFO's
    open or read): a store this small never waits. The hung child is killed; its zygote goes
    on with the next case."""
    todo = list(reversed(case_ids))
    results: dict = {}
    sel = selectors.DefaultSelector()
    pool: list = []
    spawned = 0

    def spawn() -> None:
        nonlocal spawned
        w = _Worker(build_dir, work, seed, spawned)
        spawned += 1
        sel.register(w.proc.stdout, selectors.EVENT_READ, w)
        pool.append(w)

    def retire(w: _Worker) -> None:
        sel.unregister(w.proc.stdout)
        pool.remove(w)

    def finish(w: _Worker, verdict: dict) -> None:
        results[w.case] = verdict
        w.case = w.child = None
        if progress:
            progress(len(results), len(case_ids), verdict)

    def feed(w: _Worker) -> None:
        if todo:
            w.send(todo.pop())
        else:
            retire(w)
            w.proc.stdin.close()
            w.proc.wait()
            w.close()

    def handle(w: _Worker, line: bytes) -> None:
        word, _, rest = line.partition(b" ")
        if word == b"READY":
            w.ready = True
            feed(w)
        elif word == b"P":
            pid, _, case_id = rest.decode().partition(" ")
            if case_id == w.case:
                w.child = int(pid)
        elif word == b"V":
            verdict = json.loads(rest)
            if verdict["case"] == w.case:
                finish(w, verdict)
                feed(w)
        elif word == b"X":
            code, _, case_id = rest.decode().partition(" ")
            code = int(code)
            if case_id == w.case:
                how = (f"killed by {signal.Signals(-code).name}" if code < 0
                       else f"exited with {code} without a verdict")
                finish(w, _crash_verdict(
                    case_id, "signal" if code < 0 else "worker-died",
                    signal.Signals(-code).name if code < 0 else f"exit {code}",
                    f"the process running the case was {how}; its stderr: {w.log_tail()}",
                    time.monotonic() - w.started))
                feed(w)

    for _ in range(min(workers, len(todo))):
        spawn()
    while pool:
        for key, _ in sel.select(timeout=0.1):
            w = key.data
            chunk = os.read(w.proc.stdout.fileno(), 1 << 16)
            if not chunk:                       # the zygote itself died
                rc = w.proc.wait()
                retire(w)
                w.close()
                if not w.ready:
                    with open(w.log_path, errors="replace") as f:
                        raise RuntimeError(f"a fault-matrix worker failed to start (exit {rc}):"
                                           f" {f.read()[-3000:]}")
                if w.case is not None:
                    todo.append(w.case)         # not the case's fault: run it again
                if todo:
                    spawn()
                continue
            w.buf += chunk
            while b"\n" in w.buf and w in pool:
                line, w.buf = w.buf.split(b"\n", 1)
                handle(w, line)
        now = time.monotonic()
        for w in list(pool):
            if w.case is None:
                continue
            elapsed = now - w.started
            state, cpu, wchan = _proc_state(w.child) if w.child else (None, 0, "")
            if cpu != w.cpu or state != "S":
                w.cpu, w.cpu_changed = cpu, now
            idle = now - w.cpu_changed if state == "S" else 0.0
            blocked = idle >= blocked_after or (idle >= fifo_after and wchan in FIFO_WAITS)
            if elapsed < timeout and not blocked:
                continue
            what = (f"blocked (sleeping in {wchan or '?'}, no CPU used for {idle:.1f}s)"
                    if blocked else f"still running after {timeout:.0f}s")
            verdict = _crash_verdict(
                w.case, "hang", f"blocked in {wchan or '?'}" if blocked else "timeout",
                f"{what}; killed. Its stderr: {w.log_tail()}", elapsed)
            if w.child:
                try:
                    os.kill(w.child, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                finish(w, verdict)
                feed(w)
            else:                               # the zygote itself is stuck
                results[w.case] = verdict
                retire(w)
                w.kill()
                if todo:
                    spawn()
    sel.close()
    missing = [c for c in case_ids if c not in results]
    if missing:
        raise RuntimeError(f"the fault matrix lost cases {missing[:5]}...")
    return results


# ---- reports ---------------------------------------------------------------------------------

def repro_command(case_id: str, seed: int) -> str:
    return (f"python3 tests/corruption/fault_child.py repro '{case_id}' --seed {seed}")


def failure_groups(results: dict) -> list:
    """[(cause, key, [case ids], example detail)] sorted by cause, then size."""
    groups: dict = {}
    for case_id, v in results.items():
        seen = set()
        for f in v["failures"]:
            k = (f["cause"], f.get("key", ""))
            if k in seen:
                continue
            seen.add(k)
            groups.setdefault(k, [[], f["detail"]])[0].append(case_id)
    out = [(cause, key, cases, detail) for (cause, key), (cases, detail) in groups.items()]
    out.sort(key=lambda g: (g[0], -len(g[2]), g[1]))
    return out


def summary(results: dict, seed: int) -> str:
    failing = {c: v for c, v in results.items() if v["failures"]}
    lines = [f"fault matrix: {len(results)} cases, {len(failing)} failing (seed {seed}; rerun "
             f"with SNAPSTORE_FAULT_SEED={seed})"]
    if not failing:
        return lines[0]
    by_cause: dict = {}
    for v in failing.values():
        for cause in {f["cause"] for f in v["failures"]}:
            by_cause[cause] = by_cause.get(cause, 0) + 1
    lines.append("failing cases by cause: " + ", ".join(
        f"{c} {n}" for c, n in sorted(by_cause.items(), key=lambda x: -x[1])))
    lines.append("")
    header = f"{'CAUSE':<28} {'CASES':>5}  {'KEY / EXAMPLE'}"
    lines.append(header)
    lines.append("-" * 100)
    for cause, key, cases, detail in failure_groups(results):
        parsed = [Case.parse(c) for c in cases]
        entries = sorted({c.entry for c in parsed})
        tgts = sorted({c.target for c in parsed})
        dmg = sorted({c.damage for c in parsed})
        lines.append(f"{cause:<28} {len(cases):>5}  {key}")
        lines.append(f"{'':<35}targets: {', '.join(tgts)}")
        lines.append(f"{'':<35}damages: {', '.join(dmg)}")
        lines.append(f"{'':<35}entries: {', '.join(entries)}")
        lines.append(f"{'':<35}e.g. {cases[0]}: {_one_line(detail, 400)}")
        lines.append(f"{'':<35}repro: {repro_command(cases[0], seed)}")
    return "\n".join(lines)


def case_message(verdict: dict, seed: int) -> str:
    lines = [f"case {verdict['case']} (seed {seed}): {verdict.get('damage_done', '')}"]
    for f in verdict["failures"][:12]:
        lines.append(f"  [{f['cause']}] {f['detail']}")
    if len(verdict["failures"]) > 12:
        lines.append(f"  ... and {len(verdict['failures']) - 12} more")
    if verdict.get("errors"):
        lines.append("  errors raised: " + "; ".join(
            f"{e['op']}: {e['type']}: {e['message'][:120]}" for e in verdict["errors"][:6]))
    lines.append("  reproduce: " + repro_command(verdict["case"], seed))
    return "\n".join(lines)


# ---- command line ----------------------------------------------------------------------------

def workspace_root() -> str | None:
    """Where cases make their store copies: $SNAPSTORE_FAULT_WORKDIR, else /dev/shm when it is
    usable (a tmpfs: creating and removing ~2000 small stores there is several times faster
    than on a disk file system, and mmap, SIGBUS, FIFOs and symlinks behave the same), else
    the system's temp directory (None)."""
    chosen = os.environ.get("SNAPSTORE_FAULT_WORKDIR")
    if chosen:
        return chosen
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        st = os.statvfs("/dev/shm")
        if st.f_bavail * st.f_frsize > (256 << 20):
            return "/dev/shm"
    return None


def _build_in(directory: str) -> None:
    """Builds the fixture in a child process (the frozen clock stays out of the caller)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "build", directory],
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"building the fault-matrix store failed:\n{proc.stderr}")


def _seed_arg(argv: list) -> int:
    if "--seed" in argv:
        return int(argv[argv.index("--seed") + 1])
    return int(os.environ.get("SNAPSTORE_FAULT_SEED", random.randrange(1 << 31)))


def main(argv: list) -> int:
    mode = argv[1] if len(argv) > 1 else ""
    if mode == "build":
        build(argv[2])
        return 0
    if mode == "worker":
        return worker_main(argv[2], argv[3], int(argv[4]))
    if mode == "repro":
        case_id, seed = argv[2], _seed_arg(argv)
        Case.parse(case_id)
        keep = argv[argv.index("--keep") + 1] if "--keep" in argv else tempfile.mkdtemp(
            prefix="snapstore-fault-")
        build_dir = os.path.join(keep, "build")
        work = os.path.join(keep, "work")
        for old in (build_dir, work, os.path.join(keep, "damaged")):
            shutil.rmtree(old, ignore_errors=True)
        os.makedirs(work)
        _build_in(build_dir)
        v = run_matrix([case_id], build_dir, work, seed, workers=1)[case_id]
        print(json.dumps(v, indent=1))
        print(case_message(v, seed) if v["failures"] else f"case {case_id}: passes")
        # leave a damaged copy to look at
        with open(os.path.join(build_dir, "expected.json")) as f:
            expected = json.load(f)
        case = Case.parse(case_id)
        store = os.path.join(keep, "damaged", "store")
        shutil.copytree(os.path.join(build_dir, "store"), store, symlinks=True)
        twin = os.path.join(keep, "damaged", "twin")
        shutil.copytree(os.path.join(build_dir, "twin"), twin, symlinks=True)
        print(damage(store, twin, case.target, case.damage, seed, expected))
        print(f"damaged store left at {store}")
        return 1 if v["failures"] else 0
    if mode == "matrix":
        seed = _seed_arg(argv)
        flt = argv[argv.index("--filter") + 1] if "--filter" in argv else ""
        workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 2
        cases = [c for c in all_cases() if flt in c]
        with tempfile.TemporaryDirectory(prefix="snapstore-faults-",
                                         dir=workspace_root()) as tmp:
            build_dir, work = os.path.join(tmp, "build"), os.path.join(tmp, "work")
            os.makedirs(work)
            _build_in(build_dir)
            t = time.monotonic()
            results = run_matrix(cases, build_dir, work, seed, workers=workers)
            print(summary(results, seed))
            print(f"({time.monotonic() - t:.1f}s)")
            if "--json" in argv:
                with open(argv[argv.index("--json") + 1], "w") as f:
                    json.dump(results, f, indent=1)
        return 1 if any(v["failures"] for v in results.values()) else 0
    raise SystemExit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
