"""NumPy arrays by name: save_arrays/load_arrays keep a dict of arrays as one checkpoint with one
buffer per array, "array/<name>", holding its bytes as they lie in memory (C or Fortran order),
and dtype/shape/order in the meta. No pickle: loading never unpickles anything, and an array
diffs against the array of the same name in the stream's previous save (adding or removing
other arrays changes nothing for it).

    snapstore.save_arrays(store, {"u": u, "v": v}, stream="sim", meta={"t": 1.5})
    state = snapstore.load_arrays(store, "sim")                 # {"u": array, "v": array}
    snapstore.load_arrays(store, "sim", into=state)             # in place
"""
from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

from snapstore.engine.memory import uninit_bytearray
from snapstore.engine.validation import disjoint_batches
from snapstore.errors import (InvalidArgumentTypeError, NotAnObjectCheckpointError,
                              StructureMismatchError)
from snapstore.objectlayer import (ARRAYS_META_KEY, layer_meta, reader_hint,
                                   refuse_other_version, require_store, resolve_checkpoint,
                                   wrap_meta)

__all__ = ["save_arrays", "load_arrays", "ARRAYS_META_KEY", "ARRAY_PREFIX"]

ARRAYS_VERSION = 1
ARRAY_PREFIX = "array/"


def _descr_to_json(dtype) -> Any:
    import numpy as np
    return np.lib.format.dtype_to_descr(dtype)       # str, or a list of field tuples


def _descr_from_json(descr: Any) -> Any:
    if isinstance(descr, str):
        return descr
    fields = []
    for field in descr:
        name = tuple(field[0]) if isinstance(field[0], list) else field[0]
        sub = _descr_from_json(field[1])
        fields.append((name, sub, tuple(field[2])) if len(field) > 2 else (name, sub))
    return fields


def _raw(a) -> memoryview:
    """The array's bytes in memory order (it must be C- or F-contiguous), no copy."""
    import numpy as np
    return pickle.PickleBuffer(a.view(np.int64) if a.dtype.kind in "mM" else a).raw()


def _floats_or_raw(a):
    """_raw(a), but for an array of native floats a flat view of it in memory order (no copy),
    whose type tells the store its float item size (the chunk codec's hint: byte planes,
    delta chunks)."""
    if a.dtype.kind == "f" and a.dtype.isnative and a.dtype.itemsize in (2, 4, 8) and a.size:
        flat = a.ravel(order="K")
        if flat.flags.c_contiguous and flat.ctypes.data == a.ctypes.data:
            return memoryview(flat)
    return _raw(a)


def save_arrays(store, arrays: Mapping[str, Any], stream: str = "default", meta: Any = None):
    """Checkpoints named NumPy arrays, one buffer each, diffed by name (see the module doc).

    Args:
        store: an open, writable Store.
        arrays: {name: array} of any dtype but object (0-d, empty, C or Fortran order; other
            layouts are stored as a C-contiguous copy); not masked arrays (the mask would be
            lost).
        stream, meta: as for Store.checkpoint (a dict meta keeps its keys; the reserved key
            "snapstore.arrays" holds dtype, shape and order of each array).
    Returns: CheckpointInfo.
    Raises: InvalidArgumentTypeError (store not first, arrays not a mapping of str to arrays of
        a dtype other than object, a masked array), InvalidArgumentError (names, meta),
        StoreIOError; nothing is written then.
    """
    import numpy as np
    require_store(store, "snapstore.save_arrays")
    if not isinstance(arrays, Mapping):
        raise InvalidArgumentTypeError(f"arrays must be a mapping of name to array, got "
                                       f"{type(arrays).__name__}")
    buffers, layout, keep = {}, {}, []
    for name, a in arrays.items():
        if not isinstance(name, str):
            raise InvalidArgumentTypeError(f"array names must be str, got {name!r}")
        if not isinstance(a, np.ndarray):
            raise InvalidArgumentTypeError(f"arrays[{name!r}] is a {type(a).__name__}, not a "
                                           "NumPy array")
        if isinstance(a, np.ma.MaskedArray):
            raise InvalidArgumentTypeError(f"arrays[{name!r}] is a masked array: save_arrays "
                                           "keeps the data only and would lose its mask; save "
                                           "a.data and a.mask as two arrays, or use store.save()")
        if a.dtype.hasobject:
            raise InvalidArgumentTypeError(f"arrays[{name!r}] holds Python objects "
                                           f"({a.dtype}); use store.save() for it")
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            a = np.ascontiguousarray(a)
            keep.append(a)
        order = "F" if a.flags.f_contiguous and not a.flags.c_contiguous else "C"
        try:
            buffers[ARRAY_PREFIX + name] = _floats_or_raw(a)
        except ValueError as exc:       # NumPy: a dtype no buffer can describe
            raise InvalidArgumentTypeError(f"arrays[{name!r}] has a dtype ({a.dtype}) that no "
                                           f"buffer can describe ({exc}); use store.save() "
                                           "for it") from None
        layout[name] = {"dtype": _descr_to_json(a.dtype), "shape": list(a.shape),
                        "order": order}
    info = {"version": ARRAYS_VERSION, "arrays": layout}
    try:
        return store.checkpoint(buffers, stream=stream,
                                meta=wrap_meta(meta, info, ARRAYS_META_KEY))
    finally:
        for view in buffers.values():
            view.release()


