"""GPT-J (Wang & Komatsuzaki 2021): parallel residual with one shared LayerNorm per layer,
rotary positions on the first ``rotary_dim`` channels of each head in the interleaved layout
(pairs 2i, 2i + 1: ``rotate_every_two``), no attention biases, an untied head with a bias."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import linear_rows, norm_rows, put_sizes
from tfgraph.hf.config import (HFConfig, SpecDraft, activation, put_attention_dropout,
                               put_embedding_dropout)
from tfgraph.hf.export_common import plain_activation
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    heads = cfg.int("n_head")
    d = put_sizes(draft, cfg, "decoder-only", False,
                  ("n_embd", "n_layer", "vocab_size", "n_positions"))
    draft.put("embedding.positions", "rope")
    draft.put("embedding.output_bias", True)  # lm_head has a bias (modeling_gptj)
    draft.put("embedding.rotary_layout", "interleaved", "model_type")
    rotary_dim = cfg.int("rotary_dim", d // heads)
    if rotary_dim != d // heads:
        draft.put("embedding.rotary_fraction", rotary_dim / (d // heads), "rotary_dim")
    draft.put("attention.heads", heads, "n_head")
    draft.put("attention.bias", False)
    draft.put("ffn.hidden", cfg.int("n_inner", 4 * d), "n_inner")
    act = activation(cfg, "activation_function", gated=False, default="gelu_new")
    draft.put("ffn.activation", act, "activation_function")
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_epsilon", 1e-5), "layer_norm_epsilon")
    draft.put("norm.final", True)
    draft.put("block.residual", "parallel")
    draft.put("block.shared_norm", True)
    draft.put("dropout", cfg.float("resid_pdrop", 0.0), "resid_pdrop")
    # GPTJModel.drop, after the token embeddings
    put_embedding_dropout(draft, cfg.float("embd_pdrop", 0.0), "embd_pdrop")
    # dropout on the attention weights (modeling_gptj: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attn_pdrop", 0.0)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads; GPT-J's rotary base is fixed at
    10000 and its pairs interleaved, so only ``rotary_dim`` is written."""
    return {
        "n_embd": spec.d_model, "n_layer": spec.layer_count("decoder"),
        "vocab_size": spec.output_vocab, "n_positions": spec.max_len,
        "tie_word_embeddings": spec.embedding.tie_output, "rotary_dim": spec.rotary_dim,
        "n_head": spec.attention.heads, "n_inner": spec.ffn.hidden,
        "activation_function": plain_activation(spec), "layer_norm_epsilon": spec.norm.eps,
        "resid_pdrop": spec.dropout, "embd_pdrop": spec.embedding_dropout,
        "attn_pdrop": spec.attention.dropout,
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst = "transformer.h.{i}", "decoder.layers.{i}"
    rows = [Rule("transformer.wte.weight", ("embed.tokens.weight",))]
    rows += norm_rows("transformer.ln_f", "decoder.norm", spec)
    if spec.embedding.tie_output:
        rows.append(Rule("lm_head.weight", ("embed.tokens.weight",), "alias"))
    else:
        rows.append(Rule("lm_head.weight", ("head.weight",)))
    rows.append(Rule("lm_head.bias", ("head.bias",)))
    for r, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
        rows += linear_rows(f"{src}.attn.{theirs}", f"{dst}.self_attn.{r}", False)
    rows += linear_rows(f"{src}.mlp.fc_in", f"{dst}.ffn.up", spec.ffn.bias)
    rows += linear_rows(f"{src}.mlp.fc_out", f"{dst}.ffn.down", spec.ffn.bias)
    rows += norm_rows(f"{src}.ln_1", f"{dst}.norm", spec)
    return rows
