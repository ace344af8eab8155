"""A decoder's KV-cache ONNX model with onnxruntime's fused GroupQueryAttention
(``build --kv-cache --fused-attention``, ``to_onnx(..., fused_attention=True)``;
exporters/onnx/fused_attention.py) against the written-out model and the torch module, on
onnxruntime's CPU provider:

- prefill then cached steps give the full torch module's logits and the written-out cached
  model's within 1e-4 (float32), at opsets 23 and 17, for specs covering GQA/MQA/MHA, sliding
  windows, soft-caps, qk-norm, biases (packed QKV), partial, interleaved and scaled rotary;
- a right-padded batch gives each row its own logits;
- ``tfgraph generate`` on the fused model (right-padded rows, shared past/present buffers
  bound in place) gives the tokens of full recomputation and of the written-out model on a
  padded batch, through buffer growth, rows leaving the batch and beam search;
- specs the kernel is not exact for keep the written-out attention, named in the note;
- the node counts per layer.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tfgraph
from tfgraph.exporters import to_onnx, to_torch
from tfgraph.exporters.onnx.fused_attention import OP_TYPE, PADDING_METADATA_KEY, refusal
from tfgraph.exporters.onnx.skip_norm import OP_TYPE as SKIP_NORM
from tfgraph.exporters.onnx.skip_norm import pairs
from tfgraph.spec.schema import Spec

from cli_support import refused, tfgraph as run_cli

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parent.parent
TOL = dict(atol=1e-4, rtol=1e-4)
# What each covers: llama GQA + folded rope + packed QKV; mistral a window; gemma2 soft-cap and
# local/global layers; qwen2 q/k/v biases (packed with them); qwen3 per-head qk-norm; phi
# partial rotary (kept in front of the kernel); gptj interleaved; yarn scaled frequencies;
# neox MHA; falcon MQA; olmo clip_qkv between the projections and the rotation (no packing);
# cohere2 rotary on the local layers only (the global ones fused without it); phimoe routed
# experts and head_dim 8 (rotation kept in front); gemma MQA and RMS norms of 1 + w (the
# skip-norms' computed gamma: tests/test_skip_norm.py).
EXACT = ["tiny-llama", "tiny-mistral", "tiny-gemma2", "tiny-qwen2", "tiny-qwen3", "tiny-phi",
         "tiny-gptj", "tiny-yarn", "tiny-neox", "tiny-falcon", "tiny-olmo", "tiny-cohere2",
         "tiny-phimoe", "tiny-gemma"]


def load(name: str) -> Spec:
    return tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml")


def session(model: Any) -> Any:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


class Cached:
    """A cached ONNX model run one call at a time with plain numpy feeds."""

    def __init__(self, spec: Spec, opset: int, fused: bool) -> None:
        self.graph = tfgraph.compile(spec, cache=True)
        self.model = to_onnx(self.graph, seed=0, opset=opset, fused_attention=fused)
        self.session = session(self.model)
        self.inputs = {i.name for i in self.session.get_inputs()}
        self.past = [i.name for i in self.session.get_inputs()
                     if i.name.startswith("past_key_values.")]
        layout = self.graph.info.cache
        assert layout is not None
        self.kv_heads, self.head_dim = layout.kv_heads, layout.head_dim

    def empty(self, batch: int) -> dict[str, np.ndarray]:
        dtype = np.float16 if self.graph.dtype == "float16" else np.float32
        return {n: np.zeros((batch, self.kv_heads, 0, self.head_dim), dtype)
                for n in self.past}

    def __call__(self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray,
                 past: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        feeds = {"input_ids": ids, "attention_mask": mask, **past}
        if "position_ids" in self.inputs:
            feeds["position_ids"] = positions
        out = self.session.run(None, feeds)
        return out[0], dict(zip(self.past, out[1:]))


def steps(model: Cached, ids: np.ndarray, prefill: int) -> np.ndarray:
    """Logits of ``ids`` (1, T): the first ``prefill`` at once, then one token per call."""
    logits, past = model(ids[:, :prefill], np.ones((1, prefill), np.int64),
                         np.arange(prefill)[None], model.empty(1))
    out = [logits]
    for t in range(prefill, ids.shape[1]):
        logits, past = model(ids[:, t:t + 1], np.ones((1, t + 1), np.int64),
                             np.array([[t]]), past)
        out.append(logits)
    return np.concatenate(out, axis=1)


@pytest.mark.parametrize("name", EXACT)
def test_the_kernel_is_exact_for_these_specs(name: str) -> None:
    assert refusal(tfgraph.compile(load(name), cache=True)) is None


# opset 17 changes the ops around the kernel (decomposed norms, rotary, GELU), not the kernel:
# three specs cover it (rotary folded, window + soft-cap, rotary kept in front of the kernel).
CASES = [(name, 23) for name in EXACT] + [(name, 17) for name in
                                          ("tiny-llama", "tiny-gemma2", "tiny-phi")]


@pytest.mark.parametrize(("name", "opset"), CASES)
def test_fused_logits_equal_torch_and_the_written_out_model(name: str, opset: int) -> None:
    spec = load(name)
    ids = np.random.default_rng(1).integers(0, spec.vocab_size("source"), (1, 20))
    with torch.no_grad():
        want = to_torch(tfgraph.compile(spec), seed=0)(torch.from_numpy(ids)).numpy()
    fused = Cached(spec, opset, fused=True)
    assert sum(n.op_type == OP_TYPE for n in fused.model.graph.node) == \
        fused.graph.info.cache.layers  # type: ignore[union-attr]
    # the residual Add + RMS norm pairs fused too (RMS-norm specs; LayerNorm ones have none)
    assert sum(n.op_type == SKIP_NORM for n in fused.model.graph.node) == \
        len(pairs(fused.graph)) == (2 * fused.graph.info.cache.layers  # type: ignore[union-attr]
                                    if spec.norm.kind == "rmsnorm" else 0)
    got = steps(fused, ids, 12)  # prefill 12 (longer than tiny-mistral's window 8), 8 steps
    written = steps(Cached(spec, opset, fused=False), ids, 12)
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), **TOL)
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(written), **TOL)


@pytest.mark.parametrize("name", ["tiny-opt", "tiny-decoder"])
def test_learned_positions_keep_position_ids(name: str) -> None:
    """No rotary: position_ids stays an input (the learned tables of GPT-2 and OPT, offset 2,
    read it), the biased q, k, v projections go in packed. head_dim 16 instead of the specs'
    12, which the kernel refuses."""
    data = load(name).model_dump()
    data["d_model"] = 64
    data["attention"].update(heads=4, head_dim=16)
    spec = Spec.model_validate(data)
    fused = Cached(spec, 23, fused=True)
    assert "position_ids" in fused.inputs
    assert sum(n.op_type == OP_TYPE for n in fused.model.graph.node) == 2  # both layers
    ids = np.random.default_rng(1).integers(0, spec.vocab_size("source"), (1, 12))
    with torch.no_grad():
        want = to_torch(tfgraph.compile(spec), seed=0)(torch.from_numpy(ids)).numpy()
    torch.testing.assert_close(torch.from_numpy(steps(fused, ids, 8)), torch.from_numpy(want),
                               **TOL)


def test_float16_logits_equal_the_written_out_model() -> None:
    """The kernel's float16 path (what a GPU runs): within float16's tolerance of the
    written-out float16 model, prefill and steps."""
    spec = Spec.model_validate({**load("tiny-llama").model_dump(), "dtype": "float16"})
    ids = np.random.default_rng(1).integers(0, spec.vocab_size("source"), (1, 20))
    fused = Cached(spec, 23, fused=True)
    assert sum(n.op_type == SKIP_NORM for n in fused.model.graph.node) == 4  # 2 layers
    got = steps(fused, ids, 12).astype(np.float32)
    want = steps(Cached(spec, 23, fused=False), ids, 12).astype(np.float32)
    torch.testing.assert_close(torch.from_numpy(got), torch.from_numpy(want), atol=1e-2,
                               rtol=1e-2)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma2", "tiny-phi"])
def test_a_right_padded_batch_gives_each_row_its_own_logits(name: str) -> None:
    spec = load(name)
    fused = Cached(spec, 23, fused=True)
    module = to_torch(tfgraph.compile(spec), seed=0)
    lengths = [3, 9, 17]
    rng = np.random.default_rng(2)
    rows = [rng.integers(0, spec.vocab_size("source"), n) for n in lengths]
    ids = np.zeros((3, 17), np.int64)
    for r, row in enumerate(rows):
        ids[r, :len(row)] = row  # right-padded: the kernel's convention
    mask = (np.arange(17)[None] < np.array(lengths)[:, None]).astype(np.int64)
    logits, past = fused(ids, mask, np.broadcast_to(np.arange(17), (3, 17)).copy(),
                         fused.empty(3))
    nxt = np.array([[4], [5], [6]])  # one more token per row, each written at its own count
    counts = np.array(lengths) + 1
    step_mask = (np.arange(counts.max())[None] < counts[:, None]).astype(np.int64)
    step, _ = fused(nxt, step_mask, (counts - 1)[:, None], past)
    for r, row in enumerate(rows):
        with torch.no_grad():
            alone = module(torch.from_numpy(np.concatenate([row, nxt[r]])[None])).numpy()
        n = len(row)
        torch.testing.assert_close(torch.from_numpy(logits[r:r + 1, :n]),
                                   torch.from_numpy(alone[:, :n]), **TOL)
        torch.testing.assert_close(torch.from_numpy(step[r:r + 1]),
                                   torch.from_numpy(alone[:, n:]), **TOL)


PROMPTS = [[5, 17, 42], [7, 8, 9, 10, 11, 12, 13, 14, 15], [3] * 17]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """tiny-llama and tiny-mistral written out and fused, each in its own folder (the CLI)."""
    out = {}
    for name in ("tiny-llama", "tiny-mistral"):
        for kind, flags in (("written", []), ("fused", ["--fused-attention"])):
            path = tmp_path_factory.mktemp(f"{name}-{kind}") / "model.onnx"
            result = run_cli("build", str(ROOT / "specs" / f"{name}.yaml"), "--to", "onnx",
                             "--kv-cache", *flags, "-o", str(path))
            assert result.returncode == 0, result.stderr
            assert ("fused attention" in result.stdout) == bool(flags), result.stdout
            out[f"{name}-{kind}"] = path
    return out


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-mistral"])
def test_generate_gives_the_tokens_of_recomputation_on_a_padded_batch(
        built: dict[str, Path], name: str) -> None:
    fused = tfgraph.generate(str(built[f"{name}-fused"]), PROMPTS, max_new_tokens=24,
                             eos_token_id=None)
    written = tfgraph.generate(str(built[f"{name}-written"]), PROMPTS, max_new_tokens=24,
                               eos_token_id=None)
    spec = str(ROOT / "specs" / f"{name}.yaml")
    full = tfgraph.generate(spec, PROMPTS, max_new_tokens=24, eos_token_id=None, cache=False)
    from_spec = tfgraph.generate(spec, PROMPTS, max_new_tokens=24, eos_token_id=None,
                                 fused_attention=True)  # built in memory, fused
    assert fused.tokens == written.tokens == full.tokens == from_spec.tokens
    beams = [tfgraph.generate(str(built[f"{name}-{kind}"]), PROMPTS[:2], max_new_tokens=10,
                              eos_token_id=None, beams=3).tokens
             for kind in ("fused", "written")]
    assert beams[0] == beams[1]


def _stepper(path: Path, share: bool) -> Any:
    from tfgraph.exporters.generation.fused_stepper import FusedOnnx

    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return FusedOnnx(s, 256, None, share=share)


@pytest.mark.parametrize("share", [True, False])
def test_the_stepper_grows_and_drops_rows_like_the_written_out_model(
        built: dict[str, Path], share: bool) -> None:
    from tfgraph.exporters.generation.cached_steppers import onnx_cached
    from tfgraph.generation.loop import left_pad

    fused = _stepper(built["tiny-llama-fused"], share)
    fused.prepare(3, 17, 1)  # room for one new token: the buffers double, then double again
    written = onnx_cached(ort.InferenceSession(str(built["tiny-llama-written"]),
                                               providers=["CPUExecutionProvider"]), 256, None)
    ids, lengths = left_pad([np.array(p) for p in PROMPTS])
    a, b = fused.prefill(ids, lengths), written.prefill(ids, lengths)
    torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), **TOL)
    rng = np.random.default_rng(3)
    for t in range(20):
        if t == 6:  # the middle row leaves, the last is repeated (as beam search does)
            rows = np.array([0, 2, 2])
            fused.reorder(rows)
            written.reorder(rows)
        nxt = rng.integers(0, 256, 3)
        a, b = fused.step(nxt), written.step(nxt)
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), **TOL)
    if share:
        assert fused.capacity >= 17 + 20 and fused.capacity > 17 + 1  # it grew


def test_the_cli_generates_from_a_fused_model(built: dict[str, Path]) -> None:
    import onnx

    fused = onnx.load(str(built["tiny-llama-fused"]))
    assert sum(n.op_type == SKIP_NORM for n in fused.graph.node) == 4  # the skip-norms too
    out = []
    for kind in ("fused", "written"):
        result = run_cli("generate", str(built[f"tiny-llama-{kind}"]), "--prompt-ids",
                         "5,17,42", "--prompt-ids", "1,2", "--max-new-tokens", "8", "--json")
        assert result.returncode == 0, result.stderr
        import json

        out.append(json.loads(result.stdout)["tokens"])
    assert out[0] == out[1]


# specs the kernel is not exact for, and why (the reason names the node)
INEXACT = {"tiny-bloom": "additive position bias", "tiny-mpt": "additive position bias",
           "tiny-falcon-rw": "additive position bias",
           "tiny-sandwich": "hardmax",
           "tiny-opt": "head_dim 12", "tiny-seq2seq": "decoder-only",
           "tiny-mla": "latent"}  # multi-head latent attention (README names it)


@pytest.mark.parametrize("name", sorted(INEXACT))
def test_inexact_specs_keep_the_written_out_attention(name: str) -> None:
    spec = load(name)
    part = "decoder" if spec.arch == "encoder-decoder" else None
    graph = tfgraph.compile(spec, cache=True, part=part)
    why = refusal(graph)
    assert why is not None and INEXACT[name] in why
    model = to_onnx(graph, seed=0, fused_attention=True)
    assert not any(n.op_type == OP_TYPE for n in model.graph.node)
    assert PADDING_METADATA_KEY not in {p.key for p in model.metadata_props}
    assert to_onnx(graph, seed=0).graph == model.graph  # the written-out model, unchanged


def test_generate_builds_a_spec_fused_and_says_when_it_cannot() -> None:
    result = run_cli("generate", str(ROOT / "specs" / "tiny-bloom.yaml"), "--fused-attention",
                     "--prompt-ids", "5,17,42", "--max-new-tokens", "2", "--json")
    assert result.returncode == 0, result.stderr
    assert "--fused-attention" in result.stderr and "additive position bias" in result.stderr
    refused(run_cli("generate", str(ROOT / "specs" / "tiny-llama.yaml"), "--fused-attention",
                    "--backend", "torch", "--prompt-ids", "5"), "--fused-attention")


def test_an_attribute_the_lowering_does_not_map_keeps_the_written_out_form() -> None:
    """A feature added to the attention op later (here a made-up value head size) is not
    silently dropped by the kernel: the model keeps the written-out attention."""
    graph = tfgraph.compile(load("tiny-llama"), cache=True)
    node = next(n for n in graph.ops() if n.op == "attention_cached")
    node.attrs["v_head_dim"] = 8
    why = refusal(graph)
    assert why is not None and "v_head_dim" in why and node.name in why


def test_the_cli_says_when_it_keeps_the_written_out_attention(tmp_path: Path) -> None:
    result = run_cli("build", str(ROOT / "specs" / "tiny-bloom.yaml"), "--to", "onnx",
                     "--kv-cache", "--fused-attention", "-o", str(tmp_path / "m.onnx"))
    assert result.returncode == 0, result.stderr
    notes = [line for line in result.stderr.splitlines() if "--fused-attention" in line]
    assert len(notes) == 1 and "additive position bias" in notes[0], result.stderr
    assert "fused attention" not in result.stdout
    refused(run_cli("build", str(ROOT / "specs" / "tiny-llama.yaml"), "--to", "onnx",
                    "--fused-attention", "-o", str(tmp_path / "x.onnx")),
            "--fused-attention", "--kv-cache")


def test_a_float32_fused_model_for_cuda_says_its_attention_runs_on_the_cpu(tmp_path: Path
                                                                        ) -> None:
    """onnxruntime's CUDA GroupQueryAttention has 16-bit kernels only."""
    def notes(*flags: str) -> list[str]:
        result = run_cli("build", str(ROOT / "specs" / "tiny-llama.yaml"), "--to", "onnx",
                         "--kv-cache", "--fused-attention", "--genai-provider", "cuda", *flags,
                         "-o", str(tmp_path / "m.onnx"))
        assert result.returncode == 0, result.stderr
        return [line for line in result.stderr.splitlines() if "float16/bfloat16 only" in line]

    assert len(notes()) == 1
    assert notes("--dtype", "float16") == []


