"""`snapstore init`, `rm`, `tag` and `retain`: create a store, delete checkpoints, label them,
apply a retention policy and free its space (these open the store as a writer, alongside any
other writers; `retain --dry-run` only reads)."""
from __future__ import annotations

import argparse
import datetime
import os
import textwrap

from snapstore.cli.args import NAME_HELP, count_arg, id_arg, nonneg_arg
from snapstore.cli.common import (EXIT_OK, UsageError, need, open_store, remote_options,
                                  resolve, shown_location, store_path)
from snapstore.cli.output import print_json
from snapstore.engine import format as fmt
from snapstore.engine.retention import parse_duration
from snapstore.errors import FormatError, InvalidArgumentError
from snapstore.formatting import human_bytes, printable
from snapstore.remote.layout import is_remote
from snapstore.store import open as open_snapstore


def add_init(add) -> None:
    add("init", "create a new, empty store (nothing happens if it exists)", cmd_init)


def add_rm(add) -> None:
    p = add("rm", "delete checkpoints (later ones stay restorable)", cmd_rm)
    p.add_argument("ids", type=id_arg, nargs="+", metavar="NAME",
                   help=f"{NAME_HELP}; all are resolved before any is deleted")


def add_tag(add) -> None:
    p = add("tag", "add (or --remove) tags of a checkpoint", cmd_tag)
    p.add_argument("id", type=id_arg, metavar="NAME", help=NAME_HELP)
    p.add_argument("tags", nargs="+", metavar="TAG")
    p.add_argument("-r", "--remove", action="store_true", help="remove these tags instead")


def duration_arg(text: str) -> float:
    """An argument type: a duration (engine.retention.parse_duration) in seconds."""
    try:
        return parse_duration(text, "value")
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


# (option, dest, what it keeps): the count rules of `retain`.
RETAIN_COUNTS = (
    ("--keep-last", "keep_last", "the N newest checkpoints"),
    ("--keep-hourly", "keep_hourly", "the newest checkpoint of each of the last N hours that "
                                     "have checkpoints"),
    ("--keep-daily", "keep_daily", "the newest of each of the last N days with checkpoints"),
    ("--keep-weekly", "keep_weekly", "the newest of each of the last N ISO weeks (Monday to "
                                     "Sunday) with checkpoints"),
    ("--keep-monthly", "keep_monthly", "the newest of each of the last N calendar months "
                                       "with checkpoints"),
    ("--keep-yearly", "keep_yearly", "the newest of each of the last N years with "
                                     "checkpoints"))
RETAIN_RULES = ("keep_last", "keep_every", "keep_within", "keep_hourly", "keep_daily",
                "keep_weekly", "keep_monthly", "keep_yearly")


def add_retain(add) -> None:
    p = add("retain", "delete checkpoints outside a retention policy, and free their space",
            cmd_retain, description=textwrap.fill(
                "Keeps, in each chosen stream, every checkpoint that at least one rule keeps "
                "(and tagged ones unless --no-keep-tagged), deletes the rest, then compacts "
                "so their space returns to the file system (as `restic forget --prune`; "
                "--no-prune skips that). At least one --keep-* rule that keeps some is "
                "required (--keep-last 0 alone is refused). Periods "
                "(hours, days, weeks, months, years) are local time (--utc: UTC); 'last N "
                "periods' counts only periods that have checkpoints, as restic does. "
                "--dry-run lists what would be deleted and which rules keep the rest.", 79)
            + "\n\nexample: snapstore retain --stream train --keep-last 3 --keep-daily 7 "
            "--keep-within 36h")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--stream", action="append", default=[],
                       help="apply to this stream (repeat for several)")
    where.add_argument("--all-streams", action="store_true",
                       help="apply to every stream of the store (each on its own)")
    counts = dict((dest, (flag, what)) for flag, dest, what in RETAIN_COUNTS)
    flag, what = counts["keep_last"]
    p.add_argument(flag, type=nonneg_arg, metavar="N", help=f"keep {what}")
    p.add_argument("--keep-every", type=count_arg, metavar="K",
                   help="keep the checkpoints whose seq (1, 2, 3... per stream) is a multiple "
                        "of K (stable: a second run deletes nothing more)")
    p.add_argument("--keep-within", type=duration_arg, metavar="DURATION",
                   help="keep those created at most DURATION before the stream's newest "
                        "checkpoint (not before now): seconds or e.g. 90m, 36h, 7d, 2w, 1y, "
                        "1d12h (units s m h d w y; m is minutes, y is 365 days)")
    for dest in ("keep_hourly", "keep_daily", "keep_weekly", "keep_monthly", "keep_yearly"):
        flag, what = counts[dest]
        p.add_argument(flag, type=nonneg_arg, metavar="N", help=f"keep {what}")
    p.add_argument("--no-keep-tagged", dest="keep_tagged", action="store_false", default=True,
                   help="tagged checkpoints are not protected")
    p.add_argument("--utc", action="store_true",
                   help="periods are UTC hours, days... (default: local time)")
    p.add_argument("--dry-run", action="store_true",
                   help="delete nothing; list what would be deleted and why the rest is kept")
    p.add_argument("--no-prune", dest="prune", action="store_false", default=True,
                   help="only delete; leave the space to a later `snapstore compact`")


