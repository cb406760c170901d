"""`ls --where` (snapstore.cli.where) against a plain reference: parse any text without
crashing, and evaluate KEY OP VALUE on generated metas exactly as the documented rules say."""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from snapstore.cli.where import Condition, parse_where
from snapstore.errors import InvalidArgumentError

KEYS = st.sampled_from(["step", "loss", "name", "a", "b"])
SCALARS = st.one_of(
    st.integers(-10**20, 10**20), st.floats(allow_nan=True, allow_infinity=True),
    st.text("0123456789.-abcxyz", max_size=6), st.booleans(), st.none(),
    st.lists(st.integers(-3, 3), max_size=3))
METAS = st.recursive(st.dictionaries(KEYS, SCALARS, max_size=5),
                     lambda inner: st.dictionaries(KEYS, st.one_of(SCALARS, inner),
                                                   max_size=5), max_leaves=12)
VALUES = st.one_of(st.integers(-10**20, 10**20).map(str),
                   st.floats(allow_nan=False, allow_infinity=False).map(repr),
                   st.text("0123456789.-+eabcxyz[],", max_size=6),
                   st.sampled_from(["true", "false", "null", "[]", "[1,2]", "nan", "inf", ""]))
OPS = ["=", "==", "!=", "<", "<=", ">", ">="]


def ref_lookup(meta, path):
    """Keys here have no dots, so a dotted key is a plain path."""
    for part in path.split("."):
        if not isinstance(meta, dict) or part not in meta:
            return KeyError
        meta = meta[part]
    return meta


def ref_number(text):
    if not text or set(text) - set("0123456789+-.eE"):
        return None
    try:
        return int(text) if text.lstrip("+-").isdigit() else float(text)
    except ValueError:
        return None


def ref_eval(meta, key, op, text):
    op = "=" if op == "==" else op
    v = ref_lookup(meta, key)
    if v is KeyError:
        return False
    cmp = {"=": lambda a, b: a == b, "!=": lambda a, b: a != b, "<": lambda a, b: a < b,
           "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}[op]
    if type(v) in (int, float):
        n = ref_number(text)
        if n is None:
            return op == "!="
        if isinstance(v, float) and math.isnan(v):
            return op == "!="
        return cmp(v, n)
    if type(v) is str:
        return cmp(v, text)
    if op == "=":
        return json.dumps(v, separators=(",", ":"), sort_keys=True) == text
    if op == "!=":
        return json.dumps(v, separators=(",", ":"), sort_keys=True) != text
    return False


@settings(max_examples=400, deadline=None)
@given(METAS, st.lists(KEYS, min_size=1, max_size=3).map(".".join), st.sampled_from(OPS),
       VALUES)
def test_evaluation_matches_the_reference(meta, key, op, value):
    if op in ("<", ">", "<=", ">=") and (value.strip()[:1] in ("=", "<", ">", "")):
        with pytest.raises(InvalidArgumentError):    # '<=>', '<<', nothing to compare with
            parse_where(f"{key}{op}{value}")
        return
    cond = parse_where(f"{key}{op}{value}")
    assert cond.key == key and cond.value == value.strip()
    assert cond.matches(meta) is ref_eval(meta, key, op, value.strip())


@settings(max_examples=300, deadline=None)
@given(METAS, st.lists(KEYS, min_size=1, max_size=3).map(".".join))
def test_has_and_not_has(meta, key):
    present = ref_lookup(meta, key) is not KeyError
    assert parse_where(f"has:{key}").matches(meta) is present
    assert parse_where(f"!has:{key}").matches(meta) is (not present)
    for op in ("=", "!=", "<"):     # a missing key never matches a comparison
        if not present:
            assert parse_where(f"{key}{op}1").matches(meta) is False


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=20))
def test_any_text_parses_or_is_a_clear_error(text):
    try:
        cond = parse_where(text)
    except InvalidArgumentError as exc:
        assert "--where" in str(exc) and "KEY OP VALUE" in str(exc)
        return
    assert isinstance(cond, Condition) and cond.key
    assert cond.op in ("=", "!=", "<", "<=", ">", ">=", "has", "!has")
    for c in "=!<>":
        assert c not in cond.key or cond.op in ("has", "!has")
    cond.matches({"a": 1, "b": {"c": "x"}})      # never raises
    cond.matches(None)


def test_examples():
    meta = {"step": 90, "loss": 0.25, "name": "run-a", "cfg": {"lr": 0.1}, "a.b": 1,
            "a": {"b": 2}, "done": True, "tags": ["x"], "big": 2**60 + 1}
    yes = ["step=90", "step==90.0", "step>=90", "step<100", "loss<0.5", "name=run-a",
           "name!=x", "name>run", "cfg.lr=0.1", "has:cfg.lr", "!has:cfg.mom", "a.b=1",
           "done=true", 'tags=["x"]', f"big={2**60 + 1}", "big>1152921504606846976",
           " step >= 90 ", "name!=", "step!=abc"]
    no = ["step>90", "step=abc", "step<abc", "name=x", "missing!=1", "done<1", "has:nope",
          "a.b=2", f"big={2**60}", "name<5e"]
    for e in yes:
        assert parse_where(e).matches(meta), e
    for e in no:
        assert not parse_where(e).matches(meta), e
    assert not parse_where("step=1").matches([1, 2]) and not parse_where("has:x").matches("x")


@pytest.mark.parametrize("text", ["", "  ", "step", "=1", "a!b", "a<>1", "a<=>1", "has:",
                                  "!has:", "<1", "step>", "step >= "])
def test_bad_expressions(text):
    with pytest.raises(InvalidArgumentError, match="invalid --where expression"):
        parse_where(text)
