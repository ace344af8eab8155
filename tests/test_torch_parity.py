"""Parity of to_torch with reference implementations nobody here wrote.

Each reference (torch.nn.Transformer, torch.nn.TransformerEncoder, Hugging Face GPT-2 and Llama
built from configs) gets random weights (gains near 1, everything else N(0, 0.1), biases
included), which are copied by name into to_torch(graph, weights=...). Logits must agree to
1e-4 max abs error in float32, eval mode. Specs carry dropout 0.1 where the reference allows
it, so the test also proves dropout is off in eval().
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor, nn

import tfgraph
from tfgraph.exporters import to_torch
from tfgraph.spec.schema import Spec

from parity_support import (ATOL, check, check_against, llama_family_config,
                             llama_family_weights, neox_weights, randomize, tiny)

D, HEADS, LAYERS, VOCAB, FFN = 64, 4, 2, 61, 128


def _split_in_proj(prefix: str, ours: str, mha: dict[str, Tensor]) -> dict[str, Tensor]:
    """nn.MultiheadAttention's packed [3d, d] in-projection -> q, k, v; out_proj -> o."""
    w = mha[f"{prefix}.in_proj_weight"].chunk(3)
    b = mha[f"{prefix}.in_proj_bias"].chunk(3)
    out = {}
    for i, role in enumerate("qkv"):
        out[f"{ours}.{role}.weight"], out[f"{ours}.{role}.bias"] = w[i], b[i]
    out[f"{ours}.o.weight"] = mha[f"{prefix}.out_proj.weight"]
    out[f"{ours}.o.bias"] = mha[f"{prefix}.out_proj.bias"]
    return out


def _norm(src: str, dst: str, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    return {f"{dst}.weight": sd[f"{src}.weight"], f"{dst}.bias": sd[f"{src}.bias"]}


def _linear(src: str, dst: str, sd: dict[str, Tensor]) -> dict[str, Tensor]:
    return _norm(src, dst, sd)


def _pe(length: int, d: int) -> Tensor:
    """The sinusoidal table as the PyTorch tutorials write it."""
    pos = torch.arange(length).unsqueeze(1)
    div = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
    pe = torch.zeros(length, d)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


# ---- torch.nn.Transformer (encoder-decoder) ------------------------------------------------


class Seq2Seq(nn.Module):
    """nn.Transformer with a shared scaled embedding, sinusoidal positions and a tied head."""

    def __init__(self, activation: str, norm_first: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.core = nn.Transformer(D, HEADS, LAYERS, LAYERS, FFN, dropout=0.0,
                                   activation=activation, batch_first=True,
                                   norm_first=norm_first)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        s = self.embed(src) * math.sqrt(D) + _pe(src.shape[1], D)
        t = self.embed(tgt) * math.sqrt(D) + _pe(tgt.shape[1], D)
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1])
        h = self.core(s, t, tgt_mask=mask, tgt_is_causal=True)  # (B, T, d)
        return h @ self.embed.weight.T  # tied head


def _nn_layer(src: str, dst: str, sd: dict[str, Tensor], decoder: bool) -> dict[str, Tensor]:
    """One nn.TransformerEncoderLayer / DecoderLayer (at ``src``) as README.md's parameter names."""
    out = _split_in_proj(f"{src}.self_attn", f"{dst}.self_attn", sd)
    out |= _linear(f"{src}.linear1", f"{dst}.ffn.up", sd)
    out |= _linear(f"{src}.linear2", f"{dst}.ffn.down", sd)
    out |= _norm(f"{src}.norm1", f"{dst}.self_attn_norm", sd)
    if not decoder:
        return out | _norm(f"{src}.norm2", f"{dst}.ffn_norm", sd)
    out |= _split_in_proj(f"{src}.multihead_attn", f"{dst}.cross_attn", sd)
    out |= _norm(f"{src}.norm2", f"{dst}.cross_attn_norm", sd)
    return out | _norm(f"{src}.norm3", f"{dst}.ffn_norm", sd)


def _seq2seq_weights(ref: Seq2Seq) -> dict[str, Tensor]:
    sd = ref.state_dict()
    out = {"embed.tokens.weight": sd["embed.weight"]}
    for stack in ("encoder", "decoder"):
        for i in range(LAYERS):
            out |= _nn_layer(f"core.{stack}.layers.{i}", f"{stack}.layers.{i}", sd,
                             decoder=stack == "decoder")
        out |= _norm(f"core.{stack}.norm", f"{stack}.norm", sd)
    return out


