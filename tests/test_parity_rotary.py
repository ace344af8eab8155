"""Parity of the rotary knobs (embedding.rotary_fraction, rotary_layout, rope_scaling) and of
norm.unit_offset / ffn.activation geglu_tanh with Hugging Face models built from their config
classes with random weights: the same parameter count and logits within 1e-4 through to_torch
and through ONNX (``parity_support.check_against``). Each test also checks that the knob
matters, so that a back end ignoring it fails."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.schema import Spec

from parity_support import (ATOL, check_against, llama_family_config, llama_family_weights,
                            neox_weights, randomize, tiny)

transformers = pytest.importorskip("transformers")


def _differs(spec: Spec, weights: dict[str, Tensor], ids: Tensor, expected: Tensor,
             **embedding: Any) -> None:
    """The spec with ``embedding`` fields changed gives logits far from ``expected``: the
    knob under test is visible at this length and these weights."""
    data = spec.model_dump()
    data["embedding"].update(embedding)
    other = to_torch(tfgraph.compile(Spec.model_validate(data)), weights=weights).eval()
    with torch.no_grad():
        assert (other(ids) - expected).abs().max().item() > 100 * ATOL


def _no_dropout(**kw: Any) -> dict[str, Any]:
    return dict(bos_token_id=0, eos_token_id=0, pad_token_id=None, **kw)


def test_hf_pythia_partial_rotary() -> None:
    """rotary_fraction 0.25 against GPT-NeoX with partial_rotary_factor 0.25 (Pythia):
    catches rotating the whole head, or the wrong quarter of it."""
    spec = tiny("tiny-pythia.yaml")
    assert spec.rotary_dim == 4
    config = transformers.GPTNeoXConfig(**_no_dropout(
        hidden_size=spec.d_model, intermediate_size=spec.ffn.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=spec.attention.heads,
        vocab_size=spec.vocab, max_position_embeddings=spec.max_len,
        rope_parameters={"rope_type": "default", "rope_theta": spec.embedding.rope_theta,
                         "partial_rotary_factor": spec.embedding.rotary_fraction},
        layer_norm_eps=spec.norm.eps, use_parallel_residual=True, hidden_act="gelu",
        tie_word_embeddings=False, attention_dropout=0.0, hidden_dropout=0.0))
    ref = transformers.GPTNeoXForCausalLM._from_config(config, attn_implementation="eager").eval()
    assert ref.gpt_neox.rotary_emb.inv_freq.numel() == spec.rotary_dim // 2  # really partial
    randomize(ref, seed=21)
    weights = neox_weights(spec, ref.state_dict())
    ids, expected = check_against(spec, ref, weights)
    _differs(spec, weights, ids, expected, rotary_fraction=1.0)


def test_hf_gptj_interleaved_partial_rotary() -> None:
    """rotary_layout interleaved with rotary_dim 4 of 16 against GPT-J (one shared norm,
    no attention biases, biased MLP, head bias): catches rotate-half pairs."""
    spec = tiny("tiny-gptj.yaml")
    config = transformers.GPTJConfig(**_no_dropout(
        vocab_size=spec.vocab, n_positions=spec.max_len, n_embd=spec.d_model,
        n_layer=spec.layers, n_head=spec.attention.heads, rotary_dim=spec.rotary_dim,
        n_inner=spec.ffn.hidden, activation_function="gelu_new", resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=spec.norm.eps,
        tie_word_embeddings=False))
    ref = transformers.GPTJForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=23)
    sd = ref.state_dict()
    weights = {"embed.tokens.weight": sd["transformer.wte.weight"],
               "head.weight": sd["lm_head.weight"], "head.bias": sd["lm_head.bias"]}
    for kind in ("weight", "bias"):
        weights[f"decoder.norm.{kind}"] = sd[f"transformer.ln_f.{kind}"]
    for i in range(spec.layers):
        src, dst = f"transformer.h.{i}", f"decoder.layers.{i}"
        for r, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
            weights[f"{dst}.self_attn.{r}.weight"] = sd[f"{src}.attn.{theirs}.weight"]
        for kind in ("weight", "bias"):
            weights[f"{dst}.ffn.up.{kind}"] = sd[f"{src}.mlp.fc_in.{kind}"]
            weights[f"{dst}.ffn.down.{kind}"] = sd[f"{src}.mlp.fc_out.{kind}"]
            weights[f"{dst}.norm.{kind}"] = sd[f"{src}.ln_1.{kind}"]
    ids, expected = check_against(spec, ref, weights)
    _differs(spec, weights, ids, expected, rotary_layout="half")


def test_hf_phi_partial_rotary() -> None:
    """rotary_fraction 0.4 (6 of 16 channels) against Phi (parallel from one shared norm,
    biased dense layers, gelu_new, head bias)."""
    spec = tiny("tiny-phi.yaml")
    assert spec.rotary_dim == 6
    config = transformers.PhiConfig(**_no_dropout(
        vocab_size=spec.vocab, hidden_size=spec.d_model, intermediate_size=spec.ffn.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=spec.attention.heads,
        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, hidden_act="gelu_new",
        max_position_embeddings=spec.max_len, layer_norm_eps=spec.norm.eps,
        tie_word_embeddings=False, qk_layernorm=False,
        rope_parameters={"rope_type": "default", "rope_theta": spec.embedding.rope_theta,
                         "partial_rotary_factor": spec.embedding.rotary_fraction}))
    ref = transformers.PhiForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=29)
    sd = ref.state_dict()
    weights = {"embed.tokens.weight": sd["model.embed_tokens.weight"],
               "head.weight": sd["lm_head.weight"], "head.bias": sd["lm_head.bias"]}
    for kind in ("weight", "bias"):
        weights[f"decoder.norm.{kind}"] = sd[f"model.final_layernorm.{kind}"]
    for i in range(spec.layers):
        src, dst = f"model.layers.{i}", f"decoder.layers.{i}"
        for kind in ("weight", "bias"):
            for r, theirs in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"),
                              ("o", "dense")):
                weights[f"{dst}.self_attn.{r}.{kind}"] = sd[f"{src}.self_attn.{theirs}.{kind}"]
            weights[f"{dst}.ffn.up.{kind}"] = sd[f"{src}.mlp.fc1.{kind}"]
            weights[f"{dst}.ffn.down.{kind}"] = sd[f"{src}.mlp.fc2.{kind}"]
            weights[f"{dst}.norm.{kind}"] = sd[f"{src}.input_layernorm.{kind}"]
    ids, expected = check_against(spec, ref, weights)
    _differs(spec, weights, ids, expected, rotary_fraction=0.5)


def _scaled_llama(spec: Spec, cls: str, seed: int, **extra: Any) -> tuple[nn.Module,
                                                                            dict[str, Tensor]]:
    """A Llama-family reference with ``spec``'s rope_scaling as transformers 5's
    rope_parameters, and the weights mapped to tfgraph's names."""
    s = spec.embedding.rope_scaling
    assert s is not None
    params: dict[str, Any] = {"rope_type": s.type, "rope_theta": spec.embedding.rope_theta,
                              "factor": s.factor}
    if s.type == "llama3":
        params.update(low_freq_factor=s.low_freq_factor, high_freq_factor=s.high_freq_factor,
                      original_max_position_embeddings=s.original_max_len)
    if s.type == "yarn":
        params.update(original_max_position_embeddings=s.original_max_len,
                      beta_fast=s.beta_fast, beta_slow=s.beta_slow)
    config = getattr(transformers, f"{cls}Config")(
        **llama_family_config(spec), rope_parameters=params,
        tie_word_embeddings=spec.embedding.tie_output, **extra)
    ref = getattr(transformers, f"{cls}ForCausalLM")._from_config(
        config, attn_implementation="eager").eval()
    randomize(ref, seed=seed)
    weights = llama_family_weights(spec, ref.state_dict(), {
        "self_attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"})
    return ref, weights


