"""Object checkpoints: a picklable object graph as one checkpoint whose large buffers go out of
band, each one a named buffer diffed page by page against the stream's previous save.

    info = store.save({"w": weights, "step": 10}, stream="train")     # Store.save -> save()
    state = store.load("train")                                        # Store.load -> load()
    store.load("train", into=state)                                    # in place

Layout of one object checkpoint (docs/objects.md):

- buffer ``"pickle"``: the pickle stream (protocol 5), small;
- buffers ``"oob/0"``, ``"oob/1"``, ...: every buffer pickle hands out of band, in the order
  pickle meets them: NumPy arrays (C or Fortran order, as they are in memory), bytearrays and
  PickleBuffers, and the storages of CPU torch tensors (one buffer per storage, so tensors that
  share a storage stay shared). Buffers smaller than ``inband_limit`` stay in the pickle stream.
- meta: the user's meta, plus the reserved key ``"snapstore.objects"`` that marks the
  checkpoint as written by save() (see user_meta()).

Because the N-th buffer of a save has the same name as the N-th buffer of the previous save of
the stream, Store.checkpoint diffs it page by page against it (same size) or stores it whole,
deduplicated by content (size changed, order changed).

Trust: load() unpickles only checkpoints that save() marked, but anyone who can write the
store directory can forge one. A store is trusted like any pickle file.
"""
from __future__ import annotations

import bisect
import enum
import gc
import inspect
import io
import os
import pickle
import struct
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Mapping, MutableMapping
from typing import Any, Iterator

from snapstore._native import buffer_address
from snapstore.engine.commit import ANY_HEAD
from snapstore.engine.memory import address_view, uninit_bytearray
from snapstore.engine.validation import float_item_size, validate_flag, validate_meta, validate_name
from snapstore.errors import (AsyncSaveError, CorruptionError, DeviceTensorError,
                              ForkedStoreError, InvalidArgumentError, NotAnObjectCheckpointError,
                              ObjectSaveError, SnapstoreError, StructureMismatchError)
from snapstore.objectlayer import (MATERIALISE_META, META_KEY, contiguous_tensor, copy_tensor,
                                   float_view, labelled_view, layer_meta, reader_hint,
                                   refuse_other_version, require_store, resolve_checkpoint,
                                   user_meta, wrap_meta)

__all__ = ["save", "save_async", "load", "user_meta", "is_object_checkpoint", "FRESH",
           "ObjectSaveError", "DeviceTensorError", "StructureMismatchError",
           "NotAnObjectCheckpointError", "META_KEY", "PICKLE_BUFFER", "DEFAULT_INBAND_LIMIT"]

FORMAT_VERSION = 1
PICKLE_BUFFER = "pickle"              # buffer name of the pickle stream
OOB_PREFIX = "oob/"                   # out-of-band buffers: "oob/0", "oob/1", ...
DEFAULT_INBAND_LIMIT = 4096           # smaller out-of-band buffers stay in the pickle stream
_LAZY_PLACEHOLDER = 1 << 16           # skeleton buffers from this size are untouched mmaps


# ---- errors: defined in snapstore.errors (importable from here too, as before) ----------


class _Fresh:
    """The type of FRESH."""

    def __repr__(self) -> str:
        return "snapstore.objects.FRESH"

    def __reduce__(self) -> str:
        return "FRESH"


FRESH = _Fresh()
"""Placeholder in a load(into=...) target: put the checkpoint's value here as loaded (new
memory), without matching it against anything."""


# ---- meta (META_KEY and user_meta: snapstore.objectlayer, shared with arrays) ----------------
def is_object_checkpoint(info: Any) -> bool:
    """True for a CheckpointInfo (or a stored meta value) of a checkpoint written by save()."""
    ours = layer_meta(info, META_KEY)
    return isinstance(ours, dict) and ours.get("version") == FORMAT_VERSION


# ---- memory -------------------------------------------------------------------------------
def _placeholder(n: int):
    """Skeleton memory of n bytes: anonymous mmap (no page is touched) for large sizes."""
    if n >= _LAZY_PLACEHOLDER:
        import mmap
        return mmap.mmap(-1, n)
    return bytearray(n)


# ---- rebuild functions named in pickle streams ---------------------------------------------
# PINNED BY THE FORMAT: pickle streams of object checkpoints name _datetime_array, _storage and
# _tensor below (and FRESH, by _Fresh.__reduce__) as snapstore.objects.<name>. Stores written
# once must load forever: never rename, move or change the signature of these.
class _LoadContext:
    """What the rebuild functions need while load() unpickles (thread-local)."""

    def __init__(self, buffers: list, skeleton: bool) -> None:
        self.skeleton = skeleton
        self.index = {id(b): i for i, b in enumerate(buffers)}
        self.storage_index: dict[int, int] = {}   # id(storage) -> buffer index (skeleton)
        self.tensor_index: dict[int, int] = {}    # id(tensor) -> buffer index (skeleton)
        self.keep: list = []                      # keeps ids above valid
        # (first address, end address, index) of each non-empty skeleton buffer, by address
        self.ranges = _memory_ranges(buffers) if skeleton else []
        self.starts = [r[0] for r in self.ranges]

    def index_of(self, buf) -> int | None:
        while buf is not None:
            i = self.index.get(id(buf))
            if i is not None:
                return i
            buf = buf.obj if isinstance(buf, memoryview) else getattr(buf, "base", None)
        return None

    def buffer_at(self, address: int) -> int | None:
        """The index of the skeleton buffer whose memory holds this address, or None."""
        k = bisect.bisect_right(self.starts, address) - 1
        if k >= 0 and address < self.ranges[k][1]:
            return self.ranges[k][2]
        return None


def _memory_ranges(buffers: list) -> list[tuple[int, int, int]]:
    """(first address, end address, index) of each non-empty buffer (writable placeholders:
    bytearrays and anonymous mmaps), sorted by address."""
    out = []
    for i, b in enumerate(buffers):
        n = len(b)
        if n:
            first = buffer_address(b)
            out.append((first, first + n, i))
    return sorted(out)


_local = threading.local()


