"""Checkpoint names (issue 15): Store.resolve and every method that takes a checkpoint accept
ids, "latest", "latest:STREAM", "STREAM@SEQ", tags, stream names and DCP checkpoint_ids, with
one resolver (snapstore.engine.names), checked here against a pure-Python reference."""
import os
import pickle
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import snapstore
from snapstore.engine import format as fmt
from snapstore.diff import diff_checkpoints
from snapstore.engine import names
from snapstore.engine.index import IndexView
from snapstore.errors import (AmbiguousCheckpointName, CheckpointNotFound, CommitConflict,
                              InvalidArgumentError, InvalidArgumentTypeError, StoreClosedError)

DCP = fmt.DCP_META_KEY


def dcp_meta(checkpoint_id):
    return {DCP: {"version": 1, "checkpoint_id": checkpoint_id, "parts": [], "ranks": 1}}


# ---- the pure-Python reference ---------------------------------------------------------------
def reference(ckpts, name):
    """("ok", id) | ("missing",) | ("ambiguous", ids) for a name over the live checkpoints
    [{"id", "stream", "seq", "tags", "dcp"}], as the README and engine/names.py define it."""
    by_id = {c["id"]: c for c in ckpts}

    def head(stream):
        ids = [c["id"] for c in ckpts if c["stream"] == stream]
        return max(ids) if ids else None

    def dcp_newest(d):
        out = {}
        for c in sorted(ckpts, key=lambda c: c["id"]):
            if c["dcp"] == d:
                out[c["stream"]] = c["id"]
        return set(out.values())

    def one(ids):
        ids = set(ids) - {None}
        if not ids:
            return ("missing",)
        return ("ok", ids.pop()) if len(ids) == 1 else ("ambiguous", ids)

    if isinstance(name, int):
        return ("ok", name) if name in by_id else ("missing",)
    if name == "latest":
        return one([max(by_id)] if by_id else [])
    if name.startswith("latest:"):
        return one([head(name[7:])])
    if name.startswith("tag:"):
        return one(c["id"] for c in ckpts if name[4:] in c["tags"])
    if name.startswith("dcp:"):
        return one(dcp_newest(name[4:]))
    stream, sep, seq = name.rpartition("@")
    if sep and stream and seq.isdigit():
        return one(c["id"] for c in ckpts if c["stream"] == stream and c["seq"] == int(seq))
    return one({head(name)} | {c["id"] for c in ckpts if name in c["tags"]} | dcp_newest(name))


def outcome(store, name):
    try:
        return ("ok", store.resolve(name).id)
    except AmbiguousCheckpointName as exc:
        return ("ambiguous", {c["id"] for c in exc.candidates})
    except CheckpointNotFound:
        return ("missing",)


STREAMS = ["a", "b", "latest", "a@1", "x:y", "1", "best", "tag:z", "step-1"]
TAGS = ["best", "a", "v@1", "1", "latest", "step-1"]
DCP_IDS = [None, "step-1", "a", "best", "dcp:q", "step-2"]

operation = st.one_of(
    st.tuples(st.just("ckpt"), st.sampled_from(STREAMS), st.sampled_from(DCP_IDS)),
    st.tuples(st.just("tag"), st.integers(0, 40), st.sampled_from(TAGS)),
    st.tuples(st.just("delete"), st.integers(0, 40), st.just(None)))


def queries(ckpts):
    out = ["latest", "zzz", "a@99"] + STREAMS + TAGS + [d for d in DCP_IDS if d]
    out += [f"latest:{s}" for s in STREAMS] + [f"tag:{t}" for t in TAGS]
    out += [f"dcp:{d}" for d in DCP_IDS if d] + [f"{s}@{n}" for s in STREAMS for n in (1, 2, 3)]
    out += list(range(0, max((c["id"] for c in ckpts), default=0) + 2))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=25))
