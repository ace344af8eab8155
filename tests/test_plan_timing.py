"""The planner's step-time model (tfgraph/parallel/timing.py, issue 26 item 1): its pieces one by
one (GEMM efficiency, the roofline, ring collectives, the data-parallel overlap rule, the 1F1B
and interleaved bubbles), then through ``tfgraph plan``: --vpp, unequal stages, Llama 3 405B at
pipeline 16, a search whose layouts differ in time, the assumptions in --json."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from test_cli_validate import runner  # stderr kept apart from stdout on every click

import tfgraph
from tfgraph.cli import main
from tfgraph.parallel import timing
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout, balanced_stages, in_flight
from tfgraph.parallel.memory import States
from tfgraph.parallel.planner import plan, staged

ROOT = Path(__file__).resolve().parent.parent
DECODER = ROOT / "specs" / "tiny-decoder.yaml"
H100 = gpu("h100")
A100 = gpu("a100-80gb")


def cli(*args: object):
    return runner().invoke(main, ["plan", *map(str, args)], catch_exceptions=False)


def plan_json(*args: object):
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# ---- the pieces ------------------------------------------------------------------------------

def test_gemm_time_grows_with_every_dimension_and_never_beats_the_achievable_peak() -> None:
    base = timing.gemm_time(4096, 4096, 4096, H100, H100.peak_flops, 2)
    for m, n, k in ((8192, 4096, 4096), (4096, 8192, 4096), (4096, 4096, 8192)):
        assert timing.gemm_time(m, n, k, H100, H100.peak_flops, 2) > base
    flops = 2 * 4096**3
    assert base >= flops / (H100.peak_flops * H100.matmul_fraction)
    # a large GEMM runs close to the achievable peak (tiles fill whole waves)
    assert flops / base > 0.95 * H100.peak_flops * H100.matmul_fraction
    # a sliver of a GEMM (few output tiles) wastes most of the SMs
    assert timing.gemm_efficiency(128, 128, H100) == pytest.approx(1 / H100.sms)


def test_wave_quantization_one_tile_more_than_the_sms_costs_a_wave() -> None:
    t = timing.TILE
    full = timing.gemm_efficiency(t * H100.sms, t, H100)
    assert full == pytest.approx(1.0)
    over = timing.gemm_efficiency(t * (H100.sms + 1), t, H100)
    assert over == pytest.approx((H100.sms + 1) / (2 * H100.sms))
    # a partial tile is paid whole
    assert timing.gemm_efficiency(t * H100.sms - 64, t, H100) < 1.0


def test_roofline_takes_the_longer_of_arithmetic_and_traffic() -> None:
    # compute-bound: 1e12 FLOPs at 1e15/s = 1 ms against 1e6 bytes at 1e12/s = 1 us
    assert timing.roofline(1e12, 1e6, 1e15, 1e12) == pytest.approx(1e-3)
    # memory-bound: 1e6 FLOPs (1 ns) against 1e9 bytes at 1e12/s = 1 ms
    assert timing.roofline(1e6, 1e9, 1e15, 1e12) == pytest.approx(1e-3)
    # a GEMM with K = 1 is an outer product: bound by writing its output
    m = n = 8192
    got = timing.gemm_time(m, n, 1, H100, H100.peak_flops, 2)
    assert got == pytest.approx((m + n + m * n) * 2 / H100.streaming)


def test_memory_bound_ops_at_the_steps_measured_kernel_rate(gpt) -> None:
    """A norm, an element-wise op, the loss: their bytes at ``kernel_bandwidth``, the share of
    a streaming read at which the plan's kernel times add up to the memory-bound kernels the
    H200's profiled eager steps ran (benchmarks/eager_step.py solves it: test_planner_benchmarks);
    a GEMM's operands stream at the full rate (above)."""
    from tfgraph.parallel.gpus import KERNEL_SHARE

    assert 0.5 < KERNEL_SHARE < 1
    for g in (H100, A100, gpu("h200")):
        assert g.kernel_bandwidth == pytest.approx(g.bandwidth * g.memory_fraction
                                                   * KERNEL_SHARE)
    layout = Layout(micro_batch=2, global_batch=2, seq=64)
    sizes = {timing.SYMBOLS["B"]: 2, timing.SYMBOLS["S"]: 64, timing.SYMBOLS["T"]: 64}
    memory = [w for unit in timing.unit_work(gpt) for w in unit if w.kind == "memory"]
    assert memory
    for w in memory:
        got = timing._unit_time([w], sizes, layout, H100, H100.peak_flops, 2, "fused")
        nbytes = timing._num(w.nbytes, sizes)
        flops = timing._num(w.flops, sizes)
        assert got.forward == pytest.approx(max(nbytes / H100.kernel_bandwidth,
                                                flops / H100.vector_flops))
    # slower than a streaming read of the same bytes: the measured share is below one
    assert H100.kernel_bandwidth < H100.streaming


def test_ring_collectives() -> None:
    n, bw, lat = 8, 100e9, 2e-6
    nbytes = 1e9
    assert timing.ring_time(nbytes, 1, True, bw, lat) == 0.0
    all_reduce = timing.ring_time(nbytes, n, True, bw, lat)
    assert all_reduce == pytest.approx(2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * lat)
    gather = timing.ring_time(nbytes, n, False, bw, lat)
    assert gather == pytest.approx((n - 1) / n * nbytes / bw + (n - 1) * lat)
    assert all_reduce == pytest.approx(2 * gather)
    # inside a node NVLink, across nodes the NIC
    assert timing.link(H100, 8)[0] == H100.intra_node * timing.LINK_EFFICIENCY
    assert timing.link(H100, 16, 8)[0] == H100.inter_node * timing.LINK_EFFICIENCY


