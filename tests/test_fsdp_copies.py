"""FSDP2's copy kernels in the plan (``tfgraph.parallel.fsdp_copies``) against the kernels
``fully_shard`` itself runs (tests/fsdp_recorder.py: every op inside FSDP2's ``FSDP::``
profiler scopes with the bytes it moves), on one gloo rank in this process and on two under
torchrun: the gathers' casts and copies, the gradients' copy-in, and the later micro-batch's
accumulation into the sharded gradients."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import tfgraph
from tfgraph.exporters.torch.kernels import kernel_source
from tfgraph.parallel import timing
from tfgraph.parallel.fsdp_copies import (accumulate_kernels, copy_kernels, fsdp_groups,
                                          subgroups)
from tfgraph.parallel.gpus import gpu
from tfgraph.parallel.layout import Layout
from tfgraph.parallel.planner import plan
from tfgraph.parallel.units import units

from conftest import ROOT
from distributed_support import torchrun
from fsdp_recorder import record_step


def _graph(name: str, dtype: str, vocab: int | None = None) -> tfgraph.CompiledGraph:
    spec = tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml")
    update = {"dtype": dtype, **({"vocab": vocab} if vocab else {})}
    return tfgraph.compile(spec.model_copy(update=update), loss=True)


def _groups(graph: tfgraph.CompiledGraph) -> list[list[str]]:
    """FSDP2's groups of the whole model, as ``parallelize`` makes them."""
    return fsdp_groups(graph, [(i, 1) for i in range(len(units(graph)[0]))])


def _predicted(graph: tfgraph.CompiledGraph, layout: Layout) -> list[int]:
    groups = _groups(graph)
    return [b for _, b in copy_kernels(graph, groups, layout)
            + accumulate_kernels(graph, groups, layout)]


@pytest.fixture
def one_rank():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-moe", "tiny-deepseek-v3", "tiny-decoder",
                                  "tiny-t5"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_one_ranks_copies_are_fully_shards_own(one_rank, name: str, dtype: str) -> None:
    """Tied tables, MoE, DeepSeek-V3's frozen router bias (gathered, never reduced), T5's
    encoder-decoder; float32 compute casts nothing."""
    recorded = record_step(name, one_rank, dtype)
    predicted = _predicted(_graph(name, dtype), Layout(zero=3, dtype=dtype))
    assert sorted(b for _, b, _ in recorded) == sorted(predicted)
    ops = collections.Counter(op for op, _, _ in recorded)
    assert ops["aten.add_"] > 0 and ops["fsdp.chunk_cat"] == len(_groups(_graph(name, dtype)))
    assert (ops["aten._to_copy"] > 0) == (dtype == "bfloat16")


JOBS = [{"spec": "tiny-llama", "dtype": "bfloat16"},
        {"spec": "tiny-llama", "dtype": "float32", "vocab": 255},  # dim 0 padded to 256
        {"spec": "tiny-moe", "dtype": "bfloat16", "ep": 2}]  # experts: one rank, divided


def test_two_ranks_copies_are_fully_shards_own(tmp_path: Path) -> None:
    """Two data-parallel ranks: the foreach cast, the all-gather's copy-in and copy-out (dim 0
    padded to a multiple of the ranks), the gradients' copy-in; expert-parallel experts (ep 2:
    one rank each) copied and divided by dp. gloo's reduce-scatter also copies its output
    shard once per group (NCCL writes it in place): added to the prediction here."""
    out = tmp_path / "kernels.json"
    torchrun(2, Path(__file__).parent / "fsdp_copies_worker.py", JOBS, out)
    for job, recorded in zip(JOBS, json.loads(out.read_text())):
        graph = _graph(job["spec"], job["dtype"], job.get("vocab"))
        layout = Layout(zero=3, dp=2, ep=job.get("ep", 1), dtype=job["dtype"])
        gloo = [2 * 4 * sum(part for part, _, _, reduced in sizes if reduced)
                for group in _groups(graph)
                for ranks, _, sizes in subgroups(graph, group, layout) if ranks > 1]
        assert sorted(b for _, b, _ in recorded) == sorted(_predicted(graph, layout) + gloo), job
        ops = {op for op, _, _ in recorded}
        assert {"fsdp.all_gather_copy_in", "fsdp.split_with_sizes_copy"} <= ops
        assert ("aten.div" in ops) == ("ep" in job)


def test_an_eager_zero_3_plan_times_the_copies_and_only_then() -> None:
    graph = _graph("tiny-llama", "bfloat16")
    h100 = gpu("h100")
    source = kernel_source(graph)
    layout = Layout(zero=3, micro_batch=2, global_batch=4, seq=16, dtype="bfloat16")
    parts = plan(graph, layout, h100, kernels=source)["step"]["time_parts"]
    bandwidth = h100.streaming  # FSDP2's copies stream

    def seconds(kernels):
        return sum(max(b / bandwidth, timing.LAUNCH_S) for _, b in kernels)  # 4 us at least

    groups = _groups(graph)
    assert parts["fsdp_copies"] == pytest.approx(2 * seconds(copy_kernels(graph, groups, layout)))
    # the second micro-batch's sharded float32 gradients are added to the first's, one
    # kernel per tensor
    assert parts["grad_accumulation"] == pytest.approx(
        seconds(accumulate_kernels(graph, groups, layout)))
    # one kernel per graph op (fused execution) or ZeRO 2: no FSDP2 copies
    assert plan(graph, layout, h100)["step"]["time_parts"]["fsdp_copies"] == 0
    zero2 = Layout(zero=2, micro_batch=2, global_batch=4, seq=16, dtype="bfloat16")
    assert plan(graph, zero2, h100, kernels=source)["step"]["time_parts"]["fsdp_copies"] == 0
