"""The ONNX back end's model: structure, names, dtypes, checker, onnxruntime at dynamic shapes.

Every spec in specs/ is exported at tiny sizes (conftest.small keeps every knob) at both
lowerings (opset 23 with the fused ops, opset 17 decomposed).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper

import tfgraph
from tfgraph.passes import cost
from tfgraph.errors import TfgraphError
from tfgraph.exporters.onnx import model as onnx_model
from tfgraph.exporters.onnx.model import ONNX_OPS, to_onnx, write_onnx
from tfgraph.graph.ops import OPS
from tfgraph.spec.schema import Spec
from tfgraph.graph.weights import generate

from onnx_support import feeds_for, float32_twin

OPSETS = (23, 17)
FUSED = {"Attention", "RMSNormalization", "RotaryEmbedding", "Gelu"}


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def test_every_op_has_an_onnx_lowering() -> None:
    assert set(ONNX_OPS) == set(OPS)


@pytest.mark.parametrize("opset", OPSETS)
def test_checker_and_two_dynamic_shapes(small_spec: Spec, opset: int) -> None:
    graph = tfgraph.compile(small_spec)
    model = to_onnx(graph, opset=opset)
    onnx.checker.check_model(model, full_check=True)
    # onnxruntime's CPU provider has no bfloat16 kernels; the bf16 model is checked above and
    # its float32 twin (same graph, same ops) runs here.
    runnable = model if small_spec.dtype != "bfloat16" else to_onnx(
        tfgraph.compile(float32_twin(small_spec)), opset=opset)
    sess = session(runnable)
    vocab = small_spec.output_vocab
    for batch, seq, tgt in ((1, 3, 5), (3, 11, 7)):
        out = sess.run(None, feeds_for(graph, batch, seq, tgt))[0]
        length = tgt if "tgt_ids" in graph.inputs else seq
        assert out.shape == (batch, length, vocab)
        assert np.isfinite(out.astype(np.float32)).all()
        if small_spec.output == "probs":
            np.testing.assert_allclose(out.astype(np.float32).sum(-1), 1.0, atol=1e-2)


@pytest.mark.parametrize("opset", OPSETS)
def test_fused_ops_only_where_the_opset_has_them(small_spec: Spec, opset: int) -> None:
    model = to_onnx(tfgraph.compile(small_spec), opset=opset)
    used = {n.op_type for n in model.graph.node}
    if opset < 20:
        assert not used & FUSED
    att = small_spec.attention
    if opset >= 23:
        # a bias on the self-attention scores (T5's, ALiBi's) is added to written-out
        # scores; an encoder-decoder's cross-attention has none
        unbiased = small_spec.embedding.positions not in ("relative", "alibi") \
            or small_spec.arch == "encoder-decoder"
        assert ("Attention" in used) == (att.normalize == "softmax" and unbiased)
        assert ("RotaryEmbedding" in used) == (small_spec.embedding.positions == "rope")
        assert ("RMSNormalization" in used) == (small_spec.norm.kind == "rmsnorm")
    assert ("Hardmax" in used) == (att.normalize == "hardmax")
    assert ("LayerNormalization" in used) == (small_spec.norm.kind == "layernorm")


def test_interface_names_dtypes_and_initializers(small_spec: Spec) -> None:
    graph = tfgraph.compile(small_spec)
    model = to_onnx(graph, seed=5)
    g = model.graph
    dims = [[d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in g.input]
    if small_spec.arch == "encoder-decoder":
        assert [i.name for i in g.input] == ["src_ids", "tgt_ids"]
        assert dims == [["batch", "src_len"], ["batch", "tgt_len"]]
        out_len = "tgt_len"
    else:
        segments = ["token_type_ids"] if small_spec.embedding.token_types else []
        assert [i.name for i in g.input] == ["input_ids", *segments]
        assert dims == [["batch", "seq_len"]] * (1 + len(segments))
        out_len = "seq_len"
    assert all(i.type.tensor_type.elem_type == TensorProto.INT64 for i in g.input)
    (out,) = g.output
    assert out.name == small_spec.output
    assert [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim] == [
        "batch", out_len, small_spec.output_vocab]
    elem = onnx_model.ELEM_TYPE[small_spec.dtype]
    assert out.type.tensor_type.elem_type == elem
    # initializers: exactly the parameters (README.md's parameter names), each once, at the spec's dtype,
    # holding the shared generator's values (bfloat16 widened back compares exactly after
    # rounding the float32 values the same way)
    expected = generate(graph, seed=5)
    names = [t.name for t in g.initializer]
    assert sorted(names) == sorted(expected) and len(names) == len(set(names))
    if small_spec.embedding.tie_output:
        assert "head.weight" not in names
    for t in g.initializer:
        assert t.data_type == elem
        value = numpy_helper.to_array(t)
        want = expected[t.name].astype(onnx_model.numpy_dtype(small_spec.dtype))
        np.testing.assert_array_equal(value.astype(np.float32), want.astype(np.float32))
    assert model.ir_version <= 13  # onnxruntime 1.31's maximum IR version


def test_node_names_carry_their_scope() -> None:
    spec = Spec.model_validate({"name": "m", "arch": "encoder-decoder", "d_model": 16,
                                "layers": 2, "vocab": 20, "attention": {"heads": 2}})
    model = to_onnx(tfgraph.compile(spec))
    names = {n.name for n in model.graph.node}
    assert "decoder.layers.1.self_attn.q/MatMul" in names
    assert "decoder.layers.1.cross_attn.attention/Attention" in names
    assert "encoder.layers.0.ffn.act/Relu" in names
    assert len(names) == len(model.graph.node)  # unique
    # every IR value keeps its name and gets a value_info with its symbolic shape
    info = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in model.graph.value_info}
    assert info["decoder.layers.1.self_attn.q"] == ["batch", "tgt_len", 16]
    assert info["encoder.layers.1.ffn.residual"] == ["batch", "src_len", 16]


def test_constants_are_nodes_not_initializers(small_spec: Spec) -> None:
    graph = tfgraph.compile(small_spec)
    model = to_onnx(graph)
    assert {t.name for t in model.graph.initializer} == {p.name for p in graph.params()}


def test_weights_from_numpy_and_torch_state_dict_agree() -> None:
    import torch

    spec = Spec.model_validate({"name": "m", "arch": "decoder-only", "d_model": 16,
                                "layers": 1, "vocab": 20, "attention": {"heads": 2}})
    graph = tfgraph.compile(spec)
    arrays = {k: v * 3 for k, v in generate(graph, 1).items()}
    tensors = {k: torch.from_numpy(v).to(torch.bfloat16).float().requires_grad_()
               for k, v in arrays.items()}
    a = to_onnx(graph, weights={k: t.detach().numpy() for k, t in tensors.items()})
    b = to_onnx(graph, weights=tensors)  # duck-typed tensors (grad-requiring ones too)
    assert a.SerializeToString() == b.SerializeToString()


def test_wrong_weights_are_listed() -> None:
    spec = Spec.model_validate({"name": "m", "arch": "decoder-only", "d_model": 16,
                                "layers": 1, "vocab": 20, "attention": {"heads": 2}})
    graph = tfgraph.compile(spec)
    weights = generate(graph, 0)
    del weights["decoder.layers.0.ffn.up.bias"]
    weights["extra.weight"] = np.zeros(3, np.float32)
    weights["decoder.layers.0.self_attn.q.weight"] = np.zeros((16, 15), np.float32)
    with pytest.raises(TfgraphError) as err:
        to_onnx(graph, weights=weights)
    text = str(err.value)
    assert "1 missing (decoder.layers.0.ffn.up.bias" in text
    assert "1 unexpected (extra.weight" in text
    assert "decoder.layers.0.self_attn.q.weight (16, 15) != (16, 16)" in text


@pytest.mark.parametrize("opset, words", [(16, "opset 16 is not supported"),
                                          (24, "opset 24 is not supported"),
                                          ("23", "opset must be an integer, got str '23'")])
def test_unsupported_opset_is_a_clear_error(opset, words) -> None:  # type: ignore[no-untyped-def]
    spec = Spec.model_validate({"name": "m", "arch": "decoder-only", "d_model": 16,
                                "layers": 1, "vocab": 20, "attention": {"heads": 2}})
    with pytest.raises(TfgraphError, match=f"^{words}"):
        to_onnx(tfgraph.compile(spec), opset=opset)


def test_same_seed_same_bytes_different_seed_different() -> None:
    spec = Spec.model_validate({"name": "m", "arch": "encoder-decoder", "d_model": 16,
                                "layers": 1, "vocab": 20, "attention": {"heads": 2}})
    graph = tfgraph.compile(spec)
    one = to_onnx(graph, seed=7).SerializeToString()
    assert to_onnx(tfgraph.compile(spec), seed=7).SerializeToString() == one  # deterministic
    assert to_onnx(graph, seed=8).SerializeToString() != one


def test_fp16_model_runs_on_cpu_in_fp16() -> None:
    spec = Spec.model_validate({"name": "m", "arch": "decoder-only", "d_model": 16,
                                "layers": 1, "vocab": 20, "attention": {"heads": 2},
                                "embedding": {"positions": "rope"}, "norm": {"kind": "rmsnorm"},
                                "dtype": "float16"})
    graph = tfgraph.compile(spec)
    for opset in OPSETS:
        out = session(to_onnx(graph, opset=opset)).run(None, feeds_for(graph, 2, 6, 6))[0]
        assert out.dtype == np.float16 and out.shape == (2, 6, 20)


def test_write_onnx_single_file_and_external_data(tmp_path, monkeypatch) -> None:
    spec = Spec.model_validate({"name": "m", "arch": "decoder-only", "d_model": 16,
                                "layers": 2, "vocab": 20, "attention": {"heads": 2}})
    graph = tfgraph.compile(spec)
    feeds = feeds_for(graph, 2, 5, 5)
    single = write_onnx(graph, tmp_path / "one.onnx", seed=3)
    expected = ort.InferenceSession(str(single), providers=["CPUExecutionProvider"]).run(
        None, feeds)[0]
    assert onnx.load(str(single)).SerializeToString() == to_onnx(graph, seed=3).SerializeToString()
    # Force the >2 GB path on a tiny model: weights go to a page-aligned side file.
    monkeypatch.setattr(onnx_model, "EXTERNAL_DATA_THRESHOLD", 0)
    seen: list[int] = []
    path = write_onnx(graph, tmp_path / "ext.onnx", seed=3, progress=seen.append)
    data = tmp_path / "ext.onnx.data"
    assert data.is_file() and sum(seen) == cost.weights_bytes(graph)
    assert path.stat().st_size < data.stat().st_size
    loaded = onnx.load(str(path))  # pulls the external data back in
    onnx.checker.check_model(loaded, full_check=True)
    for t in onnx.load(str(path), load_external_data=False).graph.initializer:
        assert t.data_location == TensorProto.EXTERNAL
        assert int(t.external_data[1].value) % 4096 == 0  # offset
    out = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_array_equal(out, expected)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ext.onnx", "ext.onnx.data",
                                                          "one.onnx"]


def test_single_file_rebuild_removes_the_replaced_models_side_file(tmp_path, monkeypatch) -> None:
    """Catches an orphaned ``<target>.data`` left next to a single-file model after an
    external-data build of the same path (it would be counted in the build's size and look
    like the new model's weights)."""
    graph = tfgraph.compile(Spec.model_validate({
        "name": "m", "arch": "decoder-only", "d_model": 16, "layers": 1, "vocab": 20,
        "attention": {"heads": 2}}))
    with monkeypatch.context() as patch:
        patch.setattr(onnx_model, "EXTERNAL_DATA_THRESHOLD", 0)
        write_onnx(graph, tmp_path / "m.onnx")
    assert (tmp_path / "m.onnx.data").is_file()
    write_onnx(graph, tmp_path / "m.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]
    onnx.checker.check_model(onnx.load(str(tmp_path / "m.onnx")), full_check=True)


def test_an_external_build_refuses_a_data_file_it_did_not_write(tmp_path, monkeypatch) -> None:
    """A model keeping its weights in ``<target>.data`` replaces that file only when it is
    the weights file of the tfgraph model it replaces; a foreign one is refused before any
    file is written, and a rebuild then replaces its own."""
    graph = tfgraph.compile(Spec.model_validate({
        "name": "m", "arch": "decoder-only", "d_model": 16, "layers": 1, "vocab": 20,
        "attention": {"heads": 2}}))
    monkeypatch.setattr(onnx_model, "EXTERNAL_DATA_THRESHOLD", 0)
    data = tmp_path / "m.onnx.data"
    data.write_bytes(b"MINE")
    with pytest.raises(TfgraphError, match="not the weights file"):
        write_onnx(graph, tmp_path / "m.onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx.data"]
    assert data.read_bytes() == b"MINE"
    data.unlink()
    write_onnx(graph, tmp_path / "m.onnx", seed=1)
    first = data.read_bytes()
    write_onnx(graph, tmp_path / "m.onnx", seed=2)  # its own weights file: replaced
    assert data.read_bytes() != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
    onnx.checker.check_model(onnx.load(str(tmp_path / "m.onnx")), full_check=True)


# ops whose ONNX type constraints take bfloat16 only from a later opset than 17: OLMo 1's
# parameterless LayerNorm's ones (ConstantOfShape: bfloat16 from opset 20); and specs whose
# graphs hold ConstantOfShape, Range, CumSum or Where near the model's dtype (the routers'
# zeros, ALiBi's positions, Falcon's rounded bias, T5's buckets)
BF16_OPSET_SPECS = ["tiny-olmo", "tiny-mpt", "tiny-falcon-rw", "tiny-deepseek-v3", "tiny-t5"]


@pytest.mark.parametrize("name", BF16_OPSET_SPECS)
def test_bfloat16_models_pass_the_full_checker_at_opset_17(name: str) -> None:
    from conftest import ROOT, small

    spec = small(tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml"))
    spec = Spec.model_validate({**spec.model_dump(), "dtype": "bfloat16"})
    modes = [({}, False)]
    if spec.arch == "decoder-only":
        modes += [({"cache": True}, False), ({"cache": True}, True)]
    for kwargs, fused in modes:
        for opset in (17, 19):
            model = to_onnx(tfgraph.compile(spec, **kwargs), opset=opset, fused_attention=fused)
            onnx.checker.check_model(model, full_check=True)
