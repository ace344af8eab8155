"""Op definitions: one table entry per op with its meaning and its costs (tinygrad-style data).

Each ``OpDef`` gives
- ``infer``: the output ``TensorType`` from the input types and attributes (symbolic shapes);
- ``flops``: ``(matmul, other)`` FLOPs. ``matmul`` counts 2 per multiply-accumulate of every
  matrix product (README, `tfgraph report`), which is what ``FlopCounterMode`` counts; ``other`` counts the
  element-wise work with the per-element constants below;
- ``saved``: what the op keeps for its backward pass, as ``(tensor, bytes)`` pairs where tensor
  is ``("in", i)`` (an input, shared with other ops that save it), ``("out",)`` or
  ``("tmp", label)`` (a buffer of the op's own); parameters are never counted;
- ``temp``: bytes of scratch the op holds while it runs (the materialised attention scores);
- ``category``: what kind of op it is (``CATEGORIES``), read by reports, diagrams and the
  parameter breakdown instead of lists of op names;
- ``aliases_input``: the op is the identity at inference, so its output is its input's buffer
  (dropout); the liveness plan (``tfgraph.passes.liveness``) follows the alias;
- ``commutative``: either operand may be the one a back end overwrites in place.
- ``dense_flops``: for mixture-of-experts ops, the FLOPs when every expert runs on every
  token (the ONNX form), next to ``flops``, the top-k count (``tfgraph.graph.ops_moe``);
- ``attrs``: the attributes the op takes (``Attr``: type, required or a default);
  ``Graph.add`` refuses an undeclared, mistyped or missing required one;
- how it runs under tensor and sequence parallelism (``tp``, ``tp_split_param``,
  ``vocab_reduce``, ``tp_refused``, ``tp_refused_source``, ``whole_scratch``, ``sequence``);
- what a training step does with it (``shape_only``, ``no_grad`` and ``grad_blocked``
  operands, ``backward_flops``, ``score_sized`` saved buffers,
  ``unfused_saved``, ``backward_temp``, ``loss``);
- what the accounting passes need to know of it (``score_temp``, ``score_flops``,
  ``kv_cached``, ``routed``);
- ``score_bias``, ``diagram_text``, ``title`` and ``gated_title``: how diagrams describe it.

Every fact about an op lives here, in its ``OpDef``; a back end keeps only its own row per op
(``TORCH_OPS``, ``TORCH_INPLACE``, ``TORCH_SOURCE``, ``ONNX_OPS``, ``DIAGRAM_OPS``).
``tests/test_op_tables.py``
asserts both: each back-end table covers every op, and no other op-keyed table exists.

Back ends register a lowering per op name (``exporters``); a test asserts none is missing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

import sympy

from tfgraph.graph.tensor import DTYPE_BYTES, TensorType

# ---- per-element FLOP constants of the "other" count (stated in every report) -------------
# Chosen as the arithmetic a straightforward kernel performs per element; they are conventions,
# not measurements, and the report prints them next to the totals.
FLOPS_PER_ELEMENT: dict[str, int] = {
    "add": 1,  # residual add, position add, bias add, scale multiply, gate multiply
    "relu": 1,  # max(x, 0)
    "relu2": 2,  # max(x, 0) then its square (Nemotron's squared ReLU)
    "gelu": 8,  # x * 0.5 * (1 + erf(x / sqrt 2)): erf as a short polynomial
    "gelu_tanh": 8,  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    "silu": 4,  # x * sigmoid(x): exp, add, divide, multiply
    "softmax": 5,  # max, subtract, exp, sum, divide (per score or logit)
    "hardmax": 2,  # arg-max compare, one-hot write ("hard attention": one-hot of the arg-max)
    "layernorm": 8,  # mean, subtract, square, variance sum, rsqrt-multiply, gain, bias, (eps)
    "rmsnorm": 5,  # square, sum, rsqrt-multiply, gain, (eps)
    "scalenorm": 5,  # square, sum, sqrt-divide, gain, (eps)
    "rope": 3,  # x*cos + rotate_half(x)*sin: two multiplies and one add
    "mask": 1,  # causal mask add per score
    "softcap": 3,  # cap * tanh(x / cap): divide, tanh, multiply (Gemma 2)
    "clip": 2,  # min(max(x, -c), c): two compares (MPT's and OLMo 1's clip_qkv)
}

Flops = tuple[sympy.Expr, sympy.Expr]
Saved = list[tuple[tuple[Any, ...], sympy.Expr]]
ZERO = sympy.Integer(0)
STATS_BYTES = DTYPE_BYTES["float32"]  # norms keep their per-row statistics in float32


# What an op is, for everything that groups ops (diagrams, the parameter breakdown, reports).
CATEGORIES = ("embedding", "position", "linear", "attention", "norm", "activation",
              "elementwise", "dropout", "output")


TpRule = Literal["follows", "whole", "project", "project_hidden", "gather", "split_param",
                 "per_head", "refused"]
"""How an op's output is placed under tensor parallelism (``tfgraph.parallel.placement``):

- ``follows``: split like its split operands (per head or per element); whole when they are;
- ``whole``: whole operands only (a split one is refused: a whole-width norm, routing, ...),
  unless the node normalises per head (attrs ``heads``), which follows;
