"""The ONNX lowerings of a KV-cache graph's ops (``graph.info.kind == "cached"``).

The interface is the one Hugging Face optimum and onnxruntime-genai share (README, "KV
cache"): ``attention_mask`` (B, total_len) and ``position_ids`` (B, seq_len) in, each layer's
``past_key_values.{i}.key|value`` (B, kv_heads, past_len, head_dim) in and
``present.{i}.key|value`` (B, kv_heads, total_len, head_dim) out. Attention is written out
(MatMul, Where, Softmax) at every opset: queries are the last seq_len of total_len positions
and the mask combines padding, causality and windows per row, which the standard
``Attention`` op cannot take as one (it aligns causal masks differently with and without a
past, and onnxruntime's CPU and CUDA kernels disagree there).
"""

from __future__ import annotations

import math

import numpy as np

from tfgraph.exporters.onnx.builder import Builder
from tfgraph.graph.ir import Node


def kv_concat(b: Builder, n: Node) -> str:
    *past, new = n.inputs  # (B, kv, P, hd) when given, (B, S, kv*hd)
    kv, hd = int(n.attrs["kv_heads"]), int(n.attrs["head_dim"])
    heads = b.add(n.name, "Reshape", [new, b.ints([0, 0, kv, hd])], tag="split_heads")
    if not past:  # this sequence's alone: (B, kv, S, hd)
        return b.add(n.name, "Transpose", [heads], n.name, tag="heads", perm=[0, 2, 1, 3])
    heads = b.add(n.name, "Transpose", [heads], tag="heads", perm=[0, 2, 1, 3])  # (B,kv,S,hd)
    return b.add(n.name, "Concat", [past[0], heads], n.name, axis=2)  # (B, kv, P+S, hd)


def _read_mask(b: Builder, n: Node, mask: str) -> str:
    """(B, 1, 1, S, T) bool: which present key each query reads (padding, causality, window;
    its own key always, so a padding row stays finite). It depends on the mask input, the
    step's length and the node's causal, window and self_read only, so it is built once per
    model and kind of layer (local, global, cross), not once per layer: onnxruntime runs
    every node of a decoding step, and small ones dominate once the weights are read."""
    causal, window = bool(n.attrs["causal"]), n.attrs.get("window")
    own = bool(n.attrs.get("self_read", True))
    scope = f"{mask}.{'causal' if causal else 'full'}{f'_w{window}' if window else ''}" \
        f"{'' if own else '_cross'}"
    return b.memo(("read_mask", mask, causal, window, own),
                  lambda: _build_read_mask(b, scope, n, mask))


def _build_read_mask(b: Builder, scope: str, n: Node, mask: str) -> str:
    ids = "input_ids" if "input_ids" in b.graph.inputs else "src_ids"  # this step's tokens
    total = b.add(scope, "Shape", [mask], tag="total_len", start=1, end=2)  # [T]
    length = b.add(scope, "Shape", [ids], tag="seq_len", start=1, end=2)  # [S]
    zero, one = b.ints([0]), b.ints([1])
    t = b.add(scope, "Squeeze", [total, zero], tag="T")
    start = b.add(scope, "Squeeze", [b.add(scope, "Sub", [total, length], tag="past_len"),
                                      zero], tag="P")
    one_s = b.add(scope, "Squeeze", [one, zero], tag="one")
    zero_s = b.add(scope, "Squeeze", [zero, zero], tag="zero")
    i = b.add(scope, "Unsqueeze", [b.add(scope, "Range", [start, t, one_s], tag="query_pos"),
                                    one], tag="i")  # (S, 1)
    j = b.add(scope, "Unsqueeze", [b.add(scope, "Range", [zero_s, t, one_s], tag="key_pos"),
                                    zero], tag="j")  # (1, T)
    real = b.add(scope, "Not", [b.add(scope, "Equal", [mask, b.const(
        scope, "pad", np.array(0, np.int64), "int64")], tag="is_pad")], tag="real")  # (B, T)
    read = b.add(scope, "Unsqueeze", [real, b.ints([1, 2, 3])], tag="real5")  # (B,1,1,1,T)
    if n.attrs["causal"]:
        causal = b.add(scope, "LessOrEqual", [j, i], tag="causal")  # (S, T)
        window = n.attrs.get("window")
        if window:
            near = b.add(scope, "Less", [b.add(scope, "Sub", [i, j], tag="distance"), b.const(
                scope, "window", np.array(int(window), np.int64), "int64")], tag="in_window")
            causal = b.add(scope, "And", [causal, near], tag="causal_window")
        read = b.add(scope, "And", [read, causal], tag="read")  # (B, 1, 1, S, T)
    elif n.attrs.get("window"):  # an encoder's local layers: |i - j| < window both sides
        distance = b.add(scope, "Abs", [b.add(scope, "Sub", [i, j], tag="offset")],
                         tag="distance")  # (S, T)
        near = b.add(scope, "Less", [distance, b.const(
            scope, "window", np.array(int(n.attrs["window"]), np.int64), "int64")],
            tag="in_window")
        read = b.add(scope, "And", [read, near], tag="read")  # (B, 1, 1, S, T)
    if not n.attrs.get("self_read", True):  # cross-attention: another sequence's keys
        return read
    own = b.add(scope, "Equal", [j, i], tag="own")  # (S, T)
    return b.add(scope, "Or", [read, own], tag="read_own")


