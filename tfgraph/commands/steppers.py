"""Opening SPEC|DIR|MODEL.onnx for generation, and picking the stepper that drives it.

:func:`stepper_for` is the one place that decides how a model is stepped. Today's models take
one whole sequence (inputs ``input_ids`` or ``src_ids, tgt_ids``, README "CLI reference"), which the
full-recompute steppers drive (tfgraph.exporters.onnx.recompute / recompute_torch). A model
with the KV-cache interface of README "KV cache" (``attention_mask``, ``past_key_values.{i}.key|value``
inputs; ``present.*`` outputs) needs a cached stepper, chosen in :func:`_cached_onnx_stepper`;
the torch module's cached forward plugs in at :func:`_torch_stepper` the same way.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfgraph.errors import TfgraphError
from tfgraph.generation.backend import Stepper
from tfgraph.graph.lengths import Lengths
from tfgraph.spec.schema import Spec
from tfgraph.graph.weights import WeightSubset

if TYPE_CHECKING:
    from tfgraph.graph.ir import Graph

BACKENDS = ("onnx", "torch")
CUDA_GRAPH_MODELS = ("onnxruntime captures the decode step of a decoder's fused-attention "
                     "KV-cache model only (fixed shapes and buffers): build --kv-cache "
                     "--fused-attention, or a SPEC or DIR with --fused-attention, where "
                     "onnxruntime's kernel is exact for the model (a note says when not)")
CACHE_INPUT_PREFIXES = ("attention_mask", "past_key_values.", "position_ids")


@dataclass
class Opened:
    """A model ready to generate with: its stepper, what it is, where it runs, its tokenizer
    (tokenizer.json), the size of the vocabulary prompts index (None: unknown) and the
    spec's rule for lengths past max_len (tfgraph.graph.lengths; the stepper's own ``max_len`` is
    only a learned table's hard limit)."""

    stepper: Stepper
    label: str
    runs_on: str
    tokenizer: Path | None = None
    prompt_vocab: int | None = None
    notes: list[str] = field(default_factory=list)
    keep: Any = None  # a temporary folder holding external weights while the session lives
    lengths: Lengths | None = None  # the spec's max_len rule (None: no spec, no max_len)
    spec: Spec | None = None  # the model's spec, when known (bounds generate's memory)

    def close(self) -> None:
        close = getattr(self.stepper, "close", None)
        if close is not None:  # a static cache attached to a module lets go of its buffers
            close()
        if self.keep is not None:
            self.keep.cleanup()
            self.keep = None


