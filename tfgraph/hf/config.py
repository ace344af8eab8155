"""Reading a Hugging Face ``config.json`` into a spec, field by field (README.md, "tfgraph import").

Two small classes carry the rules every family module follows:

- :class:`HFConfig` reads fields with their defaults and refuses, naming the field and its
  value, anything tfgraph cannot compute exactly (never a silent approximation);
- :class:`SpecDraft` collects the spec's fields and remembers which config field each came
  from, so when the spec language lacks a field or a value (a feature not in this tfgraph),
  the error names the config field that asked for it instead of a spec path the user never
  wrote.

Shared readings live here too: rotary settings (``rope_parameters`` of transformers >= 5 and
the older ``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor``) and activations.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from pydantic import ValidationError

from tfgraph.errors import TfgraphError
from tfgraph.hf.config_defaults import DEFAULTS
from tfgraph.hf.config_fields import ABSENT, KEEPS_NULL, NOT_NULL
from tfgraph.spec.schema import Spec

_MISSING: Any = object()


class ConfigError(TfgraphError):
    """A config.json tfgraph cannot import: ``source: field = value: why`` (exit 2).
    ``key``: the config key refused (None: the spec as a whole); ``problems``: every
    refusal found in the config, this one first (``tfgraph validate --all-errors``)."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.problems: list[ConfigError] = [self]


def _show(value: Any) -> str:
    try:
        text = json.dumps(value, sort_keys=True) if not isinstance(value, str) else repr(value)
    except ValueError:  # an int of more digits than Python converts to text (4,300)
        return "(a number too long to show)"
    return text if len(text) <= 120 else text[:117] + "..."


