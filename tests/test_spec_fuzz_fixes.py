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

from test_kv_cache import decode_in_steps


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


# ---- rope_global: false with no sliding-window layer: a NoPE model, no position_ids -------


def _nope(pattern: list[str], layers: int = 1) -> Spec:
    return _spec(layers=layers, embedding={"positions": "rope", "rope_global": False},
                 attention={"heads": 2, "window": 2, "window_pattern": pattern})


@pytest.mark.parametrize("pattern, layers, rotates", [
    (["global"], 1, False), (["global", "local"], 1, False), (["global", "local"], 2, True)])
def test_rope_global_false_cache_reads_position_ids_only_where_a_layer_rotates(
        pattern: list[str], layers: int, rotates: bool) -> None:
    """The KV-cache graph took position_ids although no layer rotated: 'nodes computed but
    never used'. Now it takes them only with a local layer, and cached decoding (torch and
    ONNX) gives the full recomputation's logits."""
    import numpy as np
    import onnxruntime as ort

    from tfgraph.exporters import to_onnx

    spec = _nope(pattern, layers)
    graph = tfgraph.compile(spec, cache=True)
    assert ("position_ids" in graph.inputs) is rotates
    ids = torch.randint(0, 32, (2, 10), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = to_torch(tfgraph.compile(spec), seed=1)(ids)
        cached = to_torch(graph, seed=1)
        logits, past = cached(ids[:, :6], use_cache=True)
        steps = [logits]
        for t in range(6, 10):
            logits, past = cached(ids[:, t:t + 1], past_key_values=past, use_cache=True)
            steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, 1), want, atol=1e-4, rtol=1e-4)
    session = ort.InferenceSession(to_onnx(graph, seed=1).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    past_np = {n: np.zeros((2, 2, 0, 8), np.float32) for n in names if n.startswith("past")}
    steps_np = []
    for start, stop in [(0, 6)] + [(t, t + 1) for t in range(6, 10)]:
        feeds = {"input_ids": ids[:, start:stop].numpy(),
                 "attention_mask": np.ones((2, stop), np.int64), **past_np}
        if rotates:
            feeds["position_ids"] = np.tile(np.arange(start, stop), (2, 1))
        out = session.run(None, feeds)
        steps_np.append(out[0])
        past_np = dict(zip([n for n in names if n.startswith("past")], out[1:]))
    torch.testing.assert_close(torch.from_numpy(np.concatenate(steps_np, 1)), want,
                               atol=1e-4, rtol=1e-4)


def test_rope_global_false_without_local_layers_generates_and_builds(tmp_path: Path) -> None:
    """The CLI paths the review hit: cached generate on both back ends (the same greedy tokens
    as recomputation) and build --to onnx --kv-cache."""
    from click.testing import CliRunner

    from tfgraph.cli import main

    path = tmp_path / "nope.yaml"
    path.write_text("{name: nope, arch: decoder-only, d_model: 16, layers: 1, vocab: 32, "
                    "embedding: {positions: rope, rope_global: false}, "
                    "attention: {heads: 2, window: 2, window_pattern: [global]}}\n")
    tokens = []
    for extra in (["--backend", "onnx"], ["--backend", "torch"], ["--no-cache"]):
        result = CliRunner().invoke(main, ["generate", str(path), "--prompt-ids", "1,2,3",
                                           "--prompt-ids", "4,5", "--max-new-tokens", "6",
                                           "--ignore-eos", "--threads", "1", "--json", *extra])
        assert result.exit_code == 0, result.output
        tokens.append(json.loads(result.output)["tokens"])
    assert tokens[0] == tokens[1] == tokens[2]
    result = CliRunner().invoke(main, ["build", str(path), "--to", "onnx", "--kv-cache",
                                       "-o", str(tmp_path / "nope.onnx")])
    assert result.exit_code == 0, result.output


def test_rope_global_false_encoder_decoder_cache_parts() -> None:
    """An encoder-decoder has no sliding window, so rope_global false rotates nothing: its
    cached encoder and decoder parts take no position_ids and decode as the full model."""
    spec = _spec("encoder-decoder", embedding={"positions": "rope", "rope_global": False})
    parts = {p: tfgraph.compile(spec, cache=True, part=p) for p in ("encoder", "decoder")}
    assert all("position_ids" not in g.inputs for g in parts.values())
    encoder, decoder = (to_torch(parts[p], seed=1) for p in ("encoder", "decoder"))
    gen = torch.Generator().manual_seed(0)
    src, tgt = (torch.randint(0, 32, (2, n), generator=gen) for n in (9, 7))
    with torch.no_grad():
        want = to_torch(tfgraph.compile(spec), seed=1)(src, tgt)
        steps = decode_in_steps(encoder, decoder, src, tgt)
    torch.testing.assert_close(steps, want, atol=1e-4, rtol=1e-4)


# ---- diagrams: block.residual_scale with branch or sandwich norms --------------------------


WIRING = {"post": "post-norm: norm(x + f(x))", "pre": "pre-norm: x + f(norm(x))",
          "branch": "branch norm: x + norm(f(x))",
          "sandwich": "sandwich: x + norm(f(norm(x)))"}


@pytest.mark.parametrize("position", ["post", "pre", "branch", "sandwich"])
def test_residual_scale_diagrams_follow_the_norm_placement(position: str, tmp_path: Path
                                                           ) -> None:
    """The scale after a branch / sandwich out-norm was boxed with the sublayer's function,
    so function and norm read each other and the model level recursed forever. Now every
    level draws, the layer's edges are those of the placement without a scale, and the
    model level names the wiring."""
    from click.testing import CliRunner
    from test_diagram import _chain, dot_edges

    from tfgraph.cli import main
    from tfgraph.exporters.diagram.draw import diagram_source
    from tfgraph.exporters.diagram.structure import stacks, sublayer_ranks

    spec = _spec(norm={"position": position}, block={"residual_scale": 0.5})
    graph = tfgraph.compile(spec)
    assert WIRING[position] in diagram_source(graph, "model")
    edges = {(a, b) for a, b, _ in dot_edges(diagram_source(graph, "layer"))}
    chain = _chain("decoder", "self_attn", position, "decoder.layer_in")
    first = "decoder.self_attn.norm" if position == "post" else "decoder.self_attn.add"
    chain += _chain("decoder", "ffn", position, first)
    assert set(chain) <= edges
    assert sublayer_ranks(graph, stacks(graph)[0]) == [["self_attn"], ["ffn"]]
    assert diagram_source(graph, "op")
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps(spec.model_dump(mode="json")))
    for args in (["draw", str(path), "-o", str(tmp_path / "m.dot")],
                 ["build", str(path), "--to", "dot", "-o", str(tmp_path / "b.dot")]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output


def test_a_cycle_between_layer_boxes_is_a_named_error(monkeypatch: pytest.MonkeyPatch
                                                      ) -> None:
    """Should boxing ever make two boxes read each other again, the ranks say so instead of
    recursing until Python's limit."""
    from tfgraph.exporters.diagram import structure

    graph = tfgraph.compile(_spec())
    fn, norm = "decoder.self_attn.fn", "decoder.self_attn.norm"
    cyclic = {fn: structure._Box(fn, "fn", "self_attn", (norm,)),
              norm: structure._Box(norm, "norm", "self_attn", (fn,))}
    monkeypatch.setattr(structure, "_flow", lambda g, s: cyclic)
    with pytest.raises(structure.DiagramError, match="read each other in a cycle: "
                       "decoder.self_attn.fn <- decoder.self_attn.norm <- decoder.self_attn.fn"):
        structure.sublayer_ranks(graph, structure.stacks(graph)[0])
