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


def sinusoidal_positions(length: int, d: int, device: torch.device, dtype: torch.dtype,
                         layout: str = "interleaved") -> Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same): (L, d).

    layout "split" (fairseq, Marian): the ceil(d/2) sines first, then the floor(d/2) cosines
    of the same frequencies. Computed per call in float32 (it is cheap next to one matmul) so
    any sequence length works, including the dynamic lengths of torch.export.
    """
    pos = torch.arange(length, device=device, dtype=torch.float32)[:, None]  # (L, 1)
    i2 = torch.arange(0, d, 2, device=device, dtype=torch.float32)  # 2i, (ceil(d/2),)
    angles = pos * torch.exp(i2 * (-math.log(10000.0) / d))  # (L, ceil(d/2))
    if layout == "split":
        pe = torch.cat((angles.sin(), angles[:, :d // 2].cos()), dim=-1)  # sines, then cosines
        return pe.to(dtype)  # (L, d)
    pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # interleaved sin, cos
    return pe[:, :d].to(dtype)  # (L, d)


def learned_positions(x: Tensor, table: Tensor, offset: int = 0) -> Tensor:
    """Rows offset .. offset + L - 1 of a learned (max_len + offset, d) position table for x
    (B, L, d) (OPT and BART read position p from row p + 2).

    A longer input is an error naming max_len (slicing would silently return fewer rows, and
    a one-row table would broadcast to every position).
    """
    length, max_len = x.shape[1], table.shape[0] - offset
    torch._check(length <= max_len, lambda: (
        f"sequence length {length} is longer than max_len {max_len} (the rows of the learned "
        "position table)"))
    return table[offset:offset + length]  # (L, d)


def alibi_bias(slopes: Tensor, x: Tensor, mask: Tensor | None, bfloat16: bool,
               head_dim: int | None, queries: Tensor | None = None) -> Tensor:
    """ALiBi: slope_h * (j - i) for query i and key j (queries at the last L of T keys, or at
    ``queries`` (L,), their slots among the T keys: a static KV cache's cache_position), in
    float32, divided by sqrt(head_dim) when given (Falcon-RW: the scores' own scale), then
    cast to x's dtype: (h, L, T). Relative to the query, the bias near the diagonal (the
    keys that weigh) stays small, so a 16-bit model rounds it as little as transformers'
    MPT does; softmax ignores the per-row constant - slope_h * i.

    With ``bfloat16``, Falcon's rounding instead (transformers' falcon build_alibi_tensor,
    FalconModel.forward): bfloat16(bfloat16(slope_h) * p_j), p_j key j's position counted
    over its row's real tokens (mask cumsum - 1, 0 on padding), cast to x's dtype, then
    divided. Rounding makes the bias depend on the positions themselves, not only on their
    differences, so a left-padded row needs its own: (B, h, L, T) with a (B, T) mask; without
    one every row counts 0..L-1 and one (h, L, L) serves all."""
    length = x.shape[1]
    keys = length if mask is None else mask.shape[1]
    if not bfloat16:
        j = torch.arange(keys, device=x.device)
        if queries is None:
            queries = torch.arange(keys - length, keys, device=x.device)
        rel = j[None, :] - queries[:, None]
        bias = slopes.float()[:, None, None] * rel  # (h, L, T) float32
        if head_dim is not None:
            bias = bias / math.sqrt(head_dim)
        return bias.to(x.dtype)
    if mask is None:
        pos = torch.arange(keys, device=x.device)[None, :]  # (1, T)
    else:
        real = mask.long()  # an integer position: bfloat16 * int64 stays bfloat16
        pos = (real.cumsum(-1) - 1) * real  # (B, T)
    bias = (slopes.bfloat16()[None, :, None] * pos[:, None, :]).to(x.dtype)  # (B|1, h, T)
    if head_dim is not None:
        bias = bias / math.sqrt(head_dim)
    if pos.shape[0] == 1:
        return bias[0, :, None, :].expand(-1, length, -1)  # (h, L, T)
    return bias[:, :, None, :].expand(-1, -1, length, -1)  # (B, h, L, T)


def relative_position_bias(table: Tensor, length: int, bidirectional: bool, buckets: int,
                           max_distance: int, keys: int | None = None,
                           queries: Tensor | None = None) -> Tensor:
    """T5's position bias (Raffel et al. 2020): table[bucket(j - i)], (heads, L, L); with
    ``keys`` T (a KV cache), (heads, L, T) for queries at the last L of T positions, or at
    ``queries`` (L,), their slots among the T (a static KV cache's cache_position).

    A distance n = |j - i| (bidirectional: keys after the query use the upper half of the
    buckets) or n = max(i - j, 0) (causal) below half the buckets b is its own bucket; larger
    ones are spaced logarithmically up to max_distance, beyond which they share the last.
    """
    total = length if keys is None else keys
    pos = torch.arange(total, device=table.device)
    at = pos[total - length:] if queries is None else queries
    rel = pos[None, :] - at[:, None]  # (L, T) j - i
    bucket = torch.zeros_like(rel)
    if bidirectional:
        buckets //= 2
        bucket = bucket + (rel > 0).long() * buckets
        rel = rel.abs()
    else:
        rel = -torch.clamp(rel, max=0)
    exact = buckets // 2
    far = exact + (torch.log(rel.float() / exact) / math.log(max_distance / exact)
                   * (buckets - exact)).long()
    far = torch.clamp(far, max=buckets - 1)
    bucket = bucket + torch.where(rel < exact, rel, far)  # (L, T)
    return F.embedding(bucket, table).permute(2, 0, 1)  # (heads, L, T)


def rope_tables(length: int, dim: int, theta: float, device: torch.device, dtype: torch.dtype,
                inv_freq: tuple[float, ...] | None = None, scale: float = 1.0,
                interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """cos and sin of the rotary angles pos * theta^(-2i/dim), each (L, dim), dim the rotated
    channels of a head. Layout rotate-half (GPT-NeoX, Llama): the dim/2 frequencies repeated,
    pairing channel i with i + dim/2; ``interleaved`` (GPT-J): each frequency twice in a row,
    pairing 2i with 2i + 1. ``inv_freq``: scaled frequencies (tfgraph.graph.rope) instead of
    theta's; ``scale``: multiplies cos and sin (YaRN's attention factor)."""
    if inv_freq is None:
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, device=device,
                                           dtype=torch.float32) / dim)  # (dim/2,)
    else:
        inv = torch.tensor(inv_freq, device=device, dtype=torch.float32)  # (dim/2,)
    pos = torch.arange(length, device=device, dtype=torch.float32)  # (L,)
    return _rope_cos_sin(pos, inv, dtype, scale, interleaved)


def rope_tables_at(positions: Tensor, dim: int, theta: float, dtype: torch.dtype,
                   inv_freq: tuple[float, ...] | None = None, scale: float = 1.0,
                   interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """rope_tables for given positions (B, S) int64 (padding, KV cache): each (B, S, dim)."""
    device = positions.device
    if inv_freq is None:
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, device=device,
                                           dtype=torch.float32) / dim)  # (dim/2,)
    else:
        inv = torch.tensor(inv_freq, device=device, dtype=torch.float32)  # (dim/2,)
    return _rope_cos_sin(positions.to(torch.float32), inv, dtype, scale, interleaved)


def _rope_cos_sin(pos: Tensor, inv: Tensor, dtype: torch.dtype, scale: float,
                  interleaved: bool) -> tuple[Tensor, Tensor]:
    angles = pos[..., None] * inv  # (..., L, dim/2); a product, not a matmul
    if interleaved:
        angles = angles.repeat_interleave(2, dim=-1)  # (L, dim): f0 f0 f1 f1 ...
    else:
        angles = torch.cat((angles, angles), dim=-1)  # (L, dim)
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype), sin.to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, heads: int, head_dim: int,
               rotary_dim: int | None = None, interleaved: bool = False) -> Tensor:
    """Rotate q or k, (B, L, heads*hd) -> same, by x*cos + rotate(x)*sin on the first
    ``rotary_dim`` channels of each head (all by default); the others pass through (Pythia,
    Phi-2, GPT-J). rotate: (-x2, x1) of the halves, or of each pair when ``interleaved``.

    Autograd keeps only cos and sin (shared by every call of one forward), not x.
    """
    x = x.unflatten(-1, (heads, head_dim))  # (B, L, heads, hd)
    rest = None
    if rotary_dim is not None and rotary_dim < head_dim:
        x, rest = x[..., :rotary_dim], x[..., rotary_dim:]  # (B, L, heads, rd), the rest
    if interleaved:
        rotated = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)  # pairs
    else:
        x1, x2 = x.chunk(2, dim=-1)  # (B, L, heads, rd/2) each
        rotated = torch.cat((-x2, x1), dim=-1)  # (B, L, heads, rd)
    # tables (L, rd) broadcast over B and heads; per-row tables (B, L, rd) over heads
    out = x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)
    if rest is not None:
        out = torch.cat((out, rest), dim=-1)  # (B, L, heads, hd)
    return out.flatten(-2)  # (B, L, heads*hd)


def attention(q: Tensor, k: Tensor, v: Tensor, heads: int, kv_heads: int, head_dim: int,
              causal: bool, normalize: str, impl: str = "sdpa", scale: float | None = None,
              softcap: float | None = None, window: int | None = None,
              bias: Tensor | None = None, dropout: float = 0.0,
              training: bool = False) -> Tensor:
    """Multi-head attention on projected q (B, Tq, h*hd), k (B, Tk, kv*hd) and v
    (B, Tk, kv*vd) -> (B, Tq, h*vd); vd = hd but in latent attention.

    ``dropout`` p drops attention weights (after normalize, before v) when ``training``
    (attention.dropout): SDPA's ``dropout_p`` (CUDA), or native dropout on the explicit
    weights (CPU, impl "math" and the other explicit forms).

    softmax with impl "sdpa": the fused kernel (flash on CPU and GPU: keeps only q, k, v, the
    output and a log-sum-exp per row for backward; grouped k/v without copies), with a
    boolean band mask for a sliding window. impl "math", hardmax and soft-capped scores (no
    fused kernel caps): explicit matmuls over the full (B, h, Tq, Tk) score matrix, which
    FlopCounterMode can see (it counts 0 for the CPU flash kernel).
    """
    q = q.unflatten(-1, (heads, head_dim)).transpose(1, 2)  # (B, h, Tq, hd)
    k = k.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)  # (B, kv, Tk, hd)
    v = v.unflatten(-1, (kv_heads, -1)).transpose(1, 2)  # (B, kv, Tk, vd)
    narrow = head_dim - v.shape[-1]  # latent attention: values narrower than q and k
    p = dropout if training else 0.0
    # CPU has no fused kernel with dropout (SDPA falls back to its math path, which keeps a
    # float mask): there the explicit form runs, keeping what the plan's unfused attention
    # counts (the weights, a one-byte mask, the dropped-out weights). On CUDA the flash
    # kernel drops out inside and keeps no mask (Dao et al. 2022 §3.1).
    fused_dropout = p == 0.0 or q.device.type != "cpu"
    if normalize == "softmax" and impl == "sdpa" and softcap is None and bias is None \
            and narrow >= 0 and fused_dropout:
        mask = None if window is None else attention_mask(q.shape[2], k.shape[2], causal,
                                                          window, q.device)
        if narrow:  # the fused kernels take one head width: v padded with zeros, the
            # output's padding dropped (as transformers' DeepSeek flash-attention path does)
            v = F.pad(v, (0, narrow))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                           dropout_p=p,
                                           is_causal=causal and mask is None, scale=scale,
                                           enable_gqa=kv_heads != heads)  # (B, h, Tq, hd)
        if narrow:
            y = y[..., :head_dim - narrow]  # (B, h, Tq, vd)
    else:
        y = explicit_attention(q, k, v, causal, normalize, scale, softcap, window, bias, p)
    return y.transpose(1, 2).flatten(2)  # (B, Tq, h*hd)


def attention_mask(tq: int, tk: int, causal: bool, window: int | None,
                   device: torch.device) -> Tensor | None:
    """Which keys each query reads, (Tq, Tk) bool, True = read: key j <= query i when causal,
    and i - j < window with a sliding window (Mistral, Gemma 2); without causality a window
    reads |i - j| < window on both sides (ModernBERT's local layers); None when every key is
    read."""
    if not causal and window is None:
        return None
    i = torch.arange(tq, device=device)[:, None]  # (Tq, 1)
    j = torch.arange(tk, device=device)[None, :]  # (1, Tk)
    if not causal and window is not None:
        return (i - j).abs() < window  # (Tq, Tk)
    read = j <= i
    if window is not None:
        read = read & (i - j < window)
    return read  # (Tq, Tk)


def soft_cap(x: Tensor, cap: float) -> Tensor:
    """cap * tanh(x / cap): scores or logits squashed smoothly into (-cap, cap) (Gemma 2)."""
    return torch.tanh(x / cap) * cap


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool, normalize: str,
                       scale: float | None = None, softcap: float | None = None,
                       window: int | None = None, bias: Tensor | None = None,
                       dropout_p: float = 0.0) -> Tensor:
    """normalize(softcap(q k^T * scale) + bias + mask) v with q (B, h, Tq, hd), k and v
    (B, kv, Tk, hd), bias (h, Tq, Tk); with ``dropout_p`` > 0 the weights are dropped out
    (inverted dropout, torch.native_dropout's one-byte mask) before they weight v.

    scale defaults to 1/sqrt(hd); softcap c gives c * tanh(scores / c) (Gemma 2); bias is T5's
    position bias.
    Query heads are grouped per k/v head (head j*g + i reads k/v head j, as repeat_interleave
    and SDPA's enable_gqa do): the g query heads of a group are stacked along the query axis,
    so each product is an ordinary batched matmul and k and v are never expanded or copied
    (a broadcasting matmul would save expanded copies of them for backward).
    hardmax: the one-hot of the arg-max (first index on ties). The arg-max has no gradient,
    so q and k are detached: backward then keeps only the one-hot weights.
    """
    batch, heads, tq, hd = q.shape
    kv_heads, tk = k.shape[1], k.shape[2]
    if normalize == "hardmax":
        q, k = q.detach(), k.detach()
    q = q.reshape(batch, kv_heads, heads // kv_heads * tq, hd)  # (B, kv, g*Tq, hd)
    scores = (q @ k.transpose(-2, -1)).unflatten(2, (-1, tq))  # (B, kv, g, Tq, Tk)
    scores = scores * (1.0 / math.sqrt(hd) if scale is None else scale)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    if bias is not None:
        scores = scores + bias.unflatten(-3, (kv_heads, -1))  # (kv, g, Tq, Tk) broadcast
    read = attention_mask(tq, tk, causal, window, q.device)  # (Tq, Tk) or None
    if read is not None:
        scores = scores.masked_fill(~read, float("-inf"))
    if normalize == "softmax":
        weights = scores.softmax(dim=-1)
    else:
        first_max = scores.argmax(dim=-1, keepdim=True)  # (B, kv, g, Tq, 1)
        weights = torch.zeros_like(scores).scatter_(-1, first_max, 1.0)
    if dropout_p > 0.0:
        weights = torch.native_dropout(weights, dropout_p, True)[0]
    y = weights.flatten(2, 3) @ v  # (B, kv, g*Tq, vd)
    return y.reshape(batch, heads, tq, v.shape[-1])  # (B, h, Tq, vd)


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


def tied_head(x: Tensor, table: Tensor, bias: Tensor | None = None) -> Tensor:
    """Logits of an output layer that shares the token table (``tie_output``): x (.., d) ->
    (.., V). Under tensor parallelism the table is a DTensor split by vocabulary rows (the
    embedding's ``RowwiseParallel``, Megatron's VocabParallelEmbedding) and the head reads
    those rows, so the weights stay tied: x enters as a replicated DTensor (its gradient, a
    partial sum on each rank, is all-reduced: Megatron's f) and the logits, split by
    vocabulary, are gathered, as ``ColwiseParallel`` computes an untied head."""
    if not hasattr(table, "device_mesh"):  # a plain tensor: no tensor parallelism
        return F.linear(x, table, bias)
    from torch.distributed.tensor import DTensor, Replicate

    mesh = table.device_mesh
    split = F.linear(DTensor.from_local(x, mesh, [Replicate()], run_check=False), table, bias)
    assert isinstance(split, DTensor)  # the logits split by vocabulary, Shard(-1)
    logits: Tensor = split.redistribute(mesh, [Replicate()]).to_local()
    return logits


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (Zhang & Sennrich 2019).

    Inference and CUDA use torch's fused ``F.rms_norm``; CPU training uses ``_RMSNorm``,
    which keeps for backward what the fused kernel keeps (and so do other devices; ``meta``
    takes CUDA's path, where exporters/torch/kernels.py counts the fused kernel).
    """
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad) \
            and x.device.type not in ("cuda", "meta"):
        return _RMSNorm.apply(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def scale_norm(x: Tensor, gain: Tensor, eps: float) -> Tensor:
    """g * x / sqrt(sum(x^2) + eps) with one scalar gain g of shape (1,) (Nguyen & Salazar
    2019). The same as rms_norm with eps / d and gain g / sqrt(d), since
    sum(x^2) + eps = d * (mean(x^2) + eps / d), so it shares rms_norm's fused kernels. That
    gain, g / sqrt(d), is a (1,) buffer of its own, which rms_norm keeps for backward."""
    d = x.shape[-1]
    return rms_norm(x, (gain * (1.0 / math.sqrt(d))).expand(d), eps / d)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout in training, the identity otherwise. ``torch.native_dropout`` is the
    kernel F.dropout uses on CUDA; on CPU F.dropout multiplies by a full-width noise tensor
    instead, keeping 4 bytes per element for backward where native_dropout keeps a bool mask."""
    if not training or p == 0.0:
        return x
    return torch.native_dropout(x, p, True)[0]


def cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """Mean token cross-entropy of logits (B, L, V) against labels (B, L) int64, computed in
    float32 (16-bit logits are upcast, as Megatron-LM and transformers do): a float32 scalar.
    Autograd keeps the float32 log-probabilities, the labels and a scalar (tfgraph.graph.ops_loss)."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def route(logits: Tensor, top_k: int, router: str, bias: Tensor | None = None,
          groups: int = 1, top_groups: int = 1, scale: float = 1.0,
          eps: float | None = None) -> Tensor:
    """Routing weights (B, L, E) from router logits (B, L, E): the k weights at their experts,
    exactly 0 elsewhere, computed in float32 as transformers' MoE routers do. router
    "softmax_topk": softmax over the E experts, the k largest (Qwen2-MoE, OLMoE);
    "softmax_topk_renorm": those divided by their sum (Mixtral, Qwen3-MoE);
    "topk_softmax": softmax over the k largest logits (Mixtral's reference code);
    "sparsemixer": Phi-3.5-MoE's two choices (``sparsemixer``, threshold ``eps``);
    "sigmoid_topk(_renorm)": sigmoid scores, the k largest of score + ``bias`` chosen,
    weighted by their score (divided by their sum + 1e-20) (DeepSeek-V3). ``groups`` > 1:
    only experts of the ``top_groups`` best of that many equal groups may be chosen, a group
    scored by its best score (softmax; DeepSeek-V2) or its two best corrected scores summed
    (sigmoid; DeepSeek-V3). ``scale`` multiplies the weights (routed_scaling_factor)."""
    x = logits.float()
    if router == "sparsemixer":
        return sparsemixer(x, float(eps if eps is not None else 0.01)).to(logits.dtype)
    if router == "topk_softmax":
        top, index = x.topk(top_k, dim=-1)  # (B, L, k)
        weights = top.softmax(dim=-1)
    else:
        sigmoid = router.startswith("sigmoid")
        scores = x.sigmoid() if sigmoid else x.softmax(dim=-1)  # (B, L, E)
        choice = scores + bias.float() if bias is not None else scores
        if groups > 1:
            per_group = choice.unflatten(-1, (groups, -1))  # (B, L, G, E/G)
            group_score = per_group.topk(2, dim=-1)[0].sum(-1) if sigmoid \
                else per_group.amax(dim=-1)  # (B, L, G)
            kept = group_score.topk(top_groups, dim=-1)[1]  # (B, L, top_groups)
            keep = torch.zeros_like(group_score).scatter(-1, kept, 1.0).bool()
            # DeepSeek-V3 leaves the other groups out with -inf, V2 with a score of 0
            fill = float("-inf") if sigmoid else 0.0
            choice = per_group.masked_fill(~keep[..., None], fill).flatten(-2)
        index = choice.topk(top_k, dim=-1)[1]  # (B, L, k)
        weights = scores.gather(-1, index)
        if router.endswith("_renorm"):
            denominator = weights.sum(dim=-1, keepdim=True)
            weights = weights / (denominator + 1e-20 if sigmoid else denominator)
    if scale != 1.0:
        weights = weights * scale
    return torch.zeros_like(x).scatter(-1, index, weights).to(logits.dtype)  # (B, L, E)


def sparsemixer(x: Tensor, eps: float) -> Tensor:
    """Phi-3.5-MoE's router at inference (Liu et al. 2024, "GRIN"; transformers'
    modeling_phimoe.sparsemixer without training): twice, the largest remaining logit m at
    expert i, weighted by the softmax over the remaining experts e whose logits s_e satisfy
    (m - s_e) / max(|s_e|, m) <= 2 eps, the others masked out; the second choice's remaining
    experts are all but the first. The threshold reads the router's logits themselves."""
    weights = torch.zeros_like(x)
    remaining = x
    for _ in range(2):
        top, index = remaining.max(dim=-1, keepdim=True)  # (.., 1): first index of a tie
        with torch.no_grad():  # a mask: nothing to differentiate (as transformers)
            far = (top - x) / x.abs().clamp(min=top) > 2 * eps
        gates = remaining.masked_fill(far, float("-inf")).softmax(dim=-1)
        weights = weights.scatter(-1, index, gates.gather(-1, index))
        remaining = remaining.scatter(-1, index, float("-inf"))
    return weights


def head_slice(x: Tensor, groups: int, start: int, take: int) -> Tensor:
    """Channels start .. start + take of each of ``groups`` equal slices of the last axis:
    (.., groups*w) -> (.., groups*take) (latent attention's parts), a buffer of its own (a
    view would keep all of x alive, which the memory plan does not count)."""
    return x.unflatten(-1, (groups, -1))[..., start:start + take].flatten(-2).contiguous()


def head_concat(a: Tensor, b: Tensor, heads: int, shared: bool = False) -> Tensor:
    """Per head, a's channels then b's: (.., h*wa), (.., h*wb) -> (.., h*(wa + wb)); with
    ``shared`` b (.., wb) is one head every head repeats (the decoupled rotary key)."""
    a = a.unflatten(-1, (heads, -1))  # (.., h, wa)
    b = b.unsqueeze(-2).expand(*a.shape[:-1], -1) if shared else b.unflatten(-1, (heads, -1))
    return torch.cat((a, b), dim=-1).flatten(-2)  # (.., h*(wa + wb))


def expert_activation(x: Tensor, activation: str) -> Tensor:
    """The element-wise activation of an expert (the gate's, for gated experts)."""
    if activation == "silu":
        return F.silu(x)
    if activation == "gelu":
        return F.gelu(x)
    if activation == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if activation == "relu":
        return F.relu(x)
    if activation == "relu2":
        return F.relu(x).square()
    raise ValueError(f"unknown expert activation {activation!r}")


def experts(x: Tensor, weights: Tensor, params: tuple[Tensor, ...], top_k: int,
            activation: str) -> Tensor:
    """Routed experts: x (B, L, d), routing weights (B, L, E) that are 0 outside each token's
    top k, stacked weights ([gate (E, H, d),] up (E, H, d), down (E, d, H)) -> (B, L, d).

    Each expert runs only on the tokens routed to it (gathered by index, as transformers and
    mlx-lm do), so the work is k experts per token, not E; its output, scaled by the token's
    routing weight, is added back at the token's row, expert by expert. The (token, expert)
    pairs are sorted by expert once: one gather, one count (one host sync), one scatter, so
    backward writes each token's gradient once, not once per expert; and each stacked weight
    is split once (unbind), so its gradient is one stack: indexed per expert (``up[e]``),
    autograd would write a zero-filled gradient of the whole stack for every expert and add
    them up (E passes over it; benchmarks/moe_train_step.py)."""
    *gate, up, down = params
    flat = x.reshape(-1, x.shape[-1])  # (N, d)
    if flat.shape[0] == 0:  # no tokens (an empty sequence): no expert runs
        return torch.zeros_like(x)
    if torch.compiler.is_compiling() and flat.shape[0] <= up.shape[0]:
        # A compiled step of at most E tokens (a decoding step): shapes that do not depend
        # on the routing, so torch.compile traces it once (the sorted split below has one
        # shape per routing, and recompiles).
        return _experts_static(flat, weights.reshape(flat.shape[0], -1), gate, up, down,
                               top_k, activation).reshape(x.shape)
    gates = gate[0].unbind(0) if gate else ()
    ups, downs = up.unbind(0), down.unbind(0)  # E x (H, d), E x (d, H)
    top_w, top_i = weights.reshape(-1, weights.shape[-1]).topk(top_k, dim=-1)  # (N, k)
    pair_expert = top_i.flatten()  # (N k,): pair p is token p // k's slot p % k
    order = pair_expert.argsort(stable=True)  # expert by expert, in token order within each
    token = order // top_k
    counts = torch.bincount(pair_expert, minlength=len(ups)).tolist()  # pairs per expert
    gathered = flat[token]  # (N k, d)
    outputs = [_expert(rows, gates[e] if gates else None, ups[e], downs[e], activation)
               for e, rows in enumerate(gathered.split(counts)) if rows.shape[0]]
    # Each buffer is dropped once its last reader is done: without autograd the gathered rows
    # die before the join, the experts' outputs once joined (what ops_moe's temp counts).
    del gathered
    y = torch.cat(outputs)
    del outputs
    y = y * top_w.flatten()[order, None]  # (N k, d)
    return torch.zeros_like(flat).index_add_(0, token, y).reshape(x.shape)


def _expert(rows: Tensor, gate: Tensor | None, up: Tensor, down: Tensor,
            activation: str) -> Tensor:
    """One expert's feed-forward on its (n_e, d) rows -> (n_e, d); its (n_e, H) buffers die
    when it returns."""
    if gate is not None:
        h = expert_activation(F.linear(rows, gate), activation) * F.linear(rows, up)
    else:
        h = expert_activation(F.linear(rows, up), activation)  # (n_e, H)
    return F.linear(h, down)


def _experts_static(flat: Tensor, weights: Tensor, gate: list[Tensor], up: Tensor,
                    down: Tensor, top_k: int, activation: str) -> Tensor:
    """``experts`` for N <= E tokens with routing-independent shapes. With N k <= E pairs, each
    pair's expert weights are gathered (gpt-fast's Mixtral decoding): N k experts read, no
    more than the routing picks. With more pairs, every expert runs on every token, weighted
    by its routing weight (0 outside the token's top k): each expert read once, as the
    sorted split reads it when the pairs reach every expert. flat (N, d), weights (N, E) ->
    (N, d)."""
    tokens, count = flat.shape[0], up.shape[0]
    if tokens * top_k <= count:
        top_w, top_i = weights.topk(top_k, dim=-1)  # (N, k)
        h = torch.einsum("nd,nkhd->nkh", flat, up[top_i])  # (N, k, H)
        if gate:
            g = torch.einsum("nd,nkhd->nkh", flat, gate[0][top_i])
            h = expert_activation(g, activation) * h
        else:
            h = expert_activation(h, activation)
        out = torch.einsum("nkh,nkdh->nkd", h, down[top_i])  # (N, k, d)
        return (out * top_w.unsqueeze(-1)).sum(1)
    h = torch.einsum("nd,ehd->neh", flat, up)  # (N, E, H)
    if gate:
        h = expert_activation(torch.einsum("nd,ehd->neh", flat, gate[0]), activation) * h
    else:
        h = expert_activation(h, activation)
    # An unrouted expert is selected out, not multiplied by 0: an overflowing output of an
    # expert no token picked would make 0 x inf = NaN (the sorted split never runs it).
    w = weights.unsqueeze(-1)  # (N, E, 1)
    return torch.einsum("neh,edh->nd", torch.where(w != 0, h * w, 0.0), down)


def positions_at(table: Tensor, position_ids: Tensor, offset: int = 0) -> Tensor:
    """Row offset + id of a (rows, d) position table for each token's position id (B, S) ->
    (B, S, d); an id of -1 reads row offset - 1 (RoBERTa's padding row). The gather keeps its
    indices for backward: the ids themselves at offset 0, else the shifted ids it computes."""
    return F.embedding(position_ids + offset if offset else position_ids, table)


def pad_position_ids(input_ids: Tensor, pad: int) -> Tensor:
    """Position ids (B, S) that skip padding (fairseq's make_positions, Hugging Face RoBERTa's
    create_position_ids_from_input_ids less its offset): a token other than ``pad`` gets
    the count of such tokens before it, a padding token -1."""
    real = input_ids.ne(pad).long()
    return torch.cumsum(real, dim=1) * real - 1


def sinusoids_at(position_ids: Tensor, d: int, dtype: torch.dtype,
                 layout: str = "interleaved") -> Tensor:
    """sinusoidal_positions for each token's position id (B, S) -> (B, S, d)."""
    rows = int(position_ids.max()) + 1 if position_ids.numel() else 1
    table = sinusoidal_positions(rows, d, position_ids.device, dtype, layout)  # (rows, d)
    return F.embedding(position_ids, table)


def kv_write(buffer: Tensor, new: Tensor, positions: Tensor, kv_heads: int,
             head_dim: int) -> Tensor:
    """A static cache (gpt-fast): write new (B, S, kv*hd) into the preallocated buffer
    (B, kv, L, hd) at ``positions`` (S,) in place, and return the whole buffer: shapes stay
    the same from step to step, so torch.compile traces the step once."""
    new = new.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)  # (B, kv, S, hd)
    return buffer.index_copy_(2, positions, new.to(buffer.dtype))


def kv_concat(past: Tensor | None, new: Tensor, kv_heads: int, head_dim: int) -> Tensor:
    """Present keys or values: past (B, kv, P, hd) then new (B, S, kv*hd) -> (B, kv, P+S, hd);
    without a past, new alone as (B, kv, S, hd)."""
    new = new.unflatten(-1, (kv_heads, head_dim)).transpose(1, 2)  # (B, kv, S, hd)
    return new if past is None else torch.cat((past.to(new.dtype), new), dim=2)


def cached_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, heads: int,
                     kv_heads: int, head_dim: int, causal: bool, normalize: str,
                     scale: float | None = None, softcap: float | None = None,
                     window: int | None = None, self_read: bool = True,
                     bias: Tensor | None = None, positions: Tensor | None = None,
                     dropout_p: float = 0.0) -> Tensor:
    """Attention of the last S positions' queries q (B, S, h*hd) over present k, v
    (B, kv, T, hd): key j is read by query i (at position P + i, P = T - S) when
    mask[b, j] == 1 and, when causal, j <= P + i and P + i - j < window (without
    causality |P + i - j| < window, an encoder's local layers); a query always
    reads its own key (``self_read``; not in cross-attention), so padding rows stay finite.
    ``bias`` (h, S, T), or (B, h, S, T) per row, is added to the scores before the mask.
    ``positions`` (S,): the queries' positions in a static cache's buffer (kv_write), which
    are not its last S. ``dropout_p`` > 0 (training calls with a mask: attention.dropout)
    drops the weights out as explicit_attention does (the same native dropout on the same
    (B, kv, g, S, T) weights, so a mask of ones draws what the full-sequence graph draws).
    -> (B, S, h*hd)."""
    batch, s, t = q.shape[0], q.shape[1], k.shape[2]
    q = q.unflatten(-1, (heads, head_dim)).transpose(1, 2)  # (B, h, S, hd)
    i = (torch.arange(t - s, t, device=q.device) if positions is None
         else positions)[:, None]  # (S, 1) absolute query positions
    j = torch.arange(t, device=q.device)[None, :]  # (1, T)
    read = (mask[:, None, :] != 0)  # (B, 1, T)
    if causal:
        read = read & (j <= i)[None]  # (B, S, T)
        if window is not None:
            read = read & (i - j < window)[None]
    elif window is not None:  # ModernBERT's local layers: |i - j| < window on both sides
        read = read & ((i - j).abs() < window)[None]
    if self_read:
        read = read | (j == i)[None]  # (B, S, T): its own key always
    # Query heads grouped per k/v head, as in explicit_attention: no expanded k/v copies.
    qg = q.reshape(batch, kv_heads, heads // kv_heads * s, head_dim)  # (B, kv, g*S, hd)
    scores = (qg @ k.transpose(-2, -1)).unflatten(2, (-1, s))  # (B, kv, g, S, T)
    scores = scores * (1.0 / math.sqrt(head_dim) if scale is None else scale)
    if softcap is not None:
        scores = soft_cap(scores, softcap)
    if bias is not None:  # (h, S, T) -> (kv, g, S, T), before the mask; (B, h, S, T) per row
        scores = scores + bias.unflatten(-3, (kv_heads, -1))
    scores = scores.masked_fill(~read[:, None, None], float("-inf"))
    if normalize == "softmax":
        weights = scores.softmax(dim=-1)
    else:
        first_max = scores.argmax(dim=-1, keepdim=True)
        weights = torch.zeros_like(scores).scatter_(-1, first_max, 1.0)
    if dropout_p > 0.0:
        weights = torch.native_dropout(weights, dropout_p, True)[0]
    y = (weights.flatten(2, 3) @ v).reshape(batch, heads, s, v.shape[-1])  # (B, h, S, vd)
    return y.transpose(1, 2).flatten(2)  # (B, S, h*hd)
