"""``to_torch``: a compiled graph becomes a trainable ``nn.Module`` (design §4, §6).

The module interprets the graph: at construction every op node becomes one step
``(lowering, attrs, input slots, output slot)`` through ``TORCH_OPS``, the per-op table (one
entry per op of ``tfgraph.ops.OPS``; a test asserts none is missing); ``forward`` walks the
steps once. A straight loop over a fixed list keeps ``torch.compile`` and ``torch.export``
working (they unroll it) and costs microseconds next to the matmuls.

Parameters are registered under their design §4 names as nested submodules (``decoder`` ->
``layers`` -> ``0`` -> ``self_attn`` -> ``q`` -> ``weight``), so ``state_dict()`` keys are
exactly the graph's parameter names and a tied table appears once.

Attention runs ``F.scaled_dot_product_attention`` (``attention_impl = "sdpa"``, the default) or
explicit matmuls (``"math"``), which ``FlopCounterMode`` counts (it counts 0 for the CPU SDPA
kernel). Dropout is active only in ``train()``, at the graph's dropout nodes. Without autograd
(``torch.no_grad()`` / ``inference_mode()``) element-wise ops write into operands nothing reads
any more, as a hand-written inference model would (``TORCH_INPLACE``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfgraph.errors import TfgraphError
from tfgraph.exporters import torch_functional as tf
from tfgraph.ir import Graph
from tfgraph.weights import check_weights, generate

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
}
ATTENTION_IMPLS = ("sdpa", "math")

# A lowering: fn(module, attrs, *inputs) -> output, inputs in the node's operand order.
Lowering = Callable[..., Tensor]
# What a step runs: a lowering, or _rope_tables, whose slot holds a (cos, sin) pair.
StepFn = Callable[..., Tensor | tuple[Tensor, Tensor]]


def _linear(m: TorchModel, a: dict[str, Any], x: Tensor, w: Tensor, b: Tensor | None = None
            ) -> Tensor:
    return F.linear(x, w, b)  # (.., out)


def _norm_layer(m: TorchModel, a: dict[str, Any], x: Tensor, g: Tensor, b: Tensor) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), g, b, a["eps"])


def _positions_sinusoidal(m: TorchModel, a: dict[str, Any], x: Tensor) -> Tensor:
    return x + tf.sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype)  # (B, L, d)


def _rope(m: TorchModel, a: dict[str, Any], x: Tensor, tables: tuple[Tensor, Tensor]) -> Tensor:
    return tf.apply_rope(x, tables[0], tables[1], a["heads"], a["head_dim"])


def _rope_tables(m: TorchModel, a: dict[str, Any], x: Tensor) -> tuple[Tensor, Tensor]:
    """Not an op: cos/sin for one sequence axis, computed once per forward and shared by every
    rope node on that axis (so backward keeps one pair of tables, not one per layer)."""
    return tf.rope_tables(x.shape[1], a["head_dim"], a["theta"], x.device, x.dtype)


def _attention(m: TorchModel, a: dict[str, Any], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    if m.attention_impl not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl {m.attention_impl!r}: expected one of {ATTENTION_IMPLS}")
    return tf.attention(q, k, v, a["heads"], a["kv_heads"], a["head_dim"], a["causal"],
                        a["normalize"], m.attention_impl)


TORCH_OPS: dict[str, Lowering] = {
    "embedding": lambda m, a, table, ids: F.embedding(ids, table),  # (B, L, d)
    "scale": lambda m, a, x: x * a["factor"],
    "positions_sinusoidal": _positions_sinusoidal,
    "positions_learned": lambda m, a, x, table: x + table[: x.shape[1]],  # (B, L, d)
    "rope": _rope,
    "linear": _linear,
    "attention": _attention,
    "layernorm": _norm_layer,
    "rmsnorm": lambda m, a, x, g: tf.rms_norm(x, g, a["eps"]),
    "scalenorm": lambda m, a, x, g: tf.scale_norm(x, g, a["eps"]),
    "relu": lambda m, a, x: F.relu(x),
    "gelu": lambda m, a, x: F.gelu(x),
    "gelu_tanh": lambda m, a, x: F.gelu(x, approximate="tanh"),
    "silu": lambda m, a, x: F.silu(x),
    "mul": lambda m, a, x, y: x * y,
    "add": lambda m, a, x, y: x + y,
    "dropout": lambda m, a, x: tf.dropout(x, a["p"], m.training),
    "softmax": lambda m, a, x: x.softmax(dim=-1),
}

# In-place forms, used only without autograd and only when the first operand is dead after the
# node (nothing else reads it or an alias of it): a fresh multi-megabyte output costs page
# faults on CPU (large blocks come from and return to the OS), which made element-wise ops up
# to 10x slower than writing into their input. Same values bit for bit as TORCH_OPS.
TORCH_INPLACE: dict[str, Lowering] = {
    "scale": lambda m, a, x: x.mul_(a["factor"]),
    "positions_sinusoidal": lambda m, a, x: x.add_(
        tf.sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype)),
    "positions_learned": lambda m, a, x, table: x.add_(table[: x.shape[1]]),
    "relu": lambda m, a, x: x.relu_(),
    "silu": lambda m, a, x: F.silu(x, inplace=True),
    "mul": lambda m, a, x, y: x.mul_(y),
    "add": lambda m, a, x, y: x.add_(y),
}
COMMUTATIVE = frozenset({"mul", "add"})  # either operand may be the one overwritten
ALIASES_INPUT = frozenset({"dropout"})  # may return its input itself (eval)


class _Scope(nn.Module):
    """A container named after one segment of a parameter path; it computes nothing."""

    def extra_repr(self) -> str:
        return ", ".join(f"{n}: {tuple(p.shape)}" for n, p in self._parameters.items()
                         if p is not None)


def _register(root: nn.Module, name: str, value: Tensor) -> tuple[nn.Module, str]:
    """Register ``value`` as parameter ``name`` ("a.b.c.weight") under nested submodules."""
    *path, leaf = name.split(".")
    owner = root
    for part in path:
        child = owner._modules.get(part)
        if child is None:
            child = _Scope()
            owner.add_module(part, child)
        owner = child
    owner.register_parameter(leaf, nn.Parameter(value))
    return owner, leaf


class TorchModel(nn.Module):
    """The graph as a module; ``forward`` takes int64 ids (B, L) and returns (B, L, vocab)."""

    attention_impl: str = "sdpa"
    """'sdpa' (fused kernel for softmax attention) or 'math' (explicit matmuls)."""

    def __init__(self, graph: Graph, weights: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.graph_name = graph.name
        self.input_names = tuple(graph.inputs)
        self.output_name = graph.outputs[0]
        slots: dict[str, int] = {}
        self._params: list[tuple[int, nn.Module, str]] = []
        for p in graph.params():
            slots[p.name] = len(slots)
            self._params.append((slots[p.name], *_register(self, p.name, weights[p.name])))
        self._inputs = []
        for name in graph.inputs:
            slots[name] = len(slots)
            self._inputs.append(slots[name])
        self._steps = _program(graph, slots)
        self._n_slots = len(slots)
        self._output = slots[self.output_name]

    def _run(self, inputs: tuple[Tensor, ...]) -> Tensor:
        env: list[Any] = [None] * self._n_slots
        for slot, owner, leaf in self._params:
            env[slot] = owner._parameters[leaf]
        for slot, x in zip(self._inputs, inputs):
            env[slot] = x
        grad = torch.is_grad_enabled()
        for fn, attrs, args, out, dead, inplace, inplace_args in self._steps:
            if inplace is None or grad:
                env[out] = fn(self, attrs, *[env[i] for i in args])
            else:  # overwrites an operand nothing reads any more (see _schedule)
                env[out] = inplace(self, attrs, *[env[i] for i in inplace_args])
            for i in dead:  # free activations after their last use (inference peak)
                env[i] = None
        return env[self._output]

    def extra_repr(self) -> str:
        return f"graph={self.graph_name!r}, attention_impl={self.attention_impl!r}"


class DecoderOnlyOrEncoderModel(TorchModel):
    """One stack (encoder-only or decoder-only)."""

    def forward(self, input_ids: Tensor) -> Tensor:
        """input_ids (B, S) int64 -> logits or probs (B, S, vocab)."""
        return self._run((input_ids,))


class EncoderDecoderModel(TorchModel):
    """Encoder-decoder: the decoder attends to the encoder output."""

    def forward(self, src_ids: Tensor, tgt_ids: Tensor) -> Tensor:
        """src_ids (B, S), tgt_ids (B, T) int64 -> logits or probs (B, T, target vocab)."""
        return self._run((src_ids, tgt_ids))


# (lowering, attrs, input slots, output slot, slots dead after it,
#  in-place lowering or None, its input slots (operand to overwrite first))
Step = tuple[StepFn, dict[str, Any], tuple[int, ...], int, tuple[int, ...],
             Lowering | None, tuple[int, ...]]
_Draft = tuple[str, StepFn, dict[str, Any], tuple[int, ...], int]


def _program(graph: Graph, slots: dict[str, int]) -> list[Step]:
    """One step per op node in topological order, plus one rope-table step per sequence axis;
    ``slots`` (parameters and inputs already in it) gains a slot per produced value."""
    drafts: list[_Draft] = []
    tables: dict[tuple[Any, ...], int] = {}
    for node in graph.ops():
        if node.op not in TORCH_OPS:
            raise TfgraphError(f"{node.name}: op {node.op!r} has no PyTorch lowering")
        args = tuple(slots[i] for i in node.inputs)
        if node.op == "rope":
            key = (str(node.type.shape[1]), node.attrs["head_dim"], node.attrs["theta"])
            if key not in tables:
                tables[key] = slots[f"#rope_tables{len(tables)}"] = len(slots)
                drafts.append(("#rope_tables", _rope_tables, node.attrs, args, tables[key]))
            args += (tables[key],)
        slots[node.name] = len(slots)
        drafts.append((node.op, TORCH_OPS[node.op], node.attrs, args, slots[node.name]))
    return _schedule(drafts, keep={slots[o] for o in graph.outputs})


def _schedule(drafts: list[_Draft], keep: set[int]) -> list[Step]:
    """Attach to each step the produced slots whose last reader it is (freed after it: the
    inference peak), and its in-place form where overwriting an operand is safe: the operand
    was produced by a step, is not an output, and neither it nor any alias of it (the input of
    an eval-mode dropout is its output) is read later."""
    produced = {out for *_, out in drafts}
    last: dict[int, int] = {}
    for i, (*_, args, _) in enumerate(drafts):
        for a in args:
            last[a] = i
    root: dict[int, int] = {}
    for op, _, _, args, out in drafts:
        root[out] = root.get(args[0], args[0]) if op in ALIASES_INPUT else out
    group_end: dict[int, int] = {}  # alias root -> last read of any of its aliases
    for slot, i in last.items():
        if slot in produced:
            r = root[slot]
            group_end[r] = max(group_end.get(r, -1), i, 1 << 30 if slot in keep else -1)

    def overwritable(slot: int, i: int) -> bool:
        return slot in produced and slot not in keep and group_end[root[slot]] == i \
            and root[slot] not in keep

    dead: list[list[int]] = [[] for _ in drafts]
    for slot, i in last.items():
        if slot in produced and slot not in keep:
            dead[i].append(slot)
    steps: list[Step] = []
    for i, (op, fn, attrs, args, out) in enumerate(drafts):
        inplace, inplace_args = None, args
        if op in TORCH_INPLACE:
            if overwritable(args[0], i):
                inplace = TORCH_INPLACE[op]
            elif op in COMMUTATIVE and overwritable(args[1], i):
                inplace, inplace_args = TORCH_INPLACE[op], (args[1], args[0])
        steps.append((fn, attrs, args, out, tuple(dead[i]), inplace, inplace_args))
    return steps


def _as_tensors(graph: Graph, weights: Mapping[str, Any], dtype: torch.dtype,
                source: str) -> dict[str, Tensor]:
    """Check names and shapes against the graph, then convert to ``dtype`` tensors."""
    check_weights({n: tuple(np.shape(v)) for n, v in weights.items()}, graph, source)
    out = {}
    for name, value in weights.items():
        t = value.detach() if isinstance(value, Tensor) else torch.from_numpy(np.asarray(value))
        out[name] = t.to(device="cpu", dtype=dtype, copy=True)
    return out


def to_torch(graph: Graph, seed: int = 0, weights: Mapping[str, Any] | None = None
             ) -> TorchModel:
    """The module for ``graph`` at the spec's dtype, in eval mode.

    Weights: ``weights`` (numpy arrays or tensors by design §4 name, e.g. another module's
    ``state_dict()``; names and shapes checked, TfgraphError listing what is missing,
    unexpected or mis-shaped), else ``tfgraph.weights.generate(graph, seed)``, the generator
    the ONNX back end shares, so one seed gives the same weights in both.
    """
    dtype = TORCH_DTYPES[graph.spec.dtype if graph.spec is not None else "float32"]
    if weights is None:
        values = {n: torch.from_numpy(a).to(dtype) for n, a in generate(graph, seed).items()}
    else:
        values = _as_tensors(graph, weights, dtype, "weights")
    cls = EncoderDecoderModel if len(graph.inputs) == 2 else DecoderOnlyOrEncoderModel
    return cls(graph, values).eval()

