"""Look and labels shared by every diagram level: colours by kind, fonts, the legend, number
and shape formatting, DOT escaping, and the optional params / FLOP-share annotations.

Colours are data (one table) so every level agrees and the legend is generated from it; only
kinds that appear in a drawing are listed, in the table's order, so DOT output is stable.

Every label, title and node id goes through this module's escaping (``dot_label``,
``dot_id``): names come from users (a spec's name, the names of a hand-built graph), and DOT
gives meaning to quotes, backslashes (``\\N``, ``\\G``, ``\\l`` expand inside labels), ``<...>``
(an HTML-like label), ``:`` in an edge end (a port) and raw control characters (which would
make the rendered SVG invalid XML). Labels are written as plain text lines; only this module
writes DOT syntax.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from typing import Any

import graphviz

from tfgraph.passes import cost
from tfgraph.graph.ir import Graph, Shape
from tfgraph.graph.ops import OPS
from tfgraph.prefixes import PARAMS, prefixed
from tfgraph.terminal import printable

FONT = "Helvetica"

# kind -> (fill colour, legend text). Order is the legend's order.
PALETTE: dict[str, tuple[str, str]] = {
    "io": ("#eeeeee", "input / output"),
    "table": ("#fff3c4", "token table (parameter)"),
    "embedding": ("#fddbb0", "embedding / positions"),
    "stack": ("#dde7f3", "layer stack"),
    "self_attention": ("#a9cdf0", "self-attention (bidirectional)"),
    "masked_attention": ("#c9b6ec", "masked (causal) self-attention"),
    "cross_attention": ("#a6dfc0", "cross-attention (over encoder output)"),
    "linear": ("#d6e4f0", "linear projection"),
    "rope": ("#f6c6de", "rotary positions"),
    "ffn": ("#f9c9a4", "feed-forward"),
    "activation": ("#fbe0c8", "activation / gate"),
    "norm": ("#fff2a8", "normalisation"),
    "add": ("#ffffff", "residual add"),
    "dropout": ("#f2f2f2", "dropout"),
    "head": ("#cfd8dc", "output head"),
}

def op_title(op: str) -> str:
    """An op's name as diagrams write it (``OpDef.title``: "LayerNorm", "GELU (tanh)"), else
    the op's own name (or ``op`` itself, e.g. a spec's activation that is no op)."""
    title = OPS[op].title if op in OPS else None
    return title if title is not None else op


def gated_title(op: str) -> str | None:
    """The name of a feed-forward gated by activation ``op`` (``OpDef.gated_title``:
    "SwiGLU"), None when it has none."""
    return OPS[op].gated_title if op in OPS else None


# Ids made only of these characters are written as they are (readable DOT, stable golden
# files); any other id is spelled in hex, since ':' splits an edge end into node and port.
_PLAIN_ID_CHARS = frozenset(string.ascii_letters + string.digits + "_.-")


def dot_text(line: str) -> str:
    """One line of text as the literal content of a DOT label: control characters, line
    separators and bidi controls written as visible escapes, backslashes doubled (so graphviz
    expands none of ``\\N``, ``\\G``, ``\\n``), quotes escaped."""
    return printable(line).replace("\\", "\\\\").replace('"', '\\"')


def dot_label(text: str, end: str = "\\n") -> str:
    """A plain multi-line label (lines joined by "\\n") as a DOT string: each line escaped by
    ``dot_text`` and ended by ``end`` ("\\l" left-justifies), never read as an HTML label."""
    lines = [dot_text(line) for line in text.split("\n")]
    joined = end.join(lines) + (end if end != "\\n" else "")
    return graphviz.nohtml(joined)


def dot_id(name: str) -> str:
    """A DOT node or graph id for ``name``: itself when made of letters, digits, '_', '.' and
    '-', else ``id_`` and its UTF-8 bytes in hex (one-to-one, so edges still meet)."""
    if name and all(ch in _PLAIN_ID_CHARS for ch in name):
        return name
    return "id_" + name.encode("utf-8", "surrogatepass").hex()


def edge(dot: graphviz.Digraph, tail: str, head: str, label: str = "", **attrs: str) -> None:
    """An edge between two ids (escaped here) with an optional plain-text label."""
    if label:
        attrs["label"] = dot_label(label)
    dot.edge(dot_id(tail), dot_id(head), **attrs)


def new_digraph(name: str, title: str) -> graphviz.Digraph:
    """A top-to-bottom digraph with the house fonts; ``title`` (plain text) is printed above
    the drawing."""
    dot = graphviz.Digraph(name=dot_id(name))
    dot.attr(rankdir="TB", fontname=FONT, fontsize="16", labelloc="t", label=dot_label(title),
             nodesep="0.35", ranksep="0.45", newrank="true")
    dot.attr("node", fontname=FONT, fontsize="12", shape="box", style="rounded,filled",
             margin="0.15,0.06")
    dot.attr("edge", fontname=FONT, fontsize="10", color="#555555", arrowsize="0.7")
    return dot


def fill(kind: str) -> str:
    return PALETTE[kind][0]


class KindTracker:
    """Remembers which kinds a drawing used, for its legend."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def node(self, dot: graphviz.Digraph, name: str, label: str, kind: str,
             **attrs: str) -> None:
        """Node ``name`` with the plain-text ``label`` in the colour of ``kind``."""
        self.used.add(kind)
        dot.node(dot_id(name), label=dot_label(label), fillcolor=fill(kind), **attrs)

    def legend(self, dot: graphviz.Digraph, note: str = "") -> None:
        """An HTML-table node listing the used kinds with their colours, in palette order."""
        rows = []
        for kind, (colour, text) in PALETTE.items():
            if kind in self.used:
                rows.append(f'<TR><TD BGCOLOR="{colour}" BORDER="1" FIXEDSIZE="TRUE" '
                            f'WIDTH="22" HEIGHT="14"></TD><TD ALIGN="LEFT">{_html(text)}</TD></TR>')
        table = ('<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="3" CELLPADDING="1">'
                 '<TR><TD COLSPAN="2" ALIGN="LEFT"><B>Legend</B></TD></TR>'
                 + "".join(rows) + "</TABLE>>")
        # Notes are a second node under the swatches: in the same table a long note would
        # stretch the colour column.
        lines = [line for line in note.split("; ") if line]
        with dot.subgraph(name="cluster_legend") as leg:
            leg.attr(label="", style="rounded", color="#bbbbbb")
            leg.node("legend", label=table, shape="plaintext", style="", fontsize="11")
            if lines:
                text = dot_label("\n".join(lines), end="\\l")
                leg.node("legend_notes", label=text, shape="plaintext", style="",
                         fontsize="10", margin="0")
                leg.edge("legend", "legend_notes", style="invis")


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def shape_text(shape: Shape) -> str:
    """``(B, S, 512)`` -> ``B×S×512``."""
    return "×".join(str(d) for d in shape)


