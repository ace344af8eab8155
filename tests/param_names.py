"""README.md's parameter names ("Parameter names"), written out from the spec alone, for
tests that check what lowering and the back ends name their parameters (independently of
tfgraph.graph.lower, so that a renamed parameter is caught)."""

from __future__ import annotations

from tfgraph.spec.schema import GATED_ACTIVATIONS, Spec


def expected_params(spec: Spec) -> dict[str, tuple[int, ...]]:
    """README.md's parameter names, written out independently of tfgraph.graph.lower: name -> shape."""
    d, att, ffn, norm = spec.d_model, spec.attention, spec.ffn, spec.norm
    out: dict[str, tuple[int, ...]] = {}

    def norm_params(prefix: str, width: int = d) -> None:
        if not norm.affine:  # OLMo 1: a norm without parameters
            return
        if norm.kind == "scalenorm":
            out[f"{prefix}.weight"] = (1,)
            return
        out[f"{prefix}.weight"] = (width,)
        if norm.kind == "layernorm" and norm.bias:  # norm.bias: false keeps the gain alone
            out[f"{prefix}.bias"] = (width,)

    def linear(prefix: str, d_in: int, d_out: int, bias: bool) -> None:
        out[f"{prefix}.weight"] = (d_out, d_in)
        if bias:
            out[f"{prefix}.bias"] = (d_out,)

    if spec.arch == "encoder-decoder" and not spec.embedding.share:
        out["embed.source_tokens.weight"] = (spec.vocab_size("source"), d)
        out["embed.target_tokens.weight"] = (spec.vocab_size("target"), d)
    else:
        out["embed.tokens.weight"] = (spec.vocab_size("source"), d)
    if spec.embedding.token_types:
        out["embed.token_types.weight"] = (spec.embedding.token_types, d)
    for stack in spec.stacks:
        if spec.embedding.positions == "learned":
            assert spec.max_len is not None
            out[f"{stack}.positions.weight"] = (spec.max_len + spec.embedding.position_offset, d)
        if spec.embedding.norm:
            norm_params(f"{stack}.embed_norm")
        if spec.embedding.positions == "relative":  # T5: one bias table per stack
            out[f"{stack}.relative_bias.weight"] = (spec.embedding.relative_buckets, att.heads)
        for i in range(spec.layer_count(stack)):
            layer = f"{stack}.layers.{i}"
            subs = ["self_attn"]
            if spec.arch == "encoder-decoder" and stack == "decoder":
                subs.append("cross_attn")
            lat = att.latent
            if lat is not None:  # latent attention (decoder-only: self_attn alone)
                sub, hd, vd = "self_attn", att.head_dim, lat.v_head_dim
                if lat.q_rank is not None:
                    out[f"{layer}.{sub}.q_a.weight"] = (lat.q_rank, d)
                    norm_params(f"{layer}.{sub}.q_a_norm", lat.q_rank)
                    out[f"{layer}.{sub}.q_b.weight"] = (att.heads * hd, lat.q_rank)
                else:
                    out[f"{layer}.{sub}.q.weight"] = (att.heads * hd, d)
                out[f"{layer}.{sub}.kv_a.weight"] = (lat.kv_rank + lat.rope_dim, d)
                norm_params(f"{layer}.{sub}.kv_a_norm", lat.kv_rank)
                out[f"{layer}.{sub}.kv_b.weight"] = (
                    att.heads * (hd - lat.rope_dim + vd), lat.kv_rank)
                linear(f"{layer}.{sub}.o", att.heads * vd, d,
                       att.bias if att.out_bias is None else att.out_bias)
            for sub in subs if lat is None else []:
                hq, hkv = att.heads * att.head_dim, att.kv_heads * att.head_dim
                qkv_bias = att.bias if att.qkv_bias is None else att.qkv_bias
                out_bias = att.bias if att.out_bias is None else att.out_bias
                linear(f"{layer}.{sub}.q", d, hq, qkv_bias)
                linear(f"{layer}.{sub}.k", d, hkv, qkv_bias)
                linear(f"{layer}.{sub}.v", d, hkv, qkv_bias)
                linear(f"{layer}.{sub}.o", hq, d, out_bias)
                if att.qk_norm == "full":
                    norm_params(f"{layer}.{sub}.q_norm", hq)
                    norm_params(f"{layer}.{sub}.k_norm", hkv)
                elif att.qk_norm == "head":  # one gain of width head_dim for every head
                    norm_params(f"{layer}.{sub}.q_norm", att.head_dim)
                    norm_params(f"{layer}.{sub}.k_norm", att.head_dim)
            gated = ffn.activation in GATED_ACTIVATIONS
            if ffn.experts is not None and i >= (ffn.dense_layers or 0):
                # mixture of experts: router, stacked routed experts, shared experts
                e, h = ffn.experts, ffn.expert_hidden
                out[f"{layer}.ffn.router.weight"] = (e, d)
                if str(ffn.router).startswith("sigmoid"):  # DeepSeek-V3's selection bias
                    out[f"{layer}.ffn.router.correction_bias"] = (e,)
                for role in ("gate", "up") if gated else ("up",):
                    out[f"{layer}.ffn.experts.{role}.weight"] = (e, h, d)
                out[f"{layer}.ffn.experts.down.weight"] = (e, d, h)
                if ffn.shared_experts:
                    for role in ("gate", "up") if gated else ("up",):
                        out[f"{layer}.ffn.shared.{role}.weight"] = (ffn.shared_hidden, d)
                    out[f"{layer}.ffn.shared.down.weight"] = (d, ffn.shared_hidden)
                if ffn.shared_gate:
                    out[f"{layer}.ffn.shared_gate.weight"] = (1, d)
            else:
                linear(f"{layer}.ffn.up", d, ffn.hidden, ffn.bias)
                if gated:
                    linear(f"{layer}.ffn.gate", d, ffn.hidden, ffn.bias)
                linear(f"{layer}.ffn.down", ffn.hidden, d, ffn.bias)
            if spec.block.shared_norm:
                norm_params(f"{layer}.norm")
            for sub in [*subs, "ffn"] if not spec.block.shared_norm else []:
                if not (norm.skip_first and i == 0 and sub == "self_attn"):  # ModernBERT
                    norm_params(f"{layer}.{sub}_norm")
                if norm.position == "sandwich":
                    norm_params(f"{layer}.{sub}_out_norm")
        if norm.final:
            norm_params(f"{stack}.norm")
    if not spec.embedding.tie_output:
        out["head.weight"] = (spec.output_vocab, d)
    if spec.embedding.output_bias:
        out["head.bias"] = (spec.output_vocab,)
    if spec.head.transform:
        linear("head.transform", d, d, spec.head.transform_bias)
        norm_params("head.transform_norm")
    return out
