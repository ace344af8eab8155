"""The work the model does is the headline (issue 28 item 1): causal masks and sliding windows
count in report's and compare's FLOPs, in compare's crossover and plot, and the diagrams say
which keys a layer reads; the dense figures stay beside them, their keys' meanings unchanged
(README, "Effective and dense FLOPs": flops.forward counts causal attention dense).

The tiny spec's figures are counted here by hand from the accounting conventions (README,
"Effective and dense FLOPs"), not taken from the code under test.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from conftest import ROOT

import tfgraph
from tfgraph.cli import main
from tfgraph.exporters.diagram.draw import diagram_source
from tfgraph.passes.compare import compare, crossover, crossover_effective

# Two layers, window 3 on the first (local), none on the second (global); 2 heads of 4.
TINY: dict[str, Any] = {
    "name": "tiny-window", "arch": "decoder-only", "d_model": 8, "layers": 2, "vocab": 16,
    "embedding": {"positions": "none", "tie_output": True},
    "attention": {"heads": 2, "head_dim": 4, "bias": False, "window": 3,
                  "window_pattern": ["local", "global"]},
    "ffn": {"hidden": 16, "activation": "relu", "bias": False},
    "norm": {"position": "pre", "kind": "rmsnorm"}, "dropout": 0.0,
}

# By hand at B = 1, S = 5, h = 2, hd = 4:
# - scores read: the global (causal) layer 1 + 2 + 3 + 4 + 5 = 15 per head; the local layer
#   (window 3) min(i + 1, 3) = 1 + 2 + 3 + 3 + 3 = 12 per head; dense 5 * 5 = 25 per head.
# - per score: QK^T 2 * hd = 8 and weights.V 2 * hd = 8 matmul FLOPs; 1 (scaling) + 5
#   (softmax) + 1 (mask) = 7 element-wise FLOPs (README conventions, FLOPS_PER_ELEMENT).
# - effective score matmuls: 16 * 2 heads * (15 + 12) = 864; dense 16 * 2 * 25 * 2 = 1,600;
#   so the dense matmul count is 1,600 - 864 = 736 above the effective one.
# - effective score element-wise work 7 * 2 * 27 = 378; dense 7 * 2 * 50 = 700: 322 above.
# - attention-score FLOPs (flops_by_kind['attention_scores']): effective 864 + 378 = 1,242,
#   dense 1,600 + 700 = 2,300.
HAND = {"matmul_skipped": 736, "other_skipped": 322, "scores_effective": 1242,
        "scores_dense": 2300}


def spec_file(tmp_path: Path, data: dict[str, Any], name: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**data, "name": name}))
    return path


def without_window(data: dict[str, Any]) -> dict[str, Any]:
    att = {k: v for k, v in data["attention"].items() if k not in ("window", "window_pattern")}
    return {**data, "attention": att}


def cli(*args: str) -> str:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False,
                                env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def test_tiny_spec_effective_flops_by_hand() -> None:
    graph = tfgraph.compile(tfgraph.Spec.model_validate(TINY))
    rep = graph.report(batch=1, seq=5)
    f = rep["flops"]
    assert f["matmul"] - f["matmul_effective"] == HAND["matmul_skipped"]
    assert f["other"] - f["other_effective"] == HAND["other_skipped"]
    assert f["forward"] - f["forward_effective"] == HAND["matmul_skipped"] + HAND["other_skipped"]
    assert f["forward_effective"] == f["matmul_effective"] + f["other_effective"]
    assert f["backward_effective"] == 2 * f["forward_effective"]
    assert f["train_step_effective"] == 3 * f["forward_effective"]
    # the existing matmul-only figure is the matmul part of the same count
    assert f["causal_effective_matmul"] == f["matmul_effective"]
    assert rep["flops_by_kind"]["attention_scores"] == HAND["scores_dense"]
    assert rep["flops_by_kind_effective"]["attention_scores"] == HAND["scores_effective"]
    # everything but the attention scores is the dense roll-up
    for kind, value in rep["flops_by_kind"].items():
        if kind != "attention_scores":
            assert rep["flops_by_kind_effective"][kind] == value
    assert "flops.forward_effective" in rep["conventions"]


def test_bidirectional_attention_reads_every_key() -> None:
    graph = tfgraph.compile(ROOT / "specs" / "tiny-encoder.yaml")
    f = graph.report(seq=32)["flops"]
    for key in ("forward", "matmul", "other", "backward", "train_step"):
        assert f[f"{key}_effective"] == f[key]


def test_window_changes_the_headline_not_the_dense_figures() -> None:
    windowed = tfgraph.compile(ROOT / "specs" / "mistral-7b.yaml")
    spec = tfgraph.load_spec(ROOT / "specs" / "mistral-7b.yaml")
    data = without_window(spec.model_dump(mode="json", exclude_none=True))
    dense = tfgraph.compile(tfgraph.Spec.model_validate(data))
    a, b = windowed.report(seq=32768)["flops"], dense.report(seq=32768)["flops"]
    assert a["forward"] == b["forward"]  # the dense count ignores the window
    assert a["forward_effective"] < b["forward_effective"] < b["forward"]
    # every layer local: attention over 4096 keys past the window, so the headline crossover
    # goes away while the dense one (S ≈ 21,219.8) is the same for both
    assert crossover_effective(windowed)["seq"] is None
    assert crossover(windowed)["seq"] == crossover(dense)["seq"] == pytest.approx(21219.8,
                                                                                abs=0.1)
    assert crossover_effective(dense)["seq"] == pytest.approx(42438.5, abs=0.1)


def _scores_minus_ffn(graph: Any, seq: int) -> int:
    kinds = graph.report(seq=seq)["flops_by_kind_effective"]
    return kinds["attention_scores"] - kinds["ffn"]


@pytest.mark.parametrize("pattern", [["local", "global"], ["local"]])
def test_effective_crossover_is_where_the_reports_cross(pattern: list[str]) -> None:
    """The piecewise solution against the report itself: attention <= FFN one token before
    first_seq_above, > at it (mixed layers); all-local layers with a small window never
    overtake the FFN, which the report confirms far past the window."""
    data = {**TINY, "attention": {**TINY["attention"], "window_pattern": pattern}}
    graph = tfgraph.compile(tfgraph.Spec.model_validate(data))
    c = crossover_effective(graph)
    if pattern == ["local"]:
        assert c["seq"] is None and c["first_seq_above"] is None
        assert all(_scores_minus_ffn(graph, s) < 0 for s in (1, 3, 4, 100, 10_000))
        return
    first = c["first_seq_above"]
    assert first > 3  # past the window: the linear piece of the local layer counts
    # By hand past the window (23 FLOPs per score as above, 2 heads): the global layer reads
    # S(S+1)/2 scores per head, 23 * S * (S + 1); the local one 1 + 2 + 3(S - 2) = 3S - 3,
    # 46 * (3S - 3). Attention 23 S^2 + 161 S - 138 equals the FFN's f * S (linear in S:
    # f = its FLOPs at S = 1) at the positive root of 23 S^2 + (161 - f) S - 138.
    f = graph.report(seq=1)["flops_by_kind"]["ffn"]
    root = ((f - 161) + math.sqrt((f - 161) ** 2 + 4 * 23 * 138)) / 46
    assert c["seq"] == pytest.approx(root, rel=1e-12)
    assert _scores_minus_ffn(graph, first - 1) <= 0 < _scores_minus_ffn(graph, first)
    assert c["seq"] != crossover(graph)["seq"]


def test_compare_headline_rows_and_crossover(tmp_path: Path) -> None:
    windowed = spec_file(tmp_path, TINY, "win")
    plain = spec_file(tmp_path, without_window(TINY), "nowin")
    graphs = [tfgraph.compile(p) for p in (plain, windowed)]
    data = compare(graphs, seqs=(64,))
    no, yes = (v["at"][0]["values"] for v in data["variants"])
    assert no["flops.forward"] == yes["flops.forward"]
    assert yes["flops.forward_effective"] < no["flops.forward_effective"]
    cross = [v["crossover_effective"]["seq"] for v in data["variants"]]
    assert cross[0] != cross[1]
    assert data["variants"][0]["crossover"]["seq"] == data["variants"][1]["crossover"]["seq"]
    assert "crossover_effective" in data["definitions"]

    table = cli("compare", str(plain), str(windowed), "--seq", "64")
    lines = table.splitlines()
    forward = next(i for i, line in enumerate(lines) if "FLOPs forward" in line)
    assert "dense (full scores)" in lines[forward + 1]  # the dense figure right below
    crossing = next(line for line in lines if "crossover length" in line)
    for c in cross:
        assert f"S ≈ {c:,.1f}" in crossing

    out = tmp_path / "cmp.json"
    cli("compare", str(plain), str(windowed), "--seq", "64", "--json-out", str(out))
    written = json.loads(out.read_text())
    assert [v["crossover_effective"]["seq"] for v in written["variants"]] == cross


def test_report_text_leads_with_the_work_done(tmp_path: Path) -> None:
    text = cli("report", str(spec_file(tmp_path, TINY, "win")), "--seq", "5")
    lines = text.splitlines()
    rows = [line for line in lines if "flops." in line and "│" in line]
    assert "flops.forward_effective" in rows[0]
    assert any("flops.forward (dense)" in line for line in rows)
    assert rows.index(next(r for r in rows if "flops.forward (dense)" in r)) > 0
    assert "of the dense" in text
    data = json.loads(cli("report", str(spec_file(tmp_path, TINY, "win")), "--seq", "5",
                          "--json"))
    dense = json.loads(cli("report", str(spec_file(tmp_path, without_window(TINY), "nowin")),
                           "--seq", "5", "--json"))
    assert data["flops"]["forward"] == dense["flops"]["forward"]
    assert dense["flops"]["forward_effective"] - data["flops"]["forward_effective"] == \
        2 * 4 * 4 * (15 - 12) + 7 * 2 * (15 - 12)  # the local layer reads 3 scores fewer


def test_diagrams_say_which_keys_a_layer_reads() -> None:
    graph = tfgraph.compile(tfgraph.Spec.model_validate(TINY))
    layer = diagram_source(graph, "layer")
    assert "sliding window 3 on local layers, global on the others" in layer
    assert "layers: local, global" in layer
    assert "window 3" in diagram_source(graph, "op")
    assert "sliding window 3: 1 local, 1 global layer" in diagram_source(graph, "model")
    every = tfgraph.compile(ROOT / "specs" / "tiny-mistral.yaml")
    assert "sliding window 8 in every layer" in diagram_source(every, "layer")
    plain = tfgraph.compile(tfgraph.Spec.model_validate({**without_window(TINY),
                                                        "name": "tiny-full"}))
    for level in ("model", "layer", "op"):
        assert "window" not in diagram_source(plain, level)
