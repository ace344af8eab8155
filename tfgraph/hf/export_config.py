"""A spec as a Hugging Face ``config.json``: the config half of ``tfgraph build SPEC --to hf``.

Each family module writes the config fields its ``spec_from_config`` reads
(``config_from_spec``). :func:`hf_config` tries the families that could hold the spec, most
likely first, and accepts one only when importing its config gives back the very spec
(``name`` and ``description`` aside): the importer is the one place that knows what each
config field means to transformers, so the round trip, not the writer, is what makes an
export exact. A spec no family holds is a one-line error naming the closest family and the
first field it would change.

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.hf import FAMILIES, ConfigError, spec_from_config
from tfgraph.hf.config_fields import NOT_NULL
from tfgraph.spec.schema import Spec

# model_type -> the transformers class of the checkpoint (config.json "architectures")
ARCHITECTURES: dict[str, str] = {
    "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM",
    "phi3": "Phi3ForCausalLM", "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM", "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gpt_neox": "GPTNeoXForCausalLM", "gptj": "GPTJForCausalLM", "opt": "OPTForCausalLM",
    "phi": "PhiForCausalLM", "stablelm": "StableLmForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM", "nemotron": "NemotronForCausalLM",
    "granite": "GraniteForCausalLM", "bloom": "BloomForCausalLM",
    "gpt_bigcode": "GPTBigCodeForCausalLM", "distilbert": "DistilBertForMaskedLM",
    "cohere": "CohereForCausalLM", "mbart": "MBartForConditionalGeneration",
    "pegasus": "PegasusForConditionalGeneration", "falcon": "FalconForCausalLM",
    "glm": "GlmForCausalLM", "glm4": "Glm4ForCausalLM", "helium": "HeliumForCausalLM",
    "seed_oss": "SeedOssForCausalLM", "ministral": "MinistralForCausalLM",
    "arcee": "ArceeForCausalLM", "granitemoe": "GraniteMoeForCausalLM",
    "mpt": "MptForCausalLM", "olmo": "OlmoForCausalLM",
    "cohere2": "Cohere2ForCausalLM", "phimoe": "PhimoeForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM", "deepseek_v3": "DeepseekV3ForCausalLM",
    "bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM",
    "xlm-roberta": "XLMRobertaForMaskedLM", "modernbert": "ModernBertForMaskedLM",
    "bart": "BartForConditionalGeneration", "marian": "MarianMTModel",
    "t5": "T5ForConditionalGeneration",
}

# The families tried for each arch, in order of preference where two hold the same spec: the
# plain Llama before its relatives (a Llama spec is also a Mistral without a window and a
# Phi-3), BART before Marian.
PREFERENCE: dict[str, tuple[str, ...]] = {
    "decoder-only": ("llama", "mistral", "qwen2", "qwen3", "olmo2", "phi3", "gemma", "gemma2",
                     "gemma3_text", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "gpt2",
                     "gpt_neox", "gptj", "opt", "phi", "stablelm", "starcoder2", "nemotron",
                     "granite", "bloom", "gpt_bigcode", "cohere", "falcon", "glm", "glm4",
                     "helium", "seed_oss", "ministral", "arcee", "granitemoe", "mpt", "olmo",
                     "cohere2", "phimoe", "deepseek_v3", "deepseek_v2"),
    "encoder-only": ("bert", "distilbert", "roberta", "xlm-roberta", "modernbert"),
    "encoder-decoder": ("bart", "marian", "t5", "mbart", "pegasus"),
}

AUTO_CLASSES: dict[str, str] = {
    "decoder-only": "AutoModelForCausalLM",
    "encoder-only": "AutoModelForMaskedLM",
    "encoder-decoder": "AutoModelForSeq2SeqLM",
}

_IGNORED = {"name", "description"}
# After validation attention.bias is only the default that qkv_bias and out_bias (compared)
# were resolved from: a Qwen2 spec written with bias false and one imported with bias true
# build the same model.
_RESOLVED = {"attention": {"bias"}}
# Values that are one computation: softmax over the top-k logits is the full softmax's top k
# renormalized (exp(l_i) / sum over the top k of exp(l_j) either way; Mixtral's router).
_SAME = {"ffn.router": ({"topk_softmax", "softmax_topk_renorm"},)}


def _no_length(dump: Mapping[str, Any]) -> bool:
    """A rotary spec dump without max_len: it states no context length, and every rotary
    family's config.json has one (the config class's default when left out), which bounds
    nothing transformers' rotary models compute (the frequencies are computed for any
    position; a rotary scaling that needs the pretraining length holds it in the spec), so
    the max_len read back is no difference. (Learned and sinusoidal tables, ALiBi built to
    a length: there it is a bound.)"""
    embedding = dump.get("embedding")
    return dump.get("max_len") is None and isinstance(embedding, Mapping) and \
        embedding.get("positions") == "rope"


# `tfgraph import` writes "model_type X" into the description
_IMPORTED = re.compile(r"\bmodel_type ([a-z0-9_-]+)")  # xlm-roberta has a hyphen


@dataclass(frozen=True)
class HFExport:
    """A spec as transformers sees it."""

    model_type: str
    config: dict[str, Any]
    """JSON-ready config.json content: ``model_type``, ``architectures``, ``dtype`` (the key
    transformers 5 writes), ``tie_word_embeddings`` and the family's fields."""
    auto_class: str
    """The transformers auto class that builds the model: AutoModelForCausalLM,
    AutoModelForSeq2SeqLM or AutoModelForMaskedLM."""


