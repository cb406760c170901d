"""How commands print: the --json document, text tables and key/value reports, times,
checkpoint metadata as JSON, and buffer names made safe as file names."""
from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import re
import sys
import time
from typing import Any, Iterable

from snapstore.formatting import human_bytes, human_seconds, json_safe


def print_json(obj: Any) -> None:
    """Prints obj as one indented JSON document (non-finite floats as null)."""
    sys.stdout.write(json.dumps(json_safe(obj), indent=2, default=str) + "\n")


def iso_time(ts: float) -> str:
    """A Unix time as ISO 8601 UTC ('2024-05-01T12:00:00Z')."""
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat().replace("+00:00", "Z")


def local_time(ts: float) -> str:
    """A Unix time as local 'YYYY-MM-DD HH:MM:SS'."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


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
        return ", ".join(str(v) for v in value) or "-"
    if isinstance(value, dict):
        return short(value, 100)
    return str(value)


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
