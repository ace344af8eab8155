"""The fused-attention KV-cache model writes each residual ``Add`` and the RMS norm of its sum
as onnxruntime's ``SkipSimplifiedLayerNormalization`` (exporters/onnx/skip_norm.py): the op
counts of the built models, what stays (the first norm, qk-norms, Gemma 2's sandwich
out-norms, bfloat16 models, the models without the fused attention), and the tokens
``tfgraph generate`` gives. The logits of these models against the torch module and the
written-out model: tests/test_fused_attention.py (float32 within 1e-4, float16)."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import tfgraph
from tfgraph.exporters import to_onnx
from tfgraph.exporters.onnx.fused_attention import refusal
from tfgraph.exporters.onnx.skip_norm import DOMAIN, OP_TYPE
from tfgraph.spec.schema import Spec

from cli_support import tfgraph as run_cli
from test_fused_attention import TOL, Cached, steps

ort = pytest.importorskip("onnxruntime")

ROOT = Path(__file__).resolve().parent.parent


def load(name: str, **changes: object) -> Spec:
    spec = tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml")
    return Spec.model_validate({**spec.model_dump(), **changes}) if changes else spec


def ops(model: onnx.ModelProto) -> collections.Counter[str]:
    return collections.Counter(n.op_type for n in model.graph.node)


def residual_adds(model: onnx.ModelProto) -> int:
    return sum(n.op_type == "Add" and n.output[0].endswith(".residual")
               for n in model.graph.node)


def norms(model: onnx.ModelProto, opset: int) -> int:
    """RMS norms written on their own: the op at opset 23, its ReduceMean at 17."""
    return ops(model)["RMSNormalization" if opset == 23 else "ReduceMean"]


# (spec, opset): llama pre-norm; gemma (1 + w) gains (a computed gamma); gemma2 sandwich
# norms (the out-norms read the sublayer's output, not a sum: they stay); qwen3 per-head
# qk-norms (no add in front: they stay); opset 17's decomposed norms.
CASES = [("tiny-llama", 23), ("tiny-llama", 17), ("tiny-gemma", 23), ("tiny-gemma2", 23),
         ("tiny-gemma2", 17), ("tiny-qwen3", 23)]


@pytest.mark.parametrize(("name", "opset"), CASES)
def test_each_residual_add_and_the_norm_of_its_sum_become_one_node(name: str,
                                                                  opset: int) -> None:
    graph = tfgraph.compile(load(name), cache=True)
    layers = graph.info.cache.layers  # type: ignore[union-attr]
    fused = to_onnx(graph, seed=0, opset=opset, fused_attention=True)
    written = to_onnx(graph, seed=0, opset=opset)
    # two residual sums a layer, each read by the next pre-norm (the last by the final norm)
    assert residual_adds(written) == 2 * layers and residual_adds(fused) == 0
    assert ops(fused)[OP_TYPE] == 2 * layers and ops(written)[OP_TYPE] == 0
    assert norms(fused, opset) == norms(written, opset) - 2 * layers
    skips = [n for n in fused.graph.node if n.op_type == OP_TYPE]
    assert {n.domain for n in skips} == {DOMAIN}
    by_output = {o: n for n in fused.graph.node for o in n.output}
    params = {i.name for i in fused.graph.initializer}
    for n in skips:
        norm = n.output[0]
        assert n.name == f"{norm}/{OP_TYPE}"  # named under the IR norm it writes
        assert norm.endswith(".self_attn.norm") or norm.endswith(".ffn.norm") or \
            norm == "decoder.norm", norm  # pre-norms and the final norm, no out_norm
        if norm == "decoder.norm":  # nothing else reads the last sum: not written
            assert list(n.output) == [norm]
        else:  # the sum, under the add's name, for the next residual add
            assert len(n.output) == 4 and n.output[1:3] == ["", ""]
            assert n.output[3].endswith(".residual")
        gamma = by_output.get(n.input[2])
        if load(name).norm.unit_offset:  # 1 + w, computed in the graph: not an initializer
            assert gamma is not None and gamma.op_type == "Add", n.input[2]
            assert gamma.input[0] in params
        else:  # the parameter itself
            assert gamma is None and n.input[2] in params
    first = next(n for n in fused.graph.node
                 if n.name.startswith("decoder.layers.0.self_attn.norm/"))
    assert first.op_type != OP_TYPE  # after the embedding: no sum in front, stays a norm
    onnx.checker.check_model(fused)


def test_the_qk_norms_and_the_sandwich_out_norms_stay_rms_norms() -> None:
    qwen3 = to_onnx(tfgraph.compile(load("tiny-qwen3"), cache=True), seed=0,
                    fused_attention=True)
    first = {"decoder.layers.0.self_attn.norm/RMSNormalization"}
    left = {n.name for n in qwen3.graph.node if n.op_type == "RMSNormalization"}
    assert left == first | {f"decoder.layers.{i}.self_attn.{qk}_norm/per_head/RMSNormalization"
                            for i in (0, 1) for qk in "qk"}
    gemma2 = to_onnx(tfgraph.compile(load("tiny-gemma2"), cache=True), seed=0,
                     fused_attention=True)
    left = {n.name for n in gemma2.graph.node if n.op_type == "RMSNormalization"}
    assert left == first | {f"decoder.layers.{i}.{sub}.out_norm/RMSNormalization"
                            for i in (0, 1) for sub in ("self_attn", "ffn")}


def test_tiny_llama_per_layer() -> None:
    """A middle layer of tiny-llama, as written: its two pre-norms are the two fused nodes
    (the sums of the layer before and of its attention); no Add or RMSNormalization left."""
    fused = to_onnx(tfgraph.compile(load("tiny-llama"), cache=True), seed=0,
                    fused_attention=True)
    layer = collections.Counter(n.op_type for n in fused.graph.node
                                if n.name.startswith(("decoder.layers.1.", "present.1.")))
    assert layer[OP_TYPE] == 2 and layer["Add"] == 0 and layer["RMSNormalization"] == 0
    assert sum(layer.values()) == 17, layer  # 19 with the Add and RMSNormalization pairs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_models(dtype: str) -> None:
    """float16 has the op's kernels (CPU and CUDA): fused; bfloat16 keeps Add and norm."""
    graph = tfgraph.compile(load("tiny-llama", dtype=dtype), cache=True)
    fused = to_onnx(graph, seed=0, fused_attention=True)
    assert ops(fused)[OP_TYPE] == (4 if dtype == "float16" else 0)


