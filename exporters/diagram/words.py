"""Words every diagram level and the op table (``ops``) share: user names as one printable
line, attention titles and palette kinds, and the sizes of linears, rotary ops and scalings.

Plain text only (lines joined by "\\n"); ``style`` escapes it for DOT.
"""

from __future__ import annotations

import math
from typing import Any

from tfgraph.exporters.diagram.style import count
from tfgraph.graph.ir import Graph, Node
from tfgraph.terminal import printable


def name(text: str) -> str:
    """A user-supplied name as one printable line (control characters shown as escapes)."""
    return printable(text)


def roles(nodes: list[Node]) -> list[str]:
    """Each node's job within its box (its role: "q", "k"), else its name."""
    return [name(n.meta.role or n.name) for n in nodes]


def attention_title(node: Node) -> str:
    """'Masked self-attention', 'Self-attention' or 'Cross-attention' for an attention op."""
    if node.attrs["kind"] == "cross":
        return "Cross-attention"
    return "Masked self-attention" if node.attrs["causal"] else "Self-attention"


def attention_kind(node: Node) -> str:
    """Palette kind of an attention op."""
    if node.attrs["kind"] == "cross":
        return "cross_attention"
    return "masked_attention" if node.attrs["causal"] else "self_attention"


def rope_detail(a: dict[str, Any]) -> str:
    """What a rope node does beyond whole-head, rotate-half, unscaled rotation: ``4 of 16
    channels, interleaved, yarn scaling``; empty when nothing."""
    parts = []
    if "rotary_dim" in a:
        parts.append(f"{a['rotary_dim']} of {a['head_dim']} channels")
    if a.get("interleaved"):
        parts.append("interleaved pairs")
    if "scaling" in a:
        parts.append(f"{a['scaling']} scaling")
    return ", ".join(parts)


def scale_text(factor: float) -> str:
    """``√512`` when the factor is the root of an integer (sqrt(d_model)), else the number."""
    square = round(float(factor) ** 2)
    if square > 0 and math.isclose(math.sqrt(square), float(factor), rel_tol=1e-9):
        return f"√{square}"
    return f"{float(factor):.4g}"


def dropout_text(node: Node) -> str:
    return f"dropout {node.attrs['p']:g}"


def linear_text(graph: Graph, node: Node) -> str:
    """``512 → 2048 + bias`` from the weight's [out, in] shape."""
    w = graph.node(node.inputs[1]).attrs["shape"]
    text = f"{count(w[1])} → {count(w[0])}"
    if len(node.inputs) == 3:
        text += " + bias"
    return text


def is_tied(graph: Graph, linear: Node) -> bool:
    """The linear's weight belongs to another part (the head reading a token table)."""
    return graph.node(linear.inputs[1]).meta.part != linear.meta.part
