"""disjoint_batches (engine/validation.py) against the obvious reference: restoring its
batches one after another writes every byte from the same target as writing the targets one
by one, in order, would; and no batch holds two targets that share memory."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from snapstore import _native as native
from snapstore.engine.validation import check_disjoint, disjoint_batches

SIZE = 256
BUF = memoryview(bytearray(SIZE))
BASE = native.buffer_address(BUF)

SPANS = st.lists(st.tuples(st.integers(0, SIZE), st.integers(0, SIZE)), min_size=1,
                 max_size=8)


def owners(batches: list) -> list:
    """Which target's write each byte ends with, writing the batches (each a dict) in order."""
    out = [None] * SIZE
    for batch in batches:
        for name, view in batch.items():
            start = native.buffer_address(view) - BASE if len(view) else 0
            out[start:start + len(view)] = [name] * len(view)
    return out


@settings(max_examples=300)
@given(spans=SPANS)
def test_batches_write_what_writing_one_by_one_writes(spans):
    targets = {f"t{i}": BUF[a:a + n] for i, (a, n) in enumerate(spans)}
    batches = disjoint_batches(targets)
    for batch in batches:
        check_disjoint(batch)                   # raises if two share memory
    assert sorted(n for b in batches for n in b) == sorted(targets)
    assert owners(batches) == owners([{name: view} for name, view in targets.items()])
