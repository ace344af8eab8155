"""One parameter grouping for ``tfgraph report`` and ``tfgraph compare`` (issue 15 item 3):
the same numbers under the same names in both dicts and both rendered tables, a sublayer's
norms counted with it, and one spec counted by hand."""

from __future__ import annotations

import io
import math
import re

import pytest
from conftest import ROOT
from rich.console import Console

import tfgraph
from tfgraph.commands.compare import render_table
from tfgraph.commands.report import render
from tfgraph.passes.compare import compare, human_count
from tfgraph.passes.param_groups import kind_title, params_by_kind

# decoder-only (learned positions, biases), encoder-decoder, mixture of experts, a parallel
# residual with one shared norm (GPT-J), sandwich norms (Gemma 2), BART's embedding norms,
# per-head q/k norms (Qwen3) and an encoder
SPECS = ("tiny-decoder.yaml", "tiny-seq2seq.yaml", "tiny-moe.yaml", "tiny-gptj.yaml",
         "tiny-gemma2.yaml", "tiny-bart.yaml", "tiny-qwen3.yaml", "tiny-encoder.yaml")


@pytest.fixture(scope="module")
def graphs() -> list[tfgraph.graph.ir.Graph]:
    return [tfgraph.compile(ROOT / "specs" / name) for name in SPECS]


def test_compare_and_report_give_the_same_numbers_under_the_same_names(graphs: list) -> None:
    data = compare(graphs, seqs=(16,))
    for graph, v in zip(graphs, data["variants"]):
        rep = graph.report(seq=16)
        assert v["params_by_kind"] == rep["params_by_kind"], graph.name
        assert list(v["params_by_kind"]) == list(rep["params_by_kind"])  # same order too
        assert sum(v["params_by_kind"].values()) == rep["params"] == v["params"]


def test_the_rendered_tables_agree(graphs: list) -> None:
    """Each kind row of compare's table reads the rounded value of the same-named row of
    report's per-kind table."""
    data = compare(graphs[:3], seqs=(16,))
    buffer = io.StringIO()
    render_table(data, Console(file=buffer, width=250))
    compare_rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
                    for line in buffer.getvalue().splitlines() if line.startswith("│")}
    for i, graph in enumerate(graphs[:3]):
        buffer = io.StringIO()
        render(graph.report(seq=16), graph.name, Console(file=buffer, width=250))
        text = buffer.getvalue()
        kinds_table = text[text.index("Per sublayer kind"):text.index("Formulas")]
        report_rows = {line.split("│")[1].strip(): line.split("│")[2].strip()
                       for line in kinds_table.splitlines() if line.startswith("│")}
        for kind, count in params_by_kind(graph).items():
            title = kind_title(kind)
            assert report_rows[title] == f"{count:,}", (graph.name, title)
            assert compare_rows[title][i] == human_count(count), (graph.name, title)


def test_a_sublayers_norms_count_with_it(graphs: list) -> None:
    """By parameter name (README's parameter table): a sublayer's kind holds every parameter
    under ``layers.N.<sublayer>``: its projections and every norm it owns (``self_attn_norm``,
    a sandwich's ``self_attn_out_norm``, Qwen3's per-head q/k norms), nothing else."""
    for graph in graphs:
        kinds = params_by_kind(graph)
        for sublayer in ("self_attn", "cross_attn", "ffn"):
            named = [p for p in graph.params() if re.search(rf"\.layers\.\d+\.{sublayer}[._]",
                                                            p.name)]
            assert kinds.get(sublayer, 0) == sum(math.prod(p.attrs["shape"]) for p in named)
            if named:
                assert any("norm" in p.name for p in named) or graph.name == "tiny-gptj"
    gptj = graphs[SPECS.index("tiny-gptj.yaml")]  # one norm both parallel branches read
    shared = [p for p in gptj.params() if re.search(r"\.layers\.\d+\.norm\.", p.name)]
    assert shared and params_by_kind(gptj)["layer"] == sum(math.prod(p.attrs["shape"])
                                                           for p in shared)


def test_tiny_decoder_by_hand(graphs: list) -> None:
    """d 48, 4 heads of 12, FFN 192, biases everywhere, pre-norm LayerNorm (gain + bias),
    2 layers, 211 tokens, 64 learned positions, final norm, tied head."""
    d, ff, layers = 48, 192, 2
    assert params_by_kind(graphs[0]) == {
        "embed": 211 * d + 64 * d,
        "self_attn": layers * (4 * (d * d + d) + 2 * d),
        "ffn": layers * ((d * ff + ff) + (ff * d + d) + 2 * d),
        "norm": 2 * d,
    }
