"""sync_index=False: the marks of writers whose index runs without syncs (engine/unsynced.py),
their lifecycle (open, close, close twice, fork, kill -9), the one sync per commit they buy,
and the arguments. The reboot side (an untrusted index rebuilt) is tests/crash/
test_unsynced_index.py."""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

import snapstore
from flocks import flocked
from snapstore.engine import unsynced
from snapstore.errors import InvalidArgumentError, InvalidArgumentTypeError


def _marks(store: str) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(store, "unsynced")))
    except FileNotFoundError:
        return []


def test_a_writer_without_index_syncs_holds_one_locked_mark_of_this_boot_until_close(tmp_path):
    store = str(tmp_path / "s")
    s = snapstore.open(store, sync_index=False)
    try:
        [name] = _marks(store)
        boot, token = name.rsplit(".", 1)
        assert boot == unsynced.boot_id() and re.fullmatch(r"[0-9a-f]{16}", token)
        assert flocked(os.path.join(store, "unsynced", name))
        s.checkpoint({"x": b"one byte"[:1]})
        s.checkpoint({"x": b"one byte"[:1]})        # nothing changed
    finally:
        s.close()
    assert _marks(store) == []
    s.close()                                       # twice: nothing left to do
    assert _marks(store) == []
    with snapstore.open(store, readonly=True) as r:
        assert bytes(r.restore(r.latest().id)["x"]) == b"o"


@pytest.mark.parametrize("options,expected", [
    ({}, 0),                                         # the default syncs the index
    ({"sync_index": True}, 0),
    ({"durability": "none"}, 1),                     # "none" never synced it: marked too
    ({"sync_index": False, "durability": "none"}, 1),
])
def test_which_writers_are_marked(tmp_path, options, expected):
    store = str(tmp_path / "s")
    with snapstore.open(store, **options) as s:
        assert len(_marks(store)) == expected
        s.checkpoint({"x": b""})                     # empty
    assert _marks(store) == []


def test_readers_never_mark(tmp_path):
    store = str(tmp_path / "s")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"x"})
    with snapstore.open(store, readonly=True, sync_index=False) as r:
        assert _marks(store) == []
        assert bytes(r.restore(1)["x"]) == b"x"


def test_two_writers_each_hold_their_own_mark(tmp_path):
    store = str(tmp_path / "s")
    a = snapstore.open(store, sync_index=False)
    b = snapstore.open(store, sync_index=False)
    try:
        assert len(_marks(store)) == 2
        a.checkpoint({"x": b"a"}, stream="a")
        a.close()
        [left] = _marks(store)
        assert flocked(os.path.join(store, "unsynced", left))
        b.checkpoint({"x": b"b"}, stream="b")
    finally:
        a.close()
        b.close()
    assert _marks(store) == []


