"""Expert parallelism (``parallelize(..., ep=N)``, exporters/torch/expert_parallel.py) under
torchrun with 2 and 4 CPU processes (gloo) on tiny-moe (8 SwiGLU experts, top-2):

- training with ``--strategy fsdp --ep N`` gives the one-process losses (same global batch,
  each rank its rows), and resumes from a sharded checkpoint to the straight-through losses;
- after one backward, each rank's expert-weight gradients are the one-process gradients of
  the experts it holds, and it holds 1/ep of the experts' bytes;
- the per-rank weights, gradients and optimizer bytes are ``tfgraph plan``'s for the same
  layout (ZeRO 3, dp, ep);
- the all-to-all bytes counted in the dispatch are exactly those the one-process routing
  implies, and are compared with the planner's ``step.comm_bytes.ep`` (ratio printed: the
  planner assumes uniform routing, (ep - 1) / ep of each rank's token-expert pairs sent
  away);
- what is not supported is refused with one line.

Each torchrun launch runs several jobs (tests/expert_parallel_worker.py).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from distributed_support import load_example, torchrun
import torch
import torch.nn.functional as F

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch.ops import TORCH_OPS
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.planner import plan

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_distributed.py"
WORKER = ROOT / "tests" / "expert_parallel_worker.py"
MOE, DENSE = "specs/tiny-moe.yaml", "specs/tiny-llama.yaml"
STEPS, SAVE_AT, BATCH, SEQ, SEED = 5, 2, 4, 16, 0
EXPERTS, TOP_K, D = 8, 2, 32  # tiny-moe


def _args(*extra: str) -> list[str]:
    return ["--spec", str(ROOT / MOE), "--steps", str(STEPS), "--batch", str(BATCH),
            "--seq", str(SEQ), *extra]


def _torchrun(procs: int, jobs: list[dict[str, Any]], out: Path) -> list[list[Any]]:
    """Every job in one launch of ``procs`` CPU processes; per job, every rank's result."""
    torchrun(procs, WORKER, jobs, out, timeout=600)
    results: list[list[Any]] = torch.load(out, weights_only=False)
    return results


def _gradients_job(ep: int) -> dict[str, Any]:
    return {"gradients": {"spec": MOE, "ep": ep, "batch": BATCH, "seq": SEQ, "seed": SEED}}


@pytest.fixture(scope="module")
def single() -> list[float]:
    """The one-process losses (no process group)."""
    example = load_example()
    losses: list[float] = example.train(example.parse_args(_args("--strategy", "none")))[
        "losses"]
    return losses


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """One launch of 2 processes: ep 2 training, a checkpoint saved and resumed, one
    backward's gradients, and the refusals."""
    tmp = tmp_path_factory.mktemp("ep2")
    ckpt = str(tmp / "ckpt")
    jobs: dict[str, dict[str, Any]] = {
        "train": {"train": _args("--strategy", "fsdp", "--ep", "2")},
        "save": {"train": _args("--strategy", "fsdp", "--ep", "2", "--steps", str(SAVE_AT),
                                "--save", ckpt)},
        "resume": {"train": _args("--strategy", "fsdp", "--ep", "2", "--resume", ckpt)},
        "gradients": _gradients_job(2),
        "kernels": {"kernels": {"spec": MOE, "ep": 2, "batch": BATCH // 2, "seq": SEQ}},
    }
    for key, spec, ep, tp, fsdp in [("no fsdp", MOE, 2, 1, False), ("tp", MOE, 2, 2, True),
                                    ("dense", DENSE, 2, 1, True), ("ep 3", MOE, 3, 1, True),
                                    ("ep 4", MOE, 4, 1, True)]:
        jobs[key] = {"parallelize": {"spec": spec, "ep": ep, "tp": tp, "fsdp": fsdp}}
    results = _torchrun(2, list(jobs.values()), tmp / "results.pt")
    return dict(zip(jobs, results))


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    """One launch of 4 processes: ep 2 (experts FSDP-sharded over the 2 ranks that hold the
    same experts) and ep 4, trained."""
    tmp = tmp_path_factory.mktemp("ep4")
    jobs = {f"ep {ep}": {"train": _args("--strategy", "fsdp", "--ep", str(ep))}
            for ep in (2, 4)}
    results = _torchrun(4, list(jobs.values()), tmp / "results.pt")
    return dict(zip(jobs, results))


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-5)
                                         for a, b in zip(got, want))


