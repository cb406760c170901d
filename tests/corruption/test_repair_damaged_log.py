"""Repair of a damaged log leaves a store every writer can open, and names every checkpoint
it cannot give back.

The case that motivated these tests: an index that is behind the log (it lost transactions
written without syncs: a power cut with durability "none", or with code before the unsynced
marks), and damage in a sealed segment after where that index applied the log. A writer's
recovery replays the log from there and refuses the damage ("invalid record in a sealed
segment"); repair used to keep that index because it was sound, so the store stayed
unwritable however often repair ran, and the valid checkpoints after the damage stayed hidden.
"""
from __future__ import annotations

import glob
import os
import random
import shutil

import pytest

import snapstore
from snapstore.engine import format as fmt
from snapstore.errors import CorruptionError, SnapstoreError

OPTS = dict(segment_size=1 << 16, compression="none")    # a segment per checkpoint
PAGE = 4096


class Written:
    """A store written a checkpoint at a time, remembering each checkpoint's bytes."""

    def __init__(self, path: str, seed: int = 1, **options) -> None:
        self.path = path
        self.options = dict(OPTS, **options)
        self.rng = random.Random(seed)
        self.buf = bytearray(self.rng.randbytes(48 << 10))
        self.data: dict[int, dict] = {}

    def checkpoints(self, n: int, *, scattered: bool = False) -> list[int]:
        """n checkpoints: whole new buffers, or (scattered) two pages of one buffer changed
        (incremental: delta manifests) beside a new buffer of its own."""
        ids = []
        with snapstore.open(self.path, **self.options) as s:
            for _ in range(n):
                if scattered:
                    for _ in range(2):
                        p = self.rng.randrange(len(self.buf) // PAGE)
                        self.buf[p * PAGE:(p + 1) * PAGE] = self.rng.randbytes(PAGE)
                    buffers = {"a": bytes(self.buf), "pad": self.rng.randbytes(20000)}
                else:
                    buffers = {"a": self.rng.randbytes(50000)}
                info = s.checkpoint(buffers)
                self.data[info.id] = buffers
                ids.append(info.id)
        return ids

    def segments(self) -> list[str]:
        return sorted(glob.glob(os.path.join(self.path, "segments", "*")))

    def keep_index(self, where: str) -> None:
        shutil.copytree(os.path.join(self.path, "index"), where)

    def put_index_back(self, where: str) -> None:
        """The index as it was when kept: later transactions lost, the log kept them."""
        shutil.rmtree(os.path.join(self.path, "index"))
        shutil.copytree(where, os.path.join(self.path, "index"))


def records(segment: str) -> list[tuple[int, int, int]]:
    """[(offset, type, payload length)] of a segment's records, walking their headers."""
    data = open(segment, "rb").read()
    out, pos = [], fmt.SEGMENT_HEADER.size
    while pos + fmt.RECORD_HEADER.size <= len(data):
        magic, rtype, _, _, length, _, _ = fmt.RECORD_HEADER.unpack_from(data, pos)
        if magic != fmt.RECORD_MAGIC:
            break
        out.append((pos, rtype, length))
        pos += fmt.RECORD_HEADER.size + length
    return out


def flip(segment: str, offset: int) -> None:
    with open(segment, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x01]))


def named(report: dict) -> set[int]:
    return {i for p in report["problems"] for i in p["checkpoints"]}


def check_after_repair(w: Written, report: dict) -> set[int]:
    """Every checkpoint the report does not name restores byte-exact; every one that does not
    restore is named and raises a snapstore error; a writer opens and commits, a reader opens.
    Returns the ids the store lists."""
    with snapstore.open(w.path, readonly=True) as s:
        listed = {c.id for c in s.checkpoints()}
        for i in sorted(listed):
            try:
                got = s.restore(i)
            except SnapstoreError:
                assert i in named(report), (i, report["problems"])
                continue
            assert got == w.data[i], i
    with snapstore.open(w.path, **w.options) as s:
        info = s.checkpoint({"after": b"repair"})
        assert s.restore(info.id) == {"after": b"repair"}
        w.data[info.id] = {"after": b"repair"}
    return listed


def damage(segment: str, how: str) -> None:
    if how == "truncated":
        os.truncate(segment, os.path.getsize(segment) - 3000)
    else:
        with open(segment, "r+b") as f:
            f.seek(30000)
            byte = f.read(1)[0]
            f.seek(30000)
            f.write(bytes([byte ^ 0x5A]))


