"""Every family `tfgraph import` supports, against the Hugging Face model nobody here wrote.

For each family a tiny model (<= 3 layers, d <= 128) is built from its transformers config class
with random weights (no hub access), the config is saved with ``save_pretrained`` and imported
with the CLI (``tfgraph import DIR -o SPEC.yaml``), and then:

- the spec's parameter count equals the Hugging Face model's (frozen sinusoid tables, which
  Marian stores as parameters, excluded);
- ``flops.matmul`` equals ``FlopCounterMode`` on the model run with eager attention (routed MoE
  experts added by hand: FlopCounterMode does not see them in transformers' MoE blocks);
- logits agree within 1e-4 (float32) through ``to_torch`` and through the ONNX model (opsets
  23 and 17) in onnxruntime, with the Hugging Face weights mapped by ``tfgraph.hf.name_map``;
- the reverse map gives back the Hugging Face state dict exactly (every key, every value).

A family whose spec features tfgraph lacks fails here at the import step, with the exit-2
message naming the config field (nothing is skipped).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner
from torch import Tensor, nn

import tfgraph
from tfgraph.cli import main
from tfgraph.exporters import to_torch
from tfgraph.hf import name_map
from tfgraph.spec.schema import Spec

from parity_support import check, randomize

transformers = pytest.importorskip("transformers")
ort = pytest.importorskip("onnxruntime")
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

BATCH, SEQ, TGT = 2, 19, 11
COMMON = dict(bos_token_id=0, eos_token_id=0, pad_token_id=None)
LLAMA = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=101, max_position_embeddings=64,
             rms_norm_eps=1e-6, **COMMON)


# DeepSeek: multi-head latent attention (head_dim 16 + 8 rotary, values 12), 8 experts of 16
# in 4 groups with one shared, one dense first layer
DEEPSEEK = dict(LLAMA, num_key_value_heads=4, num_hidden_layers=3, kv_lora_rank=32,
                qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_routed_experts=8,
                num_experts_per_tok=2, moe_intermediate_size=16, n_shared_experts=1,
                first_k_dense_replace=1)


@dataclass
class Case:
    config: str
    model: str
    kwargs: dict[str, Any]
    kind: str = "causal"  # causal | seq2seq | masked
    frozen: tuple[str, ...] = ()  # parameter name suffixes that are fixed tables, not weights
    moe: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    # checkpoint tensors transformers keeps as buffers (DeepSeek-V3's e_score_correction_bias):
    # tfgraph parameters, randomised here like the weights
    buffers: tuple[str, ...] = ()
    # the reference's attention: sdpa where transformers' eager path is not the model
    # (Falcon-RW's ALiBi, which eager attention adds twice); FLOPs are then counted on an
    # eager twin with the same weights (FlopCounterMode does not see all of CPU SDPA's work,
    # and the two paths do the same matmuls: the bias is an add)
    attn: str = "eager"


CASES: dict[str, Case] = {
    "gpt2": Case("GPT2Config", "GPT2LMHeadModel", dict(
        n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=64,
        activation_function="gelu_new", **COMMON)),
    "gpt_neox": Case("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=101, max_position_embeddings=64, rotary_pct=1.0, hidden_act="gelu",
        use_parallel_residual=True, **COMMON)),
    "pythia": Case("GPTNeoXConfig", "GPTNeoXForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=101, max_position_embeddings=64, rotary_pct=0.25, hidden_act="gelu",
        use_parallel_residual=True, **COMMON)),
    "gptj": Case("GPTJConfig", "GPTJForCausalLM", dict(
        n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=64, rotary_dim=8,
        activation_function="gelu_new", tie_word_embeddings=False, **COMMON)),
    "opt": Case("OPTConfig", "OPTForCausalLM", dict(
        hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=101, max_position_embeddings=64, word_embed_proj_dim=64,
        do_layer_norm_before=True, activation_function="relu", **COMMON)),
    "llama": Case("LlamaConfig", "LlamaForCausalLM", dict(
        LLAMA, rope_theta=500000.0, tie_word_embeddings=False)),
    "llama3-scaling": Case("LlamaConfig", "LlamaForCausalLM", dict(
        LLAMA, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "mistral": Case("MistralConfig", "MistralForCausalLM", dict(LLAMA, sliding_window=None)),
    "mistral-window": Case("MistralConfig", "MistralForCausalLM", dict(LLAMA, sliding_window=7)),
    "mixtral": Case("MixtralConfig", "MixtralForCausalLM", dict(
        LLAMA, num_local_experts=4, num_experts_per_tok=2, sliding_window=None), moe=True),
    "qwen2": Case("Qwen2Config", "Qwen2ForCausalLM", dict(
        LLAMA, tie_word_embeddings=True, use_sliding_window=False)),
    "qwen2-window": Case("Qwen2Config", "Qwen2ForCausalLM", dict(
        LLAMA, num_hidden_layers=3, use_sliding_window=True, sliding_window=6,
        max_window_layers=1)),  # full, then sliding layers: pattern [global, local, local]
    "qwen2_moe": Case("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(
        LLAMA, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, norm_topk_prob=False, decoder_sparse_step=1,
        mlp_only_layers=[], use_sliding_window=False), moe=True),
    "olmoe": Case("OlmoeConfig", "OlmoeForCausalLM", dict(
        LLAMA, num_experts=4, num_experts_per_tok=2, norm_topk_prob=False), moe=True),
    "qwen3_moe": Case("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        LLAMA, head_dim=24, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0],
        use_sliding_window=False), moe=True),
    "deepseek_v3": Case("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        DEEPSEEK, q_lora_rank=48, n_group=4, topk_group=2, norm_topk_prob=True,
        routed_scaling_factor=2.5, rope_interleave=True,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0,
                         "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}),
        moe=True, buffers=("e_score_correction_bias",)),
    "deepseek_v2": Case("DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        DEEPSEEK, q_lora_rank=None, topk_method="group_limited_greedy", n_group=4,
        topk_group=2, routed_scaling_factor=1.5), moe=True),
    "qwen3": Case("Qwen3Config", "Qwen3ForCausalLM", dict(
        LLAMA, head_dim=24, tie_word_embeddings=True, use_sliding_window=False)),
    "olmo2": Case("Olmo2Config", "Olmo2ForCausalLM", dict(LLAMA, tie_word_embeddings=False)),
    "gemma": Case("GemmaConfig", "GemmaForCausalLM", dict(
        LLAMA, num_key_value_heads=1, head_dim=16, hidden_act="gelu_pytorch_tanh",
        hidden_activation="gelu_pytorch_tanh")),
    "gemma2": Case("Gemma2Config", "Gemma2ForCausalLM", dict(
        LLAMA, head_dim=16, hidden_activation="gelu_pytorch_tanh", query_pre_attn_scalar=24,
        sliding_window=7, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "gemma3_text": Case("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        LLAMA, num_hidden_layers=3, head_dim=16, hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=16, sliding_window=7, sliding_window_pattern=3,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0,
                                            "rope_theta": 1000000.0},
                         "sliding_attention": {"rope_type": "default",
                                               "rope_theta": 10000.0}})),
    "phi": Case("PhiConfig", "PhiForCausalLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=101, max_position_embeddings=64, partial_rotary_factor=0.5,
        hidden_act="gelu_new", **COMMON)),
    "stablelm": Case("StableLmConfig", "StableLmForCausalLM", dict(
        {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}, layer_norm_eps=1e-5, use_qkv_bias=True, partial_rotary_factor=0.25,
        use_parallel_residual=False)),
    "stablelm-parallel": Case("StableLmConfig", "StableLmForCausalLM", dict(
        {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}, layer_norm_eps=1e-5, use_qkv_bias=False, partial_rotary_factor=0.5,
        use_parallel_residual=True, tie_word_embeddings=True)),
    "starcoder2": Case("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}, norm_epsilon=1e-5,
        hidden_act="gelu_pytorch_tanh", use_bias=True, sliding_window=None)),
    "starcoder2-window": Case("Starcoder2Config", "Starcoder2ForCausalLM", dict(
        {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}, norm_epsilon=1e-5,
        hidden_act="gelu_pytorch_tanh", use_bias=False, sliding_window=7,
        tie_word_embeddings=False)),
    "nemotron": Case("NemotronConfig", "NemotronForCausalLM", dict(
        {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}, head_dim=16, norm_eps=1e-5,
        partial_rotary_factor=0.5, attention_bias=True, mlp_bias=True)),
    "granite": Case("GraniteConfig", "GraniteForCausalLM", dict(
        LLAMA, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
        logits_scaling=8.0, attention_bias=True, tie_word_embeddings=True)),
    "bloom": Case("BloomConfig", "BloomForCausalLM", dict(
        hidden_size=72, n_layer=2, n_head=6, vocab_size=101, layer_norm_epsilon=1e-5,
        hidden_dropout=0.0, attention_dropout=0.0, **COMMON)),
    "gpt_bigcode": Case("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(
        n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=64, multi_query=True,
        activation_function="gelu_pytorch_tanh", **COMMON)),
    "gpt_bigcode-mha": Case("GPTBigCodeConfig", "GPTBigCodeForCausalLM", dict(
        n_embd=64, n_layer=2, n_head=4, vocab_size=101, n_positions=64, multi_query=False,
        activation_function="gelu_pytorch_tanh", tie_word_embeddings=False, **COMMON)),
    "cohere": Case("CohereConfig", "CohereForCausalLM", dict(
        {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}, layer_norm_eps=1e-5,
        logit_scale=0.0625, use_qk_norm=False, tie_word_embeddings=True, pad_token_id=None)),
    "falcon": Case("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=101,
        max_position_embeddings=64, multi_query=True, parallel_attn=True, bias=False,
        ffn_hidden_size=128, activation="gelu", **COMMON)),
    "falcon-sequential": Case("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=101,
        max_position_embeddings=64, multi_query=False, parallel_attn=False, bias=True,
        ffn_hidden_size=128, activation="gelu", tie_word_embeddings=False, **COMMON)),
    "falcon-new": Case("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=101,
        max_position_embeddings=64, new_decoder_architecture=True, num_kv_heads=1,
        bias=False, ffn_hidden_size=128, activation="gelu", **COMMON)),
    "falcon-new-one-norm": Case("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=101,
        max_position_embeddings=64, new_decoder_architecture=True, num_kv_heads=2,
        num_ln_in_parallel_attn=1, bias=True, ffn_hidden_size=96, activation="gelu",
        tie_word_embeddings=False, **COMMON)),
    # Falcon-RW-1B's layout (sequential, per-head qkv, biases) with ALiBi: 16 heads, a power
    # of two whose odd slopes 2^(-h/2) are not bfloat16 numbers, so the rounding shows
    "falcon-alibi": Case("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=16, vocab_size=101,
        max_position_embeddings=64, alibi=True, multi_query=False, parallel_attn=False,
        bias=True, ffn_hidden_size=128, activation="gelu", tie_word_embeddings=False,
        **COMMON), attn="sdpa"),
    # 12 heads (not a power of two: BLOOM's interleaved second series), multi-query, parallel
    "falcon-alibi-12": Case("FalconConfig", "FalconForCausalLM", dict(
        hidden_size=96, num_hidden_layers=2, num_attention_heads=12, vocab_size=101,
        max_position_embeddings=64, alibi=True, multi_query=True, parallel_attn=True,
        bias=False, ffn_hidden_size=128, activation="gelu", **COMMON), attn="sdpa"),
    "glm": Case("GlmConfig", "GlmForCausalLM", dict(
        LLAMA, head_dim=16, partial_rotary_factor=0.5, attention_bias=True, pad_token_id=None)),
    "glm4": Case("Glm4Config", "Glm4ForCausalLM", dict(
        LLAMA, head_dim=16, partial_rotary_factor=0.5, attention_bias=True, pad_token_id=None)),
    "helium": Case("HeliumConfig", "HeliumForCausalLM", dict(
        LLAMA, head_dim=16, attention_bias=True, mlp_bias=True)),
    "seed_oss": Case("SeedOssConfig", "SeedOssForCausalLM", dict(
        LLAMA, head_dim=16, attention_bias=True, attention_out_bias=True, mlp_bias=False)),
    "ministral": Case("MinistralConfig", "MinistralForCausalLM", dict(
        LLAMA, num_hidden_layers=3, head_dim=16, sliding_window=7,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    "arcee": Case("ArceeConfig", "ArceeForCausalLM", dict(
        LLAMA, head_dim=16, hidden_act="relu2", mlp_bias=True)),
    "granitemoe": Case("GraniteMoeConfig", "GraniteMoeForCausalLM", dict(
        LLAMA, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
        embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125,
        logits_scaling=8.0, tie_word_embeddings=True), moe=True),
    "mpt": Case("MptConfig", "MptForCausalLM", dict(
        d_model=72, n_heads=6, n_layers=2, vocab_size=101, max_seq_len=64,
        attn_config={"clip_qkv": 0.5, "softmax_scale": 0.3}, **COMMON)),
    "olmo": Case("OlmoConfig", "OlmoForCausalLM", dict(
        {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}, clip_qkv=0.5,
        attention_bias=True, pad_token_id=None)),
    "cohere2": Case("Cohere2Config", "Cohere2ForCausalLM", dict(
        {k: v for k, v in LLAMA.items() if k != "rms_norm_eps"}, num_hidden_layers=3,
        layer_norm_eps=1e-5, logit_scale=0.25, sliding_window=7, attention_bias=True,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        tie_word_embeddings=True, pad_token_id=None)),
    "phimoe": Case("PhimoeConfig", "PhimoeForCausalLM", dict(
        LLAMA, rms_norm_eps=1e-5, intermediate_size=32, num_local_experts=4,
        num_experts_per_tok=2, router_jitter_noise=0.3, attention_bias=True,
        lm_head_bias=True, sliding_window=None), moe=True),
    "phi3": Case("Phi3Config", "Phi3ForCausalLM", dict(
        LLAMA, sliding_window=None, pad_token_id=None)),
    "bert": Case("BertConfig", "BertForMaskedLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=101, max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu",
        pad_token_id=0), kind="masked"),
    "distilbert": Case("DistilBertConfig", "DistilBertForMaskedLM", dict(
        dim=64, hidden_dim=128, n_layers=2, n_heads=4, vocab_size=101,
        max_position_embeddings=64, activation="gelu", pad_token_id=0), kind="masked"),
    "roberta": Case("RobertaConfig", "RobertaForMaskedLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=101, max_position_embeddings=66, type_vocab_size=1, hidden_act="gelu",
        pad_token_id=1, bos_token_id=0, eos_token_id=2), kind="masked"),
    "xlm-roberta": Case("XLMRobertaConfig", "XLMRobertaForMaskedLM", dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=101, max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu",
        layer_norm_eps=1e-5, pad_token_id=3, bos_token_id=0, eos_token_id=2),
        kind="masked"),
    "modernbert": Case("ModernBertConfig", "ModernBertForMaskedLM", dict(
        hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        vocab_size=101, max_position_embeddings=64, local_attention=8,
        global_attn_every_n_layers=2, global_rope_theta=160000.0, local_rope_theta=10000.0,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2),
        kind="masked"),
    "bart": Case("BartConfig", "BartForConditionalGeneration", dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=101,
        max_position_embeddings=64, activation_function="gelu", scale_embedding=False,
        bos_token_id=0, eos_token_id=2, pad_token_id=1, decoder_start_token_id=2,
        forced_eos_token_id=None), kind="seq2seq"),
    "marian": Case("MarianConfig", "MarianMTModel", dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=101,
        max_position_embeddings=64, activation_function="swish", scale_embedding=True,
        share_encoder_decoder_embeddings=True, bos_token_id=0, eos_token_id=2,
        pad_token_id=1, decoder_start_token_id=1, forced_eos_token_id=None),
        kind="seq2seq", frozen=("embed_positions.weight",)),
    "mbart": Case("MBartConfig", "MBartForConditionalGeneration", dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=101,
        max_position_embeddings=64, activation_function="gelu", scale_embedding=True,
        bos_token_id=0, eos_token_id=2, pad_token_id=1, decoder_start_token_id=2,
        forced_eos_token_id=None), kind="seq2seq"),
    "pegasus": Case("PegasusConfig", "PegasusForConditionalGeneration", dict(
        d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, vocab_size=101,
        max_position_embeddings=64, activation_function="relu", scale_embedding=True,
        eos_token_id=1, pad_token_id=0, decoder_start_token_id=0,
        forced_eos_token_id=None), kind="seq2seq", frozen=("embed_positions.weight",)),
    "t5": Case("T5Config", "T5ForConditionalGeneration", dict(
        d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
        vocab_size=101, relative_attention_num_buckets=8, relative_attention_max_distance=20,
        feed_forward_proj="relu", tie_word_embeddings=True, decoder_start_token_id=0,
        pad_token_id=0, eos_token_id=1), kind="seq2seq"),
}


# The random weights of each case come from a seed of its own that adding a case does not
# change: the first families' seeds were their places in the sorted list of that time, later
# cases continue the count in the order they were added.
_SEED_ORDER = [
    "bart", "bert", "gemma", "gemma2", "gemma3_text", "gpt2", "gpt_neox", "gptj", "llama",
    "llama3-scaling", "marian", "mistral", "mistral-window", "mixtral", "olmo2", "opt", "phi",
    "phi3", "pythia", "qwen2", "qwen2-window", "qwen2_moe", "qwen3", "t5",
    "qwen3_moe", "olmoe", "stablelm", "stablelm-parallel", "starcoder2", "starcoder2-window",
    "nemotron", "granite", "bloom", "gpt_bigcode", "gpt_bigcode-mha", "distilbert", "cohere",
    "mbart", "pegasus", "falcon", "falcon-sequential", "glm", "glm4", "helium", "seed_oss",
    "ministral", "arcee", "granitemoe", "mpt", "olmo", "cohere2", "falcon-new", "falcon-new-one-norm", "phimoe",
    "roberta", "xlm-roberta",
    "modernbert",
    "deepseek_v3", "deepseek_v2", "falcon-alibi", "falcon-alibi-12",
]


def family_seed(name: str) -> int:
    """The seed of case ``name``'s random weights (stable as cases are added)."""
    return _SEED_ORDER.index(name) + 1


