"""Scaled rotary inverse frequencies: the one place they are computed.

Lowering puts the result on the rope nodes (attributes ``inv_freq`` and ``scale``) and every
back end reads it from there: ``to_torch`` and the generated ``model.py`` build their cos/sin
tables from it, the ONNX builder writes it as a constant. The formulas are those of Hugging
Face's ``modeling_rope_utils`` (transformers 5), in float64 (transformers computes in float32;
the difference is far below the parity tolerance). Unscaled rope needs none of this: its
frequencies theta^(-2i/d) are computed by each back end from ``theta``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from tfgraph.spec.rope import RopeScaling

if TYPE_CHECKING:
    from tfgraph.spec.schema import Spec


def base_frequencies(dim: int, theta: float) -> list[float]:
    """theta^(-2i/dim) for i < dim/2 (Su et al. 2021), dim the rotated channels of a head."""
    return [1.0 / theta ** (2 * i / dim) for i in range(dim // 2)]


def scaled_frequencies(dim: int, theta: float, s: RopeScaling) -> tuple[tuple[float, ...], float]:
    """The inverse frequencies of ``s`` for ``dim`` rotated channels, and the factor cos and
    sin are multiplied by (yarn's attention factor; 1 otherwise). ``s`` is derived
    (``Spec._derive`` resolved its defaults)."""
    inv = base_frequencies(dim, theta)
    if s.type == "linear":  # position interpolation: positions / factor (Chen et al. 2023)
        return tuple(f / s.factor for f in inv), 1.0
    if s.type == "llama3":
        return tuple(_llama3(inv, s)), 1.0
    assert s.attention_factor is not None
    return tuple(_yarn(inv, dim, theta, s)), s.attention_factor


def _llama3(inv: list[float], s: RopeScaling) -> list[float]:
    """Llama 3.1: wavelengths longer than original_max_len / low_freq_factor are divided by
    factor, shorter than original_max_len / high_freq_factor kept, a linear ramp in
    original_max_len / wavelength between (transformers' _compute_llama3_parameters)."""
    assert s.original_max_len and s.low_freq_factor is not None and s.high_freq_factor
    old, low, high = s.original_max_len, s.low_freq_factor, s.high_freq_factor
    out = []
    for f in inv:
        wavelen = 2 * math.pi / f
        if wavelen > old / low:
            f = f / s.factor
        elif not wavelen < old / high:  # medium: interpolate between scaled and kept
            smooth = (old / wavelen - low) / (high - low)
            f = (1 - smooth) * f / s.factor + smooth * f
        out.append(f)
    return out


def _yarn(inv: list[float], dim: int, theta: float, s: RopeScaling) -> list[float]:
    """YaRN's NTK-by-parts (Peng et al. 2023): channels that turn fewer than beta_slow times
    over the original context are interpolated (divided by factor), more than beta_fast times
    extrapolated (kept), with a linear ramp between (transformers' _compute_yarn_parameters)."""
    assert s.original_max_len and s.beta_fast is not None and s.beta_slow is not None
    old = s.original_max_len

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(s.beta_fast), correction_dim(s.beta_slow)
    if s.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers: prevent a division by zero
    out = []
    for i, f in enumerate(inv):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extrapolation = 1 - ramp
        out.append(f / s.factor * (1 - extrapolation) + f * extrapolation)
    return out


def rotary_attrs(spec: Spec, theta: float, rotary_dim: Any, scaled: bool = True
                 ) -> dict[str, Any]:
    """The rope node attributes beyond heads, head_dim and theta, present only when they
    differ from whole-head, rotate-half, unscaled rotation: ``rotary_dim`` (a size: symbolic
    in formula twins), ``interleaved``, and with ``embedding.rope_scaling`` (unless not
    ``scaled``) its ``scaling`` type, the ``inv_freq`` of the rotated channels and the
    ``scale`` of cos and sin."""
    emb = spec.embedding
    out: dict[str, Any] = {}
    if rotary_dim is not None:
        out["rotary_dim"] = rotary_dim
    if emb.rotary_layout == "interleaved":
        out["interleaved"] = True
    if emb.rope_scaling is not None and scaled:
        inv_freq, scale = scaled_frequencies(spec.rotary_dim, theta, emb.rope_scaling)
        out.update(scaling=emb.rope_scaling.type, inv_freq=inv_freq, scale=scale)
    return out
