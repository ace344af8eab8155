"""The op-graph IR: a small API over a networkx ``MultiDiGraph`` (in the spirit of torch.fx).

Nodes are named uniquely ("decoder.layers.3.ffn.up"); a node's inputs are other nodes' names in
operand order, stored as edges keyed by operand index, so ``x + x`` is two edges and q, k and v
may read the same node. Parameters are nodes too (op ``param``) named as in design §4; a tied
table is one node read twice. Shapes are inferred eagerly when a node is added, from the op's
rule in ``tfgraph.ops``, so a lowering mistake fails at the node that caused it. Callers never
touch ``networkx`` directly: they use ``add``/``param``/``input``, ``nodes()`` (deterministic
topological order) and ``lint()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, TypeAlias

import networkx as nx
import sympy

if TYPE_CHECKING:
    from tfgraph.spec import Spec

# Symbolic sizes: batch, source (or only) sequence length, target sequence length.
B, S, T = sympy.symbols("B S T", positive=True, integer=True)
SYMBOLS = {"B": B, "S": S, "T": T}

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "bool": 1}

Dim: TypeAlias = sympy.Expr
Shape: TypeAlias = tuple[Dim, ...]


class LoweringError(Exception):
    """A node could not be built or checked; the message names the node."""


@dataclass(frozen=True)
class TensorType:
    """Symbolic shape and dtype of a node's single output."""

    shape: Shape
    dtype: str

    @property
    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.shape)

    @property
    def nbytes(self) -> sympy.Expr:
        return self.numel * DTYPE_BYTES[self.dtype]

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.shape)}]"


@dataclass
class Node:
    """One op application. ``inputs`` are node names in operand order."""

    name: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict[str, Any]
    scope: str
    type: TensorType
    index: int = field(default=0, compare=False)

    @property
    def is_param(self) -> bool:
        return self.op == "param"


def _param_dim(d: Any) -> Any:
    """A parameter dimension: an ``int`` in every real graph; a sympy expression only in the
    symbolic twins that ``tfgraph.formulas`` lowers to write costs in the spec's symbols."""
    if isinstance(d, sympy.Basic) and not d.is_Integer:
        return d
    return int(d)


def _shape(dims: tuple[Any, ...]) -> Shape:
    return tuple(sympy.sympify(d) for d in dims)


