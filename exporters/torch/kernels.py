"""The kernels PyTorch's eager mode runs for each node of a training graph on a CUDA device: what
``tfgraph plan --kernels eager`` times (``tfgraph.parallel.timing``).

``tfgraph plan`` times one kernel per graph op by default, the fused execution ``torch.compile``
approaches. A module run eagerly launches one kernel per ATen op instead: an RMSNorm written as
casts, a square, a mean and two products, rotary embeddings as slices, negations, a concatenation
and products, each reading and writing the whole activation. This module counts them from the
torch back end itself: the module ``to_torch`` builds for the graph runs once on the ``meta``
device (shapes, no data, no arithmetic) at the layout's micro-batch and length. Each op node
of its programs runs on leaves of its operands under a ``TorchDispatchMode`` that records
every ATen kernel with the bytes it moves (its tensor operands and results, each element a
broadcast reads once) and, for matrix products, its FLOPs (``torch.utils.flop_counter``'s
formulas); then each node's backward runs as autograd's engine runs it, in reverse, on the
gradients its readers sent (``_backward``). A node identical to one counted is not run again.

The meta device has no CUDA dispatch, so the functions CUDA runs as one fused kernel are taken at
their ``torch.nn.functional`` entry point (``FUSED``) and counted as that kernel: SDPA (the flash
kernel; its work is the graph's attention core, timed by the planner) and ``F.rms_norm``
(``_fused_rms_norm``: reads the input and gain, writes the output and the per-row reciprocal
RMS in float32; its backward is layer norm's two kernels, ``_norm_backward``). ``tf.rms_norm``
takes its CUDA branch off the CPU, so the meta device sees the same path. ATen ops CUDA runs
as more than one kernel, or read only part of their operands, are counted as CUDA runs them
(``SPLIT``: layer norm's backward, the negative log-likelihood, the embedding's gather,
``copy_``).

Each kernel has a kind: "gemm" (with its M, N, K and batch), "attention" (with the FLOPs of
the scores it computes) or "memory". The first two are ``core``: the planner's graph model
already times a ``linear``, ``experts`` or attention node's own, so eager timing adds only the
others to such a node, and replaces a memory-bound node's one fused pass by its kernels
(``tfgraph.parallel.timing.kernel_seconds`` times each). ``record`` counts any step this way:
benchmarks/eager_step.py holds transformers' Llama beside tfgraph's module.

Routed experts are counted with uniform routing (``UniformRouting``); with expert parallelism
(``ep`` > 1) as one rank of ``parallelize(..., ep=ep)`` runs them: its E / ep experts, the
dispatch and combine around them, the all-to-alls themselves left out (the planner times them
as communication; ``expert_parallel.rank_experts``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten
from torch.utils.flop_counter import flop_registry

from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import SYMBOLS, Graph
from tfgraph.graph.ops import OPS
from tfgraph.parallel.timing import ATTENTION_BACKWARD

MATMULS = frozenset(op for op in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm,
                                  torch.ops.aten.baddbmm,
                                  getattr(torch.ops.aten, "_grouped_mm", None))  # torch >= 2.8
                    if op is not None)
"""ATen matrix products: the GEMMs the planner times from the graph (``core`` kernels)."""

NO_KERNEL = frozenset({torch.ops.aten.empty, torch.ops.aten.empty_like,
                       torch.ops.aten.empty_strided, torch.ops.aten.new_empty,
                       torch.ops.prim.device, torch.ops.aten.lift_fresh,
                       torch.ops.aten.sym_size, torch.ops.aten.sym_stride,
                       torch.ops.aten.sym_numel, torch.ops.aten.is_same_size,
                       torch.ops.aten.promote_types, torch.ops.aten._unsafe_view,
                       torch.ops.profiler._record_function_enter_new,
                       torch.ops.profiler._record_function_exit})
"""ATen ops that allocate, reinterpret or answer a question without launching a kernel
(``_unsafe_view`` is a view its schema does not mark as one)."""

WRITE_ONLY = frozenset({torch.ops.aten.zeros_like, torch.ops.aten.ones_like,
                        torch.ops.aten.full_like, torch.ops.aten.new_zeros,
                        torch.ops.aten.new_ones, torch.ops.aten.new_full, torch.ops.aten.zeros,
                        torch.ops.aten.ones, torch.ops.aten.full, torch.ops.aten.fill_,
                        torch.ops.aten.zero_})
"""ATen ops that write their result without reading a tensor operand (its shape only)."""

SCATTER = {torch.ops.aten.index_add_: "source", torch.ops.aten.index_put_: "values",
           torch.ops.aten.index_copy_: "source", torch.ops.aten.scatter_add_: "src",
           torch.ops.aten.scatter_: "src"}
"""In-place ATen ops that update only the rows their indices name: they read and write as
much of ``self`` as the named operand holds, not all of it."""


@dataclass(frozen=True)
class Kernel:
    """One kernel an eager step launches."""

    name: str
    """The ATen op (``aten.mul``) or fused function (``flash_attention``) it runs."""
    nbytes: float
    """Bytes it reads and writes in device memory."""
    flops: float = 0.0
    """Its matrix-product FLOPs (0 for element-wise and reduction kernels)."""
    kind: str = "memory"
    """"gemm" (a matrix product), "attention" (the flash kernel) or "memory" (the rest)."""
    dims: tuple[int, ...] = ()
    """A GEMM's (M, N, K, batch): C[M, N] = A[M, K] B[K, N], ``batch`` of them; the flash
    kernel's (batch x heads, query length, key length, head dim, causal, backward), the last
    two 0 or 1."""

    @property
    def core(self) -> bool:
        """Timed by the planner's graph model (a node's GEMMs, the attention kernel)."""
        return self.kind != "memory"


@dataclass(frozen=True)
class NodeKernels:
    """What one node of the graph launches in an eager training step."""

    forward: tuple[Kernel, ...]
    backward: tuple[Kernel, ...]


@dataclass
class _Log:
    kernels: list[Kernel] = field(default_factory=list)


def _touched(t: Tensor) -> float:
    """Bytes of the distinct elements a tensor's view reaches (a broadcast axis, stride 0, is
    read once)."""
    count = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            count *= size
    return float(count * t.element_size()) if t.numel() else 0.0


def _bytes(*trees: Any) -> float:
    """Bytes of the tensors in ``trees``, each tensor once (``addcmul(v, g, g)`` reads g
    once from memory)."""
    seen = {id(t): t for tree in trees for t in tree_leaves(tree) if isinstance(t, Tensor)}
    return sum(_touched(t) for t in seen.values())


class _Recorder(TorchDispatchMode):
    """Appends each ATen kernel that runs to ``log`` (views and allocations are not kernels)."""

    def __init__(self, log: _Log) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        if func.is_view or packet in NO_KERNEL:
            return out
        if packet in SPLIT:
            named = dict(zip((a.name for a in func._schema.arguments), args)) | kwargs
            self.log.kernels.extend(SPLIT[packet](named, out))
            return out
        if packet in MATMULS:
            flops = float(flop_registry[packet](*args, **kwargs, out_val=out)) \
                if packet in flop_registry else 0.0
            self.log.kernels.append(Kernel(str(packet), _moved(func, args, kwargs, out), flops,
                                           "gemm", _gemm_dims(packet, args)))
        else:
            self.log.kernels.append(Kernel(str(packet), _moved(func, args, kwargs, out)))
        return out


def _gemm_dims(packet: Any, args: Any) -> tuple[int, ...]:
    """(M, N, K, batch) of a matrix product's operands; () for a grouped one (its groups'
    sizes are data)."""
    if packet in (torch.ops.aten.addmm, torch.ops.aten.baddbmm):
        args = args[1:]  # after the bias
    if packet in (torch.ops.aten.mm, torch.ops.aten.addmm):
        a, b = args[0], args[1]  # (M, K) @ (K, N)
        return (a.shape[0], b.shape[1], a.shape[1], 1)
    if packet in (torch.ops.aten.bmm, torch.ops.aten.baddbmm):
        a, b = args[0], args[1]  # (batch, M, K) @ (batch, K, N)
        return (a.shape[1], b.shape[2], a.shape[2], a.shape[0])
    return ()


def _moved(func: Any, args: Any, kwargs: Any, out: Any) -> float:
    """Bytes a kernel moves: it reads its tensor operands and writes its new results and the
    operands it mutates (an in-place op's ``self``, a ``_foreach_*_`` op's lists: their
    schema marks them written; a result aliasing one is not counted again)."""
    schema = func._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None
               and a.alias_info.is_write]
    named = dict(zip((a.name for a in schema.arguments), args)) | kwargs
    results = out if isinstance(out, (tuple, list)) else (out,)
    fresh = [r for r, ret in zip(results, schema.returns) if ret.alias_info is None]
    packet = func.overloadpacket
    if packet in SCATTER and isinstance(named.get(SCATTER[packet]), Tensor):
        rows = _touched(named[SCATTER[packet]])  # the rows of self it reads and writes
        others = [v for k, v in named.items() if k != "self"]
        return _bytes(others) + 2 * rows
    stored = _bytes(fresh, [named.get(name) for name in written])
    if packet in WRITE_ONLY:
        return stored
    return _bytes(args, kwargs) + stored


def _norm_backward(dy: Tensor, x: Tensor, stats: tuple[Tensor | None, ...],
                   gain: Tensor | None, dx: Tensor | None, dgains: tuple[Tensor | None, ...],
                   name: str) -> list[Kernel]:
    """CUDA's layer-norm backward as it launches (``LayerNormBackwardKernelImplInternal`` in
    aten/src/ATen/native/cuda/layer_norm_kernel.cu; ``_fused_rms_norm_backward`` runs the same
    kernels with its ``rms_norm`` flag): one kernel for the input gradient (reads dy, x, the
    per-row statistics and the gain), a second for the gain and bias gradients that reads dy
    and x again. Each is launched only for the gradients asked for. (With over 65,536 rows of
    a narrow norm, CUDA splits the gain's reduction into partial sums and a sum: one or two
    kernels more, not counted.)"""
    kernels = []
    if dx is not None:
        kernels.append(Kernel(name, _bytes(dy, x, stats, gain, dx)))
    if any(g is not None for g in dgains):
        kernels.append(Kernel(f"{name}_gain", _bytes(dy, x, stats, dgains)))
    return kernels


def _layer_norm_backward(named: dict[str, Any], out: tuple[Tensor | None, ...]) -> list[Kernel]:
    dx, dw, db = out
    return _norm_backward(named["grad_out"], named["input"], (named["mean"], named["rstd"]),
                          named.get("weight"), dx, (dw, db), "aten.native_layer_norm_backward")


def _picked(log_probs: Tensor) -> float:
    """Bytes of one element per target: what the negative log-likelihood reads or writes of
    the (N, classes, ...) log-probabilities, at each target's index."""
    targets = log_probs.numel() // log_probs.shape[1] if log_probs.dim() >= 2 else 1
    return float(targets * log_probs.element_size())


