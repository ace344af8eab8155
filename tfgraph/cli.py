"""The ``tfgraph`` command line (design §6).

Each command lives in its own module under ``tfgraph.commands`` and is registered below with
one ``main.add_command`` line. The error policy lives here, once, for every command:

- :class:`~tfgraph.errors.TfgraphError` (bad spec, bad argument): its one-line message on
  stderr, exit 2;
- click usage errors: click's message, exit 2;
- anything else is a bug: ``tfgraph: internal error: ...`` on stderr, exit 1.

A Python traceback is printed only with ``tfgraph --debug``.
"""

from __future__ import annotations

import traceback
from typing import Any

import click

from tfgraph import __version__
from tfgraph.commands.build import build
from tfgraph.commands.compare import compare
from tfgraph.commands.draw import draw
from tfgraph.commands.report import report
from tfgraph.commands.run import run
from tfgraph.commands.schema import schema
from tfgraph.commands.validate import validate
from tfgraph.errors import TfgraphError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


class _Group(click.Group):
    """A click group that applies tfgraph's error policy to every subcommand."""

    def invoke(self, ctx: click.Context) -> Any:
        debug = bool(ctx.params.get("debug"))
        try:
            return super().invoke(ctx)
        except TfgraphError as exc:
            if debug:
                traceback.print_exc()
            click.echo(str(exc), err=True)
            ctx.exit(exc.exit_code)
        except click.ClickException as exc:
            # Usage errors already exit 2; other click errors (e.g. an unopenable file
            # argument) are the user's to fix too, so they exit 2 rather than 1.
            exc.exit_code = 2
            raise
        except (click.exceptions.Exit, click.Abort, KeyboardInterrupt):
            raise
        except Exception as exc:  # noqa: BLE001 - the one place that turns bugs into exit 1
            if debug:
                traceback.print_exc()
            detail = " ".join(str(exc).split()) or type(exc).__name__
            click.echo(f"tfgraph: internal error: {type(exc).__name__}: {detail}", err=True)
            if not debug:
                click.echo("tfgraph: run with --debug for the traceback", err=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", "-V", prog_name="tfgraph")
@click.option("--debug", is_flag=True, help="Show Python tracebacks for errors.")
def main(debug: bool) -> None:
    """tfgraph: compile declarative Transformer specs (YAML) to graphs, models and reports."""


main.add_command(validate)
main.add_command(schema)
main.add_command(report)
main.add_command(draw)
main.add_command(compare)
main.add_command(build)
main.add_command(run)
