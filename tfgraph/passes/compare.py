"""Variants side by side (README, ``tfgraph compare``).

``compare(graphs)`` returns one JSON-ready dict: the spec fields that differ, each variant's
parameters, FLOPs and memory at each sequence length (exactly ``graph.report()``'s numbers),
ratios to the first variant, the parameters by kind (``tfgraph.passes.param_groups``, report's
``params_by_kind``), and the attention/FFN crossover solved from the symbolic FLOP expressions.
The definitions of every figure travel in the dict.

The headline is the work the model does (``tfgraph.passes.effective``): ``flops.forward_effective``
and ``crossover_effective`` count each causal attention over the keys its queries read, so a
sliding window shows; ``flops.forward`` and ``crossover`` are the dense figures (full score
matrices), kept as secondary rows with their meaning unchanged.

Symbols are ``tfgraph report``'s: S is the sequence length (an encoder-decoder's source, with
target T = S here), B the batch; L stays the layer count of report's formulas and is never a
length here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sympy

from tfgraph.passes import cost
from tfgraph.passes.effective import effective
from tfgraph.passes.figures import symbolic
from tfgraph.errors import TfgraphError
from tfgraph.graph.ir import SYMBOLS, Graph, expect_graph
from tfgraph.graph.lengths import Lengths
from tfgraph.passes.param_groups import GROUPING, kind_title, order_kinds, params_by_kind
from tfgraph.passes.report import build_report, check_reportable, positive_int, sizes_for
from tfgraph.prefixes import PARAMS, SI, prefixed
from tfgraph.passes.report import train_activations as report_train_activations

DEFAULT_SEQS = (128, 512, 2048)
# (section, key) of graph.report() shown per length, in display order.
METRICS = (
    ("flops", "forward_effective"),
    ("flops", "forward"),
    ("flops", "matmul_effective"),
    ("flops", "matmul"),
    ("memory", "activations_peak"),
    ("memory", "kv_cache"),
    ("memory", "train_step"),
)

DEFINITIONS = {
    "seq": "sequence length S (report's --seq); encoder-decoder models use source length S "
           "and target length T = S.",
    "flops.forward_effective": "graph.report()['flops']['forward_effective'], the headline: "
                               "the work of one forward pass with each causal attention "
                               "counted over the keys its queries read (Tq*(Tq+1)/2 scores "
                               "under the causal mask, the last W keys with a sliding window "
                               "of W); products and per-score work alike.",
    "flops.forward": "graph.report()['flops']['forward'], dense: matmul + other FLOPs of one "
                     "forward pass over full score matrices (2 FLOPs per multiply-accumulate).",
    "flops.matmul_effective": "graph.report()['flops']['matmul_effective']: flops.matmul with "
                              "causal and sliding-window attention counted as "
                              "flops.forward_effective.",
    "flops.matmul": "graph.report()['flops']['matmul'], dense: every linear (output head "
                    "included) and both attention products over the full score matrix.",
    "memory.activations_peak": "inference activation peak in bytes (liveness over the "
                               "topological order, attention scores materialised).",
    "memory.kv_cache": ("bytes of K and V of every decoder attention for the whole sequence "
                        "(a sliding-window layer's last min(S, window) positions)."),
    "memory.train_step": "bytes of one Adam training step: weights, gradients, two fp32 "
                         "moments (+ fp32 master copy for 16-bit dtypes) and the activation "
                         "peak of forward + backward with the loss (report "
                         "train_activations_peak).",
    "ratio": "value / the first variant's value at the same length (null when that is 0 or "
             "either has no figure).",
    "params_active": "parameters one token uses: a mixture of experts counts its top-k routed "
                     "experts (k/E of the stacked expert weights), its shared experts and "
                     "everything else (report params_active); a dense model all its params.",
    "per_token": "flops.forward / tokens (batch x length; encoder-decoder: batch x target "
                 "length) at each length: 'active' counts each token's top-k experts, "
                 "'all_experts' every expert on every token (report flops.forward_all_experts, "
                 "what the ONNX model computes); equal for dense models.",
    "max_len": "the spec's max_len (null when it has none): the longest sequence it is built "
               "for; the plots mark where each curve passes it.",
    "beyond_max_len": "the length exceeds the spec's max_len (README, 'Lengths beyond "
                      "max_len'). Learned positions: the table has no row past max_len, so "
                      "the model cannot run there and its figures are null (— in the table, "
                      "no point in the plot). Sinusoidal, rotary, relative or no positions: "
                      "the model runs there with its positions extrapolating beyond what it "
                      "was built for, and the figures are the formulas at that length, "
                      "marked extrapolated (†).",
    "extrapolated": "beyond_max_len with positions that are not a learned table: the figures "
                    "(and the model) extrapolate; marked † in the table.",
    "crossover_effective": "the headline crossover: the sequence length S at which "
                           "attention-score FLOPs equal feed-forward FLOPs as in crossover, "
                           "with attention counted as flops.forward_effective (report "
                           "flops_by_kind_effective['attention_scores']: each causal query "
                           "over the keys it reads, a sliding window's last W). Past the "
                           "window a local layer's attention grows like the FFN, linearly in "
                           "S, so a windowed model may have none (null: attention stays "
                           "below the FFN at every S). Solved exactly piece by piece (S <= W, "
                           "S > W).",
    "crossover": "the sequence length S at which attention-score FLOPs "
                 "(flops_by_kind['attention_scores']: QK^T, scaling, masking, softmax and "
                 "weights.V of every attention, all layers, over full score matrices) equal "
                 "feed-forward FLOPs "
                 "(flops_by_kind['ffn']: every FFN sublayer with its norm and residual add); "
                 "above it attention dominates. Solved exactly from the sympy expressions in S "
                 "(with T = S); independent of batch, since both are linear in B. "
                 "first_seq_above is the smallest integer S with attention > FFN.",
    "params_by_kind": "unique parameters by kind of work, exactly report's params_by_kind "
                      "(tfgraph.passes.param_groups.params_by_kind): " + GROUPING,
}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def spec_differences(graphs: Sequence[Graph]) -> list[dict[str, Any]]:
    """Spec fields (dotted paths, derived defaults resolved) whose values are not all equal;
    each with every variant's value (None where a variant has no such field)."""
    flat = [_flatten(g.spec.model_dump(mode="json")) if g.spec else {} for g in graphs]
    keys: dict[str, None] = {}
    for f in flat:
        keys.update(dict.fromkeys(f))
    diffs = []
    for key in keys:
        if key in ("name", "description"):
            continue  # they label the columns
        values = [f.get(key) for f in flat]
        if any(v != values[0] for v in values[1:]):
            diffs.append({"field": key, "values": values})
    return diffs


