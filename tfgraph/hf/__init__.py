"""Hugging Face configs as specs (README.md, "tfgraph import").

One small module per family (in the style of mlx-lm's models and litgpt's configs), each with

- ``spec_from_config(cfg: HFConfig) -> SpecDraft``: the config.json as a spec, refusing (exit 2,
  naming the field and value) every setting that changes the computation and that tfgraph
  cannot express exactly;
- ``name_rules(spec, cfg) -> list[Rule]``: the table from Hugging Face parameter names to
  tfgraph's (README.md, "Parameter names"), used both ways by :class:`NameMap`.

``FAMILIES`` maps each supported ``model_type`` to its module; modules are imported when used,
and nothing here imports torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from types import ModuleType
from typing import Any, TypeGuard

from pydantic import BaseModel

from tfgraph.hf.config import ConfigError, HFConfig, SpecDraft
from tfgraph.hf.names import NameMap, NameMapError, Rule
from tfgraph.spec.schema import Spec

__all__ = ["FAMILIES", "ConfigError", "HFConfig", "NameMap", "NameMapError", "Rule",
           "SpecDraft", "draft_from_config", "family", "name_map", "spec_from_config"]

# model_type (config.json) -> module under tfgraph.hf
FAMILIES: dict[str, str] = {
    "gpt2": "gpt2",
    "gpt_neox": "neox",
    "gptj": "gptj",
    "opt": "opt",
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "olmo": "llama",
    "olmo2": "llama",
    "granite": "llama",
    "helium": "llama",
    "seed_oss": "llama",
    "ministral": "llama",
    "arcee": "llama",
    "gemma": "gemma",
    "gemma2": "gemma",
    "gemma3_text": "gemma",
    "mixtral": "moe",
    "qwen2_moe": "moe",
    "qwen3_moe": "moe",
    "olmoe": "moe",
    "granitemoe": "moe",
    "phimoe": "moe",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "phi": "phi",
    "phi3": "phi3",
    "stablelm": "stablelm",
    "starcoder2": "starcoder2",
    "nemotron": "nemotron",
    "bloom": "bloom",
    "gpt_bigcode": "gpt_bigcode",
    "distilbert": "distilbert",
    "cohere": "cohere",
    "cohere2": "cohere",
    "falcon": "falcon",
    "mpt": "mpt",
    "glm": "glm",
    "glm4": "glm",
    "bert": "bert",
    "roberta": "roberta",
    "xlm-roberta": "roberta",
    "modernbert": "modernbert",
    "bart": "bart",
    "marian": "bart",
    "mbart": "bart",
    "pegasus": "bart",
    "t5": "t5",
}

# The model_types whose transformers model builds its token table(s) as
# nn.Embedding(vocab, d, padding_idx=config.pad_token_id) (transformers 5's modeling files):
# the lookups of the pad id pass no gradient to its row, which import states as
# embedding.pad_no_grad. Not GPT-2, GPT-NeoX, GPT-J, BLOOM, GPTBigCode, Falcon, MPT, T5.
PAD_ROW_FAMILIES: frozenset[str] = frozenset(FAMILIES) - {
    "gpt2", "gpt_neox", "gptj", "bloom", "gpt_bigcode", "falcon", "mpt", "t5"}


def family(cfg: HFConfig) -> ModuleType:
    """The module that converts configs of ``cfg``'s model_type."""
    kind = cfg.data.get("model_type")
    if kind is not None and not isinstance(kind, str):
        cfg.refuse("model_type", f"must be a string, one of the {len(FAMILIES)} model types "
                                 "tfgraph imports (README, \"tfgraph import\")", kind)
    if kind not in FAMILIES:
        from tfgraph.hf.strict import closest_family

        cfg.refuse("model_type", f"not one of the {len(FAMILIES)} model types tfgraph imports "
                                 f"(README, \"tfgraph import\"); {closest_family(cfg.data)}",
                   kind)
    return importlib.import_module(f"tfgraph.hf.{FAMILIES[str(kind)]}")


def spec_from_config(data: Mapping[str, Any], name: str | None = None,
                     source: str = "config.json", description: str | None = None) -> Spec:
    """The validated spec of a config.json mapping ``data``; ConfigError when tfgraph cannot
    express it. ``name`` defaults to the model_type."""
    return draft_from_config(data, name, source, description).spec()


_TOKEN_KEYS = (("bos", "bos_token_id", "source"), ("eos", "eos_token_id", "target"),
               ("pad", "pad_token_id", "source"),
               ("decoder_start", "decoder_start_token_id", "target"))


def _token_ids(cfg: HFConfig, spec: Mapping[str, Any]) -> dict[str, Any]:
    """The config's special token ids for the spec's ``tokens``: those that are ids inside the
    vocabulary they index (some published configs name ids past a small vocabulary, or a
    negative pad id: transformers only warns, and they are left out); decoder_start only for
    encoder-decoders. A value that is not an integer (eos: or a list of them) or null is
    refused, as transformers' config classes refuse it (StrictDataclassFieldValidationError)."""
    vocab = spec.get("vocab")
    out: dict[str, Any] = {}
    for name, key, role in _TOKEN_KEYS:
        if name == "decoder_start" and spec.get("arch") != "encoder-decoder":
            continue
        size = vocab.get(role) if isinstance(vocab, dict) else vocab
        value = cfg.data.get(key)
        items = value if isinstance(value, list) and name == "eos" else [value]
        if value is not None and not all(is_token_id(v) for v in items):
            cfg.refuse(key, "a token id is an integer" + (" or a list of integers"
                                                          if name == "eos" else ""))
        if not items or not all(is_token_id(v) and isinstance(size, int) and 0 <= v < size
                                for v in items):
            continue
        out[name] = list(items) if isinstance(value, list) else value
    return out


