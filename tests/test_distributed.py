"""examples/train_distributed.py under torchrun (2 and 4 CPU processes, gloo): DDP, FSDP2,
tensor parallelism and FSDP2 + TP train to the one-process losses (same data, same seed),
resume from a sharded checkpoint to the straight-through losses, and hold per rank exactly
the bytes ``tfgraph.parallel.tp_plan`` says (parameters, gradients, Adam's moments). The bytes
autograd saves for backward on a rank in the first step (``--measure-saved``) are
``tfgraph plan``'s per-rank activations (within 5%; exact but for the rotary tables).

Specs: tiny-llama (dense, GQA: 4 query / 2 key-value heads, SwiGLU), tiny-moe (8 stacked
experts split on their hidden units) and tiny-encoder (post-norm, no dropout, biases, a tied
token table with the head's bias, both split by vocabulary as Megatron splits them; its
model.py too). Each torchrun launch runs several trainings
(tests/distributed_worker.py): a launch costs seconds on two cores.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from distributed_support import load_example, run_example, torchrun

import tfgraph
from tfgraph.parallel.tp_plan import tp_plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_distributed.py"
WORKER = ROOT / "tests" / "distributed_worker.py"
STEPS, SAVE_AT = 4, 2
SPECS = {"llama": "specs/tiny-llama.yaml", "moe": "specs/tiny-moe.yaml",
         "encoder": "specs/tiny-encoder.yaml"}


def _args(spec: str, strategy: str, *extra: str) -> list[str]:
    return ["--spec", str(ROOT / SPECS[spec]), "--strategy", strategy, "--steps", str(STEPS),
            "--batch", "4", "--seq", "16", *extra]


def _torchrun(procs: int, runs: list[list[str]], out: Path) -> list[dict[str, Any]]:
    """Every run of ``runs`` in one torchrun launch of ``procs`` CPU processes."""
    torchrun(procs, WORKER, runs, out, timeout=300)
    results: list[dict[str, Any]] = json.loads(out.read_text())
    return results


@pytest.fixture(scope="module")
def single() -> dict[str, list[float]]:
    """The one-process losses (no process group) of every spec."""
    example = load_example()
    return {name: example.train(example.parse_args(_args(name, "none")))["losses"]
            for name in SPECS}


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One launch of 2 processes: ddp, fsdp and tp on every spec, and a checkpoint saved at
    step SAVE_AT (fsdp, tp) then resumed to STEPS."""
    tmp = tmp_path_factory.mktemp("two")
    runs: dict[str, list[str]] = {}
    for name in SPECS:
        for strategy in ("ddp", "fsdp", "tp"):
            runs[f"{name} {strategy}"] = _args(name, strategy, "--measure-saved")
    for strategy in ("fsdp", "tp"):
        ckpt = str(tmp / f"ckpt-{strategy}")
        runs[f"save {strategy}"] = [*_args("llama", strategy), "--steps", str(SAVE_AT),
                                    "--save", ckpt]  # the last --steps counts
        runs[f"resume {strategy}"] = [*_args("llama", strategy), "--resume", ckpt]
    folder = tmp / "standalone"  # model.py (seed 0: the weights to_torch(graph, seed=0) has)
    subprocess.run([sys.executable, "-m", "tfgraph", "build", str(ROOT / SPECS["llama"]),
                    "--to", "torch", "-o", str(folder)], check=True, capture_output=True)
    runs["standalone tp"] = [*_args("llama", "tp"), "--spec", str(folder)]
    runs["standalone fsdp"] = [*_args("llama", "fsdp"), "--spec", str(folder)]
    tied = tmp / "standalone-tied"  # model.py of a tied table (and head bias): tied_head
    subprocess.run([sys.executable, "-m", "tfgraph", "build", str(ROOT / SPECS["encoder"]),
                    "--to", "torch", "-o", str(tied)], check=True, capture_output=True)
    runs["standalone tied tp"] = [*_args("encoder", "tp"), "--spec", str(tied)]
    results = _torchrun(2, list(runs.values()), tmp / "results.json")
    return dict(zip(runs, results))


