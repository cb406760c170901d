"""A run's result for people and programs: the terminal table (format_table), the plot of
checkpoint time against dirty fraction (plot) and strict JSON (to_json)."""
from __future__ import annotations

import json

from snapstore.bench.errors import BenchError
from snapstore.bench.runner import RATIO_KEYS
from snapstore.formatting import human_bytes, human_seconds, json_safe, text_table

# The table's columns after "method": (header, formatter, key of the figure in RATIO_KEYS).
COLUMNS = (
    ("ckpt median", human_seconds, "checkpoint_median"),
    ("ckpt p95", human_seconds, "checkpoint_p95"),
    ("written/ckpt", human_bytes, "bytes_written"),
    ("growth/ckpt", human_bytes, "growth"),
    ("restore latest", human_seconds, "restore_latest"),
    ("restore oldest", human_seconds, "restore_oldest"),
    ("peak mem", human_bytes, "peak_memory"),
)


def _cell(res: dict, fmt, ratio_key) -> str:
    """The figure formatted, with its ratio to snapstore's as "(Nx)" when there is one."""
    try:
        value = RATIO_KEYS[ratio_key](res)
    except (KeyError, TypeError):
        value = None
    if value is None:
        return "n/a"
    text = fmt(value)
    ratio = (res.get("vs_snapstore") or {}).get(ratio_key)
    if ratio is not None:
        text += f" ({ratio:.1f}x)" if ratio < 100 else f" ({ratio:.0f}x)"
    return text


def format_table(result: dict) -> str:
    """The terminal table of a run() result (every workload)."""
    lines = []
    for wl in result["workloads"]:
        lines.append(f"workload: {wl['description']}")
        header = ["method"] + [c[0] for c in COLUMNS]
        rows = []
        skipped = []
        for name, res in wl["results"].items():
            if not res.get("available"):
                skipped.append(f"{name} ({res.get('skipped')})")
                continue
            row = [name if res.get("verified", True) else name + " (RESTORE MISMATCH)"]
            row += [_cell(res, fmt, key) for _, fmt, key in COLUMNS]
            rows.append(row)
        lines.append(text_table(header, rows, right=range(1, len(header))))
        snap = wl["results"].get("snapstore") or {}
        if snap.get("available"):
            lines.append(f"snapstore first (full) checkpoint: "
                         f"{human_seconds(snap['first_checkpoint_seconds'])}; kinds: "
                         f"{', '.join(snap.get('snapstore', {}).get('kinds', []))}")
        if skipped:
            lines.append("skipped: " + "; ".join(skipped))
        lines.append("")
    lines.append("(Nx) = the baseline's figure divided by snapstore's. ckpt = caller-blocked "
                 "wall time of the incremental checkpoints (p95 by nearest rank); written = "
                 "write() bytes incl. the index; growth = disk blocks; restore = median of "
                 "repeated restores into fresh memory; peak mem = peak RSS growth during a "
                 "checkpoint.")
    m = result.get("machine", {})
    if m:
        lines.append(f"machine: {m.get('cpu', '?')}, {m.get('cpus', '?')} cpus, "
                     f"{human_bytes(m['memory_bytes']) if m.get('memory_bytes') else '?'} RAM, "
                     f"Python {m.get('python')}, bench dir on {m.get('bench_fs') or '?'}"
                     + (f", load average {m['loadavg_before'][0]} before / "
                        f"{m['loadavg_after'][0]} after" if m.get("loadavg_before") and
                        m.get("loadavg_after") else ""))
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Writes a PNG: median caller-blocked checkpoint time vs dirty fraction, one line per
    method (and pattern, when the run had several). Needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BenchError("--plot needs matplotlib, which is not installed "
                         "(pip install matplotlib); the measurements ran and are in the "
                         "table / --json output") from None
    series: dict = {}
    patterns = {wl["workload"]["pattern"] for wl in result["workloads"]}
    for wl in result["workloads"]:
        x = wl["workload"]["dirty"]
        for name, res in wl["results"].items():
            if not res.get("available"):
                continue
            label = name if len(patterns) == 1 else f"{name} ({wl['workload']['pattern']})"
            series.setdefault(label, []).append((x, res["checkpoint_seconds"]["median"]))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, pts in sorted(series.items(), key=lambda kv: (not kv[0].startswith("snapstore"),
                                                              kv[0])):
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] * 1e3 for p in pts], marker="o", label=label,
                linewidth=2.5 if label.startswith("snapstore") else 1.5)
    xs = sorted({wl["workload"]["dirty"] for wl in result["workloads"]})
    if xs and xs[0] > 0 and len(xs) > 1 and xs[-1] / xs[0] >= 10:
        ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import FuncFormatter
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("dirty fraction of the state per checkpoint")
    ax.set_ylabel("caller-blocked time per checkpoint (ms, median)")
    first = result["workloads"][0]["workload"]
    ax.set_title(f"checkpoint overhead: {human_bytes(first['size'])} state, "
                 f"durability={first['durability']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def to_json(result: dict) -> str:
    """The result as indented, strict JSON (inf and nan as null)."""
    return json.dumps(json_safe(result), indent=2)
