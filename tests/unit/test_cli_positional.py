"""The store as a positional argument (`snapstore ls ckpts`, `snapstore show ckpts 7`), next to
-s/--store and $SNAPSTORE_STORE, through the real console script: every command in the three
forms, and the rule's edge cases (conflicts, commands taking any number of arguments, no
store at all)."""
from __future__ import annotations

import os

import pytest

import snapstore
from cli_runner import cli_error, cli_json, cli_ok, snapstore_cli

FORMS = ("positional", "-s", "-s-first", "env")


def make_store(path, n: int = 3) -> str:
    with snapstore.open(str(path), durability="none") as s:
        for i in range(n):
            s.checkpoint({"w": bytes([i]) * 5000}, meta={"step": i + 1})
    return str(path)


def run_form(form: str, store: str, command: str, *rest, json: bool = False):
    """Runs `snapstore COMMAND ...` naming the store in `form`; returns the parsed --json
    document (json=True) or the CompletedProcess (asserting exit 0)."""
    env = None
    if form == "positional":
        argv = [command, store, *rest]
    elif form == "-s":
        argv = [command, "-s", store, *rest]
    elif form == "-s-first":
        argv = ["-s", store, command, *rest]
    else:
        argv, env = [command, *rest], {"SNAPSTORE_STORE": store}
    return cli_json(*argv, env=env) if json else cli_ok(*argv, env=env)


@pytest.fixture
def store(tmp_path):
    return make_store(tmp_path / "ckpts")


@pytest.mark.parametrize("form", FORMS)
def test_read_commands_in_every_form(form, store, tmp_path):
    assert [c["id"] for c in run_form(form, store, "ls", json=True)["checkpoints"]] == [1, 2, 3]
    assert run_form(form, store, "show", "2", json=True)["id"] == 2
    assert run_form(form, store, "diff", "1", "3", json=True)["to"] == 3
    out = tmp_path / f"out-{form}"
    files = run_form(form, store, "restore", "3", "--out", out, json=True)["files"]
    assert [f["buffer"] for f in files] == ["w"] and (out / "w").read_bytes() == b"\2" * 5000
    assert run_form(form, store, "verify", "--deep", json=True)["ok"] is True
    assert run_form(form, store, "stats", json=True)["checkpoints"] == 3


@pytest.mark.parametrize("form", FORMS)
def test_write_commands_in_every_form(form, store):
    assert run_form(form, store, "tag", "2", "best", "keep", json=True)["tags"] == \
        ["best", "keep"]
    assert run_form(form, store, "tag", "2", "keep", "--remove", json=True)["tags"] == ["best"]
    assert run_form(form, store, "rm", "1", json=True)["deleted"] == [1]
    run_form(form, store, "retain", "--all-streams", "--keep-last", "1", "--no-keep-tagged")
    run_form(form, store, "compact")
    assert run_form(form, store, "repair", json=True)["ok"] is True
    with snapstore.open(store, readonly=True) as s:
        assert [c.id for c in s.checkpoints()] == [3]


@pytest.mark.parametrize("form", FORMS)
def test_init_in_every_form(form, tmp_path):
    path = str(tmp_path / "new")
    assert run_form(form, path, "init", json=True) == {"path": path, "created": True}
    assert run_form(form, path, "init", json=True)["created"] is False


def test_several_ids_after_a_positional_store(store):
    assert cli_json("rm", store, "1", "2")["deleted"] == [1, 2]
    assert cli_json("ls", store)["checkpoints"][0]["id"] == 3


def test_equal_store_twice_is_fine_a_different_one_is_a_usage_error(store, tmp_path):
    other = make_store(tmp_path / "other", n=1)
    # the same store spelled differently (trailing slash, relative path) is the same store
    rel = os.path.relpath(store, tmp_path)
    assert cli_json("show", "-s", store + "/", rel, "1", cwd=str(tmp_path))["id"] == 1
    cli_error(2, "show", "-s", other, store, "1", needles=("two different stores", other))
    cli_error(2, "-s", other, "ls", store, needles=("two different stores",))
    cli_error(2, "rm", "-s", other, store, "1", needles=("two different stores",))
    cli_error(2, "init", "-s", other, str(tmp_path / "x"), needles=("two different stores",))
    assert not os.path.exists(tmp_path / "x")
    with snapstore.open(store, readonly=True) as s:      # nothing was deleted
        assert len(s.checkpoints()) == 3