def _context() -> _LoadContext | None:
    return getattr(_local, "ctx", None)


def _datetime_array(values, dtype):
    """Rebuilds a datetime64/timedelta64 array saved as its int64 view."""
    return values.view(dtype)


def _storage(buf):
    """Rebuilds a torch UntypedStorage over a buffer (no copy)."""
    import torch
    n = len(memoryview(buf))
    if n == 0:
        storage = torch.UntypedStorage(0)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)   # read-only in-band bytes
            storage = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()
    ctx = _context()
    if ctx is not None and ctx.skeleton:
        i = ctx.index_of(buf)
        if i is not None:
            ctx.storage_index[id(storage)] = i
            ctx.keep.append(storage)
    return storage


def _tensor(storage, dtype, offset: int, size: tuple, stride: tuple, requires_grad: bool,
            parameter: bool, attrs: dict | None):
    """Rebuilds a tensor (or nn.Parameter) as a view of a storage."""
    import torch
    t = torch.empty((0,), dtype=dtype).set_(storage, offset, size, stride)
    if parameter:
        t = torch.nn.Parameter(t, requires_grad=requires_grad)
    elif requires_grad:
        t.requires_grad_(True)
    if attrs:
        t.__dict__.update(attrs)
    ctx = _context()
    if ctx is not None and ctx.skeleton:
        i = ctx.storage_index.get(id(storage))
        if i is not None:
            ctx.tensor_index[id(t)] = i
            ctx.keep.append(t)
    return t


# ---- pickling -----------------------------------------------------------------------------
class _StorageRef:
    """One exported byte range of a torch storage; pickled once, so its tensors share it."""
    __slots__ = ("view", "__weakref__")

    def __init__(self, view: memoryview) -> None:
        self.view = view


class _DeviceTensor(Exception):
    def __init__(self, tensor) -> None:
        super().__init__()
        self.tensor = tensor


def _dense(size, stride) -> bool:
    """True when the strides lay the elements out densely (a permutation of contiguous)."""
    expected = 1
    for n, s in sorted(((n, s) for n, s in zip(size, stride) if n != 1), key=lambda p: p[1]):
        if s != expected:
            return False
        expected *= n
    return True


def _overlapping(size, stride) -> bool:
    """True unless the strides prove the elements lie apart in memory: sorted by stride,
    each dimension's stride must step past everything the smaller ones span (an expand()ed
    view, stride 0, or an as_strided overlap fail; an empty tensor never overlaps)."""
    if 0 in tuple(size):
        return False
    span = 1                    # elements spanned by the dimensions taken so far
    for s, n in sorted((abs(s), n) for n, s in zip(size, stride) if n != 1):
        if s < span:
            return True
        span = s * (n - 1) + span
    return False


class _Null:
    def write(self, data) -> int:
        return len(data)


class _Pickler(pickle.Pickler):
    """Protocol-5 pickler that sends large buffers out of band (views, no copies): NumPy
    arrays (non-contiguous ones made contiguous, datetimes as int64), PickleBuffers, and CPU
    torch tensors by storage."""

    def __init__(self, file, inband_limit: int, allow_device_copy: bool,
                 whole: frozenset = frozenset()) -> None:
        views: list[memoryview] = []
        itemsizes: list[int] = []

        def callback(pb: pickle.PickleBuffer) -> bool:   # a closure: no cycle through self
            raw = pb.raw()
            if raw.nbytes < inband_limit:
                raw.release()
                return True                  # pickle copies it into the stream
            views.append(raw)
            itemsizes.append(float_item_size(pb))
            return False

        super().__init__(file, protocol=5, buffer_callback=callback)
        self.views = views                   # out-of-band buffers, in pickle's order
        self.itemsizes = itemsizes           # each one's float item size (1: not floats)
        self.conflicts: set = set()
        self._allow_device_copy = allow_device_copy
        self._whole = whole                  # storages to export whole (from a first pass)
        self._keep: list = []                # objects backing exported views
        self._refs: dict = {}                # storage key -> _StorageRef (whole storage)
        self._compacted: set = set()         # storage keys exported as a partial view
        self._np = sys.modules.get("numpy")
        self._torch = sys.modules.get("torch")

    def release(self) -> None:
        """Drops every reference to the caller's memory (the views stop working)."""
        for v in self.views:
            v.release()
        self.views.clear()
        self.itemsizes.clear()
        self.clear_memo()
        self._refs = {}
        self._keep = []

    def reducer_override(self, obj):
        # (CPython's pickler never shows bytearrays, dicts, lists... to this method.)
        if type(obj) is _StorageRef:
            return _storage, (pickle.PickleBuffer(obj.view),)
        np = self._np
        if np is not None and isinstance(obj, np.ndarray):
            return self._reduce_ndarray(obj, np)
        torch = self._torch
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._reduce_tensor(obj, torch)
        return NotImplemented

    def _reduce_ndarray(self, a, np):
        changed = False
        if type(a) is not np.ndarray:
            if not isinstance(a, np.memmap):
                return NotImplemented        # subclasses pickle their own way
            a, changed = a.view(np.ndarray), True    # a memmap is saved as its contents
        if a.dtype.hasobject or a.dtype.itemsize == 0:
            return a.__reduce_ex__(5) if changed else NotImplemented
        if a.dtype.kind in "mM":             # no buffer protocol: send the int64 view
            values = a.view(np.int64)
            if not (values.flags.c_contiguous or values.flags.f_contiguous):
                values = np.ascontiguousarray(values)
            self._keep.append(values)
            return _datetime_array, (values, a.dtype)
        if not (a.flags.c_contiguous or a.flags.f_contiguous):
            a, changed = np.ascontiguousarray(a), True
        if not changed:
            return NotImplemented            # numpy's own protocol-5 reduction: out of band
        self._keep.append(a)
        return a.__reduce_ex__(5)

    def _reduce_tensor(self, t, torch):
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided \
                or t.is_quantized or t.is_nested:
            if t.device.type not in ("cpu",) and not self._allow_device_copy:
                raise _DeviceTensor(t)
            return NotImplemented            # torch's own reduction (its parts come back here)
        src = t.detach()
        if src.device.type != "cpu":
            if not self._allow_device_copy or src.device.type == "meta":
                raise _DeviceTensor(t)
            src = src.to("cpu")
        if src.is_conj():
            src = src.resolve_conj()
        if src.is_neg():
            src = src.resolve_neg()
        storage = src.untyped_storage()
        key = storage._cdata
        nbytes = src.numel() * src.element_size()
        covers = src.storage_offset() == 0 and nbytes == storage.nbytes() and \
            _dense(src.shape, src.stride())
        if covers or key in self._whole or key in self._refs:
            if key in self._compacted:
                self.conflicts.add(key)      # a partial view of it went out compact: redo
            ref = self._refs.get(key)
            if ref is None:
                self._keep.append(storage)
                ref = self._refs[key] = _StorageRef(float_view(
                    address_view(storage.data_ptr(), storage.nbytes()), src))
            offset, size, stride = src.storage_offset(), tuple(src.shape), tuple(src.stride())
        else:
            # A view that does not fill its storage: only its elements, contiguous (if another
            # view of the same storage turns up, the whole dump is redone with it shared).
            if key in self._compacted:
                self.conflicts.add(key)
            self._compacted.add(key)
            if not src.is_contiguous():
                src = contiguous_tensor(src, torch)
            self._keep.append(src)
            ref = _StorageRef(float_view(address_view(src.data_ptr(), nbytes), src))
            offset, size = 0, tuple(src.shape)
            stride = tuple(src.stride())
        attrs = dict(t.__dict__) if t.__dict__ else None
        return _tensor, (ref, src.dtype, offset, size, stride, bool(t.requires_grad),
                         type(t) is torch.nn.Parameter, attrs)


