"""``to_torch``: a compiled graph becomes a trainable ``nn.Module`` (README, Python API).

The module runs the graph's walk (``tfgraph.passes.liveness``): every op node becomes one step
``(lowering, attrs, input slots, output slot, slots freed after it, in-place form)`` through
``TORCH_OPS``, the per-op table (one entry per op of ``tfgraph.graph.ops.OPS``; a test asserts none is
missing). Each layer of the graph (the nodes whose metadata names one ``stack`` and ``layer``)
is a real ``nn.Module``, ``decoder.layers.3``, whose ``forward`` runs that layer's steps: per-layer
forward hooks fire, ``torch.utils.checkpoint`` can wrap a layer and FSDP2's ``fully_shard`` can
shard one (torchtitan style: the layers sit in an ``nn.ModuleDict``). The model's own steps are
the embeddings, one call per layer, the final norms and the head. A straight loop over a fixed
list keeps ``torch.compile`` and ``torch.export`` working (they unroll it) and costs
microseconds next to the matmuls.

Freeing and in-place writes follow the plan, the same one the report's activation peak walks:
a value is dropped after its last reader; a layer's inputs are held by the caller until the
layer returns (so a layer never overwrites them); without autograd (``torch.no_grad()`` /
``inference_mode()``) element-wise ops write into an operand the plan says nothing reads any
more (``TORCH_INPLACE``), as a hand-written inference model would.

Parameters are registered under their names (README, parameter table) as nested submodules, so
``state_dict()`` keys are exactly the graph's parameter names and a tied table appears once.

Attention runs ``F.scaled_dot_product_attention`` (``attention_impl = "sdpa"``, the default) or
explicit matmuls (``"math"``), which ``FlopCounterMode`` counts (it counts 0 for the CPU SDPA
kernel). Dropout is active only in ``train()``, at the graph's dropout nodes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from tfgraph.errors import TfgraphError
from tfgraph.limits import check_memory, check_weight_memory
from tfgraph.passes.cost import weights_bytes
from tfgraph.exporters.torch.ops import (
    ATTENTION_IMPLS,
    TORCH_INPLACE,
    TORCH_OPS,
    Lowering,
    StepFn,
    rope_table_attrs,
    rope_tables_step,
)
from tfgraph.graph.ir import CacheLayout, Graph, Node, expect_graph
from tfgraph.graph.lengths import Lengths
from tfgraph.graph.ops import OPS
from tfgraph.passes.liveness import Plan, layer_region, plan
from tfgraph.graph.weights import check_weights, generate, weight_shapes

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
}

__all__ = ["ATTENTION_IMPLS", "MODEL_CLASSES", "TORCH_DTYPES", "TORCH_INPLACE", "TORCH_OPS",
           "DecoderModel", "DecoderPartModel", "EncoderDecoderModel", "EncoderModel",
           "EncoderPartModel", "GraphModel", "LayerModule", "LossModel",
           "NormWeights", "StaticCache", "TorchModel", "to_torch"]

# (lowering, attrs, input slots, output slot, slots freed after it,
#  in-place lowering or None, its input slots (the operand to overwrite first))
Step = tuple[StepFn, dict[str, Any], tuple[int, ...], int, tuple[int, ...],
             Lowering | None, tuple[int, ...]]


class _Scope(nn.Module):
    """A container named after one segment of a parameter path; it computes nothing."""

    def extra_repr(self) -> str:
        return ", ".join(f"{n}: {tuple(p.shape)}" for n, p in self._parameters.items()
                         if p is not None)


class LinearWeights(nn.Linear):
    """The owner of one linear's ``weight`` (and ``bias``): an ``nn.Linear`` whose parameters
    are the graph's (none allocated here). Layer programs compute the linear with ``F.linear``
    on these parameters directly; ``tfgraph.exporters.parallelize`` routes the step through a
    call of this module instead, so that PyTorch's ``ColwiseParallel`` / ``RowwiseParallel``
    hooks convert its input and output (they apply to ``nn.Linear`` modules that are called).
    """

    def __init__(self) -> None:
        nn.Module.__init__(self)  # not nn.Linear's: its parameters come from the graph

    def set_sizes(self) -> None:
        """nn.Linear's size attributes, from the weight just registered; no bias until the
        graph's is registered (state_dict order stays weight, bias)."""
        self.out_features, self.in_features = (int(n) for n in self.weight.shape)
        if "bias" not in self._parameters:
            self.register_parameter("bias", None)


class EmbeddingWeights(nn.Embedding):
    """The owner of a token table, an ``nn.Embedding`` over the graph's parameter (see
    :class:`LinearWeights`: ``parallelize`` routes the lookup through its call, for
    ``RowwiseParallel``'s vocabulary split)."""

    def __init__(self) -> None:
        nn.Module.__init__(self)  # not nn.Embedding's: the table comes from the graph
        self.padding_idx, self.max_norm, self.norm_type = None, None, 2.0
        self.scale_grad_by_freq, self.sparse = False, False

    def set_sizes(self) -> None:
        """nn.Embedding's size attributes, from the table just registered."""
        self.num_embeddings, self.embedding_dim = (int(n) for n in self.weight.shape)


class NormWeights(nn.Module):
    """The owner of one norm's gain (and bias): a module that computes its norm node when
    called (``bind``: the node's lowering and attributes). Layer programs compute the norm as
    a step on these parameters directly; sequence parallelism (``parallelize(..., sp=True)``)
    routes the step through a call of this module instead, so that PyTorch's
    ``SequenceParallel`` hooks run (its input taken as a sequence shard, its parameters made
    replicated DTensors whose partial gradients are summed over the ranks)."""

    def __init__(self) -> None:
        super().__init__()
        self.lowering: Lowering | None = None
        self.attrs: dict[str, Any] = {}
        self.leaves: tuple[str, ...] = ()

    def bind(self, lowering: Lowering, attrs: dict[str, Any], leaves: Sequence[str]) -> None:
        """Compute ``lowering(self, attrs, x, *parameters)`` when called, the parameters the
        node reads after x in the node's order (``leaves``: their names here)."""
        self.lowering, self.attrs, self.leaves = lowering, dict(attrs), tuple(leaves)

    def forward(self, x: Tensor) -> Tensor:
        """The norm of x (..., d), as the node's step computes it. Precondition: bound."""
        if self.lowering is None:
            raise TfgraphError("a NormWeights module computes only after bind()")
        return self.lowering(self, self.attrs, x, *(self._parameters[leaf]
                                                     for leaf in self.leaves))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["lowering"] = _op_key(self.lowering)  # see _Program.__getstate__
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["lowering"] = _op_fn(state["lowering"])
        super().__setstate__(state)

    def extra_repr(self) -> str:
        return ", ".join(f"{n}: {tuple(p.shape)}" for n, p in self._parameters.items()
                         if p is not None)