def _foreach_per_mesh(result: dict[str, Any]) -> None:
    """AdamW steps by foreach kernels, one parameter group per device mesh: the per-tensor loop
    dispatched a dozen DTensor operations per parameter (an H100 FSDP2 step at 1.9x the plan's
    time), and one foreach kernel cannot mix meshes or DTensors with plain tensors."""
    groups = result["optimizer_groups"]
    assert all(group["foreach"] for group in groups), groups
    meshes = [group["mesh"] for group in groups]
    assert len(set(meshes)) == len(meshes), groups  # one group per mesh
    if result["strategy"] == "fsdp":  # every parameter a DTensor on the data-parallel mesh
        assert len(groups) == 1 and meshes[0] is not None, groups


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)
                                         for a, b in zip(got, want))


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp"])
def test_two_processes_train_to_the_single_process_losses(
        two: dict[str, dict[str, Any]], single: dict[str, list[float]], name: str,
        strategy: str) -> None:
    got = two[f"{name} {strategy}"]["losses"]
    assert _close(got, single[name]), (got, single[name])
    _foreach_per_mesh(two[f"{name} {strategy}"])


@pytest.mark.parametrize("strategy", ["tp", "fsdp"])
def test_the_standalone_model_py_trains_under_its_own_plan(
        two: dict[str, dict[str, Any]], single: dict[str, list[float]], strategy: str) -> None:
    got = two[f"standalone {strategy}"]["losses"]
    assert _close(got, single["llama"]), (got, single["llama"])
    if strategy == "fsdp":  # model.py's parameters, as tp_plan and FSDP2 split them
        for rank, held in enumerate(two["standalone fsdp"]["per_rank"]):
            assert held["weights"] == _planned("llama", 1, 2, rank)


def test_the_standalone_model_py_splits_a_tied_table_by_vocabulary(
        two: dict[str, dict[str, Any]], single: dict[str, list[float]]) -> None:
    """model.py of tiny-encoder (a tied table with the head's bias) under tp 2: the table and
    the bias are split by vocabulary rows (its tied_head reads the embedding's split rows),
    as tp_plan and ``parallelize`` split them, and it trains to the one-process losses."""
    result = two["standalone tied tp"]
    assert _close(result["losses"], single["encoder"]), (result["losses"], single["encoder"])
    for rank, held in enumerate(result["per_rank"]):
        assert held["weights"] == held["gradients"] == _planned("encoder", 2, 1, rank)
    assert tp_plan(tfgraph.compile(tfgraph.load_spec(ROOT / SPECS["encoder"])))[
        "embed.tokens.weight"].style == "vocab"


def test_the_synthetic_data_is_learnable(single: dict[str, list[float]]) -> None:
    assert single["llama"][-1] < single["llama"][0]


@pytest.mark.parametrize("strategy", ["fsdp", "tp"])
def test_resume_from_a_sharded_checkpoint_equals_running_straight_through(
        two: dict[str, dict[str, Any]], strategy: str) -> None:
    saved, resumed = two[f"save {strategy}"], two[f"resume {strategy}"]
    straight = two[f"llama {strategy}"]["losses"]
    assert resumed["start_step"] == SAVE_AT
    assert _close(saved["losses"] + resumed["losses"], straight)


