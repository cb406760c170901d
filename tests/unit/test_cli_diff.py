"""`snapstore diff` through the real console script: byte ranges, the content shortcut, and
the per-tensor table (when snapstore.tensors can list the checkpoints' tensors)."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import snapstore
from cli_runner import cli_error, cli_json, cli_ok


@pytest.fixture
def arrays_store(tmp_path):
    """Checkpoints 1 and 2 of arrays w (float32 300x1000) and k (int64 5000): in 2, w[7, 3]
    += 0.25, w[299, 999] = NaN, k[4999] = -3; v (uint8 64 KiB) unchanged."""
    path = str(tmp_path / "s")
    rng = np.random.default_rng(0)
    w = rng.standard_normal((300, 1000)).astype(np.float32)
    k = np.arange(5000, dtype=np.int64)
    v = np.zeros(1 << 16, np.uint8)
    with snapstore.open(path, durability="none") as s:
        snapstore.save_arrays(s, {"w": w, "k": k, "v": v})
        w2, k2 = w.copy(), k.copy()
        w2[7, 3] += 0.25
        w2[299, 999] = np.nan
        k2[4999] = -3
        snapstore.save_arrays(s, {"w": w2, "k": k2, "v": v})
    return path


def test_diff_json_and_text_bytes(arrays_store):
    d = cli_json("-s", arrays_store, "diff", "1", "2", "--gap", "0")
    assert d["from"] == 1 and d["to"] == 2
    by = {b["name"]: b for b in d["buffers"]}
    assert all(b["status"] in ("changed", "unchanged") for b in by.values())
    changed = [b for b in by.values() if b["status"] == "changed"]
    assert sum(len(b["ranges"]) for b in changed) >= 3
    assert d["changed_bytes"] == sum(b["changed_bytes"] for b in by.values()) > 0
    out = cli_ok("-s", arrays_store, "diff", "1", "2").stdout
    assert out.startswith("diff 1 -> 2\n") and "bytes differ" in out
    same = cli_json("-s", arrays_store, "diff", "2", "2")
    assert same["changed_bytes"] == 0
    assert {b["status"] for b in same["buffers"]} == {"unchanged"}


def test_diff_errors(arrays_store):
    cli_error(2, "-s", arrays_store, "diff", "1", "2", "--window", "1", needles=["--window"])
    cli_error(2, "-s", arrays_store, "diff", "1", "2", "--max-tensors", "-1",
              needles=["--max-tensors"])
    cli_error(2, "-s", arrays_store, "diff", "1", "9", needles=["no checkpoint 9"])


@pytest.mark.skipif(importlib.util.find_spec("snapstore.tensors") is None,
                    reason="needs snapstore.tensors (tensor catalogue)")
def test_diff_per_tensor(arrays_store):
    d = cli_json("-s", arrays_store, "diff", "1", "2")
    t = {e["name"].rsplit("/", 1)[-1]: e for e in d["tensors"]}
    assert t["w"]["changed_elements"] == 2 and t["w"]["elements"] == 300000
    assert t["w"]["max_abs_diff"] == "nan" and t["w"]["shape"] == [300, 1000]
    assert t["k"]["changed_elements"] == 1 and t["k"]["max_abs_diff"] == 4999 + 3
    assert t["v"]["status"] == "unchanged" and t["v"]["changed_elements"] == 0
    out = cli_ok("-s", arrays_store, "diff", "1", "2").stdout
    assert "tensors: 2 of 3 differ" in out and "1 / 5,000" in out and "5002" in out
