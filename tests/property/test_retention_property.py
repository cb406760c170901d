"""The retention policy (snapstore.engine.retention.plan) against a simple, obviously correct
reference: each rule written out on its own from its definition, with its own calendar
arithmetic (fixed-offset time zones: day = floor(local seconds / 86400), ISO week from the
day number, month and year from a proleptic calendar date).

Checkpoints are random: seqs increasing with gaps (deletes), times at random scales (minutes
to years) and not always in seq order (clock steps), random tags; rules random.
SNAPSTORE_HYPOTHESIS_PROFILE=slow runs 10x more examples."""
from __future__ import annotations

import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapstore.engine.retention import RULES, Candidate, Policy, plan
from snapstore.errors import InvalidArgumentError

EPOCH = datetime.datetime(1970, 1, 1)


def examples(n: int) -> int:
    return max(1, n * settings.default.max_examples // 100)


def period(created: float, offset: int, name: str) -> tuple:
    local = created + offset
    if name == "hourly":
        return ("h", local // 3600)
    day = local // 86400
    if name == "daily":
        return ("d", day)
    if name == "weekly":
        return ("w", (day + 3) // 7)       # day 0 (1970-01-01) is a Thursday; weeks start Monday
    date = EPOCH + datetime.timedelta(days=day)
    return ("m", date.year, date.month) if name == "monthly" else ("y", date.year)


def reference(cands: list, rules: dict, offset: int) -> dict:
    keep: dict = {}

    def add(ids, rule):
        for i in ids:
            keep.setdefault(i, set()).add(rule)

    if rules.get("keep_last"):
        add([c.id for c in sorted(cands, key=lambda c: c.seq)][-rules["keep_last"]:], "last")
    if rules.get("keep_every"):
        add([c.id for c in cands if c.seq % rules["keep_every"] == 0], "every")
    if rules.get("keep_within") is not None and cands:
        newest = max(c.created for c in cands)
        add([c.id for c in cands if c.created >= newest - rules["keep_within"]], "within")
    for name in ("hourly", "daily", "weekly", "monthly", "yearly"):
        n = rules.get(f"keep_{name}")
        if not n:
            continue
        groups: dict = {}
        for c in cands:
            groups.setdefault(period(c.created, offset, name), []).append(c)
        for key in sorted(groups, reverse=True)[:n]:          # the n latest periods
            add([max(groups[key], key=lambda c: (c.created, c.seq)).id], name)
    if rules.get("keep_tagged", True):
        add([c.id for c in cands if c.tagged], "tagged")
    if cands:
        head = max(cands, key=lambda c: c.seq).id
        if head not in keep:
            add([head], "newest")
    return {i: [r for r in RULES if r in why] for i, why in keep.items()}


@st.composite
def candidates(draw):
    n = draw(st.integers(0, 25))
    seqs, seq = [], 0
    for _ in range(n):
        seq += draw(st.integers(1, 3))
        seqs.append(seq)
    scale = draw(st.sampled_from([1, 60, 3600, 86400, 7 * 86400, 31 * 86400, 365 * 86400]))
    base = draw(st.integers(0, 2_000_000_000))
    t, times = float(base), []
    for _ in range(n):
        if draw(st.integers(0, 9)) == 0:
            t -= draw(st.integers(0, 3)) * scale            # the clock went back
        else:
            t += draw(st.integers(0, 3)) * scale + draw(st.sampled_from([0, 0.5, 59]))
        times.append(max(t, 0.0))
    tagged = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    ids = draw(st.permutations(range(1, n + 1))) if n else []
    return [Candidate(i, s, c, g) for i, s, c, g in zip(ids, seqs, times, tagged)]


COUNT = st.one_of(st.none(), st.integers(0, 6))
RULES_ST = st.fixed_dictionaries({
    "keep_last": COUNT, "keep_every": st.one_of(st.none(), st.integers(1, 5)),
    "keep_within": st.one_of(st.none(), st.sampled_from([0, 1, 59.5, 3600, 86400, 7 * 86400])),
    "keep_hourly": COUNT, "keep_daily": COUNT, "keep_weekly": COUNT, "keep_monthly": COUNT,
    "keep_yearly": COUNT, "keep_tagged": st.booleans()})


@settings(max_examples=examples(500))
@given(cands=candidates(), rules=RULES_ST,
       offset=st.sampled_from([0, 3600, -5 * 3600, 19800, 13 * 3600, -12 * 3600]))
def test_plan_matches_reference(cands, rules, offset):
    if all(v is None for k, v in rules.items() if k != "keep_tagged"):
        rules["keep_last"] = 1
    if rules["keep_every"] is None and rules["keep_within"] is None and \
            not any(v for k, v in rules.items() if k.startswith("keep_") and k != "keep_tagged"):
        with pytest.raises(InvalidArgumentError, match="keeps nothing"):   # all counts 0
            Policy.of(**rules)
        return
    tz = datetime.timezone(datetime.timedelta(seconds=offset))
    got = plan(cands, Policy.of(tz=tz, **rules))
    assert got == reference(cands, rules, offset)
    # a second run over what the first kept keeps all of it, for the same reasons: each rule
    # keeps from the survivors what it kept from all (the newest stays, so does each of the
    # N latest periods' newest, the N highest seqs, the multiples, the tagged)
    assert set(got) <= {c.id for c in cands}
    survivors = [c for c in cands if c.id in got]
    assert plan(survivors, Policy.of(tz=tz, **rules)) == got