def _dump(obj: Any, inband_limit: int, allow_device_copy: bool) -> tuple[memoryview, _Pickler]:
    """Pickles obj: (pickle stream, pickler holding the out-of-band views). Raises
    ObjectSaveError / DeviceTensorError naming the offending part of obj."""
    whole: frozenset = frozenset()
    for _ in range(2):
        out = io.BytesIO()
        pickler = _Pickler(out, inband_limit, allow_device_copy, whole)
        try:
            pickler.dump(obj)
        except _DeviceTensor as exc:
            pickler.release()
            path = _path_to(obj, lambda x: x is exc.tensor)
            if exc.tensor.device.type == "meta":
                advice = f"a meta tensor has no data: {MATERIALISE_META}"
            else:
                advice = "move it to the CPU or pass allow_device_copy=True"
            raise DeviceTensorError(
                f"{path} is a tensor on {exc.tensor.device}; snapstore saves CPU tensors: "
                f"{advice}", path) from None
        except RecursionError:
            pickler.release()
            raise ObjectSaveError("obj cannot be pickled: it is nested too deeply") from None
        except Exception as exc:
            pickler.release()
            path, part = _find_unpicklable(obj, inband_limit)
            raise ObjectSaveError(f"{path} ({type(part).__name__}) cannot be pickled: "
                                  f"{type(exc).__name__}: {exc}", path) from exc
        if not pickler.conflicts or whole:
            return out.getbuffer(), pickler
        whole = frozenset(pickler.conflicts)
        pickler.release()
    raise AssertionError("unreachable")  # pragma: no cover


# ---- paths into object graphs (error messages, into=) ---------------------------------------
def _children(x) -> Iterator[tuple[tuple, Any]]:
    if isinstance(x, Mapping):
        for k, v in list(x.items()):
            yield ("item", k), v
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield ("item", i), v
    elif _has_state_dict(x):
        for k, v in list(vars(x).items()):
            yield ("attr", k), v


def _has_state_dict(x) -> bool:
    """True for instances whose state is their __dict__ (not classes, functions, modules)."""
    return isinstance(getattr(x, "__dict__", None), dict) and not isinstance(x, _OPAQUE)


_OPAQUE = (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.ModuleType)


def _format_path(steps) -> str:
    out = "obj"
    for kind, key in steps:
        out += f".{key}" if kind == "attr" else f"[{key!r}]"
    return out


def _path_to(root: Any, match, limit: int = 200_000) -> str:
    """Path of the first part of root for which match(part) is true ("obj" if none)."""
    seen = set()
    stack = [((), root)]
    while stack and len(seen) < limit:
        steps, x = stack.pop()
        if match(x):
            return _format_path(steps)
        if id(x) in seen:
            continue
        seen.add(id(x))
        kids = list(_children(x))
        for step, child in reversed(kids):
            stack.append((steps + (step,), child))
    return "obj"


def _find_unpicklable(root: Any, inband_limit: int) -> tuple[str, Any]:
    """Descends to the deepest part of root that fails to pickle."""
    def fails(x) -> bool:
        p = _Pickler(_Null(), inband_limit, True)
        try:
            p.dump(x)
            return False
        except Exception:
            return True
        finally:
            p.release()

    steps: tuple = ()
    node = root
    for _ in range(100):
        for step, child in _children(node):
            if fails(child):
                steps, node = steps + (step,), child
                break
        else:
            break
    return _format_path(steps), node


# ---- save -----------------------------------------------------------------------------------
def save(store, obj: Any, stream: str = "default", meta: Any = None, *,
         allow_device_copy: bool = False, inband_limit: int = DEFAULT_INBAND_LIMIT,
         expect_head: Any = ANY_HEAD):
    """Checkpoints a picklable object graph as the stream's next checkpoint (Store.save).

    Args:
        store: an open, writable snapstore.Store.
        obj: any picklable object. NumPy arrays, bytearrays, PickleBuffers and CPU torch
            tensors of at least inband_limit bytes become out-of-band buffers ("oob/N"),
            written without a copy and diffed page by page against the stream's previous save.
        stream: the stream this checkpoint extends.
        meta: JSON-serialisable user metadata (a dict keeps its keys in CheckpointInfo.meta;
            user_meta() returns it exactly).
        allow_device_copy: copy tensors on other devices to the CPU instead of refusing them.
        inband_limit: buffers smaller than this stay inside the pickle stream.
        expect_head: as for Store.checkpoint: commit only if the stream's head is this
            checkpoint (None: only if the stream is empty), a compare-and-swap.
    Returns: CheckpointInfo.
    Raises: ObjectSaveError (unpicklable part, named), DeviceTensorError,
        InvalidArgumentTypeError (store is not a Store: the store comes first; meta, stream),
        InvalidArgumentError, StoreIOError, CommitConflict (the stream's head moved, or is not
        expect_head). Nothing is written on error.
    """
    buffers, full_meta, release = _object_checkpoint(store, "snapstore.objects.save", obj,
                                                     stream, meta, allow_device_copy,
                                                     inband_limit)
    try:
        return store.checkpoint(buffers, stream=stream, meta=full_meta, expect_head=expect_head)
    finally:
        release()


