"""PyTorch on snapstore: state dicts as object checkpoints (save/load), and a storage backend
for torch.distributed.checkpoint (SnapstoreWriter/SnapstoreReader). Needs torch==2.13.0
(``pip install 'snapstore[torch]'``); ``import snapstore`` alone never imports torch.

    snapstore.torch.save(store, {"model": model, "optim": opt, "step": step}, "train")
    snapstore.torch.load(store, "train", into={"model": model, "optim": opt, "step": 0})

The store comes first, as for a Store method (README, "API conventions"); the old order
save(state, store, ...) still works in this version, with a DeprecationWarning.

    dcp.save(sd, checkpoint_id="step-100", storage_writer=SnapstoreWriter("ckpts"))
    dcp.load(sd, checkpoint_id="step-100", storage_reader=SnapstoreReader("ckpts"))

How DCP plans map onto the store (docs/objects.md): one dcp.save is one checkpoint of the
stream (default "dcp") whose buffers are the save's write items, named "item/<fqn>" (plus
"@<offsets>" for shards), and "dcp/metadata" (DCP's Metadata, pickled). Its meta
{"snapstore.dcp": {"checkpoint_id": ..., ...}} records DCP's checkpoint_id, so the reader
finds it by that id. Items keep their names from save to save, so later saves are
incremental. The save is a group commit (Store.group): every rank stages its items at the
same time, through its own Store, and the coordinator's finish() commits them all at once;
until then nothing of the save is visible. Checkpoints written before format 3 kept the
other ranks' items in part checkpoints of stream "<stream>/rank<N>"; the reader still reads
them.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import io
import math
import os
import pickle
import threading
import time
import warnings
from typing import Any, NamedTuple

try:
    import torch
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("snapstore.torch needs PyTorch: pip install 'snapstore[torch]' "
                      "(torch==2.13.0)") from exc
from torch.futures import Future
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan,
                                                  SavePlanner, WriteItemType)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult

from snapstore.engine import format as fmt
from snapstore.engine.memory import address_view
from snapstore.remote.layout import is_remote
from snapstore import objects
from snapstore.objectlayer import (DCP_META_KEY, DCP_METADATA_BUFFER, DCP_PART_KEY,
                                   MATERIALISE_META, contiguous_tensor, float_view, layer_meta,
                                   require_store)
from snapstore.errors import (CheckpointNotFound, DeviceTensorError, InvalidArgumentError,
                              InvalidArgumentTypeError, SnapstoreError, StructureMismatchError)
from snapstore.engine.validation import disjoint_batches, validate_name, validate_timeout
from snapstore.store import CheckpointInfo, Group, Store

__all__ = ["save", "save_async", "load", "SnapstoreWriter", "SnapstoreReader", "DCP_META_KEY",
           "METADATA_BUFFER", "METADATA_PARTICIPANT"]

DCP_VERSION = 1
METADATA_BUFFER = DCP_METADATA_BUFFER
ITEM_PREFIX = "item/"


# ---- state dicts ------------------------------------------------------------------------------
def _state_of(x: Any) -> Any:
    if isinstance(x, (torch.nn.Module, torch.optim.Optimizer)):
        return x.state_dict()
    return x


def _states(state: Any) -> Any:
    """Modules and optimizers (the value itself, or values of a top-level dict) -> state dicts.
    A dict holding none is saved as it is, so a module's state_dict() keeps its type and its
    _metadata (an OrderedDict's attribute load_state_dict reads), as torch.save keeps them;
    one holding some is copied (copy.copy: a dict subclass keeps its type and attributes)
    with those values replaced."""
    if isinstance(state, dict):
        if not any(isinstance(v, (torch.nn.Module, torch.optim.Optimizer))
                   for v in state.values()):
            return state
        try:
            out = copy.copy(state)
        except Exception:               # noqa: BLE001 - a subclass that does not copy
            out = dict(state)
        for k, v in state.items():
            out[k] = _state_of(v)
        return out
    return _state_of(state)


@contextlib.contextmanager
def _opened(store, readonly: bool):
    if isinstance(store, Store):
        yield store
        return
    from snapstore.store import open as open_store
    s = open_store(os.fspath(store), readonly=readonly)
    try:
        yield s
    finally:
        s.close()


_MISSING: Any = object()


def _is_path(x: Any) -> bool:
    return isinstance(x, (str, bytes, os.PathLike))


def _store_and_state(first: Any, second: Any) -> tuple[Any, Any]:
    """(store, state) of save(store, state) or of the deprecated save(state, store), told
    apart by type: the Store (else the store path) is the store. InvalidArgumentTypeError
    when the types do not say which (two Stores, two paths, neither)."""
    if isinstance(first, Store) != isinstance(second, Store):
        old = isinstance(second, Store)
    elif not isinstance(first, Store) and _is_path(first) != _is_path(second):
        old = _is_path(second)
    else:
        raise InvalidArgumentTypeError(
            f"snapstore.torch.save(store, state, ...): cannot tell the store from the state in "
            f"({type(first).__name__}, {type(second).__name__}): pass an open Store (or a "
            "store path) first and the state second")
    if not old:
        return first, second
    warnings.warn("snapstore.torch.save(state, store, ...) is deprecated: the store comes "
                  "first, save(store, state, ...); the old order stops working in the next "
                  "version", DeprecationWarning, stacklevel=3)
    return second, first


def save(store, state: Any = _MISSING, stream: str = "default", meta: Any = None, *,
         allow_device_copy: bool = False) -> CheckpointInfo:
    """Checkpoints a state dict (or any object holding tensors) as an object checkpoint.

    Args:
        store: an open Store, or a store path (opened and closed around the save).
        state: a state dict, a module or optimizer (saved as its state_dict()), or a dict whose
            values may be modules/optimizers. Tensors of every dtype (bfloat16, float8...) are
            saved by storage, raw bytes, out of band; tensors sharing a storage stay shared;
            a view that does not fill its storage is saved as its elements only.
        stream, meta: as for Store.checkpoint (stream may be passed by keyword).
        allow_device_copy: copy tensors on other devices to the CPU (they load on the CPU);
            by default such a tensor raises DeviceTensorError naming it.
    Returns: CheckpointInfo.
    Raises: InvalidArgumentTypeError (the store and the state cannot be told apart, or state
        is missing); otherwise see snapstore.objects.save.

    Deprecated: save(state, store, ...) (the state first) still works in this version and
    warns (DeprecationWarning); the two are told apart by which argument is a Store.
    """
    if state is _MISSING:
        raise InvalidArgumentTypeError("snapstore.torch.save(store, state, ...) needs a state")
    store, state = _store_and_state(store, state)
    with _opened(store, readonly=False) as s:
        return objects.save(s, _states(state), stream=stream, meta=meta,
                            allow_device_copy=allow_device_copy)


def save_async(store: Store, state: Any, stream: str = "default", meta: Any = None, *,
               allow_device_copy: bool = False):
    """save() that returns as soon as the state's changed bytes are copied into the store's
    staging memory: a concurrent.futures.Future of the CheckpointInfo, resolved once the
    checkpoint is durable (snapstore.objects.save_async).

    The checkpoint holds the values as of the call: training may update the tensors in place
    the moment this returns (optimizer.step()), the checkpoint still restores what they held
    at the call. Staging memory is bounded by the store's staging_bytes (open(...,
    staging_bytes=N)); stats() reports what is in use and the peak; a save larger than all of
    it is written before this returns. Saves of a stream commit in call order; an error
    raises from the future and from the next save of the stream. store.flush() waits for
    all of them, store.close() too.

    Args: as save(), except that store must be an open Store (the future outlives the call;
        a path would leave nobody to close it).
    Raises (now): InvalidArgumentTypeError (store is not an open Store), the argument and
        pickling errors of save(); the future: StoreIOError, CommitConflict, ..."""
    if not isinstance(store, Store):
        raise InvalidArgumentTypeError(
            "snapstore.torch.save_async(store, state, ...) needs an open snapstore.Store "
            f"first (the future outlives the call), got {type(store).__name__}")
    return objects.save_async(store, _states(state), stream=stream, meta=meta,
                              allow_device_copy=allow_device_copy)


def load(store, id_or_stream: Any, into: Any = None) -> Any:
    """Loads a checkpoint written by save() (or Store.save).

    Args:
        store: an open Store, or a store path (opened read-only).
        id_or_stream: checkpoint id, CheckpointInfo, or stream name (its latest checkpoint).
        into: None (returns new CPU tensors), or the live objects to restore in place: a
            state dict, a module (its parameters and buffers are overwritten in place), an
            optimizer (its state is overwritten in place when it has state for the same
            parameters, else loaded fresh; then optimizer.load_state_dict applies the param
            groups), or a dict whose values may be modules/optimizers. Structure, shapes and
            dtypes are checked before anything is written.
    Returns: the loaded object, or into.
    Raises: InvalidArgumentTypeError (store is not a Store or a path: the store comes first),
        CheckpointNotFound, NotAnObjectCheckpointError (names the call that reads it),
        StructureMismatchError (nothing written), CorruptionError.
    """
    where = "snapstore.torch.load(store, id_or_stream, into=None)"
    if isinstance(id_or_stream, Store):
        raise InvalidArgumentTypeError(f"{where}: the first argument must be an open "
                                       "snapstore.Store (the store comes first), got "
                                       f"{type(store).__name__} then a Store")
    if not isinstance(store, (str, bytes, os.PathLike)):
        require_store(store, where)
    with _opened(store, readonly=True) as s:
        if into is None:
            return objects.load(s, id_or_stream)
        optimizers: list = []

        def target(x, key=None, in_place=True):
            if isinstance(x, torch.nn.Module):
                return x.state_dict()
            if isinstance(x, torch.optim.Optimizer):
                optimizers.append((key, x))
                return x.state_dict() if x.state and in_place else objects.FRESH
            return x

        def targets(in_place: bool):
            optimizers.clear()
            if isinstance(into, dict):
                return {k: target(v, k, in_place) for k, v in into.items()}
            return target(into, None, in_place)

        tgt = targets(in_place=True)
        # one checkpoint for the check and the loads: a name like "latest" resolved again
        # could name another one that a writer committed meanwhile
        info = s.resolve(id_or_stream)
        _check_optimizer_groups(s, info, optimizers)
        try:
            result = objects.load(s, info, into=tgt)
        except StructureMismatchError:
            # an optimizer with state for other parameters than the checkpoint's (one that
            # stepped only some of them): its state is loaded fresh, as documented. Nothing
            # was written, so the load is tried again that way; a mismatch elsewhere is
            # raised again by that second try.
            if not any(opt.state for _, opt in optimizers):
                raise
            tgt = targets(in_place=False)
            result = objects.load(s, info, into=tgt)
        for key, opt in optimizers:
            try:
                opt.load_state_dict(result if key is None else result[key])
            except (ValueError, KeyError, TypeError, IndexError) as exc:
                where = "the optimizer" if key is None else f"optimizer {key!r}"
                raise StructureMismatchError(
                    f"snapstore.torch.load(into=...): {where} refused the checkpoint's state "
                    f"({type(exc).__name__}: {exc}): an optimizer of another kind? The other "
                    "targets were loaded already", "obj" if key is None else str(key)) \
                    from None
        if isinstance(into, dict):
            for k, v in into.items():
                if not isinstance(v, (torch.nn.Module, torch.optim.Optimizer)):
                    into[k] = tgt[k]
        return into


def _check_optimizer_groups(store, name: Any, optimizers: list) -> None:
    """StructureMismatchError, before anything is written, when the checkpoint's param
    groups for an optimizer target are not shaped as its target's (the number of groups, the
    parameters in each), or the checkpoint holds none there: torch's load_state_dict refuses
    them only after the other targets (the model) were written in place. Read from the
    checkpoint's pickle stream alone (tensors.catalogue), no tensor loaded."""
    if not optimizers:
        return
    from snapstore.tensors import catalogue
    values = catalogue(store, store.resolve(name)).values
    for key, opt in optimizers:
        prefix = ("" if key is None else f"{key}.") + "param_groups."
        sizes: dict = {}
        for path in values:
            if not path.startswith(prefix):
                continue
            group, _, rest = path[len(prefix):].partition(".")
            field, _, index = rest.partition(".")
            if group.isdigit():
                sizes.setdefault(int(group), 0)
                if field == "params" and index.isdigit():
                    sizes[int(group)] = max(sizes[int(group)], int(index) + 1)
        want = [len(g["params"]) for g in opt.param_groups]
        have = [sizes.get(g, 0) for g in range(max(sizes) + 1)] if sizes else None
        if have != want:
            where = "the optimizer" if key is None else f"optimizer {key!r}"
            found = ("no optimizer state" if have is None else
                     f"{len(have)} param group(s) of {have} parameter(s)")
            raise StructureMismatchError(
                f"snapstore.torch.load(into=...): {where} has {len(want)} param group(s) of "
                f"{want} parameter(s), the checkpoint {found}; nothing was written",
                "obj" if key is None else str(key))


