"""Attention features of today's models against Hugging Face references built from config
classes with random weights: sliding windows (Mistral), per-head qk-norm (Qwen3), soft-capping,
an explicit score scale and alternating local/global layers (Gemma 2), local layers with their
own rotary base (Gemma 3). Each compares parameter counts and logits (<= 1e-4) through to_torch
and ONNX in onnxruntime; inputs are longer than the window so the window really masks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor, nn

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.schema import Spec

from parity_support import (ATOL, check_against, llama_family_config, llama_family_weights,
                            randomize, tiny)

transformers = pytest.importorskip("transformers")

LLAMA_NORMS = {"self_attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
QK_NORMS = {"self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm"}
GEMMA_NORMS = {"self_attn_norm": "input_layernorm",
               "self_attn_out_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm",
               "ffn_out_norm": "post_feedforward_layernorm"}


def _reference(cls: Any, config: Any, seed: int) -> nn.Module:
    ref = cls._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed)
    return ref


def _without(spec: Spec, section: str, **changes: Any) -> Spec:
    """``spec`` with fields of one section changed (to show a test can tell them apart)."""
    sub = getattr(spec, section).model_copy(update=changes)
    return Spec.model_validate(spec.model_copy(update={section: sub}).model_dump())


def _differs(spec: Spec, weights: dict[str, Tensor], ids: Tensor, expected: Tensor) -> None:
    other = to_torch(tfgraph.compile(spec), weights=weights).eval()
    with torch.no_grad():
        assert (other(ids) - expected).abs().max().item() > 100 * ATOL


def test_hf_mistral_sliding_window() -> None:
    """``attention.window`` against Mistral (sliding_window) on 19 tokens with a window of 8.
    Catches a window ignored (plain causal attention) or off by one (i - j <= W)."""
    spec = tiny("tiny-mistral.yaml")
    config = transformers.MistralConfig(**llama_family_config(spec), tie_word_embeddings=False,
                                        sliding_window=spec.attention.window)
    ref = _reference(transformers.MistralForCausalLM, config, seed=21)
    weights = llama_family_weights(spec, ref.state_dict(), LLAMA_NORMS)
    ids, expected = check_against(spec, ref, weights)
    _differs(_without(spec, "attention", window=None), weights, ids, expected)
    _differs(_without(spec, "attention", window=spec.attention.window + 1), weights, ids,
             expected)


def test_hf_qwen3_per_head_qk_norm() -> None:
    """``attention.qk_norm: head`` against Qwen3: one RMSNorm gain of width head_dim applied to
    every head of q and k before rotary positions. Catches a norm over the whole projection."""
    spec = tiny("tiny-qwen3.yaml")
    config = transformers.Qwen3Config(**llama_family_config(spec), head_dim=spec.attention.head_dim,
                                      tie_word_embeddings=True, attention_bias=False)
    ref = _reference(transformers.Qwen3ForCausalLM, config, seed=23)
    weights = llama_family_weights(spec, ref.state_dict(), LLAMA_NORMS | QK_NORMS)
    check_against(spec, ref, weights)


def _gemma_config(spec: Spec) -> dict[str, Any]:
    config = llama_family_config(spec)
    config.update(head_dim=spec.attention.head_dim, hidden_activation="gelu_pytorch_tanh",
                  sliding_window=spec.attention.window, tie_word_embeddings=True,
                  layer_types=["sliding_attention" if spec.layer_is_local(i) else "full_attention"
                               for i in range(spec.layer_count("decoder"))])
    return config


def test_hf_gemma2_softcaps_scale_and_local_global_layers() -> None:
    """Gemma 2: scores soft-capped at 50 and scaled by query_pre_attn_scalar^-0.5, logits
    soft-capped at 30, a local layer (window 8) then a global one, sandwich RMSNorm with
    (1 + w) gains. Catches each cap, the scale and the window pattern left out."""
    spec = tiny("tiny-gemma2.yaml")
    att = spec.attention
    assert att.scale is not None and spec.head.softcap is not None
    config = transformers.Gemma2Config(**_gemma_config(spec),
                                       query_pre_attn_scalar=round(att.scale ** -2),
                                       attn_logit_softcapping=att.softcap,
                                       final_logit_softcapping=spec.head.softcap)
    ref = _reference(transformers.Gemma2ForCausalLM, config, seed=25)
    weights = llama_family_weights(spec, ref.state_dict(), GEMMA_NORMS)
    ids, expected = check_against(spec, ref, weights)
    assert expected.abs().max().item() > 1.0  # 30 tanh(x / 30) differs from x by > 1e-4 there
    _differs(_without(spec, "head", softcap=None), weights, ids, expected)
    _differs(_without(spec, "attention", softcap=None), weights, ids, expected)
    _differs(_without(spec, "attention", scale=None), weights, ids, expected)
    _differs(_without(spec, "attention", window_pattern=None), weights, ids, expected)


def test_hf_gemma3_local_rotary_base_and_per_head_qk_norm() -> None:
    """Gemma 3: per-head qk-norm with (1 + w) gains, a local layer with rotary base 10000 and a
    global one with 1000000. Catches one base for every layer."""
    spec = tiny("tiny-gemma3.yaml")
    emb = spec.embedding
    config = _gemma_config(spec)
    config["rope_parameters"] = {
        "sliding_attention": {"rope_type": "default", "rope_theta": emb.local_rope_theta},
        "full_attention": {"rope_type": "default", "rope_theta": emb.rope_theta}}
    del config["rope_theta"]
    config = transformers.Gemma3TextConfig(**config, query_pre_attn_scalar=spec.attention.head_dim)
    ref = _reference(transformers.Gemma3ForCausalLM, config, seed=27)
    weights = llama_family_weights(spec, ref.state_dict(), GEMMA_NORMS | QK_NORMS)
    ids, expected = check_against(spec, ref, weights)
    _differs(_without(spec, "embedding", local_rope_theta=None), weights, ids, expected)


def _t5_weights(spec: Spec, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """T5's names (``encoder.block.i.layer.j.SelfAttention.q``, ...) to tfgraph's."""
    weights = {"embed.tokens.weight": sd["shared.weight"]}
    sublayers = {"encoder": ["self_attn", "ffn"], "decoder": ["self_attn", "cross_attn", "ffn"]}
    for stack, subs in sublayers.items():
        weights[f"{stack}.norm.weight"] = sd[f"{stack}.final_layer_norm.weight"]
        weights[f"{stack}.relative_bias.weight"] = sd[
            f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]
        for i in range(spec.layer_count(stack)):
            for j, sub in enumerate(subs):
                src, dst = f"{stack}.block.{i}.layer.{j}", f"{stack}.layers.{i}"
                weights[f"{dst}.{sub}_norm.weight"] = sd[f"{src}.layer_norm.weight"]
                if sub == "ffn":
                    for theirs, ours in (("wi", "up"), ("wo", "down")):
                        weights[f"{dst}.ffn.{ours}.weight"] = sd[
                            f"{src}.DenseReluDense.{theirs}.weight"]
                    continue
                block = "SelfAttention" if sub == "self_attn" else "EncDecAttention"
                for role in "qkvo":
                    weights[f"{dst}.{sub}.{role}.weight"] = sd[f"{src}.{block}.{role}.weight"]
    return weights


def test_hf_t5_relative_position_bias() -> None:
    """T5: bucketed relative position bias (bidirectional in the encoder, causal in the
    decoder, shared by a stack's layers), unscaled scores, tied head scaled by d^-0.5.
    Catches the bias left out, its buckets wrong in either direction, and a scaled score."""
    from tfgraph.exporters.onnx.model import to_onnx

    ort = pytest.importorskip("onnxruntime")
    spec = tiny("tiny-t5.yaml")
    emb, att = spec.embedding, spec.attention
    config = transformers.T5Config(
        vocab_size=spec.vocab, d_model=spec.d_model, d_kv=att.head_dim, d_ff=spec.ffn.hidden,
        num_layers=spec.layer_count("encoder"), num_decoder_layers=spec.layer_count("decoder"),
        num_heads=att.heads, relative_attention_num_buckets=emb.relative_buckets,
        relative_attention_max_distance=emb.relative_max_distance, dropout_rate=0.0,
        layer_norm_epsilon=spec.norm.eps, feed_forward_proj="relu", tie_word_embeddings=True,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    ref = _reference(transformers.T5ForConditionalGeneration, config, seed=29)
    weights = _t5_weights(spec, ref.state_dict())
    graph = tfgraph.compile(spec)
    assert graph.report()["params"] == sum(p.numel() for p in ref.parameters())
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, spec.vocab, (2, 19), generator=gen)
    tgt = torch.randint(0, spec.vocab, (2, 17), generator=gen)
    ours = to_torch(graph, weights=weights).eval()
    with torch.no_grad():
        expected = ref(input_ids=src, decoder_input_ids=tgt).logits
        assert (ours(src, tgt) - expected).abs().max().item() <= ATOL
    for opset in (23, 17):
        model = to_onnx(graph, weights={k: v.detach() for k, v in weights.items()}, opset=opset)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        got = session.run(None, {"src_ids": src.numpy(), "tgt_ids": tgt.numpy()})[0]
        assert (torch.from_numpy(got) - expected).abs().max().item() <= ATOL
    zeroed = {k: (torch.zeros_like(v) if k.endswith("relative_bias.weight") else v)
              for k, v in weights.items()}
    with torch.no_grad():
        other = to_torch(graph, weights=zeroed).eval()(src, tgt)
    assert (other - expected).abs().max().item() > 100 * ATOL
