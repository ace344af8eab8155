"""A residual sum and the RMS norm that reads it as onnxruntime's fused
``SkipSimplifiedLayerNormalization`` (domain ``com.microsoft``), in the fused-attention
KV-cache model only (exporters/onnx/fused_attention.py: that model is onnxruntime's already).

The op (onnxruntime 1.31's registered contrib schema, docs/ContribOperators.md): inputs
``input`` and ``skip`` (the same shape, (B, S, d) or (tokens, d)), ``gamma`` (d,) and an
optional ``bias``, all of one type T (float, float16, bfloat16); attribute ``epsilon``;
outputs ``output`` = s / sqrt(mean(s^2 over the last axis) + epsilon) * gamma with
s = input + skip, ``mean`` and ``inv_std_var`` (optional, for training: left out here) and
``input_skip_bias_sum`` = s (optional: written when something besides the norm reads the
sum, the next residual add).
It is what onnxruntime-genai's own decoders use for the ``Add`` + norm pair of every layer;
onnxruntime's SkipLayerNormFusion pass makes it only out of its own
``SimplifiedLayerNormalization``, not out of ONNX's ``RMSNormalization`` (opset 23) or the
decomposed norm (opset 17), so the builder writes it.

Exact where (:func:`pairs` checks each; elsewhere the ``Add`` and the norm stay as they are):

- the add sums two tensors of its own shape and type (no broadcast, no bias), rank 3;
- the norm is an ``rmsnorm`` over the last axis of that sum (input 0), with one gain of
  shape (d,) of the same type and no other attribute than ``eps`` and ``unit_offset``: no
  per-head split (qk-norm), no bias. Gemma's (1 + w) gain is computed in front of the node as
  the written-out form computes it (the kernels read gamma as an ordinary input, not only an
  initializer);
- float32 or float16: onnxruntime's kernels for the op (CPU: contrib_ops/cpu/
  skip_layer_norm.cc; CUDA) are float and float16 only; a bfloat16 model keeps its norms.
  Statistics in float32, as RMSNormalization's stash_type 1 and the opset-17 decomposition:
  in float32 the op computes what the Add and the norm compute; in float16 it normalizes the
  float32 sum before rounding it (the sum it writes is the rounded one, so the residual stream
  is the same), within float16's rounding of the norm's input.

The fused node is written where the add was (its inputs are the add's and the gain, a
parameter): every other reader of the sum reads its fourth output, under the add's name.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfgraph.exporters.onnx.builder import Builder
from tfgraph.graph.ir import Graph, Node

DOMAIN = "com.microsoft"
OP_TYPE = "SkipSimplifiedLayerNormalization"
# The norm attributes whose meaning the op expresses; a norm with any other (a per-head
# split, or one added to the IR later) keeps its own node.
NORM_ATTRS = frozenset({"eps", "unit_offset"})
KERNEL_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class SkipNorm:
    """One residual ``add`` and the ``rmsnorm`` of its sum, written as one node;
    ``sum_read``: something besides the norm reads the sum (the op writes it then)."""

    add: Node
    norm: Node
    sum_read: bool


def pairs(graph: Graph) -> dict[str, SkipNorm]:
    """The add + RMS norm pairs of ``graph`` the op is exact for, by the add's name; an add
    read by several such norms is paired with the first (the others read the sum)."""
    readers: dict[str, int] = {name: 1 for name in graph.outputs}
    for n in graph.ops():
        for i in n.inputs:
            readers[i] = readers.get(i, 0) + 1
    out: dict[str, SkipNorm] = {}
    for norm in graph.ops():
        add = _summed(graph, norm)
        if add is not None and add.name not in out:
            out[add.name] = SkipNorm(add, norm, readers.get(add.name, 0) > 1)
    return out


def _summed(graph: Graph, norm: Node) -> Node | None:
    """The add whose sum ``norm`` normalizes, when the op computes the pair exactly."""
    if norm.op != "rmsnorm" or len(norm.inputs) != 2 or set(norm.attrs) - NORM_ATTRS:
        return None
    add = graph.node(norm.inputs[0])
    if add.op != "add" or len(add.inputs) != 2:
        return None
    t = add.type
    if t.dtype not in KERNEL_DTYPES or len(t.shape) != 3:
        return None
    if any(graph.node(i).type.shape != t.shape or graph.node(i).type.dtype != t.dtype
           for i in add.inputs):
        return None  # a broadcast or a mixed-type sum
    gain = graph.node(norm.inputs[1])
    # a parameter (an initializer, available wherever the add is written) of shape (d,)
    if not gain.is_param or gain.type.shape != (t.shape[-1],) or gain.type.dtype != t.dtype:
        return None
    return add


def emit(b: Builder, pair: SkipNorm, gamma: str) -> None:
    """The pair as one node named under the norm: outputs the norm's tensor and, when read,
    the sum under the add's name (mean and inv_std_var left out)."""
    add, norm = pair.add, pair.norm
    outputs = [norm.name, "", "", add.name] if pair.sum_read else [norm.name]
    b.add_node(norm.name, OP_TYPE, [add.inputs[0], add.inputs[1], gamma], outputs,
               domain=DOMAIN, epsilon=float(norm.attrs["eps"]))
