"""`snapstore diff ID1 ID2`: prints which byte ranges of which buffers differ and, for tensor
checkpoints, which tensors changed by how much (the comparison itself is snapstore.diff)."""
from __future__ import annotations

import math

from snapstore import diff
from snapstore.cli.args import NAME_HELP, id_arg, nonneg_arg, size_arg, size_between
from snapstore.cli.common import EXIT_OK, open_store, progress, resolve
from snapstore.cli.output import print_json
from snapstore.engine.reader import retry_moved
from snapstore.formatting import human_bytes, printable, text_table


# --window bounds: a tiny window makes a read per few bytes (hours for a large buffer), a huge
# one holds two windows in memory.
MIN_WINDOW = 4 << 10
MAX_WINDOW = 1 << 30


def add_diff(add) -> None:
    p = add("diff", "which byte ranges of which buffers differ between two checkpoints",
            cmd_diff, description="Compares the contents of two checkpoints and reports, per "
            "buffer, the changed byte ranges (OFF:LEN, usable with `restore --range`) and how "
            "many bytes differ. Byte ranges both checkpoints store in the same chunks are "
            "equal without a read; the rest is restored in bounded windows (never whole "
            "buffers in memory) and compared in C. Buffers present on one side only are listed "
            "as added/removed. For checkpoints of tensors (torch, arrays, DCP) it also lists "
            "each tensor: changed elements of all, and the max abs difference.")
    p.add_argument("id1", type=id_arg, metavar="NAME1", help=f"the older {NAME_HELP}")
    p.add_argument("id2", type=id_arg, metavar="NAME2", help="the newer checkpoint (as NAME1)")
    p.add_argument("--buffer", action="append", default=[], help="only this buffer (repeat)")
    p.add_argument("--gap", type=size_arg, default=diff.GAP, metavar="BYTES",
                   help="report differing runs fewer than BYTES apart as one range "
                        "(default 16; 0: exact runs); changed bytes are always exact")
    p.add_argument("--max-ranges", type=nonneg_arg, default=20, metavar="N",
                   help="ranges printed per buffer in text output (default 20; 0: all; "
                        "--json always lists all)")
    p.add_argument("--window", type=size_between(MIN_WINDOW, MAX_WINDOW), default=diff.WINDOW,
                   metavar="SIZE", help="compare this many bytes at a time (default 8MiB; "
                                        "4KiB to 1GiB: memory is twice this)")
    p.add_argument("--max-tensors", type=nonneg_arg, default=50, metavar="N",
                   help="tensors listed in text output, changed ones first (default 50; "
                        "0: all; --json always lists all)")


def cmd_diff(args) -> int:
    with open_store(args) as store:
        a = store.get(resolve(store, args.id1))
        b = store.get(resolve(store, args.id2))
        names = diff.select_buffers(a, b, args.buffer)
        tensors = _catalogues(store, a, b)
        with progress(args, diff.bytes_to_compare(a, b, names), "diff") as bar:
            report = diff.diff_checkpoints(store, a, b, names, gap=args.gap,
                                           window=args.window, on_progress=bar.update,
                                           tensors=tensors)
    for t in report.get("tensors", ()):
        if isinstance(t.get("max_abs_diff"), float) and not math.isfinite(t["max_abs_diff"]):
            t["max_abs_diff"] = str(t["max_abs_diff"])     # "nan" / "inf": JSON has neither
    if args.json:
        print_json(report)
    else:
        _print_text(report, args.max_ranges)
        if "tensors" in report:
            _print_tensors(report["tensors"], args.max_tensors)
    return EXIT_OK


def _catalogues(store, a, b):
    """(tensors of a, tensors of b) when both checkpoints hold tensors snapstore.tensors can
    list, else None (a byte diff only)."""
    try:
        from snapstore.tensors import tensor_catalogue
    except ImportError:          # the tensor catalogue is not part of this build
        return None
    cat_a, cat_b = (retry_moved(lambda: tensor_catalogue(store, c), f"diff: checkpoint {c.id}")
                    for c in (a, b))        # made again when a compaction moved its chunks
    return (cat_a, cat_b) if cat_a and cat_b else None


def _print_tensors(tensors: list, limit: int) -> None:
    changed = [t for t in tensors if t["status"] != "unchanged"]
    print(f"tensors: {len(changed)} of {len(tensors)} differ")
    order = changed + [t for t in tensors if t["status"] == "unchanged"]
    shown = order if limit <= 0 else order[:limit]
    rows = []
    for t in shown:
        shape = "x".join(map(str, t["shape"])) or "scalar"
        if t["status"] in ("changed", "unchanged"):
            m = t["max_abs_diff"]
            what = (f"{t['changed_elements']:,} / {t['elements']:,}",
                    "-" if m is None else f"{m:.6g}" if isinstance(m, float) else str(m))
        elif t["status"] == "retyped":
            to = "x".join(map(str, t["shape_to"])) or "scalar"
            what = (f"now {t['dtype_to']} {to}", "")
        else:
            what = (t["status"], "")
        rows.append([printable(t["name"]), t["dtype"], shape, *what])
    if rows:
        print(text_table(["tensor", "dtype", "shape", "changed elements", "max abs diff"],
                         rows, right=(3, 4)))
    if len(shown) < len(order):
        print(f"... {len(order) - len(shown)} more (--max-tensors 0 or --json lists all)")


def _print_text(report: dict, max_ranges: int) -> None:
    results = report["buffers"]
    print(f"diff {report['from']} -> {report['to']}")
    for r in results:
        name = printable(r["name"])
        if r["status"] == "removed":
            print(f"  {name}: removed ({human_bytes(r['size_from'])})")
        elif r["status"] == "added":
            print(f"  {name}: added ({human_bytes(r['size_to'])})")
        elif r["status"] == "unchanged":
            print(f"  {name}: unchanged ({human_bytes(r['size_to'])})")
        else:
            resized = (f", resized {human_bytes(r['size_from'])} -> "
                       f"{human_bytes(r['size_to'])}") if r["status"] == "resized" else ""
            print(f"  {name}: {len(r['ranges'])} range(s), {r['changed_bytes']:,} bytes "
                  f"differ of {human_bytes(r['size_to'])}{resized}")
            shown = r["ranges"] if max_ranges <= 0 else r["ranges"][:max_ranges]
            for off, length in shown:
                print(f"    {off}:{length}  ({human_bytes(length)})")
            if len(shown) < len(r["ranges"]):
                print(f"    ... {len(r['ranges']) - len(shown)} more (--max-ranges 0 or "
                      f"--json lists all)")
    changed = report["changed_bytes"]
    n_changed = sum(1 for r in results if r["status"] != "unchanged")
    print(f"{changed:,} bytes ({human_bytes(changed)}) differ in {n_changed} of "
          f"{len(results)} buffer(s)")
