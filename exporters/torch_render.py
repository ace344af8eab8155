"""The op graph as Python classes: the rendering half of model.py's generator (torch_source).

``GraphView`` works out once per graph what rendering reads: the module tree
(``graph.modules``, parents by path), the walk's order (``tfgraph.plan``), the values flowing
into and out of each module, the shared inputs of ``TORCH_SOURCE`` (rotary tables), parameter
groups (one per owner path: ``...self_attn.q`` holds ``weight`` and ``bias``), names for every
tensor axis in shape comments, and the hyper-parameter constants the code refers to.

``InstanceRenderer`` writes one module: an ``__init__`` that creates its parameters and child
modules in the graph's parameter order (so state_dict order is to_torch's), and a ``forward``
that is its nodes in the walk's order, one line per node through ``TORCH_SOURCE``, with a call
where a child module's nodes run and a loop over a stack's layers. Values that may differ
between instances of one class (an attribute such as ``causal``, the sequence axis of a shape
comment) are left as *slots* for ``torch_source`` to fill once it has grouped the instances.

Nothing here reads the spec: structure is node metadata and module declarations, sizes are
``graph.sizes`` and the parameters' ``dims``.

Precondition: the graph lints (every op node's ``meta.module`` is declared, when any is).
"""

from __future__ import annotations

import keyword
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sympy
from torch import nn

from tfgraph.errors import TfgraphError
from tfgraph.exporters import torch_functional
from tfgraph.exporters.torch_ops import TORCH_SOURCE, ModuleForm, SharedInput, SourceTemplate
from tfgraph.ir import Graph, ModuleInfo, Node
from tfgraph.plan import layer_region, plan
from tfgraph.weights import INIT_STD

# Short names of graph.sizes in shape comments (nanoGPT style); other sizes appear in full.
ABBREVIATIONS = {"d_model": "d", "heads": "h", "kv_heads": "kv", "head_dim": "hd",
                 "ffn_hidden": "hidden", "vocab": "V", "source_vocab": "V_src",
                 "target_vocab": "V_tgt"}
BATCH = "B"  # the batch axis: the same in every instance of a class, never a slot
# Module-level names of model.py besides constants and classes: the imports, the kernels
# copied from torch_functional, the helpers. Graph inputs and classes must not shadow them.
RESERVED = frozenset({"annotations", "math", "os", "torch", "nn", "F", "Tensor", "Parameters",
                      "load", "self", *(n for n in vars(torch_functional) if not
                                        n.startswith("__"))})


@dataclass(frozen=True)
class Axis:
    """One axis of a value for shape comments: ``text`` ("S", "h*hd"), its ``value`` (to
    check it against the node's type) and whether it is a symbol of the graph's inputs."""

    text: str
    value: Any
    symbol: bool = False


@dataclass
class Shared:
    """One value of a ``SharedInput``: computed in module ``home`` before its first use."""

    id: str
    form: SharedInput
    users: list[Node]
    home: str
    length: str
    """The sequence axis (its symbol) the value is computed for."""


@dataclass
class Leaf:
    """The parameters of one owner path, created by module ``home``'s ``__init__``: as a
    ``torch.nn`` class when ``form`` is set (chosen from ``form_node``, a node it computes), as
    plain parameters otherwise (``owner == home``: directly on the module)."""

    owner: str
    params: list[Node]
    home: str
    form: ModuleForm | None = None
    form_node: Node | None = None


def within(ancestor: str, path: str) -> bool:
    """``path`` is ``ancestor`` or below it (module paths are dot-separated)."""
    return ancestor == "" or path == ancestor or path.startswith(ancestor + ".")


def leaf_name(param: str) -> str:
    return param.rpartition(".")[2]


def owner_of(param: str) -> str:
    return param.rpartition(".")[0]