def save_async(store, obj: Any, stream: str = "default", meta: Any = None, *,
               allow_device_copy: bool = False, inband_limit: int = DEFAULT_INBAND_LIMIT):
    """save() through Store.checkpoint_async: returns a concurrent.futures.Future of the
    CheckpointInfo as soon as the object's changed pages are copied into the store's staging
    memory (staging_bytes; stats() reports its use). The checkpoint holds the object's values
    as of the call: the caller may change its arrays and tensors as soon as this returns.
    Hashing, compression, the log append, the fsync and the commit run in the background, in
    call order per stream; the future raises their error, and the next save_async() of the
    stream raises it too (AsyncSaveError, once, saving nothing), so a loop that never looks
    at its futures still stops. A save larger than the whole staging memory is committed
    before this returns.

    Raises (now): AsyncSaveError, and the errors of save(), before anything is queued; the
    future: StoreIOError, CommitConflict (the stream's head moved under the save), ..."""
    require_store(store, "snapstore.objects.save_async")
    _ASYNC_FAILURES.raise_unreported(store, stream)
    buffers, full_meta, release = _object_checkpoint(store, "snapstore.objects.save_async",
                                                     obj, stream, meta, allow_device_copy,
                                                     inband_limit)
    try:
        future = store.checkpoint_async(buffers, stream=stream, meta=full_meta)
    finally:
        release()           # the capture copied what it stores: the views are not read again
    _ASYNC_FAILURES.watch(store, stream, future)
    return future


class _UnreportedFailures:
    """The first failure of a stream's save_async() futures that no later save_async() call
    has raised yet, per store (weakly held) and stream."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failures: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def watch(self, store, stream: str, future) -> None:
        def done(f) -> None:
            exc = None if f.cancelled() else f.exception()
            # ForkedStoreError: a fork()ed child's copy of a save the parent still commits
            # (failed by the store's fork handler, before this module's renews the lock): not
            # a failure of the stream, and the child's calls raise ForkedStoreError anyway
            if exc is not None and not isinstance(exc, ForkedStoreError):
                with self._lock:
                    self._failures.setdefault(store, {}).setdefault(stream, exc)
        future.add_done_callback(done)

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()       # a parent thread may have held it at the fork

    def raise_unreported(self, store, stream: str) -> None:
        with self._lock:
            exc = self._failures.get(store, {}).pop(stream, None)
        if exc is not None:
            raise AsyncSaveError(f"an earlier save_async() of stream {stream!r} failed: "
                                 f"{exc}; nothing of this call was saved (the next call "
                                 "saves again)", stream=stream) from exc


_ASYNC_FAILURES = _UnreportedFailures()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_ASYNC_FAILURES.after_fork_in_child)


def _object_checkpoint(store, where: str, obj: Any, stream: str, meta: Any,
                       allow_device_copy: bool, inband_limit: int) -> tuple[dict, Any, Any]:
    """(buffers, meta, release) of an object checkpoint of obj (after the arguments are
    checked); release() drops the views of the caller's memory."""
    require_store(store, where)
    validate_name(stream, "stream")
    if isinstance(inband_limit, bool) or not isinstance(inband_limit, int) or inband_limit < 0:
        raise InvalidArgumentError(f"inband_limit must be an int >= 0, got {inband_limit!r}")
    validate_meta(meta)
    allow_device_copy = validate_flag(allow_device_copy, "allow_device_copy")
    stream_bytes, pickler = _dump(obj, inband_limit, allow_device_copy)
    info = {"version": FORMAT_VERSION, "buffers": len(pickler.views)}
    buffers = {PICKLE_BUFFER: stream_bytes}
    for i, (view, k) in enumerate(zip(pickler.views, pickler.itemsizes)):
        buffers[f"{OOB_PREFIX}{i}"] = view if k == 1 else labelled_view(view, k)

    def release() -> None:
        pickler.release()
        stream_bytes.release()
    try:
        return buffers, wrap_meta(meta, info, META_KEY), release
    except BaseException:
        release()
        raise


# ---- load -----------------------------------------------------------------------------------
def _object_layout(info) -> tuple[list[str], list[int]]:
    """(out-of-band buffer names, their sizes) of an object checkpoint, checked."""
    refuse_other_version(info, META_KEY, FORMAT_VERSION, "store.save() or snapstore.torch.save()")
    if not is_object_checkpoint(info):
        raise NotAnObjectCheckpointError(
            f"checkpoint {info.id} of stream {info.stream!r} was not written by store.save() "
            f"or snapstore.torch.save(), so load() cannot read it: use {reader_hint(info)}")
    ours = layer_meta(info, META_KEY)
    n = ours.get("buffers")
    # the count is checked against the buffers before any name is made: a meta naming 10**12
    # buffers must not make 10**12 names first
    names = ([f"{OOB_PREFIX}{i}" for i in range(n)]
             if isinstance(n, int) and 0 <= n == len(info.sizes) - 1 else None)
    if names is None or set(info.sizes) != {PICKLE_BUFFER, *names}:
        raise NotAnObjectCheckpointError(
            f"checkpoint {info.id}: its buffers {sorted(info.sizes)} do not match its object "
            f"meta {ours!r}")
    return names, [info.sizes[name] for name in names]


