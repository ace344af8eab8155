"""DistilBERT (Sanh et al. 2019) as DistilBertForMaskedLM: BERT's post-norm encoder without
the segment table, with LayerNorm eps 1e-12 throughout, learned positions, a LayerNorm on the
summed embeddings and the masked-LM head (``vocab_transform``, the activation,
``vocab_layer_norm``, then ``vocab_projector``: the token table, tied, with a bias). Learned
positions only (``sinusoidal_pos_embds`` is refused)."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import linear_rows, norm_rows
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_attention_dropout
from tfgraph.hf.export_common import plain_activation
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec

EPS = 1e-12  # modeling_distilbert: every nn.LayerNorm(dim, eps=1e-12)


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    if cfg.bool("sinusoidal_pos_embds", False):
        cfg.refuse("sinusoidal_pos_embds", "DistilBERT's fixed sinusoid table is not imported "
                   "(learned positions only)")
    d = cfg.int("dim")
    draft.put("arch", "encoder-only")
    draft.put("d_model", d, "dim")
    draft.put("layers", cfg.int("n_layers"), "n_layers")
    draft.put("vocab", cfg.int("vocab_size"), "vocab_size")
    draft.put("max_len", cfg.int("max_position_embeddings"), "max_position_embeddings")
    draft.put("embedding.positions", "learned")
    draft.put("embedding.scale", False)
    draft.put("embedding.tie_output", cfg.bool("tie_word_embeddings", True),
              "tie_word_embeddings")
    draft.put("embedding.output_bias", True)  # vocab_projector's bias
    draft.put("embedding.norm", True)
    draft.put("attention.heads", cfg.int("n_heads"), "n_heads")
    draft.put("ffn.hidden", cfg.int("hidden_dim"), "hidden_dim")
    draft.put("ffn.activation", activation(cfg, "activation", gated=False, default="gelu"),
              "activation")
    draft.put("norm.position", "post")
    draft.put("norm.eps", EPS)
    draft.put("norm.final", False)
    draft.put("head.transform", True)
    draft.put("dropout", cfg.float("dropout", 0.1), "dropout")
    # dropout on the attention weights (modeling_distilbert: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attention_dropout", 0.1)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec with segments or
    another LayerNorm eps (DistilBERT has neither)."""
    if spec.embedding.token_types or spec.norm.eps != EPS:
        return None
    return {
        "dim": spec.d_model, "n_layers": spec.layer_count("encoder"),
        "vocab_size": spec.output_vocab, "max_position_embeddings": spec.max_len,
        "sinusoidal_pos_embds": False, "tie_word_embeddings": spec.embedding.tie_output,
        "n_heads": spec.attention.heads, "hidden_dim": spec.ffn.hidden,
        "activation": plain_activation(spec), "dropout": spec.dropout,
        "attention_dropout": spec.attention.dropout,
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst, e = "distilbert.transformer.layer.{i}", "encoder.layers.{i}", "distilbert.embeddings"
    rows = [Rule(f"{e}.word_embeddings.weight", ("embed.tokens.weight",)),
            Rule(f"{e}.position_embeddings.weight", ("encoder.positions.weight",))]
    rows += norm_rows(f"{e}.LayerNorm", "encoder.embed_norm", spec)
    for r, theirs in (("q", "q_lin"), ("k", "k_lin"), ("v", "v_lin"), ("o", "out_lin")):
        rows += linear_rows(f"{src}.attention.{theirs}", f"{dst}.self_attn.{r}", True)
    rows += norm_rows(f"{src}.sa_layer_norm", f"{dst}.self_attn_norm", spec)
    rows += linear_rows(f"{src}.ffn.lin1", f"{dst}.ffn.up", True)
    rows += linear_rows(f"{src}.ffn.lin2", f"{dst}.ffn.down", True)
    rows += norm_rows(f"{src}.output_layer_norm", f"{dst}.ffn_norm", spec)
    rows += linear_rows("vocab_transform", "head.transform", True)
    rows += norm_rows("vocab_layer_norm", "head.transform_norm", spec)
    table = "embed.tokens.weight" if spec.embedding.tie_output else "head.weight"
    rows.append(Rule("vocab_projector.weight", (table,),
                     "alias" if spec.embedding.tie_output else "copy"))
    rows.append(Rule("vocab_projector.bias", ("head.bias",)))
    return rows
