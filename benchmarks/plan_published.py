"""``tfgraph plan``'s step time against published training runs (issue 26 item 4).

    python benchmarks/plan_published.py [--no-search] [--measured FILE ...]

For each run: the planner's predicted per-GPU throughput over the achieved one, counted the way
the paper counts it. Both use the paper's own FLOP formula, so the ratio is achieved step time
/ predicted step time; nothing is fitted per run (the GPU's rates are the cited table of
``tfgraph/parallel/gpus.py``, the rules ``tfgraph/parallel/timing.py``):

- Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using
  Megatron-LM"), Table 1, every row: GPT models of 1.7B-1T parameters on A100 80GB (Selene),
  sequence 2048, vocabulary 51200, fp16, full activation recomputation, Megatron's unfused
  attention. Layouts, micro-batch and interleaving from the paper's own scripts
  (Megatron-LM ``examples/sc21/run_table_1.sh``: MBS, GBS, TP, PP,
  ``--num-layers-per-virtual-pipeline-stage``). Achieved: teraFLOP/s per GPU with their
  formula 96 B s l h^2 (1 + s / (6h) + V / (16 l h)), which counts the recomputed forward.
- Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"),
  Tables 3 and 5: 22B, 175B, 530B, 1T with sequence parallelism and selective recomputation on
  A100 80GB; achieved MFU with 72 B s l h^2 (1 + s / (6h) + V / (12 l h)) (their HFU beside
  it). Micro-batch 1, plain 1F1B (the paper names neither; assumed).
- The H100 measurement of issue 26: TinyLlama-1.1B sizes (``specs/llama.yaml``), bfloat16,
  batch 4 x 1024, forward + token cross-entropy + backward on one H100: 66.7 ms (tfgraph's
  torch module, SDPA attention); and the same step measured by benchmarks/gpu.py on two H200
  machines (61.0 and 69.9 ms, benchmarks/RESULTS.md "On a GPU") and on an H100 80GB HBM3
  (63.6 ms; 58.2 ms under ``torch.compile``, predicted with ``--kernels graph``; RESULTS.md,
  2026-11-27) and a third (69.0 ms; compiled 59.3 ms; examples/train_distributed.py's FSDP2
  step with AdamW 180.2 ms, predicted as the plan's whole step at ZeRO 3); on 2026-11-28 a
  third H200 (62.0 ms; compiled 55.7; FSDP2 140.6) and benchmarks/step_profile.py's plain and
  FSDP2 steps at batch 8-32 x 1024 (H200; 16 x 1024 on an H100), where the FSDP2 step turns
  from host-bound to device-bound. A row whose plan says ``step.host_bound``
  (tfgraph/parallel/host.py) is marked, and the summary counts the rows without them beside
  all of them. Predicted: the plan's
  forward + backward time (the measurements have no optimizer step). The plan times one
  kernel per graph op at the fused rates; the measured module ran eagerly, so these rows
  also measure what eager execution costs beyond that. ``--measured FILE`` adds the rows
  ``benchmarks/gpu.py --steps plan`` writes on a GPU (card, date and source in each): the same
  eager step, the step under ``torch.compile``, and examples/train_distributed.py's FSDP2 step
  with AdamW on one GPU (predicted: the plan's whole step at ZeRO 3), each predicted by
  ``benchmarks/plan_step.py`` for the layout it ran.

Every published run's spec carries attention dropout 0.1 (``attention.dropout``), as Megatron-LM
ran them (its ``--attention-dropout`` default, 0.1; Korthikanti's 5as/h term counts its mask
and output), so the plan itself charges it: with ``--attention unfused`` (Megatron's
``FusedScaleMaskSoftmax`` then dropout) one more memory-bound pass over the weights per layer
each way (forward: read the weights, write the dropped-out ones and a one-byte mask;
backward: read the gradient and the mask, write the gradient; again in the recomputed
forward), and its memory keeps the mask and the dropped-out weights
(``tfgraph/parallel/timing.py``, ``units.py``). The H100 row is tfgraph's own module (no
attention dropout: the spec has none).

Data parallelism as Megatron-LM's ``examples/sc21/run_table_1.sh`` ran each row
(``--DDP-impl``): the 1.7B to 18.4B rows with ``torch``, PyTorch's DistributedDataParallel,
which all-reduces the 16-bit ``.grad`` of the fp16 module bucket by bucket under the last
micro-batch's backward (Megatron's ``no_sync`` over the earlier ones): ``--grad-reduce
overlap``, 16-bit gradients (``--states mixed``); the 39.1B to 1T rows with ``local``,
Megatron's own, which all-reduced its fp32 ``main_grad`` buffer once the whole
forward-backward had finished (``train_step``: "All-reduce if needed"): ``--grad-reduce
after``, ``--states megatron``. Korthikanti's runs have no data parallelism.

Then ``--search`` over each Table 1 / Korthikanti run's GPUs and batch: whether the published
layout, or one within 5% of its predicted time, is among the 5 fastest that fit (where it is
not, under the paper's features, the time parts it loses on), and how many runs are. And the time
of ``plan --search`` for GPT-3 175B on 1,024 GPUs in-process (goal < 2 s; benchmarks/
plan_search.py times the command itself).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT))  # an installed tfgraph first (its tfgraph.exporters); else this checkout
sys.path.insert(0, str(ROOT / "benchmarks"))  # plan_step, shared with gpu.py

import tfgraph  # noqa: E402
from tfgraph.parallel.gpus import gpu  # noqa: E402
from tfgraph.parallel.layout import Layout  # noqa: E402
from tfgraph.parallel.planner import plan  # noqa: E402
from tfgraph.parallel.search import search  # noqa: E402

from plan_step import (Measured, Step, plan_of, predicted_s, read_measured,  # noqa: E402
                       seconds_of)

SEQ, VOCAB = 2048, 51200
A100 = gpu("a100-80gb")
A100_PEAK = 312e12
GOAL = 0.15


@dataclass(frozen=True)
class Run:
    name: str
    hidden: int
    heads: int
    layers: int
    tp: int
    pp: int
    gpus: int
    micro_batch: int
    global_batch: int
    vpp: int
    achieved: float
    """Narayanan: TFLOP/s per GPU; Korthikanti: MFU."""
    source: str


# Narayanan et al. 2021 Table 1 (achieved teraFLOP/s per GPU) with run_table_1.sh's settings;
# vpp = layers / (pp x num-layers-per-virtual-pipeline-stage).
NARAYANAN = [
    Run("1.7B", 2304, 24, 24, 1, 1, 32, 16, 512, 1, 137, "N21"),
    Run("3.6B", 3072, 32, 30, 2, 1, 64, 16, 512, 1, 138, "N21"),
    Run("7.5B", 4096, 32, 36, 4, 1, 128, 16, 512, 1, 142, "N21"),
    Run("18.4B", 6144, 48, 40, 8, 1, 256, 8, 1024, 1, 135, "N21"),
    Run("39.1B", 8192, 64, 48, 8, 2, 512, 4, 1536, 1, 138, "N21"),
    Run("76.1B", 10240, 80, 60, 8, 4, 1024, 2, 1792, 3, 140, "N21"),
    Run("145.6B", 12288, 96, 80, 8, 8, 1536, 2, 2304, 2, 148, "N21"),
    Run("310.1B", 16384, 128, 96, 8, 16, 1920, 1, 2160, 2, 155, "N21"),
    Run("529.6B", 20480, 128, 105, 8, 35, 2520, 1, 2520, 3, 163, "N21"),
    Run("1008.0B", 25600, 160, 128, 8, 64, 3072, 1, 3072, 1, 163, "N21"),
]
# Korthikanti et al. 2022 Table 3 (layouts, batch) and Table 5 (MFU; HFU in the comment).
KORTHIKANTI = [
    Run("22B", 6144, 64, 48, 8, 1, 8, 1, 4, 1, 0.415, "K22"),  # HFU 0.437
    Run("175B", 12288, 96, 96, 8, 8, 64, 1, 64, 1, 0.514, "K22"),  # HFU 0.528
    Run("530B", 20480, 128, 105, 8, 35, 280, 1, 280, 1, 0.560, "K22"),  # HFU 0.570
    Run("1T", 25600, 160, 128, 8, 64, 512, 1, 512, 1, 0.563, "K22"),  # HFU 0.570
]
# Measured single-GPU steps: TinyLlama-1.1B sizes, bf16, batch 4 x 1024, forward + token
# cross-entropy + backward of tfgraph's torch module run eagerly (no torch.compile), SDPA
# attention. More rows (benchmarks/gpu.py --steps plan writes them, with the compiled step and
# examples/train_distributed.py's FSDP2 step) come in with --measured FILE.
TINYLLAMA_STEP = Step("specs/llama.yaml", batch=4, seq=1024, dtype="bfloat16", kernels="eager")
def _profiled(gpu_name: str, card: str, batch: int, plain_ms: float,
              fsdp2_ms: float) -> tuple[Measured, Measured]:
    """The plain and the FSDP2 step of one ``step_profile.py --batch`` run (2026-11-28)."""
    step = replace(TINYLLAMA_STEP, batch=batch)
    source = f"benchmarks/step_profile.py --batch {batch} (RESULTS.md, FSDP2 profiled)"
    label = f"{gpu_name.upper()} TinyLlama-1.1B b{batch}"
    return (Measured(label, step, plain_ms, "eager module", card, gpu_name, "2026-11-28",
                     source),
            Measured(f"{label} FSDP2", replace(step, zero=3, optimizer=True), fsdp2_ms,
                     "train_distributed.py FSDP2, AdamW", card, gpu_name, "2026-11-28", source))


MEASURED = [
    Measured("H100 TinyLlama-1.1B", TINYLLAMA_STEP, 66.7, "eager module", "NVIDIA H100",
             "h100", "2026-11", "issue 26's measurement"),
    Measured("H200 TinyLlama-1.1B", TINYLLAMA_STEP, 61.0, "eager module", "NVIDIA H200",
             "h200", "2026-11-26", "benchmarks/gpu.py (RESULTS.md, \"On a GPU\")"),
    Measured("H200 TinyLlama-1.1B #2", TINYLLAMA_STEP, 69.9, "eager module", "NVIDIA H200",
             "h200", "2026-11-26", "benchmarks/gpu.py on a second machine (RESULTS.md)"),
    Measured("H100 TinyLlama-1.1B #2", TINYLLAMA_STEP, 63.6, "eager module",
             "NVIDIA H100 80GB HBM3", "h100", "2026-11-27",
             "benchmarks/gpu.py --steps train (RESULTS.md, \"On a GPU ... H100\")"),
    Measured("H100 TinyLlama-1.1B compiled", replace(TINYLLAMA_STEP, kernels="graph"), 58.2,
             "torch.compile", "NVIDIA H100 80GB HBM3", "h100", "2026-11-27",
             "benchmarks/gpu.py --steps train (RESULTS.md, \"On a GPU ... H100\")"),
    Measured("H100 TinyLlama-1.1B #3", TINYLLAMA_STEP, 69.0, "eager module",
             "NVIDIA H100 80GB HBM3", "h100", "2026-11-27",
             "benchmarks/gpu.py --steps train,plan (RESULTS.md, \"third H100 run\")"),
    Measured("H100 TinyLlama-1.1B #3 compiled", replace(TINYLLAMA_STEP, kernels="graph"), 59.3,
             "torch.compile", "NVIDIA H100 80GB HBM3", "h100", "2026-11-27",
             "benchmarks/gpu.py --steps train,plan (RESULTS.md, \"third H100 run\")"),
    Measured("H100 TinyLlama-1.1B #3 FSDP2", replace(TINYLLAMA_STEP, zero=3, optimizer=True),
             180.2, "train_distributed.py FSDP2, AdamW", "NVIDIA H100 80GB HBM3", "h100",
             "2026-11-27", "benchmarks/gpu.py --steps plan (RESULTS.md, \"third H100 run\")"),
    Measured("H200 TinyLlama-1.1B #3", TINYLLAMA_STEP, 62.0, "eager module", "NVIDIA H200",
             "h200", "2026-11-28",
             "benchmarks/gpu.py --steps train,plan (RESULTS.md, FSDP2 profiled)"),
    Measured("H200 TinyLlama-1.1B #3 compiled", replace(TINYLLAMA_STEP, kernels="graph"), 55.7,
             "torch.compile", "NVIDIA H200", "h200", "2026-11-28",
             "benchmarks/gpu.py --steps train,plan (RESULTS.md, FSDP2 profiled)"),
    Measured("H200 TinyLlama-1.1B #3 FSDP2", replace(TINYLLAMA_STEP, zero=3, optimizer=True),
             140.6, "train_distributed.py FSDP2, AdamW", "NVIDIA H200", "h200", "2026-11-28",
             "benchmarks/gpu.py --steps plan (RESULTS.md, FSDP2 profiled)"),
    # The same steps at larger batches, where the host keeps ahead of the device
    # (benchmarks/step_profile.py --batch N's unprofiled step wall, mean of its timed steps)
    *(row for gpu_name, card, batch, plain_ms, fsdp2_ms in (
        ("h200", "NVIDIA H200", 16, 222.2, 255.4),
        ("h200", "NVIDIA H200", 32, 450.4, 473.9),
        ("h200", "NVIDIA H200", 8, 114.1, 183.9),
        ("h200", "NVIDIA H200", 12, 167.0, 198.9),
        ("h100", "NVIDIA H100 80GB HBM3", 16, 235.5, 277.6))
      for row in _profiled(gpu_name, card, batch, plain_ms, fsdp2_ms)),
]


def narayanan_flops(run: Run) -> float:
    b, s, l, h = run.global_batch, SEQ, run.layers, run.hidden
    return 96 * b * s * l * h * h * (1 + s / (6 * h) + VOCAB / (16 * l * h))


def korthikanti_flops(run: Run) -> float:
    b, s, l, h = run.global_batch, SEQ, run.layers, run.hidden
    return 72 * b * s * l * h * h * (1 + s / (6 * h) + VOCAB / (12 * l * h))


def graph_of(run: Run, dtype: str) -> Any:
    """The run's GPT (GPT-3's block, Megatron's padded vocabulary) as a training graph."""
    base = tfgraph.load_spec(ROOT / "specs" / "gpt3-175b.yaml")
    spec = base.model_copy(update={
        "name": f"gpt-{run.name.lower()}", "d_model": run.hidden, "layers": run.layers,
        "dtype": dtype,
        # Megatron-LM's --attention-dropout (default 0.1), as the runs used it
        "attention": base.attention.model_copy(update={"heads": run.heads,
                                                        "kv_heads": run.heads,
                                                        "head_dim": run.hidden // run.heads,
                                                        "dropout": 0.1}),
        "ffn": base.ffn.model_copy(update={"hidden": 4 * run.hidden}),
    })
    return tfgraph.compile(spec, loss=True)


