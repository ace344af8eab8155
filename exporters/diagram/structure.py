"""What diagrams draw, read from the graph: node metadata for *where* a node sits, edges for
*how* data flows.

Every level draws the same units:
- stacks, in the order the graph computes them, each with its layer count, embedding ops,
  the ops of layer 0 (all layers of a stack are alike) and its final norm;
- the boxes of a layer: a sublayer's function (the attention or feed-forward ops) folds into
  one box, while each norm and the residual add are boxes of their own; dropout, the identity
  at inference, is not a box but a note on the edge it sits on;
- the wiring of a layer: which box reads which (``Wire``), and the layer written as
  assignments (``x = norm(x + self_attn(x))``) so that a folded stack still says what its
  layers compute, whatever the wiring (post-, pre-, branch or sandwich norm, or sublayers
  that read the same input in parallel, as in GPT-J and GPT-NeoX).

Nothing here reads the spec or parses a node name; box ids are made from metadata
(``decoder.self_attn.fn``), so layer i of a stack maps onto the boxes of layer 0.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from tfgraph.graph.ir import Graph, Node

# How a sublayer's wiring is called when every sublayer of a layer has it (the README's
# ``norm.position`` names); ``f`` is the sublayer's function, ``x`` the stream entering it.
PLACEMENTS = {
    "norm(x + f(x))": "post-norm",
    "x + f(norm(x))": "pre-norm",
    "x + norm(f(x))": "branch norm",
    "x + norm(f(norm(x)))": "sandwich",
    "x + f(x)": "no norm",
}


class DiagramError(Exception):
    """The boxes drawn for a layer are inconsistent (a bug in the boxing, not bad input)."""


@dataclass(frozen=True)
class Stack:
    """One encoder or decoder stack as the graph computes it."""

    name: str
    layers: int
    embed: tuple[Node, ...]
    """Op nodes of the stack's embedding (gather, scale, positions, dropout), graph order."""
    layer0: tuple[Node, ...]
    """Op nodes of layer 0, graph order."""
    final_norm: Node | None


@dataclass(frozen=True)
class Wire:
    """One data edge into a layer-0 box: ``src`` (dropouts passed through, listed in
    ``drops``) is operand ``operand`` of ``dst``, a member of box ``box``."""

    src: Node
    dst: Node
    box: str
    operand: int
    drops: tuple[Node, ...]


def stacks(graph: Graph) -> list[Stack]:
    """The graph's stacks in the order their first op is computed."""
    return graph.memo("diagram_stacks", lambda: _stacks(graph))


def _stacks(graph: Graph) -> list[Stack]:
    ops = list(graph.ops())
    names = list(dict.fromkeys(n.meta.stack for n in ops if n.meta.stack is not None))
    out = []
    for name in names:
        mine = [n for n in ops if n.meta.stack == name]
        layers = {n.meta.layer for n in mine if n.meta.part == "layer"}
        norms = [n for n in mine if n.meta.part == "norm"]
        out.append(Stack(
            name=name, layers=len(layers),
            embed=tuple(n for n in mine if n.meta.part == "embed"),
            layer0=tuple(n for n in mine if n.meta.part == "layer" and n.meta.layer == 0),
            final_norm=norms[0] if norms else None))
    return out


def stack_named(graph: Graph, name: str) -> Stack:
    return next(s for s in stacks(graph) if s.name == name)


def arch_text(graph: Graph) -> str:
    """'encoder-decoder', 'decoder-only' or 'encoder-only', from the stacks drawn."""
    names = [s.name for s in stacks(graph)]
    return "-".join(names) if len(names) > 1 else f"{names[0]}-only" if names else "no stacks"


def in_layer(node: Node) -> bool:
    return node.meta.part == "layer"


def box_key(node: Node) -> str | None:
    """A layer op's box within its sublayer: "fn" (the sublayer's function), "add" (a
    residual add, or any element-wise op of the layer itself, such as the sum of parallel
    branches) or the norm's role ("norm", "out_norm"); None for dropout (drawn on an edge)
    and for ops outside layers."""
    if not in_layer(node) or node.category == "dropout":
        return None
    if node.category == "norm" and node.meta.role in ("norm", "out_norm", ""):
        return node.meta.role or "norm"  # a sublayer's own norms (q_norm) are inside f
    if node.meta.role == "residual" or (node.meta.sublayer is None
                                        and node.category == "elementwise"):
        return "add"
    return "fn"


