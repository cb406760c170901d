"""Argument checks shared by every layer that takes names, metadata, checkpoint ids or option
values, so each rule exists once and gives the same error everywhere. Every check raises
before anything is touched: InvalidArgumentTypeError (also a TypeError) for a wrong type,
InvalidArgumentError (also a ValueError) for a wrong value."""
from __future__ import annotations

import json
import math
import os
from typing import Any, Mapping

import zstandard

from snapstore import _native as native
from snapstore.engine import format as fmt
from snapstore.engine.meta import user_meta
from snapstore.errors import InvalidArgumentError, InvalidArgumentTypeError

MAX_CHECKPOINT_ID = (1 << (8 * fmt.CKPT_KEY.size)) - 1
# zstd's level range: ZSTD_minCLevel() (-ZSTD_TARGETLENGTH_MAX) to ZSTD_maxCLevel().
MIN_COMPRESSION_LEVEL = -(1 << 17)
MAX_COMPRESSION_LEVEL = zstandard.MAX_COMPRESSION_LEVEL


# The latest creation time a checkpoint may carry: the last second of the year 9999, the
# end of what datetime (and so ISO 8601 output, `ls`, retention) can show.
MAX_CREATED = 253402300799


def is_created_time(value: Any) -> bool:
    """Whether value can be a checkpoint's creation time: seconds since the epoch, a real
    number from 0 to MAX_CREATED (not a bool, NaN or an infinity; a huge int is compared, never
    converted to float)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and \
        0 <= value <= MAX_CREATED


def _type_name(value: Any) -> str:
    return type(value).__name__


def validate_int(value: Any, what: str, low: int | None = None, high: int | None = None) -> int:
    """An int (not a bool) in [low, high] (either bound optional)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgumentTypeError(f"{what} must be an int, got {_type_name(value)}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = (f"from {low} to {high}" if low is not None and high is not None
                  else f">= {low}" if low is not None else f"<= {high}")
        raise InvalidArgumentError(f"{what} must be an int {bounds}, got {value!r}")
    return value


def validate_flag(value: Any, what: str) -> bool:
    """A bool (0 and 1 accepted as such)."""
    if value is True or value is False:
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InvalidArgumentTypeError(f"{what} must be a bool, got {value!r}")


def validate_checkpoint_id(value: Any) -> int:
    """A checkpoint id: an int from 0 to 2**64 - 1 (what the index can hold)."""
    return validate_int(value, "checkpoint id", 0, MAX_CHECKPOINT_ID)


def validate_timeout(value: Any, what: str = "timeout") -> float:
    """Seconds (to wait for a lock, ...): a number >= 0 (inf: for ever; not nan). what: the
    argument's name, for the message."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgumentTypeError(f"{what} must be a number of seconds, got "
                                       f"{_type_name(value)}")
    if math.isnan(value) or value < 0:
        raise InvalidArgumentError(f"{what} must be >= 0 seconds, got {value!r}")
    return float(value)


def validate_compression_level(value: Any) -> int:
    """A zstd compression level, in zstd's range."""
    return validate_int(value, "compression_level", MIN_COMPRESSION_LEVEL,
                        MAX_COMPRESSION_LEVEL)


