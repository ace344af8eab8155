"""Decoding through a static KV cache held as the module's buffers (gpt-fast style), eager and
compiled (issue 24 item 3): the tokens of full recomputation; the cache on the module's device
and in its dtype by default; ``generate --backend torch --compile`` reports the compile time
apart. torch.compile (inductor) takes tens of seconds on a 2-core machine: it runs once, on a
one-layer model; CUDA graphs (``mode="reduce-overhead"``) only where CUDA is.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.exporters.generation.cached_steppers import TorchStatic
from tfgraph.exporters.torch.module import StaticCache
from tfgraph.generation.loop import generate as run_loop
from tfgraph.generation.sampling import Sampler
from tfgraph.spec.loader import load_spec

from conftest import ROOT, small

LLAMA = str(ROOT / "specs" / "tiny-llama.yaml")
PROMPTS = [[5, 17, 42], [7, 8], [3, 1, 4, 1, 5, 9, 2]]


def _module(layers: int | None = None) -> Any:
    spec = load_spec(LLAMA)
    if layers is not None:
        spec = small(spec, max_layers=layers)
    return spec, to_torch(tfgraph.compile(spec, cache=True), seed=0)


def _tokens(stepper: Any, new: int, beams: int = 1, eos: tuple[int, ...] = ()) -> Any:
    return run_loop(stepper, PROMPTS, new, Sampler(None, None, None, None), beams, eos).tokens


def test_static_cache_defaults_to_the_module_device_and_dtype() -> None:
    _, model = _module()
    cache = model.static_cache(2, 8)
    assert cache[0][0].dtype == torch.float32 and cache[0][0].device.type == "cpu"
    model = model.to(torch.bfloat16)
    cache = model.static_cache(2, 8)
    assert all(t.dtype == torch.bfloat16 for kv in cache for t in kv)
    assert cache.batch == 2 and cache.length == 8 and len(cache) == model.cache_layers
    assert model.static_cache(1, 4, dtype=torch.float16)[0][1].dtype == torch.float16
    model = model.to("meta")  # another device: the cache follows the parameters
    assert model.static_cache(1, 4)[0][0].device.type == "meta"


def test_an_attached_cache_is_module_buffers_and_gives_the_full_logits() -> None:
    spec, model = _module()
    full = to_torch(tfgraph.compile(spec), seed=0)
    cache = model.setup_cache(2, 16)
    assert isinstance(cache, StaticCache)
    buffers = dict(model.named_buffers())
    assert buffers["kv_cache.key_0"] is cache[0][0]
    assert buffers[f"kv_cache.value_{model.cache_layers - 1}"] is cache[-1 + len(cache)][1]
    ids = torch.randint(0, spec.vocab_size("source"), (2, 10), generator=torch.Generator()
                        .manual_seed(0))
    mask = torch.zeros((2, 16), dtype=torch.long)
    mask[:, :6] = 1
    with torch.no_grad():
        want = full(ids)
        got = [model(ids[:, :6], mask.clone(), torch.arange(6)[None].expand(2, 6),
                     cache_position=torch.arange(6))]
        for t in range(6, 10):
            mask[:, t] = 1
            got.append(model(ids[:, t:t + 1], mask.clone(), torch.full((2, 1), t),
                             cache_position=torch.tensor([t])))
    torch.testing.assert_close(torch.cat(got, 1), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(TfgraphError, match="setup_cache"):
        _module()[1](ids[:, :1], mask, torch.zeros((2, 1), dtype=torch.long),
                     cache_position=torch.tensor([0]))


def test_static_stepper_tokens_equal_full_recomputation() -> None:
    """Left-padded prompts, rows leaving at EOS (the buffers keep their batch), beam search
    (more rows than prepared: new buffers), growth past the reserved length."""
    spec, model = _module()
    want = tfgraph.generate(LLAMA, PROMPTS, max_new_tokens=12, backend="torch", cache=False,
                            eos_token_id=None)
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu")
    stepper.prepare(len(PROMPTS), 7, 12)
    assert _tokens(stepper, 12) == want.tokens
    eos = (want.tokens[1][3],)  # the second row stops early; the others go on
    want_eos = tfgraph.generate(LLAMA, PROMPTS, max_new_tokens=12, backend="torch",
                                cache=False, eos_token_id=eos[0])
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu")
    stepper.prepare(len(PROMPTS), 7, 12)
    assert _tokens(stepper, 12, eos=eos) == want_eos.tokens
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu")
    stepper.prepare(1, 7, 2)  # reserves too little: the buffers grow
    beams = tfgraph.generate(LLAMA, PROMPTS, max_new_tokens=9, backend="torch", cache=False,
                             eos_token_id=None, beams=3)
    assert _tokens(stepper, 9, beams=3) == beams.tokens


def test_compiled_static_decoding_on_cpu() -> None:
    """Inductor (its default mode: CUDA graphs need CUDA) compiles the step once; the tokens
    are eager's."""
    from torch._dynamo.testing import CompileCounterWithBackend

    spec, model = _module(layers=1)
    eager = TorchStatic(model, spec.output_vocab, None, "cpu")
    eager.prepare(len(PROMPTS), 7, 6)
    want = _tokens(eager, 6)
    torch._dynamo.reset()
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu", compile=True)
    assert stepper.mode is None  # reduce-overhead (CUDA graphs) only on CUDA
    counter = CompileCounterWithBackend("inductor")
    stepper.step_fn = torch.compile(model, backend=counter, dynamic=False)
    stepper.prepare(len(PROMPTS), 7, 6)
    assert stepper.compile_s > 0 and counter.frame_count == 1
    assert _tokens(stepper, 6) == want
    assert counter.frame_count == 1  # no recompilation while decoding
    torch._dynamo.reset()


