"""``tfgraph compare`` as a command: table, JSON, plots and the md / html report pages, the HTML
opened in headless Chromium (fails in CI when chromium is missing, skips elsewhere)."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ET
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import ROOT
from matplotlib import image as mpimg
from test_diagram import PNG_SIGNATURE, require_binary, svg_texts

import tfgraph
from tfgraph.cli import main
from tfgraph.passes.compare import compare
from tfgraph.exporters.compare.plot import lengths_for, write_compare_plot

SPECS = [str(ROOT / "specs" / n) for n in ("tiny-decoder.yaml", "tiny-llama.yaml",
                                           "tiny-seq2seq.yaml")]


def run(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(main, ["compare", *args])


def test_json_is_the_compare_dict() -> None:
    result = run(*SPECS[:2], "--seq", "16,64", "--batch", "2", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    graphs = [tfgraph.compile(p) for p in SPECS[:2]]
    assert data == json.loads(json.dumps(compare(graphs, seqs=(16, 64), batch=2)))


def test_default_table_names_variants_and_crossover() -> None:
    result = run(*SPECS, "--seq", "32")
    assert result.exit_code == 0, result.output
    for word in ("tiny-decoder", "tiny-llama", "tiny-seq2seq", "crossover length",
                 "FLOPs forward", "KV cache", "ffn.activation", "Ratios"):
        assert word in result.stdout, word


def test_table_json_to_file(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    assert run(*SPECS[:2], "--json", "-o", str(out)).exit_code == 0
    assert json.loads(out.read_text())["variants"][1]["name"] == "tiny-llama"
    table = tmp_path / "c.txt"
    assert run(*SPECS[:2], "-o", str(table)).exit_code == 0
    assert "crossover length" in table.read_text()


@pytest.mark.parametrize(("args", "words"), [
    ([SPECS[0]], "at least two specs"),
    ([*SPECS[:2], "--seq", "12,x"], "--seq"),
    ([*SPECS[:2], "--seq", "0"], "--seq"),
    ([*SPECS[:2], "--plot", "p.pdf"], ".png or .svg"),
    ([*SPECS[:2], "--json", "--format", "md"], "exclusive"),
    ([SPECS[0], "nope.yaml"], "nope.yaml"),
])
def test_bad_arguments_exit_2_with_one_line(args: list[str], words: str) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert words in result.stderr and result.stderr.count("\n") == 1, result.stderr


def test_plot_png_for_three_variants(tmp_path: Path) -> None:
    out = tmp_path / "plot.png"
    result = run(*SPECS, "--seq", "16,128", "--plot", str(out))
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 50_000
    pixels = mpimg.imread(out)
    assert pixels.shape[0] > 600 and pixels.shape[1] > 900
    assert pixels[..., :3].std() > 0.05  # drawn on, not a blank canvas


def test_plot_svg_has_all_panels_and_the_crossovers(tmp_path: Path) -> None:
    graphs = [tfgraph.compile(p) for p in SPECS[:2]]
    data = compare(graphs, seqs=(16, 128))
    out = write_compare_plot(graphs, data, tmp_path / "plot.svg")
    texts = svg_texts(out.read_bytes())
    joined = " ".join(texts)
    for title in ("Forward FLOPs", "Attention-score (dashed) vs FFN (dotted) FLOPs",
                  "Memory", "Parameters by kind"):
        assert title in joined, title
    for v in data["variants"]:  # crossovers are listed in the legend, in report's symbol S:
        # the headline one (attention over the keys each query reads), then the dense one
        head, dense = v["crossover_effective"]["seq"], v["crossover"]["seq"]
        assert any(f"attention = FFN at S ≈ {head:,.0f}" in t
                   and f"(dense: S ≈ {dense:,.0f})" in t for t in texts)
    assert not any("L≈" in t or "L ≈" in t or "L (" in t for t in texts)
    # the grid spans the requested lengths and every crossover
    grid = lengths_for(data)
    assert grid[0] <= 16 and grid[-1] >= max(v[key]["seq"] for v in data["variants"]
                                             for key in ("crossover", "crossover_effective"))


def test_markdown_page_links_files_that_exist(tmp_path: Path) -> None:
    require_binary("dot")
    page = tmp_path / "cmp.md"
    result = run(*SPECS[:2], "--seq", "32", "--format", "md", "-o", str(page))
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    assert "| | tiny-decoder | tiny-llama |" in text and "crossover length" in text
    links = [line.split("](")[1].rstrip(")") for line in text.splitlines() if "![" in line]
    assert len(links) == 3
    for link in links:
        svg = (tmp_path / link).read_bytes()
        ET.fromstring(svg)  # each linked image is a well-formed SVG
    assert "Decoder × 2" in svg_texts((tmp_path / links[1]).read_bytes())


def test_format_without_dot_writes_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    page = tmp_path / "cmp.html"
    result = CliRunner().invoke(main, ["compare", *SPECS[:2], "--format", "html", "-o",
                                       str(page)], env={"PATH": str(empty)})
    assert result.exit_code == 2
    assert "'dot'" in result.stderr and result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == [empty]


def test_html_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    require_binary("dot")
    chromium = require_binary("chromium")
    page = tmp_path / "cmp.html"
    result = run(*SPECS, "--seq", "16,64", "--format", "html", "-o", str(page))
    assert result.exit_code == 0, result.output
    html = page.read_text(encoding="utf-8")
    assert html.count("<svg") == 4  # the plot and one model diagram per variant
    assert "Encoder × 2" in html and "Decoder × 1" in html

    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
         "--v=0", f"--screenshot={shot}", "--window-size=1200,900", page.as_uri()],
        capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # page errors (script errors, failed loads) are logged as console messages
    console = [line for line in proc.stderr.splitlines() if ":CONSOLE" in line
               or "Uncaught" in line or "net::ERR_" in line]
    assert not console, console
    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.shape[:2] == (900, 1200)
    assert float(np.std(pixels)) > 0.05, "screenshot is blank"
    assert float(pixels.mean()) < 0.99  # text and table lines, not an empty white page


def test_json_out_beside_an_html_page(tmp_path: Path) -> None:
    """Issue 28 item 5: one run writes the HTML page and the JSON dict (--json-out)."""
    from click.testing import CliRunner

    from tfgraph.cli import main

    root = Path(__file__).resolve().parent.parent
    a, b = (str(root / "specs" / n) for n in ("tiny-llama.yaml", "tiny-mistral.yaml"))
    page, data = tmp_path / "c.html", tmp_path / "c.json"
    result = CliRunner().invoke(main, ["compare", a, b, "--seq", "16,32", "--format", "html",
                                       "-o", str(page), "--json-out", str(data)])
    assert result.exit_code == 0, result.output
    assert page.read_text().lstrip().lower().startswith("<!doctype html")
    loaded = json.loads(data.read_text())
    assert [v["name"] for v in loaded["variants"]] == ["tiny-llama", "tiny-mistral"]
    assert loaded["seqs"] == [16, 32]
    same = CliRunner().invoke(main, ["compare", a, b, "--json-out", str(page), "--format",
                                     "html", "-o", str(page)])
    assert same.exit_code == 2 and "same file" in same.output


def test_markdown_images_never_replace_files_tfgraph_did_not_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``<page>_files/`` is replaced only when tfgraph wrote it (its .tfgraph-output mark): a
    folder of the user's, or a file of that name, is refused before anything is compiled, in
    one line; the page's own folder is rewritten in place."""
    require_binary("dot")
    own = tmp_path / "own.md"
    result = run(*SPECS[:2], "--seq", "32", "--format", "md", "-o", str(own))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "own_files" / ".tfgraph-output").is_file()
    (tmp_path / "us_files").mkdir()
    (tmp_path / "us_files" / "plot.svg").write_text("PRECIOUS\n")
    (tmp_path / "q_files").write_text("mine\n")
    import tfgraph as package

    def no_compiling(*args: object, **kwargs: object) -> None:
        raise AssertionError("compiled before the outputs were checked")

    with monkeypatch.context() as patch:
        patch.setattr(package, "compile", no_compiling)
        for stem, words in (("us", "did not write"), ("q", "not a directory")):
            result = run(*SPECS[:2], "--seq", "32", "--format", "md", "-o",
                         str(tmp_path / f"{stem}.md"))
            assert result.exit_code == 2, result.output
            assert words in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert (tmp_path / "us_files" / "plot.svg").read_text() == "PRECIOUS\n"
    assert (tmp_path / "q_files").read_text() == "mine\n"
    assert not (tmp_path / "us.md").exists() and not (tmp_path / "q.md").exists()
    result = run(*SPECS[:2], "--seq", "64", "--format", "md", "-o", str(own))  # its own
    assert result.exit_code == 0, result.output
    assert "64" in own.read_text(encoding="utf-8")


