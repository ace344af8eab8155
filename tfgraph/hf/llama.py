"""Llama and its close relatives: llama, mistral, qwen2, qwen3, olmo, olmo2, granite, helium,
seed_oss, ministral, arcee.

All are pre-norm (OLMo 2: branch norm) RMSNorm (OLMo 1: LayerNorm without parameters) decoders with rotary positions and a SwiGLU
feed-forward, and share Hugging Face's ``model.layers.{i}.self_attn.q_proj`` naming. What differs
is in ``_FAMILY``: where the attention biases are (Qwen2: q, k, v only, Yang et al. 2024), the
q/k norms (Qwen3: per head; OLMo 2: over the whole projection, OLMo et al. 2024), and which
norms a layer has.
"""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import (layer_kinds, llama_layer_rows, llama_outer_rows,
                               put_decoder_sizes, put_rms_rope, put_windows)
from tfgraph.hf.config import (HFConfig, SpecDraft, activation, put_embedding_dropout, put_rope,
                               rope_parameters)
from tfgraph.hf.export_common import (decoder_sizes, gated_activation, layer_types,
                                      plain_activation)
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec

# model_type -> (norm position, qk_norm, per-layer norms: Hugging Face name -> tfgraph name)
_FAMILY: dict[str, tuple[str, str, dict[str, str]]] = {
    "llama": ("pre", "none", {"input_layernorm": "self_attn_norm",
                              "post_attention_layernorm": "ffn_norm"}),
    "mistral": ("pre", "none", {"input_layernorm": "self_attn_norm",
                                "post_attention_layernorm": "ffn_norm"}),
    "qwen2": ("pre", "none", {"input_layernorm": "self_attn_norm",
                              "post_attention_layernorm": "ffn_norm"}),
    # Helium (Kyutai 2025: rotary on interleaved pairs), Seed-OSS (ByteDance 2025: its o_proj bias is attention_out_bias),
    # Ministral (Mistral AI 2024: sliding windows per layer_types) and Arcee AFM (2025: an
    # ungated squared-ReLU MLP) are Llama's decoder as well.
    "helium": ("pre", "none", {"input_layernorm": "self_attn_norm",
                                "post_attention_layernorm": "ffn_norm"}),
    "seed_oss": ("pre", "none", {"input_layernorm": "self_attn_norm",
                                "post_attention_layernorm": "ffn_norm"}),
    "ministral": ("pre", "none", {"input_layernorm": "self_attn_norm",
                                "post_attention_layernorm": "ffn_norm"}),
    "arcee": ("pre", "none", {"input_layernorm": "self_attn_norm",
                                "post_attention_layernorm": "ffn_norm"}),
    # Granite (IBM 2024): Llama with four multipliers (embedding, residual, attention scale,
    # logits), read below.
    "granite": ("pre", "none", {"input_layernorm": "self_attn_norm",
                                "post_attention_layernorm": "ffn_norm"}),
    "qwen3": ("pre", "head", {"input_layernorm": "self_attn_norm",
                              "post_attention_layernorm": "ffn_norm"}),
    # OLMo 1 (Groeneveld et al. 2024): LayerNorms without parameters (OlmoLayerNorm), read
    # below, and clip_qkv.
    "olmo": ("pre", "none", {"input_layernorm": "self_attn_norm",
                             "post_attention_layernorm": "ffn_norm"}),
    # OLMo 2 normalises each sublayer's output: x + norm(f(x)) (norm.position branch).
    "olmo2": ("branch", "full", {"post_attention_layernorm": "self_attn_norm",
                                 "post_feedforward_layernorm": "ffn_norm"}),
}


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    kind = cfg.model_type
    position, qk_norm, _ = _FAMILY[kind]
    put_decoder_sizes(draft, cfg)
    layers = cfg.int("num_hidden_layers")
    if kind == "qwen2":
        # Qwen2 always has q/k/v biases and no o bias (modeling_qwen2: bias=True / False).
        draft.put("attention.qkv_bias", True)
        draft.put("attention.out_bias", False)
    elif kind == "mistral":  # modeling_mistral: bias=False whatever attention_bias says
        draft.put("attention.bias", False)
    elif kind == "seed_oss":  # q/k/v biases from attention_bias, o's from attention_out_bias
        draft.put("attention.qkv_bias", cfg.bool("attention_bias", True), "attention_bias")
        draft.put("attention.out_bias", cfg.bool("attention_out_bias", False),
                  "attention_out_bias")
        # modeling_seed_oss drops out o_proj's and down_proj's outputs (residual_dropout,
        # default 0.1) and never the embeddings
        draft.put("dropout", cfg.float("residual_dropout", 0.1), "residual_dropout")
        put_embedding_dropout(draft, 0.0, None)
    elif kind == "ministral":  # modeling_ministral: no attention biases
        draft.put("attention.bias", False)
    elif kind == "helium":  # modeling_helium: q/k/v biases from attention_bias, o none
        draft.put("attention.qkv_bias", cfg.bool("attention_bias", False), "attention_bias")
        draft.put("attention.out_bias", False)
        draft.put("embedding.rotary_layout", "interleaved", "model_type")  # GPT-J's pairs
    else:
        draft.put("attention.bias", cfg.bool("attention_bias", False), "attention_bias")
    if qk_norm != "none":
        draft.put("attention.qk_norm", qk_norm, "model_type")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    gated = kind != "arcee"  # Arcee: down(act(up(x))), squared ReLU by default
    act = activation(cfg, "hidden_act", gated=gated, default="silu" if gated else "relu2")
    draft.put("ffn.activation", act, "hidden_act")
    # Only modeling_llama (and Granite's copy) reads mlp_bias; the relatives' MLPs have none.
    mlp_bias = kind in ("llama", "granite", "helium", "seed_oss", "arcee")
    draft.put("ffn.bias", cfg.bool("mlp_bias", False) if mlp_bias else False,
              "mlp_bias" if mlp_bias else None)
    if kind == "olmo":
        put_olmo_norms(draft, cfg)
    else:
        put_rms_rope(draft, cfg, position)
    if kind == "granite":
        put_granite_multipliers(draft, cfg)
    if kind not in ("mistral", "qwen2", "qwen3", "ministral"):
        # modeling_llama, _olmo, _olmo2, _granite, _helium, _seed_oss, _arcee build no
        # sliding-window mask: every layer attends fully whatever these keys say
        cfg.moot("sliding_window", "layer_types")
        return draft
    window = cfg.as_class("sliding_window")  # absent: the class's (Mistral's 4096)
    if kind == "mistral":
        # modeling_mistral slides every layer when sliding_window is set (one mask for all,
        # config.sliding_window); it never reads layer_types
        cfg.moot("layer_types")
        put_windows(draft, None, window, layers)
        return draft
    if kind in ("qwen2", "qwen3") and not cfg.bool("use_sliding_window", False):
        window = None
        cfg.moot("max_window_layers")  # transformers reads it only with a sliding window
    types = cfg.get("layer_types", None)
    if types is not None:  # transformers 5 writes the layers max_window_layers made
        cfg.moot("max_window_layers")
    if kind in ("qwen2", "qwen3") and types is None and window:
        start = cfg.int("max_window_layers", layers)
        types = layer_kinds(layers, lambda i: "sliding_attention" if i >= start
                            else "full_attention")
    put_windows(draft, types, window, layers)
    return draft