def validate_path(value: Any) -> str:
    """A store path: a str, bytes or os.PathLike naming a file system path without NUL."""
    try:
        path = os.fspath(value)
    except TypeError:
        raise InvalidArgumentTypeError(f"path must be a str or os.PathLike, got "
                                       f"{_type_name(value)}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path or "\0" in path:
        raise InvalidArgumentError(f"path must be a non-empty path without NUL, got {path!r}")
    try:
        os.fsencode(path)
    except UnicodeEncodeError:          # a lone surrogate: no file system name is that
        raise InvalidArgumentError(f"path {path!r} cannot be a file name here (it is not "
                                   "valid in the file system's encoding)") from None
    return path


def validate_name(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgumentTypeError(f"{what} must be a str, got {_type_name(value)}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgumentError(f"{what} must be valid Unicode text (no lone surrogates), "
                                   f"got {value!r}") from None
    if not raw or len(raw) > fmt.MAX_NAME_BYTES or b"\0" in raw:
        raise InvalidArgumentError(f"{what} must be 1 to {fmt.MAX_NAME_BYTES} UTF-8 bytes "
                                   f"without NUL, got {value!r}")
    return value


def buffer_view(obj: Any, what: str, writable: bool = False) -> memoryview:
    """A flat byte view of a C-contiguous bytes-like object (writable when asked)."""
    try:
        return native.as_bytes_view(obj, writable=writable, name=what)
    except TypeError as exc:
        raise InvalidArgumentTypeError(str(exc)) from None


# buffer formats whose items the byte-plane codec takes (floats, native or little-endian),
# by their item size; a memoryview of one of them labels its bytes as floats of that size
FLOAT_FORMATS = {"e": 2, "f": 4, "d": 8}


def float_item_size(obj: Any) -> int:
    """The item size of a buffer of floats (a NumPy float16/32/64 array, a memoryview cast to
    "e"/"f"/"d"): 2, 4 or 8; 1 for anything else (bytes, integers, structured or big-endian
    items, objects without the buffer protocol). A hint for the chunk codec only."""
    try:
        with memoryview(obj) as mv:
            form = mv.format[1:] if mv.format[:1] in "@=<" else mv.format
            size = FLOAT_FORMATS.get(form, 1)
            return size if mv.itemsize == size else 1
    except (TypeError, ValueError, BufferError):
        return 1


def validate_buffers(buffers: Mapping[str, Any], stream: str,
                     itemsizes: dict | None = None) -> dict:
    """Checks a stream name and a {buffer name: bytes-like} mapping; returns {name: flat byte
    memoryview} (InvalidArgumentTypeError for a buffer that is not C-contiguous bytes-like).
    With `itemsizes` (a dict), also sets itemsizes[name] = float_item_size of each buffer."""
    validate_name(stream, "stream")
    if not isinstance(buffers, Mapping):
        raise InvalidArgumentTypeError(f"buffers must be a mapping of name to buffer, got "
                                       f"{_type_name(buffers)}")
    views = {}
    for name, obj in buffers.items():
        validate_name(name, "buffer name")
        views[name] = buffer_view(obj, f"buffer {name!r}")
        if itemsizes is not None:
            itemsizes[name] = float_item_size(obj)
    return views


MAX_META_DEPTH = 100     # nesting levels of a checkpoint's meta (JSON arrays and objects)
# Levels snapstore's reserved keys may add around a user's meta as stored (engine/meta.py):
# the object layers and copies keep a meta that is not a dict as {key: {..., "user": meta}} (2),
# a group commit its participants' as {key: {"parts": {participant: meta}}} (3), and such a
# participant's meta may be an object layer's (5). A meta that was accepted stays copyable.
RESERVED_META_LEVELS = 8


def _nesting(value: Any) -> int:
    """How deep lists, tuples and dicts nest in value (0 for a scalar), without recursing:
    meta too deep for Python's recursion limit must be refused, not crash the check. Stops
    counting past MAX_META_DEPTH + RESERVED_META_LEVELS + 1."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_META_DEPTH + RESERVED_META_LEVELS:
            break
        todo.extend((child, depth + 1) for child in children)
    return deepest


def validate_meta(meta: Any) -> Any:
    """Checks meta is JSON, its user's part (meta.user_meta: without snapstore's reserved keys)
    nested at most MAX_META_DEPTH levels and the whole at most RESERVED_META_LEVELS more (the
    store decodes a commit's meta deep inside its own calls: deeper meta would fail there,
    after the commit), and returns its JSON round trip: what the store keeps, and so what
    every later get() returns."""
    if (_nesting(user_meta(meta)) > MAX_META_DEPTH
            or _nesting(meta) > MAX_META_DEPTH + RESERVED_META_LEVELS):
        raise InvalidArgumentTypeError(f"meta nests more than {MAX_META_DEPTH} levels of "
                                       "lists and dicts")
    try:
        return json.loads(json.dumps(meta, allow_nan=False))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidArgumentTypeError(f"meta must be JSON-serialisable: {exc}") from None


def validate_part_meta(meta: Any) -> Any:
    """validate_meta for a group participant's meta, which the group's commit nests a few
    levels (fewer than RESERVED_META_LEVELS) deep in the checkpoint's reserved meta: the whole
    of it, reserved keys included, at most MAX_META_DEPTH levels. (A part whose reserved keys
    nested past it was staged and committed, and no copy or import of that checkpoint could
    take its meta.)"""
    meta = validate_meta(meta)
    if _nesting(meta) > MAX_META_DEPTH:
        raise InvalidArgumentTypeError(f"a group part's meta nests more than "
                                       f"{MAX_META_DEPTH} levels of lists and dicts")
    return meta


def check_choice(value: Any, choices: tuple, what: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise InvalidArgumentError(f"{what} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _first_overlap(spans: list) -> tuple | None:
    """Two of spans [(address, length, name)] (non-empty) that share memory, or None. Sorted
    by address, two overlap only if two neighbours do."""
    spans = sorted(spans)
    for (start, size, name), (nxt, _, other) in zip(spans, spans[1:]):
        if nxt < start + size:
            return name, other
    return None


def check_disjoint(targets: Mapping[str, memoryview]) -> None:
    """InvalidArgumentError naming two of targets (writable views a restore fills) that share
    memory: one would overwrite what the other received (wrong bytes, silently)."""
    found = _first_overlap([(native.buffer_address(v), len(v), name)
                            for name, v in targets.items() if len(v)])
    if found is not None:
        raise InvalidArgumentError(f"buffers {found[0]!r} and {found[1]!r} share memory: "
                                   "restoring into both would overwrite one with the other")


def disjoint_batches(targets: Mapping[str, memoryview]) -> list[dict]:
    """targets split into batches of targets that share no memory, for a layer whose targets
    may be tied (two tensors of one storage in DCP, one array twice in load_arrays): restored
    batch after batch, a target overlapping earlier ones is written after them, so the last
    one wins as writing them one by one would. One batch when none overlap (the usual case)."""
    spans = {name: (native.buffer_address(v), len(v)) for name, v in targets.items()}
    if _first_overlap([(a, n, name) for name, (a, n) in spans.items() if n]) is None:
        return [dict(targets)]
    # clusters of targets whose memory overlaps, by one sweep over addresses; levels are
    # worked out within each (a handful of tied targets), in the order targets were given
    rank = {name: i for i, name in enumerate(targets)}
    levels = dict.fromkeys(targets, 0)
    cluster: list = []
    end = -1
    for a, n, name in sorted((a, n, name) for name, (a, n) in spans.items() if n) + [(None,) * 3]:
        if name is not None and a < end:
            cluster.append(name)
            end = max(end, a + n)
            continue
        cluster.sort(key=rank.__getitem__)
        for i, x in enumerate(cluster):
            ax, nx = spans[x]
            levels[x] = 1 + max((levels[y] for y in cluster[:i]
                                 if spans[y][0] < ax + nx and ax < spans[y][0] + spans[y][1]),
                                default=-1)
        if name is not None:
            cluster, end = [name], a + n
    batches: list[dict] = [{} for _ in range(max(levels.values()) + 1)]
    for name, view in targets.items():
        batches[levels[name]][name] = view
    return batches