def _owner_classes(graph: Graph) -> dict[str, type[nn.Module]]:
    """Module path -> the class owning its parameters: token tables are embeddings, a
    linear's weight owner a linear (a table a tied head reads stays an embedding), a norm's
    gain and bias owner a ``NormWeights``."""
    owners: dict[str, type[nn.Module]] = {}
    for n in graph.ops():
        if OPS[n.op].tp == "gather":  # a token table, operand 0 (TpRule)
            owners[n.inputs[0].rpartition(".")[0]] = EmbeddingWeights
    for n in graph.ops():
        if OPS[n.op].tp == "project":  # a linear map by its weight, operand 1 (TpRule)
            owners.setdefault(n.inputs[1].rpartition(".")[0], LinearWeights)
        elif n.category == "norm" and len(n.inputs) > 1:
            owners.setdefault(n.inputs[1].rpartition(".")[0], NormWeights)
    return owners


def _bind_norms(model: nn.Module, graph: Graph) -> None:
    """Give every ``NormWeights`` owner its norm node's lowering and attributes."""
    for n in graph.ops():
        if n.category == "norm" and len(n.inputs) > 1:
            owner = model.get_submodule(n.inputs[1].rpartition(".")[0])
            if isinstance(owner, NormWeights):
                owner.bind(TORCH_OPS[n.op], n.attrs,
                           [name.rpartition(".")[2] for name in n.inputs[1:]])


class _OpKey(tuple):
    """(table, op): where a pickled step's lowering is found again on loading."""


def _op_key(fn: Any) -> Any:
    for table, lowerings in (("ops", TORCH_OPS), ("inplace", TORCH_INPLACE)):
        for op, lowering in lowerings.items():
            if lowering is fn:
                return _OpKey((table, op))
    return fn  # a module-level function or a picklable object (a layer call)


def _op_fn(key: Any) -> Any:
    if isinstance(key, _OpKey):
        return (TORCH_OPS if key[0] == "ops" else TORCH_INPLACE)[key[1]]
    return key


