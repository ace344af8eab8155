"""onnxruntime on tfgraph's ONNX model against the PyTorch back end on the same weights.

Every spec in specs/ at tiny sizes, both lowerings (opset 23 fused ops, opset 17 decomposed),
two dynamic shapes: max |difference| of the logits <= 1e-4 in float32 (16-bit specs are run as
their float32 twin here; their own dtype is checked separately with a 16-bit bound).

The weights are the shared generator's scaled up (matrices std 0.2, gains and biases jittered):
at GPT-2's std 0.02 attention scores are ~0.01, softmax is nearly uniform and a wrong rotary
convention or head grouping would hide under 1e-4. At this scale they do not.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
import torch

import tfgraph
from tfgraph.exporters import to_onnx, to_torch
from tfgraph.spec.schema import Spec
from tfgraph.graph.weights import generate

from onnx_support import feeds_for, float32_twin

TOL = 1e-4


def spiky_weights(graph, seed: int) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    out = {}
    for name, value in generate(graph, seed).items():
        if value.ndim == 2:
            out[name] = value * 10.0  # std 0.2
        else:  # norm gains around 1, biases around 0
            out[name] = (value + rng.normal(0.0, 0.2, value.shape)).astype(np.float32)
    return out


def torch_out(module, graph, feeds) -> np.ndarray:  # type: ignore[no-untyped-def]
    with torch.no_grad():
        return module(*[torch.from_numpy(feeds[n]) for n in graph.inputs]).float().numpy()


def ort_session(graph, weights, opset: int) -> ort.InferenceSession:  # type: ignore[no-untyped-def]
    model = to_onnx(graph, weights=weights, opset=opset)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("opset", [23, 17])
def test_logits_match_torch(small_spec: Spec, opset: int) -> None:
    graph = tfgraph.compile(float32_twin(small_spec))
    weights = spiky_weights(graph, seed=11)
    module = to_torch(graph, weights=weights).eval()
    sess = ort_session(graph, weights, opset)
    for batch, seq, tgt in ((2, 7, 5), (3, 4, 9)):
        feeds = feeds_for(graph, batch, seq, tgt, seed=seq)
        got = sess.run(None, feeds)[0]
        want = torch_out(module, graph, feeds)
        assert got.shape == want.shape
        assert np.abs(got - want).max() <= TOL, f"{graph.name} opset {opset} {batch, seq, tgt}"


def test_state_dict_round_trip_and_same_seed(small_spec: Spec) -> None:
    """to_onnx(weights=module.state_dict()) and to_onnx(seed=s) both equal to_torch(seed=s)."""
    graph = tfgraph.compile(float32_twin(small_spec))
    module = to_torch(graph, seed=4).eval()
    feeds = feeds_for(graph, 2, 6, 6)
    want = torch_out(module, graph, feeds)
    for weights, seed in ((module.state_dict(), 0), (None, 4)):
        model = to_onnx(graph, weights=weights, seed=seed)
        got = ort.InferenceSession(model.SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        assert np.abs(got - want).max() <= TOL


def test_float16_model_matches_torch_in_float16() -> None:
    """The fp16 spec in its own dtype: both back ends round every activation to fp16, so the
    bound is a few fp16 ulps at |logit| ~ 1 (2^-10 each), not float32's 1e-4."""
    from tfgraph.spec.loader import load_spec

    from conftest import ROOT, small

    spec = small(load_spec(ROOT / "specs" / "tiny-fp16.yaml"))
    graph = tfgraph.compile(spec)
    module = to_torch(graph, seed=2).eval()
    for opset in (23, 17):
        feeds = feeds_for(graph, 2, 8, 8)
        got = ort.InferenceSession(to_onnx(graph, seed=2, opset=opset).SerializeToString(),
                                   providers=["CPUExecutionProvider"]).run(None, feeds)[0]
        want = torch_out(module, graph, feeds)
        assert got.dtype == np.float16
        assert np.abs(got.astype(np.float32) - want).max() <= 2e-3  # measured 2.4e-4


@pytest.mark.parametrize("name", ["base.yaml", "big.yaml", "tiny.yaml"])
def test_vaswani_specs_match_stock_nn_transformer(name: str) -> None:
    """A reference nobody here wrote: torch.nn.Transformer with tfgraph's weights copied in
    (benchmarks/transformer_peer.py, the same model the ONNX benchmarks compare against)."""
    import importlib.util

    from tfgraph.spec.loader import load_spec

    from conftest import ROOT, small

    where = ROOT / "benchmarks" / "transformer_peer.py"
    loader = importlib.util.spec_from_file_location("transformer_peer", where)
    assert loader is not None and loader.loader is not None
    peer_mod = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(peer_mod)
    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / name)))
    weights = spiky_weights(graph, seed=5)
    peer = peer_mod.for_spec(graph.spec).eval()
    peer_mod.load_tfgraph_weights(peer, weights)
    for opset in (23, 17):
        sess = ort_session(graph, weights, opset)
        for batch, seq, tgt in ((2, 9, 6), (1, 3, 12)):
            feeds = feeds_for(graph, batch, seq, tgt, seed=tgt)
            with torch.no_grad():
                want = peer(*(torch.from_numpy(feeds[n]) for n in graph.inputs)).numpy()
            got = sess.run(None, feeds)[0]
            assert np.abs(got - want).max() <= TOL, (name, opset, batch, seq, tgt)
