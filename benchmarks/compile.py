"""Compile + report time of a GPT-3 175B-sized spec at 12, 96 and 384 layers.

    python benchmarks/compile.py [--repeats 3] [--no-peer]

Each measurement runs in a fresh Python process (imports done before the clock starts, sympy's
caches cold), and the median over ``--repeats`` processes is printed, as wall time and as the
process's CPU time (linearity is judged on CPU time, which other jobs on a shared machine do
not inflate). tfgraph's time is ``tfgraph.compile(spec)`` (lower + lint) plus
``graph.report(batch=1, seq=2048)`` (every figure, the formulas in the spec's symbols included). The goal: 96 layers under 1 s on a 2-core machine,
with a cost linear in the number of layers.

The named peer, measured in the same run: the usual way to get the same two numbers with
PyTorch without allocating weights -- build Hugging Face ``GPT2LMHeadModel`` at the same sizes on
the meta device and run one forward under ``torch.utils.flop_counter.FlopCounterMode``. Its
parameter count and matmul FLOPs are checked against tfgraph's (they must be equal), and the
ratio peer time / tfgraph time is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEC = HERE / "specs" / "gpt3-175b.yaml"
LAYERS = (12, 96, 384)
BATCH, SEQ = 1, 2048
GOAL_LAYERS, GOAL_SECONDS = 96, 1.0


def _tfgraph_worker(layers: int) -> dict[str, object]:
    import time

    import tfgraph
    from tfgraph.spec import Spec

    data = tfgraph.load_spec(SPEC).model_dump()
    data["layers"] = layers
    spec = Spec.model_validate(data)
    t0, c0 = time.perf_counter(), time.process_time()
    graph = tfgraph.compile(spec)
    t1 = time.perf_counter()
    rep = graph.report(batch=BATCH, seq=SEQ)
    t2, c2 = time.perf_counter(), time.process_time()
    return {"compile": t1 - t0, "report": t2 - t1, "cpu": c2 - c0, "nodes": len(graph),
            "params": rep["params"], "matmul": rep["flops"]["matmul"]}


def _peer_worker(layers: int) -> dict[str, object]:
    import time

    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    import tfgraph

    spec = tfgraph.load_spec(SPEC)
    config = transformers.GPT2Config(
        n_embd=spec.d_model, n_layer=layers, n_head=spec.attention.heads,
        n_positions=spec.max_len, vocab_size=spec.vocab, activation_function="gelu",
        attn_implementation="eager")  # explicit matmuls: FlopCounterMode sees the products
    ids = torch.zeros((BATCH, SEQ), dtype=torch.long, device="meta")
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.device("meta"):
        model = transformers.GPT2LMHeadModel(config).eval()
    params = sum(p.numel() for p in model.parameters())
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(ids)
    t1, c1 = time.perf_counter(), time.process_time()
    return {"total": t1 - t0, "cpu": c1 - c0, "params": params,
            "matmul": counter.get_total_flops()}


def _fresh(kind: str, layers: int) -> dict[str, object]:
    """Run one worker in a new interpreter and return its JSON result."""
    out = subprocess.run([sys.executable, __file__, "--worker", kind, str(layers)],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _median(runs: list[dict[str, object]], key: str) -> float:
    return statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-peer", action="store_true", help="skip the PyTorch peer")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, layers = args.worker[0], int(args.worker[1])
        result = _tfgraph_worker(layers) if kind == "tfgraph" else _peer_worker(layers)
        print(json.dumps(result))
        return 0

    print(f"tfgraph compile + report: {SPEC.name} (d_model 12288, 96 heads, vocab 50257, learned "
          f"positions, max_len 2048, pre-norm, gelu) at batch {BATCH}, seq {SEQ}")
    print(f"median of {args.repeats} fresh processes; peer: Hugging Face GPT2LMHeadModel on the "
          f"meta device + one FlopCounterMode forward")
    header = (f"{'layers':>6} {'nodes':>6} {'params':>16} {'compile s':>10} {'report s':>9} "
              f"{'total s':>8} {'cpu s':>6} {'ms/layer':>9}")
    if not args.no_peer:
        header += f" {'peer s':>7} {'peer cpu s':>10} {'peer/tfgraph':>12} {'same numbers':>12}"
    print(header)
    totals: dict[int, float] = {}
    cpus: dict[int, float] = {}
    for layers in LAYERS:
        runs = [_fresh("tfgraph", layers) for _ in range(args.repeats)]
        compile_s, report_s = _median(runs, "compile"), _median(runs, "report")
        total = statistics.median(float(r["compile"]) + float(r["report"]) for r in runs)
        totals[layers] = total
        cpu = cpus[layers] = _median(runs, "cpu")
        line = (f"{layers:>6} {runs[0]['nodes']:>6} {runs[0]['params']:>16,} {compile_s:>10.3f} "
                f"{report_s:>9.3f} {total:>8.3f} {cpu:>6.3f} {1000 * total / layers:>9.2f}")
        if not args.no_peer:
            peer = [_fresh("peer", layers) for _ in range(args.repeats)]
            peer_s, peer_cpu = _median(peer, "total"), _median(peer, "cpu")
            same = peer[0]["params"] == runs[0]["params"] and \
                peer[0]["matmul"] == runs[0]["matmul"]
            line += (f" {peer_s:>7.3f} {peer_cpu:>10.3f} {peer_s / total:>11.1f}x "
                     f"{'yes' if same else 'NO':>12}")
        print(line, flush=True)

    # Linearity from CPU time: wall time on a shared 2-core machine carries other jobs' noise.
    low, mid, high = LAYERS
    slope_low = (cpus[mid] - cpus[low]) / (mid - low)
    slope_high = (cpus[high] - cpus[mid]) / (high - mid)
    print(f"marginal CPU cost per layer: {1000 * slope_low:.2f} ms ({low}->{mid} layers), "
          f"{1000 * slope_high:.2f} ms ({mid}->{high}); ratio {slope_high / slope_low:.2f} "
          f"(1.00 = linear in layers)")
    verdict = "met" if totals[GOAL_LAYERS] < GOAL_SECONDS else "NOT met"
    print(f"goal: {GOAL_LAYERS} layers under {GOAL_SECONDS:.0f} s: {verdict} "
          f"({totals[GOAL_LAYERS]:.3f} s wall, {cpus[GOAL_LAYERS]:.3f} s CPU)")
    print(f"load average while measuring: {', '.join(f'{x:.2f}' for x in os.getloadavg())} on "
          f"{os.cpu_count()} cores (wall times grow with other load; cpu s is this process only)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
