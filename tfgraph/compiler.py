"""``tfgraph.compile``: spec (or path) -> lowered, linted graph with its report on demand.

The top of the core's layering (tensor <- ops <- ir <- lower <- passes <- compiler): the IR
knows nothing of reports; the graph ``compile`` returns is a ``CompiledGraph``, which adds
``report()`` on top of the IR.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tfgraph.ir import Graph
from tfgraph.lower import lower
from tfgraph.report import build_report
from tfgraph.spec import Spec


class CompiledGraph(Graph):
    """A graph lowered from a spec, with the cost report as a method."""

    def report(self, batch: int = 1, seq: int = 128, tgt_seq: int | None = None,
               fused_attention: bool = False) -> dict[str, Any]:
        """The cost report (same dict as ``tfgraph report --json``); see tfgraph.report."""
        return build_report(self, batch=batch, seq=seq, tgt_seq=tgt_seq,
                            fused_attention=fused_attention)


def compile(spec: Spec | str | Path, lint: bool = True,  # noqa: A001
            cache: bool = False, part: str | None = None) -> CompiledGraph:
    """Lower ``spec`` to an op graph with symbolic shapes; ``lint`` checks it (on by default).
    ``cache``: the KV-cache inference graph of a decoder (README, "KV cache"); for an
    encoder-decoder, ``part`` "encoder" or "decoder" says which of its two graphs.

    Costs are computed lazily by ``graph.report(...)`` (tfgraph.report) and memoised on the
    graph until it changes.
    """
    if not isinstance(spec, Spec):
        from tfgraph.loader import load_spec

        spec = load_spec(spec)
    graph = lower(spec, None, CompiledGraph, cache, part)
    if lint:
        graph.lint()
    return graph
