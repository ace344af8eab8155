"""The embedding and head features without a reference model: the spec's cross-field rules,
max_len with a position offset in both back ends, and what each feature adds to the graph and
its accounting (the parity with Hugging Face is tests/test_parity_embeddings.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import torch
from pydantic import ValidationError

import tfgraph
from tfgraph.exporters import to_onnx, to_torch
from tfgraph.spec.schema import Spec


def _spec(arch: str = "decoder-only", **embedding: Any) -> Spec:
    data: dict[str, Any] = {"name": "t", "arch": arch, "d_model": 16, "layers": 1, "vocab": 13,
                            "max_len": 4, "attention": {"heads": 2}, "dropout": 0.0,
                            "embedding": {"positions": "learned", **embedding}}
    return Spec.model_validate(data)


@pytest.mark.parametrize("arch, embedding, message", [
    ("decoder-only", {"positions": "rope", "position_offset": 2},
     "embedding.position_offset: offsets rows of a learned position table"),
    ("decoder-only", {"positions": "learned", "sinusoid_layout": "split"},
     "embedding.sinusoid_layout: only sinusoidal positions"),
    ("encoder-decoder", {"token_types": 2}, "embedding.token_types: segment embeddings are for "
                                            "encoder-only models"),
    # a decoder-only model's forward and generate take input ids alone: never fed segments
    ("decoder-only", {"token_types": 2}, "embedding.token_types: segment embeddings are for "
                                         "encoder-only models .*not decoder-only"),
])
def test_cross_field_rules(arch: str, embedding: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _spec(arch, **embedding)


@pytest.mark.parametrize("field, value", [("position_offset", -1), ("token_types", -1),
                                          ("token_types", True), ("norm", 1),
                                          ("sinusoid_layout", "halves")])
def test_field_types(field: str, value: Any) -> None:
    with pytest.raises(ValidationError):
        _spec(**{field: value})


def test_defaults_change_nothing() -> None:
    """Offset 0, no segments, no embedding norm, no transform: the graph of before."""
    plain = tfgraph.compile(_spec())
    explicit = tfgraph.compile(Spec.model_validate({
        **_spec().model_dump(),
        "embedding": {**_spec().embedding.model_dump(), "position_offset": 0, "norm": False,
                      "token_types": 0},
        "head": {"transform": False}}))
    assert [(n.name, n.op, n.attrs) for n in plain.nodes()] == \
        [(n.name, n.op, n.attrs) for n in explicit.nodes()]
    assert plain.inputs == ["input_ids"]
    assert "offset" not in plain.node("decoder.embed.positions").attrs


# ---- position offset: the table has max_len + offset rows, max_len still the limit -------


def _session(spec: Spec, opset: int) -> Any:
    options = ort.SessionOptions()
    options.log_severity_level = 4  # the failure below is expected: keep the log quiet
    model = to_onnx(tfgraph.compile(spec), seed=0, opset=opset)
    return ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])


def test_offset_table_rows_and_parameter_count() -> None:
    plain, offset = tfgraph.compile(_spec()), tfgraph.compile(_spec(position_offset=2))
    assert offset.node("decoder.positions.weight").attrs["shape"] == (6, 16)
    assert offset.report()["params"] - plain.report()["params"] == 2 * 16
    assert offset.sizes["position_rows"] == 6 and offset.sizes["max_len"] == 4


@pytest.mark.parametrize("opset", [23, 17])
def test_offset_positions_read_rows_from_the_offset(opset: int) -> None:
    """Rows offset .. offset + L - 1: the first two rows do not matter, the next L do; up to
    max_len tokens run and one more is an error naming max_len, in both back ends."""
    spec = _spec(position_offset=2)
    graph = tfgraph.compile(spec)
    module = to_torch(graph, seed=0)
    ids = torch.arange(8).reshape(2, 4) % 13
    weights = {k: v.detach().clone() for k, v in module.state_dict().items()}
    weights["decoder.positions.weight"][:2] = 100.0  # rows before the offset: never read
    changed = to_torch(graph, weights=weights)
    with torch.no_grad():
        assert torch.equal(changed(ids), module(ids))
        weights["decoder.positions.weight"][5] += 1.0  # position 3 reads row 5
        assert not torch.equal(to_torch(graph, weights=weights)(ids)[:, 3], module(ids)[:, 3])
        with pytest.raises(Exception, match="max_len 4"):
            module(torch.arange(10).reshape(2, 5) % 13)
    session = _session(spec, opset)
    out = session.run(None, {"input_ids": ids.numpy()})[0]
    np.testing.assert_allclose(out, module(ids).detach().numpy(), atol=1e-5)
    with pytest.raises(Exception, match="max_len 4"):
        session.run(None, {"input_ids": (np.arange(10).reshape(2, 5) % 13).astype(np.int64)})


# ---- what the features add to the graph ---------------------------------------------------


def test_token_types_embedding_norm_and_transform_costs() -> None:
    """Segments add one gather and one add per token; the embedding norm one norm; the
    transform one d x d linear, an activation and a norm (counted as the ops they are)."""
    base = {"name": "t", "arch": "encoder-only", "d_model": 16, "layers": 1, "vocab": 13,
            "attention": {"heads": 2}, "dropout": 0.0, "embedding": {"positions": "none"},
            "ffn": {"activation": "gelu"}}
    plain = tfgraph.compile(Spec.model_validate(base)).report(batch=2, seq=3)
    full = tfgraph.compile(Spec.model_validate({
        **base, "embedding": {"positions": "none", "token_types": 3, "norm": True},
        "head": {"transform": True}})).report(batch=2, seq=3)
    d, tokens = 16, 2 * 3
    assert full["params"] - plain["params"] == 3 * d + 2 * d + (d * d + d) + 2 * d
    assert full["flops"]["matmul"] - plain["flops"]["matmul"] == 2 * tokens * d * d
    # add (1) + layernorm (8) on the embeddings; bias (1) + gelu (8) + layernorm (8) in the head
    assert full["flops"]["other"] - plain["flops"]["other"] == tokens * d * (1 + 8 + 1 + 8 + 8)


# ---- token_type_ids through `tfgraph run` ----------------------------------------------------


def test_run_feeds_token_type_ids_to_a_built_onnx_file(tmp_path: Any) -> None:
    """An .onnx file with segment embeddings has two inputs; `tfgraph run` feeds both, counts
    only input_ids as tokens, and --check runs the torch module on the same segment ids."""
    from pathlib import Path

    from click.testing import CliRunner

    from tfgraph.cli import main
    from tfgraph.exporters.onnx.model import write_onnx
    from tfgraph.spec.loader import load_spec

    root = Path(__file__).resolve().parent.parent
    path = Path(str(tmp_path)) / "bert.onnx"
    write_onnx(tfgraph.compile(load_spec(root / "specs" / "tiny-bert.yaml")), path, seed=0)
    result = CliRunner().invoke(main, ["run", str(path), "--batch", "2", "--seq", "5",
                                       "--repeat", "2", "--provider", "cpu", "--check"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    assert "input_ids int64[2, 5], token_type_ids int64[2, 5] -> logits" in result.stdout
    assert "(10 input tokens per run)" in result.stdout
    assert ": ok" in result.stdout
