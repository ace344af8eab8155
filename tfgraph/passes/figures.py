"""Every figure of a graph as a sympy expression in B, S, T (the numbers of the report).

One pass over ``tfgraph.passes.cost``'s per-op costs: parameters, FLOPs (forward, matmul, other,
backward, train step, causal-effective matmul) and memory (weights, saved for backward, KV
cache, the model states of an Adam step), plus FLOPs by kind of work. The training step's
memory adds the activation peak of the loss graph to the model states at given sizes
(``tfgraph.passes.train_walk``, in ``tfgraph.passes.report``). ``tfgraph.passes.report`` evaluates them at sizes,
``tfgraph.passes.formulas`` rewrites them in the spec's symbols, ``tfgraph.passes.compare`` plots them.

Precondition: the graph lints. Postcondition: the graph is unchanged; the figures are memoised
on it until it changes.
"""

from __future__ import annotations

from typing import Any

import sympy

from tfgraph.passes import cost, exact, gradients
from tfgraph.graph.ir import DTYPE_BYTES, Graph
from tfgraph.graph.ops import OPS, attended_scores, v_width

ADAM_MOMENT_BYTES = 4  # two fp32 moments per parameter
MASTER_COPY_BYTES = 4  # fp32 master weights kept for 16-bit training
ADAM_STEP_BYTES = 4
"""torch.optim.Adam / AdamW keep a float32 ``step`` tensor in each parameter's state, one per
parameter tensor Adam steps (``_init_group``: torch.tensor(0.0, dtype=_get_scalar_dtype()));
measured against torch.optim.AdamW in tests/test_model_states_grad.py."""
STEP_NOTE = " Adam's float32 step count adds 4 bytes per parameter tensor."
FP32_BYTES = 4
STATES = ("mixed", "megatron")
"""Conventions for the model states of 16-bit training (``tfgraph report --states``, ``tfgraph
plan --states``): both keep 16-bit weights, an fp32 master copy and Adam's two fp32 moments;
"mixed" (the default) keeps 16-bit gradients, 2 + 2 + 4 + 8 = 16 bytes per parameter
(Rajbhandari et al. 2020, ZeRO §3.1; DeepSpeed), "megatron" fp32 gradients (Megatron-LM's
main_grad), 2 + 4 + 4 + 8 = 18 (Korthikanti et al. 2022 §4; Narayanan et al. 2021 §3.4).
float32 training keeps 4 + 4 + 8 = 16 under either."""


