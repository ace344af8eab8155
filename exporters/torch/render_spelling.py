"""How the op graph's quantities are written in model.py: the vocabulary that ``torch_render``
(and the ``torch_render_*`` modules) and ``torch_source`` share.

Attribute values become Python literals (``literal``); sizes and the values every node of an op
shares become named constants on top of the file (``Constants``), so a reader changes a
hyper-parameter in one place; tensor axes get short names for the shape comments
(``value_axes``); parameters get their constructor source from their ``dims``
(``shape_source``, ``init_source``). ``check_names`` rejects up front every graph name that
cannot become a Python name, so the renderer pastes names in without checking them again.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
from torch import nn

from tfgraph.errors import TfgraphError
from tfgraph.exporters.torch import functional as torch_functional
from tfgraph.exporters.torch.ops import (TORCH_SOURCE, SourceTemplate, per_head_source,
                                        unit_offset_source)
from tfgraph.graph.ir import Graph, ModuleInfo, Node
from tfgraph.graph.weights import INIT_STD

# Short names of graph.sizes in shape comments (nanoGPT style); other sizes appear in full.
ABBREVIATIONS = {"d_model": "d", "heads": "h", "kv_heads": "kv", "head_dim": "hd",
                 "ffn_hidden": "hidden", "vocab": "V", "source_vocab": "V_src",
                 "target_vocab": "V_tgt"}
BATCH = "B"  # the batch axis: the same in every instance of a class, so never a slot
# Module-level names of model.py besides constants and classes: the imports, the kernels
# copied from torch_functional, the helpers. Graph inputs, variables and classes must not
# shadow them.
RESERVED = frozenset({"annotations", "math", "os", "torch", "nn", "F", "Tensor", "Parameters",
                      "load", "self", *(n for n in vars(torch_functional) if not
                                        n.startswith("__"))})


def template(node: Node) -> SourceTemplate:
    """How model.py writes ``node``'s op (its ``TORCH_SOURCE`` row)."""
    if node.op not in TORCH_SOURCE:
        raise TfgraphError(f"{node.name}: op {node.op!r} has no model.py source template")
    base = TORCH_SOURCE[node.op]
    if node.category == "norm" and node.attrs.get("unit_offset"):
        base = unit_offset_source(base)
    if node.category == "norm" and "heads" in node.attrs:
        return per_head_source(base)
    return base


