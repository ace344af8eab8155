"""The ONNX lowering of each op: ``ONNX_OPS`` maps every op of ``tfgraph.ops.OPS`` to an emitter.

An emitter receives the builder (``tfgraph.exporters.onnx_builder``) and the IR node and appends
ONNX nodes; its last node writes the tensor named after the IR node, so every IR value keeps
its name (and a value_info with its symbolic shape) in the model. ONNX node names are
``"{ir node}/{OpType}"`` ("decoder.layers.3.self_attn.q/MatMul").

Two lowerings share the table:
- ``opset >= 23`` uses the fused standard ops ONNX now has: ``Attention`` (causal, GQA),
  ``RMSNormalization``, ``RotaryEmbedding`` (rotate-half), ``Gelu`` (opset 20) and
  ``LayerNormalization`` (opset 17). Hard attention has no fused form: MatMul + ``Hardmax``.
- ``opset = 17`` decomposes attention, RMS norm, rotary positions and GELU into MatMul,
  Softmax, ReduceMean, Erf, Tanh and friends, for older runtimes.

Constants (sinusoid frequencies, scales, masks) are ``Constant`` nodes, never initializers, so
the initializers are exactly the parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.exporters.onnx_builder import Builder
from tfgraph.ir import Node
from tfgraph.ops import OPS, sinusoid_frequencies

MIN_OPSET, MAX_OPSET = 17, 23
# Fused ops exist from these opsets on; below, the emitters decompose them.
ATTENTION_OPSET = RMSNORM_OPSET = ROPE_OPSET = 23
GELU_OPSET = 20


def check_opset(opset: int) -> int:
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise TfgraphError(f"opset {opset} is not supported: choose {MIN_OPSET}..{MAX_OPSET} "
                           f"({MAX_OPSET} uses the fused Attention/RMSNormalization/"
                           f"RotaryEmbedding ops, {MIN_OPSET} decomposes them)")
    return opset



Emitter = Callable[[Builder, Node], str]


def _embedding(b: Builder, n: Node) -> str:
    table, ids = n.inputs  # (V, d), (B, L)
    return b.add(n.name, "Gather", [table, ids], n.name, axis=0)  # (B, L, d)


def _scale(b: Builder, n: Node) -> str:
    factor = b.const(n.name, "factor", n.attrs["factor"])
    return b.add(n.name, "Mul", [n.inputs[0], factor], n.name)


def _seq_sym(b: Builder, n: Node) -> Any:
    return b.graph.node(n.inputs[0]).type.shape[1]


def _positions_sinusoidal(b: Builder, n: Node) -> str:
    # PE[pos, 2i] = sin(pos * f_i), PE[pos, 2i+1] = cos(pos * f_i): interleave sin and cos.
    x = n.inputs[0]  # (B, L, d)
    d = int(b.graph.node(x).type.shape[-1])
    freqs = np.array([sinusoid_frequencies(d)], np.float32)  # (1, ceil(d/2))
    f = b.const(n.name, "freqs", freqs, "float32")
    angles = b.add(n.name, "Mul", [b.positions(_seq_sym(b, n)), f])  # (L, d/2)
    sin = b.add(n.name, "Unsqueeze", [b.add(n.name, "Sin", [angles]), b.ints([2])], tag="sin")
    cos = b.add(n.name, "Unsqueeze", [b.add(n.name, "Cos", [angles]), b.ints([2])], tag="cos")
    pe = b.add(n.name, "Concat", [sin, cos], axis=2)  # (L, d/2, 2)
    pe = b.add(n.name, "Reshape", [pe, b.ints([0, -1])])  # (L, 2 * ceil(d/2))
    if d % 2:
        pe = b.add(n.name, "Slice", [pe, b.ints([0]), b.ints([d]), b.ints([1])])  # (L, d)
    if b.dtype != "float32":
        pe = b.cast(n.name, pe, b.dtype)
    return b.add(n.name, "Add", [x, pe], n.name)  # (B, L, d)


def _positions_learned(b: Builder, n: Node) -> str:
    x, table = n.inputs  # (B, L, d), (max_len, d)
    max_len = int(b.graph.node(table).type.shape[0])
    length = b.add(n.name, "Shape", [x], start=1, end=2)  # (1,) = [L]
    rows = b.add(n.name, "Slice", [table, b.ints([0]), length, b.ints([0])])  # (min(L, max_len), d)
    # ONNX has no assertion op. Reshaping the rows to exactly (L, d) makes a sequence longer
    # than the table an error instead of a broadcast (with max_len 1, Slice gives one row
    # that Add would silently add to every position), and onnxruntime's error message names
    # the failing node, so the node's name says what is wrong.
    rows = b.add(n.name, "Reshape", [rows, b.add(n.name, "Shape", [x], tag="L_d", start=1)],
                 tag=f"Reshape (sequence length must be <= max_len {max_len})")  # (L, d)
    return b.add(n.name, "Add", [x, rows], n.name)


def _rope(b: Builder, n: Node) -> str:
    x = n.inputs[0]  # (B, L, h*hd)
    h, hd, theta = n.attrs["heads"], n.attrs["head_dim"], float(n.attrs["theta"])
    sym = _seq_sym(b, n)
    cos, sin = b.rope_tables(sym, hd, theta)  # (L, hd/2) each
    if b.opset >= ROPE_OPSET:
        return b.add(n.name, "RotaryEmbedding", [x, cos, sin, b.position_ids(sym)], n.name,
                     num_heads=h, interleaved=0)
    # rotate-half by hand: x * cos + concat(-x2, x1) * sin on (B, L, h, hd)
    half = hd // 2
    cos2 = b.add(n.name, "Concat", [cos, cos], tag="cos", axis=1)  # (L, hd)
    sin2 = b.add(n.name, "Concat", [sin, sin], tag="sin", axis=1)
    cos2 = b.add(n.name, "Unsqueeze", [cos2, b.ints([1])], tag="cos_h")  # (L, 1, hd)
    sin2 = b.add(n.name, "Unsqueeze", [sin2, b.ints([1])], tag="sin_h")
    x4 = b.add(n.name, "Reshape", [x, b.ints([0, 0, h, hd])])  # (B, L, h, hd)
    x1 = b.add(n.name, "Slice", [x4, b.ints([0]), b.ints([half]), b.ints([3])], tag="x1")
    x2 = b.add(n.name, "Slice", [x4, b.ints([half]), b.ints([hd]), b.ints([3])], tag="x2")
    rot = b.add(n.name, "Concat", [b.add(n.name, "Neg", [x2]), x1], tag="rotate_half", axis=3)
    y = b.add(n.name, "Add", [b.add(n.name, "Mul", [x4, cos2], tag="x_cos"),
                              b.add(n.name, "Mul", [rot, sin2], tag="rot_sin")])
    return b.add(n.name, "Reshape", [y, b.ints([0, 0, h * hd])], n.name, tag="merge_heads")


def _linear(b: Builder, n: Node) -> str:
    x, w = n.inputs[0], n.inputs[1]  # (.., in), [out, in]
    wt = b.add(n.name, "Transpose", [w], perm=[1, 0])  # [in, out]; constant-folded by ORT
    if len(n.inputs) == 2:
        return b.add(n.name, "MatMul", [x, wt], n.name)
    y = b.add(n.name, "MatMul", [x, wt])
    return b.add(n.name, "Add", [y, n.inputs[2]], n.name)  # + bias


def _attention(b: Builder, n: Node) -> str:
    q, k, v = n.inputs  # (B, Tq, h*hd), (B, Tk, kv*hd), (B, Tk, kv*hd)
    h, kv, hd = n.attrs["heads"], n.attrs["kv_heads"], n.attrs["head_dim"]
    scale = 1.0 / math.sqrt(hd)
    if n.attrs["normalize"] == "softmax" and b.opset >= ATTENTION_OPSET:
        return b.add(n.name, "Attention", [q, k, v], n.name, q_num_heads=h, kv_num_heads=kv,
                     is_causal=int(n.attrs["causal"]), scale=scale)
    # Explicit form. Query heads are grouped under their kv head (head j reads kv head
    # j // g), which broadcasting over a size-1 group axis gives without copying k or v.
    g = h // kv
    q5 = b.add(n.name, "Reshape", [q, b.ints([0, 0, kv, g, hd])], tag="split_q")
    q5 = b.add(n.name, "Transpose", [q5], tag="q_heads", perm=[0, 2, 3, 1, 4])  # (B,kv,g,Tq,hd)
    k5 = b.add(n.name, "Reshape", [k, b.ints([0, 0, kv, 1, hd])], tag="split_k")
    kt = b.add(n.name, "Transpose", [k5], tag="k_heads_t", perm=[0, 2, 3, 4, 1])  # (B,kv,1,hd,Tk)
    v5 = b.add(n.name, "Reshape", [v, b.ints([0, 0, kv, 1, hd])], tag="split_v")
    v5 = b.add(n.name, "Transpose", [v5], tag="v_heads", perm=[0, 2, 3, 1, 4])  # (B,kv,1,Tk,hd)
    scores = b.add(n.name, "MatMul", [q5, kt], tag="scores")  # (B, kv, g, Tq, Tk)
    scores = b.add(n.name, "Mul", [scores, b.const(n.name, "scale", scale)], tag="scaled")
    if n.attrs["causal"]:
        mask = b.causal_mask(_seq_sym(b, n))  # (Tq, Tk) bool
        neg = b.const(n.name, "neg_inf", -np.inf)
        scores = b.add(n.name, "Where", [mask, scores, neg], tag="causal")
    normalize = "Hardmax" if n.attrs["normalize"] == "hardmax" else "Softmax"
    weights = b.add(n.name, normalize, [scores], axis=-1)  # (B, kv, g, Tq, Tk)
    out = b.add(n.name, "MatMul", [weights, v5], tag="context")  # (B, kv, g, Tq, hd)
    out = b.add(n.name, "Transpose", [out], tag="merge", perm=[0, 3, 1, 2, 4])  # (B,Tq,kv,g,hd)
    return b.add(n.name, "Reshape", [out, b.ints([0, 0, h * hd])], n.name, tag="merge_heads")


def _layernorm(b: Builder, n: Node) -> str:
    return b.add(n.name, "LayerNormalization", list(n.inputs), n.name, axis=-1,
                 epsilon=float(n.attrs["eps"]))


def _to_f32(b: Builder, n: Node, x: str) -> str:
    """Norm statistics in float32 for 16-bit models, as the fused ops' stash_type does."""
    return x if b.dtype == "float32" else b.cast(n.name, x, "float32", tag="to_float32")


