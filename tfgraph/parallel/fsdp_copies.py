"""The copies FSDP2 (``fully_shard``) runs around its collectives, per micro-batch: what ``tfgraph
plan --zero 3 --kernels eager`` adds to an eager step (``timing.step_time``'s
``fsdp_copies``). Read from PyTorch's own implementation (torch/distributed/fsdp/_fully_shard,
``_fsdp_collectives.py`` and ``_fsdp_param_group.py``, torch 2.13), as ``parallelize`` uses it:
one group per layer and one for the rest (the root), mixed precision with the layout's dtype
for compute and float32 gradient reduction, resharded after forward, so every group is
gathered in forward and again in backward and reduced once.

Gathering a group (``unshard``):
- one data-parallel rank (``world_size == 1``, ``wait_for_unshard``): per parameter tensor, the
  cast of the float32 shard to the compute dtype (16-bit layouts only: ``all_gather_inputs``)
  and the copy into the unsharded parameter (``tensor.copy_``): two kernels per tensor;
- several (``foreach_all_gather``): the cast into one flat buffer (``_foreach_copy_``), the copy
  into the all-gather input (``all_gather_copy_in``), and after the all-gather the copy out to
  the unsharded parameters (``split_with_sizes_copy``): three kernels per group.
Reducing a group's gradients (``foreach_reduce``): their copy into one float32 buffer
(``chunk_cat``); one rank then copies it to the output (no reduce-scatter), several
reduce-scatter it (NCCL averages: no division kernel). The sharded gradients are views of the
output. Parameters no gradient reaches are gathered, not reduced.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tfgraph.graph.ir import Graph
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.memory import chunk_elements, local_shape
from tfgraph.parallel.tp_plan import tp_plan
from tfgraph.passes.cost import frozen_params

FP32 = 4
UNSHARDS = 2
"""Gathers per group per micro-batch: forward, and backward again (resharded after forward)."""


def copy_kernels(graph: Graph, groups: Sequence[Sequence[str]], layout: Layout
                 ) -> list[tuple[str, float]]:
    """(name, bytes moved) of each copy kernel FSDP2 launches per micro-batch for the
    parameter groups ``groups`` of one rank (each a list of parameter names)."""
    plan = tp_plan(graph)
    frozen = graph.memo("frozen_names", lambda: frozenset(p.name for p in frozen_params(graph)))
    elem = FP32 if layout.dtype == "float32" else 2
    kernels: list[tuple[str, float]] = []
    for group in groups:
        # expert-parallel experts are their own groups, sharded over dp / ep ranks
        by_ranks: dict[int, list[tuple[int, int, bool]]] = {}
        for name in group:
            shard = plan[name]
            shape = local_shape(tuple(graph.node(name).attrs["shape"]), shard, layout.tp,
                                layout.ep)
            ranks = layout.dp // layout.ep if shard.ep_dim is not None else layout.dp
            by_ranks.setdefault(ranks, []).append(
                (chunk_elements(shape, ranks), math.prod(shape), name not in frozen))
        for ranks, sizes in by_ranks.items():
            kernels += _group_kernels(sizes, ranks == 1, elem)
    return kernels


def _group_kernels(sizes: list[tuple[int, int, bool]], one_rank: bool, elem: int
                   ) -> list[tuple[str, float]]:
    """One FSDP2 group's copy kernels per micro-batch; ``sizes``: (sharded elements, unsharded
    elements, reduced) per parameter tensor."""
    cast = elem != FP32  # MixedPrecisionPolicy(param_dtype=16-bit): the shards are cast
    kernels: list[tuple[str, float]] = []
    for _ in range(UNSHARDS):
        if one_rank:
            for _, full, _ in sizes:
                if cast:
                    kernels.append(("fsdp.cast", full * (FP32 + elem)))
                kernels.append(("fsdp.copy", full * 2 * elem))
        else:
            sharded = sum(s for s, _, _ in sizes)
            if cast:
                kernels.append(("fsdp.foreach_cast", sharded * (FP32 + elem)))
            kernels.append(("fsdp.all_gather_copy_in", sharded * 2 * elem))
            kernels.append(("fsdp.split_with_sizes_copy", sum(f for _, f, _ in sizes) * 2 * elem))
    reduced = sum(f for _, f, r in sizes if r)
    if reduced:
        kernels.append(("fsdp.chunk_cat", reduced * (elem + FP32)))
        if one_rank:
            kernels.append(("fsdp.copy_reduced", reduced * 2 * FP32))
    return kernels
