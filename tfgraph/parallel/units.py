"""The graph cut into pipeline units (each layer; the parts before, between and after the
layers) with every per-op cost sorted by how tensor parallelism divides it: the inputs of the
planner (``tfgraph.parallel.planner``).

For each unit, from ``tfgraph.passes.cost.op_costs`` and the placement (``tfgraph.parallel.placement``):
- ``params``: the parameters its ops read (a tied table is in both units that read it, as
  Megatron keeps a copy of the shared embedding on the first and the last stage);
- ``saved``: bytes kept for backward, per attention form and recompute choice, as
  (split, whole, replicated): split tensors are 1/t per rank; whole ones are 1/t only with
  sequence parallelism (the rank's rows); replicated ones are whole on every rank with
  sequence parallelism too: the token ids and labels, and what a step reading the
  all-gathered sequence keeps without a feature split (a router's scores, routed experts'
  tokens). Which is which under sequence parallelism is the
  module's own rule (``tfgraph.parallel.sequence_plan``). Each tensor once per unit (the
  attention output is also the output projection's input);
- ``flops``: (split, whole, replicated) forward FLOPs, by the rule the saved bytes follow
  (``flops_kind``): split work is 1/t per rank (an op on split data: a split projection, the
  attention of a rank's heads, the loss over vocabulary-split logits), whole work is done by
  every rank under tensor parallelism alone and 1/t of it (the rank's rows) under sequence
  parallelism, replicated work is done whole by every rank under sequence parallelism too
  (a step reading the all-gathered sequence: a router); and the attention core's (recomputed
  by selective recompute);
- communication: bytes of the forward all-reduces (P outputs), the backward all-reduces (R
  tensors entering a split region), the vocabulary reductions and the MoE token exchange.

Every figure is a sympy expression in B, S, T: the planner evaluates units once per
(micro-batch, length), so a search over thousands of layouts does arithmetic only.

Precondition: the graph lints. Postcondition: the graph is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import sympy

from tfgraph.passes import cost, gradients
from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import DTYPE_BYTES, Graph, Node
from tfgraph.graph.ops import OPS
from tfgraph.parallel.placement import Placement, place
from tfgraph.parallel.sequence_plan import SequencePlan, sequence_parallel_plan

ZERO = sympy.Integer(0)
STATS_BYTES = 4  # a float32 log-sum-exp per query row (tfgraph.graph.ops)
VOCAB_REDUCE_FLOATS = 3  # max, sum of exponentials, the label's logit (Megatron, loss-parallel)
# Attention forms and recompute choices the saved bytes are given for.
FORMS = ("fused", "unfused")
# An op's own scratch that stays whole on every tensor-parallel rank although the op works on
# split data. Experts split on their hidden units (Megatron-LM's expert tensor parallelism):
# each rank gathers every routed token at full width, and its partial output, the routing
# weight's product and the routing indices are full width too; only the hidden buffers are
# 1/t. Cross-entropy of vocabulary-split logits: the log-probabilities are split, the mean's
# 0-d total weight is one float on every rank. Under sequence parallelism both ops still run
# on the whole sequence (the experts on the all-gathered stream, as Megatron-LM's token
# dispatcher for expert tensor parallelism all-gathers it; the loss on every token's logits),
# so this scratch stays whole on every rank (``_kept_as``: "replicated"). Each op names it in
# its ``OpDef.whole_scratch``.


@dataclass
class Unit:
    """One pipeline unit: a layer (``key`` (stack, index)) or the ops outside layers between
    them (``key`` ("outside", n))."""

    key: tuple[Any, ...]
    ops: list[str] = field(default_factory=list)
    params: list[str] = field(default_factory=list)
    saved: dict[tuple[str, str], tuple[sympy.Expr, sympy.Expr, sympy.Expr]] = field(
        default_factory=dict)
    """(form, recompute "none" | "selective") -> (split, whole, replicated bytes)."""
    inputs: sympy.Expr = ZERO
    """Bytes of the activations the unit reads from before it: what full recompute keeps and
    what a pipeline stage boundary sends."""
    flops_split: sympy.Expr = ZERO
    flops_whole: sympy.Expr = ZERO
    flops_replicated: sympy.Expr = ZERO
    """Forward FLOPs whole on every rank under sequence parallelism too (``flops_kind``);
    ``flops_whole`` is divided by t under sequence parallelism, this never."""
    backward_less: tuple[sympy.Expr, sympy.Expr, sympy.Expr] = (ZERO, ZERO, ZERO)
    """(split, whole, replicated) FLOPs of 2 x forward its backward does not do: gradients no
    path to the loss asks for (``tfgraph.passes.gradients``: hard attention's q and k)."""
    attention_flops: sympy.Expr = ZERO
    """Forward FLOPs of the attention cores (``OpDef.score_sized``: what selective recompute
    runs again; split by heads under tensor parallelism)."""
    tp_forward: sympy.Expr = ZERO
    tp_backward: sympy.Expr = ZERO
    vocab_reduce: sympy.Expr = ZERO
    a2a: sympy.Expr = ZERO
    """Bytes of tokens one MoE exchange moves (dispatch; combine is the same again)."""
    output_grad: sympy.Expr = ZERO
    """Bytes of the logits' gradient when the unit computes the loss (alive at the start of
    backward), else 0."""
    output_grad_split: bool = False
    """Whether those logits are split by vocabulary across tensor-parallel ranks."""

    @property
    def is_layer(self) -> bool:
        return self.key[0] != "outside"


def _saved_entries(graph: Graph, node: Node, form: str, recompute: str
                   ) -> list[tuple[tuple[str, str], sympy.Expr]]:
    """What an op keeps: the op table's entries (for attention a fused kernel's: q, k, v,
    output, log-sum-exp; or the explicit form where no kernel exists); in the ``unfused``
    form an op's ``OpDef.unfused_saved`` (explicit softmax attention: Korthikanti et al.
    2022 §4.1); selective recompute drops the score-sized tensors (``OpDef.score_sized``,
    recomputed from q, k, v)."""
    opdef = OPS[node.op]
    ins = [graph.node(i).type for i in node.inputs]
    keep = opdef.unfused_saved if form == "unfused" and opdef.unfused_saved else opdef.saved
    entries = keep(ins, node.type, node.attrs)
    if recompute == "selective" and opdef.score_sized:
        entries = [(ref, b) for ref, b in entries
                   if ref[0] != "tmp" or ref[1] not in opdef.score_sized]
    return entries


def _resolve(graph: Graph, node: Node, ref: tuple[Any, ...]) -> str | None:
    """The tensor a saved entry names (None for a parameter, which is not an activation)."""
    if ref[0] == "in":
        src = node.inputs[ref[1]]
        return None if graph.node(src).is_param else src
    if ref[0] == "out":
        return node.name
    return f"{node.name}#{ref[1]}"


def _split(graph: Graph, tensor: str, placement: Placement | None) -> bool:
    """Whether a rank keeps 1/t of a saved tensor: a split value; an op's own scratch when
    the op works on split data (the experts' hidden units, the log-softmax of split logits,
    attention's log-sum-exp), but for the scratch its ``OpDef.whole_scratch`` names."""
    if placement is None:
        return False
    owner, _, scratch = tensor.partition("#")
    if not scratch:
        return placement.of[owner] == "S"
    node = graph.node(owner)
    if scratch in OPS[node.op].whole_scratch:
        return False
    return placement.of[owner] in ("S", "P") or any(
        placement.of[i] == "S" for i in node.inputs if not graph.node(i).is_param)


def _kept_as(graph: Graph, node: Node, ref: tuple[Any, ...], tensor: str,
             placement: Placement | None, sequence: SequencePlan | None) -> str:
    """How a rank keeps ``tensor``, saved by ``node`` as ``ref``: "split" (1/t, split by
    features: ``_split``), "whole" (whole under tensor parallelism alone, the rank's rows
    under sequence parallelism: a value the sequence plan holds as rows, an operand an
    element-wise step on rows reads (cut to the rank's rows first), the scratch of a step on
    rows) or "replicated" (whole on every rank under sequence parallelism too: token ids,
    labels, and the values and scratch of steps on the all-gathered sequence that are not
    split by features). Without a sequence plan (``sequence`` None) nothing is
    replicated."""
    if _split(graph, tensor, placement):
        return "split"
    if sequence is None:
        return "whole"
    owner, _, scratch = tensor.partition("#")
    if scratch:
        rows = owner in sequence.sharded
    else:
        rows = tensor in sequence.sharded or (
            ref[0] == "in" and sequence.kind.get(node.name) == "elementwise")
    return "whole" if rows else "replicated"


def flops_kind(graph: Graph, node: Node, placement: Placement | None,
               sequence: SequencePlan | None) -> str:
    """How a rank does ``node``'s work, by the rule its saved output and scratch follow
    (``_kept_as``): "split" (1/t each: the op works on split data, ``_split`` of its own
    output or scratch), "whole" (every rank under tensor parallelism alone, the rank's rows
    under sequence parallelism: a step on rows, ``SequencePlan.sharded``) or "replicated"
    (whole on every rank under sequence parallelism too: a step on the all-gathered
    sequence, and what follows it outside the sharded region). Without a sequence plan
    nothing is replicated."""
    if placement is not None and (placement.of[node.name] in ("S", "P") or any(
            placement.of[i] == "S" for i in node.inputs if not graph.node(i).is_param)):
        return "split"
    if sequence is None or node.name in sequence.sharded:
        return "whole"
    return "replicated"


def _saved(graph: Graph, unit_ops: list[Node], placement: Placement | None,
           sequence: SequencePlan | None, form: str, recompute: str, counted: set[str]
           ) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """(split, whole, replicated) bytes the unit keeps (``_kept_as``); a tensor an earlier
    unit keeps (``counted``: the encoder output every cross-attention reads) is not counted
    again."""
    kept: dict[str, tuple[sympy.Expr, str]] = {}
    for node in unit_ops:
        for ref, nbytes in _saved_entries(graph, node, form, recompute):
            tensor = _resolve(graph, node, ref)
            if tensor is not None and tensor not in counted and tensor not in kept:
                kept[tensor] = (nbytes, _kept_as(graph, node, ref, tensor, placement,
                                                 sequence))
    counted.update(kept)
    split, whole, replicated = (cost.total(b for b, how in kept.values() if how == kind)
                                for kind in ("split", "whole", "replicated"))
    return split, whole, replicated


def _unit_keys(graph: Graph) -> dict[str, tuple[Any, ...]]:
    """Unit of every op: its layer, or the stretch of non-layer ops it sits in."""
    out: dict[str, tuple[Any, ...]] = {}
    stretch = 0
    previous_in_layer = False
    for node in graph.ops():
        m = node.meta
        if m.layer is not None:
            out[node.name] = (m.stack, m.layer)
            previous_in_layer = True
        else:
            if previous_in_layer:
                stretch += 1
                previous_in_layer = False
            out[node.name] = ("outside", stretch)
    return out


def _bytes(graph: Graph, names: Iterable[str]) -> sympy.Expr:
    return cost.total(graph.node(n).type.nbytes for n in names)


def sequence_plan(graph: Graph) -> tuple[SequencePlan | None, str | None]:
    """The graph's sequence-parallel plan (``sequence_parallel_plan``), or None and the
    reason sequence parallelism cannot run it (memoised)."""
    def make() -> tuple[SequencePlan | None, str | None]:
        try:
            return sequence_parallel_plan(graph), None
        except TfgraphError as e:
            return None, str(e)
    found: tuple[SequencePlan | None, str | None] = graph.memo("parallel_sequence", make)
    return found


def units(graph: Graph) -> tuple[list[Unit], Placement | None, str | None]:
    """The graph's units in execution order, the tensor-parallel placement (None where the
    graph cannot be split: the reason is the third item)."""
    return graph.memo("parallel_units", lambda: _units(graph))


def _units(graph: Graph) -> tuple[list[Unit], Placement | None, str | None]:
    try:
        placement: Placement | None = place(graph)
        refusal = None
    except TfgraphError as e:
        placement, refusal = None, str(e)
    sequence = sequence_plan(graph)[0]
    keys = _unit_keys(graph)
    by_key: dict[tuple[Any, ...], Unit] = {}
    for node in graph.ops():
        by_key.setdefault(keys[node.name], Unit(keys[node.name])).ops.append(node.name)
    costs = {c.node: c for c in cost.op_costs(graph)}
    savings = {c.node: m + o for c, m, o in gradients.backward_savings(graph)}
    forward = set(placement.forward_reduce) if placement else set()
    backward = placement.backward_reduce if placement else {}
    vocab = set(placement.vocab_reduce) if placement else set()
    # Backward reductions grouped by the op that reads them: looking them up per unit would
    # scan every reduction of the graph for every unit (quadratic in the layers).
    backward_by_reader: dict[str, list[str]] = {}
    for tensor, reader in backward.items():
        backward_by_reader.setdefault(reader, []).append(tensor)
    out = list(by_key.values())
    counted: dict[tuple[str, str], set[str]] = {(f, r): set() for f in FORMS
                                                 for r in ("none", "selective")}
    for unit in out:
        nodes = [graph.node(n) for n in unit.ops]
        members = set(unit.ops)
        params: dict[str, None] = {}
        inputs: dict[str, None] = {}
        for node in nodes:
            for i in node.inputs:
                src = graph.node(i)
                if src.is_param:
                    params[i] = None
                elif i not in members and src.type.dtype not in ("int64", "int32", "bool"):
                    inputs[i] = None
        unit.params = list(params)
        unit.inputs = _bytes(graph, inputs)
        for form in FORMS:
            for recompute in ("none", "selective"):
                unit.saved[(form, recompute)] = _saved(graph, nodes, placement, sequence, form,
                                                       recompute, counted[(form, recompute)])
        by_kind: dict[str, list[sympy.Expr]] = {"split": [], "whole": [], "replicated": []}
        less: dict[str, list[sympy.Expr]] = {"split": [], "whole": [], "replicated": []}
        attention: list[sympy.Expr] = []
        for node in nodes:
            c = costs[node.name]
            flops = c.matmul + c.other
            kind = flops_kind(graph, node, placement, sequence)
            by_kind[kind].append(flops)
            if node.name in savings:
                less[kind].append(savings[node.name])
            opdef = OPS[node.op]
            if opdef.score_sized:  # what selective recomputation runs again
                attention.append(flops)
            if opdef.routed:  # expert parallelism sends each token to its top k
                x = graph.node(node.inputs[0]).type
                unit.a2a += x.nbytes * node.attrs["top_k"]
            if opdef.loss:
                unit.output_grad += graph.node(node.inputs[0]).type.nbytes
                unit.output_grad_split = _split(graph, node.inputs[0], placement)
        unit.flops_split, unit.flops_whole, unit.flops_replicated = (
            cost.total(by_kind[k]) for k in ("split", "whole", "replicated"))
        split, whole, replicated = (cost.total(less[k]) for k in ("split", "whole", "replicated"))
        unit.backward_less = (split, whole, replicated)
        unit.attention_flops = cost.total(attention)
        unit.tp_forward = _bytes(graph, (n for n in unit.ops if n in forward))
        unit.tp_backward = _bytes(graph, (t for n in unit.ops
                                          for t in backward_by_reader.get(n, ())))
        unit.vocab_reduce = cost.total(
            VOCAB_REDUCE_FLOATS * STATS_BYTES * _rows(graph.node(graph.node(n).inputs[0]))
            for n in unit.ops if n in vocab)
    return out, placement, refusal


def _rows(node: Node) -> sympy.Expr:
    """Tokens a vocabulary op reduces over: every axis of its logits operand but the last."""
    return sympy.Mul(*node.type.shape[:-1]) if node.type.shape else sympy.Integer(1)


def dtype_bytes(graph: Graph) -> int:
    return DTYPE_BYTES[graph.dtype]
