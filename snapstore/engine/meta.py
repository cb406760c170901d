"""Checkpoint meta: the user's keys and snapstore's reserved ones (format.RESERVED_META_PREFIX).

A checkpoint's meta is whatever JSON value the caller passed. When it is a dict, snapstore's own
layers add keys under the reserved prefix (the object layer's pickle description, DCP's
checkpoint id, a workflow's step). Those are kept in the log like any meta, and split off here
for everything shown to people (CheckpointInfo.meta, `snapstore ls`, `show`).
"""
from __future__ import annotations

from typing import Any

from snapstore.engine.format import RESERVED_META_PREFIX


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
