"""Retention (issue 15): the pure policy (snapstore.engine.retention) on hand-made cases, and
Store.retain end to end: time rules, dry_run, the prune in the same step, RetainResult, bad
arguments, and the README's training loop staying bounded on disk.
(The policy against a pure-Python reference: tests/property/test_retention_property.py.)"""
from __future__ import annotations

import datetime
import time

import numpy as np
import pytest

import snapstore
from snapstore.bench.measuring import disk_usage
from snapstore.engine import retention as rt
from snapstore.engine.retention import Candidate, Policy, parse_duration, plan
from snapstore.errors import (CheckpointNotFound, InvalidArgumentError, InvalidArgumentTypeError,
                              ReadOnlyError, StoreClosedError)
from snapstore.store import RetainResult

UTC = datetime.timezone.utc
HOUR, DAY = 3600, 86400
T0 = datetime.datetime(2026, 3, 2, 0, 0, tzinfo=UTC).timestamp()     # a Monday, 00:00 UTC


def cands(times, tagged=()):
    """Candidates with ids and seqs 1..n at the given times (seconds after T0)."""
    return [Candidate(i, i, T0 + t, i in tagged) for i, t in enumerate(times, 1)]


# ---- durations --------------------------------------------------------------------------------
@pytest.mark.parametrize("text,seconds", [
    (0, 0), (90, 90), (1.5, 1.5), ("90", 90), ("90s", 90), ("90m", 5400), ("36h", 36 * HOUR),
    ("7d", 7 * DAY), ("2w", 14 * DAY), ("1y", 365 * DAY), ("1d12h", 36 * HOUR),
    (" 1.5h ", 5400), ("1H", HOUR), (datetime.timedelta(hours=2), 2 * HOUR)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "h", "1x", "1mo", "1 d", "-1d", "d1", "1d-", "nan", "inf",
                                 -1, float("nan"), float("inf"), 10 ** 400, "1" * 400 + "y",
                                 datetime.timedelta(seconds=-1)])
def test_parse_duration_rejects(bad):
    with pytest.raises(InvalidArgumentError):
        parse_duration(bad)


@pytest.mark.parametrize("bad", ["6M", "1d6M", "1.5M"])
def test_an_upper_case_m_is_refused_not_read_as_minutes(bad):
    """Units are case-blind ('1H' above), but "6M" reads as six months to many: taken as six
    minutes, a retain would delete everything older than that."""
    with pytest.raises(InvalidArgumentError, match="ambiguous"):
        parse_duration(bad)


@pytest.mark.parametrize("bad", [None, True, [1], b"1d"])
def test_parse_duration_rejects_types(bad):
    with pytest.raises(InvalidArgumentTypeError):
        parse_duration(bad)


# ---- the policy -----------------------------------------------------------------------------
def test_policy_needs_a_rule_and_checks_each():
    for kw in [dict(), dict(keep_tagged=True), dict(keep_tagged=False)]:
        with pytest.raises(InvalidArgumentError, match="at least one keep rule"):
            Policy.of(**kw)
    for name in ("keep_last", "keep_hourly", "keep_daily", "keep_weekly", "keep_monthly",
                 "keep_yearly"):
        for bad in (-1, 1.5, "2", True):
            with pytest.raises(InvalidArgumentError, match=name):
                Policy.of(**{name: bad})
        # 0 is a rule (keeps none) beside one that keeps some; alone it is refused
        assert getattr(Policy.of(**{name: 0, "keep_every": 5}), name) == 0
    with pytest.raises(InvalidArgumentError, match="keep_every"):
        Policy.of(keep_every=0)
    with pytest.raises(InvalidArgumentError, match="keep_within"):
        Policy.of(keep_within="7 days")
    with pytest.raises(InvalidArgumentTypeError, match="tz"):
        Policy.of(keep_last=1, tz="UTC")
    with pytest.raises(InvalidArgumentTypeError, match="keep_tagged"):
        Policy.of(keep_last=1, keep_tagged="yes")


