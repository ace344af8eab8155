"""Cost passes over a lowered graph: parameters, FLOPs and memory (README, ``tfgraph report``).

Every figure is a sympy expression in B, S, T first (``symbolic``), evaluated for concrete sizes
second. Per-op costs come from the op table (``tfgraph.graph.ops``) and are memoised per op signature,
since the layers of a stack repeat the same ops on the same types.

Precondition: the graph lints (``Graph.lint``). Postcondition: nothing in the graph changes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import sympy

from tfgraph.graph.ir import DTYPE_BYTES, Graph, Node, frozen_new
from tfgraph.graph.ops import OPS
from tfgraph.passes import exact
from tfgraph.passes.liveness import plan


@dataclass(frozen=True)
class OpCost:
    """Costs of one op node."""

    node: str
    component: str  # roll-up row (Node.component)
    kind: str  # kind of work (Node.kind)
    op: str
    matmul: sympy.Expr
    other: sympy.Expr
    saved: tuple[tuple[str, sympy.Expr], ...]  # (tensor id, bytes), parameters excluded
    temp: sympy.Expr
    # FLOPs with every routed expert on every token (OpDef.dense_flops; None: matmul, other)
    dense: tuple[sympy.Expr, sympy.Expr] | None = None
    # scratch where a fused kernel streams the scores (OpDef.score_temp, OpDef.fused_temp)
    fused_temp: sympy.Expr = sympy.Integer(0)

    def scratch(self, fused_attention: bool) -> sympy.Expr:
        """Its scratch at inference: ``fused_temp`` where a fused kernel streams its scores
        (``fused_attention``), ``temp`` otherwise."""
        return self.fused_temp if fused_attention and OPS[self.op].score_temp else self.temp


def total(exprs: Iterable[sympy.Expr]) -> sympy.Expr:
    """Sum of many expressions, most of them repeated (every layer has the same ops): identical
    terms are counted first, so sympy flattens one term per distinct cost, not one per node."""
    # counted by object first: the layers' nodes share their cost expressions (op_costs'
    # memo), and an identity look-up is much cheaper than hashing a sympy expression
    by_object: dict[int, list[Any]] = {}
    for e in exprs:
        seen = by_object.get(id(e))
        if seen is None:
            by_object[id(e)] = [e, 1]  # holds e: its id is not reused meanwhile
        else:
            seen[1] += 1
    counts: Counter[Any] = Counter()
    for e, n in by_object.values():
        counts[e] += n
    return sympy.Add(*(n * e for e, n in counts.items()))


def param_count(p: Node) -> int:
    """Elements of a parameter node (a sympy product in tfgraph.passes.formulas' symbolic twins)."""
    return math.prod(p.attrs["shape"])


_COSTS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
"""Per-op costs by signature, shared by every graph of the process (a spec's inference and
loss graphs, the layers of a stack): op cost rules are pure functions of the signature."""
_COSTS_MAX = 8192


def op_costs(graph: Graph) -> list[OpCost]:
    """Costs of every op node in topological order.

    Each node's ``OpCost`` is kept on the node with the operand nodes it was computed from:
    a node is never changed once added, and the graphs that share it (a loss graph copied
    from the inference graph) resolve its operands to the same nodes, so they reuse it."""
    memo = _COSTS
    if len(memo) >= _COSTS_MAX:
        memo.clear()
    table = graph._nodes
    costs: list[OpCost] = []
    append = costs.append
    for node in graph.ops():
        inputs = node.inputs
        srcs = tuple([table[i] for i in inputs])
        cached = node.__dict__.get("_opcost")
        # the same operand nodes (a tuple compares items by identity first; operands equal
        # field by field would give the same costs too)
        if cached is not None and cached[0] == srcs:
            append(cached[1])
            continue
        # attributes in the dict's order, with their types (1, 1.0 and True are equal values):
        # another order of the same attributes is only a miss
        key = (node.op, tuple([(s.type, s.op == "param") for s in srcs]),
               tuple([(k, type(v), v) for k, v in node.attrs.items()]))
        entry = memo.get(key)
        if entry is None:
            opdef = OPS[node.op]
            ins = [s.type for s in srcs]
            matmul, other = opdef.flops(ins, node.type, node.attrs)
            dense = opdef.dense_flops(ins, node.type, node.attrs) if opdef.dense_flops else None
            fused = opdef.fused_temp(ins, node.type, node.attrs) if opdef.fused_temp else ZERO
            entry = memo[key] = (matmul, other, opdef.saved(ins, node.type, node.attrs),
                                 opdef.temp(ins, node.type, node.attrs), dense, fused)
        matmul, other, saved, temp, dense, fused = entry
        tensors = []
        for ref, nbytes in saved:
            if ref[0] == "in":
                src = inputs[ref[1]]
                if srcs[ref[1]].op == "param":
                    continue  # parameters are not activations
                tensors.append((src, nbytes))
            elif ref[0] == "out":
                tensors.append((node.name, nbytes))
            else:
                tensors.append((f"{node.name}#{ref[1]}", nbytes))
        c = frozen_new(OpCost, {"node": node.name, "component": node.component,
                                "kind": node.kind, "op": node.op, "matmul": matmul,
                                "other": other, "saved": tuple(tensors), "temp": temp,
                                "dense": dense, "fused_temp": fused})
        node.__dict__["_opcost"] = (srcs, c)
        append(c)
    return costs


def sum_terms(terms: list[Any]) -> Any:
    """``sum(terms)``: plain ints added as ints; sympy terms (the symbolic twins' parameter
    products) in one ``sympy.Add``, not one flattening per term (the same sum)."""
    if all(type(t) is int for t in terms):
        return sum(terms)
    return sympy.Add(*terms)


def params_by_component(graph: Graph) -> dict[str, int]:
    """Unique parameter counts per component (a tied table counts once, where it is defined).
    A new dict each call (memoised on the graph)."""

    def compute() -> dict[str, int]:
        terms: dict[str, list[Any]] = {}
        for p in graph.params():
            terms.setdefault(p.component, []).append(param_count(p))
        return {key: sum_terms(v) for key, v in terms.items()}

    return dict(graph.memo("params_by_component", compute))


def routed_experts(graph: Graph) -> list[Node]:
    """The mixture-of-experts nodes (``OpDef.routed``: ``experts``; README, ``ffn.experts``)."""
    return [n for n in graph.ops() if OPS[n.op].routed]


def inactive_params(graph: Graph) -> sympy.Expr:
    """Parameters a token does not use: the routed experts outside its top k, (E - k) / E of
    each experts op's stacked weights. params - this = the active parameters per token."""
    terms = []
    for node in routed_experts(graph):
        experts = graph.node(node.inputs[1]).type.shape[-1]
        stacked = sum(param_count(graph.node(p)) for p in node.inputs[2:])
        terms.append(sympy.expand(stacked * (experts - node.attrs["top_k"]) / experts))
    return total(terms)


def saved_for_backward(costs: list[OpCost]) -> sympy.Expr:
    """Bytes kept for the backward pass in one training forward, each tensor counted once."""
    unique: dict[str, sympy.Expr] = {}
    for c in costs:
        for tensor, nbytes in c.saved:
            unique.setdefault(tensor, nbytes)
    return total(unique.values())


def kv_cache(graph: Graph, windowed: bool = True) -> sympy.Expr:
    """K and V of every decoder attention for the whole sequence, at kv_heads (README.md, `tfgraph report`):
    self-attention caches 2*B*T*kv*hd, cross-attention 2*B*S*kv*hd per layer; a sliding-window
    layer only its last min(T, W) positions (``windowed``: what a rolling cache needs, as
    transformers' sliding-window cache layers hold; tfgraph's own KV-cache models keep every
    position, ``windowed=False``); latent attention B*T*(kv_rank + rope_dim), its latent and
    its rotary key."""
    terms = []
    for node in graph.ops():
        if OPS[node.op].kv_cached and node.meta.stack == "decoder":
            k, v = (graph.node(i).type for i in node.inputs[1:3])
            kept = 1  # a sliding window keeps only its last W positions (attention.window)
            if windowed and node.attrs.get("window"):
                kept = sympy.Min(k.shape[1], node.attrs["window"]) / k.shape[1]
            if node.attrs.get("latent") is not None:  # latent attention: the latent and the
                # rotary key, kv_rank + rope_dim values per token (transformers' DeepSeek too)
                terms.append(k.nbytes / k.shape[-1] * node.attrs["latent"])
                continue
            terms += [k.nbytes * kept, v.nbytes * kept]
    return total(terms)


def evaluator(sizes: dict[sympy.Symbol, int]) -> Callable[[Any], int]:
    """``int(expr at sizes)``, memoised: by the expression object first (the nodes of every
    layer hold their own, equal, shape expressions, and sympy's equality test on a hash hit
    is slow next to an identity check), then by value."""
    by_value: dict[Any, int] = {}
    by_id: dict[int, tuple[Any, int]] = {}

    def value(expr: Any) -> int:
        hit = by_id.get(id(expr))
        if hit is not None and hit[0] is expr:
            return hit[1]
        out = by_value.get(expr)
        if out is None:
            out = exact.value(expr, sizes)  # the same integer, without sympy's objects
            if out is None:
                out = int(sympy.sympify(expr).xreplace(sizes))
            by_value[expr] = out
        by_id[id(expr)] = (expr, out)  # holds expr: its id is not reused while cached
        return out

    return value


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
    """The largest live set of the plan's walk (``tfgraph.passes.liveness``): while an op runs, its
    inputs, its output, everything held for a later reader and its scratch (``temp``) are
    live. Parameters are weights, not activations; aliasing ops (dropout) add no buffer.

    The walk of ``liveness.Interpreter`` with each buffer's bytes as its value, written out
    with a running total: this runs once per report over every node."""
    bytes_of = evaluator(sizes)
    # a fused kernel streams attention's scores (``OpDef.score_temp``), holding only its
    # ``fused_temp`` (latent attention's padded v and output); other scratch (a loss graph's
    # float32 copy of 16-bit logits) stays
    temp = {c.node: c.scratch(fused_attention) for c in costs}
    aliasing = {op for op, d in OPS.items() if d.aliases_input}
    env = {name: bytes_of(graph.node(name).type.nbytes) for name in graph.inputs}
    now = sum(env.values())
    best, at = -1, ""
    live: tuple[str, ...] = ()
    for step in plan(graph).steps:
        node = step.node
        if node.op not in aliasing:  # an alias's value is its input's buffer
            nbytes = env[node.name] = bytes_of(node.type.nbytes)
            now += nbytes
            total_now = now + bytes_of(temp.get(node.name, ZERO))
            if total_now > best:
                best, at, live = total_now, node.name, tuple(env)
        for name in step.frees:
            gone = env.pop(name, None)
            if gone is not None:
                now -= gone
    expr = total([*(graph.node(n).type.nbytes for n in live), temp.get(at, ZERO)])
    return Peak(best, at, expr, live)


ZERO = sympy.Integer(0)


def weights_bytes(graph: Graph) -> int:
    """Bytes of the unique parameters at their dtype."""
    return sum_terms([param_count(p) * DTYPE_BYTES[p.type.dtype] for p in graph.params()])