@pytest.mark.parametrize(("span", "stride", "nics"), [
    (256, 8, 1),  # tensor 8, data 32: one GPU of the data group in each node, one NIC
    (64, 2, 4),  # tensor 2, data 32: four GPUs a node, four NICs
    (32, 1, 8),  # tensor 1, data 32 over 4 nodes: eight NICs a node
    (16, 1, 8),  # a tensor group of 16 over two nodes
])
def test_a_group_crosses_nodes_over_the_nics_of_its_gpus_in_a_node(span: int, stride: int,
                                                                    nics: int) -> None:
    """DGX A100: one 200 Gb/s NIC per GPU; NCCL runs a ring per NIC, so a group with g GPUs
    in each node moves g NICs' worth between nodes, never more than NVLink; the latency is
    the network's."""
    bw, lat = timing.link(A100, span, stride)
    want = min(nics * A100.inter_node, A100.intra_node) * timing.LINK_EFFICIENCY
    assert bw == pytest.approx(want) and lat == timing.NET_LATENCY
    # a node with fewer NICs than GPUs (DGX-1 V100: four for eight) gives each GPU half a NIC
    v100 = gpu("v100-32gb")
    assert v100.network == pytest.approx(v100.inter_node / 2)
    for span, stride, members in ((32, 1, 8), (64, 2, 4), (256, 8, 1)):
        assert timing.link(v100, span, stride)[0] == pytest.approx(
            members * v100.inter_node / 2 * timing.LINK_EFFICIENCY)
    # the node's link bounds it: eight 100 GB/s NICs would outrun NVLink 3's 300 GB/s
    fast = replace(A100, inter_node=100e9)
    assert timing.link(fast, 32, 1)[0] == pytest.approx(A100.intra_node * timing.LINK_EFFICIENCY)


def test_data_parallel_traffic_uses_the_group_s_nics() -> None:
    """--grad-reduce after exposes the whole all-reduce: at tensor 1 over 32 GPUs (4 nodes,
    8 NICs each) it takes an eighth of the time it takes at one NIC a node (the bandwidth
    term; the latency steps are the same)."""
    one = Layout(dp=32, global_batch=32, grad_reduce="after")
    s = States(0, 0, 0, 400_000_000)
    parts = {"forward": 1.0, "backward": 1.0, "recompute": 0.0}
    eight = timing._dp_exposed(one, A100, s, parts, 1, 2)
    single = timing._dp_exposed(one, replace(A100, per_node=1), s, parts, 1, 2)
    grads = 400_000_000 * float(timing.grad_bytes(one))
    term = 2 * 31 / 32 * grads / (A100.inter_node * timing.LINK_EFFICIENCY)
    assert single - eight == pytest.approx(term * 7 / 8, rel=1e-6)
    # tensor 2: the group's members are 2 ranks apart, four of them (four NICs) a node
    two = replace(one, tp=2, global_batch=32)
    four = timing._dp_exposed(two, A100, s, parts, 1, 2)
    single = timing._dp_exposed(two, replace(A100, per_node=1), s, parts, 1, 2)
    assert single - four == pytest.approx(term * 3 / 4, rel=1e-6)
    # experts at ep 8: the d / ep ranks holding the same experts are t x ep = 16 apart, one
    # GPU a node: one NIC, as slow as a node with one GPU
    experts = States(0, 0, 0, 400_000_000, expert_unsharded=400_000_000)
    moe = replace(two, ep=8)
    assert timing._dp_exposed(moe, A100, experts, parts, 1, 2) == pytest.approx(
        timing._dp_exposed(moe, replace(A100, per_node=1), experts, parts, 1, 2))


def test_the_expert_all_to_all_crosses_nodes_at_one_nic_a_rank() -> None:
    """An all-to-all is no ring: however many of the expert group share a node, each rank's
    rows for other nodes leave through its own NIC (Mixtral-sized experts, tensor 2, ep 8:
    four of the group in each of two nodes)."""
    spec = tfgraph.load_spec(ROOT / "specs" / "mixtral-8x7b.yaml")
    graph = tfgraph.compile(spec.model_copy(update={"layers": 2, "dtype": "bfloat16"}),
                            loss=True)
    layout = Layout(tp=2, dp=32, ep=8, global_batch=32, seq=256, dtype="bfloat16")
    got = plan(graph, layout, H100)["step"]["time_parts"]["ep_exposed"]
    one_nic = replace(H100, per_node=1)  # every rank in a node of its own: one NIC each
    assert got > 0
    assert got == pytest.approx(plan(graph, layout, one_nic)["step"]["time_parts"]["ep_exposed"])


