"""``tfgraph schema``: the JSON Schema of the spec language, for editors and other tools."""

from __future__ import annotations

import json

import click

from tfgraph.spec.schema import Spec


@click.command()
def schema() -> None:
    """Print the JSON Schema of a spec file on stdout.

    Point an editor's YAML language server at it for completion and checking, e.g.
    tfgraph schema > tfgraph.schema.json.
    """
    click.echo(json.dumps(Spec.model_json_schema(), indent=2))
