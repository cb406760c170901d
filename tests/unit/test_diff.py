"""snapstore.diff: exact differing byte runs (numpy and pure Python agree), windowed buffer
comparison independent of the window, and checkpoint diffs through the public Store API."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# ---- content shortcut, ranged reads, tensors ----------------------------------------------------

def _reference_report(full_a: dict, full_b: dict, gap: int) -> dict:
    """{name: (status, changed_bytes, ranges)} from whole restored buffers, byte by byte."""
    out = {}
    for name in dict.fromkeys(list(full_a) + list(full_b)):
        if name not in full_b:
            out[name] = ("removed", len(full_a[name]), [])
            continue
        if name not in full_a:
            out[name] = ("added", len(full_b[name]), [])
            continue
        x, y = full_a[name], full_b[name]
        runs, changed = _runs_reference(x[:len(y)], y[:len(x)])
        if len(x) != len(y):
            runs.append((min(len(x), len(y)), max(len(x), len(y))))
            changed += abs(len(x) - len(y))
        status = "resized" if len(x) != len(y) else "changed" if changed else "unchanged"
        out[name] = (status, changed, [[s, e - s] for s, e in diff.coalesce(runs, gap)])
    return out


@pytest.mark.parametrize("seed", range(8))
def test_diff_checkpoints_matches_whole_restores(tmp_path, seed):
    """Chains, full rewrites, CDC and page chunking, resizes, identical checkpoints: the diff
    (which reads only ranges whose chunks differ) equals a byte-by-byte diff of restores."""
    rng = random.Random(seed)
    opts = rng.choice([dict(), dict(chunking="cdc", cdc_sizes=(512, 2048, 8192)),
                       dict(page_size=512, chunk_size=1024, max_chain=2)])
    with snapstore.open(str(tmp_path / "s"), durability="none", **opts) as s:
        bufs = {"x": bytearray(rng.randbytes(rng.randrange(1, 60000))),
                "y": bytearray(rng.randbytes(rng.randrange(0, 5000)))}
        for _ in range(5):
            for buf in bufs.values():
                for _ in range(rng.randrange(0, 6)):
                    if buf:
                        i = rng.randrange(len(buf))
                        k = rng.randrange(1, 300)
                        buf[i:i + k] = rng.randbytes(len(buf[i:i + k]))
            if rng.random() < 0.3:
                bufs["x"] += rng.randbytes(rng.randrange(1, 3000))
            s.checkpoint({k: bytes(v) for k, v in bufs.items()})
        ids = [c.id for c in s.checkpoints()]
        for i, j in [(ids[0], ids[-1]), (ids[1], ids[2]), (ids[-1], ids[0]), (ids[2], ids[2])]:
            gap = rng.choice([0, 16, 1000])
            report = diff.diff_checkpoints(s, s.get(i), s.get(j), gap=gap,
                                           window=rng.choice([4096, 1 << 20]))
            expect = _reference_report(s.restore(i), s.restore(j), gap)
            got = {e["name"]: (e["status"], e["changed_bytes"], e["ranges"])
                   for e in report["buffers"]}
            assert got == expect


def test_unshared_ranges():
    A, B = b"A" * 32, b"B" * 32
    la = [(0, 10, A, 0), (10, 10, A, 10), (20, 5, B, 0)]
    assert diff.unshared_ranges(la, la, 25) == []
    lb = [(0, 20, A, 0), (20, 5, A, 20)]                    # same chunk bytes, split otherwise
    assert diff.unshared_ranges(la, lb, 25) == [(20, 25)]
    lc = [(0, 5, A, 1), (5, 20, A, 5)]                      # same chunk, shifted: differs
    assert diff.unshared_ranges(la, lc, 25) == [(0, 5), (20, 25)]
    assert diff.unshared_ranges(la, [(0, 4, A, 0)], 25) == [(4, 25)]    # not covering
    assert diff.unshared_ranges(la, lb, 0) == []


def test_store_layout_and_read_ranges(tmp_path):
    with _store(str(tmp_path / "s")) as s:
        full = s.restore(2)["w"]
        layout = s.layout(2, "w")
        assert layout[0][0] == 0 and sum(e[1] for e in layout) == 40000
        assert all(x[0] + x[1] == y[0] for x, y in zip(layout, layout[1:]))
        # only the two changed pages (0 and 7) map to other chunk bytes
        assert diff.unshared_ranges(s.layout(1, "w"), layout, 40000) == [(0, 4096),
                                                                         (28672, 32768)]
        ranges = [(39990, 10), (0, 5), (100, 0), (30000, 3)]
        assert s.read_ranges(2, "w", ranges) == full[39990:] + full[:5] + full[30000:30003]
        out = bytearray(18)
        assert s.read_ranges(2, "w", ranges, out) is out and bytes(out) == full[39990:] + \
            full[:5] + full[30000:30003]
        assert s.read_ranges(2, "w", []) == b""
        with pytest.raises(errors.InvalidArgumentError, match="exceeds"):
            s.read_ranges(2, "w", [(39990, 11)])
        with pytest.raises(errors.InvalidArgumentError):
            s.read_ranges(2, "w", [(-1, 1)])
        with pytest.raises(errors.InvalidArgumentTypeError):
            s.read_ranges(2, "w", [5])
        with pytest.raises(errors.InvalidArgumentTypeError):
            s.read_ranges(2, "w", 5)
        with pytest.raises(errors.InvalidArgumentError, match="out has"):
            s.read_ranges(2, "w", [(0, 4)], bytearray(5))
        with pytest.raises(errors.InvalidArgumentTypeError):
            s.read_ranges(2, "w", [(0, 4)], b"1234")
        with pytest.raises(errors.CheckpointNotFound):
            s.layout(2, "nope")
        with pytest.raises(errors.CheckpointNotFound):
            s.read_ranges(9, "w", [])
    with pytest.raises(errors.StoreClosedError):
        s.layout(2, "w")


def test_diff_reads_only_the_changed_chunks(tmp_path, monkeypatch):
    with _store(str(tmp_path / "s")) as s:
        asked = []
        real = s.read_ranges
        monkeypatch.setattr(s, "read_ranges",
                            lambda i, n, r, out=None: asked.extend(r) or real(i, n, r, out))
        report = diff.diff_checkpoints(s, s.get(1), s.get(2), ["w"])
        assert report["buffers"][0]["ranges"] == [[100, 4], [30000, 1]]
        assert 0 < sum(n for _, n in asked) <= 2 * 2 * 4096    # two changed pages, both sides
        asked.clear()
        assert diff.diff_checkpoints(s, s.get(2), s.get(2))["changed_bytes"] == 0
        assert asked == []


# ---- element-wise tensor diffs ------------------------------------------------------------------

_STRUCT = {"float16": "e", "float32": "f", "float64": "d", "int8": "b", "uint8": "B",
           "int16": "h", "uint16": "H", "int32": "i", "uint32": "I", "int64": "q",
           "uint64": "Q", "bool": "?", "bfloat16": "H"}


def _element_reference(a: bytes, b: bytes, dtype: str):
    """(changed, max abs diff) element by element with struct and Python numbers."""
    import math
    import struct
    code = _STRUCT[dtype]
    size = struct.calcsize(code)
    changed, diffs = 0, []
    for i in range(0, len(a), size):
        if a[i:i + size] == b[i:i + size]:
            continue
        changed += 1
        x, y = struct.unpack("<" + code, a[i:i + size])[0], struct.unpack("<" + code, b[i:i + size])[0]
        if dtype == "bfloat16":
            x, y = (struct.unpack("<f", struct.pack("<I", v << 16))[0] for v in (x, y))
        if isinstance(x, float) and (math.isnan(x) or math.isnan(y)):
            diffs.append(math.nan)
        else:
            diffs.append(abs(int(x) - int(y)) if code in "bBhHiIqQ?" and dtype != "bfloat16"
                         else abs(float(x) - float(y)))
    if not changed:
        return 0, 0.0 if dtype.startswith(("float", "bfloat")) else 0
    return changed, (math.nan if any(d != d for d in diffs) else max(diffs))


def _same(x, y):
    return (x != x and y != y) or (x == y and type(x) is type(y))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(_STRUCT)), st.data())
def test_element_diff_matches_reference(dtype, d):
    import struct
    size = struct.calcsize(_STRUCT[dtype])
    n = d.draw(st.integers(0, 40))
    special = [b"\x00" * size, b"\xff" * size, b"\x80" + b"\x00" * (size - 1),
               b"\x00" * (size - 1) + b"\x80", b"\x00" * (size - 1) + b"\x7f",
               (b"\x00" * (size - 2) + b"\xc0\x7f") if size >= 2 else b"\x01"]   # NaN-ish bits
    elem = st.one_of(st.binary(min_size=size, max_size=size), st.sampled_from(special))
    if dtype == "bool":
        elem = st.sampled_from([b"\x00", b"\x01"])
    a = b"".join(d.draw(elem) for _ in range(n))
    b = bytearray(a)
    for i in range(n):
        if d.draw(st.booleans()):
            b[i * size:(i + 1) * size] = d.draw(elem)
    got = diff.element_diff(a, bytes(b), dtype)
    want = _element_reference(a, bytes(b), dtype)
    assert got[0] == want[0] and _same(got[1], want[1]), (got, want)


def test_element_diff_edges():
    import math
    import numpy as np
    x = np.array([1.0, np.nan, 0.0, np.inf], np.float32)
    assert diff.element_diff(x.tobytes(), x.tobytes(), "float32") == (0, 0.0)
    y = x.copy()
    y[2] = -0.0                                              # bits differ, value equal
    assert diff.element_diff(x.tobytes(), y.tobytes(), "torch.float32") == (1, 0.0)
    y[1] = 5
    c, m = diff.element_diff(x.tobytes(), y.tobytes(), "float32")
    assert c == 2 and math.isnan(m)
    big = np.array([-2**63, 2**63 - 1], np.int64)
    assert diff.element_diff(big.tobytes(), big[::-1].tobytes(), "int64") == (2, 2**64 - 1)
    u = np.array([0, 2**64 - 1], np.uint64)
    assert diff.element_diff(u.tobytes(), u[::-1].tobytes(), np.uint64) == (2, 2**64 - 1)
    z = np.array([1 + 1j], np.complex64)
    assert diff.element_diff(z.tobytes(), (z * 2).tobytes(), "complex64") == (1, abs(1 + 1j))
    assert diff.element_diff(b"\x01\x02\x03", b"\x01\x00\x03", "float8_e4m3fn", 1) == (1, None)
    with pytest.raises(errors.InvalidArgumentError):
        diff.element_diff(b"\x01\x02", b"\x01\x00", "float8_e4m3fn")
    with pytest.raises(errors.InvalidArgumentError):
        diff.element_diff(b"\x01\x02\x03", b"\x01\x00\x03", "float32")


class _Entry:
    def __init__(self, name, dtype, shape, buffer, offset, nbytes):
        self.name, self.dtype, self.shape = name, dtype, shape
        self.buffer, self.offset, self.nbytes = buffer, offset, nbytes


def test_diff_checkpoints_per_tensor(tmp_path):
    import numpy as np
    rng = np.random.default_rng(0)
    w = rng.standard_normal(20000).astype(np.float32)        # 80000 bytes at 0 of "p"
    k = rng.integers(-5, 5, 3001).astype(np.int16)           # 6002 bytes at 80000 of "p"
    h = rng.standard_normal(100).astype(np.float64)          # buffer "h", moved between sides
    with snapstore.open(str(tmp_path / "s"), durability="none") as s:
        s.checkpoint({"p": w.tobytes() + k.tobytes(), "h": h.tobytes()})
        w2, k2, h2 = w.copy(), k.copy(), h.copy()
        w2[7] += 0.5
        w2[19999] = np.nan
        k2[3000] = 100
        h2[3] -= 2
        s.checkpoint({"p": w2.tobytes() + k2.tobytes(), "h2": bytes(8) + h2.tobytes()})
        cat_a = [_Entry("w", "float32", (100, 200), "p", 0, 80000),
                 _Entry("k", "torch.int16", (3001,), "p", 80000, 6002),
                 _Entry("h", "float64", (100,), "h", 0, 800),
                 _Entry("gone", "float32", (2,), "p", 0, 8),
                 _Entry("re", "float32", (2,), "p", 0, 8)]
        cat_b = [_Entry("w", "float32", (100, 200), "p", 0, 80000),
                 _Entry("k", "torch.int16", (3001,), "p", 80000, 6002),
                 _Entry("h", "float64", (100,), "h2", 8, 800),
                 _Entry("re", "float32", (1, 2), "p", 0, 8),
                 _Entry("new", "int8", (4,), "p", 0, 4)]
        report = diff.diff_checkpoints(s, s.get(1), s.get(2), tensors=(cat_a, cat_b))
    t = {e["name"]: e for e in report["tensors"]}
    assert list(t) == ["w", "k", "h", "gone", "re", "new"]
    assert t["w"]["status"] == "changed" and t["w"]["changed_elements"] == 2
    assert t["w"]["elements"] == 20000 and t["w"]["shape"] == [100, 200]
    assert t["w"]["max_abs_diff"] != t["w"]["max_abs_diff"]            # NaN
    assert t["k"] == {"name": "k", "dtype": "torch.int16", "shape": [3001], "elements": 3001,
                      "status": "changed", "changed_elements": 1,
                      "max_abs_diff": abs(100 - int(k[3000]))}
    assert t["h"]["changed_elements"] == 1 and t["h"]["max_abs_diff"] == 2.0
    assert t["gone"]["status"] == "removed" and t["new"]["status"] == "added"
    assert t["re"]["status"] == "retyped" and t["re"]["shape_to"] == [1, 2]
    by = {e["name"]: e for e in report["buffers"]}
    assert by["p"]["changed_bytes"] > 0 and by["h"]["status"] == "removed"


def test_diff_per_tensor_unchanged_reads_nothing(tmp_path, monkeypatch):
    with snapstore.open(str(tmp_path / "s"), durability="none") as s:
        s.checkpoint({"p": bytes(range(256)) * 64})
        s.checkpoint({"p": bytes(range(256)) * 64})
        cat = [_Entry("t", "uint8", (16384,), "p", 0, 16384)]
        monkeypatch.setattr(s, "read_ranges", None)          # any read would fail
        report = diff.diff_checkpoints(s, s.get(1), s.get(2), tensors=(cat, cat))
    assert report["tensors"][0]["status"] == "unchanged"
    assert report["tensors"][0]["changed_elements"] == 0


def test_diff_checkpoints_names_checkpoints_any_way_and_refuses_bad_arguments(tmp_path):
    """a and b may be CheckpointInfo or any name store.get takes; bad arguments are
    snapstore.errors exceptions (they were KeyError, TypeError, AttributeError), also on a
    closed store."""
    s = snapstore.open(tmp_path / "s")
    a = s.checkpoint({"b": b"x" * 5000}, stream="d")
    b = s.checkpoint({"b": b"y" * 5000, "c": b"z"}, stream="d")
    s.tag(a.id, "old")
    by_info = diff.diff_checkpoints(s, a, b)
    assert diff.diff_checkpoints(s, a.id, "latest:d") == by_info
    assert diff.diff_checkpoints(s, "old", b.id) == by_info
    assert [e["name"] for e in diff.diff_checkpoints(s, a, b, ["c", "b", "c"])["buffers"]] \
        == ["c", "b"]
    assert diff.diff_checkpoints(s, a, b, [])["buffers"] == []
    with pytest.raises(errors.CheckpointNotFound):
        diff.diff_checkpoints(s, a, b, ["zz"])
    with pytest.raises(errors.CheckpointNotFound):
        diff.diff_checkpoints(s, a, 99)
    for bad in ("b", b"b", 5, [1], [None]):
        with pytest.raises(errors.InvalidArgumentTypeError):
            diff.diff_checkpoints(s, a, b, bad)
    for gap in ("x", -1, 1.5, True, None):
        with pytest.raises(errors.InvalidArgumentError):
            diff.diff_checkpoints(s, a, b, gap=gap)
        with pytest.raises(errors.InvalidArgumentError):
            diff.diff_buffer(lambda o, n: b"", lambda o, n: b"", 0, 0, gap=gap)
    with pytest.raises(errors.InvalidArgumentTypeError):
        diff.diff_checkpoints(s, None, b)
    s.close()
    with pytest.raises(errors.StoreClosedError):
        diff.diff_checkpoints(s, a, b)