def test_a_policy_that_keeps_nothing_is_refused():
    """keep_last=0 (or any count of 0) with no other rule would delete every untagged
    checkpoint, the newest too: a typo (--keep-last 0 for 10) must not wipe a stream, as
    restic treats an all-zero policy as none."""
    for rules in (dict(keep_last=0), dict(keep_hourly=0, keep_daily=0),
                  dict(keep_last=0, keep_tagged=False)):
        with pytest.raises(InvalidArgumentError, match="keeps nothing"):
            Policy.of(**rules)
    Policy.of(keep_last=0, keep_daily=1)          # another rule keeps some: fine


def test_plan_empty_and_one():
    for rules in (dict(keep_last=1), dict(keep_daily=3), dict(keep_within=0)):
        assert plan([], Policy.of(**rules)) == {}
    one = cands([5])
    # no rule keeps the only checkpoint: it is the stream's head, which always stays
    assert plan(one, Policy.of(keep_last=0, keep_every=2)) == {1: ["newest"]}
    assert plan(one, Policy.of(keep_last=5)) == {1: ["last"]}
    assert plan(one, Policy.of(keep_within=0)) == {1: ["within"]}
    assert plan(one, Policy.of(keep_yearly=1, tz=UTC)) == {1: ["yearly"]}


def test_plan_keep_last_more_than_there_are_keeps_all():
    c = cands([0, 1, 2])
    assert plan(c, Policy.of(keep_last=10)) == {1: ["last"], 2: ["last"], 3: ["last"]}


def test_plan_daily_keeps_newest_of_each_of_the_last_days_with_checkpoints():
    # day 0: 3 checkpoints, day 1: none, day 2: 2, day 5: 1
    times = [1 * HOUR, 5 * HOUR, 23 * HOUR, 2 * DAY + HOUR, 2 * DAY + 2 * HOUR, 5 * DAY]
    c = cands(times)
    assert plan(c, Policy.of(keep_daily=2, tz=UTC)) == {5: ["daily"], 6: ["daily"]}
    assert plan(c, Policy.of(keep_daily=3, tz=UTC)) == {3: ["daily"], 5: ["daily"],
                                                         6: ["daily"]}
    assert set(plan(c, Policy.of(keep_daily=99, tz=UTC))) == {3, 5, 6}
    assert plan(c, Policy.of(keep_hourly=4, tz=UTC)) == {
        3: ["hourly"], 4: ["hourly"], 5: ["hourly"], 6: ["hourly"]}
    # weeks start on Monday (ISO): T0 is a Monday, day 5 is the same week
    assert plan(c, Policy.of(keep_weekly=5, tz=UTC)) == {6: ["weekly"]}
    assert plan(c, Policy.of(keep_monthly=1, keep_yearly=1, tz=UTC)) == {6: ["monthly",
                                                                              "yearly"]}


def test_plan_weekly_monthly_yearly_boundaries():
    sunday_late = 6 * DAY + 23 * HOUR               # Sunday 23:00, week 10
    monday = 7 * DAY                                # next Monday 00:00, week 11
    c = cands([sunday_late, monday])
    assert set(plan(c, Policy.of(keep_weekly=2, tz=UTC))) == {1, 2}
    assert set(plan(c, Policy.of(keep_weekly=1, tz=UTC))) == {2}
    eom = datetime.datetime(2026, 3, 31, 23, 59, tzinfo=UTC).timestamp() - T0
    nye = datetime.datetime(2026, 12, 31, 23, 0, tzinfo=UTC).timestamp() - T0
    ny = datetime.datetime(2027, 1, 1, 1, 0, tzinfo=UTC).timestamp() - T0
    c = cands([0, eom, eom + 120, nye, ny])
    assert set(plan(c, Policy.of(keep_monthly=10, tz=UTC))) == {2, 3, 4, 5}
    assert set(plan(c, Policy.of(keep_yearly=10, tz=UTC))) == {4, 5}


def test_plan_time_zone_moves_the_day_boundary():
    c = cands([22 * HOUR, 23 * HOUR + 30 * 60])     # Monday 22:00 and 23:30 UTC
    assert set(plan(c, Policy.of(keep_daily=2, tz=UTC))) == {2}
    plus1 = datetime.timezone(datetime.timedelta(hours=1))   # 23:00 Monday, 00:30 Tuesday
    assert set(plan(c, Policy.of(keep_daily=2, tz=plus1))) == {1, 2}


