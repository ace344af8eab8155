"""The rotary knobs of ``embedding`` that have rules of their own: partial rotation
(``rotary_fraction``), the pair layout (``rotary_layout``) and the context-extension scalings
(``rope_scaling``) of Hugging Face's ``modeling_rope_utils`` (transformers 5).

``Spec._derive`` calls :func:`derive_rotary`, which checks these fields against the rest of the
spec and resolves the scaling's derived defaults, raising ``ValueError("field.path: ...")`` like
every other cross-field rule. The frequencies themselves are computed in ``tfgraph.graph.rope``.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tfgraph.spec.derived import check_derived
from tfgraph.spec.numbers import Positive, Within

RotaryLayout = Literal["half", "interleaved"]
RopeScalingType = Literal["linear", "llama3", "yarn"]

# The fields each scaling type reads besides type and factor (transformers'
# _validate_{type}_rope_parameters); any other field written is an error naming it.
SCALING_FIELDS: dict[str, tuple[str, ...]] = {
    "linear": (),
    "llama3": ("low_freq_factor", "high_freq_factor", "original_max_len"),
    "yarn": ("original_max_len", "beta_fast", "beta_slow", "attention_factor", "mscale",
             "mscale_all_dim", "truncate"),
}
_OPTIONAL = ("low_freq_factor", "high_freq_factor", "original_max_len", "beta_fast",
             "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate")


# mscale and mscale_all_dim: 0 leaves them out, as transformers' `if mscale and mscale_all_dim`
# does; a negative one could make 0.1 m ln(factor) + 1 zero or negative (transformers divides
# by it; a zero or negative attention_factor zeroes or flips cos and sin).
Multiplier = Annotated[float, Within(ge=0.0, hint="DeepSeek-V3: 1; 0 leaves it out")]


class RopeScaling(BaseModel):
    """Rotary frequencies rescaled for a context longer than pretraining's."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_default=True)

    type: RopeScalingType
    """linear: every frequency divided by factor (position interpolation, Chen et al. 2023;
    LongChat); llama3: low frequencies divided by factor, high ones kept, a smooth ramp between
    (Llama 3.1 and 3.2); yarn: the NTK-by-parts ramp plus an attention factor on cos and sin
    (Peng et al. 2023; Qwen2.5 long context, DeepSeek-V3)."""
    factor: Annotated[float, Within(ge=1.0, hint="the context grows by this factor")]
    """How many times longer the extended context is (>= 1; Llama 3.1: 8, Qwen2.5: 4)."""
    low_freq_factor: Positive | None = None
    """llama3: wavelengths above original_max_len / low_freq_factor are divided by factor.
    Default: 1 (Llama 3.1)."""
    high_freq_factor: Positive | None = None
    """llama3: wavelengths below original_max_len / high_freq_factor are kept. Default: 4
    (Llama 3.1)."""
    original_max_len: Annotated[int, Field(strict=True, ge=1)] | None = None
    """llama3 and yarn: the pretraining context length (Llama 3.1: 8192; Qwen2.5: 32768).
    Default: max_len."""
    beta_fast: Positive | None = None
    """yarn: rotations per context at which the ramp starts keeping frequencies. Default: 32."""
    beta_slow: Positive | None = None
    """yarn: rotations per context below which frequencies are divided by factor. Default: 1."""
    attention_factor: Positive | None = None
    """yarn: multiplier of cos and sin. Default: 0.1 ln(factor) + 1, or with mscale and
    mscale_all_dim their ratio (0.1 m ln(factor) + 1 for each m), as transformers computes it."""
    mscale: Multiplier | None = None
    """yarn: numerator multiplier of the default attention_factor (DeepSeek-V3: 1); >= 0, 0
    leaves it out."""
    mscale_all_dim: Multiplier | None = None
    """yarn: denominator multiplier of the default attention_factor (DeepSeek-V3: 1); >= 0, 0
    leaves it out."""
    truncate: Annotated[bool, Field(strict=True)] | None = None
    """yarn: round the ramp's correction range outward to whole channels. Default: true
    (gpt-oss: false)."""


def rotary_dim(head_dim: int, fraction: float) -> int:
    """Channels of each head that rotate: int(head_dim * fraction), as GPT-NeoX's rotary_ndims
    and transformers' partial_rotary_factor compute it."""
    return int(head_dim * fraction)


def yarn_attention_factor(factor: float, mscale: float | None,
                          mscale_all_dim: float | None) -> float:
    """transformers' default yarn attention factor: get_mscale(factor) = 0.1 ln(factor) + 1, or
    get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim) when both are given."""
    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return float(get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim))
    return get_mscale(factor)


def derive_rotary(emb: Any, head_dim: int, max_len: int | None) -> None:
    """Check ``emb``'s rotary fields (an ``Embedding`` being derived) and resolve the
    scaling's defaults on a copy of it."""
    if emb.positions != "rope":
        for name, unset in (("rotary_fraction", 1.0), ("rotary_layout", "half"),
                            ("rope_scaling", None)):
            if getattr(emb, name) != unset:
                raise ValueError(f"embedding.{name}: only rotary positions have it; set "
                                 "positions: rope or remove it")
        return
    rd = rotary_dim(head_dim, emb.rotary_fraction)
    if emb.rotary_fraction != 1.0 and (rd < 2 or rd % 2):
        raise ValueError(f"embedding.rotary_fraction: int(head_dim * rotary_fraction) = "
                         f"int({head_dim} * {emb.rotary_fraction:g}) = {rd} channels; rotary "
                         "positions rotate pairs, so choose a fraction giving an even number "
                         "of at least 2")
    if emb.rope_scaling is None:
        return
    emb.rope_scaling = s = emb.rope_scaling.model_copy()
    allowed = SCALING_FIELDS[s.type]
    for name in _OPTIONAL:
        if getattr(s, name) is not None and name not in allowed:
            takes = ", ".join(allowed) if allowed else "only factor"
            raise ValueError(f"embedding.rope_scaling.{name}: not a field of type {s.type} "
                             f"(it takes {takes}); remove it")
    if s.type in ("llama3", "yarn") and s.original_max_len is None:
        if max_len is None:
            raise ValueError(f"embedding.rope_scaling.original_max_len: type {s.type} needs the "
                             "pretraining context length; write it (or set max_len)")
        s.original_max_len = max_len
        check_derived(s, "original_max_len", "embedding.rope_scaling.original_max_len",
                      "max_len")
    if s.type == "llama3":
        s.low_freq_factor = 1.0 if s.low_freq_factor is None else s.low_freq_factor
        s.high_freq_factor = 4.0 if s.high_freq_factor is None else s.high_freq_factor
        if s.high_freq_factor <= s.low_freq_factor:
            raise ValueError("embedding.rope_scaling.high_freq_factor: must be greater than "
                             f"low_freq_factor ({s.low_freq_factor:g})")
    if s.type == "yarn":
        s.beta_fast = 32.0 if s.beta_fast is None else s.beta_fast
        s.beta_slow = 1.0 if s.beta_slow is None else s.beta_slow
        if s.beta_fast < s.beta_slow:
            raise ValueError("embedding.rope_scaling.beta_fast: must be at least beta_slow "
                             f"({s.beta_slow:g})")
        s.truncate = True if s.truncate is None else s.truncate
        if s.attention_factor is None:
            s.attention_factor = yarn_attention_factor(s.factor, s.mscale, s.mscale_all_dim)
            check_derived(s, "attention_factor", "embedding.rope_scaling.attention_factor",
                          "embedding.rope_scaling.factor, mscale and mscale_all_dim")
