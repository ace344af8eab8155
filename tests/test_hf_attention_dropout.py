"""attention.dropout through the Hugging Face round trip (`tfgraph import`, `build --to hf`).

transformers drops out the attention weights after the softmax, in training only
(``eager_attention_forward``: ``nn.functional.dropout(attn_weights, p=dropout,
training=module.training)``; SDPA's ``dropout_p``), where tfgraph's ``attention.dropout`` does.
For families with different keys (GPT-2's ``attn_pdrop``, BERT's
``attention_probs_dropout_prob``, GPT-NeoX's and the Llama-style families' ``attention_dropout``,
BART's in self- and cross-attention, Falcon's with ALiBi only, Seed-OSS's whose class default is
0.1): a config with 0.1 imports as ``attention.dropout: 0.1`` and a spec file with it goes back
to that key in config.json; without it the spec has no ``attention.dropout`` and ``--to hf``
writes 0. The semantics: with only attention dropout, eval-mode logits equal transformers'
(1e-4), train() changes them, and train-mode logits equal transformers' from the same seed. Every
other case of test_hf_families is checked in process (import, hf_config) with its own key, or,
for T5, ModernBERT and rotary Falcon, whose key means more or that transformers' eager and
SDPA attention do not apply, as changing nothing. MPT's attn_config.attn_pdrop, which also drops
the sublayers' outputs, is attention.dropout and dropout (tests/test_hf_embedding_dropout.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.exporters import to_torch
from tfgraph.hf import name_map, spec_from_config
from tfgraph.hf.export_config import hf_config

from cli_support import hf_config_written
from parity_support import check
from test_hf_families import CASES, build_reference, family_seed, import_spec, inputs

transformers = pytest.importorskip("transformers")

# case of test_hf_families -> the config key of its attention-weight dropout
KEYS = {"gpt2": "attn_pdrop", "llama": "attention_dropout",
        "bert": "attention_probs_dropout_prob", "gpt_neox": "attention_dropout",
        "bart": "attention_dropout", "falcon-alibi": "attention_dropout",
        "seed_oss": "attention_dropout"}


def _config(name: str, p: float) -> Any:
    case = CASES[name]
    return getattr(transformers, case.config)(**(case.kwargs | {KEYS[name]: p}))


@pytest.mark.parametrize("p", [0.1, 0.0])
@pytest.mark.parametrize("name", sorted(KEYS))
def test_import_reads_it_and_to_hf_writes_it_back(name: str, p: float, tmp_path: Path) -> None:
    config = _config(name, p)
    config.save_pretrained(tmp_path / "hf")
    spec = import_spec(tmp_path / "hf", tmp_path / "spec.yaml")
    assert spec.attention.dropout == p
    # a spec without it is written as before (the field left out at 0)
    written = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    assert written["attention"].get("dropout") == (p or None)
    back = hf_config_written(tmp_path / "spec.yaml", tmp_path / "out")
    assert back["model_type"] == config.model_type
    assert back[KEYS[name]] == p
    # transformers reads the value back into the same attribute
    loaded = transformers.AutoConfig.from_pretrained(tmp_path / "out")
    assert getattr(loaded, KEYS[name]) == p


# each case's other dropouts (residual, embedding, activation) off: only the attention
# weights drop out
RESIDUAL_OFF: dict[str, dict[str, float]] = {
    "gpt2": {"resid_pdrop": 0.0, "embd_pdrop": 0.0}, "llama": {},
    "bert": {"hidden_dropout_prob": 0.0}, "gpt_neox": {"hidden_dropout": 0.0},
    "bart": {"dropout": 0.0, "activation_dropout": 0.0},
    "falcon-alibi": {"hidden_dropout": 0.0}, "seed_oss": {"residual_dropout": 0.0}}


@pytest.mark.parametrize("name", sorted(KEYS))
def test_train_and_eval_logits_match_hugging_face(name: str, tmp_path: Path) -> None:
    """Attention dropout 0.1 alone: eval logits equal transformers' (the identity at
    inference), and train() changes them. In train() they equal transformers' too, from the
    same seed: on CPU tfgraph's torch.native_dropout and transformers' F.dropout draw the same
    mask from the same generator state, on weights of the same shape in the same order. Not
    Falcon-RW, whose reference runs SDPA (its eager path adds ALiBi twice): SDPA's dropout
    draws its mask in another way, so only the change in train() is checked there."""
    case = CASES[name]
    config = getattr(transformers, case.config)(
        **(case.kwargs | {KEYS[name]: 0.1} | RESIDUAL_OFF[name]))
    ref = getattr(transformers, case.model)._from_config(
        config, attn_implementation=case.attn).eval()
    ref.load_state_dict(build_reference(case, family_seed(name)).state_dict())
    ref.config.save_pretrained(tmp_path / "hf")
    spec = import_spec(tmp_path / "hf", tmp_path / "spec.yaml")
    assert spec.attention.dropout == 0.1 and spec.dropout == 0.0
    kwargs, feeds = inputs(spec, case.kind)
    data = json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = to_torch(tfgraph.compile(spec), weights=name_map(data, spec).to_tfgraph(
        ref.state_dict()))
    with torch.no_grad():
        expected = ref(**kwargs).logits
        evaluated = ours.eval()(*feeds.values())
        check(evaluated, expected)
        torch.manual_seed(0)
        trained = ours.train()(*feeds.values())
        assert (trained - evaluated).abs().max().item() > 100 * 1e-4
        if case.attn == "eager":
            torch.manual_seed(0)
            check(trained, ref.train()(**kwargs).logits)


def test_rotary_falcon_attention_dropout_stays_inert() -> None:
    """transformers' rotary Falcon passes no dropout to the attention weights in its eager
    and SDPA paths: the key imports as nothing, and the model in train() with its residual
    dropout off gives its eval logits."""
    case = CASES["falcon"]
    config = transformers.FalconConfig(**(case.kwargs | {"attention_dropout": 0.5,
                                                         "hidden_dropout": 0.0}))
    assert spec_from_config(config.to_dict()).attention.dropout == 0.0
    for impl in ("eager", "sdpa"):
        ref = transformers.FalconForCausalLM._from_config(config, attn_implementation=impl)
        ids = torch.randint(2, 101, (2, 9), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            torch.testing.assert_close(ref.train()(ids).logits, ref.eval()(ids).logits,
                                       rtol=0, atol=0)


def test_mpt_imports_no_residual_dropout_its_model_never_applies() -> None:
    """modeling_mpt reads resid_pdrop and emb_pdrop nowhere: a config with them set imports
    with the spec's dropout 0 (the spec's would drop the embeddings and both sublayers)."""
    case = CASES["mpt"]
    config = transformers.MptConfig(**(case.kwargs | {"resid_pdrop": 0.3, "emb_pdrop": 0.3}))
    assert spec_from_config(config.to_dict()).dropout == 0.0
    ref = transformers.MptForCausalLM._from_config(config)
    ids = torch.randint(2, 101, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # and indeed: train() gives eval's logits
        torch.testing.assert_close(ref.train()(ids).logits, ref.eval()(ids).logits,
                                   rtol=0, atol=0)


@pytest.mark.parametrize(("name", "value"), [("gpt2", 1.0), ("bert", -0.1), ("llama", "0.1")])
def test_a_bad_rate_is_refused_naming_the_key(name: str, value: Any) -> None:
    data = CASES[name]
    config = getattr(transformers, data.config)(**data.kwargs).to_dict() | {KEYS[name]: value}
    with pytest.raises(TfgraphError, match=KEYS[name]):
        spec_from_config(config)


# model_type -> its attention-weight dropout key where it is attention.dropout (the rest:
# "attention_dropout"); None where it stays inert (tfgraph/hf/t5.py, mpt.py, modernbert.py,
# falcon.py say why)
_OTHER_KEYS: dict[str, str | None] = {
    "gpt2": "attn_pdrop", "gptj": "attn_pdrop", "gpt_bigcode": "attn_pdrop",
    "bert": "attention_probs_dropout_prob", "roberta": "attention_probs_dropout_prob",
    "xlm-roberta": "attention_probs_dropout_prob", "t5": None, "mpt": "attn_config",
    "modernbert": None}
_INERT_KEYS = {"t5": "dropout_rate", "modernbert": "attention_dropout",
               "falcon": "attention_dropout"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_family_reads_and_writes_it_or_leaves_it_inert(name: str) -> None:
    """Every case of test_hf_families, in process: its key at 0.2 imports as
    attention.dropout 0.2 and hf_config writes 0.2 back under it, 0 writes 0; or, for the
    families where it means more than attention.dropout, nothing changes in the spec."""
    case = CASES[name]
    cls = getattr(transformers, case.config)
    model_type = cls().model_type
    alibi = bool(case.kwargs.get("alibi"))
    key = None if model_type == "falcon" and not alibi \
        else _OTHER_KEYS.get(model_type, "attention_dropout")
    if key is None:
        data = cls(**case.kwargs).to_dict()
        data[_INERT_KEYS[model_type]] = 0.2
        assert spec_from_config(data).attention.dropout == 0.0
        return
    if key == "attn_config":  # MptAttentionConfig types attn_pdrop as an int: set in the dict
        data = cls(**case.kwargs).to_dict()
        data["attn_config"] = data["attn_config"] | {"attn_pdrop": 0.2}
        spec = spec_from_config(data)  # the attention weights and the sublayers' outputs
        assert (spec.attention.dropout, spec.dropout, spec.embedding_dropout) == (0.2, 0.2, 0.0)
        return
    for p in (0.2, 0.0):
        spec = spec_from_config(cls(**(case.kwargs | {key: p})).to_dict())
        assert spec.attention.dropout == p
        export = hf_config(spec)
        assert export.model_type == model_type and export.config[key] == p
