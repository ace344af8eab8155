"""FSDP2's copy kernels in the plan (``tfgraph.parallel.fsdp_copies``) against the copies
``fully_shard`` itself runs: one process (gloo), tfgraph's module sharded by ``parallelize``
with bfloat16 compute and float32 reduction, every op inside an ``FSDP::`` profiler scope
recorded with the bytes it reads and writes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.exporters.torch.parallel import parallelize
from tfgraph.parallel.fsdp_copies import copy_kernels
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.planner import plan

from conftest import ROOT
from test_torch_module import make_ids

NO_KERNEL = {"aten.empty", "aten.view", "aten.as_strided", "aten.detach", "aten.alias"}


def _nbytes(x: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tree_leaves(x) if isinstance(t, torch.Tensor))


class FsdpCopies(TorchDispatchMode):
    """Bytes each kernel inside FSDP2's own profiler scopes moves: reads its tensor operands
    (an in-place copy's destination is written, not read) and writes its results."""

    def __init__(self) -> None:
        super().__init__()
        self.scopes: list[str] = []
        self.kernels: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func.overloadpacket)
        if name == "profiler._record_function_enter_new":
            self.scopes.append(args[0])
        elif name == "profiler._record_function_exit":
            self.scopes.pop()
        elif any(s.startswith("FSDP::") for s in self.scopes) and name not in NO_KERNEL:
            if name == "aten.copy_":  # reads src, writes self
                moved = _nbytes(args[1]) + _nbytes(args[0])
            elif name == "fsdp.chunk_cat":  # reads the gradients, writes ``out``
                moved = _nbytes(args[0]) + _nbytes(kwargs["out"])
            else:
                moved = _nbytes(args) + _nbytes(out)
            self.kernels.append((name, moved))
        return out


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-moe", "tiny-deepseek-v3", "tiny-decoder",
                                  "tiny-t5"])
def test_the_plans_fsdp_copies_are_fully_shards_own(one_rank, name: str) -> None:
    spec = tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml")
    graph = tfgraph.compile(spec.model_copy(update={"dtype": "bfloat16"}), loss=True)
    module = to_torch(tfgraph.compile(spec, loss=True), seed=0)  # float32 master weights
    parallelize(module, one_rank, mp_policy=MixedPrecisionPolicy(
        param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    vocab = int(graph.node("logits").type.shape[-1])
    labels = torch.randint(0, vocab, (2, 6 if "tgt_ids" in graph.inputs else 8))
    inputs = (*make_ids(tfgraph.compile(spec), 2, 8, 6), labels)
    module(*inputs).backward()  # the first step sets FSDP2 up
    module.zero_grad(set_to_none=True)
    mode = FsdpCopies()
    with mode:
        module(*inputs).backward()
    groups = _groups(graph)
    predicted = copy_kernels(graph, groups, Layout(zero=3, dtype="bfloat16"))
    assert sorted(b for _, b in predicted) == sorted(b for _, b in mode.kernels)
    assert len(predicted) > 4 * len(groups)


def _groups(graph: tfgraph.CompiledGraph) -> list[list[str]]:
    """FSDP2's groups as ``parallelize`` makes them: one per layer, the rest the root's."""
    from tfgraph.parallel.units import units
    layers, root = [], []
    for unit in units(graph)[0]:
        (layers.append(list(unit.params)) if unit.is_layer else root.extend(unit.params))
    return [*layers, list(dict.fromkeys(root))]


def test_an_eager_zero_3_plan_times_the_copies_and_only_then() -> None:
    from tfgraph.exporters.torch.kernels import kernel_source
    from tfgraph.parallel import timing

    graph = tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "tiny-llama.yaml").model_copy(
        update={"dtype": "bfloat16"}), loss=True)
    h100 = gpu("h100")
    source = kernel_source(graph)
    layout = Layout(zero=3, micro_batch=2, global_batch=4, seq=16, dtype="bfloat16")
    parts = plan(graph, layout, h100, kernels=source)["step"]["time_parts"]
    bandwidth = h100.bandwidth * h100.memory_fraction
    per_microbatch = sum(max(b / bandwidth, timing.LAUNCH_S)
                         for _, b in copy_kernels(graph, _groups(graph), layout))
    assert parts["fsdp_copies"] == pytest.approx(2 * per_microbatch)  # 2 micro-batches
    # the second micro-batch's sharded float32 gradients are added to the first's
    step = plan(graph, layout, h100, kernels=source)
    held = step["per_rank"]["memory"]["gradients"]
    assert parts["grad_accumulation"] == pytest.approx(3 * held / bandwidth, rel=1e-6)
    # one kernel per graph op (fused execution) or ZeRO 2: no FSDP2 copies
    assert plan(graph, layout, h100)["step"]["time_parts"]["fsdp_copies"] == 0
    zero2 = Layout(zero=2, micro_batch=2, global_batch=4, seq=16, dtype="bfloat16")
    assert plan(graph, zero2, h100, kernels=source)["step"]["time_parts"]["fsdp_copies"] == 0


def test_several_ranks_gather_and_reduce_each_group_through_flat_buffers() -> None:
    """``foreach_all_gather``: cast into a flat buffer, copy into the all-gather input, copy out
    to the unsharded parameters; ``foreach_reduce``: one float32 copy-in, then NCCL."""
    graph = tfgraph.compile(tfgraph.load_spec(ROOT / "specs" / "tiny-llama.yaml").model_copy(
        update={"dtype": "bfloat16"}), loss=True)
    groups = _groups(graph)
    kernels = copy_kernels(graph, groups, Layout(zero=3, dp=4, dtype="bfloat16"))
    per_group = ["fsdp.foreach_cast", "fsdp.all_gather_copy_in",
                 "fsdp.split_with_sizes_copy"] * 2 + ["fsdp.chunk_cat"]
    assert [n for n, _ in kernels] == per_group * len(groups)
    first = kernels[:len(per_group)]
    whole = sum(int(torch.tensor(graph.node(p).attrs["shape"]).prod()) for p in groups[0])
    assert first[2][1] == whole * 2 * 2  # read the gathered 16-bit copy, write the parameters
    assert first[1][1] < first[2][1] / 3  # a quarter of it, rounded up per tensor
    fp32 = copy_kernels(graph, groups, Layout(zero=3, dp=4, dtype="float32"))
    assert "fsdp.foreach_cast" not in {n for n, _ in fp32}  # no mixed precision: no cast
