"""Property: bit rot inside LMDB index values never yields wrong bytes (issue 14, defect 4).

Random bits are flipped in random values of every database (manifests, chunks, checkpoints,
streams, stream_ckpts, children, fingerprints, meta) through LMDB's own API, so LMDB's
structure stays valid and only snapstore's own checks stand between the damage and the
caller. On a copy of a small store with full and delta checkpoints, tags, a deleted
checkpoint and two streams, it is then asserted that
  * every restore / restore_into / read, and checkpoints(), streams(), verify(), returns
    exactly the right answer or raises a snapstore.errors.SnapstoreError: never another
    exception, never wrong bytes;
  * a following checkpoint (a writer open, then a checkpoint of changed bytes onto each
    stream) never silently stores wrong bytes: damaged page fingerprints would make it miss
    changed pages, so what it stored must restore to exactly what it was given, or fail;
  * after `snapstore repair` (repair_hook) every checkpoint is back, byte-exact.

test_every_value_of_every_database flips bits in every single value, deterministically; the
hypothesis test flips 1-3 random bits in random values.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile

import lmdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import snapstore
from snapstore.engine import format as fmt
from snapstore.errors import SnapstoreError

PAGE = 4096
DATABASES = fmt.INDEX_DBS


def examples(n: int) -> int:
    """n scaled by the loaded profile (dev: 100 -> n, slow: 1000 -> 10 n)."""
    return max(1, n * settings.default.max_examples // 100)


class Template:
    """The undamaged store, built once: its path and {id: {name: bytes}} of what it holds,
    and each stream's newest buffers (what the next checkpoint changes)."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="snapstore-flips-")
        self.path = os.path.join(self.dir, "store")
        r = random.Random(1414)
        self.want: dict = {}
        self.latest: dict = {}
        with snapstore.open(self.path, durability="none", segment_size=1 << 16) as s:
            a = bytearray(r.randbytes(24 * PAGE))
            b = bytes(10_000)
            for step in range(5):
                if step:
                    for p in r.sample(range(24), 3):
                        a[p * PAGE:p * PAGE + 64] = r.randbytes(64)
                bufs = {"a": bytes(a), "b": b if step < 3 else r.randbytes(10_000)}
                info = s.checkpoint(bufs, stream="s", meta={"step": step})
                self.want[info.id] = bufs
            victim = sorted(self.want)[2]
            s.delete(victim)                     # a middle delta: its child absorbs it
            del self.want[victim]
            s.tag(min(self.want), "first")
            u = {"c": r.randbytes(3 * PAGE + 7), "e": b""}
            self.want[s.checkpoint(u, stream="u").id] = u
            for stream in ("s", "u"):
                self.latest[stream] = self.want[s.latest(stream).id]
        self._leave_a_group_in_progress()
        self.keys = {}
        env = lmdb.open(os.path.join(self.path, fmt.INDEX_DIR), max_dbs=fmt.INDEX_MAX_DBS,
                        readonly=True, lock=False)
        try:
            with env.begin() as txn:
                for name in DATABASES:
                    db = env.open_db(name, txn=txn, create=False)
                    self.keys[name] = [k for k, _ in txn.cursor(db=db)]
        finally:
            env.close()
        assert all(self.keys.values()), {n: len(k) for n, k in self.keys.items()}

    def _leave_a_group_in_progress(self) -> None:
        """A writer process opens a group on stream "g", stages one part, and is killed: its
        claim, the group and the part stay in the index (claims, groups) until a writer
        recovers its log."""
        script = ("import os, signal, sys, snapstore\n"
                  "s = snapstore.open(sys.argv[1], durability='none', segment_size=1 << 16)\n"
                  "g = s.group('g', ['p', 'q'])\n"
                  "s.stage(g.id, 'p', {'x': os.urandom(5000)}, meta={'offset': 7})\n"
                  "os.kill(os.getpid(), signal.SIGKILL)\n")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        proc = subprocess.run([sys.executable, "-c", script, self.path], env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr

    def copy(self) -> str:
        dst = tempfile.mkdtemp(prefix="snapstore-flip-")
        path = os.path.join(dst, "store")
        shutil.copytree(self.path, path)
        return path


@pytest.fixture(scope="module")
def template():
    t = Template()
    yield t
    shutil.rmtree(t.dir, ignore_errors=True)


def flip_bits(path: str, flips, payload_only: bool = False) -> list:
    """Flips, through the LMDB API, bit `bit` (mod the value's size) of the value of the
    `which`-th key (mod the count) of database `name`, for each (name, which, bit).
    payload_only: only in the bytes before the value's checksum (if it has any)."""
    done = []
    env = lmdb.open(os.path.join(path, fmt.INDEX_DIR), max_dbs=fmt.INDEX_MAX_DBS)
    try:
        with env.begin(write=True) as txn:
            for name, which, bit in flips:
                db = env.open_db(name, txn=txn, create=False)
                keys = [k for k, _ in txn.cursor(db=db)]
                key = keys[which % len(keys)]
                value = bytearray(txn.get(key, db=db))
                size = len(value) - fmt.INDEX_VALUE_CHECKSUM.size if payload_only else 0
                bit %= 8 * (size if size > 0 else len(value))
                value[bit // 8] ^= 1 << (bit % 8)
                txn.put(key, bytes(value), db=db)
                done.append((name.decode(), key, bit))
    finally:
        env.close()
    return done


def repair_hook(path: str) -> bool:
    """Rebuilds the damaged index from the log (`snapstore.repair`); the caller then demands
    every checkpoint back, byte-exact. The log was not damaged, so repair must report it
    intact."""
    report = snapstore.repair(path)
    assert report["ok"], report
    return True


def expect(call, right, ctx: str) -> bool:
    """call() returns `right` or raises a SnapstoreError; True if it returned."""
    try:
        got = call()
    except SnapstoreError:
        return False
    assert got == right, f"{ctx}: wrong answer"
    return True


def check_reads(path: str, template: Template, ctx: str) -> None:
    try:
        store = snapstore.open(path, readonly=True)
    except SnapstoreError:
        return
    with store:
        ids = sorted(template.want)
        expect(lambda: [c.id for c in store.checkpoints()], ids, f"{ctx} checkpoints()")
        expect(store.streams, ["s", "u"], f"{ctx} streams()")
        try:
            assert isinstance(store.verify(), dict)
        except SnapstoreError:
            pass
        for cid, bufs in template.want.items():
            expect(lambda: store.restore(cid), bufs, f"{ctx} restore({cid})")
            targets = {n: bytearray(len(v)) for n, v in bufs.items()}
            if expect(lambda: store.restore_into(cid, targets), None,
                      f"{ctx} restore_into({cid})"):
                assert {n: bytes(v) for n, v in targets.items()} == bufs, \
                    f"{ctx} restore_into({cid}) wrong"
            for name, data in bufs.items():
                for off in sorted({0, len(data) // 2, max(0, len(data) - 100)}):
                    n = min(len(data) - off, 5000)
                    expect(lambda: store.read(cid, name, off, n), data[off:off + n],
                           f"{ctx} read({cid}, {name!r}, {off}, {n})")


def check_next_checkpoint(path: str, template: Template, ctx: str) -> None:
    """A writer opens the damaged store and checkpoints changed bytes onto each stream:
    whatever it commits restores to exactly those bytes (or the restore fails)."""
    try:
        store = snapstore.open(path, durability="none", segment_size=1 << 16)
    except SnapstoreError:
        return
    with store:
        for stream, old in template.latest.items():
            new = {}
            for name, data in old.items():
                d = bytearray(data)
                for at in range(0, len(d), 3 * PAGE):
                    d[at] ^= 0xFF                    # a changed byte on every third page
                new[name] = bytes(d)
            try:
                info = store.checkpoint(new, stream=stream)
            except SnapstoreError:
                continue
            expect(lambda: store.restore(info.id), new, f"{ctx} checkpoint onto {stream!r}")
            expect(lambda: store.read(info.id, next(iter(new)), 0, None),
                   new[next(iter(new))], f"{ctx} read of the new checkpoint")


def check_repair(path: str, template: Template, ctx: str) -> None:
    if not repair_hook(path):
        return
    with snapstore.open(path, readonly=True) as store:
        for cid, bufs in template.want.items():
            assert store.restore(cid) == bufs, f"{ctx} after repair: restore({cid})"


def run(template: Template, flips, payload_only: bool = False) -> None:
    path = template.copy()
    try:
        done = flip_bits(path, flips, payload_only)
        ctx = f"[flipped {done}]"
        check_reads(path, template, ctx)
        check_next_checkpoint(path, template, ctx)
        check_repair(path, template, ctx)
    finally:
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_every_value_of_every_database(template):
    """Bit 0 and one random bit of the payload of every value (of the checksum, for the
    values whose payload is empty)."""
    r = random.Random(2024)
    covered = set()
    for name in DATABASES:
        for which in range(len(template.keys[name])):
            for bit in (0, r.randrange(1 << 20)):
                run(template, [(name, which, bit)], payload_only=True)
            covered.add(name)
    assert covered == set(DATABASES)


@settings(max_examples=examples(40))
@given(flips=st.lists(st.tuples(st.sampled_from(DATABASES), st.integers(0, 1 << 16),
                                st.integers(0, 1 << 20)), min_size=1, max_size=3))
def test_random_bit_flips_in_index_values(template, flips):
    run(template, flips)
