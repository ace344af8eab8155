"""How do time and memory grow with the sequence length, and where does attention overtake the
feed-forward? The complexity notes tfgraph grew from put attention at O(N M d) time and
O(N M) space for N queries and M keys, the feed-forward at O(N d d_ff); this example answers
the question for four pairs of Transformer variants:

    post-norm vs pre-norm        post-norm.yaml vs base.yaml
    MHA vs GQA vs MQA            base.yaml vs gqa.yaml vs mqa.yaml
    dense vs MoE                 base.yaml vs moe.yaml
    full vs sliding window       base.yaml vs window.yaml

Every variant is base.yaml with one change (same width, depth, heads and vocabulary); step 1
checks that. Then the script
  2. prints where attention-score FLOPs overtake feed-forward FLOPs per variant: the crossover
     `tfgraph compare` solves from its symbolic figures over the scores each query reads (its
     headline, `crossover_effective`), recomputed here from the per-op FLOPs of the op graph
     (`tfgraph.graph.serialize`), and beside it the dense crossover (full score matrices),
  3. checks the memory and FLOPs claims of the pairs (GQA/MQA KV cache, sliding window),
  4. writes `tfgraph compare`'s HTML report and plot of the six specs (a subprocess, as a user
     would run it),
  5. times the forward pass of each variant's torch module (`tfgraph.exporters.to_torch`) at a
     few lengths, plots time against tfgraph's predicted FLOPs and fits time = FLOPs / rate.
     `--attention sdpa` (default, the module's own) runs PyTorch's fused attention kernel,
     which skips the score blocks a causal mask hides; `--attention math` computes the whole
     score matrix, exactly the FLOPs tfgraph counts.

Run from the repository root (after the set-up of the top-level README):

    python examples/compare-variants/compare.py            # full run: L = 128 .. 2048 (2 min)
    python examples/compare-variants/compare.py --quick    # seconds: what CI runs

Outputs go to --out (default examples/compare-variants/out/): compare.html and compare.png
(tfgraph compare), compare.json (the same dict as `tfgraph compare --json`), time_vs_flops.png
and summary.json (crossovers, timings, fit, checks; or --json-out FILE). The exit status is 1
when a check fails; the last line says how many checks passed. A bad flag value (--lengths 0,
--repeats 0, --threads 0, or --lengths whose forward pass cannot fit in memory) is one line
on stderr and exit 2, before any work.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import sympy

import tfgraph
from tfgraph.passes.compare import compare
from tfgraph.compiler import CompiledGraph as Graph  # what tfgraph.compile returns
from tfgraph.graph.serialize import graph_dict
from tfgraph.script_args import ArgumentParser, positive_int, positive_ints, run_main

HERE = Path(__file__).resolve().parent

# (spec file, question it answers, spec fields that differ from base.yaml: the only change)
VARIANTS = [
    ("base.yaml", "baseline: pre-norm, MHA, dense FFN, full attention", set()),
    ("post-norm.yaml", "post-norm vs pre-norm", {"norm.position", "norm.final"}),
    ("gqa.yaml", "MHA vs GQA (2 kv heads)", {"attention.kv_heads"}),
    ("mqa.yaml", "MHA vs MQA (1 kv head)", {"attention.kv_heads"}),
    ("moe.yaml", "dense vs MoE (8 experts, top-2)",
     {"ffn.experts", "ffn.top_k", "ffn.router", "ffn.expert_hidden", "ffn.shared_experts",
      "ffn.shared_gate", "ffn.dense_layers", "ffn.router_groups", "ffn.router_top_groups",
      "ffn.router_scale"}),  # the router fields appear with experts
    ("window.yaml", "full vs sliding window (256)", {"attention.window"}),
]
REPORT_SEQS = [128, 512, 2048, 8192]  # lengths of the compare table (figures, not timings)
MAX_LEN = 1 << 24  # tfgraph's largest max_len: a crossover is searched up to here

CHECKS: list[dict[str, Any]] = []


def rel(path: Path) -> str:
    """path relative to the working directory when it is below it (shorter lines)."""
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def check(name: str, ok: bool, detail: str) -> None:
    """Record one success criterion and print it."""
    CHECKS.append({"name": name, "ok": bool(ok), "detail": detail})
    print(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}")


# ---- figures as functions of the length L (batch 1, source = target = L) --------------------

SYMBOLS = {name: sympy.Symbol(name) for name in ("B", "S", "T")}


def parse(text: str) -> sympy.Expr:
    """A formula string of tfgraph (graph JSON, report formulas_bst) in B, S, T. The symbols
    are passed explicitly: plain sympify reads S as sympy's singleton registry."""
    return sympy.sympify(text, locals=SYMBOLS)


