"""ONNX back end: the op graph written directly as an ``onnx.ModelProto`` (no tracing, no torch).

One emitter per op of ``tfgraph.ops.OPS`` lives in ``ONNX_OPS`` (op name -> function). An emitter
receives the builder and the IR node and appends ONNX nodes; its last node writes the tensor
named after the IR node, so every IR value keeps its name (and a value_info with its symbolic
shape) in the model. ONNX node names are ``"{ir node}/{OpType}"`` ("decoder.layers.3.self_attn.q
/MatMul"), so viewers show the scope structure.

Two lowerings share the table:
- ``opset >= 23`` uses the fused standard ops ONNX now has: ``Attention`` (causal, GQA),
  ``RMSNormalization``, ``RotaryEmbedding`` (rotate-half), ``Gelu`` (opset 20) and
  ``LayerNormalization`` (opset 17). Hard attention has no fused form: MatMul + ``Hardmax``.
- ``opset = 17`` decomposes attention, RMS norm, rotary positions and GELU into MatMul,
  Softmax, ReduceMean, Erf, Tanh and friends, for older runtimes.

Parameters become initializers at their design §4 names in torch's layout (a tied table is one
initializer read twice); constants (sinusoid frequencies, scales, masks) are ``Constant`` nodes,
so the initializer names are exactly the state_dict keys. Positional tables, rotary cos/sin and
causal masks are computed in the graph from the runtime sequence length, so every sequence
length works without a baked-in maximum (learned positions still stop at ``max_len``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper

from tfgraph.cost import weights_bytes
from tfgraph.errors import TfgraphError
from tfgraph.ir import B, S, T, Graph, Node
from tfgraph.ops import OPS, sinusoid_frequencies

MIN_OPSET, MAX_OPSET = 17, 23
# Fused ops exist from these opsets on; below, the emitters decompose them.
ATTENTION_OPSET = RMSNORM_OPSET = ROPE_OPSET = 23
GELU_OPSET = 20
# A single protobuf cannot exceed 2 GiB; larger models keep their weights in a side file.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000  # bytes of weights; leaves room for the graph itself
# Generated weights in flight ahead of the writer (see parameter_values).
LOOKAHEAD_BYTES = 512 * 1024 * 1024

ELEM_TYPE = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "int64": TensorProto.INT64,
}
SPEC_METADATA_KEY = "tfgraph.spec"  # the spec as JSON, so `tfgraph run MODEL.onnx --check` works


# ---- weights ------------------------------------------------------------------------------


def as_float32(value: Any) -> np.ndarray:
    """A numpy float32 array from a numpy array or a torch tensor (duck-typed: no torch import)."""
    if hasattr(value, "detach"):  # torch.Tensor (any dtype, any device)
        value = value.detach().cpu().float().numpy()
    return np.asarray(value, dtype=np.float32)


def numpy_dtype(dtype: str) -> Any:
    if dtype == "bfloat16":
        import ml_dtypes  # onnx's own dependency for bfloat16 arrays

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def make_initializer(name: str, value: np.ndarray, dtype: str) -> TensorProto:
    """A raw-data TensorProto of ``value`` cast to ``dtype`` (float32, float16 or bfloat16)."""
    array = cast_array(value, dtype)
    tensor = tensor_header(name, array, dtype)
    tensor.raw_data = array.tobytes()  # little-endian hosts only, as onnx itself assumes
    return tensor


def weight_source(graph: Graph, weights: Mapping[str, Any] | None,
                  seed: int) -> Callable[[Node], np.ndarray]:
    """name -> float32 value: from ``weights`` (checked) or tfgraph.weights' generator."""
    if weights is None:
        from tfgraph.weights import init_param

        return lambda p: init_param(p.name, p.attrs["shape"], p.attrs["init"], seed)
    from tfgraph.weights import check_weights

    check_weights({n: tuple(np.shape(v)) for n, v in weights.items()}, graph, "weights")
    return lambda p: as_float32(weights[p.name])


# ---- the builder --------------------------------------------------------------------------


