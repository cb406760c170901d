"""Values as the tools (the command line and the bench harness) show them to people and to
JSON readers: sizes and durations for people, sizes typed by people, text tables, strict JSON.

A leaf module: it imports nothing from snapstore, so both tools share it without the bench
harness depending on the command line.
"""
from __future__ import annotations

import math
import re
import sys
from fractions import Fraction
from typing import Any, Iterable

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([kmgtp]?)(?:i?b)?\s*$", re.IGNORECASE)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; exact below 1 KiB."""
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    if n < 1024:
        return f"{sign}{int(n)} B"
    for unit in _UNITS[1:]:
        n /= 1024.0
        if n < 1024 or unit == _UNITS[-1]:
            return f"{sign}{n:.1f} {unit}"
    raise AssertionError("unreachable")


def human_seconds(s: float) -> str:
    """0.0123 -> '12.3 ms'; 75 -> '1m15s'."""
    if s != s:  # NaN
        return "n/a"
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    if s < 1:
        return f"{s * 1e3:.1f} ms"
    if s < 60:
        return f"{s:.2f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m}m{sec:02d}s"


# Sizes are exact; one past what a double holds (300-odd digits) means nothing and is refused,
# as it was when sizes were parsed as floats (a --gap of 10**30 bytes is fine: merge all).
MAX_SIZE = int(sys.float_info.max)


def parse_size(text: str) -> int:
    """'4096', '64K', '1.5MiB', '1GB' -> bytes (powers of 1024). ValueError if it is not a
    whole number of bytes written that way."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"invalid size {text!r} (use e.g. 4096, 64KiB, 256MiB, 1GiB)")
    # exact (a float lost every offset above 2**53 without a word)
    value = Fraction(m.group(1)) * 1024 ** " kmgtp".index((m.group(2) or " ").lower())
    if value.denominator != 1:
        raise ValueError(f"size {text!r} is not a whole number of bytes")
    if value > MAX_SIZE:
        raise ValueError(f"size {text!r} is more than {MAX_SIZE} bytes")
    return int(value)


def printable(text: Any, keep: str = "") -> str:
    """str(text) safe to show on a terminal: every character that is not printable (control
    characters such as ESC, which start terminal escape sequences, C1 controls, newlines, tabs,
    format characters such as bidirectional overrides, line separators, unassigned code
    points...) becomes a Python-style escape (\\x1b, \\n, \\u202e). Characters in `keep`
    pass unchanged. Names from a store (streams, tags, buffers) are shown through it: a crafted
    store must not be able to write to the terminal."""
    text = str(text)
    if text.isprintable() and not keep:
        return text
    return "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in text)


def text_table(header: list, rows: list, right: Iterable[int] = ()) -> str:
    """Lines of columns two spaces apart, each padded to its widest cell (cells shown with
    str(), non-printable characters escaped: see printable()); the columns numbered in
    `right` right-aligned, the others left-aligned."""
    right = set(right)
    rows = [[printable(c) for c in r] for r in [header] + rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i])
                 for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float (inf, nan: not JSON) replaced by None, tuples as
    lists and dict keys as strings; everything else unchanged."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
