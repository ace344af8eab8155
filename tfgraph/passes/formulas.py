"""Cost formulas in the spec's own symbols: ``L·(24·B·S·d² + 4·B·S²·d) + 2·B·S·d·V``.

The figures of ``tfgraph.passes.figures.symbolic`` are sympy expressions in B, S, T with numeric
coefficients (``247064064*B*S``). To say where those numbers come from, the spec is lowered again
as a *symbolic twin*: the same lowering and the same per-op cost rules, with ``Sizes`` whose
fields are symbols (d, h, kv, hd, d_ff, V, max_len; ``twin_sizes``). Layer counts cannot be
symbols (a loop needs a number),
so the twin is lowered with 1 and 2 layers per stack; every figure except the activation peak is
affine in the layer count, so ``per-layer = c(2) - c(1)`` and ``rest = c(1) - per-layer`` give
``L·(per-layer) + rest`` exactly. Every formula is then checked: substituting the spec's sizes
must give the numeric expression back (``expand(difference) == 0``); a figure that fails the
check keeps its B, S, T form (``SpecFormulas.unverified`` names it; tests require none).

A derived size equal to its default is written through the sizes it derives from, so the usual
GPT layout reduces to Narayanan et al. (2021): hd = d/h when h·hd = d, kv = h when there is no
grouping, d_ff = 4·d when the feed-forward is 4 times wider.
"""

from __future__ import annotations

import re
from typing import Any
from dataclasses import dataclass, field, replace

import sympy

from tfgraph.passes import exact, gradients
from tfgraph.passes.cost import OpCost, Peak, op_costs
from tfgraph.passes.effective import effective
from tfgraph.passes.figures import symbolic
from tfgraph.graph.ir import SYMBOLS, Graph
from tfgraph.graph.lower import Sizes, lower
from tfgraph.spec.schema import Spec, StackLayers, Vocabularies


def _sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, positive=True, integer=True)


L, L_ENC, L_DEC = _sym("L"), _sym("L_enc"), _sym("L_dec")
D, H, KV, HD, D_FF = _sym("d"), _sym("h"), _sym("kv"), _sym("hd"), _sym("d_ff")
V, V_SRC, V_TGT, MAX_LEN = _sym("V"), _sym("V_src"), _sym("V_tgt"), _sym("max_len")
# Mixture of experts (README, ffn.experts)
E, K, D_E, E_SH, D_SH = _sym("E"), _sym("k"), _sym("d_e"), _sym("E_sh"), _sym("d_sh")
L_DENSE = _sym("L_dense")
# Sliding windows (README, attention.window): the window, and the layers of each kind
W, L_LOCAL, L_GLOBAL = _sym("W"), _sym("L_local"), _sym("L_global")
# Latent attention (README, attention.latent): the latents, the rotary and the value heads
R_KV, R_Q, D_R, D_V = _sym("r_kv"), _sym("r_q"), _sym("d_r"), _sym("d_v")

MEANING: dict[str, str] = {
    "B": "batch", "S": "sequence length (source for encoder-decoder)", "T": "target length",
    "L": "layers per stack", "L_enc": "encoder layers", "L_dec": "decoder layers",
    "d": "d_model", "h": "attention heads", "kv": "key/value heads", "hd": "head_dim",
    "d_ff": "ffn.hidden", "V": "vocabulary", "V_src": "source vocabulary",
    "V_tgt": "target vocabulary",
    "max_len": "rows of the learned position table (less embedding.position_offset)",
    "E": "routed experts (ffn.experts)", "k": "experts per token (ffn.top_k)",
    "d_e": "ffn.expert_hidden", "E_sh": "ffn.shared_experts", "d_sh": "ffn.shared_hidden",
    "L_dense": "leading dense layers (ffn.dense_layers)",
    "W": "keys a sliding-window query reads (attention.window)",
    "r_kv": "key/value latent (attention.latent.kv_rank)",
    "r_q": "query latent (attention.latent.q_rank)",
    "d_r": "rotary channels of a head (attention.latent.rope_dim)",
    "d_v": "value head width (attention.latent.v_head_dim)",
    "L_local": "sliding-window layers", "L_global": "global-attention layers",
}

# Figures written as formulas; the activation peak is handled separately (it depends on sizes).
FIGURES = ("params", "flops.forward", "flops.matmul", "flops.other", "flops.backward",
           "flops.train_step", "flops.causal_effective_matmul", "flops.forward_effective",
           "flops.other_effective", "memory.weights", "memory.saved_for_backward",
           "memory.kv_cache", "memory.model_states")
