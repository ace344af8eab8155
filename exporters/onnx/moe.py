"""ONNX emitters of the mixture-of-experts ops (``tfgraph.graph.ops_moe``; README, ``ffn.experts``).

The routed experts use the dense form: every expert runs on every token as batched MatMuls
over the stacked (E, H, d) weights, and the outputs are summed weighted by the routing
weights, which ``route`` leaves exactly 0 outside each token's top k; a Where selects 0
for those (rather than multiplying by 0), so an unrouted expert's overflowing output cannot
turn the sum into NaN. The result is the same
function as the PyTorch back end's gather form (which runs each expert on its own tokens),
while the model performs E/k times the routed experts' FLOPs: the report's
``flops.forward_all_experts`` and ``matmul_all_experts``. It needs only standard opset-17 ops
(a gather form would need a loop over experts or per-token copies of the expert weights).
Routing: Softmax, TopK and ScatterElements into zeros, in float32 as the PyTorch back end.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from onnx import TensorProto, helper

from tfgraph.exporters.onnx.builder import Builder
from tfgraph.exporters.onnx.tensors import ELEM_TYPE
from tfgraph.graph.ir import Node

GELU_OPSET = 20  # the opset of ONNX's Gelu (as tfgraph.exporters.onnx.ops)


def _activation(b: Builder, scope: str, x: str, activation: str) -> str:
    if activation == "silu":
        return b.add(scope, "Mul", [x, b.add(scope, "Sigmoid", [x])], tag="silu")
    if activation == "relu":
        return b.add(scope, "Relu", [x])
    if activation == "relu2":
        relu = b.add(scope, "Relu", [x])
        return b.add(scope, "Mul", [relu, relu], tag="relu2")
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    if b.opset >= GELU_OPSET:
        return b.add(scope, "Gelu", [x], approximate=approximate)
    if approximate == "none":  # 0.5 x (1 + erf(x / sqrt 2))
        inner = b.add(scope, "Erf", [b.add(scope, "Mul", [x, b.const(
            scope, "inv_sqrt2", 1 / math.sqrt(2))], tag="x_over_sqrt2")])
    else:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.add(scope, "Mul", [b.add(scope, "Mul", [x, x], tag="x2"), x], tag="x3")
        cube = b.add(scope, "Mul", [cube, b.const(scope, "c", 0.044715)], tag="c_x3")
        arg = b.add(scope, "Mul", [b.add(scope, "Add", [x, cube]),
                                   b.const(scope, "k", math.sqrt(2 / math.pi))], tag="arg")
        inner = b.add(scope, "Tanh", [arg])
    one_plus = b.add(scope, "Add", [inner, b.const(scope, "one", 1.0)], tag="one_plus")
    y = b.add(scope, "Mul", [x, one_plus], tag="x_mul")
    return b.add(scope, "Mul", [y, b.const(scope, "half", 0.5)], tag="half")


def _f32(b: Builder, n: Node, x: str, tag: str) -> str:
    return x if b.dtype == "float32" else b.cast(n.name, x, "float32", tag=tag)


def _route(b: Builder, n: Node) -> str:
    logits = n.inputs[0]  # (B, L, E)
    k, router = int(n.attrs["top_k"]), n.attrs["router"]
    x = _f32(b, n, logits, "to_float32")
    topk = b.ints([k])
    if router == "sparsemixer":
        out = _sparsemixer(b, n, x, float(n.attrs.get("eps", 0.01)))
        if b.dtype == "float32":
            return b.add(n.name, "Identity", [out], n.name)
        return b.add(n.name, "Cast", [out], n.name, to=ELEM_TYPE[b.dtype])
    if router == "topk_softmax":
        top, index = b.add_outputs(n.name, "TopK", [x, topk], 2, axis=-1)  # (B, L, k)
        weights = b.add(n.name, "Softmax", [top], axis=-1)
    else:
        sigmoid = router.startswith("sigmoid")
        scores = b.add(n.name, "Sigmoid", [x]) if sigmoid \
            else b.add(n.name, "Softmax", [x], axis=-1)  # (B, L, E)
        choice = scores
        if sigmoid:  # DeepSeek-V3: the correction bias moves the choice, not the weights
            choice = b.add(n.name, "Add", [scores, _f32(b, n, n.inputs[1], "bias_f32")],
                           tag="corrected")
        groups = int(n.attrs.get("groups", 1))
        if groups > 1:
            choice = _group_limit(b, n, choice, groups, int(n.attrs["top_groups"]), sigmoid)
        index = b.add_outputs(n.name, "TopK", [choice, topk], 2, tag="choose", axis=-1)[1]
        weights = b.add(n.name, "GatherElements", [scores, index], tag="weights", axis=-1)
        if router.endswith("_renorm"):
            total = b.reduce(n.name, "ReduceSum", weights, [-1])
            if sigmoid:  # DeepSeek-V3 adds 1e-20 to the sum
                total = b.add(n.name, "Add", [total, b.const(n.name, "tiny", 1e-20, "float32")],
                              tag="sum_eps")
            weights = b.add(n.name, "Div", [weights, total], tag="renorm")
    scale = float(n.attrs.get("scale", 1.0))
    if scale != 1.0:  # routed_scaling_factor
        weights = b.add(n.name, "Mul", [weights, b.const(n.name, "scale", scale, "float32")],
                        tag="scaled")
    zero = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    zeros = b.add(n.name, "ConstantOfShape", [b.add(n.name, "Shape", [x])], value=zero)
    out = b.add(n.name, "ScatterElements", [zeros, index, weights], axis=-1)  # (B, L, E)
    if b.dtype == "float32":
        return b.add(n.name, "Identity", [out], n.name)
    return b.add(n.name, "Cast", [out], n.name, to=ELEM_TYPE[b.dtype])


def _sparsemixer(b: Builder, n: Node, x: str, eps: float) -> str:
    """Phi-3.5-MoE's two choices, as torch_functional.sparsemixer: the largest remaining
    logit (ArgMax: the first of a tie, as torch's max), the softmax over the remaining
    experts within the threshold, that weight scattered in, the expert then removed."""
    zero = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    weights = b.add(n.name, "ConstantOfShape", [b.add(n.name, "Shape", [x])], tag="zeros",
                    value=zero)  # (B, L, E)
    neg_inf = b.const(n.name, "neg_inf", float("-inf"), "float32")
    bound = b.const(n.name, "two_eps", 2 * eps, "float32")
    magnitude = b.add(n.name, "Abs", [x], tag="abs")
    remaining = x
    for c in (1, 2):
        index = b.add(n.name, "ArgMax", [remaining], tag=f"index{c}", axis=-1,
                      keepdims=1)  # (B, L, 1)
        top = b.add(n.name, "GatherElements", [remaining, index], tag=f"top{c}", axis=-1)
        factor = b.add(n.name, "Max", [magnitude, top], tag=f"factor{c}")
        gap = b.add(n.name, "Div", [b.add(n.name, "Sub", [top, x], tag=f"gap{c}"), factor],
                    tag=f"relative{c}")
        far = b.add(n.name, "Greater", [gap, bound], tag=f"far{c}")
        gates = b.add(n.name, "Softmax", [b.add(n.name, "Where", [far, neg_inf, remaining],
                                                tag=f"masked{c}")], tag=f"gates{c}", axis=-1)
        weight = b.add(n.name, "GatherElements", [gates, index], tag=f"weight{c}", axis=-1)
        weights = b.add(n.name, "ScatterElements", [weights, index, weight],
                        tag=f"scatter{c}", axis=-1)
        if c == 1:
            removed = b.add(n.name, "Expand", [neg_inf, b.add(n.name, "Shape", [index],
                                                              tag="index_shape")],
                            tag="removed")
            remaining = b.add(n.name, "ScatterElements", [remaining, index, removed],
                              tag="remaining", axis=-1)
    return weights


def _group_limit(b: Builder, n: Node, choice: str, groups: int, top_groups: int,
                 sigmoid: bool) -> str:
    """``choice`` (B, L, E) with the experts outside the top_groups best of ``groups`` equal
    groups left out: -inf (sigmoid, DeepSeek-V3: a group scores its two best) or 0 (softmax,
    DeepSeek-V2: a group scores its best)."""
    per_group = b.add(n.name, "Reshape", [choice, b.ints([0, 0, groups, -1])], tag="groups")
    if sigmoid:
        best = b.add_outputs(n.name, "TopK", [per_group, b.ints([2])], 2, tag="best_two",
                             axis=-1)[0]
        group_score = b.add(n.name, "ReduceSum", [best, b.ints([-1])], tag="group_score",
                            keepdims=0)
    else:
        group_score = b.add(n.name, "ReduceMax", [per_group], tag="group_score", axes=[-1],
                            keepdims=0) if b.opset < 18 else b.add(
            n.name, "ReduceMax", [per_group, b.ints([-1])], tag="group_score", keepdims=0)
    kept = b.add_outputs(n.name, "TopK", [group_score, b.ints([top_groups])], 2,
                         tag="top_groups", axis=-1)[1]  # (B, L, top_groups)
    zero = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
    none = b.add(n.name, "ConstantOfShape", [b.add(n.name, "Shape", [group_score],
                                                   tag="group_shape")], tag="no_group",
                 value=zero)
    ones = b.add(n.name, "Expand", [b.const(n.name, "one", 1.0, "float32"),
                                    b.add(n.name, "Shape", [kept], tag="kept_shape")],
                 tag="ones")
    keep = b.add(n.name, "ScatterElements", [none, kept, ones], tag="keep", axis=-1)
    keep = b.add(n.name, "Cast", [b.add(n.name, "Unsqueeze", [keep, b.ints([-1])],
                                        tag="keep_e")], tag="keep_bool",
                 to=TensorProto.BOOL)  # (B, L, G, 1)
    fill = b.const(n.name, "left_out", float("-inf") if sigmoid else 0.0, "float32")
    limited = b.add(n.name, "Where", [keep, per_group, fill], tag="limited")
    return b.add(n.name, "Reshape", [limited, b.ints([0, 0, -1])], tag="limited_experts")


def _experts(b: Builder, n: Node) -> str:
    x, weights, *params = n.inputs  # (B, L, d), (B, L, E), [gate,] up (E, H, d), down (E, d, H)
    *gate, up, down = params
    xe = b.add(n.name, "Unsqueeze", [x, b.ints([1])], tag="x_per_expert")  # (B, 1, L, d)

    def project(w: str, tag: str) -> str:  # (B, 1, L, d) @ (E, d, H) -> (B, E, L, H)
        wt = b.add(n.name, "Transpose", [w], tag=f"{tag}_t", perm=[0, 2, 1])
        return b.add(n.name, "MatMul", [xe, wt], tag=tag)

    if gate:
        h = b.add(n.name, "Mul", [_activation(b, n.name, project(gate[0], "gate"),
                                              n.attrs["activation"]), project(up, "up")],
                  tag="gated")
    else:
        h = _activation(b, n.name, project(up, "up"), n.attrs["activation"])  # (B, E, L, H)
    down_t = b.add(n.name, "Transpose", [down], tag="down_t", perm=[0, 2, 1])  # (E, H, d)
    y = b.add(n.name, "MatMul", [h, down_t], tag="down")  # (B, E, L, d)
    w = b.add(n.name, "Transpose", [weights], tag="weights_t", perm=[0, 2, 1])  # (B, E, L)
    w = b.add(n.name, "Unsqueeze", [w, b.ints([3])], tag="weights")  # (B, E, L, 1)
    # Outside each token's top k the weight is 0: select 0 there rather than multiply, so an
    # unrouted expert whose output overflows (inf, NaN) cannot make 0 x inf = NaN of the sum
    # (the PyTorch back end never runs it on that token).
    zero = b.const(n.name, "zero", 0.0)
    unrouted = b.add(n.name, "Equal", [w, zero], tag="unrouted")  # (B, E, L, 1)
    weighted = b.add(n.name, "Mul", [y, w], tag="weighted")
    y = b.add(n.name, "Where", [unrouted, zero, weighted], tag="routed_only")
    return b.add(n.name, "ReduceSum", [y, b.ints([1])], n.name, keepdims=0)  # (B, L, d)


def _sigmoid_gate(b: Builder, n: Node) -> str:
    gate, y = n.inputs  # (B, L, 1), (B, L, d)
    return b.add(n.name, "Mul", [b.add(n.name, "Sigmoid", [gate]), y], n.name)


MOE_EMITTERS: dict[str, Callable[[Builder, Node], str]] = {
    "route": _route,
    "experts": _experts,
    "sigmoid_gate": _sigmoid_gate,
}
