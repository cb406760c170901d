"""`snapstore compact` (issue 15): the headline is what the store occupies (segments + index),
the index shrinks, and --max-garbage / --shrink-index reach compact()."""
from __future__ import annotations

import os
import random

from cli_runner import cli_error, cli_json, cli_ok

import snapstore
from snapstore.engine import format as fmt


def _store_bytes(path: str) -> int:
    total = 0
    for sub in (fmt.SEGMENTS_DIR, fmt.INDEX_DIR):
        d = os.path.join(path, sub)
        total += sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d))
    return total


def _churned(path: str) -> None:
    rng = random.Random(4)
    with snapstore.open(path, durability="none") as s:
        for i in range(120):
            s.checkpoint({"b": rng.randbytes(16 << 10)}, stream="abc"[i % 3])
        for stream in "abc":
            s.retain(stream, keep_last=2, prune=False)   # compact is what is tested


def test_compact_headline_is_segments_plus_index(tmp_path):
    path = str(tmp_path / "s")
    _churned(path)
    before = _store_bytes(path)
    out = cli_ok("-s", path, "compact").stdout
    head = out.splitlines()[0]
    assert head.startswith("compacted: ") and "; index " in head, out
    after = _store_bytes(path)
    assert after < before / 4
    rep = cli_json("-s", path, "compact", "--shrink-index")
    assert rep["index_shrunk"] is True
    assert rep["store_bytes_after"] == _store_bytes(path)
    assert rep["store_bytes_after"] == rep["bytes_after"] + rep["index_bytes_after"]


def test_compact_options(tmp_path):
    path = str(tmp_path / "s")
    _churned(path)
    rep = cli_json("-s", path, "compact", "--max-garbage", "none", "--no-shrink-index")
    assert rep["index_shrunk"] is False
    assert rep["index_bytes_after"] == rep["index_bytes_before"]
    rep = cli_json("-s", path, "compact", "--max-garbage", "0", "--threshold", "0")
    with snapstore.open(path, readonly=True) as s:
        st = s.stats()
    # no garbage left: only segment headers and the newest state section (a few KiB for 6
    # checkpoints, written by this run or the one before) besides live records
    assert st["segment_bytes"] - st["live_chunk_bytes"] <= \
        (st["segments"] + 1) * fmt.SEGMENT_HEADER.size + (8 << 10), (st, rep)
    for bad in ("-1", "nan", "inf", "lots"):
        cli_error(2, "-s", path, "compact", "--max-garbage", bad, needles=("--max-garbage",))
    assert "--max-garbage" in cli_ok("compact", "--help").stdout


def test_a_compaction_that_grew_the_store_says_so():
    """Regression (a helper's review): a forced rewrite of a store without garbage (whose
    index grew) printed a negative amount "freed"."""
    from snapstore.cli.maintain_cmds import compact_title
    grew = compact_title({"store_bytes_before": 1000, "store_bytes_after": 1500})
    assert "-" not in grew.split("(")[1] and "500 B more" in grew and "freed" not in grew
    assert "(500 B freed)" in compact_title({"store_bytes_before": 1500,
                                             "store_bytes_after": 1000})
    assert "(0 B freed)" in compact_title({"store_bytes_before": 10, "store_bytes_after": 10})
