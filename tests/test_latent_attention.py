"""Multi-head latent attention (``attention.latent``) and DeepSeek's routing (``ffn.router``
sigmoid_topk*, ``router_groups``, ``router_top_groups``, ``router_scale``): the spec's rules,
the routing kernel against transformers' own routers, and the KV cache of a latent-attention
decoder (the latent and the rotary key, as transformers' DeepSeek models cache).

The end-to-end checks against transformers (parameters, FLOPs, logits, generation) are the
deepseek_v2 / deepseek_v3 cases of tests/test_hf_families.py and tests/test_generate.py.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import tfgraph
from tfgraph.exporters.torch import functional as tf
from tfgraph.spec.schema import Spec

from parity_support import tiny

transformers = pytest.importorskip("transformers")

LATENT = {"kv_rank": 16, "q_rank": 24, "rope_dim": 4, "v_head_dim": 6}


def _spec(attention: dict[str, Any] | None = None, ffn: dict[str, Any] | None = None,
          **top: Any) -> dict[str, Any]:
    return {"name": "m", "arch": "decoder-only", "d_model": 32, "layers": 2, "vocab": 50,
            "embedding": {"positions": "rope"},
            "attention": {"heads": 4, "head_dim": 12, "bias": False, "latent": LATENT,
                          **(attention or {})},
            **({"ffn": ffn} if ffn else {}), **top}


MOE = {"bias": False, "experts": 8, "top_k": 2}


@pytest.mark.parametrize("data, message", [
    (_spec({"kv_heads": 2}), "attention.kv_heads: latent attention expands"),
    (_spec({"latent": {**LATENT, "rope_dim": 3}}), "attention.latent.rope_dim: 3 must be even"),
    (_spec({"latent": {**LATENT, "rope_dim": 12}}), "below head_dim 12"),
    (_spec({"bias": True}), "attention.qkv_bias: latent attention's projections"),
    (_spec({"qk_norm": "head"}), "attention.qk_norm: not combined with latent"),
    (_spec({"window": 8}), "attention.window: not combined with latent"),
    ({**_spec(), "embedding": {"positions": "learned"}, "max_len": 16},
     "attention.latent: needs embedding.positions rope"),
    ({**_spec(), "embedding": {"positions": "rope", "rotary_fraction": 0.5}},
     "attention.latent: needs embedding.positions rope with rotary_fraction 1"),
    (_spec(block={"residual": "parallel"}, norm={"position": "pre"}),
     "block.residual: latent attention is implemented with sequential"),
    (_spec(ffn={**MOE, "router_groups": 3}), "ffn.router_groups: 8 experts do not split"),
    (_spec(ffn={**MOE, "router_groups": 4, "router_top_groups": 5}),
     "ffn.router_top_groups: 5 is more than the 4 groups"),
    (_spec(ffn={**MOE, "router_top_groups": 1}), "ffn.router_top_groups: needs"),
    (_spec(ffn={**MOE, "top_k": 4, "router_groups": 4, "router_top_groups": 1}),
     "ffn.top_k: 4 experts do not fit in 1 groups of 2"),
    (_spec(ffn={**MOE, "router": "sigmoid_topk", "router_groups": 8}),
     "ffn.router_groups: a sigmoid router scores a group by its two best"),
    (_spec(ffn={**MOE, "router": "topk_softmax", "router_groups": 2}),
     "ffn.router_groups: group-limited routing is for"),
    (_spec(ffn={**MOE, "router_scale": 0}), "router_scale"),
    (_spec(ffn={"router_scale": 2.0}), "ffn.router_scale: only for a mixture of experts"),
])
def test_spec_rules(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Spec.model_validate(data)


def test_value_heads_default_to_the_position_free_channels() -> None:
    data = _spec({"latent": {"kv_rank": 16, "rope_dim": 4}})
    spec = Spec.model_validate(data)
    assert spec.attention.latent is not None and spec.attention.latent.v_head_dim == 8
    assert spec.rotary_dim == 4  # the rotary part is latent.rope_dim, not the whole head


def _hf_router(cls: Any, config: Any, logits: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """transformers' router on hidden states equal to the logits (weight = identity), its
    (weights, indices) scattered to (N, E)."""
    router = cls(config)
    with torch.no_grad():
        router.weight.copy_(torch.eye(logits.shape[-1]))
        if bias is not None:
            router.e_score_correction_bias.copy_(bias)
    _, weights, index = router(logits)
    return torch.zeros_like(logits).scatter(-1, index, weights)


@pytest.mark.parametrize("renorm", [True, False])
def test_sigmoid_group_routing_is_deepseek_v3s_router(renorm: bool) -> None:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = transformers.DeepseekV3Config(hidden_size=16, n_routed_experts=16,
                                           num_experts_per_tok=3, n_group=4, topk_group=2,
                                           norm_topk_prob=renorm, routed_scaling_factor=2.5)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 16, generator=gen)
    bias = torch.randn(16, generator=gen) * 0.5  # large enough to change choices
    want = _hf_router(DeepseekV3TopkRouter, config, logits, bias)
    got = tf.route(logits, 3, "sigmoid_topk_renorm" if renorm else "sigmoid_topk", bias,
                   groups=4, top_groups=2, scale=2.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # the bias moves the choice, never the weights: without it other experts win
    plain = tf.route(logits, 3, "sigmoid_topk", torch.zeros(16), groups=4, top_groups=2)
    assert not torch.equal(plain != 0, got != 0)
    chosen = got != 0  # every chosen expert's weight is its sigmoid score (times the scale)
    if not renorm:
        torch.testing.assert_close(got[chosen], 2.5 * logits.sigmoid()[chosen])


@pytest.mark.parametrize("method", ["greedy", "group_limited_greedy"])
def test_softmax_group_routing_is_deepseek_v2s_router(method: str) -> None:
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    config = transformers.DeepseekV2Config(hidden_size=16, num_attention_heads=4,
                                           n_routed_experts=16,
                                           num_experts_per_tok=3, n_group=4, topk_group=2,
                                           topk_method=method, routed_scaling_factor=1.5)
    logits = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    want = _hf_router(DeepseekV2TopkRouter, config, logits)
    groups = 4 if method == "group_limited_greedy" else 1
    got = tf.route(logits, 3, "softmax_topk", groups=groups, top_groups=2 if groups > 1 else 1,
                   scale=1.5)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_the_cache_is_the_latent_and_the_rotary_key() -> None:
    spec = tiny("tiny-deepseek-v3.yaml")
    lat = spec.attention.latent
    assert lat is not None
    graph = tfgraph.compile(spec, cache=True)
    key, value = (graph.node(f"past_key_values.0.{part}").type.shape for part in ("key", "value"))
    assert (key[1], key[3]) == (1, lat.kv_rank) and (value[1], value[3]) == (1, lat.rope_dim)
    info = tfgraph.compile(spec).info.cache
    assert info is not None and (info.kv_heads, info.head_dim, info.v_dim) == (
        1, lat.kv_rank, lat.rope_dim)
    # every step expands all cached positions again through kv_b (as transformers does):
    # its rows are the past and this step's, P + S
    kv_b = [n for n in graph.ops() if n.name.endswith("self_attn.kv_b")][0]
    assert graph.node(kv_b.inputs[0]).type.shape[1] == graph.node(
        "attention_mask").type.shape[1]
    # memory.kv_cache counts the latent and the rotary key per token and layer
    full = tfgraph.compile(spec).report(batch=2, seq=10)
    assert full["memory"]["kv_cache"] == 2 * 10 * spec.layers * (lat.kv_rank + lat.rope_dim) * 4


def test_genai_config_is_refused_for_a_latent_cache() -> None:
    from tfgraph.errors import TfgraphError
    from tfgraph.exporters.onnx.genai_config import genai_config

    graph = tfgraph.compile(tiny("tiny-deepseek-v3.yaml"), cache=True)
    with pytest.raises(TfgraphError, match="keys and values of different widths"):
        genai_config(graph, "model.onnx")


def test_build_kv_cache_writes_a_latent_model_without_genai_config(tmp_path) -> None:
    """README (KV cache, attention.latent): ``build --kv-cache`` writes the model and leaves
    out only genai_config.json (a note says why; it refused the whole build before), and
    ``tfgraph generate MODEL.onnx`` gives the tokens of the spec built in memory;
    ``--genai-provider`` asks for the file, so it is refused."""
    import json

    from cli_support import refused, tfgraph as run_cli
    from conftest import ROOT

    spec = str(ROOT / "specs" / "tiny-mla.yaml")
    out = tmp_path / "model.onnx"
    built = run_cli("build", spec, "--to", "onnx", "--kv-cache", "-o", str(out))
    assert built.returncode == 0, built.stderr
    assert "no genai_config.json" in built.stderr and "different widths" in built.stderr
    assert out.is_file() and not (tmp_path / "genai_config.json").exists()
    prompt = ("--prompt-ids", "5,17,42", "--prompt-ids", "9,8", "--max-new-tokens", "6",
              "--json")
    tokens = [json.loads(r.stdout)["tokens"]
              for r in (run_cli("generate", str(out), *prompt),
                        run_cli("generate", spec, *prompt))]
    assert tokens[0] == tokens[1] and len(tokens[0][0]) == 6
    refused(run_cli("build", spec, "--to", "onnx", "--kv-cache", "--genai-provider", "cuda",
                    "-o", str(tmp_path / "cuda.onnx")), "--genai-provider", "different widths")
    assert not (tmp_path / "cuda.onnx").exists()


def test_the_hub_configs_keys_from_deepseeks_own_code() -> None:
    """The hub's config.json files were written for DeepSeek's trust_remote_code modeling:
    scoring_func, topk_method and moe_layer_freq must say what transformers computes (else
    exit 2 by name); ep_size, aux_loss_alpha and seq_aux are training and parallelism only."""
    import json

    from tfgraph.errors import TfgraphError
    from tfgraph.hf import spec_from_config

    base = json.loads(transformers.DeepseekV3Config(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, vocab_size=101, q_lora_rank=24,
        kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
        n_routed_experts=8, num_experts_per_tok=2, n_group=4, topk_group=2,
        first_k_dense_replace=1).to_json_string())
    hub = dict(base, scoring_func="sigmoid", topk_method="noaux_tc", moe_layer_freq=1,
               ep_size=1, aux_loss_alpha=0.001, seq_aux=True)
    assert spec_from_config(hub) == spec_from_config(base)
    for key, value in (("scoring_func", "softmax"), ("topk_method", "greedy"),
                       ("moe_layer_freq", 2)):
        with pytest.raises(TfgraphError, match=key):
            spec_from_config(dict(hub, **{key: value}))


@pytest.mark.parametrize("family", ["deepseek_v2", "deepseek_v3"])
def test_onnx_opset_17_matches_transformers(family: str) -> None:
    """tests/test_hf_families.py checks the fused opset-23 model; here the decomposed opset 17
    (attention, RMS norm and rotary written out) against the same reference."""
    import json

    import numpy as np

    ort = pytest.importorskip("onnxruntime")
    from test_hf_families import CASES, build_reference, family_seed

    from parity_support import check
    from tfgraph.exporters.onnx.model import to_onnx
    from tfgraph.hf import name_map, spec_from_config

    ref = build_reference(CASES[family], family_seed(family))
    config = json.loads(ref.config.to_json_string())
    spec = spec_from_config(config)
    weights = name_map(config, spec).to_tfgraph(ref.state_dict())
    ids = torch.randint(2, spec.vocab_size("source"), (2, 19),
                        generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(input_ids=ids).logits
    model = to_onnx(tfgraph.compile(spec), weights={k: v.detach() for k, v in weights.items()},
                    opset=17)
    session = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    got = session.run(None, {"input_ids": ids.numpy().astype(np.int64)})[0]
    check(torch.from_numpy(got), expected)