def literal(value: Any) -> str:
    """``value`` as Python source (strings through repr, which escapes every control and
    separator character, so no text can leave its literal)."""
    if isinstance(value, sympy.Basic):
        value = int(value) if value.is_Integer else float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if isinstance(value, str) and "'" not in value:
        return '"' + repr(value)[1:-1].replace('"', '\\"') + '"'  # the file's quote style
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    raise TfgraphError(f"cannot write attribute value {value!r} into model.py")


def template(node: Node) -> SourceTemplate:
    if node.op not in TORCH_SOURCE:
        raise TfgraphError(f"{node.name}: op {node.op!r} has no model.py source template")
    return TORCH_SOURCE[node.op]


class GraphView:
    """The graph as the renderer needs it (see the module docstring)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.modules = dict(graph.modules)
        if "" not in self.modules:
            self.modules[""] = ModuleInfo("", "Model", f"{graph.name}.")
        self.order = [step.node for step in plan(graph).steps]
        self.position = {n.name: i for i, n in enumerate(self.order)}
        self.module_of = {n.name: self.declared(n.meta.module) for n in self.order}
        self.children: dict[str, list[str]] = {p: [] for p in self.modules}
        for path in self.modules:
            if path:
                self.children[self.parent(path)].append(path)
        self.ops = {p: [n for n in self.order if within(p, self.module_of[n.name])]
                    for p in self.modules}
        self.param_index = {p.name: i for i, p in enumerate(graph.params())}
        self.sizes: dict[str, Any] = dict(graph.sizes)
        self.constants: dict[str, tuple[str, str]] = {}
        """Constants the rendered code uses besides sizes: name -> (value source, comment)."""
        self.helpers: set[str] = set()
        """Helper classes of model.py the rendered code uses ("Parameters")."""
        self.shared: dict[str, Shared] = {}
        self.shared_of: dict[str, Shared] = {}
        self._find_shared()
        self.leaves = self._leaves()
        self.axes = self._axes()
        self._check_names()

    # ---- the module tree ----------------------------------------------------------------

    def declared(self, path: str) -> str:
        """The nearest declared module at or above ``path``."""
        while path not in self.modules:
            path = path.rpartition(".")[0]
        return path

    def parent(self, path: str) -> str:
        return self.declared(path.rpartition(".")[0])

    def child_toward(self, path: str, below: str) -> str:
        """The child module of ``path`` that contains module ``below``."""
        while self.parent(below) != path:
            below = self.parent(below)
        return below

    def height(self, path: str) -> int:
        """0 for a module without child modules, else one more than its tallest child."""
        return 1 + max((self.height(c) for c in self.children[path]), default=-1)

    def stack(self, path: str) -> str | None:
        """The one stack every node of the module belongs to (None for the model)."""
        stacks = {n.meta.stack for n in self.ops[path]}
        return stacks.pop() if len(stacks) == 1 else None

    # ---- values -------------------------------------------------------------------------

    def is_param(self, value: str) -> bool:
        return value in self.graph and self.graph.node(value).is_param

    def operands(self, node: Node) -> list[str]:
        """The node's inputs, then its shared input (if its template has one)."""
        shared = self.shared_of.get(node.name)
        return [*node.inputs, shared.id] if shared else list(node.inputs)

    def inside(self, path: str, value: str) -> bool:
        """``value`` is a parameter under ``path`` or computed inside module ``path``."""
        if path == "":
            return True
        if value in self.shared:
            return within(path, self.shared[value].home)
        if value in self.module_of:
            return within(path, self.module_of[value])
        return self.is_param(value) and value.startswith(path + ".")

    def inputs(self, path: str) -> list[str]:
        """What module ``path``'s forward takes, in order of first use (the graph's inputs for
        the model)."""
        if path == "":
            return list(self.graph.inputs)
        seen: dict[str, None] = {}
        for node in self.ops[path]:
            for value in self.operands(node):
                if not self.inside(path, value):
                    seen.setdefault(value)
        return list(seen)

    def outputs(self, path: str) -> list[str]:
        """What module ``path``'s forward returns: values computed inside and read outside."""
        if path == "":
            return list(self.graph.outputs)
        mine = {n.name for n in self.ops[path]}
        return [n.name for n in self.ops[path] if n.name in self.graph.outputs
                or any(u.name not in mine for u, _ in self.graph.users(n.name))]

    def crosses_stacks(self, value: str) -> str | None:
        """The stack of ``value`` when another stack reads it (the encoder output)."""
        if value not in self.module_of:
            return None
        own = self.graph.node(value).meta.stack
        readers = {u.meta.stack for u, _ in self.graph.users(value)}
        return own if own is not None and readers - {None, own} else None

    # ---- shared inputs ------------------------------------------------------------------

    def _find_shared(self) -> None:
        groups: dict[tuple[Any, ...], list[Node]] = {}
        for node in self.order:
            form = template(node).shared
            if form is not None:
                groups.setdefault((form.name, form.key(node)), []).append(node)
        for i, ((name, _), users) in enumerate(groups.items()):
            form = template(users[0]).shared
            assert form is not None
            home = self.module_of[users[0].name]
            for user in users[1:]:
                home = self._common(home, self.module_of[user.name])
            while home and self._in_one_layer(home):
                home = self.parent(home)
            value = Shared(f"#{name}{i}", form, users, home, str(users[0].type.shape[1]))
            self.shared[value.id] = value
            for user in users:
                self.shared_of[user.name] = value

    def _common(self, a: str, b: str) -> str:
        common: list[str] = []
        for x, y in zip(a.split("."), b.split(".")):
            if x != y:
                break
            common.append(x)
        return self.declared(".".join(common))

    def _in_one_layer(self, path: str) -> bool:
        """Every node of the module runs in one layer: a value shared by several layers is
        computed by their caller, as to_torch's model does (tfgraph.plan's regions)."""
        regions = {layer_region(n) for n in self.ops[path]}
        return len(regions) == 1 and None not in regions

    # ---- parameters ---------------------------------------------------------------------

    def _leaves(self) -> dict[str, Leaf]:
        leaves: dict[str, Leaf] = {}
        for p in self.graph.params():
            owner = owner_of(p.name)
            leaf = leaves.setdefault(owner, Leaf(owner, [], self.declared(owner)))
            leaf.params.append(p)
        for leaf in leaves.values():
            if leaf.owner == leaf.home:
                continue  # parameters directly on a declared module
            users = sorted({u.name: u for p in leaf.params for u, _ in self.graph.users(p.name)
                            }.values(), key=lambda u: self.position[u.name])
            for user in users:
                form = template(user).module
                if form is not None and self.matches(user, form, leaf):
                    leaf.form, leaf.form_node = form, user
                    break
        return leaves

    def matches(self, node: Node, form: ModuleForm, leaf: Leaf) -> bool:
        """``node``'s operands are ``form``'s pattern with exactly ``leaf``'s parameters."""
        if len(node.inputs) > len(form.params) or node.name in self.shared_of:
            return False
        used = set()
        for value, want in zip(node.inputs, form.params):
            if not want:
                if self.is_param(value):
                    return False
            elif not self.is_param(value) or owner_of(value) != leaf.owner \
                    or leaf_name(value) != want:
                return False
            else:
                used.add(value)
        return used == {p.name for p in leaf.params}

    def call_leaf(self, node: Node) -> Leaf | None:
        """The parameter group whose ``torch.nn`` module computes ``node`` when called."""
        form = template(node).module
        params = [v for v in node.inputs if self.is_param(v)]
        if form is None or not params:
            return None
        leaf = self.leaves[owner_of(params[0])]
        if leaf.form is not form or leaf.form_node is None or not self.matches(node, form, leaf):
            return None
        return leaf if node.attrs == leaf.form_node.attrs else None

    def dim_sources(self, param: Node) -> list[str]:
        """The parameter's shape as source: its ``dims`` in size constants ("HEADS * HEAD_DIM")."""
        dims = param.attrs.get("dims") or ()
        shape = param.attrs["shape"]
        out = []
        for i, size in enumerate(shape):
            parts = dims[i].split("*") if i < len(dims) else []
            if parts and all(p in self.sizes for p in parts) and \
                    math.prod(self.sizes[p] for p in parts) == size:
                out.append(" * ".join(p.upper() for p in parts))
            else:
                out.append(str(size))
        return out

    def init_source(self, param: Node) -> str:
        """A fresh value for the parameter in tfgraph's scheme (README, "Parameter names";
        load() overwrites it)."""
        shape = ", ".join(self.dim_sources(param))
        init = param.attrs.get("init")
        if init in ("ones", "zeros"):
            return f"torch.{init}({shape})"
        if init == "normal":
            return f"{INIT_STD} * torch.randn({shape})"
        return f"torch.empty({shape})"

    # ---- shape comments -----------------------------------------------------------------

    def _axes(self) -> dict[str, tuple[Axis, ...]]:
        axes: dict[str, tuple[Axis, ...]] = {}
        for node in self.graph.nodes():
            if node.is_param:
                axes[node.name] = self._param_axes(node)
                continue
            found = self._plain_axes(node)
            if node.op != "input":
                ins = [axes[i] for i in node.inputs]
                rule = template(node).dims
                named = tuple(rule(ins)) if rule else ins[0]
                if len(named) == len(node.type.shape) and all(
                        sympy.sympify(a.value) == d for a, d in zip(named, node.type.shape)):
                    found = named
            axes[node.name] = found
        return axes

    def _plain_axes(self, node: Node) -> tuple[Axis, ...]:
        return tuple(Axis(str(d), d, bool(d.is_Symbol)) for d in node.type.shape)

    def _param_axes(self, param: Node) -> tuple[Axis, ...]:
        dims = param.attrs.get("dims") or ()
        shape = param.attrs["shape"]
        out = []
        for i, size in enumerate(shape):
            parts = dims[i].split("*") if i < len(dims) else []
            if parts and all(p in self.sizes for p in parts):
                out.append(Axis("*".join(ABBREVIATIONS.get(p, p) for p in parts),
                                math.prod(self.sizes[p] for p in parts)))
            else:
                out.append(Axis(str(size), size))
        return tuple(out)

    # ---- constants ----------------------------------------------------------------------

    def constant_for(self, node: Node, key: str) -> str | None:
        """The constant model.py writes for ``node.attrs[key]``: a size (``HEADS``), or a
        hyper-parameter every such node shares (``DROPOUT_P``); None for a per-node value."""
        value = node.attrs[key]
        if isinstance(value, bool) or not isinstance(value, (int, float, sympy.Number)):
            return None
        if key in self.sizes:
            if self.sizes[key] == value:
                return key.upper()
            same = [k for k, v in self.sizes.items() if v == value]
            if len(same) == 1:
                return same[0].upper()
        values = {n.attrs[key] for n in self.order if n.op == node.op and key in n.attrs}
        if len(values) != 1:
            return None
        name = f"{node.op}_{key}".upper()
        self.constants.setdefault(name, (self._number(value), f"every {node.op}'s {key}"))
        return name

    def _number(self, value: Any) -> str:
        """A number as source; ``math.sqrt(D_MODEL)`` where it is exactly that."""
        if isinstance(value, float):
            for name, size in self.sizes.items():
                if isinstance(size, int) and size > 0 and value == math.sqrt(size):
                    return f"math.sqrt({name.upper()})"
        return literal(value)

    # ---- checks -------------------------------------------------------------------------

    def _check_names(self) -> None:
        """Paths become attribute chains and inputs become arguments: each must be a Python
        name that no nn.Module attribute already uses (or an index under a container)."""
        taken = set(dir(nn.Module))
        paths = [*self.modules, *(p.name for p in self.graph.params())]
        for path in paths:
            for part in path.split(".") if path else ():
                if not part.isdigit() and (not part.isidentifier() or keyword.iskeyword(part)
                                           or part in taken):
                    raise TfgraphError(f"{path}: {part!r} cannot be an attribute in model.py")
        dims = {part for p in self.graph.params() for d in p.attrs.get("dims") or ()
                for part in d.split("*")}
        for name in [*self.graph.inputs, *(i.cls for i in self.modules.values()), *self.sizes,
                     *(d for d in dims if not d.isdigit())]:
            if not name.isidentifier() or keyword.iskeyword(name):
                raise TfgraphError(f"{name!r} is not a Python name; model.py cannot use it")
        for name in self.graph.inputs:
            if name in RESERVED:
                raise TfgraphError(f"input {name!r} would hide model.py's {name}")