def _unpickle(info, data, buffers: list, skeleton: bool):
    """(the object of the pickle stream data, its _LoadContext). Raises CorruptionError
    naming the checkpoint when the stream is not a pickle (see _damaged_stream); an error
    raised by code the stream calls (a class's __setstate__, a reduce function) or a module
    or class that cannot be found is raised as it is."""
    ctx = _LoadContext(buffers, skeleton)
    prev = getattr(_local, "ctx", None)
    _local.ctx = ctx
    try:
        return pickle.loads(data, buffers=buffers), ctx
    except Exception as exc:
        if _damaged_stream(exc, inspect.currentframe()):
            raise CorruptionError(f"checkpoint {info.id} of stream {info.stream!r}: its pickle "
                                  f"stream cannot be read: {type(exc).__name__}: {exc}") from None
        raise
    finally:
        _local.ctx = prev


def _damaged_stream(exc: Exception, caller) -> bool:
    """True when exc comes from the unpickler reading a damaged stream: pickle's own errors,
    or an error the unpickler raised itself (the traceback ends in caller, the frame that
    called pickle.loads) other than a missing module or class or a lack of memory; False
    for an error raised by Python code the stream calls."""
    if isinstance(exc, (pickle.UnpicklingError, EOFError)):
        return True
    if isinstance(exc, (ImportError, AttributeError, MemoryError)):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame is caller


def load(store, id_or_stream: Any, into: Any = None) -> Any:
    """The object of a save() checkpoint (Store.load).

    Args:
        store: an open snapstore.Store (read-only is fine).
        id_or_stream: a checkpoint id, a CheckpointInfo, or a stream name (its latest).
        into: None, or an existing object graph of the same structure (dicts with the same
            keys, lists of the same lengths, arrays/dense tensors of the same shapes and
            dtypes, objects of the same classes): arrays, tensors and bytearrays are written
            in their existing memory, objects pickle rebuilds from their __dict__ alone get
            their attributes so, other values are set in their containers as loaded (Enum
            members, subclasses of built-in types, classes with their own __reduce__ or
            __setstate__: docs/objects.md) (FRESH in the
            target takes the loaded value as is; masked arrays and sparse, quantized or nested
            tensors are loaded only that way). Everything is checked before anything is
            written. A value set in the target never shares memory with another target.
    Returns: the object (arrays and tensors writable, in memory owned by the caller), or into.
    Raises: InvalidArgumentTypeError (store is not a Store: the store comes first),
        CheckpointNotFound, NotAnObjectCheckpointError (names the call that reads the
        checkpoint), StructureMismatchError (nothing written), CorruptionError (also for a
        pickle stream that is not one; an error raised by a class's __setstate__ or reduce
        function while unpickling is raised as it is).
    """
    require_store(store, "snapstore.objects.load")
    info = resolve_checkpoint(store, id_or_stream)
    names, sizes = _object_layout(info)
    if into is not None and into is not FRESH:
        return _load_into(store, info, names, sizes, into)
    buffers = [uninit_bytearray(n) for n in sizes]
    stream = uninit_bytearray(info.sizes[PICKLE_BUFFER])
    store.restore_into(info.id, {PICKLE_BUFFER: stream, **dict(zip(names, buffers))})
    obj, _ = _unpickle(info, stream, buffers, skeleton=False)
    return obj


# ---- load(into=): plan on a skeleton, check, then write ---------------------------------------
class _Plan:
    def __init__(self) -> None:
        self.actions: list[tuple] = []           # ("copy"|"assign"|"bytes", steps, ...)
        self.candidates: list[tuple] = []        # (buffer index, target view, action)
        self.uses: dict[int, int] = {}           # buffer index -> leaves copying from it
        self.kept: set = set()                   # buffers of values the target keeps as
        #                                          loaded (_ANY_BUFFER: maybe any buffer)
        self.walked: dict = {}                   # id -> object of every value _keep walked
        self.seen: set = set()


def _kind(x, np, torch, ctx: _LoadContext | None = None) -> str:
    if ctx is not None and id(x) in ctx.index:
        return "bytearray"                   # an out-of-band PickleBuffer of the skeleton
    if np is not None and isinstance(x, np.ma.MaskedArray):
        return "masked array"
    if np is not None and isinstance(x, np.ndarray):
        return "ndarray"
    if torch is not None and isinstance(x, torch.Tensor):
        return "tensor"
    if isinstance(x, (bytearray, pickle.PickleBuffer)):
        return "bytearray"
    if isinstance(x, Mapping):
        return "mapping"
    if isinstance(x, list):
        return "list"
    if isinstance(x, tuple):
        return "tuple"
    if _has_state_dict(x):
        return "object" if _state_is_its_dict(type(x)) else "opaque"
    return "leaf"


# Py_TPFLAGS_HEAPTYPE: set for classes a class statement made, not for built-in (C) types
_HEAPTYPE = 1 << 9
_OWN_STATE = ("__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__",
              "__getnewargs_ex__")


def _state_is_its_dict(cls: type) -> bool:
    """Whether pickle rebuilds an instance of cls from its __dict__ alone, so writing the
    __dict__ loads it in place: every class of its MRO but object made by a class statement
    (a subclass of int, set, Exception, functools.partial ... keeps state besides it), none
    with a reduce or state method of its own (whose state may be derived from the data: the
    plan's skeleton has zeros there), and no Enum (a member is a singleton of its class:
    written in place it changed the class for the whole process)."""
    if issubclass(cls, enum.Enum):
        return False
    for klass in cls.__mro__[:-1]:
        if not klass.__flags__ & _HEAPTYPE or any(n in klass.__dict__ for n in _OWN_STATE):
            return False
    return True


def _mismatch(steps, message: str):
    path = _format_path(steps)
    return StructureMismatchError(f"load(into=...): {path}: {message}; nothing was written",
                                  path)


