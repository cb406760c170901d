"""A run's result for people and programs: the terminal table (format_table), the plot of
checkpoint time and bytes written against dirty fraction (figure, plot) and strict JSON
(to_json)."""
from __future__ import annotations

import json
import math
import textwrap

from snapstore.bench.errors import BenchError
from snapstore.bench.runner import RATIO_KEYS
from snapstore.formatting import human_bytes, human_seconds, json_safe, text_table

# Every line of the table fits a terminal this wide.
WIDTH = 100

# The table's columns after "method": (header, formatter, key of the figure in RATIO_KEYS).
COLUMNS = (
    ("ckpt med", human_seconds, "checkpoint_median"),
    ("ckpt p95", human_seconds, "checkpoint_p95"),
    ("written", human_bytes, "bytes_written"),
    ("growth", human_bytes, "growth"),
    ("rst latest", human_seconds, "restore_latest"),
    ("rst oldest", human_seconds, "restore_oldest"),
    ("peak mem", human_bytes, "peak_memory"),
)
RATIO_LABEL = "  vs snapstore"
MISMATCH_MARK = "*"
LEGEND = ("ckpt = caller-blocked wall time of an incremental checkpoint (med = median, p95 by "
          "nearest rank); written = write() bytes per checkpoint incl. the index; growth = disk "
          "blocks per checkpoint; rst = median of repeated restores of the latest / oldest "
          "checkpoint into fresh memory; peak mem = peak RSS growth during a checkpoint. "
          "'vs snapstore' rows: the baseline's figure divided by snapstore's (30.0x: the "
          "baseline costs 30 times as much).")


def _wrap(text: str) -> list:
    """text as lines of at most WIDTH columns, continuation lines indented."""
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def _figure(res: dict, key: str):
    """A method's figure by its RATIO_KEYS key, or None where it was not measured."""
    try:
        return RATIO_KEYS[key](res)
    except (KeyError, TypeError):
        return None


def _value(res: dict, key: str, fmt) -> str:
    value = _figure(res, key)
    return "n/a" if value is None else fmt(value)


def _ratio(res: dict, ratio_key: str) -> str:
    ratio = (res.get("vs_snapstore") or {}).get(ratio_key)
    if ratio is None:
        return "n/a"
    if ratio < 100:
        return f"{ratio:.1f}x"
    return f"{ratio:.0f}x" if ratio < 1e5 else f"{ratio:.1e}x"     # at most 8 columns


def format_table(result: dict) -> str:
    """The terminal table of a run() result (every workload), each line at most WIDTH
    columns: one row of figures per method, each baseline's followed by a "vs snapstore"
    row of its ratios to snapstore's figures."""
    lines = []
    mismatch = False
    for wl in result["workloads"]:
        lines += _wrap(f"workload: {wl['description']}")
        header = ["method"] + [c[0] for c in COLUMNS]
        rows = []
        skipped = []
        for name, res in wl["results"].items():
            if not res.get("available"):
                skipped.append(f"{name} ({res.get('skipped')})")
                continue
            bad = res.get("verified", True) is False
            mismatch = mismatch or bad
            rows.append([name + (MISMATCH_MARK if bad else "")]
                        + [_value(res, key, fmt) for _, fmt, key in COLUMNS])
            if res.get("vs_snapstore"):
                rows.append([RATIO_LABEL] + [_ratio(res, key) for _, _, key in COLUMNS])
        lines.append(text_table(header, rows, right=range(1, len(header))))
        snap = wl["results"].get("snapstore") or {}
        if snap.get("available"):
            lines += _wrap(f"snapstore first (full) checkpoint: "
                           f"{human_seconds(snap['first_checkpoint_seconds'])}; kinds: "
                           f"{', '.join(snap.get('snapstore', {}).get('kinds', []))}")
        if skipped:
            lines += _wrap("skipped: " + "; ".join(skipped))
        lines.append("")
    if mismatch:
        lines.append(f"{MISMATCH_MARK} RESTORE MISMATCH: the restored bytes differ from the "
                     "checkpointed ones")
    lines += _wrap(LEGEND)
    m = result.get("machine", {})
    if m:
        lines += _wrap(
            f"machine: {m.get('cpu', '?')}, {m.get('cpus', '?')} cpus, "
            f"{human_bytes(m['memory_bytes']) if m.get('memory_bytes') else '?'} RAM, "
            f"Python {m.get('python')}, bench dir on {m.get('bench_fs') or '?'}"
            + (f", load average {m['loadavg_before'][0]} before / "
               f"{m['loadavg_after'][0]} after" if m.get("loadavg_before") and
               m.get("loadavg_after") else ""))
    return "\n".join(lines)


