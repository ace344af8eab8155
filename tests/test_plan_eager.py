"""``tfgraph plan --kernels eager``: the kernels PyTorch's eager mode runs for tfgraph's module,
counted per node on the meta device (exporters/torch/kernels.py), and the plan timing them.

The per-node census is checked against the whole module recorded at once (forward and backward
through autograd's own graph: the gradient sums of outputs and tied weights several ops read
included); CUDA's fused functions count as one kernel of their inputs and outputs; the plan's
eager time of a node is its kernels' bytes at the achievable bandwidth."""

from __future__ import annotations

import collections
import contextlib
import json

import pytest
import sympy
import torch
from conftest import ROOT
from test_cli_validate import runner

import tfgraph
from tfgraph.cli import main
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch import kernels as K
from tfgraph.graph.ir import SYMBOLS
from tfgraph.parallel import timing
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.planner import plan

SPECS = ROOT / "specs"
B, S = 2, 32


def graph_of(name: str, dtype: str = "bfloat16") -> tfgraph.Graph:
    spec = tfgraph.load_spec(SPECS / f"{name}.yaml").model_copy(update={"dtype": dtype})
    return tfgraph.compile(spec, loss=True)


def whole_module(graph: tfgraph.Graph, batch: int = B, seq: int = S) -> list[K.Kernel]:
    """Every kernel of one forward + backward of the whole module, recorded at once (routed
    experts with the census's uniform routing)."""
    model = to_torch(graph, device="meta").train()
    sizes = {SYMBOLS["B"]: batch, SYMBOLS["S"]: seq, SYMBOLS["T"]: seq}
    routed = [n for n in graph.nodes() if n.op == "experts"]
    log = K._Log()
    with contextlib.ExitStack() as stack:
        stack.enter_context(K._recording(log))
        if routed:
            experts = int(graph.node(routed[0].inputs[1]).type.shape[-1])
            stack.enter_context(K.UniformRouting(log, experts))
        loss = model(*[K._input(graph, name, sizes) for name in graph.inputs])
        torch.autograd.backward(loss, torch.empty_like(loss))
    return log.kernels


def counted(kernels: list[K.Kernel]) -> collections.Counter:
    return collections.Counter((k.name, k.nbytes, k.flops, k.core, k.dims) for k in kernels)


@pytest.mark.parametrize("path", sorted(SPECS.glob("tiny*.yaml")) + [SPECS / "gpt2.yaml"],
                         ids=lambda p: p.stem)
def test_the_census_is_the_whole_module_kernel_for_kernel(path):
    """Node by node in isolation, backward as autograd's engine runs it = the module's own
    forward and backward, on every tiny spec (tied tables, encoder-decoders, ALiBi's reader
    that takes only a shape, hardmax passing no gradient to q and k, routed experts, T5's
    relative bias, ...)."""
    spec = tfgraph.load_spec(path).model_copy(update={"dtype": "bfloat16"})
    graph = tfgraph.compile(spec, loss=True)
    seq = min(S, spec.max_len or S)
    census = K.eager_kernels(graph, B, seq)
    per_node = [k for node in census.values() for k in (*node.forward, *node.backward)]
    assert counted(per_node) == counted(whole_module(graph, B, seq))
    assert len(per_node) > 20


def test_fused_cuda_functions_launch_their_cuda_kernels():
    graph = graph_of("tiny-llama")
    census = K.eager_kernels(graph, B, S)
    d = int(graph.node("decoder.layers.1.self_attn.norm").type.shape[-1])
    x = B * S * d * 2  # bfloat16
    norm = census["decoder.layers.1.self_attn.norm"]
    assert [k.name for k in norm.forward] == ["fused_rms_norm"]
    assert norm.forward[0].nbytes == 2 * x + d * 2 + B * S * 4  # x, gain, y, fp32 1/rms
    # CUDA's norm backward: the input gradient (dy, x, 1/rms, gain -> dx), then the gain's
    # (dy and x read again, 1/rms -> dgain); the residual stream's gradient sum follows
    assert [k.name for k in norm.backward][:2] == ["fused_rms_norm_backward",
                                                   "fused_rms_norm_backward_gain"]
    assert norm.backward[0].nbytes == 3 * x + d * 2 + B * S * 4
    assert norm.backward[1].nbytes == 2 * x + B * S * 4 + d * 2
    # the rotary tables, computed once per forward (no graph node), go to the node before
    # them, the embedding's: not to layer 0, whose time the other layers repeat
    first = [k.name for k in census["decoder.embed.tokens"].forward]
    assert first[0] == "aten.embedding" and {"aten.cos", "aten.sin"} <= set(first)
    assert [k.name for k in census["decoder.layers.0.self_attn.norm"].forward] == [
        "fused_rms_norm"]
    attention = census["decoder.layers.0.self_attn.attention"]
    # the flash kernel writes (B, T, h, hd): the module's transpose back is a view, no copy
    assert [(k.name, k.core) for k in attention.forward] == [("flash_attention", True)]
    assert [(k.name, k.core) for k in attention.backward] == [("flash_attention_backward",
                                                               True)]


