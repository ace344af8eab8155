"""Phi-3 (Abdin et al. 2024): a Llama-style RMSNorm SwiGLU decoder whose q, k, v projections
are one fused ``qkv_proj`` (rows: q, then k, then v) and whose gate and up projections are one
``gate_up_proj`` (rows: gate, then up). Phi-3-mini-4k attends through a 2047-token sliding
window; the 128k variants' ``longrope`` scaling is refused (tfgraph has no longrope)."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import (linear_rows, llama_outer_rows, norm_rows, put_decoder_sizes,
                               put_windows)
from tfgraph.hf.config import (HFConfig, SpecDraft, activation, put_embedding_dropout, put_rope,
                               rope_parameters)
from tfgraph.hf.export_common import decoder_sizes, gated_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    put_decoder_sizes(draft, cfg)
    if cfg.bool("attention_bias", False):  # modeling_phi3 builds qkv_proj and o_proj biasless
        cfg.refuse("attention_bias", "Phi3ForCausalLM has no attention biases to load")
    draft.put("attention.bias", False)
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    act = activation(cfg, "hidden_act", gated=True, default="silu")
    draft.put("ffn.activation", act, "hidden_act")
    draft.put("ffn.bias", False)
    draft.put("norm.position", "pre")
    draft.put("norm.kind", "rmsnorm")
    draft.put("norm.eps", cfg.float("rms_norm_eps"), "rms_norm_eps")
    draft.put("norm.final", True)
    draft.put("dropout", cfg.float("resid_pdrop", 0.0), "resid_pdrop")
    # modeling_phi3 drops out both sublayers' outputs (resid_attn_dropout, resid_mlp_dropout)
    # and never the embeddings: embd_pdrop is read nowhere
    cfg.moot("embd_pdrop")
    put_embedding_dropout(draft, 0.0, None)
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where, partial=True)
    # modeling_phi3: every layer uses the sliding-window mask when sliding_window is set
    put_windows(draft, None, cfg.get("sliding_window", None), cfg.int("num_hidden_layers"))
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads. Phi-3's rotary embedding takes no
    linear / llama3 / yarn scaling (only its own longrope), so none is written. Its default
    pad_token_id 32000 is the padding row of the token table: dropped when the vocabulary
    has no such row."""
    out = decoder_sizes(spec)
    out["attention_bias"] = False
    out["intermediate_size"] = spec.ffn.hidden
    out["hidden_act"] = gated_activation(spec)
    out["rms_norm_eps"] = spec.norm.eps
    out["resid_pdrop"] = spec.dropout
    out["embd_pdrop"] = spec.embedding_dropout  # read nowhere; 0 after a round trip
    out["rope_parameters"] = rope_config(spec, partial=True, scaling=False)
    out["sliding_window"] = spec.attention.window
    if spec.output_vocab <= 32000:
        out["pad_token_id"] = None
    return out


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst, att = "model.layers.{i}", "decoder.layers.{i}", spec.attention
    assert att.head_dim is not None and att.kv_heads is not None and spec.ffn.hidden
    q, kv = att.heads * att.head_dim, att.kv_heads * att.head_dim
    rows = llama_outer_rows(spec)
    rows.append(Rule(f"{src}.self_attn.qkv_proj.weight",
                     tuple(f"{dst}.self_attn.{r}.weight" for r in "qkv"), "split", (q, kv, kv)))
    rows += linear_rows(f"{src}.self_attn.o_proj", f"{dst}.self_attn.o", False)
    rows.append(Rule(f"{src}.mlp.gate_up_proj.weight",
                     (f"{dst}.ffn.gate.weight", f"{dst}.ffn.up.weight"), "split",
                     (spec.ffn.hidden, spec.ffn.hidden)))
    rows += linear_rows(f"{src}.mlp.down_proj", f"{dst}.ffn.down", False)
    rows += norm_rows(f"{src}.input_layernorm", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{src}.post_attention_layernorm", f"{dst}.ffn_norm", spec)
    return rows
