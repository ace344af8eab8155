"""Rotary settings per layer type read as transformers 5.24 reads them (tfgraph.hf.rope_types).

Gemma 3 and ModernBERT build one rotary table per layer type from ``rope_parameters``'
full_attention / sliding_attention entries, which their config classes complete from a legacy
``rope_scaling`` and legacy top-level thetas; a flat mapping is kept there but never read.
Families whose model reads one flat mapping but whose config class declares layer_types
(Qwen2, Qwen3, Qwen2-MoE, Gemma 2, Cohere 2, Ministral) fail on entries per layer type unless
the top level carries its own rope_type and rope_theta. Qwen3-MoE slides every layer when
use_sliding_window is set, whatever layer_types says.

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

from parity_support import check
from test_hf_families import CASES, build_reference, family_seed, inputs

transformers = pytest.importorskip("transformers")

DROP: Any = object()  # an edit that removes the key from config.json
NESTED = {"full_attention": {"rope_type": "default", "rope_theta": 500.0},
          "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}
FLAT_FAILS = "the only one transformers' model reads: it fails"

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
    # Llama's config class has no layer_types: the entries are unknown keys, the rest is read
    "llama-nested-and-top": ("llama", {"rope_parameters": NESTED | {"rope_type": "default"},
                                       "rope_theta": 700.0}, None, False),
    # Qwen3-MoE: every layer slides with use_sliding_window; sliding layer_types without a
    # window break transformers' cache
    "qwen3_moe-window": ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 5,
                                       "layer_types": ["full_attention", "sliding_attention"]},
                         None, False),
    "qwen3_moe-types-no-window": ("qwen3_moe", {
        "sliding_window": 5, "layer_types": ["full_attention", "sliding_attention"]},
        "layer_types", True),
}


def _reference_output(name: str, folder: Path) -> Any:
    case = CASES[name]
    cls = getattr(transformers, case.config)
    ref = build_reference(case, family_seed(name), cls.from_pretrained(folder))
    ids = torch.randint(2, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    kwargs = ({"input_ids": ids, "decoder_input_ids": ids} if case.kind == "seq2seq"
              else {"input_ids": ids})
    with torch.no_grad():
        return ref(**kwargs).logits


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rope_per_layer_type_as_transformers_reads_it(variant: str, tmp_path: Path) -> None:
    name, edits, refusal, hf_fails = VARIANTS[variant]
    case = CASES[name]
    cls = getattr(transformers, case.config)
    folder = tmp_path / variant
    cls(**case.kwargs).save_pretrained(folder)
    data = json.loads((folder / "config.json").read_text())
    for key, value in edits.items():
        if value is DROP:
            data.pop(key, None)
        else:
            data[key] = value
    (folder / "config.json").write_text(json.dumps(data))

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
    if variant == "qwen3_moe-window":  # the window is in the spec, shorter than the inputs
        assert spec.attention.window == 5 and spec.attention.window_pattern is None
    ref = build_reference(case, family_seed(name), cls.from_pretrained(folder))
    kwargs, feeds = inputs(spec, case.kind)
    with torch.no_grad():
        expected = ref(**kwargs).logits
        weights = name_map(data, spec).to_tfgraph(ref.state_dict())
        ours = to_torch(tfgraph.compile(spec), weights=weights).eval()
        check(ours(*feeds.values()), expected)