def at(expr: sympy.Expr, length: int) -> int:
    """An expression in B, S, T (tfgraph's symbols) at batch 1 and S = T = length."""
    sizes = {"B": 1, "S": length, "T": length}
    return int(expr.xreplace({s: sizes[s.name] for s in expr.free_symbols}))


def kind_flops(graph: Graph) -> dict[str, sympy.Expr]:
    """Attention-score and feed-forward FLOPs summed from the per-op costs of the op graph
    (graph JSON: every op's flops_matmul and flops_other as sympy strings in B, S, T).

    The kinds are those of `tfgraph compare`'s crossover: "attention" is every attention op
    (QK^T, scale, mask, softmax, weights.V), "ffn" every op of an FFN sublayer (its norm and
    residual add included)."""
    sums: dict[str, list[sympy.Expr]] = {"attention": [], "ffn": []}
    for node in graph_dict(graph)["nodes"]:
        cost = node.get("cost", {})
        if "flops_matmul" not in cost:
            continue  # parameters and inputs
        kind = "attention" if node["op"] == "attention" else node["meta"]["sublayer"]
        if kind in ("attention", "ffn"):
            sums[kind].append(parse(cost["flops_matmul"]) + parse(cost["flops_other"]))
    return {k: sympy.Add(*v) for k, v in sums.items()}


def first_above(gap: Callable[[int], int], hi: int = MAX_LEN) -> int | None:
    """Smallest integer L in [1, hi] with gap(L) > 0, or None when gap(hi) <= 0.

    Precondition: gap changes sign at most once on [1, hi], from <= 0 to > 0 (attention grows
    as L^2 or, beyond a window, as L; the FFN as L)."""
    if gap(hi) <= 0:
        return None
    lo = 0  # invariant: gap(lo) <= 0 (or lo = 0), gap(hi) > 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if gap(mid) > 0 else (mid, hi)
    return hi


def crossovers(graph: Graph, data: dict[str, Any]) -> dict[str, Any]:
    """This variant's crossover from `tfgraph compare` and the same recomputed from per-op
    FLOPs: the headline one over the scores each query reads (`crossover_effective`, README
    "tfgraph compare"), and the dense one over full score matrices (`crossover`). None: the
    attention never overtakes the feed-forward (up to MAX_LEN here)."""
    flops = kind_flops(graph)  # per-op sums: every score of every attention op (dense)
    dense = first_above(lambda n: at(flops["attention"], n) - at(flops["ffn"], n))
    # Score work a causal mask (and a window) hides: flops.forward - flops.forward_effective
    # of the report (a causal query reads i + 1 keys; min(i + 1, W) with a window).
    bst = graph.report(seq=8)["formulas_bst"]
    hidden = parse(bst["flops.forward"]) - parse(bst["flops.forward_effective"])
    effective = first_above(lambda n: at(flops["attention"] - hidden, n) - at(flops["ffn"], n))
    variant = next(v for v in data["variants"] if v["name"] == graph.name)
    tf, tf_dense = variant["crossover_effective"], variant["crossover"]
    return {"compare_seq": tf["seq"] if tf else None,
            "compare_first_above": tf["first_seq_above"] if tf else None,
            "direct_first_above": effective,
            "dense_compare_seq": tf_dense["seq"] if tf_dense else None,
            "dense_compare_first_above": tf_dense["first_seq_above"] if tf_dense else None,
            "dense_direct_first_above": dense}


