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


def _stale_mark(store: str) -> str:
    """A mark of an earlier boot (its writer gone: nobody holds its lock)."""
    os.makedirs(os.path.join(store, "unsynced"), exist_ok=True)
    path = os.path.join(store, "unsynced", "00000000-0000-0000-0000-000000000000.0123456789abcdef")
    open(path, "w").close()
    return path


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
    _stale_mark(store)
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
    _stale_mark(store)
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
    _stale_mark(store)
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
    _stale_mark(store)
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
    _stale_mark(store)
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


# ---- regressions from the review of stop 45 ----------------------------------------------

GOLDEN_V1 = os.path.join(os.path.dirname(HERE), "golden", "stores", "v1", "basic")


def test_an_upgrade_is_never_marked_so_a_crash_in_it_never_rebuilds_from_an_old_log(
        tmp_path, kill_log, monkeypatch):
    """A format 1 log lacks what old compactions removed: a writer that upgrades the store
    makes no mark in that open, so a crash inside the upgrade followed by a reboot never
    rebuilds the index from that log (checkpoints 10-12 of the golden store were lost)."""
    import json
    import shutil
    expected = sorted(c["id"] for c in json.load(
        open(os.path.join(GOLDEN_V1, "expected.json")))["checkpoints"])
    store = str(tmp_path / "s")
    shutil.copytree(GOLDEN_V1, store)
    p = subprocess.run([sys.executable, "-c",
                        f"import snapstore; snapstore.open({store!r}, sync_index=False)"],
                       env={**os.environ, "SNAPSTORE_CRASH_AT": "upgrade_before_index_commit"},
                       capture_output=True, text=True)
    assert p.returncode == -signal.SIGKILL, p.stderr
    kill_log()
    assert _marks(store) == []
    monkeypatch.setattr(unsynced, "boot_id", lambda: NEXT_BOOT)
    with snapstore.open(store, sync_index=False) as s:     # upgrades now: still no mark
        assert _marks(store) == []
        assert sorted(c.id for c in s.checkpoints()) == expected
    with snapstore.open(store, sync_index=False) as s:     # today's format: marked
        assert len(_marks(store)) == 1
        assert sorted(c.id for c in s.checkpoints()) == expected


def test_a_format_1_store_with_an_untrusted_index_is_left_to_repair(tmp_path):
    import shutil
    store = str(tmp_path / "s")
    shutil.copytree(GOLDEN_V1, store)
    _stale_mark(store)
    with pytest.raises(CorruptionError, match="format 1.*snapstore repair"):
        snapstore.open(store)
    report = snapstore.repair(store)
    assert not report["ok"] and "old_format" in {p["kind"] for p in report["problems"]}


