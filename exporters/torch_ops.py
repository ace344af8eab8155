"""The PyTorch table: one lowering per op of ``tfgraph.ops.OPS`` (tinygrad's op tables as data).

``TORCH_OPS[op](module, attrs, *inputs)`` computes a node from its operands in operand order;
``TORCH_INPLACE`` has the in-place form of element-wise ops, which ``to_torch`` uses without
autograd when the walk (``tfgraph.plan``) says an operand is dead. The kernels themselves live in
``torch_functional``, shared with the generated ``model.py`` so both give bit-identical
outputs. A test asserts every op has a row here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from tfgraph.exporters import torch_functional as tf

ATTENTION_IMPLS = ("sdpa", "math")

# A lowering: fn(module, attrs, *inputs) -> output, inputs in the node's operand order.
Lowering = Callable[..., Tensor]
# What a step runs: a lowering, a layer call, or rope_tables_step (a (cos, sin) pair).
StepFn = Callable[..., Any]


def _linear(m: nn.Module, a: dict[str, Any], x: Tensor, w: Tensor, b: Tensor | None = None
            ) -> Tensor:
    return F.linear(x, w, b)  # (.., out)


def _norm_layer(m: nn.Module, a: dict[str, Any], x: Tensor, g: Tensor, b: Tensor) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), g, b, a["eps"])


def _positions_sinusoidal(m: nn.Module, a: dict[str, Any], x: Tensor) -> Tensor:
    return x + tf.sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype)  # (B, L, d)


def _rope(m: nn.Module, a: dict[str, Any], x: Tensor, tables: tuple[Tensor, Tensor]) -> Tensor:
    return tf.apply_rope(x, tables[0], tables[1], a["heads"], a["head_dim"])


def rope_tables_step(m: nn.Module, a: dict[str, Any], x: Tensor) -> tuple[Tensor, Tensor]:
    """Not an op: cos/sin for one sequence axis, computed once per forward by the model and
    passed to every layer whose rope nodes use that axis (so backward keeps one pair of tables,
    not one per layer)."""
    return tf.rope_tables(x.shape[1], a["head_dim"], a["theta"], x.device, x.dtype)


def _attention(m: nn.Module, a: dict[str, Any], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    impl = getattr(m, "attention_impl", "sdpa")
    return tf.attention(q, k, v, a["heads"], a["kv_heads"], a["head_dim"], a["causal"],
                        a["normalize"], impl)


TORCH_OPS: dict[str, Lowering] = {
    "embedding": lambda m, a, table, ids: F.embedding(ids, table),  # (B, L, d)
    "scale": lambda m, a, x: x * a["factor"],
    "positions_sinusoidal": _positions_sinusoidal,
    "positions_learned": lambda m, a, x, table: x + tf.learned_positions(x, table),
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

# In-place forms: a fresh multi-megabyte output costs page faults on CPU (large blocks come from
# and return to the OS), which made element-wise ops up to 10x slower than writing into their
# input. Same values bit for bit as TORCH_OPS. Commutative ops (tfgraph.ops) may be handed
# their operands swapped, so that the dead one is overwritten.
TORCH_INPLACE: dict[str, Lowering] = {
    "scale": lambda m, a, x: x.mul_(a["factor"]),
    "positions_sinusoidal": lambda m, a, x: x.add_(
        tf.sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype)),
    "positions_learned": lambda m, a, x, table: x.add_(tf.learned_positions(x, table)),
    "relu": lambda m, a, x: x.relu_(),
    "silu": lambda m, a, x: F.silu(x, inplace=True),
    "mul": lambda m, a, x, y: x.mul_(y),
    "add": lambda m, a, x, y: x.add_(y),
}