@pytest.mark.parametrize("how", ["truncated", "flipped"])
def test_an_index_behind_damage_in_a_sealed_segment_is_replaced(tmp_path, how):
    w = Written(str(tmp_path / "s"))
    w.checkpoints(2)
    w.keep_index(str(tmp_path / "old-index"))
    later = w.checkpoints(4)
    w.put_index_back(str(tmp_path / "old-index"))
    damage(w.segments()[3], how)               # the chunk record of checkpoint 4
    with pytest.raises(CorruptionError, match="sealed segment"):
        snapstore.open(w.path, **OPTS)

    report = snapstore.repair(w.path)
    assert report["index_replaced"] and not report["ok"]
    kinds = {p["kind"] for p in report["problems"]}
    assert "damaged_record" in kinds and "index_kept" not in kinds
    listed = check_after_repair(w, report)
    # the valid checkpoints after the damage are back; the old index knew only 1 and 2
    assert {1, 2, later[0], later[2], later[3]} <= listed
    if how == "truncated":
        # its commit record went with the segment's end: gone, and its child says so
        assert later[1] not in listed
        assert any(p["kind"] == "missing_parent" and p["checkpoints"] == [later[2]]
                   for p in report["problems"])
    else:
        assert later[1] in named(report)

    again = snapstore.repair(w.path)        # the writer's checkpoint is in the log too
    assert again["checkpoints"] == report["checkpoints"] + 1
    assert named(again) == named(report)
    check_after_repair(w, again)


@pytest.mark.parametrize("cut", [100, 3000, 9000])
def test_the_checkpoints_building_on_lost_records_are_named(tmp_path, cut):
    """Incremental checkpoints: a later one reads the lost chunk through its delta manifest,
    or builds on a lost parent; the report names each of them, not only the first."""
    w = Written(str(tmp_path / "s"))
    w.checkpoints(2, scattered=True)
    w.keep_index(str(tmp_path / "old-index"))
    w.checkpoints(6, scattered=True)
    w.put_index_back(str(tmp_path / "old-index"))
    segment = w.segments()[3]
    os.truncate(segment, os.path.getsize(segment) - cut)

    newest = max(w.data)
    report = snapstore.repair(w.path)
    assert report["index_replaced"]
    listed = check_after_repair(w, report)
    unrestorable = set(named(report)) & listed
    assert unrestorable, report["problems"]      # the damage broke something: it is named
    assert newest in unrestorable          # down to the newest checkpoint of the chain


def test_a_kept_index_names_the_checkpoints_its_damaged_records_break(tmp_path):
    """Damage before where the index applied the log: the sound index knows more than the
    log and stays; the report names the checkpoint whose chunk record is damaged."""
    w = Written(str(tmp_path / "s"))
    ids = w.checkpoints(6)
    damage(w.segments()[1], "truncated")        # checkpoint 2's records

    report = snapstore.repair(w.path)
    assert not report["index_replaced"]
    assert ids[1] in named(report)
    assert any(p["kind"] == "damaged_chunk" and p["checkpoints"] == [ids[1]]
               for p in report["problems"])
    listed = check_after_repair(w, report)
    assert listed == set(ids)


def test_checkpoints_the_replaced_index_listed_and_the_log_lost_are_named(tmp_path):
    """An index that applied the log past its end (a power cut took the unsynced tail while
    the index reached the disk): the rebuilt index replaces it, and the report names the
    checkpoints only the lost tail held."""
    w = Written(str(tmp_path / "s"))
    ids = w.checkpoints(3)
    last = w.segments()[-1]
    os.truncate(last, os.path.getsize(last) - 40000)

    report = snapstore.repair(w.path)
    assert report["index_replaced"]
    lost = [p for p in report["problems"] if p["kind"] == "lost_checkpoints"]
    assert len(lost) == 1 and lost[0]["checkpoints"] == [ids[-1]]
    assert check_after_repair(w, report) == set(ids[:-1])
    # the id and the seq the lost checkpoint was given are never given again: a name the
    # application holds never comes to mean other bytes
    with snapstore.open(w.path, **OPTS) as s:
        info = s.checkpoint({"x": b"new"})
        assert info.id > ids[-1] + 1 and info.seq > 4    # check_after_repair's took one
        with pytest.raises(snapstore.errors.CheckpointNotFound):
            s.restore(ids[-1])


