"""Comparison report pages for ``tfgraph compare --format md|html``.

Both pages carry the same table (``tfgraph.passes.compare.table_rows``), the comparison plot and each
variant's model-level diagram:
- HTML is one self-contained file: the plot and the diagrams are inline SVG;
- Markdown links SVG files written next to it in ``<stem>_files/``.

Everything is rendered in memory first (graphviz and matplotlib), so a missing ``dot`` program
fails before any file is written; the files are then written atomically and published together
(tfgraph.io.publish_together): all of them or none. ``<stem>_files/`` carries the
``.tfgraph-output`` mark, as the folders of ``build --to torch`` do: a later page replaces the
images only in such a folder (or an empty or new one), never in a folder tfgraph did not write
(:func:`check_page_files`, run before any work).

Variant names, spec values and file names come from users, so every such string is escaped for
the page it lands in: ``html_text`` for HTML (``html.escape``: no raw ``<script>``), ``md_text``
for Markdown (HTML-significant characters as entities, Markdown punctuation backslash-escaped,
so a ``|`` cannot add a table column and a backtick cannot open a code span) and ``md_link`` for
link targets. Both first write control characters and line separators as visible escapes
(``tfgraph.terminal.printable``), so a newline cannot end a table row early. The inline SVG is
graphviz's and matplotlib's XML output, which escapes its own text.
"""

from __future__ import annotations

import contextlib
import html
import os
import re
import urllib.parse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import graphviz

from tfgraph.passes.compare import table_notes, table_rows
from tfgraph.errors import TfgraphError
from tfgraph.exporters.compare.plot import compare_figure, figure_bytes
from tfgraph.exporters.diagram.draw import diagram_source, render
from tfgraph.exporters.files.staged_folder import MARKER
from tfgraph.io import (after_publish, atomic_write, check_not_input, check_output_node,
                        publish_together, unless_published)
from tfgraph.graph.ir import Graph
from tfgraph.terminal import printable

CSS = """
body { font-family: Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1250px;
       color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em; }
table.cmp { border-collapse: collapse; font-size: 0.92em; }
table.cmp th, table.cmp td { border: 1px solid #ccd; padding: 3px 9px; }
table.cmp td.num { text-align: right; white-space: nowrap; }
table.cmp tr.section th { background: #eef2f8; text-align: left; }
.figure svg { max-width: 100%; height: auto; }
.diagrams { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
.diagram { flex: 1 1 420px; border: 1px solid #dde; padding: 0.5em; }
.notes { color: #555; font-size: 0.9em; }
dl dt { font-weight: bold; margin-top: 0.4em; } dl dd { margin-left: 1.2em; }
"""


# Markdown punctuation that can start emphasis, code, links, headings, table cells or escapes.
_MD_PUNCTUATION = re.compile(r"([\\`*_{}\[\]()#+!|~])")
_MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}


def html_text(text: object) -> str:
    """Text for an HTML page: one printable line, ``&<>"'`` as entities."""
    return html.escape(printable(str(text)))


def md_text(text: object) -> str:
    """Text for a Markdown page (a table cell, a heading, alt text) that renders as written:
    one printable line, ``&<>`` as entities (no raw HTML), Markdown punctuation escaped."""
    line = printable(str(text))
    line = _MD_PUNCTUATION.sub(r"\\\1", line)
    return "".join(_MD_ENTITIES.get(ch, ch) for ch in line)


def md_link(path: str) -> str:
    """A relative link target, percent-encoded (spaces and parentheses would end it)."""
    return urllib.parse.quote(path, safe="/")


def _svg_body(svg: bytes) -> str:
    """Inline-able SVG: drop the XML prolog and DOCTYPE before ``<svg``."""
    text = svg.decode("utf-8")
    return text[text.index("<svg"):]