# ---- torch.distributed.checkpoint backend ------------------------------------------------------
METADATA_PARTICIPANT = "metadata"      # the group participant staging DCP's metadata
_RANK_PARTICIPANT = "rank{}"           # ... staging rank N's write items


class _RankPlan(NamedTuple):
    """What the coordinator tells a rank through its plan's storage_data (passed between
    ranks, never stored): the save's group, the rank, and its participant name (None: the
    rank has nothing to write)."""
    group: str
    rank: int
    participant: str | None


# PINNED BY THE FORMAT: the pickled DCP metadata of every DCP checkpoint (METADATA_BUFFER)
# names this class as snapstore.torch._Location: never rename, move or change its fields.
class _Location(NamedTuple):
    """Where a DCP write item lives: checkpoint (None: the save's own checkpoint; an id only
    in multi-rank saves made before format 3, naming another rank's part checkpoint), buffer
    name, and the shape of the stored chunk (None for byte items)."""
    checkpoint: int | None
    buffer: str
    sizes: tuple | None


def _item_name(index: MetadataIndex) -> str:
    """The buffer name of a write item: stable across saves, so they diff against each other.
    One name per (fqn, offset): '%' and '@' in the fqn are escaped, as '@' starts the offset
    (a key "w@4,0" and the shard of "w" at rows 4 were one name). Readers find buffers through
    the DCP metadata (storage_data), so names of older saves still read."""
    name = ITEM_PREFIX + index.fqn.replace("%", "%25").replace("@", "%40")
    if index.offset is not None and any(index.offset):
        name += "@" + ",".join(str(int(o)) for o in index.offset)
    if len(name.encode("utf-8", "surrogatepass")) > fmt.MAX_NAME_BYTES or "\0" in name:
        digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=20)
        name = ITEM_PREFIX + "#" + digest.hexdigest()
    return name