def cmd_init(args) -> int:
    path = store_path(args)
    if is_remote(path):
        try:
            open_snapstore(path, create=False, readonly=True, **remote_options(args)).close()
            existed = True
        except FormatError:
            open_snapstore(path, create=True, **remote_options(args)).close()
            existed = False
        if args.json:
            print_json({"path": path, "created": not existed})
        else:
            print(f"{'store already exists at' if existed else 'created store'} {path}")
        return EXIT_OK
    existed = os.path.exists(os.path.join(path, fmt.FORMAT_FILE))
    if existed:     # validate it read-only: no lock to wait for (a repair may hold it)
        open_snapstore(path, create=False, readonly=True).close()
    else:
        open_snapstore(path, create=True, timeout=args.timeout).close()
    if args.json:
        print_json({"path": shown_location(path), "created": not existed})
    else:
        print(f"{'store already exists at' if existed else 'created store'} {path}")
    return EXIT_OK


def cmd_rm(args) -> int:
    with open_store(args, write=True) as store:
        ids = [store.get(resolve(store, ref)).id for ref in args.ids]   # all exist, or none go
        ids = list(dict.fromkeys(ids))
        for cid in ids:
            store.delete(cid)
    if args.json:
        print_json({"deleted": ids})
    else:
        print(f"deleted checkpoint{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}")
    return EXIT_OK


def cmd_tag(args) -> int:
    with open_store(args, write=True) as store:
        fn = need(store, "untag" if args.remove else "tag")
        cid = store.get(resolve(store, args.id)).id
        for t in args.tags:
            fn(cid, t)
        info = store.get(cid)
    if args.json:
        print_json({"id": cid, "tags": list(info.tags or ())})
    else:
        print(f"checkpoint {cid} tags: {', '.join(map(printable, info.tags or ())) or '-'}")
    return EXIT_OK


def cmd_retain(args) -> int:
    rules = {name: getattr(args, name) for name in RETAIN_RULES}
    if all(v is None for v in rules.values()):
        raise UsageError("retain needs at least one rule: --keep-last N, --keep-every K, "
                         "--keep-within DURATION or --keep-hourly/daily/weekly/monthly/yearly N")
    if not args.stream and not args.all_streams:
        raise UsageError("retain needs --stream NAME (repeatable) or --all-streams")
    rules.update(keep_tagged=args.keep_tagged, tz=datetime.timezone.utc if args.utc else None)
    with open_store(args, write=not args.dry_run) as store:
        fn = need(store, "retain")
        streams = list(dict.fromkeys(args.stream)) or store.streams()
        plans = {s: fn(s, dry_run=True, **rules) for s in streams}
        results = plans
        if not args.dry_run:
            # one prune for all: on the last stream that deletes anything
            doomed = [s for s in streams if plans[s]]
            results = {s: fn(s, prune=args.prune and s == doomed[-1], **rules) if plans[s]
                       else plans[s] for s in streams}
    report = retain_report(streams, results, args.dry_run)
    if args.json:
        print_json(report)
    else:
        print_retain(report, remote=is_remote(store.path))
    return EXIT_OK


def retain_report(streams: list, results: dict, dry_run: bool) -> dict:
    """The JSON document of `retain`: per stream what went (or would go) and what stays and
    why, and the space before and after (the first real run's before, the last one's after)."""
    real = [results[s] for s in streams if results[s] and not dry_run]
    before = real[0].bytes_before if real else (results[streams[0]].bytes_before
                                                if streams else None)
    after = None if dry_run else (real[-1].bytes_after if real else before)
    pruned = [r.compaction for r in real if r.compaction is not None]
    return {"dry_run": dry_run,
            "deleted": {s: list(results[s]) for s in streams},
            "deleted_count": sum(len(results[s]) for s in streams),
            "kept": {s: {str(i): why for i, why in results[s].kept.items()} for s in streams},
            "bytes_before": before, "bytes_after": after,
            "bytes_freed": None if after is None or before is None else before - after,
            "compaction": pruned[-1] if pruned else None}


def print_retain(report: dict, remote: bool = False) -> None:
    verb = "would delete" if report["dry_run"] else "deleted"
    if not report["deleted"]:
        print("the store has no streams: nothing to do")
    for s, ids in report["deleted"].items():
        if not ids and not report["kept"][s]:
            print(f"{printable(s)}: no checkpoints (no such stream?)")   # a typo says so
            continue
        print(f"{printable(s)}: {verb} {len(ids)} checkpoint(s)"
              + (f": {', '.join(map(str, ids))}" if ids else ""))
        for cid, why in report["kept"][s].items() if report["dry_run"] else ():
            print(f"  keep {cid}: {', '.join(why)}")
    if report["dry_run"]:
        print("dry run: nothing was deleted")
    elif remote:
        if report["deleted_count"]:
            print("space: an S3 store's space comes back through `snapstore gc` (objects no "
                  "checkpoint uses are deleted after its grace period)")
    elif report["bytes_freed"] is not None:
        how = "pruned" if report["compaction"] else "not pruned; run `snapstore compact`" \
            if report["deleted_count"] else "nothing to prune"
        freed = report["bytes_freed"]
        change = f"{human_bytes(freed)} freed" if freed >= 0 else \
            f"{human_bytes(-freed)} more: the delete records"
        print(f"space: {human_bytes(report['bytes_before'])} -> "
              f"{human_bytes(report['bytes_after'])} ({change}; {how})")
