"""``tfgraph plan``: what one rank holds, computes and sends in a training step of a layout.

Every figure is summed from the graph's per-op costs (``tfgraph.parallel.units``), divided as
the layout divides them:
- weights, gradients, optimizer: ``tfgraph.parallel.memory`` over the parameters of the stage;
- activations: the bytes each unit keeps for backward (split ones / t, whole ones / t with
  sequence parallelism, replicated ones whole: ``units.Unit.saved``; full recompute keeps a
  layer's inputs only) times the micro-batches a stage holds in flight (``layout.in_flight``):
  under 1F1B stage i of p keeps min(p - i, m) (Narayanan et al. 2021 §2.2: the first stage
  keeps p); interleaved, Megatron-LM's warm-up plus the chunk running, in stage fractions;
- temporary: what exists only for a moment at the peak: the logits' gradient at the start of
  backward (last stage), one layer rebuilt by full recompute or (the larger of the two) one
  MoE layer's expert weight gradients, held per expert until they are stacked, in 16-bit,
  ZeRO-3's gathered 16-bit weights of two layers (the one running and the one prefetched)
  and the unsharded gradients of one;
- step FLOPs: model FLOPs forward + backward (README: backward = 2 x forward less the
  gradients nothing asks for, ``tfgraph.passes.gradients``) for the global batch; useful
  FLOPs the same with the scores a causal mask or window skips left out (``useful_flops``);
  hardware FLOPs what the timed kernels run (``timing``: fused attention the scores kept,
  its backward 2.5x; explicit attention every score), with what recompute runs again
  (selective: the attention cores; full: the layers' forward);
- communication, bytes each rank sends per step with ring collectives (an all-reduce of n
  bytes over k ranks sends 2 n (k - 1) / k, a reduce-scatter or an all-gather n (k - 1) / k):
  tp the forward and backward all-reduces of every layer (with sequence parallelism the same
  volume as reduce-scatter + all-gather; full recompute's rerun forward repeats the forward
  ones) and the vocabulary reductions; dp the gradients (ZeRO 0 all-reduce; 1 reduce-scatter
  + all-gather of weights, once a step; 2 the same but the reduce-scatter every micro-batch,
  its 1/d gradient shard unable to accumulate full gradients (DeepSpeed ZeRO-2, FSDP
  SHARD_GRAD_OP); 3 weights
  gathered in forward and backward and gradients reduce-scattered, every micro-batch); pp the
  activation and its gradient over each stage boundary, and the gradient of a table tied
  across stages (the token embedding on the first, the head on the last: Megatron-LM's
  embedding group) all-reduced among the stages holding it once a step (as the rank keeps it:
  whole under ZeRO 0-1, its 1/d shard under ZeRO 2-3); ep the token exchange of every MoE
  layer (dispatch and combine, forward and backward, again in full recompute's forward);
- time: ``tfgraph.parallel.timing`` (each op's time from its FLOPs and bytes at the GPU's
  achievable rates, the collectives from bytes, links and latency, the overlap rules, the 1F1B
  or interleaved schedule); every assumption is in the plan's ``assumptions``. MFU = useful
  FLOPs / (GPUs x peak x time) (``MFU``).

Stages hold contiguous layers, ``layout.stage_counts`` of them (given, or balanced); a stage
of i keeps ``layout.in_flight`` micro-batches for backward (interleaved: Megatron-LM's warm-up).

Precondition: the graph lints; ``layout.check`` passes. Postcondition: nothing is cached on
the graph but its units (memoised); a plain JSON-ready dict is returned.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import sympy

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import DTYPE_BYTES, SYMBOLS, Graph
from tfgraph.parallel.arguments import check_gpu, check_graph
from tfgraph.parallel.formulas import plan_formulas
from tfgraph.parallel.gpus import Gpu, check_dtype
from tfgraph.parallel.host import host_bound
from tfgraph.parallel.layout import (Layout, check, encoder_decoder, experts, in_flight,
                                     stage_counts, state_bytes)
from tfgraph.parallel.memory import NONE, States, add, expert_elements, states
from tfgraph.parallel.timing import (EXPLICIT_ATTENTION, KernelSource, assumptions,
                                     explicit_attention, step_time)
from tfgraph.parallel.tp_plan import tp_plan
from tfgraph.parallel.units import Unit, sequence_plan, units
from tfgraph.passes.effective import at_sizes
from tfgraph.passes.figures import STEP_NOTE, states_note

_NUMBERS = ("saved_none_split", "saved_none_whole", "saved_none_replicated", "saved_sel_split",
            "saved_sel_whole", "saved_sel_replicated", "inputs", "flops_split", "flops_whole",
            "flops_replicated", "bwd_less_split", "bwd_less_whole", "bwd_less_replicated",
            "tp", "tp_forward", "vocab_reduce", "a2a",
            "output_grad")


@dataclass(frozen=True)
class UnitNumbers:
    """A unit's figures at one micro-batch size and length (per micro-batch, unsplit)."""

    values: dict[str, int]

    def __getitem__(self, key: str) -> int:
        return self.values[key]


