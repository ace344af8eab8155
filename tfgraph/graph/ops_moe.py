"""Op definitions of a mixture-of-experts feed-forward (README, ``ffn.experts``): routing,
the routed experts, and the sigmoid gate of Qwen2-MoE's shared expert.

Registered into ``tfgraph.graph.ops.OPS`` when ``tfgraph.graph.ir`` imports this module. Costs follow
``tfgraph.graph.ops``' conventions; ``experts`` counts what the PyTorch back end computes (each token
through its top-k experts only: the ideal, "active" FLOPs) and, as ``dense_flops``, what the
ONNX back end's dense form computes (every expert on every token, weighted by the routing
weights, which are zero outside the top k).

Shapes: N = B*L tokens, d d_model, E experts, k top_k, H an expert's inner width.
"""

from __future__ import annotations

from typing import Any

import sympy

from tfgraph.graph.ops import (
    FLOPS_PER_ELEMENT,
    REAL,
    SIZE,
    STATS_BYTES,
    ZERO,
    Attr,
    Flops,
    OpDef,
    Saved,
    TensorType,
    _check_last,
    _rows,
    register,
)
from tfgraph.graph.tensor import DTYPE_BYTES

INDEX_BYTES = DTYPE_BYTES["int64"]  # top-k indices and the per-expert token lists

# Per-element constants of the routing (stated in every report with the others).
FLOPS_PER_ELEMENT.update({
    "topk": 1,  # one comparison per candidate while selecting the k largest
    "renorm": 2,  # sum of the k weights, one divide per weight
    "sigmoid": 4,  # exp, add, divide (and the negation folded in)
    # sparsemixer's candidate test per expert: |s|, max with m, m - s, divide, compare
    "threshold": 5,
})


# ---- route: router logits -> routing weights ---------------------------------------------------


ROUTERS = ("softmax_topk", "softmax_topk_renorm", "topk_softmax", "sparsemixer",
           "sigmoid_topk", "sigmoid_topk_renorm")
"""The routers (``ffn.router``): how logits become the k routing weights."""


def _route_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    logits = ins[0]
    experts = logits.shape[-1]
    if sympy.sympify(attrs["top_k"] - experts).is_positive:
        raise ValueError(f"top_k {attrs['top_k']} is more than the {experts} experts")
    if attrs["router"] not in ROUTERS:
        raise ValueError(f"unknown router {attrs['router']!r}")
    sigmoid = attrs["router"].startswith("sigmoid")
    if sigmoid != (len(ins) == 2):
        raise ValueError("a sigmoid router takes its correction bias (E,) as a second operand; "
                         "the others none")
    if sigmoid and ins[1].shape != (experts,):
        raise ValueError(f"correction bias {ins[1]} is not ({experts},)")
    if attrs["router"] == "sparsemixer" and isinstance(attrs["top_k"], int) \
            and attrs["top_k"] != 2:  # (a symbol in formula twins: the spec checked it)
        raise ValueError("the sparsemixer router picks 2 experts")
    return logits


def _route_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
    n, experts, k = _rows(out), out.shape[-1], attrs["top_k"]
    select = FLOPS_PER_ELEMENT["topk"] * n * experts
    if attrs["router"] == "sparsemixer":  # per choice: the max, the threshold, a softmax
        per = FLOPS_PER_ELEMENT["topk"] + FLOPS_PER_ELEMENT["threshold"] \
            + FLOPS_PER_ELEMENT["softmax"]
        return ZERO, 2 * per * n * experts
    scale = FLOPS_PER_ELEMENT["add"] * n * k if attrs.get("scale", 1.0) != 1.0 else ZERO
    if attrs["router"] == "topk_softmax":  # the k largest logits, softmax over them
        return ZERO, select + FLOPS_PER_ELEMENT["softmax"] * n * k + scale
    if attrs["router"].startswith("sigmoid"):  # scores, plus the bias for the choice
        other = (FLOPS_PER_ELEMENT["sigmoid"] + FLOPS_PER_ELEMENT["add"]) * n * experts
    else:
        other = FLOPS_PER_ELEMENT["softmax"] * n * experts
    other += select + scale
    groups = attrs.get("groups", 1)
    if groups != 1:  # each group's score (a top-2 or max pass over its experts, the top-2
        # sum), the choice of the groups (a pass over them) and the mask of the rest
        other += (FLOPS_PER_ELEMENT["topk"] + FLOPS_PER_ELEMENT["add"]) * n * experts
        other += (FLOPS_PER_ELEMENT["topk"] + FLOPS_PER_ELEMENT["add"]) * n * groups
    if attrs["router"].endswith("_renorm"):
        other += FLOPS_PER_ELEMENT["renorm"] * n * k
    return ZERO, other