def test_markdown_page_of_other_variants_drops_the_earlier_diagrams(tmp_path: Path) -> None:
    """README: a later page rewrites its ``_files`` folder. The diagrams of variants the new
    page does not show go; a file of the user's in the folder stays."""
    require_binary("dot")
    page = tmp_path / "s.md"
    first = run(SPECS[0], SPECS[1], "--seq", "32", "--format", "md", "-o", str(page))
    assert first.exit_code == 0, first.output
    assets = tmp_path / "s_files"
    before = {p.name for p in assets.glob("*-model.svg")}
    (assets / "notes.txt").write_text("mine\n")
    second = run(SPECS[1], SPECS[2], "--seq", "32", "--format", "md", "-o", str(page))
    assert second.exit_code == 0, second.output
    after = {p.name for p in assets.glob("*-model.svg")}
    linked = set(re.findall(r"s_files/([^)\s]+-model\.svg)", page.read_text(encoding="utf-8")))
    assert after == linked and len(after) == 2
    assert before - after  # the first page's first variant is gone
    assert (assets / "notes.txt").read_text() == "mine\n"


def test_outputs_are_published_together_or_not_at_all(tmp_path: Path) -> None:
    """A page that fails after --json-out is staged (no ``dot``) leaves neither the JSON nor
    the folder the command made; an unwritable --plot (/proc) is refused before any work,
    with nothing printed and nothing made."""
    import os
    import sys

    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}
    base = [sys.executable, "-m", "tfgraph", "compare", *SPECS[:2], "--seq", "16"]
    no_dot = subprocess.run([*base, "--format", "html", "-o", "nd/p.html", "--json-out",
                             "nd/p.json"], cwd=tmp_path, env=env, capture_output=True,
                            text=True)
    if no_dot.returncode == 0:
        pytest.skip("a `dot` program beside the interpreter")
    assert no_dot.returncode == 2 and "wrote" not in no_dot.stdout + no_dot.stderr
    assert list(tmp_path.iterdir()) == []
    if not Path("/proc/self").is_dir():
        return
    proc = subprocess.run([*base, "--json-out", "nd2/p.json", "--plot", "/proc/p.png"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 2 and "/proc/p.png: cannot write" in proc.stderr
    assert proc.stdout == "" and list(tmp_path.iterdir()) == []
