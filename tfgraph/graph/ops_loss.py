"""Op definition of the training loss: token-level cross-entropy over the vocabulary.

Registered into ``tfgraph.graph.ops.OPS`` when ``tfgraph.graph.ir`` imports this module (as
``tfgraph.graph.ops_moe`` is). ``tfgraph.compile(spec, loss=True)`` ends the graph with it
(``tfgraph.graph.lower``): operands the logits (B, L, V) and the labels (B, L) int64, output the mean
over the B*L tokens as a float32 scalar.

What it keeps for backward is what ``F.cross_entropy(logits.float().flatten(0, 1),
labels.flatten())`` keeps in torch (``tools/autograd/derivatives.yaml``): it is
``log_softmax`` then ``nll_loss``; ``log_softmax`` keeps its *result* (the float32
log-probabilities, B*L*V), ``nll_loss`` keeps that same tensor, the target (the labels) and its
``total_weight`` (a 0-dimensional float32 tensor). The logits themselves are not kept: they die
after the loss's forward unless something else holds them. With 16-bit logits the loss is
computed in float32 (Megatron-LM's and Hugging Face's practice): the float32 copy of the logits
is scratch of the forward, kept by nothing.

Backward (``tfgraph.passes.train_walk``): ``nll_loss``'s backward writes the gradient of the
log-probabilities (B*L*V float32, zero but at the labels), then ``log_softmax``'s backward the
gradient of the logits; ``backward_temp`` (the op's ``OpDef.backward_temp``) states the first
(and, with 16-bit logits, the float32 gradient before the cast back), the logits' gradient
itself is an input gradient.
"""

from __future__ import annotations

from typing import Any

import sympy

from tfgraph.graph.ops import FLOPS_PER_ELEMENT, STATS_BYTES, ZERO, Flops, OpDef, Saved, register
from tfgraph.graph.tensor import DTYPE_BYTES, TensorType

LOSS_DTYPE = "float32"

# Per-element constants of the loss (stated in every report with the others).
FLOPS_PER_ELEMENT.update({
    # per logit: max, subtract the max, exp, sum, subtract the log-sum-exp (the log of the sum
    # is once per row, not counted)
    "log_softmax": 5,
    # per token: pick the label's log-probability (negate), add it into the mean's sum
    "nll": 2,
})


def _tokens(logits: TensorType) -> sympy.Expr:
    return sympy.Mul(*logits.shape[:-1])


def _cross_entropy_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    logits, labels = ins
    if labels.dtype != "int64":
        raise ValueError(f"labels must be int64, got {labels}")
    if len(logits.shape) != 3 or labels.shape != logits.shape[:2]:
        raise ValueError(f"cross_entropy takes logits (B, L, V) and labels (B, L), got "
                         f"{logits} and {labels}")
    return TensorType((), LOSS_DTYPE)


def _cross_entropy_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
    logits = ins[0]
    return ZERO, (FLOPS_PER_ELEMENT["log_softmax"] * logits.numel
                  + FLOPS_PER_ELEMENT["nll"] * _tokens(logits))


def log_probs_bytes(logits: TensorType) -> sympy.Expr:
    """Bytes of the float32 log-probabilities (B*L*V), which log_softmax keeps."""
    return logits.numel * DTYPE_BYTES[LOSS_DTYPE]


def _cross_entropy_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    # log_softmax: its result; nll_loss: that result again (one tensor), the target and the
    # 0-dimensional total_weight of the mean.
    return [(("tmp", "log_probs"), log_probs_bytes(ins[0])), (("in", 1), ins[1].nbytes),
            (("tmp", "total_weight"), sympy.Integer(STATS_BYTES))]


def _upcast_bytes(logits: TensorType) -> sympy.Expr:
    """The float32 copy of 16-bit logits (none when they are float32 already)."""
    return ZERO if logits.dtype == LOSS_DTYPE else log_probs_bytes(logits)


def _cross_entropy_temp(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]
                        ) -> sympy.Expr:
    # Scratch besides what is saved (the log-probabilities are a saved tensor): the float32
    # copy of 16-bit logits.
    return _upcast_bytes(ins[0])


def backward_temp(ins: list[TensorType], out: TensorType | None = None,
                  attrs: dict[str, Any] | None = None) -> sympy.Expr:
    """Bytes the loss's backward holds besides its saved tensors and the logits' gradient:
    the gradient of the float32 log-probabilities, and with 16-bit logits the float32
    gradient of their upcast copy. (The engine frees the log-probabilities before the cast's
    backward, so with 16-bit logits this counts 2 bytes per logit more than its true peak.)"""
    return log_probs_bytes(ins[0]) + _upcast_bytes(ins[0])


register(OpDef(
    "cross_entropy", (2, 2), _cross_entropy_infer, _cross_entropy_flops, _cross_entropy_saved,
    "Token-level cross-entropy: logits (B, L, V), labels (B, L) int64 -> the float32 scalar "
    "mean over the B*L tokens of -log_softmax(logits)[label], computed in float32 (16-bit "
    "logits are upcast). The training loss (tfgraph.compile(spec, loss=True)).",
    _cross_entropy_temp,
    category="output", vocab_reduce="R", whole_scratch=("total_weight",),
    loss=True, backward_temp=backward_temp,
))
