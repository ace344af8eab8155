"""The ONNX lowering of each op: ``ONNX_OPS`` maps every op of ``tfgraph.graph.ops.OPS`` to an emitter.

An emitter receives the builder (``tfgraph.exporters.onnx.builder``) and the IR node and appends
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

import dataclasses
import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.exporters.onnx import cache as onnx_cache
from tfgraph.exporters.onnx.builder import Builder, make_initializer
from tfgraph.exporters.onnx.moe import MOE_EMITTERS
from tfgraph.exporters.onnx.rope import ROPE_OPSET, emit_rope  # noqa: F401 (re-exported)
from tfgraph.exporters.onnx.tensors import ELEM_TYPE
from tfgraph.graph.ir import Node
from tfgraph.graph.ops import OPS, sinusoid_frequencies

MIN_OPSET, MAX_OPSET = 17, 23
# Fused ops exist from these opsets on; below, the emitters decompose them.
ATTENTION_OPSET = RMSNORM_OPSET = 23  # ROPE_OPSET (also 23) lives with the rope emitter
GELU_OPSET = 20


def check_opset(opset: Any) -> int:
    """``opset`` as an int (a numpy integer too), or TfgraphError: not an integer, or not
    one of the opsets the emitters write."""
    if isinstance(opset, bool):
        raise TfgraphError(f"opset must be an integer, got a bool ({opset!r})")
    try:
        number = operator.index(opset)
    except TypeError:
        raise TfgraphError(f"opset must be an integer, got {type(opset).__name__} "
                           f"{opset!r:.40}") from None
    if not MIN_OPSET <= number <= MAX_OPSET:
        raise TfgraphError(f"opset {number} is not supported: choose {MIN_OPSET}..{MAX_OPSET} "
                           f"({MAX_OPSET} uses the fused Attention/RMSNormalization/"
                           f"RotaryEmbedding ops, {MIN_OPSET} decomposes them)")
    return number



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
    if len(n.inputs) == 2:  # each token's own position (KV-cache graph): (B, L, 1)
        pos = b.add(n.name, "Unsqueeze", [b.cast(n.name, n.inputs[1], "float32"),
                                          b.ints([-1])], tag="positions")
        keep = [0, 0]  # the leading axes a Reshape keeps: B, L
    else:
        pos, keep = b.positions(_seq_sym(b, n)), [0]  # (L, 1)
    angles = b.add(n.name, "Mul", [pos, f])  # (L, d/2) or (B, L, d/2)
    if n.attrs.get("layout") == "split":  # fairseq, Marian: ceil(d/2) sines, then the cosines
        cos_half = b.add(n.name, "Slice", [b.add(n.name, "Cos", [angles]), b.ints([0]),
                                           b.ints([d // 2]), b.ints([-1])], tag="cos_rows")
        pe = b.add(n.name, "Concat", [b.add(n.name, "Sin", [angles]), cos_half], axis=-1)
        if b.dtype != "float32":
            pe = b.cast(n.name, pe, b.dtype)
        return b.add(n.name, "Add", [x, pe], n.name)  # (B, L, d)
    sin = b.add(n.name, "Unsqueeze", [b.add(n.name, "Sin", [angles]), b.ints([-1])], tag="sin")
    cos = b.add(n.name, "Unsqueeze", [b.add(n.name, "Cos", [angles]), b.ints([-1])], tag="cos")
    pe = b.add(n.name, "Concat", [sin, cos], axis=-1)  # (.., d/2, 2)
    pe = b.add(n.name, "Reshape", [pe, b.ints(keep + [-1])])  # (.., 2 * ceil(d/2))
    if d % 2:
        pe = b.add(n.name, "Slice", [pe, b.ints([0]), b.ints([d]), b.ints([-1])])  # (.., d)
    if b.dtype != "float32":
        pe = b.cast(n.name, pe, b.dtype)
    return b.add(n.name, "Add", [x, pe], n.name)  # (B, L, d)


def _positions_learned(b: Builder, n: Node) -> str:
    x, table = n.inputs[:2]  # (B, L, d), (max_len, d)
    offset = int(n.attrs.get("offset", 0))  # OPT, BART: position p reads row p + 2
    if len(n.inputs) == 3:  # each token's own position (KV-cache graph)
        ids = n.inputs[2]
        if offset:
            ids = b.add(n.name, "Add", [ids, b.const(n.name, "offset", np.array(
                offset, np.int64), "int64")], tag="row")
        rows = b.add(n.name, "Gather", [table, ids], tag="rows", axis=0)  # (B, L, d)
        return b.add(n.name, "Add", [x, rows], n.name)
    max_len = int(b.graph.node(table).type.shape[0]) - offset
    length = b.add(n.name, "Shape", [x], start=1, end=2)  # (1,) = [L]
    end = length if not offset else b.add(n.name, "Add", [length, b.ints([offset])], tag="end")
    rows = b.add(n.name, "Slice", [table, b.ints([offset]), end, b.ints([0])])  # (<= L, d)
    # ONNX has no assertion op. Reshaping the rows to exactly (L, d) makes a sequence longer
    # than the table an error instead of a broadcast (with max_len 1, Slice gives one row
    # that Add would silently add to every position), and onnxruntime's error message names
    # the failing node, so the node's name says what is wrong.
    rows = b.add(n.name, "Reshape", [rows, b.add(n.name, "Shape", [x], tag="L_d", start=1)],
                 tag=f"Reshape (sequence length must be <= max_len {max_len})")  # (L, d)
    return b.add(n.name, "Add", [x, rows], n.name)


def _pad_position_ids(b: Builder, n: Node) -> str:
    # cumsum(ids != pad) * (ids != pad) - 1, as torch_functional.pad_position_ids (RoBERTa)
    ids = n.inputs[0]  # (B, L) int64
    pad = b.const(n.name, "pad", np.array(int(n.attrs["pad"]), np.int64), "int64")
    real = b.add(n.name, "Not", [b.add(n.name, "Equal", [ids, pad])])
    real = b.cast(n.name, real, "int64")  # (B, L) 1 for real tokens
    counted = b.add(n.name, "CumSum", [real, b.const(n.name, "axis", np.array(1, np.int64),
                                                     "int64")])
    kept = b.add(n.name, "Mul", [counted, real], tag="kept")
    return b.add(n.name, "Sub", [kept, b.const(n.name, "one", np.array(1, np.int64),
                                               "int64")], n.name)  # (B, L)


def _alibi(b: Builder, n: Node) -> str:
    # slope_h * (j - i) for key j and query i (the last L of the T keys), in float32, divided
    # when scaled, then cast to the model's dtype, as torch_functional.alibi_bias.
    x = n.inputs[0]  # (B, L, d)
    keys = n.inputs[1] if len(n.inputs) == 2 else x  # KV cache: the (B, T) mask's T
    if n.attrs.get("bfloat16"):
        return _alibi_bfloat16(b, n)
    t = b.add(n.name, "Squeeze", [b.add(n.name, "Shape", [keys], tag="keys", start=1, end=2),
                                  b.ints([0])], tag="T")
    length = b.add(n.name, "Squeeze", [b.add(n.name, "Shape", [x], tag="length", start=1,
                                             end=2), b.ints([0])], tag="L")
    one = b.const(n.name, "one", np.array(1, np.int64), "int64")
    zero = b.const(n.name, "zero", np.array(0, np.int64), "int64")
    j = b.add(n.name, "Range", [zero, t, one], tag="key_pos")  # (T,)
    first = b.add(n.name, "Sub", [t, length], tag="first_query")  # past length T - L
    i = b.add(n.name, "Unsqueeze", [b.add(n.name, "Range", [first, t, one], tag="query_pos"),
                                    b.ints([1])], tag="query_col")  # (L, 1)
    rel = b.cast(n.name, b.add(n.name, "Sub", [j, i], tag="distance"), "float32",
                 tag="distance_f")  # (L, T) j - i
    slopes = np.array(n.attrs["slopes"], np.float32)[:, None, None]  # (h, 1, 1)
    cast, scaled = b.dtype != "float32", bool(n.attrs.get("scaled"))
    bias = b.add(n.name, "Mul", [b.const(n.name, "slopes", slopes, "float32"), rel],
                 None if cast or scaled else n.name, tag="sloped")  # (h, L, T)
    bias = _alibi_scaled(b, n, bias, "float32", None if cast else n.name)
    if cast:
        return b.add(n.name, "Cast", [bias], n.name, to=ELEM_TYPE[b.dtype])  # (h, L, T)
    return bias


def _alibi_scaled(b: Builder, n: Node, bias: str, dtype: str | None = None,
                  output: str | None = None) -> str:
    """Divided by sqrt(head_dim) when attrs['scaled'] (Falcon-RW), as torch_functional's
    alibi_bias; ``dtype``: the bias's (default the model's); ``output``: the Div's name."""
    if not n.attrs.get("scaled"):
        return bias
    root = b.const(n.name, "sqrt_head_dim", math.sqrt(int(n.attrs["head_dim"])), dtype)
    return b.add(n.name, "Div", [bias, root], output, tag="scaled")


