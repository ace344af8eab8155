"""GLM-4 (Team GLM 2024): ``glm`` (GLM-4-9B) and ``glm4`` (GLM-4-0414). A Llama-style RMSNorm
decoder with grouped-query attention, q/k/v biases and no o bias (``attention_bias``), rotary
positions on half of each head (``partial_rotary_factor``) over interleaved channel pairs,
and one fused ``gate_up_proj`` (rows: gate, then up). ``glm4`` adds a norm after each sublayer
(``norm.position: sandwich``: ``post_self_attn_layernorm``, ``post_mlp_layernorm``)."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import (linear_rows, llama_outer_rows, norm_rows, put_decoder_sizes,
                               put_rms_rope)
from tfgraph.hf.config import HFConfig, SpecDraft, activation
from tfgraph.hf.export_common import gated_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec

_NORMS = {"input_layernorm": "self_attn_norm", "post_attention_layernorm": "ffn_norm"}
_SANDWICH = {"input_layernorm": "self_attn_norm", "post_self_attn_layernorm": "self_attn_out_norm",
             "post_attention_layernorm": "ffn_norm", "post_mlp_layernorm": "ffn_out_norm"}


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    put_decoder_sizes(draft, cfg)
    bias = cfg.bool("attention_bias", True)
    draft.put("attention.qkv_bias", bias, "attention_bias")
    draft.put("attention.out_bias", False)  # modeling_glm: o_proj has no bias
    draft.put("embedding.rotary_layout", "interleaved", "model_type")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    draft.put("ffn.activation", activation(cfg, "hidden_act", gated=True, default="silu"),
              "hidden_act")
    draft.put("ffn.bias", False)
    put_rms_rope(draft, cfg, "sandwich" if cfg.model_type == "glm4" else "pre", partial=True)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec GLM cannot hold."""
    att = spec.attention
    position = "sandwich" if model_type == "glm4" else "pre"
    if spec.norm.position != position or spec.embedding.rotary_layout != "interleaved" \
            or att.out_bias or spec.ffn.bias:
        return None
    out = {
        "hidden_size": spec.d_model, "num_hidden_layers": spec.layer_count("decoder"),
        "vocab_size": spec.output_vocab, "max_position_embeddings": spec.max_len,
        "tie_word_embeddings": spec.embedding.tie_output,
        "num_attention_heads": att.heads, "num_key_value_heads": att.kv_heads,
        "attention_dropout": att.dropout,
        "head_dim": att.head_dim or spec.d_model // att.heads,
        "attention_bias": bool(att.qkv_bias), "intermediate_size": spec.ffn.hidden,
        "hidden_act": gated_activation(spec), "rms_norm_eps": spec.norm.eps,
        "rope_parameters": rope_config(spec, partial=True),
    }
    return out


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst = "model.layers.{i}", "decoder.layers.{i}"
    att = spec.attention
    rows = llama_outer_rows(spec)
    for r in "qkv":
        rows += linear_rows(f"{src}.self_attn.{r}_proj", f"{dst}.self_attn.{r}",
                            bool(att.qkv_bias))
    rows += linear_rows(f"{src}.self_attn.o_proj", f"{dst}.self_attn.o", False)
    hidden = int(spec.ffn.hidden or 0)  # resolved by the spec
    rows.append(Rule(f"{src}.mlp.gate_up_proj.weight",
                     (f"{dst}.ffn.gate.weight", f"{dst}.ffn.up.weight"), "split",
                     (hidden, hidden)))
    rows += linear_rows(f"{src}.mlp.down_proj", f"{dst}.ffn.down", False)
    norms = _SANDWICH if cfg.model_type == "glm4" else _NORMS
    for theirs, ours in norms.items():
        rows += norm_rows(f"{src}.{theirs}", f"{dst}.{ours}", spec)
    return rows