def build_reference(case: Case, seed: int, config: Any = None) -> nn.Module:
    """The case's model with random weights; ``config``: another config object of its class
    (test_hf_config_exact.py: one read back from an edited config.json)."""
    if config is None:
        config = getattr(transformers, case.config)(**case.kwargs)
    cls = getattr(transformers, case.model)
    model = cls._from_config(config, attn_implementation=case.attn).eval()
    fixed = {n: p.detach().clone() for n, p in model.named_parameters()
             if n.endswith(case.frozen) and case.frozen}
    randomize(model, seed)
    with torch.no_grad():  # fixed tables (Marian's sinusoids) keep their values
        for n, p in model.named_parameters():
            if n in fixed:
                p.copy_(fixed[n])
        gen = torch.Generator().manual_seed(seed)
        for n, b in model.named_buffers():  # checkpoint buffers: random, so they count
            if case.buffers and n.endswith(case.buffers):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
    return model


def eager_twin(case: Case, model: nn.Module) -> nn.Module:
    """``model`` itself, or for a case whose reference runs SDPA the same weights under eager
    attention, on which FlopCounterMode counts every matmul."""
    if case.attn == "eager":
        return model
    config = copy.deepcopy(model.config)
    twin = type(model)._from_config(config, attn_implementation="eager").eval()
    twin.load_state_dict(model.state_dict())
    return twin


