"""LangGraph's own conformance suite (langgraph-checkpoint-conformance==0.0.2) against
SnapstoreSaver: all eight capabilities must be detected and pass with zero failures.

The suite calls its factory once per capability; each call gets a fresh store. It runs twice:
on a store opened by path (durability "fsync", the default) and on a Store passed in
directly (durability "none").
"""
import asyncio
import os
import tempfile

import pytest

pytest.importorskip("langgraph.checkpoint.conformance",
                    reason="langgraph-checkpoint-conformance is not installed")

from langgraph.checkpoint.conformance import checkpointer_test, validate  # noqa: E402
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES  # noqa: E402

import snapstore  # noqa: E402
from snapstore.langgraph import SnapstoreSaver  # noqa: E402

EXPECTED_TESTS = {"put": 17, "put_writes": 10, "get_tuple": 10, "list": 16,
                  "delete_thread": 5, "delete_for_runs": 7, "copy_thread": 8, "prune": 8}


@checkpointer_test(name="SnapstoreSaver.from_path")
async def saver_by_path():
    with tempfile.TemporaryDirectory() as tmp:
        with SnapstoreSaver.from_path(os.path.join(tmp, "store")) as saver:
            yield saver


@checkpointer_test(name="SnapstoreSaver(store)")
async def saver_on_store():
    with tempfile.TemporaryDirectory() as tmp:
        store = snapstore.open(os.path.join(tmp, "store"), durability="none")
        try:
            yield SnapstoreSaver(store)
        finally:
            store.close()


def _check(report) -> None:
    report.print_report()
    results = report.results
    assert {c.value for c in ALL_CAPABILITIES} == set(results)
    undetected = sorted(name for name, r in results.items() if not r.detected)
    assert not undetected, f"capabilities not detected: {undetected}"
    failures = {name: r.failures for name, r in results.items() if r.tests_failed}
    assert not failures, f"conformance failures: {failures}"
    for name, r in results.items():
        assert r.passed is True, name
        assert r.tests_passed == EXPECTED_TESTS[name], (name, r.tests_passed)
    assert report.conformance_level() == "FULL"
    assert sum(r.tests_passed for r in results.values()) == 81


@pytest.mark.parametrize("registered", [saver_by_path, saver_on_store],
                         ids=["from_path-fsync", "store-none"])
def test_conformance_suite(registered):
    _check(asyncio.run(validate(registered)))