class HFConfig:
    """A config.json mapping, read one field at a time by a family module."""

    def __init__(self, data: Mapping[str, Any], source: str = "config.json") -> None:
        self.data = dict(data)
        self.source = source
        kind = data.get("model_type", "")
        self.model_type = kind if isinstance(kind, str) else ""
        # every key a family looked at (tfgraph.hf.strict refuses the others that matter)
        self.read: set[str] = {"model_type"}

    def __contains__(self, key: str) -> bool:
        self.read.add(key)
        return key in self.data

    def class_default(self, key: str, fallback: Any = None) -> Any:
        """The default of ``key`` in transformers' config class of this model_type (what the
        model uses when config.json lacks the key), else ``fallback``. Only for keys whose
        class default is a constant, not derived from other keys (head_dim, layer_types)."""
        return DEFAULTS.get(self.model_type, {}).get(key, fallback)

    def absent(self, key: str) -> Any:
        """What transformers' config class of this model_type starts from when config.json
        lacks ``key``: its field's default (Qwen3's head_dim 128, DeepSeek-V3's
        first_k_dense_replace 3), before ``__post_init__``; None where the class derives it
        from other keys (Llama's head_dim) or has no such field (tfgraph.hf.config_fields)."""
        starts = ABSENT.get(self.model_type, {})
        return starts[key] if key in starts else DEFAULTS.get(self.model_type, {}).get(key)

    def keeps_none(self, key: str) -> bool:
        """True when transformers' config object ends up with None for ``key``: a null the
        class keeps (or a key it does not declare, which it stores as given), or an absent
        key whose field defaults to None and is not derived (Ministral's head_dim). The
        family's model then reads None itself (``getattr(config, "head_dim", ...)`` gets
        None, not its fallback)."""
        self.read.add(key)
        kept = key in KEEPS_NULL.get(self.model_type, ())
        if key in self.data:
            return self.data[key] is None and (
                kept or key not in DEFAULTS.get(self.model_type, {}))
        return kept and self.absent(key) is None

    def as_class(self, key: str) -> Any:
        """``key``'s value as transformers' config class receives it: the config's own (null
        included: a null softcap is no softcap) when present, else the class's start
        (:meth:`absent`; Qwen2's sliding_window 4096, which use_sliding_window then gates)."""
        self.read.add(key)
        return self.data[key] if key in self.data else self.absent(key)

    def moot(self, *keys: str) -> None:
        """Mark ``keys`` as considered: other settings make them irrelevant (Qwen2's
        max_window_layers without use_sliding_window), so tfgraph.hf.strict lets them be."""
        self.read.update(keys)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        """The value of ``key`` as transformers' config class takes it. ``default``: the value
        the class (or the family's model) derives when it has none of its own (Llama's
        head_dim: hidden_size / heads); ``_MISSING``: required, refused when absent or null.
        Absent: the class's own default where it has a constant one (:meth:`absent`), which
        it uses whatever other keys say, else ``default``. Null: refused where the class
        refuses a None (tfgraph.hf.config_fields.NOT_NULL), or keeps it as None where it has
        a default of its own and ``default`` is not None (GLM's num_key_value_heads: the model
        gets None, not the head count); else ``default``."""
        self.read.add(key)
        if key not in self.data:
            if default is _MISSING:
                self.refuse(key, "required, and missing")
            start = self.absent(key)
            return default if start is None else start
        value = self.data[key]
        if value is None:
            if key in NOT_NULL.get(self.model_type, ()):
                self.refuse(key, f"transformers' {self.model_type} config class refuses a "
                            "null here: it needs a value")
            start = self.absent(key)
            if (default is not None and start is not None
                    and key in KEEPS_NULL.get(self.model_type, ())):
                # neither the class's default nor derived: the model gets None itself
                self.refuse(key, f"transformers' {self.model_type} config class keeps a null "
                            f"here as None (absent: {start!r}), which tfgraph does not read "
                            "as a value")
            if default is _MISSING:
                self.refuse(key, "required, and missing")
            return default
        return value

    def int(self, key: str, default: Any = _MISSING) -> int:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            self.refuse(key, "must be an integer")
        return value

    def float(self, key: str, default: Any = _MISSING) -> float:
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.refuse(key, "must be a number")
        try:
            return float(value)
        except OverflowError:  # an integer past float's range (json.load reads 10**400)
            self.refuse(key, "must be a number within float range")

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.refuse(key, "must be true or false")
        return value

    def expect(self, key: str, allowed: Iterable[Any], default: Any, why: str) -> Any:
        """The value of ``key`` when it is one of ``allowed``, else exit 2 saying ``why``."""
        value = self.get(key, default)
        choices = list(allowed)
        if value not in choices or isinstance(value, bool) != isinstance(choices[0], bool):
            self.refuse(key, why)
        return value

    def refuse(self, key: str, why: str, value: Any = _MISSING) -> NoReturn:
        shown = self.data.get(key) if value is _MISSING else value
        prefix = f"{self.source}: " if self.source else ""
        notes = [self.model_type] if self.model_type else []
        if key not in self.data and shown is not None:  # the value the import filled in
            notes.append("absent: as transformers fills it")
        model = f" ({'; '.join(notes)})" if notes else ""
        raise ConfigError(f"{prefix}{key} = {_show(shown)}{model}: {why}", key)