def put_olmo_norms(draft: SpecDraft, cfg: HFConfig) -> None:
    """modeling_olmo: every norm is OlmoLayerNorm, F.layer_norm with neither weight nor bias
    and eps fixed at 1e-5; q, k and v clamped to clip_qkv when it is set; rotary positions."""
    draft.put("norm.position", "pre")
    draft.put("norm.kind", "layernorm", "model_type")
    draft.put("norm.affine", False, "model_type")
    draft.put("norm.eps", 1e-5, "model_type")
    draft.put("norm.final", True)
    clip = cfg.get("clip_qkv", None)
    if clip is not None:
        if isinstance(clip, bool) or not isinstance(clip, (int, float)):
            cfg.refuse("clip_qkv", "must be a number")
        draft.put("attention.clip_qkv", float(clip), "clip_qkv")
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where)


def put_granite_multipliers(draft: SpecDraft, cfg: HFConfig) -> None:
    """modeling_granite: token embeddings times embedding_multiplier, each sublayer's output
    times residual_multiplier before its residual add, attention scores times
    attention_multiplier (instead of head_dim ** -0.5), logits divided by logits_scaling."""
    embedding = cfg.float("embedding_multiplier", 1.0)
    if embedding != 1.0:
        draft.put("embedding.multiplier", embedding, "embedding_multiplier")
    residual = cfg.float("residual_multiplier", 1.0)
    if residual != 1.0:
        draft.put("block.residual_scale", residual, "residual_multiplier")
    draft.put("attention.scale", cfg.float("attention_multiplier", 1.0), "attention_multiplier")
    logits = cfg.float("logits_scaling", 1.0)
    if logits != 1.0:
        draft.put("head.scale", 1.0 / logits, "logits_scaling")


