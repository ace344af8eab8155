"""``tfgraph run SPEC|MODEL.onnx``: run a model with onnxruntime, time it, optionally check it.

A spec is built first (in memory, or in a temporary folder when its weights pass protobuf's
2 GiB); an ``.onnx`` file is checked to be a tfgraph model (its inputs and output) before
onnxruntime sees it. The provider that really ran is printed: onnxruntime-gpu falls back to the
CPU silently, so ``auto`` probes CUDA first (tfgraph.exporters.onnx.runtime).
``--check`` runs the torch back end on the same weights and inputs and prints the largest
absolute difference; only then is torch imported.
"""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.limits import MAX_REPEAT, SEED, check_memory, check_threads
from tfgraph.graph.lengths import Lengths, check_lengths, default_seq
from tfgraph.terminal import printable

if TYPE_CHECKING:
    import onnx

    from tfgraph.graph.ir import Graph
    from tfgraph.spec.schema import Spec
    from tfgraph.spec.source import Source

# Largest |onnxruntime - torch| accepted by --check, per dtype: parity is 1e-4 in float32
# (design); 16-bit models round every activation, so their bound is that of their precision.
CHECK_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def _build_spec(source: Source, seed: int, opset: int, tmp: Path, check: bool = False
                ) -> tuple[Graph, Any, onnx.ModelProto, bytes | Path]:
    """Compile a spec and export it: (graph, weights or None for seeded ones, model proto,
    model bytes or a temporary path). Refused first when the weights cannot fit in memory
    (:func:`_check_weights_memory`)."""
    from tfgraph.compiler import compile as compile_spec
    from tfgraph.exporters.onnx import runtime as rt
    from tfgraph.passes.cost import weights_bytes
    from tfgraph.exporters.onnx.model import EXTERNAL_DATA_THRESHOLD, session_bytes, to_onnx
    from tfgraph.exporters.onnx.model import write_onnx

    graph = compile_spec(source.spec)
    _check_weights_memory(graph, session_bytes(graph, given=source.checkpoint is not None),
                          check, str(source.spec.name))
    weights = source.weights(graph) if source.checkpoint is not None else None
    if weights_bytes(graph) <= EXTERNAL_DATA_THRESHOLD:
        model = to_onnx(graph, weights=weights, seed=seed, opset=opset)
        return graph, weights, model, model.SerializeToString()
    written = write_onnx(graph, tmp / f"{graph.name}.onnx", weights=weights, seed=seed,
                         opset=opset)
    return graph, weights, rt.load_model(written), written


def _check_weights_memory(graph: Graph, session: int, check: bool, where: str) -> None:
    """Refuse (exit 2) a model whose weights cannot fit in memory, before the build starts
    (a 36 GB model was otherwise written to a temporary file for minutes first): ``session``
    bytes for the onnxruntime session (and the build feeding it: ``session_bytes``), and
    with --check the torch reference built after them: the weights in float32 (generated or
    read) and the module's copy."""
    from tfgraph.limits import check_weight_memory
    from tfgraph.passes.cost import weights_bytes

    at_dtype = weights_bytes(graph)
    need = session
    what = f"{where}: the onnxruntime session"
    if check:
        float32 = 4 * sum(math.prod(p.attrs["shape"]) for p in graph.params())
        need += float32 + at_dtype  # torch_build_bytes(graph, given=True): no torch import
        what += " and the --check torch reference"
    check_weight_memory(what, need, at_dtype)


def _prompt_ids(prompt: str, tokenizer: Path | None, iface: Any, batch: int,
                where: str) -> dict[str, np.ndarray]:
    """The feeds for a text prompt: its token ids (batch copies) from ``tokenizer``."""
    from tfgraph.hf.text_tokenizer import load_text_tokenizer
    from tfgraph.hf.tokenizer import encode_text

    if tokenizer is None:
        raise TfgraphError(f"{where}: --prompt needs a tokenizer.json (in the model folder, or "
                           "next to the .onnx model)")
    if iface.inputs[0] != "input_ids":
        raise TfgraphError(f"{where}: --prompt runs one-stack models; this one takes "
                           f"{', '.join(iface.inputs)}")
    ids = encode_text(load_text_tokenizer(tokenizer), prompt, "--prompt")
    if not ids:
        raise TfgraphError("--prompt: the text encodes to no tokens")
    row = np.asarray(ids, dtype=np.int64)
    feeds = {"input_ids": np.tile(row, (batch, 1))}
    if "token_type_ids" in iface.inputs:
        feeds["token_type_ids"] = np.zeros_like(feeds["input_ids"])
    return feeds


def _graph_from_model(model: onnx.ModelProto, spec: Spec | None, where: str) -> Graph:
    """The graph of a tfgraph-built model, from the spec it carries in its metadata, checked
    against the model's initializers before and after compiling (tfgraph.spec.stored)."""
    if spec is None:
        raise TfgraphError(f"{where}: --check needs the spec, and this model carries none "
                           "(it was not built by tfgraph); run the spec instead")
    from tfgraph.spec.stored import model_graph

    return model_graph(spec, {t.name: tuple(t.dims) for t in model.graph.initializer}, where)