def _planned(spec: str, tp: int, dp: int, rank: int) -> int:
    """Parameter bytes rank ``rank`` holds per tp_plan: each parameter cut on its tp_dim over
    tp ranks, then (FSDP) dim 0 in torch.chunk pieces over the dp ranks."""
    graph = tfgraph.compile(tfgraph.load_spec(ROOT / SPECS[spec]))
    dp_rank = rank // tp  # the mesh is (dp, tp), tp innermost
    total = 0
    for name, shard in tp_plan(graph).items():
        shape = list(graph.node(name).attrs["shape"])
        if tp > 1 and shard.tp_dim is not None:
            shape[shard.tp_dim] //= tp
        if dp > 1:
            chunk = -(-shape[0] // dp)
            shape[0] = max(0, min(chunk, shape[0] - chunk * dp_rank))
        total += math.prod(shape) * 4  # float32
    return total


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp"])
def test_measured_bytes_per_rank_are_the_plan(two: dict[str, dict[str, Any]], name: str,
                                              strategy: str) -> None:
    per_rank = two[f"{name} {strategy}"]["per_rank"]
    tp, dp = (2, 1) if strategy == "tp" else (1, 2 if strategy == "fsdp" else 1)
    for rank, held in enumerate(per_rank):
        weights = _planned(name, tp, dp, rank)
        assert held["weights"] == weights
        assert held["gradients"] == weights
        assert held["optimizer"] == 2 * weights  # Adam's two moments, float32


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """One launch of 4 processes: fsdp+tp (dp 2 x tp 2) on every spec."""
    runs = [_args(name, "fsdp+tp", "--tp", "2", "--measure-saved") for name in SPECS]
    results = _torchrun(4, runs, tmp_path_factory.mktemp("four") / "results.json")
    return dict(zip(SPECS, results))


def test_four_processes_fsdp_and_tensor_parallel(four: dict[str, dict[str, Any]],
                                                 single: dict[str, list[float]]) -> None:
    for name, result in four.items():
        assert _close(result["losses"], single[name]), (name, result["losses"])
        _foreach_per_mesh(result)
        for rank, held in enumerate(result["per_rank"]):
            assert held["weights"] == _planned(name, 2, 2, rank)
            assert held["optimizer"] == 2 * held["weights"]


def test_a_missing_rank_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 of 2 whose peer never comes: the group's start fails after --timeout (gloo's
    default would wait 30 minutes; a hung rank under torchrun hung CI for 12)."""
    import socket
    import time

    import torch.distributed as dist

    with socket.socket() as sock:  # a port nobody listens on: no rank 1 will ever come
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    example = load_example()
    assert example.parse_args(["--spec", "x"]).timeout == 300  # the default bound
    start = time.monotonic()
    with pytest.raises(dist.DistError):
        example.start_group(1.0)
    assert time.monotonic() - start < 30
    assert not dist.is_initialized()


def test_a_group_outside_torchrun_takes_a_free_port(monkeypatch: pytest.MonkeyPatch) -> None:
    """--strategy ddp etc. without torchrun: a group of one on a port the system picks (no
    MASTER_PORT needed, none that another job holds)."""
    import torch.distributed as dist

    monkeypatch.delenv("MASTER_PORT", raising=False)
    example = load_example()
    example.start_group(30.0)
    try:
        assert dist.get_world_size() == 1 and dist.get_rank() == 0
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("argv, says", [
    (["--spec", "specs/tiny-falcon.yaml", "--strategy", "tp", "--tp", "2"],
     "--tp 2 does not divide the 1 heads"),
    (["--spec", "specs/tiny-llama.yaml", "--strategy", "tp", "--tp", "3"], "--tp 3"),
    (["--spec", "specs/tiny-llama.yaml", "--strategy", "ddp", "--param-dtype", "bfloat16"],
     "--param-dtype is FSDP2's mixed precision"),
    (["--spec", "specs/tiny-llama.yaml", "--warmup", "-1"], "--warmup must be 0 or more"),
])
def test_bad_arguments_exit_2_with_one_line(argv: list[str], says: str) -> None:
    done = run_example(argv)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr


@pytest.mark.parametrize("argv, says", [
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--resume", "/nonexistent-checkpoint"],
     "--resume /nonexistent-checkpoint: no such folder"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--resume", str(ROOT / "specs")],
     f"--resume {ROOT / 'specs'}: not a checkpoint written by --save"),
    (["--spec", "specs/tiny-opt.yaml", "--steps", "1", "--batch", "2", "--seq", "200"],
     "--seq 200: longer than tiny-opt's max_len 40"),
    (["--spec", "specs/tiny-llama.yaml", "--strategy", "none", "--tp", "2"],
     "--tp 2 is the tensor-parallel degree: it needs --strategy tp or fsdp+tp"),
    (["--spec", "specs/tiny-llama.yaml", "--strategy", "fsdp", "--tp", "2"],
     "--strategy fsdp does not split tensors"),
    (["--spec", "specs/tiny-llama.yaml", "--strategy", "tp", "--tp", "0"],
     "--tp must be 1 or more"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--lr", "-1"],
     "--lr must be a finite number > 0, got -1"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--lr", "nan"], "--lr must be a finite"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--weight-decay", "-1"],
     "--weight-decay must be a finite number >= 0"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--strategy", "ddp", "--timeout", "nan"],
     "--timeout must be a finite number > 0"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--strategy", "ddp", "--timeout", "0"],
     "--timeout must be a finite number > 0"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--seed", "-1"], "--seed must be 0 or more"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--seed", "99999999999999999999"],
     "--seed must be 0 or more and at most 4294967295, got 99999999999999999999"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--batch", "100000000"],
     "--batch 100000000 x --seq 16: needs about"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--seq", "100000000"],
     "--batch 4 x --seq 100000000: needs about"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--batch", "99999999999"],
     "--batch 99999999999: at most 1,073,741,824"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--json-out", str(ROOT / "specs")],
     "is a directory"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--json-out", "/nonexistent-dir/x.json"],
     "does not exist"),
    (["--spec", "specs/tiny-llama.yaml", "--quick", "--save", "/proc/tfgraph-nope"],
     "cannot write"),
])
def test_checked_before_training_one_line_exit_2(argv: list[str], says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """What the example checks up front (before any process group or step), through its
    main in this process (a subprocess per case would cost seconds each)."""
    example = load_example()
    assert example.main([*argv[:1], str(ROOT / argv[1]), *argv[2:]]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines


def test_tp_alone_over_more_processes_than_tp_is_refused(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--strategy tp with world / tp > 1 would train replicas no collective averages (each
    rank its own copy, the printed loss their mean): refused before any group starts."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    example = load_example()
    assert example.main(["--spec", str(ROOT / "specs" / "tiny-llama.yaml"), "--quick",
                         "--strategy", "tp", "--tp", "1"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "2 data-parallel replicas" in lines[0] \
        and "fsdp+tp" in lines[0], lines


def test_explicit_flags_win_over_quick() -> None:
    """--quick sets the defaults of --steps, --batch and --seq (3, 4, 16); a flag given
    explicitly keeps its value, as in the other examples."""
    example = load_example()
    args = example.parse_args(["--spec", "x", "--quick", "--steps", "5", "--seq", "8"])
    assert (args.steps, args.batch, args.seq) == (5, 4, 8)
    full = example.parse_args(["--spec", "x", "--batch", "2"])
    assert (full.steps, full.batch, full.seq) == (20, 2, 32)


def test_resuming_at_or_past_steps_runs_nothing_and_keeps_the_step(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One process: a checkpoint saved at step 2, resumed with --steps 1 and saved again,
    runs no step, says so in one stderr line and saves step 2 (the step reached), not 1;
    resumed with --steps 3, it runs step 2 only and saves step 3."""
    example = load_example()
    first, again, on = (str(tmp_path / name) for name in ("first", "again", "on"))
    base = ["--spec", str(ROOT / SPECS["llama"]), "--strategy", "none", "--batch", "2",
            "--seq", "8"]
    example.train(example.parse_args([*base, "--steps", "2", "--save", first]))
    capsys.readouterr()
    result = example.train(example.parse_args([*base, "--steps", "1", "--resume", first,
                                               "--save", again]))
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note")]
    assert notes == [f"note: --resume {first} is at step 2, already at or past --steps 1: "
                     "no step to run"]
    assert result["start_step"] == 2 and result["losses"] == []
    assert json.loads(Path(again, "train_state.json").read_text()) == {"step": 2}
    result = example.train(example.parse_args([*base, "--steps", "3", "--resume", again,
                                               "--save", on]))
    assert result["start_step"] == 2 and len(result["losses"]) == 1
    assert json.loads(Path(on, "train_state.json").read_text()) == {"step": 3}


