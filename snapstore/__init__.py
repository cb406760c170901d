"""snapstore: a C-accelerated, incremental snapshot storage engine for in-memory state.

    store = snapstore.open("ckpts")
    info = store.checkpoint({"weights": w}, stream="train", meta={"step": 10})
    store.restore_into(info.id, {"weights": w})
"""
from snapstore import errors
from snapstore.errors import (CheckpointNotFound, CorruptionError, ForkedStoreError, FormatError,
                              SnapstoreError, StoreLocked)
from snapstore.store import CheckpointInfo, Store, open, repair
from snapstore.arrays import load_arrays, save_arrays
from snapstore.exporter import export

from snapstore.version import __version__
__all__ = ["open", "repair", "Store", "CheckpointInfo", "errors", "SnapstoreError",
           "CheckpointNotFound", "CorruptionError", "ForkedStoreError", "FormatError",
           "StoreLocked", "__version__", "save_arrays",
           "load_arrays", "export"]