@pytest.mark.parametrize("position,activation", [("post", "relu"), ("pre", "gelu")])
def test_nn_transformer(position: str, activation: str) -> None:
    spec = Spec.model_validate({
        "name": f"nn-transformer-{position}", "arch": "encoder-decoder", "d_model": D,
        "layers": LAYERS, "vocab": VOCAB,
        "embedding": {"positions": "sinusoidal", "scale": True, "tie_output": True,
                      "share": True},
        "attention": {"heads": HEADS},
        "ffn": {"hidden": FFN, "activation": activation},
        "norm": {"position": position, "kind": "layernorm", "eps": 1e-5, "final": True},
        "dropout": 0.1,
    })
    ref = Seq2Seq(activation, norm_first=position == "pre").eval()
    randomize(ref, seed=1)
    ours = to_torch(tfgraph.compile(spec), weights=_seq2seq_weights(ref))
    gen = torch.Generator().manual_seed(0)
    src = torch.randint(0, VOCAB, (2, 11), generator=gen)
    tgt = torch.randint(0, VOCAB, (2, 7), generator=gen)
    with torch.no_grad():
        check(ours(src, tgt), ref(src, tgt))


# ---- torch.nn.TransformerEncoder (encoder-only) ----------------------------------------------


class Encoder(nn.Module):
    """Token embedding + sinusoidal positions + nn.TransformerEncoder + a head with bias."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        layer = nn.TransformerEncoderLayer(D, HEADS, FFN, dropout=0.0, activation="gelu",
                                           batch_first=True, layer_norm_eps=1e-6)
        self.core = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(D, VOCAB)

    def forward(self, ids: Tensor) -> Tensor:
        return self.head(self.core(self.embed(ids) + _pe(ids.shape[1], D)))


def test_nn_transformer_encoder() -> None:
    spec = Spec.model_validate({
        "name": "nn-encoder", "arch": "encoder-only", "d_model": D, "layers": LAYERS,
        "vocab": VOCAB,
        "embedding": {"positions": "sinusoidal", "scale": False, "tie_output": False,
                      "output_bias": True},
        "attention": {"heads": HEADS},
        "ffn": {"hidden": FFN, "activation": "gelu"},
        "norm": {"position": "post", "eps": 1e-6, "final": False},
        "dropout": 0.1,
    })
    ref = Encoder().eval()
    randomize(ref, seed=2)
    sd = ref.state_dict()
    weights = {"embed.tokens.weight": sd["embed.weight"]} | _linear("head", "head", sd)
    for i in range(LAYERS):
        weights |= _nn_layer(f"core.layers.{i}", f"encoder.layers.{i}", sd, decoder=False)
    ours = to_torch(tfgraph.compile(spec), weights=weights)
    ids = torch.randint(0, VOCAB, (3, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        check(ours(ids), ref(ids))


# ---- Hugging Face GPT-2 and Llama -----------------------------------------------------------


def _gpt2(attn_pdrop: float) -> tuple[nn.Module, dict[str, Tensor], Spec]:
    """A random Hugging Face GPT-2 (eval mode), its weights in tfgraph's names and the spec."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_embd=D, n_layer=LAYERS, n_head=HEADS, vocab_size=VOCAB, n_positions=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=attn_pdrop, layer_norm_epsilon=1e-5,
        activation_function="gelu_new", bos_token_id=0, eos_token_id=0,
    )
    ref = transformers.GPT2LMHeadModel._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=3)
    sd = ref.state_dict()
    t = "transformer"
    weights = {"embed.tokens.weight": sd[f"{t}.wte.weight"],
               "decoder.positions.weight": sd[f"{t}.wpe.weight"]}
    weights |= _norm(f"{t}.ln_f", "decoder.norm", sd)
    for i in range(LAYERS):
        src, dst = f"{t}.h.{i}", f"decoder.layers.{i}"
        # HF Conv1D stores [in, out]; tfgraph (like nn.Linear) stores [out, in].
        qkv_w = sd[f"{src}.attn.c_attn.weight"].split(D, dim=1)
        qkv_b = sd[f"{src}.attn.c_attn.bias"].split(D)
        for j, role in enumerate("qkv"):
            weights[f"{dst}.self_attn.{role}.weight"] = qkv_w[j].T
            weights[f"{dst}.self_attn.{role}.bias"] = qkv_b[j]
        for conv, ours in (("attn.c_proj", "self_attn.o"), ("mlp.c_fc", "ffn.up"),
                           ("mlp.c_proj", "ffn.down")):
            weights[f"{dst}.{ours}.weight"] = sd[f"{src}.{conv}.weight"].T
            weights[f"{dst}.{ours}.bias"] = sd[f"{src}.{conv}.bias"]
        weights |= _norm(f"{src}.ln_1", f"{dst}.self_attn_norm", sd)
        weights |= _norm(f"{src}.ln_2", f"{dst}.ffn_norm", sd)
    spec = Spec.model_validate({
        "name": "hf-gpt2", "arch": "decoder-only", "d_model": D, "layers": LAYERS,
        "vocab": VOCAB, "max_len": 64,
        "embedding": {"positions": "learned", "scale": False, "tie_output": True},
        "attention": {"heads": HEADS, "dropout": attn_pdrop},
        "ffn": {"hidden": 4 * D, "activation": "gelu_tanh"},
        "norm": {"position": "pre", "eps": 1e-5, "final": True},
        "dropout": 0.1,
    })
    return ref, weights, spec