class SpecDraft:
    """A spec mapping under construction; each field remembers the config field it came from."""

    def __init__(self, config: HFConfig) -> None:
        self.config = config
        self.data: dict[str, Any] = {}
        self.origin: dict[str, tuple[str, Any]] = {}

    def put(self, path: str, value: Any, field: str | None = None, shown: Any = _MISSING) -> None:
        """Set the spec field ``path`` (dotted) to ``value``, which config ``field`` asked for."""
        *parents, last = path.split(".")
        node = self.data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
        if field is not None:
            if shown is _MISSING:  # absent from the config: the value filled in
                shown = self.config.data[field] if field in self.config.data else value
            self.origin[path] = (field, shown)

    def spec(self) -> Spec:
        """The validated spec; a field or value the spec language lacks names its config field."""
        try:
            return Spec.model_validate(self.data)
        except ValidationError as exc:
            error = exc.errors()[0]
            path = ".".join(str(p) for p in error["loc"] if not isinstance(p, int))
            message = error["msg"].removeprefix("Value error, ")
            if not path:  # a cross-field rule: "field.path: what to change" (tfgraph.spec.schema)
                head = message.split(":", 1)[0]
                path = head if head.replace(".", "").replace("_", "").isalnum() else ""
            if path and not message.startswith(path):
                message = f"{path}: {message}"
            lacking = error["type"] in ("extra_forbidden", "literal_error")
            # the field the error names, else the deepest field under or above it
            for known, (field, value) in sorted(self.origin.items(),
                                                key=lambda kv: (kv[0] != path, -len(kv[0]))):
                if path and (path == known or path.startswith(known + ".")
                             or known.startswith(path + ".")):
                    if lacking:
                        spec_path = known if error["type"] == "extra_forbidden" else path
                        why = (f"needs spec field {spec_path}, which this tfgraph cannot "
                               f"express ({message})")
                    else:
                        why = f"gives an invalid spec: {message}"
                    self.config.refuse(field, why, value)
            raise ConfigError(f"{self.config.source}: the imported spec is invalid: "
                              f"{message}") from None


# ---- readings several families share -------------------------------------------------------

# Hugging Face activation names (transformers.activations.ACT2FN) -> tfgraph's, ungated and
# gated (the gated form multiplies by an up projection: Shazeer 2020, "GLU variants").
_PLAIN = {"relu": "relu", "relu2": "relu2", "gelu": "gelu", "gelu_new": "gelu_tanh",
          "gelu_pytorch_tanh": "gelu_tanh", "silu": "silu", "swish": "silu"}
_GATED = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_new": "geglu_tanh",
          "gelu_pytorch_tanh": "geglu_tanh"}


def activation(cfg: HFConfig, key: str, gated: bool, default: Any = _MISSING) -> str:
    """``ffn.activation`` for the config's activation field ``key``."""
    table = _GATED if gated else _PLAIN
    name = cfg.get(key, default)
    if not isinstance(name, str) or name not in table:  # (a list or mapping is unhashable)
        cfg.refuse(key, f"tfgraph has no {'gated ' if gated else ''}activation of this name "
                   f"(supported: {', '.join(sorted(table))})")
    return table[name]


# rotary types whose standardisation (modeling_rope_utils.standardize_rope_params) adds
# original_max_position_embeddings, and the layer types rope_parameters may be nested by
NEED_ORIGINAL = ("llama3", "yarn", "longrope")
_LAYER_KINDS = ("full_attention", "sliding_attention")


def _nested_entries(cfg: HFConfig, params: Mapping[str, Any], where: str) -> bool:
    """True when ``params`` holds entries named after the model's layer types in a family
    whose config class declares ``layer_types`` (Qwen2, Qwen3, Qwen2-MoE, Gemma 2, Cohere 2,
    Ministral: one flat mapping in their rotary embedding). ``standardize_rope_params``
    (modeling_rope_utils) then takes the mapping as nested by layer type and fills neither
    rope_type, rope_theta, partial_rotary_factor nor original_max_position_embeddings at its
    top level, which is all the model reads (``config.rope_parameters["rope_type"]``): one
    that lacks them fails there, so it is refused. Without a config.json layer_types (the
    class derives them) any full_attention / sliding_attention entry counts as nested.
    (Families without layer_types, Llama's kin, read such entries as unknown keys.)"""
    if "layer_types" not in DEFAULTS.get(cfg.model_type, {}):
        return False
    types = cfg.data.get("layer_types")
    labels = set(_LAYER_KINDS) if not isinstance(types, list) else {
        t for t in types if isinstance(t, str)}
    nested = sorted(k for k in params if k in labels)
    if not nested:
        return False
    needed = ["rope_type", "rope_theta"]
    if params.get("rope_type") in NEED_ORIGINAL:
        needed.append("original_max_position_embeddings")
    missing = [k for k in needed if k not in params]
    if missing:
        cfg.refuse(where, f"entries per layer type ({', '.join(nested)}) leave the top level "
                   f"without {', '.join(missing)}, the only one transformers' model reads: "
                   "it fails")
    cfg.moot("rope_theta", "partial_rotary_factor")  # not filled in then
    return True