class _Program:
    """Steps over a list environment: parameters, inputs, then one slot per produced value."""

    def __init__(self) -> None:
        self.slots: dict[str, int] = {}
        self.params: list[tuple[int, nn.Module, str]] = []
        self.inputs: list[int] = []
        self.steps: list[Step] = []
        self.outputs: list[int] = []

    def slot(self, name: str) -> int:
        if name not in self.slots:
            self.slots[name] = len(self.slots)
        return self.slots[name]

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (torch.save(model)): an op's lowering is named by its op, since
        TORCH_OPS holds lambdas and closures pickle cannot reference."""
        state = dict(self.__dict__)
        state["steps"] = [(_op_key(fn), attrs, args, out, dead, _op_key(inplace), inplace_args)
                          for fn, attrs, args, out, dead, inplace, inplace_args in self.steps]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["steps"] = [(_op_fn(fn), attrs, args, out, dead, _op_fn(inplace), inplace_args)
                          for fn, attrs, args, out, dead, inplace, inplace_args in state["steps"]]
        self.__dict__.update(state)

    def run(self, module: nn.Module, inputs: tuple[Any, ...]) -> list[Any]:
        env: list[Any] = [None] * len(self.slots)
        for slot, owner, leaf in self.params:
            value = owner._parameters.get(leaf)
            # a parametrized weight (torch.nn.utils.parametrize) is computed by its property
            env[slot] = getattr(owner, leaf) if value is None else value
        for slot, x in zip(self.inputs, inputs):
            env[slot] = x
        grad = torch.is_grad_enabled()
        for fn, attrs, args, out, dead, inplace, inplace_args in self.steps:
            if inplace is None or grad:
                env[out] = fn(module, attrs, *[env[i] for i in args])
            else:  # overwrites an operand nothing reads any more (tfgraph.passes.liveness)
                env[out] = inplace(module, attrs, *[env[i] for i in inplace_args])
            for i in dead:  # free activations after their last use
                env[i] = None
        return [env[i] for i in self.outputs]


class LayerModule(nn.Module):
    """One layer of a stack; ``forward(*inputs)`` computes it (inputs: the residual stream,
    then e.g. the encoder output and rotary tables, as the layer's graph reads them)."""

    attention_impl: str = "sdpa"
    # The positions a static KV cache writes this step (DecoderModel.static_cache).
    cache_position: Tensor | None = None

    def __init__(self) -> None:
        super().__init__()
        self._program = _Program()
        self.input_names: tuple[str, ...] = ()
        self.output_names: tuple[str, ...] = ()

    def forward(self, *inputs: Any) -> Any:
        out = self._program.run(self, inputs)
        return out[0] if len(out) == 1 else tuple(out)

    def extra_repr(self) -> str:
        return f"inputs={list(self.input_names)}, outputs={list(self.output_names)}"


class _CallLayer:
    """A step of the model's program that calls the layer at module path ``path``
    ("decoder.layers.3"), looked up when called: a block put in its place after building
    (``layers.register_module("3", checkpoint_wrapper(block))`` as torchtitan's activation
    checkpointing does, ``apply_activation_checkpointing``, a per-block ``torch.compile``) is
    what runs."""

    def __init__(self, path: str) -> None:
        self.parent, _, self.name = path.rpartition(".")

    def __call__(self, module: nn.Module, attrs: dict[str, Any], *inputs: Any) -> Any:
        owner = module.get_submodule(self.parent) if self.parent else module
        layer = owner._modules[self.name]
        assert layer is not None
        return layer(*inputs)


def _pick(module: nn.Module, attrs: dict[str, Any], outputs: Any) -> Any:
    """One output of a layer that returns several."""
    return outputs[attrs["index"]]


class TorchModel(nn.Module):
    """The graph as a module; ``forward`` takes int64 ids (B, L) and returns (B, L, vocab)."""

    # The positions a static KV cache writes this step, as on each layer (LayerModule): the
    # model's own nodes (ALiBi, T5's bias) place the step's queries there among the keys.
    cache_position: Tensor | None = None

    def __init__(self, graph: Graph, weights: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.graph_name = graph.name
        self.input_names = tuple(graph.inputs)
        self.output_name = graph.outputs[0]
        self._attention_impl = "sdpa"
        self.source_graph = graph  # what parallelize reads (tfgraph.parallel.tp_plan)
        self.info = graph.info  # what lowering says of the graph (its kind, cache parts)
        # modules of this model's other graphs (its KV-cache parts) over the same parameters
        self._parts: dict[str | None, tuple[tuple[int, tuple[str, ...]], TorchModel]] = {}
        walk = plan(graph)
        layer_paths = _region_paths(graph, walk.region)
        self._layers: dict[tuple[Any, ...], LayerModule] = {}
        top = _Program()
        owners = _owner_classes(graph)
        by_path = {path: key for key, path in layer_paths.items()}
        lists = {path.rpartition(".")[0] for path in by_path}  # "decoder.layers": ModuleDicts
        for p in graph.params():
            owner, leaf = self._register(p.name, weights[p.name], by_path, lists, owners)
            layer_key = layer_region(p)
            program = top if layer_key is None else self._layers[layer_key]._program
            program.params.append((program.slot(p.name), owner, leaf))
        for name in graph.inputs:
            top.inputs.append(top.slot(name))
        self._program = top
        _build(graph, walk, top, self._layers, layer_paths)
        _bind_norms(self, graph)

    def _register(self, name: str, value: Tensor, layer_paths: dict[str, tuple[Any, ...]],
                  lists: set[str],
                  owners: dict[str, type[nn.Module]]) -> tuple[nn.Module, str]:
        """Register parameter ``name`` ("a.b.c.weight") under nested submodules; a layer's
        path becomes a ``LayerModule``, its parent (``decoder.layers``) an ``nn.ModuleDict``,
        the owner of a linear's or a token table's parameters ``owners``' class."""
        *path, leaf = name.split(".")
        owner: nn.Module = self
        for depth, part in enumerate(path):
            child = owner._modules.get(part)
            if child is None:
                prefix = ".".join(path[:depth + 1])
                if prefix in layer_paths:
                    child = LayerModule()
                    self._layers[layer_paths[prefix]] = child
                elif prefix in lists:
                    child = nn.ModuleDict()
                elif prefix in owners:
                    child = owners[prefix]()
                else:
                    child = _Scope()
                owner.add_module(part, child)
            owner = child
        # A KV-cache part module is given its model's very Parameters: gradients of a masked
        # or cached forward land where the optimizer looks (a new Parameter over the same
        # storage would collect them on an object nobody steps).
        owner.register_parameter(leaf, value if isinstance(value, nn.Parameter)
                                 else nn.Parameter(value))
        if isinstance(owner, (LinearWeights, EmbeddingWeights)) and leaf == "weight":
            owner.set_sizes()
        return owner, leaf

    @property
    def attention_impl(self) -> str:
        """'sdpa' (fused kernel for softmax attention) or 'math' (explicit matmuls)."""
        return self._attention_impl

    @attention_impl.setter
    def attention_impl(self, value: str) -> None:
        if value not in ATTENTION_IMPLS:
            raise ValueError(f"attention_impl {value!r}: expected one of {ATTENTION_IMPLS}")
        self._attention_impl = value
        for layer in self._layers.values():
            layer.attention_impl = value

    def layers(self) -> list[LayerModule]:
        """Every layer module, in execution order (encoder layers, then decoder layers)."""
        return list(self._layers.values())

    def _run(self, inputs: tuple[Tensor, ...]) -> Tensor:
        out: Tensor = self._program.run(self, inputs)[0]
        return out

    def _part_module(self, part: str | None) -> TorchModel:
        """The module of this model's KV-cache graph ``part`` (lowering's
        ``graph.info.cache_graph``: None a decoder's, "encoder" or "decoder" an
        encoder-decoder's), over the same parameter storage, rebuilt when the parameters
        move (another device or dtype)."""
        info = self.info
        if info.cache_graph is None or info.cache_parts is None or part not in info.cache_parts:
            which = "" if part is None else f" {part!r}"
            raise TfgraphError(f"{self.graph_name}: masks and a KV cache need a KV-cache graph"
                               f"{which}, and this {info.arch or 'graph'} has none "
                               f"(its KV-cache graphs: {info.cache_parts})")
        computed = _parametrized(self)
        first = (next(self.parameters()).data_ptr(), tuple(computed))
        held = self._parts.get(part)
        if held is None or held[0] != first:
            graph = info.cache_graph(part)
            # the very Parameter objects: the part reads these weights and its gradients
            # accumulate on them (training through a masked forward)
            mine = dict(self.named_parameters())
            mine.update({name: original for name, (_, _, original) in computed.items()})
            module = _model_class(graph)(graph, {p.name: mine[p.name] for p in graph.params()})
            _read_parametrized(module, computed)
            module.attention_impl = self.attention_impl
            held = self._parts[part] = (first, module)
        if held[1].training != self.training:  # follows model.train() / model.eval()
            held[1].train(self.training)
        if held[1].attention_impl != self.attention_impl:
            held[1].attention_impl = self.attention_impl
        return held[1]

    def _positions(self, position_ids: Tensor) -> tuple[Tensor, ...]:
        """The position ids, when the graph takes them (not with relative positions)."""
        return (position_ids,) if "position_ids" in self.input_names else ()

    def extra_repr(self) -> str:
        return f"graph={self.graph_name!r}, attention_impl={self.attention_impl!r}"


def _parametrized(model: nn.Module) -> dict[str, tuple[nn.Module, str, nn.Parameter]]:
    """Parameter name -> (owner, leaf, original Parameter) of every weight
    torch.nn.utils.parametrize computes (one original each; a right_inverse splitting it in
    several tensors is refused)."""
    out: dict[str, tuple[nn.Module, str, nn.Parameter]] = {}
    for path, owner in model.named_modules():
        plists = owner._modules.get("parametrizations")
        if plists is None or not parametrize.is_parametrized(owner):
            continue
        for leaf, plist in plists.named_children():
            name = f"{path}.{leaf}" if path else leaf
            original = getattr(plist, "original", None)
            if not isinstance(original, nn.Parameter):
                raise TfgraphError(f"{name}: a parametrization whose right_inverse returns "
                                   "several tensors is not supported")
            out[name] = (owner, leaf, original)
    return out


def _read_parametrized(part: TorchModel,
                       computed: Mapping[str, tuple[nn.Module, str, nn.Parameter]]) -> None:
    """Make a KV-cache part read each parametrized weight from its model's owner (the
    parametrization computes it there; the part holds the original Parameter)."""
    if not computed:
        return
    for program in [part._program, *(layer._program for layer in part.layers())]:
        names = {slot: name for name, slot in program.slots.items()}
        program.params = [(slot, *computed[names[slot]][:2]) if names[slot] in computed
                          else (slot, owner, leaf) for slot, owner, leaf in program.params]


def module_dtype(module: nn.Module, default: torch.dtype) -> torch.dtype:
    """The dtype of ``module``'s first floating parameter (what ``.to()`` last cast them
    to), else ``default``."""
    for p in module.parameters():
        if p.is_floating_point():
            return p.dtype
    return default


def _cache_defaults(input_ids: Tensor, layout: CacheLayout, dtype: torch.dtype,
                    past_key_values: Sequence[tuple[Tensor, Tensor]] | None,
                    attention_mask: Tensor | None, position_ids: Tensor | None
                    ) -> tuple[Sequence[tuple[Tensor, Tensor]], Tensor, Tensor]:
    """What a cached forward fills in when not given: an empty cache of ``layout``, every
    token real, positions counted from the mask."""
    batch, length = input_ids.shape
    if past_key_values is None:
        key, value = (input_ids.new_zeros((batch, layout.kv_heads, 0, width), dtype=dtype)
                      for width in (layout.head_dim, layout.v_dim))
        past_key_values = [(key, value)] * layout.layers
    past = past_key_values[0][0].shape[2] if past_key_values else 0
    if attention_mask is None:
        attention_mask = input_ids.new_ones((batch, past + length))
    if position_ids is None:
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, -length:]
    return past_key_values, attention_mask, position_ids


class StaticCache(nn.Module):
    """Preallocated keys/values (gpt-fast style), (B, kv_heads, length, head_dim) per layer,
    held as buffers (``key_{i}``, ``value_{i}``): each step writes its positions in place
    (index_copy_), so every step has the same shapes and ``torch.compile`` traces a step once
    instead of once per length. Attached to a model (``DecoderModel.setup_cache``), the
    buffers are the model's own, which CUDA graphs (``mode="reduce-overhead"``) may mutate;
    each buffer is also marked a static address for inductor."""

    def __init__(self, layers: list[tuple[Tensor, Tensor]]) -> None:
        super().__init__()
        self.count = len(layers)
        for i, (k, v) in enumerate(layers):
            self.register_buffer(f"key_{i}", k, persistent=False)
            self.register_buffer(f"value_{i}", v, persistent=False)
            for t in (k, v):
                _mark_static(t)

    @property
    def layers(self) -> list[tuple[Tensor, Tensor]]:
        return [self[i] for i in range(self.count)]

    @property
    def batch(self) -> int:
        return int(self[0][0].shape[0]) if self.count else 0

    @property
    def length(self) -> int:
        return int(self[0][0].shape[2]) if self.count else 0

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor]:
        if not 0 <= i < self.count:
            raise IndexError(i)
        return self._buffers[f"key_{i}"], self._buffers[f"value_{i}"]  # type: ignore[return-value]

    def __iter__(self) -> Any:
        return iter(self.layers)

    def select_rows(self, rows: Tensor) -> None:
        """Rows ``rows`` (n <= batch) of every buffer moved to its first n rows, in place (the
        buffers keep their addresses; rows past n keep stale values nothing reads)."""
        n = int(rows.shape[0])
        for i in range(self.count):
            for t in self[i]:
                t[:n].copy_(t.index_select(0, rows))

    def extra_repr(self) -> str:
        return f"layers={self.count}, batch={self.batch}, length={self.length}"