def test_data_parallel_reduction_hides_under_the_last_backward_but_the_last_bucket() -> None:
    layout = Layout(dp=8, global_batch=8)
    elements = 400_000_000  # 10 buckets of 40M
    s = States(0, 0, 0, elements)
    bw, lat = timing.link(H100, 8)
    grads = elements * float(timing.grad_bytes(layout))
    last = timing.ring_time(grads / 10, 8, True, bw, lat)  # one bucket: a whole ring's latency
    # ten all-reduces: the bytes once, the ring's 2(n - 1) latency steps ten times
    reduce = timing.ring_time(grads, 8, True, bw, lat) + 9 * 2 * 7 * lat
    assert timing.bucketed_ring_time(grads, 10, 8, True, bw, lat) == pytest.approx(reduce)
    long_backward = {"forward": 1.0, "backward": 10 * reduce, "recompute": 0.0}
    exposed = timing._dp_exposed(layout, H100, s, long_backward, 1, 2)
    assert exposed == pytest.approx(last)  # the last bucket only
    short = {"forward": 1.0, "backward": reduce / 2, "recompute": 0.0}
    assert timing._dp_exposed(layout, H100, s, short, 1, 2) == pytest.approx(reduce / 2)
    assert timing._dp_exposed(Layout(), H100, s, short, 1, 2) == 0.0  # no data parallelism


def test_every_bucket_and_every_fsdp_unit_pays_the_rings_latency() -> None:
    """DDP / Megatron-LM launch one collective per 40M-element bucket and FSDP one per unit
    (a layer, plus the root): across 1,024 ranks on the network (5 us a ring step) each pays
    1,023 latency steps, which one collective over all the bytes would count once."""
    ranks, elements = 1024, 400_000_000
    s = States(0, 0, 0, elements)
    bw, lat = timing.link(H100, ranks)
    assert lat == timing.NET_LATENCY
    after = {"forward": 0.0, "backward": 0.0, "recompute": 0.0}  # nothing to hide under
    layout = Layout(dp=ranks, global_batch=ranks, grad_reduce="after")
    grads = elements * float(timing.grad_bytes(layout))
    one_ring = timing.ring_time(grads, ranks, True, bw, lat)
    exposed = timing._dp_exposed(layout, H100, s, after, 1, 2)
    assert exposed == pytest.approx(one_ring + 9 * 2 * (ranks - 1) * lat)
    # ZeRO 3 over 32 layers: 33 units, each gathered twice (forward, backward) and reduced once
    fsdp = Layout(dp=ranks, global_batch=ranks, zero=3)
    weights, grads3 = elements * 2, elements * float(timing.grad_bytes(fsdp))
    per_mb = (2 * timing.ring_time(weights, ranks, False, bw, lat)
              + timing.ring_time(grads3, ranks, False, bw, lat))
    for layers in (1, 32):
        units = layers + 1
        first = timing.ring_time(weights / units, ranks, False, bw, lat)
        assert timing._dp_exposed(fsdp, H100, s, after, layers, 2) == pytest.approx(
            per_mb + (units - 1) * 3 * (ranks - 1) * lat + first)


def test_gradient_reduction_after_the_backward_is_all_exposed() -> None:
    """--grad-reduce after (Megatron-LM's local DDP of 2021-2023): the whole all-reduce (ZeRO 1-2:
    reduce-scatter) waits for the backward, however long the backward is."""
    elements = 400_000_000
    s = States(0, 0, 0, elements)
    bw, lat = timing.link(H100, 8)
    long_backward = {"forward": 1.0, "backward": 1e3, "recompute": 0.0}
    for zero, all_reduce in ((0, True), (1, False), (2, False)):
        overlap = Layout(dp=8, global_batch=8, zero=zero)
        after = Layout(dp=8, global_batch=8, zero=zero, grad_reduce="after")
        grads = elements * float(timing.grad_bytes(after))
        reduce = timing.bucketed_ring_time(grads, 10, 8, all_reduce, bw, lat)
        last = timing.ring_time(grads / 10, 8, all_reduce, bw, lat)
        hidden = timing._dp_exposed(overlap, H100, s, long_backward, 1, 2)
        exposed = timing._dp_exposed(after, H100, s, long_backward, 1, 2)
        assert exposed == pytest.approx(hidden - last + reduce)  # last bucket -> all
    assert timing._dp_exposed(Layout(grad_reduce="after"), H100, s, long_backward, 1, 2) == 0.0


def test_grad_reduce_through_the_cli(tmp_path: Path) -> None:
    # more gradient than one 40M-element bucket per rank, so overlapping hides some of it
    args = (ROOT / "specs" / "gpt3-175b.yaml", "--gpus", 64, "--tp", 8, "--pp", 2, "--dp", 4,
            "--global-batch", 32, "--seq", 2048)
    overlap, after = plan_json(*args), plan_json(*args, "--grad-reduce", "after")
    assert overlap["layout"]["grad_reduce"] == "overlap"
    assert after["layout"]["grad_reduce"] == "after"
    assert after["step"]["time_parts"]["dp_exposed"] > overlap["step"]["time_parts"]["dp_exposed"]
    assert "--grad-reduce after" in after["assumptions"]["data_parallel"]
    assert "--grad-reduce" not in overlap["assumptions"]["data_parallel"]
    refused = cli(*args, "--zero", 3, "--grad-reduce", "after")
    assert refused.exit_code == 2 and "ZeRO 3" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_bubble_formulas() -> None:
    assert timing.bubble(8, 64, 1) == pytest.approx(7 / 64)  # 1F1B, Narayanan §2.2.1
    assert timing.bubble(8, 64, 2) == pytest.approx(7 / 128)  # interleaved, §2.2.2
    assert timing.bubble(1, 4, 1) == 0.0


