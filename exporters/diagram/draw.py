"""Architecture diagrams (graphviz) drawn from the compiled graph (README, ``tfgraph draw``).

Levels:
- ``model``: embeddings, one folded box per layer stack (``× N``), the cross-attention edge, head;
- ``layer``: one layer of each stack in a cluster labelled ``× N``, every sublayer with its norm
  where the graph's edges put it, residual edges, masked vs cross attention told apart;
- ``op``: every op in clusters per scope, edges labelled with symbolic shapes (``B×S×512``),
  repeated layers folded unless ``unfold=True``.

``write_diagram`` is the one entry point (``tfgraph draw`` and ``tfgraph build --to svg|png|dot``
call it). Every level reads the graph alone (node metadata, ops, attributes and edges; see
``diagram_structure``), never the spec. DOT text is deterministic (graph order, palette order),
so it is golden-tested; rendering needs the graphviz ``dot`` program, and without it the DOT
file is still written and a one-line ``TfgraphError`` says how to install it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import graphviz

from tfgraph.errors import TfgraphError
from tfgraph.io import atomic_write
from tfgraph.graph.ir import Graph
from tfgraph.terminal import printable

FORMATS = ("svg", "png", "pdf", "dot")
LEVELS = ("model", "layer", "op")
PNG_DPI = "144"  # graphviz's default 96 dpi makes 12 pt text blurry in PNGs
MAX_RENDERED_BOXES = 3000
"""Boxes (graph nodes) of a diagram ``dot`` renders to svg, png or pdf. Its layout grows much
faster than the boxes (ranking, crossing minimisation): here a TinyLlama of 180 layers drawn
``--level op --unfold`` (2,888 boxes) took 11 s, 256 layers (4,104) 40 s, 1,024 layers ran
for minutes; Llama 3.1 405B unfolded is about 2,000. The DOT text of any size is written."""

_BOX = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\w+) \[')
"""A node statement of graphviz's DOT output (``name [label=...]``; an edge has ``->`` after
its first name, and ``node [``/``edge [``/``graph [`` set defaults)."""
_DEFAULTS = ("node", "edge", "graph")


def boxes(source: str) -> int:
    """The nodes a DOT text declares (one statement each, as ``graphviz.Digraph`` writes)."""
    count = 0
    for line in source.splitlines():
        match = _BOX.match(line)
        if match is not None and match.group(1) not in _DEFAULTS:
            count += 1
    return count


def build_diagram(graph: Graph, level: str = "model", *, unfold: bool = False,
                  annotate: Iterable[str] | str = (), batch: int = 1,
                  seq: int | None = None) -> graphviz.Digraph:
    """The diagram of ``graph`` at ``level`` as a ``graphviz.Digraph`` (not rendered).

    ``annotate``: "params" and/or "flops" (FLOP share of the forward pass at batch x seq;
    seq defaults to 128, or max_len when that is smaller; past max_len: tfgraph.graph.lengths).
    ``unfold``: op level only; draw every layer instead of the first of each stack.
    """
    from tfgraph.exporters.diagram.layer import build_layer
    from tfgraph.exporters.diagram.model import build_model
    from tfgraph.exporters.diagram.op import build_op
    from tfgraph.exporters.diagram.style import Annotator

    if level not in LEVELS:
        raise TfgraphError(f"diagram level {level!r}: choose one of {', '.join(LEVELS)}")
    if unfold and level != "op":
        raise TfgraphError(f"--unfold applies to --level op only (not {level})")
    if isinstance(annotate, str):
        annotate = [a for a in annotate.split(",") if a]
    try:
        ann = Annotator(graph, list(annotate), batch=batch, seq=seq)
    except ValueError as exc:
        raise TfgraphError(str(exc)) from None
    if level == "model":
        return build_model(graph, ann)
    if level == "layer":
        return build_layer(graph, ann)
    return build_op(graph, ann, unfold=unfold)


def diagram_source(graph: Graph, level: str = "model", **options: Any) -> str:
    """The DOT text of the diagram (what ``fmt="dot"`` writes)."""
    return build_diagram(graph, level, **options).source


def render(source: str, fmt: str) -> bytes:
    """Run graphviz ``dot`` on DOT text; raises ``graphviz.ExecutableNotFound`` without it."""
    return graphviz.pipe("dot", fmt, source.encode("utf-8"), quiet=True)


def missing_dot_message(fmt: str, dot_path: Path) -> str:
    return (f"cannot render {fmt}: the graphviz 'dot' program is not on PATH (install it: "
            f"apt-get install graphviz, or brew install graphviz); wrote the DOT source to "
            f"{printable(str(dot_path))} instead")


def write_diagram(graph: Graph, path: Path | str | os.PathLike[str], fmt: str,
                  level: str = "model", **options: Any) -> Path:
    """Write the diagram of ``graph`` to ``path`` as ``fmt`` (svg, png, pdf or dot), atomically.

    Options: ``unfold`` (op level), ``annotate`` ("params", "flops"), ``batch``, ``seq``.
    Without the ``dot`` program, non-DOT formats write ``path`` with suffix ``.dot`` and raise
    ``TfgraphError`` (exit 2) saying so. Returns ``path``.
    """
    path = Path(path)
    if fmt not in FORMATS:
        raise TfgraphError(f"diagram format {fmt!r}: choose one of {', '.join(FORMATS)}")
    dot = build_diagram(graph, level, **options)
    if fmt == "dot":
        with atomic_write(path) as handle:
            handle.write(dot.source)
        return path
    drawn = boxes(dot.source)
    if drawn > MAX_RENDERED_BOXES:  # refused before dot runs: nothing is written
        raise TfgraphError(f"{printable(str(path))}: {drawn:,} boxes; graphviz renders at most "
                           f"{MAX_RENDERED_BOXES:,} in reasonable time (minutes past it): write "
                           f"the DOT text with -o {printable(path.stem)}.dot, or draw fewer "
                           "(without --unfold)")
    if fmt == "png":
        dot.attr(dpi=PNG_DPI)
    try:
        data = render(dot.source, fmt)
    except graphviz.ExecutableNotFound:
        dot_path = path.with_suffix(".dot")
        with atomic_write(dot_path) as handle:
            handle.write(build_diagram(graph, level, **options).source)
        raise TfgraphError(f"{printable(str(path))}: {missing_dot_message(fmt, dot_path)}"
                           ) from None
    except graphviz.CalledProcessError as exc:
        detail = " ".join((exc.stderr or b"").decode("utf-8", "replace").split())[:300]
        raise TfgraphError(f"{printable(str(path))}: graphviz dot failed: {printable(detail)}"
                           ) from None
    with atomic_write(path, "wb") as handle:
        handle.write(data)
    return path