def _check_cache_memory(what: str, need: int, device: torch.device) -> None:
    """Refuse (one line) a cache of ``need`` bytes that ``device`` cannot hold, before
    allocating it: the memory available on the host for a CPU cache, the free memory of the
    GPU for a CUDA one (other devices, ``meta`` among them: not checked)."""
    if device.type == "cpu":
        check_memory(what, need)
    elif device.type == "cuda" and torch.cuda.is_available():
        free = torch.cuda.mem_get_info(device)[0]
        if need > free:
            raise TfgraphError(f"{what}: needs about {need / 1e9:,.1f} GB of GPU memory, "
                               f"only {free / 1e9:,.1f} GB free on {device}")


def _check_static_step(input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor,
                       cache: StaticCache, cache_position: Tensor,
                       lengths: Lengths | None = None) -> Tensor:
    """One-line errors for a step that does not fit ``cache``, instead of index_copy_'s or
    a slice's. Shapes are static (free to check, and torch.compile guards on them anyway);
    the positions' values are checked only in eager mode on a CPU tensor: reading them from
    a GPU would synchronise the host every step, and a traced step cannot branch on them
    (CUDA graphs capture no host read). ``lengths``: the spec's max_len rule; a learned
    position table has no row for a position id past max_len (cache slots may run past it:
    a left-padded row's slots are ahead of its positions). Returns ``cache_position`` as
    int64 (an int32 one is converted; one of another dtype refused)."""
    if cache_position.dtype != torch.long:
        if cache_position.is_floating_point() or cache_position.is_complex() \
                or cache_position.dtype == torch.bool:
            raise TfgraphError(f"cache_position must hold integers (int64), got "
                               f"{cache_position.dtype}")
        cache_position = cache_position.long()
    batch, length = cache.batch, cache.length
    rows, new = input_ids.shape[0], input_ids.shape[1]
    if rows != batch:
        raise TfgraphError(f"a static cache of batch {batch} was given input_ids of {rows} "
                           "rows (setup_cache / static_cache with this batch)")
    if tuple(attention_mask.shape) != (batch, length):
        raise TfgraphError(f"a static cache of length {length}: attention_mask must be "
                           f"({batch}, {length}) (every position of the cache), got "
                           f"{tuple(attention_mask.shape)}")
    if tuple(position_ids.shape) != tuple(input_ids.shape):
        raise TfgraphError(f"position_ids {tuple(position_ids.shape)} must have input_ids' "
                           f"shape {tuple(input_ids.shape)}")
    if tuple(cache_position.shape) != (new,):
        raise TfgraphError(f"cache_position must be ({new},), one position per new token; got "
                           f"{tuple(cache_position.shape)}")
    if new > length:
        raise TfgraphError(f"{new} tokens do not fit a static cache of length {length}")
    if cache_position.device.type == "cpu" and not torch.compiler.is_compiling() and new:
        low, high = int(cache_position.min()), int(cache_position.max())
        if low < 0 or high >= length:
            raise TfgraphError(f"cache_position {high if high >= length else low} is outside "
                               f"a static cache of length {length} (positions 0..{length - 1})")
    _check_position_ids(position_ids, lengths)
    return cache_position


def _check_position_ids(position_ids: Tensor, lengths: Lengths | None,
                        known_high: int | None = None) -> None:
    """TfgraphError for a position id past a learned table's max_len (on the CPU, outside
    compilation: a device tensor's max would be a host read). ``known_high``: the largest
    position id when the shapes say it (positions defaulted over an all-real mask: the last
    one is the mask's width - 1), checked on any device without reading a tensor."""
    if lengths is None or not lengths.learned or lengths.max_len is None:
        return
    high = known_high
    if high is None and position_ids.device.type == "cpu" \
            and not torch.compiler.is_compiling() and position_ids.numel():
        high = int(position_ids.max())
    if high is not None and high >= lengths.max_len:
        raise TfgraphError(f"position id {high}: past {lengths.name}'s max_len "
                           f"{lengths.max_len} (ids 0..{lengths.max_len - 1}): its learned "
                           "position table has no row past max_len")


def _defaulted_high(input_ids: Tensor, past_key_values: Sequence[tuple[Tensor, Tensor]] | None,
                    attention_mask: Tensor | None, position_ids: Tensor | None) -> int | None:
    """The largest position id ``_cache_defaults`` gives when neither the mask nor the
    positions are given (every token real: past + new - 1), from shapes alone; else None."""
    if attention_mask is not None or position_ids is not None:
        return None
    past = past_key_values[0][0].shape[2] if past_key_values else 0
    new = input_ids.shape[1]
    if type(past) is not int or type(new) is not int or not new:  # symbolic (traced): no
        return None  # guard on a dynamic length
    return past + new - 1


def _mark_static(t: Tensor) -> None:
    """Tell dynamo the tensor's address never changes (CUDA graphs then do not copy it nor
    skip for its in-place writes)."""
    mark = getattr(torch._dynamo, "mark_static_address", None)
    if mark is not None:
        mark(t)


