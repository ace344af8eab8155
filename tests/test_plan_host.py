"""`step.host_bound` (tfgraph/parallel/host.py): under ZeRO 3 a plan names the step likely
host-bound when a layer group's device time per micro-batch is below the host time FSDP2 spent
per group on this project's H200 (benchmarks/RESULTS.md, "the FSDP2 step profiled"): the
profiled step at batch 4 x 1024 is (device busy 0.94x the plan, the step 1.5x), the one at
16 x 1024 is not (1.01x)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from tfgraph.parallel.host import FSDP2_HOST_S, host_bound
from tfgraph.parallel.layout import Layout

PARTS = {"forward": 0.0, "backward": 0.0, "recompute": 1.0}


def _plan(batch: int, zero: int, text: bool = False) -> str:
    argv = [sys.executable, "-m", "tfgraph", "plan", "specs/llama.yaml", "--gpus", "1",
            "--gpu", "h200", "--micro-batch", str(batch), "--global-batch", str(batch),
            "--seq", "1024", "--dtype", "bfloat16", "--zero", str(zero), "--kernels", "eager"]
    done = subprocess.run(argv + ([] if text else ["--json"]), cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(("batch", "zero", "bound"), [(4, 3, True), (16, 3, False),
                                                      (4, 0, False)])
def test_profiled_steps(batch: int, zero: int, bound: bool) -> None:
    step = json.loads(_plan(batch, zero))["step"]
    assert (step["host_bound"] is not None) == bound
    if bound:  # llama.yaml's 22 groups: 18.0 ms of forward, 37.3 of backward on the H200
        assert "forward 0.82 ms, backward 1.70 ms" in step["host_bound"]


def test_text_names_it() -> None:
    assert "host-bound: likely" in _plan(4, 3, text=True)
    assert "host-bound" not in _plan(16, 3, text=True)


def test_each_phase_against_its_own_host_time() -> None:
    layout = Layout(zero=3, micro_batch=1, global_batch=2, seq=16)  # 2 micro-batches
    layers = 4
    at = {phase: seconds * 2 * layers for phase, seconds in FSDP2_HOST_S.items()}
    # exactly the host time per group in both phases: not below, not host-bound
    assert host_bound(layout, {**PARTS, **at}, layers) is None
    short = host_bound(layout, {**PARTS, **at, "backward": at["backward"] * 0.99}, layers)
    assert short is not None and short.endswith("in backward: the device would wait for the "
                                                 "host and the step take longer than planned "
                                                 "(a larger micro-batch moves the step back "
                                                 "onto the device; benchmarks/RESULTS.md)")
    both = host_bound(layout, {**PARTS, "forward": 0.0, "backward": 0.0}, layers)
    assert both is not None and " in forward and backward:" in both
    # recompute's rerun is not counted as backward device time
    assert host_bound(layout, {**PARTS, **at, "backward": 0.0, "recompute": 9.0}, layers)
    assert host_bound(Layout(zero=2, micro_batch=1, global_batch=2, seq=16), PARTS, 4) is None
