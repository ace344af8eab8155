"""Reading a Hugging Face ``config.json`` (or a model folder holding one) as untrusted input.

The file is size-limited like a spec (1 MiB; real configs are a few KiB), must be UTF-8 JSON
whose top level is an object, with no duplicate keys and no NaN or Infinity. A folder is read
only within itself: its ``config.json`` may not be a link leading out of it. Every problem is
one :class:`~tfgraph.errors.SpecError` line naming the file (exit 2).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tfgraph.errors import SpecError
from tfgraph.safe_yaml import MAX_BYTES, check_size, decode
from tfgraph.spec import Spec

CONFIG_NAME = "config.json"


def is_config_path(path: str | os.PathLike[str]) -> bool:
    """A folder, or a ``.json`` file: what ``load_spec`` reads as a Hugging Face config."""
    name = os.fspath(path)
    return name.lower().endswith(".json") or Path(name).is_dir()


def config_file(path: str | os.PathLike[str]) -> Path:
    """The config.json ``path`` names: itself, or the one inside the folder ``path``."""
    name = os.fspath(path)
    given = Path(name)
    if not given.exists():
        raise SpecError("no such file or folder", file=name)
    if not given.is_dir():
        return given
    inside = given / CONFIG_NAME
    if not inside.exists():
        raise SpecError(f"is a directory with no {CONFIG_NAME}; expected a spec file or a "
                        "Hugging Face model folder", file=name)
    folder = given.resolve()
    if inside.resolve().parent != folder:
        raise SpecError(f"{CONFIG_NAME} leads outside the folder; refusing to follow it",
                        file=name)
    return inside


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number JSON allows")


def read_config(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Path]:
    """The config mapping and the file it came from."""
    file = config_file(path)
    name = os.fspath(file)
    try:
        if file.is_dir():
            raise SpecError("is a directory, not a config.json", file=name)
        check_size(file.stat().st_size, name)
        with file.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)  # /dev/zero and growing files report size 0
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror or exc}", file=name) from None
    check_size(len(data), name)
    text = decode(data, name)
    try:
        parsed = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise SpecError(f"not valid JSON: {exc.msg}", file=name, line=exc.lineno,
                        col=exc.colno) from None
    except (ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise SpecError(f"not a usable config.json: {detail}", file=name) from None
    if not isinstance(parsed, dict):
        raise SpecError("a config.json holds one JSON object", file=name)
    return parsed, file


def spec_name(path: str | os.PathLike[str], model_type: str) -> str:
    """A spec name from a folder or file name (``Mistral-7B-v0.1`` -> ``mistral-7b-v0.1``)."""
    given = Path(os.fspath(path))
    stem = given.name if given.is_dir() else given.stem
    if stem == "config":
        stem = given.resolve().parent.name
    name = re.sub(r"[^a-z0-9._-]+", "-", stem.lower()).lstrip("._-")[:128]
    return name or model_type.replace("_", "-") or "imported"


def load_config_spec(path: str | os.PathLike[str], name: str | None = None) -> Spec:
    """The spec of the Hugging Face config at ``path`` (a config.json or a model folder)."""
    from tfgraph.hf import spec_from_config

    data, file = read_config(path)
    return spec_from_config(data, name=name or spec_name(path, str(data.get("model_type", ""))),
                            source=os.fspath(file))