def _exact(root: sympy.Expr) -> str:
    """``root`` written exactly. ``sympy.nsimplify`` is not exact: it fits a short expression
    to the root's digits, and turned gpt2's rational 11013056/519 into a power of 10 and 7
    equal only to 16 digits; ``simplify`` only rewrites."""
    return str(sympy.simplify(root))


def crossover(graph: Graph, batch: int = 1) -> dict[str, Any]:
    """Where flops_by_kind['attention_scores'] overtakes flops_by_kind['ffn'], solved in the
    sequence length S (an encoder-decoder's target T = S)."""
    kinds = symbolic(graph)["flops_by_kind"]
    # report's S, without its integer assumption (sympy.solve would drop irrational roots)
    length = sympy.Symbol("S", positive=True)
    subs = {SYMBOLS["S"]: length, SYMBOLS["T"]: length, SYMBOLS["B"]: batch}
    att = sympy.expand(sympy.sympify(kinds.get("attention_scores", 0)).xreplace(subs))
    ffn = sympy.expand(sympy.sympify(kinds.get("ffn", 0)).xreplace(subs))
    gap = att - ffn
    # Attention grows as S^2 and the FFN as S, so the gap has one sign change for S > 0;
    # keep the roots where attention passes the FFN going up.
    roots = sorted((r for r in sympy.solve(sympy.Eq(att, ffn), length)
                    if r.is_real and r > 0), key=float)
    rising = [r for r in roots if sympy.diff(gap, length).subs(length, r) > 0]
    out: dict[str, Any] = {
        "attention_scores_flops": str(att),
        "ffn_flops": str(ffn),
        "variable": "S",
    }
    if not rising:
        out.update(seq=None, exact=None, first_seq_above=None)
        return out
    root = rising[0]
    forward = sympy.sympify(symbolic(graph)["flops"]["forward"]).xreplace(subs)
    out.update(seq=float(root), exact=_exact(root),
               first_seq_above=int(sympy.floor(root)) + 1,
               flops_each_at_crossover=float(att.subs(length, root)),
               forward_flops_at_crossover=float(forward.subs(length, root)))
    return out


