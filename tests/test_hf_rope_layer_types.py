"""Rotary settings per layer type read as transformers 5.24 reads them (tfgraph.hf.rope_types).

Gemma 3 and ModernBERT build one rotary table per layer type from ``rope_parameters``'
full_attention / sliding_attention entries, which their config classes complete from a legacy
``rope_scaling`` and legacy top-level thetas; a flat mapping is kept there but never read,
save YaRN's ``truncate``, which transformers reads from the top level alone (never from the
entry, nor from a legacy ``rope_scaling`` the config class copies into it).
Families whose model reads one flat mapping but whose config class declares layer_types
(Qwen2, Qwen3, Qwen2-MoE, Gemma 2, Cohere 2, Ministral) fail on entries per layer type unless
the top level carries its own rope_type and rope_theta. Qwen3-MoE's mask slides every layer
when use_sliding_window is set; its cache follows layer_types, so only all-sliding (or no)
layer_types decode.

Each variant edits a tiny case's config.json (tests/test_hf_families.py) and either imports to
the logits transformers computes from it (float32, 1e-4) or is refused with one line (exit 2);
where the refusal says transformers fails, the test shows that it does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main
from tfgraph.exporters import to_torch
from tfgraph.hf import name_map
from tfgraph.hf.export_config import hf_config

from parity_support import DROP, edit_config_json, greedy_with_cache
from test_hf_config_exact import check_import_logits
from test_hf_families import CASES, build_reference, family_seed

transformers = pytest.importorskip("transformers")

NESTED = {"full_attention": {"rope_type": "default", "rope_theta": 500.0},
          "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}
FLAT_FAILS = "the only one transformers' model reads: it fails"
# a head where YaRN's rounding of the correction range moves the rotary frequencies
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
YARN_ENTRIES = {"full_attention": YARN | {"rope_theta": 10000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}

# name: (case, config.json edits, refusal text or None, transformers fails on it)
VARIANTS: dict[str, tuple[str, dict[str, Any], str | None, bool]] = {
    # Gemma 3: a flat mapping is never read; the entries keep their defaults (1e6, 1e4)
    "gemma3_text-flat-linear": ("gemma3_text", {"rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, None, False),
    "gemma3_text-flat-default": ("gemma3_text", {"rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0}}, None, False),
    # ... a missing entry gets the default, the given one is read
    "gemma3_text-sliding-only": ("gemma3_text", {"rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}}}, None, False),
    # ... entries without theta take the legacy top-level keys
    "gemma3_text-legacy-thetas": ("gemma3_text", {
        "rope_parameters": {"full_attention": {"rope_type": "default"},
                            "sliding_attention": {"rope_type": "default"}},
        "rope_theta": 50000.0, "rope_local_base_freq": 500.0}, None, False),
    # ... a legacy rope_scaling updates the global entry, whose rope_type stays default when
    # rope_scaling says "type" (so it is not scaled)
    "gemma3_text-rope-scaling": ("gemma3_text", {
        "rope_parameters": DROP, "rope_scaling": {"rope_type": "linear", "factor": 4.0},
        "rope_theta": 50000.0}, None, False),
    "gemma3_text-rope-scaling-type": ("gemma3_text", {
        "rope_parameters": DROP, "rope_scaling": {"type": "linear", "factor": 4.0},
        "rope_theta": 5000.0}, None, False),
    "gemma3_text-flat-and-rope-scaling": ("gemma3_text", {
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "and fails", True),
    # ... every layer local: the (scaled) global entry is read by no layer
    "gemma3_text-all-sliding": ("gemma3_text", {"layer_types": ["sliding_attention"] * 3},
                                None, False),
    # ... YaRN's truncate: the entry's (or a legacy rope_scaling's) is not read, a flat one is
    "gemma3_text-yarn-truncate-in-entry": ("gemma3_text", {"head_dim": 64, "rope_parameters": {
        "full_attention": YARN_ENTRIES["full_attention"] | {"truncate": False},
        "sliding_attention": YARN_ENTRIES["sliding_attention"]}}, None, False),
    "gemma3_text-yarn-truncate-rope-scaling": ("gemma3_text", {
        "head_dim": 64, "rope_parameters": DROP, "rope_scaling": YARN | {"truncate": False},
        "rope_theta": 10000.0}, None, False),
    "gemma3_text-yarn-truncate-flat": ("gemma3_text", {"head_dim": 64, "rope_parameters":
                                       YARN_ENTRIES | {"truncate": False}}, None, False),
    "gemma3_text-yarn-truncate-flat-null": ("gemma3_text", {
        "head_dim": 64, "rope_parameters": YARN_ENTRIES | {"truncate": None}}, None, False),
    "gemma3_text-yarn-truncate-flat-text": ("gemma3_text", {
        "head_dim": 64, "rope_parameters": YARN_ENTRIES | {"truncate": "no"}},
        "truncate must be true or false", False),
    # ModernBERT: the legacy thetas fill entries without theta; rope_scaling updates both
    "modernbert-legacy-thetas": ("modernbert", {
        "rope_parameters": {"full_attention": {"rope_type": "default"},
                            "sliding_attention": {"rope_type": "default"}},
        "global_rope_theta": 500.0, "local_rope_theta": 50.0}, None, False),
    "modernbert-rope-scaling": ("modernbert", {"rope_parameters": DROP,
                                               "rope_scaling": {"rope_theta": 500.0}},
                                None, False),
    "modernbert-flat": ("modernbert", {"rope_parameters": {"rope_type": "default",
                                                           "rope_theta": 500.0}},
                        "one mapping per layer type", True),
    # one flat mapping read, though the class declares layer_types
    "gemma2-nested": ("gemma2", {"rope_parameters": NESTED}, FLAT_FAILS, True),
    "cohere2-nested": ("cohere2", {"rope_parameters": NESTED}, FLAT_FAILS, True),
    "ministral-nested": ("ministral", {"rope_parameters": NESTED}, FLAT_FAILS, True),
    "qwen2-nested": ("qwen2", {"rope_parameters": NESTED}, FLAT_FAILS, True),
    "qwen3-nested": ("qwen3", {"rope_parameters": NESTED}, FLAT_FAILS, True),
    "qwen2_moe-nested": ("qwen2_moe", {"rope_parameters": NESTED}, FLAT_FAILS, True),
    "qwen2-nested-and-top": ("qwen2", {"rope_parameters": NESTED | {
        "rope_type": "default", "rope_theta": 700.0}}, None, False),
    # ... and a flat mapping without theta takes the legacy top-level rope_theta
    "gemma2-legacy-theta": ("gemma2", {"rope_parameters": {"rope_type": "default"},
                                       "rope_theta": 500.0}, None, False),
    "cohere2-legacy-theta": ("cohere2", {"rope_parameters": {"rope_type": "default"},
                                         "rope_theta": 500.0}, None, False),
    # Llama's config class has no layer_types: the entries are unknown keys, the rest is read
    "llama-nested-and-top": ("llama", {"rope_parameters": NESTED | {"rope_type": "default"},
                                       "rope_theta": 700.0}, None, False),
    # Qwen3-MoE: every layer slides with use_sliding_window; sliding layer_types without a
    # window break transformers' cache
    "qwen3_moe-window": ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 5},
                         None, False),
    "qwen3_moe-window-sliding-types": ("qwen3_moe", {
        "use_sliding_window": True, "sliding_window": 5,
        "layer_types": ["sliding_attention", "sliding_attention"]}, None, False),
    # ... full layer_types entries beside it: its cache does not slide them, decoding fails
    "qwen3_moe-window-full-types": ("qwen3_moe", {
        "use_sliding_window": True, "sliding_window": 5,
        "layer_types": ["full_attention", "sliding_attention"]}, "layer_types", True),
    "qwen3_moe-types-no-window": ("qwen3_moe", {
        "sliding_window": 5, "layer_types": ["full_attention", "sliding_attention"]},
        "layer_types", True),
}


def _folder(variant: str, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The variant's case saved by its config class, config.json edited."""
    name, edits, _, _ = VARIANTS[variant]
    case = CASES[name]
    folder = tmp_path / variant
    getattr(transformers, case.config)(**case.kwargs).save_pretrained(folder)
    data = edit_config_json(folder, edits)
    return folder, data


