"""describe(value): a JSON description of a loaded value, precise enough to compare loads.

Shared by make_golden_stores.py (which records what the format-defining version's load gave)
and test_golden_stores.py (which checks that today's load gives the same). Imports neither
snapstore nor torch itself: torch is used only if the value holds tensors (then it is already
imported). Type names are kept (tuple vs list, bytes vs bytearray, Parameter vs Tensor), array
and tensor bytes are compared by SHA-256 in C order, floats exactly (JSON round-trips repr).

Do not weaken this to make a test pass: a description that says less checks less.

files_sha256(root): the SHA-256 of every file under a golden store directory, by its path
relative to root ("/"-separated): what each format's layout test pins its golden files with.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any


def sha256(data) -> str:
    return hashlib.sha256(memoryview(data).cast("B")).hexdigest()


def files_sha256(root: str) -> dict:
    """{path relative to root, "/"-separated: SHA-256 hex of the file} for every file under
    root."""
    found = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                found[os.path.relpath(p, root).replace(os.sep, "/")] = \
                    hashlib.sha256(fh.read()).hexdigest()
    return found


def _tensor_bytes(t) -> bytes:
    torch = sys.modules["torch"]
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return b""
    return flat.view(torch.uint8).numpy().tobytes()


def describe(x: Any) -> Any:
    np = sys.modules.get("numpy")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(x, torch.Tensor):
        return {"type": type(x).__name__, "dtype": str(x.dtype), "shape": list(x.shape),
                "stride": list(x.stride()), "storage_offset": x.storage_offset(),
                "requires_grad": bool(x.requires_grad), "sha256": sha256(_tensor_bytes(x))}
    if np is not None and isinstance(x, np.ndarray):
        fortran = bool(x.flags.f_contiguous and not x.flags.c_contiguous)
        descr = json.loads(json.dumps(np.lib.format.dtype_to_descr(x.dtype)))  # as in JSON
        return {"type": "ndarray", "dtype": descr,
                "shape": list(x.shape), "fortran": fortran,
                "sha256": sha256(np.ascontiguousarray(x).tobytes())}
    if np is not None and isinstance(x, np.generic):
        return {"type": "numpy." + type(x).__name__, "hex": x.tobytes().hex()}
    if isinstance(x, dict):
        return {"type": "dict", "items": [[describe(k), describe(v)] for k, v in x.items()]}
    if isinstance(x, (list, tuple)):
        return {"type": type(x).__name__, "items": [describe(v) for v in x]}
    if isinstance(x, (bytes, bytearray)):
        return {"type": type(x).__name__, "size": len(x), "sha256": sha256(x)}
    if x is None or isinstance(x, (bool, int, float, str)):
        return {"type": type(x).__name__, "value": x}
    raise TypeError(f"describe: unsupported value of type {type(x).__name__}")
