"""Which saved tensors a tensor-parallel rank keeps 1/t of (tfgraph.parallel.units): an op's
own scratch is split when the op works on split data, except the scratch that stays whole on
every rank (``OpDef.whole_scratch``); under sequence parallelism the rest is the rank's rows or
whole on every rank as ``tfgraph.parallel.sequence_plan`` runs it. tests/test_distributed.py
and tests/test_sequence_parallel.py measure the same on ranks under torchrun
(saved_tensors_hooks); these pin the rule without a launch."""

from __future__ import annotations

from typing import Any

import pytest

import tfgraph
from tfgraph.graph.ops import OPS
from tfgraph.parallel.units import _kept_as, _resolve, _split, flops_kind, sequence_plan, units

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



def _kept_under_sp(graph: Any) -> dict[str, str]:
    """Every tensor the graph's ops save -> how a rank keeps it under tensor and sequence
    parallelism: "split", "whole" (the rank's rows with sp) or "replicated"."""
    placement, sequence = units(graph)[1], sequence_plan(graph)[0]
    assert placement is not None and sequence is not None
    out: dict[str, str] = {}
    for node in graph.ops():
        entries = OPS[node.op].saved([graph.node(i).type for i in node.inputs], node.type,
                                     node.attrs)
        for ref, _ in entries:
            tensor = _resolve(graph, node, ref)
            if tensor is not None:
                out.setdefault(tensor, _kept_as(graph, node, ref, tensor, placement, sequence))
    return out


def test_under_sp_ids_labels_and_what_reads_the_gathered_sequence_stay_whole() -> None:
    """tiny-moe: the stream and the norms' statistics are the rank's rows; token ids, labels,
    the loss's total weight, the router's scores and the routed experts' tokens, outputs and
    indices are whole on every rank (the embedding's and the loss's backward read every row;
    router and experts run on the all-gathered sequence); the experts' hidden buffers and the
    vocabulary-split loss's log-probabilities stay split."""
    kept = _kept_under_sp(_graph("tiny-moe.yaml"))
    ffn = "decoder.layers.0.ffn"
    everywhere = ("input_ids", "labels", "loss#total_weight", f"{ffn}.route#indices",
                  f"{ffn}.route#softmax", f"{ffn}.experts#tokens", f"{ffn}.experts#expert_out",
                  f"{ffn}.experts#indices")
    assert {t: kept[t] for t in everywhere} == dict.fromkeys(everywhere, "replicated")
    assert kept[f"{ffn}.norm"] == kept[f"{ffn}.norm#stats"] == "whole"
    assert kept["decoder.layers.0.self_attn.residual"] == "whole"
    assert kept[f"{ffn}.experts#hidden"] == kept["loss#log_probs"] == "split"


def test_under_sp_a_tied_heads_logits_and_loss_are_vocabulary_split() -> None:
    """tiny-opt ties its head to the token table, which is split by vocabulary like an
    untied head (Megatron): the head reads the gathered final norm and its logits and the
    loss's log-probabilities are 1/t per rank, as their FLOPs are (issue 26: the
    log-probabilities were counted whole in memory while their FLOPs were divided by t); the
    final norm's input, which the head's all-gather leaves as the rank's rows, is 1/t."""
    graph = _graph("tiny-opt.yaml")
    kept = _kept_under_sp(graph)
    assert kept["loss#log_probs"] == "split"
    assert kept["decoder.norm"] == "whole"
    placement, sequence = units(graph)[1], sequence_plan(graph)[0]
    for name in ("logits", "loss"):
        assert flops_kind(graph, graph.node(name), placement, sequence) == "split"


@pytest.mark.parametrize("name", ["tiny-opt.yaml", "tiny-encoder.yaml", "tiny-moe.yaml",
                                  "tiny-llama.yaml", "tiny-bert.yaml"])
def test_under_sp_an_ops_flops_are_divided_as_what_it_keeps_of_its_own(name: str) -> None:
    """Memory and FLOPs follow one rule: an op whose output or own scratch a rank keeps
    split, as the rank's rows, or whole on every rank (``_kept_as``) does its work the same
    way (``flops_kind``: 1/t, 1/t under sp, or whole on every rank), scratch that stays whole
    on every rank by design (``OpDef.whole_scratch``: routed tokens at full width) apart."""
    graph = _graph(name)
    placement, sequence = units(graph)[1], sequence_plan(graph)
    if placement is None or sequence[0] is None:
        pytest.skip(f"{name}: no tensor/sequence-parallel form")
    checked = 0
    for node in graph.ops():
        entries = OPS[node.op].saved([graph.node(i).type for i in node.inputs], node.type,
                                     node.attrs)
        for ref, _ in entries:
            if ref[0] == "in" or (ref[0] == "tmp" and ref[1] in OPS[node.op].whole_scratch):
                continue
            if placement.of[node.name] == "P":  # reduced at once: nobody keeps the partial
                continue
            tensor = _resolve(graph, node, ref)
            assert tensor is not None
            kept = _kept_as(graph, node, ref, tensor, placement, sequence[0])
            assert kept == flops_kind(graph, node, placement, sequence[0]), (node.name, ref)
            checked += 1
    assert checked > 0