@pytest.mark.skipif(not hasattr(time, "tzset"), reason="needs time.tzset")
def test_plan_default_is_local_time(monkeypatch):
    c = cands([22 * HOUR, 23 * HOUR + 30 * 60])
    monkeypatch.setenv("TZ", "Asia/Kolkata")        # UTC+5:30, no DST
    time.tzset()
    try:
        if time.localtime(T0).tm_gmtoff != 19800:
            pytest.skip("no time zone database")
        # 03:30 and 05:00 Tuesday local: one day, one kept
        assert set(plan(c, Policy.of(keep_daily=2))) == {2}
        c2 = cands([18 * HOUR, 19 * HOUR])          # 23:30 Monday and 00:30 Tuesday local
        assert set(plan(c2, Policy.of(keep_daily=2))) == {1, 2}
        assert set(plan(c2, Policy.of(keep_daily=2, tz=UTC))) == {2}
    finally:
        monkeypatch.undo()
        time.tzset()


def test_plan_within_is_measured_from_the_newest_checkpoint_not_now():
    c = cands([0, DAY, 2 * DAY, 3 * DAY])           # in 2026: long ago or far ahead, no matter
    assert set(plan(c, Policy.of(keep_within="1d"))) == {3, 4}       # >= newest - 1d
    assert set(plan(c, Policy.of(keep_within=DAY - 1))) == {4}
    assert set(plan(c, Policy.of(keep_within="1y"))) == {1, 2, 3, 4}


def test_plan_reasons_list_every_rule_in_order_and_tags():
    c = cands([0, HOUR, 2 * HOUR, 3 * HOUR], tagged={1})
    got = plan(c, Policy.of(keep_last=1, keep_every=2, keep_within="1h", keep_hourly=1,
                            keep_daily=1, tz=UTC))
    assert got == {1: ["tagged"], 2: ["every"], 3: ["within"],
                   4: ["last", "every", "within", "hourly", "daily"]}
    assert 1 not in plan(c, Policy.of(keep_last=1, keep_tagged=False))
    assert list(rt.RULES) == ["last", "every", "within", "hourly", "daily", "weekly",
                              "monthly", "yearly", "tagged", "newest"]


def test_plan_period_rules_follow_time_not_seq_when_the_clock_went_back():
    # seq 3 was taken after a clock step back: by time it is the oldest
    c = [Candidate(1, 1, T0 + 10 * HOUR, False), Candidate(2, 2, T0 + 30 * HOUR, False),
         Candidate(3, 3, T0 + 1 * HOUR, False)]
    # (the head, seq 3, stays all the same: "newest")
    assert plan(c, Policy.of(keep_daily=1, tz=UTC)) == {2: ["daily"], 3: ["newest"]}
    assert set(plan(c, Policy.of(keep_last=1))) == {3}


# ---- Store.retain -----------------------------------------------------------------------------
def data(i, seed=0, size=64 << 10):
    return np.random.default_rng([seed, i]).integers(0, 256, size, dtype=np.uint8).tobytes()


DATA = [data(i) for i in range(8)]


def fill(s, n, stream="t", seed=0):
    """n checkpoints of 64 KiB random bytes (data(i, seed)) in stream."""
    return [s.checkpoint({"a": data(i, seed)}, stream) for i in range(n)]


def test_retain_result_is_the_old_list_plus_a_report(store):
    infos = fill(store, 6)
    r = store.retain("t", keep_last=2, keep_every=3)
    assert isinstance(r, RetainResult) and isinstance(r, list)
    assert r == [infos[i].id for i in (0, 1, 3)] == r.deleted
    assert r.kept == {infos[2].id: ["every"], infos[4].id: ["last"],
                      infos[5].id: ["last", "every"]}
    assert not r.dry_run
    assert r.compaction is not None and r.compaction["bytes_returned"] > 0
    assert r.bytes_freed == r.bytes_before - r.bytes_after > 3 * (64 << 10) * 0.9
    st = store.stats()
    assert r.bytes_after == st["segment_bytes"] + st["index_bytes"]
    rep = r.report()
    assert rep["deleted"] == list(r) and rep["bytes_freed"] == r.bytes_freed
    assert rep["kept"] == {str(k): v for k, v in r.kept.items()}
    assert [c.id for c in store.checkpoints("t")] == [infos[i].id for i in (2, 4, 5)]
    assert store.verify(deep=True)["ok"]
    for i in (2, 4, 5):
        assert store.restore(infos[i].id) == {"a": DATA[i]}