def _per_layer(model: Any, layer: int) -> collections.Counter[str]:
    return collections.Counter(
        n.op_type for n in model.graph.node
        if n.name.startswith((f"decoder.layers.{layer}.", f"present.{layer}.")))


def test_nodes_per_layer() -> None:
    """tiny-llama, as written (before onnxruntime's own fusions): the fused layer is two
    SkipSimplifiedLayerNormalization (a residual Add and the next RMSNormalization each:
    tests/test_skip_norm.py), the packed QKV (Concat and Transpose of the weights, folded by
    onnxruntime, and one MatMul), GroupQueryAttention, the output projection and SwiGLU; no
    RotaryEmbedding, Softmax, Concat of the cache or position_ids."""
    graph = tfgraph.compile(load("tiny-llama"), cache=True)
    written = _per_layer(to_onnx(graph, seed=0), 1)
    fused_model = to_onnx(graph, seed=0, fused_attention=True)
    fused = _per_layer(fused_model, 1)
    # 43 written out today (exporters/onnx/cache.py); the fused layer's count is this lowering's
    assert sum(fused.values()) == 17 and sum(written.values()) > 30, (written, fused)
    assert fused[OP_TYPE] == 1 and fused["MatMul"] == 5  # qkv, o, gate, up, down
    assert fused[SKIP_NORM] == 2 and written[SKIP_NORM] == 0
    for gone in ("RotaryEmbedding", "Softmax", "Where", "Reshape", "Add", "RMSNormalization"):
        assert fused[gone] == 0, fused
    assert "position_ids" not in {i.name for i in fused_model.graph.input}
    domains = {o.domain: o.version for o in fused_model.opset_import}
    assert domains == {"": 23, "com.microsoft": 1}