def _tensor_bytes(tensor: torch.Tensor, fqn: str = "tensor") -> tuple[memoryview, torch.Tensor]:
    """A byte view of exactly the tensor's elements (CPU, contiguous; copies only if not).
    DeviceTensorError for a meta tensor (no data to copy: torch would raise its own error)."""
    t = tensor.detach()
    if t.device.type == "meta":
        raise DeviceTensorError(f"{fqn} is a tensor on meta, which has no data: "
                                f"{MATERIALISE_META}", fqn)
    if t.device.type != "cpu":
        t = t.to("cpu")
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = contiguous_tensor(t, torch)
    return float_view(address_view(t.data_ptr(), t.numel() * t.element_size()), t), t


def _dcp_id(checkpoint_id: Any) -> Any:
    if checkpoint_id is None or isinstance(checkpoint_id, int) and \
            not isinstance(checkpoint_id, bool):
        return checkpoint_id
    if isinstance(checkpoint_id, (str, os.PathLike)):
        return os.fspath(checkpoint_id)
    raise TypeError(f"checkpoint_id must be a str, os.PathLike or int, got "
                    f"{type(checkpoint_id).__name__}")


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class _StoreUser:
    """What SnapstoreWriter and SnapstoreReader share: the store (a path opened for one
    operation, or a Store the caller owns) and DCP's checkpoint_id protocol."""

    def __init__(self, path, stream: str, open_options: dict) -> None:
        if isinstance(path, Store):
            self._store_obj, self.path = path, path.path
        elif isinstance(path, (str, bytes, os.PathLike)):
            path = os.fspath(path)
            self._store_obj, self.path = None, os.fsdecode(path) if isinstance(path, bytes) \
                else path
        else:
            raise InvalidArgumentTypeError(f"{type(self).__name__}: expected a store path, an "
                                           f"s3:// URL or an open Store, got "
                                           f"{type(path).__name__}")
        self.stream = validate_name(stream, "stream")
        self.open_options = dict(open_options)
        self.checkpoint_id: Any = None
        self._id_is_new = False

    # DCP calls reset(checkpoint_id) before a save or load only when the caller gave an id, so
    # an id not given again since the previous operation must not stick.
    def reset(self, checkpoint_id=None) -> None:
        self.checkpoint_id = _dcp_id(checkpoint_id)
        self._id_is_new = True
        self._discard()

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    def _begin(self) -> None:
        """The first step of a save or load: forgets a checkpoint_id reset() did not just set."""
        if not self._id_is_new:
            self.checkpoint_id = None
        self._id_is_new = False

    def _discard(self) -> None:
        """Drops what the previous save or load left behind."""
        raise NotImplementedError

    def _open(self, readonly: bool) -> Store:
        if self._store_obj is not None:
            return self._store_obj
        from snapstore.store import open as open_store
        options = dict(self.open_options)
        if readonly:
            options.pop("timeout", None)
            options.pop("durability", None)
            return open_store(self.path, readonly=True, **options)
        return open_store(self.path, **options)

    def save_key(self) -> tuple:
        """The store and stream a save goes into (saves of one key run one at a time)."""
        where = self.path if is_remote(self.path) else os.path.realpath(self.path)
        return where, self.stream

    def _done(self, store: Store | None) -> None:
        if store is not None and store is not self._store_obj:
            store.close()


