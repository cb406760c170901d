"""`snapstore retain` through the real console script (issue 15): every rule has help text,
--stream or --all-streams is required, time rules, --dry-run lists what would go and why the
rest stays (and deletes nothing), the prune frees space (human and --json), --no-prune."""
from __future__ import annotations

import os

import pytest
from cli_runner import cli_error, cli_json, cli_ok

import snapstore


def make_store(path):
    """train: 5 checkpoints of 200 KB random bytes (2 tagged 'best'); eval: 2 of 100 KB."""
    with snapstore.open(path, durability="none") as s:
        train = [s.checkpoint({"a": os.urandom(200_000)}, "train").id for _ in range(5)]
        ev = [s.checkpoint({"a": os.urandom(100_000)}, "eval").id for _ in range(2)]
        s.tag(train[1], "best")
    return train, ev


def ids(path, stream):
    with snapstore.open(path, readonly=True) as s:
        return [c.id for c in s.checkpoints(stream)]


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "s")
    return (path, *make_store(path))


def test_help_names_every_rule_and_option():
    out = cli_ok("retain", "--help").stdout
    for flag in ("--keep-last", "--keep-every", "--keep-within", "--keep-hourly",
                 "--keep-daily", "--keep-weekly", "--keep-monthly", "--keep-yearly",
                 "--no-keep-tagged", "--dry-run", "--no-prune", "--all-streams", "--stream",
                 "--utc"):
        assert flag in out, flag
    lines = out.splitlines()
    for flag in ("--keep-hourly", "--keep-daily", "--keep-weekly", "--keep-monthly",
                 "--keep-yearly", "--keep-within", "--dry-run", "--no-prune"):
        at = next(i for i, ln in enumerate(lines) if ln.strip().startswith(flag))
        text = " ".join(lines[at:at + 3]).split(flag, 1)[1]
        assert "keep" in text or "delete" in text, (flag, text)     # has its own help text
    assert "36h" in out and "local time" in out


def test_usage_errors(store):
    path = store[0]
    cli_error(2, "-s", path, "retain", "--stream", "train", needles=["--keep-last"])
    cli_error(2, "-s", path, "retain", "--keep-last", "1", needles=["--all-streams"])
    cli_error(2, "-s", path, "retain", "--stream", "train", "--all-streams", "--keep-last", "1")
    for bad in (["--keep-within", "7 days"], ["--keep-within", "1mo"], ["--keep-within", "-1d"],
                ["--keep-daily", "-1"], ["--keep-weekly", "x"], ["--keep-every", "0"]):
        cli_error(2, "-s", path, "retain", "--stream", "train", *bad, needles=[bad[0]])
    assert ids(path, "train") == store[1]                   # nothing was deleted


def test_dry_run_lists_and_deletes_nothing_then_the_real_run_does_exactly_that(store):
    path, train, ev = store
    out = cli_ok("-s", path, "retain", "--all-streams", "--keep-last", "2", "--dry-run").stdout
    assert f"train: would delete 2 checkpoint(s): {train[0]}, {train[2]}" in out
    assert f"keep {train[1]}: tagged" in out and f"keep {train[4]}: last" in out
    assert "eval: would delete 0" in out and "nothing was deleted" in out
    dry = cli_json("-s", path, "retain", "--all-streams", "--keep-last", "2", "--dry-run")
    assert dry["dry_run"] is True and dry["bytes_freed"] is None and dry["compaction"] is None
    assert ids(path, "train") == train and ids(path, "eval") == ev
    real = cli_json("-s", path, "retain", "--all-streams", "--keep-last", "2")
    assert real["deleted"] == dry["deleted"] == {"train": [train[0], train[2]], "eval": []}
    assert real["kept"] == dry["kept"]
    assert real["kept"]["train"] == {str(train[1]): ["tagged"], str(train[3]): ["last"],
                                     str(train[4]): ["last"]}
    assert ids(path, "train") == [train[1], train[3], train[4]]


