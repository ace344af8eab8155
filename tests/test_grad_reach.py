"""Which values a gradient reaches (``tfgraph.passes.gradients``), and the figures that follow:
hard attention's arg-max passes no gradient to q and k (``OpDef.grad_blocked``), so torch
leaves the q and k linears' ``.grad`` None and runs no backward for them; the attention's
backward is dV = A^T dO only. The report's forward + backward matmul FLOPs equal
``FlopCounterMode`` on the module's ``out.sum().backward()``, and its model states the bytes
of the weights plus the gradients and Adam moments of the parameters that get a gradient."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.passes import gradients
from tfgraph.passes.gradients import frozen_params
from tfgraph.passes.report import build_report, sizes_for
from tfgraph.spec.loader import load_spec

from conftest import ROOT
from test_torch_module import make_ids

SANDWICH = ROOT / "specs" / "tiny-sandwich.yaml"  # normalize: hardmax


def _graph(normalize: str = "hardmax") -> tfgraph.CompiledGraph:
    spec = load_spec(SANDWICH).model_copy(update={"dtype": "float32"})
    spec = spec.model_copy(update={"attention": spec.attention.model_copy(
        update={"normalize": normalize})})
    return tfgraph.compile(spec)


def _module(graph: tfgraph.CompiledGraph) -> torch.nn.Module:
    module = to_torch(graph, seed=0).eval()
    module.attention_impl = "math"  # FlopCounterMode counts 0 for the CPU SDPA kernel
    return module


def test_frozen_parameters_are_those_torch_leaves_without_grad() -> None:
    graph = _graph()
    module = _module(graph)
    module(*make_ids(graph, 2, 9, 9)).sum().backward()
    no_grad = {name for name, p in module.named_parameters() if p.grad is None}
    frozen = {p.name for p in frozen_params(graph)}
    assert frozen == no_grad
    assert frozen and all(".self_attn.q." in n or ".self_attn.k." in n for n in frozen)
    assert not frozen_params(_graph("softmax"))  # softmax passes every gradient


@pytest.mark.parametrize("normalize", ["hardmax", "softmax"])
@pytest.mark.parametrize("batch,seq", [(2, 9), (1, 24)])
def test_forward_and_backward_flops_equal_flop_counter(normalize: str, batch: int,
                                                       seq: int) -> None:
    graph = _graph(normalize)
    module = _module(graph)
    ids = make_ids(graph, batch, seq, seq, seed=batch)
    counter = FlopCounterMode(display=False)
    with counter:
        module(*ids).sum().backward()
    report = build_report(graph, batch=batch, seq=seq)
    flops = report["flops"]
    sizes = sizes_for(graph, batch, seq, None)
    savings = gradients.backward_savings(graph)
    saved_matmul = sum(int(m.xreplace(sizes)) for _, m, _ in savings)
    saved_other = sum(int(o.xreplace(sizes)) for _, _, o in savings)
    # the report's backward is 2 x forward less what the savings leave out, and its matmul
    # part is what torch runs
    assert flops["backward"] == 2 * flops["forward"] - saved_matmul - saved_other
    assert flops["train_step"] == flops["forward"] + flops["backward"]
    assert counter.get_total_flops() == 3 * flops["matmul"] - saved_matmul
    if normalize == "softmax":
        assert not savings and flops["backward"] == 2 * flops["forward"]
    else:
        assert flops["backward"] < 2 * flops["forward"]
        assert flops["backward_effective"] < 2 * flops["forward_effective"]


def test_model_states_are_what_the_module_keeps() -> None:
    graph = _graph()
    module = to_torch(graph, seed=0).train()
    module(*make_ids(graph, 2, 9, 9)).sum().backward()
    adam = torch.optim.Adam(module.parameters())
    adam.step()
    params = list(module.parameters())
    measured = (sum(p.nbytes for p in params)
                + sum(p.grad.nbytes for p in params if p.grad is not None)
                + sum(t.nbytes for state in adam.state.values()  # moments and step
                      for t in state.values()))
    report = build_report(graph, batch=2, seq=9)
    assert report["memory"]["model_states"] == measured
    assert report["params"] == sum(p.numel() for p in params)  # frozen ones still count


def test_loss_graph_agrees() -> None:
    spec = load_spec(SANDWICH)
    plain, loss = tfgraph.compile(spec), tfgraph.compile(spec, loss=True)
    assert [p.name for p in frozen_params(plain)] == [p.name for p in frozen_params(loss)]


def test_a_linear_whose_input_needs_no_gradient_keeps_its_weight_gradient() -> None:
    """A float input (not a parameter's descendant) needs no gradient: the linear's backward is
    its weight's gradient only (plus the bias's element-wise work), as torch computes it; a
    second linear on its output computes both."""
    from tfgraph.graph.ir import B, S, Graph
    from tfgraph.passes.figures import symbolic

    g = Graph("hand")
    x = g.input("features", (B, S, 4), "float32")
    w = g.param("up.weight", (6, 4), "up", "normal", "float32")
    b = g.param("up.bias", (6,), "up", "zeros", "float32")
    h = g.add("linear", [x, w, b], name="up", scope="up")
    w2 = g.param("down.weight", (3, 6), "down", "normal", "float32")
    g.set_output(g.add("linear", [h, w2], name="down", scope="down"))
    g.lint()
    assert gradients.operand_grads(g) == {"up": (False, True, True), "down": (True, True)}
    sizes = {B: 2, S: 5}
    flops = {k: int(v.xreplace(sizes)) for k, v in symbolic(g)["flops"].items()}
    up, down = 2 * 10 * 6 * 4, 2 * 10 * 3 * 6  # 2 per multiply-accumulate, 10 rows
    assert flops["backward"] == up + 2 * 10 * 6 + 2 * down  # up: dW and the bias only
    # torch: the same products
    xt = torch.randn(2, 5, 4)
    wt, bt = torch.randn(6, 4, requires_grad=True), torch.zeros(6, requires_grad=True)
    w2t = torch.randn(3, 6, requires_grad=True)
    counter = FlopCounterMode(display=False)
    with counter:
        torch.nn.functional.linear(torch.nn.functional.linear(xt, wt, bt), w2t).sum().backward()
    assert counter.get_total_flops() == 2 * up + 3 * down


@pytest.mark.parametrize("name", ["tiny-sandwich.yaml", "tiny-decoder.yaml"])
def test_plan_step_flops_are_the_reports_train_step(name: str) -> None:
    from tfgraph.parallel.gpus import gpu
    from tfgraph.parallel.layout import Layout
    from tfgraph.parallel.planner import plan

    graph = tfgraph.compile(load_spec(ROOT / "specs" / name), loss=True)
    layout = Layout(tp=1, dp=1, seq=9, micro_batch=2, global_batch=4, dtype=graph.dtype)
    step = plan(graph, layout, gpu("h100"), attention="unfused")["step"]
    report = build_report(graph, batch=2, seq=9)
    assert step["flops"] == 2 * report["flops"]["train_step"]  # two micro-batches
    # no recompute, explicit attention over every score: the kernels run the model FLOPs,
    # the gradients nothing asks for left out as the report leaves them
    assert step["hardware_flops"] == step["flops"]
    assert step["useful_flops"] == 2 * report["flops"]["train_step_effective"]
