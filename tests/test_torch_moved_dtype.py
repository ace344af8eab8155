"""A to_torch module moved to another dtype (``.to(torch.bfloat16)``, ``.half()``) decodes
through every cached path in that dtype (issue 24 item 3): the empty cache, the rope tables
and the static cache follow the parameters, not the graph's dtype."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.exporters.generation.cached_steppers import TorchStatic
from tfgraph.generation.loop import generate as run_loop
from tfgraph.generation.sampling import Sampler
from tfgraph.spec.loader import load_spec

from conftest import ROOT

LLAMA = str(ROOT / "specs" / "tiny-llama.yaml")
PROMPTS = [[5, 17, 42], [7, 8]]
MOVES = {"bfloat16": lambda m: m.to(torch.bfloat16), "float16": lambda m: m.half()}


@pytest.mark.parametrize("move", sorted(MOVES))
def test_a_moved_module_decodes_cached_as_it_recomputes(move: str) -> None:
    dtype = getattr(torch, move)
    spec = load_spec(LLAMA)
    full = MOVES[move](to_torch(tfgraph.compile(spec), seed=0))
    cached = MOVES[move](to_torch(tfgraph.compile(spec, cache=True), seed=0))
    ids = torch.tensor([[5, 17, 42, 9]])
    with torch.no_grad():
        want = full(ids)
        assert want.dtype == dtype and cached(ids).dtype == dtype
        # a cached step of the full-sequence module (its KV-cache part) and of the cached one
        first, past = full(ids[:, :3], torch.ones((1, 3), dtype=torch.long),
                           torch.arange(3)[None], use_cache=True)
        assert past[0][0].dtype == dtype
        last = full(ids[:, 3:], torch.ones((1, 4), dtype=torch.long), torch.tensor([[3]]),
                    past)
    tol = {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(torch.cat((first, last), 1), want, **tol)
    recomputed = tfgraph.generate(full, PROMPTS, max_new_tokens=4, backend="torch",
                                  cache=False, eos_token_id=None)
    got = tfgraph.generate(full, PROMPTS, max_new_tokens=4, backend="torch", eos_token_id=None)
    assert got.tokens == recomputed.tokens
    stepper: Any = TorchStatic(cached, spec.output_vocab, None, "cpu")
    stepper.prepare(len(PROMPTS), 3, 4)
    assert run_loop(stepper, PROMPTS, 4, Sampler(None, None, None, None), 1, ()).tokens \
        == recomputed.tokens


def test_setup_cache_on_the_full_module_is_its_buffers_and_moves_with_it() -> None:
    """README: setup_cache attaches the cache as the module's ``kv_cache`` buffers, also on
    the module of the full-sequence graph (whose KV-cache part is a hidden module)."""
    model = to_torch(tfgraph.compile(LLAMA), seed=0)
    cache = model.setup_cache(1, 8)
    assert dict(model.named_buffers())["kv_cache.key_0"] is cache[0][0]
    model = model.to(torch.bfloat16)
    assert model.kv_cache[0][0].dtype == torch.bfloat16
    mask = torch.zeros((1, 8), dtype=torch.long)
    mask[:, :3] = 1
    ids = torch.tensor([[5, 17, 42]])
    with torch.no_grad():
        got = model(ids, mask, torch.arange(3)[None], cache_position=torch.arange(3))
        want = model(ids)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    assert model.kv_cache[0][0][:, :, :3].abs().sum() > 0  # written in place
    model.release_cache()
    assert not any(name.startswith("kv_cache") for name, _ in model.named_buffers())


def test_static_cache_misuse_is_one_clear_error() -> None:
    from tfgraph.errors import TfgraphError

    from conftest import small

    model = to_torch(tfgraph.compile(LLAMA, cache=True), seed=0)
    for batch, length in ((0, 16), (2, 0)):
        with pytest.raises(TfgraphError, match="positive integer"):
            model.static_cache(batch, length)
    assert model.static_cache(1, 200).length == 200  # rope runs past max_len 128
    gpt2 = to_torch(tfgraph.compile(small(load_spec(ROOT / "specs" / "gpt2.yaml"), max_layers=1),
                                    cache=True))
    # slots are not positions (left padding puts a short row's tokens ahead of its
    # positions): a learned table bounds the position ids a step is given, not the length
    max_len = gpt2.info.lengths.max_len  # small(): 64
    cache = gpt2.static_cache(1, 2 * max_len)
    assert cache.length == 2 * max_len
    mask = torch.zeros((1, 2 * max_len), dtype=torch.long)
    mask[:, max_len + 10] = 1
    with torch.no_grad():  # a slot past max_len, position 5: fine
        gpt2(torch.ones((1, 1), dtype=torch.long), mask, torch.tensor([[5]]), cache,
             cache_position=torch.tensor([max_len + 10]))
    with pytest.raises(TfgraphError, match=f"position id {max_len}: past .*max_len {max_len}"
                       ".*learned position table"):
        gpt2(torch.ones((1, 1), dtype=torch.long), mask, torch.tensor([[max_len]]), cache,
             cache_position=torch.tensor([max_len + 10]))
    for huge in ((1, 10**12), (10**9, 10**9)):  # refused before allocating
        with pytest.raises(TfgraphError, match=r"static_cache\(.*needs about .* of memory"):
            model.static_cache(*huge)
    with pytest.raises(TfgraphError, match=r"setup_cache|static_cache\(1, 2199023255552\)"):
        model.setup_cache(1, 2**41)
    assert "kv_cache" not in model._modules

    def step(batch: int, length: int, new: int, at: int, mask_len: int | None = None) -> None:
        cache = model.static_cache(batch, length)
        ids = torch.ones((2, new), dtype=torch.long)
        model(ids, torch.ones((2, mask_len or length), dtype=torch.long),
              torch.zeros_like(ids), cache, cache_position=torch.arange(at, at + new))

    for args, words in (((2, 4, 5, 0), "5 tokens do not fit a static cache of length 4"),
                        ((2, 16, 1, 16), "cache_position 16 is outside"),
                        ((1, 16, 1, 0), "batch 1 was given input_ids of 2 rows"),
                        ((4, 16, 1, 0), "batch 4 was given input_ids of 2 rows"),
                        ((2, 16, 1, 0, 8), r"attention_mask must be \(2, 16\)")):
        with pytest.raises(TfgraphError, match=words):
            step(*args)
    step(2, 16, 1, 15)  # the last position is fine
    with pytest.raises(TfgraphError, match="cache_position must hold integers"):
        model(torch.ones((1, 1), dtype=torch.long), torch.ones((1, 4), dtype=torch.long),
              torch.zeros((1, 1), dtype=torch.long), model.static_cache(1, 4),
              cache_position=torch.tensor([0.0]))


def test_an_int32_cache_position_is_taken_as_int64() -> None:
    """index_copy_ wants int64 indices: an int32 cache_position (torch.arange(..., dtype=
    torch.int32), a numpy int32 array) gives the int64 one's logits, not a raw RuntimeError."""
    model = to_torch(tfgraph.compile(LLAMA, cache=True), seed=0)
    ids = torch.tensor([[5, 17, 42]])
    mask = torch.zeros((1, 8), dtype=torch.long)
    mask[:, :3] = 1
    with torch.no_grad():
        want = model(ids, mask, torch.arange(3)[None], model.static_cache(1, 8),
                     cache_position=torch.arange(3))
        got = model(ids, mask, torch.arange(3)[None], model.static_cache(1, 8),
                    cache_position=torch.arange(3, dtype=torch.int32))
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("name", ["tiny-llama.yaml", "qwen3-0.6b.yaml"])
def test_a_module_pickles_and_loads_with_the_same_logits(name: str) -> None:
    """torch.save(model) / pickle: the steps' lowerings (lambdas, per-head norm closures)
    are saved by op name; qwen3: per-head qk-norm."""
    import io
    import pickle

    from conftest import small

    model = to_torch(tfgraph.compile(small(load_spec(ROOT / "specs" / name), max_layers=1)))
    ids = torch.tensor([[5, 17, 42]])
    mask = torch.ones((1, 3), dtype=torch.long)
    with torch.no_grad():
        want, want_cached = model(ids), model(ids, mask)
        model(ids, mask)  # a KV-cache part module is built: it is pickled too
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        for loaded in (pickle.loads(pickle.dumps(model)),
                       torch.load(buffer, weights_only=False)):
            assert torch.equal(loaded(ids), want)
            assert torch.equal(loaded(ids, mask), want_cached)
