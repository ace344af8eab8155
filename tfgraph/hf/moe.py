"""Mixture-of-experts Llama-style decoders: Mixtral (Jiang et al. 2024) and Qwen2-MoE (Qwen
Team 2024).

Mixtral: every layer's feed-forward is ``num_local_experts`` SwiGLU experts, each token routed
to ``num_experts_per_tok`` of them with a softmax over all router logits renormalised over the
chosen ones (transformers' MixtralTopKRouter). Qwen2-MoE: the softmax weights are kept as they
are unless ``norm_topk_prob``, and every layer adds a shared SwiGLU expert scaled by
sigmoid(x w) (``shared_expert_gate``); its attention has q/k/v biases and no o bias, as Qwen2.

Granite-MoE (IBM 2024): Granite's four multipliers (tfgraph.hf.llama) with routed experts
chosen by a softmax over the top-k router logits (``topk_softmax``); on disk its experts are
``input_linear`` (gate rows, then up) and ``output_linear``, its router ``router.layer``.

OLMoE (Muennighoff et al. 2024): pre-norm with an RMS norm over all of the queries and of
the keys (OLMo 2's), routed experts, no shared one; ``clip_qkv`` is refused.

Qwen3-MoE (Qwen Team 2025): Qwen3's attention (no biases unless ``attention_bias``, an RMS
norm of each head's queries and keys) with Qwen2-MoE's routing and dense first layers, and no
shared expert.

Phi-3.5-MoE (``phimoe``, Microsoft 2024): LayerNorms with biases, attention biases
(``attention_bias``), a head bias (``lm_head_bias``), every layer routed to 2 of
``num_local_experts`` SwiGLU experts by the sparsemixer (``ffn.router: sparsemixer`` with
``router_eps`` = ``router_jitter_noise``, which at inference is its threshold, not noise);
``input_jitter_noise`` only perturbs training inputs. On disk its experts are Mixtral's
``block_sparse_moe.experts.{e}.w1/w3/w2`` and its router ``block_sparse_moe.gate``.

transformers 5 stores each layer's experts stacked: ``mlp.experts.gate_up_proj`` [E, 2 * h, d]
(gate rows first) and ``mlp.experts.down_proj`` [E, d, h]; tfgraph's ``ffn.experts.gate``,
``up`` [E, h, d] and ``down`` [E, d, h] are the same tensors, split.
"""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import (llama_layer_rows, llama_outer_rows, put_decoder_sizes,
                               put_rms_rope, put_windows)
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_rope, rope_parameters
from tfgraph.hf.export_common import decoder_sizes, gated_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.llama import granite_multipliers, put_granite_multipliers
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec

