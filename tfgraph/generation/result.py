"""What a generation run returns, and the clock that times it.

Timing follows what serving systems report: prefill throughput is prompt tokens over the time
of the prefill call; time to first token runs from the start to the first chosen token (prefill
plus choosing); decode throughput is the tokens generated after each row's first over the time
from the first token to the end (prompt tokens are the real ones, padding not counted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any


@dataclass
class Result:
    """Generated ids per prompt (prompt excluded, an EOS that stopped a row included), their
    text when a tokenizer is known, beam scores (beam search only) and timings."""

    tokens: list[list[int]]
    prompt_tokens: int
    prefill_s: float
    time_to_first_token_s: float
    decode_s: float
    decode_tokens: int
    text: list[str] | None = None
    scores: list[float] | None = None
    compile_s: float | None = None  # torch.compile's time before decoding (not in the above)
    notes: list[str] = field(default_factory=list)
    """What the CLI prints as ``note:`` lines: the model's or its folder's settings this run
    did not apply (``tfgraph.generate`` also raises each as a ``TfgraphNote`` warning)."""

    @property
    def prefill_tokens_per_s(self) -> float | None:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """None when no token came after the first ones (nothing was decoded)."""
        if self.decode_tokens == 0 or self.decode_s <= 0:
            return None
        return self.decode_tokens / self.decode_s

    def as_json(self) -> dict[str, Any]:
        """The ``tfgraph generate --json`` object (README, "tfgraph generate")."""
        return {"tokens": self.tokens, "text": self.text,
                "prefill_tokens_per_s": self.prefill_tokens_per_s,
                "decode_tokens_per_s": self.decode_tokens_per_s,
                "time_to_first_token_s": self.time_to_first_token_s,
                "prompt_tokens": self.prompt_tokens, "decode_tokens": self.decode_tokens,
                "scores": self.scores, "compile_s": self.compile_s}


class Clock:
    """Marks the phases of one run on ``time.perf_counter``, stopped while ``paused`` (the
    seconds a stepper spent compiling so far, e.g. TorchStatic's ``compile_s``) grows: a
    compilation inside the loop counts in ``Result.compile_s``, not in the timings."""

    def __init__(self, paused: Callable[[], float] | None = None) -> None:
        self.paused = paused
        self.start = self.now()
        self.prefilled = self.start
        self.first = self.start

    def now(self) -> float:
        """perf_counter less the paused seconds so far."""
        return time.perf_counter() - (self.paused() if self.paused is not None else 0.0)

    def mark_prefilled(self) -> None:
        self.prefilled = self.now()

    def mark_first_token(self) -> None:
        self.first = self.now()

    def result(self, tokens: list[list[int]], prompt_tokens: int,
               scores: list[float] | None = None) -> Result:
        """The run's result, timed up to now."""
        end = self.now()
        decoded = sum(max(0, len(row) - 1) for row in tokens)
        return Result(tokens, prompt_tokens, self.prefilled - self.start,
                      self.first - self.start, end - self.first, decoded, scores=scores)
