"""A log that lost what the index applied of it, and files in segments/ and writers/ that are
not the store's (regressions of a helper's damage hunt):

- a last segment cut inside its final commit record: shallow verify said "ok" while every
  writer's open refused the store ("ends before the position the index has applied");
- a stray "7.seg" (or "٣.seg") was listed as segment 7, so verify passed and writers failed
  to open with an error naming no file, and a stray "1.seg" beside segment 1's file listed
  segment 1 twice (repair then reported a phantom incomplete batch);
- a name of non-ASCII digits ("²", "².seg") made int() raise a raw ValueError in every open,
  verify and repair.
"""
from __future__ import annotations

import os

import pytest

import snapstore
from snapstore.engine import format as fmt
from snapstore.engine.backends import segment_name
from snapstore.engine.backends.base import segment_number
from snapstore.engine.logowners import log_number
from snapstore.engine.wal import scan
from snapstore.errors import CorruptionError


def _two_checkpoints(path: str) -> tuple[bytes, int]:
    """The first checkpoint's bytes, and the offset of the last commit record."""
    with snapstore.open(path, durability="none") as s:
        first = os.urandom(5000)
        s.checkpoint({"x": first}, stream="a")
        s.checkpoint({"x": os.urandom(5100)}, stream="a")
        number = s.backend.list()[-1]
        commits = [r.offset for r in scan(s.backend, number, 0)
                   if not isinstance(r, tuple) and r.rtype == fmt.REC_COMMIT]
    return first, commits[-1]


def _last_segment(path: str) -> str:
    seg_dir = os.path.join(path, "segments")
    return os.path.join(seg_dir, sorted(os.listdir(seg_dir))[-1])


@pytest.mark.parametrize("deep", [False, True])
def test_verify_reports_a_log_that_ends_before_what_the_index_applied(tmp_path, deep):
    path = str(tmp_path / "s")
    first, last_commit = _two_checkpoints(path)
    seg = _last_segment(path)
    with open(seg, "r+b") as f:                    # cut inside the last commit record
        f.truncate(last_commit + fmt.RECORD_HEADER.size + 10)
    with snapstore.open(path, readonly=True) as r:
        report = r.verify(deep=deep)
        assert not report["ok"]
        lost = [p for p in report["problems"] if p["kind"] == "lost_tail"]
        assert len(lost) == 1 and "acknowledged records were lost" in lost[0]["message"]
        assert lost[0]["segment"] == os.path.basename(seg)
        assert "snapstore repair" in report["hint"]
        assert r.restore(1)["x"] == first
    with pytest.raises(CorruptionError, match="ends before the position the index"):
        snapstore.open(path)
    snapstore.repair(path)
    with snapstore.open(path) as w:                 # repaired: a writer opens again
        assert w.restore(1)["x"] == first
        assert w.verify(deep=True)["ok"]


def test_verify_reports_a_missing_segment_the_index_applied_a_log_into(tmp_path):
    path = str(tmp_path / "s")
    with snapstore.open(path, durability="none", segment_size=1 << 16) as s:
        for _ in range(3):
            s.checkpoint({"x": os.urandom(40_000)}, stream="a")
        s.checkpoint({"x": b"tiny"}, stream="b")   # the last segment: only small records
    seg = _last_segment(path)
    os.unlink(seg)
    with snapstore.open(path, readonly=True) as r:
        report = r.verify()
        kinds = [p["kind"] for p in report["problems"]]
        assert "lost_tail" in kinds, report
        assert any("that segment is missing" in p["message"] for p in report["problems"])


@pytest.mark.parametrize("stray", ["7.seg", "\u0663.seg", "\u00b2.seg", "1.seg", "01.seg",
                                   "0000000000000001.seg.tmp"])
def test_a_stray_file_in_segments_is_not_a_segment(tmp_path, stray):
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        data = os.urandom(30_000)
        s.checkpoint({"x": data}, stream="a")
    with open(os.path.join(path, "segments", stray), "wb"):
        pass
    with snapstore.open(path) as s:                 # a writer opens (recovers its log)
        assert s.restore(1)["x"] == data
        assert s.backend.list() == sorted(set(s.backend.list()))     # each segment once
        assert all(segment_number(segment_name(n)) == n for n in s.backend.list())
        assert s.verify(deep=True)["ok"]
        s.checkpoint({"x": data[:10]}, stream="a")
    assert snapstore.repair(path)["ok"]
    with snapstore.open(path) as s:
        assert s.restore(1)["x"] == data and s.backend.list() == [1]


@pytest.mark.parametrize("stray", ["\u00b2", "07", "+3", " 3", "3 "])
def test_a_stray_file_in_writers_is_no_log(tmp_path, stray):
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"one"}, stream="a")
    with open(os.path.join(path, "writers", stray), "wb"):
        pass
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"two"}, stream="a")
        assert s.verify(deep=True)["ok"]
    assert snapstore.repair(path)["ok"]
    with snapstore.open(path) as s:
        assert s.restore(2)["x"] == b"two"


def test_the_name_parsers_take_exactly_the_names_the_store_writes():
    for n in (0, 1, 7, 10**15):
        assert segment_number(segment_name(n)) == n
        assert log_number(str(n)) == n
    for name in ("7.seg", "\u00b2.seg", "0000000000000001.seg.tmp", ".seg", "x.seg", None, 7):
        assert segment_number(name) is None
    for name in ("\u00b2", "07", "", "-1", "+3", "1.5", ".choosing", "\u0663"):
        assert log_number(name) is None
