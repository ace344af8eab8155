"""A checkpoint's tensors under the names the model's state dict has, matched as transformers
5.24's ``from_pretrained`` matches them, before the family's name map reads them.

Two of transformers' loading rules change which tensors a folder holds for the model:

- the base-model prefix (``PreTrainedModel.base_model_prefix``: ``transformer`` for GPT-2,
  ``model`` for Llama) is added to a name when only the prefixed name is the model's, and
  stripped when only the stripped one is (``core_model_loading.rename_source_key``): the
  hub's gpt2 stores ``h.0.attn.c_attn.weight`` and ``wte.weight``, a GPT2Model's names;
- a tensor that is not the model's and that a pattern of the class's
  ``_keys_to_ignore_on_load_unexpected`` (or the ``rotary_emb.inv_freq`` and
  ``position_ids`` buffers of older checkpoints) finds is skipped
  (``modeling_utils._adjust_missing_and_unexpected_keys``): GPT-2's causal-mask buffers
  ``h.N.attn.bias``, an old Llama's ``inv_freq``.

The prefix and patterns of each model_type's class are tfgraph.hf.load_rules (generated from
transformers and checked against it by tests/test_hf_load_rules.py). Every other tensor keeps
its name, and one the model has no place for is refused by the checks that follow
(tfgraph.hf.checkpoint_weights, tfgraph.hf.checkpoint_check), as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from tfgraph.hf.checkpoint import Checkpoint, CheckpointError, TensorInfo
from tfgraph.hf.load_rules import LOAD_RULES
from tfgraph.hf.names import NameMap


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
        name = _placed(names, expected, key, prefix)
        if name is not None:
            info.refuse_unreadable()
        elif ignored is not None and ignored.search(key):
            continue  # what transformers would report as neither loaded nor unexpected
        else:
            name = key  # the model has no place for it: refused by name in the checks after
        if name in tensors:
            other = tensors[name]
            raise CheckpointError(f"{checkpoint.folder}: {other.key} ({other.file.name}) and "
                                  f"{key} ({info.file.name}) are both {name} to transformers, "
                                  f"which adds or strips the prefix {prefix!r}")
        tensors[name] = info
    return Checkpoint(checkpoint.folder, tensors)


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
