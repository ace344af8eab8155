"""``embedding.dropout``: the dropout after the embeddings, apart from the spec's ``dropout``
after each sublayer (GPT-2's and Phi's embd_pdrop beside resid_pdrop; 0 for Seed-OSS, MPT).

A spec without it dumps and lowers as before; one equal to ``dropout`` is the same spec; at 0
the graph has no dropout node after the embeddings, so a training plan keeps no mask there,
and the bytes the report drops are the bytes the torch module stops saving
(saved_tensors_hooks); the torch module applies the rate it names there; ONNX (inference) is
the identity either way.
"""

from __future__ import annotations

import pytest
import torch

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.schema import Spec

from parity_support import check, saved_storages, tiny
from test_torch_module import make_ids


def _with(spec: Spec, **embedding: object) -> Spec:
    data = spec.model_dump()
    data["embedding"] |= embedding
    return Spec.model_validate(data)


def _embed_dropouts(spec: Spec) -> dict[str, float]:
    graph = tfgraph.compile(spec)
    return {n.name: n.attrs["p"] for n in graph.nodes()
            if n.category == "dropout" and n.name.endswith("embed.dropout")}


def test_a_spec_without_it_dumps_and_lowers_unchanged() -> None:
    spec = tiny("tiny-decoder.yaml")
    assert spec.embedding.dropout is None and spec.embedding_dropout == spec.dropout == 0.1
    assert "dropout" not in spec.model_dump()["embedding"]
    assert _embed_dropouts(spec) == {"decoder.embed.dropout": 0.1}
    # written equal to dropout: the same spec, dumped without it
    same = _with(spec, dropout=0.1)
    assert same.embedding.dropout is None and same.model_dump() == spec.model_dump()


@pytest.mark.parametrize("name", ["tiny-decoder.yaml", "tiny.yaml"])
def test_its_rate_reaches_every_stack_embedding_and_only_there(name: str) -> None:
    spec = _with(tiny(name), dropout=0.25)
    assert spec.embedding_dropout == 0.25 and spec.model_dump()["embedding"]["dropout"] == 0.25
    assert set(_embed_dropouts(spec).values()) == {0.25}
    assert len(_embed_dropouts(spec)) == len(spec.stacks)
    others = {n.attrs["p"] for n in tfgraph.compile(spec).nodes()
              if n.category == "dropout" and not n.name.endswith("embed.dropout")}
    assert others == {spec.dropout}
    assert _embed_dropouts(_with(tiny(name), dropout=0.0)) == {}


def test_a_bad_rate_is_refused() -> None:
    for bad in (1.0, -0.1, "0.1", True, float("nan")):
        with pytest.raises(ValueError, match="embedding.dropout"):
            _with(tiny("tiny-decoder.yaml"), dropout=bad)


def test_a_copy_with_another_dropout_follows_it() -> None:
    """Not derived in place: with embedding.dropout unset, model_copy(update={"dropout": 0})
    (tests, tools) drops the embeddings' dropout too."""
    spec = tiny("tiny-decoder.yaml").model_copy(update={"dropout": 0.0})
    assert spec.embedding_dropout == 0.0 and _embed_dropouts(spec) == {}


def _saved(spec: Spec, batch: int, seq: int) -> tuple[int, int]:
    """(bytes the torch module saves in one training forward, the report's saved bytes)."""
    graph = tfgraph.compile(spec)
    module = to_torch(graph, seed=0).train()
    with saved_storages(module) as seen:
        out = module(*make_ids(graph, batch, seq, seq))  # kept: its graph holds the saved
    report = graph.report(batch=batch, seq=seq)["memory"]["saved_for_backward"]
    return sum(seen.values()), report


def test_no_mask_is_counted_or_saved_at_zero() -> None:
    """Korthikanti et al. 2022 count dropout's one-byte mask per element (sbh after the
    embeddings); at embedding.dropout 0 the report drops exactly that, as the module does."""
    spec = tiny("tiny-decoder.yaml")
    batch, seq = 2, 12
    measured, counted = _saved(spec, batch, seq)
    measured0, counted0 = _saved(_with(spec, dropout=0.0), batch, seq)
    mask = batch * seq * spec.d_model  # torch.native_dropout's bool mask
    assert counted - counted0 == mask
    assert measured - measured0 == mask


def test_torch_applies_its_rate_after_the_embeddings() -> None:
    """With the sublayers' dropout 0, train() differs from eval() only through the
    embeddings' dropout; at rate 0 not at all, in ONNX's inference never."""
    base = tiny("tiny-decoder.yaml").model_copy(update={"dropout": 0.0})
    on, off = _with(base, dropout=0.5), _with(base, dropout=0.0)
    assert on.dropout == 0.0 and on.embedding_dropout == 0.5
    ids = make_ids(tfgraph.compile(on), 2, 12, 12)
    with torch.no_grad():
        model = to_torch(tfgraph.compile(on), seed=0)
        evaluated = model.eval()(*ids)
        assert (model.train()(*ids) - evaluated).abs().max().item() > 1e-2
        quiet = to_torch(tfgraph.compile(off), seed=0)
        torch.testing.assert_close(quiet.train()(*ids), quiet.eval()(*ids), rtol=0, atol=0)
        torch.testing.assert_close(quiet.eval()(*ids), evaluated, rtol=0, atol=0)


def test_onnx_ignores_it() -> None:
    ort = pytest.importorskip("onnxruntime")
    from tfgraph.exporters.onnx.model import to_onnx

    spec = _with(tiny("tiny-decoder.yaml"), dropout=0.5)
    graph = tfgraph.compile(spec)
    model = to_torch(graph, seed=0).eval()
    ids = make_ids(graph, 2, 9, 9)
    onnx_model = to_onnx(graph, weights={k: v.detach() for k, v in model.state_dict().items()})
    session = ort.InferenceSession(onnx_model.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    with torch.no_grad():
        expected = model(*ids)
    check(torch.from_numpy(session.run(None, {"input_ids": ids[0].numpy()})[0]), expected)
