"""Choosing the next token from logits: greedy (the default) or seeded sampling.

Sampling applies the usual filters in Hugging Face transformers' order (TemperatureLogitsWarper,
TopKLogitsWarper, TopPLogitsWarper) and with their rules: divide the logits by the temperature,
keep the ``top_k`` largest (ties with the k-th kept; when ``top_k`` is not given, the model
folder's ``top_k`` or else transformers' default of 50, as its ``generate(do_sample=True)``
does; 0 keeps every token), then nucleus sampling (Holtzman et al. 2019) as TopPLogitsWarper
computes it: tokens sorted by ascending probability (ties in id order), those whose cumulative
probability is at most ``1 - top_p`` removed, the most likely token always kept (so at a tie
at the cut the higher ids stay). Draws come from a numpy ``Generator`` seeded once, so a seed
reproduces a run.
"""

from __future__ import annotations

import math
import numbers

from dataclasses import dataclass, field

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.seeds import check_seed

DEFAULT_TOP_K = 50
"""transformers' top_k when sampling with neither the user nor the model setting one
(GenerationConfig._get_default_generation_params)."""


@dataclass
class Sampler:
    """Greedy when no sampling setting is given (or ``temperature`` is 0, the common spelling
    of greedy); otherwise samples with the given settings, from ``seed``. ``top_k`` None
    applies ``default_top_k`` (the model's, else transformers' 50); 0 applies no top-k.
    ``temperature`` / ``top_p`` None apply ``default_temperature`` / ``default_top_p`` (the
    model's, else transformers' 1.0: no change)."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    default_top_k: int = DEFAULT_TOP_K
    default_temperature: float = 1.0
    default_top_p: float = 1.0
    _rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # types first (the Python API's arguments; the CLI's flags are parsed by click)
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or type(value).__name__ in (
                    "bool", "bool_") or not isinstance(value, numbers.Real)):
                raise TfgraphError(f"{name} {value!r}: a number, or None")
        if self.top_k is not None and (isinstance(self.top_k, bool) or type(
                self.top_k).__name__ in ("bool", "bool_") or not isinstance(self.top_k,
                                                                            numbers.Integral)):
            raise TfgraphError(f"top_k {self.top_k!r}: a whole number >= 0, or None")
        if self.seed is not None:
            self.seed = check_seed("seed", self.seed)
        if self.temperature is not None and not 0 <= self.temperature < math.inf:
            # inf flattened every distribution to uniform draws, NaN compared false
            raise TfgraphError(f"--temperature {self.temperature}: must be finite and >= 0 "
                               "(0: greedy)")
        if self.top_k is not None and (isinstance(self.top_k, bool) or self.top_k < 0):
            raise TfgraphError(f"--top-k {self.top_k}: must be >= 0 (0: no top-k filter)")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise TfgraphError(f"--top-p {self.top_p}: must be in (0, 1]")
        self._rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        if self.temperature == 0:
            return True
        return self.temperature is None and self.top_k is None and self.top_p is None

    def __call__(self, logits: np.ndarray) -> np.ndarray:
        """One token id per row of ``logits`` (B, V)."""
        if self.greedy:
            return np.argmax(logits, axis=-1).astype(np.int64)
        probs = self.probabilities(logits)
        if not np.isfinite(probs).all():  # NaN/inf logits: searchsorted would clamp to the
            # last id, a silent wrong token rather than a draw
            raise TfgraphError("sampling: the model's logits hold NaN or infinity; nothing "
                               "to draw from")
        cumulative = np.cumsum(probs, axis=-1)
        draws = self._rng.random(probs.shape[0]) * cumulative[:, -1]
        picked = [int(np.searchsorted(c, d, side="right")) for c, d in zip(cumulative, draws)]
        return np.minimum(np.asarray(picked, dtype=np.int64), probs.shape[1] - 1)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """The distribution tokens are drawn from (B, V), after temperature, top-k, top-p."""
        scores = logits.astype(np.float64)
        # The row max first, then the temperature: the top logit becomes 0 and the rest
        # negative, so a tiny temperature sends them to -inf (the greedy limit) instead of
        # overflowing the top ones to +inf (inf / inf probabilities: NaN). The overflow to
        # -inf is the intended limit, so it is not warned about; inf - inf (NaN) is refused
        # before any draw (__call__).
        with np.errstate(over="ignore", invalid="ignore"):  # NaN is refused by the caller
            scores = scores - np.max(scores, axis=-1, keepdims=True)
            scores = scores / (self.default_temperature if self.temperature is None
                               else self.temperature)
        top_k = self.default_top_k if self.top_k is None else int(self.top_k)
        if 0 < top_k < scores.shape[-1]:  # TopKLogitsWarper: below the k-th largest removed
            kth = np.partition(scores, -top_k, axis=-1)[:, -top_k][:, None]
            scores = np.where(scores < kth, -np.inf, scores)
        probs = _softmax(scores)
        top_p = self.default_top_p if self.top_p is None else self.top_p
        if top_p < 1:
            # TopPLogitsWarper: ascending (stable, so tied tokens in id order), the cumulative
            # probability at most 1 - top_p removed, the last (most likely) token kept
            order = np.argsort(scores, axis=-1, kind="stable")
            ranked = np.take_along_axis(probs, order, axis=-1)
            remove_ranked = np.cumsum(ranked, axis=-1) <= 1 - top_p
            remove_ranked[:, -1] = False
            remove = np.zeros_like(remove_ranked)
            np.put_along_axis(remove, order, remove_ranked, axis=-1)
            probs = _softmax(np.where(remove, -np.inf, scores))
        return probs


def _softmax(scores: np.ndarray) -> np.ndarray:
    shifted = scores - np.max(scores, axis=-1, keepdims=True)
    weights = np.exp(shifted)
    out: np.ndarray = weights / np.sum(weights, axis=-1, keepdims=True)
    return out


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities (float64) of each row of ``logits``."""
    scores = logits.astype(np.float64)
    shifted = scores - np.max(scores, axis=-1, keepdims=True)
    out: np.ndarray = shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))
    return out