def test_a_none_writer_syncs_the_logs_it_recovered_before_its_index_at_close(tmp_path):
    """A durable writer killed between its append and its sync; a "none" writer recovers
    that log (from the page cache) into its index, then closes: the recovered records must be
    durable before the index that names them is."""
    store, cut, journal = str(tmp_path / "s"), str(tmp_path / "cut"), str(tmp_path / "j")
    uninstall = fsync_journal.install(journal)
    try:
        first = snapstore.open(store)
        first.checkpoint({"x": b"w0" * 1000}, stream="w0")
        dying = textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {HERE!r})
            import fsync_journal
            fsync_journal.install({journal!r})
            import snapstore
            s = snapstore.open({store!r})
            s.checkpoint({{"x": b"d1" * 1000}}, stream="d")
            s.checkpoint({{"x": b"d2" * 1000}}, stream="d")
        """)
        p = subprocess.run([sys.executable, "-c", dying], capture_output=True,
                           env={**os.environ, "SNAPSTORE_CRASH_AT": "after_commit_append:2"})
        assert p.returncode == -signal.SIGKILL
        first.close()
        with snapstore.open(store, durability="none") as careless:   # recovers both logs
            careless.checkpoint({"x": b"n" * 1000}, stream="n")
        assert _marks(store) == []
        fsync_journal.power_cut_copy(store, cut, journal)
    finally:
        uninstall()
    with snapstore.open(cut) as s:
        assert bytes(s.restore(s.latest("d").id)["x"]) == b"d2" * 1000


def test_the_marks_directory_is_durable_before_the_first_mark(tmp_path):
    store, journal = str(tmp_path / "s"), str(tmp_path / "j")
    snapstore.open(store).close()
    uninstall = fsync_journal.install(journal)
    try:
        snapstore.open(store, sync_index=False).close()
    finally:
        uninstall()
    synced = [line.split("\t")[0] for line in open(journal)]
    marks = os.path.join(store, "unsynced")
    first_mark = next(i for i, p in enumerate(synced) if p.startswith(marks + os.sep))
    assert os.path.realpath(store) in synced[:first_mark]


def test_repair_never_maps_an_untrusted_index(tmp_path, monkeypatch):
    from snapstore.engine import index as index_module
    store = str(tmp_path / "s")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"a" * 70000})
    _stale_mark(store)
    opened = []
    real_open = index_module.lmdb.open

    def spy(path, *args, **kwargs):
        opened.append(os.path.relpath(os.fsdecode(path), store))
        return real_open(path, *args, **kwargs)
    monkeypatch.setattr(index_module.lmdb, "open", spy)
    assert snapstore.repair(store)["ok"]
    assert "index" not in opened and opened


def test_a_mark_held_by_a_live_writer_is_never_stale_whatever_its_boot_id(tmp_path):
    """(A sandbox with a boot id of its own.) Its lock says it is alive: no rebuild."""
    import fcntl
    store = str(tmp_path / "s")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"x"})
    mark = _stale_mark(store)
    fd = os.open(mark, os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = os.stat(os.path.join(store, "index", "data.mdb")).st_ino
        with snapstore.open(store) as s:
            assert bytes(s.restore(1)["x"]) == b"x"
        assert os.stat(os.path.join(store, "index", "data.mdb")).st_ino == before
        assert os.path.exists(mark)
    finally:
        os.close(fd)


def test_a_rebuild_that_finds_damage_in_the_log_says_so_and_leaves_it_to_repair(tmp_path):
    store = str(tmp_path / "s")
    with snapstore.open(store, segment_size=1 << 16) as s:
        for i in range(6):
            s.checkpoint({"x": random.Random(i).randbytes(50000)}, stream="s")
    segments = sorted(os.listdir(os.path.join(store, "segments")))
    assert len(segments) > 2
    with open(os.path.join(store, "segments", segments[0]), "r+b") as f:   # a sealed one
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 0xFF]))
    _stale_mark(store)
    with pytest.raises(CorruptionError, match="holds damage.*snapstore repair"):
        snapstore.open(store)
    assert len(_marks(store)) == 1                      # every open says so, until repair
    report = snapstore.repair(store)
    assert not report["ok"] and _marks(store) == []
    with snapstore.open(store) as s:
        assert bytes(s.restore(s.latest("s").id)["x"]) == random.Random(5).randbytes(50000)


def test_what_is_not_a_regular_file_in_the_marks_directory_is_not_a_mark(tmp_path):
    store = str(tmp_path / "s")
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"x"})
    os.makedirs(os.path.join(store, "unsynced",
                             "00000000-0000-0000-0000-000000000000.0123456789abcdef"))
    before = os.stat(os.path.join(store, "index", "data.mdb")).st_ino
    with snapstore.open(store) as s:                 # no rebuild, no error
        assert bytes(s.restore(1)["x"]) == b"x"
    assert os.stat(os.path.join(store, "index", "data.mdb")).st_ino == before


# ---- regressions from the second review of stop 45 ---------------------------------------

def test_another_openers_look_at_a_stale_mark_never_makes_it_look_alive(tmp_path):
    """Openers look at a mark's lock to tell a live writer; two looking at once must not take
    each other's look for one (an exclusive look did: the other then mapped the untrusted
    index and missed acknowledged checkpoints)."""
    import fcntl
    store = str(tmp_path / "s")
    snapstore.open(store).close()
    mark = _stale_mark(store)
    fd = os.open(mark, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)               # another opener looking right now
        assert unsynced.untrusted(store) == [os.path.basename(mark)]
    finally:
        os.close(fd)


def test_a_none_writers_sealed_segments_survive_a_power_cut_while_it_is_open(tmp_path,
                                                                              monkeypatch):
    """A sealed segment is synced at its roll whatever the durability, so the cut takes only
    the last segment's tail (a torn tail): the next boot rebuilds without finding damage."""
    store, cut, journal = str(tmp_path / "s"), str(tmp_path / "cut"), str(tmp_path / "j")
    uninstall = fsync_journal.install(journal)
    try:
        with snapstore.open(store, durability="none", segment_size=1 << 16) as s:
            saved = {s.checkpoint({"x": random.Random(i).randbytes(50000)}, stream="s").id: i
                     for i in range(6)}
            assert len(os.listdir(os.path.join(store, "segments"))) >= 5
            fsync_journal.power_cut_copy(store, cut, journal)    # while it is open
    finally:
        uninstall()
    monkeypatch.setattr(unsynced, "boot_id", lambda: NEXT_BOOT)
    with snapstore.open(cut) as s:
        kept = s.checkpoint_ids("s")
        assert len(kept) >= 4                        # all but what the last segment held
        for checkpoint_id in kept:
            assert bytes(s.restore(checkpoint_id)["x"]) == \
                random.Random(saved[checkpoint_id]).randbytes(50000)
        s.checkpoint({"x": b"goes on"}, stream="s")
    assert _marks(cut) == []


def test_a_none_writer_that_upgrades_syncs_its_index_for_that_session(tmp_path):
    import shutil
    store = str(tmp_path / "s")
    shutil.copytree(GOLDEN_V1, store)
    with snapstore.open(store, durability="none") as s:
        assert _marks(store) == [] and s.stats()["index_synced_at_commit"] is True
        s.checkpoint({"x": b"after the upgrade"}, stream="new")
    with snapstore.open(store, durability="none") as s:
        assert len(_marks(store)) == 1 and s.stats()["index_synced_at_commit"] is False


def test_a_creation_cut_short_by_a_power_cut_is_made_anew(tmp_path):
    """No FORMAT yet, an index written without syncs (garbage past its meta pages) and its
    creator's mark of an earlier boot: the next open creates the store, never mapping it."""
    store = str(tmp_path / "s")
    snapstore.open(store, sync_index=False).close()
    os.unlink(os.path.join(store, "FORMAT"))
    data = os.path.join(store, "index", "data.mdb")
    with open(data, "r+b") as f:
        f.seek(2 * 4096)
        f.write(random.Random(1).randbytes(os.path.getsize(data) - 2 * 4096))
    _stale_mark(store)
    with snapstore.open(store, sync_index=False) as s:
        info = s.checkpoint({"x": b"1"})
        assert bytes(s.restore(info.id)["x"]) == b"1"
        assert len(_marks(store)) == 1               # its own
