"""BLOOM (BigScience 2022): no position embedding but ALiBi (Press et al. 2022: a per-head
linear bias on the scores, ``embedding.positions: alibi``), a LayerNorm on the token
embeddings, pre-LayerNorm layers with biases everywhere, a 4 x d_model feed-forward with the
tanh GELU, a final norm and the head tied to the token table. ``query_key_value`` is fused per
head (each head's q rows, then k, then v), as GPT-NeoX's."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import head_rows, linear_rows, norm_rows
from tfgraph.hf.config import HFConfig, SpecDraft, put_attention_dropout, put_embedding_dropout
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    if cfg.bool("apply_residual_connection_post_layernorm", False):
        cfg.refuse("apply_residual_connection_post_layernorm", "a residual taken after the "
                   "layer norm has no spec form")
    # modeling_bloom's slow_but_exact path (pretraining_tp > 1) sums the slices of the
    # attention output projection (dense) and of dense_4h_to_h with F.linear and no bias: the
    # checkpoint's two biases are dropped, which tfgraph's spec cannot say per projection
    if cfg.bool("slow_but_exact", False) and cfg.int("pretraining_tp", 1) > 1:
        cfg.refuse("slow_but_exact", "with pretraining_tp > 1 transformers' BLOOM skips the "
                   "biases of dense and dense_4h_to_h, which tfgraph cannot express")
    cfg.moot("slow_but_exact", "pretraining_tp")  # else: the plain projections
    width = "n_embed" if "n_embed" in cfg and "hidden_size" not in cfg else "hidden_size"
    d = cfg.int(width)
    draft.put("arch", "decoder-only")
    draft.put("d_model", d, width)
    draft.put("layers", cfg.int("n_layer"), "n_layer")
    draft.put("vocab", cfg.int("vocab_size"), "vocab_size")
    draft.put("embedding.positions", "alibi", "model_type")
    draft.put("embedding.scale", False)
    draft.put("embedding.norm", True, "model_type")  # word_embeddings_layernorm
    draft.put("embedding.tie_output", cfg.bool("tie_word_embeddings", True),
              "tie_word_embeddings")
    draft.put("attention.heads", cfg.int("n_head"), "n_head")
    draft.put("attention.bias", True)
    draft.put("ffn.hidden", 4 * d, width)  # BloomMLP: dense_h_to_4h
    draft.put("ffn.activation", "gelu_tanh", "model_type")  # BloomGelu: the tanh form
    draft.put("ffn.bias", True)
    draft.put("norm.kind", "layernorm")
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_epsilon", 1e-5), "layer_norm_epsilon")
    draft.put("norm.final", True)
    draft.put("dropout", cfg.float("hidden_dropout", 0.0), "hidden_dropout")
    # modeling_bloom: hidden_dropout on both sublayers' outputs (dropout_add), none after the
    # embeddings
    put_embedding_dropout(draft, 0.0, None)
    # dropout on the attention weights (modeling_bloom: BloomAttention drops attention_probs)
    put_attention_dropout(draft, cfg, "attention_dropout", 0.0)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec without ALiBi."""
    emb = spec.embedding
    if emb.positions != "alibi" or emb.alibi_scaled or emb.alibi_bfloat16:  # Falcon-RW's
        return None
    return {
        "hidden_size": spec.d_model, "n_layer": spec.layer_count("decoder"),
        "n_head": spec.attention.heads, "vocab_size": spec.output_vocab,
        "layer_norm_epsilon": spec.norm.eps, "tie_word_embeddings": spec.embedding.tie_output,
        "apply_residual_connection_post_layernorm": False, "hidden_dropout": spec.dropout,
        "attention_dropout": spec.attention.dropout,
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    """save_pretrained's names of BloomForCausalLM (``transformer.`` in front)."""
    src, dst = "transformer.h.{i}", "decoder.layers.{i}"
    rows = [Rule("transformer.word_embeddings.weight", ("embed.tokens.weight",))]
    rows += norm_rows("transformer.word_embeddings_layernorm", "decoder.embed_norm", spec)
    rows += norm_rows("transformer.ln_f", "decoder.norm", spec)
    rows += head_rows(spec, "lm_head", "embed.tokens.weight")
    for kind in ("weight", "bias"):
        rows.append(Rule(f"{src}.self_attention.query_key_value.{kind}",
                         tuple(f"{dst}.self_attn.{r}.{kind}" for r in "qkv"), "heads",
                         (spec.attention.heads,)))
    rows += linear_rows(f"{src}.self_attention.dense", f"{dst}.self_attn.o", True)
    rows += linear_rows(f"{src}.mlp.dense_h_to_4h", f"{dst}.ffn.up", True)
    rows += linear_rows(f"{src}.mlp.dense_4h_to_h", f"{dst}.ffn.down", True)
    rows += norm_rows(f"{src}.input_layernorm", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{src}.post_attention_layernorm", f"{dst}.ffn_norm", spec)
    return rows
