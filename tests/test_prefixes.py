"""Parameter counts say billions as B (issue 28, item 2): compare's table, report's table, the
diagram's parameter lines and the compare plot's parameter axis; FLOPs keep SI prefixes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

import tfgraph
from tfgraph.cli import main
from tfgraph.passes.compare import compare, human_count, human_params
from tfgraph.prefixes import PARAMS, SI, prefixed

ROOT = Path(__file__).resolve().parent.parent
LLAMA = str(ROOT / "specs" / "llama.yaml")  # TinyLlama-1.1B sizes: 1,100,048,384 parameters


def test_prefix_tables() -> None:
    assert [prefixed(n, PARAMS) for n in (999, 1.5e3, 2.5e6, 1.1e9, 4.05e11, 1.0e12)] == \
        ["999", "1.5k", "2.5M", "1.1B", "405.0B", "1.0T"]
    assert [prefixed(n, SI) for n in (1.1e9, 2e15, 3.4e18)] == ["1.1G", "2.0P", "3.4E"]
    assert prefixed(1536, PARAMS, ".2f", " ", "x") == "1.54 kx"
    assert prefixed(12, SI, ".2f", " ", "FLOP") == "12 FLOP"
    assert human_params(1.1e9) == "1.1B" and human_count(1.1e9) == "1.1G"


def test_compare_and_report_tables_say_billions_as_b() -> None:
    runner = CliRunner()
    out = runner.invoke(main, ["compare", LLAMA, LLAMA, "--seq", "128"], env={"COLUMNS": "160"})
    assert out.exit_code == 0, out.output
    params_row = next(line for line in out.output.splitlines() if "│ params " in line)
    assert "1.1B" in params_row and "G" not in params_row
    flops_row = next(line for line in out.output.splitlines() if "FLOPs forward" in line)
    assert "G" in flops_row or "T" in flops_row  # SI for FLOPs
    rep = runner.invoke(main, ["report", LLAMA], env={"COLUMNS": "160"})
    assert rep.exit_code == 0, rep.output
    row = next(line for line in rep.output.splitlines() if "│ params " in line)
    assert "1.10 B" in row and "1,100,048,384" in row


def test_plot_and_diagram_say_billions_as_b(tmp_path: Path) -> None:
    from matplotlib.figure import Figure

    from tfgraph.exporters.compare.plot import compare_figure
    from tfgraph.exporters.diagram.style import short_count

    assert short_count(1_100_048_384) == "1.1B"
    graphs = [tfgraph.compile(LLAMA)]
    fig = compare_figure(graphs, compare(graphs, seqs=[128, 1024]))
    assert isinstance(fig, Figure)
    fig.canvas.draw()
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    texts += [lab.get_text() for ax in fig.axes for lab in ax.get_xticklabels()]
    assert any(t.strip() == "1.1B" for t in texts)
    params_axis = [lab.get_text() for lab in fig.axes[3].get_xticklabels()]
    assert params_axis and not any(t.endswith("G") for t in params_axis), params_axis