# One dcp.save on one rank, from set_up_storage_writer to the end of its part: the Store it
# writes through and, on the coordinator, the group every rank stages into. A save whose
# finish() never runs (DCP skips it when any rank failed) is ended when its thread starts
# the next save (a thread runs one dcp.save at a time, so a save still registered in it then
# is abandoned), or when any thread starts a save after the save's thread ended (dcp.async_save
# runs each save on a thread of its own, which ends with it: its next save never comes on
# that thread, and the abandoned group kept the stream from every later save until its
# deadline). Its group is aborted (an S3 store's groups outlive the Store that opened them; a
# local store would also drop it when that Store closes), then a Store the save opened is
# closed.
_SAVES_LOCK = threading.Lock()
_SAVES_ENDED = threading.Condition(_SAVES_LOCK)
_SAVES: dict = {}           # threading.Thread -> [its _Saves not ended], in start order


def _saves_after_fork_in_child() -> None:
    """A fork()ed child has only the forking thread, and a fresh lock (another thread may
    have held it at the fork): the parent's saves are the parent's to end."""
    global _SAVES_LOCK, _SAVES_ENDED
    _SAVES_LOCK = threading.Lock()
    _SAVES_ENDED = threading.Condition(_SAVES_LOCK)
    _SAVES.clear()


