"""What `snapstore bench` shows people: the table fits a 100-column terminal whatever the
figures, and the --plot figure has time and bytes side by side, readable y-axis labels and a
legend that covers no point. Built from synthetic results (no benchmark runs), plus one tiny
real run."""
from __future__ import annotations

import itertools

import pytest

from snapstore import bench
from snapstore.bench import report, runner

MiB = 1 << 20


def _method(name: str, scale: float, verified: bool = True) -> dict:
    res = {k: None for k in runner.METRIC_KEYS}
    res.update(method=name, available=True, skipped=None, verified=verified, notes="",
               first_checkpoint_seconds=1.5 * scale,
               checkpoint_seconds={"median": 0.05 * scale, "p95": 0.08 * scale},
               bytes_written_per_checkpoint={"median": 3 * MiB * scale},
               growth_per_checkpoint_bytes=2.5 * MiB * scale,
               restore_latest_seconds=0.7 * scale, restore_oldest_seconds=0.9 * scale,
               peak_memory_bytes=4 * MiB * scale)
    if name == "snapstore":
        res["snapstore"] = {"kinds": ["full"] + ["incremental"] * 5}
    return res


def _result(dirties=(0.001, 0.01, 0.1, 0.5), patterns=("scattered",), scales=None,
            mismatch=()) -> dict:
    """A run() result: every method available, baselines `scales` times snapstore's figures."""
    scales = scales or {"snapstore": 1, "raw": 25, "pickle": 30, "numpy": 31, "restic": 400,
                        "borg": 12345}
    workloads = []
    for pattern, dirty in itertools.product(patterns, dirties):
        w = bench.Workload(size=1 << 30, dirty=dirty, pattern=pattern)
        results = {n: _method(n, s * (1 + dirty), n not in mismatch) for n, s in scales.items()}
        runner.add_ratios(results)
        workloads.append({"workload": vars(w).copy(), "description": w.describe(),
                          "results": results})
    return {"workloads": workloads,
            "machine": {"cpu": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz with a long name",
                        "cpus": 128, "memory_bytes": 1 << 40, "python": "3.11.7",
                        "bench_fs": "ext4", "loadavg_before": [12.5, 1, 1],
                        "loadavg_after": [13.25, 1, 1]}}


# ---- the table --------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{}, {"mismatch": ("pickle", "borg")},
                                {"scales": {"snapstore": 1e-4, "raw": 1e5}},
                                {"scales": {"snapstore": 1, "raw": 0}},
                                {"patterns": ("shifted", "appended")}])
def test_every_line_of_the_table_fits_100_columns(kw):
    table = bench.format_table(_result(**kw))
    assert report.WIDTH == 100
    too_wide = [line for line in table.splitlines() if len(line) > 100]
    assert not too_wide, too_wide


def test_the_table_has_a_row_per_method_and_a_ratio_row_per_baseline():
    table = bench.format_table(_result(dirties=(0.01,)))
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("method "))
    rows = lines[header + 1:header + 12]
    assert [r.split()[0] for r in rows] == ["snapstore", "raw", "vs", "pickle", "vs", "numpy",
                                            "vs", "restic", "vs", "borg", "vs"]
    raw_ratios = rows[2].split()[2:]
    assert raw_ratios == ["25.0x"] * 7                      # one per figure column
    assert rows[-1].split()[2:3] == ["12345x"]              # >= 100: no decimals
    huge = bench.format_table(_result(dirties=(0.01,), scales={"snapstore": 1e-4, "raw": 1e5}))
    assert "1.0e+09x" in huge                               # >= 1e5: 8 columns at most
    assert "1.0 GiB in 4 buffer(s)" in lines[0]
    assert "(" not in rows[1]                               # no "(Nx)" inside the cells


def test_a_restore_mismatch_is_marked_and_explained():
    table = bench.format_table(_result(dirties=(0.01,), mismatch=("pickle",)))
    assert any(line.startswith("pickle* ") for line in table.splitlines())
    assert "* RESTORE MISMATCH" in table
    assert "* RESTORE" not in bench.format_table(_result(dirties=(0.01,)))