- ``project``: a linear map x W^T (+ b) by its weight (operand 1, [out, in]; bias operand 2),
  placed by the weight's split: whole input and colwise weight -> split, split input and
  rowwise weight -> partial sums, replicated weight -> whole (back ends find a linear map's
  weight, and a sequence shard's projections, by this rule);
- ``project_hidden``: split on its hidden units (stacked experts): partial sums;
- ``gather``: a lookup in a token table (operand 0, (V, d)), vocabulary-split: partial sums
  (Megatron's VocabParallelEmbedding; back ends find token tables by this rule);
- ``split_param``: computed from a parameter split by heads (``tp_split_param``): split;
- ``per_head``: a copy per head (latent attention's channel slices and key assembly,
  attrs ``groups`` or ``heads``): split when its operand is split by heads (each rank's
  heads), whole when it is whole; a ``shared`` operand (one head every head repeats: the
  rotary key) is whole on every rank beside split heads; a one-group slice of a split tensor
  is refused;
- ``refused``: no tensor-parallel form: the plan refuses the layout, naming the op and its
  ``tp_refused`` words (as ``parallelize`` and model.py do).
"""

SequenceRule = Literal["elementwise", "positions", "norm", "gathered"]
"""How an op runs on a sequence shard (``tfgraph.parallel.sequence_plan``): ``elementwise``
token by token on the last axis (the rank's rows of the whole result), ``positions`` adds the
rank's positions, ``norm`` a whole-width norm with parameters (``SequenceParallel`` on its
owner), ``gathered`` on all-gathered inputs (embeddings and linear maps are decided by their
parameters' splits)."""


@dataclass(frozen=True)
class Attr:
    """One attribute an op takes: the Python type(s) its value has, and whether a node must
    give it (``required``) or what an absent one means (``default``, documentation only: back
    ends read ``attrs.get(key, default)`` as today)."""

    type: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    doc: str = ""


SIZE = (int, sympy.Expr)
"""Sizes: ints, or sympy expressions in the symbolic twins ``tfgraph.passes.formulas`` lowers."""
REAL = (int, float)
"""Real numbers (a YAML value may be an int where a float is meant)."""


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: tuple[int, int]
    infer: Callable[[list[TensorType], dict[str, Any]], TensorType]
    flops: Callable[[list[TensorType], TensorType, dict[str, Any]], Flops]
    saved: Callable[[list[TensorType], TensorType, dict[str, Any]], Saved]
    doc: str
    temp: Callable[[list[TensorType], TensorType, dict[str, Any]], sympy.Expr] = (
        lambda ins, out, attrs: ZERO
    )
    category: str = "elementwise"
    aliases_input: bool = False
    commutative: bool = False
    dense_flops: Callable[[list[TensorType], TensorType, dict[str, Any]], Flops] | None = None
    """FLOPs of the form that computes every routed expert for every token (what the ONNX
    back end runs for ``experts``), when it differs from ``flops`` (the ideal, top-k form)."""
    attrs: Mapping[str, Attr] = dataclasses.field(default_factory=dict)
    """The attributes a node of this op may carry (``Graph.add`` checks them)."""
    tp: TpRule = "whole"
    """How its output is placed under tensor parallelism (``TpRule``)."""
    tp_split_param: tuple[int, int] | None = None
    """(operand, dimension) of a parameter operand split by heads across tensor-parallel ranks
    (each rank keeps its heads' slice: the ``heads`` style of ``tfgraph.parallel.tp_plan``)."""
    vocab_reduce: Literal["R", "S"] | None = None
    """For ops over the vocabulary (last axis): on vocabulary-split logits each rank reduces
    its share and the ranks all-reduce three numbers per token (max, sum of exponentials, the
    label's logit: Megatron's vocab-parallel cross-entropy); the output is then whole ("R",
    the loss) or split ("S", the probabilities)."""
    tp_refused: str | None = None
    """What the op is, in the words ``parallelize`` and model.py's ``check_tp`` refuse tensor
    parallelism with ("tensor parallelism of X is not supported", "X is not split")."""
    tp_refused_source: str | None = None
    """Why model.py's own ``parallelize`` refuses tensor parallelism for the op although
    ``tfgraph.exporters.parallelize`` runs it."""
    whole_scratch: tuple[str, ...] = ()
    """Labels of the op's own saved scratch that stays whole on every tensor-parallel rank
    although the op works on split data (``tfgraph.parallel.units``)."""
    sequence: SequenceRule = "gathered"
    """How it runs on a sequence shard (``SequenceRule``)."""
    shape_only: tuple[int, ...] = ()
    """Operands the op reads only for their shape: no gradient flows back to them
    (``tfgraph.passes.train_walk``)."""
    no_grad: tuple[int, ...] = ()
    """Operands the op reads for a choice, not a differentiable value: no gradient flows back
    to them (the correction bias of ``route`` only shifts which experts top-k selects). A
    parameter no gradient reaches through the operands that pass one keeps no gradient and
    no optimizer state (``tfgraph.passes.gradients.frozen_params``, ``tfgraph.passes.gradients``)."""
    grad_blocked: Callable[[dict[str, Any]], tuple[int, ...]] | None = None
    """Operands no gradient flows back to for a node with these attributes, beside
    ``shape_only`` and ``no_grad`` (hard attention: the arg-max passes none to q, k and a score
    bias). Which values a gradient reaches is a reachability over the graph through the
    operands that pass one (``tfgraph.passes.gradients``, ``no_grad_operands``)."""
    backward_flops: Callable[[list[TensorType], TensorType, dict[str, Any], tuple[bool, ...]],
                             Flops] | None = None
    """Backward ``(matmul, other)`` FLOPs when only the operands flagged True get a gradient
    (one flag per operand; used where some operand gets none). None: 2 x ``flops`` whenever
    some operand gets one, 0 when none does (``tfgraph.passes.gradients``)."""
    score_sized: tuple[str, ...] = ()
    """Labels of its saved buffers that hold one value per attention score: what selective
    recomputation drops and rebuilds in backward by running the op again
    (``tfgraph.passes.train_walk``; the planner counts its FLOPs again,
    ``tfgraph.parallel.units``)."""
    unfused_saved: Callable[[list[TensorType], TensorType, dict[str, Any]], Saved] | None = None
    """What it keeps for backward computed by explicit matmuls, where ``saved`` is what a
    fused kernel keeps: the planner's ``unfused`` form (``tfgraph.parallel.units``)."""
    backward_temp: Callable[[list[TensorType], TensorType, dict[str, Any]], sympy.Expr] | None = None
    """Bytes its backward holds besides its saved tensors and its operands' gradients, from
    its operands' types, output type and attributes (``tfgraph.passes.train_walk``)."""
    loss: bool = False
    """It is the training loss: the scalar the backward starts from
    (``train_walk.loss_node``); the gradient of its first operand (the logits) is what the
    planner holds as the step's output gradient (``tfgraph.parallel.units``)."""
    score_temp: bool = False
    """Its ``temp`` is the materialised attention score matrix: a fused kernel (the
    ``fused_attention`` option of reports) streams it, holding no scratch, and backward
    holds it again for the scores' gradient (``tfgraph.passes.cost``,
    ``tfgraph.passes.train_walk``)."""
    fused_temp: Callable[[list[TensorType], TensorType, dict[str, Any]], sympy.Expr] | None = None
    """With ``score_temp``: the scratch the fused kernel holds instead of the scores, beside
    its operands and output, at inference (``tfgraph.passes.cost.activation_peak``); None:
    none. With autograd those buffers are saved for backward (``saved``)."""
    temp_saved: bool = False
    """Its ``temp`` is what its forward holds without autograd: with autograd those buffers
    are saved for backward (``saved``) or freed before its saves are all made, so a training
    forward holds no scratch beyond them (``tfgraph.passes.train_walk``)."""
    score_flops: bool = False
    """Its FLOPs are per attention score of q (operand 0, (B, Tq, ..)) against k (operand 1,
    (B, Tk, ..)) under attrs causal and window (``attended_scores``): reports count them as
    ``attention_scores`` work, and the effective figures leave out the scores a query does
    not read (``tfgraph.passes.figures``, ``tfgraph.passes.effective``)."""
    kv_cached: bool = False
    """In a decoder its k and v operands (1, 2) are what a KV cache keeps for decoding: the
    last attrs['window'] positions with a sliding window, attrs['latent'] values per token
    with latent attention (``tfgraph.passes.cost.kv_cache``)."""
    routed: bool = False
    """Mixture of experts: x (operand 0), routing weights (.., E) (operand 1) and
    expert-stacked weights (E, ..) (operands 2..), each token through attrs['top_k'] of the
    E experts (``cost.inactive_params``; expert parallelism's all-to-all of the routed
    tokens and its expert count, ``tfgraph.parallel``)."""
    score_bias: bool = False
    """Its output is a per-head bias on the attention scores (heads, Tq, Tk), not an embedding
    added to the residual stream (diagrams describe it so)."""
    diagram_text: Callable[[dict[str, Any]], str] | None = None
    """The words a diagram's embedding box gives a position op, from its attributes."""
    title: str | None = None
    """The op's name as diagrams write it ("LayerNorm", "GELU (tanh)"); None: its op name."""
    gated_title: str | None = None
    """For an activation, the name of a feed-forward gated by it ("SwiGLU"; Shazeer 2020,
    "GLU Variants Improve Transformer"); None: "gated" and its title."""

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"op {self.name}: unknown category {self.category!r}")


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    OPS[op.name] = op
    return op


def no_grad_operands(opdef: OpDef, attrs: dict[str, Any]) -> tuple[int, ...]:
    """Operands a node of ``opdef`` with ``attrs`` passes no gradient back to: those read for
    their shape (``shape_only``), for a choice (``no_grad``) and those its attributes block
    (``grad_blocked``: hard attention's arg-max)."""
    blocked = opdef.grad_blocked(attrs) if opdef.grad_blocked is not None else ()
    return (*opdef.shape_only, *opdef.no_grad, *blocked)


def _rows(t: TensorType) -> sympy.Expr:
    """Number of vectors along the last axis (B*S for a (B, S, d) tensor)."""
    return sympy.Mul(*t.shape[:-1])


def _same(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    return ins[0]


def _no_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
    return ZERO, ZERO


def _nothing_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    return []


def _elementwise(kind: str) -> Callable[[list[TensorType], TensorType, dict[str, Any]], Flops]:
    def flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
        return ZERO, FLOPS_PER_ELEMENT[kind] * out.numel

    return flops


def _save_input(i: int) -> Callable[[list[TensorType], TensorType, dict[str, Any]], Saved]:
    def saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
        return [(("in", i), ins[i].nbytes)]

    return saved


def _save_output(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    return [(("out",), out.nbytes)]


def _check_last(x: TensorType, width: Any, what: str) -> None:
    # structural equality first: sizes are integers, or products of symbols in formula twins
    if x.shape[-1] != width and sympy.expand(x.shape[-1] - width) != 0:
        raise ValueError(f"{what}: last dim {x.shape[-1]} != {width}")


# ---- embeddings and positions -----------------------------------------------------------


def _embedding_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    table, ids = ins
    if ids.dtype != "int64" or len(table.shape) != 2:
        raise ValueError("embedding takes a (vocab, d) table and int64 ids")
    return TensorType((*ids.shape, table.shape[1]), table.dtype)


register(OpDef(
    "embedding", (2, 2), _embedding_infer, _no_flops, _save_input(1),
    "Gather rows of a token table: (V, d), (B, S) int64 -> (B, S, d). No FLOPs (a copy). "
    "With attrs['padding_idx'] the lookups of that id pass no gradient to its row (torch's "
    "padding_idx); the forward is the same.",
    category="embedding", tp="gather",
    attrs={"padding_idx": Attr(int, doc="the row the lookups pass no gradient to "
                                        "(embedding.pad_no_grad: tokens.pad)")},
))

register(OpDef(
    "scale", (1, 1), _same, _elementwise("add"), _nothing_saved,
    "x * attrs['factor'] (sqrt(d_model) on token embeddings, Vaswani et al. 2017 §3.4).",
    attrs={"factor": Attr((*REAL, sympy.Expr), required=True, doc="the multiplier")},
    tp="follows", sequence="elementwise",
))


def _sinusoid_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    if len(ins[0].shape) != 3:
        raise ValueError("positions are added to a (B, S, d) tensor")
    if attrs.get("layout", "interleaved") not in ("interleaved", "split"):
        raise ValueError(f"sinusoid layout {attrs['layout']!r}: interleaved or split")
    return ins[0]


register(OpDef(
    "positions_sinusoidal", (1, 2), _sinusoid_infer, _elementwise("add"), _nothing_saved,
    "x + PE[:S] with PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same) "
    "(Vaswani et al. 2017, section 3.5); with attrs['layout'] 'split' the sines fill the "
    "first ceil(d/2) channels and the cosines the rest (fairseq, Marian). The table is a "
    "constant, not a parameter. An optional second operand, position ids (B, S), gives "
    "each token's position instead of 0..S-1 (padding, KV cache).",
    category="position", sequence="positions",
    attrs={"layout": Attr(str, default="interleaved", doc="interleaved or split")},
    diagram_text=lambda attrs: "+ sinusoidal positions",
))


def _learned_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, table = ins[:2]
    _check_last(x, table.shape[1], "learned positions")
    offset = attrs.get("offset", 0)  # OPT, BART: 2
    rows_left = sympy.sympify(table.shape[0] - offset)  # symbolic in the formulas' twins
    if not isinstance(offset, int) or offset < 0 or rows_left.is_nonpositive:
        raise ValueError(f"learned positions: offset {offset} must be an int >= 0 below the "
                         f"table's {table.shape[0]} rows")
    return _sinusoid_infer([x], {})


def _learned_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    # Read through position ids, the rows are a gather that keeps its indices for the table's
    # gradient: the ids operand itself, or at an offset the shifted ids (offset + id) it
    # computes, a (B, S) buffer of its own. Read as rows 0..S-1, the slice keeps nothing.
    if len(ins) < 3:
        return []
    if attrs.get("offset", 0):
        return [(("tmp", "ids"), ins[2].nbytes)]
    return [(("in", 2), ins[2].nbytes)]


register(OpDef(
    "positions_learned", (2, 3), _learned_infer, _elementwise("add"), _learned_saved,
    "x + table[offset:offset+S] with a learned (max_len + offset, d) table; attrs['offset'] "
    "(OPT, BART: 2) is absent when 0. An optional third operand, position ids (B, S), reads "
    "table[offset + id] per token instead (padding, KV cache).",
    category="position", sequence="positions", whole_scratch=("ids",),
    attrs={"offset": Attr(int, default=0, doc="the table row of position 0")},
    diagram_text=lambda attrs: "+ learned positions",
))


def _pad_positions_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    ids = ins[0]
    if len(ids.shape) != 2 or ids.dtype != "int64":
        raise ValueError(f"position ids are computed from (B, S) int64 token ids, not {ids}")
    return ids


register(OpDef(
    "pad_position_ids", (1, 1), _pad_positions_infer, _no_flops, _nothing_saved,
    "Position ids (B, S) int64 from token ids (B, S) that skip padding (fairseq's "
    "make_positions, Hugging Face RoBERTa's create_position_ids_from_input_ids): a token "
    "other than attrs['pad'] gets the count of such tokens before it, a padding token -1 "
    "(with a learned table's offset it reads row offset - 1, RoBERTa's padding_idx). "
    "No FLOPs (integer index arithmetic, like the embedding gather).",
    category="position",
    attrs={"pad": Attr(int, required=True, doc="the padding token id")},
))


def _rope_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    _check_last(ins[0], attrs["heads"] * attrs["head_dim"], "rope")
    return ins[0]


def _rope_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
    # Only the rotated channels are computed; the rest of each head passes through (a copy).
    rotated = attrs.get("rotary_dim", attrs["head_dim"])
    return ZERO, FLOPS_PER_ELEMENT["rope"] * _rows(out) * attrs["heads"] * rotated


register(OpDef(
    "rope", (1, 2), _rope_infer, _rope_flops, _nothing_saved,
    "Rotary positions on (B, S, heads*head_dim), rotate-half convention (GPT-NeoX, Llama): "
    "pairs (i, i + hd/2), frequencies theta^(-2i/hd), positions from 0. Optional attrs: "
    "rotary_dim (only the first rotary_dim channels of each head rotate, pairs (i, i + rd/2); "
    "Pythia, Phi-2, GPT-J), interleaved (pairs (2i, 2i+1): GPT-J), and with a context "
    "scaling (tfgraph.graph.rope) scaling, inv_freq (the rd/2 frequencies) and scale (multiplies "
    "cos and sin: YaRN). Its backward needs only the constant cos/sin tables (one (S, rd) "
    "pair per sequence, shared by every layer: not counted), so nothing is saved. An optional "
    "second operand, position ids (B, S), rotates each token by its own position (padding, "
    "KV cache).",
    category="position", tp="follows",
    attrs={
        "heads": Attr(SIZE, required=True), "head_dim": Attr(SIZE, required=True),
        "theta": Attr(REAL, required=True, doc="the frequency base"),
        "rotary_dim": Attr(SIZE, doc="channels rotated per head (default: head_dim)"),
        "interleaved": Attr(bool, default=False, doc="pairs (2i, 2i+1)"),
        "scaling": Attr(str, doc="the context scaling (tfgraph.graph.rope)"),
        "inv_freq": Attr(tuple, doc="the rotary_dim/2 frequencies of a context scaling"),
        "scale": Attr(REAL, default=1.0, doc="multiplies cos and sin (YaRN)"),
    },
))

def _relative_bias_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    table, x = ins[:2]
    if len(table.shape) != 2 or len(x.shape) != 3:
        raise ValueError("relative_bias takes a (buckets, heads) table and a (B, L, d) input")
    keys = ins[2].shape[1] if len(ins) == 3 else x.shape[1]  # a KV-cache graph's (B, T) mask
    return TensorType((table.shape[1], x.shape[1], keys), table.dtype)


def _relative_bias_saved(ins: list[TensorType], out: TensorType,
                         attrs: dict[str, Any]) -> Saved:
    # The gather keeps its (L, L) int64 bucket indices for the table's gradient.
    return [(("tmp", "buckets"), out.shape[1] * out.shape[2] * DTYPE_BYTES["int64"])]


register(OpDef(
    "relative_bias", (2, 3), _relative_bias_infer, _no_flops, _relative_bias_saved,
    "T5's position bias (Raffel et al. 2020): table[bucket(j - i)] for query i and key j, as "
    "(heads, L, L) for x's length L. Buckets: exact distances below half the buckets, then "
    "logarithmic up to attrs['max_distance']; attrs['bidirectional'] gives each direction "
    "half the buckets (encoder), else only j <= i count (decoder). No FLOPs (a gather of "
    "integer bucket indices). With a third operand, an attention mask (B, T) of a KV-cache "
    "graph, the keys are its T positions and the queries the last L: (heads, L, T).",
    category="position",
    attrs={"buckets": Attr(int, required=True), "max_distance": Attr(int, required=True),
           "bidirectional": Attr(bool, required=True, doc="encoder: both directions")},
    tp="split_param", tp_split_param=(0, 1), tp_refused="relative position bias",
    shape_only=(1, 2), score_bias=True,
    diagram_text=lambda attrs: (
        f"relative position bias ({attrs['buckets']} "
        f"{'bidirectional' if attrs['bidirectional'] else 'causal'} buckets, "
        "on the self-attention scores)"),
))

def alibi_slopes(heads: int) -> tuple[float, ...]:
    """ALiBi's per-head slopes (Press et al. 2022, section 3): for n heads, n a power of two,
    head h = 1..n has slope 2^(-8h/n); otherwise the m = 2^floor(log2 n) slopes of m heads,
    then the odd-numbered slopes 2^(-4h/m), h = 1, 3, 5, ..., of 2m heads for the other
    n - m (BLOOM's build_alibi_tensor)."""
    m = 1 << (heads.bit_length() - 1)
    slopes = [2.0 ** (-8.0 * h / m) for h in range(1, m + 1)]
    slopes += [2.0 ** (-4.0 * h / m) for h in range(1, 2 * (heads - m), 2)]
    return tuple(slopes)


def _alibi_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x = ins[0]
    if len(x.shape) != 3:
        raise ValueError("alibi reads the length of a (B, L, d) input")
    if attrs.get("scaled") and "head_dim" not in attrs:
        raise ValueError("alibi: scaled needs head_dim")
    keys = ins[1].shape[1] if len(ins) == 2 else x.shape[1]  # a KV-cache graph's (B, T) mask
    if len(ins) == 2 and attrs.get("bfloat16"):  # rounded: each row its own positions
        return TensorType((ins[1].shape[0], attrs["heads"], x.shape[1], keys), x.dtype)
    return TensorType((attrs["heads"], x.shape[1], keys), x.dtype)


def _alibi_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
    # slope * (j - i) once per head, query and key; rounded (Falcon): slope * position once
    # per head and key (per row of the batch when the positions are each row's own), the
    # query rows repeating it (a broadcast, no work); one more per value for the division
    # by sqrt(head_dim) when scaled
    per_key = FLOPS_PER_ELEMENT["add"] * (2 if attrs.get("scaled") else 1)
    if not attrs.get("bfloat16"):
        return ZERO, per_key * out.shape[-3] * out.shape[-2] * out.shape[-1]
    rows = out.shape[0] if len(out.shape) == 4 else 1
    return ZERO, per_key * rows * out.shape[-3] * out.shape[-1]


register(OpDef(
    "alibi", (1, 2), _alibi_infer, _alibi_flops, _nothing_saved,
    "ALiBi (Press et al. 2022): -slope_h * (i - j) for query i and key j, computed in "
    "float32 and cast to x's dtype, as (heads, L, L) for x's length L, added to the causal "
    "self-attention scores (BLOOM's slope_h * j and MPT's slope_h * (j - L + 1) differ from "
    "it by a per-row constant, which softmax ignores; relative to the query, the weighty "
    "keys near the diagonal get small, finely rounded biases in 16-bit models). "
    "attrs['slopes'] are alibi_slopes(heads) (absent in symbolic twins). With a "
    "second operand, an attention mask (B, T) of a KV-cache graph, the keys are its T "
    "positions and the queries the last L of them: (heads, L, T). attrs['scaled']: divided "
    "by sqrt(attrs['head_dim']), the scores' own scale (Falcon-RW). attrs['bfloat16']: "
    "Falcon's build_alibi_tensor instead, bfloat16(bfloat16(slope_h) * p_j) with p_j key "
    "j's position counted over the real tokens of its row (mask cumsum - 1, 0 on padding), "
    "the same for every query row; rounding breaks the per-row constant, so with a mask "
    "operand the bias is per row, (B, heads, L, T). No parameters, nothing saved; h*L*T "
    "multiplies (rounded: h*T, B*h*T per row), doubled when scaled.",
    category="position",
    attrs={"heads": Attr(SIZE, required=True),
           "slopes": Attr(tuple, doc="alibi_slopes(heads); absent in symbolic twins"),
           "scaled": Attr(bool, default=False, doc="divided by sqrt(head_dim) (Falcon-RW)"),
           "head_dim": Attr(SIZE, doc="the divisor's head_dim, with scaled"),
           "bfloat16": Attr(bool, default=False,
                            doc="slopes and products rounded to bfloat16 (Falcon)")},
    # a rank's heads would need their own slopes (an offset into the global heads)
    tp="refused", tp_refused="ALiBi position bias",
    shape_only=(0, 1), score_bias=True,
    diagram_text=lambda attrs: (
        f"ALiBi (linear bias slope · key position, {attrs['heads']} slopes"
        + (", bfloat16, per-row positions" if attrs.get("bfloat16") else "")
        + (", ÷ √head_dim" if attrs.get("scaled") else "")
        + ", on the self-attention scores)"),
))

# ---- linear algebra -----------------------------------------------------------------------


def _linear_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x, w = ins[0], ins[1]
    if len(w.shape) != 2:
        raise ValueError(f"weight must be 2-D [out, in], got {w}")
    _check_last(x, w.shape[1], "linear input")
    if len(ins) == 3 and ins[2].shape != (w.shape[0],):
        raise ValueError(f"bias {ins[2]} does not match weight {w}")
    if any(t.dtype != x.dtype for t in ins[1:]):  # as the element-wise ops: no implicit casts
        raise ValueError(f"operand dtypes differ: {', '.join(str(t) for t in ins)}")
    return TensorType((*x.shape[:-1], w.shape[0]), x.dtype)


def _linear_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
    w = ins[1]
    matmul = 2 * _rows(out) * w.shape[0] * w.shape[1]
    bias = out.numel if len(ins) == 3 else ZERO
    return matmul, bias


def _linear_backward(ins: list[TensorType], out: TensorType, attrs: dict[str, Any],
                     grads: tuple[bool, ...]) -> Flops:
    """dX = dY W for an input that gets a gradient, dW = dY^T X for a weight that does: one
    forward product each (the two of the 2 x forward rule; Narayanan et al. 2021 §5.1); the
    bias's element-wise work twice, as that rule counts it, when any operand gets one."""
    matmul, bias = _linear_flops(ins, out, attrs)
    return (int(grads[0]) + int(grads[1])) * matmul, (2 * bias if any(grads) else ZERO)


register(OpDef(
    "linear", (2, 3), _linear_infer, _linear_flops, _save_input(0),
    "y = x W^T (+ b) with W in torch's [out, in] layout; also the output head (tied or not).",
    category="linear", tp="project", backward_flops=_linear_backward,
))


ATTENTION_ATTRS: dict[str, Attr] = {
    "heads": Attr(SIZE, required=True), "kv_heads": Attr(SIZE, required=True),
    "head_dim": Attr(SIZE, required=True), "causal": Attr(bool, required=True),
    "normalize": Attr(str, required=True, doc="softmax or hardmax"),
    "window": Attr((*SIZE, type(None)), doc="sliding window: keys a causal query reads, "
                                            "or keys nearer than it on both sides"),
    "softcap": Attr(REAL, doc="c of c*tanh(scores/c) (Gemma 2)"),
    "scale": Attr(REAL, doc="the score scale (default 1/sqrt(head_dim))"),
    "v_head_dim": Attr(SIZE, doc="width of a value head (default head_dim; latent attention)"),
    "latent": Attr(SIZE, doc="latent attention: the values per token its KV cache keeps "
                             "(kv_rank + rope_dim) instead of k and v"),
}
"""Attributes of both attention ops."""


def v_width(attrs: dict[str, Any]) -> Any:
    """Width of one value head of an attention node (head_dim unless v_head_dim)."""
    return attrs.get("v_head_dim", attrs["head_dim"])


def _attention_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    q, k, v = ins[:3]
    if len(ins) == 4 and ins[3].shape != (attrs["heads"], q.shape[1], k.shape[1]):
        raise ValueError(f"position bias {ins[3]} is not (heads, Tq, Tk)")
    h, kvh, hd = attrs["heads"], attrs["kv_heads"], attrs["head_dim"]
    _check_last(q, h * hd, "attention q")
    _check_last(k, kvh * hd, "attention k")
    _check_last(v, kvh * v_width(attrs), "attention v")
    if k.shape[:-1] != v.shape[:-1] or q.shape[0] != k.shape[0]:
        raise ValueError(f"k {k} and v {v} must share batch and length with each other and q {q}")
    if sympy.sympify(h % kvh).is_nonzero:  # symbolic heads (tfgraph.passes.formulas) pass unproven
        raise ValueError(f"heads {h} is not a multiple of kv_heads {kvh}")
    return TensorType((*q.shape[:-1], h * v_width(attrs)), q.dtype)


def _scores(ins: list[TensorType], attrs: dict[str, Any]) -> sympy.Expr:
    q, k = ins[0], ins[1]
    return q.shape[0] * attrs["heads"] * q.shape[1] * k.shape[1]  # B * h * Tq * Tk


def _attention_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
    # Dense over the whole score matrix, causal or not (README, `tfgraph report`). QK^T and A·V are each
    # 2 * B*h*Tq*Tk*hd (O(N M d_q + N M d_v) for N queries and M keys); GQA shares K/V but not this work.
    scores = _scores(ins, attrs)
    matmul = 2 * scores * (attrs["head_dim"] + v_width(attrs))
    per_score = FLOPS_PER_ELEMENT["add"]  # the 1/sqrt(hd) scaling
    per_score += FLOPS_PER_ELEMENT[attrs["normalize"]]
    if attrs["causal"] or attrs.get("window"):
        per_score += FLOPS_PER_ELEMENT["mask"]
    if attrs.get("softcap"):
        per_score += FLOPS_PER_ELEMENT["softcap"]
    if len(ins) == 4:  # T5's position bias added to every score
        per_score += FLOPS_PER_ELEMENT["add"]
    return matmul, per_score * scores


def _attention_grad_blocked(attrs: dict[str, Any]) -> tuple[int, ...]:
    """Hard attention's arg-max has no gradient: q, k and a score bias (operand 3) get none
    (torch's argmax / one_hot, exporters.torch.functional.attention); v still does."""
    return (0, 1, 3) if attrs["normalize"] == "hardmax" else ()


def _attention_backward(ins: list[TensorType], out: TensorType, attrs: dict[str, Any],
                        grads: tuple[bool, ...]) -> Flops:
    """Per operand that gets a gradient: dQ = dS K and dK = dS^T Q (one QK^T-sized product
    each), dV = A^T dO (one A·V-sized product); dA = dO V^T and the per-score work (scale,
    mask, soft-cap, normalisation, twice as forward) only when q, k or the score bias gets
    one. All of them: 2 x forward."""
    matmul, other = _attention_flops(ins, out, attrs)
    scores = _scores(ins, attrs)
    qk, av = 2 * scores * attrs["head_dim"], 2 * scores * v_width(attrs)
    score_path = grads[0] or grads[1] or (len(grads) == 4 and grads[3])
    return (qk * (int(grads[0]) + int(grads[1])) + av * (int(grads[2]) + int(score_path)),
            2 * other if score_path else ZERO)


def attended_scores(tq: Any, tk: Any, causal: bool, window: Any) -> Any:
    """Scores a query row really reads, summed over the Tq rows: every Tq*Tk one without a
    mask; Tq(Tq+1)/2 under the causal mask (Tq = Tk); with a sliding window W query i reads
    min(i + 1, W) keys, which sums to m(m+1)/2 + (Tq - m) W with m = min(Tq, W). A
    bidirectional window (an encoder's, Tq = Tk = L) reads |i - j| < W: the L diagonal scores
    and the pairs at distance 1..m on both sides, L + 2 (m L - m(m+1)/2) with
    m = min(L, W) - 1 (L^2 once W >= L)."""
    if not causal and window:
        m = sympy.Min(tq, window) - 1
        return tq + 2 * (m * tq - m * (m + 1) / 2)
    if not causal:
        return tq * tk
    if not window:
        return tq * (tq + 1) / 2
    m = sympy.Min(tq, window)
    return m * (m + 1) / 2 + (tq - m) * window


def attention_dropout_saved(ins: list[TensorType], attrs: dict[str, Any]) -> Saved:
    """What dropout on explicit (materialised) attention weights adds for backward: a
    one-byte mask per score (torch.native_dropout's bool mask) and the dropped-out weights
    (A·V's backward reads them): Korthikanti et al. 2022 §4.1's as^2b and 2as^2b in 16 bits.
    Nothing without attrs['dropout']; a fused kernel keeps neither (FlashAttention
    regenerates the mask from the RNG state, Dao et al. 2022 §3.1)."""
    if not attrs.get("dropout"):
        return []
    scores = _scores(ins, attrs)
    return [(("tmp", "mask"), scores * DTYPE_BYTES["bool"]),
            (("tmp", "dropped"), scores * DTYPE_BYTES[ins[0].dtype])]


def attention_read_mask(ins: list[TensorType], attrs: dict[str, Any], fused: bool) -> Saved:
    """The (Tq, Tk) mask of the keys each query reads that the torch module builds once per
    attention call (exporters.torch.functional.attention_mask) and autograd keeps: whole on
    every rank (one per call, not per batch row or head, so tensor parallelism does not split
    it: ``whole_scratch``). ``fused`` (SDPA): only a sliding window passes a mask (a causal one
    is the kernel's is_causal), which SDPA turns into an additive float mask of q's dtype and
    saves; explicit matmuls (a score bias, soft-capping: no fused kernel takes them) keep
    masked_fill's one-byte boolean mask under a causal mask or a window. Hard attention keeps none (its
    scores have no gradient: exporters.torch.functional.explicit_attention detaches q and k).
    Measured by tests/test_train_memory.py."""
    if attrs["normalize"] == "hardmax":
        return []
    tq, tk = ins[0].shape[1], ins[1].shape[1]
    if fused:
        if not attrs.get("window"):
            return []
        return [(("tmp", "read_mask"), tq * tk * DTYPE_BYTES[ins[0].dtype])]
    if not (attrs["causal"] or attrs.get("window")):
        return []
    return [(("tmp", "read_mask"), tq * tk * DTYPE_BYTES["bool"])]


def _attention_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    q = ins[0]
    score_bytes = _scores(ins, attrs) * DTYPE_BYTES[q.dtype]
    dropped = attention_dropout_saved(ins, attrs)
    if attrs["normalize"] == "hardmax":
        # arg-max has no gradient: only the one-hot weights are kept, for the A·V product
        # (with dropout: the dropped-out weights A·V read, and dropout's mask, instead).
        return dropped or [(("tmp", "weights"), score_bytes)]
    if len(ins) == 4 and not attrs.get("softcap"):
        # A learned bias on the scores has no fused kernel either: explicit matmuls keep
        # q, k, v, the softmax weights and the boolean mask (the bias add keeps nothing).
        return [(("in", 0), q.nbytes), (("in", 1), ins[1].nbytes), (("in", 2), ins[2].nbytes),
                (("tmp", "weights"), score_bytes), *dropped,
                *attention_read_mask(ins, attrs, fused=False)]
    if attrs.get("softcap"):
        # No fused kernel soft-caps: explicit matmuls keep q, k, v, tanh's output (its
        # backward), the softmax weights (for A·V's backward), two score matrices, and the
        # boolean mask.
        return [(("in", 0), q.nbytes), (("in", 1), ins[1].nbytes), (("in", 2), ins[2].nbytes),
                (("tmp", "tanh"), score_bytes), (("tmp", "weights"), score_bytes), *dropped,
                *attention_read_mask(ins, attrs, fused=False)]
    # A fused kernel (SDPA) keeps q, k, v, its output, a float32 log-sum-exp per query row
    # and, under a sliding window, the float mask it was given.
    lse = q.shape[0] * attrs["heads"] * q.shape[1] * STATS_BYTES
    mask = attention_read_mask(ins, attrs, fused=True)
    vd, hd = v_width(attrs), attrs["head_dim"]
    if vd != hd:  # latent attention: v zero-padded to head_dim for the fused kernel, which
        # keeps the padded v and its padded output (torch_functional.attention)
        return [(("in", 0), q.nbytes), (("in", 1), ins[1].nbytes),
                (("tmp", "v_padded"), ins[2].nbytes / vd * hd),
                (("tmp", "out_padded"), out.nbytes / vd * hd), (("tmp", "logsumexp"), lse),
                *mask]
    return [(("in", 0), q.nbytes), (("in", 1), ins[1].nbytes), (("in", 2), ins[2].nbytes),
            (("out",), out.nbytes), (("tmp", "logsumexp"), lse), *mask]


def _attention_unfused_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]
                             ) -> Saved:
    """Explicit-matmul softmax attention keeps q, k, v and the softmax weights (Korthikanti
    et al. 2022 §4.1: QK^T's inputs, softmax's output, V), with dropout its mask and the
    dropped-out weights too (their as^2b and 2as^2b: 5as^2b of scores in all); the causal
    mask none (Megatron-LM's fused scale-mask-softmax kernel builds it in place; the torch
    module's impl "math" would keep a boolean one, ``attention_read_mask``, not counted
    here); where ``saved`` is explicit already (a score bias, softcap, hardmax) it is
    that."""
    if len(ins) != 3 or attrs.get("softcap") or attrs.get("normalize") != "softmax":
        return _attention_saved(ins, out, attrs)
    return [(("in", 0), ins[0].nbytes), (("in", 1), ins[1].nbytes), (("in", 2), ins[2].nbytes),
            (("tmp", "weights"), _attention_temp(ins, out, attrs)),
            *attention_dropout_saved(ins, attrs)]


def _attention_temp(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> sympy.Expr:
    # Materialised attention holds one B*h*Tq*Tk score matrix (space O(N M)); a fused
    # kernel streams it (report option fused_attention), which the cost pass handles.
    return _scores(ins, attrs) * DTYPE_BYTES[ins[0].dtype]


def _attention_fused_temp(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]
                          ) -> sympy.Expr:
    """Latent attention (values narrower than q and k) under a fused kernel: v zero-padded to
    head_dim and the kernel's padded output, both live while the module copies the output's
    slice out (torch_functional.attention; what ``_attention_saved`` keeps with autograd).
    Nothing otherwise. Measured by tests/test_train_memory.py."""
    vd, hd = v_width(attrs), attrs["head_dim"]
    if vd == hd or len(ins) == 4 or attrs.get("softcap") or attrs["normalize"] != "softmax":
        return ZERO  # the same widths, or explicit matmuls: no padding
    return (ins[2].nbytes + out.nbytes) / vd * hd


register(OpDef(
    "attention", (3, 4), _attention_infer, _attention_flops, _attention_saved,
    "Multi-head scaled dot-product attention on projected q (B, Tq, h*hd), k and v "
    "(B, Tk, kv*hd): normalize(softcap(q k^T * scale) + mask) v, with GQA (kv_heads < heads), "
    "scale 1/sqrt(hd) unless attrs['scale'] says otherwise, softcap c*tanh(x/c) when "
    "attrs['softcap'], mask none, causal, or causal within attrs['window'] keys (without "
    "causal: the keys |i - j| < attrs['window'], an encoder's sliding window), normalize "
    "softmax or hardmax; an optional fourth operand (h, Tq, Tk) is added to the scores "
    "before the mask (T5's position bias); in training, dropout with attrs['dropout'] on "
    "the normalized weights (the identity at inference). Output (B, Tq, h*vd): v's heads "
    "may be narrower than q's and k's, vd = attrs['v_head_dim'] (latent attention; default "
    "hd).",
    _attention_temp,
    category="attention", tp="follows", score_sized=("weights", "tanh", "mask", "dropped"),
    whole_scratch=("read_mask",), unfused_saved=_attention_unfused_saved, score_temp=True,
    fused_temp=_attention_fused_temp,
    score_flops=True, kv_cached=True,
    grad_blocked=_attention_grad_blocked, backward_flops=_attention_backward,
    attrs={
        **ATTENTION_ATTRS,
        "kind": Attr(str, required=True, doc="self or cross"),
        "dropout": Attr(REAL, default=0.0, doc="dropout p on the attention weights in "
                                               "training (attention.dropout); absent: none"),
    },
))


# ---- KV cache (inference graphs: tfgraph.graph.lower with cache=True) ---------------------------


def _kv_concat_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    *past, new = ins
    kvh, hd = attrs["kv_heads"], attrs["head_dim"]
    _check_last(new, kvh * hd, "kv_concat new keys/values")
    if not past:
        return TensorType((new.shape[0], kvh, new.shape[1], hd), new.dtype)
    if len(past[0].shape) != 4 or past[0].shape[1] != kvh or past[0].shape[3] != hd:
        raise ValueError(f"past {past[0]} is not (B, {kvh}, P, {hd})")
    return TensorType((new.shape[0], kvh, past[0].shape[2] + new.shape[1], hd), past[0].dtype)


register(OpDef(
    "kv_concat", (1, 2), _kv_concat_infer, lambda ins, out, attrs: (ZERO, ZERO), _nothing_saved,
    "The present keys (or values) of a layer: the past ones (B, kv, P, hd) followed by this "
    "step's (B, S, kv*hd), as (B, kv, P+S, hd) (the layout of Hugging Face's and "
    "onnxruntime-genai's past_key_values / present); with no past operand, this sequence's "
    "alone (an encoder's, or cross-attention keys/values computed once).",
    category="attention",
    attrs={"kv_heads": Attr(SIZE, required=True), "head_dim": Attr(SIZE, required=True)},
))


def _cached_attention_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    q, k, v, mask = ins[:4]
    h, kvh, hd, vd = attrs["heads"], attrs["kv_heads"], attrs["head_dim"], v_width(attrs)
    _check_last(q, h * hd, "attention q")
    if k.shape[:3] != v.shape[:3] or len(k.shape) != 4 or k.shape[1] != kvh \
            or k.shape[3] != hd or v.shape[3] != vd:
        raise ValueError(f"k {k} and v {v} must be (B, {kvh}, T, {hd}) and (B, {kvh}, T, {vd})")
    if mask.shape != (q.shape[0], k.shape[2]):
        raise ValueError(f"attention mask {mask} is not (B, T) for keys {k}")
    return TensorType((*q.shape[:-1], h * vd), q.dtype)


def _cached_attention_flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]
                            ) -> Flops:
    # Every query against every cached key (B*h*S*(P+S)): QK^T and A·V 2*scores*hd each.
    scores = ins[0].shape[0] * attrs["heads"] * ins[0].shape[1] * ins[1].shape[2]
    per_score = (FLOPS_PER_ELEMENT["add"] + FLOPS_PER_ELEMENT[attrs["normalize"]]
                 + FLOPS_PER_ELEMENT["mask"] + (FLOPS_PER_ELEMENT["softcap"]
                                                if attrs.get("softcap") else 0))
    return 2 * scores * (attrs["head_dim"] + v_width(attrs)), per_score * scores


