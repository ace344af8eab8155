"""Sequence parallelism of ``to_torch`` modules under tensor parallelism:
``parallelize(module, mesh, tp=..., sp=True)`` (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 4.2.2).

Tensor parallelism (Shoeybi et al. 2019) leaves the residual stream whole on every
tensor-parallel rank: norms, residual adds and dropout are computed ``tp`` times over the same
(B, S, d) values, and each rank keeps them all for backward. Sequence parallelism cuts those
values along the sequence axis instead, rank r holding rows ``r S/tp .. (r+1) S/tp - 1``
(a DTensor ``Shard(1)`` over the tensor-parallel ranks, kept between steps as its local
tensor, as torchtitan does), and replaces each sublayer's all-reduce with an all-gather before
it and a reduce-scatter after it (Korthikanti et al., figure 5: g and g-bar), the same bytes.
What runs where, all of it PyTorch's machinery (``torch.distributed.tensor`` redistributions
and ``torch.distributed.tensor.parallel`` styles):

- the token embedding outputs a sequence shard: a vocabulary-split table by
  ``RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))`` (reduce-scatter); a
  replicated one (a table the plan does not split: a segment table) looks up every row,
  then keeps its rows
  (``Replicate -> Shard(1)``, no communication; backward all-gathers the gradient);
- norms on the stream run on the local rows through their owner module (``NormWeights``) with
  ``SequenceParallel(use_local_output=True)``: their gain and bias become replicated DTensors,
  so the gradient each rank computes from its rows is a ``Partial`` sum that PyTorch reduces
  (``parallelize``'s gradient hook without FSDP2, FSDP2's own redistribution with it);
- residual adds, scaling, dropout, activations and other element-wise steps run on the local
  rows; an operand that is still whole (a routed experts' output, a small gate) is cut to the
  rank's rows first (``Replicate -> Shard(1)``);
- the projections that open a sublayer (``ColwiseParallel``: q, k, v; up, gate; a
  vocabulary-split head) read their input all-gathered once per value and program (the
  ``PrepareModuleInput`` torchtitan puts before attention and feed-forward): a replicated
  DTensor shared by q, k and v, so in backward their partial input gradients are summed and
  reduce-scattered once;
- the projections that close it (o, down) are ``RowwiseParallel(output_layouts=Shard(1))``:
  their partial sums are reduce-scattered to the rank's rows;
- every other step that reads a sequence shard (a router, routed experts, a replicated
  head) reads it all-gathered (a plain tensor; its gradient, equal on every rank, is cut back
  to the rank's rows), and the model's outputs are all-gathered: the final norm runs on the
  local rows and the head gathers.

Saved for backward: an all-gathered value that a step saves (a projection's input) is kept as
the rank's rows and all-gathered again when backward first needs it, once for all its readers
(Korthikanti et al., section 4.2.2; ``_SavingRows``: saved-tensor hooks around the readers,
which pass what they keep through any hooks active around the module), so a rank keeps 1/t of
every activation between sublayers: one more all-gather per sublayer in backward. Whole on
every rank, as without sp: the token ids, the labels and the loss's 0-d total weight (the
embedding's and the loss's backward read every row); a router's scores and the routed experts'
tokens, outputs and indices (they read the stream all-gathered). What a rank keeps is then
``tfgraph plan --sp``'s per-rank activations, which count by the same rule
(``tfgraph.parallel.sequence_plan``), plus the rotary cos/sin tables (whole, as without sp;
not in the plan at all); tests/test_sequence_parallel.py measures it.

Positions: learned and sinusoidal position tables added in the sharded region add the rows of
the rank's own positions (the whole-sequence rows, then this rank's; a learned table's
gradient is all-gathered, so every rank sees the one-process gradient); rotary tables are
built for the whole sequence (rotary applies to q and k after the all-gather).

Refused with a TfgraphError (one line, with the reason): graphs that take an attention mask,
position ids or a KV cache (sequence parallelism is for full-sequence training graphs), a row
parallel projection whose input is a sequence shard, and, at run time, a sequence length
``tp`` does not divide (a DTensor built from local shards assumes even shards).

Not done: dropout masks in the sharded region are drawn per rank (each rank its own rows), so
with dropout > 0 a run differs from one process, as it does under tensor parallelism alone;
routed experts read an all-gathered input and their all-reduced output is then cut to the
rank's rows (an all-reduce where a reduce-scatter would do); the router reads the stream
all-gathered too, where Megatron-LM routes each rank's rows (its replicated weight would need
a gradient reduction like the norms'), so its scores are whole on every rank (few bytes: the
experts per token); an encoder output read by every decoder layer's cross-attention is
all-gathered once per layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
)

from tfgraph.errors import TfgraphError
from tfgraph.exporters.torch import functional as tf
from tfgraph.exporters.torch.module import NormWeights, TorchModel, _CallLayer, _pick, _Program
from tfgraph.exporters.torch.ops import rope_tables_step
from tfgraph.parallel.sequence_plan import (  # the rule the planner counts by too
    ELEMENTWISE_OPS,
    SequencePlan,
    sequence_parallel_plan,
)
from tfgraph.parallel.tp_plan import tp_plan

__all__ = ["ELEMENTWISE_OPS", "SequencePlan", "sequence_parallel", "sequence_parallel_plan",
           "sequence_parallel_styles"]


def sequence_parallel_styles(module: TorchModel, styles: Mapping[str, ParallelStyle],
                             plan: SequencePlan) -> dict[str, ParallelStyle]:
    """``styles`` (``module_tp_plan``: module path -> style) changed for sequence
    parallelism: row-parallel projections and vocabulary-split tables output the rank's
    sequence rows (``output_layouts=Shard(1)``, a reduce-scatter), and every norm on the
    sharded stream gets ``SequenceParallel``."""
    graph = module.source_graph
    out = dict(styles)
    for name, how in plan.kind.items():
        node = graph.node(name)
        if how == "norm":
            out[node.inputs[1].rpartition(".")[0]] = SequenceParallel(use_local_output=True)
        elif how == "rowwise":
            out[node.inputs[1].rpartition(".")[0]] = RowwiseParallel(output_layouts=Shard(1))
        elif how == "embedding":
            path = node.inputs[0].rpartition(".")[0]
            if isinstance(styles.get(path), RowwiseParallel):  # a vocabulary-split table
                out[path] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    return out


# ---- conversions between the rank's rows and the whole sequence (DTensor redistributions) --

def _gather(x: Tensor, mesh: DeviceMesh, keep_dtensor: bool) -> Tensor:
    """The whole sequence from every rank's rows (all-gather along axis 1). ``keep_dtensor``:
    a replicated DTensor (its partial gradients are reduce-scattered in backward); else a
    plain tensor whose gradient, the same on every rank, is cut to the rank's rows."""
    whole = DTensor.from_local(x, mesh, [Shard(1)], run_check=False).redistribute(
        mesh, [Replicate()])
    return whole if keep_dtensor else whole.to_local()


