"""Logits to float32 for the sampler, fast for float16 models; a softmax model's probabilities
to logits (:func:`log_probs`).

numpy converts float16 one element at a time: a (8, 32000) float16 array takes about 480 us
to become float32 (numpy 2.4, this repository's 2-core CI machine), 60 us for one row, against
46 and 6 us through torch's vectorised conversion. A float16 model on a GPU decodes a batch of
8 in a few milliseconds a step (benchmarks/RESULTS.md, "On a GPU"), so numpy's conversion alone
was a tenth to a quarter of a step. torch is imported when a stepper for such a model is made
(:func:`load_for`), before any clock starts, not in the first timed step.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np


SMALL = 4096
"""Arrays this small convert faster in numpy than through torch's call overhead (10 us)."""

GRAIN = 32768
"""Elements under which torch runs an element-wise op on the calling thread (at::internal::
GRAIN_SIZE)."""


@functools.cache
def _torch() -> Any:
    import torch

    return torch


def load_for(dtype: Any) -> None:
    """Import now what converting logits of ``dtype`` will take (torch, for float16)."""
    if np.dtype(dtype) == np.float16:
        _torch()


def float32(values: np.ndarray) -> np.ndarray:
    """A new float32 array of ``values`` (never a view of it: a back end may overwrite its
    own output buffer at the next step)."""
    if values.dtype != np.float16 or values.size < SMALL:
        return np.array(values, np.float32)
    torch = _torch()
    # torch.from_numpy shares the array's memory: it must be contiguous and writable
    source = torch.from_numpy(np.require(values, requirements=["C", "W"]).reshape(-1))
    out = np.empty(values.shape, np.float32)
    target = torch.from_numpy(out.reshape(-1))
    # in slices under torch's grain size, so each runs on this thread: split over torch's
    # threads it fought onnxruntime's spinning ones (5x slower than numpy on 2 cores)
    for start in range(0, source.numel(), GRAIN):
        target[start:start + GRAIN].copy_(source[start:start + GRAIN])
    return out


def log_probs(probs: np.ndarray) -> np.ndarray:
    """The logits of a model that outputs probabilities (spec ``output: probs``): their logs,
    the log-probabilities, -inf where a probability is 0 (that token is never chosen, at any
    temperature, as for transformers' filtered logits). Cached decoding and recomputation
    both convert through here, so they draw from the same distribution."""
    with np.errstate(divide="ignore"):
        out: np.ndarray = np.log(probs)
    return out
