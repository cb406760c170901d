"""A LangGraph checkpoint saver on a snapstore store: one stream per (thread, namespace), one
snapstore checkpoint per LangGraph checkpoint, one buffer per channel value.

    from snapstore.langgraph import SnapstoreSaver

    with SnapstoreSaver.from_path("agent-state") as saver:
        graph = builder.compile(checkpointer=saver)
        graph.invoke(inputs, {"configurable": {"thread_id": "t1"}})

How LangGraph data maps onto streams, checkpoints and buffers (docs/integrations.md has more):

* stream ``lg/<thread>/<ns>`` holds the thread's checkpoints of one namespace, in put order;
  stream ``lw/<thread>/<ns>`` holds its pending writes, one snapstore checkpoint per
  ``put_writes`` call. ``<thread>`` and ``<ns>`` are a readable prefix of the id plus a hash
  of it (ids may be any string); the real ids are in each checkpoint's meta.
* a LangGraph checkpoint is one snapstore checkpoint. Its meta (JSON) holds the checkpoint
  without its values and the metadata (both through the saver's serde), the parent id and a
  table channel -> (version, encoding, buffer). Every channel value of the checkpoint is one
  buffer named after the channel, so each snapstore checkpoint is self-contained (deleting
  others never breaks it) while a value that did not change is not stored again: its bytes
  page-diff to nothing against the stream's previous checkpoint (and are deduplicated by
  content against anything older). Unchanged values are taken from an in-memory cache of
  the serialized bytes (or read back from the store), never serialized again.
* values are serialized with ``self.serde``, except ``bytes``, ``bytearray`` and plain NumPy
  arrays when the serde is LangGraph's JsonPlusSerializer: those go into their buffer raw
  (zero-copy), so an array of which 1% changed stores about 1% of its pages. Serialized
  values and bytes are zero-padded to a power-of-two buffer size, so a value that grows (a
  message list) keeps its buffer size and stores only the pages that changed. Serialized
  values of at most INLINE_MAX bytes are kept in the meta instead of a buffer.
* reading the "latest" checkpoint means the greatest checkpoint id, as LangGraph's savers do;
  a re-put of an existing checkpoint id replaces it.

Many workers (processes, or Stores of one process) may write one store at once. A put builds on
the checkpoint its config names and is stored only if that is still the thread's newest (a
compare-and-swap on the stream's head: snapstore's expect_head), so two workers on one thread
get CommitConflict, never interleaved states; the branches LangGraph marks itself (time travel,
update_state: metadata source "fork"/"update") may start from any checkpoint (the ``forks``
option). Pending writes are independent records, stored exactly once per (task, index) whoever
writes them, retried when another worker's writes get in the way. What the saver keeps in memory
(stream indexes, the value cache) is checked against the stream's state at every call, so
another writer's commits and deletes are always seen. On an S3 store that state is the local
cache's, which follows the bucket at most ``refresh`` seconds late (open()'s option; 0: every
read asks the bucket); delete_thread, delete_for_runs and prune pull the bucket first, so they
never miss a checkpoint another machine stored before they were called.

The sync methods do the work; the async ones run them in a worker thread
(``asyncio.to_thread``), so disk I/O never blocks the event loop. All savers on one Store share
one lock and one cache, so any number of them (and of threads) may use a store at once.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import os
import random
import pickle
import sys
import threading
import time
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

try:
    from langgraph.checkpoint.base import (WRITES_IDX_MAP, BaseCheckpointSaver, ChannelVersions,
                                           Checkpoint, CheckpointMetadata, CheckpointTuple,
                                           get_checkpoint_metadata)
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("snapstore.langgraph needs LangGraph's checkpoint package: "
                      "pip install 'snapstore[langgraph]'") from exc

from snapstore.store import default_durability
from snapstore.store import open as open_store
from snapstore.engine.registry import SharedByPath
from snapstore.remote.layout import is_remote
from snapstore.errors import (CheckpointNotFound, CommitConflict, InvalidArgumentError,
                              InvalidArgumentTypeError, ObjectSaveError, StoreClosedError)
from snapstore.langgraph_streams import stream_key as _key
from snapstore.langgraph_streams import thread_streams as _streams
from snapstore.store import Store

__all__ = ["SnapstoreSaver", "INLINE_MAX", "DEFAULT_CACHE_BYTES", "FORKS", "MARKED_FORKS",
           "describe_checkpoint"]

INLINE_MAX = 64                      # serialized values up to this many bytes live in the meta
DEFAULT_CACHE_BYTES = 256 << 20      # serialized bytes of current channel values kept per store
_NAME_MAX = 200                      # longest channel name used verbatim in a buffer name
_MIN_CAPACITY = 4096                 # smallest padded buffer (one page)
_MAX_INDEXES = 1024                  # streams whose index a store's savers keep in memory
_DONE = object()
FORKS = ("marked", "never", "any")   # SnapstoreSaver(forks=...): which puts may fork a thread
MARKED_FORKS = ("fork", "update")    # metadata sources LangGraph gives the puts that branch
_ATTEMPTS = 50                       # tries of a write another writer's commits get in the way of
_READ_ATTEMPTS = 5                   # tries of a read whose checkpoint another writer deleted


def _backoff(attempt: int) -> None:
    """Sleeps before the next try of a write that met another writer's commit (1 ms doubling
    to 50 ms, jittered so two writers do not retry in step)."""
    time.sleep(min(0.05, 0.001 * 2 ** attempt) * random.uniform(0.5, 1.5))


def _retrying(operation: Any) -> Any:
    """operation(), tried again (bounded) while it meets another writer's operation in
    progress on the same checkpoints (CommitConflict): for deletes and copies, which do not
    depend on what the other writer does."""
    for attempt in range(_ATTEMPTS - 1):
        try:
            return operation()
        except CommitConflict:
            _backoff(attempt)
    return operation()


def _writes_sort_key(task_path: str, task_id: str, idx: int) -> tuple:
    # The order live execution applies a super-step's writes in (LangGraph's writes_sort_key).
    return (task_path, task_id, idx)


# ---- names (streams: snapstore.langgraph_streams) -------------------------------------------
def _buffer_name(prefix: str, channel: str) -> str:
    try:
        raw = channel.encode("utf-8")
    except UnicodeEncodeError:
        raw = b""
    if 0 < len(raw) <= _NAME_MAX and b"\0" not in raw:
        return prefix + ":" + channel
    digest = hashlib.blake2b(channel.encode("utf-8", "surrogatepass"), digest_size=16)
    return prefix + "#" + digest.hexdigest()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"))


def _read_values(store: Store, serde: Any, sid: int, entries: Mapping[Any, dict]) -> dict:
    """{key: value} of the entries (of checkpoint sid) that hold a value."""
    out: dict = {}
    targets: dict = {}
    for key, entry in entries.items():
        k = entry["k"]
        if k == "e":
            continue
        if k == "i":
            out[key] = serde.loads_typed((entry["t"], _unb64(entry["d"])))
        elif k == "s":
            data = store.read(sid, entry["b"], 0, entry["n"])
            out[key] = serde.loads_typed((entry["t"], data))
        elif k == "y":
            data = store.read(sid, entry["b"], 0, entry["n"])
            out[key] = data if entry["t"] == "bytes" else bytearray(data)
        else:
            import numpy as np
            arr = np.empty(entry["sh"], dtype=np.dtype(entry["dt"]), order=entry["o"])
            flat = arr.T if entry["o"] == "F" else arr
            targets[entry["b"]] = flat.reshape(-1).view(np.uint8)
            out[key] = arr
    if targets:
        store.restore_into(sid, targets)
    return out


def _config_ids(config: Any, *, need_id: bool = False) -> tuple[str, str, str | None]:
    """(thread_id, checkpoint_ns, checkpoint_id) of a config, type-checked."""
    if not isinstance(config, Mapping) or not isinstance(config.get("configurable"), Mapping):
        raise InvalidArgumentTypeError("config must be a dict with a 'configurable' dict")
    conf = config["configurable"]
    if "thread_id" not in conf:
        raise InvalidArgumentError("config['configurable'] needs a 'thread_id'")
    thread_id = conf["thread_id"]
    _check_thread_id(thread_id)
    ns = conf.get("checkpoint_ns")
    if ns is None:
        ns = ""
    elif not isinstance(ns, str):      # 0 or False too: list() would take them as given
        raise InvalidArgumentTypeError(f"checkpoint_ns must be a str, got {type(ns).__name__}")
    checkpoint_id = conf.get("checkpoint_id")
    if checkpoint_id is not None and not isinstance(checkpoint_id, str):
        raise InvalidArgumentTypeError(f"checkpoint_id must be a str, got {type(checkpoint_id).__name__}")
    checkpoint_id = checkpoint_id or None
    if need_id and checkpoint_id is None:
        raise InvalidArgumentError("config['configurable'] needs a 'checkpoint_id' (the checkpoint the "
                         "writes belong to)")
    return thread_id, ns, checkpoint_id


def _check_version(what: str, channel: str, version: Any) -> None:
    """InvalidArgumentTypeError unless version is what LangGraph's ChannelVersions hold (a
    str, int or float): anything else is stored in JSON and looked up by value, and an
    unhashable one (a list) made the thread unreadable once stored."""
    if isinstance(version, bool) or not isinstance(version, (str, int, float)):
        raise InvalidArgumentTypeError(f"{what}: the version of channel {channel!r} must be a "
                                       f"str, int or float, got {type(version).__name__} "
                                       f"{version!r:.60}")


def _before_id(before: Any) -> str | None:
    """The checkpoint_id of list()'s `before` config. Only that id counts: LangGraph passes
    {"configurable": {"checkpoint_id": ...}} alone (a subgraph replaying from its parent's
    checkpoint, langgraph/_internal/_replay.py)."""
    if before is None:
        return None
    if not isinstance(before, Mapping) or not isinstance(before.get("configurable"), Mapping):
        raise InvalidArgumentTypeError("before must be a dict with a 'configurable' dict")
    checkpoint_id = before["configurable"].get("checkpoint_id") or None
    if checkpoint_id is not None and not isinstance(checkpoint_id, str):
        raise InvalidArgumentTypeError(f"checkpoint_id must be a str, got {type(checkpoint_id).__name__}")
    return checkpoint_id


def _check_thread_id(thread_id: Any) -> str:
    if not isinstance(thread_id, str):
        raise InvalidArgumentTypeError(f"thread_id must be a str, got {type(thread_id).__name__}")
    return thread_id


def _is_open(store: Store) -> bool:
    try:
        store.latest("lg")
    except StoreClosedError:
        return False
    return True


# ---- what the saver remembers of a store ----------------------------------------------------
@dataclass
class _Record:
    """One stored LangGraph checkpoint: its snapstore id and meta."""
    sid: int
    meta: dict
    _metadata: Any = None

    @property
    def cid(self) -> str:
        return self.meta["id"]


@dataclass
class _Indexed:
    """What the saver knows of one stream, valid while the stream's version
    (Store.stream_version: head, seq, count) is `token`: _load_index checks that at every call,
    so another writer's commits and deletes (another Store, another process) are always
    seen."""
    token: tuple[int, int, int] | None

    @property
    def head(self) -> int | None:
        """The stream's head (snapstore id) in the state this index describes."""
        return self.token[0] if self.token else None

    def add(self, sid: int, meta: dict) -> None:
        raise NotImplementedError

    def added(self, sid: int, seq: int, meta: dict) -> None:
        """Takes in a checkpoint (id sid, seq) this process just committed on top of the state
        the index describes (a commit with expect_head=self.head). Should a delete by another
        writer have lowered the count meanwhile, the token is one no real state has: the next
        call rebuilds."""
        self.add(sid, meta)
        self.token = (sid, seq, (self.token[2] if self.token else 0) + 1)


