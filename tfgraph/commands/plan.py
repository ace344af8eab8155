"""``tfgraph plan SPEC|DIR --gpus N``: what each GPU holds, computes and sends in one training
step of a parallel layout, or the fastest layouts that fit (README, ``tfgraph plan``).

The numbers are exactly ``tfgraph.parallel.planner.plan`` (``search.search`` with
``--search``) on the spec's training graph, ``tfgraph.compile(spec, loss=True)`` compiled in
the training precision (``--dtype``, default bfloat16 mixed precision, float16 on a GPU
without bfloat16). ``--json`` prints that
dict (``--search --json``: a list of them, fastest first); the default is a rich rendering
(``tfgraph.commands.plan_tables``).

Defaults: ``--tp``/``--pp``/``--ep``/``--vpp`` 1 (``--pp`` the number of ``--stage-layers``
counts when only those are given; stages balanced by ``layout.balanced_stages`` otherwise),
``--dp`` GPUs / (tp x pp), ``--zero`` 0, ``--recompute``
none, ``--micro-batch`` 1, ``--global-batch`` dp x micro-batch (with ``--search``: the GPU
count, one sequence per GPU), ``--seq`` the spec's ``max_len`` (the context it is trained at)
or 2048 for a spec without one (relative or rotary positions with no table), ``--tgt-seq`` (an
encoder-decoder's target length; refused for other models) ``--seq``, ``--gpu`` h100.
Every bad value is one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import click

from tfgraph.cli_support import load_spec_arg
from tfgraph.errors import TfgraphError
from tfgraph.limits import MAX_BATCH, MAX_GPUS, MAX_LENGTH, MAX_TOP
from tfgraph.graph.lengths import check_lengths
from tfgraph.parallel.layout import GradReduce, Layout

DEFAULT_SEQ = 2048  # GPT-3's context (Brown et al. 2020), for specs with no max_len
DEFAULT_TOP = 10
# Options that fix a layout; ``--search`` chooses them itself.
_LAYOUT_OPTIONS = ("--tp", "--pp", "--dp", "--ep", "--zero", "--sp", "--recompute",
                   "--micro-batch", "--vpp", "--stage-layers")


def _count(option: str, text: str | None, minimum: int = 1, maximum: int | None = None
           ) -> int | None:
    """An integer option parsed here, so a bad value is one line naming the option."""
    if text is None:
        return None
    try:
        value = int(text.strip(), 10)
    except ValueError:
        raise TfgraphError(f"{option}: expected an integer, got {text!r}") from None
    if value < minimum:
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise TfgraphError(f"{option}: expected {kind}, got {value}")
    limit = maximum if maximum is not None else MAX_BATCH
    if value > limit:
        raise TfgraphError(f"{option} {value}: at most {limit:,}")
    return value


@click.command()
@click.argument("source", metavar="SPEC|DIR")
@click.option("--gpus", "gpus_text", metavar="N", required=True, help="GPUs to train on.")
@click.option("--gpu", "gpu_name", metavar="NAME",
              help="Accelerator: h100 (default), h200, a100-80gb, a100-40gb, b200, v100-32gb, "
                   "l40s, mi300x (peak FLOP/s, memory, bandwidth, links).")
@click.option("--gpu-memory", "gpu_memory", metavar="SIZE",
              help="Device memory, e.g. 80GB or 141GiB (overrides --gpu's).")
@click.option("--tp", "tp_text", metavar="T", help="Tensor-parallel ranks (default 1).")
@click.option("--pp", "pp_text", metavar="P", help="Pipeline stages (default 1).")
@click.option("--vpp", "vpp_text", metavar="V",
              help="Model chunks per pipeline stage: > 1 is interleaved 1F1B (default 1).")
@click.option("--stage-layers", "stage_text", metavar="N,N,...",
              help="Layers of each pipeline stage (default: balanced, the remainder one "
                   "more on the middle stages first: the first and last are left short).")
@click.option("--dp", "dp_text", metavar="D",
              help="Data-parallel replicas (default GPUs / (tp x pp)).")
@click.option("--ep", "ep_text", metavar="E",
              help="Expert-parallel ranks, taken from the data-parallel ones (MoE; default 1).")
@click.option("--zero", "zero_text", metavar="0|1|2|3",
              help="ZeRO stage: 1 optimizer, 2 + gradients, 3 + weights sharded (FSDP); "
                   "default 0.")
@click.option("--sp", is_flag=True, default=None,
              help="Sequence parallelism (Korthikanti et al. 2022; needs --tp > 1).")
@click.option("--recompute", type=click.Choice(["none", "selective", "full"]), default=None,
              help="Activation recomputation (default none).")
@click.option("--micro-batch", "micro_text", metavar="B", help="Sequences per micro-batch "
              "(default 1).")
@click.option("--global-batch", "global_text", metavar="G",
              help="Sequences per step (default dp x micro-batch; with --search the GPU count).")
@click.option("--seq", "seq_text", metavar="S",
              help="Sequence length, an encoder-decoder's source length (default the spec's "
                   "max_len, else 2048).")
@click.option("--tgt-seq", "tgt_text", metavar="T",
              help="Target length, encoder-decoder only (default: --seq).")
@click.option("--dtype", "dtype_given", type=click.Choice(["bfloat16", "float16", "float32"]),
              default=None,
              help="Training precision: 16-bit mixed precision (fp32 master weights and Adam "
                   "moments) or float32 (default bfloat16; float16 on a GPU without "
                   "bfloat16 tensor cores, v100-32gb).")
@click.option("--states", type=click.Choice(["mixed", "megatron"]), default="mixed",
              show_default=True,
              help="Model states of 16-bit training: mixed keeps 16-bit gradients (16 bytes "
                   "per parameter with the fp32 master copy and Adam's moments; ZeRO, "
                   "tfgraph report's default too), megatron fp32 gradients (18, Megatron-LM).")
@click.option("--grad-reduce", type=click.Choice(["overlap", "after"]), default="overlap",
              show_default=True,
              help="Data-parallel gradient reduction (ZeRO 0-2): overlap hides it bucket by "
                   "bucket under the backward (PyTorch DDP); after runs it once the backward "
                   "is done (Megatron-LM's --DDP-impl local, its default until 2023).")
@click.option("--attention", type=click.Choice(["fused", "unfused"]), default="fused",
              show_default=True,
              help="Attention kernel: fused keeps no score matrix for backward.")
@click.option("--kernels", type=click.Choice(["graph", "eager"]), default="graph",
              help="Time one kernel per graph op (graph: fused execution, as torch.compile "
                   "approaches) or the kernels PyTorch's eager mode launches for tfgraph's "
                   "module (eager; needs torch; with --search each layout is ranked by its "
                   "eager kernels).")
@click.option("--search", "do_search", is_flag=True,
              help="Rank every valid layout of --gpus that fits by estimated tokens/s.")
@click.option("--top", "top_text", metavar="K", help="Layouts --search shows (default 10).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the plan dict (with --search: a list of them) as JSON.")
def plan(source: str, gpus_text: str, gpu_name: str | None, gpu_memory: str | None,
         tp_text: str | None, pp_text: str | None, vpp_text: str | None,
         stage_text: str | None, dp_text: str | None, ep_text: str | None,
         zero_text: str | None, sp: bool | None, recompute: str | None,
         micro_text: str | None, global_text: str | None, seq_text: str | None,
         tgt_text: str | None, dtype_given: str | None,
         states: str, grad_reduce: GradReduce, attention: str, kernels: str, do_search: bool,
         top_text: str | None, as_json: bool) -> None:
    """Plan training SPEC|DIR on --gpus GPUs: per-rank memory, step FLOPs, communication,
    pipeline bubble, time and MFU of one layout, or --search for the fastest that fit.

    Exit status 2 for an invalid spec, a layout the model or GPU count cannot take, or a bad
    value.
    """
    from tfgraph.parallel.gpus import check_dtype, gpu

    spec = load_spec_arg(source)
    gpus = _count("--gpus", gpus_text, maximum=MAX_GPUS)
    assert gpus is not None  # required=True
    device = gpu(gpu_name, gpu_memory)
    # Volta trained in float16 (its tensor cores have no bfloat16): the default follows the GPU
    dtype = dtype_given or ("bfloat16" if device.bfloat16 else "float16")
    check_dtype(device, dtype)
    seq = _count("--seq", seq_text, maximum=MAX_LENGTH) or spec.max_len or DEFAULT_SEQ
    tgt_seq = _count("--tgt-seq", tgt_text, maximum=MAX_LENGTH)
    if tgt_seq is not None and spec.arch != "encoder-decoder":
        raise TfgraphError(f"--tgt-seq: {spec.name} is {spec.arch} with one sequence; use --seq")
    # README, "Lengths beyond max_len"
    check_lengths(spec, ("--seq", seq), ("--tgt-seq", tgt_seq))
    global_batch = _count("--global-batch", global_text)
    given = {"--tp": tp_text, "--pp": pp_text, "--vpp": vpp_text, "--stage-layers": stage_text,
             "--dp": dp_text, "--ep": ep_text,
             "--zero": zero_text, "--sp": sp, "--recompute": recompute,
             "--micro-batch": micro_text}
    if do_search:
        fixed = [name for name in _LAYOUT_OPTIONS if given[name] is not None]
        if fixed:
            raise TfgraphError(f"--search chooses {', '.join(fixed)} itself; give only --gpus, "
                               "--gpu/--gpu-memory, --global-batch, --seq, --tgt-seq, --dtype, "
                               "--states, --grad-reduce, --attention, --kernels")
        top = _count("--top", top_text, maximum=MAX_TOP) or DEFAULT_TOP
    elif top_text is not None:
        raise TfgraphError("--top: only with --search")

    import tfgraph

    graph = tfgraph.compile(spec.model_copy(update={"dtype": dtype}), loss=True)
    source_of_kernels = None
    if kernels == "eager":  # the module's kernels, counted once per micro-batch size
        from tfgraph.exporters.torch.kernels import kernel_source

        source_of_kernels = kernel_source(graph)
    if do_search:
        from tfgraph.parallel.search import search

        base = Layout(global_batch=global_batch or gpus, seq=seq, tgt_seq=tgt_seq, dtype=dtype,
                      states=states, grad_reduce=grad_reduce)
        try:
            found = search(graph, gpus, base, device, attention, top,
                           kernels=source_of_kernels)
        except TfgraphError as e:
            if seq_text is None and spec.max_len:  # the length was not the user's choice
                raise TfgraphError(f"{e}; the length is the spec's max_len by default: "
                                   "--seq S plans another") from None
            raise
        results = [{"name": spec.name, **r} for r in found]
        if as_json:
            click.echo(json.dumps(results, indent=2))
            return
        from tfgraph.commands.plan_tables import render_search

        render_search(results, spec, device)
        return

    from tfgraph.parallel.planner import plan as plan_layout

    layout = replace(_layout(gpus, given, global_batch, seq, dtype, states),
                     grad_reduce=grad_reduce, tgt_seq=tgt_seq)
    result: dict[str, Any] = {"name": spec.name, **plan_layout(
        graph, layout, device, attention, kernels=source_of_kernels)}
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    from tfgraph.commands.plan_tables import render_plan

    render_plan(result, spec, device)


def _layout(gpus: int, given: dict[str, Any], global_batch: int | None, seq: int, dtype: str,
            states: str = "mixed") -> Layout:
    """The layout the options name, GPUs = tp x pp x dp checked (the rest: ``layout.check``)."""
    tp = _count("--tp", given["--tp"]) or 1
    stage_layers = _stage_layers(given["--stage-layers"])
    pp = _count("--pp", given["--pp"]) or (len(stage_layers) if stage_layers else 1)
    if stage_layers is not None and len(stage_layers) != pp:
        raise TfgraphError(f"--stage-layers gives {len(stage_layers)} stages, --pp {pp}")
    vpp = _count("--vpp", given["--vpp"]) or 1
    dp = _count("--dp", given["--dp"])
    if dp is None:
        if gpus % (tp * pp):
            raise TfgraphError(f"--gpus {gpus} is not a multiple of tp x pp = {tp * pp}")
        dp = gpus // (tp * pp)
    if tp * pp * dp != gpus:
        raise TfgraphError(f"--gpus {gpus} must equal tp x pp x dp = {tp} x {pp} x {dp} = "
                           f"{tp * pp * dp}")
    zero = _count("--zero", given["--zero"], minimum=0)
    if zero is not None and zero > 3:
        raise TfgraphError(f"--zero: expected 0, 1, 2 or 3, got {zero}")
    micro = _count("--micro-batch", given["--micro-batch"]) or 1
    return Layout(tp=tp, pp=pp, vpp=vpp, stage_layers=stage_layers, dp=dp, ep=_count("--ep", given["--ep"]) or 1, zero=zero or 0,
                  sp=bool(given["--sp"]), recompute=given["--recompute"] or "none",
                  micro_batch=micro, global_batch=global_batch or dp * micro, seq=seq,
                  dtype=dtype, states=states)


def _stage_layers(text: str | None) -> tuple[int, ...] | None:
    """``--stage-layers 7,8,8,7`` -> (7, 8, 8, 7)."""
    if text is None:
        return None
    counts = []
    for part in text.split(","):
        value = _count("--stage-layers", part)
        assert value is not None
        counts.append(value)
    if len(counts) > MAX_GPUS:
        raise TfgraphError(f"--stage-layers: at most {MAX_GPUS:,} stages")
    return tuple(counts)