TRAINED = "params_trained"  # only where some parameter gets no gradient (figures.symbolic)
# (flops.backward_effective and train_step_effective, 2x and 3x forward_effective, and
# matmul_effective, causal_effective_matmul, are written from those by tfgraph.passes.report)
PARTIAL_FIGURES = ("flops.backward_effective", "flops.train_step_effective")
"""... and, where some gradient is not computed (tfgraph.passes.gradients), these two."""
# ... and those of a mixture of experts (tfgraph.passes.figures: present only when it has experts)
MOE_FIGURES = ("params_active", "flops.router", "flops.matmul_all_experts",
               "flops.forward_all_experts")

def twin_sizes(spec: Spec, layers: dict[str, int]) -> Sizes:
    """The spec's sizes as symbols (the contract of ``tfgraph.graph.lower.Sizes``): d, h, kv, hd,
    d_ff, V (or V_src and V_tgt), max_len; a derived size equal to its default is written
    through its sources (hd = d/h, kv = h, d_ff = 4·d). Layer counts stay numbers."""
    att = spec.attention
    assert att.head_dim is not None and att.kv_heads is not None and spec.ffn.hidden
    two = isinstance(spec.vocab, Vocabularies)
    head_dim = D / H if att.heads * att.head_dim == spec.d_model else HD
    # Partial rotary positions rotate a share of hd (Pythia's hd/4): that share, times hd.
    partial = Sizes.of(spec).rotary_dim is not None
    return Sizes(
        d_model=D, heads=H,
        kv_heads=H if att.kv_heads == att.heads else KV,
        head_dim=head_dim,
        ffn_hidden=4 * D if spec.ffn.hidden == 4 * spec.d_model else D_FF,
        vocab={"source": V_SRC if two else V, "target": V_TGT if two else V},
        max_len=MAX_LEN if spec.embedding.positions == "learned" else None,
        layers=dict(layers), window=W if att.window is not None else None,
        rotary_dim=sympy.Rational(spec.rotary_dim, att.head_dim) * head_dim if partial
        else None, **_latent_symbols(spec))


def _latent_symbols(spec: Spec) -> dict[str, Any]:
    """The sizes of attention.latent as symbols (none without it)."""
    lat = spec.attention.latent
    if lat is None:
        return {}
    return dict(kv_rank=R_KV, q_rank=R_Q if lat.q_rank is not None else None, rope_dim=D_R,
                v_head_dim=D_V)


def _moe_sizes(spec: Spec, sizes: Sizes, dense_layers: int) -> Sizes:
    """``sizes`` with the mixture-of-experts sizes as symbols: E, k, d_e (written d_ff when
    it is ffn.hidden), d_sh (written E_sh·d_e when it is shared_experts · expert_hidden),
    and ``dense_layers`` leading dense layers (a number, like the layer counts)."""
    ffn = spec.ffn
    if ffn.experts is None:
        return sizes
    hidden = sizes.ffn_hidden if ffn.expert_hidden == ffn.hidden else D_E
    shared = None
    if ffn.shared_experts:
        derived = ffn.shared_experts * int(ffn.expert_hidden or 0)  # the default
        shared = E_SH * hidden if ffn.shared_hidden == derived else D_SH
    return replace(sizes, experts=E, top_k=K, expert_hidden=hidden, shared_hidden=shared,
                   dense_layers=dense_layers)


def _twin(spec: Spec, layers: dict[str, int], dense_layers: int = 0,
          loss: bool = False) -> Graph:
    """The graph of ``spec`` at symbolic sizes with ``layers`` per stack; ``loss``: its
    training graph (labels and the token cross-entropy), as the graph reported on is."""
    return lower(spec, _moe_sizes(spec, twin_sizes(spec, layers), dense_layers), Graph,
                 loss=loss)


def _figures(graph: Graph) -> dict[str, sympy.Expr]:
    sym = symbolic(graph)
    out = {"params": sympy.sympify(sym["params"])}
    if "params_trained" in sym:
        out["params_trained"] = sympy.sympify(sym["params_trained"])
    if "params_active" in sym:
        out["params_active"] = sympy.sympify(sym["params_active"])
    out.update({f"flops.{k}": v for k, v in sym["flops"].items()})
    # the work done (causal masks, sliding windows): report's headline has a formula too
    out.update({f"flops.{k}": v for k, v in effective(graph)["flops"].items()})
    out.update({f"memory.{k}": sympy.sympify(v) for k, v in sym["memory"].items()})
    return out


def _mixed_windows(spec: Spec) -> bool:
    """Some layers are local and some global (attention.window_pattern), so a figure is
    L_local times a local layer's term plus L_global times a global layer's."""
    kinds = {spec.layer_is_local(i) for i in range(spec.layer_count(spec.stacks[-1]))}
    return spec.attention.window is not None and len(kinds) == 2


def _one_kind(spec: Spec, local: bool) -> Spec:
    """``spec`` with every layer local (or every layer global)."""
    data = spec.model_dump()
    data["attention"]["window_pattern"] = None
    if not local:
        data["attention"]["window"] = None
        data["embedding"]["local_rope_theta"] = None
    return Spec.model_validate(data)


