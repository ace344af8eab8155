"""The training loss transformers computes for a mixture-of-experts config and tfgraph does not.

With ``output_router_logits`` true, the causal-LM classes of these model_types add
``router_aux_loss_coef`` times the load-balancing loss of the router logits (Switch
Transformer's, ``load_balancing_loss_func``) to the cross-entropy whenever labels are given
(their ``forward``: ``loss += self.router_aux_loss_coef * aux_loss``). tfgraph's loss
(``tfgraph.compile(spec, loss=True)``) is the cross-entropy alone, and its import reads
neither key (``tfgraph.hf.strict.INERT``): the logits, and so inference, are the same, but a
model trained from the spec minimises another loss. DeepSeek-V2 and V3 configs carry
``output_router_logits`` too, and their transformers models add nothing to the loss; no
model_type tfgraph imports adds ``router_z_loss_coef`` (Switch Transformers and NLLB-MoE do).
``tfgraph import`` and ``tfgraph build`` of a config say so (:func:`config_notes`).
"""

from __future__ import annotations

from typing import Any

# model_type -> the router_aux_loss_coef of transformers' config class (used when the config
# leaves it out); tests/test_hf_router_loss.py checks both against transformers.
AUX_LOSS_COEF: dict[str, float] = {
    "mixtral": 0.001,
    "qwen2_moe": 0.001,
    "qwen3_moe": 0.001,
    "olmoe": 0.01,
    "granitemoe": 0.001,
    "phimoe": 0.001,
}


def config_notes(config: dict[str, Any]) -> list[str]:
    """The ``note:`` lines (without the prefix) that commands reading a Hugging Face config
    for a model to train print about it."""
    note = router_loss_note(config)
    return [] if note is None else [note]


def router_loss_note(config: dict[str, Any]) -> str | None:
    """The ``note:`` text for a config whose transformers training loss adds a router
    auxiliary loss that tfgraph's lacks, else None."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in AUX_LOSS_COEF:
        return None
    flag = config.get("output_router_logits")
    if not isinstance(flag, (bool, int)) or not flag:
        return None
    coef = config.get("router_aux_loss_coef", AUX_LOSS_COEF[model_type])
    if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef == 0:
        return None  # no term (or one transformers cannot compute either)
    return (f"output_router_logits is true: transformers adds router_aux_loss_coef ({coef:g}) "
            "x the router's load-balancing loss to its training loss, and tfgraph's loss "
            "(cross-entropy alone) has no router auxiliary loss, so training losses differ; "
            "inference (the logits) is unaffected")
