"""The ONNX lowering of the ``rope`` op: rotary positions on q or k (B, L, heads*hd).

Opset 23 has ``RotaryEmbedding``: rotate-half or ``interleaved`` pairs, and
``rotary_embedding_dim`` for partial rotation (only the first rd channels of each head turn;
Pythia, Phi-2, GPT-J). Below it the rotation is decomposed: the rotated channels sliced off,
x * cos + rotate(x) * sin, the rest concatenated back. The cos/sin tables come from the
builder (``Builder.rope_tables``), from theta or from the scaled frequencies lowering put on the
node (``tfgraph.graph.rope``), so the initializers stay exactly the parameters.
"""

from __future__ import annotations

from typing import Any

from tfgraph.exporters.onnx.builder import Builder
from tfgraph.graph.ir import Node

ROPE_OPSET = 23


def emit_rope(b: Builder, n: Node) -> str:
    x = n.inputs[0]  # (B, L, h*hd)
    a = n.attrs
    h, hd = int(a["heads"]), int(a["head_dim"])
    rd = int(a.get("rotary_dim", hd))  # rotated channels of each head
    interleaved = bool(a.get("interleaved", False))
    sym = b.graph.node(x).type.shape[1]
    ids = n.inputs[1] if len(n.inputs) == 2 else None  # a KV-cache graph's position ids
    if ids is not None:  # tables over every position of the mask: past and present
        sym = b.graph.node(b.ids_for_mask).type.shape[1]
    inv_freq = a.get("inv_freq")
    cos, sin = b.rope_tables(sym, rd, float(a["theta"]),
                             tuple(inv_freq) if inv_freq is not None else None,
                             float(a.get("scale", 1.0)))  # (L, rd/2) each
    if b.opset >= ROPE_OPSET:
        partial: dict[str, Any] = {"rotary_embedding_dim": rd} if rd < hd else {}
        return b.add(n.name, "RotaryEmbedding", [x, cos, sin, ids or b.position_ids(sym)],
                     n.name, num_heads=h, interleaved=int(interleaved), **partial)
    if ids is not None:  # each token's row: (B, L, rd/2)
        cos = b.add(n.name, "Gather", [cos, ids], tag="cos_rows", axis=0)
        sin = b.add(n.name, "Gather", [sin, ids], tag="sin_rows", axis=0)
    x4 = b.add(n.name, "Reshape", [x, b.ints([0, 0, h, hd])])  # (B, L, h, hd)
    rot = x4 if rd == hd else b.add(n.name, "Slice", [x4, b.ints([0]), b.ints([rd]),
                                                      b.ints([3])], tag="rotated")  # (.., rd)
    y = (_interleaved if interleaved else _half)(b, n, rot, cos, sin, rd)  # (B, L, h, rd)
    if rd < hd:
        rest = b.add(n.name, "Slice", [x4, b.ints([rd]), b.ints([hd]), b.ints([3])],
                     tag="pass")  # (B, L, h, hd - rd)
        y = b.add(n.name, "Concat", [y, rest], tag="with_pass", axis=3)
    return b.add(n.name, "Reshape", [y, b.ints([0, 0, h * hd])], n.name, tag="merge_heads")


def _half(b: Builder, n: Node, x4: str, cos: str, sin: str, rd: int) -> str:
    """Rotate-half (GPT-NeoX, Llama): x * cos + concat(-x2, x1) * sin on (B, L, h, rd)."""
    half = rd // 2
    cos2 = b.add(n.name, "Concat", [cos, cos], tag="cos", axis=-1)  # (L, rd) or (B, L, rd)
    sin2 = b.add(n.name, "Concat", [sin, sin], tag="sin", axis=-1)
    cos2 = b.add(n.name, "Unsqueeze", [cos2, b.ints([-2])], tag="cos_h")  # (.., L, 1, rd)
    sin2 = b.add(n.name, "Unsqueeze", [sin2, b.ints([-2])], tag="sin_h")
    x1 = b.add(n.name, "Slice", [x4, b.ints([0]), b.ints([half]), b.ints([3])], tag="x1")
    x2 = b.add(n.name, "Slice", [x4, b.ints([half]), b.ints([rd]), b.ints([3])], tag="x2")
    rot = b.add(n.name, "Concat", [b.add(n.name, "Neg", [x2]), x1], tag="rotate_half", axis=3)
    return b.add(n.name, "Add", [b.add(n.name, "Mul", [x4, cos2], tag="x_cos"),
                                 b.add(n.name, "Mul", [rot, sin2], tag="rot_sin")])


def _interleaved(b: Builder, n: Node, x4: str, cos: str, sin: str, rd: int) -> str:
    """Interleaved pairs (GPT-J): channels (2i, 2i+1) turn by frequency i, worked on as
    (B, L, h, rd/2, 2) so one cos/sin column serves both members of a pair."""
    x5 = b.add(n.name, "Reshape", [x4, b.ints([0, 0, 0, rd // 2, 2])], tag="pairs")
    x1 = b.add(n.name, "Slice", [x5, b.ints([0]), b.ints([1]), b.ints([4])], tag="x1")
    x2 = b.add(n.name, "Slice", [x5, b.ints([1]), b.ints([2]), b.ints([4])], tag="x2")
    rot = b.add(n.name, "Concat", [b.add(n.name, "Neg", [x2]), x1], tag="rotate_pairs", axis=4)
    cos5 = b.add(n.name, "Unsqueeze", [cos, b.ints([-3, -1])], tag="cos_h")  # (.., L, 1, rd/2, 1)
    sin5 = b.add(n.name, "Unsqueeze", [sin, b.ints([-3, -1])], tag="sin_h")
    y5 = b.add(n.name, "Add", [b.add(n.name, "Mul", [x5, cos5], tag="x_cos"),
                               b.add(n.name, "Mul", [rot, sin5], tag="rot_sin")])
    return b.add(n.name, "Reshape", [y5, b.ints([0, 0, 0, rd])], tag="merge_pairs")