def _evaluate(unit: Unit, form: str, sizes: dict[sympy.Symbol, int]) -> UnitNumbers:
    exprs = {
        "saved_none_split": unit.saved[(form, "none")][0],
        "saved_none_whole": unit.saved[(form, "none")][1],
        "saved_none_replicated": unit.saved[(form, "none")][2],
        "saved_sel_split": unit.saved[(form, "selective")][0],
        "saved_sel_whole": unit.saved[(form, "selective")][1],
        "saved_sel_replicated": unit.saved[(form, "selective")][2],
        "inputs": unit.inputs, "flops_split": unit.flops_split,
        "flops_whole": unit.flops_whole, "flops_replicated": unit.flops_replicated,
        "bwd_less_split": unit.backward_less[0], "bwd_less_whole": unit.backward_less[1],
        "bwd_less_replicated": unit.backward_less[2],
        "tp": unit.tp_forward + unit.tp_backward, "tp_forward": unit.tp_forward,
        "vocab_reduce": unit.vocab_reduce,
        "a2a": unit.a2a, "output_grad": unit.output_grad,
    }
    return UnitNumbers({k: int(sympy.sympify(v).xreplace(sizes)) for k, v in exprs.items()})


def unit_numbers(graph: Graph, micro_batch: int, seq: int, form: str,
                 target: int | None = None) -> list[UnitNumbers]:
    """Every unit evaluated at (micro-batch, seq and an encoder-decoder's ``target`` length,
    default seq); identical units evaluated once."""
    tgt = seq if target is None else target
    table: dict[tuple[int, int, str, int], list[UnitNumbers]] = graph.memo("parallel_numbers",
                                                                           dict)
    key = (micro_batch, seq, form, tgt)
    if key not in table:
        sizes = {SYMBOLS["B"]: micro_batch, SYMBOLS["S"]: seq, SYMBOLS["T"]: tgt}
        seen: dict[tuple[Any, ...], UnitNumbers] = {}
        out = []
        for unit in units(graph)[0]:
            sig = (tuple(unit.saved[(form, r)] for r in ("none", "selective")), unit.inputs,
                   unit.flops_split, unit.flops_whole, unit.flops_replicated,
                   unit.backward_less, unit.attention_flops, unit.tp_forward,
                   unit.tp_backward, unit.vocab_reduce, unit.a2a, unit.output_grad)
            if sig not in seen:
                seen[sig] = _evaluate(unit, form, sizes)
            out.append(seen[sig])
        table[key] = out
    return table[key]


def stages(graph: Graph, counts: tuple[int, ...]) -> list[list[int]]:
    """Unit indices of each pipeline stage: layers in contiguous groups of ``counts`` (one per
    stage); the ops outside layers go with the next layer (the embeddings with the first, the
    decoder's embedding with the first decoder layer) or, after the last layer, with the last
    stage (memoised)."""
    table: dict[tuple[int, ...], list[list[int]]] = graph.memo("parallel_stage_units", dict)
    if counts not in table:
        table[counts] = _stages(graph, counts)
    return table[counts]


