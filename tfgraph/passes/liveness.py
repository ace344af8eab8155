"""The one walk over a graph: execution order, liveness, aliases and in-place reuse.

torch.fx's ``Interpreter`` idea: every job that runs through a graph node by node (the
activation peak of the cost report, the PyTorch module's freeing and in-place writes) walks the
same ``Plan``, so what the report says is live is what the module keeps.

The plan's rules:
- op nodes run in the graph's deterministic topological order; inputs are live from the start,
  parameters are weights (never activations);
- an op whose table entry says ``aliases_input`` (dropout, the identity at inference) writes no
  buffer of its own: its output is its input's buffer (``owner``); in the training walk
  (``training=True``, read by ``tfgraph.passes.train_walk``) it does, as dropout in training does;
- a buffer lives from its producer to its last reader; graph outputs live to the end;
- a *region* is a group of nodes run as one call (a layer module): a buffer produced outside a
  region and read inside it is held by the caller until the call returns, so it lives until the
  region's last node, and the region never overwrites it;
- a step may overwrite its first operand (or either operand of a commutative op) in place when
  that buffer is produced by an op, is not an output, is not held by a caller, and no later step
  reads it or an alias of it.

Precondition: the graph lints. Postcondition: the graph is unchanged; the plan is returned
(and memoised on the graph until it changes).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tfgraph.graph.ir import Graph, Node, frozen_new
from tfgraph.graph.ops import OPS

V = TypeVar("V")
END = 1 << 30  # "after the last step": the position of graph outputs' last use


@dataclass(frozen=True)
class Step:
    """One op node of the walk."""

    node: Node
    position: int
    frees: tuple[str, ...]
    """Buffers (owner names) that are dead after this step."""
    overwrite: int | None
    """Operand index whose buffer this step may overwrite in place without autograd, or None."""


@dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]
    owner: dict[str, str]
    """Buffer each value lives in: its own name, or its input's for aliasing ops."""
    last_use: dict[str, int]
    """Position of the last step that needs each buffer (``END`` for graph outputs)."""
    region: dict[str, tuple[Any, ...]]
    """Region (layer key) of each op node inside one; absent for nodes outside every region."""

    def live_at(self, graph: Graph, position: int) -> tuple[str, ...]:
        """Buffers live while the step at ``position`` runs (inputs, outputs, held values)."""
        order = {n.name: i for i, n in enumerate(graph.nodes())}
        produced = {s.node.name: s.position for s in self.steps}
        out = []
        for n in graph.nodes():
            if n.is_param or self.owner[n.name] != n.name:
                continue
            born = produced.get(n.name, -1)
            if born <= position <= self.last_use.get(n.name, born) and n.name in order:
                out.append(n.name)
        return tuple(out)


def layer_region(node: Node) -> tuple[Any, ...] | None:
    """The layer module a node runs in (None outside layers)."""
    m = node.meta
    return None if m.layer is None else (m.stack, m.layer)


def plan(graph: Graph, region_of: Callable[[Node], tuple[Any, ...] | None] = layer_region,
         training: bool = False) -> Plan:
    """The walk of ``graph`` with layers as regions (see the module docstring); with
    ``training`` no op aliases its input (dropout writes its own buffer)."""
    if region_of is layer_region:
        key = "plan_training" if training else "plan"
        return graph.memo(key, lambda: _plan(graph, region_of, training))
    return _plan(graph, region_of, training)


def _plan(graph: Graph, region_of: Callable[[Node], tuple[Any, ...] | None],
          training: bool = False) -> Plan:
    ops = list(graph.ops())
    pos = {n.name: i for i, n in enumerate(ops)}
    owner: dict[str, str] = {}
    aliasing = set() if training else {op for op, d in OPS.items() if d.aliases_input}
    params: set[str] = set()
    for n in graph.nodes():
        name = n.name
        if n.op in aliasing:
            owner[name] = owner[n.inputs[0]]
        else:
            owner[name] = name
            if n.op == "param":
                params.add(name)
    region: dict[str, tuple[Any, ...]] = {}
    region_end: dict[tuple[Any, ...], int] = {}
    for at, n in enumerate(ops):
        r = region_of(n)
        if r is not None:
            region[n.name] = r
            region_end[r] = at
    last_use: dict[str, int] = {}
    held: set[str] = set()  # buffers some region reads from outside (its caller holds them)
    region_get, last_get = region.get, last_use.get
    for at_n, n in enumerate(ops):
        r = region_get(n.name)
        for i in n.inputs:
            if i in params:
                continue
            buf = owner[i]
            at = at_n
            if r is not None and region_get(i) != r:
                at = region_end[r]  # held by the caller until the layer returns
                held.add(buf)
            if last_get(buf, -1) < at:
                last_use[buf] = at
    outputs = {owner[o] for o in graph.outputs}
    for o in outputs:
        last_use[o] = END
    frees: dict[int, list[str]] = {}
    for buf, at in last_use.items():
        if at != END:  # token ids too: the model drops its reference after their last reader
            frees.setdefault(at, []).append(buf)

    def overwritable(name: str, at: int, r: tuple[Any, ...] | None) -> bool:
        buf = owner[name]
        return (last_get(buf) == at and buf in pos and buf not in outputs and buf not in held
                and region_get(buf) == r)

    commutative = {op for op, d in OPS.items() if d.commutative}
    steps = []
    no_frees: tuple[str, ...] = ()
    for at, n in enumerate(ops):
        overwrite = None
        inputs = n.inputs
        if inputs:
            r = region_get(n.name)
            if overwritable(inputs[0], at, r):
                overwrite = 0
            elif len(inputs) > 1 and n.op in commutative and overwritable(inputs[1], at, r):
                overwrite = 1
        freed = frees.get(at)
        steps.append(frozen_new(Step, {"node": n, "position": at,
                                       "frees": tuple(freed) if freed else no_frees,
                                       "overwrite": overwrite}))
    return Plan(tuple(steps), owner, last_use, region)


class Interpreter(Generic[V]):
    """Runs a plan: ``run_node`` computes one node from its operands' values (None for
    parameters, which are weights, not part of the environment); values are dropped from the
    environment when the plan frees them. Subclasses define ``run_node``."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.plan = plan(graph)

    def run_node(self, step: Step, args: list[V | None]) -> V:
        raise NotImplementedError

    def walk(self, env: dict[str, V]) -> Iterator[tuple[Step, dict[str, V]]]:
        """Run every step; yield each with the environment as it is right after the step
        (before its dead buffers are freed)."""
        owner = self.plan.owner
        for step in self.plan.steps:
            node = step.node
            if not OPS[node.op].aliases_input:  # an alias's value is its input's buffer
                env[node.name] = self.run_node(step, [env.get(owner[i]) for i in node.inputs])
            yield step, env
            for name in step.frees:
                env.pop(name, None)
