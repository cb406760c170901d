"""snapstore.diff: exact differing byte runs (numpy and pure Python agree), windowed buffer
comparison independent of the window, and checkpoint diffs through the public Store API."""
from __future__ import annotations

import random

import pytest

import snapstore
from snapstore import diff, errors


def test_coalesce():
    assert diff.coalesce([], 16) == []
    assert diff.coalesce([(0, 1), (1, 2), (5, 6)], 0) == [(0, 2), (5, 6)]
    assert diff.coalesce([(0, 1), (5, 6), (30, 31)], 16) == [(0, 6), (30, 31)]


def _runs_reference(a, b, base=0):
    """Exact differing (start, end) runs byte by byte, and their byte count."""
    runs = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            if runs and runs[-1][1] == base + i:
                runs[-1][1] += 1
            else:
                runs.append([base + i, base + i + 1])
    return [tuple(r) for r in runs], sum(e - s for s, e in runs)


@pytest.mark.parametrize("seed", range(20))
def test_diff_bytes_matches_reference(seed):
    # was: numpy and pure-Python paths agree; both are replaced by the C kernel
    rng = random.Random(seed)
    n = rng.choice([1, 15, 16, 17, 4095, 4096, 9000])
    a = bytearray(rng.randbytes(n))
    b = bytearray(a)
    for _ in range(rng.randrange(0, 12)):
        i = rng.randrange(n)
        for j in range(i, min(n, i + rng.randrange(1, 40))):
            b[j] = rng.randrange(256)
    runs, changed = diff.diff_bytes(bytes(a), bytes(b), 100)
    assert (runs, changed) == _runs_reference(a, b, 100)
    assert sum(e - s for s, e in runs) == changed
    for s, e in runs:
        assert all(a[i - 100] != b[i - 100] for i in range(s, e))
    with pytest.raises(errors.InvalidArgumentError):
        diff.diff_bytes(b"a", b"ab")


def test_diff_buffer_resized():
    a, b = b"abcdef", b"abXdefgh"
    r = diff.diff_buffer(lambda o, n: a[o:o + n], lambda o, n: b[o:o + n], len(a), len(b),
                        gap=0, window=4)
    assert r == {"status": "resized", "changed_bytes": 3, "ranges": [[2, 1], [6, 2]]}


@pytest.mark.parametrize("seed", range(10))
def test_diff_buffer_windows_equal_whole_diff(seed):
    rng = random.Random(seed)
    n = rng.randrange(1, 20000)
    a = rng.randbytes(n)
    b = bytearray(a)
    for _ in range(rng.randrange(0, 30)):
        i = rng.randrange(n)
        k = min(rng.randrange(1, 50), n - i)
        b[i:i + k] = rng.randbytes(k)
    b = bytes(b)
    gap = rng.choice([0, 1, 16, 300])
    runs, changed = diff.diff_bytes(a, b)
    expect = [[s, e - s] for s, e in diff.coalesce(runs, gap)]
    for window in (1, 7, 4096, 1 << 20):
        r = diff.diff_buffer(lambda o, k: a[o:o + k], lambda o, k: b[o:o + k], n, n,
                            gap=gap, window=window)
        assert r["ranges"] == expect and r["changed_bytes"] == changed


def _store(path):
    """Checkpoints 1 {w: 40000 random bytes, gone: 300} and 2 {w: 4 bytes changed at 100 and
    one at 30000, new: 5 bytes}."""
    w = bytearray(random.Random(3).randbytes(40000))
    s = snapstore.open(path, durability="none")
    s.checkpoint({"w": w, "gone": bytes(300)})
    w[100:104] = bytes(x ^ 1 for x in w[100:104])
    w[30000] ^= 0x80
    s.checkpoint({"w": w, "new": b"12345"})
    return s


def test_diff_checkpoints(tmp_path):
    with _store(str(tmp_path / "s")) as s:
        a, b = s.get(1), s.get(2)
        assert diff.select_buffers(a, b) == ["w", "gone", "new"]
        assert diff.bytes_to_compare(a, b, ["w", "gone", "new"]) == 40000
        seen = []
        report = diff.diff_checkpoints(s, a, b, gap=0, window=4096, on_progress=seen.append)
        # progress covers compared bytes and bytes proven equal by their chunks alike
        assert sum(seen) == 40000 and max(seen) == 4096
    assert report["from"] == 1 and report["to"] == 2 and report["gap"] == 0
    by = {e["name"]: e for e in report["buffers"]}
    assert list(by) == ["w", "gone", "new"]
    assert by["w"] == {"name": "w", "size_from": 40000, "size_to": 40000, "status": "changed",
                       "changed_bytes": 5, "ranges": [[100, 4], [30000, 1]]}
    assert by["gone"] == {"name": "gone", "size_from": 300, "size_to": None,
                          "status": "removed", "changed_bytes": 300, "ranges": []}
    assert by["new"]["status"] == "added" and by["new"]["changed_bytes"] == 5
    assert report["changed_bytes"] == 5 + 300 + 5


def test_diff_checkpoints_of_some_buffers_read_only(tmp_path):
    path = str(tmp_path / "s")
    _store(path).close()
    with snapstore.open(path, readonly=True) as s:
        a, b = s.get(1), s.get(2)
        names = diff.select_buffers(a, b, ["new", "w"])
        assert names == ["w", "new"]                  # the checkpoints' order, not the filter's
        report = diff.diff_checkpoints(s, a, b, names)
        assert [e["name"] for e in report["buffers"]] == ["w", "new"]
        assert report["buffers"][0]["ranges"] == [[100, 4], [30000, 1]]
        same = diff.diff_checkpoints(s, b, b)
        assert same["changed_bytes"] == 0
        assert {e["status"] for e in same["buffers"]} == {"unchanged"}
        with pytest.raises(errors.CheckpointNotFound, match="zzz"):
            diff.select_buffers(a, b, ["w", "zzz"])