def test_hf_llama_rope_scaling_llama3() -> None:
    """rope_scaling llama3 (original_max_len 16, sequences of 19) against Llama: catches
    unscaled frequencies or a ramp on the wrong side."""
    spec = tiny("tiny-llama3.yaml")
    ref, weights = _scaled_llama(spec, "Llama", seed=31, attention_bias=False, mlp_bias=False)
    ids, expected = check_against(spec, ref, weights)
    _differs(spec, weights, ids, expected, rope_scaling=None)


def test_hf_llama_rope_scaling_linear() -> None:
    """rope_scaling linear (factor 4) against Llama: every frequency divided by factor."""
    data = tiny("tiny-llama3.yaml").model_dump()
    data["embedding"]["rope_scaling"] = {"type": "linear", "factor": 4.0}
    spec = Spec.model_validate(data)
    ref, weights = _scaled_llama(spec, "Llama", seed=37, attention_bias=False, mlp_bias=False)
    ids, expected = check_against(spec, ref, weights)
    _differs(spec, weights, ids, expected, rope_scaling=None)


def test_hf_qwen2_rope_scaling_yarn() -> None:
    """rope_scaling yarn (factor 4, original_max_len 16) against Qwen2: catches a missing
    attention factor on cos and sin (checked separately) or a wrong ramp."""
    spec = tiny("tiny-yarn.yaml")
    s = spec.embedding.rope_scaling
    assert s is not None and s.attention_factor is not None and s.attention_factor > 1.1
    ref, weights = _scaled_llama(spec, "Qwen2", seed=41)
    assert ref.model.rotary_emb.attention_scaling == pytest.approx(s.attention_factor)
    ids, expected = check_against(spec, ref, weights)
    _differs(spec, weights, ids, expected, rope_scaling=None)
    _differs(spec, weights, ids, expected,
             rope_scaling={**s.model_dump(), "attention_factor": 1.0})


def test_hf_gemma_unit_offset_and_geglu_tanh() -> None:
    """norm.unit_offset (RMSNorm times 1 + w) and geglu_tanh against Gemma (MQA, head_dim
    wider than d_model / heads, embeddings times sqrt(d_model), tied head). randomize makes
    the stored gains near 1, so the multiplier is near 2: a norm ignoring the offset fails."""
    spec = tiny("tiny-gemma.yaml")
    att = spec.attention
    config = transformers.GemmaConfig(**_no_dropout(
        vocab_size=spec.vocab, hidden_size=spec.d_model, intermediate_size=spec.ffn.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=att.heads,
        num_key_value_heads=att.kv_heads, head_dim=att.head_dim,
        hidden_act="gelu_pytorch_tanh", max_position_embeddings=spec.max_len,
        rms_norm_eps=spec.norm.eps, tie_word_embeddings=True, attention_bias=False,
        attention_dropout=0.0,
        rope_parameters={"rope_type": "default", "rope_theta": spec.embedding.rope_theta}))
    ref = transformers.GemmaForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=43)
    weights = llama_family_weights(spec, ref.state_dict(), {
        "self_attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"})
    ids, expected = check_against(spec, ref, weights)
    for norm, ffn in (({"unit_offset": False}, {}), ({}, {"activation": "geglu"})):
        data = spec.model_dump()
        data["norm"].update(norm)
        data["ffn"].update(ffn)
        other = to_torch(tfgraph.compile(Spec.model_validate(data)), weights=weights).eval()
        with torch.no_grad():
            assert (other(ids) - expected).abs().max().item() > 10 * ATOL
