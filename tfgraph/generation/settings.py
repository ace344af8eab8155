"""Generation settings a Hugging Face model folder carries: which tokens end a sequence and
which token starts an encoder-decoder target.

``generation_config.json`` is read before ``config.json``, as transformers' ``generate`` does
(its GenerationConfig is loaded from the former and falls back on the latter). Without either
file (a spec), no token ends a sequence (generation runs to ``max_new_tokens``) and targets start
from token 0 (T5's and the seeds' pad id). Both files are read as untrusted input like the rest
of a folder (tfgraph.hf.files).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfgraph.errors import TfgraphError
from tfgraph.hf.files import inside, read_json
from tfgraph.spec.safe_yaml import MAX_BYTES

FILES = ("generation_config.json", "config.json")
DEFAULT_DECODER_START = 0


@dataclass(frozen=True)
class Settings:
    eos_token_id: tuple[int, ...] = ()
    decoder_start_token_id: int = DEFAULT_DECODER_START


def read_settings(folder: Path | None) -> Settings:
    """The settings of ``folder`` (a model folder, or the folder of an .onnx file)."""
    if folder is None:
        return Settings()
    found: dict[str, Any] = {}
    for name in FILES:
        if not (folder / name).is_file():
            continue
        path = inside(folder, name, "settings file")
        data = read_json(path, MAX_BYTES, name)
        for key in ("eos_token_id", "decoder_start_token_id"):
            if found.get(key) is None and data.get(key) is not None:
                found[key] = (data[key], path)
    eos: tuple[int, ...] = ()
    if "eos_token_id" in found:
        value, path = found["eos_token_id"]
        items = value if isinstance(value, list) else [value]
        eos = tuple(_token(item, path, "eos_token_id") for item in items)
    start = DEFAULT_DECODER_START
    if "decoder_start_token_id" in found:
        value, path = found["decoder_start_token_id"]
        start = _token(value, path, "decoder_start_token_id")
    return Settings(eos, start)


def _token(value: Any, path: Path, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TfgraphError(f"{path}: {key}: {value!r} is not a token id")
    return value
