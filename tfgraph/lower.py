"""Lowering: a validated ``Spec`` becomes an op ``Graph`` (design §2-§4).

Reads like a model file: embeddings, a stack of layers (self-attention, cross-attention in the
decoder of encoder-decoder models, feed-forward, each wrapped in the spec's residual/norm
placement), the final norm and the output head. Shapes in comments use B (batch), S (source
or only sequence), T (target sequence), d (d_model), h (heads), kv (kv_heads), hd (head_dim).

Precondition: ``spec`` passed validation (derived defaults resolved).
Postcondition: the graph lints; parameter nodes carry exactly the names of design §4.
"""

from __future__ import annotations

import math

import sympy

from tfgraph.ir import B, S, T, Graph
from tfgraph.spec import GATED_ACTIVATIONS, Spec


def _sqrt(n: int | sympy.Expr) -> float | sympy.Expr:
    """sqrt(d_model) as a float, or symbolically in tfgraph.formulas' symbolic twins."""
    return sympy.sqrt(n) if isinstance(n, sympy.Basic) else math.sqrt(n)


class _Lowering:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.g = Graph(spec.name, spec=spec)
        self.dtype = spec.dtype

    # ---- small helpers ----------------------------------------------------------------

    def param(self, name: str, shape: tuple[int, ...], scope: str, init: str) -> str:
        return self.g.param(name, shape, scope=scope, init=init, dtype=self.dtype)

    def linear(self, x: str, scope: str, role: str, d_in: int, d_out: int, bias: bool) -> str:
        """``{scope}.{role}``: x (.., d_in) -> (.., d_out) with weight [d_out, d_in]."""
        ins = [x, self.param(f"{scope}.{role}.weight", (d_out, d_in), scope, "normal")]
        if bias:
            ins.append(self.param(f"{scope}.{role}.bias", (d_out,), scope, "zeros"))
        return self.g.add("linear", ins, name=f"{scope}.{role}", scope=scope)

    def norm(self, x: str, node_name: str, param_prefix: str, scope: str) -> str:
        """A norm of the spec's kind with parameters ``{param_prefix}.weight`` (and ``.bias``)."""
        kind, d = self.spec.norm.kind, self.spec.d_model
        if kind == "scalenorm":
            ins = [x, self.param(f"{param_prefix}.weight", (1,), scope, "ones")]
        else:
            ins = [x, self.param(f"{param_prefix}.weight", (d,), scope, "ones")]
            if kind == "layernorm":
                ins.append(self.param(f"{param_prefix}.bias", (d,), scope, "zeros"))
        return self.g.add(kind, ins, name=node_name, scope=scope, eps=self.spec.norm.eps)

    def dropout(self, x: str, name: str, scope: str) -> str:
        if self.spec.dropout == 0:
            return x
        return self.g.add("dropout", [x], name=name, scope=scope, p=self.spec.dropout)

    # ---- model ------------------------------------------------------------------------

    def model(self) -> Graph:
        spec, g = self.spec, self.g
        d = spec.d_model
        if spec.arch == "encoder-decoder":
            src = g.input("src_ids", (B, S))  # (B, S) int64
            tgt = g.input("tgt_ids", (B, T))  # (B, T) int64
            if spec.embedding.share:
                src_table = tgt_table = self.param(
                    "embed.tokens.weight", (spec.vocab_size("source"), d), "embed", "normal")
            else:
                src_table = self.param("embed.source_tokens.weight",
                                       (spec.vocab_size("source"), d), "embed", "normal")
                tgt_table = self.param("embed.target_tokens.weight",
                                       (spec.vocab_size("target"), d), "embed", "normal")
            memory = self.stack("encoder", src, src_table, causal=False, memory=None)
            x = self.stack("decoder", tgt, tgt_table, causal=True, memory=memory)
            out_table = tgt_table
        else:
            ids = g.input("input_ids", (B, S))  # (B, S) int64
            table = self.param("embed.tokens.weight", (spec.vocab_size("source"), d),
                               "embed", "normal")
            stack = "decoder" if spec.arch == "decoder-only" else "encoder"
            x = self.stack(stack, ids, table, causal=stack == "decoder", memory=None)
            out_table = table
        g.set_output(self.head(x, out_table))
        return g

    def stack(self, stack: str, ids: str, table: str, causal: bool, memory: str | None) -> str:
        x = self.embed(stack, ids, table)  # (B, L, d)
        for i in range(self.spec.layer_count(stack)):
            x = self.layer(f"{stack}.layers.{i}", x, causal, memory)
        if self.spec.norm.final:
            x = self.norm(x, f"{stack}.norm", f"{stack}.norm", f"{stack}.norm")
        return x

    def embed(self, stack: str, ids: str, table: str) -> str:
        spec, g, scope = self.spec, self.g, f"{stack}.embed"
        x = g.add("embedding", [table, ids], name=f"{scope}.tokens", scope=scope)  # (B, L, d)
        if spec.embedding.scale:
            x = g.add("scale", [x], name=f"{scope}.scale", scope=scope,
                      factor=_sqrt(spec.d_model))
        if spec.embedding.positions == "sinusoidal":
            x = g.add("positions_sinusoidal", [x], name=f"{scope}.positions", scope=scope)
        elif spec.embedding.positions == "learned":
            assert spec.max_len is not None  # the spec validator guarantees it
            pos = self.param(f"{stack}.positions.weight", (spec.max_len, spec.d_model),
                             scope, "normal")
            x = g.add("positions_learned", [x, pos], name=f"{scope}.positions", scope=scope)
        return self.dropout(x, f"{scope}.dropout", scope)

    def layer(self, scope: str, x: str, causal: bool, memory: str | None) -> str:
        x = self.residual(x, scope, "self_attn",
                          lambda h, s: self.attention(h, h, s, causal=causal, rope=True))
        if memory is not None:
            x = self.residual(x, scope, "cross_attn",
                              lambda h, s: self.attention(h, memory, s, causal=False, rope=False))
        return self.residual(x, scope, "ffn", self.ffn)

    def residual(self, x: str, layer: str, sub: str, f) -> str:  # type: ignore[no-untyped-def]
        """One sublayer f with the spec's norm placement (design §3):
        post norm(x + f(x)); pre x + f(norm(x)); branch x + norm(f(x));
        sandwich x + norm(f(norm(x))). Dropout goes on f's output before the add."""
        scope, where, g = f"{layer}.{sub}", self.spec.norm.position, self.g
        norm_name = f"{layer}.{sub}_norm"
        h = x
        if where in ("pre", "sandwich"):
            h = self.norm(h, f"{scope}.norm", norm_name, scope)
        h = f(h, scope)
        if where == "branch":
            h = self.norm(h, f"{scope}.norm", norm_name, scope)
        if where == "sandwich":
            h = self.norm(h, f"{scope}.out_norm", f"{layer}.{sub}_out_norm", scope)
        h = self.dropout(h, f"{scope}.dropout", scope)
        x = g.add("add", [x, h], name=f"{scope}.residual", scope=scope)
        if where == "post":
            x = self.norm(x, f"{scope}.norm", norm_name, scope)
        return x

    def attention(self, x: str, kv_source: str, scope: str, causal: bool, rope: bool) -> str:
        att, d, g = self.spec.attention, self.spec.d_model, self.g
        h, kv, hd = att.heads, att.kv_heads, att.head_dim
        assert kv is not None and hd is not None  # resolved by the spec validator
        q = self.linear(x, scope, "q", d, h * hd, att.bias)  # (B, Tq, h*hd)
        k = self.linear(kv_source, scope, "k", d, kv * hd, att.bias)  # (B, Tk, kv*hd)
        v = self.linear(kv_source, scope, "v", d, kv * hd, att.bias)  # (B, Tk, kv*hd)
        if rope and self.spec.embedding.positions == "rope":
            theta = self.spec.embedding.rope_theta
            q = g.add("rope", [q], name=f"{scope}.q_rope", scope=scope,
                      heads=h, head_dim=hd, theta=theta)
            k = g.add("rope", [k], name=f"{scope}.k_rope", scope=scope,
                      heads=kv, head_dim=hd, theta=theta)
        a = g.add("attention", [q, k, v], name=f"{scope}.attention", scope=scope,
                  heads=h, kv_heads=kv, head_dim=hd, causal=causal,
                  normalize=att.normalize, kind="self" if rope else "cross")  # (B, Tq, h*hd)
        return self.linear(a, scope, "o", h * hd, d, att.bias)  # (B, Tq, d)

    def ffn(self, x: str, scope: str) -> str:
        ffn, d, g = self.spec.ffn, self.spec.d_model, self.g
        hidden = ffn.hidden
        assert hidden is not None
        act = ffn.activation
        if act in GATED_ACTIVATIONS:
            # swiglu = down(silu(gate(x)) * up(x)); geglu = down(gelu(gate(x)) * up(x))
            gate = self.linear(x, scope, "gate", d, hidden, ffn.bias)  # (B, L, hidden)
            up = self.linear(x, scope, "up", d, hidden, ffn.bias)  # (B, L, hidden)
            inner = "silu" if act == "swiglu" else "gelu"
            gate = g.add(inner, [gate], name=f"{scope}.act", scope=scope)
            h = g.add("mul", [gate, up], name=f"{scope}.gated", scope=scope)
        else:
            h = self.linear(x, scope, "up", d, hidden, ffn.bias)  # (B, L, hidden)
            h = g.add(act, [h], name=f"{scope}.act", scope=scope)
        return self.linear(h, scope, "down", hidden, d, ffn.bias)  # (B, L, d)

    def head(self, x: str, table: str) -> str:
        spec, g = self.spec, self.g
        vocab = spec.output_vocab
        w = table if spec.embedding.tie_output else self.param(
            "head.weight", (vocab, spec.d_model), "head", "normal")
        ins = [x, w]
        if spec.embedding.output_bias:
            ins.append(self.param("head.bias", (vocab,), "head", "zeros"))
        logits = g.add("linear", ins, name="logits", scope="head")  # (B, L, V)
        if spec.output == "probs":
            return g.add("softmax", [logits], name="probs", scope="head")
        return logits


def lower(spec: Spec) -> Graph:
    """Lower a validated spec to an op graph (shapes inferred as nodes are added)."""
    return _Lowering(spec).model()
