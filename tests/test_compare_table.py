"""``tfgraph compare``'s table on narrow consoles and pipes (issue 15 item 8) and its symbols
(item 5): at 80 columns no word or number is split across lines, however many variants; the
sequence length is report's S everywhere in compare's output, never L (report's layer count)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import ROOT
from rich.console import Console

import tfgraph
from tfgraph.cli import main
from tfgraph.commands.compare import column_chunks, render_table, table_width
from tfgraph.passes.compare import compare, table_notes, table_rows
from tfgraph.terminal import printable

MIXED = ("tiny-decoder.yaml", "base.yaml", "tiny-moe.yaml")  # the case: enc-dec, MoE
MANY = ("tiny-decoder.yaml", "tiny-llama.yaml", "tiny-seq2seq.yaml", "tiny-moe.yaml",
        "tiny-gemma2.yaml", "tiny-encoder.yaml")
# L alone as a symbol (not "L_enc", not inside a word, not a spec field like "layers")
SYMBOL_L = re.compile(r"(?<![\w.'])L(?![\w'])")


def _data(names: tuple[str, ...], seqs: tuple[int, ...] = (128, 4096)) -> dict:
    graphs = [tfgraph.compile(ROOT / "specs" / n) for n in names]
    return compare(graphs, seqs=seqs)


def _render(data: dict, width: int) -> str:
    buffer = io.StringIO()
    render_table(data, Console(file=buffer, width=width))
    return buffer.getvalue()


def _pieces(data: dict) -> list[str]:
    """Every text the table shows: variant names, section and row titles, cells."""
    out = [printable(v["name"]) for v in data["variants"]]
    for section, title, cells in table_rows(data):
        out += [section, title.strip(), *cells]
    return out


@pytest.mark.parametrize("names", [MIXED, MANY, MIXED[:2]], ids=["three", "six", "two"])
@pytest.mark.parametrize("width", [80, 60])
def test_no_cell_is_split_across_lines(names: tuple[str, ...], width: int) -> None:
    data = _data(names)
    text = _render(data, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    for piece in _pieces(data):
        assert any(piece in line for line in lines), piece
    # the splits, by name
    assert "encoder-dec\n" not in text and "S ≈\n" not in text
    # the footnotes wrap between words: every word of every note appears whole
    words = set(" ".join(lines).split())
    for note in table_notes(data):
        assert set(note.split()) <= words


def test_wide_consoles_keep_every_variant_side_by_side() -> None:
    data = _data(MIXED)
    text = _render(data, 160)
    header = next(line for line in text.splitlines() if "tiny-decoder" in line)
    assert "transformer-base" in header and "tiny-moe" in header
    assert "variants" not in text.splitlines()[0]


def test_column_chunks_fill_the_width_in_order() -> None:
    assert table_width([10, 5]) == 10 + 3 + 5 + 3 + 1
    assert column_chunks(10, [5, 5, 5], 80) == [[0, 1, 2]]
    assert column_chunks(10, [20, 20, 20], 50) == [[0], [1], [2]]  # 14 + 23 + 23 > 50
    assert column_chunks(10, [20, 20, 20], 60) == [[0, 1], [2]]
    assert column_chunks(10, [70], 80) is None  # one column does not fit: stacked


def test_a_column_wider_than_the_console_is_stacked() -> None:
    data = _data(MIXED[:2], seqs=(128,))
    text = _render(data, 30)
    lines = text.splitlines()
    assert "┃" not in text  # no table
    for piece in _pieces(data):
        assert any(piece in line for line in lines), piece


def test_piped_at_80_columns() -> None:
    """The command as `COLUMNS=80 tfgraph compare ... | cat` runs it: not a terminal."""
    paths = [str(ROOT / "specs" / n) for n in MIXED]
    result = CliRunner().invoke(main, ["compare", *paths, "--seq", "128,4096"],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    for piece in _pieces(_data(MIXED)):
        assert any(piece in line for line in lines), piece


def test_the_length_symbol_is_s_in_every_output(tmp_path: Path) -> None:
    """Table, footnotes, JSON (definitions, crossover formulas) and the plot's text: S (and
    T = S for encoder-decoder), never L, which report's formulas use for the layer count."""
    data = _data(MIXED)
    text = _render(data, 200)
    assert not SYMBOL_L.search(text), SYMBOL_L.findall(text)
    assert "S = T = 128, batch 1" in text and "S ≈ 1,335.3" in text
    dumped = json.dumps(data, ensure_ascii=False)
    assert not SYMBOL_L.search(dumped), [dumped[max(0, m.start() - 40):m.end() + 40]
                                         for m in SYMBOL_L.finditer(dumped)]
    assert all(v["crossover"]["variable"] == "S" for v in data["variants"])
    one_stack = _data(("tiny-decoder.yaml", "tiny-llama.yaml"), seqs=(32,))
    assert "S = 32, batch 1" in _render(one_stack, 200)

    from test_diagram import svg_texts

    from tfgraph.exporters.compare.plot import write_compare_plot

    graphs = [tfgraph.compile(ROOT / "specs" / n) for n in MIXED]
    svg = write_compare_plot(graphs, data, tmp_path / "p.svg").read_bytes()
    texts = svg_texts(svg)
    assert not any(SYMBOL_L.search(t) for t in texts), [t for t in texts if SYMBOL_L.search(t)]
