"""``parallelize``: a ``to_torch`` module sharded by PyTorch's own engines, tensor parallelism
(``torch.distributed.tensor.parallel``) and FSDP2 (``torch.distributed.fsdp.fully_shard``),
the torchtitan recipe: tensor-parallel styles first, then ``fully_shard`` per layer module and
on the root.

The tensor-parallel plan is ``tfgraph.parallel.tp_plan``'s table turned into styles keyed by
module path, as Hugging Face's ``base_model_tp_plan`` and torchtitan's plans are (Megatron-LM,
Shoeybi et al. 2019, section 3: the projections that open a sublayer split by output rows,
``ColwiseParallel``; those that close it by input columns, ``RowwiseParallel``, whose output
is all-reduced; token tables and the head split by vocabulary rows):

- ``colwise`` linear: ``ColwiseParallel()``; ``rowwise``: ``RowwiseParallel()`` (its bias
  whole on every rank, added after the reduction);
- ``vocab`` token table: ``RowwiseParallel(input_layouts=Replicate())`` on the embedding;
  ``vocab`` head: ``ColwiseParallel(output_layouts=Replicate())`` (logits gathered), or
  with ``loss_parallel`` ``ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)``:
  the logits stay a vocabulary-split DTensor, for a cross-entropy computed under
  ``torch.distributed.tensor.parallel.loss_parallel()`` (Megatron's vocab-parallel
  cross-entropy, Shoeybi et al. 2019 section 3: no rank holds the whole logits; torchtitan's
  default);
- a tied head (``tie_output``: the head multiplies by the token table) reads the table's
  vocabulary-split rows that the embedding's ``RowwiseParallel`` made, the very parameter, so
  the weights stay tied and its two gradients accumulate on one tensor (Megatron keeps one
  weight for both on a stage). No style can own it: ``ColwiseParallel`` on a second module
  would register a new parameter (a copy). The head step computes what that style's forward
  does (``_TiedHead``): its input as a replicated DTensor (its gradient, a partial sum, is
  all-reduced: Megatron's f), the linear on the split rows (the logits split by vocabulary,
  ``Shard(-1)``), gathered or, with ``loss_parallel``, left split; the head's bias
  (head.bias) is cut by vocabulary rows with it (``ShardParameters``);
- ``experts_colwise`` / ``experts_rowwise`` stacked experts (E, hidden, d) / (E, d, hidden):
  each rank keeps its slice of every expert's hidden units (``ShardParameters``); the experts
  step reads the local slices, its input is copied to the ranks and its output summed over
  them (Megatron's f and g operators, as DTensor redistributions);
- ``replicate`` (norms, routers, position tables): whole on every rank;
- latent attention (Megatron-LM's MultiLatentAttention, DeepSeek-V3's inference code): its
  up-projections q_b / q and kv_b ``colwise``, o ``rowwise``, its down-projections q_a, kv_a
  and their norms replicated; the steps the placement (``tfgraph.parallel.placement``) keeps
  whole on every rank run unchanged, the per-head slices take the rank's heads, and the
  shared rotary key is copied to the ranks before each rank's heads repeat it
  (``_SharedHeadOnRanks``: its gradient, each rank's heads' share, is all-reduced).

The parallel styles convert tensors in the hooks of modules that are *called*; a plain
``to_torch`` module computes linears with ``F.linear`` on its parameters. ``parallelize``
therefore rewrites the steps of the modules it shards: a split linear's step calls its owner
(``LinearWeights``, an ``nn.Linear``), a split table's lookup its ``EmbeddingWeights``, and
every attention, rotary and per-head norm step gets the heads of one rank (``heads / tp``,
``kv_heads / tp``). An unparallelized module is untouched.

Sequence parallelism (``sp=True``, Korthikanti et al. 2022; ``torch_sequence_parallel``): the
activations between sublayers, which tensor parallelism leaves whole on every rank, are held
as each rank's sequence rows; norms run as ``SequenceParallel`` on their owner modules
(``NormWeights``), the opening projections read their input all-gathered once, the closing
ones are ``RowwiseParallel(output_layouts=Shard(1))`` (reduce-scatter), token tables output
the rank's rows, positions are the rank's own, and the output is gathered.

Expert parallelism (``ep`` > 1; ``torch_expert_parallel``, torchtitan's ``ExpertParallel``):
the routed experts cut by expert (``Shard(0)`` of the stacked weights) over ``ep`` of the
data-parallel ranks, each rank routing its own rows and sending each (token, expert) pair to
the rank holding the expert by all-to-all, and back; with FSDP2 and tp 1 only (``ep`` with
tensor parallelism, or without FSDP2, is refused with a TfgraphError).

Not done: tensor parallelism of ALiBi (BLOOM, MPT, Falcon-RW), T5's relative position bias
and full-width query/key norms (OLMo 2): refused with a TfgraphError, the refusal of the plan's
placement (``tfgraph.parallel.placement``), so ``tfgraph plan --tp`` refuses them in the same
words.

Initialisation after sharding: build on the meta device (``to_torch(graph, device="meta")``),
``parallelize``, then ``load_full_state_dict(module, device, full)``: storage allocated
(``to_empty``) and rank 0's full state dict (e.g. ``to_torch(graph, seed=0).state_dict()``)
scattered to the shards with ``set_model_state_dict(..., full_state_dict=True,
broadcast_from_rank0=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)

from tfgraph.errors import TfgraphError
from tfgraph.exporters.torch.expert_parallel import expert_parallel, shard_experts
from tfgraph.exporters.torch.module import (
    EmbeddingWeights,
    LinearWeights,
    TorchModel,
    _Program,
)
from tfgraph.exporters.torch.ops import NORM_OPS, TORCH_OPS
from tfgraph.exporters.torch.sequence_parallel import (
    sequence_parallel,
    sequence_parallel_plan,
    sequence_parallel_styles,
)
from tfgraph.graph.ir import Graph
from tfgraph.parallel.divisible import check_divisible, whole_on_every_rank
from tfgraph.parallel.placement import place
from tfgraph.parallel.tp_plan import tp_plan

__all__ = ["ShardParameters", "device_mesh", "load_full_state_dict", "module_tp_plan",
           "parallelize"]


class ShardParameters(ParallelStyle):
    """Each parameter of a module cut along ``dims[name]`` across the tensor-parallel ranks
    (a DTensor ``Shard(dim)``), with no input or output conversion: for stacked experts, whose
    step reads the local slices itself (``parallelize`` wraps it), and a tied head's bias.
    Only the module's own parameters change: its submodules are left as they are (the BERT
    head's transform, a plain replicated linear, is a submodule of the head that owns the
    bias). ``distribute_module`` would not do: it makes every submodule's remaining
    parameters replicated DTensors, which the submodules' plain steps cannot mix with
    tensors."""

    def __init__(self, dims: Mapping[str, int]) -> None:
        super().__init__()
        self.dims = dict(dims)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for leaf, param in list(module.named_parameters(recurse=False)):
            shard = distribute_tensor(param, device_mesh, [Shard(self.dims[leaf])],
                                      src_data_rank=self.src_data_rank)
            module.register_parameter(leaf, nn.Parameter(shard, param.requires_grad))
        return module


def device_mesh(device_type: str, tp: int = 1) -> DeviceMesh:
    """The (dp, tp) mesh over every process of the group: ``world / tp`` data-parallel
    replicas (or FSDP shards) of ``tp`` tensor-parallel ranks each, tp innermost (neighbouring
    ranks, the fast links; Narayanan et al. 2021, section 3.3). Needs an initialised process
    group; TfgraphError when ``tp`` does not divide the world size."""
    world = dist.get_world_size()
    if tp < 1 or world % tp:
        raise TfgraphError(f"--tp {tp} does not divide the {world} processes")
    return init_device_mesh(device_type, (world // tp, tp), mesh_dim_names=("dp", "tp"))


def module_tp_plan(module: TorchModel, loss_parallel: bool = False
                   ) -> dict[str, ParallelStyle]:
    """``tp_plan`` of the module's graph as parallel styles keyed by module path (see the
    module docstring; ``loss_parallel``: the vocabulary-split head's logits are left split);
    parameters that stay whole have no entry."""
    styles: dict[str, ParallelStyle] = {}
    shards = tp_plan(module.source_graph)
    experts: dict[str, dict[str, int]] = {}  # and a tied head's bias: (V,) cut by rows
    for name, shard in shards.items():
        path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(path)
        if shard.style == "colwise":
            styles[path] = ColwiseParallel()
        elif shard.style == "rowwise" and leaf == "weight":
            styles[path] = RowwiseParallel()
        elif shard.style == "vocab" and isinstance(owner, EmbeddingWeights):
            styles[path] = RowwiseParallel(input_layouts=Replicate())
        elif shard.style == "vocab" and isinstance(owner, LinearWeights):
            styles[path] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False) \
                if loss_parallel else ColwiseParallel(output_layouts=Replicate())
        elif shard.style in ("experts_colwise", "experts_rowwise", "vocab") \
                and shard.tp_dim is not None:  # "vocab": the bias beside a tied head
            experts.setdefault(path, {})[leaf] = shard.tp_dim
        elif shard.style != "replicate" and shard.style != "rowwise":
            raise TfgraphError(f"tensor parallelism of {name} ({shard.style}) is not "
                               "supported by parallelize")
    styles.update({path: ShardParameters(dims) for path, dims in experts.items()})
    return styles


def _check_tensor_parallel(graph: Graph, tp: int) -> None:
    """What this module cannot split: raise TfgraphError (see the module docstring). The
    refusals are the plan's placement's (``tfgraph.parallel.placement.place``), so that
    ``tfgraph plan --tp`` refuses exactly what ``parallelize`` refuses, in the same words:
    an op with ``tp_refused`` words (ALiBi, T5's relative position bias), a norm over the
    whole width of a split projection (OLMo 2's query/key norms)."""
    check_divisible(graph, tp=tp)
    place(graph)


def _copy_to_ranks(x: Tensor, mesh: DeviceMesh) -> Tensor:
    """Megatron's f: the same tensor on every tensor-parallel rank, gradients summed over
    the ranks in backward (each rank's gradient is a partial sum)."""
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(
        grad_placements=[Partial()])


def _sum_over_ranks(y: Tensor, mesh: DeviceMesh) -> Tensor:
    """Megatron's g: the sum of every rank's partial output (all-reduce), gradient passed
    through unchanged in backward."""
    return DTensor.from_local(y, mesh, [Partial()], run_check=False).redistribute(
        mesh, [Replicate()]).to_local()


class _CallOwner:
    """A linear or embedding step computed by calling its owner module (so the module's
    parallel-style hooks run); the parameter operands the program passes are not read."""

    def __init__(self, owner: nn.Module) -> None:
        self.owner = owner

    def __call__(self, module: nn.Module, attrs: dict[str, Any], *inputs: Any) -> Any:
        if isinstance(self.owner, LinearWeights):
            return self.owner(inputs[0])
        out = self.owner(inputs[1])
        pad = attrs.get("padding_idx")
        if pad is None or not torch.is_grad_enabled():
            return out
        table = self.owner.weight
        assert isinstance(table, Tensor)
        return _no_pad_gradient(out, inputs[1], pad, table)


def _no_pad_gradient(out: Tensor, ids: Tensor, pad: int, table: Tensor) -> Tensor:
    """The vocabulary-split lookup ``out`` (B, S, d), or with sequence parallelism this rank's
    rows of it (B, S / tp, d), with no gradient through the lookups of ``pad``: what
    ``F.embedding(..., padding_idx=pad)`` computes on a whole table (the split table's module
    takes no padding_idx: its rows are the rank's, the id a global one). Same forward."""
    keep = ids == pad  # (B, S)
    if out.shape[1] != keep.shape[1]:  # sequence parallelism: the rank's rows (Shard(1))
        mesh = table.device_mesh  # type: ignore[attr-defined]
        keep = keep.chunk(mesh.size(), dim=1)[mesh.get_local_rank()]
    return torch.where(keep[..., None], out.detach(), out)


class _TiedHead:
    """The output layer over a vocabulary-split tied token table (module docstring): what
    ``ColwiseParallel``'s forward computes, on the embedding's own parameter. Input: the
    hidden states every rank holds (a plain tensor, or with sequence parallelism the
    all-gathered replicated DTensor). Output: the logits split by vocabulary as a DTensor
    (``loss_parallel``) or gathered whole."""

    def __init__(self, step: Any, mesh: DeviceMesh, loss_parallel: bool) -> None:
        self.step, self.mesh, self.loss_parallel = step, mesh, loss_parallel

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor,
                 *params: Tensor) -> Tensor:
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, self.mesh, [Replicate()], run_check=False)
        logits: Tensor = self.step(module, attrs, x, *params)  # Shard(-1)
        if self.loss_parallel:
            return logits
        assert isinstance(logits, DTensor)
        return logits.redistribute(self.mesh, [Replicate()]).to_local()


