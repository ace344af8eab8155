"""Valid-looking specs a fuzzing review found accepted and then broken at run time: each is now
refused by the schema with a one-line message, or works end to end. Each test failed before
its fix."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.schema import Spec


def _spec(arch: str = "decoder-only", **parts: Any) -> Spec:
    data: dict[str, Any] = {"name": "f", "arch": arch, "d_model": 16, "layers": 1, "vocab": 32,
                            "attention": {"heads": 2}, "dropout": 0.0, **parts}
    return Spec.model_validate(data)


# ---- T5 relative buckets: max_distance must exceed the exact buckets ----------------------


def _relative(arch: str, buckets: int, distance: int) -> Spec:
    return _spec(arch, embedding={"positions": "relative", "relative_buckets": buckets,
                                  "relative_max_distance": distance})


@pytest.mark.parametrize("arch, buckets, distance, exact", [
    ("decoder-only", 16, 8, 8), ("decoder-only", 32, 9, 16), ("decoder-only", 32, 16, 16),
    ("encoder-only", 16, 4, 4), ("encoder-decoder", 16, 8, 8)])
def test_relative_max_distance_at_or_below_the_exact_buckets_is_refused(
        arch: str, buckets: int, distance: int, exact: int) -> None:
    # log(max_distance / exact) <= 0 gave negative or undefined buckets past the exact ones:
    # an IndexError in torch, a Gather of index -2**63 in onnxruntime
    with pytest.raises(ValidationError, match=(
            f"embedding.relative_max_distance: must exceed the {exact} exact buckets of "
            f"relative_buckets {buckets}.*got {distance}")):
        _relative(arch, buckets, distance)


@pytest.mark.parametrize("arch, buckets, distance, seq", [
    ("decoder-only", 16, 9, 40), ("encoder-only", 16, 5, 7)])
def test_relative_buckets_just_past_the_bound_match_transformers(
        arch: str, buckets: int, distance: int, seq: int) -> None:
    """The smallest max_distance allowed: the bias reads T5's buckets at distances past it,
    and torch and ONNX agree on the whole model."""
    import onnxruntime as ort
    from transformers.models.t5.modeling_t5 import T5Attention

    from tfgraph.exporters import to_onnx
    from tfgraph.exporters.torch.functional import relative_position_bias

    table = torch.arange(buckets, dtype=torch.float32)[:, None]  # row b holds b
    bias = relative_position_bias(table, seq, arch == "encoder-only", buckets, distance)
    rel = torch.arange(seq)[None, :] - torch.arange(seq)[:, None]
    ref = T5Attention._relative_position_bucket(rel, bidirectional=arch == "encoder-only",
                                                num_buckets=buckets, max_distance=distance)
    assert torch.equal(bias[0].long(), ref)
    graph = tfgraph.compile(_relative(arch, buckets, distance))
    ids = torch.randint(0, 32, (1, seq), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = to_torch(graph, seed=0).eval()(ids)
    session = ort.InferenceSession(to_onnx(graph, seed=0).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"input_ids": ids.numpy()})[0])
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)


def test_t5_import_with_max_distance_at_the_exact_buckets_is_refused(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tfgraph.cli import main

    config = {"model_type": "t5", "architectures": ["T5ForConditionalGeneration"],
              "vocab_size": 32, "d_model": 16, "d_kv": 8, "d_ff": 32, "num_layers": 1,
              "num_heads": 2, "relative_attention_num_buckets": 16,
              "relative_attention_max_distance": 8}
    (tmp_path / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(main, ["import", str(tmp_path)])
    assert result.exit_code == 2
    assert "relative_attention_max_distance = 8" in result.output
    assert "must exceed the 8 exact buckets" in result.output