def test_balanced_stages_and_in_flight() -> None:
    assert balanced_stages(126, 16) == (7,) + (8,) * 14 + (7,)  # Llama 3 405B
    assert balanced_stages(96, 8) == (12,) * 8
    assert sum(balanced_stages(10, 4)) == 10 and balanced_stages(10, 4) == (2, 3, 3, 2)
    layout = Layout(pp=4, dp=1, global_batch=16)
    assert [in_flight(layout, i) for i in range(4)] == [4, 3, 2, 1]
    # interleaved: Megatron-LM's warm-up, (p - i - 1) 2 + (v - 1) p + 1 chunks of 1/v of a stage
    v2 = Layout(pp=4, dp=1, vpp=2, global_batch=16)
    assert in_flight(v2, 0) == pytest.approx((3 * 2 + 4 + 1) / 2)


def _megatron_peak(p: int, rank: int, m: int, v: int) -> int:
    """Chunk forwards alive at once on ``rank`` in Megatron-LM's pipeline schedules: warm-up
    forwards (1F1B: p - rank - 1; interleaved: (p - rank - 1) 2 + (v - 1) p, capped at the
    m v there are), then one forward and one backward per step, the backward freeing one."""
    total = m * v
    warmup = p - rank - 1 if v == 1 else (p - rank - 1) * 2 + (v - 1) * p
    warmup = min(warmup, total)
    alive = peak = 0
    for _ in range(warmup):
        alive += 1
        peak = max(peak, alive)
    for _ in range(total - warmup):
        alive += 1
        peak = max(peak, alive)
        alive -= 1
    return peak


@pytest.mark.parametrize("p,v,m", [(4, 1, 16), (4, 1, 2), (4, 2, 16), (4, 2, 4), (8, 4, 8),
                                   (2, 3, 6)])
def test_in_flight_is_megatron_schedules_peak_and_is_stated(p: int, v: int, m: int) -> None:
    layout = Layout(pp=p, vpp=v, global_batch=m)
    for stage in range(p):
        assert in_flight(layout, stage) == pytest.approx(_megatron_peak(p, stage, m, v) / v)
    # the plan states the rule its activations follow, interleaved too (not 1F1B's alone)
    memory = timing.assumptions(layout)["memory"]
    assert "min(p - i, m)" in memory and "layout.in_flight" in memory
    assert "min(((p - i - 1) x 2 + (v - 1) x p + 1) / v, m)" in memory


# ---- through the planner ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpt() -> tfgraph.compiler.CompiledGraph:
    spec = tfgraph.load_spec(ROOT / "specs" / "gpt3-175b.yaml").model_copy(
        update={"dtype": "bfloat16", "layers": 16})
    return tfgraph.compile(spec, loss=True)


def test_plan_time_parts_add_up_and_assumptions_are_stated(gpt) -> None:
    result = plan(gpt, Layout(tp=8, pp=4, dp=4, global_batch=64, seq=2048), H100)
    step = result["step"]
    parts = step["time_parts"]
    # every part is seconds and they add up to the time (README); the slowest stage, an
    # index, is step.slowest_stage
    assert sum(parts.values()) == pytest.approx(step["time_s"])
    assert "slowest_stage" not in parts and step["slowest_stage"] in range(4)
    assert step["bubble"] == pytest.approx(3 / 16)
    assert parts["bubble"] > 0 and parts["tp_exposed"] > 0 and parts["pp_exposed"] > 0
    assert set(result["assumptions"]) == {"gpu", *timing.ASSUMPTIONS, "mfu"}
    assert "h100" in result["assumptions"]["gpu"]
    # the rules the code follows, stated as it follows them: the pipeline fill relative to
    # the MAMF figures' K (gemm_time), the masked flash backward and SM occupancy (flash.py,
    # flash_time), the routed experts, their all-to-all (4 rings over a tp x ep span) and
    # their data-parallel group (d / ep)
    stated = result["assumptions"]
    assert f"K / (K + {timing.PIPELINE_K}) relative to its value at K = {timing.MAMF_K}" in (
        stated["compute"])
    assert "masked / unmasked ratio" in stated["flash"] and "SMs" in stated["flash"]
    # what the time leaves out: the host's work, and where that shows (RESULTS.md's FSDP2 row)
    assert stated["host"].startswith("not timed: the CPU's work") and "FSDP2" in stated["host"]
    # what the memory rests on and what it leaves out (planner.py, memory.py)
    for rule in ("torch.chunk", "the first rank's (the largest)", "float32 step per parameter",
                 "min(p - i, m)", "logits' gradient in the model's dtype",
                 "8 x B x S x V / t", "rotary cos/sin tables", "(1 + w) gain",
                 "window's (S, S) mask"):
        assert rule in stated["memory"], rule
    moe = timing.assumptions(Layout(dp=4, ep=2), moe=True)
    assert set(moe) == {"experts", *timing.ASSUMPTIONS}
    assert "uniform routing" in moe["memory"] and "uniform" not in stated["memory"]
    for rule in ("tokens x top-k / E", "E / ep experts", "read once per micro-batch",
                 "4 per MoE layer", "(ep - 1)/ep", "tp x ep span", "d / ep ranks"):
        assert rule in moe["experts"], rule
    # MFU is the useful model FLOPs (causal scores counted as FlashAttention runs them) over
    # the GPUs' peak for that time
    assert step["mfu"] == pytest.approx(step["useful_flops"]
                                        / (128 * H100.peak_flops * step["time_s"]))
    assert step["useful_flops"] < step["flops"]


