"""Plots for ``tfgraph compare --plot`` (matplotlib, Agg; no pyplot global state).

One figure, four panels, one colour per variant:
1. forward FLOPs against sequence length (log-log), the attention/FFN crossover marked;
2. attention-score FLOPs (dashed) and FFN FLOPs (dotted): the crossover is where they meet;
3. memory (log-log): inference activation peak, KV cache and an Adam training step;
4. parameters by role (stacked bars).

Curves are ``graph.report()`` at integer lengths on a geometric grid spanning the requested
lengths and every crossover; crossover points come from the exact solution in the dict.
Variant names are drawn as written (``plot_text``): matplotlib would read a pair of ``$`` as
mathtext, and a control character would make the SVG invalid XML.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from tfgraph.compare import series
from tfgraph.errors import TfgraphError
from tfgraph.io import atomic_write
from tfgraph.ir import Graph
from tfgraph.param_groups import kind_title, order_kinds
from tfgraph.terminal import printable

GRID_POINTS = 18
MAX_LENGTH = 1 << 20  # plot range cap: crossovers beyond a million tokens are off the chart
PARAM_COLOURS = {"embed": "#f4a259", "self_attn": "#5b8fd1", "cross_attn": "#4cb08a",
                 "ffn": "#e07a5f", "layer": "#b8a9c9", "norm": "#e9c46a", "head": "#8d99ae"}
MEMORY_STYLES = (("memory.activations_peak", "-", "activations peak"),
                 ("memory.kv_cache", "--", "KV cache"),
                 ("memory.train_step", "-.", "train step (Adam)"))


def plot_text(text: str) -> str:
    """A user string as literal matplotlib text: one printable line, ``$`` escaped so no
    mathtext is parsed."""
    return printable(text).replace("$", r"\$")


def lengths_for(data: dict[str, Any]) -> list[int]:
    """Integer lengths on a geometric grid over the requested lengths and the crossovers,
    plus those exact points."""
    points = [float(s) for s in data["seqs"]]
    points += [v["crossover"]["seq"] for v in data["variants"] if v["crossover"]["seq"]]
    lo = max(1.0, min(points) / 2)
    hi = min(float(MAX_LENGTH), max(points) * 2)
    grid = {round(lo * (hi / lo) ** (i / (GRID_POINTS - 1))) for i in range(GRID_POINTS)}
    grid.update(int(s) for s in data["seqs"])
    return sorted(x for x in grid if 1 <= x <= MAX_LENGTH)


def _positive(xs: Sequence[int], ys: Sequence[int]) -> tuple[list[int], list[int]]:
    """Drop zero values, which log axes cannot show (e.g. no KV cache in an encoder)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if y > 0]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _style(ax: Axes, title: str, ylabel: str, log: bool = True) -> None:
    ax.set_title(title, fontsize=12, loc="left")
    ax.set_ylabel(ylabel)
    if log:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L (source = target)")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)


