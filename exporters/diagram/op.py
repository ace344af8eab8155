"""Op-level diagram: every op of the graph in nested clusters (stack, layer, sublayer, or
part), every data edge labelled with the symbolic shape of the tensor it carries
(``B×S×512``).

Layers repeat, so by default only layer 0 of each stack is drawn (its cluster says ``× N``) and
every edge that touches layer i > 0 is mapped onto layer 0 by node metadata (the node of layer
0 with the same stack, sublayer and role): the encoder output read by all decoder layers and
the last layer feeding the final norm become edges of layer 0. ``unfold`` draws every layer.
Parameters are not nodes here; each op's label says what it multiplies by.
"""

from __future__ import annotations

from typing import Any

import graphviz

from tfgraph.exporters.diagram.ops import row
from tfgraph.exporters.diagram.structure import stacks
from tfgraph.exporters.diagram.style import (
    Annotator,
    KindTracker,
    dot_id,
    dot_label,
    edge,
    join_lines,
    new_digraph,
    shape_text,
)
from tfgraph.exporters.diagram.words import name
from tfgraph.graph.ir import Graph, Node

RESIDUAL_STYLE = {"style": "dashed,bold", "color": "#777777"}
# The parts that colour their ops, but for those whose row ``keeps_kind``.
PART_KINDS = {"embed": "embedding", "head": "head"}


def op_kind(node: Node) -> str:
    """Palette kind of a node: a graph input's, else its op's row's, or its part's."""
    if node.op == "input":
        return "io"
    op = row(node)
    if not op.keeps_kind and node.meta.part in PART_KINDS:
        return PART_KINDS[node.meta.part]
    return op.palette(node)


def layer0_twin(graph: Graph, node: Node) -> Node:
    """The node of layer 0 doing ``node``'s job (itself outside layers and in layer 0)."""
    if node.meta.layer in (None, 0):
        return node
    return graph.by_meta().get(node.meta.in_layer(0).key, node)


def _short(node: Node) -> str:
    """A node's job within its cluster: its role ("q", "residual"), else its name."""
    return name(node.meta.role or node.name)


def op_text(graph: Graph, node: Node) -> str:
    """What the node does, in a few words, with the sizes of its parameters (its op's row's
    ``text``, else the op's name); a graph input's shape."""
    if node.op == "input":
        return shape_text(node.type.shape)
    text = row(node).text
    return text(graph, node) if text is not None else node.op


class _Cluster:
    """A cluster of the drawing: its key (a path of metadata fields), label and contents."""

    def __init__(self, key: tuple[Any, ...], label: str) -> None:
        self.key = key
        self.label = label
        self.items: list[object] = []  # Node or _Cluster, in first-appearance order
        self.children: dict[tuple[Any, ...], _Cluster] = {}

    @property
    def id(self) -> str:
        """``cluster_decoder.layers.0.ffn``-style id from the key."""
        return "cluster_" + dot_id(".".join(str(k) for k in self.key))


def _cluster_path(node: Node, layer_label: dict[tuple[str, int], str]
                  ) -> list[tuple[tuple[Any, ...], str]]:
    """(key, label) of the clusters enclosing ``node``, outermost first: its stack, then the
    stack's embedding, or its layer and sublayer; a part outside stacks ("head") alone."""
    m = node.meta
    if node.op == "input" or not m.part:
        return []
    if m.stack is None:
        return [((m.part,), m.part)]
    path: list[tuple[tuple[Any, ...], str]] = [((m.stack,), m.stack)]
    if m.part == "embed":
        path.append(((m.stack, "embed"), "embed"))
    elif m.part == "layer" and m.layer is not None:
        layer_key = (m.stack, "layers", m.layer)
        path.append((layer_key, layer_label[(m.stack, m.layer)]))
        if m.sublayer is not None:
            path.append(((*layer_key, m.sublayer), m.sublayer))
    return path


