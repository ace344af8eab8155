"""Bounds for the size options of the commands, checked before any work starts (issue 27).

Every count a user gives either fits the machine and the model or is refused with one line
(exit 2) naming the option, the value and the limit, rather than running for hours, filling
memory or ending in a ``MemoryError``. Limits come from the machine (the cores this process
may run on, the memory the kernel says is available) and from the model (its vocabulary).
"""

from __future__ import annotations

import math
import os
from typing import Any

import click

from tfgraph.errors import TfgraphError
from tfgraph import io
from tfgraph.seeds import MAX_SEED

SEED = click.IntRange(min=0, max=MAX_SEED)
"""Seeds: numpy's generators take non-negative integers; 64 bits is what they mix in."""

MAX_GPUS = 1 << 20
"""plan --gpus: over a million accelerators is past any cluster built (and keeps --search's
enumeration of layouts bounded)."""
MAX_TOP = 1000
"""plan --top: layouts a search shows."""
MAX_BATCH = 1 << 30
"""plan --micro-batch and --global-batch, report and compare --batch: sequences per step."""
MAX_LENGTH = 1 << 30
"""--seq and --tgt-seq of report, compare and plan: tokens per sequence, a hundred times the
longest context published (10M tokens)."""
MAX_LENGTHS = 100
"""compare --seq: lengths in one comparison (each a row per figure of the table and a point
of the plots; 100 take about 2 s here, 20,000 ran for minutes)."""
MAX_BEAMS = 1024
"""generate --beams: beams per prompt (also at most the vocabulary)."""
MAX_NEW_TOKENS = 1 << 20
"""generate --max-new-tokens: a million tokens per prompt."""
MAX_REPEAT = 10_000
"""run --repeat: timed runs, far past what steadies a latency's percentiles (a 1 ms run:
10 s); 10^12 was accepted and ran until killed."""


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else ``os.cpu_count``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def check_threads(option: str, threads: int | None) -> None:
    """Refuse more threads than cores: they would only take turns (and thousands of threads
    exhaust the process's memory for stacks)."""
    cores = usable_cores()
    if threads is not None and threads > cores:
        raise TfgraphError(f"{option} {threads}: this machine runs {cores} threads at once; "
                           f"give at most {cores}")


def check_at_most(option: str, value: int | None, limit: int, why: str) -> None:
    if value is not None and value > limit:
        raise TfgraphError(f"{option} {value}: at most {limit:,} ({why})")


def _gb(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:,.0f} bytes"


def check_memory(what: str, need_bytes: float) -> None:
    """Refuse work that needs more memory than is available (unknown: not checked)."""
    available = io.available_memory()  # looked up at each call (tests replace it)
    if not math.isfinite(need_bytes) or (available is not None and need_bytes > available):
        shown = "more than any machine has" if not math.isfinite(need_bytes) \
            else _gb(need_bytes)
        free = f", only {_gb(available)} available" if available is not None else ""
        raise TfgraphError(f"{what}: needs about {shown} of memory{free}")


def check_weight_memory(what: str, need_bytes: int, weight_bytes: int) -> None:
    """Refuse (exit 2) materialising a model's weights when what the build holds at once
    cannot fit in the memory available, before anything is allocated (a model of a terabyte
    otherwise ends in a ``MemoryError`` or the out-of-memory killer after minutes).

    ``weight_bytes``: the parameters at the model's dtype (``weights_bytes(graph)``);
    ``need_bytes``: all the builder holds at once, its copies included (each builder says
    its own, measured: ``torch_build_bytes``, ``onnx_build_bytes``, ``session_bytes``).
    Both come from the parameters' shapes. Memory unknown (no /proc): not checked."""
    available = io.available_memory()  # looked up at each call (tests replace it)
    if available is not None and need_bytes > available:
        parts = "" if need_bytes == weight_bytes else \
            f" ({_gb(weight_bytes)} of parameters at the model's dtype, and copies)"
        raise TfgraphError(f"{what}: needs about {_gb(need_bytes)} of memory for the "
                           f"weights{parts}, only {_gb(available)} available")


MAX_LOWERED_LAYERS = 1024
"""Layers (all stacks together) of a spec that the commands lower to a graph (report, plan,
draw, compare, build, run, generate). Lowering and the passes take time and memory in
proportion to the layers (about 3 s and 150 MB per thousand here, more for plan's search):
a 10,000-layer spec, which the schema allows so that ``validate`` can check it, would run for
a minute and take gigabytes. The deepest models built have about 130 layers."""


def check_layers(spec: Any, where: str) -> None:
    """Refuse (exit 2) a spec too deep to lower in bounded time and memory."""
    layers = sum(spec.layer_count(stack) for stack in spec.stacks)
    if layers > MAX_LOWERED_LAYERS:
        raise TfgraphError(f"{where}: {layers:,} layers: tfgraph lowers at most "
                           f"{MAX_LOWERED_LAYERS:,} layers (bounded time and memory; "
                           "validate checks deeper specs)")


def generate_memory(spec: Any, rows: int, prompt_tokens: int, new_tokens: int, beams: int,
                    cache: bool) -> int:
    """Bytes that decoding holds at its longest: the KV cache of every decoder layer for
    rows x beams sequences of prompt + new tokens (a learned position table stops them at
    max_len), and the prefill's float32 logits and one layer's float32 attention scores. The
    prefill runs once per prompt row (beams branch after it, tfgraph.generation.beams): its
    scores are rows x heads x prompt queries x keys, the keys the prompt's own (the cached
    models and the encoder of an encoder-decoder) or the fused-attention buffer's, prompt +
    new tokens (``FusedStepper._capacity``); counted at the larger. Without a cache each
    step recomputes the whole prefix of every sequence: its scores instead, one layer at a
    time."""
    from tfgraph.graph.lengths import Lengths
    from tfgraph.graph.tensor import DTYPE_BYTES

    length = prompt_tokens + new_tokens
    limit = Lengths.of(spec).hard_limit
    if limit is not None:
        length = min(length, limit)
    sequences = rows * beams
    att = spec.attention
    element = DTYPE_BYTES.get(spec.dtype, 4)
    per_token = 2 * att.kv_heads * att.head_dim * element * spec.layer_count(spec.stacks[-1])
    cross = prompt_tokens if spec.arch == "encoder-decoder" else 0  # cross-attention keys
    need = sequences * (length + cross) * per_token
    prompt = max(prompt_tokens, 1)
    need += rows * prompt * spec.output_vocab * 4  # prefill logits
    if cache:
        keys = prompt if spec.arch == "encoder-decoder" else max(prompt, length)
        need += rows * att.heads * prompt * keys * 4  # the prefill's scores, one layer
    else:  # each step recomputes the whole prefix (the prefill's scores are the first's)
        need += sequences * att.heads * length * length * 4
    return need


def check_generate_memory(spec: Any, rows: int, prompt_tokens: int, new_tokens: int,
                          beams: int, cache: bool) -> None:
    """Refuse (exit 2) a ``generate`` whose decoding would not fit in memory."""
    need = generate_memory(spec, rows, prompt_tokens, new_tokens, beams, cache)
    what = (f"--beams {beams} x --max-new-tokens {new_tokens} ({rows} prompt"
            f"{'s' if rows > 1 else ''} of up to {prompt_tokens} tokens"
            f"{'' if cache else ', --no-cache'})")
    check_memory(what, need)
