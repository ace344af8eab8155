"""Wall time against the device's busy time per phase of the plain and the FSDP2 training step,
profiled on a GPU: is the step host-bound (issue 26)?

    python benchmarks/step_profile.py [--spec specs/llama.yaml] [--steps 3] [--trace DIR]

On issue 26's H100 the plain eager step of llama.yaml (bf16, batch 4 x 1024, forward + float32
token cross-entropy + backward) took 69.0 ms against ``tfgraph plan --kernels eager``'s 58.5
then (62.7 since the plan's memory-bound kernel rate, 2026-11-28), and
examples/train_distributed.py's FSDP2 step 180.2 ms against 105.9 (110.2). benchmarks/step_host.py
estimated the host's share from a CPU run; this measures it. Both steps are
benchmarks/step_host.py's (``plain_step``; ``fsdp2_step``: the example's own ``build``,
``mixed_precision`` through it, ``adamw`` foreach, on a process group of one started here,
NCCL on CUDA, gloo on the CPU) at the spec's real sizes, batch 4 x 1024, bf16. Each step runs
``--warmup`` steps (default 1, nothing compiled), ``--steps`` timed without the profiler
(their wall per phase: what the profiler's own overhead adds, beside), then ``--steps``
profiled under ``torch.profiler`` (CPU + CUDA activities), each phase in a
``record_function`` range: forward (+ loss), backward, optimizer (FSDP2), end (the example's
tail: the loss's all-reduce and ``.item()`` for FSDP2; for both the device synchronised, the
only synchronisation of a step).

Per phase and per step, the mean over the profiled steps: wall ms (host clock, from the
phase's start to the next phase's start; the step's from its start to its end, after the
synchronisation), device busy ms (the union of CUDA kernel, memcpy and memset intervals
clipped to that wall window: work the host queued in an earlier phase counts where it ran),
device idle ms (wall - busy), and the kernels that started in the window; beside them
``tfgraph plan``'s part for that phase (``step.time_parts`` of ``plan --gpus 1 --kernels
eager --json`` on the card's GPU-table row, benchmarks/plan_step.py; FSDP2's ``fsdp_copies``
are a part of their own, in the step's total). Then the top 8 host-side ops and ranges of the
FSDP2 step by self CPU time (FSDP2's hook ranges, DTensor dispatch, the foreach kernels'
launches, the synchronisation's wait): what the host's time goes to. A phase whose idle time is
most of its wall is host-bound; the "end" phase's wall is the host waiting for the device.

The trace is summarised by pure functions of plain event tuples (``Event``: category, name,
start and end in microseconds, as in the profiler's Chrome trace), tested on synthetic events.
Without CUDA: tiny-llama, batch 2 x 32, on the CPU with CPU activities only, a smoke run (no
device figures; the plan's H100 parts beside, not comparable).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # step_host (it puts examples/ on the path too)

import gpu_profile  # noqa: E402
import step_host  # noqa: E402
import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import tfgraph  # noqa: E402


class Event(NamedTuple):
    """One trace event: its Chrome-trace category, name, start and end (microseconds)."""

    cat: str
    name: str
    start: float
    end: float


DEVICE_CATS = tuple(gpu_profile.DEVICE_CATS)  # what keeps the device busy (its trace categories)
HOST_CAT = "user_annotation"  # a record_function range on the host
PREFIX = "step_profile::"
STEP = PREFIX + "step"
PHASES = ("forward", "backward", "optimizer", "end")
TOP = 8
PER_MODULE = re.compile(r" \([\w.]+\)$")  # FSDP2's ranges name their module


@dataclass
class Figures:
    wall_ms: float = 0.0
    busy_ms: float = 0.0
    kernels: int = 0

    @property
    def idle_ms(self) -> float:
        return self.wall_ms - self.busy_ms


def union_us(intervals: Iterable[tuple[float, float]], lo: float = float("-inf"),
             hi: float = float("inf")) -> float:
    """Microseconds covered by the union of ``intervals`` (start, end) clipped to [lo, hi]:
    overlapping intervals count once."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo))
    total, reach = 0.0, float("-inf")
    for a, b in clipped:
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def step_windows(events: Iterable[Event]) -> list[dict[str, tuple[float, float]]]:
    """Per step range (``STEP``, in start order): its phases' wall windows by phase name, each
    from the phase range's start to the next phase's start (the last phase's to the step's
    end), and the step's own window under "step". A phase range belongs to the step range its
    start lies in; a phase run twice in a step spans from its first start (not expected)."""
    host = sorted((e for e in events if e.cat == HOST_CAT and e.name.startswith(PREFIX)),
                  key=lambda e: e.start)
    steps = [e for e in host if e.name == STEP]
    out = []
    for s in steps:
        inside = [e for e in host if e.name != STEP and s.start <= e.start <= s.end]
        windows: dict[str, tuple[float, float]] = {"step": (s.start, s.end)}
        for i, e in enumerate(inside):
            name = e.name[len(PREFIX):]
            stop = inside[i + 1].start if i + 1 < len(inside) else s.end
            start = windows[name][0] if name in windows else e.start
            windows[name] = (start, stop)
        out.append(windows)
    return out