def test_two_processes_ep2_train_to_the_single_process_losses(
        two: dict[str, list[Any]], single: list[float]) -> None:
    got = two["train"][0]["losses"]
    assert _close(got, single), (got, single)


@pytest.mark.parametrize("ep", [2, 4])
def test_four_processes_train_to_the_single_process_losses(
        four: dict[str, list[Any]], single: list[float], ep: int) -> None:
    got = four[f"ep {ep}"][0]["losses"]
    assert _close(got, single), (got, single)


def test_resume_from_a_sharded_checkpoint_equals_running_straight_through(
        two: dict[str, list[Any]]) -> None:
    saved, resumed = two["save"][0], two["resume"][0]
    assert resumed["start_step"] == SAVE_AT
    assert _close(saved["losses"] + resumed["losses"], two["train"][0]["losses"])


def _reference() -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """The one-process gradients of the gradients job's step, and every layer's routing
    weights (B, L, E) in it (recorded at the route steps)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from expert_parallel_worker import fixed_batch

    graph = tfgraph.compile(tfgraph.load_spec(ROOT / MOE))
    model = to_torch(graph, seed=SEED).train()
    routing: list[torch.Tensor] = []
    for layer in model.layers():
        steps = layer._program.steps
        for index, (fn, *rest) in enumerate(steps):
            if fn is TORCH_OPS["route"]:
                def record(module: Any, attrs: Any, *xs: Any, fn: Any = fn) -> Any:
                    out = fn(module, attrs, *xs)
                    routing.append(out.detach())
                    return out
                steps[index] = (record, *rest)
    tokens = fixed_batch(BATCH, SEQ, int(graph.node(graph.outputs[0]).type.shape[-1]), SEED)
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return grads, routing


def test_each_rank_holds_its_experts_and_their_one_process_gradients(
        two: dict[str, list[Any]]) -> None:
    grads, _ = _reference()
    per_expert = EXPERTS // 2
    ranks = two["gradients"]
    assert sorted(r["dp_rank"] for r in ranks) == [0, 1]
    for result in ranks:
        first = result["dp_rank"] * per_expert  # ep == dp: rank r holds experts of block r
        assert len(result["experts"]) == 6  # gate, up, down of 2 layers
        for name, held in result["experts"].items():
            want = grads[name][first:first + per_expert]
            assert held["grad"].shape == want.shape
            assert want.abs().max() > 0
            torch.testing.assert_close(held["grad"], want, rtol=1e-5, atol=1e-7)
            assert held["bytes"] == grads[name].numel() * 4 // 2  # 1/ep of the expert bytes
    assert ranks[0]["names"] == list(to_torch(
        tfgraph.compile(tfgraph.load_spec(ROOT / MOE)), seed=0).state_dict())


def test_all_to_all_bytes_are_what_the_routing_sends(two: dict[str, list[Any]]) -> None:
    """Bytes each rank sends to the other: the (token, expert) pairs of its rows whose expert
    the other rank holds (dispatch, and the gradient of what it received in backward), and
    the rows it received back (combine, and their gradients in backward): d float32 each."""
    _, routing = _reference()
    rows = BATCH // 2
    for result in two["gradients"]:
        me = result["dp_rank"]
        sent = received = 0
        for weights in routing:
            owner = weights.topk(TOP_K, dim=-1).indices // (EXPERTS // 2)  # (B, L, k)
            sent += int((owner[me * rows:(me + 1) * rows] != me).sum())
            other = 1 - me
            received += int((owner[other * rows:(other + 1) * rows] == me).sum())
        counted = result["all_to_all"]
        row = D * 4
        assert counted["dispatch_forward"] == sent * row
        assert counted["combine_forward"] == received * row
        assert counted["dispatch_backward"] == received * row
        assert counted["combine_backward"] == sent * row


def test_the_eager_census_under_ep_is_what_a_rank_launches(two: dict[str, list[Any]]) -> None:
    """``plan --kernels eager --ep 2`` counts the routed experts as one of 2 expert-parallel
    ranks runs them: the census (meta device, uniform routing) equals, kernel for kernel
    (name, bytes, FLOPs, GEMM dimensions), what each gloo rank's experts step launches,
    forward and backward, when its tokens are routed uniformly; the all-to-alls are not
    kernels of the census. A rank runs E / ep experts, not E."""
    from tfgraph.exporters.torch import kernels as K

    graph = tfgraph.compile(tfgraph.load_spec(ROOT / MOE), loss=True)
    name = next(n.name for n in graph.nodes() if n.op == "experts")
    census = K.eager_kernels(graph, BATCH // 2, SEQ, ep=2)[name]
    for part in ("forward", "backward"):
        counted = sorted((k.name, k.nbytes, k.flops, k.kind, k.dims)
                         for k in getattr(census, part))
        for rank in two["kernels"]:
            assert counted == sorted(tuple(k) for k in rank[part])
    products = [k for k in census.forward if k.kind == "gemm"]
    assert len(products) == 3 * EXPERTS // 2  # gate, up, down of the rank's 4 experts
    assert {k.dims[0] for k in products} == {BATCH // 2 * SEQ * TOP_K // (EXPERTS // 2)}


def _planned(dp: int, ep: int) -> dict[str, Any]:
    spec = tfgraph.load_spec(ROOT / MOE).model_copy(update={"dtype": "float32"})
    graph = tfgraph.compile(spec, loss=True)
    layout = Layout(dp=dp, ep=ep, zero=3, dtype="float32", seq=SEQ, micro_batch=BATCH // dp,
                    global_batch=BATCH)
    return plan(graph, layout, gpu("h100"))


def _check_states(per_rank: list[dict[str, Any]], dp: int, ep: int) -> None:
    memory = _planned(dp, ep)["per_rank"]["memory"]
    assert memory["weights"] == max(r["weights"] for r in per_rank)
    assert memory["gradients"] == max(r["gradients"] for r in per_rank)
    assert memory["optimizer"] == max(r["optimizer"] + r["optimizer_step_counters"]
                                      for r in per_rank)


def test_the_planner_predicts_the_measured_bytes_two_processes(
        two: dict[str, list[Any]]) -> None:
    _check_states(two["train"][0]["per_rank"], 2, 2)


@pytest.mark.parametrize("ep", [2, 4])
def test_the_planner_predicts_the_measured_bytes_four_processes(
        four: dict[str, list[Any]], ep: int) -> None:
    _check_states(four[f"ep {ep}"][0]["per_rank"], 4, ep)


def _ratio(result: dict[str, Any], dp: int, ep: int) -> float:
    """Measured all-to-all bytes per step of the most sending rank / the planner's."""
    measured = max(r["all_to_all"] for r in result["per_rank"]) / STEPS
    planned = _planned(dp, ep)["step"]["comm_bytes"]["ep"]
    print(f"dp {dp} ep {ep}: all-to-all per rank per step measured {measured:.0f} B, "
          f"planned {planned:.0f} B, ratio {measured / planned:.3f}")
    return float(measured / planned)