def test_retain_twice_second_run_deletes_nothing_and_does_not_prune(store):
    fill(store, 5)
    first = store.retain("t", keep_last=2)
    assert len(first) == 3 and first.compaction is not None
    again = store.retain("t", keep_last=2)
    assert again == [] and again.compaction is None and again.bytes_freed == 0


def test_retain_dry_run_deletes_nothing_and_predicts_the_real_run(store):
    infos = fill(store, 7)
    store.tag(infos[0].id, "keep")
    rules = dict(keep_last=2, keep_every=3, keep_within=0, keep_daily=1)
    before = store.checkpoints("t")
    dry = store.retain("t", dry_run=True, **rules)
    assert dry.dry_run and dry.bytes_after is None and dry.bytes_freed is None
    assert dry.compaction is None
    assert store.checkpoints("t") == before
    real = store.retain("t", **rules)
    assert list(real) == list(dry) and real.kept == dry.kept and len(real) == 3
    assert dry.kept[infos[0].id] == ["tagged"]


def test_retain_dry_run_works_read_only_and_a_real_run_does_not(store_path):
    with snapstore.open(store_path, durability="none") as s:
        fill(s, 3)
    with snapstore.open(store_path, readonly=True) as r:
        assert len(r.retain("t", keep_last=1, dry_run=True)) == 2
        with pytest.raises(ReadOnlyError):
            r.retain("t", keep_last=1)
        assert len(r.checkpoints("t")) == 3


def test_retain_no_prune_leaves_space_for_compact(store):
    fill(store, 4)
    r = store.retain("t", keep_last=1, prune=False)
    assert len(r) == 3 and r.compaction is None
    assert r.bytes_freed < (64 << 10)                  # nothing came back yet
    assert store.compact()["bytes_returned"] > 3 * (64 << 10) * 0.9


def test_retain_time_rules_on_a_real_store(store):
    infos = fill(store, 4)
    assert store.retain("t", keep_within="1h", dry_run=True) == []
    assert store.retain("t", keep_daily=1, dry_run=True) == [c.id for c in infos[:3]]
    assert store.retain("t", keep_within=0, keep_yearly=1, tz=datetime.timezone.utc) \
        == [c.id for c in infos[:3]]
    assert [c.id for c in store.checkpoints("t")] == [infos[3].id]


def test_retain_keeps_other_streams_and_tolerates_unknown_and_empty(store):
    a = fill(store, 3, "a")
    b = fill(store, 3, "b", seed=1)
    r = store.retain("no-such-stream", keep_last=1)
    assert r == [] and r.kept == {} and r.compaction is None
    assert store.retain("a", keep_last=1) == [c.id for c in a[:-1]]
    assert [c.id for c in store.checkpoints("b")] == [c.id for c in b]
    assert [c.id for c in store.checkpoints("a")] == [a[-1].id]
    assert store.retain("a", keep_last=1) == []      # nothing more to delete
    assert store.verify(deep=True)["ok"]


def test_retain_all_kept(store):
    infos = fill(store, 3)
    r = store.retain("t", keep_last=3)
    assert r == [] and set(r.kept) == {c.id for c in infos} and r.compaction is None


def test_retain_bad_values_delete_nothing(store):
    fill(store, 3)
    bad = [dict(), dict(keep_tagged=False), dict(keep_daily=-1), dict(keep_hourly=1.0),
           dict(keep_within="soon"), dict(keep_within=-5), dict(keep_weekly="1"),
           dict(keep_last=1, dry_run="no"), dict(keep_last=1, prune=2),
           dict(keep_last=1, tz="Europe/Paris"), dict(keep_monthly=True)]
    for kw in bad:
        with pytest.raises(InvalidArgumentError):
            store.retain("t", **kw)
    assert len(store.checkpoints("t")) == 3


def test_retain_after_close_is_a_clear_error(store_path):
    s = snapstore.open(store_path, durability="none")
    fill(s, 2)
    s.close()
    for kw in (dict(keep_last=1), dict(keep_last=1, dry_run=True)):
        with pytest.raises(StoreClosedError, match="closed"):
            s.retain("t", **kw)


