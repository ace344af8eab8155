"""Rich tables of ``tfgraph plan``: one plan (per-rank memory, stages, step figures, formulas,
assumptions) or the ranking ``--search`` returns. Reads only the plan dicts
(``tfgraph.parallel.planner.plan``) and prints; the spec's name is escaped (``plain``).
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from tfgraph.cli_support import describe
from tfgraph.commands.compare import plain
from tfgraph.passes.formulas import pretty
from tfgraph.parallel.gpus import GB, GIB, Gpu
from tfgraph.spec.schema import Spec

MEMORY_KEYS = ("weights", "gradients", "optimizer", "activations", "temporary", "total")


def _console() -> Console:
    console = Console()
    if not console.is_terminal:  # piped: no terminal width to fit, do not cut at 80 columns
        console = Console(width=120)
    return console


def _gb(n: float) -> str:
    return f"{n / GB:,.2f} GB"


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f} GiB"


def _si(n: float, unit: str) -> str:
    """Decimal prefixes: 3.39e18 -> '3.39 EFLOP'."""
    for value, prefix in ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"),
                          (1e3, "k")):
        if abs(n) >= value:
            return f"{n / value:.2f} {prefix}{unit}"
    return f"{n:g} {unit}"


def layout_line(layout: dict[str, Any]) -> str:
    """``tp 8 x pp 8 x dp 16 = 1024 GPUs, ZeRO 1, sequence parallel, selective recompute``."""
    parts = [f"tp {layout['tp']} x pp {layout['pp']} x dp {layout['dp']} = "
             f"{layout['gpus']} GPUs"]
    if layout.get("vpp", 1) > 1:
        parts.append(f"interleaved, {layout['vpp']} chunks per stage")
    if layout.get("stage_layers"):
        parts.append(f"stage layers {','.join(map(str, layout['stage_layers']))}")
    if layout["ep"] > 1:
        parts.append(f"ep {layout['ep']}")
    parts.append(f"ZeRO {layout['zero']}")
    if layout["sp"]:
        parts.append("sequence parallel")
    parts.append(f"recompute {layout['recompute']}")
    parts.append(f"micro-batch {layout['micro_batch']} x {layout['microbatches']} per step, "
                 f"global batch {layout['global_batch']}, seq {layout['seq']}, "
                 + (f"tgt_seq {layout['tgt_seq']}, " if layout.get("tgt_seq") else "")
                 + f"{layout['dtype']}")
    return ", ".join(parts)


def assumptions(result: dict[str, Any]) -> str:
    """The footnote: every assumption the memory, time, MFU and tokens/s rest on (the plan's
    ``assumptions``, ``tfgraph.parallel.timing``)."""
    return "memory and time model (tfgraph/parallel/timing.py): " + "; ".join(
        f"{key}: {text}" for key, text in result["assumptions"].items())


def render_plan(result: dict[str, Any], spec: Spec, gpu: Gpu,
                console: Console | None = None) -> None:
    """Print one plan."""
    console = console or _console()
    rank, step = result["per_rank"], result["step"]
    console.print(f"[bold]{plain(describe(spec))}[/bold]")
    console.print(plain(layout_line(result["layout"])))
    console.print(f"{gpu.name}: {_gb(gpu.memory)} ({_gib(gpu.memory)}), attention "
                  f"{result['attention']}, kernels {result['kernels']}")

    memory = Table(title=f"Per-rank memory (most loaded rank: pipeline stage {rank['stage']})",
                   title_justify="left")
    for col in ("", "GiB", "GB", "bytes"):
        memory.add_column(col, justify="left" if not col else "right", no_wrap=True)
    for key in MEMORY_KEYS:
        value = rank["memory"][key]
        label = f"[bold]{key}[/bold]" if key == "total" else key
        memory.add_row(label, _gib(value), _gb(value), f"{value:,}")
    console.print(memory)
    verdict = "[green]fits[/green]" if rank["fits"] else "[red]does not fit[/red]"
    console.print(f"{verdict}: {_gb(rank['memory']['total'])} of {_gb(rank['gpu_memory'])}")
    console.print(plain(f"Model states: {result['model_states']}"))

    if len(result["stages"]) > 1:
        stages = Table(title="Per pipeline stage (one rank)", title_justify="left")
        for col in ("stage", "weights", "activations", "total", "fits"):
            stages.add_column(col, justify="right", no_wrap=True)
        for s in result["stages"]:
            stages.add_row(str(s["stage"]), _gib(s["weights"]), _gib(s["activations"]),
                           _gib(s["total"]), "yes" if s["total"] <= rank["gpu_memory"] else "no")
        console.print(stages)

    figures = Table(title="Step", title_justify="left")
    figures.add_column("figure", no_wrap=True)
    figures.add_column("value", justify="right", no_wrap=True)
    figures.add_row("model FLOPs (fwd + bwd)", _si(step["flops"], "FLOP"))
    figures.add_row("useful FLOPs (masked scores out)", _si(step["useful_flops"], "FLOP"))
    figures.add_row("hardware FLOPs (+ recompute)", _si(step["hardware_flops"], "FLOP"))
    for kind, what in (("tp", "tensor parallel"), ("dp", "data parallel"), ("pp", "pipeline"),
                       ("ep", "expert all-to-all")):
        figures.add_row(f"sent per rank, {what} ({kind})", _gb(step["comm_bytes"][kind]))
    figures.add_row("pipeline bubble ((p - 1) / (m v))", f"{step['bubble']:.1%}")
    parts = step["time_parts"]
    for key, what in (("forward", "forward"), ("backward", "backward"),
                      ("recompute", "recompute"), ("grad_accumulation", "gradient accumulation"),
                      ("fsdp_copies", "FSDP2 copies"),
                      ("tp_exposed", "tensor parallel, exposed"),
                      ("ep_exposed", "expert all-to-all, exposed"),
                      ("pp_exposed", "pipeline sends, exposed"), ("bubble", "pipeline bubble"),
                      ("dp_exposed", "data parallel, exposed"),
                      ("embedding_exposed", "tied table all-reduce, exposed"),
                      ("optimizer", "optimizer step")):
        if key in ("fsdp_copies", "embedding_exposed") and not parts[key]:
            continue  # only --zero 3 --kernels eager, a table tied across stages have them
        figures.add_row(f"time: {what}", f"{parts[key]:.3f} s")
    figures.add_row("time", f"{step['time_s']:.3f} s")
    figures.add_row("MFU", f"{step['mfu']:.1%}")
    figures.add_row("tokens/s", f"{step['tokens_per_s']:,.0f}")
    console.print(figures)
    if step.get("host_bound"):
        console.print(plain(f"host-bound: {step['host_bound']}"))

    formulas = Table(title="Formulas", title_justify="left")
    formulas.add_column("figure", no_wrap=True)
    formulas.add_column("formula (bytes)", overflow="fold")
    for key, text in result["formulas"].items():
        formulas.add_row(key, pretty(text))
    console.print(formulas)
    console.print("symbols: " + ", ".join(
        f"{name} = {s['value']:,} ({s['meaning']})"
        for name, s in result["formula_symbols"].items()))
    for key, note in result["formula_notes"].items():
        console.print(f"{key}: {note}")
    console.print(assumptions(result))


def render_search(results: list[dict[str, Any]], spec: Spec, gpu: Gpu,
                  console: Console | None = None) -> None:
    """Print the ranking of ``--search`` (fastest first)."""
    console = console or _console()
    first = results[0]["layout"]
    console.print(f"[bold]{plain(describe(spec))}[/bold]")
    console.print(f"{first['gpus']} x {gpu.name} ({_gb(gpu.memory)}), global batch "
                  f"{first['global_batch']}, seq {first['seq']}, "
                  + (f"tgt_seq {first['tgt_seq']}, " if first.get("tgt_seq") else "")
                  + f"{first['dtype']}, attention "
                  f"{results[0]['attention']}, kernels {results[0]['kernels']}")
    table = Table(title=f"The {len(results)} fastest layouts that fit", title_justify="left")
    for col in ("tp", "pp", "vpp", "dp", "ep", "zero", "sp", "recompute", "micro-batch",
                "memory", "fits", "time", "MFU", "tokens/s"):
        table.add_column(col, justify="left" if col == "recompute" else "right", no_wrap=True)
    for r in results:
        lay, step = r["layout"], r["step"]
        table.add_row(str(lay["tp"]), str(lay["pp"]), str(lay["vpp"]), str(lay["dp"]),
                      str(lay["ep"]),
                      str(lay["zero"]), "yes" if lay["sp"] else "no", lay["recompute"],
                      str(lay["micro_batch"]), _gb(r["per_rank"]["memory"]["total"]),
                      "yes" if r["per_rank"]["fits"] else "no", f"{step['time_s']:.3f} s",
                      f"{step['mfu']:.1%}", f"{step['tokens_per_s']:,.0f}")
    console.print(table)
    console.print("memory: the most loaded rank's total (weights, gradients, optimizer, "
                  "activations, temporary)")
    bound = [str(i) for i, r in enumerate(results, 1) if r["step"].get("host_bound")]
    if bound:
        console.print(f"likely host-bound (step.host_bound): row{'s' if len(bound) > 1 else ''} "
                      f"{', '.join(bound)}: ZeRO 3's device time per layer group is below the "
                      "host time FSDP2 takes per group, so each one's step is likely longer than "
                      "shown")
    console.print(assumptions(results[0]))
