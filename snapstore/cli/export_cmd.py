"""`snapstore export ID -o FILE [--format safetensors|pt|npz|snap]`: the tensors of a torch,
object, array or DCP checkpoint as one file other tools read (snapstore.export), or any
checkpoint as a savepoint file (.snap: snapstore.export_savepoint) that `snapstore import`
reads into any store."""
from __future__ import annotations

import os

from snapstore.cli.args import NAME_HELP, id_arg
from snapstore.cli.common import EXIT_OK, open_store, resolve
from snapstore.cli.output import print_json
from snapstore.exporter import FORMATS, export, format_for_path
from snapstore.savepoints import export_savepoint
from snapstore.formatting import human_bytes, printable

_SHOWN_SKIPPED = 10


def add_export(add) -> None:
    p = add("export", "write a checkpoint as a savepoint (.snap) or its tensors as a "
            "safetensors, pt or npz file", cmd_export,
            description="snap: writes the whole checkpoint (any kind) as one self-contained, "
            "portable savepoint file: its stream, meta, tags and creation time, each buffer's "
            "full manifest and every chunk it needs once, with checksums; `snapstore import "
            "FILE STORE` commits it into any store. "
            "safetensors, pt, npz: writes every tensor/array of a checkpoint written by "
            "snapstore.torch.save, Store.save, save_arrays or DCP into one file, flat, under "
            "DCP-style names (model.0.weight, optim.state.0.exp_avg), byte-exact. "
            "safetensors also keeps plain values (step, hyperparameters) as JSON in its "
            "metadata; pt is a {name: tensor} dict for torch.load(weights_only=True) (needs "
            "torch); npz is for numpy.load and refuses bfloat16/float8 (NumPy has no such "
            "dtype). The file is written to a temporary file, fsynced (snap) and renamed, and "
            "never replaces an existing one without --force.")
    p.add_argument("id", type=id_arg, metavar="NAME", help=NAME_HELP)
    p.add_argument("-o", "--out", required=True, metavar="FILE",
                   help="output file (.snap, .safetensors, .pt/.pth or .npz: the format, "
                   "unless --format says)")
    p.add_argument("--format", choices=FORMATS, help="file format (default: from FILE's suffix)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing file")


def cmd_export(args) -> int:
    if (args.format or format_for_path(args.out)) == "snap":
        return _export_savepoint(args)
    with open_store(args) as store:
        result = export(store, resolve(store, args.id), args.out, args.format, force=args.force)
    if args.json:
        return _print_json(result)
    print(f"exported checkpoint {result.checkpoint} to {printable(result.path)} "
          f"({result.format}): {result.tensors} tensor(s), {human_bytes(result.bytes)}")
    if result.values:
        print(f"  {len(result.values)} plain value(s) kept in the file's metadata "
              "(snapstore.values)")
    if result.skipped:
        print(f"  skipped {len(result.skipped)} part(s) that are not tensors:")
        for name, why in list(result.skipped.items())[:_SHOWN_SKIPPED]:
            print(f"    {printable(name)}: {printable(why)}")
        if len(result.skipped) > _SHOWN_SKIPPED:
            print(f"    ... and {len(result.skipped) - _SHOWN_SKIPPED} more (--json lists all)")
    return EXIT_OK


def _print_json(result) -> int:
    """The --json answer of both kinds of export: the result with its absolute path."""
    d = result.to_json()
    d["path"] = os.path.abspath(result.path)
    print_json(d)
    return EXIT_OK


def _export_savepoint(args) -> int:
    with open_store(args) as store:
        result = export_savepoint(store, resolve(store, args.id), args.out, force=args.force)
    if args.json:
        return _print_json(result)
    print(f"exported checkpoint {result.checkpoint} to {printable(result.path)} (savepoint): "
          f"{result.chunks} chunk(s), {human_bytes(result.chunk_bytes)} of chunks in "
          f"{human_bytes(result.bytes)}")
    return EXIT_OK