@dataclass
class _StreamIndex(_Indexed):
    """The checkpoints of one lg/ stream, by LangGraph id, and where each (channel, version)
    is stored."""
    records: dict = field(default_factory=dict)   # checkpoint id -> newest _Record
    stale: dict = field(default_factory=dict)     # checkpoint id -> [older sids]
    blobs: dict = field(default_factory=dict)     # (channel, version) -> (sid, entry)

    def add(self, sid: int, meta: dict) -> None:
        cid = meta["id"]
        old = self.records.get(cid)
        if old is not None:
            self.stale.setdefault(cid, []).append(old.sid)
        self.records[cid] = _Record(sid, meta)
        for table in ("ch", "x"):
            for channel, entry in meta.get(table, {}).items():
                try:
                    self.blobs[(channel, entry["v"])] = (sid, entry)
                except TypeError:
                    # an unhashable version (a list) an older snapstore stored: no put can
                    # name it (put refuses it now), and the thread stays readable
                    pass

    def latest(self) -> _Record | None:
        """The newest checkpoint: the greatest LangGraph id, as LangGraph's savers read it."""
        return self.records[max(self.records)] if self.records else None


@dataclass
class _WritesIndex(_Indexed):
    """The put_writes records of one lw/ stream, by checkpoint id (oldest first)."""
    by_checkpoint: dict = field(default_factory=dict)   # checkpoint id -> [(sid, meta)]

    def add(self, sid: int, meta: dict) -> None:
        self.by_checkpoint.setdefault(meta["id"], []).append((sid, meta))

    def keys(self, checkpoint_id: str) -> set:
        return {(m["task"], w[0]) for _, m in self.by_checkpoint.get(checkpoint_id, ())
                for w in m["w"]}


