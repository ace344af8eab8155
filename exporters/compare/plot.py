"""Plots for ``tfgraph compare --plot`` (matplotlib, Agg; no pyplot global state).

One figure, four panels, one colour per variant:
1. forward FLOPs against the sequence length S (log-log), the attention/FFN crossover marked:
   the work done (``flops.forward_effective``: causal masks and sliding windows skip scores)
   solid, the dense count (full score matrices) thin and dotted;
2. attention-score FLOPs (dashed; thin dash-dot: dense) and FFN FLOPs (dotted): the crossover
   (``crossover_effective``) is where the dashed and dotted curves meet;
3. memory (log-log, binary units): inference activation peak, KV cache, an Adam training step;
4. parameters by kind (stacked bars; ``tfgraph.passes.param_groups``, the table's grouping).

Curves are ``graph.report()``'s figures at integer lengths on a geometric grid spanning the
requested lengths, each spec's max_len and every crossover; crossover points come from the exact
solution in the dict. The plot says what the table says about lengths past a spec's max_len
(``tfgraph.graph.lengths``): a learned position table has no figures there, so its curves end at
max_len (a bar marks the end); for other positions the curve goes on faded and each requested
length past max_len that has figures in the data (``at[j]["beyond_max_len"]``) carries the
table's † as its marker. Every such marker has an SVG id ``extrapolated-<variant>-<figure>``
(``EXTRAPOLATED_GID``). Crossovers are listed in the figure's legend, below the panels, rather
than written on the curves; the legends sit below their axes, off the data.

Variant names are drawn as written (``plot_text``): matplotlib would read a pair of ``$`` as
mathtext, and a control character would make the SVG invalid XML.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, Locator, LogLocator, NullFormatter

from tfgraph.passes.compare import human_params, series
from tfgraph.prefixes import PARAMS, SI, prefixed
from tfgraph.errors import TfgraphError
from tfgraph.io import atomic_write
from tfgraph.graph.ir import Graph
from tfgraph.graph.lengths import Lengths
from tfgraph.passes.param_groups import kind_title, order_kinds
from tfgraph.terminal import printable

GRID_POINTS = 18
# the headline crossover (effective attention) and the dense one: both inside the plot range
CROSSOVER_KEYS = ("crossover_effective", "crossover")
DENSE_STYLE = {"ls": (0, (1, 2)), "lw": 1.1}  # the dense FLOPs beside the work done
MAX_LENGTH = 1 << 20  # plot range cap: crossovers beyond a million tokens are off the chart
PARAM_COLOURS = {"embed": "#f4a259", "self_attn": "#5b8fd1", "cross_attn": "#4cb08a",
                 "ffn": "#e07a5f", "layer": "#b8a9c9", "norm": "#e9c46a", "head": "#8d99ae"}
MEMORY_STYLES = (("memory.activations_peak", "-", "activations peak"),
                 ("memory.kv_cache", "--", "KV cache"),
                 ("memory.train_step", "-.", "train step (Adam)"))
# The table's mark for a length past max_len, drawn as a marker (mathtext dagger).
EXTRAPOLATED_MARKER = r"$\dagger$"
EXTRAPOLATED_GID = "extrapolated-{variant}-{figure}"
FADED = 0.35  # alpha of a curve's extrapolated part
MAX_MEMORY_TICKS = 7
BINARY_UNITS = (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def plot_text(text: str) -> str:
    """A user string as literal matplotlib text: one printable line, ``$`` escaped so no
    mathtext is parsed."""
    return printable(text).replace("$", r"\$")


def lengths_for(data: dict[str, Any]) -> list[int]:
    """Integer lengths on a geometric grid over the requested lengths and the crossovers,
    plus those exact points and every max_len inside the range (where a curve changes)."""
    points = [float(s) for s in data["seqs"]]
    points += [v[key]["seq"] for v in data["variants"] for key in CROSSOVER_KEYS
               if v.get(key, {}).get("seq")]
    lo = max(1.0, min(points) / 2)
    hi = min(float(MAX_LENGTH), max(points) * 2)
    grid = {round(lo * (hi / lo) ** (i / (GRID_POINTS - 1))) for i in range(GRID_POINTS)}
    grid.update(int(s) for s in data["seqs"])
    grid.update(v["max_len"] for v in data["variants"] if v.get("max_len")
                and lo <= v["max_len"] <= hi)
    return sorted(x for x in grid if 1 <= x <= MAX_LENGTH)


def length_label(data: dict[str, Any]) -> str:
    """The x-axis label, worded for the architectures compared: S alone for one-stack models;
    an encoder-decoder's source S and target T = S only when one is compared."""
    archs = {v.get("arch") for v in data["variants"]}
    if archs == {"encoder-decoder"}:
        return "source length S = target length T (tokens)"
    if "encoder-decoder" in archs:
        return "sequence length S (tokens; encoder-decoder: source S, target T = S)"
    return "sequence length S (tokens)"