def _route_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    # What autograd keeps in torch_functional.route (float32 routing, as transformers does):
    # the top-k indices (shared by top-k and the scatter), the softmax output, and for the
    # renormalisation the divide's numerator and denominator.
    n, experts, k = _rows(out), out.shape[-1], attrs["top_k"]
    saved: Saved = [(("tmp", "indices"), n * k * INDEX_BYTES)]
    if attrs["router"] == "sparsemixer":  # per choice: its index, softmax output, mask
        return [(("tmp", f"{what}{c}"), size) for c in (1, 2) for what, size in (
            ("index", n * INDEX_BYTES), ("softmax", n * experts * STATS_BYTES),
            ("mask", n * experts))]
    if attrs["router"] == "topk_softmax":
        return [*saved, (("tmp", "softmax"), n * k * STATS_BYTES)]
    saved.append((("tmp", "softmax"), n * experts * STATS_BYTES))  # (or the sigmoid's)
    # Group-limited routing keeps nothing more: the group scores, the chosen groups and the
    # mask only choose the top-k indices, and the weights are gathered from the scores, so no
    # gradient reaches that branch and autograd frees what its nodes saved with it.
    if attrs["router"].endswith("_renorm"):
        saved += [(("tmp", "top_k"), n * k * STATS_BYTES), (("tmp", "sum"), n * STATS_BYTES)]
    return saved


register(OpDef(
    "route", (1, 2), _route_infer, _route_flops, _route_saved,
    "Routing weights from router logits (B, L, E), attrs top_k and router: softmax_topk "
    "(softmax over the E experts, keep the k largest), softmax_topk_renorm (the same divided "
    "by their sum), topk_softmax (softmax over the k largest logits), sparsemixer (Phi-3.5-"
    "MoE at inference, k = 2: each choice the largest remaining logit m, weighted by the "
    "softmax over the remaining experts e with (m - s_e) / max(|s_e|, m) <= 2 attrs['eps']), "
    "sigmoid_topk (sigmoid "
    "scores; the k largest of score + the second operand, a correction bias (E,), chosen, "
    "weighted by their score: DeepSeek-V3) and sigmoid_topk_renorm (those divided by their "
    "sum + 1e-20). With attrs groups > 1 (DeepSeek's group-limited routing) the experts are "
    "that many equal groups and only those of the top_groups best groups may be chosen; a "
    "group scores its best expert (softmax routers; DeepSeek-V2) or the sum of its two best "
    "bias-corrected scores (sigmoid; DeepSeek-V3). attrs scale multiplies the weights "
    "(routed_scaling_factor). Output (B, L, E): the k weights at their experts, exactly 0 "
    "elsewhere. Computed in float32.",
    category="activation",
    # the correction bias only shifts which experts top-k picks: the indices carry no gradient
    # (DeepSeek-V3 §2.1.2 adjusts it outside backprop; HF keeps it as a buffer)
    no_grad=(1,),
    attrs={"top_k": Attr(SIZE, required=True),
           "router": Attr(str, required=True, doc=", ".join(ROUTERS)),
           "groups": Attr(int, default=1, doc="expert groups (DeepSeek n_group)"),
           "top_groups": Attr(int, default=1, doc="groups a token may choose from"),
           "scale": Attr((int, float), default=1.0, doc="multiplies the routing weights"),
           "eps": Attr(REAL, doc="sparsemixer's threshold epsilon")},
))


# ---- experts: the routed expert feed-forwards ------------------------------------------------


