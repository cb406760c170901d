"""Checkpoint meta: the user's keys and snapstore's reserved ones (format.RESERVED_META_PREFIX).

A checkpoint's meta is whatever JSON value the caller passed. When it is a dict, snapstore's own
layers add keys under the reserved prefix (the object layer's pickle description, DCP's
checkpoint id, a workflow's step). Those are kept in the log like any meta, and split off here
for everything shown to people (CheckpointInfo.meta, `snapstore ls`, `show`).
"""
from __future__ import annotations

from typing import Any

from snapstore.engine.format import ORIGIN_META_KEY, RESERVED_META_PREFIX


def is_reserved_key(key: Any) -> bool:
    """True for a meta key that belongs to snapstore, not the user."""
    return isinstance(key, str) and key.startswith(RESERVED_META_PREFIX)


def user_meta(meta: Any) -> Any:
    """The user's part of meta: a dict without the reserved keys (other values unchanged)."""
    if isinstance(meta, dict) and any(is_reserved_key(k) for k in meta):
        return {k: v for k, v in meta.items() if not is_reserved_key(k)}
    return meta


def reserved_meta(meta: Any) -> dict:
    """snapstore's part of meta: {reserved key: value} ({} when there is none)."""
    if isinstance(meta, dict):
        return {k: v for k, v in meta.items() if is_reserved_key(k)}
    return {}


def original_meta(meta: Any) -> Any:
    """meta without the provenance a copy or an import added (ORIGIN_META_KEY): the meta of
    the checkpoint it was copied from (with_origin's inverse)."""
    if not isinstance(meta, dict) or ORIGIN_META_KEY not in meta:
        return meta
    rest = {k: v for k, v in meta.items() if k != ORIGIN_META_KEY}
    origin = meta[ORIGIN_META_KEY]
    if not rest and isinstance(origin, dict) and "user" in origin:
        return origin["user"]           # the original was not a dict
    return rest


def with_origin(meta: Any, origin: dict) -> Any:
    """The meta of a copy of a checkpoint whose meta is `meta` (as stored, reserved keys
    included): its original meta (original_meta) with ORIGIN_META_KEY: origin added. A meta
    that is not a dict (None too) is kept as origin["user"], as the object layers keep it,
    so CheckpointInfo.meta of the copy is the original's."""
    meta = original_meta(meta)
    if isinstance(meta, dict):
        return {**meta, ORIGIN_META_KEY: dict(origin)}
    return {ORIGIN_META_KEY: {**origin, "user": meta}}
