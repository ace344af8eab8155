"""What depth costs past the compile: ``to_torch`` (the module), its model.py source and
``plan --kernels eager`` (the module's kernel census) at 64, 256 and 1,024 layers.

    python benchmarks/depth.py [--repeats 3]

The workload: specs/tiny-llama.yaml (d_model 64) with its layer count set to 64, 256 and 1,024
(the largest a spec may have): the sizes are tiny, so what is timed is the per-layer
bookkeeping, where an accidental quadratic shows (a review found three in the source
renderer and the module's construction: 1,024 layers took 54 s to `build --to torch`).
Each measurement runs in a fresh Python process, imports done before the clock starts, the
best of ``--repeats`` kept (CPU time: on a shared machine other jobs only add time).

Goal (printed with its verdict): no quadratic term, for each of the three jobs and each step
(64 -> 256, 256 -> 1,024): 4 times the layers in less than 8 times the CPU time, the
geometric middle between linear (x4) and quadratic (x16). Module construction sits a little
above x4 (x4.5-6.5 here): Python's allocator and collector over tens of thousands of small
objects, not a loop over layers (profiled with the collector off: every function x4-6 of
tiny absolute times).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "specs" / "tiny-llama.yaml"
LAYERS = (64, 256, 1024)
JOBS = ("module", "source", "plan_eager")
GOAL_RATIO = 8.0


def _worker(layers: int) -> dict[str, float]:
    import tfgraph
    from tfgraph.exporters import to_torch
    from tfgraph.exporters.torch.kernels import kernel_source
    from tfgraph.exporters.torch.source import generate_source
    from tfgraph.parallel.gpus import gpu
    from tfgraph.parallel.layout import Layout
    from tfgraph.parallel.planner import plan

    spec = tfgraph.load_spec(SPEC).model_copy(update={"layers": layers})
    graph = tfgraph.compile(spec)
    loss = tfgraph.compile(spec, loss=True)
    out: dict[str, float] = {}
    for job in JOBS:
        start = time.process_time()
        if job == "module":
            to_torch(graph, device="meta")
        elif job == "source":
            generate_source(graph)
        else:
            plan(loss, Layout(micro_batch=1, global_batch=1, seq=64, dtype=loss.dtype),
                 gpu("h100"), kernels=kernel_source(loss))
        out[job] = time.process_time() - start
    return out


def _fresh(layers: int) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--worker", str(layers)],
                          capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(_worker(args.worker)))
        return 0
    best: dict[int, dict[str, float]] = {}
    print(f"{'layers':>6} " + " ".join(f"{job + ' s':>12}" for job in JOBS))
    for layers in LAYERS:
        runs = [_fresh(layers) for _ in range(args.repeats)]
        best[layers] = {job: min(r[job] for r in runs) for job in JOBS}
        print(f"{layers:>6} " + " ".join(f"{best[layers][job]:>12.3f}" for job in JOBS))
    ok = True
    for low, high in zip(LAYERS, LAYERS[1:]):
        ratios = {job: best[high][job] / best[low][job] for job in JOBS}
        ok &= all(r < GOAL_RATIO for r in ratios.values())
        print(f"x{high // low} layers ({low} -> {high}): " +
              ", ".join(f"{job} x{r:.2f}" for job, r in ratios.items()))
    print(f"goal: no quadratic term (x4 layers in < x{GOAL_RATIO:g} CPU time; quadratic: x16): "
          f"{'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
