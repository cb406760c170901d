"""`snapstore copy SRC DST [NAME...]` and `snapstore import FILE [STORE]`: checkpoints into
another store, sending only the chunks it lacks (snapstore.copy_checkpoints), and savepoint
files (written by `snapstore export ... -o FILE.snap`) committed into a store
(snapstore.import_savepoint). Both open the destination as a writer, alongside any other
writers; copy opens the source read-only."""
from __future__ import annotations

import argparse
import os
import textwrap

from snapstore.cli.args import LATE_POSITIONAL, NAME_HELP, command_options, id_arg, seconds_arg
from snapstore.cli.common import (EXIT_OK, STORE_ENV, UsageError, is_store_dir,
                                  remote_options, same_path, shown_location, store_path)
from snapstore.cli.output import print_json
from snapstore.copying import copy_checkpoints
from snapstore.formatting import human_bytes, printable
from snapstore.savepoints import import_savepoint
from snapstore.store import open as open_snapstore

_SHOWN = 20         # lines of the id mapping printed (--json lists all)


def add_copy(add) -> None:
    p = add("copy", "copy checkpoints into another store, sending only the chunks it lacks",
            cmd_copy, parents=(command_options(with_store=False),),
            description=textwrap.fill(
                "Copies checkpoints of store SRC into store DST (which must exist: snapstore "
                "init DST), as `restic copy` does: for each checkpoint, in ascending id order, "
                "only the chunks DST does not hold are read from SRC (checked) and written to "
                "DST. Each copy is stored full (restorable on its own) as the next checkpoint "
                "of its stream in DST, with its meta, tags and creation time; its id is DST's "
                "own (the mapping is printed). A checkpoint DST already holds (same stream, "
                "creation time, meta and manifests: copied before, or the original) is "
                "skipped, so running the same copy again copies nothing; a DST checkpoint "
                "stands for one SRC checkpoint only, in each stream's order (a checkpoint SRC "
                "holds twice, say a rollback by import, is copied twice). Each checkpoint is "
                "its own commit: after a failure the ones copied stay, and a rerun finishes "
                "the rest.", 79)
            + "\n\nexamples:\n  snapstore copy ckpts backup                  # everything"
            "\n  snapstore copy ckpts backup train@3 best      # these two")
    p.add_argument("src", metavar="SRC", help="the store to copy from (read-only)")
    p.add_argument("dst", metavar="DST", help="the store to copy into (a writer)")
    p.add_argument("names", type=id_arg, nargs="*", metavar="NAME",
                   help=f"{NAME_HELP} (of SRC); default: every checkpoint")
    # (no default here: one given before the command, as the global --timeout, stays)
    p.add_argument("--timeout", dest="timeout", type=seconds_arg, default=argparse.SUPPRESS,
                   metavar="SECONDS", help="wait this long for DST's lock when an operation "
                   "that needs DST to itself holds it (default 0: fail at once); may come "
                   "before the command")


def add_import(add) -> None:
    p = add("import", "commit a savepoint file (.snap) as a new checkpoint of a store",
            cmd_import, parents=(command_options(),),
            description=textwrap.fill(
                "Checks the whole savepoint FILE (written by `snapstore export STORE NAME -o "
                "FILE.snap`) and commits its checkpoint as the next checkpoint of its stream "
                "(or --stream) in STORE, stored full, writing only the chunks STORE lacks; it "
                "keeps its meta, tags and creation time and gets STORE's own id. A damaged "
                "file (truncated, a flipped bit, a chunk whose BLAKE3 does not match) is "
                "refused naming the offset, and nothing is imported (exit 1); a file that is "
                "not a savepoint, or of a newer version, exit 2. Importing a file twice makes "
                "two checkpoints.", 79)
            + f"\n\nSTORE may be left out when -s/--store or ${STORE_ENV} names it."
            "\n\nexample:\n  snapstore import train-12.snap other-store --stream restored")
    p.add_argument("file", metavar="FILE", help="the savepoint file")
    p.add_argument("store_pos", nargs="?", metavar="STORE",
                   help="the store to import into (default: -s/--store or "
                        f"${STORE_ENV})")
    p.set_defaults(**{LATE_POSITIONAL: "store_pos"})
    p.add_argument("--stream", metavar="NAME",
                   help="the stream to add it to (default: the one it was exported from)")


def _existing(path: str, what: str) -> str:
    """path, when it holds a store (an S3 URL is for the open to judge: it raises a clear
    error when nothing is there); else UsageError."""
    if not is_store_dir(path):
        hint = "" if what == "SRC" else f"; create one with `snapstore init {path}`"
        raise UsageError(f"no snapstore store at {path} ({what}{hint})")
    return path


def cmd_copy(args) -> int:
    src_path = _existing(args.src, "SRC")
    dst_path = _existing(args.dst, "DST")
    with open_snapstore(src_path, create=False, readonly=True, **remote_options(args)) as src, \
            open_snapstore(dst_path, create=False, timeout=args.timeout,
                           **remote_options(args)) as dst:
        names = args.names or None
        result = copy_checkpoints(src, dst, names)
        streams = {d: dst.get(d).stream for d in
                   list(result.copied.values()) + list(result.skipped.values())}
    if args.json:
        doc = result.to_json()
        doc.update(src=shown_location(src_path), dst=shown_location(dst_path))
        print_json(doc)
        return EXIT_OK
    print(f"copied {len(result.copied)} checkpoint(s) from {printable(src_path)} to "
          f"{printable(dst_path)}" + (f", skipped {len(result.skipped)} already there"
                                     if result.skipped else "")
          + f": {result.chunks_sent} chunk(s) sent ({human_bytes(result.bytes_sent)}), "
          f"{human_bytes(result.bytes_written)} written")
    lines = [f"  {s} -> {d}  {printable(streams[d])}" for s, d in result.copied.items()] + \
        [f"  {s} = {d}  {printable(streams[d])} (already there)"
         for s, d in result.skipped.items()]
    for line in lines[:_SHOWN]:
        print(line)
    if len(lines) > _SHOWN:
        print(f"  ... and {len(lines) - _SHOWN} more (--json lists all)")
    return EXIT_OK


def cmd_import(args) -> int:
    store_arg = args.store_pos
    if store_arg and args.store and not same_path(store_arg, args.store):
        raise UsageError(f"two different stores given: -s {args.store} and {store_arg} "
                         "(give one)")
    args.store = store_arg or args.store
    if is_store_dir(args.file) and not is_store_dir(args.store or os.environ.get(STORE_ENV)):
        raise UsageError(f"{args.file} is a store, not a savepoint file: the file comes first "
                         "(snapstore import FILE STORE)")
    if not args.store and not os.environ.get(STORE_ENV):
        raise UsageError(f"no store given: snapstore import FILE STORE, or use -s/--store "
                         f"PATH or set ${STORE_ENV}")
    path = _existing(store_path(args), "STORE")
    with open_snapstore(path, create=False, timeout=args.timeout,
                        **remote_options(args)) as store:
        info = import_savepoint(store, args.file, stream=args.stream)
    if args.json:
        print_json({"id": info.id, "stream": info.stream, "seq": info.seq,
                    "created": info.created, "bytes_new": info.bytes_new,
                    "file": os.path.abspath(args.file), "store": shown_location(path)})
        return EXIT_OK
    print(f"imported {printable(args.file)} as checkpoint {info.id} "
          f"({printable(info.stream)}@{info.seq}) of {printable(path)}: "
          f"{human_bytes(info.bytes_new)} written")
    return EXIT_OK
