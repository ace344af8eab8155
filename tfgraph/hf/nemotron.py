"""Nemotron (NVIDIA 2024; Nemotron-4, Minitron): a GQA decoder with LayerNorm1P (a LayerNorm
whose gains are stored as offsets from 1: ``norm.unit_offset``), an ungated MLP with squared
ReLU (``relu2``), rotary positions on a fraction of each head (``partial_rotary_factor``), and
biases on the projections when ``attention_bias`` / ``mlp_bias``."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import llama_layer_rows, llama_outer_rows, put_decoder_sizes
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_rope, rope_parameters
from tfgraph.hf.export_common import decoder_sizes, plain_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    put_decoder_sizes(draft, cfg)
    draft.put("attention.bias", cfg.bool("attention_bias", False), "attention_bias")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    draft.put("ffn.activation", activation(cfg, "hidden_act", gated=False, default="relu2"),
              "hidden_act")
    draft.put("ffn.bias", cfg.bool("mlp_bias", False), "mlp_bias")
    draft.put("norm.kind", "layernorm")
    draft.put("norm.unit_offset", True)  # LayerNorm1P: weight + 1
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("norm_eps", 1e-5), "norm_eps")
    draft.put("norm.final", True)
    where, params = rope_parameters(cfg)
    put_rope(draft, params, where, partial=True)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec Nemotron cannot hold
    (gated MLP, another norm, biases on some attention projections only, windows)."""
    att, ffn = spec.attention, spec.ffn
    if spec.norm.kind != "layernorm" or not spec.norm.unit_offset \
            or bool(att.qkv_bias) != bool(att.out_bias) or att.window is not None:
        return None
    return {
        **decoder_sizes(spec),
        "attention_bias": bool(att.qkv_bias),
        "mlp_bias": ffn.bias, "intermediate_size": ffn.hidden,
        "hidden_act": plain_activation(spec, "relu2"), "norm_eps": spec.norm.eps,
        "rope_parameters": rope_config(spec, partial=True),
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    # attention_bias covers q, k, v and o alike; an ungated MLP (up, relu2, down)
    norms = {"input_layernorm": "self_attn_norm", "post_attention_layernorm": "ffn_norm"}
    return llama_outer_rows(spec) + llama_layer_rows(spec, "model.layers", norms, gated=False)