def check_note(ran: str, dtype: str) -> str:
    """What the check line says of TF32: on the CUDA provider a float32 model runs with TF32
    off (provider option use_tf32=0) against a torch reference with TF32 off too."""
    from tfgraph.exporters.onnx import runtime as rt

    if ran == rt.CUDA and dtype == "float32":
        return "; TF32 off in onnxruntime (use_tf32=0) and in torch"
    return ""


def _torch_logits(graph: Graph, weights: Mapping[str, Any] | None, seed: int,
                  feeds: dict[str, np.ndarray]) -> np.ndarray:
    try:
        import torch
    except ImportError:
        raise TfgraphError("--check runs the PyTorch back end: install torch "
                           "(pip install torch==2.13.0)") from None

    from tfgraph.exporters import to_torch

    torch_weights = None if weights is None else {
        name: torch.from_numpy(value) for name, value in weights.items()}
    module = to_torch(graph, weights=torch_weights, seed=seed).eval()
    # the reference runs on the CPU (no TF32 there); should it ever run on CUDA, no TF32 either
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        with torch.no_grad():
            args = [torch.from_numpy(feeds[name]) for name in graph.inputs]
            return module(*args).float().numpy()
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@click.command()
@click.argument("source", metavar="SPEC|DIR|MODEL.onnx")
@click.option("--provider", type=click.Choice(["auto", "cuda", "cpu"]), default="auto",
              show_default=True, help="Execution provider; auto takes CUDA only when usable.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Rows of random ids (or copies of --prompt) per run.")
@click.option("--seq", type=click.IntRange(min=1), default=128, show_default=True,
              help="Sequence length (source length for encoder-decoder models); the default "
                   "is capped at the spec's max_len.")
@click.option("--tgt-seq", type=click.IntRange(min=1), default=None,
              help="Target length of encoder-decoder models (default: --seq).")
@click.option("--repeat", type=click.IntRange(min=1, max=MAX_REPEAT), default=10, show_default=True,
              help=f"Timed runs (after one untimed warm-up), at most {MAX_REPEAT:,}.")
@click.option("--check", is_flag=True,
              help="Also run the PyTorch back end on the same weights and compare.")
@click.option("--seed", type=SEED, default=None,
              help="Random weights from this seed when the source is a spec (default 0) or a "
                   "model folder (default: its own weights); also seeds the random input ids.")
@click.option("--prompt", default=None,
              help="Text to run instead of random ids (needs the model's tokenizer.json); "
                   "prints the predicted next token.")
@click.option("--opset", type=int, default=23, show_default=True,
              help="ONNX opset when the source is a spec or a model folder (built first).")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="onnxruntime intra-op threads (default: one per physical core).")
