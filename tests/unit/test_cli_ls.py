"""`snapstore ls` and `show` as people read them, through the real console script: the user's
meta first with snapstore's keys hidden, --where filters, fitting the terminal width, and
LangGraph streams shown and selected by thread (also where LangGraph is not installed)."""
from __future__ import annotations

import json
import os

import pytest

import snapstore
from cli_runner import cli_error, cli_json, cli_ok
from snapstore.langgraph_streams import thread_streams

LONG = "x" * 300


@pytest.fixture
def store(tmp_path):
    path = str(tmp_path / "ckpts")
    with snapstore.open(path, durability="none") as s:
        for step, loss in ((10, 0.9), (50, 0.6), (90, 0.4), (130, 0.2)):
            s.checkpoint({"w": bytes([step]) * 4096}, stream="train",
                         meta={"step": step, "loss": loss, "snapstore.dcp":
                               {"checkpoint_id": f"step-{step}", "blob": LONG}})
        s.checkpoint({"w": b"e"}, stream="eval", meta={"name": "run-a", "cfg": {"lr": 0.1}})
        s.checkpoint({"w": b"n"}, stream="eval", meta=None)
    return path


def test_user_meta_first_reserved_keys_hidden(store):
    out = cli_ok("ls", store).stdout
    lines = out.splitlines()
    assert lines[0].split()[-1] == "META"
    assert lines[3].endswith("step=90 loss=0.4")
    assert 'name=run-a cfg={"lr":0.1}' in out
    assert "snapstore.dcp" not in out and LONG not in out
    listed = cli_json("ls", store)["checkpoints"]
    assert listed[2]["meta"] == {"step": 90, "loss": 0.4}
    assert listed[5]["meta"] is None
    shown = cli_ok("show", store, "3").stdout.splitlines()
    assert shown[0] == "checkpoint 3" and shown[1].split() == ["meta", "step=90", "loss=0.4"]
    assert "snapstore.dcp" not in "\n".join(shown) and "train (seq 3)" in shown[2]
    d = cli_json("show", store, "3")
    assert d["meta"] == {"step": 90, "loss": 0.4}
    assert d["reserved_meta"] == {"snapstore.dcp": {"checkpoint_id": "step-90", "blob": LONG}}
    assert cli_ok("show", store, "6").stdout.splitlines()[1].split() == ["meta", "-"]


@pytest.mark.parametrize("where, ids", [
    (["step>=90"], [3, 4]), (["step=90"], [3]), (["step==90.0"], [3]), (["loss<0.5"], [3, 4]),
    (["step>=50", "loss>0.3"], [2, 3]), (["name!=x"], [5]), (["name=run-a"], [5]),
    (["cfg.lr=0.1"], [5]), (["has:cfg"], [5]), (["!has:step"], [5, 6]),
    (["step>1000"], []), (["snapstore.dcp.checkpoint_id=step-90"], []),   # reserved: hidden
])
def test_where(store, where, ids):
    argv = [a for w in where for a in ("--where", w)]
    assert [c["id"] for c in cli_json("ls", store, *argv)["checkpoints"]] == ids


def test_where_combines_with_stream_tag_and_last(store):
    assert [c["id"] for c in cli_json("ls", store, "--where", "step>0", "--last", "2")
            ["checkpoints"]] == [3, 4]
    assert cli_json("ls", store, "--stream", "eval", "--where", "step>0")["checkpoints"] == []
    text = cli_ok("ls", store, "--where", "step>1000").stdout
    assert text == "no checkpoints\n"


@pytest.mark.parametrize("expr", ["step", "=3", "step>", "a!b", "a<>1", "has:", ""])
def test_bad_where_is_a_usage_error(store, expr):
    cli_error(2, "ls", store, "--where", expr,
              needles=("invalid --where expression", "KEY OP VALUE"))


def test_fits_the_terminal_width(store):
    with snapstore.open(store, durability="none") as s:
        s.checkpoint({"w": b"l"}, stream="eval", meta={"note": "n" * 500})
    for columns in (120, 80, 60):
        out = cli_ok("ls", store, env={"COLUMNS": str(columns)}).stdout
        lines = out.splitlines()
        assert len(lines) == 8 and all(len(ln) <= columns for ln in lines), (columns, out)
        assert lines[-1].rstrip().endswith("\u2026")           # the long meta is cut
        assert "step=90 loss=0.4" in out                        # short meta is whole
    narrow = cli_ok("ls", store, env={"COLUMNS": "60"}).stdout.splitlines()[0].split()
    assert "CHAIN" not in narrow and "META" in narrow           # columns given up for META
    # -w, and output that is not a terminal (no $COLUMNS), are never cut
    assert "n" * 500 in cli_ok("ls", store, "-w", env={"COLUMNS": "60"}).stdout
    assert "n" * 500 in cli_ok("ls", store).stdout
    # --json is unaffected
    doc = json.loads(cli_ok("ls", store, "--json", env={"COLUMNS": "40"}).stdout)
    assert doc["checkpoints"][-1]["meta"] == {"note": "n" * 500}
    # an encoding without the ellipsis character: three dots
    ascii_out = cli_ok("ls", store, env={"COLUMNS": "60", "PYTHONIOENCODING": "ascii"}).stdout
    assert ascii_out.splitlines()[-1].rstrip().endswith("...")


