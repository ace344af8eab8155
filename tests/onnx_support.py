"""Helpers shared by the ONNX back end's tests (test_onnx_*.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tfgraph.spec.schema import Spec


def float32_twin(spec: Spec) -> Spec:
    """``spec`` in float32 (onnxruntime's CPU provider has no bfloat16 kernels)."""
    return Spec.model_validate({**spec.model_dump(), "dtype": "float32"})


def feeds_for(graph: Any, batch: int, seq: int, tgt: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Random ids for ``graph``'s inputs: (batch, seq), and (batch, tgt) for tgt_ids; segment
    ids (batch, seq) below embedding.token_types for token_type_ids."""
    rng = np.random.default_rng(seed)
    spec = graph.spec
    if "tgt_ids" not in graph.inputs:
        feeds = {"input_ids": rng.integers(0, spec.vocab_size("source"), (batch, seq))}
        if "token_type_ids" in graph.inputs:
            feeds["token_type_ids"] = rng.integers(0, spec.embedding.token_types, (batch, seq))
        return feeds
    return {"src_ids": rng.integers(0, spec.vocab_size("source"), (batch, seq)),
            "tgt_ids": rng.integers(0, spec.vocab_size("target"), (batch, tgt))}
