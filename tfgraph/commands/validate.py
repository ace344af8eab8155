"""``tfgraph validate SPEC...``: check specs, one summary line each (exit 0 all ok, 2 otherwise)."""

from __future__ import annotations

import traceback

import click

from tfgraph.cli_support import describe, load_spec_arg
from tfgraph.errors import SpecError, TfgraphError
from tfgraph.terminal import one_line, printable


@click.command()
@click.argument("specs", nargs=-1, required=True, metavar="SPEC...")
@click.option("--all-errors", is_flag=True,
              help="Print every error of a spec file, one line each (default: the first and a "
                   "count).")
@click.pass_context
def validate(ctx: click.Context, specs: tuple[str, ...], all_errors: bool) -> None:
    """Validate spec files and print a one-line summary of each.

    Every file is checked even after an error; errors go to stderr, one line each, as
    file:line:col: field.path: what is wrong. Exit status 0 when all are valid, else 2.
    """
    failed = False
    for path in specs:
        try:
            spec = load_spec_arg(path, lowered=False)  # checks any depth, fast
        except TfgraphError as exc:
            # Reported here, not by tfgraph.cli, so that the remaining files are still checked.
            if ctx.find_root().params.get("debug"):
                traceback.print_exc()
            problems: list[Exception] = list(getattr(exc, "problems", None) or [exc])
            shown = [str(p) for p in problems] if all_errors else [str(exc)]
            if not all_errors and not isinstance(exc, SpecError) and len(problems) > 1:
                # a config.json's refusals (tfgraph.hf.draft_from_config); a spec file's
                # SpecError carries this hint in its message already
                others = len(problems) - 1
                shown[0] += (f" [{others} more error{'s' if others > 1 else ''} in this file: "
                             "tfgraph validate --all-errors]")
            for problem in shown:
                click.echo(one_line(printable(problem)), err=True)
            failed = True
            continue
        click.echo(f"{path}: ok \N{EM DASH} {describe(spec)}")
    if failed:
        ctx.exit(2)