LAYOUTS = {"ddp": (1, 2, 0), "fsdp": (1, 2, 3), "tp": (2, 1, 0), "fsdp+tp": (2, 2, 3)}
"""(tp, dp, ZeRO stage) of each strategy: DDP replicates, FSDP2 shards weights too (ZeRO-3)."""


def _plan_memory(name: str, strategy: str) -> dict[str, int]:
    """``tfgraph plan``'s per-rank memory of the runs' layout: float32, micro-batch = the
    batch of 4 over the data-parallel ranks, seq 16, no recompute, fused attention (the
    module's SDPA)."""
    from tfgraph.parallel.gpus import gpu
    from tfgraph.parallel.layout import Layout
    from tfgraph.parallel.planner import plan

    spec = tfgraph.load_spec(ROOT / SPECS[name]).model_copy(update={"dtype": "float32"})
    graph = tfgraph.compile(spec, loss=True)
    tp, dp, zero = LAYOUTS[strategy]
    layout = Layout(tp=tp, dp=dp, zero=zero, dtype="float32", seq=16, micro_batch=4 // dp,
                    global_batch=4)
    memory: dict[str, int] = plan(graph, layout, gpu("h100"), "fused")["per_rank"]["memory"]
    return memory


def _rotary_tables(name: str) -> int:
    """Bytes of the rotary cos and sin tables, (seq, rotary dims) each, float32: computed
    once per forward and saved by every layer's rope; the op table leaves them out (ops.py,
    rope), as the single-process comparison (test_train_memory.uncounted) states."""
    spec = tfgraph.load_spec(ROOT / SPECS[name])
    return 2 * 16 * spec.rotary_dim * 4 if spec.embedding.positions == "rope" else 0


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("strategy", list(LAYOUTS))
def test_saved_activations_on_a_rank_are_the_plan(two: dict[str, dict[str, Any]],
                                                  four: dict[str, dict[str, Any]], name: str,
                                                  strategy: str) -> None:
    """What autograd saves for backward on each rank in the first step's forward and loss
    (saved_tensors_hooks; parameters, FSDP2's gathered ones included, left out; DTensors
    by their local tensors) is the plan's per-rank activations: within 5%, and exactly once
    the rotary tables are added. Under tensor parallelism the loss runs vocabulary-split
    (loss_parallel), as the plan has it, and the experts keep their routed tokens whole."""
    result = four[name] if strategy == "fsdp+tp" else two[f"{name} {strategy}"]
    planned = _plan_memory(name, strategy)["activations"]
    for rank, held in enumerate(result["per_rank"]):
        saved = held["saved_activations"]
        assert abs(saved - planned) <= 0.05 * planned, (rank, saved, planned)
        assert saved == planned + _rotary_tables(name), (rank, saved, planned)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "tp"])