def test_positional_store_wins_over_the_environment(store, tmp_path):
    other = make_store(tmp_path / "other", n=1)
    env = {"SNAPSTORE_STORE": other}
    assert len(cli_json("ls", store, env=env)["checkpoints"]) == 3
    assert cli_json("show", store, "3", env=env)["id"] == 3
    # rm takes any number of ids: its first argument is the store because it is one
    assert cli_json("rm", store, "2", env=env)["deleted"] == [2]
    assert cli_json("tag", store, "3", "best", env=env)["tags"] == ["best"]
    with snapstore.open(other, readonly=True) as s:
        assert [(c.id, c.tags) for c in s.checkpoints()] == [(1, ())]


def test_with_the_environment_every_argument_of_rm_is_an_id(store):
    env = {"SNAPSTORE_STORE": store}
    assert cli_json("rm", "1", "2", env=env)["deleted"] == [1, 2]
    assert cli_json("tag", "3", "a", "b", env=env)["tags"] == ["a", "b"]


def test_no_store_given(store, tmp_path):
    for argv in (["ls"], ["show", "1"], ["diff", "1", "2"], ["rm", "1"], ["stats"],
                 ["restore", "1", "--out", str(tmp_path / "o")]):
        cli_error(2, *argv, needles=("no store given", "-s/--store", "SNAPSTORE_STORE"))
    # with no -s and no $SNAPSTORE_STORE the first argument is the store: say so
    cli_error(2, "rm", "1", "2", needles=("no snapstore store at 1", "first argument"))
    cli_error(2, "show", store, needles=("required",))
    cli_error(2, "tag", store, "1", needles=("required",))      # the store, but no tag


def test_one_argument_too_many_is_a_usage_error(store):
    cli_error(2, "ls", store, "extra", needles=("unrecognized arguments",))
    cli_error(2, "show", store, "1", "2", needles=("unrecognized arguments",))
    cli_error(2, "ls", "-s", store, store, "x", needles=("unrecognized",))


def test_options_may_sit_between_store_and_id(store):
    assert cli_json("show", store, "--no-progress", "2")["id"] == 2
    assert cli_json("diff", "--no-progress", store, "1", "2")["from"] == 1


def test_help_documents_the_rule():
    text = cli_ok("--help").stdout
    assert "[STORE]" in text and "STORE wins over $SNAPSTORE_STORE" in text
    show = cli_ok("show", "--help").stdout
    assert "[STORE] NAME" in " ".join(show.split()) and "different -s" in show
    bench = cli_ok("bench", "--help").stdout
    assert "STORE" not in bench                       # bench has no store
    p = snapstore_cli("bench", "somewhere")
    assert p.returncode == 2 and "unrecognized arguments" in p.stderr


# ---- the rule itself, in-process (fast): which argument is the store ---------------------------
def _parse(argv, env=None):
    from snapstore.cli.app import build_parser
    from snapstore.cli.args import parse_command_line
    return parse_command_line(build_parser, list(argv), environ=env or {})


def test_rule_in_process(store, tmp_path):
    from snapstore.cli.common import UsageError
    other = make_store(tmp_path / "other", n=1)
    a = _parse(["show", store, "7"])
    assert (a.store, a.id, a.store_source) == (store, 7, "argument")
    a = _parse(["show", "7"], env={"SNAPSTORE_STORE": other})
    assert (a.store, a.id, a.store_source) == (None, 7, None)
    a = _parse(["rm", "1", "2"], env={"SNAPSTORE_STORE": other})
    assert (a.store, a.ids) == (None, [1, 2])
    a = _parse(["rm", store, "2"], env={"SNAPSTORE_STORE": other})
    assert (a.store, a.ids) == (store, [2])
    a = _parse(["rm", "nostore", "2"])                  # no -s, no env: first is the store
    assert (a.store, a.ids) == ("nostore", [2])
    a = _parse(["-s", store, "rm", "1", "2"])
    assert (a.store, a.ids, a.store_source) == (store, [1, 2], "-s")
    assert not hasattr(a, "store_arg")
    a = _parse(["bench", "--size", "4096"])
    assert a.command == "bench" and a.store_source is None
    for argv in (["show", "7"], ["-s", other, "show", store, "7"], ["ls", store, "x"]):
        with pytest.raises(UsageError):
            _parse(argv)
