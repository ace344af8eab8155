"""A parallel layout: how many GPUs do what (``tfgraph plan`` options), checked against a graph.

GPUs = tp x pp x dp. Expert parallelism takes its ranks from the data-parallel ones (as
Megatron-LM and DeepSpeed-MoE do): ``ep`` divides ``dp``, each expert-parallel group holds every
expert once. A step takes ``global_batch`` sequences: each data-parallel rank runs
``global_batch / (dp * micro_batch)`` micro-batches through the pipeline (1F1B schedule,
Narayanan et al. 2021 §2.2; interleaved with ``vpp`` model chunks per stage, §2.2.2).

Pipeline stages need not hold equal layer counts: ``stage_layers`` gives them, else
``balanced_stages`` splits the layers (equal when pp divides them; otherwise the first stage,
which also looks up the embeddings, and the last, which also runs the head and the loss, get
one layer fewer, as Llama 3 405B's 126 layers ran on 16 stages, Dubey et al. 2024 §3.3.2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import DTYPE_BYTES, Graph
from tfgraph.graph.lengths import check_lengths
from tfgraph.graph.ops import OPS
from tfgraph.parallel.divisible import check_divisible
from tfgraph.passes import figures

Recompute = Literal["none", "selective", "full"]
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")
GradReduce = Literal["overlap", "after"]
GRAD_REDUCE: tuple[GradReduce, ...] = ("overlap", "after")
# Bytes per parameter of (weights, gradients, optimizer) by training precision and model-state
# convention (``--states``, the same in ``tfgraph report``: tfgraph.passes.figures.STATES,
# whose functions compute them).
# 16-bit mixed precision keeps 16-bit weights, an fp32 master copy and Adam's two fp32 moments
# (4 + 8 = 12 optimizer bytes) and either
# - "mixed" (the default): 16-bit gradients, 2 + 2 + 12 = 16 bytes (Rajbhandari et al. 2020,
#   ZeRO §3.1: "16 bytes" per parameter; DeepSpeed; what report has always counted), or
# - "megatron": fp32 gradients (Megatron-LM's main_grad), 2 + 4 + 12 = 18 bytes (Korthikanti
#   et al. 2022 §4; Narayanan et al. 2021 §3.4).
# fp32 training keeps 4 + 4 + 8 under either.
STATE_BYTES: dict[str, tuple[int, int, int]] = {
    dtype: figures.state_bytes(DTYPE_BYTES[dtype]) for dtype in ("bfloat16", "float16", "float32")
}
"""The default ("mixed") convention's bytes by training precision."""
DTYPES = tuple(STATE_BYTES)
STATES = figures.STATES


def state_bytes(dtype: str, states: str) -> tuple[int, int, int]:
    """(weights, gradients, optimizer) bytes per parameter of ``dtype`` training under the
    ``states`` convention (see STATES)."""
    return figures.state_bytes(DTYPE_BYTES[dtype], states)