def _render_diagrams(graphs: Sequence[Graph]) -> list[bytes]:
    try:
        return [render(diagram_source(g, "model"), "svg") for g in graphs]
    except graphviz.ExecutableNotFound:
        raise TfgraphError("compare --format needs the graphviz 'dot' program for the model "
                           "diagrams (install it: apt-get install graphviz, or brew install "
                           "graphviz); nothing was written") from None


def html_page(graphs: Sequence[Graph], data: dict[str, Any]) -> str:
    """The self-contained HTML report."""
    diagrams = _render_diagrams(graphs)
    plot = figure_bytes(compare_figure(graphs, data), "svg")
    names = [v["name"] for v in data["variants"]]
    esc = html_text
    head = "".join(f"<th>{esc(n)}</th>" for n in names)
    rows, section = [], None
    for sec, title, cells in table_rows(data):
        if sec != section:
            rows.append(f'<tr class="section"><th colspan="{len(cells) + 1}">{esc(sec)}</th></tr>')
            section = sec
        tds = "".join(f'<td class="num">{esc(c)}</td>' for c in cells)
        rows.append(f"<tr><td>{esc(title.strip())}</td>{tds}</tr>")
    notes = "".join(f"<p>{esc(n)}</p>" for n in table_notes(data))
    defs = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in data["definitions"].items())
    blocks = "".join(
        f'<div class="diagram figure"><h3>{esc(n)}</h3>{_svg_body(svg)}</div>'
        for n, svg in zip(names, diagrams))
    title = "tfgraph compare: " + " vs ".join(names)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{esc(title)}</title>
<style>{CSS}</style>
</head>
<body>
<h1>{esc(title)}</h1>
<p>Batch {esc(data['batch'])}; sequence lengths S = {esc(', '.join(str(s) for s in data['seqs']))}
(encoder-decoder: target T = S). Figures are those of <code>tfgraph report</code>.</p>
<h2>Side by side</h2>
<table class="cmp">
<thead><tr><th></th>{head}</tr></thead>
<tbody>
{chr(10).join(rows)}
</tbody>
</table>
<div class="notes">{notes}</div>
<h2>FLOPs, memory and parameters</h2>
<div class="figure">{_svg_body(plot)}</div>
<h2>Architectures (model level)</h2>
<div class="diagrams">{blocks}</div>
<h2>Definitions</h2>
<dl class="notes">{defs}</dl>
</body>
</html>
"""


def markdown_page(data: dict[str, Any], plot_link: str,
                  diagram_links: Sequence[str]) -> str:
    """The Markdown report; images are relative links to the given files."""
    names = [md_text(v["name"]) for v in data["variants"]]
    lengths = md_text(", ".join(str(s) for s in data["seqs"]))
    lines = ["# tfgraph compare: " + " vs ".join(names), "",
             f"Batch {md_text(data['batch'])}; sequence lengths S = {lengths} "
             "(encoder-decoder: target T = S). Figures are those of `tfgraph report`.", "",
             "## Side by side", "",
             "| | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    section = None
    for sec, title, cells in table_rows(data):
        if sec != section:
            lines.append(f"| **{md_text(sec)}** |" + " |" * len(cells))
            section = sec
        lines.append(f"| {md_text(title.strip())} | " + " | ".join(md_text(c) for c in cells)
                     + " |")
    lines += [""] + [f"{md_text(n)}  " for n in table_notes(data)] + [""]
    lines += ["## FLOPs, memory and parameters", "",
              f"![comparison plots]({md_link(plot_link)})", "",
              "## Architectures (model level)", ""]
    for name, link in zip(names, diagram_links):
        lines += [f"### {name}", "", f"![{name} model diagram]({md_link(link)})", ""]
    lines += ["## Definitions", ""]
    lines += [f"- **{md_text(k)}**: {md_text(v)}" for k, v in data["definitions"].items()]
    return "\n".join(lines) + "\n"


def _safe(name: str) -> str:
    """A variant's name as a file name component (anything but [A-Za-z0-9._-] becomes _)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def page_files(path: Path, names: Sequence[str]) -> tuple[Path, list[Path]]:
    """A Markdown page's image folder ``<stem>_files`` and the files it holds: the plot, then
    one diagram per variant (named after the variant: ``1-gpt2-model.svg``)."""
    assets = path.parent / f"{path.stem}_files"
    return assets, [assets / "plot.svg"] + [assets / f"{i + 1}-{_safe(name)}-model.svg"
                                            for i, name in enumerate(names)]


