"""The decoding loop: prompts in, generated tokens and timings out, on any Stepper.

Prompts of different lengths form one left-padded batch. Each row stops on its own: at an EOS
token (kept in its output), after ``max_new_tokens``, or when the next step would feed the
model more positions than the stepper's ``max_len`` (a learned position table's rows; a
decoder-only row of P prompt tokens generates at most ``max_len - P + 1`` tokens, an
encoder-decoder target at most ``max_len``). Other positions run past the spec's max_len with
a warning (tfgraph.graph.lengths, README "Lengths beyond max_len"). Finished rows leave the
stepper's batch through ``reorder``, so the work left shrinks with them. Beam search
(``beams > 1``) is tfgraph.generation.beams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import cast

import numpy as np

from tfgraph.errors import TfgraphError
from tfgraph.generation.backend import DecodesAhead, Stepper
from tfgraph.generation.result import Clock, Result
from tfgraph.generation.sampling import Sampler
from tfgraph.graph.lengths import Lengths

OnToken = Callable[[int, int], None]  # (prompt index, token id), as each token is chosen

NAN_LOGITS = "the model produced NaN logits (check its weights, or use float32)"



def check_search(sampler: Sampler, beams: int) -> None:
    """Refuse (exit 2) settings the search cannot honour: sampling with beam search. Called
    before a model is built, and again by the loop (for callers of the loop alone)."""
    if beams > 1 and not sampler.greedy:
        raise TfgraphError(f"--beams {beams}: beam search here is deterministic; "
                           "leave out --temperature, --top-k and --top-p")

def generate(stepper: Stepper, prompts: Sequence[Sequence[int]], max_new_tokens: int,
             sampler: Sampler | None = None, beams: int = 1,
             eos_token_id: int | Iterable[int] | None = None, on_token: OnToken | None = None,
             length_penalty: float = 1.0, length_rule: Lengths | None = None,
             early_stopping: bool | str = False) -> Result:
    """Generate up to ``max_new_tokens`` per prompt (token id lists) with ``stepper``.

    Greedy unless ``sampler`` samples; ``beams > 1`` is beam search (greedy selection; its
    tokens reach ``on_token`` once the search ends; ``length_penalty`` and ``early_stopping``
    as transformers', tfgraph.generation.beams). Raises TfgraphError (one line) for empty
    prompts, a prompt longer than the model allows, or a back end that returns NaN.
    ``length_rule``: the spec's max_len rule; given, a BeyondMaxLenWarning says when a learned
    table's max_len cuts a row short or other positions will run past max_len.
    """
    sampler = sampler or Sampler()
    rows = check_prompts(stepper, prompts, max_new_tokens)
    eos = eos_ids(eos_token_id)
    limits = [min(max_new_tokens, room(stepper, len(row))) for row in rows]
    if length_rule is not None:
        check_lengths(length_rule, stepper.encoder_decoder, rows, limits, max_new_tokens)
    ids, lengths = left_pad(rows)
    prompt_tokens = int(lengths.sum())
    check_search(sampler, beams)
    if beams > 1:
        from tfgraph.generation.beams import beam_search

        clock = Clock(_compiling(stepper))
        found = beam_search(stepper, ids, lengths, beams, limits, eos, length_penalty, clock,
                            early_stopping)
        result = clock.result([tokens for tokens, _ in found], prompt_tokens,
                              scores=[score for _, score in found])
        if on_token is not None:
            for p, tokens in enumerate(result.tokens):
                for token in tokens:
                    on_token(p, token)
        return result
    if beams < 1:
        raise TfgraphError(f"--beams {beams}: must be >= 1")
    if sampler.greedy and not eos and on_token is None \
            and getattr(stepper, "decodes_ahead", False):
        return _decode_ahead(cast(DecodesAhead, stepper), ids, lengths, limits, sampler,
                             prompt_tokens)
    return _decode(stepper, ids, lengths, limits, sampler, eos, on_token, prompt_tokens)


def _decode(stepper: Stepper, ids: np.ndarray, lengths: np.ndarray, limits: list[int],
            sampler: Sampler, eos: frozenset[int], on_token: OnToken | None,
            prompt_tokens: int) -> Result:
    """Greedy or sampled decoding; ``live[r]`` is the prompt of the stepper's row r."""
    clock = Clock(_compiling(stepper))
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
        live, chosen = _leave(stepper, live, chosen, keep)
        logits = stepper.step(chosen)


def _decode_ahead(stepper: DecodesAhead, ids: np.ndarray, lengths: np.ndarray,
                  limits: list[int], sampler: Sampler, prompt_tokens: int) -> Result:
    """Greedy decoding with no EOS and no ``on_token``: each row's length is its limit, known
    from the start, so the stepper runs the steps up to the next row's end without handing
    back logits (``greedy_steps``: on CUDA, no synchronisation per step); rows leave the
    batch at their limits as in :func:`_decode`, whose tokens these are."""
    clock = Clock(_compiling(stepper))
    logits = stepper.prefill(ids, lengths)
    clock.mark_prefilled()
    check_logits(logits, len(limits), stepper.vocab)
    chosen = sampler(logits)
    clock.mark_first_token()
    live = list(range(len(limits)))
    out = [[token] for token in chosen.tolist()]
    while True:
        keep = [r for r, p in enumerate(live) if len(out[p]) < limits[p]]
        if not keep:
            return clock.result(out, prompt_tokens)
        live, chosen = _leave(stepper, live, chosen, keep)
        tokens = stepper.greedy_steps(chosen, min(limits[p] - len(out[p]) for p in live))
        for p, row in zip(live, tokens.tolist()):
            out[p].extend(row)
        chosen = tokens[:, -1]


def _leave(stepper: Stepper, live: list[int], chosen: np.ndarray, keep: list[int]
           ) -> tuple[list[int], np.ndarray]:
    """The rows ``keep`` (indices into ``live``) stay: the stepper's batch shrinks to them when
    some left. The prompts still live and their last chosen tokens."""
    if len(keep) == len(live):
        return live, chosen
    stepper.reorder(np.asarray(keep, dtype=np.int64))
    return [live[r] for r in keep], chosen[keep]


def _compiling(stepper: Stepper) -> Callable[[], float] | None:
    """The seconds a compiling stepper (``compile_s``) has spent compiling so far, for the
    clock to leave out (None: a stepper that does not compile)."""
    if not getattr(stepper, "compiled", False):
        return None
    return lambda: float(getattr(stepper, "compile_s", 0.0))


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
                               f"max_len {stepper.max_len}: its learned position table has "
                               "no row past max_len")
        rows.append(row)
    return rows


