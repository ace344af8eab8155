"""The report's numbers against what PyTorch measures on the emitted module.

- FLOPs: ``FlopCounterMode`` with explicit-matmul attention (it counts 0 for the CPU SDPA
  kernel) equals ``report['flops']['matmul']`` exactly, for every spec at two shapes.
- Saved bytes: the tensors ``saved_tensors_hooks`` sees in one training forward (each storage
  once, parameters excluded) are within 5% of ``report['memory']['saved_for_backward']``.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.schema import Spec

from conftest import tgt_for
from parity_support import saved_storages
from test_torch_module import make_ids

SHAPES = [(2, 9, 7), (3, 16, 5)]  # (batch, seq, tgt_seq)


@pytest.mark.parametrize("batch,seq,tgt", SHAPES)
def test_flop_counter_equals_report_matmul(small_spec: Spec, batch: int, seq: int,
                                           tgt: int) -> None:
    graph = tfgraph.compile(small_spec)
    module = to_torch(graph)
    module.attention_impl = "math"
    ids = make_ids(graph, batch, seq, tgt)
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        module(*ids)
    report = graph.report(batch=batch, seq=seq, tgt_seq=tgt_for(graph, tgt))
    assert counter.get_total_flops() == report["flops"]["matmul"]


def test_sdpa_and_math_attention_agree(small_spec: Spec) -> None:
    graph = tfgraph.compile(small_spec)
    module = to_torch(graph, seed=1)
    ids = make_ids(graph, 2, 11, 6)
    with torch.no_grad():
        fused = module(*ids).float()
        module.attention_impl = "math"
        explicit = module(*ids).float()
    tol = 1e-5 if small_spec.dtype == "float32" else 2e-2
    torch.testing.assert_close(fused, explicit, atol=tol, rtol=0)


def saved_bytes(module: torch.nn.Module, ids: tuple[torch.Tensor, ...]) -> int:
    """Bytes of the distinct non-parameter storages autograd saves in one forward."""
    with saved_storages(module) as seen:
        out = module(*ids)  # kept until the block ends: its graph holds what was saved
    del out
    return sum(seen.values())


def test_saved_for_backward_matches_report(small_spec: Spec) -> None:
    # The report counts the fused attention kernel (no dropout mask: FlashAttention redraws
    # it); on the CPU, attention dropout runs the explicit form instead, whose extra mask and
    # dropped-out weights tests/test_attention_dropout.py checks. Here: without it.
    spec = small_spec.model_copy(update={"attention": small_spec.attention.model_copy(
        update={"dropout": 0.0})})
    graph = tfgraph.compile(spec)
    module = to_torch(graph).train()  # dropout active: its masks are saved too
    batch, seq, tgt = 2, 12, 10
    measured = saved_bytes(module, make_ids(graph, batch, seq, tgt))
    expected = graph.report(batch=batch, seq=seq, tgt_seq=tgt_for(graph, tgt))["memory"]["saved_for_backward"]
    assert abs(measured - expected) <= 0.05 * expected, (measured, expected)