def crossover_effective(graph: Graph, batch: int = 1) -> dict[str, Any]:
    """Where the effective attention-score FLOPs (``tfgraph.passes.effective``) overtake the
    FFN's, in S (an encoder-decoder's T = S); the keys of ``crossover``.

    A sliding window makes the attention cost piecewise: min(S, W) appears in it, quadratic
    below W and linear above. Each piece is a polynomial, solved exactly on its interval;
    the first root where attention passes the FFN going up is the crossover."""
    kinds = effective(graph)["flops_by_kind"]
    length = sympy.Symbol("S", positive=True)
    subs = {SYMBOLS["S"]: length, SYMBOLS["T"]: length, SYMBOLS["B"]: batch}
    att = sympy.expand(sympy.sympify(kinds.get("attention_scores", 0)).xreplace(subs))
    ffn = sympy.expand(sympy.sympify(kinds.get("ffn", 0)).xreplace(subs))
    out: dict[str, Any] = {"attention_scores_flops": str(att), "ffn_flops": str(ffn),
                           "variable": "S"}
    root = _first_rising_root(att - ffn, length)
    if root is None:
        out.update(seq=None, exact=None, first_seq_above=None)
        return out
    flops = effective(graph)["flops"]["forward_effective"]
    forward = sympy.sympify(flops).xreplace(subs)
    out.update(seq=float(root), exact=_exact(root),
               first_seq_above=int(sympy.floor(root)) + 1,
               flops_each_at_crossover=float(att.subs(length, root)),
               forward_flops_at_crossover=float(forward.subs(length, root)))
    return out


def _first_rising_root(gap: sympy.Expr, length: sympy.Symbol) -> sympy.Expr | None:
    """The smallest S > 0 where ``gap`` (attention - FFN) turns from <= 0 to > 0, with every
    Min(S, W) / Max(S, W) of a sliding window resolved piece by piece between the windows."""
    bends = sorted({float(a) for f in gap.atoms(sympy.Min, sympy.Max) for a in f.args
                    if a.is_number and a > 0})
    edges = [0.0, *bends, float("inf")]
    for lo, hi in zip(edges, edges[1:]):
        probe = lo + 1 if hi == float("inf") else (lo + hi) / 2
        # on (lo, hi] every Min / Max picks the same argument as at the probe
        piece = gap.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)),
                            lambda e: _pick(e, length, probe))
        piece = sympy.expand(piece)
        slope = sympy.diff(piece, length)
        roots = sorted((r for r in sympy.solve(sympy.Eq(piece, 0), length)
                        if r.is_real and lo < r <= hi), key=float)
        for r in roots:
            if slope.subs(length, r) > 0:
                return r
    return None


def _pick(e: sympy.Expr, length: sympy.Symbol, probe: float) -> sympy.Expr:
    """The argument of Min / Max ``e`` that it equals at S = probe."""
    values = [float(a.subs(length, probe)) for a in e.args]
    best = min(values) if isinstance(e, sympy.Min) else max(values)
    return e.args[values.index(best)]


def _ratio(value: int | None, first: int | None) -> float | None:
    """value / first; None when either has no figure (beyond_max_len) or first is 0."""
    return None if value is None or not first else value / first


