"""The KV-cache inference graph (``tfgraph.compile(spec, cache=True)``) against full recomputation.

For every decoder-only tiny spec, in the torch module and in onnxruntime (opset 23 and 17):

- prefill then one token at a time through the cache gives the logits of the full sequence
  run at once by the ordinary graph (within 1e-4, float32);
- 32 greedy tokens from the cached ONNX model equal those of the torch module recomputing the
  whole prefix at every step;
- a left-padded batch of prompts of lengths 3, 9 and 17 gives each row the logits of its
  prompt run alone.

The reference is the full-sequence graph, itself checked against Hugging Face and
``torch.nn.Transformer`` elsewhere (tests/test_hf_families.py, test_torch_parity.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tfgraph
from tfgraph.exporters import to_onnx, to_torch
from tfgraph.spec.schema import Spec

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parent.parent
DECODERS = sorted(p.stem for p in (ROOT / "specs").glob("tiny*.yaml")
                  if tfgraph.load_spec(p).arch == "decoder-only"
                  and tfgraph.load_spec(p).dtype == "float32")
TOL = dict(atol=1e-4, rtol=1e-4)


def load(name: str) -> Spec:
    return tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml")


def ids_for(spec: Spec, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.vocab_size("source"), (batch, length), generator=gen)


class OnnxCached:
    """The cached ONNX model in onnxruntime, fed the optimum / onnxruntime-genai way."""

    def __init__(self, spec: Spec, opset: int) -> None:
        graph = tfgraph.compile(spec, cache=True)
        model = to_onnx(graph, seed=1, opset=opset)
        self.session = ort.InferenceSession(model.SerializeToString(),
                                            providers=["CPUExecutionProvider"])
        self.past = [i.name for i in self.session.get_inputs()
                     if i.name.startswith("past_key_values")]
        # (kv_heads, width) per past input: latent attention's keys and values differ
        self.dims = {n: (int(graph.node(n).type.shape[1]), int(graph.node(n).type.shape[3]))
                     for n in self.past}
        self.with_positions = "position_ids" in graph.inputs

    def empty(self, batch: int) -> dict[str, np.ndarray]:
        return {n: np.zeros((batch, heads, 0, width), np.float32)
                for n, (heads, width) in self.dims.items()}

    def __call__(self, ids: np.ndarray, mask: np.ndarray, past: dict[str, np.ndarray]
                 ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feeds = {"input_ids": ids, "attention_mask": mask, **past}
        if self.with_positions:  # not with ALiBi: its bias reads the mask's key positions
            feeds["position_ids"] = np.clip(np.cumsum(mask, 1) - 1, 0, None)[:, -ids.shape[1]:]
        out = self.session.run(None, feeds)
        return out[0], dict(zip(self.past, out[1:]))


@pytest.mark.parametrize("name", DECODERS)
def test_torch_cache_equals_full_recomputation(name: str) -> None:
    spec = load(name)
    full = to_torch(tfgraph.compile(spec), seed=1)
    cached = to_torch(tfgraph.compile(spec, cache=True), seed=1)
    ids = ids_for(spec, 2, 12)
    with torch.no_grad():
        want = full(ids)
        torch.testing.assert_close(cached(ids), want, **TOL)  # no cache given: a prefill
        logits, past = cached(ids[:, :7], use_cache=True)
        steps = [logits]
        for t in range(7, 12):
            logits, past = cached(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), want, **TOL)
    kv = past[0][0]
    assert kv.shape[0] == 2 and kv.shape[2] == 12  # (B, kv_heads, total_len, head_dim)


@pytest.mark.parametrize("opset", [23, 17])
@pytest.mark.parametrize("name", DECODERS)
def test_onnx_cache_equals_full_recomputation(name: str, opset: int) -> None:
    spec = load(name)
    full = to_torch(tfgraph.compile(spec), seed=1)
    model = OnnxCached(spec, opset)
    ids = ids_for(spec, 2, 12).numpy()
    with torch.no_grad():
        want = full(torch.from_numpy(ids)).numpy()
    logits, past = model(ids[:, :7], np.ones((2, 7), np.int64), model.empty(2))
    steps = [logits]
    for t in range(7, 12):
        logits, past = model(ids[:, t:t + 1], np.ones((2, t + 1), np.int64), past)
        steps.append(logits)
    np.testing.assert_allclose(np.concatenate(steps, 1), want, **TOL)


@pytest.mark.parametrize("name", DECODERS)
def test_greedy_tokens_from_the_cache_equal_recomputation(name: str) -> None:
    spec = load(name)
    full = to_torch(tfgraph.compile(spec), seed=1)
    model = OnnxCached(spec, 23)
    prompt = ids_for(spec, 1, 5).numpy()
    new = 32 if spec.max_len is None else min(32, spec.max_len - 5)
    recomputed = prompt
    with torch.no_grad():
        for _ in range(new):
            last = full(torch.from_numpy(recomputed))[:, -1].argmax(-1).numpy()
            recomputed = np.concatenate([recomputed, last[:, None]], 1)
    tokens = prompt
    logits, past = model(prompt, np.ones_like(prompt), model.empty(1))
    for _ in range(new):
        nxt = logits[:, -1].argmax(-1)[:, None]
        tokens = np.concatenate([tokens, nxt], 1)
        if tokens.shape[1] == recomputed.shape[1]:
            break
        logits, past = model(nxt, np.ones_like(tokens), past)
    assert tokens.tolist() == recomputed.tolist()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-decoder", "tiny-mistral", "tiny-gemma2",
                                  "tiny-neox", "tiny-moe"])
def test_left_padding_gives_each_row_its_own_logits(name: str) -> None:
    spec = load(name)
    full = to_torch(tfgraph.compile(spec), seed=1)
    cached = to_torch(tfgraph.compile(spec, cache=True), seed=1)
    onnx_model = OnnxCached(spec, 23)
    lengths = (3, 9, 17)
    prompts = [ids_for(spec, 1, n, seed=n)[0] for n in lengths]
    width = max(lengths)
    ids = torch.zeros((len(prompts), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p):] = p
        mask[row, width - len(p):] = 1
    with torch.no_grad():
        batch = cached(ids, attention_mask=mask)
        alone = [full(p[None])[0] for p in prompts]
    onnx_batch, _ = onnx_model(ids.numpy(), mask.numpy(), onnx_model.empty(len(prompts)))
    for row, p in enumerate(prompts):
        torch.testing.assert_close(batch[row, width - len(p):], alone[row], **TOL)
        np.testing.assert_allclose(onnx_batch[row, width - len(p):], alone[row].numpy(), **TOL)


def test_onnx_interface_is_the_optimum_genai_convention() -> None:
    spec = load("tiny-llama")
    model = to_onnx(tfgraph.compile(spec, cache=True), seed=0)

    def dims(value: object) -> list[object]:
        shape = value.type.tensor_type.shape.dim  # type: ignore[attr-defined]
        return [d.dim_param or d.dim_value for d in shape]

    inputs = {i.name: dims(i) for i in model.graph.input}
    outputs = {o.name: dims(o) for o in model.graph.output}
    layers = spec.layers
    kv, hd = spec.attention.kv_heads, spec.attention.head_dim or spec.d_model // spec.attention.heads
    assert list(inputs)[:3] == ["input_ids", "attention_mask", "position_ids"]
    assert inputs["input_ids"] == ["batch", "seq_len"]
    assert inputs["attention_mask"] == ["batch", "total_len"]
    assert inputs["position_ids"] == ["batch", "seq_len"]
    assert list(outputs)[0] == "logits" and outputs["logits"][:2] == ["batch", "seq_len"]
    for i in range(layers):
        for part in ("key", "value"):
            assert inputs[f"past_key_values.{i}.{part}"] == ["batch", kv, "past_len", hd]
            assert outputs[f"present.{i}.{part}"] == ["batch", kv, "total_len", hd]
    assert len(inputs) == 3 + 2 * layers and len(outputs) == 1 + 2 * layers


ENCODER_DECODERS = sorted(p.stem for p in (ROOT / "specs").glob("tiny*.yaml")
                          if tfgraph.load_spec(p).arch == "encoder-decoder")


def decode_in_steps(encoder: Any, decoder: Any, src: torch.Tensor, tgt: torch.Tensor,
                    prefill: int = 3) -> torch.Tensor:
    """Logits of cached encoder/decoder parts: the encoder once, the decoder over the first
    ``prefill`` target tokens, then one token at a time (B, T, V)."""
    _, cross = encoder(src)
    logits, past = decoder(tgt[:, :prefill], cross, use_cache=True)
    steps = [logits]
    for t in range(prefill, tgt.shape[1]):
        logits, past = decoder(tgt[:, t:t + 1], cross, past_key_values=past, use_cache=True)
        steps.append(logits)
    return torch.cat(steps, 1)


@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_encoder_decoder_cache_equals_full_recomputation(name: str) -> None:
    """The encoder part runs once (cross-attention keys/values computed there), the decoder
    part one target token at a time: the full model's logits, in torch; a left-padded source
    gives its row's logits unpadded."""
    spec = load(name)
    full = to_torch(tfgraph.compile(spec), seed=1)
    encoder = to_torch(tfgraph.compile(spec, cache=True, part="encoder"), seed=1)
    decoder = to_torch(tfgraph.compile(spec, cache=True, part="decoder"), seed=1)
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, spec.vocab_size("source"), (2, 9), generator=gen)
    tgt = torch.randint(0, spec.vocab_size("target"), (2, 7), generator=gen)
    with torch.no_grad():
        want = full(src, tgt)
        steps = decode_in_steps(encoder, decoder, src, tgt)
        padded = torch.cat([torch.zeros((1, 4), dtype=torch.long), src[:1]], 1)
        mask = (torch.arange(13) >= 4).long()[None]
        _, cross_padded = encoder(padded, mask)
        alone = decoder(tgt[:1], cross_padded, encoder_attention_mask=mask)
    torch.testing.assert_close(steps, want, **TOL)
    torch.testing.assert_close(alone, want[:1], **TOL)


