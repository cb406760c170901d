"""The CLI's time formatting never fails on a time no date can show: a checkpoint imported by
an older version may carry one, and one bad value must not stop `ls` of the whole store."""
from __future__ import annotations

import pytest

from snapstore.cli.output import iso_time, local_time


def test_ordinary_times():
    assert iso_time(0) == "1970-01-01T00:00:00Z"
    assert iso_time(253402300799) == "9999-12-31T23:59:59Z"
    assert len(local_time(1_700_000_000.5)) == len("2023-11-14 22:13:20")


@pytest.mark.parametrize("ts", [1e300, -1e300, float("inf"), float("-inf"), float("nan")])
def test_times_no_date_can_show_are_shown_as_numbers(ts):
    assert iso_time(ts) == f"?{ts!r}"
    assert local_time(ts) == f"?{ts!r}"
