"""The ``snapstore`` command line (also ``python -m snapstore``).

Every command is a thin layer over the public Store API; see ``snapstore --help`` and
``snapstore COMMAND --help``. Output meant for people goes to stdout, ``--json`` replaces it with
one JSON document, errors are one line on stderr and progress bars appear only on a terminal.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import math
import os
import re
import sys
import tempfile
import textwrap
import time
import traceback
from typing import Any, Callable, Iterable, Optional

import snapstore
from snapstore import errors
from snapstore.engine import format as fmt
from snapstore.cli.progress import Progress, human_bytes, human_seconds, spinner

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

PROG = "snapstore"
WINDOW = 8 << 20           # diff/restore read checkpoints in windows of this many bytes
STORE_ENV = "SNAPSTORE_STORE"

EPILOG = f"""\
The store is given with -s/--store PATH (before or after the command) or ${STORE_ENV}.
Checkpoint ids are integers as shown by `ls`; `latest` is the newest checkpoint of the store
and `latest:STREAM` the newest of one stream. Sizes accept suffixes K, M, G, T (powers of
1024; KiB/MiB/... and KB/MB/... mean the same).

exit status:
  0  success
  1  a problem was found or the operation failed: `verify` found damage, the store is
     corrupt, locked by another writer, or an I/O error happened
  2  usage error: bad arguments, no such store / checkpoint / buffer, an invalid option value

Errors are printed as one line `snapstore: error: ...` on stderr; --debug (or
SNAPSTORE_DEBUG=1) adds the Python traceback. Progress bars are drawn on stderr only when it
is a terminal (SNAPSTORE_PROGRESS=0 or --no-progress turns them off).

examples:
  snapstore init ckpts
  snapstore -s ckpts ls --stream train
  snapstore -s ckpts diff 3 latest
  snapstore -s ckpts restore latest --out restored/
  snapstore -s ckpts verify --deep --json
  snapstore bench --size 1GiB --dirty 0.001,0.01,0.1 --plot overhead.png
