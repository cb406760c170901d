"""Retention policy: which checkpoints of a stream a set of keep rules keeps, and why.

Pure: no store, no clock. Input: the stream's checkpoints as Candidates (id, seq, created,
tagged) and a Policy; output: {id: [rule, ...]} for every checkpoint some rule keeps (the rest
go). Store.retain (store.py) does the snapshot, the deletes and the prune.

Rules (a checkpoint is kept if any rule keeps it; docs/design.md, "Retention"):
  keep_last=N     the N newest (highest seq);
  keep_every=K    those whose seq is a multiple of K (stable: a second run deletes nothing);
  keep_within=D   those created at most D before the stream's newest checkpoint (restic's
                  meaning: measured from the newest checkpoint, not from now, so a stream that
                  stopped long ago never loses everything to it); D is seconds or a string
                  like "90m", "36h", "7d", "2w", "1y", "1d12h" (DURATION_UNITS);
  keep_hourly/daily/weekly/monthly/yearly=N
                  for each of the last N periods (hour, day, ISO week, month, year) that have
                  checkpoints, the newest checkpoint of that period (restic's meaning);
                  periods are calendar periods of `tz` (None: the local time zone, as restic
                  and borg do); newest and "last" are by creation time, ties by seq;
  keep_tagged     tagged ones.
And always: the stream's newest checkpoint by seq (its head, the state it resumes from) stays,
as "newest" when no rule kept it (keep_every=K alone on a stream of fewer than K checkpoints,
or a clock that went back under keep_within or a calendar rule).
"""
from __future__ import annotations

import datetime
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple

from snapstore.engine.validation import validate_flag, validate_int
from snapstore.errors import InvalidArgumentError, InvalidArgumentTypeError

# Units of a duration string; no months (their length varies, and "m" is minutes).
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([a-z])")

# The calendar rules: name -> period key of a local datetime.
PERIODS: dict[str, Callable[[datetime.datetime], tuple]] = {
    "hourly": lambda t: (t.year, t.month, t.day, t.hour),
    "daily": lambda t: (t.year, t.month, t.day),
    "weekly": lambda t: tuple(t.isocalendar())[:2],       # ISO year and week
    "monthly": lambda t: (t.year, t.month),
    "yearly": lambda t: (t.year,),
}
# Every rule that keeps a checkpoint, in the order reasons are listed.
RULES = ("last", "every", "within", *PERIODS, "tagged", "newest")


class Candidate(NamedTuple):
    """One checkpoint of the stream, as the policy sees it."""
    id: int
    seq: int
    created: float       # seconds since the epoch
    tagged: bool