def candidates(spec: Spec) -> list[str]:
    """The model_types to try for ``spec``, in order: the one it was imported from (named in
    its description or name) first, so an imported Phi-3 exports as Phi-3 rather than as the
    Llama with the same computation, then the arch's preference order."""
    order = list(PREFERENCE[spec.arch])
    hints = _IMPORTED.findall(spec.description) + [spec.name, spec.name.replace("-", "_")]
    for hint in reversed(hints):
        if hint in order:
            order.remove(hint)
            order.insert(0, hint)
    return order


def family_config(spec: Spec, model_type: str) -> dict[str, Any] | None:
    """``model_type``'s config.json for ``spec`` (not yet checked), or None when the family
    says it cannot hold the spec."""
    module = importlib.import_module(f"tfgraph.hf.{FAMILIES[model_type]}")
    fields: dict[str, Any] | None = module.config_from_spec(spec, model_type)
    if fields is None:
        return None
    config: dict[str, Any] = {"architectures": [ARCHITECTURES[model_type]],
                              "model_type": model_type}
    # a field the spec has no value for (a rotary spec's max_len) is left out where the
    # config class refuses a null: transformers then takes its own default
    not_null = NOT_NULL.get(model_type, ())
    config |= {k: v for k, v in fields.items() if v is not None or k not in not_null}
    config.setdefault("tie_word_embeddings", spec.embedding.tie_output)
    config["dtype"] = spec.dtype
    # the spec's token ids, each written (None when it has none: the config class's own
    # defaults may lie outside a small vocabulary and would come back as the spec's)
    tokens = spec.tokens
    config["bos_token_id"] = tokens.bos if tokens else None
    config["eos_token_id"] = tokens.eos if tokens else None
    if not getattr(module, "READS_PAD", False):  # RoBERTa's positions read the family's own
        config["pad_token_id"] = tokens.pad if tokens else None
    if spec.arch == "encoder-decoder":
        config["decoder_start_token_id"] = tokens.decoder_start if tokens else None
    for key in getattr(module, "OTHER_TOKEN_KEYS", ()):  # ids the spec language has none of
        config[key] = None
    return config


