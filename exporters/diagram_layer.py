"""Layer-level diagram: one layer of each stack in a cluster labelled ``× N``.

The layer is read off the compiled graph, not re-described: the ops of each sublayer's function
(q, k, v, rope, attention, o; or up, gate, act, down) fold into one box, while its norms
(``norm``, sandwich ``out_norm``) and the residual ``add`` stay separate nodes wired by the
graph's own edges. So the norm placement (pre / post / branch / sandwich) is what the edges
show: pre-norm draws ``layer input -> norm -> attention``, post-norm ``add -> norm``.
Dropout (the identity at inference) labels the edge it sits on. The residual operand of each
add is drawn bold and dashed; layers 1..N-1 and the encoder output they read are mapped onto
layer 0, since every layer of a stack is the same.
"""

from __future__ import annotations

import re

import graphviz

from tfgraph.exporters.diagram_labels import (
    attention_kind,
    attention_title,
    dropout_text,
    ffn_text,
    heads_text,
    linear_text,
    spec_of,
)
from tfgraph.exporters.diagram_model import draw_embedding, draw_head, embed_edge_label
from tfgraph.exporters.diagram_style import (
    NORM_NAMES,
    Annotator,
    KindTracker,
    join_lines,
    new_digraph,
)
from tfgraph.ir import Graph, Node

_LAYER = re.compile(r"^(encoder|decoder)\.layers\.\d+\.")
SUBLAYER_TITLE = {"ffn": "Feed-forward"}
RESIDUAL_STYLE = {"style": "dashed,bold", "color": "#777777", "fontcolor": "#555555"}


def group_of(node: Node) -> str | None:
    """Diagram node of a layer op: ``{stack}.{sublayer}.{fn|norm|out_norm|add}``; None for
    ops outside layers and for dropout (drawn as an edge label)."""
    m = _LAYER.match(node.scope + ".")
    if m is None or node.op == "dropout":
        return None
    stack, sub = m.group(1), node.scope.split(".")[3]
    role = node.name[len(node.scope) + 1:]
    if role not in ("norm", "out_norm"):
        role = "add" if role == "residual" else "fn"
    return f"{stack}.{sub}.{role}"


def _fn_label(graph: Graph, members: list[Node]) -> tuple[str, str]:
    """(label, palette kind) of a folded sublayer function."""
    spec = spec_of(graph)
    attention = [n for n in members if n.op == "attention"]
    if attention:
        att = attention[0]
        # q, k, v, o grouped by size: "q, k, v, o: linear 512 → 512" when all agree, else
        # e.g. "q: linear 2,048 → 2,048; k, v: linear 2,048 → 256" (GQA, explicit head_dim)
        sizes: dict[str, list[str]] = {}
        for role in ("q", "k", "v", "o"):
            text = linear_text(graph, graph.node(f"{att.scope}.{role}"))
            sizes.setdefault(text, []).append(role)
        projections = [f"{', '.join(roles)}: linear {text}" for text, roles in sizes.items()]
        lines = [attention_title(att), heads_text(spec), *projections]
        if any(n.op == "rope" for n in members):
            lines.append("rotary positions on q, k")
        if att.attrs["kind"] == "cross":
            lines.append("K, V from the encoder output")
        return join_lines(*lines), attention_kind(att)
    return join_lines("Feed-forward", ffn_text(spec)), "ffn"


