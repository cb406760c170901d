"""Argument checks shared by every layer that takes names, metadata or option choices, so
each rule exists once and gives the same error everywhere."""
from __future__ import annotations

import json
from typing import Any, Mapping

from snapstore import _native as native
from snapstore.engine import format as fmt
from snapstore.errors import InvalidArgumentError


def validate_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{what} must be valid Unicode text (no lone surrogates), "
                                   f"got {value!r}") from None
    if not raw or len(raw) > fmt.MAX_NAME_BYTES or b"\0" in raw:
        raise InvalidArgumentError(f"{what} must be 1 to {fmt.MAX_NAME_BYTES} UTF-8 bytes "
                                   f"without NUL, got {value!r}")
    return value


def validate_buffers(buffers: Mapping[str, Any], stream: str) -> dict:
    """Checks a stream name and a {buffer name: bytes-like} mapping; returns {name: flat byte
    memoryview} (TypeError for a buffer that is not C-contiguous bytes-like)."""
    validate_name(stream, "stream")
    if not isinstance(buffers, Mapping):
        raise TypeError(f"buffers must be a mapping of name to buffer, got "
                        f"{type(buffers).__name__}")
    views = {}
    for name, obj in buffers.items():
        validate_name(name, "buffer name")
        views[name] = native.as_bytes_view(obj)
    return views


def validate_meta(meta: Any) -> Any:
    """Checks meta is JSON and returns its JSON round trip: what the store keeps, and so what
    every later get() returns."""
    try:
        return json.loads(json.dumps(meta, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"meta must be JSON-serialisable: {exc}") from None


def check_choice(value: str, choices: tuple, what: str) -> str:
    if value not in choices:
        raise InvalidArgumentError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
    return value
