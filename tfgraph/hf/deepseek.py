"""DeepSeek-V2 and DeepSeek-V3 (DeepSeek-AI 2024, arXiv:2405.04434 and arXiv:2412.19437):
Llama-style pre-norm decoders with multi-head latent attention (``attention.latent``) and a
mixture of experts with shared experts after ``first_k_dense_replace`` dense layers.

Attention (transformers' DeepseekV2Attention / DeepseekV3Attention): queries through a
``q_lora_rank`` latent (``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``) or one ``q_proj`` when
it is null (V2-Lite); ``kv_a_proj_with_mqa`` gives the ``kv_lora_rank`` latent
(``kv_a_layernorm``) and the shared ``qk_rope_head_dim`` rotary key; ``kv_b_proj`` expands the
latent per head. Rotary pairs are interleaved: V2 rotates complex pairs (2i, 2i+1), V3 with
``rope_interleave`` (its default) the same pairs (it writes the rotated channels de-interleaved,
for q and k alike, which leaves every score unchanged); ``rope_interleave: false`` is
rotate-half. The score scale is qk_head_dim^-0.5, times mscale(factor, mscale_all_dim)^2
under a scaled rope with mscale_all_dim (``yarn_apply_mscale``).

Routing: V3 scores experts with a sigmoid, chooses them by score + ``e_score_correction_bias``
(a buffer in transformers, a tensor of the checkpoint: tfgraph's
``ffn.router.correction_bias`` parameter) within the ``topk_group`` best of ``n_group`` groups,
weights them by their score (renormalised with ``norm_topk_prob``) times
``routed_scaling_factor``. V2 takes a softmax, greedy or group_limited_greedy, times
routed_scaling_factor; it never renormalises (its router does not read ``norm_topk_prob``).
"""

from __future__ import annotations

import math
from typing import Any

from tfgraph.hf.common import llama_outer_rows, linear_rows, norm_rows, put_decoder_sizes
from tfgraph.hf.config import HFConfig, SpecDraft, activation, put_rope, rope_parameters
from tfgraph.hf.export_common import decoder_sizes, gated_activation
from tfgraph.hf.export_common import rope_parameters as rope_config
from tfgraph.hf.names import Rule
from tfgraph.spec.schema import Spec


def _mscale(factor: float, m: float) -> float:
    """DeepSeek's yarn_get_mscale: 0.1 m ln(factor) + 1 for a factor above 1, else 1."""
    return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0


def softmax_scale(qk_head_dim: int, rope: dict[str, Any]) -> float:
    """transformers' ``yarn_apply_mscale``: qk_head_dim^-0.5, times mscale(factor,
    mscale_all_dim)^2 for a scaled rope with a non-zero mscale_all_dim."""
    scale = qk_head_dim ** -0.5
    if rope.get("rope_type", "default") != "default" and rope.get("mscale_all_dim"):
        m = _mscale(float(rope["factor"]), float(rope["mscale_all_dim"]))
        scale = scale * m * m
    return scale


