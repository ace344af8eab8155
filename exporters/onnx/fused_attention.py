"""A decoder's KV-cache attention as onnxruntime's fused ``GroupQueryAttention`` kernel.

``GroupQueryAttention`` (domain ``com.microsoft``, onnxruntime's contrib operators; the
schema onnxruntime 1.31 registers) is the attention onnxruntime-genai's own decoders use: one
node takes this step's query, key and value (B, S, heads*hd), the past keys/values in BNSH
(B, kv_heads, past, hd), ``seqlens_k`` (int32 (B,): each row's total length - 1) and
``total_sequence_length`` (int32, the batch's longest), rotates q and k itself
(``do_rotary`` with ``cos_cache``/``sin_cache`` (positions, rd/2)), writes the present
keys/values and attends causally, with ``local_window_size``, ``softcap`` and ``scale``. It
replaces, per layer, the written-out attention (exporters/onnx/cache.py: MatMul, Where,
Softmax, Transpose, Reshape ...), the two ``kv_concat`` and, where its rotation is exact, the
two ``rope`` ops. :func:`refusal` decides whether it is exact for a graph; where it is not,
the written-out form stays (``write_onnx(..., fused_attention=True)`` falls back).

What the kernel computes, from its CPU implementation (onnxruntime
contrib_ops/cpu/bert/gqa_attention_base.h, group_query_attention_helper.h), and what that
means for tfgraph's graphs:

- Rows are RIGHT-padded: row b's keys are cache positions 0..seqlens_k[b] and nothing else
  ("all sequence in past kv are right-padded"); a first prompt (sequence_length ==
  total_sequence_length) attends causally from position 0; later calls take one token per
  row (several only at batch 1), written at position seqlens_k[b]. So the fused model reads
  ``attention_mask`` as a count: ``seqlens_k`` = its row sums - 1 (the convention of
  onnxruntime-genai's builder), and a mask must be ones then zeros per row. Left padding is
  not exact here; tfgraph's generation loop feeds such a model right-padded rows
  (exporters/generation/fused_stepper.py).
- Its own rotation turns each token by its index in its row (0.. at a first prompt,
  seqlens_k at a step): the position ids of right-padded rows. ``rope`` is folded into the
  kernel when q's and k's use one table and the kernel's table limits hold (head_dim a
  multiple of 16, rd/2 a multiple of 8); otherwise RotaryEmbedding (or its decomposition)
  stays in front of the kernel, reading ``position_ids``. ``position_ids`` leaves the
  model's inputs when nothing reads it any more (learned or sinusoidal tables still do).
- ``local_window_size`` W: onnxruntime 1.31's CPU kernel reads the last W keys, the query's
  own included (measured: tests/test_fused_attention.py, against the written-out window),
  which is tfgraph's ``window`` and Hugging Face's ``sliding_window``; so W = window. (Older
  sources of the kernel read W + 1; the GPU check in benchmarks/gpu.py compares the CUDA
  kernel's logits with the written-out model's.) A window of 1 is refused: W = 0 would mean
  no window.
- ``softcap`` is cap * tanh(score / cap) on the scaled scores before the softmax, as
  tfgraph's (Gemma 2); ``scale`` is given explicitly.
- head_dim must be a multiple of 8; causal softmax attention only (no hard attention, no
  additive per-head bias: ALiBi and T5's relative bias keep the written-out form).
- Packed QKV: ``query`` may be (B, S, (heads + 2 kv_heads) * hd) with ``key``/``value`` left
  out. Where q, k and v are projections of one input read by nothing else (no qk-norm
  between, the rotation in the kernel), they become one MatMul over the three weights
  stacked in the graph (the initializers stay the parameters).

In the same model each residual ``add`` and the RMS norm of its sum (the next layer's
pre-norm, the final norm) become one ``SkipSimplifiedLayerNormalization`` where that is exact
(exporters/onnx/skip_norm.py; :func:`plan` lists the pairs, the ``add`` emitter writes them).

``present.{i}.key|value`` are the kernel's outputs: (B, kv, max(total, past buffer), hd).
When the past and present are one buffer (the same OrtValue bound as both), the kernel writes
this step's keys into it in place ("past_present_share_buffer"): a fixed-size cache per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import TensorProto

from tfgraph.exporters.onnx import skip_norm
from tfgraph.exporters.onnx.builder import Builder
from tfgraph.exporters.onnx.skip_norm import SkipNorm
from tfgraph.graph.ir import Graph, Node

DOMAIN = "com.microsoft"
OP_TYPE = "GroupQueryAttention"
# ONNX metadata_props key saying how the model's attention_mask must be laid out.
PADDING_METADATA_KEY = "tfgraph.kv_cache_padding"


@dataclass
class FusedPlan:
    """Which IR nodes one fused kernel per layer absorbs: the ``kv_concat`` whose outputs it
    writes (``present.*``), the ``rope`` it applies itself (``rotary``: attention node ->
    its q and k rope nodes) and the q, k, v projections it takes as one packed QKV
    (``packed``: attention node -> its q, k, v ``linear`` nodes). ``absorbed`` are emitted
    by nothing else; ``dropped_inputs`` are graph inputs nothing reads any more
    (``position_ids`` when every rope is folded). ``skip_norms``: the residual adds written
    with the RMS norm of their sum as one SkipSimplifiedLayerNormalization
    (exporters/onnx/skip_norm.py), by the add's name; ``folded_norms`` those norms (their
    tensor is the fused node's); ``unwritten`` the sums nothing else reads (no tensor)."""

    rotary: dict[str, tuple[Node, Node]] = field(default_factory=dict)
    packed: dict[str, tuple[Node, Node, Node]] = field(default_factory=dict)
    absorbed: set[str] = field(default_factory=set)
    dropped_inputs: set[str] = field(default_factory=set)
    skip_norms: dict[str, SkipNorm] = field(default_factory=dict)
    folded_norms: set[str] = field(default_factory=set)
    unwritten: set[str] = field(default_factory=set)


