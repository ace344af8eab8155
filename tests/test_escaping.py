"""User strings (a spec's name and description, the node names of a hand-built graph, file
names) reach DOT, Markdown, HTML, matplotlib and the terminal escaped for each: hostile strings
neither add a node, a column or a tag, nor break the file; they show as written.

The spec loader refuses such names (``name`` is ``[a-z0-9][a-z0-9._-]*``), but the API takes
any ``Spec`` object and any hand-built graph, so the exporters escape for themselves.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from conftest import ROOT
from rich.console import Console
from test_diagram import require_binary, svg_texts

import tfgraph
from tfgraph.commands.compare import render_table
from tfgraph.commands.report import render
from tfgraph.passes.compare import compare
from tfgraph.exporters.compare.page import html_page, markdown_page, md_link, md_text
from tfgraph.exporters.compare.plot import write_compare_plot
from tfgraph.exporters.diagram.draw import diagram_source
from tfgraph.graph.ir import B, S, Graph, NodeMeta
from tfgraph.spec.loader import load_spec
from tfgraph.terminal import printable

HOSTILE = [
    'evil"] ; injected [label="pwned',
    "trailing backslash\\",
    "new\nline",
    '"]; node [shape=star]; x [label="',
    "<script>alert(1)</script>",
    "<<B>bold</B>>",
    "\x1b[31mred\x1b[0m",
    "line\u2028separator",
    "port:name",
    "\\N \\G \\L \\n",
    "|pipe| `tick` *star* [link](x)",
    "$x^2$ [red]markup[/red]",
    "undecodable \udcff byte",
]
ALL = " ".join(HOSTILE)
CASES = [*HOSTILE, ALL]


def hostile_graph(name: str, spec: str = "tiny-seq2seq.yaml") -> tfgraph.graph.ir.Graph:
    """A spec whose name and description are ``name``, lowered as ``tfgraph.compile`` does
    but not validated again (compile refuses such a name; the writers must escape whatever
    name a graph has)."""
    from tfgraph.compiler import CompiledGraph
    from tfgraph.graph.lower import lower

    loaded = load_spec(ROOT / "specs" / spec)
    hostile = loaded.model_copy(update={"name": name, "description": name})
    graph = lower(hostile, None, CompiledGraph)
    graph.lint()
    return graph


def hand_built(name: str) -> Graph:
    """A graph built by hand whose every name is ``name``-based."""
    g = Graph(name)
    ids = g.input(f"ids {name}", (B, S))
    table = g.param(f"table {name}", (10, 4), scope=f"scope {name}", init="normal",
                    dtype="float32", meta=NodeMeta(part="embed"))
    out = g.add("embedding", [table, ids], name=f"embed {name}", scope=f"scope {name}",
                meta=NodeMeta(part="embed", stack="decoder", role="tokens"))
    g.set_output(out)
    g.lint()
    return g


# ---- DOT -------------------------------------------------------------------------------------

_STATEMENT = re.compile(r'^\s*("(?:[^"\\]|\\.)*"|[\w.]+)\s*(->\s*("(?:[^"\\]|\\.)*"|[\w.]+))?\s*\[')


def statements(source: str) -> list[tuple[str, str | None]]:
    """(node, None) or (tail, head) of every node and edge statement, one per line."""
    out = []
    for line in source.split("\n"):
        m = _STATEMENT.match(line)
        if m:
            out.append((m.group(1), m.group(3)))
        elif "->" in line:
            out.append(tuple(p.strip() for p in line.split("->", 1)))  # type: ignore[arg-type]
    return out


def _shape(source: str) -> list[tuple[bool, bool]]:
    """Each statement as (is an edge, id is quoted): the drawing's skeleton."""
    return [(head is not None, tail.startswith('"')) for tail, head in statements(source)]


@pytest.mark.parametrize("level", ["model", "layer", "op"])
@pytest.mark.parametrize("name", CASES, ids=range(len(CASES)))
def test_dot_with_a_hostile_spec_name_keeps_its_structure(name: str, level: str) -> None:
    source = diagram_source(hostile_graph(name), level)
    clean = diagram_source(hostile_graph("clean-name"), level)
    # one statement per line, nothing raw that would end a line or act on a terminal
    assert "\u2028" not in source and "\x1b" not in source
    assert len(source.splitlines()) == len(clean.splitlines())
    assert [t for t, _ in statements(source)][1:] == [t for t, _ in statements(clean)][1:]
    assert "injected" not in {t for t, _ in statements(source)}
    assert "star" not in re.sub(r'"(?:[^"\\]|\\.)*"', "", source)  # no attribute outside quotes


