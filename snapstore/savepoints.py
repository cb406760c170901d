"""Savepoints: one checkpoint in one self-contained, portable file (a ".snap" file, like a
Flink savepoint), to move a checkpoint to another store, another machine, or an archive.

    snapstore.export_savepoint(store, "train@12", "train-12.snap")   # or snapstore.export()
    info = snapstore.import_savepoint(other_store, "train-12.snap")   # a new checkpoint
    info = snapstore.import_savepoint(other_store, "train-12.snap", stream="restored")

The file (format: docs/design.md, "Savepoint files"; engine/savefile.py) holds the
checkpoint's stream, meta (reserved keys included), tags, creation time and where it came
from, each buffer's full manifest (a delta chain's layers written over each other), every
chunk those name once, as the chunk records of segments (compressed per the exporting
store's options), and checksums: of its header, of its description, of every record (plus
each chunk's BLAKE3 against its id), and of the whole file. It is written to a temporary file
next to the path, fsynced and renamed into place; an existing file is replaced only with
force=True.

Importing checks the whole file before anything is written (CorruptionError naming the file
and the offset of the damage, FormatError for what is not a savepoint or is of a newer
version) and then commits it as the next checkpoint of its stream (or `stream`) in the
store, stored full, writing only the chunks the store lacks. The imported checkpoint keeps
meta, tags and creation time, gets the store's own id, and its reserved meta
"snapstore.copied_from" names where it came from ({"store", "id", "file"}). Importing a file
twice makes two checkpoints (unlike copy_checkpoints, which skips what is there).

Only the public Store API is used (Store.with_manifests, import_checkpoint).
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Any

from snapstore.copying import store_location
from snapstore.engine import format as fmt
from snapstore.engine.meta import original_meta, with_origin
from snapstore.engine.fsutil import file_kind
from snapstore.engine.savefile import Description, read_savepoint, write_savepoint
from snapstore.engine.validation import validate_flag, validate_name, validate_path
from snapstore.errors import (ExportError, InvalidArgumentError, InvalidArgumentTypeError,
                              ReadOnlyError, StoreClosedError)
from snapstore.store import BufferManifest, CheckpointInfo, Store

__all__ = ["export_savepoint", "import_savepoint", "SavepointResult", "SUFFIX"]

SUFFIX = fmt.SAVEPOINT_SUFFIX


@dataclass
class SavepointResult:
    """What export_savepoint() wrote: path, checkpoint id, the file's bytes, its chunk
    records and their raw bytes."""
    path: str
    checkpoint: int
    bytes: int
    chunks: int
    chunk_bytes: int

    def to_json(self) -> dict:
        return {"path": self.path, "format": "snap", "checkpoint": self.checkpoint,
                "bytes": self.bytes, "chunks": self.chunks, "chunk_bytes": self.chunk_bytes}


def _check_store(store: Any, write: bool) -> None:
    if not isinstance(store, Store):
        raise InvalidArgumentTypeError(f"store must be an open Store, got "
                                       f"{type(store).__name__}")
    if store.closed:
        raise StoreClosedError(f"store {store.path} is closed")
    if write and store.readonly:
        raise ReadOnlyError(f"store {store.path} was opened read-only: open it as a writer "
                            "to import into it")


def check_output(store: Store, path: Any) -> str:
    """An export's output file path (a str, bytes or os.PathLike without NUL), checked: not
    in the store's own directory (writing there, and with force replacing a segment, the index
    or FORMAT, would damage the store). Raises InvalidArgumentTypeError,
    InvalidArgumentError, ExportError. The store must be an open Store."""
    _check_store(store, write=False)
    path = validate_path(path)
    if store.holds_path(path):
        raise ExportError(f"{path} is inside the store's own directory: exporting there could "
                          "overwrite the store's files; write it somewhere else")
    return path


def export_savepoint(store: Store, checkpoint: Any, path, *,
                     force: bool = False) -> SavepointResult:
    """Writes one checkpoint of store (named as Store.resolve takes it) as a savepoint file at
    path (see the module doc). The store may be read-only.

    Returns: SavepointResult.
    The manifests and the chunks are read from one index snapshot (Store.with_manifests):
    a compaction in another process or thread (trimming or collecting chunks, moving them
    to other segments) never makes the file wrong or the store look damaged; the export
    starts again on a new snapshot when one moved the chunks while they were read.

    Raises: CheckpointNotFound / AmbiguousCheckpointName (also when another writer deleted
        the checkpoint while it was exported), ExportError (an InvalidArgumentError: path
        exists and not force), CorruptionError (damage in the store), StoreClosedError,
        ConcurrentCompactionError (compactions moved its chunks READ_ATTEMPTS times in a
        row: retry), InvalidArgumentError (path is a directory, a device, a FIFO or a socket),
        StoreIOError (writing the file; nothing is left of it)."""
    path = check_output(store, path)
    force = validate_flag(force, "force")
    if not force and os.path.lexists(path):
        raise output_exists(path)

    def write(m, read_chunks) -> SavepointResult:
        description = Description(
            m.info.stream, m.info.created, original_meta(m.meta), list(m.info.tags),
            {"store": store_location(store), "id": m.info.id, "seq": m.info.seq},
            [(b.name, b.size, b.layout, b.page_size, list(b.extents)) for b in m.buffers])
        # without force a file created at path meanwhile is kept, never replaced
        stats = write_savepoint(path, description, read_chunks, store.options,
                                None if force else output_exists)
        return SavepointResult(path, m.info.id, stats["bytes"], stats["chunks"],
                               stats["chunk_bytes"])
    # manifests and chunks from one index snapshot, made again when a compaction moves the
    # chunks meanwhile (write_savepoint leaves no file when it fails)
    return store.with_manifests(checkpoint, write)


def output_exists(path: str) -> ExportError:
    """The error of an output file that exists and may not be replaced (export() too)."""
    if os.path.isdir(path) and not os.path.islink(path):     # force would not help
        return ExportError(f"{path} is a directory: an export writes a file, and never "
                           "replaces a directory (name a file)")
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = stat.S_IFREG
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):      # force would not help either
        return ExportError(f"{path} is {file_kind(mode)}: an export writes a regular file, "
                           "and never replaces anything else (name a file)")
    return ExportError(f"{path} exists (pass force=True, --force on the command line, to "
                       "replace it)")


def import_savepoint(store: Store, path, *, stream: str | None = None) -> CheckpointInfo:
    """Commits the checkpoint of the savepoint file at path as the next checkpoint of its
    stream (or of `stream`) in store, after checking the whole file (see the module doc).

    Returns: the new checkpoint's CheckpointInfo (kind "full").
    Raises: CorruptionError (the file is damaged: names it and the offset; nothing is
        imported), FormatError (not a savepoint file, or of a newer version),
        InvalidArgumentError (no such file, a bad stream name), ReadOnlyError,
        StoreClosedError, CommitConflict (another writer committed to the stream at that
        moment), StoreIOError."""
    _check_store(store, write=True)
    path = validate_path(path)
    if stream is not None:
        validate_name(stream, "stream")
    with read_savepoint(path) as sp:
        d = sp.description
        buffers = [BufferManifest(name, size, tuple(extents), layout, page_size)
                   for name, size, layout, page_size, extents in d.buffers]
        origin = {"store": d.source.get("store"), "id": d.source.get("id"),
                  "file": os.path.abspath(path)}
        return store.import_checkpoint(stream or d.stream, buffers, sp.read_chunks,
                                       with_origin(d.meta, origin), created=d.created,
                                       tags=d.tags)
