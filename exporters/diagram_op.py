"""Op-level diagram: every op of the graph in nested clusters per scope, every data edge
labelled with the symbolic shape of the tensor it carries (``B×S×512``).

Layers repeat, so by default only layer 0 of each stack is drawn (its cluster says ``× N``) and
every edge that touches layer i > 0 is mapped onto layer 0: the encoder output read by all
decoder layers and the last layer feeding the final norm become edges of layer 0. ``unfold``
draws every layer. Parameters are not nodes here; each op's label says what it multiplies by.
"""

from __future__ import annotations

import re

import graphviz

from tfgraph.exporters.diagram_labels import attention_kind, dropout_text, linear_text, spec_of
from tfgraph.exporters.diagram_style import (
    ACTIVATION_OPS,
    NORM_OPS,
    Annotator,
    KindTracker,
    count,
    join_lines,
    new_digraph,
    shape_text,
)
from tfgraph.ir import Graph, Node

_LAYER = re.compile(r"^(encoder|decoder)\.layers\.(\d+)(?=\.|$)")
RESIDUAL_STYLE = {"style": "dashed,bold", "color": "#777777"}


def _layer_index(name: str) -> int | None:
    m = _LAYER.match(name)
    return int(m.group(2)) if m else None


def _fold(name: str) -> str:
    """The layer-0 twin of a node name or scope in any layer."""
    return _LAYER.sub(r"\1.layers.0", name)


def op_kind(node: Node) -> str:
    if node.op == "input":
        return "io"
    if node.op in ("embedding", "scale", "positions_sinusoidal", "positions_learned"):
        return "embedding"
    if node.op == "attention":
        return attention_kind(node)
    if node.op in NORM_OPS:
        return "norm"
    if node.op in ACTIVATION_OPS:
        return "activation"
    if node.op in ("add", "dropout", "rope"):
        return node.op
    return "head" if node.scope == "head" else "linear"


def op_text(graph: Graph, node: Node) -> str:
    """What the op does, in a few words, with the sizes of its parameters."""
    a = node.attrs
    if node.op == "linear":
        weight = graph.node(node.inputs[1])
        tied = f"\nweight {weight.name} (tied)" if weight.scope != node.scope else ""
        return f"linear {linear_text(graph, node)}{tied}"
    if node.op == "attention":
        heads = f"{a['heads']}×{a['head_dim']}"
        if a["kv_heads"] != a["heads"]:
            heads += f", kv {a['kv_heads']}"
        flags = [a["kind"], "causal" if a["causal"] else "", a["normalize"]]
        return f"attention {heads}\n" + ", ".join(f for f in flags if f)
    if node.op == "embedding":
        rows, cols = graph.node(node.inputs[0]).attrs["shape"]
        return f"gather {count(rows)} × {count(cols)}"
    if node.op == "scale":
        return f"× {a['factor']:.4g}"
    if node.op == "positions_sinusoidal":
        return "+ sinusoidal positions"
    if node.op == "positions_learned":
        rows, cols = graph.node(node.inputs[1]).attrs["shape"]
        return f"+ learned positions {count(rows)} × {cols}"
    if node.op == "rope":
        return f"rope θ={a['theta']:g}"
    if node.op == "dropout":
        return dropout_text(node)
    if node.op == "mul":
        return "mul (gate)"
    if node.op == "input":
        return shape_text(node.type.shape)
    return node.op


class _Cluster:
    def __init__(self, scope: str) -> None:
        self.scope = scope
        self.items: list[object] = []  # Node or _Cluster, in first-appearance order
        self.children: dict[str, _Cluster] = {}


def _cluster_scopes(scope: str) -> list[str]:
    """Enclosing cluster scopes of a node scope, outermost first ('decoder',
    'decoder.layers.0', 'decoder.layers.0.ffn'); the bare 'decoder.layers' level is skipped."""
    if scope == "inputs":
        return []
    parts = scope.split(".")
    out = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return [s for s in out if not s.endswith(".layers")]