def _stages(graph: Graph, counts: tuple[int, ...]) -> list[list[int]]:
    all_units = units(graph)[0]
    pp = len(counts)
    layer_ids = [i for i, u in enumerate(all_units) if u.is_layer]
    owner = [s for s, n in enumerate(counts) for _ in range(n)]
    stage_of_layer = {idx: owner[pos] for pos, idx in enumerate(layer_ids)}
    out: list[list[int]] = [[] for _ in range(pp)]
    for i, unit in enumerate(all_units):
        if unit.is_layer:
            out[stage_of_layer[i]].append(i)
        else:
            following = [stage_of_layer[j] for j in layer_ids if j > i]
            out[following[0] if following else pp - 1].append(i)
    return out


@dataclass(frozen=True)
class StageMembers:
    """A stage's units folded into groups of identical ones (same parameter shapes and
    splits, same cost expressions): (a representative unit index, how many)."""

    groups: tuple[tuple[int, int], ...]
    shared: tuple[str, ...]
    """Parameters read by two of its units (a tied table): counted once."""


def _signature(graph: Graph, unit: Unit) -> tuple[Any, ...]:
    shapes = tuple(tuple(graph.node(p).attrs["shape"]) for p in unit.params)
    plan = tp_plan(graph)
    exprs = (tuple(sorted(unit.saved.items())), unit.inputs, unit.flops_split,
             unit.flops_whole, unit.flops_replicated, unit.backward_less,
             unit.attention_flops, unit.tp_forward,
             unit.tp_backward, unit.vocab_reduce, unit.a2a, unit.output_grad,
             unit.output_grad_split, unit.is_layer)
    return shapes, tuple(plan[p] for p in unit.params), exprs


def stage_members(graph: Graph, counts: tuple[int, ...]) -> list[StageMembers]:
    """``stages`` with identical units folded (memoised per layer counts)."""
    table: dict[tuple[int, ...], list[StageMembers]] = graph.memo("parallel_stages", dict)
    if counts not in table:
        all_units = units(graph)[0]
        sigs: dict[tuple[Any, ...], int] = {}
        rep = [sigs.setdefault(_signature(graph, u), i) for i, u in enumerate(all_units)]
        out = []
        for members in stages(graph, counts):
            tally: dict[int, int] = {}
            seen: set[str] = set()
            shared: list[str] = []
            for i in members:
                tally[rep[i]] = tally.get(rep[i], 0) + 1
                shared += [p for p in all_units[i].params if p in seen]
                seen.update(all_units[i].params)
            out.append(StageMembers(tuple(tally.items()), tuple(shared)))
        table[counts] = out
    return table[counts]


def _ring(nbytes: float, ranks: int, reduce: bool) -> float:
    """Bytes one rank sends in a ring all-reduce (reduce) or all-gather / reduce-scatter."""
    if ranks <= 1:
        return 0.0
    return (2.0 if reduce else 1.0) * nbytes * (ranks - 1) / ranks


def tied_across(graph: Graph, counts: tuple[int, ...]) -> list[tuple[tuple[int, tuple[str, ...]],
                                                                    ...]]:
    """Per stage, the parameters it shares with other stages (a tied table: the token
    embedding on the first stage, the output head on the last; an encoder-decoder's decoder
    embedding too), grouped by how many stages hold them: ((stages, parameters), ...)
    (memoised per layer counts)."""
    table: dict[tuple[int, ...], list[tuple[tuple[int, tuple[str, ...]], ...]]] = graph.memo(
        "parallel_tied", dict)
    if counts not in table:
        all_units = units(graph)[0]
        held = [{p for i in members for p in all_units[i].params}
                for members in stages(graph, counts)]
        holders: dict[str, int] = {}
        for names in held:
            for name in names:
                holders[name] = holders.get(name, 0) + 1
        out = []
        for names in held:
            groups: dict[int, list[str]] = {}
            for name in sorted(names):
                if holders[name] > 1:
                    groups.setdefault(holders[name], []).append(name)
            out.append(tuple((k, tuple(v)) for k, v in sorted(groups.items())))
        table[counts] = out
    return table[counts]