def measure(graph: Graph, seq: int, batch: int = 1) -> dict[str, int]:
    """The METRICS of graph.report() at one length, keyed 'flops.forward' etc."""
    rep = build_report(graph, batch=batch, seq=seq, tgt_seq=seq)
    return {f"{section}.{key}": rep[section][key] for section, key in METRICS}


def per_token(graph: Graph, seq: int, batch: int = 1) -> dict[str, float]:
    """Forward FLOPs per token at one length: active (each token's top-k experts) and with
    every expert on every token (DEFINITIONS['per_token'])."""
    flops = build_report(graph, batch=batch, seq=seq, tgt_seq=seq)["flops"]
    tokens = batch * seq
    return {"active": flops["forward"] / tokens,
            "all_experts": flops.get("forward_all_experts", flops["forward"]) / tokens}


def series(graph: Graph, lengths: Sequence[int], batch: int = 1) -> dict[str, list[int]]:
    """METRICS plus attention-score and FFN FLOPs at each length, for plots.

    The same expressions and liveness pass ``graph.report()`` evaluates, without building a
    whole report (formulas, roll-ups) per point: a curve has dozens of points.
    """
    sym = symbolic(graph)
    work = effective(graph)
    figures = {"flops": {**sym["flops"], **work["flops"]}, "memory": sym["memory"]}
    exprs = {f"{section}.{key}": figures[section][key] for section, key in METRICS
             if key not in ("activations_peak", "train_step")}
    exprs["flops_by_kind.attention_scores"] = sym["flops_by_kind"].get("attention_scores", 0)
    exprs["flops_by_kind_effective.attention_scores"] = \
        work["flops_by_kind"].get("attention_scores", 0)
    exprs["flops_by_kind.ffn"] = sym["flops_by_kind"].get("ffn", 0)
    out: dict[str, list[int]] = {key: [] for key in [*exprs, "memory.activations_peak",
                                                     "memory.train_step"]}
    for seq in lengths:
        sizes = sizes_for(graph, batch, seq, seq)
        for key, expr in exprs.items():
            out[key].append(int(sympy.sympify(expr).xreplace(sizes)))
        peak = cost.activation_peak(graph, sym["costs"], sizes)
        out["memory.activations_peak"].append(peak.bytes)
        train = report_train_activations(graph, sym, sizes, False)[0]
        out["memory.train_step"].append(int(sym["memory"]["model_states"].xreplace(sizes))
                                        + train)
    return out


def _figures_at(graph: Graph, rule: Lengths | None, seq: int, batch: int) -> dict[str, Any]:
    """values, per_token and the max_len flags of one length (DEFINITIONS beyond_max_len,
    extrapolated): a learned table past its max_len has no figures (None each)."""
    beyond = rule is not None and rule.beyond(seq)
    if rule is not None and not rule.has_figures(seq):
        return {"values": {f"{section}.{key}": None for section, key in METRICS},
                "per_token": {"active": None, "all_experts": None},
                "beyond_max_len": True, "extrapolated": False}
    return {"values": measure(graph, seq, batch), "per_token": per_token(graph, seq, batch),
            "beyond_max_len": beyond, "extrapolated": beyond}


def _flag_crossover(cross: dict[str, Any], rule: Lengths | None) -> dict[str, Any]:
    """The crossover with the flags of its length: past a learned table's max_len the model
    never reaches it (the table shows —; the length stays, as the formulas' answer)."""
    beyond = rule is not None and cross["seq"] is not None and rule.beyond(cross["seq"])
    cross["beyond_max_len"] = beyond
    cross["extrapolated"] = beyond and rule is not None and not rule.learned
    return cross


