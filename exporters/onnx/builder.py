"""The ONNX builder: accumulates the nodes of one model, with helpers shared by the emitters.

Emitters (``tfgraph.exporters.onnx.ops``) append nodes through :meth:`Builder.add`, which names
each ``"{scope}/{tag or OpType}"`` so viewers show the scope structure. Helpers that several
emitters need (runtime sequence lengths, position indices, causal masks, rotary tables) are
built once per model and cached by what they depend on; they read lengths from the ids inputs
at run time, so every sequence length works without a baked-in maximum.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import helper

from tfgraph.exporters.onnx.tensors import ELEM_TYPE, make_initializer
from tfgraph.graph.ir import B, S, T, Graph
from tfgraph.graph.ops import OPS
from tfgraph.graph.tensor import P


class Builder:
    """Accumulates ONNX nodes for one graph; shared helpers (sequence lengths, position
    tables, masks) are built once and cached by what they depend on."""

    def __init__(self, graph: Graph, opset: int) -> None:
        self.graph = graph
        self.opset = opset
        # The model's dtype is that of its output (logits or probs), as lowering typed it;
        # a loss graph's (a float32 loss) is its logits'.
        out = graph.node(graph.outputs[0])
        if OPS[out.op].loss:
            out = graph.node(out.inputs[0])
        self.dtype: str = out.type.dtype
        self.nodes: list[onnx.NodeProto] = []
        self._used: set[str] = set()
        self._cache: dict[tuple[Any, ...], Any] = {}
        self.dim_names = dim_names(graph)
        # The graph input whose second axis is each sequence symbol (S or T): runtime lengths
        # are read from it (the first such input: input_ids before token_type_ids).
        self.ids_for: dict[Any, str] = {}
        for i in graph.inputs:
            self.ids_for.setdefault(graph.node(i).type.shape[1], i)
        # A KV-cache graph's attention_mask spans past and present positions (total_len).
        self.ids_for_mask = "attention_mask"
        # exporters/onnx/fused_attention.FusedPlan when attention is lowered to onnxruntime's
        # fused kernel (write_onnx(..., fused_attention=True)); None: written out.
        self.fused: Any = None

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

    def add_outputs(self, scope: str, op_type: str, inputs: Iterable[str], count: int,
                    tag: str | None = None, **attrs: Any) -> list[str]:
        """Append one node with ``count`` outputs (TopK's values and indices); returns their
        names, ``{node name}:0``, ``{node name}:1``, ..."""
        name = self._unique(f"{scope}/{tag or op_type}")
        outs = [f"{name}:{i}" for i in range(count)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=name, **attrs))
        return outs

    def add_node(self, scope: str, op_type: str, inputs: Iterable[str], outputs: list[str],
                 tag: str | None = None, domain: str | None = None, **attrs: Any) -> None:
        """Append one node with the given output names, in ``domain`` (e.g. com.microsoft's
        contrib ops) when not the standard one."""
        name = self._unique(f"{scope}/{tag or op_type}")
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, name=name,
                                           domain=domain, **attrs))

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

    def memo(self, key: tuple[Any, ...], make: Callable[[], str]) -> str:
        """The value ``make()`` gives, built once per model and ``key`` (nodes several
        emitters share: one set in the graph, not one per layer)."""
        if key not in self._cache:
            self._cache[key] = make()
        value: str = self._cache[key]
        return value

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

    def window_mask(self, sym: Any, window: int, causal: bool = True) -> str:
        """(L, L) bool, True where query i reads key j: j <= i and i - j < window; without
        ``causal`` |i - j| < window on both sides (an encoder's local layers, ModernBERT)."""
        key = ("window", sym, window, causal)
        if key not in self._cache:
            scope = f"window_mask.{self.dim_names[sym]}.w{window}{'' if causal else '.both'}"
            r = self.arange(sym)  # (L,)
            rows = self.add(scope, "Unsqueeze", [r, self.ints([1])], tag="rows")  # (L, 1)
            cols = self.add(scope, "Unsqueeze", [r, self.ints([0])], tag="cols")  # (1, L)
            behind = self.add(scope, "Sub", [rows, cols], tag="distance")  # (L, L) i - j
            if not causal:
                behind = self.add(scope, "Abs", [behind], tag="abs_distance")  # |i - j|
            near = self.add(scope, "Less", [behind, self.ints([window])], tag="near")
            self._cache[key] = near if not causal else self.add(
                scope, "And", [self.causal_mask(sym), near])
        return self._cache[key]

    def rope_tables(self, sym: Any, dim: int, theta: float,
                    inv_freq: tuple[float, ...] | None = None,
                    scale: float = 1.0) -> tuple[str, str]:
        """cos and sin of pos * theta^(-2i/dim), (L, dim/2), in the model dtype; dim is the
        rotated width of a head. ``inv_freq``: scaled frequencies (tfgraph.graph.rope) instead of
        theta's; ``scale``: multiplies cos and sin (YaRN's attention factor)."""
        key = ("rope", sym, dim, theta, inv_freq, scale)
        if key not in self._cache:
            scope = f"rope.{self.dim_names[sym]}.hd{dim}"
            inv = list(inv_freq) if inv_freq is not None else \
                [theta ** (-2.0 * i / dim) for i in range(dim // 2)]
            freqs = self.const(scope, "inv_freq", np.array([inv], np.float32), "float32")
            angles = self.add(scope, "Mul", [self.positions(sym), freqs])  # (L, dim/2)
            cos = self.add(scope, "Cos", [angles])
            sin = self.add(scope, "Sin", [angles])
            if scale != 1.0:
                factor = self.const(scope, "scale", scale, "float32")
                cos = self.add(scope, "Mul", [cos, factor], tag="cos_scaled")
                sin = self.add(scope, "Mul", [sin, factor], tag="sin_scaled")
            if self.dtype != "float32":
                cos, sin = self.cast(scope, cos, self.dtype), self.cast(scope, sin, self.dtype)
            self._cache[key] = (cos, sin)
        return self._cache[key]


def dim_names(graph: Graph) -> dict[Any, str]:
    """Symbolic dims as ONNX dim_params: batch, seq_len or src_len/tgt_len (the model's inputs
    as README.md's ``tfgraph build`` section documents them)."""
    if "attention_mask" in graph.inputs:  # a KV-cache graph (README, "KV cache")
        return {P + S: "total_len", P: "past_len", B: "batch", S: "seq_len",
                T: "encoder_seq_len"}
    if all(graph.node(i).type.shape[1] == S for i in graph.inputs):  # one sequence
        return {B: "batch", S: "seq_len"}
    return {B: "batch", S: "src_len", T: "tgt_len"}


def dims(shape: tuple[Any, ...], names: dict[Any, str]) -> list[int | str]:
    out: list[int | str] = []
    for d in shape:
        if getattr(d, "is_Integer", False) or isinstance(d, int):
            out.append(int(d))
        elif d in names:  # a named expression (total_len = P + S)
            out.append(names[d])
        else:  # a symbol or a product of symbols, written with the dim names
            text = str(d)
            for sym, label in names.items():
                text = text.replace(str(sym), label)
            out.append(text)
    return out