class _CachedModel(TorchModel):
    """A model whose graph may be a KV-cache one (``graph.info.kind == "cached"``): the cache
    layout it allocates empty caches with (``cache_layers`` 0 on a full-sequence graph)."""

    def __init__(self, graph: Graph, weights: Mapping[str, Tensor]) -> None:
        super().__init__(graph, weights)
        self.cached = graph.info.kind == "cached"
        layout = graph.info.cache or CacheLayout(0, 0, 0)
        self.layout = layout if self.cached else CacheLayout(0, 0, 0)
        # what the cached steppers read (tfgraph.exporters.generation.cached_steppers)
        self.cache_layers, self.kv_heads, self.head_dim = (
            self.layout.layers, self.layout.kv_heads, self.layout.head_dim)
        self.value_dim = self.layout.v_dim  # latent attention: the rotary key's width
        self._graph_dtype = TORCH_DTYPES[graph.dtype]

    @property
    def dtype(self) -> torch.dtype:
        """The parameters' current floating dtype, which follows ``.to(torch.bfloat16)`` /
        ``.half()`` (issue 24 item 3), so empty caches and rope tables match the weights; the
        graph's dtype when the module has no floating parameter."""
        return module_dtype(self, self._graph_dtype)


class DecoderModel(_CachedModel):
    """A decoder-only model, one forward for the full sequence and for KV-cache steps (in the
    spirit of gpt-fast): ``forward(input_ids, attention_mask=None, position_ids=None,
    past_key_values=None, use_cache=False, cache_position=None)``.

    On the full-sequence graph, a call with none of the cache arguments runs that graph (its
    fused attention); given any, the model's KV-cache graph (``graph.info.cache_graph``) runs
    over the same parameters. On a KV-cache graph (``graph.info.kind == "cached"``), the
    cache arguments default to an empty cache, every token real and positions counted from
    the mask. ``static_cache`` gives a preallocated cache instead, for ``torch.compile``
    (README, "KV cache")."""

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None,
                past_key_values: Sequence[tuple[Tensor, Tensor]] | None = None,
                use_cache: bool = False, cache_position: Tensor | None = None) -> Any:
        """input_ids (B, S) int64; attention_mask (B, P+S) (1 real, 0 padding; default all
        real); position_ids (B, S) (default: real tokens counted from 0, padding at 0);
        past_key_values: per layer (key, value), each (B, kv_heads, P, head_dim) (default
        none). Returns logits or probs (B, S, vocab), and with ``use_cache`` also the present
        (key, value) per layer, each (B, kv_heads, P+S, head_dim).

        With a :class:`StaticCache` as past_key_values: ``cache_position`` (S,) int64 says
        where this step's tokens go, attention_mask covers the cache's whole length and
        position_ids are required; the cache is written in place."""
        if not self.cached:
            if attention_mask is None and position_ids is None and past_key_values is None \
                    and not use_cache and cache_position is None:
                return self._run((input_ids,))
            past: Any = past_key_values
            if past is None and cache_position is not None:
                past = self._attached_cache()  # this module's buffers, not the part's
            return self.cached_model()(input_ids, attention_mask, position_ids,
                                       past, use_cache, cache_position)
        if past_key_values is None and cache_position is not None:
            return self._static_step(input_ids, attention_mask, position_ids,
                                     self._attached_cache(), use_cache, cache_position)
        if isinstance(past_key_values, StaticCache):
            return self._static_step(input_ids, attention_mask, position_ids, past_key_values,
                                     use_cache, cache_position)
        high = _defaulted_high(input_ids, past_key_values, attention_mask, position_ids)
        past_key_values, attention_mask, position_ids = _cache_defaults(
            input_ids, self.layout, self.dtype, past_key_values, attention_mask, position_ids)
        _check_position_ids(position_ids, self.info.lengths, high)
        flat = [t for kv in past_key_values for t in kv]
        out = self._program.run(self, (input_ids, attention_mask,
                                       *self._positions(position_ids), *flat))
        if not use_cache:
            return out[0]
        return out[0], tuple(zip(out[1::2], out[2::2]))

    def _static_step(self, input_ids: Tensor, attention_mask: Tensor | None,
                     position_ids: Tensor | None, cache: StaticCache, use_cache: bool,
                     cache_position: Tensor | None) -> Any:
        if cache_position is None or attention_mask is None or position_ids is None:
            raise TfgraphError("a static cache needs cache_position, attention_mask and "
                               "position_ids")
        cache_position = _check_static_step(input_ids, attention_mask, position_ids, cache,
                                            cache_position, self.info.lengths)
        self.cache_position = cache_position  # the model's own nodes: ALiBi, T5's bias
        for layer in self._layers.values():
            layer.cache_position = cache_position
        try:
            flat = [t for kv in cache for t in kv]
            out = self._program.run(self, (input_ids, attention_mask,
                                           *self._positions(position_ids), *flat))
        finally:
            self.cache_position = None
            for layer in self._layers.values():
                layer.cache_position = None
        return (out[0], cache) if use_cache else out[0]

    def static_cache(self, batch: int, length: int, device: str | torch.device | None = None,
                     dtype: torch.dtype | None = None) -> StaticCache:
        """A cache of ``length`` positions for ``batch`` rows, on the module's device and in
        its parameters' dtype unless ``device``/``dtype`` say otherwise; pass it as
        past_key_values with ``cache_position`` (the positions of this step's tokens) and an
        attention_mask over all ``length`` positions (0 for those not written yet)."""
        if not self.cached:
            return self.cached_model().static_cache(batch, length, device, dtype)
        for name, size in (("batch", batch), ("length", length)):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise TfgraphError(f"static_cache: {name} {size!r} must be a positive integer")
        # ``length`` counts slots, not positions: left-padded rows write their tokens at
        # slots ahead of their positions, so a learned table's max_len bounds the position
        # ids each step is given (_check_static_step), not the cache's length
        first = next(self.parameters(), None)
        if device is None:
            device = first.device if first is not None else torch.device("cpu")
        if dtype is None:
            dtype = first.dtype if first is not None and first.is_floating_point() \
                else self.dtype
        key, value = ((batch, self.layout.kv_heads, length, width)
                      for width in (self.layout.head_dim, self.layout.v_dim))
        element = torch.empty((), dtype=dtype).element_size()
        need = self.layout.layers * batch * self.layout.kv_heads * length * element * (
            self.layout.head_dim + self.layout.v_dim)
        _check_cache_memory(f"static_cache({batch}, {length})", need, torch.device(device))
        return StaticCache([(torch.zeros(key, dtype=dtype, device=device),
                             torch.zeros(value, dtype=dtype, device=device))
                            for _ in range(self.layout.layers)])

    def setup_cache(self, batch: int, length: int, device: str | torch.device | None = None,
                    dtype: torch.dtype | None = None) -> StaticCache:
        """Attach a static cache (``static_cache``) to the module as ``kv_cache``, its
        buffers the module's own (gpt-fast): a forward with ``cache_position`` and no
        past_key_values then reads and writes it, so a compiled step mutates buffers, not
        inputs, and CUDA graphs apply. Replaces any cache attached before. The cache is
        this very module's child (also on the full-sequence module, whose KV-cache part
        module is rebuilt when the parameters move), so ``named_buffers()`` lists it and
        ``.to()`` moves it with the parameters."""
        cache = self.static_cache(batch, length, device, dtype)
        self.kv_cache = cache
        return cache

    def release_cache(self) -> None:
        """Detach the cache ``setup_cache`` attached, so its buffers are freed with it (a
        no-op without one)."""
        if "kv_cache" in self._modules:
            del self.kv_cache

    def _attached_cache(self) -> StaticCache:
        attached = self._modules.get("kv_cache")
        if not isinstance(attached, StaticCache):
            raise TfgraphError("cache_position without past_key_values needs a cache "
                               "attached by setup_cache(batch, length)")
        return attached

    def cached_model(self) -> DecoderModel:
        """The module of this decoder's KV-cache graph: itself on a KV-cache graph, else one
        over the same parameter storage (rebuilt when the parameters move)."""
        if self.cached:
            return self
        module = self._part_module(None)
        assert isinstance(module, DecoderModel)
        return module


