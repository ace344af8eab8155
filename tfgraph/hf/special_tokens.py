"""The tokens a model folder's tokenizer files name as special, which transformers' decode skips.

transformers 5.24's ``AutoTokenizer.from_pretrained`` (``PreTrainedTokenizerBase._from_pretrained``
and ``__init__``, ``TokenizersBackend._post_init``) registers as special tokens of the backend
tokenizer, beyond those ``tokenizer.json`` marks special itself:

- the named ones of ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ``unk_token``,
  ``sep_token``, ``pad_token``, ``cls_token``, ``mask_token``), its other ``*_token`` keys
  holding a string (model-specific tokens such as ``image_token``), its
  ``extra_special_tokens`` (a list, or a mapping of names to tokens) or, without them, its
  ``additional_special_tokens``;
- the entries of its ``added_tokens_decoder`` marked ``"special": true``;
- when it has no ``added_tokens_decoder`` (the legacy layout), the same keys of
  ``special_tokens_map.json``, which override the config's.

so ``decode(ids, skip_special_tokens=True)`` leaves them all out. A token is a string or an
``AddedToken`` object (``{"content": ...}``). Tokens the vocabulary does not hold have no id a
model could generate and are ignored (transformers would append them to the vocabulary). The
special tokens a tokenizer class has by default, named in neither file, are not known here.
Both files are read as untrusted input (tfgraph.hf.tokenizer.side_json); a value of the wrong
kind is one error line, as transformers refuses it (TypeError).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfgraph.errors import TfgraphError
from tfgraph.hf.tokenizer import side_json

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CONFIG = "tokenizer_config.json"
MAP = "special_tokens_map.json"
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
         "mask_token")  # PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES


def special_ids(tokenizer_json: Path, tokenizer: Tokenizer) -> frozenset[int]:
    """The ids of the tokens named special by the files beside ``tokenizer_json``."""
    ids = set()
    for content in special_contents(tokenizer_json.parent):
        token = tokenizer.token_to_id(content)
        if token is not None:
            ids.add(token)
    return frozenset(ids)


def special_contents(folder: Path) -> list[str]:
    """The special tokens (their text) that ``folder``'s tokenizer_config.json and
    special_tokens_map.json name (the module docstring)."""
    config = side_json(folder, CONFIG) or {}
    found: list[str] = []
    decoder = config.get("added_tokens_decoder")
    if decoder is not None:
        if not isinstance(decoder, dict):
            raise TfgraphError(f"{folder / CONFIG}: added_tokens_decoder: not an object of "
                               "id: token")
        for key, entry in decoder.items():
            if not isinstance(entry, dict):
                raise TfgraphError(f"{folder / CONFIG}: added_tokens_decoder: {key}: not a "
                                   "token object")
            if entry.get("special") is True:
                found.append(_content(entry, folder / CONFIG, f"added_tokens_decoder: {key}"))
    settings = {key: (value, folder / CONFIG) for key, value in config.items()}
    _additional_as_extra(settings, lambda extra: not extra)
    legacy = side_json(folder, MAP) if decoder is None else None
    if legacy is not None:  # the legacy layout: special_tokens_map.json's keys win
        for key, value in legacy.items():
            if key == "extra_special_tokens" and isinstance(value, list):
                before = settings.get(key, (None, None))[0]
                value = [*(before if isinstance(before, list) else []), *value]
            settings[key] = (value, folder / MAP)
        _additional_as_extra(settings, lambda extra: False)
    for key, (value, where) in settings.items():
        if value is None:
            continue
        if key in NAMED:
            found.append(_content(value, where, key))
        elif key == "extra_special_tokens":
            items = list(value.values()) if isinstance(value, dict) else value
            if not isinstance(items, list):
                raise TfgraphError(f"{where}: {key}: not a list of tokens")
            found.extend(_content(item, where, key) for item in items)
        elif key.endswith("_token") and (isinstance(value, str) or (
                isinstance(value, dict) and isinstance(value.get("content"), str))):
            found.append(_content(value, where, key))  # model-specific (image_token, ...)
    return found


def _additional_as_extra(settings: dict[str, tuple[Any, Path]],
                         replaces: Callable[[Any], bool]) -> None:
    """transformers 5's renaming of ``additional_special_tokens`` to
    ``extra_special_tokens``: where there is no ``extra_special_tokens`` key, or where
    ``replaces`` its value."""
    if "additional_special_tokens" not in settings:
        return
    if "extra_special_tokens" in settings and \
            not replaces(settings["extra_special_tokens"][0]):
        return
    settings["extra_special_tokens"] = settings.pop("additional_special_tokens")


def _content(value: Any, where: Path, key: str) -> str:
    """The text of a token: a string, or an AddedToken object's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    if not isinstance(value, str):
        raise TfgraphError(f"{where}: {key}: not a token (a string, or an object with a "
                           "string content)")
    return value
