"""The staging arena (snapstore/capture/staging.py) against a reference model: any sequence of
takes and frees, in any order (a capture interrupted after it took its region frees it before
older ones), never hands out memory a region still taken covers, keeps in_use exact, and
gives all of its memory back once everything is freed."""
from __future__ import annotations

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from snapstore.capture.staging import StagingArena

CAPACITY = 64 << 10


class ArenaModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.arena = StagingArena(CAPACITY)
        self.taken: dict[object, tuple[int, int, memoryview]] = {}   # owner -> region
        self.freed: list = []           # owners whose region was freed

    @rule(n=st.integers(1, CAPACITY))
    def take(self, n: int) -> None:
        owner = object()
        got = self.arena.alloc(n, wait=False, owner=owner)
        if got is None:
            # refused only when it would not fit beside the regions still held (a region
            # freed early is held until the older ones are freed: counted as held here)
            assert self.taken, "an empty arena refused a region that fits"
            return
        start, memory = got
        assert len(memory) == n and 0 <= start and start + n <= CAPACITY
        for other_start, other_n, _ in self.taken.values():
            assert start + n <= other_start or other_start + other_n <= start, \
                "handed out memory a taken region covers"
        memory[:] = bytes([len(self.taken) % 251]) * n
        self.taken[owner] = (start, n, memory)

    @precondition(lambda self: self.taken)
    @rule(data=st.data(), by_owner=st.booleans())
    def free_any(self, data, by_owner: bool) -> None:
        owner = data.draw(st.sampled_from(sorted(self.taken, key=lambda o: self.taken[o][0])))
        start, _, memory = self.taken.pop(owner)
        memory.release()
        if by_owner:
            assert self.arena.free_taken_by(owner) is True
        else:
            self.arena.free(start, owner)
        self.freed.append(owner)

    @precondition(lambda self: self.freed)
    @rule(data=st.data())
    def free_again_is_refused(self, data) -> None:
        owner = data.draw(st.sampled_from(self.freed))
        assert self.arena.free_taken_by(owner) is False

    @invariant()
    def in_use_is_exact(self) -> None:
        assert self.arena.in_use == sum(n for _, n, _ in self.taken.values())
        assert self.arena.peak >= self.arena.in_use

    def teardown(self) -> None:
        for owner, (start, _, memory) in list(self.taken.items()):
            memory.release()
            self.arena.free(start, owner)
        assert self.arena.in_use == 0
        start, memory = self.arena.alloc(CAPACITY, wait=False)      # all of it is back
        assert start == 0
        memory.release()
        self.arena.close()


TestArenaModel = ArenaModel.TestCase
TestArenaModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
