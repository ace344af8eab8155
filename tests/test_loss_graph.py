"""The loss node: ``tfgraph.compile(spec, loss=True)`` ends the graph with the token
cross-entropy (tfgraph.graph.ops_loss); its costs, and its torch and ONNX lowerings against
``F.cross_entropy`` on the ordinary module's logits."""

from __future__ import annotations

import numpy as np
import pytest
import sympy
import torch
import torch.nn.functional as F

import tfgraph
from tfgraph.passes.cost import op_costs
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.graph.ir import B, S, T
from tfgraph.spec.loader import load_spec

from conftest import ROOT, small
from test_torch_module import make_ids

# one stack, encoder-decoder, segments, probs output, 16-bit, mixture of experts
LOSS_SPECS = ["tiny-decoder.yaml", "tiny-t5.yaml", "tiny-bert.yaml", "tiny-sandwich.yaml",
              "tiny-bf16.yaml", "tiny-moe.yaml"]


def loss_inputs(graph: tfgraph.CompiledGraph, batch: int, seq: int, tgt: int
                ) -> tuple[torch.Tensor, ...]:
    """The model's ids, then labels for the logits' positions."""
    assert graph.spec is not None
    ids = make_ids(tfgraph.compile(graph.spec), batch, seq, tgt)
    length = tgt if "tgt_ids" in graph.inputs else seq
    vocab = int(graph.node("logits").type.shape[-1])
    labels = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(7))
    return (*ids, labels)


@pytest.mark.parametrize("name", LOSS_SPECS)
def test_loss_graph_inputs_outputs(name: str) -> None:
    spec = small(load_spec(ROOT / "specs" / name))
    plain, graph = tfgraph.compile(spec), tfgraph.compile(spec, loss=True)
    assert graph.inputs == [*plain.inputs, "labels"]
    assert graph.outputs == ["loss"]
    loss = graph.node("loss")
    assert loss.op == "cross_entropy" and loss.type.shape == () and loss.type.dtype == "float32"
    logits = graph.node(loss.inputs[0])
    assert logits.name == "logits" and logits.type == plain.node("logits").type
    length = T if spec.arch == "encoder-decoder" else S
    assert graph.node("labels").type.shape == (B, length)
    assert "probs" not in graph  # a probs model's loss reads the logits
    assert plain.outputs[0] in ("logits", "probs")  # graphs without loss unchanged


def test_loss_costs_follow_torch_cross_entropy() -> None:
    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny-decoder.yaml")), loss=True)
    (cost,) = [c for c in op_costs(graph) if c.op == "cross_entropy"]
    vocab = graph.node("logits").type.shape[-1]
    assert cost.matmul == 0
    assert sympy.expand(cost.other - (5 * B * S * vocab + 2 * B * S)) == 0
    # log_softmax keeps its float32 result; nll_loss the target and a scalar total_weight
    assert dict(cost.saved) == {"loss#log_probs": 4 * B * S * vocab, "labels": 8 * B * S,
                                "loss#total_weight": 4}
    assert cost.temp == 0  # float32 logits: no upcast copy
    bf16 = tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny-bf16.yaml")), loss=True)
    (half,) = [c for c in op_costs(bf16) if c.op == "cross_entropy"]
    vocab16 = bf16.node("logits").type.shape[-1]
    assert half.temp == 4 * B * S * vocab16  # the float32 copy of bf16 logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_saves_what_the_op_table_says(dtype: torch.dtype) -> None:
    """torch's own F.cross_entropy (what the lowering calls) keeps exactly the table's bytes."""
    batch, length, vocab = 3, 5, 11
    logits = torch.randn(batch, length, vocab, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, vocab, (batch, length))
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        tfgraph.exporters.torch.functional.cross_entropy(logits, labels)
    assert sum(seen.values()) == 4 * batch * length * vocab + 8 * batch * length + 4


@pytest.mark.parametrize("name", [n for n in LOSS_SPECS if n != "tiny-sandwich.yaml"])
def test_torch_loss_equals_cross_entropy_of_the_logits(name: str) -> None:
    spec = small(load_spec(ROOT / "specs" / name))
    plain = tfgraph.compile(spec)
    assert plain.outputs == ["logits"]  # probs models: the next test
    graph = tfgraph.compile(spec, loss=True)
    inputs = loss_inputs(graph, 2, 9, 6)
    model, reference = to_torch(graph, seed=3), to_torch(plain, seed=3)
    with torch.no_grad():
        loss = model(*inputs)
        logits = reference(*inputs[:-1])
    expected = F.cross_entropy(logits.float().flatten(0, 1), inputs[-1].flatten())
    assert loss.dtype == torch.float32 and loss.shape == ()
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)


def test_probs_model_loss_is_minus_log_probs() -> None:
    spec = small(load_spec(ROOT / "specs" / "tiny-sandwich.yaml"))
    graph = tfgraph.compile(spec, loss=True)
    inputs = loss_inputs(graph, 2, 7, 7)
    with torch.no_grad():
        loss = to_torch(graph, seed=1)(*inputs)
        probs = to_torch(tfgraph.compile(spec), seed=1)(*inputs[:-1]).double()
    picked = probs.gather(-1, inputs[-1].unsqueeze(-1)).log().neg().mean()
    torch.testing.assert_close(loss.double(), picked, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny-decoder.yaml", "tiny-t5.yaml", "tiny-moe.yaml"])
def test_onnx_loss_equals_torch(name: str) -> None:
    ort = pytest.importorskip("onnxruntime")
    from tfgraph.exporters import to_onnx

    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / name)), loss=True)
    model = to_torch(graph, seed=2)
    inputs = loss_inputs(graph, 2, 8, 5)
    proto = to_onnx(graph, weights=model.state_dict())
    assert [o.name for o in proto.graph.output] == ["loss"]
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {n: t.numpy() for n, t in zip(graph.inputs, inputs)})
    with torch.no_grad():
        expected = model(*inputs).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_torch_source_writes_the_loss() -> None:
    from tfgraph.exporters.torch.source import generate_source

    graph = tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny-decoder.yaml")), loss=True)
    source = generate_source(graph)
    assert "loss = cross_entropy(logits, labels)" in source
    assert "def forward(self, input_ids: Tensor, labels: Tensor) -> Tensor:" in source


def test_loss_graph_has_no_kv_cache_form() -> None:
    with pytest.raises(TfgraphError, match="KV-cache graph is for inference"):
        tfgraph.compile(small(load_spec(ROOT / "specs" / "tiny-decoder.yaml")), cache=True,
                        loss=True)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-t5", "tiny-moe"])
def test_a_loss_graph_reports(name: str) -> None:
    """``tfgraph.compile(spec, loss=True).report(...)`` raised KeyError ('labels' missing from
    the inference-graph twin its formulas were read in, issue 26); its figures are the
    inference graph's plus the loss op's, and its formulas verify against them."""
    spec = ROOT / "specs" / f"{name}.yaml"
    loss = tfgraph.compile(spec, loss=True).report(batch=2, seq=16)
    plain = tfgraph.compile(spec).report(batch=2, seq=16)
    vocab = tfgraph.load_spec(spec).output_vocab
    tokens = 2 * 16
    assert loss["flops"]["forward"] - plain["flops"]["forward"] == 5 * tokens * vocab + 2 * tokens
    assert loss["memory"]["train_activations_peak"] == plain["memory"]["train_activations_peak"]
    from tfgraph.passes.formulas import spec_formulas

    assert spec_formulas(tfgraph.compile(spec, loss=True)).unverified == []