def test_past_and_present_share_one_buffer_written_in_place(built: dict[str, Path]) -> None:
    """Bound as both the past input and the present output, one buffer is written in place:
    the kernel writes this call's keys at positions 0..2 of the caller's own array and leaves
    the rest as it was (unshared, it would zero its present first: gqa_attention_base.h), so
    nothing of the cache is allocated or copied per step."""
    s = ort.InferenceSession(str(built["tiny-llama-fused"]), providers=["CPUExecutionProvider"])
    names = [i.name for i in s.get_inputs() if i.name.startswith("past_key_values.")]
    host = {n: np.full((1, 2, 8, 16), 7.0, np.float32) for n in names}  # kv 2, hd 16
    values = {n: ort.OrtValue.ortvalue_from_numpy(h) for n, h in host.items()}
    binding = s.io_binding()
    binding.bind_cpu_input("input_ids", np.array([[5, 17, 42]], np.int64))
    binding.bind_cpu_input("attention_mask", np.ones((1, 3), np.int64))
    for name, present in zip(names, [o.name for o in s.get_outputs()][1:]):
        binding.bind_ortvalue_input(name, values[name])
        binding.bind_ortvalue_output(present, values[name])
    binding.bind_output("logits", "cpu")
    s.run_with_iobinding(binding)
    for h in host.values():
        assert (h[:, :, :3] != 7.0).all() and (h[:, :, 3:] == 7.0).all()


