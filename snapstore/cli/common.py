"""What every command shares: exit codes, the two error kinds of the command line, and opening
the store, resolving checkpoint references and drawing progress as the global options say."""
from __future__ import annotations

import os
import stat
from typing import Callable, Optional

from snapstore.cli.progress import Progress, spinner
from snapstore.engine import format as fmt
from snapstore.remote.layout import is_remote
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
    """The store directory: the STORE argument or -s/--store (args.store, see
    args.parse_command_line), else $SNAPSTORE_STORE (UsageError if none is given)."""
    path = getattr(args, "store", None) or os.environ.get(STORE_ENV)
    if not path:
        raise UsageError(f"no store given: name it first (snapstore COMMAND STORE ...), or "
                         f"use -s/--store PATH or set ${STORE_ENV}")
    return path


def is_store_dir(path) -> bool:
    """True when path is a directory holding a snapstore store (its FORMAT file), or an S3
    store's URL (s3://BUCKET/PREFIX: whether it holds a store is for open() to find out)."""
    if is_remote(path):
        return True
    if not isinstance(path, str) or not path:
        return False
    try:
        return stat.S_ISREG(os.stat(os.path.join(path, fmt.FORMAT_FILE)).st_mode)
    except PermissionError:
        # a store this user may not look into: the open says so ("Permission denied"), as
        # for every other command, instead of "no store here"
        return True
    except OSError:
        return False


def same_path(a: str, b: str) -> bool:
    """True when a and b name the same store: the same file system location (after
    symlinks, '..', '/'), or the same S3 URL."""
    if is_remote(a) or is_remote(b):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.realpath(a) == os.path.realpath(b)


def shown_location(path: str) -> str:
    """A store's location as --json output gives it: the absolute path of a directory, an S3
    store's URL as given."""
    return path if is_remote(path) else os.path.abspath(path)


def remote_options(args) -> dict:
    """open()'s options from the command line's --remote-timeout (none when not given)."""
    seconds = getattr(args, "remote_timeout", None)
    return {} if seconds is None else {"remote_timeout": seconds}


def open_store(args, *, write: bool = False):
    """Opens the existing store of `args` (a directory, or an S3 store's s3:// URL, cached
    in the default cache directory): read-only, or as a writer when `write` (alongside
    any other writers). --timeout is the store's: how long a writer's open waits for an
    exclusive holder (a repair, a format upgrade...), and compact/verify for a running
    compaction."""
    path = store_path(args)
    if not is_remote(path) and not os.path.isdir(path):
        hint = ""
        if getattr(args, "store_source", None) == "argument" and not os.environ.get(STORE_ENV):
            hint = (" (the first argument names the store when neither -s nor "
                    f"${STORE_ENV} does)")
        raise UsageError(f"no snapstore store at {path}{hint}")
    if write:
        return open_snapstore(path, create=False, timeout=args.timeout,
                              **remote_options(args))
    return open_snapstore(path, create=False, readonly=True,
                          timeout=getattr(args, "timeout", 0.0), **remote_options(args))


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
