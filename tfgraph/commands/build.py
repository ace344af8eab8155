"""``tfgraph build SPEC|DIR --to TARGET``: compile a spec and write one artifact (README.md,
`tfgraph build`).

Targets are a table: each names its default output and a writer imported only when chosen, so
``--to onnx`` never imports torch or graphviz. Every writer writes atomically (tfgraph.io): a
failed build leaves no partial file and keeps an older one.

SPEC may be a Hugging Face model folder: the spec comes from its config.json and, unless
``--seed`` or ``--weights`` says otherwise, the weights from its safetensors, streamed one
tensor at a time through the family's name map (tfgraph.hf.checkpoint_weights); its tokenizer
files travel with the artifact.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import click

from tfgraph.cli_support import say_done
from tfgraph.spec.source import config_notes, load_source
from tfgraph.errors import TfgraphError
from tfgraph.limits import SEED
from tfgraph.terminal import printable
from tfgraph.graph.ir import Graph

# Weights above this size get a progress bar (when stderr is a terminal).
PROGRESS_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    """One ``--to`` choice: where it writes by default and how."""

    default: Callable[[str], Path]  # spec name -> default output path
    write: Callable[[Graph, Path, dict[str, Any]], Path]
    takes_weights: bool  # accepts --weights / --seed
    takes_opset: bool = False


def _write_onnx(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
    from tfgraph.exporters.onnx.model import write_onnx
    from tfgraph.io import check_output, check_side_file, publish_together

    from tfgraph.hf.tokenizer import side_file_bytes

    check_output(out)
    for extra in opts["extra_files"] or ():  # refuse a foreign file of that name before work
        check_side_file(out.parent / extra.name, side_file_bytes(extra))
    # The model, its weights file and its side files are published together, or none is.
    with publish_together():
        with _progress(graph, f"writing {out.name}") as advance:
            written = write_onnx(graph, out, weights=opts["weights"], seed=opts["seed"],
                                 opset=opts["opset"], progress=advance,
                                 fused_attention=opts["fused_attention"])
        if opts["extra_files"]:  # next to the model, where onnxruntime-genai looks for them
            from tfgraph.hf.tokenizer import copy_files

            copy_files(opts["extra_files"], written.parent)
        _write_spec_generation_config(opts, written.parent)
        if opts["genai_config"]:  # a decoder's KV-cache model: onnxruntime-genai can
            # drive it
            from tfgraph.exporters.onnx.genai_config import write_genai_config

            write_genai_config(graph, written, opts["source_config"] or _token_config(opts),
                               opts["genai_provider"], opts["fused_attention"])
    return written


def _token_config(opts: dict[str, Any]) -> dict[str, Any] | None:
    """The spec's token ids (``tokens``) under config.json's names, when it has any."""
    tokens = getattr(opts.get("spec"), "tokens", None)
    if tokens is None:
        return None
    named = {"bos_token_id": tokens.bos, "eos_token_id": tokens.eos,
             "pad_token_id": tokens.pad, "decoder_start_token_id": tokens.decoder_start}
    return {k: v for k, v in named.items() if v is not None}


def _write_spec_generation_config(opts: dict[str, Any], folder: Path) -> None:
    """generation_config.json beside a model built from a spec with token ids (a model
    folder's own copy comes with its tokenizer files): ``tfgraph generate MODEL.onnx`` and
    transformers read eos and the decoder start there."""
    from tfgraph.io import atomic_write, check_side_file

    named = _token_config(opts)
    if not named or any(f.name == "generation_config.json" for f in opts["extra_files"] or ()):
        return
    target = folder / "generation_config.json"
    text = json.dumps(named, indent=2) + "\n"
    if check_side_file(target, text.encode("utf-8")):
        with atomic_write(target) as out:
            out.write(text)


def _write_seq2seq_cache(source: Any, graph: Graph, values: Any, out: Path, seed: int | None,
                         opset: int | None) -> Path:
    """An encoder-decoder's two KV-cache models in folder ``out`` (optimum's file names):
    ``encoder_model.onnx`` (the source encoded once, with every decoder layer's cross-attention
    keys/values) and ``decoder_model.onnx``, plus the source folder's tokenizer files."""
    if out.exists() and not out.is_dir():
        raise TfgraphError(f"{out}: an encoder-decoder's KV-cache model is two files; -o names "
                           "a folder")
    from tfgraph.io import check_not_input, check_output_node, make_parents, publish_together

    check_output_node(out, directory=True)
    check_not_input(out)
    make_parents(out)
    created = not out.exists()
    out.mkdir(exist_ok=True)
    try:
        with publish_together():
            _write_two_models(source, values, out, seed, opset)
    except BaseException:  # a refusal (a weight float16 cannot hold) leaves no empty folder
        if created:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise
    return out