def build_op(graph: Graph, ann: Annotator, unfold: bool = False) -> graphviz.Digraph:
    spec = spec_of(graph)
    kinds = KindTracker()
    mode = "every layer" if unfold else "layers folded"
    dot = new_digraph(f"{graph.name}-op", f"{graph.name} — ops ({mode})")
    drawn = [n for n in graph.nodes() if not n.is_param
             and (unfold or (_layer_index(n.name) or 0) == 0)]
    # all nodes a drawn node stands for (itself, and its twins in folded layers)
    stands_for: dict[str, list[str]] = {}
    for n in graph.ops():
        stands_for.setdefault(n.name if unfold else _fold(n.name), []).append(n.name)

    # Scope tree; a cluster only where a scope holds two or more drawn nodes.
    sizes: dict[str, int] = {}
    for n in drawn:
        for s in _cluster_scopes(n.scope):
            sizes[s] = sizes.get(s, 0) + 1
    root = _Cluster("")
    for n in drawn:
        here = root
        for s in _cluster_scopes(n.scope):
            if sizes[s] < 2:
                break
            if s not in here.children:
                here.children[s] = _Cluster(s)
                here.items.append(here.children[s])
            here = here.children[s]
        here.items.append(n)

    def emit(target: graphviz.Digraph, cluster: _Cluster) -> None:
        for item in cluster.items:
            if isinstance(item, _Cluster):
                with target.subgraph(name=f"cluster_{item.scope}") as sub:
                    sub.attr(label=_cluster_label(item.scope), labeljust="l", style="rounded",
                             color="#9aa9bd", fontsize="13")
                    emit(sub, item)
                continue
            assert isinstance(item, Node)
            short = item.name[len(item.scope) + 1:] if item.name.startswith(item.scope + ".") \
                else item.name
            folded = stands_for.get(item.name, [item.name])
            note = "" if item.op == "input" else ann.text(
                folded, prefix=f"all {len(folded)}: " if len(folded) > 1 else "")
            extra = {"peripheries": "2"} if item.name in graph.outputs else {}
            if item.op == "input":
                extra.update(shape="ellipse", style="filled")
            what = op_text(graph, item)
            if what.startswith(short):  # "dropout 0.1", not "dropout / dropout 0.1"
                short = ""
            kinds.node(target, item.name, join_lines(short, what, note),
                       op_kind(item), **extra)

    def _cluster_label(scope: str) -> str:
        i = _layer_index(scope)
        if i is not None and scope.count(".") == 2:
            stack = scope.split(".")[0]
            n = spec.layer_count(stack)
            if unfold or n == 1:
                return f"layers.{i} (of {n})"
            return f"layers.0 (× {n}: one drawn, all identical)"
        return scope.rsplit(".", 1)[-1]

    emit(dot, root)

    drawn_names = {n.name for n in drawn}
    seen: set[tuple[str, str, int]] = set()
    for dst in graph.ops():
        if dst.name not in drawn_names:
            continue
        for operand, src_name in enumerate(dst.inputs):
            src = graph.node(src_name)
            if src.is_param:
                continue
            src_drawn = src_name if unfold else _fold(src_name)
            if (src_drawn, dst.name, operand) in seen:
                continue
            seen.add((src_drawn, dst.name, operand))
            attrs: dict[str, str] = {}
            label = shape_text(src.type.shape)
            if dst.op == "add" and dst.name.endswith(".residual") and operand == 0:
                attrs = dict(RESIDUAL_STYLE)
                label += " (residual)"
            if src_drawn != src_name:
                label += f"\\n(from layers.{_layer_index(src_name)})"
            dot.edge(src_drawn, dst.name, label=f" {label}", **attrs)
    kinds.legend(dot, "; ".join(x for x in [
        "edge labels: tensor shapes (B batch, S source / only length, T target length)",
        "bold dashed edge: residual path",
        "'all N:' figures sum over the folded layers" if ann.active and not unfold else "",
        ann.note()] if x))
    return dot