def test_a_table_tied_across_stages_is_all_reduced_after_the_backward() -> None:
    """GPT-2's token table is read by the embedding (first stage) and the head (last): under
    --pp both hold it and Megatron-LM all-reduces its gradient between them once a step, after
    the backward (finalize_model_grads, embedding group). Counted in comm_bytes.pp (a ring
    over 2 sends n bytes), timed as one all-reduce over NVLink, exposed, stated."""
    spec = tfgraph.load_spec(ROOT / "specs" / "gpt2.yaml").model_copy(update={"layers": 2})
    untied_spec = spec.model_copy(update={"embedding": spec.embedding.model_copy(
        update={"tie_output": False})})
    tied, untied = (tfgraph.compile(s.model_copy(update={"dtype": "bfloat16"}), loss=True)
                    for s in (spec, untied_spec))
    table = 50257 * 768
    layout = Layout(pp=2, global_batch=4, seq=128)
    got, plain = plan(tied, layout, H100)["step"], plan(untied, layout, H100)["step"]
    # 16-bit gradients (--states mixed) of the whole table, whole under ZeRO 0
    assert got["comm_bytes"]["pp"] == plain["comm_bytes"]["pp"] + 2 * table
    seconds = 2 * table / (H100.intra_node * timing.LINK_EFFICIENCY) + 2 * timing.NVLINK_LATENCY
    assert got["time_parts"]["embedding_exposed"] == pytest.approx(seconds)
    assert plain["time_parts"]["embedding_exposed"] == 0
    assert sum(got["time_parts"].values()) == pytest.approx(got["time_s"])
    # ZeRO 2 keeps the rank's 1/d shard of it (and of the rest): that shard is reduced
    zero2 = plan(tied, replace(layout, dp=2, zero=2), H100)["step"]
    plain2 = plan(untied, replace(layout, dp=2, zero=2), H100)["step"]
    shard = math.ceil(50257 / 2) * 768  # torch.chunk's first (largest) piece of the rows
    assert zero2["comm_bytes"]["pp"] - plain2["comm_bytes"]["pp"] == 2 * shard
    # across nodes (pipeline 2 x data 8 = 16 ranks): each pair is one GPU on each of two
    # nodes, eight such pairs a node pair: one NIC each, the network's latency
    across = plan(tied, replace(layout, dp=8, global_batch=16), H100)["step"]
    seconds = 2 * table / (H100.inter_node * timing.LINK_EFFICIENCY) + 2 * timing.NET_LATENCY
    assert across["time_parts"]["embedding_exposed"] == pytest.approx(seconds)
    # no pipeline, nothing to all-reduce; the rule is stated
    assert plan(tied, Layout(global_batch=4, seq=128), H100)["step"]["time_parts"][
        "embedding_exposed"] == 0
    assert "finalize_model_grads" in timing.ASSUMPTIONS["pipeline"]
    assert "embedding_exposed" in timing.ASSUMPTIONS["pipeline"]


def test_interleaving_shrinks_the_bubble_and_sends_more(gpt) -> None:
    one = plan(gpt, Layout(tp=8, pp=4, dp=1, global_batch=16, seq=2048), H100)
    two = plan(gpt, Layout(tp=8, pp=4, dp=1, vpp=2, global_batch=16, seq=2048), H100)
    assert two["step"]["bubble"] == pytest.approx(one["step"]["bubble"] / 2)
    # twice the boundary crossings; the tied table's all-reduce (GPT-3 ties it) once a step
    layout = Layout(tp=8, pp=4, dp=1, global_batch=16, seq=2048)
    tied = sum(b for _, b in staged(gpt, layout).figures[0].tied)
    assert tied > 0
    assert two["step"]["comm_bytes"]["pp"] - tied == 2 * (one["step"]["comm_bytes"]["pp"] - tied)
    assert two["step"]["time_parts"]["pp_exposed"] == pytest.approx(
        2 * one["step"]["time_parts"]["pp_exposed"])
    # Megatron-LM's interleaved warm-up keeps more micro-batches in flight on stage 0
    assert two["per_rank"]["memory"]["activations"] > one["per_rank"]["memory"]["activations"]


def test_compute_follows_the_splits(gpt) -> None:
    """Tensor parallelism divides the GEMMs; selective and full recompute cost what they rerun."""
    kw = dict(global_batch=8, seq=2048)
    t1 = plan(gpt, Layout(**kw, dp=1), A100)["step"]["time_parts"]
    t8 = plan(gpt, Layout(**kw, tp=8, dp=1), A100)["step"]["time_parts"]
    assert t8["forward"] < t1["forward"] / 4 and t8["backward"] < t1["backward"] / 4
    sel = plan(gpt, Layout(**kw, tp=8, dp=1, recompute="selective"), A100)["step"]["time_parts"]
    full = plan(gpt, Layout(**kw, tp=8, dp=1, recompute="full"), A100)["step"]["time_parts"]
    assert 0 < sel["recompute"] < full["recompute"] < t8["forward"] * 1.001
    assert full["tp_exposed"] > t8["tp_exposed"]  # the forward all-reduces run again
    # unfused attention moves the score matrix: slower than the fused kernel
    unfused = plan(gpt, Layout(**kw, tp=8, dp=1), A100, attention="unfused")
    assert unfused["step"]["time_s"] > plan(gpt, Layout(**kw, tp=8, dp=1), A100)["step"][
        "time_s"]