def _nll_loss_forward(name: str, named: dict[str, Any], out: tuple[Tensor, Tensor]
                      ) -> list[Kernel]:
    # one kernel gathering each target's element (aten/src/ATen/native/cuda/Loss.cu)
    return [Kernel(name, _bytes(named["target"], named.get("weight"), out)
                   + _picked(named["self"]))]


def _nll_loss_backward(name: str, named: dict[str, Any], out: Tensor) -> list[Kernel]:
    # Loss.cu's nll_loss_backward_out_cuda: grad_input.zero_(), then one kernel writing each
    # target's element; the log-probabilities themselves are not read
    return [Kernel("aten.zero_", _bytes(out)),
            Kernel(name, _bytes(named["grad_output"], named["target"], named.get("weight"),
                                named["total_weight"]) + _picked(out))]


def _embedding(named: dict[str, Any], out: Tensor) -> list[Kernel]:
    # a gather: reads the ids and the rows they name, writes them (not the whole table)
    return [Kernel("aten.embedding", _bytes(named["indices"]) + 2 * _bytes(out))]


def _copy(named: dict[str, Any], out: Tensor) -> list[Kernel]:
    # ``self`` is overwritten, not read
    return [Kernel("aten.copy_", _bytes(named["src"], named["self"]))]


SPLIT: dict[Any, Callable[..., list[Kernel]]] = {
    torch.ops.aten.embedding: _embedding,
    torch.ops.aten.copy_: _copy,
    torch.ops.aten.native_layer_norm_backward: _layer_norm_backward,
    **{op: functools.partial(fn, f"aten.{op.__name__}") for op, fn in (
        (torch.ops.aten.nll_loss_forward, _nll_loss_forward),
        (torch.ops.aten.nll_loss_backward, _nll_loss_backward),
        (torch.ops.aten.nll_loss2d_forward, _nll_loss_forward),  # (N, C, H, W) inputs
        (torch.ops.aten.nll_loss2d_backward, _nll_loss_backward))},
}
"""ATen ops whose CUDA kernels differ from one kernel over all their operands (several kernels,
or reads of only the indexed elements): each takes the op's arguments by schema name and its
results, and gives the kernels launched."""


