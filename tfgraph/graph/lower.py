"""Lowering: a validated ``Spec`` becomes an op ``Graph``.

Reads like a model file: embeddings, a stack of layers (self-attention, cross-attention in the
decoder of encoder-decoder models, feed-forward, each wrapped in the spec's residual/norm
placement), the final norm and the output head. Shapes in comments use B (batch), S (source
or only sequence), T (target sequence), d (d_model), h (heads), kv (kv_heads), hd (head_dim).

Lowering is the only reader of the ``Spec``. It takes the spec's *choices* (architecture, norm
kind and placement, activation, positions, biases, tying) from the spec and every *size* from a
``Sizes`` record, so the same code lowers a real graph (integer sizes) and the symbolic twins of
``tfgraph.passes.formulas`` (sizes that are sympy symbols). Every node gets its ``NodeMeta`` here, and
every module (the classes of generated code and the boxes of diagrams) is declared here, and
the graph's ``info`` (tfgraph.graph.ir.GraphInfo: architecture, kind, cache parts and layout, lengths
rule, description, the spec as text), all the back ends know of the spec.

One lowering makes the full-sequence, KV-cache and loss graphs: a KV-cache lowering holds a
``_Cache`` (its part, mask and position inputs, the presents it outputs), consulted in the
small methods of the "KV cache" section and in ``attend``; a full lowering holds None. A
cached decoder part's cross-attention reads ``CROSS_CACHE`` (the encoder part's keys/values)
where the full graph reads the encoder output.

Precondition: ``spec`` passed validation (derived defaults resolved).
Postcondition: the graph lints; parameter nodes carry exactly the names of the README's
parameter table; every node's ``meta.module`` is a declared module.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, TypeVar, overload

import sympy

from tfgraph.graph.ir import B, S, T, CacheLayout, Graph, GraphInfo, NodeMeta, SpecText
from tfgraph.graph.lengths import Lengths, default_seq
from tfgraph.errors import TfgraphError
from tfgraph.graph.ops import alibi_slopes
from tfgraph.graph.tensor import P
from tfgraph.graph.rope import rotary_attrs
from tfgraph.spec.schema import GATED_ACTIVATIONS, POSITION_KINDS, Spec, Vocabularies

Size = Any  # int in a real graph; a sympy expression in a symbolic twin
"""A size read by lowering."""


@dataclass(frozen=True)
class Sizes:
    """Every size lowering reads (the contract of the symbolic twins in ``tfgraph.passes.formulas``).

    Each field may be an ``int`` or a sympy expression, except ``layers``: a loop needs a
    number, so layer counts are always integers. Names are those of ``graph.sizes`` and of the
    parameters' ``dims`` ("heads*head_dim"), which generated code turns into constants.
    """

    d_model: Size
    """Width of the residual stream."""
    heads: Size
    """Query heads."""
    kv_heads: Size
    """Key/value heads (GQA when fewer than heads)."""
    head_dim: Size
    """Width of one head."""
    ffn_hidden: Size
    """Width of the feed-forward's hidden layer."""
    vocab: dict[str, Size]
    """Vocabulary per role: "source" (the only one of one-stack models) and "target"."""
    max_len: Size | None
    """Rows of the learned position tables (None without learned positions)."""
    layers: dict[str, int] = field(default_factory=dict)
    """Layers per stack ("encoder", "decoder")."""
    window: Size | None = None
    """Keys a sliding-window query reads (None without attention.window)."""
    experts: Size | None = None
    """Routed experts E of a mixture-of-experts feed-forward (None: dense)."""
    top_k: Size | None = None
    """Experts per token k."""
    expert_hidden: Size | None = None
    """Inner width of one routed expert."""
    shared_hidden: Size | None = None
    """Width of the shared-expert feed-forward (None without shared experts)."""
    dense_layers: int = 0
    """Leading layers with a dense feed-forward (a count, like layers)."""
    rotary_dim: Size | None = None
    """Channels of a head that rotary positions rotate, when fewer than head_dim
    (embedding.rotary_fraction); None: whole heads."""
    kv_rank: Size | None = None
    """Latent attention (attention.latent): width of the key/value latent (None: none)."""
    q_rank: Size | None = None
    """Latent attention: width of the query latent (None: queries projected from x)."""
    rope_dim: Size | None = None
    """Latent attention: rotary channels of a query head and of the shared rotary key."""
    v_head_dim: Size | None = None
    """Latent attention: width of a value head."""

    @classmethod
    def of(cls, spec: Spec) -> Sizes:
        att = spec.attention
        assert att.kv_heads is not None and att.head_dim is not None and spec.ffn.hidden
        return cls(
            d_model=spec.d_model, heads=att.heads, kv_heads=att.kv_heads, head_dim=att.head_dim,
            ffn_hidden=spec.ffn.hidden,
            vocab={"source": spec.vocab_size("source"), "target": spec.vocab_size("target")},
            max_len=spec.max_len if spec.embedding.positions == "learned" else None,
            layers={s: spec.layer_count(s) for s in spec.stacks}, window=att.window,
            experts=spec.ffn.experts, top_k=spec.ffn.top_k,
            expert_hidden=spec.ffn.expert_hidden, shared_hidden=spec.ffn.shared_hidden,
            dense_layers=spec.ffn.dense_layers or 0,
            rotary_dim=spec.rotary_dim if spec.embedding.positions == "rope"
            and spec.rotary_dim != att.head_dim and att.latent is None else None,
            **_latent_sizes(spec))

    def named(self, spec: Spec) -> dict[str, Size]:
        """The sizes by the names parameters' ``dims`` use (``graph.sizes``)."""
        out: dict[str, Size] = {"d_model": self.d_model, "heads": self.heads,
                                "kv_heads": self.kv_heads, "head_dim": self.head_dim,
                                "ffn_hidden": self.ffn_hidden}
        out.update({name: self.vocab[role] for role, name in _vocab_names(spec).items()})
        if self.max_len is not None:
            out["max_len"] = self.max_len
            if spec.embedding.position_offset:  # OPT, BART: the table has offset more rows
                out["position_rows"] = self.max_len + spec.embedding.position_offset
        if spec.embedding.token_types:  # rows of BERT's segment table (a count, not a symbol)
            out["token_types"] = spec.embedding.token_types
        if self.window is not None:
            out["window"] = self.window
        if spec.embedding.relative_buckets:  # rows of T5's bias table (a count)
            out["relative_buckets"] = spec.embedding.relative_buckets
        if self.kv_rank is not None:  # latent attention (README, attention.latent)
            out.update(kv_rank=self.kv_rank, qk_rope=self.rope_dim,
                       qk_nope=self.head_dim - self.rope_dim, v_head_dim=self.v_head_dim,
                       kv_a_width=self.kv_rank + self.rope_dim,
                       kv_b_width=self.head_dim - self.rope_dim + self.v_head_dim)
            if self.q_rank is not None:
                out["q_rank"] = self.q_rank
        if self.experts is not None:  # mixture of experts (README, ffn.experts)
            out.update(experts=self.experts, expert_hidden=self.expert_hidden)
            if self.shared_hidden is not None:
                out["shared_hidden"] = self.shared_hidden
        return out


def _latent_sizes(spec: Spec) -> dict[str, Size]:
    """The sizes of attention.latent (none without it)."""
    lat = spec.attention.latent
    if lat is None:
        return {}
    return dict(kv_rank=lat.kv_rank, q_rank=lat.q_rank, rope_dim=lat.rope_dim,
                v_head_dim=lat.v_head_dim)


def _vocab_names(spec: Spec) -> dict[str, str]:
    """Size name of each vocabulary role: one "vocab", or "source_vocab" and "target_vocab"."""
    if isinstance(spec.vocab, Vocabularies):
        return {"source": "source_vocab", "target": "target_vocab"}
    return {"source": "vocab", "target": "vocab"}


def _sqrt(n: Size) -> float | sympy.Expr:
    """sqrt(d_model) as a float, or symbolically in tfgraph.passes.formulas' symbolic twins."""
    return sympy.sqrt(n) if isinstance(n, sympy.Basic) else math.sqrt(n)