def _langgraph_like(path: str) -> None:
    """Checkpoints named and described as SnapstoreSaver writes them (no LangGraph needed)."""
    with snapstore.open(path, durability="none") as s:
        lg, lw = thread_streams("t1", "")
        sub, _ = thread_streams("t1", "child:1")
        other, _ = thread_streams("t2", "")
        s.checkpoint({"c:messages": b"m1"}, stream=lg,
                     meta={"t": "t1", "ns": "", "id": "ck-1", "p": None, "ck": ["msgpack", "AAAA"]})
        s.checkpoint({"w0": b"x"}, stream=lw,
                     meta={"t": "t1", "ns": "", "id": "ck-1", "task": "task-9", "w": []})
        s.checkpoint({"c:messages": b"m2"}, stream=sub,
                     meta={"t": "t1", "ns": "child:1", "id": "ck-2", "ck": ["msgpack", "BB"]})
        s.checkpoint({"c:messages": b"m3"}, stream=other,
                     meta={"t": "t2", "ns": "", "id": "ck-3", "ck": ["msgpack", "CC"]})
        # a stream that merely looks like a saver's: its meta does not name it
        s.checkpoint({"a": b"1"}, stream="lg/fake", meta={"t": "t1", "ns": ""})
        s.checkpoint({"a": b"2"}, stream="t1/notes", meta={"step": 1})


def test_langgraph_threads(tmp_path):
    path = str(tmp_path / "agent")
    _langgraph_like(path)
    text = cli_ok("ls", path).stdout
    for label in ("lg:t1 ", "lw:t1 ", "lg:t1/child:1 ", "lg:t2 ", "lg/fake ", "t1/notes "):
        assert label in text, (label, text)
    assert "AAAA" not in text and "checkpoint=ck-1 task=task-9" in text
    assert [c["id"] for c in cli_json("ls", path, "--thread", "t1")["checkpoints"]] == [1, 2, 3]
    listed = cli_json("ls", path, "--thread", "t1")["checkpoints"]
    assert [(c["thread"], c["namespace"]) for c in listed] == \
        [("t1", ""), ("t1", ""), ("t1", "child:1")]
    assert "thread" not in cli_json("ls", path, "--stream", "t1/notes")["checkpoints"][0]
    # --stream with a thread's id: nothing, and a hint at --thread (and similar streams)
    p = cli_ok("ls", path, "--stream", "t1")
    assert p.stdout.splitlines() == ["no checkpoints", "hint: LangGraph thread 't1' has 3 "
                                     "stream(s): snapstore ls --thread t1"]
    assert cli_json("ls", path, "--stream", "t1")["hint"].startswith("LangGraph thread 't1'")
    assert "'t1/notes'" in cli_ok("ls", path, "--stream", "t1/").stdout
    assert "no LangGraph thread 'zz'" in cli_ok("ls", path, "--thread", "zz").stdout
    cli_error(2, "ls", path, "--thread", "t1", "--stream", "x", needles=("not allowed",))
    shown = cli_ok("show", path, "1").stdout
    assert "LangGraph thread 't1'" in shown and "checkpoint=ck-1" in shown


def test_langgraph_threads_without_langgraph_installed(tmp_path):
    """ls --thread must not import langgraph: here importing it fails."""
    path = str(tmp_path / "agent")
    _langgraph_like(path)
    blocker = tmp_path / "block"
    (blocker / "langgraph").mkdir(parents=True)
    (blocker / "langgraph" / "__init__.py").write_text("raise ImportError('no langgraph')\n")
    env = {"PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))), str(blocker)])}
    assert [c["id"] for c in cli_json("ls", path, "--thread", "t1", env=env)
            ["checkpoints"]] == [1, 2, 3]
    assert "lg:t1" in cli_ok("ls", path, env=env).stdout
    assert "LangGraph thread 't1'" in cli_ok("show", path, "1", env=env).stdout


def test_real_saver_streams_by_thread(tmp_path):
    pytest.importorskip("langgraph.checkpoint.base", reason="langgraph-checkpoint is not "
                        "installed")
    from langgraph.checkpoint.base import empty_checkpoint
    from snapstore.langgraph import SnapstoreSaver
    path = str(tmp_path / "agent")
    with SnapstoreSaver.from_path(path) as saver:
        config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        for _ in range(2):
            ck = empty_checkpoint()
            ck["channel_values"] = {"messages": ["hi"]}
            ck["channel_versions"] = {"messages": 1}
            config = saver.put(config, ck, {"step": 1}, {"messages": 1})
    listed = cli_json("ls", path, "--thread", "t1")["checkpoints"]
    assert len(listed) == 2 and {c["thread"] for c in listed} == {"t1"}
    assert cli_ok("ls", path).stdout.count("lg:t1 ") == 2