class _ExpertsOverRanks:
    """The experts step on each rank's slice of the hidden units: input and routing weights
    copied to the ranks, the local experts' outputs summed over them."""

    def __init__(self, step: Any, mesh: DeviceMesh) -> None:
        self.step, self.mesh = step, mesh

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor, weights: Tensor,
                 *params: Tensor) -> Tensor:
        local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
        y = self.step(module, attrs, _copy_to_ranks(x, self.mesh),
                      _copy_to_ranks(weights, self.mesh), *local)
        return _sum_over_ranks(y, self.mesh)


class _NormOfLocalHeads:
    """A per-head norm (query/key norm: Qwen3, Gemma 3) on this rank's heads: its gain (one
    per head channel, replicated) is copied to the ranks (Megatron's f), so that its
    gradient, each rank's heads' share, is summed over the ranks in backward."""

    def __init__(self, step: Any, mesh: DeviceMesh) -> None:
        self.step, self.mesh = step, mesh

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor,
                 *params: Tensor) -> Tensor:
        out: Tensor = self.step(module, attrs, x,
                                *(_copy_to_ranks(p, self.mesh) for p in params))
        return out


def _grad_as_param(param: Tensor) -> None:
    """Keep a split parameter's gradient split as the parameter is: the vocabulary-split
    embedding's backward gives the whole table's gradient (``Replicate``) on every rank; this
    rank keeps its rows only (a local slice, no communication), as tp_plan counts. Under
    sequence parallelism a norm's replicated gain gets a ``Partial`` gradient (each rank's
    rows' share): redistributed to ``Replicate``, an all-reduce."""
    grad = param.grad
    if isinstance(param, DTensor) and isinstance(grad, DTensor) \
            and grad.placements != param.placements:
        param.grad = grad.redistribute(param.device_mesh, param.placements)


