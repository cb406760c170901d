"""`snapstore compact` and `verify`: reclaim space and fold chains; check integrity (exit 1
when verify finds a problem)."""
from __future__ import annotations

from snapstore.cli.args import count_arg
from snapstore.cli.common import EXIT_OK, EXIT_PROBLEM, need, open_store, spinner_for
from snapstore.cli.output import print_json, print_report
from snapstore.formatting import human_bytes, printable


def add_compact(add) -> None:
    p = add("compact", "reclaim space of deleted checkpoints and fold long chains", cmd_compact)
    p.add_argument("--threshold", type=float, default=None, metavar="F",
                   help="rewrite sealed segments less live than this fraction (default: the "
                        "store's, 0.5)")
    p.add_argument("--max-chain", type=count_arg, default=None, metavar="N",
                   help="fold delta chains longer than N (default: the store's)")


def add_verify(add) -> None:
    p = add("verify", "check the store's integrity (exit 1 if a problem is found)", cmd_verify)
    p.add_argument("--deep", action="store_true",
                   help="also read and check every chunk's bytes (slow)")


def cmd_compact(args) -> int:
    with open_store(args, write=True) as store:
        fn = need(store, "compact")
        with spinner_for(args, "compacting"):
            opts = {}
            if args.threshold is not None:
                opts["threshold"] = args.threshold
            if args.max_chain is not None:
                opts["max_chain"] = args.max_chain
            report = dict(fn(**opts) or {})
    if args.json:
        print_json(report)
        return EXIT_OK
    before, after = report.get("bytes_before"), report.get("bytes_after")
    title = "compacted"
    if isinstance(before, int) and isinstance(after, int):
        title = (f"compacted: {human_bytes(before)} -> {human_bytes(after)} "
                 f"({human_bytes(before - after)} freed)")
    print_report(title, report)
    return EXIT_OK


def cmd_verify(args) -> int:
    with open_store(args) as store:
        fn = need(store, "verify")
        with spinner_for(args, "verifying" + (" (deep)" if args.deep else "")):
            report = dict(fn(deep=args.deep) or {})
    problems = list(report.get("problems") or [])
    ok = bool(report.get("ok", not problems))
    if args.json:
        print_json(report)
    else:
        if ok:
            print(f"verify{' --deep' if args.deep else ''}: OK")
        else:
            print(f"verify{' --deep' if args.deep else ''}: {len(problems)} problem(s)")
        for p in problems:
            where = []
            if p.get("checkpoints"):
                where.append("checkpoints " + ", ".join(map(str, p["checkpoints"])))
            if p.get("segment") is not None:
                where.append(f"segment {p['segment']}"
                             + (f" offset {p['offset']}" if p.get("offset") is not None else ""))
            print(f"  {printable(p.get('kind', 'problem'))}: {printable(p.get('message', ''))}"
                  + (f" ({'; '.join(where)})" if where else ""))
        print_report("", {k: v for k, v in report.items() if k not in ("ok", "problems")})
    return EXIT_OK if ok else EXIT_PROBLEM