@dataclass(frozen=True)
class Slot:
    """A value that may differ between instances of one class: a node attribute or a child's
    constructor value (``kind`` "attr", ``key`` its name), or the sequence symbol of a shape
    comment (``kind`` "axis")."""

    kind: str
    key: str
    value: Any


# ---- one module instance --------------------------------------------------------------------

SLOT = "\x00"  # rendered text marks slot i as \x00i\x00 until the class is resolved
GENERIC = ("x", "h", "y", "z")
# Variables named after the node's role; other values are x, h, y, ... (see _names).
ROLE_NAMES = {"q": "q", "q_rope": "q", "k": "k", "k_rope": "k", "v": "v", "gate": "gate",
              "up": "up", "tokens": "x", "logits": "logits", "probs": "probs"}


@dataclass
class Event:
    """One statement of a forward: a node, a child module's call, a shared input's
    computation, or a loop over a container's modules (``loop``: its source, "self.layers")."""

    reads: list[str]
    targets: list[str]
    args: list[str]
    call: str | None = None
    node: Node | None = None
    shared: Shared | None = None
    loop: str | None = None


@dataclass
class Instance:
    """A module rendered with slots: ``key()`` is equal for instances of one class."""

    path: str
    info: ModuleInfo
    init: list[str]
    params: list[str]
    returns: int
    body: list[str]
    slots: list[Slot]

    def key(self) -> tuple[Any, ...]:
        return (self.info.cls, tuple(self.init), tuple(self.params), tuple(self.body),
                tuple((s.kind, s.key) for s in self.slots))