def _rows_of_rank(x: Tensor, mesh: DeviceMesh, dim: int) -> Tensor:
    """This rank's rows along ``dim`` of ``x``, which every rank holds whole (no
    communication; backward all-gathers the gradient). A copy, so that the whole ``x`` can be
    freed."""
    local = DTensor.from_local(x, mesh, [Replicate()], run_check=False).redistribute(
        mesh, [Shard(dim)]).to_local()
    shared = local.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    return local.clone(memory_format=torch.contiguous_format) if shared else local


def _whole_sequence_like(x: Tensor, tp: int) -> Tensor:
    """A tensor shaped like the whole sequence of the rank's rows ``x`` (axis 1 times ``tp``)
    with x's dtype and device, for steps that read only a length from their operand; nothing
    is stored (one element, broadcast)."""
    return x.new_empty(()).expand(x.shape[0], x.shape[1] * tp, *x.shape[2:])


# ---- the steps that replace or wrap a program's steps ---------------------------------------

class _RowsToGatherAgain:
    """What autograd keeps of an all-gathered value that a step saves for backward: the
    rank's rows, all-gathered again when backward first needs the value and dropped after
    its last saved use (Korthikanti et al. 2022, section 4.2.2: the input of the first
    projection is stored sequence-split and all-gathered again in backward, so a rank keeps
    1/t of every activation between sublayers)."""

    def __init__(self, rows: Tensor, whole: Tensor, mesh: DeviceMesh) -> None:
        self.rows, self.mesh = rows.detach(), mesh
        self.dtensor = isinstance(whole, DTensor)
        local = whole._local_tensor if isinstance(whole, DTensor) else whole
        self.storage, self.numel = local.untyped_storage().data_ptr(), local.numel()
        self.pending = 0  # saved uses not unpacked yet
        self.whole: Tensor | None = None

    def holds(self, t: Tensor) -> bool:
        """Whether ``t`` is the whole value or a view of all of it (a linear saves its input
        flattened to (B*S, d))."""
        local = t._local_tensor if isinstance(t, DTensor) else t
        return isinstance(t, DTensor) == self.dtensor and local.is_contiguous() \
            and local.storage_offset() == 0 and local.numel() == self.numel \
            and local.untyped_storage().data_ptr() == self.storage

    def again(self, rows: Tensor, shape: torch.Size) -> Tensor:
        """The whole value (viewed as ``shape``), all-gathered from ``rows`` on the first
        call of a backward; the last pending use drops it."""
        if self.whole is None:
            with torch.no_grad():
                self.whole = _gather(rows, self.mesh, keep_dtensor=self.dtensor)
        whole = self.whole.view(shape)
        self.pending -= 1
        if self.pending <= 0:
            self.whole = None
        return whole


