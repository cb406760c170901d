"""Argument parsing pieces every command shares: the parser class (one-line errors), the global
options, and the argument types (sizes, ranges, checkpoint ids, counts, fractions, lists)."""
from __future__ import annotations

import argparse
import math
import os
from typing import Callable, Iterable

from snapstore.cli.common import STORE_ENV, UsageError, is_store_dir, same_path
from snapstore.engine.validation import validate_checkpoint_id
from snapstore.errors import InvalidArgumentError
from snapstore.formatting import parse_size


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised, so main() prints and exits 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


# dest -> default of the global options (on the main parser; see add_global_options).
GLOBAL_DEFAULTS = {"store": None, "timeout": 0.0, "remote_timeout": None, "json": False,
                   "debug": False, "no_progress": False}


def add_global_options(parser: argparse.ArgumentParser, *, with_store: bool = True,
                       defaults: bool = True) -> None:
    """Adds -s/--store and --timeout (when with_store), --json, --debug and --no-progress.

    The main parser has them with their defaults (GLOBAL_DEFAULTS); every command's parser
    has them again without defaults (defaults=False), so they may follow the command name and
    one given before it is not reset by the command's parser."""
    def option(*flags: str, dest: str, **kw) -> None:
        kw["default"] = GLOBAL_DEFAULTS[dest] if defaults else argparse.SUPPRESS
        parser.add_argument(*flags, dest=dest, **kw)

    if with_store:
        option("-s", "--store", dest="store", metavar="PATH",
               help=f"the store directory (default: ${STORE_ENV})")
        option("--timeout", dest="timeout", type=seconds_arg, metavar="SECONDS",
               help="wait this long for a lock: one held by an operation that needs the "
                    "store to itself (creation, format upgrade, repair), the open writers "
                    "(repair), or a running compaction (compact, retain, verify) (default 0: "
                    "fail at once)")
        option("--remote-timeout", dest="remote_timeout", type=seconds_arg,
               metavar="SECONDS",
               help="S3 stores: how long a request is retried (refused connections, "
                    "timeouts, 5xx answers) before the command fails (default 120)")
    option("--json", dest="json", action="store_true",
           help="print one JSON document instead of text")
    option("--debug", dest="debug", action="store_true", help="show Python tracebacks on errors")
    option("--no-progress", dest="no_progress", action="store_true",
           help="never draw progress bars")


def command_options(with_store: bool = True) -> argparse.ArgumentParser:
    """A parent parser with the global options for a command (they may follow its name)."""
    p = Parser(add_help=False)
    add_global_options(p, with_store=with_store, defaults=False)
    if not with_store:      # (-s before such a command would be ignored: parse_command_line)
        p.set_defaults(refuses_store_option=True)
    return p


# ---- the store as a positional argument -----------------------------------------------------
STORE_RULE = f"""\
the store: `snapstore COMMAND [STORE] ARGS...` (`snapstore ls ckpts`, `snapstore show ckpts 7`),
or -s/--store PATH (before or after the command), or ${STORE_ENV}. The first argument is
STORE when the command gets one more argument than it takes, when neither -s nor
${STORE_ENV} is set, or (rm, tag: any number of arguments) when it is a store directory.
STORE wins over ${STORE_ENV}; STORE and a different -s are a usage error (exit 2)."""


def add_store_positional(parser: argparse.ArgumentParser) -> None:
    """Adds the STORE positional, first (before the command's own positionals)."""
    parser.add_argument("store_arg", metavar="[STORE]",
                        help=f"the store directory (may be left out when -s/--store or "
                             f"${STORE_ENV} gives it)")


def parse_command_line(build: Callable[[bool], argparse.ArgumentParser], argv: list,
                       environ=os.environ) -> argparse.Namespace:
    """Parses argv with the positional-store rule (STORE_RULE): build(True) is the parser
    whose store-taking commands start with a STORE positional (add_store_positional),
    build(False) the one without it. Both parse argv; the rule picks one result. On return
    args.store is the store named on the command line (or None: $SNAPSTORE_STORE applies) and
    args.store_source says how ("-s", "argument" or None). UsageError as the rule says."""
    with_store, err_with = _try_parse(build(True), argv)
    without, err_without = _try_parse(build(False), argv)
    env = environ.get(STORE_ENV) or None
    if with_store is None and without is None:
        named = env or _mentions_store_option(argv)
        raise err_without if named else err_with
    if without is not None and not getattr(without, "takes_store", False):
        # no command, or one without a store (bench, copy: -s there would be ignored)
        if getattr(without, "refuses_store_option", False) and without.store:
            raise UsageError(f"snapstore {without.command} takes no -s/--store"
                             + (": name SRC and DST" if without.command == "copy" else ""))
        return _settled(without, None)
    flag = (with_store or without).store
    if with_store is not None and without is not None:      # the count cannot tell
        positional = not (flag or env) or is_store_dir(with_store.store_arg)
        chosen = with_store if positional else without
    else:
        chosen = with_store or without
    if chosen is without:
        if not (flag or env):
            if err_with is not None and any(is_store_dir(t) for t in argv):
                raise err_with                  # the store is there, an argument is missing
            raise UsageError(f"no store given: name it first (snapstore {without.command} "
                             f"STORE ...), or use -s/--store PATH or set ${STORE_ENV}")
        return _settled(without, "-s" if flag else None)
    if flag and not same_path(flag, chosen.store_arg):
        raise UsageError(f"two different stores given: -s {flag} and {chosen.store_arg} "
                         "(give one)")
    chosen.store = chosen.store_arg
    return _settled(chosen, "argument")


