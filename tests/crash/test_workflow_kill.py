"""Workflows survive SIGKILL: a 20-step workflow (workflow_child.py) runs in a subprocess that
is SIGKILLed at random moments and re-run after every kill, until it finishes; then the next
workflow of the same store, until at least SNAPSTORE_WORKFLOW_KILLS (default 35) kills.

For every workflow the test checks that
  * it finishes with the same final state as an uninterrupted run (and as the steps' pure
    functions applied in order);
  * history() has exactly one checkpoint per checkpointed step (plus none for the others),
    in order, each recording the steps completed so far;
  * no checkpointed step ran after its checkpoint committed: every execution of step s in the
    journal (which each step fsyncs before returning) comes from an attempt no later than the
    attempt that committed s's checkpoint (its run meta), and that attempt ran s exactly once;
  * every step ran, and a second run() of the finished workflow runs nothing.

SNAPSTORE_CRASH_SEED fixes the seed (printed on failure).
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import Counter

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import workflow_child as wc  # noqa: E402

import snapstore  # noqa: E402

pytestmark = pytest.mark.slow

KILLS = int(os.environ.get("SNAPSTORE_WORKFLOW_KILLS", "35"))
CHILD = os.path.join(HERE, "workflow_child.py")


def _start(store: str, journal: str, workflow_id: str, attempt: int) -> subprocess.Popen:
    # stderr goes to a file: only stdout is a pipe, read through one buffered stream (a
    # fast child's "ready" and "done" can arrive in one read; communicate() would miss the
    # "done" left in the text buffer by readline()).
    err = open(journal + ".stderr", "w+")
    p = subprocess.Popen([sys.executable, CHILD, store, journal, workflow_id, str(attempt)],
                         stdout=subprocess.PIPE, stderr=err, text=True)
    p.err_file = err
    line = p.stdout.readline().strip()
    if line != "ready":
        p.kill()
        p.wait()
        raise AssertionError(f"child did not start: {line!r}\n{_stderr(p)}")
    return p


def _stderr(p: subprocess.Popen) -> str:
    p.err_file.seek(0)
    text = p.err_file.read()
    p.err_file.close()
    return text


def _finish(p: subprocess.Popen) -> None:
    out = p.stdout.read()
    p.wait(timeout=60)
    err = _stderr(p)
    assert p.returncode == 0 and out.strip() == "done", (p.returncode, out, err)


def _kill(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()
    p.stdout.close()
    p.err_file.close()


def _journal(path: str) -> list[tuple[int, int]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [tuple(int(x) for x in line.split()) for line in f if line.strip()]


def _check(store_path: str, workflow_id: str, journal: str, reference: dict) -> None:
    with snapstore.open(store_path, durability="none") as store:
        wf = wc.build(store, workflow_id, journal, attempt=-1)
        final = wf.load()
        assert final == reference
        history = wf.history()
        expected_steps = [i for i in range(wc.STEPS) if i not in wc.UNCHECKPOINTED]
        assert [h.index for h in history] == expected_steps, [h.step for h in history]
        assert history[-1].done
        committed = {}
        for h in history:
            assert h.step == f"step-{h.index:02d}"
            assert h.completed == tuple(f"step-{i:02d}" for i in range(h.index + 1))
            committed[h.index] = h.meta["attempt"]
        runs = _journal(journal)
        ran = {i for i, _ in runs}
        assert ran == set(range(wc.STEPS)), f"steps never run: {set(range(wc.STEPS)) - ran}"
        per_attempt = Counter(runs)
        for i, attempt in committed.items():
            late = [a for s, a in runs if s == i and a > attempt]
            assert not late, (f"{workflow_id}: step {i} committed in attempt {attempt} but ran "
                              f"again in attempts {late}")
            assert per_attempt[(i, attempt)] == 1, (workflow_id, i, attempt)
        before = len(runs)
        assert wf.run(wc.initial_state()) == reference      # finished: nothing runs
        assert len(_journal(journal)) == before


def test_workflow_sigkill_and_resume(tmp_path, kill_log):
    seed = int(os.environ.get("SNAPSTORE_CRASH_SEED", random.randrange(1 << 31)))
    rng = random.Random(seed)
    store = str(tmp_path / "store")
    expected = wc.expected_final()

    # The uninterrupted run: the reference final state and how long a whole run takes.
    p = _start(store, str(tmp_path / "journal-ref"), "reference", 0)
    t0 = time.monotonic()
    _finish(p)
    full = time.monotonic() - t0
    with snapstore.open(store, durability="none") as s:
        reference = wc.build(s, "reference").load()
    assert reference == expected

    kills = 0
    workflows = 0
    try:
        while kills < KILLS:
            workflow_id = f"wf-{workflows}"
            journal = str(tmp_path / f"journal-{workflows}")
            for attempt in range(1, 1000):
                p = _start(store, journal, workflow_id, attempt)
                try:
                    p.wait(timeout=rng.uniform(0, full))
                except subprocess.TimeoutExpired:
                    _kill(p)
                    kills += 1
                    kill_log(1)
                    continue
                _finish(p)
                break
            else:
                raise AssertionError(f"{workflow_id} never finished")
            _check(store, workflow_id, journal, reference)
            workflows += 1
    except BaseException:
        print(f"SNAPSTORE_CRASH_SEED={seed} kills={kills} workflows={workflows}")
        raise
    assert kills >= KILLS
    print(f"{kills} kills over {workflows} workflows (seed {seed}, full run {full:.3f}s)")
