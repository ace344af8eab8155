"""Decoding with a KV cache: a stepper for the KV-cache graph (README, "KV cache").

Prompts come left-padded; the attention mask marks the padding and grows by one real column
per step, position ids count each row's real tokens from 0 (the convention of Hugging Face's
``generate``: the model's positions and rotary angles then match the row run alone), and the
past keys/values each call returns are handed back at the next. Only the new token of each
row is fed after the prefill, so a step costs one position, not the whole prefix. The back end
is a function running the model once (tfgraph.exporters.generation.cached_steppers), so this file holds
the bookkeeping both back ends share.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from tfgraph.generation.floats import float32, log_probs

Past = Any
"""The back end's past keys/values (a dict of arrays, a tuple of tensors)."""

Run = Callable[[np.ndarray, np.ndarray, np.ndarray, Past], tuple[np.ndarray, Past]]
"""(input_ids (B, S), attention_mask (B, P+S), position_ids (B, S), past) -> (logits (B, S, V)
in the model's float dtype, present)."""


def last_logits(logits: np.ndarray, output_probs: bool) -> np.ndarray:
    """Each row's last position (B, V) as a new float32 array (converted after the
    selection: tfgraph.generation.floats); a model ending in a softmax gives probabilities,
    whose logs are logits of the same distribution (tfgraph.generation.floats.log_probs)."""
    last = float32(logits[:, -1])
    return log_probs(last) if output_probs else last


class Cached:
    """A :class:`~tfgraph.generation.backend.Stepper` over a KV-cache model (decoder-only).

    ``empty(batch)`` makes a cache with no positions; ``select(past, rows)`` keeps, drops or
    repeats rows of one. ``output_probs``: the model ends in a softmax, so its outputs become
    log-probabilities (logits of the same distribution).
    """

    encoder_decoder = False

    def __init__(self, run: Run, empty: Callable[[int], Past],
                 select: Callable[[Past, np.ndarray], Past], vocab: int, max_len: int | None,
                 output_probs: bool = False) -> None:
        self.run, self.empty, self.select = run, empty, select
        self.vocab, self.max_len, self.output_probs = vocab, max_len, output_probs
        self.mask = np.zeros((0, 0), np.int64)  # (B, P): 1 real, 0 padding
        self.next_position = np.zeros(0, np.int64)  # (B,): position of each row's next token
        self.past: Past = None

    def _last(self, logits: np.ndarray) -> np.ndarray:
        return last_logits(logits, self.output_probs)

    def prefill(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        batch, width = ids.shape
        self.mask = (np.arange(width)[None, :] >= width - lengths[:, None]).astype(np.int64)
        positions = np.clip(np.cumsum(self.mask, axis=1) - 1, 0, None)  # (B, S)
        logits, self.past = self.run(ids.astype(np.int64), self.mask, positions,
                                     self.empty(batch))
        self.next_position = lengths.astype(np.int64)
        return self._last(logits)

    def step(self, next_ids: np.ndarray) -> np.ndarray:
        batch = next_ids.shape[0]
        self.mask = np.concatenate([self.mask, np.ones((batch, 1), np.int64)], axis=1)
        positions = self.next_position[:, None]  # (B, 1)
        logits, self.past = self.run(next_ids.astype(np.int64)[:, None], self.mask, positions,
                                     self.past)
        self.next_position = self.next_position + 1
        return self._last(logits)

    def reorder(self, rows: np.ndarray) -> None:
        self.mask = self.mask[rows]
        self.next_position = self.next_position[rows]
        self.past = self.select(self.past, rows)


Encode = Callable[[np.ndarray, np.ndarray, np.ndarray], Past]
"""(src_ids (B, S), attention_mask (B, S), position_ids (B, S)) -> the cross-attention
keys/values of every decoder layer (the encoder part's outputs)."""

Decode = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Past, Past],
                  tuple[np.ndarray, Past]]
"""(input_ids (B, S), attention_mask (B, P+S), position_ids (B, S), encoder_attention_mask
(B, T), cross keys/values, past) -> (logits (B, S, V), present)."""


class CachedSeq2Seq:
    """A :class:`~tfgraph.generation.backend.Stepper` over an encoder-decoder's two KV-cache
    graphs: the (left-padded) sources are encoded once, which also computes every decoder
    layer's cross-attention keys/values; each target starts from ``decoder_start`` and grows
    one token per step through the decoder's own cache. ``select(state, rows)`` keeps,
    drops or repeats rows of a cache (the back end's)."""

    encoder_decoder = True

    def __init__(self, encode: Encode, decode: Decode, empty: Callable[[int], Past],
                 select: Callable[[Past, np.ndarray], Past], vocab: int, max_len: int | None,
                 decoder_start: int = 0, output_probs: bool = False) -> None:
        self.encode, self.decode, self.empty, self.select = encode, decode, empty, select
        self.vocab, self.max_len = vocab, max_len
        self.decoder_start, self.output_probs = decoder_start, output_probs
        self.source_mask = np.zeros((0, 0), np.int64)
        self.mask = np.zeros((0, 0), np.int64)
        self.cross: Past = None
        self.past: Past = None

    def _last(self, logits: np.ndarray) -> np.ndarray:
        return last_logits(logits, self.output_probs)

    def prefill(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        batch, width = ids.shape
        self.source_mask = (np.arange(width)[None, :] >= width - lengths[:, None]).astype(
            np.int64)
        positions = np.clip(np.cumsum(self.source_mask, axis=1) - 1, 0, None)
        self.cross = self.encode(ids.astype(np.int64), self.source_mask, positions)
        start = np.full((batch, 1), self.decoder_start, np.int64)
        self.mask = np.ones((batch, 1), np.int64)
        logits, self.past = self.decode(start, self.mask, np.zeros((batch, 1), np.int64),
                                        self.source_mask, self.cross, self.empty(batch))
        return self._last(logits)

    def step(self, next_ids: np.ndarray) -> np.ndarray:
        batch = next_ids.shape[0]
        position = np.full((batch, 1), self.mask.shape[1], np.int64)  # targets are unpadded
        self.mask = np.concatenate([self.mask, np.ones((batch, 1), np.int64)], axis=1)
        logits, self.past = self.decode(next_ids.astype(np.int64)[:, None], self.mask,
                                        position, self.source_mask, self.cross, self.past)
        return self._last(logits)

    def reorder(self, rows: np.ndarray) -> None:
        self.source_mask, self.mask = self.source_mask[rows], self.mask[rows]
        self.cross = self.select(self.cross, rows)
        self.past = self.select(self.past, rows)
