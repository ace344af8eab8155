"""Op definitions of multi-head latent attention (README, ``attention.latent``; DeepSeek-V2,
arXiv:2405.04434 §2.1): the channel slices and concatenations that split a latent projection
into its parts and assemble each head's key from its own channels and the shared rotary key,
and the rows of a KV-cache graph's cached latent.

Registered into ``tfgraph.graph.ops.OPS`` when ``tfgraph.graph.ir`` imports this module. None
of them computes anything (copies and views): no FLOPs. Shapes: the last axis is ``groups``
slices of equal width (one per head, or one for the whole vector).

Under tensor parallelism (``TpRule`` ``per_head``; Megatron-LM's MultiLatentAttention and
DeepSeek-V3's inference code) the down-projections (q_a, kv_a: the latents and the shared
rotary key) are whole on every rank, the up-projections (q_b, kv_b) split by heads, so a slice
of a head-split tensor is each rank's heads' slices and the key assembly appends the whole
rotary key to each of the rank's heads.
"""

from __future__ import annotations

from typing import Any

import sympy

from tfgraph.graph.ops import SIZE, Attr, OpDef, TensorType, _check_last, _no_flops, register


def _nothing_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> list[Any]:
    return []  # a slice or a concatenation keeps nothing for its backward (shapes only)


def _slice_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x = ins[0]
    groups, width, start, take = (attrs[k] for k in ("groups", "width", "start", "take"))
    _check_last(x, groups * width, "head_slice input")
    if sympy.sympify(start + take - width).is_positive:
        raise ValueError(f"head_slice: channels {start}..{start}+{take} exceed width {width}")
    return TensorType((*x.shape[:-1], groups * take), x.dtype)


register(OpDef(
    "head_slice", (1, 1), _slice_infer, _no_flops, _nothing_saved,
    "Channels start .. start + take of each of the groups slices (width each) of the last "
    "axis: (.., groups*width) -> (.., groups*take). Latent attention splits its kv_a output "
    "into the latent and the rotary key (groups 1), each query head into its position-free "
    "and rotary channels, and kv_b's output into each head's key and value channels. A copy: "
    "no FLOPs.",
    attrs={"groups": Attr(SIZE, required=True), "width": Attr(SIZE, required=True),
           "start": Attr(SIZE, required=True), "take": Attr(SIZE, required=True)},
    tp="per_head", tp_refused_source="latent attention (down-projections whole on every "
    "rank, up-projections split by heads) runs under tfgraph.exporters.parallelize only",
))


def _concat_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    a, b = ins
    heads, wa, wb = attrs["heads"], attrs["a_width"], attrs["b_width"]
    _check_last(a, heads * wa, "head_concat first operand")
    if a.shape[:-1] != b.shape[:-1]:
        raise ValueError(f"head_concat: {a} and {b} differ before the last axis")
    if attrs.get("shared", False):
        _check_last(b, wb, "head_concat shared operand")
    else:
        _check_last(b, heads * wb, "head_concat second operand")
    return TensorType((*a.shape[:-1], heads * (wa + wb)), a.dtype)


register(OpDef(
    "head_concat", (2, 2), _concat_infer, _no_flops, _nothing_saved,
    "Per head, a's a_width channels then b's b_width: (.., heads*a_width), (.., heads*b_width) "
    "-> (.., heads*(a_width + b_width)); with attrs['shared'] b is one head of b_width that "
    "every head repeats (latent attention's decoupled rotary key). A copy: no FLOPs.",
    attrs={"heads": Attr(SIZE, required=True), "a_width": Attr(SIZE, required=True),
           "b_width": Attr(SIZE, required=True),
           "shared": Attr(bool, default=False, doc="b is one head shared by every head")},
    tp="per_head", tp_refused_source="latent attention (down-projections whole on every "
    "rank, up-projections split by heads) runs under tfgraph.exporters.parallelize only",
))


def _rows_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x = ins[0]
    if len(x.shape) != 4 or x.shape[1] != 1:
        raise ValueError(f"cache_rows takes a one-head cache (B, 1, T, w), not {x}")
    return TensorType((x.shape[0], x.shape[2], x.shape[3]), x.dtype)


register(OpDef(
    "cache_rows", (1, 1), _rows_infer, _no_flops, _nothing_saved,
    "A one-head cache (B, 1, T, w) as rows (B, T, w): latent attention's present latent "
    "and rotary keys, which every step expands again (as transformers' DeepSeek models "
    "do). A view: no FLOPs.",
    category="attention",
))
