"""The plan of one module's ``forward``, before any text: its statements (``forward_events``)
and the variable every value lives in (``variable_names``). ``torch_render`` writes them out.

A forward is the module's nodes in the walk's order (``tfgraph.passes.liveness``), so model.py computes
and frees what to_torch does: a node of the module itself is one statement, the nodes of a
child module are one call, a shared input is computed just before its first reader, and calls
through a container's modules 0..N-1 that pass one stream along become one loop.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfgraph.errors import TfgraphError
from tfgraph.exporters.torch.render_graph import GraphView, Shared, within
from tfgraph.exporters.torch.render_spelling import RESERVED, variant
from tfgraph.graph.ir import Node

GENERIC = ("x", "h", "y", "z")
"""Names of values without a role name, in order of preference (nanoGPT's style)."""
ROLE_NAMES = {"q": "q", "q_rope": "q", "k": "k", "k_rope": "k", "v": "v", "gate": "gate",
              "up": "up", "tokens": "x", "logits": "logits", "probs": "probs",
              "loss": "loss"}
"""Variables named after the node's role (``meta.role``)."""


@dataclass
class Event:
    """One statement of a forward: a node, a child module's call, a shared input's
    computation, or a loop over a container's modules (``loop``: the container's path).
    ``reads`` are the values it takes from variables (``args`` less the module's own
    parameters), ``targets`` the values it assigns."""

    reads: list[str]
    targets: list[str]
    args: list[str]
    call: str | None = None
    node: Node | None = None
    shared: Shared | None = None
    loop: str | None = None


# ---- statements -------------------------------------------------------------------------------


def forward_events(view: GraphView, path: str) -> list[Event]:
    """The statements of module ``path``'s forward, in order."""
    return _loops(view, path, _events(view, path))


def _events(view: GraphView, path: str) -> list[Event]:
    ops, events, done = view.ops[path], [], set()
    i = 0
    while i < len(ops):
        node = ops[i]
        module = view.module_of[node.name]
        if module == path:
            args = view.operands(node)
            event = Event(_reads(view, path, args), [node.name], args, node=node)
            i += 1
        else:
            child = view.child_toward(path, module)
            block = [n.name for n in view.ops[child]]
            if [n.name for n in ops[i:i + len(block)]] != block:
                raise TfgraphError(f"{child}: its nodes do not run together in the graph's "
                                   "order, so model.py cannot call it as one module")
            args = view.inputs(child)
            event = Event(_reads(view, path, args), view.outputs(child), args, call=child)
            i += len(block)
        for value in event.reads:
            shared = view.shared.get(value)
            if shared is not None and shared.home == path and value not in done:
                done.add(value)
                events.append(_shared_event(view, shared, event))
        events.append(event)
    return events


def _reads(view: GraphView, path: str, args: list[str]) -> list[str]:
    """The arguments that come from variables: all but the module's own parameters."""
    return [v for v in args if not view.param_under(path, v)]


def _shared_event(view: GraphView, shared: Shared, consumer: Event) -> Event:
    """The shared value, computed from a value ``consumer`` reads on its sequence axis."""
    graph = view.graph
    refs = [v for v in consumer.reads if v in graph and len(graph.node(v).type.shape) > 1
            and str(graph.node(v).type.shape[1]) == shared.length]
    if not refs:
        raise TfgraphError(f"{shared.users[0].name}: no tensor of length {shared.length} "
                           f"to compute its {shared.form.name} from")
    return Event(refs[:1], [shared.id], refs[:1], shared=shared)


def _loops(view: GraphView, path: str, events: list[Event]) -> list[Event]:
    """Runs of calls through a container's modules 0..N-1 that pass one stream along become
    ``for layer in self.layers: x = layer(x, ...)``."""
    out, i = [], 0
    while i < len(events):
        run = _loop_length(view, path, events, i)
        if run:
            first, last = events[i], events[i + run - 1]
            assert first.call is not None
            out.append(Event(first.reads, last.targets, first.args,
                             loop=first.call.rpartition(".")[0]))
            i += run
        else:
            out.append(events[i])
            i += 1
    return out


def _loop_length(view: GraphView, path: str, events: list[Event], i: int) -> int:
    """How many events from ``i`` on one loop replaces (0 for none): calls of every module of
    a container in order, with the same arguments but the stream (the first), which each
    hands to the next and nothing else reads; the container holds no parameters of its own."""
    first = events[i]
    if first.call is None or not first.call.endswith(".0") or not first.reads \
            or first.args[0] != first.reads[0]:
        return 0
    container = first.call[:-2]
    items = [c for c in view.children[path] if c.rpartition(".")[0] == container]
    if [c.rpartition(".")[2] for c in items] != [str(k) for k in range(len(items))] or any(
            leaf.home == path and within(container, leaf.owner)
            for leaf in view.leaves.values()):
        return 0
    run = events[i:i + len(items)]
    if [e.call for e in run] != items:
        return 0
    later = [v for e in events[i + len(items):] for v in e.reads]
    outputs = set(view.outputs(path))
    stream = first.reads[0]
    for k, event in enumerate(run):
        if len(event.targets) != 1 or event.args[1:] != first.args[1:] or \
                event.args[0] != stream or stream in later or stream in outputs or \
                any(stream in e.reads for e in run[k + 1:]):
            return 0
        stream = event.targets[0]
    return len(run)


# ---- variable names ---------------------------------------------------------------------------


def variable_names(view: GraphView, path: str, events: list[Event], inputs: list[str],
                   outputs: list[str]) -> dict[str, str]:
    """A variable per value of module ``path``'s forward. A value takes its role's name (q, k,
    v, ...), or ``<stack>_out`` when it comes from another stack, or the name of an operand
    that dies here (``x = x + h``), or the next free of x, h, y, z; a loop's result keeps its
    stream's name. Two live values never share a name, so reading the code in order is
    reading the graph."""
    names: dict[str, str] = {}
    live: dict[str, str] = {}  # variable -> the value it holds
    for value in inputs:
        names[value] = free(_input_name(view, path, value), live)
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
                name = _target_name(view, path, target, dying, names, live, used)
            names[target] = name
            live[name] = target
            used.add(name)
        for target in event.targets:
            if target not in last:
                live.pop(names[target], None)
    return names


def free(base: str, live: dict[str, str]) -> str:
    """A variable name from ``base`` that holds no live value and hides no module-level name."""
    return variant(base, set(live) | RESERVED)


def _input_name(view: GraphView, path: str, value: str) -> str:
    if value in view.graph.inputs:
        return value
    if value in view.shared:
        return view.shared[value].form.name
    if view.is_param(value):
        return "_".join(value.split(".")[-2:])
    stack = view.crosses_stacks(value)
    if stack and stack != view.stack(path):
        return f"{stack}_out"
    return "x"


def _target_name(view: GraphView, path: str, value: str, dying: list[str],
                 names: dict[str, str], live: dict[str, str], used: set[str]) -> str:
    if value in view.shared:
        return free(view.shared[value].form.name, live)
    stack = view.crosses_stacks(value)
    if stack and stack != view.stack(path):
        return free(f"{stack}_out", live)
    role = view.graph.node(value).meta.role if value in view.graph else ""
    if role in ROLE_NAMES:
        return free(ROLE_NAMES[role], live)
    for operand in dying:
        if names[operand].rstrip("0123456789") in GENERIC and names[operand] not in live:
            return names[operand]
    if "x" not in used:
        return "x"
    for base in GENERIC[1:]:
        if base not in live:
            return base
    return free("h", live)
