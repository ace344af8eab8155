"""StableLM 2 and StableLM-3B-4E1T (Stability AI 2023-24): a Llama-style decoder with
LayerNorm (gain and bias), rotary positions on a fraction of each head
(``partial_rotary_factor``, 0.25), optional q/k/v biases (``use_qkv_bias``) and, with
``use_parallel_residual``, attention and feed-forward side by side on one shared norm."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import llama_layer_rows, llama_outer_rows, put_decoder_sizes
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_rope, rope_parameters
from tfgraph.hf.export_common import decoder_sizes, gated_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    if cfg.bool("qk_layernorm", False):
        cfg.refuse("qk_layernorm", "StableLM's per-head LayerNorm on q and k (a gain per head) "
                   "has no spec form")
    put_decoder_sizes(draft, cfg, head_dim_field=None)  # modeling_stablelm: hidden / heads
    draft.put("attention.qkv_bias", cfg.bool("use_qkv_bias", False), "use_qkv_bias")
    draft.put("attention.out_bias", False)  # modeling_stablelm: o_proj has no bias
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    draft.put("ffn.activation", activation(cfg, "hidden_act", gated=True, default="silu"),
              "hidden_act")
    draft.put("ffn.bias", False)
    draft.put("norm.kind", "layernorm")
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_eps", 1e-5), "layer_norm_eps")
    draft.put("norm.final", True)
    if cfg.bool("use_parallel_residual", False):
        draft.put("block.residual", "parallel", "use_parallel_residual")
        draft.put("block.shared_norm", True, "use_parallel_residual")
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where, partial=True)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec StableLM cannot
    hold (no LayerNorm, biases it lacks)."""
    att = spec.attention
    if att.out_bias or spec.ffn.bias or spec.norm.kind != "layernorm":
        return None
    return {
        **decoder_sizes(spec, head_dim=False),
        "use_qkv_bias": bool(att.qkv_bias), "qk_layernorm": False,
        "intermediate_size": spec.ffn.hidden, "hidden_act": gated_activation(spec),
        "layer_norm_eps": spec.norm.eps,
        "use_parallel_residual": spec.block.residual == "parallel",
        "rope_parameters": rope_config(spec, partial=True),
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    # o_proj and the MLP have no biases (config_from_spec refuses specs with them)
    norms = ({"input_layernorm": "norm"} if spec.block.residual == "parallel"  # one for both
             else {"input_layernorm": "self_attn_norm", "post_attention_layernorm": "ffn_norm"})
    return llama_outer_rows(spec) + llama_layer_rows(spec, "model.layers", norms)
