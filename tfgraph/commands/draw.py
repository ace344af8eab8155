"""``tfgraph draw SPEC``: the architecture diagram (graphviz) at model, layer or op level."""

from __future__ import annotations

from pathlib import Path

import click

from tfgraph.cli_support import load_spec_arg, say_done
from tfgraph.errors import TfgraphError
from tfgraph.graph.lengths import check_lengths, default_seq
from tfgraph.limits import MAX_BATCH, MAX_LENGTH
from tfgraph.terminal import printable

LEVELS = ("model", "layer", "op")
SUFFIX_FORMATS = {".svg": "svg", ".png": "png", ".pdf": "pdf", ".dot": "dot", ".gv": "dot"}


def parse_annotate(values: tuple[str, ...]) -> list[str]:
    """``--annotate params --annotate flops`` or ``--annotate params,flops``."""
    out: list[str] = []
    for value in values:
        for item in value.split(","):
            item = item.strip()
            if item not in ("params", "flops"):
                raise TfgraphError(f"--annotate: unknown {item!r}; use params and/or flops")
            if item not in out:
                out.append(item)
    return out


def format_for(path: Path) -> str:
    fmt = SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        suffix = path.suffix or "(no suffix)"
        raise TfgraphError(f"{printable(str(path))}: unknown diagram format {suffix!r}; "
                           "use .svg, .png, .pdf or .dot")
    return fmt


@click.command()
@click.argument("spec", metavar="SPEC")
@click.option("--level", type=click.Choice(LEVELS), default="model", show_default=True,
              help="model: stacks folded; layer: one layer per stack; op: every op.")
@click.option("--unfold", is_flag=True, help="Op level: draw every layer, not just the first.")
@click.option("--annotate", multiple=True, metavar="params|flops",
              help="Add parameter counts and/or FLOP shares to the boxes (repeat or comma-list).")
@click.option("--batch", type=click.IntRange(min=1, max=MAX_BATCH), default=1,
              show_default=True, help="Batch size for --annotate flops.")
@click.option("--seq", type=click.IntRange(min=1, max=MAX_LENGTH), default=None,
              help="Sequence length (source and target) for --annotate flops (default 128, "
                   "or max_len when that is smaller).")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Output file; the suffix picks the format (.svg .png .pdf .dot). "
                   "Default: build/<name>-<level>.svg")
def draw(spec: str, level: str, unfold: bool, annotate: tuple[str, ...], batch: int,
         seq: int | None, output: Path | None) -> None:
    """Draw SPEC's architecture with graphviz.

    Rendering SVG, PNG or PDF needs the graphviz 'dot' program (apt-get install graphviz);
    without it the DOT source is written next to the requested file and the exit status is 2.
    """
    import tfgraph
    from tfgraph.exporters.diagram.draw import write_diagram

    what = parse_annotate(annotate)
    if unfold and level != "op":
        raise TfgraphError(f"--unfold applies to --level op only (not {level})")
    parsed = load_spec_arg(spec)
    if "flops" in what:  # README, "Lengths beyond max_len"
        seq = default_seq(parsed) if seq is None else seq
        check_lengths(parsed, ("--seq", seq))
    if output is None:
        Path("build").mkdir(exist_ok=True)
        output = Path("build") / f"{parsed.name}-{level}.svg"
    fmt = format_for(output)
    from tfgraph.io import check_output

    # Before compiling: a regular file, not an input, in a writable folder (missing folders
    # are created, as for every command's -o: README, "Exit status").
    check_output(output)
    graph = tfgraph.compile(parsed)
    path = write_diagram(graph, output, fmt, level, unfold=unfold, annotate=what,
                         batch=batch, seq=seq)
    say_done(f"wrote {printable(str(path))}")