SUBLAYER_CLASSES = {"self_attn": ("SelfAttention", "Multi-head self-attention."),
                    "cross_attn": ("CrossAttention",
                                   "Multi-head attention from x to the encoder output."),
                    "ffn": ("FeedForward", "Position-wise feed-forward.")}
PLACEMENT_DOCS = {
    "post": "post-norm (Vaswani et al. 2017): x = norm(x + f(x))",
    "pre": "pre-norm (GPT-2): x = x + f(norm(x))",
    "branch": "branch norm (OLMo 2): x = x + norm(f(x))",
    "sandwich": "sandwich norm (Gemma 2): x = x + norm(f(norm(x)))",
}
PARALLEL_DOC = "parallel residual (GPT-J, GPT-NeoX): x = x + attn(norm(x)) + ffn(norm(x))"


@dataclass(frozen=True)
class CrossCache:
    """The memory a cached decoder part's cross-attention reads: not a node but the keys and
    values the encoder part computed once, ``past_key_values.{i}.encoder.key|value`` inputs
    (the typed stand-in for the encoder output in ``stack``/``layer``/``attention``)."""


CROSS_CACHE = CrossCache()
Memory = str | CrossCache | None
"""What a decoder layer's cross-attention reads: the encoder output's node, the encoder
part's cached keys/values, or nothing (no cross-attention)."""


@dataclass
class _Cache:
    """The KV-cache state of an inference graph (README, "KV cache"): which ``part`` it is
    (None a decoder's one graph, or an encoder-only model's masked graph, which has no past;
    "encoder" or "decoder" of an encoder-decoder's two), its
    mask and position inputs once made, and the present keys/values it outputs after the
    logits. A full-sequence lowering has none (``_Lowering.cache is None``)."""

    part: str | None
    mask: str | None = None
    """attention_mask: (B, P+S) int64 (the encoder part's (B, S)), 1 = real token."""
    position_ids: str | None = None
    """(B, S) int64; None when positions are relative (T5: distances only)."""
    encoder_mask: str | None = None
    """The decoder part's encoder_attention_mask (B, T)."""
    presents: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, spec: Spec, cache: bool, part: str | None, loss: bool) -> _Cache | None:
        """The cache of a lowering asked for ``cache``/``part``/``loss``, or None; refuses
        what has no KV-cache graph (TfgraphError)."""
        if loss and cache:
            raise TfgraphError(f"{spec.name}: a KV-cache graph is for inference; the loss "
                               "graph (loss=True) is the full-sequence one")
        if not cache:
            if part is not None:
                raise TfgraphError(f"{spec.name}: part={part!r} is for KV-cache graphs")
            return None
        if spec.arch == "encoder-decoder":
            if part not in ("encoder", "decoder"):
                raise TfgraphError(f"{spec.name}: an encoder-decoder's KV-cache graph is two "
                                   "graphs: part='encoder' or part='decoder'")
            if spec.attention.qk_norm != "none":
                raise TfgraphError(f"{spec.name}: no KV-cache graph for an encoder-decoder "
                                   "with qk_norm")
        elif part is not None:
            raise TfgraphError(f"{spec.name}: part applies to encoder-decoder models")
        return cls(part, past=spec.arch != "encoder-only")

    past: bool = True
    """False for an encoder-only model's masked graph: its one sequence, no past."""

    @property
    def keeps_past(self) -> bool:
        """Whether its self-attention reads past keys/values (not the encoder part's, nor
        an encoder-only model's masked graph)."""
        return self.past and self.part != "encoder"

    @property
    def infix(self) -> str:
        """The part in the names of past/present keys/values (".decoder" or "")."""
        return ".decoder" if self.part == "decoder" else ""


