"""Expert parallelism of ``to_torch`` mixture-of-experts modules (``parallelize(..., ep=N)``),
torchtitan's design (``torchtitan/distributed/expert_parallel.py``, ``ExpertParallel``):

- the stacked routed experts ((E, H, d) gate / up, (E, d, H) down) are cut along the expert
  axis, ``Shard(0)`` over the expert-parallel ranks: a rank holds E / ep whole experts;
- every rank routes its own tokens (router and everything outside the routed experts are
  replicated across the expert-parallel ranks, sharded by FSDP2 like any other parameter),
  sorts its (token, expert) pairs by expert and sends each rank the rows of the experts it owns
  with an all-to-all (``all_to_all_single_autograd``, the functional collective whose backward
  is the reverse all-to-all); the receiving rank regroups them by local expert, computes its
  experts, and a second all-to-all returns the rows, which the sender weights by their routing
  weights and sums at their tokens (DeepSpeed-MoE, Rajbhandari et al. 2022; GShard's dispatch
  and combine, Lepikhin et al. 2020). Dropless: no capacity factor, no token dropped or padded.

Ranks: expert parallelism uses the data-parallel ranks (DeepSpeed-MoE, torchtitan): each rank
its own batch rows, ``ep`` divides ``dp``: ``parallelize``'s ``mesh["dp"]`` is unflattened into
``(dp_mod_ep, ep)`` (``experts_mesh``). The routed experts are then FSDP2-sharded over
``dp_mod_ep`` (the ranks holding the same experts) with their gradients divided by the whole
``dp`` (each expert's gradient already sums the tokens of all ``ep`` ranks; torchtitan's
``set_gradient_divide_factor``); every other parameter is FSDP2-sharded over ``dp``.

Supported: ``ep`` > 1 with FSDP2 (``fsdp=True``) and ``tp`` = 1, any ``dp`` that ``ep``
divides. Refused with a TfgraphError: ``ep`` without FSDP2 (the gradients of the parameters
replicated over the data-parallel ranks would need an all-reduce outside FSDP2: not done),
``ep`` with tensor parallelism (torchtitan's expert tensor parallelism: not done), ``ep`` on a
model without routed experts, and ``ep`` that does not divide the experts or the
data-parallel ranks.

The all-to-all bytes each rank sends to the other ranks are counted in the dispatch and the
combine, forward and backward (``all_to_all_bytes``): the figure ``tfgraph plan`` predicts as
``step.comm_bytes.ep``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed._functional_collectives import (
    all_to_all_single,
    all_to_all_single_autograd,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from tfgraph.errors import TfgraphError
from tfgraph.exporters.torch.functional import expert_activation
from tfgraph.exporters.torch.module import LayerModule, TorchModel, _Program
from tfgraph.exporters.torch.ops import TORCH_OPS
from tfgraph.parallel.divisible import check_divisible

__all__ = ["ExpertParallel", "GroupedExperts", "all_to_all_bytes", "expert_parallel",
           "experts_mesh", "rank_experts", "shard_experts"]

COUNTED = ("dispatch_forward", "combine_forward", "dispatch_backward", "combine_backward")


def experts_mesh(mesh: DeviceMesh, ep: int) -> DeviceMesh:
    """``mesh["dp"]`` unflattened into ``(dp_mod_ep, ep)``: expert-parallel groups of ``ep``
    neighbouring data-parallel ranks, and across them the ranks holding the same experts
    (torchtitan's ParallelDims, "dp_shard_in_ep" there). TfgraphError when ``ep`` does not
    divide the data-parallel ranks."""
    dp = mesh["dp"].size()
    if dp % ep:
        raise TfgraphError(f"--ep {ep} must divide the {dp} data-parallel ranks (expert "
                           "parallelism uses data-parallel ranks)")
    return mesh["dp"]._unflatten(0, (dp // ep, ep), ("dp_mod_ep", "ep"))


class GroupedExperts(nn.Module):
    """The routed experts of one MoE layer as a called module (torchtitan's GroupedExperts):
    ``forward(routed, counts)`` with ``routed`` (n, d) rows sorted by expert, ``counts`` (E,)
    int64 rows per expert (summing to n) -> (n, d), each row through its expert's feed-forward
    (unweighted). Its children are the layer's ``gate`` (gated experts), ``up`` and ``down``
    scopes, whose ``weight`` parameters keep their names (``...ffn.experts.up.weight``).
    Expert-parallel: the weights are DTensors ``Shard(0)`` and this computes the local ones on
    the rows ``ExpertParallel`` dispatched. ``sent_bytes``: the all-to-all bytes counted."""

    def __init__(self, scope: nn.Module, activation: str, gated: bool) -> None:
        super().__init__()
        for name, child in scope.named_children():
            self.add_module(name, child)
        self.activation, self.gated = activation, gated
        self.sent_bytes = dict.fromkeys(COUNTED, 0)

    def _weights(self) -> list[Tensor]:
        names = ("gate", "up", "down") if self.gated else ("up", "down")
        params = [getattr(self, n).weight for n in names]
        return [p.to_local() if isinstance(p, DTensor) else p for p in params]

    def forward(self, routed: Tensor, counts: Tensor) -> Tensor:
        # each stacked weight split once: its gradient one stack, not one zero-filled stack
        # per expert added up (torch_functional.experts)
        *gate, up, down = (w.unbind(0) for w in self._weights())
        outputs = []
        # Every local expert runs, on no rows too: each gets a (zero) gradient, so the
        # stacked weights always have one (FSDP2 reduces the same tensors on every rank).
        for e, rows in enumerate(routed.split(counts.tolist())):
            if gate:
                h = expert_activation(F.linear(rows, gate[0][e]), self.activation) \
                    * F.linear(rows, up[e])
            else:
                h = expert_activation(F.linear(rows, up[e]), self.activation)
            outputs.append(F.linear(h, down[e]))
        return torch.cat(outputs)


@dataclass(frozen=True)
class _Ranks:
    """The expert-parallel mesh as ``ExpertParallel`` asks it: ``ep`` ranks, this one the
    first (under uniform routing every rank runs the same kernels)."""

    ep: int

    def size(self) -> int:
        return self.ep

    def get_local_rank(self) -> int:
        return 0


class ExpertParallel(ParallelStyle):
    """torchtitan's ``ExpertParallel`` on a :class:`GroupedExperts`: its weights ``Shard(0)``
    over the expert-parallel mesh; its input rows dispatched to the ranks owning their experts
    (all-to-all) and regrouped by local expert; its output rows put back in the sender's
    order and returned (the reverse all-to-all). Bytes sent to other ranks are added to the
    module's ``sent_bytes``."""

    def __init__(self) -> None:
        super().__init__()
        self.input_splits: list[int] = []
        self.output_splits: list[int] = []
        self.restore = torch.empty(0, dtype=torch.long)

    @staticmethod
    def _partition(name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for leaf, param in list(module.named_parameters(recurse=False)):
            shard = distribute_tensor(param, mesh, [Shard(0)])
            module.register_parameter(leaf, nn.Parameter(shard, param.requires_grad))

    def _dispatch(self, module: nn.Module, inputs: tuple[Tensor, Tensor],
                  mesh: DeviceMesh | _Ranks) -> tuple[Tensor, Tensor]:
        routed, counts = inputs
        ep, me = mesh.size(), mesh.get_local_rank()
        local_experts = counts.shape[0] // ep
        with torch.no_grad():  # rows per (source rank, local expert) this rank receives
            received = self._exchange_counts(counts, mesh)
            self.input_splits = counts.view(ep, local_experts).sum(1).tolist()
            grid = received.view(ep, local_experts)
            self.output_splits = grid.sum(1).tolist()
        rows = self._exchange_rows(routed, self.output_splits, self.input_splits, mesh)
        _count(module, "dispatch", rows, self.input_splits, self.output_splits, me)
        # Received rows are grouped by source rank, then expert; regroup by local expert.
        order = _expert_major(grid)
        self.restore = torch.empty_like(order)
        self.restore[order] = torch.arange(order.numel(), device=order.device)
        return rows[order], grid.sum(0)

    def _combine(self, module: nn.Module, output: Tensor, mesh: DeviceMesh | _Ranks) -> Tensor:
        back = output[self.restore]  # the received order: by source rank, then expert
        rows = self._exchange_rows(back, self.input_splits, self.output_splits, mesh)
        _count(module, "combine", rows, self.output_splits, self.input_splits,
               mesh.get_local_rank())
        return rows

    def _exchange_counts(self, counts: Tensor, mesh: DeviceMesh | _Ranks) -> Tensor:
        """The rows each rank sends to this one's experts, from their (E,) counts: (ep x
        E / ep,), by source rank, then local expert (an all-to-all of the counts)."""
        assert isinstance(mesh, DeviceMesh)
        received = all_to_all_single(counts, None, None, group=mesh.get_group())
        return torch.ops._c10d_functional.wait_tensor(received)

    def _exchange_rows(self, rows: Tensor, output_splits: list[int], input_splits: list[int],
                       mesh: DeviceMesh | _Ranks) -> Tensor:
        """The all-to-all of ``rows`` (``input_splits[r]`` of them to rank r; receiving
        ``output_splits[r]`` from rank r), its backward the reverse all-to-all."""
        assert isinstance(mesh, DeviceMesh)
        return all_to_all_single_autograd(rows, output_splits, input_splits, mesh.get_group())

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        return distribute_module(module, device_mesh, self._partition,
                                 input_fn=self._dispatch,  # type: ignore[arg-type]
                                 output_fn=self._combine)  # type: ignore[arg-type]


def _expert_major(grid: Tensor) -> Tensor:
    """Row indices that reorder rows laid out by (source rank, expert), ``grid[r, e]`` rows
    each, into (expert, source rank) order (a stable sort: rows keep their order within a
    block)."""
    ranks, local = grid.shape
    block = torch.repeat_interleave(torch.arange(ranks * local, device=grid.device),
                                    grid.flatten())  # each row's (r, e) block, r-major
    return ((block % local) * ranks + block // local).argsort(stable=True)


def _count(module: nn.Module, kind: str, received: Tensor, sent_splits: list[int],
           received_splits: list[int], me: int) -> None:
    """Add the rows this all-to-all sends to other ranks (forward) to ``module.sent_bytes``,
    and, when its output's gradient arrives, the rows its backward (the reverse all-to-all)
    sends to other ranks. Bytes: rows x row width x element size."""
    width, size = received.shape[-1], received.element_size()
    counted: dict[str, int] = module.sent_bytes  # type: ignore[assignment]
    counted[f"{kind}_forward"] += (sum(sent_splits) - sent_splits[me]) * width * size
    if received.requires_grad:
        def backward(grad: Tensor) -> None:
            off_rank = sum(received_splits) - received_splits[me]
            counted[f"{kind}_backward"] += off_rank * grad.shape[-1] * grad.element_size()
        received.register_hook(backward)


class _DispatchedExperts:
    """The experts step of an expert-parallel layer: the (token, expert) pairs sorted by
    expert, computed by calling the layer's :class:`GroupedExperts` (whose ``ExpertParallel``
    hooks dispatch and combine them), weighted by their routing weights and summed at their
    tokens, in the order ``torch_functional.experts`` adds them (expert by expert)."""

    def __init__(self, experts: Callable[[Tensor, Tensor], Tensor]) -> None:
        self.experts = experts

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor, weights: Tensor,
                 *params: Tensor) -> Tensor:
        flat = x.reshape(-1, x.shape[-1])  # (N, d)
        top_w, top_i = weights.reshape(-1, weights.shape[-1]).topk(attrs["top_k"], dim=-1)
        pair_expert = top_i.flatten()  # (N k,): pair p is token p // k's slot p % k
        order = pair_expert.argsort(stable=True)
        token = order // attrs["top_k"]
        counts = torch.bincount(pair_expert, minlength=weights.shape[-1])
        y = self.experts(flat[token], counts) * top_w.flatten()[order, None]
        return torch.zeros_like(flat).index_add_(0, token, y).reshape(x.shape)


class _Exchanged(torch.autograd.Function):
    """An all-to-all's result without the collective: a fresh (rows, ...) tensor, its
    backward a fresh gradient of the input's shape (no kernel: a collective is communication,
    which ``tfgraph plan`` times as ``step.comm_bytes.ep``)."""

    @staticmethod
    def forward(ctx: Any, sent: Tensor, rows: int) -> Tensor:
        ctx.shape = sent.shape
        return sent.new_empty((rows, *sent.shape[1:]))

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad.new_empty(ctx.shape), None


class _UniformExchange(ExpertParallel):
    """``ExpertParallel`` on one rank where every rank routes as this one does (uniform
    routing): each rank sends it the rows this rank's own counts give its experts, as many
    rows as it sends; the collectives are stand-ins (``_Exchanged``). The counts must hold
    their values (the census's ``UniformRouting`` gives them)."""

    def _exchange_counts(self, counts: Tensor, mesh: DeviceMesh | _Ranks) -> Tensor:
        ep, me = mesh.size(), mesh.get_local_rank()
        local = counts.shape[0] // ep
        mine = counts.tolist()[me * local:(me + 1) * local]
        return torch.tensor(mine * ep, dtype=counts.dtype, device=counts.device)

    def _exchange_rows(self, rows: Tensor, output_splits: list[int], input_splits: list[int],
                       mesh: DeviceMesh | _Ranks) -> Tensor:
        out: Tensor = _Exchanged.apply(rows, sum(output_splits))
        return out


def rank_experts(ep: int) -> Callable[..., Tensor]:
    """The experts step (``TORCH_OPS["experts"]``'s arguments: module, attributes, x, routing
    weights, then the stacked weights of this rank's E / ep experts) as one of ``ep``
    expert-parallel ranks runs it under uniform routing: ``_DispatchedExperts`` calling a
    :class:`GroupedExperts` of the local weights through ``ExpertParallel``'s dispatch and
    combine, the all-to-alls stand-ins (``_UniformExchange``). What
    ``tfgraph plan --kernels eager --ep N`` counts for a rank (exporters/torch/kernels.py)."""
    def step(module: nn.Module, attrs: dict[str, Any], x: Tensor, weights: Tensor,
             *params: Tensor) -> Tensor:
        scope = nn.Module()
        for name, param in zip(("gate", "up", "down") if attrs["gated"] else ("up", "down"),
                               params):
            holder = nn.Module()
            holder.weight = param  # the local stack itself (a plain attribute)
            scope.add_module(name, holder)
        grouped = GroupedExperts(scope, attrs["activation"], attrs["gated"])
        style, ranks = _UniformExchange(), _Ranks(ep)

        def dispatched(routed: Tensor, counts: Tensor) -> Tensor:
            rows, local_counts = style._dispatch(grouped, (routed, counts), ranks)
            return style._combine(grouped, grouped(rows, local_counts), ranks)
        return _DispatchedExperts(dispatched)(module, attrs, x, weights, *params)
    return step


def _experts_steps(module: TorchModel) -> Iterator[tuple[_Program, int, str]]:
    """(layer program, step index, owner path of the expert weights) of every experts step."""
    for layer in module.layers():
        program = layer._program
        slot_names = {slot: name for name, slot in program.slots.items()}
        for index, step in enumerate(program.steps):
            if step[0] is TORCH_OPS["experts"]:
                up = slot_names[step[2][-2]]  # ...ffn.experts.up.weight
                yield program, index, up.rsplit(".", 2)[0]


def expert_parallel(module: TorchModel, mesh: DeviceMesh, ep: int, tp: int, fsdp: bool
                    ) -> DeviceMesh:
    """Cut ``module``'s routed experts by expert over ``ep`` data-parallel ranks of ``mesh``
    (the (dp, tp) mesh of ``parallelize``; see the module docstring) and route its experts
    steps through the dispatch; returns the ``(dp_mod_ep, ep)`` mesh (for ``shard_experts``).
    TfgraphError, before anything is changed, for what is not supported."""
    graph = module.source_graph
    if not fsdp:
        raise TfgraphError(f"ep={ep} runs under FSDP2 (fsdp=True): the parameters outside "
                           "the experts are sharded over the data-parallel ranks")
    if tp > 1:
        raise TfgraphError(f"ep={ep} with tensor parallelism (tp={tp}) is not supported")
    if "dp" not in (mesh.mesh_dim_names or ()):
        raise TfgraphError(f"ep={ep} needs a mesh with a 'dp' dimension (device_mesh)")
    steps = list(_experts_steps(module))
    if not steps:
        raise TfgraphError(f"ep={ep}: {graph.name} has no routed experts")
    check_divisible(graph, ep=ep)
    ep_mesh = experts_mesh(mesh, ep)
    for program, index, path in steps:
        fn, attrs, args, out, dead, inplace, inplace_args = program.steps[index]
        parent_path, _, leaf = path.rpartition(".")
        parent = module.get_submodule(parent_path)
        grouped = GroupedExperts(parent.get_submodule(leaf), attrs["activation"],
                                 attrs["gated"])
        parent.add_module(leaf, grouped)  # same children: parameter names unchanged
        parallelize_module(grouped, ep_mesh["ep"], ExpertParallel())
        program.steps[index] = (_DispatchedExperts(grouped), attrs, args, out, dead, inplace,
                                inplace_args)
    return ep_mesh


def shard_experts(layer: LayerModule, ep_mesh: DeviceMesh, dp: int, options: dict[str, Any]
                  ) -> None:
    """FSDP2 ``fully_shard`` (with ``options`` but the mesh) of the layer's expert modules
    over ``ep_mesh["dp_mod_ep"]`` (the ranks holding the same experts), their gradients
    divided by the whole data-parallel size ``dp`` (torchtitan: an expert's gradient already
    sums the tokens of the ``ep`` ranks, and each rank's loss is a mean over its own rows).
    Call before ``fully_shard(layer)``."""
    mesh = ep_mesh["dp_mod_ep"]
    for sub in layer.modules():
        if isinstance(sub, GroupedExperts):
            fully_shard(sub, **{**options, "mesh": mesh})
            assert isinstance(sub, FSDPModule)
            sub.set_gradient_divide_factor(float(dp))
            if mesh.size() > 1 and dist.get_backend(mesh.get_group()) == "gloo":
                # gloo has no PREMUL_SUM (NCCL's scaled sum): sum, then divide. Not on one
                # rank, where FSDP2 divides without a collective (torch 2.13 would divide
                # twice: that copy, then the post-divide of the forced sum).
                sub.set_force_sum_reduction_for_comms(True)


def all_to_all_bytes(module: nn.Module) -> dict[str, int]:
    """The all-to-all bytes this rank sent to the other expert-parallel ranks since the
    module was parallelized, by kind (dispatch / combine, forward / backward) and ``total``,
    summed over the MoE layers."""
    sums = dict.fromkeys(COUNTED, 0)
    for sub in module.modules():
        if isinstance(sub, GroupedExperts):
            for kind in COUNTED:
                sums[kind] += sub.sent_bytes[kind]
    return {**sums, "total": sum(sums.values())}