def _by_window_kind(spec: Spec, key: str, loss: bool = False) -> sympy.Expr:
    """Figure ``key`` of a spec with local and global layers: L_local local layers, L_global
    global ones, and what is outside the layers; every layer with its experts, if any (the
    twins have no dense layers: the caller adds L_dense times a dense layer's difference).
    ``loss``: of the training graph, as ``_twin``."""
    stack = spec.stacks[0]
    terms = {}
    for kind, local in ((L_LOCAL, True), (L_GLOBAL, False)):
        one = _one_kind(spec, local)
        terms[kind] = (_figures(_twin(one, {stack: 1}, loss=loss))[key],
                       _figures(_twin(one, {stack: 2}, loss=loss))[key])
    local_one, local_two = terms[L_LOCAL]
    rest = sympy.expand(2 * local_one - local_two)
    return sympy.Add(*(kind * sympy.expand(two - one) for kind, (one, two) in terms.items()),
                     rest)


def symbol_values(spec: Spec) -> dict[sympy.Symbol, int]:
    """The spec's value of every size symbol a formula of it may contain."""
    att = spec.attention
    values: dict[sympy.Symbol, int] = {D: spec.d_model, H: att.heads, KV: int(att.kv_heads or 0),
                                       HD: int(att.head_dim or 0), D_FF: int(spec.ffn.hidden or 0)}
    if isinstance(spec.layers, StackLayers):
        values.update({L_ENC: spec.layers.encoder, L_DEC: spec.layers.decoder})
    else:
        values[L] = int(spec.layers)
    if isinstance(spec.vocab, Vocabularies):
        values.update({V_SRC: spec.vocab.source, V_TGT: spec.vocab.target})
    else:
        values[V] = int(spec.vocab)
    if spec.max_len is not None:
        values[MAX_LEN] = spec.max_len
    if att.window is not None:
        values[W] = att.window
        if _mixed_windows(spec):
            local = sum(spec.layer_is_local(i) for i in range(spec.layer_count("decoder")))
            values.update({L_LOCAL: local, L_GLOBAL: spec.layer_count("decoder") - local})
    lat = att.latent
    if lat is not None:
        values.update({R_KV: lat.kv_rank, R_Q: int(lat.q_rank or 0), D_R: lat.rope_dim,
                       D_V: int(lat.v_head_dim or 0)})
    ffn = spec.ffn
    if ffn.experts is not None:
        values.update({E: ffn.experts, K: int(ffn.top_k or 0), D_E: int(ffn.expert_hidden or 0),
                       E_SH: int(ffn.shared_experts or 0), D_SH: int(ffn.shared_hidden or 0),
                       L_DENSE: int(ffn.dense_layers or 0)})
    return values


@dataclass
class SpecFormulas:
    """Every figure of a graph as a sympy expression in B, S, T and the spec's size symbols."""

    figures: dict[str, sympy.Expr]
    values: dict[sympy.Symbol, int]
    unverified: list[str]
    one_layer: Graph  # the symbolic twin with one layer per stack (for the activation peak)
    _temps: dict[str, OpCost] = field(default_factory=dict)
    dense_layers: int = 0
    """ffn.dense_layers: one_layer then has two layers, a dense one (0) and one with experts."""
    trained: sympy.Expr | None = None
    """The parameters a gradient reaches, where some get none (``gradients.frozen_params``): what
    gradient bytes scale with; not a published figure."""

    def peak(self, graph: Graph, peak: Peak, fused_attention: bool) -> sympy.Expr:
        """The activation peak's live set, read in the one-layer twin (a buffer of layer i has
        the type of the same buffer in layer 0: found by its metadata, ``NodeMeta.in_layer``)."""
        if not self._temps:
            self._temps.update((c.node, c) for c in op_costs(self.one_layer))
        twin = self.one_layer.by_meta()

        def in_twin(name: str) -> str:
            meta = graph.node(name).meta
            if meta.layer is None:
                return twin[meta.key].name
            return twin[meta.in_layer(int(meta.layer >= self.dense_layers > 0)).key].name

        terms = [self.one_layer.node(in_twin(n)).type.nbytes for n in peak.live]
        # a fused kernel streams attention's scores (OpDef.score_temp), holding only its
        # fused_temp; other scratch stays (the routed experts' buffers), as in
        # cost.activation_peak
        c = self._temps.get(in_twin(peak.node))
        if c is not None:
            terms.append(c.scratch(fused_attention))
        return sympy.Add(*terms)

    def used_values(self) -> dict[str, int]:
        """Values of the size symbols that appear in some figure, by symbol name."""
        used: set[sympy.Symbol] = set()
        for expr in self.figures.values():
            used |= expr.free_symbols
        return {str(s): v for s, v in self.values.items() if s in used}


