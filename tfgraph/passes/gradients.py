"""Which values a gradient reaches, and the backward FLOPs that follow (README, ``tfgraph
report``: flops.backward, memory.model_states).

Autograd computes the gradient of a value when it both
- requires one: it is a parameter, or some operand it depends on through an operand that
  passes a gradient requires one (token ids, rotary tables and masks do not), and
- is reached: a path leads from it to the graph's outputs (the loss of a loss graph; the
  sum of the outputs of an inference graph, as ``out.sum().backward()``) through operands
  that pass a gradient. An op passes none to the operands ``ops.no_grad_operands`` names:
  ``shape_only``, ``no_grad`` and, by its attributes, ``grad_blocked`` (hard attention's
  arg-max: q and k get none, so neither do the q and k linears nor their weights).

A parameter no gradient reaches keeps no gradient and no optimizer state
(``gradients.frozen_params``). An op's backward FLOPs are 2 x its forward FLOPs when every
operand gets a gradient (the usual rule: one product for the input's
gradient and one for the weight's per forward product; Kaplan et al. 2020, Narayanan et al.
2021); 0 when none does (hard attention's q and k linears; an ALiBi bias made from positions
only); otherwise its ``OpDef.backward_flops`` with the operands that get one (a linear on a
value that needs no gradient: its weight's gradient only), or 2 x forward without one.

Precondition: the graph lints. Postcondition: the graph is unchanged; results are memoised
on it.
"""

from __future__ import annotations

from typing import Any

import sympy

from tfgraph.graph.ir import Graph, Node
from tfgraph.graph.ops import OPS, no_grad_operands
from tfgraph.passes import cost, exact


NOT_FLOATING = ("int64", "int32", "bool")
"""Dtypes autograd computes no gradient for (ids, indices, masks)."""


def operand_grads(graph: Graph) -> dict[str, tuple[bool, ...]]:
    """For every op node, one flag per operand: whether the op's backward computes that
    operand's gradient: the op is reached, the operand passes a gradient and requires one
    (memoised on the graph)."""
    return graph.memo("operand_grads", lambda: _operand_grads(graph))


def reached(graph: Graph) -> frozenset[str]:
    """Names of the nodes a gradient reaches from the outputs, whether or not they require one
    (memoised on the graph)."""
    return graph.memo("grad_reached", lambda: _reached(graph))


def _passing(graph: Graph) -> dict[str, tuple[bool, ...]]:
    """Per op node, whether each operand passes a gradient back (not ``no_grad_operands``)."""

    def compute() -> dict[str, tuple[bool, ...]]:
        out = {}
        for node in graph.ops():
            blocked = no_grad_operands(OPS[node.op], node.attrs)
            out[node.name] = tuple(k not in blocked for k in range(len(node.inputs)))
        return out

    return graph.memo("grad_passing", compute)


def _reached(graph: Graph) -> frozenset[str]:
    passing = _passing(graph)
    hit = set(graph.outputs)
    for node in reversed(list(graph.ops())):  # users come after their operands
        if node.name in hit:
            hit.update(name for name, passes in zip(node.inputs, passing[node.name]) if passes)
    return frozenset(hit)


def _requires(graph: Graph) -> frozenset[str]:
    """Names of the values that require a gradient: parameters, and what a floating op
    computes from one through an operand that passes a gradient (graph inputs: ids, masks,
    positions do not; nor an ALiBi bias made from them)."""

    def compute() -> frozenset[str]:
        passing = _passing(graph)
        requires = {p.name for p in graph.params()}
        for node in graph.ops():
            if node.type.dtype not in NOT_FLOATING and any(
                    passes and name in requires
                    for name, passes in zip(node.inputs, passing[node.name])):
                requires.add(node.name)
        return frozenset(requires)

    return graph.memo("grad_requires", compute)


def _operand_grads(graph: Graph) -> dict[str, tuple[bool, ...]]:
    passing = _passing(graph)
    hit = reached(graph)
    requires = _requires(graph)
    return {node.name: tuple(node.name in hit and passes and name in requires
                             for name, passes in zip(node.inputs, passing[node.name]))
            for node in graph.ops()}


def frozen(graph: Graph) -> list[Node]:
    """Parameter nodes no gradient reaches, in topological order."""
    hit = reached(graph)
    return [p for p in graph.params() if p.name not in hit]


_RULES: dict[tuple[Any, ...], tuple[sympy.Expr, sympy.Expr]] = {}
"""Backward FLOPs by op signature and gradient flags (the layers repeat the same ops)."""
_RULES_MAX = 4096


def backward_savings(graph: Graph) -> list[tuple[cost.OpCost, sympy.Expr, sympy.Expr]]:
    """(op cost, matmul, other) of 2 x forward that an op's backward does not do, for each op
    some of whose operands get no gradient: all of it where no operand gets one, 2 x forward less ``OpDef.backward_flops`` where some do (memoised on the graph;
    empty where every gradient flows: backward is then exactly 2 x forward)."""
    return graph.memo("backward_savings", lambda: _backward_savings(graph))


def _backward_savings(graph: Graph) -> list[tuple[cost.OpCost, sympy.Expr, sympy.Expr]]:
    grads = operand_grads(graph)
    if len(_RULES) >= _RULES_MAX:
        _RULES.clear()
    out = []
    for c in cost.op_costs(graph):
        flags = grads[c.node]
        if not any(flags):  # no backward at all
            saved = (2 * c.matmul, 2 * c.other)
        else:
            rule = OPS[c.op].backward_flops
            node = graph.node(c.node)
            if rule is None or all(flags):
                continue  # the usual 2 x forward
            key = (c.op, tuple(graph.node(i).type for i in node.inputs), node.type,
                   tuple((k, type(v), v) for k, v in node.attrs.items()), flags)
            if key not in _RULES:
                ins = [graph.node(i).type for i in node.inputs]
                matmul, other = rule(ins, node.type, node.attrs, flags)
                _RULES[key] = (exact.expand(2 * c.matmul, matmul),
                               exact.expand(2 * c.other, other))
            saved = _RULES[key]
        if saved[0] != 0 or saved[1] != 0:
            out.append((c, saved[0], saved[1]))
    return out


def backward(graph: Graph, forward: sympy.Expr) -> sympy.Expr:
    """Backward FLOPs from the forward total: 2 x ``forward`` less ``backward_savings``."""
    savings = backward_savings(graph)
    if not savings:
        return 2 * forward
    return exact.expand(2 * forward, cost.total(m + o for _, m, o in savings))


def frozen_params(graph: Graph) -> list[Node]:
    """Parameters no gradient reaches: every path from them to the outputs passes an operand
    that takes no gradient (``ops.no_grad_operands``: DeepSeek-V3's router correction bias,
    the q and k linears of hard attention). torch gives them no ``.grad`` and Adam keeps no
    state for them; they are still parameters (``params``)."""
    return list(graph.memo("frozen_params", lambda: frozen(graph)))

