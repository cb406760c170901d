"""`snapstore ls`, `show` and `stats`: what the store holds (read-only; a running writer does
not block them)."""
from __future__ import annotations

import json

from snapstore import errors
from snapstore.cli.args import count_arg, id_arg
from snapstore.cli.contents import contents_json, print_contents
from snapstore.cli.common import EXIT_OK, open_store, resolve, store_path
from snapstore.cli.output import (human_value, info_dict, iso_time, local_time, print_json,
                                  print_report, short)
from snapstore.formatting import human_bytes, printable, text_table


def add_ls(add) -> None:
    p = add("ls", "list checkpoints, oldest first", cmd_ls)
    p.add_argument("--stream", help="only checkpoints of this stream")
    p.add_argument("--tag", action="append", default=[],
                   help="only checkpoints with this tag (repeat: all of them)")
    p.add_argument("--last", type=count_arg, metavar="N", help="only the newest N")


def add_show(add) -> None:
    p = add("show", "metadata, buffers, chain and sizes of one checkpoint", cmd_show)
    p.add_argument("id", type=id_arg, help="checkpoint id")


def add_stats(add) -> None:
    add("stats", "sizes, counts, deduplication and chain lengths of the store", cmd_stats)


def cmd_ls(args) -> int:
    with open_store(args) as store:
        infos = store.checkpoints(args.stream)
    if args.tag:
        want = set(args.tag)
        infos = [i for i in infos if want <= set(i.tags or ())]
    if args.last:
        infos = infos[-args.last:]
    if args.json:
        print_json({"store": store_path(args), "checkpoints": [info_dict(i) for i in infos]})
        return EXIT_OK
    if not infos:
        print("no checkpoints")
        return EXIT_OK
    rows = [[i.id, i.stream, i.kind, "-" if i.parent is None else i.parent,
             local_time(i.created), human_bytes(sum(i.sizes.values())),
             human_bytes(i.bytes_new), i.chain_length, ",".join(i.tags or ()), short(i.meta)]
            for i in infos]
    print(text_table(["ID", "STREAM", "KIND", "PARENT", "CREATED", "SIZE", "NEW", "CHAIN",
                      "TAGS", "META"], rows, right=(0, 3, 5, 6, 7)))
    return EXIT_OK


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
        d = info_dict(info)
        d["chain"] = chain
        d["contents"] = contents
        d["buffers"] = [{"name": n, "bytes": s} for n, s in info.sizes.items()]
        print_json(d)
        return EXIT_OK
    total = sum(info.sizes.values())
    print(f"checkpoint {info.id}")
    rows = [("stream", info.stream), ("kind", info.kind),
            ("parent", "-" if info.parent is None else info.parent),
            ("created", f"{local_time(info.created)} ({iso_time(info.created)})"),
            ("chain", f"{' <- '.join(map(str, chain))} (length {info.chain_length})"),
            ("tags", ", ".join(info.tags or ()) or "-"),
            ("meta", json.dumps(info.meta, sort_keys=True, default=str)),
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
