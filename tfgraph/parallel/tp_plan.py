"""How each parameter is split across tensor- and expert-parallel ranks: one table, read by the
planner (``tfgraph plan``: bytes per rank) and by ``tfgraph.exporters.parallelize`` (the
``ColwiseParallel`` / ``RowwiseParallel`` plan applied to the module), so what the plan counts
is what the module holds.

The split follows Megatron-LM (Shoeybi et al. 2019, section 3): the projections that open a
sublayer (q, k, v; up, gate) are split by output rows ("colwise"), the ones that close it
(o, down) by input columns ("rowwise"), so a sublayer needs one reduction of its output; token
tables and the output head are split by vocabulary rows ("vocab"); stacked routed experts are
split by expert across expert-parallel ranks and by hidden unit across tensor-parallel ranks.
Norms, routers, position tables and small gates are replicated. Roles come from the graph's
node metadata (``NodeMeta.role``), as Hugging Face's ``base_model_tp_plan`` and torchtitan's
plans key on parameter names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from tfgraph.graph.ir import Graph, Node
from tfgraph.graph.ops import OPS

Style = Literal["colwise", "rowwise", "vocab", "heads", "experts_colwise", "experts_rowwise",
                "replicate"]

# Role of a parameter's owner (NodeMeta.role without ".weight" / ".bias") -> its style.
_LAYER_STYLES: dict[str, Style] = {
    "q": "colwise", "k": "colwise", "v": "colwise", "up": "colwise", "gate": "colwise",
    "shared.up": "colwise", "shared.gate": "colwise",
    # latent attention's up-projections (per head); its down-projections q_a and kv_a (the
    # latents and the shared rotary key) stay whole on every rank, as in Megatron-LM's
    # MultiLatentAttention and DeepSeek-V3's inference code (ColumnParallelLinear q_b / kv_b)
    "q_b": "colwise", "kv_b": "colwise",
    "o": "rowwise", "down": "rowwise", "shared.down": "rowwise",
    "experts.up": "experts_colwise", "experts.gate": "experts_colwise",
    "experts.down": "experts_rowwise",
}
_EMBED_STYLES: dict[str, Style] = {
    "tokens": "vocab", "source_tokens": "vocab", "target_tokens": "vocab",
}
# A parameter an op splits by heads (OpDef.tp_split_param: T5's (buckets, heads) relative bias
# table, each rank keeping its heads' columns) is found from the op, in _tp_plan.


@dataclass(frozen=True)
class ParamShard:
    """Where one parameter is cut: ``tp_dim`` across tensor-parallel ranks, ``ep_dim`` across
    expert-parallel ranks (None: not cut that way)."""

    style: Style
    tp_dim: int | None
    ep_dim: int | None = None


def _owner_role(p: Node) -> tuple[str, str]:
    role = p.meta.role
    base, _, leaf = role.rpartition(".")
    return (base, leaf) if leaf in ("weight", "bias") else (role, "")


def param_shard(p: Node) -> ParamShard:
    """The split of one parameter node (see the module docstring)."""
    base, leaf = _owner_role(p)
    part = p.meta.part
    style: Style = "replicate"
    if part == "layer":
        style = _LAYER_STYLES.get(base, "replicate")
    elif part == "embed":
        style = _EMBED_STYLES.get(base, "replicate")
    elif part == "head" and base in ("weight", "bias", ""):
        style = "vocab"  # head.weight (V, d) and head.bias (V,)
    if style == "colwise" or style == "vocab":
        return ParamShard(style, 0)
    if style == "rowwise":  # the bias is added after the reduction: whole on every rank
        return ParamShard(style, 1) if leaf == "weight" else ParamShard("replicate", None)
    if style == "experts_colwise":  # (E, hidden, d)
        return ParamShard(style, 1, 0)
    if style == "experts_rowwise":  # (E, d, hidden)
        return ParamShard(style, 2, 0)
    return ParamShard("replicate", None)


def tp_plan(graph: Graph) -> dict[str, ParamShard]:
    """Every parameter of ``graph`` (by name) with its split (memoised on the graph)."""
    return graph.memo("tp_plan", lambda: _tp_plan(graph))


def _tp_plan(graph: Graph) -> dict[str, ParamShard]:
    """Every parameter of ``graph`` (by name) with its split. A token table the output head
    also reads (tied, ``tie_output``) is split by vocabulary rows like an untied one: the
    same rows serve the lookup (Megatron's VocabParallelEmbedding) and the head's logits
    (its ColumnParallelLinear over the shared weight; Shoeybi et al. 2019 §3, Narayanan et
    al. 2021), and the head's bias (head.bias, when output_bias) with them. A parameter
    operand an op splits by heads (``OpDef.tp_split_param``) has the ``heads`` style on that
    dimension."""
    by_heads: dict[str, ParamShard] = {}
    for n in graph.ops():
        split = OPS[n.op].tp_split_param
        if split is not None and graph.node(n.inputs[split[0]]).is_param:
            by_heads[n.inputs[split[0]]] = ParamShard("heads", split[1])
    return {p.name: by_heads.get(p.name) or param_shard(p) for p in graph.params()}


def colwise_projection(graph: Graph, name: str, shards: Mapping[str, ParamShard]) -> bool:
    """Whether value ``name`` is the output of a linear map (``OpDef.tp`` ``project``: its
    weight is operand 1) whose weight is split column-wise, so each rank holds a slice of
    its width (a norm over the whole of it would need statistics across ranks)."""
    node = graph.node(name)
    opdef = OPS.get(node.op)  # None for a graph input
    return (opdef is not None and opdef.tp == "project"
            and shards[node.inputs[1]].style == "colwise")
