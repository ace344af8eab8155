"""Cost passes over a lowered graph: parameters, FLOPs and memory (design §5).

Every figure is a sympy expression in B, S, T first (``symbolic``), evaluated for concrete sizes
second. Per-op costs come from the op table (``tfgraph.ops``) and are memoised per op signature,
since the layers of a stack repeat the same ops on the same types.

Precondition: the graph lints (``Graph.lint``). Postcondition: nothing in the graph changes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import sympy

from tfgraph.ir import DTYPE_BYTES, Graph, Node

# Ops that are the identity at inference: their output is their input's buffer.
ALIAS_AT_INFERENCE = frozenset({"dropout"})


@dataclass(frozen=True)
class OpCost:
    """Costs of one op node."""

    node: str
    scope: str
    op: str
    matmul: sympy.Expr
    other: sympy.Expr
    saved: tuple[tuple[str, sympy.Expr], ...]  # (tensor id, bytes), parameters excluded
    temp: sympy.Expr


def total(exprs: Iterable[sympy.Expr]) -> sympy.Expr:
    """Sum of many expressions, most of them repeated (every layer has the same ops): identical
    terms are counted first, so sympy flattens one term per distinct cost, not one per node."""
    counts = Counter(exprs)
    return sympy.Add(*(n * e for e, n in counts.items()))


def param_count(p: Node) -> int:
    """Elements of a parameter node (a sympy product in tfgraph.formulas' symbolic twins)."""
    return math.prod(p.attrs["shape"])


def component(scope: str) -> str:
    """Roll-up key: 'decoder.layers.3' for anything inside a layer, else the scope itself
    ('embed', 'decoder.embed', 'decoder.norm', 'head')."""
    parts = scope.split(".")
    if len(parts) >= 3 and parts[1] == "layers":
        return ".".join(parts[:3])
    return scope


def sublayer(scope: str) -> str:
    """Kind of work: 'self_attn', 'cross_attn', 'ffn', 'embed', 'norm' or 'head'."""
    parts = scope.split(".")
    if len(parts) >= 4 and parts[1] == "layers":
        return parts[3]
    return parts[-1]


def _signature(node: Node, graph: Graph) -> tuple[Any, ...]:
    ins = tuple((graph.node(i).type, graph.node(i).is_param) for i in node.inputs)
    return node.op, ins, tuple(sorted(node.attrs.items()))


def op_costs(graph: Graph) -> list[OpCost]:
    """Costs of every op node in topological order."""
    from tfgraph.ops import OPS

    memo: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    costs = []
    for node in graph.ops():
        key = _signature(node, graph)
        if key not in memo:
            opdef = OPS[node.op]
            ins = [graph.node(i).type for i in node.inputs]
            matmul, other = opdef.flops(ins, node.type, node.attrs)
            memo[key] = (matmul, other, opdef.saved(ins, node.type, node.attrs),
                         opdef.temp(ins, node.type, node.attrs))
        matmul, other, saved, temp = memo[key]
        tensors = []
        for ref, nbytes in saved:
            if ref[0] == "in":
                src = node.inputs[ref[1]]
                if graph.node(src).is_param:
                    continue  # parameters are not activations
                tensors.append((src, nbytes))
            elif ref[0] == "out":
                tensors.append((node.name, nbytes))
            else:
                tensors.append((f"{node.name}#{ref[1]}", nbytes))
        costs.append(OpCost(node.name, node.scope, node.op, matmul, other, tuple(tensors), temp))
    return costs


def params_by_component(graph: Graph) -> dict[str, int]:
    """Unique parameter counts per component (a tied table counts once, where it is defined)."""
    out: dict[str, int] = {}
    for p in graph.params():
        key = component(p.scope)
        out[key] = out.get(key, 0) + param_count(p)
    return out


def saved_for_backward(costs: list[OpCost]) -> sympy.Expr:
    """Bytes kept for the backward pass in one training forward, each tensor counted once."""
    unique: dict[str, sympy.Expr] = {}
    for c in costs:
        for tensor, nbytes in c.saved:
            unique.setdefault(tensor, nbytes)
    return total(unique.values())


def kv_cache(graph: Graph) -> sympy.Expr:
    """K and V of every decoder attention for the whole sequence, at kv_heads (design §5):
    self-attention caches 2*B*T*kv*hd, cross-attention 2*B*S*kv*hd per layer."""
    terms = []
    for node in graph.ops():
        if node.op == "attention" and node.scope.startswith("decoder."):
            k, v = (graph.node(i).type for i in node.inputs[1:])
            terms += [k.nbytes, v.nbytes]
    return total(terms)


@dataclass(frozen=True)
class Peak:
    """Inference activation peak: bytes, the node at which it happens, the buffers live there
    (node names) and its expression (their bytes plus the node's scratch)."""

    bytes: int
    node: str
    expr: sympy.Expr
    live: tuple[str, ...] = ()


def activation_peak(graph: Graph, costs: list[OpCost], sizes: dict[sympy.Symbol, int],
                    fused_attention: bool = False) -> Peak:
    """Liveness over the topological order: a buffer lives from its producer to its last
    consumer (graph outputs to the end); while an op runs, its inputs, its output and its
    scratch (``temp``) are live. Parameters are weights, not activations."""
    nodes = graph.nodes()
    pos = {n.name: i for i, n in enumerate(nodes)}
    owner: dict[str, str] = {}  # buffer owner after inference aliases (dropout = identity)
    for n in nodes:
        alias = n.op in ALIAS_AT_INFERENCE
        owner[n.name] = owner[n.inputs[0]] if alias else n.name
    last_use: dict[str, int] = {}
    for n in nodes:
        for i in n.inputs:
            last_use[owner[i]] = max(last_use.get(owner[i], 0), pos[n.name])
    for out in graph.outputs:
        last_use[owner[out]] = len(nodes)
    temp = {c.node: (sympy.Integer(0) if fused_attention else c.temp) for c in costs}

    cache: dict[sympy.Expr, int] = {}

    def value(expr: sympy.Expr) -> int:
        if expr not in cache:
            cache[expr] = int(expr.xreplace(sizes))
        return cache[expr]

    live: dict[str, sympy.Expr] = {}
    best = Peak(-1, "", sympy.Integer(0))
    running = 0
    for n in nodes:
        if n.is_param or owner[n.name] != n.name:
            continue
        live[n.name] = n.type.nbytes
        running += value(n.type.nbytes)
        extra = value(temp.get(n.name, sympy.Integer(0)))
        if running + extra > best.bytes:
            best = Peak(running + extra, n.name, sympy.Integer(0))
        for name in [b for b in live if last_use.get(b, -1) <= pos[n.name]]:
            running -= value(live.pop(name))
    # Recompute the live set at the peak to give its symbolic expression.
    t = pos[best.node]
    live_at = tuple(n.name for n in nodes
                    if not n.is_param and owner[n.name] == n.name
                    and pos[n.name] <= t <= last_use.get(n.name, pos[n.name]))
    expr = total([*(graph.node(n).type.nbytes for n in live_at),
                  temp.get(best.node, sympy.Integer(0))])
    return Peak(best.bytes, best.node, expr, live_at)


def weights_bytes(graph: Graph) -> int:
    """Bytes of the unique parameters at their dtype."""
    return sum(param_count(p) * DTYPE_BYTES[p.type.dtype] for p in graph.params())
