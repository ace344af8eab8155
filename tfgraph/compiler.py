"""``tfgraph.compile``: spec (or path) -> lowered, linted graph with costs on demand."""

from __future__ import annotations

from pathlib import Path

from tfgraph.ir import Graph
from tfgraph.lower import lower
from tfgraph.spec import Spec


def compile(spec: Spec | str | Path, lint: bool = True) -> Graph:  # noqa: A001 (API name)
    """Lower ``spec`` to an op graph with symbolic shapes; ``lint`` checks it (on by default).

    Costs are computed lazily by ``graph.report(...)`` (tfgraph.report) and cached.
    """
    if not isinstance(spec, Spec):
        from tfgraph.loader import load_spec

        spec = load_spec(spec)
    graph = lower(spec)
    if lint:
        graph.lint()
    return graph
