"""The training step as it runs: forward then backward over a loss graph, and its live peak.

A loss graph (``tfgraph.compile(spec, loss=True)``) ends with the token cross-entropy
(``tfgraph.graph.ops_loss``). One training step walks it forward in the order of ``tfgraph.passes.liveness``
(its training form: dropout writes its own buffer), then backward in reverse. Activations only:
parameters, their gradients and the optimizer's states are not here (``tfgraph.passes.figures``).

Forward, while an op runs: the tensors saved for backward so far (each once, ``OpCost.saved``,
the op's own included), the forward buffers the plan still needs (inputs, its output, buffers a
layer's caller holds) and the op's scratch (``temp``: the float32 copy of 16-bit logits; the
score matrix of unfused attention, none with ``fused_attention``).

Backward, in reverse op order, while an op's backward runs: the saved tensors not yet freed,
every live activation gradient, the gradients it writes for its inputs and its backward
scratch; after it, its output's gradient is freed and so is every saved tensor whose first
saver (in forward order) it is. An activation's gradient lives from its first consumer's
backward (the last consumer in forward order) to its producer's backward; a tensor read
twice (the residual stream) has its gradient accumulated: the second consumer's backward holds
its new gradient next to the accumulated one. The loss's backward writes the logits' gradient
(B, L, V at the logits' dtype) while the float32 log-probabilities and their gradient are live
(``OpDef.backward_temp``: ``ops_loss.backward_temp``). Parameters receive no activation
gradient; integer ids, the operands an op reads only for their shape (``OpDef.shape_only``:
``relative_bias``' input), those it reads for a choice (``OpDef.no_grad``) and those its
attributes block (``OpDef.grad_blocked``: hard attention's q and k) none either, and an op no
gradient reaches (``tfgraph.passes.gradients``: hard attention's q and k linears) writes none.

Recompute (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
Models"):
- ``none``: every saved tensor is kept from its op's forward to its backward;
- ``selective``: attention's score-sized saved tensors (``OpDef.score_sized``: the softmax
  weights and tanh output that explicit attention keeps: hardmax, a score bias, soft-capping)
  are not kept; they are
  recomputed in that attention's backward, where they are live again as scratch. Attention run
  as a fused kernel keeps no score-sized tensor, so there it equals ``none``;
- ``full``: each layer (``plan.layer_region``) keeps only its inputs from outside the layer
  (the residual stream, the encoder output, a position bias); when backward reaches the layer
  its forward runs again (phase ``recompute``), its saved tensors are rebuilt and freed by its
  backward, so one layer's worth is live at a time. Ops outside layers keep their own.

Precondition: the graph lints and ends with its loss (an ``OpDef.loss`` op: ``cross_entropy``).
Postcondition: nothing in the graph changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import sympy

from tfgraph.passes import cost, gradients
from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph, Node
from tfgraph.graph.lower import lower, with_loss
from tfgraph.graph.ops import OPS, no_grad_operands
from tfgraph.passes.liveness import Plan, Step, plan

RECOMPUTE = ("none", "selective", "full")
ZERO = sympy.Integer(0)

_NONZERO: dict[Any, bool] = {}
"""``expr != 0`` by expression: the layers repeat a few scratch sizes, and sympy's comparison
is slow next to a dict look-up."""


def _nonzero(expr: Any) -> bool:
    known = _NONZERO.get(expr)
    if known is None:
        known = bool(expr != ZERO)
        if len(_NONZERO) >= 4096:
            _NONZERO.clear()
        _NONZERO[expr] = known
    return known


Region = tuple[Any, ...]
LayerKey = tuple[str, int] | None


@dataclass(frozen=True)
class TrainPeak:
    """The largest live set of one training step's activations.

    ``bytes`` at the sizes asked for; ``node`` the op during whose ``phase`` ("forward",
    "recompute" or "backward") it happens; ``live`` the tensors live there (buffer names,
    saved tensor ids, ``grad:NAME`` gradients, ``NAME#scratch`` scratch) and ``expr`` their
    bytes in B, S, T. ``saved``: bytes kept for backward at the end of forward;
    ``backward_start``: those plus the logits' gradient, what is live once the loss's
    backward has written it (the figure a measured step checks)."""

    bytes: int
    node: str
    phase: str
    expr: sympy.Expr
    live: tuple[str, ...]
    saved: int
    backward_start: int


def check_recompute(recompute: str) -> None:
    """TfgraphError unless ``recompute`` is one of ``RECOMPUTE``."""
    if recompute not in RECOMPUTE:
        raise TfgraphError(f"recompute {recompute!r}: expected one of {', '.join(RECOMPUTE)}")


def loss_graph(graph: Graph) -> Graph | None:
    """The loss graph of ``graph``: itself when it has a loss node, else its spec lowered with
    ``loss=True`` (memoised on ``graph``); None for a graph without a spec (built by hand)."""
    if any(OPS[n.op].loss for n in graph.ops()):
        return graph
    spec = graph.spec
    if spec is None:
        return None

    def make() -> Graph:
        out = with_loss(graph)  # the graph with the loss appended, when that is all it takes
        if out is None:
            out = lower(spec, None, type(graph), loss=True)
        out.lint()
        return out

    return graph.memo("loss_graph", make)


def loss_node(graph: Graph) -> Node:
    """The graph's loss node (``OpDef.loss``: cross-entropy); TfgraphError when it has none."""
    for node in graph.ops():
        if OPS[node.op].loss:
            return node
    raise TfgraphError(f"{graph.name}: no loss node; compile it with loss=True")


@dataclass(frozen=True)
class _Saves:
    """What the forward keeps under one recompute choice."""

    kept: dict[str, list[tuple[str, sympy.Expr]]]
    """Per op node, the saved tensors it adds to the live set in the forward."""
    rebuilt: dict[str, list[tuple[str, sympy.Expr]]]
    """Per op node in a recomputed layer, the saved tensors its recomputation adds."""
    dropped: dict[str, sympy.Expr]
    """Per attention node, the score-sized bytes selective recompute rebuilds in backward."""
    release: dict[str, str]
    """Saved tensor id -> the op after whose backward it is freed (its first saver)."""


def _is_score_sized(node: Node, tensor: str) -> bool:
    """Whether saved ``tensor`` of ``node`` is one of the op's score-sized buffers."""
    return tensor.rpartition("#")[2] in OPS[node.op].score_sized and "#" in tensor


def _costs(graph: Graph) -> dict[str, cost.OpCost]:
    return graph.memo("op_costs_by_node", lambda: {c.node: c for c in cost.op_costs(graph)})


def _saves(graph: Graph, walk: Plan, recompute: str) -> _Saves:
    costs = _costs(graph)
    region = walk.region
    kept: dict[str, list[tuple[str, sympy.Expr]]] = {}
    rebuilt: dict[str, list[tuple[str, sympy.Expr]]] = {}
    dropped: dict[str, sympy.Expr] = {}
    release: dict[str, str] = {}
    started: set[Region] = set()
    for step in walk.steps:
        node = step.node
        saved = list(costs[node.name].saved)
        if recompute == "selective" and OPS[node.op].score_sized:
            scores = [(t, b) for t, b in saved if _is_score_sized(node, t)]
            if scores:
                dropped[node.name] = cost.total(b for _, b in scores)
                saved = [(t, b) for t, b in saved if not _is_score_sized(node, t)]
        key = region.get(node.name)
        if recompute == "full" and key is not None:
            rebuilt[node.name] = saved
            if key not in started:  # the layer's inputs, held from its first op
                started.add(key)
                kept[node.name] = [(i, graph.node(i).type.nbytes)
                                   for i in _region_inputs(graph, walk, key)]
            for tensor, _ in kept.get(node.name, []):
                release.setdefault(tensor, node.name)
            for tensor, _ in saved:  # rebuilt tensors die with their first saver's backward
                release.setdefault(f"{tensor}@{key}", node.name)
            continue
        kept[node.name] = saved
        for tensor, _ in saved:
            release.setdefault(tensor, node.name)
    return _Saves(kept, rebuilt, dropped, release)


def _region_inputs(graph: Graph, walk: Plan, key: Region) -> list[str]:
    """Values a layer reads from outside it (not parameters), in first-read order."""
    out: list[str] = []
    for step in walk.steps:
        if walk.region.get(step.node.name) != key:
            continue
        for i in step.node.inputs:
            if (walk.region.get(i) != key and not graph.node(i).is_param and i not in out):
                out.append(i)
    return out


def _grad_inputs(graph: Graph, node: Node) -> list[str]:
    """The operands ``node``'s backward writes a gradient for: floating activations it passes
    a gradient to (``ops.no_grad_operands``), none where no gradient reaches ``node``
    (``tfgraph.passes.gradients``: hard attention's q and k linears)."""
    if node.name not in gradients.reached(graph):
        return []
    skip = no_grad_operands(OPS[node.op], node.attrs)
    out = []
    for k, i in enumerate(node.inputs):
        src = graph.node(i)
        if k in skip or src.is_param or src.op == "input" or src.type.dtype == "int64":
            continue
        if i not in out:
            out.append(i)
    return out


# The holders of a live entry, as bits (an entry is freed when its last holder drops it).
BUF, SAVED, SCRATCH, GRAD = 1, 2, 4, 8


class _Live:
    """A live set: entries by key with their bytes expression, each held by one or more
    holders (a tensor saved and still needed forward is one buffer); running total in bytes."""

    def __init__(self, value: Callable[[sympy.Expr], int]) -> None:
        self.value = value
        self.entries: dict[str, sympy.Expr] = {}
        self.total = 0
        # per entry: [holder bits, when it joined (its place in ``entries``), its bytes]; one
        # record per entry, as add and drop run a few times per op of the step
        self._state: dict[str, list[int]] = {}
        self._joined = 0
        self._log: list[tuple[str, sympy.Expr, int | None]] = []
        """Entries that joined (seq None) or left (with their seq) since ``mark``."""

    def add(self, key: str, nbytes: sympy.Expr, holder: int) -> None:
        state = self._state.get(key)
        if state is None:
            self.entries[key] = nbytes
            self._log.append((key, nbytes, None))
            size = self.value(nbytes)
            self.total += size
            self._state[key] = [holder, self._joined, size]
            self._joined += 1
        else:
            state[0] |= holder

    def drop(self, key: str, holder: int) -> None:
        state = self._state.get(key)
        if state is None:
            return
        state[0] &= ~holder
        if state[0]:
            return
        del self._state[key]
        self._log.append((key, self.entries.pop(key), state[1]))
        self.total -= state[2]

    def held_by(self, key: str, holder: int) -> bool:
        """Whether ``holder`` holds entry ``key``."""
        state = self._state.get(key)
        return state is not None and bool(state[0] & holder)

    def mark(self) -> None:
        """Remember the entries as they are now (``at_mark`` gives them back later)."""
        self._log.clear()

    def at_mark(self) -> dict[str, sympy.Expr]:
        """The entries as they were at the last ``mark``, in the order they had then: the
        changes since are undone, newest first, instead of walking the step again."""
        entries = {k: (b, self._state[k][1]) for k, b in self.entries.items()}
        for key, nbytes, seq in reversed(self._log):
            if seq is None:
                del entries[key]
            else:
                entries[key] = (nbytes, seq)
        return {k: b for k, (b, _) in sorted(entries.items(), key=lambda kv: kv[1][1])}


Event = tuple[str, str]  # (phase, op node name)


def _events(graph: Graph, sizes: dict[sympy.Symbol, int], recompute: str,
            fused_attention: bool, live: _Live) -> Iterator[Event]:
    """Run the step, yielding after each event (an op's forward, recomputation or backward)
    with ``live`` as it is while that event runs."""
    walk = plan(graph, training=True)
    saves = _saves(graph, walk, recompute)
    costs = _costs(graph)
    released: dict[str, list[str]] = {}  # op -> saved tensors freed after its backward
    for tensor, op in saves.release.items():
        released.setdefault(op, []).append(tensor)

    def scratch(node: Node) -> sympy.Expr:
        if fused_attention and OPS[node.op].score_temp:
            return ZERO  # a fused kernel streams the scores
        if OPS[node.op].temp_saved:
            return ZERO  # its scratch is saved for backward: counted there
        return costs[node.name].temp

    for name in graph.inputs:
        live.add(name, graph.node(name).type.nbytes, BUF)
    yield from _forward(graph, walk, walk.steps, saves.kept, scratch, live, "forward")

    # backward: every activation gradient from its first consumer's to its producer's backward
    grads = graph.memo("grad_keys", lambda: _grad_keys(graph, walk))
    regions_done: set[Region] = set()
    add, drop, entries = live.add, live.drop, live.entries
    for step in reversed(walk.steps):
        node = step.node
        name = node.name
        if recompute == "full":
            key = walk.region.get(name)
            if key is not None and key not in regions_done:
                regions_done.add(key)  # entering the layer from its end: run its forward again
                steps = [s for s in walk.steps if walk.region.get(s.node.name) == key]
                rebuilt = {n: [(f"{t}@{key}", b) for t, b in v]
                           for n, v in saves.rebuilt.items()}
                yield from _forward(graph, walk, steps, rebuilt, scratch, live, "recompute",
                                    keep_outputs=False)
        extra: list[tuple[str, sympy.Expr]] = []
        back = ZERO
        opdef = OPS[node.op]
        if opdef.backward_temp is not None:
            back = opdef.backward_temp([graph.node(i).type for i in node.inputs], node.type,
                                       node.attrs)
        elif opdef.score_temp:  # the scores' gradient: a score matrix again
            back = scratch(node)
            dropped = saves.dropped.get(name)
            if dropped is not None:
                back = back + dropped
        if back is not ZERO and _nonzero(back):
            extra.append((f"{name}#scratch", back))
        own, inputs = grads[name]
        for grad, new, nbytes in inputs:
            if grad in entries:  # accumulated: the new gradient beside the old
                extra.append((new, nbytes))
            else:
                add(grad, nbytes, GRAD)
        for k, b in extra:
            add(k, b, SCRATCH)
        yield "backward", name
        for k, _ in extra:
            drop(k, SCRATCH)
        drop(own, GRAD)
        for tensor in released.get(name, ()):
            drop(tensor, SAVED)


def _grad_keys(graph: Graph, walk: Plan) -> dict[str, tuple[str, list[tuple[str, str, Any]]]]:
    """Per op node: the key of its output's gradient, and for each operand its backward
    writes a gradient for (``_grad_inputs``, produced by an op): the gradient's key, the key
    of a second one accumulated beside it, and their bytes."""
    producer = {s.node.name for s in walk.steps}
    return {s.node.name: (f"grad:{s.node.name}",
                          [(f"grad:{i}", f"grad:{i}#new", graph.node(i).type.nbytes)
                           for i in _grad_inputs(graph, s.node) if i in producer])
            for s in walk.steps}


def _forward(graph: Graph, walk: Plan, steps: Any, kept: dict[str, list[tuple[str, Any]]],
             scratch: Callable[[Node], sympy.Expr], live: _Live, phase: str,
             keep_outputs: bool = True) -> Iterator[Event]:
    """The forward over ``steps`` (all, or one layer's when recomputing it): each op's output
    joins the live set, then its saved tensors; buffers die at the plan's frees."""
    made: list[str] = []
    add, drop = live.add, live.drop
    step: Step
    for step in steps:
        node = step.node
        name = node.name
        add(name, node.type.nbytes, BUF)
        made.append(name)
        for tensor, nbytes in kept.get(name, ()):
            add(tensor, nbytes, SAVED)
        temp = scratch(node)
        if temp is not ZERO and _nonzero(temp):
            add(f"{name}#scratch", temp, SCRATCH)
            yield phase, name
            drop(f"{name}#scratch", SCRATCH)
        else:
            yield phase, name
        for buf in step.frees:
            drop(buf, BUF)
    if not keep_outputs:  # a recomputed layer's outputs are thrown away
        for name in made:
            live.drop(name, BUF)


def _value_of(sizes: dict[sympy.Symbol, int]) -> Callable[[sympy.Expr], int]:
    return cost.evaluator(sizes)


def train_peak(graph: Graph, sizes: dict[sympy.Symbol, int], recompute: str = "none",
               fused_attention: bool = False) -> TrainPeak:
    """The peak of one training step's activations over the loss graph ``graph`` at
    ``sizes`` (B, S, T), under ``recompute`` (see the module docstring)."""
    check_recompute(recompute)
    loss = loss_node(graph)
    value = _value_of(sizes)
    live = _Live(value)
    best, saved_end = -1, -1
    node = phase = ""
    for event_phase, event_node in _events(graph, sizes, recompute, fused_attention, live):
        if live.total > best:
            best, phase, node = live.total, event_phase, event_node
            live.mark()
        if event_phase == "backward" and saved_end < 0:  # the loss's backward comes first
            saved_end = sum(value(b) for key, b in live.entries.items()
                            if live.held_by(key, SAVED))
    entries = live.at_mark()
    logits = sum(value(graph.node(i).type.nbytes) for i in _grad_inputs(graph, loss))
    expr = cost.total(entries.values())
    return TrainPeak(best, node, phase, expr, tuple(entries), saved_end, saved_end + logits)


def saved_by_layer(graph: Graph, recompute: str = "none") -> dict[LayerKey, sympy.Expr]:
    """Bytes kept for backward at the end of the forward, by layer: ``(stack, index)`` for
    a layer (``plan.layer_region``), ``None`` for everything outside layers (embeddings,
    final norms, head, loss), as sympy expressions in B, S, T. A tensor saved by ops in
    several places counts once, where it is first saved (a layer's input, saved by its first
    norm, counts in that layer; the encoder output, saved by every cross-attention, in the
    first decoder layer). ``full``: a layer keeps only its inputs. Their sum is the saved
    bytes of the whole forward under that choice."""
    check_recompute(recompute)
    return graph.memo(f"saved_by_layer:{recompute}", lambda: _saved_by_layer(graph, recompute))


def _saved_by_layer(graph: Graph, recompute: str) -> dict[LayerKey, sympy.Expr]:
    walk = plan(graph, training=True)
    saves = _saves(graph, walk, recompute)
    seen: set[str] = set()
    terms: dict[LayerKey, list[sympy.Expr]] = {}
    for step in walk.steps:
        region = walk.region.get(step.node.name)
        key: LayerKey = None if region is None else (region[0], region[1])
        bucket = terms.setdefault(key, [])
        for tensor, nbytes in saves.kept.get(step.node.name, []):
            if tensor not in seen:
                seen.add(tensor)
                bucket.append(nbytes)
    return {k: cost.total(v) for k, v in terms.items()}
