"""Strict import: no config.json key changes the computation without tfgraph reading it.

A family module reads the keys it honours (``HFConfig`` remembers each). Every other key must
be inert (``INERT``: ids, generation defaults, training-only settings, bookkeeping) or hold
the value the family's math assumes, which is the default of transformers' config class for
that model_type (``tfgraph.hf.config_defaults``, generated from transformers and checked
against it by tests/test_hf_strict.py). Anything else is exit 2 naming the key and its value:
a T5 config with ``scale_decoder_outputs: false`` or a Granite config relabelled ``llama``
(``embedding_multiplier`` ...) is refused instead of giving wrong logits without a word.
"""

from __future__ import annotations

from typing import Any

from tfgraph.hf.config import HFConfig
from tfgraph.hf.config_defaults import DEFAULTS
from tfgraph.hf.config_fields import NOT_NULL

# Keys that cannot change an inference forward pass or the weights' shapes: identity and
# bookkeeping, token ids (generation reads them from the folder), generation defaults,
# heads other than the language-model head, and training-only settings (dropout, layer drop,
# initialisation, MoE auxiliary losses and router noise, gradient checkpointing). Inert for
# the logits, not for a training loss: tfgraph.hf.router_loss notes output_router_logits.
INERT = frozenset({
    "_name_or_path", "architectures", "transformers_version", "model_type", "dtype",
    "torch_dtype", "use_cache", "output_attentions", "output_hidden_states", "return_dict",
    "use_return_dict", "torchscript", "use_bfloat16", "tf_legacy_loss", "chunk_size_feed_forward",
    "id2label", "label2id", "num_labels", "problem_type", "finetuning_task", "tokenizer_class",
    "prefix", "task_specific_params", "is_decoder", "output_past",
    "bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id", "sep_token_id",
    "cls_token_id", "mask_token_id", "unk_token_id", "forced_bos_token_id",
    "forced_eos_token_id", "max_length", "min_length", "do_sample", "early_stopping",
    "num_beams", "num_beam_groups", "diversity_penalty", "temperature", "top_k", "top_p",
    "typical_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "encoder_no_repeat_ngram_size", "bad_words_ids", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "remove_invalid_values", "exponential_decay_length_penalty",
    "suppress_tokens", "begin_suppress_tokens", "forced_decoder_ids",
    "initializer_range", "initializer_factor", "init_std", "gradient_checkpointing",
    "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    "router_z_loss_coef", "input_jitter_noise", "classifier_dropout", "summary_type", "summary_use_proj",
    "summary_activation", "summary_proj_to_labels", "summary_first_dropout",
    "encoder_layerdrop", "decoder_layerdrop", "layerdrop",
    # Llama's tensor-parallel split of the projections at pre-training: the same products
    "pretraining_tp",
    # generation settings some configs carry (the cache's layout, not its values)
    "cache_implementation",
})


# Keys that configs written by older transformers carry and today's modeling code of that
# model_type no longer reads (the checkpoints on the hub have them): inert for that family.
LEGACY: dict[str, frozenset[str]] = {
    "bart": frozenset({"add_bias_logits", "add_final_layer_norm", "normalize_before",
                       "normalize_embedding", "static_position_embeddings",
                       "extra_pos_embeddings", "force_bos_token_to_be_generated",
                       "num_hidden_layers"}),
    "t5": frozenset({"n_positions"}),
    "gpt2": frozenset({"n_ctx"}),  # the context length's old name; n_positions is read
    "gptj": frozenset({"n_ctx", "rotary", "scale_attn_weights"}),  # always rotary, scaled
    "gemma": frozenset({"hidden_activation"}),  # Gemma reads hidden_act
    "gemma2": frozenset({"hidden_act"}),  # Gemma 2 reads hidden_activation
    # MosaicML's hub configs (mpt-7b): its remote-code classes, weight init, the tokenizer's
    # name and a logging level; transformers' MptConfig has none of them
    "mpt": frozenset({"auto_map", "init_config", "tokenizer_name", "verbose"}),
    # DeepSeek's own modeling code (the hub's configs): expert-parallel size and the training
    # losses' settings
    "deepseek_v2": frozenset({"ep_size", "aux_loss_alpha", "seq_aux"}),
    "deepseek_v3": frozenset({"ep_size", "aux_loss_alpha", "seq_aux"}),
}
LEGACY["marian"] = LEGACY["bart"]
# ModernBERT configs written by transformers 4.4x: modeling_modernbert reads norm_eps, not
# layer_norm_eps; absolute positions were never read (rotary); compiling the forward and
# re-padding logits after unpadding change neither the math nor the logits.
LEGACY["modernbert"] = frozenset({"layer_norm_eps", "position_embedding_type",
                                  "reference_compile", "repad_logits_with_grad"})


def _inert(key: str) -> bool:
    """Dropout rates: the forward of a trained model for inference ignores them. Those a
    family reads into the spec (its residual ``dropout``, ``attention.dropout``) are in
    ``HFConfig.read`` before check_unread asks; the rest are training settings the spec
    does not carry."""
    return key in INERT or "dropout" in key or key.endswith("_pdrop") or key.startswith("_")


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default or value == default and type(value) is type(default)
    return bool(value == default)


def check_unread(cfg: HFConfig) -> None:
    """Refuse (exit 2, naming the key) a key the family did not read that is not inert and
    differs from what its model_type's math assumes, or that model_type does not have."""
    assumed = DEFAULTS.get(cfg.model_type, {})
    legacy = LEGACY.get(cfg.model_type, frozenset())
    for key, value in cfg.data.items():
        if value is None and key in NOT_NULL.get(cfg.model_type, ()):  # read or not
            cfg.refuse(key, f"transformers' {cfg.model_type} config class refuses a null "
                            "here: it needs a value")
        if key in cfg.read or _inert(key) or key in legacy or value is None:
            continue
        if key not in assumed:
            cfg.refuse(key, f"not a key of transformers' {cfg.model_type} config, and "
                            "tfgraph does not read it: its effect would be ignored")
        if not _same(value, assumed[key]):
            cfg.refuse(key, f"tfgraph's {cfg.model_type} import computes as if it were "
                            f"{assumed[key]!r} and does not read it: the logits would be "
                            "wrong")


def closest_family(data: dict[str, Any]) -> str:
    """For a model_type tfgraph does not import: the supported one whose config keys overlap
    ``data``'s most, and the keys of ``data`` it lacks (what the new family adds)."""
    keys = {k for k in data if not _inert(k)}
    if not keys:
        return "its config has no keys to compare with the supported families"

    def overlap(model_type: str) -> float:
        theirs = set(DEFAULTS[model_type])
        return len(keys & theirs) / len(keys | theirs)

    best = max(sorted(DEFAULTS), key=overlap)
    missing = sorted(keys - set(DEFAULTS[best]))
    shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
    return (f"the closest is {best}, which lacks {shown}" if missing
            else f"the closest is {best}, whose keys it shares")