def compare(graphs: Sequence[Graph], seqs: Sequence[int] = DEFAULT_SEQS,
            batch: int = 1) -> dict[str, Any]:
    """The comparison dict (JSON-ready) of ``graphs``; ratios are to ``graphs[0]``."""
    if isinstance(graphs, (Graph, str, bytes)) or not isinstance(graphs, Sequence):
        raise TfgraphError(f"graphs: expected a list of compiled graphs, got "
                           f"{type(graphs).__name__}")
    if not graphs:
        raise ValueError("compare needs at least one graph")
    for index, graph in enumerate(graphs):
        expect_graph(graph, f"graphs[{index}]")
    if not seqs:
        raise ValueError("compare needs at least one length (seqs)")
    seqs = [positive_int("seqs", s) for s in seqs]  # refused as graph.report(seq=) does
    batch = positive_int("batch", batch)
    for graph in graphs:
        check_reportable(graph)
    variants: list[dict[str, Any]] = []
    for graph in graphs:
        spec = graph.spec
        rule = Lengths.of(spec) if spec else None  # README, "Lengths beyond max_len"
        at: list[dict[str, Any]] = []
        for seq in seqs:
            at.append({"seq": seq, **_figures_at(graph, rule, seq, batch)})
        sym = symbolic(graph)
        variants.append({
            "name": graph.name,
            "arch": spec.arch if spec else None,
            "max_len": spec.max_len if spec else None,
            "params": int(sym["params"]),
            "params_active": int(sym.get("params_active", sym["params"])),
            "params_by_kind": params_by_kind(graph),
            "at": at,
            "crossover_effective": _flag_crossover(crossover_effective(graph, batch), rule),
            "crossover": _flag_crossover(crossover(graph, batch), rule),
        })
    first = variants[0]
    for v in variants:
        v["ratio"] = {"params": _ratio(v["params"], first["params"])}
        for row, base in zip(v["at"], first["at"]):
            row["ratio"] = {k: _ratio(x, base["values"][k]) for k, x in row["values"].items()}
    return {
        "batch": batch,
        "seqs": seqs,
        "baseline": first["name"],
        "differences": spec_differences(graphs),
        "variants": variants,
        "definitions": DEFINITIONS,
    }


# ---- one table for every rendering (rich, markdown, HTML) -----------------------------------

METRIC_TITLES = {
    "flops.forward_effective": "FLOPs forward",
    "flops.forward": "  dense (full scores)",
    "flops.matmul_effective": "FLOPs matmul",
    "flops.matmul": "  dense (full scores)",
    "memory.activations_peak": "activations peak",
    "memory.kv_cache": "KV cache",
    "memory.train_step": "train step memory",
}


def human_count(n: float) -> str:
    """1.24e8 -> ``124.4M``, 2.1e15 -> ``2.1P``: FLOPs (SI prefixes, tfgraph.prefixes)."""
    return prefixed(n, SI)


def human_params(n: float) -> str:
    """1.1e9 -> ``1.1B``: parameter counts (billions as B, tfgraph.prefixes)."""
    return prefixed(n, PARAMS)