class EncoderModel(TorchModel):
    """An encoder-only model (BERT): ``forward(input_ids, token_type_ids=None, *,
    attention_mask=None, position_ids=None)``. Without a mask or positions the
    full-sequence graph runs; with either, the model's masked graph
    (``graph.info.cache_graph(None)``: attention_mask (B, S) and position_ids where
    positions are read, no past) over the same parameters, so padded batches train through
    it. past_key_values and use_cache are refused (TfgraphError): an encoder has no KV
    cache."""

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None, *,
                attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
                past_key_values: Sequence[tuple[Tensor, Tensor]] | None = None,
                use_cache: bool = False) -> Tensor:
        """input_ids (B, S) int64 -> logits or probs (B, S, vocab); with segment embeddings
        (embedding.token_types) also token_type_ids (B, S), every token in segment 0 when
        not given (Hugging Face's default). attention_mask (B, S): 1 real, 0 padding (no
        query reads a padding key; default all real); position_ids (B, S) int64: default
        0 .. S-1 in every row (BERT's, DistilBERT's, ModernBERT's default), a model whose
        positions are counted over the non-padding input_ids (RoBERTa) takes none."""
        if past_key_values is not None or use_cache:
            raise TfgraphError(f"{self.graph_name}: an encoder-only model has no KV cache "
                               "(past_key_values, use_cache); it takes attention_mask and "
                               "position_ids")
        if "token_type_ids" not in self.input_names:
            if token_type_ids is not None:
                raise TfgraphError(f"{self.graph_name}: takes no token_type_ids (its spec "
                                   "has no embedding.token_types)")
        elif token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        types = () if token_type_ids is None else (token_type_ids,)
        if self.info.kind != "cached":
            if attention_mask is None and position_ids is None:
                return self._run((input_ids, *types))
            masked = self._part_module(None)
            assert isinstance(masked, EncoderModel)
            return masked(input_ids, token_type_ids, attention_mask=attention_mask,
                          position_ids=position_ids)
        if position_ids is not None and "position_ids" not in self.input_names:
            raise TfgraphError(f"{self.graph_name}: takes no position_ids (its positions "
                               "are counted over input_ids, relative or none)")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device
                                        ).expand_as(input_ids)
        # a learned table's bound (RoBERTa, counting over input_ids, reaches S - 1 at most)
        _check_position_ids(position_ids, self.info.lengths)
        out: Tensor = self._program.run(self, (input_ids, *types, attention_mask,
                                               *self._positions(position_ids)))[0]
        return out