# The attributes whose meaning the lowering below maps onto the kernel. An attention, rope
# or kv_concat node carrying any other (a feature added to the graph later: another value
# head size, attention sinks...) keeps the written-out form until it is mapped here.
ATTENTION_ATTRS = frozenset({"heads", "kv_heads", "head_dim", "causal", "normalize", "scale",
                             "softcap", "window", "self_read"})
ROPE_ATTRS = frozenset({"heads", "head_dim", "theta", "rotary_dim", "interleaved", "scaling",
                        "inv_freq", "scale"})
CONCAT_ATTRS = frozenset({"kv_heads", "head_dim"})


def refusal(graph: Graph) -> str | None:
    """Why ``GroupQueryAttention`` is not exact for ``graph`` (None: it is, for every
    attention node). One reason for the whole model: its padding convention is the
    model's, so either every layer is fused or none."""
    info = graph.info
    if info.kind != "cached" or info.part is not None or info.arch != "decoder-only":
        return "a decoder-only model's KV-cache graph only (build --kv-cache of a decoder)"
    nodes = [n for n in graph.ops() if n.op == "attention_cached"]
    if not nodes:
        return "the model has no attention"
    for n in nodes:
        a = n.attrs
        unknown = sorted(set(a) - ATTENTION_ATTRS)
        if unknown:
            return f"{n.name}: attributes {', '.join(unknown)} (not mapped onto the kernel)"
        if len(n.inputs) != 4:
            return f"{n.name}: an additive position bias (ALiBi, T5's relative bias)"
        if a["normalize"] != "softmax":
            return f"{n.name}: {a['normalize']} attention (the kernel is a softmax)"
        if not a["causal"] or not a.get("self_read", True):
            return f"{n.name}: not causal self-attention"
        hd = int(a["head_dim"])
        if hd % 8:
            return f"{n.name}: head_dim {hd} (the kernel needs a multiple of 8)"
        window = a.get("window")
        if window is not None and int(window) < 2:
            return f"{n.name}: window {window} (the kernel's smallest is 2 keys)"
        for operand in n.inputs[1:3]:
            src = graph.node(operand)
            if src.op != "kv_concat" or len(src.inputs) != 2 or set(src.attrs) - CONCAT_ATTRS:
                return f"{n.name}: keys/values not this layer's past + this step's"
    return None