def test_resolve_matches_the_reference(ops):
    root = tempfile.mkdtemp()
    try:
        with snapstore.open(os.path.join(root, "s"), durability="none") as store:
            ckpts = {}
            for kind, arg, extra in ops:
                live = sorted(ckpts)
                if kind == "ckpt":
                    info = store.checkpoint({"x": b"%d" % len(ckpts)}, arg,
                                           meta=dcp_meta(extra) if extra else {"step": 1})
                    ckpts[info.id] = {"id": info.id, "stream": arg, "seq": info.seq,
                                      "tags": set(), "dcp": extra}
                elif live and kind == "tag":
                    cid = live[arg % len(live)]
                    store.tag(cid, extra)
                    ckpts[cid]["tags"].add(extra)
                elif live and kind == "delete":
                    cid = live[arg % len(live)]
                    store.delete(cid)
                    del ckpts[cid]
            for name in queries(list(ckpts.values())):
                want = reference(list(ckpts.values()), name)
                assert outcome(store, name) == want, name
    finally:
        shutil.rmtree(root)


# ---- the forms, one by one ------------------------------------------------------------------
@pytest.fixture
def filled(store):
    """ids 1..5: train@1 train@2 (tag best) eval@1 train@3 (dcp step-90) dcp@1 (dcp step-90)."""
    store.checkpoint({"x": b"1"}, "train", meta={"step": 1})
    store.checkpoint({"x": b"2"}, "train", meta={"step": 2})
    store.checkpoint({"x": b"3"}, "eval")
    store.checkpoint({"x": b"4"}, "train", meta=dcp_meta("step-90"))
    store.checkpoint({"x": b"5"}, "dcp", meta=dcp_meta("step-100"))
    store.tag(2, "best")
    return store


@pytest.mark.parametrize("name, want", [
    (2, 2), ("latest", 5), ("latest:train", 4), ("latest:eval", 3), ("train", 4), ("eval", 3),
    ("train@1", 1), ("train@3", 4), ("best", 2), ("tag:best", 2), ("step-90", 4),
    ("dcp:step-90", 4), ("step-100", 5), ("dcp", 5)])
def test_every_form(filled, name, want):
    assert filled.resolve(name).id == want
    assert filled.get(name).id == want


def test_a_checkpoint_info_names_itself(filled):
    info = filled.get(3)
    assert filled.resolve(info) == info
    assert filled.restore(info) == {"x": b"3"}


@pytest.fixture
def foreign(tmp_path):
    """A CheckpointInfo of another store whose checkpoint has id 3, as filled's eval@1 does,
    with different bytes."""
    with snapstore.open(str(tmp_path / "other")) as other:
        for k in range(3):
            info = other.checkpoint({"x": b"other %d" % k}, "eval" if k == 2 else "o")
    assert info.id == 3
    return info


def test_a_checkpoint_info_of_another_store_names_nothing_here(filled, foreign):
    """An info carries its id, unique in its own store only: another store's checkpoint 3 is
    not this one's, and taking it as its bare id returned and changed the wrong checkpoint."""
    calls = {
        "resolve": lambda: filled.resolve(foreign),
        "restore": lambda: filled.restore(foreign),
        "restore_into": lambda: filled.restore_into(foreign, {"x": bytearray(1)}),
        "read": lambda: filled.read(foreign, "x"),
        "layout": lambda: filled.layout(foreign, "x"),
        "read_ranges": lambda: filled.read_ranges(foreign, "x", [(0, 1)]),
        "manifests": lambda: filled.manifests(foreign),
        "with_manifests": lambda: filled.with_manifests(foreign, lambda m, read: m),
        "tag": lambda: filled.tag(foreign, "t"),
        "untag": lambda: filled.untag(foreign, "t"),
        "delete": lambda: filled.delete(foreign),
        "delete_many": lambda: filled.delete_many([1, foreign]),
        "diff": lambda: diff_checkpoints(filled, 1, foreign),
    }
    for what, call in calls.items():
        with pytest.raises(CheckpointNotFound, match="is not of this store"):
            call()
    assert [c.id for c in filled.checkpoints()] == [1, 2, 3, 4, 5]      # nothing deleted
    assert filled.get(3).tags == ()                                     # nor tagged
    assert filled.restore(3) == {"x": b"3"}


def test_an_expected_head_of_another_store_is_a_conflict(filled, foreign):
    with pytest.raises(CommitConflict, match="is not of this store") as caught:
        filled.checkpoint({"x": b"6"}, "eval", expect_head=foreign)
    assert caught.value.expected == 3
    with pytest.raises(CommitConflict, match="is not of this store"):
        filled.group("eval", ["a"], expect_head=foreign)
    assert filled.checkpoint_ids("eval") == [3]
    assert filled.checkpoint({"x": b"6"}, "eval", expect_head=filled.get(3)).id == 6


