"""`snapstore compact`, `gc`, `verify` and `repair`: reclaim space and fold chains (a local
store), delete the objects of deleted checkpoints after a grace period (an S3 store); check
integrity (exit 1 when verify finds a problem); rebuild the index from the log (exit 1 when
the log itself is damaged)."""
from __future__ import annotations

import argparse
import math
import os
import sys

from snapstore.cli.args import count_arg, seconds_arg
from snapstore.cli.common import (EXIT_OK, EXIT_PROBLEM, PROG, Problem, UsageError, need,
                                  open_store, progress, spinner_for, store_path)
from snapstore.cli.output import local_time, print_json, print_report
from snapstore.formatting import human_bytes, printable
from snapstore.remote.layout import MIN_GC_GRACE_SECONDS, is_remote
from snapstore.store import repair as repair_store


def add_compact(add) -> None:
    p = add("compact", "reclaim space of deleted checkpoints and fold long chains", cmd_compact,
            description="Returns the space of deleted checkpoints to the file system: drops "
            "unreferenced chunks, rewrites segments (every one less live than --threshold, "
            "then more, emptiest first, until the garbage left is at most --max-garbage of "
            "the live data: by default the store ends up at most 1.1x its live data), and "
            "replaces the index by a compacted copy when at least half of it is free space. "
            "Also folds delta chains longer than --max-chain. Runs while other writers write; "
            "compactions run one at a time (--timeout: how long to wait for a running one).")
    p.add_argument("--threshold", type=float, default=None, metavar="F",
                   help="always rewrite segments less live than this fraction (default 0.5)")
    p.add_argument("--max-garbage", type=garbage_arg, default=None, metavar="F",
                   help="then rewrite more segments, emptiest first, until the garbage left "
                        "is at most F times the live data (default 0.1; 'none': rewrite by "
                        "--threshold only)")
    p.add_argument("--shrink-index", action=argparse.BooleanOptionalAction, default=None,
                   help="copy the index compacted: always, or never (default: when at least "
                        "half of it is free)")
    p.add_argument("--max-chain", type=count_arg, default=None, metavar="N",
                   help="fold delta chains longer than N (default: the store's)")


NO_LIMIT = "none"


def garbage_arg(text: str):
    """--max-garbage: a fraction >= 0, or 'none' (NO_LIMIT)."""
    if text.strip().lower() == NO_LIMIT:
        return NO_LIMIT
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or 'none': {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number >= 0 or 'none', got {text!r}")
    return value


def add_gc(add) -> None:
    p = add("gc", "delete the objects of deleted checkpoints of an S3 store (after a grace "
            "period)", cmd_gc,
            description="Garbage collection of an S3 store (s3://BUCKET/PREFIX), while "
            "writers write: a run marks the segments and checkpoint objects no stream "
            "reaches that are older than --grace (and abandoned group commits older than "
            "twice that); a later run, once the mark is due, deletes what is still "
            "unreachable. Run it regularly (cron), or with --wait to mark, wait and delete "
            "in one go. A store's first mark is due after an hour whatever --grace says "
            "(writers assume an hour until gc tells them otherwise). A local store's space "
            "comes back through `snapstore compact`.")
    p.add_argument("--grace", type=grace_arg, default=None, metavar="SECONDS",
                   help="only objects unreachable and older than this are marked, and a "
                        "mark is deleted this long after it was made (default 3600, at "
                        "least 1); writers get half of it for a checkpoint")
    p.add_argument("--dry-run", action="store_true",
                   help="write and delete nothing: report what a run would mark and delete")
    p.add_argument("--wait", action="store_true",
                   help="when the run leaves objects marked, wait until the mark is due and "
                        "run again (deletes what it marked before it exits)")


def add_verify(add) -> None:
    p = add("verify", "check the store's integrity (exit 1 if a problem is found)", cmd_verify)
    p.add_argument("--deep", action="store_true",
                   help="also read and check every chunk's bytes (slow)")


def add_repair(add) -> None:
    add("repair", "rebuild the index from the log (exit 1 if the log itself is damaged)",
        cmd_repair, description="Rebuilds the store's index from its segments alone, for "
        "an index that is missing, truncated or damaged (or any time): afterwards the same "
        "checkpoints, streams, seqs and tags exist. Needs the store to itself: waits "
        "up to --timeout for its writers to close.")


def cmd_compact(args) -> int:
    with open_store(args, write=True) as store:
        fn = need(store, "compact")
        with spinner_for(args, "compacting"):
            opts = {}
            if args.threshold is not None:
                opts["threshold"] = args.threshold
            if args.max_chain is not None:
                opts["max_chain"] = args.max_chain
            if args.max_garbage is not None:
                opts["max_garbage"] = None if args.max_garbage is NO_LIMIT else args.max_garbage
            if args.shrink_index is not None:
                opts["shrink_index"] = args.shrink_index
            report = dict(fn(**opts) or {})
    if args.json:
        print_json(report)
        return EXIT_OK
    print_report(compact_title(report), report)
    return EXIT_OK


def compact_title(report: dict) -> str:
    """The headline: what the store occupies (segments + index, as du shows) before -> after,
    and the index's part."""
    before = report.get("store_bytes_before", report.get("bytes_before"))
    after = report.get("store_bytes_after", report.get("bytes_after"))
    if not (isinstance(before, int) and isinstance(after, int)):
        return "compacted"
    change = (f"{human_bytes(before - after)} freed" if before >= after else
              f"{human_bytes(after - before)} more: the rewrite did not pay")
    title = f"compacted: {human_bytes(before)} -> {human_bytes(after)} ({change})"
    ib, ia = report.get("index_bytes_before"), report.get("index_bytes_after")
    if isinstance(ib, int) and isinstance(ia, int):
        title += f"; index {human_bytes(ib)} -> {human_bytes(ia)}"
    return title


def grace_arg(text: str) -> float:
    """gc's --grace: seconds, at least MIN_GC_GRACE_SECONDS and finite; checked before the
    store is opened (an S3 store's open may take a while to fail)."""
    value = seconds_arg(text)
    if not MIN_GC_GRACE_SECONDS <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds from "
                                         f"{MIN_GC_GRACE_SECONDS:g}, got {text!r}")
    return value