def plan(graph: Graph) -> FusedPlan:
    """What the fused lowering absorbs; ``graph`` must pass :func:`refusal`."""
    out = FusedPlan()
    readers: dict[str, int] = {}
    for n in graph.ops():
        for i in n.inputs:
            readers[i] = readers.get(i, 0) + 1
    for n in (n for n in graph.ops() if n.op == "attention_cached"):
        k_concat, v_concat = graph.node(n.inputs[1]), graph.node(n.inputs[2])
        out.absorbed.update((k_concat.name, v_concat.name))
        q_rope, k_rope = graph.node(n.inputs[0]), graph.node(k_concat.inputs[1])
        folded = _foldable(q_rope, k_rope, readers)
        if folded:
            out.rotary[n.name] = (q_rope, k_rope)
            out.absorbed.update((q_rope.name, k_rope.name))
        # the projections read by the kernel: before the folded rotation, else q and k as
        # they come (no rope, or a rope that stays in front of the kernel: then no packing)
        q_proj = graph.node(q_rope.inputs[0]) if folded else q_rope
        k_proj = graph.node(k_rope.inputs[0]) if folded else k_rope
        v_proj = graph.node(v_concat.inputs[1])
        if _packable(q_proj, k_proj, v_proj, readers):
            out.packed[n.name] = (q_proj, k_proj, v_proj)
            out.absorbed.update((q_proj.name, k_proj.name, v_proj.name))
    if "position_ids" in graph.inputs and not any(
            "position_ids" in n.inputs for n in graph.ops() if n.name not in out.absorbed):
        out.dropped_inputs.add("position_ids")
    out.skip_norms = skip_norm.pairs(graph)
    out.folded_norms = {p.norm.name for p in out.skip_norms.values()}
    out.unwritten = {p.add.name for p in out.skip_norms.values() if not p.sum_read}
    return out