# modeling_deepseek_v2 / _v3 build q_a_layernorm and kv_a_layernorm as DeepseekV*RMSNorm(width)
# with its default eps, not rms_norm_eps
_LATENT_EPS = 1e-6


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    v3 = cfg.model_type == "deepseek_v3"
    put_decoder_sizes(draft, cfg, head_dim_field="qk_head_dim")
    heads = cfg.int("num_attention_heads")
    if cfg.int("num_key_value_heads", heads) != heads:
        cfg.refuse("num_key_value_heads", "latent attention expands its keys and values per "
                   "query head: num_key_value_heads must be num_attention_heads")
    nope, rope = cfg.int("qk_nope_head_dim"), cfg.int("qk_rope_head_dim")
    qk = nope + rope
    draft.put("attention.head_dim", qk, "qk_nope_head_dim")
    if cfg.int("qk_head_dim", qk) != qk:
        cfg.refuse("qk_head_dim", f"must be qk_nope_head_dim + qk_rope_head_dim = {qk}")
    if cfg.int("head_dim", rope) != rope:  # the config class sets it to qk_rope_head_dim
        cfg.refuse("head_dim", f"DeepSeek's rotary width is qk_rope_head_dim = {rope}")
    if cfg.bool("attention_bias", False):
        cfg.refuse("attention_bias", "biases on latent attention's projections are not "
                   "imported")
    draft.put("attention.bias", False)
    # field by field, so that a size the spec refuses names its own config field
    draft.put("attention.latent.kv_rank", cfg.int("kv_lora_rank"), "kv_lora_rank")
    draft.put("attention.latent.rope_dim", rope, "qk_rope_head_dim")
    draft.put("attention.latent.v_head_dim", cfg.int("v_head_dim"), "v_head_dim")
    if cfg.get("q_lora_rank", None) is not None:  # absent: the class's 1536; null: none
        draft.put("attention.latent.q_rank", cfg.int("q_lora_rank"), "q_lora_rank")
    where, params = rope_parameters(cfg)
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        for key in ("factor", "mscale_all_dim"):  # read as numbers by softmax_scale now,
            # before the spec checks the rotary scaling
            value = params.get(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value):
                cfg.refuse(where, f"{key} must be a finite number (mscale_all_dim scales "
                           "the softmax by the yarn factor)", cfg.data.get(where, params))
    scale = softmax_scale(qk, params)
    if scale != qk ** -0.5:  # yarn's mscale_all_dim^2 (the default is qk_head_dim^-0.5)
        draft.put("attention.scale", scale, "rope_parameters")
    draft.put("norm.position", "pre")
    draft.put("norm.kind", "rmsnorm")
    eps = cfg.float("rms_norm_eps")
    draft.put("norm.eps", eps, "rms_norm_eps")
    if eps != _LATENT_EPS:
        draft.put("attention.latent.norm_eps", _LATENT_EPS, "model_type")
    draft.put("norm.final", True)
    put_rope(draft, params, where)
    interleaved = cfg.bool("rope_interleave", True) if v3 else True
    draft.put("embedding.rotary_layout", "interleaved" if interleaved else "half",
              "rope_interleave" if v3 else None)
    # feed-forward: dense first layers, then routed experts and the shared ones
    draft.put("ffn.activation", activation(cfg, "hidden_act", gated=True, default="silu"),
              "hidden_act")
    if not v3 and cfg.bool("mlp_bias", False):
        cfg.refuse("mlp_bias", "DeepSeek's experts have no biases; not imported")
    draft.put("ffn.bias", False)
    draft.put("ffn.hidden", cfg.int("intermediate_size"), "intermediate_size")
    draft.put("ffn.experts", cfg.int("n_routed_experts"), "n_routed_experts")
    draft.put("ffn.top_k", cfg.int("num_experts_per_tok"), "num_experts_per_tok")
    draft.put("ffn.expert_hidden", cfg.int("moe_intermediate_size"), "moe_intermediate_size")
    shared = cfg.int("n_shared_experts")
    if shared < 1:  # transformers builds an MLP of moe_intermediate_size * n_shared_experts
        cfg.refuse("n_shared_experts", "DeepSeek always has a shared-expert MLP; 0 is not "
                   "a model transformers builds")
    draft.put("ffn.shared_experts", shared, "n_shared_experts")
    dense = cfg.int("first_k_dense_replace", 0)  # absent: the class's (V3 3, V2 0)
    if dense:
        draft.put("ffn.dense_layers", dense, "first_k_dense_replace")
    scale = cfg.float("routed_scaling_factor")
    if scale != 1.0:
        draft.put("ffn.router_scale", scale, "routed_scaling_factor")
    if v3:
        renorm = cfg.bool("norm_topk_prob", True)
        draft.put("ffn.router", "sigmoid_topk_renorm" if renorm else "sigmoid_topk",
                  "norm_topk_prob")
        groups, top = cfg.int("n_group"), cfg.int("topk_group")
    else:
        cfg.moot("norm_topk_prob")  # DeepseekV2TopkRouter never reads it
        draft.put("ffn.router", "softmax_topk")
        method = cfg.expect("topk_method", ("greedy", "group_limited_greedy"), "greedy",
                            "DeepSeek-V2's routers are greedy and group_limited_greedy")
        if method == "greedy":
            cfg.moot("n_group", "topk_group")
            groups = top = 1
        else:
            groups, top = cfg.int("n_group"), cfg.int("topk_group")
    if groups != 1:
        draft.put("ffn.router_groups", groups, "n_group")
        draft.put("ffn.router_top_groups", top, "topk_group")
    if v3:
        cfg.moot("num_nextn_predict_layers")  # multi-token prediction: not in the model
    _hub_keys(cfg, v3)
    return draft