class _FlashAttention(torch.autograd.Function):
    """SDPA as CUDA runs it, one flash kernel each way: a core kernel (the planner times the
    graph's attention itself)."""

    @staticmethod
    def forward(ctx: Any, log: _Log, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        # laid out (B, Tq, h, vd) as the CUDA kernels write it: the module's transpose back to
        # (B, Tq, h * vd) is then a view, no copy
        b, h, tq = q.shape[:3]
        out = q.new_empty((b, tq, h, v.shape[-1])).transpose(1, 2)  # (B, h, Tq, vd)
        lse = q.shape[0] * q.shape[1] * q.shape[2] * 4  # float32 log-sum-exp per row
        # QK^T and PV over every score; a causal mask skips half the tiles (Dao 2023 counts
        # it so); a band mask is counted whole
        flops = 2.0 * b * h * tq * k.shape[2] * (q.shape[3] + v.shape[3]) / (2 if causal else 1)
        dims = (b * h, tq, k.shape[2], q.shape[3], int(causal))
        log.kernels.append(Kernel("flash_attention", _bytes(q, k, v, out) + lse, flops,
                                  "attention", (*dims, 0)))
        ctx.shapes, ctx.lse, ctx.flops, ctx.log, ctx.dims = (q, k, v), lse, flops, log, dims
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        q, k, v = ctx.shapes
        grads = tuple(torch.empty_like(t) for t in (q, k, v))
        _active(ctx.log).kernels.append(Kernel("flash_attention_backward",
                                          _bytes(q, k, v, grad, grad, grads) + ctx.lse,
                                          ATTENTION_BACKWARD * ctx.flops, "attention",
                                          (*ctx.dims, 1)))
        return (None, *grads, None)


class _FusedRmsNorm(torch.autograd.Function):
    """``F.rms_norm`` as CUDA runs it (``_fused_rms_norm``): one kernel forward (reads x and the
    gain, writes y and a float32 reciprocal RMS per row); backward, the input-gradient kernel
    and the gain-gradient kernel of layer norm's backward (``_norm_backward``)."""

    @staticmethod
    def forward(ctx: Any, log: _Log, x: Tensor, weight: Tensor | None) -> Tensor:
        rstd = x.new_empty(x.shape[:-1], dtype=torch.float32)  # (rows,) reciprocal RMS
        out = torch.empty_like(x)
        log.kernels.append(Kernel("fused_rms_norm", _bytes(x, weight, out, rstd)))
        ctx.rstd, ctx.x, ctx.weight, ctx.log = rstd, x, weight, log
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
        x, weight = ctx.x, ctx.weight
        dx = torch.empty_like(x) if ctx.needs_input_grad[1] else None
        dw = torch.empty_like(weight) if weight is not None and ctx.needs_input_grad[2] else None
        _active(ctx.log).kernels.extend(_norm_backward(grad, x, (ctx.rstd,), weight, dx, (dw,),
                                                       "fused_rms_norm_backward"))
        return None, dx, dw


def _sdpa(log: _Log, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
          dropout_p: float = 0.0, is_causal: bool = False, **kwargs: Any) -> Tensor:
    return _FlashAttention.apply(log, q, k, v, is_causal and attn_mask is None)


def _rms_norm(log: _Log, x: Tensor, shape: Any, weight: Tensor | None = None,
              eps: float | None = None) -> Tensor:
    return _FusedRmsNorm.apply(log, x, weight)


FUSED: dict[Callable[..., Any], Callable[..., Tensor]] = {
    F.scaled_dot_product_attention: _sdpa,
    F.rms_norm: _rms_norm,
}
"""``torch.nn.functional`` entry points CUDA runs as one fused kernel, and how each is counted."""


class _Fused(TorchFunctionMode):
    """Routes ``FUSED`` functions to their one-kernel stand-ins."""

    def __init__(self, log: _Log) -> None:
        super().__init__()
        self.log = log

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in FUSED:
            return FUSED[func](self.log, *args, **kwargs)
        return func(*args, **kwargs)


class UniformRouting(TorchFunctionMode):
    """How many (token, expert) pairs each expert receives, as a routed op counts them
    (``tf.experts``: ``torch.bincount(...).tolist()``): on the meta device the count is data,
    so each expert is taken to receive pairs / experts of them (uniform routing: the planner's
    assumption for the experts' GEMMs, ``tfgraph.parallel.timing``), the remainder one each to
    the first experts. The count reads the pairs and writes one integer per expert; it is
    given as a CPU tensor holding those values, so what the module computes from it (its
    ``tolist``, an expert-parallel rank's per-rank sums) has them."""

    def __init__(self, log: _Log, experts: int) -> None:
        super().__init__()
        self.log, self.experts = log, experts

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.bincount:
            pairs = args[0]
            share, extra = divmod(pairs.numel(), self.experts)
            found = torch.tensor([share + (e < extra) for e in range(self.experts)],
                                 dtype=torch.long)
            self.log.kernels.append(Kernel("aten.bincount", _bytes(pairs, found)))
            return found
        return func(*args, **kwargs)


_ACTIVE: list[_Log] = []
"""The logs being recorded into, innermost last (a fused stand-in's backward runs outside the
mode that made it, and records into the backward's log)."""


def _active(made: _Log) -> _Log:
    """Where a fused stand-in's backward records: the recording running now, else the one
    that ran its forward."""
    return _ACTIVE[-1] if _ACTIVE else made


@contextmanager
def _recording(log: _Log) -> Iterator[None]:
    _ACTIVE.append(log)
    try:
        with _Fused(log), _Recorder(log):
            yield
    finally:
        _ACTIVE.pop()


def record(step: Callable[[], Any]) -> list[Kernel]:
    """Every kernel ``step()`` launches, in order: run it on meta tensors (e.g. a module's
    forward, loss and ``backward``, any module: benchmarks/eager_step.py records transformers'
    Llama this way)."""
    log = _Log()
    with _recording(log):
        step()
    return log.kernels


def _leaf(x: Any) -> Any:
    """A tensor operand cut from the model's autograd graph, as a leaf that wants a gradient
    exactly when the original did."""
    if isinstance(x, Tensor):
        return x.detach().requires_grad_(x.requires_grad)
    return x


@dataclass
class _Visit:
    """One node as the census met it in the forward: its kernels, the outputs that want a
    gradient, the operands (by name: a node or parameter) that do, what its kernels depend
    on, and how to run it (again): ``outs`` have no autograd graph when the node was taken
    from an identical one (``rerun`` makes it, should its backward need counting)."""

    forward: list[Kernel]
    outs: list[Tensor]
    wanted: list[tuple[str, Tensor]]
    key: Any
    attrs: dict[str, Any]
    rerun: Callable[[], list[Tensor]] | None = None
    given: Any = None
    """The layouts of the gradients its backward was given (``_backward``; None: none)."""
    own: int = 0
    """How many of its backward kernels are its own, before the additions of the gradients it
    sends to operands that already have one."""


def _signature(x: Any) -> Any:
    """What a node's kernels depend on in a value: a tensor's shape, strides, dtype and whether
    it wants a gradient; anything else as it prints."""
    if isinstance(x, Tensor):
        return (tuple(x.shape), x.stride(), x.dtype, x.requires_grad)
    if isinstance(x, (tuple, list)):
        return tuple(_signature(v) for v in x)
    return repr(x)


@dataclass
class _Seen:
    """What was counted, by what it depends on: the identical layers of a stack run the same
    kernels, so each kind of node runs (on the meta device, through Python) once."""

    forward: dict[Any, tuple[list[Kernel], Any, list[Any]]] = field(default_factory=dict)
    """key -> (kernels, the output's tree structure, each leaf's signature or value)."""
    backward: dict[Any, tuple[list[Kernel], list[Any]]] = field(default_factory=dict)
    """(key, given gradient's signature) -> (kernels, each operand's gradient signature)."""


def _made(signature: Any) -> Any:
    """A meta tensor of a ``_signature`` (a leaf that wants a gradient when that did)."""
    shape, stride, dtype, grad = signature
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta").requires_grad_(grad)


def _census(fn: Callable[..., Any], visits: dict[str, _Visit], seen: _Seen, graph: Graph,
            name: str, operands: list[str], sizes: Mapping[Any, int]) -> Callable[..., Any]:
    """Wraps one program step: run the node on leaves of its operands, recording its kernels,
    and give the model the result cut from the autograd graph (``_backward`` runs each node's
    backward afterwards). A node identical to one counted (``seen``: same step, attributes
    and operand layouts) does not run: its kernels and outputs' layouts are taken. The routed
    experts of a mixture run with ``UniformRouting``: which tokens reach which expert is data
    the meta device does not have."""
    routed = name in graph and OPS[graph.node(name).op].routed

    def run(module: Any, attrs: dict[str, Any], leaves: list[Any], log: _Log,
            record_it: bool) -> Any:
        with torch.enable_grad(), contextlib.ExitStack() as stack:
            # not recorded: run as CUDA would (the fused stand-ins) for the backward's sake
            stack.enter_context(_recording(log) if record_it else _Fused(_Log()))
            if routed:  # operand 1: the routing weights (.., experts) (OpDef.routed)
                stack.enter_context(UniformRouting(log, leaves[1].shape[-1]))
            return fn(module, attrs, *leaves)

    def step(module: Any, attrs: dict[str, Any], *args: Any) -> Any:
        leaves = [tree_map(_leaf, a) for a in args]
        wanted = [(operands[i], t) for i, t in enumerate(leaves)
                  if isinstance(t, Tensor) and t.requires_grad]
        key = (fn, repr(sorted(attrs.items())), _signature(leaves))
        if key in seen.forward:
            kernels, tree, flat = seen.forward[key]
            out = tree_unflatten([_made(x) if isinstance(x, tuple) else x for x in flat], tree)
            outs = [t for t in tree_leaves(out) if isinstance(t, Tensor) and t.requires_grad]

            def rerun() -> list[Tensor]:
                again = run(module, attrs, leaves, _Log(), False)
                return [t for t in tree_leaves(again)
                        if isinstance(t, Tensor) and t.requires_grad]
            visits[name] = _Visit(list(kernels), outs, wanted, key, attrs, rerun)
            return out
        log = _Log()
        out = run(module, attrs, leaves, log, True)
        flat, tree = tree_flatten(out)
        seen.forward[key] = (log.kernels, tree, [_signature(x) if isinstance(x, Tensor) else x
                                                 for x in flat])
        outs = [t for t in tree_leaves(out) if isinstance(t, Tensor) and t.requires_grad]
        visits[name] = _Visit(list(log.kernels), outs, wanted, key, attrs)
        return tree_map(_leaf, out)  # cut here too: the next node's operands are leaves
    return step


@functools.cache
def _rank_experts(ep: int) -> Callable[..., Any]:
    """``expert_parallel.rank_experts(ep)``, one step for every layer (``_Seen`` keys on it)."""
    from tfgraph.exporters.torch.expert_parallel import rank_experts

    return rank_experts(ep)


def _backward(graph: Graph, visits: dict[str, _Visit], seen: _Seen
              ) -> dict[str, list[Kernel]]:
    """Each node's backward kernels, run as autograd's engine runs them: in reverse, a node's
    backward taking the gradient its readers sent (the loss: a fresh one), with that
    gradient's own layout; a node no gradient reaches runs none (a reader that only takes a
    shape, ALiBi's, or blocks the gradient, hardmax's, sends none). A second gradient for the
    same value (an output several ops read, a tied token table) is added to the first, one
    addition recorded where it arrives. A node identical to one counted, given a gradient of
    the same layout, takes its kernels and sends gradients of the layouts it sent."""
    grads: dict[str, Tensor] = {}
    found: dict[str, list[Kernel]] = {}
    for name in reversed(list(visits)):
        visit, log = visits[name], _Log()
        found[name] = log.kernels
        if name in graph.outputs:
            given = [torch.empty_like(t) for t in visit.outs]
        elif name in grads and len(visit.outs) == 1:
            given = [grads.pop(name)]
        else:
            continue
        if not visit.wanted:
            continue
        visit.given = _signature(given)
        key = (visit.key, visit.given)
        if key in seen.backward:
            kernels, layouts = seen.backward[key]
            log.kernels += kernels
            got: list[Tensor | None] = [
                None if layout is None else torch.empty_strided(
                    layout[0], layout[1], dtype=layout[2], device="meta")
                for layout in layouts]
        else:
            outs = visit.outs if visit.rerun is None else visit.rerun()
            with _recording(log):
                got = list(torch.autograd.grad(outs, [t for _, t in visit.wanted],
                                               given, allow_unused=True))
            seen.backward[key] = (list(log.kernels),
                                  [None if g is None else _signature(g) for g in got])
        visit.own = len(log.kernels)
        with _recording(log):
            for (operand, _), grad in zip(visit.wanted, got):
                if grad is not None:
                    grads[operand] = grads[operand] + grad if operand in grads else grad
    return found


def _resolve(graph: Graph, visits: dict[str, _Visit], seen: _Seen) -> dict[str, NodeKernels]:
    """Each graph node's kernels, forward and backward. A step that is no graph node (the
    rotary tables the model computes once per forward, before the first layer) is charged to
    the graph node before it (the embedding's: not to a layer, whose time every identical
    layer repeats), or after it when none comes before."""
    backward = _backward(graph, visits, seen)
    found: dict[str, NodeKernels] = {}
    carried: list[Kernel] = []
    last = None
    for name, visit in visits.items():
        if name not in graph:
            if last is None:
                carried += visit.forward + backward[name]
            else:
                found[last] = NodeKernels(found[last].forward + tuple(visit.forward),
                                          found[last].backward + tuple(backward[name]))
            continue
        found[name] = NodeKernels(tuple(carried + visit.forward), tuple(backward[name]))
        carried, last = [], name
    return found


def _programs(model: torch.nn.Module) -> Iterator[Any]:
    for module in model.modules():
        program = getattr(module, "_program", None)
        if program is not None:
            yield program


def _input(graph: Graph, name: str, sizes: Mapping[Any, int]) -> Tensor:
    """A meta tensor of a graph node's type (an input's, an output's) at the given sizes."""
    node = graph.node(name)
    shape = tuple(int(sympy.sympify(d).xreplace(sizes)) for d in node.type.shape)
    return torch.empty(shape, dtype=getattr(torch, node.type.dtype), device="meta")


def eager_kernels(graph: Graph, batch: int, seq: int, ep: int = 1) -> dict[str, NodeKernels]:
    """Every op node's eager kernels (forward and backward, one micro-batch of ``batch`` x
    ``seq``) in the training-mode module ``to_torch`` builds for ``graph``, by node name; with
    ``ep`` > 1, on one of ``ep`` expert-parallel ranks (``parallelize(..., ep=ep)``: its routed
    experts those of ``expert_parallel.rank_experts``). Memoised on the graph per size and
    ``ep``."""
    table: dict[tuple[int, int, int], dict[str, NodeKernels]] = graph.memo(
        "torch_eager_kernels", dict)
    if (batch, seq, ep) not in table:
        table[(batch, seq, ep)] = (_eager_kernels(graph, batch, seq) if ep == 1 else
                                   _on_rank(graph, batch, seq, ep))
    return table[(batch, seq, ep)]


@dataclass(frozen=True)
class _Routed:
    """A routed experts node as the one-process census ran it (``_on_rank`` runs it again as
    an expert-parallel rank runs it)."""

    attributes: str
    """Its attributes as they print (``_census``'s key)."""
    operands: tuple[Any, ...]
    """Its operands' signatures (``_signature``): x, routing weights, stacked weights."""
    attrs: dict[str, Any]
    given: Any
    """The gradient layouts its backward was given; None: no backward."""
    forward: int
    """How many of its forward kernels are its own."""
    own: int
    """How many of its backward kernels are its own (``_Visit.own``)."""


def _on_rank(graph: Graph, batch: int, seq: int, ep: int) -> dict[str, NodeKernels]:
    """``eager_kernels`` on one of ``ep`` expert-parallel ranks: those of one process, each
    routed experts node's own kernels replaced by those of ``expert_parallel.rank_experts``
    run on operands of the layouts the census gave it (its stacked weights cut to E / ep),
    backward on a gradient of the layout it was given; what the census charged it besides
    (additions of the gradients it sends) is kept. Identical nodes are run once."""
    found = dict(eager_kernels(graph, batch, seq))
    step = _rank_experts(ep)
    done: dict[Any, tuple[list[Kernel], list[Kernel]]] = {}
    counted: dict[tuple[int, int], dict[str, _Routed]] = graph.memo("torch_eager_routed",
                                                                     dict)
    for name, visit in counted[(batch, seq)].items():
        key = (visit.attributes, visit.operands, visit.given)
        if key not in done:
            leaves = [_made(s) for s in visit.operands]  # x, routing weights, stacked weights
            leaves[2:] = [_made(((t.shape[0] // ep, *t.shape[1:]), t.stride(), t.dtype,
                                 t.requires_grad)) for t in leaves[2:]]
            forward, backward = _Log(), _Log()
            with torch.enable_grad(), _recording(forward), \
                    UniformRouting(forward, leaves[1].shape[-1]):
                out = step(None, visit.attrs, *leaves)
            wanted = [t for t in leaves if t.requires_grad]
            if visit.given is not None and wanted:
                with _recording(backward):
                    torch.autograd.grad([out], wanted, [_made(g) for g in visit.given],
                                        allow_unused=True)
            done[key] = (forward.kernels, backward.kernels)
        forward_kernels, backward_kernels = done[key]
        whole = found[name]
        found[name] = NodeKernels(
            (*forward_kernels, *whole.forward[visit.forward:]),
            (*backward_kernels, *whole.backward[visit.own:]))
    return found


@dataclass(frozen=True)
class EagerKernels:
    """What ``tfgraph.parallel.planner.plan`` takes as ``kernels`` (``tfgraph plan --kernels
    eager``): the graph's eager kernels per node and ``torch.optim.AdamW``'s step."""

    graph: Graph

    def nodes(self, batch: int, seq: int, ep: int = 1) -> dict[str, NodeKernels]:
        return eager_kernels(self.graph, batch, seq, ep)

    @property
    def optimizer_bytes(self) -> float:
        return adamw_bytes_per_element()


def kernel_source(graph: Graph) -> EagerKernels:
    return EagerKernels(graph)


@functools.cache
def adamw_bytes_per_element() -> float:
    """Bytes ``torch.optim.AdamW`` (foreach, its default on CUDA) moves per float32 parameter
    element in one step after the first, counted as the module's kernels are: a float32
    parameter and gradient, the two moments, weight decay on."""
    elements = 1 << 20
    weight = torch.nn.Parameter(torch.empty(elements, device="meta"))
    weight.grad = torch.empty_like(weight)
    optimizer = torch.optim.AdamW([weight], lr=1e-3, weight_decay=0.1, foreach=True)
    optimizer.step()  # the first step allocates the moments
    log = _Log()
    with _recording(log):
        optimizer.step()
    return sum(k.nbytes for k in log.kernels) / elements


MAX_TENSOR_BYTES = 2**63 - 1
"""PyTorch's limit on one tensor, the meta device's included: its storage's byte count is a
signed 64-bit integer (``c10::computeStorageNbytes`` refuses more, "Storage size calculation
overflowed")."""
WIDEST_ELEMENT = 8
"""Bytes of the widest element the module's kernels store for a graph tensor: int64 indices,
a float32 upcast of a 16-bit activation (4) and float32 tensors themselves are within it."""


def check_sizes(graph: Graph, batch: int, seq: int) -> None:
    """Refuse (exit 2) a micro-batch and length at which some tensor the census makes could
    not exist in PyTorch: ``WIDEST_ELEMENT`` bytes per element past ``MAX_TENSOR_BYTES`` (the
    census would end in torch's RuntimeError). Checked before the module is built, on the
    graph's own tensors (the module's are these, flattened or cast) and on those the module
    builds for an attention node (``module_tensors``)."""
    sizes = {SYMBOLS["B"]: batch, SYMBOLS["S"]: seq, SYMBOLS["T"]: seq}
    seen: dict[Any, int] = {}
    largest, name = 0, ""
    for node in graph.nodes():
        if node.type not in seen:
            seen[node.type] = int(sympy.sympify(node.type.numel).xreplace(sizes))
        if seen[node.type] > largest:
            largest, name = seen[node.type], node.name
        for what, elements in module_tensors(graph, node.name):
            count = int(sympy.sympify(elements).xreplace(sizes))
            if count > largest:
                largest, name = count, f"{node.name}'s {what}"
    if largest * WIDEST_ELEMENT > MAX_TENSOR_BYTES:
        raise TfgraphError(
            f"--kernels eager: a micro-batch of {batch:,} x --seq {seq:,} makes {name} "
            f"{largest:,} elements, past what a PyTorch tensor can hold (2^63 bytes, "
            f"{WIDEST_ELEMENT} per element); give smaller sizes or --kernels graph")


def module_tensors(graph: Graph, name: str) -> list[tuple[str, Any]]:
    """(what, elements) of the tensors the training module builds for an attention node that
    are not graph tensors (``exporters.torch.functional.attention``): the (Tq, Tk) mask of the
    keys each query reads (``attention_mask``: int64 differences of positions, then booleans)
    where a sliding window passes one to SDPA or explicit matmuls apply a causal one; the
    (B, h, Tq, Tk) score matrix of explicit matmuls (soft-capped or biased scores, hardmax,
    values wider than q and k: ``explicit_attention``)."""
    node = graph.node(name)
    opdef = OPS.get(node.op)  # None: an input, a parameter
    if opdef is None or not opdef.score_flops:  # not attention
        return []
    attrs = node.attrs
    q, k = (graph.node(i).type for i in node.inputs[:2])
    tq, tk = q.shape[1], k.shape[1]
    explicit = (attrs.get("normalize") != "softmax" or bool(attrs.get("softcap"))
                or len(node.inputs) == 4 or attrs.get("v_head_dim", attrs["head_dim"])
                > attrs["head_dim"])
    found: list[tuple[str, Any]] = []
    if attrs.get("window") or (explicit and attrs["causal"]):
        found.append(("(Tq, Tk) mask", sympy.sympify(tq) * tk))
    if explicit:
        found.append(("score matrix", q.shape[0] * attrs["heads"] * sympy.sympify(tq) * tk))
    return found


def _eager_kernels(graph: Graph, batch: int, seq: int) -> dict[str, NodeKernels]:
    from tfgraph.exporters.torch.module import to_torch

    check_sizes(graph, batch, seq)

    model = to_torch(graph, device="meta").train()
    visits: dict[str, _Visit] = {}
    seen = _Seen()
    sizes = {SYMBOLS["B"]: batch, SYMBOLS["S"]: seq, SYMBOLS["T"]: seq}
    for program in _programs(model):
        names = {slot: name for name, slot in program.slots.items()}
        program.steps = [(step[0] if _no_kernels(step[0]) else
                          _census(step[0], visits, seen, graph, names[step[3]],
                                  [names[i] for i in step[2]], sizes), *step[1:])
                         for step in program.steps]
    inputs = [_input(graph, name, sizes) for name in graph.inputs]
    try:
        with torch.enable_grad():
            model(*inputs)
        found = _resolve(graph, visits, seen)
    except RuntimeError as error:  # a tensor check_sizes does not know of, past torch's limit
        if "overflow" not in str(error):
            raise
        first = str(error).splitlines()[0]
        raise TfgraphError(f"--kernels eager: a micro-batch of {batch:,} x --seq {seq:,} "
                           f"makes a tensor PyTorch cannot hold ({first}); give smaller "
                           f"sizes or --kernels graph") from None
    routed: dict[tuple[int, int], dict[str, _Routed]] = graph.memo("torch_eager_routed", dict)
    routed[(batch, seq)] = {  # for _on_rank
        name: _Routed(visit.key[1], visit.key[2], visit.attrs, visit.given,
                      len(visit.forward), visit.own)
        for name, visit in visits.items() if name in graph and OPS[graph.node(name).op].routed}
    return found


def _no_kernels(fn: Any) -> bool:
    """A step that runs a whole layer's program (whose own steps are recorded) or picks one
    of a layer's outputs (a tuple index)."""
    from tfgraph.exporters.torch.module import _CallLayer, _pick

    return isinstance(fn, _CallLayer) or fn is _pick