def count(n: int) -> str:
    """Thousands separators: 37000 -> ``37,000``."""
    return f"{n:,}"


def short_count(n: float) -> str:
    """A parameter count: 63084544 -> ``63.1M``, 1.1e9 -> ``1.1B`` (tfgraph.prefixes)."""
    return prefixed(n, PARAMS, ".3g")


def percent(share: float) -> str:
    """0.245 -> ``24.5%``; small shares keep two significant digits (``0.031%``)."""
    pct = 100 * share
    if pct == 0 or pct >= 0.1:
        return f"{pct:.1f}%"
    return f"{pct:.2g}%"


class Annotator:
    """Per-node extra lines: unique parameters and share of forward FLOPs (from the report's
    per-op costs at ``batch`` x ``seq``, the same numbers ``graph.report()`` sums). ``seq``
    defaults as graph.report()'s and follows tfgraph.graph.lengths past the spec's max_len."""

    def __init__(self, graph: Graph, what: Iterable[str], batch: int = 1,
                 seq: int | None = None) -> None:
        self.graph = graph
        self.what = tuple(w for w in ("params", "flops") if w in set(what))
        unknown = set(what) - {"params", "flops"}
        if unknown:
            raise ValueError(f"annotate: unknown {sorted(unknown)}; use params and/or flops")
        seq = graph.info.default_seq if seq is None else seq
        self.batch, self.seq = batch, seq
        self._flops: dict[str, int] = {}
        self._owned: dict[str, list[str]] = {}
        claimed: set[str] = set()
        for node in graph.ops():
            for i in node.inputs:
                if graph.node(i).is_param and i not in claimed:
                    claimed.add(i)
                    self._owned.setdefault(node.name, []).append(i)
        self.total = 0
        if "flops" in self.what:
            from tfgraph.passes.figures import symbolic
            from tfgraph.passes.report import build_report, sizes_for

            graph.info.check_lengths(("seq", seq))
            rep = build_report(graph, batch=batch, seq=seq)
            sizes = sizes_for(graph, batch, seq, None)
            for c in symbolic(graph)["costs"]:
                self._flops[c.node] = int((c.matmul + c.other).xreplace(sizes))
            self.total = rep["flops"]["forward"]

    @property
    def active(self) -> bool:
        return bool(self.what)

    def params(self, nodes: Iterable[str], skip: frozenset[str] = frozenset()) -> int:
        """Unique parameters of ``nodes``; a parameter read by several ops (a tied table) is
        counted with its first reader only, so the numbers across a drawing add up to the
        report's total."""
        total = 0
        for name in set(nodes):
            for p in self._owned.get(name, ()):
                if p not in skip:
                    total += self.param_count(p)
        return total

    def param_count(self, param: str) -> int:
        return cost.param_count(self.graph.node(param))

    def text(self, nodes: Iterable[str], prefix: str = "",
             skip: frozenset[str] = frozenset()) -> str:
        """``prefix1.2M params · 3.4% FLOPs`` for the union of ``nodes`` ('' when off)."""
        nodes = list(nodes)
        parts = []
        if "params" in self.what:
            parts.append(f"{short_count(self.params(nodes, skip))} params")
        if "flops" in self.what and self.total:
            share = sum(self._flops.get(n, 0) for n in nodes) / self.total
            parts.append(f"{percent(share)} FLOPs")
        return prefix + " · ".join(parts) if parts else ""

    def table_text(self, param: str) -> str:
        """``16.4k params`` for a token table drawn as a box of its own (the model level):
        counted there once, however many ops read it (a tied table), and left out of the
        boxes of its readers; '' when params are not annotated."""
        if "params" not in self.what:
            return ""
        return f"{short_count(self.param_count(param))} params"

    def note(self) -> str:
        if "flops" in self.what:
            return f"FLOP share of the forward pass at B={self.batch}, S=T={self.seq}"
        return ""


def join_lines(*lines: Any) -> str:
    """A multi-line plain label from the non-empty lines."""
    return "\n".join(str(line) for line in lines if line)
