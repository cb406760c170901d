"""Crash-test bookkeeping: tests report the SIGKILLs they performed through the `kill_log`
fixture; the total is printed in the terminal summary (the issue asks for >= 200 per run)."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_KILLS = pytest.StashKey[dict]()


@pytest.fixture
def kill_log(request):
    """kill_log(n) adds n kills to this test's count."""
    kills = request.config.stash.setdefault(_KILLS, {})

    def add(n: int = 1) -> None:
        kills[request.node.name] = kills.get(request.node.name, 0) + n
    return add


def pytest_terminal_summary(terminalreporter):
    kills = terminalreporter.config.stash.get(_KILLS, None)
    if kills:
        terminalreporter.write_sep("-", f"crash tests: {sum(kills.values())} writer processes "
                                        "SIGKILLed")
        for name, n in sorted(kills.items()):
            terminalreporter.write_line(f"  {n:4d}  {name}")
