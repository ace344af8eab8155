"""What the torchrun tests share: the example they drive and one launch of CPU processes
(gloo). Workers (tests/*_worker.py) import this too: they run as scripts from tests/."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from collections.abc import Callable
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_distributed.py"
GROUP_TIMEOUT = timedelta(seconds=120)
"""A worker's process group gives up on a hung rank after this (gloo waits 30 minutes)."""


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

    dist.init_process_group("gloo", timeout=GROUP_TIMEOUT)
    results = []
    for job in json.loads(sys.argv[1]):
        try:
            results.append(run_one(job))
        except TfgraphError as e:
            results.append({"error": str(e)})
        dist.barrier()
    if dist.get_rank() == 0:
        Path(sys.argv[2]).write_text(json.dumps(results))
    finish()


def finish() -> None:
    """A worker's end once rank 0 has written the results: every rank waits for the others
    (no rank tears gloo down while another still writes), leaves the group, and exits
    without the interpreter's shutdown. Under load a rank still aborted there, after its
    work, in torch's C++ teardown ("terminate called without an active exception": a native
    thread still joinable when static destructors run; seen about once in 30 launches on a
    loaded 2-core machine, in CI too), failing a launch whose results were all written."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_cases_or_examples(run_case: Callable[[Any], Any]) -> None:
    """A worker's main (``run_jobs``): a job ``{"example": [...]}`` runs
    examples/train_distributed.py's ``train`` with those arguments (its result), any other
    job ``run_case``."""
    example = load_example()

    def one(job: Any) -> Any:
        if "example" in job:
            return example.train(example.parse_args(job["example"]))
        return run_case(job)

    run_jobs(one)


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
    done = launch(cmd, timeout, cwd=ROOT, env=env)
    assert done.returncode == 0, failure(done)


def failure(done: subprocess.CompletedProcess[str]) -> str:
    """What a failed launch said: the ranks' own error lines (torchrun's summary, which the
    tail holds, names only the signal), then the tail."""
    lines = (done.stdout + "\n" + done.stderr).splitlines()
    marks = ("terminate called", "Error", "error:", "Traceback", "what():", "rank")
    errors = [line for line in lines if any(m in line for m in marks)
              and "elastic/multiprocessing" not in line][:40]
    return "\n".join(errors) + "\n--- tail ---\n" + done.stderr[-2000:]


def launch(cmd: list[str], timeout: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd)`` with its output captured, in a session of its own: past
    ``timeout`` the whole session is killed, torchrun's ranks too (killing torchrun alone
    would leave a hung rank running), and the timeout is raised."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
