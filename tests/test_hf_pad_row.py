"""embedding.pad_no_grad: the pad row of the token tables gets no gradient from the lookups.

Most Hugging Face families build their token table as ``nn.Embedding(vocab, d,
padding_idx=config.pad_token_id)``, so fine-tuning never moves that row through the inputs;
Marian and Pegasus start every target with it (decoder_start == pad). Checked here against
transformers (config classes, random weights, no hub access): every parameter's gradient on a
batch holding the pad id (Marian, Pegasus, BERT, Llama with a pad_token_id); which families
``tfgraph import`` sets it for (exactly those whose transformers model has a padding_idx);
the spec's rules; the `--to hf` round trip; model.py; and that the forward and the ONNX model
do not change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pydantic
import pytest
import torch

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.hf import PAD_ROW_FAMILIES, ConfigError, name_map, spec_from_config
from tfgraph.hf.export_config import hf_config
from tfgraph.spec.schema import Spec

from test_hf_families import CASES, LLAMA, Case, build_reference, family_seed
from test_torch_module import make_ids
from test_torch_source import _check_against_to_torch

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
BATCH, SEQ, TGT = 2, 13, 9
LLAMA_PAD = Case("LlamaConfig", "LlamaForCausalLM", dict(LLAMA, pad_token_id=5,
                                                         tie_word_embeddings=True))
GRAD_CASES = {"marian": CASES["marian"], "pegasus": CASES["pegasus"], "bert": CASES["bert"],
              "llama-pad": LLAMA_PAD}


def _imported(case: Case, seed: int) -> tuple[Any, Spec, dict[str, Any]]:
    """(transformers model with random weights, the spec import gives, its config.json)."""
    ref = build_reference(case, seed=seed).float()
    config = json.loads(ref.config.to_json_string())
    return ref, spec_from_config(config), config


def _feeds(ref: Any, spec: Spec, kind: str, pad: int) -> tuple[dict[str, Any], list[Any]]:
    """(transformers keyword arguments, tfgraph loss-model inputs) of a batch in which the
    pad id is read (as padding and inside rows), with labels."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, spec.vocab_size("source"), (BATCH, SEQ), generator=gen)
    ids[0, :3], ids[1, 5] = pad, pad
    if kind == "masked":
        labels = torch.full_like(ids, -100)
        labels[:, 1::3] = ids[:, 1::3]
        return {"input_ids": ids, "labels": labels}, [ids, torch.zeros_like(ids), labels]
    if kind == "causal":
        labels = ids.clone()
        shifted = torch.full_like(labels, -100)
        shifted[:, :-1] = labels[:, 1:]
        return {"input_ids": ids, "labels": labels}, [ids, shifted]
    labels = torch.randint(2, spec.vocab_size("target"), (BATCH, TGT), generator=gen)
    labels[1, -2:] = -100
    from transformers.models.bart.modeling_bart import shift_tokens_right

    start = ref.config.decoder_start_token_id
    dec = shift_tokens_right(labels, pad, start)  # every target starts with decoder_start
    assert (dec[:, 0] == start).all()
    return {"input_ids": ids, "decoder_input_ids": dec, "labels": labels}, [ids, dec, labels]


