"""Parameters by kind of work: the one grouping ``tfgraph report`` and ``tfgraph compare`` share
(README, ``tfgraph report`` and ``tfgraph compare``).

A parameter's kind is its node's ``Node.kind``, the same key the FLOPs are split by
(``flops_by_kind``): the sublayer inside a layer (``self_attn``, ``cross_attn``, ``ffn``), else
the part (``embed``, ``norm`` for a stack's final norm, ``head``). So a sublayer's norms count
with that sublayer, in parameters as in FLOPs, and ``layer`` holds the one norm that the two
branches of a parallel-residual layer share (GPT-J, GPT-NeoX). Graphs built by hand fall back to
their scope names.

``report`` writes ``params_by_kind(graph)`` under ``params_by_kind`` and ``compare`` under each
variant's ``params_by_kind``: the same function, so the same numbers under the same names.
"""

from __future__ import annotations

from tfgraph.passes import cost
from tfgraph.graph.ir import Graph

# Display order of the known kinds; kinds of hand-built graphs follow in order of appearance.
KIND_ORDER = ("embed", "self_attn", "cross_attn", "ffn", "layer", "norm", "head")

KIND_TITLES = {
    "embed": "embeddings",
    "self_attn": "self-attention",
    "cross_attn": "cross-attention",
    "ffn": "feed-forward",
    "layer": "shared layer norm",
    "norm": "final norm",
    "head": "head",
    "attention_scores": "attention scores",
}

GROUPING = ("a sublayer's norms count with it (as its FLOPs do); 'shared layer norm' is the "
            "norm both branches of a parallel-residual layer read; 'final norm' each stack's "
            "last norm; embeddings: token tables and learned positions; head: an untied "
            "output weight and its bias.")


def params_by_kind(graph: Graph) -> dict[str, int]:
    """Unique parameter counts (a tied table once) per ``Node.kind`` of the graph's parameters;
    they sum to the graph's params. Known kinds first, in ``KIND_ORDER``."""
    counts: dict[str, int] = {}
    for p in graph.params():
        counts[p.kind] = counts.get(p.kind, 0) + cost.param_count(p)
    return order_kinds(counts)


def order_kinds(counts: dict[str, int]) -> dict[str, int]:
    """``counts`` with the known kinds first, in ``KIND_ORDER``, the rest as they came."""
    known = {k: counts[k] for k in KIND_ORDER if k in counts}
    return {**known, **{k: v for k, v in counts.items() if k not in known}}


def kind_title(kind: str) -> str:
    """How tables and plots name a kind: ``self_attn`` -> ``self-attention``; an unknown kind
    (a hand-built graph's scope) as written."""
    return KIND_TITLES.get(kind, kind)