def _experts_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, weights, *params = ins
    gated = attrs["gated"]
    if len(params) != (3 if gated else 2):
        raise ValueError(f"experts take x, weights and {'gate, up, down' if gated else 'up, down'}")
    up, down = params[-2], params[-1]
    if len(up.shape) != 3 or len(down.shape) != 3:
        raise ValueError("expert weights are stacked (E, H, d) and (E, d, H)")
    experts, hidden, d = up.shape
    _check_last(x, d, "experts input")
    _check_last(weights, experts, "routing weights")
    if weights.shape[:-1] != x.shape[:-1]:
        raise ValueError(f"routing weights {weights} do not match x {x}")
    if down.shape != (experts, d, hidden) or (gated and params[0].shape != up.shape):
        raise ValueError(f"expert weights disagree: {[str(p) for p in params]}")
    return x


def _expert_sizes(ins: list[TensorType]) -> tuple[Any, Any, Any, Any]:
    x, up = ins[0], ins[-2]
    experts, hidden, d = up.shape
    return _rows(x), experts, hidden, d


def _per_pair(ins: list[TensorType], attrs: dict[str, Any]) -> tuple[Any, Any]:
    """(matmul, other) FLOPs of one (token, expert) pair: 2 or 3 products of d x H, the
    activation (and gate product) on H, then the weighting and the sum into the output on d."""
    _, _, hidden, d = _expert_sizes(ins)
    products = 3 if attrs["gated"] else 2
    other = FLOPS_PER_ELEMENT[attrs["activation"]] * hidden + 2 * FLOPS_PER_ELEMENT["add"] * d
    if attrs["gated"]:
        other += FLOPS_PER_ELEMENT["add"] * hidden
    return 2 * products * d * hidden, other


def _experts_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
    # The PyTorch back end runs each expert on the tokens routed to it: N * k pairs.
    n = _expert_sizes(ins)[0]
    matmul, other = _per_pair(ins, attrs)
    return n * attrs["top_k"] * matmul, n * attrs["top_k"] * other


def _experts_dense_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]
                         ) -> Flops:
    # The ONNX back end's dense form runs every expert on every token: N * E pairs.
    n, experts, _, _ = _expert_sizes(ins)
    matmul, other = _per_pair(ins, attrs)
    return n * experts * matmul, n * experts * other


# Buffers of one routed (token, expert) pair that autograd keeps in torch_functional.experts,
# in units of H: gated, the gate product's input and output, the up product and the activation
# input; relu keeps one buffer (its output, also the down product's input), the other
# activations their input and output.
_HIDDEN_SAVED = {"gated": 4, "relu": 1}


def _experts_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    # Per pair: the gathered token (d), the hidden buffers, the expert's output (d) and its
    # routing weight (1) for the weighting product, the weighted output (d) that index_add_
    # keeps; per pair also two indices (the sort order and the token), and per token the k
    # top-k indices.
    n, _, hidden, d = _expert_sizes(ins)
    pairs = n * attrs["top_k"]
    units = _HIDDEN_SAVED["gated"] if attrs["gated"] else _HIDDEN_SAVED.get(attrs["activation"], 2)
    nbytes = DTYPE_BYTES[ins[0].dtype]
    return [(("tmp", "tokens"), pairs * d * nbytes),
            (("tmp", "hidden"), pairs * units * hidden * nbytes),
            (("tmp", "expert_out"), pairs * (2 * d + 1) * nbytes),
            (("tmp", "indices"), pairs * 3 * INDEX_BYTES)]


def _experts_backward_temp(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]
                           ) -> sympy.Expr:
    """Bytes the experts' backward holds besides its saved tensors and operand gradients.
    ``torch_functional.experts`` unbinds each stacked weight once, so each expert's weight
    gradients wait, one stacked weight's worth in all, until they are stacked into the
    stacked weights' gradients; meanwhile the weighted outputs are freed first and each
    expert's hidden buffers as its backward ends; the gradients of each expert's gathered
    rows wait too, to be joined (a gathered token's worth per pair). What the pieces add
    beyond what they replace: max(0, stacked weights + gathered rows - hidden - expert
    outputs)."""
    saved = dict(_experts_saved(ins, out, attrs))
    pieces = sympy.Add(*(t.nbytes for t in ins[2:])) + saved[("tmp", "tokens")]
    return sympy.Max(0, pieces - saved[("tmp", "hidden")] - saved[("tmp", "expert_out")])


