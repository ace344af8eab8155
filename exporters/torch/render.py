"""One module of the op graph as Python text: the rendering half of model.py's generator
(``torch_source`` groups the rendered modules into classes).

``InstanceRenderer`` writes one module: an ``__init__`` that creates its parameters and child
modules in the graph's parameter order (so state_dict order is to_torch's), and a ``forward``
that is the plan of ``torch_render_forward`` written out, one line per node through
``TORCH_SOURCE``, a call where a child module's nodes run and a loop over a stack's layers,
each with its shape comment. Values that may differ between instances of one class (an
attribute such as ``causal``, the sequence axis of a shape comment) are left as *slots*, for
``torch_source`` to fill once it knows which instances share a class.

The graph's structure comes from ``torch_render_graph`` (``GraphView``), how its quantities
are spelled from ``torch_render_spelling``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

from tfgraph.errors import TfgraphError
from tfgraph.exporters.torch.render_forward import Event, forward_events, variable_names
from tfgraph.exporters.torch.render_graph import GraphView, Leaf, leaf_name
from tfgraph.exporters.torch.render_spelling import (
    BATCH,
    RESERVED,
    init_source,
    shape_source,
    spell,
    template,
    variant,
)
from tfgraph.graph.ir import ModuleInfo, Node
from tfgraph.graph.ops import OPS

__all__ = ["SLOT", "ChildClass", "Instance", "InstanceRenderer", "Slot"]

# Model inputs that may be left out, and the input whose shape their zeros default takes
# (README, "tfgraph build": BERT's token_type_ids default to segment 0, as in Hugging Face).
OPTIONAL_INPUTS = {"token_type_ids": "input_ids"}
SLOT = "\x00"  # rendered text marks slot i as \x00i\x00 until the class is resolved


@dataclass(frozen=True)
class Slot:
    """A value that may differ between instances of one class: a node attribute or a child's
    constructor value (``kind`` "attr", ``key`` its name), or the sequence symbol of a shape
    comment (``kind`` "axis")."""

    kind: str
    key: str
    value: Any


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
Member: TypeAlias = "str | Leaf | Node"
"""What ``__init__`` creates: a child module (its path), a parameter group, or a parameter."""
Members: TypeAlias = "dict[str, Member | Members]"
"""``__init__``'s attributes by name; a dict is a plain container (``nn.Module()``) or, with
keys 0..N-1, an ``nn.ModuleList``."""


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
        events = forward_events(self.v, self.path)
        inputs, outputs = self.v.inputs(self.path), self.v.outputs(self.path)
        names = variable_names(self.v, self.path, events, inputs, outputs)
        body = [line for event in events for line in self._statement(event, names)]
        body.append(f"return {', '.join(names[v] for v in outputs)}")
        params = [f"{names[v]}: {self._annotation(v)}" for v in inputs]
        if not self.path:  # the model itself: optional inputs default to zeros
            for k, v in enumerate(inputs):
                if v in OPTIONAL_INPUTS and OPTIONAL_INPUTS[v] in inputs:
                    params[k] += " | None = None"
                    body[:0] = [f"if {names[v]} is None:  # every token in segment 0",
                                f"    {names[v]} = torch.zeros_like({names[OPTIONAL_INPUTS[v]]})"]
        init = self._init()  # after the body: constructor arguments follow the slots' order
        return Instance(self.path, self.v.modules[self.path], init, params, len(outputs), body,
                        self.slots)

    # ---- slots and sources ------------------------------------------------------------

    def slot(self, kind: str, key: str, value: Any) -> str:
        self.slots.append(Slot(kind, key, value))
        return f"{SLOT}{len(self.slots) - 1}{SLOT}"

    def attr(self, node: Node) -> Callable[[str], str]:
        """Writes ``node``'s attributes: a constant where there is one, else a slot."""
        def render(key: str) -> str:
            return self.v.constants.for_attr(node, key) or self.slot("attr", key, node.attrs[key])
        return render

    def axis(self, symbol: str) -> str:
        """A sequence symbol of a shape comment, one slot per distinct symbol."""
        if symbol == BATCH:
            return symbol
        if symbol not in self._axis_slots:
            self._axis_slots[symbol] = self.slot("axis", str(len(self._axis_slots)), symbol)
        return self._axis_slots[symbol]

    def shape(self, value: str) -> str:
        return "(" + ", ".join(spell(a, self.axis) for a in self.v.axes[value]) + ")"

    def attribute(self, path: str) -> str:
        """``self.a.b[0]`` for the module or parameter at ``path`` below this module."""
        return "self" + "".join(f"[{s}]" if s.isdigit() else f".{s}"
                                for s in self._relative(path).split("."))

    def _relative(self, path: str) -> str:
        return path[len(self.path) + 1:] if self.path else path

    def _annotation(self, value: str) -> str:
        return self.v.shared[value].form.annotation if value in self.v.shared else "Tensor"

    # ---- forward ------------------------------------------------------------------------

    def _statement(self, event: Event, names: dict[str, str]) -> list[str]:
        def source(value: str) -> str:
            return self.attribute(value) if self.v.param_under(self.path, value) else names[value]

        targets = ", ".join(names[t] for t in event.targets)
        if event.loop is not None:
            var = self._loop_variable(event.loop, names)
            call = f"{var}({', '.join(source(v) for v in event.args)})"
            return [f"for {var} in {self.attribute(event.loop)}:",
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
        """The node through its parameter group's ``torch.nn`` module (``self.q(x)``) where
        this module holds one that computes it, else through its template."""
        leaf = self.v.call_leaf(node)
        if leaf is not None and self.v.param_under(self.path, leaf.params[0].name):
            data = [source(v) for v in node.inputs if not self.v.is_param(v)]
            return f"{self.attribute(leaf.owner)}({', '.join(data)})"
        operands = [source(v) for v in self.v.operands(node)]
        if OPS[node.op].tp == "project" and node.inputs[1] in self.v.tables:
            # a tied head: F.linear that also reads a vocabulary-split table (parallelize)
            return f"tied_head({', '.join(operands)})"
        return template(node).expr(operands, self.attr(node))

    def _loop_variable(self, container: str, names: dict[str, str]) -> str:
        """``layer`` for a loop over ``layers`` (the singular), else ``module``."""
        last = container.rpartition(".")[2]
        base = last[:-1] if last.endswith("s") and len(last) > 1 else "module"
        return variant(base, set(names.values()) | RESERVED)

    # ---- __init__ -----------------------------------------------------------------------

    def _init(self) -> list[str]:
        lines: list[str] = []
        for key, entry in self._members().items():
            lines += self._create(f"self.{key}", f"{self.path}.{key}".lstrip("."), entry)
        return lines

    def _members(self) -> Members:
        """What ``__init__`` creates, ordered as the parameters are (so state_dict order is the
        graph's); a child without parameters goes where its first node runs."""
        entries: list[tuple[tuple[int, int], str, Member]] = []
        no_params = len(self.v.param_index)
        for child in self.v.children[self.path]:
            first = self.v.first_param.get(child, no_params)
            ops = self.v.ops[child]
            entries.append(((first, self.v.position[ops[0].name] if ops else 0), child, child))
        for leaf in self.v.leaves_at.get(self.path, []):
            if leaf.owner == self.path:  # parameters directly on this module
                for p in leaf.params:
                    entries.append(((self.v.param_index[p.name], 0), p.name, p))
            else:
                first = min(self.v.param_index[p.name] for p in leaf.params)
                entries.append(((first, 0), leaf.owner, leaf))
        tree: Members = {}
        for _, path, entry in sorted(entries, key=lambda e: e[0]):
            *parents, last = self._relative(path).split(".")
            node = tree
            for part in parents:
                sub = node.setdefault(part, {})
                if isinstance(sub, Leaf):  # a parameter group with child modules (head.bias
                    sub = node[part] = {"": sub}  # and head.transform): the group under ""
                assert isinstance(sub, dict), f"{path}: below a module or parameter"
                node = sub
            below = node.get(last)
            if isinstance(below, dict) and isinstance(entry, Leaf):
                node[last] = {"": entry, **below}
            else:
                node[last] = entry
        return tree

    def _create(self, target: str, path: str, entry: Member | Members) -> list[str]:
        """The lines that create ``entry`` as ``target`` (``self.a.b``)."""
        if not isinstance(entry, dict):
            return [f"{target} = {self._construct(entry)}"]
        if not all(k.isdigit() for k in entry):
            group = entry.get("")  # the module's own parameters, its children set on it
            assert not isinstance(group, dict)
            lines = [f"{target} = "
                     f"{'nn.Module()' if group is None else self._construct(group)}"]
            for key, sub in entry.items():
                if key == "":
                    continue
                lines += self._create(f"{target}.{key}", f"{path}.{key}", sub)
            return lines
        items: list[Member] = []
        for k in range(len(entry)):
            item = entry.get(str(k))
            if item is None or isinstance(item, dict):
                raise TfgraphError(f"{path}: a container of modules must hold items 0..N-1")
            items.append(item)
        children = [i for i in items if isinstance(i, str)]
        if len(children) == len(items) and all(
                self.classes[c] == self.classes[children[0]] for c in children):
            count = path.replace(".", "_").upper()
            self.v.constants.add(count, str(len(items)), f"modules in {path}")
            return [f"{target} = nn.ModuleList({self._construct(items[0])} "
                    f"for _ in range({count}))"]
        return [f"{target} = nn.ModuleList([{', '.join(self._construct(i) for i in items)}])"]

    def _construct(self, entry: Member) -> str:
        """The constructor call of a child module, a parameter group or a parameter."""
        if isinstance(entry, str):
            cls, values = self.classes[entry]
            args = ", ".join(f"{arg}={self.slot('attr', arg, value)}" for arg, value in values)
            return f"{cls}({args})"
        sizes = self.v.sizes
        if isinstance(entry, Leaf):
            if entry.form is not None and entry.form_node is not None:
                dims = {leaf_name(p.name): tuple(shape_source(p, sizes)) for p in entry.params}
                return entry.form.ctor(dims, self.attr(entry.form_node))
            self.v.helpers.add("Parameters")
            inits = ", ".join(f"{leaf_name(p.name)}={init_source(p, sizes)}"
                              for p in entry.params)
            return f"Parameters({inits})"
        return f"nn.Parameter({init_source(entry, sizes)})"
