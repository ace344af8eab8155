"""GPT-BigCode (SantaCoder, StarCoder; Allal et al. 2023, Li et al. 2023): GPT-2's decoder
(learned positions, pre-LayerNorm, tanh GELU, tied head) with multi-query attention: one key
and value head shared by every query head (``multi_query``, the default). Its projections are
``nn.Linear`` ([out, in], unlike GPT-2's Conv1D); ``c_attn`` stacks q (d_model rows), k and v
(head_dim rows each) with multi-query, else per head [q, k, v] as GPT-NeoX."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import head_rows, linear_rows, norm_rows, put_sizes
from tfgraph.hf.config import (HFConfig, SpecDraft, activation, put_attention_dropout,
                               put_embedding_dropout)
from tfgraph.hf.export_common import plain_activation
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    d = put_sizes(draft, cfg, "decoder-only", True,
                  ("n_embd", "n_layer", "vocab_size", "n_positions"))
    draft.put("embedding.positions", "learned")
    heads = cfg.int("n_head")
    draft.put("attention.heads", heads, "n_head")
    multi_query = cfg.bool("multi_query", True)
    draft.put("attention.kv_heads", 1 if multi_query else heads, "multi_query")
    cfg.moot("num_key_value_heads")  # GPTBigCodeConfig derives it from multi_query
    # float32 softmax (and its scaling) is how the scores are computed, not what they are
    cfg.moot("attention_softmax_in_fp32", "scale_attention_softmax_in_fp32")
    if not cfg.bool("scale_attn_weights", True):
        draft.put("attention.scale", 1.0, "scale_attn_weights")
    if cfg.bool("add_cross_attention", False):
        cfg.refuse("add_cross_attention", "a decoder-only model with cross-attention has no "
                   "encoder in tfgraph's spec")
    draft.put("attention.bias", True)
    draft.put("ffn.hidden", cfg.int("n_inner", 4 * d), "n_inner")
    draft.put("ffn.activation",
              activation(cfg, "activation_function", gated=False, default="gelu_pytorch_tanh"),
              "activation_function")
    draft.put("ffn.bias", True)
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_epsilon", 1e-5), "layer_norm_epsilon")
    draft.put("norm.final", True)
    draft.put("dropout", cfg.float("resid_pdrop", 0.1), "resid_pdrop")
    # GPTBigCodeModel.drop, after the token and position embeddings
    put_embedding_dropout(draft, cfg.float("embd_pdrop", 0.1), "embd_pdrop")
    # dropout on the attention weights (modeling_gpt_bigcode: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attn_pdrop", 0.1)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None unless the spec has one key and
    value head (multi-query) or as many as query heads."""
    att = spec.attention
    if att.kv_heads not in (1, att.heads) or spec.embedding.positions != "learned":
        return None
    return {
        "n_embd": spec.d_model, "n_layer": spec.layer_count("decoder"),
        "vocab_size": spec.output_vocab, "n_positions": spec.max_len, "n_head": att.heads,
        "multi_query": att.kv_heads == 1 and att.heads > 1,
        "scale_attn_weights": att.scale != 1.0, "add_cross_attention": False,
        "n_inner": spec.ffn.hidden, "activation_function": plain_activation(spec),
        "layer_norm_epsilon": spec.norm.eps, "tie_word_embeddings": spec.embedding.tie_output,
        "resid_pdrop": spec.dropout, "embd_pdrop": spec.embedding_dropout,
        "attn_pdrop": spec.attention.dropout,
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    att, t, dst = spec.attention, "transformer", "decoder.layers.{i}"
    head_dim = spec.d_model // att.heads
    rows = [Rule(f"{t}.wte.weight", ("embed.tokens.weight",)),
            Rule(f"{t}.wpe.weight", ("decoder.positions.weight",))]
    rows += norm_rows(f"{t}.ln_f", "decoder.norm", spec)
    rows += head_rows(spec, "lm_head", "embed.tokens.weight")
    qkv = tuple(f"{dst}.self_attn.{r}" for r in "qkv")
    for kind in ("weight", "bias"):
        if att.kv_heads == 1 and att.heads > 1:  # [q | k | v] stacked
            rows.append(Rule(f"{t}.h.{{i}}.attn.c_attn.{kind}", tuple(f"{o}.{kind}" for o in qkv),
                             "split", (spec.d_model, head_dim, head_dim)))
        else:  # per head [q, k, v]
            rows.append(Rule(f"{t}.h.{{i}}.attn.c_attn.{kind}", tuple(f"{o}.{kind}" for o in qkv),
                             "heads", (att.heads,)))
    rows += linear_rows(f"{t}.h.{{i}}.attn.c_proj", f"{dst}.self_attn.o", True)
    rows += linear_rows(f"{t}.h.{{i}}.mlp.c_fc", f"{dst}.ffn.up", True)
    rows += linear_rows(f"{t}.h.{{i}}.mlp.c_proj", f"{dst}.ffn.down", True)
    rows += norm_rows(f"{t}.h.{{i}}.ln_1", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{t}.h.{{i}}.ln_2", f"{dst}.ffn_norm", spec)
    return rows