def test_retain_passes_over_a_doomed_checkpoint_that_vanished(store, monkeypatch):
    """A checkpoint retain chose that is gone by its delete (another writer deleted it) is
    passed over, the rest deleted: the policy's outcome. (It raised CheckpointNotFound, and
    deleted nothing: a retain racing another failed for a name its caller never gave.)"""
    infos = fill(store, 4)
    real_checkpoints = store.checkpoints

    def stale(stream=None):        # the snapshot still lists infos[0]; it is already gone
        out = real_checkpoints(stream)
        store.delete(infos[0].id)
        return out
    monkeypatch.setattr(store, "checkpoints", stale)
    store.retain("t", keep_last=1)
    monkeypatch.undo()
    assert [c.id for c in store.checkpoints("t")] == [infos[3].id]


# ---- the README's training loop ----------------------------------------------------------
def readme_loop(path, prune, saves=12, keep_last=3, size=2 << 20):
    """store.save of a dense state (every byte changes), retain(keep_last) after each save;
    returns the store's bytes on disk after each retain."""
    rng = np.random.default_rng(1)
    w = np.empty(size, dtype=np.uint8)
    sizes = []
    with snapstore.open(path, durability="none") as s:
        for step in range(saves):
            w[:] = rng.integers(0, 256, size, dtype=np.uint8)
            s.save({"w": w, "step": step}, "train")
            s.retain("train", keep_last=keep_last, prune=prune)
            sizes.append(disk_usage(path))
        assert len(s.checkpoints("train")) == keep_last
        assert np.array_equal(s.load("train")["w"], w)
    return sizes


def test_readme_training_loop_stays_bounded(tmp_path):
    state, keep_last = 2 << 20, 3
    sizes = readme_loop(str(tmp_path / "pruned"), prune=True)
    # compact()'s default (threshold 0.5) rewrites a segment once less than half of it is
    # live: at most 2x the kept checkpoints, plus the index; and no growth with more saves
    bound = (2 * keep_last + 0.5) * state + (1 << 20)
    assert max(sizes) <= bound, [s / state for s in sizes]
    assert max(sizes[-4:]) <= max(sizes[:8]) + (256 << 10)
    grown = readme_loop(str(tmp_path / "unpruned"), prune=False)
    assert grown[-1] > 11 * state > bound        # what the loop did before retain pruned


def test_retain_waits_for_a_running_compaction_before_deleting_anything(tmp_path):
    """retain's prune needs the maintenance lock (one compaction at a time): it takes it
    before its deletes, so a running compaction (here: its lock held) makes retain fail with
    StoreLocked having deleted nothing, not delete and then fail to prune."""
    import fcntl
    import os

    import snapstore
    from snapstore.engine import format as fmt
    from snapstore.errors import StoreLocked
    path = str(tmp_path / "s")
    with snapstore.open(path) as s:
        for i in range(4):
            s.checkpoint({"x": bytes([i]) * 5000}, stream="a")
        fd = os.open(os.path.join(path, fmt.MAINTENANCE_LOCK_FILE), os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)              # "a compaction is running"
            with pytest.raises(StoreLocked):
                s.retain("a", keep_last=1)
            assert len(s.checkpoints("a")) == 4
            assert s.retain("a", keep_last=1, prune=False) == [1, 2, 3]   # no lock needed
        finally:
            os.close(fd)
        r = s.retain("a", keep_last=1)
        assert list(r) == [] and len(s.checkpoints("a")) == 1


def test_a_retain_racing_another_delete_of_its_checkpoints_passes_them_over(tmp_path,
                                                                             monkeypatch):
    """Regression (a helper's chaos run: 4.5% of retains racing another retain): a checkpoint
    retain chose that another writer deleted before retain's delete made the whole retain
    raise CheckpointNotFound, naming an id the caller never gave, and delete nothing. The ones
    still there are deleted now; delete_many keeps its all-or-none rule."""
    import snapstore
    from snapstore.errors import CheckpointNotFound
    from snapstore.store import Store
    path = str(tmp_path / "s")
    with snapstore.open(path, durability="none") as s, \
            snapstore.open(path, durability="none") as other:
        ids = [s.checkpoint({"a": bytes([k]) * 100}, "s").id for k in range(6)]
        real = Store._delete_many

        def raced(self, names, *args, **kwargs):
            names = list(names)
            if self is s:
                other.delete(ids[1])                 # gone before retain's own delete
            return real(self, names, *args, **kwargs)
        monkeypatch.setattr(Store, "_delete_many", raced)
        result = s.retain("s", keep_last=2, prune=False)
        monkeypatch.undo()
        assert sorted(result.deleted) == ids[:4]
        assert [c.id for c in s.checkpoints("s")] == ids[4:]
        for cid in ids[4:]:
            assert s.restore(cid) == {"a": bytes([ids.index(cid)]) * 100}
        with pytest.raises(CheckpointNotFound):
            s.delete_many([ids[4], ids[0]])          # all or none, as documented
        assert [c.id for c in s.checkpoints("s")] == ids[4:]


