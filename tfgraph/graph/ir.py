"""The op-graph IR: a small API over a networkx ``MultiDiGraph`` (in the spirit of torch.fx).

Nodes are named uniquely ("decoder.layers.3.ffn.up"); a node's inputs are other nodes' names in
operand order, stored as edges keyed by operand index, so ``x + x`` is two edges and q, k and v
may read the same node. Parameters are nodes too (op ``param``) named as in the README's
parameter table; a tied table is one node read twice. Shapes are inferred eagerly when a node is
added, from the op's rule in ``tfgraph.graph.ops``, so a lowering mistake fails at the node that
caused it. Callers never touch ``networkx`` directly: they use ``add``/``param``/``input``,
``nodes()`` (deterministic topological order) and ``lint()``.

Structure is data: every node carries a ``NodeMeta`` (stack, layer, sublayer, role, and the
module that computes it) set by lowering, and the graph keeps the modules' classes
(``modules``) and the named sizes they are built from (``sizes``). Passes and back ends read
these; nothing parses node names. Results derived from a graph are cached with ``memo``, which
forgets them whenever a node is added.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import PurePath
from typing import TYPE_CHECKING, Any, Iterator, TypeVar

import networkx as nx
import sympy

import tfgraph.graph.ops_loss  # noqa: F401 (registers the training loss op into OPS)
import tfgraph.graph.ops_latent  # noqa: F401 (registers the latent-attention ops into OPS)
import tfgraph.graph.ops_moe  # noqa: F401 (registers the mixture-of-experts ops into OPS)
from tfgraph.errors import TfgraphError
from tfgraph.graph.lengths import DEFAULT_SEQ, Lengths
from tfgraph.graph.ops import OPS
from tfgraph.graph.tensor import (  # noqa: F401 (re-exported: the IR's types)
    B,
    DTYPE_BYTES,
    S,
    SYMBOLS,
    T,
    Dim,
    LoweringError,
    Shape,
    TensorType,
    as_dim,
    cached_attribute,
)

if TYPE_CHECKING:
    from tfgraph.spec.schema import Spec

R = TypeVar("R")
GraphT = TypeVar("GraphT", bound="Graph")


@dataclass(frozen=True)
class NodeMeta:
    """Where a node sits in the model; set by lowering, read by every pass and back end.

    ``part`` is the model part: "embed" (token tables, scaling, positions), "layer", "norm"
    (a stack's final norm), "head", or "" for graphs built by hand. ``stack`` is "encoder" or
    "decoder" (None for the shared token tables and the head); ``layer`` the index within the
    stack; ``sublayer`` "self_attn", "cross_attn" or "ffn" inside a layer. ``role`` names the
    node's job within its sublayer (or part): "q", "attention", "norm", "out_norm",
    "residual", "dropout", "up", "act", "tokens", "positions", "logits", ... for ops;
    "q.weight", "norm.bias", ... for parameters. ``module`` is the path of the module that
    computes the node (or owns the parameter): "decoder.layers.3.self_attn" for the
    projections, "decoder.layers.3" for the norms and residual adds around them.
    """

    part: str = ""
    stack: str | None = None
    layer: int | None = None
    sublayer: str | None = None
    role: str = ""
    module: str = ""

    @property
    def key(self) -> tuple[Any, ...]:
        """What the node is, independent of its name (unique within a lowered graph)."""
        return (self.part, self.stack, self.layer, self.sublayer, self.role)

    def in_layer(self, layer: int) -> NodeMeta:
        """The same position in another layer of the stack (e.g. layer 0, the template)."""
        return replace(self, layer=layer)

    def but(self, **changes: Any) -> NodeMeta:
        """``dataclasses.replace(self, **changes)`` without its per-field loop and checked
        ``__init__`` (lowering derives a few metadata per node: this is in its inner loop).
        Only the fields may change (TypeError otherwise)."""
        if not changes.keys() <= _META_FIELDS:
            raise TypeError(f"NodeMeta has no field {sorted(changes.keys() - _META_FIELDS)[0]!r}")
        out = object.__new__(NodeMeta)
        fields = out.__dict__
        fields.update(self.__dict__)
        fields.update(changes)
        return out


def frozen_new(cls: type[R], fields: dict[str, Any]) -> R:
    """An instance of the frozen dataclass ``cls`` with ``fields`` (all of them, no defaults,
    no ``__post_init__``), without its ``__init__``'s ``object.__setattr__`` per field: for
    the passes that build one per node (plan steps, op costs)."""
    out = object.__new__(cls)
    out.__dict__.update(fields)
    return out


_META_FIELDS = frozenset(("part", "stack", "layer", "sublayer", "role", "module"))


@dataclass(frozen=True)
class ModuleInfo:
    """A module of the model (a class in generated code, a box in diagrams): ``cls`` is its
    class name ("Attention", "FeedForward", "Layer", "Stack", "Model"), ``doc`` one line."""

    path: str
    cls: str
    doc: str


@dataclass
class Node:
    """One op application. ``inputs`` are node names in operand order."""

    name: str
    op: str
    inputs: tuple[str, ...]
    attrs: dict[str, Any]
    scope: str
    type: TensorType
    index: int = field(default=0, compare=False)
    meta: NodeMeta = field(default_factory=NodeMeta, compare=False)

    @property
    def is_param(self) -> bool:
        return self.op == "param"

    @property
    def category(self) -> str:
        """The op's category from the op table ("param" and "input" for those nodes)."""
        return OPS[self.op].category if self.op in OPS else self.op

    @cached_attribute
    def component(self) -> str:
        """Cost roll-up row: "decoder.layers.3" for anything in a layer, else the scope
        ("embed", "decoder.embed", "decoder.norm", "head"). Computed once per node (nodes are
        not changed once added; every cost pass and the report read it)."""
        m = self.meta
        if m.layer is not None and m.stack is not None:
            return f"{m.stack}.layers.{m.layer}"
        return self.scope

    @property
    def kind(self) -> str:
        """Kind of work: the sublayer ("self_attn", "cross_attn", "ffn") inside a layer, else
        the part ("embed", "norm", "head"); graphs built by hand use their scope."""
        return self.meta.sublayer or self.meta.part or self.scope


SPEC_METADATA_KEY = "tfgraph.spec"
"""The metadata key of the spec's text in a built model (ONNX metadata_props, safetensors)."""

GRAPH_KINDS = ("full", "cached", "loss")
"""What a lowered graph computes (``GraphInfo.kind``): the whole sequence at once, one step of
a KV-cache decode (README, "KV cache"), or the training loss."""


@dataclass(frozen=True)
class SpecText:
    """The spec a graph was lowered from, as text, for provenance only (``spec.yaml`` beside
    a built model, an ONNX model's metadata): ``yaml()`` with every default written out,
    ``json()`` the same document as sorted JSON. Both are produced on first call."""

    name: str
    yaml: Callable[[], str] = field(repr=False, compare=False)
    json: Callable[[], str] = field(repr=False, compare=False)


@dataclass(frozen=True)
class CacheLayout:
    """The keys/values of a KV-cache graph: ``layers`` (key, value) pairs of its own (the
    decoder's self-attention), keys (B, kv_heads, length, head_dim) and values
    (B, kv_heads, length, value_dim or head_dim) at the graph's dtype. Latent attention
    caches its latent as the key and its rotary key as the value (kv_heads 1)."""

    layers: int
    kv_heads: int
    head_dim: int
    value_dim: int = 0
    """Width of a cached value when it differs from head_dim (0: head_dim)."""

    @property
    def v_dim(self) -> int:
        """Width of a cached value."""
        return self.value_dim or self.head_dim


@dataclass(frozen=True)
class GraphInfo:
    """What lowering knows of a model beyond its nodes, set once per graph: the facts the back
    ends need, so that they read the graph and never the spec.

    ``arch`` is "decoder-only", "encoder-only", "encoder-decoder" ("" for a graph built by
    hand). ``kind`` is one of ``GRAPH_KINDS``; a "cached" graph of an encoder-decoder is one of
    two, ``part`` "encoder" (the source once, with every decoder layer's cross-attention
    keys/values) or "decoder" (one target step); None otherwise. ``cache_parts`` are the
    model's KV-cache graphs by part ((None,) a decoder's one; None: it has none), and
    ``cache_graph(part)`` lowers one of them (None: the graph cannot); ``cache`` is the
    layout of the keys/values a cached graph's decoder keeps. ``lengths`` is the
    spec's max_len rule (tfgraph.graph.lengths; None: no spec), ``default_seq`` the length
    ``graph.report()`` uses when given none. ``output`` is "logits" or "probs",
    ``prompt_vocab`` the vocabulary input ids index and ``output_vocab`` the output's.
    ``source`` is the spec as text, for provenance.
    """

    arch: str = ""
    kind: str = "full"
    part: str | None = None
    description: str = ""
    lengths: Lengths | None = None
    default_seq: int = DEFAULT_SEQ
    output: str = "logits"
    prompt_vocab: int | None = None
    output_vocab: int | None = None
    cache_parts: tuple[str | None, ...] | None = None
    cache: CacheLayout | None = None
    cache_graph: Callable[[str | None], Graph] | None = field(default=None, repr=False,
                                                              compare=False)
    source: SpecText | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in GRAPH_KINDS:
            raise ValueError(f"GraphInfo.kind {self.kind!r}: expected one of {GRAPH_KINDS}")

    def check_lengths(self, *named: tuple[str, int | None]) -> None:
        """The spec's max_len rule (``Lengths.check``) for each (name, length); nothing for a
        graph with no spec."""
        if self.lengths is not None:
            for what, length in named:
                self.lengths.check(what, length, stacklevel=4)


def _param_dim(d: Any) -> Any:
    """A parameter dimension: an ``int`` in every real graph; a sympy expression only in the
    symbolic twins that ``tfgraph.passes.formulas`` lowers to write costs in the spec's symbols."""
    if isinstance(d, sympy.Basic) and not d.is_Integer:
        return d
    return int(d)


def _shape(dims: tuple[Any, ...]) -> Shape:
    """Dimensions given to the builders: ints, sympy expressions, or text over the IR's
    symbols ("B", "P + S": the IR's B, S, T, P, with their assumptions)."""
    return tuple(as_dim(sympy.sympify(d, locals=dict(SYMBOLS)) if isinstance(d, str) else d)
                 for d in dims)


_INFERRED: dict[tuple[Any, ...], TensorType] = {}
"""Shape inference by signature (op, operand types, attributes): the layers of a stack apply
the same ops to the same types, so each rule runs once per distinct signature. Op rules are
pure functions of their operands' types and attributes."""
_INFERRED_MAX = 8192


_PARAM_TYPES: dict[tuple[Any, ...], tuple[tuple[Any, ...], TensorType]] = {}
"""A parameter's shape attribute and type by (shape, dtype), for shapes of plain ints: every
layer has the same parameter shapes."""


def _attrs_key(attrs: dict[str, Any]) -> tuple[Any, ...] | None:
    """A hashable key of ``attrs`` (types included: 1, 1.0 and True are equal in Python),
    or None when some value cannot be hashed."""
    try:
        # in the dict's order: the lowering writes an op's attributes in one order, and
        # another order is only a cache miss
        key = tuple([(k, type(v), v) for k, v in attrs.items()])
        hash(key)
    except TypeError:
        return None
    return key


_CHECKED: dict[tuple[str, tuple[Any, ...]], Any] = {}
"""(op, attributes key) -> the op's attribute schema ``check_attrs`` passed them under (a pure
function of the two; an op registered anew has a new schema, checked again)."""


def _checked_attrs(name: str, op: str, attrs: dict[str, Any]) -> tuple[Any, ...] | None:
    """``check_attrs(name, op, attrs)``, remembered by (op, attributes); the attributes' key
    (``_attrs_key``) for ``infer``."""
    akey = _attrs_key(attrs)
    if akey is None:
        check_attrs(name, op, attrs)
        return None
    schema = OPS[op].attrs
    key = (op, akey)
    if _CHECKED.get(key) is not schema:
        check_attrs(name, op, attrs)
        if len(_CHECKED) >= _INFERRED_MAX:
            _CHECKED.clear()
        _CHECKED[key] = schema
    return akey


_NO_KEY: tuple[Any, ...] = ()


def infer(op: str, types: list[TensorType], attrs: dict[str, Any],
          akey: tuple[Any, ...] | None = _NO_KEY) -> TensorType:
    """``OPS[op].infer(types, attrs)``, memoised by signature (see ``_INFERRED``); ``akey``:
    ``_attrs_key(attrs)`` when the caller has it."""
    if akey is _NO_KEY:
        akey = _attrs_key(attrs)
    if akey is None:
        return OPS[op].infer(types, attrs)
    key = (op, tuple(types), akey)
    out = _INFERRED.get(key)
    if out is None:
        out = OPS[op].infer(types, attrs)
        if len(_INFERRED) >= _INFERRED_MAX:
            _INFERRED.clear()
        _INFERRED[key] = out
    return out


def check_attrs(name: str, op: str, attrs: dict[str, Any]) -> None:
    """LoweringError naming node ``name``, ``op`` and the attribute when ``attrs`` has one the
    op does not declare (``OpDef.attrs``), lacks a required one, or has one of another
    type."""
    schema = OPS[op].attrs
    for key, value in attrs.items():
        if key not in schema:
            known = ", ".join(sorted(schema)) or "none"
            raise LoweringError(f"while lowering {name} ({op}): unknown attribute {key!r} "
                                f"(the op takes: {known})")
        expected = schema[key].type
        if not isinstance(value, expected):
            raise LoweringError(f"while lowering {name} ({op}): attribute {key!r} is "
                                f"{type(value).__name__} {value!r}, not {_type_words(expected)}")
    for key, attr in schema.items():
        if attr.required and key not in attrs:
            raise LoweringError(f"while lowering {name} ({op}): missing attribute {key!r}")


def _type_words(t: type | tuple[type, ...]) -> str:
    return " or ".join(x.__name__ for x in (t if isinstance(t, tuple) else (t,)))


class Graph:
    """A lowered Transformer: op nodes, parameter nodes, graph inputs and outputs."""

    def __init__(self, name: str, spec: Spec | None = None, dtype: str = "float32") -> None:
        self.name = name
        # The spec the graph was lowered from, for the core's passes and reports only; back
        # ends read the graph and ``info`` (a test greps exporters/ for any read of it).
        self.spec = spec
        self.info = GraphInfo()
        """What lowering knows of the model beyond its nodes (:class:`GraphInfo`)."""
        self.dtype = dtype
        """Parameter dtype (the spec's dtype)."""
        self.sizes: dict[str, Any] = {}
        """Named sizes parameters are built from ("d_model": 512, "heads": 8, ...)."""
        self.modules: dict[str, ModuleInfo] = {}
        self._nx: nx.MultiDiGraph[str] | None = None  # built on first use (``_g``)
        self._nodes: dict[str, Node] = {}
        self.inputs: list[str] = []
        self.outputs: list[str] = []
        self._order: list[Node] | None = None
        self._ops: list[Node] | None = None  # the op nodes of ``_order``
        self._memo: dict[str, Any] = {}
        self._linted = 0
        """Leading nodes the last successful ``lint`` checked one by one (0: none)."""
        self._checked_upto = 0
        """Leading nodes a copy need not check one by one again: those its source's lint
        checked (nodes are shared and never changed once added); only ``copy`` sets it."""

    def copy(self: GraphT) -> GraphT:
        """A new graph of the same class with the same nodes, modules, sizes, inputs and
        outputs, to be extended (nodes are never changed once added, so the two share them)."""
        out = type(self)(self.name, self.spec, self.dtype)
        out.sizes = dict(self.sizes)
        out.modules = dict(self.modules)
        out._nodes = dict(self._nodes)
        out.inputs = list(self.inputs)
        out.outputs = list(self.outputs)
        out._checked_upto = self._linted
        return out

    @property
    def _g(self) -> nx.MultiDiGraph[str]:
        """The networkx graph: a node per name, an edge per operand keyed by its index. Built
        from the operand lists when first asked for (lowering and the cost passes never need
        it), kept up to date after that."""
        if self._nx is None:
            g: nx.MultiDiGraph[str] = nx.MultiDiGraph()
            g.add_nodes_from(self._nodes)
            for n in self._nodes.values():
                for k, src in enumerate(n.inputs):
                    g.add_edge(src, n.name, key=k)
            self._nx = g
        return self._nx

    # ---- building ---------------------------------------------------------------------

    def _insert(self, node: Node) -> str:
        if node.name in self._nodes:
            raise LoweringError(f"while lowering {node.name}: a node of that name already exists")
        node.index = len(self._nodes)
        self._nodes[node.name] = node
        if self._nx is not None:
            self._nx.add_node(node.name)
            for operand, src in enumerate(node.inputs):
                self._nx.add_edge(src, node.name, key=operand)
        self._order = self._ops = None
        self._memo.clear()  # every derived result may change with a new node
        return node.name

    def module(self, path: str, cls: str, doc: str) -> None:
        """Declare the module at ``path`` (its nodes say ``meta.module == path``)."""
        self.modules[path] = ModuleInfo(path, cls, doc)
        self._memo.clear()

    def input(self, name: str, shape: tuple[Any, ...], dtype: str = "int64") -> str:
        """A graph input, e.g. ``input_ids`` of shape (B, S)."""
        self.inputs.append(name)
        return self._insert(Node(name, "input", (), {}, "inputs", TensorType(_shape(shape), dtype),
                                 meta=NodeMeta(role=name)))

    def param(self, name: str, shape: tuple[int, ...], scope: str, init: str, dtype: str,
              meta: NodeMeta | None = None, dims: tuple[str, ...] | None = None) -> str:
        """A parameter; ``init`` is 'normal', 'zeros' or 'ones' (see tfgraph.graph.weights).
        ``dims`` writes each dimension in the graph's named sizes ("heads*head_dim")."""
        key = (shape, dtype)
        plain = type(shape) is tuple and all(type(d) is int for d in shape)
        known = _PARAM_TYPES.get(key) if plain else None
        if known is None:
            known = (tuple(_param_dim(d) for d in shape), TensorType(_shape(shape), dtype))
            if plain:
                if len(_PARAM_TYPES) >= _INFERRED_MAX:
                    _PARAM_TYPES.clear()
                _PARAM_TYPES[key] = known
        attrs: dict[str, Any] = {"shape": known[0], "init": init}
        if dims is not None:
            attrs["dims"] = dims
        return self._insert(Node(name, "param", (), attrs, scope, known[1],
                                 meta=meta or NodeMeta()))

    def add(self, op: str, inputs: list[str] | tuple[str, ...], *, name: str, scope: str,
            meta: NodeMeta | None = None, **attrs: Any) -> str:
        """Add an op node; its attributes are checked against the op's (``OpDef.attrs``:
        LoweringError for an unknown, missing required or mistyped one) and its output type
        is inferred now from the op's shape rule."""
        if op not in OPS:
            raise LoweringError(f"while lowering {name}: unknown op {op!r}")
        missing = [i for i in inputs if i not in self._nodes]
        if missing:
            raise LoweringError(f"while lowering {name}: unknown inputs {missing}")
        akey = _checked_attrs(name, op, attrs)
        try:
            out = infer(op, [self._nodes[i].type for i in inputs], attrs, akey)
        except (ValueError, TypeError) as err:
            raise LoweringError(f"while lowering {name} ({op}): {err}") from err
        return self._insert(Node(name, op, tuple(inputs), attrs, scope, out, meta=meta or NodeMeta()))

    def set_output(self, name: str) -> None:
        self.outputs.append(name)
        self._memo.clear()  # a new output lives to the end: plans and reports change

    # ---- reading ----------------------------------------------------------------------

    def node(self, name: str) -> Node:
        return self._nodes[name]

    def __contains__(self, name: str) -> bool:
        return name in self._nodes

    def __len__(self) -> int:
        return len(self._nodes)

    def nodes(self) -> list[Node]:
        """All nodes in a deterministic topological order (ties broken by insertion order)."""
        if self._order is None:
            # A node's inputs exist before it is added, so insertion order is topological,
            # and it is the lexicographically smallest one by insertion index (the tie-break).
            self._order = list(self._nodes.values())
        return self._order

    def ops(self) -> Iterator[Node]:
        """Op nodes (not parameters or inputs) in topological order."""
        ops = self._ops
        if ops is None:
            ops = self._ops = [n for n in self.nodes() if n.op not in ("param", "input")]
        return iter(ops)

    def params(self) -> list[Node]:
        """Parameter nodes in topological order; a tied table appears once."""
        return [n for n in self.nodes() if n.is_param]

    def users(self, name: str) -> list[tuple[Node, int]]:
        """(consumer, operand index) pairs reading ``name``, in topological order."""
        uses = [(self._nodes[dst], key) for _, dst, key in self._g.out_edges(name, keys=True)]
        return sorted(uses, key=lambda u: (u[0].index, u[1]))

    def memo(self, key: str, compute: Callable[[], R]) -> R:
        """``compute()``, cached until the graph changes (a node or module is added)."""
        if key not in self._memo:
            self._memo[key] = compute()
        value: R = self._memo[key]
        return value

    def by_meta(self) -> dict[tuple[Any, ...], Node]:
        """Nodes by ``meta.key`` (nodes with a role only)."""
        return self.memo("by_meta", lambda: {n.meta.key: n for n in self.nodes() if n.meta.role})

    @property
    def nx_graph(self) -> nx.MultiDiGraph:
        """A read-only view for algorithms (e.g. diagrams); never mutate it."""
        return self._g.copy(as_view=True)

    # ---- checking ---------------------------------------------------------------------

    def _check_operands(self) -> None:
        """LoweringError naming the first node (in order) with an operand that is not a node,
        or one not defined before it: a cycle through it, or an order that is not
        topological. Read from the operand lists (``Node.inputs``), not the networkx graph."""
        defined: set[str] = set()
        for node in self.nodes():
            for src in node.inputs:
                if src not in defined:
                    self._bad_operand(node, src)
            defined.add(node.name)

    def _bad_operand(self, node: Node, src: str) -> None:
        if src not in self._nodes:
            raise LoweringError(f"{node.name}: operand {src!r} is not a node")
        reads: nx.DiGraph[str] = nx.DiGraph()
        reads.add_edges_from((i, n.name) for n in self._nodes.values() for i in n.inputs)
        if nx.has_path(reads, node.name, src):
            loop = " -> ".join([*nx.shortest_path(reads, node.name, src), node.name])
            raise LoweringError(f"{node.name}: graph has a cycle through it ({loop})")
        raise LoweringError(f"{node.name}: operand {src!r} comes after it in the node order")

    def lint(self, recheck_added: bool = True) -> None:
        """Check structural invariants; raise LoweringError naming the first bad node.

        The operand lists are always checked, whatever built the graph: every operand names
        a node, and one defined before its reader (the order is topological; a cycle is named
        as such). The networkx graph, once something has built it (``_g``), is checked
        against them. ``recheck_added`` False skips what ``add`` checked of each node as it
        was added (its attributes, its type from the shape rule), for a graph nothing can
        have changed since (``tfgraph.compile`` lints what lowering has just built)."""
        self._check_operands()
        in_edges: dict[str, list[tuple[int, str]]] | None = None
        if self._nx is not None:
            if set(self._nx.nodes) != set(self._nodes):
                raise LoweringError("graph nodes and name table disagree")
            in_edges = {}
            backward = False  # an edge to an earlier node: the only way to a cycle
            for src, dst, k in self._nx.edges(keys=True):
                in_edges.setdefault(dst, []).append((k, src))
                backward = backward or self._nodes[src].index >= self._nodes[dst].index
            if backward and not nx.is_directed_acyclic_graph(self._nx):
                cycle = nx.find_cycle(self._nx)
                raise LoweringError(f"graph has a cycle through {cycle[0][0]}")
        nodes = self.nodes()
        # a copy of a linted graph (the loss graph: the inference graph plus its loss) checks
        # only the nodes added since, one by one; the whole-graph checks below see them all
        skip = self._checked_upto if in_edges is None else 0
        for node in nodes[skip:] if skip else nodes:
            if in_edges is not None and tuple(
                    src for _, src in sorted(in_edges.get(node.name, ()))) != node.inputs:
                raise LoweringError(f"{node.name}: edges do not match its operand list")
            if node.op in ("param", "input"):
                if node.inputs:
                    raise LoweringError(f"{node.name}: {node.op} nodes take no inputs")
                continue
            opdef = OPS[node.op]
            lo, hi = opdef.arity
            if not lo <= len(node.inputs) <= hi:
                raise LoweringError(
                    f"{node.name}: {node.op} takes {lo}..{hi} inputs, got {len(node.inputs)}"
                )
            if not recheck_added:
                continue
            akey = _checked_attrs(node.name, node.op, node.attrs)
            try:
                again = infer(node.op, [self._nodes[i].type for i in node.inputs], node.attrs,
                              akey)
            except (ValueError, TypeError) as err:
                raise LoweringError(f"{node.name}: {err}") from err
            if again != node.type:
                raise LoweringError(f"{node.name}: stored type {node.type} != inferred {again}")
        for out in self.outputs:
            if out not in self._nodes:
                raise LoweringError(f"output {out!r} is not a node")
        read = {src for n in nodes for src in n.inputs}
        dead = [n.name for n in nodes if n.name not in read and n.name not in self.outputs]
        if dead:
            raise LoweringError(f"nodes computed but never used: {dead[:5]}")
        seen: dict[tuple[Any, ...], str] = {}
        modules = self.modules
        for node in nodes:
            m = node.meta
            if not m.role:
                continue
            # m.key, spelled out: this loop reads every node of every graph linted
            other = seen.setdefault((m.part, m.stack, m.layer, m.sublayer, m.role), node.name)
            if other != node.name:
                raise LoweringError(f"{node.name}: same metadata as {other} ({node.meta})")
            if modules and m.module not in modules and node.op not in ("param", "input"):
                raise LoweringError(f"{node.name}: module {m.module!r} was never declared")
        self._linted = len(nodes)


def expect_graph(value: object, argument: str = "graph") -> Graph:
    """``value`` when it is a graph; TfgraphError naming ``argument`` when it is something
    else (a spec, a path): the public functions that take a graph (``to_torch``, ``to_onnx``,
    ``plan``, ``compare``) say so at their entry, not deep inside."""
    if isinstance(value, Graph):
        return value
    shown = f" {value!r:.60}" if isinstance(value, (str, bytes, PurePath)) else ""
    raise TfgraphError(f"{argument}: expected a compiled graph (tfgraph.compile(spec or "
                       f"path)), got {type(value).__name__}{shown}")