def _write_two_models(source: Any, values: Any, out: Path, seed: int | None,
                      opset: int | None) -> None:
    from tfgraph.compiler import compile as compile_spec
    from tfgraph.exporters.onnx.model import write_onnx
    from tfgraph.graph.weights import WeightSubset

    for part in ("encoder", "decoder"):
        g = compile_spec(source.spec, cache=True, part=part)
        part_values = None if values is None else WeightSubset(
            values, [p.name for p in g.params()])
        with _progress(g, f"writing {part}_model.onnx") as advance:
            write_onnx(g, out / f"{part}_model.onnx", weights=part_values,
                       seed=0 if seed is None else seed, opset=23 if opset is None else opset,
                       progress=advance)
    if source.tokenizer:
        from tfgraph.hf.tokenizer import copy_files

        copy_files(source.tokenizer, out)
    _write_spec_generation_config({"spec": source.spec, "extra_files": source.tokenizer}, out)


def _write_torch(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
    module = importlib.import_module("tfgraph.exporters.torch.folder")
    with _progress(graph, f"writing {out.name}") as advance:
        return Path(module.write_torch_folder(graph, out, opts["weights"], opts["seed"],
                                              opts["extra_files"], advance))


def _write_hf(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
    from tfgraph.hf.export_config import hf_folder_facts

    config, names = hf_folder_facts(opts["spec"], opts["source_config"])
    module = importlib.import_module("tfgraph.exporters.hf.folder")
    # Without --dtype each tensor keeps the dtype its checkpoint stores it in (transformers
    # saves a float16 T5's wo in float32): HF -> tfgraph -> HF is bit-identical.
    checkpoint = opts.get("checkpoint")
    stored = ({name: info.dtype for name, info in checkpoint.tensors.items()}
              if checkpoint is not None and opts.get("dtype") is None else {})
    with _progress(graph, f"writing {out.name}") as advance:
        return Path(module.write_hf_folder(graph, out, config, names, opts["weights"],
                                           opts["seed"], opts["extra_files"], advance,
                                           stored))


def _kept_dtypes(target: str, opts: dict[str, Any]) -> str:
    """For the ``wrote`` line of ``--to hf``: the tensors kept in a dtype of their own."""
    checkpoint = opts.get("checkpoint")
    if target != "hf" or checkpoint is None or opts.get("dtype") is not None:
        return ""
    dtype = opts["spec"].dtype
    other: dict[str, int] = {}
    for info in checkpoint.tensors.values():
        if info.dtype != dtype:
            other[info.dtype] = other.get(info.dtype, 0) + 1
    return "".join(f" ({n} tensors {d} as stored)" for d, n in sorted(other.items()))


def _diagram(fmt: str) -> Callable[[Graph, Path, dict[str, Any]], Path]:
    def write(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
        module = importlib.import_module("tfgraph.exporters.diagram.draw")
        return Path(module.write_diagram(graph, out, fmt, level="model"))

    return write


def _write_json(graph: Graph, out: Path, opts: dict[str, Any]) -> Path:
    module = importlib.import_module("tfgraph.graph.serialize")
    return Path(module.write_graph_json(graph, out))


TARGETS: dict[str, Target] = {
    "onnx": Target(lambda name: Path("build") / f"{name}.onnx", _write_onnx, True, True),
    "torch": Target(lambda name: Path("build") / name, _write_torch, True),
    "hf": Target(lambda name: Path("build") / f"{name}-hf", _write_hf, True),
    "svg": Target(lambda name: Path("build") / f"{name}.svg", _diagram("svg"), False),
    "png": Target(lambda name: Path("build") / f"{name}.png", _diagram("png"), False),
    "dot": Target(lambda name: Path("build") / f"{name}.dot", _diagram("dot"), False),
    "json": Target(lambda name: Path("build") / f"{name}.json", _write_json, False),
}


class _progress:
    """A rich progress bar over tensors and bytes written, shown only for big builds on a
    terminal. Writers call the function it yields once per tensor, with its bytes."""

    def __init__(self, graph: Graph, label: str) -> None:
        from tfgraph.passes.cost import weights_bytes

        self.total, self.label = weights_bytes(graph), label
        self.bar: Any = None
        self.tensors = 0

    def __enter__(self) -> Callable[[int], None] | None:
        if self.total < PROGRESS_BYTES or not _stderr_is_terminal():
            return None
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn)

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                            TextColumn("{task.fields[tensors]} tensors"),
                            TimeRemainingColumn(), console=Console(stderr=True), transient=True)
        self.bar.start()
        task = self.bar.add_task(self.label, total=self.total, tensors=0)

        def advance(n: int) -> None:
            self.tensors += 1
            self.bar.update(task, advance=n, tensors=self.tensors)

        return advance

    def __exit__(self, *exc: Any) -> None:
        if self.bar is not None:
            self.bar.stop()


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    size = path.stat().st_size
    data = path.with_name(path.name + ".data")  # ONNX external weights, when written
    return size + (data.stat().st_size if data.is_file() else 0)


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


_FOLDER_WRITERS = {"torch": "tfgraph.exporters.torch.folder",
                   "hf": "tfgraph.exporters.hf.folder"}


def _check_output_first(target: str, out: Path, two_models: bool) -> None:
    """Refuse an output that cannot be written before anything is compiled or read: not a
    regular file (a folder, for folder targets), an input, a folder tfgraph did not write,
    an unwritable directory. The writers check again when they write."""
    from tfgraph.io import check_not_input, check_output, check_output_node, check_writable

    if target in ("svg", "png", "dot") and out.suffix.lower() != f".{target}":
        # The content follows --to, so "-o x.png --to svg" would write SVG into x.png.
        raise TfgraphError(f"{out}: --to {target} writes a .{target} file; give -o a .{target} "
                           "name (tfgraph draw picks the format from the suffix)")
    if two_models:  # a folder of two models: created by the writer (tfgraph.io.make_parents)
        check_output_node(out, directory=True)
        check_not_input(out)
        if out.is_dir():
            _check_data_files(out / "encoder_model.onnx", out / "decoder_model.onnx")
        return
    if target not in _FOLDER_WRITERS:
        check_output(out)
        if target == "onnx":
            _check_data_files(out)
        return
    from tfgraph.exporters.files.staged_folder import check_target
    from tfgraph.hf.tokenizer import FILES as TOKENIZER_FILES
    from tfgraph.io import make_parents

    writer = importlib.import_module(_FOLDER_WRITERS[target])
    check_output_node(out, directory=True)
    check_not_input(out)
    make_parents(out)  # -o newdir/model: as for every output (README, "Exit status")
    check_target(out, writer.FILES + TOKENIZER_FILES, writer.KIND)
    check_writable(out)


def _check_data_files(*models: Path) -> None:
    """A ``MODEL.data`` beside an ONNX output that is not the weights file of the tfgraph
    model being replaced is refused now, not after compiling (exporters/onnx/writer.py)."""
    from tfgraph.exporters.onnx.writer import check_data_file

    for model in models:
        check_data_file(model)


@click.command()
@click.argument("spec", metavar="SPEC|DIR")
@click.option("--to", "target", required=True, type=click.Choice(list(TARGETS)),
              help="What to build (hf: a Hugging Face model folder).")
@click.option("-o", "--output", type=click.Path(dir_okay=True, path_type=Path),
              help="Output path (default: build/<name>.<ext>, build/<name>/ for torch, "
                   "build/<name>-hf/ for hf).")
@click.option("--weights", type=click.Path(dir_okay=False, path_type=Path),
              help="Parameter values from a .safetensors file (names as in the docs); "
                   "default: a model folder's own weights, else generated from --seed.")
@click.option("--seed", type=SEED, default=None,
              help="Random weights from this seed (default 0 for a spec); same seed, same "
                   "weights in every back end.")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]), default=None,
              help="Convert the weights (and the model) to this dtype while writing; default: "
                   "the spec's, or a checkpoint's own where onnxruntime runs it.")
