"""Argument parsing pieces every command shares: the parser class (one-line errors), the global
options, and the argument types (sizes, ranges, checkpoint ids, counts, fractions, lists)."""
from __future__ import annotations

import argparse
from typing import Callable, Iterable

from snapstore.cli.common import STORE_ENV, UsageError
from snapstore.formatting import parse_size


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (raised, so main() prints and exits 2)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


# dest -> default of the global options (on the main parser; see add_global_options).
GLOBAL_DEFAULTS = {"store": None, "timeout": 0.0, "json": False, "debug": False,
                   "no_progress": False}


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
        option("--timeout", dest="timeout", type=float, metavar="SECONDS",
               help="wait this long for another writer's lock (default 0)")
    option("--json", dest="json", action="store_true",
           help="print one JSON document instead of text")
    option("--debug", dest="debug", action="store_true", help="show Python tracebacks on errors")
    option("--no-progress", dest="no_progress", action="store_true",
           help="never draw progress bars")


def command_options(with_store: bool = True) -> argparse.ArgumentParser:
    """A parent parser with the global options for a command (they may follow its name)."""
    p = Parser(add_help=False)
    add_global_options(p, with_store=with_store, defaults=False)
    return p


# ---- argument types ------------------------------------------------------------------------
def size_arg(text: str) -> int:
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


def range_arg(text: str) -> tuple:
    try:
        return parse_range(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def id_arg(text: str):
    """A checkpoint id (int >= 0), 'latest' or 'latest:STREAM' (see common.resolve)."""
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