def _foldable(q: Node, k: Node, readers: dict[str, int]) -> bool:
    """Whether the kernel's own rotation equals these two rope nodes: the same table on q
    and k, read through position_ids (a KV-cache graph's), within the kernel's limits, and
    no other reader of the rotated values."""
    if q.op != "rope" or k.op != "rope" or len(q.inputs) != 2 or len(k.inputs) != 2:
        return False
    if (set(q.attrs) | set(k.attrs)) - ROPE_ATTRS:  # a rotation the kernel may not know
        return False
    if readers.get(q.name, 0) != 1 or readers.get(k.name, 0) != 1:
        return False
    same = ("theta", "rotary_dim", "interleaved", "inv_freq", "scale", "head_dim")
    if any(q.attrs.get(key) != k.attrs.get(key) for key in same):
        return False
    hd = int(q.attrs["head_dim"])
    rd = int(q.attrs.get("rotary_dim", hd))
    # group_query_attention_helper.h: head_size % 16 == 0, cos_cache's width (rd/2) a
    # multiple of 8 and at most head_size / 2
    return hd % 16 == 0 and (rd // 2) % 8 == 0 and rd <= hd and rd % 2 == 0


def _packable(q: Node, k: Node, v: Node, readers: dict[str, int]) -> bool:
    """Whether q, k and v are three projections of one input, each read only on its way to
    the kernel, with biases on all or none: then one MatMul over their stacked weights
    gives the kernel its packed QKV (B, S, (h + 2 kv) * hd)."""
    if any(p.op != "linear" or readers.get(p.name, 0) != 1 for p in (q, k, v)):
        return False
    return q.inputs[0] == k.inputs[0] == v.inputs[0] and \
        len(q.inputs) == len(k.inputs) == len(v.inputs)


def _packed_qkv(b: Builder, n: Node, q: Node, k: Node, v: Node) -> str:
    """x @ [Wq; Wk; Wv]^T (+ [bq; bk; bv]): the weights stay three initializers under their
    parameter names, stacked in the graph (onnxruntime folds the constant Concat and
    Transpose into one matrix when the session is created)."""
    scope = f"{n.name}.qkv"
    w = b.add(scope, "Concat", [q.inputs[1], k.inputs[1], v.inputs[1]], tag="stack_weights",
              axis=0)  # (h*hd + 2 kv*hd, d)
    wt = b.add(scope, "Transpose", [w], perm=[1, 0])
    y = b.add(scope, "MatMul", [q.inputs[0], wt])
    if len(q.inputs) == 3:
        bias = b.add(scope, "Concat", [q.inputs[2], k.inputs[2], v.inputs[2]],
                     tag="stack_biases", axis=0)
        y = b.add(scope, "Add", [y, bias])
    return y


def _lengths(b: Builder, mask: str) -> tuple[str, str]:
    """(seqlens_k int32 (B,), total_sequence_length int32 (1,)) from the (B, T) mask: each
    row's real tokens - 1, and T. Built once per model, not once per layer."""
    scope = "gqa_lengths"

    def seqlens() -> str:
        real = b.add(scope, "ReduceSum", [mask, b.ints([1])], tag="real_tokens", keepdims=0)
        last = b.add(scope, "Sub", [real, b.const(scope, "one", np.array(1, np.int64),
                                                  "int64")], tag="last_index")
        return b.add(scope, "Cast", [last], tag="seqlens_k", to=TensorProto.INT32)

    def total() -> str:
        width = b.add(scope, "Shape", [mask], tag="total_len", start=1, end=2)
        return b.add(scope, "Cast", [width], tag="total_sequence_length", to=TensorProto.INT32)

    return b.memo(("gqa_seqlens", mask), seqlens), b.memo(("gqa_total", mask), total)


def emit_fused(b: Builder, n: Node, fused: FusedPlan) -> str:
    """The ``attention_cached`` node ``n`` (and its kv_concat, and its rope when folded) as
    one GroupQueryAttention node: outputs the attention (B, S, h*hd) and present.{i}.*."""
    g = b.graph
    q, k_name, v_name, mask = n.inputs
    k_concat, v_concat = g.node(k_name), g.node(v_name)
    past_k, new_k = k_concat.inputs
    past_v, new_v = v_concat.inputs
    a = n.attrs
    h, kv, hd = int(a["heads"]), int(a["kv_heads"]), int(a["head_dim"])
    attrs: dict[str, Any] = {"num_heads": h, "kv_num_heads": kv,
                             "scale": float(a.get("scale") or 1.0 / np.sqrt(hd))}
    if a.get("softcap"):
        attrs["softcap"] = float(a["softcap"])
    if a.get("window"):
        attrs["local_window_size"] = int(a["window"])  # W keys read, its own included
    seqlens, total = _lengths(b, mask)
    extra: list[str] = []
    rotary = fused.rotary.get(n.name)
    if rotary is not None:
        q_rope, k_rope = rotary
        q, new_k = q_rope.inputs[0], k_rope.inputs[0]  # before rotation: the kernel turns them
        r = q_rope.attrs
        rd = int(r.get("rotary_dim", hd))
        inv_freq = r.get("inv_freq")
        sym = g.node(b.ids_for_mask).type.shape[1]  # every position of the mask
        cos, sin = b.rope_tables(sym, rd, float(r["theta"]),
                                 tuple(inv_freq) if inv_freq is not None else None,
                                 float(r.get("scale", 1.0)))  # (T, rd/2) each
        extra = [cos, sin]
        attrs.update(do_rotary=1, rotary_interleaved=int(bool(r.get("interleaved", False))))
    packed = fused.packed.get(n.name)
    if packed is not None:  # one packed QKV input; key and value left out
        q, new_k, new_v = _packed_qkv(b, n, *packed), "", ""
    b.add_node(n.name, OP_TYPE, [q, new_k, new_v, past_k, past_v, seqlens, total, *extra],
               [n.name, k_concat.name, v_concat.name], domain=DOMAIN, **attrs)
    return n.name