@pytest.mark.parametrize(("name", "positions"), [("tiny-llama", False), ("tiny-phi", True)])
def test_genai_config_names_the_inputs_the_fused_model_has(name: str, positions: bool) -> None:
    """position_ids leaves a fused model whose kernel rotates (tiny-llama), not one whose
    RotaryEmbedding stays in front of the kernel (tiny-phi's partial rotation)."""
    from tfgraph.exporters.onnx.genai_config import genai_config

    graph = tfgraph.compile(load(name), cache=True)
    inputs = genai_config(graph, "model.onnx", fused_attention=True)["model"]["decoder"][
        "inputs"]
    model_inputs = {i.name for i in to_onnx(graph, seed=0, fused_attention=True).graph.input}
    assert ("position_ids" in inputs) == positions == ("position_ids" in model_inputs)


# ---- hand-made and corrupted KV-cache models (exporters/generation/cache_interface.py) ----------


def _past(model: Any) -> list[Any]:
    return [i for i in model.graph.input if i.name.startswith("past_key_values.")]


def _set_padding(model: Any, value: str | None) -> None:
    props = [p for p in model.metadata_props if p.key != PADDING_METADATA_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(props)
    if value is not None:
        model.metadata_props.add(key=PADDING_METADATA_KEY, value=value)


def _keep_outputs(model: Any, keep: Any) -> None:
    outputs = [o for o in model.graph.output]
    del model.graph.output[:]
    model.graph.output.extend(keep(outputs))


def _dim(axis: int, value: int | str) -> Any:
    def edit(model: Any) -> None:
        for i in _past(model):
            d = i.type.tensor_type.shape.dim[axis]
            if isinstance(value, str):
                d.dim_param = value
            else:
                d.dim_value = value
    return edit


# (which model, the edit, words of the refusal); each ran before: a ValueError or IndexError
# (symbolic or missing sizes), a MemoryError (a head_dim of 2**40), or wrong tokens with exit 0
# (a missing present left a shared buffer unwritten; a wrong padding label decoded with the
# other model's mask), or onnxruntime's Concat error (a written-out model labelled right)
CORRUPT: dict[str, tuple[str, Any, tuple[str, ...]]] = {
    "symbolic kv_heads": ("fused", _dim(1, "heads"), ("kv_heads", "'heads'", "fixed size")),
    "no shape": ("fused", lambda m: [i.type.tensor_type.ClearField("shape") for i in _past(m)],
                 ("past_key_values.0.key has no dimensions",)),
    "rank 3": ("fused", lambda m: [i.type.tensor_type.shape.dim.pop() for i in _past(m)],
               ("has 3 dimensions, expected 4",)),
    "head_dim 2**40": ("fused", _dim(3, 2**40), ("width", "1099511627776", "262,144")),
    "kv_heads 0": ("fused", _dim(1, 0), ("kv_heads", "is 0")),
    "no presents": ("fused", lambda m: _keep_outputs(m, lambda o: o[:1]),
                    ("outputs logits:", "present")),
    "a present missing": ("fused", lambda m: _keep_outputs(m, lambda o: o[:1] + o[2:]),
                          ("outputs logits, present.0.value",)),
    "presents first": ("fused", lambda m: _keep_outputs(m, lambda o: o[1:] + o[:1]),
                       ("outputs present.0.key",)),
    "padding left": ("fused", lambda m: _set_padding(m, "left"),
                     (PADDING_METADATA_KEY, "'left'", "expected right")),
    "padding unsaid": ("fused", lambda m: _set_padding(m, None),
                       ("runs onnxruntime's GroupQueryAttention", "does not say")),
    "written out, labelled right": ("written", lambda m: _set_padding(m, "right"),
                                    ("does not run onnxruntime's GroupQueryAttention",)),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_generate_refuses_a_corrupted_kv_cache_model(built: dict[str, Path], tmp_path: Path,
                                                     case: str) -> None:
    import onnx
    from test_cli_validate import runner

    from tfgraph.cli import main

    kind, edit, words = CORRUPT[case]
    model = onnx.load(str(built[f"tiny-llama-{kind}"]))
    edit(model)
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    result = runner().invoke(main, ["generate", str(path), "--prompt-ids", "5,17,42",
                                    "--prompt-ids", "1,2", "--max-new-tokens", "4", "--json"])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (result.exit_code, result.stdout, result.stderr)
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == "" and lines[0].startswith(f"{path}: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_the_fused_stepper_refuses_buffers_past_the_memory(built: dict[str, Path],
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    """The buffers are sized by the model and the request: refused before any allocation
    when they cannot fit (was: a MemoryError part-way through)."""
    from tfgraph import io
    from tfgraph.errors import TfgraphError

    stepper = _stepper(built["tiny-llama-fused"], True)
    stepper.prepare(2, 3, 10**6)  # 2 x 4 buffers x 2 kv heads x 10**6 x 16 x 4 bytes = 2 GB
    monkeypatch.setattr(io, "available_memory", lambda: 10**9)  # 1 GB
    with pytest.raises(TfgraphError, match="fused-attention KV cache of 2 rows"):
        stepper.prefill(np.array([[5, 17, 42], [0, 1, 2]]), np.array([3, 2]))
    assert stepper.cache == {}


def test_decode_steps_run_through_fixed_device_values(built: dict[str, Path]) -> None:
    """Decode steps with shared buffers bind one set of ids/mask/positions/logits values once
    and refill them in place: same addresses every step (what CUDA graph capture replays),
    new ones (and a new graph id) only when the buffers are allocated again."""
    from tfgraph.generation.loop import left_pad

    stepper = _stepper(built["tiny-llama-fused"], True)
    stepper.prepare(3, 17, 4)
    ids, lengths = left_pad([np.array(p) for p in PROMPTS])
    stepper.prefill(ids, lengths)
    graph_id, binding = stepper.graph_id, stepper.fixed_binding
    addresses = {n: v.data_ptr() for n, v in stepper.fixed.items()}
    for _ in range(3):
        stepper.step(np.array([1, 2, 3]))
        assert stepper.fixed_binding is binding and stepper.graph_id == graph_id
        assert {n: v.data_ptr() for n, v in stepper.fixed.items()} == addresses
    for _ in range(3):  # past the 17 + 4 positions: the buffers double, a new graph id
        stepper.step(np.array([1, 2, 3]))
    assert stepper.graph_id == graph_id + 1 and stepper.fixed_binding is not binding


def _mask_widths(path: Path, cuda_graph: bool, new_tokens: int) -> tuple[int, list[int]]:
    """(capacity, the attention_mask widths the model was run with), read from
    onnxruntime's own profile: every node's input shapes, here the ReduceSum that counts
    each row's tokens (the kernel's seqlens_k) and the Shape that gives its
    total_sequence_length."""
    import json

    from tfgraph.exporters.generation.fused_stepper import FusedOnnx
    from tfgraph.generation.loop import left_pad

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(path.parent / f"profile-{cuda_graph}")
    s = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    stepper = FusedOnnx(s, 256, None, cuda_graph=cuda_graph)
    ids, lengths = left_pad([np.array(p) for p in PROMPTS])
    stepper.prepare(3, ids.shape[1], new_tokens)
    stepper.prefill(ids, lengths)
    for _ in range(3):
        stepper.step(np.array([1, 2, 3]))
    events = json.loads(Path(s.end_profiling()).read_text())
    widths = [int(shape["int64"][1]) for e in events if e.get("cat") == "Node"
              and e["args"].get("op_name") in ("ReduceSum", "Shape")
              for i, shape in enumerate(e["args"].get("input_type_shape", []))
              if i == 0 and "int64" in shape and len(shape["int64"]) == 2
              and shape["int64"][0] == 3]
    return stepper.capacity, widths


def test_uncaptured_steps_run_the_kernel_over_the_longest_row_only(built: dict[str, Path]
                                                                   ) -> None:
    """Without CUDA graphs a decode step's mask is as wide as the longest row, not the
    buffers (onnxruntime's CPU kernel takes time in proportion to total_sequence_length: a
    mask as wide as 17 + 1,000 positions made every step as slow as the last). With graphs
    it stays as wide as the buffers, the fixed shape a captured step needs."""
    path = built["tiny-llama-fused"]
    capacity, widths = _mask_widths(path, False, 1000)
    assert capacity == 17 + 1000 and widths
    assert max(widths) == 17 + 3, widths  # the prefill's 17, then one more per step
    capacity, widths = _mask_widths(path, True, 1000)
    assert set(widths) >= {capacity}, widths


def test_the_capture_path_gives_the_tokens_of_the_plain_stepper(built: dict[str, Path]
                                                                ) -> None:
    """The CUDA-graph path on the CPU provider (which ignores the graph ids): buffers
    allocated and warmed by a decode step on zeros before the prefill, which then keeps them;
    every step through the fixed values, tagged with its graph id. Its logits equal those of
    the unshared stepper (host arrays, a fresh binding each run), also through beam-style
    reordering, rows leaving the batch and growth."""
    from tfgraph.exporters.generation.fused_stepper import CAPTURE_STEPS, FusedOnnx
    from tfgraph.generation.loop import left_pad

    path = built["tiny-mistral-fused"]  # a sliding window too
    s = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    graphs = FusedOnnx(s, 256, None, cuda_graph=True)
    plain = _stepper(path, False)
    ids, lengths = left_pad([np.array(p) for p in PROMPTS])
    for stepper in (graphs, plain):
        stepper.prepare(3, ids.shape[1], 8)
    assert graphs.compiled and not plain.compiled and graphs.compile_s > 0
    buffers = dict(graphs.cache)
    assert graphs.counts.tolist() == [CAPTURE_STEPS] * 3  # the warm-up step ran
    a, b = graphs.prefill(ids, lengths), plain.prefill(ids, lengths)
    assert graphs.cache == buffers and graphs.graph_id == 1  # kept: the graph stays valid
    torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), **TOL)
    rng = np.random.default_rng(5)
    for t in range(14):
        if t == 4:  # beam search's reorder: the same buffers, rows permuted in place
            for stepper in (graphs, plain):
                stepper.reorder(np.array([2, 0, 0]))
            assert graphs.cache == buffers and graphs.graph_id == 1
        if t == 6:  # a row leaves: new buffers, a new graph id
            for stepper in (graphs, plain):
                stepper.reorder(np.array([0, 2]))
            assert graphs.graph_id == 2 and graphs.rows == 2
        nxt = rng.integers(0, 256, len(graphs.counts))
        a, b = graphs.step(nxt), plain.step(nxt)
        torch.testing.assert_close(torch.from_numpy(a), torch.from_numpy(b), **TOL)
    assert graphs.graph_id == 3  # ... and growth past the 17 + 8 positions, another
    options = graphs._run_options(graphs.graph_id)
    assert options.get_run_config_entry("gpu_graph_id") == str(graphs.graph_id)
    assert graphs._run_options(graphs.graph_id) is options  # made once per graph id
    # the prefill's (-1) and the live set's: the dropped sets' options went with them
    assert set(graphs.run_options) == {-1, graphs.graph_id}
    assert plain._run_options(1) is None


@pytest.mark.parametrize(("kind", "flags", "words"), [
    ("fused16", [], ["CUDA provider only"]),
    ("fused", [], ["float16 and bfloat16 kernels only", "--dtype float16"]),
    ("written", [], ["fused-attention KV-cache model only"]),
    ("fused", ["--backend", "torch"], ["--backend onnx", "--compile"]),
    ("fused", ["--no-cache"], ["not with --no-cache"]),
])
def test_cuda_graph_is_refused_where_onnxruntime_cannot_capture(
        built: dict[str, Path], tmp_path: Path, kind: str, flags: list[str], words: list[str]
        ) -> None:
    """--cuda-graph without a GPU, on a float32 fused model (onnxruntime's CUDA
    GroupQueryAttention is 16-bit only), on the written-out model (its cache grows every step)
    or off onnxruntime: one line, exit 2."""
    model = built[f"tiny-llama-{kind}"] if kind != "fused16" else tmp_path / "model.onnx"
    if kind == "fused16":
        done = run_cli("build", str(ROOT / "specs" / "tiny-llama.yaml"), "--to", "onnx",
                       "--kv-cache", "--fused-attention", "--dtype", "float16", "-o",
                       str(model))
        assert done.returncode == 0, done.stderr
    result = run_cli("generate", str(model), "--prompt-ids", "5,17,42",
                     "--max-new-tokens", "4", "--cuda-graph", "--provider", "cpu", *flags)
    line = refused(result)
    for word in words:
        assert word in line, (word, line)


def test_beam_search_moves_into_the_captured_buffers(built: dict[str, Path]) -> None:
    """Beam search prefills each prompt once and then reorders its rows to prompts x beams:
    those rows move into the buffers prepare captured on (graph 1 stays and is the one
    replayed), and the tokens equal the unshared stepper's."""
    from tfgraph.exporters.generation.fused_stepper import FusedOnnx
    from tfgraph.generation.loop import generate as run_loop
    from tfgraph.generation.loop import left_pad

    path = built["tiny-llama-fused"]
    graphs = FusedOnnx(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]),
                       256, None, cuda_graph=True)
    graphs.prepare(2 * 3, max(len(p) for p in PROMPTS[:2]), 10)
    captured = graphs.active
    seen = []
    step = graphs.step

    def spy(next_ids: np.ndarray) -> np.ndarray:
        seen.append(graphs.active)
        return step(next_ids)

    graphs.step = spy  # type: ignore[method-assign]
    got = run_loop(graphs, PROMPTS[:2], 10, beams=3).tokens
    assert seen and all(a is captured for a in seen) and captured.graph_id == 1
    plain = _stepper(path, False)
    assert got == run_loop(plain, PROMPTS[:2], 10, beams=3).tokens
    ids, lengths = left_pad([np.array(p) for p in PROMPTS[:2]])
    assert graphs.prefill(ids, lengths) is not None and graphs.active is not captured


