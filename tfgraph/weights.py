"""The one weight generator both back ends use, so a seed gives the same weights everywhere.

Scheme (GPT-2's, Radford et al. 2019): matrices and embedding tables ~ N(0, 0.02), biases 0,
norm gains 1. Each parameter draws from its own stream seeded by (seed, crc32(name)), so a
parameter's values depend only on the seed and its name, not on graph order. Values are float32;
back ends cast to the spec's dtype. numpy only: the ONNX path must not import torch.
"""

from __future__ import annotations

import zlib

import numpy as np

from tfgraph.ir import Graph

INIT_STD = 0.02


def init_param(name: str, shape: tuple[int, ...], init: str, seed: int) -> np.ndarray:
    """One parameter's initial float32 value."""
    if init == "zeros":
        return np.zeros(shape, dtype=np.float32)
    if init == "ones":
        return np.ones(shape, dtype=np.float32)
    if init == "normal":
        rng = np.random.default_rng([int(seed), zlib.crc32(name.encode())])
        return rng.normal(0.0, INIT_STD, size=shape).astype(np.float32)
    raise ValueError(f"{name}: unknown init {init!r} (expected normal, zeros or ones)")


def generate(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Initial values of every parameter of ``graph`` by name (design §4 names)."""
    return {p.name: init_param(p.name, p.attrs["shape"], p.attrs["init"], seed)
            for p in graph.params()}


def param_shapes(graph: Graph) -> dict[str, tuple[int, ...]]:
    """Expected shape of every parameter by name."""
    return {p.name: tuple(p.attrs["shape"]) for p in graph.params()}