def _layer_labels(graph: Graph, unfold: bool) -> dict[tuple[str, int], str]:
    """Label of each layer's cluster: ``layers.0 (× 6: one drawn, all identical)`` folded."""
    out = {}
    for stack in stacks(graph):
        for i in range(stack.layers):
            if unfold or stack.layers == 1:
                out[(stack.name, i)] = f"layers.{i} (of {stack.layers})"
            else:
                out[(stack.name, i)] = f"layers.{i} (× {stack.layers}: one drawn, all identical)"
    return out


def _cluster_tree(drawn: list[Node], layer_label: dict[tuple[str, int], str]) -> _Cluster:
    """Nested clusters of the drawn nodes; a cluster only where two or more nodes share it."""
    sizes: dict[tuple[Any, ...], int] = {}
    for n in drawn:
        for key, _ in _cluster_path(n, layer_label):
            sizes[key] = sizes.get(key, 0) + 1
    root = _Cluster((), "")
    for n in drawn:
        here = root
        for key, label in _cluster_path(n, layer_label):
            if sizes[key] < 2:
                break
            if key not in here.children:
                here.children[key] = _Cluster(key, label)
                here.items.append(here.children[key])
            here = here.children[key]
        here.items.append(n)
    return root


def build_op(graph: Graph, ann: Annotator, unfold: bool = False) -> graphviz.Digraph:
    """The op-level drawing of ``graph`` (layer 0 of each stack unless ``unfold``)."""
    kinds = KindTracker()
    mode = "every layer" if unfold else "layers folded"
    dot = new_digraph(f"{graph.name}-op", f"{name(graph.name)} — ops ({mode})")
    drawn = [n for n in graph.nodes() if not n.is_param and (unfold or n.meta.layer in (None, 0))]
    twin = {n.name: (n if unfold else layer0_twin(graph, n)) for n in graph.nodes()}
    # all nodes a drawn node stands for (itself, and its twins in folded layers)
    stands_for: dict[str, list[str]] = {}
    for n in graph.ops():
        stands_for.setdefault(twin[n.name].name, []).append(n.name)
    layer_label = _layer_labels(graph, unfold)

    def emit(target: graphviz.Digraph, cluster: _Cluster) -> None:
        for item in cluster.items:
            if isinstance(item, _Cluster):
                with target.subgraph(name=item.id) as sub:
                    sub.attr(label=dot_label(item.label), labeljust="l", style="rounded",
                             color="#9aa9bd", fontsize="13")
                    emit(sub, item)
                continue
            assert isinstance(item, Node)
            short = _short(item)
            folded = stands_for.get(item.name, [item.name])
            extra = {"peripheries": "2"} if item.name in graph.outputs else {}
            note = ""
            if item.op == "input":  # data, not work: no annotation
                extra.update(shape="ellipse", style="filled")
            else:
                note = ann.text(folded, prefix=f"all {len(folded)}: " if len(folded) > 1 else "")
            what = op_text(graph, item)
            if what.startswith(short):  # "dropout 0.1", not "dropout / dropout 0.1"
                short = ""
            kinds.node(target, item.name, join_lines(short, what, note), op_kind(item), **extra)

    emit(dot, _cluster_tree(drawn, layer_label))

    drawn_names = {n.name for n in drawn}
    seen: set[tuple[str, str, int]] = set()
    for dst in graph.ops():
        if dst.name not in drawn_names:
            continue
        for operand, src_name in enumerate(dst.inputs):
            src = graph.node(src_name)
            if src.is_param:
                continue
            src_drawn = twin[src_name].name
            if (src_drawn, dst.name, operand) in seen:
                continue
            seen.add((src_drawn, dst.name, operand))
            attrs: dict[str, str] = {}
            label = shape_text(src.type.shape)
            if dst.meta.role == "residual" and operand == 0:
                attrs = dict(RESIDUAL_STYLE)
                label += " (residual)"
            if src_drawn != src_name:
                label += f"\n(from layers.{src.meta.layer})"
            edge(dot, src_drawn, dst.name, f" {label}", **attrs)
    kinds.legend(dot, "; ".join(x for x in [
        "edge labels: tensor shapes (B batch, S source / only length, T target length)",
        "bold dashed edge: residual path",
        "'all N:' figures sum over the folded layers" if ann.active and not unfold else "",
        ann.note()] if x))
    return dot