@pytest.mark.parametrize("args, message", [
    (["--gpus", 2, "--vpp", 2], "--vpp interleaves pipeline stages: it needs --pp > 1"),
    (["--gpus", 2, "--pp", 2, "--vpp", 2], "--vpp 2 does not divide every stage's layers"),
    (["--gpus", 2, "--pp", 2, "--stage-layers", "1,2"], "sum to 3, not the 2 layers"),
    (["--gpus", 2, "--pp", 2, "--stage-layers", "2"], "--stage-layers gives 1 stages, --pp 2"),
    (["--gpus", 2, "--pp", 2, "--stage-layers", "1,0"], "--stage-layers: expected a positive"),
    (["--gpus", 3, "--pp", 3], "--pp 3: more stages than the 2 layers"),
    (["--gpus", 4, "--search", "--vpp", 2], "--search chooses --vpp itself"),
])
def test_pipeline_options_refused_in_one_line(args, message) -> None:
    result = cli(DECODER, *args)
    assert result.exit_code == 2, result.stdout
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_vpp_needs_micro_batches_a_multiple_of_pp(tmp_path: Path) -> None:
    spec = tfgraph.load_spec(DECODER).model_copy(update={"layers": 4})
    path = tmp_path / "four.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))
    bad = cli(path, "--gpus", 2, "--pp", 2, "--vpp", 2, "--global-batch", 3)
    assert bad.exit_code == 2 and "not a multiple of --pp 2" in bad.stderr
    good = plan_json(path, "--gpus", 2, "--pp", 2, "--vpp", 2, "--global-batch", 4)
    assert good["layout"]["vpp"] == 2 and good["step"]["bubble"] == pytest.approx(1 / 8)


def test_unequal_stages_given_and_balanced(tmp_path: Path) -> None:
    spec = tfgraph.load_spec(DECODER).model_copy(update={"layers": 5})
    path = tmp_path / "five.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))
    balanced = plan_json(path, "--gpus", 2, "--pp", 2, "--global-batch", 4)
    assert [s["layers"] for s in balanced["stages"]] == [2, 3]
    given = plan_json(path, "--gpus", 2, "--stage-layers", "4,1", "--global-batch", 4)
    assert given["layout"]["pp"] == 2 and given["layout"]["stage_layers"] == [4, 1]
    assert [s["layers"] for s in given["stages"]] == [4, 1]
    # the heavier first stage holds more and sets the pace
    assert given["stages"][0]["weights"] > balanced["stages"][0]["weights"]
    assert given["step"]["slowest_stage"] == 0
    assert sum(given["step"]["time_parts"].values()) == pytest.approx(given["step"]["time_s"])
    assert given["step"]["time_s"] > balanced["step"]["time_s"]


def test_llama3_405b_at_pipeline_16_is_accepted() -> None:
    """Dubey et al. 2024 §3.3: Llama 3 405B's 126 layers on 16 stages (tp 8), the first and
    last one layer short."""
    data = plan_json(ROOT / "specs" / "llama-3.1-405b.yaml", "--gpus", 128, "--tp", 8, "--pp",
                     16, "--global-batch", 16, "--seq", 8192, "--sp", "--recompute", "full")
    assert [s["layers"] for s in data["stages"]] == [7] + [8] * 14 + [7]
    assert data["step"]["time_s"] > 0 and data["step"]["bubble"] == pytest.approx(15 / 16)
    # 7 and 8 layers have no common chunk count: interleaving is refused in one line
    bad = cli(ROOT / "specs" / "llama-3.1-405b.yaml", "--gpus", 128, "--tp", 8, "--pp", 16,
              "--vpp", 2, "--global-batch", 16, "--seq", 8192)
    assert bad.exit_code == 2 and "--vpp 2 does not divide every stage's layers" in bad.stderr


def test_search_layouts_differ_in_time() -> None:
    """Issue 26: a 7B spec over 64 GPUs used to rank six layouts at one identical time."""
    ranked = plan_json(ROOT / "specs" / "mistral-7b.yaml", "--gpus", 64, "--search", "--top", 6,
                       "--seq", 4096, "--global-batch", 256)
    times = [r["step"]["time_s"] for r in ranked]
    assert times == sorted(times)
    shapes = {(r["layout"]["tp"], r["layout"]["pp"], r["layout"]["micro_batch"],
               r["layout"]["recompute"]): r["step"]["time_s"] for r in ranked}
    assert len(set(shapes.values())) == len(shapes)  # different work, different time
    assert all(math.isfinite(t) and t > 0 for t in times)


def test_interleaved_activations_formula_gives_the_plans_number(gpt) -> None:
    """The formulas' m is the interleaved warm-up's micro-batches in flight (fractional)."""
    import sympy

    result = plan(gpt, Layout(tp=8, pp=4, dp=1, vpp=2, global_batch=16, seq=2048), H100)
    values = {k: v["value"] for k, v in result["formula_symbols"].items()}
    assert values["m"] == pytest.approx((3 * 2 + 4 + 1) / 2)
    names = {k: sympy.Symbol(k) for k in values}
    formula = sympy.sympify(result["formulas"]["per_rank.memory.activations"], locals=names)
    got = float(formula.subs({names[k]: v for k, v in values.items()}))
    assert got == pytest.approx(result["per_rank"]["memory"]["activations"], abs=8 * 16)


