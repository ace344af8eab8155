"""One timed generation run, as benchmarks/decode.py records it for every side.

Every side is timed the way ``tfgraph generate`` reports (tfgraph.generation.result): prefill
is the model's pass over the prompt; time to first token runs from the call to the first chosen
token; decode is from the first token to the last, over the tokens after each row's first
(64 new tokens: 63 decode steps per row). One definition for all sides, so the ratios compare
the same interval.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Tokens per row (prompt excluded) and the phases' seconds. ``model_s``: the part of the
    decode interval spent inside the model's forward calls, where the side can say (else
    None); the rest is the decoding loop's own work."""

    tokens: list[list[int]]
    prefill_s: float
    first_token_s: float
    decode_s: float
    decode_tokens: int
    model_s: float | None = None

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s

    @property
    def ms_per_step(self) -> float:
        """Milliseconds per decode step (one token for every row of the batch)."""
        return 1e3 * self.decode_s * len(self.tokens) / self.decode_tokens


def median_of(values: list[float]) -> float:
    return float(statistics.median(values))
