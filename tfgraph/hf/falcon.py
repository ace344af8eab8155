"""Falcon (TII 2023; Falcon-7B, Falcon-RW): a LayerNorm decoder with rotary positions, the
exact GELU, ``bias`` on every projection or none, multi-query attention (``multi_query``:
``query_key_value`` stacks every query head, then one key and one value head) or per-head
[q, k, v] without it, and attention beside the feed-forward on one shared norm
(``parallel_attn``) or after it. The new decoder architecture of Falcon-40B/180B
(``new_decoder_architecture``, FalconAttention._split_heads) has ``num_kv_heads`` key/value
heads, ``query_key_value`` holding per group [its heads/num_kv_heads query heads, its k, its
v], and attention always beside the feed-forward, each on its own norm (``ln_attn``,
``ln_mlp``; ``num_ln_in_parallel_attn`` 2, the default) or on one (``input_layernorm``, 1).

Falcon's ALiBi variant (``alibi: true``, Falcon-RW-1B/7B) has no rotary positions (the
rotary settings are moot) but ALiBi as transformers' build_alibi_tensor computes it: BLOOM's
slopes rounded to bfloat16, times each key's position counted over its row's real tokens
(attention mask cumsum - 1), the product rounded to bfloat16 (``embedding.alibi_bfloat16``),
and divided by sqrt(head_dim) like the scores (``embedding.alibi_scaled``): softmax((q.k +
alibi) / sqrt(head_dim)), as TII's Falcon-RW code ((scores + alibi) * inv_norm_factor) and
transformers' SDPA attention (the default; the bias folded into the mask) compute it.
transformers' eager attention adds the bias a second time, to the unscaled scores
(FalconAttention.forward and FalconModel.forward both add it): that path is not the model
and is not matched."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import head_rows, linear_rows, norm_rows, put_sizes
from tfgraph.hf.config import (HFConfig, SpecDraft, activation, put_attention_dropout, put_rope,
                               rope_parameters)
from tfgraph.hf.export_common import plain_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    new = cfg.bool("new_decoder_architecture", False)
    lns = cfg.get("num_ln_in_parallel_attn", None)
    if new:
        if not cfg.bool("parallel_attn", True):  # FalconDecoderLayer needs ln_attn or it
            cfg.refuse("parallel_attn", "transformers' new decoder architecture fails without "
                       "it (its layers read ln_attn / ln_mlp, built only with parallel_attn)")
        if lns not in (None, 1, 2):
            cfg.refuse("num_ln_in_parallel_attn", "must be 1 or 2")
        cfg.moot("multi_query")  # num_kv_heads says it
    elif lns not in (None, 1):
        cfg.refuse("num_ln_in_parallel_attn", "two norms per layer belong to the new decoder "
                   "architecture")
    d = put_sizes(draft, cfg, "decoder-only", True)
    heads = cfg.int("num_attention_heads")
    draft.put("attention.heads", heads, "num_attention_heads")
    if new:
        draft.put("attention.kv_heads", cfg.int("num_kv_heads", heads), "num_kv_heads")
    else:
        cfg.moot("num_kv_heads")  # read by the new architecture only
        draft.put("attention.kv_heads", 1 if cfg.bool("multi_query", True) else heads,
                  "multi_query")
    bias = cfg.bool("bias", False)
    draft.put("attention.bias", bias, "bias")
    draft.put("ffn.hidden", cfg.int("ffn_hidden_size", 4 * d), "ffn_hidden_size")
    draft.put("ffn.activation", activation(cfg, "activation", gated=False, default="gelu"),
              "activation")
    draft.put("ffn.bias", bias, "bias")
    draft.put("norm.kind", "layernorm")
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_epsilon", 1e-5), "layer_norm_epsilon")
    draft.put("norm.final", True)
    if new:  # attention beside the feed-forward, on ln_attn and ln_mlp or one shared norm
        draft.put("block.residual", "parallel", "new_decoder_architecture")
        draft.put("block.shared_norm", lns == 1, "num_ln_in_parallel_attn")
    elif cfg.bool("parallel_attn", True):
        draft.put("block.residual", "parallel", "parallel_attn")
        draft.put("block.shared_norm", True, "parallel_attn")
    draft.put("dropout", cfg.float("hidden_dropout", 0.0), "hidden_dropout")
    if cfg.bool("alibi", False):  # Falcon-RW: no rotary (FalconAttention skips it)
        draft.put("embedding.positions", "alibi", "alibi")
        draft.put("embedding.alibi_scaled", True, "alibi")
        draft.put("embedding.alibi_bfloat16", True, "alibi")
        cfg.moot("rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor")
        # with ALiBi FalconAttention drops out the attention weights (attention_probs in
        # eager, SDPA's dropout_p)
        put_attention_dropout(draft, cfg, "attention_dropout", 0.0)
        return draft
    # Rotary Falcon: transformers' eager and SDPA paths pass no dropout to the attention
    # weights whatever attention_dropout says (modeling_falcon: dropout_p=0.0, "It is unclear
    # why dropout is not applied here"); only its flash-attention path does. Left inert.
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec Falcon cannot hold."""
    att = spec.attention
    parallel = spec.block.residual == "parallel"
    # the old layout holds one kv head or all of them, with one norm when parallel; the new
    # one any grouping, always parallel
    new = parallel and (att.kv_heads not in (1, att.heads) or not spec.block.shared_norm)
    emb = spec.embedding
    alibi = emb.positions == "alibi"
    if spec.norm.kind != "layernorm" or bool(att.qkv_bias) != spec.ffn.bias \
            or (not new and att.kv_heads not in (1, att.heads)) \
            or (alibi and not (emb.alibi_scaled and emb.alibi_bfloat16)) \
            or (not alibi and emb.positions != "rope"):
        return None  # Falcon's ALiBi is rounded and scaled; BLOOM's or MPT's is not
    layout: dict[str, Any] = {"new_decoder_architecture": new}
    if new:
        layout |= {"num_kv_heads": att.kv_heads,
                   "num_ln_in_parallel_attn": 1 if spec.block.shared_norm else 2}
    else:
        layout["multi_query"] = att.kv_heads == 1 and att.heads > 1
    return layout | {
        "hidden_size": spec.d_model, "num_hidden_layers": spec.layer_count("decoder"),
        "vocab_size": spec.output_vocab, "max_position_embeddings": spec.max_len,
        "tie_word_embeddings": spec.embedding.tie_output,
        "num_attention_heads": att.heads, "alibi": alibi, "parallel_attn": parallel,
        "bias": spec.ffn.bias, "ffn_hidden_size": spec.ffn.hidden,
        "activation": plain_activation(spec), "layer_norm_epsilon": spec.norm.eps,
        "hidden_dropout": spec.dropout,
        # read back only with ALiBi (spec_from_config): a rotary spec with attention.dropout
        # does not survive the round trip, so another family takes it
        "attention_dropout": att.dropout if alibi else 0.0,
    } | ({} if alibi else {"rope_parameters": rope_config(spec)})


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    att, src, dst = spec.attention, "transformer.h.{i}", "decoder.layers.{i}"
    bias = spec.ffn.bias
    head_dim = spec.d_model // att.heads
    rows = [Rule("transformer.word_embeddings.weight", ("embed.tokens.weight",))]
    rows += norm_rows("transformer.ln_f", "decoder.norm", spec)
    rows += head_rows(spec, "lm_head")
    qkv = tuple(f"{dst}.self_attn.{r}" for r in "qkv")
    new = cfg.bool("new_decoder_architecture", False)
    for kind in ("weight", "bias") if bias else ("weight",):
        if new:  # per kv group [its q heads, k, v] (FalconAttention._split_heads)
            kv = int(att.kv_heads or 1)
            rows.append(Rule(f"{src}.self_attention.query_key_value.{kind}",
                             tuple(f"{o}.{kind}" for o in qkv), "heads",
                             (kv, att.heads // kv * head_dim, head_dim, head_dim)))
        elif att.kv_heads == 1 and att.heads > 1:  # [all q heads | k | v]
            rows.append(Rule(f"{src}.self_attention.query_key_value.{kind}",
                             tuple(f"{o}.{kind}" for o in qkv), "split",
                             (spec.d_model, head_dim, head_dim)))
        else:  # per head [q, k, v]
            rows.append(Rule(f"{src}.self_attention.query_key_value.{kind}",
                             tuple(f"{o}.{kind}" for o in qkv), "heads", (att.heads,)))
    rows += linear_rows(f"{src}.self_attention.dense", f"{dst}.self_attn.o", bias)
    rows += linear_rows(f"{src}.mlp.dense_h_to_4h", f"{dst}.ffn.up", bias)
    rows += linear_rows(f"{src}.mlp.dense_4h_to_h", f"{dst}.ffn.down", bias)
    if spec.block.residual == "parallel" and not spec.block.shared_norm:  # new architecture
        rows += norm_rows(f"{src}.ln_attn", f"{dst}.self_attn_norm", spec)
        rows += norm_rows(f"{src}.ln_mlp", f"{dst}.ffn_norm", spec)
    elif spec.block.residual == "parallel":
        rows += norm_rows(f"{src}.input_layernorm", f"{dst}.norm", spec)
    else:
        rows += norm_rows(f"{src}.input_layernorm", f"{dst}.self_attn_norm", spec)
        rows += norm_rows(f"{src}.post_attention_layernorm", f"{dst}.ffn_norm", spec)
    return rows