class _Gather:
    """A step all-gathering one value (``keep_dtensor``: as a replicated DTensor). The
    latest call's ``rows`` lets the readers' ``_SavingRows`` keep the rank's rows."""

    def __init__(self, mesh: DeviceMesh, keep_dtensor: bool) -> None:
        self.mesh, self.keep_dtensor = mesh, keep_dtensor
        self.rows: _RowsToGatherAgain | None = None

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor) -> Tensor:
        whole = _gather(x, self.mesh, self.keep_dtensor)
        self.rows = _RowsToGatherAgain(x, whole, self.mesh)
        return whole


class _RowsOfRank:
    """A step keeping this rank's rows of a value every rank holds whole."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.mesh = mesh

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor) -> Tensor:
        return _rows_of_rank(x, self.mesh, 1)


def _outer_hooks() -> tuple[Any, Any] | None:
    """The saved-tensor hooks active around a step (a measurement, an offload to the host),
    which ``_SavingRows`` passes what it keeps through; torch has no public accessor, so its
    private one, and None where it is absent."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    hooks: tuple[Any, Any] | None = top(False) if top is not None else None
    return hooks


class _SavingRows:
    """A step reading all-gathered values (``gathers``' latest), computed with saved-tensor
    hooks that keep, of each such value autograd saves, only the rank's rows
    (``_RowsToGatherAgain``); other saved tensors are kept as they are. Hooks active
    around the step still see every tensor kept (the rows instead of the whole value)."""

    def __init__(self, step: Any, gathers: list[_Gather]) -> None:
        self.step, self.gathers = step, gathers
        self.last_reader_of: list[_Gather] = []  # their rows are forgotten after this step

    def __call__(self, module: nn.Module, attrs: dict[str, Any], *inputs: Any) -> Any:
        tokens = [g.rows for g in self.gathers if g.rows is not None]
        outer = _outer_hooks()
        outer_pack = outer[0] if outer is not None else (lambda t: t)
        outer_unpack = outer[1] if outer is not None else (lambda t: t)

        def pack(t: Tensor) -> Any:
            for token in tokens:
                if token.holds(t):
                    token.pending += 1
                    return token, t.shape, outer_pack(token.rows)
            return None, None, outer_pack(t)

        def unpack(saved: Any) -> Tensor:
            token, shape, payload = saved
            if token is None:
                kept: Tensor = outer_unpack(payload)
                return kept
            whole: Tensor = token.again(outer_unpack(payload), shape)
            return whole

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = self.step(module, attrs, *inputs)
        for gather in self.last_reader_of:
            gather.rows = None  # autograd holds them where they were saved
        return out