def _experts_temp(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> sympy.Expr:
    """Bytes ``torch_functional.experts`` holds without autograd besides its operands and its
    output, at its largest, with P = N k pairs, at most c = ceil(P / E) of them per expert (a
    balanced routing; a busier last expert holds more). All along: the top-k weights and
    indices, the pairs' sort order and tokens (P weights, 3 P indices). Then, in turn: the
    pair count per expert (E indices); the gathered rows (P d) while each expert runs on its
    rows, the outputs of the experts before it (at most P - c rows of d) and its own buffers
    (c rows of 3 H while gated or relu^2 computes its product, 2 H otherwise; H + d while
    the down product writes); the joined outputs (P d) with the pieces (P d); the weighting
    (P d) with its input (P d) and the pairs' weights (P); the output being summed into (N d)
    with the weighted rows (P d)."""
    n, experts, hidden, d = _expert_sizes(ins)
    pairs = n * attrs["top_k"]
    x_bytes, w_bytes = DTYPE_BYTES[ins[0].dtype], DTYPE_BYTES[ins[1].dtype]
    busiest = sympy.ceiling(pairs / experts)
    units = 3 if attrs["gated"] or attrs["activation"] == "relu2" else 2
    expert = sympy.Max(units * hidden, hidden + d) * busiest
    held = pairs * (w_bytes + 3 * INDEX_BYTES)
    stages = [experts * INDEX_BYTES,
              (2 * pairs * d - busiest * d + expert) * x_bytes,
              2 * pairs * d * x_bytes + pairs * w_bytes,
              (pairs * d + n * d) * x_bytes]
    return held + sympy.Max(*stages) - out.nbytes


register(OpDef(
    "experts", (4, 5), _experts_infer, _experts_flops, _experts_saved,
    "Routed experts: x (B, L, d), routing weights (B, L, E), stacked expert weights "
    "[gate (E, H, d),] up (E, H, d), down (E, d, H) -> sum over the top-k experts e of "
    "w_e * down_e(act(gate_e(x)) * up_e(x)) (gated) or w_e * down_e(act(up_e(x))), "
    "attrs top_k, activation, gated. FLOPs: each token through its k experts; dense_flops: "
    "every expert on every token (the ONNX form).",
    category="linear",
    dense_flops=_experts_dense_flops,
    attrs={"top_k": Attr(SIZE, required=True), "activation": Attr(str, required=True),
           "gated": Attr(bool, required=True)},
    tp="project_hidden", whole_scratch=("tokens", "expert_out", "indices"), routed=True,
    temp=_experts_temp, temp_saved=True, backward_temp=_experts_backward_temp,
    tp_refused_source="stacked experts are split by tfgraph.exporters.parallelize only",
))


# ---- sigmoid_gate: Qwen2-MoE's gate on the shared expert -------------------------------------


def _sigmoid_gate_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    gate, y = ins
    if gate.shape[-1] != 1 or gate.shape[:-1] != y.shape[:-1]:
        raise ValueError(f"gate {gate} must be (.., 1) over y {y}")
    return y


def _sigmoid_gate_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]
                        ) -> Flops:
    return ZERO, FLOPS_PER_ELEMENT["sigmoid"] * ins[0].numel + FLOPS_PER_ELEMENT["add"] * out.numel


def _sigmoid_gate_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    # sigmoid keeps its output, which the product keeps too, with y.
    return [(("tmp", "sigmoid"), ins[0].nbytes), (("in", 1), ins[1].nbytes)]


register(OpDef(
    "sigmoid_gate", (2, 2), _sigmoid_gate_infer, _sigmoid_gate_flops, _sigmoid_gate_saved,
    "sigmoid(gate) * y with gate (B, L, 1) and y (B, L, d): Qwen2-MoE's shared_expert_gate.",
    tp="follows", sequence="elementwise",
))