def check_page_files(path: Path | str | os.PathLike[str], names: Sequence[str]) -> None:
    """Refuse (exit 2) a Markdown page whose images cannot be written without harm, before
    any work: ``<stem>_files`` not a folder, an input of the command, or a folder tfgraph did
    not write (not empty and without the mark) -- its files are the user's to keep."""
    assets, files = page_files(Path(path), names)
    if os.path.lexists(assets) and not assets.is_dir():
        raise TfgraphError(f"{printable(str(assets))}: exists and is not a directory; the "
                           "page's images go in that folder: remove it or give -o another name")
    check_not_input(assets)
    if assets.is_dir():
        with os.scandir(assets) as entries:
            empty = next(entries, None) is None
        if not empty and not (assets / MARKER).is_file():
            raise TfgraphError(f"{printable(str(assets))}: a folder tfgraph did not write (no "
                               f"{MARKER}); remove it or give -o another name")
    for file in files:
        check_output_node(file)
        check_not_input(file)


def write_compare_page(graphs: Sequence[Graph], data: dict[str, Any],
                       path: Path | str | os.PathLike[str], fmt: str) -> list[Path]:
    """Write the report as ``fmt`` ("md" or "html"); returns every file written, page last."""
    path = Path(path)
    if fmt == "html":
        text = html_page(graphs, data)
        with atomic_write(path) as handle:
            handle.write(text)
        return [path]
    if fmt != "md":
        raise TfgraphError(f"--format {fmt!r}: choose md or html")
    check_page_files(path, [g.name for g in graphs])
    diagrams = _render_diagrams(graphs)
    plot = figure_bytes(compare_figure(graphs, data), "svg")
    if not path.parent.is_dir():
        raise TfgraphError(f"{path}: directory {path.parent} does not exist")
    assets, names = page_files(path, [g.name for g in graphs])
    files = list(zip(names, [plot, *diagrams]))
    created = not assets.exists()
    marker = assets / MARKER
    marked = marker.exists()

    def restore() -> None:  # nothing was published: the folder as it was
        with contextlib.suppress(OSError):
            if not marked:
                marker.unlink()
            if created:
                assets.rmdir()

    try:
        assets.mkdir(exist_ok=True)
        marker.touch()  # first: a page killed half-way leaves a folder a rerun may replace
        with publish_together():
            for file, content in files:
                with atomic_write(file, "wb") as handle:
                    handle.write(content)
            links = [f"{assets.name}/{f.name}" for f, _ in files]
            with atomic_write(path) as handle:
                handle.write(markdown_page(data, links[0], links[1:]))
            # inside a command's own publish_together (compare's --json-out, --plot) the
            # files are published later, with its other outputs, or never
            unless_published(restore)
            after_publish(lambda: _remove_stale_diagrams(assets, {f.name for f, _ in files}))
    except BaseException:
        restore()
        raise
    return [f for f, _ in files] + [path]


_DIAGRAM = re.compile(r"\d+-.*-model\.svg")
"""The name ``page_files`` gives a variant's diagram."""


def _remove_stale_diagrams(assets: Path, kept: set[str]) -> None:
    """Remove the diagrams an earlier page wrote to this (marked) folder that the new page
    does not link: a page of other variants would otherwise leave them beside its own. Only
    names ``page_files`` makes are touched; anything else in the folder stays."""
    with os.scandir(assets) as entries:
        stale = [e.path for e in entries if e.is_file(follow_symlinks=False)
                 and _DIAGRAM.fullmatch(e.name) and e.name not in kept]
    for file in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(file)
