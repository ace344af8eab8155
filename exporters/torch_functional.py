"""The PyTorch meaning of tfgraph's ops that torch.nn.functional does not have in one call.

Shared by the two PyTorch back ends: ``torch_module`` (``to_torch``) calls these functions and
``torch_source`` copies their source text verbatim into the generated ``model.py``, so the
interpreted module and the standalone file run the same kernels in the same order and give
bit-identical outputs. Keep them self-contained: they may use only ``math``, ``torch`` and
``F`` (torch.nn.functional), and each other by name.

Shapes: B batch, L (Tq, Tk) sequence lengths, h query heads, kv key/value heads, hd head_dim.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def sinusoidal_positions(length: int, d: int, device: torch.device, dtype: torch.dtype) -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same): (L, d).

    Computed per call in float32 (it is cheap next to one matmul) so any sequence length
    works, including the dynamic lengths of torch.export.
    """
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]  # (L, 1)
    i2 = torch.arange(0, d, 2, device=device, dtype=torch.float32)  # 2i, (ceil(d/2),)
    angles = pos * torch.exp(i2 * (-math.log(10000.0) / d))  # (L, ceil(d/2))
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # interleaved sin, cos
    return pe[:, :d].to(dtype)  # (L, d)


def learned_positions(x: Tensor, table: Tensor) -> Tensor:
    """The first L rows of a learned (max_len, d) position table for x (B, L, d).

    A longer input is an error naming max_len (slicing would silently return fewer rows, and
    a one-row table would broadcast to every position).
    """
    length, max_len = x.shape[1], table.shape[0]
    torch._check(length <= max_len, lambda: (
        f"sequence length {length} is longer than max_len {max_len} (the rows of the learned "
        "position table)"))
    return table[:length]  # (L, d)


def rope_tables(length: int, head_dim: int, theta: float, device: torch.device,
                dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles pos * theta^(-2i/hd), each (L, hd) (rotate-half layout:
    the hd/2 frequencies repeated, pairing channel i with i + hd/2; GPT-NeoX, Llama)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device,
                                             dtype=torch.float32) / head_dim)  # (hd/2,)
    pos = torch.arange(length, device=device, dtype=torch.float32)  # (L,)
    angles = pos[:, None] * inv_freq[None, :]  # (L, hd/2); a product, not a matmul
    angles = torch.cat((angles, angles), dim=-1)  # (L, hd)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, heads: int, head_dim: int) -> Tensor:
    """Rotate q or k, (B, L, heads*hd) -> same, by x*cos + rotate_half(x)*sin.

    Autograd keeps only cos and sin (shared by every call of one forward), not x.
    """
    x = x.unflatten(-1, (heads, head_dim))  # (B, L, heads, hd)
    x1, x2 = x.chunk(2, dim=-1)  # (B, L, heads, hd/2) each
    rotated = torch.cat((-x2, x1), dim=-1)  # (B, L, heads, hd)
    out = x * cos[:, None, :] + rotated * sin[:, None, :]  # tables broadcast over B and heads
    return out.flatten(-2)  # (B, L, heads*hd)


