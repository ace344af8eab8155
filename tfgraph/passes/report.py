"""The cost report: one dict for ``graph.report(...)`` and ``tfgraph report --json`` (README,
``tfgraph report``).

Conventions (also written into every report under ``conventions``):
- FLOPs count 2 per multiply-accumulate; ``matmul`` covers every linear (output head included)
  and both attention products over the full score matrix; ``other`` uses the per-element
  constants of ``tfgraph.graph.ops.FLOPS_PER_ELEMENT``. Causal attention is counted dense;
  ``causal_effective_matmul`` counts only the Tq*(Tq+1)/2 unmasked scores of causal products.
- The ``*_effective`` FLOPs (``tfgraph.passes.effective``) are the work the model does: each
  causal attention over the scores its queries read (a sliding window's last W keys), matmul
  and per-score work alike. They are the headline of the readable report; the dense keys keep
  their meaning (README, "Effective and dense FLOPs").
- backward = 2 x forward (two products per forward product: gradients of input and weight;
  Kaplan et al. 2020, Narayanan et al. 2021) for every op whose gradients are all computed;
  gradients no path to the outputs asks for are not counted (``tfgraph.passes.gradients``:
  an op none of whose operands gets a gradient has no backward, a parameter none reaches no
  weight gradient and no gradient or optimizer state); train_step = forward + backward.
- Memory is in bytes at the spec's dtype.
"""

from __future__ import annotations

import numbers
from typing import Any

import sympy

from tfgraph.errors import TfgraphError
from tfgraph.passes import cost, effective, exact, gradients
from tfgraph.passes.figures import FP32_BYTES, STEP_NOTE, state_bytes, states_note, symbolic
from tfgraph.passes.formulas import spec_formulas
from tfgraph.graph.ir import DTYPE_BYTES, SYMBOLS, Graph
from tfgraph.graph.ops import FLOPS_PER_ELEMENT
from tfgraph.passes.param_groups import GROUPING, params_by_kind
from tfgraph.passes.train_walk import loss_graph, train_peak

