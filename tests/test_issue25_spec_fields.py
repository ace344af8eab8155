"""The spec fields issue 25's families added: attention.clip_qkv (MPT, OLMo 1), norm.affine
false (OLMo 1), embedding.rope_global false (Cohere2) and the sparsemixer router with
ffn.router_eps (Phi-3.5-MoE): their rules, their accounting, and the router against
transformers' own function (the families' end-to-end proofs are tests/test_hf_families.py).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch import functional as tf
from tfgraph.spec.schema import Spec


def make(**over: Any) -> Spec:
    data: dict[str, Any] = {"name": "t", "arch": "decoder-only", "d_model": 16, "layers": 2,
                            "vocab": 23, "attention": {"heads": 4}, "dropout": 0.0,
                            "norm": {"position": "pre"}}
    for key, value in over.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return Spec.model_validate(data)


@pytest.mark.parametrize("over,message", [
    ({"attention": {"heads": 4, "clip_qkv": 0}}, "greater than 0"),
    ({"norm": {"affine": False, "kind": "rmsnorm"}}, "norm.affine: false is for layernorm"),
    ({"norm": {"affine": False, "unit_offset": True}}, "unit_offset"),
    ({"norm": {"affine": False, "bias": True}}, "has no bias"),
    ({"embedding": {"rope_global": False}}, "needs positions: rope"),
    ({"ffn": {"experts": 4, "top_k": 3, "bias": False, "router": "sparsemixer"}},
     "picks 2 experts"),
    ({"ffn": {"experts": 4, "top_k": 2, "bias": False, "router_eps": 0.1}},
     "only for router: sparsemixer"),
])
def test_rules(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**over)


def test_a_norm_without_parameters_has_none_and_skips_gain_and_bias() -> None:
    plain, bare = make(norm={"kind": "layernorm"}), make(norm={"affine": False})
    assert bare.norm.bias is False
    g_plain, g_bare = tfgraph.compile(plain), tfgraph.compile(bare)
    assert not [p for p in g_bare.params() if "norm" in p.name]
    norms = 2 * 2 + 1  # two per layer and the final one, each d = 16 wide
    assert g_plain.report()["params"] - g_bare.report()["params"] == norms * 2 * 16
    other = g_plain.report(batch=2, seq=5)["flops"]["other"] \
        - g_bare.report(batch=2, seq=5)["flops"]["other"]
    assert other == norms * 2 * 5 * 16 * 2  # the gain multiply and the bias add per element


def test_clip_costs_two_flops_per_element_of_q_k_and_v() -> None:
    base, clipped = make(), make(attention={"heads": 4, "kv_heads": 2, "clip_qkv": 0.5})
    unclipped = make(attention={"heads": 4, "kv_heads": 2})
    g = tfgraph.compile(clipped)
    clips = [n for n in g.ops() if n.op == "clip"]
    assert len(clips) == 3 * 2 and all(n.attrs["bound"] == 0.5 for n in clips)
    extra = g.report(batch=2, seq=5)["flops"]["other"] \
        - tfgraph.compile(unclipped).report(batch=2, seq=5)["flops"]["other"]
    assert extra == 2 * 2 * 5 * (16 + 8 + 8) * 2  # layers * B * S * (q + k + v widths) * 2
    assert base.attention.clip_qkv is None
    ids = torch.randint(0, 23, (2, 5), generator=torch.Generator().manual_seed(0))

    def logits(bound: float | None) -> torch.Tensor:
        spec = make(attention={"heads": 4, "kv_heads": 2, "clip_qkv": bound})
        with torch.no_grad():
            return to_torch(tfgraph.compile(spec), seed=0).eval()(ids)

    assert torch.equal(logits(1e6), logits(None))  # a bound nothing reaches: no change
    assert not torch.allclose(logits(1e-3), logits(None))


def test_rope_only_on_the_local_layers() -> None:
    spec = make(embedding={"positions": "rope", "rope_global": False},
                attention={"heads": 4, "window": 3, "window_pattern": ["local", "global"]})
    g = tfgraph.compile(spec)
    rotated = sorted({n.meta.layer for n in g.ops() if n.op == "rope"})
    assert rotated == [0]
    nope = make(embedding={"positions": "rope", "rope_global": False})  # no window: all global
    assert not [n for n in tfgraph.compile(nope).ops() if n.op == "rope"]


def test_sparsemixer_equals_transformers_on_random_and_tied_logits() -> None:
    transformers = pytest.importorskip("transformers")
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 6, generator=gen)
    logits[:8] = torch.round(logits[:8])  # ties and exact zeros
    logits[8:16] = -logits[8:16].abs()  # all negative: max(|s|, m) is |s|
    for eps in (0.0, 0.01, 0.3):
        weights, chosen = sparsemixer(logits, jitter_eps=eps, training=False)
        want = torch.zeros_like(logits).scatter(-1, chosen, weights)
        got = tf.route(logits, 2, "sparsemixer", eps=eps)
        torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert transformers is not None
