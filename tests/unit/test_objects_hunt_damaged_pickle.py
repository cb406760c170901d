"""An object checkpoint whose pickle stream is not a pickle: load() and load(into=) raise
CorruptionError naming the checkpoint (as the tensor catalogue does), never a raw
UnpicklingError or EOFError; errors raised by a class's own code while unpickling stay theirs."""
import numpy as np
import pytest

from snapstore.errors import CorruptionError
from snapstore.tensors import tensor_catalogue

OBJECT_META = {"snapstore.objects": {"version": 1, "buffers": 0}}


@pytest.mark.parametrize("stream", [b"garbage", b"", b"\x80\x05\x95\xff\x00", b"\x80\x050.",
                                    b"\x80\x05X\x01\x00\x00\x00\xff."],
                         ids=["not a pickle", "empty", "truncated", "stack underflow",
                              "a string that is not UTF-8"])
@pytest.mark.parametrize("into", [None, {}], ids=["load", "load into"])
def test_a_pickle_stream_that_is_not_one_is_corruption(store, stream, into):
    info = store.checkpoint({"pickle": stream}, "s", meta=OBJECT_META)
    with pytest.raises(CorruptionError, match=f"checkpoint {info.id} of stream 's': its "
                                              "pickle stream cannot be read") as exc:
        store.load(info.id, into=into)
    assert exc.value.__cause__ is None
    with pytest.raises(CorruptionError):                       # as the catalogue says too
        tensor_catalogue(store, info)


class Fussy:
    """A class whose own __setstate__ refuses the state it is given on load."""

    def __init__(self):
        self.w = np.arange(5000.0)

    def __setstate__(self, state):
        raise ValueError("Fussy refuses to load")


def test_an_error_of_a_class_while_unpickling_stays_its_own(store):
    info = store.save({"f": Fussy()}, "fussy")
    with pytest.raises(ValueError, match="Fussy refuses") as exc:
        store.load(info.id)
    assert not isinstance(exc.value, CorruptionError)