def check_lengths(lengths: Lengths, encoder_decoder: bool, rows: list[np.ndarray],
                  limits: list[int], max_new_tokens: int) -> None:
    """tfgraph.graph.lengths for what generation will feed the model. Precondition: the prompts
    passed check_prompts and ``limits`` are each row's new tokens (capped by room). A learned
    table: one warning for the first row its max_len cuts short. Other positions: one
    warning for the longest sequence fed past max_len (a decoder-only row feeds its prompt
    and all but its last new token; an encoder-decoder row its source, and a target of as
    many tokens as it generates), one more for the longest target of an encoder-decoder."""
    if lengths.max_len is None:
        return
    level = 5  # warnings.warn's stacklevel from Lengths: the caller of tfgraph.generate
    if lengths.learned:
        for i, (row, n) in enumerate(zip(rows, limits)):
            if n < max_new_tokens:
                lengths.warn(f"prompt {i + 1} ({row.size} tokens) leaves room for {n} of "
                             f"the {max_new_tokens} new tokens: {lengths.name}'s learned "
                             f"position table ends at max_len {lengths.max_len}",
                             "max_new_tokens", n, level)
                return
        return
    if encoder_decoder:
        i = max(range(len(rows)), key=lambda r: rows[r].size)
        lengths.check("prompt", rows[i].size, f"prompt {i + 1} ({rows[i].size} tokens)",
                      level)
        longest = max(limits)
        lengths.check("max_new_tokens", longest,
                      f"{longest} new tokens (the decoder's input)", level)
        return
    fed = [row.size + n - 1 for row, n in zip(rows, limits)]
    i = max(range(len(rows)), key=lambda r: fed[r])
    lengths.check("prompt", fed[i], f"prompt {i + 1} ({rows[i].size} tokens) and up to "
                  f"{limits[i]} new ones feed {fed[i]} positions", level)


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
        raise TfgraphError(NAN_LOGITS)