# The plot's panels, side by side: (figure in RATIO_KEYS, y-axis label, scale to the unit).
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
PANELS = (
    ("checkpoint_median", "time per checkpoint (ms, median)", 1e3),
    ("bytes_written", "bytes written per checkpoint (MiB)", 1.0 / (1 << 20)),
)


def figure(result: dict):
    """The matplotlib Figure of a run: one panel per PANELS entry (caller-blocked time, bytes
    written), each figure per checkpoint against the dirty fraction, one line per method (and
    pattern, when the run had several), one legend under both panels. Needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    except ImportError:
        raise BenchError("--plot needs matplotlib, which is not installed "
                         "(pip install matplotlib); the measurements ran and are in the "
                         "table / --json output") from None
    patterns = {wl["workload"]["pattern"] for wl in result["workloads"]}
    xs = sorted({wl["workload"]["dirty"] for wl in result["workloads"]})
    fig, axes = plt.subplots(1, len(PANELS), figsize=(11, 4.8))
    for ax, (key, ylabel, scale) in zip(axes, PANELS):
        series = _series(result, key, patterns)
        for i, (label, pts) in enumerate(series):
            # Baselines often coincide (every full copy writes the same bytes): hollow markers
            # of distinct shapes, earlier ones larger, keep every point visible.
            ours = label.startswith("snapstore")
            ax.plot([p[0] for p in pts], [p[1] * scale for p in pts], label=label,
                    marker=MARKERS[i % len(MARKERS)], markersize=max(4, 11 - 1.5 * i),
                    markerfacecolor=None if ours else "none", linewidth=2.5 if ours else 1.5)
        if xs and xs[0] > 0 and len(xs) > 1 and xs[-1] / xs[0] >= 10:
            ax.set_xscale("log")
        ys = [p[1] * scale for _, pts in series for p in pts if p[1] * scale > 0]
        if ys and max(ys) / min(ys) >= 10:
            # Labels only at 1-2-5 steps (1 per decade past 3 decades), never on minor ticks:
            # minor labels of a log axis are what overlapped.
            decades = math.log10(max(ys) / min(ys))
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0,) if decades > 3
                                                  else (1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("dirty fraction of the state per checkpoint")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    first = result["workloads"][0]["workload"] if result["workloads"] else None
    if first:
        fig.suptitle(f"checkpoint overhead: {human_bytes(first['size'])} state, "
                     f"durability={first['durability']}")
    handles, labels = axes[0].get_legend_handles_labels()
    # Under the panels, outside both: a legend inside an axes can hide a point.
    legend_rows = max(1, math.ceil(len(labels) / 4))
    fig.tight_layout(rect=(0, 0.06 * legend_rows + 0.04, 1, 1))
    if labels:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)),
                   frameon=False)
    return fig


def _series(result: dict, key: str, patterns: set) -> list:
    """[(label, [(dirty, figure), ...] sorted)], snapstore's first, then by name."""
    series: dict = {}
    for wl in result["workloads"]:
        x = wl["workload"]["dirty"]
        for name, res in wl["results"].items():
            if not res.get("available"):
                continue
            y = _figure(res, key)
            if y is None:
                continue
            label = name if len(patterns) == 1 else f"{name} ({wl['workload']['pattern']})"
            series.setdefault(label, []).append((x, y))
    return [(label, sorted(pts)) for label, pts in
            sorted(series.items(), key=lambda kv: (not kv[0].startswith("snapstore"), kv[0]))]


def plot(result: dict, path: str) -> None:
    """Writes figure(result) as a PNG to path. Needs matplotlib."""
    fig = figure(result)
    import matplotlib.pyplot as plt
    try:
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def to_json(result: dict) -> str:
    """The result as indented, strict JSON (inf and nan as null)."""
    return json.dumps(json_safe(result), indent=2)