def _pad_in_every_table(tokens: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """The pad id is a row of every token table (an encoder-decoder's target one too):
    transformers' padding_idx, which it refuses outside the table."""
    pad, vocab = tokens.get("pad"), spec.get("vocab")
    sizes = list(vocab.values()) if isinstance(vocab, dict) else [vocab]
    return is_token_id(pad) and all(isinstance(n, int) and 0 <= pad < n for n in sizes)


def is_token_id(value: Any) -> TypeGuard[int]:
    """An integer, as transformers' config classes type token ids (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool)


def draft_from_config(data: Mapping[str, Any], name: str | None = None,
                      source: str = "config.json", description: str | None = None
                      ) -> SpecDraft:
    """The spec fields a config.json mapping determines (validated), in writing order.

    A refusal raises the first ConfigError with every refusal of the config in its
    ``problems`` (``tfgraph validate --all-errors``): the import stops at a refused key, so
    it is run again without that key (the model_type's default in its place) until it
    passes or refuses something that is not one more key of the file (a key already taken
    out, the spec as a whole): fixing the keys shown fixes the file in one round."""
    problems: list[ConfigError] = []
    current = dict(data)
    while True:
        try:
            draft = _draft(current, data, name, source, description)
        except ConfigError as exc:
            key = exc.key
            # one more key of the file (or one it lacks); not a key taken out (the default in
            # its place was refused: a consequence), nor the spec as a whole
            if not problems or (key is not None and (key in current or key not in data)):
                problems.append(exc)
            if key is None or key not in current or key == "model_type" \
                    or len(problems) > len(data):
                break
            del current[key]
            continue
        if not problems:
            return draft
        break
    first = problems[0]
    first.problems = problems
    raise first


def _draft(data: Mapping[str, Any], original: Mapping[str, Any], name: str | None,
           source: str, description: str | None) -> SpecDraft:
    """:func:`draft_from_config` of ``data`` (``original`` less refused keys) in one pass,
    raising at the first refusal."""
    cfg = HFConfig(data, source)
    try:
        draft: SpecDraft = family(cfg).spec_from_config(cfg)
    except ZeroDivisionError:  # a count of 0 that another size is divided by
        zeros = [k for k, v in cfg.data.items() if v == 0 and not isinstance(v, bool)
                 and any(w in k for w in ("head", "layer", "size", "dim", "expert"))]
        cfg.refuse(zeros[0] if zeros else "num_attention_heads", "must be at least 1")
    from tfgraph.hf.strict import check_unread

    draft.data["name"] = name or cfg.model_type.replace("_", "-")
    key = "dtype" if "dtype" in cfg else "torch_dtype"
    dtype = cfg.get(key, None)
    if dtype is not None:
        draft.put("dtype", cfg.expect(key, ("float32", "float16", "bfloat16"), None,
                                      "tfgraph's dtypes are float32, float16 and bfloat16"),
                  key)
    tokens = _token_ids(cfg, draft.data)
    if tokens:
        draft.data["tokens"] = tokens
    if cfg.model_type in PAD_ROW_FAMILIES and _pad_in_every_table(tokens, draft.data):
        draft.put("embedding.pad_no_grad", True, "pad_token_id")
    if description is None:
        origin = str(original.get("_name_or_path") or "")[:256]
        description = (f"Imported from a Hugging Face config (model_type {cfg.model_type}"
                       + (f", {origin}" if origin else "") + ")")
    draft.data["description"] = description
    check_unread(cfg)  # after every reading above: what is left was ignored
    # Keys in the order a person would write them.
    order = ("name", "description", "arch", "d_model", "layers", "vocab", "max_len",
             "embedding", "attention", "ffn", "norm", "block", "head", "dropout", "dtype")
    draft.data = {k: draft.data[k] for k in order if k in draft.data} | {
        k: v for k, v in draft.data.items() if k not in order}
    for key, value in draft.data.items():  # sections in the spec language's field order
        model = getattr(Spec.model_fields.get(key), "annotation", None)
        if isinstance(value, dict) and isinstance(model, type) and issubclass(model, BaseModel):
            fields = list(model.model_fields)
            draft.data[key] = dict(sorted(value.items(), key=lambda kv: (
                fields.index(kv[0]) if kv[0] in fields else len(fields))))
    draft.spec()
    return draft


def name_map(data: Mapping[str, Any], spec: Spec | None = None) -> NameMap:
    """The parameter-name map of the model a config.json mapping describes."""
    cfg = HFConfig(data)
    if spec is None:
        spec = spec_from_config(data)
    return NameMap(family(cfg).name_rules(spec, cfg))
