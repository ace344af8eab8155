"""onnxruntime-genai's ``og.Generator`` as a peer of benchmarks/decode.py, in the peer venv.

onnxruntime-genai 0.18 brings its own CPU onnxruntime, which cannot share the project venv
(benchmarks/genai_peer.py), so it runs in a worker process of that venv: the worker loads one
model folder (its ``genai_config.json``) once, then answers requests on stdin, one JSON line
each, so the rounds of decode.py can alternate sides without reloading the model.

Greedy (``do_sample=False``); EOS is ignored by ``min_length = max_length`` (the generator
then masks the end token until the last step, as ``min_new_tokens`` does in transformers).
``append_tokens`` runs the prompt through the model (the prefill); the first
``generate_next_token`` only picks a token from those logits; each later one runs one step.

``threads``: None keeps the folder's session options (onnxruntime-genai's default); a number
overlays ``intra_op_num_threads`` on the decoder's session, which is how a user of
onnxruntime-genai would ask for all cores.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import IO, Any

from decode_timing import Timing

WORKER = r"""
import json, sys, time
import numpy as np
import onnxruntime_genai as og

folder, threads = sys.argv[1], sys.argv[2]
start = time.perf_counter()
config = og.Config(folder)
if threads != "default":
    options = {"intra_op_num_threads": int(threads)}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
model = og.Model(config)
print(json.dumps({"loaded_s": time.perf_counter() - start}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    prompt, new = request["prompt"], request["new"]
    params = og.GeneratorParams(model)
    total = len(prompt) + new
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    generator = og.Generator(model, params)
    t0 = time.perf_counter()
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    prefilled = time.perf_counter()
    tokens, marks = [], []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
        marks.append(time.perf_counter())
    print(json.dumps({"tokens": tokens, "prefill_s": prefilled - t0,
                      "first_token_s": marks[0] - t0, "decode_s": marks[-1] - marks[0]}),
          flush=True)
    del generator, params
"""


class GenaiWorker:
    """A worker process holding one onnxruntime-genai model; :meth:`run` times one prompt."""

    def __init__(self, python: Path, folder: Path, threads: int | None, log: Path,
                 env: dict[str, str]) -> None:
        self.log = log
        self._sink: IO[bytes] = open(log, "wb")
        self.proc = subprocess.Popen(
            [str(python), "-c", WORKER, str(folder), str(threads or "default")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._sink, text=True,
            env=env)
        self.loaded_s = float(self._answer()["loaded_s"])

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
            raise RuntimeError(f"the onnxruntime-genai worker exited: {' | '.join(tail)}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def run(self, prompts: list[list[int]], new_tokens: int) -> Timing:
        """One greedy run of ``new_tokens`` on one prompt (the batch-1 figures only)."""
        assert self.proc.stdin is not None and len(prompts) == 1
        prompt = prompts[0]
        self.proc.stdin.write(json.dumps({"prompt": prompt, "new": new_tokens}) + "\n")
        self.proc.stdin.flush()
        got = self._answer()
        tokens = [int(t) for t in got["tokens"]]
        return Timing([tokens], float(got["prefill_s"]), float(got["first_token_s"]),
                      float(got["decode_s"]), len(tokens) - 1)

    def close(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._sink.close()