@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_every_gradient_equals_transformers_on_a_batch_with_the_pad_id(name: str) -> None:
    case = GRAD_CASES[name]
    ref, spec, config = _imported(case, family_seed(name.removesuffix("-pad")))
    assert spec.embedding.pad_no_grad and spec.tokens is not None
    pad = spec.tokens.pad
    assert pad is not None and pad == ref.get_input_embeddings().padding_idx
    names = name_map(config, spec)
    state = ref.state_dict()
    ours = to_torch(tfgraph.compile(spec, loss=True),
                    weights={k: v.detach().clone()
                             for k, v in names.to_tfgraph(state).items()}).eval()
    theirs_in, ours_in = _feeds(ref, spec, case.kind, pad)
    if case.kind == "masked" and "token_type_ids" not in ours.input_names:
        del ours_in[1]
    loss = ref(**theirs_in).loss
    loss.backward()
    our_loss = ours(*ours_in)
    our_loss.backward()
    torch.testing.assert_close(our_loss, loss, rtol=1e-5, atol=1e-6)
    # transformers' gradients by state-dict key (a tied table's under each of its names)
    by_ptr = {p.data_ptr(): p.grad for p in ref.parameters() if p.grad is not None}
    grads = {k: by_ptr.get(v.data_ptr(), torch.zeros_like(v)) for k, v in state.items()}
    frozen = {k for k in state if case.frozen and k.endswith(case.frozen)}  # Marian's sinusoids
    grads |= {k: state[k] for k in frozen}
    zero = {k: (state[k] if k in frozen else torch.zeros_like(v)) for k, v in state.items()}
    want, base = names.to_tfgraph(grads), names.to_tfgraph(zero)
    checked = 0
    for n, p in ours.named_parameters():
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        expected = want[n] - base[n]
        scale = max(expected.abs().max().item(), 1e-3)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5 * scale, msg=n)
        checked += 1
    assert checked == len(list(ours.parameters()))


def test_the_untied_pad_row_gets_no_gradient_and_the_forward_is_unchanged() -> None:
    data: dict[str, Any] = {"name": "t", "arch": "decoder-only", "d_model": 32, "layers": 1,
                            "vocab": 29, "max_len": 32, "dropout": 0.0,
                            "attention": {"heads": 4}, "embedding": {"tie_output": False},
                            "tokens": {"pad": 3}}
    plain = Spec.model_validate(data)
    data["embedding"] = {"tie_output": False, "pad_no_grad": True}
    frozen = Spec.model_validate(data)
    assert "pad_no_grad" not in plain.model_dump()["embedding"]  # off: dumps as before
    assert tfgraph.parse_spec(tfgraph.dump_spec(frozen)) == frozen
    nets = [to_torch(tfgraph.compile(s), seed=1) for s in (plain, frozen)]
    ids = torch.tensor([[3, 3, 7, 3, 9, 11], [1, 2, 3, 4, 5, 6]])
    outs = [net(ids) for net in nets]
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)  # the same forward
    for out in outs:
        out.square().sum().backward()
    tables = [dict(net.named_parameters())["embed.tokens.weight"].grad for net in nets]
    assert tables[0] is not None and tables[1] is not None
    assert tables[0][3].abs().sum() > 0 and torch.equal(tables[1][3], torch.zeros(32))
    others = [i for i in range(29) if i != 3]
    torch.testing.assert_close(tables[1][others], tables[0][others], rtol=0, atol=0)


def test_the_onnx_model_is_unchanged() -> None:
    pytest.importorskip("onnx")
    from tfgraph.exporters import to_onnx

    spec = tfgraph.load_spec(ROOT / "specs" / "tiny-olmo2.yaml")
    on, off = (spec.model_copy(update={"embedding": spec.embedding.model_copy(
        update={"pad_no_grad": flag})}) for flag in (True, False))
    for cache in (False, True):
        graphs = [to_onnx(tfgraph.compile(s, cache=cache), seed=1).graph for s in (on, off)]
        assert graphs[0] == graphs[1]


def test_model_py_keeps_the_pad_row_out_of_the_gradient(tmp_path: Path) -> None:
    """model.py (``--to torch``) computes what to_torch does, gradients included, on ids that
    hold the pad id (nn.Embedding / F.embedding with padding_idx)."""
    base = tfgraph.compile(ROOT / "specs" / "tiny-encoder.yaml")
    assert base.spec is not None
    pad = int(make_ids(base, 2, 7, 5)[0][0, 0])  # an id _check_against_to_torch feeds
    spec = Spec.model_validate(base.spec.model_dump() | {"tokens": {"pad": pad}} | {
        "embedding": base.spec.model_dump()["embedding"] | {"pad_no_grad": True}})
    graph = tfgraph.compile(spec)
    _check_against_to_torch(graph, tmp_path / "m")
    source = (tmp_path / "m" / "model.py").read_text()
    assert "nn.Embedding(VOCAB, D_MODEL, padding_idx=EMBEDDING_PADDING_IDX)" in source
    assert f"EMBEDDING_PADDING_IDX = {pad}" in source


