"""Time of ``tfgraph plan --search`` on GPT-3 175B over 1,024 GPUs (issue 13's goal: under 2 s,
and the top layout fits in 80 GB).

    python benchmarks/plan_search.py [--repeats 3]

The command timed is

    tfgraph plan specs/gpt3-175b.yaml --gpus 1024 --search --json --global-batch 1536 --seq 2048

two ways, median of ``--repeats`` each:
- in-process: a fresh Python process per round with tfgraph and the plan command imported
  before the clock starts (sympy's caches cold), then the command run through click
  (``tfgraph.cli.main``): load the spec, compile the training graph, enumerate and plan every
  layout, print the JSON;
- subprocess: the command line itself, Python's start-up and imports included (what a user
  waits for), with Python's bytecode cache in use as a user's shell has it (one untimed run
  first writes it; a sandbox's PYTHONDONTWRITEBYTECODE is left out of the runs' environment).

Both must print the same JSON. There is no peer for this figure: the other estimators (Megatron-
LM's ``theoretical_memory_usage.py``, the EleutherAI calculator, llm-analysis, DeepSpeed's ZeRO
estimator) evaluate one layout from closed forms and none enumerates layouts, so the time is
judged against the issue's goal only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["plan", str(ROOT / "specs" / "gpt3-175b.yaml"), "--gpus", "1024", "--search", "--json",
        "--global-batch", "1536", "--seq", "2048"]
GOAL_SECONDS = 2.0
GOAL_MEMORY = 80 * 10**9


def _in_process_worker() -> None:
    """One round in this (fresh) process: imports first, then the clock around the command."""
    import contextlib
    import io

    import tfgraph  # noqa: F401
    import tfgraph.commands.plan  # noqa: F401
    import tfgraph.parallel.search  # noqa: F401
    from tfgraph.cli import main

    out = io.StringIO()
    t0, c0 = time.perf_counter(), time.process_time()
    with contextlib.redirect_stdout(out):
        main(ARGS, standalone_mode=False)
    t1, c1 = time.perf_counter(), time.process_time()
    print(json.dumps({"wall": t1 - t0, "cpu": c1 - c0, "output": out.getvalue()}))


def _phases_worker() -> None:
    """Where the in-process time goes, phase by phase, in this (fresh) process: the same work
    as the command through the API (CPU seconds, imports done first)."""
    import tfgraph
    from tfgraph.parallel.gpus import gpu
    from tfgraph.parallel.layout import Layout
    from tfgraph.parallel.search import search
    from tfgraph.parallel.units import units

    marks = [time.process_time()]
    spec = tfgraph.load_spec(ROOT / "specs" / "gpt3-175b.yaml")
    graph = tfgraph.compile(spec.model_copy(update={"dtype": "bfloat16"}), loss=True)
    marks.append(time.process_time())
    units(graph)
    marks.append(time.process_time())
    ranked = search(graph, 1024, Layout(global_batch=1536, seq=2048), gpu(), "fused", 10)
    marks.append(time.process_time())
    json.dumps(ranked, indent=2)
    marks.append(time.process_time())
    names = ("load + compile (loss graph)", "units (per-op costs by split)",
             "search (enumerate + plan)", "JSON")
    print(json.dumps({n: b - a for n, a, b in zip(names, marks, marks[1:])}))


def _worker(flag: str) -> dict[str, object]:
    proc = subprocess.run([sys.executable, __file__, flag], capture_output=True, text=True,
                          check=True, env=_user_env())
    data: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return data


def _in_process() -> tuple[float, float, str]:
    data = _worker("--worker")
    wall, cpu, output = data["wall"], data["cpu"], data["output"]
    assert isinstance(wall, float) and isinstance(cpu, float) and isinstance(output, str)
    return wall, cpu, output


def _command() -> list[str]:
    exe = shutil.which("tfgraph", path=str(Path(sys.executable).parent)) or shutil.which(
        "tfgraph")
    return [exe] if exe else [sys.executable, "-m", "tfgraph"]


def _children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _user_env() -> dict[str, str]:
    """This environment as a user's shell has it: Python writes and reuses its bytecode cache
    (``pip install`` compiles a wheel's modules when it installs them; an editable checkout's
    are compiled by the first run). A sandbox's PYTHONDONTWRITEBYTECODE would otherwise make
    every run compile tfgraph's modules from source again."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _subprocess() -> tuple[float, float, str]:
    t0, c0 = time.perf_counter(), _children_cpu()
    proc = subprocess.run([*_command(), *ARGS], capture_output=True, text=True, check=True,
                          env=_user_env())
    return time.perf_counter() - t0, _children_cpu() - c0, proc.stdout