@pytest.mark.parametrize("opset", [23, 17])
@pytest.mark.parametrize("name", ENCODER_DECODERS)
def test_onnx_encoder_decoder_cache(name: str, opset: int) -> None:
    spec = load(name)
    full = to_torch(tfgraph.compile(spec), seed=1)

    def session(part: str) -> object:
        model = to_onnx(tfgraph.compile(spec, cache=True, part=part), seed=1, opset=opset)
        return ort.InferenceSession(model.SerializeToString(),
                                    providers=["CPUExecutionProvider"])

    encoder, decoder = session("encoder"), session("decoder")
    gen = np.random.default_rng(0)
    src = gen.integers(0, spec.vocab_size("source"), (2, 9))
    tgt = gen.integers(0, spec.vocab_size("target"), (2, 7))
    with torch.no_grad():
        want = full(torch.from_numpy(src), torch.from_numpy(tgt)).numpy()
    ones = np.ones_like(src)
    feeds = {"src_ids": src, "attention_mask": ones}
    positions = {i.name for i in encoder.get_inputs()}  # type: ignore[attr-defined]
    if "position_ids" in positions:  # not with relative positions (T5)
        feeds["position_ids"] = np.cumsum(ones, 1) - 1
    out = encoder.run(None, feeds)  # type: ignore[attr-defined]
    layers = (len(out) - 1) // 2
    # optimum's names: the hidden states are last_hidden_state whatever node computes them
    named = [o.name for o in encoder.get_outputs()]  # type: ignore[attr-defined]
    assert named == ["last_hidden_state"] + [f"present.{i}.encoder.{part}" for i in range(layers)
                                             for part in ("key", "value")]
    torch_encoder = to_torch(tfgraph.compile(spec, cache=True, part="encoder"), seed=1)
    with torch.no_grad():
        hidden, _ = torch_encoder(torch.from_numpy(src))
    np.testing.assert_allclose(out[0], hidden.numpy(), **TOL)
    cross = {f"past_key_values.{i}.encoder.{part}": out[1 + 2 * i + j]
             for i in range(layers) for j, part in enumerate(("key", "value"))}
    shape = out[1].shape
    past = {f"past_key_values.{i}.decoder.{part}": np.zeros((2, shape[1], 0, shape[3]),
                                                             np.float32)
            for i in range(layers) for part in ("key", "value")}
    names = [o.name for o in decoder.get_outputs()]  # type: ignore[attr-defined]
    steps = []
    for t in range(7):
        step = {"input_ids": tgt[:, t:t + 1], "attention_mask": np.ones((2, t + 1), np.int64),
                "encoder_attention_mask": ones, **cross, **past}
        if "position_ids" in positions:
            step["position_ids"] = np.full((2, 1), t)
        result = decoder.run(None, step)  # type: ignore[attr-defined]
        steps.append(result[0])
        past = {n.replace("present", "past_key_values"): v
                for n, v in zip(names[1:], result[1:])}
    np.testing.assert_allclose(np.concatenate(steps, 1), want, **TOL)