def test_hf_gpt2() -> None:
    ref, weights, spec = _gpt2(0.0)
    ours = to_torch(tfgraph.compile(spec), weights=weights)
    ids = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        check(ours(ids), ref(ids).logits)


def test_hf_gpt2_attention_dropout() -> None:
    """attention.dropout 0.1 against GPT-2 with attn_pdrop 0.1: eval-mode logits through
    to_torch and ONNX equal the reference's (dropout is the identity at inference); in
    train() both drop attention weights, so their outputs leave the eval ones."""
    ref, weights, spec = _gpt2(0.1)
    ids, expected = check_against(spec, ref, weights)
    spec = spec.model_copy(update={"dropout": 0.0})  # only the attention weights drop out
    ours = to_torch(tfgraph.compile(spec), weights=weights)
    with torch.no_grad():
        for net in (ours.train(), ref.train()):
            torch.manual_seed(0)
            out = net(ids)
            assert (getattr(out, "logits", out) - expected).abs().max().item() > 100 * ATOL


def test_hf_llama() -> None:
    transformers = pytest.importorskip("transformers")
    hidden, kv_heads, theta = 96, 2, 500000.0
    config = transformers.LlamaConfig(
        hidden_size=D, intermediate_size=hidden, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=kv_heads, vocab_size=VOCAB,
        rms_norm_eps=1e-6, max_position_embeddings=64, tie_word_embeddings=False,
        attention_bias=False, mlp_bias=False, rope_theta=theta,
        bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )
    ref = transformers.LlamaForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=4)
    sd = ref.state_dict()
    weights = {"embed.tokens.weight": sd["model.embed_tokens.weight"],
               "decoder.norm.weight": sd["model.norm.weight"],
               "head.weight": sd["lm_head.weight"]}
    for i in range(LAYERS):
        src, dst = f"model.layers.{i}", f"decoder.layers.{i}"
        for role in "qkvo":
            weights[f"{dst}.self_attn.{role}.weight"] = sd[f"{src}.self_attn.{role}_proj.weight"]
        for role in ("gate", "up", "down"):
            weights[f"{dst}.ffn.{role}.weight"] = sd[f"{src}.mlp.{role}_proj.weight"]
        weights[f"{dst}.self_attn_norm.weight"] = sd[f"{src}.input_layernorm.weight"]
        weights[f"{dst}.ffn_norm.weight"] = sd[f"{src}.post_attention_layernorm.weight"]
    spec = Spec.model_validate({
        "name": "hf-llama", "arch": "decoder-only", "d_model": D, "layers": LAYERS,
        "vocab": VOCAB,
        "embedding": {"positions": "rope", "rope_theta": theta, "scale": False,
                      "tie_output": False},
        "attention": {"heads": HEADS, "kv_heads": kv_heads, "bias": False},
        "ffn": {"hidden": hidden, "activation": "swiglu", "bias": False},
        "norm": {"position": "pre", "kind": "rmsnorm", "eps": 1e-6, "final": True},
        "dropout": 0.0,
    })
    ours = to_torch(tfgraph.compile(spec), weights=weights)
    ids = torch.randint(0, VOCAB, (2, 19), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        check(ours(ids), ref(ids).logits)
    # The explicit-matmul path computes the same function.
    ours.attention_impl = "math"
    with torch.no_grad():
        check(ours(ids), ref(ids).logits)


# ---- Hugging Face families for today's architecture features ------------------------------


def test_hf_qwen2_qkv_bias_without_out_bias() -> None:
    """Qwen2's attention: biases on q, k, v and none on o (``attention.qkv_bias`` /
    ``out_bias``). Catches a bias split that lowering ignores (a missing q/k/v bias changes
    the logits; an extra o bias changes the parameter count and the weights' names)."""
    transformers = pytest.importorskip("transformers")
    spec = tiny("tiny-qwen2.yaml")
    config = transformers.Qwen2Config(**llama_family_config(spec), tie_word_embeddings=True,
                                      use_sliding_window=False)
    ref = transformers.Qwen2ForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=7)
    sd = ref.state_dict()
    assert not any(k.endswith("o_proj.bias") for k in sd)
    weights = llama_family_weights(spec, sd, {"self_attn_norm": "input_layernorm",
                                               "ffn_norm": "post_attention_layernorm"})
    check_against(spec, ref, weights)


