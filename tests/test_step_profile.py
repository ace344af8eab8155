"""benchmarks/step_profile.py's trace summary (issue 26: is the H100 step host-bound?): the union
of device intervals and their attribution to phase windows on synthetic events with known
answers, and a CPU smoke run of the whole script on tiny-llama (no timing asserted)."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))

import step_profile as sp  # noqa: E402
from step_profile import Event  # noqa: E402


def test_union_counts_overlaps_once_and_clips_to_the_window() -> None:
    spans = [(0.0, 10.0), (5.0, 15.0), (20.0, 25.0), (21.0, 22.0)]
    assert sp.union_us(spans) == 20.0  # 0-15 and 20-25
    assert sp.union_us(spans, 8.0, 22.0) == 9.0  # 8-15 and 20-22
    assert sp.union_us(spans, 15.0, 20.0) == 0.0  # a gap
    assert sp.union_us([]) == 0.0


def host(name: str, start: float, end: float) -> Event:
    return Event(sp.HOST_CAT, sp.PREFIX + name, start, end)


def one_step(t: float) -> list[Event]:
    """A step at ``t`` (microseconds): forward 0-40, a host gap 40-50 (zero_grad), backward
    50-90, end 90-100. Device: two overlapping kernels in forward, one straddling forward and
    backward, a copy, an idle gap, a memset and a kernel in end."""
    return [host("step", t, t + 100), host("forward", t, t + 40), host("backward", t + 50, t + 90),
            host("end", t + 90, t + 100),
            Event("kernel", "a", t + 10, t + 30), Event("kernel", "b", t + 20, t + 45),
            Event("kernel", "c", t + 45, t + 60), Event("gpu_memcpy", "d", t + 70, t + 80),
            Event("gpu_memset", "e", t + 92, t + 93), Event("kernel", "f", t + 95, t + 99),
            Event(sp.HOST_CAT, "FSDP::pre_forward (layers.0)", t + 1, t + 2),  # not a phase
            Event("gpu_user_annotation", sp.PREFIX + "forward", t + 10, t + 45)]


def test_device_time_goes_to_the_phase_window_it_ran_in() -> None:
    events = one_step(0.0) + one_step(1000.0) + [Event("kernel", "outside", 500, 600)]
    got = sp.summarise(events)
    assert set(got) == {"step", "forward", "backward", "end"}
    # forward's window runs to backward's start (50): busy 10-50, c's first 5 us included
    assert got["forward"].wall_ms == pytest.approx(0.050)
    assert got["forward"].busy_ms == pytest.approx(0.040)
    assert got["forward"].kernels == 3  # a, b, c start in it
    assert got["backward"].busy_ms == pytest.approx(0.020)  # c's 50-60, the copy 70-80
    assert got["backward"].idle_ms == pytest.approx(0.020)
    assert got["backward"].kernels == 0  # a copy is no kernel
    assert got["end"].busy_ms == pytest.approx(0.005) and got["end"].kernels == 1
    assert got["step"].wall_ms == pytest.approx(0.100)
    assert got["step"].busy_ms == pytest.approx(0.065)  # the outside kernel in no step
    assert got["step"].kernels == 4
    assert sum(got[p].busy_ms for p in ("forward", "backward", "end")) == \
        pytest.approx(got["step"].busy_ms)


def test_windows_tile_each_step_from_its_first_phase() -> None:
    (windows,) = sp.step_windows(one_step(7.0))
    assert windows == {"step": (7.0, 107.0), "forward": (7.0, 57.0), "backward": (57.0, 97.0),
                       "end": (97.0, 107.0)}


def test_chrome_events_keep_device_work_and_this_scripts_ranges() -> None:
    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 5, "dur": 2},
        {"ph": "X", "cat": "user_annotation", "name": "step_profile::step", "ts": 1, "dur": 9},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 2, "dur": 1},
        {"ph": "M", "name": "process_name"}, {"ph": "f", "cat": "fwdbwd", "ts": 3}]}
    assert sp.chrome_events(trace) == [Event("kernel", "k", 5.0, 7.0),
                                       Event("user_annotation", "step_profile::step", 1.0, 10.0)]


def test_top_host_sums_a_range_over_its_modules() -> None:
    rows = [("FSDP::pre_forward (decoder.layers.0)", 300.0, 1),
            ("FSDP::pre_forward (decoder.layers.1)", 300.0, 1), ("aten::mm", 500.0, 40),
            (sp.PREFIX + "forward", 9000.0, 1), ("cudaLaunchKernel", 0.0, 3)]
    assert sp.top_host(rows, 2) == [("FSDP::pre_forward (per module)", 600.0, 2),
                                    ("aten::mm", 500.0, 40)]


def test_cpu_smoke_run_prints_every_phase(capsys: pytest.CaptureFixture[str]) -> None:
    assert sp.main(["--spec", str(ROOT / "specs" / "tiny-llama.yaml"), "--batch", "2",
                    "--seq", "16", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    plain, fsdp2 = out.split("FSDP2 step (")[0], out.split("FSDP2 step (")[1]
    for block, phases in ((plain, ["forward", "backward", "end", "step"]),
                          (fsdp2, ["forward", "backward", "optimizer", "end", "step"])):
        walls = {}
        for phase in phases:
            found = re.search(rf"^  {phase} +wall +([\d.]+) ms", block, re.M)
            assert found, (phase, block)
            walls[phase] = float(found.group(1))
        # the phases' windows tile the step's window after its first phase's start
        assert sum(v for k, v in walls.items() if k != "step") <= walls["step"] + 0.05
    assert "plan " in plain and "fsdp_copies" in fsdp2
    top = re.findall(r"^ +[\d.]+ ms +\d+x  \S", fsdp2, re.M)
    assert len(top) == sp.TOP
    if torch.cuda.is_available():
        assert "device busy" in plain and "need CUDA" not in out
    else:
        assert ", device busy" not in out and "device busy and idle figures need CUDA" in out
