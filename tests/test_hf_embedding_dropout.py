"""Residual and embedding dropout through the Hugging Face round trip (`tfgraph import`,
`build --to hf`), where a family's rate after the embeddings is not its sublayers' one.

GPT-2 (and GPT-J, GPTBigCode) and Phi read ``embd_pdrop`` after the embeddings beside
``resid_pdrop`` after each sublayer (Phi-2: 0.0 and 0.1), StarCoder2 ``embedding_dropout``
beside ``residual_dropout``: ``embedding.dropout`` and ``dropout``.
Seed-OSS's ``residual_dropout``, Phi-3's ``resid_pdrop``, BLOOM's ``hidden_dropout`` and OPT's
``dropout`` drop the sublayers' outputs and never the embeddings: ``embedding.dropout`` 0. MPT's
one ``attn_config.attn_pdrop`` drops the attention weights and both sublayers' outputs:
``attention.dropout`` and ``dropout``, ``embedding.dropout`` 0. In train() tfgraph's logits
equal transformers' from the same torch seed: on CPU both draw each mask from the global
generator on tensors of the same shape in the same order (embeddings, then per layer the
attention weights, the attention output, the feed-forward output).
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
from tfgraph.hf import name_map
from tfgraph.hf.export_config import hf_config

from cli_support import hf_config_written
from parity_support import check
from test_hf_families import CASES, build_reference, family_seed, import_spec, inputs

transformers = pytest.importorskip("transformers")

# case of test_hf_families -> (config keys set, (dropout, embedding.dropout, attention.dropout)
# the import reads from them)
RATES: dict[str, tuple[dict[str, Any], tuple[float, float, float]]] = {
    "phi": ({"resid_pdrop": 0.1, "embd_pdrop": 0.0}, (0.1, 0.0, 0.0)),
    "gpt2": ({"resid_pdrop": 0.1, "embd_pdrop": 0.2, "attn_pdrop": 0.0}, (0.1, 0.2, 0.0)),
    "gptj": ({"resid_pdrop": 0.1, "embd_pdrop": 0.0}, (0.1, 0.0, 0.0)),
    "gpt_bigcode": ({"resid_pdrop": 0.1, "embd_pdrop": 0.3, "attn_pdrop": 0.0},
                    (0.1, 0.3, 0.0)),
    "seed_oss": ({"residual_dropout": 0.1, "attention_dropout": 0.0}, (0.1, 0.0, 0.0)),
    "phi3": ({"resid_pdrop": 0.1, "embd_pdrop": 0.3}, (0.1, 0.0, 0.0)),
    "bloom": ({"hidden_dropout": 0.1}, (0.1, 0.0, 0.0)),
    "opt": ({"dropout": 0.1}, (0.1, 0.0, 0.0)),
    "mpt": ({"attn_pdrop": 0.1}, (0.1, 0.0, 0.1)),
    "starcoder2": ({"residual_dropout": 0.1, "embedding_dropout": 0.2}, (0.1, 0.2, 0.0)),
}


def _reference(name: str) -> Any:
    """Case ``name``'s model with RATES' dropout, in eval(), and test_hf_families' weights."""
    case = CASES[name]
    keys = RATES[name][0]
    if name == "mpt":
        config = transformers.MptConfig(**case.kwargs)
        # transformers 5.24's strict MptAttentionConfig types attn_pdrop as an int and
        # refuses 0.1 (MosaicML's own configs and earlier transformers take any rate); set it
        # past the validator, then modeling_mpt builds its dropouts from it as usual
        object.__setattr__(config.attn_config, "attn_pdrop", keys["attn_pdrop"])
    else:
        config = getattr(transformers, case.config)(**(case.kwargs | keys))
    ref = getattr(transformers, case.model)._from_config(config, attn_implementation=case.attn)
    ref.load_state_dict(build_reference(case, family_seed(name)).state_dict())
    return ref.eval()


def _save(ref: Any, folder: Path) -> None:
    ref.config.save_pretrained(folder)
    if ref.config.model_type == "mpt":  # to_dict writes the sub-config's attribute as set
        data = json.loads((folder / "config.json").read_text())
        assert data["attn_config"]["attn_pdrop"] == RATES["mpt"][0]["attn_pdrop"]