def rope_parameters(cfg: HFConfig, default_theta: float | None = None,
                    params: Mapping[str, Any] | None = None, where: str = "rope_parameters",
                    default_fraction: float | None = None) -> tuple[str, dict[str, Any]]:
    """(where the rotary settings were read, their ``rope_parameters`` form), as transformers'
    ``convert_rope_params_to_dict`` (modeling_rope_utils) builds them: the legacy
    ``rope_scaling`` or ``rope_parameters`` mapping, whose missing ``rope_theta`` and
    ``partial_rotary_factor`` come from the top-level keys of those names, else from the config
    class's defaults (``default_theta`` / ``default_fraction`` where the family's config class
    reads other keys, GPT-NeoX's ``rotary_emb_base`` and ``rotary_pct``). A config without any
    rotary key gets the class's defaults (Mixtral's theta 1e6, Phi's fraction 0.5), not 10000
    and 1. Whether the fraction is applied is the family's business (:func:`put_rope`)."""
    if params is None:
        # transformers reads a legacy rope_scaling before rope_parameters when a config has
        # both (convert_rope_params_to_dict: ``rope_scaling or self.rope_parameters``)
        scaling = cfg.get("rope_scaling", None)
        if scaling:
            params, where = scaling, "rope_scaling"
        else:
            params = cfg.get("rope_parameters", None)
            if params is None:
                where = "rope_theta"
    if params is not None and not isinstance(params, Mapping):
        cfg.refuse(where, "must be a mapping")
    out: dict[str, Any] = dict(params or {})
    if _nested_entries(cfg, out, where):
        # transformers fills nothing at the top level then, and the model reads only it
        return where, {k: v for k, v in out.items() if k not in _LAYER_KINDS}
    assumed = cfg.class_default("rope_parameters", {})
    assumed = assumed if isinstance(assumed, Mapping) and "rope_theta" in assumed else {}
    theta_default = default_theta if default_theta is not None else assumed.get(
        "rope_theta", 10000.0)
    if "rope_theta" not in out:
        out["rope_theta"] = cfg.float("rope_theta", theta_default)
    else:
        cfg.moot("rope_theta")  # (transformers lets the mapping's win)
    fraction = cfg.get("partial_rotary_factor", None)
    if fraction is None:
        fraction = default_fraction if default_fraction is not None else assumed.get(
            "partial_rotary_factor")
    if fraction is not None:
        out.setdefault("partial_rotary_factor", fraction)
    out.setdefault("rope_type", out.get("type", "default"))
    return where, out


# rope_type -> {Hugging Face key: embedding.rope_scaling key} (transformers'
# modeling_rope_utils: Llama 3.1's wavelength-dependent scaling, YaRN of Peng et al. 2023).
_ORIGINAL = {"original_max_position_embeddings": "original_max_len"}
_SCALINGS: dict[str, dict[str, str]] = {
    "linear": {"factor": "factor"},
    "llama3": {"factor": "factor", "low_freq_factor": "low_freq_factor",
               "high_freq_factor": "high_freq_factor"} | _ORIGINAL,
    "yarn": {k: k for k in ("factor", "beta_fast", "beta_slow", "attention_factor", "mscale",
                            "mscale_all_dim", "truncate")} | _ORIGINAL,
}


