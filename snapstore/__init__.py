"""snapstore: a C-accelerated, incremental snapshot storage engine for in-memory state.

    store = snapstore.open("ckpts")
    info = store.checkpoint({"weights": w}, stream="train", meta={"step": 10})
    store.restore_into(info.id, {"weights": w})

API convention: a module-level function takes the store first, as if it were a Store method
(f(store, data, stream, meta=...) / f(store, name, ...)). Every exception snapstore raises is
in snapstore.errors; the common ones are exported here too.
"""
from snapstore import errors
from snapstore.errors import (AmbiguousCheckpointName, CheckpointNotFound, CommitConflict,
                              CorruptionError, ForkedStoreError, FormatError, GroupError,
                              GroupTimeout,
                              InvalidArgumentError, InvalidArgumentTypeError,
                              NotAnObjectCheckpointError, ReadOnlyError, RemoteError,
                              SnapstoreError,
                              StoreClosedError, StoreIOError, StoreLocked,
                              StructureMismatchError)
from snapstore.store import CheckpointInfo, Group, Store, group_parts, open, repair
from snapstore.arrays import load_arrays, save_arrays
from snapstore.exporter import export
from snapstore.copying import copy_checkpoints
from snapstore.savepoints import export_savepoint, import_savepoint

from snapstore.version import __version__
__all__ = ["open", "repair", "Store", "CheckpointInfo", "Group", "group_parts", "errors",
           "SnapstoreError", "CommitConflict", "GroupError", "GroupTimeout",
           "CheckpointNotFound", "CorruptionError", "ForkedStoreError", "FormatError",
           "InvalidArgumentError", "InvalidArgumentTypeError", "NotAnObjectCheckpointError",
           "ReadOnlyError", "RemoteError", "StoreClosedError", "StoreIOError", "StoreLocked",
           "StructureMismatchError", "AmbiguousCheckpointName", "__version__", "save_arrays",
           "load_arrays", "export", "copy_checkpoints", "export_savepoint",
           "import_savepoint"]
