"""The planner's validation scripts run (benchmarks/plan_published.py, benchmarks/eager_step.py):
they are what a GPU session compares its measurements with, so a change that breaks them is
caught here rather than on the device. Their figures are quoted in benchmarks/RESULTS.md; here,
that every row is printed, and that issue 26's goal rows (every published run and issue 26's
own H100 step) and the device-bound steps at larger batches stay within +-15%: the
planner is deterministic, so a change that moves them out fails here."""

from __future__ import annotations

import re
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
    assert len(rows) == 31  # Narayanan's 10, Korthikanti's 4, the 17 measured steps
    assert "rows within +-15%" in out
    # issue 26's goal, held: every published run and issue 26's own H100 step (66.7 ms)
    # predicted within +-15% (the ratio column: achieved / predicted step time)
    goal = [row for row in rows if row.startswith(("N21 ", "K22 "))
            or row.split("  ")[0] == "H100 TinyLlama-1.1B"]
    assert len(goal) == 15
    for row in goal:
        assert abs(_ratio(row) - 1) <= 0.15, row
    # the steps at batch 16 and 32 x 1024 (H200, H100), where the host keeps ahead of the
    # device (benchmarks/RESULTS.md, "the FSDP2 step profiled"): plain and FSDP2 within +-15%
    device_bound = [row for row in rows if row.startswith(("H200 TinyLlama-1.1B b",
                                                           "H100 TinyLlama-1.1B b"))]
    assert len(device_bound) == 6
    for row in device_bound:
        assert abs(_ratio(row) - 1) <= 0.15, row


def _ratio(row: str) -> float:
    """The ratio column of a plan_published.py row: the three-decimal number after the
    achieved and predicted figures."""
    found = re.search(r"\s\d+(?:\.\d+)?(?:ms)?\s+\d+(?:\.\d+)?(?:ms)?\s+(\d\.\d{3})\s", row)
    assert found, row
    return float(found.group(1))


def test_eager_step_predicts_both_modules_on_both_gpus() -> None:
    out = _run("benchmarks/eager_step.py")
    for gpu_name in ("h100", "h200"):
        for module in ("tfgraph", "transformers"):
            assert any(line.split()[:2] == [gpu_name, module] for line in out.splitlines())
    assert "predicted / measured" in out