os.register_at_fork(after_in_child=_saves_after_fork_in_child)


class _Save:
    def __init__(self, user: "_StoreUser") -> None:
        self.user = user
        self.store: Store | None = None
        self.group: Group | None = None
        self.committed = False
        self.thread = threading.current_thread()
        with _SAVES_LOCK:
            _SAVES.setdefault(self.thread, []).append(self)

    def open(self) -> Store:
        if self.store is None:
            self.store = self.user._open(readonly=False)
        return self.store

    def end(self) -> None:
        """Lets go of the store; an uncommitted group is dropped (nothing of it visible). Any
        thread may end a save (a writer's close(), another save's set-up)."""
        with _SAVES_LOCK:
            saves = _SAVES.get(self.thread, [])
            if self in saves:
                saves.remove(self)
            if not saves:
                _SAVES.pop(self.thread, None)
            _SAVES_ENDED.notify_all()
        store, group, self.store, self.group = self.store, self.group, None, None
        try:
            if group is not None and not self.committed and store is not None \
                    and not store.closed:
                with contextlib.suppress(SnapstoreError):
                    group.abort()
        finally:
            self.user._done(store)


def _wait_for_saves_of(user: "_StoreUser", deadline: float) -> None:
    """Waits (until the monotonic deadline) while another live thread of this process runs a
    save into the same store and stream: dcp.async_save runs each save on a thread of its
    own, and a stream takes one save at a time (its group), so an async_save made while the
    previous one's future is pending failed at once with CommitConflict; now it follows it.
    Past the deadline it goes on (and conflicts, naming this process)."""
    me = threading.current_thread()
    key = user.save_key()
    with _SAVES_ENDED:
        while True:
            busy = any(t is not me and t.is_alive() and save.user.save_key() == key
                       for t, saves in _SAVES.items() for save in saves)
            left = deadline - time.monotonic()
            if not busy or left <= 0:
                return
            _SAVES_ENDED.wait(min(left, 0.5))     # a thread that ends ends no save itself


def _end_abandoned_saves() -> None:
    """Ends the saves this thread began and those of threads that ended (see above)."""
    me = threading.current_thread()
    with _SAVES_LOCK:
        abandoned = [save for thread, saves in _SAVES.items()
                     if thread is me or not thread.is_alive() for save in saves]
    for save in abandoned:
        save.end()


