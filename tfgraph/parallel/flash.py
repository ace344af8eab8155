"""FlashAttention-2's measured speed on Hopper, by head dimension, sequence length and mask: the
rate ``tfgraph plan`` gives a fused attention core on the GPUs whose ``Gpu.flash_measured`` is
set (``tfgraph.parallel.timing``). PyTorch's SDPA runs FlashAttention-2 first on CUDA (its
fixed backend priority: flash, memory-efficient, math, cuDNN).

The figures are the FlashAttention-2 bars of Shah et al. 2024, "FlashAttention-3" (Figures 5
and 6): BF16 on an H100 80GB SXM5, hidden size 2048 (heads x head dimension), batch x length =
16k tokens, TFLOP/s with a causal mask's FLOPs counted as half. At head dimension 128 and 16k
tokens they give 334.4 TFLOP/s forward + backward, the 335 of FlashAttention-2's own paper
(Dao 2023 §4.1), the one share of peak (0.34) the planner used before.

The paper measures the backward pass without a mask, and no backward at head dimension 256:
a masked backward is taken at the unmasked backward's rate times the forward's masked /
unmasked ratio at the same head dimension and length (the same diagonal tiles are wasted each
way); head dimension 256 takes 128's backward. Between the measured points the rate is
interpolated in log2 of the length and of the head dimension, and held at the ends.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

REFERENCE_PEAK = 989e12
"""The H100 SXM's dense BF16 peak the measured TFLOP/s are shares of."""
REFERENCE_TOKENS = 16384
"""Batch x length of every measured point."""
REFERENCE_HIDDEN = 2048
"""Heads x head dimension of every measured point."""
LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)

FORWARD: dict[tuple[int, bool], tuple[float, ...]] = {
    # (head dim, masked): TFLOP/s at LENGTHS (Figure 5)
    (64, False): (282, 306, 318, 321, 322, 324),
    (64, True): (180, 229, 262, 284, 295, 299),
    (128, False): (309, 350, 362, 368, 370, 370),
    (128, True): (191, 260, 298, 319, 333, 335),
    (256, False): (275, 313, 321, 323, 324, 326),
    (256, True): (208, 251, 278, 293, 297, 298),
}
BACKWARD: dict[int, tuple[float, ...]] = {
    # head dim: TFLOP/s at LENGTHS, no mask (Figure 6)
    64: (198, 238, 264, 279, 287, 291),
    128: (214, 260, 291, 310, 318, 322),
}


def _along(points: Sequence[float], values: Sequence[float], x: float) -> float:
    """``values`` at ``x``, linear in log2 between the measured ``points``, held at the ends."""
    if x <= points[0]:
        return values[0]
    if x >= points[-1]:
        return values[-1]
    for i in range(1, len(points)):
        if x <= points[i]:
            lo, hi = math.log2(points[i - 1]), math.log2(points[i])
            w = (math.log2(x) - lo) / (hi - lo)
            return values[i - 1] + w * (values[i] - values[i - 1])
    raise AssertionError("unreachable: x is below the last point")


def _forward(head_dim: float, length: float, masked: bool) -> float:
    dims = sorted({d for d, _ in FORWARD})
    at = [_along(LENGTHS, FORWARD[(d, masked)], length) for d in dims]
    return _along(dims, at, head_dim)


def _backward(head_dim: float, length: float) -> float:
    dims = sorted(BACKWARD)
    return _along(dims, [_along(LENGTHS, BACKWARD[d], length) for d in dims], head_dim)


def flash_fraction(head_dim: float, length: float, masked: bool, backward: bool) -> float:
    """Share of the BF16 peak FlashAttention-2 reaches on Hopper for a pass over keys of
    ``length`` at ``head_dim``, with a causal mask or without (measured at 16k tokens of hidden
    size 2048; ``reference_heads`` gives that batch). The planner reads a sliding window's
    core at the keys a query reads (each query block runs over about that many): an
    approximation, the paper measures no window."""
    if not backward:
        rate = _forward(head_dim, length, masked)
    else:
        rate = _backward(head_dim, length)
        if masked:
            rate *= _forward(head_dim, length, True) / _forward(head_dim, length, False)
    return rate * 1e12 / REFERENCE_PEAK


def reference_heads(head_dim: float, length: float) -> float:
    """(batch x heads) of the measured point at this head dimension and length."""
    return max(REFERENCE_TOKENS / length, 1.0) * REFERENCE_HIDDEN / head_dim
