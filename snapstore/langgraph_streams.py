"""How snapstore.langgraph names its streams, without importing LangGraph (the command line uses
it to list a thread's checkpoints on a machine where LangGraph is not installed).

A thread's checkpoints of namespace ``ns`` are in stream ``lg/<key(thread)>/<key(ns)>`` and its
pending writes in ``lw/<key(thread)>/<key(ns)>``, where key() is a readable prefix of the id
plus a hash of it (ids may be any string; the real ids are in each checkpoint's meta, under
"t" and "ns").
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

__all__ = ["CHECKPOINTS_PREFIX", "WRITES_PREFIX", "stream_key", "thread_streams",
           "thread_prefixes", "is_langgraph_stream", "thread_of"]

CHECKPOINTS_PREFIX = "lg/"           # streams of a thread's checkpoints
WRITES_PREFIX = "lw/"                # streams of a thread's pending writes
_SAFE = re.compile(r"[^A-Za-z0-9_.:@+=-]")


def stream_key(value: str) -> str:
    """A stream-name component for any string: readable prefix + hash (no '/', bounded)."""
    raw = value.encode("utf-8", "surrogatepass")
    return f"{_SAFE.sub('_', value[:40])}~{hashlib.blake2b(raw, digest_size=10).hexdigest()}"


def thread_streams(thread_id: str, ns: str) -> tuple[str, str]:
    """(checkpoint stream, writes stream) of one thread and namespace."""
    tail = f"{stream_key(thread_id)}/{stream_key(ns)}"
    return f"{CHECKPOINTS_PREFIX}{tail}", f"{WRITES_PREFIX}{tail}"


def thread_prefixes(thread_id: str) -> tuple[str, str]:
    """(checkpoint, writes) stream-name prefixes of every namespace of one thread."""
    tail = stream_key(thread_id) + "/"
    return CHECKPOINTS_PREFIX + tail, WRITES_PREFIX + tail


def is_langgraph_stream(stream: str) -> bool:
    """True for a name shaped as a LangGraph saver's stream (lg/... or lw/...)."""
    return stream.startswith((CHECKPOINTS_PREFIX, WRITES_PREFIX))


def thread_of(stream: str, meta: Any) -> tuple[str, str] | None:
    """(thread id, namespace) of a checkpoint a LangGraph saver wrote to `stream` with `meta`,
    or None when it is not one: the ids come from the meta and must name this very stream."""
    if not is_langgraph_stream(stream) or not isinstance(meta, dict):
        return None
    thread_id, ns = meta.get("t"), meta.get("ns")
    if not isinstance(thread_id, str) or not isinstance(ns, str):
        return None
    try:
        if stream not in thread_streams(thread_id, ns):
            return None
    except UnicodeError:        # a lone surrogate pair half etc.: not something we wrote
        return None
    return thread_id, ns
