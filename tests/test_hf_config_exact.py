"""Config keys whose effect transformers 5.24 decides, not tfgraph's defaults: each variant of
a family's tiny case (tests/test_hf_families.py) either imports to the logits transformers
computes from the same config.json (within 1e-4, float32) or is refused with one line (exit 2).

Each variant builds the case's config with extra keyword arguments, saves it, edits
config.json (keys dropped, as hub configs lack them, or set, as the config class writes
them in an older form), reads it back with the config class (what transformers' model then
sees) and compares that model with the imported spec. The findings they pin (review C):
``partial_rotary_factor`` is applied only where the family's rotary embedding reads it;
Gemma 3 never soft-caps its attention scores; families without sliding-window attention
ignore ``layer_types`` and ``sliding_window`` and Mistral slides every layer; BLOOM's
``slow_but_exact`` path drops two biases; DeepSeek's latent norms keep eps 1e-6; a key
config.json lacks takes the config class's default; gated T5 (Flan-T5) imports; Phi-3's
top-level ``partial_rotary_factor`` is read; untied BART tables are refused at import; a
null YaRN ``truncate`` does not round the correction range (``if truncate:``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main
from tfgraph.exporters import to_torch
from tfgraph.hf import name_map

from parity_support import DROP, check, edit_config_json
from test_hf_families import CASES, build_reference, family_seed, inputs

transformers = pytest.importorskip("transformers")


# name: (case, extra config-class arguments, config.json edits, refusal text or None)
VARIANTS: dict[str, tuple[str, dict[str, Any], dict[str, Any], str | None]] = {
    # 1. partial_rotary_factor: Llama's kin rotate the whole head whatever it says ...
    "llama-fraction": ("llama", {"partial_rotary_factor": 0.5}, {}, None),
    "llama-fraction-legacy": ("llama", {}, {"rope_parameters": DROP, "rope_theta": 5000.0,
                                            "partial_rotary_factor": 0.5}, None),
    "mixtral-fraction": ("mixtral", {"partial_rotary_factor": 0.5}, {}, None),
    "gemma2-fraction": ("gemma2", {"partial_rotary_factor": 0.5}, {}, None),
    "falcon-fraction": ("falcon-new", {"partial_rotary_factor": 0.5}, {}, None),
    "cohere-fraction": ("cohere", {"partial_rotary_factor": 0.5}, {}, None),
    "starcoder2-fraction": ("starcoder2", {"partial_rotary_factor": 0.5}, {}, None),
    # ... and fail with a scaled rotary type, which is refused
    "llama-fraction-scaled": ("llama", {}, {"rope_parameters": {
        "rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5}}, "and fails"),
    # ... where the family reads it, it still counts (8: Phi-3's top-level key, Phi-4-mini)
    "phi3-fraction": ("phi3", {"partial_rotary_factor": 0.75}, {}, None),
    "phi3-fraction-legacy": ("phi3", {}, {"rope_parameters": DROP, "rope_theta": 5000.0,
                                          "partial_rotary_factor": 0.75}, None),
    "glm-fraction": ("glm", {"partial_rotary_factor": 0.25}, {}, None),
    # 2. Gemma3Attention never passes attn_logit_softcapping to the attention function
    "gemma3_text-softcap": ("gemma3_text", {"attn_logit_softcapping": 20.0}, {}, None),
    # 3. no sliding window in Llama, OLMo 2, Granite; Mistral slides every layer
    "llama-layer-types": ("llama", {}, {"sliding_window": 5, "layer_types": [
        "full_attention", "sliding_attention"]}, None),
    "olmo2-layer-types": ("olmo2", {}, {"sliding_window": 5, "layer_types": [
        "full_attention", "sliding_attention"]}, None),
    "granite-layer-types": ("granite", {}, {"sliding_window": 5, "layer_types": [
        "sliding_attention", "sliding_attention"]}, None),
    "mistral-layer-types": ("mistral", {"sliding_window": 5}, {"layer_types": [
        "full_attention", "sliding_attention"]}, None),
    # 4. BLOOM's slow_but_exact path drops the biases of dense and dense_4h_to_h
    "bloom-slow-but-exact": ("bloom", {"slow_but_exact": True, "pretraining_tp": 2}, {},
                             "slow_but_exact"),
    "bloom-tp-alone": ("bloom", {"pretraining_tp": 2}, {}, None),
    # 5. q_a_layernorm and kv_a_layernorm: DeepseekV*RMSNorm's eps 1e-6
    "deepseek_v3-eps": ("deepseek_v3", {"rms_norm_eps": 1e-2}, {}, None),
    "deepseek_v2-eps": ("deepseek_v2", {"rms_norm_eps": 1e-2}, {}, None),
    # 6. a key config.json lacks: the config class's default
    "pythia-no-rope": ("pythia", {}, {"rope_parameters": DROP}, None),
    "phi-no-rope": ("phi", {}, {"rope_parameters": DROP}, None),
    "stablelm-no-rope": ("stablelm", {}, {"rope_parameters": DROP}, None),
    "nemotron-no-rope": ("nemotron", {}, {"rope_parameters": DROP}, None),
    "glm4-no-rope": ("glm4", {}, {"rope_parameters": DROP}, None),
    "helium-no-rope": ("helium", {}, {"rope_parameters": DROP}, None),
    "mixtral-no-rope": ("mixtral", {}, {"rope_parameters": DROP}, None),
    "phimoe-no-rope": ("phimoe", {}, {"rope_parameters": DROP}, None),
    "cohere-no-rope": ("cohere", {}, {"rope_parameters": DROP}, None),
    "gemma2-no-caps": ("gemma2", {}, {"attn_logit_softcapping": DROP,
                                      "final_logit_softcapping": DROP,
                                      "query_pre_attn_scalar": DROP}, None),
    "gemma2-null-caps": ("gemma2", {}, {"attn_logit_softcapping": None,
                                        "final_logit_softcapping": None}, None),
    "gemma3_text-no-scalar": ("gemma3_text", {}, {"query_pre_attn_scalar": DROP}, None),
    # ... a constant, not what other keys suggest (tests/test_hf_missing_keys.py): three
    # dense layers, head_dim 128, two key heads; Mistral's 8 key heads do not divide 4
    "deepseek_v3-no-dense-count": ("deepseek_v3", {"num_hidden_layers": 4},
                                   {"first_k_dense_replace": DROP}, None),
    "qwen3-no-head-dim": ("qwen3", {}, {"head_dim": DROP}, None),
    "glm-no-kv-heads": ("glm", {"num_key_value_heads": 4}, {"num_key_value_heads": DROP},
                        None),
    "mistral-no-kv-heads": ("mistral", {}, {"num_key_value_heads": DROP},
                            "num_key_value_heads = 8"),
    # 7. gated T5 (Flan-T5, T5 v1.1): dense_act_fn is derived from feed_forward_proj
    "t5-gated-gelu": ("t5", {"feed_forward_proj": "gated-gelu"}, {}, None),
    "t5-gated-silu": ("t5", {"feed_forward_proj": "gated-silu"}, {}, None),
    # T5 v1.1 / Flan-T5 as transformers 5 saves them: tied, scale_decoder_outputs false
    "t5-v1_1": ("t5", {"feed_forward_proj": "gated-gelu", "tie_word_embeddings": False}, {},
                None),
    # 9. untied BART / mBART: four token tables, refused at import (not at build)
    "bart-untied": ("bart", {"tie_word_embeddings": False}, {}, "tie_word_embeddings"),
    "mbart-untied": ("mbart", {"tie_word_embeddings": False}, {}, "tie_word_embeddings"),
    # 10. YaRN's truncate, where the head is wide enough for the rounding to move frequencies
    "llama-yarn-truncate-null": ("llama", {}, {"head_dim": 64, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "rope_theta": 10000.0, "truncate": None}}, None),
    "llama-yarn-truncate-text": ("llama", {}, {"head_dim": 64, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16,
        "rope_theta": 10000.0, "truncate": "no"}}, "truncate must be true or false"),
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_config_key_is_honoured_as_transformers_does_or_refused(variant: str,
                                                                 tmp_path: Path) -> None:
    name, extra, edits, refusal = VARIANTS[variant]
    case = CASES[name]
    cls = getattr(transformers, case.config)
    folder = tmp_path / variant
    cls(**(case.kwargs | extra)).save_pretrained(folder)
    data = edit_config_json(folder, edits)

    out = tmp_path / f"{variant}.yaml"
    result = CliRunner().invoke(main, ["import", str(folder), "-o", str(out)])
    if refusal is not None:
        assert result.exit_code == 2, result.output
        assert refusal in result.output and len(result.output.strip().splitlines()) == 1
        return
    assert result.exit_code == 0, result.output
    check_import_logits(name, tfgraph.load_spec(out), folder, data)


def check_import_logits(name: str, spec: Any, folder: Path, data: dict[str, Any]) -> None:
    """The imported ``spec``'s logits, with the folder's weights mapped through the name map,
    equal transformers' model loaded from ``folder`` (``config.json`` content ``data``)."""
    case = CASES[name]
    cls = getattr(transformers, case.config)
    ref = build_reference(case, family_seed(name), cls.from_pretrained(folder))
    kwargs, feeds = inputs(spec, case.kind)
    with torch.no_grad():
        expected = ref(**kwargs).logits
        weights = name_map(data, spec).to_tfgraph(ref.state_dict())
        ours = to_torch(tfgraph.compile(spec), weights=weights).eval()
        check(ours(*feeds.values()), expected)