# A command whose last positional is optional names it with set_defaults(late_positional=
# dest): Python's argparse before 3.12 consumes a required positional and an optional one
# that follows it together, at the first positional argument, so in `snapstore import FILE
# --stream S STORE` STORE was "unrecognized". One such leftover argument is taken as it.
LATE_POSITIONAL = "late_positional"


def _try_parse(parser: argparse.ArgumentParser, argv: list):
    """(namespace, None) or (None, the UsageError)."""
    try:
        args, extras = parser.parse_known_args(argv)
        late = getattr(args, LATE_POSITIONAL, None)
        if late is not None:
            delattr(args, LATE_POSITIONAL)
            if len(extras) == 1 and getattr(args, late) is None \
                    and not extras[0].startswith("-"):
                setattr(args, late, extras.pop())
        if extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return args, None
    except UsageError as exc:
        return None, exc


def _settled(args: argparse.Namespace, source) -> argparse.Namespace:
    if hasattr(args, "store_arg"):
        del args.store_arg
    args.store_source = source
    return args


def _mentions_store_option(argv: list) -> bool:
    """Whether argv gives -s/--store (only to pick which parse error to report)."""
    for token in argv:
        if token == "--":
            return False
        if token in ("-s", "--store") or token.startswith("--store=") or \
                (token.startswith("-s") and not token.startswith("--")):
            return True
    return False


# ---- argument types ------------------------------------------------------------------------
def size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except (ValueError, OverflowError):      # OverflowError: more digits than a float holds
        raise argparse.ArgumentTypeError(f"invalid size {text!r} (use e.g. 4096, 64KiB, "
                                         "256MiB, 1GiB)") from None


def size_between(low: int, high: int) -> Callable[[str], int]:
    """An argument type: a size (as size_arg) from low to high bytes."""
    def parse(text: str) -> int:
        value = size_arg(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"size {text!r} must be from {low} to {high} "
                                             "bytes")
        return value
    return parse


def seconds_arg(text: str) -> float:
    """A duration in seconds: a number >= 0 ('inf': forever)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds {text!r}") from None
    if math.isnan(value) or value < 0:
        raise argparse.ArgumentTypeError(f"seconds must be >= 0, got {text!r}")
    return value


def parse_range(text: str) -> tuple:
    """'OFF:LEN' -> (offset, length); 'OFF:' -> (offset, None) (to the end); ':LEN' -> (0, LEN)."""
    if ":" not in text:
        raise ValueError(f"invalid range {text!r} (use OFF:LEN, OFF: or :LEN)")
    off_s, len_s = text.split(":", 1)
    offset = parse_size(off_s) if off_s.strip() else 0
    length = parse_size(len_s) if len_s.strip() else None
    return offset, length


def range_arg(text: str) -> tuple:
    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    except OverflowError:                    # more digits than a float holds
        raise argparse.ArgumentTypeError(f"invalid range {text!r}: a size is too large") \
            from None


# The help of every argument naming a checkpoint (show, restore, diff, rm, tag).
NAME_HELP = ("checkpoint: an id, latest, latest:STREAM, STREAM@SEQ, a tag (or tag:T), a stream "
             "name (its newest) or a DCP checkpoint_id (or dcp:ID)")


def id_arg(text: str):
    """A checkpoint name (resolved by common.resolve, so Store.resolve): digits only -> the
    int id; any other non-empty text as is (latest, latest:STREAM, STREAM@SEQ, a tag, a stream,
    a DCP checkpoint_id). A stream or tag spelled in digits is named latest:42 / tag:42."""
    t = text.strip()
    if t.isascii() and t.isdigit():
        try:
            return validate_checkpoint_id(int(t))
        except InvalidArgumentError as exc:
            raise argparse.ArgumentTypeError(f"invalid checkpoint id {text!r} ({exc})") from None
    if not text or (t[:1] in "+-" and t[1:].isascii() and t[1:].isdigit()):
        raise argparse.ArgumentTypeError(f"invalid checkpoint {text!r} ({NAME_HELP})")
    return text


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An argument type: an integer >= minimum."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid count {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {minimum}")
        return value
    return parse


count_arg = int_at_least(1)
nonneg_arg = int_at_least(0)


def fraction_list(text: str) -> list:
    """'0.01,1%' -> [0.01, 0.01]: fractions from 0 to 1, as numbers or percentages."""
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


def choice_list(choices: Iterable[str]) -> Callable[[str], list]:
    """An argument type: a comma-separated, non-empty list of some of `choices`."""
    choices = tuple(choices)

    def parse(text: str) -> list:
        items = [p.strip() for p in text.split(",") if p.strip()]
        bad = [p for p in items if p not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(
                f"invalid choice {','.join(bad) or text!r} (choose from {', '.join(choices)})")
        return items
    return parse
