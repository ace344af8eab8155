"""Model-level diagram: inputs, token tables, embeddings, one folded box per layer stack
(``Encoder × 6``), final norms, the output head and the output.

Boxes are the model's parts as node metadata names them (``model_box``); the arrows between
them are the graph's own edges that cross from one box into another, so tying, sharing, final
norms, the encoder output read by the decoder and probs outputs show as compiled. A stack's
box says what its layers compute: the order of the sublayers as their data dependences impose
it, and the wiring of norms and residual adds (``diagram_structure``).
"""

from __future__ import annotations

import graphviz

from tfgraph.exporters.diagram.labels import cross_text, embed_text, stack_text, table_text
from tfgraph.exporters.diagram.ops import row
from tfgraph.exporters.diagram.structure import Stack, arch_text, stack_named
from tfgraph.exporters.diagram.style import (
    Annotator,
    KindTracker,
    edge,
    join_lines,
    new_digraph,
    op_title,
    shape_text,
)
from tfgraph.exporters.diagram.words import dropout_text, is_tied, linear_text, name
from tfgraph.graph.ir import Graph, Node

CROSS_STYLE = {"color": "#2e8b57", "penwidth": "2", "fontcolor": "#2e8b57"}


def token_tables(graph: Graph) -> list[Node]:
    """Parameters gathered by embedding ops (one per table, however many read it)."""
    return list({graph.node(n.inputs[0]).name: graph.node(n.inputs[0])
                 for n in graph.ops() if n.category == "embedding"}.values())


def model_box(node: Node) -> str:
    """The model-level box a node belongs to, from its metadata."""
    m = node.meta
    if node.op == "input" or node.is_param:
        return node.name
    if m.part == "layer":
        return f"{m.stack}.layers"
    if m.part in ("embed", "norm") and m.stack is not None:
        return f"{m.stack}.{m.part}"
    if m.part == "head":
        return "softmax" if node.category == "output" else "head"
    return node.name


def head_ops(graph: Graph) -> list[Node]:
    """The ops of the head box: the vocabulary projection and what comes before it (BERT's
    transform), in graph order."""
    return [n for n in graph.ops() if model_box(n) == "head"]


def projection(graph: Graph) -> Node:
    """The head's vocabulary projection: the last linear of the head box."""
    return [n for n in head_ops(graph) if n.category == "linear"][-1]


def _own_lines(nodes: list[Node]) -> list[str]:
    """The head's ops that have a line of their own (their row's ``head_line``)."""
    return [line(n) for n in nodes if (line := row(n).head_line) is not None]


def head_text(graph: Graph, head: Node, ann: Annotator) -> str:
    """The transform before the vocabulary projection (BERT's), the ops with lines of their
    own before it (T5's scaling) and after it (Gemma 2's logit cap), and its weight."""
    ops = head_ops(graph)
    proj = projection(graph)
    tied = "tied to the token table" if is_tied(graph, proj) else "own weight (untied)"
    before, after = ops[:ops.index(proj)], ops[ops.index(proj) + 1:]
    words = [f"linear {linear_text(graph, n)}" if n.category == "linear"
             else op_title(n.op) for n in before if row(n).head_line is None]
    transform = f"transform: {', '.join(words)}" if words else ""
    return join_lines("Output head", transform, *_own_lines(before),
                      f"linear {linear_text(graph, proj)}", tied, *_own_lines(after),
                      ann.text([n.name for n in ops]))


def embed_edge_label(node: Node) -> str:
    """Shape of the embedding's output, and the dropout on it."""
    dropout = f" {dropout_text(node)}" if node.category == "dropout" else ""
    return f" {shape_text(node.type.shape)}{dropout}"


