"""Whether a tensor/expert-parallel degree divides what it cuts: every split dimension of the
parameters (``tp_plan``) and the heads of every attention the placement splits
(``placement``: ops it leaves whole on every rank, such as latent attention's shared rotary
key, need not divide). Read by ``layout.check`` (the planner) and by ``parallelize``.
"""

from __future__ import annotations

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph
from tfgraph.parallel.placement import R, place
from tfgraph.parallel.tp_plan import tp_plan


def check_divisible(graph: Graph, tp: int = 1, ep: int = 1) -> None:
    """Refuse a tensor/expert-parallel degree that does not divide what it cuts (memoised per
    degrees: see ``_check_divisible``)."""
    verdicts: dict[tuple[int, int], str | None] = graph.memo("tp_divisible", dict)
    if (tp, ep) not in verdicts:
        try:
            _check_divisible(graph, tp, ep)
            verdicts[(tp, ep)] = None
        except TfgraphError as e:
            verdicts[(tp, ep)] = str(e)
    if verdicts[(tp, ep)] is not None:
        raise TfgraphError(verdicts[(tp, ep)])


def _check_divisible(graph: Graph, tp: int = 1, ep: int = 1) -> None:
    """Refuse a tensor/expert-parallel degree that does not divide what it cuts: every split
    dimension, and the query and key/value heads of every attention (a rank holds whole
    heads). Raises TfgraphError naming the first node that does not divide."""
    for name, shard in tp_plan(graph).items():
        shape = graph.node(name).attrs["shape"]
        if tp > 1 and shard.tp_dim is not None and shape[shard.tp_dim] % tp:
            # Megatron-LM pads the vocabulary to a multiple of 128 x tp instead
            # (--make-vocab-size-divisible-by); a spec states its padded vocab itself
            pad = " (pad the vocab to a multiple of the tp degree, as Megatron-LM does)" \
                if shard.style == "vocab" else ""
            raise TfgraphError(f"--tp {tp} does not divide {name} dimension {shard.tp_dim} "
                               f"({shape[shard.tp_dim]}){pad}")
        if ep > 1 and shard.ep_dim is not None and shape[shard.ep_dim] % ep:
            raise TfgraphError(f"--ep {ep} does not divide the {shape[shard.ep_dim]} experts "
                               f"of {name}")
    if tp > 1:
        whole = whole_on_every_rank(graph)
        for node in graph.ops():
            if node.name in whole:
                continue
            for key in ("heads", "kv_heads"):
                if key in node.attrs and node.attrs[key] % tp:
                    raise TfgraphError(f"--tp {tp} does not divide the {node.attrs[key]} "
                                       f"{key.replace('_', ' ')} of {node.name}")


def whole_on_every_rank(graph: Graph) -> frozenset[str]:
    """Op nodes tensor parallelism leaves whole on every rank (placement R): their heads
    are not split, so the degree need not divide them (latent attention's shared rotary
    key, one head; ``parallelize`` runs them unsplit). Empty where the graph cannot be
    placed: every node's heads are then checked, and the placement's own refusal comes
    after. Memoised on the graph."""
    def make() -> frozenset[str]:
        try:
            placement = place(graph)
        except TfgraphError:
            return frozenset()
        return frozenset(n.name for n in graph.ops() if placement.of[n.name] == R)

    whole: frozenset[str] = graph.memo("tp_whole", make)
    return whole