class _Shared:
    """State all savers of one Store share: the lock, stream indexes and the value cache."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.indexes: OrderedDict = OrderedDict()  # stream -> _StreamIndex | _WritesIndex
        # (stream, channel) -> (version, sid, entry, bytes): the serialized value of a channel
        # version, valid only while the stream's index says that version is stored in sid
        self.values: OrderedDict = OrderedDict()
        self.cached_bytes = 0
        self.cache_limit = DEFAULT_CACHE_BYTES

    def cache_put(self, stream: str, channel: str, version: Any, sid: int, entry: dict,
                  payload: bytes | None) -> None:
        key = (stream, channel)
        old = self.values.pop(key, None)
        if old is not None:
            self.cached_bytes -= len(old[3] or b"")
        size = len(payload or b"")
        if size > self.cache_limit:
            return
        self.values[key] = (version, sid, entry, payload)
        self.cached_bytes += size
        while self.cached_bytes > self.cache_limit:
            _, evicted = self.values.popitem(last=False)
            self.cached_bytes -= len(evicted[3] or b"")

    def cache_get(self, stream: str, channel: str, version: Any, sid: int):
        """(entry, payload) of the channel version stored in checkpoint sid, if cached. The
        caller names sid from the stream's current index, so a value another worker stored
        under the same version (LangGraph versions of two workers can collide), or one whose
        checkpoint was deleted, is never served."""
        hit = self.values.get((stream, channel))
        if hit is None or hit[0] != version or type(hit[0]) is not type(version) \
                or hit[1] != sid:
            return None
        self.values.move_to_end((stream, channel))
        return hit[2], hit[3]

    def remember(self, stream: str, idx: Any) -> None:
        self.indexes[stream] = idx
        self.indexes.move_to_end(stream)
        while len(self.indexes) > _MAX_INDEXES:
            self.indexes.popitem(last=False)

    def forget(self, stream: str) -> None:
        """Drops what is known of a stream (after deletions)."""
        self.indexes.pop(stream, None)
        for key in [k for k in self.values if k[0] == stream]:
            self.cached_bytes -= len(self.values.pop(key)[3] or b"")


_SHARED: "weakref.WeakKeyDictionary[Store, _Shared]" = weakref.WeakKeyDictionary()
_SHARED_LOCK = threading.Lock()


def _after_fork_in_child() -> None:
    """A fork()ed child gets fresh locks for the shared saver state: a thread of the parent
    may have held one mid-put at the fork, and the child's first call would wait for it for
    ever instead of raising ForkedStoreError from the store."""
    global _SHARED_LOCK
    _SHARED_LOCK = threading.Lock()
    for state in list(_SHARED.values()):
        state.lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _shared_for(store: Store) -> _Shared:
    with _SHARED_LOCK:
        state = _SHARED.get(store)
        if state is None:
            state = _SHARED[store] = _Shared()
        return state


# ---- stores opened by path, shared within the process ---------------------------------------
# Stores closed behind the savers' back are replaced on the next acquire.
_OPEN: SharedByPath[Store] = SharedByPath(close=lambda store: store.close(), is_alive=_is_open)


def _acquire(path: str, options: dict) -> Store:
    """The process's Store for a path, opened on first use: every saver of the path in this
    process shares it (one log, one index and value cache), if it asks for the same open
    options. Other processes open their own writer Store on the path."""
    def admit(first: dict) -> None:
        wanted = _resolved(path, options)
        if wanted.get("readonly") and not first.get("readonly"):
            wanted["readonly"] = False          # a writer serves readers too
        differ = sorted(k for k in set(first) | set(wanted) if first.get(k) != wanted.get(k))
        if differ:
            raise InvalidArgumentError(
                f"{path} is already open in this process with "
                f"{', '.join(f'{k}={first.get(k)!r}' for k in differ)}; a saver opened by "
                f"path shares that store, so it cannot have "
                f"{', '.join(f'{k}={wanted.get(k)!r}' for k in differ)}")

    return _OPEN.acquire(path, lambda _real_path: open_store(path, **options),
                         settings=_resolved(path, options), admit=admit)


def _resolved(path: Any, options: dict) -> dict:
    """The open options with snapstore.open's defaults filled in (the durability as open
    resolves it), so a default left out and the same value spelled out compare equal, and
    a default never silently shares a store opened otherwise."""
    try:
        bound = inspect.signature(open_store).bind(path, **options)
    except TypeError:
        return dict(options)                    # open() reports it
    bound.apply_defaults()
    out = dict(bound.arguments)
    out.pop("path", None)
    if out.get("durability") is None:
        out["durability"] = default_durability(path)
    return out


class _SaverContext:
    """What SnapstoreSaver.from_path returns: a sync and async context manager."""

    def __init__(self, cls: type, path: Any, saver_options: dict, options: dict) -> None:
        self._args = (cls, path, saver_options, options)
        self._saver: SnapstoreSaver | None = None

    def __enter__(self) -> "SnapstoreSaver":
        cls, path, saver_options, options = self._args
        store = _acquire(path, options)
        try:
            self._saver = cls(store, **saver_options)
        except BaseException:
            _OPEN.release(store)
            raise
        return self._saver

    def __exit__(self, *exc: Any) -> None:
        saver, self._saver = self._saver, None
        if saver is not None:
            _OPEN.release(saver.store)

    async def __aenter__(self) -> "SnapstoreSaver":
        return await asyncio.to_thread(self.__enter__)

    async def __aexit__(self, *exc: Any) -> None:
        await asyncio.to_thread(self.__exit__, *exc)


# ---- the saver ------------------------------------------------------------------------------
class SnapstoreSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer storing into a snapstore store (sync and async interface).

    Args:
        store: an open snapstore Store (the saver does not close it). Read-only stores serve
            the read methods; writes raise ReadOnlyError.
        serde: LangGraph serializer for values, checkpoints and metadata (default:
            JsonPlusSerializer). bytes/bytearray/NumPy values bypass it (stored raw) only when
            it is LangGraph's JsonPlusSerializer itself (not a subclass), so an encrypting
            serde always sees every value.
        cache_bytes: budget of the per-store cache of serialized channel values used to store
            unchanged channels without serializing them again (default 256 MiB, shared by
            all savers of the store; the latest value given wins).
        forks: which puts may branch a thread (and namespace) off a checkpoint that is not
            its newest. Every put builds on the checkpoint its config names (its parent; none
            for a thread's first checkpoint) and by default must build on the thread's newest
            one, so two workers on one thread get CommitConflict instead of interleaving
            their states. "marked" (default): except the puts LangGraph itself marks as
            branching (metadata source "fork" or "update": time travel, update_state on an
            older checkpoint, a copy), which may build on any checkpoint. "never": no
            exception (update_state on an older checkpoint, and time travel, raise
            CommitConflict). "any": every put is accepted, as LangGraph's own savers do
            (for a thread only ever written by one worker at a time).
    Raises: TypeError if store is not a Store, StoreClosedError if it is closed,
        InvalidArgumentError for a bad cache_bytes or forks.
    """

    def __init__(self, store: Store, *, serde: Any = None,
                 cache_bytes: int | None = None, forks: str = "marked") -> None:
        if not isinstance(store, Store):
            raise InvalidArgumentTypeError(f"store must be a snapstore Store, got {type(store).__name__}")
        if not _is_open(store):
            raise StoreClosedError(f"store {store.path} is closed")
        if cache_bytes is not None and (isinstance(cache_bytes, bool)
                                        or not isinstance(cache_bytes, int) or cache_bytes < 0):
            raise InvalidArgumentError(f"cache_bytes must be an int >= 0, got {cache_bytes!r}")
        if not isinstance(forks, str) or forks not in FORKS:
            raise InvalidArgumentError(f"forks must be one of {', '.join(FORKS)}; got {forks!r}")
        super().__init__(serde=serde)
        self.forks = forks
        self.store = store
        self._shared = _shared_for(store)
        if cache_bytes is not None:
            self._shared.cache_limit = cache_bytes
        # LangGraph's own serializer only: a subclass may encrypt or compress in dumps_typed
        self._raw_ok = type(self.serde) is JsonPlusSerializer

    @classmethod
    def from_path(cls, path: Any, *, serde: Any = None, cache_bytes: int | None = None,
                  forks: str = "marked", **open_options: Any) -> _SaverContext:
        """Context manager (``with`` or ``async with``) opening the store at path (created if
        needed; open_options go to snapstore.open) and closing it on exit. Savers opened on
        the same path in one process share one Store, closed when the last one exits;
        savers in other processes open their own. Each sees everything the others wrote.

        A local store is opened with sync_index=False unless open_options say otherwise: a
        put is as durable, with one sync instead of three (snapstore.open documents the
        price: a rebuild of the index after a power cut while the saver was open)."""
        if "sync_index" not in open_options and not is_remote(path):
            open_options = {**open_options, "sync_index": False}
        return _SaverContext(cls, path, {"serde": serde, "cache_bytes": cache_bytes,
                                         "forks": forks}, open_options)

    def __repr__(self) -> str:
        return f"<SnapstoreSaver {self.store.path!r} forks={self.forks!r}>"

    # ---- values -----------------------------------------------------------------------------
    def _encode(self, value: Any, path: str) -> tuple[dict, Any]:
        """(entry, payload): payload is a bytes-like for the value's buffer, or None when the
        value lives in the entry. Raw for bytes/bytearray/NumPy, else the serde; a value the
        serde cannot serialize is an ObjectSaveError naming path (nothing is written)."""
        if self._raw_ok:
            kind = type(value)
            if (kind is bytes or kind is bytearray) and len(value) > INLINE_MAX:
                return {"k": "y", "t": kind.__name__, "n": len(value)}, value
            np = sys.modules.get("numpy")
            if np is not None and kind is np.ndarray and value.dtype.fields is None \
                    and not value.dtype.hasobject and value.dtype.itemsize > 0:
                order = "F" if value.flags.f_contiguous and not value.flags.c_contiguous else "C"
                flat = value.T if order == "F" else np.ascontiguousarray(value)
                return ({"k": "n", "dt": value.dtype.str, "sh": list(value.shape), "o": order},
                        flat.reshape(-1).view(np.uint8))
        typ, data = self._dumps(value, path)
        if len(data) <= INLINE_MAX:
            return {"k": "i", "t": typ, "d": _b64(data)}, None
        return {"k": "s", "t": typ, "n": len(data)}, data

    def _dumps(self, value: Any, path: str) -> tuple:
        """serde.dumps_typed(value); a value it cannot serialize is an ObjectSaveError naming
        path."""
        try:
            return self.serde.dumps_typed(value)
        except (TypeError, ValueError, AttributeError, RecursionError, OverflowError,
                pickle.PicklingError) as exc:
            raise ObjectSaveError(f"{path}: LangGraph's serializer "
                                  f"({type(self.serde).__name__}) cannot serialize a "
                                  f"{type(value).__name__}: {exc}", path=path) from exc

    @staticmethod
    def _padded(entry: dict, payload: Any) -> Any:
        """The buffer for a payload: serialized values and bytes are zero-padded to a power of
        two (at least a page), so a value that grows keeps its buffer size and page-diffs
        against its previous version instead of being stored whole again; arrays as they are.
        The padding is zeros (compressed to nothing) and never read back."""
        if entry["k"] == "n":
            return payload
        n = entry["n"]
        capacity = max(_MIN_CAPACITY, 1 << (n - 1).bit_length())
        if capacity == n:
            return payload
        buf = bytearray(capacity)
        buf[:n] = payload
        return buf

    def _read_values(self, sid: int, entries: Mapping[Any, dict]) -> dict:
        """{key: value} of the entries (of checkpoint sid) that hold a value."""
        return _read_values(self.store, self.serde, sid, entries)

    # ---- indexes ----------------------------------------------------------------------------
    def _index(self, stream: str) -> _StreamIndex:
        return self._load_index(stream, _StreamIndex)

    def _writes_index(self, stream: str) -> _WritesIndex:
        return self._load_index(stream, _WritesIndex)

    def _load_index(self, stream: str, kind: type) -> Any:
        """The stream's index, rebuilt from its checkpoints' metas when the stream is not in
        the state the cached index describes (its token: another writer committed or
        deleted), or after it was evicted. The token is read first, so an index is never
        taken for newer than it is."""
        token = self.store.stream_version(stream)
        idx = self._shared.indexes.get(stream)
        if idx is None or idx.token != token:
            # read after the token: should the stream move in between, the index is newer
            # than its token says, and the next call rebuilds it (a commit on its head fails)
            infos = self.store.checkpoints(stream)
            idx = kind(token)
            for info in infos:
                if isinstance(info.meta, dict) and "id" in info.meta:
                    idx.add(info.id, info.meta)
        self._shared.remember(stream, idx)
        return idx

    def _thread_streams(self, thread_id: str | None) -> list[str]:
        """The lg/ and lw/ streams of a thread (of every thread for None)."""
        names = self.store.streams()
        if thread_id is None:
            return [s for s in names if s.startswith(("lg/", "lw/"))]
        tail = _key(thread_id) + "/"
        return [s for s in names if s.startswith(("lg/" + tail, "lw/" + tail))]

    # ---- reading ----------------------------------------------------------------------------
    def _decoded_metadata(self, rec: _Record) -> Any:
        typ, data = rec.meta["md"]
        return self.serde.loads_typed((typ, _unb64(data)))

    def _metadata(self, rec: _Record) -> Any:
        """The record's metadata, decoded once and kept, for matching list()'s filter: never
        handed out (a caller, or LangGraph's loop, may change what it is given)."""
        if rec._metadata is None:
            rec._metadata = self._decoded_metadata(rec)
        return rec._metadata

    def _pending_writes(self, thread_id: str, ns: str, checkpoint_id: str) -> list:
        widx = self._writes_index(_streams(thread_id, ns)[1])
        chosen: dict = {}
        for sid, meta in widx.by_checkpoint.get(checkpoint_id, ()):
            values = self._read_values(sid, {i: w[2] for i, w in enumerate(meta["w"])})
            for i, (idx, channel, _) in enumerate(meta["w"]):
                key = (meta["task"], idx)
                if idx >= 0 and key in chosen:
                    continue             # a repeated (task, idx) write is ignored
                chosen[key] = (meta["path"], meta["task"], idx, channel, values.get(i))
        ordered = sorted(chosen.values(), key=lambda w: _writes_sort_key(w[0], w[1], w[2]))
        return [(task, channel, value) for _, task, _, channel, value in ordered]

    def _tuple(self, rec: _Record, config: Any = None) -> CheckpointTuple:
        meta = rec.meta
        thread_id, ns = meta["t"], meta["ns"]
        typ, data = meta["ck"]
        checkpoint = self.serde.loads_typed((typ, _unb64(data)))
        checkpoint["channel_values"] = self._read_values(rec.sid, meta["ch"])
        parent = meta.get("p")
        return CheckpointTuple(
            config=config or {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                               "checkpoint_id": rec.cid}},
            checkpoint=checkpoint,
            metadata=self._decoded_metadata(rec),        # the caller's own, as every read
            parent_config=({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                             "checkpoint_id": parent}} if parent else None),
            pending_writes=self._pending_writes(thread_id, ns, rec.cid),
        )

    def get_tuple(self, config: Any) -> CheckpointTuple | None:
        """The checkpoint of config's checkpoint_id, or the thread's latest (greatest id) in
        its namespace; None if there is none."""
        thread_id, ns, checkpoint_id = _config_ids(config)
        for attempt in range(_READ_ATTEMPTS):
            with self._shared.lock:
                idx = self._index(_streams(thread_id, ns)[0])
                rec = idx.records.get(checkpoint_id) if checkpoint_id else idx.latest()
                if rec is None or rec.meta["t"] != thread_id or rec.meta["ns"] != ns:
                    return None
                try:
                    return self._tuple(rec, config if checkpoint_id else None)
                except CheckpointNotFound:
                    # another writer deleted it (or its writes) since the index was read:
                    # the stream's token moved, so the next try reads the new state
                    if attempt == _READ_ATTEMPTS - 1:
                        raise
        raise AssertionError("unreachable")

    def list(self, config: Any, *, filter: dict[str, Any] | None = None,
             before: Any = None, limit: int | None = None) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first (by checkpoint id) of config's thread (all threads for
        None), of its checkpoint_ns if given, matching every filter key of the metadata, older
        than before's checkpoint_id, at most limit of them."""
        thread_id = ns = checkpoint_id = None
        if config is not None:
            thread_id, _, checkpoint_id = _config_ids(config)
            ns = config["configurable"].get("checkpoint_ns")
        before_id = _before_id(before)
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidArgumentTypeError("filter must be a dict of metadata key -> value")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidArgumentTypeError("limit must be an int or None")
        return self._list(thread_id, ns, checkpoint_id, filter or {}, before_id, limit)

    def _list(self, thread_id, ns, checkpoint_id, filter, before_id, limit):
        with self._shared.lock:
            if thread_id is not None and ns is not None:
                streams = [_streams(thread_id, ns)[0]]
            else:
                streams = [s for s in self._thread_streams(thread_id) if s.startswith("lg/")]
            found = []
            for stream in streams:
                for rec in self._index(stream).records.values():
                    if thread_id is not None and rec.meta["t"] != thread_id:
                        continue
                    if ns is not None and rec.meta["ns"] != ns:
                        continue
                    if checkpoint_id and rec.cid != checkpoint_id:
                        continue
                    if before_id and rec.cid >= before_id:
                        continue
                    found.append(rec)
        found.sort(key=lambda r: r.cid, reverse=True)
        count = 0
        for rec in found:
            if limit is not None and count >= limit:
                return
            with self._shared.lock:
                if filter:
                    metadata = self._metadata(rec)
                    if not all(metadata.get(k) == v for k, v in filter.items()):
                        continue
                try:
                    item = self._tuple(rec)
                except CheckpointNotFound:
                    continue         # deleted meanwhile
            count += 1
            yield item

    # ---- writing ----------------------------------------------------------------------------
    def _stored_value(self, stream: str, idx: _StreamIndex, channel: str,
                      version: Any) -> tuple[dict, Any] | None:
        """(entry, payload) of a channel version stored earlier in the stream (the newest
        checkpoint holding it, as the index says), or None."""
        where = idx.blobs.get((channel, version))
        if where is None:
            return None
        sid, entry = where
        hit = self._shared.cache_get(stream, channel, version, sid)
        if hit is not None:
            return hit
        entry = {k: v for k, v in entry.items() if k not in ("b", "v")}
        if entry["k"] in ("i", "e"):
            return entry, None
        if entry["k"] == "n":
            return entry, self.store.read(sid, where[1]["b"])
        return entry, self.store.read(sid, where[1]["b"], 0, entry["n"])

    def _refusal(self, idx: _StreamIndex, checkpoint_id: str, parent: str | None,
                 source: Any) -> str | None:
        """Why a put of checkpoint_id built on parent (None: on nothing) may not be stored in
        the state idx describes, or None when it may: a put naming a parent must build on the
        thread's newest checkpoint, unless the saver's forks option lets it branch; a put
        naming none is a new root, accepted whatever the thread holds (LangGraph's conformance
        suite stores unrelated roots in one thread), except with forks="never" (then the
        thread must be empty). A re-put of the newest checkpoint on its own parent replaces
        it."""
        if self.forks == "any" or (self.forks == "marked" and source in MARKED_FORKS):
            return None
        if parent is None and self.forks == "marked":
            return None
        latest = idx.latest()
        if latest is None:
            if parent is None:
                return None
            return (f"it was built on checkpoint {parent!r}, but the thread has no checkpoint "
                    "now (deleted meanwhile)")
        if parent == latest.cid:
            return None
        if checkpoint_id == latest.cid and parent == latest.meta.get("p"):
            return None
        if parent is None:
            return (f"it starts the thread (it was built on no checkpoint), but the thread's "
                    f"newest checkpoint is {latest.cid!r} (another worker started or advanced "
                    "the thread)")
        if parent not in idx.records:
            return (f"it was built on checkpoint {parent!r}, which the thread does not have "
                    f"(deleted meanwhile?); its newest checkpoint is {latest.cid!r}")
        return (f"it was built on checkpoint {parent!r}, but the thread's newest checkpoint is "
                f"{latest.cid!r} (another worker advanced the thread meanwhile)")

    def _conflict(self, stream: str, idx: _StreamIndex, thread_id: str, ns: str,
                  checkpoint_id: str, parent: str | None, reason: str,
                  cause: BaseException | None = None) -> CommitConflict:
        """The CommitConflict of a refused put, in LangGraph terms. Besides CommitConflict's
        attributes (snapstore ids: expected = the parent's, found = the stream's head) it
        carries thread_id, checkpoint_ns, checkpoint_id (the one not stored), parent_id (the
        one it was built on) and latest_id (the thread's newest)."""
        where = f"thread {thread_id!r}" + (f" (namespace {ns!r})" if ns else "")
        latest = idx.latest()
        hint = ("reload the thread's latest state (get_tuple without a checkpoint_id, or "
                "graph.get_state) and run from there")
        if self.forks != "any":
            hint += ("; to branch off an older checkpoint on purpose use LangGraph's time "
                     "travel or update_state" + (" with SnapstoreSaver(forks='marked')"
                                                 if self.forks == "never" else "")
                     + ", or SnapstoreSaver(forks='any') when only one worker ever writes a "
                     "thread")
        exc = CommitConflict(
            f"LangGraph {where}: checkpoint {checkpoint_id!r} was not stored: {reason}. Two "
            f"workers never interleave their states in one thread: {hint}",
            stream=stream, found=idx.head, holder=getattr(cause, "holder", None),
            expected=idx.records[parent].sid if parent in idx.records else None)
        exc.thread_id, exc.checkpoint_ns, exc.checkpoint_id = thread_id, ns, checkpoint_id
        exc.parent_id, exc.latest_id = parent, latest.cid if latest is not None else None
        return exc

    def put(self, config: Any, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> dict:
        """Stores a checkpoint as one snapstore checkpoint of its thread's stream; values of
        channels not in new_versions come from the versions stored before (as LangGraph's
        savers do) and cost no new bytes.

        The checkpoint builds on the one config's checkpoint_id names (none: on nothing). It
        is stored only if that is the thread's newest checkpoint (none: the thread has none)
        when it commits, or the forks option lets it branch (see the class doc); otherwise
        CommitConflict, and nothing is stored. Another worker's commit to the thread that
        only gets in the way (in progress, or a branch) is waited out: tried again, bounded.
        """
        thread_id, ns, parent = _config_ids(config)
        if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("id"), str):
            raise InvalidArgumentTypeError("checkpoint must be a Checkpoint dict with a str 'id'")
        if not isinstance(new_versions, Mapping):
            raise InvalidArgumentTypeError("new_versions must be a dict of channel -> version")
        if not isinstance(metadata, Mapping):
            raise InvalidArgumentTypeError(f"metadata must be a CheckpointMetadata dict, got "
                                           f"{type(metadata).__name__}")
        values = checkpoint.get("channel_values") or {}
        versions = checkpoint.get("channel_versions") or {}
        for what, table in (("channel_values", values), ("channel_versions", versions),
                            ("new_versions", new_versions)):
            if not isinstance(table, Mapping):
                raise InvalidArgumentTypeError(f"{what} must be a dict, got "
                                               f"{type(table).__name__}")
            for channel in table:
                if not isinstance(channel, str):
                    raise InvalidArgumentTypeError(f"{what}: channel names must be str, got "
                                                   f"{type(channel).__name__} {channel!r}")
                if what != "channel_values":
                    _check_version(what, channel, table[channel])
        skeleton = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        merged = get_checkpoint_metadata(config, metadata)
        ck = self._dumps(skeleton, "checkpoint")
        md = self._dumps(merged, "metadata")
        source = merged.get("source") if isinstance(merged, Mapping) else None
        stream = _streams(thread_id, ns)[0]
        last: BaseException | None = None
        for attempt in range(_ATTEMPTS):
            with self._shared.lock:
                idx = self._index(stream)
                reason = self._refusal(idx, checkpoint["id"], parent, source)
                if reason is not None:
                    raise self._conflict(stream, idx, thread_id, ns, checkpoint["id"], parent,
                                         reason, last) from last
                try:
                    buffers, meta, cached = self._contents(
                        stream, idx, thread_id, ns, checkpoint["id"], parent, ck, md, merged,
                        values, versions, new_versions)
                    info = self.store.checkpoint(buffers, stream=stream, meta=meta,
                                                 expect_head=idx.head)
                except (CommitConflict, CheckpointNotFound) as exc:
                    last = exc      # another writer's commit or delete: read again, decide
                else:
                    idx.added(info.id, info.seq, info.meta)
                    for channel, version, entry, payload in cached:
                        entry = {k: v for k, v in entry.items() if k not in ("b", "v")}
                        if payload is not None and not isinstance(payload, bytes):
                            payload = bytes(payload)      # the caller may mutate it in place
                        self._shared.cache_put(stream, channel, version, info.id, entry,
                                               payload)
                    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns,
                                             "checkpoint_id": checkpoint["id"]}}
            _backoff(attempt)
        with self._shared.lock:
            idx = self._index(stream)
        raise self._conflict(stream, idx, thread_id, ns, checkpoint["id"], parent,
                             f"other workers' puts into the thread kept getting in its way "
                             f"({_ATTEMPTS} tries; the last: {last})", last) from last

    def _contents(self, stream: str, idx: _StreamIndex, thread_id: str, ns: str,
                  checkpoint_id: str, parent: str | None, ck: tuple, md: tuple, merged: Any,
                  values: Mapping, versions: Mapping, new_versions: Mapping) -> tuple:
        """(buffers, meta, cached) of a put: the snapstore checkpoint storing it, and the
        channel values to cache once it is committed."""
        buffers: dict = {}
        tables: dict = {"ch": {}, "x": {}}
        cached = []
        for table, channel, version in (
                [("ch", c, v) for c, v in versions.items()]
                + [("x", c, v) for c, v in new_versions.items() if versions.get(c) != v]):
            if table == "x" or (channel in new_versions and new_versions[channel] == version):
                if channel in values:
                    entry, payload = self._encode(values[channel], f"channel {channel!r}")
                else:
                    entry, payload = {"k": "e"}, None
            else:
                found = self._stored_value(stream, idx, channel, version)
                if found is None:
                    continue
                entry, payload = found
            entry = dict(entry, v=version)
            if payload is not None:
                entry["b"] = _buffer_name("c" if table == "ch" else "x", channel)
                buffers[entry["b"]] = self._padded(entry, payload)
            tables[table][channel] = entry
            if table == "ch":
                cached.append((channel, version, entry, payload))
        meta = {"t": thread_id, "ns": ns, "id": checkpoint_id, "p": parent,
                "ck": [ck[0], _b64(ck[1])], "md": [md[0], _b64(md[1])], "ch": tables["ch"]}
        if tables["x"]:
            meta["x"] = tables["x"]
        run_id = merged.get("run_id") if isinstance(merged, Mapping) else None
        if isinstance(run_id, uuid.UUID):
            run_id = str(run_id)            # delete_for_runs takes either
        if isinstance(run_id, (str, int)) and not isinstance(run_id, bool):
            meta["run"] = run_id
        return buffers, meta, cached

    def put_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        """Stores a task's pending writes for config's checkpoint (one snapstore checkpoint
        of the thread's writes stream). A (task_id, index) stored before is ignored, except
        for the special channels (error, interrupt, ...), whose latest write wins.

        Writes are independent records: when another worker writes the thread's writes
        meanwhile (CommitConflict), the stored ones are read again, the (task_id, index) now
        stored dropped, and the rest stored (tried again, bounded), so every write lands
        exactly once, from whichever worker stored it first."""
        thread_id, ns, checkpoint_id = _config_ids(config, need_id=True)
        if not isinstance(task_id, str):
            raise InvalidArgumentTypeError(f"task_id must be a str, got {type(task_id).__name__}")
        if not isinstance(task_path, str):
            raise InvalidArgumentTypeError(f"task_path must be a str, got {type(task_path).__name__}")
        if isinstance(writes, (str, bytes, Mapping)) or not isinstance(writes, Iterable):
            raise InvalidArgumentTypeError(f"writes must be a sequence of (channel, value) "
                                           f"pairs, got {type(writes).__name__}")
        items = []
        for i, write in enumerate(writes):
            if not isinstance(write, (tuple, list)) or len(write) != 2:
                raise InvalidArgumentTypeError(f"write {i} must be a (channel, value) pair, "
                                               f"got {type(write).__name__} {write!r:.60}")
            channel, value = write
            if not isinstance(channel, str):
                raise InvalidArgumentTypeError(f"write channel must be a str, got {type(channel).__name__}")
            items.append((WRITES_IDX_MAP.get(channel, i), channel, value))
        encoded = [(idx, channel, *self._encode(value, f"write {idx} to channel {channel!r}"))
                   for idx, channel, value in items]
        stream = _streams(thread_id, ns)[1]
        last: BaseException | None = None
        for attempt in range(_ATTEMPTS):
            with self._shared.lock:
                widx = self._writes_index(stream)
                seen = widx.keys(checkpoint_id)
                buffers: dict = {}
                table = []
                for idx, channel, entry, payload in encoded:
                    if idx >= 0 and (task_id, idx) in seen:
                        continue
                    entry = dict(entry)
                    if payload is not None:
                        entry["b"] = f"w{len(table)}"
                        buffers[entry["b"]] = self._padded(entry, payload)
                    table.append([idx, channel, entry])
                if not table:
                    return
                meta = {"t": thread_id, "ns": ns, "id": checkpoint_id, "task": task_id,
                        "path": task_path, "w": table}
                try:
                    # expect_head: the writes seen are exactly those stored (no duplicate)
                    info = self.store.checkpoint(buffers, stream=stream, meta=meta,
                                                 expect_head=widx.head)
                except CommitConflict as exc:
                    last = exc
                else:
                    widx.added(info.id, info.seq, info.meta)
                    return
            _backoff(attempt)
        where = f"thread {thread_id!r}" + (f" (namespace {ns!r})" if ns else "")
        raise CommitConflict(
            f"LangGraph {where}: the pending writes of task {task_id!r} for checkpoint "
            f"{checkpoint_id!r} were not stored: other workers kept writing the thread's "
            f"pending writes ({_ATTEMPTS} tries; the last: {last})", stream=stream,
            expected=getattr(last, "expected", None), found=getattr(last, "found", None),
            holder=getattr(last, "holder", None)) from last

    # ---- deleting and copying ---------------------------------------------------------------
    def _delete_sids(self, stream: str, sids: Sequence[int]) -> None:
        try:
            for sid in sorted(set(sids), reverse=True):
                try:
                    _retrying(lambda: self.store.delete(sid))
                except CheckpointNotFound:
                    pass                 # deleted already (by another worker, say)
        finally:
            self._shared.forget(stream)

    def delete_thread(self, thread_id: str) -> None:
        """Deletes every checkpoint and write of the thread, in every namespace (on an S3
        store, those the bucket holds when it is called: it pulls first)."""
        _check_thread_id(thread_id)
        self.store.refresh()        # (an S3 store's cache may be `refresh` seconds behind)
        with self._shared.lock:
            for stream in self._thread_streams(thread_id):
                ids = [c.id for c in self.store.checkpoints(stream)
                       if isinstance(c.meta, dict) and c.meta.get("t") == thread_id]
                if ids:
                    self._delete_sids(stream, ids)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Deletes the checkpoints whose metadata run_id is one of run_ids, with their
        pending writes, in every thread and namespace."""
        if isinstance(run_ids, (str, bytes)):
            raise InvalidArgumentTypeError("run_ids must be a sequence of run ids, not one string")
        if isinstance(run_ids, Mapping) or not isinstance(run_ids, Iterable):
            raise InvalidArgumentTypeError(f"run_ids must be a sequence of run ids, got "
                                           f"{type(run_ids).__name__}")
        # what put stores as a checkpoint's run (a str or int run_id; a UUID, as LangGraph's
        # configs hold them, counts as its str); None would match every checkpoint stored
        # without a run_id
        run_ids = [str(r) if isinstance(r, uuid.UUID) else r for r in run_ids]
        for run_id in run_ids:
            if isinstance(run_id, bool) or not isinstance(run_id, (str, int)):
                raise InvalidArgumentTypeError(f"run_ids must hold str run ids, got "
                                               f"{type(run_id).__name__} {run_id!r:.60}")
        wanted = set(run_ids)
        if not wanted:
            return
        self.store.refresh()        # (an S3 store's cache may be `refresh` seconds behind)
        with self._shared.lock:
            for stream in [s for s in self.store.streams() if s.startswith("lg/")]:
                idx = self._index(stream)
                doomed = [r for r in idx.records.values() if r.meta.get("run") in wanted]
                if not doomed:
                    continue
                cids = {r.cid for r in doomed}
                sids = [r.sid for r in doomed]
                sids += [s for cid in cids for s in idx.stale.get(cid, ())]
                wstream = "lw/" + stream[3:]
                widx = self._writes_index(wstream)
                wsids = [sid for cid in cids for sid, _ in widx.by_checkpoint.get(cid, ())]
                self._delete_sids(stream, sids)
                if wsids:
                    self._delete_sids(wstream, wsids)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copies every checkpoint and write of a thread (all namespaces, same checkpoint
        ids) to another thread. Stores only manifests: the bytes are already there."""
        _check_thread_id(source_thread_id)
        _check_thread_id(target_thread_id)
        if source_thread_id == target_thread_id:
            return
        with self._shared.lock:
            for stream in self._thread_streams(source_thread_id):
                for info in self.store.checkpoints(stream):
                    meta = info.meta
                    if not isinstance(meta, dict) or meta.get("t") != source_thread_id:
                        continue
                    pair = _streams(target_thread_id, meta["ns"])
                    target = pair[0] if stream.startswith("lg/") else pair[1]
                    try:
                        buffers = self.store.restore(info.id)
                    except CheckpointNotFound:
                        continue        # deleted by another worker since the listing
                    _retrying(lambda: self.store.checkpoint(
                        buffers, stream=target, meta=dict(meta, t=target_thread_id)))
                    self._shared.indexes.pop(target, None)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """strategy "keep_latest" keeps each namespace's latest checkpoint (and its writes);
        "delete" deletes the threads."""
        if isinstance(thread_ids, (str, bytes)):
            raise InvalidArgumentTypeError("thread_ids must be a sequence of thread ids, not one string")
        if isinstance(thread_ids, Mapping) or not isinstance(thread_ids, Iterable):
            raise InvalidArgumentTypeError(f"thread_ids must be a sequence of thread ids, got "
                                           f"{type(thread_ids).__name__}")
        if strategy not in ("keep_latest", "delete"):
            raise InvalidArgumentError(f"strategy must be 'keep_latest' or 'delete', got {strategy!r}")
        thread_ids = [_check_thread_id(t) for t in thread_ids]
        self.store.refresh()        # (an S3 store's cache may be `refresh` seconds behind)
        with self._shared.lock:
            for thread_id in thread_ids:
                if strategy == "delete":
                    self.delete_thread(thread_id)
                    continue
                for stream in self._thread_streams(thread_id):
                    if not stream.startswith("lg/"):
                        continue
                    idx = self._index(stream)
                    keep = idx.latest()
                    if keep is None:
                        continue
                    sids = [r.sid for r in idx.records.values() if r is not keep]
                    sids += [s for old in idx.stale.values() for s in old]
                    wstream = "lw/" + stream[3:]
                    widx = self._writes_index(wstream)
                    # only the writes of checkpoints this prune deletes, and of checkpoints
                    # older than the kept one that no longer exist: a worker may store a newer
                    # checkpoint and its writes after idx was read, and those are kept
                    doomed = {r.cid for r in idx.records.values() if r is not keep}
                    wsids = [sid for cid, recs in widx.by_checkpoint.items()
                             if cid in doomed or (cid not in idx.records and cid < keep.cid)
                             for sid, _ in recs]
                    if sids:
                        self._delete_sids(stream, sids)
                    if wsids:
                        self._delete_sids(wstream, wsids)

    def get_next_version(self, current: Any, channel: Any = None) -> str:
        """Zero-padded counter plus a random suffix, so two branches of a fork never give a
        channel the same version for different values."""
        if current is None:
            n = 0
        elif isinstance(current, int) and not isinstance(current, bool):
            n = current
        else:
            try:
                n = int(str(current).split(".", 1)[0])
            except ValueError:
                raise InvalidArgumentError(f"get_next_version: {current!r} is not a version this "
                                           "saver made (a counter, or counter.suffix)") from None
        return f"{n + 1:032d}.{random.getrandbits(52):016d}"

    # ---- async twins: the same work in a worker thread --------------------------------------
    async def aget_tuple(self, config: Any) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(self, config: Any, *, filter: dict[str, Any] | None = None,
                    before: Any = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        it = self.list(config, filter=filter, before=before, limit=limit)
        while True:
            item = await asyncio.to_thread(next, it, _DONE)
            if item is _DONE:
                return
            yield item

    async def aput(self, config: Any, checkpoint: Checkpoint, metadata: CheckpointMetadata,
                   new_versions: ChannelVersions) -> dict:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: Any, writes: Sequence[tuple[str, Any]], task_id: str,
                          task_path: str = "") -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)


