"""A model folder's tokenizer files: found, checked, carried with built artifacts, loaded.

tfgraph itself tokenizes with the ``tokenizers`` library's ``tokenizer.json``; the other files
are carried for transformers and onnxruntime-genai: the slow tokenizers' vocabularies (a
Llama 2 or T5 folder may hold only ``tokenizer.model`` / ``spiece.model``), special tokens,
chat template, generation defaults. Each is read as untrusted input like the rest of the folder
(tfgraph.hf.files.inside): only from within it (a link leading out is refused), size-limited;
``tokenizer.json`` must load with ``tokenizers`` and ``generation_config.json`` must be a JSON
object before either is copied anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfgraph.errors import TfgraphError
from tfgraph.hf.files import GENERATION_CONFIG, inside

if TYPE_CHECKING:
    from tokenizers import Tokenizer

TOKENIZER_JSON = "tokenizer.json"
# The files transformers' tokenizers read: tokenization_utils_base's tokenizer_config.json,
# special_tokens_map.json, added_tokens.json and chat_template.jinja, and the vocabulary files
# (VOCAB_FILES_NAMES) of the families tfgraph imports: Llama's tokenizer.model, T5's and
# Pegasus' spiece.model, mBART's sentencepiece.bpe.model, Marian's source.spm, target.spm and
# target_vocab.json, GPT-2's, RoBERTa's and BART's vocab.json + merges.txt, BERT's vocab.txt;
# and the generation defaults GenerationConfig.from_pretrained reads.
FILES = (TOKENIZER_JSON, "tokenizer_config.json", "special_tokens_map.json",
         "added_tokens.json", "chat_template.jinja", "tokenizer.model", "spiece.model",
         "sentencepiece.bpe.model", "source.spm", "target.spm", "vocab.json",
         "target_vocab.json", "merges.txt", "vocab.txt", GENERATION_CONFIG)
MAX_BYTES = 256 << 20  # the largest real tokenizer.json files are tens of MB
MAX_GENERATION_BYTES = 1 << 20  # a generation_config.json is a few hundred bytes


def tokenizer_files(folder: Path) -> list[Path]:
    """The tokenizer and generation files of ``folder`` that it has, in :data:`FILES` order;
    each checked (see the module docstring) before anything is written."""
    found = []
    for name in FILES:
        if not (folder / name).exists() and not (folder / name).is_symlink():
            continue
        path = inside(folder, name, "tokenizer file")
        if path.stat().st_size > MAX_BYTES:
            raise TfgraphError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a tokenizer file")
        found.append(path)
    for path in found:
        if path.name == TOKENIZER_JSON:  # refuse one the library cannot read, now
            load_tokenizer(path)
        if path.name == GENERATION_CONFIG:
            _read_generation_config(path)
    return found


def _read_generation_config(path: Path) -> dict[str, Any]:
    from tfgraph.hf.files import read_json

    return read_json(path, MAX_GENERATION_BYTES, "generation_config.json")


def side_file_bytes(path: Path) -> bytes:
    """What a copy of tokenizer file ``path`` holds: its bytes, unchanged. A generation
    config keeps even the token ids it lacks unset: transformers (and ``tfgraph generate``)
    read a folder's generation_config.json as it is, without filling ids in from
    config.json, so an id added here would make the copy stop where the source does not."""
    return path.read_bytes()


def load_tokenizer(path: Path) -> Tokenizer:
    """The ``tokenizers`` tokenizer in ``path`` (a tokenizer.json); one line when it is not."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TfgraphError("text prompts need the tokenizers package "
                           "(pip install tokenizers)") from None
    if path.stat().st_size > MAX_BYTES:
        raise TfgraphError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a tokenizer file")
    try:
        tokenizer = Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust library raises plain Exception for any bad file
        detail = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        raise TfgraphError(f"{path}: not a tokenizer.json the tokenizers library reads: "
                           f"{detail}") from None
    # The truncation and padding a tokenizer.json may carry are not applied to a text:
    # transformers' ``tokenizer(text)`` turns both off by default (truncation=False,
    # padding=False: TokenizersBackend.set_truncation_and_padding), where they would cut a
    # prompt to the saved max_length or pad it with pad ids fed to the model as tokens.
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def copy_files(files: list[Path], folder: Path) -> list[Path]:
    """Copy ``files`` into ``folder`` atomically, each replacing any file of that name."""
    from tfgraph.io import atomic_path, check_side_file

    pending = [(folder / source.name, side_file_bytes(source)) for source in files]
    # Every name is checked before any is written: a file of that name that tfgraph did not
    # write (other content) is refused, never replaced (tfgraph.io.check_side_file).
    needed = [(target, data) for target, data in pending if check_side_file(target, data)]
    for target, data in needed:
        with atomic_path(target) as tmp:
            tmp.write_bytes(data)
    return [target for target, _data in pending]