def box_id(node: Node) -> str | None:
    """``{stack}.{sublayer}.{key}`` of a layer op in any layer (so layer i maps onto layer
    0's box), ``{stack}.layer.{role}`` for ops of the layer outside every sublayer; None
    where ``box_key`` is None."""
    key = box_key(node)
    if key is None:
        return None
    if node.meta.sublayer is None:
        return f"{node.meta.stack}.layer.{node.meta.role or key}"
    return f"{node.meta.stack}.{node.meta.sublayer}.{key}"


def boxes(stack: Stack) -> dict[str, list[Node]]:
    """Box id -> its member ops in layer 0, boxes in the order of their first op."""
    out: dict[str, list[Node]] = {}
    for node in stack.layer0:
        box = box_id(node)
        if box is not None:
            out.setdefault(box, []).append(node)
    return out


def _passed_through(node: Node) -> bool:
    """A layer op wires pass through to the op it reads: dropout (the identity at inference,
    drawn as an edge note) and a sublayer's residual scale (block.residual_scale, Granite's
    x + s * f(x)). The scale is a member of its sublayer's fn box (its cost is the
    sublayer's), but it follows the out-norm with branch or sandwich norms: wired as a member,
    fn and that norm would read each other."""
    return in_layer(node) and (node.category == "dropout" or node.meta.role == "residual_scale")


def through_dropout(graph: Graph, name: str) -> tuple[Node, tuple[Node, ...]]:
    """The node behind any dropouts and residual scales inside layers that ``name`` passes
    through, and those dropouts (outermost first)."""
    node, drops = graph.node(name), []
    while _passed_through(node):
        if node.category == "dropout":
            drops.append(node)
        node = graph.node(node.inputs[0])
    return node, tuple(drops)


def wires(graph: Graph, stack: Stack) -> list[Wire]:
    """Every data edge into a box of layer 0 from outside that box, in graph order
    (parameters are not data; edges between ops of one box are inside it)."""
    out = []
    for dst in stack.layer0:
        box = box_id(dst)
        if box is None or _passed_through(dst):  # the scale's reader takes its operand
            continue
        for operand, name in enumerate(dst.inputs):
            if graph.node(name).is_param:
                continue
            src, drops = through_dropout(graph, name)
            if box_id(src) == box and src.meta.layer == dst.meta.layer:
                continue
            out.append(Wire(src, dst, box, operand, drops))
    return out


def layer_output(graph: Graph, stack: Stack) -> Node:
    """The layer-0 node the next layer (or the final norm or head) reads."""
    inside = {n.name for n in stack.layer0}
    for node in reversed(stack.layer0):
        if any(user.name not in inside for user, _ in graph.users(node.name)):
            return through_dropout(graph, node.name)[0]
    return stack.layer0[-1]


def users_in(graph: Graph, node: Node, stack: str) -> list[Node]:
    """Ops of ``stack``'s layers that read ``node`` (e.g. the encoder output's k and v)."""
    return [u for u, _ in graph.users(node.name) if u.meta.stack == stack and in_layer(u)]


# ---- the layer as assignments -----------------------------------------------------------


@dataclass(frozen=True)
class _Box:
    """A box of the layer's data flow: ``inputs`` are box ids or external node names."""

    id: str
    key: str
    fn: str
    inputs: tuple[str, ...]


def _flow(graph: Graph, stack: Stack) -> dict[str, _Box]:
    """Boxes of layer 0 with their distinct inputs in operand order (external inputs by node
    name: the stream entering the layer, another stack's output)."""
    inputs: dict[str, dict[str, None]] = {box: {} for box in boxes(stack)}
    for w in wires(graph, stack):
        src = box_id(w.src) if w.src.meta.stack == stack.name and in_layer(w.src) else None
        inputs[w.box][src or w.src.name] = None
    members = boxes(stack)
    return {box: _Box(box, box_key(members[box][0]) or "",
                      members[box][0].meta.sublayer or "", tuple(ins))
            for box, ins in inputs.items()}


def _external_name(graph: Graph, stack: Stack, name: str) -> str:
    """'x' for the stream entering the layer, '{stack}_out' for another stack's output."""
    node = graph.node(name)
    if node.meta.stack == stack.name or node.meta.stack is None:
        return "x"
    return f"{node.meta.stack}_out"