# ---- inspection (snapstore show) -------------------------------------------------------------
_PREVIEW = 80


def _preview(value: Any, limit: int = _PREVIEW) -> str:
    text = value if isinstance(value, str) else repr(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _message(value: Any) -> dict | None:
    """{"role", "content"} of a chat message (LangChain message or {"role", "content"} dict)."""
    if isinstance(value, Mapping) and "content" in value and ("role" in value or
                                                                "type" in value):
        role, content = value.get("role", value.get("type")), value["content"]
    elif hasattr(value, "content") and isinstance(getattr(value, "type", None), str):
        role, content = value.type, value.content
    else:
        return None
    out = {"role": str(role), "content": _preview(content)}
    calls = value.get("tool_calls") if isinstance(value, Mapping) else \
        getattr(value, "tool_calls", None)
    if calls:
        out["tool_calls"] = [str(c.get("name") if isinstance(c, Mapping) else c)
                             for c in calls]
    return out


def describe_checkpoint(store: Store, info: Any, *, serde: Any = None) -> dict:
    """What a LangGraph checkpoint (a checkpoint of an lg/ stream) holds, decoded for people:
    {"thread_id", "checkpoint_ns", "checkpoint_id", "parent", "metadata" (step, source...),
    "channels": [{"name", "version", "type", "preview"}], "messages": [{"channel", "role",
    "content" (a preview), "tool_calls"?}]}. serde: the saver's serializer (default
    JsonPlusSerializer). Raises InvalidArgumentError for other checkpoints."""
    meta = info.meta
    if not (isinstance(meta, dict) and {"t", "ns", "id", "ck", "md", "ch"} <= set(meta)):
        raise InvalidArgumentError(f"checkpoint {info.id} is not a LangGraph checkpoint")
    serde = serde if serde is not None else JsonPlusSerializer()
    checkpoint = serde.loads_typed((meta["ck"][0], _unb64(meta["ck"][1])))
    metadata = serde.loads_typed((meta["md"][0], _unb64(meta["md"][1])))
    values = _read_values(store, serde, info.id, meta["ch"])
    channels, messages = [], []
    for name, entry in meta["ch"].items():
        value = values.get(name)
        channels.append({"name": name, "version": _preview(entry.get("v"), 40),
                         "type": "empty" if entry.get("k") == "e" else type(value).__name__,
                         "preview": "" if entry.get("k") == "e" else _preview(value)})
        items = value if isinstance(value, (list, tuple)) else [value]
        found = [m for m in map(_message, items) if m is not None]
        messages += [{"channel": name, **m} for m in found]
        if found and len(found) == len(items) and isinstance(value, (list, tuple)):
            channels[-1]["preview"] = f"{len(found)} message(s)"
    return {"thread_id": meta["t"], "checkpoint_ns": meta["ns"], "checkpoint_id": meta["id"],
            "parent": meta.get("p"),
            "metadata": {k: _preview(v, 60) if not isinstance(v, (int, float, bool, type(None)))
                         else v for k, v in (metadata or {}).items()},
            "versions_seen": len(checkpoint.get("versions_seen") or {}),
            "channels": channels, "messages": messages}
