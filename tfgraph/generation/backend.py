"""The protocol a back end implements for the decoding loop (tfgraph.generation.loop).

Three calls cover greedy decoding, sampling and beam search, with or without a KV cache:
``prefill`` runs the prompts once, ``step`` feeds one new token per row, and ``reorder`` keeps,
drops or duplicates rows (finished rows leave the batch; beam search follows its beams). A
stepper that recomputes the whole sequence and one that keeps a cache answer the same calls
with the same logits, so the loop never knows which it drives.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Stepper(Protocol):
    """One batch of sequences being generated, on some back end.

    ``vocab``: size of the logits' last axis (the target vocabulary of encoder-decoder models).
    ``max_len``: positions the model allows (None: unbounded), per fed sequence: the prompt
    plus generated tokens of a decoder-only row, the target of an encoder-decoder row (its
    source is checked against it at prefill). Only a learned position table sets one (its
    max_len); other positions run past the spec's max_len (tfgraph.graph.lengths).
    ``encoder_decoder``: whether prompts are source sequences (the target starts from the
    decoder start token) rather than the start of the sequence that grows.
    """

    vocab: int
    max_len: int | None
    encoder_decoder: bool

    def prefill(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """Start one row per prompt. ``ids`` (B, S) int64 are LEFT-padded prompts (the pad id
        is arbitrary), ``lengths`` (B,) their real lengths. Encoder-decoder models encode them
        as sources and start each target from ``decoder_start_token_id``. Returns float32
        logits (B, V) for each row's next token."""
        ...

    def step(self, next_ids: np.ndarray) -> np.ndarray:
        """Append ``next_ids`` (B,) int64, one token per current row; returns logits (B, V)."""
        ...

    def reorder(self, rows: np.ndarray) -> None:
        """Keep rows ``rows`` (int64 indices into the current rows, in this order; repeats
        duplicate a row, omissions drop it): the batch of the next ``step``."""
        ...


class DecodesAhead(Stepper, Protocol):
    """A stepper that also runs greedy steps on its own device (exporters/generation/
    cached_steppers.TorchStatic), so a greedy loop with no EOS and no callback reads tokens
    back once per run of steps rather than logits once per step."""

    decodes_ahead: bool
    """Whether ``greedy_steps`` chooses the tokens the loop's greedy sampler would."""

    def greedy_steps(self, next_ids: np.ndarray, count: int) -> np.ndarray:
        """``count`` steps: feed ``next_ids`` (B,), then each step's argmax; the (B, count)
        int64 tokens chosen."""
        ...