class _SlowCaptures:
    """An onnxruntime session whose first run under each CUDA graph id (where onnxruntime
    captures the graph) takes ``CAPTURE_S`` longer: the CPU provider's stand-in for a
    capture's cost."""

    CAPTURE_S = 0.5

    def __init__(self, session: Any) -> None:
        self.inner, self.captured = session, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def run_with_iobinding(self, binding: Any, options: Any = None) -> Any:
        graph = options.get_run_config_entry("gpu_graph_id") if options is not None else "-1"
        if graph != "-1" and graph not in self.captured:
            self.captured.append(graph)
            time.sleep(self.CAPTURE_S)
        return self.inner.run_with_iobinding(binding, options)


def test_every_capture_counts_in_compile_s_and_none_in_the_decode_time(
        built: dict[str, Path]) -> None:
    """Buffers allocated again while decoding (rows leaving at an end token) get a new graph
    id, captured at the first step on them: that capture counts in compile_s, as prepare's
    does, and the decoding clock leaves it out (README: capture happens before the clock);
    the tokens stay those of the uncaptured stepper."""
    from tfgraph.exporters.generation.fused_stepper import FusedOnnx
    from tfgraph.generation.loop import generate as run_loop

    path = built["tiny-llama-fused"]
    slow = _SlowCaptures(ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]))
    graphs = FusedOnnx(slow, 256, None, cuda_graph=True)
    eos = list(range(0, 256, 3))
    graphs.prepare(len(PROMPTS), max(len(p) for p in PROMPTS), 16,
                   min(len(p) for p in PROMPTS))
    result = run_loop(graphs, PROMPTS, 16, eos_token_id=eos)
    assert len(slow.captured) >= 3, slow.captured  # prepare's graph and two as rows left
    assert graphs.compile_s >= slow.CAPTURE_S * len(slow.captured)
    assert result.decode_s < slow.CAPTURE_S and result.prefill_s < slow.CAPTURE_S
    assert result.tokens == run_loop(_stepper(path, True), PROMPTS, 16, eos_token_id=eos).tokens