def _same_leaf(a, b, np) -> bool:
    """True when the target's value b may stay for the checkpoint's a: the same object, an
    equal one of the same type, or a float (complex, NumPy scalar) with the same bits, so a
    NaN matches the same NaN."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (float, complex)) or (np is not None and isinstance(a, np.generic)):
        return _same_bits(a, b, np)             # 0.0 == -0.0, but they are not the same
    try:
        # equal and spelt the same: Decimal("1.0") == Decimal("1.000") and the same instant
        # in two time zones are equal, yet not what the checkpoint holds
        return bool(a == b) and repr(a) == repr(b)
    except Exception:
        return False


def _same_bits(a, b, np) -> bool:
    """True for two floats, complex numbers or NumPy scalars of one type with the same bytes."""
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, complex):
        return struct.pack("<dd", a.real, a.imag) == struct.pack("<dd", b.real, b.imag)
    if np is not None and isinstance(a, np.generic) and not a.dtype.hasobject:
        return a.tobytes() == b.tobytes()
    return False


def _plan_pair(src, dst, steps: tuple, container, key, plan: _Plan, ctx: _LoadContext,
               np, torch, depth: int = 0) -> None:
    if depth > 500:
        raise _mismatch(steps, "the object graph is nested too deeply")
    if dst is FRESH:
        if not isinstance(container, (MutableMapping, list)):
            raise _mismatch(steps, "FRESH must be inside a dict or a list")
        plan.actions.append(("assign", steps, container, key))
        _keep(src, plan, ctx, np, torch)
        return
    ks, kd = _kind(src, np, torch, ctx), _kind(dst, np, torch)
    if ks != kd:
        raise _mismatch(steps, f"the checkpoint holds a {type(src).__name__}, the target a "
                               f"{type(dst).__name__}")
    pair = (id(src), id(dst))
    if pair in plan.seen and ks not in ("leaf",):
        return
    plan.seen.add(pair)
    if ks == "masked array":
        raise _mismatch(steps, "a masked array is not loaded into in place (its mask would "
                               "stay as it is); load it as new with FRESH, or without into=")
    if ks == "ndarray":
        if src.dtype != dst.dtype or src.shape != dst.shape:
            raise _mismatch(steps, f"array of {src.dtype} {src.shape} in the checkpoint, "
                                   f"{dst.dtype} {dst.shape} in the target")
        if not dst.flags.writeable:
            raise _mismatch(steps, "the target array is read-only")
        if src.dtype.hasobject:          # copyto puts the loaded elements in the target
            _keep(src, plan, ctx, np, torch)
        _plan_buffer_leaf(src, dst, steps, plan, ctx, _array_buffer(src, ctx),
                          src.nbytes, _ndarray_target(src, dst, np))
    elif ks == "tensor":
        kinds = (_tensor_kind(src, torch), _tensor_kind(dst, torch))
        if kinds != ("dense", "dense"):
            raise _mismatch(steps, f"a {kinds[0]} tensor in the checkpoint, {kinds[1]} in the "
                                   "target: only dense (strided) tensors are loaded into in "
                                   "place; load it as new with FRESH")
        if src.dtype != dst.dtype or tuple(src.shape) != tuple(dst.shape):
            raise _mismatch(steps, f"tensor of {src.dtype} {tuple(src.shape)} in the checkpoint, "
                                   f"{dst.dtype} {tuple(dst.shape)} in the target")
        problem = _unwritable_tensor(dst, torch)
        if problem is not None:
            raise _mismatch(steps, problem)
        _plan_buffer_leaf(src, dst, steps, plan, ctx, _copied_tensor_buffer(src, plan, ctx, torch),
                          src.numel() * src.element_size(), _tensor_target(src, dst))
    elif ks == "bytearray":
        size, target = len(memoryview(src)), _writable_bytes(dst)
        if target is None:
            raise _mismatch(steps, "the target buffer is not writable")
        if size != len(target):
            raise _mismatch(steps, f"buffer of {size} bytes in the checkpoint, {len(target)} in "
                                   "the target")
        plan.actions.append(("bytes", steps, target))
        _count_use(plan, ctx.index_of(src))
    elif ks == "mapping":
        factories = (getattr(src, "default_factory", None), getattr(dst, "default_factory", None))
        if factories[0] is not factories[1]:
            raise _mismatch(steps, f"a mapping whose default_factory is {factories[0]!r} in the "
                                   f"checkpoint, {factories[1]!r} in the target")
        if set(src.keys()) != set(dst.keys()):
            missing = [k for k in src if k not in dst]
            extra = [k for k in dst if k not in src]
            raise _mismatch(steps, f"keys differ: missing in the target {missing[:5]!r}, not in "
                                   f"the checkpoint {extra[:5]!r}")
        for k in src.keys():
            _plan_pair(src[k], dst[k], steps + (("item", k),), dst, k, plan, ctx, np, torch,
                       depth + 1)
        _plan_attributes(src, dst, steps, plan, ctx, np, torch, depth)
    elif ks in ("list", "tuple"):
        if len(src) != len(dst):
            raise _mismatch(steps, f"{ks} of {len(src)} items in the checkpoint, {len(dst)} in "
                                   "the target")
        for i, (a, b) in enumerate(zip(src, dst)):
            _plan_pair(a, b, steps + (("item", i),), dst, i, plan, ctx, np, torch, depth + 1)
        _plan_attributes(src, dst, steps, plan, ctx, np, torch, depth)
    elif ks == "object":
        _plan_attributes(src, dst, steps, plan, ctx, np, torch, depth, always=True)
    else:  # a plain value, or an object pickle rebuilds otherwise: set it in its container
        if isinstance(container, (MutableMapping, list)):
            plan.actions.append(("assign", steps, container, key))
            _keep(src, plan, ctx, np, torch)
        elif ks == "opaque" and src is not dst:
            where = "at the root" if container is None else f"inside a {type(container).__name__}"
            raise _mismatch(steps, f"a {type(dst).__qualname__} {where} cannot be loaded in "
                                   "place: pickle rebuilds it otherwise than from its __dict__ "
                                   "(an Enum member, a subclass of a built-in type, a class "
                                   "with its own __reduce__ or __setstate__); put it in a dict "
                                   "or list, or load without into=")
        elif not _same_leaf(src, dst, np):
            where = "at the root" if container is None else f"inside a {type(container).__name__}"
            raise _mismatch(steps, f"a {type(dst).__name__} {where} cannot be changed in place "
                                   f"(checkpoint {src!r:.60}, target {dst!r:.60})")


def _plan_attributes(src, dst, steps: tuple, plan: _Plan, ctx: _LoadContext, np, torch,
                     depth: int, *, always: bool = False) -> None:
    """Plans the attributes (vars()) of an object, or of a dict, list or tuple subclass
    that has any (always=False: a container with none on either side is left alone): the
    types must be the same and so must the attribute names."""
    a, b = getattr(src, "__dict__", None), getattr(dst, "__dict__", None)
    if not always and not a and not b:
        return
    if type(src) is not type(dst):
        raise _mismatch(steps, f"{type(src).__qualname__} in the checkpoint, "
                               f"{type(dst).__qualname__} in the target")
    slots = _slot_names(type(src))
    if slots:       # only the __dict__ would be written: the slots would keep stale values
        raise _mismatch(steps, f"a {type(src).__qualname__} keeps state in __slots__ "
                               f"({', '.join(slots[:3])}) besides its __dict__: not loaded into "
                               "in place; load it as new with FRESH")
    a, b = a or {}, b if b is not None else {}
    if set(a) != set(b):
        raise _mismatch(steps, f"attributes differ: {sorted(set(a) ^ set(b))[:5]!r}")
    for k in a:
        _plan_pair(a[k], b[k], steps + (("attr", k),), b, k, plan, ctx, np, torch, depth + 1)


def _slot_names(cls: type) -> list[str]:
    """The __slots__ names a class and its bases declare (not __dict__ and __weakref__)."""
    names = []
    for klass in cls.__mro__:
        declared = klass.__dict__.get("__slots__", ())
        for name in ([declared] if isinstance(declared, str) else declared):
            if name not in ("__dict__", "__weakref__"):
                names.append(name)
    return names


def _writable_bytes(x) -> memoryview | None:
    try:
        view = x.raw() if isinstance(x, pickle.PickleBuffer) else memoryview(x)
    except (BufferError, TypeError, ValueError):
        return None
    return None if view.readonly or not view.c_contiguous else view.cast("B")


_ANY_BUFFER = -1               # in _Plan.kept: values whose memory cannot be told
_WALK_LIMIT = 1_000_000        # objects _keep walks in one plan before it gives _ANY_BUFFER
_ATOMIC_TYPES = frozenset((int, float, complex, str, bytes, bool, type(None)))
_NEVER_LOADED = (type, types.FunctionType, types.ModuleType, types.CodeType)


def _keep(src, plan: _Plan, ctx: _LoadContext, np, torch) -> None:
    """Notes that the target keeps src (a part of the skeleton) as loaded: every out-of-band
    buffer whose memory anything reachable from src lies in goes to plan.kept. That is
    arrays, tensors, storages and buffers at any depth, inside any container or object
    (followed with gc.get_referents, which sees deques, sets, slots and __dict__s alike, and
    into object arrays' elements); _ANY_BUFFER when it cannot be told (a tensor whose memory
    cannot be found, more than _WALK_LIMIT objects walked)."""
    found: set = set()
    walked = plan.walked          # held, so no id is reused; shared by the plan's calls
    stack = [src]
    while stack:
        x = stack.pop()
        if type(x) in _ATOMIC_TYPES or isinstance(x, _NEVER_LOADED) or id(x) in walked:
            continue
        walked[id(x)] = x
        if len(walked) > _WALK_LIMIT:
            found.add(_ANY_BUFFER)
            break
        stack.extend(_parts_and_memory(x, ctx, np, torch, found))
    found.discard(None)
    plan.kept |= found


def _parts_and_memory(x, ctx: _LoadContext, np, torch, found: set) -> list:
    """The objects x refers to; adds the buffers x's own elements lie in to found."""
    if np is not None and isinstance(x, np.ndarray):
        parts = gc.get_referents(x)   # a subclass's attributes
        if x.dtype.hasobject:
            parts.append(x.tolist())  # the elements themselves, in nested lists
        else:
            found.add(_array_buffer(x, ctx))
        return parts
    if torch is not None and isinstance(x, torch.Tensor):
        found.update(_tensor_buffers(x, ctx, torch))
        return gc.get_referents(x)    # its attributes
    if torch is not None and isinstance(x, torch.UntypedStorage):
        found.add(ctx.buffer_at(x.data_ptr()))
    else:
        found.add(ctx.index_of(x))    # a skeleton buffer, a memoryview of one
    return gc.get_referents(x)