@pytest.mark.parametrize("name", CASES, ids=range(len(CASES)))
def test_dot_with_hostile_names_renders_as_written(name: str) -> None:
    require_binary("dot")
    for level in ("model", "layer", "op"):
        source = diagram_source(hostile_graph(name), level)
        clean = diagram_source(hostile_graph("clean-name"), level)
        svgs = []
        for text in (source, clean):
            run = subprocess.run(["dot", "-Tsvg"], input=text.encode(), capture_output=True,
                                 check=False)
            assert run.returncode == 0, run.stderr.decode()
            svgs.append(run.stdout)
        root, clean_root = (ET.fromstring(s) for s in svgs)  # valid XML
        ns = "{http://www.w3.org/2000/svg}"

        def count(tree: ET.Element, cls: str) -> int:
            return sum(1 for g in tree.iter(f"{ns}g") if g.get("class") == cls)

        for cls in ("node", "edge", "cluster"):
            assert count(root, cls) == count(clean_root, cls), (level, cls)
        title = svg_texts(svgs[0])[0]
        assert title.startswith(printable(name)), (title, level)


@pytest.mark.parametrize("name", CASES, ids=range(len(CASES)))
def test_hand_built_graph_names_are_escaped(name: str) -> None:
    graph = hand_built(name)
    for level in ("model", "op"):
        source = diagram_source(graph, level)
        clean = diagram_source(hand_built("plain"), level)
        assert _shape(source) == _shape(clean)
        if shutil.which("dot"):
            run = subprocess.run(["dot", "-Tsvg"], input=source.encode(), capture_output=True,
                                 check=False)
            assert run.returncode == 0, run.stderr.decode()
            texts = " ".join(svg_texts(run.stdout))
            assert printable(f"ids {name}") in texts


# ---- Markdown --------------------------------------------------------------------------------


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"(?<!\\)(?:\\\\)*\|", line))


@pytest.fixture(scope="module")
def hostile_data() -> dict:
    graphs = [hostile_graph(n, "tiny-decoder.yaml") for n in (ALL, "|a|b|", "<script>x")]
    return compare(graphs, seqs=(16,))


def test_markdown_table_rows_keep_their_columns(hostile_data: dict) -> None:
    links = ["a b)_files/plot.svg"] + [f"x/{i}.svg" for i in range(3)]
    text = markdown_page(hostile_data, links[0], links[1:])
    rows = [line for line in text.split("\n") if line.startswith("|")]
    assert rows and all(_unescaped_pipes(r) == 3 + 2 for r in rows), rows
    assert "<script" not in text.lower() and "\x1b" not in text and "\u2028" not in text
    assert "&lt;script&gt;x" in text
    # image links stay whole: no space or parenthesis ends the target early
    assert "![comparison plots](a%20b%29_files/plot.svg)" in text
    assert all(line.count("](") <= 1 for line in text.split("\n"))


def test_md_text_escapes_every_markdown_construct() -> None:
    assert md_text("a|b") == "a\\|b"
    assert md_text("`code`") == "\\`code\\`"
    assert md_text("<b>&") == "&lt;b&gt;&amp;"
    assert md_text("x\ny") == "x\\\\ny"  # the newline shown as \n, never a line break
    assert md_text("[t](u)") == "\\[t\\]\\(u\\)"
    assert md_link("d (1)/p q.svg") == "d%20%281%29/p%20q.svg"


# ---- HTML ------------------------------------------------------------------------------------


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")  # names of 300 characters
def test_html_page_has_no_tag_from_user_text(hostile_data: dict) -> None:
    require_binary("dot")
    graphs = [hostile_graph(n, "tiny-decoder.yaml") for n in (ALL, "|a|b|", "<script>x")]
    page = html_page(graphs, hostile_data)
    assert "<script" not in page.lower()
    assert "\x1b" not in page
    parser = _Tags()
    parser.feed(page)
    assert "script" not in parser.tags and "b" not in parser.tags
    assert "&lt;script&gt;x" in page


# ---- plots and the terminal ---------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:constrained_layout not applied")  # names of 300 characters
def test_plot_draws_names_as_written(tmp_path: Path, hostile_data: dict) -> None:
    graphs = [hostile_graph(n, "tiny-decoder.yaml") for n in (ALL, "|a|b|", "<script>x")]
    out = write_compare_plot(graphs, hostile_data, tmp_path / "p.svg")
    texts = " ".join(svg_texts(out.read_bytes()))  # parses as XML
    assert "$x^2$" in texts and "<script>x" in texts


def test_rich_tables_print_names_as_written(hostile_data: dict) -> None:
    buffer = io.StringIO()
    render_table(hostile_data, Console(file=buffer, width=400))
    text = buffer.getvalue()
    assert "[red]markup[/red]" in text and "\x1b" not in text
    buffer = io.StringIO()
    graph = hostile_graph(ALL, "tiny-decoder.yaml")
    render(graph.report(seq=8), graph.name, Console(file=buffer, width=400))
    text = buffer.getvalue()
    assert "[red]markup[/red]" in text and "\x1b" not in text and "\u2028" not in text
