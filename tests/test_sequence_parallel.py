"""Sequence parallelism (``parallelize(..., sp=True)``, Korthikanti et al. 2022) under torchrun
with 2 and 4 CPU processes (gloo): the one-process losses and gradients (norm gains included),
activations between sublayers held as each rank's sequence rows, and per rank the bytes
``tfgraph plan --sp`` predicts (weights, gradients, Adam's moments exactly; saved activations
on 2 and 4 processes exactly once the rotary tables are added, which the plan leaves out).

Specs: tiny-llama (GQA, rotary, RMSNorm, SwiGLU, vocabulary-split table and head), tiny-opt
(LayerNorm, learned positions with offset 2, a tied head: table and head split by vocabulary),
tiny-encoder (post-norm, biases, tied head with an output bias, split by vocabulary too),
tiny-moe (router and routed experts read the all-gathered stream), tiny-qwen3 (per-head
query/key RMSNorm), tiny-bert (segment embeddings; the masked-LM head's transform, a
replicated linear and LayerNorm, beside the vocabulary-split bias of its tied projection) and,
under tensor parallelism alone, tiny-bart (one table for both embeddings and the tied head)
and tiny-bert. Each torchrun launch runs
several cases (tests/sequence_parallel_worker.py); every rank also computes the one-process
module, so the module comparisons need no other launch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from distributed_support import load_example, run_example, torchrun

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.parallel.tp_plan import tp_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_distributed.py"
WORKER = ROOT / "tests" / "sequence_parallel_worker.py"
SPECS = {"llama": "specs/tiny-llama.yaml", "opt": "specs/tiny-opt.yaml",
         "encoder": "specs/tiny-encoder.yaml", "moe": "specs/tiny-moe.yaml",
         "qwen3": "specs/tiny-qwen3.yaml", "bart": "specs/tiny-bart.yaml",
         "bert": "specs/tiny-bert.yaml"}
MODULE_SPECS = ("llama", "opt", "encoder", "moe", "qwen3", "bert")
EXAMPLE_SPECS = ("llama", "opt")
MEASURED_SPECS = {2: ("llama", "opt", "encoder", "moe"), 4: ("llama", "encoder", "moe")}
"""Processes -> specs whose saved activations the example measures (--measure-saved): a
vocabulary-split head (llama), a tied head over the vocabulary-split table (encoder,
post-norm with an output bias; opt on 2 processes only: on 4 it would add seconds and
nothing the encoder does not test), a router and routed experts (moe). EXAMPLE_SPECS are
measured in their training runs (4 steps on 2 processes), the others in runs of one step."""
BATCH, SEQ, STEPS = 4, 16, 4


def _case(name: str, **over: Any) -> dict[str, Any]:
    return {"spec": SPECS[name], "tp": 2, "fsdp": False, "steps": 3, "batch": 2, "seq": SEQ,
            **over}


def _example_args(name: str, strategy: str, *extra: str) -> list[str]:
    return ["--spec", str(ROOT / SPECS[name]), "--strategy", strategy, "--steps", str(STEPS),
            "--batch", str(BATCH), "--seq", str(SEQ), *extra]


def _torchrun(procs: int, runs: list[dict[str, Any]], out: Path) -> list[dict[str, Any]]:
    torchrun(procs, WORKER, runs, out, timeout=400)
    results: list[dict[str, Any]] = json.loads(out.read_text())
    return results


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One launch of 2 processes (tp 2): the module comparisons, qwen3 under tensor
    parallelism alone, a sequence length tp does not divide, and the example's --sp runs."""
    runs: dict[str, dict[str, Any]] = {name: _case(name) for name in MODULE_SPECS}
    runs["qwen3 tp"] = _case("qwen3", sp=False)
    runs["bart tp"] = _case("bart", sp=False)
    runs["bert tp"] = _case("bert", sp=False)
    runs["odd length"] = _case("llama", seq=15, steps=1)
    for name in EXAMPLE_SPECS:
        runs[f"example {name}"] = {"example": _example_args(name, "tp", "--sp",
                                                            "--measure-saved")}
    for name in (n for n in MEASURED_SPECS[2] if n not in EXAMPLE_SPECS):
        runs[f"example {name}"] = {"example": [*_example_args(name, "tp", "--sp",
                                                              "--measure-saved"), "--steps", "1"]}
    tmp = tmp_path_factory.mktemp("sp-two")
    runs["save"] = {"example": [*_example_args("llama", "tp", "--sp"), "--steps", "2",
                                "--save", str(tmp / "ckpt")]}  # the last --steps counts
    runs["resume"] = {"example": [*_example_args("llama", "tp", "--sp"),
                                  "--resume", str(tmp / "ckpt")]}
    results = _torchrun(2, list(runs.values()), tmp / "results.json")
    return dict(zip(runs, results))


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One launch of 4 processes: FSDP2 over 2 data-parallel ranks of tp 2 with --sp (the
    example's saved activations measured on MEASURED_SPECS[4])."""
    runs = {"llama": _case("llama", fsdp=True),
            "example llama": {"example": _example_args("llama", "fsdp+tp", "--tp", "2",
                                                       "--sp", "--measure-saved")}}
    for name in (n for n in MEASURED_SPECS[4] if n != "llama"):
        runs[f"example {name}"] = {"example": [*_example_args(name, "fsdp+tp", "--tp", "2",
                                                              "--sp", "--measure-saved"),
                                               "--steps", "1"]}
    results = _torchrun(4, list(runs.values()),
                        tmp_path_factory.mktemp("sp-four") / "results.json")
    return dict(zip(runs, results))


@pytest.fixture(scope="module")
def single() -> dict[str, list[float]]:
    """The example's one-process losses (no process group)."""
    example = load_example()
    return {name: example.train(example.parse_args(_example_args(name, "none")))["losses"]
            for name in EXAMPLE_SPECS}


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)
                                         for a, b in zip(got, want))