CONVENTIONS = {
    "flops": "2 FLOPs per multiply-accumulate; matmul = every linear (output head included) "
             "and both attention products (QK^T, weights.V) over the full score matrix; "
             "embedding gathers excluded; causal attention counted dense.",
    "flops.other": "element-wise work with per-element constants: "
                   + ", ".join(f"{k} {v}" for k, v in FLOPS_PER_ELEMENT.items())
                   + "; dropout is the identity at inference (0).",
    "flops.backward": "2 x flops.forward (input and weight gradients of every product), "
                      "less the gradients no path to the outputs asks for: a gradient reaches "
                      "a value back from the outputs through the operands that pass one (not "
                      "hard attention's q and k, not a router's correction bias); an op none "
                      "of whose operands gets one has no backward (hard attention's q and k "
                      "linears), a weight none reaches no weight-gradient product (its "
                      "input's gradient stays), attention without q's and k's gradients "
                      "only dV = A^T dO.",
    "flops.train_step": "flops.forward + flops.backward (optimizer update not counted).",
    "flops.causal_effective_matmul": "flops.matmul with causal and sliding-window score "
                                     "products counted over the unmasked scores only "
                                     "(Tq*(Tq+1)/2 under the causal mask).",
    "flops.forward_effective": "the work the model does, the readable report's headline: "
                               "flops.forward with every causal attention counted over the "
                               "scores its queries read, Tq*(Tq+1)/2 under the causal mask, "
                               "sum of min(i+1, W) over queries i with a sliding window of W "
                               "keys (an encoder's bidirectional window: the keys with "
                               "|i - j| < W): both products (QK^T, weights.V) and the per-score "
                               "scaling, mask, soft-cap and softmax. What attention kernels "
                               "that skip masked tiles compute (FlashAttention, SDPA "
                               "is_causal); flops.forward counts the full score matrix.",
    "flops.matmul_effective": "flops.matmul counted as flops.forward_effective (equal to "
                              "flops.causal_effective_matmul).",
    "flops.other_effective": "flops.other counted as flops.forward_effective.",
    "flops.backward_effective": "2 x flops.forward_effective, less the gradients no path "
                                "to the outputs asks for (as flops.backward).",
    "flops.train_step_effective": "flops.forward_effective + flops.backward_effective.",
    "flops_by_kind_effective": "flops_by_kind counted as flops.forward_effective (only "
                               "attention_scores differs).",
    "memory.weights": "unique parameters x bytes of the spec dtype (a tied table once).",
    "memory.activations_peak": "inference; the walk of tfgraph.passes.liveness (the one the PyTorch module "
                               "runs): a tensor lives from its producer to its last consumer, "
                               "an op's inputs, output and scratch are live together, a layer's "
                               "inputs are held by its caller until the layer returns; unfused "
                               "attention materialises one B*h*Tq*Tk score matrix (a fused "
                               "kernel streams it, holding only latent attention's v "
                               "zero-padded to head_dim and its padded output); token ids "
                               "included.",
    "memory.saved_for_backward": "one training forward: tensors each op keeps for its gradient "
                                 "(each counted once; parameters excluded; dropout masks at 1 "
                                 "byte per element; norm statistics in float32; softmax "
                                 "attention as a fused kernel keeping q, k, v, output and a "
                                 "float32 log-sum-exp per query row; attention.dropout adds "
                                 "no mask there, the kernel draws it again in backward; "
                                 "materialised attention keeps its 1-byte mask and the "
                                 "dropped-out weights: tfgraph plan --attention unfused); "
                                 "the mask of the keys a query reads, whole (Tq*Tk, one per "
                                 "attention call, not split by batch or tensor parallelism): "
                                 "a sliding window's float mask in the model's dtype under "
                                 "the fused kernel, a 1-byte causal or window mask where "
                                 "attention runs as matmuls (soft-capping, T5's bias, "
                                 "ALiBi). Not counted, though the torch module "
                                 "keeps them: the rotary cos/sin tables (one pair per "
                                 "sequence and rotary base, shared by the layers) and a "
                                 "unit-offset norm's (1 + w) gain (Gemma). On the CPU a "
                                 "16-bit module keeps LayerNorm statistics in its own dtype: "
                                 "fewer bytes than counted.",
    "memory.kv_cache": "K and V of every decoder attention at kv_heads for the whole sequence: "
                       "self-attention over the target, cross-attention over the source; "
                       "a sliding-window layer its last min(T, window) positions, as a "
                       "rolling cache holds them (transformers' sliding-window cache layers; "
                       "tfgraph's own KV-cache models keep every position: "
                       "kv_cache_all_positions); latent attention keeps its latent and rotary "
                       "key (kv_rank + rope_dim per token).",
    "kv_cache_all_positions": "sliding-window models only: memory.kv_cache with every "
                              "position of every layer kept, what tfgraph's KV-cache models "
                              "(ONNX --kv-cache, the torch module's cache) hold.",
    "memory.model_states": "Adam: weights + gradients + two fp32 moments (+ an fp32 master "
                           "copy for 16-bit dtypes) + torch Adam's float32 step count (4 "
                           "bytes per parameter tensor), the last four only for the "
                           "parameters a gradient reaches (as flops.backward); gradients in "
                           "the spec dtype (states "
                           "'mixed', the default: 16 bytes per parameter for a 16-bit spec, "
                           "as tfgraph plan's default) or fp32 (states 'megatron': 18, "
                           "Megatron-LM's); see model_states below.",
    "memory.train_activations_peak": "one training step of the loss graph (the spec compiled "
                                     "with loss=True: token cross-entropy over the vocabulary "
                                     "in float32; tfgraph.passes.train_walk), no recomputation: the "
                                     "largest live set of activations over forward then "
                                     "backward. Forward: tensors saved so far (as "
                                     "saved_for_backward) + buffers still needed + scratch; "
                                     "backward in reverse op order: saved tensors until their "
                                     "first saver's backward, each activation gradient from "
                                     "its first consumer's to its producer's backward (read "
                                     "twice: accumulated beside the new one), the gradients "
                                     "an op writes, the loss's float32 log-probabilities with "
                                     "their gradient and the logits' gradient. Unfused "
                                     "attention holds one score matrix in its forward and "
                                     "backward; parameters and their gradients excluded. A "
                                     "graph without a spec: saved_for_backward.",
    "memory.train_step": "memory.model_states + memory.train_activations_peak.",
    "params_active": "mixture of experts only: parameters one token uses, its top-k routed "
                     "experts (k/E of each layer's stacked expert weights), the shared "
                     "experts and every other parameter; params counts all experts, and so "
                     "does memory.weights.",
    "flops.router": "mixture of experts only: the router's linear (d -> E) and the routing "
                    "(softmax, top-k selection, renormalisation), included in forward.",
    "flops.forward_all_experts": "mixture of experts only: forward FLOPs with every routed "
                                 "expert run on every token. flops.forward and matmul count "
                                 "each token's top-k experts: the ideal, what the PyTorch back "
                                 "end computes. The ONNX model computes the dense form, every "
                                 "expert on every token multiplied by routing weights that are "
                                 "0 outside the top k: it performs forward_all_experts "
                                 "(matmul_all_experts of it in matmuls).",
    "params_by_kind": "unique parameters by kind of work (tfgraph.passes.param_groups, the grouping "
                      "tfgraph compare shows): " + GROUPING,
    "formulas": "sympy expressions in B (batch), S (sequence; source for encoder-decoder), "
                "T (target) and the spec's sizes (values under 'symbols'): L layers per stack "
                "(L_enc, L_dec when they differ), d d_model, h heads, kv key/value heads, hd "
                "head_dim, d_ff ffn.hidden, V vocabulary (V_src, V_tgt when two), max_len; a "
                "derived size equal to its default is written through its sources (hd = d/h, "
                "kv = h, d_ff = 4*d); each formula is checked to give the numeric expression "
                "back (formulas_bst: the same in B, S, T only). memory.activations_peak's "
                "formula is the live set at the peak for the requested sizes; "
                "memory.train_activations_peak's too, in B, S, T with the spec's sizes as "
                "numbers (and so the part of memory.train_step it adds).",
}