def attention(q: Tensor, k: Tensor, v: Tensor, heads: int, kv_heads: int, head_dim: int,
              causal: bool, normalize: str, impl: str = "sdpa") -> Tensor:
    """Multi-head attention on projected q (B, Tq, h*hd), k and v (B, Tk, kv*hd) -> (B, Tq, h*hd).

    softmax with impl "sdpa": the fused kernel (flash on CPU and GPU: keeps only q, k, v, the
    output and a log-sum-exp per row for backward; grouped k/v without copies). impl "math"
    and hardmax: explicit matmuls over the full (B, h, Tq, Tk) score matrix, which
    FlopCounterMode can see (it counts 0 for the CPU flash kernel).
    """
    q = q.unflatten(-1, (heads, head_dim)).transpose(1, 2)  # (B, h, Tq, hd)
    k = k.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)  # (B, kv, Tk, hd)
    v = v.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)  # (B, kv, Tk, hd)
    if normalize == "softmax" and impl == "sdpa":
        y = F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                           enable_gqa=kv_heads != heads)  # (B, h, Tq, hd)
    else:
        y = explicit_attention(q, k, v, causal, normalize)
    return y.transpose(1, 2).flatten(2)  # (B, Tq, h*hd)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, normalize: str) -> Tensor:
    """normalize(q k^T / sqrt(hd) + mask) v with q (B, h, Tq, hd), k and v (B, kv, Tk, hd).

    Query heads are grouped per k/v head (head j*g + i reads k/v head j, as repeat_interleave
    and SDPA's enable_gqa do), so k and v are broadcast, never copied g times.
    hardmax: the one-hot of the arg-max (first index on ties). The arg-max has no gradient,
    so q and k are detached: backward then keeps only the one-hot weights.
    """
    batch, heads, tq, hd = q.shape
    kv_heads, tk = k.shape[1], k.shape[2]
    if normalize == "hardmax":
        q, k = q.detach(), k.detach()
    q = q.unflatten(1, (kv_heads, heads // kv_heads))  # (B, kv, g, Tq, hd)
    scores = q @ k.unsqueeze(2).transpose(-2, -1)  # (B, kv, g, Tq, Tk)
    scores = scores * (1.0 / math.sqrt(hd))
    if causal:
        future = torch.ones(tq, tk, dtype=torch.bool, device=q.device).triu(1)  # (Tq, Tk)
        scores = scores.masked_fill(future, float("-inf"))
    if normalize == "softmax":
        weights = scores.softmax(dim=-1)
    else:
        first_max = scores.argmax(dim=-1, keepdim=True)  # (B, kv, g, Tq, 1)
        weights = torch.zeros_like(scores).scatter_(-1, first_max, 1.0)
    y = weights @ v.unsqueeze(2)  # (B, kv, g, Tq, hd)
    return y.flatten(1, 2)  # (B, h, Tq, hd)


class _RMSNorm(torch.autograd.Function):
    """x * rsqrt(mean(x^2) + eps) * w computed in float32, keeping only x and the float32
    per-row rstd for backward, like the fused CUDA kernel. PyTorch's CPU rms_norm is a
    composite whose autograd also keeps the normalized x (and float32 copies of 16-bit
    inputs); this keeps training memory what tfgraph's report says on every device."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, x: Tensor, weight: Tensor,
                eps: float) -> Tensor:
        x32 = x.to(torch.promote_types(x.dtype, torch.float32))  # 16-bit inputs in float32
        rstd = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + eps)  # (..., 1)
        ctx.save_for_backward(x, weight, rstd)
        return (x32 * rstd).to(x.dtype) * weight

    @staticmethod
    # ctx is Any, as in torch's own Function.backward: its stubs declare saved_tensors and
    # needs_input_grad (torch/_C/__init__.pyi) as 1-tuples, and FunctionCtx has neither.
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, Tensor | None, None]:
        x, weight, rstd = ctx.saved_tensors
        xhat = x.to(rstd.dtype) * rstd  # (..., d) recomputed, not kept
        grad32 = grad.to(rstd.dtype)
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (grad32 * xhat).flatten(0, -2).sum(0).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            dxhat = grad32 * weight.to(rstd.dtype)
            # d/dx of x * r with r = (mean(x^2) + eps)^-1/2: r * (dxhat - xhat * mean(dxhat*xhat))
            grad_x = (rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))).to(x.dtype)
        return grad_x, grad_w, None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (Zhang & Sennrich 2019).

    Inference and CUDA use torch's fused ``F.rms_norm``; CPU training uses ``_RMSNorm``,
    which keeps for backward what the fused kernel keeps.
    """
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad) and not x.is_cuda:
        return _RMSNorm.apply(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def scale_norm(x: Tensor, gain: Tensor, eps: float) -> Tensor:
    """g * x / sqrt(sum(x^2) + eps) with one scalar gain g of shape (1,) (Nguyen & Salazar
    2019). The same as rms_norm with eps / d and gain g / sqrt(d), since
    sum(x^2) + eps = d * (mean(x^2) + eps / d), so it shares rms_norm's fused kernels."""
    d = x.shape[-1]
    return rms_norm(x, (gain * (1.0 / math.sqrt(d))).expand(d), eps / d)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout in training, the identity otherwise. ``torch.native_dropout`` is the
    kernel F.dropout uses on CUDA; on CPU F.dropout multiplies by a full-width noise tensor
    instead, keeping 4 bytes per element for backward where native_dropout keeps a bool mask."""
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]
