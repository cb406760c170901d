"""An index written without syncs, after the machine went down (engine/unsynced.py,
docs/design.md "An index written without syncs"): a mark of an earlier boot makes the next
opener rebuild the index from the log before LMDB maps it, so every checkpoint a writer with
sync_index=False acknowledged restores byte-exact, whatever the index file holds.

The reboot is modelled in this process: unsynced.boot_id() answers another boot's id, and the
store is copied as a power cut could leave it (fsync_journal: each segment cut back to its
last synced size), its index file replaced by what the disk might hold instead."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fsync_journal  # noqa: E402

import snapstore  # noqa: E402
from snapstore.engine import unsynced  # noqa: E402
from snapstore.errors import CorruptionError  # noqa: E402

NEXT_BOOT = "11111111-2222-3333-4444-555555555555"


def _marks(store: str) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(store, "unsynced")))
    except FileNotFoundError:
        return []


def _states(n: int, size: int = 3 * 65536 + 5) -> list[bytes]:
    rng = random.Random(n)
    first = bytes(rng.getrandbits(8) for _ in range(size))
    out = [first]
    for _ in range(n - 1):
        b = bytearray(out[-1])
        for _ in range(3):                           # a few pages change each time
            at = rng.randrange(size)
            b[at:at + 100] = bytes(rng.getrandbits(8) for _ in range(len(b[at:at + 100])))
        out.append(bytes(b))
    return out


def _writer_child(store: str, journal: str, states_file: str, kill: bool) -> str:
    return textwrap.dedent(f"""
        import os, pickle, signal, sys
        sys.path.insert(0, {HERE!r})
        import fsync_journal
        fsync_journal.install({journal!r})
        import snapstore
        states = pickle.load(open({states_file!r}, "rb"))
        s = snapstore.open({store!r}, sync_index=False)
        for i, x in enumerate(states):
            info = s.checkpoint({{"x": x}}, stream="agent")
            print(info.id, flush=True)               # acknowledged
        if {kill!r}:
            os.kill(os.getpid(), signal.SIGKILL)
        s.close()
    """)


def _run_writer(tmp_path, store, journal, states, kill: bool) -> list[int]:
    import pickle
    states_file = str(tmp_path / "states.pkl")
    with open(states_file, "wb") as f:
        pickle.dump(states, f)
    p = subprocess.run([sys.executable, "-c", _writer_child(store, journal, states_file, kill)],
                       capture_output=True, text=True)
    assert p.returncode == (-signal.SIGKILL if kill else 0), p.stderr
    return [int(line) for line in p.stdout.split()]


def _damage_index(store: str, how: str, stale_copy: str | None) -> None:
    data = os.path.join(store, "index", "data.mdb")
    if how == "garbage":                             # pages the disk never got
        size = os.path.getsize(data)
        with open(data, "r+b") as f:
            f.write(random.Random(5).randbytes(size))
    elif how == "torn":                              # every other page of it lost
        with open(data, "r+b") as f:
            size = os.path.getsize(data)
            for page in range(1, size // 4096, 2):
                f.seek(page * 4096)
                f.write(bytes(4096))
    elif how == "old":                               # a valid index, from before the commits
        with open(stale_copy, "rb") as src, open(data, "wb") as dst:
            dst.write(src.read())
    elif how == "empty":
        open(data, "wb").close()
    else:
        assert how == "intact"


@pytest.fixture
def journal(tmp_path):
    return str(tmp_path / "journal")


@pytest.mark.parametrize("how", ["garbage", "torn", "old", "empty", "intact"])
@pytest.mark.parametrize("kill", [True, False], ids=["killed", "closed"])
def test_every_acknowledged_checkpoint_survives_a_power_cut(tmp_path, journal, kill_log,
                                                            monkeypatch, how, kill):
    store, cut = str(tmp_path / "s"), str(tmp_path / "cut")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"seed"}, stream="seed")
    stale_copy = str(tmp_path / "old.mdb")
    with open(os.path.join(store, "index", "data.mdb"), "rb") as f:
        open(stale_copy, "wb").write(f.read())
    states = _states(6)
    ids = _run_writer(tmp_path, store, journal, states, kill)
    if kill:
        kill_log()
    assert len(ids) == len(states)
    fsync_journal.power_cut_copy(store, cut, journal)
    if not kill:
        # a clean close synced the index and removed the mark: nothing to rebuild
        assert _marks(cut) == []
        how = "intact"
    else:
        assert len(_marks(cut)) == 1                 # the mark was durable before any write
    _damage_index(cut, how, stale_copy)
    monkeypatch.setattr(unsynced, "boot_id", lambda: NEXT_BOOT)
    with snapstore.open(cut) as s:                   # rebuilds first (when marked)
        assert _marks(cut) == []
        for checkpoint_id, x in zip(ids, states):
            assert bytes(s.restore(checkpoint_id)["x"]) == x
        assert bytes(s.restore(1)["x"]) == b"seed"
        # it goes on: a change, then nothing changed, on the same stream
        more = s.checkpoint({"x": states[-1][:-1] + b"!"}, stream="agent")
        same = s.checkpoint({"x": states[-1][:-1] + b"!"}, stream="agent")
        assert bytes(s.restore(same.id)["x"]) == states[-1][:-1] + b"!"
        assert more.id < same.id
    with snapstore.open(cut) as s:
        assert s.verify()["ok"]


def test_a_reader_rebuilds_an_untrusted_index_too(tmp_path):
    store = str(tmp_path / "s")
    with snapstore.open(store, sync_index=False) as s:
        s.checkpoint({"x": b"kept"})
    os.makedirs(os.path.join(store, "unsynced"), exist_ok=True)
    open(os.path.join(store, "unsynced", "00000000-0000-0000-0000-000000000000.0123456789abcdef"),
         "w").close()
    _damage_index(store, "garbage", None)
    with snapstore.open(store, readonly=True) as r:
        assert bytes(r.restore(1)["x"]) == b"kept"
    assert _marks(store) == []
    with snapstore.open(store, readonly=True) as r:   # the same call twice: no second rebuild
        assert [c.id for c in r.checkpoints()] == [1]


def test_a_reader_that_cannot_rebuild_says_what_to_do(tmp_path, monkeypatch):
    store = str(tmp_path / "s")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"x"})
    os.makedirs(os.path.join(store, "unsynced"))
    open(os.path.join(store, "unsynced", "00000000-0000-0000-0000-000000000000.0123456789abcdef"),
         "w").close()
    from snapstore.engine import storedir

    def refused(path):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(storedir, "open_lock_file", refused)
    with pytest.raises(CorruptionError, match="must be rebuilt from the log.*snapstore repair"):
        snapstore.open(store, readonly=True)
    assert len(_marks(store)) == 1                   # nothing changed


def test_an_empty_store_with_an_untrusted_index_opens_empty(tmp_path):
    store = str(tmp_path / "s")
    snapstore.open(store).close()
    os.makedirs(os.path.join(store, "unsynced"))
    open(os.path.join(store, "unsynced", "00000000-0000-0000-0000-000000000000.0123456789abcdef"),
         "w").close()
    open(os.path.join(store, "unsynced", ".00000000-0000-0000-0000-000000000000.fedcba9876543210"),
         "w").close()                                # a creation a crash interrupted
    _damage_index(store, "garbage", None)
    with snapstore.open(store) as s:
        assert s.checkpoints() == []
        info = s.checkpoint({"x": b""})
        assert bytes(s.restore(info.id)["x"]) == b""
    assert _marks(store) == []


def test_repair_never_opens_an_untrusted_index_and_removes_the_marks(tmp_path):
    store = str(tmp_path / "s")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"a" * 70000})
    os.makedirs(os.path.join(store, "unsynced"))
    open(os.path.join(store, "unsynced", "00000000-0000-0000-0000-000000000000.0123456789abcdef"),
         "w").close()
    _damage_index(store, "garbage", None)
    report = snapstore.repair(store)
    assert report["ok"] and report["index_replaced"] and report["checkpoints"] == 1
    assert _marks(store) == []
    with snapstore.open(store, readonly=True) as r:
        assert bytes(r.restore(1)["x"]) == b"a" * 70000


@pytest.mark.parametrize("point", ["repair_before_swap", "repair_after_swap"])
def test_a_rebuild_killed_midway_is_done_again_by_the_next_open(tmp_path, kill_log, point):
    store = str(tmp_path / "s")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"b" * 5000})
    os.makedirs(os.path.join(store, "unsynced"))
    open(os.path.join(store, "unsynced", "00000000-0000-0000-0000-000000000000.0123456789abcdef"),
         "w").close()
    _damage_index(store, "garbage", None)
    child = textwrap.dedent(f"""
        import snapstore
        snapstore.open({store!r}).close()
    """)
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                       env={**os.environ, "SNAPSTORE_CRASH_AT": point})
    assert p.returncode == -signal.SIGKILL, p.stderr
    kill_log()
    assert len(_marks(store)) == 1                   # removed only after the swap is done
    with snapstore.open(store) as s:
        assert bytes(s.restore(1)["x"]) == b"b" * 5000
    assert _marks(store) == []


def test_a_none_writers_clean_close_syncs_its_log_before_its_index(tmp_path):
    """Its close syncs the index (to let its mark go): the log first, so a power cut after a
    clean close never leaves an index durable past the log's end (an open would refuse it)."""
    store, cut, journal = str(tmp_path / "s"), str(tmp_path / "cut"), str(tmp_path / "j")
    child = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {HERE!r})
        import fsync_journal
        fsync_journal.install({journal!r})
        import snapstore
        with snapstore.open({store!r}, durability="none") as s:
            s.checkpoint({{"x": b"careless" * 999}})
    """)
    subprocess.run([sys.executable, "-c", child], check=True)
    fsync_journal.power_cut_copy(store, cut, journal)
    assert _marks(cut) == []
    with snapstore.open(cut) as s:
        assert bytes(s.restore(1)["x"]) == b"careless" * 999


def test_a_killed_none_writers_mark_goes_only_after_its_log_is_synced(tmp_path, kill_log):
    store, cut, journal = str(tmp_path / "s"), str(tmp_path / "cut"), str(tmp_path / "j")
    child = textwrap.dedent(f"""
        import os, signal, snapstore
        s = snapstore.open({store!r}, durability="none")
        s.checkpoint({{"x": b"dying" * 999}})
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", child], capture_output=True)
    assert p.returncode == -signal.SIGKILL
    kill_log()
    assert len(_marks(store)) == 1
    uninstall = fsync_journal.install(journal)
    try:
        # a default writer (no mark of its own) takes over the dead one's log
        with snapstore.open(store) as s:
            assert _marks(store) == []                       # the orphan is gone
            fsync_journal.power_cut_copy(store, cut, journal)    # while it is open
    finally:
        uninstall()
    with snapstore.open(cut) as s:                           # no mark: nothing rebuilt
        assert _marks(cut) == []
        assert bytes(s.restore(1)["x"]) == b"dying" * 999
