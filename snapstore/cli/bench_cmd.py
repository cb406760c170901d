"""`snapstore bench`: runs the checkpoint-overhead benchmark (snapstore.bench) with options
from the command line and prints its table or JSON."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
import threading
import textwrap

from snapstore import bench
from snapstore.bench import measuring, runner, workloads
from snapstore.cli.args import (choice_list, command_options, count_arg, fraction_list,
                                size_arg)
from snapstore.cli.common import EXIT_OK, EXIT_PROBLEM, PROG, Problem, UsageError, progress
from snapstore.formatting import human_bytes, human_seconds

# A run whose plan is estimated to take at least this long says so before it starts.
ESTIMATE_NOTICE_SECONDS = 20


def add_bench(add) -> None:
    p = add("bench", "measure checkpoint overhead against baselines", cmd_bench,
            parents=(command_options(with_store=False),),
            description=textwrap.fill(
                "Measures snapstore's checkpoint overhead on a synthetic state, and the same "
                "figures for baselines run in this process on the same bytes: raw file write, "
                "pickle, numpy.save (each + fsync with --durability fsync), and, with --peers, "
                "restic / borg when they are on PATH. Every combination of --dirty and "
                "--pattern is one workload. The default (256 MiB, 1% scattered, 5 checkpoints, "
                "no peers) takes well under a minute; a run estimated to take longer than "
                f"{ESTIMATE_NOTICE_SECONDS} s says so on stderr before it starts.", 88) +
            "\n\nexamples:\n  snapstore bench --size 1GiB                 # the 1 GiB run"
            "\n  snapstore bench --dirty 0.001,0.01,0.1,0.5 --plot overhead.png"
            "\n  snapstore bench --peers                     # also restic and borg"
            "\n  snapstore bench --pattern shifted --chunking cdc --json > result.json")
    p.add_argument("--size", type=size_arg, default=workloads.DEFAULT_SIZE,
                   help="state size (default 256MiB)")
    p.add_argument("--buffers", type=count_arg, default=4, metavar="N",
                   help="number of buffers the state is split into (default 4)")
    p.add_argument("--dirty", type=fraction_list, default=[0.01], metavar="F[,F...]",
                   help="fraction of the state changed per checkpoint, e.g. 0.01 or 1%% "
                        "(a list sweeps it; default 0.01)")
    p.add_argument("--pattern", type=choice_list(workloads.PATTERNS), default=["scattered"],
                   metavar="P[,P...]", help="how the state changes: scattered pages, clustered "
                   "64-page runs, shifted (bytes inserted) or appended (default scattered)")
    p.add_argument("--checkpoints", type=count_arg, default=5, metavar="N",
                   help="incremental checkpoints after the first, full one (default 5)")
    p.add_argument("--durability", choices=workloads.DURABILITIES, default="fsync",
                   help="fsync (default): every method makes each checkpoint durable; "
                        "none: nobody syncs")
    p.add_argument("--chunking", choices=workloads.CHUNKINGS, default="pages",
                   help="snapstore's chunking: pages (default) or cdc (content-defined)")
    p.add_argument("--compression", choices=workloads.COMPRESSIONS, default="zstd",
                   help="snapstore's chunk compression (default zstd)")
    p.add_argument("--content", choices=workloads.CONTENTS, default="random",
                   help="random bytes (default, incompressible) or compressible (~2:1)")
    p.add_argument("--cache", choices=workloads.CACHE_MODES, default="cold",
                   help="restore from a cold (default: files dropped from the page cache) or "
                        "warm page cache")
    p.add_argument("--restore-repeats", type=count_arg, default=3, metavar="N",
                   help="time each restore N times and keep the median (default 3)")
    p.add_argument("--methods", type=choice_list(runner.METHODS), default=None,
                   metavar="M[,M...]", help=f"methods to run (default "
                   f"{','.join(runner.DEFAULT_METHODS)}; unavailable ones are skipped)")
    p.add_argument("--peers", action="store_true",
                   help=f"also run the backup tools {' and '.join(runner.PEERS)} (when on "
                   "PATH); each pass over the state through a tool takes seconds, so they are "
                   "not in the default run")
    p.add_argument("--no-baselines", action="store_true", help="run snapstore only")
    p.add_argument("--dir", default=None, help="where to write (default: the temp dir); "
                   "use a real disk, not tmpfs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", metavar="FILE.json",
                   help="also write the --json result to FILE.json (the table still prints)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="plot median checkpoint time and bytes written vs dirty fraction "
                        "(needs matplotlib)")


def _methods(args):
    """The methods to run from --methods / --peers / --no-baselines (None: the default)."""
    if args.no_baselines:
        if args.peers or args.methods:
            raise UsageError("--no-baselines runs snapstore only: drop --peers / --methods")
        return ["snapstore"]
    if not args.peers:
        return args.methods
    chosen = list(runner.DEFAULT_METHODS if args.methods is None else args.methods)
    return chosen + [p for p in runner.PEERS if p not in chosen]


# The kernel follows at most this many symbolic links in one path (ELOOP beyond).
_MAX_SYMLINKS = 40


def _check_output(path: str, option: str) -> None:
    """UsageError, before anything is run, for an output file that open(path, "w") would
    refuse. The path is checked as given, the way the kernel resolves it, not normalised:
    "missing/../r.json" needs missing/ to exist, and a trailing slash names a directory. A
    symlink is followed (a dangling one is written through: open() creates its target)."""
    given = path
    for _ in range(_MAX_SYMLINKS):
        if path.endswith(("/", os.sep)) or os.path.basename(path) in (".", ".."):
            raise UsageError(f"{option} {given} names a directory; name a file")
        if os.path.isdir(path):
            raise UsageError(f"{option} {given} is a directory; name a file")
        if not os.path.islink(path) or os.path.exists(path):
            break
        path = os.path.join(os.path.dirname(path), os.readlink(path))   # dangling symlink
    else:
        raise UsageError(f"{option} {given}: too many levels of symbolic links")
    where = os.path.dirname(path) or os.curdir
    shown = f"{given} (a symlink to {path})" if path != given else given
    if not os.path.isdir(where):
        raise UsageError(f"{option} {shown}: the directory {_first_missing(where)} does not "
                         "exist (the path is resolved as written: every directory it names "
                         "must exist, even one followed by ..)")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise UsageError(f"{option} {shown} is not writable")
    elif not os.access(where, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {shown}: the directory {where} is not writable")


def _first_missing(where: str) -> str:
    """The shortest leading part of the directory path `where` that is not a directory."""
    parts = where.split(os.sep)
    for n in range(1, len(parts) + 1):
        head = os.sep.join(parts[:n]) or os.sep
        if not os.path.isdir(head):
            return head
    return where


def _check_plot(path: str) -> None:
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        raise Problem("--plot needs matplotlib, which is not installed "
                      "(pip install matplotlib); nothing was run") from None
    kinds = FigureCanvasBase.get_supported_filetypes()
    ext = os.path.splitext(path)[1].lstrip(".").lower()
    if ext not in kinds:
        raise UsageError(f"--plot {path}: the file name must end in one of "
                         f"{', '.join('.' + k for k in sorted(kinds))} (the image format)")
    _check_output(path, "--plot")


@contextlib.contextmanager
def _terminate_as_interrupt():
    """SIGTERM (a `timeout`, a CI job cancelled, `docker stop`) stops the run as Ctrl-C
    does, so its checkpoint files are removed on the way out (Python's default for SIGTERM
    exits without running any cleanup: several GiB left in the temp directory)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def cmd_bench(args) -> int:
    if args.plot:
        _check_plot(args.plot)
    if args.save:
        _check_output(args.save, "--save")
    methods = _methods(args)
    loads = [bench.Workload(size=args.size, buffers=args.buffers, dirty=d, pattern=p,
                            checkpoints=args.checkpoints, durability=args.durability,
                            chunking=args.chunking, compression=args.compression,
                            content=args.content, cache=args.cache, seed=args.seed,
                            restore_repeats=args.restore_repeats)
             for p in args.pattern for d in args.dirty]
    try:
        plan = runner.plan(loads, methods)
    except bench.BenchError as exc:
        raise UsageError(str(exc)) from None
    if args.dir is not None and not os.path.isdir(args.dir):
        raise UsageError(f"--dir {args.dir} is not a directory")
    where = args.dir or tempfile.gettempdir()
    fs = measuring.fs_type(where)
    if fs in ("tmpfs", "ramfs"):
        print(f"{PROG}: warning: {where} is on {fs}: fsync and disk figures are not those "
              "of a disk (use --dir on a real disk)", file=sys.stderr)
    free = measuring.free_space(where)
    if free is not None and plan.disk_bytes > free:
        print(f"{PROG}: warning: this run writes about {human_bytes(plan.disk_bytes)} (a rough "
              f"estimate) and {where} has {human_bytes(free)} free: a baseline that runs out "
              "is reported as failed, snapstore running out stops the run", file=sys.stderr)
    if plan.seconds >= ESTIMATE_NOTICE_SECONDS:
        print(f"{PROG}: bench: {len(plan.methods)} method(s) x {len(loads)} workload(s), "
              f"about {human_seconds(plan.seconds)} (a rough estimate; longer on a busy "
              "machine or a slow disk)", file=sys.stderr)
    with progress(args, plan.steps, "bench", unit="steps") as bar:
        def tick(label: str) -> None:
            bar.label = f"bench {label}"
            bar.update(1)
        try:
            with _terminate_as_interrupt():
                result = bench.run(loads, methods=methods, workdir=args.dir, tick=tick,
                                   argv=[PROG] + sys.argv[1:])
        except bench.BenchError as exc:
            raise Problem(str(exc)) from None
    # the files are written first, but an error writing them (checked before the run, yet
    # the disk may fill or the directory go) is told only after the results are printed:
    # a run is never lost
    errors = []
    if args.plot and not _write_output("--plot", args.plot, errors,
                                       lambda: bench.plot(result, args.plot)):
        args.plot = None
    if args.save:
        def save():
            with open(args.save, "w") as f:
                f.write(bench.to_json(result) + "\n")
        _write_output("--save", args.save, errors, save)
    if args.json:
        sys.stdout.write(bench.to_json(result) + "\n")
    else:
        print(bench.format_table(result))
        if args.plot:
            print(f"plot written to {args.plot}")
    bad = [f"{name}" for wl in result["workloads"] for name, r in wl["results"].items()
           if r.get("available") and r.get("verified") is False]
    if bad:
        errors.append(f"restored bytes did not match for: {', '.join(bad)}")
    # the results are out already (a mismatch is in them as "verified": false): one line on
    # stderr per error, never a second JSON document on stdout
    for message in errors:
        print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_PROBLEM if errors else EXIT_OK


def _write_output(option: str, path: str, errors: list, write) -> bool:
    """Runs write(); False, with a message added to errors, if it fails."""
    try:
        write()
    except (OSError, bench.BenchError) as exc:
        errors.append(f"{option} {path}: could not write it: {exc} (the results are "
                      "printed on stdout)")
        return False
    return True
