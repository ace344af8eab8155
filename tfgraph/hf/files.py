"""Reading a Hugging Face ``config.json`` (or a model folder holding one) as untrusted input.

The file is size-limited like a spec (1 MiB; real configs are a few KiB), must be UTF-8 JSON
whose top level is an object, with no duplicate keys and no NaN or Infinity. A folder is read
only within itself: its ``config.json`` may not be a link leading out of it. Every problem is
one :class:`~tfgraph.errors.SpecError` line naming the file (exit 2).
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from tfgraph.errors import SpecError, TfgraphError
from tfgraph.spec.safe_yaml import MAX_BYTES
from tfgraph.spec.schema import Spec

CONFIG_NAME = "config.json"


def readable_roots(folder: Path) -> list[Path]:
    """Where the files of model folder ``folder`` may really be: inside it, or, for a
    snapshot of the Hugging Face hub cache (``models--org--name/snapshots/<rev>/``, whose files
    are links to ``../../blobs/<hash>``), in that repository's ``blobs`` folder."""
    real = _resolved(folder, "the folder", folder)
    roots = [real]
    if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
        roots.append(real.parent.parent / "blobs")
    return roots


def inside(folder: Path, name: str, what: str) -> Path:
    """The regular file ``name`` of ``folder``, refusing a name that is a path, a link that
    leads out of the folder (hub-cache blobs excepted: :func:`readable_roots`) and anything
    that is not a regular file (a FIFO or device would block or never end)."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise SpecError(f"{what} {name!r} is not a file name in the folder", file=str(folder))
    path = folder / name
    real = _resolved(path, name, folder)
    if not any(real.is_relative_to(root) for root in readable_roots(folder)):
        raise SpecError(f"{name} leads outside the folder; refusing to follow it",
                        file=str(folder))
    if not path.exists():
        raise SpecError(f"{what} {name} is not in the folder", file=str(folder))
    if not stat.S_ISREG(real.stat().st_mode):
        raise SpecError(f"{name} is not a regular file", file=str(folder))
    return path


def beside(folder: Path, name: str, what: str) -> Path | None:
    """:func:`inside`'s file when ``folder`` has ``name`` (a dangling or outward link counts:
    it is refused, not ignored), else None: the optional files read from next to a model
    (tokenizer.json beside an .onnx file)."""
    path = folder / name
    if not path.exists() and not path.is_symlink():
        return None
    return inside(folder, name, what)


def _resolved(path: Path, name: str, folder: Path) -> Path:
    """``path`` with every link followed; a link that leads back to itself (``ln -s NAME
    DIR/NAME``: Path.resolve raises RuntimeError on Python 3.11, OSError ELOOP on 3.13) is
    refused, naming it."""
    try:
        return path.resolve()
    except RuntimeError:  # Python 3.11's "Symlink loop"
        pass
    except OSError as err:
        if err.errno != errno.ELOOP:
            raise SpecError(f"{name}: cannot read: {err.strerror or err}",
                            file=str(folder)) from None
    raise SpecError(f"{name} is a link that loops back to itself", file=str(folder))


def config_file(path: str | os.PathLike[str]) -> Path:
    """The config.json ``path`` names: itself, or the one inside the folder ``path``."""
    name = os.fspath(path)
    given = Path(name)
    if not given.exists():
        raise SpecError("no such file or folder", file=name)
    if not given.is_dir():
        return given
    if not (given / CONFIG_NAME).exists() and not (given / CONFIG_NAME).is_symlink():
        raise SpecError(f"is a directory with no {CONFIG_NAME}; expected a spec file or a "
                        "Hugging Face model folder", file=name)
    return inside(given, CONFIG_NAME, "config")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a number JSON allows")


def _check_size(size: int, name: str, limit: int, what: str) -> None:
    if size > limit:
        raise SpecError(f"file is larger than {limit >> 20} MiB; too large for a {what}",
                        file=name)


def read_json(file: Path, limit: int, what: str) -> dict[str, Any]:
    """The JSON object in ``file`` (at most ``limit`` bytes, UTF-8, no duplicate keys, no NaN
    or Infinity); one SpecError line naming the file otherwise."""
    from tfgraph.io import note_input

    name = os.fspath(file)
    note_input(file)
    try:
        if file.is_dir():
            raise SpecError(f"is a directory, not a {what}", file=name)
        if not stat.S_ISREG(file.stat().st_mode):  # a FIFO would block open() forever
            raise SpecError(f"not a regular file (a FIFO, a device or a socket); give a {what}",
                            file=name)
        _check_size(file.stat().st_size, name, limit, what)
        with file.open("rb") as handle:
            data = handle.read(limit + 1)  # /dev/zero and growing files report size 0
    except OSError as exc:
        raise SpecError(f"cannot read: {exc.strerror or exc}", file=name) from None
    _check_size(len(data), name, limit, what)
    try:
        text = data.decode("utf-8-sig")  # transformers opens config.json and the index as
    except UnicodeDecodeError as exc:  # UTF-8 (PretrainedConfig._dict_from_json_file)
        raise SpecError(f"not UTF-8 JSON (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                        f"a {what} is UTF-8 JSON", file=name) from None
    try:
        parsed = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                            parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        raise SpecError(f"not valid JSON: {exc.msg}", file=name, line=exc.lineno,
                        col=exc.colno) from None
    except (ValueError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise SpecError(f"not a usable {what}: {detail}", file=name) from None
    if not isinstance(parsed, dict):
        raise SpecError(f"a {what} holds one JSON object", file=name)
    return parsed


def _bounded_int(text: str) -> int:
    """A JSON integer of at most 30 digits: sizes and ids have a few (Python would refuse
    4,300 digits with an error naming sys.set_int_max_str_digits)."""
    if len(text.lstrip("-")) > 30:
        raise ValueError(f"an integer of {len(text.lstrip('-')):,} digits; a config's "
                         "numbers have a few")
    return int(text)


def read_config(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Path]:
    """The config mapping and the file it came from. A folder's generation_config.json is
    checked too (:func:`check_generation_config`): transformers'
    from_pretrained reads both."""
    from tfgraph.io import note_input

    note_input(path)  # a folder given: no output may lie inside it (tfgraph.io)
    file = config_file(path)
    data = read_json(file, MAX_BYTES, CONFIG_NAME)
    if Path(os.fspath(path)).is_dir():
        check_generation_config(Path(os.fspath(path)))
    return data, file


def spec_name(path: str | os.PathLike[str], model_type: str) -> str:
    """A spec name from a folder or file name (``Mistral-7B-v0.1`` -> ``mistral-7b-v0.1``)."""
    # "." or "models/.." name the folder they lead to (abspath: without following links)
    given = Path(os.path.abspath(os.fspath(path)))
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


GENERATION_CONFIG = "generation_config.json"
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def check_generation_config(folder: Path) -> None:
    """Refuse a model folder's ``generation_config.json`` that transformers' from_pretrained
    cannot load (not an object: GenerationConfig.from_dict raises TypeError) or whose token
    ids are not integers, before it is carried into any output (tfgraph build copies it)."""
    path = folder / GENERATION_CONFIG
    if not path.exists() and not path.is_symlink():
        return
    data = read_json(inside(folder, GENERATION_CONFIG, "settings file"), MAX_BYTES,
                     GENERATION_CONFIG)
    for key in TOKEN_KEYS:
        value = data.get(key)
        items = value if isinstance(value, list) and key == "eos_token_id" else [value]
        if value is not None and not all(isinstance(v, int) and not isinstance(v, bool)
                                         for v in items):
            raise TfgraphError(f"{path}: {key}: {value!r} is not a token id (an integer"
                               + (", or a list of them)" if key == "eos_token_id" else ")"))

