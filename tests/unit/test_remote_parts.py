"""Group part objects (remote/parts.py) decoded from bytes: a part sealed with a valid
checksum but a description no writer makes is CorruptionError naming the key, never a hang or
a wrong commit (its bytes_new feeds the coordinator's commit record)."""
from __future__ import annotations

import pytest

from snapstore.errors import CorruptionError
from snapstore.remote import parts
from snapstore.remote.parts import Part


def part(**changes) -> Part:
    fields = dict(group="g" * 32, participant="rank0", stream="s", parent=None,
                  meta={"step": 1}, entries=[], new_chunks=b"", reused=b"", bytes_new=123)
    fields.update(changes)
    return Part(**fields)


def test_a_part_round_trips():
    got = parts.decode(parts.encode(part()), "groups/g/parts/72")
    assert got == part()


@pytest.mark.parametrize("bytes_new", [0, 1, 10 ** 15])
def test_any_count_a_writer_makes_is_accepted(bytes_new):
    assert parts.decode(parts.encode(part(bytes_new=bytes_new)), "k").bytes_new == bytes_new


@pytest.mark.parametrize("bytes_new", [-1, -251, 1.5, True, "12", None, [1]])
def test_a_bytes_new_no_writer_makes_is_corruption(bytes_new):
    data = parts.encode(part(bytes_new=bytes_new))       # checksum valid: crafted, not flipped
    with pytest.raises(CorruptionError, match="groups/g/parts/72"):
        parts.decode(data, "groups/g/parts/72")


def test_a_flipped_bit_is_corruption():
    data = bytearray(parts.encode(part()))
    data[len(data) // 2] ^= 1
    with pytest.raises(CorruptionError):
        parts.decode(bytes(data), "k")
