"""One torchrun rank of tests/test_sequence_parallel.py. argv[1] is a JSON list of runs, argv[2]
the JSON file rank 0 writes one result per run to:

- {"spec", "tp", "fsdp", "steps", "batch", "seq", "sp"}: train ``parallelize(..., sp=sp)``
  (default True; an encoder-decoder reads the ids as source and target, a model with
  token types, BERT, the ids modulo the number of types as its segment ids) and, on every rank,
  the whole one-process module from the same weights on
  the same batches (AdamW); the result: the largest difference of their outputs in eval
  mode without autograd (in-place steps), both modules' losses, each parameter's largest
  gradient difference from the one-process one after the first backward, the norm gains'
  names and gradient placements, and the local shapes the first layer received and returned
  (a forward hook);
- {"example": [...]}: examples/train_distributed.py with those arguments, its result.

A run that raises TfgraphError gives {"error": message}. Every rank computes the one-process
reference itself: the comparison needs no second launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.distributed.tensor import DTensor

import tfgraph
from distributed_support import run_cases_or_examples
from tfgraph.exporters import device_mesh, load_full_state_dict, parallelize, to_torch
from tfgraph.exporters.torch.module import NormWeights
from tfgraph.graph.ir import Graph

ROOT = Path(__file__).resolve().parents[1]


def _whole(t: Tensor) -> Tensor:
    """The whole tensor a (possibly sharded or partial) DTensor stands for."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def _batch(step: int, batch: int, seq: int, vocab: int) -> Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, vocab, (batch, seq + 1), generator=g)


def _inputs(graph: Graph, ids: Tensor) -> list[Tensor]:
    """The module's inputs from one batch of ids: every token stream reads them (source and
    target of an encoder-decoder), the segment ids (``token_type_ids``) are the ids modulo
    the number of token types (both types present)."""
    types = graph.node("embed.token_types.weight").attrs["shape"][0] \
        if "token_type_ids" in graph.inputs else 1
    return [ids % types if name == "token_type_ids" else ids for name in graph.inputs]


def _grad_differences(parallel: nn.Module, single: nn.Module) -> dict[str, float]:
    """Parameter name -> max |parallel gradient - one-process gradient| (0 where neither
    has one, infinity where only one has)."""
    mine = dict(parallel.named_parameters())
    out = {}
    for name, p in single.named_parameters():
        got, want = mine[name].grad, p.grad
        if got is None or want is None:
            out[name] = 0.0 if got is None and want is None else float("inf")
        else:
            out[name] = float((_whole(got) - want).abs().max())
    return out


def run(case: dict[str, Any]) -> dict[str, Any]:
    """One module comparison (module docstring)."""
    # dropout off (tiny-bert's 0.1): the two modules would draw different random masks
    spec = tfgraph.load_spec(ROOT / case["spec"]).model_copy(update={"dropout": 0.0})
    graph = tfgraph.compile(spec)
    vocab = int(graph.node(graph.outputs[0]).type.shape[-1])
    single = to_torch(graph, seed=0)  # eval mode
    mesh = device_mesh("cpu", case["tp"])
    model = parallelize(to_torch(graph, device="meta"), mesh, tp=case["tp"],
                        fsdp=case["fsdp"], sp=case.get("sp", True))
    load_full_state_dict(model, "cpu", single.state_dict() if dist.get_rank() == 0 else {})
    ids = _batch(-1, case["batch"], case["seq"], vocab)[:, :-1]
    with torch.no_grad():  # the in-place steps inference runs
        inference = float((model.eval()(*_inputs(graph, ids)) - single(*_inputs(graph, ids)))
                          .abs().max())
    model.train()
    single.train()
    shapes: list[list[list[int]]] = []
    model.layers()[0].register_forward_hook(
        lambda mod, args, out: shapes.append([list(args[0].shape), list(out.shape)]))
    norms = {f"{name}.{leaf}" for name, m in single.named_modules()
             if isinstance(m, NormWeights) for leaf, _ in m.named_parameters()}
    optimizers = [torch.optim.AdamW(m.parameters(), lr=3e-3, foreach=False)
                  for m in (model, single)]
    losses: dict[str, list[float]] = {"parallel": [], "single": []}
    grads: dict[str, float] = {}
    for step in range(case["steps"]):
        tokens = _batch(step, case["batch"], case["seq"], vocab)
        for key, module, optimizer in zip(losses, (model, single), optimizers):
            logits = module(*_inputs(graph, tokens[:, :-1]))
            loss = F.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            losses[key].append(loss.item())
        if step == 0:
            grads = _grad_differences(model, single)
        for optimizer in optimizers:
            optimizer.step()
    grad_placements = sorted({str(p.grad.placements) for name, p in model.named_parameters()
                              if name in norms and isinstance(p.grad, DTensor)})
    return {"losses": losses, "layer_shapes": shapes[0], "grad_differences": grads,
            "norms": sorted(norms), "norm_grad_placements": grad_placements,
            "inference_difference": inference}


def main() -> None:
    run_cases_or_examples(run)


if __name__ == "__main__":
    main()