def literal(value: Any) -> str:
    """``value`` as Python source. Strings go through repr, which escapes every control and
    separator character, so no text can leave its literal."""
    if isinstance(value, sympy.Basic):
        value = int(value) if value.is_Integer else float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if isinstance(value, str) and "'" not in value:
        return '"' + repr(value)[1:-1].replace('"', '\\"') + '"'  # the file's quote style
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if isinstance(value, tuple):  # scaled rotary frequencies (tfgraph.graph.rope)
        inner = ", ".join(literal(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    raise TfgraphError(f"cannot write attribute value {value!r} into model.py")


def variant(base: str, taken: set[str] | frozenset[str]) -> str:
    """``base``, or the first of ``base2``, ``base3``, ... that is not taken."""
    name, k = base, 2
    while name in taken:
        name, k = f"{base}{k}", k + 1
    return name


# ---- shape comments and parameter shapes ------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """One axis of a value for shape comments: ``text`` ("S", "h*hd"), its ``value`` (to
    check it against the node's type) and whether it is a symbol of the graph's inputs."""

    text: str
    value: Any
    symbol: bool = False


def axis_of(dim: Any) -> Axis:
    """The axis of a dimension as the node's type has it: its text is the dimension printed
    ("S", "P + S", "4096"), a symbol when it is one."""
    expr = sympy.sympify(dim)
    return Axis(str(expr), expr, bool(expr.is_Symbol))


_NAME = re.compile(r"[A-Za-z_]\w*")


def spell(axis: Axis, name: Callable[[str], str]) -> str:
    """``axis`` as shape-comment text with each symbol of the graph's inputs written by
    ``name`` (B, S, T, P or any other symbol a shape holds): a symbol axis is its name's
    spelling, an expression over symbols ("P + S") has each of its symbols spelled, a size
    ("h*hd", "4096") is its text."""
    if axis.symbol:
        return name(axis.text)
    value = axis.value
    if not isinstance(value, sympy.Basic) or not value.free_symbols or axis.text != str(value):
        return axis.text
    symbols = {str(s) for s in value.free_symbols}
    return _NAME.sub(lambda m: name(m.group()) if m.group() in symbols else m.group(),
                     axis.text)


def value_axes(graph: Graph, sizes: dict[str, Any]) -> dict[str, tuple[Axis, ...]]:
    """The axes of every value. A parameter's come from its ``dims`` ("heads*head_dim" reads
    "h*hd"); an op's from its template's ``dims`` rule over its operands' axes, so names travel
    through the graph, unless they disagree with the node's type, whose dimensions then
    appear as they are."""
    axes: dict[str, tuple[Axis, ...]] = {}
    for node in graph.nodes():
        if node.is_param:
            axes[node.name] = tuple(
                Axis("*".join(ABBREVIATIONS.get(p, p) for p in parts),
                     math.prod(sizes[p] for p in parts)) if parts else Axis(str(size), size)
                for size, parts in _named_dims(node, sizes))
            continue
        found = tuple(axis_of(d) for d in node.type.shape)
        if node.op != "input":
            operands = [axes[i] for i in node.inputs]
            rule = template(node).dims
            # a rule may name a new axis by its size (an int or a sympy expression)
            named = tuple(a if isinstance(a, Axis) else axis_of(a) for a in rule(operands)) \
                if rule else operands[0]
            if len(named) == len(node.type.shape) and all(
                    sympy.sympify(a.value) == d for a, d in zip(named, node.type.shape)):
                found = named
        axes[node.name] = found
    return axes


def shape_source(param: Node, sizes: dict[str, Any]) -> list[str]:
    """The parameter's shape as source, in size constants where its ``dims`` name sizes that
    multiply to it ("HEADS * HEAD_DIM"), else as numbers."""
    return [" * ".join(p.upper() for p in parts)
            if parts and math.prod(sizes[p] for p in parts) == size else str(size)
            for size, parts in _named_dims(param, sizes)]


def init_source(param: Node, sizes: dict[str, Any]) -> str:
    """A fresh value for the parameter in tfgraph's scheme (README, "Parameter names"), so a
    model built without weights starts as to_torch's does; load() overwrites it."""
    shape = ", ".join(shape_source(param, sizes))
    init = param.attrs.get("init")
    if init in ("ones", "zeros"):
        return f"torch.{init}({shape})"
    if init == "normal":
        return f"{INIT_STD} * torch.randn({shape})"
    return f"torch.empty({shape})"


def _named_dims(param: Node, sizes: dict[str, Any]) -> list[tuple[Any, list[str] | None]]:
    """Per axis of the parameter: its size, and the graph sizes its ``dims`` entry multiplies
    ("heads*head_dim" -> ["heads", "head_dim"]), or None when the entry names none or a size
    the graph does not have."""
    dims = param.attrs.get("dims") or ()
    out: list[tuple[Any, list[str] | None]] = []
    for i, size in enumerate(param.attrs["shape"]):
        parts = dims[i].split("*") if i < len(dims) else []
        out.append((size, parts if parts and all(p in sizes for p in parts) else None))
    return out


# ---- constants ----------------------------------------------------------------------------------


class Constants:
    """The constants on top of model.py besides the sizes (which are always written), gathered
    while classes are rendered: ``defined`` maps each name to its value source and comment, in
    order of first use."""

    def __init__(self, sizes: dict[str, Any], nodes: list[Node]) -> None:
        self.sizes = sizes
        self.nodes = nodes
        self.defined: dict[str, tuple[str, str]] = {}
        self._values: dict[tuple[str, str], set[Any]] = {}  # (op, key) -> its values

    def values(self, op: str, key: str) -> set[Any]:
        """Every value attribute ``key`` takes on the nodes of ``op`` (gathered once per op
        and key: a deep model has thousands of nodes of each)."""
        found = self._values.get((op, key))
        if found is None:
            found = {n.attrs[key] for n in self.nodes if n.op == op and key in n.attrs}
            self._values[(op, key)] = found
        return found

    def add(self, name: str, value: str, comment: str) -> None:
        self.defined.setdefault(name, (value, comment))

    def for_attr(self, node: Node, key: str) -> str | None:
        """The constant model.py writes for ``node.attrs[key]``: a size (``HEADS``), or a
        hyper-parameter every node of the op shares (``DROPOUT_P``); None for a value that
        may differ between nodes, which then becomes a literal or a constructor argument."""
        value = node.attrs[key]
        numbers = isinstance(value, tuple) and all(  # rotary inv_freq: one constant if shared
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        if not numbers and (isinstance(value, bool)
                            or not isinstance(value, (int, float, sympy.Number))):
            return None
        if key in self.sizes:
            if self.sizes[key] == value:
                return key.upper()
            same = [k for k, v in self.sizes.items() if v == value]
            if len(same) == 1:
                return same[0].upper()
        if len(self.values(node.op, key)) != 1:
            return None
        name = f"{node.op}_{key}".upper()
        self.add(name, self._number(value), f"every {node.op}'s {key}")
        return name

    def _number(self, value: Any) -> str:
        """A number as source; ``math.sqrt(D_MODEL)`` where it is exactly that."""
        if isinstance(value, float):
            for name, size in self.sizes.items():
                if isinstance(size, int) and size > 0 and value == math.sqrt(size):
                    return f"math.sqrt({name.upper()})"
        return literal(value)


# ---- checks -------------------------------------------------------------------------------------


def check_names(graph: Graph, modules: dict[str, ModuleInfo], sizes: dict[str, Any]) -> None:
    """Module and parameter paths become attribute chains, inputs arguments, class names and
    sizes identifiers: each must be a Python name, and a path part one that no nn.Module
    attribute already uses (or an index under a container)."""
    taken = set(dir(nn.Module))
    for path in [*modules, *(p.name for p in graph.params())]:
        for part in path.split(".") if path else ():
            if not part.isdigit() and (not part.isidentifier() or keyword.iskeyword(part)
                                       or part in taken):
                raise TfgraphError(f"{path}: {part!r} cannot be an attribute in model.py")
    dims = {part for p in graph.params() for d in p.attrs.get("dims") or ()
            for part in d.split("*")}
    for name in [*graph.inputs, *(i.cls for i in modules.values()), *sizes,
                 *(d for d in dims if not d.isdigit())]:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise TfgraphError(f"{name!r} is not a Python name; model.py cannot use it")
    for name in graph.inputs:
        if name in RESERVED:
            raise TfgraphError(f"input {name!r} would hide model.py's {name}")