@dataclass(frozen=True)
class Layout:
    """One way to spread training over GPUs."""

    tp: int = 1
    """Tensor-parallel ranks (Megatron column/row splits inside each layer)."""
    pp: int = 1
    """Pipeline stages (contiguous layers per stage, 1F1B schedule)."""
    vpp: int = 1
    """Model chunks per pipeline stage: > 1 is interleaved 1F1B (Narayanan et al. 2021
    §2.2.2; every stage's layer count a multiple of it, micro-batches a multiple of pp)."""
    stage_layers: tuple[int, ...] | None = None
    """Layers of each pipeline stage (None: ``balanced_stages``)."""
    dp: int = 1
    """Data-parallel replicas."""
    ep: int = 1
    """Expert-parallel ranks, taken from the data-parallel ones (MoE only)."""
    zero: int = 0
    """0 replicated states; 1 optimizer states sharded over dp (Megatron's distributed
    optimizer); 2 gradients too; 3 weights too (FSDP)."""
    sp: bool = False
    """Sequence parallelism: the activations tensor parallelism leaves whole are split along
    the sequence (Korthikanti et al. 2022 §4.2.2)."""
    recompute: Recompute = "none"
    micro_batch: int = 1
    global_batch: int = 1
    seq: int = 2048
    """Sequence length: an encoder-decoder's source length (S)."""
    tgt_seq: int | None = None
    """An encoder-decoder's target length (T; None: ``seq``). Only an encoder-decoder takes
    it: a decoder-only or encoder-only model has one sequence."""
    dtype: str = "bfloat16"
    """Training precision: bfloat16/float16 mixed precision or float32."""
    states: str = "mixed"
    """Model-state convention of 16-bit training (``STATES``): "mixed" 16-bit gradients (16
    bytes per parameter), "megatron" fp32 gradients (18)."""
    grad_reduce: GradReduce = "overlap"
    """When ZeRO 0-2 reduce the gradients over the data-parallel ranks: "overlap" bucket by
    bucket under the last micro-batch's backward (PyTorch DDP, Megatron-LM's
    ``overlap_grad_reduce``; ZeRO 2 under every micro-batch's: ``timing._dp_exposed``),
    "after" in one pass once the backward has finished (Megatron-LM's ``--DDP-impl local``,
    its default until 2023: ``train_step`` calls ``allreduce_gradients`` after
    ``forward_backward_func``), all of it exposed."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def target(self) -> int:
        """The target length T an encoder-decoder is planned at: ``tgt_seq``, else ``seq``."""
        return self.seq if self.tgt_seq is None else self.tgt_seq

    @property
    def microbatches(self) -> int:
        """Micro-batches per data-parallel rank per step (m)."""
        return self.global_batch // (self.dp * self.micro_batch)

    def as_dict(self) -> dict[str, Any]:
        out = {**asdict(self), "gpus": self.gpus, "microbatches": self.microbatches}
        if self.stage_layers is not None:
            out["stage_layers"] = list(self.stage_layers)
        return out


def balanced_stages(layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage when none are given: ``layers // pp`` each, the remainder one more on
    the middle stages first, then on the last, then on the first (the first and last stages
    also hold the embeddings and the head)."""
    base, extra = divmod(layers, pp)
    counts = [base] * pp
    order = list(range(1, pp - 1)) + ([pp - 1, 0] if pp > 1 else [0])
    for i in order[:extra]:
        counts[i] += 1
    return tuple(counts)


def stage_counts(graph: Graph, layout: Layout) -> tuple[int, ...]:
    """The layout's layers per stage."""
    if layout.stage_layers is not None:
        return tuple(layout.stage_layers)
    return balanced_stages(pipeline_units(graph), layout.pp)


def in_flight(layout: Layout, stage: int) -> float:
    """Micro-batches of its layers a stage keeps for backward at its peak: 1F1B, stage i of p
    keeps min(p - i, m) (Narayanan et al. 2021 §2.2.1); interleaved with v chunks, Megatron-LM's
    warm-up of (p - i - 1) x 2 + (v - 1) x p chunk passes plus the one running, each chunk 1/v
    of the stage's layers: ((p - i - 1) x 2 + (v - 1) x p + 1) / v, at most m.

    Megatron-LM's ``forward_backward_pipelining_with_interleaving`` runs that many chunk
    forwards (its ``microbatch_group_size_per_vp_stage`` at its default, p), capped at the m x v
    it has, then one forward and one backward per step: the warm-up plus one are alive when the
    first backward frees one. (Older releases ran every forward first when m equals p, every stage
    then holding m.)"""
    p, m, v = layout.pp, layout.microbatches, layout.vpp
    if v == 1:
        return min(p - stage, m)
    return min(((p - stage - 1) * 2 + (v - 1) * p + 1) / v, m)


def pipeline_units(graph: Graph) -> int:
    """Layers the pipeline divides into stages (every stack's layers)."""
    return graph.memo("pipeline_units", lambda: len(
        {(n.meta.stack, n.meta.layer) for n in graph.ops() if n.meta.layer is not None}))


def experts(graph: Graph) -> int:
    """Routed experts per MoE layer (0 for a dense model)."""
    return graph.memo("experts", lambda: max(
        (graph.node(n.inputs[2]).attrs["shape"][0] for n in graph.ops() if OPS[n.op].routed),
        default=0))


def encoder_decoder(graph: Graph) -> bool:
    """Whether the graph is an encoder-decoder (two lengths: ``seq`` and ``tgt_seq``)."""
    return graph.spec is not None and graph.spec.arch == "encoder-decoder"


def interleavable(graph: Graph) -> bool:
    """Whether interleaved 1F1B (``--vpp`` > 1) may run the model: not an encoder-decoder,
    which Megatron-LM's interleaved schedule refuses (``ModelType.encoder_and_decoder`` in
    pipeline_parallel/schedules.py, ``forward_backward_pipelining_with_interleaving``)."""
    return not encoder_decoder(graph)