class _Builder:
    """Accumulates ONNX nodes for one graph; shared helpers (sequence lengths, position
    tables, masks) are built once and cached by what they depend on."""

    def __init__(self, graph: Graph, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        self.dtype = graph.spec.dtype if graph.spec is not None else "float32"
        self.nodes: list[onnx.NodeProto] = []
        self._used: set[str] = set()
        self._cache: dict[tuple[Any, ...], Any] = {}
        self.dim_names = _dim_names(graph)
        # The graph input whose second axis is each sequence symbol (S or T): runtime lengths
        # are read from it.
        self.ids_for: dict[Any, str] = {graph.node(i).type.shape[1]: i for i in graph.inputs}

    # -- naming and node creation

    def _unique(self, name: str) -> str:
        base, k = name, 1
        while name in self._used:
            k += 1
            name = f"{base}_{k}"
        self._used.add(name)
        return name

    def add(self, scope: str, op_type: str, inputs: Iterable[str], output: str | None = None,
            tag: str | None = None, **attrs: Any) -> str:
        """Append one ONNX node named ``{scope}/{tag or op_type}``; returns its output name
        (``output`` when given: the IR node's own name for the emitter's last node)."""
        name = self._unique(f"{scope}/{tag or op_type}")
        out = output if output is not None else name
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def const(self, scope: str, tag: str, value: Any, dtype: str | None = None) -> str:
        """A ``Constant`` node of ``dtype`` (default: the model's), one per scope and value."""
        dtype = dtype or self.dtype
        if dtype == "int64":
            array = np.asarray(value, dtype=np.int64)
            tensor = onnx.numpy_helper.from_array(array, "value")
        else:
            array = np.asarray(value, dtype=np.float32)
            tensor = make_initializer("value", array, dtype)
        key = ("const", scope, dtype, array.shape, array.tobytes())
        if key not in self._cache:
            self._cache[key] = self.add(scope, "Constant", [], tag=tag, value=tensor)
        return self._cache[key]

    def ints(self, values: list[int]) -> str:
        """A 1-D int64 constant (shapes, axes, slice bounds)."""
        return self.const("const", "ints", np.array(values, dtype=np.int64), "int64")

    def cast(self, scope: str, x: str, to: str, tag: str = "Cast") -> str:
        return self.add(scope, "Cast", [x], tag=tag, to=ELEM_TYPE[to])

    def reduce(self, scope: str, op: str, x: str, axes: list[int]) -> str:
        """ReduceMean/ReduceSum keeping dims; ReduceMean takes axes as an input from opset 18."""
        if op == "ReduceMean" and self.opset < 18:
            return self.add(scope, op, [x], axes=axes, keepdims=1)
        return self.add(scope, op, [x, self.ints(axes)], keepdims=1)

    # -- shared, cached helpers

    def seq_len(self, sym: Any) -> str:
        """The runtime length of sequence symbol ``sym`` as an int64 scalar."""
        key = ("len", sym)
        if key not in self._cache:
            ids = self.ids_for[sym]
            scope = f"{self.dim_names[sym]}"
            shape = self.add(scope, "Shape", [ids], start=1, end=2)  # (1,) = [L]
            self._cache[key] = self.add(scope, "Squeeze", [shape, self.ints([0])])  # ()
        return self._cache[key]

    def arange(self, sym: Any) -> str:
        """0, 1, ..., L-1 as int64, shape (L,)."""
        key = ("arange", sym)
        if key not in self._cache:
            zero = self.const("const", "zero", np.array(0, np.int64), "int64")
            one = self.const("const", "one", np.array(1, np.int64), "int64")
            scope = f"arange.{self.dim_names[sym]}"
            self._cache[key] = self.add(scope, "Range", [zero, self.seq_len(sym), one])
        return self._cache[key]

    def positions(self, sym: Any) -> str:
        """0, 1, ..., L-1 as float32, shape (L, 1)."""
        key = ("positions", sym)
        if key not in self._cache:
            scope = f"positions.{self.dim_names[sym]}"
            r = self.cast(scope, self.arange(sym), "float32")
            self._cache[key] = self.add(scope, "Unsqueeze", [r, self.ints([1])])  # (L, 1)
        return self._cache[key]

    def position_ids(self, sym: Any) -> str:
        """0..L-1 on every row, int64 (B, L): RotaryEmbedding's position_ids."""
        key = ("position_ids", sym)
        if key not in self._cache:
            scope = f"rope.{self.dim_names[sym]}"
            r = self.add(scope, "Unsqueeze", [self.arange(sym), self.ints([0])])  # (1, L)
            ids_shape = self.add(scope, "Shape", [self.ids_for[sym]])  # [B, L]
            self._cache[key] = self.add(scope, "Expand", [r, ids_shape], tag="position_ids")
        return self._cache[key]

    def causal_mask(self, sym: Any) -> str:
        """(L, L) bool, True where key position <= query position."""
        key = ("causal", sym)
        if key not in self._cache:
            scope = f"causal_mask.{self.dim_names[sym]}"
            r = self.arange(sym)  # (L,)
            rows = self.add(scope, "Unsqueeze", [r, self.ints([1])], tag="rows")  # (L, 1)
            cols = self.add(scope, "Unsqueeze", [r, self.ints([0])], tag="cols")  # (1, L)
            self._cache[key] = self.add(scope, "LessOrEqual", [cols, rows])  # (L, L)
        return self._cache[key]

    def rope_tables(self, sym: Any, head_dim: int, theta: float) -> tuple[str, str]:
        """cos and sin of pos * theta^(-2i/hd), (L, hd/2), in the model dtype."""
        key = ("rope", sym, head_dim, theta)
        if key not in self._cache:
            scope = f"rope.{self.dim_names[sym]}.hd{head_dim}"
            inv = [theta ** (-2.0 * i / head_dim) for i in range(head_dim // 2)]
            freqs = self.const(scope, "inv_freq", np.array([inv], np.float32), "float32")
            angles = self.add(scope, "Mul", [self.positions(sym), freqs])  # (L, hd/2)
            cos = self.add(scope, "Cos", [angles])
            sin = self.add(scope, "Sin", [angles])
            if self.dtype != "float32":
                cos, sin = self.cast(scope, cos, self.dtype), self.cast(scope, sin, self.dtype)
            self._cache[key] = (cos, sin)
        return self._cache[key]


def _dim_names(graph: Graph) -> dict[Any, str]:
    """Symbolic dims as ONNX dim_params (design §6): batch, seq_len or src_len/tgt_len."""
    if len(graph.inputs) == 1:
        return {B: "batch", S: "seq_len"}
    return {B: "batch", S: "src_len", T: "tgt_len"}


def _dims(shape: tuple[Any, ...], names: dict[Any, str]) -> list[int | str]:
    out: list[int | str] = []
    for d in shape:
        if getattr(d, "is_Integer", False) or isinstance(d, int):
            out.append(int(d))
        else:  # a symbol or a product of symbols, written with the dim names
            text = str(d)
            for sym, label in names.items():
                text = text.replace(str(sym), label)
            out.append(text)
    return out


# ---- emitters (one per op; each writes the tensor named node.name last) -------------------

Emitter = Callable[[_Builder, Node], str]


def _embedding(b: _Builder, n: Node) -> str:
    table, ids = n.inputs  # (V, d), (B, L)
    return b.add(n.name, "Gather", [table, ids], n.name, axis=0)  # (B, L, d)


def _scale(b: _Builder, n: Node) -> str:
    factor = b.const(n.name, "factor", n.attrs["factor"])
    return b.add(n.name, "Mul", [n.inputs[0], factor], n.name)


def _seq_sym(b: _Builder, n: Node) -> Any:
    return b.graph.node(n.inputs[0]).type.shape[1]


def _positions_sinusoidal(b: _Builder, n: Node) -> str:
    # PE[pos, 2i] = sin(pos * f_i), PE[pos, 2i+1] = cos(pos * f_i): interleave sin and cos.
    x = n.inputs[0]  # (B, L, d)
    d = int(b.graph.node(x).type.shape[-1])
    freqs = np.array([sinusoid_frequencies(d)], np.float32)  # (1, ceil(d/2))
    f = b.const(n.name, "freqs", freqs, "float32")
    angles = b.add(n.name, "Mul", [b.positions(_seq_sym(b, n)), f])  # (L, d/2)
    sin = b.add(n.name, "Unsqueeze", [b.add(n.name, "Sin", [angles]), b.ints([2])], tag="sin")
    cos = b.add(n.name, "Unsqueeze", [b.add(n.name, "Cos", [angles]), b.ints([2])], tag="cos")
    pe = b.add(n.name, "Concat", [sin, cos], axis=2)  # (L, d/2, 2)
    pe = b.add(n.name, "Reshape", [pe, b.ints([0, -1])])  # (L, 2 * ceil(d/2))
    if d % 2:
        pe = b.add(n.name, "Slice", [pe, b.ints([0]), b.ints([d]), b.ints([1])])  # (L, d)
    if b.dtype != "float32":
        pe = b.cast(n.name, pe, b.dtype)
    return b.add(n.name, "Add", [x, pe], n.name)  # (B, L, d)


def _positions_learned(b: _Builder, n: Node) -> str:
    x, table = n.inputs  # (B, L, d), (max_len, d)
    length = b.add(n.name, "Shape", [x], start=1, end=2)  # (1,) = [L]
    rows = b.add(n.name, "Slice", [table, b.ints([0]), length, b.ints([0])])  # (L, d)
    return b.add(n.name, "Add", [x, rows], n.name)


def _rope(b: _Builder, n: Node) -> str:
    x = n.inputs[0]  # (B, L, h*hd)
    h, hd, theta = n.attrs["heads"], n.attrs["head_dim"], float(n.attrs["theta"])
    sym = _seq_sym(b, n)
    cos, sin = b.rope_tables(sym, hd, theta)  # (L, hd/2) each
    if b.opset >= ROPE_OPSET:
        return b.add(n.name, "RotaryEmbedding", [x, cos, sin, b.position_ids(sym)], n.name,
                     num_heads=h, interleaved=0)
    # rotate-half by hand: x * cos + concat(-x2, x1) * sin on (B, L, h, hd)
    half = hd // 2
    cos2 = b.add(n.name, "Concat", [cos, cos], tag="cos", axis=1)  # (L, hd)
    sin2 = b.add(n.name, "Concat", [sin, sin], tag="sin", axis=1)
    cos2 = b.add(n.name, "Unsqueeze", [cos2, b.ints([1])], tag="cos_h")  # (L, 1, hd)
    sin2 = b.add(n.name, "Unsqueeze", [sin2, b.ints([1])], tag="sin_h")
    x4 = b.add(n.name, "Reshape", [x, b.ints([0, 0, h, hd])])  # (B, L, h, hd)
    x1 = b.add(n.name, "Slice", [x4, b.ints([0]), b.ints([half]), b.ints([3])], tag="x1")
    x2 = b.add(n.name, "Slice", [x4, b.ints([half]), b.ints([hd]), b.ints([3])], tag="x2")
    rot = b.add(n.name, "Concat", [b.add(n.name, "Neg", [x2]), x1], tag="rotate_half", axis=3)
    y = b.add(n.name, "Add", [b.add(n.name, "Mul", [x4, cos2], tag="x_cos"),
                              b.add(n.name, "Mul", [rot, sin2], tag="rot_sin")])
    return b.add(n.name, "Reshape", [y, b.ints([0, 0, h * hd])], n.name, tag="merge_heads")


def _linear(b: _Builder, n: Node) -> str:
    x, w = n.inputs[0], n.inputs[1]  # (.., in), [out, in]
    wt = b.add(n.name, "Transpose", [w], perm=[1, 0])  # [in, out]; constant-folded by ORT
    if len(n.inputs) == 2:
        return b.add(n.name, "MatMul", [x, wt], n.name)
    y = b.add(n.name, "MatMul", [x, wt])
    return b.add(n.name, "Add", [y, n.inputs[2]], n.name)  # + bias


def _attention(b: _Builder, n: Node) -> str:
    q, k, v = n.inputs  # (B, Tq, h*hd), (B, Tk, kv*hd), (B, Tk, kv*hd)
    h, kv, hd = n.attrs["heads"], n.attrs["kv_heads"], n.attrs["head_dim"]
    scale = 1.0 / math.sqrt(hd)
    if n.attrs["normalize"] == "softmax" and b.opset >= ATTENTION_OPSET:
        return b.add(n.name, "Attention", [q, k, v], n.name, q_num_heads=h, kv_num_heads=kv,
                     is_causal=int(n.attrs["causal"]), scale=scale)
    # Explicit form. Query heads are grouped under their kv head (head j reads kv head
    # j // g), which broadcasting over a size-1 group axis gives without copying k or v.
    g = h // kv
    q5 = b.add(n.name, "Reshape", [q, b.ints([0, 0, kv, g, hd])], tag="split_q")
    q5 = b.add(n.name, "Transpose", [q5], tag="q_heads", perm=[0, 2, 3, 1, 4])  # (B,kv,g,Tq,hd)
    k5 = b.add(n.name, "Reshape", [k, b.ints([0, 0, kv, 1, hd])], tag="split_k")
    kt = b.add(n.name, "Transpose", [k5], tag="k_heads_t", perm=[0, 2, 3, 4, 1])  # (B,kv,1,hd,Tk)
    v5 = b.add(n.name, "Reshape", [v, b.ints([0, 0, kv, 1, hd])], tag="split_v")
    v5 = b.add(n.name, "Transpose", [v5], tag="v_heads", perm=[0, 2, 3, 1, 4])  # (B,kv,1,Tk,hd)
    scores = b.add(n.name, "MatMul", [q5, kt], tag="scores")  # (B, kv, g, Tq, Tk)
    scores = b.add(n.name, "Mul", [scores, b.const(n.name, "scale", scale)], tag="scaled")
    if n.attrs["causal"]:
        mask = b.causal_mask(_seq_sym(b, n))  # (Tq, Tk) bool
        neg = b.const(n.name, "neg_inf", -np.inf)
        scores = b.add(n.name, "Where", [mask, scores, neg], tag="causal")
    normalize = "Hardmax" if n.attrs["normalize"] == "hardmax" else "Softmax"
    weights = b.add(n.name, normalize, [scores], axis=-1)  # (B, kv, g, Tq, Tk)
    out = b.add(n.name, "MatMul", [weights, v5], tag="context")  # (B, kv, g, Tq, hd)
    out = b.add(n.name, "Transpose", [out], tag="merge", perm=[0, 3, 1, 2, 4])  # (B,Tq,kv,g,hd)
    return b.add(n.name, "Reshape", [out, b.ints([0, 0, h * hd])], n.name, tag="merge_heads")


def _layernorm(b: _Builder, n: Node) -> str:
    return b.add(n.name, "LayerNormalization", list(n.inputs), n.name, axis=-1,
                 epsilon=float(n.attrs["eps"]))


def _to_f32(b: _Builder, n: Node, x: str) -> str:
    """Norm statistics in float32 for 16-bit models, as the fused ops' stash_type does."""
    return x if b.dtype == "float32" else b.cast(n.name, x, "float32", tag="to_float32")


def _from_f32(b: _Builder, n: Node, x: str) -> str:
    return x if b.dtype == "float32" else b.cast(n.name, x, b.dtype, tag="to_dtype")


def _rmsnorm(b: _Builder, n: Node) -> str:
    x, gain = n.inputs
    eps = float(n.attrs["eps"])
    if b.opset >= RMSNORM_OPSET:
        return b.add(n.name, "RMSNormalization", [x, gain], n.name, axis=-1, epsilon=eps)
    xf = _to_f32(b, n, x)
    ms = b.reduce(n.name, "ReduceMean", b.add(n.name, "Mul", [xf, xf], tag="square"), [-1])
    ms = b.add(n.name, "Add", [ms, b.const(n.name, "eps", eps, "float32")], tag="add_eps")
    y = b.add(n.name, "Div", [xf, b.add(n.name, "Sqrt", [ms])])
    return b.add(n.name, "Mul", [_from_f32(b, n, y), gain], n.name, tag="gain")


def _scalenorm(b: _Builder, n: Node) -> str:
    # g * x / sqrt(sum(x^2) + eps), one scalar g (shape (1,))
    x, gain = n.inputs
    xf = _to_f32(b, n, x)
    ss = b.reduce(n.name, "ReduceSum", b.add(n.name, "Mul", [xf, xf], tag="square"), [-1])
    ss = b.add(n.name, "Add", [ss, b.const(n.name, "eps", float(n.attrs["eps"]), "float32")],
               tag="add_eps")
    y = b.add(n.name, "Div", [xf, b.add(n.name, "Sqrt", [ss])])
    return b.add(n.name, "Mul", [_from_f32(b, n, y), gain], n.name, tag="gain")


def _gelu_common(b: _Builder, n: Node, approximate: str) -> str:
    x = n.inputs[0]
    if b.opset >= GELU_OPSET:
        return b.add(n.name, "Gelu", [x], n.name, approximate=approximate)
    half = b.const(n.name, "half", 0.5)
    one = b.const(n.name, "one", 1.0)
    if approximate == "none":  # 0.5 x (1 + erf(x / sqrt 2))
        inner = b.add(n.name, "Erf", [b.add(n.name, "Mul", [x, b.const(
            n.name, "inv_sqrt2", 1 / math.sqrt(2))], tag="x_over_sqrt2")])
    else:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = b.add(n.name, "Mul", [b.add(n.name, "Mul", [x, x], tag="x2"), x], tag="x3")
        cube = b.add(n.name, "Mul", [cube, b.const(n.name, "c", 0.044715)], tag="c_x3")
        arg = b.add(n.name, "Mul", [b.add(n.name, "Add", [x, cube]),
                                    b.const(n.name, "k", math.sqrt(2 / math.pi))], tag="arg")
        inner = b.add(n.name, "Tanh", [arg])
    y = b.add(n.name, "Mul", [x, b.add(n.name, "Add", [inner, one], tag="one_plus")], tag="x_mul")
    return b.add(n.name, "Mul", [y, half], n.name, tag="half")


def _silu(b: _Builder, n: Node) -> str:
    x = n.inputs[0]
    return b.add(n.name, "Mul", [x, b.add(n.name, "Sigmoid", [x])], n.name)


def _simple(op_type: str, **attrs: Any) -> Emitter:
    def emit(b: _Builder, n: Node) -> str:
        return b.add(n.name, op_type, list(n.inputs), n.name, **attrs)

    return emit


ONNX_OPS: dict[str, Emitter] = {
    "embedding": _embedding,
    "scale": _scale,
    "positions_sinusoidal": _positions_sinusoidal,
    "positions_learned": _positions_learned,
    "rope": _rope,
    "linear": _linear,
    "attention": _attention,
    "layernorm": _layernorm,
    "rmsnorm": _rmsnorm,
    "scalenorm": _scalenorm,
    "relu": _simple("Relu"),
    "gelu": lambda b, n: _gelu_common(b, n, "none"),
    "gelu_tanh": lambda b, n: _gelu_common(b, n, "tanh"),
    "silu": _silu,
    "mul": _simple("Mul"),
    "add": _simple("Add"),
    "dropout": _simple("Identity"),  # inference: dropout is the identity
    "softmax": _simple("Softmax", axis=-1),
}

_missing = sorted(set(OPS) - set(ONNX_OPS))
assert not _missing, f"ONNX back end has no lowering for ops {_missing}"


# ---- model assembly -----------------------------------------------------------------------


def check_opset(opset: int) -> int:
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= MAX_OPSET:
        raise TfgraphError(f"opset {opset} is not supported: choose {MIN_OPSET}..{MAX_OPSET} "
                           f"({MAX_OPSET} uses the fused Attention/RMSNormalization/"
                           f"RotaryEmbedding ops, {MIN_OPSET} decomposes them)")
    return opset


def _value_info(b: _Builder, node: Node) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(node.name, ELEM_TYPE[node.type.dtype],
                                         _dims(node.type.shape, b.dim_names))


def build_structure(graph: Graph, opset: int = MAX_OPSET) -> onnx.ModelProto:
    """The model without initializer data: nodes, inputs, outputs, value infos, metadata."""
    check_opset(opset)
    b = _Builder(graph, opset)
    value_infos = []
    for node in graph.ops():
        out = ONNX_OPS[node.op](b, node)
        if out != node.name:  # an emitter contract, not a user error
            raise AssertionError(f"{node.name}: ONNX emitter for {node.op} wrote {out}")
        if node.name not in graph.outputs:
            value_infos.append(_value_info(b, node))
    onnx_graph = helper.make_graph(
        b.nodes, graph.name,
        inputs=[_value_info(b, graph.node(i)) for i in graph.inputs],
        outputs=[_value_info(b, graph.node(o)) for o in graph.outputs],
        value_info=value_infos,
    )
    opsets = [helper.make_opsetid("", opset)]
    model = helper.make_model(
        onnx_graph, opset_imports=opsets, producer_name="tfgraph",
        # The lowest IR version that carries this opset: onnx 1.23 would write IR 14 by
        # default, which onnxruntime 1.31 rejects (design §7).
        ir_version=helper.find_min_ir_version_for(opsets),
    )
    from tfgraph import __version__

    model.producer_version = __version__
    if graph.spec is not None:
        model.doc_string = graph.spec.description
        helper.set_model_props(model, {
            SPEC_METADATA_KEY: json.dumps(graph.spec.model_dump(mode="json"), sort_keys=True),
        })
    return model


def to_onnx(graph: Graph, weights: Mapping[str, Any] | None = None, seed: int = 0,
            opset: int = MAX_OPSET) -> onnx.ModelProto:
    """``graph`` as an ONNX model whose initializers are the parameters (design §4 names).

    ``weights``: name -> array (numpy, or a torch state_dict's tensors); default: the shared
    generator ``tfgraph.weights.generate(graph, seed)``, so the same seed gives the torch back
    end's weights. Raises TfgraphError for weights with wrong names or shapes, or a bad opset.
    """
    model = build_structure(graph, opset)
    model.graph.initializer.extend(
        make_initializer(p.name, value, p.type.dtype)
        for p, value in parameter_values(graph, weights, seed))
    return model


def parameter_values(graph: Graph, weights: Mapping[str, Any] | None, seed: int,
                     workers: int | None = None) -> Iterator[tuple[Node, np.ndarray]]:
    """(parameter, float32 value) in graph order, produced ahead on worker threads.

    numpy's generators release the GIL while filling arrays, so the parameters after this
    one are generated on the other cores while this one is cast and written. What is in
    flight is bounded by LOOKAHEAD_BYTES (or one parameter, when a single one is larger), so
    memory stays bounded for any model size; a model's first parameter is often its largest
    (the token table) and the others go on being generated while the writer waits for it.
    """
    value_of = weight_source(graph, weights, seed)
    params = graph.params()
    workers = workers or min(8, os.cpu_count() or 1)
    pool = ThreadPoolExecutor(workers, thread_name_prefix="tfgraph-weights")
    try:
        pending: deque[tuple[Node, Any, int]] = deque()
        in_flight, nxt = 0, 0
        while nxt < len(params) or pending:
            while nxt < len(params):
                param = params[nxt]
                size = 4 * math.prod(param.attrs["shape"])  # float32 until cast
                # A parameter larger than the budget is generated alone: several multi-GB
                # matrices in flight at once would exhaust memory (huge specs were OOM-killed).
                if pending and in_flight + size > LOOKAHEAD_BYTES:
                    break
                pending.append((param, pool.submit(value_of, param), size))
                in_flight += size
                nxt += 1
            param, future, size = pending.popleft()
            in_flight -= size
            yield param, future.result()
    finally:  # a failed write stops here: drop the weights not yet started
        pool.shutdown(wait=True, cancel_futures=True)


def write_memory_bytes(graph: Graph) -> int:
    """Memory that writing ``graph``'s weights can hold at once: the largest parameter in
    float32 plus its cast copy, twice (the one being written and the next one generated)."""
    from tfgraph.ir import DTYPE_BYTES

    largest = max((math.prod(p.attrs["shape"]) for p in graph.params()), default=0)
    dtype = graph.spec.dtype if graph.spec is not None else "float32"
    cast = 0 if dtype == "float32" else DTYPE_BYTES[dtype]
    return 2 * largest * (4 + cast)


def write_onnx(graph: Graph, path: str | os.PathLike[str], weights: Mapping[str, Any] | None = None,
               seed: int = 0, opset: int = MAX_OPSET,
               progress: Callable[[int], None] | None = None) -> Path:
    """Write ``graph`` as an ONNX file atomically (no partial file; an old one survives a failure).

    Weights are streamed one parameter at a time from their arrays to the file, never held
    all at once nor copied into one big protobuf. Models whose weights pass ~1.8 GB keep them
    in ``<path>.data`` next to the model (protobuf stops at 2 GiB). ``progress`` is called
    with the bytes of each parameter written.
    """
    from tfgraph.io import atomic_path, check_capacity

    target = Path(path)
    check_capacity(target, weights_bytes(graph), write_memory_bytes(graph))
    model = build_structure(graph, opset)
    values = parameter_values(graph, weights, seed)
    if weights_bytes(graph) <= EXTERNAL_DATA_THRESHOLD:
        with atomic_path(target) as tmp, _write_errors(target), open(tmp, "wb") as out:
            out.write(model.SerializeToString())  # everything but the weights
            for param, value in values:
                array = cast_array(value, param.type.dtype)
                _append_initializer(out, tensor_header(param.name, array, param.type.dtype), array)
                if progress:
                    progress(array.nbytes)
            out.flush()
            os.fsync(out.fileno())
        return target
    data_target = target.with_name(target.name + ".data")
    with atomic_path(data_target) as tmp_data, atomic_path(target) as tmp_model, \
            _write_errors(target):
        with open(tmp_data, "wb") as data:
            for param, value in values:
                array = cast_array(value, param.type.dtype)
                header = tensor_header(param.name, array, param.type.dtype)
                _write_external(header, array, data, data_target.name)
                model.graph.initializer.append(header)
                if progress:
                    progress(array.nbytes)
            data.flush()
            os.fsync(data.fileno())
        tmp_model.write_bytes(model.SerializeToString())
    return target


def cast_array(value: np.ndarray, dtype: str) -> np.ndarray:
    """``value`` (float32) at the model's dtype, C-contiguous."""
    return np.ascontiguousarray(value.astype(numpy_dtype(dtype), copy=False))


def tensor_header(name: str, array: np.ndarray, dtype: str) -> TensorProto:
    """A TensorProto with name, dtype and dims but no data."""
    tensor = TensorProto()
    tensor.name = name
    tensor.data_type = ELEM_TYPE[dtype]
    tensor.dims.extend(array.shape)
    return tensor


# Protobuf wire format: a length-delimited field is varint(number << 3 | 2), varint(length),
# payload. Parsers merge repeated occurrences of a message field (ModelProto.graph = 7) and
# append repeated fields (GraphProto.initializer = 5), so each initializer can be written as
# its own "ModelProto{graph{initializer: [tensor]}}" chunk after the rest of the model, with
# TensorProto.raw_data (= 9) taken straight from the array's memory.
_MODEL_GRAPH, _GRAPH_INITIALIZER, _TENSOR_RAW_DATA = 7, 5, 9


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field_header(number: int, length: int) -> bytes:
    return _varint(number << 3 | 2) + _varint(length)


def _append_initializer(out: Any, header: TensorProto, array: np.ndarray) -> None:
    raw = array.reshape(-1).view(np.uint8).data  # a memoryview of the bytes, no copy
    tensor = header.SerializeToString() + _field_header(_TENSOR_RAW_DATA, raw.nbytes)
    graph = _field_header(_GRAPH_INITIALIZER, len(tensor) + raw.nbytes) + tensor
    out.write(_field_header(_MODEL_GRAPH, len(graph) + raw.nbytes) + graph)
    out.write(raw)


@contextlib.contextmanager
def _write_errors(target: Path) -> Iterator[None]:
    """A full disk or a vanished directory is the user's to fix: one line, exit 2."""
    try:
        yield
    except OSError as err:
        raise TfgraphError(f"{target}: cannot write: {err.strerror or err}") from None


def _write_external(tensor: TensorProto, array: np.ndarray, data: Any, location: str) -> None:
    """Append ``array``'s bytes to the open data file and point ``tensor`` at them."""
    offset = data.tell()
    pad = -offset % 4096  # page-aligned offsets let runtimes mmap each tensor
    if pad:
        data.write(b"\0" * pad)
        offset += pad
    data.write(array.reshape(-1).view(np.uint8).data)  # a memoryview, no copy
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)),
                       ("length", str(array.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