def settings_folder(source: str) -> Path | None:
    """Where a source's generation settings live: a model folder, or an .onnx file's folder
    (``tfgraph build DIR`` copies the folder's generation_config.json next to the model)."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.suffix.lower() == ".onnx":
        return path.parent
    return None


def built_seq2seq(source: str) -> str:
    """``source``, or for the folder ``build --kv-cache`` writes for an encoder-decoder
    (encoder_model.onnx and decoder_model.onnx, no config.json) its decoder_model.onnx, the
    file that drives generation and names the encoder beside it."""
    path = Path(source)
    if path.is_dir() and not (path / "config.json").exists() and \
            (path / "decoder_model.onnx").is_file() and (path / "encoder_model.onnx").is_file():
        return str(path / "decoder_model.onnx")
    return source


def stepper_for(source: str, backend: str = "onnx", provider: str = "auto",
                threads: int | None = None, weights_seed: int | None = None, opset: int = 23,
                decoder_start: int = 0, cache: bool = True, compile: bool = False,
                weights: str | None = None, fused_attention: bool = False,
                cuda_graph: bool = False) -> Opened:
    """Open ``source`` (a spec, a Hugging Face model folder or a tfgraph .onnx file) on
    ``backend`` and return the stepper that generates with it. A spec gets random weights
    from ``weights_seed`` (default 0), a folder its own weights unless ``weights_seed`` is
    given; an .onnx file its initializers. ``cache``: a decoder built from a spec or folder
    decodes through its KV-cache graph (else by full recomputation, for comparison).
    ``compile`` (torch back end, decoders with a cache): a static cache attached to the module
    and the step compiled by torch.compile (exporters/generation/cached_steppers.TorchStatic).
    ``weights``: a ``.safetensors`` file of the spec's (or folder's) parameters, by tfgraph's
    names (a trained ``state_dict`` saved as is), instead of random or the folder's own.
    ``fused_attention`` (a decoder's spec or folder on onnxruntime, with the cache): its
    KV-cache model built with onnxruntime's fused attention where it is exact
    (exporters/onnx/fused_attention.py; a note says when it is not). ``cuda_graph`` (such a
    fused model on onnxruntime's CUDA provider): its decode steps captured as a CUDA graph and
    replayed (exporters/generation/fused_stepper.py). A folder ``build --kv-cache`` wrote
    for an encoder-decoder is its ``decoder_model.onnx``."""
    if backend not in BACKENDS:
        raise TfgraphError(f"--backend {backend}: choose one of {', '.join(BACKENDS)}")
    source = built_seq2seq(source)
    if compile and backend != "torch":
        raise TfgraphError("--compile is for --backend torch (torch.compile)")
    if compile and not cache:
        raise TfgraphError("--compile decodes through the static KV cache: not with --no-cache")
    if weights is not None and weights_seed is not None:
        raise TfgraphError("--weights and --weights-seed both choose the weights; give one")
    if fused_attention and (backend != "onnx" or not cache):
        raise TfgraphError("--fused-attention builds the ONNX KV-cache model: --backend onnx, "
                           "not with --no-cache")
    if cuda_graph and (backend != "onnx" or not cache):
        raise TfgraphError("--cuda-graph is onnxruntime's capture of the KV-cache decode step: "
                           "--backend onnx, not with --no-cache (--backend torch: --compile)")
    if fused_attention and Path(source).suffix.lower() == ".onnx":
        raise TfgraphError("--fused-attention: an .onnx model is already built (build it with "
                           "--kv-cache --fused-attention)")
    if Path(source).suffix.lower() == ".onnx":
        if weights is not None:
            raise TfgraphError("--weights: an .onnx model carries its own weights (build it "
                               "with --weights)")
        if weights_seed is not None:  # accepted and ignored would claim weights it is not using
            raise TfgraphError("--weights-seed: an .onnx model carries its own weights "
                               "(build it with --seed)")
        return _from_onnx_file(source, backend, provider, threads, decoder_start, cache,
                               compile, cuda_graph)
    return _from_spec(source, backend, provider, threads, weights_seed, opset, decoder_start,
                      cache, compile, weights, fused_attention, cuda_graph)


def _from_spec(source: str, backend: str, provider: str, threads: int | None,
               weights_seed: int | None, opset: int, decoder_start: int,
               cache: bool, compile: bool = False, weights_file: str | None = None,
               fused_attention: bool = False, cuda_graph: bool = False) -> Opened:
    from tfgraph.spec.source import load_source

    try:
        built = load_source(source, backend, weights_file, weights_seed, None)
    except TfgraphError as err:  # generate's --seed seeds sampling; weights have their own
        raise TfgraphError(str(err).replace("--seed N", "--weights-seed N")) from None
    spec = built.spec
    graphs = _decoding_graphs(spec, cache, source)
    given = None
    if weights_file is not None:  # checked against the whole model's parameters
        from tfgraph.compiler import compile as compile_spec
        from tfgraph.graph.weights import load_weights

        given = load_weights(weights_file, compile_spec(spec))
    if len(graphs) == 2:  # an encoder-decoder's encoder and decoder cache graphs
        if fused_attention:
            built.notes.append("--fused-attention: onnxruntime's GroupQueryAttention is not "
                               "exact here (a decoder-only model's KV-cache graph only); the "
                               "attention is written out")
        if compile:
            raise TfgraphError("--compile: decoder-only models (an encoder-decoder's static "
                               "cache is not built yet)")
        if cuda_graph:
            raise TfgraphError(f"--cuda-graph: {CUDA_GRAPH_MODELS}")
        return _cached_seq2seq(built, graphs, source, backend, provider, threads,
                               weights_seed, opset, decoder_start, given, weights_file)
    graph = graphs[0]
    weights: Any = None
    if given is not None:
        weights = WeightSubset(given, [p.name for p in graph.params()])
    elif built.checkpoint is not None:
        weights = built.weights(graph)
    seed = weights_seed or 0
    origin = f"weights {weights_file}" if weights_file is not None else \
        "its weights" if weights is not None else f"seed {seed}"
    tokenizer = built.tokenizer_json
    if backend == "torch":
        from tfgraph.exporters import to_torch

        module = to_torch(graph, seed=seed, weights=weights)
        stepper, runs_on = _torch_stepper(module, spec, provider, threads, decoder_start,
                                          compile)
        label = f"{graph.name} (built from {source}, torch, {origin})"
        return Opened(stepper, label, runs_on, tokenizer, spec.vocab_size("source"),
                      built.notes, lengths=Lengths.of(spec), spec=spec)
    fused = False
    if fused_attention:
        from tfgraph.exporters.onnx.fused_attention import refusal

        why = refusal(graph)
        fused = why is None
        if why is not None:  # the written-out attention (exact everywhere) stays
            built.notes.append(f"--fused-attention: onnxruntime's GroupQueryAttention is not "
                               f"exact here ({why}); the attention is written out")
    keep, model_source, model = _onnx_model(graph, weights, seed, opset, fused)
    try:
        stepper, runs_on = _onnx_stepper(model, model_source, source, provider, threads,
                                         decoder_start, cuda_graph)
    except BaseException:
        if keep is not None:
            keep.cleanup()
        raise
    label = f"{graph.name} (built from {source}, opset {opset}, {origin})"
    return Opened(stepper, label, runs_on, tokenizer, spec.vocab_size("source"), built.notes,
                  keep, Lengths.of(spec), spec)


def _decoding_graphs(spec: Spec, cache: bool, where: str) -> list[Any]:
    """tfgraph.compiler.decoding_graphs, its refusal naming ``where``."""
    from tfgraph.compiler import decoding_graphs

    _check_decodes(spec, where)
    return decoding_graphs(spec, cache)


def _check_decodes(spec: Spec, where: str) -> None:
    from tfgraph.compiler import check_decodes

    try:
        check_decodes(spec)
    except TfgraphError as err:
        raise TfgraphError(f"{where}: {err}") from None


def _cached_seq2seq(built: Any, parts: list[Any], source: str, backend: str, provider: str,
                    threads: int | None, weights_seed: int | None, opset: int,
                    decoder_start: int, given: Any = None,
                    weights_file: str | None = None) -> Opened:
    """An encoder-decoder decoding through its two KV-cache graphs: the encoder once, the
    decoder one token at a time. ``given``: the --weights file's values."""
    from tfgraph.compiler import compile as compile_spec

    spec = built.spec
    seed = weights_seed or 0
    weights = None
    every = given
    if every is None and built.checkpoint is not None:
        every = built.weights(compile_spec(spec))
    if every is not None:
        weights = [WeightSubset(every, [p.name for p in g.params()]) for g in parts]
    origin = f"weights {weights_file}" if weights_file is not None else \
        "its weights" if weights is not None else f"seed {seed}"
    tokenizer = built.tokenizer_json
    vocab, probs = spec.output_vocab, spec.output == "probs"
    limits = Lengths.of(spec)
    if backend == "torch":
        from tfgraph.exporters import to_torch
        from tfgraph.exporters.generation.cached_steppers import torch_seq2seq

        import torch

        modules = [to_torch(g, seed=seed, weights=None if weights is None else weights[k])
                   for k, g in enumerate(parts)]
        device, why = _torch_device(provider)
        if threads:
            torch.set_num_threads(threads)
        stepper: Stepper = torch_seq2seq(modules[0], modules[1], vocab, limits.hard_limit,
                                         device, decoder_start, probs)
        return Opened(stepper, f"{spec.name} (built from {source}, torch, {origin})",
                      f"torch {device} ({why})", tokenizer, spec.vocab_size("source"),
                      built.notes, lengths=limits, spec=spec)
    from tfgraph.exporters.onnx import runtime as rt
    from tfgraph.exporters.generation.cached_steppers import onnx_seq2seq
    from tfgraph.exporters.onnx.model import to_onnx

    sessions = []
    for k, g in enumerate(parts):
        model = to_onnx(g, weights=None if weights is None else weights[k], seed=seed,
                        opset=opset)
        session, ran, why = rt.create_session(model.SerializeToString(), provider,
                                              threads=threads, dtype=g.dtype)
        sessions.append(session)
    stepper = onnx_seq2seq(sessions[0], sessions[1], vocab, limits.hard_limit, decoder_start,
                           probs)
    return Opened(stepper, f"{spec.name} (built from {source}, opset {opset}, {origin})",
                  f"{ran} ({why})", tokenizer, spec.vocab_size("source"), built.notes,
                  lengths=limits, spec=spec)


def _from_onnx_file(source: str, backend: str, provider: str, threads: int | None,
                    decoder_start: int, cache: bool, compile: bool = False,
                    cuda_graph: bool = False) -> Opened:
    from tfgraph.exporters.onnx import runtime as rt

    from tfgraph.hf.files import beside

    model = rt.load_model(source)
    tokenizer = beside(Path(source).parent, "tokenizer.json", "tokenizer file")
    if backend == "onnx":
        stepper, runs_on = _onnx_stepper(model, Path(source), source, provider, threads,
                                         decoder_start, cuda_graph)
        names = {i.name for i in model.graph.input}
        from tfgraph.exporters.onnx.model import SPEC_METADATA_KEY

        stored = _stored_spec(model, source) \
            if SPEC_METADATA_KEY in {p.key for p in model.metadata_props} else None
        if "attention_mask" in names or "encoder_attention_mask" in names:  # a KV-cache
            # model: its stored spec says the vocabulary
            prompt_vocab = stored.vocab_size("source") if stored is not None else None
        else:
            vocab = rt.interface(model, source).vocab
            prompt_vocab = vocab.get("input_ids", vocab.get("src_ids"))
        return Opened(stepper, source, runs_on, tokenizer, prompt_vocab,
                      lengths=Lengths.of(stored) if stored is not None else None, spec=stored)
    spec = _stored_spec(model, source)
    from tfgraph.exporters import to_torch
    from tfgraph.spec.stored import model_graph

    # An encoder-decoder's KV-cache decoder_model.onnx holds part of the weights; the rest are
    # in the encoder_model.onnx `build --kv-cache` writes beside it.
    files = [Path(source)]
    if "encoder_attention_mask" in {i.name for i in model.graph.input}:
        if compile:
            raise TfgraphError("--compile: decoder-only models (an encoder-decoder's static "
                               "cache is not built yet)")
        encoder = beside(Path(source).parent, "encoder_model.onnx", "encoder model")
        if encoder is None:
            raise TfgraphError(f"{source}: no encoder_model.onnx beside this decoder model "
                               "(tfgraph build --kv-cache writes both)")
        files.append(encoder)
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for other in files[1:]:
        shapes.update({t.name: tuple(t.dims) for t in rt.load_model(str(other)).graph.initializer})
    # The metadata is checked against the model's weights before anything else is compiled.
    graph = model_graph(spec, shapes, source)
    graphs = _decoding_graphs(spec, cache, source)
    _check_file_weights(graph, source)
    names = {p.name for p in graph.params()}
    weights = {name: value for path in files
               for name, value in rt.load_initializers(path, names).items()}
    if len(graphs) == 1:  # a decoder: the same parameters run through its cache graph
        graph = graphs[0]
    module = to_torch(graph, weights=weights)
    stepper, runs_on = _torch_stepper(module, spec, provider, threads, decoder_start,
                                          compile)
    return Opened(stepper, f"{source} (torch, its weights)", runs_on, tokenizer,
                  spec.vocab_size("source"), lengths=Lengths.of(spec), spec=spec)


def _onnx_stepper(model: Any, session_source: bytes | Path, where: str, provider: str,
                  threads: int | None, decoder_start: int, cuda_graph: bool = False
                  ) -> tuple[Stepper, str]:
    """The stepper for an ONNX model: full recompute for today's interface, a cached stepper
    for the KV-cache interface."""
    from tfgraph.exporters.onnx import runtime as rt
    from tfgraph.exporters.onnx.recompute import RecomputeOnnx

    initializers = {t.name for t in model.graph.initializer}
    inputs = tuple(i.name for i in model.graph.input if i.name not in initializers)
    if any(name.startswith(CACHE_INPUT_PREFIXES) for name in inputs):
        return _cached_onnx_stepper(model, session_source, where, provider, threads,
                                    decoder_start, cuda_graph)
    if cuda_graph:
        raise TfgraphError(f"--cuda-graph: {CUDA_GRAPH_MODELS}")
    iface = rt.interface(model, where)
    spec = _stored_spec(model, where) if iface.spec_json is not None else None
    if spec is not None:
        _check_decodes(spec, where)
    elif iface.inputs == rt.TOKEN_TYPE_INPUTS:
        raise TfgraphError(f"{where}: takes token_type_ids (an encoder): nothing to generate")
    session, ran, why = rt.create_session(session_source, provider, threads=threads,
                                          dtype=iface.dtype)
    vocab = _vocab(model, spec, where)
    max_len = Lengths.of(spec).hard_limit if spec is not None else None
    stepper = RecomputeOnnx(session, iface.inputs, vocab, max_len, decoder_start,
                            output_probs=iface.output == "probs")
    return stepper, f"{ran} ({why})"


def _cached_onnx_stepper(model: Any, session_source: bytes | Path, where: str, provider: str,
                         threads: int | None, decoder_start: int, cuda_graph: bool = False
                         ) -> tuple[Stepper, str]:
    """The stepper of a KV-cache ONNX model (README, "KV cache"): the past keys/values each step
    returns are fed back at the next (tfgraph.generation.cached)."""
    from tfgraph.exporters.onnx import runtime as rt
    from tfgraph.exporters.generation.cached_steppers import onnx_cached

    names = [i.name for i in model.graph.input]
    if "encoder_attention_mask" in names:  # an encoder-decoder's decoder_model.onnx
        if cuda_graph:
            raise TfgraphError(f"--cuda-graph: {CUDA_GRAPH_MODELS}")
        return _seq2seq_files(model, session_source, where, provider, threads, decoder_start)
    missing = [n for n in ("input_ids", "attention_mask") if n not in names]
    if missing or not any(n.startswith("past_key_values.") for n in names):
        raise TfgraphError(f"{where}: not a KV-cache model tfgraph drives (needs input_ids, "
                           "attention_mask, past_key_values.{i}.key|value and, unless its "
                           "positions are relative, position_ids)")
    from tfgraph.exporters.generation.cache_interface import check_cache_interface

    fused = check_cache_interface(model, where)  # before any buffer is sized from it
    if cuda_graph and not fused:
        raise TfgraphError(f"--cuda-graph: {CUDA_GRAPH_MODELS}")
    props = {p.key for p in model.metadata_props}
    from tfgraph.exporters.onnx.model import SPEC_METADATA_KEY

    spec = _stored_spec(model, where) if SPEC_METADATA_KEY in props else None
    dtype = rt.elem_name(model.graph.output[0].type.tensor_type.elem_type)
    if cuda_graph and dtype == "float32":
        raise TfgraphError("--cuda-graph: onnxruntime's CUDA GroupQueryAttention has float16 "
                           "and bfloat16 kernels only (a float32 model's attention runs on the "
                           "CPU, which graph capture refuses); build it with --dtype "
                           "float16 (a SPEC: dtype: float16)")
    session, ran, why = rt.create_session(session_source, provider, threads=threads,
                                          dtype=dtype, cuda_graph=cuda_graph)
    vocab = _vocab(model, spec, where)
    max_len = Lengths.of(spec).hard_limit if spec else None
    probs = spec is not None and spec.output == "probs"
    if fused:
        # onnxruntime's fused attention (build --fused-attention): right-padded rows, one
        # buffer per layer shared by past and present
        from tfgraph.exporters.generation.fused_stepper import FusedOnnx

        graphs = "; decode steps as a CUDA graph" if cuda_graph else ""
        if ran == rt.CUDA and dtype == "float32":
            graphs += ("; GroupQueryAttention has no float32 CUDA kernel in onnxruntime: the "
                       "attention runs on the CPU (build with --dtype float16 for the GPU)")
        return FusedOnnx(session, vocab, max_len, probs, cuda_graph=cuda_graph), \
            f"{ran} ({why}; fused attention, shared cache buffers{graphs})"
    stepper = onnx_cached(session, vocab, max_len, output_probs=probs)
    return stepper, f"{ran} ({why})"


def _seq2seq_files(decoder: Any, session_source: bytes | Path, where: str, provider: str,
                   threads: int | None, decoder_start: int) -> tuple[Stepper, str]:
    """decoder_model.onnx with the encoder_model.onnx `build --kv-cache` writes beside it."""
    from tfgraph.exporters.onnx import runtime as rt
    from tfgraph.exporters.generation.cached_steppers import onnx_seq2seq

    if not isinstance(session_source, Path):
        raise TfgraphError(f"{where}: an encoder-decoder's decoder model needs its encoder "
                           "model beside it")
    from tfgraph.hf.files import beside

    encoder_path = beside(session_source.parent, "encoder_model.onnx", "encoder model")
    if encoder_path is None:
        raise TfgraphError(f"{where}: no encoder_model.onnx beside this decoder model "
                           "(tfgraph build --kv-cache writes both)")
    spec = _stored_spec(decoder, where)
    sessions = []
    for source in (encoder_path, session_source):
        session, ran, why = rt.create_session(source, provider, threads=threads,
                                              dtype=spec.dtype)
        sessions.append(session)
    stepper = onnx_seq2seq(sessions[0], sessions[1], spec.output_vocab,
                           Lengths.of(spec).hard_limit, decoder_start, spec.output == "probs")
    return stepper, f"{ran} ({why})"


class _ModeBack:
    """Puts a module back in training mode when generation is done (Opened.keep)."""

    def __init__(self, module: Any) -> None:
        self.module = module

    def cleanup(self) -> None:
        self.module.train()


def stepper_for_module(module: Any, provider: str = "auto", threads: int | None = None,
                       decoder_start: int = 0, cache: bool = True,
                       compile: bool = False) -> Opened:
    """Generate with a torch module ``to_torch`` made (a decoder's or an encoder-decoder's
    full model, e.g. right after training): its own parameters, on its own device unless
    ``provider`` names one (``auto`` keeps the module where it is). A module in training mode
    decodes in eval mode (no dropout) and is put back in training mode afterwards."""
    import torch

    from tfgraph.exporters.torch.module import DecoderModel, EncoderDecoderModel

    if not isinstance(module, (DecoderModel, EncoderDecoderModel)):
        raise TfgraphError(f"{type(module).__name__}: not a tfgraph model to generate with (a "
                           "spec, a model folder, an .onnx file or a decoder's or "
                           "encoder-decoder's module from to_torch)")
    spec = module.source_graph.spec
    if spec is None:  # a graph built by hand carries no spec: nothing says how to decode it
        raise TfgraphError(f"{module.graph_name}: a module of a graph without a spec")
    info = module.info
    if info.kind != "full" or info.part is not None or info.arch not in (
            "decoder-only", "encoder-decoder"):
        raise TfgraphError(f"{module.graph_name}: generation takes a decoder's or an "
                           "encoder-decoder's full model (to_torch(tfgraph.compile(spec)))")
    _check_decodes(spec, module.graph_name)
    if provider == "auto":
        device, why = str(next(module.parameters()).device), "the module's device"
    else:
        device, why = _torch_device(provider)
    keep = _ModeBack(module) if module.training else None
    module.eval()
    vocab, probs = spec.output_vocab, spec.output == "probs"
    limits = Lengths.of(spec)
    stepper: Stepper
    if isinstance(module, EncoderDecoderModel):
        if compile:
            raise TfgraphError("--compile: decoder-only models (an encoder-decoder's static "
                               "cache is not built yet)")
        from tfgraph.exporters.generation.cached_steppers import torch_seq2seq

        if threads:
            torch.set_num_threads(threads)
        stepper = torch_seq2seq(module._part_module("encoder"), module._part_module("decoder"),
                                vocab, limits.hard_limit, device, decoder_start, probs)
        runs_on = f"torch {device} ({why})"
    else:
        target = module.cached_model() if cache else module
        stepper, runs_on = _torch_stepper(target, spec, device, threads, decoder_start,
                                          compile, why)
    return Opened(stepper, f"{module.graph_name} (torch module, its weights)", runs_on, None,
                  spec.vocab_size("source"), [], keep, limits, spec)


def _torch_stepper(module: Any, spec: Spec, provider: str, threads: int | None,
                   decoder_start: int, compile: bool = False,
                   why: str | None = None) -> tuple[Stepper, str]:
    """The stepper for the torch module: full recompute (the module's forward takes whole
    sequences); a cached forward would be picked here. ``threads`` sets torch's intra-op
    threads for the process (small models decode faster on one thread than on busy cores)."""
    import torch

    from tfgraph.exporters.torch.recompute import RecomputeTorch

    if why is None:
        device, why = _torch_device(provider)
    else:  # a device chosen by the caller (a module's own)
        device = provider
    if threads:
        torch.set_num_threads(threads)
    if compile:
        from tfgraph.exporters.generation.cached_steppers import TorchStatic

        if not getattr(module, "cache_layers", 0):
            raise TfgraphError("--compile decodes through a KV cache: this model has none")
        static = TorchStatic(module, spec.output_vocab, Lengths.of(spec).hard_limit, device,
                             output_probs=spec.output == "probs", compile=True)
        return static, f"torch {device} ({why}; static cache, torch.compile mode " \
                       f"{static.mode or 'default'})"
    if getattr(module, "cache_layers", 0):  # the KV-cache graph's module
        from tfgraph.exporters.generation.cached_steppers import torch_cached

        return torch_cached(module, spec.output_vocab, Lengths.of(spec).hard_limit, device,
                            output_probs=spec.output == "probs"), f"torch {device} ({why})"
    stepper = RecomputeTorch(module, "tgt_ids" in module.input_names, spec.output_vocab,
                             Lengths.of(spec).hard_limit, decoder_start,
                             output_probs=spec.output == "probs",
                             device=device)
    return stepper, f"torch {device} ({why})"


def _torch_device(provider: str) -> tuple[str, str]:
    """``--provider`` for the torch back end: cpu, cuda, or auto (CUDA when torch sees it)."""
    import torch

    if provider not in ("auto", "cuda", "cpu"):
        raise TfgraphError(f"--provider {provider}: choose one of auto, cuda, cpu")
    if provider == "cpu":
        return "cpu", "requested"
    if torch.cuda.is_available():
        return "cuda", "requested" if provider == "cuda" else "auto: CUDA is usable"
    if provider == "cuda":
        raise TfgraphError("--provider cuda: torch sees no CUDA device here; use --provider "
                           "cpu or auto")
    return "cpu", "auto: torch sees no CUDA device"


def _onnx_model(graph: Graph, weights: Any, seed: int, opset: int,
                fused_attention: bool = False) -> tuple[Any, bytes | Path, Any]:
    """(temporary folder or None, session source, model proto): in memory, or written to a
    temporary folder when the weights pass protobuf's 2 GiB (as ``tfgraph run`` does);
    ``fused_attention`` as for ``to_onnx``."""
    from tfgraph.passes.cost import weights_bytes
    from tfgraph.exporters.onnx import runtime as rt
    from tfgraph.exporters.onnx.model import (EXTERNAL_DATA_THRESHOLD, session_bytes, to_onnx,
                                              write_onnx)
    from tfgraph.limits import check_weight_memory

    # the build and the session it feeds, before either allocates (to_onnx checks its part)
    check_weight_memory(f"{graph.name}: the onnxruntime session",
                        session_bytes(graph, given=weights is not None), weights_bytes(graph))
    if weights_bytes(graph) <= EXTERNAL_DATA_THRESHOLD:
        model = to_onnx(graph, weights=weights, seed=seed, opset=opset,
                        fused_attention=fused_attention)
        return None, model.SerializeToString(), model
    keep = tempfile.TemporaryDirectory(prefix="tfgraph-generate-")
    try:
        written = write_onnx(graph, Path(keep.name) / f"{graph.name}.onnx", weights=weights,
                             seed=seed, opset=opset, fused_attention=fused_attention)
        return keep, written, rt.load_model(written)
    except BaseException:
        keep.cleanup()
        raise


def _stored_spec(model: Any, where: str) -> Spec:
    """The spec tfgraph stored in an ONNX model's metadata, validated as untrusted input."""
    from tfgraph.exporters.onnx.model import SPEC_METADATA_KEY
    from tfgraph.spec.stored import stored_spec

    props = {p.key: p.value for p in model.metadata_props}
    if SPEC_METADATA_KEY not in props:
        raise TfgraphError(f"{where}: --backend torch needs the spec, and this model carries "
                           "none (it was not built by tfgraph); use --backend onnx")
    return stored_spec(props[SPEC_METADATA_KEY], where)


def _check_file_weights(graph: Graph, where: str) -> None:
    """Refuse (exit 2), before reading them, an ONNX file's weights that cannot fit in memory
    with the copies a torch module of them makes: the file's initializers (``onnx.load``,
    at the model's dtype), their float32 arrays (``runtime.load_initializers``) and the module's own
    copy (``torch_build_bytes``, given weights)."""
    from tfgraph.exporters.torch.module import torch_build_bytes
    from tfgraph.limits import check_weight_memory
    from tfgraph.passes.cost import weights_bytes

    at_dtype = weights_bytes(graph)
    float32 = 4 * sum(math.prod(p.attrs["shape"]) for p in graph.params())
    need = at_dtype + float32 + torch_build_bytes(graph, given=True)
    check_weight_memory(f"{where}: its weights in torch", need, at_dtype)




def _vocab(model: Any, spec: Spec | None, where: str) -> int:
    """The vocabulary a model's logits cover: its stored spec's, which must then be the
    logits' own size when the model fixes it (metadata saying otherwise would index past the
    logits the sampler is given), else that size."""
    if spec is None:
        return _output_vocab(model)
    dims = model.graph.output[0].type.tensor_type.shape.dim
    fixed = int(dims[-1].dim_value) if dims and dims[-1].dim_value > 0 else None
    if fixed is not None and fixed != spec.output_vocab:
        raise TfgraphError(f"{where}: the spec in its metadata has a vocabulary of "
                           f"{spec.output_vocab:,}, its logits {fixed:,}; the metadata does "
                           "not describe this model")
    return spec.output_vocab


def _output_vocab(model: Any) -> int:
    """The last dimension of a model's output (its vocabulary), when the model fixes it."""
    dims = model.graph.output[0].type.tensor_type.shape.dim
    if not dims or dims[-1].dim_value <= 0:
        raise TfgraphError("the model's output has no fixed vocabulary dimension")
    return int(dims[-1].dim_value)
