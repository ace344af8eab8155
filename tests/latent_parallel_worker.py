"""One torchrun rank of tests/test_latent_parallel.py. argv[1] is a JSON list of runs
{"spec", "vocab", "tp", "sp"}, argv[2] the JSON file rank 0 writes one result per run to: the
spec (its vocabulary padded to ``vocab``, a multiple of tp, as Megatron-LM pads it) as a
``to_torch`` module tensor-parallelized by ``parallelize`` (no FSDP; ``sp``: with sequence parallelism) and, on every rank, the
whole one-process module from the same weights. Result: the largest difference of their
logits, each parameter's largest gradient difference after one backward of the same loss,
and the bytes of the parameters and gradients this rank holds (DTensor local shards); or {"example":
[...]}: examples/train_distributed.py with those arguments (--measure-saved: what autograd
saves on each rank), its result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

import tfgraph
from distributed_support import run_cases_or_examples
from tfgraph.exporters import device_mesh, load_full_state_dict, parallelize, to_torch

ROOT = Path(__file__).resolve().parents[1]


def _whole(t: Tensor) -> Tensor:
    return t.full_tensor() if isinstance(t, DTensor) else t


def _local_bytes(module: nn.Module) -> int:
    return sum((p.to_local() if isinstance(p, DTensor) else p).nbytes
               for p in module.parameters())


def _grad_bytes(module: nn.Module) -> int:
    """Bytes of the gradients this rank holds (a parameter no gradient reaches has none)."""
    return sum((p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).nbytes
               for p in module.parameters() if p.grad is not None)


def run(case: dict[str, Any]) -> dict[str, Any]:
    spec = tfgraph.load_spec(ROOT / case["spec"]).model_copy(update={"vocab": case["vocab"]})
    graph = tfgraph.compile(spec)
    single = to_torch(graph, seed=0)
    mesh = device_mesh("cpu", case["tp"])
    model = parallelize(to_torch(graph, device="meta"), mesh, tp=case["tp"], fsdp=False,
                        sp=case.get("sp", False))
    load_full_state_dict(model, "cpu", single.state_dict())
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, case["vocab"], (2, 13), generator=g)
    with torch.no_grad():
        logits = float((model.eval()(tokens[:, :-1]) - single(tokens[:, :-1])).abs().max())
    grads: dict[str, float] = {}
    mine = dict(model.train().named_parameters())
    for module in (model, single.train()):
        out = module(tokens[:, :-1])
        F.cross_entropy(out.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    for name, p in single.named_parameters():
        got, want = mine[name].grad, p.grad
        grads[name] = (0.0 if got is None and want is None else float("inf")) \
            if got is None or want is None else float(
            (_whole(got) - want).abs().max())
    return {"logits_difference": logits, "grad_differences": grads,
            "bytes": _local_bytes(model), "single_bytes": _local_bytes(single),
            "grad_bytes": _grad_bytes(model), "single_grad_bytes": _grad_bytes(single)}


def main() -> None:
    run_cases_or_examples(run)


if __name__ == "__main__":
    main()
