"""The in-process sides of benchmarks/decode.py: transformers' ``generate`` and tfgraph's.

transformers: ``model.generate`` (torch eager, its own KV cache, ``do_sample=False``) with EOS
ignored as tfgraph's ``eos_token_id=None`` ignores it: ``eos_token_id=[]``, so EOS is an
ordinary token that ends nothing. (``min_new_tokens = max_new_tokens`` would instead mask
EOS out of the logits, which changes the greedy pick wherever EOS is the arg-max: the tiny
--quick model does that within 64 tokens.) The decode steps are timed with a
streamer: ``generate`` hands it the prompt, then each step's new tokens as they are chosen, so
the decode interval is from the first token's hand-over to the last one's, with no prefill-only
run subtracted. Prefill is timed apart: a forward pass over the prompt as ``generate`` runs it
(``use_cache=True``, logits of the last position only), warm.

tfgraph: what ``tfgraph.generate(DIR, prompts, backend=...)`` does, split in two so the model
is built from the folder once and then timed over several runs: ``prepare`` (folder -> graph
-> onnxruntime session or torch module) and the decoding loop on the opened stepper.

Both sides also time their model's forward calls (a hook / a wrapped call), so the report can
say how much of a decode step is the model and how much the loop around it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from decode_timing import Timing


class CallTimer:
    """Wraps a callable and records the seconds of each call."""

    def __init__(self, call: Callable[..., Any]) -> None:
        self.call = call
        self.seconds: list[float] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.call(*args, **kwargs)
        finally:
            self.seconds.append(time.perf_counter() - start)


class HfSide:
    """transformers' model of the folder (float32, eval) and its ``generate``."""

    def __init__(self, folder: Path) -> None:
        import torch
        import transformers

        transformers.utils.logging.disable_progress_bar()
        transformers.utils.logging.set_verbosity_error()
        start = time.perf_counter()
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32).eval()
        self.loaded_s = time.perf_counter() - start
        self.forward_s: list[float] = []
        self._started = 0.0
        self.model.register_forward_pre_hook(self._pre)
        self.model.register_forward_hook(self._post)
        self.threads = torch.get_num_threads()

    def _pre(self, *_: Any) -> None:
        self._started = time.perf_counter()

    def _post(self, *_: Any) -> None:
        self.forward_s.append(time.perf_counter() - self._started)

    def prefill_s(self, prompts: list[list[int]]) -> float:
        """Seconds of a forward pass over the prompts, as ``generate``'s first step. The
        second of two back to back: the first call after another side has run is slower
        (131 against 93 ms here, torch's threads waking), and the figure should not be
        charged for that (tfgraph's prefill, the first call of its run, is)."""
        import torch

        ids = torch.tensor(prompts, dtype=torch.int64)
        with torch.no_grad():
            for _ in range(2):
                start = time.perf_counter()
                self.model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True,
                           logits_to_keep=1)
                seconds = time.perf_counter() - start
        return seconds

    def run(self, prompts: list[list[int]], new_tokens: int) -> Timing:
        import torch
        from transformers.generation.streamers import BaseStreamer

        marks: list[float] = []

        class Marks(BaseStreamer):
            def put(self, value: Any) -> None:
                marks.append(time.perf_counter())

            def end(self) -> None:
                pass

        prefill = self.prefill_s(prompts)
        ids = torch.tensor(prompts, dtype=torch.int64)
        self.forward_s.clear()
        with torch.no_grad():
            start = time.perf_counter()
            out = self.model.generate(  # no EOS ids (None would mean the folder's); no pads
                ids, attention_mask=torch.ones_like(ids), eos_token_id=[], pad_token_id=0,
                max_new_tokens=new_tokens, do_sample=False, streamer=Marks())
        # marks[0]: the prompt handed over; marks[1]: the first new tokens; marks[-1]: the last
        tokens = out[:, ids.shape[1]:].tolist()
        return Timing(tokens, prefill, marks[1] - start, marks[-1] - marks[1],
                      len(prompts) * (new_tokens - 1), sum(self.forward_s[1:]))


class TfgraphSide:
    """A model folder opened by ``tfgraph.generate``'s own ``prepare``, decoded by its loop."""

    def __init__(self, folder: Path, prompts: list[list[int]], backend: str, cache: bool = True,
                 threads: int | None = None) -> None:
        from tfgraph.commands.generate_api import prepare

        start = time.perf_counter()
        self.ready = prepare(folder, prompts, backend=backend, threads=threads,
                             eos_token_id=None, cache=cache)
        self.loaded_s = time.perf_counter() - start
        self.runs_on = self.ready.opened.runs_on
        stepper: Any = self.ready.opened.stepper
        # the model call: a cached stepper's run(...), a recomputing stepper's _forward(...)
        self.model_calls: CallTimer | None = None
        for name in ("run", "_forward"):
            if callable(getattr(stepper, name, None)):
                self.model_calls = CallTimer(getattr(stepper, name))
                setattr(stepper, name, self.model_calls)
                break

    def run(self, prompts: list[list[int]], new_tokens: int) -> Timing:
        from tfgraph.generation.loop import generate

        if self.model_calls is not None:
            self.model_calls.seconds.clear()
        result = generate(self.ready.opened.stepper, prompts, new_tokens, eos_token_id=None)
        model_s = sum(self.model_calls.seconds[1:]) if self.model_calls is not None else None
        return Timing(result.tokens, result.prefill_s, result.time_to_first_token_s,
                      result.decode_s, result.decode_tokens, model_s)

    def close(self) -> None:
        self.ready.opened.close()


def prompts_for(vocab: int, batch: int, length: int, seed: int = 0) -> list[list[int]]:
    """``batch`` random prompts of ``length`` ids, none of them a special token (ids 0-2)."""
    rng = np.random.default_rng(seed)
    prompts: list[list[int]] = rng.integers(3, vocab, size=(batch, length)).tolist()
    return prompts
