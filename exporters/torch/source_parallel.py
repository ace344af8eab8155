"""model.py's tensor-parallel plan and sharding: ``TP_PLAN`` (module path -> style, layer
indices as ``*``, the way Hugging Face's ``base_model_tp_plan`` is written), ``check_tp`` and
``parallelize(model, mesh, tp, fsdp)``, the same recipe as ``tfgraph.exporters.parallelize``
(PyTorch's ``ColwiseParallel`` / ``RowwiseParallel``, then FSDP2 ``fully_shard`` per layer and
on the root) written out so that model.py still imports only torch.

The plan is ``tfgraph.parallel.tp_plan``'s, so model.py holds per rank what the planner
counts. A tied token table is split by vocabulary rows for both its readers: the embedding by
``RowwiseParallel`` (``vocab_embedding``), the head by model.py's ``tied_head`` (the same
rows: the weights stay tied), and the head's bias beside it by rows too (``vocab_rows``:
``distribute_tensor``'s ``Shard(0)``). model.py's attention and rotary calls read their head
counts from the local widths (``torch_ops``' templates), so nothing else changes under tensor
parallelism. Stacked experts are split only by ``to_torch``'s ``parallelize``: model.py's
``check_tp`` refuses tp > 1 for them, and for T5's relative position bias and full-width
query/key norms, as ``parallelize`` does.
"""

from __future__ import annotations

import re

from tfgraph.graph.ir import Graph
from tfgraph.graph.ops import OPS
from tfgraph.parallel.tp_plan import colwise_projection, tp_plan

__all__ = ["parallel_source"]


def _plan(graph: Graph) -> dict[str, str]:
    """Module path pattern -> "colwise" | "rowwise" | "vocab" | the style model.py refuses."""
    # token tables (operand 0 of a gather) and linear maps' weights and biases (operands 1
    # and 2 of a projection): OpDef.tp, TpRule
    embedded = {n.inputs[0] for n in graph.ops() if OPS[n.op].tp == "gather"}
    # the bias of a tied head (a linear over a table): its owner holds no linear
    tied_bias = {n.inputs[2] for n in graph.ops() if OPS[n.op].tp == "project"
                 and n.inputs[1] in embedded and len(n.inputs) > 2}
    plan: dict[str, str] = {}
    for name, shard in tp_plan(graph).items():
        path, _, leaf = name.rpartition(".")
        if name in tied_bias:
            plan[path] = "vocab_rows"
            continue
        pattern = re.sub(r"\.layers\.\d+\.", ".layers.*.", path)
        if shard.style in ("colwise", "vocab") or (shard.style == "rowwise"
                                                   and leaf == "weight"):
            style: str = shard.style
            if style == "vocab":
                style = "vocab_embedding" if name in embedded else "vocab_head"
            plan[pattern] = style
        elif shard.style != "replicate" and shard.style != "rowwise":
            plan[pattern] = shard.style  # check_tp refuses it
    return plan


def _refusals(graph: Graph) -> list[str]:
    """Why tensor parallelism cannot run on model.py for this graph (empty: it can)."""
    shards = tp_plan(graph)
    why = []
    for node in graph.ops():
        opdef = OPS[node.op]
        if opdef.tp_refused_source is not None:
            why.append(opdef.tp_refused_source)
        if opdef.tp_refused is not None:
            why.append(f"{opdef.tp_refused} is not split")
        if opdef.category == "norm" and "heads" not in node.attrs:
            if colwise_projection(graph, node.inputs[0], shards):
                why.append("a norm over a whole split projection needs statistics across "
                           "ranks")
    return sorted(set(why))


def parallel_source(graph: Graph) -> str:
    """The TP_PLAN, check_tp and parallelize section of model.py for ``graph``."""
    heads = sorted({(k, n.attrs[k]) for n in graph.ops() for k in ("heads", "kv_heads")
                    if k in n.attrs})
    plan = _plan(graph)
    dims = sorted({(name, shard.tp_dim, graph.node(name).attrs["shape"][shard.tp_dim])
                   for name, shard in tp_plan(graph).items() if shard.tp_dim is not None})
    entries = "".join(f'    "{k}": "{v}",\n' for k, v in plan.items())
    counts = sorted({count for _, count in heads} | {size for _, _, size in dims})
    refusals = _refusals(graph)
    return f'''# ---- tensor parallelism and FSDP2 (torchrun; tfgraph.parallel.tp_plan) ------------
# Module path -> how its weight is cut across tensor-parallel ranks (Megatron-LM, Shoeybi et
# al. 2019): colwise by output rows, rowwise by input columns (output all-reduced),
# vocab_embedding / vocab_head by vocabulary rows (a tied head reads its table's rows:
# tied_head), vocab_rows a tied head's bias by rows. Unlisted parameters are whole on every
# rank.
TP_PLAN = {{
{entries}}}
# Every head count and split dimension tp must divide (a rank holds whole heads).
TP_DIVIDES = {tuple(counts)!r}
TP_REFUSED = {tuple(refusals)!r}


def check_tp(tp: int) -> None:
    """ValueError when tensor-parallel degree ``tp`` cannot split this model."""
    if tp > 1 and TP_REFUSED:
        raise ValueError(f"tensor parallelism: {{TP_REFUSED[0]}}")
    for count in TP_DIVIDES:
        if count % tp:
            raise ValueError(f"--tp {{tp}} does not divide {{count}} (heads or a split "
                             "dimension)")


def parallelize(model: nn.Module, mesh: torch.distributed.device_mesh.DeviceMesh, tp: int = 1,
                fsdp: bool = True) -> nn.Module:
    """Shard ``model`` in place (build it on the meta device first, load weights after):
    TP_PLAN's styles over ``mesh["tp"]`` when tp > 1, then FSDP2 ``fully_shard`` of every
    layer and of the root over ``mesh["dp"]``. ``mesh``: dimensions named "dp" and "tp"."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    check_tp(tp)
    if tp > 1:
        styles = {{"colwise": ColwiseParallel, "rowwise": RowwiseParallel,
                   "vocab_embedding": lambda: RowwiseParallel(input_layouts=Replicate()),
                   "vocab_head": lambda: ColwiseParallel(output_layouts=Replicate())}}
        parallelize_module(model, mesh["tp"], {{path: styles[style]()
                                                for path, style in TP_PLAN.items()
                                                if style != "vocab_rows"}})
        for path, style in TP_PLAN.items():
            if style == "vocab_rows":  # a tied head's bias: its rows, as tied_head's table
                owner = model.get_submodule(path)
                for leaf, param in list(owner.named_parameters(recurse=False)):
                    owner.register_parameter(leaf, nn.Parameter(
                        distribute_tensor(param, mesh["tp"], [Shard(0)]), param.requires_grad))
    if fsdp:
        for name, module in model.named_modules():
            stack, _, index = name.rpartition(".")
            if stack.endswith("layers") and index.isdigit():  # decoder.layers.3
                fully_shard(module, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
    return model'''
