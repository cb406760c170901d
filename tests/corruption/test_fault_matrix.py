"""The fault matrix of issue 14: every file of a store damaged in every way, times every entry
point, through the public API and the command line only (fault_child.py has the cases, the
rules and the worker processes).

One test per case "TARGET:DAMAGE:ENTRY" (e.g. "index/data.mdb:trunc_half:restore"). The
matrix runs once per module, before the first of these tests, in two worker processes that
each take cases one at a time; a worker killed by a signal or stuck in a hang loses only its
own case, which fails with cause "signal" or "hang", and is replaced. A case passes when every
byte the store returned was the expected byte and every failure was a SnapstoreError (the CLI:
exit 1 or 2 with one line "snapstore: error: ...", no internal error, no traceback), with the
stricter promises of the issue where they apply (fault_child.Case: harmless damage changes
nothing, a truncated index is a CorruptionError naming `snapstore repair`, repair undoes any
damage confined to the index, a clean verify(deep=True) means everything restores).

The summary of the failures, grouped by cause with one reproduction command each, is printed
after the matrix ran and written to $SNAPSTORE_FAULT_REPORT (default: fault_matrix_report.txt
in pytest's temp directory).

SNAPSTORE_FAULT_SEED fixes the seed of the bit flips (default random, printed and named in
every failure); SNAPSTORE_FAULT_TIMEOUT is the seconds after which a running case is a hang
(default 20; a case sleeping without using CPU is one after 2 s, after 0.3 s when it waits on
a FIFO); SNAPSTORE_FAULT_WORKERS the
number of worker processes (default 2); SNAPSTORE_FAULT_WORKDIR where the store copies go
(default /dev/shm when usable).
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import fault_child as fm  # noqa: E402

SEED = int(os.environ.get("SNAPSTORE_FAULT_SEED", random.randrange(1 << 31)))
TIMEOUT = float(os.environ.get("SNAPSTORE_FAULT_TIMEOUT", "20"))
WORKERS = int(os.environ.get("SNAPSTORE_FAULT_WORKERS", "2"))
CASES = fm.all_cases()


def _selected_cases(session) -> list:
    """The matrix cases pytest will run (after -k and the like), in order."""
    return [item.callspec.params["case"] for item in session.items
            if item.module is sys.modules[__name__] and
            getattr(item, "originalname", "") == "test_fault_case"]


def _terminal(config):
    return config.pluginmanager.get_plugin("terminalreporter")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple:
    """(build directory, expected.json contents) of the fixture store and its twin."""
    build_dir = str(tmp_path_factory.mktemp("fault-matrix") / "build")
    fm._build_in(build_dir)
    with open(os.path.join(build_dir, "expected.json")) as f:
        return build_dir, json.load(f)


@pytest.fixture(scope="module")
def matrix(request, built, tmp_path_factory) -> dict:
    build_dir, _ = built
    cases = _selected_cases(request.session)
    work = tempfile.mkdtemp(prefix="snapstore-faults-", dir=fm.workspace_root())
    tr = _terminal(request.config)
    started = time.monotonic()
    try:
        results = fm.run_matrix(cases, build_dir, work, SEED, workers=WORKERS,
                                timeout=TIMEOUT)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seconds = time.monotonic() - started
    report = fm.summary(results, SEED) + f"\n({len(cases)} cases in {seconds:.1f}s)\n"
    path = os.environ.get("SNAPSTORE_FAULT_REPORT") or str(
        tmp_path_factory.getbasetemp() / "fault_matrix_report.txt")
    with open(path, "w") as f:
        f.write(report)
    with open(path + ".json", "w") as f:
        json.dump(results, f, indent=1)
    if tr is not None:
        tr.write_line("")
        tr.write_sep("-", "fault matrix")
        for line in report.splitlines():
            tr.write_line(line)
        tr.write_line(f"(report written to {path}, verdicts to {path}.json)")
    return results


def test_fixture_store_has_every_kind_of_content(built):
    """The fixture holds what the matrix means to damage: several streams, full and
    incremental checkpoints, tags, a deleted checkpoint, empty and unaligned buffers, and
    several segment files (one of them written by a compaction)."""
    _, expected = built
    ckpts = expected["checkpoints"]
    assert len(expected["streams"]) >= 2
    assert {c["kind"] for c in ckpts} == {"full", "incremental"}
    assert max(c["chain_length"] for c in ckpts) >= 3
    assert any(c["tags"] for c in ckpts)
    assert expected["deleted"]
    assert any(0 in c["sizes"].values() for c in ckpts)
    assert any(any(n % 4096 for n in c["sizes"].values()) for c in ckpts)
    assert len(expected["segments"]) == fm.SEGMENT_TARGETS
    numbers = [int(n.split(".")[0]) for n in expected["segments"]]
    assert numbers != list(range(1, len(numbers) + 1)), "no compaction rewrote a segment"


@pytest.mark.parametrize("case", CASES)
def test_fault_case(matrix, case):
    verdict = matrix[case]
    if verdict["failures"]:
        pytest.fail(fm.case_message(verdict, SEED), pytrace=False)