_FORMULA_ORDER = ["params", *(f"flops.{k}" for k in ("forward_effective", "matmul_effective",
                                                      "other_effective", "backward_effective",
                                                      "train_step_effective", "forward",
                                                      "matmul", "other", "backward",
                                                      "train_step", "causal_effective_matmul")),
                  *(f"memory.{k}" for k in ("weights", "activations_peak", "saved_for_backward",
                                            "kv_cache", "model_states", "train_step",
                                            "train_activations_peak")),
                  "params_active", "flops.router", "flops.matmul_all_experts",
                  "flops.forward_all_experts"]


def _int(expr: sympy.Expr, sizes: dict[sympy.Symbol, int]) -> int:
    fast = exact.value(expr, sizes)  # the same integer, without sympy's intermediate objects
    return fast if fast is not None else int(sympy.Integer(expr.xreplace(sizes)))


def positive_int(what: str, value: Any) -> int:
    """``value`` as a plain int (numpy ints are not JSON); ValueError naming ``what`` unless
    it is a positive integer (bool is an int subclass and 2.5 would be truncated silently:
    both refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{what} must be a positive integer, got {value!r}")
    return int(value)


def check_reportable(graph: Graph) -> None:
    """TfgraphError unless ``graph`` is one the report covers: a KV-cache graph (one step
    over a past of any length P) is not; its model's full graph is."""
    if graph.info.kind == "cached":
        part = f" {graph.info.part}" if graph.info.part else ""
        raise TfgraphError(f"{graph.name}: the report is of the full graph, not the KV-cache"
                           f"{part} graph (compile without cache=True)")


def sizes_for(graph: Graph, batch: int, seq: int, tgt_seq: int | None) -> dict[sympy.Symbol, int]:
    tgt = seq if tgt_seq is None else tgt_seq
    return {SYMBOLS["B"]: int(batch), SYMBOLS["S"]: int(seq), SYMBOLS["T"]: int(tgt)}


def _fmt(expr: sympy.Expr) -> str:
    return exact.expanded_text(expr)


# backward_effective and train_step_effective are 2x and 3x forward_effective, and
# matmul_effective is causal_effective_matmul: their formulas are written from those rather
# than printed again (sympy's printer is the slow part of a report).
EFFECTIVE_MULTIPLES = {"backward_effective": 2, "train_step_effective": 3}
EFFECTIVE_COPIES = {"matmul_effective": "causal_effective_matmul"}


def _effective_multiples(form: dict[str, str]) -> None:
    """Add the formulas of EFFECTIVE_MULTIPLES and EFFECTIVE_COPIES to ``form`` from those of
    forward_effective and causal_effective_matmul."""
    forward = form.get("flops.forward_effective")
    if forward is not None:
        for key, factor in EFFECTIVE_MULTIPLES.items():
            # written already where some gradient is not computed (tfgraph.passes.gradients)
            form.setdefault(f"flops.{key}", f"{factor}*({forward})")
    for key, source in EFFECTIVE_COPIES.items():
        if f"flops.{source}" in form:
            form[f"flops.{key}"] = form[f"flops.{source}"]


