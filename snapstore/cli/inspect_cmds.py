"""`snapstore ls`, `show` and `stats`: what the store holds (read-only; a running writer does
not block them)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from typing import Any, Optional

from snapstore import errors
from snapstore.cli.args import NAME_HELP, count_arg, id_arg
from snapstore.cli.contents import contents_json, print_contents
from snapstore.cli.common import EXIT_OK, open_store, resolve, store_path
from snapstore.cli.output import (human_value, info_dict, iso_time, local_time, print_json,
                                  print_report)
from snapstore.cli.where import matches_all, parse_where
from snapstore.formatting import human_bytes, printable, text_table
from snapstore.langgraph_streams import thread_of, thread_prefixes


def add_ls(add) -> None:
    p = add("ls", "list checkpoints, oldest first", cmd_ls, description="Lists checkpoints, "
            "oldest first: the user's meta in the META column (snapstore's own keys hidden), "
            "LangGraph streams by thread (lg:THREAD, lw:THREAD for pending writes). On a "
            "terminal, META is cut to fit its width (-w: never).")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--stream", help="only checkpoints of this stream")
    which.add_argument("--thread", metavar="ID",
                       help="only the checkpoints (and pending writes) of this LangGraph thread")
    p.add_argument("--tag", action="append", default=[],
                   help="only checkpoints with this tag (repeat: all of them)")
    p.add_argument("--where", action="append", default=[], type=where_arg, metavar="EXPR",
                   help="only checkpoints whose meta satisfies EXPR (repeat: all of them): "
                        "KEY OP VALUE with OP one of = != < <= > >= (numbers compare as "
                        "numbers, text as text; a.b looks into a dict), has:KEY, !has:KEY; "
                        "e.g. --where 'step>=100' --where 'loss<0.5'")
    p.add_argument("--last", type=count_arg, metavar="N", help="only the newest N (that match)")
    p.add_argument("-w", "--wide", action="store_true",
                   help="never cut the META column to the terminal's width")


def add_show(add) -> None:
    p = add("show", "metadata, buffers, chain and sizes of one checkpoint", cmd_show,
            description="Shows one checkpoint: the user's meta first (snapstore's own keys "
            "hidden; --json lists them under reserved_meta), then stream, kind, chain, tags, "
            "sizes and its buffers.")
    p.add_argument("id", type=id_arg, metavar="NAME", help=NAME_HELP)


def add_stats(add) -> None:
    add("stats", "sizes, counts, deduplication and chain lengths of the store", cmd_stats)


def where_arg(text: str):
    """An argument type: one --where expression (snapstore.cli.where)."""
    try:
        return parse_where(text)
    except errors.InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def cmd_ls(args) -> int:
    with open_store(args) as store:
        if args.thread is not None:
            prefixes = thread_prefixes(args.thread)
            streams = [s for s in store.streams() if s.startswith(prefixes)]
            infos = sorted((i for s in streams for i in store.checkpoints(s)),
                           key=lambda i: i.id)
        else:
            infos = store.checkpoints(args.stream)
        hint = _empty_hint(store, args) if not infos else None
    if args.tag:
        want = set(args.tag)
        infos = [i for i in infos if want <= set(i.tags or ())]
    if args.where:
        infos = [i for i in infos if matches_all(args.where, i.meta)]
    if args.last:
        infos = infos[-args.last:]
    if args.json:
        doc = {"store": store_path(args), "checkpoints": [_info_json(i) for i in infos]}
        if hint:
            doc["hint"] = hint
        print_json(doc)
        return EXIT_OK
    if not infos:
        print("no checkpoints")
        if hint:
            print(f"hint: {hint}")
        return EXIT_OK
    rows = [[i.id, stream_label(i), i.kind, "-" if i.parent is None else i.parent,
             local_time(i.created), human_bytes(sum(i.sizes.values())),
             human_bytes(i.bytes_new), i.chain_length, ",".join(i.tags or ()),
             meta_text(meta_summary(i))] for i in infos]
    header = ["ID", "STREAM", "KIND", "PARENT", "CREATED", "SIZE", "NEW", "CHAIN", "TAGS", "META"]
    print(fit_table(header, rows, (0, 3, 5, 6, 7), None if args.wide else terminal_width()))
    return EXIT_OK


def _empty_hint(store, args) -> Optional[str]:
    """Where the checkpoints may be when --stream S or --thread T found none (or None)."""
    names = store.streams()
    if args.stream is not None:
        lg = [s for s in names if s.startswith(thread_prefixes(args.stream))]
        if lg:
            return (f"LangGraph thread {args.stream!r} has {len(lg)} stream(s): "
                    f"snapstore ls --thread {args.stream}")
        return _similar(names, args.stream)
    if args.thread is not None:
        if args.thread in names:
            return f"{args.thread!r} is a stream: snapstore ls --stream {args.thread}"
        return _similar(names, args.thread) or f"no LangGraph thread {args.thread!r} here"
    return None


def _similar(names: list, text: str) -> Optional[str]:
    near = [s for s in names if s.startswith(text) and s != text]
    if not near:
        return None
    shown = ", ".join(repr(s) for s in near[:5])
    more = f" and {len(near) - 5} more" if len(near) > 5 else ""
    return f"streams starting with {text!r}: {shown}{more}"


def _info_json(info) -> dict:
    """info_dict with the user's meta only (+ thread and namespace for LangGraph)."""
    d = info_dict(info)
    d["meta"] = info.meta
    lg = thread_of(info.stream, info.meta)
    if lg:
        d["thread"], d["namespace"] = lg
    return d


