"""The diagram table: one row per op of ``tfgraph.graph.ops.OPS`` (tinygrad's op tables as
data), saying how the diagrams draw the op: its colour and label at the op level, and what it
adds to the boxes that fold it at the layer and model levels (a sublayer's function, the
embedding, the output head). The drawing code reads an op's row (``row``) and names no op;
a new op needs a row here, which tests/test_op_tables.py asks for (``FULL_TABLES``).

Norms, activations and position encodings take their category's row (``OpDef.category``;
their words are their ``OpDef``'s ``title`` and ``diagram_text``), so a new one is drawn like
the others without a row of its own. The KV-cache ops (kv_concat, attention_cached,
cache_rows) have no row: diagrams draw the full graph (``tfgraph draw``, ``build --to svg``,
compare pages), never a cached one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tfgraph.exporters.diagram.style import count, op_title
from tfgraph.exporters.diagram.words import (
    attention_kind,
    dropout_text,
    is_tied,
    linear_text,
    name,
    roles,
    rope_detail,
    scale_text,
)
from tfgraph.graph.ir import Graph, Node
from tfgraph.graph.ops import OPS


@dataclass(frozen=True)
class DiagramOp:
    """How the diagrams draw one op; a field left at its default adds nothing."""

    kind: str | Callable[[Node], str]
    """Palette kind (``style.PALETTE``) of its op-level box, or that kind from the node."""
    keeps_kind: bool = False
    """Keeps ``kind`` in the embedding and the head, which otherwise colour their ops."""
    text: Callable[[Graph, Node], str] | None = None
    """Its op-level label: what it does, with the sizes of its parameters; None: its name."""
    box_line: Callable[[Graph, list[Node]], str] | None = None
    """The line a sublayer box's nodes of this op add to the box's label."""
    see_through: bool = False
    """Only rescales its input: the rotary line names the projection behind it."""
    gates: bool = False
    """An element-wise product in a feed-forward: the feed-forward is gated (GLU)."""
    moe: bool = False
    """Makes its feed-forward a mixture of experts, told from this op's attributes."""
    shared_note: str = ""
    """Words it adds to a mixture of experts' shared-experts line."""
    head_line: Callable[[Node], str] | None = None
    """Its own line in the output head's box; None: a word of the head's transform."""
    token_line: Callable[[Node], str] | None = None
    """The embedding box's tokens line when the op is in an embedding."""
    ids_note: str = ""
    """What a position op that reads this op's output as its ids adds to its line."""

    def palette(self, node: Node) -> str:
        return self.kind(node) if callable(self.kind) else self.kind


def row(node: Node) -> DiagramOp:
    """The row of ``node``, an op (graph inputs and parameters have none)."""
    return DIAGRAM_OPS[node.op]


# ---- op-level labels ------------------------------------------------------------------------


def _linear(graph: Graph, node: Node) -> str:
    weight = graph.node(node.inputs[1])
    tied = f"\nweight {name(weight.name)} (tied)" if is_tied(graph, node) else ""
    return f"linear {linear_text(graph, node)}{tied}"


def _attention(graph: Graph, node: Node) -> str:
    a = node.attrs
    heads = f"{a['heads']}×{a['head_dim']}"
    if a["kv_heads"] != a["heads"]:
        heads += f", kv {a['kv_heads']}"
    # the keys each query reads: the work the op does (README, flops.forward_effective)
    window = f"window {a['window']}" if a.get("window") else ""
    flags = [a["kind"], "causal" if a["causal"] else "", window, a["normalize"]]
    return f"attention {heads}\n" + ", ".join(f for f in flags if f)


def _gather(graph: Graph, node: Node) -> str:
    rows, cols = graph.node(node.inputs[0]).attrs["shape"]
    return f"gather {count(rows)} × {count(cols)}"


def _times(node: Node) -> str:
    return f"× {node.attrs['factor']:.4g}"


def _learned(graph: Graph, node: Node) -> str:
    rows, cols = graph.node(node.inputs[1]).attrs["shape"]
    return f"+ learned positions {count(rows)} × {cols}"


def _rope(graph: Graph, node: Node) -> str:
    detail = rope_detail(node.attrs)
    return f"rope θ={node.attrs['theta']:g}" + (f"\n{detail}" if detail else "")


# ---- lines of sublayer boxes ----------------------------------------------------------------


def _projection(graph: Graph, node: Node) -> Node:
    """The linear behind ``node``, looking through ops that only rescale it (a qk-norm sits
    between them, clip_qkv clamps)."""
    while (behind := DIAGRAM_OPS.get(node.op)) is not None and behind.see_through:
        node = graph.node(node.inputs[0])
    return node


def _rotary(graph: Graph, ropes: list[Node]) -> str:
    """``rotary positions on q, k`` from the rotary ops and the projections they read."""
    read = [_projection(graph, graph.node(n.inputs[0])) for n in ropes]
    detail = rope_detail(ropes[0].attrs)
    return f"rotary positions on {', '.join(roles(read))}" + (f"\n({detail})" if detail else "")


def _inner_norm(graph: Graph, norms: list[Node]) -> str:
    """``RMSNorm on q, k`` for norms inside a sublayer's function (qk-norm)."""
    read = roles([graph.node(n.inputs[0]) for n in norms])
    return f"{op_title(norms[0].op)} on {', '.join(read)}"


def _clipped(graph: Graph, clips: list[Node]) -> str:
    return f"q, k, v clipped to ±{clips[0].attrs['bound']:g}"  # MPT, OLMo 1


# category -> the row of its ops that have none of their own (positions in a layer rotate q, k)
_CATEGORY_ROWS = {"norm": DiagramOp("norm", box_line=_inner_norm, see_through=True),
                  "activation": DiagramOp("activation"), "position": DiagramOp("rope")}

DIAGRAM_OPS: dict[str, DiagramOp] = {
    **{op: _CATEGORY_ROWS[d.category] for op, d in OPS.items() if d.category in _CATEGORY_ROWS},
    "embedding": DiagramOp("embedding", text=_gather),
    "scale": DiagramOp("activation", text=lambda graph, node: _times(node),
                       head_line=_times,  # T5's rescaled logits
                       token_line=lambda node: f"tokens × {scale_text(node.attrs['factor'])}"),
    "positions_sinusoidal": DiagramOp("rope", text=lambda graph, node: "+ sinusoidal positions"),
    "positions_learned": DiagramOp("rope", text=_learned),
    # RoBERTa: positions count the real tokens
    "pad_position_ids": DiagramOp("rope", ids_note=", padding skipped"),
    "rope": DiagramOp("rope", text=_rope, box_line=_rotary),
    "linear": DiagramOp("linear", text=_linear),
    "attention": DiagramOp(attention_kind, keeps_kind=True, text=_attention),
    "mul": DiagramOp("activation", text=lambda graph, node: "mul (gate)", gates=True),
    "add": DiagramOp("add"),
    "dropout": DiagramOp("dropout", keeps_kind=True,
                         text=lambda graph, node: dropout_text(node)),
    "softcap": DiagramOp("activation",  # Gemma 2's capped logits
                         head_line=lambda node: f"logits capped at ±{node.attrs['cap']:g}"),
    "clip": DiagramOp("activation", box_line=_clipped, see_through=True),
    "softmax": DiagramOp("head"),
    "cross_entropy": DiagramOp("head"),
    "head_slice": DiagramOp("activation"),
    "head_concat": DiagramOp("activation"),
    "experts": DiagramOp("linear", moe=True),
    "sigmoid_gate": DiagramOp("activation", shared_note=", sigmoid gate"),
}