def cmd_gc(args) -> int:
    with open_store(args, write=not args.dry_run) as store:
        fn = need(store, "gc")
        opts = {"dry_run": args.dry_run, "wait": args.wait}
        if args.grace is not None:
            opts["grace"] = args.grace
        with spinner_for(args, "collecting garbage" + (" (waiting for the mark)"
                                                       if args.wait else "")):
            report = dict(fn(**opts) or {})
    if args.json:
        print_json(report)
        return EXIT_OK
    print(gc_title(report))
    due = report.get("due_at")
    print_report("", {"checkpoints_live": report.get("checkpoints_live"),
                      "checkpoints_reachable": report.get("checkpoints_reachable"),
                      "segments_reachable": report.get("segments_reachable"),
                      "next_deletion": "-" if due is None else local_time(due),
                      "aborted_uploads": report.get("aborted_uploads"),
                      "intents_deleted": report.get("intents_deleted"),
                      "seconds": report.get("seconds")})
    return EXIT_OK


def _objects(part: dict) -> str:
    """'3 segments, 1 checkpoint (12.0 MiB)' of a gc report's marked/deleted part."""
    def n(kind: str, one: str) -> str:
        k = len(part.get(kind) or ())
        return f"{k} {one}{'' if k == 1 else 's'}"
    text = f"{n('segments', 'segment')}, {n('checkpoints', 'checkpoint object')}"
    if part.get("groups"):
        text += f", {n('groups', 'group object')}"
    return f"{text} ({human_bytes(int(part.get('bytes') or 0))})"


def gc_title(report: dict) -> str:
    """The headline: what was deleted, and what waits for the next run."""
    deleted, marked = report.get("deleted") or {}, report.get("marked") or {}
    verb = ("would delete", "would leave marked") if report.get("dry_run") else \
        ("deleted", "marked")
    title = f"gc: {verb[0]} {_objects(deleted)}; {verb[1]} {_objects(marked)}"
    if report.get("raced"):
        title += " (another gc run replaced the mark first: this one deleted nothing)"
    return title


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
        print_problems(problems)
        if report.get("hint"):
            print(f"  hint: {report['hint']}")
        print_report("", {k: v for k, v in report.items()
                          if k not in ("ok", "problems", "hint")})
    return EXIT_OK if ok else EXIT_PROBLEM


def cmd_repair(args) -> int:
    path = store_path(args)
    if not is_remote(path) and not os.path.isdir(path):
        raise UsageError(f"no snapstore store at {path}")
    with progress(args, total=0, label="repair: scanning the log") as bar:
        def on_progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.done)
        report = repair_store(path, progress=on_progress, timeout=args.timeout)
    problems = list(report.get("problems") or [])
    if args.json:
        print_json(report)
    else:
        head = "OK" if report["ok"] else f"{len(problems)} problem(s) in the log"
        did = ("rebuilt the index from" if report["index_replaced"] else
               "kept the existing index (it knows more than the damaged log) after scanning")
        print(f"repair: {head}: {did} {report['segments']} segment(s) "
              f"({human_bytes(report['bytes_scanned'])} at {report['mb_per_s']:.0f} MB/s): "
              f"{report['checkpoints']} checkpoint(s), {report['streams']} stream(s)")
        print_problems(problems)
    if report["ok"]:
        return EXIT_OK
    if report["index_replaced"]:
        message = (f"repair rebuilt the index, but the log holds {len(problems)} problem(s) "
                   "(listed on stdout): what they touched is lost")
    else:
        message = (f"the log holds {len(problems)} problem(s) (listed on stdout); the "
                   "existing index was kept: restoring what needs the damaged records fails "
                   "cleanly (`snapstore verify --deep` names them)")
    if args.json:           # the report is stdout's one JSON document: the message to stderr
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return EXIT_PROBLEM
    raise Problem(message)


def print_problems(problems: list) -> None:
    """One line per problem of a verify or repair report: kind, message, where."""
    for p in problems:
        where = []
        if p.get("checkpoints"):
            where.append("checkpoints " + ", ".join(map(str, p["checkpoints"])))
        if p.get("segment") is not None:
            where.append(f"segment {p['segment']}"
                         + (f" offset {p['offset']}" if p.get("offset") is not None else ""))
        print(f"  {printable(p.get('kind', 'problem'))}: {printable(p.get('message', ''))}"
              + (f" ({'; '.join(where)})" if where else ""))
