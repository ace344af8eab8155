"""``tfgraph report SPEC``: parameters, FLOPs and memory of a spec, with formulas (README,
``tfgraph report``).

The numbers are exactly ``graph.report(...)``; ``--json`` prints that dict, the default is a
readable rich rendering of it: totals, the per-component breakdown (identical consecutive layers
folded into one row, ``decoder.layers.0–11 ×12``), the split by sublayer kind, the formulas in
the spec's symbols and the accounting conventions.
"""

from __future__ import annotations

import json
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from tfgraph.cli_support import describe, load_spec_arg
from tfgraph.commands.compare import plain
from tfgraph.errors import TfgraphError
from tfgraph.graph.lengths import check_lengths, default_seq
from tfgraph.limits import MAX_BATCH, MAX_LENGTH, check_at_most
from tfgraph.passes.param_groups import kind_title, order_kinds
from tfgraph.prefixes import PARAMS, SI, prefixed


def _positive(option: str, text: str | None) -> int | None:
    """Parse a size option ourselves, so a bad value is one line and exit 2 (not click's
    three-line usage error)."""
    if text is None:
        return None
    try:
        value = int(text, 10)
    except ValueError:
        raise TfgraphError(f"{option}: expected a positive integer, got {text!r}") from None
    if value < 1:
        raise TfgraphError(f"{option}: expected a positive integer, got {value}")
    check_at_most(option, value, MAX_BATCH if option == "--batch" else MAX_LENGTH,
                  "sequences per batch" if option == "--batch" else "tokens per sequence")
    return value


@click.command()
@click.argument("spec_path", metavar="SPEC")
@click.option("--batch", "batch_text", metavar="B", help="Batch size (default 1).")
@click.option("--seq", "seq_text", metavar="S",
              help="Sequence length; the source length for encoder-decoder (default 128, or "
                   "max_len when that is smaller).")
@click.option("--tgt-seq", "tgt_text", metavar="T",
              help="Target length, encoder-decoder only (default: --seq).")
@click.option("--fused-attention", is_flag=True,
              help="Activation peak with a fused attention kernel (no score matrix).")
@click.option("--states", type=click.Choice(["mixed", "megatron"]), default="mixed",
              show_default=True,
              help="Model states of a 16-bit spec: mixed keeps 16-bit gradients (16 bytes per "
                   "parameter with the fp32 master copy and Adam's moments; ZeRO), megatron "
                   "fp32 gradients (18, Megatron-LM), as tfgraph plan --states.")
@click.option("--json", "as_json", is_flag=True, help="Print the report dict as JSON.")
def report(spec_path: str, batch_text: str | None, seq_text: str | None, tgt_text: str | None,
           fused_attention: bool, states: str, as_json: bool) -> None:
    """Report parameters, FLOPs and memory of SPEC at a batch size and sequence length(s).

    Exit status 2 for an invalid spec or a bad size.
    """
    spec = load_spec_arg(spec_path)
    batch = _positive("--batch", batch_text) or 1
    seq = _positive("--seq", seq_text)
    tgt_seq = _positive("--tgt-seq", tgt_text)
    if tgt_seq is not None and spec.arch != "encoder-decoder":
        raise TfgraphError(f"--tgt-seq: {spec.name} is {spec.arch} with one sequence; use --seq")
    if seq is None:
        seq = default_seq(spec)
    # README, "Lengths beyond max_len": learned positions refuse, the others note it
    check_lengths(spec, ("--seq", seq), ("--tgt-seq", tgt_seq))

    import tfgraph

    graph = tfgraph.compile(spec)
    rep = graph.report(batch=batch, seq=seq, tgt_seq=tgt_seq, fused_attention=fused_attention,
                       states=states)
    if as_json:
        click.echo(json.dumps(rep, indent=2))
        return
    render(rep, describe(spec))


# ---- rendering ------------------------------------------------------------------------------


def _si(n: int, unit: str) -> str:
    """1234567 -> '1.23 M' (SI prefixes for FLOPs, tfgraph.prefixes)."""
    return prefixed(n, SI, ".2f", " ", unit)