def _array_buffer(a, ctx: _LoadContext) -> int | None:
    """The skeleton buffer a NumPy array's elements lie in, or None."""
    i = ctx.index_of(a)
    if i is None and a.size:
        i = ctx.buffer_at(a.__array_interface__["data"][0])
    return i


def _tensor_buffer(t, ctx: _LoadContext) -> int | None:
    """The skeleton buffer a strided tensor's storage lies in, or None. Raises RuntimeError
    (or NotImplementedError, TypeError) for a tensor without a storage (a wrapper subclass)."""
    i = ctx.tensor_index.get(id(t))
    return i if i is not None else ctx.buffer_at(t.untyped_storage().data_ptr())


def _copied_tensor_buffer(src, plan: _Plan, ctx: _LoadContext, torch) -> int | None:
    """The skeleton buffer a dense tensor that a copy leaf reads lies in, or None; when that
    cannot be told, no buffer goes straight into a target (_ANY_BUFFER is kept)."""
    (index,) = _tensor_buffers(src, ctx, torch)
    if index == _ANY_BUFFER:
        plan.kept.add(_ANY_BUFFER)
        return None
    return index


def _tensor_buffers(t, ctx: _LoadContext, torch) -> set:
    """The skeleton buffers a tensor of any layout uses ({_ANY_BUFFER}: cannot be told)."""
    try:
        if t.layout == torch.strided:
            return {_tensor_buffer(t, ctx)}
        if t.layout == torch.sparse_coo:
            parts = (t._indices(), t._values())
        elif t.layout in (torch.sparse_csr, torch.sparse_bsr):
            parts = (t.crow_indices(), t.col_indices(), t.values())
        elif t.layout in (torch.sparse_csc, torch.sparse_bsc):
            parts = (t.ccol_indices(), t.row_indices(), t.values())
        else:
            return {_ANY_BUFFER}
        return {_tensor_buffer(p, ctx) for p in parts}
    except (RuntimeError, NotImplementedError, TypeError):   # no storage (a wrapper)
        return {_ANY_BUFFER}