ChildClass = tuple[str, list[tuple[str, Any]]]
"""A child module's class name and its constructor values (argument, value)."""


class InstanceRenderer:
    """Renders module ``path``'s ``__init__`` and ``forward``; ``classes`` has the class and
    constructor values of every child module (children are resolved first)."""

    def __init__(self, view: GraphView, path: str, classes: dict[str, ChildClass]) -> None:
        self.v = view
        self.path = path
        self.classes = classes
        self.slots: list[Slot] = []
        self._axis_slots: dict[str, str] = {}

    def render(self) -> Instance:
        events = self._loops(self._events())
        inputs, outputs = self.v.inputs(self.path), self.v.outputs(self.path)
        names = self._names(events, inputs, outputs)
        body = [line for event in events for line in self._statement(event, names)]
        body.append(f"return {', '.join(names[v] for v in outputs)}")
        params = [f"{names[v]}: {self._annotation(v)}" for v in inputs]
        return Instance(self.path, self.v.modules[self.path], self._init(), params, len(outputs),
                        body, self.slots)

    # ---- slots and sources ------------------------------------------------------------

    def slot(self, kind: str, key: str, value: Any) -> str:
        self.slots.append(Slot(kind, key, value))
        return f"{SLOT}{len(self.slots) - 1}{SLOT}"

    def attr(self, node: Node) -> Callable[[str], str]:
        def render(key: str) -> str:
            return self.v.constant_for(node, key) or self.slot("attr", key, node.attrs[key])
        return render

    def axis(self, symbol: str) -> str:
        if symbol == BATCH:
            return symbol
        if symbol not in self._axis_slots:
            self._axis_slots[symbol] = self.slot("axis", str(len(self._axis_slots)), symbol)
        return self._axis_slots[symbol]

    def shape(self, value: str) -> str:
        return "(" + ", ".join(self.axis(a.text) if a.symbol else a.text
                               for a in self.v.axes[value]) + ")"

    def attribute(self, path: str) -> str:
        """``self.a.b[0]`` for the module or parameter at ``path`` below this module."""
        rel = path[len(self.path) + 1:] if self.path else path
        return "self" + "".join(f"[{s}]" if s.isdigit() else f".{s}" for s in rel.split("."))

    def _own_param(self, value: str) -> bool:
        return self.v.is_param(value) and self.v.inside(self.path, value)

    def _annotation(self, value: str) -> str:
        return self.v.shared[value].form.annotation if value in self.v.shared else "Tensor"

    # ---- statements -------------------------------------------------------------------

    def _events(self) -> list[Event]:
        ops, events, done = self.v.ops[self.path], [], set()
        i = 0
        while i < len(ops):
            node = ops[i]
            module = self.v.module_of[node.name]
            if module == self.path:
                event, i = self._node_event(node), i + 1
            else:
                child = self.v.child_toward(self.path, module)
                block = [n.name for n in self.v.ops[child]]
                if [n.name for n in ops[i:i + len(block)]] != block:
                    raise TfgraphError(f"{child}: its nodes do not run together in the graph's "
                                       "order, so model.py cannot call it as one module")
                event, i = self._call_event(child), i + len(block)
            for value in event.reads:
                shared = self.v.shared.get(value)
                if shared is not None and shared.home == self.path and value not in done:
                    done.add(value)
                    events.append(self._shared_event(shared, event))
            events.append(event)
        return events

    def _node_event(self, node: Node) -> Event:
        args = self.v.operands(node)
        return Event([v for v in args if not self._own_param(v)], [node.name], args, node=node)

    def _call_event(self, child: str) -> Event:
        args = self.v.inputs(child)
        return Event([v for v in args if not self._own_param(v)], self.v.outputs(child), args,
                     call=child)

    def _shared_event(self, shared: Shared, consumer: Event) -> Event:
        graph = self.v.graph
        refs = [v for v in consumer.reads if v in graph and len(graph.node(v).type.shape) > 1
                and str(graph.node(v).type.shape[1]) == shared.length]
        if not refs:
            raise TfgraphError(f"{shared.users[0].name}: no tensor of length {shared.length} "
                               f"to compute its {shared.form.name} from")
        return Event(refs[:1], [shared.id], refs[:1], shared=shared)

    def _loops(self, events: list[Event]) -> list[Event]:
        """Runs of calls through a container's modules 0..N-1 that pass one stream along become
        ``for layer in self.layers: x = layer(x, ...)``."""
        out, i = [], 0
        while i < len(events):
            run = self._loop_length(events, i)
            if run:
                first, last = events[i], events[i + run - 1]
                assert first.call is not None
                out.append(Event(first.reads, last.targets, first.args,
                                 loop=self.attribute(first.call.rpartition(".")[0])))
                i += run
            else:
                out.append(events[i])
                i += 1
        return out

    def _loop_length(self, events: list[Event], i: int) -> int:
        first = events[i]
        if first.call is None or not first.call.endswith(".0") or not first.reads \
                or first.args[0] != first.reads[0]:
            return 0
        container = first.call[:-2]
        items = [c for c in self.v.children[self.path] if c.rpartition(".")[0] == container]
        if [c.rpartition(".")[2] for c in items] != [str(k) for k in range(len(items))] or any(
                leaf.home == self.path and within(container, leaf.owner)
                for leaf in self.v.leaves.values()):
            return 0
        run = events[i:i + len(items)]
        if [e.call for e in run] != items:
            return 0
        later = [v for e in events[i + len(items):] for v in e.reads]
        outputs = set(self.v.outputs(self.path))
        stream = first.reads[0]
        for k, event in enumerate(run):
            if len(event.targets) != 1 or event.args[1:] != first.args[1:] or \
                    event.args[0] != stream or stream in later or stream in outputs or \
                    any(stream in e.reads for e in run[k + 1:]):
                return 0
            stream = event.targets[0]
        return len(run)

    def _statement(self, event: Event, names: dict[str, str]) -> list[str]:
        def source(value: str) -> str:
            return self.attribute(value) if self._own_param(value) else names[value]

        targets = ", ".join(names[t] for t in event.targets)
        if event.loop is not None:
            var = self._loop_variable(event.loop, names)
            call = f"{var}({', '.join(source(v) for v in event.args)})"
            return [f"for {var} in {event.loop}:",
                    f"    {targets} = {call}  # {self.shape(event.targets[0])}"]
        if event.shared is not None:
            shared = event.shared
            expr = shared.form.expr(source(event.args[0]), self.attr(shared.users[0]))
            comment = shared.form.comment(self.axis(shared.length))
        elif event.call is not None:
            expr = f"{self.attribute(event.call)}({', '.join(source(v) for v in event.args)})"
            comment = ", ".join(self.shape(t) for t in event.targets)
        else:
            assert event.node is not None
            expr = self._node_expr(event.node, source)
            comment = self.shape(event.node.name)
        return [f"{targets} = {expr}  # {comment}"]

    def _node_expr(self, node: Node, source: Callable[[str], str]) -> str:
        leaf = self.v.call_leaf(node)
        if leaf is not None and self._own_param(leaf.params[0].name):
            data = [source(v) for v in node.inputs if not self.v.is_param(v)]
            return f"{self.attribute(leaf.owner)}({', '.join(data)})"
        return template(node).expr([source(v) for v in self.v.operands(node)], self.attr(node))

    def _loop_variable(self, container: str, names: dict[str, str]) -> str:
        last = container.rpartition(".")[2]
        base = last[:-1] if last.endswith("s") and len(last) > 1 else "module"
        return variant(base, set(names.values()) | RESERVED)

    # ---- variable names ---------------------------------------------------------------

    def _names(self, events: list[Event], inputs: list[str], outputs: list[str]
               ) -> dict[str, str]:
        """A variable per value. A value takes its role's name (q, k, v, ...), or
        ``<stack>_out`` when it comes from another stack, or the name of an operand that dies
        here (``x = x + h``), or the next free of x, h, y, z (nanoGPT's style)."""
        names: dict[str, str] = {}
        live: dict[str, str] = {}  # variable -> value it holds
        for value in inputs:
            names[value] = _free(self._input_name(value), live)
            live[names[value]] = value
        last = {v: i for i, e in enumerate(events) for v in e.reads}
        last.update({v: len(events) for v in outputs})
        used = set(live)
        for i, event in enumerate(events):
            dying = [v for v in event.reads if last.get(v) == i]
            for value in dying:
                live.pop(names[value], None)
            for target in event.targets:
                if event.loop is not None:
                    name = names[event.reads[0]]
                else:
                    name = self._name(target, dying, names, live, used)
                names[target] = name
                live[name] = target
                used.add(name)
            for target in event.targets:
                if target not in last:
                    live.pop(names[target], None)
        return names

    def _input_name(self, value: str) -> str:
        if value in self.v.graph.inputs:
            return value
        if value in self.v.shared:
            return self.v.shared[value].form.name
        if self.v.is_param(value):
            return "_".join(value.split(".")[-2:])
        stack = self.v.crosses_stacks(value)
        if stack and stack != self.v.stack(self.path):
            return f"{stack}_out"
        return "x"

    def _name(self, value: str, dying: list[str], names: dict[str, str], live: dict[str, str],
              used: set[str]) -> str:
        if value in self.v.shared:
            return _free(self.v.shared[value].form.name, live)
        stack = self.v.crosses_stacks(value)
        if stack and stack != self.v.stack(self.path):
            return _free(f"{stack}_out", live)
        role = self.v.graph.node(value).meta.role if value in self.v.graph else ""
        if role in ROLE_NAMES:
            return _free(ROLE_NAMES[role], live)
        for operand in dying:
            if _generic(names[operand]) and names[operand] not in live:
                return names[operand]
        if "x" not in used:
            return "x"
        for base in GENERIC[1:]:
            if base not in live:
                return base
        return _free("h", live)

    # ---- __init__ -----------------------------------------------------------------------

    def _init(self) -> list[str]:
        lines: list[str] = []
        for key, entry in self._tree().items():
            lines += self._create(f"self.{key}", f"{self.path}.{key}".lstrip("."), entry)
        return lines

    def _tree(self) -> dict[str, Any]:
        """What ``__init__`` creates, as nested dicts of attribute names, ordered as the
        parameters are (so state_dict order is the graph's)."""
        entries: list[tuple[tuple[int, int], str, Any]] = []
        big = len(self.v.param_index)
        for child in self.v.children[self.path]:
            first = min((i for n, i in self.v.param_index.items() if within(child, n)),
                        default=big)
            ops = self.v.ops[child]
            entries.append(((first, self.v.position[ops[0].name] if ops else 0), child, child))
        for leaf in self.v.leaves.values():
            if leaf.home != self.path:
                continue
            if leaf.owner == self.path:  # parameters directly on this module
                for p in leaf.params:
                    entries.append(((self.v.param_index[p.name], 0), p.name, p))
            else:
                first = min(self.v.param_index[p.name] for p in leaf.params)
                entries.append(((first, 0), leaf.owner, leaf))
        tree: dict[str, Any] = {}
        for _, path, entry in sorted(entries, key=lambda e: e[0]):
            rel = path[len(self.path) + 1:] if self.path else path
            *parents, last = rel.split(".")
            node = tree
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = entry
        return tree

    def _create(self, target: str, path: str, entry: Any) -> list[str]:
        if not isinstance(entry, dict):
            return [f"{target} = {self._construct(entry)}"]
        keys = list(entry)
        if not all(k.isdigit() for k in keys):
            lines = [f"{target} = nn.Module()"]
            for key, sub in entry.items():
                lines += self._create(f"{target}.{key}", f"{path}.{key}", sub)
            return lines
        items = [entry[str(k)] for k in range(len(keys)) if str(k) in entry]
        if len(items) != len(keys) or any(isinstance(i, dict) for i in items):
            raise TfgraphError(f"{path}: a container of modules must hold items 0..N-1")
        same = all(isinstance(i, str) for i in items) and all(
            self.classes[i] == self.classes[items[0]] for i in items)
        if same:
            count = path.replace(".", "_").upper()
            self.v.constants.setdefault(count, (str(len(items)), f"modules in {path}"))
            return [f"{target} = nn.ModuleList({self._construct(items[0])} "
                    f"for _ in range({count}))"]
        return [f"{target} = nn.ModuleList([{', '.join(self._construct(i) for i in items)}])"]

    def _construct(self, entry: Any) -> str:
        """The constructor call of a child module, a parameter group or a parameter."""
        if isinstance(entry, str):
            cls, values = self.classes[entry]
            args = ", ".join(f"{arg}={self.slot('attr', arg, value)}" for arg, value in values)
            return f"{cls}({args})"
        if isinstance(entry, Leaf):
            if entry.form is not None and entry.form_node is not None:
                dims = {leaf_name(p.name): tuple(self.v.dim_sources(p)) for p in entry.params}
                return entry.form.ctor(dims, self.attr(entry.form_node))
            self.v.helpers.add("Parameters")
            inits = ", ".join(f"{leaf_name(p.name)}={self.v.init_source(p)}"
                              for p in entry.params)
            return f"Parameters({inits})"
        return f"nn.Parameter({self.v.init_source(entry)})"


def _generic(name: str) -> bool:
    return name.rstrip("0123456789") in GENERIC


def _free(base: str, live: dict[str, str]) -> str:
    """A variable name from ``base`` that holds no live value and hides no module-level name."""
    return variant(base, set(live) | RESERVED)


def variant(base: str, taken: set[str] | frozenset[str]) -> str:
    """``base``, or ``base2``, ``base3``, ... if taken."""
    name, k = base, 2
    while name in taken:
        name, k = f"{base}{k}", k + 1
    return name
