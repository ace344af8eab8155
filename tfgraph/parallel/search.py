"""``tfgraph plan --search``: every valid layout of a number of GPUs, the ones that fit ranked
by estimated throughput (tokens/s).

A layout is valid when tp x pp x dp = GPUs and ``layout.check`` accepts it (heads, key/value
heads, split dimensions, layers, experts and the batch divide). Enumerated: tp up to one node
(tensor parallelism's all-reduces need NVLink, Narayanan et al. 2021 §3.3, takeaway #1), every
pp dividing the layers, ep dividing dp and the experts, ZeRO 0-3, sequence parallelism on and
off, the three recompute choices and power-of-two micro-batches.

Precondition: the graph lints. Postcondition: the graph keeps only memoised unit figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph
from tfgraph.parallel.gpus import Gpu
from tfgraph.parallel.layout import RECOMPUTE, Layout, experts
from tfgraph.parallel.planner import plan

MAX_MICRO_BATCH = 16


def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def layouts(graph: Graph, gpus: int, base: Layout, per_node: int) -> Iterator[Layout]:
    """Candidate layouts of ``gpus`` GPUs with ``base``'s batch, length and precision."""
    moe = experts(graph)
    for tp in _divisors(gpus):
        if tp > per_node:
            break
        for pp in _divisors(gpus // tp):
            dp = gpus // (tp * pp)
            eps = [e for e in _divisors(dp) if moe and moe % e == 0] if moe else [1]
            per_rank = base.global_batch // dp if base.global_batch % dp == 0 else 0
            micro = [b for b in (1, 2, 4, 8, MAX_MICRO_BATCH) if per_rank and per_rank % b == 0]
            for ep in eps:
                for zero in (0, 1, 2, 3):
                    for sp in ((False, True) if tp > 1 else (False,)):
                        for recompute in RECOMPUTE:
                            for mb in micro:
                                yield replace(base, tp=tp, pp=pp, dp=dp, ep=ep, zero=zero,
                                              sp=sp, recompute=recompute, micro_batch=mb)


def search(graph: Graph, gpus: int, base: Layout, gpu: Gpu, attention: str = "fused",
           top: int = 10) -> list[dict[str, Any]]:
    """Plans of the ``top`` fitting layouts, fastest first (ties: less memory)."""
    fitting: list[dict[str, Any]] = []
    refusals: list[str] = []
    for layout in layouts(graph, gpus, base, gpu.per_node):
        try:
            result = plan(graph, layout, gpu, attention)
        except TfgraphError as e:
            refusals.append(str(e))
            continue
        if result["per_rank"]["fits"]:
            fitting.append(result)
    if not fitting:
        why = f" (e.g. {refusals[0]})" if refusals else ""
        raise TfgraphError(f"no layout of {gpus} GPUs fits in {gpu.memory / 1e9:g} GB{why}")
    fitting.sort(key=lambda r: (-r["step"]["tokens_per_s"], r["per_rank"]["memory"]["total"]))
    return fitting[:top]