def test_spec_rules() -> None:
    data: dict[str, Any] = {"name": "t", "arch": "decoder-only", "d_model": 32, "layers": 1,
                            "vocab": 29, "attention": {"heads": 4},
                            "embedding": {"positions": "rope", "pad_no_grad": True}}
    with pytest.raises(pydantic.ValidationError, match="pad_no_grad: needs tokens.pad"):
        Spec.model_validate(data)
    with pytest.raises(pydantic.ValidationError, match="pad_no_grad: needs tokens.pad"):
        Spec.model_validate(data | {"tokens": {"eos": 2}})
    with pytest.raises(pydantic.ValidationError, match="pad_no_grad"):
        Spec.model_validate(data | {"embedding": {"pad_no_grad": 1}, "tokens": {"pad": 0}})
    seq2seq = data | {"arch": "encoder-decoder", "vocab": {"source": 29, "target": 10},
                      "tokens": {"pad": 12}, "embedding": {"pad_no_grad": True}}
    with pytest.raises(pydantic.ValidationError, match="below the target vocabulary"):
        Spec.model_validate(seq2seq)
    assert Spec.model_validate(seq2seq | {"tokens": {"pad": 4}}).embedding.pad_no_grad
    graph = tfgraph.compile(Spec.model_validate(seq2seq | {"tokens": {"pad": 4}}))
    lookups = {n.name: n.attrs.get("padding_idx") for n in graph.ops() if n.op == "embedding"}
    assert lookups == {"encoder.embed.tokens": 4, "decoder.embed.tokens": 4}


def _families() -> list[str]:
    return sorted(CASES)


@pytest.mark.parametrize("name", _families())
def test_import_sets_it_exactly_where_transformers_has_a_padding_idx(name: str) -> None:
    """Each case's config with a pad id inside the vocabulary (its own, else 3): the flag is
    set when, and only when, transformers' model gives its token table(s) that padding_idx;
    never without a pad id or with one outside the vocabulary."""
    case = CASES[name]
    kwargs = dict(case.kwargs)
    if kwargs.get("pad_token_id") is None:
        kwargs["pad_token_id"] = 3
    config = getattr(transformers, case.config)(**kwargs)
    with torch.device("meta"):
        model = getattr(transformers, case.model)._from_config(config)
    tables = [model.get_input_embeddings()]
    if case.kind == "seq2seq":
        tables.append(model.get_decoder().embed_tokens)
    pads = {t.padding_idx for t in tables}
    assert len(pads) == 1
    expected = pads.pop()
    data = json.loads(config.to_json_string())
    spec = spec_from_config(data)
    assert spec.embedding.pad_no_grad == (expected is not None), name
    assert (data["model_type"] in PAD_ROW_FAMILIES) == (expected is not None)
    if expected is not None:
        assert spec.tokens is not None and spec.tokens.pad == expected
        # `--to hf`: the round trip keeps it, and transformers builds the padding_idx again
        export = hf_config(spec)
        assert export.model_type in PAD_ROW_FAMILIES
        assert export.config["pad_token_id"] == expected
        for missing in ({"pad_token_id": None}, {"pad_token_id": 10 ** 6}):
            try:
                assert not spec_from_config(data | missing).embedding.pad_no_grad
            except ConfigError:  # RoBERTa's positions need the pad id
                assert data["model_type"] in ("roberta", "xlm-roberta")


def test_a_vocabulary_split_table_keeps_the_pad_row_out_too(tmp_path: Path) -> None:
    """Tensor parallelism splits tiny-encoder's tied table by vocabulary (its module takes no
    padding_idx: its rows are the rank's): the table's gradient, pad row included, is the
    one-process model's, with and without sequence parallelism (two CPU ranks, gloo)."""
    from distributed_support import torchrun

    out = tmp_path / "out.json"
    torchrun(2, ROOT / "tests" / "pad_row_worker.py", [{"sp": False}, {"sp": True}], out)
    for result in json.loads(out.read_text()):
        torch.testing.assert_close(torch.tensor(result["got"]), torch.tensor(result["want"]),
                                   rtol=1e-4, atol=1e-4)
