"""Strict import (issue 25 item 1): no config.json key changes the computation unread.

Every key of a supported family's config is read, inert (tfgraph.hf.strict.INERT), legacy
(today's transformers no longer reads it) or at the value the family's math assumes (the
config class's default, tfgraph.hf.config_defaults); anything else is exit 2 naming the key.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tfgraph.errors import TfgraphError
from tfgraph.hf import FAMILIES, spec_from_config
from tfgraph.hf.config_defaults import DEFAULTS
from tfgraph.hf.strict import LEGACY, _inert

from cli_support import refused
from cli_support import tfgraph as run_cli

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parent))
from test_hf_families import CASES  # noqa: E402  (the tiny configs of every family)


def test_the_assumed_values_are_transformers_defaults() -> None:
    """Regenerate tfgraph/hf/config_defaults.py when transformers' config classes change."""
    for model_type in FAMILIES:
        config = transformers.AutoConfig.for_model(model_type).to_dict()
        assert DEFAULTS[model_type] == {k: v for k, v in config.items() if not _inert(k)}, \
            model_type


def test_a_t5_folder_that_does_not_scale_its_decoder_output_is_refused(tmp_path: Path) -> None:
    """transformers 5.24's T5 writes scale_decoder_outputs; false made tfgraph's logits 1/8
    of transformers' (it scaled by d_model ** -0.5 as older T5 did) without a word."""
    config = transformers.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                   vocab_size=101, scale_decoder_outputs=False)
    config.save_pretrained(tmp_path)
    for argv in (("import", str(tmp_path)), ("report", str(tmp_path)),
                 ("build", str(tmp_path), "--to", "onnx", "--seed", "0", "-o",
                  str(tmp_path / "m.onnx"))):
        refused(run_cli(*argv), "scale_decoder_outputs", "false")
    assert not (tmp_path / "m.onnx").exists()


def test_a_config_relabelled_as_another_family_is_refused() -> None:
    """A Granite config called llama: its multipliers are not Llama's."""
    data = transformers.GraniteConfig(embedding_multiplier=12.0).to_dict()
    data["model_type"] = "llama"
    with pytest.raises(TfgraphError, match="embedding_multiplier = 12.0"):
        spec_from_config(data)


def test_an_unknown_family_names_the_closest_one_and_what_it_lacks() -> None:
    with pytest.raises(TfgraphError) as caught:
        spec_from_config(transformers.GraniteConfig().to_dict())
    text = str(caught.value)
    assert "granite" in text and "closest is llama" in text
    assert "embedding_multiplier" in text and "logits_scaling" in text


def _flip(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 0.125
    if isinstance(value, str):
        return "relu" if value != "relu" else "gelu"
    if value is None:
        return 7
    return None  # lists and mappings: rope and layer patterns, covered by the family tests


# Keys other settings make irrelevant in transformers too (the spec rightly does not change):
# Qwen's window keys without use_sliding_window and a sliding_window; Gemma 3's pattern when
# layer_types is given.
_MOOT = {
    "qwen2": {"use_sliding_window", "sliding_window", "max_window_layers"},
    "qwen3": {"use_sliding_window", "sliding_window", "max_window_layers"},
    "qwen2_moe": {"sliding_window", "max_window_layers"},
    "gemma3_text": {"sliding_window_pattern"},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_key_is_honoured_or_refused(name: str) -> None:
    """Each non-inert key of the family's tiny config set to another value (through its
    config class, so derived keys follow): the import refuses it (exit 2) or its spec
    changes; it never builds the same spec as if the key were not there."""
    case = CASES[name]
    cls = getattr(transformers, case.config)
    base = cls(**case.kwargs).to_dict()
    model_type = base["model_type"]
    want = spec_from_config(base).model_dump()
    ignored = []
    for key, value in base.items():
        if _inert(key) or key in LEGACY.get(model_type, ()):
            continue
        new = _flip(value)
        if new is None:
            continue
        try:
            flipped = cls(**(case.kwargs | {key: new})).to_dict()
        except Exception:  # noqa: BLE001 - the config class refuses the value itself
            continue
        if flipped.get(key) != new:  # a key the class derives: set it as a folder would
            flipped = base | {key: new}
        try:
            got = spec_from_config(flipped).model_dump()
        except TfgraphError:
            continue
        if got == want and key not in _MOOT.get(model_type, ()):
            ignored.append(f"{key}: {json.dumps(value)} -> {json.dumps(new)}")
    assert not ignored, ignored