def binary_bytes(value: float) -> str:
    """A memory tick label in binary units: 1048576 -> ``1 MiB``, 4096 -> ``4 KiB``."""
    for unit, size in BINARY_UNITS:
        if value >= size:
            return f"{value / size:g} {unit}"
    return f"{value:g} B"


def si_count(value: float) -> str:
    """A FLOP tick label with a decimal prefix: 1e10 -> ``10G`` (tfgraph.prefixes)."""
    return prefixed(value, SI, "g")


class BinaryLocator(Locator):
    """Major ticks at powers of 4 bytes (1, 4, 16, 64, 256 of B, KiB, MiB, GiB, TiB: readable
    binary labels), every n-th power when more than ``MAX_MEMORY_TICKS`` would show."""

    def __call__(self) -> Sequence[float]:
        lo, hi = self.axis.get_view_interval() if self.axis else (1.0, 1024.0)
        return self.tick_values(lo, hi)

    def tick_values(self, vmin: float, vmax: float) -> Sequence[float]:
        lo, hi = sorted((max(vmin, 1.0), max(vmax, 1.0)))
        first, last = math.floor(math.log(lo, 4)), math.ceil(math.log(hi, 4))
        step = max(1, math.ceil((last - first + 1) / MAX_MEMORY_TICKS))
        start = first - first % step
        return [4.0 ** k for k in range(start, last + step, step)]


def _positive(xs: Sequence[int], ys: Sequence[int]) -> tuple[list[int], list[int]]:
    """Drop zero values, which log axes cannot show (e.g. no KV cache in an encoder)."""
    pairs = [(x, y) for x, y in zip(xs, ys) if y > 0]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _log_length_axis(ax: Axes, data: dict[str, Any]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel(length_label(data))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)


def _flops_axis(ax: Axes, title: str, data: dict[str, Any]) -> None:
    ax.set_title(title, fontsize=12, loc="left")
    _log_length_axis(ax, data)
    ax.set_yscale("log")
    ax.set_ylabel("FLOPs (k = 10³, M = 10⁶, G = 10⁹, T = 10¹²)")
    ax.yaxis.set_major_locator(LogLocator(base=10))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: si_count(y)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _memory_axis(ax: Axes, title: str, data: dict[str, Any]) -> None:
    ax.set_title(title, fontsize=12, loc="left")
    _log_length_axis(ax, data)
    ax.set_yscale("log", base=2)
    ax.set_ylabel("memory (binary units: 1 MiB = 2²⁰ bytes)")
    ax.yaxis.set_major_locator(BinaryLocator())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: binary_bytes(y)))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _split(xs: Sequence[int], ys: Sequence[int], limits: Lengths
           ) -> tuple[tuple[list[int], list[int]], tuple[list[int], list[int]]]:
    """(within max_len, past it with figures) parts of a curve's positive points; both hold
    the point at max_len, so the faded part continues the solid one."""
    inside: tuple[list[int], list[int]] = ([], [])
    past: tuple[list[int], list[int]] = ([], [])
    for x, y in zip(*_positive(xs, ys)):
        if not limits.beyond(x):
            inside[0].append(x)
            inside[1].append(y)
        if limits.has_figures(x) and (limits.beyond(x) or x == limits.max_len):
            past[0].append(x)
            past[1].append(y)
    if len(past[0]) == 1:  # the max_len point alone: nothing past it
        past = ([], [])
    return inside, past


