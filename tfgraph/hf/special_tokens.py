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
    from tokenizers import AddedToken, Tokenizer

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
    decoder, settings = _read(folder)
    found = [_content(entry, folder / CONFIG, f"added_tokens_decoder: {key}")
             for key, entry in decoder if entry.get("special") is True]
    named, extra = _named_and_extra(settings)
    found.extend(_content(value, where, key) for key, value, where in [*named, *extra])
    return found


def added_tokens(folder: Path, tokenizer: Tokenizer,
                 defaults: dict[str, str] | None = None,
                 replaced: frozenset[int] = frozenset()) -> list[AddedToken]:
    """The tokens transformers 5.24's ``TokenizersBackend.__init__`` adds to the backend
    tokenizer of ``folder`` on loading, in its order: the ``added_tokens_decoder`` entries
    (by id) that ``tokenizer`` (its tokenizer.json) does not hold as they are, then the named,
    model-specific and extra special tokens whose text is not among its added tokens. Added in
    that order (``Tokenizer.add_tokens``) they get the ids transformers gives them: a token of
    the vocabulary keeps its id, a new one takes the next free id; and they are split out of
    a text before it is tokenized, as transformers' encoding does. ``defaults``: the named
    tokens of the tokenizer class, where the files do not set them; ``replaced``: the
    ``added_tokens_decoder`` ids whose entries tokenizer.json's ``added_tokens`` replace."""
    decoder, settings = _read(folder)
    for key, value in (defaults or {}).items():
        settings.setdefault(key, (value, folder / CONFIG))
    held = {repr(token) for token in tokenizer.get_added_tokens_decoder().values()}
    adding = []
    for key, entry in sorted(decoder, key=lambda item: int(item[0])):
        if int(key) in replaced:
            continue
        token = _added_token(entry, folder / CONFIG, f"added_tokens_decoder: {key}", None)
        if repr(token) not in held:
            adding.append(token)
    named, extra = _named_and_extra(settings)
    names = {_content(value, where, key) for key, value, where in named}
    texts = {token.content for token in tokenizer.get_added_tokens_decoder().values()}
    texts |= {token.content for token in adding}
    for key, value, where in [*named, *extra]:
        token = _added_token(value, where, key, True)
        if token.content in names:
            token.special = True
        if token.content not in texts and repr(token) not in {repr(t) for t in adding}:
            adding.append(token)
    return adding


def _read(folder: Path) -> tuple[list[tuple[str, dict[str, Any]]],
                                 dict[str, tuple[Any, Path]]]:
    """``folder``'s ``added_tokens_decoder`` entries and its other settings (each with the
    file it comes from), as transformers merges tokenizer_config.json and, in the legacy
    layout, special_tokens_map.json."""
    config = side_json(folder, CONFIG) or {}
    entries: list[tuple[str, dict[str, Any]]] = []
    decoder = config.get("added_tokens_decoder")
    if decoder is not None:
        if not isinstance(decoder, dict):
            raise TfgraphError(f"{folder / CONFIG}: added_tokens_decoder: not an object of "
                               "id: token")
        for key, entry in decoder.items():
            if not isinstance(entry, dict):
                raise TfgraphError(f"{folder / CONFIG}: added_tokens_decoder: {key}: not a "
                                   "token object")
            if not key.isdecimal() or len(key) > 12:
                raise TfgraphError(f"{folder / CONFIG}: added_tokens_decoder: {key[:40]!r}: "
                                   "not a token id")
            entries.append((key, entry))
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
    return entries, settings


Setting = tuple[str, Any, Path]


def _named_and_extra(settings: dict[str, tuple[Any, Path]]) -> tuple[list[Setting],
                                                                     list[Setting]]:
    """The special tokens of ``settings`` in transformers' order: the named ones
    (``_special_tokens_map``: NAMED's, then the other ``*_token`` keys, then
    ``extra_special_tokens`` given as a mapping, which ``from_pretrained`` passes as
    ``model_specific_special_tokens``) and the extra ones (``extra_special_tokens`` given as a list)."""
    named = [(key, settings[key][0], settings[key][1]) for key in NAMED
             if key in settings and settings[key][0] is not None]
    mapped: list[Setting] = []
    model_specific: list[Setting] = []
    extra: list[Setting] = []
    for key, (value, where) in settings.items():
        if value is None or key in NAMED:
            continue
        if key == "extra_special_tokens":
            if isinstance(value, dict):
                mapped.extend((name, item, where) for name, item in value.items())
            elif isinstance(value, list):
                extra.extend((key, item, where) for item in value)
            else:
                raise TfgraphError(f"{where}: {key}: not a list of tokens")
        elif key.endswith("_token") and (isinstance(value, str) or (
                isinstance(value, dict) and isinstance(value.get("content"), str))):
            model_specific.append((key, value, where))  # model-specific (image_token, ...)
    return [*named, *model_specific, *mapped], extra


_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _added_token(value: Any, where: Path, key: str, special: bool | None) -> AddedToken:
    """``value`` (a string, or an AddedToken object) as a ``tokenizers`` AddedToken; a string
    is special when ``special`` is."""
    from tokenizers import AddedToken

    content = _content(value, where, key)
    if not isinstance(value, dict):
        return AddedToken(content, special=bool(special))
    flags = {}
    for flag in _FLAGS:
        if flag in value:
            if not isinstance(value[flag], bool):
                raise TfgraphError(f"{where}: {key}: {flag}: not true or false")
            flags[flag] = value[flag]
    return AddedToken(content, **flags)


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
