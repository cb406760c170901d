"""torch.distributed.checkpoint over an S3 store (SnapstoreWriter("s3://...")) against the
real server: 2 ranks in separate processes (gloo), each with a cache directory of its own (a
machine of its own), stage their shards in parallel and the coordinator commits ONE
checkpoint; the second save, with 1% of the rows changed, is incremental on every rank; every
rank loads both saves byte-exact from an empty cache, and so does a process with no process
group at all.

The ranks run in tests/unit/dcp_rank.py (its "save" scenario), as in test_dcp_ranks.py.
"""
from __future__ import annotations

import os
import sys

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

import snapstore  # noqa: E402
import snapstore.torch as st  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
UNIT = os.path.join(REPO, "tests", "unit")
sys.path.insert(0, UNIT)
import dcp_rank  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


launch = dcp_rank.launch


def test_two_ranks_save_incrementally_and_load_from_empty_caches(s3, tmp_path):
    url = f"s3://{s3.bucket}/{s3.prefix.rstrip('/')}"
    out = launch(tmp_path, [{"name": "save", "scenario": "save", "world": 2, "store": url,
                             "cache_root": str(tmp_path / "caches")}])
    step = out["save"]
    # every rank exits 0 only when its loads of v1 and v2 (each from an empty cache) were
    # byte-exact
    assert step["exits"] == [0, 0], out["stderr"][-4000:]
    assert {f["what"] for f in step["facts"]} == {"saved", "loaded"}
    saved = next(f for f in step["facts"] if f["what"] == "saved")
    first, second = saved["first"], saved["second"]
    assert saved["visible"] == {"checkpoints": [[1, "v1"], [2, "v2"]], "streams": ["dcp"]}
    for info in (first, second):
        assert set(info["parts"]) == {"rank0", "rank1", "metadata"}
        assert {"item/model.w1", f"item/model.w1@{dcp_rank.ROWS // 2},0", "item/own.rank0",
                "item/own.rank1", "dcp/metadata"} <= set(info["buffers"])
    assert (first["kind"], second["kind"], second["parent"]) == ("full", "incremental", 1)
    # random float32 weights: as byte planes only their exponents compress (format 4: 17%)
    assert 0.7 * first["total"] < first["bytes_new"] < 0.9 * first["total"], first
    changed = len(dcp_rank.CHANGED_ROWS) * 4096          # 1% of model.w1's rows, a page each
    assert changed // 2 < second["bytes_new"] < 0.03 * second["total"], second
    # a process with no process group, from an empty cache
    for version in (1, 2):
        target = dcp_rank.load_target(2)
        dcp.load(target, checkpoint_id=f"v{version}", storage_reader=st.SnapstoreReader(
            url, cache_dir=str(tmp_path / f"single-{version}")))
        dcp_rank.check_loaded(target, version, 2)
    with snapstore.open(url, cache_dir=str(tmp_path / "look")) as s:
        assert [snapstore.group_parts(c).keys() for c in s.checkpoints("dcp")] == \
            [{"rank0", "rank1", "metadata"}] * 2
