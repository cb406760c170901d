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
from snapstore.engine import format as fmt
from snapstore.cli import (bench_cmd, diff_cmd, inspect_cmds, maintain_cmds, restore_cmd,
                           write_cmds)
from snapstore.cli import export_cmd, transfer_cmds
from snapstore.cli.args import (STORE_RULE, Parser, add_global_options,
                                add_store_positional, command_options, parse_command_line)
from snapstore.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, PROG, Problem, UsageError
from snapstore.cli.output import print_json, terminal_safe_output
from snapstore.version import __version__

EPILOG = f"""\
{STORE_RULE}

Any number of writers (commands and programs) write a store at once. What needs the store to
itself locks them out: creating it, upgrading its format, `repair` (which waits for every
writer to close) and writers of an older snapstore. Compactions (compact, retain's prune) run
one at a time, and verify waits for a running one. A command kept out fails at once, exit 1,
naming the holder's pid, host and since-when; --timeout SECONDS waits for it first. ls, show,
restore, diff and stats take no lock, nor does anything on an S3 store (s3://BUCKET/PREFIX):
gc deletes its garbage while its writers write.

checkpoint names (show, restore, diff, rm, tag), in this order of precedence:
  7              the checkpoint id, as `ls` shows it (digits are always an id)
  latest         the newest checkpoint of the store
  latest:STREAM  the newest checkpoint of STREAM (STREAM verbatim, may hold : or @)
  tag:TAG        the checkpoint tagged TAG          dcp:ID   the DCP checkpoint_id ID
  STREAM@SEQ     checkpoint number SEQ of STREAM (1, 2, 3... as taken; split at the last @)
  NAME           a tag, a stream name (its newest checkpoint) or a DCP checkpoint_id
A name that matches several checkpoints is an error listing them (name one by id or
STREAM@SEQ); a tag on two checkpoints is ambiguous. Sizes accept suffixes K, M, G, T (powers
of 1024; KiB/MiB/... and KB/MB/... mean the same).

exit status:
  0  success
  1  a problem was found or the operation failed: `verify` found damage, the store is
     corrupt, locked (see above), or an I/O error happened
  2  usage error: bad arguments, no such store / checkpoint / buffer, an invalid option value
  130  interrupted (Ctrl-C)

Errors are printed as one line `snapstore: error: ...` on stderr; --debug (or
SNAPSTORE_DEBUG=1) adds the Python traceback. Progress bars are drawn on stderr only when it
is a terminal (SNAPSTORE_PROGRESS=0 or --no-progress turns them off).

examples:
  snapstore init ckpts
  snapstore ls ckpts --stream train --where 'step>=100'
  snapstore show ckpts best
  snapstore diff ckpts 3 latest
  snapstore restore ckpts train@12 --out restored/
  snapstore rm ckpts 4 --timeout 30
  SNAPSTORE_STORE=ckpts snapstore verify --deep --json
  snapstore repair ckpts
  snapstore bench --size 1GiB --dirty 0.001,0.01,0.1 --plot overhead.png
  snapstore copy ckpts backup               # only the chunks backup lacks
  snapstore export ckpts best -o best.snap  # a savepoint: one portable file
  snapstore import best.snap other-store
"""

# The commands in the order `snapstore --help` lists them: each adds its subparser.
COMMANDS = (write_cmds.add_init, inspect_cmds.add_ls, inspect_cmds.add_show, diff_cmd.add_diff,
            restore_cmd.add_restore, write_cmds.add_rm, write_cmds.add_tag,
            write_cmds.add_retain, maintain_cmds.add_compact, maintain_cmds.add_gc,
            maintain_cmds.add_verify,
            maintain_cmds.add_repair, inspect_cmds.add_stats, bench_cmd.add_bench,
            export_cmd.add_export, transfer_cmds.add_copy, transfer_cmds.add_import)

# Store errors that mean "you asked for something that does not exist or is invalid".
_USAGE_ERRORS = (UsageError, errors.CheckpointNotFound, errors.InvalidArgumentError,
                 errors.FormatError)


def exit_code_for(exc: BaseException) -> int:
    """EXIT_USAGE for a usage error (bad arguments, no such checkpoint...), else EXIT_PROBLEM
    (damage too: a damaged FORMAT file is a FormatError that is a CorruptionError)."""
    if isinstance(exc, _USAGE_ERRORS) and not isinstance(exc, errors.CorruptionError):
        return EXIT_USAGE
    return EXIT_PROBLEM


class _ShowVersion(Exception):
    """--version was given: print the version, nothing else (what comes after it on the
    command line is not looked at, as with argparse's own version action)."""