def check(graph: Graph, layout: Layout) -> None:
    """Refuse a layout the graph or the batch cannot take; one line naming what does not
    divide. Postcondition: the layout can be planned."""
    for key in ("tp", "pp", "dp", "ep", "micro_batch", "global_batch", "seq"):
        value = getattr(layout, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TfgraphError(f"--{key.replace('_', '-')} must be a positive integer, "
                               f"got {value!r}")
    if layout.zero not in (0, 1, 2, 3):
        raise TfgraphError(f"--zero must be 0, 1, 2 or 3, got {layout.zero!r}")
    if layout.recompute not in RECOMPUTE:
        raise TfgraphError(f"--recompute must be one of {', '.join(RECOMPUTE)}")
    if layout.dtype not in STATE_BYTES:
        raise TfgraphError(f"--dtype must be one of {', '.join(DTYPES)}")
    if layout.states not in STATES:
        raise TfgraphError(f"--states must be one of {', '.join(STATES)}")
    if layout.grad_reduce not in GRAD_REDUCE:
        raise TfgraphError(f"--grad-reduce must be one of {', '.join(GRAD_REDUCE)}")
    if layout.grad_reduce == "after" and layout.zero == 3:
        raise TfgraphError("--grad-reduce after: ZeRO 3 (FSDP) reduce-scatters each layer's "
                           "gradients during the backward; use --zero 0, 1 or 2")
    if layout.sp and layout.tp == 1:
        raise TfgraphError("--sp splits what tensor parallelism leaves whole: it needs --tp > 1")
    if layout.tgt_seq is not None:
        value = layout.tgt_seq
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TfgraphError(f"--tgt-seq must be a positive integer, got {value!r}")
        if not encoder_decoder(graph):
            arch = "a model with no spec" if graph.spec is None else graph.spec.arch
            raise TfgraphError(f"--tgt-seq: {arch} has one sequence; use --seq")
    # README, "Lengths beyond max_len"
    check_lengths(graph.spec, ("--seq", layout.seq), ("--tgt-seq", layout.tgt_seq))
    units = pipeline_units(graph)
    if layout.pp > max(units, 1):
        raise TfgraphError(f"--pp {layout.pp}: more stages than the {units} layers")
    if isinstance(layout.vpp, bool) or not isinstance(layout.vpp, int) or layout.vpp < 1:
        raise TfgraphError(f"--vpp must be a positive integer, got {layout.vpp!r}")
    if layout.stage_layers is not None:
        given = tuple(layout.stage_layers)
        if len(given) != layout.pp or any(
                isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in given):
            raise TfgraphError(f"--stage-layers: expected {layout.pp} positive counts (one per "
                               f"stage), got {','.join(map(str, given))}")
        if sum(given) != units:
            raise TfgraphError(f"--stage-layers {','.join(map(str, given))} sum to "
                               f"{sum(given)}, not the {units} layers")
    if layout.vpp > 1:
        if layout.pp == 1:
            raise TfgraphError("--vpp interleaves pipeline stages: it needs --pp > 1")
        if not interleavable(graph):
            raise TfgraphError("--vpp: interleaved 1F1B is not for encoder-decoder models "
                               "(Megatron-LM refuses it); use --vpp 1")
        counts = layout.stage_layers or balanced_stages(units, layout.pp)
        if any(n % layout.vpp for n in counts):
            raise TfgraphError(f"--vpp {layout.vpp} does not divide every stage's layers "
                               f"({','.join(map(str, counts))})")
    if layout.ep > 1:
        if not experts(graph):
            raise TfgraphError("--ep is for mixture-of-experts models: this one has no experts")
        if layout.dp % layout.ep:
            raise TfgraphError(f"--ep {layout.ep} must divide --dp {layout.dp} (expert "
                               "parallelism uses data-parallel ranks)")
    if layout.global_batch % (layout.dp * layout.micro_batch):
        raise TfgraphError(f"--global-batch {layout.global_batch} is not a multiple of "
                           f"dp x micro-batch = {layout.dp * layout.micro_batch}")
    if layout.vpp > 1 and layout.microbatches % layout.pp:
        raise TfgraphError(f"--vpp: the {layout.microbatches} micro-batches per step are not a "
                           f"multiple of --pp {layout.pp} (Megatron-LM's interleaved schedule)")
    if layout.sp and layout.seq % layout.tp:
        raise TfgraphError(f"--sp: --tp {layout.tp} does not divide --seq {layout.seq}")
    if layout.sp and layout.target % layout.tp:
        raise TfgraphError(f"--sp: --tp {layout.tp} does not divide --tgt-seq {layout.target}")
    check_divisible(graph, layout.tp, layout.ep)
