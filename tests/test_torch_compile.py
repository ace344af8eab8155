"""Ready for real use: torch.compile matches eager; torch.export with dynamic batch and length.

torch.compile (inductor) takes tens of seconds on a 2-core machine, so it runs on one tiny
model (one layer); export is cheap and runs on both forward signatures.
"""

from __future__ import annotations

import torch

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.loader import load_spec

from conftest import ROOT, small
from test_torch_module import make_ids


def _graph(name: str, max_layers: int = 2) -> tfgraph.graph.ir.Graph:
    return tfgraph.compile(small(load_spec(ROOT / "specs" / name), max_layers=max_layers))


def test_torch_compile_matches_eager() -> None:
    graph = _graph("tiny-llama.yaml", max_layers=1)  # rope, GQA, rmsnorm, swiglu
    module = to_torch(graph, seed=1)
    compiled = torch.compile(module)
    with torch.no_grad():
        for batch, seq in ((2, 9), (3, 13)):
            ids = make_ids(graph, batch, seq, seq)
            torch.testing.assert_close(compiled(*ids), module(*ids), atol=1e-5, rtol=1e-5)


def test_torch_export_one_stack_dynamic_batch_and_length() -> None:
    graph = _graph("tiny-llama.yaml")
    module = to_torch(graph, seed=2)
    batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", min=2, max=512)
    program = torch.export.export(module, make_ids(graph, 2, 9, 9),
                                  dynamic_shapes={"input_ids": {0: batch, 1: seq}})
    runnable = program.module()
    with torch.no_grad():
        for b, s in ((1, 3), (5, 31)):
            ids = make_ids(graph, b, s, s, seed=b)
            torch.testing.assert_close(runnable(*ids), module(*ids), atol=1e-6, rtol=1e-6)


def test_torch_export_encoder_decoder_dynamic_lengths() -> None:
    graph = _graph("tiny.yaml")  # sinusoidal positions, cross-attention, tied shared table
    module = to_torch(graph, seed=3)
    batch = torch.export.Dim("batch", max=64)
    src, tgt = torch.export.Dim("src", min=2, max=256), torch.export.Dim("tgt", min=2, max=256)
    program = torch.export.export(module, make_ids(graph, 2, 9, 7), dynamic_shapes={
        "src_ids": {0: batch, 1: src}, "tgt_ids": {0: batch, 1: tgt}})
    runnable = program.module()
    with torch.no_grad():
        for b, s, t in ((1, 4, 11), (3, 20, 2)):
            ids = make_ids(graph, b, s, t, seed=s)
            torch.testing.assert_close(runnable(*ids), module(*ids), atol=1e-6, rtol=1e-6)