def test_search_tries_interleaving_where_megatron_allows_it() -> None:
    from tfgraph.parallel.search import _chunks

    assert _chunks(96, 8, 16) == [1, 2, 4]  # 12 layers per stage, 16 micro-batches
    assert _chunks(96, 8, 12) == [1]  # micro-batches not a multiple of pp
    assert _chunks(126, 16, 32) == [1]  # unequal stages (7 and 8 layers)
    assert _chunks(24, 8, 8) == [1]  # 3 layers per stage
    assert _chunks(96, 1, 16) == [1]  # no pipeline



# ---- ZeRO-2's per-micro-batch reduction and gradient accumulation (review of the planner) ----

def test_zero2_reduce_scatters_every_micro_batch_under_its_own_backward() -> None:
    """ZeRO-2 keeps 1/d of the gradients: each micro-batch's are reduce-scattered as its backward
    makes them (DeepSpeed ZeRO-2, FSDP SHARD_GRAD_OP), m times ZeRO-1's once-a-step reduction,
    each under its micro-batch's backward by the same overlap rule."""
    elements = 400_000_000  # 10 buckets of 40M
    s = States(0, 0, 0, elements)
    bw, lat = timing.link(H100, 8)
    m = 4
    one, two = (Layout(dp=8, global_batch=8 * m, zero=z) for z in (1, 2))
    assert two.microbatches == m
    grads = elements * float(timing.grad_bytes(two))
    reduce = timing.bucketed_ring_time(grads, 10, 8, False, bw, lat)  # ten buckets
    gather = timing.bucketed_ring_time(elements * 2.0, 10, 8, False, bw, lat)
    last_reduce = timing.ring_time(grads / 10, 8, False, bw, lat)
    last_gather = timing.ring_time(elements * 2.0 / 10, 8, False, bw, lat)
    for backward, per_mb in ((10 * reduce, last_reduce), (reduce / 2, reduce / 2)):
        slot = {"forward": 10 * gather, "backward": backward, "recompute": 0.0}
        assert timing._dp_exposed(one, H100, s, slot, 1, 2) == pytest.approx(per_mb + last_gather)
        assert timing._dp_exposed(two, H100, s, slot, 1, 2) == pytest.approx(
            m * per_mb + last_gather)
    # after the backward (no overlap): every micro-batch's whole reduce-scatter exposed
    after = Layout(dp=8, global_batch=8 * m, zero=2, grad_reduce="after")
    slot = {"forward": 10 * gather, "backward": 1e3, "recompute": 0.0}
    assert timing._dp_exposed(after, H100, s, slot, 1, 2) == pytest.approx(
        m * reduce + last_gather)


def test_zero2_sends_its_gradients_every_micro_batch_and_accumulates_shards(gpt) -> None:
    kw = dict(tp=8, pp=2, dp=4, global_batch=32, seq=2048)  # 8 micro-batches per rank
    z1, z2 = (plan(gpt, Layout(zero=z, **kw), H100)["step"] for z in (1, 2))
    m = Layout(**kw).microbatches
    assert m == 8
    # dp bytes: ZeRO-1 reduce-scatters the gradients once and gathers the weights (same size
    # in 16-bit), ZeRO-2 reduce-scatters them every micro-batch
    once = z1["comm_bytes"]["dp"] / 2
    assert z2["comm_bytes"]["dp"] == pytest.approx((m + 1) * once, rel=1e-9)
    assert z2["time_parts"]["dp_exposed"] > z1["time_parts"]["dp_exposed"]
    # accumulation into the 1/4 shard: far less than into the full buffer, but not free
    assert 0 < z2["time_parts"]["grad_accumulation"] < z1["time_parts"]["grad_accumulation"] / 2
    # one micro-batch: ZeRO-2 is ZeRO-1's traffic and time
    single = dict(kw, global_batch=4)
    s1, s2 = (plan(gpt, Layout(zero=z, **single), H100)["step"] for z in (1, 2))
    assert s2["comm_bytes"]["dp"] == s1["comm_bytes"]["dp"]
    assert s2["time_parts"]["dp_exposed"] == pytest.approx(s1["time_parts"]["dp_exposed"])


def test_gradient_accumulation_at_one_micro_batch_only_into_megatrons_fp32_buffer(gpt) -> None:
    """The first micro-batch's gradient is the gradient (PyTorch's AccumulateGrad keeps it; a
    ZeRO 2-3 reduce-scatter writes the shard): nothing to add at m = 1, whatever the ZeRO
    stage, and m - 1 adds at m; Megatron-LM's fp32 main_grad is added into from the first
    micro-batch on (m adds)."""
    kw = dict(tp=8, pp=2, global_batch=4, seq=2048)  # dp 4 x micro-batch 1: m = 1

    def accumulate(**extra: object) -> float:
        layout = Layout(**{**kw, "dp": 4, **extra})  # type: ignore[arg-type]
        return plan(gpt, layout, H100)["step"]["time_parts"]["grad_accumulation"]

    for zero in (0, 1, 2):
        assert accumulate(zero=zero) == 0.0
    assert accumulate(zero=1, states="megatron") > 0
    # m = 4: 3 adds of the full buffer (16-bit) against 4 (Megatron's fp32 main_grad)
    four = dict(global_batch=16)
    mixed, megatron = accumulate(**four), accumulate(states="megatron", **four)
    assert mixed > 0 and megatron > mixed
    assert megatron == pytest.approx(4 * accumulate(states="megatron"))
    # per element an add reads the 16-bit gradient and reads and writes the buffer: 2 + 2 x 2
    # bytes into a 16-bit buffer, 2 + 2 x 4 into an fp32 one
    assert mixed / megatron == pytest.approx((3 * 6) / (4 * 10))