def _layout(r: dict[str, object]) -> str:
    lay = r["layout"]
    assert isinstance(lay, dict)
    return (f"tp {lay['tp']}, pp {lay['pp']} (vpp {lay.get('vpp', 1)}), dp {lay['dp']}, "
            f"ZeRO {lay['zero']}, "
            f"sp {'on' if lay['sp'] else 'off'}, recompute {lay['recompute']}, micro-batch "
            f"{lay['micro_batch']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--phases", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _in_process_worker()
        return
    if args.phases:
        _phases_worker()
        return
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from machine import load_average

    _subprocess()  # untimed: the bytecode cache written, as after an install (``_user_env``)
    inner = [_in_process() for _ in range(args.repeats)]
    outer = [_subprocess() for _ in range(args.repeats)]
    phases = _worker("--phases")
    outputs = {o for *_, o in inner} | {o for *_, o in outer}
    same = len(outputs) == 1
    ranked = json.loads(inner[0][2])
    wall = statistics.median(w for w, _, _ in inner)
    cpu = statistics.median(c for _, c, _ in inner)
    sub = statistics.median(w for w, _, _ in outer)
    sub_cpu = statistics.median(c for _, c, _ in outer)
    print(f"$ tfgraph {' '.join(ARGS[:1] + ['specs/gpt3-175b.yaml'] + ARGS[2:])}")
    print(f"{os.cpu_count()} CPUs, {load_average()}; median of {args.repeats}")
    print(f"  in-process (imports done, fresh process)  {wall:.3f} s wall, {cpu:.3f} s CPU  "
          f"(runs {', '.join(f'{w:.3f}' for w, _, _ in inner)})")
    print("  subprocess (python start + imports; bytecode cached, one untimed run first)")
    print(f"                                             {sub:.3f} s wall, {sub_cpu:.3f} s CPU  "
          f"(runs {', '.join(f'{w:.3f}' for w, _, _ in outer)})")
    print("  in-process CPU by phase (one fresh process): " + ", ".join(
        f"{name} {float(str(value)):.3f} s" for name, value in phases.items()))
    print(f"  same JSON from every run: {'yes' if same else 'NO'}")
    top = ranked[0]
    total = top["per_rank"]["memory"]["total"]
    step = top["step"]
    print(f"top layout: {_layout(top)}")
    print(f"  most loaded rank {total / 1e9:.2f} GB of {top['per_rank']['gpu_memory'] / 1e9:g} "
          f"GB ({top['gpu']}): {'fits' if top['per_rank']['fits'] else 'does NOT fit'}; "
          f"{step['time_s']:.2f} s/step, MFU {step['mfu']:.1%}, "
          f"{step['tokens_per_s']:,.0f} tokens/s")
    print(f"  {len(ranked)} layouts listed, all fitting: "
          f"{'yes' if all(r['per_rank']['fits'] for r in ranked) else 'NO'}")
    fits = top["per_rank"]["fits"] and total <= GOAL_MEMORY
    for clock, a, b in (("wall", wall, sub), ("CPU", cpu, sub_cpu)):
        met = max(a, b) < GOAL_SECONDS and fits
        print(f"goal: under {GOAL_SECONDS:g} s and the top layout fits in 80 GB, on {clock} "
              f"time: {'met' if met else 'NOT met'} (in-process {a:.3f} s, subprocess "
              f"{b:.3f} s, top {total / 1e9:.2f} GB)")
    print("peer: none; no other estimator enumerates layouts (Megatron-LM's "
          "theoretical_memory_usage.py, the EleutherAI calculator, llm-analysis and DeepSpeed's "
          "ZeRO estimator evaluate one given layout), so only the issue's goal is compared")


if __name__ == "__main__":
    main()