def stream_label(info) -> str:
    """The stream as ls shows it: lg:THREAD[/NS] (lw: for pending writes) for a LangGraph
    saver's stream, else its name."""
    lg = thread_of(info.stream, info.meta)
    if not lg:
        return info.stream
    thread_id, ns = lg
    return f"{info.stream[:2]}:{thread_id}" + (f"/{ns}" if ns else "")


def meta_summary(info) -> Any:
    """What people see of a checkpoint's meta: the user's keys; for a LangGraph saver's
    checkpoint (a serialized blob) its checkpoint id (and task, for pending writes)."""
    lg = thread_of(info.stream, info.meta)
    if lg:
        out = {"checkpoint": info.meta.get("id")}
        if "task" in info.meta:
            out["task"] = info.meta["task"]
        return out
    return info.meta


def meta_text(meta: Any) -> str:
    """Meta as `key=value key=value` (strings bare, anything else compact JSON); a meta that
    is not a dict as compact JSON; '' for None or {}."""
    if meta is None or meta == {}:
        return ""
    if not isinstance(meta, dict):
        return _compact(meta)
    return " ".join(f"{k}={v if isinstance(v, str) else _compact(v)}" for k, v in meta.items())


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str)


def terminal_width() -> Optional[int]:
    """Columns of the terminal stdout is (or $COLUMNS); None when output is not a terminal."""
    if os.environ.get("COLUMNS") or sys.stdout.isatty():
        return max(shutil.get_terminal_size().columns, 20)
    return None


def ellipsis() -> str:
    """'…' when stdout can encode it, else '...'."""
    try:
        "\u2026".encode(getattr(sys.stdout, "encoding", None) or "ascii")
        return "\u2026"
    except (UnicodeEncodeError, LookupError):
        return "..."


def cut(text: str, width: int, mark: str) -> str:
    """text cut to at most width characters, ending in mark when cut."""
    if len(text) <= width:
        return text
    return text[:max(width - len(mark), 0)] + mark[:width]


# Columns ls leaves out, in this order, when the terminal is too narrow for a useful META.
OPTIONAL_COLUMNS = ("CHAIN", "PARENT", "NEW", "CREATED")
MIN_META = 24


def fit_table(header: list, rows: list, right, width: Optional[int]) -> str:
    """text_table whose last column (META) is cut so that lines fit `width` (None: never cut),
    leaving out OPTIONAL_COLUMNS while META would get fewer than MIN_META characters; a line
    still too long (long stream names on a narrow terminal) is cut at width. Never wraps."""
    if width is None or not rows:
        return text_table(header, rows, right=right)
    mark = ellipsis()
    right_names = {header[i] for i in right}
    cells = [[printable(c) for c in r] for r in rows]
    for drop in (None,) + OPTIONAL_COLUMNS:
        if drop in header:
            keep = [i for i, h in enumerate(header) if h != drop]
            header = [header[i] for i in keep]
            cells = [[r[i] for i in keep] for r in cells]
        cols = [i for i, h in enumerate(header[:-1]) if h in right_names]
        head = text_table(header[:-1], [r[:-1] for r in cells], right=cols)
        budget = width - max(len(line) for line in head.splitlines()) - 2
        if budget >= MIN_META:
            break
    budget = max(budget, len(header[-1]))
    cells = [r[:-1] + [cut(r[-1], budget, mark)] for r in cells]
    table = text_table(header, cells, right=[i for i, h in enumerate(header) if h in right_names])
    return "\n".join(cut(line, width, mark) for line in table.splitlines())


def _chain(store, info) -> list:
    """Ids from the nearest full checkpoint down to info (what a restore applies)."""
    chain = [info.id]
    current = info
    for _ in range(info.chain_length):
        if current.parent is None:
            break
        try:
            current = store.get(current.parent)
        except errors.CheckpointNotFound:   # deleted: its manifests live on in its child
            break
        chain.append(current.id)
    chain.reverse()
    return chain


def cmd_show(args) -> int:
    with open_store(args) as store:
        info = store.get(resolve(store, args.id))
        chain = _chain(store, info)
        contents = contents_json(store, info)
    if args.json:
        d = _info_json(info)
        d["reserved_meta"] = info.reserved_meta
        d["chain"] = chain
        d["contents"] = contents
        d["buffers"] = [{"name": n, "bytes": s} for n, s in info.sizes.items()]
        print_json(d)
        return EXIT_OK
    total = sum(info.sizes.values())
    print(f"checkpoint {info.id}")
    lg = thread_of(info.stream, info.meta)
    stream = f"{info.stream} (seq {info.seq})" if info.seq else info.stream
    if lg:
        stream += f", LangGraph thread {lg[0]!r}" + (f" namespace {lg[1]!r}" if lg[1] else "")
    rows = [("meta", meta_text(meta_summary(info)) or "-"),
            ("stream", stream), ("kind", info.kind),
            ("parent", "-" if info.parent is None else info.parent),
            ("created", f"{local_time(info.created)} ({iso_time(info.created)})"),
            ("chain", f"{' <- '.join(map(str, chain))} (length {info.chain_length})"),
            ("tags", ", ".join(info.tags or ()) or "-"),
            ("size", f"{human_value('bytes', total)} in {len(info.sizes)} buffer(s)"),
            ("bytes new", human_value("bytes", info.bytes_new))]
    for k, v in rows:
        print(f"  {k:<10} {printable(v)}")
    if info.sizes:
        print()
        print(text_table(["BUFFER", "SIZE", "BYTES"],
                         [[n, human_bytes(s), f"{s:,}"] for n, s in info.sizes.items()],
                         right=(1, 2)))
    print_contents(contents)
    return EXIT_OK


def cmd_stats(args) -> int:
    with open_store(args) as store:
        report = store.stats()
    if args.json:
        print_json(report)
    else:
        print_report(f"store {store_path(args)}", report)
    return EXIT_OK
