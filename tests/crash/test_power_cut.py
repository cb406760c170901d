"""Power cuts, modelled: every sync is journaled (fsync_journal.py), and the store is copied as
the disk would hold it, each segment cut back to its last synced size. What a writer with
durability "fsync" acknowledged must restore byte-exact from that copy, whoever else wrote the
records it builds on: a writer with durability "none", or a dead writer whose log another
process recovered from the page cache."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fsync_journal  # noqa: E402

import snapstore  # noqa: E402


@pytest.fixture
def journal(tmp_path):
    path = str(tmp_path / "journal")
    uninstall = fsync_journal.install(path)
    yield path
    uninstall()


def _state(seed: int, size: int = 1 << 20) -> bytes:
    return bytes((i * seed + (i >> 12)) & 0xFF for i in range(size))


def _cut_and_restore(store: str, dest: str, journal: str, checkpoint_id: int) -> bytes:
    """The power cut, then a writer open (recovery) of what the disk held and a restore."""
    fsync_journal.power_cut_copy(store, dest, journal)
    with snapstore.open(dest) as s:
        return bytes(s.restore(checkpoint_id)["x"])


@pytest.mark.parametrize("builds_on", ["dedup", "parent"])
def test_a_durable_checkpoint_survives_when_a_none_writer_wrote_what_it_builds_on(
        tmp_path, journal, builds_on):
    store, x = str(tmp_path / "s"), _state(7)
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"seed"}, stream="seed")
    careless = snapstore.open(store, durability="none")
    try:
        careless.checkpoint({"x": x}, stream="scratch")
        with snapstore.open(store) as durable:
            if builds_on == "dedup":        # the same bytes on a stream of its own
                info = durable.checkpoint({"x": x}, stream="important")
            else:                           # one page changed on the careless one's stream
                x = x[:4096] + bytes(4096) + x[8192:]
                info = durable.checkpoint({"x": x}, stream="scratch")
            assert info.bytes_new < len(x) // 4     # it did build on the careless records
        assert _cut_and_restore(store, str(tmp_path / "cut"), journal, info.id) == x
    finally:
        careless.close()


def test_recovery_makes_what_it_publishes_durable(tmp_path, journal, kill_log):
    """A writer SIGKILLed after appending its commit record, before its sync: the next
    writer's open recovers the record from the page cache and publishes it (its index
    transaction is synced). After a power cut the store must still open, with the recovered
    checkpoint whole, not an index past the end of the log."""
    store, x = str(tmp_path / "s"), _state(11)
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"seed"}, stream="seed")
    child = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {HERE!r})
        import fsync_journal
        fsync_journal.install({journal!r})
        import snapstore
        x = open({str(tmp_path / "x")!r}, "rb").read()
        with snapstore.open({store!r}) as s:
            s.checkpoint({{"x": x}}, stream="dying")
    """)
    (tmp_path / "x").write_bytes(x)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True,
                          env={**os.environ, "SNAPSTORE_CRASH_AT": "after_commit_append"})
    assert proc.returncode == -9, proc.stderr.decode()
    kill_log()
    with snapstore.open(store) as s:        # recovers the dead writer's log
        recovered = s.latest("dying").id
    assert _cut_and_restore(store, str(tmp_path / "cut"), journal, recovered) == x


def _unmarked(cut: str) -> None:
    """The copy as an older snapstore's "none" writer left it: no marks (unsynced.py)."""
    shutil.rmtree(os.path.join(cut, "unsynced"), ignore_errors=True)


def _none_writer_cut_while_open(tmp_path, journal) -> tuple:
    """A checkpoint of a "fsync" writer, then one of a "none" writer, and the power cut while
    the latter is open: (the cut copy, the older state, its id, the id the cut loses)."""
    store, old = str(tmp_path / "s"), _state(3, 200_000)
    with snapstore.open(store) as s:
        kept = s.checkpoint({"x": old}, stream="s").id
    cut = str(tmp_path / "cut")
    with snapstore.open(store, durability="none") as s:
        lost = s.checkpoint({"x": _state(5, 200_000)}, stream="t").id
        fsync_journal.power_cut_copy(store, cut, journal)
    return cut, old, kept, lost