@pytest.mark.parametrize("failing", ["ortvalue_from_numpy", "ortvalue_from_shape_and_type"])
def test_a_device_allocation_failure_is_one_line(built: dict[str, Path], failing: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The device refusing the buffers (onnxruntime raises, e.g. CUDA out of memory) is a
    TfgraphError naming the bytes and the device, and from the CLI one line, exit 2 (was:
    ``tfgraph: internal error``, exit 1)."""
    from click.testing import CliRunner

    from tfgraph.cli import main
    from tfgraph.errors import TfgraphError
    from tfgraph.exporters.generation import buffer_set

    def fail(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA failure 2: out of memory ; GPU=0 ; expr=cudaMalloc(&p, n);")

    monkeypatch.setattr(ort.OrtValue, failing, fail)
    result = CliRunner().invoke(main, ["generate", str(built["tiny-llama-fused"]),
                                       "--prompt-ids", "5,17,42", "--max-new-tokens", "4",
                                       "--provider", "cpu"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "allocating" in lines[0] and "on cpu failed" in lines[0], lines
    stepper = _stepper(built["tiny-llama-fused"], True)
    need = f"{buffer_set.device_bytes(stepper.layout, 2, 3 + 256):,}"  # prepare's default 256
    with pytest.raises(TfgraphError, match=f"KV cache of 2 rows x 259 positions: allocating "
                                           f"{need} bytes .* on cpu failed: CUDA failure 2"):
        stepper.prefill(np.array([[5, 17, 42], [0, 1, 2]]), np.array([3, 2]))


def test_the_free_gpu_memory_is_checked_before_allocating(built: dict[str, Path],
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """On a CUDA session the buffers are refused up front when the GPU's free memory (torch's
    view of it) is short, before onnxruntime is asked (here: the layout said cuda, torch's
    CUDA calls answer for a GPU with 1 MB free)."""
    import dataclasses

    from tfgraph.errors import TfgraphError
    from tfgraph.exporters.generation import buffer_set

    stepper = _stepper(built["tiny-llama-fused"], True)
    layout = dataclasses.replace(stepper.layout, device="cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (10**6, 8 * 10**10))
    asked = []
    monkeypatch.setattr(ort.OrtValue, "ortvalue_from_numpy",
                        lambda *a, **k: asked.append(a))
    need = buffer_set.device_bytes(layout, 64, 4096)
    assert need == 64 * layout.bytes_per_row(4096) + 8 * 64 * 4098 + 64 * 256 * 4
    with pytest.raises(TfgraphError, match=f"needs {need:,} bytes .* of GPU memory, only "
                                           r"1,000,000 bytes \(0\.00 GB\) free on cuda:0"):
        buffer_set.allocate(stepper.session, layout, 64, 4096, 1)
    assert asked == []
