"""The marks of writers whose index runs without syncs (engine/unsynced.py), against a model:
any sequence of writers opened (default, sync_index=False, durability "none"), checkpoints,
closes, writers SIGKILLed in child processes, and simulated reboots (another boot id, and the
index file overwritten when a mark says it is untrusted) keeps:
- after every open, no mark of an earlier boot is left (the opener rebuilt the index);
- the marks on disk are exactly those of the open marked writers, plus the dead ones no
  writer has cleared since;
- every checkpoint a writer acknowledged restores byte-exact."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule)

import snapstore
from snapstore.engine import unsynced

MODES = {"default": {}, "unsynced": {"sync_index": False}, "none": {"durability": "none"}}
MARKED = {"unsynced", "none"}


def _marks(store: str) -> list[str]:
    try:
        return [n for n in os.listdir(os.path.join(store, "unsynced")) if not n.startswith(".")]
    except FileNotFoundError:
        return []


class MarksModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.store = os.path.join(self.tmp.name, "s")
        self.boot = str(uuid.uuid4())
        self._real_boot_id = unsynced.boot_id
        unsynced.boot_id = lambda: self.boot          # this process's boot, as the model says
        self.live: list[tuple[snapstore.Store, str]] = []
        self.dead_marks = 0           # marks of killed writers (this boot) not cleared yet
        self.stale = False            # marks of an earlier boot are on disk
        self.saved: dict[int, bytes] = {}
        self.n = 0

    def teardown(self) -> None:
        for s, _ in self.live:
            s.close()
        unsynced.boot_id = self._real_boot_id
        self.tmp.cleanup()

    def _payload(self) -> bytes:
        self.n += 1
        return random.Random(self.n).randbytes(random.Random(-self.n).choice([0, 1, 700, 5000]))

    def _opened(self, mode: str) -> None:
        """What an open of a writer does to the model."""
        self.stale = False
        self.dead_marks = 0

    @precondition(lambda self: len(self.live) < 3)
    @rule(mode=st.sampled_from(sorted(MODES)))
    def open_writer(self, mode):
        s = snapstore.open(self.store, **MODES[mode])
        self._opened(mode)
        self.live.append((s, mode))
        x = self._payload()
        self.saved[s.checkpoint({"x": x}, stream=f"w{self.n}").id] = x

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 2), same=st.booleans())
    def checkpoint(self, k, same):
        s, _ = self.live[k % len(self.live)]
        x = self._payload() if not same or not self.saved else self.saved[max(self.saved)]
        self.saved[s.checkpoint({"x": x}, stream="shared-" + str(k % len(self.live))).id] = x

    @precondition(lambda self: self.live)
    @rule(k=st.integers(0, 2))
    def close(self, k):
        s, _ = self.live.pop(k % len(self.live))
        s.close()
        s.close()                                     # twice: nothing more

    @precondition(lambda self: len(self.live) < 3)
    @rule(mode=st.sampled_from(sorted(MODES)))
    def kill_a_writer(self, mode):
        x = self._payload()
        child = textwrap.dedent(f"""
            import os, signal, sys, snapstore
            from snapstore.engine import unsynced
            unsynced.boot_id = lambda: {self.boot!r}
            s = snapstore.open({self.store!r}, **{MODES[mode]!r})
            info = s.checkpoint({{"x": {x!r}}}, stream="dying")
            print(info.id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        """)
        p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
        assert p.returncode == -signal.SIGKILL, p.stderr
        self.saved[int(p.stdout)] = x
        self._opened(mode)                            # its open cleared the dead marks
        if mode in MARKED:
            self.dead_marks = 1

    @precondition(lambda self: not self.live)
    @rule(garbage=st.booleans())
    def reboot(self, garbage):
        self.boot = str(uuid.uuid4())
        if self.dead_marks:
            self.stale, self.dead_marks = True, 0
            if garbage:                               # pages that never reached the disk
                data = os.path.join(self.store, "index", "data.mdb")
                with open(data, "r+b") as f:
                    f.write(random.Random(self.n).randbytes(os.path.getsize(data)))

    @precondition(lambda self: os.path.exists(os.path.join(self.store, "FORMAT")))
    @rule()
    def read_everything(self):
        with snapstore.open(self.store, readonly=True) as r:
            self.stale = False                        # a reader rebuilds too
            for checkpoint_id, x in self.saved.items():
                assert bytes(r.restore(checkpoint_id)["x"]) == x

    @invariant()
    def marks_are_the_open_marked_writers_and_the_dead_ones(self):
        marks = _marks(self.store)
        mine = sum(1 for _, mode in self.live if mode in MARKED)
        if self.stale:
            assert len(marks) >= 1
            return
        assert not unsynced.untrusted(self.store)
        assert len(marks) == mine + self.dead_marks, (marks, mine, self.dead_marks)


MarksModel.TestCase.settings = settings(max_examples=12, stateful_step_count=10,
                                        deadline=None,
                                        suppress_health_check=[HealthCheck.too_slow])
TestMarksModel = MarksModel.TestCase