def _bfloat16_rounded(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even, as torch's .bfloat16()),
    kept as float32: the top 16 bits after adding half a unit of the 17th (finite values)."""
    bits = x.astype(np.float32).view(np.uint32)
    bits = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (bits & np.uint32(0xFFFF0000)).view(np.float32)


def _alibi_bfloat16(b: Builder, n: Node) -> str:
    # Falcon's bias, as torch_functional.alibi_bfloat16: bfloat16(bfloat16(slope_h) * p_j)
    # with p_j counted over the row's real tokens ((B, T) mask cumsum - 1, 0 on padding) in
    # a KV-cache graph, 0..L-1 otherwise. The slopes are rounded here (round to nearest even,
    # as torch's .bfloat16()); the product of a bfloat16 slope and an integer below 2^16 is
    # exact in float32, so one Cast to bfloat16 and back rounds it as torch's bfloat16 multiply.
    x = n.inputs[0]  # (B, L, d)
    rounded = _bfloat16_rounded(np.array(n.attrs["slopes"], np.float32))
    slopes = b.const(n.name, "slopes", rounded[None, :, None], "float32")  # (1, h, 1)
    one = b.const(n.name, "one", np.array(1, np.int64), "int64")
    if len(n.inputs) == 2:  # per row: (B, T) mask
        real = b.cast(n.name, n.inputs[1], "int64", tag="real")
        counted = b.add(n.name, "CumSum", [real, b.const(n.name, "axis", np.array(
            1, np.int64), "int64")], tag="counted")
        pos = b.add(n.name, "Mul", [b.add(n.name, "Sub", [counted, one], tag="from_zero"),
                                    real], tag="positions")  # (B, T)
    else:  # every row 0..L-1
        length = b.add(n.name, "Squeeze", [b.add(n.name, "Shape", [x], tag="keys", start=1,
                                                 end=2), b.ints([0])], tag="T")
        zero = b.const(n.name, "zero", np.array(0, np.int64), "int64")
        pos = b.add(n.name, "Unsqueeze", [b.add(n.name, "Range", [zero, length, one],
                                                tag="key_pos"), b.ints([0])], tag="positions")
    pos = b.add(n.name, "Unsqueeze", [b.cast(n.name, pos, "float32", tag="positions_f"),
                                      b.ints([1])], tag="head_axis")  # (B|1, 1, T)
    bias = b.add(n.name, "Mul", [slopes, pos], tag="sloped")  # (B|1, h, T), exact
    bias = b.cast(n.name, b.cast(n.name, bias, "bfloat16", tag="to_bfloat16"), b.dtype,
                  tag="from_bfloat16")
    bias = _alibi_scaled(b, n, b.add(n.name, "Unsqueeze", [bias, b.ints([2])],
                                     tag="row_axis"))  # (B|1, h, 1, T)
    length = b.add(n.name, "Shape", [x], tag="length", start=1, end=2)  # [L]
    if len(n.inputs) == 2:
        shape = b.add(n.name, "Concat", [b.ints([1, 1]), length, b.ints([1])], tag="rows",
                      axis=0)  # [1, 1, L, 1]
        return b.add(n.name, "Expand", [bias, shape], n.name)  # (B, h, L, T)
    shape = b.add(n.name, "Concat", [b.ints([1]), length, b.ints([1])], tag="rows", axis=0)
    squeezed = b.add(n.name, "Squeeze", [bias, b.ints([0])], tag="one_row")  # (h, 1, T)
    return b.add(n.name, "Expand", [squeezed, shape], n.name)  # (h, L, T)


def _relative_bias(b: Builder, n: Node) -> str:
    # T5's buckets, as torch_functional.relative_position_bias computes them, in int64 and
    # float32 (the same operations in the same order, so the same buckets).
    table = n.inputs[0]  # (buckets, h)
    buckets, max_distance = int(n.attrs["buckets"]), int(n.attrs["max_distance"])
    if len(n.inputs) == 3:  # KV cache: keys are the mask's T positions, queries the last L
        total = b.add(n.name, "Shape", [n.inputs[2]], tag="total", start=1, end=2)  # [T]
        length = b.add(n.name, "Shape", [n.inputs[1]], tag="length", start=1, end=2)  # [L]
        t = b.add(n.name, "Squeeze", [total, b.ints([0])], tag="T")
        first = b.add(n.name, "Squeeze", [b.add(n.name, "Sub", [total, length], tag="start"),
                                          b.ints([0])], tag="P")
        one = b.const(n.name, "one", np.array(1, np.int64), "int64")
        zero_s = b.const(n.name, "zero", np.array(0, np.int64), "int64")
        rows = b.add(n.name, "Unsqueeze", [b.add(n.name, "Range", [first, t, one],
                                                 tag="query_pos"), b.ints([1])], tag="queries")
        cols = b.add(n.name, "Unsqueeze", [b.add(n.name, "Range", [zero_s, t, one],
                                                 tag="key_pos"), b.ints([0])], tag="keys")
    else:
        r = b.arange(b.graph.node(n.inputs[1]).type.shape[1])  # (L,) of x (B, L, d)
        rows = b.add(n.name, "Unsqueeze", [r, b.ints([1])], tag="queries")  # (L, 1) i
        cols = b.add(n.name, "Unsqueeze", [r, b.ints([0])], tag="keys")  # (1, L) j
    rel = b.add(n.name, "Sub", [cols, rows], tag="distance")  # (L, L) j - i
    zero = b.ints([0])
    if n.attrs["bidirectional"]:
        buckets //= 2
        later = b.cast(n.name, b.add(n.name, "Greater", [rel, zero]), "int64", tag="later")
        base = b.add(n.name, "Mul", [later, b.ints([buckets])], tag="direction")
        dist = b.add(n.name, "Abs", [rel])
    else:
        base = None
        dist = b.add(n.name, "Max", [b.add(n.name, "Neg", [rel]), zero], tag="behind")
    exact = buckets // 2
    ratio = b.add(n.name, "Div", [b.cast(n.name, dist, "float32", tag="dist_f"),
                                  b.const(n.name, "exact", float(exact), "float32")])
    log = b.add(n.name, "Div", [b.add(n.name, "Log", [ratio]), b.const(
        n.name, "log_range", math.log(max_distance / exact), "float32")], tag="log_ratio")
    far = b.add(n.name, "Mul", [log, b.const(n.name, "spread", float(buckets - exact),
                                             "float32")], tag="spread_out")
    far = b.add(n.name, "Add", [b.ints([exact]), b.cast(n.name, far, "int64", tag="far_i")],
                tag="far")
    far = b.add(n.name, "Min", [far, b.ints([buckets - 1])], tag="far_capped")
    near = b.add(n.name, "Less", [dist, b.ints([exact])], tag="near")
    bucket = b.add(n.name, "Where", [near, dist, far], tag="bucket")
    if base is not None:
        bucket = b.add(n.name, "Add", [bucket, base], tag="bucket_dir")
    bias = b.add(n.name, "Gather", [table, bucket], axis=0)  # (L, L, h)
    return b.add(n.name, "Transpose", [bias], n.name, perm=[2, 0, 1])  # (h, L, L)


def _linear(b: Builder, n: Node) -> str:
    x, w = n.inputs[0], n.inputs[1]  # (.., in), [out, in]
    wt = b.add(n.name, "Transpose", [w], perm=[1, 0])  # [in, out]; constant-folded by ORT
    if len(n.inputs) == 2:
        return b.add(n.name, "MatMul", [x, wt], n.name)
    y = b.add(n.name, "MatMul", [x, wt])
    return b.add(n.name, "Add", [y, n.inputs[2]], n.name)  # + bias


def _attention(b: Builder, n: Node) -> str:
    q, k, v = n.inputs[:3]  # (B, Tq, h*hd), (B, Tk, kv*hd), (B, Tk, kv*hd)
    bias = n.inputs[3] if len(n.inputs) == 4 else None  # (h, Tq, Tk): T5's position bias
    h, kv, hd = n.attrs["heads"], n.attrs["kv_heads"], n.attrs["head_dim"]
    vd = n.attrs.get("v_head_dim", hd)  # latent attention's value heads are narrower
    scale = n.attrs.get("scale") or 1.0 / math.sqrt(hd)
    softcap, window = n.attrs.get("softcap"), n.attrs.get("window")
    # attrs['dropout'] (attention.dropout) is not read: the ONNX model is for inference,
    # where dropout is the identity (as the "dropout" op's Identity below)
    mask = b.window_mask(_seq_sym(b, n), int(window), bool(n.attrs["causal"])) \
        if window else None  # (Tq, Tk) bool
    if n.attrs["normalize"] == "softmax" and b.opset >= ATTENTION_OPSET and bias is None:
        # softcap is applied to the scaled scores before the mask (ONNX Attention, opset 23)
        capped: dict[str, Any] = {"softcap": float(softcap)} if softcap else {}
        return b.add(n.name, "Attention", [q, k, v] + ([mask] if mask else []), n.name,
                     q_num_heads=h, kv_num_heads=kv, scale=float(scale),
                     is_causal=int(n.attrs["causal"] and mask is None), **capped)
    # Explicit form. Query heads are grouped under their kv head (head j reads kv head
    # j // g), which broadcasting over a size-1 group axis gives without copying k or v.
    g = h // kv
    q5 = b.add(n.name, "Reshape", [q, b.ints([0, 0, kv, g, hd])], tag="split_q")
    q5 = b.add(n.name, "Transpose", [q5], tag="q_heads", perm=[0, 2, 3, 1, 4])  # (B,kv,g,Tq,hd)
    k5 = b.add(n.name, "Reshape", [k, b.ints([0, 0, kv, 1, hd])], tag="split_k")
    kt = b.add(n.name, "Transpose", [k5], tag="k_heads_t", perm=[0, 2, 3, 4, 1])  # (B,kv,1,hd,Tk)
    v5 = b.add(n.name, "Reshape", [v, b.ints([0, 0, kv, 1, vd])], tag="split_v")
    v5 = b.add(n.name, "Transpose", [v5], tag="v_heads", perm=[0, 2, 3, 1, 4])  # (B,kv,1,Tk,hd)
    scores = b.add(n.name, "MatMul", [q5, kt], tag="scores")  # (B, kv, g, Tq, Tk)
    scores = b.add(n.name, "Mul", [scores, b.const(n.name, "scale", scale)], tag="scaled")
    if softcap:  # before the mask (Gemma 2)
        scores = _softcap(b, n, scores, None, float(softcap))
    if bias is not None:  # (h, Tq, Tk) -> (kv, g, Tq, Tk), added before the mask
        split = b.add(n.name, "Concat", [b.ints([kv, g]), b.add(
            n.name, "Shape", [bias], tag="bias_shape", start=1)], tag="bias_heads", axis=0)
        scores = b.add(n.name, "Add", [scores, b.add(n.name, "Reshape", [bias, split],
                                                     tag="split_bias")], tag="biased")
    if n.attrs["causal"] or mask:  # a causal mask, a window or both
        mask = mask or b.causal_mask(_seq_sym(b, n))  # (Tq, Tk) bool
        neg = b.const(n.name, "neg_inf", -np.inf)
        scores = b.add(n.name, "Where", [mask, scores, neg], tag="causal")
    normalize = "Hardmax" if n.attrs["normalize"] == "hardmax" else "Softmax"
    weights = b.add(n.name, normalize, [scores], axis=-1)  # (B, kv, g, Tq, Tk)
    out = b.add(n.name, "MatMul", [weights, v5], tag="context")  # (B, kv, g, Tq, vd)
    out = b.add(n.name, "Transpose", [out], tag="merge", perm=[0, 3, 1, 2, 4])  # (B,Tq,kv,g,vd)
    return b.add(n.name, "Reshape", [out, b.ints([0, 0, h * vd])], n.name, tag="merge_heads")


def _head_slice(b: Builder, n: Node) -> str:
    """Channels start .. start + take of each group: (.., g*w) -> (.., g*take)."""
    a = n.attrs
    groups, start, take = int(a["groups"]), int(a["start"]), int(a["take"])
    x = n.inputs[0]
    if groups == 1:
        return b.add(n.name, "Slice", [x, b.ints([start]), b.ints([start + take]),
                                       b.ints([-1])], n.name)
    split = b.add(n.name, "Reshape", [x, b.ints([0, 0, groups, int(a["width"])])],
                  tag="split_heads")
    part = b.add(n.name, "Slice", [split, b.ints([start]), b.ints([start + take]),
                                   b.ints([3])], tag="channels")
    return b.add(n.name, "Reshape", [part, b.ints([0, 0, groups * take])], n.name,
                 tag="merge_heads")


def _head_concat(b: Builder, n: Node) -> str:
    """Per head a's channels then b's; a shared b (.., wb) is repeated for every head."""
    a_, b_ = n.inputs
    h, wa, wb = int(n.attrs["heads"]), int(n.attrs["a_width"]), int(n.attrs["b_width"])
    a4 = b.add(n.name, "Reshape", [a_, b.ints([0, 0, h, wa])], tag="split_a")
    if n.attrs.get("shared", False):
        b4 = b.add(n.name, "Unsqueeze", [b_, b.ints([2])], tag="shared_b")  # (B, L, 1, wb)
        shape = b.add(n.name, "Concat", [b.add(n.name, "Shape", [a4], tag="a_shape", end=3),
                                         b.ints([wb])], tag="b_shape", axis=0)
        b4 = b.add(n.name, "Expand", [b4, shape], tag="every_head")  # (B, L, h, wb)
    else:
        b4 = b.add(n.name, "Reshape", [b_, b.ints([0, 0, h, wb])], tag="split_b")
    both = b.add(n.name, "Concat", [a4, b4], tag="per_head", axis=3)  # (B, L, h, wa + wb)
    return b.add(n.name, "Reshape", [both, b.ints([0, 0, h * (wa + wb)])], n.name,
                 tag="merge_heads")


def _attention_cached(b: Builder, n: Node) -> str:
    """A KV-cache graph's attention: onnxruntime's fused GroupQueryAttention when the model
    is built with it (exporters/onnx/fused_attention.py), else written out (cache.py)."""
    if b.fused is not None:
        from tfgraph.exporters.onnx.fused_attention import emit_fused

        return emit_fused(b, n, b.fused)
    return onnx_cache.attention_cached(b, n)


def _softcap(b: Builder, n: Node, x: str, output: str | None, cap: float | None = None) -> str:
    """cap * tanh(x / cap), with cap the node's attrs['cap'] unless given."""
    c = b.const(n.name, "cap", float(n.attrs["cap"] if cap is None else cap))
    capped = b.add(n.name, "Tanh", [b.add(n.name, "Div", [x, c], tag="over_cap")])
    return b.add(n.name, "Mul", [capped, c], output, tag="capped")


def _layernorm(b: Builder, n: Node) -> str:
    ins = list(n.inputs)
    if len(ins) == 1:  # no parameters (OLMo 1): LayerNormalization needs a Scale, ones
        width = b.add(n.name, "Shape", [ins[0]], tag="width", start=-1)
        if b.dtype == "bfloat16" and b.opset < 20:  # ConstantOfShape: bfloat16 from opset 20
            ins.append(b.add(n.name, "Expand", [b.const(n.name, "one", 1.0), width],
                             tag="ones"))
        else:
            one = make_initializer("value", np.ones(1, np.float32), b.dtype)
            ins.append(b.add(n.name, "ConstantOfShape", [width], tag="ones", value=one))
    return b.add(n.name, "LayerNormalization", ins, n.name, axis=-1,
                 epsilon=float(n.attrs["eps"]))


def _clip(b: Builder, n: Node) -> str:
    # Clip's bounds are inputs of the tensor's own type (opset >= 11)
    bound = float(n.attrs["bound"])
    lo, hi = (b.const(n.name, tag, v, b.dtype) for tag, v in (("low", -bound), ("high", bound)))
    return b.add(n.name, "Clip", [n.inputs[0], lo, hi], n.name)


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


def _relu2(b: Builder, n: Node) -> str:
    relu = b.add(n.name, "Relu", [n.inputs[0]])
    return b.add(n.name, "Mul", [relu, relu], n.name)


def _simple(op_type: str, **attrs: Any) -> Emitter:
    def emit(b: Builder, n: Node) -> str:
        return b.add(n.name, op_type, list(n.inputs), n.name, **attrs)

    return emit


def _per_head(norm: Emitter) -> Emitter:
    """A norm with attrs['heads'] (per-head qk-norm): the same emitter on x split into
    (B, L, heads, hd), merged back into the node's output."""
    def emit(b: Builder, n: Node) -> str:
        if "heads" not in n.attrs:
            return norm(b, n)
        h = int(n.attrs["heads"])
        split = b.add(n.name, "Reshape", [n.inputs[0], b.ints([0, 0, h, -1])], tag="split_heads")
        inner = dataclasses.replace(n, name=f"{n.name}/per_head",
                                    inputs=(split, *n.inputs[1:]))
        y = norm(b, inner)  # (B, L, heads, hd)
        return b.add(n.name, "Reshape", [y, b.ints([0, 0, -1])], n.name, tag="merge_heads")
    return emit


def _cross_entropy(b: Builder, n: Node) -> str:
    """The training loss (tfgraph.graph.ops_loss): SoftmaxCrossEntropyLoss (opset 12) over the
    logits upcast to float32 with the classes second, (B, V, L), mean over the tokens."""
    logits, labels = n.inputs
    if b.graph.node(logits).type.dtype != "float32":
        logits = b.cast(n.name, logits, "float32", tag="upcast")
    scores = b.add(n.name, "Transpose", [logits], tag="classes_second", perm=[0, 2, 1])
    return b.add(n.name, "SoftmaxCrossEntropyLoss", [scores, labels], n.name, reduction="mean")


def _gain(b: Builder, n: Node) -> str:
    """The gain norm ``n`` multiplies by: its parameter, or with attrs['unit_offset'] (Gemma)
    1 + the parameter, added in the graph (a Constant and an Add), so the initializer stays
    the checkpoint's gain."""
    if not n.attrs.get("unit_offset"):
        return n.inputs[1]
    return b.add(n.name, "Add", [n.inputs[1], b.const(n.name, "one", 1.0)], tag="one_plus")


def _add(b: Builder, n: Node) -> str:
    """Add; in the fused-attention model a residual sum and the RMS norm of it, where exact,
    as one SkipSimplifiedLayerNormalization written here (exporters/onnx/skip_norm.py), which
    writes the norm's tensor and the sum (when anything else reads it) under their names."""
    pair = b.fused.skip_norms.get(n.name) if b.fused is not None else None
    if pair is None:
        return b.add(n.name, "Add", list(n.inputs), n.name)
    from tfgraph.exporters.onnx.skip_norm import emit

    emit(b, pair, _gain(b, pair.norm))
    return n.name


ONNX_OPS: dict[str, Emitter] = {
    "cross_entropy": _cross_entropy,
    "embedding": _embedding,
    "scale": _scale,
    "positions_sinusoidal": _positions_sinusoidal,
    "positions_learned": _positions_learned,
    "pad_position_ids": _pad_position_ids,
    "rope": emit_rope,
    "linear": _linear,
    "attention": _attention,
    "kv_concat": onnx_cache.kv_concat,
    "head_slice": _head_slice,
    "head_concat": _head_concat,
    "cache_rows": lambda b, n: b.add(n.name, "Squeeze", [n.inputs[0], b.ints([1])], n.name),
    "attention_cached": _attention_cached,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "scalenorm": _scalenorm,
    "relu": _simple("Relu"),
    "relu2": _relu2,
    "gelu": lambda b, n: _gelu_common(b, n, "none"),
    "gelu_tanh": lambda b, n: _gelu_common(b, n, "tanh"),
    "silu": _silu,
    "mul": _simple("Mul"),
    "add": _add,
    "dropout": _simple("Identity"),  # inference: dropout is the identity
    "softmax": _simple("Softmax", axis=-1),
    "softcap": lambda b, n: _softcap(b, n, n.inputs[0], n.name),
    "clip": _clip,
    "alibi": _alibi,
    "relative_bias": _relative_bias,
}

def _unit_offset(norm: Emitter) -> Emitter:
    """A norm with attrs['unit_offset'] (Gemma) multiplies by (1 + gain) (:func:`_gain`)."""
    def emit(b: Builder, n: Node) -> str:
        if not n.attrs.get("unit_offset"):
            return norm(b, n)
        gain = _gain(b, n)
        return norm(b, dataclasses.replace(n, inputs=(n.inputs[0], gain, *n.inputs[2:])))
    return emit


def _skip_folded(norm: Emitter) -> Emitter:
    """A norm written with the add before it (:func:`_add`) emits nothing of its own."""
    def emit(b: Builder, n: Node) -> str:
        if b.fused is not None and n.name in b.fused.folded_norms:
            return n.name
        return norm(b, n)
    return emit


for _op in ("layernorm", "rmsnorm", "scalenorm"):
    ONNX_OPS[_op] = _per_head(_unit_offset(ONNX_OPS[_op]))
ONNX_OPS["rmsnorm"] = _skip_folded(ONNX_OPS["rmsnorm"])

ONNX_OPS.update(MOE_EMITTERS)  # route, experts, sigmoid_gate (exporters/onnx/moe.py)

_missing = sorted(set(OPS) - set(ONNX_OPS))
assert not _missing, f"ONNX back end has no lowering for ops {_missing}"
