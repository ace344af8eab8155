"""The work the model does: FLOPs with every attention's masked-out scores left out (README,
``tfgraph report``, "Effective and dense FLOPs").

``flops.forward`` counts causal attention dense, over the whole Tq*Tk score matrix, as
``FlopCounterMode`` sees explicit-matmul attention. A causal query i reads only keys j <= i,
and a sliding-window one only the last W of them; attention kernels that skip masked tiles
(FlashAttention, SDPA with ``is_causal``) do that work only. The
*effective* figures count each causal or windowed attention op (an encoder's bidirectional
window too) over the scores its queries really read
(``ops.attended_scores``): both products (QKᵀ and weights·V) and the per-score element-wise
work (scaling, mask, soft-cap, softmax), which are all proportional to the score count.
Everything else is the dense figure's. Backward is 2 x forward_effective less the
gradients nothing asks for (``tfgraph.passes.gradients``; hard attention's), counted the same
way.

These are the headline figures of ``report``, ``compare`` and the plots; the dense ones stay
beside them. Kept apart from ``tfgraph.passes.figures`` (whose ``causal_effective_matmul`` is
the matmul part of the same count) so the dense figures' pass is untouched.
"""

from __future__ import annotations

from typing import Any

import sympy

from tfgraph.graph.ir import Graph
from tfgraph.graph.ops import OPS, attended_scores
from tfgraph.passes import cost, exact, gradients
from tfgraph.passes.figures import symbolic

ATTENTION_KIND = "attention_scores"  # figures' flops_by_kind key of the attention ops


def read_fraction(graph: Graph, node_name: str) -> sympy.Expr | None:
    """Scores read / scores in the matrix of one attention op; None when it reads them all
    (no causal mask nor window: bidirectional self-attention, cross-attention)."""
    node = graph.node(node_name)
    if not OPS[node.op].score_flops or not masked(node.attrs):
        return None
    q, k = (graph.node(i).type for i in node.inputs[:2])
    tq, tk = q.shape[1], k.shape[1]
    return attended_scores(tq, tk, node.attrs["causal"], node.attrs.get("window")) / (tq * tk)


def masked(attrs: dict[str, Any]) -> bool:
    """An attention op whose queries skip some keys: causal, or a sliding window (a decoder's
    or an encoder's bidirectional one)."""
    return bool(attrs["causal"] or attrs.get("window"))


def effective(graph: Graph) -> dict[str, Any]:
    """The effective figures as sympy expressions in B, S, T (memoised on the graph):
    ``flops`` with forward_effective, matmul_effective, other_effective, backward_effective and
    train_step_effective (the dense figure's 2x and 3x rules, less the gradients no path to
    the outputs asks for: ``tfgraph.passes.gradients``), and ``flops_by_kind`` (only
    attention_scores differs from the dense roll-up)."""
    return graph.memo("effective", lambda: _effective(graph))


def _effective(graph: Graph) -> dict[str, Any]:
    sym = symbolic(graph)
    masked_matmul: list[sympy.Expr] = []
    masked_other: list[sympy.Expr] = []
    # The layers repeat a few attention shapes: one sympy product per distinct (cost, window).
    seen: dict[tuple[int, int, bool, Any], tuple[sympy.Expr, sympy.Expr]] = {}
    for c in sym["costs"]:
        if not OPS[c.op].score_flops:
            continue
        node = graph.node(c.node)
        if not masked(node.attrs):
            continue
        key = (id(c.matmul), id(c.other), node.attrs["causal"], node.attrs.get("window"))
        hit = seen.get(key)
        if hit is None:
            fraction = read_fraction(graph, c.node)
            assert fraction is not None
            # Both products and every per-score constant scale with the scores read; what a
            # query does not read is (1 - fraction) of the dense count.
            hit = seen[key] = (exact.expand(c.matmul * (1 - fraction)),
                               exact.expand(c.other * (1 - fraction)))
        masked_matmul.append(hit[0])
        masked_other.append(hit[1])
    skipped_matmul = cost.total(masked_matmul)
    skipped_other = cost.total(masked_other)
    flops = sym["flops"]
    matmul = exact.expand(flops["matmul"], skipped_matmul)
    other = exact.expand(flops["other"], skipped_other)
    forward = matmul + other
    by_kind = dict(sym["flops_by_kind"])
    if ATTENTION_KIND in by_kind:
        by_kind[ATTENTION_KIND] = exact.expand(by_kind[ATTENTION_KIND],
                                               skipped_matmul + skipped_other)
    backward = 2 * forward
    train_step = 3 * forward
    savings = gradients.backward_savings(graph)
    if savings:  # gradients some ops do not compute (tfgraph.passes.gradients), counted over
        # the scores read where they are attention's (its backward scales with them too)
        terms = []
        for c, saved_matmul, saved_other in savings:
            fraction = read_fraction(graph, c.node)
            terms.append(saved_matmul + saved_other if fraction is None
                         else (saved_matmul + saved_other) * fraction)
        backward = exact.expand(backward, cost.total(terms))
        train_step = exact.expand(forward + backward)
    return {
        "flops": {"forward_effective": forward, "matmul_effective": matmul,
                  "other_effective": other, "backward_effective": backward,
                  "train_step_effective": train_step},
        "flops_by_kind": by_kind,
    }


def at_sizes(graph: Graph, sizes: dict[sympy.Symbol, int]) -> dict[str, Any]:
    """The effective figures as integers at ``sizes`` (B, S, T)."""
    eff = effective(graph)

    def value(expr: sympy.Expr) -> int:
        fast = exact.value(expr, sizes)  # the same integer, without sympy's objects
        return fast if fast is not None else int(sympy.Integer(sympy.sympify(expr).xreplace(sizes)))

    return {"flops": {k: value(v) for k, v in eff["flops"].items()},
            "flops_by_kind": {k: value(v) for k, v in eff["flops_by_kind"].items()}}
