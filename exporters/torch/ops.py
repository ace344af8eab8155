"""The PyTorch table: one lowering per op of ``tfgraph.graph.ops.OPS`` (tinygrad's op tables as data).

``TORCH_OPS[op](module, attrs, *inputs)`` computes a node from its operands in operand order;
``TORCH_INPLACE`` has the in-place form of element-wise ops, which ``to_torch`` uses without
autograd when the walk (``tfgraph.passes.liveness``) says an operand is dead. The kernels themselves live in
``torch_functional``, shared with the generated ``model.py`` so both give bit-identical
outputs. ``TORCH_SOURCE`` is the same table as source text: how ``model.py`` writes each op.
Tests assert every op has a row in both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tfgraph.exporters.torch import functional as tf
from tfgraph.graph.ir import Node
from tfgraph.graph.ops import OPS

ATTENTION_IMPLS = ("sdpa", "math")

# A lowering: fn(module, attrs, *inputs) -> output, inputs in the node's operand order.
Lowering = Callable[..., Tensor]
# What a step runs: a lowering, a layer call, or rope_tables_step (a (cos, sin) pair).
StepFn = Callable[..., Any]


def _linear(m: nn.Module, a: dict[str, Any], x: Tensor, w: Tensor, b: Tensor | None = None
            ) -> Tensor:
    return F.linear(x, w, b)  # (.., out)


def _norm_layer(m: nn.Module, a: dict[str, Any], x: Tensor, g: Tensor | None = None,
                b: Tensor | None = None) -> Tensor:
    return F.layer_norm(x, (x.shape[-1],), g, b, a["eps"])


def _sinusoids(a: dict[str, Any], x: Tensor, ids: Tensor | None = None) -> Tensor:
    if ids is not None:  # each token's own position (padding, KV cache)
        return tf.sinusoids_at(ids, x.shape[2], x.dtype, a.get("layout", "interleaved"))
    return tf.sinusoidal_positions(x.shape[1], x.shape[2], x.device, x.dtype,
                                   a.get("layout", "interleaved"))  # (L, d)


def _learned(a: dict[str, Any], x: Tensor, table: Tensor, ids: Tensor | None = None
             ) -> Tensor:
    if ids is not None:  # each token's own position (padding, KV cache)
        return tf.positions_at(table, ids, a.get("offset", 0))  # (B, L, d)
    return tf.learned_positions(x, table, a.get("offset", 0))  # (L, d)


def _positions_sinusoidal(m: nn.Module, a: dict[str, Any], x: Tensor,
                          ids: Tensor | None = None) -> Tensor:
    return x + _sinusoids(a, x, ids)  # (B, L, d)


def _kv_concat(m: nn.Module, a: dict[str, Any], *x: Tensor) -> Tensor:
    positions = getattr(m, "cache_position", None)  # set while a static cache runs
    if positions is not None and len(x) == 2:
        return tf.kv_write(x[0], x[1], positions, a["kv_heads"], a["head_dim"])
    return tf.kv_concat(x[0] if len(x) == 2 else None, x[-1], a["kv_heads"], a["head_dim"])


def _rope(m: nn.Module, a: dict[str, Any], x: Tensor, *rest: Any) -> Tensor:
    tables: tuple[Tensor, Tensor] = rest[-1]  # after the position ids, when given
    return tf.apply_rope(x, tables[0], tables[1], a["heads"], a["head_dim"],
                         a.get("rotary_dim"), a.get("interleaved", False))


# The rope attributes its cos/sin tables depend on besides the sequence length; those absent
# from a node (whole heads, rotate-half, unscaled) take rope_tables' defaults.
TABLE_ATTRS = ("theta", "inv_freq", "scale", "interleaved")


def rope_table_attrs(a: dict[str, Any]) -> dict[str, Any]:
    """What ``rope_tables_step`` reads from a rope node: the rotated width ``dim`` and
    ``TABLE_ATTRS``."""
    return {"dim": a.get("rotary_dim", a["head_dim"]),
            **{k: a[k] for k in TABLE_ATTRS if k in a}}


def rope_tables_step(m: nn.Module, a: dict[str, Any], x: Tensor) -> tuple[Tensor, Tensor]:
    """Not an op: cos/sin for one sequence axis, computed once per forward by the model and
    passed to every layer whose rope nodes use that axis (so backward keeps one pair of tables,
    not one per layer). ``x`` is a tensor along that axis, or the position ids (B, S) of a
    KV-cache graph (tables per token, in the dtype of the model's parameters, which follows
    ``.to()``; the graph's ``a["dtype"]`` for a module without them)."""
    if not x.is_floating_point():
        dtype = getattr(m, "dtype", a["dtype"])
        if not isinstance(dtype, torch.dtype):
            dtype = a["dtype"]
        return tf.rope_tables_at(x, a["dim"], a["theta"], dtype, a.get("inv_freq"),
                                 a.get("scale", 1.0), a.get("interleaved", False))
    return tf.rope_tables(x.shape[1], a["dim"], a["theta"], x.device, x.dtype,
                          a.get("inv_freq"), a.get("scale", 1.0), a.get("interleaved", False))


def _attention(m: nn.Module, a: dict[str, Any], q: Tensor, k: Tensor, v: Tensor,
               bias: Tensor | None = None) -> Tensor:
    impl = getattr(m, "attention_impl", "sdpa")
    return tf.attention(q, k, v, a["heads"], a["kv_heads"], a["head_dim"], a["causal"],
                        a["normalize"], impl, scale=a.get("scale"), softcap=a.get("softcap"),
                        window=a.get("window"), bias=bias, dropout=a.get("dropout", 0.0),
                        training=m.training)


TORCH_OPS: dict[str, Lowering] = {
    "embedding": lambda m, a, table, ids: F.embedding(ids, table,  # (B, L, d)
                                                      a.get("padding_idx")),
    "scale": lambda m, a, x: x * a["factor"],
    "positions_sinusoidal": _positions_sinusoidal,
    "positions_learned": lambda m, a, x, table, ids=None: x + _learned(a, x, table, ids),
    "pad_position_ids": lambda m, a, ids: tf.pad_position_ids(ids, a["pad"]),  # (B, L)
    "rope": _rope,
    "kv_concat": _kv_concat,
    "attention_cached": lambda m, a, q, k, v, mask, bias=None: tf.cached_attention(
        q, k, v, mask, a["heads"], a["kv_heads"], a["head_dim"], a["causal"], a["normalize"],
        a.get("scale"), a.get("softcap"), a.get("window"), a.get("self_read", True), bias,
        getattr(m, "cache_position", None), a.get("dropout", 0.0) if m.training else 0.0),
    "linear": _linear,
    "attention": _attention,
    "layernorm": _norm_layer,
    "rmsnorm": lambda m, a, x, g: tf.rms_norm(x, g, a["eps"]),
    "scalenorm": lambda m, a, x, g: tf.scale_norm(x, g, a["eps"]),
    "relu": lambda m, a, x: F.relu(x),
    "relu2": lambda m, a, x: F.relu(x).square(),
    "gelu": lambda m, a, x: F.gelu(x),
    "gelu_tanh": lambda m, a, x: F.gelu(x, approximate="tanh"),
    "silu": lambda m, a, x: F.silu(x),
    "mul": lambda m, a, x, y: x * y,
    "add": lambda m, a, x, y: x + y,
    "dropout": lambda m, a, x: tf.dropout(x, a["p"], m.training),
    "route": lambda m, a, logits, bias=None: tf.route(
        logits, a["top_k"], a["router"], bias, a.get("groups", 1), a.get("top_groups", 1),
        a.get("scale", 1.0), a.get("eps")),
    "head_slice": lambda m, a, x: tf.head_slice(x, a["groups"], a["start"], a["take"]),
    "head_concat": lambda m, a, x, y: tf.head_concat(x, y, a["heads"], a.get("shared", False)),
    "cache_rows": lambda m, a, x: x.squeeze(1),
    "experts": lambda m, a, x, w, *params: tf.experts(x, w, params, a["top_k"],
                                                      a["activation"]),
    "sigmoid_gate": lambda m, a, g, y: g.sigmoid() * y,
    "softmax": lambda m, a, x: x.softmax(dim=-1),
    "cross_entropy": lambda m, a, logits, labels: tf.cross_entropy(logits, labels),
    "softcap": lambda m, a, x: tf.soft_cap(x, a["cap"]),
    "clip": lambda m, a, x: x.clamp(-a["bound"], a["bound"]),
    "alibi": lambda m, a, x, keys=None: _alibi(a, x, keys, _queries(m, keys)),
    "relative_bias": lambda m, a, table, x, keys=None: tf.relative_position_bias(
        table, x.shape[1], a["bidirectional"], a["buckets"], a["max_distance"],
        None if keys is None else keys.shape[1], _queries(m, keys)),
}


def _queries(m: nn.Module, keys: Tensor | None) -> Tensor | None:
    """Where a KV-cache graph's queries sit among its T keys: a static cache's
    ``cache_position`` (set while one runs), else None (the last L of the T)."""
    return None if keys is None else getattr(m, "cache_position", None)


def _alibi(a: dict[str, Any], x: Tensor, keys: Tensor | None = None,
           queries: Tensor | None = None) -> Tensor:
    # TORCH_SOURCE's "alibi" template writes the same call into model.py; keys: a KV-cache
    # graph's (B, T) mask, its queries the last L of the T positions or at ``queries``
    slopes = torch.tensor(a["slopes"], device=x.device)  # (h,) float32
    return tf.alibi_bias(slopes, x, keys, bool(a.get("bfloat16")),
                         a["head_dim"] if a.get("scaled") else None, queries)


NORM_OPS = tuple(op for op, d in OPS.items() if d.category == "norm")  # OpDef.category
# Ops only a KV-cache graph has: model.py (TORCH_SOURCE) is rendered for full-sequence graphs.
CACHE_OPS = frozenset({"kv_concat", "attention_cached"})


def _per_head(norm: Lowering) -> Lowering:
    """A norm whose node has attrs['heads'] normalises each head's slice of the last axis on
    its own (per-head qk-norm: Qwen3, Gemma 3)."""
    def lowering(m: nn.Module, a: dict[str, Any], x: Tensor, *params: Tensor) -> Tensor:
        if "heads" not in a:
            return norm(m, a, x, *params)
        return norm(m, a, x.unflatten(-1, (a["heads"], -1)), *params).flatten(-2)
    return lowering


def _unit_offset(norm: Lowering) -> Lowering:
    """A norm whose node has attrs['unit_offset'] multiplies by (1 + gain) (Gemma)."""
    def lowering(m: nn.Module, a: dict[str, Any], x: Tensor, *params: Tensor) -> Tensor:
        if not a.get("unit_offset"):  # also a norm without parameters (OLMo 1)
            return norm(m, a, x, *params)
        return norm(m, a, x, params[0] + 1, *params[1:])
    return lowering


for _op in NORM_OPS:
    TORCH_OPS[_op] = _per_head(_unit_offset(TORCH_OPS[_op]))

# In-place forms: a fresh multi-megabyte output costs page faults on CPU (large blocks come from
# and return to the OS), which made element-wise ops up to 10x slower than writing into their
# input. Same values bit for bit as TORCH_OPS. Commutative ops (tfgraph.graph.ops) may be handed
# their operands swapped, so that the dead one is overwritten.
TORCH_INPLACE: dict[str, Lowering] = {
    "scale": lambda m, a, x: x.mul_(a["factor"]),
    "positions_sinusoidal": lambda m, a, x, ids=None: x.add_(_sinusoids(a, x, ids)),
    "positions_learned": lambda m, a, x, table, ids=None: x.add_(_learned(a, x, table, ids)),
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
    gain = o[1] if len(o) > 1 else "None"  # none: OLMo 1's norm without parameters
    bias = o[2] if len(o) > 2 else "None"
    return f"F.layer_norm({o[0]}, ({o[0]}.shape[-1],), {gain}, {bias}, {a('eps')})"


def _present(a: Attr, key: str) -> str | None:
    """``a(key)``, or None when the node has no attribute ``key`` (those a spec never sets)."""
    try:
        return a(key)
    except KeyError:
        return None


def alibi_source(o: Sequence[str], a: Attr) -> str:
    """_alibi written out for a full-sequence graph (no mask: positions 0..L-1 on every row):
    alibi_bias with Falcon-RW's options (attributes a lowering sets only when true)."""
    x = o[0]
    slopes = f"torch.tensor({a('slopes')}, device={x}.device)"
    rounded, scaled = _present(a, "bfloat16"), _present(a, "scaled")
    head_dim = "None" if scaled is None else f"({a('head_dim')} if {scaled} else None)"
    return f"alibi_bias({slopes}, {x}, None, {rounded or False}, {head_dim})"


def _attention_src(o: Sequence[str], a: Attr) -> str:
    extra = "".join(f", {key}={value}" for key in ("scale", "softcap", "window")
                    if (value := _present(a, key)) is not None)
    if len(o) > 3:
        extra += f", bias={o[3]}"  # T5's position bias
    if (p := _present(a, "dropout")) is not None:  # attention.dropout, training only
        extra += f", dropout={p}, training=self.training"
    # Head counts from q's and k's widths: under tensor parallelism a rank holds heads / tp
    # of them (model.py's parallelize), so the spec's HEADS would be wrong there.
    hd = a("head_dim")
    return (f"attention({o[0]}, {o[1]}, {o[2]}, {o[0]}.shape[-1] // {hd}, "
            f"{o[1]}.shape[-1] // {hd}, {hd}, causal={a('causal')}, "
            f"normalize={a('normalize')}, impl=ATTENTION_IMPL{extra})")


def _route_src(o: Sequence[str], a: Attr) -> str:
    extra = f", {o[1]}" if len(o) > 1 else ""  # the sigmoid routers' correction bias
    extra += "".join(f", {key}={value}" for key in ("groups", "top_groups", "scale", "eps")
                     if (value := _present(a, key)) is not None)
    return f"route({o[0]}, {a('top_k')}, {a('router')}{extra})"


def _optional(a: Attr, key: str) -> str:
    """``, value`` for an attribute lowering sets only off its default (a position offset, a
    sinusoid layout), else nothing: the argument's default in torch_functional applies."""
    try:
        return f", {a(key)}"
    except KeyError:
        return ""


def _rope_tables_src(x: str, a: Attr) -> str:
    dim = _present(a, "rotary_dim") or a("head_dim")
    extra = "".join(f", {key}={value}" for key in ("inv_freq", "scale", "interleaved")
                    if (value := _present(a, key)) is not None)
    return f"rope_tables({x}.shape[1], {dim}, {a('theta')}, {x}.device, {x}.dtype{extra})"


def _rope_src(o: Sequence[str], a: Attr) -> str:
    extra = "".join(f", {key}={value}" for key in ("rotary_dim", "interleaved")
                    if (value := _present(a, key)) is not None)
    hd = a("head_dim")  # this rank's heads: from the width, as in _attention_src
    return f"apply_rope({o[0]}, *{o[1]}, {o[0]}.shape[-1] // {hd}, {hd}{extra})"


ROPE_TABLES = SharedInput(
    name="rope",
    key=lambda n: (str(n.type.shape[1]), *sorted(rope_table_attrs(n.attrs).items())),
    expr=_rope_tables_src,
    comment=lambda length: f"cos, sin ({length}, rotated channels)",
    annotation="tuple[Tensor, Tensor]",
)


def _padding_idx(a: Attr) -> str:
    """``, padding_idx=N`` for a token lookup whose pad row gets no gradient, else nothing."""
    try:
        return f", padding_idx={a('padding_idx')}"
    except KeyError:
        return ""


def _learned_src(o: Sequence[str], a: Attr) -> str:
    """A learned table's rows: 0.. of the sequence, or each token's position id (RoBERTa's
    padding-aware ids, the third operand)."""
    if len(o) == 3:
        return f"{o[0]} + positions_at({o[1]}, {o[2]}{_optional(a, 'offset')})"
    return f"{o[0]} + learned_positions({o[0]}, {o[1]}{_optional(a, 'offset')})"


TORCH_SOURCE: dict[str, SourceTemplate] = {
    "embedding": SourceTemplate(
        lambda o, a: f"F.embedding({o[1]}, {o[0]}{_padding_idx(a)})",
        dims=lambda d: (*d[1], d[0][-1]),
        module=ModuleForm(("weight", ""), lambda p, a:
                          f"nn.Embedding({', '.join(p['weight'])}{_padding_idx(a)})"),
    ),
    "scale": SourceTemplate(lambda o, a: f"{o[0]} * {a('factor')}"),
    "positions_sinusoidal": SourceTemplate(
        lambda o, a: f"{o[0]} + sinusoidal_positions({o[0]}.shape[1], {o[0]}.shape[2], "
                     f"{o[0]}.device, {o[0]}.dtype{_optional(a, 'layout')})"),
    "positions_learned": SourceTemplate(_learned_src),
    "pad_position_ids": SourceTemplate(lambda o, a: f"pad_position_ids({o[0]}, {a('pad')})"),
    "rope": SourceTemplate(_rope_src, shared=ROPE_TABLES),
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
    "relu2": SourceTemplate(lambda o, a: f"F.relu({o[0]}).square()"),
    "gelu": SourceTemplate(lambda o, a: f"F.gelu({o[0]})"),
    "gelu_tanh": SourceTemplate(lambda o, a: f'F.gelu({o[0]}, approximate="tanh")'),
    "silu": SourceTemplate(lambda o, a: f"F.silu({o[0]})"),
    "mul": SourceTemplate(lambda o, a: f"{o[0]} * {o[1]}"),
    "add": SourceTemplate(lambda o, a: f"{o[0]} + {o[1]}"),
    "dropout": SourceTemplate(lambda o, a: f"dropout({o[0]}, {a('p')}, self.training)"),
    "route": SourceTemplate(_route_src),
    "cache_rows": SourceTemplate(lambda o, a: f"{o[0]}.squeeze(1)"),  # (cached graphs only)
    # (shape comments: the output's own sizes, where the first operand's axes disagree)
    "head_slice": SourceTemplate(
        lambda o, a: f"head_slice({o[0]}, {a('groups')}, {a('start')}, {a('take')})"),
    "head_concat": SourceTemplate(
        lambda o, a: f"head_concat({o[0]}, {o[1]}, {a('heads')}"
                     + "".join(f", shared={v}" for v in [_present(a, "shared")] if v)
                     + ")"),
    "experts": SourceTemplate(
        lambda o, a: f"experts({o[0]}, {o[1]}, ({', '.join(o[2:])},), {a('top_k')}, "
                     f"{a('activation')})"),
    "sigmoid_gate": SourceTemplate(lambda o, a: f"{o[0]}.sigmoid() * {o[1]}",
                                   dims=lambda d: d[1]),
    "softmax": SourceTemplate(lambda o, a: f"{o[0]}.softmax(dim=-1)"),
    "cross_entropy": SourceTemplate(lambda o, a: f"cross_entropy({o[0]}, {o[1]})",
                                    dims=lambda d: ()),
    "softcap": SourceTemplate(lambda o, a: f"soft_cap({o[0]}, {a('cap')})"),
    "clip": SourceTemplate(lambda o, a: f"{o[0]}.clamp(-{a('bound')}, {a('bound')})"),
    "alibi": SourceTemplate(alibi_source),
    "relative_bias": SourceTemplate(
        lambda o, a: f"relative_position_bias({o[0]}, {o[1]}.shape[1], {a('bidirectional')}, "
                     f"{a('buckets')}, {a('max_distance')})",
        dims=lambda d: (d[0][1], d[1][1], d[1][1])),
}

def unit_offset_source(norm: SourceTemplate) -> SourceTemplate:
    """The source of a norm node with attrs['unit_offset'] (``_unit_offset``): the gain
    operand plus 1; no ``torch.nn`` module form (nn.LayerNorm would use the stored gain)."""
    def expr(o: Sequence[str], a: Attr) -> str:
        return norm.expr([o[0], f"({o[1]} + 1)", *o[2:]], a)
    return SourceTemplate(expr)


def per_head_source(norm: SourceTemplate) -> SourceTemplate:
    """The source of a norm node with attrs['heads'] (``_per_head``): the same template on
    the input split into heads, merged back; no ``torch.nn`` module form."""
    def expr(o: Sequence[str], a: Attr) -> str:
        split = f"{o[0]}.unflatten(-1, (-1, {o[1]}.shape[-1]))"  # this rank's heads
        return f"{norm.expr([split, *o[1:]], a)}.flatten(-2)"
    return SourceTemplate(expr)


# Module-level settings the templates read besides hyper-parameters: name -> (value, comment).
SOURCE_SETTINGS: dict[str, tuple[str, str]] = {
    "ATTENTION_IMPL": ('"sdpa"', '"math": explicit matmuls, which FlopCounterMode counts'),
}