class EncoderDecoderModel(_CachedModel):
    """An encoder-decoder (the decoder attends to the encoder output): three calls, one per
    graph lowering makes of it (``graph.info``), each available on the full model too.

    ``translate(src_ids, tgt_ids)`` (the full model's ``forward``): the full-sequence graph.
    ``encode(src_ids, attention_mask=None, position_ids=None)``: the KV-cache encoder part,
    the encoder output and every decoder layer's cross-attention (key, value).
    ``decode(input_ids, encoder_key_values, encoder_attention_mask=None,
    attention_mask=None, position_ids=None, past_key_values=None, use_cache=False)``: one
    KV-cache decoder step. On the full model ``encode`` and ``decode`` run its KV-cache graphs
    over the same parameters; the modules of the two KV-cache graphs themselves
    (:class:`EncoderPartModel`, :class:`DecoderPartModel`) are this class with ``forward``
    bound to ``encode`` or ``decode`` (README, "KV cache"). Each forward keeps its own named
    arguments, which ``torch.export``'s dynamic shapes are keyed by."""

    def forward(self, src_ids: Tensor, tgt_ids: Tensor,
                attention_mask: Tensor | None = None) -> Tensor:
        """src_ids (B, S), tgt_ids (B, T) int64 -> logits or probs (B, T, target vocab);
        attention_mask (B, S): the source's padding mask (1 real, 0 padding), see translate."""
        return self.translate(src_ids, tgt_ids, attention_mask)

    def translate(self, src_ids: Tensor, tgt_ids: Tensor,
                  attention_mask: Tensor | None = None) -> Tensor:
        """src_ids (B, S), tgt_ids (B, T) int64 -> logits or probs (B, T, target vocab).

        Without ``attention_mask`` the full-sequence graph runs (every source token real).
        With it, (B, S) 1 real / 0 padding, the KV-cache graphs run over the same parameters:
        ``encode`` with the mask, then ``decode`` of the whole target at once (causal, an empty
        cache) reading only the real source tokens, whose positions count from the first real
        one; so a padded row gives the logits of the same row alone, and training through it
        (batches of sources of different lengths) sends the gradients to this module's
        parameters."""
        if self.cached:
            raise TfgraphError(f"{self.graph_name}: the KV-cache {self.info.part} part runs "
                               f"{'encode' if self.info.part == 'encoder' else 'decode'}, "
                               "not the full model")
        if attention_mask is None:
            return self._run((src_ids, tgt_ids))
        _, cross = self.encode(src_ids, attention_mask)
        logits: Tensor = self.decode(tgt_ids, cross, encoder_attention_mask=attention_mask)
        return logits

    def encode(self, src_ids: Tensor, attention_mask: Tensor | None = None,
               position_ids: Tensor | None = None) -> tuple[Tensor, tuple[Any, ...]]:
        """src_ids (B, S) int64, attention_mask (B, S) (1 real, 0 padding; default all
        real), position_ids (B, S) (default: real tokens counted from 0) -> the encoder
        output (B, S, d) and per decoder layer (key, value), each (B, kv, S, hd)."""
        if self.info.part != "encoder":
            module = self._part_module("encoder")
            assert isinstance(module, EncoderDecoderModel)
            return module.encode(src_ids, attention_mask, position_ids)
        high = _defaulted_high(src_ids, None, attention_mask, position_ids)
        if attention_mask is None:
            attention_mask = torch.ones_like(src_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        _check_position_ids(position_ids, self.info.lengths, high)
        out = self._program.run(self, (src_ids, attention_mask,
                                       *self._positions(position_ids)))
        return out[0], tuple(zip(out[1::2], out[2::2]))

    def decode(self, input_ids: Tensor, encoder_key_values: Sequence[tuple[Tensor, Tensor]],
               encoder_attention_mask: Tensor | None = None,
               attention_mask: Tensor | None = None, position_ids: Tensor | None = None,
               past_key_values: Sequence[tuple[Tensor, Tensor]] | None = None,
               use_cache: bool = False) -> Any:
        """input_ids (B, S) target tokens; encoder_key_values: the encoder part's (key,
        value) per layer; encoder_attention_mask (B, T) the source mask (default all real);
        attention_mask, position_ids, past_key_values, use_cache as DecoderModel's."""
        if self.info.part != "decoder":
            return self._part_module("decoder")(
                input_ids, encoder_key_values, encoder_attention_mask, attention_mask,
                position_ids, past_key_values, use_cache)
        high = _defaulted_high(input_ids, past_key_values, attention_mask, position_ids)
        past_key_values, attention_mask, position_ids = _cache_defaults(
            input_ids, self.layout, self.dtype, past_key_values, attention_mask, position_ids)
        _check_position_ids(position_ids, self.info.lengths, high)
        if encoder_attention_mask is None:
            encoder_attention_mask = input_ids.new_ones(
                (input_ids.shape[0], encoder_key_values[0][0].shape[2]))
        flat = [t for own, cross in zip(past_key_values, encoder_key_values)
                for t in (*own, *cross)]
        out = self._program.run(self, (input_ids, attention_mask,
                                       *self._positions(position_ids),
                                       encoder_attention_mask, *flat))
        if not use_cache:
            return out[0]
        return out[0], tuple(zip(out[1::2], out[2::2]))


class EncoderPartModel(EncoderDecoderModel):
    """The module of an encoder-decoder's KV-cache encoder part: ``forward`` is ``encode``."""

    forward = EncoderDecoderModel.encode  # type: ignore[assignment]


class DecoderPartModel(EncoderDecoderModel):
    """The module of an encoder-decoder's KV-cache decoder part: ``forward`` is ``decode``."""

    forward = EncoderDecoderModel.decode  # type: ignore[assignment]


class GraphModel(TorchModel):
    """The module of a graph built by hand (no architecture in ``graph.info``):
    ``forward(*inputs)`` takes the graph's inputs in its order (``input_names``) and returns
    its first output."""

    def forward(self, *inputs: Tensor) -> Any:
        if len(inputs) != len(self.input_names):
            raise TfgraphError(f"{self.graph_name}: takes {', '.join(self.input_names)}; "
                               f"got {len(inputs)} tensors")
        return self._run(inputs)


class LossModel(TorchModel):
    """A loss graph (``graph.info.kind == "loss"``, any architecture): the model, then the
    token cross-entropy against ``labels`` (tfgraph.graph.ops_loss)."""

    def forward(self, *inputs: Tensor) -> Tensor:
        """The graph's inputs in its order (``input_names``: the ids as the model takes them,
        then labels (B, L) int64) -> the mean cross-entropy over the B*L tokens, a float32
        scalar."""
        if len(inputs) != len(self.input_names):
            raise TfgraphError(f"{self.graph_name}: the loss model takes "
                               f"{', '.join(self.input_names)}; got {len(inputs)} tensors")
        return self._run(inputs)


def _region_paths(graph: Graph, region: Mapping[str, tuple[Any, ...]]
                  ) -> dict[tuple[Any, ...], str]:
    """Module path of each layer region: the outermost module its nodes are computed in
    (lowering declares it, e.g. "decoder.layers.3"; sublayers are its children)."""
    paths: dict[tuple[Any, ...], str] = {}
    for name, key in region.items():
        module = graph.node(name).meta.module
        if key not in paths or len(module) < len(paths[key]):
            paths[key] = module
    return paths


def _lowering(node: Node) -> Lowering:
    if node.op not in TORCH_OPS:
        raise TfgraphError(f"{node.name}: op {node.op!r} has no PyTorch lowering")
    return TORCH_OPS[node.op]


def _build(graph: Graph, walk: Plan, top: _Program,
           layers: dict[tuple[Any, ...], LayerModule],
           layer_paths: dict[tuple[Any, ...], str]) -> None:
    """Fill the model's program and every layer's from the plan's steps, in order."""
    region = walk.region
    buffers: dict[str, list[str]] = {}  # buffer -> every value living in it (aliases too)
    for name, buf in walk.owner.items():
        buffers.setdefault(buf, []).append(name)
    rope_tables: dict[tuple[Any, ...], str] = {}  # (length, table attrs) -> value name
    users_outside: dict[str, bool] = {}
    for n in graph.nodes():
        for i in n.inputs:
            if region.get(i) is not None and region.get(i) != region.get(n.name):
                users_outside[i] = True
    outputs = set(graph.outputs)

    # Layer programs, and the inputs each layer needs from its caller.
    layer_inputs: dict[tuple[Any, ...], list[str]] = {}
    layer_outputs: dict[tuple[Any, ...], list[str]] = {}
    for step in walk.steps:
        n = step.node
        key = region.get(n.name)
        if key is None:
            continue
        prog = layers[key]._program
        ins = layer_inputs.setdefault(key, [])
        for i in n.inputs:
            if i not in prog.slots and region.get(i) != key and not graph.node(i).is_param:
                ins.append(i)
                prog.inputs.append(prog.slot(i))
        args = tuple(prog.slots[i] for i in n.inputs)
        if n.op == "rope":
            # tables per sequence length, or (KV-cache graph) per token from position_ids
            axis = "#position_ids" if len(n.inputs) == 2 else str(n.type.shape[1])
            tkey: tuple[Any, ...] = (axis, *sorted(rope_table_attrs(n.attrs).items()))
            tname = rope_tables.setdefault(tkey, f"#rope_tables{len(rope_tables)}")
            if tname not in prog.slots:
                ins.append(tname)
                prog.inputs.append(prog.slot(tname))
            args += (prog.slots[tname],)
        _add_step(prog, n, args, step.overwrite, region, key, buffers, step.frees)
        if users_outside.get(n.name) or n.name in outputs:
            layer_outputs.setdefault(key, []).append(n.name)
            prog.outputs.append(prog.slots[n.name])

    # The model's program: its own ops, and one call per layer at the layer's first step.
    called: set[tuple[Any, ...]] = set()
    made_tables: set[str] = set()
    for step in walk.steps:
        n = step.node
        key = region.get(n.name)
        if key is None:
            args = tuple(top.slots[i] for i in n.inputs)
            _add_step(top, n, args, step.overwrite, region, None, buffers, step.frees)
            continue
        if key not in called:
            called.add(key)
            ins = layer_inputs[key]
            for tname in (i for i in ins if i.startswith("#rope_tables")):
                if tname in made_tables:
                    continue
                made_tables.add(tname)
                tkey = next(k for k, v in rope_tables.items() if v == tname)
                source = "position_ids" if tkey[0] == "#position_ids" else next(
                    i for i in ins if not i.startswith("#")
                    and str(graph.node(i).type.shape[1]) == tkey[0])
                table_attrs: dict[str, Any] = dict(tkey[1:])  # (name, value) pairs
                table_attrs["dtype"] = TORCH_DTYPES[graph.dtype]
                top.steps.append((rope_tables_step, table_attrs,
                                  (top.slots[source],), top.slot(tname), (), None, ()))
            layer = layers[key]
            layer.input_names = tuple(ins)
            layer.output_names = tuple(layer_outputs[key])
            outs = layer_outputs[key]
            call_out = top.slot(outs[0] if len(outs) == 1 else f"#{layer_paths[key]}")
            top.steps.append((_CallLayer(layer_paths[key]), {}, tuple(top.slots[i] for i in ins), call_out,
                              (), None, ()))
            if len(outs) > 1:
                for index, name in enumerate(outs):
                    top.steps.append((_pick, {"index": index}, (call_out,), top.slot(name),
                                      (), None, ()))
        if step.frees:  # buffers the caller held for the layer die with its last step
            dead = tuple(top.slots[v] for b in step.frees for v in buffers[b]
                         if v in top.slots and region.get(b) != key)
            if dead:
                fn, attrs, args, out, old, inplace, inplace_args = top.steps[-1]
                top.steps[-1] = (fn, attrs, args, out, old + dead, inplace, inplace_args)
    top.outputs = [top.slots[o] for o in graph.outputs]


def _add_step(prog: _Program, n: Node, args: tuple[int, ...], overwrite: int | None,
              region: dict[str, tuple[Any, ...]], key: tuple[Any, ...] | None,
              buffers: dict[str, list[str]], frees: tuple[str, ...]) -> None:
    out = prog.slot(n.name)
    inplace, inplace_args = None, args
    if overwrite is not None and n.op in TORCH_INPLACE:
        inplace = TORCH_INPLACE[n.op]
        if overwrite == 1:
            inplace_args = (args[1], args[0], *args[2:])
    # Inside a layer only its own buffers die (the caller frees what it passed in); at the
    # model's level every buffer with a slot here does, the layers' outputs included.
    dead = tuple(prog.slots[v] for b in frees if key is None or region.get(b) == key
                 for v in buffers[b] if v in prog.slots)
    prog.steps.append((_lowering(n), n.attrs, args, out, tuple(dict.fromkeys(dead)), inplace,
                       inplace_args))


def _as_tensors(graph: Graph, weights: Mapping[str, Any], dtype: torch.dtype,
                source: str) -> dict[str, Tensor]:
    """Check names and shapes against the graph, then convert to ``dtype`` tensors."""
    check_weights(weight_shapes(weights), graph, source)
    out = {}
    for name, value in weights.items():
        t = value.detach() if isinstance(value, Tensor) else torch.from_numpy(np.asarray(value))
        out[name] = t.to(device="cpu", dtype=dtype, copy=True)
    return out


def torch_build_bytes(graph: Graph, given: bool) -> int:
    """Host memory :func:`to_torch` holds at once for ``graph``'s weights, from the shapes
    alone. Generated: every parameter in float32 (``generate``), plus its cast copy at a
    16-bit dtype (the float32 dict lives until the module has them all; a float32 tensor
    shares the numpy array's memory). Given: one copy at the model's dtype (``_as_tensors``
    copies; the caller's values are already resident). Measured on an 8-layer TinyLlama
    (1.9 GB in float32): peak 1.00x the weights (float32), 3.00x (bfloat16), 1.00x given."""
    at_dtype = weights_bytes(graph)
    if given:
        return at_dtype
    float32 = 4 * sum(math.prod(p.attrs["shape"]) for p in graph.params())
    return float32 + (0 if graph.dtype == "float32" else at_dtype)


def to_torch(graph: Graph, seed: int = 0, weights: Mapping[str, Any] | None = None,
             device: str | torch.device | None = None) -> TorchModel:
    """The module for ``graph`` at the graph's dtype, in eval mode.

    Weights: ``weights`` (numpy arrays or tensors by parameter name, e.g. another module's
    ``state_dict()``; names and shapes checked, TfgraphError listing what is missing,
    unexpected or mis-shaped), else ``tfgraph.graph.weights.generate(graph, seed)``, the generator
    the ONNX back end shares, so one seed gives the same weights in both.

    ``device="meta"``: parameters with shapes and no storage, nothing generated (``weights``
    and ``seed`` unused), to shard first and initialise after (``parallelize``,
    ``load_full_state_dict``); another device: the weights moved there.

    Raises TfgraphError before anything is allocated when the weights and the copies made
    of them (:func:`torch_build_bytes`) cannot fit in the memory available, and when
    ``graph`` is not a graph (a spec, a path).
    """
    expect_graph(graph)
    dtype = TORCH_DTYPES[graph.dtype]
    if device is not None and torch.device(device).type == "meta":
        shapes = {p.name: tuple(p.attrs["shape"]) for p in graph.params()}
        return _model_class(graph)(graph, {n: torch.empty(s, dtype=dtype, device="meta")
                                           for n, s in shapes.items()}).eval()
    need = torch_build_bytes(graph, given=weights is not None)
    check_weight_memory(f"{graph.name}: the torch module", need, weights_bytes(graph))
    if weights is None:
        values = {n: torch.from_numpy(a).to(dtype) for n, a in generate(graph, seed).items()}
    else:
        values = _as_tensors(graph, weights, dtype, "weights")
    if device is not None:
        values = {n: v.to(device) for n, v in values.items()}
    return _model_class(graph)(graph, values).eval()


MODEL_CLASSES: dict[str, type[TorchModel]] = {
    "decoder-only": DecoderModel, "encoder-only": EncoderModel,
    "encoder-decoder": EncoderDecoderModel,
}
"""The module class of each architecture (``graph.info.arch``); a loss graph's is LossModel,
an encoder-decoder's KV-cache parts EncoderPartModel and DecoderPartModel (EncoderDecoderModel
with forward bound to encode or decode); a graph built by hand (no architecture) GraphModel,
whose forward takes the graph's inputs in order."""


def _model_class(graph: Graph) -> type[TorchModel]:
    """Which module class computes ``graph``: lowering's word for it (``graph.info``)."""
    info = graph.info
    if info.kind == "loss":
        return LossModel
    if info.arch == "encoder-decoder" and info.kind == "cached":
        return EncoderPartModel if info.part == "encoder" else DecoderPartModel
    return MODEL_CLASSES.get(info.arch, GraphModel)
