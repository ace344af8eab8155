"""Step time of a layout from the graph: each op's time on one rank, then the pipeline schedule,
the collectives and what overlaps what (``tfgraph plan``'s ``step.time_s``).

Compute, per op of the lowered training graph (forward, backward, what recompute runs again),
split as tensor and sequence parallelism split it (``tfgraph.parallel.placement``,
``sequence_plan``): time = max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth), the
roofline (Williams et al. 2009), with the rates of ``tfgraph.parallel.gpus``:
- a projection (``linear``) is a GEMM of M tokens x N outputs x K inputs (a column-parallel one
  N / t, a row-parallel one K / t); backward is two GEMMs, the input's gradient (M x K, inner N)
  and the weight's (N x K, inner M). Its rate is ``matmul_fraction`` x peak x the share of the
  GPU its output tiles keep busy: ``gemm_efficiency``, tiles of TILE x TILE run in waves over
  the SMs, the last wave partly idle (wave and tile quantization, NVIDIA's "Matrix
  Multiplication Background User's Guide"), x the share of a tile's time its K loop runs
  rather than filling and draining its pipeline (``k_efficiency``, relative to the large K the
  MAMF figures were measured at);
- fused attention (FlashAttention) runs the scores its causal mask keeps
  (``passes.effective.read_fraction``) at ``attention_fraction`` x peak, or on the GPUs that
  have one at FlashAttention-2's measured rate for its head dimension, length and mask
  (``tfgraph.parallel.flash``); its backward does 2.5x the forward's FLOPs (five GEMMs
  against two, Dao 2023 §3.1.2); ``--attention unfused``, and attention no fused kernel
  takes (soft-capped or biased scores, hardmax: ``Work.explicit``, whose memory and module are
  explicit matmuls whatever ``--attention`` says), runs the two batched GEMMs (QK^T
  over the head dimension, then the weights times V) over the whole
  score matrix and moves the score tensor through the softmax (read + write forward; read the
  weights and their gradient, write the scores' gradient backward), as Megatron-LM's
  ``FusedScaleMaskSoftmax`` does; with attention dropout (``attention.dropout``) one more
  memory-bound pass each way (forward: read the weights, write the dropped-out ones and a
  one-byte mask; backward: read the gradient and the mask, write the gradient). Fused
  attention draws its dropout mask inside the kernel (Dao et al. 2022 §3.1): no traffic;
  the random numbers are not charged;
- routed experts (uniform routing: each expert gets tokens x top-k / experts of the pairs):
  with expert parallelism a rank holds E / ep experts and receives, after the all-to-all,
  the pairs its ep group routes to them (tokens x top-k, ep x as many per expert); the
  roofline of their GEMMs' FLOPs (N = hidden / t) and their bytes: the rank's experts'
  weights read once per micro-batch (/ ep / t) and the pairs' rows of d read and written;
  backward twice the FLOPs, the weights read again and their gradients written, the rows
  read twice and the input's gradient written (``_experts_time``);
- every other op is memory-bound: it reads its operands (parameters too) and writes its output
  (backward: reads the output's gradient and the operands, writes the operands' gradients:
  twice the bytes), its arithmetic at ``vector_flops``.
Memory-bound ops and the unfused softmax's passes move their bytes at ``Gpu.kernel_bandwidth``,
the rate a training step's memory-bound kernels were measured to reach (``KERNEL_SHARE`` of a
streaming read, ``tfgraph.parallel.gpus``); GEMM operands, the optimizer, gradient accumulation
and FSDP's copies stream at ``Gpu.streaming``.
Backward times only the gradients torch computes (``passes.gradients.operand_grads``): hard
attention's arg-max passes none to q and k, so their projections run no backward GEMM and the
core only dV (unfused: one A.V-sized GEMM; fused: ``OpDef.backward_flops``' share of its
backward); an op no operand of which gets a gradient runs no backward.
Under full recompute a layer's forward runs again before its backward; selective recompute
reruns the attention cores (Korthikanti et al. 2022 §5).
Each op's FLOPs as timed (fused attention: the scores kept, its backward 2.5x; explicit: every
score; a GEMM's backward the two it runs; recompute's rerun) sum to ``hardware_flops``, on
every rank: no op runs faster than peak, so hardware FLOPs / (GPUs x peak x time) <= 1.

That is one kernel per graph op, the fused execution ``torch.compile`` approaches. ``--kernels
eager`` times the kernels PyTorch's eager mode launches for tfgraph's module instead
(``exporters/torch/kernels.py`` counts them per node, forward and backward, from the torch back
end): a memory-bound op becomes its kernels, each its bytes at the achievable bandwidth and at
least ``LAUNCH_S``; a GEMM or attention node keeps its graph time plus the kernels around its
matrix products or flash kernel; a node's output read by k ops adds the k - 1 additions autograd
runs to sum their gradients. Under tensor or sequence parallelism each kernel's bytes are split
as the op's own work is; under expert parallelism the routed experts' kernels are those one
rank launches (its E / ep experts on the tokens x top-k pairs it receives, as above).

Communication, from bytes, link bandwidth and latency: a ring all-reduce of n bytes over k
ranks takes 2 (k - 1) / k x n / bandwidth + 2 (k - 1) latency steps; a reduce-scatter or an
all-gather half of that (Patarasuk & Yuan 2009; NCCL's ring). Data-parallel traffic is many
collectives, each paying the ring's latency steps: one per 40M-element gradient bucket (DDP,
Megatron-LM) and one per FSDP unit (ZeRO 3: each layer, plus the root's; torchtitan shards
each block, then the model). Bandwidth is
``LINK_EFFICIENCY`` of the GPU's link inside a node of ``per_node`` GPUs (``Gpu.link``: NVLink,
PCIe, Infinity Fabric); between nodes, of each GPU's share of its node's NICs
(``Gpu.network``: one NIC a GPU on DGX A100 / H100, half a NIC on a DGX-1 V100). NCCL runs
one ring per NIC, so a group with g GPUs in each node crosses nodes at g shares (no more than
the node's link), one GPU a node at one share (``link``). Ranks are ordered tensor, data,
pipeline (Megatron-LM's default order), so a group of span ranks stays in a node when span <=
per_node, and a data-parallel group (members t ranks apart) has per_node / t GPUs in each node
(the experts' data-parallel group, t x ep apart, per_node / (t ep)). An all-to-all is no ring:
each rank's rows for other nodes leave through its own share, one a rank; the tied table's
all-reduce between the first and last stages has one GPU of the group a node. Overlap rules:
- tensor-parallel collectives (and the vocabulary reductions, and the MoE all-to-all) are
  exposed: they sit between the GEMMs that need them (Megatron-LM without its TP-comm overlap);
  full recompute repeats the forward ones, the MoE dispatch and combine all-to-alls among them
  (the recomputed forward is the forward, collectives included: Megatron-LM's
  ``CheckpointFunction`` reruns the layer's forward); selective recompute reruns attention
  cores, which hold no collective;
- data parallel, ZeRO 0-1: the gradients' all-reduce (reduce-scatter) runs under the backward
  pass of the last micro-batch, bucket by bucket; what exceeds that backward, and at least the
  last bucket (``BUCKET_ELEMENTS``), is exposed (PyTorch DDP / Megatron-LM
  ``overlap_grad_reduce``: earlier micro-batches only accumulate into the full gradient
  buffer). ZeRO 2 keeps only its 1/d shard of the gradients, so every micro-batch's gradients
  are reduce-scattered as its backward produces them (DeepSpeed ZeRO-2 reduces at every
  micro-step; PyTorch FSDP SHARD_GRAD_OP every backward outside ``no_sync``, which keeps full
  gradients): the same rule per micro-batch, m times. ZeRO 1-2 gather the updated 16-bit
  weights under the next step's first forward (``overlap_param_gather``), the first bucket
  exposed;
- ZeRO 3 (FSDP): every micro-batch gathers each layer's weights in forward and backward and
  reduce-scatters its gradients, prefetched under the previous layer's compute (FSDP's
  forward/backward prefetch): exposed is what exceeds the compute, plus the first layer's
  gather;
- pipeline: 1F1B (Narayanan et al. 2021 §2.2.1): the step is (m + p - 1) slots of the slowest
  stage's forward + backward of one micro-batch, a bubble of (p - 1) / m; interleaved 1F1B with
  v model chunks per stage (``--vpp``, §2.2.2): (p - 1) / (m v), each micro-batch crossing v
  times as many boundaries. Point-to-point sends are exposed, two per boundary crossing
  (activation forward, gradient backward); between nodes each of the t ranks sends 1/t of the
  boundary over its own NIC and the stage all-gathers it over the node's link (the scatter-gather of
  §4.1), with sequence parallelism each rank's rows already are that 1/t. A table tied across
  stages (the token embedding on the first, the head on the last) has its gradient all-reduced
  among the stages holding it once a step, after the backward and the data-parallel reduction
  (Megatron-LM's ``finalize_model_grads``: ``finish_grad_sync``, then the embedding group's
  all-reduce), exposed (``_tied_time``);
- gradient accumulation (``_accumulate_time``): ZeRO 0-1 add each micro-batch's weight
  gradients (16-bit, as the GEMMs write them) into the rank's full gradient buffer, a
  memory-bound pass reading them and the buffer and writing the buffer; Megatron-LM's fp32
  ``main_grad`` (``--states megatron``) is zeroed each step and added into from the first
  micro-batch on (its backward hook: ``main_grad.add_(grad)``), a 16-bit buffer of the
  gradients' own dtype takes the first micro-batch's gradient as it is (PyTorch's
  ``AccumulateGrad`` keeps the new gradient when ``.grad`` is None): m - 1 passes. ZeRO 2-3
  accumulate after the reduce-scatter, into the 1/d shard: the first micro-batch's reduced
  shard is the gradient, each later one is added to it (read both shards, write one; FSDP's
  sharded ``.grad``, DeepSpeed's partitioned gradients); reduced in fp32 (``--states megatron``
  ZeRO 2, ZeRO 3) each micro-batch's 16-bit gradients are first cast into the fp32 reduction
  buffer (read 16-bit, write fp32; FSDP's reduce_dtype copy-in, counted by ``--kernels eager``
  ZeRO 3's copies instead);
- the optimizer step reads the rank's weights, gradients and optimizer states and writes the
  weights and optimizer states, memory-bound, after everything else.

Precondition: ``layout.check`` passed; ``figures`` are the planner's stages. Postcondition: the
graph keeps memoised per-unit work lists and their times; nothing else changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import sympy

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import DTYPE_BYTES, SYMBOLS, Graph, Node
from tfgraph.parallel.flash import LENGTHS, flash_fraction, reference_heads
from tfgraph.parallel.fsdp_copies import accumulate_kernels, copy_kernels, fsdp_groups
from tfgraph.parallel.gpus import Gpu
from tfgraph.parallel.layout import Layout, state_bytes
from tfgraph.parallel.memory import States, stepped_elements
from tfgraph.parallel.units import sequence_plan, units
from tfgraph.parallel.sequence_plan import ROWS_KINDS
from tfgraph.passes import cost
from tfgraph.passes.effective import read_fraction
from tfgraph.passes.gradients import operand_grads
from tfgraph.graph.ops import OPS, attention_dropout_saved

TILE = 128
"""Output tile edge of a cuBLAS tensor-core GEMM (128 x 128 is the NVIDIA guide's example
tile; Hopper's larger ones only coarsen the quantization)."""
PIPELINE_K = 128
"""Inner-dimension length a tile's software pipeline spends filling and draining: a
multistage tensor-core GEMM loads ``stages`` slices of ``BK`` of K before its first MMA and
writes its tile after the last (CUTLASS's Ampere GEMMs: 4 stages x BK 32). A GEMM over K runs
at K / (K + PIPELINE_K) of its steady rate: 0.43 at an attention head's K = 96, 0.95 at a
hidden size of 2304."""
LINK_EFFICIENCY = 0.8
"""Share of a link's bandwidth NCCL's ring collectives reach (bus bandwidth of nccl-tests'
all_reduce_perf on DGX A100 / H100: about 230 of 300 and 370 of 450 GB/s over NVLink)."""
NVLINK_LATENCY = 1e-6
"""Seconds per ring step inside a node (NCCL's tuning model, Simple protocol over NVLink)."""
NET_LATENCY = 5e-6
"""Seconds per ring step between nodes (InfiniBand / RoCE, NCCL's tuning model)."""
BUCKET_ELEMENTS = 40_000_000
"""Gradient elements per data-parallel bucket (Megatron-LM's default bucket size)."""
MAMF_K = 8192
"""K of the large GEMMs the MAMF figures come from (their sweeps peak at K of several
thousand)."""
ATTENTION_BACKWARD = 2.5
"""FlashAttention's backward FLOPs over its forward's (Dao 2023 §3.1.2: five GEMMs to two)."""
LAUNCH_S = 4e-6
"""Least seconds an eager kernel holds the GPU's stream, launch included: short kernels issued
back to back complete a few microseconds apart (NVIDIA's "Getting Started with CUDA Graphs"
measures 3.8 us per kernel launched on a stream without graphs)."""

ASSUMPTIONS: dict[str, str] = {
    "compute": "per op max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth); GEMMs at "
               "the GPU's MAMF share of peak x wave/tile efficiency (128 x 128 tiles over the "
               "SMs) x the pipeline fill K / (K + 128) relative to its value at K = 8192 "
               "(the MAMF figures' K; at most 1), backward = 2 GEMMs (input and weight "
               "gradients); fused attention at the "
               "FlashAttention-2 share of peak (H100/H200: its measured rate by head dim, "
               "length and mask, FlashAttention-3 paper Figs. 5-6; see 'flash') over the "
               "scores the causal mask keeps, backward 2.5x its FLOPs; unfused attention as "
               "two batched GEMMs "
               "+ the softmax's score traffic (+ attention dropout's: weights, dropped "
               "weights and 1-byte mask); "
               "other ops memory-bound (backward moves twice the bytes); memory-bound ops "
               "and the softmax's passes at the rate a step's memory-bound kernels reach "
               "(0.776 of a streaming read, measured on an H200; see gpu), GEMM operands, "
               "the optimizer, accumulation and FSDP copies at the streaming rate; only the "
               "gradients torch computes are timed (hard attention: none for q, k and their "
               "projections, dV alone in its core; an op no gradient passes: no backward)",
    "flash": "FlashAttention-2's measured rates (H100/H200) held at the ends and interpolated "
             "in log2 of length and head dim between the measured points; the masked "
             "backward (not measured) at the unmasked backward's rate x the forward's "
             "masked / unmasked ratio at the same head dim and length; head dim 256's "
             "backward at 128's; x the share of the SMs the core's query tiles (128 queries "
             "x batch x heads, in waves) keep busy relative to the measured point's own "
             "(16k tokens, hidden 2048), never above the measured rate; other GPUs: their "
             "FlashAttention-2 share of peak x that share of the SMs",
    "recompute": "full: each layer's forward again before its backward, collectives "
                 "included (its forward tensor-parallel all-reduces and MoE dispatch + "
                 "combine all-to-alls, in comm_bytes too; Megatron-LM's CheckpointFunction "
                 "reruns the forward); selective: the attention cores' forward (no "
                 "collectives)",
    "collectives": "ring: all-reduce 2(n-1)/n x bytes / link + 2(n-1) x latency, all-gather "
                   "and reduce-scatter (n-1)/n; links at 80% (NCCL bus bandwidth): the "
                   "GPU's link inside a node (named under gpu); between nodes each GPU's "
                   "share of the node's NICs (one NIC each where there is one per GPU), a "
                   "ring group with g GPUs in a node at g shares (NCCL's ring per NIC), at "
                   "most the node's link; the expert all-to-all at one share a rank; "
                   "latency 1 us (inside a node), 5 us "
                   "(network) per ring step, paid by every collective: one per 40M-element "
                   "gradient bucket, one per FSDP unit (ZeRO 3: a layer, plus the root); "
                   "rank order tensor, data, pipeline",
    "tensor_parallel": "all-reduces (reduce-scatter + all-gather with --sp), vocabulary "
                       "reductions and expert all-to-all exposed (not overlapped)",
    "data_parallel": "ZeRO 0-1: gradient all-reduce / reduce-scatter under the last "
                     "micro-batch's backward, the excess and at least the last 40M-element "
                     "bucket exposed; ZeRO 2: the reduce-scatter every micro-batch (1/d "
                     "gradient shards: DeepSpeed ZeRO-2, FSDP SHARD_GRAD_OP), each under its "
                     "micro-batch's backward by the same rule, m times the bytes; ZeRO 1-2 "
                     "weight all-gather under the next step's first "
                     "forward, the first bucket exposed; ZeRO 3: gathers and reduce-scatters "
                     "every micro-batch prefetched under compute, the excess and the first "
                     "layer's gather exposed",
    "pipeline": "1F1B: (m + p - 1) slots of the slowest stage, bubble (p - 1)/m; interleaved "
                "(--vpp v): bubble (p - 1)/(m v); point-to-point sends exposed, 2 per "
                "boundary crossing (v crossings per stage interleaved), scatter-gather "
                "between nodes; a table tied across stages (token embedding on the first, "
                "head on the last): its gradient as the rank keeps it (whole under ZeRO 0-1, "
                "the 1/d shard under 2-3) all-reduced among the stages holding it once a "
                "step, in comm_bytes.pp, after the backward and the data-parallel reduction "
                "(Megatron-LM's finalize_model_grads, embedding group), exposed "
                "(embedding_exposed), inside a node when the whole pipeline is, else over "
                "the NICs",
    "grad_accumulation": "memory-bound; ZeRO 0-1: each micro-batch's 16-bit weight "
                         "gradients added into the full gradient buffer (read both, write "
                         "the buffer): m times into Megatron-LM's zeroed fp32 main_grad "
                         "(--states megatron), m - 1 times into a 16-bit one (PyTorch's "
                         "AccumulateGrad keeps the first gradient); ZeRO 2-3: the reduced 1/d "
                         "shards added from the second micro-batch on (the first is the "
                         "gradient), after casting each micro-batch's 16-bit gradients into "
                         "an fp32 reduction buffer when they are reduced in fp32",
    "optimizer": "Adam step memory-bound, one fused pass: reads weights, gradients and "
                 "optimizer states, writes weights and optimizer states",
    "kernels": "graph: one kernel per graph op (fused execution, as torch.compile approaches)",
    "host": "not timed: the CPU's work (Python, PyTorch's dispatcher, FSDP2's hooks: about "
            "0.4 ms of CPU per group gathered on Llama 3 8B, PyTorch pull request 133369) is "
            "assumed to run ahead of the GPU; where it does not (small layers, many FSDP2 "
            "groups on few GPUs) the step is longer than planned: examples/"
            "train_distributed.py's FSDP2 step of a 1.1B model on one GPU at batch 4 x 1024 "
            "kept the device busy 0.91x the plan's time and took 1.5-1.6x it (H200, H100); "
            "at 16 x 1024 it took 0.96x (benchmarks/RESULTS.md); under ZeRO 3, step."
            "host_bound names a step likely so (tfgraph/parallel/host.py)",
    "tokens": "tokens_per_s: global batch x --seq tokens / time_s (an encoder-decoder's "
              "source tokens; its target tokens, --tgt-seq, are not added)",
    "memory": "per rank, the most loaded pipeline stage's weights + gradients + optimizer "
              "(Adam's two fp32 moments, an fp32 master copy in 16-bit training, a float32 "
              "step per parameter tensor; --states) + activations + temporary, all held at "
              "once (tfgraph/parallel/memory.py, planner.py); ZeRO shards each parameter "
              "along its first dimension in torch.chunk pieces, the first rank's (the "
              "largest) counted; activations: the bytes each op saves for backward (fused "
              "attention: q, k, v, output, a float32 log-sum-exp per row and a sliding "
              "window's (S, S) mask per windowed layer, whole on every rank; unfused: the "
              "softmax weights, attention dropout's mask and dropped-out weights; soft-capped "
              "or biased scores, which no fused kernel takes: their explicit matmuls' "
              "tensors and one-byte (S, S) mask), / t where the op works on split "
              "data, the rest whole (/ t under --sp but on the gathered sequence), times the "
              "micro-batches stage i of p holds in flight (layout.in_flight): 1F1B "
              "min(p - i, m); interleaved 1F1B (--vpp v) Megatron-LM's warm-up, (p - i - 1) "
              "x 2 + (v - 1) x p forward chunks of 1/v of the stage's layers plus the one "
              "running, min(((p - i - 1) x 2 + (v - 1) x p + 1) / v, m); full "
              "recompute keeps each layer's inputs; temporary: the logits' gradient in the "
              "model's dtype (last stage), the larger of one layer rebuilt by full recompute "
              "and one MoE layer's 16-bit expert weight gradients, ZeRO 3's two gathered "
              "16-bit layers and one layer's fp32 gradients; left out: the loss's float32 "
              "log-probabilities and the float32 gradients of them and of the logits (8 x B "
              "x S x V / t bytes more at the loss's backward, which report's training peak "
              "counts), the rotary cos/sin tables and a unit-offset norm's (1 + w) gain, "
              "activation gradients but the logits' and forward buffers not saved for "
              "backward, communication buffers (gradient buckets, NCCL), the CUDA context "
              "and the allocator's fragmentation",
}

EAGER_KERNELS = ("eager: the kernels PyTorch's eager mode launches for tfgraph's module, "
                 "counted per node on the meta device (CUDA's fused SDPA and RMSNorm taken as "
                 "their CUDA kernels: one flash kernel each way, RMSNorm's backward two): "
                 "memory-bound kernels at their bytes / the step's memory-bound kernel "
                 "rate, at least 4 us "
                 "each; GEMM and attention nodes at their graph time plus the "
                 "kernels around them; k readers of a gradient add k - 1 additions; routed "
                 "experts with tokens x top-k / experts each; under --ep as one rank runs "
                 "them (parallelize's ExpertParallel): its E / ep experts on the tokens x "
                 "top-k pairs it receives, with the dispatch's and combine's sorts and "
                 "gathers, the all-to-alls timed as ep communication; the optimizer step as "
                 "torch.optim.AdamW's kernels over the float32 elements the rank steps; "
                 "ZeRO 3: FSDP2's copies (casts and copies into and out of its gather "
                 "buffers, each group gathered in forward and backward; the gradients' "
                 "float32 copy-in, in place of grad_accumulation's cast), exposed, every micro-batch reduced (FSDP2's default; not "
                 "torch.distributed.pipelining's deferred reduction); the sharded gradients "
                 "accumulated from the second micro-batch on, one kernel per tensor")


EXPERTS = ("routed experts: uniform routing (each expert gets tokens x top-k / E of the "
           "(token, expert) pairs); with --ep a rank holds E / ep experts and receives, "
           "after the all-to-all, tokens x top-k pairs (ep x as many per expert); time "
           "max(FLOPs / GEMM rate (hidden / t, wave efficiency over its E / ep experts), "
           "bytes / bandwidth), the bytes its experts' weights (/ ep / t) read once per "
           "micro-batch plus the pairs' rows of d read and written; backward 2x the "
           "FLOPs, the weights read again and their gradients written, the rows read "
           "twice and written once; all-to-all: 4 per MoE layer per micro-batch "
           "(dispatch and combine, forward and backward), each (ep - 1)/ep x the routed "
           "rows' bytes (tokens x top-k x d) / link + (ep - 1) latency steps, over the "
           "link of a tp x ep span of ranks, exposed (full recompute: 6, its forward two "
           "again); expert "
           "weights are reduced over their data-parallel group, the d / ep ranks holding "
           "the same experts")
"""The routed experts' rules, stated for a mixture of experts (``assumptions``)."""

MEMORY_EXPERTS = ("; routed experts keep the tokens x top-k (token, expert) rows each MoE layer "
                  "routes, not split by --tp, the same under --ep (uniform routing: the "
                  "all-to-all brings a rank as many rows as it sends)")
"""What the memory of a mixture of experts rests on (``assumptions``)."""


EXPLICIT_ATTENTION = ("soft-capped or biased scores and hardmax, which no fused kernel takes, "
                      "timed as the explicit matmuls their memory counts and the module runs "
                      "(--attention fused too): two batched GEMMs over the whole score "
                      "matrix, no key skipped by the mask or window, + the softmax's score "
                      "traffic, the hardware FLOPs every score's")
"""How attention no fused kernel takes is timed (``assumptions``, where the graph has one)."""


def explicit_attention(graph: Graph) -> bool:
    """Whether some attention op of the graph is timed as explicit matmuls (``Work.explicit``)."""
    return any(w.explicit for items in unit_work(graph) for w in items)


EAGER_OPTIMIZER = ("torch.optim.AdamW's own kernels (foreach) over the float32 elements the rank "
                   "steps, counted on the meta device: memory-bound")

GRAD_REDUCE_AFTER = ("ZeRO 0-2 with --grad-reduce after (Megatron-LM's local DDP): the whole "
                     "gradient all-reduce / reduce-scatter after the last backward, exposed "
                     "(ZeRO 2: after every micro-batch's backward, its 1/d gradient shards "
                     "unable to hold a full gradient); "
                     "ZeRO 1-2 weight all-gather under the next step's first forward, the first "
                     "bucket exposed")


ENCODER_DECODER = ("the encoder runs at the source length --seq, the decoder (its "
                   "self-attention, the cross-attention's queries, the head and the loss) at "
                   "the target length --tgt-seq (default --seq)")
"""The lengths an encoder-decoder is planned at (``assumptions``)."""


def assumptions(layout: Layout, kernels: KernelSource | None = None, moe: bool = False,
                encoder_decoder: bool = False) -> dict[str, str]:
    """The rules the step time of ``layout`` follows (its gradient reduction's and kernels'
    among them; ``moe``: the routed experts' too; ``encoder_decoder``: its two lengths)."""
    found = dict(ASSUMPTIONS)
    if encoder_decoder:
        found["encoder_decoder"] = ENCODER_DECODER
    if moe:
        found["experts"] = EXPERTS
        found["memory"] += MEMORY_EXPERTS
    if layout.grad_reduce == "after":
        found["data_parallel"] = GRAD_REDUCE_AFTER
    if kernels is not None:
        found["kernels"] = EAGER_KERNELS
        found["optimizer"] = EAGER_OPTIMIZER
    return found


class StageFigures(Protocol):
    """The planner's per-stage figures this module reads (``planner.StageFigures``)."""

    @property
    def states(self) -> States: ...

    @property
    def tied(self) -> tuple[tuple[int, int], ...]: ...

    @property
    def comm(self) -> dict[str, float]: ...


class StageMembers(Protocol):
    @property
    def groups(self) -> tuple[tuple[int, int], ...]: ...


class Kernel(Protocol):
    """One eager kernel (``exporters.torch.kernels.Kernel``)."""

    @property
    def nbytes(self) -> float: ...

    @property
    def flops(self) -> float: ...

    @property
    def kind(self) -> str: ...

    @property
    def dims(self) -> tuple[int, ...]: ...

    @property
    def core(self) -> bool: ...


class NodeKernels(Protocol):
    """A node's eager kernels, forward and backward (``exporters.torch.kernels``)."""

    @property
    def forward(self) -> Sequence[Kernel]: ...

    @property
    def backward(self) -> Sequence[Kernel]: ...


class KernelSource(Protocol):
    """What ``--kernels eager`` times (``exporters.torch.kernels.EagerKernels``)."""

    def nodes(self, batch: int, seq: int, ep: int) -> Mapping[str, NodeKernels]:
        """Each node's eager kernels at a micro-batch and length on one of ``ep``
        expert-parallel ranks (its routed experts: E / ep of them, on the tokens x top-k
        pairs it receives), by node name."""
        ...

    @property
    def optimizer_bytes(self) -> float:
        """Bytes ``torch.optim.AdamW``'s step moves per float32 parameter element."""
        ...


# ---- rates -----------------------------------------------------------------------------------

def roofline(flops: float, nbytes: float, flop_rate: float, byte_rate: float) -> float:
    """Seconds of a kernel: the longer of its arithmetic and its memory traffic."""
    return max(flops / flop_rate, nbytes / byte_rate)


def gemm_efficiency(m: float, n: float, gpu: Gpu, batch: float = 1) -> float:
    """Share of the SMs' tile slots a GEMM's (batch x) M x N output fills: ceil-rounded tiles of
    TILE x TILE run in waves of ``gpu.sms``; the partial tiles and the last wave's idle SMs are
    lost (wave and tile quantization)."""
    tiles = math.ceil(m / TILE) * math.ceil(n / TILE) * batch
    waves = math.ceil(tiles / gpu.sms)
    return (m * n * batch) / (waves * gpu.sms * TILE * TILE)


def k_efficiency(k: float) -> float:
    """Share of a tile's time spent on its K loop rather than filling and draining the
    pipeline: K / (K + PIPELINE_K)."""
    return k / (k + PIPELINE_K)


def gemm_time(m: float, n: float, k: float, gpu: Gpu, peak: float, elem: int,
              batch: float = 1) -> float:
    """Seconds of a (batched) GEMM C[M, N] = A[M, K] B[K, N] in elements of ``elem`` bytes.
    ``matmul_fraction`` is measured on large-K GEMMs (K >= 4096, k_efficiency >= 0.97): the
    fill and drain it already holds is not counted twice."""
    if m <= 0 or n <= 0 or k <= 0 or batch <= 0:
        return 0.0
    rate = (peak * gpu.matmul_fraction * gemm_efficiency(m, n, gpu, batch)
            * min(1.0, k_efficiency(k) / k_efficiency(MAMF_K)))
    nbytes = (m * k + k * n + m * n) * batch * elem
    return roofline(2 * m * n * k * batch, nbytes, rate, gpu.streaming)


def ring_time(nbytes: float, ranks: int, reduce: bool, bandwidth: float, latency: float
              ) -> float:
    """Seconds of a ring all-reduce (``reduce``) or all-gather / reduce-scatter of ``nbytes``
    (the whole tensor) over ``ranks``."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    factor = 2.0 if reduce else 1.0
    return factor * ((ranks - 1) / ranks * nbytes / bandwidth + (ranks - 1) * latency)


def bucketed_ring_time(nbytes: float, pieces: int, ranks: int, reduce: bool, bandwidth: float,
                       latency: float) -> float:
    """Seconds of ``pieces`` ring collectives that together move ``nbytes``: the bandwidth
    term once, the ring's latency steps once per collective (DDP and Megatron-LM launch one
    per gradient bucket, FSDP one per unit)."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    factor = 2.0 if reduce else 1.0
    return (ring_time(nbytes, ranks, reduce, bandwidth, latency)
            + (max(pieces, 1) - 1) * factor * (ranks - 1) * latency)


