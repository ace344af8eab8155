"""Which saved tensors a tensor-parallel rank keeps 1/t of (tfgraph.parallel.units): an op's
own scratch is split when the op works on split data, except the scratch that stays whole on
every rank (``WHOLE_SCRATCH``). tests/test_distributed.py measures the same on ranks under
torchrun (saved_tensors_hooks); these pin the rule without a launch."""

from __future__ import annotations

from typing import Any

import tfgraph
from tfgraph.ops import OPS
from tfgraph.parallel.units import _split, units

from conftest import ROOT


def _graph(name: str) -> Any:
    spec = tfgraph.load_spec(ROOT / "specs" / name).model_copy(update={"dtype": "float32"})
    return tfgraph.compile(spec, loss=True)


def _scratch_split(graph: Any, op: str) -> dict[str, bool]:
    """Each scratch tensor the first ``op`` node saves -> whether a rank keeps 1/t of it."""
    placement = units(graph)[1]
    assert placement is not None
    node = next(n for n in graph.ops() if n.op == op)
    entries = OPS[op].saved([graph.node(i).type for i in node.inputs], node.type, node.attrs)
    return {ref[1]: _split(graph, f"{node.name}#{ref[1]}", placement)
            for ref, _ in entries if ref[0] == "tmp"}


def test_experts_split_on_hidden_units_keep_their_routed_tokens_whole() -> None:
    # Megatron-LM's expert tensor parallelism: every rank gathers each routed token at full
    # width and returns a full-width partial output; only the hidden units are split.
    assert _scratch_split(_graph("tiny-moe.yaml"), "experts") == {
        "tokens": False, "hidden": True, "expert_out": False, "indices": False}


def test_vocabulary_split_cross_entropy_keeps_its_total_weight_whole() -> None:
    assert _scratch_split(_graph("tiny-llama.yaml"), "cross_entropy") == {
        "log_probs": True, "total_weight": False}