def _static_formulas(graph: Graph) -> tuple[dict[str, str], dict[str, str]]:
    """The size-independent formula strings (B, S, T form; spec-symbol form), printed once per
    graph: sympy's printer is slow and reports are asked for at many lengths (compare)."""

    def compute() -> tuple[dict[str, str], dict[str, str]]:
        sym = symbolic(graph)
        bst = {f"flops.{k}": _fmt(v) for k, v in sym["flops"].items()}
        # backward is 2x forward unless some gradient is not computed (tfgraph.passes.gradients)
        partial = bool(gradients.backward_savings(graph))
        bst.update({f"flops.{k}": _fmt(v) for k, v in effective.effective(graph)["flops"].items()
                    if (partial or k not in EFFECTIVE_MULTIPLES) and k not in EFFECTIVE_COPIES})
        bst.update({f"memory.{k}": _fmt(v) for k, v in sym["memory"].items()})
        bst["params"] = str(sym["params"])
        if "params_active" in sym:
            bst["params_active"] = _fmt(sym["params_active"])
        named = spec_formulas(graph)
        text = {} if named is None else {k: exact.text(v) for k, v in named.figures.items()}
        for form in (bst, text):
            _effective_multiples(form)
        return bst, text

    return graph.memo("formula_text", compute)


def train_activations(graph: Graph, sym: dict[str, Any], sizes: dict[sympy.Symbol, int],
                       fused_attention: bool) -> tuple[int, sympy.Expr, str | None]:
    """(bytes, live-set expression, "node (phase)") of the training step's activation peak
    over the loss graph (tfgraph.passes.train_walk); saved_for_backward and no node for a graph
    without a spec."""
    train_graph = loss_graph(graph)
    if train_graph is None:
        saved = sym["memory"]["saved_for_backward"]
        return _int(saved, sizes), saved, None
    peak = train_peak(train_graph, sizes, "none", fused_attention)
    return peak.bytes, peak.expr, f"{peak.node} ({peak.phase})"


def _components(graph: Graph) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, Any]]]:
    """The component rows (zeroed) in order of first appearance (the token table, read by the
    first embedding, comes first; layers are separate rows, a display may fold identical
    ones), and where each sits: ``{"stack": "decoder", "layer": 3}`` for a layer, ``layer``
    None for the rest (``stack`` None outside stacks: the shared table, the head). Displays
    fold runs of identical layers with it instead of parsing component names."""
    rows: dict[str, dict[str, int]] = {}
    places: dict[str, dict[str, Any]] = {}
    for n in graph.nodes():
        if n.op != "input":
            key = n.component
            if key not in rows:
                rows[key] = {"params": 0, "flops_matmul": 0, "flops_other": 0}
                places[key] = {"stack": n.meta.stack, "layer": n.meta.layer}
    return rows, places


def _fp32_gradients(graph: Graph, states: str, params: Any) -> Any:
    """What ``states`` adds to the figures' model states (16-bit gradients): ``params``
    (a count or its formula) x the bytes fp32 gradients add ("megatron"), else 0."""
    dtype_bytes = DTYPE_BYTES[graph.dtype]
    return (state_bytes(dtype_bytes, states)[1] - dtype_bytes) * params


