"""torchrun worker of tests/test_hf_pad_row.py: a vocabulary-split token table with
embedding.pad_no_grad under tensor parallelism (with and without sequence parallelism) on two
CPU ranks; each job reports the table's gradient and the one-process model's, as lists."""

from __future__ import annotations

from typing import Any

import torch

import tfgraph
from tfgraph.exporters import device_mesh, load_full_state_dict, parallelize, to_torch
from tfgraph.spec.schema import Spec

from distributed_support import ROOT, run_jobs

PAD = 7


def run_one(job: dict[str, Any]) -> dict[str, Any]:
    torch.manual_seed(0)
    data = tfgraph.load_spec(ROOT / "specs" / "tiny-encoder.yaml").model_dump()
    data["tokens"], data["dropout"] = {"pad": PAD}, 0.0
    data["embedding"]["pad_no_grad"] = True
    graph = tfgraph.compile(Spec.model_validate(data))
    ids = torch.randint(0, 101, (2, 8), generator=torch.Generator().manual_seed(0))
    ids[:, :3] = PAD
    one = to_torch(graph, seed=1).train()
    one(ids).square().sum().backward()
    model = parallelize(to_torch(graph, device="meta"), device_mesh("cpu", 2), tp=2,
                        fsdp=False, sp=job["sp"])
    load_full_state_dict(model, torch.device("cpu"), to_torch(graph, seed=1).state_dict()
                         if torch.distributed.get_rank() == 0 else {})
    model.train()
    model(ids).square().sum().backward()
    grad: Any = dict(model.named_parameters())["embed.tokens.weight"].grad
    grad = grad.full_tensor() if hasattr(grad, "full_tensor") else grad
    want = dict(one.named_parameters())["embed.tokens.weight"].grad
    assert want is not None
    return {"got": grad.tolist(), "want": want.tolist()}


if __name__ == "__main__":
    run_jobs(run_one)