def _curve(ax: Axes, xs: Sequence[int], ys: Sequence[int], limits: Lengths,
           **style: Any) -> tuple[bool, bool]:
    """A variant's curve: solid within max_len, faded past it where it has figures, and a bar
    at max_len where a learned table ends it. Returns (faded part drawn, bar drawn)."""
    inside, past = _split(xs, ys, limits)
    if inside[0]:
        ax.plot(*inside, **style)
    if past[0]:
        ax.plot(*past, alpha=FADED, **style)
    ended = (limits.hard_limit is not None and bool(inside[0])
             and inside[0][-1] == limits.hard_limit and xs[-1] > limits.hard_limit)
    if ended:
        ax.plot([inside[0][-1]], [inside[1][-1]], marker="|", ms=14, mew=2.5,
                color=style.get("color"), ls="none", gid="max-len-end")
    return bool(past[0]), ended


def _figure(row: dict[str, Any], key: str) -> int | None:
    """The data's figure ``key`` at one length; None where it gives none (a learned table past
    its max_len: ``values`` null, or that figure null)."""
    values = row.get("values")
    return None if values is None else values.get(key)


def _extrapolated_points(ax: Axes, v: dict[str, Any], index: int, key: str,
                         colour: str) -> bool:
    """The table's † on the curve of figure ``key`` at each requested length past max_len
    that has that figure in the data; whether any was drawn."""
    pairs = [(row["seq"], _figure(row, key)) for row in v["at"] if row["beyond_max_len"]]
    points = [(x, y) for x, y in pairs if y is not None and y > 0]
    if points:
        ax.plot([p[0] for p in points], [p[1] for p in points], ls="none",
                marker=EXTRAPOLATED_MARKER, ms=15, color=colour,
                gid=EXTRAPOLATED_GID.format(variant=index, figure=key))
    return bool(points)


def _crossover_text(name: str, v: dict[str, Any]) -> str:
    """The legend's line for one variant: the headline (effective) crossover, then the dense
    one, so a sliding window's later (or absent) crossover is read beside the dense one."""
    c = v.get("crossover_effective", v["crossover"])
    if c["seq"] is None:
        text = f"{name}: attention < FFN at every S"
    else:
        text = f"{name}: attention = FFN at S ≈ {c['seq']:,.0f}"
        if v.get("max_len") and c["seq"] > v["max_len"]:
            text += f" (past max_len {v['max_len']:,})"
    dense = v["crossover"]["seq"]
    if c is not v["crossover"] and dense != c["seq"]:
        text += " (dense: " + ("none" if dense is None else f"S ≈ {dense:,.0f}") + ")"
    return text


