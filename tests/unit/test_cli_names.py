"""Checkpoint names on the command line (issue 15): show, restore, diff, rm and tag take ids,
latest, latest:STREAM, STREAM@SEQ, tags, stream names and DCP checkpoint_ids, through the real
console script."""
import pytest
from cli_runner import cli_error, cli_json, cli_ok

import snapstore
from snapstore.engine import format as fmt


@pytest.fixture
def named(tmp_path):
    """ids 1..4: train@1, train@2 (tag best), eval@1, dcp@1 (DCP checkpoint_id step-90)."""
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"one"}, "train")
        s.checkpoint({"x": b"two"}, "train")
        s.checkpoint({"x": b"three"}, "eval")
        s.checkpoint({"x": b"four"}, "dcp", meta={fmt.DCP_META_KEY: {"checkpoint_id": "step-90"}})
        s.tag(2, "best")
    return path


@pytest.mark.parametrize("name, want", [
    ("2", 2), ("latest", 4), ("latest:train", 2), ("train@1", 1), ("best", 2), ("tag:best", 2),
    ("step-90", 4), ("dcp:step-90", 4), ("eval", 3)])
def test_show_takes_every_form(named, name, want):
    assert cli_json("-s", named, "show", name)["id"] == want


def test_restore_and_diff_by_name(named, tmp_path):
    out = tmp_path / "out"
    cli_ok("-s", named, "restore", "best", "--out", out)
    assert (out / "x").read_bytes() == b"two"
    p = cli_ok("-s", named, "restore", "train@1", "--out", "-", "--buffer", "x", binary=True)
    assert p.stdout == b"one"
    doc = cli_json("-s", named, "diff", "train@1", "best")
    assert doc and "x" in str(doc)


def test_tag_and_rm_by_name(named):
    assert cli_json("-s", named, "tag", "eval", "good")["id"] == 3
    assert cli_json("-s", named, "show", "good")["id"] == 3
    assert cli_json("-s", named, "rm", "good", "train@1")["deleted"] == [3, 1]
    ids = [c["id"] for c in cli_json("-s", named, "ls")["checkpoints"]]
    assert ids == [2, 4]


def test_ambiguous_and_missing_names_are_usage_errors(named):
    with snapstore.open(named) as s:
        s.tag(1, "best")
    line = cli_error(2, "-s", named, "show", "best", needles=("names 2 checkpoints",
                                                             "1 (train@1, tag)",
                                                             "2 (train@2, tag)"))
    assert "STREAM@SEQ" in line
    cli_error(2, "-s", named, "rm", "best", needles=("names 2 checkpoints",))
    assert len(cli_json("-s", named, "ls")["checkpoints"]) == 4      # nothing deleted
    cli_error(2, "-s", named, "show", "nope",
              needles=("no checkpoint, tag, stream or DCP checkpoint_id named 'nope'",))
    cli_error(2, "-s", named, "rm", "3", "nope", needles=("nope",))
    assert len(cli_json("-s", named, "ls")["checkpoints"]) == 4      # all exist, or none go
    cli_error(2, "-s", named, "show", "99", needles=("no checkpoint 99",))
    cli_error(2, "-s", named, "show", "train@7", needles=("seq 7",))


def test_digits_are_an_id_and_latest_colon_reaches_a_digit_stream(tmp_path):
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"a"}, "a")
        s.checkpoint({"x": b"b"}, "1")           # a stream named "1"
    assert cli_json("-s", path, "show", "1")["id"] == 1
    assert cli_json("-s", path, "show", "latest:1")["id"] == 2
    assert cli_json("-s", path, "show", " 2 ")["id"] == 2


def test_help_and_epilog_describe_names(named):
    top = cli_ok("--help").stdout
    for needle in ("STREAM@SEQ", "latest:STREAM", "tag:TAG", "dcp:ID", "--timeout SECONDS"):
        assert needle in top, needle
    for cmd in ("show", "restore", "diff", "rm", "tag"):
        text = " ".join(cli_ok(cmd, "--help").stdout.split())
        assert "STREAM@SEQ" in text and "DCP checkpoint_id" in text, cmd


def test_a_default_stream_by_seq_and_by_name(tmp_path):
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"a"})
        s.checkpoint({"x": b"b"})
    assert cli_json("-s", path, "show", "default@1")["id"] == 1
    assert cli_json("-s", path, "show", "default")["id"] == 2
