"""GPT-NeoX and Pythia (Black et al. 2022; Biderman et al. 2023): pre-norm LayerNorm decoder
with parallel residual (``use_parallel_residual``), rotary positions on a fraction of each head
(``rotary_pct``; Pythia: 0.25), an untied ``embed_out`` head.

``query_key_value`` is fused per head: for each head its q rows, then k, then v.
"""

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
    d = put_sizes(draft, cfg, "decoder-only", False)
    draft.put("attention.heads", cfg.int("num_attention_heads"), "num_attention_heads")
    draft.put("attention.bias", cfg.bool("attention_bias", True), "attention_bias")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    act = activation(cfg, "hidden_act", gated=False, default="gelu")
    draft.put("ffn.activation", act, "hidden_act")
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_eps", 1e-5), "layer_norm_eps")
    draft.put("norm.final", True)
    if cfg.bool("use_parallel_residual", True):
        draft.put("block.residual", "parallel", "use_parallel_residual")
    draft.put("dropout", cfg.float("hidden_dropout", 0.0), "hidden_dropout")
    # dropout on the attention weights (modeling_gpt_neox: the attention interface's dropout)
    put_attention_dropout(draft, cfg, "attention_dropout", 0.0)
    # configuration_gpt_neox's convert_rope_params_to_dict: what the rope_parameters (or
    # rope_scaling) mapping lacks comes from the hub configs' rotary_emb_base and rotary_pct,
    # else theta 10000 and fraction 0.25
    base = cfg.float("rotary_emb_base", 10000.0)
    where, params = rope_parameters(cfg, base, default_fraction=cfg.float("rotary_pct", 0.25))
    if where == "rope_theta" and "rotary_pct" in cfg.data:
        where = "rotary_pct"
    put_rope(draft, params, where, partial=True)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any]:
    """The config fields :func:`spec_from_config` reads, the rotary share always written
    (GPTNeoXConfig's default is 0.25)."""
    return {
        "hidden_size": spec.d_model, "num_hidden_layers": spec.layer_count("decoder"),
        "vocab_size": spec.output_vocab, "max_position_embeddings": spec.max_len,
        "tie_word_embeddings": spec.embedding.tie_output,
        "num_attention_heads": spec.attention.heads, "attention_bias": spec.attention.bias,
        "intermediate_size": spec.ffn.hidden, "hidden_act": plain_activation(spec),
        "layer_norm_eps": spec.norm.eps,
        "use_parallel_residual": spec.block.residual == "parallel",
        "hidden_dropout": spec.dropout, "attention_dropout": spec.attention.dropout,
        "rope_parameters": rope_config(spec, partial=True),
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst = "gpt_neox.layers.{i}", "decoder.layers.{i}"
    att = spec.attention
    rows = [Rule("gpt_neox.embed_in.weight", ("embed.tokens.weight",))]
    rows += norm_rows("gpt_neox.final_layer_norm", "decoder.norm", spec)
    if spec.embedding.tie_output:
        rows += head_rows(spec, "lm_head")
    else:  # lm_head in memory; the hub's and save_pretrained's files name it embed_out
        rows += [Rule("lm_head.weight", ("head.weight",), layout="memory"),
                 Rule("embed_out.weight", ("head.weight",), layout="disk")]
    kinds = ("weight", "bias") if att.qkv_bias else ("weight",)
    for kind in kinds:
        rows.append(Rule(f"{src}.attention.query_key_value.{kind}",
                         tuple(f"{dst}.self_attn.{r}.{kind}" for r in "qkv"), "heads",
                         (att.heads,)))
    rows += linear_rows(f"{src}.attention.dense", f"{dst}.self_attn.o", bool(att.out_bias))
    rows += linear_rows(f"{src}.mlp.dense_h_to_4h", f"{dst}.ffn.up", spec.ffn.bias)
    rows += linear_rows(f"{src}.mlp.dense_4h_to_h", f"{dst}.ffn.down", spec.ffn.bias)
    rows += norm_rows(f"{src}.input_layernorm", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{src}.post_attention_layernorm", f"{dst}.ffn_norm", spec)
    return rows