_NORMS = {"input_layernorm": "self_attn_norm", "post_attention_layernorm": "ffn_norm"}


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    put_decoder_sizes(draft, cfg)
    layers = cfg.int("num_hidden_layers")
    qwen = cfg.model_type in ("qwen2_moe", "qwen3_moe")
    if cfg.model_type == "qwen2_moe":
        draft.put("attention.qkv_bias", True)  # modeling_qwen2_moe: q/k/v biases, o none
        draft.put("attention.out_bias", False)
    elif cfg.model_type == "qwen3_moe":
        draft.put("attention.bias", cfg.bool("attention_bias", False), "attention_bias")
        draft.put("attention.qk_norm", "head", "model_type")  # q_norm, k_norm per head
    elif cfg.model_type in ("granitemoe", "phimoe"):
        draft.put("attention.bias", cfg.bool("attention_bias", False), "attention_bias")
    elif cfg.model_type == "olmoe":
        draft.put("attention.bias", cfg.bool("attention_bias", False), "attention_bias")
        draft.put("attention.qk_norm", "full", "model_type")  # q_norm, k_norm over d
        if cfg.get("clip_qkv", None) is not None:
            cfg.refuse("clip_qkv", "OLMoE clamps q and k after its q/k norms; tfgraph's "
                       "attention.clip_qkv clamps before them (OLMo 1, MPT)")
    else:
        draft.put("attention.bias", False)
    gated = activation(cfg, "hidden_act", gated=True, default="silu")
    draft.put("ffn.activation", gated, "hidden_act")
    draft.put("ffn.bias", False)
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    draft.put("ffn.top_k", cfg.int("num_experts_per_tok"), "num_experts_per_tok")
    if cfg.model_type == "phimoe":  # PhimoeTopKRouter: sparsemixer, always two experts
        if cfg.int("num_experts_per_tok", 2) != 2:
            cfg.refuse("num_experts_per_tok", "transformers' sparsemixer routes every token "
                       "to 2 experts whatever it says")
        draft.put("ffn.experts", cfg.int("num_local_experts"), "num_local_experts")
        draft.put("ffn.router", "sparsemixer", "model_type")
        draft.put("ffn.router_eps", cfg.float("router_jitter_noise", 0.01),
                  "router_jitter_noise")
        cfg.moot("input_jitter_noise")  # multiplies the inputs by noise in training only
        if cfg.bool("lm_head_bias", False):
            draft.put("embedding.output_bias", True, "lm_head_bias")
    elif cfg.model_type == "granitemoe":  # softmax over the k largest router logits
        draft.put("ffn.experts", cfg.int("num_local_experts"), "num_local_experts")
        draft.put("ffn.router", "topk_softmax")
    elif cfg.model_type == "olmoe":  # experts intermediate_size wide, Qwen's routing choice
        draft.put("ffn.experts", cfg.int("num_experts"), "num_experts")
        renorm = cfg.bool("norm_topk_prob", False)
        draft.put("ffn.router", "softmax_topk_renorm" if renorm else "softmax_topk",
                  "norm_topk_prob")
    elif qwen:
        # Qwen3MoeConfig writes num_experts as num_local_experts (its attribute map)
        key = "num_experts" if "num_experts" in cfg else "num_local_experts"
        draft.put("ffn.experts", cfg.int(key), key)
        draft.put("ffn.expert_hidden", cfg.int("moe_intermediate_size"), "moe_intermediate_size")
        renorm = cfg.bool("norm_topk_prob", False)
        draft.put("ffn.router", "softmax_topk_renorm" if renorm else "softmax_topk",
                  "norm_topk_prob")
        if cfg.model_type == "qwen2_moe":
            draft.put("ffn.shared_experts", 1)
            draft.put("ffn.shared_hidden", cfg.int("shared_expert_intermediate_size"),
                      "shared_expert_intermediate_size")
            draft.put("ffn.shared_gate", True)
        if cfg.int("decoder_sparse_step", 1) != 1:
            cfg.refuse("decoder_sparse_step", "tfgraph puts experts in every layer after "
                       "ffn.dense_layers; experts every n-th layer have no spec form")
        dense = list(cfg.get("mlp_only_layers", []))
        if dense != list(range(len(dense))):
            cfg.refuse("mlp_only_layers", "tfgraph's dense layers are the first ones "
                       "(ffn.dense_layers)")
        if dense:
            draft.put("ffn.dense_layers", len(dense), "mlp_only_layers")
    else:
        draft.put("ffn.experts", cfg.int("num_local_experts"), "num_local_experts")
        draft.put("ffn.router", "softmax_topk_renorm")
    if cfg.model_type == "phimoe":  # nn.LayerNorm (gain and bias) with rms_norm_eps
        draft.put("norm.position", "pre")
        draft.put("norm.kind", "layernorm", "model_type")
        draft.put("norm.eps", cfg.float("rms_norm_eps"), "rms_norm_eps")
        draft.put("norm.final", True)
        where, params = rope_parameters(cfg)
        put_rope(draft, params, where)
    else:
        put_rms_rope(draft, cfg, "pre")
    if cfg.model_type == "granitemoe":
        put_granite_multipliers(draft, cfg)
    # (Phi-MoE: every layer slides when sliding_window is set, PhimoeModel's mask)
    window = None if cfg.model_type in ("olmoe", "granitemoe") \
        else cfg.get("sliding_window", None)
    if cfg.model_type == "qwen3_moe":
        # Qwen3MoeConfig.__post_init__ drops sliding_window unless use_sliding_window; then
        # modeling_qwen3_moe slides every layer by it (one sliding mask, each attention's
        # sliding_window) and never reads max_window_layers; layer_types only shapes its
        # DynamicCache (cache_utils: a sliding cache layer per sliding_attention entry)
        if not cfg.bool("use_sliding_window", False):
            window = None
            cfg.moot("sliding_window")
        types = cfg.get("layer_types", None)
        if window is None and isinstance(types, list) and "sliding_attention" in types:
            # DynamicCache(config=...) builds a sliding cache layer per such entry from
            # config.sliding_window, None here: the model's forward fails
            cfg.refuse("layer_types", "sliding layers without a sliding window "
                       "(use_sliding_window false or sliding_window null): transformers' "
                       "cache for them fails")
        if window is not None and isinstance(types, list) and set(types) != {
                "sliding_attention"}:
            # the mask slides every layer, the cache keeps the full layers' keys whole:
            # cached decoding fails on the first new token (shapes differ)
            cfg.refuse("layer_types", "full layers beside use_sliding_window: transformers "
                       "slides every layer's mask but not their cache, and its cached "
                       "decoding fails")
        cfg.moot("max_window_layers")
        put_windows(draft, None, window, layers)
        return draft
    if qwen and not cfg.bool("use_sliding_window", False):
        window = None
        cfg.moot("max_window_layers")  # transformers reads it only with a sliding window
    if qwen and window:
        cfg.refuse("use_sliding_window", "Qwen-MoE's sliding window follows max_window_layers; "
                   "not imported")
    types = cfg.get("layer_types", None)  # transformers 5 writes one per layer
    if types is not None and set(types) != {"full_attention"}:
        cfg.refuse("layer_types", "sliding layers in a mixture of experts: not imported")
    put_windows(draft, None, window, layers)
    return draft


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads. Mixtral's experts are
    ``intermediate_size`` wide and its router fixed; Qwen2-MoE's dense first layers are
    ``mlp_only_layers`` and its sliding window is never written (not imported)."""
    ffn = spec.ffn
    out = decoder_sizes(spec)
    out["hidden_act"] = gated_activation(spec)
    out["intermediate_size"] = ffn.hidden
    out["num_experts_per_tok"] = ffn.top_k or 1
    out["rms_norm_eps"] = spec.norm.eps
    out["rope_parameters"] = rope_config(spec)
    if (model_type == "phimoe") != (ffn.router == "sparsemixer"):
        return None
    if model_type == "phimoe":
        if spec.norm.kind != "layernorm" or not spec.norm.bias or ffn.dense_layers \
                or ffn.shared_experts or ffn.expert_hidden != ffn.hidden \
                or spec.attention.bias != spec.attention.qkv_bias \
                or spec.attention.out_bias != spec.attention.qkv_bias:
            return None
        del out["rms_norm_eps"]
        return out | {"num_local_experts": ffn.experts or 1, "router_jitter_noise":
                      ffn.router_eps, "input_jitter_noise": 0.0, "rms_norm_eps": spec.norm.eps,
                      "attention_bias": bool(spec.attention.qkv_bias),
                      "lm_head_bias": spec.embedding.output_bias,
                      "sliding_window": spec.attention.window}
    if model_type == "mixtral":
        out["num_local_experts"] = ffn.experts or 1
        out["sliding_window"] = spec.attention.window
        return out
    if model_type == "granitemoe":
        if ffn.router != "topk_softmax" or spec.attention.window is not None:
            return None
        out["num_local_experts"] = ffn.experts or 1
        out["attention_bias"] = spec.attention.bias
        out.update(granite_multipliers(spec))
        return out
    if model_type == "olmoe":
        if ffn.expert_hidden != ffn.hidden or spec.attention.window is not None:
            return None  # OLMoE's experts are intermediate_size wide; no window
        out["num_experts"] = ffn.experts or 1
        out["norm_topk_prob"] = ffn.router == "softmax_topk_renorm"
        out["attention_bias"] = spec.attention.bias
        return out
    out["num_experts"] = ffn.experts or 1
    out["moe_intermediate_size"] = ffn.expert_hidden or ffn.hidden
    out["norm_topk_prob"] = ffn.router == "softmax_topk_renorm"
    if model_type == "qwen3_moe":
        out["attention_bias"] = spec.attention.bias
    else:
        out["qkv_bias"] = True
        out["shared_expert_intermediate_size"] = ffn.shared_hidden or ffn.hidden
    out["decoder_sparse_step"] = 1
    out["mlp_only_layers"] = list(range(ffn.dense_layers or 0))
    out["use_sliding_window"] = False
    return out


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    ffn, src, dst = spec.ffn, "model.layers.{i}", "decoder.layers.{i}"
    assert ffn.expert_hidden is not None
    rows = llama_outer_rows(spec)
    norms = _NORMS
    if cfg.model_type in ("qwen3_moe", "olmoe"):
        norms = norms | {"self_attn.q_norm": "self_attn.q_norm",
                         "self_attn.k_norm": "self_attn.k_norm"}
    dense = [r for r in llama_layer_rows(spec, "model.layers", norms) if ".mlp." not in r.hf]
    rows += dense
    if ffn.dense_layers:  # the first layers' dense feed-forward (hf: mlp.{gate,up,down}_proj)
        rows += [r for r in llama_layer_rows(spec, "model.layers", {}) if ".mlp." in r.hf]
    eh = ffn.expert_hidden
    experts = f"{dst}.ffn.experts"
    # In memory (transformers 5): the router is mlp.gate and each layer's experts are stacked
    # (Granite-MoE: block_sparse_moe.router and block_sparse_moe.experts).
    granite = cfg.model_type == "granitemoe"
    block, router = ("block_sparse_moe", "router") if granite else ("mlp", "gate")
    if cfg.model_type == "phimoe":  # PhimoeSparseMoeBlock.router
        router = "router"
    if spec.embedding.output_bias and spec.embedding.tie_output:  # a tied head's own bias
        rows.append(Rule("lm_head.bias", ("head.bias",)))
    rows += [
        Rule(f"{src}.{block}.{router}.weight", (f"{dst}.ffn.router.weight",),
             layout="memory" if cfg.model_type in ("mixtral", "granitemoe", "phimoe")
             else "both"),
        Rule(f"{src}.{block}.experts.gate_up_proj",
             (f"{experts}.gate.weight", f"{experts}.up.weight"), "split", (eh, eh), axis=1,
             layout="memory"),
        Rule(f"{src}.{block}.experts.down_proj", (f"{experts}.down.weight",), layout="memory"),
    ]
    # On disk (what save_pretrained writes and the hub holds): one matrix per expert, and
    # Mixtral's original module names (transformers.conversion_mapping).
    e = ffn.experts
    assert e is not None
    if cfg.model_type == "granitemoe":  # stacked on disk too, under their own names
        moe = f"{src}.block_sparse_moe"
        return rows + [
            Rule(f"{moe}.router.layer.weight", (f"{dst}.ffn.router.weight",), layout="disk"),
            Rule(f"{moe}.input_linear.weight", (f"{experts}.gate.weight", f"{experts}.up.weight"),
                 "split", (eh, eh), axis=1, layout="disk"),
            Rule(f"{moe}.output_linear.weight", (f"{experts}.down.weight",), layout="disk")]
    if cfg.model_type in ("mixtral", "phimoe"):  # transformers.conversion_mapping
        moe = f"{src}.block_sparse_moe"
        rows.append(Rule(f"{moe}.gate.weight", (f"{dst}.ffn.router.weight",), layout="disk"))
        pieces = {"w1": "gate", "w3": "up", "w2": "down"}
    else:
        moe = f"{src}.mlp"
        pieces = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}
    rows += [Rule(f"{moe}.experts.{{e}}.{theirs}.weight", (f"{experts}.{ours}.weight",),
                  "expert", (e,), layout="disk") for theirs, ours in pieces.items()]
    if ffn.shared_experts:
        for r in ("gate", "up", "down"):
            rows.append(Rule(f"{src}.mlp.shared_expert.{r}_proj.weight",
                             (f"{dst}.ffn.shared.{r}.weight",)))
    if ffn.shared_gate:
        rows.append(Rule(f"{src}.mlp.shared_expert_gate.weight",
                         (f"{dst}.ffn.shared_gate.weight",)))
    return rows
