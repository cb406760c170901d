"""How commands print: the --json document, text tables and key/value reports, times,
checkpoint metadata as JSON, buffer names made safe as file names, and output made safe for
terminals.

Terminal safety: names in a store (streams, tags, buffers) are whatever its writer chose, or
whatever a crafted store holds, so nothing from a store reaches the terminal raw. Commands
show such values through printable() (every non-printable character escaped: newlines, tabs,
ESC...), and main() runs every command with stdout and stderr behind TerminalSafeStream,
which escapes every non-printable character except the newlines, tabs and carriage returns of
the layout, so a value printed some other way (an error message) cannot carry an escape
sequence either. JSON output is escaped by the encoder (ensure_ascii) and binary output
(restore --out -) goes to the underlying byte stream untouched.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import datetime as _dt
import json
import math
import re
import sys
import time
from typing import Any, Iterable, Iterator

from snapstore.formatting import human_bytes, human_seconds, json_safe, printable

_LAYOUT = "\n\r\t"


class TerminalSafeStream:
    """A text stream that writes printable(text, keep=newline, carriage return, tab) to the
    stream it wraps; everything else (buffer, fileno, isatty, flush...) is the wrapped
    stream's."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text, keep=_LAYOUT))
        return len(text)

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class ClosedStream:
    """What stands for a standard stream the process was started without (`>&-`: Python
    makes it None). Writing to a closed stdout is an OSError (EBADF), so a command whose
    output is lost fails instead of reporting success; a closed stderr takes its one error
    line and drops it (there is nowhere to say it)."""

    def __init__(self, name: str, raise_on_write: bool) -> None:
        self.name = name
        self._raise = raise_on_write

    def write(self, text: str) -> int:
        if self._raise and text:
            raise OSError(errno.EBADF, f"standard {self.name} is closed")
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@contextlib.contextmanager
def terminal_safe_output() -> Iterator[None]:
    """Runs the with block with sys.stdout and sys.stderr behind TerminalSafeStream (a closed
    one behind ClosedStream)."""
    saved = sys.stdout, sys.stderr
    out = sys.stdout if sys.stdout is not None else ClosedStream("output", True)
    err = sys.stderr if sys.stderr is not None else ClosedStream("error", False)
    sys.stdout, sys.stderr = TerminalSafeStream(out), TerminalSafeStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def print_json(obj: Any) -> None:
    """Prints obj as one indented JSON document (non-finite floats as null)."""
    sys.stdout.write(json.dumps(json_safe(obj), indent=2, default=str) + "\n")


def iso_time(ts: float) -> str:
    """A Unix time as ISO 8601 UTC ('2024-05-01T12:00:00Z'); a time no date can show (before
    the year 1 or after 9999: a checkpoint imported by an older version may carry one) as
    '?' + the number, so that one bad value never stops a listing."""
    try:
        return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat() \
            .replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return f"?{ts!r}"


def local_time(ts: float) -> str:
    """A Unix time as local 'YYYY-MM-DD HH:MM:SS' (one no date can show as iso_time gives
    it)."""
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    except (OverflowError, ValueError, OSError):
        return f"?{ts!r}"


def info_dict(info) -> dict:
    """A CheckpointInfo as JSON-ready dict (+ created_iso and the total bytes)."""
    d = dataclasses.asdict(info)
    d["tags"] = list(d.get("tags") or ())
    d["created_iso"] = iso_time(info.created)
    d["bytes"] = sum(info.sizes.values())
    return d


def short(value: Any, limit: int = 40) -> str:
    """Compact JSON of value, cut to `limit` characters ('' for None)."""
    if value is None:
        return ""
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def human_value(key: str, value: Any) -> str:
    """A report value for people; the key says the unit ('..bytes..', '.._size', '..seconds..',
    '.._s')."""
    if isinstance(value, bool) or value is None:
        return str(value).lower() if isinstance(value, bool) else "-"
    if isinstance(value, (int, float)) and ("bytes" in key or key.endswith("_size")):
        return f"{human_bytes(value)}" + (f" ({value:,} B)" if value >= 1024 else "")
    if isinstance(value, (int, float)) and ("seconds" in key or key.endswith("_s")):
        return human_seconds(float(value))
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.3g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(printable(v) for v in value) or "-"
    if isinstance(value, dict):
        return short(value, 100)
    return printable(value)


def print_report(title: str, report: dict) -> None:
    """Prints a flat report dict as aligned 'key  value' lines under an optional title."""
    if title:
        print(title)
    width = max((len(k) for k in report), default=0)
    for k in report:
        print(f"  {k.replace('_', ' '):<{width}}  {human_value(k, report[k])}")


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
