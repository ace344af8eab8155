"""``tfgraph run SPEC|MODEL.onnx``: run a model with onnxruntime, time it, optionally check it.

A spec is built first (in memory, or in a temporary folder when its weights pass protobuf's
2 GiB); an ``.onnx`` file is checked to be a tfgraph model (its inputs and output) before
onnxruntime sees it. The provider that really ran is printed: onnxruntime-gpu falls back to the
CPU silently, so ``auto`` probes CUDA first (tfgraph.exporters.onnx_runtime).
``--check`` runs the torch back end on the same weights and inputs and prints the largest
absolute difference; only then is torch imported.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.terminal import printable

if TYPE_CHECKING:
    import onnx

    from tfgraph.ir import Graph

# Largest |onnxruntime - torch| accepted by --check, per dtype: parity is 1e-4 in float32
# (design); 16-bit models round every activation, so their bound is that of their precision.
CHECK_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def _build_spec(path: str, seed: int, opset: int, tmp: Path
                ) -> tuple[Graph, onnx.ModelProto, bytes | Path]:
    """Compile a spec and export it: (graph, model proto, model bytes or a temporary path)."""
    from tfgraph.cli_support import load_spec_arg
    from tfgraph.compiler import compile as compile_spec
    from tfgraph.exporters import onnx_runtime as rt
    from tfgraph.cost import weights_bytes
    from tfgraph.exporters.onnx_model import EXTERNAL_DATA_THRESHOLD, to_onnx
    from tfgraph.exporters.onnx_model import write_onnx

    graph = compile_spec(load_spec_arg(path))
    if weights_bytes(graph) <= EXTERNAL_DATA_THRESHOLD:
        model = to_onnx(graph, seed=seed, opset=opset)
        return graph, model, model.SerializeToString()
    written = write_onnx(graph, tmp / f"{graph.name}.onnx", seed=seed, opset=opset)
    return graph, rt.load_model(written), written


def _graph_from_model(model: onnx.ModelProto, spec_json: str | None, where: str) -> Graph:
    """The graph of a tfgraph-built model, from the spec it carries in its metadata."""
    if spec_json is None:
        raise TfgraphError(f"{where}: --check needs the spec, and this model carries none "
                           "(it was not built by tfgraph); run the spec instead")
    import json

    import tfgraph
    from tfgraph.spec import Spec

    try:
        spec = Spec.model_validate(json.loads(spec_json))
    except ValueError as err:
        raise TfgraphError(f"{where}: the spec stored in the model is invalid: {err}") from None
    return tfgraph.compile(spec)


def _model_weights(model_path: Path, graph: Graph) -> dict[str, np.ndarray]:
    """The initializers of an ONNX file (external data included) as float32 arrays."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_path))
    names = {p.name for p in graph.params()}
    return {t.name: numpy_helper.to_array(t).astype(np.float32)
            for t in model.graph.initializer if t.name in names}


def _torch_logits(graph: Graph, weights: dict[str, np.ndarray] | None, seed: int,
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
    with torch.no_grad():
        args = [torch.from_numpy(feeds[name]) for name in graph.inputs]
        return module(*args).float().numpy()


@click.command()
@click.argument("source", metavar="SPEC|MODEL.onnx")
@click.option("--provider", type=click.Choice(["auto", "cuda", "cpu"]), default="auto",
              show_default=True, help="Execution provider; auto takes CUDA only when usable.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--seq", type=click.IntRange(min=1), default=128, show_default=True,
              help="Sequence length (source length for encoder-decoder models); the default "
                   "is capped at the spec's max_len.")
@click.option("--tgt-seq", type=click.IntRange(min=1), default=None,
              help="Target length of encoder-decoder models (default: --seq).")
@click.option("--repeat", type=click.IntRange(min=1), default=10, show_default=True,
              help="Timed runs (after one untimed warm-up).")
@click.option("--check", is_flag=True,
              help="Also run the PyTorch back end on the same weights and compare.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Weights seed when SOURCE is a spec.")
@click.option("--opset", type=int, default=23, show_default=True,
              help="ONNX opset when SOURCE is a spec.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="onnxruntime intra-op threads (default: one per physical core).")
@click.pass_context
def run(ctx: click.Context, source: str, provider: str, batch: int, seq: int,
        tgt_seq: int | None, repeat: int, check: bool, seed: int, opset: int,
        threads: int | None) -> None:
    """Run SPEC (built first) or MODEL.onnx with onnxruntime and report latency."""
    from tfgraph.exporters import onnx_runtime as rt

    with tempfile.TemporaryDirectory(prefix="tfgraph-run-") as tmp:
        if Path(source).suffix.lower() == ".onnx":
            model = rt.load_model(source)
            iface = rt.interface(model, source)
            session_source: bytes | Path = Path(source)
            graph: Graph | None = None
            label = f"{source}"
        else:
            graph, model, session_source = _build_spec(source, seed, opset, Path(tmp))
            iface = rt.interface(model, source)
            label = f"{graph.name} (built from {source}, opset {opset}, seed {seed})"
        spec = None
        if iface.spec_json is not None:
            import json

            spec = json.loads(iface.spec_json)
        if tgt_seq is not None and "tgt_ids" not in iface.inputs:
            raise TfgraphError(f"--tgt-seq: {source} has one sequence ({iface.inputs[0]}); "
                               "use --seq")
        max_len = spec.get("max_len") if spec is not None else None
        if max_len and ctx.get_parameter_source("seq") is click.core.ParameterSource.DEFAULT:
            seq = min(seq, max_len)  # as `report` does: the default fits the model
        _check_lengths(spec, seq, tgt_seq)
        if check and graph is None:  # say it before spending time on the runs
            graph = _graph_from_model(model, iface.spec_json, source)
            from_file = True
        else:
            from_file = False
        session, ran, why = rt.create_session(session_source, provider, threads=threads,
                                              dtype=iface.dtype)
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
        if check:
            assert graph is not None  # the spec was built, or the model's own compiled above
            if from_file:
                weights = _model_weights(Path(source), graph)
            else:  # the weights the spec was built with: the shared generator at --seed
                from tfgraph.weights import generate

                weights = generate(graph, seed)
            expected = _torch_logits(graph, weights, seed, feeds)
            diff = float(np.max(np.abs(out.astype(np.float32) - expected)))
            tol = CHECK_TOLERANCE.get(iface.dtype, 1e-4)
            verdict = "ok" if diff <= tol else "FAILED"
            click.echo(f"check     max |onnxruntime - torch| = {diff:.3g} "
                       f"(tolerance {tol:g}, {iface.dtype}): {verdict}")
            if diff > tol:
                ctx.exit(1)


def _check_lengths(spec: dict[str, Any] | None, seq: int, tgt_seq: int | None) -> None:
    """Learned positions stop at max_len: say so instead of letting onnxruntime fail."""
    if spec is None or spec.get("embedding", {}).get("positions") != "learned":
        return
    max_len = spec.get("max_len")
    for flag, n in (("--seq", seq), ("--tgt-seq", tgt_seq)):
        if n is not None and max_len is not None and n > max_len:
            raise TfgraphError(f"{flag} {n}: longer than the model's max_len {max_len} "
                               "(learned positions)")
