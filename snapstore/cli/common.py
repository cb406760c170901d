"""What every command shares: exit codes, the two error kinds of the command line, and opening
the store, resolving checkpoint references and drawing progress as the global options say."""
from __future__ import annotations

import os
from typing import Callable, Optional

from snapstore.cli.progress import Progress, spinner
from snapstore.store import open as open_snapstore

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

PROG = "snapstore"
STORE_ENV = "SNAPSTORE_STORE"


class UsageError(Exception):
    """The command line asks for something that cannot be done as asked (exit 2)."""


class Problem(Exception):
    """The command ran and found or hit a problem (exit 1)."""


def store_path(args) -> str:
    """The store directory: --store, else $SNAPSTORE_STORE (UsageError if neither is set)."""
    path = getattr(args, "store", None) or os.environ.get(STORE_ENV)
    if not path:
        raise UsageError(f"no store given: use -s/--store PATH or set ${STORE_ENV}")
    return path


def open_store(args, *, write: bool = False):
    """Opens the existing store of `args`: read-only (never takes the writer's lock), or as
    the writer when `write`, waiting up to --timeout for the lock."""
    path = store_path(args)
    if not os.path.isdir(path):
        raise UsageError(f"no snapstore store at {path}")
    if write:
        return open_snapstore(path, create=False, timeout=args.timeout)
    return open_snapstore(path, create=False, readonly=True)


def need(store, method: str) -> Callable:
    """store.<method>, or Problem when this snapstore version does not have it."""
    fn = getattr(store, method, None)
    if fn is None:
        raise Problem(f"this snapstore version cannot {method} (Store.{method} is missing)")
    return fn


def resolve(store, ref) -> int:
    """The checkpoint id an id_arg value names, by Store.resolve (an id, latest,
    latest:STREAM, STREAM@SEQ, a tag, a stream name, a DCP checkpoint_id). CheckpointNotFound
    if none, AmbiguousCheckpointName (listing them) if several."""
    return store.resolve(ref).id


def progress(args, total: Optional[float] = None, label: str = "", unit: str = "B") -> Progress:
    """A progress bar on stderr, unless --no-progress (or stderr is not a terminal)."""
    return Progress(total, label, unit=unit, enabled=False if args.no_progress else None)


def spinner_for(args, label: str) -> Progress:
    """A spinner on stderr for one long call, unless --no-progress (or not a terminal)."""
    return spinner(label, enabled=False if args.no_progress else None)