def test_a_projection_is_its_gemms_and_a_read_twice_output_sums_gradients():
    """q, k and v read the same normed input: in backward (v, then k, then q) k's and q's
    gradients are each added to what arrived before, as autograd's engine does."""
    graph = graph_of("tiny-llama")
    census = K.eager_kernels(graph, B, S)
    node = graph.node("decoder.layers.0.self_attn.q")
    n, k = graph.node(node.inputs[1]).attrs["shape"]
    m = B * S
    d = int(graph.node(node.inputs[0]).type.shape[-1])
    q = census[node.name]
    assert [(x.name, x.flops, x.core) for x in q.forward] == [("aten.mm", 2 * m * n * k, True)]
    add = ("aten.add", 3 * m * d * 2, False)  # read two bf16 gradients, write their sum
    assert [(x.name, x.flops) for x in q.backward if x.core] == [("aten.mm", 2 * m * n * k)] * 2
    assert [(x.name, x.nbytes, x.core) for x in q.backward if not x.core] == [add]
    v = census["decoder.layers.0.self_attn.v"]
    assert all(x.core for x in v.backward)  # the first gradient to arrive: nothing to add
    # the residual's own backward passes its gradient through: no kernel
    assert census["decoder.layers.0.self_attn.residual"].backward == ()


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-olmoe", "tiny-deepseek-v3"])
def test_routed_experts_run_with_uniform_routing(name):
    """Which tokens reach which expert is data: on the meta device each expert takes tokens x
    top-k / experts of them, the planner's own assumption, so the experts' GEMMs are the
    graph's FLOPs; the census equals the whole module run so, kernel for kernel. (All three
    specs have gated experts.)"""
    graph = graph_of(name)
    census = K.eager_kernels(graph, B, S)
    experts = [n for n in graph.nodes() if n.op == "experts"]
    assert experts
    n_experts = graph.node(experts[0].inputs[1]).type.shape[-1]
    for node in experts:
        forward = census[node.name].forward
        assert [k.name for k in forward].count("aten.bincount") == 1  # one count, one sync
        assert [k.name for k in forward].count("aten.mm") == 3 * n_experts  # gate, up, down
        gemm = sum(k.flops for k in forward if k.kind == "gemm")
        assert gemm == graph_flops(graph, node.name, B, S)
    per_node = [k for node in census.values() for k in (*node.forward, *node.backward)]
    assert counted(per_node) == counted(whole_module(graph))
    result = plan(graph, Layout(micro_batch=B, global_batch=B, seq=S), gpu("h100"),
                  kernels=K.kernel_source(graph))
    assert result["kernels"] == "eager" and result["step"]["time_s"] > 0


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-deepseek-v3"])
def test_under_expert_parallelism_a_rank_runs_its_own_experts(name):
    """With --ep 2 the routed experts are counted as one expert-parallel rank runs them
    (tests/test_expert_parallel.py checks it kernel for kernel against a gloo rank): E / 2
    experts, each on twice the pairs, so the GEMM FLOPs stay the graph's (the pairs that
    reach the rank are its own tokens x top-k) while the per-expert kernels halve; the other
    nodes are as without it. The planner asks the census for its layout's ep."""
    graph = graph_of(name)
    whole, rank = K.eager_kernels(graph, B, S), K.eager_kernels(graph, B, S, ep=2)
    experts = [n for n in graph.nodes() if n.op == "experts"]
    n_experts = graph.node(experts[0].inputs[1]).type.shape[-1]
    for node in experts:
        forward = [k.name for k in rank[node.name].forward]
        assert forward.count("aten.mm") == 3 * n_experts // 2
        assert [k.name for k in rank[node.name].backward].count("aten.mm") == 6 * n_experts // 2
        assert sum(k.flops for k in rank[node.name].forward if k.kind == "gemm") == \
            graph_flops(graph, node.name, B, S)
    assert {n: k for n, k in rank.items() if n not in {e.name for e in experts}} == \
        {n: k for n, k in whole.items() if n not in {e.name for e in experts}}

    asked = []

    class Asked:
        def nodes(self, batch: int, seq: int, ep: int) -> dict:
            asked.append(ep)
            return {}

        optimizer_bytes = 0.0

    plan(graph, Layout(dp=2, ep=2, micro_batch=B, global_batch=2 * B, seq=S), gpu("h100"),
         kernels=Asked())
    assert asked == [2]


