"""Bytes of model states one rank holds: weights, gradients and optimizer states of the
parameters its pipeline stage reads, split as ``tp_plan`` says and sharded over data-parallel
ranks as ZeRO / FSDP do (Rajbhandari et al. 2020).

Sharding over d data-parallel ranks cuts each parameter's first dimension into chunks of
ceil(rows / d) (``torch.chunk``, FSDP2's rule): the first rank holds the largest chunk, the
figure given (the most loaded rank). Expert weights split by expert parallelism are replicated
over d / ep ranks only. Adam keeps a float32 step count per parameter tensor (torch.optim.Adam):
4 bytes each, counted in ``optimizer``. A parameter no gradient reaches
(``tfgraph.passes.gradients.frozen_params``: DeepSeek-V3's router correction bias) has weights only.

Precision (``layout.state_bytes``): mixed precision keeps 16-bit weights, 16-bit gradients
(``--states mixed``, 16 bytes per parameter) or fp32 ones (``--states megatron``, Megatron-LM's
18) and an fp32 master copy with the two moments; with ZeRO-3 (FSDP2 with a 16-bit
``MixedPrecisionPolicy``) the sharded parameter itself is the fp32 master and its gradient
fp32 (4 + 4 + 8 bytes under either convention), the 16-bit copy exists only while a layer
runs (``temporary``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tfgraph.graph.ir import Graph
from tfgraph.passes.figures import ADAM_STEP_BYTES
from tfgraph.passes.gradients import frozen_params
from tfgraph.parallel.layout import Layout, state_bytes
from tfgraph.parallel.tp_plan import ParamShard, tp_plan

STEP_BYTES = ADAM_STEP_BYTES  # torch.optim.Adam's float32 step count, one per parameter tensor
FP32 = 4
ADAM_MOMENTS = 8  # two float32 moments per element


@dataclass(frozen=True)
class States:
    """Bytes of one rank's model states (and the unsharded bytes of the same parameters)."""

    weights: int
    gradients: int
    optimizer: int
    unsharded: int
    """Elements of these parameters before data-parallel sharding (ZeRO-3 gathers them)."""
    expert_unsharded: int = 0
    """The part of ``unsharded`` in experts split by expert parallelism: their data-parallel
    group is the d / ep ranks holding the same experts, not all d."""
    frozen_unsharded: int = 0
    """The part of ``unsharded`` no gradient reaches (``frozen_params``): gathered under
    ZeRO-3 as the others are, never reduced."""


def local_shape(shape: tuple[int, ...], shard: ParamShard, tp: int, ep: int) -> list[int]:
    """The shape a rank holds after tensor and expert parallelism."""
    local = list(shape)
    if shard.tp_dim is not None and tp > 1:
        local[shard.tp_dim] //= tp
    if shard.ep_dim is not None and ep > 1:
        local[shard.ep_dim] //= ep
    return local


def chunk_elements(shape: list[int], ranks: int) -> int:
    """Elements of the first (largest) of ``ranks`` chunks along dimension 0."""
    if not shape:
        return 1
    if ranks == 1:
        return math.prod(shape)
    return math.ceil(shape[0] / ranks) * math.prod(shape[1:])


def stepped_elements(s: States, layout: Layout) -> float:
    """Parameter elements the rank's optimizer steps (the float32 master elements whose
    states ``s.optimizer`` counts; Adam's 4-byte step count per tensor, inside it, adds under
    one element per tensor)."""
    per = ADAM_MOMENTS if layout.zero >= 3 else state_bytes(layout.dtype, layout.states)[2]
    return s.optimizer / per


def expert_elements(graph: Graph, params: list[str], layout: Layout) -> int:
    """Elements one rank holds of the expert-stacked parameters among ``params``, split by
    tensor and expert parallelism, before data-parallel sharding: what their gradient is as
    per-expert pieces in the experts' backward (``torch_functional.experts`` unbinds each
    stack once and stacks the gradients at the end; ``ops_moe._experts_backward_temp``)."""
    plan = tp_plan(graph)
    return sum(math.prod(local_shape(tuple(graph.node(name).attrs["shape"]), plan[name],
                                     layout.tp, layout.ep))
               for name in params if plan[name].ep_dim is not None)


def add(a: States, b: States, sign: int = 1) -> States:
    """The states of two disjoint sets of parameters together (``sign`` -1: without b's)."""
    return States(a.weights + sign * b.weights, a.gradients + sign * b.gradients,
                  a.optimizer + sign * b.optimizer, a.unsharded + sign * b.unsharded,
                  a.expert_unsharded + sign * b.expert_unsharded,
                  a.frozen_unsharded + sign * b.frozen_unsharded)


NONE = States(0, 0, 0, 0)


def states(graph: Graph, params: list[str], layout: Layout) -> States:
    """Model-state bytes of the most loaded rank holding ``params`` (memoised per parameters
    and the layout's degrees: a search asks for the same layers many times)."""
    plan = tp_plan(graph)
    key = (tuple(params), layout.tp, layout.ep, layout.dp, layout.zero, layout.dtype,
           layout.states)
    memo: dict[Any, States] = graph.memo("parallel_states", dict)
    if key not in memo:
        memo[key] = _states(graph, params, layout, plan)
    return memo[key]


def _states(graph: Graph, params: list[str], layout: Layout, plan: dict[str, ParamShard]
            ) -> States:
    w16, grad_bytes, opt_bytes = state_bytes(layout.dtype, layout.states)
    weights = gradients = optimizer = unsharded = expert_unsharded = frozen_unsharded = 0
    # no gradient reaches these: torch leaves their .grad None and Adam keeps no state
    frozen = graph.memo("frozen_names", lambda: frozenset(p.name for p in frozen_params(graph)))
    for name in params:
        shard = plan[name]
        shape = local_shape(tuple(graph.node(name).attrs["shape"]), shard, layout.tp, layout.ep)
        full = math.prod(shape)
        ranks = layout.dp // layout.ep if shard.ep_dim is not None else layout.dp
        part = chunk_elements(shape, ranks)
        unsharded += full
        if shard.ep_dim is not None and layout.ep > 1:
            expert_unsharded += full
        if name in frozen:
            assert shard.ep_dim is None, name  # planner._dp_bytes counts it with dense ones
            weights += part * FP32 if layout.zero >= 3 else full * w16
            frozen_unsharded += full
            continue
        if layout.zero >= 3:
            weights += part * FP32  # the fp32 (master) shard is the parameter
            gradients += part * FP32  # FSDP2: the fp32 sharded parameter's gradient
            optimizer += part * ADAM_MOMENTS + STEP_BYTES
            continue
        weights += full * w16
        gradients += (part if layout.zero >= 2 else full) * grad_bytes
        optimizer += (part if layout.zero >= 1 else full) * opt_bytes + STEP_BYTES
    return States(weights, gradients, optimizer, unsharded, expert_unsharded, frozen_unsharded)