# ---- the module against the one-process module ----------------------------------------------

@pytest.mark.parametrize("name", MODULE_SPECS)
def test_losses_equal_the_one_process_module(two: dict[str, dict[str, Any]],
                                             name: str) -> None:
    losses = two[name]["losses"]
    assert _close(losses["parallel"], losses["single"]), losses


@pytest.mark.parametrize("name", MODULE_SPECS)
def test_inference_without_autograd_equals_the_one_process_module(
        two: dict[str, dict[str, Any]], name: str) -> None:
    """In eval mode under no_grad, where element-wise steps write in place, the output is
    the one-process one (positions, norms and gathers replaced steps, not their in-place
    forms)."""
    assert two[name]["inference_difference"] < 1e-5


@pytest.mark.parametrize("name", MODULE_SPECS)
def test_every_gradient_equals_the_one_process_one(two: dict[str, dict[str, Any]],
                                                   name: str) -> None:
    """After the first backward, every parameter's gradient (its whole tensor) equals the
    one-process one: the norm gains, which each rank sees only its rows of, included."""
    result = two[name]
    differences = result["grad_differences"]
    assert result["norms"] and set(result["norms"]) <= set(differences)
    worst = max(differences.items(), key=lambda kv: kv[1])
    assert worst[1] < 1e-6, worst


@pytest.mark.parametrize("name", MODULE_SPECS)
def test_norm_gains_are_replicated_and_reduced(two: dict[str, dict[str, Any]],
                                               name: str) -> None:
    """PyTorch's SequenceParallel makes the gains replicated DTensors; their Partial
    gradients are all-reduced to Replicate (parallelize's gradient hook)."""
    assert two[name]["norm_grad_placements"] == ["(Replicate(),)"]