def spec_formulas(graph: Graph) -> SpecFormulas | None:
    """Formulas of ``graph`` in its spec's symbols (memoised on the graph); None without a
    spec (a graph built by hand has no sizes to name)."""
    if graph.spec is None:
        return None
    return graph.memo("spec_formulas", lambda: _spec_formulas(graph))


def _spec_formulas(graph: Graph) -> SpecFormulas:
    spec = graph.spec
    assert spec is not None
    stacks = spec.stacks
    loss = graph.info.kind == "loss"  # the twins are lowered as the graph was
    one = _twin(spec, {s: 1 for s in stacks}, loss=loss)
    base = _figures(one)
    if len(stacks) == 2 and isinstance(spec.layers, StackLayers):
        per = {L_ENC: _figures(_twin(spec, {"encoder": 2, "decoder": 1}, loss=loss)),
               L_DEC: _figures(_twin(spec, {"encoder": 1, "decoder": 2}, loss=loss))}
    else:
        per = {L: _figures(_twin(spec, {s: 2 for s in stacks}, loss=loss))}
    # First layers with a dense feed-forward (one stack): L_dense times (dense - MoE layer)
    dense = _figures(_twin(spec, {s: 2 for s in stacks}, 1, loss=loss)) \
        if spec.ffn.dense_layers else None
    numeric = _figures(graph)
    values = symbol_values(spec)
    mixed = _mixed_windows(spec)
    figures: dict[str, sympy.Expr] = {}
    unverified = []
    # backward_effective is 2x forward_effective unless some gradient is not computed
    partial = PARTIAL_FIGURES if gradients.backward_savings(graph) else ()
    for key in (k for k in (*FIGURES, *partial, *MOE_FIGURES, TRAINED) if k in numeric):
        layer_terms = {sym: exact.expand(two[key], base[key]) for sym, two in per.items()}
        rest = exact.expand(base[key], sympy.Add(*layer_terms.values()))
        expr = sympy.Add(*(sym * term for sym, term in layer_terms.items()), rest)
        # a dense layer's figure less the same layer's with experts: the two twins differ in
        # layer 0's feed-forward only (same window kinds); a layer's attention and feed-forward
        # add up independently, so the difference holds for a local and a global layer alike
        dense_minus_moe = None if dense is None else sympy.expand(dense[key] - per[L][key])
        if mixed:  # every layer with experts, by window kind, then L_dense made dense
            expr = _by_window_kind(spec, key, loss)
            if dense_minus_moe is not None:
                expr = expr + L_DENSE * dense_minus_moe
        elif dense_minus_moe is not None:  # (L - L_dense) layers with experts, L_dense dense
            moe_layer = layer_terms[L]
            dense_layer = sympy.expand(dense_minus_moe + moe_layer)
            expr = (L - L_DENSE) * moe_layer + L_DENSE * dense_layer + rest
        if not _verified(expr, values, numeric[key]):
            unverified.append(key)
            expr = sympy.expand(numeric[key])
        figures[key] = expr
    trained = figures.pop(TRAINED, None)
    if spec.ffn.dense_layers:  # the peak's twin needs a dense layer and one with experts
        return SpecFormulas(figures, values, unverified,
                            _twin(spec, {s: 2 for s in stacks}, 1, loss=loss),
                            dense_layers=spec.ffn.dense_layers, trained=trained)
    return SpecFormulas(figures, values, unverified, one, trained=trained)


def _verified(expr: sympy.Expr, values: dict[sympy.Symbol, int], numeric: sympy.Expr) -> bool:
    """Whether ``expr`` at the spec's ``values`` is ``numeric``: ``expand(difference) == 0``,
    compared as exact polynomials where both are (tfgraph.passes.exact)."""
    same = exact.equal_at(expr, values, numeric)
    if same is None:
        same = sympy.expand(expr.xreplace(values) - numeric) == 0
    return same


_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def pretty(expr: sympy.Expr | str) -> str:
    """``L*(24*B*S*d**2 + 4*B*S**2*d)`` -> ``L·(24·B·S·d² + 4·B·S²·d)`` (for people, not parsing)."""
    text = str(expr)
    text = re.sub(r"\*\*(\d+)", lambda m: m.group(1).translate(_SUPERSCRIPT), text)
    return text.replace("*", "·")


def size_symbols() -> dict[str, sympy.Symbol]:
    """All symbols a formula may contain, by name (B, S, T and the spec's sizes)."""
    names = [L, L_ENC, L_DEC, D, H, KV, HD, D_FF, V, V_SRC, V_TGT, MAX_LEN, E, K, D_E, E_SH,
             D_SH, L_DENSE, W, L_LOCAL, L_GLOBAL, R_KV, R_Q, D_R, D_V]
    return {**SYMBOLS, **{str(s): s for s in names}}
