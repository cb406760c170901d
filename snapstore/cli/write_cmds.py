"""`snapstore init`, `rm`, `tag` and `retain`: create a store, delete checkpoints, label them
(these take the writer's lock, waiting up to --timeout)."""
from __future__ import annotations

import os

from snapstore.cli.args import count_arg, id_arg, nonneg_arg
from snapstore.cli.common import EXIT_OK, UsageError, need, open_store, resolve, store_path
from snapstore.cli.output import print_json
from snapstore.engine import format as fmt
from snapstore.formatting import printable
from snapstore.store import open as open_snapstore


def add_init(add) -> None:
    add("init", "create a new, empty store (nothing happens if it exists)", cmd_init)


def add_rm(add) -> None:
    p = add("rm", "delete checkpoints (later ones stay restorable)", cmd_rm)
    p.add_argument("ids", type=id_arg, nargs="+", metavar="ID")


def add_tag(add) -> None:
    p = add("tag", "add (or --remove) tags of a checkpoint", cmd_tag)
    p.add_argument("id", type=id_arg, help="checkpoint id")
    p.add_argument("tags", nargs="+", metavar="TAG")
    p.add_argument("-r", "--remove", action="store_true", help="remove these tags instead")


def add_retain(add) -> None:
    p = add("retain", "delete checkpoints outside a retention policy", cmd_retain,
            description="Keeps, per stream, the newest --keep-last checkpoints and every "
            "--keep-every-th one (and tagged ones unless --no-keep-tagged); deletes the rest.")
    p.add_argument("--stream", action="append", default=[],
                   help="apply to this stream (repeat; default: every stream)")
    p.add_argument("--keep-last", type=nonneg_arg, metavar="N")
    p.add_argument("--keep-every", type=count_arg, metavar="K")
    p.add_argument("--no-keep-tagged", dest="keep_tagged", action="store_false", default=True,
                   help="tagged checkpoints are not protected")


def cmd_init(args) -> int:
    path = store_path(args)
    existed = os.path.exists(os.path.join(path, fmt.FORMAT_FILE))
    if existed:     # validate it without taking the writer's lock (a job may hold it)
        open_snapstore(path, create=False, readonly=True).close()
    else:
        open_snapstore(path, create=True, timeout=args.timeout).close()
    if args.json:
        print_json({"path": os.path.abspath(path), "created": not existed})
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
    if args.keep_last is None and args.keep_every is None:
        raise UsageError("retain needs --keep-last N and/or --keep-every K")
    with open_store(args, write=True) as store:
        fn = need(store, "retain")
        streams = args.stream or store.streams()
        deleted = {}
        for s in streams:
            deleted[s] = list(fn(s, keep_last=args.keep_last, keep_every=args.keep_every,
                                 keep_tagged=args.keep_tagged))
    if args.json:
        print_json({"deleted": deleted,
                    "deleted_count": sum(len(v) for v in deleted.values())})
    else:
        for s, ids in deleted.items():
            print(f"{printable(s)}: deleted {len(ids)} checkpoint(s)"
                  + (f": {', '.join(map(str, ids))}" if ids else ""))
    return EXIT_OK