def test_all_to_all_bytes_against_the_planner(two: dict[str, list[Any]],
                                              four: dict[str, list[Any]]) -> None:
    """The planner's figure sends (ep - 1) / ep of every rank's token-expert pairs (uniform
    routing); a rank sends between none and all of them: measured / planned lies in
    [0, ep / (ep - 1)], and near 1 for a router that spreads tokens evenly."""
    for result, dp, ep in [(two["train"][0], 2, 2), (four["ep 2"][0], 4, 2),
                           (four["ep 4"][0], 4, 4)]:
        ratio = _ratio(result, dp, ep)
        assert 0.5 < ratio <= ep / (ep - 1)


@pytest.mark.parametrize("key, says", [
    ("no fsdp", "ep=2 runs under FSDP2 (fsdp=True)"),
    ("tp", "ep=2 with tensor parallelism (tp=2) is not supported"),
    ("dense", "ep=2: tiny-llama has no routed experts"),
    ("ep 3", "--ep 3 does not divide the 8 experts"),
    ("ep 4", "--ep 4 must divide the 2 data-parallel ranks"),
])
def test_unsupported_combinations_are_refused_with_one_line(
        two: dict[str, list[Any]], key: str, says: str) -> None:
    for message in two[key]:
        assert says in message and "\n" not in message, message


@pytest.mark.parametrize("argv, says", [
    (["--strategy", "ddp", "--ep", "2"], "--ep 2 runs under --strategy fsdp"),
    (["--strategy", "fsdp", "--ep", "3"], "--ep 3 does not divide the 8 experts"),
])
def test_the_example_refuses_bad_ep_with_one_line(argv: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE), "--spec", MOE, *argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
