"""An encoder-only model's padding mask: ``forward(input_ids, token_type_ids, *,
attention_mask=..., position_ids=...)`` runs the model's masked graph (attention_mask (B, S),
position_ids where positions are read; no past), which a right-padded batch of BERT,
RoBERTa, DistilBERT and ModernBERT (random weights, built from config classes) must run as
transformers' masked-LM models do with the same attention_mask."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.hf import name_map

from conftest import ROOT
from parity_support import check
from test_hf_families import CASES, build_reference, family_seed, import_spec

LENGTHS = (11, 6)  # a batch of 2 rows, right-padded to 11


def padded_batch(vocab: int, pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (padding ``pad``) and their mask (1 real, 0 padding)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(3, vocab, (len(LENGTHS), max(LENGTHS)), generator=gen)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(LENGTHS):
        mask[row, :length] = 1
    return ids.masked_fill(mask == 0, pad), mask


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert", "modernbert"])
def test_a_padded_batch_matches_transformers(family: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    case = CASES[family]
    ref = build_reference(case, seed=family_seed(family))
    ref.config.save_pretrained(tmp_path / family)
    spec = import_spec(tmp_path / family, tmp_path / f"{family}.yaml")
    config = json.loads((tmp_path / family / "config.json").read_text())
    weights = name_map(config, spec).to_tfgraph(ref.state_dict())
    graph = tfgraph.compile(spec)
    ours = to_torch(graph, weights=weights).eval()
    ids, mask = padded_batch(spec.vocab_size("source"), int(config["pad_token_id"]))
    real = mask.bool()

    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).logits
        got = ours(ids, attention_mask=mask)
        check(got[real], expected[real])
        # without the mask: the full-sequence graph, as before (padding attended to)
        unmasked = ours(ids)
        check(unmasked, ref(input_ids=ids).logits)
        assert (unmasked[real] - got[real]).abs().max() > 1e-3  # the mask does something
        # each real row as if alone, whatever the padding's ids
        short = ids[1:, :LENGTHS[1]]
        check(got[1, :LENGTHS[1]], ours(short)[0])
        other = ids.masked_fill(mask == 0, 5)
        check(ours(other, attention_mask=mask)[real], got[real])

    # the masked graph: its inputs, no past or present keys/values
    masked = graph.info.cache_graph(None) if graph.info.cache_graph else None
    assert masked is not None and masked.outputs == graph.outputs
    names = ["input_ids", *(["token_type_ids"] if spec.embedding.token_types else []),
             "attention_mask"]
    if family != "roberta":  # RoBERTa counts positions over input_ids, as transformers does
        names.append("position_ids")
    assert list(masked.inputs) == names

    # the same masked model through ONNX (what `build --kv-cache` writes for an encoder)
    ort = pytest.importorskip("onnxruntime")
    from tfgraph.exporters.onnx.model import to_onnx

    feeds = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids),
             "attention_mask": mask, "position_ids": torch.arange(ids.shape[1]).expand_as(ids)}
    for opset in (23, 17):
        model = to_onnx(masked, weights={k: v.detach() for k, v in weights.items()},
                        opset=opset)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == names
        out = session.run(None, {n: feeds[n].numpy() for n in names})
        assert len(out) == 1
        check(torch.from_numpy(out[0])[real], expected[real])

    # training with a padded batch: a masked loss reaches every parameter
    ours.train()
    for p in ours.parameters():
        p.grad = None
    logits = ours(ids, attention_mask=mask)
    loss = torch.nn.functional.cross_entropy(logits[real], ids[real])
    loss.backward()
    trained = {n for n, p in ours.named_parameters()
               if p.grad is not None and p.grad.abs().sum() > 0}
    assert trained == {n for n, _ in ours.named_parameters()}


def test_explicit_positions_and_refusals() -> None:
    model = to_torch(tfgraph.compile(ROOT / "specs" / "tiny-bert.yaml"), seed=0).eval()
    ids = torch.randint(3, 100, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        ones = torch.ones_like(ids)
        # every token real and positions 0..S-1: the full-sequence graph's logits
        torch.testing.assert_close(model(ids, attention_mask=ones), full, rtol=1e-5,
                                   atol=1e-5)
        arange = torch.arange(7).expand(2, 7)
        torch.testing.assert_close(model(ids, position_ids=arange), full, rtol=1e-5,
                                   atol=1e-5)
        shifted = model(ids, position_ids=arange + 1)
        assert (shifted - full).abs().max() > 1e-3
    with pytest.raises(TfgraphError, match="no KV cache") as caught:
        model(ids, use_cache=True)
    assert "\n" not in str(caught.value)
    with pytest.raises(TfgraphError, match="no KV cache"):
        model(ids, past_key_values=[])
    # past a learned table's max_len: one line, as the full-sequence graph refuses it
    long = torch.randint(3, 100, (1, 65), generator=torch.Generator().manual_seed(2))
    with pytest.raises(TfgraphError, match="max_len 64") as caught:
        model(long, attention_mask=torch.ones_like(long))
    assert "\n" not in str(caught.value)
    with pytest.raises(TfgraphError, match="position id 64"):
        model(ids, position_ids=arange + 58)
    # no positions read (tiny-encoder: positions none): position_ids refused, one line
    plain = to_torch(tfgraph.compile(ROOT / "specs" / "tiny-encoder.yaml"), seed=0).eval()
    with pytest.raises(TfgraphError, match="takes no position_ids") as caught:
        plain(ids, position_ids=arange)
    assert "\n" not in str(caught.value)


def test_build_kv_cache_of_an_encoder_writes_its_padding_mask_model(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tfgraph.cli import main

    out = tmp_path / "bert.onnx"
    spec = str(ROOT / "specs" / "tiny-bert.yaml")
    result = CliRunner().invoke(main, ["build", spec, "--to", "onnx", "--kv-cache", "-o",
                                       str(out)])
    assert result.exit_code == 0, result.output
    said = result.output + result.stderr
    assert "padding mask" in said and "genai" not in said
    import onnx

    model = onnx.load(str(out))
    inputs = [i.name for i in model.graph.input]
    assert inputs == ["input_ids", "token_type_ids", "attention_mask", "position_ids"]
    assert [o.name for o in model.graph.output] == ["logits"]
    # tfgraph run times full-sequence models: one line, exit 2
    result = CliRunner().invoke(main, ["run", str(out), "--provider", "cpu"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "padding-mask model" in result.stderr