def graph_flops(graph: tfgraph.Graph, name: str, batch: int, seq: int) -> float:
    """A node's forward FLOPs as the graph counts them (its matrix products)."""
    from tfgraph.passes import cost

    found = next(c for c in cost.op_costs(graph) if c.node == name)
    sizes = {SYMBOLS["B"]: batch, SYMBOLS["S"]: seq, SYMBOLS["T"]: seq}
    return float(sympy.sympify(found.matmul).xreplace(sizes))


def test_eager_time_of_a_node_is_its_kernels_at_the_bandwidth():
    graph = graph_of("llama")  # TinyLlama sizes: kernels far above the launch floor
    layout = Layout(micro_batch=4, global_batch=4, seq=1024, dtype="bfloat16")
    h100 = gpu("h100")
    census = K.eager_kernels(graph, 4, 1024)
    sizes = {SYMBOLS["B"]: 4, SYMBOLS["S"]: 1024, SYMBOLS["T"]: 1024}
    work = {w.node: w for unit in timing.unit_work(graph) for w in unit}
    bandwidth = h100.kernel_bandwidth  # memory-bound kernels of a step
    for name in ("decoder.layers.0.self_attn.q_rope", "decoder.layers.0.ffn.norm", "loss"):
        kernels = census[name]
        assert len(kernels.forward) >= 1
        got = timing._unit_time([work[name]], sizes, layout, h100, h100.peak_flops, 2,
                                "fused", census)
        want = [max(k.nbytes / bandwidth, timing.LAUNCH_S) for k in kernels.forward]
        assert got.forward == pytest.approx(sum(want), rel=1e-12)
        assert got.backward == pytest.approx(sum(max(k.nbytes / bandwidth, timing.LAUNCH_S)
                                                 for k in kernels.backward), rel=1e-12)
    # a projection keeps its GEMM time, plus the kernels around its matrix products (here the
    # gradient it adds to k's and v's)
    q = "decoder.layers.0.self_attn.q"
    graph_time = timing._unit_time([work[q]], sizes, layout, h100, h100.peak_flops, 2, "fused")
    eager_time = timing._unit_time([work[q]], sizes, layout, h100, h100.peak_flops, 2, "fused",
                                   census)
    assert eager_time.forward == graph_time.forward
    around = [timing.kernel_seconds(k, h100, h100.peak_flops, 2) for k in census[q].backward
              if not k.core]
    assert len(around) == 1
    assert eager_time.backward == pytest.approx(graph_time.backward + around[0], rel=1e-12)


def test_the_eager_plan_is_slower_and_says_so():
    """TinyLlama sizes on one H100: the eager module runs rotary embeddings as five kernels,
    the loss in float32 copies, gradients summed: more time than one kernel per op."""
    args = [SPECS / "llama.yaml", "--gpus", 1, "--micro-batch", 4, "--global-batch", 4,
            "--seq", 1024, "--dtype", "bfloat16", "--json"]
    graph_plan, eager_plan = (json.loads(runner().invoke(
        main, ["plan", *map(str, args), "--kernels", k], catch_exceptions=False).stdout)
        for k in ("graph", "eager"))
    assert (graph_plan["kernels"], eager_plan["kernels"]) == ("graph", "eager")
    assert graph_plan["assumptions"]["kernels"].startswith("graph")
    assert eager_plan["assumptions"]["kernels"].startswith("eager")
    parts = [p["step"]["time_parts"] for p in (graph_plan, eager_plan)]
    assert parts[1]["forward"] > parts[0]["forward"] * 1.05
    assert parts[1]["backward"] > parts[0]["backward"]
    assert eager_plan["per_rank"] == graph_plan["per_rank"]  # memory does not change
    # the optimizer: one fused pass (2 x 2 + 2 + 2 x 12: weights, gradients, master and
    # moments read and written), eagerly AdamW's foreach kernels over the float32 elements
    h100 = gpu("h100")
    bandwidth = h100.streaming  # the optimizer streams
    elements = graph_plan["per_rank"]["memory"]["optimizer"] / 12  # bf16 mixed: 12 per element
    assert parts[0]["optimizer"] == pytest.approx(elements * 30 / bandwidth, rel=1e-4)
    assert K.adamw_bytes_per_element() == pytest.approx(80, abs=1e-3)  # 20 float32 passes
    assert parts[1]["optimizer"] == pytest.approx(elements * 80 / bandwidth, rel=1e-4)