def test_hf_gpt_neox_parallel_residual() -> None:
    """``block.residual: parallel`` against Hugging Face GPT-NeoX (use_parallel_residual):
    parameter count and logits through to_torch and ONNX. Catches a layer that feeds the
    feed-forward from the attention sum (the sequential model) instead of the layer input."""
    transformers = pytest.importorskip("transformers")
    spec = tiny("tiny-neox.yaml")
    heads = spec.attention.heads
    config = transformers.GPTNeoXConfig(
        hidden_size=spec.d_model, intermediate_size=spec.ffn.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=heads, vocab_size=spec.vocab,
        rotary_pct=1.0, rotary_emb_base=spec.embedding.rope_theta,
        max_position_embeddings=spec.max_len, layer_norm_eps=spec.norm.eps,
        use_parallel_residual=True, hidden_act="gelu", tie_word_embeddings=False,
        attention_dropout=0.0, hidden_dropout=0.0,
        bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )
    ref = transformers.GPTNeoXForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=11)
    sd = ref.state_dict()
    weights = neox_weights(spec, sd)
    ids, expected = check_against(spec, ref, weights)
    sequential = spec.model_copy(update={"block": spec.block.model_copy(
        update={"residual": "sequential"})})
    other = to_torch(tfgraph.compile(sequential), weights=weights).eval()
    with torch.no_grad():
        assert (other(ids) - expected).abs().max().item() > 100 * ATOL  # the test can tell


def test_hf_olmo2_qk_norm() -> None:
    """``attention.qk_norm: full`` with branch RMSNorm against Hugging Face OLMo 2: parameter
    count and logits through to_torch and ONNX. Catches a qk-norm left out, put after the
    rotary positions, or normalising q and k per head instead of over the projection."""
    transformers = pytest.importorskip("transformers")
    spec = tiny("tiny-olmo2.yaml")
    config = transformers.Olmo2Config(**llama_family_config(spec), tie_word_embeddings=False,
                                      attention_bias=False)
    ref = transformers.Olmo2ForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=13)
    weights = llama_family_weights(spec, ref.state_dict(), {
        "self_attn.q_norm": "self_attn.q_norm", "self_attn.k_norm": "self_attn.k_norm",
        "self_attn_norm": "post_attention_layernorm", "ffn_norm": "post_feedforward_layernorm"})
    check_against(spec, ref, weights)


def test_hf_falcon_parallel_residual_with_one_shared_norm() -> None:
    """``block.shared_norm`` against Hugging Face Falcon (parallel_attn, one input_layernorm,
    multi-query): parameter count and logits through to_torch and ONNX. Catches a second
    norm per branch, or branches that read the un-normalised input."""
    transformers = pytest.importorskip("transformers")
    spec = tiny("tiny-falcon.yaml")
    att = spec.attention
    config = transformers.FalconConfig(
        hidden_size=spec.d_model, ffn_hidden_size=spec.ffn.hidden,
        num_hidden_layers=spec.layers, num_attention_heads=att.heads, vocab_size=spec.vocab,
        parallel_attn=True, new_decoder_architecture=False, multi_query=True, bias=False,
        alibi=False, layer_norm_epsilon=spec.norm.eps, max_position_embeddings=spec.max_len,
        attention_dropout=0.0, hidden_dropout=0.0, tie_word_embeddings=True,
        bos_token_id=0, eos_token_id=0, pad_token_id=None,
    )
    ref = transformers.FalconForCausalLM._from_config(config, attn_implementation="eager").eval()
    randomize(ref, seed=17)
    sd = ref.state_dict()
    weights = {"embed.tokens.weight": sd["transformer.word_embeddings.weight"]}
    for kind in ("weight", "bias"):
        weights[f"decoder.norm.{kind}"] = sd[f"transformer.ln_f.{kind}"]
    hq, hd = att.heads * att.head_dim, att.head_dim
    for i in range(spec.layers):
        src, dst = f"transformer.h.{i}", f"decoder.layers.{i}"
        qkv = sd[f"{src}.self_attention.query_key_value.weight"]  # rows: q (h*hd), k, v (hd)
        weights[f"{dst}.self_attn.q.weight"] = qkv[:hq]
        weights[f"{dst}.self_attn.k.weight"] = qkv[hq:hq + hd]
        weights[f"{dst}.self_attn.v.weight"] = qkv[hq + hd:]
        weights[f"{dst}.self_attn.o.weight"] = sd[f"{src}.self_attention.dense.weight"]
        weights[f"{dst}.ffn.up.weight"] = sd[f"{src}.mlp.dense_h_to_4h.weight"]
        weights[f"{dst}.ffn.down.weight"] = sd[f"{src}.mlp.dense_4h_to_h.weight"]
        for kind in ("weight", "bias"):
            weights[f"{dst}.norm.{kind}"] = sd[f"{src}.input_layernorm.{kind}"]
    check_against(spec, ref, weights)
