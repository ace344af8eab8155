"""The op graph as model.py's classes see it: ``GraphView`` works out, once per graph,
everything the renderer (``torch_render``) asks about structure.

That is the module tree (``graph.modules``, parents by path), the walk's order
(``tfgraph.passes.liveness``, which the forwards follow so that model.py frees and computes what to_torch
does), the values flowing into and out of each module, the shared inputs of ``TORCH_SOURCE``
(the rotary tables: computed once per forward, by the smallest module around all their users),
and the parameter groups (one per owner path: ``...self_attn.q`` holds ``weight`` and ``bias``,
created as an ``nn.Linear`` when a node uses them as one). It also holds what the rendered code
refers to on top of the file: the sizes, the ``Constants`` and the helper classes.

Nothing here reads the spec: structure is node metadata and module declarations, sizes are
``graph.sizes`` and the parameters' ``dims``.

Precondition: the graph lints (every op node's ``meta.module`` is declared, when any is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tfgraph.exporters.torch.ops import ModuleForm, SharedInput
from tfgraph.exporters.torch.render_spelling import Constants, check_names, template, value_axes
from tfgraph.graph.ir import Graph, ModuleInfo, Node
from tfgraph.graph.ops import OPS
from tfgraph.passes.liveness import layer_region, plan


@dataclass
class Shared:
    """One value of a ``SharedInput``, computed in module ``home`` before its first use and
    passed down to its ``users``."""

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
    """The parameter's attribute on its owner ("weight")."""
    return param.rpartition(".")[2]


def owner_of(param: str) -> str:
    """The path of the parameter's owner ("decoder.layers.0.self_attn.q")."""
    return param.rpartition(".")[0]


class GraphView:
    """The graph as the renderer needs it (see the module docstring)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        # token tables: operand 0 of a vocabulary gather (OpDef.tp, TpRule)
        self.tables = {n.inputs[0] for n in graph.ops() if OPS[n.op].tp == "gather"}
        """Token tables (an embedding's first operand): a linear reading one is a tied head."""
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
        self.ops: dict[str, list[Node]] = {p: [] for p in self.modules}
        """Per module, the op nodes it computes itself or through its children, in order."""
        for n in self.order:
            for p in self.above(self.module_of[n.name]):
                self.ops[p].append(n)
        self.param_index = {p.name: i for i, p in enumerate(graph.params())}
        self.first_param: dict[str, int] = {}
        """Per module path, the index of the first parameter at or below it."""
        for name, i in self.param_index.items():
            for p in self.above(name):
                self.first_param.setdefault(p, i)
        self.sizes: dict[str, Any] = dict(graph.sizes)
        self.constants = Constants(self.sizes, self.order)
        self.helpers: set[str] = set()
        """Helper classes of model.py the rendered code uses ("Parameters")."""
        self.shared: dict[str, Shared] = {}
        self.shared_of: dict[str, Shared] = {}
        """The shared value each user node takes as its last operand."""
        self._find_shared()
        self.leaves = self._leaves()
        self.leaves_at: dict[str, list[Leaf]] = {}
        """Per module path, the leaves its ``__init__`` creates (``Leaf.home``)."""
        for leaf in self.leaves.values():
            self.leaves_at.setdefault(leaf.home, []).append(leaf)
        self.axes = value_axes(graph, self.sizes)
        check_names(graph, self.modules, self.sizes)

    # ---- the module tree ----------------------------------------------------------------

    def above(self, path: str) -> list[str]:
        """The declared modules ``path`` is within (``within``): itself if declared, each
        declared ancestor, and the model ("")."""
        found = []
        while path:
            if path in self.modules:
                found.append(path)
            path = path.rpartition(".")[0]
        return [*found, ""]

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

    def param_under(self, path: str, value: str) -> bool:
        """``value`` is a parameter that module ``path`` holds (itself or through a child), so
        its code reads it as an attribute rather than taking it as an argument."""
        return self.is_param(value) and self.inside(path, value)

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
        """One shared value per distinct key of a ``SharedInput`` (the rotary tables of one
        sequence axis), computed by the nearest module around all its users; a value several
        layers use is computed by their caller, as to_torch's model does (tfgraph.passes.liveness's
        regions), so backward keeps one copy rather than one per layer."""
        groups: dict[tuple[Any, ...], tuple[SharedInput, list[Node]]] = {}
        for node in self.order:
            form = template(node).shared
            if form is not None:
                groups.setdefault((form.name, form.key(node)), (form, []))[1].append(node)
        for i, (form, users) in enumerate(groups.values()):
            home = self.module_of[users[0].name]
            for user in users[1:]:
                home = self._common(home, self.module_of[user.name])
            while home and self._in_one_layer(home):
                home = self.parent(home)
            value = Shared(f"#{form.name}{i}", form, users, home, str(users[0].type.shape[1]))
            self.shared[value.id] = value
            for user in users:
                self.shared_of[user.name] = value

    def _common(self, a: str, b: str) -> str:
        """The nearest declared module that contains both modules ``a`` and ``b``."""
        common: list[str] = []
        for x, y in zip(a.split("."), b.split(".")):
            if x != y:
                break
            common.append(x)
        return self.declared(".".join(common))

    def _in_one_layer(self, path: str) -> bool:
        """Every node of the module runs in one and the same layer."""
        regions = {layer_region(n) for n in self.ops[path]}
        return len(regions) == 1 and None not in regions

    # ---- parameter groups ---------------------------------------------------------------

    def _leaves(self) -> dict[str, Leaf]:
        """The parameters grouped by owner path. A group below its module takes the
        ``torch.nn`` form of the first node (in the walk's order) that uses exactly its
        parameters in that form's pattern; the others stay plain parameters."""
        leaves: dict[str, Leaf] = {}
        for p in self.graph.params():
            owner = owner_of(p.name)
            leaves.setdefault(owner, Leaf(owner, [], self.declared(owner))).params.append(p)
        for leaf in leaves.values():
            if leaf.owner == leaf.home:
                continue  # parameters directly on a declared module
            users = {u.name: u for p in leaf.params for u, _ in self.graph.users(p.name)}
            for user in sorted(users.values(), key=lambda u: self.position[u.name]):
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
        """The parameter group whose ``torch.nn`` module computes ``node`` when called: one
        that matches the node's operands and was built with the node's attributes."""
        form = template(node).module
        params = [v for v in node.inputs if self.is_param(v)]
        if form is None or not params:
            return None
        leaf = self.leaves[owner_of(params[0])]
        if leaf.form is not form or leaf.form_node is None or not self.matches(node, form, leaf):
            return None
        return leaf if node.attrs == leaf.form_node.attrs else None