def _hub_keys(cfg: HFConfig, v3: bool) -> None:
    """Keys the hub's configs carry from DeepSeek's own modeling code (trust_remote_code),
    which transformers' classes no longer have: each must say what transformers computes."""
    scoring = "sigmoid" if v3 else "softmax"
    cfg.expect("scoring_func", (scoring,), scoring,
               "transformers' DeepSeek-V3 scores experts with a sigmoid, V2 with a softmax")
    if v3:
        cfg.expect("topk_method", ("noaux_tc",), "noaux_tc",
                   "transformers' DeepSeek-V3 routes with noaux_tc (bias-corrected choice)")
    if cfg.int("moe_layer_freq", 1) != 1:
        cfg.refuse("moe_layer_freq", "experts every n-th layer have no spec form (tfgraph's "
                   "experts are in every layer after ffn.dense_layers)")


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads, or None when the spec is not a
    DeepSeek model of ``model_type``."""
    att, ffn, lat = spec.attention, spec.ffn, spec.attention.latent
    v3 = model_type == "deepseek_v3"
    if lat is None or ffn.experts is None or not ffn.shared_experts or att.out_bias:
        return None
    assert att.head_dim is not None and ffn.expert_hidden is not None
    if ffn.shared_hidden != ffn.shared_experts * ffn.expert_hidden or ffn.shared_gate:
        return None
    if ffn.router not in (("sigmoid_topk", "sigmoid_topk_renorm") if v3 else ("softmax_topk",)):
        return None
    if spec.norm.position != "pre" or spec.norm.kind != "rmsnorm" or spec.norm.unit_offset \
            or spec.embedding.multiplier is not None or spec.block.residual_scale is not None \
            or spec.head.softcap is not None or spec.embedding.tie_output:
        return None
    if not v3 and spec.embedding.rotary_layout != "interleaved":
        return None
    out = decoder_sizes(spec)
    out.pop("head_dim", None)
    rope = rope_config(spec)
    scale = att.head_dim ** -0.5 if att.scale is None else att.scale  # the spec's default
    if not math.isclose(scale, softmax_scale(att.head_dim, rope), rel_tol=1e-12):
        return None
    out.update(qk_nope_head_dim=att.head_dim - lat.rope_dim, qk_rope_head_dim=lat.rope_dim,
               v_head_dim=lat.v_head_dim, kv_lora_rank=lat.kv_rank, q_lora_rank=lat.q_rank,
               attention_bias=False, hidden_act=gated_activation(spec),
               intermediate_size=ffn.hidden, moe_intermediate_size=ffn.expert_hidden,
               n_routed_experts=ffn.experts, num_experts_per_tok=ffn.top_k,
               n_shared_experts=ffn.shared_experts, first_k_dense_replace=ffn.dense_layers,
               routed_scaling_factor=ffn.router_scale, rms_norm_eps=spec.norm.eps,
               rope_parameters=rope)
    groups = ffn.router_groups or 1
    if v3:
        out.update(norm_topk_prob=ffn.router == "sigmoid_topk_renorm", n_group=groups,
                   topk_group=ffn.router_top_groups,
                   rope_interleave=spec.embedding.rotary_layout == "interleaved")
    else:
        out.update(topk_method="greedy" if groups == 1 else "group_limited_greedy",
                   n_group=groups if groups > 1 else None,
                   topk_group=ffn.router_top_groups if groups > 1 else None)
    return out


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    ffn, lat = spec.ffn, spec.attention.latent
    assert lat is not None and ffn.expert_hidden is not None and ffn.experts is not None
    src, dst = "model.layers.{i}", "decoder.layers.{i}"
    att, ours = f"{src}.self_attn", f"{dst}.self_attn"
    rows = llama_outer_rows(spec)
    if lat.q_rank is not None:
        rows += [Rule(f"{att}.q_a_proj.weight", (f"{ours}.q_a.weight",)),
                 Rule(f"{att}.q_a_layernorm.weight", (f"{ours}.q_a_norm.weight",)),
                 Rule(f"{att}.q_b_proj.weight", (f"{ours}.q_b.weight",))]
    else:
        rows.append(Rule(f"{att}.q_proj.weight", (f"{ours}.q.weight",)))
    rows += [Rule(f"{att}.kv_a_proj_with_mqa.weight", (f"{ours}.kv_a.weight",)),
             Rule(f"{att}.kv_a_layernorm.weight", (f"{ours}.kv_a_norm.weight",)),
             Rule(f"{att}.kv_b_proj.weight", (f"{ours}.kv_b.weight",)),
             Rule(f"{att}.o_proj.weight", (f"{ours}.o.weight",))]
    rows += norm_rows(f"{src}.input_layernorm", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{src}.post_attention_layernorm", f"{dst}.ffn_norm", spec)
    # the first dense layers' MLP (mlp.{gate,up,down}_proj), the later layers' router,
    # routed experts and shared experts (mlp.gate, mlp.experts, mlp.shared_experts)
    mlp, eh, e = f"{src}.mlp", ffn.expert_hidden, ffn.experts
    if ffn.dense_layers:
        for r in ("gate", "up", "down"):
            rows += linear_rows(f"{mlp}.{r}_proj", f"{dst}.ffn.{r}", False)
    experts = f"{dst}.ffn.experts"
    rows += [Rule(f"{mlp}.gate.weight", (f"{dst}.ffn.router.weight",)),
             Rule(f"{mlp}.experts.gate_up_proj",
                  (f"{experts}.gate.weight", f"{experts}.up.weight"), "split", (eh, eh),
                  axis=1, layout="memory"),
             Rule(f"{mlp}.experts.down_proj", (f"{experts}.down.weight",), layout="memory")]
    rows += [Rule(f"{mlp}.experts.{{e}}.{theirs}_proj.weight", (f"{experts}.{theirs}.weight",),
                  "expert", (e,), layout="disk") for theirs in ("gate", "up", "down")]
    rows += [Rule(f"{mlp}.shared_experts.{r}_proj.weight", (f"{dst}.ffn.shared.{r}.weight",))
             for r in ("gate", "up", "down")]
    if str(ffn.router).startswith("sigmoid"):  # V3's e_score_correction_bias (a buffer)
        rows.append(Rule(f"{mlp}.gate.e_score_correction_bias",
                         (f"{dst}.ffn.router.correction_bias",)))
    return rows
