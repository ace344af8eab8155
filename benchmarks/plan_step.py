"""The planner's predicted time of a measured training step (issue 26 item 4), shared by
benchmarks/plan_published.py (its measured rows) and benchmarks/gpu.py (``--steps plan``).

A measured step is described by what ran: the spec, the batch and length, the training
precision, the ZeRO stage (FSDP2 is ZeRO 3), whether the step included the optimizer's and
whether the module ran eagerly (predicted with ``--kernels eager``) or compiled. Its
prediction is ``tfgraph plan``'s on one GPU for that layout, computed in-process exactly as
``tfgraph plan SPEC --gpus 1 ... --json`` computes it (``tfgraph.commands.plan``: the spec
compiled with its loss in the training precision, ``Layout``, ``plan``); ``cli_args`` gives
that command. A step without the optimizer (benchmarks/gpu.py's forward + loss + backward) is
predicted as the plan's forward + backward parts; one with it (examples/train_distributed.py's
steps) as the plan's whole step time.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

import tfgraph  # noqa: E402
from tfgraph.exporters.torch.kernels import kernel_source  # noqa: E402
from tfgraph.parallel.gpus import GPUS, gpu  # noqa: E402
from tfgraph.parallel.layout import Layout  # noqa: E402
from tfgraph.parallel.planner import plan  # noqa: E402


@dataclass(frozen=True)
class Step:
    """What a measured single-GPU training step ran."""

    spec: str
    """Spec path, relative to the repository root (e.g. specs/llama.yaml)."""
    batch: int
    seq: int
    dtype: str = "bfloat16"
    """Training precision as ``tfgraph plan --dtype`` takes it."""
    zero: int = 0
    """ZeRO stage of the run: 0 a plain module, 3 FSDP2 (``fully_shard``)."""
    optimizer: bool = False
    """Whether the measured time includes the optimizer step (AdamW)."""
    kernels: str = "graph"
    """How the module ran, as ``tfgraph plan --kernels`` takes it: "eager" (PyTorch's eager
    mode, one kernel per ATen op) or "graph" (torch.compile, toward one per graph op)."""

    def layout(self) -> Layout:
        return Layout(zero=self.zero, micro_batch=self.batch, global_batch=self.batch,
                      seq=self.seq, dtype=self.dtype)

    def what(self) -> str:
        done = "forward + backward + optimizer" if self.optimizer else "forward + backward"
        return f"{done}, --kernels {self.kernels}"

    def cli_args(self, gpu_name: str) -> list[str]:
        """The ``tfgraph plan`` arguments of the same prediction (its ``--json``'s
        ``step.time_s``, or the sum of ``step.time_parts`` forward and backward)."""
        args = [self.spec, "--gpus", "1", "--gpu", gpu_name, "--micro-batch", str(self.batch),
                "--global-batch", str(self.batch), "--seq", str(self.seq), "--dtype",
                self.dtype]
        return (args + (["--zero", str(self.zero)] if self.zero else [])
                + (["--kernels", self.kernels] if self.kernels != "graph" else []))


def plan_of(step: Step, gpu_name: str) -> dict[str, Any]:
    """``tfgraph plan``'s result (``--json``'s dict) for ``step`` on one ``gpu_name`` GPU."""
    spec = tfgraph.load_spec(ROOT / step.spec).model_copy(update={"dtype": step.dtype})
    graph = tfgraph.compile(spec, loss=True)
    kernels = kernel_source(graph) if step.kernels == "eager" else None
    return plan(graph, step.layout(), gpu(gpu_name), kernels=kernels)


def predicted_s(step: Step, gpu_name: str) -> float:
    """Seconds ``tfgraph plan`` predicts for ``step`` on one ``gpu_name`` GPU."""
    return seconds_of(plan_of(step, gpu_name), step)


def seconds_of(result: dict[str, Any], step: Step) -> float:
    """The part of a plan (``plan()``'s dict or ``--json``'s) the step's measurement covers."""
    if step.optimizer:
        return float(result["step"]["time_s"])
    parts = result["step"]["time_parts"]
    return float(parts["forward"] + parts["backward"])