def granite_multipliers(spec: Spec) -> dict[str, float]:
    """The four Granite config fields :func:`put_granite_multipliers` reads, for ``spec``."""
    att = spec.attention
    head_dim = att.head_dim or spec.d_model // att.heads
    return {"embedding_multiplier": spec.embedding.multiplier or 1.0,
            "residual_multiplier": spec.block.residual_scale or 1.0,
            "attention_multiplier": att.scale if att.scale is not None else head_dim ** -0.5,
            "logits_scaling": 1.0 / spec.head.scale if spec.head.scale else 1.0}


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads, for ``model_type``. Only Llama's
    modeling reads ``attention_bias`` and ``mlp_bias`` both (Mistral's projections have no
    biases, Qwen3's and OLMo 2's feed-forwards none), and only Mistral, Qwen2 and Qwen3 have
    sliding windows: the others' fields are left out, so a spec needing them does not survive
    the round trip."""
    out = decoder_sizes(spec)
    if model_type == "olmo" and (spec.norm.kind != "layernorm" or spec.norm.affine
                                 or spec.norm.eps != 1e-5):
        return None  # OlmoLayerNorm: no parameters, eps 1e-5
    if model_type != "olmo" and not spec.norm.affine:
        return None
    if model_type in ("llama", "qwen3", "olmo2", "granite", "arcee", "olmo"):
        out["attention_bias"] = spec.attention.bias
    if model_type == "helium":
        out["attention_bias"] = bool(spec.attention.qkv_bias)
    if model_type == "seed_oss":
        out["residual_dropout"] = spec.dropout  # written: SeedOssConfig's default is 0.1
        out["attention_bias"] = bool(spec.attention.qkv_bias)
        out["attention_out_bias"] = bool(spec.attention.out_bias)
    if model_type in ("llama", "granite", "helium", "seed_oss", "arcee"):
        out["mlp_bias"] = spec.ffn.bias

    if model_type == "granite":
        out.update(granite_multipliers(spec))
    out["intermediate_size"] = spec.ffn.hidden
    out["hidden_act"] = plain_activation(spec, "relu2") if model_type == "arcee" \
        else gated_activation(spec)
    if model_type == "olmo":
        out["clip_qkv"] = spec.attention.clip_qkv
    else:
        out["rms_norm_eps"] = spec.norm.eps
    out["rope_parameters"] = rope_config(spec)
    window = spec.attention.window
    if model_type == "ministral":  # MinistralConfig's head_dim has no default of its own
        out["head_dim"] = spec.attention.head_dim or spec.d_model // spec.attention.heads
        out["sliding_window"] = window
        out["layer_types"] = layer_types(spec)
    if model_type == "mistral":
        out["sliding_window"] = window  # MistralConfig's default is 4096: always written
    elif model_type in ("qwen2", "qwen3"):
        out["use_sliding_window"] = window is not None
        out["sliding_window"] = window
        out["layer_types"] = layer_types(spec)
    return out


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    _, qk_norm, norms = _FAMILY[cfg.model_type]
    rows = llama_outer_rows(spec)
    if qk_norm != "none":
        norms = norms | {"self_attn.q_norm": "self_attn.q_norm",
                         "self_attn.k_norm": "self_attn.k_norm"}
    rows += llama_layer_rows(spec, "model.layers", norms, gated=cfg.model_type != "arcee")
    return rows