# ---- routed experts --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def deepseek():
    return tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "deepseek-v3.yaml"), loss=True)


def _experts(graph, layout):
    work = next(w for items in timing.unit_work(graph) for w in items if w.kind == "experts")
    sizes = {timing.SYMBOLS["B"]: layout.micro_batch, timing.SYMBOLS["S"]: layout.seq,
             timing.SYMBOLS["T"]: layout.seq}
    return timing._experts_time(work, sizes, layout, H100, H100.peak_flops)


@pytest.mark.parametrize("tp", [1, 2])
def test_routed_experts_are_timed_by_the_roofline_of_the_ranks_experts(deepseek, tp) -> None:
    """The reviewer's case: DeepSeek-V3's routed experts (256 x 3 x 2048 x 7168, top 8) at
    micro-batch 1 x 4096. One rank's op: max(FLOPs / rate, bytes / bandwidth), its bytes its
    E / ep experts' weights (/ t) read once per micro-batch plus the routed (token, expert)
    rows in and out (backward: weights read again, their gradients written, rows read twice
    and written once); its FLOPs the whole op's on its micro-batch / t (the ep group routes
    ep x tokens x k pairs to ep ranks). Without ep: 22.5 GB of weights, 8.7 ms at 81% of the
    H100's 3.35 TB/s, not the 3.76 ms of its FLOPs; at ep 8 a rank's 32 experts are
    FLOP-bound, and the layer's time follows ep (the memo keyed by it)."""
    bandwidth = H100.streaming  # expert weights stream
    weights, rows = 256 * 3 * 2048 * 7168 * 2, 4096 * 8 * 7168 * 2
    one = Layout(tp=tp, dp=64, ep=1, global_batch=64, seq=4096)
    fwd, bwd = _experts(deepseek, one)
    assert fwd == pytest.approx((weights / tp + 2 * rows) / bandwidth)  # weight-bound
    assert bwd == pytest.approx((2 * weights / tp + 3 * rows) / bandwidth)
    if tp == 1:
        assert fwd == pytest.approx(8.66e-3, rel=0.01)
    eight = replace(one, ep=8)
    assert _experts(deepseek, eight)[0] < 0.6 * fwd
    layer = [timing.unit_times(deepseek, x, H100, "fused")[-3].forward for x in (one, eight)]
    assert layer[0] - layer[1] == pytest.approx(fwd - _experts(deepseek, eight)[0])


@pytest.mark.parametrize("attention", ["fused", "unfused"])
def test_hard_attention_times_only_the_gradients_torch_computes(attention: str) -> None:
    """Hard attention's arg-max passes no gradient to q and k (``passes.gradients``): the
    default timing drops their projections' two backward GEMMs each and the scores' backward
    (dQ, dK, the weights' gradient and the softmax's pass); the rest of the layer is timed as
    with softmax. No fused kernel takes an arg-max: --attention fused times it the same."""
    spec = tfgraph.load_spec(ROOT / "specs" / "tiny-sandwich.yaml").model_copy(
        update={"dtype": "bfloat16"})
    soft = spec.model_copy(update={"attention": spec.attention.model_copy(
        update={"normalize": "softmax"})})
    b, s = 4, 64
    layout = Layout(micro_batch=b, global_batch=b, seq=s)
    graphs = [tfgraph.compile(x, loss=True) for x in (spec, soft)]
    hard_t, soft_t = (timing.unit_times(g, layout, H100, attention)[1] for g in graphs)
    peak, bandwidth = H100.peak_flops, H100.kernel_bandwidth  # the softmax's passes
    d, heads, hd = spec.d_model, spec.attention.heads, spec.d_model // spec.attention.heads
    gemms = sum(timing.gemm_time(b * s, d, n, H100, peak, 2)  # the input's gradient
                + timing.gemm_time(n, d, b * s, H100, peak, 2)  # the weight's
                for n in (d, hd))  # q's outputs, k's (one key/value head)
    if attention == "fused":
        # no fused kernel takes an arg-max: its memory and the module's core are explicit
        # matmuls, and so is its time under either form (``Work.explicit``)
        hard = next(w for w in timing.unit_work(graphs[0])[1] if w.kind == "attention")
        assert hard.explicit and hard.grads == (False, False, True)
        assert hard_t == timing.unit_times(graphs[0], layout, H100, "unfused")[1]
        return
    qk = timing.gemm_time(s, s, hd, H100, peak, 2, b * heads)
    pv = timing.gemm_time(s, hd, s, H100, peak, 2, b * heads)
    scores = b * heads * s * s * 2  # one bf16 score tensor (no attention dropout)
    core_saved = 2 * qk + pv + 3 * scores / bandwidth
    assert hard_t.forward == pytest.approx(soft_t.forward)
    assert soft_t.backward - hard_t.backward == pytest.approx(gemms + core_saved, rel=1e-9)
