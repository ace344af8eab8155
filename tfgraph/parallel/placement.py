"""Where each value of a graph lives under tensor parallelism: a forward propagation over the
graph from the parameters' splits (``tp_plan``), Megatron's scheme (Shoeybi et al. 2019, §3).

Placements: ``R`` the whole tensor on every tensor-parallel rank, ``S`` split across the ranks
along features (heads, hidden units, vocabulary: 1/t of it each), ``P`` a partial sum each rank
holds whole (after a rowwise projection), reduced at once: every ``P`` node is followed by an
all-reduce (a reduce-scatter with sequence parallelism), so its readers see ``R``.

Rules (inputs: the activation operands, parameters by their split):
- linear: R input, split weight -> S (colwise, vocab head); S input, rowwise weight -> P;
  R input, replicated weight -> R;
- embedding from a vocabulary-split table -> P (each rank looks up the ids it holds; Megatron's
  VocabParallelEmbedding); relative-bias table split by heads -> S;
- experts with hidden-split stacks on R tokens -> P;
- a per-head copy (``per_head``: latent attention's slices and key assembly) -> S on S
  operands, R on R ones; a ``shared`` operand (the rotary key) is R beside S heads;
- an op whose activation operands are all S (rope, attention, element-wise, a per-head norm:
  attrs ``heads``) -> S; all R -> R;
- anything else (a whole-width norm of a split tensor, R mixed with S) is refused, naming the
  node: it would need a gather the plan does not model;
- an op with ``tp_refused`` words (ALiBi, T5's relative position bias) is refused whatever its
  rule: ``parallelize`` and model.py have no tensor-parallel form of it, and the plan refuses
  what they refuse, in the same words (``parallelize`` raises this module's refusals).

The backward pass mirrors the forward (Megatron's f / g operators): where an R tensor enters a
split region (read by an op that makes S or P from it), its gradient is a partial sum and is
all-reduced once. ``Placement.forward_reduce`` and ``backward_reduce`` list those tensors.

Precondition: the graph lints; ``divisible.check_divisible`` passed. Postcondition: the graph is
unchanged; a ``Placement`` is returned.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import Graph, Node
from tfgraph.graph.ops import OPS
from tfgraph.parallel.tp_plan import tp_plan

R, S, P = "R", "S", "P"
_INDEX_DTYPES = ("int64", "int32", "bool")

# Each op's rule is its OpDef.tp (tfgraph.graph.ops.TpRule); ops over the vocabulary say where their
# output lives on split logits (OpDef.vocab_reduce: the loss whole, probabilities split).


@dataclass(frozen=True)
class Placement:
    """Per node: R, S or P (parameters: S when split across tensor-parallel ranks)."""

    of: dict[str, str]
    forward_reduce: tuple[str, ...]
    """Nodes whose output (P) is all-reduced in the forward pass."""
    vocab_reduce: tuple[str, ...]
    """Vocabulary ops on split logits: three floats per token all-reduced
    (``OpDef.vocab_reduce``)."""
    backward_reduce: dict[str, str]
    """R tensors entering a split region -> their first split reader: the tensor's gradient
    is all-reduced once in the backward pass (after that reader's backward)."""

    def split(self, name: str) -> bool:
        """Whether a rank holds 1/t of the node's value (S)."""
        return self.of[name] == S


def _refuse(node: Node, why: str) -> TfgraphError:
    return TfgraphError(f"tensor parallelism: {node.name} ({node.op}) {why}")


def _place(graph: Graph, node: Node, of: dict[str, str]) -> str:
    # token and position ids, labels and masks are whole on every rank
    acts = [of[i] for i in node.inputs if not graph.node(i).is_param
            and graph.node(i).type.dtype not in _INDEX_DTYPES]
    params = [of[i] for i in node.inputs if graph.node(i).is_param]
    split_param = S in params
    opdef = OPS[node.op]
    if opdef.tp == "refused" or opdef.tp_refused is not None:
        raise _refuse(node, f"has no tensor-parallel form ({opdef.tp_refused} is not split "
                            "across ranks)")
    if opdef.tp in ("project", "project_hidden"):
        x = acts[0]
        if not split_param:
            if x == S:
                raise _refuse(node, "reads a split tensor with a replicated weight")
            return R
        return P if x == S or opdef.tp == "project_hidden" else S
    if opdef.tp == "gather":
        return P if split_param else R
    if opdef.tp == "split_param":
        return S if split_param else R
    if opdef.tp == "per_head":
        return _per_head(node, acts)
    placed = set(acts)
    if opdef.vocab_reduce is not None and placed == {S}:
        return opdef.vocab_reduce
    if placed <= {R} and not split_param:
        return R
    if placed == {S} and (opdef.tp == "follows" or "heads" in node.attrs):
        return S
    if placed == {S}:
        raise _refuse(node, "normalises the whole width of a split tensor (a full-width "
                            "query/key norm: its statistics need every rank's part, a gather "
                            "per token that neither the plan nor parallelize does)")
    raise _refuse(node, f"mixes split and whole operands ({', '.join(sorted(placed))})")


def _per_head(node: Node, acts: list[str]) -> str:
    """A latent-attention copy (``TpRule`` ``per_head``): on the rank's heads when its head
    operand is split; the shared rotary key (head_concat's ``shared`` operand, one head every
    head repeats) whole on every rank, appended to each of the rank's heads."""
    heads = acts[:1] if node.attrs.get("shared", False) else acts
    if len(acts) == 2 and node.attrs.get("shared", False) and acts[1] != R:
        raise _refuse(node, "repeats a split shared head (the shared operand is whole on "
                            "every rank)")
    placed = set(heads)
    if placed == {R}:
        return R
    if placed != {S}:
        raise _refuse(node, f"mixes split and whole heads ({', '.join(sorted(placed))})")
    if node.attrs.get("groups", node.attrs.get("heads", 1)) == 1:
        raise _refuse(node, "takes channels of one group across a split tensor")
    return S


def place(graph: Graph) -> Placement:
    """Propagate the parameters' splits through ``graph`` (see the module docstring)."""
    plan = tp_plan(graph)
    of: dict[str, str] = {}
    for n in graph.nodes():
        if n.is_param:
            of[n.name] = S if plan[n.name].tp_dim is not None else R
        elif n.op == "input":
            of[n.name] = R
    forward: list[str] = []
    vocab: list[str] = []
    entering: dict[str, str] = {}
    for node in graph.ops():
        # a P operand was reduced right after its producer: its readers see R
        seen = {i: (R if of[i] == P else of[i]) for i in node.inputs}
        out = _place(graph, node, seen)
        of[node.name] = out
        if out == P:
            forward.append(node.name)
        if OPS[node.op].vocab_reduce is not None and S in seen.values():
            vocab.append(node.name)
        if out in (S, P):
            for i in node.inputs:
                src = graph.node(i)
                if not src.is_param and src.op != "input" and seen[i] == R \
                        and src.type.dtype not in _INDEX_DTYPES:
                    entering.setdefault(i, node.name)
    return Placement(of, tuple(forward), tuple(vocab), entering)
