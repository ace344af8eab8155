"""Gemma, Gemma 2 and Gemma 3 (Gemma Team 2024, 2024b, 2025): RMSNorm decoders whose gains are
stored as offsets from 1 (``norm.unit_offset``), token embeddings scaled by sqrt(d_model), a
tied head and a GeGLU feed-forward with the tanh GELU.

Gemma 2 adds a norm after each sublayer (``norm.position: sandwich``), soft-capped attention
scores and logits, q scaled by ``query_pre_attn_scalar^-0.5`` and sliding-window layers
alternating with global ones. Gemma 3 adds per-head q/k RMSNorm (``attention.qk_norm: head``),
five local layers per global one, and a separate rotary base for the local layers
(``embedding.local_rope_theta``), the global layers' rotary scaling not applying to them.
"""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import (layer_kinds, llama_layer_rows, llama_outer_rows,
                               put_decoder_sizes, put_windows)
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_rope, rope_parameters
from tfgraph.hf.export_common import decoder_sizes, gated_activation, layer_types
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.hf.rope_types import per_type_rope
from tfgraph.spec.schema import Spec

_NORMS = {"input_layernorm": "self_attn_norm", "post_attention_layernorm": "ffn_norm"}
_SANDWICH = {"input_layernorm": "self_attn_norm", "post_attention_layernorm": "self_attn_out_norm",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "ffn_out_norm"}


def _activation(cfg: HFConfig) -> str:
    if cfg.model_type == "gemma":
        # modeling_gemma reads hidden_act; GemmaConfig turns the official releases' legacy
        # "gelu" into "gelu_pytorch_tanh", the approximation they were trained with.
        if cfg.get("hidden_act", "gelu_pytorch_tanh") == "gelu":
            return "geglu_tanh"
        return activation(cfg, "hidden_act", gated=True, default="gelu_pytorch_tanh")
    return activation(cfg, "hidden_activation", gated=True, default="gelu_pytorch_tanh")


