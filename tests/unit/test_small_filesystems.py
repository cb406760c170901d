"""Real file systems at their limits (a 3 MiB tmpfs, filled up or remounted read-only).

A full one: every operation that opens a new LMDB environment (creating a store, repair's
rebuild, compaction's index shrink) gets a StoreIOError, never a SIGBUS. LMDB sizes a new reader table (lock.mdb) with ftruncate and writes
it through a memory map, and a write into a hole with no free block is a SIGBUS: snapstore gives
the table real blocks first. Each case runs in a child so a signal is seen, not suffered.
retain() whose prune fails there says that its deletes happened.

A read-only one (a backup or a snapshot mounted ro): a readonly store restores and verifies.

Needs root (mount); CI runs as root."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=True)


FILL = '''
def fill(mnt, leave):
    st = os.statvfs(mnt)
    with open(os.path.join(mnt, "filler"), "wb") as fh:
        try:
            fh.write(b"\\0" * max(0, st.f_bavail * st.f_frsize - leave))
        except OSError:
            pass
'''


def run_child(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", "import os, random, sys\nimport snapstore\n"
                           + FILL + code, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert done.returncode == 0, f"child died (rc {done.returncode}): {done.stderr[-2000:]}"
    return done.stdout.strip()


def test_creating_a_store_on_a_full_disk_is_a_clean_error(small_fs):
    out = run_child('''
mnt = sys.argv[1]
fill(mnt, 0)
try:
    snapstore.open(os.path.join(mnt, "new")).close()
    print("created")
except snapstore.errors.StoreIOError as exc:
    print("StoreIOError", exc)
''', small_fs)
    assert out.startswith("StoreIOError") and "disk full" in out


def test_repair_on_a_full_disk_is_a_clean_error_and_works_once_there_is_room(small_fs):
    out = run_child('''
mnt = sys.argv[1]
d = os.path.join(mnt, "st")
rng = random.Random(1)
with snapstore.open(d, segment_size=64 << 10) as s:
    for i in range(20):
        s.checkpoint({"w": rng.randbytes(20000)}, stream="a")
fill(mnt, 0)
try:
    snapstore.repair(d)
    print("repaired")
except snapstore.errors.StoreIOError as exc:
    print("StoreIOError", exc)
os.remove(os.path.join(mnt, "filler"))
print(snapstore.repair(d)["ok"])
rng = random.Random(1)
with snapstore.open(d) as s:
    print(all(s.restore(c.id)["w"] == rng.randbytes(20000) for c in s.checkpoints("a")))
''', small_fs)
    first, *rest = out.splitlines()
    assert first.startswith("StoreIOError") and "disk full" in first
    assert rest == ["True", "True"]


@pytest.mark.parametrize("leave_kib", [48, 60, 64, 72, 80, 96])
def test_compact_shrinking_the_index_on_a_nearly_full_disk(small_fs, leave_kib):
    out = run_child('''
mnt, leave = sys.argv[1], int(sys.argv[2]) << 10
d = os.path.join(mnt, "st")
rng = random.Random(2)
want = {}
with snapstore.open(d, segment_size=64 << 10) as s:
    for i in range(60):
        bufs = {"w": rng.randbytes(2000), "z": bytes(3000)}
        want[s.checkpoint(bufs, stream=f"s{i % 5}").id] = bufs
    for cid in sorted(want)[:50]:
        s.delete(cid)
        del want[cid]
    s.compact(shrink_index=False)         # the index is now mostly free pages: a shrink pays
fill(mnt, leave)
with snapstore.open(d) as s:
    try:
        print("shrunk", s.compact()["index_shrunk"])
    except snapstore.errors.StoreIOError as exc:
        print("StoreIOError", exc)
os.remove(os.path.join(mnt, "filler"))
with snapstore.open(d) as s:
    print(s.verify(deep=True)["ok"], all(s.restore(c) == b for c, b in want.items()))
''', small_fs, str(leave_kib))
    first, last = out.splitlines()
    assert first in ("shrunk True",) or (first.startswith("StoreIOError")
                                         and ("disk full" in first or "space" in first))
    assert last == "True True"


def test_retain_whose_prune_fails_on_a_full_disk_says_its_deletes_happened(small_fs):
    out = run_child('''
mnt = sys.argv[1]
d = os.path.join(mnt, "st")
rng = random.Random(3)
with snapstore.open(d, segment_size=64 << 10) as s:
    for i in range(120):
        s.checkpoint({"w": rng.randbytes(1500)}, stream="a")
fill(mnt, 16 << 10)
with snapstore.open(d) as s:
    try:
        result = s.retain("a", keep_last=100)
        print("ok", len(result), result.compaction is not None)
    except snapstore.errors.SnapstoreError as exc:
        print(type(exc).__name__, len(exc.deleted), "retain deleted 20" in str(exc))
    print(len(s.checkpoints("a")))
os.remove(os.path.join(mnt, "filler"))
with snapstore.open(d) as s:
    print(s.verify(deep=True)["ok"], len(s.checkpoints("a")))
''', small_fs)
    first, count, last = out.splitlines()
    assert first in ("ok 20 True", "StoreIOError 20 True")
    assert count == "100" and last == "True 100"


def test_a_readonly_store_on_a_read_only_file_system_restores_and_verifies(small_fs):
    path = os.path.join(small_fs, "st")
    run_child('''
with snapstore.open(sys.argv[1]) as s:
    for i in range(3):
        s.checkpoint({"a": bytes([i]) * 20000}, stream="s")
    s.compact()
''', path)
    subprocess.run(["mount", "-o", "remount,ro", small_fs], check=True)
    out = run_child('''
with snapstore.open(sys.argv[1], readonly=True) as s:
    print(s.restore("latest:s")["a"] == bytes([2]) * 20000, s.stats()["checkpoints"])
    print(s.verify()["ok"], s.verify(deep=True)["ok"])
''', path)
    assert out.splitlines() == ["True 3", "True True"]
    cli = subprocess.run([sys.executable, "-m", "snapstore", "verify", "--deep", path],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert cli.returncode == 0, cli.stderr
