"""A checkpoint's tensors under the names the model's state dict has, matched as transformers
5.24's ``from_pretrained`` matches them, before the family's name map reads them.

Three of transformers' loading rules change which tensors a folder holds for the model:

- the legacy renames (``conversion_mapping``'s ``"legacy"`` entry, which
  ``get_model_conversion_mapping`` adds to every model's) are applied to every name first, in
  turn: an old BERT's ``LayerNorm.gamma`` and ``LayerNorm.beta`` are ``LayerNorm.weight`` and
  ``LayerNorm.bias``; a name the model has is kept as it is when its renamed one is not the
  model's (``core_model_loading.convert_and_load_state_dict_in_model``);
- the base-model prefix (``PreTrainedModel.base_model_prefix``: ``transformer`` for GPT-2,
  ``model`` for Llama) is added to a name when only the prefixed name is the model's, and
  stripped when only the stripped one is (``core_model_loading.rename_source_key``): the
  hub's gpt2 stores ``h.0.attn.c_attn.weight`` and ``wte.weight``, a GPT2Model's names;
- a tensor that is not the model's and that a pattern of the class's
  ``_keys_to_ignore_on_load_unexpected`` (or the ``rotary_emb.inv_freq`` and
  ``position_ids`` buffers of older checkpoints) finds is skipped
  (``modeling_utils._adjust_missing_and_unexpected_keys``): GPT-2's causal-mask buffers
  ``h.N.attn.bias``, an old Llama's ``inv_freq``.

The renames, and the prefix and patterns of each model_type's class, are tfgraph.hf.load_rules
(generated from transformers and checked against it by tests/test_hf_load_rules.py). Every
other tensor keeps its name, and one the model has no place for is refused by the checks that
follow (tfgraph.hf.checkpoint_weights, tfgraph.hf.checkpoint_check), as before. Two tensors
that become one name (``LayerNorm.gamma`` beside ``LayerNorm.weight``, ``wte.weight`` beside
``transformer.wte.weight``) are refused: transformers keeps the one its sort of the names puts
first and drops the other without a word.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tfgraph.hf.checkpoint import Checkpoint, CheckpointError, TensorInfo
from tfgraph.hf.load_rules import LEGACY_RENAMES, LOAD_RULES
from tfgraph.hf.names import NameMap

_LEGACY = [(re.compile(pattern), target) for pattern, target in LEGACY_RENAMES]


def as_loaded(checkpoint: Checkpoint, names: NameMap, expected: Mapping[str, object],
              model_type: str) -> Checkpoint:
    """``checkpoint`` as the model of ``model_type`` loads it: each tensor under the name
    the model knows it by (``names`` places it in ``expected``, tfgraph's parameters), the
    tensors transformers ignores left out. Two tensors that become one name are refused,
    as is any tensor used whose dtype tfgraph cannot read."""
    prefix, patterns = LOAD_RULES.get(model_type, ("", ()))
    ignored = re.compile("|".join(f"({p})" for p in patterns)) if patterns else None
    tensors: dict[str, TensorInfo] = {}
    for key, info in checkpoint.tensors.items():
        renamed = legacy_renamed(key)
        name = _placed(names, expected, renamed, prefix)
        if name is None and renamed != key:  # transformers keeps a name the model has
            name = _placed(names, expected, key, "")
        if name is not None:
            info.refuse_unreadable()
        elif ignored is not None and ignored.search(renamed):
            continue  # what transformers would report as neither loaded nor unexpected
        else:
            name = key  # the model has no place for it: refused by name in the checks after
        if name in tensors:
            other = tensors[name]
            files = ((f" ({other.file.name})", f" ({info.file.name})")
                     if other.file != info.file else ("", ""))
            raise CheckpointError(f"{checkpoint.folder}: {other.key}{files[0]} and {key}"
                                  f"{files[1]} are both {name} to transformers "
                                  f"({_how(other.key, key, name, prefix)}); keep one")
        tensors[name] = info
    return Checkpoint(checkpoint.folder, tensors)


def legacy_renamed(key: str) -> str:
    """``key`` under transformers' legacy renames, applied in turn as
    ``WeightRenaming.rename_source_key`` applies them (the first text the regex finds is
    replaced)."""
    for pattern, target in _LEGACY:
        found = pattern.search(key)
        if found is not None:
            key = key.replace(found.group(0), target, 1)
    return key


def _how(first: str, second: str, name: str, prefix: str) -> str:
    """How transformers makes tensors ``first`` and ``second`` the one tensor ``name``."""
    ways = []
    if any(key != name and legacy_renamed(key) != key for key in (first, second)):
        ways.append("a legacy name read as the new one")
    if any(name not in (key, legacy_renamed(key)) for key in (first, second)):
        ways.append(f"the prefix {prefix!r} added or stripped")
    return ", ".join(ways)


def _placed(names: NameMap, expected: Mapping[str, object], key: str, prefix: str
            ) -> str | None:
    """The name, of ``key`` and ``key`` with the prefix stripped or added, that is one of the
    model's tensors: one the name map reads into parameters in ``expected`` (or a buffer the
    config fixes); None when there is none."""
    candidates = [key]
    if prefix:
        head = prefix + "."
        candidates.append(key[len(head):] if key.startswith(head) else head + key)
    for name in candidates:
        targets = names.targets(name)
        if targets is not None and all(t in expected for t in targets):
            return name
    return None