def import_spec(folder: Path, out: Path) -> Spec:
    """``tfgraph import folder -o out`` through the CLI, then the written spec."""
    result = CliRunner().invoke(main, ["import", str(folder), "-o", str(out)])
    assert result.exit_code == 0, result.output + str(result.stderr_bytes or b"")
    assert out.read_text().startswith("# Imported by `tfgraph import`")
    return tfgraph.load_spec(out)


def trainable(model: nn.Module, frozen: tuple[str, ...]) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if not n.endswith(frozen))


def inputs(spec: Spec, kind: str) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(Hugging Face keyword arguments, tfgraph feeds) of random ids."""
    gen = torch.Generator().manual_seed(0)
    if kind == "seq2seq":
        src = torch.randint(2, spec.vocab_size("source"), (BATCH, SEQ), generator=gen)
        tgt = torch.randint(2, spec.vocab_size("target"), (BATCH, TGT), generator=gen)
        return {"input_ids": src, "decoder_input_ids": tgt}, {"src_ids": src, "tgt_ids": tgt}
    ids = torch.randint(2, spec.vocab_size("source"), (BATCH, SEQ), generator=gen)
    return {"input_ids": ids}, {"input_ids": ids}


def moe_expert_flops(spec: Spec, tokens: int) -> int:
    """Routed experts' matmul FLOPs, which FlopCounterMode misses in transformers' MoE blocks
    (transformers 5 MoE models; README "Hugging Face models"): layers · 2 · tokens · top_k · 3 · d · expert_hidden."""
    ffn = spec.ffn
    assert ffn.top_k is not None and ffn.expert_hidden is not None
    moe_layers = spec.layers - (ffn.dense_layers or 0)  # type: ignore[operator]
    return moe_layers * 2 * tokens * ffn.top_k * 3 * spec.d_model * ffn.expert_hidden


@pytest.mark.parametrize("family", sorted(CASES))
def test_family_matches_hugging_face(family: str, tmp_path: Path) -> None:
    case = CASES[family]
    ref = build_reference(case, seed=family_seed(family))
    ref.config.save_pretrained(tmp_path / family)
    spec = import_spec(tmp_path / family, tmp_path / f"{family}.yaml")
    graph = tfgraph.compile(spec)
    kwargs, feeds = inputs(spec, case.kind)

    # parameters: the checkpoint's trainable tensors (and the buffers it stores as weights)
    buffers = sum(b.numel() for n, b in ref.named_buffers()
                  if case.buffers and n.endswith(case.buffers))
    assert graph.report()["params"] == trainable(ref, case.frozen) + buffers

    # matmul FLOPs against FlopCounterMode (eager attention)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        expected = eager_twin(case, ref)(**kwargs).logits
    counted = counter.get_total_flops()
    if case.attn != "eager":
        with torch.no_grad():
            expected = ref(**kwargs).logits
    if case.moe:
        counted += moe_expert_flops(spec, BATCH * SEQ)
    seqs = {"seq": SEQ, "tgt_seq": TGT} if case.kind == "seq2seq" else {"seq": SEQ}
    assert graph.report(batch=BATCH, **seqs)["flops"]["matmul"] == counted

    # logits through to_torch and ONNX with the mapped weights
    config = json.loads((tmp_path / family / "config.json").read_text())
    names = name_map(config, spec)
    sd = ref.state_dict()
    weights = names.to_tfgraph(sd)
    ours = to_torch(graph, weights=weights).eval()
    with torch.no_grad():
        check(ours(*feeds.values()), expected)
    from tfgraph.exporters.onnx.model import to_onnx

    for opset in (23, 17):  # the newest ONNX opset and the oldest tfgraph writes
        model = to_onnx(graph, weights={k: v.detach() for k, v in weights.items()},
                        opset=opset)
        session = ort.InferenceSession(model.SerializeToString(),
                                       providers=["CPUExecutionProvider"])
        onnx_feeds = {k: v.numpy() for k, v in feeds.items()}
        for given in session.get_inputs():  # BERT's segment ids: all zeros, as transformers
            if given.name == "token_type_ids":
                onnx_feeds["token_type_ids"] = torch.zeros_like(feeds["input_ids"]).numpy()
        got = session.run(None, onnx_feeds)[0]
        check(torch.from_numpy(got), expected)

    # the reverse map gives the Hugging Face state dict back exactly
    back = names.from_tfgraph(weights)
    assert sorted(back) == sorted(sd)
    for key, value in sd.items():
        assert back[key].shape == value.shape and torch.equal(back[key], value), key


def test_every_case_has_its_own_stable_seed() -> None:
    assert sorted(_SEED_ORDER) == sorted(CASES) and len(set(_SEED_ORDER)) == len(_SEED_ORDER)
