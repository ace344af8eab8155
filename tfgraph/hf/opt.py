"""OPT (Zhang et al. 2022): LayerNorm decoder (pre-norm from 1.3B and for 125M; 350M is
post-norm with projections in and out, refused), ReLU, learned positions read from row p + 2 of
a table of max_position_embeddings + 2 rows (fairseq's padding offset; the checkpoint keeps the
two rows, so they count as parameters), a head tied to the token table."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import head_rows, linear_rows, norm_rows, put_sizes
from tfgraph.hf.config import (HFConfig, SpecDraft, activation, put_attention_dropout,
                               put_embedding_dropout)
from tfgraph.hf.export_common import plain_activation
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec

OFFSET = 2  # OPTLearnedPositionalEmbedding.offset


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    d = cfg.int("hidden_size")
    if cfg.int("word_embed_proj_dim", d) != d:
        cfg.refuse("word_embed_proj_dim", f"tfgraph has no projection between a {d}-wide "
                   "model and narrower token embeddings (OPT-350M's project_in/out)")
    if not cfg.bool("layer_norm_elementwise_affine", True):
        cfg.refuse("layer_norm_elementwise_affine", "tfgraph's LayerNorm always has a gain "
                   "and a bias")
    if cfg.bool("_remove_final_layer_norm", False):
        cfg.refuse("_remove_final_layer_norm", "tfgraph's pre-norm models keep the final norm "
                   "when norm.final is true; this option drops it from a pre-norm OPT")
    put_sizes(draft, cfg, "decoder-only", True)
    draft.put("embedding.positions", "learned")
    draft.put("embedding.position_offset", OFFSET, "model_type")
    draft.put("attention.heads", cfg.int("num_attention_heads"), "num_attention_heads")
    bias = cfg.bool("enable_bias", True)
    draft.put("attention.bias", bias, "enable_bias")
    draft.put("ffn.hidden", cfg.int("ffn_dim"), "ffn_dim")
    act = activation(cfg, "activation_function", gated=False, default="relu")
    draft.put("ffn.activation", act, "activation_function")
    draft.put("ffn.bias", bias, "enable_bias")
    pre = cfg.bool("do_layer_norm_before", True)
    draft.put("norm.position", "pre" if pre else "post", "do_layer_norm_before")
    draft.put("norm.final", pre, "do_layer_norm_before")
    draft.put("dropout", cfg.float("dropout", 0.1), "dropout")
    # modeling_opt: dropout on both sublayers' outputs (OPTDecoderLayer), none after the
    # embeddings (OPTDecoder keeps config.dropout and never applies it)
    put_embedding_dropout(draft, 0.0, None)
    # dropout on the attention weights (modeling_opt: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attention_dropout", 0.0)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads (OPT's LayerNorm eps is fixed at
    1e-5, its position offset at 2)."""
    return {
        "hidden_size": spec.d_model, "word_embed_proj_dim": spec.d_model,
        "layer_norm_elementwise_affine": True, "_remove_final_layer_norm": False,
        "num_hidden_layers": spec.layer_count("decoder"), "vocab_size": spec.output_vocab,
        "max_position_embeddings": spec.max_len,
        "tie_word_embeddings": spec.embedding.tie_output,
        "num_attention_heads": spec.attention.heads, "enable_bias": spec.attention.bias,
        "ffn_dim": spec.ffn.hidden, "activation_function": plain_activation(spec, "relu"),
        "do_layer_norm_before": spec.norm.position != "post",
        "dropout": spec.dropout, "attention_dropout": spec.attention.dropout,
        "activation_dropout": 0.0,
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst, bias = "model.decoder.layers.{i}", "decoder.layers.{i}", spec.ffn.bias
    rows = [Rule("model.decoder.embed_tokens.weight", ("embed.tokens.weight",)),
            Rule("model.decoder.embed_positions.weight", ("decoder.positions.weight",))]
    if spec.norm.final:
        rows += norm_rows("model.decoder.final_layer_norm", "decoder.norm", spec)
    rows += head_rows(spec, "lm_head")
    for r, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
        rows += linear_rows(f"{src}.self_attn.{theirs}", f"{dst}.self_attn.{r}", bias)
    rows += linear_rows(f"{src}.fc1", f"{dst}.ffn.up", bias)
    rows += linear_rows(f"{src}.fc2", f"{dst}.ffn.down", bias)
    rows += norm_rows(f"{src}.self_attn_layer_norm", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{src}.final_layer_norm", f"{dst}.ffn_norm", spec)
    return rows
