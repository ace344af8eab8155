"""examples/compare-variants/compare.py as CI runs it (``--quick``): exit 0 with every check
passed, the HTML report naming every variant, and crossovers that tfgraph's own report
confirms at L - 1 and L; plus the script's helpers on inputs whose answer is known."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import tfgraph
from tfgraph.passes.compare import compare

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "compare-variants"
SCRIPT = EXAMPLE / "compare.py"


def _script() -> ModuleType:
    """The example script as a module (its name would clash with tfgraph.passes.compare)."""
    spec = importlib.util.spec_from_file_location("compare_variants_example", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quick_run(tmp_path: Path) -> None:
    """One run of the example (a module fixture would run it once per xdist worker), then
    what it reports, section by section."""
    run = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path),
                          "--json-out", str(tmp_path / "result.json")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    summary = json.loads((tmp_path / "result.json").read_text())
    every_check_passed(run.stdout, summary)
    report_page_and_plots_name_every_variant(tmp_path, summary)
    crossovers_are_where_the_report_says(summary)
    readme_states_the_crossovers(summary)
    measured_times_and_fit(summary)


def every_check_passed(stdout: str, summary: dict[str, Any]) -> None:
    checks = summary["checks"]
    assert summary["passed"] and all(c["ok"] for c in checks)
    assert stdout.strip().splitlines()[-1] == f"OK: {len(checks)}/{len(checks)} checks passed"
    names = " ".join(c["name"] for c in checks)
    for criterion in ("compare report", "crossovers agree", "cv-gqa KV cache",
                      "cv-mqa KV cache", "linear beyond the window", "time increases"):
        assert criterion in names
    assert summary["quick"] and summary["lengths"] == [64, 256]


def report_page_and_plots_name_every_variant(out: Path, summary: dict[str, Any]) -> None:
    page = (out / "compare.html").read_text()
    names = [v["name"] for v in summary["variants"]]
    assert names == ["cv-base", "cv-post-norm", "cv-gqa", "cv-mqa", "cv-moe", "cv-window"]
    assert all(name in page for name in names)
    for png in ("compare.png", "time_vs_flops.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def crossovers_are_where_the_report_says(summary: dict[str, Any]) -> None:
    """At the printed first L, report(seq=L) has attention-score FLOPs above the FFN's, and
    report(seq=L - 1) not: over the scores each query reads (flops_by_kind_effective, the
    crossover README defines and `tfgraph compare` heads with) and over dense score
    matrices (flops_by_kind); the pairs answer as the FLOP counts say they must."""
    first: dict[str, dict[str, int | None]] = {"effective": {}, "dense": {}}
    for v in summary["variants"]:
        c = v["crossover"]
        assert c["compare_first_above"] == c["direct_first_above"]
        assert c["dense_compare_first_above"] == c["dense_direct_first_above"]
        graph = tfgraph.compile(tfgraph.load_spec(EXAMPLE / v["file"]))
        for key, kind in (("compare_first_above", "flops_by_kind_effective"),
                          ("dense_compare_first_above", "flops_by_kind")):
            length = c[key]
            if length is None:  # never: still below at a length far past every other
                far = graph.report(seq=1 << 20)[kind]
                assert far["attention_scores"] <= far["ffn"]
                continue
            above = graph.report(seq=length)[kind]
            below = graph.report(seq=length - 1)[kind]
            assert above["attention_scores"] > above["ffn"]
            assert below["attention_scores"] <= below["ffn"]
        first["effective"][v["name"]] = c["compare_first_above"]
        first["dense"][v["name"]] = c["dense_compare_first_above"]
    eff, dense = first["effective"], first["dense"]
    # Norm placement and K/V heads change neither the score work nor the FFN; top-2 of 8
    # experts doubles the FFN work (+ the router), so the MoE crosses about twice as late.
    assert eff["cv-post-norm"] == eff["cv-gqa"] == eff["cv-mqa"] == eff["cv-base"]
    assert dense["cv-window"] == dense["cv-post-norm"] == dense["cv-gqa"] == dense["cv-mqa"] \
        == dense["cv-base"]
    for counted in (eff, dense):
        base, moe = counted["cv-base"], counted["cv-moe"]
        assert base is not None and moe is not None and 2 * base - 10 < moe < 2 * base + 10
    # A causal query reads about half the scores, so ~2x later than dense; a window of 256
    # keys makes the scores read linear in L and never catches a 1024-wide FFN.
    base, dense_base = eff["cv-base"], dense["cv-base"]
    assert base is not None and dense_base is not None
    assert 2 * dense_base - 10 < base < 2 * dense_base + 10
    assert eff["cv-window"] is None


def readme_states_the_crossovers(summary: dict[str, Any]) -> None:
    """README's Examples row gives the crossovers this script prints: over the scores each
    query reads (README's definition, "tfgraph compare"), then the dense ones."""
    readme = (EXAMPLE.parent.parent / "README.md").read_text()
    row = next(line for line in readme.splitlines()
               if line.startswith("| [`examples/compare-variants/`]"))
    c = {v["name"]: v["crossover"] for v in summary["variants"]}
    base, moe = c["cv-base"], c["cv-moe"]
    assert (f"at S ≈ {round(base['compare_seq']):,} (MoE: {round(moe['compare_seq']):,}) over "
            f"the scores each query reads, {round(base['dense_compare_seq']):,} (MoE: "
            f"{round(moe['dense_compare_seq']):,}) over full score matrices") in row, row


def measured_times_and_fit(summary: dict[str, Any]) -> None:
    for v in summary["variants"]:
        seconds = [v["seconds"][str(n)] for n in summary["lengths"]]
        flops = [v["flops_forward"][str(n)] for n in summary["lengths"]]
        assert 0 < seconds[0] < seconds[1] and 0 < flops[0] < flops[1]
    fit = summary["fit"]
    assert fit["gflops_per_s"] > 0 and -1 <= fit["pearson_r"] <= 1


def test_first_above_finds_the_sign_change() -> None:
    first_above = _script().first_above
    assert first_above(lambda n: n * n - 1000 * n) == 1001  # n (n - 1000) > 0 from 1001
    assert first_above(lambda n: n - 1) == 2
    assert first_above(lambda n: 1) == 1
    assert first_above(lambda n: -n) is None  # never above


def test_kv_cache_check_fails_on_a_wrong_ratio() -> None:
    script = _script()
    specs = [tfgraph.load_spec(EXAMPLE / f) for f in ("base.yaml", "gqa.yaml")]
    data = compare([tfgraph.compile(s) for s in specs], seqs=[16, 32])
    script.kv_cache_checks(specs, data)
    assert [c["ok"] for c in script.CHECKS] == [True]
    data["variants"][1]["at"][1]["values"]["memory.kv_cache"] += 1  # one byte off
    script.kv_cache_checks(specs, data)
    assert [c["ok"] for c in script.CHECKS] == [True, False]