class _Lowering:
    def __init__(self, spec: Spec, sizes: Sizes, graph_type: type[Graph],
                 cache: bool = False, part: str | None = None, loss: bool = False) -> None:
        self.spec = spec
        # The training graph: a labels input and the cross-entropy node "loss" after the
        # logits (tfgraph.graph.ops_loss); "loss" is its only output.
        self.loss = loss
        # The inference graph (README, "KV cache"): attention_mask, position_ids and each
        # layer's past keys/values in, logits and the present keys/values out (an
        # encoder-only model's: attention_mask and position_ids only, its masked graph). An
        # encoder-decoder's is two graphs (``part``): the encoder, which also computes every
        # decoder layer's cross-attention keys/values once, and the decoder, which reads them.
        self.cache = _Cache.of(spec, cache, part, loss)
        self.z = sizes
        self.g = graph_type(spec.name, spec=spec, dtype=spec.dtype)
        self.g.sizes = sizes.named(spec)
        self.dtype = spec.dtype
        self.vocab_names = _vocab_names(spec)
        self.position_bias: str | None = None  # the current stack's T5 bias (relative_bias)
        self.token_type_ids: str | None = None  # the second input with embedding.token_types
        self._shapes: dict[tuple[str, ...], tuple[Size, ...]] = {}  # parameter shapes by dims

    # ---- small helpers ----------------------------------------------------------------

    def _param_shape(self, dims: tuple[str, ...]) -> tuple[Size, ...]:
        shape = tuple(sympy.Mul(*(self.g.sizes[n] for n in d.split("*"))) if d != "1" else 1
                      for d in dims)
        return tuple(int(d) if isinstance(d, sympy.Integer) else d for d in shape)

    def param(self, name: str, dims: tuple[str, ...], scope: str, init: str,
              meta: NodeMeta) -> str:
        """Parameter ``name`` with its shape written in named sizes (``"heads*head_dim"``)."""
        shape = self._shapes.get(dims)
        if shape is None:  # every layer has the same parameter shapes: built once each
            shape = self._shapes[dims] = self._param_shape(dims)
        owner = name.rsplit(".", 1)[0]  # the module a state_dict key belongs to
        meta = meta.but(module=owner)
        return self.g.param(name, shape, scope=scope, init=init, dtype=self.dtype, meta=meta,
                            dims=dims)

    def linear(self, x: str, scope: str, role: str, d_in: str, d_out: str, bias: bool,
               meta: NodeMeta) -> str:
        """``{scope}.{role}``: x (.., d_in) -> (.., d_out) with weight [d_out, d_in]."""
        ins = [x, self.param(f"{scope}.{role}.weight", (d_out, d_in), scope, "normal",
                             _role(meta, f"{role}.weight"))]
        if bias:
            ins.append(self.param(f"{scope}.{role}.bias", (d_out,), scope, "zeros",
                                  _role(meta, f"{role}.bias")))
        return self.g.add("linear", ins, name=f"{scope}.{role}", scope=scope,
                          meta=_role(meta, role))

    def norm(self, x: str, node_name: str, param_prefix: str, scope: str, meta: NodeMeta,
             role: str, width: str = "d_model", groups: Size = 1,
             eps: float | None = None) -> str:
        """A norm of the spec's kind with parameters ``{param_prefix}.weight`` (and ``.bias``)
        over the last dimension, named ``width``; with ``groups`` > 1 the last dimension is
        ``groups`` slices of ``width`` normalised each on its own with the same gains
        (per-head qk-norm); ``eps``: other than norm.eps (attention.latent.norm_eps)."""
        kind = self.spec.norm.kind
        offset = self.spec.norm.unit_offset  # Gemma: the gain is 1 + w, w stored from 0
        gain_init = "zeros" if offset else "ones"
        if not self.spec.norm.affine:  # OLMo 1: (x - mean) / sqrt(var + eps), no parameters
            ins = [x]
        elif kind == "scalenorm":
            ins = [x, self.param(f"{param_prefix}.weight", ("1",), scope, gain_init,
                                 _role(meta, f"{role}.weight"))]
        else:
            ins = [x, self.param(f"{param_prefix}.weight", (width,), scope, gain_init,
                                 _role(meta, f"{role}.weight"))]
            if kind == "layernorm" and self.spec.norm.bias:
                ins.append(self.param(f"{param_prefix}.bias", (width,), scope, "zeros",
                                      _role(meta, f"{role}.bias")))
        grouped = {} if isinstance(groups, int) and groups == 1 else {"heads": groups}
        offset_attr = {"unit_offset": True} if offset else {}  # absent when false
        eps = self.spec.norm.eps if eps is None else eps
        return self.g.add(kind, ins, name=node_name, scope=scope, eps=eps,
                          meta=_role(meta, role), **grouped, **offset_attr)

    def dropout(self, x: str, name: str, scope: str, meta: NodeMeta,
                p: float | None = None) -> str:
        """Dropout with ``p`` (default: the spec's ``dropout``); no node at 0, so a spec
        without dropout keeps (and counts) no mask there."""
        p = self.spec.dropout if p is None else p
        if p == 0:
            return x
        return self.g.add("dropout", [x], name=name, scope=scope, p=p,
                          meta=_role(meta, "dropout"))

    # ---- model ------------------------------------------------------------------------

    def model(self) -> Graph:
        spec, g = self.spec, self.g
        g.module("", "Model", f"{spec.name}: {spec.arch} Transformer.")
        table_meta = NodeMeta(part="embed")
        if self.cache is not None and spec.arch == "encoder-decoder":
            return self.cached_encoder_decoder(table_meta)
        if spec.arch == "encoder-decoder":
            src = g.input("src_ids", (B, S))  # (B, S) int64
            tgt = g.input("tgt_ids", (B, T))  # (B, T) int64
            if spec.embedding.share:
                src_table = tgt_table = self.param(
                    "embed.tokens.weight", (self.vocab_names["source"], "d_model"), "embed",
                    "normal", _role(table_meta, "tokens.weight"))
            else:
                src_table = self.param("embed.source_tokens.weight",
                                       (self.vocab_names["source"], "d_model"), "embed", "normal",
                                       _role(table_meta, "source_tokens.weight"))
                tgt_table = self.param("embed.target_tokens.weight",
                                       (self.vocab_names["target"], "d_model"), "embed", "normal",
                                       _role(table_meta, "target_tokens.weight"))
            memory = self.stack("encoder", src, src_table, causal=False, memory=None)
            x = self.stack("decoder", tgt, tgt_table, causal=True, memory=memory)
            out_table = tgt_table
        else:
            ids = g.input("input_ids", (B, S))  # (B, S) int64
            if spec.embedding.token_types:  # BERT's segments; all zeros when not given
                self.token_type_ids = g.input("token_type_ids", (B, S))  # (B, S) int64
            # attention_mask (B, P+S), an encoder's (B, S); position_ids (B, S)
            self._cache_inputs(S if spec.arch == "encoder-only" else P + S)
            table = self.param("embed.tokens.weight", (self.vocab_names["source"], "d_model"),
                               "embed", "normal", _role(table_meta, "tokens.weight"))
            stack = "decoder" if spec.arch == "decoder-only" else "encoder"
            x = self.stack(stack, ids, table, causal=stack == "decoder", memory=None)
            out_table = table
        out = self.head(x, out_table)
        g.set_output(self.cross_entropy(out) if self.loss else out)
        self._set_presents()
        return g

    def stack(self, stack: str, ids: str, table: str, causal: bool, memory: Memory) -> str:
        self.g.module(stack, stack.capitalize(),
                      f"Embedding scale and positions, the layers and the final norm of the "
                      f"{stack}.")
        x = self.embed(stack, ids, table)  # (B, L, d)
        self.position_bias = self.score_bias(stack, x, causal)  # (h, L, L) or None
        for i in range(self.z.layers[stack]):
            x = self.layer(stack, i, x, causal, memory)
        if self.spec.norm.final:
            meta = NodeMeta(part="norm", stack=stack, module=stack)
            x = self.norm(x, f"{stack}.norm", f"{stack}.norm", f"{stack}.norm", meta, "norm")
        return x

    def score_bias(self, stack: str, x: str, causal: bool) -> str | None:
        """The position bias of one stack, computed once and added to every self-attention
        of the stack: T5's table[bucket(j - i)] as (h, L, L), buckets bidirectional in an
        encoder; or ALiBi's slope_h * (j - i)."""
        emb = self.spec.embedding
        meta = NodeMeta(part="embed", stack=stack, module=stack)
        if emb.positions == "alibi":  # BLOOM, MPT, Falcon-RW: fixed slopes, no table
            heads = self.z.heads
            extra: dict[str, Any] = {"slopes": alibi_slopes(heads)} \
                if isinstance(heads, int) else {}
            if emb.alibi_scaled:  # Falcon-RW: the bias divided by sqrt(head_dim) as well
                extra |= {"scaled": True, "head_dim": self.z.head_dim}
            if emb.alibi_bfloat16:  # Falcon's build_alibi_tensor rounds to bfloat16
                extra["bfloat16"] = True
            keys = self._mask()  # KV cache: (h, L, P+L); per row (B, h, L, P+L) rounded
            return self.g.add("alibi", [x, *keys], name=f"{stack}.alibi", scope=stack,
                              heads=heads, meta=_role(meta, "alibi"), **extra)  # (h, L, L)
        if emb.positions != "relative":
            return None
        table = self.param(f"{stack}.relative_bias.weight", ("relative_buckets", "heads"),
                           stack, "normal", _role(meta, "relative_bias.weight"))
        keys = self._mask()  # KV cache: (h, L, P+L)
        return self.g.add("relative_bias", [table, x, *keys], name=f"{stack}.relative_bias",
                          scope=stack, buckets=emb.relative_buckets,
                          max_distance=emb.relative_max_distance, bidirectional=not causal,
                          meta=_role(meta, "relative_bias"))  # (h, L, L)

    def embed(self, stack: str, ids: str, table: str) -> str:
        spec, g, scope = self.spec, self.g, f"{stack}.embed"
        meta = NodeMeta(part="embed", stack=stack, module=stack)
        pad = {"padding_idx": spec.tokens.pad} if spec.embedding.pad_no_grad \
            and spec.tokens is not None and spec.tokens.pad is not None else {}
        x = g.add("embedding", [table, ids], name=f"{scope}.tokens", scope=scope,
                  meta=NodeMeta(part="embed", stack=stack, role="tokens", module=""),
                  **pad)  # (B, L, d)
        if spec.embedding.scale:
            x = g.add("scale", [x], name=f"{scope}.scale", scope=scope,
                      factor=_sqrt(self.z.d_model), meta=_role(meta, "scale"))
        if spec.embedding.multiplier is not None:  # Granite's embedding_multiplier
            x = g.add("scale", [x], name=f"{scope}.multiplier", scope=scope,
                      factor=spec.embedding.multiplier, meta=_role(meta, "multiplier"))
        if self.token_type_ids is not None:  # BERT: tokens + segments, then positions
            types = self.param("embed.token_types.weight", ("token_types", "d_model"), "embed",
                               "normal", _role(NodeMeta(part="embed"), "token_types.weight"))
            t = g.add("embedding", [types, self.token_type_ids], name=f"{scope}.token_types",
                      scope=scope, meta=NodeMeta(part="embed", stack=stack, role="token_types",
                                                 module=""))  # (B, L, d)
            x = g.add("add", [x, t], name=f"{scope}.add_token_types", scope=scope,
                      meta=_role(meta, "add_token_types"))
        emb = spec.embedding
        if emb.positions == "sinusoidal":
            layout = {} if emb.sinusoid_layout == "interleaved" else {"layout": emb.sinusoid_layout}
            x = g.add("positions_sinusoidal", [x, *self._ids()], name=f"{scope}.positions",
                      scope=scope, meta=_role(meta, "positions"), **layout)
        elif emb.positions == "learned":
            offset = emb.position_offset  # OPT, BART: position p reads row p + 2
            rows = "position_rows" if offset else "max_len"
            pos = self.param(f"{stack}.positions.weight", (rows, "d_model"), scope,
                             "normal", _role(meta, "positions.weight"))
            ids_at = self._ids()
            if emb.position_pad_id is not None:  # RoBERTa: positions skip the padding
                ids_at = [g.add("pad_position_ids", [ids], name=f"{scope}.position_ids",
                                scope=scope, pad=emb.position_pad_id,
                                meta=_role(meta, "position_ids"))]  # (B, L) int64
            x = g.add("positions_learned", [x, pos, *ids_at], name=f"{scope}.positions",
                      scope=scope,
                      meta=_role(meta, "positions"), **({"offset": offset} if offset else {}))
        if emb.norm:  # BERT, BART, BLOOM: a norm on the summed embeddings
            x = self.norm(x, f"{scope}.norm", f"{stack}.embed_norm", scope, meta, "norm")
        return self.dropout(x, f"{scope}.dropout", scope, meta, spec.embedding_dropout)

    def layer(self, stack: str, i: int, x: str, causal: bool, memory: Memory) -> str:
        path = f"{stack}.layers.{i}"
        parallel = self.spec.block.residual == "parallel"
        position = self.spec.norm.position
        wiring = PLACEMENT_DOCS[position]
        if parallel:
            wiring = PARALLEL_DOC if position == "pre" else f"parallel residual, each {wiring}"
        self.g.module(path, f"{stack.capitalize()}Layer", f"One {stack} layer, {wiring}.")
        meta = NodeMeta(part="layer", stack=stack, layer=i, module=path)
        attend: Callable[[str, str, NodeMeta], str] = \
            lambda h, s, m: self.attention(h, h, s, m, causal=causal, rope=True)  # noqa: E731
        if parallel:  # the spec allows it only without cross-attention
            shared = self.spec.block.shared_norm  # one pre-norm for both (GPT-J, Falcon)
            n = self.norm(x, f"{path}.norm", f"{path}.norm", path, meta, "norm") if shared \
                else None
            h = self.residual(x, meta, "self_attn", attend, add=False, normed=n)
            f = self.residual(x, meta, "ffn", self.ffn, add=False, normed=n)
            y = self.g.add("add", [h, f], name=f"{path}.branches", scope=path,
                           meta=_role(meta, "branches"))  # attn + ffn
            return self.g.add("add", [x, y], name=f"{path}.residual", scope=path,
                              meta=_role(meta, "residual"))
        x = self.residual(x, meta, "self_attn", attend)
        if memory is not None:
            x = self.residual(x, meta, "cross_attn",
                              lambda h, s, m: self.attention(h, memory, s, m, causal=False,
                                                             rope=False))
        return self.residual(x, meta, "ffn", self.ffn)

    def residual(self, x: str, layer: NodeMeta, sub: str,
                 f: Callable[[str, str, NodeMeta], str], add: bool = True,
                 normed: str | None = None) -> str:
        """One sublayer f with the spec's norm placement (README, ``norm.position``):
        post norm(x + f(x)); pre x + f(norm(x)); branch x + norm(f(x));
        sandwich x + norm(f(norm(x))). Dropout goes on f's output before the add. With
        ``add`` false the branch is returned before the add (a parallel residual sums the
        branches first); ``normed`` is x already normalised by a norm the branches share,
        which replaces the sublayer's own pre-norm."""
        where, g = self.spec.norm.position, self.g
        path = f"{layer.module}.{sub}"
        scope = path
        cls, doc = SUBLAYER_CLASSES[sub]
        g.module(path, cls, doc)
        wrap = replace(layer, sublayer=sub, role="")
        inner = replace(wrap, module=path)
        norm_name = f"{layer.module}.{sub}_norm"
        h = x if normed is None else normed
        skipped = self.spec.norm.skip_first and sub == "self_attn" and layer.layer == 0
        if where in ("pre", "sandwich") and normed is None and not skipped:  # ModernBERT skips
            h = self.norm(h, f"{scope}.norm", norm_name, scope, wrap, "norm")
        h = f(h, scope, inner)
        if where == "branch":
            h = self.norm(h, f"{scope}.norm", norm_name, scope, wrap, "norm")
        if where == "sandwich":
            h = self.norm(h, f"{scope}.out_norm", f"{layer.module}.{sub}_out_norm", scope, wrap,
                          "out_norm")
        h = self.dropout(h, f"{scope}.dropout", scope, wrap)
        if self.spec.block.residual_scale is not None:  # Granite: x + s * f(x)
            h = g.add("scale", [h], name=f"{scope}.residual_scale", scope=scope,
                      factor=self.spec.block.residual_scale, meta=_role(wrap, "residual_scale"))
        if not add:
            return h
        x = g.add("add", [x, h], name=f"{scope}.residual", scope=scope,
                  meta=_role(wrap, "residual"))
        if where == "post":
            x = self.norm(x, f"{scope}.norm", norm_name, scope, wrap, "norm")
        return x

    def attention(self, x: str, kv_source: str | CrossCache, scope: str, meta: NodeMeta,
                  causal: bool, rope: bool) -> str:
        """Multi-head attention of x over ``kv_source`` (x itself for self-attention, the
        encoder output, or the encoder part's cached keys/values): projections, q/k norms,
        rotary positions (self-attention, ``rope``), the attention op, the output
        projection."""
        if isinstance(kv_source, CrossCache):  # the decoder part's cross-attention
            return self.cached_cross_attention(x, scope, meta)
        if self.spec.attention.latent is not None:  # decoder-only self-attention
            return self.latent_attention(x, scope, meta, causal)
        q, k, v = self.projections(x, kv_source, scope, meta)
        local = rope and self.spec.layer_is_local(meta.layer or 0)  # self-attention only
        emb = self.spec.embedding
        if rope and emb.positions == "rope" and (local or emb.rope_global):  # Cohere2: NoPE
            q, k = self.rotary(q, k, scope, meta, local)  # on global layers
        a = self.attend(q, k, v, scope, meta, causal, rope, self.attention_attrs(local))
        return self.linear(a, scope, "o", "heads*head_dim", "d_model",
                           bool(self.spec.attention.out_bias), meta)  # (B, Tq, d)

    def projections(self, x: str, kv_source: str, scope: str, meta: NodeMeta
                    ) -> tuple[str, str, str]:
        """q (B, Tq, h*hd) from x, k and v (B, Tk, kv*hd) from ``kv_source``, with the
        spec's q/k norms (over the whole projection, or per head)."""
        att, z = self.spec.attention, self.z
        qkv_bias = bool(att.qkv_bias)  # derived from bias by the spec when not given
        q = self.linear(x, scope, "q", "d_model", "heads*head_dim", qkv_bias,
                        meta)  # (B, Tq, h*hd)
        k = self.linear(kv_source, scope, "k", "d_model", "kv_heads*head_dim", qkv_bias,
                        meta)  # (B, Tk, kv*hd)
        v = self.linear(kv_source, scope, "v", "d_model", "kv_heads*head_dim", qkv_bias,
                        meta)  # (B, Tk, kv*hd)
        if att.clip_qkv is not None:  # MPT, OLMo 1: clamp before norms and rotary positions
            q, k, v = (self.g.add("clip", [t], name=f"{scope}.{r}_clip", scope=scope,
                                  bound=att.clip_qkv, meta=_role(meta, f"{r}_clip"))
                       for r, t in (("q", q), ("k", k), ("v", v)))
        if att.qk_norm == "full":  # over the whole projection, before rotary positions
            q = self.norm(q, f"{scope}.q_norm", f"{scope}.q_norm", scope, meta, "q_norm",
                          width="heads*head_dim")
            k = self.norm(k, f"{scope}.k_norm", f"{scope}.k_norm", scope, meta, "k_norm",
                          width="kv_heads*head_dim")
        elif att.qk_norm == "head":  # each head's channels, one gain shared by the heads
            q = self.norm(q, f"{scope}.q_norm", f"{scope}.q_norm", scope, meta, "q_norm",
                          width="head_dim", groups=z.heads)
            k = self.norm(k, f"{scope}.k_norm", f"{scope}.k_norm", scope, meta, "k_norm",
                          width="head_dim", groups=z.kv_heads)
        return q, k, v

    def latent_attention(self, x: str, scope: str, meta: NodeMeta, causal: bool) -> str:
        """Multi-head latent attention (attention.latent; DeepSeek-V2 §2.1, transformers'
        DeepseekV3Attention): queries from x or through their latent (q_a, q_a_norm, q_b),
        kv_a's output split into the latent (normalised by kv_a_norm) and the shared rotary
        key; kv_b expands the latent into each head's key and value channels; each head's key
        is its own channels then the rotary key. A KV-cache graph caches the latent
        (``past_key_values.{i}.key``, (B, 1, P, kv_rank)) and the rotary key (``.value``,
        (B, 1, P, rope_dim)), as transformers does, and expands every position again."""
        g, z, att = self.g, self.z, self.spec.attention
        h, hd, rd, vd, rkv = z.heads, z.head_dim, z.rope_dim, z.v_head_dim, z.kv_rank
        assert rd is not None and vd is not None and rkv is not None  # Sizes.of(latent spec)
        nope = hd - rd
        assert att.latent is not None
        latent_eps = att.latent.norm_eps
        if z.q_rank is not None:
            q = self.linear(x, scope, "q_a", "d_model", "q_rank", False, meta)  # (B, S, rq)
            q = self.norm(q, f"{scope}.q_a_norm", f"{scope}.q_a_norm", scope, meta,
                          "q_a_norm", width="q_rank", eps=latent_eps)
            q = self.linear(q, scope, "q_b", "q_rank", "heads*head_dim", False, meta)
        else:
            q = self.linear(x, scope, "q", "d_model", "heads*head_dim", False, meta)
        q_nope = self.slice(q, scope, meta, "q_nope", h, hd, 0, nope)  # (B, S, h*nope)
        q_rot = self.slice(q, scope, meta, "q_rot", h, hd, nope, rd)  # (B, S, h*rd)
        kv_a = self.linear(x, scope, "kv_a", "d_model", "kv_a_width", False,
                           meta)  # (B, S, rkv + rd)
        latent = self.slice(kv_a, scope, meta, "latent", 1, rkv + rd, 0, rkv)
        latent = self.norm(latent, f"{scope}.kv_a_norm", f"{scope}.kv_a_norm", scope, meta,
                           "kv_a_norm", width="kv_rank", eps=latent_eps)  # (B, S, rkv)
        k_rot = self.slice(kv_a, scope, meta, "k_rot", 1, rkv + rd, rkv, rd)
        rot = rotary_attrs(self.spec, self.spec.embedding.rope_theta, None)
        q_rot = g.add("rope", [q_rot, *self._ids()], name=f"{scope}.q_rope", scope=scope,
                      heads=h, head_dim=rd, theta=self.spec.embedding.rope_theta,
                      meta=_role(meta, "q_rope"), **rot)
        k_rot = g.add("rope", [k_rot, *self._ids()], name=f"{scope}.k_rope", scope=scope,
                      heads=1, head_dim=rd, theta=self.spec.embedding.rope_theta,
                      meta=_role(meta, "k_rope"), **rot)  # (B, S, rd)
        q = g.add("head_concat", [q_nope, q_rot], name=f"{scope}.q_heads", scope=scope,
                  heads=h, a_width=nope, b_width=rd, meta=_role(meta, "q_heads"))
        if self.cache is not None:  # the cached latent and rotary key, every position
            latent, k_rot = self.latent_cache(latent, k_rot, scope, meta)  # (B, P+S, ..)
        kv = self.linear(latent, scope, "kv_b", "kv_rank", "heads*kv_b_width", False,
                         meta)  # (B, T, h*(nope + vd))
        k_nope = self.slice(kv, scope, meta, "k_nope", h, nope + vd, 0, nope)
        v = self.slice(kv, scope, meta, "v_heads", h, nope + vd, nope, vd)  # (B, T, h*vd)
        k = g.add("head_concat", [k_nope, k_rot], name=f"{scope}.k_heads", scope=scope,
                  heads=h, a_width=nope, b_width=rd, shared=True,
                  meta=_role(meta, "k_heads"))  # (B, T, h*hd)
        extra = self.attention_attrs(local=False)
        extra.update(v_head_dim=vd, latent=rkv + rd)
        if self.cache is not None:
            assert self.cache.mask is not None
            k, v = (g.add("kv_concat", [t], name=f"{scope}.{part}_expanded", scope=scope,
                          kv_heads=h, head_dim=width, meta=_role(meta, f"{part}_expanded"))
                    for t, part, width in ((k, "key", hd), (v, "value", vd)))
            a = g.add("attention_cached", [q, k, v, self.cache.mask],
                      name=f"{scope}.attention", scope=scope, heads=h, kv_heads=h, head_dim=hd,
                      causal=causal, normalize=att.normalize, meta=_role(meta, "attention"),
                      **extra)  # (B, S, h*vd)
        else:
            a = g.add("attention", [q, k, v], name=f"{scope}.attention", scope=scope,
                      heads=h, kv_heads=h, head_dim=hd, causal=causal,
                      normalize=att.normalize, kind="self", meta=_role(meta, "attention"),
                      **extra)  # (B, S, h*vd)
        return self.linear(a, scope, "o", "heads*v_head_dim", "d_model", bool(att.out_bias),
                           meta)  # (B, S, d)

    def slice(self, x: str, scope: str, meta: NodeMeta, role: str, groups: Size, width: Size,
              start: Size, take: Size) -> str:
        """Channels start .. start + take of each of ``groups`` slices of ``width``."""
        return self.g.add("head_slice", [x], name=f"{scope}.{role}", scope=scope,
                          groups=groups, width=width, start=start, take=take,
                          meta=_role(meta, role))

    def latent_cache(self, latent: str, k_rot: str, scope: str, meta: NodeMeta
                     ) -> tuple[str, str]:
        """The present latent and rotary key of a KV-cache graph: the layer's past ones
        (``past_key_values.{i}.key`` (B, 1, P, kv_rank) and ``.value`` (B, 1, P, rope_dim))
        followed by this step's, as rows (B, P+S, ..)."""
        g, z, i, cache = self.g, self.z, meta.layer or 0, self.cache
        assert cache is not None
        rows = []
        for part, new, width in (("key", latent, z.kv_rank), ("value", k_rot, z.rope_dim)):
            past = g.input(f"past_key_values.{i}.{part}", (B, 1, P, width), dtype=self.dtype)
            present = g.add("kv_concat", [past, new], name=f"present.{i}.{part}", scope=scope,
                            kv_heads=1, head_dim=width, meta=_role(meta, f"present_{part}"))
            cache.presents.append(present)  # (B, 1, P+S, width)
            rows.append(g.add("cache_rows", [present], name=f"{scope}.{part}_rows", scope=scope,
                              meta=_role(meta, f"{part}_rows")))  # (B, P+S, width)
        return rows[0], rows[1]

    def rotary(self, q: str, k: str, scope: str, meta: NodeMeta, local: bool
               ) -> tuple[str, str]:
        """Rotary positions on q and k: partial, interleaved and scaled rotation
        (tfgraph.graph.rope); Gemma 3's local layers with their own base are not scaled."""
        g, z, emb = self.g, self.z, self.spec.embedding
        theta, own_base = emb.rope_theta, False
        if local and emb.local_rope_theta is not None:  # Gemma 3's local layers
            theta, own_base = emb.local_rope_theta, True
        rot = rotary_attrs(self.spec, theta, z.rotary_dim, scaled=not own_base)
        q = g.add("rope", [q, *self._ids()], name=f"{scope}.q_rope", scope=scope,
                  heads=z.heads, head_dim=z.head_dim, theta=theta, meta=_role(meta, "q_rope"),
                  **rot)
        k = g.add("rope", [k, *self._ids()], name=f"{scope}.k_rope", scope=scope,
                  heads=z.kv_heads, head_dim=z.head_dim, theta=theta,
                  meta=_role(meta, "k_rope"), **rot)
        return q, k

    def attention_attrs(self, local: bool, window: bool = True) -> dict[str, Any]:
        """The attention op's attributes only specs that use them carry: the sliding window
        (a local layer's; None elsewhere), the score scale and the soft-cap."""
        att, extra = self.spec.attention, {}
        if att.window is not None and window:
            extra["window"] = self.z.window if local else None
        if att.scale is not None:
            extra["scale"] = att.scale
        if att.softcap is not None:
            extra["softcap"] = att.softcap
        return extra

    def attend(self, q: str, k: str, v: str, scope: str, meta: NodeMeta, causal: bool,
               self_attn: bool, extra: dict[str, Any]) -> str:
        """The attention op (B, Tq, h*hd): over this sequence's keys/values, or in a KV-cache
        graph over the past ones too (``cached_attention``); T5's position bias on
        self-attention."""
        bias = [self.position_bias] if self_attn and self.position_bias else []  # T5
        if self.cache is not None:
            return self.cached_attention(q, k, v, scope, meta, causal, extra, bias)
        z = self.z
        return self.g.add("attention", [q, k, v, *bias], name=f"{scope}.attention",
                          scope=scope, heads=z.heads, kv_heads=z.kv_heads, head_dim=z.head_dim,
                          causal=causal, normalize=self.spec.attention.normalize,
                          kind="self" if self_attn else "cross", meta=_role(meta, "attention"),
                          **extra, **self.attention_dropout())  # (B, Tq, h*hd)

    def attention_dropout(self) -> dict[str, Any]:
        """``dropout`` p of the attention op when attention.dropout > 0 (only then, so graphs
        without it stay as they were). On the KV-cache graph's ``attention_cached`` too: the
        torch back end runs that graph for masked training calls (an attention_mask or
        position_ids), which must drop out what the full-sequence graph drops; it is the
        identity at inference (ONNX reads no dropout), and no cost is counted for it there
        (a KV-cache graph is costed for inference only)."""
        p = self.spec.attention.dropout
        return {"dropout": p} if p > 0 else {}

    # ---- KV cache (README, "KV cache"): every consultation of ``self.cache`` ----------------

    def _cache_inputs(self, mask_length: Any) -> None:
        """attention_mask (B, mask_length) and position_ids (B, S) of a KV-cache graph, made
        once, right after its ids (nothing for a full-sequence graph)."""
        if self.cache is None:
            return
        self.cache.mask = self.g.input("attention_mask", (B, mask_length))  # 1 = real token
        if self._reads_position_ids():
            self.cache.position_ids = self.g.input("position_ids", (B, S))  # (B, S) int64

    def _reads_position_ids(self) -> bool:
        """Whether some op reads position ids: learned / sinusoidal embeddings, rotary
        positions on some layer. With rope_global false only the sliding-window layers rotate
        (Cohere2's NoPE global layers, ``attention`` above); with no such layer nothing does,
        and an unread input would be an unused node."""
        spec = self.spec
        emb = spec.embedding
        if not POSITION_KINDS[emb.positions].position_ids:
            return False
        if emb.position_pad_id is not None:  # RoBERTa: counted over input_ids (embed)
            return False
        if emb.positions != "rope" or emb.rope_global or spec.attention.latent is not None:
            return True  # latent attention rotates its rope channels on every layer
        return any(spec.layer_is_local(i) for stack in spec.stacks
                   for i in range(spec.layer_count(stack)))

    def _mask(self) -> list[str]:
        """The attention_mask operand of a position bias (T5's, ALiBi's) in a KV-cache graph
        (none otherwise)."""
        return [self.cache.mask] if self.cache is not None and self.cache.mask else []

    def _ids(self) -> list[str]:
        """The position ids operand of position ops in a KV-cache graph (none otherwise)."""
        cache = self.cache
        return [cache.position_ids] if cache is not None and cache.position_ids else []

    def _set_presents(self) -> None:
        """The present keys/values, outputs after the logits (the optimum / genai order)."""
        for present in self.cache.presents if self.cache is not None else ():
            self.g.set_output(present)

    def cached_encoder_decoder(self, table_meta: NodeMeta) -> Graph:
        """The encoder part: src_ids, attention_mask, position_ids in; the encoder output (the
        node ending the stack; its ONNX model names it ``last_hidden_state``,
        exporters/onnx/graph.output_names) and each decoder layer's cross-attention
        keys/values (``present.{i}.encoder.key|value``) out. The decoder part: input_ids,
        attention_mask, position_ids, encoder_attention_mask and per layer
        ``past_key_values.{i}.decoder.*`` then ``.encoder.*`` in; logits and
        ``present.{i}.decoder.*`` out (optimum's names)."""
        spec, g, z = self.spec, self.g, self.z
        assert self.cache is not None
        shared = spec.embedding.share
        if self.cache.part == "encoder":
            src = g.input("src_ids", (B, S))  # (B, S) int64
            self._cache_inputs(S)  # attention_mask (B, S), position_ids (B, S)
            name = "embed.tokens.weight" if shared else "embed.source_tokens.weight"
            table = self.param(name, (self.vocab_names["source"], "d_model"), "embed", "normal",
                               _role(table_meta, name.split(".", 1)[1]))
            memory = self.stack("encoder", src, table, causal=False, memory=None)
            g.set_output(memory)
            g.module("decoder", "Decoder", "The decoder's layers, as far as they read the "
                     "encoder: each one's cross-attention keys and values.")
            for i in range(z.layers["decoder"]):
                scope = f"decoder.layers.{i}.cross_attn"
                g.module(f"decoder.layers.{i}", "DecoderLayer",
                         "One decoder layer's cross-attention keys and values.")
                g.module(scope, "CrossAttentionKeysValues",
                         "Keys and values of the encoder output, computed once.")
                meta = NodeMeta(part="layer", stack="decoder", layer=i, module=scope,
                                sublayer="cross_attn")
                for role, part in (("k", "key"), ("v", "value")):
                    kv = self.linear(memory, scope, role, "d_model", "kv_heads*head_dim",
                                     bool(spec.attention.qkv_bias), meta)  # (B, S, kv*hd)
                    g.set_output(g.add("kv_concat", [kv], name=f"present.{i}.encoder.{part}",
                                       scope=scope, kv_heads=z.kv_heads, head_dim=z.head_dim,
                                       meta=_role(meta, f"present_{part}")))  # (B, kv, S, hd)
            return g
        ids = g.input("input_ids", (B, S))  # (B, S) int64: this step's target tokens
        self._cache_inputs(P + S)
        self.cache.encoder_mask = g.input("encoder_attention_mask", (B, T))  # source mask
        name = "embed.tokens.weight" if shared else "embed.target_tokens.weight"
        table = self.param(name, (self.vocab_names["target"], "d_model"), "embed", "normal",
                           _role(table_meta, name.split(".", 1)[1]))
        x = self.stack("decoder", ids, table, causal=True, memory=CROSS_CACHE)
        g.set_output(self.head(x, table))
        self._set_presents()
        return g

    def cached_cross_attention(self, x: str, scope: str, meta: NodeMeta) -> str:
        """Cross-attention of the decoder part: keys/values the encoder part computed
        (``past_key_values.{i}.encoder.key|value`` inputs), masked by the source mask."""
        att, g, z, i = self.spec.attention, self.g, self.z, meta.layer or 0
        assert self.cache is not None and self.cache.encoder_mask is not None
        extra = self.attention_attrs(local=False, window=False)
        q = self.linear(x, scope, "q", "d_model", "heads*head_dim", bool(att.qkv_bias),
                        meta)  # (B, S, h*hd)
        k, v = (g.input(f"past_key_values.{i}.encoder.{part}", (B, z.kv_heads, T, z.head_dim),
                        dtype=self.dtype) for part in ("key", "value"))  # (B, kv, T, hd)
        a = g.add("attention_cached", [q, k, v, self.cache.encoder_mask],
                  name=f"{scope}.attention",
                  scope=scope, heads=z.heads, kv_heads=z.kv_heads, head_dim=z.head_dim,
                  causal=False, normalize=att.normalize, self_read=False,
                  meta=_role(meta, "attention"), **extra,
                  **self.attention_dropout())  # (B, S, h*hd)
        return self.linear(a, scope, "o", "heads*head_dim", "d_model", bool(att.out_bias),
                           meta)  # (B, S, d)

    def cached_attention(self, q: str, k: str, v: str, scope: str, meta: NodeMeta,
                         causal: bool, extra: dict[str, Any], bias: list[str]) -> str:
        """Self-attention over the past keys/values and this step's: the layer's
        ``past_key_values.{i}.key|value`` inputs, ``present.{i}.key|value`` outputs."""
        g, z, i, cache = self.g, self.z, meta.layer or 0, self.cache
        assert cache is not None and cache.mask is not None
        if not cache.keeps_past:  # the encoder part: this sequence's keys/values, per head
            present = [g.add("kv_concat", [new], name=f"{scope}.{part}_heads", scope=scope,
                             kv_heads=z.kv_heads, head_dim=z.head_dim,
                             meta=_role(meta, f"{part}_heads"))  # (B, kv, S, hd)
                       for part, new in (("key", k), ("value", v))]
        else:
            present = []
            for part, new in (("key", k), ("value", v)):
                past = g.input(f"past_key_values.{i}{cache.infix}.{part}",
                               (B, z.kv_heads, P, z.head_dim), dtype=self.dtype)  # (B,kv,P,hd)
                present.append(g.add("kv_concat", [past, new],
                                     name=f"present.{i}{cache.infix}.{part}", scope=scope,
                                     kv_heads=z.kv_heads, head_dim=z.head_dim,
                                     meta=_role(meta, f"present_{part}")))  # (B,kv,P+S,hd)
            cache.presents += present
        return g.add("attention_cached", [q, *present, cache.mask, *bias],
                     name=f"{scope}.attention",
                     scope=scope, heads=z.heads, kv_heads=z.kv_heads, head_dim=z.head_dim,
                     causal=causal, normalize=self.spec.attention.normalize,
                     meta=_role(meta, "attention"), **extra,
                     **self.attention_dropout())  # (B, S, h*hd)

    def ffn(self, x: str, scope: str, meta: NodeMeta) -> str:
        ffn, g = self.spec.ffn, self.g
        if ffn.experts is not None and (meta.layer or 0) >= self.z.dense_layers:
            return self.moe(x, scope, meta)
        act = ffn.activation
        if act in GATED_ACTIVATIONS:
            # swiglu = down(silu(gate(x)) * up(x)); geglu(_tanh) = down(gelu(gate(x)) * up(x))
            gate = self.linear(x, scope, "gate", "d_model", "ffn_hidden", ffn.bias,
                               meta)  # (B, L, hidden)
            up = self.linear(x, scope, "up", "d_model", "ffn_hidden", ffn.bias,
                             meta)  # (B, L, hidden)
            gate = g.add(_inner_activation(act), [gate], name=f"{scope}.act", scope=scope, meta=_role(meta, "act"))
            h = g.add("mul", [gate, up], name=f"{scope}.gated", scope=scope,
                      meta=_role(meta, "gated"))
        else:
            h = self.linear(x, scope, "up", "d_model", "ffn_hidden", ffn.bias,
                            meta)  # (B, L, hidden)
            h = g.add(act, [h], name=f"{scope}.act", scope=scope, meta=_role(meta, "act"))
        return self.linear(h, scope, "down", "ffn_hidden", "d_model", ffn.bias, meta)  # (B, L, d)

    def moe(self, x: str, scope: str, meta: NodeMeta) -> str:
        """A mixture-of-experts feed-forward (README, ``ffn.experts``): router logits, the
        routing weights of the top-k experts (zero elsewhere), the routed experts, and the
        shared experts every token goes through, optionally scaled by a sigmoid gate."""
        ffn, g, z = self.spec.ffn, self.g, self.z
        logits = self.linear(x, scope, "router", "d_model", "experts", False,
                             meta)  # (B, L, E)
        ins = [logits]
        if str(ffn.router).startswith("sigmoid"):  # DeepSeek-V3's e_score_correction_bias
            ins.append(self.param(f"{scope}.router.correction_bias", ("experts",), scope,
                                  "zeros", _role(meta, "router.correction_bias")))
        grouping: dict[str, Any] = {}  # absent when routing is not group-limited or scaled
        if ffn.router == "sparsemixer":
            grouping["eps"] = ffn.router_eps
        if ffn.router_groups and ffn.router_groups > 1:
            grouping.update(groups=ffn.router_groups, top_groups=ffn.router_top_groups)
        if ffn.router_scale is not None and ffn.router_scale != 1.0:
            grouping["scale"] = ffn.router_scale
        weights = g.add("route", ins, name=f"{scope}.route", scope=scope, top_k=z.top_k,
                        router=ffn.router, meta=_role(meta, "route"), **grouping)  # (B, L, E)
        gated = ffn.activation in GATED_ACTIVATIONS
        ins = [x, weights]
        shapes = {"gate": ("experts", "expert_hidden", "d_model"),
                  "up": ("experts", "expert_hidden", "d_model"),
                  "down": ("experts", "d_model", "expert_hidden")}
        for role in ("gate", "up", "down") if gated else ("up", "down"):
            ins.append(self.param(f"{scope}.experts.{role}.weight", shapes[role], scope,
                                  "normal", _role(meta, f"experts.{role}.weight")))
        y = g.add("experts", ins, name=f"{scope}.experts", scope=scope, top_k=z.top_k,
                  activation=_inner_activation(ffn.activation), gated=gated,
                  meta=_role(meta, "experts"))  # (B, L, d)
        if not ffn.shared_experts:
            return y
        shared = self.shared_mlp(x, scope, meta)  # (B, L, d)
        if ffn.shared_gate:  # Qwen2-MoE: sigmoid(x w) * shared(x), w (1, d)
            gate = self.linear(x, scope, "shared_gate", "d_model", "1", False,
                               meta)  # (B, L, 1)
            shared = g.add("sigmoid_gate", [gate, shared], name=f"{scope}.shared_gated",
                           scope=scope, meta=_role(meta, "shared_gated"))
        return g.add("add", [y, shared], name=f"{scope}.routed_plus_shared", scope=scope,
                     meta=_role(meta, "routed_plus_shared"))

    def shared_mlp(self, x: str, scope: str, meta: NodeMeta) -> str:
        """The shared experts as one feed-forward of width shared_hidden (DeepSeek runs its
        shared experts as one MLP of moe_intermediate_size * n_shared_experts), no biases."""
        act, g = self.spec.ffn.activation, self.g
        if act in GATED_ACTIVATIONS:
            gate = self.linear(x, scope, "shared.gate", "d_model", "shared_hidden", False, meta)
            up = self.linear(x, scope, "shared.up", "d_model", "shared_hidden", False, meta)
            gate = g.add(_inner_activation(act), [gate], name=f"{scope}.shared.act",
                         scope=scope, meta=_role(meta, "shared.act"))
            h = g.add("mul", [gate, up], name=f"{scope}.shared.gated", scope=scope,
                      meta=_role(meta, "shared.gated"))
        else:
            h = self.linear(x, scope, "shared.up", "d_model", "shared_hidden", False, meta)
            h = g.add(act, [h], name=f"{scope}.shared.act", scope=scope,
                      meta=_role(meta, "shared.act"))
        return self.linear(h, scope, "shared.down", "shared_hidden", "d_model", False, meta)

    def head(self, x: str, table: str) -> str:
        spec, g = self.spec, self.g
        vocab = self.vocab_names["target" if spec.arch == "encoder-decoder" else "source"]
        meta = NodeMeta(part="head", module="")
        if spec.head.scale is not None:  # T5's tied head reads x * d_model^-0.5
            x = g.add("scale", [x], name="head.scale", scope="head", factor=spec.head.scale,
                      meta=_role(meta, "scale"))
        w = table if spec.embedding.tie_output else self.param(
            "head.weight", (vocab, "d_model"), "head", "normal", _role(meta, "weight"))
        ins = [x, w]
        if spec.embedding.output_bias:
            ins.append(self.param("head.bias", (vocab,), "head", "zeros", _role(meta, "bias")))
        if spec.head.transform:  # BERT's masked-LM head: dense, hidden_act, norm
            x = self.linear(x, "head", "transform", "d_model", "d_model",
                            spec.head.transform_bias, meta)
            x = g.add(_inner_activation(spec.ffn.activation), [x], name="head.act",
                      scope="head", meta=_role(meta, "act"))
            ins[0] = self.norm(x, "head.transform_norm", "head.transform_norm", "head", meta,
                               "transform_norm")
        capped = spec.head.softcap is not None  # then "logits" names the capped output
        logits = g.add("linear", ins, name="head.uncapped" if capped else "logits",
                       scope="head", meta=_role(meta, "uncapped" if capped else "logits"))
        if spec.head.softcap is not None:  # Gemma 2: cap * tanh(logits / cap)
            logits = g.add("softcap", [logits], name="logits", scope="head",
                           cap=spec.head.softcap, meta=_role(meta, "logits"))  # (B, L, V)
        if spec.output == "probs" and not self.loss:  # the loss reads the logits
            return g.add("softmax", [logits], name="probs", scope="head",
                         meta=_role(meta, "probs"))
        return logits

    def cross_entropy(self, logits: str) -> str:
        """The training loss: a ``labels`` input (B, L) int64 for the logits' L positions
        (the target's, T, in an encoder-decoder) and ``loss``, the mean token cross-entropy.
        The logits stay the loss's operand, not an output: a training step that returned them
        would hold B*L*V through backward, which F.cross_entropy itself does not keep."""
        length = T if self.spec.arch == "encoder-decoder" else S
        labels = self.g.input("labels", (B, length))  # (B, L) int64
        return self.g.add("cross_entropy", [logits, labels], name="loss", scope="head",
                          meta=NodeMeta(part="head", role="loss", module=""))  # () float32