# run_table_1.sh's DDP=torch rows (the module docstring). Megatron-LM's fp16 optimizer copies
# their 16-bit .grad into an fp32 .grad of its master weights: 20 bytes a parameter at the
# optimizer step, 4 more than --states mixed counts (the published layouts fit either way;
# --search's memory filter counts 16 for these rows).
TORCH_DDP = {"1.7B", "3.6B", "7.5B", "18.4B"}


def layout_of(run: Run) -> Layout:
    k22 = run.source == "K22"
    torch_ddp = run.source == "N21" and run.name in TORCH_DDP
    return Layout(tp=run.tp, pp=run.pp, dp=run.gpus // (run.tp * run.pp), vpp=run.vpp,
                  sp=k22, recompute="selective" if k22 else "full",
                  micro_batch=run.micro_batch, global_batch=run.global_batch, seq=SEQ,
                  dtype="bfloat16" if k22 else "float16",
                  states="mixed" if torch_ddp else "megatron",
                  grad_reduce="overlap" if torch_ddp else "after")


def predicted(run: Run) -> tuple[float, float, dict[str, Any]]:
    """(achieved step time, predicted step time, the plan) of a published run."""
    graph = graph_of(run, layout_of(run).dtype)
    result = plan(graph, layout_of(run), A100, attention="unfused")
    if run.source == "N21":
        real = narayanan_flops(run) / (run.gpus * run.achieved * 1e12)
    else:
        real = korthikanti_flops(run) / (run.gpus * A100_PEAK * run.achieved)
    return real, result["step"]["time_s"], result