@click.option("--check-finite", is_flag=True,
              help="Refuse weights holding NaN or infinity (checks every value as it is read).")
@click.option("--opset", type=int, default=None,
              help="ONNX opset: 23 (default) uses fused Attention/RMSNormalization/"
                   "RotaryEmbedding; 17 decomposes them for older runtimes.")
@click.option("--kv-cache", is_flag=True,
              help="ONNX: the inference model of a decoder, with attention_mask, position_ids "
                   "and past_key_values inputs and present outputs; of an encoder-only model, "
                   "its padding-mask model (attention_mask, position_ids; README, \"KV "
                   "cache\").")
@click.option("--genai-provider", type=click.Choice(["cpu", "cuda"]), default=None,
              help="--kv-cache: the execution provider genai_config.json asks "
                   "onnxruntime-genai for (default cpu); the model itself runs on either.")
@click.option("--fused-attention", is_flag=True,
              help="--kv-cache of a decoder: attention as onnxruntime's fused "
                   "GroupQueryAttention kernel where it is exact for the model (its "
                   "attention_mask right-padded), written out where it is not.")
def build(spec: str, target: str, output: Path | None, weights: Path | None, seed: int | None,
          dtype: str | None, check_finite: bool, opset: int | None, kv_cache: bool,
          genai_provider: str | None, fused_attention: bool) -> None:
    """Compile SPEC (or a Hugging Face model folder) and write it as an ONNX model, a PyTorch
    folder, a Hugging Face folder, a diagram or graph JSON."""
    start = time.perf_counter()
    how = TARGETS[target]
    if not how.takes_weights:
        for flag, value in (("--weights", weights), ("--seed", seed), ("--dtype", dtype),
                            ("--check-finite", check_finite or None)):
            if value is not None:
                raise TfgraphError(f"{flag} applies to --to onnx, torch and hf, not {target}")
    if opset is not None and not how.takes_opset:
        raise TfgraphError(f"--opset applies to --to onnx only, not {target}")
    if kv_cache and target != "onnx":
        raise TfgraphError(f"--kv-cache applies to --to onnx, not {target} (the torch module "
                           "gets it from tfgraph.compile(spec, cache=True))")
    if genai_provider is not None and not kv_cache:
        raise TfgraphError("--genai-provider applies to --kv-cache builds (genai_config.json)")
    if fused_attention and not kv_cache:
        raise TfgraphError("--fused-attention applies to --kv-cache builds (the full-sequence "
                           "model already uses ONNX's fused Attention at opset 23)")
    if weights is not None and seed is not None:
        raise TfgraphError("--weights and --seed both choose the weights; give one")
    from tfgraph.compiler import compile as compile_spec

    source = load_source(spec, target, weights, seed, dtype, check_finite)
    source.notes.extend(config_notes(spec, source.config))
    # An encoder-decoder's KV-cache model is two models (encoder, decoder): a folder.
    two_models = kv_cache and source.spec.arch == "encoder-decoder"
    if two_models and genai_provider is not None:
        raise TfgraphError("--genai-provider: an encoder-decoder's KV-cache models come "
                           "without genai_config.json (onnxruntime-genai drives decoders)")
    if weights is not None:  # an input too: no output may be it (tfgraph.io)
        from tfgraph.io import check_input_file

        check_input_file(weights, "weights file")
    out = output if output is not None else how.default(source.spec.name)
    if two_models:
        out = output if output is not None else Path("build") / f"{source.spec.name}-kv"
    if output is None:
        out.parent.mkdir(parents=True, exist_ok=True)
    _check_output_first(target, out, two_models)
    graph = compile_spec(source.spec, cache=kv_cache and not two_models)
    values: Any = None
    if weights is not None:
        from tfgraph.graph.weights import load_weights

        values = load_weights(os.fspath(weights), graph, check_finite=check_finite)
    elif source.checkpoint is not None:
        values = source.weights(graph)
    if opset is not None:
        from tfgraph.exporters.onnx.model import check_opset

        check_opset(opset)
    if two_models:
        if fused_attention:  # its attention stays written out (exact everywhere)
            click.echo("note: --fused-attention: onnxruntime's GroupQueryAttention is not "
                       "exact here (a decoder-only model's KV-cache graph only); the "
                       "attention is written out", err=True)
        written = _write_seq2seq_cache(source, graph, values, out, seed, opset)
        say_done(f"wrote {printable(str(written))}{os.sep} (encoder_model.onnx, "
                   f"decoder_model.onnx, KV cache, {time.perf_counter() - start:.2f} s)")
        return
    fused = False
    if fused_attention:
        from tfgraph.exporters.onnx.fused_attention import refusal

        why = refusal(graph)
        fused = why is None
        if why is not None:  # the written-out attention stays (it is exact everywhere)
            source.notes.append(f"--fused-attention: onnxruntime's GroupQueryAttention is not "
                                f"exact here ({why}); the attention is written out")
        elif genai_provider == "cuda" and graph.dtype == "float32":
            # onnxruntime-gpu registers CUDA GroupQueryAttention for MLFloat16 and BFloat16
            # only: a float32 model's attention would run on the CPU, copied every step
            source.notes.append("--fused-attention --genai-provider cuda: onnxruntime's CUDA "
                                "GroupQueryAttention is float16/bfloat16 only, so this float32 "
                                "model's attention runs on the CPU; build with --dtype float16 "
                                "or bfloat16 for the GPU")
    genai = target == "onnx" and graph.info.kind == "cached" and graph.info.part is None \
        and (graph.info.cache is not None or genai_provider is not None)  # not an encoder's
    if genai:
        from tfgraph.exporters.onnx.genai_config import refusal as genai_refusal

        why = genai_refusal(graph)
        if why is not None:  # the model is written; onnxruntime-genai cannot drive it
            if genai_provider is not None:
                raise TfgraphError(f"--genai-provider: {graph.name}: {why}")
            source.notes.append(f"no genai_config.json: {why}")
            genai = False
        else:
            from tfgraph.exporters.onnx.genai_config import end_token_note

            note = end_token_note(source.config or _token_config({"spec": source.spec}))
            if note is not None:
                source.notes.append(note)
            if graph.dtype == "bfloat16" and genai_provider in (None, "cpu"):
                # onnxruntime's CPU provider has no bfloat16 MatMul, Mul, ...: NOT_IMPLEMENTED
                source.notes.append("genai_config.json asks for onnxruntime's CPU provider, "
                                    "which has no bfloat16 kernels (MatMul, Mul, ...): give "
                                    "--genai-provider cuda, or --dtype float16 or float32 to "
                                    "run it on the CPU")
    for note in source.notes:
        click.echo(f"note: {note}", err=True)
    opts = {"fused_attention": fused, "genai_config": genai, "weights": values,
            "seed": 0 if seed is None else seed,
            "opset": 23 if opset is None else opset, "extra_files": source.tokenizer,
            "source_config": source.config, "spec": source.spec,
            "genai_provider": genai_provider or "cpu", "dtype": dtype,
            # its tensors as the model loads them (tfgraph.hf.checkpoint_names)
            "checkpoint": (source.loaded or source.checkpoint) if weights is None else None}
    written = how.write(graph, out, opts)
    from tfgraph.passes.cost import param_count

    params = sum(param_count(p) for p in graph.params())
    details = [_human(_size(written)), f"{params:,} params"]
    if target == "onnx":
        cache = ", KV cache" if graph.info.cache is not None else ", padding mask"
        details.append(f"opset {opts['opset']}" + (cache if kv_cache else "")
                       + (", fused attention" if fused else ""))
    if how.takes_weights:
        details.append(graph.dtype + _kept_dtypes(target, opts))
        if weights is not None:
            details.append(f"weights {weights}")
        elif source.checkpoint is not None:
            details.append(f"weights {source.checkpoint.folder}")
        else:
            details.append(f"seed {opts['seed']}")
        if source.tokenizer:  # what was copied from the model folder
            details.append(f"copied {', '.join(f.name for f in source.tokenizer)}")
    details.append(f"{time.perf_counter() - start:.2f} s")
    slash = os.sep if written.is_dir() else ""
    say_done(f"wrote {printable(str(written))}{slash} ({', '.join(details)})")
