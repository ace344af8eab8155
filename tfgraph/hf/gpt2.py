"""GPT-2 (Radford et al. 2019): pre-norm LayerNorm decoder, learned positions, tied head.

Its linear layers are ``Conv1D`` modules that store weights as [in, out], the transpose of
tfgraph's [out, in]; ``c_attn`` holds q, k and v side by side in its output columns.
"""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import head_rows, norm_rows, put_sizes
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
    draft.put("attention.heads", cfg.int("n_head"), "n_head")
    if not cfg.bool("scale_attn_weights", True):
        draft.put("attention.scale", 1.0, "scale_attn_weights")
    if cfg.bool("scale_attn_by_inverse_layer_idx", False):
        cfg.refuse("scale_attn_by_inverse_layer_idx", "tfgraph has no per-layer attention "
                   "scale (1/(layer+1), Mistral's GPT-2 training trick)")
    if cfg.bool("add_cross_attention", False):
        cfg.refuse("add_cross_attention", "a decoder-only GPT-2 with cross-attention has no "
                   "encoder in tfgraph's spec")
    draft.put("ffn.hidden", cfg.int("n_inner", 4 * d), "n_inner")
    act = activation(cfg, "activation_function", gated=False, default="gelu_new")
    draft.put("ffn.activation", act, "activation_function")
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_epsilon", 1e-5), "layer_norm_epsilon")
    draft.put("norm.final", True)
    draft.put("dropout", cfg.float("resid_pdrop", 0.1), "resid_pdrop")
    # GPT2Model.drop, after the token and position embeddings
    put_embedding_dropout(draft, cfg.float("embd_pdrop", 0.1), "embd_pdrop")
    # dropout on the attention weights (modeling_gpt2: GPT2Attention.attn_dropout)
    put_attention_dropout(draft, cfg, "attn_pdrop", 0.1)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads. GPT-2's dropouts: resid_pdrop the
    spec's after each sublayer, embd_pdrop after the embeddings (embedding.dropout, default the
    same), attn_pdrop attention.dropout, on the attention weights."""
    out: dict[str, Any] = {
        "n_embd": spec.d_model, "n_layer": spec.layer_count("decoder"),
        "vocab_size": spec.output_vocab, "n_positions": spec.max_len,
        "n_head": spec.attention.heads,
        # scores scaled by 1/sqrt(head_dim), or (False) not at all: attention.scale 1
        "scale_attn_weights": spec.attention.scale != 1.0,
        "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
        "n_inner": spec.ffn.hidden, "activation_function": plain_activation(spec),
        "layer_norm_epsilon": spec.norm.eps, "tie_word_embeddings": spec.embedding.tie_output,
        "resid_pdrop": spec.dropout, "embd_pdrop": spec.embedding_dropout,
        "attn_pdrop": spec.attention.dropout,
    }
    return out


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    d, t, dst = spec.d_model, "transformer", "decoder.layers.{i}"
    rows = [Rule(f"{t}.wte.weight", ("embed.tokens.weight",)),
            Rule(f"{t}.wpe.weight", ("decoder.positions.weight",))]
    rows += norm_rows(f"{t}.ln_f", "decoder.norm", spec)
    rows += head_rows(spec, "lm_head")
    qkv = tuple(f"{dst}.self_attn.{r}" for r in "qkv")
    rows += [
        Rule(f"{t}.h.{{i}}.attn.c_attn.weight", tuple(f"{o}.weight" for o in qkv), "split_t",
             (d, d, d)),
        Rule(f"{t}.h.{{i}}.attn.c_attn.bias", tuple(f"{o}.bias" for o in qkv), "split",
             (d, d, d)),
    ]
    for conv, ours in (("attn.c_proj", "self_attn.o"), ("mlp.c_fc", "ffn.up"),
                       ("mlp.c_proj", "ffn.down")):
        rows.append(Rule(f"{t}.h.{{i}}.{conv}.weight", (f"{dst}.{ours}.weight",), "transpose"))
        rows.append(Rule(f"{t}.h.{{i}}.{conv}.bias", (f"{dst}.{ours}.bias",)))
    rows += norm_rows(f"{t}.h.{{i}}.ln_1", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{t}.h.{{i}}.ln_2", f"{dst}.ffn_norm", spec)
    return rows
