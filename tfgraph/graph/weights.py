"""The one weight generator both back ends use, so a seed gives the same weights everywhere.

Scheme (GPT-2's, Radford et al. 2019): matrices and embedding tables ~ N(0, 0.02), biases 0,
norm gains 1. Each parameter draws from its own stream seeded by (seed, crc32(name)), so a
parameter's values depend only on the seed and its name, not on graph order. Values are float32;
back ends cast to the spec's dtype. numpy only: the ONNX path must not import torch.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from tfgraph.seeds import check_seed
from tfgraph.terminal import printable, short_path

from tfgraph.graph.ir import Graph

INIT_STD = 0.02


def init_param(name: str, shape: tuple[int, ...], init: str, seed: int) -> np.ndarray:
    """One parameter's initial float32 value."""
    if init == "zeros":
        return np.zeros(shape, dtype=np.float32)
    if init == "ones":
        return np.ones(shape, dtype=np.float32)
    if init == "normal":
        rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
        # float32 draws straight away (ziggurat): ~3x faster than float64 normal() + astype,
        # which dominated `tfgraph build` of a 63M-parameter model.
        value = rng.standard_normal(size=shape, dtype=np.float32)
        value *= np.float32(INIT_STD)
        return value
    raise ValueError(f"{name}: unknown init {init!r} (expected normal, zeros or ones)")


def generate(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Initial values of every parameter of ``graph`` by name (README.md, "Parameter names").
    A ``seed`` outside 0 .. 2**64 - 1 is refused (TfgraphError) before any is drawn."""
    seed = check_seed("seed", seed)
    return {p.name: init_param(p.name, p.attrs["shape"], p.attrs["init"], seed)
            for p in graph.params()}


def weight_shapes(weights: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Shapes of given weights by name, without reading lazy ones: a mapping with a
    ``shapes()`` method (a checkpoint read on demand, tfgraph.hf.checkpoint_weights) says
    them from its headers."""
    shapes = getattr(weights, "shapes", None)
    if callable(shapes):
        return dict(shapes())
    return {n: tuple(np.shape(v)) for n, v in weights.items()}


class WeightSubset(Mapping[str, Any]):
    """The weights of ``names`` out of ``weights`` (one of an encoder-decoder's two KV-cache
    graphs takes part of the model's), read on demand when ``weights`` reads on demand."""

    def __init__(self, weights: Mapping[str, Any], names: list[str]) -> None:
        self.weights, self.names = weights, names
        self._set = set(names)

    def __getitem__(self, name: str) -> Any:
        if name not in self._set:
            raise KeyError(name)
        return self.weights[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        every = weight_shapes(self.weights)
        return {n: every[n] for n in self.names}

    def verbatim(self, name: str, dtype: str) -> Any:
        """Bytes to copy, when the source can give them (tfgraph.hf.checkpoint_weights)."""
        find = getattr(self.weights, "verbatim", None)
        return find(name, dtype) if find is not None and name in self._set else None


def param_shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """Expected shape of every parameter by name."""
    return {p.name: tuple(p.attrs["shape"]) for p in graph.params()}


def load_weights(path: str, graph: Graph, check_finite: bool = False
                 ) -> dict[str, np.ndarray]:
    """Read a ``.safetensors`` file and check it against ``graph``'s parameters.

    Raises ``TfgraphError`` (exit 2) listing every missing, unexpected and mis-shaped name,
    and with ``check_finite`` naming a tensor that holds NaN or infinity.
    Values come back as float32 numpy arrays (16-bit files are widened; back ends cast).
    """
    from safetensors import SafetensorError, safe_open

    from tfgraph.errors import TfgraphError
    from tfgraph.io import check_input_file

    check_input_file(path, "weights file")  # a FIFO would block the read forever
    shown = short_path(path, 80)  # the file name stays (its folders go first)
    try:
        need = _check_dtypes(path, safe_open, shown)
        from tfgraph.limits import check_weight_memory
        from tfgraph.passes.cost import weights_bytes

        check_weight_memory(f"{shown}: reading the weights", need, weights_bytes(graph))
        arrays = _read_safetensors(path, safe_open)
    except (OSError, SafetensorError, ValueError) as err:
        raise TfgraphError(f"{shown}: cannot read weights: {shorten(str(err))}") from None
    check_weights({n: tuple(a.shape) for n, a in arrays.items()}, graph, shown)
    # A NaN or an infinity in a weights file is always a mistake (a diverged run, a bad
    # conversion): refused whether or not --check-finite was given (it also covers folders).
    for name, array in arrays.items():
        if not np.isfinite(array).all():
            raise TfgraphError(f"{shown}: {printable(shorten(name))} holds NaN or infinite "
                               "values")
    return {n: a.astype(np.float32, copy=False) for n, a in arrays.items()}


# Tensor dtypes a weights file may hold (safetensors' names): the float types tfgraph builds
# in. Integers, booleans, float64 and float8 are refused rather than converted silently.
WEIGHT_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def shorten(text: str, limit: int = 80) -> str:
    """``text`` cut to about ``limit`` characters for an error line (a hostile file may hold
    a 5 MB tensor name)."""
    return text if len(text) <= limit else f"{text[:limit - 20]}...({len(text):,} chars)"


def _check_dtypes(path: str, safe_open, shown: str) -> int:  # type: ignore[no-untyped-def]
    """Refuse a tensor of a dtype tfgraph does not build in; return the bytes that reading
    the file holds at once (from its header): every tensor as stored, and a 16-bit one's
    float32 copy too (load_weights widens; a float32 one is returned as it was read)."""
    from tfgraph.errors import TfgraphError

    need = 0
    with safe_open(path, framework="numpy") as f:
        for name in f.keys():
            piece = f.get_slice(name)
            dtype = str(piece.get_dtype())
            if dtype not in WEIGHT_DTYPES:
                raise TfgraphError(
                    f"{shown}: {printable(shorten(name))} is {dtype}; weights must be float32, "
                    "float16 or bfloat16 (convert the file first)")
            elements = math.prod(piece.get_shape())
            need += elements * (4 if dtype == "F32" else 2 + 4)
    return need


def check_weights(shapes: dict[str, tuple[int, ...]], graph: Graph, source: str) -> None:
    """Raise ``TfgraphError`` summarising the missing, unexpected and mis-shaped names of
    ``shapes`` (name -> shape of given weights, from ``source``) against ``graph``: counts and
    the first few names of each (tfgraph.spec.name_mismatch)."""
    from tfgraph.errors import TfgraphError
    from tfgraph.spec.name_mismatch import mismatch_line

    problem = mismatch_line(param_shapes(graph), shapes)
    if problem:
        raise TfgraphError(f"{source}: weights do not match {graph.name}: {problem}")


def _read_safetensors(path: str, safe_open) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    # safetensors' numpy reader returns bfloat16 tensors as ml_dtypes.bfloat16 arrays (onnx's
    # dependency; importing it registers the dtype), so no torch is needed: the ONNX path must
    # not import it (README.md, "How it works").
    import ml_dtypes  # noqa: F401

    with safe_open(path, framework="numpy") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def save_weights(weights: dict[str, np.ndarray], path: str) -> None:
    """Write float32 numpy weights as ``.safetensors`` (names as in README.md, "Parameter names")."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in weights.items()}, path)