def attention_cached(b: Builder, n: Node) -> str:
    q, k, v, mask = n.inputs[:4]  # (B, S, h*hd), (B, kv, T, hd) x2, (B, T) int64
    bias = n.inputs[4] if len(n.inputs) == 5 else None  # (h, S, T) or (B, h, S, T)
    h, kv, hd = int(n.attrs["heads"]), int(n.attrs["kv_heads"]), int(n.attrs["head_dim"])
    vd = int(n.attrs.get("v_head_dim", hd))  # latent attention's value heads are narrower
    g = h // kv
    scale = n.attrs.get("scale") or 1.0 / math.sqrt(hd)
    # Query heads grouped under their kv head (head j reads kv head j // g): a size-1 group
    # axis on k and v broadcasts without copying them.
    q5 = b.add(n.name, "Reshape", [q, b.ints([0, 0, kv, g, hd])], tag="split_q")
    q5 = b.add(n.name, "Transpose", [q5], tag="q_heads", perm=[0, 2, 3, 1, 4])  # (B,kv,g,S,hd)
    k5 = b.add(n.name, "Unsqueeze", [k, b.ints([2])], tag="k_group")  # (B, kv, 1, T, hd)
    kt = b.add(n.name, "Transpose", [k5], tag="k_t", perm=[0, 1, 2, 4, 3])  # (B,kv,1,hd,T)
    v5 = b.add(n.name, "Unsqueeze", [v, b.ints([2])], tag="v_group")  # (B, kv, 1, T, hd)
    scores = b.add(n.name, "MatMul", [q5, kt], tag="scores")  # (B, kv, g, S, T)
    scores = b.add(n.name, "Mul", [scores, b.const(n.name, "scale", scale)], tag="scaled")
    softcap = n.attrs.get("softcap")
    if softcap:  # before the mask (Gemma 2)
        c = b.const(n.name, "cap", float(softcap))
        scores = b.add(n.name, "Mul", [b.add(n.name, "Tanh", [b.add(
            n.name, "Div", [scores, c], tag="over_cap")]), c], tag="capped")
    if bias is not None:  # (h, S, T) -> (kv, g, S, T), added before the mask; a per-row
        # (B, h, S, T) (Falcon's rounded ALiBi) -> (B, kv, g, S, T): its leading axes kept
        split = b.add(n.name, "Concat", [
            b.add(n.name, "Shape", [bias], tag="bias_rows", end=-3), b.ints([kv, g]),
            b.add(n.name, "Shape", [bias], tag="bias_shape", start=-2)], tag="bias_heads",
            axis=0)
        scores = b.add(n.name, "Add", [scores, b.add(n.name, "Reshape", [bias, split],
                                                     tag="split_bias")], tag="biased")
    read = _read_mask(b, n, mask)
    scores = b.add(n.name, "Where", [read, scores, b.const(n.name, "neg_inf", -np.inf)],
                   tag="masked")
    normalize = "Hardmax" if n.attrs["normalize"] == "hardmax" else "Softmax"
    weights = b.add(n.name, normalize, [scores], axis=-1)  # (B, kv, g, S, T)
    out = b.add(n.name, "MatMul", [weights, v5], tag="context")  # (B, kv, g, S, vd)
    out = b.add(n.name, "Transpose", [out], tag="merge", perm=[0, 3, 1, 2, 4])  # (B,S,kv,g,vd)
    return b.add(n.name, "Reshape", [out, b.ints([0, 0, h * vd])], n.name, tag="merge_heads")