class _Printer:
    """Writes the boxes of one layer as assignments: a box read once is written inside its
    reader, a box read twice (or the layer's output) gets a statement; a statement reuses
    the name ``x`` when the value ``x`` held is read no more."""

    def __init__(self, graph: Graph, stack: Stack) -> None:
        self.graph, self.stack = graph, stack
        self.flow = _flow(graph, stack)
        out = box_id(layer_output(graph, stack))
        self.output = out if out is not None else ""
        uses: dict[str, int] = {}
        for box in self.flow.values():
            for ref in box.inputs:
                uses[ref] = uses.get(ref, 0) + 1
        self.named = [b for b in self.flow if uses.get(b, 0) > 1 or b == self.output]

    def expr(self, ref: str, names: dict[str, str], generic: bool = False) -> str:
        """Text of the value ``ref`` (a box id or an external node name)."""
        if ref not in self.flow:
            return names.get(ref) or _external_name(self.graph, self.stack, ref)
        if ref in names:
            return names[ref]
        return self.rhs(self.flow[ref], names, generic)

    def rhs(self, box: _Box, names: dict[str, str], generic: bool = False) -> str:
        args = [self.expr(r, names, generic) for r in box.inputs]
        if box.key == "add":
            return " + ".join(args)
        if box.key == "fn":
            return f"f({args[0]})" if generic else f"{box.fn}({', '.join(args)})"
        return f"norm({', '.join(args)})"

    def reads(self, box: _Box) -> set[str]:
        """Named values (statements and external inputs) a statement's text reads."""
        out: set[str] = set()
        for ref in box.inputs:
            if ref in self.flow and ref not in self.named:
                out |= self.reads(self.flow[ref])
            else:
                out.add(ref)
        return out

    def statements(self, generic: bool = False) -> list[tuple[str, str]]:
        """(name, expression) per statement, in graph order."""
        reads = [self.reads(self.flow[b]) for b in self.named]
        last_read = {ref: i for i, refs in enumerate(reads) for ref in refs}
        holder: dict[str, str] = {}  # variable -> the value it holds now
        names: dict[str, str] = {}  # value -> variable
        for refs in reads:
            for ref in refs:
                if ref not in self.flow:
                    names[ref] = _external_name(self.graph, self.stack, ref)
                    holder.setdefault(names[ref], ref)
        out = []
        for i, box in enumerate(self.named):
            text = self.rhs(self.flow[box], names, generic)
            var = next(v for v in _variables()
                       if v not in holder or last_read.get(holder[v], -1) <= i)
            holder[var] = box
            names[box] = var
            out.append((var, text))
        return out


def _variables() -> Iterable[str]:
    yield "x"
    i = 1
    while True:
        yield "h" if i == 1 else f"h{i}"
        i += 1


def layer_statements(graph: Graph, stack: Stack) -> list[str]:
    """Layer 0 of ``stack`` as assignments, e.g. ``["x = x + self_attn(norm(x))",
    "x = x + ffn(norm(x))"]`` (dropout left out: the identity at inference)."""
    return [f"{var} = {text}" for var, text in _Printer(graph, stack).statements()]


def placement(graph: Graph, stack: Stack) -> str | None:
    """The shared wiring of every sublayer (``"pre-norm: x + f(norm(x))"``) when each
    sublayer is one statement of the same form; None otherwise (e.g. parallel sublayers)."""
    printer = _Printer(graph, stack)
    generic = printer.statements(generic=True)
    fns = [b for b in printer.flow.values() if b.key == "fn"]
    forms = {text for _, text in generic}
    if len(generic) != len(fns) or len(forms) != 1 or any(var != "x" for var, _ in generic):
        return None
    form = forms.pop()
    return f"{PLACEMENTS[form]}: {form}" if form in PLACEMENTS else f"x = {form}"


def sublayer_ranks(graph: Graph, stack: Stack) -> list[list[str]]:
    """Sublayers of layer 0 grouped by data dependence: each group reads only the outputs of
    earlier groups, and the sublayers within a group read none of each other's (they run in
    parallel). ``[["self_attn"], ["cross_attn"], ["ffn"]]`` for a decoder of a sequence
    model; ``[["self_attn", "ffn"]]`` when both read the layer input."""
    flow = _flow(graph, stack)
    rank: dict[str, int] = {}
    open_: list[str] = []  # the boxes whose depth is being computed, outermost first

    def depth(ref: str) -> int:
        """Sublayer functions on the longest path from the layer input to ``ref``."""
        if ref not in flow:
            return 0
        if ref in open_:  # the boxes are a DAG of layer 0's ops; a cycle is a boxing bug
            cycle = open_[open_.index(ref):] + [ref]
            raise DiagramError(f"layer boxes of {stack.name} read each other in a cycle: "
                               f"{' <- '.join(cycle)}")
        if ref not in rank:
            open_.append(ref)
            box = flow[ref]
            below = max((depth(r) for r in box.inputs), default=0)
            rank[ref] = below + (1 if box.key == "fn" else 0)
            open_.pop()
        return rank[ref]

    groups: dict[int, list[str]] = {}
    for box in flow.values():
        if box.key == "fn":
            groups.setdefault(depth(box.id), []).append(box.fn)
    return [groups[r] for r in sorted(groups)]
