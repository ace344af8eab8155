"""``tfgraph plan``: the --json keys (README, "tfgraph plan") equal the planner's dict; the formulas give the
dict's numbers back; --search --json is a ranked list of fitting layouts; GPU names and memory
sizes; a Hugging Face folder and a MoE spec as sources; bad input is one line and exit 2."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
from conftest import ROOT
from rich.console import Console
from test_cli_validate import runner  # stderr kept apart from stdout on every click

import tfgraph
from tfgraph.cli import main
from tfgraph.commands.plan_tables import render_plan, render_search
from tfgraph.spec.loader import load_spec
from tfgraph.parallel.gpus import GB, GIB, GPUS, gpu
from tfgraph.parallel.layout import Layout
from tfgraph.graph.ir import SYMBOLS
from tfgraph.parallel.planner import plan, stages
from tfgraph.parallel.units import units

SPECS = ROOT / "specs"
DECODER = ROOT / "tests" / "data" / "tiny-decoder-padded.yaml"  # 2 layers, 4 heads, max_len 64
# (tiny-decoder, its vocabulary padded to 240: the tied table is split by vocabulary)
MOE = SPECS / "tiny-moe.yaml"  # 8 experts, top 2, 4 heads (2 kv)


def cli(*args: object):
    return runner().invoke(main, ["plan", *map(str, args)], catch_exceptions=False)


def plan_json(*args: object) -> dict:
    result = cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    data: dict = json.loads(result.stdout)
    return data


def test_json_has_the_design_keys_and_equals_the_planner():
    data = plan_json(DECODER, "--gpus", 8, "--tp", 2, "--pp", 2, "--zero", 1, "--sp",
                     "--recompute", "selective", "--micro-batch", 2, "--global-batch", 16,
                     "--seq", 32)
    memory = data["per_rank"]["memory"]
    assert set(memory) >= {"weights", "gradients", "optimizer", "activations", "total"}
    assert all(isinstance(v, int) and v > 0 for k, v in memory.items() if k != "temporary")
    assert memory["total"] == sum(memory[k] for k in ("weights", "gradients", "optimizer",
                                                      "activations", "temporary"))
    assert data["per_rank"]["fits"] is True
    step = data["step"]
    assert set(step) >= {"flops", "comm_bytes", "bubble", "time_s", "mfu"}
    assert set(step["comm_bytes"]) == {"tp", "dp", "pp", "ep"}
    assert step["comm_bytes"]["tp"] > 0 and step["comm_bytes"]["pp"] > 0
    assert step["comm_bytes"]["ep"] == 0
    assert data["layout"] == {"tp": 2, "pp": 2, "dp": 2, "ep": 1, "zero": 1, "sp": True,
                              "recompute": "selective", "micro_batch": 2, "global_batch": 16,
                              "seq": 32, "dtype": "bfloat16", "states": "mixed",
                              "grad_reduce": "overlap", "gpus": 8, "microbatches": 4, "vpp": 1, "stage_layers": None,
                              "tgt_seq": None}
    assert step["bubble"] == pytest.approx((2 - 1) / 4)
    graph = tfgraph.compile(load_spec(DECODER).model_copy(update={"dtype": "bfloat16"}),
                            loss=True)
    layout = Layout(tp=2, pp=2, dp=2, zero=1, sp=True, recompute="selective", micro_batch=2,
                    global_batch=16, seq=32)
    api = plan(graph, layout, gpu("h100"))
    assert data == json.loads(json.dumps({"name": "tiny-decoder", **api}))


def test_defaults_dp_global_batch_seq_and_dtype():
    data = plan_json(DECODER, "--gpus", 4, "--tp", 2)
    assert data["layout"]["dp"] == 2  # gpus / (tp x pp)
    assert data["layout"]["global_batch"] == 2  # dp x micro-batch
    assert data["layout"]["seq"] == 64  # the spec's max_len
    assert data["layout"]["dtype"] == "bfloat16" and data["gpu"] == "h100"
    assert data["attention"] == "fused"
    no_max_len = plan_json(SPECS / "tiny-t5.yaml", "--gpus", 1)  # relative positions
    assert no_max_len["layout"]["seq"] == 2048


def test_dtype_and_states_set_the_state_bytes():
    # mixed precision, --states mixed (the default): 2 (16-bit weights) + 2 (16-bit
    # gradients) + 12 (fp32 master + moments); --states megatron: fp32 gradients, 2 + 4 + 12
    data = plan_json(DECODER, "--gpus", 1)
    mixed = data["per_rank"]["memory"]
    assert data["model_states"].startswith("--states mixed: 2 weights + 2 gradients + 12 "
                                           "optimizer")
    megatron = plan_json(DECODER, "--gpus", 1, "--states", "megatron")["per_rank"]["memory"]
    fp32 = plan_json(DECODER, "--gpus", 1, "--dtype", "float32")["per_rank"]["memory"]
    assert mixed["gradients"] == mixed["weights"] == megatron["gradients"] // 2
    assert megatron["gradients"] == 2 * megatron["weights"] == fp32["gradients"] \
        == fp32["weights"]
    assert megatron["optimizer"] == mixed["optimizer"]
    assert plan_json(DECODER, "--gpus", 1, "--dtype", "float32", "--states", "megatron")[
        "per_rank"]["memory"] == fp32  # fp32 training: 4 + 4 + 8 under either
    params = fp32["weights"] // 4
    tensors = (mixed["optimizer"] - 12 * params) // 4  # Adam's float32 step per tensor
    assert fp32["optimizer"] == 8 * params + 4 * tensors
    # 16-bit activations halve, but the loss's float32 log-probabilities, the labels and
    # attention's float32 log-sum-exp keep their size
    assert mixed["activations"] < fp32["activations"] < 2 * mixed["activations"]


def _formula_value(text: str, symbols: dict) -> sympy.Rational:
    names = {name: sympy.Symbol(name, positive=True, integer=True) for name in symbols}
    expr = sympy.sympify(text, locals=names)
    assert expr.free_symbols <= set(names.values()), text
    return expr.xreplace({names[k]: v["value"] for k, v in symbols.items()})


LAYOUTS = [
    ("--gpus", 1),
    ("--gpus", 8, "--tp", 2, "--pp", 2, "--global-batch", 8, "--seq", 32),
    ("--gpus", 8, "--tp", 4, "--pp", 2, "--sp", "--recompute", "selective",
     "--global-batch", 8, "--micro-batch", 2, "--attention", "unfused"),
    ("--gpus", 4, "--tp", 2, "--pp", 2, "--recompute", "full", "--global-batch", 4),
    ("--gpus", 4, "--tp", 4, "--sp", "--recompute", "full", "--seq", 48),
]


@pytest.mark.parametrize("args", LAYOUTS, ids=lambda a: " ".join(map(str, a)))
def test_formulas_give_the_plans_numbers(args):
    data = plan_json(DECODER, *args)
    symbols = data["formula_symbols"]
    layout = data["layout"]
    assert {k: v["value"] for k, v in symbols.items()} == {
        "B": layout["micro_batch"], "S": layout["seq"], "t": layout["tp"],
        "m": min(layout["pp"] - data["per_rank"]["stage"], layout["microbatches"]),
        "n": layout["microbatches"]}
    activations = _formula_value(data["formulas"]["per_rank.memory.activations"], symbols)
    # the planner rounds each unit's split and whole bytes per rank to whole bytes (up; full
    # recompute's inputs down): less than 2 m bytes per unit apart
    graph = tfgraph.compile(load_spec(DECODER).model_copy(update={"dtype": "bfloat16"}),
                            loss=True)
    counts = tuple(stage["layers"] for stage in data["stages"])
    stage_units = len(stages(graph, counts)[data["per_rank"]["stage"]])
    slack = 2 * symbols["m"]["value"] * stage_units
    assert abs(data["per_rank"]["memory"]["activations"] - activations) < slack
    tp = _formula_value(data["formulas"]["step.comm_bytes.tp"], symbols)
    assert data["step"]["comm_bytes"]["tp"] == math.floor(tp)
    assert (tp == 0) == (layout["tp"] == 1)


def test_formulas_of_gpt3_are_exact_and_megatrons():
    """GPT-3 175B, tp 8, pp 8, sequence parallel, selective recompute: t divides every unit's
    bytes, so the formulas give the planner's numbers exactly; per layer the activations are
    Korthikanti et al. 2022's 34 s b h / t plus what the graph also keeps (attention's float32
    log-sum-exp, 4 bytes per head; the two LayerNorms' float32 mean and 1/std per token), and
    the first stage adds the embeddings' dropout mask (h bytes, split by SP) and the int64
    token ids (whole on every tensor-parallel rank: the embedding's backward reads them all)."""
    data = plan_json(SPECS / "gpt3-175b.yaml", "--gpus", 1024, "--tp", 8, "--pp", 8, "--sp",
                     "--recompute", "selective", "--global-batch", 1536)
    symbols = data["formula_symbols"]
    assert data["per_rank"]["memory"]["activations"] == _formula_value(
        data["formulas"]["per_rank.memory.activations"], symbols)
    assert data["step"]["comm_bytes"]["tp"] == _formula_value(
        data["formulas"]["step.comm_bytes.tp"], symbols)
    b, s, t, m, n = sympy.symbols("B S t m n", positive=True, integer=True)
    names = {"B": b, "S": s, "t": t, "m": m, "n": n}
    h, heads, layers = 12288, 96, 96 // 8
    per_layer = 34 * h + 4 * heads + 2 * 2 * 4
    expected = (layers * per_layer + h) * b * s * m / t + 8 * b * s * m
    got = sympy.sympify(data["formulas"]["per_rank.memory.activations"], locals=names)
    assert sympy.expand(got - expected) == 0
    # tp: per layer two all-reduces forward and two backward of B S h 16-bit values (Megatron's
    # f and g, Shoeybi et al. 2019 §3), ring 2 (t - 1) / t. The tied table is split by
    # vocabulary on the first and the last stage: the first adds the lookup's all-reduce (B S
    # h values), the last, which sends most, the head's input gradient (B S h values, f
    # before the column-parallel head) and the vocabulary-parallel loss's 3 floats per token
    # (max, sum of exponentials, the label's logit)
    assert data["formula_notes"]["step.comm_bytes.tp"].startswith("stage 7;")
    tp = sympy.sympify(data["formulas"]["step.comm_bytes.tp"], locals=names)
    assert sympy.expand(tp - 2 * n * (t - 1) / t * (layers * 4 + 1) * 2 * h * b * s
                        - 2 * n * (t - 1) / t * 3 * 4 * b * s) == 0


def test_search_json_is_a_ranked_list_of_fitting_layouts():
    result = cli(DECODER, "--gpus", 8, "--search", "--top", 5, "--global-batch", 16, "--json")
    assert result.exit_code == 0, result.stderr
    ranked = json.loads(result.stdout)
    assert isinstance(ranked, list) and 1 <= len(ranked) <= 5
    speeds = [r["step"]["tokens_per_s"] for r in ranked]
    assert speeds == sorted(speeds, reverse=True)
    for r in ranked:
        assert r["per_rank"]["fits"] and r["layout"]["gpus"] == 8
        assert r["layout"]["global_batch"] == 16
        assert r["layout"]["tp"] * r["layout"]["pp"] * r["layout"]["dp"] == 8
        assert set(r["per_rank"]["memory"]) >= {"weights", "gradients", "optimizer",
                                                "activations", "total"}


def test_search_default_top_and_batch():
    ranked = plan_json(DECODER, "--gpus", 4, "--search")
    assert len(ranked) == 10
    assert {r["layout"]["global_batch"] for r in ranked} == {4}  # one sequence per GPU


def test_search_table_lists_the_layouts():
    result = cli(DECODER, "--gpus", 4, "--search", "--top", 3)
    assert result.exit_code == 0, result.stderr
    for text in ("The 3 fastest layouts that fit", "recompute", "micro-batch", "tokens/s",
                 "MFU", "time model (tfgraph/parallel/timing.py)"):
        assert text in result.stdout, text


def test_search_when_nothing_fits_is_one_line():
    result = cli(DECODER, "--gpus", 4, "--search", "--gpu-memory", "0.001MB")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "no layout of 4 GPUs fits" in result.stderr


@pytest.mark.parametrize("name", sorted(GPUS))
def test_gpu_names(name):
    data = plan_json(DECODER, "--gpus", 1, "--gpu", name.upper())
    assert data["gpu"] == name and data["per_rank"]["gpu_memory"] == GPUS[name].memory
    # the link inside a node is the GPU's own (gpus.py), not NVLink on a PCIe or AMD part
    link = {"l40s": "PCIe 4.0 x16", "mi300x": "Infinity Fabric"}.get(name, "NVLink")
    stated = data["assumptions"]["gpu"]
    assert f"{link}" in stated and f"{GPUS[name].intra_node / 1e9:g} GB/s inside" in stated
    assert ("NVLink" in stated) == (link == "NVLink")


@pytest.mark.parametrize(("text", "expected"), [
    ("80GB", 80 * GB), ("141GiB", 141 * GIB), ("40", 40 * GB), ("0.5 TB", 500 * GB),
    ("512MiB", 512 * 2**20)])
def test_gpu_memory_parsing(text, expected):
    data = plan_json(DECODER, "--gpus", 1, "--gpu-memory", text)
    assert data["per_rank"]["gpu_memory"] == expected
    named = plan_json(DECODER, "--gpus", 1, "--gpu", "h200", "--gpu-memory", text)
    assert named["gpu"] == "h200" and named["per_rank"]["gpu_memory"] == expected


def test_fits_follows_the_memory():
    total = plan_json(DECODER, "--gpus", 1)["per_rank"]["memory"]["total"]
    assert plan_json(DECODER, "--gpus", 1, "--gpu-memory", f"{total / 1e6}MB")["per_rank"][
        "fits"]
    assert not plan_json(DECODER, "--gpus", 1, "--gpu-memory", f"{(total - 1000) / 1e6}MB")[
        "per_rank"]["fits"]


BAD: list[tuple[Path, list[object], str]] = [
    (DECODER, ["--gpus", 3, "--tp", 3], "--tp 3 does not divide the 4 heads"),
    (SPECS / "tiny-decoder.yaml", ["--gpus", 2, "--tp", 2],
     "--tp 2 does not divide embed.tokens.weight dimension 0 (211) (pad the vocab"),
    (DECODER, ["--gpus", 3, "--pp", 3], "--pp 3: more stages than the 2 layers"),
    (DECODER, ["--gpus", 8, "--tp", 2, "--dp", 2], "must equal tp x pp x dp"),
    (DECODER, ["--gpus", 6, "--tp", 4], "not a multiple of tp x pp"),
    (DECODER, ["--gpus", 1, "--gpu", "tpu-v9"], "--gpu 'tpu-v9': expected one of"),
    (DECODER, ["--gpus", 1, "--gpu-memory", "lots"], "--gpu-memory 'lots'"),
    (DECODER, ["--gpus", 1, "--gpu-memory", "-80GB"], "--gpu-memory '-80GB'"),
    (DECODER, ["--gpus", 1, "--gpu-memory", "0GB"], "not a plausible device memory"),
    # (a size under one byte planned for a GPU of 0 bytes; an empty name took the h100)
    (DECODER, ["--gpus", 1, "--gpu-memory", "0.0000000001"], "not a plausible device memory"),
    (DECODER, ["--gpus", 1, "--gpu", ""], "--gpu '': expected one of"),
    (DECODER, ["--gpus", 4, "--pp", 2, "--vpp", 0], "--vpp: expected a positive integer"),
    (DECODER, ["--gpus", 4, "--pp", 2, "--vpp", "two"], "--vpp: expected an integer"),
    (DECODER, ["--gpus", 4, "--vpp", 2], "--vpp interleaves pipeline stages: it needs --pp"),
    (DECODER, ["--gpus", 4, "--pp", 2, "--vpp", 2], "--vpp 2 does not divide every stage"),
    (DECODER, ["--gpus", 4, "--pp", 2, "--vpp", 2**40], "--vpp 1099511627776: at most"),
    (DECODER, ["--gpus", 2, "--stage-layers", "1,"], "--stage-layers: expected an integer"),
    (DECODER, ["--gpus", 2, "--stage-layers", "0,2"], "--stage-layers: expected a positive"),
    (DECODER, ["--gpus", 2, "--stage-layers", "1,2"], "sum to 3, not the 2 layers"),
    (DECODER, ["--gpus", 2, "--pp", 2, "--stage-layers", "2"], "gives 1 stages, --pp 2"),
    (DECODER, ["--gpus", 2, "--stage-layers", ",".join(["1"] * (2**20 + 1))],
     "--stage-layers: at most 1,048,576 stages"),
    (DECODER, ["--gpus", 2, "--zero", 3, "--grad-reduce", "after"], "ZeRO 3 (FSDP)"),
    (DECODER, ["--gpus", 2, "--grad-reduce", "later"], "'later' is not one of"),
    (DECODER, ["--gpus", 2, "--states", "fp8"], "'fp8' is not one of"),
    (DECODER, ["--gpus", -4], "--gpus: expected a positive integer, got -4"),
    (DECODER, ["--gpus", 0], "--gpus: expected a positive integer, got 0"),
    (DECODER, ["--gpus", "four"], "--gpus: expected an integer"),
    (DECODER, ["--gpus", 4, "--tp", -2], "--tp: expected a positive integer, got -2"),
    (DECODER, ["--gpus", 4, "--micro-batch", -1], "--micro-batch: expected a positive"),
    (DECODER, ["--gpus", 4, "--zero", -1], "--zero: expected an integer >= 0"),
    (DECODER, ["--gpus", 4, "--zero", 4], "--zero: expected 0, 1, 2 or 3"),
    (DECODER, ["--gpus", 4, "--seq", 65], "--seq 65: longer than tiny-decoder's max_len 64"),
    (DECODER, ["--gpus", 4, "--sp"], "--sp splits what tensor parallelism leaves whole"),
    (DECODER, ["--gpus", 4, "--ep", 2], "--ep is for mixture-of-experts models"),
    (DECODER, ["--gpus", 4, "--global-batch", 6], "is not a multiple of dp x micro-batch"),
    (DECODER, ["--gpus", 4, "--recompute", "some"], "'some' is not one of"),
    (DECODER, ["--gpus", 4, "--top", 3], "--top: only with --search"),
    (DECODER, ["--gpus", 4, "--search", "--pp", 2], "--search chooses --pp itself"),
    (DECODER, ["--gpus", 4, "--search", "--top", 0], "--top: expected a positive integer"),
    (MOE, ["--gpus", 4, "--ep", 3, "--dp", 4], "--ep 3 must divide --dp 4"),
    (MOE, ["--gpus", 12, "--ep", 3], "3"),  # 8 experts do not split over 3 ranks
    (DECODER, [], "Missing option '--gpus'"),
    (SPECS / "missing.yaml", ["--gpus", 1], "missing.yaml"),
]


@pytest.mark.parametrize(("spec", "args", "message"), BAD,
                         ids=[" ".join(str(x) for x in a) or "no --gpus" for _, a, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(spec, args, message):
    result = cli(spec, *args)
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert result.stderr.count("\n") == 1, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_bad_input_in_a_real_process_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "tfgraph", "plan", str(DECODER), "--gpus",
                           "6", "--tp", "2", "--pp", "3"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr == "--pp 3: more stages than the 2 layers\n"


def test_hugging_face_folder_is_a_source(tmp_path: Path):
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    data = plan_json(tmp_path, "--gpus", 4, "--tp", 2, "--pp", 2, "--global-batch", 4)
    assert data["layout"]["seq"] == 128  # max_position_embeddings
    assert data["per_rank"]["fits"] and data["step"]["comm_bytes"]["tp"] > 0
    spec = load_spec(tmp_path)
    api = plan(tfgraph.compile(spec.model_copy(update={"dtype": "bfloat16"}), loss=True),
               Layout(tp=2, pp=2, dp=1, global_batch=4, seq=128), gpu())
    assert data["per_rank"] == json.loads(json.dumps(api["per_rank"]))
    bad = cli(tmp_path, "--gpus", 3, "--tp", 3)  # 4 heads
    assert bad.exit_code == 2 and bad.stderr.startswith("--tp 3 does not divide")


def test_moe_with_expert_parallelism():
    one = plan_json(MOE, "--gpus", 8, "--tp", 2, "--global-batch", 8)
    ep = plan_json(MOE, "--gpus", 8, "--tp", 2, "--ep", 4, "--global-batch", 8)
    assert one["step"]["comm_bytes"]["ep"] == 0 < ep["step"]["comm_bytes"]["ep"]
    # each rank holds 8 / 4 experts: fewer weights, the same tokens' activations
    assert ep["per_rank"]["memory"]["weights"] < one["per_rank"]["memory"]["weights"]
    assert ep["per_rank"]["memory"]["activations"] == one["per_rank"]["memory"]["activations"]
    assert ep["step"]["flops"] == one["step"]["flops"]
    ranked = plan_json(MOE, "--gpus", 8, "--search", "--global-batch", 8, "--top", 50)
    assert any(r["layout"]["ep"] > 1 for r in ranked)
    assert all(8 % r["layout"]["ep"] == 0 for r in ranked)


def test_table_shows_every_section():
    result = cli(DECODER, "--gpus", 8, "--tp", 2, "--pp", 2, "--sp", "--global-batch", 8)
    assert result.exit_code == 0, result.stderr
    out = " ".join(result.stdout.split())  # the footnote wraps at the terminal's width
    for text in ("tiny-decoder, decoder-only", "tp 2 x pp 2 x dp 2 = 8 GPUs",
                 "Per-rank memory", "weights", "gradients", "optimizer", "activations",
                 "temporary", "total", "GiB", "fits:", "Per pipeline stage", "model FLOPs",
                 "hardware FLOPs", "tensor parallel (tp)", "data parallel (dp)",
                 "pipeline (pp)", "expert all-to-all (ep)", "pipeline bubble", "time", "MFU",
                 "tokens/s", "per_rank.memory.activations", "step.comm_bytes.tp",
                 "time model (tfgraph/parallel/timing.py)", "collectives: ring",
                 "memory: per rank", "time: backward", "time: data parallel, exposed"):
        assert text in out, text
    single = cli(DECODER, "--gpus", 1).stdout
    assert "Per pipeline stage" not in single


def test_hostile_spec_names_are_escaped():
    hostile = "\x1b[31mred\x1b[0m [red]markup[/red] new\nline"
    valid = load_spec(DECODER).model_copy(update={"dtype": "bfloat16"})
    graph = tfgraph.compile(valid, loss=True)
    # no spec file can hold the name (compile refuses it): the tables get it as given
    spec = valid.model_copy(update={"name": hostile})
    result = {"name": hostile, **plan(graph, Layout(seq=64), gpu())}  # max_len 64: learned
    buffer = io.StringIO()
    render_plan(result, spec, gpu(), Console(file=buffer, width=300))
    render_search([result], spec, gpu(), Console(file=buffer, width=300))
    out = buffer.getvalue()
    assert "\x1b" not in out and "new\nline" not in out
    assert out.count("\\x1b[31mred\\x1b[0m [red]markup[/red] new\\nline") == 2



@pytest.mark.parametrize("zero", [0, 1, 3])
def test_expert_parallel_experts_reduce_over_the_ranks_holding_them(zero: int) -> None:
    # Experts split over ep ranks are all-gathered / reduced among the dp / ep ranks holding the
    # same experts; with ep = dp that group is one rank: only the dense parameters travel.
    graph = tfgraph.compile(load_spec(MOE))
    experts = sum(math.prod(p.attrs["shape"]) for p in graph.params() if ".experts." in p.name)
    dense = sum(math.prod(p.attrs["shape"]) for p in graph.params()) - experts
    base = dict(dp=4, zero=zero, global_batch=4, seq=16, dtype="float32")
    d, w = 4, 4  # float32 weights and gradients

    def ring(nbytes: float, ranks: int, reduce: bool) -> float:
        return (2 if reduce else 1) * nbytes * (ranks - 1) / ranks if ranks > 1 else 0.0

    def expected(elements: int, ranks: int) -> float:
        if zero == 0:
            return ring(elements * w, ranks, True)
        if zero == 1:
            return 2 * ring(elements * w, ranks, False)
        return 3 * ring(elements * w, ranks, False)  # one micro-batch: gather x2, scatter x1

    for ep in (1, 2, 4):
        got = plan(graph, Layout(ep=ep, **base), gpu())["step"]["comm_bytes"]["dp"]
        want = expected(dense, d) + expected(experts // ep, d // ep)
        assert got == pytest.approx(want, rel=1e-9), (ep, got, want)


@pytest.mark.parametrize("states, per_param", [(None, 16), ("mixed", 16), ("megatron", 18)])
@pytest.mark.parametrize("name", ["tiny-bf16.yaml", "tiny-decoder.yaml"])
def test_report_and_plan_count_the_same_model_states(states: str | None, per_param: int,
                                                     name: str, tmp_path: Path) -> None:
    """One convention for both commands (issue 26): for a 16-bit spec, ``report``'s
    memory.model_states and a one-GPU ``plan``'s weights + gradients + optimizer are the same
    bytes per parameter under the same --states (default mixed: 16; megatron: 18), plus
    Adam's float32 step count, 4 bytes per parameter tensor, in both (torch allocates it:
    tests/test_model_states_grad.py); both say which convention."""
    spec_path = SPECS / name
    flag = [] if states is None else ["--states", states]
    spec = load_spec(spec_path).model_copy(update={"dtype": "bfloat16"})
    bf16 = tmp_path / name  # the spec in bfloat16 (JSON is YAML), as plan compiles it
    bf16.write_text(json.dumps(spec.model_dump(mode="json", exclude_unset=True)))
    done = runner().invoke(main, ["report", str(bf16), "--json", *flag],
                           catch_exceptions=False)
    assert done.exit_code == 0, done.stderr
    report = json.loads(done.stdout)
    planned = plan_json(spec_path, "--gpus", 1, "--dtype", "bfloat16", *flag)
    memory = planned["per_rank"]["memory"]
    tensors = len(tfgraph.compile(spec).params())
    assert report["memory"]["model_states"] == per_param * report["params"] + 4 * tensors
    assert memory["weights"] + memory["gradients"] + memory["optimizer"] \
        == report["memory"]["model_states"]
    assert planned["model_states"].startswith(report["model_states"])
    assert f"= {per_param} bytes per parameter" in report["model_states"]


def test_full_recompute_sends_its_forward_collectives_again():
    """Full recompute reruns each layer's forward, collectives included (Megatron-LM's
    CheckpointFunction): its tensor-parallel all-reduces and its MoE all-to-alls are in the bytes
    as in the time, and in the tp formula; selective recompute reruns attention cores (no
    collective)."""
    args = ("--gpus", 4, "--tp", 2, "--pp", 2, "--global-batch", 4, "--seq", 32)
    none, sel, full = (plan_json(DECODER, *args, "--recompute", r)
                       for r in ("none", "selective", "full"))
    graph = tfgraph.compile(load_spec(DECODER).model_copy(update={"dtype": "bfloat16"}),
                            loss=True)
    sizes = {SYMBOLS["B"]: 1, SYMBOLS["S"]: 32, SYMBOLS["T"]: 32}
    tp_stage = full["formula_notes"]["step.comm_bytes.tp"].split(";")[0].split()[1]
    counts = tuple(stage["layers"] for stage in full["stages"])
    rerun = sum(int(sympy.sympify(units(graph)[0][i].tp_forward).xreplace(sizes))
                for i in stages(graph, counts)[int(tp_stage)] if units(graph)[0][i].is_layer)
    n = full["layout"]["microbatches"]
    assert rerun > 0
    assert full["step"]["comm_bytes"]["tp"] == pytest.approx(
        none["step"]["comm_bytes"]["tp"] + n * 2 * (2 - 1) / 2 * rerun, abs=1)
    assert sel["step"]["comm_bytes"]["tp"] == none["step"]["comm_bytes"]["tp"]
    assert full["step"]["time_parts"]["tp_exposed"] > none["step"]["time_parts"]["tp_exposed"]
    assert full["formulas"]["step.comm_bytes.tp"] != none["formulas"]["step.comm_bytes.tp"]
    # MoE: dispatch + combine in forward and backward (4), again in the rerun forward (6)
    moe = ("--gpus", 8, "--ep", 8, "--zero", 3, "--global-batch", 8, "--seq", 32)
    none, sel, full = (plan_json(MOE, *moe, "--recompute", r)
                       for r in ("none", "selective", "full"))
    assert none["step"]["comm_bytes"]["ep"] > 0
    assert full["step"]["comm_bytes"]["ep"] == pytest.approx(
        1.5 * none["step"]["comm_bytes"]["ep"], abs=2)
    assert full["step"]["time_parts"]["ep_exposed"] == pytest.approx(
        1.5 * none["step"]["time_parts"]["ep_exposed"])
    assert sel["step"]["comm_bytes"]["ep"] == none["step"]["comm_bytes"]["ep"]
    assert sel["step"]["time_parts"]["ep_exposed"] == none["step"]["time_parts"]["ep_exposed"]


def test_kernels_help_says_search_takes_eager():
    """``--search --kernels eager`` ranks every layout by its eager kernels (README): the help
    must not say the two exclude each other."""
    result = runner().invoke(main, ["plan", "--help"], catch_exceptions=False)
    text = " ".join(result.stdout.split())
    assert "not with --search" not in text
    assert "with --search each layout is ranked by its eager kernels" in text


def test_search_that_fits_nothing_names_the_sequence_length():
    """Nothing fitting is most often the default --seq (the spec's max_len, 163,840 tokens for
    DeepSeek-V3): the message names the length, and where it was the default, says so."""
    default = cli(DECODER, "--gpus", 2, "--search", "--gpu-memory", "0.001MB")
    assert default.exit_code == 2
    line = default.stderr.strip()
    assert "\n" not in line and "at sequence length 64" in line
    assert "max_len by default" in line and "--seq" in line
    given = cli(DECODER, "--gpus", 2, "--search", "--gpu-memory", "0.001MB", "--seq", 32)
    assert given.exit_code == 2 and "at sequence length 32" in given.stderr
    assert "max_len" not in given.stderr


def test_interleaving_refused_for_encoder_decoder_models():
    """Megatron-LM's interleaved 1F1B raises for ModelType.encoder_and_decoder
    (forward_backward_pipelining_with_interleaving): --vpp is refused in one line, and
    --search does not try it."""
    bad = cli(SPECS / "t5-small.yaml", "--gpus", 12, "--pp", 4, "--vpp", 3)
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
    assert "encoder-decoder" in bad.stderr
    ranked = plan_json(SPECS / "tiny-t5.yaml", "--gpus", 4, "--search", "--global-batch", 16,
                       "--top", 1000)
    assert ranked and all(r["layout"]["vpp"] == 1 for r in ranked)
    assert any(r["layout"]["pp"] > 1 for r in ranked)


def test_tgt_seq_sets_an_encoder_decoders_target_length_only():
    """``--tgt-seq`` (``report``'s name) is the target length of an encoder-decoder, default
    --seq; a decoder-only model is refused in one line; --help says so."""
    t5 = SPECS / "tiny-t5.yaml"
    short = plan_json(t5, "--gpus", 2, "--pp", 2, "--seq", 32, "--tgt-seq", 8)
    plain = plan_json(t5, "--gpus", 2, "--pp", 2, "--seq", 32)
    assert short["layout"]["tgt_seq"] == 8 and plain["layout"]["tgt_seq"] is None
    # the encoder's stage is the same, the decoder's keeps a quarter of the target rows
    assert short["stages"][0] == plain["stages"][0]
    assert short["stages"][1]["activations"] < plain["stages"][1]["activations"]
    assert short["step"]["flops"] < plain["step"]["flops"]
    for args in ((DECODER, "--gpus", 1, "--tgt-seq", 8),
                 (DECODER, "--gpus", 2, "--search", "--tgt-seq", 8),
                 (t5, "--gpus", 1, "--tgt-seq", 0)):
        bad = cli(*args)
        assert bad.exit_code == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "one sequence" in cli(DECODER, "--gpus", 1, "--tgt-seq", 8).stderr
    assert "--tgt-seq" in " ".join(cli("--help").stdout.split())


def test_bfloat16_refused_on_a_gpu_without_it():
    """The V100's tensor cores run float16, not bfloat16 (that came with Ampere): planning
    bfloat16 at its float16 peak would time a rate it has not. --dtype bfloat16 is refused in
    one line; without --dtype the V100 is planned in float16 (how Volta trained)."""
    for args in (("--dtype", "bfloat16"), ("--dtype", "bfloat16", "--search")):
        bad = cli(DECODER, "--gpus", 2, "--gpu", "v100-32gb", *args)
        assert bad.exit_code == 2 and bad.stderr.count("\n") == 1
        assert "no bfloat16 tensor cores" in bad.stderr and "--dtype float16" in bad.stderr
    default = plan_json(DECODER, "--gpus", 2, "--gpu", "v100-32gb")
    given = plan_json(DECODER, "--gpus", 2, "--gpu", "v100-32gb", "--dtype", "float16")
    assert default["layout"]["dtype"] == "float16" and default["step"] == given["step"]
    assert plan_json(DECODER, "--gpus", 2)["layout"]["dtype"] == "bfloat16"


@pytest.mark.parametrize("name", ["tiny-t5", "tiny-olmo2", "tiny-bloom"])
@pytest.mark.parametrize("sp", [False, True])
def test_plan_refuses_what_parallelize_refuses_in_its_words(name: str, sp: bool) -> None:
    """T5's relative position bias, OLMo 2's full-width query/key norms and ALiBi have no
    tensor-parallel form in ``parallelize`` (exporters/torch/parallel.py): ``tfgraph plan
    --tp 2`` (with or without --sp) refuses them too, one line, exit 2, the very words
    ``parallelize``'s check raises (no process group needed to get them)."""
    from tfgraph.errors import TfgraphError
    from tfgraph.exporters.torch.parallel import _check_tensor_parallel

    with pytest.raises(TfgraphError) as refused:
        _check_tensor_parallel(tfgraph.compile(load_spec(SPECS / f"{name}.yaml")), 2)
    result = cli(SPECS / f"{name}.yaml", "--gpus", 2, "--tp", 2, *(["--sp"] if sp else []))
    assert result.exit_code == 2, result.stdout
    assert result.stderr.count("\n") == 1 and str(refused.value) in result.stderr, \
        (result.stderr, str(refused.value))
