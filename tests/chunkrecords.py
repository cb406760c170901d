"""Chunks as the engine sees them (a hypothesis strategy) and the engine's Python read path of
one chunk record (the reference), shared by the property tests of the C core's chunk-record
reader and writer (`from chunkrecords import chunk_data, python_read`: tests/ is on
sys.path)."""
import numpy as np
from hypothesis import strategies as st

from snapstore.engine import chunks
from snapstore.engine.backends.base import SegmentReader
from snapstore.errors import CorruptionError

SPECIALS = {2: [b"\x00\x7c", b"\x00\xfc", b"\x01\x7e", b"\x00\x80", b"\x01\x00"],
            4: [b"\x00\x00\x80\x7f", b"\x01\x00\xc0\xff", b"\x00\x00\x00\x80", b"\x01\x00\x00\x00"],
            8: [b"\x00" * 7 + b"\x80", b"\x00" * 6 + b"\xf0\x7f", b"\x01" + b"\x00" * 7]}


@st.composite
def chunk_data(draw):
    """(data, itemsize, compression) of one chunk."""
    kind = draw(st.sampled_from(["floats", "repeats", "noise", "tiny"]))
    seed = draw(st.integers(0, 2 ** 32 - 1))
    rng = np.random.default_rng(seed)
    k = draw(st.sampled_from([2, 4, 8]))
    if kind == "tiny":
        data = draw(st.binary(max_size=3))
    elif kind == "floats":
        n = draw(st.integers(256, 6000))
        dtype = {2: np.float16, 4: np.float32, 8: np.float64}[k]
        with np.errstate(over="ignore"):            # 1e30 is inf in float16: meant
            items = (rng.standard_normal(n)
                     * draw(st.sampled_from([0.02, 1.0, 1e30]))).astype(dtype)
        data = bytearray(items.tobytes())
        for _ in range(draw(st.integers(0, 8))):        # specials at random items
            at = int(rng.integers(0, n)) * k
            data[at:at + k] = draw(st.sampled_from(SPECIALS[k]))
        data = bytes(data) + draw(st.binary(max_size=k - 1))    # a tail
    elif kind == "repeats":
        data = draw(st.binary(min_size=1, max_size=40)) * draw(st.integers(1, 600))
    else:
        data = rng.integers(0, 256, draw(st.integers(0, 20000)), dtype=np.uint8).tobytes()
    return data, k, draw(st.sampled_from(["zstd", "zstd", "none"]))


class BytesReader(SegmentReader):
    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self, number, offset, length):
        return self.data[offset:offset + length]

    def close(self):
        pass


def python_read(rec: bytes, stored_len: int, raw_len: int, cid: bytes):
    """The reference: the bytes the engine's Python path reads, or None where it refuses."""
    try:
        return bytes(chunks.read_chunk(BytesReader(rec), 1, 0, stored_len, cid, raw_len))
    except CorruptionError:
        return None
