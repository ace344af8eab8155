"""A parallel layout: how many GPUs do what (``tfgraph plan`` options), checked against a graph.

GPUs = tp x pp x dp. Expert parallelism takes its ranks from the data-parallel ones (as
Megatron-LM and DeepSpeed-MoE do): ``ep`` divides ``dp``, each expert-parallel group holds every
expert once. A step takes ``global_batch`` sequences: each data-parallel rank runs
``global_batch / (dp * micro_batch)`` micro-batches through the pipeline (1F1B schedule,
Narayanan et al. 2021 §2.2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import DTYPE_BYTES, Graph
from tfgraph.graph.lengths import check_lengths
from tfgraph.parallel.tp_plan import check_divisible
from tfgraph.passes import figures

Recompute = Literal["none", "selective", "full"]
RECOMPUTE: tuple[Recompute, ...] = ("none", "selective", "full")
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
    dtype: str = "bfloat16"
    """Training precision: bfloat16/float16 mixed precision or float32."""
    states: str = "mixed"
    """Model-state convention of 16-bit training (``STATES``): "mixed" 16-bit gradients (16
    bytes per parameter), "megatron" fp32 gradients (18)."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def microbatches(self) -> int:
        """Micro-batches per data-parallel rank per step (m)."""
        return self.global_batch // (self.dp * self.micro_batch)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gpus": self.gpus, "microbatches": self.microbatches}


def pipeline_units(graph: Graph) -> int:
    """Layers the pipeline divides into stages (every stack's layers)."""
    return graph.memo("pipeline_units", lambda: len(
        {(n.meta.stack, n.meta.layer) for n in graph.ops() if n.meta.layer is not None}))


def experts(graph: Graph) -> int:
    """Routed experts per MoE layer (0 for a dense model)."""
    return graph.memo("experts", lambda: max(
        (graph.node(n.inputs[2]).attrs["shape"][0] for n in graph.ops() if n.op == "experts"),
        default=0))


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
    if layout.sp and layout.tp == 1:
        raise TfgraphError("--sp splits what tensor parallelism leaves whole: it needs --tp > 1")
    check_lengths(graph.spec, ("--seq", layout.seq))  # README, "Lengths beyond max_len"
    units = pipeline_units(graph)
    if units % layout.pp:
        raise TfgraphError(f"--pp {layout.pp} does not divide the {units} layers")
    if layout.ep > 1:
        if not experts(graph):
            raise TfgraphError("--ep is for mixture-of-experts models: this one has no experts")
        if layout.dp % layout.ep:
            raise TfgraphError(f"--ep {layout.ep} must divide --dp {layout.dp} (expert "
                               "parallelism uses data-parallel ranks)")
    if layout.global_batch % (layout.dp * layout.micro_batch):
        raise TfgraphError(f"--global-batch {layout.global_batch} is not a multiple of "
                           f"dp x micro-batch = {layout.dp * layout.micro_batch}")
    if layout.sp and layout.seq % layout.tp:
        raise TfgraphError(f"--sp: --tp {layout.tp} does not divide --seq {layout.seq}")
    check_divisible(graph, layout.tp, layout.ep)