def _only_the_older_checkpoint_and_writable(cut: str, old: bytes, kept: int, lost: int) -> None:
    with snapstore.open(cut) as s:
        assert bytes(s.restore(kept)["x"]) == old
        assert [c.id for c in s.checkpoints()] == [kept]
        with pytest.raises(snapstore.errors.CheckpointNotFound):
            s.get(lost)
        s.checkpoint({"x": b"goes on"}, stream="s")


def test_repair_gives_back_a_writable_store_after_a_none_writer_lost_its_tail(tmp_path, journal):
    """Durability "none" promises that a power cut may lose the latest checkpoints, never the
    older ones. The cut, while the writer is open, takes the unsynced log tail while the index
    (written back by the kernel on its own schedule) names it. Today's writer left a mark, so
    the next open rebuilds (tests/crash/test_unsynced_index.py); without one (an older
    snapstore's writer) a writer open refuses, naming repair, and repair rebuilds the index
    from the log instead of keeping the one past the log's end."""
    cut, old, kept, lost = _none_writer_cut_while_open(tmp_path, journal)
    _unmarked(cut)
    with pytest.raises(snapstore.errors.CorruptionError, match="snapstore repair"):
        snapstore.open(cut)
    report = snapstore.repair(cut)
    assert report["index_replaced"]
    assert "lost_tail" in [p["kind"] for p in report["problems"]]
    _only_the_older_checkpoint_and_writable(cut, old, kept, lost)


def test_a_new_store_makes_its_directories_durable(tmp_path, journal):
    """Creating a store syncs the entries a power cut could otherwise take: the index's file
    (index/), the segments and writers directories, FORMAT, and the store in its parent."""
    store = tmp_path / "parent" / "s"
    store.parent.mkdir()
    with snapstore.open(str(store)) as s:
        s.checkpoint({"x": b"1"})
    synced = fsync_journal.synced_sizes(journal)
    real = os.path.realpath(store)
    for directory in (real, os.path.dirname(real), os.path.join(real, "index"),
                      os.path.join(real, "segments"), os.path.join(real, "writers")):
        assert directory in synced, directory


def test_a_none_writer_does_not_go_on_over_a_lost_tail(tmp_path, journal):
    """After such a power cut a writer with durability "none" used to open and append where
    the index still placed the lost chunks: a new checkpoint of the same bytes deduplicated
    against them and named other records (acknowledged, never restorable). It is refused
    like any writer, and after repair the new checkpoint restores."""
    store, data = str(tmp_path / "s"), _state(9, 200_000)
    with snapstore.open(store) as s:
        s.checkpoint({"x": b"old"}, stream="s")
    cut = str(tmp_path / "cut")
    with snapstore.open(store, durability="none") as s:
        s.checkpoint({"x": data}, stream="t")
        fsync_journal.power_cut_copy(store, cut, journal)     # while it is open
    _unmarked(cut)
    with pytest.raises(snapstore.errors.CorruptionError, match="snapstore repair"):
        snapstore.open(cut, durability="none")
    snapstore.repair(cut)
    with snapstore.open(cut, durability="none") as s:
        info = s.checkpoint({"y": data}, stream="u")
        assert bytes(s.restore(info.id)["y"]) == data


def test_a_none_writers_lost_tail_is_rebuilt_away_at_the_next_boot(tmp_path, journal,
                                                                   monkeypatch):
    """The same cut with today's mark and a reboot: the next open rebuilds the index from the
    log first; the older checkpoint restores, the lost one is gone, the store is writable."""
    from snapstore.engine import unsynced
    cut, old, kept, lost = _none_writer_cut_while_open(tmp_path, journal)
    monkeypatch.setattr(unsynced, "boot_id", lambda: "11111111-2222-3333-4444-555555555555")
    _only_the_older_checkpoint_and_writable(cut, old, kept, lost)
