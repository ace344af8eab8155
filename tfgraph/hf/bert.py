"""BERT (Devlin et al. 2019) as BertForMaskedLM: a post-norm LayerNorm encoder with learned
positions, a two-row segment table (``embedding.token_types``), a LayerNorm on the summed
embeddings (``embedding.norm``) and the masked-LM head: dense + activation + LayerNorm
(``head.transform``), then the token table (tied) with a bias."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import linear_rows, norm_rows, put_sizes
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_attention_dropout
from tfgraph.hf.export_common import plain_activation
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def refuse_non_encoder(cfg: HFConfig, family: str, model: str) -> None:
    """BERT's and RoBERTa's configs can also describe relative positions or a decoder with
    cross-attention; tfgraph imports the absolute-position masked-LM encoder only."""
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        cfg.refuse("position_embedding_type", f"tfgraph's {family} positions are the absolute "
                   "learned table")
    if cfg.bool("is_decoder", False) or cfg.bool("add_cross_attention", False):
        cfg.refuse("is_decoder", f"only the {family} encoder ({model}) is imported")


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    refuse_non_encoder(cfg, "BERT", "BertForMaskedLM")
    put_sizes(draft, cfg, "encoder-only", True)
    if not cfg.bool("tie_word_embeddings", True):
        # untied, transformers keeps cls.predictions.bias apart from decoder.bias and reads
        # only the latter: a parameter the computation never uses, which a spec cannot hold
        cfg.refuse("tie_word_embeddings", "an untied BertLMPredictionHead has an unused "
                   "cls.predictions.bias besides decoder.bias; only the tied head is imported")
    draft.put("embedding.positions", "learned")
    draft.put("embedding.output_bias", True)  # BertLMPredictionHead.bias
    types = cfg.int("type_vocab_size", 2)
    if types:
        draft.put("embedding.token_types", types, "type_vocab_size")
    draft.put("embedding.norm", True)
    draft.put("attention.heads", cfg.int("num_attention_heads"), "num_attention_heads")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    act = activation(cfg, "hidden_act", gated=False, default="gelu")
    draft.put("ffn.activation", act, "hidden_act")
    draft.put("norm.position", "post")
    draft.put("norm.eps", cfg.float("layer_norm_eps", 1e-12), "layer_norm_eps")
    draft.put("norm.final", False)
    draft.put("head.transform", True)
    draft.put("dropout", cfg.float("hidden_dropout_prob", 0.1), "hidden_dropout_prob")
    # dropout on the attention weights (modeling_bert: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attention_probs_dropout_prob", 0.1)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads. ``type_vocab_size`` is left out for
    a spec without segments: BERT always adds a segment row, so such a spec re-imports with
    BertConfig's two and is rejected."""
    out: dict[str, Any] = {
        "hidden_size": spec.d_model, "num_hidden_layers": spec.layer_count("encoder"),
        "vocab_size": spec.output_vocab, "max_position_embeddings": spec.max_len,
        "position_embedding_type": "absolute", "is_decoder": False,
        "add_cross_attention": False, "tie_word_embeddings": spec.embedding.tie_output,
        "num_attention_heads": spec.attention.heads, "intermediate_size": spec.ffn.hidden,
        "hidden_act": plain_activation(spec), "layer_norm_eps": spec.norm.eps,
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": spec.attention.dropout,
    }
    if spec.embedding.token_types:
        out["type_vocab_size"] = spec.embedding.token_types
    return out


def encoder_rows(spec: Spec, model: str) -> list[Rule]:
    """The embeddings and layers of BERT's encoder under ``model`` ("bert"; RoBERTa's
    "roberta" has the same modules)."""
    src, dst, e = f"{model}.encoder.layer.{{i}}", "encoder.layers.{i}", f"{model}.embeddings"
    rows = [Rule(f"{e}.word_embeddings.weight", ("embed.tokens.weight",)),
            Rule(f"{e}.position_embeddings.weight", ("encoder.positions.weight",))]
    if spec.embedding.token_types:
        rows.append(Rule(f"{e}.token_type_embeddings.weight", ("embed.token_types.weight",)))
    rows += norm_rows(f"{e}.LayerNorm", "encoder.embed_norm", spec)
    for r, theirs in (("q", "self.query"), ("k", "self.key"), ("v", "self.value"),
                      ("o", "output.dense")):
        rows += linear_rows(f"{src}.attention.{theirs}", f"{dst}.self_attn.{r}", True)
    rows += norm_rows(f"{src}.attention.output.LayerNorm", f"{dst}.self_attn_norm", spec)
    rows += linear_rows(f"{src}.intermediate.dense", f"{dst}.ffn.up", True)
    rows += linear_rows(f"{src}.output.dense", f"{dst}.ffn.down", True)
    rows += norm_rows(f"{src}.output.LayerNorm", f"{dst}.ffn_norm", spec)
    return rows


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    rows = encoder_rows(spec, "bert")
    p = "cls.predictions"
    rows += linear_rows(f"{p}.transform.dense", "head.transform", True)
    rows += norm_rows(f"{p}.transform.LayerNorm", "head.transform_norm", spec)
    table = "embed.tokens.weight" if spec.embedding.tie_output else "head.weight"
    rows.append(Rule(f"{p}.decoder.weight", (table,),
                     "alias" if spec.embedding.tie_output else "copy"))
    # BertLMPredictionHead.bias is also registered as decoder.bias (the same tensor)
    rows += [Rule(f"{p}.bias", ("head.bias",)), Rule(f"{p}.decoder.bias", ("head.bias",), "alias")]
    return rows