"""


class UsageError(Exception):
    """The command line asks for something that cannot be done as asked (exit 2)."""


class Problem(Exception):
    """The command ran and found or hit a problem (exit 1)."""


# Store errors that mean "you asked for something that does not exist or is invalid".
_USAGE_ERRORS = (UsageError, errors.CheckpointNotFound, errors.InvalidArgumentError,
                 errors.FormatError)


def exit_code_for(exc: BaseException) -> int:
    if isinstance(exc, _USAGE_ERRORS):
        return EXIT_USAGE
    return EXIT_PROBLEM


# ---- argument types ------------------------------------------------------------------------
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'4096', '64K', '1.5MiB', '1GB' -> bytes (powers of 1024)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"invalid size {text!r} (use e.g. 4096, 64KiB, 256MiB, 1GiB)")
    value = float(m.group(1)) * 1024 ** " kmgtp".index((m.group(2) or " ").lower())
    if value != int(value):
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_range(text: str) -> tuple:
    """'OFF:LEN' -> (offset, length); 'OFF:' -> (offset, None) (to the end); ':LEN' -> (0, LEN)."""
    if ":" not in text:
        raise ValueError(f"invalid range {text!r} (use OFF:LEN, OFF: or :LEN)")
    off_s, len_s = text.split(":", 1)
    offset = parse_size(off_s) if off_s.strip() else 0
    length = parse_size(len_s) if len_s.strip() else None
    return offset, length


def _range_arg(text: str) -> tuple:
    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _id_arg(text: str):
    t = text.strip()
    if t == "latest" or t.startswith("latest:"):
        return t
    try:
        value = int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid checkpoint id {text!r} (an integer, 'latest' or 'latest:STREAM')") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"invalid checkpoint id {text!r} (ids are >= 0)")
    return value


def _count_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _nonneg_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 0")
    return value


def _fraction_list(text: str) -> list:
    out = []
    for part in text.split(","):
        p = part.strip()
        try:
            value = float(p[:-1]) / 100 if p.endswith("%") else float(p)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid fraction {part!r} (use e.g. 0.01 or 1%)") from None
        if not 0 <= value <= 1:
            raise argparse.ArgumentTypeError(f"fraction {part!r} is not between 0 and 1")
        out.append(value)
    return out


def _choice_list(choices: Iterable[str]) -> Callable[[str], list]:
    choices = tuple(choices)

    def parse(text: str) -> list:
        items = [p.strip() for p in text.split(",") if p.strip()]
        bad = [p for p in items if p not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"invalid choice {','.join(bad) or text!r} (choose from {', '.join(choices)})")
        return items
    return parse


# ---- the parser ---------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised, so main() prints and exits 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


def _common(with_store: bool = True) -> argparse.ArgumentParser:
    """Options every command accepts after its name too (defaults set on the main parser)."""
    p = _Parser(add_help=False, argument_default=argparse.SUPPRESS)
    if with_store:
        p.add_argument("-s", "--store", metavar="PATH",
                       help=f"the store directory (default: ${STORE_ENV})")
        p.add_argument("--timeout", type=float, metavar="SECONDS",
                       help="wait this long for another writer's lock (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    p.add_argument("--debug", action="store_true", help="show Python tracebacks on errors")
    p.add_argument("--no-progress", action="store_true", help="never draw progress bars")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="snapstore: incremental snapshots of in-memory "
                     "state. Inspect, restore and maintain a store; benchmark checkpoint "
                     "overhead.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {snapstore.__version__}")
    parser.add_argument("-s", "--store", metavar="PATH", default=None,
                        help=f"the store directory (default: ${STORE_ENV})")
    parser.add_argument("--timeout", type=float, default=0.0, metavar="SECONDS",
                        help="wait this long for another writer's lock (default 0)")
    parser.add_argument("--json", action="store_true", default=False,
                        help="print one JSON document instead of text")
    parser.add_argument("--debug", action="store_true", default=False,
                        help="show Python tracebacks on errors")
    parser.add_argument("--no-progress", action="store_true", default=False,
                        help="never draw progress bars")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    common = _common()
    fmtc = argparse.RawDescriptionHelpFormatter

    def add(name, help_, func, *, parents=(common,), description=None):
        p = sub.add_parser(name, help=help_, description=description or help_,
                           parents=list(parents), formatter_class=fmtc)
        p.set_defaults(func=func)
        return p

    p = add("init", "create a new, empty store (nothing happens if it exists)", cmd_init)
    p.add_argument("path", nargs="?", help="directory of the store (default: --store)")

    p = add("ls", "list checkpoints, oldest first", cmd_ls)
    p.add_argument("--stream", help="only checkpoints of this stream")
    p.add_argument("--tag", action="append", default=[],
                   help="only checkpoints with this tag (repeat: all of them)")
    p.add_argument("--last", type=_count_arg, metavar="N", help="only the newest N")

    p = add("show", "metadata, buffers, chain and sizes of one checkpoint", cmd_show)
    p.add_argument("id", type=_id_arg, help="checkpoint id")

    p = add("diff", "which byte ranges of which buffers differ between two checkpoints",
            cmd_diff, description="Compares the restored contents of two checkpoints in "
            "bounded windows (never whole buffers in memory) and reports, per buffer, the "
            "changed byte ranges (OFF:LEN, usable with `restore --range`) and how many bytes "
            "differ. Buffers present on one side only are listed as added/removed.")
    p.add_argument("id1", type=_id_arg, help="the older checkpoint")
    p.add_argument("id2", type=_id_arg, help="the newer checkpoint")
    p.add_argument("--buffer", action="append", default=[], help="only this buffer (repeat)")
    p.add_argument("--gap", type=_size_arg, default=16, metavar="BYTES",
                   help="report differing runs fewer than BYTES apart as one range "
                        "(default 16; 0: exact runs); changed bytes are always exact")
    p.add_argument("--max-ranges", type=int, default=20, metavar="N",
                   help="ranges printed per buffer in text output (default 20; 0: all; "
                        "--json always lists all)")
    p.add_argument("--window", type=_size_arg, default=WINDOW, metavar="SIZE",
                   help="compare this many bytes at a time (default 8MiB)")

    p = add("restore", "write a checkpoint's buffers to files", cmd_restore,
            description="Writes one file per buffer into --out DIR (file name = buffer name "
            "made safe for the file system; the mapping is printed), streaming in bounded "
            "windows. --out - writes one buffer's bytes to stdout.")
    p.add_argument("id", type=_id_arg, help="checkpoint id")
    p.add_argument("-o", "--out", required=True, metavar="DIR",
                   help="output directory (created if missing), or - for stdout")
    p.add_argument("--buffer", action="append", default=[], help="only this buffer (repeat)")
    p.add_argument("--range", type=_range_arg, metavar="OFF:LEN",
                   help="only these bytes of each selected buffer (OFF: = to the end)")
    p.add_argument("-f", "--force", action="store_true", help="overwrite existing files")

    p = add("rm", "delete checkpoints (later ones stay restorable)", cmd_rm)
    p.add_argument("ids", type=_id_arg, nargs="+", metavar="ID")

    p = add("tag", "add (or --remove) tags of a checkpoint", cmd_tag)
    p.add_argument("id", type=_id_arg, help="checkpoint id")
    p.add_argument("tags", nargs="+", metavar="TAG")
    p.add_argument("-r", "--remove", action="store_true", help="remove these tags instead")

    p = add("retain", "delete checkpoints outside a retention policy", cmd_retain,
            description="Keeps, per stream, the newest --keep-last checkpoints and every "
            "--keep-every-th one (and tagged ones unless --no-keep-tagged); deletes the rest.")
    p.add_argument("--stream", action="append", default=[],
                   help="apply to this stream (repeat; default: every stream)")
    p.add_argument("--keep-last", type=_nonneg_arg, metavar="N")
    p.add_argument("--keep-every", type=_count_arg, metavar="K")
    p.add_argument("--no-keep-tagged", dest="keep_tagged", action="store_false", default=True,
                   help="tagged checkpoints are not protected")

    p = add("compact", "reclaim space of deleted checkpoints and fold long chains", cmd_compact)
    p.add_argument("--threshold", type=float, default=None, metavar="F",
                   help="rewrite sealed segments less live than this fraction (default: the "
                        "store's, 0.5)")
    p.add_argument("--max-chain", type=_count_arg, default=None, metavar="N",
                   help="fold delta chains longer than N (default: the store's)")

    p = add("verify", "check the store's integrity (exit 1 if a problem is found)", cmd_verify)
    p.add_argument("--deep", action="store_true",
                   help="also read and check every chunk's bytes (slow)")

    add("stats", "sizes, counts, deduplication and chain lengths of the store", cmd_stats)

    from snapstore.bench import harness as _b
    p = add("bench", "measure checkpoint overhead against baselines", cmd_bench,
            parents=(_common(with_store=False),),
            description=textwrap.fill(
                "Measures snapstore's checkpoint overhead on a synthetic state, and the same "
                "figures for baselines run in this process on the same bytes: raw file write, "
                "pickle, numpy.save (each + fsync with --durability fsync), and restic / borg "
                "when they are on PATH. Every combination of --dirty and --pattern is one "
                "workload. The default (256 MiB, 1% scattered, 5 checkpoints) takes well "
                "under a minute.", 88) +
            "\n\nexamples:\n  snapstore bench --size 1GiB                 # the 1 GiB run"
            "\n  snapstore bench --dirty 0.001,0.01,0.1,0.5 --plot overhead.png"
            "\n  snapstore bench --pattern shifted --chunking cdc --json > result.json")
    p.add_argument("--size", type=_size_arg, default=_b.DEFAULT_SIZE,
                   help="state size (default 256MiB)")
    p.add_argument("--buffers", type=_count_arg, default=4, metavar="N",
                   help="number of buffers the state is split into (default 4)")
    p.add_argument("--dirty", type=_fraction_list, default=[0.01], metavar="F[,F...]",
                   help="fraction of the state changed per checkpoint, e.g. 0.01 or 1%% "
                        "(a list sweeps it; default 0.01)")
    p.add_argument("--pattern", type=_choice_list(_b.PATTERNS), default=["scattered"],
                   metavar="P[,P...]", help="how the state changes: scattered pages, clustered "
                   "64-page runs, shifted (bytes inserted) or appended (default scattered)")
    p.add_argument("--checkpoints", type=_count_arg, default=5, metavar="N",
                   help="incremental checkpoints after the first, full one (default 5)")
    p.add_argument("--durability", choices=("fsync", "none"), default="fsync",
                   help="fsync (default): every method makes each checkpoint durable; "
                        "none: nobody syncs")
    p.add_argument("--chunking", choices=("pages", "cdc"), default="pages",
                   help="snapstore's chunking: pages (default) or cdc (content-defined)")
    p.add_argument("--compression", choices=("zstd", "none"), default="zstd",
                   help="snapstore's chunk compression (default zstd)")
    p.add_argument("--content", choices=_b.CONTENTS, default="random",
                   help="random bytes (default, incompressible) or compressible (~2:1)")
    p.add_argument("--cache", choices=_b.CACHE_MODES, default="cold",
                   help="restore from a cold (default: files dropped from the page cache) or "
                        "warm page cache")
    p.add_argument("--restore-repeats", type=_count_arg, default=3, metavar="N",
                   help="time each restore N times and keep the median (default 3)")
    p.add_argument("--methods", type=_choice_list(_b.METHODS), default=None,
                   metavar="M[,M...]", help=f"methods to run (default all: "
                   f"{','.join(_b.METHODS)}; unavailable ones are skipped)")
    p.add_argument("--no-baselines", action="store_true", help="run snapstore only")
    p.add_argument("--dir", default=None, help="where to write (default: the temp dir); "
                   "use a real disk, not tmpfs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="FILE.json",
                   help="also write the --json result to FILE.json (the table still prints)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="plot median checkpoint time vs dirty fraction (needs matplotlib)")
    return parser


# ---- helpers -----------------------------------------------------------------------------------
def _store_path(args) -> str:
    path = getattr(args, "store", None) or os.environ.get(STORE_ENV)
    if not path:
        raise UsageError(f"no store given: use -s/--store PATH or set ${STORE_ENV}")
    return path


def _open(args, *, write: bool = False):
    path = _store_path(args)
    if not os.path.isdir(path):
        raise UsageError(f"no snapstore store at {path}")
    if write:
        return snapstore.open(path, create=False, timeout=args.timeout)
    return snapstore.open(path, create=False, readonly=True)


def _need(store, method: str) -> Callable:
    fn = getattr(store, method, None)
    if fn is None:
        raise Problem(f"this snapstore version cannot {method} (Store.{method} is missing)")
    return fn


def _resolve(store, ref) -> int:
    if isinstance(ref, int):
        return ref
    stream = ref.split(":", 1)[1] if ":" in ref else None
    if stream is not None:
        info = store.latest(stream)
        if info is None:
            raise errors.CheckpointNotFound(f"stream {stream!r} has no checkpoints")
        return info.id
    infos = store.checkpoints()
    if not infos:
        raise errors.CheckpointNotFound("the store has no checkpoints")
    return max(i.id for i in infos)


def _iso(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat().replace("+00:00", "Z")


def _local(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def info_dict(info) -> dict:
    d = dataclasses.asdict(info)
    d["tags"] = list(d.get("tags") or ())
    d["created_iso"] = _iso(info.created)
    d["bytes"] = sum(info.sizes.values())
    return d


def _print_json(obj: Any) -> None:
    def clean(o):
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {str(k): clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o
    sys.stdout.write(json.dumps(clean(obj), indent=2, default=str) + "\n")


def _table(header: list, rows: list, right: Iterable[int] = ()) -> str:
    right = set(right)
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for r in [header] + rows:
        cells = [str(c).rjust(widths[i]) if i in right else str(c).ljust(widths[i])
                 for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _short(value: Any, limit: int = 40) -> str:
    if value is None:
        return ""
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _human_value(key: str, value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if isinstance(value, bool) else "-"
    if isinstance(value, (int, float)) and ("bytes" in key or key.endswith("_size")):
        return f"{human_bytes(value)}" + (f" ({value:,} B)" if value >= 1024 else "")
    if isinstance(value, (int, float)) and ("seconds" in key or key.endswith("_s")):
        return human_seconds(float(value))
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return _short(value, 100)
    return str(value)


def _print_report(title: str, report: dict, skip: Iterable[str] = ()) -> None:
    skip = set(skip)
    if title:
        print(title)
    keys = [k for k in report if k not in skip]
    width = max((len(k) for k in keys), default=0)
    for k in keys:
        print(f"  {k.replace('_', ' '):<{width}}  {_human_value(k, report[k])}")


def _progress(args, total=None, label="", unit="B") -> Progress:
    return Progress(total, label, unit=unit, enabled=False if args.no_progress else None)


# ---- commands ------------------------------------------------------------------------------
def cmd_init(args) -> int:
    path = args.path or _store_path(args)
    existed = os.path.exists(os.path.join(path, fmt.FORMAT_FILE))
    if existed:     # validate it without taking the writer's lock (a job may hold it)
        snapstore.open(path, create=False, readonly=True).close()
    else:
        snapstore.open(path, create=True, timeout=args.timeout).close()
    if args.json:
        _print_json({"path": os.path.abspath(path), "created": not existed})
    else:
        print(f"{'store already exists at' if existed else 'created store'} {path}")
    return EXIT_OK


def cmd_ls(args) -> int:
    with _open(args) as store:
        infos = store.checkpoints(args.stream)
    if args.tag:
        want = set(args.tag)
        infos = [i for i in infos if want <= set(i.tags or ())]
    if args.last:
        infos = infos[-args.last:]
    if args.json:
        _print_json({"store": _store_path(args), "checkpoints": [info_dict(i) for i in infos]})
        return EXIT_OK
    if not infos:
        print("no checkpoints")
        return EXIT_OK
    rows = [[i.id, i.stream, i.kind, "-" if i.parent is None else i.parent,
             _local(i.created), human_bytes(sum(i.sizes.values())), human_bytes(i.bytes_new),
             i.chain_length, ",".join(i.tags or ()), _short(i.meta)] for i in infos]
    print(_table(["ID", "STREAM", "KIND", "PARENT", "CREATED", "SIZE", "NEW", "CHAIN", "TAGS",
                  "META"], rows, right=(0, 3, 5, 6, 7)))
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
    with _open(args) as store:
        info = store.get(_resolve(store, args.id))
        chain = _chain(store, info)
    if args.json:
        d = info_dict(info)
        d["chain"] = chain
        d["buffers"] = [{"name": n, "bytes": s} for n, s in info.sizes.items()]
        _print_json(d)
        return EXIT_OK
    total = sum(info.sizes.values())
    print(f"checkpoint {info.id}")
    rows = [("stream", info.stream), ("kind", info.kind),
            ("parent", "-" if info.parent is None else info.parent),
            ("created", f"{_local(info.created)} ({_iso(info.created)})"),
            ("chain", f"{' <- '.join(map(str, chain))} (length {info.chain_length})"),
            ("tags", ", ".join(info.tags or ()) or "-"),
            ("meta", json.dumps(info.meta, sort_keys=True, default=str)),
            ("size", f"{_human_value('bytes', total)} in {len(info.sizes)} buffer(s)"),
            ("bytes new", _human_value("bytes", info.bytes_new))]
    for k, v in rows:
        print(f"  {k:<10} {v}")
    if info.sizes:
        print()
        print(_table(["BUFFER", "SIZE", "BYTES"],
                     [[n, human_bytes(s), f"{s:,}"] for n, s in info.sizes.items()],
                     right=(1, 2)))
    return EXIT_OK


# ---- diff ------------------------------------------------------------------------------------
def coalesce(ranges: Iterable[tuple], gap: int) -> list:
    """Merges sorted (start, end) ranges whose distance is below `gap` (touching ones always)."""
    out: list = []
    for s, e in ranges:
        if out and s - out[-1][1] < max(gap, 1):
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _append_runs(ranges: list, runs: list, gap: int) -> None:
    """Appends sorted runs that start after every range in `ranges`, coalescing in place
    (only the seam and the new runs are looked at: linear in the number of runs)."""
    if not runs:
        return
    merged = coalesce(runs, gap)
    if ranges and merged[0][0] - ranges[-1][1] < max(gap, 1):
        ranges[-1] = (ranges[-1][0], max(ranges[-1][1], merged[0][1]))
        merged = merged[1:]
    ranges.extend(merged)


def _runs_numpy(a, b, base: int):
    import numpy as np
    x = np.frombuffer(a, dtype=np.uint8)
    y = np.frombuffer(b, dtype=np.uint8)
    neq = x != y
    changed = int(np.count_nonzero(neq))
    if not changed:
        return [], 0
    padded = np.empty(len(neq) + 2, dtype=np.bool_)
    padded[0] = padded[-1] = False
    padded[1:-1] = neq
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    starts, ends = edges[0::2], edges[1::2]
    return [(base + int(s), base + int(e)) for s, e in zip(starts, ends)], changed


def _runs_python(a, b, base: int):
    """Exact differing runs without numpy: equal slices are skipped with one memcmp; unequal
    ones are bisected down to 16 bytes."""
    runs: list = []
    changed = 0

    def walk(lo: int, hi: int) -> None:
        nonlocal changed
        if a[lo:hi] == b[lo:hi]:
            return
        if hi - lo <= 16:
            for i in range(lo, hi):
                if a[i] != b[i]:
                    changed += 1
                    if runs and runs[-1][1] == base + i:
                        runs[-1][1] += 1
                    else:
                        runs.append([base + i, base + i + 1])
            return
        mid = (lo + hi) // 2
        walk(lo, mid)
        walk(mid, hi)

    block = 4096
    for lo in range(0, len(a), block):
        walk(lo, min(len(a), lo + block))
    return [(s, e) for s, e in runs], changed


_HAVE_NUMPY: Optional[bool] = None     # imported on first diff (it slows every command)


def _numpy_available() -> bool:
    global _HAVE_NUMPY
    if _HAVE_NUMPY is None:
        try:
            import numpy  # noqa: F401
            _HAVE_NUMPY = True
        except ImportError:
            _HAVE_NUMPY = False
    return _HAVE_NUMPY


def diff_bytes(a, b, base: int = 0, *, use_numpy: Optional[bool] = None):
    """(runs, changed): exact (start, end) runs where equal-length a and b differ (offsets
    shifted by base) and the number of differing bytes."""
    if len(a) != len(b):
        raise ValueError("diff_bytes needs equal lengths")
    if a == b:
        return [], 0
    if use_numpy if use_numpy is not None else _numpy_available():
        return _runs_numpy(a, b, base)
    return _runs_python(memoryview(a), memoryview(b), base)


def diff_buffer(read_a: Callable, read_b: Callable, size_a: int, size_b: int, *,
                gap: int = 16, window: int = WINDOW, on_progress=lambda n: None) -> dict:
    """Compares two buffers through read(offset, length) callables, window by window."""
    common = min(size_a, size_b)
    ranges: list = []
    changed = 0
    off = 0
    while off < common:
        n = min(window, common - off)
        runs, c = diff_bytes(read_a(off, n), read_b(off, n), off)
        changed += c
        _append_runs(ranges, runs, gap)
        off += n
        on_progress(n)
    if size_a != size_b:
        lo, hi = common, max(size_a, size_b)
        changed += hi - lo
        _append_runs(ranges, [(lo, hi)], gap)
    status = "changed" if changed else "unchanged"
    if size_a != size_b:
        status = "resized"
    return {"status": status, "changed_bytes": changed,
            "ranges": [[s, e - s] for s, e in ranges]}


def cmd_diff(args) -> int:
    with _open(args) as store:
        a = store.get(_resolve(store, args.id1))
        b = store.get(_resolve(store, args.id2))
        names = list(dict.fromkeys(list(a.sizes) + list(b.sizes)))
        if args.buffer:
            missing = [n for n in args.buffer if n not in names]
            if missing:
                raise errors.CheckpointNotFound(
                    f"no buffer {missing[0]!r} in checkpoint {a.id} or {b.id}")
            names = [n for n in names if n in args.buffer]
        total = sum(min(a.sizes[n], b.sizes[n]) for n in names if n in a.sizes and n in b.sizes)
        results = []
        with _progress(args, total, "diff") as bar:
            for name in names:
                entry = {"name": name, "size_from": a.sizes.get(name),
                         "size_to": b.sizes.get(name)}
                if name not in b.sizes:
                    entry.update(status="removed", changed_bytes=a.sizes[name], ranges=[])
                elif name not in a.sizes:
                    entry.update(status="added", changed_bytes=b.sizes[name], ranges=[])
                else:
                    entry.update(diff_buffer(
                        lambda o, n, _name=name: store.read(a.id, _name, o, n),
                        lambda o, n, _name=name: store.read(b.id, _name, o, n),
                        a.sizes[name], b.sizes[name], gap=args.gap, window=args.window,
                        on_progress=bar.update))
                results.append(entry)
    changed = sum(r["changed_bytes"] for r in results)
    if args.json:
        _print_json({"from": a.id, "to": b.id, "gap": args.gap, "changed_bytes": changed,
                     "buffers": results})
        return EXIT_OK
    print(f"diff {a.id} -> {b.id}")
    for r in results:
        name = r["name"]
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
            shown = r["ranges"] if args.max_ranges <= 0 else r["ranges"][:args.max_ranges]
            for off, length in shown:
                print(f"    {off}:{length}  ({human_bytes(length)})")
            if len(shown) < len(r["ranges"]):
                print(f"    ... {len(r['ranges']) - len(shown)} more (--max-ranges 0 or "
                      f"--json lists all)")
    n_changed = sum(1 for r in results if r["status"] != "unchanged")
    print(f"{changed:,} bytes ({human_bytes(changed)}) differ in {n_changed} of "
          f"{len(results)} buffer(s)")
    return EXIT_OK


# ---- restore -----------------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9._+=@,-]")


def safe_filenames(names: Iterable[str]) -> dict:
    """{buffer name: file name}: only [A-Za-z0-9._+=@,-], no leading dot, at most 200
    characters, and unique even on case-insensitive file systems."""
    out: dict = {}
    used: set = set()
    for name in names:
        base = _UNSAFE.sub("_", name)
        if not base or base.startswith("."):
            base = "_" + base
        base = base[:200]
        candidate, n = base, 1
        while candidate.lower() in used:
            n += 1
            candidate = f"{base}~{n}"
        used.add(candidate.lower())
        out[name] = candidate
    return out


def cmd_restore(args) -> int:
    to_stdout = args.out == "-"
    if to_stdout and args.json:
        raise UsageError("--out - writes raw bytes to stdout; it cannot be combined with --json")
    with _open(args) as store:
        info = store.get(_resolve(store, args.id))
        names = list(info.sizes)
        if args.buffer:
            for n in args.buffer:
                if n not in info.sizes:
                    raise errors.CheckpointNotFound(
                        f"checkpoint {info.id} has no buffer {n!r} (it has {sorted(names)})")
            names = list(dict.fromkeys(args.buffer))
        if to_stdout and len(names) != 1:
            raise UsageError(f"--out - needs exactly one buffer (use --buffer NAME; "
                             f"checkpoint {info.id} has {len(names)})")
        spans = {}
        for n in names:
            size = info.sizes[n]
            off, length = args.range if args.range else (0, None)
            length = size - off if length is None else length
            if off > size or off + length > size or length < 0:
                raise UsageError(f"range {off}:{length} exceeds buffer {n!r} of {size} bytes")
            spans[n] = (off, length)
        files = safe_filenames(names)
        if not to_stdout:
            os.makedirs(args.out, exist_ok=True)
            if not args.force:
                for n in names:
                    path = os.path.join(args.out, files[n])
                    if os.path.exists(path):
                        raise UsageError(f"{path} exists (use --force to overwrite)")
        total = sum(length for _, length in spans.values())
        written = []
        with _progress(args, total, "restore") as bar:
            for n in names:
                off, length = spans[n]
                if to_stdout:
                    sink = sys.stdout.buffer
                    _copy_out(store, info.id, n, off, length, sink, bar)
                    sink.flush()
                    continue
                path = os.path.join(args.out, files[n])
                tmp = os.path.join(args.out, f".{files[n]}.part")
                try:
                    with open(tmp, "wb") as f:
                        _copy_out(store, info.id, n, off, length, f, bar)
                    os.replace(tmp, path)
                except BaseException:
                    try:
                        os.unlink(tmp)
                    except OSError:
                        pass
                    raise
                written.append({"buffer": n, "path": path, "offset": off, "bytes": length})
    if to_stdout:
        return EXIT_OK
    if args.json:
        _print_json({"checkpoint": info.id, "out": os.path.abspath(args.out), "files": written})
        return EXIT_OK
    print(f"restored checkpoint {info.id} into {args.out}")
    for w in written:
        where = f" [{w['offset']}:{w['bytes']}]" if args.range else ""
        print(f"  {w['buffer']}{where} -> {w['path']} ({human_bytes(w['bytes'])})")
    return EXIT_OK


def _copy_out(store, cid: int, name: str, off: int, length: int, sink, bar) -> None:
    end = off + length
    while off < end:
        n = min(WINDOW, end - off)
        sink.write(store.read(cid, name, off, n))
        off += n
        bar.update(n)


# ---- maintenance ----------------------------------------------------------------------------
def cmd_rm(args) -> int:
    with _open(args, write=True) as store:
        ids = [store.get(_resolve(store, ref)).id for ref in args.ids]   # all exist, or none go
        ids = list(dict.fromkeys(ids))
        for cid in ids:
            store.delete(cid)
    if args.json:
        _print_json({"deleted": ids})
    else:
        print(f"deleted checkpoint{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}")
    return EXIT_OK


def cmd_tag(args) -> int:
    with _open(args, write=True) as store:
        fn = _need(store, "untag" if args.remove else "tag")
        cid = store.get(_resolve(store, args.id)).id
        for t in args.tags:
            fn(cid, t)
        info = store.get(cid)
    if args.json:
        _print_json({"id": cid, "tags": list(info.tags or ())})
    else:
        print(f"checkpoint {cid} tags: {', '.join(info.tags or ()) or '-'}")
    return EXIT_OK


def cmd_retain(args) -> int:
    if args.keep_last is None and args.keep_every is None:
        raise UsageError("retain needs --keep-last N and/or --keep-every K")
    with _open(args, write=True) as store:
        fn = _need(store, "retain")
        streams = args.stream or store.streams()
        deleted = {}
        for s in streams:
            deleted[s] = list(fn(s, keep_last=args.keep_last, keep_every=args.keep_every,
                                 keep_tagged=args.keep_tagged))
    if args.json:
        _print_json({"deleted": deleted,
                     "deleted_count": sum(len(v) for v in deleted.values())})
    else:
        for s, ids in deleted.items():
            print(f"{s}: deleted {len(ids)} checkpoint(s)"
                  + (f": {', '.join(map(str, ids))}" if ids else ""))
    return EXIT_OK


def cmd_compact(args) -> int:
    with _open(args, write=True) as store:
        fn = _need(store, "compact")
        with spinner("compacting", enabled=False if args.no_progress else None):
            opts = {}
            if args.threshold is not None:
                opts["threshold"] = args.threshold
            if args.max_chain is not None:
                opts["max_chain"] = args.max_chain
            report = dict(fn(**opts) or {})
    if args.json:
        _print_json(report)
        return EXIT_OK
    before, after = report.get("bytes_before"), report.get("bytes_after")
    title = "compacted"
    if isinstance(before, int) and isinstance(after, int):
        title = (f"compacted: {human_bytes(before)} -> {human_bytes(after)} "
                 f"({human_bytes(before - after)} freed)")
    _print_report(title, report)
    return EXIT_OK


def cmd_verify(args) -> int:
    with _open(args) as store:
        fn = _need(store, "verify")
        with spinner("verifying" + (" (deep)" if args.deep else ""),
                     enabled=False if args.no_progress else None):
            report = dict(fn(deep=args.deep) or {})
    problems = list(report.get("problems") or [])
    ok = bool(report.get("ok", not problems))
    if args.json:
        _print_json(report)
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
            print(f"  {p.get('kind', 'problem')}: {p.get('message', '')}"
                  + (f" ({'; '.join(where)})" if where else ""))
        _print_report("", {k: v for k, v in report.items() if k not in ("ok", "problems")})
    return EXIT_OK if ok else EXIT_PROBLEM


def cmd_stats(args) -> int:
    with _open(args) as store:
        report = store.stats()
    if args.json:
        _print_json(report)
    else:
        _print_report(f"store {_store_path(args)}", report)
    return EXIT_OK


# ---- bench --------------------------------------------------------------------------------------
def cmd_bench(args) -> int:
    from snapstore.bench import harness as bench
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise Problem("--plot needs matplotlib, which is not installed "
                          "(pip install matplotlib); nothing was run") from None
    methods = ["snapstore"] if args.no_baselines else args.methods
    workloads = [bench.Workload(size=args.size, buffers=args.buffers, dirty=d, pattern=p,
                                checkpoints=args.checkpoints, durability=args.durability,
                                chunking=args.chunking, compression=args.compression,
                                content=args.content, cache=args.cache, seed=args.seed,
                                restore_repeats=args.restore_repeats)
                 for p in args.pattern for d in args.dirty]
    try:
        for w in workloads:
            w.validate()
        if methods is not None:
            bench.available_methods(methods)
    except bench.BenchError as exc:
        raise UsageError(str(exc)) from None
    if args.dir is not None and not os.path.isdir(args.dir):
        raise UsageError(f"--dir {args.dir} is not a directory")
    where = args.dir or tempfile.gettempdir()
    if bench.fs_type(where) in ("tmpfs", "ramfs"):
        print(f"{PROG}: warning: {where} is on {bench.fs_type(where)}: fsync and disk figures "
              "are not those of a disk (use --dir on a real disk)", file=sys.stderr)
    steps = sum(bench.steps_per_workload(w, methods) for w in workloads)
    with _progress(args, steps, "bench", unit="steps") as bar:
        def tick(label: str) -> None:
            bar.label = f"bench {label}"
            bar.update(1)
        try:
            result = bench.run(workloads, methods=methods, workdir=args.dir, tick=tick,
                               argv=[PROG] + sys.argv[1:])
        except bench.BenchError as exc:
            raise Problem(str(exc)) from None
    if args.plot:
        bench.plot(result, args.plot)
    if args.save:
        with open(args.save, "w") as f:
            f.write(bench.to_json(result) + "\n")
    if args.json:
        sys.stdout.write(bench.to_json(result) + "\n")
    else:
        print(bench.format_table(result))
        if args.plot:
            print(f"plot written to {args.plot}")
    bad = [f"{name}" for wl in result["workloads"] for name, r in wl["results"].items()
           if r.get("available") and r.get("verified") is False]
    if bad:
        raise Problem(f"restored bytes did not match for: {', '.join(bad)}")
    return EXIT_OK


# ---- entry point ------------------------------------------------------------------------------
def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("SNAPSTORE_DEBUG", "") not in ("", "0")
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        debug = debug or args.debug
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return EXIT_USAGE
        return int(args.func(args))
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into e.g. `head` that exited: not an error. Keep Python quiet at exit.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return EXIT_OK
    except (UsageError, Problem, errors.SnapstoreError, OSError) as exc:
        if debug:
            traceback.print_exc()
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return exit_code_for(exc)
    except Exception as exc:   # a bug: say so, in one line unless --debug
        if debug:
            traceback.print_exc()
        print(f"{PROG}: error: internal error: {type(exc).__name__}: {_one_line(exc)}"
              + ("" if debug else " (run with --debug for the traceback)"), file=sys.stderr)
        return EXIT_PROBLEM


if __name__ == "__main__":   # pragma: no cover
    sys.exit(main())
