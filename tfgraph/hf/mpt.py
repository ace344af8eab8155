"""MPT (MosaicML 2023; MPT-7B, MPT-30B): ALiBi instead of position embeddings, pre-LayerNorm
layers whose norms have a gain and no bias, no bias on any projection (``no_bias``), a fused
``Wqkv`` ([q | k | v], each d_model rows), a 4 x d_model exact-GELU feed-forward, a final norm
and the head tied to the token table.

transformers' MptForCausalLM is the reference, and it reads only part of the config: it always
builds ALiBi with ``alibi_bias_max`` 8 (build_mpt_alibi_tensor's default; the config value is
not passed), always a 4 x d_model MLP, no biases and no q/k LayerNorm. Where MosaicML's own
code would compute something else from a config value (``expansion_ratio``, ``no_bias: false``,
``attn_config.qk_ln``, ``alibi_bias_max``, ``logit_scale``, multi-query attention, ...),
the checkpoint means two different models, so the import refuses it by name. Its slopes
2^(-8 j / n') for n' = 2^ceil(log2 n), taken [odd j, then even j][:n] when n is not a power of
two, are exactly BLOOM's (``tfgraph.graph.ops.alibi_slopes``); its bias j - (L-1) on key j is
BLOOM's j up to a per-row constant, which softmax ignores.
"""

from __future__ import annotations

from typing import Any

from tfgraph.hf.common import head_rows, linear_rows, norm_rows
from tfgraph.hf.config import HFConfig, SpecDraft, put_embedding_dropout
from tfgraph.hf.names import Rule
from tfgraph.hf.strict import _inert
from tfgraph.spec.schema import Spec

# attn_config keys (MptAttentionConfig) and the values transformers' MptAttention computes
# with; None: read (clip_qkv, softmax_scale, attn_pdrop) or inert (kernel choice).
_ATTN_ASSUMED: dict[str, Any] = {
    "attn_type": "multihead_attention", "prefix_lm": False, "qk_ln": False,
    "is_encoder_decoder": False,
    "attn_uses_sequence_id": False, "alibi": True, "alibi_bias_max": 8,
}
_ATTN_READ = {"clip_qkv", "softmax_scale", "attn_pdrop", "attn_impl"}
# attn_impl torch / flash / triton: the same products in other kernels


def _attn_config(cfg: HFConfig) -> dict[str, Any]:
    """attn_config, every key of it honoured, inert or at transformers' value."""
    attn = cfg.get("attn_config", {})
    if not isinstance(attn, dict):
        cfg.refuse("attn_config", "must be a mapping")
    for key, value in attn.items():  # a sub-config: PreTrainedConfig's bookkeeping too
        if key in _ATTN_READ or _inert(key) or value is None:
            continue
        if key not in _ATTN_ASSUMED:
            cfg.refuse(f"attn_config.{key}", "not a key of transformers' MptAttentionConfig, "
                       "and tfgraph does not read it: its effect would be ignored", value)
        want = _ATTN_ASSUMED[key]
        if value != want or type(value) is not type(want):
            cfg.refuse(f"attn_config.{key}", f"transformers' MptAttention computes as if it "
                       f"were {want!r} (MosaicML's code would not), so the checkpoint means two "
                       "models; tfgraph imports MPT as transformers runs it", value)
    return attn


def spec_from_config(cfg: HFConfig) -> SpecDraft:
    draft = SpecDraft(cfg)
    attn = _attn_config(cfg)
    if cfg.int("expansion_ratio", 4) != 4:
        cfg.refuse("expansion_ratio", "transformers' MptMLP is always 4 x d_model wide")
    if not cfg.bool("no_bias", True):
        cfg.refuse("no_bias", "transformers' MPT has no biases (MosaicML's code would add them)")
    if cfg.get("logit_scale", None) is not None:
        cfg.refuse("logit_scale", "transformers' MptForCausalLM does not scale the logits "
                   "(MosaicML's code does), so the model is ambiguous")
    norm_type = cfg.get("norm_type", "low_precision_layernorm")
    if norm_type not in ("low_precision_layernorm", "layernorm"):
        cfg.refuse("norm_type", "transformers' MPT always uses a LayerNorm (low_precision_"
                   "layernorm is the same norm in 16-bit)")
    # learned_pos_emb: MosaicML builds a position table only without ALiBi, which
    # attn_config.alibi (true, checked above) rules out; embedding_fraction only scales the
    # embeddings' gradient (x * f + x.detach() * (1 - f)); init_device: where weights start.
    cfg.moot("learned_pos_emb", "embedding_fraction", "init_device")
    d = cfg.int("d_model")
    draft.put("arch", "decoder-only")
    draft.put("d_model", d, "d_model")
    draft.put("layers", cfg.int("n_layers"), "n_layers")
    draft.put("vocab", cfg.int("vocab_size"), "vocab_size")
    draft.put("max_len", cfg.int("max_seq_len"), "max_seq_len")  # the ALiBi table's length
    draft.put("embedding.positions", "alibi", "attn_config")
    draft.put("embedding.scale", False)
    draft.put("embedding.tie_output", cfg.bool("tie_word_embeddings", True),
              "tie_word_embeddings")
    draft.put("attention.heads", cfg.int("n_heads"), "n_heads")
    draft.put("attention.bias", False, "no_bias")
    if attn.get("softmax_scale") is not None:
        scale = attn["softmax_scale"]
        if isinstance(scale, bool) or not isinstance(scale, (int, float)):
            cfg.refuse("attn_config.softmax_scale", "must be a number", scale)
        draft.put("attention.scale", float(scale), "attn_config")
    if attn.get("clip_qkv") is not None:  # MptAttention: `if self.clip_qkv:` (0 is off)
        clip = attn["clip_qkv"]
        if isinstance(clip, bool) or not isinstance(clip, (int, float)):
            cfg.refuse("attn_config.clip_qkv", "must be a number", clip)
        if clip:
            draft.put("attention.clip_qkv", float(clip), "attn_config")
    draft.put("ffn.hidden", 4 * d, "d_model")
    draft.put("ffn.activation", "gelu", "model_type")  # MptMLP: GELU(approximate="none")
    draft.put("ffn.bias", False, "no_bias")
    draft.put("norm.kind", "layernorm")
    draft.put("norm.bias", False, "model_type")  # norm_1/norm_2/norm_f: bias = None
    draft.put("norm.position", "pre")
    draft.put("norm.eps", cfg.float("layer_norm_epsilon", 1e-5), "layer_norm_epsilon")
    draft.put("norm.final", True)
    put_dropout(draft, cfg, attn)
    return draft


