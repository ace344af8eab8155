"""``tfgraph import PATH [-o SPEC.yaml]``: a Hugging Face config.json (or model folder) as a spec.

The YAML starts with comments naming the source file, its model_type and the checkpoint it
names (``_name_or_path``), then the spec fields the config determines; ``tfgraph validate``
loads it back to the same spec. A config using something tfgraph cannot compute exactly is
exit 2 naming the config field and its value.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
import yaml

from tfgraph.cli_support import say_done
from tfgraph.hf.config import SpecDraft
from tfgraph.terminal import printable


def spec_yaml(path: str, name: str | None = None, notes: list[str] | None = None) -> str:
    """The YAML text ``tfgraph import`` writes for the config at ``path``; what the user
    should know about it (``tfgraph.hf.router_loss``) is appended to ``notes``."""
    from tfgraph.hf import draft_from_config
    from tfgraph.hf.files import read_config, spec_name
    from tfgraph.hf.router_loss import config_notes
    from tfgraph.spec.safe_yaml import Dumper

    data, file = read_config(path)
    model_type = str(data.get("model_type", ""))
    draft = draft_from_config(data, name=name or spec_name(path, model_type),
                              source=os.fspath(file))
    if notes is not None:
        notes.extend(config_notes(data))
    origin = data.get("_name_or_path")
    header = [
        f"Imported by `tfgraph import` from {printable(os.fspath(file))}",
        f"(a Hugging Face config.json, model_type {printable(model_type)}"
        + (f", checkpoint {printable(str(origin))}" if origin else "") + ").",
        f"Every field below is read from that config by tfgraph.hf.{_family_module(model_type)};",
        "fields left out keep tfgraph's defaults (README.md, \"Spec reference\"). Parameter",
        "names map to the checkpoint's with tfgraph.hf.name_map(config).",
        _params_line(draft),
    ]
    body = yaml.dump(draft.data, Dumper=Dumper, sort_keys=False, allow_unicode=True,
                     default_flow_style=None, width=100)
    return "".join(f"# {line}\n" for line in header) + body


def _params_line(draft: SpecDraft) -> str:
    """The header's parameter count; a spec too deep to lower in bounded time is imported
    all the same (the spec is the output), its count left out."""
    import tfgraph
    from tfgraph.limits import MAX_LOWERED_LAYERS

    spec = draft.spec()
    layers = sum(spec.layer_count(stack) for stack in spec.stacks)
    if layers > MAX_LOWERED_LAYERS:
        return (f"Parameters: not counted ({layers:,} layers; tfgraph lowers at most "
                f"{MAX_LOWERED_LAYERS:,}).")
    params = int(tfgraph.compile(spec).report(seq=1)["params"])
    return (f"Parameters: {params:,} (as the checkpoint counts them; fixed tables and "
            "buffers excluded).")


def _family_module(model_type: str) -> str:
    from tfgraph.hf import FAMILIES

    return FAMILIES.get(model_type, "?")


@click.command()
@click.argument("path", metavar="PATH")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the spec here (atomically) instead of to stdout.")
@click.option("--name", help="The spec's name. Default: the output file's stem, else the "
                             "folder's name.")
def hf_import(path: str, output: Path | None, name: str | None) -> None:
    """Convert a Hugging Face config.json (PATH, or a folder with one) to a spec.

    Supported model_types are listed in README.md ("tfgraph import"). Settings tfgraph cannot
    compute exactly are refused, naming the config field and its value (exit 2).
    """
    if name is None and output is not None:
        from tfgraph.hf.files import spec_name

        name = spec_name(output, "")
    notes: list[str] = []
    text = spec_yaml(path, name, notes)
    for note in notes:
        click.echo(f"note: {note}", err=True)
    if output is None:
        click.echo(text, nl=False)
        return
    from tfgraph.io import atomic_path

    with atomic_path(output) as tmp:
        tmp.write_text(text, encoding="utf-8")
    say_done(f"wrote {printable(str(output))}", err=True)


hf_import.name = "import"
