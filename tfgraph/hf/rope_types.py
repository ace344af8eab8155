"""Rotary settings per layer type, read as transformers 5.24 reads them.

Two kinds of family meet ``rope_parameters`` nested by layer type
(``{"full_attention": {...}, "sliding_attention": {...}}``):

- Gemma 3 and ModernBERT, whose rotary embedding builds one table per layer type
  (``Gemma3RotaryEmbedding`` / ``ModernBertRotaryEmbedding`` read
  ``config.rope_parameters[layer_type]``). Their config classes' ``convert_rope_params_to_dict``
  (configuration_gemma3.py, configuration_modernbert.py) start from the nested mapping (a
  default one when config.json has none), update it with a legacy ``rope_scaling``, give a
  missing or null entry ``{"rope_type": "default"}``, fill each entry's missing ``rope_theta``
  from a legacy top-level key (Gemma 3: ``rope_theta`` / ``rope_local_base_freq``; ModernBERT:
  ``global_rope_theta`` / ``local_rope_theta``) or the class's ``default_theta``, then
  ``standardize_rope_params`` (modeling_rope_utils) gives each entry that names one of the
  model's ``layer_types`` its ``rope_type`` (from a legacy ``type``, else default) and, for
  llama3 / yarn / longrope, ``original_max_position_embeddings``. Keys of a flat mapping
  beside (or instead of) the entries are kept, and one is read: ``_compute_yarn_parameters``
  takes every other YaRN setting from the layer type's entry but ``truncate`` from the top
  level (``config.rope_parameters.get("truncate", True)``), so an entry's ``truncate`` (also
  one a legacy ``rope_scaling`` puts there) is never read and a flat one applies to the yarn
  entries: :func:`per_type_rope`.
- Families whose rotary embedding reads one flat mapping (``config.rope_parameters
  ["rope_type"]``) but whose config class declares ``layer_types`` (Qwen2, Qwen3, Qwen2-MoE,
  Gemma 2, Cohere 2, Ministral): there ``standardize_rope_params`` treats entries named after
  layer types as nested and fills nothing at the top level, so a mapping without its own
  ``rope_type`` and ``rope_theta`` fails in the model (tfgraph.hf.config.rope_parameters).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tfgraph.hf.config import NEED_ORIGINAL, HFConfig, yarn_truncate

_KINDS = ("full_attention", "sliding_attention")


def _theta(cfg: HFConfig, key: str, default: float) -> float:
    """A legacy top-level theta as ``kwargs.pop(key, default)`` gives it: a null one is
    None there, which the rotary embedding cannot raise to a power."""
    if key in cfg.data and cfg.data[key] is None:
        cfg.refuse(key, "null: transformers' config class puts None in rope_parameters and the "
                   "model fails")
    return cfg.float(key, default)


def per_type_rope(cfg: HFConfig, legacy: Mapping[str, tuple[str, float]],
                  scaled: Sequence[str], types: Collection[str]) -> dict[str, dict[str, Any]]:
    """{layer type: its standardised rope_parameters entry} for Gemma 3 / ModernBERT (see the
    module docstring). ``legacy``: {layer type: (top-level theta key, class default theta)};
    ``scaled``: the entries a legacy ``rope_scaling`` updates (Gemma 3: full_attention;
    ModernBERT: both); ``types``: the model's layer_types. An entry's ``truncate`` is
    dropped and a yarn entry takes the top level's. Configs transformers' config class
    fails on are refused."""
    given = cfg.get("rope_parameters", None)
    if given is not None and not isinstance(given, Mapping):
        cfg.refuse("rope_parameters", "must be a mapping")
    params: dict[str, Any] = ({kind: {"rope_type": "default"} for kind in _KINDS}
                              if given is None else dict(given))
    scaling = cfg.get("rope_scaling", None)
    if scaling is not None:
        if not isinstance(scaling, Mapping):
            cfg.refuse("rope_scaling", "must be a mapping")
        for kind in scaled:
            if not isinstance(params.get(kind), Mapping):
                cfg.refuse("rope_scaling", f"transformers' config class updates rope_parameters' "
                           f"{kind} entry with it, and fails: rope_parameters has no such "
                           "mapping", scaling)
            params[kind] = dict(params[kind]) | dict(scaling)
    out: dict[str, dict[str, Any]] = {}
    for kind, (key, default) in legacy.items():
        one = params.get(kind)
        if one is None:
            one = {"rope_type": "default"}
        if not isinstance(one, Mapping):
            cfg.refuse("rope_parameters", f"{kind} must be a mapping", given)
        one = dict(one)
        one.pop("truncate", None)  # never read: the top level's is (see the module docstring)
        if "rope_theta" in one:
            cfg.moot(key)  # (popped and dropped by the config class)
        else:
            one["rope_theta"] = _theta(cfg, key, default)
        if kind in types:  # standardize_rope_params: only entries named after layer types
            one.setdefault("rope_type", one.get("type", "default"))
            if one["rope_type"] in NEED_ORIGINAL:
                one.setdefault("original_max_position_embeddings",
                               cfg.as_class("max_position_embeddings"))
            top = given if isinstance(given, Mapping) else {}
            if one["rope_type"] == "yarn" and "truncate" in top:
                one["truncate"] = yarn_truncate(cfg, "rope_parameters", top["truncate"], top)
        out[kind] = one
    return out
