"""StarCoder2 (Lozhkov et al. 2024): a GQA decoder with LayerNorm (gain and bias), biases on
every projection when ``use_bias`` (the default), an ungated MLP (``c_fc``, ``c_proj``;
gelu_pytorch_tanh), rotary positions and an optional sliding window on every layer."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import (linear_rows, llama_outer_rows, norm_rows, put_decoder_sizes,
                               put_windows)
from tfgraph.hf.config import (HFConfig, SpecDraft, activation, put_embedding_dropout, put_rope,
                               rope_parameters)
from tfgraph.hf.export_common import decoder_sizes, plain_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    put_decoder_sizes(draft, cfg)
    bias = cfg.bool("use_bias", True)
    draft.put("attention.bias", bias, "use_bias")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    draft.put("ffn.activation",
              activation(cfg, "hidden_act", gated=False, default="gelu_pytorch_tanh"),
              "hidden_act")
    draft.put("ffn.bias", bias, "use_bias")
    draft.put("norm.kind", "layernorm")  # nn.LayerNorm: a bias whatever use_bias says
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("norm_epsilon", 1e-5), "norm_epsilon")
    draft.put("norm.final", True)
    draft.put("embedding.tie_output", cfg.bool("tie_word_embeddings", True),
              "tie_word_embeddings")
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where)
    put_windows(draft, None, cfg.get("sliding_window", None), cfg.int("num_hidden_layers"))
    # modeling_starcoder2: residual_dropout on o_proj's and c_proj's outputs, embedding_dropout
    # on the token embeddings
    draft.put("dropout", cfg.float("residual_dropout", 0.0), "residual_dropout")
    put_embedding_dropout(draft, cfg.float("embedding_dropout", 0.0), "embedding_dropout")
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec StarCoder2 cannot
    hold (gated MLP, RMSNorm, biases on some projections only, a window pattern)."""
    att, ffn = spec.attention, spec.ffn
    if spec.norm.kind != "layernorm" or bool(att.qkv_bias) != bool(att.out_bias) \
            or bool(att.qkv_bias) != ffn.bias or att.window_pattern is not None:
        return None
    return {
        **decoder_sizes(spec, head_dim=False),
        "use_bias": ffn.bias, "intermediate_size": ffn.hidden,
        "hidden_act": plain_activation(spec, "gelu_pytorch_tanh"),
        "norm_epsilon": spec.norm.eps, "sliding_window": att.window,
        "rope_parameters": rope_config(spec),
        "residual_dropout": spec.dropout, "embedding_dropout": spec.embedding_dropout,
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst = "model.layers.{i}", "decoder.layers.{i}"
    bias = spec.ffn.bias
    rows = llama_outer_rows(spec)
    for r in "qkvo":
        rows += linear_rows(f"{src}.self_attn.{r}_proj", f"{dst}.self_attn.{r}", bias)
    rows += linear_rows(f"{src}.mlp.c_fc", f"{dst}.ffn.up", bias)
    rows += linear_rows(f"{src}.mlp.c_proj", f"{dst}.ffn.down", bias)
    rows += norm_rows(f"{src}.input_layernorm", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{src}.post_attention_layernorm", f"{dst}.ffn_norm", spec)
    return rows
