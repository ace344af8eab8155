"""The decoding loop: prompts in, generated tokens and timings out, on any Stepper.

Prompts of different lengths form one left-padded batch. Each row stops on its own: at an EOS
token (kept in its output), after ``max_new_tokens``, or when the next step would feed the
model more positions than its ``max_len`` (a decoder-only row of P prompt tokens generates at
most ``max_len - P + 1`` tokens, an encoder-decoder target at most ``max_len``). Finished rows
leave the stepper's batch through ``reorder``, so the work left shrinks with them. Beam search
(``beams > 1``) is tfgraph.generation.beams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.generation.backend import Stepper
from tfgraph.generation.result import Clock, Result
from tfgraph.generation.sampling import Sampler

OnToken = Callable[[int, int], None]  # (prompt index, token id), as each token is chosen


def generate(stepper: Stepper, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             sampler: Sampler | None = None, beams: int = 1,
             eos_token_id: int | Iterable[int] | None = None, on_token: OnToken | None = None,
             length_penalty: float = 1.0) -> Result:
    """Generate up to ``max_new_tokens`` per prompt (token id lists) with ``stepper``.

    Greedy unless ``sampler`` samples; ``beams > 1`` is beam search (greedy selection; its
    tokens reach ``on_token`` once the search ends). Raises TfgraphError (one line) for empty
    prompts, a prompt longer than the model allows, or a back end that returns NaN.
    """
    sampler = sampler or Sampler()
    rows = check_prompts(stepper, prompts, max_new_tokens)
    eos = eos_ids(eos_token_id)
    limits = [min(max_new_tokens, room(stepper, len(row))) for row in rows]
    ids, lengths = left_pad(rows)
    prompt_tokens = int(lengths.sum())
    if beams > 1:
        if not sampler.greedy:
            raise TfgraphError(f"--beams {beams}: beam search here is deterministic; "
                               "leave out --temperature, --top-k and --top-p")
        from tfgraph.generation.beams import beam_search

        clock = Clock()
        found = beam_search(stepper, ids, lengths, beams, limits, eos, length_penalty, clock)
        result = clock.result([tokens for tokens, _ in found], prompt_tokens,
                              scores=[score for _, score in found])
        if on_token is not None:
            for p, tokens in enumerate(result.tokens):
                for token in tokens:
                    on_token(p, token)
        return result
    if beams < 1:
        raise TfgraphError(f"--beams {beams}: must be >= 1")
    return _decode(stepper, ids, lengths, limits, sampler, eos, on_token, prompt_tokens)


def _decode(stepper: Stepper, ids: np.ndarray, lengths: np.ndarray, limits: list[int],
            sampler: Sampler, eos: frozenset[int], on_token: OnToken | None,
            prompt_tokens: int) -> Result:
    """Greedy or sampled decoding; ``live[r]`` is the prompt of the stepper's row r."""
    clock = Clock()
    logits = stepper.prefill(ids, lengths)
    clock.mark_prefilled()
    live = list(range(len(limits)))
    out: list[list[int]] = [[] for _ in live]
    while True:
        check_logits(logits, len(live), stepper.vocab)
        chosen = sampler(logits)
        if not out[live[0]]:
            clock.mark_first_token()
        keep = []
        for r, (p, token) in enumerate(zip(live, chosen.tolist())):
            out[p].append(token)
            if on_token is not None:
                on_token(p, token)
            if token not in eos and len(out[p]) < limits[p]:
                keep.append(r)
        if not keep:
            return clock.result(out, prompt_tokens)
        if len(keep) < len(live):
            stepper.reorder(np.asarray(keep, dtype=np.int64))
            live = [live[r] for r in keep]
            chosen = chosen[keep]
        logits = stepper.step(chosen)


def check_prompts(stepper: Stepper, prompts: Sequence[Sequence[int]],
                  max_new_tokens: int) -> list[np.ndarray]:
    """The prompts as int64 arrays, checked against the model's limits."""
    if max_new_tokens < 1:
        raise TfgraphError(f"--max-new-tokens {max_new_tokens}: must be >= 1")
    if not prompts:
        raise TfgraphError("no prompt: give --prompt-ids or --prompt")
    rows = []
    for i, prompt in enumerate(prompts):
        row = np.asarray(list(prompt), dtype=np.int64)
        if row.ndim != 1 or row.size == 0:
            raise TfgraphError(f"prompt {i + 1}: no tokens")
        if stepper.max_len is not None and row.size > stepper.max_len:
            raise TfgraphError(f"prompt {i + 1}: {row.size} tokens, longer than the model's "
                               f"max_len {stepper.max_len}")
        rows.append(row)
    return rows


def room(stepper: Stepper, prompt_len: int) -> int:
    """How many tokens a row may generate before the model would be fed past max_len."""
    if stepper.max_len is None:
        return 1 << 62
    if stepper.encoder_decoder:  # the target, [start] + tokens, is fed up to the last token
        return stepper.max_len
    return stepper.max_len - prompt_len + 1


def eos_ids(eos_token_id: int | Iterable[int] | None) -> frozenset[int]:
    if eos_token_id is None:
        return frozenset()
    if isinstance(eos_token_id, (int, np.integer)):
        return frozenset({int(eos_token_id)})
    return frozenset(int(t) for t in eos_token_id)


def left_pad(rows: list[np.ndarray], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(ids (B, S) left-padded with ``pad_id``, lengths (B,))."""
    lengths = np.asarray([row.size for row in rows], dtype=np.int64)
    ids = np.full((len(rows), int(lengths.max())), pad_id, dtype=np.int64)
    for b, row in enumerate(rows):
        ids[b, ids.shape[1] - row.size:] = row
    return ids, lengths


def check_logits(logits: np.ndarray, rows: int, vocab: int) -> None:
    """A back end's answer has one row of ``vocab`` finite-or-masked scores per live row."""
    if logits.shape != (rows, vocab):
        raise TfgraphError(f"the back end returned logits {list(logits.shape)}, expected "
                           f"[{rows}, {vocab}]")
    if np.isnan(logits).any():
        raise TfgraphError("the model produced NaN logits (check its weights, or use float32)")