def _params(n: int) -> str:
    """1.1e9 -> '1.10 B' (parameter counts: billions as B, tfgraph.prefixes)."""
    return prefixed(n, PARAMS, ".2f", " ")


def _bytes(n: int) -> str:
    """Binary prefixes for memory: 1536 -> '1.50 KiB'."""
    for value, prefix in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if abs(n) >= value:
            return f"{n / value:.2f} {prefix}"
    return f"{n} B"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


# Totals rows: the effective FLOPs (tfgraph.passes.effective) as the headline, then the dense.
EFFECTIVE_ROWS = ("forward_effective", "matmul_effective", "other_effective",
                  "backward_effective", "train_step_effective")
DENSE_ROWS = ("forward", "matmul", "other", "backward", "train_step")


def effective_note(flops: dict[str, int]) -> str:
    """One line under the totals saying what the two forward figures count and how far
    apart they are, so a sliding window's saving is read off, not computed."""
    work, dense = flops["forward_effective"], flops["forward"]
    if work == dense:
        return ("flops.forward_effective = flops.forward: no attention is masked (every "
                "query reads every key).")
    return (f"flops.forward_effective counts each causal attention over the keys its "
            f"queries read (with a sliding window, its last W): {_si(work, 'FLOP')}, "
            f"{100 * work / dense:.1f}% of the dense {_si(dense, 'FLOP')} "
            f"(flops.forward: full score matrices).")


Row = dict[str, int]


def fold_components(components: dict[str, Row], places: dict[str, dict[str, Any]]
                    ) -> list[tuple[str, int, Row]]:
    """(label, count, summed row) with runs of identical consecutive layers of one stack
    folded: ``decoder.layers.0–11`` with count 12 and the sums over the run.

    ``places`` is the report's ``component_layers`` (each component's stack and layer), so
    which rows are layers of which stack is read from the graph, not from the names."""
    rows: list[tuple[str, int, Row]] = []
    run: list[tuple[str, int, Row]] = []  # (component, layer index, row) of one stack

    def flush() -> None:
        if not run:
            return
        first, row = run[0][0], run[0][2]
        label = first if len(run) == 1 else f"{first}\N{EN DASH}{run[-1][1]}"
        rows.append((label, len(run), {k: v * len(run) for k, v in row.items()}))
        run.clear()

    for name, row in components.items():
        place = places.get(name, {})
        stack, layer = place.get("stack"), place.get("layer")
        if layer is None:
            flush()
            rows.append((name, 1, dict(row)))
            continue
        last = run[-1] if run else None
        if last is None or places[last[0]].get("stack") != stack or last[2] != row \
                or last[1] + 1 != layer:
            flush()
        run.append((name, layer, row))
    flush()
    return rows


