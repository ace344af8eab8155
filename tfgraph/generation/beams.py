"""Beam search: Hugging Face transformers' algorithm (GenerationMixin._beam_search, 5.x), so a
checkpoint gives the tokens ``model.generate(num_beams=N)`` gives.

Scores are length-normalised: a finished hypothesis scores its summed token log-probabilities
divided by ``generated_length ** length_penalty`` (transformers' convention, default
``length_penalty=1.0``; 0 gives the plain log-probability sum). Per prompt and step, the best
``K = max(2, 1 + #eos) * N`` continuations of the N live beams are ranked by summed
log-probability; those that end (an EOS token, or the length limit) finish if they rank in the
top N, the best N of the others stay live. A prompt is done when its N finished hypotheses
can no longer be beaten by the best live beam scored at the current length (transformers'
``early_stopping=False`` heuristic), when every continuation ended, or at the length limit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.generation.backend import Stepper
from tfgraph.generation.result import Clock
from tfgraph.generation.sampling import log_softmax


@dataclass
class _Prompt:
    """The search state of one prompt: live beams (tokens, summed log-prob), finished ones
    (normalised score, tokens), and whether a new hypothesis could still improve them."""

    limit: int
    live: list[tuple[list[int], float]] = field(default_factory=lambda: [([], 0.0)])
    finished: list[tuple[float, list[int]]] = field(default_factory=list)
    improvable: bool = True
    done: bool = False


def beam_search(stepper: Stepper, ids: np.ndarray, lengths: np.ndarray, beams: int,
                limits: list[int], eos: frozenset[int], length_penalty: float,
                clock: Clock) -> list[tuple[list[int], float]]:
    """The best hypothesis per prompt and its score; ``limits`` caps each prompt's length."""
    width = max(2, 1 + len(eos)) * beams
    states = [_Prompt(limit) for limit in limits]
    logits = stepper.prefill(ids, lengths)
    clock.mark_prefilled()
    length = 0
    while True:
        if logits.shape != (sum(len(s.live) for s in states if not s.done), stepper.vocab):
            raise TfgraphError(f"the back end returned logits {list(logits.shape)} for the "
                               "live beams")
        if np.isnan(logits).any():
            raise TfgraphError("the model produced NaN logits (check its weights)")
        logp = log_softmax(logits)
        length += 1
        parents: list[int] = []
        tokens: list[int] = []
        start = 0
        for state in states:
            if state.done:
                continue
            block = logp[start:start + len(state.live)]
            chosen = _advance(state, block, start, beams, width, length, eos, length_penalty)
            start += len(block)
            for parent, token in chosen:
                parents.append(parent)
                tokens.append(token)
        if length == 1:
            clock.mark_first_token()
        if not parents:
            return [(s.finished[0][1], s.finished[0][0]) for s in states]
        stepper.reorder(np.asarray(parents, dtype=np.int64))
        logits = stepper.step(np.asarray(tokens, dtype=np.int64))


def _advance(state: _Prompt, logp: np.ndarray, first_row: int, beams: int, width: int,
             length: int, eos: frozenset[int], length_penalty: float) -> list[tuple[int, int]]:
    """One step of one prompt: update its beams from ``logp`` (its live rows' log-probs) and
    return (stepper row, token) of the beams that stay live."""
    vocab = logp.shape[1]
    sums = np.asarray([score for _, score in state.live])[:, None] + logp
    flat = sums.ravel()
    k = min(width, flat.size)
    top = np.argpartition(-flat, k - 1)[:k]
    top = top[np.argsort(-flat[top], kind="stable")]
    at_limit = length >= state.limit
    norm = float(length) ** length_penalty
    running: list[tuple[list[int], float, int]] = []
    for rank, index in enumerate(top.tolist()):
        beam, token = divmod(index, vocab)
        tokens = [*state.live[beam][0], token]
        score = float(flat[index])
        if at_limit or token in eos:
            if rank < beams and state.improvable:
                state.finished.append((score / norm, tokens))
        elif len(running) < beams:
            running.append((tokens, score, first_row + beam))
    state.finished.sort(key=lambda item: -item[0])
    del state.finished[beams:]
    if len(state.finished) == beams and running \
            and running[0][1] / norm <= state.finished[-1][0]:
        state.improvable = False
    if at_limit or not running or not state.improvable:
        state.done = True  # a prompt is only ever done with hypotheses finished
        return []
    state.live = [(tokens, score) for tokens, score, _ in running]
    return [(row, tokens[-1]) for tokens, _, row in running]
