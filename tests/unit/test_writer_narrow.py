"""writer.narrow_staged: a staged whole-buffer plan narrowed to the pages that changed (what a
"hash" detector that skipped its pass learns from the copy), checked against the plan a diffed
capture makes of the same pages."""
from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from snapstore.engine import writer as wr
from snapstore.errors import InvalidArgumentError

OPTS = wr.WriteOptions()
PAGE = OPTS.page_size


def staged_whole(data: bytes) -> wr.BufferPlan:
    view = memoryview(bytearray(data))
    plan = wr.plan_delta("a", view, [(0, len(data))] if data else [], 0, OPTS, 4)
    wr.stage(plan, memoryview(bytearray(len(data))))
    return plan


def page_ranges(pages, n):
    return [(p * PAGE, min(PAGE, n - p * PAGE)) for p in sorted(set(pages))]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40 * PAGE), picks=st.lists(st.integers(0, 10**6), max_size=25))
def test_narrowed_plan_is_the_diffed_plan(n, picks):
    data = os.urandom(n)
    plan = staged_whole(data)
    pages = -(-n // PAGE)
    ranges = page_ranges([p % pages for p in picks], n)
    narrowed = wr.narrow_staged(plan, ranges, OPTS)
    diffed = wr.plan_delta("a", plan.view, ranges, 0, OPTS, 4)
    assert narrowed.chunks == diffed.chunks and narrowed.base == "delta"
    assert narrowed.itemsize == 4 and narrowed.view is plan.view
    assert bytes(narrowed.staged) == b"".join(data[o:o + k] for o, k in ranges)


def test_nothing_changed_and_everything_changed():
    data = os.urandom(5 * PAGE + 3)
    assert bytes(wr.narrow_staged(staged_whole(data), [], OPTS).staged) == b""
    everything = page_ranges(range(6), len(data))
    assert bytes(wr.narrow_staged(staged_whole(data), everything, OPTS).staged) == data
    one = wr.narrow_staged(staged_whole(data), [(5 * PAGE, 3)], OPTS)      # the last 3 bytes
    assert bytes(one.staged) == data[-3:] and one.ranges() == [(5 * PAGE, 3)]


def test_only_a_staged_whole_buffer_plan_is_narrowed():
    data = os.urandom(4 * PAGE)
    view = memoryview(bytearray(data))
    part = wr.plan_delta("a", view, [(PAGE, PAGE)], 0, OPTS)
    wr.stage(part, memoryview(bytearray(PAGE)))
    with pytest.raises(InvalidArgumentError, match="whole buffer"):
        wr.narrow_staged(part, [(PAGE, PAGE)], OPTS)
    unstaged = wr.plan_delta("a", view, [(0, len(data))], 0, OPTS)
    with pytest.raises(InvalidArgumentError, match="whole buffer"):
        wr.narrow_staged(unstaged, [(PAGE, PAGE)], OPTS)
