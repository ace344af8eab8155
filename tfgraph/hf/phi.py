"""Phi-1.5 and Phi-2 (Li et al. 2023; Microsoft 2023): parallel residual with one shared
LayerNorm, rotary positions on a fraction of each head (``partial_rotary_factor``: 0.5 for
Phi-1.5, 0.4 for Phi-2), biases everywhere, an untied head with a bias."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import linear_rows, norm_rows, put_sizes
from tfgraph.hf.config import (HFConfig, SpecDraft, activation, put_attention_dropout,
                               put_embedding_dropout, put_rope, rope_parameters)
from tfgraph.hf.export_common import plain_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    d, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    if cfg.bool("qk_layernorm", False):
        cfg.refuse("qk_layernorm", "Phi's LayerNorm on q and k is not imported (tfgraph's "
                   "attention.qk_norm is checked against Qwen3, Gemma 3 and OLMo 2 only)")
    put_sizes(draft, cfg, "decoder-only", False)
    draft.put("embedding.output_bias", True)  # PhiForCausalLM: lm_head has a bias
    draft.put("attention.heads", heads, "num_attention_heads")
    draft.put("attention.kv_heads", cfg.int("num_key_value_heads", heads), "num_key_value_heads")
    draft.put("attention.bias", True)
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    act = activation(cfg, "hidden_act", gated=False, default="gelu_new")
    draft.put("ffn.activation", act, "hidden_act")
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_eps", 1e-5), "layer_norm_eps")
    draft.put("norm.final", True)
    draft.put("block.residual", "parallel")
    draft.put("block.shared_norm", True)
    draft.put("dropout", cfg.float("resid_pdrop", 0.0), "resid_pdrop")
    # PhiModel.embed_dropout (Phi-2: embd_pdrop 0.0 beside resid_pdrop 0.1)
    put_embedding_dropout(draft, cfg.float("embd_pdrop", 0.0), "embd_pdrop")
    # dropout on the attention weights (modeling_phi: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attention_dropout", 0.0)
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where, partial=True)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads, the rotary share always written
    (PhiConfig's default is 0.5)."""
    att = spec.attention
    return {
        "hidden_size": spec.d_model, "num_hidden_layers": spec.layer_count("decoder"),
        "vocab_size": spec.output_vocab, "max_position_embeddings": spec.max_len,
        "tie_word_embeddings": spec.embedding.tie_output, "qk_layernorm": False,
        "num_attention_heads": att.heads, "num_key_value_heads": att.kv_heads,
        "intermediate_size": spec.ffn.hidden, "hidden_act": plain_activation(spec),
        "layer_norm_eps": spec.norm.eps, "resid_pdrop": spec.dropout,
        "embd_pdrop": spec.embedding_dropout, "attention_dropout": spec.attention.dropout,
        "rope_parameters": rope_config(spec, partial=True),
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst = "model.layers.{i}", "decoder.layers.{i}"
    rows = [Rule("model.embed_tokens.weight", ("embed.tokens.weight",))]
    rows += norm_rows("model.final_layernorm", "decoder.norm", spec)
    if spec.embedding.tie_output:
        rows.append(Rule("lm_head.weight", ("embed.tokens.weight",), "alias"))
    else:
        rows.append(Rule("lm_head.weight", ("head.weight",)))
    rows.append(Rule("lm_head.bias", ("head.bias",)))
    for r, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "dense")):
        rows += linear_rows(f"{src}.self_attn.{theirs}", f"{dst}.self_attn.{r}", True)
    rows += linear_rows(f"{src}.mlp.fc1", f"{dst}.ffn.up", True)
    rows += linear_rows(f"{src}.mlp.fc2", f"{dst}.ffn.down", True)
    rows += norm_rows(f"{src}.input_layernorm", f"{dst}.norm", spec)
    return rows
