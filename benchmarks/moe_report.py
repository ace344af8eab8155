"""Compile + report time of DeepSeek-V3 (specs/deepseek-v3.yaml, 671B parameters, multi-head
latent attention, 256 routed experts + 1 shared, top-8, 3 dense layers) at 16, 61 and 244 layers.

    python benchmarks/moe_report.py [--repeats 3]

Each measurement runs in a fresh Python process (imports done before the clock starts, sympy's
caches cold); the median over ``--repeats`` processes is printed, as wall time and CPU time.
The time is ``tfgraph.compile(spec)`` (lower + lint) plus ``graph.report(batch=1, seq=4096)``
(every figure: total and active parameters, top-k and all-expert FLOPs, the formulas in the
spec's symbols E, k, d_e, E_sh, L_dense). The goal (issue 10): ``report`` of the 61-layer
(671B-class) spec under 1 s, with a cost linear in the number of layers (the layer-linearity
check of benchmarks/compile.py: the marginal CPU cost per layer from 16 to 61 layers and from
61 to 244 layers should agree).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "deepseek-v3.yaml"
LAYERS = (16, 61, 244)
BATCH, SEQ = 1, 4096
GOAL_LAYERS, GOAL_SECONDS = 61, 1.0


def _worker(layers: int) -> dict[str, object]:
    import time

    import tfgraph
    from tfgraph.spec.schema import Spec

    data = tfgraph.load_spec(SPEC).model_dump()
    data["layers"] = layers
    spec = Spec.model_validate(data)
    t0, c0 = time.perf_counter(), time.process_time()
    graph = tfgraph.compile(spec)
    t1 = time.perf_counter()
    rep = graph.report(batch=BATCH, seq=SEQ)
    t2, c2 = time.perf_counter(), time.process_time()
    return {"compile": t1 - t0, "report": t2 - t1, "cpu": c2 - c0, "nodes": len(graph),
            "params": rep["params"], "active": rep["params_active"],
            "forward": rep["flops"]["forward"], "all": rep["flops"]["forward_all_experts"]}


def _fresh(layers: int) -> dict[str, object]:
    out = subprocess.run([sys.executable, __file__, "--worker", str(layers)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(runs: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker)))
        return 0
    print(f"tfgraph compile + report: {SPEC.name} at batch {BATCH}, seq {SEQ}; median of "
          f"{args.repeats} fresh processes")
    print(f"{'layers':>6} {'nodes':>6} {'params':>17} {'active':>16} {'compile s':>10} "
          f"{'report s':>9} {'total s':>8} {'cpu s':>6} {'all/top-k FLOPs':>16}")
    totals: dict[int, float] = {}
    cpus: dict[int, float] = {}
    for layers in LAYERS:
        runs = [_fresh(layers) for _ in range(args.repeats)]
        total = totals[layers] = statistics.median(
            float(r["compile"]) + float(r["report"]) for r in runs)  # type: ignore[arg-type]
        cpu = cpus[layers] = _median(runs, "cpu")
        r0 = runs[0]
        ratio = float(r0["all"]) / float(r0["forward"])  # type: ignore[arg-type]
        print(f"{layers:>6} {r0['nodes']:>6} {r0['params']:>17,} {r0['active']:>16,} "
              f"{_median(runs, 'compile'):>10.3f} {_median(runs, 'report'):>9.3f} "
              f"{total:>8.3f} {cpu:>6.3f} {ratio:>15.2f}x")
    a, b, c = LAYERS
    low = (cpus[b] - cpus[a]) / (b - a) * 1e3
    high = (cpus[c] - cpus[b]) / (c - b) * 1e3
    print(f"marginal CPU cost per layer: {low:.2f} ms ({a}->{b} layers), {high:.2f} ms "
          f"({b}->{c}); ratio {high / low:.2f} (1.00 = linear in layers)")
    # judged on CPU time: one thread's work, which wall time equals on a quiet machine and
    # exceeds by the waiting on a loaded one
    met = cpus[GOAL_LAYERS] < GOAL_SECONDS
    print(f"goal: {GOAL_LAYERS} layers under {GOAL_SECONDS:.0f} s of CPU: "
          f"{'met' if met else 'MISSED'} ({cpus[GOAL_LAYERS]:.3f} s CPU, "
          f"{totals[GOAL_LAYERS]:.3f} s wall)")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
