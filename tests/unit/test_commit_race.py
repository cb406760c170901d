"""Two writer processes racing on one stream (docs/design.md, "Many writers", "Conflicts").

Round after round both processes read the stream's head H, meet at a barrier, and commit onto
H at the same moment, in one of these ways (modes cycle, so every run has all of them):

    expect   checkpoint(expect_head=H): a compare-and-swap on the head
    planned  checkpoint() with the default expect_head: both are made to finish planning on
             a snapshot showing H (a barrier inside the planning) before either claims, so
             both build on H
    group    process 0 opens a group with expect_head=H (it is the only participant, stages
             and commits), process 1 checkpoints with expect_head=H

Exactly one wins each round and the other gets CommitConflict (expected H, found H or the
winner), with nothing of the loser visible; the stream's history is exactly the winners in
round order (parents chained, seqs 1, 2, 3...), each restoring the winner's bytes; verify
(deep=True) is clean at the end.

SNAPSTORE_RACE_ROUNDS (default 120) sets the rounds.
"""
from __future__ import annotations

import multiprocessing
import os
import random
import traceback

import snapstore
from snapstore.errors import CommitConflict

ROUNDS = int(os.environ.get("SNAPSTORE_RACE_ROUNDS", "120"))
MODES = ("expect", "planned", "group")
STREAM = "shared"


def _content(r: int, who: int) -> dict:
    rng = random.Random(f"{r}:{who}")
    return {"x": rng.randbytes(rng.randint(1, 40_000)), "who": bytes([who]) * (r % 7)}


def _racer(path: str, who: int, rounds: int, barrier, results) -> None:
    """One racing process (forked): reports (round, who, "won", id, parent, head read) or
    (round, who, "lost", expected, found, head read) per round, or ("error", text)."""
    try:
        from snapstore.engine import writer as wr
        store = snapstore.open(path, segment_size=1 << 16)
        real = wr.plan_buffers
        inside = {"barrier": False}

        def planned(*args, **kwargs):
            plans = real(*args, **kwargs)
            if inside["barrier"]:
                barrier.wait(60)        # both planned on a snapshot whose head is H
            return plans
        wr.plan_buffers = planned
        try:
            for r in range(rounds):
                mode = MODES[r % len(MODES)]
                barrier.wait(60)        # the previous round is over in both processes
                head = store.latest(STREAM)
                h = head.id if head is not None else None
                barrier.wait(60)        # both read H; nobody commits in between
                bufs, meta = _content(r, who), {"round": r, "who": who}
                try:
                    if mode == "expect":
                        info = store.checkpoint(bufs, STREAM, meta, expect_head=h)
                    elif mode == "planned":
                        inside["barrier"] = True
                        try:
                            info = store.checkpoint(bufs, STREAM, meta)
                        finally:
                            inside["barrier"] = False
                    elif who == 0:
                        group = store.group(STREAM, ["a"], expect_head=h, timeout=60)
                        store.stage(group.id, "a", bufs, meta)
                        info = group.commit(meta)
                    else:
                        info = store.checkpoint(bufs, STREAM, meta, expect_head=h)
                    results.put((r, who, "won", info.id, info.parent, h))
                except CommitConflict as exc:
                    results.put((r, who, "lost", exc.expected, exc.found, h))
        finally:
            store.close()
    except BaseException:  # noqa: BLE001 -- reported to the parent
        results.put(("error", who, traceback.format_exc()))
        barrier.abort()


def test_two_processes_racing_on_one_stream(tmp_path):
    path = str(tmp_path / "store")
    with snapstore.open(path) as s:
        s.checkpoint({"x": b"base"}, STREAM, {"round": -1, "who": -1})
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_racer, args=(path, who, ROUNDS, barrier, results))
             for who in (0, 1)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in range(2 * ROUNDS)
           if all(p.is_alive() for p in procs) or not results.empty()]
    for p in procs:
        p.join(60)
    errors = [g[2] for g in got if g[0] == "error"]
    assert not errors, errors[0]
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(got) == 2 * ROUNDS

    by_round: dict[int, dict] = {}
    for r, who, outcome, a, b, h in got:
        by_round.setdefault(r, {})[who] = (outcome, a, b, h)
    winners = []
    wins = {(m, w): 0 for m in MODES for w in (0, 1)}
    base_id = 1
    for r in range(ROUNDS):
        mode = MODES[r % len(MODES)]
        both = by_round[r]
        heads = {x[3] for x in both.values()}
        assert len(heads) == 1, f"round {r}: the two read different heads {heads}"
        h = heads.pop()
        assert h == (winners[-1][1] if winners else base_id), f"round {r}: head {h}"
        won = [w for w, x in both.items() if x[0] == "won"]
        assert len(won) == 1, f"round {r} ({mode}): outcomes {both}"
        w = won[0]
        _, cid, parent, _ = both[w]
        assert parent == h, f"round {r} ({mode}): the winner built on {parent}, not {h}"
        _, expected, found, _ = both[1 - w]
        assert expected == h and found in (h, cid), (
            f"round {r} ({mode}): the loser's CommitConflict says expected {expected}, found "
            f"{found} (head {h}, winner {cid})")
        winners.append((r, cid, w))
        wins[(mode, w)] += 1
    print(f"wins per (mode, process): {wins}")

    with snapstore.open(path) as s:
        history = s.checkpoints(STREAM)
        assert [c.id for c in history] == [base_id] + [cid for _, cid, _ in winners]
        for pos, c in enumerate(history):
            assert c.seq == pos + 1
            assert c.parent == (history[pos - 1].id if pos else None)
        for c, (r, cid, w) in zip(history[1:], winners):
            assert c.meta == {"round": r, "who": w}, f"checkpoint {cid}: meta {c.meta}"
            assert s.restore(cid) == _content(r, w), f"round {r}: checkpoint {cid} bytes"
        assert s.streams() == [STREAM]
        rep = s.verify(deep=True)
        assert rep["ok"], rep["problems"][:5]