def differences(ours: Mapping[str, Any], theirs: Mapping[str, Any], prefix: str = ""
                ) -> list[tuple[str, Any, Any]]:
    """(dotted field, ours, theirs) for each field of two spec dumps that differs, in the spec
    language's field order; name, description and attention.bias (see ``_RESOLVED``) aside.
    A field only one dump has (the optional ones dumps leave out: ``embedding.dropout``,
    ``attention.dropout`` at 0, ``tokens``) differs too, as None on the side without it."""
    out: list[tuple[str, Any, Any]] = []
    keys = list(ours) + [k for k in theirs if k not in ours]
    for key in keys:
        value = ours.get(key)
        if not prefix and key in _IGNORED or key in _RESOLVED.get(prefix.rstrip("."), ()):
            continue
        if not prefix and key == "max_len" and _no_length(ours):
            continue
        other = theirs.get(key)
        if isinstance(value, Mapping) and isinstance(other, Mapping):
            out += differences(value, other, f"{prefix}{key}.")
        elif value != other and not any({value, other} <= group for group in
                                         _SAME.get(f"{prefix}{key}", ())):
            out.append((f"{prefix}{key}", value, other))
    return out


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _round_trip(spec: Spec, config: Mapping[str, Any]) -> str | list[tuple[str, Any, Any]]:
    """What importing ``config`` changes in ``spec``: the differing fields (none: exact), or
    the import's refusal."""
    try:
        back = spec_from_config(config, name=spec.name, source="exported config.json",
                                description=spec.description)
    except ConfigError as exc:
        return str(exc)
    return differences(spec.model_dump(), back.model_dump())


def hf_config(spec: Spec) -> HFExport:
    """``spec`` as the config.json of the first family whose config imports back to it;
    TfgraphError naming the closest family and the first differing field when none does."""
    closest: tuple[int, str, str] | None = None  # (fields that differ, model_type, why)
    for model_type in candidates(spec):
        config = family_config(spec, model_type)
        if config is None:
            continue
        result = _round_trip(spec, config)
        if isinstance(result, str):  # the family's own config refused: farthest of all
            rank, why = 1 << 30, result
        elif not result:
            return HFExport(model_type, config, AUTO_CLASSES[spec.arch])
        else:
            (path, ours, theirs), rank = result[0], len(result)
            why = f"differs in {path}: {_show(ours)} vs {_show(theirs)}"
            if path == "embedding.pad_no_grad":  # left out of the dump when false
                why = (f"differs in {path}: false vs true ({model_type}'s token table gives "
                       "the tokens.pad row no gradient from the lookups: set "
                       f"{path}: true, or remove tokens.pad)")
        if closest is None or rank < closest[0]:
            closest = (rank, model_type, why)
    detail = f"closest: {closest[1]}; {closest[2]}" if closest else f"none for {spec.arch}"
    raise TfgraphError(f"{spec.name}: no Hugging Face family expresses this spec ({detail})")


# Token ids: the spec's (``tokens``, family_config), else carried over from the folder a
# model came from; without either, unknown (None), not the family class's defaults, which may
# lie outside a small vocabulary.
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id",
              "forced_bos_token_id", "forced_eos_token_id", "sep_token_id", "cls_token_id")


def hf_folder_facts(spec: Spec, source_config: Mapping[str, Any] | None = None
                    ) -> tuple[dict[str, Any], Any]:
    """What ``tfgraph build --to hf`` writes for ``spec`` besides the weights: config.json
    (``hf_config``, with ``source_config``'s token ids kept) and the family's parameter-name
    map (tfgraph.hf.names.NameMap) the weights are written in. TfgraphError when no family
    expresses the spec."""
    from tfgraph.hf import name_map

    config = dict(hf_config(spec).config)
    for key in TOKEN_KEYS:
        if source_config is not None and key in source_config:
            config[key] = source_config[key]
        elif key in ("bos_token_id", "eos_token_id"):
            config.setdefault(key, None)
    return config, name_map(config, spec)