def parse_duration(value: Any, what: str = "keep_within") -> float:
    """Seconds of a duration: a number of seconds >= 0, a datetime.timedelta, or a string of
    <number><unit> parts ("90m", "36h", "7d", "2w", "1y", "1d12h"; units DURATION_UNITS; a
    bare number string is seconds). InvalidArgumentError otherwise."""
    if isinstance(value, datetime.timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidArgumentTypeError(f"{what} must be seconds or a duration string such as "
                                       f"'36h' or '7d', got {type(value).__name__}")
    elif isinstance(value, str):
        seconds = _parse_duration_text(value, what)
    else:
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0:
        raise InvalidArgumentError(f"{what} must be a finite duration >= 0, got {value!r}")
    return seconds


def _parse_duration_text(text: str, what: str) -> float:
    if re.search(r"\dM", text):
        # units are case-blind ('7D' is 7 days), but an upper-case M reads as months, which
        # would silently keep 6 minutes where "6M" meant half a year
        raise InvalidArgumentError(
            f"{what} {text!r}: 'M' is ambiguous (minutes are 'm', and there are no months: "
            "use days, e.g. '180d')")
    s = text.strip().lower()
    try:
        return float(s) if re.fullmatch(r"\d+(\.\d*)?|\.\d+", s) else _sum_parts(s)
    except (ValueError, OverflowError):
        units = ", ".join(f"{u}" for u in DURATION_UNITS)
        raise InvalidArgumentError(
            f"{what} {text!r} is not a duration: use seconds or <number><unit> parts such "
            f"as '90m', '36h', '7d', '2w', '1y', '1d12h' (units: {units}; no months)") from None


def _sum_parts(s: str) -> float:
    parts = list(_DURATION_PART.finditer(s))
    if not parts or "".join(p.group(0) for p in parts) != s:
        raise ValueError(s)
    total = 0.0
    for p in parts:
        if p.group(2) not in DURATION_UNITS:
            raise ValueError(s)
        total += float(p.group(1)) * DURATION_UNITS[p.group(2)]
    return total


@dataclass(frozen=True)
class Policy:
    """Validated keep rules (None: the rule is not used). Build with Policy.of()."""
    keep_last: int | None = None
    keep_every: int | None = None
    keep_within: float | None = None
    keep_hourly: int | None = None
    keep_daily: int | None = None
    keep_weekly: int | None = None
    keep_monthly: int | None = None
    keep_yearly: int | None = None
    keep_tagged: bool = True
    tz: datetime.tzinfo | None = None

    @classmethod
    def of(cls, *, keep_last=None, keep_every=None, keep_within=None, keep_hourly=None,
           keep_daily=None, keep_weekly=None, keep_monthly=None, keep_yearly=None,
           keep_tagged=True, tz=None) -> "Policy":
        """Checks every rule (InvalidArgumentError with the rule's name); at least one rule
        other than keep_tagged that keeps something is required (a count of 0 keeps nothing),
        so a typo cannot wipe a stream."""
        counts = {"keep_last": keep_last, "keep_hourly": keep_hourly, "keep_daily": keep_daily,
                  "keep_weekly": keep_weekly, "keep_monthly": keep_monthly,
                  "keep_yearly": keep_yearly}
        for name, value in counts.items():
            if value is not None:
                validate_int(value, name, 0)
        if keep_every is not None:
            validate_int(keep_every, "keep_every", 1)
        if keep_within is not None:
            keep_within = parse_duration(keep_within)
        if tz is not None and not isinstance(tz, datetime.tzinfo):
            raise InvalidArgumentTypeError(f"tz must be a datetime.tzinfo or None (local time), "
                                           f"got {type(tz).__name__}")
        if all(v is None for v in (*counts.values(), keep_every, keep_within)):
            raise InvalidArgumentError(
                "retain needs at least one keep rule: keep_last, keep_every, keep_within, "
                "keep_hourly, keep_daily, keep_weekly, keep_monthly or keep_yearly")
        if keep_every is None and keep_within is None and not any(counts.values()):
            zero = ", ".join(f"{name}=0" for name, v in counts.items() if v == 0)
            raise InvalidArgumentError(
                f"retain with {zero} and no other rule keeps nothing: it would delete every "
                "untagged checkpoint of the stream, its newest too; give a rule that keeps "
                "some (keep_last=1 or more), or delete them with delete_many (`snapstore rm`)")
        return cls(keep_last, keep_every, keep_within, keep_hourly, keep_daily, keep_weekly,
                   keep_monthly, keep_yearly, validate_flag(keep_tagged, "keep_tagged"), tz)

    def period_counts(self) -> dict[str, int]:
        """{period rule: N} of the calendar rules in use."""
        return {name: n for name in PERIODS
                if (n := getattr(self, f"keep_{name}")) is not None}


def period_key(created: float, name: str, tz: datetime.tzinfo | None) -> tuple:
    """The calendar period (PERIODS[name]) a time falls in, in tz (None: local time). A time
    the platform cannot convert falls in one period of its own kind, (), never an error."""
    try:
        return PERIODS[name](datetime.datetime.fromtimestamp(created, tz))
    except (OverflowError, OSError, ValueError):
        return ()


def plan(candidates: Iterable[Candidate], policy: Policy) -> dict[int, list[str]]:
    """{id: [rules that keep it]} (rules in RULES order) for every kept candidate; a candidate
    not in the result goes."""
    cands = list(candidates)
    reasons: dict[int, list[str]] = {}

    def keep(c: Candidate, rule: str) -> None:
        reasons.setdefault(c.id, []).append(rule)

    by_seq = sorted(cands, key=lambda c: c.seq)
    by_time = sorted(cands, key=lambda c: (c.created, c.seq), reverse=True)   # newest first
    last = {c.id for c in by_seq[max(0, len(by_seq) - policy.keep_last):]} \
        if policy.keep_last else set()
    within_from = None
    if policy.keep_within is not None and cands:
        within_from = by_time[0].created - policy.keep_within
    periods = policy.period_counts()
    by_period: dict[str, set] = {}
    for name, n in periods.items():
        kept: set = set()
        previous = None
        for c in by_time:
            if len(kept) >= n:
                break
            key = period_key(c.created, name, policy.tz)
            if key != previous:
                kept.add(c.id)
                previous = key
        by_period[name] = kept
    for c in by_seq:
        if c.id in last:
            keep(c, "last")
        if policy.keep_every and c.seq % policy.keep_every == 0:
            keep(c, "every")
        if within_from is not None and c.created >= within_from:
            keep(c, "within")
        for name in periods:
            if c.id in by_period[name]:
                keep(c, name)
        if policy.keep_tagged and c.tagged:
            keep(c, "tagged")
    if by_seq and by_seq[-1].id not in reasons:
        keep(by_seq[-1], "newest")
    return reasons
