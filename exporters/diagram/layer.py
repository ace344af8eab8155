"""Layer-level diagram: one layer of each stack in a cluster labelled ``× N``.

The layer is read off the graph, not re-described: the ops of each sublayer's function (q, k,
v, rope, attention, o; or up, gate, act, down) fold into one box, while its norms (``norm``,
sandwich ``out_norm``) and the residual ``add`` stay separate boxes wired by the graph's own
edges (``diagram_structure.wires``). So the norm placement (pre / post / branch / sandwich),
and sublayers that read the same input in parallel, are what the edges show: pre-norm draws
``layer input -> norm -> attention``, post-norm ``add -> norm``. Dropout (the identity at
inference) labels the edge it sits on. The residual operand of each add is drawn bold and
dashed; layers 1..N-1 and the encoder output they read are mapped onto layer 0, since every
layer of a stack is the same.
"""

from __future__ import annotations

import graphviz

from tfgraph.exporters.diagram.labels import fn_kind, fn_text
from tfgraph.exporters.diagram.model import (
    draw_head,
    draw_inputs_and_embeddings,
    embed_edge_label,
    model_box,
)
from tfgraph.exporters.diagram.structure import (
    Stack,
    Wire,
    arch_text,
    box_id,
    box_key,
    boxes,
    layer_output,
    stacks,
    through_dropout,
    wires,
)
from tfgraph.exporters.diagram.style import (
    Annotator,
    KindTracker,
    dot_id,
    edge,
    join_lines,
    new_digraph,
    op_title,
)
from tfgraph.exporters.diagram.words import dropout_text, name
from tfgraph.graph.ir import Graph, Node

RESIDUAL_STYLE = {"style": "dashed,bold", "color": "#777777", "fontcolor": "#555555"}
CROSS_STYLE = {"color": "#2e8b57", "penwidth": "2", "fontcolor": "#2e8b57"}


def drawn_id(node: Node, stack: Stack) -> str:
    """The drawn node standing for ``node`` as seen from ``stack``'s layer 0: a layer box
    (any layer maps to layer 0), the stack's entry point for its embedding, a final norm."""
    box = box_id(node)
    if box is not None:
        return box
    if node.meta.part == "embed" and node.meta.stack == stack.name:
        return f"{stack.name}.layer_in"
    return model_box(node)


def _norm_text(graph: Graph, norm: Node, note: str) -> str:
    """``LayerNorm`` and the module that owns its parameters (their ``meta.module``), shown
    relative to the layer's module (``self_attn_norm``), as a reader finds it in the
    state_dict; a label only, nothing is looked up by it."""
    params = [graph.node(i) for i in norm.inputs if graph.node(i).is_param]
    owner = params[0].meta.module if params else ""
    layer = norm.meta.module
    if layer and owner.startswith(layer + "."):
        owner = owner[len(layer) + 1:]
    return join_lines(op_title(norm.op), name(owner), note)


def _all_layers(graph: Graph, box: str) -> list[str]:
    """Ops of every layer that map onto ``box`` (for annotations summed over the stack)."""
    return [n.name for n in graph.ops() if box_id(n) == box]


def _draw_boxes(c: graphviz.Digraph, graph: Graph, kinds: KindTracker, ann: Annotator,
                stack: Stack) -> None:
    c.node(dot_id(f"{stack.name}.layer_in"), label="", shape="point", width="0.08")
    for box, members in boxes(stack).items():
        key = box_key(members[0])
        note = ann.text(_all_layers(graph, box),
                        prefix=f"all {stack.layers}: " if stack.layers > 1 else "")
        if key == "fn":
            kinds.node(c, box, join_lines(fn_text(graph, members), note), fn_kind(members))
        elif key == "add":
            # the add's share is ~0: a note would swell the circle; the legend says +
            kinds.node(c, box, "+", "add", shape="circle", fontsize="16", width="0.35",
                       style="filled")
        else:
            kinds.node(c, box, _norm_text(graph, members[0], note), "norm")


def _wire_edge(dot: graphviz.Digraph, wire: Wire, stack: Stack, seen: set[tuple[str, str]]
               ) -> None:
    """A data edge inside the layer: the residual operand of an add bold and dashed, the
    dropouts it passes through as its label."""
    src, dst = drawn_id(wire.src, stack), wire.box
    if src == dst or (src, dst) in seen:
        return
    seen.add((src, dst))
    label = " ".join(dropout_text(d) for d in wire.drops)
    attrs: dict[str, str] = {}
    if wire.dst.meta.role == "residual" and wire.operand == 0:
        attrs, label = dict(RESIDUAL_STYLE), "residual"
    edge(dot, src, dst, f" {label}" if label else "", **attrs)


def _cross_labels(stack_wires: list[Wire], stack: Stack) -> dict[str, str]:
    """Drawn id of each other stack's node the layer reads -> the roles reading it (``K,
    V``), the label of its one green edge."""
    out: dict[str, list[str]] = {}
    for w in stack_wires:
        if w.src.meta.stack not in (stack.name, None) and w.dst.meta.role:
            out.setdefault(drawn_id(w.src, stack), []).append(w.dst.meta.role.upper())
    return {k: ", ".join(dict.fromkeys(v)) for k, v in out.items()}


def build_layer(graph: Graph, ann: Annotator) -> graphviz.Digraph:
    """The layer-level drawing of ``graph``."""
    kinds = KindTracker()
    dot = new_digraph(f"{graph.name}-layer",
                      f"{name(graph.name)} — one layer per stack ({arch_text(graph)})")
    out: dict[str, str] = {}
    cross = False
    for stack in stacks(graph):
        last_embed = draw_inputs_and_embeddings(dot, graph, kinds, ann, stack)
        with dot.subgraph(name=f"cluster_{dot_id(stack.name)}") as c:
            c.attr(label=f"{stack.name.capitalize()} layer × {stack.layers}", fontsize="15",
                   style="rounded,filled", fillcolor="#f7f9fc", color="#8aa4c8",
                   penwidth="1.5", labeljust="l")
            _draw_boxes(c, graph, kinds, ann, stack)
        edge(dot, model_box(last_embed), f"{stack.name}.layer_in",
             embed_edge_label(last_embed))
        stack_wires = wires(graph, stack)
        kv = _cross_labels(stack_wires, stack)
        seen: set[tuple[str, str]] = set()
        for wire in stack_wires:
            src = drawn_id(wire.src, stack)
            if src in kv:
                cross = True
                if (src, wire.box) not in seen:
                    seen.add((src, wire.box))
                    edge(dot, src, wire.box, f" {kv[src]}", **CROSS_STYLE)
                continue
            _wire_edge(dot, wire, stack, seen)
        last = drawn_id(layer_output(graph, stack), stack)
        out[stack.name] = last
        if stack.final_norm is not None:
            norm = stack.final_norm
            box = model_box(norm)
            kinds.node(dot, box, join_lines(f"Final {op_title(norm.op)}",
                                            ann.text([norm.name])), "norm")
            edge(dot, last, box, f" after layer {stack.layers}")
            out[stack.name] = box
    head = next(n for n in graph.ops() if model_box(n) == "head")
    feed, _ = through_dropout(graph, head.inputs[0])
    src = out.get(feed.meta.stack or "", model_box(feed))
    draw_head(dot, graph, kinds, ann, src)
    notes = ["bold dashed edge: the residual (skip) path",
             "green edge: encoder output" if cross else "",
             "'all N:' figures sum over the N layers of a stack" if ann.active else "",
             ann.note()]
    kinds.legend(dot, "; ".join(n for n in notes if n))
    return dot