def link(gpu: Gpu, span: int, stride: int = 1) -> tuple[float, float]:
    """(bandwidth, latency per ring step) of a ring collective over a group spread over
    ``span`` consecutive ranks, its members ``stride`` ranks apart: inside a node the node's
    link; across nodes the NICs of its GPUs in each node, one ring per NIC (NCCL), at most the
    node's link (``stride`` >= per_node: one GPU a node, one GPU's share of the NICs)."""
    if span <= gpu.per_node:
        return gpu.intra_node * LINK_EFFICIENCY, NVLINK_LATENCY
    members = max(1, gpu.per_node // stride)  # the group's GPUs in a node, a NIC share each
    return min(members * gpu.network, gpu.intra_node) * LINK_EFFICIENCY, NET_LATENCY


def bubble(pp: int, microbatches: int, vpp: int) -> float:
    """Pipeline bubble over the ideal time: (p - 1) / (m v) (v = 1: plain 1F1B)."""
    return (pp - 1) / (microbatches * vpp)


# ---- per-op work -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Work:
    """One op's forward work, sympy expressions in B, S, T (evaluated per micro-batch size).

    ``kind``: "gemm" (dims M, N, K; ``split`` "N", "K" or "" for what tensor parallelism
    divides), "attention" (fused: ``flops`` the scores kept; unfused: two batched GEMMs over
    ``dims`` (batch x heads, Sq, Sk) with ``extra`` the head dim and ``nbytes`` one score
    tensor), "experts" (dims tokens x top-k / experts, hidden, d; ``extra`` the experts;
    ``nbytes`` all experts' weights, ``routed`` the pairs' rows),
    "memory" (``split`` "t" by features, "rows" by the sequence under --sp, "" whole)."""

    kind: str
    flops: sympy.Expr
    nbytes: sympy.Expr
    dims: tuple[sympy.Expr, ...] = ()
    split: str = ""
    extra: sympy.Expr = sympy.Integer(0)
    dense_flops: sympy.Expr = sympy.Integer(0)
    mask: sympy.Expr = sympy.Integer(0)
    """Attention with dropout on its weights: bytes of its one-byte mask per score (0 without
    attention dropout)."""
    routed: sympy.Expr = sympy.Integer(0)
    """Routed experts: bytes of the rows of every (token, expert) pair, one way (tokens x top-k
    x d)."""
    masked: bool = False
    """Attention whose causal mask or window skips scores (fused: ``flops`` those kept)."""
    window: int = 0
    """Attention with a sliding window: the keys a query reads at most (0: all)."""
    explicit: bool = False
    """Attention no fused kernel takes (soft-capped or biased scores, hardmax): explicit
    matmuls over the whole score matrix whatever ``--attention`` says, as its memory
    (``ops._attention_saved``) and the torch module (``functional.attention``) have it."""
    op: str = ""
    node: str = field(default="", compare=False)
    """The node's name, where ``--kernels eager`` looks up its kernels (not compared: identical
    layers are alike)."""
    grads: tuple[bool, ...] | None = None
    """Per operand, whether the backward computes its gradient
    (``passes.gradients.operand_grads``); None where every operand gets one."""
    backward_share: sympy.Expr = sympy.Integer(1)
    """The backward's matrix FLOPs over 2 x the forward's (``OpDef.backward_flops``; 1 where
    every operand gets a gradient): fused attention and routed experts scale their backward
    by it."""


def _prod(shape: Sequence[Any]) -> sympy.Expr:
    return sympy.Mul(*shape) if shape else sympy.Integer(1)


def unit_work(graph: Graph) -> list[list[Work]]:
    """Every unit's ops as ``Work`` (memoised)."""
    return graph.memo("parallel_work", lambda: _unit_work(graph))


def _alike(graph: Graph) -> list[int]:
    """For each unit, the first unit with the same work (identical layers are timed once;
    memoised)."""
    def make() -> list[int]:
        first: dict[tuple[Work, ...], int] = {}
        return [first.setdefault(tuple(items), i) for i, items in enumerate(unit_work(graph))]
    found: list[int] = graph.memo("parallel_work_alike", make)
    return found


@dataclass(frozen=True)
class OpSite:
    """What a work builder reads of one op: the node, its operands, its FLOPs, the bytes of
    its operands and output, its tensor-parallel placement (``placement``: "S" split by
    features, "P" partial sums, "R" whole) and whether sequence parallelism splits it by
    rows."""

    graph: Graph
    node: Node
    operands: list[Node]
    flops: sympy.Expr
    moved: sympy.Expr
    where: str
    rows: bool


def _gemm_work(op: OpSite) -> Work:
    """A projection: M tokens x N outputs x K inputs; column-parallel splits N, row-parallel
    K."""
    x, w = op.operands[0].type, op.operands[1].attrs["shape"]
    dims = (_prod(x.shape[:-1]), sympy.Integer(w[0]), sympy.Integer(w[1]))
    return Work("gemm", op.flops, op.moved, dims, {"S": "N", "P": "K"}.get(op.where, ""))


def _attention_work(op: OpSite) -> Work:
    """An attention core: the scores its mask keeps (fused), its two batched GEMMs and score
    tensor (unfused), its dropout mask."""
    node, types = op.node, [o.type for o in op.operands]
    q, k = types[0], types[1]
    heads, head_dim = node.attrs["heads"], node.attrs["head_dim"]
    kept = read_fraction(op.graph, node.name)
    fused_flops = op.flops * kept if kept is not None else op.flops
    scores = cost.total([OPS[node.op].temp(types, node.type, node.attrs)])
    dims = (_prod(q.shape[:-2]) * heads if len(q.shape) > 3 else q.shape[0] * heads,
            q.shape[1], k.shape[1])
    mask = cost.total([b for ref, b in attention_dropout_saved(types, node.attrs)
                       if ref == ("tmp", "mask")])
    explicit = (len(op.operands) == 4 or bool(node.attrs.get("softcap"))
                or node.attrs.get("normalize") != "softmax")
    return Work("attention", fused_flops, scores, tuple(sympy.sympify(d) for d in dims),
                "t" if op.where == "S" else "", sympy.Integer(head_dim), op.flops, mask,
                masked=kept is not None, window=_window_keys(node.attrs), explicit=explicit)


def _window_keys(attrs: dict[str, Any]) -> int:
    """Keys a query reads at most under a sliding window (0: no window): W behind a causal
    query, 2W - 1 around a bidirectional one (``ops.attended_scores``)."""
    window = int(attrs.get("window") or 0)
    return window if attrs["causal"] or not window else 2 * window - 1


def _experts_work(op: OpSite) -> Work:
    """Routed experts: each expert's GEMMs over its share of the routed tokens; ``nbytes`` the
    stacked weights of all experts, ``routed`` the rows of the (token, expert) pairs one way
    (``_experts_time`` divides both by what the layout splits)."""
    experts, hidden, d = op.operands[-2].attrs["shape"]
    x = op.operands[0].type
    tokens = _prod(x.shape[:-1]) * op.node.attrs["top_k"]
    weights = cost.total([o.type.nbytes for o in op.operands[2:]])
    return Work("experts", op.flops, weights, (tokens / experts, sympy.Integer(hidden),
                                               sympy.Integer(d)),
                "N" if op.where in ("S", "P") else "", sympy.Integer(experts),
                routed=tokens * d * DTYPE_BYTES[x.dtype])


def _memory_work(op: OpSite) -> Work:
    """Any other op: memory-bound, split by features (tensor-parallel) or rows (--sp)."""
    split = "t" if op.where == "S" else "rows" if op.rows else ""
    return Work("memory", op.flops, op.moved, (), split)


WORK: dict[str, Callable[[OpSite], Work]] = {
    "linear": _gemm_work, "attention": _attention_work, "experts": _experts_work}
"""The planner's table per op (tinygrad's op tables): how an op's time is modelled; ops
without a row are memory-bound (``_memory_work``)."""


def _unit_work(graph: Graph) -> list[list[Work]]:
    all_units, placement, _ = units(graph)
    sequence = sequence_plan(graph)[0]
    costs = {c.node: c for c in cost.op_costs(graph)}
    grads = operand_grads(graph)
    out = []
    for unit in all_units:
        items = []
        for name in unit.ops:
            node = graph.node(name)
            c = costs[name]
            operands = [graph.node(i) for i in node.inputs]
            site = OpSite(graph, node, operands, sympy.sympify(c.matmul + c.other),
                          cost.total([o.type.nbytes for o in operands] + [node.type.nbytes]),
                          placement.of[name] if placement is not None else "R",
                          sequence is not None and sequence.kind.get(name) in ROWS_KINDS)
            flags = grads[name]
            partial = {} if flags and all(flags) else {"grads": flags,
                                             "backward_share": _backward_share(node, operands, c,
                                                                               flags)}
            items.append(replace(WORK.get(node.op, _memory_work)(site), op=node.op,
                                 node=node.name, **partial))
        out.append(items)
    return out


def _backward_share(node: Node, operands: list[Node], c: cost.OpCost,
                    flags: tuple[bool, ...]) -> sympy.Expr:
    """The matrix FLOPs an op's backward does over 2 x its forward's, where some operands get
    no gradient (hard attention's q and k): 0 where none does; ``OpDef.backward_flops``'s
    count where the op has one; else 1."""
    rule = OPS[node.op].backward_flops
    if not any(flags) or c.matmul == 0:
        return sympy.Integer(0 if not any(flags) else 1)
    if rule is None:
        return sympy.Integer(1)
    matmul, _ = rule([o.type for o in operands], node.type, node.attrs, flags)
    return sympy.cancel(sympy.sympify(matmul) / (2 * c.matmul))


@dataclass(frozen=True)
class UnitTime:
    """Seconds one micro-batch spends in a unit on one rank."""

    forward: float
    backward: float
    attention_forward: float
    """The attention cores' forward (what selective recompute runs again)."""
    forward_flops: float = 0.0
    """FLOPs the forward's timed kernels execute on the rank (hardware FLOPs)."""
    backward_flops: float = 0.0
    """FLOPs the backward's timed kernels execute (fused attention: 2.5x the forward's)."""
    attention_flops: float = 0.0
    """FLOPs of the attention cores' forward (what selective recompute runs again)."""


def unit_times(graph: Graph, layout: Layout, gpu: Gpu, attention: str,
               kernels: KernelSource | None = None) -> list[UnitTime]:
    """Every unit's times at the layout's micro-batch, length and splits (memoised per what
    they depend on: a search asks for the same few combinations many times). ``kernels``:
    time the eager kernels it gives instead of one per op (``--kernels eager``)."""
    table: dict[tuple[Any, ...], list[UnitTime]] = graph.memo("parallel_unit_times", dict)
    key = (layout.micro_batch, layout.seq, layout.target, layout.tp, layout.sp, layout.ep,
           attention, gpu, layout.dtype, kernels)
    if key not in table:
        if kernels is not None and layout.target != layout.seq:
            raise TfgraphError(f"--kernels eager counts the module's kernels at one length: "
                               f"--tgt-seq {layout.target} must equal --seq {layout.seq} "
                               "(or use --kernels graph)")
        sizes = {SYMBOLS["B"]: layout.micro_batch, SYMBOLS["S"]: layout.seq,
                 SYMBOLS["T"]: layout.target}
        peak = gpu.fp32_flops if layout.dtype == "float32" else gpu.peak_flops
        elem = 4 if layout.dtype == "float32" else 2
        work = unit_work(graph)
        eager = None if kernels is None else kernels.nodes(layout.micro_batch, layout.seq,
                                                             layout.ep)
        seen: dict[int, UnitTime] = {}
        out = []
        for rep in _alike(graph):
            if rep not in seen:
                seen[rep] = _unit_time(work[rep], sizes, layout, gpu, peak, elem, attention,
                                       eager)
            out.append(seen[rep])
        table[key] = out
    return table[key]


def _num(expr: sympy.Expr, sizes: dict[sympy.Symbol, int]) -> float:
    return float(sympy.sympify(expr).xreplace(sizes))


def flash_time(flops: float, batch: float, sq: float, sk: float, head_dim: float,
               masked: bool, gpu: Gpu, peak: float) -> tuple[float, float]:
    """Seconds of a fused attention core's forward (``flops``) and backward (2.5x them) over
    ``batch`` (batch x heads) of Sq x Sk scores: at FlashAttention-2's measured Hopper rate
    for its head dimension, length and mask (``tfgraph.parallel.flash``) where the GPU has
    one, else at ``attention_fraction`` of peak; times the share of the SMs its query tiles
    keep busy, relative to the measured point's."""
    eff = gemm_efficiency(sq, batch * TILE, gpu)  # query tiles x (batch, head)
    if not gpu.flash_measured:
        fwd = flops / (peak * gpu.attention_fraction * eff)
        return fwd, ATTENTION_BACKWARD * fwd
    # the measured point read (query length = key length, held within the measured lengths):
    # its own share of the SMs; never faster than measured
    ref = min(max(sk, LENGTHS[0]), LENGTHS[-1])
    eff = min(1.0, eff / gemm_efficiency(ref, reference_heads(head_dim, ref) * TILE, gpu))
    fwd = flops / (peak * flash_fraction(head_dim, sk, masked, False) * eff)
    bwd = ATTENTION_BACKWARD * flops / (peak * flash_fraction(head_dim, sk, masked, True) * eff)
    return fwd, bwd


def memory_seconds(nbytes: float, bandwidth: float) -> float:
    """Seconds of one memory-bound eager kernel: its bytes at the achievable bandwidth, at
    least ``LAUNCH_S``."""
    return max(nbytes / bandwidth, LAUNCH_S)


def kernel_seconds(k: Kernel, gpu: Gpu, peak: float, elem: int, div: float = 1) -> float:
    """Seconds of one eager kernel, its work split ``div`` ways: a GEMM by ``gemm_time`` of its
    dimensions (a grouped one by its FLOPs at the MAMF rate), the flash kernel at the
    FlashAttention-2 rate (``flash_time``), anything else ``memory_seconds`` at the step's
    memory-bound kernel rate."""
    if k.kind == "gemm":
        if len(k.dims) == 4:
            m, n, inner, batch = k.dims
            return gemm_time(m, n, inner, gpu, peak, elem, batch) / div
        return roofline(k.flops / div, k.nbytes / div, peak * gpu.matmul_fraction,
                        gpu.streaming)
    if k.kind == "attention":
        batch, sq, sk, head_dim, masked, backward = k.dims
        fwd, bwd = flash_time(k.flops / div / (ATTENTION_BACKWARD if backward else 1),
                              batch / div, sq, sk, head_dim, bool(masked), gpu, peak)
        return bwd if backward else fwd
    return memory_seconds(k.nbytes / div, gpu.kernel_bandwidth)


def _eager_time(kernels: Sequence[Kernel], whole: bool, div: float, gpu: Gpu, peak: float,
                elem: int) -> float:
    """Seconds of a node's eager kernels split ``div`` ways: all of them for a memory-bound
    node (``whole``), else those around its GEMMs or attention kernel (which the graph's
    time counts)."""
    return sum(kernel_seconds(k, gpu, peak, elem, div) for k in kernels
               if whole or not k.core)


def _split(w: Work, layout: Layout) -> int:
    """How many ways tensor (and sequence) parallelism splits an op's output."""
    if w.kind == "memory":
        return layout.tp if w.split == "t" or (w.split == "rows" and layout.sp) else 1
    return layout.tp if w.split in ("N", "t") else 1


def _unit_time(items: list[Work], sizes: dict[sympy.Symbol, int], layout: Layout, gpu: Gpu,
               peak: float, elem: int, attention: str,
               eager: Mapping[str, NodeKernels] | None = None) -> UnitTime:
    t = layout.tp
    bandwidth = gpu.kernel_bandwidth  # memory-bound ops and the softmax's passes
    forward = backward = attn = 0.0
    f_flops = b_flops = a_flops = 0.0  # what the timed kernels execute (hardware FLOPs)
    for w in items:
        found = None if eager is None else eager.get(w.node)
        if found is not None:  # --kernels eager: what runs around (or instead of) the op
            div = _split(w, layout)
            whole = w.kind == "memory"
            forward += _eager_time(found.forward, whole, div, gpu, peak, elem)
            backward += _eager_time(found.backward, whole, div, gpu, peak, elem)
            if whole:
                flops = _num(w.flops, sizes) / div  # the op's arithmetic, in its kernels
                f_flops += flops
                b_flops += 2 * flops if w.grads is None or any(w.grads) else 0.0
                continue
        if w.kind == "gemm":
            m, n, k = (_num(d, sizes) for d in w.dims)
            n, k = (n / t, k) if w.split == "N" else (n, k / t) if w.split == "K" else (n, k)
            forward += gemm_time(m, n, k, gpu, peak, elem)
            # its FLOPs, a bias's addition included (each gradient's GEMM as many)
            gemm_flops = max(2 * m * n * k, _num(w.flops, sizes) / (t if w.split else 1))
            f_flops += gemm_flops
            if _gets(w, 0):  # the input's gradient
                backward += gemm_time(m, k, n, gpu, peak, elem)
                b_flops += gemm_flops
            if _gets(w, 1):  # the weight's
                backward += gemm_time(n, k, m, gpu, peak, elem)
                b_flops += gemm_flops
        elif w.kind == "attention":
            div = t if w.split == "t" else 1
            batch, sq, sk = (_num(d, sizes) for d in w.dims)
            batch /= div
            if attention == "fused" and not w.explicit:
                work = _num(w.flops, sizes) / div
                keys = min(sk, w.window) if w.window else sk  # the keys each query reads
                fwd, bwd = flash_time(work, batch, sq, keys, _num(w.extra, sizes), w.masked,
                                      gpu, peak)
                bwd *= float(w.backward_share)
                fwd_f, bwd_f = work, ATTENTION_BACKWARD * work * float(w.backward_share)
            else:
                hd = _num(w.extra, sizes)
                # the softmax's (and dropout's) passes over the scores; under --kernels eager
                # explicit matmuls' element-wise kernels are the census's own (counted above)
                traffic = 0.0 if found is not None and w.explicit else 1.0
                scores = _num(w.nbytes, sizes) / div * traffic
                qk = gemm_time(sq, sk, hd, gpu, peak, elem, batch)
                pv = gemm_time(sq, hd, sk, gpu, peak, elem, batch)
                fwd = qk + pv + 2 * scores / bandwidth
                # dQ and dK (QK^T-sized), dV and the weights' gradient (A.V-sized), then the
                # softmax's backward over the scores; hard attention's q and k get no
                # gradient: dV alone (``_attention_backward``)
                scored = _gets(w, 0) or _gets(w, 1) or _gets(w, 3)
                bwd = (qk * (_gets(w, 0) + _gets(w, 1)) + pv * (_gets(w, 2) + scored)
                       + (3 * scores / bandwidth if scored else 0.0))
                if w.mask != 0:  # attention dropout, one more pass over the weights:
                    # forward reads them and writes the dropped-out ones and the mask,
                    # backward reads the gradient and the mask and writes the gradient
                    drop = (2 * scores + _num(w.mask, sizes) / div * traffic) / bandwidth
                    fwd += drop
                    bwd += drop if scored else 0.0
                # every score, both products and the per-score element-wise work
                product = 2 * batch * sq * sk * hd
                other = max(0.0, _num(w.dense_flops, sizes) / div - 2 * product)
                fwd_f = 2 * product + other
                bwd_f = (product * (_gets(w, 0) + _gets(w, 1) + _gets(w, 2) + scored)
                         + (2 * other if scored else 0.0))
            forward += fwd
            backward += bwd
            attn += fwd
            f_flops += fwd_f
            b_flops += bwd_f
            a_flops += fwd_f
        elif w.kind == "experts":
            fwd, bwd = _experts_time(w, sizes, layout, gpu, peak)
            forward += fwd
            backward += bwd * float(w.backward_share)
            flops = _num(w.flops, sizes) / (t if w.split == "N" else 1)
            f_flops += flops
            b_flops += 2 * flops * float(w.backward_share)
        else:
            div = t if w.split == "t" or (w.split == "rows" and layout.sp) else 1
            flops, nbytes = _num(w.flops, sizes) / div, _num(w.nbytes, sizes) / div
            fwd = roofline(flops, nbytes, gpu.vector_flops, bandwidth)
            forward += fwd
            f_flops += flops
            if w.grads is None or any(w.grads):  # no operand's gradient: no backward
                backward += 2 * fwd
                b_flops += 2 * flops
    return UnitTime(forward, backward, attn, f_flops, b_flops, a_flops)


def _gets(w: Work, operand: int) -> bool:
    """Whether the op's backward computes this operand's gradient."""
    return w.grads is None or (operand < len(w.grads) and w.grads[operand])


def _experts_time(w: Work, sizes: dict[sympy.Symbol, int], layout: Layout, gpu: Gpu,
                  peak: float) -> tuple[float, float]:
    """Seconds of the routed experts on one rank, forward and backward, by the roofline (the
    module's rule: max(FLOPs / achievable FLOP/s, bytes / achievable bandwidth)).

    Expert parallelism (GShard, Lepikhin et al. 2020 §2.2; Megatron-LM's ``--expert-model-
    parallel-size``): each of the ep ranks holds E / ep experts and, after the all-to-all,
    receives the pairs its ep group routes to them: under uniform routing ep x tokens x k x
    (1 / ep) = tokens x k pairs, the FLOPs of the whole op on its own micro-batch, each local
    expert running ep x tokens x k / E of them. Tensor parallelism splits each expert's hidden
    size (its weights and FLOPs by t; the pairs' rows of d stay whole: the input gathered,
    the output partial sums). Bytes forward: the rank's experts' weights read once per
    micro-batch, the pairs' rows read and written; backward twice the FLOPs (input and weight
    gradients), the weights read again and their gradients written, the rows read (the
    input, the output's gradient) and the input's gradient written."""
    t, ep = layout.tp, layout.ep
    m, n, _ = (_num(d, sizes) for d in w.dims)
    experts = _num(w.extra, sizes)
    split = t if w.split == "N" else 1
    flops = _num(w.flops, sizes) / split
    if not flops:
        return 0.0, 0.0
    local = experts / ep  # the experts this rank holds, each on ep times the pairs
    eff = gemm_efficiency(m * ep, n / split, gpu, local)
    rate = peak * gpu.matmul_fraction * eff
    bandwidth = gpu.streaming
    weights = _num(w.nbytes, sizes) / ep / split
    rows = _num(w.routed, sizes)
    forward = roofline(flops, weights + 2 * rows, rate, bandwidth)
    backward = roofline(2 * flops, 2 * weights + 3 * rows, rate, bandwidth)
    return forward, backward


# ---- the step --------------------------------------------------------------------------------

def _unit_comm(graph: Graph, layout: Layout) -> list[tuple[float, float, float, float]]:
    """Per unit, bytes of one micro-batch: (forward all-reduces, backward all-reduces,
    vocabulary reductions, tokens one MoE exchange moves), whole tensors."""
    table: dict[tuple[int, int, int], list[tuple[float, float, float, float]]] = graph.memo(
        "parallel_unit_comm", dict)
    key = (layout.micro_batch, layout.seq, layout.target)
    if key not in table:
        sizes = {SYMBOLS["B"]: layout.micro_batch, SYMBOLS["S"]: layout.seq,
                 SYMBOLS["T"]: layout.target}
        table[key] = [(_num(u.tp_forward, sizes), _num(u.tp_backward, sizes),
                       _num(u.vocab_reduce, sizes), _num(u.a2a, sizes))
                      for u in units(graph)[0]]
    return table[key]


def _collectives(graph: Graph, layout: Layout) -> list[tuple[int, int, int]]:
    """Per unit, how many (forward, backward, vocabulary) collectives one micro-batch runs
    (for their latency)."""
    def make() -> list[tuple[int, int, int]]:
        _, placement, _ = units(graph)
        if placement is None:
            return [(0, 0, 0) for _ in units(graph)[0]]
        forward = set(placement.forward_reduce)
        readers = set(placement.backward_reduce.values())
        vocab = set(placement.vocab_reduce)
        return [(sum(n in forward for n in u.ops), sum(n in readers for n in u.ops),
                 sum(n in vocab for n in u.ops)) for u in units(graph)[0]]
    found: list[tuple[int, int, int]] = graph.memo("parallel_collectives", make)
    return found


def step_time(graph: Graph, layout: Layout, gpu: Gpu, attention: str,
              members: Sequence[StageMembers], figures: Sequence[StageFigures],
              boundaries: Sequence[float], kernels: KernelSource | None = None
              ) -> dict[str, Any]:
    """The step's time on the slowest stage and its parts (see the module docstring).

    ``members``: the stages' folded units; ``figures``: their planner figures (states);
    ``boundaries``: bytes one rank holds of what crosses from each stage into the next;
    ``kernels``: eager kernels to time instead of one per op (``--kernels eager``)."""
    all_units = units(graph)[0]
    times = unit_times(graph, layout, gpu, attention, kernels)
    comm = _unit_comm(graph, layout)
    counts = _collectives(graph, layout)
    t, p, d, m, v = layout.tp, layout.pp, layout.dp, layout.microbatches, layout.vpp
    tp_bw, tp_lat = link(gpu, t)
    # an all-to-all is no ring: each rank's rows for other nodes leave through its own NIC
    # share, one a rank however many of the group share its node
    ep_bw, ep_lat = link(gpu, t * layout.ep, gpu.per_node)
    elem = 4 if layout.dtype == "float32" else 2
    mem_bw = gpu.streaming
    slots = []
    # a deep pipeline's middle stages are alike: their slot is worked out once
    seen: dict[tuple[StageMembers, float, States], dict[str, float]] = {}
    for s, group in enumerate(members):
        # a stage receives its input and sends its output: the larger boundary is its share
        edge = max([boundaries[j] for j in (s - 1, s) if 0 <= j < len(boundaries)],
                   default=0.0)
        held = figures[s].states
        key = (group, edge, held)
        if key in seen:
            slots.append(seen[key])
            continue
        fwd = bwd = rec = tp_time = ep_time = flops = 0.0
        for i, count in group.groups:
            ut, (f_b, b_b, voc, a2a), (nf, nb, nv) = times[i], comm[i], counts[i]
            fwd += ut.forward * count
            bwd += ut.backward * count
            flops += (ut.forward_flops + ut.backward_flops) * count
            full = layout.recompute == "full" and all_units[i].is_layer
            if full:
                rec += ut.forward * count
                flops += ut.forward_flops * count
            elif layout.recompute == "selective":
                rec += ut.attention_forward * count
                flops += ut.attention_flops * count
            # a forward all-reduce of n bytes per P node, a backward one per reader
            per_f = f_b / nf if nf else 0.0
            per_b = b_b / nb if nb else 0.0
            tp_mb = (nf * ring_time(per_f, t, True, tp_bw, tp_lat)
                     + nb * ring_time(per_b, t, True, tp_bw, tp_lat)
                     + nv * ring_time(voc / nv if nv else 0.0, t, True, tp_bw, tp_lat))
            if full:
                tp_mb += nf * ring_time(per_f, t, True, tp_bw, tp_lat)
            tp_time += tp_mb * count
            # dispatch + combine, forward and backward; full recompute reruns the forward two
            exchanges = 6 if full else 4
            ep_time += exchanges * ring_time(a2a, layout.ep, False, ep_bw, ep_lat) * count
        crossings = 2 * v if p > 1 else 0
        pp_time = crossings * _p2p(edge, layout, gpu)
        accumulate = _accumulate_time(layout, held, elem, mem_bw)
        fsdp = 0.0
        if kernels is not None and layout.zero >= 3:  # FSDP2 as it runs eagerly
            groups = fsdp_groups(graph, group.groups)
            fsdp = sum(memory_seconds(b, mem_bw) for _, b in copy_kernels(graph, groups, layout))
            # its sharded float32 gradient is the first micro-batch's reduced output (a
            # view); each later one is added to it (``foreach_reduce``: grad += new)
            accumulate = (m - 1) / m * sum(memory_seconds(b, mem_bw) for _, b in
                                           accumulate_kernels(graph, groups, layout))
        seen[key] = {"forward": fwd, "backward": bwd, "recompute": rec, "tp": tp_time,
                     "ep": ep_time, "pp": pp_time, "accumulate": accumulate, "fsdp": fsdp,
                     "flops": flops}
        slots.append(seen[key])
    slot = [x["forward"] + x["backward"] + x["recompute"] + x["tp"] + x["ep"] + x["pp"]
            + x["accumulate"] + x["fsdp"] for x in slots]
    slowest = max(range(len(slot)), key=lambda i: slot[i])
    pipe = slot[slowest] * (m + (p - 1) / v)
    exposed: dict[tuple[States, int], float] = {}
    for s in range(len(members)):
        key_dp = (figures[s].states, id(slots[s]))
        if key_dp not in exposed:
            exposed[key_dp] = _dp_exposed(layout, gpu, figures[s].states, slots[s],
                                          sum(c for _, c in members[s].groups), elem)
    dp_exposed = max(exposed.values())
    # (over the distinct values only: a deep pipeline's stages mostly repeat one another's)
    embedding = max(_tied_time(tied, layout, gpu) for tied in {f.tied for f in figures})
    optimizer = max(_optimizer_time(states, mem_bw, layout, kernels)
                    for states in {f.states for f in figures})
    total = pipe + dp_exposed + embedding + optimizer
    x = slots[slowest]
    # what the timed kernels execute in the step, every rank: each stage's per micro-batch,
    # on its t x d ranks (work a rank does whole is done t times)
    hardware = sum(one["flops"] for one in slots) * m * t * d
    return {
        "hardware_flops": hardware,
        "time_s": total,
        "bubble": bubble(p, m, v),
        "slowest_stage": slowest,
        "time_parts": {
            "forward": x["forward"] * m, "backward": x["backward"] * m,
            "grad_accumulation": x["accumulate"] * m, "fsdp_copies": x["fsdp"] * m,
            "recompute": x["recompute"] * m, "tp_exposed": x["tp"] * m,
            "ep_exposed": x["ep"] * m, "pp_exposed": x["pp"] * m,
            "bubble": slot[slowest] * (p - 1) / v, "dp_exposed": dp_exposed,
            "embedding_exposed": embedding, "optimizer": optimizer,
        },
    }


def _tied_time(tied: Sequence[tuple[int, int]], layout: Layout, gpu: Gpu) -> float:
    """Seconds of the all-reduce of a table tied across pipeline stages (``tied``: (stages
    holding it, the rank's gradient bytes)): after the backward and the data-parallel
    reduction (Megatron-LM's ``finalize_model_grads``: ``finish_grad_sync``, then the
    embedding group's all-reduce), exposed; one collective among ranks t x d x (p - 1) apart,
    inside a node when the whole pipeline is (``_p2p``'s rule), else one NIC each."""
    apart = layout.tp * layout.dp * max(layout.pp - 1, 1)
    bw, lat = link(gpu, layout.tp * layout.dp * layout.pp, apart)
    return sum(ring_time(nbytes, k, True, bw, lat) for k, nbytes in tied)


def _p2p(nbytes: float, layout: Layout, gpu: Gpu) -> float:
    """Seconds to send a stage boundary (``nbytes`` held by each rank) to the next stage."""
    if nbytes <= 0:
        return 0.0
    t = layout.tp
    span = t * layout.dp * layout.pp
    if span <= gpu.per_node:  # the whole pipeline in one node: NVLink
        return nbytes / (gpu.intra_node * LINK_EFFICIENCY) + NVLINK_LATENCY
    if layout.sp or t == 1:  # each rank's rows are its 1/t already
        return nbytes / (gpu.network * LINK_EFFICIENCY) + NET_LATENCY
    bw, lat = link(gpu, t)
    return (nbytes / t / (gpu.network * LINK_EFFICIENCY) + NET_LATENCY
            + ring_time(nbytes, t, False, bw, lat))


def grad_bytes(layout: Layout) -> int:
    """Bytes per gradient element the data-parallel reduction moves: the gradients as they are
    kept (``layout.state_bytes`` of the --states convention; ZeRO-3's fp32 shards), the bytes
    ``planner._dp_bytes`` counts."""
    return 4 if layout.zero >= 3 else state_bytes(layout.dtype, layout.states)[1]


def _accumulate_time(layout: Layout, s: States, elem: int, bandwidth: float) -> float:
    """Seconds of gradient accumulation per micro-batch (the step's m micro-batches average),
    the module docstring's rule: ZeRO 0-1 into the full buffer, ZeRO 2-3 into the 1/d shard
    after each reduce-scatter (``--kernels eager`` ZeRO 3 replaces it with FSDP2's kernels)."""
    m = layout.microbatches
    reduced = s.unsharded - s.frozen_unsharded  # elements a gradient reaches
    if layout.zero <= 1:
        # Megatron-LM's fp32 main_grad is zeroed each step and added into from the first
        # micro-batch (distributed_data_parallel's hook: main_grad.add_(grad)); a buffer of the
        # gradients' own dtype is the first gradient (torch AccumulateGrad steals it)
        adds = m if state_bytes(layout.dtype, layout.states)[1] != elem else m - 1
        return adds / m * (reduced * elem + 2 * s.gradients) / bandwidth
    # ZeRO 2-3: the reduce-scatter's output shard is the first micro-batch's gradient (FSDP's
    # sharded .grad, DeepSpeed's partitioned gradients); later ones are added: read both, write
    shard_adds = (m - 1) / m * 3 * s.gradients
    rb = grad_bytes(layout)
    copy_in = reduced * (elem + rb) if rb != elem else 0.0
    return (shard_adds + copy_in) / bandwidth


def _dp_exposed(layout: Layout, gpu: Gpu, s: States, slot: dict[str, float], layers: int,
                elem: int) -> float:
    """Seconds of data-parallel traffic the stage cannot hide (the overlap rules)."""
    d = layout.dp
    if d <= 1:
        return 0.0
    t, ep = layout.tp, layout.ep
    exposed = 0.0
    # the dense weights' group: d ranks t apart; the experts': the d / ep ranks holding the
    # same experts, t x ep apart (expert-parallel ranks are taken from the data-parallel ones)
    for elements, ranks, stride in ((s.unsharded - s.expert_unsharded, d, t),
                                    (s.expert_unsharded, d // ep, t * ep)):
        if elements <= 0 or ranks <= 1:
            continue
        bw, lat = link(gpu, t * d, stride)
        grads = elements * float(grad_bytes(layout))
        last = min(1.0, BUCKET_ELEMENTS / elements)
        buckets = math.ceil(elements / BUCKET_ELEMENTS)
        # the gradients' reduction: all of it after the backward, or what the backward hides
        hidden = 0.0 if layout.grad_reduce == "after" else 1.0
        if layout.zero == 0:
            reduce = bucketed_ring_time(grads, buckets, ranks, True, bw, lat)
            exposed += max(ring_time(grads * last, ranks, True, bw, lat) if hidden else reduce,
                           reduce - hidden * (slot["backward"] + slot["recompute"]))
        elif layout.zero in (1, 2):
            reduce = bucketed_ring_time(grads, buckets, ranks, False, bw, lat)
            gather = bucketed_ring_time(elements * elem, buckets, ranks, False, bw, lat)
            # ZeRO 2 holds 1/d of the gradients: every micro-batch's are reduce-scattered under
            # its own backward (DeepSpeed ZeRO-2's per-micro-step reduction, FSDP
            # SHARD_GRAD_OP), the last bucket of each exposed as ZeRO 3's are per micro-batch
            times = layout.microbatches if layout.zero == 2 else 1
            exposed += times * max(ring_time(grads * last, ranks, False, bw, lat) if hidden
                                   else reduce,
                                   reduce - hidden * (slot["backward"] + slot["recompute"]))
            exposed += max(ring_time(elements * elem * last, ranks, False, bw, lat),
                           gather - slot["forward"])
        else:
            # one FSDP unit per layer plus the root's (torchtitan: ``fully_shard`` per block,
            # then the model): each unit's gather and reduce-scatter is its own collective
            units = max(layers, 1) + 1
            per_mb = (2 * bucketed_ring_time(elements * elem, units, ranks, False, bw, lat)
                      + bucketed_ring_time(grads, units, ranks, False, bw, lat))
            compute = slot["forward"] + slot["backward"] + slot["recompute"]
            first = ring_time(elements * elem / units, ranks, False, bw, lat)
            exposed += layout.microbatches * (max(0.0, per_mb - compute) + first)
    return exposed


def _optimizer_time(s: States, bandwidth: float, layout: Layout,
                    kernels: KernelSource | None = None) -> float:
    """Seconds of the Adam step: read weights, gradients, optimizer states; write weights and
    optimizer states (one fused pass). Eager: ``torch.optim.AdamW``'s own kernels over the
    float32 elements the rank steps (``kernels.optimizer_bytes`` per element)."""
    if kernels is not None:
        return stepped_elements(s, layout) * kernels.optimizer_bytes / bandwidth
    return (2 * s.weights + s.gradients + 2 * s.optimizer) / bandwidth