def _inner_activation(act: str) -> str:
    """The element-wise op of an activation: the gate's op for the gated ones."""
    return {"swiglu": "silu", "geglu": "gelu", "geglu_tanh": "gelu_tanh"}.get(act, act)


def _role(meta: NodeMeta, role: str) -> NodeMeta:
    return meta.but(role=role)


G = TypeVar("G", bound=Graph)


def cache_parts(spec: Spec) -> tuple[str | None, ...] | None:
    """The KV-cache graphs a spec has, by ``part``: one for a decoder (None), the encoder and
    the decoder of an encoder-decoder; an encoder-only model's masked graph (None: its
    attention_mask and position_ids, no past); None when there are none (an encoder-decoder
    with q/k norms, which the cache graphs do not cover yet)."""
    if spec.arch in ("decoder-only", "encoder-only"):
        return (None,)
    if spec.arch == "encoder-decoder" and spec.attention.qk_norm == "none":
        return ("encoder", "decoder")
    return None


@overload
def lower(spec: Spec, sizes: Sizes | None = None) -> Graph: ...


@overload
def lower(spec: Spec, sizes: Sizes | None, graph_type: type[G], cache: bool = False,
          part: str | None = None, loss: bool = False) -> G: ...


def lower(spec: Spec, sizes: Sizes | None = None, graph_type: type[Graph] = Graph,
          cache: bool = False, part: str | None = None, loss: bool = False) -> Graph:
    """Lower a validated spec to an op graph (shapes inferred as nodes are added); ``sizes``
    defaults to the spec's own (``Sizes.of(spec)``); ``graph_type`` is the class of the result
    (``tfgraph.compile`` asks for one with ``report()``). ``cache``: the inference graph of a
    decoder (attention_mask, position_ids and past keys/values in; logits and present
    keys/values out); an encoder-decoder's is two graphs, ``part`` "encoder" or "decoder";
    an encoder-only model's is its masked graph (attention_mask (B, S) and, where positions
    are read from ids, position_ids in; logits out; no past or present keys/values).
    ``loss``: the training graph, a ``labels`` input (B, L) int64 and the cross-entropy node
    ``loss`` (its only output) after the logits (the logits, not probs, with output probs)."""
    z = sizes or Sizes.of(spec)
    graph = _Lowering(spec, z, graph_type, cache, part, loss).model()
    graph.info = graph_info(spec, z, graph_type, cache, part, loss)
    return graph