def test_a_deleted_checkpoint_is_not_reported_lost(tmp_path):
    """A delete the old index had not applied yet is no loss."""
    w = Written(str(tmp_path / "s"))
    ids = w.checkpoints(3)
    w.keep_index(str(tmp_path / "old-index"))
    with snapstore.open(w.path, **OPTS) as s:
        s.delete(ids[0])
    del w.data[ids[0]]
    ids += w.checkpoints(3)
    w.put_index_back(str(tmp_path / "old-index"))
    damage(w.segments()[-2], "truncated")       # sealed, past the old index's position

    report = snapstore.repair(w.path)
    assert report["index_replaced"]
    assert not any(p["kind"] == "lost_checkpoints" for p in report["problems"])
    assert ids[0] not in check_after_repair(w, report)


def test_damage_in_the_last_segment_past_a_stale_index_destroys_nothing(tmp_path):
    """The index is behind and a chunk record in the middle of the last segment is damaged,
    valid checkpoints after it: a kept index made the next writer's recovery take the damage
    for a torn tail and cut the segment there, silently destroying those checkpoints."""
    w = Written(str(tmp_path / "s"), segment_size=16 << 20)    # one segment
    w.checkpoints(2)
    w.keep_index(str(tmp_path / "old-index"))
    later = w.checkpoints(5)
    w.put_index_back(str(tmp_path / "old-index"))
    (segment,) = w.segments()
    chunks = [r for r in records(segment) if r[1] == fmt.REC_CHUNK]
    offset, _, length = chunks[3]           # checkpoint later[1]'s chunk
    flip(segment, offset + fmt.RECORD_HEADER.size + length // 2)
    size = os.path.getsize(segment)

    report = snapstore.repair(w.path)
    assert report["index_replaced"]
    assert named(report) == {later[1]}
    listed = check_after_repair(w, report)
    assert set(later) <= listed             # the ones after the damage are all there
    assert os.path.getsize(segment) > size  # appended to, never cut


def test_a_kept_index_reports_no_lost_parent_it_holds(tmp_path):
    """A damaged commit record in a sealed segment: the sound index, which holds that
    checkpoint, is kept; its child's parent is not lost, and the report does not say so."""
    w = Written(str(tmp_path / "s"))
    ids = w.checkpoints(6)
    segment = w.segments()[1]
    offset, _, length = [r for r in records(segment) if r[1] == fmt.REC_COMMIT][0]
    flip(segment, offset + fmt.RECORD_HEADER.size + length // 2)

    report = snapstore.repair(w.path)
    assert not report["index_replaced"]
    kinds = [p["kind"] for p in report["problems"]]
    assert "damaged_record" in kinds and "missing_parent" not in kinds
    assert check_after_repair(w, report) == set(ids)
    assert snapstore.repair(w.path)["checkpoints"] == len(ids) + 1


@pytest.mark.parametrize("how", ["chunk", "commit", "empty segment"])
def test_the_way_back_to_a_clean_store(tmp_path, how):
    """The README's recipe: repair, delete what it names, compact with threshold 1: verify
    (deep) and the next repair are clean, and the rest restores byte-exact."""
    w = Written(str(tmp_path / "s"))
    ids = w.checkpoints(6)
    segment = w.segments()[2]
    if how == "empty segment":
        os.truncate(segment, 0)
    else:
        kind = fmt.REC_CHUNK if how == "chunk" else fmt.REC_COMMIT
        offset, _, length = [r for r in records(segment) if r[1] == kind][0]
        flip(segment, offset + fmt.RECORD_HEADER.size + length // 2)

    report = snapstore.repair(w.path)
    assert not report["ok"]
    broken = named(report)
    with snapstore.open(w.path, **w.options) as s:
        if broken:
            s.delete_many(sorted(broken))
        s.compact(threshold=1.0)
        assert s.verify(deep=True)["ok"]
        for i in set(ids) - broken:
            assert s.restore(i) == w.data[i]
    assert snapstore.repair(w.path)["ok"]


def test_a_damaged_state_section_raises_no_false_alarm_when_the_index_is_kept(tmp_path):
    """Compaction removed segments and wrote a state section; one of its records is damaged.
    The rebuild lacks what the section described (the removed segments read as missing), but
    the sound index is kept and knows it all: the report names the damaged record only, and
    no checkpoint, and everything restores."""
    w = Written(str(tmp_path / "s"))
    ids = w.checkpoints(8)
    with snapstore.open(w.path, **w.options) as s:
        s.delete_many(ids[:5])
        assert s.compact(threshold=1.0)["segments_removed"]
    for i in ids[:5]:
        del w.data[i]
    section = [(segment, offset, length) for segment in w.segments()
               for offset, rtype, length in records(segment)
               if rtype == fmt.REC_STATE_CHECKPOINT]
    segment, offset, length = section[0]
    flip(segment, offset + fmt.RECORD_HEADER.size + length // 2)

    report = snapstore.repair(w.path)
    assert not report["index_replaced"]
    assert sorted(p["kind"] for p in report["problems"]) == ["damaged_record", "index_kept"]
    assert not named(report)
    assert check_after_repair(w, report) == set(ids[5:])


def test_children_of_a_deleted_parent_whose_record_is_lost_are_named(tmp_path):
    """The delete of checkpoint 1 re-parented 2 (merging 1's manifests into 2's); then 1's
    commit record was damaged and the index lost. Replayed, the delete finds no 1 and does
    nothing, so 2 still builds on 1 and cannot restore, nor can 3: both are named (a
    'deleted, so not lost' exemption hid exactly them)."""
    w = Written(str(tmp_path / "s"))
    ids = w.checkpoints(3, scattered=True)
    with snapstore.open(w.path, **w.options) as s:
        s.delete(ids[0])
    del w.data[ids[0]]
    commits = [(segment, r) for segment in w.segments() for r in records(segment)
               if r[1] == fmt.REC_COMMIT]
    segment, (offset, _, length) = commits[0]
    flip(segment, offset + fmt.RECORD_HEADER.size + length // 2)
    shutil.rmtree(os.path.join(w.path, "index"))

    report = snapstore.repair(w.path)
    assert {ids[1], ids[2]} <= named(report)
    assert any(p["kind"] == "missing_parent" for p in report["problems"])
    check_after_repair(w, report)


@pytest.mark.parametrize("scattered", [False, True])
def test_a_segment_of_another_store_is_never_taken_for_this_stores(tmp_path, scattered):
    """Regression (a helper's review): a segment of another store, with this store's segment
    number and valid checksums, in place of one of this store's. Reads refused it (its chunk
    records hold other chunks), verify said to repair, and repair rebuilt the index from it
    and reported no problem: the checkpoints its records describe then restored as the other
    store's bytes (and an incremental one over them as a mix of both), with no error. Repair
    now sees that the log describes them differently from the index while it describes the
    others alike, reports it and keeps the index; removing index/ and repairing again accepts
    the log as it is."""
    mine = Written(str(tmp_path / "mine"))
    theirs = Written(str(tmp_path / "theirs"), seed=2)
    ids = mine.checkpoints(4, scattered=scattered)
    theirs.checkpoints(4, scattered=scattered)
    foreign = theirs.segments()[1]
    shutil.copyfile(foreign, mine.segments()[1])
    report = snapstore.repair(mine.path)
    assert not report["ok"]
    disagree = [p for p in report["problems"] if p["kind"] == "log_disagrees"]
    assert len(disagree) == 1 and disagree[0]["checkpoints"]
    assert not report["index_replaced"]
    assert any(p["kind"] == "index_kept" for p in report["problems"])
    with snapstore.open(mine.path, readonly=True) as s:
        for cid in ids:                     # never another store's bytes
            try:
                got = s.restore(cid)
            except CorruptionError:
                continue
            assert got == mine.data[cid]
    assert snapstore.repair(mine.path)["index_replaced"] is False     # the same, again
    shutil.rmtree(os.path.join(mine.path, "index"))       # the user accepts the log
    report = snapstore.repair(mine.path)
    assert report["index_replaced"]
    assert not any(p["kind"] == "log_disagrees" for p in report["problems"])


def test_an_index_of_another_store_is_replaced_and_a_stale_one_agrees(tmp_path):
    """The other side of the check above: an index copied from another store describes no
    checkpoint of this log alike (index-confined damage: repair replaces it, no problem), and
    an index of this store from before later checkpoints and deletes describes every
    checkpoint they share alike."""
    mine = Written(str(tmp_path / "mine"))
    theirs = Written(str(tmp_path / "theirs"), seed=2)
    mine.checkpoints(3, scattered=True)
    theirs.checkpoints(3, scattered=True)
    mine.keep_index(str(tmp_path / "stale"))
    ids = mine.checkpoints(2, scattered=True)
    with snapstore.open(mine.path, **OPTS) as s:
        s.delete(min(mine.data))
    del mine.data[min(mine.data)]
    index = os.path.join(mine.path, "index")
    for replacement in (os.path.join(theirs.path, "index"), str(tmp_path / "stale")):
        shutil.rmtree(index)
        shutil.copytree(replacement, index)
        report = snapstore.repair(mine.path)
        assert report["ok"], report["problems"]
        assert report["index_replaced"]
        with snapstore.open(mine.path, readonly=True) as s:
            assert {c.id for c in s.checkpoints()} == set(mine.data)
            for cid, want in mine.data.items():
                assert s.restore(cid) == want
    assert ids