register(OpDef(
    "attention_cached", (4, 5), _cached_attention_infer, _cached_attention_flops,
    _nothing_saved,
    "Attention of this step's queries q (B, S, h*hd) over the present keys and values "
    "(B, kv, T, hd), T = P + S, the queries being the last S positions: key j is read by "
    "query i when attention_mask[b, j] is 1 and, when causal, j <= P + i (within "
    "attrs['window'] keys when set; without causal, |P + i - j| < attrs['window'] when "
    "set, an encoder's local layers); a query reads its own key always, so a padding row "
    "stays finite, except with attrs['self_read'] false (cross-attention: the keys are "
    "another sequence's). scale, softcap, normalize and GQA as in attention; an optional "
    "fifth operand (h, S, T) is added to the scores before the mask (T5's position bias, "
    "ALiBi), or (B, h, S, T) when it is per row (Falcon's rounded ALiBi). "
    "Output (B, S, h*vd), vd = attrs['v_head_dim'] or hd (values of width vd: (B, kv, T, vd)).",
    category="attention",
    attrs={**ATTENTION_ATTRS,
           "self_read": Attr(bool, default=True, doc="a query reads its own key always"),
           "dropout": Attr(REAL, default=0.0, doc="dropout p on the attention weights in "
                                                  "training (attention.dropout: masked "
                                                  "training calls run this graph); the "
                                                  "identity at inference")},
))

