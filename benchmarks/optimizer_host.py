"""Host time of one AdamW step on FSDP2's DTensor parameters: the per-tensor loop
(``foreach=False``) against foreach kernels (what examples/train_distributed.py uses).

    python benchmarks/optimizer_host.py [--spec specs/llama.yaml]

`tfgraph plan` times the optimizer step as the foreach kernels' memory traffic; the per-tensor
loop adds a dozen DTensor-dispatched operations for each parameter tensor, host time no GPU
hides (an H100 FSDP2 step of llama.yaml took 1.9x the plan's prediction with it;
benchmarks/RESULTS.md). To measure that host time alone, each of the spec's parameter tensors
(counted on the meta device) is stood in for by an 8 x 8 one, sharded by ``fully_shard`` per
layer on one gloo rank, so the arithmetic is nil: what is left is dispatch.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

ROOT = Path(__file__).resolve().parent.parent


def tensor_count(spec_path: Path) -> tuple[int, int]:
    """(parameter tensors, layers) of the spec's torch module, built on the meta device."""
    import tfgraph
    from tfgraph.exporters import to_torch

    spec = tfgraph.load_spec(spec_path)
    with torch.device("meta"):
        module = to_torch(tfgraph.compile(spec))
    layers = spec.layers if isinstance(spec.layers, int) else (spec.layers.encoder
                                                              + spec.layers.decoder)
    return sum(1 for _ in module.parameters()), layers


def stand_in(tensors: int, layers: int) -> nn.Module:
    """``tensors`` 8 x 8 parameters: ``layers`` blocks sharing them evenly, the rest at the top,
    each block and the whole sharded as train_distributed.py shards the model."""
    per_layer = tensors // layers
    model = nn.Module()
    model.layers = nn.ModuleList(nn.ParameterDict(
        {f"w{i}": nn.Parameter(torch.randn(8, 8)) for i in range(per_layer)})
        for _ in range(layers))
    model.rest = nn.ParameterDict({f"w{i}": nn.Parameter(torch.randn(8, 8))
                                   for i in range(tensors - per_layer * layers)})
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    return model


def step_ms(params: list[nn.Parameter], foreach: bool, repeat: int) -> float:
    optimizer = torch.optim.AdamW(params, lr=1e-3, foreach=foreach)
    for p in params:
        p.grad = torch.zeros_like(p)
    times = []
    for _ in range(repeat + 2):  # two warm-ups: the states are made by the first step
        start = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "specs" / "llama.yaml")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    tensors, layers = tensor_count(args.spec)
    with socket.socket() as s:  # a free port for this one-rank group's store
        s.bind(("127.0.0.1", 0))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(s.getsockname()[1]))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        params = list(stand_in(tensors, layers).parameters())
        loop = step_ms(params, False, args.repeat)
        foreach = step_ms(params, True, args.repeat)
    finally:
        dist.destroy_process_group()
    print(f"{args.spec.name}: {len(params)} parameter tensors ({type(params[0]).__name__}), "
          f"one gloo rank, {os.cpu_count()} cores")
    print(f"AdamW step, host time: foreach=False {loop:.1f} ms, foreach=True {foreach:.1f} ms "
          f"({loop / foreach:.1f}x)")


if __name__ == "__main__":
    main()
