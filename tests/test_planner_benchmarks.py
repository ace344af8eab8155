"""The planner's validation scripts run (benchmarks/plan_published.py, benchmarks/eager_step.py):
they are what a GPU session compares its measurements with, so a change that breaks them is
caught here rather than on the device. Their figures are checked in benchmarks/RESULTS.md,
not here; only that every row is printed."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT


def _run(*argv: str) -> str:
    done = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_plan_published_prints_every_row() -> None:
    out = _run("benchmarks/plan_published.py", "--no-search")
    rows = [line for line in out.splitlines() if line.startswith(("N21 ", "K22 ", "H100 ",
                                                                   "H200 "))]
    assert len(rows) == 22  # Narayanan's 10, Korthikanti's 4, the eight measured steps
    assert "rows within +-15%" in out


def test_eager_step_predicts_both_modules_on_both_gpus() -> None:
    out = _run("benchmarks/eager_step.py")
    for gpu_name in ("h100", "h200"):
        for module in ("tfgraph", "transformers"):
            assert any(line.split()[:2] == [gpu_name, module] for line in out.splitlines())
    assert "predicted / measured" in out