def _features(run: Run) -> Any:
    """The layouts the run's software offered: Narayanan 2021's Megatron-LM, full
    recomputation, no sequence parallelism, no ZeRO; Korthikanti 2022's, sequence parallelism
    with selective recomputation, no ZeRO. Both: the interleaved schedule only past two
    pipeline stages (Megatron-LM's arguments.py: "pipeline-model-parallel size should be
    greater than 2 with interleaved schedule")."""
    k22 = run.source == "K22"
    return lambda lay: lay.zero == 0 and lay.sp == k22 and lay.recompute == (
        "selective" if k22 else "full") and (lay.vpp == 1 or lay.pp > 2)


def search_check(run: Run, published: dict[str, Any]) -> tuple[str, bool]:
    """Where the published layout's predicted time (``published``: its plan) stands in
    ``--search``'s top 5: over every layout, and over the layouts the paper's software offered
    (``_features``). Returns the line and whether the latter placed it (issue 26's goal); where
    it did not, the line says which time parts the published layout loses on against the
    fastest."""
    mine = published["step"]["time_s"]
    graph = graph_of(run, layout_of(run).dtype)
    base = Layout(global_batch=run.global_batch, seq=SEQ, dtype=layout_of(run).dtype)
    lay = layout_of(run)
    parts = []
    verdicts = []
    # the paper's software: its state convention and its gradient all-reduce after backward
    theirs = replace(base, states=lay.states, grad_reduce=lay.grad_reduce)
    for label, keep, start in (("every layout", None, base),
                               ("the paper's features", _features(run), theirs)):
        try:
            top = search(graph, run.gpus, start, A100, "unfused", 5, keep)
        except Exception as e:  # nothing fits in the memory model: say so
            parts.append(f"{label}: refused ({e})")
            verdicts.append(False)
            continue
        times = [r["step"]["time_s"] for r in top]
        same = [i + 1 for i, r in enumerate(top) if
                (r["layout"]["tp"], r["layout"]["pp"], r["layout"]["micro_batch"]) ==
                (lay.tp, lay.pp, lay.micro_batch)]
        near = [i + 1 for i, x in enumerate(times) if abs(x - mine) <= 0.05 * mine]
        best = top[0]["layout"]
        ok = bool(same or near)
        verdicts.append(ok)
        parts.append(
            f"{label}: {'yes' if ok else 'NO'} (published layout {mine:.2f} s; top 5 "
            f"{', '.join(f'{x:.2f}' for x in times)} s; its tp/pp/mb at {same or '-'}, within "
            f"5% at {near or '-'}; fastest tp {best['tp']} pp {best['pp']} mb "
            f"{best['micro_batch']} {best['recompute']}{' sp' if best['sp'] else ''} "
            f"ZeRO {best['zero']})")
    if not verdicts[-1] and parts[-1].startswith("the paper's"):
        parts.append(f"published - fastest: {_part_deltas(published, top[0])}")
    return "; ".join(parts), verdicts[-1]


