"""`snapstore diff ID1 ID2`: prints which byte ranges of which buffers differ (the comparison
itself is snapstore.diff)."""
from __future__ import annotations

from snapstore import diff
from snapstore.cli.args import NAME_HELP, id_arg, nonneg_arg, size_arg, size_between
from snapstore.cli.common import EXIT_OK, open_store, progress, resolve
from snapstore.cli.output import print_json
from snapstore.formatting import human_bytes, printable


# --window bounds: a tiny window makes a read per few bytes (hours for a large buffer), a huge
# one holds two windows in memory.
MIN_WINDOW = 4 << 10
MAX_WINDOW = 1 << 30


def add_diff(add) -> None:
    p = add("diff", "which byte ranges of which buffers differ between two checkpoints",
            cmd_diff, description="Compares the restored contents of two checkpoints in "
            "bounded windows (never whole buffers in memory) and reports, per buffer, the "
            "changed byte ranges (OFF:LEN, usable with `restore --range`) and how many bytes "
            "differ. Buffers present on one side only are listed as added/removed.")
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


def cmd_diff(args) -> int:
    with open_store(args) as store:
        a = store.get(resolve(store, args.id1))
        b = store.get(resolve(store, args.id2))
        names = diff.select_buffers(a, b, args.buffer)
        with progress(args, diff.bytes_to_compare(a, b, names), "diff") as bar:
            report = diff.diff_checkpoints(store, a, b, names, gap=args.gap,
                                           window=args.window, on_progress=bar.update)
    if args.json:
        print_json(report)
    else:
        _print_text(report, args.max_ranges)
    return EXIT_OK


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
