"""Model states count gradients and optimizer states only for the parameters a gradient
reaches (``OpDef.no_grad``, ``tfgraph.passes.gradients.frozen_params``): DeepSeek-V3's router
correction bias only shifts which experts top-k selects, so torch leaves its ``.grad`` None
and Adam keeps no state for it; hard attention's arg-max passes no gradient to q and k, so
the q and k linears of tiny-sandwich get none (``tfgraph.passes.gradients``). The plan's
per-rank gradients and optimizer states and the report's model states are what the PyTorch
module keeps after one backward and one Adam step; the parameter count still includes the
frozen parameters."""

from __future__ import annotations

import pytest
import torch

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch.functional import cross_entropy
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.planner import plan
from tfgraph.passes.cost import param_count
from tfgraph.passes.gradients import frozen_params
from tfgraph.passes.report import build_report
from tfgraph.spec.loader import load_spec

from conftest import ROOT
from test_torch_module import make_ids

STEP_BYTES = 4  # torch.optim.Adam's float32 step, one per parameter it updates


def _measured(graph: tfgraph.CompiledGraph) -> dict[str, int]:
    """Bytes the module keeps after one backward and one Adam step: weights, gradients,
    optimizer states; and the elements of the parameters left without a gradient."""
    model = to_torch(graph, seed=0).train()
    ids = make_ids(graph, 2, 12, 12)
    vocab = int(graph.node("logits").type.shape[-1])
    labels = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(5))
    cross_entropy(model(*ids), labels).backward()
    adam = torch.optim.Adam(model.parameters())
    adam.step()
    params = list(model.parameters())
    return {"weights": sum(p.nbytes for p in params),
            "gradients": sum(p.grad.nbytes for p in params if p.grad is not None),
            "optimizer": sum(t.nbytes for state in adam.state.values()
                             for t in state.values()),
            "no_grad": sum(p.numel() for p in params if p.grad is None),
            "params": sum(p.numel() for p in params)}


@pytest.mark.parametrize("name", ["tiny-deepseek-v3.yaml", "tiny-moe.yaml",
                                  "tiny-sandwich.yaml"])
def test_plan_and_report_count_the_states_the_module_keeps(name: str) -> None:
    spec = load_spec(ROOT / "specs" / name).model_copy(update={"dtype": "float32"})
    graph = tfgraph.compile(spec)
    got = _measured(graph)
    frozen = sum(param_count(p) for p in frozen_params(graph))
    assert frozen == got["no_grad"]
    if name == "tiny-deepseek-v3.yaml":  # the sigmoid router's correction bias, one per layer
        assert frozen == spec.ffn.experts * (spec.layers - spec.ffn.dense_layers) > 0
    layout = Layout(tp=1, dp=1, dtype="float32", seq=12, micro_batch=2, global_batch=2)
    memory = plan(tfgraph.compile(spec, loss=True), layout, gpu("h100"))["per_rank"]["memory"]
    assert {k: memory[k] for k in ("weights", "gradients", "optimizer")} == \
        {k: got[k] for k in ("weights", "gradients", "optimizer")}
    report = build_report(graph, batch=2, seq=12)
    assert report["params"] == got["params"]  # the bias is a parameter still
    # float32: weights + gradients + Adam's two moments and its float32 step per tensor
    steps = sum(1 for p in graph.params() if p not in frozen_params(graph))
    assert got["optimizer"] == 8 * (got["params"] - frozen) + STEP_BYTES * steps
    assert report["memory"]["model_states"] == \
        got["weights"] + got["gradients"] + got["optimizer"]


@pytest.mark.parametrize("name", ["tiny-bf16.yaml", "tiny-deepseek-v3.yaml"])
def test_mixed_precision_states_are_what_torch_keeps(name: str) -> None:
    """``--states mixed`` on a bfloat16 spec, measured: the bfloat16 module's weights and
    gradients, an fp32 master copy of every parameter a gradient reaches and torch.optim.AdamW
    stepping it once (every state tensor: both moments and the float32 step); ``report``'s
    model_states and a one-GPU ``plan``'s weights + gradients + optimizer are those bytes."""
    spec = load_spec(ROOT / "specs" / name).model_copy(update={"dtype": "bfloat16"})
    graph = tfgraph.compile(spec)
    model = to_torch(graph, seed=0).train()
    ids = make_ids(graph, 2, 12, 12)
    vocab = int(graph.node("logits").type.shape[-1])
    labels = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(5))
    cross_entropy(model(*ids), labels).backward()
    params = list(model.parameters())
    trained = [p for p in params if p.grad is not None]
    master = [p.detach().float().requires_grad_() for p in trained]
    for m, p in zip(master, trained):
        m.grad = p.grad.float()  # the fp32 gradient the master step reads (transient)
    adam = torch.optim.AdamW(master)
    adam.step()
    measured = (sum(p.nbytes for p in params) + sum(p.grad.nbytes for p in trained)
                + sum(m.nbytes for m in master)
                + sum(t.nbytes for state in adam.state.values() for t in state.values()))
    report = build_report(graph, batch=2, seq=12, states="mixed")
    assert report["memory"]["model_states"] == measured
    layout = Layout(tp=1, dp=1, dtype="bfloat16", seq=12, micro_batch=2, global_batch=2)
    memory = plan(tfgraph.compile(spec, loss=True), layout, gpu("h100"))["per_rank"]["memory"]
    assert memory["weights"] + memory["gradients"] + memory["optimizer"] == measured