def _ndarray_target(src, dst, np):
    """The target's bytes when they are laid out like the saved buffer, else None."""
    if src.size == 0:
        return None
    if (src.flags.c_contiguous and dst.flags.c_contiguous) or \
            (src.flags.f_contiguous and dst.flags.f_contiguous):
        try:
            return pickle.PickleBuffer(dst.view(np.int64) if dst.dtype.kind in "mM"
                                       else dst).raw()
        except (BufferError, TypeError, ValueError):
            return None
    return None


def _tensor_kind(t, torch) -> str:
    """"dense" for a plain strided tensor, else what it is ("quantized", "nested",
    "torch.sparse_coo"...), read without touching its sizes (a nested tensor has none)."""
    if t.is_nested:
        return "nested"
    if t.is_quantized:
        return "quantized"
    if t.layout != torch.strided:
        return str(t.layout)
    return "dense"


def _unwritable_tensor(t, torch) -> str | None:
    """Why the target tensor t cannot be loaded into in place (checked before anything is
    written: copy_ would fail half-way, or do nothing), or None."""
    if t.is_meta:
        return ("the target tensor is on the meta device: it has no memory to load into; "
                f"{MATERIALISE_META}")
    if t.is_inference() and not torch.is_inference_mode_enabled():
        return ("the target is an inference tensor (made under torch.inference_mode()): it "
                "can be written only in inference mode")
    if t.layout == torch.strided and _overlapping(t.shape, t.stride()):
        return ("elements of the target tensor share memory (an expand()ed or as_strided "
                "view): it cannot be loaded into")
    return None


def _tensor_target(src, dst):
    if dst.device.type != "cpu" or src.numel() == 0 or src.storage_offset() != 0 \
            or tuple(src.stride()) != tuple(dst.stride()) or dst.is_conj() or dst.is_neg():
        return None
    n = src.numel() * src.element_size()
    if n != src.untyped_storage().nbytes() or not _dense(src.shape, src.stride()):
        return None
    return address_view(dst.data_ptr(), n)


def _plan_buffer_leaf(src, dst, steps, plan: _Plan, ctx, index, nbytes, target) -> None:
    plan.actions.append(("copy", steps, dst))
    _count_use(plan, index)
    if index is not None and target is not None and len(target) == nbytes:
        plan.candidates.append((index, target, len(plan.actions) - 1))


def _count_use(plan: _Plan, index: int | None) -> None:
    """One more leaf copies from buffer index (None: from no out-of-band buffer)."""
    if index is not None:
        plan.uses[index] = plan.uses.get(index, 0) + 1


def _walk(root, steps):
    x = root
    for kind, key in steps:
        x = vars(x)[key] if kind == "attr" else x[key]
    return x


def _direct_restores(plan: _Plan, sizes: list) -> tuple[dict, set]:
    """({buffer index: target memory}, indices of the copy actions they replace): the
    buffers that only one copy leaf reads, into a target laid out like the buffer. A buffer
    that anything the target keeps as loaded (an assigned value, FRESH, object array
    elements) uses is never one: that value would be a view of the target's memory."""
    direct: dict[int, memoryview] = {}
    direct_actions: set = set()
    if _ANY_BUFFER in plan.kept:
        return direct, direct_actions
    spans_taken: list = []      # target memory written directly: a target met twice, or tied
    #                             targets (two tensors of one storage), are copied in order
    #                             instead, last one wins as in load_state_dict
    for index, view, action in plan.candidates:
        if plan.uses.get(index) == 1 and index not in plan.kept and index not in direct \
                and len(view) == sizes[index]:
            first = buffer_address(view)
            span = (first, first + len(view))
            if any(a < span[1] and span[0] < b for a, b in spans_taken):
                continue
            direct[index] = view
            direct_actions.add(action)
            spans_taken.append(span)
    return direct, direct_actions


def _load_into(store, info, names, sizes, into):
    data = store.read(info.id, PICKLE_BUFFER)
    # 1. a skeleton over untouched memory, matched against the target: all checks first
    placeholders = [_placeholder(n) for n in sizes]
    loaded = None
    try:
        skeleton, ctx = _unpickle(info, data, placeholders, skeleton=True)
    except SnapstoreError:
        raise
    except Exception:   # noqa: BLE001 - the same unpickle over the data decides
        # a reduce function or __setstate__ that refuses the skeleton's zeros (it checks or
        # derives from the data): the plan is made on the data itself (one more copy of it;
        # an error that the data raises too is raised as it is)
        loaded = [uninit_bytearray(n) for n in sizes]
        store.restore_into(info.id, dict(zip(names, loaded)))
        skeleton, ctx = _unpickle(info, data, loaded, skeleton=True)
    np, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    plan = _Plan()
    _plan_pair(skeleton, into, (), None, None, plan, ctx, np, torch)
    # 2. buffers used by exactly one array/tensor laid out like its target go straight into
    # the target's memory; the others into fresh memory, copied after the final unpickle
    direct, direct_actions = _direct_restores(plan, sizes) if loaded is None else ({}, set())
    del skeleton, ctx, placeholders, plan.candidates, plan.walked
    if loaded is None:
        buffers = [direct[i] if i in direct else uninit_bytearray(n)
                   for i, n in enumerate(sizes)]
        store.restore_into(info.id, dict(zip(names, buffers)))
    else:
        buffers = loaded
    final, _ = _unpickle(info, data, buffers, skeleton=False)
    for i, action in enumerate(plan.actions):
        if i in direct_actions:
            continue
        kind, steps = action[0], action[1]
        value = _walk(final, steps)
        if kind == "assign":
            action[2][action[3]] = value
        elif kind == "bytes":
            action[2][:] = memoryview(value).cast("B")
        elif torch is not None and isinstance(action[2], torch.Tensor):
            with torch.no_grad():
                copy_tensor(action[2], value, torch)
        else:
            np.copyto(action[2], value, casting="no")
    del final
    return into