def _layout(info) -> dict:
    refuse_other_version(info, ARRAYS_META_KEY, ARRAYS_VERSION, "save_arrays()")
    ours = layer_meta(info, ARRAYS_META_KEY)        # a dict: of ARRAYS_VERSION
    if not isinstance(ours, dict) or not isinstance(ours.get("arrays"), dict):
        raise NotAnObjectCheckpointError(
            f"checkpoint {info.id} of stream {info.stream!r} was not written by save_arrays(), "
            f"so load_arrays() cannot read it: use {reader_hint(info)}")
    return ours["arrays"]


def _specs(info, layout: dict, np) -> dict:
    """{name: (dtype, shape, order)} of a save_arrays() layout, each checked against the
    checkpoint's buffers; NotAnObjectCheckpointError for one that does not describe them (a
    checkpoint that carries the reserved key without having been written by save_arrays)."""
    specs = {}
    for name, spec in layout.items():
        try:
            dtype = np.lib.format.descr_to_dtype(_descr_from_json(spec["dtype"]))
            shape = tuple(spec["shape"])
            order = spec["order"]
            if order not in ("C", "F") or dtype.hasobject or not all(
                    type(n) is int and n >= 0 for n in shape):
                raise ValueError(f"order {order!r}, dtype {dtype}, shape {shape!r}")
            size = info.sizes[ARRAY_PREFIX + name]
            need = dtype.itemsize
            for n in shape:
                need *= n
            if need != size:
                raise ValueError(f"{need} bytes for {dtype} {shape}, the buffer holds {size}")
        except (KeyError, IndexError, TypeError, ValueError, RecursionError) as exc:
            raise NotAnObjectCheckpointError(
                f"checkpoint {info.id} of stream {info.stream!r}: its save_arrays() description "
                f"of array {name!r} does not match its buffers ({type(exc).__name__}: "
                f"{str(exc)[:200]}), so load_arrays() cannot read it") from None
        specs[name] = (dtype, shape, order)
    return specs


def load_arrays(store, id_or_stream: Any, into: Mapping[str, Any] | None = None) -> dict:
    """The arrays of a save_arrays() checkpoint.

    Args:
        store: an open Store.
        id_or_stream: checkpoint id, CheckpointInfo, or stream name (its latest checkpoint).
        into: None, or {name: array} with the same names, dtypes and shapes, writable and
            not masked: the bytes go straight into those arrays (any layout; a copy only when
            it differs from the stored order). Checked before anything is written.
    Returns: {name: writable array in the saved order}, or into.
    Raises: InvalidArgumentTypeError (store not first), CheckpointNotFound,
        NotAnObjectCheckpointError (not a save_arrays() checkpoint: names the call that reads
        it), StructureMismatchError (into=: nothing written), CorruptionError.
    """
    import numpy as np
    require_store(store, "snapstore.load_arrays")
    info = resolve_checkpoint(store, id_or_stream)
    specs = _specs(info, _layout(info), np)
    if into is None:
        out, targets = {}, {}
        for name, (dtype, shape, order) in specs.items():
            buf = uninit_bytearray(info.sizes[ARRAY_PREFIX + name])
            out[name] = np.ndarray(shape, dtype, buffer=buf, order=order)
            targets[ARRAY_PREFIX + name] = buf
        store.restore_into(info.id, targets)
        return out
    if not isinstance(into, Mapping):
        raise InvalidArgumentTypeError(f"load_arrays(into=...) takes a mapping of name to "
                                       f"array, got {type(into).__name__}")
    if set(into) != set(specs):
        have = set(into)
        raise StructureMismatchError(
            f"load_arrays(into=...): names differ: missing {sorted(set(specs) - have)[:5]}, "
            f"not in the checkpoint {sorted(have - set(specs))[:5]}; nothing was written")
    targets, copies = {}, []
    for name, (dtype, shape, order) in specs.items():
        dst = into[name]
        if not isinstance(dst, np.ndarray) or dst.dtype != dtype or dst.shape != shape:
            got = f"{dst.dtype} {dst.shape}" if isinstance(dst, np.ndarray) else \
                type(dst).__name__
            raise StructureMismatchError(
                f"load_arrays(into=...): {name!r} is {dtype} {shape} in the checkpoint, {got} in "
                "the target; nothing was written", name)
        if not dst.flags.writeable:
            raise StructureMismatchError(f"load_arrays(into=...): {name!r} is read-only; "
                                         "nothing was written", name)
        if isinstance(dst, np.ma.MaskedArray):
            raise StructureMismatchError(f"load_arrays(into=...): {name!r} is a masked array, "
                                         "not loaded into in place (its mask would stay as it "
                                         "is); nothing was written", name)
        same = dst.flags.c_contiguous if order == "C" else dst.flags.f_contiguous
        if same and dst.size:
            targets[ARRAY_PREFIX + name] = _raw(dst)
        elif dst.size:
            buf = uninit_bytearray(info.sizes[ARRAY_PREFIX + name])
            targets[ARRAY_PREFIX + name] = buf
            copies.append((dst, np.ndarray(shape, dtype, buffer=buf, order=order)))
    for batch in disjoint_batches(targets):     # one array twice: the last one wins
        store.restore_into(info.id, batch)
    for dst, src in copies:
        np.copyto(dst, src, casting="no")
    return into

