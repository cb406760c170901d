"""The ``snapstore`` command line (also ``python -m snapstore``): the parser, dispatch to the
commands, exit codes and error printing.

Every command is a thin layer over the public Store API; see ``snapstore --help`` and
``snapstore COMMAND --help``. Output meant for people goes to stdout, ``--json`` replaces it with
one JSON document, errors are one line on stderr and progress bars appear only on a terminal.
Each command lives in a module of this package with the function that declares its options
(``add_<command>``) next to the one that runs it (``cmd_<command>``).
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from typing import Optional

from snapstore import errors
from snapstore.cli import (bench_cmd, diff_cmd, inspect_cmds, maintain_cmds, restore_cmd,
                           write_cmds)
from snapstore.cli import export_cmd
from snapstore.cli.args import Parser, add_global_options, command_options
from snapstore.cli.common import (EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, PROG, STORE_ENV, Problem,
                                  UsageError)
from snapstore.cli.output import terminal_safe_output
from snapstore.version import __version__

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
  snapstore repair ckpts
  snapstore bench --size 1GiB --dirty 0.001,0.01,0.1 --plot overhead.png
"""

# The commands in the order `snapstore --help` lists them: each adds its subparser.
COMMANDS = (write_cmds.add_init, inspect_cmds.add_ls, inspect_cmds.add_show, diff_cmd.add_diff,
            restore_cmd.add_restore, write_cmds.add_rm, write_cmds.add_tag,
            write_cmds.add_retain, maintain_cmds.add_compact, maintain_cmds.add_verify,
            maintain_cmds.add_repair, inspect_cmds.add_stats, bench_cmd.add_bench,
            export_cmd.add_export)

# Store errors that mean "you asked for something that does not exist or is invalid".
_USAGE_ERRORS = (UsageError, errors.CheckpointNotFound, errors.InvalidArgumentError,
                 errors.FormatError)


def exit_code_for(exc: BaseException) -> int:
    """EXIT_USAGE for a usage error (bad arguments, no such checkpoint...), else EXIT_PROBLEM."""
    if isinstance(exc, _USAGE_ERRORS):
        return EXIT_USAGE
    return EXIT_PROBLEM


def build_parser() -> argparse.ArgumentParser:
    """The `snapstore` parser: global options, then one subparser per command (COMMANDS)."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = Parser(prog=PROG, description="snapstore: incremental snapshots of in-memory "
                    "state. Inspect, restore and maintain a store; benchmark checkpoint "
                    "overhead.", epilog=EPILOG, formatter_class=raw)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    common = command_options()

    def add(name, help_, func, *, parents=(common,), description=None):
        """Adds the subparser of one command, running func(args) -> exit code."""
        p = sub.add_parser(name, help=help_, description=description or help_,
                           parents=list(parents), formatter_class=raw)
        p.set_defaults(func=func)
        return p

    for add_command in COMMANDS:
        add_command(add)
    return parser


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


def main(argv: Optional[list] = None) -> int:
    """Runs the command line on argv (default: sys.argv[1:]); returns the exit status. What
    it prints is terminal-safe (snapstore.cli.output)."""
    with terminal_safe_output():
        return _run(argv)


def _run(argv: Optional[list]) -> int:
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