def test_unavailable_and_unmeasured_figures():
    result = _result(dirties=(0.01,))
    res = result["workloads"][0]["results"]
    res["borg"] = runner._skipped("borg", "borg not found on PATH")
    res["restic"]["peak_memory_bytes"] = None
    del res["raw"]["vs_snapstore"]
    table = bench.format_table(result)
    assert "skipped: borg (borg not found on PATH)" in table
    restic = next(line for line in table.splitlines() if line.startswith("restic "))
    assert restic.split()[-1] == "n/a"
    raw = table.splitlines().index(next(line for line in table.splitlines()
                                        if line.startswith("raw ")))
    assert table.splitlines()[raw + 1].startswith("pickle ")   # no ratios: no ratio row


def test_a_real_run_fits_too(tmp_path):
    result = bench.run([bench.Workload(size=1 << 20, checkpoints=1, durability="none",
                                       restore_repeats=1)],
                       methods=["snapstore", "raw", "pickle"], workdir=str(tmp_path))
    table = bench.format_table(result)
    assert max(len(line) for line in table.splitlines()) <= 100
    assert "  vs snapstore" in table


# ---- the plot ---------------------------------------------------------------------------------
matplotlib = pytest.importorskip("matplotlib")   # in the test and plot extras


def _drawn(result):
    fig = report.figure(result)
    fig.canvas.draw()
    return fig, fig.canvas.get_renderer()


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt
    plt.close("all")


@pytest.mark.parametrize("kw", [{}, {"dirties": (0.01,)}, {"scales": {"snapstore": 1,
                                                                      "raw": 1.2}},
                                {"patterns": ("scattered", "shifted")}])
def test_plot_has_time_and_bytes_side_by_side(kw):
    fig, _ = _drawn(_result(**kw))
    axes = fig.axes
    assert len(axes) == 2
    assert "time" in axes[0].get_ylabel() and "bytes" in axes[1].get_ylabel()
    left, right = (ax.get_position() for ax in axes)
    assert left.x1 <= right.x0 and abs(left.y0 - right.y0) < 1e-6     # side by side
    n_series = len(kw.get("patterns", ("s",))) * len(kw.get("scales", range(6)))
    assert [len(ax.get_lines()) for ax in axes] == [n_series, n_series]


@pytest.mark.parametrize("kw", [{}, {"scales": {"snapstore": 1e-4, "raw": 1e5}},
                                {"scales": {"snapstore": 1, "raw": 1.05}},
                                {"patterns": ("scattered", "shifted", "appended")}])
def test_plot_labels_do_not_overlap_and_the_legend_hides_no_point(kw):
    fig, renderer = _drawn(_result(**kw))
    axes = fig.axes
    for ax in axes:
        labels = [t.get_window_extent(renderer) for t in ax.get_yticklabels()
                  if t.get_visible() and t.get_text()]
        assert len(labels) >= 2, "a y axis without readable labels"
        for a, b in itertools.combinations(labels, 2):
            assert not _overlap(a, b), "y tick labels overlap"
    # the panels (with their labels) do not run into each other
    assert not _overlap(axes[0].get_tightbbox(renderer), axes[1].get_tightbbox(renderer))
    # one legend, outside both panels, so it covers no point
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
    legend = fig.legends[0].get_window_extent(renderer)
    for ax in axes:
        assert not _overlap(legend, ax.get_window_extent(renderer))
    # the legend is inside the figure and names every line
    figbox = fig.bbox
    assert figbox.x0 <= legend.x0 and legend.x1 <= figbox.x1 and figbox.y0 <= legend.y0
    assert len(fig.legends[0].get_texts()) == len(axes[0].get_lines())


def test_every_point_is_inside_its_panel():
    fig, _ = _drawn(_result(scales={"snapstore": 1e-4, "raw": 1e5, "pickle": 3}))
    for ax in fig.axes:
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        for line in ax.get_lines():
            for x, y in zip(line.get_xdata(), line.get_ydata()):
                assert x0 <= x <= x1 and y0 <= y <= y1


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "p.png"
    bench.plot(_result(), str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