# ---- memory and FLOPs claims of the pairs ---------------------------------------------------

def kv_cache_checks(specs: list[tfgraph.Spec], data: dict[str, Any]) -> None:
    """GQA and MQA cache K and V for kv_heads heads instead of heads: the KV cache of
    `tfgraph compare` is exactly the MHA base's times kv_heads / heads at every length."""
    base = data["variants"][0]  # cv-base, MHA
    for spec, v in zip(specs, data["variants"]):
        heads, kv = spec.attention.heads, spec.attention.kv_heads
        if kv is None or kv == heads:
            continue
        exact = all(row["values"]["memory.kv_cache"] * heads
                    == b["values"]["memory.kv_cache"] * kv for row, b in zip(v["at"], base["at"]))
        check(f"{v['name']} KV cache = MHA x {kv}/{heads}", exact,
              ", ".join(f"L={row['seq']}: {row['values']['memory.kv_cache']:,} B"
                        for row in v["at"]))


def window_checks(specs: list[tfgraph.Spec], graphs: list[Graph], data: dict[str, Any]) -> None:
    """A sliding window of W keys: the scores a query reads (causal-effective matmul FLOPs of
    the report) stop growing at W, so those FLOPs become linear in L beyond W (second
    difference 0) while full attention's stay quadratic; below W both are the same."""
    i = next(i for i, spec in enumerate(specs) if spec.attention.window)
    window = specs[i].attention.window
    assert window is not None
    effective = [parse(graphs[k].report(seq=8)["formulas_bst"]["flops.causal_effective_matmul"])
                 for k in (0, i)]  # base, window

    def second_difference(f: sympy.Expr, n: int) -> int:
        return at(f, n + 2) - 2 * at(f, n + 1) + at(f, n)

    # Every other term of the matmul FLOPs (projections, FFN, head) is linear in L, so the
    # second difference in L sees the score products alone.
    beyond = [window, 2 * window, 8 * window, 64 * window]
    linear = all(second_difference(effective[1], n) == 0 for n in beyond)
    quadratic = all(second_difference(effective[0], n) > 0 for n in beyond)
    same_below = all(at(effective[1], n) == at(effective[0], n) for n in (1, window // 2, window))
    check(f"{graphs[i].name}: attention FLOPs linear beyond the window",
          linear and quadratic and same_below,
          f"causal-effective matmul FLOPs: second difference 0 at L = {beyond} (full "
          f"attention: > 0), equal to full attention up to L = {window}")
    kv = {row["seq"]: row["values"]["memory.kv_cache"] for row in data["variants"][i]["at"]}
    print(f"  {graphs[i].name} KV cache (bytes) by L: {kv}: min(L, {window}) positions")
    dense = [at(kind_flops(graphs[k])["attention"], 2048) for k in (0, i)]
    print(f"  note: the dense attention-score FLOPs (flops_by_kind, flops.forward; README, "
          f"'tfgraph report') count the whole score matrix,\n  window or not: {graphs[i].name} {dense[1]:,} = {graphs[0].name} {dense[0]:,} "
          f"at L = 2048")


# ---- the measured check: forward time of the torch modules ----------------------------------

def check_lengths(graphs: list[Graph], lengths: list[int]) -> None:
    """Refuse (TfgraphError: one line, exit 2) --lengths the timing cannot run: more lengths
    or longer sequences than tfgraph's bounds (tfgraph.limits), or a forward pass whose
    activations (tfgraph's inference peak at batch 1), with every variant's weights held at
    once, need more memory than is available."""
    from tfgraph.limits import MAX_LENGTH, MAX_LENGTHS, check_at_most, check_memory

    check_at_most("--lengths", len(lengths), MAX_LENGTHS, "lengths to time")
    longest = max(lengths)
    check_at_most("--lengths", longest, MAX_LENGTH, "tokens per sequence")
    weights = sum(g.report(seq=1)["memory"]["weights"] for g in graphs)
    for g in graphs:
        peak = g.report(seq=longest)["memory"]["activations_peak"]
        check_memory(f"--lengths {longest} ({g.name}'s forward pass, batch 1)", weights + peak)


def time_forwards(graphs: list[Graph], lengths: list[int], repeats: int,
                  impl: str) -> dict[str, dict[int, float]]:
    """Fastest of `repeats` forward passes (batch 1, inference mode) per variant and length.

    Rounds are interleaved (every length of every variant, then again), so a burst of load
    from other processes hits all points alike; the minimum is the least disturbed run."""
    import torch

    from tfgraph.exporters import to_torch

    modules = {}
    for g in graphs:
        modules[g.name] = to_torch(g, seed=0)
        modules[g.name].attention_impl = impl
    inputs = {n: torch.randint(0, 512, (1, n)) for n in lengths}  # token ids (1, L)
    best = {g.name: {n: float("inf") for n in lengths} for g in graphs}
    with torch.inference_mode():
        for name, module in modules.items():  # warm-up: allocator, kernels
            module(inputs[lengths[0]])
        for _ in range(repeats):
            for name, module in modules.items():
                for n in lengths:
                    start = time.perf_counter()
                    module(inputs[n])  # logits (1, L, vocab)
                    best[name][n] = min(best[name][n], time.perf_counter() - start)
    return best


def fit(flops: list[float], seconds: list[float]) -> dict[str, float]:
    """time = a * FLOPs fitted on log scales, where every point weighs the same whatever its
    size (the points span decades): log t = log a + log F, so a is the geometric mean of
    seconds per FLOP. Also the free log-log slope k (t ~ F^k; 1 when time is proportional to
    FLOPs) and Pearson's r of log t against log F (and of t against F)."""
    import numpy as np

    x, y = np.log(np.asarray(flops, float)), np.log(np.asarray(seconds, float))
    a = float(np.exp(np.mean(y - x)))
    k, c = np.polyfit(x, y, 1)
    return {"seconds_per_flop": a, "gflops_per_s": 1e-9 / a,
            "loglog_slope": float(k), "loglog_intercept": float(c),
            "pearson_r_log": float(np.corrcoef(x, y)[0, 1]),
            "pearson_r": float(np.corrcoef(np.exp(x), np.exp(y))[0, 1])}


def plot_times(path: Path, times: dict[str, dict[int, float]],
               flops: dict[str, dict[int, int]], line: dict[str, float]) -> None:
    """Left: time against length; right: time against predicted FLOPs with the fitted line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5))
    for name, by_len in times.items():
        lengths = sorted(by_len)
        left.plot(lengths, [by_len[n] for n in lengths], "o-", label=name)
        right.plot([flops[name][n] for n in lengths], [by_len[n] for n in lengths], "o",
                   label=name)
    every = sorted(f for by_len in flops.values() for f in by_len.values())
    right.plot(every, [line["seconds_per_flop"] * f for f in every], "k--",
               label=f"time = FLOPs / {line['gflops_per_s']:.1f} GFLOP/s "
                     f"(r = {line['pearson_r_log']:.3f}, log-log)")
    right.plot(every, [math.exp(line["loglog_intercept"]) * f ** line["loglog_slope"]
                       for f in every], "k:", label=f"time ~ FLOPs^{line['loglog_slope']:.2f}")
    for ax, xlabel in ((left, "sequence length L"), (right, "predicted forward FLOPs")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("forward time, batch 1 (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    lengths = sorted({n for by_len in times.values() for n in by_len})
    left.set_xticks(lengths, [str(n) for n in lengths])  # the timed lengths, no minor labels
    left.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    left.set_title("measured forward time (torch module)")
    right.set_title("measured time vs tfgraph's predicted FLOPs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- the example --------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="short lengths and few repeats (seconds; what CI runs)")
    p.add_argument("--out", type=Path, default=HERE / "out", help="output folder")
    p.add_argument("--json-out", type=Path, help="summary JSON (default OUT/summary.json)")
    p.add_argument("--lengths", type=positive_ints, help="comma-separated lengths to time (default 64,256 quick: "
                                     "4x apart, so load from other processes cannot reorder "
                                     "them; 128,256,512,1024,2048 full)")
    p.add_argument("--repeats", type=positive_int, help="timed passes per point (default 3 quick, 5)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads (default 1: on a shared 2-core machine two threads "
                        "wait on each other and times scatter)")
    p.add_argument("--attention", choices=["sdpa", "math"], default="sdpa",
                   help="torch attention: sdpa, the module's default fused kernel (skips "
                        "blocks a causal mask hides); math, the full score matrix, exactly "
                        "the FLOPs tfgraph counts")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    lengths = args.lengths or ([64, 256] if args.quick else [128, 256, 512, 1024, 2048])
    repeats = args.repeats if args.repeats is not None else 3 if args.quick else 5
    paths = [HERE / file for file, _, _ in VARIANTS]
    specs = [tfgraph.load_spec(p) for p in paths]
    graphs = [tfgraph.compile(spec) for spec in specs]
    check_lengths(graphs, lengths)  # before any output or timing
    args.out.mkdir(parents=True, exist_ok=True)
    names = [g.name for g in graphs]

    # `tfgraph compare` writes the report page in the background while the figures are
    # checked; it is waited for before the timings, so it does not disturb the clock.
    html, png = args.out / "compare.html", args.out / "compare.png"
    cmd = [sys.executable, "-m", "tfgraph", "compare", *map(rel, paths),
           "--seq", ",".join(map(str, REPORT_SEQS)), "--plot", rel(png),
           "--format", "html", "-o", rel(html)]
    report_page = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)

    print("1. fair comparisons: each variant is base.yaml with one change")
    data = compare(graphs, seqs=REPORT_SEQS)  # the dict of `tfgraph compare --json`
    (args.out / "compare.json").write_text(json.dumps(data, indent=1) + "\n")
    differs: dict[str, set[str]] = {n: set() for n in names}
    for row in data["differences"]:  # spec fields (derived ones resolved) that differ
        for name, value in zip(names, row["values"]):
            if value != row["values"][0]:
                differs[name].add(row["field"])
    for name, (_, question, expected) in zip(names, VARIANTS):
        check(f"{name} changes only what it compares", differs[name] <= expected,
              f"{question}: {', '.join(sorted(differs[name])) or 'nothing'}")

    print("2. where attention-score FLOPs overtake feed-forward FLOPs (batch 1, S = T = L)")
    print(f"  {'':<14}{'scores each query reads (crossover)':^40}{'dense scores':^28}")
    print(f"  {'variant':<14}{'compare: L*':>12}{'first L above':>15}{'per-op sums':>13}"
          f"{'compare: L*':>13}{'per-op sums':>13}  question")
    cross = {}

    def shown(value: float | int | None, spec: str = "") -> str:
        return "never" if value is None else format(value, spec)

    for g, (_, question, _) in zip(graphs, VARIANTS):
        c = cross[g.name] = crossovers(g, data)
        print(f"  {g.name:<14}{shown(c['compare_seq'], '.1f'):>12}"
              f"{shown(c['compare_first_above']):>15}{shown(c['direct_first_above']):>13}"
              f"{shown(c['dense_compare_seq'], '.1f'):>13}"
              f"{shown(c['dense_direct_first_above']):>13}  {question}")
    print("  crossover: L* solved by `tfgraph compare` (crossover_effective, its headline): "
          "attention-score\n  FLOPs over the keys each query reads (flops_by_kind_effective) "
          "against the FFN's; per-op sums:\n  the same from every op's FLOPs in the graph "
          "JSON, less the score work a causal mask (window)\n  hides; dense scores: over full "
          "score matrices (compare's `crossover`, flops_by_kind)")
    agree = all(c["compare_first_above"] == c["direct_first_above"]
                and c["dense_compare_first_above"] == c["dense_direct_first_above"]
                for c in cross.values())
    check("crossovers agree with per-op FLOPs", agree,
          "tfgraph compare's first L above = the first L where the per-op sums cross, "
          "effective and dense, for every variant")

    print("3. memory and FLOPs claims, from tfgraph's figures")
    kv_cache_checks(specs, data)
    window_checks(specs, graphs, data)

    print("4. tfgraph compare: HTML report and plot")
    print("  $ tfgraph compare " + " ".join(cmd[4:]))
    _, stderr = report_page.communicate()
    page = html.read_text() if report_page.returncode == 0 and html.exists() else ""
    check("compare report", bool(page) and png.exists() and all(n in page for n in names),
          f"{rel(html)} names {sum(n in page for n in names)}/{len(names)} variants"
          + ("" if report_page.returncode == 0
             else f"; exit {report_page.returncode}: {stderr.strip()}"))

    print(f"5. measured: forward time of the torch modules ({args.attention} attention, "
          f"{args.threads} thread(s), fastest of {repeats}), L = {lengths}")
    import torch

    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    times = time_forwards(graphs, lengths, repeats, args.attention)
    flops = {g.name: {n: g.report(seq=n)["flops"]["forward"] for n in lengths} for g in graphs}
    print(f"  timed in {time.perf_counter() - start:.1f} s")
    print(f"  {'variant':<14}" + "".join(f"{f'L={n} (ms)':>13}" for n in lengths)
          + f"{'GFLOP/s at L=' + str(lengths[-1]):>20}")
    for name in names:
        rate = flops[name][lengths[-1]] / times[name][lengths[-1]] / 1e9
        print(f"  {name:<14}" + "".join(f"{times[name][n] * 1e3:>13.1f}" for n in lengths)
              + f"{rate:>20.2f}")
    line = fit([flops[n][k] for n in names for k in lengths],
               [times[n][k] for n in names for k in lengths])
    print(f"  fit over all points: time = FLOPs / ({line['gflops_per_s']:.2f} GFLOP/s), "
          f"{line['seconds_per_flop'] * 1e12:.1f} ps per FLOP\n  Pearson r = "
          f"{line['pearson_r_log']:.4f} (log t vs log FLOPs), {line['pearson_r']:.4f} "
          f"(linear); free log-log slope: time ~ FLOPs^{line['loglog_slope']:.3f}")
    plot = args.out / "time_vs_flops.png"
    plot_times(plot, times, flops, line)
    print(f"  wrote {plot}")
    grows = {n: all(times[n][a] < times[n][b] for a, b in zip(lengths, lengths[1:]))
             for n in names}
    check("measured time increases with length", all(grows.values()),
          ", ".join(n for n, ok in grows.items() if not ok) or f"every variant, L = {lengths}")

    passed = sum(c["ok"] for c in CHECKS)
    summary = {
        "quick": args.quick, "lengths": lengths, "repeats": repeats, "threads": args.threads,
        "attention_impl": args.attention, "html": str(html), "plot": str(png),
        "time_plot": str(plot),
        "variants": [{"name": n, "file": f, "question": q, "crossover": cross[n],
                      "seconds": {str(k): times[n][k] for k in lengths},
                      "flops_forward": {str(k): flops[n][k] for k in lengths}}
                     for n, (f, q, _) in zip(names, VARIANTS)],
        "fit": line, "wall_s": time.perf_counter() - started,
        "checks": CHECKS, "passed": passed == len(CHECKS),
    }
    out_json = args.json_out or args.out / "summary.json"
    out_json.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {out_json}")
    print(f"wall time {time.perf_counter() - started:.1f} s")
    if passed != len(CHECKS):
        failed = [c["name"] for c in CHECKS if not c["ok"]]
        print(f"FAILED: {passed}/{len(CHECKS)} checks passed; failed: {', '.join(failed)}")
        return 1
    print(f"OK: {passed}/{len(CHECKS)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))  # a bad flag: one line on stderr, exit 2