def byte_level(vocab_size: int = 256) -> Tokenizer:
    """A tokenizer whose ids are the UTF-8 bytes of the text (id = byte value), for byte-level
    models (examples/language-model): GPT-2's byte-to-character table, no merges, decoding
    back to the bytes (invalid UTF-8 shows as U+FFFD). ``vocab_size`` >= 256; ids past 255
    are left for special tokens the model may have."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if vocab_size < 256:
        raise TfgraphError(f"a byte-level tokenizer needs 256 ids, the vocabulary has "
                           f"{vocab_size}")
    alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 characters standing for bytes
    table = _byte_characters()
    assert sorted(alphabet) == sorted(table)
    tokenizer = Tokenizer(models.BPE({ch: b for b, ch in enumerate(table)}, []))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def _byte_characters() -> list[str]:
    """GPT-2's byte-to-character table (the one ``tokenizers``' ByteLevel uses): printable
    Latin-1 bytes stand for themselves, the rest map to characters from U+0100 on, in order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    table, extra = [], 0
    for b in range(256):
        if b in keep:
            table.append(chr(b))
        else:
            table.append(chr(256 + extra))
            extra += 1
    return table


def write_byte_level(folder: Path, vocab_size: int = 256) -> Path:
    """Write :func:`byte_level`'s ``tokenizer.json`` into ``folder`` (beside a model, where
    ``tfgraph generate --prompt`` reads it); returns its path."""
    from tfgraph.io import atomic_write

    target = folder / TOKENIZER_JSON
    with atomic_write(target) as out:
        out.write(byte_level(vocab_size).to_str())
    return target


def encode_text(tokenizer: Tokenizer, text: str, what: str) -> list[int]:
    """``tokenizer``'s ids of ``text``, a prompt given as text. A command line that is not
    UTF-8 reaches Python with its bad bytes as lone surrogates (PEP 383), which the
    tokenizers library cannot take: refused, naming where."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start]
        shown = (f"byte 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF
                 else f"U+{ord(bad):04X}")
        raise TfgraphError(f"{what}: not valid UTF-8 text ({shown} at character "
                           f"{err.start})") from None
    return list(tokenizer.encode(text).ids)


# transformers' PreTrainedTokenizerBase.clean_up_tokenization: the spaces a WordPiece or
# Unigram decode leaves before punctuation and English contractions
_CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def side_json(folder: Path, name: str) -> dict[str, Any] | None:
    """The JSON object of tokenizer file ``name`` (tokenizer_config.json,
    special_tokens_map.json) in ``folder``, None when it has none; read like every folder file
    (tfgraph.hf.files.beside: only from within the folder, a link leading out refused),
    size-limited, one error line when it is not UTF-8 JSON holding an object. Its numbers are
    not read (transformers writes model_max_length as 1000000000000000019884624838656, 31
    digits): only strings and booleans are."""
    from tfgraph.hf.files import beside

    path = beside(folder, name, "tokenizer file")
    if path is None:
        return None
    if path.stat().st_size > MAX_BYTES:
        raise TfgraphError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a tokenizer file")
    try:
        data = json.loads(path.read_bytes().decode("utf-8"), parse_int=lambda _: 0)
    except (UnicodeDecodeError, ValueError) as err:
        raise TfgraphError(f"{path}: not UTF-8 JSON: {str(err).splitlines()[0][:120]}") from None
    except RecursionError:  # arrays or objects nested past Python's recursion limit
        raise TfgraphError(f"{path}: JSON nested too deeply; not a tokenizer file") from None
    except OSError as err:
        raise TfgraphError(f"{path}: cannot read: {err.strerror or err}") from None
    if not isinstance(data, dict):
        raise TfgraphError(f"{path}: not a JSON object")
    return data


def cleans_up_spaces(tokenizer_json: Path, tokenizer: Tokenizer) -> bool:
    """Whether transformers' decode of this tokenizer cleans up tokenization spaces: its
    ``tokenizer_config.json`` (beside ``tokenizer.json``) sets ``clean_up_tokenization_spaces``
    and the model is not BPE, where transformers 5 ignores it unless
    ``clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output`` is set too
    (``TokenizersBackend._decode``)."""
    config = side_json(tokenizer_json.parent, "tokenizer_config.json")
    if config is None or config.get("clean_up_tokenization_spaces") is not True:
        return False
    forced = config.get("clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_"
                        "output") is True
    return forced or type(tokenizer.model).__name__ != "BPE"


def decode_text(tokenizer: Tokenizer, ids: list[int], clean_up: bool,
                skip_special: bool = True, special: frozenset[int] = frozenset()) -> str:
    """``ids`` as text, as transformers' ``tokenizer.decode(ids, skip_special_tokens=...)``
    gives it (special tokens skipped by default, as its text-generation pipeline does: those
    tokenizer.json marks special and ``special``, the ids the folder's other tokenizer files
    name (tfgraph.hf.special_tokens), which transformers registers as special; ``clean_up``:
    :func:`cleans_up_spaces`)."""
    if skip_special and special:
        ids = [token for token in ids if token not in special]
    text: str = tokenizer.decode(ids, skip_special_tokens=skip_special)
    if clean_up:
        for old, new in _CLEAN_UP:
            text = text.replace(old, new)
    return text

