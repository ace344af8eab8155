"""The rotary knobs, norm.unit_offset and geglu_tanh below the parity tests: spec rules and
derived defaults, the scaled frequencies of tfgraph.graph.rope against transformers' own functions,
the accounting (FLOPs of partial rotation, the +1 of unit-offset gains), the graph attributes
and the ONNX form (initializers untouched, opset 23 and 17)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pydantic
import pytest

import tfgraph
from tfgraph.passes.cost import op_costs
from tfgraph.graph.ir import B, S
from tfgraph.graph.rope import base_frequencies, scaled_frequencies
from tfgraph.spec.schema import Spec


def make(embedding: dict[str, Any] | None = None, **over: Any) -> Spec:
    data: dict[str, Any] = {"name": "t", "arch": "decoder-only", "d_model": 64, "layers": 1,
                            "vocab": 23, "max_len": 64, "attention": {"heads": 4},
                            "dropout": 0.0, "embedding": {"positions": "rope",
                                                          **(embedding or {})}}
    data.update(over)
    return Spec.model_validate(data)


def error(**kw: Any) -> str:
    with pytest.raises(pydantic.ValidationError) as info:
        make(**kw)
    return str(info.value)


# ---- spec rules -------------------------------------------------------------------------------


def test_rotary_dim_is_int_of_the_fraction_and_must_be_even() -> None:
    assert make({"rotary_fraction": 0.25}).rotary_dim == 4  # 16 * 0.25
    assert make({"rotary_fraction": 0.3}).rotary_dim == 4  # int(4.8)
    assert make().rotary_dim == 16
    assert "embedding.rotary_fraction: int(head_dim * rotary_fraction) = int(16 * 0.2) = 3" \
        in error(embedding={"rotary_fraction": 0.2})
    assert "embedding.rotary_fraction" in error(embedding={"rotary_fraction": 0.05})  # 0
    assert "(0, 1]" in error(embedding={"rotary_fraction": 1.5})
    # an odd head_dim is fine when only an even share of it rotates
    odd = make({"rotary_fraction": 0.5}, attention={"heads": 4, "head_dim": 9})
    assert odd.rotary_dim == 4
    assert "attention.head_dim" in error(attention={"heads": 4, "head_dim": 9})


@pytest.mark.parametrize("field,value", [("rotary_fraction", 0.5),
                                         ("rotary_layout", "interleaved"),
                                         ("rope_scaling", {"type": "linear", "factor": 2})])
def test_rotary_fields_need_rotary_positions(field: str, value: Any) -> None:
    assert f"embedding.{field}: only rotary positions" in error(
        embedding={"positions": "learned", field: value})


def test_scaling_fields_not_of_the_type_are_named() -> None:
    msg = error(embedding={"rope_scaling": {"type": "linear", "factor": 2, "beta_fast": 16}})
    assert "embedding.rope_scaling.beta_fast: not a field of type linear" in msg
    msg = error(embedding={"rope_scaling": {"type": "llama3", "factor": 8, "mscale": 1}})
    assert "embedding.rope_scaling.mscale: not a field of type llama3" in msg
    msg = error(embedding={"rope_scaling": {"type": "yarn", "factor": 4,
                                            "low_freq_factor": 1}})
    assert "embedding.rope_scaling.low_freq_factor: not a field of type yarn" in msg
    assert "must be at least 1" in error(embedding={"rope_scaling": {"type": "linear",
                                                                     "factor": 0.5}})
    assert "embedding.rope_scaling.original_max_len" in error(
        max_len=None, embedding={"rope_scaling": {"type": "yarn", "factor": 4}})
    assert "embedding.rope_scaling.high_freq_factor" in error(embedding={"rope_scaling": {
        "type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 2}})


def test_scaling_defaults_are_derived_and_round_trip() -> None:
    llama3 = make({"rope_scaling": {"type": "llama3", "factor": 8}}).embedding.rope_scaling
    assert llama3 is not None
    assert (llama3.low_freq_factor, llama3.high_freq_factor, llama3.original_max_len) == \
        (1.0, 4.0, 64)
    spec = make({"rope_scaling": {"type": "yarn", "factor": 4, "original_max_len": 16}})
    yarn = spec.embedding.rope_scaling
    assert yarn is not None
    assert (yarn.beta_fast, yarn.beta_slow, yarn.truncate) == (32.0, 1.0, True)
    assert yarn.attention_factor == pytest.approx(0.1 * math.log(4) + 1)
    assert Spec.model_validate(spec.model_dump()) == spec
    deepseek = make({"rope_scaling": {"type": "yarn", "factor": 40, "mscale": 1.0,
                                      "mscale_all_dim": 0.5}}).embedding.rope_scaling
    assert deepseek is not None and deepseek.attention_factor == pytest.approx(
        (0.1 * math.log(40) + 1) / (0.05 * math.log(40) + 1))


def yarn(**fields: float) -> dict[str, Any]:
    return {"rope_scaling": {"type": "yarn", "factor": 2.0, **fields}}


def test_yarn_multipliers_are_at_least_zero() -> None:
    # 0.1 m ln(2) + 1 is 0 at m = -1 / (0.1 ln 2): transformers divides by it; negative
    # below, which flips cos and sin (a factor of -0.99 at m = -30)
    for m in (-14.426950408889635, -30.0, -1e-9):
        assert "rope_scaling.mscale_all_dim\n  Value error, must be at least 0" in error(
            embedding=yarn(mscale=1.0, mscale_all_dim=m))
        assert "rope_scaling.mscale\n  Value error, must be at least 0" in error(
            embedding=yarn(mscale=m, mscale_all_dim=1.0))
    # 0 leaves a multiplier out, as transformers' `if mscale and mscale_all_dim` does
    zero = make(yarn(mscale=1.0, mscale_all_dim=0.0)).embedding.rope_scaling
    assert zero is not None and zero.attention_factor == pytest.approx(0.1 * math.log(2) + 1)


@pytest.mark.parametrize("fields,says", [
    ({"factor": 1e300, "mscale": 1.0, "mscale_all_dim": 1e308}, "as 0, which must be greater "
                                                                "than 0"),  # x / inf
    ({"factor": 1e300, "mscale": 1e308, "mscale_all_dim": 1e308}, "as nan, which must be a "
                                                                  "finite number"),  # inf / inf
    ({"factor": 1e300, "mscale": 1e308, "mscale_all_dim": 1.0}, "as inf, which must be a "
                                                                "finite number"),
])
def test_a_derived_attention_factor_keeps_its_own_rule(fields: dict[str, float],
                                                        says: str) -> None:
    msg = error(embedding=yarn(**fields))
    assert "embedding.rope_scaling.attention_factor: derived from embedding.rope_scaling.factor, " \
        f"mscale and mscale_all_dim {says}" in msg


# ---- the frequencies against transformers' --------------------------------------------------


SCALINGS = [
    {"type": "linear", "factor": 4.0},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_len": 16},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_len": 8192},
    {"type": "yarn", "factor": 4.0, "original_max_len": 16},
    {"type": "yarn", "factor": 32.0, "original_max_len": 4096, "beta_fast": 32,
     "beta_slow": 1, "truncate": False},
    {"type": "yarn", "factor": 40.0, "original_max_len": 4096, "mscale": 1.0,
     "mscale_all_dim": 1.0},
    {"type": "yarn", "factor": 40.0, "original_max_len": 4096, "mscale": 0.707,
     "mscale_all_dim": 0.0},  # 0: left out
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: f"{s['type']}-{s['factor']:g}")
@pytest.mark.parametrize("fraction,head_dim,theta", [(1.0, 64, 500000.0), (0.25, 128, 10000.0)])
def test_scaled_frequencies_equal_transformers(scaling: dict[str, Any], fraction: float,
                                               head_dim: int, theta: float) -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    spec = make({"rope_theta": theta, "rotary_fraction": fraction, "rope_scaling": scaling},
                d_model=4 * head_dim, max_len=1 << 17)
    s = spec.embedding.rope_scaling
    assert s is not None
    ours, scale = scaled_frequencies(spec.rotary_dim, theta, s)
    params: dict[str, Any] = {"rope_type": s.type, "rope_theta": theta, "factor": s.factor,
                              "partial_rotary_factor": fraction}
    names = {"original_max_len": "original_max_position_embeddings"}
    for key in ("low_freq_factor", "high_freq_factor", "original_max_len", "beta_fast",
                "beta_slow", "mscale", "mscale_all_dim", "truncate"):
        if key in scaling:
            params[names.get(key, key)] = scaling[key]
    config = transformers.LlamaConfig(hidden_size=spec.d_model, num_attention_heads=4,
                                      max_position_embeddings=1 << 17, rope_parameters=params)
    theirs, their_scale = ROPE_INIT_FUNCTIONS[s.type](config, "cpu")
    assert len(ours) == spec.rotary_dim // 2 == theirs.numel()
    np.testing.assert_allclose(ours, theirs.double().numpy(), rtol=1e-6)
    assert scale == pytest.approx(their_scale)


def test_linear_scaling_divides_every_frequency() -> None:
    s = make({"rope_scaling": {"type": "linear", "factor": 4}}).embedding.rope_scaling
    assert s is not None
    inv, scale = scaled_frequencies(16, 10000.0, s)
    assert scale == 1.0
    assert inv == pytest.approx([f / 4 for f in base_frequencies(16, 10000.0)])


# ---- graph, accounting, back ends ------------------------------------------------------------


def _ropes(spec: Spec) -> list[Any]:
    return [n for n in tfgraph.compile(spec).ops() if n.op == "rope"]


def test_rope_attributes_only_when_used() -> None:
    plain = _ropes(make())[0].attrs
    assert set(plain) == {"heads", "head_dim", "theta"}
    full = _ropes(make({"rotary_fraction": 0.5, "rotary_layout": "interleaved",
                        "rope_scaling": {"type": "yarn", "factor": 4,
                                         "original_max_len": 16}}))[0].attrs
    assert full["rotary_dim"] == 8 and full["interleaved"] is True
    assert full["scaling"] == "yarn" and len(full["inv_freq"]) == 4
    assert full["scale"] == pytest.approx(0.1 * math.log(4) + 1)


def test_rope_flops_count_only_rotated_channels() -> None:
    whole = tfgraph.compile(make())
    quarter = tfgraph.compile(make({"rotary_fraction": 0.25}))
    ropes = [n for n in quarter.ops() if n.op == "rope"]
    costs = {c.node: c for c in op_costs(quarter)}
    q_rope = ropes[0]
    assert q_rope.attrs["rotary_dim"] == 4
    assert costs[q_rope.name].other == 3 * B * S * 4 * 4  # 3 per rotated element, h=4, rd=4
    whole_costs = {c.node: c for c in op_costs(whole)}
    assert whole_costs[q_rope.name].other == 3 * B * S * 4 * 16
    rep_whole, rep_quarter = whole.report(batch=2, seq=10), quarter.report(batch=2, seq=10)
    # q and k (4 heads each) in the one layer: 2 * 3 * B * S * 4 * (16 - 4) fewer
    assert rep_whole["flops"]["other"] - rep_quarter["flops"]["other"] == 2 * 3 * 20 * 4 * 12


def test_unit_offset_gains_start_at_zero_and_count_the_offset() -> None:
    from tfgraph.exporters import to_torch

    spec = make(norm={"kind": "rmsnorm", "position": "pre", "unit_offset": True})
    graph = tfgraph.compile(spec)
    norms = [n for n in graph.ops() if n.op == "rmsnorm"]
    assert norms and all(n.attrs["unit_offset"] for n in norms)
    module = to_torch(graph, seed=0)
    gains = {k: v for k, v in module.state_dict().items() if "norm" in k}
    assert gains and all(float(v.abs().max()) == 0.0 for v in gains.values())
    plain = make(norm={"kind": "rmsnorm", "position": "pre"})
    diff = graph.report(batch=1, seq=3)["flops"]["other"] - \
        tfgraph.compile(plain).report(batch=1, seq=3)["flops"]["other"]
    assert diff == len(norms) * spec.d_model  # one add per gain element per norm call


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm", "scalenorm"])
@pytest.mark.parametrize("opset", [23, 17])
def test_unit_offset_onnx_keeps_the_stored_gain_and_adds_one(kind: str, opset: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    import onnx.numpy_helper
    import torch

    from tfgraph.exporters import to_torch
    from tfgraph.exporters.onnx.model import to_onnx

    spec = make(norm={"kind": kind, "position": "pre", "unit_offset": True},
                ffn={"activation": "geglu_tanh", "hidden": 40})
    graph = tfgraph.compile(spec)
    module = to_torch(graph, seed=3).eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.normal_(0.0, 0.3)  # offsets that matter
    weights = {k: v.detach() for k, v in module.state_dict().items()}
    model = to_onnx(graph, weights=weights, opset=opset)
    inits = {i.name: i for i in model.graph.initializer}
    for name, w in weights.items():
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(inits[name]), w.numpy())
    assert any(n.op_type == "Add" and n.name.endswith("/one_plus") for n in model.graph.node)
    ids = torch.randint(0, spec.vocab, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = module(ids).numpy()
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]
                               ).run(None, {"input_ids": ids.numpy()})[0]
    assert np.abs(got - want).max() <= 1e-4


def test_geglu_tanh_lowers_to_a_gated_tanh_gelu() -> None:
    graph = tfgraph.compile(make(ffn={"activation": "geglu_tanh", "hidden": 40}))
    acts = [n for n in graph.ops() if n.meta.role == "act"]
    assert acts and all(n.op == "gelu_tanh" for n in acts)
    params = [p.name for p in graph.params()]
    assert "decoder.layers.0.ffn.gate.weight" in params


def test_formulas_write_partial_rotation_as_a_share_of_head_dim() -> None:
    """The symbolic twin (tfgraph.passes.formulas) rotates rd = hd/4 channels: every figure is
    verified against the numbers, and q and k rotate 2 * 3 * B*S*h*(3/4)hd fewer elements
    than with whole heads, with head_dim derived (hd = d/h) and explicit."""
    import sympy

    from tfgraph.passes.formulas import D, H, HD, L, spec_formulas

    for attention, hd in (({"heads": 4}, D / H), ({"heads": 4, "head_dim": 24}, HD)):
        figures = []
        for fraction in (1.0, 0.25):
            spec = make({"rotary_fraction": fraction, "rotary_layout": "interleaved",
                         "rope_scaling": {"type": "llama3", "factor": 8}},
                        attention=attention, norm={"kind": "rmsnorm", "position": "pre",
                                                   "unit_offset": True})
            formulas = spec_formulas(tfgraph.compile(spec))
            assert formulas is not None and formulas.unverified == []
            figures.append(formulas.figures["flops.other"])
        saved = L * 2 * 3 * B * S * H * sympy.Rational(3, 4) * hd
        assert sympy.expand(figures[0] - figures[1] - saved) == 0