def test_a_killed_writers_mark_is_removed_by_the_next_writer_after_a_sync(tmp_path):
    store = str(tmp_path / "s")
    child = textwrap.dedent(f"""
        import os, signal, snapstore
        s = snapstore.open({store!r}, sync_index=False)
        s.checkpoint({{"x": b"acknowledged" * 1000}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", child], capture_output=True)
    assert p.returncode == -signal.SIGKILL, p.stderr.decode()
    [orphan] = _marks(store)
    assert not flocked(os.path.join(store, "unsynced", orphan))
    with snapstore.open(store) as s:                # a default writer cleans up too
        assert _marks(store) == []
        assert bytes(s.restore(1)["x"]) == b"acknowledged" * 1000


def test_a_reader_leaves_a_killed_writers_mark(tmp_path):
    """Readers write nothing, not even the sync that would let the mark go."""
    store = str(tmp_path / "s")
    child = textwrap.dedent(f"""
        import os, signal, snapstore
        s = snapstore.open({store!r}, sync_index=False)
        s.checkpoint({{"x": b"x"}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    subprocess.run([sys.executable, "-c", child], check=False)
    with snapstore.open(store, readonly=True) as r:
        assert bytes(r.restore(1)["x"]) == b"x"
    assert len(_marks(store)) == 1


def test_a_forked_child_closing_its_copy_leaves_the_parents_mark(tmp_path):
    store = str(tmp_path / "s")
    s = snapstore.open(store, sync_index=False)
    try:
        [name] = _marks(store)
        pid = os.fork()
        if pid == 0:                                 # the child
            try:
                s.close()
                os._exit(0 if _marks(store) == [name] else 1)
            except BaseException:
                os._exit(2)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert _marks(store) == [name]
        assert flocked(os.path.join(store, "unsynced", name))     # still the parent's
        s.checkpoint({"x": b"after the fork"})
    finally:
        s.close()
    assert _marks(store) == []


def test_a_failing_sync_at_close_keeps_the_mark(tmp_path, monkeypatch):
    """The mark goes only once the index is synced; a failure at close leaves it for the next
    writer (same boot) or the rebuild (after a reboot)."""
    store = str(tmp_path / "s")
    s = snapstore.open(store, sync_index=False)
    s.checkpoint({"x": b"x"})
    index = s._committer.index

    def broken_sync():
        raise snapstore.errors.StoreIOError("injected: EIO", 5)
    monkeypatch.setattr(index, "sync", broken_sync)
    s.close()
    [left] = _marks(store)
    assert not flocked(os.path.join(store, "unsynced", left))
    monkeypatch.undo()
    with snapstore.open(store) as again:
        assert _marks(store) == []
        assert bytes(again.restore(1)["x"]) == b"x"


def test_sync_index_arguments(tmp_path):
    with pytest.raises(InvalidArgumentTypeError, match="sync_index"):
        snapstore.open(str(tmp_path / "a"), sync_index="no")
    with pytest.raises(InvalidArgumentError, match="sync_index=False is for local stores"):
        snapstore.open("s3://bucket/prefix", sync_index=False, cache_dir=str(tmp_path / "c"))
    assert not os.path.exists(tmp_path / "a")


def test_without_a_boot_id_the_index_is_synced_as_before(tmp_path, monkeypatch):
    """Nothing could tell a reboot: no mark is made and a "fsync" writer syncs its index."""
    monkeypatch.setattr(unsynced, "boot_id", lambda: None)
    store = str(tmp_path / "s")
    with snapstore.open(store, sync_index=False) as s:
        assert _marks(store) == []
        assert s._committer.index.durable
        s.checkpoint({"x": b"x"})


_SYNCS_CHILD = textwrap.dedent("""
    import os, sys, snapstore
    store, mode = sys.argv[1], sys.argv[2]
    options = {"sync_index": False} if mode == "deferred" else {}
    with snapstore.open(store, **options) as s:
        s.checkpoint({"x": b"first" * 100}, stream="w")
        os.write(2, b"BEGIN\\n")
        for i in range(12):
            s.checkpoint({"x": b"%d" % i * 1000}, stream="w")
        os.write(2, b"END\\n")
""")


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is installed by make deps")
@pytest.mark.parametrize("mode,per_commit", [("default", 3), ("deferred", 1)])
def test_a_commit_makes_one_sync_without_index_syncs_and_three_with(tmp_path, mode, per_commit):
    """Counted with strace: every fsync/fdatasync of the process between 12 commits."""
    out = tmp_path / "trace"
    subprocess.run(["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,write", "-o", str(out),
                    sys.executable, "-c", _SYNCS_CHILD, str(tmp_path / "s"), mode],
                   check=True, capture_output=True)
    lines = out.read_text().splitlines()
    begin = next(i for i, line in enumerate(lines) if "BEGIN" in line)
    end = next(i for i, line in enumerate(lines) if "END" in line)
    syncs = [line for line in lines[begin:end] if re.search(r"\b(fsync|fdatasync)\(", line)]
    assert len(syncs) == 12 * per_commit, syncs


def test_a_durable_store_sharing_the_environment_of_one_without_syncs_syncs_it(tmp_path):
    """One LMDB environment per store per process, opened with its first opener's sync mode:
    a default writer opened second must still sync its index transactions."""
    store = str(tmp_path / "s")
    out = tmp_path / "trace"
    child = textwrap.dedent(f"""
        import os, snapstore
        careless = snapstore.open({store!r}, sync_index=False)
        durable = snapstore.open({store!r})
        durable.checkpoint({{"x": b"first"}}, stream="d")
        os.write(2, b"BEGIN\\n")
        durable.checkpoint({{"x": b"second"}}, stream="d")
        os.write(2, b"END\\n")
        durable.close(); careless.close()
    """)
    if shutil.which("strace") is None:
        pytest.skip("strace is installed by make deps")
    subprocess.run(["strace", "-f", "-qq", "-e", "trace=fsync,fdatasync,write", "-o", str(out),
                    sys.executable, "-c", child], check=True, capture_output=True)
    lines = out.read_text().splitlines()
    begin = next(i for i, line in enumerate(lines) if "BEGIN" in line)
    end = next(i for i, line in enumerate(lines) if "END" in line)
    syncs = [line for line in lines[begin:end] if re.search(r"\b(fsync|fdatasync)\(", line)]
    assert len(syncs) == 3, syncs


@pytest.mark.parametrize("durability", ["fsync", "none"])
@pytest.mark.parametrize("fail_in", ["_take_log", "Index", "LocalSegments"])
def test_an_open_that_fails_after_marking_removes_the_mark(tmp_path, monkeypatch, fail_in,
                                                            durability):
    """The open's own error comes out (not one of the cleanup's), and no mark stays."""
    from snapstore.engine import commit
    store = str(tmp_path / "s")
    snapstore.open(store).close()

    def broken(*args, **kwargs):
        raise snapstore.errors.StoreIOError("injected: EIO", 5)
    if fail_in == "_take_log":
        monkeypatch.setattr(commit.Committer, "_take_log", broken)
    else:
        monkeypatch.setattr(commit, fail_in, broken)
    with pytest.raises(snapstore.errors.StoreIOError, match="injected"):
        snapstore.open(store, sync_index=False, durability=durability)
    assert _marks(store) == []
    monkeypatch.undo()
    with snapstore.open(store, sync_index=False) as s:
        assert len(_marks(store)) == 1
        s.checkpoint({"x": b"fine"})


@pytest.mark.parametrize("options,expected", [
    ({}, True), ({"sync_index": False}, False), ({"durability": "none"}, False),
    ({"readonly": True}, None)])
def test_stats_say_whether_a_commit_syncs_the_index(tmp_path, options, expected):
    store = str(tmp_path / "s")
    snapstore.open(store).close()
    with snapstore.open(store, **options) as s:
        stats = s.stats()
        assert stats["index_synced_at_commit"] is expected
        assert stats["index_rebuilt_seconds"] is None


def test_stats_report_the_rebuild_an_open_did(tmp_path):
    store = str(tmp_path / "s")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"x" * 5000})
    os.makedirs(os.path.join(store, "unsynced"))
    open(os.path.join(store, "unsynced", "00000000-0000-0000-0000-000000000000.0123456789abcdef"),
         "w").close()
    with snapstore.open(store) as s:
        assert s.stats()["index_rebuilt_seconds"] > 0
    with snapstore.open(store) as s:                 # nothing to rebuild any more
        assert s.stats()["index_rebuilt_seconds"] is None
