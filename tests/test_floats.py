"""tfgraph.generation.floats: the sampler's float32 logits, float16 converted through torch in
slices (tfgraph/generation/floats.py says why): the same values as numpy's conversion, for
every shape, layout and special value, as a new array."""

from __future__ import annotations

import numpy as np
import pytest

from tfgraph.generation.floats import GRAIN, SMALL, float32


@pytest.mark.parametrize("shape", [(3, 5), (1, SMALL), (8, 1, 32000), (2, 3, GRAIN + 7),
                                   (4, 128256)])
def test_float16_converts_as_numpy_does(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    half = (rng.standard_normal(shape) * 300).astype(np.float16)
    flat = half.reshape(-1)
    flat[:4] = [np.inf, -np.inf, np.nan, np.float16(6e-8)]  # and a subnormal
    got = float32(half)
    assert got.dtype == np.float32 and got.shape == half.shape
    assert np.array_equal(got, half.astype(np.float32), equal_nan=True)


def test_a_strided_read_only_view_is_converted_and_never_shared() -> None:
    """``logits[:, -1]`` of (B, S, V) is not contiguous, and an onnxruntime output may be
    read-only; the result is a new array either way (the back end reuses its buffer)."""
    full = np.random.default_rng(1).standard_normal((4, 3, 40000)).astype(np.float16)
    full.setflags(write=False)
    last = full[:, -1]
    got = float32(last)
    assert np.array_equal(got, last.astype(np.float32))
    single = np.ones((2, 40000), np.float32)
    copy = float32(single)
    copy[0, 0] = 5.0
    assert single[0, 0] == 1.0  # float32 input: a copy too
