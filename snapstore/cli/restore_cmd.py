"""`snapstore restore ID --out DIR|-`: writes a checkpoint's buffers (or a byte range of them)
to one file per buffer, or one buffer to stdout, streaming in bounded windows."""
from __future__ import annotations

import os
import sys

from snapstore import errors
from snapstore.cli.args import NAME_HELP, id_arg, range_arg
from snapstore.cli.common import EXIT_OK, PROG, UsageError, open_store, progress, resolve
from snapstore.cli.output import print_json, safe_filenames
from snapstore.engine.fsutil import replace_file, write_all
from snapstore.formatting import human_bytes, printable
from snapstore.tensors import checkpoint_kind

WINDOW = 8 << 20           # bytes read from the store and written out at a time


def add_restore(add) -> None:
    p = add("restore", "write a checkpoint's buffers to files", cmd_restore,
            description="Writes one file per buffer into --out DIR (file name = buffer name "
            "made safe for the file system; the mapping is printed), streaming in bounded "
            "windows. --out - writes one buffer's bytes to stdout. For a checkpoint of "
            "tensors (snapstore.torch.save, Store.save, save_arrays, DCP) these are its raw "
            "buffers (pickle, oob/N...): `snapstore export ID -o FILE.safetensors|.pt|.npz` "
            "writes its tensors by name as a file other tools read.")
    p.add_argument("id", type=id_arg, metavar="NAME", help=NAME_HELP)
    p.add_argument("-o", "--out", required=True, metavar="DIR",
                   help="output directory (created if missing), or - for stdout")
    p.add_argument("--buffer", action="append", default=[], help="only this buffer (repeat)")
    p.add_argument("--range", type=range_arg, metavar="OFF:LEN",
                   help="only these bytes of each selected buffer (OFF: = to the end)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite existing files")


def cmd_restore(args) -> int:
    to_stdout = args.out == "-"
    if to_stdout and args.json:
        raise UsageError("--out - writes raw bytes to stdout; it cannot be combined with --json")
    with open_store(args) as store:
        info = store.get(resolve(store, args.id))
        names = list(info.sizes)
        if args.buffer:
            for n in args.buffer:
                if n not in info.sizes:
                    raise errors.CheckpointNotFound(
                        f"checkpoint {info.id} has no buffer {n!r} (it has {sorted(names)})")
            names = list(dict.fromkeys(args.buffer))
        if to_stdout and len(names) != 1:
            raise UsageError(f"--out - needs exactly one buffer (use --buffer NAME; "
                             f"checkpoint {info.id} has {len(names)})")
        spans = {}
        for n in names:
            size = info.sizes[n]
            off, given = args.range if args.range else (0, None)
            length = size - off if given is None else given
            if off > size or off + length > size or length < 0:
                raise UsageError(f"range {off}:{'' if given is None else given} exceeds "
                                 f"buffer {n!r} of {size} bytes")
            spans[n] = (off, length)
        files = safe_filenames(names)
        if not to_stdout:
            for n in names:
                if store.holds_path(os.path.join(args.out, files[n])):
                    raise UsageError(f"--out {args.out} is inside the store's own directory: "
                                     "restoring there could overwrite the store's files; "
                                     "name another directory")
            if not args.out or (os.path.lexists(args.out) and not os.path.isdir(args.out)):
                raise UsageError(f"--out {args.out!r} must name a directory (it is "
                                 + ("empty" if not args.out else "a file") + ")")
            os.makedirs(args.out, exist_ok=True)
            for n in names:             # every file checked before any is written
                path = os.path.join(args.out, files[n])
                if not os.path.lexists(path):
                    continue
                if not args.force:
                    raise _exists(path)
                if os.path.isdir(path) and not os.path.islink(path):
                    raise UsageError(f"{path} is a directory: --force replaces files only")
        total = sum(length for _, length in spans.values())
        written = []
        with progress(args, total, "restore") as bar:
            for n in names:
                off, length = spans[n]
                if to_stdout:
                    sink = sys.stdout.buffer
                    _copy_out(store, info.id, n, off, length, sink, bar)
                    sink.flush()
                    continue
                path = os.path.join(args.out, files[n])
                # A new 0600 file (checkpoints hold private state) replacing path by rename:
                # never written through a symlink planted in the output directory.
                # Without --force a file created at path meanwhile is kept, never replaced.
                replace_file(path, lambda f: _copy_out(store, info.id, n, off, length, f, bar),
                             refuse_existing=None if args.force else _exists)
                written.append({"buffer": n, "path": path, "offset": off, "bytes": length})
    if to_stdout:
        return EXIT_OK
    if args.json:
        print_json({"checkpoint": info.id, "out": os.path.abspath(args.out), "files": written})
        return EXIT_OK
    print(f"restored checkpoint {info.id} into {args.out}")
    if checkpoint_kind(info) != "other":
        print(f"  (raw buffers; `{PROG} export {info.id} -o FILE.safetensors` writes its "
              "tensors by name)")
    for w in written:
        where = f" [{w['offset']}:{w['bytes']}]" if args.range else ""
        print(f"  {printable(w['buffer'])}{where} -> {printable(w['path'])} "
              f"({human_bytes(w['bytes'])})")
    return EXIT_OK


def _exists(path: str) -> UsageError:
    return UsageError(f"{path} exists (use --force to overwrite)")


def _copy_out(store, cid: int, name: str, off: int, length: int, sink, bar) -> None:
    end = off + length
    while off < end:
        n = min(WINDOW, end - off)
        # a raw sink (stdout under python -u) may write less than asked: all of it, or raise
        write_all(sink, store.read(cid, name, off, n), "the output")
        off += n
        bar.update(n)

