"""The planner's validation scripts run (benchmarks/plan_published.py, benchmarks/eager_step.py):
they are what a GPU session compares its measurements with, so a change that breaks them is
caught here rather than on the device. Their figures are quoted in benchmarks/RESULTS.md; here,
that every row is printed, that issue 26's goal rows (every published run and issue 26's own
H100 step) and the measured steps at batch 8 to 32 x 1024 that the plan does not call
host-bound stay within +-15%, and that the plan calls an FSDP2 step host-bound exactly where it
was measured over 15% longer: the planner is deterministic, so a change that moves them out
fails here."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

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
    assert len(rows) == 35  # Narayanan's 10, Korthikanti's 4, the 21 measured steps
    assert "rows within +-15%" in out
    # issue 26's goal, held: every published run and issue 26's own H100 step (66.7 ms)
    # predicted within +-15% (the ratio column: achieved / predicted step time)
    goal = [row for row in rows if row.startswith(("N21 ", "K22 "))
            or row.split("  ")[0] == "H100 TinyLlama-1.1B"]
    assert len(goal) == 15
    for row in goal:
        assert abs(_ratio(row) - 1) <= 0.15, row
    # data parallelism as run_table_1.sh ran it: torch DDP (1.7B-18.4B) reduces under the
    # backward, Megatron's local DDP (39.1B-1T) after it, exposed
    table_1 = [row for row in rows if row.startswith("N21 ")]
    assert ["dp_exposed" in row for row in table_1] == [False] * 4 + [True] * 6
    # the steps at batch 8 to 32 x 1024 (H200, H100; benchmarks/RESULTS.md, "the FSDP2 step
    # profiled"): within +-15% where the plan does not call them host-bound
    # (tfgraph/parallel/host.py)
    batches = [row for row in rows if row.startswith(("H200 TinyLlama-1.1B b",
                                                      "H100 TinyLlama-1.1B b"))]
    assert len(batches) == 10
    for row in batches:
        if "plan: host-bound" not in row:
            assert abs(_ratio(row) - 1) <= 0.15, row
    # and every measured FSDP2 step is host-bound in the plan exactly where it took over 15%
    # longer than planned (batch 4 and 8: 1.20-1.64x; 12 to 32: 0.94-0.96x)
    fsdp2 = [row for row in rows if "FSDP2" in row.split("  ")[0]]
    assert len(fsdp2) == 7
    for row in fsdp2:
        assert ("plan: host-bound" in row) == (_ratio(row) > 1.15), row


def test_plan_published_search_places_the_published_layouts() -> None:
    # issue 26: --search under each paper's own features places the published layout (or one
    # within 5% of its predicted time) in its top 5; 12 of the 14 runs today. Narayanan's 18.4B
    # and 39.1B are not placed: the plan ranks tensor 2-4 with pipelining faster than their
    # tensor 8, and the line says on which time parts (benchmarks/RESULTS.md)
    out = _run("benchmarks/plan_published.py")
    verdicts = dict(re.findall(r"^  ((?:N21|K22) [\d.]+[BT]): (.*)$", out, re.M))
    assert len(verdicts) == 14
    placed = {run for run, line in verdicts.items() if "the paper's features: yes" in line}
    assert placed >= {"N21 1.7B", "N21 3.6B", "N21 7.5B", "N21 76.1B", "N21 145.6B",
                      "N21 310.1B", "N21 529.6B", "N21 1008.0B", "K22 22B", "K22 175B",
                      "K22 530B", "K22 1T"}
    for run, line in verdicts.items():
        assert ("published - fastest: " in line) == (run not in placed), line
    missed = sorted(set(verdicts) - placed, key=list(verdicts).index)
    assert (f"published layouts placed under the paper's features: {len(placed)} of 14"
            f"{' (not: ' + ', '.join(missed) + ')' if missed else ''}") in out
    assert "plan --search, GPT-3 175B on 1,024 H100s" in out


def _ratio(row: str) -> float:
    """The ratio column of a plan_published.py row: the three-decimal number after the
    achieved and predicted figures."""
    found = re.search(r"\s\d+(?:\.\d+)?(?:ms)?\s+\d+(?:\.\d+)?(?:ms)?\s+(\d\.\d{3})\s", row)
    assert found, row
    return float(found.group(1))


def test_eager_step_predicts_both_modules_on_both_gpus() -> None:
    """Both modules on both GPU rows; and the planner's KERNEL_SHARE is the share this script
    solves from the H200's profiled memory-bound kernels (not a number typed in apart)."""
    from tfgraph.parallel.gpus import KERNEL_SHARE

    out = _run("benchmarks/eager_step.py")
    solved = re.search(r"\(KERNEL_SHARE\): (\d\.\d{3})$", out, re.M)
    assert solved and float(solved.group(1)) == pytest.approx(KERNEL_SHARE, abs=5e-4)
    for gpu_name in ("h100", "h200"):
        for module in ("tfgraph", "transformers"):
            assert any(line.split()[:2] == [gpu_name, module] for line in out.splitlines())
    assert "predicted / measured" in out


def test_plan_trends_prints_every_figure_row() -> None:
    """benchmarks/plan_trends.py: each of Narayanan's Figures 13-15 batch rows is printed with
    its verdict against the paper's stated trend, and every one follows it (RESULTS.md,
    "Narayanan's Figures 13-15": a group with several GPUs in a node crosses nodes over their
    NICs; with one NIC per node's group, 3 of 7 did)."""
    out = _run("benchmarks/plan_trends.py")
    rows = [line for line in out.splitlines() if line.startswith("  batch")]
    assert len(rows) == 7  # Figure 13: 2 batches, 14: 2, 15: 3
    for row in rows:
        values = [float(x) for x in row.split(":")[1].split("TFLOP/s")[0].split()]
        assert len(values) == 5 and all(v > 0 for v in values), row
        assert row.count("follow") == 1, row
    assert out.count("follows it") == 7 and "DOES NOT" not in out
    assert re.search(r"^7 of 7 figure rows follow", out, re.M)