# ---- norms --------------------------------------------------------------------------------


def _norm_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    x = ins[0]
    groups = attrs.get("heads", 1)  # slices of the last axis normalised on their own
    for p in ins[1:]:
        if p.shape != (1,):
            _check_last(x, p.shape[0] * groups, f"norm parameter {p}")
    return x


def _norm_saved(kind: str) -> Callable[[list[TensorType], TensorType, dict[str, Any]], Saved]:
    # input plus per-row statistics (layernorm: mean and rstd; rms/scale norm: one factor), as
    # fused kernels keep. The torch back end keeps exactly this on CPU too (torch's CPU rms_norm
    # is a composite that would also keep the normalized x): torch_functional.rms_norm.
    n_stats = 2 if kind == "layernorm" else 1

    def saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
        rows = _rows(out) * attrs.get("heads", 1)  # per-head norms keep stats per head
        kept = [(("in", 0), ins[0].nbytes), (("tmp", "stats"), n_stats * rows * STATS_BYTES)]
        if kind == "scalenorm":  # the gain it passes rms_norm, g / sqrt(d): a (1,) buffer
            kept.append((("tmp", "gain"), ins[1].nbytes))
        return kept

    return saved


# attrs['heads'] (per-head qk-norm): the last axis is that many slices, each normalised on its
# own with the same gains.
NORM_DOCS = {
    "layernorm": "(x - mean) / sqrt(var + eps) * gain + bias (Ba et al. 2016). Inputs x, gain"
                 "[, bias]; or x alone, a norm without parameters (OLMo 1).",
    "rmsnorm": "x / sqrt(mean(x^2) + eps) * gain (Zhang & Sennrich 2019). Inputs x, gain.",
    "scalenorm": "g * x / sqrt(sum(x^2) + eps) with one scalar g "
                 "(Nguyen & Salazar 2019). Inputs x, g of shape (1,).",
}
# attrs['unit_offset'] (Gemma): the gain operand is an offset and the norm multiplies by
# (1 + gain); adding the 1 costs one FLOP per gain element per call.
def _norm_flops(kind: str) -> Callable[[list[TensorType], TensorType, dict[str, Any]], Flops]:
    def flops(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Flops:
        offset = ins[1].numel * FLOPS_PER_ELEMENT["add"] if attrs.get("unit_offset") else ZERO
        # a LayerNorm without its bias (Cohere, MPT: two inputs) skips the bias add; one
        # without parameters (OLMo 1: x alone) skips the gain multiply too
        skipped = (3 - len(ins)) * FLOPS_PER_ELEMENT["add"] * out.numel \
            if kind == "layernorm" else ZERO
        return ZERO, FLOPS_PER_ELEMENT[kind] * out.numel + offset - skipped

    return flops


NORM_TITLES = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm", "scalenorm": "ScaleNorm"}
NORM_ATTRS: dict[str, Attr] = {
    "eps": Attr(REAL, required=True),
    "heads": Attr(SIZE, doc="slices of the last axis normalised each on its own (qk-norm)"),
    "unit_offset": Attr(bool, default=False, doc="the gain is 1 + the parameter (Gemma)"),
}

for _kind, _doc in NORM_DOCS.items():
    register(OpDef(_kind, (1 if _kind == "layernorm" else 2, 3), _norm_infer, _norm_flops(_kind), _norm_saved(_kind), _doc,
                   category="norm", attrs=NORM_ATTRS, sequence="norm",
                   title=NORM_TITLES[_kind]))


# ---- activations and element-wise -------------------------------------------------------

register(OpDef("relu", (1, 1), _same, _elementwise("relu"), _save_output, "max(x, 0).",
               category="activation", tp="follows", sequence="elementwise",
               title="ReLU"))
def _relu2_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    # torch's relu(x).square() keeps relu(x), a buffer of its own the size of x
    return [(("tmp", "relu"), ins[0].nbytes)]


register(OpDef("relu2", (1, 1), _same, _elementwise("relu2"), _relu2_saved,
               "max(x, 0)^2, squared ReLU (So et al. 2021, Primer; Nemotron).",
               category="activation", tp="follows", sequence="elementwise",
               title="squared ReLU"))
register(OpDef("gelu", (1, 1), _same, _elementwise("gelu"), _save_input(0),
               "x * Phi(x), exact erf form.", category="activation", tp="follows",
               sequence="elementwise", title="GELU", gated_title="GeGLU"))
register(OpDef("gelu_tanh", (1, 1), _same, _elementwise("gelu_tanh"), _save_input(0),
               "GPT-2's tanh approximation of GELU ('gelu_new').", category="activation",
               tp="follows", sequence="elementwise", title="GELU (tanh)",
               gated_title="GeGLU (tanh)"))
register(OpDef("silu", (1, 1), _same, _elementwise("silu"), _save_input(0),
               "x * sigmoid(x).", category="activation", tp="follows", sequence="elementwise",
               title="SiLU", gated_title="SwiGLU"))


def _binary_infer(ins: list[TensorType], attrs: dict[str, Any]) -> TensorType:
    if ins[0] != ins[1]:
        raise ValueError(f"operands differ: {ins[0]} vs {ins[1]}")
    return ins[0]


def _mul_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    return [(("in", 0), ins[0].nbytes), (("in", 1), ins[1].nbytes)]


register(OpDef("mul", (2, 2), _binary_infer, _elementwise("add"), _mul_saved,
               "Element-wise product: the gate of swiglu / geglu.", commutative=True,
               tp="follows", sequence="elementwise"))
register(OpDef("add", (2, 2), _binary_infer, _elementwise("add"), _nothing_saved,
               "Residual add.", commutative=True, tp="follows", sequence="elementwise"))


def _dropout_saved(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    # A bool mask, as torch.native_dropout keeps (F.dropout on CPU keeps a float noise tensor;
    # the torch back end calls native_dropout).
    return [(("tmp", "mask"), out.numel * DTYPE_BYTES["bool"])]


register(OpDef(
    "dropout", (1, 1), _same, _no_flops, _dropout_saved,
    "Inverted dropout with attrs['p'] in training; the identity at inference (so no FLOPs in "
    "the inference count). Training keeps a one-byte mask per element.",
    category="dropout", aliases_input=True, tp="follows", sequence="elementwise",
    attrs={"p": Attr(REAL, required=True, doc="the drop probability")},
))

def _save_tanh(ins: list[TensorType], out: TensorType, attrs: dict[str, Any]) -> Saved:
    # cap * tanh(x / cap): tanh keeps its own output for backward, a buffer before the * cap
    return [(("tmp", "tanh"), out.nbytes)]


register(OpDef("softcap", (1, 1), _same, _elementwise("softcap"), _save_tanh,
               "attrs['cap'] * tanh(x / attrs['cap']): soft-capped logits (Gemma 2).",
               attrs={"cap": Attr(REAL, required=True)}, tp="follows",
               sequence="elementwise"))
register(OpDef("clip", (1, 1), _same, _elementwise("clip"), _save_input(0),
               "min(max(x, -attrs['bound']), attrs['bound']): the q, k and v projections "
               "clamped (MPT's and OLMo 1's clip_qkv). Backward keeps x (torch's clamp).",
               attrs={"bound": Attr(REAL, required=True, doc="c of the range [-c, c]")},
               tp="follows", sequence="elementwise"))
register(OpDef("softmax", (1, 1), _same, _elementwise("softmax"), _save_output,
               "Softmax over the last axis (output: probs).", category="output",
               vocab_reduce="S", sequence="elementwise"))


def sinusoid_frequencies(d: int) -> list[float]:
    """1 / 10000^(2i/d) for i < d/2 (Vaswani et al. 2017, section 3.5)."""
    return [math.exp(-math.log(10000.0) * (2 * i) / d) for i in range((d + 1) // 2)]
