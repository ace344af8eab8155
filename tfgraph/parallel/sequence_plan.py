"""Where each value of a graph lives under sequence parallelism (Korthikanti et al. 2022,
section 4.2.2): one rule, read by the planner (``tfgraph.parallel.units``: which saved bytes a
rank keeps 1/t of with ``--sp``) and by ``parallelize(..., sp=True)``
(``tfgraph.exporters.torch.sequence_parallel``: what each step of the module computes on), so
that what the plan counts is what the module keeps.

Tensor parallelism leaves the residual stream whole on every tensor-parallel rank; sequence
parallelism holds it as each rank's rows (1/t of the sequence). One topological pass over the
op nodes gives each a kind:

- ``embedding``: a token table's lookup; its output is cut to the rank's rows;
- ``rowwise``: a row-parallel projection (o, down); its partial sums are reduce-scattered to
  the rank's rows;
- ``norm``: a whole-width norm of rows; ``positions``: learned or sinusoidal positions added
  to rows; ``elementwise``: a token-wise step (residual add, dropout, scaling, activation) on
  rows, its operands that are still whole cut to the rank's rows first;
- ``colwise``: a column-parallel or vocabulary-split projection reading rows, all-gathered
  (its output is split by features, the whole sequence);
- ``gathered``: any other step reading rows (a router, routed experts, a replicated head, a
  per-head norm) reads them all-gathered; its output is whole on every rank.

The values an ``embedding``, ``rowwise``, ``norm``, ``positions`` or ``elementwise`` node
makes are the rank's rows (``SequencePlan.sharded``); every other value is as tensor
parallelism alone has it. An all-gathered input that a ``colwise`` or ``gathered`` step saves
for backward is kept as the rank's rows and all-gathered again in backward (section 4.2.2).

Precondition: the graph lints. Postcondition: the graph is unchanged; TfgraphError (one line)
for a graph that sequence parallelism cannot run (a KV cache or padding mask, positions from
position ids, a row-parallel projection reading rows).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph
from tfgraph.graph.ops import OPS
from tfgraph.parallel.tp_plan import tp_plan

__all__ = ["ELEMENTWISE_OPS", "SequencePlan", "sequence_parallel_plan"]

# Each op's rule is its OpDef.sequence (tfgraph.graph.ops.SequenceRule). Ops computed token by
# token on their operands' last axis (sequence "elementwise") give on a sequence shard the
# rank's rows of the whole result.
ELEMENTWISE_OPS = frozenset(op for op, d in OPS.items() if d.sequence == "elementwise")
# Graph inputs of the cached and masked graphs (KV cache, padding): not full-sequence training.
_CACHE_INPUTS = ("attention_mask", "position_ids", "encoder_attention_mask")
ROWS_KINDS = frozenset({"embedding", "rowwise", "norm", "positions", "elementwise"})
"""Kinds whose output is the rank's rows."""


@dataclass(frozen=True)
class SequencePlan:
    """Where each value lives under sequence parallelism (see the module docstring).

    ``kind``: op node -> how it is computed: "embedding" (output cut to the rank's rows),
    "rowwise" (reduce-scattered), "norm" (``SequenceParallel`` on its owner), "positions"
    (the rank's positions), "elementwise" (on the local rows), "colwise" (input all-gathered
    once, as a replicated DTensor), "gathered" (inputs all-gathered, a whole output); nodes
    absent compute as under tensor parallelism alone. ``sharded``: the values held as the
    rank's sequence rows."""

    kind: Mapping[str, str]
    sharded: frozenset[str]


def sequence_parallel_plan(graph: Graph) -> SequencePlan:
    """Each op node's kind and the sequence-sharded values of ``graph``, in one topological
    pass. TfgraphError (one line) for what sequence parallelism here cannot run."""
    cached = [name for name in graph.inputs if name in _CACHE_INPUTS
              or name.startswith("past_key")]
    if cached:
        raise TfgraphError(f"sequence parallelism runs full-sequence graphs (training); this "
                           f"graph takes {cached[0]}")
    shards = tp_plan(graph)
    kind: dict[str, str] = {}
    sharded: set[str] = set()
    for node in graph.ops():
        params = [i for i in node.inputs if graph.node(i).is_param]
        values = [i for i in node.inputs if not graph.node(i).is_param]
        styles = {shards[p].style for p in params}
        on_shards = [v for v in values if v in sharded]
        rule = OPS[node.op].tp  # embeddings and linear maps go by their parameters' splits
        if rule == "gather":
            kind[node.name] = "embedding"
        elif rule == "project" and "rowwise" in styles:
            if on_shards:
                raise TfgraphError(f"{node.name}: a row-parallel projection reads a sequence "
                                   "shard; sequence parallelism cannot split it")
            kind[node.name] = "rowwise"
        elif not on_shards:
            continue
        elif OPS[node.op].sequence == "norm" and params and "heads" not in node.attrs:
            kind[node.name] = "norm"
        elif OPS[node.op].sequence == "positions":
            if len(values) > 1:
                raise TfgraphError(f"{node.name}: positions from position ids are not "
                                   "supported under sequence parallelism")
            kind[node.name] = "positions"
        elif OPS[node.op].sequence == "elementwise" and not params \
                and all(_along_sequence(graph, v, on_shards[0]) for v in values):
            kind[node.name] = "elementwise"
        elif rule == "project" and styles & {"colwise", "vocab"}:
            kind[node.name] = "colwise"
        else:
            kind[node.name] = "gathered"
        if kind[node.name] in ROWS_KINDS:
            sharded.add(node.name)
    return SequencePlan(kind, frozenset(sharded))


def _along_sequence(graph: Graph, value: str, shard: str) -> bool:
    """Whether ``value`` has the sequence axis (axis 1) of the sharded value ``shard``, so
    that the rank's rows of it are its rows of ``shard``."""
    mine, theirs = graph.node(value).type.shape, graph.node(shard).type.shape
    return len(mine) >= 2 and len(mine) == len(theirs) and str(mine[1]) == str(theirs[1])