def test_cache_graphs_say_what_they_cannot_build() -> None:
    with pytest.raises(tfgraph.errors.TfgraphError, match="part='encoder' or part='decoder'"):
        tfgraph.compile(load("tiny"), cache=True)
    with pytest.raises(tfgraph.errors.TfgraphError, match="part applies to encoder-decoder"):
        tfgraph.compile(load("tiny-encoder"), cache=True, part="encoder")
    with pytest.raises(tfgraph.errors.TfgraphError, match="KV-cache graphs"):
        tfgraph.compile(load("tiny"), part="encoder")


def test_run_points_a_kv_cache_model_to_generate(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tfgraph.cli import main

    out = tmp_path / "cached.onnx"
    spec = str(ROOT / "specs" / "tiny-llama.yaml")
    assert CliRunner().invoke(main, ["build", spec, "--to", "onnx", "--kv-cache", "-o",
                                     str(out)]).exit_code == 0
    result = CliRunner().invoke(main, ["run", str(out)])
    assert result.exit_code == 2 and "tfgraph generate drives it" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral", "tiny-decoder", "tiny-gemma2"])
def test_static_cache_equals_full_recomputation(name: str) -> None:
    """A preallocated cache written in place (gpt-fast style): the logits of the full model."""
    spec = load(name)
    model = to_torch(tfgraph.compile(spec, cache=True), seed=1)
    full = to_torch(tfgraph.compile(spec), seed=1)
    ids = ids_for(spec, 2, 12)
    cache = model.static_cache(2, 16)
    mask = torch.zeros((2, 16), dtype=torch.long)
    mask[:, :7] = 1
    with torch.no_grad():
        want = full(ids)
        steps = [model(ids[:, :7], mask.clone(), torch.arange(7)[None].expand(2, 7), cache,
                       cache_position=torch.arange(7))]
        for t in range(7, 12):
            mask[:, t] = 1
            steps.append(model(ids[:, t:t + 1], mask.clone(), torch.full((2, 1), t), cache,
                               cache_position=torch.tensor([t])))
    torch.testing.assert_close(torch.cat(steps, 1), want, **TOL)


def _relative_decoder() -> Spec:
    """A decoder-only spec with T5's relative position bias (tiny-llama's shape)."""
    data = load("tiny-llama").model_dump(exclude_none=True)
    data["name"] = "tiny-rel-decoder"
    data["embedding"] = {"positions": "relative", "relative_buckets": 8,
                         "relative_max_distance": 12, "tie_output": False, "scale": False}
    return Spec.model_validate(data)


def _static_logits(model: Any, ids: torch.Tensor, length: int, prefill: int) -> torch.Tensor:
    """Logits of ``ids`` (B, S) through a static cache of ``length`` slots: the first
    ``prefill`` tokens at once, then one per step."""
    batch, total = ids.shape
    cache = model.static_cache(batch, length)
    mask = torch.zeros((batch, length), dtype=torch.long)
    mask[:, :prefill] = 1
    with torch.no_grad():
        steps = [model(ids[:, :prefill], mask.clone(), torch.arange(prefill)[None].expand(
            batch, prefill), cache, cache_position=torch.arange(prefill))]
        for t in range(prefill, total):
            mask[:, t] = 1
            steps.append(model(ids[:, t:t + 1], mask.clone(), torch.full((batch, 1), t), cache,
                               cache_position=torch.tensor([t])))
    return torch.cat(steps, 1)


@pytest.mark.parametrize("name", ["tiny-mpt", "tiny-bloom", "tiny-falcon-rw", "relative"])
def test_static_cache_score_biases_sit_at_the_query_positions(name: str) -> None:
    """ALiBi's and T5's biases of a static-cache step are those of its queries' positions
    (cache_position), not of the buffer's last slots: the full model's float32 logits
    whatever the length reserved, and in bfloat16 the same logits for a short buffer and a
    long one (a query placed at the end of 4096 slots got biases of thousands, rounded)."""
    spec = _relative_decoder() if name == "relative" else load(name)
    model = to_torch(tfgraph.compile(spec, cache=True), seed=1)
    full = to_torch(tfgraph.compile(spec), seed=1)
    ids = ids_for(spec, 2, 12)
    with torch.no_grad():
        want = full(ids)
    for length in (12, 256):
        torch.testing.assert_close(_static_logits(model, ids, length, 7), want, **TOL)
    if name == "relative":
        return
    model = model.to(torch.bfloat16)
    short = _static_logits(model, ids, 16, 11)
    torch.testing.assert_close(_static_logits(model, ids, 4096, 11), short, atol=0, rtol=0)


def test_torch_compile_traces_a_static_cache_step_once() -> None:
    """Prefill and decode each trace once whatever the length reached; the growing cache
    changes shapes at every step and traces again."""
    from torch._dynamo.testing import CompileCounter

    spec = load("tiny-llama")
    model = to_torch(tfgraph.compile(spec, cache=True), seed=1)
    ids = ids_for(spec, 1, 12)
    static = CompileCounter()
    step = torch.compile(model, backend=static, dynamic=False)
    cache = model.static_cache(1, 16)
    mask = torch.zeros((1, 16), dtype=torch.long)
    mask[:, :4] = 1
    torch._dynamo.reset()
    with torch.no_grad():
        step(ids[:, :4], mask, torch.arange(4)[None], cache, cache_position=torch.arange(4))
        for t in range(4, 12):
            mask[:, t] = 1
            step(ids[:, t:t + 1], mask, torch.full((1, 1), t), cache,
                 cache_position=torch.tensor([t]))
    assert static.frame_count == 2
    torch._dynamo.reset()
    growing = CompileCounter()
    step = torch.compile(model, backend=growing, dynamic=False)
    with torch.no_grad():
        logits, past = step(ids[:, :4], use_cache=True)
        for t in range(4, 8):
            logits, past = step(ids[:, t:t + 1], past_key_values=past, use_cache=True)
    torch._dynamo.reset()
    assert growing.frame_count > 2


def test_the_ordinary_torch_module_takes_masks_and_a_cache() -> None:
    """README, "KV cache": the torch module's forward takes attention_mask, past_key_values and
    use_cache: a decoder's ordinary module runs them through its KV-cache graph over the same
    parameters (a weight changed in place shows in both)."""
    spec = load("tiny-llama")
    model = to_torch(tfgraph.compile(spec), seed=1)
    ids = ids_for(spec, 2, 10)
    with torch.no_grad():
        want = model(ids)
        logits, past = model(ids[:, :6], use_cache=True)
        steps = [logits]
        for t in range(6, 10):
            logits, past = model(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            steps.append(logits)
        torch.testing.assert_close(torch.cat(steps, 1), want, **TOL)
        mask = torch.ones_like(ids)
        mask[0, :3] = 0  # left padding: row 0 is its last 7 tokens alone
        torch.testing.assert_close(model(ids, attention_mask=mask)[0, 3:],
                                   model(ids[:1, 3:])[0], **TOL)
        model.state_dict()["head.weight"].mul_(2.0)  # in place: the cache path sees it
        torch.testing.assert_close(model(ids, attention_mask=torch.ones_like(ids)), model(ids),
                                   **TOL)
    encoder = to_torch(tfgraph.compile(load("tiny-encoder")), seed=1)
    with pytest.raises(tfgraph.errors.TfgraphError, match="no KV cache"):
        encoder(ids_for(load("tiny-encoder"), 1, 4), use_cache=True)
