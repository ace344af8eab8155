"""ONNX decoding with I/O binding (issue 24 item 1): the KV cache stays onnxruntime OrtValues
on the session's device between steps (present bound as the next past), only the logits come
to the host. The same code runs on the CPU provider here and on CUDA: the tokens equal the
numpy path's and full recomputation's (left-padded prompts, rows leaving at EOS, beams)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import tfgraph
from tfgraph.exporters import to_onnx
from tfgraph.exporters.generation.cached_steppers import onnx_cached, session_device
from tfgraph.exporters.onnx import runtime as rt
from tfgraph.generation.loop import generate as run_loop
from tfgraph.generation.sampling import Sampler

from conftest import ROOT

pytest.importorskip("onnxruntime")
PROMPTS = [[5, 17, 42], [7, 8], [3, 1, 4, 1, 5, 9, 2]]


def _session(name: str) -> tuple[Any, int]:
    spec = tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml")
    model = to_onnx(tfgraph.compile(spec, cache=True), seed=0)
    session, _, _ = rt.create_session(model.SerializeToString(), "cpu")
    return session, spec.output_vocab


def _tokens(stepper: Any, new: int, beams: int = 1, eos: tuple[int, ...] = ()) -> Any:
    return run_loop(stepper, PROMPTS, new, Sampler(None, None, None, None), beams, eos).tokens


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-fp16"])
def test_bound_cache_tokens_equal_numpy_and_recomputation(name: str) -> None:
    session, vocab = _session(name)
    assert session_device(session) == "cpu"
    source = str(ROOT / "specs" / f"{name}.yaml")
    want = tfgraph.generate(source, PROMPTS, max_new_tokens=10, cache=False,
                            eos_token_id=None).tokens
    bound = onnx_cached(session, vocab, None)
    assert _tokens(bound, 10) == want == _tokens(onnx_cached(session, vocab, None, bind=False),
                                                 10)
    past = bound.past
    assert all(type(v).__name__ == "OrtValue" for v in past.values())  # never numpy
    eos = (want[1][2],)
    want_eos = tfgraph.generate(source, PROMPTS, max_new_tokens=10, cache=False,
                                eos_token_id=eos[0]).tokens
    assert _tokens(onnx_cached(session, vocab, None), 10, eos=eos) == want_eos
    beams = tfgraph.generate(source, PROMPTS, max_new_tokens=6, cache=False,
                             eos_token_id=None, beams=2).tokens
    assert _tokens(onnx_cached(session, vocab, None), 6, beams=2) == beams


def test_bound_logits_equal_the_numpy_path() -> None:
    session, vocab = _session("tiny-llama")
    bound, plain = onnx_cached(session, vocab, None), onnx_cached(session, vocab, None, False)
    ids, lengths = np.array([[0, 5, 17], [7, 8, 9]]), np.array([2, 3])
    np.testing.assert_array_equal(bound.prefill(ids, lengths), plain.prefill(ids, lengths))
    for token in (3, 4, 5):
        step = np.array([token, token + 1])
        np.testing.assert_array_equal(bound.step(step), plain.step(step))