def test_models_without_the_fused_attention_stay_standard_onnx() -> None:
    """Plain ONNX, the written-out KV-cache model, and a model whose attention the kernel
    is not exact for (then nothing of onnxruntime's is used) keep Add and norm."""
    llama = load("tiny-llama")
    for model in (to_onnx(tfgraph.compile(llama), seed=0),
                  to_onnx(tfgraph.compile(llama, cache=True), seed=0)):
        assert ops(model)[OP_TYPE] == 0 and ops(model)["RMSNormalization"] == 5
        assert {o.domain for o in model.opset_import} == {""}
    narrow = llama.model_dump()
    narrow["attention"]["head_dim"] = 12  # GroupQueryAttention needs a multiple of 8
    graph = tfgraph.compile(Spec.model_validate(narrow), cache=True)
    assert refusal(graph) is not None
    assert ops(to_onnx(graph, seed=0, fused_attention=True))[OP_TYPE] == 0


def test_generate_gives_the_written_out_model_s_tokens() -> None:
    """``tfgraph generate SPEC --fused-attention`` (the fused KV-cache model built in memory)
    on tiny-gemma2 (sandwich norms, 1 + w gains), greedy, two prompts: the tokens of the
    written-out KV-cache model."""
    spec = str(ROOT / "specs" / "tiny-gemma2.yaml")
    result = run_cli("generate", spec, "--fused-attention", "--prompt-ids", "5,17,42",
                     "--prompt-ids", "1,2", "--max-new-tokens", "12", "--json")
    assert result.returncode == 0, result.stderr
    assert "--fused-attention" not in result.stderr, result.stderr  # no note: it is fused
    written = tfgraph.generate(spec, [[5, 17, 42], [1, 2]], max_new_tokens=12,
                               eos_token_id=None)
    assert json.loads(result.stdout)["tokens"] == written.tokens
    assert [len(row) for row in written.tokens] == [12, 12]


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-gemma2"])
def test_each_fused_node_reads_its_own_norm_gain(name: str) -> None:
    """Seeded gains are all 1 (0 for Gemma's 1 + w), so a node reading another norm's gain
    would pass the parity tests: here every norm gain is random, the same in both builds,
    and the fused model's logits still equal the written-out model's."""
    spec = load(name)
    models = [Cached(spec, 23, fused=True), Cached(spec, 23, fused=False)]
    rng = np.random.default_rng(3)
    gains: dict[str, np.ndarray] = {}
    for model in models:
        for init in model.model.graph.initializer:
            if init.name.endswith("norm.weight") and len(init.dims) == 1:
                value = gains.setdefault(init.name, rng.normal(0, 0.5, tuple(init.dims))
                                         .astype(numpy_helper.to_array(init).dtype))
                init.CopyFrom(numpy_helper.from_array(value, init.name))
        model.session = ort.InferenceSession(model.model.SerializeToString(),
                                             providers=["CPUExecutionProvider"])
    assert len(gains) >= 2 * models[0].graph.info.cache.layers + 1  # type: ignore[union-attr]
    ids = np.random.default_rng(1).integers(0, spec.vocab_size("source"), (1, 16))
    fused, written = (torch.from_numpy(steps(m, ids, 10)) for m in models)
    torch.testing.assert_close(fused, written, **TOL)
