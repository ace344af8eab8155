"""The ``torchrun`` side of tests/test_expert_parallel.py: several jobs in one launch (a launch
costs seconds on two cores). argv[1] is a JSON list of jobs, argv[2] the file rank 0 writes
the results to (``torch.save``, one result per job):

- ``{"train": [argv...]}``: examples/train_distributed.py's ``train`` (losses, per-rank bytes,
  all-to-all bytes), or ``{"error": ...}`` for a TfgraphError;
- ``{"gradients": {"spec", "ep", "batch", "seq", "seed"}}``: the spec parallelized with
  expert parallelism over every process (FSDP2), one forward and backward of each rank's rows
  of a fixed batch; per rank its coordinate on the expert-parallel mesh, the local expert
  weights' gradients and bytes, and the all-to-all bytes counted;
- ``{"parallelize": {"spec", "ep", "tp", "fsdp"}}``: only ``parallelize`` on the meta device,
  ``"ok"`` or the TfgraphError's message;
- ``{"kernels": {"spec", "ep", "batch", "seq"}}``: the first MoE layer's experts step as
  ``parallelize`` makes it (``_DispatchedExperts`` calling a ``GroupedExperts`` under
  ``ExpertParallel``; no FSDP2, whose copies the census counts apart) on ``ep`` processes,
  each on ``batch`` x ``seq`` tokens routed uniformly (token t's pairs to experts t k .. t k +
  k - 1, mod E); per rank the kernels its forward and backward launch (exporters/torch/
  kernels.py's ``record``), as (name, bytes, FLOPs, kind, dims), the collectives left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

import tfgraph
from distributed_support import GROUP_TIMEOUT, finish, load_example
from tfgraph.errors import TfgraphError
from tfgraph.exporters import device_mesh, load_full_state_dict, parallelize, to_torch
from tfgraph.exporters.torch import kernels as K
from tfgraph.exporters.torch.expert_parallel import (
    ExpertParallel,
    GroupedExperts,
    _DispatchedExperts,
    _experts_steps,
    all_to_all_bytes,
)

ROOT = Path(__file__).resolve().parents[1]


def fixed_batch(batch: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """(batch, seq + 1) tokens, the same in the test's one-process reference."""
    return torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(seed))


def gradients(job: dict[str, Any]) -> dict[str, Any]:
    graph = tfgraph.compile(tfgraph.load_spec(ROOT / job["spec"]))
    mesh = device_mesh("cpu", 1)
    model = parallelize(to_torch(graph, device="meta"), mesh, ep=job["ep"])
    full = to_torch(graph, seed=job["seed"]).state_dict() if dist.get_rank() == 0 else {}
    load_full_state_dict(model, "cpu", full)
    model.train()
    vocab = int(graph.node(graph.outputs[0]).type.shape[-1])
    tokens = fixed_batch(job["batch"], job["seq"], vocab, job["seed"])
    dp, rank = mesh["dp"].size(), mesh["dp"].get_local_rank()
    rows = tokens[rank * job["batch"] // dp:(rank + 1) * job["batch"] // dp]
    logits = model(rows[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten()).backward()
    experts: dict[str, Any] = {}
    for name, param in model.named_parameters():
        if ".experts." in name:
            assert isinstance(param, DTensor) and isinstance(param.grad, DTensor)
            local = param.to_local()
            experts[name] = {"grad": param.grad.to_local().clone(),
                             "bytes": local.numel() * local.element_size(),
                             "placements": [str(p) for p in param.placements]}
    return {"dp_rank": rank, "experts": experts, "all_to_all": all_to_all_bytes(model),
            "names": list(model.state_dict())}


def parallelize_only(job: dict[str, Any]) -> str:
    graph = tfgraph.compile(tfgraph.load_spec(ROOT / job["spec"]))
    try:
        parallelize(to_torch(graph, device="meta"), device_mesh("cpu", job["tp"]), tp=job["tp"],
                    fsdp=job["fsdp"], ep=job["ep"])
    except TfgraphError as e:
        return str(e)
    return "ok"


def kernels(job: dict[str, Any]) -> dict[str, list[tuple[Any, ...]]]:
    graph = tfgraph.compile(tfgraph.load_spec(ROOT / job["spec"]))
    model = to_torch(graph, seed=0).train()
    program, index, path = next(_experts_steps(model))
    attrs = program.steps[index][1]
    grouped = GroupedExperts(model.get_submodule(path), attrs["activation"], attrs["gated"])
    parallelize_module(grouped, init_device_mesh("cpu", (job["ep"],), mesh_dim_names=("ep",)),
                       ExpertParallel())
    step = _DispatchedExperts(grouped)
    experts, k = grouped.up.weight.shape[0], attrs["top_k"]
    tokens = job["batch"] * job["seq"]
    d = grouped.down.weight.shape[1]
    x = torch.randn(job["batch"], job["seq"], d, requires_grad=True)
    picked = (torch.arange(tokens)[:, None] * k + torch.arange(k)) % experts  # (N, k)
    weights = torch.zeros(tokens, experts).scatter_(1, picked, torch.rand(tokens, k) + 1)
    weights = weights.reshape(job["batch"], job["seq"], experts).requires_grad_()
    out: list[torch.Tensor] = []
    forward = K.record(lambda: out.append(step(model, attrs, x, weights)))
    grad = torch.ones_like(out[0])
    wanted = [x, weights, *grouped.parameters()]
    backward = K.record(lambda: torch.autograd.grad(out[0], wanted, grad))

    def kept(found: list[K.Kernel]) -> list[tuple[Any, ...]]:
        return [(k.name, k.nbytes, k.flops, k.kind, k.dims) for k in found
                if "c10d" not in k.name]
    return {"forward": kept(forward), "backward": kept(backward)}


def main() -> None:
    example = load_example()
    dist.init_process_group("gloo", timeout=GROUP_TIMEOUT)  # a hung rank fails the launch
    results: list[Any] = []
    for job in json.loads(sys.argv[1]):
        mine: Any
        if "train" in job:
            try:
                mine = example.train(example.parse_args(job["train"]))
            except TfgraphError as e:
                mine = {"error": str(e)}
        elif "gradients" in job:
            mine = gradients(job["gradients"])
        elif "kernels" in job:
            mine = kernels(job["kernels"])
        else:
            mine = parallelize_only(job["parallelize"])
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        results.append(gathered)
        dist.barrier()
    if dist.get_rank() == 0:
        torch.save(results, sys.argv[2])
    finish()  # (distributed_support.finish: why it leaves without the interpreter's shutdown)


if __name__ == "__main__":
    main()
