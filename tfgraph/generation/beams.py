"""Beam search: Hugging Face transformers' algorithm (GenerationMixin._beam_search, 5.x), so a
checkpoint gives the tokens ``model.generate(num_beams=N)`` gives.

Scores are length-normalised: a finished hypothesis scores its summed token log-probabilities
divided by ``generated_length ** length_penalty`` (transformers' convention, default
``length_penalty=1.0``; 0 gives the plain log-probability sum). Per prompt and step, the best
``K = max(2, 1 + #eos) * N`` continuations of the N live beams are ranked by summed
log-probability; those that end (an EOS token, or the length limit) finish if they rank in the
top N, the best N of the others stay live. A prompt is done when every continuation ended, at
the length limit, or as ``early_stopping`` says (transformers' ``_check_early_stop_heuristic``
and ``_beam_search_has_unfinished_sequences``): True, as soon as N hypotheses finished; False
(the default), once N finished and the best live beam, scored at the current length, scores no
more than the worst of them; "never", the same with the live beam scored at the prompt's
length limit where ``length_penalty > 0`` (the best length it could reach; transformers'
``max_length``), else at the current length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from numbers import Real

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.generation.backend import Stepper
from tfgraph.generation.result import Clock
from tfgraph.generation.sampling import log_softmax

EarlyStopping = bool | str  # True, False or "never" (transformers' early_stopping)
# |length_penalty| at most this: length ** length_penalty and the scores it divides stay
# finite floats for any length up to MAX_NEW_TOKENS (2 ** 20) and any log-probability a
# float32 model gives (past it, 12 ** 300 overflowed and 12 ** -300 divided by zero;
# transformers' float32 scores overflow sooner, at -20 past ~90 tokens)
MAX_LENGTH_PENALTY = 20.0


def check_beam_options(beams: int, length_penalty: object, early_stopping: object,
                       cli: bool = False) -> None:
    """Refuse (one line, exit 2) a length penalty or early stopping rule given without beam
    search (``beams`` 1) or that it cannot take (:func:`check_beam_values`). None: not
    given. ``cli``: name them as the command's flags."""
    for name, value in (("length_penalty", length_penalty), ("early_stopping", early_stopping)):
        if value is not None and beams == 1:  # greedy and sampled rows have no beam scores
            raise TfgraphError(f"{_name(name, cli)} {value!r}: for beam search only "
                               f"({_name('beams', cli)} 2 or more)")
    check_beam_values(length_penalty, early_stopping, cli)


def check_beam_values(length_penalty: object, early_stopping: object,
                      cli: bool = False) -> None:
    """Refuse a length penalty that is not a number, is infinite or NaN, or is past
    +-MAX_LENGTH_PENALTY, and an early stopping rule other than True, False or "never"."""
    if length_penalty is not None:
        if isinstance(length_penalty, bool) or not isinstance(length_penalty, Real):
            raise TfgraphError(f"{_name('length_penalty', cli)} {length_penalty!r}: not a "
                               "number")
        if not abs(float(length_penalty)) <= MAX_LENGTH_PENALTY:  # NaN and inf too
            raise TfgraphError(f"{_name('length_penalty', cli)} {length_penalty}: expected a "
                               f"finite number from -{MAX_LENGTH_PENALTY:g} to "
                               f"{MAX_LENGTH_PENALTY:g}")
    if early_stopping is not None and not (isinstance(early_stopping, bool)
                                           or early_stopping == "never"):
        raise TfgraphError(f"{_name('early_stopping', cli)} {early_stopping!r}: True, False "
                           'or "never"')


def _name(name: str, cli: bool) -> str:
    return "--" + name.replace("_", "-") if cli else name


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
                clock: Clock, early_stopping: EarlyStopping = False
                ) -> list[tuple[list[int], float]]:
    """The best hypothesis per prompt and its score; ``limits`` caps each prompt's length."""
    check_beam_values(length_penalty, early_stopping)
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
            chosen = _advance(state, block, start, beams, width, length, eos, length_penalty,
                              early_stopping)
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
             length: int, eos: frozenset[int], length_penalty: float,
             early_stopping: EarlyStopping) -> list[tuple[int, int]]:
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
    full = len(state.finished) == beams
    if full and early_stopping is True:  # no hypothesis is added to a full list
        state.improvable = False
    elif full and running:  # can the best live beam still beat the worst finished one?
        best = length
        if early_stopping == "never" and length_penalty > 0:
            best = state.limit
        if running[0][1] / float(best) ** length_penalty <= state.finished[-1][0]:
            state.improvable = False
    if at_limit or not running or not state.improvable:
        state.done = True  # a prompt is only ever done with hypotheses finished
        return []
    state.live = [(tokens, score) for tokens, score, _ in running]
    return [(row, tokens[-1]) for tokens, _, row in running]