def _from_f32(b: Builder, n: Node, x: str) -> str:
    return x if b.dtype == "float32" else b.cast(n.name, x, b.dtype, tag="to_dtype")


def _rmsnorm(b: Builder, n: Node) -> str:
    x, gain = n.inputs
    eps = float(n.attrs["eps"])
    if b.opset >= RMSNORM_OPSET:
        return b.add(n.name, "RMSNormalization", [x, gain], n.name, axis=-1, epsilon=eps)
    xf = _to_f32(b, n, x)
    ms = b.reduce(n.name, "ReduceMean", b.add(n.name, "Mul", [xf, xf], tag="square"), [-1])
    ms = b.add(n.name, "Add", [ms, b.const(n.name, "eps", eps, "float32")], tag="add_eps")
    y = b.add(n.name, "Div", [xf, b.add(n.name, "Sqrt", [ms])])
    return b.add(n.name, "Mul", [_from_f32(b, n, y), gain], n.name, tag="gain")


def _scalenorm(b: Builder, n: Node) -> str:
    # g * x / sqrt(sum(x^2) + eps), one scalar g (shape (1,))
    x, gain = n.inputs
    xf = _to_f32(b, n, x)
    ss = b.reduce(n.name, "ReduceSum", b.add(n.name, "Mul", [xf, xf], tag="square"), [-1])
    ss = b.add(n.name, "Add", [ss, b.const(n.name, "eps", float(n.attrs["eps"]), "float32")],
               tag="add_eps")
    y = b.add(n.name, "Div", [xf, b.add(n.name, "Sqrt", [ss])])
    return b.add(n.name, "Mul", [_from_f32(b, n, y), gain], n.name, tag="gain")


