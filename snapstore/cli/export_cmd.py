"""`snapstore export ID -o FILE [--format safetensors|pt|npz]`: the tensors of a torch, object,
array or DCP checkpoint as one file other tools read (snapstore.export)."""
from __future__ import annotations

import os

from snapstore.cli.args import id_arg
from snapstore.cli.common import EXIT_OK, open_store, resolve
from snapstore.cli.output import print_json
from snapstore.exporter import FORMATS, export
from snapstore.formatting import human_bytes, printable

_SHOWN_SKIPPED = 10


def add_export(add) -> None:
    p = add("export", "write a checkpoint's tensors as a safetensors, pt or npz file",
            cmd_export,
            description="Writes every tensor/array of a checkpoint written by "
            "snapstore.torch.save, Store.save, save_arrays or DCP into one file, flat, under "
            "DCP-style names (model.0.weight, optim.state.0.exp_avg), byte-exact. "
            "safetensors also keeps plain values (step, hyperparameters) as JSON in its "
            "metadata; pt is a {name: tensor} dict for torch.load(weights_only=True) (needs "
            "torch); npz is for numpy.load and refuses bfloat16/float8 (NumPy has no such "
            "dtype). The file is written atomically and never replaces an existing one "
            "without --force.")
    p.add_argument("id", type=id_arg, help="checkpoint id")
    p.add_argument("-o", "--out", required=True, metavar="FILE",
                   help="output file (.safetensors, .pt/.pth or .npz: the format, unless "
                   "--format says)")
    p.add_argument("--format", choices=FORMATS, help="file format (default: from FILE's suffix)")
    p.add_argument("-f", "--force", action="store_true", help="replace an existing file")


def cmd_export(args) -> int:
    with open_store(args) as store:
        result = export(store, resolve(store, args.id), args.out, args.format, force=args.force)
    if args.json:
        d = result.to_json()
        d["path"] = os.path.abspath(result.path)
        print_json(d)
        return EXIT_OK
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
