"""ModernBERT (Warner et al. 2024) as ModernBertForMaskedLM: a pre-norm encoder of LayerNorms
without bias (``norm_bias``), no projection biases (``attention_bias``, ``mlp_bias``), a GeGLU
feed-forward (``Wi`` fused [gelu'd half; gate half], ``Wo``), rotary positions with one base on
the global layers and another on the local ones (``rope_parameters``: full_attention and
sliding_attention; older configs ``global_rope_theta``, ``local_rope_theta``), global
attention every ``global_attn_every_n_layers`` layers (``layer_types``) and bidirectional
sliding windows elsewhere: modeling_modernbert masks |i - j| > local_attention // 2
(masking_utils.sliding_window_bidirectional_overlay), tfgraph's encoder window reads
|i - j| < window, so window = local_attention // 2 + 1. A LayerNorm on the token embeddings,
no norm before the first layer's attention (its attn_norm is an identity: ``norm.skip_first``),
a final norm, and the masked-LM head: ``head.dense`` (bias ``classifier_bias``), the
activation, ``head.norm``, then ``decoder``: the token table (tied) with a bias
(``decoder_bias``)."""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import layer_kinds, linear_rows, norm_rows, put_sizes, put_windows
from tfgraph.hf.config import HFConfig, SpecDraft, activation
from tfgraph.hf.export_common import gated_activation, layer_types
from tfgraph.hf.names import Rule
from tfgraph.hf.rope_types import per_type_rope
from tfgraph.spec.schema import GATED_INNER, Spec

_GLOBAL, _LOCAL = 160000.0, 10000.0  # ModernBertConfig.default_theta

# ModernBertConfig's token ids the spec language does not hold: written as null, since the
# class defaults (50281, 50282) lie outside a small vocabulary (export_config.family_config)
OTHER_TOKEN_KEYS = ("cls_token_id", "sep_token_id")


