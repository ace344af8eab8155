"""Model-level diagram: inputs, token tables, embeddings, one folded box per layer stack
(``Encoder × 6``), final norms, the cross-attention edge from the encoder into every decoder
layer, and the output head.

Everything drawn is looked up in the compiled graph (which nodes exist, their shapes, what
reads the token tables), so tying, sharing, final norms and probs outputs show as compiled.
"""

from __future__ import annotations

import graphviz

from tfgraph.exporters.diagram_labels import (
    embed_text,
    ffn_text,
    heads_text,
    linear_text,
    norm_text,
    spec_of,
    table_text,
)
from tfgraph.exporters.diagram_style import (
    NORM_NAMES,
    Annotator,
    KindTracker,
    join_lines,
    new_digraph,
    shape_text,
)
from tfgraph.ir import Graph

STACK_SUBLAYERS = {
    ("encoder", False): "self-attention → feed-forward",
    ("decoder", False): "masked self-attention → feed-forward",
    ("decoder", True): "masked self-attention → cross-attention → feed-forward",
}


def _stack_output(graph: Graph, stack: str) -> str:
    """Name of the diagram node that carries ``stack``'s output (its final norm if any)."""
    return f"{stack}.norm" if f"{stack}.norm" in graph else f"{stack}.layers"


def draw_head(dot: graphviz.Digraph, graph: Graph, kinds: KindTracker, ann: Annotator,
              src: str, tied_from: str | None) -> None:
    """The output head (linear, then softmax for probs) and the output node, fed by ``src``;
    ``tied_from`` is the table node to draw a dashed "tied weight" edge from (or None)."""
    head = graph.node("logits")
    tied = graph.node(head.inputs[1]).scope != "head"
    kinds.node(dot, "head", join_lines(
        "Output head", f"linear {linear_text(graph, head)}",
        "tied to the token table" if tied else "own weight (untied)",
        ann.text(["logits"])), "head")
    x_in = graph.node(head.inputs[0])
    dot.edge(src, "head", label=f" {shape_text(x_in.type.shape)}")
    if tied_from is not None:
        dot.edge(tied_from, "head", style="dashed", label=" tied weight")
    out_name = graph.outputs[0]
    if out_name == "probs":
        kinds.node(dot, "softmax", join_lines("Softmax over the vocabulary",
                                              ann.text(["probs"])), "head")
        dot.edge("head", "softmax", label=f" {shape_text(head.type.shape)}")
        src = "softmax"
    else:
        src = "head"
    out = graph.node(out_name)
    kinds.node(dot, f"output.{out_name}", join_lines(out_name, shape_text(out.type.shape)), "io",
               shape="ellipse", style="filled")
    dot.edge(src, f"output.{out_name}")


def draw_embedding(dot: graphviz.Digraph, graph: Graph, kinds: KindTracker, ann: Annotator,
                   stack: str, skip: frozenset[str] = frozenset()) -> str:
    """Input ids and the embedding box of ``stack``; returns the name of the graph node that
    leaves the embedding (for the outgoing edge's shape and dropout)."""
    tokens = graph.node(f"{stack}.embed.tokens")
    ids = graph.node(tokens.inputs[1])
    kinds.node(dot, ids.name, join_lines(ids.name, shape_text(ids.type.shape)), "io",
               shape="ellipse", style="filled")
    embed_nodes = [n.name for n in graph.ops() if n.scope == f"{stack}.embed"]
    kinds.node(dot, f"{stack}.embed", join_lines(embed_text(graph, stack),
                                                 ann.text(embed_nodes, skip=skip)), "embedding")
    dot.edge(ids.name, f"{stack}.embed")
    return embed_nodes[-1]


def embed_edge_label(graph: Graph, last: str) -> str:
    node = graph.node(last)
    dropout = f" dropout {node.attrs['p']:g}" if node.op == "dropout" else ""
    return f" {shape_text(node.type.shape)}{dropout}"


def build_model(graph: Graph, ann: Annotator) -> graphviz.Digraph:
    spec = spec_of(graph)
    kinds = KindTracker()
    dot = new_digraph(f"{graph.name}-model", f"{graph.name} — model ({spec.arch})")
    enc_dec = spec.arch == "encoder-decoder"

    # Token tables: one node each, so sharing and tying are drawn as edges.
    tables: dict[str, str] = {}
    for stack in spec.stacks:
        tokens = graph.node(f"{stack}.embed.tokens")
        tables[stack] = tokens.inputs[0]
    for table in dict.fromkeys(tables.values()):
        note = []
        if len(set(tables.values())) == 1 and enc_dec:
            note.append("shared by both stacks")
        if graph.node("logits").inputs[1] == table:  # the head reads the same node
            note.append("tied to the output head")
        kinds.node(dot, table, join_lines(table_text(graph, table), *note), "table",
                   shape="cylinder", style="filled")

    for stack in spec.stacks:
        last = draw_embedding(dot, graph, kinds, ann, stack, skip=frozenset(tables.values()))
        dot.edge(tables[stack], f"{stack}.embed", style="dashed", label=" gather")

        n_layers = spec.layer_count(stack)
        layer_nodes = [n.name for n in graph.ops() if n.scope.startswith(f"{stack}.layers.")]
        title = f"{'Encoder' if stack == 'encoder' else 'Decoder'} × {n_layers}"
        kinds.node(dot, f"{stack}.layers", join_lines(
            title,
            STACK_SUBLAYERS[(stack, enc_dec and stack == "decoder")],
            heads_text(spec),
            f"FFN {ffn_text(spec)}",
            norm_text(spec),
            ann.text(layer_nodes)), "stack", shape="box3d", style="filled", fontsize="13")
        dot.edge(f"{stack}.embed", f"{stack}.layers", label=embed_edge_label(graph, last))
        if f"{stack}.norm" in graph:
            kinds.node(dot, f"{stack}.norm", join_lines(
                f"Final {NORM_NAMES[graph.node(f'{stack}.norm').op]}",
                ann.text([f"{stack}.norm"])), "norm")
            dot.edge(f"{stack}.layers", f"{stack}.norm")

    if enc_dec:
        n_dec = spec.layer_count("decoder")
        memory = graph.node(graph.node("decoder.layers.0.cross_attn.k").inputs[0])
        dot.edge(_stack_output(graph, "encoder"), "decoder.layers", color="#2e8b57",
                 penwidth="2", fontcolor="#2e8b57",
                 label=f" {shape_text(memory.type.shape)}\\n cross-attention K, V\\n"
                       f" into every decoder layer (× {n_dec})")

    head_weight = graph.node("logits").inputs[1]
    tied = head_weight if head_weight in tables.values() else None
    draw_head(dot, graph, kinds, ann, _stack_output(graph, spec.stacks[-1]), tied_from=tied)
    kinds.legend(dot, ann.note())
    return dot