def yarn_truncate(cfg: HFConfig, where: str, value: Any, shown: Any) -> bool:
    """YaRN's ``truncate`` as ``_compute_yarn_parameters`` uses it (``if truncate:`` rounds
    the correction range outwards): a null one does not round; one neither boolean nor null
    is refused."""
    if value is not None and not isinstance(value, bool):
        cfg.refuse(where, "truncate must be true or false", shown)
    return bool(value)


def put_rope(draft: SpecDraft, params: Mapping[str, Any], where: str,
             fraction: float | None = None, partial: bool = False) -> None:
    """Write ``embedding.positions: rope`` and its theta, scaling and rotary fraction.

    ``partial``: the family's modeling code rotates ``partial_rotary_factor`` of each head
    (its ``compute_default_rope_parameters`` and ``apply_rotary_pos_emb`` split the head:
    GPT-NeoX, Phi, Phi-3, StableLM, GLM, GLM-4, Nemotron). The others (Llama and its kin,
    transformers 5.24) compute the default rotary frequencies over the whole head whatever
    the fraction says, so there it is moot; with a scaled rotary type transformers' shared
    ``ROPE_INIT_FUNCTIONS`` do read it, and the model fails (cos and sin narrower than the
    head), so such a config is refused."""
    cfg = draft.config
    shown = cfg.data[where] if where in cfg.data else params  # what the config says
    draft.put("embedding.positions", "rope")
    theta = params.get("rope_theta", 10000.0)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        cfg.refuse(where, "rope_theta must be a number", shown)
    draft.put("embedding.rope_theta", float(theta), where, shown)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", *_SCALINGS):
        cfg.refuse(where, f"tfgraph has no rotary scaling {kind!r} (supported: default, "
                   f"{', '.join(_SCALINGS)})", shown)
    if kind != "default":
        scaling = {"type": kind}
        for key, ours in _SCALINGS[kind].items():
            if params.get(key) is not None:
                scaling[ours] = params[key]
        if kind == "yarn" and "truncate" in params:
            scaling["truncate"] = yarn_truncate(cfg, where, params["truncate"], shown)
        unknown = set(params) - {"rope_theta", "rope_type", "type", "partial_rotary_factor",
                                 *_SCALINGS[kind]}
        if unknown:
            cfg.refuse(where, f"unknown {kind} rotary scaling setting(s) "
                       f"{', '.join(sorted(unknown))}", shown)
        draft.put("embedding.rope_scaling", scaling, where, shown)
    if fraction is None:
        fraction = params.get("partial_rotary_factor", 1.0)
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
            cfg.refuse(where, "partial_rotary_factor must be a number", shown)
        fraction = float(fraction)
        if not partial:
            if fraction != 1.0 and kind != "default":
                cfg.refuse(where, f"partial_rotary_factor with {kind} rotary scaling: "
                           f"transformers' {cfg.model_type} model rotates the whole head "
                           "with frequencies for part of it and fails", shown)
            fraction = 1.0
    if fraction != 1.0:
        draft.put("embedding.rotary_fraction", fraction, where, shown)


def put_attention_dropout(draft: SpecDraft, cfg: HFConfig, key: str, default: float) -> None:
    """``attention.dropout`` from the config's dropout on the attention weights: transformers
    applies it after the softmax and before the product with the values, in training only
    (``eager_attention_forward``'s ``nn.functional.dropout(attn_weights, p=dropout,
    training=module.training)``, SDPA's ``dropout_p``), as tfgraph does. ``default``: the
    config class's. Left out at 0, so specs of checkpoints without it read as before."""
    p = cfg.float(key, default)
    if p:
        draft.put("attention.dropout", p, key)


def put_embedding_dropout(draft: SpecDraft, p: float, key: str | None) -> None:
    """``embedding.dropout``: the family's dropout after the embeddings, where it differs from
    the spec's ``dropout`` (put before this), which it defaults to; left out where the two
    agree, so specs of such checkpoints read as before."""
    if p != draft.data.get("dropout", Spec.model_fields["dropout"].default):
        draft.put("embedding.dropout", p, key)