@pytest.mark.parametrize("name", MODULE_SPECS)
def test_the_stream_between_sublayers_is_sequence_sharded(two: dict[str, dict[str, Any]],
                                                          name: str) -> None:
    """The first layer receives and returns (batch, seq / tp, d): each rank's rows."""
    d = tfgraph.load_spec(ROOT / SPECS[name]).d_model
    assert two[name]["layer_shapes"] == [[2, SEQ // 2, d], [2, SEQ // 2, d]]


def test_an_encoder_decoders_shared_tied_table_is_split_by_vocabulary(
        two: dict[str, dict[str, Any]]) -> None:
    """tiny-bart under tensor parallelism alone: one token table read by the encoder's and
    the decoder's embeddings and by the tied head, split by vocabulary for all three (the
    head over the embedding's own rows, _TiedHead): the one-process losses, outputs and
    gradients (the table's summed from its three readers)."""
    result = two["bart tp"]
    assert _close(result["losses"]["parallel"], result["losses"]["single"]), result["losses"]
    assert result["inference_difference"] < 1e-5
    worst = max(result["grad_differences"].items(), key=lambda kv: kv[1])
    assert worst[1] < 1e-6, worst
    graph = tfgraph.compile(tfgraph.load_spec(ROOT / SPECS["bart"]))
    assert {n.inputs[0] for n in graph.ops() if n.op == "embedding"} == {"embed.tokens.weight"}
    assert tp_plan(graph)["embed.tokens.weight"].style == "vocab"


def test_a_head_transform_beside_a_split_bias_stays_a_plain_replicated_linear(
        two: dict[str, dict[str, Any]]) -> None:
    """tiny-bert (its dropout off) under tensor parallelism alone: the head module owns the tied projection's
    bias (split by vocabulary) and, as submodules, the transform's linear and LayerNorm,
    which stay whole on every rank as plain parameters (splitting the bias once made them
    replicated DTensors that the transform's linear could not mix with its input): the
    one-process losses, outputs and gradients."""
    result = two["bert tp"]
    assert _close(result["losses"]["parallel"], result["losses"]["single"]), result["losses"]
    assert result["inference_difference"] < 1e-5
    worst = max(result["grad_differences"].items(), key=lambda kv: kv[1])
    assert worst[1] < 1e-6, worst
    assert {"head.transform.weight", "head.bias"} <= set(result["grad_differences"])


def test_per_head_norms_get_whole_gradients_under_tensor_parallelism_alone(
        two: dict[str, dict[str, Any]]) -> None:
    """Qwen3's query/key norms act on each rank's heads: their gains' gradients are summed
    over the ranks (they were each rank's share before sp was added)."""
    result = two["qwen3 tp"]
    assert _close(result["losses"]["parallel"], result["losses"]["single"])
    assert max(result["grad_differences"].values()) < 1e-6
    assert result["layer_shapes"][0] == [2, SEQ, 48]  # no sp: whole rows


def test_a_sequence_length_tp_does_not_divide_is_refused(
        two: dict[str, dict[str, Any]]) -> None:
    assert two["odd length"] == {"error": "sequence parallelism: tp 2 does not divide the "
                                          "sequence length 15"}


def test_fsdp_with_tensor_and_sequence_parallelism(four: dict[str, dict[str, Any]]) -> None:
    result = four["llama"]
    assert _close(result["losses"]["parallel"], result["losses"]["single"])
    assert max(result["grad_differences"].values()) < 1e-6
    assert result["norm_grad_placements"] == ["(Shard(dim=0), Replicate())"]
    assert result["layer_shapes"] == [[2, SEQ // 2, 64], [2, SEQ // 2, 64]]


# ---- the example: losses and per-rank bytes against tfgraph plan --sp -----------------------

def _plan_memory(name: str, tp: int, dp: int) -> dict[str, int]:
    """``tfgraph plan --sp``'s per-rank memory of the example's layout: float32, micro-batch
    = the batch over the data-parallel ranks, seq 16, fused attention (the module's SDPA)."""
    from tfgraph.parallel.gpus import gpu
    from tfgraph.parallel.layout import Layout
    from tfgraph.parallel.planner import plan

    spec = tfgraph.load_spec(ROOT / SPECS[name]).model_copy(update={"dtype": "float32"})
    graph = tfgraph.compile(spec, loss=True)
    layout = Layout(tp=tp, dp=dp, zero=3 if dp > 1 else 0, sp=True, dtype="float32", seq=SEQ,
                    micro_batch=BATCH // dp, global_batch=BATCH)
    memory: dict[str, int] = plan(graph, layout, gpu("h100"), "fused")["per_rank"]["memory"]
    return memory


@pytest.mark.parametrize("name", EXAMPLE_SPECS)
def test_the_example_trains_to_the_one_process_losses(two: dict[str, dict[str, Any]],
                                                      single: dict[str, list[float]],
                                                      name: str) -> None:
    result = two[f"example {name}"]
    assert result["sp"] is True
    assert _close(result["losses"], single[name]), (result["losses"], single[name])


def test_resume_from_a_sharded_checkpoint_equals_running_straight_through(
        two: dict[str, dict[str, Any]]) -> None:
    """The replicated DTensor norm gains save and load with the rest (DCP)."""
    assert two["resume"]["start_step"] == 2
    assert _close(two["save"]["losses"] + two["resume"]["losses"],
                  two["example llama"]["losses"])


def test_the_example_under_fsdp_and_tp_trains_to_the_one_process_losses(
        four: dict[str, dict[str, Any]], single: dict[str, list[float]]) -> None:
    assert _close(four["example llama"]["losses"], single["llama"])


@pytest.mark.parametrize("name, procs", [("llama", 2), ("opt", 2), ("llama", 4)])
def test_measured_state_bytes_are_the_plan_with_sp(two: dict[str, dict[str, Any]],
                                                   four: dict[str, dict[str, Any]], name: str,
                                                   procs: int) -> None:
    """Weights, gradients and Adam's state the most loaded rank holds after real steps are
    ``tfgraph plan --sp``'s exactly (sequence parallelism moves no parameter)."""
    per_rank = (two if procs == 2 else four)[f"example {name}"]["per_rank"]
    memory = _plan_memory(name, 2, procs // 2)
    assert memory["weights"] == max(r["weights"] for r in per_rank)
    assert memory["gradients"] == max(r["gradients"] for r in per_rank)
    assert memory["optimizer"] == max(r["optimizer"] + r["optimizer_step_counters"]
                                      for r in per_rank)


def _rotary_tables(name: str) -> int:
    """Bytes a rank keeps under sequence parallelism that ``tfgraph plan --sp`` does not count:
    the rotary cos and sin tables, (seq, rotary dims) float32 each, built once per forward for
    the whole sequence; not in the plan with or without sp (test_distributed). Everything else
    the plan counts as the module keeps it (``tfgraph.parallel.sequence_plan``, the rule both
    follow): the stream, the norms' inputs and statistics and the projections' all-gathered
    inputs as the rank's rows; whole on every rank the token ids, the labels, the loss's 0-d
    total weight and a router's scores and the routed experts' tokens, outputs and indices
    (tiny-moe: they read the gathered sequence). A tied head is split by vocabulary as an
    untied one (tiny-opt, tiny-encoder): its logits and the loss's log-probabilities are 1/t
    per rank."""
    spec = tfgraph.load_spec(ROOT / SPECS[name])
    return 2 * SEQ * spec.rotary_dim * 4 if spec.embedding.positions == "rope" else 0


@pytest.mark.parametrize("name, procs", [(name, procs) for procs, names in
                                         MEASURED_SPECS.items() for name in names])
def test_saved_activations_are_the_plan_with_sp(two: dict[str, dict[str, Any]],
                                                four: dict[str, dict[str, Any]], name: str,
                                                procs: int) -> None:
    """What autograd saves on each rank in the first step (the example's --measure-saved,
    tp 2; on 4 processes with FSDP2 over 2 data-parallel ranks) is the plan's per-rank
    activations under --sp within 5%, and exactly once the rotary tables are added."""
    planned = _plan_memory(name, 2, procs // 2)["activations"]
    for rank, held in enumerate((two if procs == 2 else four)[f"example {name}"]["per_rank"]):
        saved = held["saved_activations"]
        assert abs(saved - planned) <= 0.05 * planned, (rank, saved, planned)
        assert saved == planned + _rotary_tables(name), (rank, saved, planned)


# ---- what is refused ------------------------------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["--spec", "specs/tiny-llama.yaml", "--strategy", "fsdp", "--sp"],
     "--sp splits what tensor parallelism leaves whole"),
    (["--spec", "specs/tiny-llama.yaml", "--strategy", "tp", "--tp", "2", "--sp", "--seq",
      "15"], "--sp: --tp 2 does not divide --seq 15"),
])
def test_bad_sp_arguments_exit_2_with_one_line(argv: list[str], says: str) -> None:
    done = run_example(argv)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_sp_needs_tensor_parallelism() -> None:
    from tfgraph.exporters import parallelize, to_torch

    graph = tfgraph.compile(tfgraph.load_spec(ROOT / SPECS["llama"]))
    with pytest.raises(TfgraphError, match="it needs tp > 1"):
        parallelize(to_torch(graph, device="meta"), None, tp=1, sp=True)  # type: ignore


def test_cached_graphs_are_refused() -> None:
    from tfgraph.exporters.torch.sequence_parallel import sequence_parallel_plan

    graph = tfgraph.compile(tfgraph.load_spec(ROOT / SPECS["llama"]), cache=True)
    with pytest.raises(TfgraphError, match="full-sequence graphs .training.; this graph "
                                           "takes attention_mask"):
        sequence_parallel_plan(graph)


# ---- the plan of what is sharded (no process group) -----------------------------------------

def test_the_plan_of_a_pre_norm_decoder() -> None:
    """tiny-llama: the stream, the norms and the residual adds are sequence shards; q, k, v,
    gate, up and the vocabulary-split head read them all-gathered; o and down reduce-scatter;
    attention, rotary and the SwiGLU product run on whole sequences (split by heads or
    hidden units) and are left as tensor parallelism has them."""
    from tfgraph.exporters.torch.sequence_parallel import sequence_parallel_plan

    plan = sequence_parallel_plan(tfgraph.compile(tfgraph.load_spec(ROOT / SPECS["llama"])))
    layer = "decoder.layers.0"
    assert plan.kind["decoder.embed.tokens"] == "embedding"
    assert {plan.kind[f"{layer}.{n}"] for n in ("self_attn.norm", "ffn.norm")} == {"norm"}
    assert {plan.kind[f"{layer}.self_attn.{p}"] for p in "qkv"} == {"colwise"}
    assert {plan.kind[f"{layer}.ffn.{p}"] for p in ("gate", "up")} == {"colwise"}
    assert {plan.kind[f"{layer}.{p}"] for p in ("self_attn.o", "ffn.down")} == {"rowwise"}
    assert plan.kind[f"{layer}.self_attn.residual"] == "elementwise"
    assert plan.kind["decoder.norm"] == "norm" and plan.kind["logits"] == "colwise"
    for whole in ("self_attn.q_rope", "self_attn.attention", "ffn.act", "ffn.gated"):
        assert f"{layer}.{whole}" not in plan.kind
        assert f"{layer}.{whole}" not in plan.sharded
    assert f"{layer}.ffn.residual" in plan.sharded and "logits" not in plan.sharded


def test_the_plan_of_learned_positions_and_a_tied_head() -> None:
    """tiny-opt: positions are added to the rank's rows; the tied head, split by vocabulary
    over the table's rows, reads the final norm all-gathered once as a column-parallel
    projection does."""
    from tfgraph.exporters.torch.sequence_parallel import sequence_parallel_plan

    plan = sequence_parallel_plan(tfgraph.compile(tfgraph.load_spec(ROOT / SPECS["opt"])))
    assert plan.kind["decoder.embed.positions"] == "positions"
    assert "decoder.embed.positions" in plan.sharded
    assert plan.kind["logits"] == "colwise"
