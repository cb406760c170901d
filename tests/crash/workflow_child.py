"""The subprocess of the workflow crash test (test_workflow_kill.py), and the 20-step workflow
both sides build.

    python workflow_child.py STORE JOURNAL WORKFLOW_ID ATTEMPT

Opens STORE (durability "fsync"), builds the workflow, prints "ready" on stdout, runs it with
run(initial_state(), meta={"attempt": ATTEMPT}) and prints "done" when it returns. Every step,
before it returns its state, appends "<step index> <ATTEMPT>" to JOURNAL (one os.write on an
O_APPEND descriptor, then fsync), so the journal lists every execution of every step that got
that far, including those whose checkpoint never committed.

The state is a dict of a list (one entry per step) and a 128 KiB bytearray (each step rewrites
one 4 KiB page of it), so object checkpoints page-diff it. Steps 2, 7, 12 and 17 are
checkpoint=False. Each step sleeps 0-4 ms so kills land everywhere.
"""
from __future__ import annotations

import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

STEPS = 20
UNCHECKPOINTED = frozenset({2, 7, 12, 17})
BLOB = 128 << 10


def initial_state() -> dict:
    return {"trail": [], "blob": bytearray(BLOB)}


def apply_step(state: dict, i: int) -> dict:
    """Step i's pure function of its input state."""
    trail = list(state["trail"])
    trail.append((i * 7919 + sum(trail) * 31) % 1_000_003)
    blob = bytearray(state["blob"])
    page = (i * 5) % (BLOB // 4096)
    blob[page * 4096:(page + 1) * 4096] = bytes([(i * 13 + len(trail)) & 255]) * 4096
    return {"trail": trail, "blob": blob}


def expected_final() -> dict:
    state = initial_state()
    for i in range(STEPS):
        state = apply_step(state, i)
    return state


def build(store, workflow_id: str, journal: str | None = None, attempt: int = 0,
          sleep: bool = False):
    from snapstore.workflow import Workflow
    wf = Workflow(store, workflow_id)
    rng = random.Random(f"{workflow_id}/{attempt}")

    def make(i: int):
        def fn(state):
            new = apply_step(state, i)
            if sleep:
                import time
                time.sleep(rng.uniform(0, 0.004))
            if journal is not None:
                fd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, f"{i} {attempt}\n".encode())
                    os.fsync(fd)
                finally:
                    os.close(fd)
            return new
        return fn

    for i in range(STEPS):
        wf.add_step(f"step-{i:02d}", make(i), checkpoint=i not in UNCHECKPOINTED)
    return wf


def main() -> None:
    store_path, journal, workflow_id, attempt = sys.argv[1:5]
    import snapstore
    store = snapstore.open(store_path, durability="fsync")
    wf = build(store, workflow_id, journal, int(attempt), sleep=True)
    print("ready", flush=True)
    wf.run(initial_state(), meta={"attempt": int(attempt)})
    store.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()
