"""The PyTorch table: one lowering per op of ``tfgraph.ops.OPS`` (tinygrad's op tables as data).

``TORCH_OPS[op](module, attrs, *inputs)`` computes a node from its operands in operand order;
``TORCH_INPLACE`` has the in-place form of element-wise ops, which ``to_torch`` uses without
autograd when the walk (``tfgraph.plan``) says an operand is dead. The kernels themselves live in
``torch_functional``, shared with the generated ``model.py`` so both give bit-identical
outputs. ``TORCH_SOURCE`` is the same table as source text: how ``model.py`` writes each op.
Tests assert every op has a row in both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F
from torch import Tensor, nn

from tfgraph.exporters import torch_functional as tf
from tfgraph.ir import Node

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


# ---- source templates: the same table for the generated model.py ---------------------------
# ``torch_source`` writes each op node of the graph as one line of Python. The templates below
# are the source-text twins of TORCH_OPS (tinygrad's renderer idea: one rendering rule per op),
# and must compute exactly what the lowering above computes, bit for bit, with autograd too:
# the kernels they call are torch_functional's, copied into model.py verbatim.

Attr = Callable[[str], str]
"""Renders one attribute of the node being written as Python source: a hyper-parameter
constant (``HEADS``), a literal (``True``), or ``self.<name>`` for a constructor argument."""


@dataclass(frozen=True)
class ModuleForm:
    """A ``torch.nn`` class that holds an op's parameters and computes the op when called, so
    model.py reads ``self.q(x)`` rather than ``F.linear(x, self.q.weight, self.q.bias)`` and its
    ``__init__`` says what each parameter group is.

    ``params`` names, per operand, the parameter's attribute on the module ("weight"), or ""
    for a data operand; trailing operands may be absent (a linear without bias). ``ctor`` writes
    the constructor from the parameters' dimensions (source text such as ``"HEADS * HEAD_DIM"``)
    and the node's attributes. Calling the module must compute exactly the TORCH_OPS row.
    """

    params: tuple[str, ...]
    ctor: Callable[[dict[str, tuple[str, ...]], Attr], str]


@dataclass(frozen=True)
class SharedInput:
    """An extra operand computed once per forward and handed to every node with the same
    ``key``, as ``to_torch`` does with the rotary tables (backward then keeps one pair of tables
    per sequence, not one per layer, which is what the cost report counts).

    ``expr(ref, attr)`` computes it from ``ref``, a tensor on the same sequence axis (its
    ``shape[1]``); ``name`` is its variable in model.py, ``annotation`` its type there, and
    ``comment(length)`` describes it for a sequence ``length``.
    """

    name: str
    key: Callable[[Node], tuple[Any, ...]]
    expr: Callable[[str, Attr], str]
    comment: Callable[[str], str]
    annotation: str = "Tensor"


Dims = Sequence[tuple[Any, ...]]
"""Per operand, its axes (described however the caller likes: names, sizes)."""


@dataclass(frozen=True)
class SourceTemplate:
    """How model.py writes one op: ``expr(operands, attr)`` is a Python expression over the
    operands' source text (variable names, or ``self.<path>`` for parameters), the shared input
    last when the op has one.

    ``dims`` names the output's axes from the operands' axis names, for the shape comments
    (default: the first operand's, right for every op whose output has its input's shape).
    """

    expr: Callable[[Sequence[str], Attr], str]
    dims: Callable[[Dims], tuple[Any, ...]] | None = None
    module: ModuleForm | None = None
    shared: SharedInput | None = None


def _linear_ctor(p: dict[str, tuple[str, ...]], a: Attr) -> str:
    out, in_ = p["weight"]
    return f"nn.Linear({in_}, {out}{'' if 'bias' in p else ', bias=False'})"


def _layer_norm_ctor(p: dict[str, tuple[str, ...]], a: Attr) -> str:
    bias = "" if "bias" in p else ", bias=False"
    return f"nn.LayerNorm({p['weight'][0]}, eps={a('eps')}{bias})"


def _layer_norm_src(o: Sequence[str], a: Attr) -> str:
    bias = o[2] if len(o) > 2 else "None"
    return f"F.layer_norm({o[0]}, ({o[0]}.shape[-1],), {o[1]}, {bias}, {a('eps')})"


def _attention_src(o: Sequence[str], a: Attr) -> str:
    return (f"attention({o[0]}, {o[1]}, {o[2]}, {a('heads')}, {a('kv_heads')}, "
            f"{a('head_dim')}, causal={a('causal')}, normalize={a('normalize')}, "
            "impl=ATTENTION_IMPL)")


ROPE_TABLES = SharedInput(
    name="rope",
    key=lambda n: (str(n.type.shape[1]), n.attrs["head_dim"], n.attrs["theta"]),
    expr=lambda x, a: (f"rope_tables({x}.shape[1], {a('head_dim')}, {a('theta')}, "
                       f"{x}.device, {x}.dtype)"),
    comment=lambda length: f"cos, sin ({length}, hd)",
    annotation="tuple[Tensor, Tensor]",
)

TORCH_SOURCE: dict[str, SourceTemplate] = {
    "embedding": SourceTemplate(
        lambda o, a: f"F.embedding({o[1]}, {o[0]})",
        dims=lambda d: (*d[1], d[0][-1]),
        module=ModuleForm(("weight", ""), lambda p, a: f"nn.Embedding({', '.join(p['weight'])})"),
    ),
    "scale": SourceTemplate(lambda o, a: f"{o[0]} * {a('factor')}"),
    "positions_sinusoidal": SourceTemplate(
        lambda o, a: f"{o[0]} + sinusoidal_positions({o[0]}.shape[1], {o[0]}.shape[2], "
                     f"{o[0]}.device, {o[0]}.dtype)"),
    "positions_learned": SourceTemplate(
        lambda o, a: f"{o[0]} + learned_positions({o[0]}, {o[1]})"),
    "rope": SourceTemplate(
        lambda o, a: f"apply_rope({o[0]}, *{o[1]}, {a('heads')}, {a('head_dim')})",
        shared=ROPE_TABLES),
    "linear": SourceTemplate(
        lambda o, a: f"F.linear({', '.join(o)})",
        dims=lambda d: (*d[0][:-1], d[1][0]),
        module=ModuleForm(("", "weight", "bias"), _linear_ctor),
    ),
    "attention": SourceTemplate(_attention_src),
    "layernorm": SourceTemplate(_layer_norm_src,
                                module=ModuleForm(("", "weight", "bias"), _layer_norm_ctor)),
    "rmsnorm": SourceTemplate(lambda o, a: f"rms_norm({o[0]}, {o[1]}, {a('eps')})"),
    "scalenorm": SourceTemplate(lambda o, a: f"scale_norm({o[0]}, {o[1]}, {a('eps')})"),
    "relu": SourceTemplate(lambda o, a: f"F.relu({o[0]})"),
    "gelu": SourceTemplate(lambda o, a: f"F.gelu({o[0]})"),
    "gelu_tanh": SourceTemplate(lambda o, a: f'F.gelu({o[0]}, approximate="tanh")'),
    "silu": SourceTemplate(lambda o, a: f"F.silu({o[0]})"),
    "mul": SourceTemplate(lambda o, a: f"{o[0]} * {o[1]}"),
    "add": SourceTemplate(lambda o, a: f"{o[0]} + {o[1]}"),
    "dropout": SourceTemplate(lambda o, a: f"dropout({o[0]}, {a('p')}, self.training)"),
    "softmax": SourceTemplate(lambda o, a: f"{o[0]}.softmax(dim=-1)"),
}

# Module-level settings the templates read besides hyper-parameters: name -> (value, comment).
SOURCE_SETTINGS: dict[str, tuple[str, str]] = {
    "ATTENTION_IMPL": ('"sdpa"', '"math": explicit matmuls, which FlopCounterMode counts'),
}