def summarise(events: list[Event]) -> dict[str, Figures]:
    """Mean figures per phase (and "step") over the steps in ``events``: wall ms of the
    window, device busy ms (union of the device events clipped to it), kernels started in
    it."""
    device = [(e.start, e.end) for e in events if e.cat in DEVICE_CATS]
    kernel_starts = [e.start for e in events if e.cat == "kernel"]
    per_step = step_windows(events)
    sums: dict[str, Figures] = {}
    for windows in per_step:
        for name, (lo, hi) in windows.items():
            got = sums.setdefault(name, Figures())
            got.wall_ms += (hi - lo) / 1e3
            got.busy_ms += union_us(device, lo, hi) / 1e3
            got.kernels += sum(lo <= t < hi for t in kernel_starts)
    n = max(len(per_step), 1)
    return {name: Figures(f.wall_ms / n, f.busy_ms / n, round(f.kernels / n))
            for name, f in sums.items()}


def chrome_events(trace: dict[str, Any]) -> list[Event]:
    """The complete ("X") events of a profiler's Chrome trace that ``summarise`` reads."""
    return [Event(e["cat"], e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)))
            for e in trace.get("traceEvents", [])
            if e.get("ph") == "X" and e.get("cat") in (*DEVICE_CATS, HOST_CAT)]


