"""`ls --where EXPR`: conditions on a checkpoint's user meta (pure: parsing and evaluation).

Grammar (spaces around KEY and VALUE are ignored):

    EXPR  := KEY OP VALUE | has:KEY | !has:KEY
    OP    := =  ==  !=  <  <=  >  >=            (= and == are the same)
    KEY   := a meta key, without = ! < >; 'a.b' also finds key b of a dict under key a
             (a key spelled exactly 'a.b' wins; then the shortest prefix naming a dict)
    VALUE := the rest of EXPR, as written (no quotes); empty only after = and !=

Meaning, decided by the meta value's type (a checkpoint without KEY never matches KEY OP
VALUE, != included: use !has:KEY for absence):
  * a number compares numerically with a VALUE that is a number (`step>=100`, `loss<0.5`);
    against any other VALUE it is only unequal;
  * a string compares as text, ordering too (`name!=x`, `date>=2024-05-01`);
  * true, false, null, lists and dicts only with = and !=, against their JSON spelling
    (`done=true`, `tags=["a","b"]`).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from snapstore.errors import InvalidArgumentError

__all__ = ["Condition", "parse_where", "matches_all", "lookup", "MISSING", "GRAMMAR"]

GRAMMAR = "KEY OP VALUE (OP: = != < <= > >=), has:KEY or !has:KEY"
OPS = ("==", "!=", "<=", ">=", "=", "<", ">")       # longest first
_OP_CHARS = "=!<>"
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
MISSING = object()


@dataclass(frozen=True)
class Condition:
    """One --where expression: `op` is one of OPS ('==' normalized to '=') or 'has' / '!has'."""
    key: str
    op: str
    value: str = ""

    def matches(self, meta: Any) -> bool:
        """Whether a checkpoint with this (user) meta satisfies the condition."""
        found = lookup(meta, self.key)
        if self.op == "has":
            return found is not MISSING
        if self.op == "!has":
            return found is MISSING
        if found is MISSING:
            return False
        return compare(found, self.op, self.value)


def parse_where(text: str) -> Condition:
    """The Condition of one --where expression; InvalidArgumentError naming the grammar for
    anything else."""
    if not isinstance(text, str):
        raise InvalidArgumentError(f"a --where expression is text, got {type(text).__name__}")
    t = text.strip()
    for prefix, op in (("has:", "has"), ("!has:", "!has")):
        if t.startswith(prefix):
            key = t[len(prefix):].strip()
            if not key:
                raise _bad(text, f"{prefix} needs a key")
            return Condition(key, op)
    at = next((i for i, c in enumerate(t) if c in _OP_CHARS), None)
    if at is None:
        raise _bad(text, "no operator")
    op = next((o for o in OPS if t.startswith(o, at)), None)
    if op is None:                                      # a lone '!'
        raise _bad(text, f"unknown operator at {t[at:at + 2]!r}")
    key, value = t[:at].strip(), t[at + len(op):].strip()
    if not key:
        raise _bad(text, "no key before the operator")
    if op in ("<", ">", "<=", ">="):
        if value[:1] in ("=", "<", ">"):
            raise _bad(text, f"unknown operator {op + value[:1]!r}")
        if not value:
            raise _bad(text, f"nothing to compare with after {op!r}")
    return Condition(key, "=" if op == "==" else op, value)


def matches_all(conditions, meta: Any) -> bool:
    """True when meta satisfies every condition (True for none)."""
    return all(c.matches(meta) for c in conditions)


def lookup(meta: Any, key: str) -> Any:
    """meta[key] with dotted keys looking into dicts (see the module docstring); MISSING if
    there is none."""
    if not isinstance(meta, dict):
        return MISSING
    if key in meta:
        return meta[key]
    for i, c in enumerate(key):
        if c == "." and isinstance(meta.get(key[:i]), dict):
            found = lookup(meta[key[:i]], key[i + 1:])
            if found is not MISSING:
                return found
    return MISSING


def parse_number(text: str):
    """The int or float VALUE spells, or None when it is not a plain number."""
    if not _NUMBER.fullmatch(text):
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def compare(found: Any, op: str, value: str) -> bool:
    """found OP value for a meta value that exists (op: = != < <= > >=)."""
    if isinstance(found, (int, float)) and not isinstance(found, bool):
        number = parse_number(value)
        if number is None:
            return op == "!="
        return _order(found, op, number)
    if isinstance(found, str):
        return _order(found, op, value)
    if op not in ("=", "!="):
        return False
    same = json.dumps(found, separators=(",", ":"), sort_keys=True, ensure_ascii=False,
                      default=str) == value
    return same if op == "=" else not same


def _order(a, op: str, b) -> bool:
    if op == "=":
        return a == b
    if op == "!=":
        return a != b
    if isinstance(a, float) and math.isnan(a):
        return False
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def _bad(text: str, why: str) -> InvalidArgumentError:
    return InvalidArgumentError(f"invalid --where expression {text!r}: {why} (use {GRAMMAR}, "
                                "e.g. step>=100)")