class _ThenRows:
    """A step (a replicated table's lookup) computed whole, then cut to the rank's rows."""

    def __init__(self, step: Any, mesh: DeviceMesh) -> None:
        self.step, self.mesh = step, mesh

    def __call__(self, module: nn.Module, attrs: dict[str, Any], *inputs: Any) -> Tensor:
        return _rows_of_rank(self.step(module, attrs, *inputs), self.mesh, 1)


class _CallNorm:
    """A norm step computed by calling its ``NormWeights`` owner (``SequenceParallel``'s
    hooks: the input taken as the rank's rows, the parameters replicated DTensors); the
    parameter operands the program passes are not read."""

    def __init__(self, owner: NormWeights) -> None:
        self.owner = owner

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor,
                 *params: Tensor) -> Tensor:
        out: Tensor = self.owner(x)
        return out


class _PositionsOfRank:
    """Learned or sinusoidal positions added to the rank's rows ``x``: the whole sequence's
    position rows, then this rank's (a learned table's gradient all-gathered in backward)."""

    def __init__(self, op: str, mesh: DeviceMesh, tp: int) -> None:
        self.op, self.mesh, self.tp = op, mesh, tp

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor,
                 *table: Tensor) -> Tensor:
        whole = _whole_sequence_like(x, self.tp)
        if self.op == "positions_learned":
            rows = tf.learned_positions(whole, table[0], attrs.get("offset", 0))  # (S, d)
        else:
            rows = tf.sinusoidal_positions(whole.shape[1], x.shape[2], x.device, x.dtype,
                                           attrs.get("layout", "interleaved"))  # (S, d)
        return x + _rows_of_rank(rows, self.mesh, 0)


class _WholeSequenceTables:
    """Rotary cos/sin tables for the whole sequence of the rank's rows ``x`` (rotary applies
    to q and k after the all-gather)."""

    def __init__(self, tp: int) -> None:
        self.tp = tp

    def __call__(self, module: nn.Module, attrs: dict[str, Any], x: Tensor
                 ) -> tuple[Tensor, Tensor]:
        return rope_tables_step(module, attrs, _whole_sequence_like(x, self.tp))


# ---- rewriting the programs -----------------------------------------------------------------

