"""What the layers that keep Python objects as checkpoints share (snapstore.objects,
snapstore.arrays, snapstore.torch): the meta keys they reserve, the user's meta in and out of a
checkpoint's meta, the checkpoint a reference names, a contiguous copy of a tensor, and the
float item size label that makes the store code a tensor's bytes as byte planes.

A checkpoint written by one of these layers has in its meta one reserved key (META_KEY for
objects.save, ARRAYS_META_KEY for arrays.save_arrays) holding that layer's description of the
checkpoint. The user's meta stays around it: a dict meta keeps its keys next to the reserved
one, any other meta (None too) is kept as the description's "user" entry. user_meta() gives it
back exactly.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapstore.engine import format as fmt
from snapstore.engine.validation import FLOAT_FORMATS
from snapstore.errors import FormatError, InvalidArgumentError, InvalidArgumentTypeError

__all__ = ["META_KEY", "ARRAYS_META_KEY", "DCP_META_KEY", "DCP_PART_KEY",
           "DCP_METADATA_BUFFER", "WORKFLOW_META_KEY", "MATERIALISE_META",
           "RESERVED_META_KEYS", "wrap_meta", "user_meta", "layer_meta", "reader_hint",
           "require_store", "resolve_checkpoint", "contiguous_tensor", "float_view",
           "labelled_view"]

META_KEY = "snapstore.objects"          # meta key of an objects.save() checkpoint
ARRAYS_META_KEY = "snapstore.arrays"    # meta key of an arrays.save_arrays() checkpoint
DCP_META_KEY = fmt.DCP_META_KEY         # meta key of a DCP checkpoint (snapstore.torch)
DCP_PART_KEY = fmt.DCP_PART_KEY         # ... of one rank's part of a DCP checkpoint
DCP_METADATA_BUFFER = "dcp/metadata"    # the buffer of a DCP checkpoint holding DCP's Metadata
WORKFLOW_META_KEY = "snapstore.workflow"   # ... of a workflow's checkpoint (snapstore.workflow)
RESERVED_META_KEYS = (META_KEY, ARRAYS_META_KEY)
# what a meta tensor (no data) needs before it can be saved or loaded into
MATERIALISE_META = "materialise it first (e.g. module.to_empty(device='cpu') and initialise it)"

_STORE_METHODS = ("checkpoint", "restore_into", "read", "latest", "get")

# The call that reads a checkpoint, by the reserved key its writer set (most specific first).
_READERS = ((META_KEY, "store.load() (or snapstore.torch.load())"),
            (ARRAYS_META_KEY, "snapstore.load_arrays()"),
            (DCP_META_KEY, "torch.distributed.checkpoint.load() with "
                           "snapstore.torch.SnapstoreReader"),
            (DCP_PART_KEY, "torch.distributed.checkpoint.load() (it is one rank's part of a "
                           "DCP checkpoint)"),
            (WORKFLOW_META_KEY, "Workflow.load()"))


def wrap_meta(meta: Any, info: dict, key: str) -> Any:
    """The meta to store for a checkpoint of the layer owning key: a dict meta keeps its keys
    (plus key: info); any other meta (None too) is kept as info["user"] (info is updated).
    Raises InvalidArgumentError if a dict meta uses a reserved key."""
    if isinstance(meta, Mapping):
        if any(k in meta for k in RESERVED_META_KEYS):
            raise InvalidArgumentError(f"meta keys {RESERVED_META_KEYS} are reserved for "
                                       "snapstore")
        return {**meta, key: info}
    info["user"] = meta
    return {key: info}


def layer_meta(info: Any, key: str) -> Any:
    """The reserved entry `key` of a checkpoint (info: a CheckpointInfo, whose reserved part
    is info.reserved_meta, or a stored meta value); None when it has none."""
    reserved = getattr(info, "reserved_meta", None)
    if reserved is None:
        reserved = info if isinstance(info, dict) else {}
    return reserved.get(key)


def reader_hint(info: Any) -> str:
    """The call that reads this checkpoint (by the layer that wrote it), for error messages:
    "store.restore()" for a plain checkpoint."""
    for key, reader in _READERS:
        if layer_meta(info, key) is not None:
            return reader
    return "store.restore() (a plain checkpoint of named buffers)"


def refuse_other_version(info: Any, key: str, version: int, writer: str) -> None:
    """FormatError when the checkpoint carries the layer meta `key` with a version other than
    `version` (the one this snapstore reads): a newer snapstore's writer wrote it, or the
    meta is damaged. Not "written by another call", which a NotAnObjectCheckpointError would
    claim."""
    ours = layer_meta(info, key)
    if isinstance(ours, dict) and ours.get("version") != version:
        raise FormatError(f"checkpoint {info.id} of stream {info.stream!r} was written by "
                          f"{writer} in format version {ours.get('version')!r:.20}, which this "
                          f"snapstore does not read (it reads version {version}): upgrade "
                          "snapstore (or the checkpoint's meta is damaged)")


def require_store(store: Any, function: str) -> None:
    """Raises InvalidArgumentTypeError unless store is a snapstore.Store (the first argument
    of every module-level function of the object layers). Checked by its methods: this layer
    sits below snapstore.store's users and must not import it (the import graph has no
    cycles)."""
    if isinstance(store, (str, bytes, Mapping)) or \
            not all(callable(getattr(store, m, None)) for m in _STORE_METHODS):
        raise InvalidArgumentTypeError(
            f"{function}: the first argument must be an open snapstore.Store (the store comes "
            f"first, as for a Store method), got {type(store).__name__}")


def user_meta(info: Any) -> Any:
    """The meta the caller passed to save() or save_arrays() (info: a CheckpointInfo, whose
    meta already is that, or a stored meta value), exactly. Other checkpoints' meta is
    returned as is."""
    if hasattr(info, "reserved_meta"):
        return info.meta
    meta = info
    if not isinstance(meta, dict):
        return meta
    for key in RESERVED_META_KEYS:
        ours = meta.get(key)
        if isinstance(ours, dict):
            if "user" in ours:
                return ours["user"]
            return {k: v for k, v in meta.items() if k != key}
    return meta


def resolve_checkpoint(store, name: Any):
    """The CheckpointInfo a load names: anything Store.resolve takes (an id, a CheckpointInfo,
    "latest", "latest:STREAM", "STREAM@SEQ", a tag, a stream name for its newest checkpoint, a
    DCP checkpoint_id). Raises CheckpointNotFound, AmbiguousCheckpointName."""
    return store.resolve(name)


_SAME_SIZE_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def contiguous_tensor(t, torch):
    """A contiguous copy of the torch tensor t, also for dtypes without copy kernels (float4,
    bits...): those are copied as integers of the same size. torch: the torch module (passed
    in, so this module never imports it)."""
    as_int = _SAME_SIZE_INT.get(t.element_size())
    if as_int is None:
        return t.contiguous()
    return t.view(getattr(torch, as_int)).contiguous().view(t.dtype)


def copy_tensor(dst, src, torch) -> None:
    """dst.copy_(src) for two tensors of one dtype and shape, bit for bit, also for dtypes
    without copy kernels (float4, bits...): copied as integers of the same size, unless a
    conjugate or negative view asks for copy_'s own semantics."""
    as_int = _SAME_SIZE_INT.get(dst.element_size())
    if as_int is None or any(t.is_conj() or t.is_neg() for t in (dst, src)):
        dst.copy_(src)
        return
    dtype = getattr(torch, as_int)
    dst.view(dtype).copy_(src.view(dtype))


_FORMAT_OF_SIZE = {k: form for form, k in FLOAT_FORMATS.items()}   # the label of each size


def float_view(view: memoryview, tensor) -> memoryview:
    """view (the bytes of a torch tensor or storage) labelled with the item size of the
    tensor's floats: a memoryview of format "e", "f" or "d" by element size (bfloat16 is
    labelled "e" too), so the store codes its chunks as byte planes (format 4); view itself
    for other dtypes."""
    k = tensor.element_size()
    if k not in _FORMAT_OF_SIZE or not tensor.is_floating_point() or view.nbytes % k:
        return view
    return labelled_view(view, k)


def labelled_view(view: memoryview, k: int) -> memoryview:
    """view (bytes, a multiple of k long) as a flat memoryview of k-byte floats
    (memoryview.cast cannot make the 2-byte "e" format: NumPy's float16 view gives it)."""
    if k == 2:
        import numpy as np
        return memoryview(np.frombuffer(view, dtype=np.float16))
    return view.cast(_FORMAT_OF_SIZE[k])
