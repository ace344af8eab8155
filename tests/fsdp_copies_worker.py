"""The ``torchrun`` side of tests/test_fsdp_copies.py: FSDP2's own kernels on several ranks.
argv[1] is a JSON list of jobs ``{"spec", "dtype", "ep", "vocab"}``, argv[2] the file rank 0
writes the results to (JSON, one list of (op, bytes, scope) per job)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from distributed_support import run_jobs
from fsdp_recorder import record_step
from tfgraph.exporters import device_mesh


def one(job: dict[str, Any]) -> Any:
    mesh = device_mesh("cpu", 1)  # every process data-parallel
    assert mesh["dp"].size() == dist.get_world_size()
    return record_step(job["spec"], mesh, job["dtype"], job.get("ep", 1), job.get("vocab"))


if __name__ == "__main__":
    run_jobs(one)