def test_a_checkpoint_info_still_names_itself_after_reopen_copy_and_compaction(filled):
    info = pickle.loads(pickle.dumps(filled.get(2)))
    filled.checkpoint({"x": b"6"}, "train")
    filled.compact(max_chain=1)
    assert filled.restore(info) == {"x": b"2"}
    path = filled.path
    filled.close()
    with snapstore.open(path) as again:
        assert again.resolve(info).id == 2
        again.delete(info)
        with pytest.raises(CheckpointNotFound):
            again.restore(info)


def test_tag_and_dcp_prefixes_come_before_stream_at_seq(store):
    """As the docs list them: "tag:x@1" is the tag "x@1", not seq 1 of a stream "tag:x"
    (whose newest is "latest:tag:x", and older ones are reached by id)."""
    first = store.checkpoint({"x": b"1"}, "tag:x")
    second = store.checkpoint({"x": b"2"}, "tag:x")
    with pytest.raises(CheckpointNotFound, match="tagged 'x@1'"):
        store.resolve("tag:x@1")
    store.tag(first.id, "x@1")
    assert store.resolve("tag:x@1").id == first.id
    assert store.resolve("latest:tag:x").id == second.id
    assert names.parse("tag:x@1").kind == "tag" and names.parse("dcp:a@2").kind == "dcp"
    assert names.parse("x@2").kind == "seq"


def test_every_method_takes_names(filled):
    assert filled.restore("best") == {"x": b"2"}
    assert filled.restore("train") == {"x": b"4"}        # was a TypeError (issue 15)
    assert filled.read("train@1", "x") == b"1"
    target = bytearray(1)
    filled.restore_into("step-90", {"x": target})
    assert target == b"4"
    filled.tag("latest:eval", "good")
    assert filled.get(3).tags == ("good",)
    filled.untag("good", "good")
    assert filled.get(3).tags == ()
    filled.delete("eval")
    assert "eval" not in filled.streams()
    filled.delete_many(["train@1", "best"])
    assert [c.id for c in filled.checkpoints()] == [4, 5]


def test_object_layers_load_by_name(store):
    store.save({"w": np.arange(4.0)}, "model")
    store.tag(1, "best")
    assert store.load("best")["w"].tolist() == [0, 1, 2, 3]
    assert store.load("model@1")["w"].tolist() == [0, 1, 2, 3]
    snapstore.save_arrays(store, {"a": np.ones(3)}, "arrays")
    store.tag("arrays", "ones")
    assert snapstore.load_arrays(store, "ones")["a"].tolist() == [1, 1, 1]
    assert snapstore.load_arrays(store, "latest")["a"].tolist() == [1, 1, 1]


def test_torch_load_by_name_and_one_dcp_key(store):
    torch = pytest.importorskip("torch")
    import snapstore.torch as sst
    assert sst.DCP_META_KEY is fmt.DCP_META_KEY
    sst.save({"t": torch.arange(3)}, store, "run")
    store.tag("run", "best")
    assert sst.load(store, "best")["t"].tolist() == [0, 1, 2]


# ---- ambiguity, absence, escapes -------------------------------------------------------------
def test_ambiguous_names_list_the_candidates(filled):
    filled.tag(4, "best")                        # a tag on two checkpoints of one stream
    with pytest.raises(AmbiguousCheckpointName) as exc:
        filled.resolve("best")
    assert isinstance(exc.value, InvalidArgumentError)
    assert not isinstance(exc.value, CheckpointNotFound)   # "not there" is not "which one?"
    assert exc.value.candidates == [
        {"id": 2, "stream": "train", "seq": 2, "match": "tag"},
        {"id": 4, "stream": "train", "seq": 3, "match": "tag"}]
    assert "2 (train@2, tag)" in str(exc.value) and "4 (train@3, tag)" in str(exc.value)
    filled.tag(3, "train")                      # a tag named like another stream
    with pytest.raises(AmbiguousCheckpointName, match=r"3 \(eval@1, tag\), 4 \(train@3, "
                                                      r"stream\)"):
        filled.resolve("train")
    filled.tag(1, "step-90")                    # a tag named like a DCP id
    with pytest.raises(AmbiguousCheckpointName) as exc:
        filled.resolve("step-90")
    assert [(c["id"], c["match"]) for c in exc.value.candidates] == [
        (1, "tag"), (4, "dcp checkpoint_id")]
    filled.tag(4, "step-90")                    # now 4 matches two ways: still two candidates
    with pytest.raises(AmbiguousCheckpointName) as exc:
        filled.resolve("step-90")
    assert [(c["id"], c["match"]) for c in exc.value.candidates] == [
        (1, "tag"), (4, "tag+dcp checkpoint_id")]