@click.pass_context
def run(ctx: click.Context, source: str, provider: str, batch: int, seq: int,
        tgt_seq: int | None, repeat: int, check: bool, seed: int | None, prompt: str | None,
        opset: int, threads: int | None) -> None:
    """Run SPEC (built first), a Hugging Face model folder (built from its weights) or
    MODEL.onnx with onnxruntime and report latency."""
    from tfgraph.exporters.onnx import runtime as rt
    from tfgraph.spec.source import load_source

    check_threads("--threads", threads)
    given: Any = None  # the weights a spec or folder was built with (None: the seed's)
    tokenizer: Path | None = None
    with tempfile.TemporaryDirectory(prefix="tfgraph-run-") as tmp:
        if Path(source).suffix.lower() == ".onnx":
            if ctx.get_parameter_source("opset") is not click.core.ParameterSource.DEFAULT:
                raise TfgraphError(f"--opset builds a spec or model folder; {source} is "
                                   "already built (rebuild it with tfgraph build --opset)")
            model = rt.load_model(source)
            iface = rt.interface(model, source)
            session_source: bytes | Path = Path(source)
            graph: Graph | None = None
            label = f"{source}"
            from tfgraph.hf.files import beside

            tokenizer = beside(Path(source).parent, "tokenizer.json", "tokenizer file")
        else:
            built = load_source(source, "onnx", None, seed, None)
            # before the build, which a big model makes long; at the length it will run
            first = (default_seq(built.spec) if ctx.get_parameter_source("seq")
                     is click.core.ParameterSource.DEFAULT else seq)
            _check_run_memory(built.spec, batch, first if prompt is None else 1, tgt_seq)
            for note in built.notes:
                click.echo(f"note: {note}", err=True)
            said = len(built.notes)
            graph, given, model, session_source = _build_spec(built, seed or 0, opset,
                                                              Path(tmp), check)
            for note in built.notes[said:]:  # of the weights loaded (Source.weights)
                click.echo(f"note: {note}", err=True)
            iface = rt.interface(model, source)
            origin = f"seed {seed or 0}" if given is None else "its weights"
            label = f"{graph.name} (built from {source}, opset {opset}, {origin})"
            tokenizer = built.tokenizer_json
        seed = seed or 0
        spec = None
        if iface.spec_json is not None:  # untrusted: validated like a spec file
            from tfgraph.spec.stored import stored_spec

            spec = stored_spec(iface.spec_json, source)
        if tgt_seq is not None and "tgt_ids" not in iface.inputs:
            raise TfgraphError(f"--tgt-seq: {source} has one sequence ({iface.inputs[0]}); "
                               "use --seq")
        if ctx.get_parameter_source("seq") is click.core.ParameterSource.DEFAULT:
            seq = default_seq(spec)  # as `report` does: the default fits the model
        _check_run_memory(spec, batch, seq if prompt is None else 1, tgt_seq)
        if prompt is None:  # README, "Lengths beyond max_len" (a prompt's length: below)
            check_lengths(spec, ("--seq", seq), ("--tgt-seq", tgt_seq))
        if check and graph is None:  # say it before spending time on the runs
            graph = _graph_from_model(model, spec, source)
            from_file = True
            # the session holds the file's weights; the reference reads them again
            # (runtime.load_initializers) as float32 arrays for the torch module's copy
            from tfgraph.passes.cost import weights_bytes

            _check_weights_memory(graph, 2 * weights_bytes(graph), True, source)
        else:
            from_file = False
        # --check compares with a float32 reference: no TF32 in the CUDA provider's matmuls
        session, ran, why = rt.create_session(session_source, provider, threads=threads,
                                              dtype=iface.dtype, tf32=not check)
        if prompt is not None:
            feeds = _prompt_ids(prompt, tokenizer, iface, batch, source)
            if spec is not None:
                n = int(feeds["input_ids"].shape[1])
                Lengths.of(spec).check("--prompt", n, f"--prompt of {n} tokens")
        else:
            feeds = rt.random_ids(iface, batch, seq, tgt_seq, seed=seed)
        timing = rt.time_runs(session, feeds, repeat=repeat, warmup=1)
        out = rt.run(session, feeds)

        click.echo(f"model     {printable(label)}")
        click.echo(f"provider  {ran} ({why})")
        shapes = ", ".join(f"{k} int64[{v.shape[0]}, {v.shape[1]}]" for k, v in feeds.items())
        click.echo(f"inputs    {shapes} -> {iface.output} {iface.dtype}{list(out.shape)}")
        # token_type_ids label the input_ids' tokens (BERT's segments): not tokens of their own
        tokens = sum(v.size for k, v in feeds.items() if k != "token_type_ids")
        click.echo(f"latency   median {timing.median_s * 1e3:.2f} ms, p90 "
                   f"{timing.p90_s * 1e3:.2f} ms over {timing.runs} runs (1 warm-up)")
        click.echo(f"throughput {tokens / timing.median_s:,.0f} tokens/s "
                   f"({tokens} input tokens per run)")
        if prompt is not None and spec is not None and spec.arch == "decoder-only":
            from tfgraph.hf.text_tokenizer import load_text_tokenizer

            assert tokenizer is not None
            nxt = int(np.argmax(out[0, -1]))
            # the token as it is: an end-of-sequence token's text too
            text = load_text_tokenizer(tokenizer).decode([nxt], skip_special_tokens=False)
            click.echo(f"next      {printable(repr(text))} (token {nxt})")
        if check:
            assert graph is not None  # the spec was built, or the model's own compiled above
            if from_file:
                weights = rt.load_initializers(Path(source), {p.name for p in graph.params()})
            elif given is not None:  # a model folder's own weights
                weights = given
            else:  # the weights the spec was built with: the shared generator at --seed
                from tfgraph.graph.weights import generate

                weights = generate(graph, seed)
            expected = _torch_logits(graph, weights, seed, feeds)
            diff = float(np.max(np.abs(out.astype(np.float32) - expected)))
            tol = CHECK_TOLERANCE.get(iface.dtype, 1e-4)
            verdict = "ok" if diff <= tol else "FAILED"
            click.echo(f"check     max |onnxruntime - torch| = {diff:.3g} "
                       f"(tolerance {tol:g}, {iface.dtype}{check_note(ran, iface.dtype)}): "
                       f"{verdict}")
            if not diff <= tol:  # NaN compares false both ways: a failure
                ctx.exit(1)


def _check_run_memory(spec: Spec | None, batch: int, seq: int, tgt_seq: int | None) -> None:
    """Refuse --batch x --seq whose inputs and activations cannot fit in memory, before a
    session is built: ids (int64), the hidden states and the logits (float32), and one
    layer's attention scores, an estimate from below."""
    tokens = batch * max(seq, tgt_seq or 0)
    need = 8.0 * tokens
    if spec is not None:
        heads = spec.attention.heads
        vocab = spec.vocab if isinstance(spec.vocab, int) else max(spec.vocab.source,
                                                                   spec.vocab.target)
        need += 4.0 * tokens * (vocab + 8 * spec.d_model)
        need += 4.0 * batch * heads * max(seq, tgt_seq or 0) ** 2
    check_memory(f"--batch {batch} x --seq {max(seq, tgt_seq or 0)}", need)