@dataclass(frozen=True)
class StageFigures:
    stage: int
    states: States
    activations: int
    temporary: int
    comm: dict[str, float]
    tied: tuple[tuple[int, int], ...] = ()
    """(stages, gradient bytes) of the parameters the stage shares with other stages, all-reduced
    among those stages once the backward is done (Megatron-LM's embedding group)."""

    @property
    def total(self) -> int:
        s = self.states
        return s.weights + s.gradients + s.optimizer + self.activations + self.temporary


def _times(a: States, k: int) -> States:
    return States(a.weights * k, a.gradients * k, a.optimizer * k, a.unsharded * k,
                  a.expert_unsharded * k, a.frozen_unsharded * k)


def _stage(graph: Graph, layout: Layout, index: int, members: StageMembers,
           numbers: list[UnitNumbers], boundary: int) -> StageFigures:
    all_units = units(graph)[0]
    t, p, m = layout.tp, layout.pp, layout.microbatches
    sp_div = t if layout.sp else 1
    model_states = NONE
    saved = temporary = 0
    tp_bytes = a2a = 0.0
    rebuilt = 0
    pieces = 0  # an MoE layer's expert weight gradients, per expert until stacked
    per_unit_params: list[int] = []
    sel = "sel" if layout.recompute == "selective" else "none"
    for i, count in members.groups:
        unit, n = all_units[i], numbers[i]
        unit_states = states(graph, unit.params, layout)
        model_states = add(model_states, _times(unit_states, count))
        kept = -(-n[f"saved_{sel}_split"] // t) - (-n[f"saved_{sel}_whole"] // sp_div) \
            + n[f"saved_{sel}_replicated"]
        if layout.recompute == "full" and unit.is_layer:
            rebuilt = max(rebuilt, n["saved_none_split"] // t + n["saved_none_whole"] // sp_div
                          + n["saved_none_replicated"])
            kept = n["inputs"] // sp_div
        saved += kept * count
        # full recompute reruns a layer's forward, collectives included (Megatron-LM's
        # CheckpointFunction): its forward all-reduces and its two all-to-alls once more
        full = layout.recompute == "full" and unit.is_layer
        rerun = n["tp_forward"] if full else 0
        tp_bytes += (_ring(n["tp"] + rerun, t, True) + _ring(n["vocab_reduce"], t, True)) \
            * m * count
        a2a += (6 if full else 4) * _ring(n["a2a"], layout.ep, False) * m * count
        if n["output_grad"]:
            temporary += n["output_grad"] // (t if unit.output_grad_split else 1) * count
        per_unit_params += [unit_states.unsharded] * min(count, 2)
        pieces = max(pieces, expert_elements(graph, unit.params, layout))
    if members.shared:  # a tied table read by two units of the stage is held once
        model_states = add(model_states, states(graph, list(members.shared), layout), -1)
    w16 = 2 if layout.dtype != "float32" else 4
    dp_bytes = _dp_bytes(layout, model_states, w16)
    if layout.zero >= 3 and layout.dp > 1:
        largest = sorted(per_unit_params)[-2:]
        temporary += sum(largest) * w16 + largest[-1] * 4
    temporary += max(rebuilt, pieces * w16)  # (rebuilt in forward, pieces at backward's end)
    pp_bytes = 2.0 * boundary * m * layout.vpp if p > 1 else 0.0  # staged: vpp 1 here
    comm = {"tp": tp_bytes, "dp": dp_bytes, "pp": pp_bytes, "ep": a2a}
    return StageFigures(index, model_states, saved, temporary, comm)


def _dp_bytes(layout: Layout, s: States, w16: int) -> float:
    """Data-parallel bytes one rank sends per step: the dense parameters over all d ranks, the
    expert-parallel ones over the d / ep ranks that hold the same experts. Gradients are
    reduced at the bytes they are kept in (``layout.state_bytes``; ZeRO-3's are fp32)."""
    d, m = layout.dp, layout.microbatches
    grad_bytes = 4 if layout.zero >= 3 else state_bytes(layout.dtype, layout.states)[1]
    total = 0.0
    # a parameter no gradient reaches (memory.frozen_params; not split by experts) is neither
    # reduced nor, left unchanged by the optimizer, gathered after it; ZeRO-3 gathers it to run
    frozen = s.frozen_unsharded
    for elements, ranks, fixed in ((s.unsharded - s.expert_unsharded, d, frozen),
                                   (s.expert_unsharded, d // layout.ep, 0)):
        grads = (elements - fixed) * grad_bytes
        if layout.zero == 0:
            total += _ring(grads, ranks, True)
        elif layout.zero in (1, 2):
            # ZeRO 2 keeps 1/d of the gradients, so each micro-batch's are reduce-scattered as
            # its backward makes them (DeepSpeed ZeRO-2 reduces every micro-step; FSDP
            # SHARD_GRAD_OP every backward): m times; ZeRO 1 accumulates full ones, reduced once
            times = m if layout.zero == 2 else 1
            total += times * _ring(grads, ranks, False) + _ring((elements - fixed) * w16, ranks,
                                                                False)
        else:
            total += m * (2 * _ring(elements * w16, ranks, False) + _ring(grads, ranks, False))
    return total


_STAGE_MEMO = 20_000
"""Layouts whose stage figures a graph keeps memoised (``staged``) before starting afresh."""


@dataclass(frozen=True)
class Staged:
    """A layout's stages, evaluated: what ``plan`` reports and ``search`` ranks from."""

    numbers: list[UnitNumbers]
    counts: tuple[int, ...]
    folded: list[StageMembers]
    figures: list[StageFigures]
    boundaries: list[float]

    @property
    def worst(self) -> StageFigures:
        return max(self.figures, key=lambda f: f.total)

    def time(self, graph: Graph, layout: Layout, gpu: Gpu, attention: str,
             kernels: KernelSource | None = None) -> dict[str, Any]:
        """``timing.step_time`` of these stages."""
        return step_time(graph, layout, gpu, attention, self.folded, self.figures,
                         self.boundaries, kernels)


def staged(graph: Graph, layout: Layout, attention: str = "fused") -> Staged:
    """Every stage's figures of ``layout`` (refusing what ``plan`` refuses)."""
    check_graph(graph, layout)
    check(graph, layout)
    if attention not in ("fused", "unfused"):
        raise TfgraphError(f"attention must be fused or unfused, got {attention!r}")
    all_units, placement, refusal = units(graph)
    if layout.tp > 1 and placement is None:
        raise TfgraphError(refusal or "tensor parallelism is not possible for this graph")
    if layout.sp and sequence_plan(graph)[0] is None:
        raise TfgraphError(f"--sp: {sequence_plan(graph)[1]}")
    numbers = unit_numbers(graph, layout.micro_batch, layout.seq, attention, layout.target)
    counts = stage_counts(graph, layout)
    groups = stages(graph, counts)
    folded = stage_members(graph, counts)
    sp_div = layout.tp if layout.sp else 1
    figures = []
    boundaries = []
    # stages with the same units and boundary have the same figures but for the micro-batches
    # they keep in flight: evaluated once (a deep pipeline's middle stages), and once for the
    # interleaving degrees of a layout (vpp only multiplies the pipeline sends; a search tries
    # several: memoised on the graph, bounded; keyed by the attention form too, whose saved
    # bytes differ: fused then unfused on one graph must not share a stage)
    memo: dict[tuple[Layout, str], dict[tuple[StageMembers, int], StageFigures]] = graph.memo(
        "parallel_stage_figures", dict)
    if len(memo) > _STAGE_MEMO:
        memo.clear()
    plain = layout if layout.vpp == 1 else replace(layout, vpp=1)
    alike = memo.setdefault((plain, attention), {})  # (the layout hashed once, not per stage)
    shared = tied_across(graph, counts)
    # this layout's stages of one kind (units, boundary, tied tables): one comm dict for all
    kinds: dict[tuple[StageMembers, int, Any], tuple[StageFigures, tuple[tuple[int, int], ...],
                                                      dict[str, float]]] = {}
    for index in range(layout.pp):
        # what crosses into the next stage: the next stage's first unit's inputs
        boundary = 0
        if index + 1 < layout.pp:
            boundary = numbers[groups[index + 1][0]]["inputs"] // sp_div
        boundaries.append(float(boundary))
        kind = (folded[index], boundary, shared[index])
        if kind not in kinds:
            key = (folded[index], boundary)
            if key not in alike:
                alike[key] = _stage(graph, plain, index, folded[index], numbers, boundary)
            one = alike[key]  # activations of one micro-batch in flight, plain 1F1B's sends
            # a table tied across stages: its gradient (as the rank keeps it: whole under
            # ZeRO 0-1, the rank's 1/d shard under ZeRO 2-3) all-reduced among the k stages
            # holding it, once a step after the backward (Megatron-LM's finalize_model_grads,
            # embedding group)
            tied = tuple((k, states(graph, list(names), layout).gradients)
                         for k, names in shared[index])
            sends = one.comm["pp"] * layout.vpp + sum(_ring(b, k, True) for k, b in tied)
            kinds[kind] = (one, tied, {**one.comm, "pp": sends})
        one, tied, comm = kinds[kind]
        figures.append(StageFigures(index, one.states,
                                    int(one.activations * in_flight(layout, index)),
                                    one.temporary, comm, tied))
    return Staged(numbers, counts, folded, figures, boundaries)


def plan(graph: Graph, layout: Layout, gpu: Gpu, attention: str = "fused",
         evaluated: Staged | None = None, kernels: KernelSource | None = None
         ) -> dict[str, Any]:
    """The plan of ``layout`` on ``gpu`` (see the module docstring): per-rank memory of the
    most loaded rank, the step's FLOPs, communication, bubble, time and MFU. ``evaluated``:
    ``staged(graph, layout, attention)`` when the caller has it already; ``kernels``: time the
    eager kernels it gives (``--kernels eager``, ``exporters.torch.kernels``) instead of one
    kernel per op."""
    check_graph(graph, layout)
    gpu = check_gpu(gpu)
    check_dtype(gpu, layout.dtype)
    found = evaluated or staged(graph, layout, attention)
    numbers, counts, folded = found.numbers, found.counts, found.folded
    figures = found.figures
    worst = max(figures, key=lambda f: f.total)
    tp_stage = max(figures, key=lambda f: f.comm["tp"]).stage
    forward = sum(n["flops_split"] + n["flops_whole"] + n["flops_replicated"]
                  for n in numbers)
    less = sum(n["bwd_less_split"] + n["bwd_less_whole"] + n["bwd_less_replicated"]
               for n in numbers)
    sequences = layout.global_batch // layout.micro_batch
    # forward + backward: 3 x forward less the gradients nothing asks for (the report's
    # flops.train_step; tfgraph.passes.gradients)
    model_flops = (3 * forward - less) * sequences
    useful = useful_flops(graph, layout)
    timing = found.time(graph, layout, gpu, attention, kernels)
    hardware = timing.pop("hardware_flops")  # what the timed kernels run, recompute's too
    peak = gpu.fp32_flops if layout.dtype == "float32" else gpu.peak_flops
    time_s = timing["time_s"]
    timing["mfu"] = useful / (layout.gpus * peak * time_s) if time_s > 0 else 0.0
    timing["tokens_per_s"] = layout.global_batch * layout.seq / time_s if time_s > 0 else 0.0
    timing["host_bound"] = host_bound(layout, timing["time_parts"], max(counts))
    mem = worst.states
    return {
        "layout": layout.as_dict(),
        "gpu": gpu.name,
        "attention": attention,
        "kernels": "graph" if kernels is None else "eager",
        "per_rank": {
            "stage": worst.stage,
            "memory": {"weights": mem.weights, "gradients": mem.gradients,
                       "optimizer": mem.optimizer, "activations": worst.activations,
                       "temporary": worst.temporary, "total": worst.total},
            "fits": worst.total <= gpu.memory,
            "gpu_memory": gpu.memory,
        },
        "stages": [{"stage": f.stage, "layers": n, "total": f.total,
                    "activations": f.activations, "weights": f.states.weights}
                   for f, n in zip(figures, counts)],
        "step": {
            "flops": model_flops,
            "useful_flops": useful,
            "hardware_flops": hardware,
            "comm_bytes": {k: int(max(f.comm[k] for f in figures)) for k in
                           ("tp", "dp", "pp", "ep")},
            **timing,
        },
        "model_states": _states_note(layout),
        "assumptions": {"gpu": _gpu_assumptions(gpu, layout.dtype),
                        **assumptions(layout, kernels, bool(experts(graph)),
                                      encoder_decoder(graph)),
                        **({"explicit_attention": EXPLICIT_ATTENTION}
                           if explicit_attention(graph) else {}),
                        "mfu": MFU},
        **plan_formulas(graph, layout, attention, folded, worst.stage, tp_stage),
    }


MFU = ("MFU = useful FLOPs / (GPUs x peak x time); useful FLOPs (step.useful_flops): "
       "report's train_step_effective over the global batch, forward + backward with the "
       "scores a causal mask or sliding window skips left out (a causal query's keys "
       "j <= i: T(T+1)/2 scores, FlashAttention's convention, Dao 2023; Narayanan et al. "
       "2021 and Korthikanti et al. 2022 count them whole, which FlashAttention does not "
       "run: past 100% at long sequences); step.flops is the dense count (report's "
       "train_step); hardware FLOPs what the timed kernels run (fused attention: the "
       "scores kept, backward 2.5x; explicit matmuls: every score; recompute's again), "
       "so MFU <= hardware FLOPs / (GPUs x peak x time) <= 1")
"""What MFU's numerator counts (``assumptions``, the footnote)."""


def useful_flops(graph: Graph, layout: Layout) -> int:
    """The step's useful model FLOPs: ``passes.effective``'s train_step_effective (dense but
    for the attention scores masks skip) at the layout's micro-batch and length, times the
    sequences of the global batch (the MFU's numerator, ``MFU``)."""
    table: dict[tuple[int, int], int] = graph.memo("parallel_useful_flops", dict)
    key = (layout.micro_batch, layout.seq)
    if key not in table:  # a search asks for a few sizes many times
        sizes = {SYMBOLS["B"]: layout.micro_batch, SYMBOLS["S"]: layout.seq,
                 SYMBOLS["T"]: layout.seq}
        table[key] = int(at_sizes(graph, sizes)["flops"]["train_step_effective"])
    return table[key] * (layout.global_batch // layout.micro_batch)


def _states_note(layout: Layout) -> str:
    """The bytes per parameter the plan's model states count (``tfgraph report``'s
    convention, figures.STATES), ZeRO-3's fp32 shards apart."""
    note = states_note(DTYPE_BYTES[layout.dtype], layout.states)
    if layout.zero >= 3:
        note += (" With --zero 3 (FSDP2) the sharded parameter is the fp32 master and its "
                 "gradient fp32: 4 + 4 + 8 = 16, the 16-bit copy temporary.")
    return note + STEP_NOTE


def _gpu_assumptions(gpu: Gpu, dtype: str) -> str:
    """The GPU's rates the time rests on (``tfgraph.parallel.gpus``, each cited there)."""
    peak = gpu.fp32_flops if dtype == "float32" else gpu.peak_flops
    kind = "fp32/TF32" if dtype == "float32" else "16-bit"
    attention = ("at FlashAttention-2's measured rate by head dim, length and mask"
                 if gpu.flash_measured else f"{gpu.attention_fraction:.0%}")
    return (f"{gpu.name}: peak {peak / 1e12:g} TFLOP/s ({kind}), "
            f"GEMMs up to {gpu.matmul_fraction:.0%} of it (MAMF) on {gpu.sms} SMs, fused "
            f"attention {attention}, memory {gpu.bandwidth / 1e12:g} TB/s at "
            f"{gpu.memory_fraction:.0%} streaming, memory-bound kernels at "
            f"{gpu.kernel_share:.0%} of that, element-wise {gpu.vector_flops / 1e12:g} TFLOP/s, "
            f"{gpu.link} at {gpu.intra_node / 1e9:g} GB/s inside {gpu.per_node} GPUs, "
            f"{gpu.network / 1e9:g} GB/s per GPU between nodes ({gpu.nics or gpu.per_node} "
            f"NICs of {gpu.inter_node / 1e9:g} GB/s a node)")