def build_layer(graph: Graph, ann: Annotator) -> graphviz.Digraph:
    spec = spec_of(graph)
    kinds = KindTracker()
    dot = new_digraph(f"{graph.name}-layer", f"{graph.name} — one layer per stack ({spec.arch})")
    groups: dict[str, list[Node]] = {}  # group -> member ops of every layer, graph order
    for node in graph.ops():
        g = group_of(node)
        if g is not None:
            groups.setdefault(g, []).append(node)

    def layer0(stack: str) -> list[Node]:
        return [n for n in graph.ops() if n.scope.startswith(f"{stack}.layers.0.")]

    def resolve(name: str, stack: str) -> tuple[str, str]:
        """Diagram node standing for graph node ``name`` as seen from ``stack``'s layer 0,
        and the dropout text of the edges passed through on the way."""
        drops = []
        node = graph.node(name)
        while node.op == "dropout" and _LAYER.match(node.scope + "."):
            drops.append(dropout_text(node))
            node = graph.node(node.inputs[0])
        g = group_of(node)
        if g is not None:
            return g, " ".join(drops)
        if node.scope == f"{stack}.embed":
            return f"{stack}.layer_in", " ".join(drops)
        return node.name, " ".join(drops)  # e.g. encoder.norm feeding cross-attention

    stack_out: dict[str, str] = {}
    for stack in spec.stacks:
        last_embed = draw_embedding(dot, graph, kinds, ann, stack)
        n_layers = spec.layer_count(stack)
        ops = layer0(stack)
        title = f"{stack.capitalize()} layer × {n_layers}"
        with dot.subgraph(name=f"cluster_{stack}") as c:
            c.attr(label=title, fontsize="15", style="rounded,filled", fillcolor="#f7f9fc",
                   color="#8aa4c8", penwidth="1.5", labeljust="l")
            c.node(f"{stack}.layer_in", label="", shape="point", width="0.08")
            for g in dict.fromkeys(group_of(n) for n in ops):
                if g is None:
                    continue
                members = [n for n in ops if group_of(n) == g]
                role = g.rsplit(".", 1)[1]
                all_names = [n.name for n in groups[g]]
                note = ann.text(all_names, prefix=f"all {n_layers}: " if n_layers > 1 else "")
                if role == "fn":
                    label, kind = _fn_label(graph, members)
                    kinds.node(c, g, join_lines(label, note), kind)
                elif role == "add":
                    # the add's share is ~0: a note would swell the circle; the legend says +
                    kinds.node(c, g, "+", "add", shape="circle",
                               fontsize="16", width="0.35", style="filled")
                else:
                    norm = members[0]
                    param = norm.inputs[1].rsplit(".", 1)[0]
                    kinds.node(c, g, join_lines(NORM_NAMES[norm.op], param.split(".")[-1], note),
                               "norm")
        dot.edge(f"{stack}.embed", f"{stack}.layer_in", label=embed_edge_label(graph, last_embed))
        seen: set[tuple[str, str]] = set()
        for node in ops:
            dst = group_of(node)
            if dst is None:
                continue
            for operand, src_name in enumerate(node.inputs):
                if graph.node(src_name).is_param:
                    continue
                src, drops = resolve(src_name, stack)
                if src == dst or (src, dst) in seen:
                    continue
                seen.add((src, dst))
                attrs: dict[str, str] = {}
                label = drops
                if dst.endswith(".add") and operand == 0:
                    attrs = dict(RESIDUAL_STYLE)
                    label = "residual"
                elif not src.startswith(stack):
                    attrs = {"color": "#2e8b57", "penwidth": "2", "fontcolor": "#2e8b57"}
                    label = "K, V"
                if label:
                    attrs["label"] = f" {label}"
                dot.edge(src, dst, **attrs)
        last = group_of(ops[-1])
        assert last is not None
        out = last
        if f"{stack}.norm" in graph:
            norm = graph.node(f"{stack}.norm")
            kinds.node(dot, norm.name, join_lines(f"Final {NORM_NAMES[norm.op]}",
                                                  ann.text([norm.name])), "norm")
            dot.edge(last, norm.name, label=f" after layer {n_layers}")
            out = norm.name
        stack_out[stack] = out
    last_stack = spec.stacks[-1]
    draw_head(dot, graph, kinds, ann, stack_out[last_stack], tied_from=None)
    notes = ["bold dashed edge: the residual (skip) path", "green edge: encoder output"
             if spec.arch == "encoder-decoder" else "",
             "'all N:' figures sum over the N layers of a stack" if ann.active else "",
             ann.note()]
    kinds.legend(dot, "; ".join(n for n in notes if n))
    return dot