def _thetas(cfg: HFConfig, types: Any) -> tuple[float, float]:
    """(the global layers' rotary base, the local layers'), unscaled, as
    ModernBertConfig.convert_rope_params_to_dict makes them (tfgraph.hf.rope_types): the
    entries of rope_parameters per layer type, a legacy rope_scaling updating both, a missing
    theta filled from the older global_rope_theta / local_rope_theta (else 160000 and
    10000). The class's field type admits only a mapping of those two entries."""
    params = cfg.get("rope_parameters", None)
    if params is not None and (not isinstance(params, dict)
                               or set(params) - {"full_attention", "sliding_attention"}):
        cfg.refuse("rope_parameters", "ModernBERT's rotary settings are one mapping per layer "
                   "type (full_attention, sliding_attention)")
    kinds = {t for t in types if isinstance(t, str)} if isinstance(types, list) else set()
    rope = per_type_rope(cfg, {"full_attention": ("global_rope_theta", _GLOBAL),
                               "sliding_attention": ("local_rope_theta", _LOCAL)},
                         ("full_attention", "sliding_attention"), kinds)
    thetas = []
    for kind in ("full_attention", "sliding_attention"):
        one = rope[kind]
        theta = one["rope_theta"]
        if kind not in kinds:  # an entry no layer reads
            thetas.append(float(theta) if isinstance(theta, (int, float)) else 0.0)
            continue
        if one["rope_type"] != "default" or set(one) - {"rope_type", "type", "rope_theta"}:
            cfg.refuse("rope_parameters", "tfgraph imports ModernBERT's unscaled rotary "
                       "frequencies only (rope_type default)", rope)
        if isinstance(theta, bool) or not isinstance(theta, (int, float)):
            cfg.refuse("rope_parameters", "rope_theta must be a number", params)
        thetas.append(float(theta))
    if "full_attention" not in kinds:  # every layer local: their base is the model's
        thetas[0] = thetas[1]
    return thetas[0], thetas[1]


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    put_sizes(draft, cfg, "encoder-only", True)
    layers = cfg.int("num_hidden_layers")
    draft.put("attention.heads", cfg.int("num_attention_heads"), "num_attention_heads")
    draft.put("attention.bias", cfg.bool("attention_bias", False), "attention_bias")
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    act = activation(cfg, "hidden_activation", gated=True, default="gelu")
    draft.put("ffn.activation", act, "hidden_activation")
    draft.put("ffn.bias", cfg.bool("mlp_bias", False), "mlp_bias")
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("norm_eps", 1e-5), "norm_eps")
    draft.put("norm.bias", cfg.bool("norm_bias", False), "norm_bias")
    draft.put("norm.final", True)  # final_norm
    draft.put("norm.skip_first", True)  # layer 0's attn_norm is nn.Identity
    draft.put("embedding.norm", True)  # embeddings.norm
    draft.put("embedding.output_bias", cfg.bool("decoder_bias", True), "decoder_bias")
    # the local attention's half width, both sides, plus the query itself (see the docstring)
    half = cfg.int("local_attention", 128) // 2
    types = cfg.get("layer_types", None)
    if types is None:  # ModernBertConfig.__post_init__
        every = cfg.int("global_attn_every_n_layers", 3)
        types = layer_kinds(layers, lambda i: "sliding_attention" if i % every
                            else "full_attention")
    else:
        cfg.moot("global_attn_every_n_layers")  # what it made
    global_theta, local_theta = _thetas(cfg, types)
    draft.put("embedding.positions", "rope")
    draft.put("embedding.rope_theta", global_theta, "rope_parameters")
    put_windows(draft, types, half + 1, layers, "local_attention")
    if "window" in draft.data.get("attention", {}) and local_theta != global_theta:
        draft.put("embedding.local_rope_theta", local_theta, "rope_parameters")
    draft.put("head.transform", True)  # head.dense, act, head.norm
    draft.put("head.transform_bias", cfg.bool("classifier_bias", False), "classifier_bias")
    head_act = activation(cfg, "classifier_activation", gated=False, default="gelu")
    if head_act != GATED_INNER[act]:
        cfg.refuse("classifier_activation", f"tfgraph's head transform applies the "
                   f"feed-forward's inner activation ({GATED_INNER[act]}, from "
                   "hidden_activation); another one has no spec form")
    # Only ModernBertForMaskedLM's logits are imported: sparse prediction needs labels, and
    # pooling, flash attention's determinism and a compiled forward leave them unchanged.
    cfg.moot("sparse_prediction", "sparse_pred_ignore_index", "classifier_pooling",
             "deterministic_flash_attn", "initializer_cutoff_factor")
    draft.put("dropout", 0.0)
    # attention_dropout stays inert: ModernBertAttention applies it to the attention weights
    # and again to Wo's output (out_drop), one rate in two places that attention.dropout and
    # the spec's dropout (also after the feed-forward, where ModernBERT has mlp_dropout)
    # cannot say together.
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a window ModernBERT's even
    local_attention cannot give (window - 1 per side, local_attention = 2 (window - 1))."""
    att, emb = spec.attention, spec.embedding
    window = att.window if att.window is not None else 65  # unused without local layers
    if window < 2:
        return None
    local = emb.local_rope_theta if emb.local_rope_theta is not None else emb.rope_theta
    return {
        "hidden_size": spec.d_model, "num_hidden_layers": spec.layer_count("encoder"),
        "vocab_size": spec.output_vocab, "max_position_embeddings": spec.max_len or 8192,
        "num_attention_heads": att.heads, "attention_bias": bool(att.bias),
        "intermediate_size": spec.ffn.hidden,
        "hidden_activation": gated_activation(spec, fallback="gelu"),
        "classifier_activation": gated_activation(spec, fallback="gelu"),
        "mlp_bias": spec.ffn.bias, "norm_eps": spec.norm.eps, "norm_bias": spec.norm.bias,
        "decoder_bias": emb.output_bias, "classifier_bias": spec.head.transform_bias,
        "local_attention": 2 * (window - 1),
        "layer_types": layer_types(spec, "encoder"),
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": float(emb.rope_theta)},
            "sliding_attention": {"rope_type": "default", "rope_theta": float(local)}},
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    src, dst, att = "model.layers.{i}", "encoder.layers.{i}", spec.attention
    assert att.head_dim is not None and spec.ffn.hidden
    width, hidden = att.heads * att.head_dim, spec.ffn.hidden
    rows = [Rule("model.embeddings.tok_embeddings.weight", ("embed.tokens.weight",))]
    rows += norm_rows("model.embeddings.norm", "encoder.embed_norm", spec)
    rows.append(Rule(f"{src}.attn.Wqkv.weight", tuple(f"{dst}.self_attn.{r}.weight"
                                                      for r in "qkv"), "split", (width,) * 3))
    if att.qkv_bias:
        rows.append(Rule(f"{src}.attn.Wqkv.bias", tuple(f"{dst}.self_attn.{r}.bias"
                                                        for r in "qkv"), "split", (width,) * 3))
    rows += linear_rows(f"{src}.attn.Wo", f"{dst}.self_attn.o", bool(att.out_bias))
    # Wi's first half goes through the activation, its second half multiplies it:
    # tfgraph's gate and up
    rows.append(Rule(f"{src}.mlp.Wi.weight", (f"{dst}.ffn.gate.weight", f"{dst}.ffn.up.weight"),
                     "split", (hidden, hidden)))
    if spec.ffn.bias:
        rows.append(Rule(f"{src}.mlp.Wi.bias", (f"{dst}.ffn.gate.bias", f"{dst}.ffn.up.bias"),
                         "split", (hidden, hidden)))
    rows += linear_rows(f"{src}.mlp.Wo", f"{dst}.ffn.down", spec.ffn.bias)
    rows += norm_rows(f"{src}.attn_norm", f"{dst}.self_attn_norm", spec)  # not in layer 0
    rows += norm_rows(f"{src}.mlp_norm", f"{dst}.ffn_norm", spec)
    rows += norm_rows("model.final_norm", "encoder.norm", spec)
    rows += linear_rows("head.dense", "head.transform", spec.head.transform_bias)
    rows += norm_rows("head.norm", "head.transform_norm", spec)
    table = "embed.tokens.weight" if spec.embedding.tie_output else "head.weight"
    rows.append(Rule("decoder.weight", (table,), "alias" if spec.embedding.tie_output else "copy"))
    if spec.embedding.output_bias:
        rows.append(Rule("decoder.bias", ("head.bias",)))
    return rows