class _VersionAction(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        raise _ShowVersion()


def build_parser(store_positional: bool = True) -> argparse.ArgumentParser:
    """The `snapstore` parser: global options, then one subparser per command (COMMANDS).
    With store_positional, every command that opens a store takes the store as its first
    positional argument (required: parse_command_line also parses without it)."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = Parser(prog=PROG, description="snapstore: incremental snapshots of in-memory "
                    "state. Inspect, restore and maintain a store; benchmark checkpoint "
                    "overhead.", epilog=EPILOG, formatter_class=raw)
    parser.add_argument("--version", action=_VersionAction,
                        help="print the version (with --json: and the on-disk format it "
                        "writes) and exit")
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    common = command_options()

    def add(name, help_, func, *, parents=(common,), description=None):
        """Adds the subparser of one command, running func(args) -> exit code."""
        p = sub.add_parser(name, help=help_, description=description or help_,
                           parents=list(parents), formatter_class=raw,
                           epilog=STORE_RULE if common in parents else None)
        p.set_defaults(func=func, takes_store=common in parents)
        if store_positional and common in parents:
            add_store_positional(p)
        return p

    for add_command in COMMANDS:
        add_command(add)
    return parser


def _print_version(as_json: bool) -> int:
    """`snapstore --version`: "snapstore X.Y.Z", or with --json {"version", "format_version":
    the on-disk format this library writes (and the newest it reads)}."""
    if as_json:
        print_json({"version": __version__, "format_version": fmt.FORMAT_VERSION})
    else:
        print(f"{PROG} {__version__}")
    return EXIT_OK


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, errors.StoreLocked):
        text = _locked_message(exc)
    else:
        text = str(exc).strip() or type(exc).__name__
    return " ".join(text.split())


# The command line's advice per lock that kept a command out (StoreLocked.lock).
_LOCKED_ADVICE = {
    "store": "Wait for it with --timeout SECONDS; reading commands (ls, show, restore, diff, "
             "verify, stats) work meanwhile.",
    "writers": "Close its writers, or wait for them with --timeout SECONDS.",
    "maintenance": "Wait for it with --timeout SECONDS.",
}


def _locked_message(exc: errors.StoreLocked) -> str:
    """StoreLocked with command-line advice (the exception's own gives Python's)."""
    advice = _LOCKED_ADVICE.get(exc.lock)
    if exc.reason is None or advice is None:
        return str(exc)
    return f"{exc.reason} {advice}"


def main(argv: Optional[list] = None) -> int:
    """Runs the command line on argv (default: sys.argv[1:]); returns the exit status. What
    it prints is terminal-safe (snapstore.cli.output)."""
    with terminal_safe_output():
        return _run(argv)


def _run(argv: Optional[list]) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("SNAPSTORE_DEBUG", "") not in ("", "0")
    # until the arguments are parsed (argparse takes --js for --json too)
    as_json = any(len(a) >= 3 and "--json".startswith(a) for a in argv)
    try:
        try:
            args = parse_command_line(build_parser, argv)
        except _ShowVersion:        # printed under the handlers below (a closed or full stdout)
            return _print_version(as_json)
        debug = debug or args.debug
        as_json = bool(args.json)
        if not getattr(args, "func", None):
            build_parser().print_help(sys.stderr)
            return _error("no command given", EXIT_USAGE, as_json) if as_json else EXIT_USAGE
        return int(args.func(args))
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        _print_to_stderr(f"{PROG}: interrupted")
        if as_json:
            _print_error_json({"error": "interrupted", "exit_status": 130})
        return 130
    except BrokenPipeError:
        # Output piped into e.g. `head` that exited: not an error. Keep Python quiet at exit.
        _quiet_stdout()
        return EXIT_OK
    except (UsageError, Problem, errors.SnapstoreError, OSError) as exc:
        if debug:
            traceback.print_exc()
        return _error(_one_line(exc), exit_code_for(exc), as_json)
    except Exception as exc:   # a bug: say so, in one line unless --debug
        if debug:
            traceback.print_exc()
        return _error(f"internal error: {type(exc).__name__}: {_one_line(exc)}"
                      + ("" if debug else " (run with --debug for the traceback)"),
                      EXIT_PROBLEM, as_json)


def _error(message: str, status: int, as_json: bool) -> int:
    """Reports an error: one `snapstore: error:` line on stderr and, with --json, the document
    {"error": message, "exit_status": status} on stdout (so a program reading stdout gets JSON
    either way). Returns status."""
    _print_to_stderr(f"{PROG}: error: {message}")
    if as_json:
        _print_error_json({"error": message, "exit_status": status})
    return status


def _print_to_stderr(line: str) -> None:
    """One line on stderr; a closed stderr (`2>&-`) loses it quietly, the exit status stays."""
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def _print_error_json(doc: dict) -> None:
    """Prints an error's JSON document; a stdout that cannot take it (a pipe whose reader
    is gone, a full disk, a closed one) loses it quietly: the stderr line and the exit status
    say it all, where a traceback at exit did."""
    try:
        print_json(doc)
        sys.stdout.flush()
    except (OSError, ValueError):
        _quiet_stdout()


def _quiet_stdout() -> None:
    """Points stdout's descriptor at /dev/null, so that Python's flush at exit of what could
    not be written stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":   # pragma: no cover
    sys.exit(main())