def graph_info(spec: Spec, sizes: Sizes, graph_type: type[Graph], cache: bool = False,
               part: str | None = None, loss: bool = False) -> GraphInfo:
    """The facts back ends read from a graph lowered from ``spec`` (tfgraph.graph.ir.GraphInfo):
    its architecture and kind, its KV-cache graphs and how to lower one, the lengths rule,
    the output and vocabularies, the description and the spec as text."""
    parts = cache_parts(spec)
    layout = None
    if spec.arch != "encoder-only" and all(isinstance(n, int) for n in
                                           (sizes.kv_heads, sizes.head_dim)):
        layout = CacheLayout(sizes.layers["decoder"], int(sizes.kv_heads), int(sizes.head_dim))
        if sizes.kv_rank is not None and sizes.rope_dim is not None:  # latent attention:
            # the latent and the rotary key
            layout = CacheLayout(sizes.layers["decoder"], 1, int(sizes.kv_rank),
                                 int(sizes.rope_dim))
    return GraphInfo(
        arch=spec.arch, kind="loss" if loss else "cached" if cache else "full",
        part=part if cache else None, description=spec.description,
        lengths=Lengths.of(spec), default_seq=default_seq(spec), output=spec.output,
        prompt_vocab=spec.vocab_size("source"), output_vocab=spec.output_vocab,
        cache_parts=parts, cache_graph=partial(_cache_graph, spec, sizes, graph_type),
        cache=layout,
        source=SpecText(spec.name, partial(_spec_yaml, spec), partial(_spec_json, spec)))