def test_the_head_always_stays_even_when_no_rule_keeps_it():
    """keep_every=K alone on a stream of fewer than K checkpoints kept none of them: retain
    deleted the whole stream, its newest checkpoint too (docs: "the newest stays")."""
    c = cands([0, HOUR, 2 * HOUR])
    assert plan(c, Policy.of(keep_every=5)) == {3: ["newest"]}
    assert plan(c, Policy.of(keep_every=2)) == {2: ["every"], 3: ["newest"]}
    assert plan(c, Policy.of(keep_every=3)) == {3: ["every"]}
    # a clock that went back: by time seq 3 is the oldest, yet it is the head
    back = [Candidate(1, 1, T0 + 2 * HOUR, False), Candidate(2, 2, T0 + 3 * HOUR, False),
            Candidate(3, 3, T0, False)]
    assert plan(back, Policy.of(keep_within="30m")) == {2: ["within"], 3: ["newest"]}


def test_retain_keep_every_alone_keeps_the_head(tmp_path):
    with snapstore.open(str(tmp_path / "s")) as store:
        ids = [store.checkpoint({"b": bytes([i]) * 10}, stream="s").id for i in range(3)]
        for dry_run in (True, False):
            r = store.retain("s", keep_every=5, dry_run=dry_run)
            assert list(r) == ids[:2] and r.kept == {ids[2]: ["newest"]}
        assert [c.id for c in store.checkpoints("s")] == [ids[2]]
        assert store.restore(store.latest("s").id)["b"] == bytes([2]) * 10
        assert list(store.retain("s", keep_every=5)) == []     # the same call twice


def test_compact_and_retain_in_two_threads_of_one_store_do_not_deadlock(tmp_path,
                                                                         monkeypatch):
    """compact() took the Store's writer lock, then the maintenance lock; retain() takes the
    maintenance lock, then (deleting) the writer lock. A compact() in one thread waiting for
    a retain()'s maintenance lock held the writer lock the retain waited for: both stalled for
    the store's timeout (for ever with float("inf")), and every write of the Store with them.
    Now compact() takes the maintenance lock first: it waits for the retain, which goes on."""
    import threading
    with snapstore.open(str(tmp_path / "s"), timeout=20) as store:
        for i in range(3):
            store.checkpoint({"b": data(i)}, stream="r")
        retaining, compacting = threading.Event(), threading.Event()
        real_delete_many = store._delete_many

        def delete_many_once_compact_waits(*args, **kwargs):
            retaining.set()
            assert compacting.wait(10)
            time.sleep(0.3)                     # the compact() is waiting for a lock now
            return real_delete_many(*args, **kwargs)

        monkeypatch.setattr(store, "_delete_many", delete_many_once_compact_waits)
        outcome: dict = {}

        def run(name, call):
            try:
                outcome[name] = call()
            except BaseException as exc:        # noqa: BLE001 (reported below)
                outcome[name] = exc

        retain = threading.Thread(target=run, args=("retain", lambda: store.retain(
            "r", keep_last=1)))
        retain.start()
        assert retaining.wait(10)
        compact = threading.Thread(target=run, args=("compact", store.compact))
        compact.start()
        compacting.set()
        started = time.monotonic()
        retain.join(15)
        compact.join(15)
        assert not retain.is_alive() and not compact.is_alive()
        assert time.monotonic() - started < 15
        assert isinstance(outcome["retain"], list) and len(outcome["retain"]) == 2, outcome
        assert isinstance(outcome["compact"], dict), outcome
        assert store.restore(store.latest("r").id)["b"] == data(2)