def predicted_by_cli(step: Step, gpu_name: str) -> float:
    """The same prediction from the ``tfgraph plan --json`` command (a fresh process)."""
    # the spec by its full path, run from the temporary folder: from the repository root
    # ``python -m tfgraph`` would import its uninstalled tfgraph/ (no tfgraph.exporters)
    args = [str(ROOT / step.spec), *step.cli_args(gpu_name)[1:]]
    done = subprocess.run([sys.executable, "-m", "tfgraph", "plan", *args, "--json"],
                          capture_output=True, text=True, cwd=tempfile.gettempdir())
    if done.returncode:
        raise RuntimeError(f"tfgraph plan failed: {done.stderr.strip()[-300:]}")
    return seconds_of(json.loads(done.stdout), step)


# torch.cuda.get_device_name -> the GPU table's row (tfgraph/parallel/gpus.py). The table's
# H100, H200 and A100 rows are the SXM parts (their peak, bandwidth and NVLink); a PCIe or NVL
# card has other rates and no row, so it is not mapped to one.
_CARDS = (("H200", "h200"), ("H100 80GB HBM3", "h100"), ("H100 SXM", "h100"),
          ("A100-SXM4-80GB", "a100-80gb"), ("A100-SXM4-40GB", "a100-40gb"), ("B200", "b200"),
          ("V100-SXM2-32GB", "v100-32gb"), ("L40S", "l40s"), ("MI300X", "mi300x"))


def gpu_for_card(card: str) -> str | None:
    """The ``--gpu`` row of a CUDA device name, or None when the table has none for it."""
    upper = card.upper()
    if "PCIE" in upper or "NVL" in upper:
        return None
    for needle, name in _CARDS:
        if needle.upper() in upper:
            assert name in GPUS
            return name
    return None


@dataclass(frozen=True)
class Measured:
    """One measured step and where it comes from (a row of ``--measured FILE``)."""

    label: str
    step: Step
    measured_ms: float
    note: str
    """How it ran (e.g. "eager module", "torch.compile", "train_distributed.py FSDP2")."""
    card: str
    gpu: str | None
    """The GPU table's row for ``card`` (None: a CPU smoke run, or a card without a row)."""
    date: str
    source: str

    def layout_text(self) -> str:
        short = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}[self.step.dtype]
        zero = f", ZeRO {self.step.zero}" if self.step.zero else ""
        return f"1 GPU, batch {self.step.batch} x {self.step.seq}, {short}{zero}"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "step": asdict(self.step)}

    @staticmethod
    def from_dict(row: dict[str, Any]) -> Measured:
        return Measured(row["label"], Step(**row["step"]), float(row["measured_ms"]),
                        row["note"], row["card"], row["gpu"], row["date"], row["source"])


def write_measured(path: Path, rows: list[Measured]) -> None:
    path.write_text(json.dumps({"rows": [r.as_dict() for r in rows]}, indent=1) + "\n")


def read_measured(path: Path) -> list[Measured]:
    """The rows of a ``write_measured`` file; ValueError for a row the planner cannot take
    (an unknown GPU row or dtype, a spec that is not in this repository, a time <= 0)."""
    rows = [Measured.from_dict(r) for r in json.loads(path.read_text())["rows"]]
    for row in rows:
        if row.gpu is not None and row.gpu not in GPUS:
            raise ValueError(f"{row.label!r}: no --gpu row {row.gpu!r}")
        if row.step.dtype not in ("bfloat16", "float16", "float32"):
            raise ValueError(f"{row.label!r}: dtype {row.step.dtype!r}")
        if row.step.kernels not in ("graph", "eager"):
            raise ValueError(f"{row.label!r}: kernels {row.step.kernels!r}")
        spec = (ROOT / row.step.spec).resolve()
        if not spec.is_relative_to(ROOT) or not spec.is_file() or not row.measured_ms > 0:
            raise ValueError(f"{row.label!r}: spec {row.step.spec!r}, "
                             f"{row.measured_ms} ms")
    return rows