def human_bytes(n: float) -> str:
    """Binary units: 307298304 -> ``293.1 MiB``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _with_ratio(text: str, ratio: float | None, first: bool) -> str:
    if first:
        return text
    return f"{text} (×{ratio:.2f})" if ratio is not None else f"{text} (–)"


def length_heading(data: dict[str, Any], seq: int) -> str:
    """The table's section title for one length: ``S = 128, batch 1``; ``S = T = 128`` when an
    encoder-decoder is compared (its target length is S too)."""
    two = any(v.get("arch") == "encoder-decoder" for v in data["variants"])
    return f"{'S = T' if two else 'S'} = {seq}, batch {data['batch']}"


def table_rows(data: dict[str, Any]) -> list[tuple[str, str, list[str]]]:
    """(section, row title, one cell per variant) for the comparison table. Cells after the
    first variant carry the ratio to it; past a spec's max_len a figure is marked '†'
    (extrapolated) or is '—' (a learned table: none), README "Lengths beyond max_len"."""
    variants = data["variants"]
    rows: list[tuple[str, str, list[str]]] = []
    for diff in data["differences"]:
        rows.append(("spec differences", diff["field"],
                     ["—" if v is None else str(v) for v in diff["values"]]))
    rows.append(("parameters", "params",
                 [_with_ratio(human_params(v["params"]), v["ratio"]["params"], i == 0)
                  for i, v in enumerate(variants)]))
    if any(v["params_active"] != v["params"] for v in variants):  # a mixture of experts
        rows.append(("parameters", "params active (per token)",
                     [human_params(v["params_active"]) for v in variants]))
    kinds = order_kinds({k: 0 for v in variants for k in v["params_by_kind"]})
    for kind in kinds:
        counts = [v["params_by_kind"].get(kind, 0) for v in variants]
        rows.append(("parameters", f"  {kind_title(kind)}", [human_params(c) for c in counts]))
    for j, seq in enumerate(data["seqs"]):
        for key, title in METRIC_TITLES.items():
            cells = []
            for i, v in enumerate(variants):
                at = v["at"][j]
                value = at["values"][key]
                if value is None:  # beyond a learned table's max_len: no figure
                    cells.append("—")
                    continue
                text = human_bytes(value) if key.startswith("memory.") else human_count(value)
                text = _with_ratio(text, at["ratio"][key], i == 0)
                cells.append(text + (" †" if at["extrapolated"] else ""))
            rows.append((length_heading(data, seq), title, cells))
        if any(v["params_active"] != v["params"] for v in variants):
            for key, title in (("active", "FLOPs/token active"),
                               ("all_experts", "FLOPs/token all experts")):
                per = [v["at"][j]["per_token"][key] for v in variants]
                rows.append((length_heading(data, seq), title,
                             ["—" if n is None else human_count(n) for n in per]))
    rows.append(("attention vs FFN", "crossover length",
                 [crossover_cell(v["crossover_effective"]) for v in variants]))
    rows.append(("attention vs FFN", "  dense (full scores)",
                 [crossover_cell(v["crossover"]) for v in variants]))
    return rows


def crossover_cell(c: dict[str, Any]) -> str:
    """A crossover as the table shows it: ``S ≈ 3,001.4``, ``none`` (attention never overtakes
    the FFN), ``—`` (past a learned table's max_len: never reached), † when extrapolated."""
    if c["seq"] is None:
        return "none"
    if c.get("beyond_max_len") and not c.get("extrapolated"):
        return "—"
    return f"S ≈ {c['seq']:,.1f}" + (" †" if c.get("extrapolated") else "")


def table_notes(data: dict[str, Any]) -> list[str]:
    """Footnotes that the table's marks and ratios refer to."""
    notes = [f"Ratios (×) are to the first variant, {data['baseline']}.",
             "Sequence length S: " + DEFINITIONS["seq"].split("; ", 1)[1],
             "Parameters by kind (as in tfgraph report): " + GROUPING,
             "FLOPs: the work the model does, each causal attention over the keys its "
             "queries read (a sliding window's last W); 'dense' rows count full score "
             "matrices (report flops.forward).",
             "Crossover length: " + DEFINITIONS["crossover_effective"].split(": ", 1)[1],
             "Crossover, dense row: " + DEFINITIONS["crossover"]]
    notes.extend(max_len_notes(data))
    return notes


def max_len_notes(data: dict[str, Any]) -> list[str]:
    """The notes for † and — (README, "Lengths beyond max_len"), when the table has them."""
    notes = []
    marked = [v for v in data["variants"]
              if any(a["extrapolated"] for a in v["at"]) or v["crossover"].get("extrapolated")
              or v.get("crossover_effective", {}).get("extrapolated")]
    if marked:
        notes.append("†: beyond the max_len of " + _max_lens(marked) + ": sinusoidal, rotary, "
                     "relative or no positions run past it (extrapolating, with a warning); "
                     "the figures are the formulas at that length.")
    refused = [v for v in data["variants"] if any(
        a["beyond_max_len"] and not a["extrapolated"]
        for a in [*v["at"], v["crossover"], v.get("crossover_effective", {})]
        if "beyond_max_len" in a)]
    if refused:
        notes.append("—: beyond the max_len of " + _max_lens(refused) + ": a learned position "
                     "table has no row past it, so the model cannot run there and has no "
                     "figure.")
    return notes


def _max_lens(variants: list[dict[str, Any]]) -> str:
    """``gpt2 (1,024), opt (2,048)``: each variant's name and max_len."""
    return ", ".join(f"{v['name']} ({v['max_len']:,})" for v in variants)
