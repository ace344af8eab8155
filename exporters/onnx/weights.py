"""Parameter values for the ONNX writer: where they come from, and streaming them in order.

The values are float32 numpy arrays, either the caller's (a dict of numpy arrays or a torch
``state_dict``, checked against the graph's parameters) or the shared generator of
``tfgraph.graph.weights`` (the same seed gives the torch back end's weights). They are produced ahead
of the writer on worker threads, with a bound on the bytes in flight, so that writing a model
never holds all its weights at once.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Generator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from tfgraph.exporters.onnx.tensors import Value, numpy_dtype
from tfgraph.graph.ir import Graph, Node

ValueOf = Callable[[Node], Value]


def as_float32(value: Any) -> np.ndarray:
    """A numpy float32 array from a numpy array or a torch tensor (duck-typed: no torch import)."""
    if hasattr(value, "detach"):  # torch.Tensor (any dtype, any device)
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)


def weight_source(graph: Graph, weights: Mapping[str, Any] | None, seed: int,
                  verbatim: bool = False) -> ValueOf:
    """parameter -> float32 value: from ``weights`` (checked) or tfgraph.graph.weights' generator.
    ``verbatim``: the writer takes copied bytes too, so a parameter a checkpoint stores as it
    is written (``weights.verbatim``, tfgraph.hf.checkpoint_weights) is not read at all.

    Raises TfgraphError listing missing, unexpected and wrongly shaped ``weights``.
    """
    if weights is None:
        from tfgraph.graph.weights import init_param
        from tfgraph.seeds import check_seed

        seed = check_seed("seed", seed)  # before any parameter is drawn, on this thread
        return lambda p: init_param(p.name, p.attrs["shape"], p.attrs["init"], seed)
    from tfgraph.graph.weights import check_weights, weight_shapes

    check_weights(weight_shapes(weights), graph, "weights")
    find = getattr(weights, "verbatim", None) if verbatim else None
    if find is not None:
        return lambda p: find(p.name, p.type.dtype) or as_float32(weights[p.name])
    return lambda p: as_float32(weights[p.name])


def stream_values(params: Sequence[Node], value_of: ValueOf, lookahead_bytes: int,
                  workers: int | None = None
                  ) -> Generator[tuple[Node, Value], None, None]:
    """(parameter, float32 value) in the order of ``params``, produced ahead on threads.

    numpy's generators release the GIL while filling arrays, so the parameters after this
    one are generated on the other cores while this one is cast and written. What is in
    flight is bounded by ``lookahead_bytes`` (or one parameter, when a single one is larger),
    so memory stays bounded for any model size; a model's first parameter is often its
    largest (the token table) and the others go on being generated while the writer waits.
    """
    workers = workers or min(8, os.cpu_count() or 1)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="tfgraph-weights")
    try:
        pending: deque[tuple[Node, Future[Value], int]] = deque()
        in_flight, nxt = 0, 0
        while nxt < len(params) or pending:
            while nxt < len(params):
                param = params[nxt]
                size = 4 * math.prod(param.attrs["shape"])  # float32 until cast
                # A parameter larger than the budget is generated alone: several multi-GB
                # matrices in flight at once would exhaust memory (huge specs were OOM-killed).
                if pending and in_flight + size > lookahead_bytes:
                    break
                pending.append((param, pool.submit(value_of, param), size))
                in_flight += size
                nxt += 1
            param, future, size = pending.popleft()
            in_flight -= size
            yield param, future.result()
    finally:  # a failed or interrupted write stops here: drop the weights not yet started
        pool.shutdown(wait=True, cancel_futures=True)


def write_memory_bytes(graph: Graph) -> int:
    """Memory that writing ``graph``'s weights can hold at once: the largest parameter in
    float32 plus its cast copy, twice (the one being written and the next one generated)."""
    most = 0
    for p in graph.params():
        dtype = p.type.dtype
        cast = 0 if dtype == "float32" else numpy_dtype(dtype).itemsize
        most = max(most, math.prod(p.attrs["shape"]) * (4 + cast))
    return 2 * most
