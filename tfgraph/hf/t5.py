"""T5 (Raffel et al. 2020) and T5 v1.1 / Flan-T5: a pre-norm encoder-decoder with T5's
RMSNorm (no mean subtraction, no bias), no biases anywhere, unscaled dot-product attention
(``attention.scale: 1``: the scale is folded into the initialisation), relative position
buckets added to the scores of self-attention (``embedding.positions: relative``; the first
layer of each stack owns the bucket table, the others reuse it), and a head tied to the token
table that reads the last hidden state times d_model^-0.5 (``head.scale``). v1.1 unties the head
and uses a gated tanh-GELU feed-forward (``feed_forward_proj: gated-gelu``)."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import linear_rows
from tfgraph.hf.config import HFConfig, SpecDraft, activation
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec

# feed_forward_proj -> (Hugging Face activation, gated); T5Config splits "gated-" off
_PROJ = {"relu": ("relu", False), "gated-gelu": ("gelu_new", True),
         "gelu": ("gelu", False), "gated-silu": ("silu", True), "gated-relu": ("relu", True)}


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    proj = cfg.get("feed_forward_proj", "relu")
    if proj not in _PROJ or _PROJ[proj] == ("relu", True):
        cfg.refuse("feed_forward_proj", "tfgraph has no such feed-forward (supported: relu, "
                   "gelu, gated-gelu, gated-silu)")
    act, gated = _PROJ[proj]
    # T5Config.__post_init__ derives dense_act_fn and is_gated_act from feed_forward_proj
    # (gated-gelu: gelu_new) over whatever config.json says: what is read above is the model
    cfg.moot("dense_act_fn", "is_gated_act")
    d = cfg.int("d_model")
    draft.put("arch", "encoder-decoder")
    draft.put("d_model", d, "d_model")
    enc = cfg.int("num_layers")
    dec = cfg.int("num_decoder_layers", enc)
    draft.put("layers", enc if enc == dec else {"encoder": enc, "decoder": dec},
              "num_decoder_layers")
    draft.put("vocab", cfg.int("vocab_size"), "vocab_size")
    draft.put("embedding.positions", "relative", "relative_attention_num_buckets")
    draft.put("embedding.relative_buckets", cfg.int("relative_attention_num_buckets", 32),
              "relative_attention_num_buckets")
    draft.put("embedding.relative_max_distance", cfg.int("relative_attention_max_distance", 128),
              "relative_attention_max_distance")
    draft.put("embedding.scale", False)
    tied = cfg.bool("tie_word_embeddings", True)
    draft.put("embedding.tie_output", tied, "tie_word_embeddings")
    draft.put("embedding.share", True)
    heads = cfg.int("num_heads")
    draft.put("attention.heads", heads, "num_heads")
    head_dim = cfg.int("d_kv")
    if head_dim * heads != d:  # T5 v1.1 xl / xxl: heads * d_kv differs from d_model
        draft.put("attention.head_dim", head_dim, "d_kv")
    draft.put("attention.bias", False)
    draft.put("attention.scale", 1.0, "model_type")
    draft.put("ffn.hidden", cfg.int("d_ff"), "d_ff")
    draft.put("ffn.activation", activation(HFConfig({"act": act}, cfg.source), "act", gated),
              "feed_forward_proj")
    draft.put("ffn.bias", False)
    draft.put("norm.position", "pre")
    draft.put("norm.kind", "rmsnorm")
    draft.put("norm.eps", cfg.float("layer_norm_epsilon", 1e-6), "layer_norm_epsilon")
    draft.put("norm.final", True)
    # T5ForConditionalGeneration: sequence_output * model_dim**-0.5 when scale_decoder_outputs,
    # which T5Config takes from config.json, else from tie_word_embeddings (transformers 5
    # saves T5 v1.1 / Flan-T5 as tie_word_embeddings true with scale_decoder_outputs false)
    if cfg.bool("scale_decoder_outputs", tied):
        draft.put("head.scale", d ** -0.5, "scale_decoder_outputs" if "scale_decoder_outputs"
                  in cfg.data else "tie_word_embeddings")
    draft.put("dropout", cfg.float("dropout_rate", 0.1), "dropout_rate")
    # modeling_t5 also drops out the attention weights at dropout_rate (T5Attention's
    # dropout): one rate for both places, where the spec has two. attention.dropout is not
    # read from it (the spec under-states T5's training-time dropout; inference is the same).
    return draft


# ffn.activation -> feed_forward_proj (the inverse of _PROJ)
_FFN = {"relu": "relu", "gelu": "gelu", "geglu_tanh": "gated-gelu", "swiglu": "gated-silu"}


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads (T5's unscaled scores, missing
    biases and relative positions are fixed by the model type; ``head.scale`` is
    scale_decoder_outputs)."""
    emb = spec.embedding
    return {
        "d_model": spec.d_model, "d_kv": spec.attention.head_dim, "d_ff": spec.ffn.hidden,
        "num_layers": spec.layer_count("encoder"),
        "num_decoder_layers": spec.layer_count("decoder"),
        "num_heads": spec.attention.heads, "vocab_size": spec.output_vocab,
        "relative_attention_num_buckets": emb.relative_buckets or 32,
        "relative_attention_max_distance": emb.relative_max_distance or 128,
        "feed_forward_proj": _FFN.get(spec.ffn.activation, "relu"),
        "tie_word_embeddings": emb.tie_output, "layer_norm_epsilon": spec.norm.eps,
        "scale_decoder_outputs": spec.head.scale is not None,
        "dropout_rate": spec.dropout,
    }


def _stack_rows(spec: Spec, stack: str) -> list[Rule]:
    src, dst = f"{stack}.block.{{i}}.layer", f"{stack}.layers.{{i}}"
    subs = [("SelfAttention", "self_attn")]
    if stack == "decoder":
        subs.append(("EncDecAttention", "cross_attn"))
    rows: list[Rule] = []
    for j, (theirs, ours) in enumerate(subs):
        for r in "qkvo":
            rows += linear_rows(f"{src}.{j}.{theirs}.{r}", f"{dst}.{ours}.{r}", False)
        rows.append(Rule(f"{src}.{j}.layer_norm.weight", (f"{dst}.{ours}_norm.weight",)))
    f = len(subs)
    gated = spec.ffn.activation in ("swiglu", "geglu", "geglu_tanh")
    names = {"wi_0": "gate", "wi_1": "up"} if gated else {"wi": "up"}
    for theirs, ours in (names | {"wo": "down"}).items():
        rows += linear_rows(f"{src}.{f}.DenseReluDense.{theirs}", f"{dst}.ffn.{ours}", False)
    rows.append(Rule(f"{src}.{f}.layer_norm.weight", (f"{dst}.ffn_norm.weight",)))
    rows.append(Rule(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                     (f"{stack}.relative_bias.weight",)))
    rows.append(Rule(f"{stack}.final_layer_norm.weight", (f"{stack}.norm.weight",)))
    return rows


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    rows = [Rule("shared.weight", ("embed.tokens.weight",)),
            Rule("encoder.embed_tokens.weight", ("embed.tokens.weight",), "alias"),
            Rule("decoder.embed_tokens.weight", ("embed.tokens.weight",), "alias")]
    if spec.embedding.tie_output:
        rows.append(Rule("lm_head.weight", ("embed.tokens.weight",), "alias"))
    else:
        rows.append(Rule("lm_head.weight", ("head.weight",)))
    return rows + _stack_rows(spec, "encoder") + _stack_rows(spec, "decoder")