class Graph:
    """A lowered Transformer: op nodes, parameter nodes, graph inputs and outputs."""

    def __init__(self, name: str, spec: Spec | None = None) -> None:
        self.name = name
        self.spec = spec
        self._g: nx.MultiDiGraph[str] = nx.MultiDiGraph()
        self._nodes: dict[str, Node] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self._order: list[Node] | None = None

    # ---- building ---------------------------------------------------------------------

    def _insert(self, node: Node) -> str:
        if node.name in self._nodes:
            raise LoweringError(f"while lowering {node.name}: a node of that name already exists")
        node.index = len(self._nodes)
        self._nodes[node.name] = node
        self._g.add_node(node.name)
        for operand, src in enumerate(node.inputs):
            self._g.add_edge(src, node.name, key=operand)
        self._order = None
        return node.name

    def input(self, name: str, shape: tuple[Any, ...], dtype: str = "int64") -> str:
        """A graph input, e.g. ``input_ids`` of shape (B, S)."""
        self.inputs.append(name)
        return self._insert(Node(name, "input", (), {}, "inputs", TensorType(_shape(shape), dtype)))

    def param(self, name: str, shape: tuple[int, ...], scope: str, init: str, dtype: str) -> str:
        """A parameter; ``init`` is 'normal', 'zeros' or 'ones' (see tfgraph.weights)."""
        attrs = {"shape": tuple(_param_dim(d) for d in shape), "init": init}
        return self._insert(Node(name, "param", (), attrs, scope, TensorType(_shape(shape), dtype)))

    def add(self, op: str, inputs: list[str] | tuple[str, ...], *, name: str, scope: str,
            **attrs: Any) -> str:
        """Add an op node; its output type is inferred now from the op's shape rule."""
        from tfgraph.ops import OPS

        if op not in OPS:
            raise LoweringError(f"while lowering {name}: unknown op {op!r}")
        missing = [i for i in inputs if i not in self._nodes]
        if missing:
            raise LoweringError(f"while lowering {name}: unknown inputs {missing}")
        try:
            out = OPS[op].infer([self._nodes[i].type for i in inputs], attrs)
        except (ValueError, TypeError) as err:
            raise LoweringError(f"while lowering {name} ({op}): {err}") from err
        return self._insert(Node(name, op, tuple(inputs), attrs, scope, out))

    def set_output(self, name: str) -> None:
        self.outputs.append(name)

    # ---- reading ----------------------------------------------------------------------

    def node(self, name: str) -> Node:
        return self._nodes[name]

    def __contains__(self, name: str) -> bool:
        return name in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def nodes(self) -> list[Node]:
        """All nodes in a deterministic topological order (ties broken by insertion order)."""
        if self._order is None:
            key = {n: node.index for n, node in self._nodes.items()}
            order = nx.lexicographical_topological_sort(self._g, key=lambda n: key[n])
            self._order = [self._nodes[n] for n in order]
        return self._order

    def ops(self) -> Iterator[Node]:
        """Op nodes (not parameters or inputs) in topological order."""
        return (n for n in self.nodes() if n.op not in ("param", "input"))

    def params(self) -> list[Node]:
        """Parameter nodes in topological order; a tied table appears once."""
        return [n for n in self.nodes() if n.is_param]

    def users(self, name: str) -> list[tuple[Node, int]]:
        """(consumer, operand index) pairs reading ``name``, in topological order."""
        uses = [(self._nodes[dst], key) for _, dst, key in self._g.out_edges(name, keys=True)]
        return sorted(uses, key=lambda u: (u[0].index, u[1]))

    @property
    def nx_graph(self) -> nx.MultiDiGraph:
        """A read-only view for algorithms (e.g. diagrams); never mutate it."""
        return self._g.copy(as_view=True)

    # ---- checking ---------------------------------------------------------------------

    def lint(self) -> None:
        """Check structural invariants; raise LoweringError naming the first bad node."""
        from tfgraph.ops import OPS

        if not nx.is_directed_acyclic_graph(self._g):
            cycle = nx.find_cycle(self._g)
            raise LoweringError(f"graph has a cycle through {cycle[0][0]}")
        if set(self._g.nodes) != set(self._nodes):
            raise LoweringError("graph nodes and name table disagree")
        for node in self.nodes():
            edges = sorted((k, src) for src, _, k in self._g.in_edges(node.name, keys=True))
            if tuple(src for _, src in edges) != node.inputs:
                raise LoweringError(f"{node.name}: edges do not match its operand list")
            if node.op in ("param", "input"):
                if node.inputs:
                    raise LoweringError(f"{node.name}: {node.op} nodes take no inputs")
                continue
            opdef = OPS[node.op]
            lo, hi = opdef.arity
            if not lo <= len(node.inputs) <= hi:
                raise LoweringError(
                    f"{node.name}: {node.op} takes {lo}..{hi} inputs, got {len(node.inputs)}"
                )
            try:
                again = opdef.infer([self._nodes[i].type for i in node.inputs], node.attrs)
            except (ValueError, TypeError) as err:
                raise LoweringError(f"{node.name}: {err}") from err
            if again != node.type:
                raise LoweringError(f"{node.name}: stored type {node.type} != inferred {again}")
        for out in self.outputs:
            if out not in self._nodes:
                raise LoweringError(f"output {out!r} is not a node")
        dead = [n.name for n in self.nodes() if not self._g.out_degree(n.name)
                and n.name not in self.outputs]
        if dead:
            raise LoweringError(f"nodes computed but never used: {dead[:5]}")

    # ---- reports ----------------------------------------------------------------------

    def report(self, batch: int = 1, seq: int = 128, tgt_seq: int | None = None,
               fused_attention: bool = False) -> dict[str, Any]:
        """The cost report (same dict as ``tfgraph report --json``); see tfgraph.report."""
        from tfgraph.report import build_report

        return build_report(self, batch=batch, seq=seq, tgt_seq=tgt_seq,
                            fused_attention=fused_attention)