def test_the_planner_predicts_the_measured_bytes(two: dict[str, dict[str, Any]], name: str,
                                                 strategy: str) -> None:
    """``tfgraph plan``'s per-rank weights, gradients and optimizer bytes (the most loaded
    rank) are exactly what the most loaded rank holds after real steps (float32 training:
    Adam's two moments and a 0-d step counter per parameter tensor)."""
    memory = _plan_memory(name, strategy)
    per_rank = two[f"{name} {strategy}"]["per_rank"]
    assert memory["weights"] == max(r["weights"] for r in per_rank)
    assert memory["gradients"] == max(r["gradients"] for r in per_rank)
    assert memory["optimizer"] == max(r["optimizer"] + r["optimizer_step_counters"]
                                      for r in per_rank)


def test_fsdp_mixed_precision_and_the_median_step_time(
        tmp_path: Path, single: dict[str, list[float]]) -> None:
    """``--param-dtype bfloat16`` (FSDP2's MixedPrecisionPolicy; a group of one process):
    the same model in 16-bit compute (losses within bfloat16's precision of the float32 run's,
    not equal to them), the sharded parameters still the float32 masters; each step's time
    recorded and rank 0 printing the median of those after ``--warmup``."""
    import statistics

    out = tmp_path / "result.json"
    done = run_example([*_args("llama", "fsdp"), "--param-dtype", "bfloat16", "--warmup", "1",
                        "--json-out", str(out)])
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    got, want = result["losses"], single["llama"]
    assert got != want and all(math.isclose(a, b, rel_tol=2e-2) for a, b in zip(got, want))
    assert result["per_rank"][0]["weights"] == _planned("llama", 1, 1, 0)  # float32 masters
    times = result["step_seconds"]
    assert len(times) == STEPS and all(t > 0 for t in times)
    assert result["median_step_s"] == statistics.median(times[1:])
    assert f"step time: median {result['median_step_s'] * 1e3:.2f} ms over {STEPS - 1} steps " \
           "(the first 1 left out as warm-up)" in done.stdout


def _dropout_base() -> list[str]:
    """tiny-decoder: dropout 0.1 after the embeddings and every sublayer."""
    assert tfgraph.load_spec(ROOT / "specs" / "tiny-decoder.yaml").dropout > 0
    return ["--spec", str(ROOT / "specs" / "tiny-decoder.yaml"), "--strategy", "none",
            "--batch", "2", "--seq", "8"]