def render(rep: dict[str, Any], title: str, console: Console | None = None) -> None:
    """Print the report dict as rich tables."""
    from tfgraph.passes.formulas import pretty

    if console is None:
        console = Console()
        if not console.is_terminal:  # piped or redirected: no terminal width to fit, so do
            console = Console(width=120)  # not cut the tables to the 80-column default

    sizes = rep["sizes"]
    where = f"batch {sizes['batch']}, seq {sizes['seq']}"
    if rep["arch"] == "encoder-decoder":
        where += f", tgt_seq {sizes['tgt_seq']}"
    if sizes["fused_attention"]:
        where += ", fused attention"
    console.print(f"[bold]{plain(title)}[/bold]")
    console.print(f"{rep['dtype']}, {where}")

    flops, memory = rep["flops"], rep["memory"]
    totals = Table(title="Totals", title_justify="left")
    totals.add_column("figure", no_wrap=True)
    totals.add_column("value", justify="right", no_wrap=True)
    totals.add_column("exact", justify="right", no_wrap=True)
    totals.add_row("params", _params(rep["params"]), f"{rep['params']:,}")
    # The work the model does comes first (causal masks and sliding windows skip scores);
    # the dense figures (flops.forward and the rest: full score matrices) follow.
    for key in EFFECTIVE_ROWS:
        totals.add_row(f"flops.{key}", _si(flops[key], "FLOP"), f"{flops[key]:,}")
    for key in DENSE_ROWS:
        totals.add_row(f"flops.{key} (dense)", _si(flops[key], "FLOP"), f"{flops[key]:,}")
    for key in ("weights", "activations_peak", "saved_for_backward", "kv_cache", "model_states",
                "train_activations_peak", "train_step"):
        totals.add_row(f"memory.{key}", _bytes(memory[key]), f"{memory[key]:,} B")
    if "params_active" in rep:  # a mixture of experts: what one token uses, the router, and
        # the FLOPs of the ONNX model's dense form (every expert on every token)
        totals.add_row("params_active", _params(rep["params_active"]),
                       f"{rep['params_active']:,}")
        for key in ("router", "matmul_all_experts", "forward_all_experts"):
            totals.add_row(f"flops.{key}", _si(flops[key], "FLOP"), f"{flops[key]:,}")
    console.print(totals)
    console.print(effective_note(flops))
    if "kv_cache_all_positions" in rep:
        held = rep["kv_cache_all_positions"]
        console.print(f"memory.kv_cache keeps a sliding-window layer's last window positions, "
                      f"as a rolling cache does; tfgraph's KV-cache models keep every "
                      f"position: {_bytes(held)} ({held:,} B)")
    if "params_active" in rep:
        console.print(f"flops.forward counts each token's top-k experts (the PyTorch module); "
                      f"the ONNX model runs every expert on every token: "
                      f"flops.forward_all_experts, "
                      f"{flops['forward_all_experts'] / flops['forward']:.2f}x")
    console.print(f"activation peak at node {plain(rep['activations_peak_at'])}")
    if rep.get("train_activations_peak_at"):
        console.print(f"training step peak at node {plain(rep['train_activations_peak_at'])}")

    comp = Table(title="Per component (dense FLOPs of one forward, full score matrices; "
                       "identical consecutive layers folded, values summed)",
                 title_justify="left")
    for col in ("component", "params", "FLOPs", "matmul", "other", "of forward"):
        comp.add_column(col, justify="left" if col == "component" else "right", no_wrap=True)
    for label, count, row in fold_components(rep["components"], rep["component_layers"]):
        total = row["flops_matmul"] + row["flops_other"]
        name = f"{label} \N{MULTIPLICATION SIGN}{count}" if count > 1 else label
        comp.add_row(plain(name), f"{row['params']:,}", _si(total, ""),
                     _si(row["flops_matmul"], ""), _si(row["flops_other"], ""),
                     _pct(total, flops["forward"]))
    console.print(comp)

    kinds = Table(title="Per sublayer kind (FLOPs as flops.forward_effective; a sublayer's "
                        "norms count with it; attention scores: QKᵀ, normalise, weights·V)",
                  title_justify="left")
    for col in ("kind", "params", "FLOPs", "of forward", "dense FLOPs"):
        kinds.add_column(col, justify="left" if col == "kind" else "right", no_wrap=True)
    names = list(order_kinds(dict.fromkeys([*rep["params_by_kind"], *rep["flops_by_kind"]], 0)))
    work_by_kind = rep.get("flops_by_kind_effective", rep["flops_by_kind"])
    for kind in names:
        f = work_by_kind.get(kind, 0)
        kinds.add_row(plain(kind_title(kind)), f"{rep['params_by_kind'].get(kind, 0):,}",
                      _si(f, ""), _pct(f, flops["forward_effective"]),
                      _si(rep["flops_by_kind"].get(kind, 0), ""))
    console.print(kinds)

    formulas = Table(title="Formulas", title_justify="left")
    formulas.add_column("figure", no_wrap=True)
    formulas.add_column("formula", overflow="fold")
    for key, text in rep["formulas"].items():
        formulas.add_row(key, pretty(text))
    console.print(formulas)
    console.print("symbols: " + ", ".join(f"{k} = {v:,}" for k, v in rep["symbols"].items()))

    conv = Table(title="Conventions", title_justify="left", show_header=False)
    conv.add_column("figure", no_wrap=True)
    conv.add_column("convention", overflow="fold")
    for key, text in rep["conventions"].items():
        conv.add_row(key, text)
    conv.add_row("model states", rep["model_states"])  # the convention this report used
    console.print(conv)