def _gemma3_rope(cfg: HFConfig, types: Any) -> tuple[dict[str, Any], float]:
    """(the global layers' rope parameters, the local layers' theta) as
    Gemma3TextConfig.convert_rope_params_to_dict makes them (tfgraph.hf.rope_types): a flat
    rope_parameters mapping is kept there but never read (the layer types' entries get the
    defaults) except its YaRN ``truncate``, which the entries' is not, a legacy rope_scaling
    updates the global entry alone, the top-level rope_theta and rope_local_base_freq fill
    missing thetas (else 1e6 and 1e4)."""
    kinds = {t for t in types if isinstance(t, str)} if isinstance(types, list) else set()
    rope = per_type_rope(cfg, {"full_attention": ("rope_theta", 1000000.0),
                               "sliding_attention": ("rope_local_base_freq", 10000.0)},
                         ("full_attention",), kinds)
    full, local = rope["full_attention"], rope["sliding_attention"]
    theta = local["rope_theta"]
    if "sliding_attention" in kinds:
        if isinstance(theta, bool) or not isinstance(theta, (int, float)):
            cfg.refuse("rope_parameters", "sliding_attention's rope_theta must be a number",
                       cfg.data.get("rope_parameters"))
        if local["rope_type"] != "default":
            cfg.refuse("rope_parameters", "tfgraph scales the rotary frequencies of every "
                       "layer alike; scaling only the sliding-window layers has no spec form",
                       cfg.data.get("rope_parameters"))
        if "full_attention" not in kinds:  # every layer local: the global entry is unread
            full = {"rope_type": "default", "rope_theta": theta}
    return full, float(theta) if isinstance(theta, (int, float)) else 0.0


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    kind = cfg.model_type
    layers = cfg.int("num_hidden_layers")
    put_decoder_sizes(draft, cfg)
    draft.put("embedding.scale", True)  # GemmaTextScaledWordEmbedding: * hidden_size**0.5
    draft.put("embedding.tie_output", cfg.bool("tie_word_embeddings", True),
              "tie_word_embeddings")
    if cfg.bool("use_bidirectional_attention", False):
        cfg.refuse("use_bidirectional_attention", "a decoder-only tfgraph model is causal")
    draft.put("attention.bias", cfg.bool("attention_bias", False), "attention_bias")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    draft.put("ffn.activation", _activation(cfg), "hidden_activation")
    draft.put("ffn.bias", False)
    draft.put("norm.position", "pre" if kind == "gemma" else "sandwich", "model_type")
    draft.put("norm.kind", "rmsnorm")
    draft.put("norm.eps", cfg.float("rms_norm_eps"), "rms_norm_eps")
    draft.put("norm.final", True)
    draft.put("norm.unit_offset", True, "model_type")
    if kind == "gemma":
        where, params = rope_parameters(cfg)
        put_rope(draft, params, where)
        return draft
    head_dim = cfg.int("head_dim", cfg.int("hidden_size") // cfg.int("num_attention_heads"))
    # a key the config lacks takes its config class's default (Gemma2Config: scalar 256,
    # softcaps 50 and 30; Gemma3TextConfig: scalar 256, no softcaps), not head_dim or none
    scalar = cfg.float("query_pre_attn_scalar",
                       float(cfg.class_default("query_pre_attn_scalar", head_dim)))
    if scalar != head_dim:  # scores times query_pre_attn_scalar^-0.5, not head_dim^-0.5
        draft.put("attention.scale", scalar ** -0.5, "query_pre_attn_scalar")
    if kind == "gemma3_text":
        # Gemma3Attention keeps attn_logit_softcapping but never passes it to the attention
        # function (modeling_gemma3, transformers 5.24): the scores are not capped
        cfg.moot("attn_logit_softcapping")
    elif cfg.as_class("attn_logit_softcapping") is not None:
        draft.put("attention.softcap", cfg.float("attn_logit_softcapping",
                                                 cfg.class_default("attn_logit_softcapping")),
                  "attn_logit_softcapping")
    if cfg.as_class("final_logit_softcapping") is not None:
        final_cap = cfg.float("final_logit_softcapping",
                              cfg.class_default("final_logit_softcapping"))
        draft.put("head.softcap", final_cap, "final_logit_softcapping", final_cap)
    types = cfg.get("layer_types", None)
    if types is not None:  # what modeling reads; older configs' pattern made it
        cfg.moot("sliding_window_pattern")
    if types is None:  # Gemma2Config / Gemma3TextConfig defaults
        period = 2 if kind == "gemma2" else cfg.int("sliding_window_pattern", 6)
        types = layer_kinds(layers, lambda i: "sliding_attention" if (i + 1) % period
                            else "full_attention")
    put_windows(draft, types, cfg.get("sliding_window", None), layers)
    if kind == "gemma2":
        where, params = rope_parameters(cfg)
        put_rope(draft, params, where)
        return draft
    draft.put("attention.qk_norm", "head", "model_type")
    params, local_theta = _gemma3_rope(cfg, types)
    # (a legacy rope_scaling, when there is one, is what set the global layers' scaling)
    where = "rope_scaling" if cfg.data.get("rope_scaling") is not None else "rope_parameters"
    put_rope(draft, params, where)
    if "window" in draft.data.get("attention", {}):
        # The local layers keep their own unscaled base (tfgraph's lowering leaves layers with
        # local_rope_theta unscaled, as Gemma 3 does), so write it whenever the global layers'
        # base differs or is scaled.
        scaled = "rope_scaling" in draft.data.get("embedding", {})
        if scaled or local_theta != float(params.get("rope_theta", 10000.0)):
            draft.put("embedding.local_rope_theta", local_theta, where, local_theta)
    return draft


def _pre_attn_scalar(spec: Spec) -> int:
    """``query_pre_attn_scalar`` s (an int in Gemma2Config and Gemma3TextConfig) with
    s^-0.5 the attention scale; a scale no whole number gives fails the round trip."""
    scale, head_dim = spec.attention.scale, spec.attention.head_dim
    if scale is None:
        return int(head_dim or 0)
    return max(1, round(scale ** -2))


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads. Every Gemma 2 / 3 default that changes
    the computation (soft-caps 50 and 30, query_pre_attn_scalar 256, the layer pattern) is
    written explicitly, None where the spec has none."""
    out = decoder_sizes(spec)
    out["attention_bias"] = spec.attention.bias
    out["intermediate_size"] = spec.ffn.hidden
    act = gated_activation(spec, fallback="gelu_pytorch_tanh")
    out["hidden_act" if model_type == "gemma" else "hidden_activation"] = act
    out["rms_norm_eps"] = spec.norm.eps
    if model_type == "gemma":
        out["rope_parameters"] = rope_config(spec)
        return out
    out["query_pre_attn_scalar"] = _pre_attn_scalar(spec)
    out["attn_logit_softcapping"] = spec.attention.softcap
    out["final_logit_softcapping"] = spec.head.softcap
    out["sliding_window"] = spec.attention.window
    out["layer_types"] = layer_types(spec)
    if model_type == "gemma2":
        out["rope_parameters"] = rope_config(spec)
        return out
    emb = spec.embedding
    local = emb.local_rope_theta if emb.local_rope_theta is not None else emb.rope_theta
    full = rope_config(spec)
    out["rope_parameters"] = {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": float(local)}}
    if "truncate" in full:  # YaRN's: transformers reads it from the top level alone
        out["rope_parameters"]["truncate"] = full.pop("truncate")
    out["use_bidirectional_attention"] = False
    return out


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    norms = dict(_NORMS if cfg.model_type == "gemma" else _SANDWICH)
    if cfg.model_type == "gemma3_text":
        norms |= {"self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"}
    rows = llama_outer_rows(spec)
    rows += llama_layer_rows(spec, "model.layers", norms)
    return rows