def _reference_output(name: str, folder: Path) -> Any:
    case = CASES[name]
    cls = getattr(transformers, case.config)
    ref = build_reference(case, family_seed(name), cls.from_pretrained(folder))
    ids = torch.randint(2, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        if case.kind == "causal":  # a forward, then cached decoding
            return ref.generate(ids, max_new_tokens=3, do_sample=False, eos_token_id=-1,
                                pad_token_id=0)
        return ref(input_ids=ids).logits


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rope_per_layer_type_as_transformers_reads_it(variant: str, tmp_path: Path) -> None:
    name, _, refusal, hf_fails = VARIANTS[variant]
    folder, data = _folder(variant, tmp_path)
    result = CliRunner().invoke(main, ["import", str(folder), "-o", str(tmp_path / "s.yaml")])
    if hf_fails:  # the config the refusal says transformers cannot run
        with pytest.raises(Exception):  # noqa: B017 - whichever error transformers raises
            _reference_output(name, folder)
    if refusal is not None:
        assert result.exit_code == 2, result.output
        assert refusal in result.output and len(result.output.strip().splitlines()) == 1
        return
    assert result.exit_code == 0, result.output
    spec = tfgraph.load_spec(tmp_path / "s.yaml")
    if variant.startswith("qwen3_moe-window"):  # the window, shorter than the inputs
        assert spec.attention.window == 5 and spec.attention.window_pattern is None
    check_import_logits(name, spec, folder, data)


@pytest.mark.parametrize("variant", sorted(
    v for v, (name, _, refusal, _) in VARIANTS.items()
    if refusal is None and CASES[name].kind not in ("masked", "seq2seq")))
def test_greedy_tokens_of_the_imported_variant_equal_transformers(variant: str,
                                                                  tmp_path: Path) -> None:
    """Cached greedy decoding past the sliding windows on a left-padded batch (the rotary
    bases of both layer kinds reach every new token)."""
    name = VARIANTS[variant][0]
    case = CASES[name]
    folder, data = _folder(variant, tmp_path)
    result = CliRunner().invoke(main, ["import", str(folder), "-o", str(tmp_path / "s.yaml")])
    assert result.exit_code == 0, result.output
    spec = tfgraph.load_spec(tmp_path / "s.yaml")
    ref = build_reference(case, family_seed(name),
                          getattr(transformers, case.config).from_pretrained(folder))
    model = to_torch(tfgraph.compile(spec),
                     weights=name_map(data, spec).to_tfgraph(ref.state_dict())).eval()
    gen = torch.Generator().manual_seed(3)
    ids = torch.zeros((2, 11), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate((6, 11)):
        ids[row, -n:] = torch.randint(2, spec.vocab_size("source"), (n,), generator=gen)
        mask[row, -n:] = 1
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                            eos_token_id=-1, pad_token_id=0)[:, ids.shape[1]:]
    assert greedy_with_cache(model, ids, mask, 8).tolist() == want.tolist()


@pytest.mark.parametrize("variant", ["gemma3_text-yarn-truncate-flat",
                                     "gemma3_text-yarn-truncate-in-entry"])
def test_gemma3_yarn_truncate_exports_where_transformers_reads_it(variant: str,
                                                                  tmp_path: Path) -> None:
    """The imported spec's YaRN truncate is exported at rope_parameters' top level: the model
    transformers builds from the exported config, given the reference's weights, computes the
    reference's logits."""
    name = VARIANTS[variant][0]
    case = CASES[name]
    folder, _ = _folder(variant, tmp_path)
    result = CliRunner().invoke(main, ["import", str(folder), "-o", str(tmp_path / "s.yaml")])
    assert result.exit_code == 0, result.output
    spec = tfgraph.load_spec(tmp_path / "s.yaml")
    scaling = spec.embedding.rope_scaling
    assert scaling is not None and scaling.truncate is variant.endswith("in-entry")
    export = hf_config(spec)
    assert export.config["rope_parameters"]["truncate"] is scaling.truncate
    assert "truncate" not in export.config["rope_parameters"]["full_attention"]
    cls = getattr(transformers, case.config)
    ref = build_reference(case, family_seed(name), cls.from_pretrained(folder))
    config = transformers.AutoConfig.for_model(**json.loads(json.dumps(export.config)))
    model = getattr(transformers, case.model)._from_config(config, attn_implementation=case.attn)
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(2, 100, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = model.eval()(input_ids=ids).logits, ref(input_ids=ids).logits
    assert (got - want).abs().max().item() <= 1e-4
