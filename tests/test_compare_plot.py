"""``tfgraph compare --plot`` says what the table says (issue 15 items 4 and 8): the table's †
at requested lengths past a spec's max_len (read back from the matplotlib objects and the
SVG's ids), curves of a learned position table ending at max_len, memory in binary units with
readable ticks, FLOPs with decimal prefixes, axis labels worded for the models compared, and
legends off the data with the crossovers listed in them rather than written on the curves."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ROOT
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from test_diagram import svg_texts

import tfgraph
from tfgraph.passes.compare import compare
from tfgraph.exporters.compare.plot import (
    EXTRAPOLATED_MARKER,
    BinaryLocator,
    binary_bytes,
    compare_figure,
    length_label,
    write_compare_plot,
)
from tfgraph.graph.lengths import Lengths

# learned positions (max_len 64), sinusoidal (max_len 512), rotary (max_len 128)
NAMES = ("tiny-decoder.yaml", "base.yaml", "tiny-llama.yaml")
SEQS = (32, 100, 256, 1024)


@pytest.fixture(scope="module")
def plotted() -> tuple[list[Any], dict[str, Any], Figure]:
    graphs = [tfgraph.compile(ROOT / "specs" / n) for n in NAMES]
    data = compare(graphs, seqs=SEQS)
    fig = compare_figure(graphs, data)
    FigureCanvasAgg(fig).draw()  # layout and ticks as saved
    return graphs, data, fig


def _panel(fig: Figure, title: str) -> Axes:
    return next(ax for ax in fig.axes if ax.get_title(loc="left").startswith(title))


def _daggers(fig: Figure) -> dict[str, Line2D]:
    return {str(line.get_gid()): line for ax in fig.axes for line in ax.lines
            if str(line.get_gid()).startswith("extrapolated-")}


def test_every_extrapolated_figure_of_the_data_carries_the_dagger(plotted: tuple) -> None:
    """The markers are exactly the data's rows past max_len that have the figure (a learned
    table's rows there, if the data gives none, get none), at the table's values."""
    _, data, fig = plotted
    daggers = _daggers(fig)
    expected = {}
    for i, v in enumerate(data["variants"]):
        for key in ("flops.forward_effective", "memory.activations_peak", "memory.kv_cache",
                    "memory.train_step"):
            points = [(row["seq"], row["values"][key]) for row in v["at"]
                      if row["beyond_max_len"] and row.get("values")
                      and row["values"].get(key)]
            if points:
                expected[f"extrapolated-{i}-{key}"] = points
    assert expected  # base past 512 and tiny-llama past 128 at least
    assert set(daggers) == set(expected)
    for gid, points in expected.items():
        line = daggers[gid]
        assert line.get_marker() == EXTRAPOLATED_MARKER and line.get_linestyle() == "None"
        xs, ys = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
        assert list(zip(xs.tolist(), ys.tolist())) == points
    # rotary and sinusoidal positions extrapolate: 256 and 1024 past tiny-llama's 128
    assert [x for x, _ in expected["extrapolated-2-flops.forward_effective"]] == [256, 1024]
    assert [x for x, _ in expected["extrapolated-1-flops.forward_effective"]] == [1024]


def test_the_dagger_is_in_the_legend_and_the_svg(plotted: tuple, tmp_path: Path) -> None:
    graphs, data, fig = plotted
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert any("the table's †" in t for t in labels)
    assert any("faded: past the spec's max_len, extrapolated" in t for t in labels)
    svg = write_compare_plot(graphs, data, tmp_path / "p.svg").read_text()
    ids = set(re.findall(r'id="(extrapolated-[^"]+)"', svg))
    assert ids == set(_daggers(fig))


def test_a_learned_table_has_no_curve_past_max_len(plotted: tuple) -> None:
    """tiny-decoder's positions are a learned table of 64 rows (tfgraph.graph.lengths): every curve
    of its colour stops at 64, where a bar marks the end; the legend says what the bar is."""
    graphs, data, fig = plotted
    assert Lengths.of(graphs[0].spec).hard_limit == 64
    ends = 0
    for ax in fig.axes[:3]:
        for line in ax.lines:
            if line.get_color() != "C0" or str(line.get_gid()).startswith("extrapolated-"):
                continue  # other variants; the data's own rows (tested above)
            xs = list(line.get_xdata())
            assert max(xs) <= 64, (ax.get_title(loc="left"), xs)
            ends += line.get_gid() == "max-len-end"
    # FLOPs (work done and dense), attention (work done and dense) and FFN, three memory curves
    assert ends == 5 + 3
    labels = [t.get_text() for legend in fig.legends for t in legend.get_texts()]
    assert any("learned position table: no figures past it" in t for t in labels)


def test_memory_ticks_are_binary_units(plotted: tuple) -> None:
    _, _, fig = plotted
    ax = _panel(fig, "Memory")
    assert "MiB" in ax.get_ylabel() and "bytes" in ax.get_ylabel()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert len(labels) >= 3
    for label in labels:
        assert re.fullmatch(r"(1|4|16|64|256) (B|KiB|MiB|GiB|TiB|PiB)", label), label
    lo, hi = ax.get_ylim()
    shown = [y for y in ax.get_yticks() if lo <= y <= hi]
    assert all(y == 4 ** round(math.log(y, 4)) for y in shown)


def test_binary_locator_and_labels() -> None:
    assert binary_bytes(2**20) == "1 MiB" and binary_bytes(256 * 2**30) == "256 GiB"
    assert binary_bytes(4096) == "4 KiB" and binary_bytes(16) == "16 B"
    ticks = BinaryLocator().tick_values(1000, 3 * 2**30)  # every other power of 4 from 256 B
    assert ticks == [256, 4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20, 256 * 2**20, 4 * 2**30]
    assert BinaryLocator().tick_values(2**20, 2**30) == [4 ** k for k in range(10, 16)]
    wide = BinaryLocator().tick_values(1, 2**50)  # every 4th power of 4: 1 B, 256 B, 64 KiB, ...
    assert len(wide) <= 8 and all(binary_bytes(t).split()[0] in ("1", "4", "16", "64", "256")
                                  for t in wide)


def test_flops_ticks_have_decimal_prefixes(plotted: tuple) -> None:
    _, _, fig = plotted
    for title in ("Forward FLOPs", "Attention-score"):
        ax = _panel(fig, title)
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert labels and all(re.fullmatch(r"(1|10|100)[kMGTP]?", t) for t in labels), labels


def test_axis_labels_fit_the_models() -> None:
    def data(*archs: str) -> dict[str, Any]:
        return {"variants": [{"arch": a} for a in archs]}

    one = length_label(data("decoder-only", "encoder-only"))
    assert one == "sequence length S (tokens)"
    assert "target" not in one and "source" not in one
    assert "T = S" in length_label(data("decoder-only", "encoder-decoder"))
    assert length_label(data("encoder-decoder")).startswith("source length S = target length T")


def test_decoder_only_plot_has_no_source_target_label() -> None:
    graphs = [tfgraph.compile(ROOT / "specs" / n) for n in ("tiny-decoder.yaml",
                                                              "tiny-llama.yaml")]
    fig = compare_figure(graphs, compare(graphs, seqs=(16, 64)))
    for ax in fig.axes[:3]:
        assert ax.get_xlabel() == "sequence length S (tokens)"


def test_legends_and_crossovers_stay_off_the_data(plotted: tuple) -> None:
    """Every legend lies outside every panel's plotting area, and no crossover is written on
    a curve: each is in the figure legend, with the spec's max_len where it lies past it."""
    _, data, fig = plotted
    renderer = fig.canvas.get_renderer()
    areas = [ax.get_window_extent(renderer) for ax in fig.axes]
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 4
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for area in areas:
            assert not box.overlaps(area), (legend.get_texts()[0].get_text(), box, area)
    for ax in fig.axes[:3]:
        assert not ax.texts  # no labels on the curves
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    for v in data["variants"]:
        assert any(t.startswith(f"{v['name']}: attention = FFN at S ≈ "
                                f"{v['crossover_effective']['seq']:,.0f}") for t in labels)
    assert any("(past max_len 64)" in t for t in labels)  # tiny-decoder's
    # a crossover marker only where the curve has figures: tiny-decoder's (past 64) has none
    crossovers = {line.get_gid() for ax in fig.axes for line in ax.lines
                  if str(line.get_gid()).startswith("crossover-")}
    assert crossovers == {"crossover-1", "crossover-2"}