def _gelu_common(b: Builder, n: Node, approximate: str) -> str:
    x = n.inputs[0]
    if b.opset >= GELU_OPSET:
        return b.add(n.name, "Gelu", [x], n.name, approximate=approximate)
    half = b.const(n.name, "half", 0.5)
    one = b.const(n.name, "one", 1.0)
    if approximate == "none":  # 0.5 x (1 + erf(x / sqrt 2))
        inner = b.add(n.name, "Erf", [b.add(n.name, "Mul", [x, b.const(
            n.name, "inv_sqrt2", 1 / math.sqrt(2))], tag="x_over_sqrt2")])
    else:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.add(n.name, "Mul", [b.add(n.name, "Mul", [x, x], tag="x2"), x], tag="x3")
        cube = b.add(n.name, "Mul", [cube, b.const(n.name, "c", 0.044715)], tag="c_x3")
        arg = b.add(n.name, "Mul", [b.add(n.name, "Add", [x, cube]),
                                    b.const(n.name, "k", math.sqrt(2 / math.pi))], tag="arg")
        inner = b.add(n.name, "Tanh", [arg])
    y = b.add(n.name, "Mul", [x, b.add(n.name, "Add", [inner, one], tag="one_plus")], tag="x_mul")
    return b.add(n.name, "Mul", [y, half], n.name, tag="half")


def _silu(b: Builder, n: Node) -> str:
    x = n.inputs[0]
    return b.add(n.name, "Mul", [x, b.add(n.name, "Sigmoid", [x])], n.name)


def _simple(op_type: str, **attrs: Any) -> Emitter:
    def emit(b: Builder, n: Node) -> str:
        return b.add(n.name, op_type, list(n.inputs), n.name, **attrs)

    return emit


ONNX_OPS: dict[str, Emitter] = {
    "embedding": _embedding,
    "scale": _scale,
    "positions_sinusoidal": _positions_sinusoidal,
    "positions_learned": _positions_learned,
    "rope": _rope,
    "linear": _linear,
    "attention": _attention,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "scalenorm": _scalenorm,
    "relu": _simple("Relu"),
    "gelu": lambda b, n: _gelu_common(b, n, "none"),
    "gelu_tanh": lambda b, n: _gelu_common(b, n, "tanh"),
    "silu": _silu,
    "mul": _simple("Mul"),
    "add": _simple("Add"),
    "dropout": _simple("Identity"),  # inference: dropout is the identity
    "softmax": _simple("Softmax", axis=-1),
}

_missing = sorted(set(OPS) - set(ONNX_OPS))
assert not _missing, f"ONNX back end has no lowering for ops {_missing}"
