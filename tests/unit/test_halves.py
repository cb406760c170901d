"""snapstore.halves.both: two calls at once, results in order, either one's error raised;
start: a call begun on another thread, waited for later; and split_point, where a list of
sized items is cut for it."""
import threading

import pytest

from snapstore.halves import both, split_point, start


def test_results_in_order_and_the_second_runs_on_another_thread():
    where = []
    a, b = both(lambda: (where.append(threading.get_ident()), 1)[1],
                lambda: (where.append(threading.get_ident()), 2)[1])
    assert (a, b) == (1, 2)
    assert threading.get_ident() in where and len(set(where)) == 2


def test_the_error_of_either_is_raised_after_both_ended():
    ended = []
    with pytest.raises(KeyError):
        both(lambda: ended.append("first"), lambda: {}["missing"])
    assert ended == ["first"]
    with pytest.raises(ValueError, match="first"):
        both(lambda: (_ for _ in ()).throw(ValueError("first")),
             lambda: ended.append("second"))
    assert ended == ["first", "second"]


def test_start_runs_elsewhere_and_wait_gives_the_result_every_time():
    gate = threading.Event()
    handle = start(lambda: (gate.wait(5), threading.get_ident())[1])
    gate.set()
    assert handle.wait() != threading.get_ident()
    assert handle.wait() == handle.wait()


def test_start_raises_the_error_in_the_waiting_thread_and_finish_does_not():
    handle = start(lambda: {}["missing"])
    handle.finish()
    for _ in range(2):
        with pytest.raises(KeyError):
            handle.wait()


@pytest.mark.parametrize("sizes, at", [
    ([5, 5], 1), ([1, 1, 1, 1], 2), ([10, 1, 1], 1), ([1, 1, 10], 2), ([1, 10, 1], 1),
    ([0, 0, 0], 2), ([7], 1), ([3, 3, 3], 1)])
def test_split_point_keeps_the_first_part_within_half_and_both_parts_non_empty(sizes, at):
    assert split_point(sizes) == at
    if len(sizes) >= 2:
        assert 1 <= at <= len(sizes) - 1