def test_dropout_runs_repeat_and_resume_continues_bit_for_bit(tmp_path: Path) -> None:
    """--seed seeds the dropout masks too, per step: two runs give the same losses, and a
    run saved at step 2 and resumed to 4 gives the straight run's, bit for bit; another
    seed draws other masks from the same data and weights."""
    example = load_example()
    base, ckpt = _dropout_base(), str(tmp_path / "ckpt")
    straight = example.train(example.parse_args([*base, "--steps", "4"]))["losses"]
    assert example.train(example.parse_args([*base, "--steps", "4"]))["losses"] == straight
    saved = example.train(example.parse_args([*base, "--steps", "2", "--save", ckpt]))
    resumed = example.train(example.parse_args([*base, "--steps", "4", "--resume", ckpt]))
    assert saved["losses"] + resumed["losses"] == straight
    example.seed_dropout(0, 0, 0)
    a = torch.nn.functional.dropout(torch.ones(64), 0.5)
    example.seed_dropout(0, 0, 1)  # another data-parallel rank: its own masks
    assert not torch.equal(a, torch.nn.functional.dropout(torch.ones(64), 0.5))


def test_a_step_0_checkpoint_resumes_as_the_straight_run(tmp_path: Path) -> None:
    """Saved before any step, the optimizer's state was made by get_state_dict's lr-0 step,
    which counts Adam's step as 1: the resumed run's bias correction was one step ahead and its
    losses differed from the straight run's from the second step on."""
    example = load_example()
    base, ckpt = _dropout_base(), str(tmp_path / "ckpt")
    straight = example.train(example.parse_args([*base, "--steps", "3"]))["losses"]
    example.train(example.parse_args([*base, "--steps", "0", "--save", ckpt]))
    resumed = example.train(example.parse_args([*base, "--steps", "3", "--resume", ckpt]))
    assert resumed["losses"] == straight


def test_a_deeper_models_checkpoint_is_refused(tmp_path: Path) -> None:
    """DCP's planner refuses only entries the model needs and the checkpoint lacks: a 2-layer
    run's checkpoint loaded into a 1-layer spec, its second layer dropped without a word."""
    text = (ROOT / "specs" / "tiny-llama.yaml").read_text()
    assert "\nlayers: 2\n" in text
    shallow = tmp_path / "shallow.yaml"
    shallow.write_text(text.replace("\nlayers: 2\n", "\nlayers: 1\n"))
    ckpt = str(tmp_path / "ckpt")
    base = ["--strategy", "none", "--batch", "2", "--seq", "8"]
    done = run_example(["--spec", str(ROOT / "specs" / "tiny-llama.yaml"), *base, "--steps",
                        "1", "--save", ckpt])
    assert done.returncode == 0, done.stderr
    done = run_example(["--spec", str(shallow), *base, "--steps", "2", "--resume", ckpt])
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: --resume {ckpt}: does not load into this model") and \
        "model.decoder.layers.1." in lines[0], lines


def test_resume_applies_the_given_lr_and_weight_decay(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    """--lr and --weight-decay given with --resume replace the checkpoint's (a note: line
    each when they differ); not given, the checkpoint's stand."""
    example = load_example()
    base, ckpt = _dropout_base(), str(tmp_path / "ckpt")
    example.train(example.parse_args([*base, "--steps", "1", "--lr", "1e-3",
                                      "--weight-decay", "0.1", "--save", ckpt]))
    capsys.readouterr()
    kept = example.train(example.parse_args([*base, "--steps", "2", "--resume", ckpt]))
    assert (kept["lr"], kept["weight_decay"]) == (1e-3, 0.1)
    assert "note:" not in capsys.readouterr().err
    given = example.train(example.parse_args([*base, "--steps", "2", "--resume", ckpt,
                                              "--lr", "5e-4", "--weight-decay", "0.1"]))
    assert (given["lr"], given["weight_decay"]) == (5e-4, 0.1)
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note")]
    assert notes == [f"note: --lr 0.0005 replaces the checkpoint's 0.001 (--resume {ckpt})"]


def test_a_checkpoint_of_another_spec_is_one_line(tmp_path: Path) -> None:
    """No torch warning around saving and loading in one process (DCP's 'assuming the
    intent is to ... in a single process'): nothing on stderr, or the error line alone."""
    ckpt = str(tmp_path / "ckpt")
    base = ["--strategy", "none", "--batch", "2", "--seq", "8"]
    done = run_example(["--spec", str(ROOT / SPECS["llama"]), *base, "--steps", "1",
                        "--save", ckpt])
    assert done.returncode == 0 and done.stderr == "", done.stderr
    done = run_example(["--spec", str(ROOT / "specs" / "tiny-decoder.yaml"), *base,
                        "--steps", "2", "--resume", ckpt])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: --resume {ckpt}: does not load"), \
        lines
