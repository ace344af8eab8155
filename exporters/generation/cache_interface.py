"""Checking a decoder's KV-cache ONNX model before a cached stepper drives it (README, "KV
cache"): an .onnx file is untrusted input, and the steppers size their buffers from its past
inputs and pair each past with its present by position.

What ``tfgraph build --kv-cache`` writes, and so what is accepted:
- every ``past_key_values.{i}.key|value`` input is (batch, kv_heads, past_len, width) with
  kv_heads and width fixed positive sizes within the spec language's bounds (a symbolic or
  absurd size would end in a ValueError or a terabyte allocation);
- the outputs are the logits, then ``present.{i}.key|value`` for each past input in the same
  order (a missing present would leave a shared cache buffer unwritten: wrong tokens, no
  error);
- ``tfgraph.kv_cache_padding`` is absent (the written-out attention, left-padded rows) or
  ``right``, and ``right`` exactly when the model runs onnxruntime's fused attention
  (exporters/onnx/fused_attention.py): the two models take differently padded masks, so a
  wrong label would decode wrong tokens rather than fail.
"""

from __future__ import annotations

import re
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.exporters.onnx.fused_attention import OP_TYPE, PADDING_METADATA_KEY
from tfgraph.graph.bounds import MAX_D_MODEL, MAX_HEADS

_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")
_DIMS = "(batch, kv_heads, past_len, width)"


def present_name(past: str) -> str:
    """``past_key_values.3.key`` -> ``present.3.key``."""
    return "present." + past.removeprefix("past_key_values.")


def _fixed(dim: Any) -> int | None:
    return int(dim.dim_value) if dim.HasField("dim_value") else None


def check_cache_interface(model: Any, where: str) -> bool:
    """Refuse (one line naming ``where``) a decoder-only KV-cache model the cached steppers
    cannot drive as built (see the module docstring); True when it is the fused-attention
    (right-padded) kind."""
    initializers = {t.name for t in model.graph.initializer}
    past = [i for i in model.graph.input
            if i.name.startswith("past_key_values.") and i.name not in initializers]
    for value in past:
        if not _PAST.fullmatch(value.name):
            raise TfgraphError(f"{where}: input {value.name!r}: expected "
                               "past_key_values.{i}.key or .value")
        tensor = value.type.tensor_type
        dims = list(tensor.shape.dim) if tensor.HasField("shape") else []
        if len(dims) != 4:
            raise TfgraphError(f"{where}: input {value.name} has {len(dims) or 'no'} "
                               f"dimensions, expected 4 {_DIMS}")
        for axis, what, limit in ((1, "kv_heads", MAX_HEADS), (3, "width", MAX_D_MODEL)):
            size = _fixed(dims[axis])
            if size is None or not 1 <= size <= limit:
                shown = size if size is not None else repr(dims[axis].dim_param or "unknown")
                raise TfgraphError(f"{where}: input {value.name}: {what} (dimension {axis} of "
                                   f"{_DIMS}) is {shown}, expected a fixed size from 1 to "
                                   f"{limit:,}")
    outputs = [o.name for o in model.graph.output]
    expected = [present_name(p.name) for p in past]
    if len(outputs) != len(expected) + 1 or outputs[1:] != expected \
            or outputs[0].startswith("present."):
        shown = ", ".join(outputs[:4]) + (", ..." if len(outputs) > 4 else "")
        raise TfgraphError(f"{where}: outputs {shown or 'none'}: expected the logits, then "
                           "present.{i}.key|value for each past input in the same order")
    padding = {p.key: p.value for p in model.metadata_props}.get(PADDING_METADATA_KEY)
    if padding not in (None, "right"):
        raise TfgraphError(f"{where}: metadata {PADDING_METADATA_KEY} = {padding[:40]!r}: "
                           "expected right (or none)")
    fused = any(n.op_type == OP_TYPE for n in model.graph.node)
    if fused != (padding == "right"):
        has = "runs" if fused else "does not run"
        says = "does not say" if padding is None else "says"
        raise TfgraphError(f"{where}: the model {has} onnxruntime's {OP_TYPE} but its "
                           f"metadata {says} {PADDING_METADATA_KEY} = right (the two take "
                           "differently padded rows; rebuild it with tfgraph build --kv-cache)")
    return fused
