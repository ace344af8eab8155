"""ONNX back end: the op graph written directly as an ``onnx.ModelProto`` (no tracing, no torch).

This is the public module: :func:`to_onnx` (a model in memory) and :func:`write_onnx` (a file,
weights streamed), with the limits that decide how a model is written. The pieces:

- ``onnx_ops`` / ``onnx_builder``: one emitter per op (``ONNX_OPS``) and the builder they share;
- ``onnx_graph``: the model without weights (nodes, interface, opset, metadata);
- ``onnx_weights``: parameter values, generated ahead of the writer on worker threads;
- ``onnx_writer``: the file, each parameter appended as it arrives (protobuf framing
  explained there), or an external data file for models past protobuf's 2 GiB;
- ``onnx_tensors``: numpy arrays as ``TensorProto`` s.

Parameters become initializers named as README.md's parameter table lists them (the
``state_dict`` keys), in torch's layout; a tied table is one initializer read twice. Positional
tables, rotary cos/sin and causal masks are computed in the graph from the runtime sequence
length, so every length works without a baked-in maximum; learned positions stop at
``max_len``, and a longer input is an error that names ``max_len``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Generator, Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnx

from tfgraph.limits import check_weight_memory
from tfgraph.passes.cost import weights_bytes
from tfgraph.exporters.onnx.fused_attention import refusal as fused_attention_refusal
from tfgraph.exporters.onnx.graph import SPEC_METADATA_KEY, build_structure
from tfgraph.exporters.onnx.ops import (ATTENTION_OPSET, GELU_OPSET, MAX_OPSET, MIN_OPSET,
                                        ONNX_OPS, RMSNORM_OPSET, ROPE_OPSET, check_opset)
from tfgraph.exporters.onnx.tensors import (ELEM_TYPE, Value, cast_array, make_initializer,
                                            numpy_dtype, tensor_header)
from tfgraph.exporters.onnx.weights import (as_float32, stream_values, weight_source,
                                            write_memory_bytes)
from tfgraph.exporters.onnx.writer import check_data_file, external_data_path, write_model
from tfgraph.graph.ir import Graph, Node, expect_graph

__all__ = [
    "ATTENTION_OPSET", "ELEM_TYPE", "EXTERNAL_DATA_THRESHOLD", "GELU_OPSET", "LOOKAHEAD_BYTES",
    "MAX_OPSET", "MIN_OPSET", "ONNX_OPS", "RMSNORM_OPSET", "ROPE_OPSET", "SPEC_METADATA_KEY",
    "as_float32", "build_structure", "cast_array", "check_opset", "fused_attention_refusal",
    "make_initializer", "numpy_dtype", "onnx_build_bytes", "parameter_values", "session_bytes",
    "tensor_header", "to_onnx", "weight_source", "write_memory_bytes", "write_onnx",
]

# A single protobuf cannot exceed 2 GiB; larger models keep their weights in a side file.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # bytes of weights; leaves room for the graph itself
# Generated weights in flight ahead of the writer (see onnx_weights.stream_values).
LOOKAHEAD_BYTES = 512 * 1024 * 1024
# Given weights (a checkpoint read on demand) in flight ahead of the writer.
READ_AHEAD_BYTES = 64 * 1024 * 1024


def parameter_values(graph: Graph, weights: Mapping[str, Any] | None, seed: int,
                     workers: int | None = None
                     ) -> Generator[tuple[Node, np.ndarray], None, None]:
    """(parameter, float32 value) in graph order: ``weights`` (checked) or the shared
    generator at ``seed``, produced ahead on threads within LOOKAHEAD_BYTES (generated) or
    READ_AHEAD_BYTES (given: reading ahead gains little, and each byte ahead is resident)."""
    ahead = LOOKAHEAD_BYTES if weights is None else READ_AHEAD_BYTES
    return cast(Generator[tuple[Node, np.ndarray], None, None],
                stream_values(graph.params(), weight_source(graph, weights, seed), ahead,
                              workers))


def written_values(graph: Graph, weights: Mapping[str, Any] | None, seed: int
                   ) -> Generator[tuple[Node, Value], None, None]:
    """As :func:`parameter_values`, for writers: a parameter a checkpoint stores as it is
    written comes as bytes to copy file to file (onnx_tensors.CopiedBytes), never read."""
    ahead = LOOKAHEAD_BYTES if weights is None else READ_AHEAD_BYTES
    return stream_values(graph.params(), weight_source(graph, weights, seed, verbatim=True),
                         ahead)


def onnx_build_bytes(graph: Graph, given: bool) -> int:
    """Host memory :func:`to_onnx` holds at once, from the shapes alone: every initializer
    at the model's dtype (the proto owns them all), plus the values in flight ahead of it
    (LOOKAHEAD_BYTES generated, READ_AHEAD_BYTES given) and the parameter being cast and
    copied into its proto (``write_memory_bytes``). Measured on an 8-layer TinyLlama (1.9 GB
    in float32): peak 1.44x the weights generated (this says 1.55x), 1.27x given (1.30x)."""
    float32 = 4 * sum(math.prod(p.attrs["shape"]) for p in graph.params())
    ahead = min(READ_AHEAD_BYTES if given else LOOKAHEAD_BYTES, float32)  # a small model's all
    return weights_bytes(graph) + ahead + write_memory_bytes(graph)


def session_bytes(graph: Graph, given: bool) -> int:
    """Host memory of building ``graph`` and opening it in an onnxruntime session in this
    process (``tfgraph run`` and ``generate --backend onnx``): up to EXTERNAL_DATA_THRESHOLD
    the model is built in memory (:func:`onnx_build_bytes`), serialised (a second copy of
    the weights) and parsed by onnxruntime into its own tensors (a third): measured 3.8x the
    weights on a 4-layer TinyLlama (1.2 GB), which this overestimates by a few hundred MB;
    past it the file is written streaming (``write_memory_bytes``) and onnxruntime holds
    the weights once."""
    weights = weights_bytes(graph)
    if weights <= EXTERNAL_DATA_THRESHOLD:
        return onnx_build_bytes(graph, given) + 2 * weights
    return weights + write_memory_bytes(graph)


def to_onnx(graph: Graph, weights: Mapping[str, Any] | None = None, seed: int = 0,
            opset: int = MAX_OPSET, fused_attention: bool = False) -> onnx.ModelProto:
    """``graph`` as an ONNX model whose initializers are the parameters.

    ``weights``: name -> array (numpy, or a torch state_dict's tensors); default: the shared
    generator ``tfgraph.graph.weights.generate(graph, seed)``, so the same seed gives the torch back
    end's weights. ``fused_attention``: a decoder's KV-cache graph with onnxruntime's fused
    GroupQueryAttention kernel where it is exact for the model (its attention_mask then
    right-padded: exporters/onnx/fused_attention.py), the written-out attention where it
    is not (``fused_attention_refusal`` says why). Raises TfgraphError for weights with
    wrong names or shapes, or a bad opset, and before anything is allocated when the model
    cannot fit in the memory available (:func:`onnx_build_bytes`; :func:`write_onnx`
    streams a model of any size to a file), and when ``graph`` is not a graph (a spec, a path).
    """
    expect_graph(graph)
    need = onnx_build_bytes(graph, given=weights is not None)
    check_weight_memory(f"{graph.name}: the ONNX model", need, weights_bytes(graph))
    model = build_structure(graph, opset, fused_attention)
    model.graph.initializer.extend(
        make_initializer(p.name, value, p.type.dtype)
        for p, value in parameter_values(graph, weights, seed))
    return model


def write_onnx(graph: Graph, path: str | os.PathLike[str], weights: Mapping[str, Any] | None = None,
               seed: int = 0, opset: int = MAX_OPSET,
               progress: Callable[[int], None] | None = None,
               fused_attention: bool = False) -> Path:
    """Write ``graph`` as an ONNX file atomically (no partial file; an old one survives a failure).

    The file is the model :func:`to_onnx` returns for the same arguments, but its weights are
    streamed one parameter at a time from their arrays to the file, never held all at once
    nor copied into one big protobuf. Models whose weights pass EXTERNAL_DATA_THRESHOLD keep
    them in ``<path>.data`` next to the model (protobuf stops at 2 GiB). ``progress`` is called
    with the bytes of each parameter written. Ctrl-C or SIGTERM during the write leave no
    temporary file, and the temporary files of a killed earlier write of ``path`` are removed
    (``tfgraph.io``). An existing ``<path>.data`` is replaced or removed only when it is the
    weights file of the tfgraph model at ``path``; any other is refused (TfgraphError) before
    anything is written. ``fused_attention`` as for :func:`to_onnx`.
    """
    from tfgraph.io import check_capacity, remove_stale_temps

    expect_graph(graph)
    target = Path(path)
    check_data_file(target)  # a <path>.data tfgraph did not write: refused before any work
    total = weights_bytes(graph)
    for stale in (target, external_data_path(target)):  # before the free disk is measured
        remove_stale_temps(stale)
    check_capacity(target, total, write_memory_bytes(graph))
    model = build_structure(graph, opset, fused_attention)
    stream = written_values(graph, weights, seed)
    try:
        return write_model(model, ((p.name, p.type.dtype, value) for p, value in stream),
                           target, external=total > EXTERNAL_DATA_THRESHOLD, progress=progress)
    finally:
        stream.close()  # a failed or interrupted write stops the generation now, not at exit