def compare_figure(graphs: Sequence[Graph], data: dict[str, Any]) -> Figure:
    """The four-panel comparison figure (not saved)."""
    if len(graphs) != len(data["variants"]):
        raise ValueError("graphs and compare data disagree on the number of variants")
    fig = Figure(figsize=(13, 11), layout="constrained")
    (ax_flops, ax_cross), (ax_mem, ax_params) = fig.subplots(2, 2)
    colours = [f"C{i % 10}" for i in range(len(graphs))]
    xs = lengths_for(data)
    batch = data["batch"]
    names = [plot_text(v["name"]) for v in data["variants"]]
    any_past = any_end = any_dagger = False
    for i, (graph, v, colour) in enumerate(zip(graphs, data["variants"], colours)):
        limits = graph.info.lengths or Lengths(graph.name, None, "none")
        s = series(graph, xs, batch)
        drawn = [_curve(ax_flops, xs, s["flops.forward_effective"], limits, color=colour,
                        lw=2),
                 _curve(ax_flops, xs, s["flops.forward"], limits, color=colour, **DENSE_STYLE),
                 _curve(ax_cross, xs, s["flops_by_kind_effective.attention_scores"], limits,
                        color=colour, ls="--", lw=1.8),
                 _curve(ax_cross, xs, s["flops_by_kind.attention_scores"], limits,
                        color=colour, ls="-.", lw=0.9),
                 _curve(ax_cross, xs, s["flops_by_kind.ffn"], limits, color=colour, ls=":",
                        lw=2.2)]
        for key, ls, _ in MEMORY_STYLES:
            drawn.append(_curve(ax_mem, xs, s[key], limits, color=colour, ls=ls, lw=1.8))
            any_dagger |= _extrapolated_points(ax_mem, v, i, key, colour)
        any_dagger |= _extrapolated_points(ax_flops, v, i, "flops.forward_effective", colour)
        c = v.get("crossover_effective", v["crossover"])
        if c["seq"] and c["seq"] <= MAX_LENGTH and limits.has_figures(math.ceil(c["seq"])):
            ax_flops.plot([c["seq"]], [c["forward_flops_at_crossover"]], marker="o", ms=8,
                          mfc="white", mec=colour, mew=2, ls="none", gid=f"crossover-{i}")
            ax_cross.plot([c["seq"]], [c["flops_each_at_crossover"]], marker="o", ms=9,
                          mfc=colour, mec="black", ls="none")
            ax_cross.axvline(c["seq"], color=colour, lw=0.8, alpha=0.5)
        any_past = any_past or any(faded for faded, _ in drawn)
        any_end = any_end or any(ended for _, ended in drawn)
    for seq in data["seqs"]:
        for ax in (ax_flops, ax_cross, ax_mem):
            ax.axvline(seq, color="#999999", lw=0.6, ls=(0, (1, 3)))
    _flops_axis(ax_flops, f"Forward FLOPs, work done (—) and dense (···) (batch {batch})",
                data)
    _flops_axis(ax_cross, "Attention-score (dashed) vs FFN (dotted) FLOPs", data)
    _memory_axis(ax_mem, "Memory: activations peak (—), KV cache (--), train step (-.)", data)
    below = {"loc": "upper center", "bbox_to_anchor": (0.5, -0.16), "frameon": False}
    ax_cross.legend(handles=[Line2D([], [], color="#333333", ls="--", label="attention scores"),
                             Line2D([], [], color="#333333", ls="-.", lw=0.9,
                                    label="attention, dense"),
                             Line2D([], [], color="#333333", ls=":", lw=2.2, label="FFN"),
                             Line2D([], [], marker="o", mfc="#bbbbbb", mec="black", ls="none",
                                    label="attention = FFN")],
                    fontsize=9, ncol=4, **below)
    ax_mem.legend(handles=[Line2D([], [], color="#333333", ls=ls, label=label)
                           for _, ls, label in MEMORY_STYLES], fontsize=9, ncol=3, **below)
    _params_panel(ax_params, data, below)
    handles = [Line2D([], [], color=colour, lw=3, label=_crossover_text(name, v))
               for name, colour, v in zip(names, colours, data["variants"])]
    handles.append(Line2D([], [], marker="o", ms=8, mfc="white", mec="#333333", mew=2,
                          ls="none", label="attention-score FLOPs = FFN FLOPs (crossover; "
                                           "attention over the keys each query reads)"))
    if any_past:
        handles.append(Line2D([], [], color="#333333", lw=2, alpha=FADED,
                              label="faded: past the spec's max_len, extrapolated"))
    if any_dagger:
        handles.append(Line2D([], [], color="#333333", marker=EXTRAPOLATED_MARKER, ms=12,
                              ls="none", label="a requested length past max_len (the table's †)"))
    if any_end:
        handles.append(Line2D([], [], color="#333333", marker="|", ms=12, mew=2.5, ls="none",
                              label="max_len of a learned position table: no figures past it"))
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=9,
               frameon=False)
    fig.suptitle("tfgraph compare: " + " vs ".join(names), fontsize=14)
    return fig


def _params_panel(ax: Axes, data: dict[str, Any], below: dict[str, Any]) -> None:
    names = [plot_text(v["name"]) for v in data["variants"]]
    left = [0.0] * len(names)
    kinds = order_kinds({k: 0 for v in data["variants"] for k in v["params_by_kind"]})
    for i, kind in enumerate(kinds):
        widths = [float(v["params_by_kind"].get(kind, 0)) for v in data["variants"]]
        ax.barh(names, widths, left=left, color=PARAM_COLOURS.get(kind, f"C{i % 10}"),
                label=plot_text(kind_title(kind)), edgecolor="white")
        left = [a + b for a, b in zip(left, widths)]
    for i, v in enumerate(data["variants"]):
        ax.text(left[i], i, f"  {human_params(v['params'])}", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.22 if max(left) > 0 else 1)
    ax.set_title("Parameters by kind (a sublayer's norms count with it)", fontsize=12,
                 loc="left")
    ax.set_xlabel("parameters (k = 10³, M = 10⁶, G = 10⁹)")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: prefixed(x, PARAMS, "g")))
    ax.grid(True, axis="x", alpha=0.35)
    ax.legend(fontsize=9, ncol=4, **below)


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