def _keep_gradients_split(module: nn.Module) -> None:
    """``_grad_as_param`` on every split parameter, registered at each forward on parameters
    not seen yet: ``to_empty`` and state-dict loading replace the parameter objects (and
    their hooks) after ``parallelize``. Not under FSDP, which reduce-scatters gradients into
    its own shards."""
    def register(mod: nn.Module, args: Any) -> None:
        for param in mod.parameters():
            if isinstance(param, DTensor) and not getattr(param, "_grad_kept_split", False):
                param.register_post_accumulate_grad_hook(_grad_as_param)
                param._grad_kept_split = True  # type: ignore[attr-defined]
    module.register_forward_pre_hook(register)


class _SharedHeadOnRanks:
    """Latent attention's key assembly on this rank's heads: the shared rotary key (operand
    b, whole on every rank) is copied to the ranks (Megatron's f), so that its gradient,
    the sum over this rank's heads only, is summed over the ranks in backward."""

    def __init__(self, step: Any, mesh: DeviceMesh) -> None:
        self.step, self.mesh = step, mesh

    def __call__(self, module: nn.Module, attrs: dict[str, Any], a: Tensor,
                 b: Tensor) -> Tensor:
        out: Tensor = self.step(module, attrs, a, _copy_to_ranks(b, self.mesh))
        return out