def test_eager_plans_split_kernels_under_tensor_parallelism():
    graph = graph_of("tiny-llama")
    source = K.kernel_source(graph)
    times = [plan(graph, Layout(tp=tp, micro_batch=B, global_batch=B, seq=S), gpu("h100"),
                  kernels=source)["step"]["time_parts"]["forward"] for tp in (1, 2)]
    assert 0 < times[1] < times[0]


def test_a_search_can_rank_layouts_by_their_eager_kernels():
    """--search --kernels eager times every layout's eager kernels (the module counted once per
    micro-batch size): its plans are the layouts' own eager plans, ranked by them."""
    argv = ["plan", str(SPECS / "tiny-llama.yaml"), "--gpus", "8", "--search", "--top", "4",
            "--seq", "32", "--global-batch", "16", "--dtype", "bfloat16", "--json"]
    eager = json.loads(runner().invoke(main, [*argv, "--kernels", "eager"]).stdout)
    graph_ranked = json.loads(runner().invoke(main, argv).stdout)
    assert [r["kernels"] for r in eager] == ["eager"] * 4
    assert [r["kernels"] for r in graph_ranked] == ["graph"] * 4
    times = [r["step"]["time_s"] for r in eager]
    assert times == sorted(times)
    graph = graph_of("tiny-llama")
    source = K.kernel_source(graph)
    for r in eager:
        layout = Layout(**{k: v for k, v in r["layout"].items() if k not in ("gpus",
                                                                            "microbatches")})
        own = plan(graph, layout, gpu("h100"), kernels=source)["step"]["time_s"]
        assert r["step"]["time_s"] == pytest.approx(own)
    assert eager[0]["step"]["time_s"] > graph_ranked[0]["step"]["time_s"]  # more kernels
    text = runner().invoke(main, [*argv[:-1], "--kernels", "eager"]).stdout
    assert "kernels eager" in text


def test_recorded_kernels_are_timed_by_their_kind():
    """``record`` on any module (here a bare SDPA and a matrix product): the flash kernel's
    FLOPs are the scores a causal mask keeps, a GEMM keeps its dimensions, and each kind is
    timed at its rate (``timing.kernel_seconds``)."""
    q = torch.empty(2, 4, 64, 16, device="meta", dtype=torch.bfloat16, requires_grad=True)
    w = torch.empty(16, 24, device="meta", dtype=torch.bfloat16, requires_grad=True)

    def step() -> None:
        y = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        out = (y.flatten(0, 2) @ w).float().sum()
        torch.autograd.backward(out, torch.empty_like(out))

    kernels = K.record(step)
    by_name = {k.name: k for k in kernels}
    flash = by_name["flash_attention"]
    assert flash.kind == "attention" and flash.flops == 2 * 2 * 4 * 64 * 64 * (16 + 16) / 2
    assert by_name["flash_attention_backward"].flops == timing.ATTENTION_BACKWARD * flash.flops
    gemms = [k for k in kernels if k.kind == "gemm"]
    assert gemms[0].dims == (2 * 4 * 64, 24, 16, 1)  # forward: (512, 16) @ (16, 24)
    assert len(gemms) == 3  # and the input's and the weight's gradients
    h100 = gpu("h100")
    peak = h100.peak_flops
    assert timing.kernel_seconds(gemms[0], h100, peak, 2) == timing.gemm_time(
        512, 24, 16, h100, peak, 2)
    # the flash kernels at FlashAttention-2's measured Hopper rate for their shape and mask
    assert flash.dims == (2 * 4, 64, 64, 16, 1, 0)
    fwd, bwd = timing.flash_time(flash.flops, 8, 64, 64, 16, True, h100, peak)
    assert timing.kernel_seconds(flash, h100, peak, 2) == fwd
    assert timing.kernel_seconds(by_name["flash_attention_backward"], h100, peak, 2) == bwd
    a100 = gpu("a100-80gb")  # no measured table: the one share of peak, over the busy SMs
    assert timing.kernel_seconds(flash, a100, a100.peak_flops, 2) == pytest.approx(
        flash.flops / (a100.peak_flops * a100.attention_fraction
                       * timing.gemm_efficiency(64, 8 * timing.TILE, a100)))
    small = next(k for k in kernels if k.kind == "memory")
    assert timing.kernel_seconds(small, h100, peak, 2) == timing.LAUNCH_S  # a tiny kernel