# Module-level (not closures), so that a graph's info pickles with it.
def _cache_graph(spec: Spec, sizes: Sizes, graph_type: type[Graph], which: str | None
                 ) -> Graph:
    """The linted KV-cache graph ``which`` of ``spec`` (GraphInfo.cache_graph)."""
    parts = cache_parts(spec)
    if parts is None or which not in parts:
        raise TfgraphError(f"{spec.name}: no KV-cache graph {which or 'decoder'!r} "
                           f"(its KV-cache graphs: {parts})")
    graph = lower(spec, sizes, graph_type, cache=True, part=which)
    graph.lint()
    return graph


def _spec_json(spec: Spec) -> str:
    return json.dumps(spec.model_dump(mode="json"), sort_keys=True)


def _spec_yaml(spec: Spec) -> str:
    from tfgraph.spec.loader import dump_spec

    return dump_spec(spec)


def with_loss(graph: G) -> G | None:
    """The training graph of ``graph``, a full-sequence graph lowered from its spec with its
    own sizes: a copy with the ``labels`` input and the ``loss`` node after its logits, the
    graph ``lower(spec, loss=True)`` builds (same nodes, order, metadata), without lowering
    the model again. None where that is not how the loss graph differs: no spec, an output
    other than the logits alone (probs; a KV-cache graph's presents), or a loss already."""
    spec = graph.spec
    if spec is None or spec.output == "probs" or graph.outputs != ["logits"] \
            or "labels" in graph or "loss" in graph:
        return None
    lowering = _Lowering(spec, Sizes.of(spec), type(graph), loss=True)
    if graph.sizes != lowering.g.sizes:
        return None
    lowering.g = out = graph.copy()
    out.outputs = []
    out.set_output(lowering.cross_entropy("logits"))
    out.info = graph_info(spec, Sizes.of(spec), type(graph), loss=True)
    return out