def _local_heads(attrs: dict[str, Any], tp: int) -> dict[str, Any]:
    """A step's attributes with one rank's heads (whole heads per rank: check_divisible);
    a per-head slice's ``groups`` (latent attention's slices of head-split tensors) too."""
    keys = ("heads", "kv_heads", "groups")
    return {k: v // tp if k in keys else v for k, v in attrs.items()}


def _rewrite_steps(program: _Program, split: set[int], mesh: DeviceMesh, tp: int,
                   loss_parallel: bool, whole: frozenset[str]) -> None:
    """Route split linears and token tables through their owners, compute a tied head on
    the split table (``_TiedHead``), run experts over the ranks, and give every step one
    rank's heads (``split``: ids of the modules the plan shards), but the steps the
    placement leaves whole on every rank (``whole``: latent attention's down-projection
    side, its one shared rotary-key head)."""
    by_slot = {slot: owner for slot, owner, _ in program.params}
    named = {slot: name for name, slot in program.slots.items()}
    for index, (fn, attrs, args, out, dead, inplace, inplace_args) in \
            enumerate(program.steps):
        if named.get(out) in whole:
            continue  # replicated: the whole computation on every rank
        owners = [by_slot[a] for a in args if a in by_slot and id(by_slot[a]) in split]
        if owners and fn is TORCH_OPS["linear"] and isinstance(owners[0], EmbeddingWeights):
            fn = _TiedHead(fn, mesh, loss_parallel)
        elif owners and (fn is TORCH_OPS["linear"] or fn is TORCH_OPS["embedding"]):
            fn = _CallOwner(owners[0])
        elif owners and fn is TORCH_OPS["experts"]:
            fn = _ExpertsOverRanks(fn, mesh)
        elif "heads" in attrs and any(fn is TORCH_OPS[op] for op in NORM_OPS):
            fn = _NormOfLocalHeads(fn, mesh)
        elif fn is TORCH_OPS["head_concat"] and attrs.get("shared", False):
            fn = _SharedHeadOnRanks(fn, mesh)
        if "heads" in attrs or "kv_heads" in attrs or fn is TORCH_OPS["head_slice"]:
            attrs = _local_heads(attrs, tp)
        program.steps[index] = (fn, attrs, args, out, dead, inplace, inplace_args)


def parallelize(module: TorchModel, mesh: DeviceMesh, tp: int = 1, fsdp: bool = True, *,
                ep: int = 1, mp_policy: MixedPrecisionPolicy | None = None,
                reshard_after_forward: bool = True, loss_parallel: bool = False,
                sp: bool = False) -> TorchModel:
    """Shard ``module`` (from ``to_torch``, on the meta device or any other) in place and
    return it.

    ``mesh``: a device mesh with dimension names "dp" and/or "tp" (``device_mesh``). ``tp``:
    the tensor-parallel degree, the size of ``mesh["tp"]`` (1: none). ``fsdp``: FSDP2
    ``fully_shard`` over ``mesh["dp"]``, per layer module then on the root, with
    ``mp_policy`` (e.g. bf16 parameters and float32 gradient reduction) and
    ``reshard_after_forward``. Postconditions: every parameter is held per rank as
    ``tfgraph.parallel.tp_plan`` says (cut on its ``tp_dim`` over the tp ranks; FSDP further
    cuts dim 0 over the dp ranks); forward and backward compute what the whole module
    computes on the same (per data-parallel rank) batch. TfgraphError when ``tp`` does not
    divide what it cuts, or the graph has a part that cannot be split (module docstring).
    ``ep`` > 1: expert parallelism over the data-parallel ranks (``torch_expert_parallel``;
    FSDP2 and tp 1 only): ``mesh["dp"]`` unflattened into ``(dp_mod_ep, ep)``, the routed
    experts cut by expert over "ep" and FSDP2-sharded over "dp_mod_ep", tokens exchanged by
    all-to-all; the experts' parameters are then held as ``tp_plan``'s ``ep_dim`` says.
    ``loss_parallel`` (tp > 1): a vocabulary-split head returns its logits as a DTensor split
    on the vocabulary (module docstring); the caller computes the cross-entropy and its
    backward under ``torch.distributed.tensor.parallel.loss_parallel()``. A tied head
    does the same over the token table's split rows (the weights stay tied).
    ``sp`` (tp > 1): sequence parallelism (``torch_sequence_parallel``, Korthikanti et al.
    2022): the residual stream between sublayers is held as each tp rank's sequence rows
    (norms by ``SequenceParallel``, all-gather before the column-parallel projections,
    reduce-scatter after the row-parallel ones); the output is whole on every rank.
    """
    if sp and tp <= 1:
        raise TfgraphError("sequence parallelism splits what tensor parallelism leaves "
                           "whole: it needs tp > 1")
    names = mesh.mesh_dim_names or ()
    experts_mesh = None
    if ep > 1:  # refuses tp > 1 and fsdp=False before anything is changed
        experts_mesh = expert_parallel(module, mesh, ep, tp, fsdp)
    if tp > 1:
        if "tp" not in names or mesh["tp"].size() != tp:
            raise TfgraphError(f"tp={tp} needs a mesh with a 'tp' dimension of size {tp}")
        _tensor_parallel(module, mesh["tp"], tp, loss_parallel, sp)
        if not fsdp:
            _keep_gradients_split(module)
    if fsdp:
        if "dp" not in names:
            raise TfgraphError("fsdp needs a mesh with a 'dp' dimension")
        dp_mesh = mesh["dp"]
        options: dict[str, Any] = {"mesh": dp_mesh,
                                   "reshard_after_forward": reshard_after_forward}
        if mp_policy is not None:
            options["mp_policy"] = mp_policy
        for layer in module.layers():
            if experts_mesh is not None:
                shard_experts(layer, experts_mesh, dp_mesh.size(), options)
            fully_shard(layer, **options)
        fully_shard(module, **options)
    return module


def _tensor_parallel(module: TorchModel, mesh: DeviceMesh, tp: int,
                     loss_parallel: bool = False, sp: bool = False) -> None:
    graph = module.source_graph
    _check_tensor_parallel(graph, tp)
    styles = module_tp_plan(module, loss_parallel)
    if sp:  # checked before anything is changed
        sequence = sequence_parallel_plan(graph)
        styles = sequence_parallel_styles(module, styles, sequence)
    split = {id(module.get_submodule(path)) for path in styles}
    whole = whole_on_every_rank(graph)
    parallelize_module(module, mesh, styles)
    for program in [module._program, *(layer._program for layer in module.layers())]:
        _rewrite_steps(program, split, mesh, tp, loss_parallel, whole)
    if sp:
        sequence_parallel(module, sequence, mesh, tp)


def load_full_state_dict(module: nn.Module, device: str | torch.device,
                         full: Mapping[str, Tensor]) -> None:
    """Allocate the (sharded, possibly meta) module's storage on ``device`` and fill every
    shard from rank 0's full state dict ``full`` (other ranks may pass ``{}``): the module then
    holds, per rank, its part of exactly those values. Collective: every rank calls it."""
    module.to_empty(device=device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(module, dict(full), options=options)