def test_one_checkpoint_matched_several_ways_is_not_ambiguous(filled):
    filled.tag(4, "train")
    filled.tag(4, "step-90")
    assert filled.resolve("train").id == 4
    assert filled.resolve("step-90").id == 4


def test_dcp_resave_under_the_same_id_names_the_newest(filled):
    filled.checkpoint({"x": b"6"}, "train", meta=dcp_meta("step-90"))
    assert filled.resolve("step-90").id == 6
    filled.checkpoint({"x": b"7"}, "other", meta=dcp_meta("step-90"))
    with pytest.raises(AmbiguousCheckpointName, match="dcp checkpoint_id"):
        filled.resolve("dcp:step-90")


@pytest.mark.parametrize("name, needle", [
    ("nope", "no checkpoint, tag, stream or DCP checkpoint_id named 'nope'"),
    ("42", "an id is an int: 42"), (99, "no checkpoint 99"),
    ("latest:nope", "stream 'nope' has no checkpoints"),
    ("train@9", "stream 'train' has no checkpoint with seq 9"),
    ("nope@1", "no stream 'nope'"), ("tag:nope", "no checkpoint is tagged 'nope'"),
    ("dcp:nope", "no DCP checkpoint has checkpoint_id 'nope'")])
def test_absent_names_say_what_was_looked_for(filled, name, needle):
    with pytest.raises(CheckpointNotFound, match=needle.replace("(", r"\(")):
        filled.resolve(name)


def test_empty_store(store):
    for name in ("latest", "x", 1, "x@1", "tag:x"):
        with pytest.raises(CheckpointNotFound):
            store.resolve(name)


@pytest.mark.parametrize("bad, kind", [
    (None, InvalidArgumentTypeError), (1.0, InvalidArgumentTypeError),
    (True, InvalidArgumentTypeError), (b"x", InvalidArgumentTypeError),
    ([1], InvalidArgumentTypeError), ("", InvalidArgumentError), (-1, InvalidArgumentError),
    (1 << 64, InvalidArgumentError), ("latest:", InvalidArgumentError),
    ("tag:", InvalidArgumentError), ("dcp:", InvalidArgumentError),
    ("a\ud800", InvalidArgumentError), ("latest:" + "s" * 300, InvalidArgumentError),
    ("s" * 300 + "@1", InvalidArgumentError)])
def test_malformed_names(filled, bad, kind):
    with pytest.raises(kind):
        filled.resolve(bad)
    before = [c.id for c in filled.checkpoints()]
    with pytest.raises(kind):
        filled.delete(bad)
    with pytest.raises(kind):
        filled.delete_many([1, bad])                 # checked before anything is deleted
    assert [c.id for c in filled.checkpoints()] == before


def test_long_or_odd_plain_names_are_looked_up_not_rejected(filled):
    for name in ("s" * 600, "a\0b", "ü", 'q"uote', "back\\slash"):
        with pytest.raises(CheckpointNotFound):
            filled.resolve(name)
    filled.checkpoint({"x": b""}, "w", meta=dcp_meta("s" * 600))
    filled.checkpoint({"x": b""}, "ü")
    filled.tag("ü", 'q"uote')
    assert filled.resolve("s" * 600).stream == "w"
    assert filled.resolve('q"uote').stream == "ü" == filled.resolve("ü").stream


def test_delete_many_refuses_a_single_string(filled):
    with pytest.raises(InvalidArgumentTypeError, match="delete\\(name\\)"):
        filled.delete_many("best")
    assert len(filled.checkpoints()) == 5