def _rewrite_program(program: _Program, module: TorchModel, plan: SequencePlan,
                     mesh: DeviceMesh, tp: int, top: bool) -> None:
    """Rewrite ``program``'s steps (already rewritten for tensor parallelism) as the plan
    says, adding the all-gathers and row cuts as steps of their own, each computed once per
    value and freed after its last reader; ``top``: the model's own program (its outputs are
    all-gathered)."""
    graph = module.source_graph
    shards = tp_plan(graph)
    names = {slot: name for name, slot in program.slots.items()}
    steps: list[Any] = []
    converted: dict[tuple[str, int], int] = {}

    gathers: dict[int, _Gather] = {}  # all-gathered value's slot -> its step

    def convert(how: str, slot: int) -> int:
        if (how, slot) not in converted:
            new = program.slot(f"#{how}:{names[slot]}")
            names[new] = f"#{how}:{names[slot]}"
            fn: Any = _RowsOfRank(mesh)
            if how != "rows":
                fn = gathers[new] = _Gather(mesh, keep_dtensor=how == "gather_dtensor")
            steps.append((fn, {}, (slot,), new, (), None, ()))
            converted[how, slot] = new
        return converted[how, slot]

    def is_sharded(slot: int) -> bool:
        return names[slot] in plan.sharded

    for step in program.steps:
        fn, attrs, args, out, dead, inplace, inplace_args = step
        how = plan.kind.get(names[out])
        new_args = args
        if isinstance(fn, _CallLayer) or fn is _pick:
            pass  # a layer's inputs and outputs stay as they are; the layer converts them
        elif fn is rope_tables_step and is_sharded(args[0]):
            fn = _WholeSequenceTables(tp)
        elif how == "embedding":
            table = graph.node(names[out]).inputs[0]
            if shards[table].style != "vocab":  # replicated: looked up whole, rows kept
                fn = _ThenRows(fn, mesh)
        elif how == "norm":
            node = graph.node(names[out])
            owner = module.get_submodule(node.inputs[1].rpartition(".")[0])
            assert isinstance(owner, NormWeights)
            fn = _CallNorm(owner)
        elif how == "positions":
            fn = _PositionsOfRank(graph.node(names[out]).op, mesh, tp)
        elif how == "elementwise":
            new_args = tuple(a if is_sharded(a) else convert("rows", a) for a in args)
        elif how == "colwise":
            new_args = (convert("gather_dtensor", args[0]), *args[1:])
        elif how == "gathered":
            new_args = tuple(convert("gather", a) if is_sharded(a) else a for a in args)
        if how in ("colwise", "gathered"):
            fn = _SavingRows(fn, [gathers[a] for a in dict.fromkeys(new_args) if a in gathers])
        if new_args != args or fn is not step[0]:
            inplace, inplace_args = None, ()  # not the plan's step or operands any more
        steps.append((fn, attrs, new_args, out, dead, inplace, inplace_args))
    if top:
        program.outputs = [convert("gather", o) if is_sharded(o) else o
                           for o in program.outputs]
    program.steps = _free_conversions(steps, set(converted.values()), set(program.outputs))
    for slot, gather in gathers.items():
        readers = [step[0] for step in program.steps if slot in step[2]]
        if readers and isinstance(readers[-1], _SavingRows):
            readers[-1].last_reader_of.append(gather)


def _free_conversions(steps: list[Any], temporaries: set[int], outputs: set[int]
                      ) -> list[Any]:
    """``steps`` with every temporary slot (an all-gathered value or the rank's rows) freed
    after its last reader, unless it is an output."""
    last: dict[int, int] = {}
    for index, step in enumerate(steps):
        for slot in (*step[2], *step[6]):
            if slot in temporaries:
                last[slot] = index
    for slot, index in last.items():
        if slot not in outputs:
            fn, attrs, args, out, dead, inplace, inplace_args = steps[index]
            steps[index] = (fn, attrs, args, out, (*dead, slot), inplace, inplace_args)
    return steps


def _check_sequence_lengths(tp: int) -> Any:
    """A forward pre-hook refusing a sequence length ``tp`` does not divide."""
    def check(module: nn.Module, args: tuple[Any, ...]) -> None:
        for x in args:
            if isinstance(x, Tensor) and x.dim() >= 2 and x.shape[1] % tp:
                raise TfgraphError(f"sequence parallelism: tp {tp} does not divide the "
                                   f"sequence length {x.shape[1]}")
    return check


def sequence_parallel(module: TorchModel, plan: SequencePlan, mesh: DeviceMesh,
                      tp: int) -> None:
    """Rewrite the module's programs for sequence parallelism, after ``parallelize_module``
    applied ``sequence_parallel_styles`` and the tensor-parallel step rewrite
    (``torch_parallel._rewrite_steps``). ``mesh``: the tensor-parallel mesh of ``tp`` ranks.
    Postcondition: forward computes what the whole module computes, its output whole on
    every rank; sequence lengths must be multiples of ``tp`` (TfgraphError otherwise)."""
    _rewrite_program(module._program, module, plan, mesh, tp, top=True)
    for layer in module.layers():
        _rewrite_program(layer._program, module, plan, mesh, tp, top=False)
    module.register_forward_pre_hook(_check_sequence_lengths(tp))
