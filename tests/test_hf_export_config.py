"""Specs as Hugging Face configs (``tfgraph.hf.export_config.hf_config``), checked against
transformers itself: every tiny family case of tests/test_hf_families.py goes config -> spec ->
config and back to the same model type, a config transformers builds into a model with the
original's parameters, and the same spec again; every full-size library spec that comes from a
Hugging Face config exports to a model (on the meta device) with the spec's parameter count;
a spec no family holds is one line naming the closest family and the field it would change."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import tfgraph
from tfgraph.errors import TfgraphError
from tfgraph.hf import spec_from_config
from tfgraph.hf.export_config import ARCHITECTURES, PREFERENCE, HFExport, hf_config
from tfgraph.spec.schema import Spec

from test_hf_families import CASES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
# the library specs imported from published configs (tests/data/hf_configs/) and the ones
# written by hand after a Hugging Face checkpoint
HF_SPECS = sorted(p.stem for p in (ROOT / "tests" / "data" / "hf_configs").glob("*.json"))
HAND_WRITTEN = {"gpt2": "gpt2", "bert-base": "bert", "llama": "llama", "tiny-qwen2": "qwen2",
                "tiny-gemma3": "gemma3_text", "tiny-gptj": "gptj", "tiny-phi": "phi"}


def same(a: Spec, b: Spec) -> bool:
    """Equal specs, name and description aside."""
    skip = {"name", "description"}
    return bool(a.model_dump(exclude=skip) == b.model_dump(exclude=skip))


def build(export: HFExport) -> Any:
    """The config transformers makes of the exported config.json, and its model on meta."""
    config = transformers.AutoConfig.for_model(**json.loads(json.dumps(export.config)))
    with torch.device("meta"):
        model = getattr(transformers, export.auto_class).from_config(config)
    assert type(model).__name__ == export.config["architectures"][0]
    return config, model


def trainable(model: Any) -> int:
    """Parameters a checkpoint trains (Marian's sinusoid tables are frozen)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("case", sorted(CASES))
def test_family_case_exports_its_own_config(case: str) -> None:
    c = CASES[case]
    original = getattr(transformers, c.config)(**c.kwargs)
    data = original.to_dict()
    spec = spec_from_config(data)
    export = hf_config(spec)
    assert export.model_type == data["model_type"]
    assert export.config["model_type"] == export.model_type
    assert export.config["dtype"] == spec.dtype == "float32"
    assert export.config["tie_word_embeddings"] == spec.embedding.tie_output
    assert same(spec_from_config(export.config), spec)

    config, model = build(export)
    # no token id left to the config class's default, which may lie outside a small vocabulary
    # (ModernBertConfig's cls_token_id 50281): each is the spec's, or None
    vocab = spec.vocab_size("source")
    for key, value in config.to_dict().items():
        if key.endswith("_token_id") and value is not None:
            ids = value if isinstance(value, list) else [value]
            assert all(0 <= i < vocab for i in ids), (key, value, vocab)
    # what transformers fills in around the exported fields changes nothing either
    assert same(spec_from_config(config.to_dict()), spec)
    with torch.device("meta"):
        reference = getattr(transformers, c.model)._from_config(original)
    assert trainable(model) == trainable(reference)
    assert sum(p.numel() for p in model.parameters()) == sum(
        p.numel() for p in reference.parameters())


@pytest.mark.parametrize("name", HF_SPECS + sorted(HAND_WRITTEN))
def test_library_spec_exports_with_its_parameter_count(name: str) -> None:
    spec = tfgraph.load_spec(ROOT / "specs" / f"{name}.yaml")
    export = hf_config(spec)
    if name in HAND_WRITTEN:
        assert export.model_type == HAND_WRITTEN[name]
    else:
        published = json.loads((ROOT / "tests" / "data" / "hf_configs" / f"{name}.json")
                               .read_text())
        assert export.model_type == published["model_type"]
    assert export.config["dtype"] == spec.dtype
    _, model = build(export)
    assert trainable(model) == tfgraph.compile(spec).report(seq=1)["params"]


def test_a_spec_no_family_holds_is_one_line_naming_the_closest() -> None:
    spec = tfgraph.load_spec(ROOT / "specs" / "base.yaml")
    with pytest.raises(TfgraphError) as info:
        hf_config(spec)
    message = str(info.value)
    assert message == ("transformer-base: no Hugging Face family expresses this spec "
                       "(closest: marian; differs in embedding.sinusoid_layout: interleaved vs "
                       "split)")
    assert info.value.exit_code == 2


def tiny_llama(**changes: Any) -> Spec:
    data = tfgraph.load_spec(ROOT / "specs" / "tiny-llama.yaml").model_dump()
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = data
        for part in parents:
            node = node[part]
        node[last] = value
    return Spec.model_validate(data)


def test_the_round_trip_rejects_what_a_family_would_change() -> None:
    # no Hugging Face family outputs probabilities
    with pytest.raises(TfgraphError, match=r"closest: llama; differs in output: probs vs "
                                           r"logits\)$"):
        hf_config(tiny_llama(output="probs"))
    # Llama has MLP biases and no sliding window, Mistral and Phi-3 the window and no biases
    with pytest.raises(TfgraphError, match=r"closest: llama; differs in attention.window: 16 "
                                           r"vs null\)$"):
        hf_config(tiny_llama(attention__window=16, ffn__bias=True))
    # Llama's config has no dropout (always 0): the Llama spec with dropout after the
    # sublayers only is Phi-3's (resid_pdrop); with dropout after the embeddings too, no
    # family's (Phi-3 reads embd_pdrop nowhere)
    assert hf_config(tiny_llama(dropout=0.1, embedding__dropout=0.0)).model_type == "phi3"
    with pytest.raises(TfgraphError, match=r"closest: llama; differs in dropout: 0.1 vs 0.0"):
        hf_config(tiny_llama(dropout=0.1))


def test_preference_and_the_imported_model_type() -> None:
    plain = tiny_llama(name="x", description="")
    assert hf_config(plain).model_type == "llama"  # also a Mistral, a Phi-3: Llama first
    assert hf_config(tiny_llama(attention__window=16)).model_type == "mistral"
    imported = tiny_llama(description="Imported from a Hugging Face config (model_type phi3)")
    export = hf_config(imported)
    assert export.model_type == "phi3"
    assert export.config["architectures"] == ["Phi3ForCausalLM"]


def test_every_family_is_tried_for_its_arch() -> None:
    tried = [t for order in PREFERENCE.values() for t in order]
    assert sorted(tried) == sorted(ARCHITECTURES) and len(set(tried)) == len(tried)


def test_a_folders_token_ids_are_carried_over() -> None:
    """ModernBERT's cls/sep ids, which the spec language does not hold, come from the source
    folder's config.json (else null: see the family-case test above)."""
    from tfgraph.hf.export_config import hf_folder_facts

    c = CASES["modernbert"]
    kwargs = dict(c.kwargs, cls_token_id=3, sep_token_id=4)
    data = getattr(transformers, c.config)(**kwargs).to_dict()
    config, _ = hf_folder_facts(spec_from_config(data), data)
    assert (config["cls_token_id"], config["sep_token_id"]) == (3, 4)
    config, _ = hf_folder_facts(spec_from_config(data))
    assert (config["cls_token_id"], config["sep_token_id"]) == (None, None)
