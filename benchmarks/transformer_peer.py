"""The named peer of the ONNX benchmarks: the original Transformer in stock ``torch.nn``.

Token embedding (one table, shared by both stacks and tied to the output head, scaled by
sqrt(d_model)) + sinusoidal positions + ``torch.nn.Transformer`` (post-norm layers, ReLU, no final
stack norms: Vaswani et al. 2017's base model as tfgraph's specs/base.yaml describes it) + head.
``load_tfgraph_weights`` copies tfgraph's parameters (README.md's parameter names) into it, so its logits can
be compared with tfgraph's back ends: torch's own implementation, which nobody here wrote, is
the reference.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn


class VaswaniTransformer(nn.Module):
    def __init__(self, vocab: int, d_model: int, heads: int, layers: int, hidden: int,
                 eps: float = 1e-5) -> None:
        super().__init__()
        self.d_model = d_model
        self.embed = nn.Embedding(vocab, d_model)
        enc = nn.TransformerEncoderLayer(d_model, heads, hidden, dropout=0.0, batch_first=True,
                                         layer_norm_eps=eps)
        dec = nn.TransformerDecoderLayer(d_model, heads, hidden, dropout=0.0, batch_first=True,
                                         layer_norm_eps=eps)
        # norm=None: base.yaml has no final stack norms (norm.final: false), nn.Transformer's
        # default would add them.
        self.transformer = nn.Transformer(
            d_model, heads, batch_first=True,
            custom_encoder=nn.TransformerEncoder(enc, layers, norm=None,
                                                 enable_nested_tensor=False),
            custom_decoder=nn.TransformerDecoder(dec, layers, norm=None))

    def positions(self, length: int, device: torch.device) -> torch.Tensor:
        pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]  # (L, 1)
        i2 = torch.arange(0, self.d_model, 2, device=device, dtype=torch.float32)
        angles = pos * torch.exp(i2 * (-math.log(10000.0) / self.d_model))  # (L, d/2)
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (L, d)

    def embed_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) * math.sqrt(self.d_model)  # (B, L, d)
        return x + self.positions(ids.shape[1], ids.device)

    def forward(self, src_ids: torch.Tensor, tgt_ids: torch.Tensor) -> torch.Tensor:
        t = tgt_ids.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=tgt_ids.device), diagonal=1)
        y = self.transformer(self.embed_tokens(src_ids), self.embed_tokens(tgt_ids),
                             tgt_mask=mask, tgt_is_causal=True)  # (B, T, d)
        return y @ self.embed.weight.T  # tied head: (B, T, V)


def for_spec(spec: Any) -> VaswaniTransformer:
    """The peer at the sizes of a Vaswani-style spec (base.yaml, big.yaml)."""
    ok = (spec.arch == "encoder-decoder" and spec.norm.position == "post"
          and spec.norm.kind == "layernorm" and not spec.norm.final
          and spec.ffn.activation == "relu" and spec.embedding.positions == "sinusoidal"
          and spec.embedding.share and spec.embedding.tie_output and spec.embedding.scale
          and spec.attention.bias and spec.ffn.bias
          and spec.attention.kv_heads == spec.attention.heads
          and not spec.embedding.output_bias and spec.output == "logits"
          and spec.attention.normalize == "softmax"
          and spec.layer_count("encoder") == spec.layer_count("decoder")
          and spec.attention.head_dim * spec.attention.heads == spec.d_model)
    if not ok:
        raise ValueError(f"{spec.name}: torch.nn.Transformer has no equivalent of this variant")
    return VaswaniTransformer(spec.vocab_size("source"), spec.d_model, spec.attention.heads,
                              spec.layer_count("encoder"), spec.ffn.hidden, spec.norm.eps)


def load_tfgraph_weights(model: VaswaniTransformer, weights: dict[str, np.ndarray]) -> None:
    """Copy tfgraph's parameters into the peer (q, k, v stacked into in_proj)."""
    t = {name: torch.from_numpy(np.asarray(value, np.float32)) for name, value in weights.items()}
    state: dict[str, torch.Tensor] = {"embed.weight": t["embed.tokens.weight"]}
    attn = {"encoder": [("self_attn", "self_attn", "self_attn_norm", "norm1")],
            "decoder": [("self_attn", "self_attn", "self_attn_norm", "norm1"),
                        ("cross_attn", "multihead_attn", "cross_attn_norm", "norm2")]}
    for stack, layers in (("encoder", model.transformer.encoder.layers),
                          ("decoder", model.transformer.decoder.layers)):
        for i in range(len(layers)):
            ours, theirs = f"{stack}.layers.{i}", f"transformer.{stack}.layers.{i}"
            for sub, their_sub, norm, their_norm in attn[stack]:
                for kind in ("weight", "bias"):
                    state[f"{theirs}.{their_sub}.in_proj_{kind}"] = torch.cat(
                        [t[f"{ours}.{sub}.{p}.{kind}"] for p in "qkv"])
                    state[f"{theirs}.{their_sub}.out_proj.{kind}"] = t[f"{ours}.{sub}.o.{kind}"]
                    state[f"{theirs}.{their_norm}.{kind}"] = t[f"{ours}.{norm}.{kind}"]
            ffn_norm = "norm2" if stack == "encoder" else "norm3"
            for kind in ("weight", "bias"):
                state[f"{theirs}.linear1.{kind}"] = t[f"{ours}.ffn.up.{kind}"]
                state[f"{theirs}.linear2.{kind}"] = t[f"{ours}.ffn.down.{kind}"]
                state[f"{theirs}.{ffn_norm}.{kind}"] = t[f"{ours}.ffn_norm.{kind}"]
    model.load_state_dict(state, strict=True)
