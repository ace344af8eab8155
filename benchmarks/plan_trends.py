"""``tfgraph plan`` against the trends Narayanan et al. 2021 state for their Figures 13-15: the
layouts of one model on 64 A100s, compared with each other (issue 26).

    python benchmarks/plan_trends.py

Table 1 (benchmarks/plan_published.py) checks one layout per model; these figures vary the
layout of one model, which is what ``plan --search`` ranks. The paper prints the figures as
plots, not numbers, so what is checked is what its text says of them (§5.4):

- Figure 13, a 161B GPT (32 layers, hidden 20480, 128 heads) over (pipeline, tensor) = (2, 32),
  (4, 16), (8, 8), (16, 4), (32, 2), batch 32 and 128: "we see peak performance when the
  tensor-parallel size is equal to the number of GPUs in a single node (8 with DGX A100 nodes)";
- Figure 14, a 5.9B GPT (32 layers, hidden 3840, 32 heads), tensor 1, (pipeline, data) = (2, 32)
  to (32, 2), batch 32 and 512: "for each batch size, the throughput decreases as the
  pipeline-parallel size increases";
- Figure 15, the same model, pipeline 1, (tensor, data) = (2, 32) to (32, 2), batch 32, 128 and
  512: the tensor-parallel all-reduce "dominates end-to-end training time, especially when
  communication needs to be performed across multi-GPU nodes", and a larger tensor-parallel
  size runs smaller GEMMs: read as throughput falling as the tensor-parallel size grows.

The layouts are those of Megatron-LM's ``examples/sc21/run_figure_1{3,4,5}.sh``: micro-batch 1,
full recomputation, ``--DDP-impl local`` (``--grad-reduce after``), no interleaving, fp16,
sequence 2048, vocabulary 51200, Megatron's unfused attention with dropout, as
plan_published.py plans Table 1's DDP=local rows. Throughput per GPU counts the paper's FLOP
formula, as Table 1. Where a tensor- or data-parallel group has several GPUs in each node
(the tensor groups of 16 and 32 in Figures 13 and 15, the data groups at tensor 1 to 4 in
Figures 14-15) it crosses nodes over that many NICs (``timing.link``; DGX A100: one 200 Gb/s NIC per GPU).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from plan_published import A100, SEQ, Run, graph_of, narayanan_flops  # noqa: E402

from tfgraph.parallel.layout import Layout  # noqa: E402
from tfgraph.parallel.planner import plan  # noqa: E402

GPUS = 64
SIZES = (2, 4, 8, 16, 32)
FIGURES: list[tuple[str, Run, str, tuple[int, ...], str]] = [
    # (figure, model, the axis swept against the other, batches, what the text says)
    ("13", Run("161B", 20480, 128, 32, 0, 0, GPUS, 1, 0, 1, 0, "N21"), "pp-tp", (32, 128),
     "peak at (pipeline 8, tensor 8)"),
    ("14", Run("5.9B", 3840, 32, 32, 1, 0, GPUS, 1, 0, 1, 0, "N21"), "pp-dp", (32, 512),
     "falls as the pipeline size grows"),
    ("15", Run("5.9B", 3840, 32, 32, 0, 1, GPUS, 1, 0, 1, 0, "N21"), "tp-dp", (32, 128, 512),
     "falls as the tensor size grows"),
]


def layout_of(axis: str, size: int, batch: int) -> Layout:
    """Megatron-LM's sc21 script's layout: ``size`` on the swept axis, the rest to its partner."""
    rest = GPUS // size
    tp, pp, dp = {"pp-tp": (rest, size, 1), "pp-dp": (1, size, rest),
                  "tp-dp": (size, 1, rest)}[axis]
    return Layout(tp=tp, pp=pp, dp=dp, recompute="full", micro_batch=1, global_batch=batch,
                  seq=SEQ, dtype="float16", states="megatron", grad_reduce="after")


def throughput(graph: Any, run: Run, lay: Layout) -> tuple[float, dict[str, float]]:
    """Predicted teraFLOP/s per GPU (the paper's formula over the plan's step) and time parts."""
    result = plan(graph, lay, A100, attention="unfused")
    step = result["step"]
    flops = narayanan_flops(Run(run.name, run.hidden, run.heads, run.layers, lay.tp, lay.pp,
                                GPUS, 1, lay.global_batch, 1, 0, "N21"))
    return flops / (GPUS * step["time_s"]) / 1e12, step["time_parts"]


def holds(figure: str, values: list[float]) -> bool:
    """Whether the predicted values (in SIZES order) follow the figure's stated trend."""
    if figure == "13":
        return max(range(len(values)), key=values.__getitem__) == SIZES.index(8)
    return all(a > b for a, b in zip(values, values[1:]))


def main() -> None:
    verdicts = []
    for figure, run, axis, batches, said in FIGURES:
        graph = graph_of(run, "float16")
        first, second = axis.split("-")
        print(f"Figure {figure}, {run.name} on {GPUS} A100s, ({first}, {second}) = "
              + ", ".join(f"({s}, {GPUS // s})" for s in SIZES) + f": the paper: {said}")
        for batch in batches:
            values = []
            exposed = []
            for size in SIZES:
                tflops, parts = throughput(graph, run, layout_of(axis, size, batch))
                values.append(tflops)
                exposed.append(parts["tp_exposed"] + parts["dp_exposed"])
            ok = holds(figure, values)
            verdicts.append(ok)
            print(f"  batch {batch:>3}: " + "  ".join(f"{v:6.1f}" for v in values)
                  + f"  TFLOP/s per GPU  {'follows' if ok else 'DOES NOT follow'} it"
                  + "  (tp + dp exposed s: " + ", ".join(f"{x:.2f}" for x in exposed) + ")")
    print(f"{sum(verdicts)} of {len(verdicts)} figure rows follow the paper's stated trend")


if __name__ == "__main__":
    main()