def test_each_kernel_source_gets_its_own_times():
    """The planner's memo of unit times keys on the source itself, not on 'some source'."""

    class Nothing:  # no node counted: every op keeps its graph time
        def nodes(self, batch: int, seq: int, ep: int) -> dict:
            return {}

        optimizer_bytes = 0.0

    graph = graph_of("tiny-llama")
    layout = Layout(micro_batch=B, global_batch=B, seq=S)
    forward = [plan(graph, layout, gpu("h100"), kernels=source)["step"]["time_parts"]["forward"]
               for source in (K.kernel_source(graph), Nothing(), None)]
    assert forward[1] == forward[2] < forward[0]


def test_a_stand_in_backward_run_after_the_recording_is_kept():
    q = torch.empty(1, 2, 8, 4, device="meta", requires_grad=True)
    log = K._Log()
    with K._recording(log):
        y = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    torch.autograd.backward(y, torch.empty_like(y))  # outside: the forward's log takes it
    assert [k.name for k in log.kernels] == ["flash_attention", "flash_attention_backward"]


def test_layer_norm_backward_is_cudas_two_kernels():
    """``native_layer_norm_backward`` launches an input-gradient kernel and a gain-and-bias
    kernel on CUDA, each reading the gradient and the input."""
    graph = graph_of("gpt2")
    census = K.eager_kernels(graph, B, S)
    name = next(n for n in census if n.endswith("self_attn.norm"))
    d = int(graph.node(name).type.shape[-1])
    x, stats = B * S * d * 2, 2 * B * S * 4  # bfloat16; float32 mean and 1/std per row
    backward = census[name].backward
    assert [k.name for k in backward][:2] == ["aten.native_layer_norm_backward",
                                              "aten.native_layer_norm_backward_gain"]
    assert backward[0].nbytes == 3 * x + stats + d * 2  # dy, x, gain -> dx
    assert backward[1].nbytes == 2 * x + stats + 2 * d * 2  # dy, x -> gain's and bias's


def test_the_negative_log_likelihood_touches_one_element_per_row():
    """CUDA's nll_loss gathers each row's target element; its backward zero-fills the
    gradient, then writes one element per row (aten/src/ATen/native/cuda/Loss.cu)."""
    graph = graph_of("tiny-llama")
    census = K.eager_kernels(graph, B, S)
    vocab = int(graph.node("logits").type.shape[-1])
    rows, full = B * S, B * S * vocab * 4  # float32 log-probabilities
    loss = census["loss"]
    nll = next(k for k in loss.forward if k.name == "aten.nll_loss_forward")
    assert nll.nbytes < 3 * rows * 8 < full  # targets, picked elements, the scalar results
    backward = [(k.name, k.nbytes) for k in loss.backward]
    zero = backward.index(("aten.zero_", full))
    assert backward[zero + 1][0] == "aten.nll_loss_backward"
    assert backward[zero + 1][1] < 3 * rows * 8


def test_a_norm_without_an_input_gradient_launches_only_the_gains():
    x = torch.empty(4, 16, 32, device="meta", dtype=torch.bfloat16)
    w = torch.empty(32, device="meta", dtype=torch.bfloat16, requires_grad=True)
    kernels = K.record(lambda: torch.nn.functional.rms_norm(x, (32,), w).float().sum()
                       .backward())
    assert "fused_rms_norm_backward" not in {k.name for k in kernels}
    assert "fused_rms_norm_backward_gain" in {k.name for k in kernels}


def test_a_per_position_loss_reads_one_element_per_target():
    """cross_entropy over (N, C, H, W) runs nll_loss2d: one log-probability read per
    target, as nll_loss."""
    logits = torch.empty(2, 50, 7, 3, device="meta", requires_grad=True)
    target = torch.empty(2, 7, 3, device="meta", dtype=torch.long)
    kernels = K.record(lambda: torch.nn.functional.cross_entropy(logits, target).backward())
    by_name = {k.name: k for k in kernels}
    targets, full = 2 * 7 * 3, 2 * 50 * 7 * 3 * 4
    # the int64 targets, one float32 element per target, the loss and its total weight
    assert by_name["aten.nll_loss2d_forward"].nbytes == targets * 8 + targets * 4 + 2 * 4
    assert by_name["aten.zero_"].nbytes == full
    assert by_name["aten.nll_loss2d_backward"].nbytes < full / 10