def state_bytes(dtype_bytes: int, states: str = "mixed") -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter of training at ``dtype_bytes``
    under the ``states`` convention (``STATES``); optimizer = master copy + two moments."""
    if states not in STATES:
        raise ValueError(f"states must be one of {', '.join(STATES)}, got {states!r}")
    master = MASTER_COPY_BYTES if dtype_bytes < FP32_BYTES else 0
    gradients = FP32_BYTES if states == "megatron" else dtype_bytes
    return dtype_bytes, gradients, master + 2 * ADAM_MOMENT_BYTES


def states_note(dtype_bytes: int, states: str = "mixed") -> str:
    """The model-state convention in words, for a report's and a plan's output."""
    w, g, o = state_bytes(dtype_bytes, states)
    master = "fp32 master copy 4 + " if o > 2 * ADAM_MOMENT_BYTES else ""
    other = "megatron" if states == "mixed" else "mixed"
    return (f"--states {states}: {w} weights + {g} gradients + {o} optimizer ({master}Adam's two "
            f"fp32 moments {2 * ADAM_MOMENT_BYTES}) = {w + g + o} bytes per parameter; "
            f"--states {other} keeps {'fp32' if other == 'megatron' else '16-bit'} gradients "
            "in 16-bit training (mixed: 16, ZeRO's; megatron: 18, Megatron-LM's).")


def _causal_discount(graph: Graph) -> sympy.Expr:
    """Matmul FLOPs of masked-out scores: 2 products * 2 * B*h*hd per score a query does not
    read, Tq*(Tq-1)/2 per causal op, more outside a sliding window, a bidirectional one's
    too (``ops.attended_scores``)."""
    terms = []
    seen: dict[tuple[Any, ...], sympy.Expr] = {}  # the layers repeat a few attention shapes
    for node in graph.ops():
        causal, window = node.attrs.get("causal"), node.attrs.get("window")
        if OPS[node.op].score_flops and (causal or window):  # an encoder's window too
            q, k = (graph.node(i).type for i in node.inputs[:2])
            heads, head_dim = node.attrs["heads"], node.attrs["head_dim"]
            key = (q.shape, k.shape, heads, head_dim, v_width(node.attrs), causal, window)
            term = seen.get(key)
            if term is None:
                b, tq, tk = q.shape[0], q.shape[1], k.shape[1]
                read = attended_scores(tq, tk, bool(causal), window)
                # QK^T over head_dim, weights.V over the value width (latent attention's
                # v_head_dim)
                widths = head_dim + v_width(node.attrs)
                term = seen[key] = 2 * b * heads * widths * (tq * tk - read)
            terms.append(term)
    return cost.total(terms)


def symbolic(graph: Graph) -> dict[str, Any]:
    """Every figure as a sympy expression in B, S, T (memoised on the graph)."""
    return graph.memo("symbolic", lambda: _symbolic(graph))


def _symbolic(graph: Graph) -> dict[str, Any]:
    costs = cost.op_costs(graph)
    params = cost.sum_terms(list(cost.params_by_component(graph).values()))
    matmul = cost.total(c.matmul for c in costs)
    other = cost.total(c.other for c in costs)
    forward = matmul + other
    # 2 x forward, less the work of gradients no path to the outputs asks for
    # (tfgraph.passes.gradients: hard attention's q and k linears, a frozen weight's gradient)
    backward = gradients.backward(graph, forward)
    partial = bool(gradients.backward_savings(graph))
    saved = cost.saved_for_backward(costs)
    dtype_bytes = DTYPE_BYTES[graph.dtype]
    weights = cost.weights_bytes(graph)
    # gradients, Adam's moments and the master copy exist only for the parameters a gradient
    # reaches (gradients.frozen_params: torch leaves the others' .grad None, Adam skips them)
    frozen = gradients.frozen_params(graph)
    trained = params - cost.sum_terms([cost.param_count(p) for p in frozen]) if frozen else params
    grads = weights - cost.sum_terms([cost.param_count(p) * DTYPE_BYTES[p.type.dtype]
                                      for p in frozen]) if frozen else weights
    master = MASTER_COPY_BYTES * trained if dtype_bytes < 4 else 0
    stepped = len(graph.params()) - len(frozen)  # parameter tensors Adam keeps a step for
    by_kind: dict[str, list[sympy.Expr]] = {}
    sums: dict[tuple[int, int], tuple[sympy.Expr, sympy.Expr, sympy.Expr]] = {}
    for c in costs:
        kind = "attention_scores" if OPS[c.op].score_flops else c.kind
        # the layers share their cost expressions (cost.op_costs' memo): one sympy add each
        hit = sums.get((id(c.matmul), id(c.other)))
        if hit is None or hit[0] is not c.matmul or hit[1] is not c.other:
            hit = sums[(id(c.matmul), id(c.other))] = (c.matmul, c.other, c.matmul + c.other)
        by_kind.setdefault(kind, []).append(hit[2])
    out = {
        "costs": costs,
        "params": params,
        "flops": {
            "forward": forward, "matmul": matmul, "other": other,
            "backward": backward,
            "train_step": exact.expand(forward + backward) if partial else 3 * forward,
            "causal_effective_matmul": exact.expand(matmul, _causal_discount(graph)),
        },
        "memory": {
            "weights": sympy.sympify(weights),
            "saved_for_backward": saved,
            "kv_cache": cost.kv_cache(graph),
            # weights + gradients (spec dtype) + two fp32 Adam moments (+ fp32 master) + a
            # float32 step per tensor, the last four of trained parameters only
            "model_states": sympy.sympify(weights + grads + 2 * ADAM_MOMENT_BYTES * trained
                                          + master + ADAM_STEP_BYTES * stepped),
        },
        "flops_by_kind": {k: cost.total(v) for k, v in by_kind.items()},
    }
    if frozen:  # the parameters gradients are kept for (tfgraph.passes.report's --states)
        out["params_trained"] = trained
    if cost.routed_experts(graph):
        _add_expert_figures(graph, costs, out)
    return out


# Roles of the routing ops of a mixture-of-experts feed-forward (tfgraph.graph.lower.moe).
ROUTER_ROLES = ("router", "route")


def _add_expert_figures(graph: Graph, costs: list[cost.OpCost], out: dict[str, Any]) -> None:
    """Mixture-of-experts figures (README, ``ffn.experts``): the parameters a token uses
    (its top-k routed experts, the shared experts, everything else), the router's FLOPs, and
    the FLOPs with every routed expert on every token, which is what the ONNX back end's dense
    form computes (``flops.matmul`` and ``forward`` count each token's top k, as the PyTorch
    back end computes)."""
    roles = {n.name: n.meta.role for n in graph.ops()}
    out["params_active"] = exact.expand(out["params"], cost.inactive_params(graph))
    flops = out["flops"]
    flops["router"] = cost.total(c.matmul + c.other for c in costs
                                 if roles[c.node] in ROUTER_ROLES)
    dense_matmul = cost.total(c.dense[0] if c.dense else c.matmul for c in costs)
    dense_other = cost.total(c.dense[1] if c.dense else c.other for c in costs)
    flops["matmul_all_experts"] = dense_matmul
    flops["forward_all_experts"] = dense_matmul + dense_other