def test_generate_compile_reports_compile_time_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """``generate --backend torch --compile --json``: the tokens of the cached decode, and
    compile_s beside the decode figures (dynamo's eager backend here: inductor runs above)."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda module, **kw: real(module, backend="eager", dynamic=False))
    args = ["generate", LLAMA, "--prompt-ids", "5,17,42", "--prompt-ids", "7,8",
            "--max-new-tokens", "6", "--backend", "torch", "--ignore-eos"]
    torch._dynamo.reset()
    out = CliRunner().invoke(main, [*args, "--compile", "--json"])
    assert out.exit_code == 0, out.output
    got = json.loads(out.stdout)
    want = json.loads(CliRunner().invoke(main, [*args, "--json"]).stdout)
    assert got["tokens"] == want["tokens"] and want["compile_s"] is None
    assert got["compile_s"] > 0 and got["decode_tokens_per_s"] > 0
    text = CliRunner().invoke(main, [*args, "--compile"])
    assert text.exit_code == 0 and "static cache, torch.compile" in text.stdout
    assert "compile " in text.stdout and "not in the figures above" in text.stdout
    result = tfgraph.generate(LLAMA, [[5, 17, 42]], max_new_tokens=4, backend="torch",
                              compile=True, eos_token_id=None)
    assert result.compile_s is not None and len(result.tokens[0]) == 4
    module = to_torch(tfgraph.compile(small(load_spec(LLAMA), max_layers=1)), seed=0)
    # a caller's module: the cache attached to it is let go of at the end
    result = tfgraph.generate(module, [[5, 17, 42]], max_new_tokens=4, compile=True,
                              eos_token_id=None)
    assert result.compile_s is not None and len(result.tokens[0]) == 4
    assert "kv_cache" not in module.cached_model()._modules
    torch._dynamo.reset()
    onnx = ["generate", LLAMA, "--prompt-ids", "5,17,42", "--compile"]  # the onnx back end
    refused = CliRunner().invoke(main, onnx)
    assert refused.exit_code == 2 and "--backend torch" in refused.stderr
    assert np.isfinite(got["time_to_first_token_s"])


@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("tokens", [3, 6])  # 3 x top-2 <= 8 experts: gathered; 6: all experts
def test_the_compiled_experts_equal_the_sorted_split(gated: bool, tokens: int) -> None:
    """The routing-independent expert paths a compiled decoding step takes give the sorted
    split's outputs (routing weights 0 outside each token's top 2)."""
    from tfgraph.exporters.torch.functional import _experts_static, experts

    g = torch.Generator().manual_seed(0)
    d, hidden, count = 16, 24, 8
    x = torch.randn(1, tokens, d, generator=g)
    scores = torch.randn(1, tokens, count, generator=g).softmax(-1)
    top = scores.topk(2, dim=-1)
    weights = torch.zeros_like(scores).scatter(-1, top.indices, top.values)
    params = tuple(torch.randn(shape, generator=g) / 4 for shape in
                   ([(count, hidden, d)] if gated else []) + [(count, hidden, d),
                                                               (count, d, hidden)])
    want = experts(x, weights, params, 2, "silu")
    *gate, up, down = params
    got = _experts_static(x.reshape(tokens, d), weights.reshape(tokens, count), list(gate),
                          up, down, 2, "silu")
    torch.testing.assert_close(got.reshape(x.shape), want, atol=1e-5, rtol=1e-5)


def test_an_unrouted_overflowing_expert_leaves_the_compiled_experts_finite() -> None:
    """Every expert runs on every token past N k > E pairs: an expert no token picked, whose
    output overflows to inf, must not turn the tokens' outputs into 0 x inf = NaN (the
    sorted split, which never runs it, stays finite)."""
    from tfgraph.exporters.torch.functional import _experts_static, experts

    g = torch.Generator().manual_seed(0)
    d, hidden, count, tokens = 16, 24, 8, 6
    x = torch.randn(1, tokens, d, generator=g)
    scores = torch.randn(1, tokens, count, generator=g)
    scores[..., 7] = -1e9  # expert 7 is never in a top 2
    top = scores.softmax(-1).topk(2, dim=-1)
    weights = torch.zeros(1, tokens, count).scatter(-1, top.indices, top.values)
    up, down = (torch.randn(shape, generator=g) / 4 for shape in
                [(count, hidden, d), (count, d, hidden)])
    up[7] = float("inf")  # expert 7 overflows on every token
    want = experts(x, weights, (up, down), 2, "relu")
    got = _experts_static(x.reshape(tokens, d), weights.reshape(tokens, count), [], up, down,
                          2, "relu")
    assert want.isfinite().all() and got.isfinite().all()
    torch.testing.assert_close(got.reshape(x.shape), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("name", "rows"), [("tiny-moe", 2), ("tiny-moe", 5), ("tiny-mla", 3)])
def test_a_compiled_mixture_of_experts_step_traces_once(name: str, rows: int) -> None:
    """A decoding step of routed experts compiles to one graph (fullgraph: no break at the
    routing's counts) that no routing recompiles, with eager's tokens: gathered experts for
    2 rows of tiny-moe (2 x top-2 <= 8 experts), every expert for 5, and tiny-mla's latent
    attention with a shared expert."""
    from torch._dynamo.testing import CompileCounterWithBackend

    spec = load_spec(str(ROOT / "specs" / f"{name}.yaml"))
    model = to_torch(tfgraph.compile(spec, cache=True), seed=0)
    prompts = [[5, 17, 42], [7], [1, 2, 3, 4], [9, 9], [3]][:rows]
    run = lambda stepper: run_loop(stepper, prompts, 8, Sampler(None, None, None, None), 1,
                                   ()).tokens  # noqa: E731
    eager = TorchStatic(model, spec.output_vocab, None, "cpu")
    eager.prepare(rows, 4, 8)
    want = run(eager)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")  # dynamo's graph capture, no inductor
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu", compile=True)
    stepper.step_fn = torch.compile(model, backend=counter, dynamic=False, fullgraph=True)
    stepper.prepare(rows, 4, 8)
    assert run(stepper) == want
    assert counter.frame_count == 1
    torch._dynamo.reset()


def test_one_new_token_compiles_nothing() -> None:
    """One new token comes from the prefill (eager): no step runs, so none is compiled."""
    from torch._dynamo.testing import CompileCounterWithBackend

    spec, model = _module(layers=1)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("eager")
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu", compile=True)
    stepper.step_fn = torch.compile(model, backend=counter, dynamic=False)
    stepper.prepare(len(PROMPTS), 7, 1)
    assert len(_tokens(stepper, 1)[0]) == 1
    assert stepper.compile_s == 0 and counter.frame_count == 0
    torch._dynamo.reset()


OPT = str(ROOT / "specs" / "tiny-opt.yaml")  # learned positions, max_len 40
OPT_PROMPTS = [list(range(1, 31)), [1, 2, 3, 4, 5]]  # 30 and 5 tokens: left padding of 25


@pytest.mark.filterwarnings("ignore::tfgraph.graph.lengths.BeyondMaxLenWarning")
def test_learned_positions_size_slots_not_positions_once(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """A learned table's max_len bounds positions, not slots: the 5-token row of a batch
    left-padded to 30 writes its 30 new tokens at slots 30..59 while its positions stay
    under 40. ``prepare`` sizes the buffers for that once (no growth, so no recompilation,
    inside the timed loop) and the tokens are recomputation's; ``generate(compile=True)``
    (torch.compile left out: the buffers and the step are the same) no longer refuses
    a length of 80 slots as past max_len 40."""
    spec = load_spec(OPT)
    model = to_torch(tfgraph.compile(spec, cache=True), seed=0)
    want = tfgraph.generate(OPT, OPT_PROMPTS, max_new_tokens=30, backend="torch", cache=False,
                            eos_token_id=None)
    assert [len(t) for t in want.tokens] == [11, 30]  # max_len stops the long row
    stepper = TorchStatic(model, spec.output_vocab, 40, "cpu")
    stepper.prepare(2, 30, 30)  # as warm_up does (which also says the shortest prompt)
    prepared = stepper.length
    assert prepared >= 30 + 30 - 1  # the short row's last written slot is 58
    grown: list[int] = []
    real_grow = stepper._grow
    monkeypatch.setattr(stepper, "_grow", lambda: (grown.append(stepper.length), real_grow()))
    got = run_loop(stepper, OPT_PROMPTS, 30, Sampler(None, None, None, None), 1, ()).tokens
    assert got == want.tokens and not grown and stepper.length == prepared
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)
    result = tfgraph.generate(OPT, OPT_PROMPTS, max_new_tokens=30, backend="torch",
                              compile=True, eos_token_id=None)
    assert result.tokens == want.tokens and result.compile_s is not None


def test_a_recompilation_inside_the_loop_counts_as_compile_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers regrown mid-decode (a caller's stepper prepared for too few tokens) compile
    the step again: those seconds go to ``compile_s`` and the loop's clock leaves them out."""
    import time

    spec, model = _module(layers=1)
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu")
    stepper.compiled = True  # the compiled path's bookkeeping, the step itself eager
    stepper.prepare(len(PROMPTS), 7, 2)  # reserves 9 slots: 12 new tokens need 18
    before = stepper.compile_s

    def slow_warm_up() -> None:  # a compilation that takes 1 s
        if (stepper.batch, stepper.length) not in stepper._warm:
            stepper._warm.add((stepper.batch, stepper.length))
            time.sleep(1.0)
            stepper.compile_s += 1.0

    monkeypatch.setattr(stepper, "_warm_up", slow_warm_up)
    start = time.perf_counter()
    result = run_loop(stepper, PROMPTS, 12, Sampler(None, None, None, None), 1, ())
    wall = time.perf_counter() - start
    assert stepper.compile_s >= before + 1.0  # it grew and compiled while decoding
    # the clock stopped for that second (without it, decode_s is the wall time less the
    # prefill's milliseconds)
    assert result.decode_s <= wall - 1.0 and result.time_to_first_token_s < wall - 1.0


@pytest.mark.parametrize("compile", [False, True])
def test_the_python_api_has_the_clis_bounds(compile: bool,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``tfgraph.generate`` refuses what ``generate --max-new-tokens`` / ``--beams`` refuse
    (one line, before any buffer is allocated or any token decoded), and decoding that does
    not fit in memory, as the CLI's check_generate_memory does."""
    from tfgraph import io

    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)
    run = lambda **kw: tfgraph.generate(LLAMA, [[1, 2, 3]], backend="torch",  # noqa: E731
                                        compile=compile, eos_token_id=None, **kw)
    for bad, words in (({"max_new_tokens": 10**12}, "max_new_tokens 1000000000000: a whole"),
                       ({"max_new_tokens": 0}, "max_new_tokens 0: a whole number from 1"),
                       ({"max_new_tokens": 2.5}, "max_new_tokens 2.5: a whole number"),
                       ({"max_new_tokens": True}, "max_new_tokens True"),
                       ({"beams": 10**6}, "beams 1000000: a whole number from 1 to 1,024")):
        with pytest.raises(TfgraphError, match=words):
            run(**bad)
    monkeypatch.setattr(io, "available_memory", lambda: 10**6)  # 1 MB left
    with pytest.raises(TfgraphError, match=r"--max-new-tokens 1048576 .*needs about .* of "
                       "memory, only 1.0 MB"):
        run(max_new_tokens=1 << 20)
    monkeypatch.undo()
    monkeypatch.setattr(torch, "compile", lambda module, **kw: module)
    assert len(run(max_new_tokens=np.int64(3)).tokens[0]) == 3


def _count_reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count every read of a tensor's values into Python or numpy (each a device-to-host
    copy and a synchronisation on CUDA)."""
    reads: dict[str, int] = {}
    for name in ("cpu", "item", "tolist", "numpy", "__bool__", "__int__", "__float__",
                 "__index__"):
        real = getattr(torch.Tensor, name)

        def counted(self: torch.Tensor, *args: Any, _name: str = name, _real: Any = real,
                    **kwargs: Any) -> Any:
            reads[_name] = reads.get(_name, 0) + 1
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


def test_greedy_decoding_reads_the_device_once_per_run_of_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Greedy, no EOS, no on_token (the benchmarks' decoding): the compiled steps choose
    their tokens on the module's device and nothing is read back until the rows' ends, so
    the reads are as many for 3 new tokens as for 12 (the loop with on_token reads each
    step's logits). The tokens are eager's and that loop's, also when the buffers grow
    mid-decode (the step compiled again, its guards still telling the two apart)."""
    spec, model = _module(layers=1)
    eager = TorchStatic(model, spec.output_vocab, None, "cpu")
    eager.prepare(len(PROMPTS), 7, 12)
    want = _tokens(eager, 12)
    torch._dynamo.reset()
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu", compile=True)
    stepper.step_fn = torch.compile(model, backend="eager", dynamic=False)
    stepper.prepare(len(PROMPTS), 7, 12)
    reads = _count_reads(monkeypatch)

    def run(new: int, on_token: Any = None) -> tuple[list[list[int]], int]:
        reads.clear()
        tokens = run_loop(stepper, PROMPTS, new, Sampler(None, None, None, None), 1, (),
                          on_token).tokens
        return tokens, sum(reads.values())

    few, short = run(3)
    many, long = run(12)
    assert few == [row[:3] for row in want] and many == want
    assert short == long
    stepped, per_step = run(12, on_token=lambda p, t: None)
    assert stepped == want and per_step >= long + 11
    monkeypatch.undo()
    small_stepper = TorchStatic(model, spec.output_vocab, None, "cpu", compile=True)
    small_stepper.step_fn = stepper.step_fn
    small_stepper.prepare(len(PROMPTS), 7, 2)  # too short for 12: grows, compiles again
    assert _tokens(small_stepper, 12) == want
    torch._dynamo.reset()


def test_nan_logits_stop_greedy_decoding_with_one_line() -> None:
    """A step's NaN logits end decoding with the loop's error, whether the steps run on the
    device (greedy, no EOS) or are read back one by one."""
    spec, model = _module(layers=1)
    stepper = TorchStatic(model, spec.output_vocab, None, "cpu")
    stepper.step_fn = lambda *args, **kw: model(*args, **kw) * float("nan")  # steps only
    for on_token in (None, lambda p, t: None):
        stepper.prepare(len(PROMPTS), 7, 5)
        with pytest.raises(TfgraphError, match="the model produced NaN logits"):
            run_loop(stepper, PROMPTS, 5, Sampler(None, None, None, None), 1, (), on_token)