class SnapstoreWriter(_StoreUser, StorageWriter):
    """torch.distributed.checkpoint StorageWriter into a snapstore store.

    Args:
        path: the store directory (created if needed), an S3 store's URL
            ("s3://BUCKET/PREFIX": every rank reaches the bucket, each through its own
            cache_dir, e.g. on its own machine), or an open Store (used, not closed).
        stream: the stream of the DCP checkpoints (default "dcp").
        timeout: seconds one save may take from the coordinator's global plan to its commit
            (the group commit's deadline: past it the save fails with GroupTimeout and nothing
            of it is visible); opening the store also waits up to this long for an operation
            that holds it exclusively (its creation by another rank, an upgrade, a repair).
        **open_options: more snapstore.open options (durability, page_size, an S3 store's
            cache_dir...).

    Each dcp.save is one group commit of the stream (Store.group): the coordinator opens the
    group in prepare_global_plan, every rank stages its write items as participant
    "rank<N>" in write_data, all ranks at once (each through a Store and log of its own), and
    the coordinator's finish() stages DCP's metadata (participant "metadata") and commits
    the group: ONE checkpoint holding every item, visible all at once or not at all. Items
    keep their buffer names from save to save, so each rank's part is a page diff against the
    previous save. dcp.save's checkpoint_id is recorded in its meta (without one, the save is
    just the stream's next checkpoint). The same writer may be used for many saves; the last
    checkpoint's CheckpointInfo is ``writer.last_info``.

    When a rank fails, DCP raises on every rank and never calls finish(): the save's group
    stays open (reserving a local store's stream) until this writer's next save or close(),
    the next dcp.save in the same thread, the group's deadline, or the end of the
    coordinator's process, whichever comes first; nothing of it is ever visible.

    Over an S3 store each rank stages through its own cache directory (its own machine or
    not): the ranks' chunks upload in parallel, the coordinator's commit is one conditional
    write of the stream's ref, and each rank's next part is a page diff against the page
    fingerprints it kept of its own last part (docs/design.md, "S3 stores").
    """

    def __init__(self, path, stream: str = "dcp", *, timeout: float = 600.0,
                 **open_options) -> None:
        timeout = validate_timeout(timeout)
        if not 0 < timeout < math.inf:
            raise InvalidArgumentError(f"SnapstoreWriter: timeout must be a finite number of "
                                       f"seconds > 0 (a save's deadline), got {timeout!r}")
        _StoreUser.__init__(self, path, stream, {"timeout": timeout, **open_options})
        self.timeout = timeout
        self.last_info: CheckpointInfo | None = None
        self.is_coordinator = True
        self._save: _Save | None = None

    def storage_meta(self) -> StorageMeta | None:
        cid = self.checkpoint_id
        return StorageMeta(checkpoint_id=None if cid is None else str(cid))

    def set_up_storage_writer(self, is_coordinator: bool, *args, **kwargs) -> None:
        if isinstance(self.checkpoint_id, int):
            # a save recorded under an int could never be loaded by it: dcp.load's int names
            # a snapstore checkpoint id (and dcp:ID names only str ids)
            raise InvalidArgumentTypeError(
                f"checkpoint_id {self.checkpoint_id!r} of a save must be a str (or a path), "
                "as DCP's own: an int given to dcp.load names a snapstore checkpoint id, so "
                f"this save could not be loaded by it; use e.g. \"step-{self.checkpoint_id}\"")
        if not kwargs.get("use_collectives", True) and _world_size() > 1:
            raise InvalidArgumentError("SnapstoreWriter needs use_collectives=True with more "
                                       "than one rank (one save is one atomic checkpoint)")
        _end_abandoned_saves()
        self._check_idle()
        _wait_for_saves_of(self, time.monotonic() + self.timeout)
        self.is_coordinator = bool(is_coordinator)
        self._begin()
        self._discard()
        self._save = _Save(self)

    def reset(self, checkpoint_id=None) -> None:
        self._check_idle()
        super().reset(checkpoint_id)

    def _check_idle(self) -> None:
        """SnapstoreError when a save through this writer still runs on another thread: DCP
        resets the writer for the next save (dcp.async_save: in the caller's thread), which
        dropped that save's group, and every save of the two failed."""
        save = self._save
        if save is not None and save.thread is not threading.current_thread() \
                and save.thread.is_alive():
            raise SnapstoreError(
                "SnapstoreWriter: a save through this writer is still running on another "
                "thread (a dcp.async_save whose future is pending): wait for its future before "
                "saving through the writer again, or give each async_save a SnapstoreWriter "
                "of its own (each then waits for the one before it)")

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Runs on the coordinator only, before any write_data: opens the save's group and
        tells each rank its group and participant name (None for a rank with nothing to
        write) through its plan's storage_data."""
        save = self._save if self._save is not None else self._new_save()
        names = [_RANK_PARTICIPANT.format(i) if p.items else None for i, p in enumerate(plans)]
        store = save.open()
        try:
            save.group = store.group(self.stream, [n for n in names if n] + [METADATA_PARTICIPANT],
                                     timeout=self.timeout)
        except BaseException:
            self._discard()
            raise
        return [dataclasses.replace(p, storage_data=_RankPlan(save.group.id, i, names[i]))
                for i, p in enumerate(plans)]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        save = self._save if self._save is not None else self._new_save()
        mine = plan.storage_data
        if not isinstance(mine, _RankPlan):
            if not self.is_coordinator:
                raise SnapstoreError("SnapstoreWriter.write_data: the plan names no group "
                                     "(prepare_global_plan did not run on the coordinator)")
            # DCP did not plan globally (a caller driving the writer by hand): one rank
            mine = self.prepare_global_plan([plan])[0].storage_data
        buffers: dict[str, memoryview] = {}
        keep: list = []                  # the objects the views point into, until staged
        locations = []
        try:
            for item in plan.items:
                data = planner.resolve_data(item)
                name = _item_name(item.index)
                if item.type == WriteItemType.BYTE_IO:
                    view = data.getbuffer() if isinstance(data, io.BytesIO) else memoryview(data)
                    keep.append(data)
                    sizes = None
                else:
                    view, tensor = _tensor_bytes(data, item.index.fqn)
                    keep.append(tensor)
                    sizes = tuple(int(n) for n in tensor.shape)
                if name in buffers:
                    raise SnapstoreError(f"DCP write items {item.index} and another both map "
                                         f"to buffer {name!r}")
                buffers[name] = view
                locations.append((item, name, sizes, view.nbytes))
            if mine.participant is not None:
                save.open().stage(mine.group, mine.participant, buffers,
                                  meta={"rank": mine.rank, "items": len(buffers)})
        except BaseException:
            self._discard()               # the save cannot commit: drop its group at once
            raise
        finally:
            for view in buffers.values():
                with contextlib.suppress(BufferError):
                    view.release()
        if not self.is_coordinator:
            self._discard()               # this rank's part is done
        results = [WriteResult(index=item.index, size_in_bytes=nbytes,
                               storage_data=_Location(None, name, sizes))
                   for item, name, sizes, nbytes in locations]
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """The coordinator's last step: stages DCP's metadata (with every item's location)
        and commits the group."""
        save = self._save
        if save is None or save.group is None:
            raise SnapstoreError("SnapstoreWriter.finish: no save in progress (finish runs "
                                 "once, after write_data, on the coordinator)")
        try:
            metadata.storage_data = {r.index: r.storage_data for rank in results for r in rank}
            blob = pickle.dumps(metadata, protocol=pickle.HIGHEST_PROTOCOL)
            meta = {DCP_META_KEY: {"version": DCP_VERSION, "checkpoint_id": self.checkpoint_id,
                                   "parts": [], "ranks": len(results)}}
            save.store.stage(save.group.id, METADATA_PARTICIPANT, {METADATA_BUFFER: blob})
            # DCP calls finish only after every rank's write_data returned, and stage()
            # registers a part before it returns: a part missing now never comes, so do not
            # wait for it (GroupTimeout names it at once, and the group is dropped).
            self.last_info = save.group.commit(meta, timeout=0)
            save.committed = True
        finally:
            self._discard()

    def close(self) -> None:
        """Ends this writer's unfinished save, if any (its group is dropped: nothing of it
        becomes visible), and closes the store if the writer opened it. Idempotent; the
        writer may still be used for more saves."""
        self._discard()

    def _new_save(self) -> _Save:
        self._save = _Save(self)
        return self._save

    def _discard(self) -> None:
        """Ends the save in progress, if any (see _Save.end)."""
        save, self._save = self._save, None
        if save is not None:
            save.end()


