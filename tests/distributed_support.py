"""What the torchrun tests share: the example they drive and one launch of CPU processes
(gloo). Workers (tests/*_worker.py) import this too: they run as scripts from tests/."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from collections.abc import Callable
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_distributed.py"


def load_example() -> Any:
    """examples/train_distributed.py as a module (train, parse_args, ...)."""
    spec = importlib.util.spec_from_file_location("train_distributed", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_jobs(run_one: Callable[[Any], Any]) -> None:
    """A worker's main: under torchrun (gloo), ``run_one`` on every job of argv[1] (JSON), a
    TfgraphError as ``{"error": ...}``; rank 0 writes the results to argv[2] as JSON."""
    import torch.distributed as dist

    from tfgraph.errors import TfgraphError

    dist.init_process_group("gloo")
    results = []
    for job in json.loads(sys.argv[1]):
        try:
            results.append(run_one(job))
        except TfgraphError as e:
            results.append({"error": str(e)})
        dist.barrier()
    if dist.get_rank() == 0:
        Path(sys.argv[2]).write_text(json.dumps(results))
    dist.barrier()  # no rank tears down gloo while another is still writing (it aborted)
    dist.destroy_process_group()


def run_example(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """examples/train_distributed.py as a plain process (no torchrun)."""
    return subprocess.run([sys.executable, str(EXAMPLE), *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def torchrun(procs: int, worker: Path, jobs: Any, out: Path, timeout: int = 600) -> None:
    """One launch of ``procs`` CPU processes running ``worker`` with argv ``[json(jobs), out]``
    (the worker writes its results to ``out``); asserts it succeeded, showing its stderr."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", str(worker),
           json.dumps(jobs), str(out)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
