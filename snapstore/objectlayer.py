"""What the layers that keep Python objects as checkpoints share (snapstore.objects,
snapstore.arrays, snapstore.torch): the meta keys they reserve, the user's meta in and out of a
checkpoint's meta, the checkpoint a reference names, and a contiguous copy of a tensor.

A checkpoint written by one of these layers has in its meta one reserved key (META_KEY for
objects.save, ARRAYS_META_KEY for arrays.save_arrays) holding that layer's description of the
checkpoint. The user's meta stays around it: a dict meta keeps its keys next to the reserved
one, any other meta (None too) is kept as the description's "user" entry. user_meta() gives it
back exactly.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapstore.errors import InvalidArgumentError

__all__ = ["META_KEY", "ARRAYS_META_KEY", "RESERVED_META_KEYS", "wrap_meta", "user_meta",
           "resolve_checkpoint", "contiguous_tensor"]

META_KEY = "snapstore.objects"          # meta key of an objects.save() checkpoint
ARRAYS_META_KEY = "snapstore.arrays"    # meta key of an arrays.save_arrays() checkpoint
RESERVED_META_KEYS = (META_KEY, ARRAYS_META_KEY)


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


def user_meta(info: Any) -> Any:
    """The meta the caller passed to save() or save_arrays() (info: a CheckpointInfo or its
    meta), exactly. Other checkpoints' meta is returned as is."""
    meta = getattr(info, "meta", info)
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
