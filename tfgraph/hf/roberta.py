"""RoBERTa (Liu et al. 2019) and XLM-RoBERTa (Conneau et al. 2020) as RobertaForMaskedLM /
XLMRobertaForMaskedLM: BERT's post-norm encoder (segment table, embedding LayerNorm, no pooler
in the masked-LM model) whose learned positions are counted over the non-padding input ids
from row padding_idx + 1 (modeling_roberta's create_position_ids_from_input_ids, fairseq's
make_positions): ``embedding.position_pad_id`` with ``embedding.position_offset``
padding_idx + 1, so the table's max_position_embeddings rows (514) hold max_len 512 positions.
The masked-LM head (RobertaLMHead: dense, GELU, layer_norm, then the token table, tied, with
``lm_head.bias``) is ``head.transform``; its activation is always the exact GELU, so another
hidden_act is refused (tfgraph's head transform shares the feed-forward's activation)."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.bert import encoder_rows, refuse_non_encoder
from tfgraph.hf.common import linear_rows, norm_rows, put_sizes
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_attention_dropout
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec

READS_PAD = True
"""config_from_spec writes pad_token_id itself: the positions read it (export_config keeps
it instead of the spec's tokens.pad, which it equals when set)."""


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    refuse_non_encoder(cfg, "RoBERTa", "RobertaForMaskedLM")
    put_sizes(draft, cfg, "encoder-only", True)
    if not cfg.bool("tie_word_embeddings", True):
        # untied, transformers keeps lm_head.bias apart from lm_head.decoder.bias and reads
        # only the latter: a parameter the computation never uses, which a spec cannot hold
        cfg.refuse("tie_word_embeddings", "an untied RobertaLMHead has an unused lm_head.bias "
                   "besides decoder.bias; only the tied head is imported")
    pad = cfg.get("pad_token_id", 1)
    if not isinstance(pad, int) or isinstance(pad, bool) or pad < 0:
        cfg.refuse("pad_token_id", "RoBERTa counts positions from padding_idx + 1: needs the "
                   "padding id (an int >= 0)")
    rows = cfg.int("max_position_embeddings")
    if rows <= pad + 1:
        cfg.refuse("max_position_embeddings", f"RoBERTa's first position reads row "
                   f"pad_token_id + 1 = {pad + 1}: the table needs more rows")
    # positions p = 0.. read rows pad + 1 + p; the pad row itself is read by padding tokens
    draft.put("max_len", rows - (pad + 1), "max_position_embeddings")
    draft.put("embedding.positions", "learned")
    draft.put("embedding.position_offset", pad + 1, "pad_token_id")
    draft.put("embedding.position_pad_id", pad, "pad_token_id")
    draft.put("embedding.output_bias", True)  # RobertaLMHead.bias
    types = cfg.int("type_vocab_size", 2)
    if types:
        draft.put("embedding.token_types", types, "type_vocab_size")
    draft.put("embedding.norm", True)
    draft.put("attention.heads", cfg.int("num_attention_heads"), "num_attention_heads")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    act = activation(cfg, "hidden_act", gated=False, default="gelu")
    if act != "gelu":  # RobertaLMHead calls gelu() whatever hidden_act says
        cfg.refuse("hidden_act", "RoBERTa's masked-LM head applies the exact GELU and "
                   "tfgraph's head transform shares the feed-forward's activation: only gelu")
    draft.put("ffn.activation", act, "hidden_act")
    draft.put("norm.position", "post")
    draft.put("norm.eps", cfg.float("layer_norm_eps", 1e-12), "layer_norm_eps")
    draft.put("norm.final", False)
    draft.put("head.transform", True)
    draft.put("dropout", cfg.float("hidden_dropout_prob", 0.1), "hidden_dropout_prob")
    # dropout on the attention weights (modeling_roberta: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attention_probs_dropout_prob", 0.1)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None without RoBERTa's positions
    (a padding id counted over, read from row padding id + 1), without segments (RoBERTa
    always adds a segment row) or with a token padding id other than that one (RoBERTa has
    one pad_token_id for both)."""
    emb = spec.embedding
    pad = emb.position_pad_id
    if pad is None or emb.position_offset != pad + 1 or spec.max_len is None:
        return None
    if not emb.token_types:  # RobertaEmbeddings always adds a segment row
        return None
    if spec.tokens is not None and spec.tokens.pad not in (None, pad):
        return None
    out: dict[str, Any] = {
        "hidden_size": spec.d_model, "num_hidden_layers": spec.layer_count("encoder"),
        "vocab_size": spec.output_vocab, "max_position_embeddings": spec.max_len + pad + 1,
        "pad_token_id": pad, "position_embedding_type": "absolute", "is_decoder": False,
        "add_cross_attention": False, "tie_word_embeddings": emb.tie_output,
        "num_attention_heads": spec.attention.heads, "intermediate_size": spec.ffn.hidden,
        "hidden_act": "gelu",  # another ffn.activation comes back different: rejected
        "layer_norm_eps": spec.norm.eps, "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": spec.attention.dropout,
        "type_vocab_size": emb.token_types,
    }
    return out


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    rows = encoder_rows(spec, "roberta")
    rows += linear_rows("lm_head.dense", "head.transform", True)
    rows += norm_rows("lm_head.layer_norm", "head.transform_norm", spec)
    table = "embed.tokens.weight" if spec.embedding.tie_output else "head.weight"
    rows.append(Rule("lm_head.decoder.weight", (table,),
                     "alias" if spec.embedding.tie_output else "copy"))
    # RobertaLMHead.bias is also registered as decoder.bias (the same tensor)
    rows += [Rule("lm_head.bias", ("head.bias",)),
             Rule("lm_head.decoder.bias", ("head.bias",), "alias")]
    return rows
