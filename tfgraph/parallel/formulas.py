"""The plan's figures as formulas (``tfgraph plan``, the ``formulas`` entry): per-rank
activations and tensor-parallel bytes of a step as sympy expressions, like ``report``'s.

Built from the same per-unit expressions the planner evaluates (``tfgraph.parallel.units``, in
B and S, and an encoder-decoder's target length T: ``--tgt-seq``, default ``--seq``), for one pipeline
stage, identical units folded (``planner.stage_members``: a count times one unit's expression):
- ``per_rank.memory.activations`` (the most loaded stage):
  ``m * sum(count * (split / t + whole / w + replicated))`` with w = t under sequence
  parallelism, else 1 (Korthikanti et al. 2022 §4.2.2; replicated bytes are whole on every
  rank: ``units.Unit.saved``); selective recompute uses the units' selective bytes, full
  recompute keeps a layer's inputs only (``inputs / w``);
- ``step.comm_bytes.tp`` (the stage that sends most, the figure the planner reports):
  ``n * sum(count * 2 (t - 1) / t * (tp_forward + tp_backward + vocab_reduce))``: ring
  all-reduces (with sequence parallelism reduce-scatter + all-gather, the same volume;
  Korthikanti et al. 2022 §4.2.2) of every micro-batch; full recompute adds a layer's
  ``tp_forward`` once more (its rerun forward's all-reduces).

Symbols: B micro-batch, S sequence, t tensor-parallel ranks, m micro-batches the stage keeps in
flight (``layout.in_flight``; under 1F1B min(p - stage, micro-batches per step): the first stage
keeps p, Narayanan et al. 2021 §2.2; interleaved, Megatron-LM's warm-up), n micro-batches per data-parallel rank per step (``layout.microbatches``).

Rounding: the planner gives whole bytes per rank, ceil(split / t) and ceil(whole / w) per unit
(inputs under full recompute: floor), and sums ring bytes as floats truncated at the end; the
formula divides exactly. Evaluated at the layout's numbers it equals the planner's figure when
t divides every unit's bytes (the usual case: bytes are multiples of the hidden size), and
otherwise differs by less than ``2 m`` bytes per unit of the stage.

Precondition: ``layout.check(graph, layout)`` passed. Postcondition: the graph keeps one
memoised table of formula strings per (pipeline degree, stage, attention form, recompute,
sequence parallelism); nothing else changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import sympy

from tfgraph.graph.ir import SYMBOLS, Graph
from tfgraph.parallel.layout import Layout, in_flight
from tfgraph.parallel.units import Unit, units


class StageMembers(Protocol):
    """A stage's units folded (``planner.StageMembers``, which imports this module)."""

    @property
    def groups(self) -> tuple[tuple[int, int], ...]:
        """(a representative unit index, how many identical units)."""


def _sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True, integer=True)


B, S = SYMBOLS["B"], SYMBOLS["S"]
TP, IN_FLIGHT, MICROBATCHES = _sym("t"), _sym("m"), _sym("n")
MEANING: dict[str, str] = {
    "B": "micro-batch (sequences)",
    "S": "sequence length (--seq)",
    "T": "target length of an encoder-decoder (--tgt-seq, default --seq)",
    "t": "tensor-parallel ranks (--tp)",
    "m": "micro-batches the stage keeps in flight (1F1B: min(pp - stage, n); interleaved: "
         "Megatron-LM's warm-up, layout.in_flight)",
    "n": "micro-batches per data-parallel rank per step (global batch / (dp x B))",
}
ROUNDING = ("the planner rounds each unit's bytes per rank to whole bytes (ceil(x / t)); the "
            "formula divides exactly: equal when t divides every unit's bytes, else less than "
            "2 m bytes per unit of the stage apart")


def _in_bs(expr: sympy.Expr) -> sympy.Expr:
    """A unit expression in B, S (and an encoder-decoder's target length T)."""
    return sympy.sympify(expr)


def _kept(unit: Unit, attention: str, recompute: str, whole_div: sympy.Expr) -> sympy.Expr:
    """Bytes one micro-batch leaves on a rank for the unit's backward (planner._stage)."""
    if recompute == "full" and unit.is_layer:
        return _in_bs(unit.inputs) / whole_div
    split, whole, replicated = unit.saved[
        (attention, "selective" if recompute == "selective" else "none")]
    return _in_bs(split) / TP + _in_bs(whole) / whole_div + _in_bs(replicated)


def _tp_bytes(unit: Unit, recompute: str) -> sympy.Expr:
    """Bytes one micro-batch all-reduces across tensor-parallel ranks, before the ring factor
    (a layer's forward ones twice under full recompute, which reruns its forward)."""
    rerun = unit.tp_forward if recompute == "full" and unit.is_layer else 0
    return _in_bs(unit.tp_forward + unit.tp_backward + unit.vocab_reduce + rerun)


def activations_formula(graph: Graph, members: StageMembers, attention: str, recompute: str,
                        sp: bool) -> sympy.Expr:
    """Activation bytes of a stage's rank: m x the folded sum of its units' kept bytes."""
    all_units = units(graph)[0]
    whole_div = TP if sp else sympy.Integer(1)
    body = sympy.Add(*(count * _kept(all_units[i], attention, recompute, whole_div)
                       for i, count in members.groups))
    return IN_FLIGHT * sympy.expand(body)


def tp_comm_formula(graph: Graph, members: StageMembers, recompute: str = "none"
                    ) -> sympy.Expr:
    """Bytes a rank of the stage sends to its tensor-parallel group in a step."""
    all_units = units(graph)[0]
    body = sympy.expand(sympy.Add(*(count * _tp_bytes(all_units[i], recompute)
                                    for i, count in members.groups)))
    return 2 * MICROBATCHES * (TP - 1) / TP * body


def plan_formulas(graph: Graph, layout: Layout, attention: str,
                  folded: Sequence[StageMembers], stage: int, tp_stage: int) -> dict[str, Any]:
    """The plan dict's ``formulas`` (figure -> sympy string) and ``formula_symbols`` (each
    symbol's value in this layout and its meaning). ``folded`` is ``stage_members(graph,
    layout.pp)``; ``stage`` the most loaded stage, ``tp_stage`` the one sending most over
    tensor-parallel links (both given by the planner)."""
    table: dict[tuple[Any, ...], tuple[str, str, bool]] = graph.memo("parallel_formulas", dict)
    key = (layout.pp, layout.stage_layers, stage, tp_stage, attention, layout.recompute,
           layout.sp)
    if key not in table:
        exprs = (activations_formula(graph, folded[stage], attention, layout.recompute,
                                     layout.sp),
                 tp_comm_formula(graph, folded[tp_stage], layout.recompute))
        has_target = any(SYMBOLS["T"] in e.free_symbols for e in exprs)
        table[key] = (str(exprs[0]), str(exprs[1]), has_target)
    activations, tp, has_target = table[key]
    values = {"B": layout.micro_batch, "S": layout.seq, "T": layout.target, "t": layout.tp,
              "m": in_flight(layout, stage), "n": layout.microbatches}
    return {
        "formulas": {"per_rank.memory.activations": activations, "step.comm_bytes.tp": tp},
        "formula_symbols": {
            name: {"value": values[name], "meaning": MEANING[name]} for name in MEANING
            if name != "T" or has_target},
        "formula_notes": {
            "per_rank.memory.activations": f"stage {stage}; {ROUNDING}",
            "step.comm_bytes.tp": f"stage {tp_stage}; the planner truncates the step's total "
                                  "to whole bytes",
        },
    }