class _ModelDrawing:
    """Draws boxes as the graph's ops first reach them and the edges between them."""

    def __init__(self, graph: Graph, ann: Annotator) -> None:
        self.graph, self.ann = graph, ann
        self.kinds = KindTracker()
        self.dot = new_digraph(f"{graph.name}-model",
                               f"{name(graph.name)} — model ({arch_text(graph)})")
        self.tables = token_tables(graph)
        self.drawn: set[str] = set()
        self.edges: set[tuple[str, str]] = set()

    def stack(self, node: Node) -> Stack:
        assert node.meta.stack is not None
        return stack_named(self.graph, node.meta.stack)

    def box(self, box: str, node: Node) -> None:
        """Declare ``box`` (the first node of it met is ``node``) once."""
        if box in self.drawn:
            return
        self.drawn.add(box)
        graph, ann, kinds, dot = self.graph, self.ann, self.kinds, self.dot
        part = node.meta.part
        if node.op == "input":
            kinds.node(dot, box, join_lines(name(node.name), shape_text(node.type.shape)), "io",
                       shape="ellipse", style="filled")
        elif node.is_param:
            # the table's parameters are counted here, once, and skipped in the boxes of the
            # ops that read it (the embedding, a tied head), so the boxes sum to the report's
            kinds.node(dot, box, join_lines(table_text(graph, node), ann.table_text(node.name)),
                       "table", shape="cylinder", style="filled")
        elif part == "embed" and node.meta.stack is not None:
            stack = self.stack(node)
            skip = frozenset(t.name for t in self.tables)
            kinds.node(dot, box, join_lines(embed_text(graph, stack), ann.text(
                [n.name for n in stack.embed], skip=skip)), "embedding")
        elif part == "layer":
            stack = self.stack(node)
            layer_nodes = [n.name for n in graph.ops()
                           if n.meta.stack == stack.name and n.meta.part == "layer"]
            kinds.node(dot, box, join_lines(stack_text(graph, stack), ann.text(layer_nodes)),
                       "stack", shape="box3d", style="filled", fontsize="13")
        elif part == "norm":
            kinds.node(dot, box, join_lines(f"Final {op_title(node.op)}",
                                            ann.text([node.name])), "norm")
        elif box == "head":
            kinds.node(dot, box, head_text(graph, node, ann), "head")
        elif box == "softmax":
            kinds.node(dot, box, join_lines("Softmax over the vocabulary",
                                            ann.text([node.name])), "head")
        else:
            kinds.node(dot, box, join_lines(name(node.name), node.op), "head")

    def edge(self, src: Node, dst: Node) -> None:
        """The edge from ``src``'s box into ``dst``'s, styled by what it carries."""
        tail, head = model_box(src), model_box(dst)
        if tail == head or (tail, head) in self.edges:
            return
        self.edges.add((tail, head))
        if src.is_param:
            tied = dst.category != "embedding"
            edge(self.dot, tail, head, " tied weight" if tied else " gather", style="dashed")
        elif src.op == "input":
            edge(self.dot, tail, head)
        elif src.meta.part == "embed":
            edge(self.dot, tail, head, embed_edge_label(src))
        elif dst.meta.part == "layer" and src.meta.stack != dst.meta.stack:
            label = f" {shape_text(src.type.shape)}\n" + "\n".join(
                f" {line}" for line in cross_text(self.graph, src, self.stack(dst)).split("\n"))
            edge(self.dot, tail, head, label, **CROSS_STYLE)
        elif dst.meta.part == "head":
            edge(self.dot, tail, head, f" {shape_text(src.type.shape)}")
        else:
            edge(self.dot, tail, head)

    def draw(self) -> graphviz.Digraph:
        graph = self.graph
        for table in self.tables:  # first: sharing and tying are edges to one node each
            self.box(table.name, table)
        for node in graph.ops():
            sources = [graph.node(i) for i in node.inputs]
            sources = [s for s in sources if not s.is_param] + \
                [s for s in sources if s.is_param and s in self.tables]
            for src in sources:
                if src.op == "input":
                    self.box(model_box(src), src)
            self.box(model_box(node), node)
            for src in sources:
                self.edge(src, node)
        for out_name in graph.outputs:
            out = graph.node(out_name)
            box = f"output.{out_name}"
            self.kinds.node(self.dot, box, join_lines(name(out_name), shape_text(out.type.shape)),
                            "io", shape="ellipse", style="filled")
            edge(self.dot, model_box(out), box)
        self.kinds.legend(self.dot, self.ann.note())
        return self.dot


def build_model(graph: Graph, ann: Annotator) -> graphviz.Digraph:
    """The model-level drawing of ``graph``."""
    return _ModelDrawing(graph, ann).draw()


def draw_inputs_and_embeddings(dot: graphviz.Digraph, graph: Graph, kinds: KindTracker,
                               ann: Annotator, stack: Stack) -> Node:
    """Input ids and the embedding box of ``stack`` (for the layer level); returns the node
    that leaves the embedding (for the outgoing edge's shape and dropout)."""
    gathers = [n for n in stack.embed if n.category == "embedding"]  # tokens, segments
    inputs = [next(graph.node(i) for i in g.inputs if graph.node(i).op == "input")
              for g in gathers]
    for ids in inputs:
        kinds.node(dot, ids.name, join_lines(name(ids.name), shape_text(ids.type.shape)), "io",
                   shape="ellipse", style="filled")
    box = model_box(gathers[0])
    kinds.node(dot, box, join_lines(embed_text(graph, stack),
                                    ann.text([n.name for n in stack.embed])), "embedding")
    for ids in inputs:
        edge(dot, ids.name, box)
    return stack.embed[-1]


def draw_head(dot: graphviz.Digraph, graph: Graph, kinds: KindTracker, ann: Annotator,
              src: str) -> None:
    """The output head (linear, then softmax for probs) and the output nodes, fed by the
    drawn node ``src`` (for the layer level; the model level draws these from edges)."""
    first, head = head_ops(graph)[0], projection(graph)
    kinds.node(dot, "head", head_text(graph, first, ann), "head")
    edge(dot, src, "head", f" {shape_text(graph.node(first.inputs[0]).type.shape)}")
    last = "head"
    for node in graph.ops():
        if model_box(node) == "softmax":
            kinds.node(dot, "softmax", join_lines("Softmax over the vocabulary",
                                                  ann.text([node.name])), "head")
            edge(dot, "head", "softmax", f" {shape_text(head.type.shape)}")
            last = "softmax"
    for out_name in graph.outputs:
        out = graph.node(out_name)
        kinds.node(dot, f"output.{out_name}", join_lines(name(out_name),
                                                         shape_text(out.type.shape)),
                   "io", shape="ellipse", style="filled")
        edge(dot, last, f"output.{out_name}")

