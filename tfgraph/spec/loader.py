"""Read, validate and write spec files.

``load_spec`` also reads a Hugging Face ``config.json`` or model folder (``tfgraph.hf``).
``load_spec`` / ``parse_spec`` return a validated :class:`~tfgraph.spec.schema.Spec` or raise one
:class:`~tfgraph.errors.SpecError` whose text is ``file:line:col: field.path: message``.
``dump_spec`` writes YAML that loads back to an equal ``Spec``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml
from pydantic import ValidationError

from tfgraph.errors import SpecError
from tfgraph.spec.safe_yaml import MAX_BYTES, Dumper, check_size, decode, read_document
from tfgraph.spec.schema import Spec
from tfgraph.spec.errors import spec_error


def parse_spec(text: str, filename: str = "<string>") -> Spec:
    """Validate the YAML ``text`` of a spec; errors name ``filename``. ``text`` is a str
    (a file's path or bytes are refused: ``load_spec`` reads a file)."""
    if isinstance(filename, os.PathLike):
        filename = os.fspath(filename)
    if not isinstance(filename, str):
        raise SpecError(f"parse_spec: filename {filename!r}: a str (the name errors show)")
    if not isinstance(text, str):
        what = "a path" if isinstance(text, os.PathLike) else type(text).__name__
        hint = "load_spec(path) reads a file" if isinstance(text, os.PathLike) else \
            "decode bytes first, or load_spec(path) reads a file"
        raise SpecError(f"parse_spec: takes a spec's YAML text (a str), got {what}: {hint}")
    doc = read_document(text, filename)
    try:
        return Spec.model_validate(doc.data)
    except ValidationError as exc:
        raise spec_error(exc, doc, filename, Spec) from None


def read_spec_text(path: str | os.PathLike[str]) -> str:
    """The text of a spec file, refusing what cannot be one before parsing anything."""
    name = os.fspath(path)
    file = Path(name)
    try:
        if not file.exists():
            raise SpecError("no such file", file=name)
        if file.is_dir():
            raise SpecError("is a directory, not a spec file", file=name)
        if not stat.S_ISREG(file.stat().st_mode):  # a FIFO would block open() forever
            raise SpecError("not a regular file (a FIFO, a device or a socket); give a spec "
                            "file", file=name)
        check_size(file.stat().st_size, name)
        with file.open("rb") as handle:
            # Read one byte past the limit: /dev/zero and growing files report size 0.
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror or exc}", file=name) from None
    check_size(len(data), name)
    return decode(data, name)


def load_spec(path: str | os.PathLike[str]) -> Spec:
    """Load and validate the spec at ``path``: a YAML spec file, or a Hugging Face
    ``config.json`` or model folder holding one (converted by ``tfgraph.hf``, README.md
    "tfgraph import")."""
    name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else path
    if not isinstance(name, str):
        hint = " (parse_spec takes YAML text)" if isinstance(name, bytes) else ""
        raise SpecError(f"load_spec: takes a path (a str or os.PathLike naming a spec file, "
                        f"config.json or model folder), got {type(path).__name__}{hint}")
    from tfgraph.io import note_input

    note_input(name)  # no output of this command may be it or lie inside it

    if is_config_path(name):  # tfgraph.hf (and numpy) only for a config: a YAML spec's
        from tfgraph.hf.files import load_config_spec  # commands start faster

        return load_config_spec(name)
    return parse_spec(read_spec_text(name), filename=name)


def is_config_path(path: str | os.PathLike[str]) -> bool:
    """A folder, or a ``.json`` file: what ``load_spec`` reads as a Hugging Face config."""
    name = os.fspath(path)
    return name.lower().endswith(".json") or Path(name).is_dir()


def dump_spec(spec: Spec) -> str:
    """YAML for ``spec`` with every derived default written out (round-trips to ``spec``)."""
    return yaml.dump(
        spec.model_dump(mode="json"),
        Dumper=Dumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
    )
