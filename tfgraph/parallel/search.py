"""``tfgraph plan --search``: every valid layout of a number of GPUs, the ones that fit ranked
by estimated throughput (tokens/s).

A layout is valid when tp x pp x dp = GPUs and ``layout.check`` accepts it (heads, key/value
heads, split dimensions, layers, experts and the batch divide). Enumerated: tp up to one node
(tensor parallelism's all-reduces need NVLink, Narayanan et al. 2021 §3.3, takeaway #1), every
pp dividing the layers or leaving the first and last stage one layer short of the others (Llama 3
405B's 126 layers on 16 stages, Dubey et al. 2024 §3.3.2; ``layout.balanced_stages``),
interleaving 1, 2 or 4 model chunks per stage where the stages' layers and the micro-batches
allow (``_chunks``), ep dividing dp and the experts, ZeRO 0-3, sequence parallelism on and
off, the three recompute choices and power-of-two micro-batches.

Precondition: the graph lints. Postcondition: the graph keeps only memoised unit figures.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph
from tfgraph.parallel.arguments import check_search
from tfgraph.parallel.gpus import Gpu, check_dtype
from tfgraph.parallel.layout import (RECOMPUTE, Layout, check, experts, interleavable,
                                     pipeline_units)
from tfgraph.parallel.planner import Staged, plan, staged
from tfgraph.parallel.timing import KernelSource

MAX_MICRO_BATCH = 16


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _chunks(layers: int, pp: int, microbatches: int, interleave: bool = True) -> list[int]:
    """Interleaving degrees tried: 1, and 2 and 4 where every stage's layers and Megatron-LM's
    rules (micro-batches a multiple of pp; not an encoder-decoder: ``interleave``) allow."""
    out = [1]
    if interleave and pp > 1 and layers % pp == 0 and microbatches % pp == 0:
        out += [v for v in (2, 4) if (layers // pp) % v == 0]
    return out


def layouts(graph: Graph, gpus: int, base: Layout, per_node: int) -> Iterator[Layout]:
    """Candidate layouts of ``gpus`` GPUs with ``base``'s batch, length and precision."""
    moe = experts(graph)
    layers = pipeline_units(graph)
    interleave = interleavable(graph)  # layout.check's rule
    for tp in _divisors(gpus):
        if tp > per_node:
            break
        for pp in _divisors(gpus // tp):
            if pp > 1 and (pp > layers or layers % pp not in (0, pp - 2)):
                continue
            dp = gpus // (tp * pp)
            eps = [e for e in _divisors(dp) if moe and moe % e == 0] if moe else [1]
            per_rank = base.global_batch // dp if base.global_batch % dp == 0 else 0
            micro = [b for b in (1, 2, 4, 8, MAX_MICRO_BATCH) if per_rank and per_rank % b == 0]
            for ep in eps:
                for zero in (0, 1, 2, 3):
                    for sp in ((False, True) if tp > 1 else (False,)):
                        for recompute in RECOMPUTE:
                            for mb in micro:
                                for vpp in _chunks(layers, pp, per_rank // mb,
                                                   interleave):
                                    yield replace(base, tp=tp, pp=pp, dp=dp, ep=ep, zero=zero,
                                                  sp=sp, recompute=recompute, micro_batch=mb,
                                                  vpp=vpp)


def search(graph: Graph, gpus: int, base: Layout, gpu: Gpu, attention: str = "fused",
           top: int = 10, keep: Callable[[Layout], bool] | None = None,
           kernels: KernelSource | None = None) -> list[dict[str, Any]]:
    """Plans of the ``top`` fitting layouts, fastest first (ties: less memory). Each layout's
    stages are evaluated and timed; the plan dicts are built for the ``top`` only. ``keep``:
    only the layouts it accepts (e.g. the features a given framework offers). ``kernels``:
    time the eager kernels (``--kernels eager``; the module is counted once per micro-batch
    size, seconds each on large models). Refused (TfgraphError naming the argument): counts
    that are not positive integers, a ``base`` that sets a field the search chooses (tp,
    pp, vpp, stage_layers, dp, ep, zero, sp, recompute, micro_batch), and what ``plan``
    refuses of the graph and the GPU."""
    graph, gpus, gpu, top = check_search(graph, gpus, base, gpu, top)
    check_dtype(gpu, base.dtype)
    check(graph, base)  # the batch, lengths and precision every candidate shares
    fitting: list[tuple[float, int, int, Layout, Staged]] = []
    refusals: list[str] = []
    for n, layout in enumerate(layouts(graph, gpus, base, gpu.per_node)):
        if keep is not None and not keep(layout):
            continue
        try:
            found = staged(graph, layout, attention)
        except TfgraphError as e:
            refusals.append(str(e))
            continue
        worst = found.worst.total
        if worst <= gpu.memory:
            seconds = found.time(graph, layout, gpu, attention, kernels)["time_s"]
            fitting.append((seconds, worst, n, layout, found))
    if not fitting:
        why = f" (e.g. {refusals[0]})" if refusals else ""
        raise TfgraphError(f"no layout of {gpus} GPUs fits in {gpu.memory / 1e9:g} GB at "
                           f"sequence length {base.seq:,}{why}")
    fitting.sort(key=lambda r: (r[0], r[1], r[2]))
    return [plan(graph, layout, gpu, attention, found, kernels=kernels)
            for _, _, _, layout, found in fitting[:top]]
