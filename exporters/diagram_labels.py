"""Words for diagram boxes, read from the compiled graph (and its spec for the prose parts).

Every function takes what it describes and returns a short plain-text line; the levels in
``diagram_model`` / ``diagram_layer`` / ``diagram_op`` arrange them.
"""

from __future__ import annotations

from tfgraph.ir import Graph, Node
from tfgraph.spec import GATED_ACTIVATIONS, Spec

from tfgraph.exporters.diagram_style import NORM_NAMES, count

ACTIVATION_NAMES = {"relu": "ReLU", "gelu": "GELU", "gelu_tanh": "GELU (tanh)", "silu": "SiLU",
                    "swiglu": "SwiGLU", "geglu": "GeGLU"}
POSITION_TEXT = {"sinusoidal": "+ sinusoidal positions", "learned": "+ learned positions",
                 "rope": "rotary positions (in attention)", "none": "no positions"}
NORM_PLACEMENT = {"post": "post-norm: norm(x + f(x))", "pre": "pre-norm: x + f(norm(x))",
                  "branch": "branch norm: x + norm(f(x))",
                  "sandwich": "sandwich: x + norm(f(norm(x)))"}


def spec_of(graph: Graph) -> Spec:
    if graph.spec is None:
        raise ValueError(f"graph {graph.name!r} has no spec; compile it with tfgraph.compile")
    return graph.spec


def heads_text(spec: Spec) -> str:
    att = spec.attention
    if att.kv_heads == att.heads:
        heads = f"{att.heads} heads × {att.head_dim}"
    elif att.kv_heads == 1:
        heads = f"{att.heads} heads × {att.head_dim}, 1 kv head (MQA)"
    else:
        heads = f"{att.heads} heads × {att.head_dim}, {att.kv_heads} kv heads (GQA)"
    if att.normalize == "hardmax":
        heads += ", hardmax"
    return heads


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


def ffn_text(spec: Spec) -> str:
    act = spec.ffn.activation
    d, h = spec.d_model, spec.ffn.hidden
    kind = "gated " if act in GATED_ACTIVATIONS else ""
    return f"{kind}{ACTIVATION_NAMES[act]}, {d} → {h} → {d}"


def norm_text(spec: Spec) -> str:
    return f"{NORM_NAMES[spec.norm.kind]}, {NORM_PLACEMENT[spec.norm.position]}"


def table_text(graph: Graph, param: str) -> str:
    rows, cols = graph.node(param).attrs["shape"]
    return f"{param}\n{count(rows)} × {count(cols)}"


def embed_text(graph: Graph, stack: str) -> str:
    """Token gather, scaling and positions of ``stack``'s embedding, from its nodes."""
    spec = spec_of(graph)
    lines = [f"{stack.capitalize()} embedding" if spec.arch == "encoder-decoder" else "Embedding"]
    scope = f"{stack}.embed"
    if f"{scope}.scale" in graph:
        lines.append(f"tokens × √{spec.d_model}")
    else:
        lines.append("tokens")
    lines.append(POSITION_TEXT[spec.embedding.positions])
    if spec.embedding.positions == "learned":
        lines[-1] += f" ({count(spec.max_len or 0)} × {spec.d_model})"
    return "\n".join(lines)


def dropout_text(node: Node) -> str:
    return f"dropout {node.attrs['p']:g}"


def linear_text(graph: Graph, node: Node) -> str:
    """``512 → 2048 + bias`` from the weight's [out, in] shape."""
    w = graph.node(node.inputs[1]).attrs["shape"]
    text = f"{count(w[1])} → {count(w[0])}"
    if len(node.inputs) == 3:
        text += " + bias"
    return text