def _find_dcp_checkpoint(store: Store, stream: str, checkpoint_id: Any) -> CheckpointInfo:
    """The newest DCP checkpoint of the stream with that checkpoint_id (None: the newest; an
    int: that snapstore checkpoint id)."""
    def is_dcp(info: CheckpointInfo) -> bool:
        ours = layer_meta(info, DCP_META_KEY)
        return isinstance(ours, dict) and ours.get("version") == DCP_VERSION and \
            METADATA_BUFFER in info.sizes

    if isinstance(checkpoint_id, int):
        info = store.get(checkpoint_id)
        if not is_dcp(info):
            raise CheckpointNotFound(f"checkpoint {checkpoint_id} is not a DCP checkpoint")
        return info
    for info in reversed(store.checkpoints(stream)):
        if is_dcp(info) and (checkpoint_id is None
                             or info.reserved_meta[DCP_META_KEY].get("checkpoint_id")
                             == checkpoint_id):
            return info
    what = "any DCP checkpoint" if checkpoint_id is None else f"DCP checkpoint {checkpoint_id!r}"
    raise CheckpointNotFound(f"stream {stream!r} of store {store.path} has no {what}")


class SnapstoreReader(_StoreUser, StorageReader):
    """torch.distributed.checkpoint StorageReader from a snapstore store.

    Args:
        path: the store directory (opened read-only), an S3 store's URL ("s3://BUCKET/PREFIX"),
            or an open Store (used, not closed).
        stream: the stream of the DCP checkpoints (default "dcp").

    dcp.load's checkpoint_id selects the newest checkpoint saved with that id; without one the
    stream's newest DCP checkpoint is read. Tensors are restored straight into the tensors DCP
    plans when they are laid out alike (no copy in between); otherwise only the rows needed are
    read, then copied.
    """

    def __init__(self, path, stream: str = "dcp", **open_options) -> None:
        _StoreUser.__init__(self, path, stream, open_options)
        self.info: CheckpointInfo | None = None
        self.storage_data: dict = {}
        self._store: Store | None = None

    def close(self) -> None:
        store, self._store = self._store, None
        self._done(store)

    def _discard(self) -> None:
        self.close()

    def read_metadata(self) -> Metadata:
        self._begin()
        self.close()
        self._store = self._open(readonly=True)
        try:
            self.info = _find_dcp_checkpoint(self._store, self.stream, self.checkpoint_id)
            metadata = pickle.loads(self._store.read(self.info.id, METADATA_BUFFER))
        except BaseException:
            self.close()
            raise
        if not isinstance(metadata, Metadata):
            self.close()
            raise SnapstoreError(f"checkpoint {self.info.id}: {METADATA_BUFFER} is not DCP "
                                 "metadata")
        return metadata

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args,
                              **kwargs) -> None:
        self.storage_data = metadata.storage_data or {}
        self._dtypes = {fqn: getattr(getattr(md, "properties", None), "dtype", None)
                        for fqn, md in metadata.state_dict_metadata.items()}

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        try:
            if self._store is None:          # called out of DCP's order: reopen
                self._id_is_new = True
                self.read_metadata()
            self._read(plan, planner)
        finally:
            self.close()
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _read(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        store, main = self._store, self.info.id
        direct: dict[int, dict[str, memoryview]] = {}
        committed: list = []
        for item in plan.items:
            loc = self.storage_data.get(item.storage_index)
            if not isinstance(loc, _Location):
                raise CheckpointNotFound(f"checkpoint {main} has no data for {item.storage_index}")
            cid = main if loc.checkpoint is None else loc.checkpoint
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(store.read(cid, loc.buffer)))
                continue
            dtype = self._dtypes.get(item.storage_index.fqn)
            target = planner.resolve_tensor(item).detach()
            lengths = tuple(int(n) for n in item.lengths)
            if tuple(target.shape) != lengths:
                raise SnapstoreError(f"{item.storage_index}: DCP planned a tensor of shape "
                                     f"{tuple(target.shape)} for {lengths}")
            whole = lengths == tuple(loc.sizes) and not any(item.storage_offsets)
            views = direct.setdefault(cid, {})
            if whole and target.dtype == dtype and target.device.type == "cpu" \
                    and target.is_contiguous() and not target.is_conj() \
                    and not target.is_neg() and loc.buffer not in views:
                views[loc.buffer] = address_view(target.data_ptr(),
                                                 target.numel() * target.element_size())
                committed.append((item, target))
            else:
                source = _read_box(store, cid, loc, dtype, item.storage_offsets, lengths)
                target.copy_(source)
                planner.commit_tensor(item, target)
        for cid, views in direct.items():
            # straight into DCP's tensors; tied ones (one storage) batch after batch
            for batch in disjoint_batches(views) if views else ():
                store.restore_into(cid, batch)
        for item, target in committed:
            planner.commit_tensor(item, target)


def _read_box(store: Store, cid: int, loc: _Location, dtype, offsets, lengths) -> torch.Tensor:
    """The box [offsets, offsets + lengths) of a stored chunk: reads only the dim-0 rows it
    spans."""
    sizes = tuple(loc.sizes)
    if dtype is None:
        raise SnapstoreError(f"no dtype for {loc.buffer} in the DCP metadata")
    item = torch.empty((), dtype=dtype).element_size()
    if any(n == 0 for n in lengths) or any(n == 0 for n in sizes):
        return torch.empty(lengths, dtype=dtype)
    if not sizes:
        data = store.read(cid, loc.buffer)
        return _from_bytes(data, dtype).reshape(())
    row = item
    for n in sizes[1:]:
        row *= n
    first, count = int(offsets[0]), int(lengths[0])
    data = store.read(cid, loc.buffer, first * row, count * row)
    t = _from_bytes(data, dtype).reshape((count,) + sizes[1:])
    for dim in range(1, len(sizes)):
        t = t.narrow(dim, int(offsets[dim]), int(lengths[dim]))
    return t


def _from_bytes(data: bytes, dtype) -> torch.Tensor:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # read-only bytes: we only read them
        return torch.frombuffer(data, dtype=torch.uint8).view(dtype)
