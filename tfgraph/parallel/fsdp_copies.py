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
- several (``foreach_all_gather``): the cast into one flat buffer (``_foreach_copy_``; none in
  float32, whose ``param_dtype`` FSDP2 drops), the copy into the all-gather input
  (``all_gather_copy_in``), and after the all-gather the copy out to the unsharded parameters
  (``split_with_sizes_copy``), dim 0 padded to a multiple of the ranks: three kernels per
  group.
Reducing a group's gradients (``foreach_reduce``): their copy into one padded float32 buffer
(``chunk_cat``); one rank then copies it to the output (no reduce-scatter; expert-parallel
experts held by one rank are divided by dp on the way, ``set_gradient_divide_factor``),
several reduce-scatter it (NCCL averages: no division kernel). The sharded gradients are views
of the output; a later micro-batch's are added to them, one kernel per tensor
(``accumulate_kernels``). Parameters no gradient reaches are gathered, not reduced.

Assumed: FSDP2 reduces every micro-batch (its default). Under ``torch.distributed.pipelining``
(pp > 1) the stages defer it to the last micro-batch and keep the parameters gathered through
backward, which this does not model. ``tests/test_fsdp_copies.py`` checks the copies against
the kernels ``fully_shard`` runs, byte for byte, on one gloo rank and on two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from tfgraph.graph.ir import Graph
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.memory import chunk_elements, local_shape
from tfgraph.parallel.tp_plan import tp_plan
from tfgraph.parallel.units import units
from tfgraph.passes.gradients import frozen_params

FP32 = 4
UNSHARDS = 2
"""Gathers per group per micro-batch: forward, and backward again (resharded after forward)."""


def fsdp_groups(graph: Graph, members: Iterable[tuple[int, int]]) -> list[list[str]]:
    """The FSDP2 groups ``parallelize`` makes of the units ``members`` ((unit index, how many
    alike), ``units(graph)``): one per layer, one for the rest (the root; a tied table once)."""
    all_units = units(graph)[0]
    groups: list[list[str]] = []
    root: list[str] = []
    for i, count in members:
        unit = all_units[i]
        if unit.is_layer:
            groups += [unit.params] * count
        else:
            root += unit.params * count
    return [*groups, list(dict.fromkeys(root))]


Sizes = tuple[int, int, int, bool]
"""Per parameter tensor: its sharded elements, the elements gathered (dim 0 padded to a
multiple of the ranks), its elements, and whether a gradient reaches it."""


def subgroups(graph: Graph, group: Sequence[str], layout: Layout
               ) -> list[tuple[int, bool, list[Sizes]]]:
    """A group's FSDP2 groups (expert-parallel experts are their own, sharded over dp / ep
    ranks, their gradients divided by dp): (ranks, divided, ``Sizes`` per tensor)."""
    plan = tp_plan(graph)
    frozen = graph.memo("frozen_names", lambda: frozenset(p.name for p in frozen_params(graph)))
    by_ranks: dict[int, list[Sizes]] = {}
    experts: dict[int, bool] = {}
    for name in group:
        shard = plan[name]
        shape = local_shape(tuple(graph.node(name).attrs["shape"]), shard, layout.tp, layout.ep)
        expert = shard.ep_dim is not None and layout.ep > 1
        ranks = layout.dp // layout.ep if expert else layout.dp
        part = chunk_elements(shape, ranks)
        full = math.prod(shape)
        gathered = part * ranks if ranks > 1 else full
        by_ranks.setdefault(ranks, []).append((part, gathered, full, name not in frozen))
        experts[ranks] = expert
    return [(ranks, experts[ranks] and layout.dp > 1, sizes) for ranks, sizes in by_ranks.items()]


def copy_kernels(graph: Graph, groups: Sequence[Sequence[str]], layout: Layout
                 ) -> list[tuple[str, float]]:
    """(name, bytes moved) of each copy kernel FSDP2 launches per micro-batch for the
    parameter groups ``groups`` of one rank (each a list of parameter names)."""
    elem = FP32 if layout.dtype == "float32" else 2
    kernels: list[tuple[str, float]] = []
    for group in groups:
        for ranks, divided, sizes in subgroups(graph, group, layout):
            kernels += _group_kernels(sizes, ranks == 1, divided, elem)
    return kernels


def accumulate_kernels(graph: Graph, groups: Sequence[Sequence[str]], layout: Layout
                       ) -> list[tuple[str, float]]:
    """(name, bytes) of the kernels adding a later micro-batch's reduced gradients into the
    sharded float32 gradients (``foreach_reduce``: ``grad += new``, one per tensor: read
    both, write the sum). The first micro-batch's are views of its reduced output."""
    return [("fsdp.accumulate", 3 * part * FP32) for group in groups
            for _, _, sizes in subgroups(graph, group, layout)
            for part, _, _, reduced in sizes if reduced]


def _group_kernels(sizes: list[Sizes], one_rank: bool, divided: bool, elem: int
                   ) -> list[tuple[str, float]]:
    """One FSDP2 group's copy kernels per micro-batch. ``divided``: one rank holding experts
    whose gradients FSDP2 divides by dp itself (``reduce_output.copy_(input / factor)``)."""
    cast = elem != FP32  # MixedPrecisionPolicy(param_dtype=16-bit): the shards are cast
    kernels: list[tuple[str, float]] = []
    for _ in range(UNSHARDS):
        if one_rank:
            for _, _, full, _ in sizes:
                if cast:
                    kernels.append(("fsdp.cast", full * (FP32 + elem)))
                kernels.append(("fsdp.copy", full * 2 * elem))
        else:
            sharded = sum(s for s, _, _, _ in sizes)
            if cast:
                kernels.append(("fsdp.foreach_cast", sharded * (FP32 + elem)))
            kernels.append(("fsdp.all_gather_copy_in", sharded * 2 * elem))
            gathered = sum(g for _, g, _, _ in sizes)
            kernels.append(("fsdp.split_with_sizes_copy", gathered * 2 * elem))
    # the gradients (as computed) into one padded float32 buffer
    reduced = sum(g for _, g, _, r in sizes if r)
    if reduced:
        kernels.append(("fsdp.chunk_cat",
                        sum(f for _, _, f, r in sizes if r) * elem + reduced * FP32))
        if one_rank:
            if divided:
                kernels.append(("fsdp.divide", reduced * 2 * FP32))
            kernels.append(("fsdp.copy_reduced", reduced * 2 * FP32))
    return kernels