def build_report(graph: Graph, batch: int = 1, seq: int = 128, tgt_seq: int | None = None,
                 fused_attention: bool = False, states: str = "mixed") -> dict[str, Any]:
    """The report dict: totals at the given sizes, roll-ups, formulas, conventions; model
    states under the ``states`` convention (tfgraph.passes.figures.STATES). The report is of
    a full or loss graph: a KV-cache graph's is refused (TfgraphError)."""
    check_reportable(graph)
    state_bytes(FP32_BYTES, states)  # ValueError for an unknown convention
    batch, seq = positive_int("batch", batch), positive_int("seq", seq)
    tgt_seq = None if tgt_seq is None else positive_int("tgt_seq", tgt_seq)
    sym = symbolic(graph)
    sizes = sizes_for(graph, batch, seq, tgt_seq)
    peak = cost.activation_peak(graph, sym["costs"], sizes, fused_attention=fused_attention)
    flops = {k: _int(v, sizes) for k, v in sym["flops"].items()}
    # the headline: the work done, causal masks and sliding windows counted (new keys; the
    # dense ones keep their meaning: full score matrices, as FlopCounterMode counts)
    work = effective.at_sizes(graph, sizes)
    flops.update(work["flops"])
    memory = {k: _int(v, sizes) for k, v in sym["memory"].items()}
    held = _int(graph.memo("kv_cache_all_positions",
                           lambda: cost.kv_cache(graph, windowed=False)), sizes)
    trained = sym.get("params_trained", sym["params"])  # gradients are kept for these
    memory["model_states"] += _fp32_gradients(graph, states, int(trained))
    memory["activations_peak"] = peak.bytes
    train_bytes, train_expr, train_at = train_activations(graph, sym, sizes, fused_attention)
    memory["train_activations_peak"] = train_bytes
    memory["train_step"] = memory["model_states"] + train_bytes
    components, component_layers = _components(graph)
    values: dict[sympy.Expr, int] = {}  # every layer repeats the same few costs
    by_id: dict[int, tuple[sympy.Expr, int]] = {}  # ... as the same objects (cost memo)

    def at_sizes(expr: sympy.Expr) -> int:
        hit = by_id.get(id(expr))
        if hit is not None and hit[0] is expr:
            return hit[1]
        if expr not in values:
            values[expr] = _int(expr, sizes)
        by_id[id(expr)] = (expr, values[expr])  # holds expr: its id is not reused meanwhile
        return values[expr]

    for c in sym["costs"]:
        row = components[c.component]
        row["flops_matmul"] += at_sizes(c.matmul)
        row["flops_other"] += at_sizes(c.other)
    params_by_component = cost.params_by_component(graph)
    for key, n in params_by_component.items():
        components[key]["params"] = n
    spec = graph.spec
    static_bst, static_named = _static_formulas(graph)
    train_formula = exact.expand(train_expr)
    train_text = exact.text(train_formula)  # printed once: both forms show it
    states_extra = _fp32_gradients(graph, states, sympy.sympify(trained))
    bst = {**static_bst, "memory.activations_peak": _fmt(peak.expr),
           "memory.train_activations_peak": train_text,
           "memory.train_step": _fmt(sym["memory"]["model_states"] + states_extra
                                     + train_formula)}
    if states_extra:
        bst["memory.model_states"] = _fmt(sym["memory"]["model_states"] + states_extra)
    symbols = {"B": int(batch), "S": int(seq)}
    if spec is not None and spec.arch == "encoder-decoder":
        symbols["T"] = int(tgt_seq if tgt_seq else seq)
    named = spec_formulas(graph)
    if named is None:
        formulas = dict(bst)
    else:
        named_states = named.figures["memory.model_states"] + _fp32_gradients(
            graph, states, named.figures["params"] if named.trained is None else named.trained)
        if states_extra:  # per layer, as the other formulas are written: L*(...) + ...
            expanded = exact.expand(named_states)
            named_states = sympy.collect(expanded, sorted(
                (s for s in expanded.free_symbols if s.name.startswith("L")), key=str))
        formulas = {**static_named,
                    "memory.activations_peak": exact.text(named.peak(graph, peak, fused_attention)),
                    "memory.train_activations_peak": train_text,
                    "memory.train_step": exact.text(named_states + train_formula)}
        if states_extra:
            formulas["memory.model_states"] = exact.text(named_states)
        symbols.update(named.used_values())
    formulas = {k: formulas[k] for k in sorted(formulas, key=_FORMULA_ORDER.index)}
    bst = {k: bst[k] for k in formulas}
    return {
        "name": graph.name,
        "arch": spec.arch if spec else None,
        "dtype": graph.dtype,
        "sizes": {**graph.sizes, "batch": batch, "seq": seq,
                  "tgt_seq": tgt_seq if tgt_seq else seq, "fused_attention": fused_attention},
        "params": sym["params"],
        **({"params_active": int(sym["params_active"])} if "params_active" in sym else {}),
        "params_by_component": params_by_component,
        "flops": flops,
        "memory": memory,
        **({"kv_cache_all_positions": held} if held != memory["kv_cache"] else {}),
        "flops_by_kind": {k: _int(v, sizes) for k, v in sym["flops_by_kind"].items()},
        "flops_by_kind_effective": work["flops_by_kind"],
        "params_by_kind": params_by_kind(graph),  # the grouping compare shows too
        "components": components,
        "component_layers": component_layers,
        "activations_peak_at": peak.node,
        "train_activations_peak_at": train_at,
        "formulas": formulas,
        "formulas_bst": bst,
        "symbols": symbols,
        "model_states": states_note(DTYPE_BYTES[graph.dtype], states) + STEP_NOTE,
        "conventions": CONVENTIONS,
    }
