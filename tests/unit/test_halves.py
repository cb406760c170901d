"""snapstore.halves.both: two calls at once, results in order, either one's error raised."""
import threading

import pytest

from snapstore.halves import both


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
