"""Upgrading a store written by an older format, when a writer opens it (docs/design.md,
"Store directory").

STEPS is an ordered list. Each step converts one part of the store to the format that
introduced it, and each is
  * idempotent: it finds out from the store itself whether its work is done (never from the
    FORMAT file) and then does nothing, so every writer open can run every step;
  * crash-safe: it commits atomically (one LMDB transaction, a rename), or its partial work is
    harmless and redone by the next run;
  * readable half-way: after it, readers of the old and the new library version still read
    the store (a reader copes with a store whose FORMAT file is older than its parts).
After the last step the index is forced to disk and only then the FORMAT file is published
with this library's version (temp file, fsync, rename, directory fsync). So a crash at any
point leaves a store whose FORMAT still names the old version, which opens, and whose next
writer open runs the steps again. A new format version appends its step(s) to STEPS.

Crash points (crashpoints.py): upgrade_before_index_commit (inside the index step's
transaction), upgrade_before_format (everything converted and synced, FORMAT not yet
published), upgrade_after_format.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from snapstore.engine import format as fmt
from snapstore.engine import storedir
from snapstore.engine.crashpoints import crashpoint
from snapstore.engine.index import Index


@dataclass(frozen=True)
class Step:
    version: int                           # the format version that introduced the change
    what: str
    run: Callable[[str, Index], bool]      # (store path, open index) -> did it change anything


def _index_value_checksums(path: str, index: Index) -> bool:
    return index.add_value_checksums()


STEPS: tuple[Step, ...] = (
    Step(2, "every index value carries a checksum", _index_value_checksums),
)


def upgrade(path: str, index: Index) -> int:
    """Brings the store at `path` (its writer's lock held, `index` open for writing) to
    fmt.FORMAT_VERSION. Returns the version the FORMAT file named before."""
    found = storedir.read_format_file(path)
    changed = False
    for step in STEPS:
        changed |= step.run(path, index)
    if changed:
        index.sync()                        # the converted index is durable before FORMAT says so
    if found["version"] >= fmt.FORMAT_VERSION:
        return found["version"]
    crashpoint("upgrade_before_format")
    created = found.get("created")
    storedir.write_format_file(path, created if isinstance(created, (int, float)) else None)
    crashpoint("upgrade_after_format")
    return found["version"]
