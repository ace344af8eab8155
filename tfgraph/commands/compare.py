"""``tfgraph compare SPEC SPEC...``: variants side by side (README, ``tfgraph compare``).

Default: a rich table (spec differences, params, FLOPs and memory per length with ratios to the
first spec, the attention/FFN crossover). ``--json``: the ``tfgraph.passes.compare.compare`` dict.
``--plot FILE.png|.svg``: FLOPs and memory against length (log-log) and a params breakdown.
``--format md|html``: a report with the table, the plots and each variant's model diagram.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from tfgraph.cli_support import load_spec_arg, say_done
from tfgraph.errors import TfgraphError
from tfgraph.limits import MAX_BATCH, MAX_LENGTH, MAX_LENGTHS, check_at_most
from tfgraph.terminal import printable

PLOT_SUFFIXES = (".png", ".svg")


def parse_seqs(text: str) -> list[int]:
    """``128,512,2048`` -> [128, 512, 2048] (order kept, duplicates dropped); at most
    ``MAX_LENGTHS`` lengths of at most ``MAX_LENGTH`` tokens."""
    items = text.split(",")
    if len(items) > MAX_LENGTHS:
        raise TfgraphError(f"--seq: {len(items):,} lengths; a comparison takes at most "
                           f"{MAX_LENGTHS}")
    out: list[int] = []
    for item in items:
        item = item.strip()
        try:
            value = int(item, 10)
        except ValueError:
            raise TfgraphError(f"--seq: expected comma-separated positive integers, got "
                               f"{text!r}") from None
        if value < 1:
            raise TfgraphError(f"--seq: lengths must be positive, got {value}")
        check_at_most("--seq", value, MAX_LENGTH, "tokens per sequence")
        if value not in out:
            out.append(value)
    return out


def plain(text: object) -> str:
    """A user string for a rich console: one printable line, rich markup (``[bold]``)
    escaped so it prints as written."""
    from rich.markup import escape

    return escape(printable(str(text)))


# A rich table with the default box: one border column before each column and after the last,
# one space of padding either side of every cell.
BORDER, PADDING = 1, 2


def table_width(widths: list[int]) -> int:
    """Columns of a rich table whose columns hold at most ``widths`` cells of text."""
    return sum(w + PADDING + BORDER for w in widths) + BORDER


def column_chunks(title_width: int, widths: list[int], room: int) -> list[list[int]] | None:
    """The variants' columns split into consecutive runs that fit ``room`` columns beside the
    row titles, as few runs as greedily possible; None when one variant alone does not fit."""
    chunks: list[list[int]] = []
    for i, width in enumerate(widths):
        if chunks and table_width([title_width, *(widths[j] for j in chunks[-1]), width]) <= room:
            chunks[-1].append(i)
        elif table_width([title_width, width]) <= room:
            chunks.append([i])
        else:
            return None
    return chunks


def render_table(data: dict[str, Any], console: Console) -> None:
    """Print the comparison as rich tables with their footnotes, never breaking a word or a
    number across lines: every variant side by side when the console is wide enough; else
    the variants in runs that fit, each run a table with the row titles; else (a column wider
    than the console by itself) one line per figure, ``name: value`` under each row title.
    The footnotes wrap between words."""
    from rich.cells import cell_len
    from rich.table import Table

    from tfgraph.passes.compare import table_notes, table_rows

    rows = table_rows(data)
    names = [printable(str(v["name"])) for v in data["variants"]]
    title_width = max(cell_len(printable(t)) for sec, title, _ in rows for t in (sec, title))
    widths = [max(cell_len(names[i]), *(cell_len(printable(cells[i])) for _, _, cells in rows))
              for i in range(len(names))]
    chunks = column_chunks(title_width, widths, console.width)
    if chunks is None:
        _render_stacked(data, rows, names, console)
    for chunk in chunks or []:
        title = f"tfgraph compare (batch {data['batch']})"
        if len(chunks or []) > 1:
            title += (f", variant {chunk[0] + 1} of {len(names)}" if len(chunk) == 1 else
                      f", variants {chunk[0] + 1}\N{EN DASH}{chunk[-1] + 1} of {len(names)}")
        console.print(title)  # above the table, not its title: wraps at the console's width
        table = Table()
        table.add_column("", no_wrap=True, min_width=title_width)
        for i in chunk:
            table.add_column(plain(names[i]), justify="right", no_wrap=True, min_width=widths[i])
        section = None
        for sec, row_title, cells in rows:
            if sec != section:
                if section is not None:
                    table.add_section()
                table.add_row(f"[bold]{plain(sec)}[/bold]", *([""] * len(chunk)))
                section = sec
            table.add_row(plain(row_title), *(plain(cells[i]) for i in chunk))
        console.print(table)
    for note in table_notes(data):
        console.print(plain(note), style="dim")


def _render_stacked(data: dict[str, Any], rows: list[tuple[str, str, list[str]]],
                    names: list[str], console: Console) -> None:
    """One line per figure: the section in bold, each row title, then ``name: value`` per
    variant, indented (for consoles narrower than one variant's column beside the titles)."""
    from rich.cells import cell_len

    console.print(f"[bold]tfgraph compare (batch {data['batch']})[/bold]")
    section = None
    for sec, row_title, cells in rows:
        if sec != section:
            console.print(f"[bold]{plain(sec)}[/bold]")
            section = sec
        console.print(f"  {plain(row_title.strip())}")
        for name, cell in zip(names, cells):
            if cell_len(f"    {name}: {printable(cell)}") <= console.width:
                console.print(f"    {plain(name)}: {plain(cell)}")
            else:  # the value on a line of its own rather than wrapped inside it
                console.print(f"    {plain(name)}:")
                console.print(f"      {plain(cell)}")


def wrote(line: str, err: bool = False, last: bool = False) -> None:
    """A ``wrote`` line; the command's last one ends it successfully (say_done)."""
    if last:
        say_done(line, err=err)
    else:
        click.echo(line, err=err)


@click.command()
@click.argument("specs", nargs=-1, required=True, metavar="SPEC SPEC...")
@click.option("--seq", "seq_text", default="128,512,2048", show_default=True,
              help="Comma-separated sequence lengths (source = target for encoder-decoder), "
                   f"at most {MAX_LENGTHS}.")
@click.option("--batch", type=click.IntRange(min=1, max=MAX_BATCH), default=1,
              show_default=True, help="Batch size the FLOPs and memory are computed at.")
@click.option("--json", "as_json", is_flag=True, help="Print (or write with -o) the dict.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path),
              help="Write FLOPs / memory / params plots to FILE.png or FILE.svg.")
@click.option("--format", "page", type=click.Choice(["md", "html"]),
              help="Write a report page (table, plots, model diagrams).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Output file (default: stdout; build/compare.<md|html> with --format).")
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the --json dict to FILE, beside the table, page or plot.")
def compare(specs: tuple[str, ...], seq_text: str, batch: int, as_json: bool,
            plot: Path | None, page: str | None, output: Path | None,
            json_out: Path | None) -> None:
    """Compare Transformer variants: parameters, FLOPs and memory at each length, ratios to
    the first SPEC, and where attention FLOPs overtake feed-forward FLOPs."""
    if len(specs) < 2:
        raise TfgraphError("compare needs at least two specs")
    if as_json and page:
        raise TfgraphError("--json and --format are exclusive: choose one output")
    if plot is not None and plot.suffix.lower() not in PLOT_SUFFIXES:
        raise TfgraphError(f"--plot {plot}: use a .png or .svg file name")
    from tfgraph.io import check_output

    outputs = [p for p in (plot, output, json_out) if p is not None]
    if len({p.resolve() for p in outputs}) < len(outputs):
        raise TfgraphError("--plot, -o and --json-out name the same file: give each its own")
    seqs = parse_seqs(seq_text)
    parsed = [load_spec_arg(path) for path in specs]  # noted as inputs (tfgraph.io)
    if page and output is None:
        output = Path("build") / f"compare.{page}"
    for path in outputs + ([output] if output is not None and output not in outputs else []):
        check_output(path)  # before anything is compiled, printed or written
    if page == "md":  # its images, in <stem>_files/ (named after the variants)
        from tfgraph.exporters.compare.page import check_page_files

        assert output is not None
        check_page_files(output, [spec.name for spec in parsed])

    import tfgraph
    from tfgraph.passes.compare import compare as compare_graphs
    from tfgraph.io import atomic_write, publish_together

    graphs = [tfgraph.compile(spec) for spec in parsed]
    data = compare_graphs(graphs, seqs=seqs, batch=batch)

    # Every file is written to a temporary next to its target and all of them are published
    # together once the last is ready (tfgraph.io.publish_together): a page without `dot` or
    # an unwritable --plot leaves no --json-out behind. What goes to the terminal (the table,
    # the dict, the "wrote" lines) is said only after that.
    said: list[Any] = []  # (wrote line, to stderr) or a callable printing to stdout
    with publish_together():
        if json_out is not None:
            with atomic_write(json_out) as handle:
                handle.write(json.dumps(data, indent=2) + "\n")
            said.append((f"wrote {printable(str(json_out))}", as_json and output is None))
        if page:
            from tfgraph.exporters.compare.page import write_compare_page

            assert output is not None  # build/compare.<page> by default, checked above
            written = write_compare_page(graphs, data, output, page)
            said.append((f"wrote {', '.join(printable(str(p)) for p in written)}", False))
        elif as_json:
            text = json.dumps(data, indent=2) + "\n"
            if output is None:
                said.append(lambda: click.echo(text, nl=False))
            else:
                with atomic_write(output) as handle:
                    handle.write(text)
                said.append((f"wrote {printable(str(output))}", False))
        else:
            if output is None:
                said.append(lambda: render_table(data, Console()))
            else:
                console = Console(file=io.StringIO(), width=160, record=True)
                render_table(data, console)
                with atomic_write(output) as handle:
                    handle.write(console.export_text())
                said.append((f"wrote {printable(str(output))}", False))
        if plot is not None:
            from tfgraph.exporters.compare.plot import write_compare_plot

            write_compare_plot(graphs, data, plot)
            said.append((f"wrote {printable(str(plot))}", as_json and output is None))
    for item in said:  # the table or the dict first, then the "wrote" lines, last done
        if not isinstance(item, tuple):
            item()
    lines = [item for item in said if isinstance(item, tuple)]
    for i, (line, err) in enumerate(lines):
        wrote(line, err=err, last=i == len(lines) - 1)