@pytest.mark.parametrize("name", sorted(RATES))
def test_train_logits_match_hugging_face(name: str, tmp_path: Path) -> None:
    ref = _reference(name)
    _save(ref, tmp_path / "hf")
    spec = import_spec(tmp_path / "hf", tmp_path / "spec.yaml")
    assert (spec.dropout, spec.embedding_dropout, spec.attention.dropout) == RATES[name][1]
    kwargs, feeds = inputs(spec, CASES[name].kind)
    data = json.loads((tmp_path / "hf" / "config.json").read_text())
    ours = to_torch(tfgraph.compile(spec), weights=name_map(data, spec).to_tfgraph(
        ref.state_dict()))
    with torch.no_grad():
        evaluated = ours.eval()(*feeds.values())
        check(evaluated, ref(**kwargs).logits)
        torch.manual_seed(0)
        trained = ours.train()(*feeds.values())
        assert (trained - evaluated).abs().max().item() > 100 * 1e-4
        torch.manual_seed(0)
        check(trained, ref.train()(**kwargs).logits)


@pytest.mark.parametrize("name", ["phi", "gpt2", "seed_oss", "starcoder2"])
def test_to_hf_writes_the_rates_back(name: str, tmp_path: Path) -> None:
    ref = _reference(name)
    _save(ref, tmp_path / "hf")
    import_spec(tmp_path / "hf", tmp_path / "spec.yaml")
    written = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    dropout, embedding, _ = RATES[name][1]
    assert written["dropout"] == dropout and written["embedding"]["dropout"] == embedding
    back = hf_config_written(tmp_path / "spec.yaml", tmp_path / "out")
    for key, value in RATES[name][0].items():
        assert back[key] == value, key
    loaded = transformers.AutoConfig.from_pretrained(tmp_path / "out")
    assert all(getattr(loaded, k) == v for k, v in RATES[name][0].items())


def test_one_rate_writes_no_embedding_dropout(tmp_path: Path) -> None:
    """embd_pdrop equal to resid_pdrop: the spec file has only ``dropout``, as before."""
    case = CASES["gpt2"]
    config = transformers.GPT2Config(**(case.kwargs | {"resid_pdrop": 0.2, "embd_pdrop": 0.2}))
    config.save_pretrained(tmp_path / "hf")
    spec = import_spec(tmp_path / "hf", tmp_path / "spec.yaml")
    assert spec.dropout == 0.2 and spec.embedding.dropout is None
    assert "dropout" not in yaml.safe_load((tmp_path / "spec.yaml").read_text())["embedding"]
    assert hf_config_written(tmp_path / "spec.yaml", tmp_path / "out")["embd_pdrop"] == 0.2


def test_families_without_embedding_dropout_refuse_a_spec_with_one() -> None:
    """Seed-OSS has no dropout after the embeddings: a spec with the sublayers' rate there
    too does not come back from residual_dropout, so no family takes it."""
    spec = import_spec_in_process("seed_oss")
    with_it = spec.model_copy(update={"embedding": spec.embedding.model_copy(
        update={"dropout": None})})
    assert with_it.embedding_dropout == 0.1
    with pytest.raises(TfgraphError, match="embedding.dropout"):
        hf_config(with_it)
    assert hf_config(spec).config["residual_dropout"] == 0.1


def test_mpt_exports_only_a_rate_transformers_loads() -> None:
    """transformers 5.24 refuses a float attn_pdrop: an MPT spec with attn_pdrop 0.1 is not
    written as MPT (`--to hf` writes only folders transformers loads); at 0 it is."""
    spec = import_spec_in_process("mpt")
    assert spec.attention.dropout == 0.1
    with pytest.raises(TfgraphError, match="no Hugging Face family"):
        hf_config(spec)
    quiet = spec.model_copy(update={"dropout": 0.0, "attention": spec.attention.model_copy(
        update={"dropout": 0.0})})
    export = hf_config(quiet)
    assert export.model_type == "mpt" and export.config["attn_config"]["attn_pdrop"] == 0


def import_spec_in_process(name: str) -> tfgraph.Spec:
    from tfgraph.hf import spec_from_config

    data = _reference(name).config.to_dict()
    return spec_from_config(data, description=f"model_type {data['model_type']}")