def test_real_run_prunes_and_prints_space_freed(store):
    path, train, ev = store
    out = cli_ok("-s", path, "retain", "--stream", "train", "--stream", "eval",
                 "--keep-last", "1").stdout
    assert f"train: deleted 3 checkpoint(s): {train[0]}, {train[2]}, {train[3]}" in out
    assert f"eval: deleted 1 checkpoint(s): {ev[0]}" in out
    assert "freed; pruned)" in out and "space:" in out
    with snapstore.open(path, readonly=True) as s:
        st = s.stats()
        assert st["garbage_chunk_bytes"] == 0
    again = cli_json("-s", path, "retain", "--stream", "train", "--stream", "eval",
                     "--keep-last", "1")
    assert again["deleted_count"] == 0 and again["bytes_freed"] == 0
    assert again["compaction"] is None


def test_json_reports_space_and_compaction(store):
    path, train, ev = store
    d = cli_json("-s", path, "retain", "--stream", "train", "--keep-last", "1",
                 "--no-keep-tagged")
    assert d["deleted"] == {"train": train[:4]} and d["deleted_count"] == 4
    assert d["bytes_freed"] == d["bytes_before"] - d["bytes_after"] > 4 * 200_000 * 0.9
    assert d["compaction"]["bytes_returned"] > 0
    assert ids(path, "eval") == ev


def test_no_prune_leaves_space_to_compact(store):
    path, train, _ = store
    d = cli_json("-s", path, "retain", "--stream", "train", "--keep-last", "2", "--no-prune")
    assert len(d["deleted"]["train"]) == 2 and d["compaction"] is None
    assert d["bytes_freed"] < 100_000
    out = cli_ok("-s", path, "retain", "--stream", "train", "--keep-every", "1000",
                 "--no-prune").stdout
    assert "deleted 1 checkpoint" in out and "not pruned" in out    # (the head stays)
    # the delete records are all the store gained: said so, not "-176 B freed"
    assert "more: the delete records" in out and " -" not in out.split("->")[1]
    assert cli_json("-s", path, "compact")["bytes_returned"] > 3 * 200_000 * 0.9


def test_time_rules(store):
    path, train, _ = store
    d = cli_json("-s", path, "retain", "--stream", "train", "--keep-within", "1h", "--dry-run")
    assert d["deleted"]["train"] == []
    assert set(d["kept"]["train"]) == {str(i) for i in train}
    d = cli_json("-s", path, "retain", "--stream", "train", "--keep-daily", "3", "--utc",
                 "--no-keep-tagged")
    assert d["deleted"]["train"] == train[:4]
    assert d["kept"]["train"] == {str(train[4]): ["daily"]}


def test_a_policy_that_keeps_nothing_is_a_usage_error(store):
    """--keep-last 0 alone (a typo for 10, say) would delete every untagged checkpoint."""
    path, train, _ = store
    cli_error(2, "-s", path, "retain", "--stream", "train", "--keep-last", "0",
              needles=["keeps nothing"])
    cli_error(2, "-s", path, "retain", "--all-streams", "--keep-daily", "0",
              "--keep-hourly", "0", needles=["keeps nothing"])
    assert ids(path, "train") == train


def test_unknown_stream_and_empty_store(tmp_path):
    path = str(tmp_path / "s")
    snapstore.open(path).close()
    d = cli_json("-s", path, "retain", "--all-streams", "--keep-last", "1")
    assert d["deleted"] == {} and d["deleted_count"] == 0
    assert "no streams" in cli_ok("-s", path, "retain", "--all-streams", "--keep-last",
                                  "1").stdout
    d = cli_json("-s", path, "retain", "--stream", "nope", "--keep-last", "1")
    assert d["deleted"] == {"nope": []}
    assert "nope: no checkpoints (no such stream?)" in cli_ok(
        "-s", path, "retain", "--stream", "nope", "--keep-yearly", "1").stdout
