"""Full recomputation: a stepper for models that take one whole, unpadded sequence.

Today's tfgraph models have no attention mask and no cache (they map ids (B, L) to logits
(B, L, V) with a causal mask), so each step runs every row's whole sequence again and keeps
the last position's logits. Rows of different lengths cannot share a batch without a mask, so
rows are grouped by length and each group runs as one batch: rows of equal length (beams of
one prompt, prompts of equal length) share a run, and the result is what padding done right
would give. The back ends subclass :class:`Recompute` with the one forward pass they run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.generation.floats import log_probs


class Recompute(ABC):
    """Keeps each row's tokens and reruns the model on all of them at every step.

    Decoder-only: a row is its prompt plus the tokens generated so far. Encoder-decoder: a
    row is its source (the prompt, fixed) and its target, which starts as
    ``[decoder_start]``. ``output_probs``: the model ends in a softmax (spec ``output:
    probs``), so its outputs become log-probabilities, which are logits of the same
    distribution.
    """

    def __init__(self, vocab: int, max_len: int | None, encoder_decoder: bool,
                 decoder_start: int = 0, output_probs: bool = False) -> None:
        self.vocab = vocab
        self.max_len = max_len
        self.encoder_decoder = encoder_decoder
        self.decoder_start = decoder_start
        self.output_probs = output_probs
        self._sources: list[np.ndarray] = []  # encoder-decoder only
        self._rows: list[np.ndarray] = []  # the sequence that grows, per row

    @abstractmethod
    def _forward(self, inputs: tuple[np.ndarray, ...]) -> np.ndarray:
        """The model on ``inputs`` ((ids,) or (src_ids, tgt_ids), int64 (B, L)): its output
        (B, L, V) as float32."""

    def prefill(self, ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        if ids.ndim != 2 or lengths.shape != (ids.shape[0],):
            raise TfgraphError(f"prefill: ids {list(ids.shape)} and lengths "
                               f"{list(lengths.shape)} do not describe one batch")
        width = ids.shape[1]
        prompts = [ids[b, width - int(n):].astype(np.int64) for b, n in enumerate(lengths)]
        if self.encoder_decoder:
            self._sources = prompts
            self._rows = [np.array([self.decoder_start], dtype=np.int64) for _ in prompts]
        else:
            self._rows = prompts
        return self._last_logits()

    def step(self, next_ids: np.ndarray) -> np.ndarray:
        if next_ids.shape != (len(self._rows),):
            raise TfgraphError(f"step: {next_ids.shape[0] if next_ids.ndim else 0} tokens "
                               f"for {len(self._rows)} rows")
        self._rows = [np.append(row, np.int64(t)) for row, t in zip(self._rows, next_ids)]
        return self._last_logits()

    def reorder(self, rows: np.ndarray) -> None:
        picked = [int(r) for r in rows]
        self._rows = [self._rows[r] for r in picked]
        if self.encoder_decoder:
            self._sources = [self._sources[r] for r in picked]

    def _last_logits(self) -> np.ndarray:
        """Each row's last-position output, rows of equal lengths run as one batch."""
        groups: dict[tuple[int, int], list[int]] = defaultdict(list)
        for r, row in enumerate(self._rows):
            source = len(self._sources[r]) if self.encoder_decoder else 0
            groups[(source, len(row))].append(r)
        out = np.empty((len(self._rows), self.vocab), dtype=np.float32)
        for members in groups.values():
            tgt = np.stack([self._rows[r] for r in members])
            if self.encoder_decoder:
                src = np.stack([self._sources[r] for r in members])
                full = self._forward((src, tgt))
            else:
                full = self._forward((tgt,))
            out[members] = full[:, -1, :].astype(np.float32)
        if self.output_probs:  # the cached steppers' conversion too (last_logits)
            out = log_probs(out)
        return out
