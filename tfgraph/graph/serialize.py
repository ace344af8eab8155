"""The op graph as JSON (``tfgraph build --to json``): every node in topological order.

One object per node: name, op, category (from the op table), inputs (operand order), attrs,
scope, meta (part, stack, layer, sublayer, role, module: where lowering put it), shape (one string
per dimension, sympy syntax in B, S, T), dtype, and its costs as sympy strings in B, S, T
(``flops_matmul``, ``flops_other``, ``saved_bytes`` for backward, ``temp_bytes`` of scratch) or,
for a parameter, its element count. ``saved_bytes`` is what that op keeps; a tensor kept by
several ops (q, k and v projections saving one input) appears under each of them, while
``memory.saved_for_backward`` counts it once. Written atomically (``tfgraph.io.atomic_write``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import sympy

from tfgraph.passes.cost import param_count
from tfgraph.passes.figures import symbolic
from tfgraph.io import atomic_write
from tfgraph.graph.ir import Graph

FORMAT = "tfgraph.graph/2"  # 2: node category and meta; graph sizes and modules


def _attr(value: Any) -> Any:
    """Attribute values as JSON: tuples become lists, sympy numbers become numbers."""
    if isinstance(value, (tuple, list)):
        return [_attr(v) for v in value]
    if isinstance(value, sympy.Basic):
        if value.is_Integer:
            return int(value)
        return float(value) if value.is_number else str(value)
    return value


def graph_dict(graph: Graph) -> dict[str, Any]:
    """The JSON-ready description of ``graph``."""
    costs = {c.node: c for c in symbolic(graph)["costs"]}
    nodes = []
    for node in graph.nodes():
        entry: dict[str, Any] = {
            "name": node.name,
            "op": node.op,
            "category": node.category,
            "inputs": list(node.inputs),
            "attrs": {k: _attr(v) for k, v in node.attrs.items()},
            "scope": node.scope,
            "meta": dataclasses.asdict(node.meta),
            "shape": [str(d) for d in node.type.shape],
            "dtype": node.type.dtype,
        }
        if node.is_param:
            entry["cost"] = {"params": param_count(node)}
        elif node.name in costs:
            c = costs[node.name]
            entry["cost"] = {
                "flops_matmul": str(c.matmul),
                "flops_other": str(c.other),
                "saved_bytes": str(sympy.Add(*(b for _, b in c.saved))),
                "temp_bytes": str(c.temp),
            }
        nodes.append(entry)
    spec = graph.spec
    return {
        "format": FORMAT,
        "name": graph.name,
        "spec": spec.model_dump(mode="json") if spec is not None else None,
        "symbols": {"B": "batch", "S": "sequence length (source for encoder-decoder)",
                    "T": "target length"},
        "sizes": {k: _attr(v) for k, v in graph.sizes.items()},
        "modules": {p: {"class": m.cls, "doc": m.doc} for p, m in graph.modules.items()},
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "nodes": nodes,
    }


def write_graph_json(graph: Graph, path: str | os.PathLike[str]) -> Path:
    """Write ``graph`` as JSON to ``path`` atomically and return the path."""
    text = json.dumps(graph_dict(graph), indent=1)
    with atomic_write(path) as handle:
        handle.write(text + "\n")
    return Path(path)
