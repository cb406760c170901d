"""Issue 14, defects 2, 7, 8b, 10 (file-system errors) and 11: a Store used after fork(), the
creation race, FIFOs / directories / symlinks where store files belong, private permissions,
terminal-safe CLI output and restore --out never following a planted symlink."""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import stat
import sys
import traceback

import pytest

import snapstore
from snapstore.cli import app as cli
from snapstore.engine import format as fmt
from snapstore.engine import logowners
from snapstore.errors import (CorruptionError, ForkedStoreError, FormatError, SnapstoreError,
                              StoreClosedError)

OPTS = dict(durability="none", segment_size=1 << 16)


@contextlib.contextmanager
def no_hang(seconds: int = 20):
    """Fails the test (instead of blocking the suite) if the block takes longer."""
    def expired(*_):
        raise AssertionError(f"hang: still running after {seconds}s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def in_child(fn, *args) -> dict:
    """Runs fn(*args) in a fork()ed child; returns what it returned (a JSON-able dict), or
    raises AssertionError with the child's traceback."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                  # the child: never returns into pytest
        os.close(r)
        try:
            out = {"ok": True, "result": fn(*args)}
        except BaseException:
            out = {"ok": False, "error": traceback.format_exc()}
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"child died: {status}"
    out = json.loads(data)
    assert out["ok"], out["error"]
    return out["result"]


def forked_errors(calls: dict) -> dict:
    """{name: exception class name or "no error"} of each call."""
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = "no error"
        except Exception as exc:      # noqa: BLE001 - reported to the parent
            out[name] = type(exc).__name__
    return out


# ---- defect 2: fork ----------------------------------------------------------------------------

def test_defect2_fork_every_call_in_the_child_raises_forked_store_error(store_path):
    s = snapstore.open(store_path, **OPTS)
    info = s.checkpoint({"a": b"p" * 10000}, "s")
    tracker = s.track({"t": bytearray(8192)}, "tracked", mode="hash")
    reader = snapstore.open(store_path, readonly=True)

    def child() -> dict:
        got = forked_errors({
            "checkpoint": lambda: s.checkpoint({"a": b"c" * 10000}, "s"),
            "checkpoint_async": lambda: s.checkpoint_async({"a": b"c"}, "x").result(),
            "track": lambda: s.track({"b": bytearray(4096)}, "y"),
            "tracker.checkpoint": lambda: tracker.checkpoint(),
            "checkpoints": lambda: s.checkpoints(),
            "get": lambda: s.get(info.id),
            "restore": lambda: s.restore(info.id),
            "read": lambda: s.read(info.id, "a", 0, 10),
            "delete": lambda: s.delete(info.id),
            "tag": lambda: s.tag(info.id, "t"),
            "compact": lambda: s.compact(),
            "verify": lambda: s.verify(),
            "stats": lambda: s.stats(),
            "flush": lambda: s.flush(),
            "reader.checkpoints": lambda: reader.checkpoints(),
            "reader.restore": lambda: reader.restore(info.id),
        })
        # The child's copies of the lock descriptors were closed at the fork (the flocks are
        # the parent's, and stay held by it).
        got["child's lock descriptors"] = [s._committer._lock_fd, s._committer._log_fd]
        got["parent's log held"] = logowners.is_alive(store_path, log)
        s.close()          # only marks it closed: the parent's lock and files are untouched
        reader.close()
        tracker.close()
        got["after close"] = forked_errors({"checkpoints": lambda: s.checkpoints()})
        return got

    log = s._committer.log_number
    with no_hang():
        got = in_child(child)
    closed = got.pop("after close")
    assert got.pop("child's lock descriptors") == [None, None]
    assert got.pop("parent's log held") is True
    assert got == {name: "ForkedStoreError" for name in got}
    assert closed == {"checkpoints": "StoreClosedError"}
    # The parent's store is unaffected: it still holds its log's lock, reads and writes.
    [(held, record)] = logowners.live_holders(store_path)
    assert (held, record["pid"], record["host"]) == (log, os.getpid(), os.uname().nodename)
    assert s.restore(info.id) == {"a": b"p" * 10000}
    tracker.close()
    assert s.checkpoint({"a": b"q" * 10000}, "s").parent == info.id
    assert [c.id for c in reader.checkpoints()] == [c.id for c in s.checkpoints()]
    with snapstore.open(store_path, **OPTS) as other:      # a second writer: a log of its own
        assert other._committer.log_number != log
    reader.close()
    s.close()
    assert issubclass(ForkedStoreError, SnapstoreError)
    assert snapstore.ForkedStoreError is ForkedStoreError


def test_defect2_fork_the_child_opens_the_store_again(store_path):
    """The child opens its own Stores: a reader, and a writer while the parent writes (a log
    of its own: the parent's log is still the parent's); once the parent closed, a writer of
    the child adopts the parent's log (the child's inherited copy of its lock was closed at
    the fork, so the parent's close let go of it). The parent's LMDB environment keeps
    working meanwhile."""
    s = snapstore.open(store_path, **OPTS)
    first = s.checkpoint({"a": b"1" * 5000}, "s")
    parent_log = s._committer.log_number
    parent_done_r, parent_done_w = os.pipe()
    child_ready_r, child_ready_w = os.pipe()

    def child() -> dict:
        os.close(parent_done_w)
        try:
            with snapstore.open(store_path, readonly=True) as r:
                seen = [c.id for c in r.checkpoints()]
                restored = r.restore(first.id)["a"] == b"1" * 5000
            alongside = snapstore.open(store_path, **OPTS)      # the parent is still open
            own_log = alongside._committer.log_number
            made_alongside = alongside.checkpoint({"c": b"c" * 5000}, "c").id
        finally:
            os.write(child_ready_w, b"x")
        os.read(parent_done_r, 1)                 # the parent closed its store
        with snapstore.open(store_path, timeout=10, **OPTS) as w:
            adopted_log = w._committer.log_number
            after = w.checkpoint({"a": b"2" * 5000}, "s")
        alongside.close()
        return {"seen": seen, "restored": restored, "own_log": own_log,
                "made_alongside": made_alongside, "adopted_log": adopted_log,
                "made": after.id, "made_parent": after.parent}

    r_pid = os.fork()
    if r_pid == 0:
        result = {"ok": False}
        try:
            result = {"ok": True, **child()}
        except BaseException:
            result["error"] = traceback.format_exc()
        with open(os.path.join(store_path, "..", "child.json"), "w") as f:
            json.dump(result, f)
        os._exit(0)
    os.close(parent_done_r)
    os.close(child_ready_w)
    with no_hang(60):
        # While the child reads and writes, the parent keeps writing and reading.
        second = s.checkpoint({"a": b"3" * 5000}, "s")
        assert s.restore(second.id) == {"a": b"3" * 5000}
        os.read(child_ready_r, 1)
        os.close(child_ready_r)
        assert s.restore(first.id) == {"a": b"1" * 5000}
        assert logowners.is_alive(store_path, parent_log)
        s.close()
        os.write(parent_done_w, b"x")
        os.close(parent_done_w)
        _, status = os.waitpid(r_pid, 0)
    with open(os.path.join(store_path, "..", "child.json")) as f:
        result = json.load(f)
    assert result["ok"], result.get("error")
    assert first.id in result["seen"] and result["restored"]
    assert result["own_log"] != parent_log
    assert result["adopted_log"] == parent_log
    assert result["made_parent"] == second.id           # built on the parent's head
    with snapstore.open(store_path, readonly=True) as r:
        ids = [c.id for c in r.checkpoints()]
        assert {result["made"], result["made_alongside"], second.id} <= set(ids)
        assert len({result["made"], result["made_alongside"], second.id}) == 3
        assert r.restore(result["made"]) == {"a": b"2" * 5000}
        assert r.restore(result["made_alongside"]) == {"c": b"c" * 5000}
        assert r.restore(second.id) == {"a": b"3" * 5000}
        assert r.verify(deep=True)["ok"]


def test_defect2_fork_no_id_is_acknowledged_to_both_processes(store_path):
    """The issue's 200 x 200 scenario, smaller: parent and child checkpoint at once through
    the one Store. Only the parent's succeed; each restores its own bytes."""
    s = snapstore.open(store_path, **OPTS)
    s.checkpoint({"a": b"0" * 8192}, "s")

    def child() -> dict:
        acked, refused = [], 0
        for i in range(40):
            try:
                acked.append(s.checkpoint({"a": bytes([i]) * 8192}, "s").id)
            except ForkedStoreError:
                refused += 1
        return {"acked": acked, "refused": refused}

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            out = child()
        except BaseException:
            out = {"error": traceback.format_exc()}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    mine = {}
    with no_hang(60):
        for i in range(40):
            data = bytes([100 + i]) * 8192
            mine[s.checkpoint({"a": data}, "s").id] = data
        with os.fdopen(r, "rb") as f:
            out = json.loads(f.read())
        os.waitpid(pid, 0)
    assert "error" not in out, out.get("error")
    assert out == {"acked": [], "refused": 40}
    for cid, data in mine.items():
        assert s.restore(cid) == {"a": data}
    assert s.verify(deep=True)["ok"]
    s.close()


def test_defect2_fork_a_checkpoint_pending_at_the_fork_fails_in_the_child(store_path):
    """A future the parent's worker had not resolved when it forked would never resolve in
    the child (the worker thread is the parent's): it fails with ForkedStoreError there."""
    s = snapstore.open(store_path, **OPTS)
    big = bytearray(os.urandom(8 << 20))
    future = s.checkpoint_async({"a": big}, "s")

    def child() -> str:
        try:
            future.result(timeout=10)
            return "resolved"           # (the parent's worker finished before the fork)
        except ForkedStoreError:
            return "ForkedStoreError"

    with no_hang(60):
        got = in_child(child)
    assert got in ("ForkedStoreError", "resolved")
    assert s.restore(future.result().id) == {"a": bytes(big)}
    s.close()


# ---- defect 7: the creation race -------------------------------------------------------------

def _open_at_once(base: str, rounds: int, barrier, worker: int, errors) -> None:
    for k in range(rounds):
        path = os.path.join(base, f"store{k}")
        try:
            barrier.wait(timeout=60)
            if worker == 0:         # one reader per round: it waits for the creators
                with snapstore.open(path, readonly=True, timeout=10) as s:
                    s.checkpoints()
            else:
                with snapstore.open(path, timeout=10, durability="none") as s:
                    s.checkpoint({"w": bytes([worker]) * 100}, f"w{worker}")
        except BaseException as exc:   # noqa: BLE001
            errors.put(f"round {k} worker {worker}: {type(exc).__name__}: {exc}")


def test_defect7_processes_opening_a_new_store_at_once_never_fail(tmp_path):
    processes, rounds = 6, 20
    ctx = multiprocessing.get_context("fork")
    barrier, errors = ctx.Barrier(processes), ctx.Queue()
    workers = [ctx.Process(target=_open_at_once, args=(str(tmp_path), rounds, barrier, i, errors))
               for i in range(processes)]
    for p in workers:
        p.start()
    for p in workers:
        p.join(180)
    assert all(p.exitcode == 0 for p in workers)
    failures = []
    while not errors.empty():
        failures.append(errors.get())
    assert failures == []
    for k in range(rounds):
        with snapstore.open(str(tmp_path / f"store{k}"), readonly=True) as s:
            assert s.streams() == [f"w{i}" for i in range(1, processes)]


def test_defect7_a_store_being_created_is_not_foreign(tmp_path):
    """Only what a creator leaves before FORMAT (lock, index/, segments/, a FORMAT temp file):
    a writer creates the store there; a reader waits for FORMAT, then says it is missing."""
    path = tmp_path / "s"
    path.mkdir()
    for name in ("index", "segments"):
        (path / name).mkdir()
    (path / "lock").write_bytes(b"")
    (path / ".FORMAT.abc.part").write_bytes(b"{")
    with pytest.raises(FormatError, match="no FORMAT"):
        snapstore.open(str(path), readonly=True, timeout=0.2)
    with snapstore.open(str(path), **OPTS) as s:
        s.checkpoint({"a": b"x"})
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    with pytest.raises(FormatError, match="not a snapstore store"):
        snapstore.open(str(tmp_path / "foreign"))
    assert os.listdir(tmp_path / "foreign") == ["notes.txt"]


def test_an_empty_directory_that_is_no_store_is_left_empty(tmp_path):
    """Writing commands (rm, tag, compact, repair...) on an empty directory that is not a
    store said so, but left a lock file in it."""
    from cli_runner import snapstore_cli
    empty = tmp_path / "empty"
    empty.mkdir()
    for call in (lambda: snapstore.open(str(empty), create=False),
                 lambda: snapstore.repair(str(empty))):
        with pytest.raises(FormatError, match="not a snapstore store"):
            call()
    for args in (["rm", empty, "1"], ["tag", empty, "1", "x"], ["compact", empty],
                 ["repair", empty]):
        assert snapstore_cli(*args).returncode == 2
    assert os.listdir(empty) == []


# ---- defects 8b and 10: what is not a regular file -----------------------------------------

def _store_with_segments(path: str) -> list:
    with snapstore.open(path, **OPTS) as s:
        for i in range(6):
            s.checkpoint({"a": os.urandom(40 << 10)}, "s")
    return sorted(os.listdir(os.path.join(path, fmt.SEGMENTS_DIR)))


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling_symlink", "symlink_other"])
@pytest.mark.parametrize("which", ["first", "last"])
def test_defect8_defect10_a_segment_that_is_not_a_regular_file(store_path, kind, which):
    segs = _store_with_segments(store_path)
    assert len(segs) >= 2
    victim = os.path.join(store_path, fmt.SEGMENTS_DIR, segs[0 if which == "first" else -1])
    os.unlink(victim)
    if kind == "fifo":
        os.mkfifo(victim)
    elif kind == "directory":
        os.mkdir(victim)
    elif kind == "dangling_symlink":
        os.symlink(victim + ".gone", victim)
    else:
        os.symlink(os.path.join(store_path, fmt.SEGMENTS_DIR, segs[1 if which == "first" else 0]),
                   victim)
    name = os.path.basename(victim)
    with no_hang():
        with snapstore.open(store_path, readonly=True) as r:
            ids = [c.id for c in r.checkpoints()]
            outcomes = []
            for cid in ids:
                try:
                    outcomes.append(len(r.restore(cid)["a"]) == 40 << 10)
                except CorruptionError as exc:
                    assert name in str(exc)
                    outcomes.append("damaged")
            assert "damaged" in outcomes and True in outcomes
            for deep in (False, True):
                with pytest.raises(CorruptionError, match=name):
                    r.verify(deep=deep)
        with pytest.raises(CorruptionError, match=name):
            snapstore.open(store_path, **OPTS)
        from snapstore.cli import main
        assert main(["-s", store_path, "verify", "--deep", "--no-progress"]) == 1


def test_defect10_store_layout_damage_is_a_snapstore_error(tmp_path):
    def fresh(name: str) -> str:
        path = str(tmp_path / name)
        _store_with_segments(path)
        return path

    path = fresh("no-segments")
    import shutil
    shutil.rmtree(os.path.join(path, fmt.SEGMENTS_DIR))
    for readonly in (True, False):
        with pytest.raises(CorruptionError, match="no segments/ directory"):
            snapstore.open(path, readonly=readonly, **({} if readonly else OPTS))

    path = fresh("lock-dir")
    os.unlink(os.path.join(path, fmt.LOCK_FILE))
    os.mkdir(os.path.join(path, fmt.LOCK_FILE))
    with pytest.raises(CorruptionError, match="lock is a directory"):
        snapstore.open(path, **OPTS)
    with snapstore.open(path, readonly=True) as r:        # readers take no lock
        assert len(r.checkpoints()) == 6

    path = fresh("lock-symlink")
    outside = tmp_path / "outside"
    os.unlink(os.path.join(path, fmt.LOCK_FILE))
    os.symlink(str(outside), os.path.join(path, fmt.LOCK_FILE))
    with pytest.raises(CorruptionError, match="symbolic link"):
        snapstore.open(path, **OPTS)
    assert not outside.exists()                            # never created through the link

    path = fresh("format-fifo")
    os.unlink(os.path.join(path, fmt.FORMAT_FILE))
    os.mkfifo(os.path.join(path, fmt.FORMAT_FILE))
    with no_hang():
        for readonly in (True, False):
            with pytest.raises(FormatError, match="FIFO"):
                snapstore.open(path, readonly=readonly, create=False)

    path = fresh("index-files")
    data = os.path.join(path, fmt.INDEX_DIR, "data.mdb")
    os.rename(data, data + ".saved")
    os.mkfifo(data)
    with no_hang():
        with pytest.raises(CorruptionError, match="data.mdb is a FIFO"):
            snapstore.open(path, readonly=True)
    os.unlink(data)
    os.rename(data + ".saved", data)
    lock_mdb = os.path.join(path, fmt.INDEX_DIR, "lock.mdb")
    os.unlink(lock_mdb)
    os.symlink(data, lock_mdb)        # LMDB would write its reader table into data.mdb
    with pytest.raises(CorruptionError, match="lock.mdb is a symbolic link"):
        snapstore.open(path, **OPTS)


# ---- defect 11: permissions ---------------------------------------------------------------

def _modes(path: str) -> dict:
    out = {".": stat.S_IMODE(os.lstat(path).st_mode)}
    for root, dirs, files in os.walk(path):
        for n in dirs + files:
            full = os.path.join(root, n)
            out[os.path.relpath(full, path)] = stat.S_IMODE(os.lstat(full).st_mode)
    return out


def test_defect11_a_new_store_is_private(store_path):
    old = os.umask(0o022)
    try:
        with snapstore.open(store_path, **OPTS) as s:
            for i in range(4):
                s.checkpoint({"a": os.urandom(40 << 10)}, "s")
            s.delete(s.checkpoints()[0].id)
            s.compact(threshold=1.0)
    finally:
        os.umask(old)
    modes = _modes(store_path)
    assert len([n for n in modes if n.endswith(fmt.SEGMENT_SUFFIX)]) >= 2
    for name, mode in modes.items():
        is_dir = os.path.isdir(os.path.join(store_path, name))
        assert mode == (0o700 if is_dir else 0o600), (name, oct(mode))


def test_defect11_a_store_shared_with_its_group_stays_shared(store_path):
    """chmod -R g+rX (FORMAT included): files created later are group-readable too."""
    with snapstore.open(store_path, **OPTS) as s:
        s.checkpoint({"a": os.urandom(40 << 10)}, "s")
    for root, dirs, files in os.walk(store_path):
        for n in dirs + files + ["."]:
            full = os.path.join(root, n)
            os.chmod(full, os.stat(full).st_mode | stat.S_IRGRP |
                     (stat.S_IXGRP if os.path.isdir(full) else 0))
    os.chmod(store_path, 0o750)
    before = set(os.listdir(os.path.join(store_path, fmt.SEGMENTS_DIR)))
    old = os.umask(0o022)
    try:
        with snapstore.open(store_path, **OPTS) as s:
            for i in range(4):
                s.checkpoint({"a": os.urandom(40 << 10)}, "s")
    finally:
        os.umask(old)
    new = set(os.listdir(os.path.join(store_path, fmt.SEGMENTS_DIR))) - before
    assert new
    for n in new:
        assert stat.S_IMODE(os.stat(os.path.join(store_path, fmt.SEGMENTS_DIR, n)).st_mode) \
            == 0o640


_GROUP_READER = r"""
import os, sys
import snapstore, lmdb._envid            # first: Python itself may not be readable by nobody
os.setgroups([])
os.setgid(int(sys.argv[2]))
os.setuid(65534)                        # nobody, in the store's group only
try:
    with snapstore.open(sys.argv[1], readonly=True) as s:
        print("read", len(s.restore(s.checkpoints()[-1].id)["a"]))
except snapstore.errors.SnapstoreError as exc:
    print(type(exc).__name__, exc)
"""


def _read_as_group_member(store_path: str) -> str:
    import subprocess
    import sys
    gid = os.stat(store_path).st_gid
    done = subprocess.run([sys.executable, "-c", _GROUP_READER, store_path, str(gid)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="runs a reader as another user: needs root")
def test_a_group_member_reads_a_store_shared_with_its_group():
    """Regression: after `chmod -R g+rX STORE` no group member could read the store: LMDB
    registers every reader in index/lock.mdb, which was 0640, and the open failed with a
    bare EACCES. Now the error names the fix; once applied, reader tables made later (an
    index a repair or compaction replaces) are group-writable by themselves."""
    import shutil
    import tempfile
    top = tempfile.mkdtemp(prefix="snapstore-group-")     # pytest's tmp dirs are 0700
    try:
        os.chmod(top, 0o755)
        _check_group_reader(os.path.join(top, "store"))
    finally:
        shutil.rmtree(top)


def _check_group_reader(store_path: str) -> None:
    with snapstore.open(store_path, **OPTS) as s:
        s.checkpoint({"a": os.urandom(40 << 10)}, "s")
    for root, dirs, files in os.walk(store_path):          # chmod -R g+rX
        for n in dirs + files + ["."]:
            full = os.path.join(root, n)
            os.chmod(full, os.stat(full).st_mode | stat.S_IRGRP |
                     (stat.S_IXGRP if os.path.isdir(full) else 0))
    out = _read_as_group_member(store_path)
    assert out.startswith("StoreIOError") and "chmod g+w STORE/index/lock.mdb" in out, out
    os.chmod(os.path.join(store_path, "index", fmt.INDEX_LOCK_TABLE_FILE), 0o660)
    assert _read_as_group_member(store_path) == f"read {40 << 10}\n"
    snapstore.repair(store_path)               # a new index, a new reader table
    table = os.path.join(store_path, "index", fmt.INDEX_LOCK_TABLE_FILE)
    assert stat.S_IMODE(os.stat(table).st_mode) & stat.S_IWGRP
    assert _read_as_group_member(store_path) == f"read {40 << 10}\n"


def test_a_reader_table_is_writable_by_whoever_may_read_the_store():
    from snapstore.engine.index import lock_table_mode
    assert lock_table_mode(0o600) == 0o600
    assert lock_table_mode(0o640) == 0o660
    assert lock_table_mode(0o644) == 0o666
    assert lock_table_mode(0o660) == 0o660


# ---- defect 11: the CLI ---------------------------------------------------------------------

EVIL_STREAM = "s\x1b[2J\x1b]0;pwned\x07"
EVIL_BUFFER = "b\x1b[31m\nFAKE LINE\r"
EVIL_TAG = "t\x9b1m\u202e"


def test_defect11_cli_escapes_names_from_the_store(store_path, capsys):
    with snapstore.open(store_path, **OPTS) as s:
        a = s.checkpoint({EVIL_BUFFER: b"x" * 5000}, EVIL_STREAM).id
        b = s.checkpoint({EVIL_BUFFER: b"y" * 5000}, EVIL_STREAM).id
        s.tag(a, EVIL_TAG)
    capsys.readouterr()
    out_dir = os.path.join(store_path, "..", "out")
    commands = [["ls"], ["show", str(a)], ["diff", str(a), str(b)], ["tag", str(a), "x"],
                ["restore", str(a), "--out", out_dir], ["verify"], ["stats"],
                ["restore", "99", "--out", out_dir],
                ["restore", str(a), "--out", out_dir, "--buffer", "no\x1b[1mpe"]]
    for argv in commands:
        cli.main(["-s", store_path, "--no-progress"] + argv)
        out, err = capsys.readouterr()
        for text in (out, err):
            assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text, argv
            assert "\r" not in text and "\u202e" not in text, argv
            assert "FAKE LINE" not in text or "\\nFAKE LINE" in text, argv
    cli.main(["-s", store_path, "--no-progress", "ls"])
    out, _ = capsys.readouterr()
    assert "s\\x1b[2J" in out and "t\\x9b1m\\u202e" in out
    cli.main(["-s", store_path, "--json", "ls"])           # JSON: escaped by the encoder, exact
    doc = json.loads(capsys.readouterr().out)
    assert doc["checkpoints"][0]["stream"] == EVIL_STREAM


def test_defect11_restore_out_never_follows_a_planted_symlink(store_path, tmp_path, capsys):
    with snapstore.open(store_path, **OPTS) as s:
        cid = s.checkpoint({"w": b"secret" * 1000}, "s").id
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    # A symlink at the old temporary name: not followed.
    os.symlink(str(victim), str(out / ".w.part"))
    assert cli.main(["-s", store_path, "--no-progress", "restore", str(cid), "--out",
                     str(out)]) == 0
    assert victim.read_bytes() == b"precious"
    # A symlink at the final name: "exists" without --force; replaced, not followed, with it.
    os.unlink(out / "w")
    os.symlink(str(victim), str(out / "w"))
    assert cli.main(["-s", store_path, "--no-progress", "restore", str(cid), "--out",
                     str(out)]) == 2
    assert cli.main(["-s", store_path, "--no-progress", "restore", str(cid), "--out",
                     str(out), "--force"]) == 0
    assert victim.read_bytes() == b"precious"
    st = os.lstat(out / "w")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600
    assert (out / "w").read_bytes() == b"secret" * 1000
    assert sorted(os.listdir(out)) == [".w.part", "w"]     # the planted link, left alone
    assert os.path.islink(out / ".w.part")
    capsys.readouterr()


def test_a_malformed_stream_checkpoint_key_is_index_damage(tmp_path):
    """checkpoint_ids reads the ids from the keys alone (a key scan): a key of the wrong
    length under a stream's prefix is reported as index damage, never turned into an id."""
    import lmdb
    from snapstore.engine import format as fmt
    from snapstore.errors import CorruptionError
    path = str(tmp_path / "s")
    with snapstore.open(path, durability="none") as s:
        ids = [s.checkpoint({"a": bytes([k]) * 100}, stream="x").id for k in range(3)]
        assert s.checkpoint_ids("x") == ids
    env = lmdb.open(os.path.join(path, fmt.INDEX_DIR), max_dbs=fmt.INDEX_MAX_DBS)
    with env.begin(write=True) as txn:
        txn.put(b"x\0" + b"\1" * 3, b"", db=env.open_db(fmt.DB_STREAM_CKPTS, txn=txn))
    env.close()
    with snapstore.open(path, readonly=True) as s:
        with pytest.raises(CorruptionError, match="not a stream's checkpoint key"):
            s.checkpoint_ids("x")
        assert s.checkpoint_ids("y") == []                   # other streams unaffected


def test_meta_nested_too_deep_is_refused_before_anything_is_claimed(tmp_path):
    """Meta deep enough to pass a JSON round trip but not the store's own decoding (deep in
    its call stack) used to commit a checkpoint nobody could read back by name, or to raise
    RecursionError after claiming the stream, whose claim then kept every writer out."""
    from snapstore.engine.validation import MAX_META_DEPTH
    with snapstore.open(str(tmp_path / "s")) as s:
        for depth in (MAX_META_DEPTH + 1, 990, 100_000):
            deep = 1
            for _ in range(depth):
                deep = [deep] if depth % 2 else {"k": deep}
            with pytest.raises(snapstore.errors.InvalidArgumentTypeError, match="nests"):
                s.checkpoint({"a": b"1"}, stream="m", meta=deep)
        ok = 1
        for _ in range(MAX_META_DEPTH - 1):
            ok = {"k": ok}
        info = s.checkpoint({"a": b"1"}, stream="m", meta={"deep": ok})
        assert s.get("m").meta == {"deep": ok} and s.restore("m") == {"a": b"1"}
        s.checkpoint({"a": b"2"}, stream="m")       # the stream is not held by a claim
        assert s.latest("m").id == info.id + 1


def _nested_list(depth):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


def test_meta_at_the_limit_survives_every_layer_that_wraps_it(tmp_path):
    """A meta the store accepted (lists nested MAX_META_DEPTH deep, not a dict) stays
    copyable, exportable and importable, and the object layer takes it too: snapstore's
    reserved keys wrap it two levels deeper, which the limit on the user's part allows. It
    used to stop `snapstore copy` at that checkpoint and fail every import of its savepoint."""
    from snapstore.engine.validation import MAX_META_DEPTH, RESERVED_META_LEVELS
    from snapstore.copying import copy_checkpoints
    from snapstore.savepoints import export_savepoint, import_savepoint
    import snapstore.objects as objects
    deep = _nested_list(MAX_META_DEPTH)
    with snapstore.open(str(tmp_path / "a")) as a, snapstore.open(str(tmp_path / "b")) as b:
        first = a.checkpoint({"x": b"abc"}, stream="s", meta=deep)
        a.checkpoint({"x": b"def"}, stream="t", meta={"ok": 1})
        copy_checkpoints(a, b)
        assert [(i.stream, i.meta) for i in b.checkpoints()] == [("s", deep), ("t", {"ok": 1})]
        export_savepoint(a, first.id, str(tmp_path / "s.snap"))
        got = import_savepoint(b, str(tmp_path / "s.snap"))
        assert got.meta == deep and b.restore(got.id) == {"x": b"abc"}
        saved = objects.save(a, {"w": 1}, "o", meta=deep)
        assert saved.meta == deep and objects.load(a, saved.id) == {"w": 1}
        for too_deep in (_nested_list(MAX_META_DEPTH + 1),
                         {"user": _nested_list(MAX_META_DEPTH)},      # the user's part counts
                         {"snapstore.x": _nested_list(MAX_META_DEPTH + RESERVED_META_LEVELS)}):
            with pytest.raises(snapstore.errors.InvalidArgumentTypeError, match="nests"):
                a.checkpoint({"x": b"1"}, stream="m", meta=too_deep)
            with pytest.raises(snapstore.errors.InvalidArgumentTypeError, match="nests"):
                objects.save(a, {"w": 1}, "o", meta=too_deep)


def test_a_commit_that_fails_after_its_claim_releases_it(tmp_path, monkeypatch):
    """Any failure between the claim and the log append (here: encoding the commit record)
    drops the claim: the stream stays writable, for this writer and others."""
    from snapstore.engine import records
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"a": b"1"}, stream="m")

        def broken(self):
            raise KeyboardInterrupt
        with monkeypatch.context() as m:
            m.setattr(records.Commit, "encode", broken)
            with pytest.raises(KeyboardInterrupt):
                s.checkpoint({"a": b"2"}, stream="m")
        with snapstore.open(path) as other:
            third = other.checkpoint({"a": b"3"}, stream="m")
            assert third.parent == 1
        s.tag(third.id, "t")
        s.delete(1)
        assert s.restore("m") == {"a": b"3"}
