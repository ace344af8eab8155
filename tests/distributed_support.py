"""What the torchrun tests share: the example they drive and one launch of CPU processes
(gloo). Workers (tests/*_worker.py) import this too: they run as scripts from tests/."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
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