class Ranges(step_host.Clock):
    """A clock whose phases are also ``record_function`` ranges, keeping each phase's and each
    step's host window as an ``Event`` (perf_counter microseconds) for unprofiled steps."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []

    @contextmanager
    def _range(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        with record_function(name):
            yield
        self.events.append(Event(HOST_CAT, name, start * 1e6, time.perf_counter() * 1e6))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        with self._range(PREFIX + name), super().phase(name):
            yield

    @contextmanager
    def step(self) -> Iterator[None]:
        with self._range(STEP):
            yield


@dataclass
class Profiled:
    figures: dict[str, Figures]  # profiled, per phase and "step"
    unprofiled: dict[str, Figures]  # the timed steps without the profiler (walls only)
    top: list[tuple[str, float, float]]  # (name, self CPU ms per step, calls per step)


def run_profiled(step: step_host.Step, end: Callable[[Any], None], cuda: bool, warmup: int,
                 steps: int, trace_to: Path | None = None) -> Profiled:
    """``warmup`` steps, ``steps`` timed ones, ``steps`` profiled ones of ``step``, each
    followed by ``end(loss)`` in its phase "end"."""
    def once(clock: Ranges) -> None:
        with clock.step():
            loss = step(clock)
            with clock.phase("end"):
                end(loss)

    for _ in range(warmup):
        once(Ranges())
    timed = Ranges()
    for _ in range(steps):
        once(timed)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            once(Ranges())
    with tempfile.TemporaryDirectory() as tmp:
        path = (trace_to or Path(tmp)) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = chrome_events(json.loads(path.read_text()))
    rows = [(e.key, e.self_cpu_time_total, e.count) for e in prof.key_averages()]
    return Profiled(summarise(events), summarise(timed.events),
                    [(name, us / 1e3 / steps, calls / steps)
                     for name, us, calls in top_host(rows, TOP)])


def top_host(rows: Iterable[tuple[str, float, int]], n: int) -> list[tuple[str, float, int]]:
    """The ``n`` host ops and ranges of most self CPU time from (name, self CPU us, calls)
    rows (the profiler's ``key_averages``), this script's own phase ranges left out, and a
    range named per module ("FSDP::pre_forward (decoder.layers.1)") summed over its modules
    ("FSDP::pre_forward (per module)")."""
    sums: dict[str, tuple[float, int]] = {}
    for name, us, calls in rows:
        if name.startswith(PREFIX) or us <= 0:
            continue
        key = PER_MODULE.sub(" (per module)", name)
        had = sums.get(key, (0.0, 0))
        sums[key] = (had[0] + us, had[1] + calls)
    ranked = sorted(sums.items(), key=lambda item: item[1][0], reverse=True)[:n]
    return [(name, us, calls) for name, (us, calls) in ranked]


def plan_parts(spec_path: Path, batch: int, seq: int, fsdp: bool, row: str) -> dict[str, float]:
    """``tfgraph plan``'s ``step.time_parts`` (ms) for the step on one ``row`` GPU, eager
    kernels (benchmarks/plan_step.py: in-process, as ``plan ... --json``), and "step": the
    parts the step covers (forward + backward; with FSDP2 the whole step time)."""
    from plan_step import Step, plan_of, seconds_of

    step = Step(str(spec_path), batch, seq, "bfloat16", zero=3 if fsdp else 0, optimizer=fsdp,
                kernels="eager")
    result = plan_of(step, row)
    parts = {k: float(v) * 1e3 for k, v in result["step"]["time_parts"].items()}
    return {**parts, "step": seconds_of(result, step) * 1e3}


def phase_line(name: str, got: Figures, bare: Figures | None, plan_ms: float | None,
               cuda: bool) -> str:
    line = f"  {name:9} wall {got.wall_ms:7.2f} ms"
    if cuda:
        line += (f", device busy {got.busy_ms:7.2f} ms (idle {got.idle_ms:7.2f}), "
                 f"{got.kernels:5d} kernels")
    if plan_ms is not None:
        line += f", plan {plan_ms:.2f}" if plan_ms >= 1 else f", plan {plan_ms:.3g}"
    if bare is not None:
        line += f"; unprofiled wall {bare.wall_ms:.2f}"
    return line


def report(name: str, got: Profiled, parts: dict[str, float] | None, cuda: bool) -> list[str]:
    lines = [f"{name}:"]
    for phase in [*PHASES, "step"]:
        if phase in got.figures:
            plan_ms = None if parts is None else parts.get(phase)
            lines.append(phase_line(phase, got.figures[phase], got.unprofiled.get(phase),
                                    plan_ms, cuda))
    if parts is not None and parts.get("fsdp_copies"):
        lines.append(f"  (plan: fsdp_copies {parts['fsdp_copies']:.2f} ms, in the step's "
                     "total, not in a phase's)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=None,
                        help="default specs/llama.yaml on CUDA, specs/tiny-llama.yaml without")
    parser.add_argument("--batch", type=int, default=None, help="default 4 (CPU 2)")
    parser.add_argument("--seq", type=int, default=None, help="default 1024 (CPU 32)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3, help="timed, then profiled, steps")
    parser.add_argument("--trace", type=Path, default=None,
                        help="keep the Chrome traces (plain/, fsdp2/) in this folder")
    args = parser.parse_args(argv)
    import torch.distributed as dist
    import train_distributed as td
    from plan_step import gpu_for_card

    cuda = torch.cuda.is_available()
    spec_path = (args.spec or ROOT / "specs" / ("llama.yaml" if cuda else "tiny-llama.yaml")
                 ).resolve()
    batch = args.batch or (4 if cuda else 2)
    seq = args.seq or (1024 if cuda else 32)
    spec = tfgraph.load_spec(spec_path)
    if cuda:
        card = torch.cuda.get_device_name(0)
        row = gpu_for_card(card)
        print(f"card {card} (--gpu {row}), torch {torch.__version__}, {spec_path.name}, batch "
              f"{batch} x {seq}, bf16; {args.warmup} warm-up, {args.steps} timed, "
              f"{args.steps} profiled steps; figures: means over the profiled steps")
        torch.cuda.set_device(0)
    else:
        row = "h100"
        torch.set_num_threads(1)
        print(f"CPU SMOKE, NOT A MEASUREMENT: {spec_path.name}, batch {batch} x {seq}, bf16 on "
              "the CPU, CPU activities only; device figures need CUDA; the plan's parts are "
              "the H100's, not comparable")
    device = "cuda" if cuda else "cpu"
    if args.trace is not None:
        args.trace.mkdir(parents=True, exist_ok=True)

    def sync(_: Any) -> None:
        if cuda:
            torch.cuda.synchronize()

    def trace(name: str) -> Path | None:
        if args.trace is None:
            return None
        (args.trace / name).mkdir(exist_ok=True)
        return args.trace / name

    lines: list[str] = []
    start = time.perf_counter()
    parts = {fsdp: None if row is None else plan_parts(spec_path, batch, seq, fsdp, row)
             for fsdp in (False, True)}
    plain = run_profiled(step_host.plain_step(spec, device, batch, seq), sync, cuda,
                         args.warmup, args.steps, trace("plain"))
    lines += report("plain eager step (forward + loss, backward; zero_grad in backward's "
                    "window)", plain, parts[False], cuda)
    if cuda:
        torch.cuda.empty_cache()

    def example_end(loss: torch.Tensor) -> None:
        """examples/train_distributed.py's tail of a step: the loss all-reduced, read."""
        shown = loss.detach().clone()
        dist.all_reduce(shown)
        shown /= dist.get_world_size()
        shown.item()
        sync(None)

    td.start_group(300.0)
    try:
        fsdp2 = run_profiled(step_host.fsdp2_step(spec, True, device, batch, seq), example_end,
                             cuda, args.warmup, args.steps, trace("fsdp2"))
    finally:
        dist.destroy_process_group()
    lines += report("FSDP2 step (examples/train_distributed.py: bf16 params / fp32 master, "
                    "AdamW foreach; zero_grad in forward's window)", fsdp2, parts[True], cuda)
    lines.append(f"FSDP2 step: top {TOP} host ops and ranges by self CPU time, per profiled "
                 "step (ms, calls):")
    lines += [f"  {ms:8.2f} ms {calls:7.0f}x  {name}" for name, ms, calls in fsdp2.top]
    if not cuda:
        lines.append("device busy and idle figures need CUDA (this was a CPU smoke run)")
    lines.append(f"({time.perf_counter() - start:.0f} s in all)")
    for line in lines:
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
