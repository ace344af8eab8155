"""Cohere Command-R (Cohere 2024): attention and a SwiGLU feed-forward side by side on one
shared LayerNorm without a bias (``norm.bias: false``), rotary positions on interleaved channel
pairs (GPT-J's layout), grouped-query attention, the head tied to the token table and the
logits multiplied by ``logit_scale`` (``head.scale``: the head has no bias). ``use_qk_norm``
(a LayerNorm gain per head, Command-R+) is refused.

Cohere2 (Command R7B, Cohere 2024) is the same block with sliding-window attention on the
layers ``layer_types`` names (older configs: every ``sliding_window_pattern``-th layer is
global) and rotary positions on the sliding layers only: Cohere2Attention rotates q and k
``if self.sliding_window is not None``, so its global layers have no positions at all
(``embedding.rope_global: false``)."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import (layer_kinds, llama_layer_rows, llama_outer_rows,
                               put_decoder_sizes, put_windows)
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_rope, rope_parameters
from tfgraph.hf.export_common import decoder_sizes, gated_activation, layer_types
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    second = cfg.model_type == "cohere2"
    if not second and cfg.bool("use_qk_norm", False):
        cfg.refuse("use_qk_norm", "Cohere's per-head LayerNorm on q and k (a gain per head) "
                   "has no spec form")
    if second:  # Cohere2Config.__post_init__ sets head_dim = hidden_size // heads, always
        width, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
        if heads and cfg.int("head_dim", width // heads) != width // heads:
            cfg.refuse("head_dim", f"transformers' Cohere2Config replaces it with hidden_size "
                       f"/ num_attention_heads = {width // heads}")
    put_decoder_sizes(draft, cfg)
    draft.put("embedding.tie_output", cfg.bool("tie_word_embeddings", True),
              "tie_word_embeddings")
    draft.put("embedding.rotary_layout", "interleaved", "model_type")
    draft.put("attention.bias", cfg.bool("attention_bias", False), "attention_bias")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    draft.put("ffn.activation", activation(cfg, "hidden_act", gated=True, default="silu"),
              "hidden_act")
    draft.put("ffn.bias", False)
    draft.put("norm.kind", "layernorm")
    draft.put("norm.bias", False, "model_type")  # CohereLayerNorm: a gain, no bias
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_eps", 1e-5), "layer_norm_eps")
    draft.put("norm.final", True)
    draft.put("block.residual", "parallel")
    draft.put("block.shared_norm", True)
    scale = cfg.float("logit_scale", 0.0625)
    if scale != 1.0:
        draft.put("head.scale", scale, "logit_scale")
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where)
    if second:
        put_cohere2_windows(draft, cfg)
    return draft


def put_cohere2_windows(draft: SpecDraft, cfg: HFConfig) -> None:
    """Cohere2's sliding layers (layer_types, or every sliding_window_pattern-th layer global
    when a config has no layer_types) and NoPE on the global ones."""
    layers = cfg.int("num_hidden_layers")
    types = cfg.get("layer_types", None)
    if types is None:  # Cohere2Config.__post_init__'s reading of older configs
        period = cfg.int("sliding_window_pattern", 4)
        if period < 1:
            cfg.refuse("sliding_window_pattern", "must be at least 1")
        types = layer_kinds(layers, lambda i: "sliding_attention" if (i + 1) % period
                            else "full_attention")
    else:  # transformers keeps it then, unread
        cfg.moot("sliding_window_pattern")
    put_windows(draft, types, cfg.get("sliding_window", None), layers)
    draft.put("embedding.rope_global", False, "model_type")


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec Cohere cannot hold."""
    att = spec.attention
    if spec.norm.kind != "layernorm" or spec.norm.bias or spec.block.residual != "parallel" \
            or spec.embedding.rope_global == (model_type == "cohere2"):
        return None
    if model_type == "cohere2":
        return {
            **decoder_sizes(spec, head_dim=False),
            "attention_bias": bool(att.qkv_bias), "intermediate_size": spec.ffn.hidden,
            "hidden_act": gated_activation(spec), "layer_norm_eps": spec.norm.eps,
            "logit_scale": spec.head.scale or 1.0, "rope_parameters": rope_config(spec),
            "sliding_window": att.window, "layer_types": layer_types(spec),
        }
    return {
        **decoder_sizes(spec, head_dim=False),
        "attention_bias": bool(att.qkv_bias), "use_qk_norm": False,
        "intermediate_size": spec.ffn.hidden, "hidden_act": gated_activation(spec),
        "layer_norm_eps": spec.norm.eps, "logit_scale": spec.head.scale or 1.0,
        "rope_parameters": rope_config(spec),
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    # attention_bias covers q, k, v and o alike; one LayerNorm feeds both sublayers
    return llama_outer_rows(spec) + llama_layer_rows(spec, "model.layers",
                                                     {"input_layernorm": "norm"})