def test_names_that_look_like_syntax_stay_reachable(store):
    store.checkpoint({"x": b"1"}, "x@2")          # a stream with '@digits'
    store.checkpoint({"x": b"2"}, "latest")       # a stream called latest
    store.checkpoint({"x": b"3"}, "a:b")
    store.checkpoint({"x": b"4"}, "7")            # a stream in digits
    store.tag(1, "v@1")
    store.tag(2, "latest:x")
    assert store.resolve("latest:x@2").id == 1
    assert store.resolve("x@2@1").id == 1         # split at the last '@'
    assert store.resolve("latest").id == 4        # the syntax wins over the stream...
    assert store.resolve("latest:latest").id == 2  # ...which latest:STREAM reaches
    assert store.resolve("a:b").id == 3 == store.resolve("latest:a:b").id
    assert store.resolve("7").id == 4 == store.resolve("latest:7").id
    assert store.resolve("tag:v@1").id == 1
    assert store.resolve("tag:latest:x").id == 2
    with pytest.raises(CheckpointNotFound, match="tag:NAME"):
        store.resolve("v@1")                      # STREAM@SEQ syntax: stream 'v', none


def test_a_reader_resolves_and_a_closed_store_refuses(filled, store_path):
    with snapstore.open(store_path, readonly=True) as reader:
        assert reader.resolve("best").id == 2
        assert reader.restore("train@2") == {"x": b"2"}
    filled.close()
    with pytest.raises(StoreClosedError):
        filled.resolve("best")


def test_ids_latest_and_streams_do_not_scan(filled, monkeypatch):
    def no_scan(*a, **k):
        raise AssertionError("scanned every checkpoint")
    monkeypatch.setattr(IndexView, "checkpoints_mentioning", no_scan)
    monkeypatch.setattr(IndexView, "checkpoint_ids", no_scan)
    assert filled.resolve(3).id == 3
    assert filled.resolve("latest").id == 5
    assert filled.resolve("latest:train").id == 4
    with pytest.raises(AssertionError):
        filled.resolve("best")                    # tags do: nothing indexes them


def test_parse_is_pure():
    assert names.parse(3) == names.Query("id", id=3)
    assert names.parse("a@b@12") == names.Query("seq", stream="a@b", seq=12)
    assert names.parse("a@") == names.Query("any", text="a@")
    assert names.parse("@3") == names.Query("any", text="@3")
    assert names.parse("a@٣") == names.Query("any", text="a@٣")   # non-ASCII digits: a name
    assert names.parse("latest:a@1") == names.Query("stream", stream="a@1")


def test_messages_for_names_that_look_like_other_things(tmp_path):
    with snapstore.open(str(tmp_path / "s"), durability="none") as s:
        s.checkpoint({"x": b"1"}, stream="run@2")
        with pytest.raises(CheckpointNotFound, match="latest:run@2"):
            s.resolve("run@2")                   # the stream "run", seq 2 -- not that stream
        assert s.resolve("latest:run@2").stream == "run@2"
        assert s.resolve("run@2@1").stream == "run@2"
        for call in (lambda: s.read(1, None), lambda: s.layout(1, 5),
                     lambda: s.read_ranges(1, b"x", [(0, 1)])):
            with pytest.raises(InvalidArgumentTypeError, match="buffer name must be a str"):
                call()
        with pytest.raises(snapstore.errors.CorruptionError, match="the store has no chunk"):
            list(s.read_chunks([bytes(32)]))


def test_a_local_stream_whose_checkpoints_were_all_deleted_starts_again(tmp_path):
    """As documented (design.md, Terms): seqs are never reused while the stream has a
    checkpoint; deleting them all ends the stream, and STREAM@1 names the new one."""
    with snapstore.open(str(tmp_path / "s"), durability="none") as s:
        first = s.checkpoint({"x": b"old"}, stream="train")
        second = s.checkpoint({"x": b"two"}, stream="train")
        s.delete(first.id)
        third = s.checkpoint({"x": b"new"}, stream="train")
        assert (second.seq, third.seq) == (2, 3)            # not reused: the stream lives
        with pytest.raises(CheckpointNotFound):
            s.resolve("train@1")
        s.delete_many([second.id, third.id])
        assert "train" not in s.streams()
        again = s.checkpoint({"x": b"again"}, stream="train")
        assert again.seq == 1 and s.resolve("train@1").id == again.id