def put_dropout(draft: SpecDraft, cfg: HFConfig, attn: dict[str, Any]) -> None:
    """modeling_mpt reads one rate, attn_config.attn_pdrop, and drops out with it the
    attention weights (MptAttention.attn_dropout_p) and both sublayers' outputs before their
    residual adds (MptBlock.resid_attn_dropout, MptMLP.hidden_dropout): attention.dropout and
    the spec's dropout. It never reads resid_pdrop nor emb_pdrop: nothing after the
    embeddings (embedding.dropout 0)."""
    cfg.moot("resid_pdrop", "emb_pdrop")
    p = attn.get("attn_pdrop", 0)
    if isinstance(p, bool) or not isinstance(p, (int, float)):
        cfg.refuse("attn_config.attn_pdrop", "must be a number", p)
    p = float(p)
    draft.put("dropout", p, "attn_config.attn_pdrop", p)
    if p:
        draft.put("attention.dropout", p, "attn_config.attn_pdrop", p)
    put_embedding_dropout(draft, 0.0, None)


def config_from_spec(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """The config fields :func:`spec_from_config` reads; None for a spec MPT cannot hold."""
    emb = spec.embedding
    if emb.positions != "alibi" or emb.alibi_scaled or emb.alibi_bfloat16 \
            or spec.norm.bias or spec.norm.kind != "layernorm":
        return None
    if spec.attention.dropout != 0:
        # transformers 5.24's MptAttentionConfig types attn_pdrop as an int and refuses 0.1
        # (StrictDataclassFieldValidationError): a folder with one would not load
        return None
    attn: dict[str, Any] = {"alibi": True, "alibi_bias_max": 8, "attn_pdrop": 0,
                            "clip_qkv": spec.attention.clip_qkv,
                            "softmax_scale": spec.attention.scale}
    return {
        "d_model": spec.d_model, "n_layers": spec.layer_count("decoder"),
        "n_heads": spec.attention.heads, "vocab_size": spec.output_vocab,
        "max_seq_len": spec.max_len, "expansion_ratio": 4, "no_bias": True,
        "layer_norm_epsilon": spec.norm.eps, "tie_word_embeddings": spec.embedding.tie_output,
        # resid_pdrop, emb_pdrop: read nowhere by modeling_mpt (put_dropout); a spec with
        # dropout or an embedding dropout other than 0 does not come back from attn_pdrop 0
        "attn_config": attn, "resid_pdrop": spec.dropout, "emb_pdrop": spec.embedding_dropout,
        "logit_scale": None,
    }


def name_rules(spec: Spec, cfg: HFConfig) -> list[Rule]:
    """save_pretrained's names of MptForCausalLM (``transformer.`` in front)."""
    src, dst = "transformer.blocks.{i}", "decoder.layers.{i}"
    d = spec.d_model
    rows = [Rule("transformer.wte.weight", ("embed.tokens.weight",))]
    rows += norm_rows("transformer.norm_f", "decoder.norm", spec)
    rows += head_rows(spec, "lm_head")
    rows.append(Rule(f"{src}.attn.Wqkv.weight",
                     tuple(f"{dst}.self_attn.{r}.weight" for r in "qkv"), "split", (d, d, d)))
    rows += linear_rows(f"{src}.attn.out_proj", f"{dst}.self_attn.o", False)
    rows += linear_rows(f"{src}.ffn.up_proj", f"{dst}.ffn.up", False)
    rows += linear_rows(f"{src}.ffn.down_proj", f"{dst}.ffn.down", False)
    rows += norm_rows(f"{src}.norm_1", f"{dst}.self_attn_norm", spec)
    rows += norm_rows(f"{src}.norm_2", f"{dst}.ffn_norm", spec)
    return rows
