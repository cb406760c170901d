"""One zstd frame decompressed to exactly the size its owner records, or a ValueError saying
what is wrong: the check that chunk records (engine/chunks.py) and byte planes
(engine/planes.py) make of every frame they read.

python-zstandard allocates what a frame header declares: the declaration is checked against
the size the caller knows (bounded by the largest chunk a store writes) before anything is
allocated or decompressed, so a decompression bomb costs nothing."""
from __future__ import annotations

import threading

import zstandard

_local = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    d = getattr(_local, "d", None)
    if d is None:
        d = _local.d = zstandard.ZstdDecompressor()
    return d


def decompress_exact(frame, size: int) -> bytes:
    """The `size` bytes the zstd frame holds. Raises ValueError whose text completes a
    sentence about the frame's owner ("chunk ...", "plane 3 ..."): it is not a zstd frame,
    declares no or another content size, does not decompress, or gives another length."""
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as exc:
        raise ValueError(f"is not a zstd frame: {exc}") from None
    if declared != size:
        raise ValueError("holds a zstd frame that declares "
                         + ("no content size" if declared < 0 else f"{declared} bytes")
                         + f", not {size}")
    try:
        data = _decompressor().decompress(frame, max_output_size=size)
    except zstandard.ZstdError as exc:
        raise ValueError(f"does not decompress: {exc}") from None
    if len(data) != size:
        raise ValueError(f"decompresses to {len(data)} bytes, not {size}")
    return data