def _part_deltas(published: dict[str, Any], fastest: dict[str, Any]) -> str:
    """The step-time parts where two plans differ by over 0.05 s, largest first (the
    forward, backward and recompute passes summed as compute)."""
    def parts(result: dict[str, Any]) -> dict[str, float]:
        got = dict(result["step"]["time_parts"])
        got["compute"] = sum(got.pop(k) for k in ("forward", "backward", "recompute"))
        return got
    mine, theirs = parts(published), parts(fastest)
    deltas = {k: mine[k] - theirs.get(k, 0.0) for k in mine}
    shown = sorted((d, k) for k, d in deltas.items() if abs(d) > 0.05)
    return ", ".join(f"{k} {d:+.2f} s" for d, k in reversed(shown))


def measured_rows(files: list[Path]) -> list[Measured]:
    """MEASURED and the rows of each ``--measured`` file (benchmarks/gpu.py --steps plan's
    JSON); a file's CPU smoke rows (no GPU table row) are named on stderr and left out."""
    rows = list(MEASURED)
    for path in files:
        try:
            found = read_measured(path)
        except (OSError, ValueError, KeyError, TypeError) as e:  # one line, exit 2
            print(f"--measured {path}: not a file of gpu.py --steps plan's rows "
                  f"({type(e).__name__}: {e})", file=sys.stderr)
            raise SystemExit(2) from None
        for row in found:
            if row.gpu is None:
                print(f"{path}: {row.label!r} left out: ran on {row.card}, which has no "
                      "--gpu row (a CPU smoke run is not a measurement)", file=sys.stderr)
            else:
                rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-search", action="store_true", help="skip the --search checks")
    parser.add_argument("--measured", type=Path, action="append", default=[], metavar="FILE",
                        help="also the measured steps of this JSON (benchmarks/gpu.py "
                             "--steps plan writes it); repeatable")
    args = parser.parse_args()
    measured = measured_rows(args.measured)  # a bad file refused before the long part
    rows: list[tuple[str, float, float, str]] = []
    host_bound: list[str] = []  # measured rows whose plan says step.host_bound
    print(f"{'run':<32} {'layout':<34} {'achieved':>10} {'predicted':>10} {'ratio':>6}  "
          "time parts (s)")
    plans: dict[str, dict[str, Any]] = {}  # each run's plan, for the --search lines below
    for run in NARAYANAN + KORTHIKANTI:
        real, mine, result = predicted(run)
        plans[f"{run.source} {run.name}"] = result
        ratio = real / mine
        lay = result["layout"]
        unit = "TFLOP/s" if run.source == "N21" else "MFU"
        achieved = run.achieved
        pred = achieved * ratio
        parts = result["step"]["time_parts"]
        shown = ", ".join(f"{k} {v:.2f}" for k, v in parts.items() if v > 0.005 * mine)
        layout_text = (f"t{lay['tp']} p{lay['pp']} d{lay['dp']} v{lay['vpp']} "
                       f"mb{lay['micro_batch']} m{lay['microbatches']}")
        fmt = "{:.1f}" if unit == "TFLOP/s" else "{:.3f}"
        print(f"{run.source + ' ' + run.name:<32} {layout_text:<34} "
              f"{fmt.format(achieved):>10} {fmt.format(pred):>10} {ratio:6.3f}  {shown}"
              f"{'' if result['per_rank']['fits'] else '  (plan: does not fit)'}")
        rows.append((f"{run.source} {run.name}", real, mine, unit))
    for row in measured:
        assert row.gpu is not None  # measured_rows keeps rows with a GPU table row only
        result = plan_of(row.step, row.gpu)
        real, mine = row.measured_ms / 1e3, seconds_of(result, row.step)
        where = "" if row in MEASURED else f"; {row.card}, {row.date}"
        if result["step"]["host_bound"]:  # tfgraph/parallel/host.py
            where += "; plan: host-bound"
        fused = ""
        if row.step.kernels == "eager":  # what one kernel per op would have predicted
            graph_s = predicted_s(replace(row.step, kernels="graph"), row.gpu)
            fused = f"; --kernels graph {graph_s * 1e3:.1f}ms"
        print(f"{row.label:<32} {row.layout_text():<34} "
              f"{real * 1e3:>8.1f}ms {mine * 1e3:>8.1f}ms {real / mine:6.3f}  "
              f"{row.step.what()} ({row.note}{where}{fused})")
        rows.append((row.label, real, mine, "ms"))
        if result["step"]["host_bound"]:
            host_bound.append(row.label)
    ratios = [r / m for _, r, m, _ in rows]
    worst = max(rows, key=lambda r: abs(r[1] / r[2] - 1))
    inside = sum(abs(x - 1) <= GOAL for x in ratios)
    timed = [r / m for label, r, m, _ in rows if label not in host_bound]
    print(f"predicted / achieved throughput: {min(ratios):.3f} to {max(ratios):.3f}; worst "
          f"{worst[0]} {worst[1] / worst[2]:.3f}; {inside} of {len(ratios)} rows within "
          f"+-{GOAL:.0%}; without the {len(host_bound)} the plan calls host-bound: "
          f"{sum(abs(x - 1) <= GOAL for x in timed)} of {len(timed)}")
    if not args.no_search:
        print("--search: is the published layout (or one within 5% of its predicted time) in "
              "the top 5?")
        missed = []
        for run in NARAYANAN + KORTHIKANTI:
            line, placed = search_check(run, plans[f"{run.source} {run.name}"])
            print(f"  {run.source} {run.name}: {line}")
            if not placed:
                missed.append(f"{run.source} {run.name}")
        runs = len(NARAYANAN + KORTHIKANTI)
        print(f"published layouts placed under the paper's features: {runs - len(missed)} of "
              f"{runs}{' (not: ' + ', '.join(missed) + ')' if missed else ''}")
    graph = tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "gpt3-175b.yaml").model_copy(
        update={"dtype": "bfloat16"}), loss=True)
    t0, c0 = time.perf_counter(), time.process_time()
    search(graph, 1024, Layout(global_batch=1536, seq=2048), gpu("h100"), "fused", 10)
    print(f"plan --search, GPT-3 175B on 1,024 H100s (in-process, graph compiled): "
          f"{time.perf_counter() - t0:.2f} s wall, {time.process_time() - c0:.2f} s CPU "
          f"(goal < 2 s; load average {', '.join(f'{x:.1f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    main()