def test_a_gather_reads_the_rows_it_names_and_a_copy_does_not_read_its_destination():
    table = torch.empty(1000, 16, device="meta", dtype=torch.bfloat16)
    ids = torch.empty(2, 5, device="meta", dtype=torch.long)
    dst = torch.empty(2, 5, 16, device="meta", dtype=torch.float32)
    kernels = K.record(lambda: dst.copy_(torch.nn.functional.embedding(ids, table)))
    assert [(k.name, k.nbytes) for k in kernels] == [
        ("aten.embedding", 2 * 5 * 8 + 2 * (2 * 5 * 16 * 2)),  # ids, rows read and written
        ("aten.copy_", 2 * 5 * 16 * 2 + 2 * 5 * 16 * 4)]  # bf16 read, float32 written


def test_sizes_no_torch_tensor_can_hold_are_refused_before_the_census():
    """2^30 sequences of 2^25 tokens: TinyLlama's logits (vocabulary 256) would be 2^63
    elements, past the 2^63 bytes a PyTorch tensor holds even on the meta device (the census
    ended in torch's "Storage size calculation overflowed", exit 1). One line, exit 2; the
    graph's kernels take the same sizes."""
    argv = ["plan", str(SPECS / "tiny-llama.yaml"), "--gpus", "1", "--micro-batch", str(2**30),
            "--seq", str(2**25), "--json"]
    eager = runner().invoke(main, [*argv, "--kernels", "eager"])
    assert eager.exit_code == 2, eager.stderr
    last = eager.stderr.strip().splitlines()[-1]  # after the note on rotary extrapolation
    assert "--kernels eager" in last and "2^63" in last and "logits" in last, last
    assert "Traceback" not in eager.stderr and "internal error" not in eager.stderr
    assert runner().invoke(main, [*argv, "--kernels", "graph"]).exit_code == 0
    # the bound: 8 bytes per element within 2^63 - 1 (2^52 tokens of 256 logits is past it)
    graph = graph_of("tiny-llama")
    assert K.check_sizes(graph, 2**27, 2**25 - 1) is None
    with pytest.raises(TfgraphError, match=r"2\^63"):
        K.check_sizes(graph, 2**27, 2**25)


@pytest.mark.parametrize("name,batch,seq,what", [
    ("tiny-gemma2", 16, 2**28, "score matrix"),  # soft-capped: explicit (B, h, Tq, Tk) scores
    ("tiny-gemma3", 1, 2**30, "(Tq, Tk) mask"),  # a sliding window's mask, given to SDPA
    ("tiny-cohere2", 1, 2**30, "(Tq, Tk) mask"),
    ("tiny-modernbert", 1, 2**30, "(Tq, Tk) mask"),  # a bidirectional window's
    ("tiny-sandwich", 1, 2**30, "score matrix"),
])
def test_tensors_the_module_builds_are_refused_before_the_census(name, batch, seq, what):
    """The graph's tensors fit, but the module builds larger ones for attention (a window's
    (Tq, Tk) mask, explicit matmuls' score matrix): the census ended in torch's "Storage size
    calculation overflowed" (exit 1, internal error). Refused before it, naming the tensor;
    a causal model on SDPA builds neither and is let through at the same length."""
    with pytest.raises(TfgraphError, match=r"2\^63") as found:
        K.check_sizes(graph_of(name), batch, seq)
    assert what in str(found.value)
    assert K.check_sizes(graph_of("tiny-llama"), batch, seq) is None


def test_an_overflowing_module_tensor_is_one_line_exit_2(monkeypatch):
    """Through the CLI: one line, exit 2; and a module tensor check_sizes would not know of
    (its list emptied here) still ends in the same refusal, from the census itself."""
    argv = ["plan", str(SPECS / "tiny-gemma3.yaml"), "--gpus", "1", "--seq", str(2**30),
            "--kernels", "eager"]
    for _ in range(2):
        found = runner().invoke(main, argv)
        assert found.exit_code == 2, found.stderr
        last = found.stderr.strip().splitlines()[-1]
        assert last.startswith("--kernels eager") or "--kernels eager" in last, last
        assert "Traceback" not in found.stderr and "internal error" not in found.stderr
        monkeypatch.setattr(K, "module_tensors", lambda graph, name: [])