def compare_figure(graphs: Sequence[Graph], data: dict[str, Any]) -> Figure:
    """The four-panel comparison figure (not saved)."""
    if len(graphs) != len(data["variants"]):
        raise ValueError("graphs and compare data disagree on the number of variants")
    fig = Figure(figsize=(13, 9.5), layout="constrained")
    (ax_flops, ax_cross), (ax_mem, ax_params) = fig.subplots(2, 2)
    colours = [f"C{i % 10}" for i in range(len(graphs))]
    xs = lengths_for(data)
    batch = data["batch"]
    names = [plot_text(v["name"]) for v in data["variants"]]
    for i, (graph, v, colour) in enumerate(zip(graphs, data["variants"], colours)):
        s = series(graph, xs, batch)
        c = v["crossover"]
        ax_flops.plot(xs, s["flops.forward"], color=colour, lw=2, label=names[i])
        ax_cross.plot(*_positive(xs, s["flops_by_kind.attention_scores"]), color=colour,
                      ls="--", lw=1.8, label=f"{names[i]}: attention scores")
        ax_cross.plot(*_positive(xs, s["flops_by_kind.ffn"]), color=colour, ls=":", lw=2.2,
                      label=f"{names[i]}: FFN")
        if c["seq"] and c["seq"] <= MAX_LENGTH:
            ax_flops.plot([c["seq"]], [c["forward_flops_at_crossover"]], marker="o", ms=8,
                          mfc="white", mec=colour, mew=2, ls="none")
            ax_flops.annotate(f"L≈{c['seq']:,.0f}", (c["seq"], c["forward_flops_at_crossover"]),
                              textcoords="offset points", fontsize=9,
                              xytext=(8, -14) if i % 2 == 0 else (-10, 8),
                              ha="left" if i % 2 == 0 else "right",
                              color=colour)
            ax_cross.plot([c["seq"]], [c["flops_each_at_crossover"]], marker="o", ms=9,
                          mfc=colour, mec="black", ls="none")
            ax_cross.axvline(c["seq"], color=colour, lw=0.8, alpha=0.5)
        for key, ls, _ in MEMORY_STYLES:
            ax_mem.plot(*_positive(xs, s[key]), color=colour, ls=ls, lw=1.8)
    for seq in data["seqs"]:
        for ax in (ax_flops, ax_cross, ax_mem):
            ax.axvline(seq, color="#999999", lw=0.6, ls=(0, (1, 3)))
    _style(ax_flops, f"Forward FLOPs (batch {batch}); ○ attention = FFN crossover", "FLOPs")
    _style(ax_cross, "Attention-score (dashed) vs FFN (dotted) FLOPs", "FLOPs")
    _style(ax_mem, "Memory: activations peak (—), KV cache (--), train step (-.)", "bytes")
    ax_flops.legend(fontsize=9, loc="upper left")
    ax_cross.legend(fontsize=8, loc="upper left", ncol=1 if len(graphs) < 4 else 2)
    handles = [ax_mem.plot([], [], color="#333333", ls=ls, label=label)[0]
               for _, ls, label in MEMORY_STYLES]
    handles += [ax_mem.plot([], [], color=colour, lw=4, label=name)[0]
                for name, colour in zip(names, colours)]
    ax_mem.legend(handles=handles, fontsize=8, loc="upper left", ncol=2)
    _params_panel(ax_params, data)
    fig.suptitle("tfgraph compare: " + " vs ".join(names),
                 fontsize=14)
    return fig


def _params_panel(ax: Axes, data: dict[str, Any]) -> None:
    names = [plot_text(v["name"]) for v in data["variants"]]
    left = [0.0] * len(names)
    kinds = order_kinds({k: 0 for v in data["variants"] for k in v["params_by_kind"]})
    for i, kind in enumerate(kinds):
        widths = [v["params_by_kind"].get(kind, 0) / 1e6 for v in data["variants"]]
        ax.barh(names, widths, left=left, color=PARAM_COLOURS.get(kind, f"C{i % 10}"),
                label=plot_text(kind_title(kind)), edgecolor="white")
        left = [a + b for a, b in zip(left, widths)]
    for i, v in enumerate(data["variants"]):
        ax.text(left[i], i, f"  {v['params'] / 1e6:,.1f}M", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.22 if max(left) > 0 else 1)
    _style(ax, "Parameters by role (millions)", "", log=False)
    ax.set_xlabel("parameters (M)")
    ax.grid(True, axis="x", alpha=0.35)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=3,
              frameon=False)


def figure_bytes(fig: Figure, fmt: str) -> bytes:
    """PNG or SVG bytes; SVG without a date stamp and with fixed ids, so it is reproducible."""
    buf = io.BytesIO()
    if fmt == "svg":
        import matplotlib

        with matplotlib.rc_context({"svg.hashsalt": "tfgraph", "svg.fonttype": "none"}):
            fig.savefig(buf, format="svg", metadata={"Date": None})
    else:
        fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def write_compare_plot(graphs: Sequence[Graph], data: dict[str, Any],
                       path: Path | str | os.PathLike[str]) -> Path:
    """Write the comparison figure to ``path`` (.png or .svg), atomically."""
    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise TfgraphError(f"{path}: plots are written as .png or .svg")
    data_bytes = figure_bytes(compare_figure(graphs, data), fmt)
    with atomic_write(path, "wb") as handle:
        handle.write(data_bytes)
    return path

